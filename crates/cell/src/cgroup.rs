//! Per-cell cgroups on v2 (unified) or v1 (per-controller hierarchies, as on hybrid hosts).
//! The supervisor creates the cgroup before the cell starts, places the cell's pid 1 in it
//! before releasing it, reads the ceilings' counters afterwards and removes it.

pub use crate::counters::CgroupUsage;
use crate::error::CellError;
use airlock_contract::Limits;
use std::fs;
use std::io::{self, ErrorKind};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const CGROUP_ROOT: &str = "/sys/fs/cgroup";
/// Name of the directory below each hierarchy root that holds airlock's cells.
const PARENT_NAME: &str = "airlock";
const CPU_PERIOD_US: u64 = 100_000;

/// Where the controllers a cell needs live on this host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CgroupLayout {
    /// Unified hierarchy with memory, pids and cpu controllers available.
    V2 { root: PathBuf },
    /// One hierarchy per controller.
    V1 {
        memory: PathBuf,
        pids: PathBuf,
        cpu: PathBuf,
        freezer: PathBuf,
    },
}

impl CgroupLayout {
    pub fn version(&self) -> &'static str {
        match self {
            CgroupLayout::V2 { .. } => "v2",
            CgroupLayout::V1 { .. } => "v1",
        }
    }

    /// Detects the layout; `AIRLOCK_CGROUP_ROOT` overrides the mount point (tests use it).
    pub fn detect() -> Result<CgroupLayout, CellError> {
        let root = std::env::var_os("AIRLOCK_CGROUP_ROOT")
            .map_or_else(|| PathBuf::from(CGROUP_ROOT), PathBuf::from);
        if let Ok(controllers) = fs::read_to_string(root.join("cgroup.controllers")) {
            let have: Vec<&str> = controllers.split_whitespace().collect();
            let missing: Vec<&str> = ["memory", "pids", "cpu"]
                .into_iter()
                .filter(|c| !have.contains(c))
                .collect();
            if missing.is_empty() {
                return Ok(CgroupLayout::V2 { root });
            }
            return Err(CellError::Unavailable {
                control: "cgroups",
                reason: format!(
                    "cgroup v2 at {} lacks the {} controller(s)",
                    root.display(),
                    missing.join(", ")
                ),
            });
        }
        let v1 = |name: &str| {
            let path = root.join(name);
            path.join("cgroup.procs").exists().then_some(path)
        };
        match (
            v1("memory"),
            v1("pids"),
            v1("cpu").or_else(|| v1("cpu,cpuacct")),
            v1("freezer"),
        ) {
            (Some(memory), Some(pids), Some(cpu), Some(freezer)) => {
                if !memory.join("memory.memsw.limit_in_bytes").exists() && swap_enabled() {
                    return Err(CellError::Unavailable {
                        control: "cgroups.memory",
                        reason: "swap is enabled but cgroup v1 swap accounting (memsw) is off: the memory limit could be escaped into swap; boot with swapaccount=1".into(),
                    });
                }
                Ok(CgroupLayout::V1 {
                    memory,
                    pids,
                    cpu,
                    freezer,
                })
            }
            (memory, pids, cpu, freezer) => {
                let missing: Vec<&str> = [
                    ("memory", memory),
                    ("pids", pids),
                    ("cpu", cpu),
                    ("freezer", freezer),
                ]
                .into_iter()
                .filter(|(_, p)| p.is_none())
                .map(|(n, _)| n)
                .collect();
                Err(CellError::Unavailable {
                    control: "cgroups",
                    reason: format!(
                        "neither a cgroup v2 hierarchy with memory+pids+cpu nor cgroup v1 controllers are mounted under {} (missing v1: {})",
                        root.display(),
                        missing.join(", ")
                    ),
                })
            }
        }
    }

    /// The version and where its controllers are mounted, for people.
    pub fn describe(&self) -> String {
        match self {
            CgroupLayout::V2 { root } => format!("v2 at {}", root.display()),
            CgroupLayout::V1 {
                memory,
                pids,
                cpu,
                freezer,
            } => format!(
                "v1: memory {}, pids {}, cpu {}, freezer {}",
                memory.display(),
                pids.display(),
                cpu.display(),
                freezer.display()
            ),
        }
    }

    fn parents(&self) -> Vec<PathBuf> {
        match self {
            CgroupLayout::V2 { root } => vec![root.join(PARENT_NAME)],
            CgroupLayout::V1 {
                memory,
                pids,
                cpu,
                freezer,
            } => [memory, pids, cpu, freezer]
                .iter()
                .map(|p| p.join(PARENT_NAME))
                .collect(),
        }
    }
}

fn swap_enabled() -> bool {
    fs::read_to_string("/proc/swaps")
        .map(|s| s.lines().count() > 1)
        .unwrap_or(false)
}

fn write_file(path: &Path, value: &str) -> Result<(), CellError> {
    fs::write(path, value).map_err(|source| CellError::Cgroup {
        path: path.to_path_buf(),
        source,
    })
}

/// The cgroup(s) of one cell.
#[derive(Debug)]
pub struct CellCgroup {
    layout: CgroupLayout,
    /// One directory (v2) or one per controller (v1: memory, pids, cpu, freezer).
    dirs: Vec<PathBuf>,
}

impl CellCgroup {
    /// Creates the cgroup and writes every limit. Any failure removes what was created.
    pub fn create(
        layout: &CgroupLayout,
        name: &str,
        limits: &Limits,
    ) -> Result<CellCgroup, CellError> {
        let dirs: Vec<PathBuf> = layout.parents().iter().map(|p| p.join(name)).collect();
        let cgroup = CellCgroup {
            layout: layout.clone(),
            dirs,
        };
        let mut created = Vec::new();
        for dir in &cgroup.dirs {
            if let Err(err) = fs::create_dir(dir) {
                if err.kind() != ErrorKind::NotFound {
                    cgroup.remove_dirs(&created);
                    return Err(CellError::Cgroup {
                        path: dir.clone(),
                        source: err,
                    });
                }
                let parent = dir.parent().expect("cell cgroup has a parent");
                if let Err(source) =
                    prepare_parent(layout, parent).and_then(|_| fs::create_dir(dir))
                {
                    cgroup.remove_dirs(&created);
                    return Err(CellError::Cgroup {
                        path: dir.clone(),
                        source,
                    });
                }
            }
            created.push(dir.clone());
        }
        if let Err(err) = cgroup.write_limits(limits) {
            cgroup.remove_dirs(&created);
            return Err(err);
        }
        Ok(cgroup)
    }

    fn write_limits(&self, limits: &Limits) -> Result<(), CellError> {
        let quota_us = u64::from(limits.cpu_millis) * CPU_PERIOD_US / 1000;
        match &self.layout {
            CgroupLayout::V2 { .. } => {
                let dir = &self.dirs[0];
                write_file(&dir.join("memory.max"), &limits.memory_bytes.to_string())?;
                // No swap: otherwise a cell could exceed its memory ceiling by swapping.
                write_file(&dir.join("memory.swap.max"), "0")?;
                // An OOM kills the whole cell, not one random process of it.
                write_file(&dir.join("memory.oom.group"), "1")?;
                write_file(&dir.join("pids.max"), &pids_max(limits))?;
                write_file(&dir.join("cpu.max"), &format!("{quota_us} {CPU_PERIOD_US}"))?;
            }
            CgroupLayout::V1 { .. } => {
                let [memory, pids, cpu, _freezer] = &self.dirs[..] else {
                    unreachable!("v1 has four dirs")
                };
                write_file(
                    &memory.join("memory.limit_in_bytes"),
                    &limits.memory_bytes.to_string(),
                )?;
                // memory+swap = memory: the cell cannot use swap at all. Without swap
                // accounting the file is missing; `detect` already refused hosts where
                // that leaves swap usable.
                match write_file(
                    &memory.join("memory.memsw.limit_in_bytes"),
                    &limits.memory_bytes.to_string(),
                ) {
                    Err(CellError::Cgroup { source, .. })
                        if source.kind() == ErrorKind::NotFound => {}
                    other => other?,
                }
                write_file(&pids.join("pids.max"), &pids_max(limits))?;
                // A new v1 cpu cgroup always starts with the kernel's fixed 100 ms period
                // (CPU_PERIOD_US), so only the quota is written.
                write_file(&cpu.join("cpu.cfs_quota_us"), &quota_us.to_string())?;
            }
        }
        Ok(())
    }

    /// Moves `pid` (the cell's pid 1, not yet released) into every hierarchy.
    pub fn add_process(&self, pid: libc::pid_t) -> Result<(), CellError> {
        let pid = pid.to_string();
        for dir in &self.dirs {
            write_file(&dir.join("cgroup.procs"), &pid)?;
        }
        Ok(())
    }

    fn procs_file(&self) -> PathBuf {
        // The freezer (v1) or the single directory (v2) holds every process of the cell.
        self.dirs
            .last()
            .expect("at least one dir")
            .join("cgroup.procs")
    }

    /// Where the cell sees its own cgroup: `(target in the cell, host directory)`. v2: the
    /// one directory at `/sys/fs/cgroup`; v1: the memory, pids and cpu directories under
    /// `/sys/fs/cgroup/<the host's hierarchy name>` (the freezer is airlock's, not a limit).
    pub fn view(&self) -> Vec<(PathBuf, PathBuf)> {
        let cell_root = Path::new("/sys/fs/cgroup");
        match &self.layout {
            CgroupLayout::V2 { .. } => vec![(cell_root.to_path_buf(), self.dirs[0].clone())],
            CgroupLayout::V1 {
                memory, pids, cpu, ..
            } => [memory, pids, cpu]
                .iter()
                .zip(&self.dirs)
                .filter_map(|(hierarchy, dir)| {
                    let name = hierarchy.file_name()?;
                    Some((cell_root.join(name), dir.clone()))
                })
                .collect(),
        }
    }

    pub fn pids(&self) -> Vec<libc::pid_t> {
        fs::read_to_string(self.procs_file())
            .map(|s| s.lines().filter_map(|l| l.trim().parse().ok()).collect())
            .unwrap_or_default()
    }

    pub fn signal_all(&self, signal: libc::c_int) {
        for pid in self.pids() {
            let _ = crate::sys::kill(pid, signal);
        }
    }

    /// Kills every process of the cell, including ones that fork while we kill.
    pub fn kill_all(&self) -> Result<(), CellError> {
        match &self.layout {
            CgroupLayout::V2 { .. } => write_file(&self.dirs[0].join("cgroup.kill"), "1"),
            CgroupLayout::V1 { .. } => self.frozen(|| self.signal_all(libc::SIGKILL)),
        }
    }

    /// Kills every process of the cell except `survivor` (its pid 1, which then reaps).
    pub fn kill_all_except(&self, survivor: libc::pid_t) -> Result<(), CellError> {
        self.frozen(|| {
            for pid in self.pids().into_iter().filter(|p| *p != survivor) {
                let _ = crate::sys::kill(pid, libc::SIGKILL);
            }
        })
    }

    /// Runs `f` with the cgroup frozen, so nothing can fork between listing and killing.
    /// Killed processes die when thawed (v1) or at once (v2: SIGKILL reaches frozen tasks).
    fn frozen(&self, f: impl FnOnce()) -> Result<(), CellError> {
        let (file, freeze, thaw) = match &self.layout {
            CgroupLayout::V2 { .. } => (self.dirs[0].join("cgroup.freeze"), "1", "0"),
            CgroupLayout::V1 { .. } => (self.dirs[3].join("freezer.state"), "FROZEN", "THAWED"),
        };
        write_file(&file, freeze)?;
        if let CgroupLayout::V2 { .. } = &self.layout {
            // v2 freezing completes asynchronously; cgroup.events says when.
            let events = self.dirs[0].join("cgroup.events");
            let until = Instant::now() + Duration::from_millis(100);
            while Instant::now() < until
                && !fs::read_to_string(&events).is_ok_and(|e| e.lines().any(|l| l == "frozen 1"))
            {
                std::thread::sleep(Duration::from_micros(200));
            }
        }
        f();
        write_file(&file, thaw)
    }

    /// Waits until no process is left in the cgroup, killing stragglers.
    pub fn wait_empty(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut pause = Duration::from_micros(50);
        loop {
            if self.pids().is_empty() {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            let _ = self.kill_all();
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(20));
        }
    }

    pub fn usage(&self) -> CgroupUsage {
        let read = |path: PathBuf| fs::read_to_string(path).unwrap_or_default();
        let number = |path: PathBuf| read(path).trim().parse::<u64>().unwrap_or(0);
        let keyed = |text: &str, key: &str| {
            text.lines()
                .find_map(|l| {
                    l.strip_prefix(key)
                        .and_then(|v| v.trim().parse::<u64>().ok())
                })
                .unwrap_or(0)
        };
        match &self.layout {
            CgroupLayout::V2 { .. } => {
                let dir = &self.dirs[0];
                CgroupUsage {
                    memory_peak_bytes: number(dir.join("memory.peak")),
                    oom_kills: keyed(&read(dir.join("memory.events")), "oom_kill "),
                    pids_limit_hits: keyed(&read(dir.join("pids.events")), "max "),
                    pids_peak: number(dir.join("pids.peak")),
                }
            }
            CgroupLayout::V1 { .. } => {
                let (memory, pids) = (&self.dirs[0], &self.dirs[1]);
                CgroupUsage {
                    memory_peak_bytes: number(memory.join("memory.max_usage_in_bytes")),
                    oom_kills: keyed(&read(memory.join("memory.oom_control")), "oom_kill "),
                    pids_limit_hits: keyed(&read(pids.join("pids.events")), "max "),
                    pids_peak: number(pids.join("pids.peak")),
                }
            }
        }
    }

    /// Removes the cgroup directories; returns those that could not be removed.
    pub fn destroy(self) -> Vec<PathBuf> {
        let mut left = Vec::new();
        for dir in &self.dirs {
            let mut attempts = 0;
            loop {
                match fs::remove_dir(dir) {
                    Ok(()) => break,
                    Err(e) if e.kind() == ErrorKind::NotFound => break,
                    // EBUSY while the last task is still being torn down by the kernel.
                    Err(_) if attempts < 200 => {
                        attempts += 1;
                        std::thread::sleep(Duration::from_millis(1));
                    }
                    Err(_) => {
                        left.push(dir.clone());
                        break;
                    }
                }
            }
        }
        left
    }

    fn remove_dirs(&self, dirs: &[PathBuf]) {
        for dir in dirs {
            let _ = fs::remove_dir(dir);
        }
    }
}

/// Creates airlock's parent cgroup; on v2 also enables the controllers for its children.
fn prepare_parent(layout: &CgroupLayout, parent: &Path) -> io::Result<()> {
    match fs::create_dir(parent) {
        Ok(()) => {}
        Err(e) if e.kind() == ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    if let CgroupLayout::V2 { root } = layout {
        fs::write(root.join("cgroup.subtree_control"), "+memory +pids +cpu")?;
        fs::write(parent.join("cgroup.subtree_control"), "+memory +pids +cpu")?;
    }
    Ok(())
}

/// A cell cgroup left behind by a supervisor that died (its name starts with the
/// supervisor's pid, which is no longer an airlock process).
#[derive(Debug, Clone, serde::Serialize)]
pub struct LeftoverCgroup {
    pub path: PathBuf,
    pub processes: usize,
}

/// Names cell cgroups `<supervisor pid>-<its start time>-<nanoseconds>`: a leftover is
/// recognised by its supervisor being gone, and the start time tells a live supervisor
/// from an unrelated process that reused its pid.
/// `started` is this process's start time ([`crate::sys::process_stat`]).
pub fn cgroup_name(started: u64) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("{}-{started}-{nanos}", std::process::id())
}

fn supervisor_alive(name: &str) -> bool {
    let mut parts = name.split('-');
    let (Some(pid), Some(started)) = (parts.next(), parts.next()) else {
        return false;
    };
    match (pid.parse::<u32>(), started.parse::<u64>()) {
        (Ok(pid), Ok(started)) => {
            crate::sys::process_stat(pid).is_ok_and(|stat| stat.start_time == started)
        }
        _ => false,
    }
}

/// Finds cell cgroups whose supervisor is gone.
pub fn find_leftovers(layout: &CgroupLayout) -> Vec<LeftoverCgroup> {
    let mut found = Vec::new();
    // A cell has a directory of the same name in every v1 hierarchy: ask about its
    // supervisor once.
    let mut alive: std::collections::HashMap<String, bool> = Default::default();
    for parent in layout.parents() {
        let Ok(entries) = fs::read_dir(&parent) else {
            continue;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            // d_type from the directory listing: no stat per control file.
            let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
            if is_dir
                && !*alive
                    .entry(name.clone())
                    .or_insert_with(|| supervisor_alive(&name))
            {
                let processes = fs::read_to_string(entry.path().join("cgroup.procs"))
                    .map(|s| s.lines().count())
                    .unwrap_or(0);
                found.push(LeftoverCgroup {
                    path: entry.path(),
                    processes,
                });
            }
        }
    }
    found
}

/// Kills and removes every leftover cell cgroup; returns what could not be removed.
/// A leftover may be incomplete (its supervisor died while creating it), so every
/// hierarchy's directory of that name is handled on its own.
pub fn reap_leftovers(layout: &CgroupLayout) -> Vec<PathBuf> {
    let names: std::collections::BTreeSet<std::ffi::OsString> = find_leftovers(layout)
        .into_iter()
        .filter_map(|l| l.path.file_name().map(|n| n.to_owned()))
        .collect();
    let mut left = Vec::new();
    for name in names {
        let cgroup = CellCgroup {
            layout: layout.clone(),
            dirs: layout.parents().iter().map(|p| p.join(&name)).collect(),
        };
        let members = || -> Vec<libc::pid_t> {
            cgroup
                .dirs
                .iter()
                .flat_map(|d| {
                    fs::read_to_string(d.join("cgroup.procs"))
                        .unwrap_or_default()
                        .lines()
                        .filter_map(|l| l.parse().ok())
                        .collect::<Vec<_>>()
                })
                .collect()
        };
        let deadline = Instant::now() + Duration::from_secs(2);
        loop {
            let pids = members();
            if pids.is_empty() || Instant::now() >= deadline {
                break;
            }
            for pid in pids {
                let _ = crate::sys::kill(pid, libc::SIGKILL);
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        left.extend(cgroup.destroy());
    }
    left
}

/// `pids.max` of a cell: the contract's `process_limit` counts the payload's processes
/// and threads; airlock's own pid 1 (the reaper) is added on top, so that a contract
/// that validates (`process_limit: 1`) can run. While the cell is set up, pid 1 and its
/// short-lived detach helper are the only tasks (two), and the helper is gone before
/// the payload starts, so the payload gets exactly `process_limit`.
pub(crate) fn cell_pids_max(limits: &Limits) -> u64 {
    u64::from(limits.process_limit) + 1
}

fn pids_max(limits: &Limits) -> String {
    cell_pids_max(limits).to_string()
}

#[cfg(test)]
mod tests {
    use super::{cgroup_name, supervisor_alive};

    #[test]
    fn names_identify_a_live_supervisor_by_pid_and_start_time() {
        let started = crate::sys::process_stat(std::process::id())
            .unwrap()
            .start_time;
        let name = cgroup_name(started);
        assert!(
            supervisor_alive(&name),
            "our own cgroup name must count as alive: {name}"
        );
        let pid = std::process::id();
        assert!(
            !supervisor_alive(&format!("{pid}-1-0")),
            "a reused pid has another start time"
        );
        assert!(!supervisor_alive("4194304000-1-0"), "no such pid");
        assert!(!supervisor_alive("not-a-cell"));
        assert!(!supervisor_alive("12345"));
    }
}
