//! The cells alive on this host, as `airlock doctor` shows them: found by their pid 1
//! (named [`crate::supervisor::PID1_NAME`]), whether parked (pid 1 has not started a
//! command: a warm cell, or a session between commands) or running, and who owns them
//! (the supervisor process, and the engine that owns the factory that forked it).

use std::path::Path;

/// One live cell.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveCell {
    /// pid 1 of the cell, as the host sees it.
    pub pid: u32,
    /// Its supervisor process.
    pub supervisor: u32,
    /// The process that owns the supervisor: the `airlock run` itself, or the engine
    /// whose cell factory forked it.
    pub owner: u32,
    /// pid 1 has no child: nothing of a payload runs.
    pub parked: bool,
}

/// Every cell on this host whose pid 1 this process can see.
pub fn live_cells() -> Vec<LiveCell> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let pids = entries
        .flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()));
    pids.filter(|pid| is_cell_pid1(*pid))
        .filter_map(|pid| {
            let supervisor = parent_of(pid)?;
            let parent = parent_of(supervisor)?;
            // A factory's supervisor belongs to the factory's own parent, the engine.
            let owner = if is_factory(parent) {
                parent_of(parent).unwrap_or(parent)
            } else {
                supervisor
            };
            Some(LiveCell {
                pid,
                supervisor,
                owner,
                parked: children_of(pid).is_empty(),
            })
        })
        .collect()
}

/// One line for people: how many cells, parked and running, by owner.
pub fn summary(cells: &[LiveCell]) -> String {
    if cells.is_empty() {
        return "no live cells".to_string();
    }
    let parked = cells.iter().filter(|c| c.parked).count();
    let mut owners: Vec<u32> = cells.iter().map(|c| c.owner).collect();
    owners.sort_unstable();
    owners.dedup();
    let owners: Vec<String> = owners.iter().map(u32::to_string).collect();
    format!(
        "{} live cell(s): {parked} parked or idle, {} running; owners (pid): {}",
        cells.len(),
        cells.len() - parked,
        owners.join(", ")
    )
}

fn is_cell_pid1(pid: u32) -> bool {
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
    comm.trim_end().as_bytes() == crate::supervisor::PID1_NAME.to_bytes() && !is_zombie(pid)
}

fn is_zombie(pid: u32) -> bool {
    stat_fields(pid).is_some_and(|f| f.first().is_some_and(|s| s == "Z"))
}

fn is_factory(pid: u32) -> bool {
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    cmdline
        .split(|b| *b == 0)
        .nth(1)
        .is_some_and(|arg| arg == FACTORY_ARG.as_bytes())
}

/// The argument that makes the airlock binary the engine's cell factory
/// (crates/engine/src/factory.rs).
pub const FACTORY_ARG: &str = "__airlock-cell-factory";

/// The fields of /proc/<pid>/stat after the command name: state, ppid, ...
fn stat_fields(pid: u32) -> Option<Vec<String>> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(") ")?;
    Some(rest.split_whitespace().map(str::to_string).collect())
}

fn parent_of(pid: u32) -> Option<u32> {
    stat_fields(pid)?.get(1)?.parse().ok()
}

fn children_of(pid: u32) -> Vec<u32> {
    let path = format!("/proc/{pid}/task/{pid}/children");
    if !Path::new(&path).exists() {
        return Vec::new();
    }
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|c| c.parse().ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cell(owner: u32, parked: bool) -> LiveCell {
        LiveCell {
            pid: 10,
            supervisor: 9,
            owner,
            parked,
        }
    }

    #[test]
    fn the_summary_counts_parked_and_running_cells_by_owner() {
        assert_eq!(summary(&[]), "no live cells");
        assert_eq!(
            summary(&[cell(7, true), cell(7, false), cell(3, true)]),
            "3 live cell(s): 2 parked or idle, 1 running; owners (pid): 3, 7"
        );
    }

    #[test]
    fn this_test_process_is_no_cell() {
        assert!(!is_cell_pid1(std::process::id()));
    }
}
