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
//!
//! The resolver is carried too: once the forwarder listens, it is given one end of a
//! SOCK_SEQPACKET pair over which it relays the datagrams sent to its UDP
//! `127.0.0.53:53`, each tagged with its sender; a thread here asks the proxy's resolver
//! (in the private namespace) one query at a time and sends the answer back, tagged.
//! One query is outstanding at a time, waited for at most [`RESOLVER_WAIT`]; a query is
//! cut to [`inside::MAX_DNS_QUERY`] bytes (the resolver refuses what is longer, as
//! natively) and an answer over [`inside::MAX_DNS_ANSWER`] is dropped.

use super::inside;
use super::route;
use crate::error::CellError;
use crate::protocol::{EgressListeners, ListenersWire};
use crate::supervisor::EgressSession;
use crate::sys;
use airlock_contract::{
    CellPlan, TransparentEndpoint, HTTP_PROXY_PORT, SOCKS_PROXY_PORT, TRANSPARENT_DNS,
};
use std::net::{Ipv4Addr, SocketAddrV4, TcpListener, TcpStream, UdpSocket};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::mpsc;
use std::time::Duration;

/// The control an egress route that cannot be built refuses the run as.
const CONTROL: &str = "gvisor.network";
/// How long the resolver's answer to one query is waited for (it answers from the
/// plan and the operator's map, without a network round trip of its own).
const RESOLVER_WAIT: Duration = Duration::from_secs(2);

/// The egress forwarder's control channel before it listens.
pub type Pending = route::Pending<EgressRoute>;

/// What the bridge's thread serves once the forwarder listens.
pub struct EgressRoute {
    channel: UnixStream,
    /// The supervisor's end of the resolver's SOCK_SEQPACKET pair.
    resolver: OwnedFd,
}

impl route::Pending<EgressRoute> {
    /// Waits for the forwarder's ready byte, gives it its end of the resolver's pair,
    /// then hands both to the bridge.
    pub fn forwarder_ready(self) -> Result<(), CellError> {
        self.forwarder_ready_into(give_resolver_route)
    }
}

/// The channel and the resolver's pair, whose sandbox end goes in over the channel.
fn give_resolver_route(channel: UnixStream) -> Result<EgressRoute, CellError> {
    let (resolver, sandbox_end) =
        sys::seqpacket_pair().map_err(|e| CellError::io("the resolver's channel", e))?;
    sys::send_with_fds(
        channel.as_fd(),
        &[inside::RESOLVER_ROUTE],
        &[sandbox_end.as_raw_fd()],
    )
    .map_err(|e| refused(&format!("the resolver's channel: {e}")))?;
    Ok(EgressRoute { channel, resolver })
}

/// The TCP addresses the forwarder listens on inside the sandbox, in request-byte order:
/// the HTTP proxy, the SOCKS proxy, then the plan's transparent endpoints. (The
/// resolver's UDP address is the forwarder's own: [`TRANSPARENT_DNS`].)
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
    let (channel_tx, channel_rx) = mpsc::channel::<EgressRoute>();
    let thread_addresses = forwarded_addresses(plan);
    let endpoints = plan.network.transparent_endpoints();
    let thread = std::thread::Builder::new()
        .name("airlock-gvisor-egress".into())
        .spawn(move || {
            let bound = bind_in_private_netns(&thread_addresses, endpoints);
            let ok = bound.is_ok();
            let _ = bound_tx.send(bound);
            if let (true, Ok(route)) = (ok, channel_rx.recv()) {
                // Started from this thread: it is in the private namespace too.
                let resolver = std::thread::Builder::new()
                    .name("airlock-gvisor-dns".into())
                    .spawn(move || relay_queries(&route.resolver));
                if resolver.is_err() {
                    return;
                }
                // Request byte `i` is a connection to `addresses[i]` (the proxy's
                // listener), made from this thread's namespace.
                route::bridge(&route.channel, |i| {
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

/// Relays the forwarder's resolver queries until its end closes: each message is a
/// sender tag ([`inside::DNS_TAG`] bytes) and a query, answered by the proxy's resolver
/// and sent back with the same tag. One at a time; an unanswered or malformed query is
/// dropped (the client retries, as over UDP).
fn relay_queries(route: &OwnedFd) {
    // A longer message is cut to the buffer (a seqpacket read's own truncation).
    let mut message = [0u8; inside::DNS_TAG + inside::MAX_DNS_QUERY];
    loop {
        let n = match sys::read(route.as_fd(), &mut message) {
            Ok(0) => return,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => return,
        };
        if n <= inside::DNS_TAG {
            continue;
        }
        let (tag, query) = message[..n].split_at(inside::DNS_TAG);
        let Some(answer) = ask_resolver(query) else {
            continue;
        };
        let reply = [tag, &answer].concat();
        if sys::send_with_fds(route.as_fd(), &reply, &[]).is_err() {
            return;
        }
    }
}

/// The proxy's resolver's answer to `query`, from a fresh socket (a late answer to an
/// earlier query cannot be taken for this one's).
fn ask_resolver(query: &[u8]) -> Option<Vec<u8>> {
    let socket = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).ok()?;
    socket.connect(TRANSPARENT_DNS).ok()?;
    socket.set_read_timeout(Some(RESOLVER_WAIT)).ok()?;
    socket.send(query).ok()?;
    let mut answer = vec![0u8; inside::MAX_DNS_ANSWER + 1];
    let n = socket.recv(&mut answer).ok()?;
    (n <= inside::MAX_DNS_ANSWER).then(|| {
        answer.truncate(n);
        answer
    })
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
