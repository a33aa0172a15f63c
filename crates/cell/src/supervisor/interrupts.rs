//! SIGINT, SIGTERM and SIGHUP sent to a one-shot `airlock run` (a shell's Ctrl-C, `kill`,
//! a closed login session) while its cell lives: taken through a signalfd in the
//! supervisor's poll loop, so that the cell is destroyed, torn down and recorded before
//! airlock ends as the signal would have ended it ([`crate::die_of_signal`]). With the
//! default action the supervisor died at once and left the cell's cgroups and a record
//! still `running` for the next run to reap as `aborted`.

use crate::sys;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

/// The signals taken.
const INTERRUPTS: &[libc::c_int] = &[libc::SIGINT, libc::SIGTERM, libc::SIGHUP];

pub struct Interrupts {
    signals: OwnedFd,
    previous_mask: libc::sigset_t,
}

impl Interrupts {
    /// Blocks the interrupts and reads them from a signalfd. The process must be
    /// single-threaded: threads made later inherit the mask, and one made before would
    /// take a signal with its default action. The cell's launcher resets the mask before
    /// the payload's exec (`sys::reset_signal_state`).
    pub fn take() -> std::io::Result<Interrupts> {
        let (signals, previous_mask) = sys::block_into_signalfd(INTERRUPTS)?;
        Ok(Interrupts {
            signals,
            previous_mask,
        })
    }

    pub fn fd(&self) -> BorrowedFd<'_> {
        self.signals.as_fd()
    }

    /// The first interrupt queued, if any; the rest of the queue is read too (one is
    /// enough to end the run).
    pub fn next(&self) -> Option<libc::c_int> {
        let first = sys::read_signal(self.signals.as_fd());
        while sys::read_signal(self.signals.as_fd()).is_some() {}
        first
    }
}

impl Drop for Interrupts {
    /// A signal sent after the last look takes its default action from here on.
    fn drop(&mut self) {
        sys::restore_signal_mask(&self.previous_mask);
    }
}

/// How the record names an interrupt.
pub fn name(signal: libc::c_int) -> &'static str {
    match signal {
        libc::SIGINT => "SIGINT",
        libc::SIGTERM => "SIGTERM",
        libc::SIGHUP => "SIGHUP",
        _ => "a signal",
    }
}
