//! The supervisor's side of an allowlisted gVisor sandbox's egress (docs/threat-model.md,
//! "Tiers"). The sandbox keeps `--network=none`: gVisor's own loopback only. The egress
//! proxy's listeners are bound exactly as the native cell's launcher binds them (HTTP
//! and SOCKS proxies on `127.0.0.1`, the resolver's UDP socket, the transparent
//! listeners), in a private network namespace of their own with only `lo`, so the proxy
//! is started unchanged and applies its checks, reason codes and records. The forwarder
//! inside the sandbox ([`super::inside`]) asks over its control channel for one host
//! socket per connection; the bridge here makes a unix socketpair, passes one end in
//! and connects the other, from the private namespace, to the listener asked for.
//!
//! The resolver is carried too: once the forwarder listens, it is given one end of a
//! SOCK_SEQPACKET pair over which it relays the datagrams sent to its UDP
//! `127.0.0.53:53`, each tagged with its sender; a thread here asks the proxy's resolver
//! (in the private namespace) one query at a time and sends the answer back, tagged.
//!
//! Bounded: at most [`MAX_BRIDGED_CONNECTIONS`] connections are relayed at once (two
//! threads each); over it a request gets no socket and the forwarder closes that
//! connection. One resolver query is outstanding at a time, waited for at most
//! [`RESOLVER_WAIT`]; a query is cut to [`inside::MAX_DNS_QUERY`] bytes (the resolver
//! refuses what is longer, as natively) and an answer over [`inside::MAX_DNS_ANSWER`]
//! is dropped.

use super::inside;
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
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

/// How long the forwarder may take to bind its listeners.
const FORWARDER_START: Duration = Duration::from_secs(30);
/// Connections relayed at once per sandbox: above the proxy's default ceiling
/// (`max_connections`, 32) and the refusals it still answers (64 more), so that the
/// proxy, not the bridge, decides and records in ordinary use. Each costs the
/// supervisor two threads and four descriptors; a payload that keeps connections open
/// (or drives the channel itself) cannot make it spawn more.
pub const MAX_BRIDGED_CONNECTIONS: usize = 128;
/// How long the resolver's answer to one query is waited for (it answers from the
/// plan and the operator's map, without a network round trip of its own).
const RESOLVER_WAIT: Duration = Duration::from_secs(2);

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
    let (channel_tx, channel_rx) = mpsc::channel::<Route>();
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
                if resolver.is_ok() {
                    bridge(&route.channel, &thread_addresses);
                }
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
    to_bridge: mpsc::Sender<Route>,
}

/// What the bridge's thread serves once the forwarder listens.
struct Route {
    channel: UnixStream,
    /// The supervisor's end of the resolver's SOCK_SEQPACKET pair.
    resolver: OwnedFd,
}

impl Pending {
    /// The forwarder's stdin (once).
    pub fn sandbox_end(&mut self) -> Option<OwnedFd> {
        self.theirs.take()
    }

    /// Waits for the forwarder's ready byte, gives it its end of the resolver's pair,
    /// then hands the channel to the bridge.
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
        let (resolver, sandbox_end) =
            sys::seqpacket_pair().map_err(|e| CellError::io("the resolver's channel", e))?;
        sys::send_with_fds(
            ours.as_fd(),
            &[inside::RESOLVER_ROUTE],
            &[sandbox_end.as_raw_fd()],
        )
        .map_err(|e| refused(&format!("the resolver's channel: {e}")))?;
        let route = Route {
            channel: ours,
            resolver,
        };
        to_bridge
            .send(route)
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
/// Over [`MAX_BRIDGED_CONNECTIONS`] relayed at once, the answer is [`inside::NO_ROUTE`].
fn bridge(channel: &UnixStream, addresses: &[SocketAddrV4]) {
    let bridged = Arc::new(AtomicUsize::new(0));
    // `read`, not `recvmsg`: descriptors a payload holding the channel sends are
    // discarded, so the channel yields proxy connections and nothing else.
    let mut request = [0u8; 1];
    while let Ok(1) = (&*channel).read(&mut request) {
        let sent = match open_route(addresses, request[0], &bridged) {
            Some((theirs, relay)) => {
                let sent = sys::send_with_fds(channel.as_fd(), b"F", &[theirs.as_raw_fd()]);
                relay.start();
                sent
            }
            None => (&*channel).write_all(&[inside::NO_ROUTE]),
        };
        if sent.is_err() {
            return;
        }
    }
}

/// The sandbox's end of a new route to listener `index` and its relay, unless the
/// listener does not exist, cannot be reached, or the ceiling is reached.
fn open_route(
    addresses: &[SocketAddrV4],
    index: u8,
    bridged: &Arc<AtomicUsize>,
) -> Option<(UnixStream, Relay)> {
    let slot = Slot::take(bridged)?;
    let upstream = TcpStream::connect(addresses.get(usize::from(index))?).ok()?;
    let (ours, theirs) = UnixStream::pair().ok()?;
    let relay = Relay {
        upstream,
        route: ours,
        slot,
    };
    Some((theirs, relay))
}

/// One of the [`MAX_BRIDGED_CONNECTIONS`], held until its relay ends.
struct Slot(Arc<AtomicUsize>);

impl Slot {
    fn take(bridged: &Arc<AtomicUsize>) -> Option<Slot> {
        bridged
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < MAX_BRIDGED_CONNECTIONS).then_some(n + 1)
            })
            .ok()?;
        Some(Slot(bridged.clone()))
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A connection to relay, with its slot.
struct Relay {
    upstream: TcpStream,
    route: UnixStream,
    slot: Slot,
}

impl Relay {
    /// On a thread of its own; a thread that cannot be made drops the connection (and
    /// its slot) at once.
    fn start(self) {
        let _ = std::thread::Builder::new()
            .name("airlock-gvisor-relay".into())
            .spawn(move || {
                let Relay {
                    upstream,
                    route,
                    slot,
                } = self;
                relay(upstream, route);
                drop(slot);
            });
    }
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

/// Copies bytes both ways until each side has finished sending.
fn relay(upstream: TcpStream, route: UnixStream) {
    let (Ok(upstream_2), Ok(route_2)) = (upstream.try_clone(), route.try_clone()) else {
        return;
    };
    let outbound = std::thread::Builder::new().spawn(move || {
        let _ = std::io::copy(&mut &route_2, &mut &upstream_2);
        let _ = upstream_2.shutdown(std::net::Shutdown::Write);
    });
    let Ok(outbound) = outbound else { return };
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
