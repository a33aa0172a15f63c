//! The deadline of a command, enforced from outside the cell: SIGTERM to everything at
//! the deadline, SIGKILL of all but pid 1 after a grace period (pid 1 reaps and
//! reports), then pid 1 itself. A pure state machine: the poll loop asks when to wake up
//! and what to do at a given instant.

use std::time::{Duration, Instant};

/// Time between SIGTERM at the deadline and SIGKILL of the whole cell.
pub const TERM_GRACE: Duration = Duration::from_millis(1000);
/// After the payload and its descendants are killed, how long the cell's pid 1 gets to
/// reap them and report (so the payload's status and CPU time are known) before it is
/// killed too.
pub const REAPER_GRACE: Duration = Duration::from_millis(300);

/// Where the deadline enforcement stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Deadline {
    /// No command runs yet: a parked cell has no deadline.
    Unset,
    Pending(Instant),
    /// SIGTERM sent at the deadline; SIGKILL when the grace period ends.
    Terminating(Instant),
    /// Everything but pid 1 killed; pid 1 itself is killed at this instant.
    Reaping(Instant),
    Done,
}

/// What the supervisor must do now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// SIGTERM to every process of the cell (pid 1 ignores it).
    Terminate,
    /// SIGKILL to every process but pid 1.
    KillAllButPid1,
    /// SIGKILL to pid 1 (which takes the pid namespace) and the cgroup.
    KillPid1,
}

impl Deadline {
    /// The deadline of a command started at `start` with `wall_time_ms`.
    pub fn from_start(start: Instant, wall_time_ms: u64) -> Deadline {
        Deadline::Pending(start + Duration::from_millis(wall_time_ms))
    }

    /// When the supervisor must look again; `None`: no deadline.
    pub fn next_wake(&self) -> Option<Instant> {
        match *self {
            Deadline::Pending(at) => Some(at),
            Deadline::Terminating(sent) => Some(sent + TERM_GRACE),
            Deadline::Reaping(at) => Some(at),
            Deadline::Unset | Deadline::Done => None,
        }
    }

    /// The state at `now` and the step to take, if one is due.
    pub fn advance(self, now: Instant) -> (Deadline, Option<Step>) {
        match self {
            Deadline::Pending(at) if now >= at => {
                (Deadline::Terminating(now), Some(Step::Terminate))
            }
            Deadline::Terminating(sent) if now >= sent + TERM_GRACE => (
                Deadline::Reaping(now + REAPER_GRACE),
                Some(Step::KillAllButPid1),
            ),
            Deadline::Reaping(at) if now >= at => (Deadline::Done, Some(Step::KillPid1)),
            unchanged => (unchanged, None),
        }
    }
}

/// Milliseconds until `at` for `poll`, `-1` for never.
pub fn poll_timeout(at: Option<Instant>) -> i32 {
    at.map_or(-1, |at| {
        at.saturating_duration_since(Instant::now())
            .as_millis()
            .min(i32::MAX as u128) as i32
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nothing_happens_before_the_deadline() {
        let t0 = Instant::now();
        let deadline = Deadline::from_start(t0, 100);
        assert_eq!(deadline.advance(t0), (deadline, None));
        assert_eq!(deadline.next_wake(), Some(t0 + Duration::from_millis(100)));
    }

    #[test]
    fn the_deadline_terminates_then_kills_all_but_pid1_then_pid1() {
        let t0 = Instant::now();
        let at = t0 + Duration::from_millis(100);
        let (d, step) = Deadline::from_start(t0, 100).advance(at);
        assert_eq!(
            (d, step),
            (Deadline::Terminating(at), Some(Step::Terminate))
        );
        // Within the grace period nothing more happens.
        assert_eq!(d.advance(at + TERM_GRACE / 2).1, None);
        let killed = at + TERM_GRACE;
        let (d, step) = d.advance(killed);
        assert_eq!(step, Some(Step::KillAllButPid1));
        assert_eq!(d.next_wake(), Some(killed + REAPER_GRACE));
        let (d, step) = d.advance(killed + REAPER_GRACE);
        assert_eq!((d, step), (Deadline::Done, Some(Step::KillPid1)));
        assert_eq!(d.next_wake(), None);
    }

    #[test]
    fn a_parked_cell_has_no_deadline() {
        assert_eq!(Deadline::Unset.next_wake(), None);
        assert_eq!(Deadline::Unset.advance(Instant::now()).1, None);
        assert_eq!(poll_timeout(None), -1);
    }
}
