//! The supervisor's side of an allowlisted gVisor sandbox's egress (docs/threat-model.md,
//! "Tiers"). The sandbox keeps `--network=none`: gVisor's own loopback only. The egress
//! proxy's listeners are bound exactly as the native cell's launcher binds them (HTTP
//! and SOCKS proxies on `127.0.0.1`, the resolver's UDP socket, the transparent
//! listeners), in a private network namespace of their own with only `lo`, so the proxy
//! is started unchanged and applies its checks, reason codes and records. The forwarder
//! inside the sandbox ([`super::inside`]) asks over its control channel for one host
//! socket per connection; the bridge here makes a unix socketpair, passes one end in
//! and connects the other, from the private namespace, to the listener asked for.

use crate::error::CellError;
use crate::protocol::{EgressListeners, ListenersWire};
use crate::supervisor::EgressSession;
use crate::sys;
use airlock_contract::{
    CellPlan, TransparentEndpoint, HTTP_PROXY_PORT, SOCKS_PROXY_PORT, TRANSPARENT_DNS,
};
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddrV4, TcpListener, TcpStream, UdpSocket};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::mpsc;
use std::time::Duration;

/// How long the forwarder may take to bind its listeners.
const FORWARDER_START: Duration = Duration::from_secs(30);

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
                bridge(&channel, &thread_addresses);
            }
        })
        .map_err(|e| CellError::io("the egress bridge's thread", e))?;
    drop(thread);
    let listeners = bound_rx
        .recv()
        .map_err(|_| refused("the egress bridge's thread ended"))?
        .map_err(|e| refused(&e))?;
    egress.start(listeners).map_err(|e| refused(&e))?;
    let (ours, theirs) =
        UnixStream::pair().map_err(|e| CellError::io("the forwarder's channel", e))?;
    Ok(Pending {
        ours,
        theirs: Some(OwnedFd::from(theirs)),
        to_bridge: channel_tx,
    })
}

/// The control channel before the forwarder said it listens.
pub struct Pending {
    ours: UnixStream,
    theirs: Option<OwnedFd>,
    to_bridge: mpsc::Sender<UnixStream>,
}

impl Pending {
    /// The forwarder's stdin (once).
    pub fn sandbox_end(&mut self) -> Option<OwnedFd> {
        self.theirs.take()
    }

    /// Waits for the forwarder's ready byte, then hands the channel to the bridge.
    pub fn forwarder_ready(self) -> Result<(), CellError> {
        let Pending {
            ours, to_bridge, ..
        } = self;
        ours.set_read_timeout(Some(FORWARDER_START))
            .map_err(|e| CellError::io("the forwarder's channel", e))?;
        let mut ready = [0u8; 1];
        match (&ours).read(&mut ready) {
            Ok(1) if ready[0] == super::inside::FORWARDER_READY => {}
            Ok(_) => return Err(refused("the egress forwarder ended before it listened")),
            Err(e) => {
                return Err(refused(&format!(
                    "the egress forwarder did not listen within {} s: {e}",
                    FORWARDER_START.as_secs()
                )))
            }
        }
        ours.set_read_timeout(None)
            .map_err(|e| CellError::io("the forwarder's channel", e))?;
        to_bridge
            .send(ours)
            .map_err(|_| refused("the egress bridge's thread ended"))
    }
}

/// Fail closed: a sandbox whose egress route cannot be built does not run.
fn refused(why: &str) -> CellError {
    CellError::Unavailable {
        control: "gvisor.network",
        reason: why.to_string(),
    }
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

/// Serves the forwarder's requests until its channel closes: per request byte `i`, a
/// socketpair whose one end goes into the sandbox and whose other end is relayed to a
/// connection to `addresses[i]` (the proxy's listener) in this thread's namespace.
fn bridge(channel: &UnixStream, addresses: &[SocketAddrV4]) {
    // `read`, not `recvmsg`: descriptors a payload holding the channel sends are
    // discarded, so the channel yields proxy connections and nothing else.
    let mut request = [0u8; 1];
    while let Ok(1) = (&*channel).read(&mut request) {
        let route = addresses
            .get(usize::from(request[0]))
            .and_then(|addr| TcpStream::connect(addr).ok())
            .and_then(|upstream| Some((upstream, UnixStream::pair().ok()?)));
        let sent = match route {
            Some((upstream, (ours, theirs))) => {
                let sent = sys::send_with_fds(channel.as_fd(), b"F", &[theirs.as_raw_fd()]);
                std::thread::spawn(move || relay(upstream, ours));
                sent
            }
            None => (&*channel).write_all(&[super::inside::NO_ROUTE]),
        };
        if sent.is_err() {
            return;
        }
    }
}

/// Copies bytes both ways until each side has finished sending.
fn relay(upstream: TcpStream, route: UnixStream) {
    let (Ok(upstream_2), Ok(route_2)) = (upstream.try_clone(), route.try_clone()) else {
        return;
    };
    let outbound = std::thread::spawn(move || {
        let _ = std::io::copy(&mut &route_2, &mut &upstream_2);
        let _ = upstream_2.shutdown(std::net::Shutdown::Write);
    });
    let _ = std::io::copy(&mut &upstream, &mut &route);
    let _ = route.shutdown(std::net::Shutdown::Write);
    let _ = outbound.join();
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
