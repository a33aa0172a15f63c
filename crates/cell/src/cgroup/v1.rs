//! cgroup v1: one directory per cell in each of the memory, pids, cpu and freezer
//! hierarchies (as on hybrid hosts).

use super::live::{limit, write_some, CgroupStats, LimitChanges};
use super::{keyed, number, pids_max, write_file, CgroupBackend, CgroupUsage, CPU_PERIOD_US};
use crate::error::CellError;
use airlock_contract::Limits;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};

/// The four hierarchies a cell needs; a cell's directories are in this order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct V1 {
    pub memory: PathBuf,
    pub pids: PathBuf,
    pub cpu: PathBuf,
    pub freezer: PathBuf,
    /// Where the cells go below each hierarchy's root (memory, pids, cpu, freezer):
    /// `airlock` for root, a subtree delegated to the user otherwise (see
    /// [`super::CgroupLayout::for_caller`]).
    pub cells_under: [PathBuf; 4],
}

impl V1 {
    pub fn hierarchies(&self) -> [&PathBuf; 4] {
        [&self.memory, &self.pids, &self.cpu, &self.freezer]
    }
}

impl CgroupBackend for V1 {
    fn version(&self) -> &'static str {
        "v1"
    }

    fn parents(&self) -> Vec<PathBuf> {
        self.hierarchies()
            .iter()
            .zip(&self.cells_under)
            .map(|(root, under)| root.join(under))
            .collect()
    }

    fn enable_controllers(&self, _parent: &Path) -> std::io::Result<()> {
        // Each v1 hierarchy has its one controller already.
        Ok(())
    }

    fn write_limits(&self, dirs: &[PathBuf], limits: &Limits) -> Result<(), CellError> {
        let [memory, pids, cpu, _freezer] = dirs else {
            unreachable!("v1 has four dirs")
        };
        let quota_us = u64::from(limits.cpu_millis) * CPU_PERIOD_US / 1000;
        write_file(
            &memory.join("memory.limit_in_bytes"),
            &limits.memory_bytes.to_string(),
        )?;
        // memory+swap = memory: the cell cannot use swap at all. Without swap accounting
        // the file is missing; `detect` already refused hosts where that leaves swap usable.
        match write_file(
            &memory.join("memory.memsw.limit_in_bytes"),
            &limits.memory_bytes.to_string(),
        ) {
            Err(CellError::Cgroup { source, .. }) if source.kind() == ErrorKind::NotFound => {}
            other => other?,
        }
        write_file(&pids.join("pids.max"), &pids_max(limits))?;
        // A new v1 cpu cgroup always starts with the kernel's fixed 100 ms period
        // (CPU_PERIOD_US), so only the quota is written.
        write_file(&cpu.join("cpu.cfs_quota_us"), &quota_us.to_string())
    }

    fn kill_all(&self, dirs: &[PathBuf], signal_members: &dyn Fn()) -> Result<(), CellError> {
        // No cgroup.kill in v1: freeze, so nothing forks between listing and killing;
        // the killed die when thawed.
        self.freeze(dirs, true)?;
        signal_members();
        self.freeze(dirs, false)
    }

    fn freeze(&self, dirs: &[PathBuf], frozen: bool) -> Result<(), CellError> {
        let state = if frozen { "FROZEN" } else { "THAWED" };
        write_file(&dirs[3].join("freezer.state"), state)
    }

    fn usage(&self, dirs: &[PathBuf]) -> CgroupUsage {
        let (memory, pids) = (&dirs[0], &dirs[1]);
        CgroupUsage {
            memory_peak_bytes: number(&memory.join("memory.max_usage_in_bytes")),
            oom_kills: keyed(&memory.join("memory.oom_control"), "oom_kill "),
            pids_limit_hits: keyed(&pids.join("pids.events"), "max "),
            pids_peak: number(&pids.join("pids.peak")),
        }
    }

    fn is_frozen(&self, dirs: &[PathBuf]) -> bool {
        std::fs::read_to_string(dirs[3].join("freezer.state")).is_ok_and(|s| s.trim() == "FROZEN")
    }

    fn write_changes(&self, dirs: &[PathBuf], changes: &LimitChanges) -> Result<(), CellError> {
        let [memory, pids, cpu, _freezer] = dirs else {
            unreachable!("v1 has four dirs")
        };
        if let Some(bytes) = changes.memory_bytes {
            let now = limit(&memory.join("memory.limit_in_bytes")).unwrap_or(u64::MAX);
            for file in memory_order(now, bytes) {
                match write_file(&memory.join(file), &bytes.to_string()) {
                    // No swap accounting: see write_limits.
                    Err(CellError::Cgroup { source, .. })
                        if source.kind() == ErrorKind::NotFound && file.contains("memsw") => {}
                    other => other?,
                }
            }
        }
        write_some(
            &pids.join("pids.max"),
            changes
                .process_limit
                .map(|p| (u64::from(p) + 1).to_string()),
        )?;
        write_some(
            &cpu.join("cpu.cfs_quota_us"),
            changes
                .cpu_millis
                .map(|m| (u64::from(m) * CPU_PERIOD_US / 1000).to_string()),
        )
    }

    fn stats(&self, dirs: &[PathBuf]) -> CgroupStats {
        let (memory, pids, cpu) = (&dirs[0], &dirs[1], &dirs[2]);
        // CPU time is cpuacct's, counted only where it shares the cpu hierarchy.
        let acct = |file: &str| {
            let path = cpu.join(file);
            path.exists().then(|| number(&path))
        };
        let cpu_stat = cpu.join("cpu.stat");
        CgroupStats {
            cpu_usage_ns: acct("cpuacct.usage"),
            cpu_user_ns: acct("cpuacct.usage_user"),
            cpu_kernel_ns: acct("cpuacct.usage_sys"),
            cpu_periods: keyed(&cpu_stat, "nr_periods "),
            cpu_throttled_periods: keyed(&cpu_stat, "nr_throttled "),
            cpu_throttled_ns: keyed(&cpu_stat, "throttled_time "),
            memory_usage_bytes: number(&memory.join("memory.usage_in_bytes")),
            memory_peak_bytes: number(&memory.join("memory.max_usage_in_bytes")),
            memory_limit_bytes: limit(&memory.join("memory.limit_in_bytes")),
            memory_limit_hits: number(&memory.join("memory.failcnt")),
            memory_cache_bytes: keyed(&memory.join("memory.stat"), "cache "),
            oom_kills: keyed(&memory.join("memory.oom_control"), "oom_kill "),
            pids_current: number(&pids.join("pids.current")),
            pids_limit: limit(&pids.join("pids.max")),
        }
    }

    /// The memory, pids and cpu directories under `/sys/fs/cgroup/<the host's hierarchy
    /// name>` (the freezer is airlock's, not a limit).
    fn view(&self, dirs: &[PathBuf]) -> Vec<(PathBuf, PathBuf)> {
        [&self.memory, &self.pids, &self.cpu]
            .iter()
            .zip(dirs)
            .filter_map(|(hierarchy, dir)| {
                let name = hierarchy.file_name()?;
                Some((Path::new(super::CELL_VIEW).join(name), dir.clone()))
            })
            .collect()
    }

    fn describe(&self) -> String {
        format!(
            "v1: memory {}, pids {}, cpu {}, freezer {}",
            self.memory.display(),
            self.pids.display(),
            self.cpu.display(),
            self.freezer.display()
        )
    }
}

/// The order of the two memory files when the limit goes from `now` to `new`: the kernel
/// refuses a memory limit above memory+swap's, so lowering writes memory first and
/// raising memory+swap first.
pub(super) fn memory_order(now: u64, new: u64) -> [&'static str; 2] {
    const MEMORY: &str = "memory.limit_in_bytes";
    const MEMSW: &str = "memory.memsw.limit_in_bytes";
    if new <= now {
        [MEMORY, MEMSW]
    } else {
        [MEMSW, MEMORY]
    }
}
