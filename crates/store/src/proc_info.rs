//! Identity of a supervisor process, so a `running` record can be judged stale.
//!
//! A pid alone is not enough: pids are reused. The triple (boot id, pid, process start
//! time in clock ticks since boot) names one process instance for all time.

use std::sync::OnceLock;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessIdentity {
    pub pid: u32,
    pub start_time: u64,
    pub boot_id: String,
}

/// Process state and start time (field 3 and 22 of /proc/<pid>/stat).
pub fn stat_of(pid: u32) -> Option<(char, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // comm (field 2) may contain spaces and parentheses: parse after the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    // `rest` starts at field 3, so field 22 is the 20th item (index 19).
    let start = fields.nth(18)?.parse().ok()?;
    Some((state, start))
}

pub fn boot_id() -> String {
    static BOOT: OnceLock<String> = OnceLock::new();
    BOOT.get_or_init(|| {
        std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
            .map(|s| s.trim().to_string())
            .unwrap_or_default()
    })
    .clone()
}

/// Identity of the calling process; cached per pid (a forked child recomputes).
pub fn current() -> ProcessIdentity {
    static CACHE: OnceLock<std::sync::Mutex<Option<ProcessIdentity>>> = OnceLock::new();
    let pid = std::process::id();
    let cell = CACHE.get_or_init(|| std::sync::Mutex::new(None));
    let mut guard = cell.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(id) = guard.as_ref().filter(|id| id.pid == pid) {
        return id.clone();
    }
    let id = ProcessIdentity {
        pid,
        start_time: stat_of(pid).map(|(_, t)| t).unwrap_or(0),
        boot_id: boot_id(),
    };
    *guard = Some(id.clone());
    id
}

/// Why a recorded supervisor is no longer alive, or `None` if it still runs.
pub fn staleness(recorded: &ProcessIdentity) -> Option<String> {
    let boot = boot_id();
    if recorded.boot_id != boot {
        return Some(format!(
            "host rebooted (boot id {} -> {boot})",
            recorded.boot_id
        ));
    }
    match stat_of(recorded.pid) {
        None => Some(format!("supervisor pid {} is gone", recorded.pid)),
        Some(('Z', _)) | Some(('X', _)) => Some(format!(
            "supervisor pid {} has exited (zombie)",
            recorded.pid
        )),
        Some((_, start)) if start != recorded.start_time => Some(format!(
            "supervisor pid {} was reused (start time {} != recorded {})",
            recorded.pid, start, recorded.start_time
        )),
        Some(_) => None,
    }
}

/// Effective uid from /proc/self/status (avoids an unsafe libc call).
pub fn effective_uid() -> Option<u32> {
    uids().1
}

/// Real uid: who called airlock (`sudo` makes it 0; a set-uid start keeps the caller's).
pub fn real_uid() -> Option<u32> {
    uids().0
}

/// (real, effective) uid of this process from the `Uid:` line of /proc/self/status, read
/// once: the store asks for both on the start path (the caller's uid for the record, the
/// effective one for the state directory's owner check).
fn uids() -> (Option<u32>, Option<u32>) {
    static UIDS: OnceLock<(Option<u32>, Option<u32>)> = OnceLock::new();
    *UIDS.get_or_init(|| {
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        let line = status.lines().find(|l| l.starts_with("Uid:")).unwrap_or("");
        let field = |i: usize| line.split_whitespace().nth(i).and_then(|u| u.parse().ok());
        (field(1), field(2))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn self_is_alive_and_reuse_is_detected() {
        let me = current();
        assert!(me.start_time > 0 && !me.boot_id.is_empty());
        assert_eq!(staleness(&me), None);
        let reused = ProcessIdentity {
            start_time: me.start_time + 1,
            ..me.clone()
        };
        assert!(staleness(&reused).unwrap().contains("reused"));
        let rebooted = ProcessIdentity {
            boot_id: "other".into(),
            ..me.clone()
        };
        assert!(staleness(&rebooted).unwrap().contains("rebooted"));
        let gone = ProcessIdentity {
            pid: u32::MAX - 7,
            ..me
        };
        assert!(staleness(&gone).unwrap().contains("gone"));
    }
}
