//! A container's own cgroup: the runtime spec's `linux.cgroupsPath` (resolved by
//! crates/oci/src/cgroups_path.rs), for the OCI runtime under containerd's runc shim.
//!
//! The shim reads the cgroup of the `--pid-file` pid (airlock's supervisor) for a task's
//! metrics, and kubelet accounts a pod by its cgroups. So, in each hierarchy:
//!
//! ```text
//! <root>/<cgroupsPath>        the container cgroup C: the plan's ceilings; the supervisor
//! <root>/<cgroupsPath>/cell   the cell: its pid 1, the payload and every exec
//! ```
//!
//! - The supervisor moves itself into C, so the shim's lookup by pid finds C, whose
//!   hierarchical counters include the cell. Its `oom_score_adj` is -1000: the kernel
//!   neither picks it as an OOM victim nor kills it with `memory.oom.group` (both skip
//!   `OOM_SCORE_ADJ_MIN`), so an OOM in C kills the payload, not its supervisor.
//! - v2: C holds a process (the supervisor), so by the no-internal-processes rule it may
//!   enable no controller for its children: the cell has none of its own and is limited
//!   by C's `memory.max`, `pids.max` and `cpu.max`, which cover its subtree. Freezing and
//!   killing use the core files `cgroup.freeze` and `cgroup.kill` of the cell, which exist
//!   without controllers, so the supervisor is never frozen or killed with it.
//! - v1 has no such rule: the cell also gets the plan's exact limits, and C the same with
//!   the supervisor's allowance (below); the freezer acts on the cell.
//! - `pids.max` of C is the cell's plus [`SUPERVISOR_TASKS`] (its own threads: the main
//!   one, the mount helper, the egress proxy, the store writer, the input hasher). On v2,
//!   where it is the cell's only pids ceiling, it is made exact when the payload is let go
//!   ([`CellCgroup::fix_container_pids`]: the cell's plus the supervisor's tasks then).
//!
//! The path's parents are created as runc does, and only the directories created here are
//! removed at the end (the supervisor first moves back to where it came from). A C that
//! already exists with a process or a child cgroup in it (the host's, or another live
//! container's) is refused.

use super::{write_file, CgroupLayout};
use crate::error::CellError;
use airlock_contract::Limits;
use std::fs;
use std::io::ErrorKind;
use std::path::{Component, Path, PathBuf};

/// The cell's directory below the container cgroup.
pub const CELL_LEAF: &str = "cell";
/// Tasks allowed in the container cgroup for the supervisor, beyond the cell's own.
pub const SUPERVISOR_TASKS: u32 = 8;

/// A container cgroup's path relative to each hierarchy's root: normal components only,
/// never empty (the root cgroup).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerCgroupPath(PathBuf);

impl ContainerCgroupPath {
    pub fn new(path: PathBuf) -> Result<ContainerCgroupPath, CellError> {
        let normal = path.components().all(|c| matches!(c, Component::Normal(_)));
        if !normal || path.as_os_str().is_empty() {
            return Err(refusal(
                &path,
                "a container cgroup is a path of plain names below the hierarchy's root",
            ));
        }
        Ok(ContainerCgroupPath(path))
    }

    pub fn as_path(&self) -> &Path {
        &self.0
    }
}

fn refusal(path: &Path, rule: &str) -> CellError {
    CellError::ContainerCgroup {
        path: path.to_path_buf(),
        rule: rule.to_owned(),
    }
}

/// The container cgroup of a live cell, in the order of the cell's `dirs`.
#[derive(Debug)]
pub struct ContainerCgroup {
    pub(super) dirs: Vec<PathBuf>,
    /// What was created here (parents first), removed in reverse at the end.
    created: Vec<PathBuf>,
    /// The supervisor's cgroup in each hierarchy before it moved into `dirs`.
    origin: Vec<PathBuf>,
    /// Whether the supervisor's `oom_score_adj` is -1000 (it needs CAP_SYS_RESOURCE).
    pub(super) exempt: bool,
}

fn has_child(dir: &Path) -> bool {
    fs::read_dir(dir).is_ok_and(|entries| {
        entries
            .flatten()
            .any(|e| e.file_type().is_ok_and(|t| t.is_dir()))
    })
}

/// What the container cgroup at `path` may be: refused when it holds a process or a
/// child cgroup (the host's, or another container's: its supervisor and `cell`).
fn check_unused(dir: &Path) -> Result<(), CellError> {
    let procs = fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
    if let Some(pid) = procs.lines().next() {
        return Err(refusal(
            dir,
            &format!("it already holds process {pid} (the host's or another container's); a container cgroup must be empty"),
        ));
    }
    let child = fs::read_dir(dir).ok().and_then(|entries| {
        entries
            .flatten()
            .find(|e| e.file_type().is_ok_and(|t| t.is_dir()))
    });
    if let Some(child) = child {
        return Err(refusal(
            dir,
            &format!(
                "it already has the child cgroup {} (another container's?); a container cgroup must be empty",
                child.file_name().to_string_lossy()
            ),
        ));
    }
    Ok(())
}

impl ContainerCgroup {
    /// A live container's cgroup found again from outside its supervisor: nothing to
    /// remove or return to.
    pub(super) fn found(dirs: Vec<PathBuf>) -> ContainerCgroup {
        ContainerCgroup {
            dirs,
            created: Vec::new(),
            origin: Vec::new(),
            exempt: true,
        }
    }

    /// Creates (or takes, when it exists unused) the container cgroup in every hierarchy,
    /// with the plan's limits and the supervisor's allowance, and the cell's directory
    /// below it. Any failure removes what was created.
    pub(super) fn create(
        layout: &CgroupLayout,
        path: &ContainerCgroupPath,
        limits: &Limits,
    ) -> Result<(ContainerCgroup, Vec<PathBuf>), CellError> {
        let roots = layout.roots();
        let dirs: Vec<PathBuf> = roots.iter().map(|r| r.join(path.as_path())).collect();
        for dir in dirs.iter().filter(|d| d.exists()) {
            check_unused(dir)?;
        }
        let mut container = ContainerCgroup {
            dirs,
            created: Vec::new(),
            origin: Vec::new(),
            exempt: false,
        };
        match container.build(layout, path, limits) {
            Ok(cells) => Ok((container, cells)),
            Err(err) => {
                // The supervisor may have entered some hierarchies already.
                container.leave();
                Err(err)
            }
        }
    }

    fn build(
        &mut self,
        layout: &CgroupLayout,
        path: &ContainerCgroupPath,
        limits: &Limits,
    ) -> Result<Vec<PathBuf>, CellError> {
        for root in layout.roots() {
            self.make_path(layout, &root, path.as_path())?;
        }
        self.exempt = exempt_from_oom_killer();
        let backend = layout.backend();
        backend.write_limits(&self.dirs, &with_supervisor(limits))?;
        if let (CgroupLayout::V2(_), false) = (layout, self.exempt) {
            // A group kill would take the supervisor too: the cell's own oom_score_adj
            // makes its tasks the victims instead (CellCgroup::add_process).
            for dir in &self.dirs {
                write_file(&dir.join("memory.oom.group"), "0")?;
            }
        }
        let cells: Vec<PathBuf> = self.dirs.iter().map(|d| d.join(CELL_LEAF)).collect();
        for cell in &cells {
            make_dir(cell)?;
            self.created.push(cell.clone());
        }
        if let CgroupLayout::V1(_) = layout {
            // No internal-process rule on v1: the cell gets its exact ceilings too.
            backend.write_limits(&cells, limits)?;
        }
        self.enter(layout)?;
        Ok(cells)
    }

    /// Creates `path` below `root` one component at a time; on v2 every parent first
    /// enables the cell's controllers for its children, as runc does.
    fn make_path(
        &mut self,
        layout: &CgroupLayout,
        root: &Path,
        path: &Path,
    ) -> Result<(), CellError> {
        let mut dir = root.to_path_buf();
        for component in path.components() {
            if let CgroupLayout::V2(_) = layout {
                enable_controllers(&dir)?;
            }
            dir.push(component);
            match fs::create_dir(&dir) {
                Ok(()) => self.created.push(dir.clone()),
                // A parent another container made meanwhile, or one that was there; the
                // container cgroup itself must (still) be unused.
                Err(e) if e.kind() == ErrorKind::AlreadyExists => {
                    if dir.ends_with(path) {
                        check_unused(&dir)?;
                    }
                }
                Err(source) => return Err(CellError::Cgroup { path: dir, source }),
            }
        }
        Ok(())
    }

    /// Moves the supervisor into the container cgroup, out of the OOM killer's reach.
    fn enter(&mut self, layout: &CgroupLayout) -> Result<(), CellError> {
        let own = fs::read_to_string("/proc/self/cgroup")
            .map_err(|e| CellError::io("/proc/self/cgroup", e))?;
        self.origin = layout
            .roots()
            .iter()
            .map(|root| root.join(super::own_cgroup_in(layout, root, &own)))
            .collect();
        let pid = std::process::id().to_string();
        for dir in &self.dirs {
            write_file(&dir.join("cgroup.procs"), &pid)?;
        }
        Ok(())
    }

    /// Moves the supervisor back where it came from and removes what was created here;
    /// returns the directories that could not be removed.
    pub(super) fn leave(self) -> Vec<PathBuf> {
        let pid = std::process::id().to_string();
        for origin in &self.origin {
            let _ = fs::write(origin.join("cgroup.procs"), &pid);
        }
        self.remove_created()
    }

    /// Removes what was created here, deepest first. A parent of the container cgroup
    /// that has another child by now (a sibling container's) is left to its last user.
    fn remove_created(&self) -> Vec<PathBuf> {
        self.created
            .iter()
            .rev()
            .filter(|dir| !(self.is_parent(dir) && has_child(dir)))
            .filter(|dir| super::remove_dir_patiently(dir).is_err())
            .cloned()
            .collect()
    }

    fn is_parent(&self, dir: &Path) -> bool {
        self.dirs
            .iter()
            .any(|container| container != dir && container.starts_with(dir))
    }
}

/// Sets the supervisor's `oom_score_adj` to -1000, so the OOM killer never picks it and
/// `memory.oom.group` skips it. Lowering it needs CAP_SYS_RESOURCE: without it, `false`
/// (the cell's tasks are then made the OOM killer's first choice instead).
#[cfg(not(test))]
fn exempt_from_oom_killer() -> bool {
    fs::write("/proc/self/oom_score_adj", "-1000").is_ok()
}

/// Unit tests run against fixture trees: the test process keeps its own score (the
/// exemption itself is checked by the OCI suites and the pure-v2 VM).
#[cfg(test)]
fn exempt_from_oom_killer() -> bool {
    false
}

/// What the cell's pid 1 (and so every task of the cell) gets when the supervisor could
/// not be exempted: the highest score, so the OOM killer takes a cell task first. The
/// payload cannot lower it again: Landlock leaves `/proc` read-only in the cell.
pub const CELL_OOM_SCORE_ADJ: &str = "1000";

/// Removes the container cgroup at `path` and its `cell` leaf when a supervisor could
/// not (it was SIGKILLed: its cell died with it). Only a container cgroup that is airlock's
/// (a `cell` leaf and no other child) and empty is removed; its parents are left, since
/// what the dead supervisor created of them is unknown. A missing one, or one that holds
/// a process (then it is not this stopped container's: its cell died with its
/// supervisor; it may be a live container's with the same path, which this one was
/// refused), is left alone.
pub fn remove_abandoned(
    layout: &CgroupLayout,
    path: &ContainerCgroupPath,
) -> Result<(), CellError> {
    for root in layout.roots() {
        let container = root.join(path.as_path());
        let cell = container.join(CELL_LEAF);
        let in_use = has_process(&container) || has_process(&cell);
        if !cell.is_dir() || has_other_child(&container) || in_use {
            continue;
        }
        for dir in [&cell, &container] {
            super::remove_dir_patiently(dir).map_err(|source| CellError::Cgroup {
                path: dir.clone(),
                source,
            })?;
        }
    }
    Ok(())
}

fn has_process(dir: &Path) -> bool {
    fs::read_to_string(dir.join("cgroup.procs")).is_ok_and(|procs| !procs.trim().is_empty())
}

fn has_other_child(container: &Path) -> bool {
    fs::read_dir(container).is_ok_and(|entries| {
        entries
            .flatten()
            .any(|e| e.file_type().is_ok_and(|t| t.is_dir()) && e.file_name() != CELL_LEAF)
    })
}

/// The plan's limits with room for the supervisor's tasks.
fn with_supervisor(limits: &Limits) -> Limits {
    Limits {
        process_limit: limits.process_limit.saturating_add(SUPERVISOR_TASKS),
        ..*limits
    }
}

/// `process_limit` of a limit change, with room for the supervisor's tasks.
pub(super) fn changes_with_supervisor(changes: &super::LimitChanges) -> super::LimitChanges {
    super::LimitChanges {
        process_limit: changes
            .process_limit
            .map(|p| p.saturating_add(SUPERVISOR_TASKS)),
        ..*changes
    }
}

fn make_dir(dir: &Path) -> Result<(), CellError> {
    match fs::create_dir(dir) {
        Ok(()) => Ok(()),
        Err(source) => Err(CellError::Cgroup {
            path: dir.to_path_buf(),
            source,
        }),
    }
}

/// Enables memory, pids and cpu for `dir`'s children unless they already are.
fn enable_controllers(dir: &Path) -> Result<(), CellError> {
    let control = dir.join("cgroup.subtree_control");
    let enabled = fs::read_to_string(&control).unwrap_or_default();
    if super::CELL_CONTROLLERS
        .iter()
        .all(|c| enabled.split_whitespace().any(|on| on == *c))
    {
        return Ok(());
    }
    write_file(&control, "+memory +pids +cpu").map_err(|err| match err {
        CellError::Cgroup { path, source } if source.kind() != ErrorKind::NotFound => {
            CellError::Cgroup {
                path,
                source: std::io::Error::new(
                    source.kind(),
                    format!("{source} (a parent of a container cgroup must hold no process to pass on memory, pids and cpu)"),
                ),
            }
        }
        other => other,
    })
}

#[cfg(test)]
mod tests {
    use super::super::tests::{limits, read, touch, v1_fixture, v2_fixture};
    use super::super::CellCgroup;
    use super::*;

    fn path(text: &str) -> ContainerCgroupPath {
        ContainerCgroupPath::new(PathBuf::from(text)).unwrap()
    }

    /// The fixture's plain control files, so that its directories can be removed.
    fn remove_control_files(dir: &Path) {
        for entry in fs::read_dir(dir).unwrap().flatten() {
            match entry.file_type().unwrap().is_dir() {
                true => remove_control_files(&entry.path()),
                false => fs::remove_file(entry.path()).unwrap(),
            }
        }
    }

    #[test]
    fn only_plain_names_below_the_root_make_a_container_cgroup_path() {
        for bad in ["", "/kubepods/c1", "kubepods/../c1", "./c1", "kubepods/.."] {
            let error = ContainerCgroupPath::new(PathBuf::from(bad)).unwrap_err();
            assert!(error.to_string().contains("plain names"), "{bad}: {error}");
        }
        assert_eq!(path("kubepods/c1").as_path(), Path::new("kubepods/c1"));
    }

    #[test]
    fn v2_puts_the_ceilings_on_the_container_cgroup_and_the_cell_below_it() {
        let (root, layout) = v2_fixture();
        let cgroup =
            CellCgroup::create_in_container(&layout, &path("kubepods/pod1/c1"), &limits()).unwrap();
        let container = root.path().join("kubepods/pod1/c1");
        assert_eq!(cgroup.dirs, vec![container.join(CELL_LEAF)]);
        // Every parent passes the controllers on; the container cgroup does not (it holds
        // the supervisor).
        for parent in ["", "kubepods", "kubepods/pod1"] {
            let control = root.path().join(parent).join("cgroup.subtree_control");
            assert_eq!(read(&control), "+memory +pids +cpu", "{parent}");
        }
        assert!(!container.join("cgroup.subtree_control").exists());
        assert_eq!(
            read(&container.join("memory.max")),
            (256u64 << 20).to_string()
        );
        assert_eq!(read(&container.join("pids.max")), "73", "64 + pid 1 + 8");
        assert!(!container.join(CELL_LEAF).join("memory.max").exists());
        assert_eq!(
            read(&container.join("memory.oom.group")),
            "0",
            "a supervisor the OOM killer may take: no group kill"
        );
        assert_eq!(
            read(&container.join("cgroup.procs")),
            std::process::id().to_string(),
            "the supervisor moved in"
        );
        assert_eq!(cgroup.limit_dirs(), std::slice::from_ref(&container));
    }

    #[test]
    fn v1_gives_the_cell_its_exact_ceilings_and_the_container_the_supervisors_room() {
        let (root, layout) = v1_fixture();
        let cgroup = CellCgroup::create_in_container(&layout, &path("ns/c1"), &limits()).unwrap();
        let pids = root.path().join("pids/ns/c1");
        assert_eq!(read(&pids.join("pids.max")), "73");
        assert_eq!(read(&pids.join("cell/pids.max")), "65");
        let memory = root.path().join("memory/ns/c1");
        let bytes = (256u64 << 20).to_string();
        assert_eq!(read(&memory.join("memory.limit_in_bytes")), bytes);
        assert_eq!(read(&memory.join("cell/memory.limit_in_bytes")), bytes);
        assert_eq!(cgroup.limit_dirs(), cgroup.dirs.as_slice());
        // An OOM counted at either level is the cell's.
        touch(&memory.join("memory.oom_control"), "oom_kill 1\n");
        touch(&memory.join("cell/memory.oom_control"), "oom_kill 2\n");
        assert_eq!(cgroup.usage().oom_kills, 3);
    }

    #[test]
    fn v2_fixes_the_container_pids_ceiling_at_the_cells_plus_the_supervisors_tasks_at_start() {
        let (root, layout) = v2_fixture();
        let cgroup = CellCgroup::create_in_container(&layout, &path("pods/c1"), &limits()).unwrap();
        let container = root.path().join("pods/c1");
        assert_eq!(read(&container.join("pids.max")), "73");
        // Six tasks in the container cgroup: the cell's parked pid 1 and five threads of
        // the supervisor.
        touch(&container.join("pids.current"), "6\n");
        touch(&container.join("cell/cgroup.threads"), "4242\n");
        cgroup.fix_container_pids(65).unwrap();
        assert_eq!(read(&container.join("pids.max")), "70");
    }

    #[test]
    fn v1_keeps_the_container_pids_allowance_since_the_cell_has_its_own_ceiling() {
        let (root, layout) = v1_fixture();
        let cgroup = CellCgroup::create_in_container(&layout, &path("ns/c1"), &limits()).unwrap();
        cgroup.fix_container_pids(65).unwrap();
        assert_eq!(read(&root.path().join("pids/ns/c1/pids.max")), "73");
    }

    #[test]
    fn a_container_cgroup_with_a_process_or_a_child_is_refused_and_left_alone() {
        let (root, layout) = v2_fixture();
        let busy = root.path().join("pods/busy");
        touch(&busy.join("cgroup.procs"), "4242\n");
        let error = CellCgroup::create_in_container(&layout, &path("pods/busy"), &limits())
            .unwrap_err()
            .to_string();
        assert!(error.contains("already holds process 4242"), "{error}");
        assert!(error.contains("pods/busy"), "{error}");
        let taken = root.path().join("pods/taken");
        fs::create_dir_all(taken.join(CELL_LEAF)).unwrap();
        let error = CellCgroup::create_in_container(&layout, &path("pods/taken"), &limits())
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("already has the child cgroup cell"),
            "{error}"
        );
        assert_eq!(read(&busy.join("cgroup.procs")), "4242\n");
        assert!(!busy.join("memory.max").exists(), "nothing written");
    }

    #[test]
    fn an_abandoned_container_cgroup_is_removed_only_when_airlocks_and_empty() {
        let (root, layout) = v2_fixture();
        let abandoned = root.path().join("pods/c1");
        fs::create_dir_all(abandoned.join(CELL_LEAF)).unwrap();
        let live = root.path().join("pods/c2");
        fs::create_dir_all(live.join(CELL_LEAF)).unwrap();
        touch(&live.join("cgroup.procs"), "4242\n");
        let foreign = root.path().join("pods/c3");
        fs::create_dir_all(foreign.join("other")).unwrap();
        fs::create_dir_all(foreign.join(CELL_LEAF)).unwrap();
        for name in ["pods/c1", "pods/c2", "pods/c3", "pods/none"] {
            remove_abandoned(&layout, &path(name)).unwrap();
        }
        assert!(!abandoned.exists(), "airlock's and empty: removed");
        assert!(root.path().join("pods").exists(), "its parent is left");
        assert!(live.join(CELL_LEAF).exists(), "a process in it: left");
        assert!(foreign.join(CELL_LEAF).exists(), "another child: left");
    }

    #[test]
    fn only_what_was_created_is_removed_and_a_parent_still_in_use_is_kept() {
        let (root, layout) = v2_fixture();
        // kubepods existed before; pod1 is created by the first container, and a
        // sibling container still lives in it when the first ends.
        fs::create_dir(root.path().join("kubepods")).unwrap();
        let cgroup =
            CellCgroup::create_in_container(&layout, &path("kubepods/pod1/c1"), &limits()).unwrap();
        fs::create_dir(root.path().join("kubepods/pod1/c2")).unwrap();
        remove_control_files(&root.path().join("kubepods"));
        assert!(cgroup.destroy().is_empty());
        assert!(!root.path().join("kubepods/pod1/c1").exists());
        assert!(root.path().join("kubepods/pod1/c2").exists());
        let cgroup =
            CellCgroup::create_in_container(&layout, &path("kubepods/pod2/c1"), &limits()).unwrap();
        remove_control_files(&root.path().join("kubepods"));
        assert!(cgroup.destroy().is_empty());
        assert!(
            !root.path().join("kubepods/pod2").exists(),
            "created: removed"
        );
        assert!(root.path().join("kubepods").exists(), "there before: kept");
    }
}
