//! Per-tenant quotas: cells alive, sessions open, runs started per minute, and threads of
//! the blocking pool in use (`server.max_blocking_per_tenant`). Over a quota the answer
//! is 429 with `Retry-After` at once: nothing waits in a queue.

use crate::config::TenantConfig;
use crate::error::ApiError;
use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const MINUTE: Duration = Duration::from_secs(60);

#[derive(Debug, Default)]
struct Usage {
    cells: usize,
    sessions: usize,
    /// Session commands running now.
    commands: usize,
    /// When each run of the last minute started, oldest first.
    starts: VecDeque<Instant>,
    /// Blocking-pool threads working for the tenant now.
    blocking: usize,
}

/// The quotas of one tenant as numbers (the operator's are unbounded).
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_cells: usize,
    pub max_sessions: usize,
    pub runs_per_minute: u32,
    pub max_commands: usize,
}

impl Limits {
    pub const UNBOUNDED: Limits = Limits {
        max_cells: usize::MAX,
        max_sessions: usize::MAX,
        runs_per_minute: u32::MAX,
        max_commands: usize::MAX,
    };

    pub fn of(config: &TenantConfig) -> Limits {
        Limits {
            max_cells: config.max_cells,
            max_sessions: config.max_sessions,
            runs_per_minute: config.runs_per_minute,
            max_commands: config.max_commands,
        }
    }
}

/// What a new piece of work takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Work {
    /// A one-shot run: a cell and a start.
    Run,
    /// A session: a cell and a session slot.
    Session,
    /// A command of an open session: a start and a running command (its cell is the
    /// session's).
    Command,
}

impl Work {
    /// Whether it counts against `runs_per_minute`: runs and session commands do; opening
    /// a session runs nothing (its commands are counted as they start).
    fn counts_as_a_start(self) -> bool {
        self != Work::Session
    }
}

#[derive(Default)]
pub struct Quotas {
    usage: Mutex<BTreeMap<String, Usage>>,
}

/// Held while the work lives; gives its cell, session slot or running command back when
/// dropped.
pub struct Permit {
    quotas: Arc<Quotas>,
    tenant: String,
    work: Work,
}

impl Drop for Permit {
    fn drop(&mut self) {
        let mut usage = self.quotas.usage.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(u) = usage.get_mut(&self.tenant) {
            match self.work {
                Work::Command => u.commands = u.commands.saturating_sub(1),
                Work::Run => u.cells = u.cells.saturating_sub(1),
                Work::Session => {
                    u.cells = u.cells.saturating_sub(1);
                    u.sessions = u.sessions.saturating_sub(1);
                }
            }
        }
    }
}

/// Held by the blocking thread doing a tenant's work (moved into its closure), so the
/// slot is given back when that thread is done with it, however it ends (its result,
/// an error, a panic's unwind) and whether or not anyone still waits for it.
pub struct BlockingPermit {
    quotas: Arc<Quotas>,
    tenant: String,
}

impl Drop for BlockingPermit {
    fn drop(&mut self) {
        let mut usage = self.quotas.usage.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(u) = usage.get_mut(&self.tenant) {
            u.blocking = u.blocking.saturating_sub(1);
        }
    }
}

impl Quotas {
    /// A thread of the blocking pool for `tenant`, or 429 once it has `max` at work.
    pub fn blocking(
        self: &Arc<Self>,
        tenant: &str,
        max: usize,
    ) -> Result<BlockingPermit, ApiError> {
        let mut usage = self.usage.lock().unwrap_or_else(|p| p.into_inner());
        let u = usage.entry(tenant.to_string()).or_default();
        decide_blocking(u.blocking, max)?;
        u.blocking += 1;
        Ok(BlockingPermit {
            quotas: Arc::clone(self),
            tenant: tenant.to_string(),
        })
    }

    /// The tenant's blocking threads at work now.
    pub fn blocking_in_use(&self, tenant: &str) -> usize {
        let usage = self.usage.lock().unwrap_or_else(|p| p.into_inner());
        usage.get(tenant).map_or(0, |u| u.blocking)
    }

    /// Takes what `work` needs of `tenant`'s quotas, or says which one is exhausted.
    pub fn admit(
        self: &Arc<Self>,
        tenant: &str,
        limits: Limits,
        work: Work,
        now: Instant,
    ) -> Result<Permit, ApiError> {
        let mut usage = self.usage.lock().unwrap_or_else(|p| p.into_inner());
        let u = usage.entry(tenant.to_string()).or_default();
        decide(u, limits, work, now)?;
        match work {
            Work::Command => u.commands += 1,
            Work::Run => u.cells += 1,
            Work::Session => {
                u.cells += 1;
                u.sessions += 1;
            }
        }
        if work.counts_as_a_start() {
            u.starts.push_back(now);
        }
        Ok(Permit {
            quotas: Arc::clone(self),
            tenant: tenant.to_string(),
            work,
        })
    }
}

/// The pure decision of the blocking share: a tenant with `in_use` threads at work may
/// take one more while under `max`.
fn decide_blocking(in_use: usize, max: usize) -> Result<(), ApiError> {
    if in_use < max {
        return Ok(());
    }
    Err(ApiError::too_many(
        "quota.blocking",
        format!(
            "the tenant has its {max} blocking operations (server.max_blocking_per_tenant) \
             at work"
        ),
        1,
    ))
}

/// The pure decision: refused with the exhausted quota's reason code and when to retry.
fn decide(u: &mut Usage, limits: Limits, work: Work, now: Instant) -> Result<(), ApiError> {
    while u
        .starts
        .front()
        .is_some_and(|t| now.duration_since(*t) >= MINUTE)
    {
        u.starts.pop_front();
    }
    if work != Work::Command && u.cells >= limits.max_cells {
        return Err(ApiError::too_many(
            "quota.cells",
            format!("the tenant has its {} cells alive", limits.max_cells),
            1,
        ));
    }
    if work == Work::Command && u.commands >= limits.max_commands {
        return Err(ApiError::too_many(
            "quota.commands",
            format!(
                "the tenant has its {} session commands running",
                limits.max_commands
            ),
            1,
        ));
    }
    if work == Work::Session && u.sessions >= limits.max_sessions {
        return Err(ApiError::too_many(
            "quota.sessions",
            format!("the tenant has its {} sessions open", limits.max_sessions),
            5,
        ));
    }
    if work.counts_as_a_start() && u.starts.len() >= limits.runs_per_minute as usize {
        let oldest = u.starts.front().copied().unwrap_or(now);
        let wait = MINUTE.saturating_sub(now.duration_since(oldest));
        return Err(ApiError::too_many(
            "quota.runs_per_minute",
            format!(
                "the tenant started {} runs in the last minute",
                limits.runs_per_minute
            ),
            wait.as_secs() + 1,
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(cells: usize, sessions: usize, per_minute: u32) -> Limits {
        Limits {
            max_cells: cells,
            max_sessions: sessions,
            runs_per_minute: per_minute,
            max_commands: 2,
        }
    }

    #[test]
    fn cells_are_given_back_when_the_permit_drops() {
        let q = Arc::new(Quotas::default());
        let now = Instant::now();
        let first = q.admit("a", limits(1, 1, 100), Work::Run, now).unwrap();
        let err = q
            .admit("a", limits(1, 1, 100), Work::Run, now)
            .err()
            .unwrap();
        assert_eq!(err.body.reason, "quota.cells");
        assert_eq!(err.status, 429);
        assert_eq!(err.retry_after, Some(1));
        // Another tenant is not affected.
        q.admit("b", limits(1, 1, 100), Work::Run, now).unwrap();
        drop(first);
        q.admit("a", limits(1, 1, 100), Work::Run, now).unwrap();
    }

    #[test]
    fn sessions_have_their_own_quota_and_commands_take_no_cell() {
        let q = Arc::new(Quotas::default());
        let now = Instant::now();
        let _s = q.admit("a", limits(5, 1, 100), Work::Session, now).unwrap();
        let err = q
            .admit("a", limits(5, 1, 100), Work::Session, now)
            .err()
            .unwrap();
        assert_eq!(err.body.reason, "quota.sessions");
        let full = limits(1, 1, 100);
        q.admit("a", full, Work::Command, now).unwrap();
        q.admit("a", full, Work::Command, now).unwrap();
    }

    #[test]
    fn running_commands_are_bounded_and_given_back_when_they_end() {
        let q = Arc::new(Quotas::default());
        let now = Instant::now();
        let l = limits(1, 1, 100);
        let running: Vec<_> = (0..2)
            .map(|_| q.admit("a", l, Work::Command, now).unwrap())
            .collect();
        let err = q.admit("a", l, Work::Command, now).err().unwrap();
        assert_eq!(err.body.reason, "quota.commands");
        assert_eq!(err.status, 429);
        // Another tenant's commands are not affected, nor this tenant's cells.
        q.admit("b", l, Work::Command, now).unwrap();
        let _cell = q.admit("a", l, Work::Run, now).unwrap();
        drop(running);
        q.admit("a", l, Work::Command, now).unwrap();
    }

    #[test]
    fn the_blocking_share_is_per_tenant_and_given_back_on_drop() {
        let q = Arc::new(Quotas::default());
        let held: Vec<_> = (0..2).map(|_| q.blocking("a", 2).unwrap()).collect();
        let err = q.blocking("a", 2).err().unwrap();
        assert_eq!(err.body.reason, "quota.blocking");
        assert_eq!(err.status, 429);
        assert_eq!(err.retry_after, Some(1));
        let other = q.blocking("b", 2).unwrap();
        assert_eq!(q.blocking_in_use("a"), 2);
        drop(held);
        drop(other);
        assert_eq!(q.blocking_in_use("a"), 0);
        assert_eq!(q.blocking_in_use("b"), 0);
        q.blocking("a", 2).unwrap();
    }

    #[test]
    fn a_panicking_blocking_thread_gives_its_slot_back() {
        let q = Arc::new(Quotas::default());
        let permit = q.blocking("a", 1).unwrap();
        let joined = std::thread::spawn(move || {
            let _permit = permit;
            panic!("the work failed");
        })
        .join();
        assert!(joined.is_err());
        assert_eq!(q.blocking_in_use("a"), 0);
    }

    #[test]
    fn the_rate_window_slides_and_says_when_to_retry() {
        let q = Arc::new(Quotas::default());
        let t0 = Instant::now();
        let l = limits(10, 1, 2);
        drop(q.admit("a", l, Work::Run, t0).unwrap());
        drop(
            q.admit("a", l, Work::Run, t0 + Duration::from_secs(10))
                .unwrap(),
        );
        let err = q
            .admit("a", l, Work::Run, t0 + Duration::from_secs(30))
            .err()
            .unwrap();
        assert_eq!(err.body.reason, "quota.runs_per_minute");
        assert_eq!(err.retry_after, Some(31));
        q.admit("a", l, Work::Run, t0 + Duration::from_secs(61))
            .unwrap();
    }

    #[test]
    fn opening_a_session_is_not_a_run_but_its_commands_are() {
        let q = Arc::new(Quotas::default());
        let now = Instant::now();
        let l = limits(10, 10, 2);
        let _sessions: Vec<Permit> = (0..5)
            .map(|_| q.admit("a", l, Work::Session, now).unwrap())
            .collect();
        q.admit("a", l, Work::Command, now).unwrap();
        q.admit("a", l, Work::Run, now).unwrap();
        let err = q.admit("a", l, Work::Command, now).err().unwrap();
        assert_eq!(err.body.reason, "quota.runs_per_minute");
        // A full rate window still lets a session open: it starts nothing.
        q.admit("a", l, Work::Session, now).unwrap();
    }
}
