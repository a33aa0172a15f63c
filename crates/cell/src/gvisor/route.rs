//! What a gVisor sandbox's forwarders and the supervisor's bridges share
//! (docs/threat-model.md, "Tiers"): the sandbox keeps `--network=none` and
//! `--host-uds=none`, so a forwarder inside it (a `runsc exec` of [`super::inside`]) is
//! given a control channel (a host unix socket as its stdin) and asks over it, per
//! connection it accepts, for a fresh host socket; the supervisor's bridge passes one end
//! of a socketpair in (`SCM_RIGHTS`) and connects the other end to the one place this
//! route leads (the egress proxy's listener asked for, or the run's broker socket). Both
//! sides then relay bytes.
//!
//! Bounded: at most [`MAX_BRIDGED_CONNECTIONS`] connections of one route are relayed at
//! once (two threads each); over it a request gets no socket ([`NO_ROUTE`]) and the
//! forwarder closes that connection, so a payload that keeps connections open (or drives
//! the channel itself) cannot make the supervisor spawn threads without end.

use crate::error::CellError;
use crate::sys;
use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

/// What a forwarder writes on its control channel once it listens.
pub const FORWARDER_READY: u8 = b'R';
/// The supervisor's answer to a request for which it has no socket (it carries none).
pub const NO_ROUTE: u8 = b'N';

/// How long a forwarder may take to listen.
const FORWARDER_START: Duration = Duration::from_secs(30);

/// Connections relayed at once per route: above the egress proxy's default ceiling
/// (`max_connections`, 32) and the refusals it still answers (64 more), so that the
/// proxy, not the bridge, decides and records in ordinary use. Each costs the supervisor
/// two threads and four descriptors.
pub const MAX_BRIDGED_CONNECTIONS: usize = 128;

/// A connected stream a relay copies to and from.
pub trait Duplex: Read + Write + Send + Sized + 'static {
    /// A second handle on the same connection (for the other direction's thread).
    fn another_handle(&self) -> std::io::Result<Self>;
    /// Tells the peer nothing more comes (its reads see the end).
    fn done_sending(&self);
}

impl Duplex for TcpStream {
    fn another_handle(&self) -> std::io::Result<Self> {
        self.try_clone()
    }
    fn done_sending(&self) {
        let _ = self.shutdown(Shutdown::Write);
    }
}

impl Duplex for UnixStream {
    fn another_handle(&self) -> std::io::Result<Self> {
        self.try_clone()
    }
    fn done_sending(&self) {
        let _ = self.shutdown(Shutdown::Write);
    }
}

/// Copies bytes both ways until each side has finished sending.
pub fn relay<A: Duplex, B: Duplex>(mut a: A, mut b: B) {
    let (Ok(mut a_2), Ok(mut b_2)) = (a.another_handle(), b.another_handle()) else {
        return;
    };
    let back = std::thread::Builder::new().spawn(move || {
        let _ = std::io::copy(&mut b_2, &mut a_2);
        a_2.done_sending();
    });
    // No thread: the connection closes.
    let Ok(back) = back else { return };
    let _ = std::io::copy(&mut a, &mut b);
    b.done_sending();
    let _ = back.join();
}

/// Serves a forwarder's requests until its channel closes: per request byte `i`, a
/// socketpair whose one end goes into the sandbox and whose other end is relayed to
/// `connect(i)` (`None`: no route, answered [`NO_ROUTE`]; so is a request over
/// [`MAX_BRIDGED_CONNECTIONS`]).
pub fn bridge<S: Duplex>(channel: &UnixStream, connect: impl Fn(u8) -> Option<S>) {
    let bridged = Arc::new(AtomicUsize::new(0));
    // `read`, not `recvmsg`: descriptors a payload holding the channel sends are
    // discarded, so the channel yields this route's connections and nothing else.
    let mut request = [0u8; 1];
    while let Ok(1) = (&*channel).read(&mut request) {
        let route = Slot::take(&bridged).and_then(|slot| {
            let there = connect(request[0])?;
            Some((there, UnixStream::pair().ok()?, slot))
        });
        let sent = match route {
            Some((there, (ours, theirs), slot)) => {
                let sent = sys::send_with_fds(channel.as_fd(), b"F", &[theirs.as_raw_fd()]);
                // No thread: the connection (and its slot) is dropped at once.
                let _ = std::thread::Builder::new()
                    .name("airlock-gvisor-relay".into())
                    .spawn(move || {
                        relay(there, ours);
                        drop(slot);
                    });
                sent
            }
            None => (&*channel).write_all(&[NO_ROUTE]),
        };
        if sent.is_err() {
            return;
        }
    }
}

/// One of a route's [`MAX_BRIDGED_CONNECTIONS`], held until its relay ends.
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

/// A forwarder's control channel before it said it listens; `R` is what the bridge's
/// thread is handed once it does (the channel, and for egress the resolver's pair).
pub struct Pending<R = UnixStream> {
    ours: UnixStream,
    theirs: Option<OwnedFd>,
    to_bridge: mpsc::Sender<R>,
    /// The control a route that cannot be built refuses the run as.
    control: &'static str,
}

impl Pending<UnixStream> {
    /// Waits for the forwarder's ready byte, then hands the channel to the bridge.
    pub fn forwarder_ready(self) -> Result<(), CellError> {
        self.forwarder_ready_into(Ok)
    }
}

impl<R> Pending<R> {
    /// A new channel; once the forwarder is ready, what its supervisor end becomes goes
    /// to the bridge thread listening on `to_bridge`.
    pub fn new(control: &'static str, to_bridge: mpsc::Sender<R>) -> Result<Pending<R>, CellError> {
        let (ours, theirs) =
            UnixStream::pair().map_err(|e| CellError::io("a forwarder's channel", e))?;
        Ok(Pending {
            ours,
            theirs: Some(OwnedFd::from(theirs)),
            to_bridge,
            control,
        })
    }

    /// The forwarder's stdin (once).
    pub fn sandbox_end(&mut self) -> Result<OwnedFd, CellError> {
        self.theirs.take().ok_or_else(|| CellError::Protocol {
            message: "the forwarder's channel was taken".into(),
        })
    }

    /// Waits for the forwarder's ready byte, then hands `route(channel)` to the bridge.
    pub fn forwarder_ready_into(
        self,
        route: impl FnOnce(UnixStream) -> Result<R, CellError>,
    ) -> Result<(), CellError> {
        let Pending {
            ours,
            to_bridge,
            control,
            ..
        } = self;
        let io = |e| CellError::io("a forwarder's channel", e);
        ours.set_read_timeout(Some(FORWARDER_START)).map_err(io)?;
        let mut ready = [0u8; 1];
        match (&ours).read(&mut ready) {
            Ok(1) if ready[0] == FORWARDER_READY => {}
            Ok(_) => return Err(refused(control, "the forwarder ended before it listened")),
            Err(e) => {
                let why = format!(
                    "the forwarder did not listen within {} s: {e}",
                    FORWARDER_START.as_secs()
                );
                return Err(refused(control, &why));
            }
        }
        ours.set_read_timeout(None).map_err(io)?;
        to_bridge
            .send(route(ours)?)
            .map_err(|_| refused(control, "the bridge's thread ended"))
    }
}

/// Fail closed: a sandbox whose route cannot be built does not run.
pub fn refused(control: &'static str, why: &str) -> CellError {
    CellError::Unavailable {
        control,
        reason: why.to_string(),
    }
}
