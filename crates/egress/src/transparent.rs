//! The transparent path on the proxy side: connections accepted on a transparent
//! listener become tunnels to the name and port the listener stands for, and the cell's
//! resolver answers on the passed UDP socket.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

use tokio::net::{TcpListener, TcpStream, UdpSocket};

use crate::dns::{self, MAX_QUERY};
use crate::proxy::{
    decide_and_connect_or_shutdown, shutdown_requested, Attempt, ConnectionSlot, ListenerKind,
};
use crate::tunnel::relay_tunnel;
use crate::{reason, SharedState};

/// The record protocol of transparent connections.
pub const PROTOCOL: &str = "transparent";

/// A connection to a transparent listener for `host:port`: the same decision as a
/// CONNECT to `host:port` (allowlist, the proxy's own resolution, the address rule,
/// ceilings), then the same tunnel checks (SNI, Host on every plain-HTTP request, the
/// `opaque_tunnels` rule). There is no request to answer, so a refusal closes the
/// connection; the record says why.
pub async fn handle(
    shared: SharedState,
    mut client: TcpStream,
    over_limit: bool,
    _slot: ConnectionSlot,
    (host, port): (Arc<str>, u16),
) {
    let _ = client.set_nodelay(true);
    let mut attempt = Attempt::begin(PROTOCOL);
    attempt.target(&host, port);
    if over_limit {
        attempt.deny(&shared, reason::LIMIT);
        return;
    }
    let opened = match decide_and_connect_or_shutdown(&shared, &host, port).await {
        Ok(opened) => opened,
        Err(refusal) => {
            attempt.address = refusal.address;
            attempt.deny(&shared, refusal.reason);
            return;
        }
    };
    attempt.address = opened.address;
    relay_tunnel(&shared, &mut client, opened, Vec::new(), &host, attempt).await;
}

/// The name -> address table of the resolver: each transparent listener's name and the
/// address it is bound on (all listeners of one name share one address).
pub fn resolver_names(listeners: &[(ListenerKind, TcpListener)]) -> BTreeMap<String, Ipv4Addr> {
    listeners
        .iter()
        .filter_map(|(kind, listener)| {
            let ListenerKind::Transparent { host, .. } = kind else {
                return None;
            };
            match listener.local_addr().ok()?.ip() {
                IpAddr::V4(ip) => Some((host.to_string(), ip)),
                IpAddr::V6(_) => None,
            }
        })
        .collect()
}

/// Answers the cell's DNS queries until shutdown; never sends a packet anywhere but
/// back to the asking socket, which is inside the cell.
pub async fn serve_dns(shared: SharedState, socket: UdpSocket, names: BTreeMap<String, Ipv4Addr>) {
    // One byte more than any query answered: a datagram that fills it is too long
    // (the kernel truncates silently).
    let mut buf = vec![0u8; MAX_QUERY + 1];
    let mut shutdown = shared.shutdown_signal();
    loop {
        let (n, from) = tokio::select! {
            _ = shutdown_requested(&mut shutdown) => return,
            received = socket.recv_from(&mut buf) => match received {
                Ok(r) => r,
                Err(_) => {
                    // Back off instead of spinning on a persistent socket error.
                    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                    continue;
                }
            },
        };
        let outcome = dns::respond(&buf[..n], |name| names.get(name).copied());
        if let Some(reply) = outcome.reply {
            let _ = socket.send_to(&reply, from).await;
        }
        if let Some(name) = outcome.refused {
            shared.record_dns_refusal(&name);
        }
    }
}
