//! Process plumbing for the engine's cell factory (crates/engine/src/factory.rs): a
//! single-threaded process that forks one supervisor process per cell for a threaded
//! caller, talking to it over a SOCK_SEQPACKET pair with descriptors as SCM_RIGHTS.
//! Thin safe wrappers over [`crate::sys`], where all `unsafe` lives.

use crate::sys;
use std::io;
use std::os::fd::{BorrowedFd, OwnedFd, RawFd};

/// The outcome of [`fork`].
pub enum Forked {
    Child,
    Parent(libc::pid_t),
}

/// Forks this process, which must be single-threaded (checked, see
/// [`crate::sys::fork_single_threaded`]).
pub fn fork() -> io::Result<Forked> {
    Ok(match sys::fork_single_threaded()? {
        None => Forked::Child,
        Some(pid) => Forked::Parent(pid),
    })
}

/// Puts the null device on fd 0 (a forked supervisor must not keep its parent's
/// socket there).
pub fn null_stdin() -> io::Result<()> {
    let null = std::fs::File::open("/dev/null")?;
    sys::dup2(std::os::fd::AsRawFd::as_raw_fd(&null), 0)
}

/// This process gets SIGKILL when the thread that forked it ends; if that already
/// happened (the parent is not `parent` any more), it exits at once.
pub fn die_with_parent(parent: libc::pid_t) {
    let _ = sys::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong);
    if sys::getppid() != parent {
        sys::exit_now(125);
    }
}

/// A connected SOCK_SEQPACKET pair, close-on-exec.
pub fn seqpacket_pair() -> io::Result<(OwnedFd, OwnedFd)> {
    sys::seqpacket_pair()
}

/// Sends one packet with `fds` as SCM_RIGHTS.
pub fn send_with_fds(sock: BorrowedFd<'_>, data: &[u8], fds: &[RawFd]) -> io::Result<()> {
    sys::send_with_fds(sock, data, fds)
}

/// The next packet and its descriptors; `None` at EOF.
pub fn recv_message(
    sock: BorrowedFd<'_>,
    max_fds: usize,
) -> io::Result<Option<(Vec<u8>, Vec<OwnedFd>)>> {
    sys::recv_message(sock, max_fds)
}

pub fn kill(pid: libc::pid_t, signal: libc::c_int) -> io::Result<()> {
    sys::kill(pid, signal)
}

/// Reaps one exited child without waiting: its pid and raw wait status.
pub fn reap_exited() -> Option<(libc::pid_t, i32)> {
    sys::wait_child(-1, true)
        .ok()
        .flatten()
        .map(|r| (r.pid, r.status))
}

/// Ends the process at once, running no exit handlers (a forked copy must not flush or
/// tear down what its parent owns).
pub fn exit_now(code: i32) -> ! {
    sys::exit_now(code)
}

/// Closes an inherited descriptor by number in a forked child (see
/// [`crate::sys::close_raw`]).
pub fn close_inherited(fd: RawFd) {
    sys::close_raw(fd)
}

/// Whether `sock` has something to read (or hung up) within `timeout_ms`.
pub fn readable_within(sock: BorrowedFd<'_>, timeout_ms: i32) -> io::Result<bool> {
    use std::os::fd::AsRawFd;
    let mut fds = [libc::pollfd {
        fd: sock.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    }];
    match sys::poll(&mut fds, timeout_ms) {
        Ok(n) => Ok(n > 0),
        Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(false),
        Err(e) => Err(e),
    }
}
