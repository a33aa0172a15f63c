//! What holds a cell's ceilings while it lives, and how its processes are found, killed
//! and counted: its own cgroup (the rule), or, where no cgroup is delegated to the caller
//! and the operator's class allows it (`CellPlan::without_cgroup`), rlimits only. Then
//! the cell's processes are those of its pid namespace, which the kernel empties when its
//! pid 1 dies (no process can leave a pid namespace: `setns` and the namespace flags are
//! denied by the cell's seccomp filter), and no usage is counted.

use crate::cgroup::{CellCgroup, CgroupUsage};
use crate::error::CellError;
use std::path::PathBuf;
use std::time::{Duration, Instant};

pub enum CellCeilings {
    Cgroup(CellCgroup),
    Rlimits(PidNamespace),
}

/// A cell's pid namespace, named as `/proc/<pid>/ns/pid` reads (`pid:[inode]`).
pub struct PidNamespace {
    name: PathBuf,
}

impl PidNamespace {
    /// The namespace of the cell whose pid 1 is `pid1`. Read right after the clone: pid 1
    /// is still dumpable, so its owner may read the link.
    pub fn of(pid1: libc::pid_t) -> Result<PidNamespace, CellError> {
        let link = format!("/proc/{pid1}/ns/pid");
        std::fs::read_link(&link)
            .map(|name| PidNamespace { name })
            .map_err(|e| CellError::io(link, e))
    }

    /// Every process of the namespace that this process may inspect: every payload
    /// process (they run as the caller's uid, in a user namespace the caller owns), but
    /// not the non-dumpable pid 1, which the supervisor knows by its pidfd.
    fn members(&self) -> Vec<libc::pid_t> {
        let Ok(entries) = std::fs::read_dir("/proc") else {
            return Vec::new();
        };
        entries
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<libc::pid_t>().ok())
            .filter(|pid| {
                std::fs::read_link(format!("/proc/{pid}/ns/pid")).is_ok_and(|n| n == self.name)
            })
            .collect()
    }
}

impl CellCeilings {
    pub fn add_process(&self, pid: libc::pid_t) -> Result<(), CellError> {
        match self {
            CellCeilings::Cgroup(cgroup) => cgroup.add_process(pid),
            // Born in its pid namespace: nothing to join.
            CellCeilings::Rlimits(_) => Ok(()),
        }
    }

    /// `(target in the cell, host directory)` of the cell's view of its limits: none
    /// without a cgroup.
    pub fn view(&self) -> Vec<(PathBuf, PathBuf)> {
        match self {
            CellCeilings::Cgroup(cgroup) => cgroup.view(),
            CellCeilings::Rlimits(_) => Vec::new(),
        }
    }

    pub fn pids(&self) -> Vec<libc::pid_t> {
        match self {
            CellCeilings::Cgroup(cgroup) => cgroup.pids(),
            CellCeilings::Rlimits(ns) => ns.members(),
        }
    }

    pub fn signal_all(&self, signal: libc::c_int) {
        match self {
            CellCeilings::Cgroup(cgroup) => cgroup.signal_all(signal),
            CellCeilings::Rlimits(ns) => {
                for pid in ns.members() {
                    let _ = crate::sys::kill(pid, signal);
                }
            }
        }
    }

    /// Kills every process of the cell (pid 1 by its pidfd is the caller's: its death
    /// takes the namespace).
    pub fn kill_all(&self) -> Result<(), CellError> {
        match self {
            CellCeilings::Cgroup(cgroup) => cgroup.kill_all(),
            CellCeilings::Rlimits(_) => {
                self.signal_all(libc::SIGKILL);
                Ok(())
            }
        }
    }

    /// Kills every process but `survivor`. Without a freezer a process may fork between
    /// the listing and the kill: listed and killed again, a few rounds; pid 1's death
    /// (the next step of a deadline) takes any that are left.
    pub fn kill_all_except(&self, survivor: libc::pid_t) -> Result<(), CellError> {
        match self {
            CellCeilings::Cgroup(cgroup) => cgroup.kill_all_except(survivor),
            CellCeilings::Rlimits(ns) => {
                for _ in 0..4 {
                    let others: Vec<libc::pid_t> = ns
                        .members()
                        .into_iter()
                        .filter(|p| *p != survivor)
                        .collect();
                    if others.is_empty() {
                        break;
                    }
                    for pid in others {
                        let _ = crate::sys::kill(pid, libc::SIGKILL);
                    }
                }
                Ok(())
            }
        }
    }

    /// Waits until no process of the cell is left, killing stragglers.
    pub fn wait_empty(&self, timeout: Duration) -> bool {
        match self {
            CellCeilings::Cgroup(cgroup) => cgroup.wait_empty(timeout),
            CellCeilings::Rlimits(_) => {
                let deadline = Instant::now() + timeout;
                loop {
                    if self.pids().is_empty() {
                        return true;
                    }
                    if Instant::now() >= deadline {
                        return false;
                    }
                    self.signal_all(libc::SIGKILL);
                    std::thread::sleep(Duration::from_millis(5));
                }
            }
        }
    }

    /// See [`CellCgroup::fix_container_pids`].
    pub fn fix_container_pids(&self, cell_pids_max: u64) -> Result<(), CellError> {
        match self {
            CellCeilings::Cgroup(cgroup) => cgroup.fix_container_pids(cell_pids_max),
            CellCeilings::Rlimits(_) => Ok(()),
        }
    }

    /// The cgroup's counters; none without one.
    pub fn usage(&self) -> CgroupUsage {
        match self {
            CellCeilings::Cgroup(cgroup) => cgroup.usage(),
            CellCeilings::Rlimits(_) => CgroupUsage::default(),
        }
    }

    /// Removes the cgroup; returns what could not be removed.
    pub fn destroy(self) -> Vec<PathBuf> {
        match self {
            CellCeilings::Cgroup(cgroup) => cgroup.destroy(),
            CellCeilings::Rlimits(_) => Vec::new(),
        }
    }
}
