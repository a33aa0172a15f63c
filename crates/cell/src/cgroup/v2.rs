//! cgroup v2: one directory per cell in the unified hierarchy.

use super::live::{keyed_usec, limit, write_some, CgroupStats, LimitChanges};
use super::{keyed, number, pids_max, write_file, CgroupBackend, CgroupUsage, CPU_PERIOD_US};
use crate::error::CellError;
use airlock_contract::Limits;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The unified hierarchy mounted at `root`, with memory, pids and cpu available.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct V2 {
    pub root: PathBuf,
    /// Where the cells go below the root: `airlock` for root, the cgroup delegated to
    /// the user otherwise (see [`super::CgroupLayout::for_caller`]).
    pub cells_under: PathBuf,
    /// In a cgroup delegated to a user: the leaf below `cells_under` that the processes
    /// living in it move into ([`super::SUPERVISOR_LEAF`]); `None` for root.
    pub supervisor_leaf: Option<PathBuf>,
}

impl V2 {
    /// Readies a user's delegated cgroup for cells: every process in it (this one among
    /// them) moves into the supervisor leaf, then memory, pids and cpu are enabled for
    /// its children. Nothing to do for root, or when an earlier run did it (the
    /// controllers are enabled, so the cgroup holds no process). A process forked into
    /// the cgroup meanwhile makes the kernel refuse the controllers (EBUSY): moved too, a
    /// few times, then refused.
    pub fn settle_delegation(&self) -> Result<(), CellError> {
        let Some(leaf) = &self.supervisor_leaf else {
            return Ok(());
        };
        let dir = self.root.join(&self.cells_under);
        let control = dir.join("cgroup.subtree_control");
        if has_cell_controllers(&fs::read_to_string(&control).unwrap_or_default()) {
            return Ok(());
        }
        let leaf = dir.join(leaf);
        match fs::create_dir(&leaf) {
            Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => {
                return Err(CellError::Cgroup {
                    path: leaf,
                    source: e,
                })
            }
            _ => {}
        }
        let mut last = None;
        for _ in 0..8 {
            for pid in fs::read_to_string(dir.join("cgroup.procs"))
                .unwrap_or_default()
                .lines()
            {
                // A process that exited meanwhile (ESRCH) needs no move.
                let _ = fs::write(leaf.join("cgroup.procs"), pid);
            }
            match fs::write(&control, "+memory +pids +cpu") {
                Ok(()) => return Ok(()),
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) => last = Some(e),
                Err(e) => {
                    return Err(CellError::Cgroup {
                        path: control,
                        source: e,
                    })
                }
            }
        }
        Err(CellError::Cgroup {
            path: control,
            source: last.unwrap_or_else(|| std::io::Error::from_raw_os_error(libc::EBUSY)),
        })
    }
}

/// Whether a `cgroup.subtree_control` text enables every controller a cell needs.
fn has_cell_controllers(subtree_control: &str) -> bool {
    super::CELL_CONTROLLERS
        .iter()
        .all(|c| subtree_control.split_whitespace().any(|on| on == *c))
}

impl CgroupBackend for V2 {
    fn version(&self) -> &'static str {
        "v2"
    }

    fn parents(&self) -> Vec<PathBuf> {
        vec![self.root.join(&self.cells_under)]
    }

    fn enable_controllers(&self, parent: &Path) -> std::io::Result<()> {
        fs::write(
            self.root.join("cgroup.subtree_control"),
            "+memory +pids +cpu",
        )?;
        fs::write(parent.join("cgroup.subtree_control"), "+memory +pids +cpu")
    }

    fn write_limits(&self, dirs: &[PathBuf], limits: &Limits) -> Result<(), CellError> {
        let dir = &dirs[0];
        let quota_us = u64::from(limits.cpu_millis) * CPU_PERIOD_US / 1000;
        write_file(&dir.join("memory.max"), &limits.memory_bytes.to_string())?;
        // No swap: otherwise a cell could exceed its memory ceiling by swapping.
        write_file(&dir.join("memory.swap.max"), "0")?;
        // An OOM kills the whole cell, not one random process of it.
        write_file(&dir.join("memory.oom.group"), "1")?;
        write_file(&dir.join("pids.max"), &pids_max(limits))?;
        write_file(&dir.join("cpu.max"), &format!("{quota_us} {CPU_PERIOD_US}"))
    }

    fn kill_all(&self, dirs: &[PathBuf], _signal_members: &dyn Fn()) -> Result<(), CellError> {
        // cgroup.kill reaches every task, including ones forking meanwhile.
        write_file(&dirs[0].join("cgroup.kill"), "1")
    }

    fn freeze(&self, dirs: &[PathBuf], frozen: bool) -> Result<(), CellError> {
        write_file(
            &dirs[0].join("cgroup.freeze"),
            if frozen { "1" } else { "0" },
        )?;
        if frozen {
            // v2 freezing completes asynchronously; cgroup.events says when.
            let events = dirs[0].join("cgroup.events");
            let until = Instant::now() + Duration::from_millis(100);
            while Instant::now() < until
                && !fs::read_to_string(&events).is_ok_and(|e| e.lines().any(|l| l == "frozen 1"))
            {
                std::thread::sleep(Duration::from_micros(200));
            }
        }
        Ok(())
    }

    fn usage(&self, dirs: &[PathBuf]) -> CgroupUsage {
        let dir = &dirs[0];
        CgroupUsage {
            memory_peak_bytes: number(&dir.join("memory.peak")),
            oom_kills: keyed(&dir.join("memory.events"), "oom_kill "),
            pids_limit_hits: keyed(&dir.join("pids.events"), "max "),
            pids_peak: number(&dir.join("pids.peak")),
        }
    }

    fn is_frozen(&self, dirs: &[PathBuf]) -> bool {
        fs::read_to_string(dirs[0].join("cgroup.events"))
            .is_ok_and(|e| e.lines().any(|l| l == "frozen 1"))
    }

    fn write_changes(&self, dirs: &[PathBuf], changes: &LimitChanges) -> Result<(), CellError> {
        let dir = &dirs[0];
        write_some(
            &dir.join("memory.max"),
            changes.memory_bytes.map(|b| b.to_string()),
        )?;
        write_some(
            &dir.join("pids.max"),
            changes
                .process_limit
                .map(|p| (u64::from(p) + 1).to_string()),
        )?;
        let quota = |millis: u32| u64::from(millis) * CPU_PERIOD_US / 1000;
        write_some(
            &dir.join("cpu.max"),
            changes
                .cpu_millis
                .map(|m| format!("{} {CPU_PERIOD_US}", quota(m))),
        )
    }

    fn stats(&self, dirs: &[PathBuf]) -> CgroupStats {
        let dir = &dirs[0];
        let cpu = dir.join("cpu.stat");
        CgroupStats {
            cpu_usage_ns: Some(keyed_usec(&cpu, "usage_usec ")),
            cpu_user_ns: Some(keyed_usec(&cpu, "user_usec ")),
            cpu_kernel_ns: Some(keyed_usec(&cpu, "system_usec ")),
            cpu_periods: keyed(&cpu, "nr_periods "),
            cpu_throttled_periods: keyed(&cpu, "nr_throttled "),
            cpu_throttled_ns: keyed_usec(&cpu, "throttled_usec "),
            memory_usage_bytes: number(&dir.join("memory.current")),
            memory_peak_bytes: number(&dir.join("memory.peak")),
            memory_limit_bytes: limit(&dir.join("memory.max")),
            memory_limit_hits: keyed(&dir.join("memory.events"), "max "),
            memory_cache_bytes: keyed(&dir.join("memory.stat"), "file "),
            oom_kills: keyed(&dir.join("memory.events"), "oom_kill "),
            pids_current: number(&dir.join("pids.current")),
            pids_limit: limit(&dir.join("pids.max")),
        }
    }

    fn view(&self, dirs: &[PathBuf]) -> Vec<(PathBuf, PathBuf)> {
        vec![(PathBuf::from(super::CELL_VIEW), dirs[0].clone())]
    }

    fn describe(&self) -> String {
        match &self.supervisor_leaf {
            None => format!("v2 at {}", self.root.display()),
            Some(leaf) => {
                let dir = self.root.join(&self.cells_under);
                format!(
                    "v2 at {}, delegated: cells under {} (this process in its leaf {})",
                    self.root.display(),
                    dir.display(),
                    dir.join(leaf).display()
                )
            }
        }
    }
}
