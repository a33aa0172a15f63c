//! What the host sees of cells: processes running as a cell identity and cell cgroup
//! directories, and whether an airlock supervisor that owns them is still alive. Used by
//! the tests that check nothing outlives a run.

use std::path::PathBuf;

/// Uid, parent pid and command name of a process.
pub fn proc_status(pid: u32) -> Option<(u32, u32, String)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .map(str::to_string)
    };
    Some((
        field("Uid:")?.parse().ok()?,
        field("PPid:")?.parse().ok()?,
        field("Name:")?,
    ))
}

/// A live airlock supervisor: a root process named `airlock`.
pub fn is_live_supervisor(pid: u32) -> bool {
    matches!(proc_status(pid), Some((0, _, name)) if name == "airlock")
}

fn pids() -> impl Iterator<Item = u32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse().ok()))
}

fn cmdline(pid: u32) -> Option<String> {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .ok()
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
}

/// Processes running as a cell identity that do not hang below a live supervisor (live
/// ones belong to runs still in progress, e.g. of concurrent test binaries).
pub fn stray_cell_processes() -> Vec<String> {
    let mut found = Vec::new();
    for pid in pids() {
        let Some((uid, mut ppid, _)) = proc_status(pid) else {
            continue;
        };
        // Cell identities map to host ids from here up.
        if uid < airlock_cell::HOST_ID_BASE {
            continue;
        }
        let mut supervised = false;
        for _ in 0..64 {
            if ppid <= 1 {
                break;
            }
            if is_live_supervisor(ppid) {
                supervised = true;
                break;
            }
            match proc_status(ppid) {
                Some((_, next, _)) => ppid = next,
                None => break,
            }
        }
        if !supervised {
            found.push(format!(
                "pid {pid} uid {uid}: {}",
                cmdline(pid).unwrap_or_default()
            ));
        }
    }
    found
}

/// Processes (other than this one) whose command line contains `needle`.
pub fn processes_with(needle: &str) -> Vec<String> {
    let me = std::process::id();
    let mut found = Vec::new();
    for pid in pids().filter(|p| *p != me) {
        let Some(line) = cmdline(pid).filter(|c| c.contains(needle)) else {
            continue;
        };
        let state = std::fs::read_to_string(format!("/proc/{pid}/status"))
            .ok()
            .and_then(|s| {
                s.lines()
                    .find(|l| l.starts_with("State:"))
                    .map(str::to_string)
            })
            .unwrap_or_else(|| "State: ?".into());
        found.push(format!("pid {pid} ({state}): {line}"));
    }
    found
}

/// Every cell cgroup directory under `/sys/fs/cgroup/*/airlock/` (v1) or
/// `/sys/fs/cgroup/airlock/` (v2).
pub fn cell_cgroup_dirs() -> Vec<PathBuf> {
    let mut found = Vec::new();
    let Ok(hierarchies) = std::fs::read_dir("/sys/fs/cgroup") else {
        return found;
    };
    let mut parents: Vec<PathBuf> = hierarchies
        .flatten()
        .map(|h| h.path().join("airlock"))
        .collect();
    parents.push(PathBuf::from("/sys/fs/cgroup/airlock"));
    for parent in parents {
        let Ok(cells) = std::fs::read_dir(parent) else {
            continue;
        };
        found.extend(
            cells
                .flatten()
                .filter(|c| c.file_type().is_ok_and(|t| t.is_dir()))
                .map(|c| c.path()),
        );
    }
    found
}

/// Whether the supervisor named by a cell cgroup (`<pid>-...`) is still alive.
pub fn cgroup_owner_alive(dir: &std::path::Path) -> bool {
    let name = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    name.split('-')
        .next()
        .and_then(|p| p.parse().ok())
        .is_some_and(is_live_supervisor)
}
