//! Per-cell cgroups on v2 (unified) or v1 (per-controller hierarchies, as on hybrid hosts),
//! each behind [`CgroupBackend`] with its mount point injectable, so both are tested
//! against fixture trees. The supervisor creates the cgroup before the cell starts, places
//! the cell's pid 1 in it before releasing it, reads the ceilings' counters afterwards and
//! removes it.

mod container;
mod live;
mod v1;
mod v2;

pub use crate::counters::CgroupUsage;
use crate::error::CellError;
use airlock_contract::Limits;
pub use container::{remove_abandoned, ContainerCgroupPath, CELL_LEAF, SUPERVISOR_TASKS};
pub use live::{CgroupStats, LimitChanges};
use std::fs;
use std::io::{self, ErrorKind};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
pub use v1::V1;
pub use v2::V2;

pub(crate) const CGROUP_ROOT: &str = "/sys/fs/cgroup";
/// Name of the directory below each hierarchy root that holds airlock's cells.
const PARENT_NAME: &str = "airlock";
const CPU_PERIOD_US: u64 = 100_000;
/// Where the cell sees its own cgroup.
const CELL_VIEW: &str = "/sys/fs/cgroup";

/// What differs between cgroup v1 and v2 for one cell, whose directories (`dirs`: one on
/// v2, memory/pids/cpu/freezer on v1) are below [`CgroupBackend::parents`].
pub trait CgroupBackend {
    fn version(&self) -> &'static str;
    /// airlock's parent directory in each hierarchy, in the order of a cell's `dirs`.
    fn parents(&self) -> Vec<PathBuf>;
    /// Makes a freshly created parent able to hold limited cells.
    fn enable_controllers(&self, parent: &Path) -> io::Result<()>;
    fn write_limits(&self, dirs: &[PathBuf], limits: &Limits) -> Result<(), CellError>;
    /// Kills every process of the cell, including ones that fork meanwhile;
    /// `signal_members` sends SIGKILL to each listed member (v1 has no `cgroup.kill`).
    fn kill_all(&self, dirs: &[PathBuf], signal_members: &dyn Fn()) -> Result<(), CellError>;
    /// Freezes (and waits until frozen) or thaws the cell.
    fn freeze(&self, dirs: &[PathBuf], frozen: bool) -> Result<(), CellError>;
    fn usage(&self, dirs: &[PathBuf]) -> CgroupUsage;
    /// Whether the kernel reports the whole cell frozen (a freeze still under way is not).
    fn is_frozen(&self, dirs: &[PathBuf]) -> bool;
    /// Writes the limits `changes` sets into a running cell's cgroup.
    fn write_changes(&self, dirs: &[PathBuf], changes: &LimitChanges) -> Result<(), CellError>;
    /// The cell's counters now.
    fn stats(&self, dirs: &[PathBuf]) -> CgroupStats;
    /// `(target in the cell, host directory)` of the cell's read-only view of its limits.
    fn view(&self, dirs: &[PathBuf]) -> Vec<(PathBuf, PathBuf)>;
    /// The version and where its controllers are mounted, for people.
    fn describe(&self) -> String;
}

/// Where the controllers a cell needs live on this host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CgroupLayout {
    /// Unified hierarchy with memory, pids and cpu controllers available.
    V2(V2),
    /// One hierarchy per controller.
    V1(V1),
}

impl CgroupLayout {
    pub fn backend(&self) -> &dyn CgroupBackend {
        match self {
            CgroupLayout::V2(v2) => v2,
            CgroupLayout::V1(v1) => v1,
        }
    }

    pub fn version(&self) -> &'static str {
        self.backend().version()
    }

    pub fn describe(&self) -> String {
        self.backend().describe()
    }

    fn parents(&self) -> Vec<PathBuf> {
        self.backend().parents()
    }

    /// Each hierarchy's root, in the order of a cell's `dirs`.
    pub(crate) fn roots(&self) -> Vec<PathBuf> {
        match self {
            CgroupLayout::V2(v2) => vec![v2.root.clone()],
            CgroupLayout::V1(v1) => v1.hierarchies().into_iter().cloned().collect(),
        }
    }

    /// Detects the layout and where this process may create cells in it (see
    /// [`CgroupLayout::for_caller`]), and readies a user's delegated v2 cgroup for cells
    /// ([`V2::settle_delegation`]: this process moves into its leaf). `AIRLOCK_CGROUP_ROOT`
    /// overrides the mount point (tests use it).
    pub fn detect() -> Result<CgroupLayout, CellError> {
        let root = std::env::var_os("AIRLOCK_CGROUP_ROOT")
            .map_or_else(|| PathBuf::from(CGROUP_ROOT), PathBuf::from);
        let uid = crate::sys::geteuid();
        // Root's cells go under `airlock/`: its own cgroups are never read (cell start).
        let own = match uid {
            0 => String::new(),
            _ => fs::read_to_string("/proc/self/cgroup").unwrap_or_default(),
        };
        let layout = CgroupLayout::detect_at(&root, swap_enabled())?.for_caller(
            uid,
            &own,
            &crate::sys::writable_by_caller,
        )?;
        if let CgroupLayout::V2(v2) = &layout {
            v2.settle_delegation()?;
        }
        Ok(layout)
    }

    /// Where `uid`'s cells go. Root creates them under `airlock` in each hierarchy.
    /// Anyone else needs a subtree delegated to them (its directory and `cgroup.procs`
    /// writable: `writable`). On v1, in every hierarchy: `airlock/user-<uid>` (an
    /// operator's `mkdir` + `chown`, or libcgroup's `cgcreate -a -t`), else the process's
    /// own cgroup from `own_cgroups` (the text of `/proc/self/cgroup`) when it was
    /// delegated. On v2 only the process's own cgroup can be (see [`v2_delegated`]).
    /// Without one the cell cannot hold its ceilings: refused, naming the fix.
    pub fn for_caller(
        self,
        uid: u32,
        own_cgroups: &str,
        writable: &dyn Fn(&Path) -> bool,
    ) -> Result<CgroupLayout, CellError> {
        if uid == 0 {
            return Ok(self);
        }
        match self {
            CgroupLayout::V1(v1) => {
                v1_delegated(v1, uid, own_cgroups, writable).map(CgroupLayout::V1)
            }
            CgroupLayout::V2(v2) => {
                v2_delegated(v2, uid, own_cgroups, writable).map(CgroupLayout::V2)
            }
        }
    }

    /// The layout of the cgroup tree mounted at `root`, on a host with or without swap.
    pub fn detect_at(root: &Path, swap_enabled: bool) -> Result<CgroupLayout, CellError> {
        if let Ok(controllers) = fs::read_to_string(root.join("cgroup.controllers")) {
            let have: Vec<&str> = controllers.split_whitespace().collect();
            let missing: Vec<&str> = ["memory", "pids", "cpu"]
                .into_iter()
                .filter(|c| !have.contains(c))
                .collect();
            if missing.is_empty() {
                return Ok(CgroupLayout::V2(V2 {
                    root: root.to_path_buf(),
                    cells_under: PathBuf::from(PARENT_NAME),
                    supervisor_leaf: None,
                }));
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
                if !memory.join("memory.memsw.limit_in_bytes").exists() && swap_enabled {
                    return Err(CellError::Unavailable {
                        control: "cgroups.memory",
                        reason: "swap is enabled but cgroup v1 swap accounting (memsw) is off: the memory limit could be escaped into swap; boot with swapaccount=1".into(),
                    });
                }
                Ok(CgroupLayout::V1(V1 {
                    memory,
                    pids,
                    cpu,
                    freezer,
                    cells_under: std::array::from_fn(|_| PathBuf::from(PARENT_NAME)),
                }))
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
}

/// The user's subtree in each v1 hierarchy, or the refusal naming the hierarchies without
/// one and the commands that would delegate them.
fn v1_delegated(
    v1: V1,
    uid: u32,
    own_cgroups: &str,
    writable: &dyn Fn(&Path) -> bool,
) -> Result<V1, CellError> {
    let conventional = Path::new(PARENT_NAME).join(format!("user-{uid}"));
    let usable = |root: &Path, under: &Path| {
        let dir = root.join(under);
        dir.is_dir() && writable(&dir) && writable(&dir.join("cgroup.procs"))
    };
    let mut found: Vec<Option<PathBuf>> = Vec::new();
    for root in v1.hierarchies() {
        let controller = hierarchy_controller(root);
        let own = own_cgroup(own_cgroups, controller);
        let choice = [Some(conventional.clone()), own]
            .into_iter()
            .flatten()
            .find(|under| usable(root, under));
        found.push(choice);
    }
    let missing: Vec<&str> = v1
        .hierarchies()
        .iter()
        .zip(&found)
        .filter(|(_, f)| f.is_none())
        .map(|(root, _)| hierarchy_controller(root))
        .collect();
    if !missing.is_empty() {
        return Err(CellError::Unavailable {
            control: "cgroups.delegation",
            reason: format!(
                "no cgroup subtree is delegated to uid {uid} in the {} hierarchy(ies) (looked for a writable {} and the process's own cgroups); to delegate one, as root: {}",
                missing.join(", "),
                conventional.display(),
                delegation_command(&v1, uid),
            ),
        });
    }
    let cells_under: Vec<PathBuf> = found.into_iter().flatten().collect();
    Ok(V1 {
        cells_under: cells_under.try_into().expect("four hierarchies"),
        ..v1
    })
}

/// Where a user's processes go inside their delegated v2 cgroup: the kernel lets a
/// cgroup hand controllers to its children only while it holds no process itself (the
/// "no internal processes" rule), so the supervisor and whatever else lived in the
/// delegated cgroup move into this leaf, and the cells become its siblings.
pub const SUPERVISOR_LEAF: &str = "airlock-supervisor";

/// The controllers a cell's limits need.
const CELL_CONTROLLERS: [&str; 3] = ["memory", "pids", "cpu"];

/// A user's delegated v2 cgroup: the process's own (or, once it was moved into
/// [`SUPERVISOR_LEAF`], that leaf's parent), when its directory, `cgroup.procs` and
/// `cgroup.subtree_control` are writable and it offers every controller a cell needs.
/// Only the process's own cgroup can be: moving a process between two cgroups needs
/// write access to the `cgroup.procs` of their common ancestor, so a subtree elsewhere
/// (one the operator chowned, but that this process was not started in) cannot be
/// entered by the user. That is what `systemd-run --user --scope -p Delegate=yes` and an
/// operator's `echo PID > DIR/cgroup.procs` provide.
fn v2_delegated(
    v2: V2,
    uid: u32,
    own_cgroups: &str,
    writable: &dyn Fn(&Path) -> bool,
) -> Result<V2, CellError> {
    let own = own_v2_cgroup(own_cgroups);
    let delegated = own.as_ref().map(|own| match own.file_name() {
        Some(name) if name == SUPERVISOR_LEAF => own.parent().unwrap_or(own).to_path_buf(),
        _ => own.clone(),
    });
    let refused = |why: String| CellError::Unavailable {
        control: "cgroups.delegation",
        reason: format!(
            "{why}; {}",
            v2_delegation_fix(uid, Path::new("/run/systemd/system").is_dir())
        ),
    };
    let Some(delegated) = delegated else {
        return Err(refused(format!(
            "no cgroup v2 subtree is delegated to uid {uid}: /proc/self/cgroup names no v2 cgroup"
        )));
    };
    // An empty path is the root of this process's cgroup namespace: the host's root
    // (root's alone), or a container's own cgroup, which may be delegated to its user.
    let dir = v2.root.join(&delegated);
    let unwritable: Vec<String> = [
        dir.clone(),
        dir.join("cgroup.procs"),
        dir.join("cgroup.subtree_control"),
    ]
    .into_iter()
    .filter(|p| !(p.exists() && writable(p)))
    .map(|p| p.display().to_string())
    .collect();
    if !unwritable.is_empty() {
        let whose = match delegated.as_os_str().is_empty() {
            true => format!(
                "this process is in the root cgroup of {}",
                v2.root.display()
            ),
            false => format!("this process's cgroup {}", dir.display()),
        };
        return Err(refused(format!(
            "no cgroup v2 subtree is delegated to uid {uid}: {whose}, which it may not manage (not writable: {})",
            unwritable.join(", ")
        )));
    }
    let offered = fs::read_to_string(dir.join("cgroup.controllers")).unwrap_or_default();
    let missing: Vec<&str> = CELL_CONTROLLERS
        .into_iter()
        .filter(|c| !offered.split_whitespace().any(|o| o == *c))
        .collect();
    if !missing.is_empty() {
        return Err(CellError::Unavailable {
            control: "cgroups.delegation",
            reason: format!(
                "the cgroup delegated to uid {uid}, {}, lacks the {} controller(s) (it offers: {}); {}",
                dir.display(),
                missing.join(", "),
                offered.trim(),
                v2_controllers_fix(Path::new("/run/systemd/system").is_dir())
            ),
        });
    }
    Ok(V2 {
        cells_under: delegated,
        supervisor_leaf: Some(PathBuf::from(SUPERVISOR_LEAF)),
        ..v2
    })
}

/// The one command that gives a user a delegated v2 cgroup to start airlock in.
pub fn v2_delegation_fix(uid: u32, systemd: bool) -> String {
    let operator = format!(
        "as root: D=/sys/fs/cgroup/airlock-user-{uid}; mkdir -p $D && chown {uid} $D $D/cgroup.procs $D/cgroup.subtree_control $D/cgroup.threads && echo PID > $D/cgroup.procs (PID: the user's shell, whose children then start inside it)"
    );
    if systemd {
        format!("start airlock in a delegated scope: systemd-run --user --scope -p Delegate=yes airlock ...; or, {operator}")
    } else {
        operator
    }
}

/// The one command that delegates the controllers a cell needs.
fn v2_controllers_fix(systemd: bool) -> String {
    if systemd {
        "as root: mkdir -p /etc/systemd/system/user@.service.d && printf '[Service]\\nDelegate=cpu cpuset io memory pids\\n' > /etc/systemd/system/user@.service.d/delegate.conf && systemctl daemon-reload, then log in again".into()
    } else {
        "as root, enable them in the cgroup.subtree_control of every ancestor (echo \"+memory +pids +cpu\" > PARENT/cgroup.subtree_control)".into()
    }
}

/// The process's cgroup in the unified hierarchy (`0::/path`), relative to its root.
fn own_v2_cgroup(own_cgroups: &str) -> Option<PathBuf> {
    own_cgroups.lines().find_map(|line| {
        let path = line.strip_prefix("0::")?;
        Some(PathBuf::from(path.trim_start_matches('/')))
    })
}

/// The one command that delegates `airlock/user-<uid>` in every hierarchy a cell needs.
pub fn delegation_command(v1: &V1, uid: u32) -> String {
    let dirs: Vec<String> = v1
        .hierarchies()
        .iter()
        .map(|root| format!("{}/{PARENT_NAME}/user-{uid}", root.display()))
        .collect();
    format!(
        "for d in {}; do mkdir -p $d && chown {uid} $d $d/cgroup.procs; done",
        dirs.join(" ")
    )
}

/// The controller a v1 hierarchy is named for (`cpu,cpuacct` -> `cpu`).
fn hierarchy_controller(root: &Path) -> &str {
    let name = root.file_name().and_then(|n| n.to_str()).unwrap_or("");
    name.split(',').next().unwrap_or(name)
}

/// The process's own cgroup in the v1 hierarchy of `controller`, relative to its root,
/// from `/proc/self/cgroup` (`id:controllers:/path`); `None` at the root.
fn own_cgroup(own_cgroups: &str, controller: &str) -> Option<PathBuf> {
    own_cgroups.lines().find_map(|line| {
        let mut fields = line.splitn(3, ':');
        let (_, controllers, path) = (fields.next()?, fields.next()?, fields.next()?);
        let relative = path.trim_start_matches('/');
        (controllers.split(',').any(|c| c == controller) && !relative.is_empty())
            .then(|| PathBuf::from(relative))
    })
}

/// The process's cgroup in the hierarchy at `root` (relative; empty at the root), from
/// the text of `/proc/self/cgroup`: v2's line has no controllers (`0::/path`).
fn own_cgroup_in(layout: &CgroupLayout, root: &Path, own_cgroups: &str) -> PathBuf {
    let controller = match layout {
        CgroupLayout::V2(_) => "",
        CgroupLayout::V1(_) => hierarchy_controller(root),
    };
    own_cgroup(own_cgroups, controller).unwrap_or_default()
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

/// A counter file's number; 0 when it is missing or unreadable (an older kernel).
fn number(path: &Path) -> u64 {
    fs::read_to_string(path)
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

/// The number after `key` in a flat-keyed file (`memory.events`); 0 when absent.
fn keyed(path: &Path, key: &str) -> u64 {
    fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(key).and_then(|v| v.trim().parse().ok()))
        .unwrap_or(0)
}

/// The cgroup(s) of one cell.
#[derive(Debug)]
pub struct CellCgroup {
    layout: CgroupLayout,
    /// One directory (v2) or one per controller (v1: memory, pids, cpu, freezer).
    dirs: Vec<PathBuf>,
    /// The container cgroup the cell is the `cell` leaf of (an OCI spec's
    /// `linux.cgroupsPath`, container.rs); `None`: a cell of airlock's own parent.
    container: Option<Box<container::ContainerCgroup>>,
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
            container: None,
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
                    prepare_parent(layout.backend(), parent).and_then(|_| fs::create_dir(dir))
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
        if let Err(err) = layout.backend().write_limits(&cgroup.dirs, limits) {
            cgroup.remove_dirs(&created);
            return Err(err);
        }
        Ok(cgroup)
    }

    /// The cell of a container whose cgroup is `path` (container.rs): the container
    /// cgroup with the ceilings, this supervisor moved into it, the cell a leaf below.
    pub fn create_in_container(
        layout: &CgroupLayout,
        path: &ContainerCgroupPath,
        limits: &Limits,
    ) -> Result<CellCgroup, CellError> {
        let (container, dirs) = container::ContainerCgroup::create(layout, path, limits)?;
        Ok(CellCgroup {
            layout: layout.clone(),
            dirs,
            container: Some(Box::new(container)),
        })
    }

    /// v2, in a container cgroup: C's `pids.max` becomes the cell's exact ceiling
    /// (`cell_pids_max`) plus the tasks C holds now outside the cell (the supervisor's
    /// threads), so a fork the ceiling refuses is counted in C's `pids.events` and
    /// classified `pids`, before the cell's `RLIMIT_NPROC` backstop. Called with the cell
    /// parked at START, after the supervisor started its threads: their number must not
    /// grow while the payload runs (a thread it could not start would fail the run).
    /// Elsewhere nothing to do: v1 gives the cell its own `pids.max`.
    pub fn fix_container_pids(&self, cell_pids_max: u64) -> Result<(), CellError> {
        let (Some(container), CgroupLayout::V2(_)) = (&self.container, &self.layout) else {
            return Ok(());
        };
        let Some(dir) = container.dirs.first() else {
            return Ok(());
        };
        let number = |path: PathBuf| -> Result<u64, CellError> {
            let text = fs::read_to_string(&path).map_err(|source| CellError::Cgroup {
                path: path.clone(),
                source,
            })?;
            Ok(text.trim().parse().unwrap_or(0))
        };
        let in_container = number(dir.join("pids.current"))?;
        let threads = self.dirs[0].join("cgroup.threads");
        let in_cell = fs::read_to_string(&threads)
            .map_err(|source| CellError::Cgroup {
                path: threads,
                source,
            })?
            .lines()
            .count() as u64;
        let outside_cell = in_container.saturating_sub(in_cell);
        write_file(
            &dir.join("pids.max"),
            &(cell_pids_max + outside_cell).to_string(),
        )
    }

    /// Where the plan's limits are exact: the cell's own directories, except on v2 in a
    /// container cgroup, whose cell has no controllers (container.rs).
    fn limit_dirs(&self) -> &[PathBuf] {
        match (&self.container, &self.layout) {
            (Some(container), CgroupLayout::V2(_)) => &container.dirs,
            _ => &self.dirs,
        }
    }

    /// Moves `pid` (the cell's pid 1, not yet released) into every hierarchy.
    pub fn add_process(&self, pid: libc::pid_t) -> Result<(), CellError> {
        if self.container.as_ref().is_some_and(|c| !c.exempt) {
            write_file(
                Path::new(&format!("/proc/{pid}/oom_score_adj")),
                container::CELL_OOM_SCORE_ADJ,
            )?;
        }
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
    /// `/sys/fs/cgroup/<the host's hierarchy name>`.
    pub fn view(&self) -> Vec<(PathBuf, PathBuf)> {
        self.layout.backend().view(&self.dirs)
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
        self.layout
            .backend()
            .kill_all(&self.dirs, &|| self.signal_all(libc::SIGKILL))
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
        let backend = self.layout.backend();
        backend.freeze(&self.dirs, true)?;
        f();
        backend.freeze(&self.dirs, false)
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

    /// The cell's counters. In a container cgroup an OOM or a pids refusal may fire at
    /// the container's ceiling or (v1) the cell's: both count; peaks are the larger.
    pub fn usage(&self) -> CgroupUsage {
        let backend = self.layout.backend();
        let cell = backend.usage(&self.dirs);
        let Some(container) = &self.container else {
            return cell;
        };
        let outer = backend.usage(&container.dirs);
        CgroupUsage {
            memory_peak_bytes: cell.memory_peak_bytes.max(outer.memory_peak_bytes),
            oom_kills: cell.oom_kills + outer.oom_kills,
            pids_limit_hits: cell.pids_limit_hits + outer.pids_limit_hits,
            pids_peak: cell.pids_peak.max(outer.pids_peak),
        }
    }

    /// Removes the cgroup directories (and what was created of a container cgroup, once
    /// this supervisor left it); returns those that could not be removed.
    pub fn destroy(mut self) -> Vec<PathBuf> {
        let mut left: Vec<PathBuf> = self
            .dirs
            .iter()
            .filter(|dir| remove_dir_patiently(dir).is_err())
            .cloned()
            .collect();
        if let Some(container) = self.container.take() {
            for dir in container.leave() {
                if !left.contains(&dir) {
                    left.push(dir);
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

/// Removes a cgroup directory, waiting out the kernel's EBUSY while its last task is
/// still being torn down; a missing one is removed already.
fn remove_dir_patiently(dir: &Path) -> io::Result<()> {
    let mut attempts = 0;
    loop {
        match fs::remove_dir(dir) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(()),
            Err(_) if attempts < 200 => {
                attempts += 1;
                std::thread::sleep(Duration::from_millis(1));
            }
            Err(e) => return Err(e),
        }
    }
}

/// Creates airlock's parent cgroup and lets it hold limited cells.
fn prepare_parent(backend: &dyn CgroupBackend, parent: &Path) -> io::Result<()> {
    match fs::create_dir(parent) {
        Ok(()) => {}
        Err(e) if e.kind() == ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    backend.enable_controllers(parent)
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

/// Whether `name` is a cell's (see [`cgroup_name`]): three numbers joined by dashes.
pub(crate) fn is_cell_name(name: &str) -> bool {
    let parts: Vec<&str> = name.split('-').collect();
    parts.len() == 3
        && parts
            .iter()
            .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
}

pub(crate) fn supervisor_alive(name: &str) -> bool {
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
            // Only cells: a subtree delegated to a user (`user-<uid>`) is not one.
            if is_dir
                && is_cell_name(&name)
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
            container: None,
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
            // A supervisor that died inside a freeze (`kill_all_except`) leaves its cell
            // frozen, and a frozen v1 task never acts on the SIGKILL: thaw it. An
            // incomplete leftover may have no freezer directory; that is no error here.
            let _ = layout.backend().freeze(&cgroup.dirs, false);
            std::thread::sleep(Duration::from_millis(5));
        }
        left.extend(cgroup.destroy());
    }
    left
}

/// `pids.max` of a cell ([`Limits::cell_pids_max`]).
fn pids_max(limits: &Limits) -> String {
    limits.cell_pids_max().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(super) fn limits() -> Limits {
        Limits {
            cpu_millis: 1500,
            memory_bytes: 256 << 20,
            process_limit: 64,
            wall_time_ms: 1000,
            output_bytes: 1024,
            open_files: 256,
            file_size_bytes: 1 << 20,
            shm_bytes: 1 << 20,
        }
    }

    pub(super) fn read(path: &Path) -> String {
        fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    }

    pub(super) fn touch(path: &Path, text: &str) {
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, text).unwrap();
    }

    /// A v2 mount with the controllers a cell needs, as a plain directory tree.
    pub(super) fn v2_fixture() -> (tempfile::TempDir, CgroupLayout) {
        let root = tempfile::tempdir().unwrap();
        touch(
            &root.path().join("cgroup.controllers"),
            "cpuset cpu io memory hugetlb pids rdma misc\n",
        );
        let layout = CgroupLayout::detect_at(root.path(), false).unwrap();
        (root, layout)
    }

    /// The four v1 hierarchies of a hybrid host, with swap accounting.
    pub(super) fn v1_fixture() -> (tempfile::TempDir, CgroupLayout) {
        let root = tempfile::tempdir().unwrap();
        for hierarchy in ["memory", "pids", "cpu,cpuacct", "freezer"] {
            touch(&root.path().join(hierarchy).join("cgroup.procs"), "");
        }
        touch(
            &root.path().join("memory/memory.memsw.limit_in_bytes"),
            "max\n",
        );
        let layout = CgroupLayout::detect_at(root.path(), true).unwrap();
        (root, layout)
    }

    /// `/proc/self/cgroup` of a process in a cgroup of its own in every v1 hierarchy.
    const OWN_CGROUPS: &str =
        "8:pids:/jobs/ci\n6:freezer:/jobs/ci\n4:memory:/jobs/ci\n2:cpu,cpuacct:/jobs/ci\n0::/\n";

    /// A cgroup `under` each hierarchy of [`v1_fixture`]'s tree at `root`.
    fn subtree_in_every_hierarchy(root: &Path, under: &str) {
        for hierarchy in ["memory", "pids", "cpu,cpuacct", "freezer"] {
            touch(&root.join(hierarchy).join(under).join("cgroup.procs"), "");
        }
    }

    fn everything_writable(_: &Path) -> bool {
        true
    }

    fn cells_under(layout: &CgroupLayout) -> Vec<PathBuf> {
        let CgroupLayout::V1(v1) = layout else {
            panic!("v1 expected")
        };
        v1.cells_under.to_vec()
    }

    #[test]
    fn a_delegated_user_subtree_is_never_taken_for_a_leftover_cell() {
        let (root, layout) = v1_fixture();
        let parents = layout.parents();
        for parent in &parents {
            fs::create_dir_all(parent.join("user-1001")).unwrap();
            fs::create_dir_all(parent.join("1-2-3")).unwrap();
        }
        let found: Vec<PathBuf> = find_leftovers(&layout)
            .into_iter()
            .map(|l| l.path)
            .collect();
        assert_eq!(found.len(), 4, "{found:?}");
        assert!(found.iter().all(|p| p.ends_with("1-2-3")), "{found:?}");
        assert!(is_cell_name(&cgroup_name(7)));
        drop(root);
    }

    #[test]
    fn root_keeps_the_airlock_subtree_in_every_hierarchy() {
        let (_root, layout) = v1_fixture();
        let layout = layout.for_caller(0, OWN_CGROUPS, &|_| false).unwrap();
        assert_eq!(cells_under(&layout), vec![PathBuf::from("airlock"); 4]);
    }

    #[test]
    fn a_user_takes_the_operators_user_subtree_first() {
        let (root, layout) = v1_fixture();
        subtree_in_every_hierarchy(root.path(), "airlock/user-1001");
        subtree_in_every_hierarchy(root.path(), "jobs/ci");
        let layout = layout
            .for_caller(1001, OWN_CGROUPS, &everything_writable)
            .unwrap();
        assert_eq!(
            cells_under(&layout),
            vec![PathBuf::from("airlock/user-1001"); 4]
        );
        assert!(layout.parents()[2].ends_with("cpu,cpuacct/airlock/user-1001"));
    }

    #[test]
    fn a_user_falls_back_to_its_own_delegated_cgroup() {
        let (root, layout) = v1_fixture();
        subtree_in_every_hierarchy(root.path(), "jobs/ci");
        let layout = layout
            .for_caller(1001, OWN_CGROUPS, &everything_writable)
            .unwrap();
        assert_eq!(cells_under(&layout), vec![PathBuf::from("jobs/ci"); 4]);
    }

    #[test]
    fn a_subtree_the_user_cannot_write_is_not_delegated() {
        let (root, layout) = v1_fixture();
        subtree_in_every_hierarchy(root.path(), "airlock/user-1001");
        // The operator chowned the directory but not the pids hierarchy's cgroup.procs.
        let pids_procs = root.path().join("pids/airlock/user-1001/cgroup.procs");
        let writable = |p: &Path| p != pids_procs;
        let error = layout.for_caller(1001, OWN_CGROUPS, &writable).unwrap_err();
        let CellError::Unavailable { control, reason } = &error else {
            panic!("{error:?}")
        };
        assert_eq!(*control, "cgroups.delegation");
        assert!(reason.contains("in the pids hierarchy"), "{reason}");
        assert!(
            reason.contains("mkdir -p $d && chown 1001 $d $d/cgroup.procs"),
            "{reason}"
        );
        assert_eq!(
            error.class(),
            crate::report::ResultClass::SandboxUnavailable
        );
    }

    #[test]
    fn a_user_without_any_subtree_is_refused_naming_every_hierarchy() {
        let (_root, layout) = v1_fixture();
        let error = layout
            .for_caller(1001, "0::/\n", &everything_writable)
            .unwrap_err();
        let reason = error.to_string();
        for controller in ["memory", "pids", "cpu", "freezer"] {
            assert!(reason.contains(controller), "{reason}");
        }
    }

    /// A cgroup `under` [`v2_fixture`]'s root offering `controllers`.
    fn v2_cgroup(root: &Path, under: &str, controllers: &str) -> PathBuf {
        let dir = root.join(under);
        for file in ["cgroup.procs", "cgroup.subtree_control"] {
            touch(&dir.join(file), "");
        }
        touch(&dir.join("cgroup.controllers"), controllers);
        dir
    }

    fn v2_of(layout: &CgroupLayout) -> &V2 {
        let CgroupLayout::V2(v2) = layout else {
            panic!("v2 expected: {layout:?}")
        };
        v2
    }

    #[test]
    fn a_user_on_cgroup_v2_takes_its_own_delegated_cgroup_with_a_leaf_for_itself() {
        let (root, layout) = v2_fixture();
        let scope = "user.slice/user-1001.slice/run-7.scope";
        v2_cgroup(root.path(), scope, "cpu memory pids\n");
        let own = format!("0::/{scope}\n");
        let layout = layout.for_caller(1001, &own, &everything_writable).unwrap();
        let v2 = v2_of(&layout);
        assert_eq!(v2.cells_under, PathBuf::from(scope));
        assert_eq!(v2.supervisor_leaf, Some(PathBuf::from(SUPERVISOR_LEAF)));
        assert_eq!(layout.parents(), [root.path().join(scope)]);
        // Started again from the leaf a run moved it into: the same delegation.
        let from_leaf = format!("0::/{scope}/{SUPERVISOR_LEAF}\n");
        let again = CgroupLayout::detect_at(root.path(), false)
            .unwrap()
            .for_caller(1001, &from_leaf, &everything_writable)
            .unwrap();
        assert_eq!(v2_of(&again).cells_under, PathBuf::from(scope));
    }

    #[test]
    fn a_user_on_cgroup_v2_without_a_delegated_cgroup_is_refused_naming_the_fix() {
        let (root, layout) = v2_fixture();
        let error = layout
            .clone()
            .for_caller(1001, "0::/\n", &|_| false)
            .unwrap_err();
        let CellError::Unavailable { control, reason } = &error else {
            panic!("{error:?}")
        };
        assert_eq!(*control, "cgroups.delegation");
        assert!(reason.contains("root cgroup"), "{reason}");
        assert!(reason.contains("chown 1001 $D $D/cgroup.procs"), "{reason}");

        // Writable directory, but cgroup.subtree_control still root's.
        let dir = v2_cgroup(root.path(), "jobs/ci", "cpu memory pids\n");
        let control_file = dir.join("cgroup.subtree_control");
        let writable = |p: &Path| p != control_file;
        let reason = layout
            .clone()
            .for_caller(1001, "0::/jobs/ci\n", &writable)
            .unwrap_err()
            .to_string();
        assert!(reason.contains("cgroup.subtree_control"), "{reason}");

        // systemd's default delegation to user@.service lacks cpu.
        fs::write(dir.join("cgroup.controllers"), "memory pids\n").unwrap();
        let reason = layout
            .for_caller(1001, "0::/jobs/ci\n", &everything_writable)
            .unwrap_err()
            .to_string();
        assert!(reason.contains("lacks the cpu controller"), "{reason}");
    }

    #[test]
    fn the_root_of_a_containers_cgroup_namespace_is_delegated_when_its_user_may_write_it() {
        let (root, layout) = v2_fixture();
        v2_cgroup(root.path(), "", "cpu memory pids\n");
        let layout = layout
            .for_caller(1001, "0::/\n", &everything_writable)
            .unwrap();
        assert_eq!(layout.parents(), [root.path().to_path_buf()]);
        assert_eq!(
            v2_of(&layout).supervisor_leaf,
            Some(PathBuf::from(SUPERVISOR_LEAF))
        );
    }

    #[test]
    fn settling_a_v2_delegation_moves_its_processes_into_the_leaf_then_enables_controllers() {
        let (root, layout) = v2_fixture();
        let dir = v2_cgroup(root.path(), "jobs/ci", "cpu memory pids\n");
        fs::write(dir.join("cgroup.procs"), "41\n42\n").unwrap();
        let layout = layout
            .for_caller(1001, "0::/jobs/ci\n", &everything_writable)
            .unwrap();
        let v2 = v2_of(&layout);
        v2.settle_delegation().unwrap();
        // A plain file keeps the last write: each member was written in turn.
        assert_eq!(read(&dir.join(SUPERVISOR_LEAF).join("cgroup.procs")), "42");
        assert_eq!(
            read(&dir.join("cgroup.subtree_control")),
            "+memory +pids +cpu"
        );
        // Settled: nothing is moved again.
        fs::write(dir.join("cgroup.subtree_control"), "cpu memory pids").unwrap();
        fs::remove_dir_all(dir.join(SUPERVISOR_LEAF)).unwrap();
        v2.settle_delegation().unwrap();
        assert!(!dir.join(SUPERVISOR_LEAF).exists());
        assert!(
            layout.describe().contains("delegated"),
            "{}",
            layout.describe()
        );
    }

    #[test]
    fn the_own_cgroup_is_read_per_controller_and_never_the_root() {
        assert_eq!(
            own_cgroup(OWN_CGROUPS, "cpu"),
            Some(PathBuf::from("jobs/ci"))
        );
        assert_eq!(own_cgroup("4:memory:/\n", "memory"), None);
        assert_eq!(own_cgroup("4:memory:/a\n", "pids"), None);
    }

    /// Removes the fixture's plain control files, which a real cgroupfs rmdir ignores.
    fn remove_control_files(dirs: &[PathBuf]) {
        for dir in dirs {
            for entry in fs::read_dir(dir).unwrap().flatten() {
                fs::remove_file(entry.path()).unwrap();
            }
        }
    }

    #[test]
    fn v2_is_detected_by_its_controllers_and_refused_without_one() {
        let (root, layout) = v2_fixture();
        assert_eq!(layout.version(), "v2");
        assert_eq!(
            layout.describe(),
            format!("v2 at {}", root.path().display())
        );
        fs::write(root.path().join("cgroup.controllers"), "cpu memory\n").unwrap();
        let error = CgroupLayout::detect_at(root.path(), false).unwrap_err();
        assert!(
            error.to_string().contains("lacks the pids controller"),
            "{error}"
        );
    }

    #[test]
    fn v1_without_swap_accounting_is_refused_only_when_swap_is_on() {
        let (root, layout) = v1_fixture();
        let CgroupLayout::V1(v1) = &layout else {
            panic!("{layout:?}")
        };
        assert_eq!(v1.cpu, root.path().join("cpu,cpuacct"));
        fs::remove_file(root.path().join("memory/memory.memsw.limit_in_bytes")).unwrap();
        assert!(CgroupLayout::detect_at(root.path(), false).is_ok());
        let error = CgroupLayout::detect_at(root.path(), true).unwrap_err();
        assert!(error.to_string().contains("swapaccount=1"), "{error}");
        fs::remove_dir_all(root.path().join("freezer")).unwrap();
        let error = CgroupLayout::detect_at(root.path(), false).unwrap_err();
        assert!(error.to_string().contains("missing v1: freezer"), "{error}");
    }

    #[test]
    fn v2_creates_the_parent_enables_controllers_and_writes_every_limit() {
        let (root, layout) = v2_fixture();
        let cgroup = CellCgroup::create(&layout, "cell-1", &limits()).unwrap();
        let dir = root.path().join("airlock/cell-1");
        assert_eq!(cgroup.dirs, std::slice::from_ref(&dir));
        assert_eq!(
            read(&root.path().join("cgroup.subtree_control")),
            "+memory +pids +cpu"
        );
        assert_eq!(
            read(&root.path().join("airlock/cgroup.subtree_control")),
            "+memory +pids +cpu"
        );
        assert_eq!(read(&dir.join("memory.max")), (256u64 << 20).to_string());
        assert_eq!(read(&dir.join("memory.swap.max")), "0");
        assert_eq!(read(&dir.join("memory.oom.group")), "1");
        assert_eq!(
            read(&dir.join("pids.max")),
            "65",
            "process_limit + airlock's pid 1"
        );
        assert_eq!(read(&dir.join("cpu.max")), "150000 100000");
        cgroup.add_process(4242).unwrap();
        assert_eq!(read(&dir.join("cgroup.procs")), "4242");
        assert_eq!(cgroup.view(), [(PathBuf::from("/sys/fs/cgroup"), dir)]);
    }

    #[test]
    fn v1_writes_each_limit_into_its_controllers_directory() {
        let (root, layout) = v1_fixture();
        let cgroup = CellCgroup::create(&layout, "cell-1", &limits()).unwrap();
        let dir = |hierarchy: &str| root.path().join(hierarchy).join("airlock/cell-1");
        assert_eq!(
            cgroup.dirs,
            [
                dir("memory"),
                dir("pids"),
                dir("cpu,cpuacct"),
                dir("freezer")
            ]
        );
        let memory = (256u64 << 20).to_string();
        assert_eq!(read(&dir("memory").join("memory.limit_in_bytes")), memory);
        assert_eq!(
            read(&dir("memory").join("memory.memsw.limit_in_bytes")),
            memory
        );
        assert_eq!(read(&dir("pids").join("pids.max")), "65");
        assert_eq!(read(&dir("cpu,cpuacct").join("cpu.cfs_quota_us")), "150000");
        assert!(!root
            .path()
            .join("memory/airlock/cgroup.subtree_control")
            .exists());
        cgroup.add_process(4242).unwrap();
        for hierarchy in ["memory", "pids", "cpu,cpuacct", "freezer"] {
            assert_eq!(
                read(&dir(hierarchy).join("cgroup.procs")),
                "4242",
                "{hierarchy}"
            );
        }
        assert_eq!(
            cgroup.view(),
            [
                (PathBuf::from("/sys/fs/cgroup/memory"), dir("memory")),
                (PathBuf::from("/sys/fs/cgroup/pids"), dir("pids")),
                (
                    PathBuf::from("/sys/fs/cgroup/cpu,cpuacct"),
                    dir("cpu,cpuacct")
                ),
            ]
        );
    }

    #[test]
    fn a_failed_creation_removes_what_was_created() {
        let (root, layout) = v1_fixture();
        // The pids hierarchy's parent is a file: the cell's directory there cannot be made.
        touch(&root.path().join("pids/airlock"), "");
        let error = CellCgroup::create(&layout, "cell-1", &limits()).unwrap_err();
        assert!(error.to_string().contains("pids/airlock/cell-1"), "{error}");
        assert!(!root.path().join("memory/airlock/cell-1").exists());
    }

    #[test]
    fn usage_is_parsed_from_the_counter_files_of_each_version() {
        let (_v2_root, v2) = v2_fixture();
        let cgroup = CellCgroup::create(&v2, "cell-1", &limits()).unwrap();
        let dir = &cgroup.dirs[0];
        touch(&dir.join("memory.peak"), "123456\n");
        touch(
            &dir.join("memory.events"),
            "low 0\nhigh 0\nmax 7\noom 2\noom_kill 1\noom_group_kill 1\n",
        );
        touch(&dir.join("pids.events"), "max 3\n");
        touch(&dir.join("pids.peak"), "9\n");
        assert_eq!(
            cgroup.usage(),
            CgroupUsage {
                memory_peak_bytes: 123456,
                oom_kills: 1,
                pids_limit_hits: 3,
                pids_peak: 9
            }
        );

        let (_v1_root, v1) = v1_fixture();
        let cgroup = CellCgroup::create(&v1, "cell-1", &limits()).unwrap();
        let (memory, pids) = (&cgroup.dirs[0], &cgroup.dirs[1]);
        touch(&memory.join("memory.max_usage_in_bytes"), "777\n");
        touch(
            &memory.join("memory.oom_control"),
            "oom_kill_disable 0\nunder_oom 0\noom_kill 4\n",
        );
        touch(&pids.join("pids.events"), "max 5\n");
        assert_eq!(
            cgroup.usage(),
            CgroupUsage {
                memory_peak_bytes: 777,
                oom_kills: 4,
                pids_limit_hits: 5,
                pids_peak: 0
            },
            "a missing pids.peak (older kernels) counts 0"
        );
    }

    #[test]
    fn v2_kills_with_cgroup_kill_and_freezes_through_cgroup_freeze() {
        let (_root, layout) = v2_fixture();
        let cgroup = CellCgroup::create(&layout, "cell-1", &limits()).unwrap();
        let dir = cgroup.dirs[0].clone();
        cgroup.kill_all().unwrap();
        assert_eq!(read(&dir.join("cgroup.kill")), "1");
        // No member but the survivor: nothing is signalled; the freeze is undone.
        touch(
            &dir.join("cgroup.procs"),
            &format!("{}\n", std::process::id()),
        );
        touch(&dir.join("cgroup.events"), "populated 1\nfrozen 1\n");
        cgroup
            .kill_all_except(std::process::id() as libc::pid_t)
            .unwrap();
        assert_eq!(read(&dir.join("cgroup.freeze")), "0");
        assert_eq!(cgroup.pids(), [std::process::id() as libc::pid_t]);
    }

    #[test]
    fn v1_kills_inside_a_freeze_and_thaws_after() {
        let (_root, layout) = v1_fixture();
        let cgroup = CellCgroup::create(&layout, "cell-1", &limits()).unwrap();
        let freezer = cgroup.dirs[3].clone();
        // An empty cgroup: the kill lists no one, and the freezer ends thawed.
        touch(&freezer.join("cgroup.procs"), "");
        cgroup.kill_all().unwrap();
        assert_eq!(read(&freezer.join("freezer.state")), "THAWED");
        assert!(
            !cgroup.dirs[0].join("cgroup.kill").exists(),
            "v1 has no cgroup.kill"
        );
        assert!(cgroup.wait_empty(Duration::from_millis(10)));
    }

    #[test]
    fn a_leftover_frozen_by_a_dead_supervisor_is_thawed_so_its_kill_lands() {
        let (root, layout) = v1_fixture();
        // No supervisor has this pid (above any pid_max) and no process this pid: the
        // kill reaches no one, and the member stays listed until the deadline.
        let name = "4194304000-1-0";
        for hierarchy in ["memory", "pids", "cpu,cpuacct", "freezer"] {
            let dir = root.path().join(hierarchy).join("airlock").join(name);
            touch(&dir.join("cgroup.procs"), "2147483646\n");
        }
        let freezer = root.path().join("freezer/airlock").join(name);
        touch(&freezer.join("freezer.state"), "FROZEN\n");
        let left = reap_leftovers(&layout);
        assert_eq!(read(&freezer.join("freezer.state")), "THAWED");
        // Plain directories with files cannot be removed: reported, not hidden.
        assert_eq!(left.len(), 4, "{left:?}");
    }

    #[test]
    fn destroy_removes_every_directory_and_reports_what_it_could_not() {
        for (_root, layout) in [v2_fixture(), v1_fixture()] {
            let cgroup = CellCgroup::create(&layout, "cell-1", &limits()).unwrap();
            let dirs = cgroup.dirs.clone();
            for dir in &dirs {
                touch(&dir.join("cgroup.procs"), "");
            }
            // A non-empty plain directory cannot be removed: it is reported, not hidden.
            let kept = CellCgroup {
                layout: layout.clone(),
                dirs: dirs.clone(),
                container: None,
            };
            assert_eq!(kept.destroy(), dirs);
            remove_control_files(&dirs);
            assert!(cgroup.destroy().is_empty(), "{}", layout.version());
            assert!(dirs.iter().all(|d| !d.exists()));
        }
    }

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
