//! For a service that runs cells for local clients (crates/engine/src/handoff.rs): who is
//! on the other end of a unix socket, descriptors on a stream socket, and file checks
//! made with a client's identity. Thin safe wrappers over [`crate::sys`], where all
//! `unsafe` lives.

use crate::sys;
use std::io;
use std::os::fd::{BorrowedFd, OwnedFd, RawFd};

pub use sys::PeerIdentity;

/// The process that connected `sock`, with its supplementary groups.
pub fn peer_identity(sock: BorrowedFd<'_>) -> io::Result<PeerIdentity> {
    sys::peer_identity(sock)
}

/// Sends `data` with `fds` as SCM_RIGHTS in one `sendmsg`.
pub fn send_with_fds(sock: BorrowedFd<'_>, data: &[u8], fds: &[RawFd]) -> io::Result<()> {
    sys::send_with_fds(sock, data, fds)
}

/// Receives into `buf` from a stream socket with up to `max_fds` descriptors.
pub fn recv_with_fds(
    sock: BorrowedFd<'_>,
    buf: &mut [u8],
    max_fds: usize,
) -> io::Result<(usize, Vec<OwnedFd>)> {
    sys::recv_stream_with_fds(sock, buf, max_fds)
}

/// Gives the calling thread the file-system identity of `peer` (fsuid, fsgid, groups),
/// for good: call it on a thread of its own that ends after its checks.
pub fn become_peer_for_files(peer: &PeerIdentity) -> io::Result<()> {
    sys::take_fs_identity_for_this_thread(peer.uid, peer.gid, &peer.groups)
}

/// Whether this thread's file-system identity may access `fd`'s file with `mode`.
pub fn may_access(fd: BorrowedFd<'_>, mode: libc::c_int) -> io::Result<()> {
    sys::access_as_thread(fd, mode)
}

/// Whether this process runs as root (its effective uid): where a client looks for the
/// service's socket.
pub fn running_as_root() -> bool {
    sys::geteuid() == 0
}

/// Whether `fd` is a terminal.
pub fn is_terminal(fd: BorrowedFd<'_>) -> bool {
    sys::is_terminal(fd)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn the_peer_of_a_socket_pair_is_this_process() {
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        let peer = peer_identity(a.as_fd()).unwrap();
        assert_eq!(peer.pid, std::process::id() as i32);
        assert_eq!(peer.uid, sys::geteuid());
    }

    #[test]
    fn a_thread_with_another_identity_is_refused_what_only_root_may_read() {
        if sys::geteuid() != 0 {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let secret = dir.path().join("secret");
        std::fs::write(&secret, "x").unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
        let file = std::fs::File::open(&secret).unwrap();
        let nobody = PeerIdentity {
            pid: 0,
            uid: 65534,
            gid: 65534,
            groups: Vec::new(),
        };
        let denied = std::thread::scope(|s| {
            s.spawn(|| {
                become_peer_for_files(&nobody).unwrap();
                may_access(file.as_fd(), libc::R_OK)
            })
            .join()
            .unwrap()
        });
        assert_eq!(denied.unwrap_err().raw_os_error(), Some(libc::EACCES));
        // This thread kept its own identity.
        may_access(file.as_fd(), libc::R_OK).unwrap();
    }
}
