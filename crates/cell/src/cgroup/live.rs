//! What is done to a running cell's cgroup from outside its supervisor: found again by
//! its supervisor's identity, paused and resumed (frozen and thawed), its limits lowered
//! (or raised back, never above the plan's: the caller decides that), its counters read.
//! The OCI runtime's `pause`, `resume`, `update` and `events --stats` use these; each is
//! one short-lived process, so nothing here keeps state.

use super::{is_cell_name, write_file, CellCgroup, CgroupLayout};
use crate::error::CellError;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// How long a pause waits for the kernel to report the whole cell frozen. A task in an
/// uninterruptible sleep (I/O on a slow device) delays it; past this the pause is
/// undone and refused rather than left half-applied.
const FREEZE_TIMEOUT: Duration = Duration::from_secs(2);

/// New values for some of a running cell's limits; `None` leaves one as it is.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LimitChanges {
    pub memory_bytes: Option<u64>,
    /// The payload's tasks: `pids.max` adds one for airlock's pid 1, as at creation.
    pub process_limit: Option<u32>,
    pub cpu_millis: Option<u32>,
}

/// A running cell's counters, in the units runc reports (bytes, nanoseconds). `None`:
/// the kernel does not count it here (v1 without `cpuacct` in the cpu hierarchy) or it
/// has no limit (`max`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CgroupStats {
    pub cpu_usage_ns: Option<u64>,
    pub cpu_user_ns: Option<u64>,
    pub cpu_kernel_ns: Option<u64>,
    pub cpu_periods: u64,
    pub cpu_throttled_periods: u64,
    pub cpu_throttled_ns: u64,
    pub memory_usage_bytes: u64,
    pub memory_peak_bytes: u64,
    pub memory_limit_bytes: Option<u64>,
    /// How often the memory limit was hit (v1 `memory.failcnt`, v2 `memory.events` max).
    pub memory_limit_hits: u64,
    /// Page cache charged to the cell (v1 `cache`, v2 `file` of `memory.stat`).
    pub memory_cache_bytes: u64,
    pub oom_kills: u64,
    /// Every task of the cell, airlock's pid 1 included (as `pids.max` counts it).
    pub pids_current: u64,
    pub pids_limit: Option<u64>,
}

impl CellCgroup {
    /// The cgroup of the cell whose supervisor is process `pid` started at `start_time`
    /// (cells are named `<pid>-<start time>-<nanoseconds>`, see [`super::cgroup_name`]);
    /// `None` when it has none (it ended, or its ceilings are rlimits only).
    pub fn of_supervisor(layout: &CgroupLayout, pid: u32, start_time: u64) -> Option<CellCgroup> {
        let parents = layout.parents();
        let prefix = format!("{pid}-{start_time}-");
        let name = fs::read_dir(parents.first()?)
            .ok()?
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .find(|n| n.starts_with(&prefix) && is_cell_name(n))?;
        let dirs: Vec<PathBuf> = parents.iter().map(|p| p.join(&name)).collect();
        dirs.iter().all(|d| d.is_dir()).then(|| CellCgroup {
            layout: layout.clone(),
            dirs,
            container: None,
        })
    }

    /// The cell of a container whose supervisor (process `pid` started at `start_time`)
    /// lives in its container cgroup (container.rs): the `cell` leaf of the supervisor's
    /// own cgroup in every hierarchy. `None` when the process is not that supervisor or
    /// has no such cell. Only limits, counters and the freezer are used through it: it
    /// is never destroyed (the supervisor does that).
    pub fn of_container_supervisor(
        layout: &CgroupLayout,
        pid: u32,
        start_time: u64,
    ) -> Option<CellCgroup> {
        let own = fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
        // Read after the cgroups: a pid reused since would show another start time.
        if crate::sys::process_stat(pid).ok()?.start_time != start_time {
            return None;
        }
        let containers: Vec<PathBuf> = layout
            .roots()
            .iter()
            .map(|root| root.join(super::own_cgroup_in(layout, root, &own)))
            .collect();
        let dirs: Vec<PathBuf> = containers
            .iter()
            .map(|c| c.join(super::CELL_LEAF))
            .collect();
        let at_roots = containers.iter().zip(layout.roots()).any(|(c, r)| *c == r);
        (!at_roots && dirs.iter().all(|d| d.is_dir())).then(|| CellCgroup {
            layout: layout.clone(),
            dirs,
            container: Some(Box::new(super::container::ContainerCgroup::found(
                containers,
            ))),
        })
    }

    /// Freezes every task of the cell and waits until the kernel says it is frozen; one
    /// that does not freeze in time is thawed again and the pause refused.
    pub fn pause(&self) -> Result<(), CellError> {
        let backend = self.layout.backend();
        backend.freeze(&self.dirs, true)?;
        let until = Instant::now() + FREEZE_TIMEOUT;
        while !backend.is_frozen(&self.dirs) {
            if Instant::now() >= until {
                let _ = backend.freeze(&self.dirs, false);
                return Err(CellError::Cgroup {
                    path: self.dirs.last().cloned().unwrap_or_default(),
                    source: std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        format!(
                            "the cell did not freeze within {} s; it was thawed again",
                            FREEZE_TIMEOUT.as_secs()
                        ),
                    ),
                });
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        Ok(())
    }

    pub fn resume(&self) -> Result<(), CellError> {
        self.layout.backend().freeze(&self.dirs, false)
    }

    pub fn is_paused(&self) -> bool {
        self.layout.backend().is_frozen(&self.dirs)
    }

    /// Writes new limits into the running cell's cgroup; in a container cgroup, there
    /// too, with the supervisor's allowance (container.rs).
    pub fn change_limits(&self, changes: &LimitChanges) -> Result<(), CellError> {
        let backend = self.layout.backend();
        let Some(container) = &self.container else {
            return backend.write_changes(&self.dirs, changes);
        };
        if let CgroupLayout::V1(_) = self.layout {
            backend.write_changes(&self.dirs, changes)?;
        }
        backend.write_changes(
            &container.dirs,
            &super::container::changes_with_supervisor(changes),
        )
    }

    /// The counters where the plan's limits are exact ([`CellCgroup::limit_dirs`]).
    pub fn stats(&self) -> CgroupStats {
        self.layout.backend().stats(self.limit_dirs())
    }
}

/// `value` written to `path`, unless it is `None`.
pub(super) fn write_some(path: &Path, value: Option<String>) -> Result<(), CellError> {
    match value {
        Some(value) => write_file(path, &value),
        None => Ok(()),
    }
}

/// A limit file's value: `None` for `max` (v2) or v1's "unlimited" (`PAGE_COUNTER_MAX`
/// pages: any value from 2^62 up), 0 when missing.
pub(super) fn limit(path: &Path) -> Option<u64> {
    let text = fs::read_to_string(path).unwrap_or_default();
    match text.trim() {
        "max" => None,
        number => match number.parse::<u64>() {
            Ok(n) if n >= 1 << 62 => None,
            Ok(n) => Some(n),
            Err(_) => Some(0),
        },
    }
}

/// A `*_usec` key of a v2 `cpu.stat`, in nanoseconds (runc's unit).
pub(super) fn keyed_usec(path: &Path, key: &str) -> u64 {
    super::keyed(path, key).saturating_mul(1000)
}

#[cfg(test)]
mod tests {
    use super::super::tests::{limits, read, touch, v1_fixture, v2_fixture};
    use super::*;

    #[test]
    fn a_cell_is_found_again_by_its_supervisors_pid_and_start_time_only() {
        for (root, layout) in [v2_fixture(), v1_fixture()] {
            let cgroup = CellCgroup::create(&layout, "4242-77-123", &limits()).unwrap();
            let found = CellCgroup::of_supervisor(&layout, 4242, 77).unwrap();
            assert_eq!(found.dirs, cgroup.dirs, "{}", layout.version());
            assert!(CellCgroup::of_supervisor(&layout, 4242, 78).is_none());
            assert!(CellCgroup::of_supervisor(&layout, 424, 77).is_none());
            // A delegated user subtree is no cell, whatever its name starts with.
            fs::create_dir_all(layout.parents()[0].join("4243-1-user")).unwrap();
            assert!(CellCgroup::of_supervisor(&layout, 4243, 1).is_none());
            drop(root);
        }
    }

    #[test]
    fn v2_pauses_through_cgroup_freeze_once_cgroup_events_says_frozen() {
        let (_root, layout) = v2_fixture();
        let cgroup = CellCgroup::create(&layout, "1-2-3", &limits()).unwrap();
        let dir = cgroup.dirs[0].clone();
        touch(&dir.join("cgroup.events"), "populated 1\nfrozen 1\n");
        cgroup.pause().unwrap();
        assert_eq!(read(&dir.join("cgroup.freeze")), "1");
        assert!(cgroup.is_paused());
        cgroup.resume().unwrap();
        assert_eq!(read(&dir.join("cgroup.freeze")), "0");
        touch(&dir.join("cgroup.events"), "populated 1\nfrozen 0\n");
        assert!(!cgroup.is_paused());
    }

    #[test]
    fn a_cell_that_does_not_freeze_in_time_is_thawed_and_the_pause_refused() {
        let (_root, layout) = v2_fixture();
        let cgroup = CellCgroup::create(&layout, "1-2-3", &limits()).unwrap();
        let dir = cgroup.dirs[0].clone();
        touch(&dir.join("cgroup.events"), "populated 1\nfrozen 0\n");
        let error = cgroup.pause().unwrap_err().to_string();
        assert!(error.contains("did not freeze"), "{error}");
        assert_eq!(read(&dir.join("cgroup.freeze")), "0", "thawed again");
    }

    #[test]
    fn v1_pauses_through_the_freezer_state() {
        let (_root, layout) = v1_fixture();
        let cgroup = CellCgroup::create(&layout, "1-2-3", &limits()).unwrap();
        let state = cgroup.dirs[3].join("freezer.state");
        // A fixture file keeps what is written: FROZEN reads back as the kernel's would.
        cgroup.pause().unwrap();
        assert_eq!(read(&state), "FROZEN");
        assert!(cgroup.is_paused());
        touch(&state, "FREEZING\n");
        assert!(!cgroup.is_paused(), "freezing is not frozen yet");
        cgroup.resume().unwrap();
        assert_eq!(read(&state), "THAWED");
        assert!(!cgroup.is_paused());
    }

    #[test]
    fn v2_writes_only_the_changed_limits() {
        let (_root, layout) = v2_fixture();
        let cgroup = CellCgroup::create(&layout, "1-2-3", &limits()).unwrap();
        let dir = cgroup.dirs[0].clone();
        cgroup
            .change_limits(&LimitChanges {
                memory_bytes: Some(64 << 20),
                process_limit: Some(9),
                cpu_millis: None,
            })
            .unwrap();
        assert_eq!(read(&dir.join("memory.max")), (64u64 << 20).to_string());
        assert_eq!(read(&dir.join("pids.max")), "10", "the payload's 9 + pid 1");
        assert_eq!(read(&dir.join("cpu.max")), "150000 100000", "unchanged");
        cgroup
            .change_limits(&LimitChanges {
                cpu_millis: Some(500),
                ..LimitChanges::default()
            })
            .unwrap();
        assert_eq!(read(&dir.join("cpu.max")), "50000 100000");
        assert_eq!(read(&dir.join("pids.max")), "10");
    }

    #[test]
    fn v1_orders_memory_and_memsw_so_the_kernel_accepts_both() {
        let (_root, layout) = v1_fixture();
        let cgroup = CellCgroup::create(&layout, "1-2-3", &limits()).unwrap();
        let (memory, pids, cpu) = (&cgroup.dirs[0], &cgroup.dirs[1], &cgroup.dirs[2]);
        let lower = LimitChanges {
            memory_bytes: Some(64 << 20),
            process_limit: Some(3),
            cpu_millis: Some(250),
        };
        assert_eq!(
            super::super::v1::memory_order(256 << 20, 64 << 20),
            ["memory.limit_in_bytes", "memory.memsw.limit_in_bytes"],
            "lowering: memory first (memsw may not go below it)"
        );
        assert_eq!(
            super::super::v1::memory_order(64 << 20, 256 << 20),
            ["memory.memsw.limit_in_bytes", "memory.limit_in_bytes"],
            "raising: memsw first"
        );
        cgroup.change_limits(&lower).unwrap();
        let bytes = (64u64 << 20).to_string();
        assert_eq!(read(&memory.join("memory.limit_in_bytes")), bytes);
        assert_eq!(read(&memory.join("memory.memsw.limit_in_bytes")), bytes);
        assert_eq!(read(&pids.join("pids.max")), "4");
        assert_eq!(read(&cpu.join("cpu.cfs_quota_us")), "25000");
    }

    #[test]
    fn v2_stats_are_read_in_runcs_units() {
        let (_root, layout) = v2_fixture();
        let cgroup = CellCgroup::create(&layout, "1-2-3", &limits()).unwrap();
        let dir = cgroup.dirs[0].clone();
        touch(
            &dir.join("cpu.stat"),
            "usage_usec 1500\nuser_usec 1000\nsystem_usec 500\nnr_periods 7\nnr_throttled 2\nthrottled_usec 30\n",
        );
        touch(&dir.join("memory.current"), "4096\n");
        touch(&dir.join("memory.peak"), "8192\n");
        touch(&dir.join("memory.stat"), "anon 100\nfile 2048\n");
        touch(
            &dir.join("memory.events"),
            "low 0\nhigh 0\nmax 5\noom 1\noom_kill 1\n",
        );
        touch(&dir.join("pids.current"), "3\n");
        let stats = cgroup.stats();
        assert_eq!(
            stats,
            CgroupStats {
                cpu_usage_ns: Some(1_500_000),
                cpu_user_ns: Some(1_000_000),
                cpu_kernel_ns: Some(500_000),
                cpu_periods: 7,
                cpu_throttled_periods: 2,
                cpu_throttled_ns: 30_000,
                memory_usage_bytes: 4096,
                memory_peak_bytes: 8192,
                memory_limit_bytes: Some(256 << 20),
                memory_limit_hits: 5,
                memory_cache_bytes: 2048,
                oom_kills: 1,
                pids_current: 3,
                pids_limit: Some(65),
            }
        );
        touch(&dir.join("memory.max"), "max\n");
        assert_eq!(cgroup.stats().memory_limit_bytes, None);
    }

    #[test]
    fn v1_stats_come_from_each_hierarchy_and_cpu_usage_only_with_cpuacct() {
        let (_root, layout) = v1_fixture();
        let cgroup = CellCgroup::create(&layout, "1-2-3", &limits()).unwrap();
        let (memory, pids, cpu) = (&cgroup.dirs[0], &cgroup.dirs[1], &cgroup.dirs[2]);
        touch(&memory.join("memory.usage_in_bytes"), "4096\n");
        touch(&memory.join("memory.max_usage_in_bytes"), "8192\n");
        touch(&memory.join("memory.failcnt"), "2\n");
        touch(&memory.join("memory.stat"), "cache 1024\nrss 3072\n");
        touch(
            &memory.join("memory.oom_control"),
            "oom_kill_disable 0\nunder_oom 0\noom_kill 1\n",
        );
        touch(&pids.join("pids.current"), "2\n");
        touch(
            &cpu.join("cpu.stat"),
            "nr_periods 4\nnr_throttled 1\nthrottled_time 900\n",
        );
        let stats = cgroup.stats();
        assert_eq!(stats.cpu_usage_ns, None, "no cpuacct.usage: not counted");
        assert_eq!(
            (stats.cpu_periods, stats.cpu_throttled_ns),
            (4, 900),
            "throttled_time is in ns already"
        );
        assert_eq!(stats.memory_usage_bytes, 4096);
        assert_eq!(stats.memory_peak_bytes, 8192);
        assert_eq!(stats.memory_limit_bytes, Some(256 << 20));
        assert_eq!(stats.memory_limit_hits, 2);
        assert_eq!(stats.memory_cache_bytes, 1024);
        assert_eq!(stats.oom_kills, 1);
        assert_eq!((stats.pids_current, stats.pids_limit), (2, Some(65)));
        // cpu and cpuacct mounted together (`cpu,cpuacct`): usage in ns.
        touch(&cpu.join("cpuacct.usage"), "123\n");
        touch(&cpu.join("cpuacct.usage_user"), "100\n");
        touch(&cpu.join("cpuacct.usage_sys"), "23\n");
        let stats = cgroup.stats();
        assert_eq!(
            (stats.cpu_usage_ns, stats.cpu_user_ns, stats.cpu_kernel_ns),
            (Some(123), Some(100), Some(23))
        );
        touch(
            &memory.join("memory.limit_in_bytes"),
            "9223372036854771712\n",
        );
        assert_eq!(cgroup.stats().memory_limit_bytes, None, "v1's unlimited");
    }
}
