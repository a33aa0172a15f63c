//! The supervisor's side of an allowlisted gVisor sandbox's egress (docs/threat-model.md,
//! "Tiers"). The sandbox keeps `--network=none`: gVisor's own loopback only. The egress
//! proxy's listeners are bound exactly as the native cell's launcher binds them (HTTP
//! and SOCKS proxies on `127.0.0.1`, the resolver's UDP socket, the transparent
//! listeners), in a private network namespace of their own with only `lo`, so the proxy
//! is started unchanged and applies its checks, reason codes and records. The forwarder
//! inside the sandbox ([`super::inside`]) asks over its control channel for one host
//! socket per connection; the bridge ([`super::route::bridge`], on a thread that stays in
//! the private namespace) makes a unix socketpair, passes one end in and connects the
//! other, from that namespace, to the listener asked for.

use super::route::{self, Pending};
use crate::error::CellError;
use crate::protocol::{EgressListeners, ListenersWire};
use crate::supervisor::EgressSession;
use crate::sys;
use airlock_contract::{
    CellPlan, TransparentEndpoint, HTTP_PROXY_PORT, SOCKS_PROXY_PORT, TRANSPARENT_DNS,
};
use std::net::{Ipv4Addr, SocketAddrV4, TcpListener, TcpStream, UdpSocket};
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::sync::mpsc;

/// The control an egress route that cannot be built refuses the run as.
const CONTROL: &str = "gvisor.network";

/// The TCP addresses the forwarder listens on inside the sandbox, in request-byte order:
/// the HTTP proxy, the SOCKS proxy, then the plan's transparent endpoints. The resolver
/// (UDP) is not carried: a name is resolved by the proxy (`HTTP_PROXY`, `socks5h`).
pub fn forwarded_addresses(plan: &CellPlan) -> Vec<SocketAddrV4> {
    let localhost = |port| SocketAddrV4::new(Ipv4Addr::LOCALHOST, port);
    [localhost(HTTP_PROXY_PORT), localhost(SOCKS_PROXY_PORT)]
        .into_iter()
        .chain(ListenersWire::for_plan(plan).transparent)
        .collect()
}

/// Binds the proxy's listeners in a new private network namespace, starts `egress` on
/// them and returns the control channel, whose sandbox end is the forwarder's stdin.
/// The bridge's thread stays in that namespace and ends by itself once the channel
/// closes (the forwarder ended or the sandbox went).
pub fn start_route(
    plan: &CellPlan,
    egress: Option<&mut (dyn EgressSession + '_)>,
) -> Result<Pending, CellError> {
    let Some(egress) = egress else {
        return Err(refused(
            "the plan allows egress but no proxy was configured",
        ));
    };
    let (bound_tx, bound_rx) = mpsc::channel();
    let (channel_tx, channel_rx) = mpsc::channel::<UnixStream>();
    let thread_addresses = forwarded_addresses(plan);
    let endpoints = plan.network.transparent_endpoints();
    let thread = std::thread::Builder::new()
        .name("airlock-gvisor-egress".into())
        .spawn(move || {
            let bound = bind_in_private_netns(&thread_addresses, endpoints);
            let ok = bound.is_ok();
            let _ = bound_tx.send(bound);
            if let (true, Ok(channel)) = (ok, channel_rx.recv()) {
                // Request byte `i` is a connection to `addresses[i]` (the proxy's
                // listener), made from this thread's namespace.
                route::bridge(&channel, |i| {
                    let address = thread_addresses.get(usize::from(i))?;
                    TcpStream::connect(address).ok()
                });
            }
        })
        .map_err(|e| CellError::io("the egress bridge's thread", e))?;
    drop(thread);
    let listeners = bound_rx
        .recv()
        .map_err(|_| refused("the egress bridge's thread ended"))?
        .map_err(|e| refused(&e))?;
    egress.start(listeners).map_err(|e| refused(&e))?;
    Pending::new(CONTROL, channel_tx)
}

/// Fail closed: a sandbox whose egress route cannot be built does not run.
fn refused(why: &str) -> CellError {
    route::refused(CONTROL, why)
}

/// On this thread: a new network namespace with only `lo` up, and the proxy's sockets
/// bound in it where the native cell's launcher binds them. The thread stays in it, so
/// that the bridge's connections are made there.
fn bind_in_private_netns(
    addresses: &[SocketAddrV4],
    endpoints: Vec<TransparentEndpoint>,
) -> Result<EgressListeners, String> {
    sys::unshare(libc::CLONE_NEWNET).map_err(|e| format!("a private network namespace: {e}"))?;
    sys::loopback_up().map_err(|e| format!("lo in the private network namespace: {e}"))?;
    let bind = |addr: &SocketAddrV4| {
        TcpListener::bind(addr)
            .map(OwnedFd::from)
            .map_err(|e| format!("{addr}: {e}"))
    };
    let dns = UdpSocket::bind(TRANSPARENT_DNS).map_err(|e| format!("{TRANSPARENT_DNS}: {e}"))?;
    let mut tcp = addresses.iter().map(bind).collect::<Result<Vec<_>, _>>()?;
    let transparent = tcp.split_off(2);
    let mut tcp = tcp.into_iter();
    let (Some(http), Some(socks)) = (tcp.next(), tcp.next()) else {
        return Err("no proxy addresses".into());
    };
    Ok(EgressListeners {
        http,
        socks,
        dns: OwnedFd::from(dns),
        transparent: endpoints.into_iter().zip(transparent).collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_forwarded_addresses_are_the_proxies_then_the_transparent_listeners() {
        let mut contract = airlock_contract::default_contract();
        contract.network.mode = airlock_contract::NetworkMode::Allowlist;
        contract.network.allowed_domains = vec!["api.test:443".into(), "*.wild.test:443".into()];
        let plan = airlock_contract::compile(
            &contract,
            &airlock_contract::CompileInput::new(
                std::path::Path::new("/"),
                &["/bin/true".to_string()],
            ),
        )
        .unwrap();
        let addresses = forwarded_addresses(&plan);
        let expected: Vec<SocketAddrV4> = vec![
            "127.0.0.1:3128".parse().unwrap(),
            "127.0.0.1:1080".parse().unwrap(),
            "127.100.0.1:443".parse().unwrap(),
        ];
        assert_eq!(addresses, expected);
    }
}
