//! The caller's terminal while the payload runs on a pseudo-terminal of its cell (a plan
//! with `terminal`): in raw mode, so that every key reaches the payload's terminal as
//! typed (Ctrl-C becomes the payload's SIGINT there, not airlock's), and always restored.
//!
//! Restored when the run ends, on every error path (Drop), and before airlock dies of a
//! signal sent to it: SIGINT, SIGTERM, SIGHUP and SIGQUIT are taken through a signalfd
//! in the supervisor's poll loop, the terminal is restored, and the signal is raised
//! again with its default action (the cell dies with the supervisor, as it does without a
//! terminal). SIGWINCH copies the window size to the payload's terminal. SIGTSTP is
//! ignored: a stopped supervisor would leave the terminal raw while the deadline runs.
//! Release builds abort on panic, so Drop would not run then: a panic hook restores the
//! modes before the abort.

use crate::sys;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::{Mutex, Once};

/// The modes a panic restores: a duplicate of the caller's terminal and its saved modes,
/// set while the terminal is raw.
static RESTORE_ON_PANIC: Mutex<Option<(OwnedFd, libc::termios)>> = Mutex::new(None);
static PANIC_HOOK: Once = Once::new();

/// Installs (once) a panic hook that restores the terminal held in [`RESTORE_ON_PANIC`],
/// then runs the hook that was there before.
fn restore_on_panic(terminal: &OwnedFd, saved: &libc::termios) -> std::io::Result<()> {
    let copy = terminal.try_clone()?;
    if let Ok(mut slot) = RESTORE_ON_PANIC.lock() {
        *slot = Some((copy, *saved));
    }
    PANIC_HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            // try_lock: the panic may come from a thread that holds the lock.
            if let Ok(mut slot) = RESTORE_ON_PANIC.try_lock() {
                if let Some((terminal, saved)) = slot.take() {
                    let _ = sys::set_terminal_modes(terminal.as_fd(), &saved);
                }
            }
            previous(info)
        }));
    });
    Ok(())
}

fn clear_restore_on_panic() {
    if let Ok(mut slot) = RESTORE_ON_PANIC.lock() {
        slot.take();
    }
}

/// Signals the supervisor takes through its signalfd while the terminal is raw.
const TAKEN_SIGNALS: &[libc::c_int] = &[
    libc::SIGWINCH,
    libc::SIGINT,
    libc::SIGTERM,
    libc::SIGHUP,
    libc::SIGQUIT,
    libc::SIGTSTP,
];

/// The window of a payload terminal whose caller has none (stdin is a pipe).
pub const DEFAULT_WINDOW: libc::winsize = libc::winsize {
    ws_row: 24,
    ws_col: 80,
    ws_xpixel: 0,
    ws_ypixel: 0,
};

/// How often a cell whose caller is in another process looks at the caller's window
/// size (see [`WindowFollower`]).
pub const WINDOW_FOLLOW_INTERVAL_MS: i32 = 200;

/// The caller's terminal seen from a process that does not get its SIGWINCH: a serving
/// cell's supervisor, whose caller is a handed-off `airlock run` in another session. It
/// looks at the caller's window size now and then and copies a change to the payload's
/// terminal. Neither the modes nor the signals are touched: the caller's process owns
/// those (crates/airlock/src/run.rs puts its terminal in raw mode itself).
pub struct WindowFollower {
    /// A duplicate of the caller's terminal.
    caller: OwnedFd,
    /// The size last copied to the payload's terminal (`None`: nothing copied yet).
    copied: Option<(u16, u16, u16, u16)>,
}

impl WindowFollower {
    /// Follows `caller` if it is a terminal.
    pub fn of(caller: BorrowedFd<'_>) -> Option<WindowFollower> {
        if !sys::is_terminal(caller) {
            return None;
        }
        Some(WindowFollower {
            caller: caller.try_clone_to_owned().ok()?,
            copied: None,
        })
    }

    /// Copies the caller's window size to `payload_terminal` if it changed since the last
    /// copy.
    pub fn follow(&mut self, payload_terminal: BorrowedFd<'_>) {
        let Ok(size) = sys::window_size(self.caller.as_fd()) else {
            return;
        };
        let key = (size.ws_row, size.ws_col, size.ws_xpixel, size.ws_ypixel);
        if self.copied != Some(key) && sys::set_window_size(payload_terminal, &size).is_ok() {
            self.copied = Some(key);
        }
    }
}

/// What a signal taken from the signalfd asks of the supervisor.
#[derive(Debug, PartialEq, Eq)]
pub enum TakenSignal {
    /// The caller's window changed: copy its size to the payload's terminal.
    Resize,
    /// Restore the terminal, then die of this signal.
    Die(libc::c_int),
    Ignore,
}

/// What a signal means while the caller's terminal is raw.
pub fn meaning(signal: libc::c_int) -> TakenSignal {
    match signal {
        libc::SIGWINCH => TakenSignal::Resize,
        libc::SIGTSTP => TakenSignal::Ignore,
        other => TakenSignal::Die(other),
    }
}

pub struct CallerTerminal {
    /// `None` in the cell's copy of the supervisor (see [`CallerTerminal::forget`]).
    state: Option<Held>,
}

struct Held {
    /// A duplicate of the caller's stdin, a terminal.
    terminal: OwnedFd,
    saved: libc::termios,
    signals: OwnedFd,
    mask: libc::sigset_t,
}

impl CallerTerminal {
    /// Takes the signals and puts `terminal` in raw mode. The process must still be
    /// single-threaded (threads started later inherit the blocked signals).
    pub fn enter(terminal: BorrowedFd<'_>) -> std::io::Result<CallerTerminal> {
        let terminal = terminal.try_clone_to_owned()?;
        let saved = sys::terminal_modes(terminal.as_fd())?;
        let (signals, mask) = sys::block_into_signalfd(TAKEN_SIGNALS)?;
        let held = Held {
            terminal,
            saved,
            signals,
            mask,
        };
        // From here on Drop restores both the modes and the signal mask.
        let this = CallerTerminal { state: Some(held) };
        let held = this.state.as_ref().expect("just set");
        restore_on_panic(&held.terminal, &held.saved)?;
        sys::set_terminal_modes(held.terminal.as_fd(), &sys::raw_modes(&held.saved))?;
        Ok(this)
    }

    /// The caller's window size, for the payload's terminal.
    pub fn window(&self) -> libc::winsize {
        self.state
            .as_ref()
            .and_then(|held| sys::window_size(held.terminal.as_fd()).ok())
            .unwrap_or(DEFAULT_WINDOW)
    }

    /// The signalfd to poll (-1 for none).
    pub fn signals(&self) -> Option<BorrowedFd<'_>> {
        self.state.as_ref().map(|held| held.signals.as_fd())
    }

    /// Reads the signals queued on the signalfd and acts on them: a resize is copied to
    /// `payload_terminal` (the master, once the cell sent it); a fatal signal restores the
    /// terminal and ends the process.
    pub fn on_signals(&mut self, payload_terminal: Option<BorrowedFd<'_>>) {
        if let Some(signal) = self.take_signals(payload_terminal) {
            self.restore();
            sys::die_of(signal)
        }
    }

    /// [`CallerTerminal::on_signals`] for a supervisor that ends its sandbox first: a
    /// fatal signal is returned (the rest of the queue is left), for
    /// [`CallerTerminal::die_of`] once the sandbox is gone.
    pub fn take_signals(&mut self, payload_terminal: Option<BorrowedFd<'_>>) -> Option<i32> {
        let held = self.state.as_ref()?;
        while let Some(signal) = sys::read_signal(held.signals.as_fd()) {
            match meaning(signal) {
                TakenSignal::Resize => {
                    if let Some(master) = payload_terminal {
                        let _ = sys::set_window_size(master, &self.window());
                    }
                }
                TakenSignal::Ignore => {}
                TakenSignal::Die(signal) => return Some(signal),
            }
        }
        None
    }

    /// Restores the terminal, then ends the process as `signal` would have.
    pub fn die_of(mut self, signal: libc::c_int) -> ! {
        self.restore();
        sys::die_of(signal)
    }

    /// Blocks until `fd` is readable or hung up, acting on the signals taken meanwhile
    /// (a fatal one restores the terminal and ends this process). For a caller whose
    /// payload runs elsewhere: a handed-off `airlock run` waiting for the service's
    /// reply while its terminal is the payload's (crates/airlock/src/run.rs).
    pub fn wait_readable(&mut self, fd: BorrowedFd<'_>) -> std::io::Result<()> {
        use std::os::fd::AsRawFd;
        loop {
            let signals = self.signals().map_or(-1, |s| s.as_raw_fd());
            let mut fds = [
                libc::pollfd {
                    fd: fd.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                },
                libc::pollfd {
                    fd: signals,
                    events: libc::POLLIN,
                    revents: 0,
                },
            ];
            match sys::poll(&mut fds, -1) {
                Err(err) if err.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(err) => return Err(err),
                Ok(_) => {}
            }
            if fds[1].revents != 0 {
                // No payload terminal here: a resize is the serving cell's to follow.
                self.on_signals(None);
            }
            if fds[0].revents != 0 {
                return Ok(());
            }
        }
    }

    /// In the cell's copy of the supervisor, right after the clone: closes the copies of
    /// the caller's terminal and the signalfd without touching the terminal's modes
    /// (they are the supervisor's to restore).
    pub fn forget(&mut self) {
        drop(self.state.take());
        clear_restore_on_panic();
    }

    fn restore(&mut self) {
        if let Some(held) = self.state.take() {
            clear_restore_on_panic();
            let _ = sys::set_terminal_modes(held.terminal.as_fd(), &held.saved);
            sys::restore_signal_mask(&held.mask);
        }
    }
}

impl Drop for CallerTerminal {
    fn drop(&mut self) {
        self.restore();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_resize_is_copied_and_a_stop_is_ignored_while_other_signals_end_the_run() {
        assert_eq!(meaning(libc::SIGWINCH), TakenSignal::Resize);
        assert_eq!(meaning(libc::SIGTSTP), TakenSignal::Ignore);
        for signal in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT] {
            assert_eq!(meaning(signal), TakenSignal::Die(signal));
        }
    }
}
