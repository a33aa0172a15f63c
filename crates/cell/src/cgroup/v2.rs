//! cgroup v2: one directory per cell in the unified hierarchy.

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
    /// Where the cells go below the root: `airlock` (root only: see
    /// [`super::CgroupLayout::for_caller`]).
    pub cells_under: PathBuf,
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

    fn view(&self, dirs: &[PathBuf]) -> Vec<(PathBuf, PathBuf)> {
        vec![(PathBuf::from(super::CELL_VIEW), dirs[0].clone())]
    }

    fn describe(&self) -> String {
        format!("v2 at {}", self.root.display())
    }
}
