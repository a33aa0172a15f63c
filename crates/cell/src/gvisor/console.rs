//! A one-shot gVisor run's terminal (a plan with `terminal`). runsc opens a pty pair of
//! the host's devpts, gives the replica to the Sentry as the payload's stdio and
//! controlling terminal (the payload sees a terminal of gVisor's kernel, whose ioctls
//! the Sentry serves; it gets no host descriptor), and sends the master over
//! `--console-socket` as runc does: one descriptor (`SCM_RIGHTS`) on one connection to a
//! unix socket of the caller's. The supervisor relays that master as the native
//! supervisor relays its cell's: output into the capture and the caller's stdout,
//! the caller's stdin into it, the caller's window size onto it.

use crate::error::CellError;
use crate::sys;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// How long runsc may take to send the master once it connected.
const SEND_TIMEOUT: Duration = Duration::from_secs(5);

/// The unix socket runsc sends the master to.
pub struct ConsoleSocket {
    listener: UnixListener,
    path: PathBuf,
}

impl ConsoleSocket {
    /// Binds `console/socket` in the cell directory `dir`. The cell directory is 0711
    /// (runsc's gofer traverses it), so the socket goes into a directory of its own,
    /// 0700: only root (`runsc run`) can reach it, from the moment it exists.
    pub fn bind(dir: &Path) -> Result<ConsoleSocket, CellError> {
        use std::os::unix::fs::DirBuilderExt;
        let private = dir.join("console");
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&private)
            .map_err(|e| CellError::io(private.display().to_string(), e))?;
        let path = private.join("socket");
        let listener =
            UnixListener::bind(&path).map_err(|e| CellError::io(path.display().to_string(), e))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| CellError::io("the console socket", e))?;
        Ok(ConsoleSocket { listener, path })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The master runsc sends, once it does. `None` when `runsc run` ended first (its
    /// failure is read from its end as for any run) or `until` passed (the deadline then
    /// ends the run). A connection that carries anything but one terminal is refused.
    pub fn receive_master(
        self,
        runsc_exit: &OwnedFd,
        until: Instant,
    ) -> Result<Option<OwnedFd>, CellError> {
        loop {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(None);
            }
            let mut fds = [
                poll_in(self.listener.as_raw_fd()),
                poll_in(runsc_exit.as_raw_fd()),
            ];
            let timeout = i32::try_from(left.as_millis()).unwrap_or(i32::MAX).max(1);
            match sys::poll(&mut fds, timeout) {
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(CellError::io("poll", e)),
                Ok(_) => {}
            }
            if fds[0].revents != 0 {
                if let Some(master) = self.accept_master()? {
                    return Ok(Some(master));
                }
            }
            if fds[1].revents != 0 {
                return Ok(None);
            }
        }
    }

    fn accept_master(&self) -> Result<Option<OwnedFd>, CellError> {
        let protocol = |message: &str| CellError::Protocol {
            message: format!("runsc's console socket: {message}"),
        };
        let stream = match self.listener.accept() {
            Ok((stream, _)) => stream,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(None),
            Err(e) => return Err(CellError::io("the console socket", e)),
        };
        stream
            .set_nonblocking(false)
            .and_then(|()| stream.set_read_timeout(Some(SEND_TIMEOUT)))
            .map_err(|e| CellError::io("the console socket", e))?;
        let mut name = [0u8; 256];
        let (_, mut fds) = sys::recv_with_fds(stream.as_fd(), &mut name, 1)
            .map_err(|e| CellError::io("the console socket", e))?;
        let master = fds.pop().ok_or_else(|| protocol("no descriptor"))?;
        if !sys::is_terminal(master.as_fd()) {
            return Err(protocol("the descriptor is not a terminal"));
        }
        sys::set_nonblocking(master.as_fd()).map_err(|e| CellError::io("the terminal", e))?;
        Ok(Some(master))
    }
}

/// A terminal's size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    pub rows: u16,
    pub cols: u16,
}

impl Window {
    pub fn of(size: &libc::winsize) -> Window {
        Window {
            rows: size.ws_row,
            cols: size.ws_col,
        }
    }
}

/// The payload's process in the spec: on a terminal of `window`'s size (runsc sizes
/// the pty from `consoleSize` before the payload starts; the supervisor sets it again on
/// the master, and follows the caller's changes).
pub fn make_terminal_spec(
    spec: &mut airlock_oci::spec_types::Spec,
    window: Window,
) -> Result<(), CellError> {
    let size = airlock_oci::spec_types::BoxBuilder::default()
        .height(u64::from(window.rows))
        .width(u64::from(window.cols))
        .build()
        .map_err(|e| CellError::Launch {
            stage: "runtime spec".into(),
            message: e.to_string(),
        })?;
    let Some(process) = spec.process_mut() else {
        return Err(CellError::Launch {
            stage: "runtime spec".into(),
            message: "a spec without a process".into(),
        });
    };
    process.set_terminal(Some(true));
    process.set_console_size(Some(size));
    Ok(())
}

fn poll_in(fd: i32) -> libc::pollfd {
    libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    }
}
