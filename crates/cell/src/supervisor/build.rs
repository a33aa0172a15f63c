//! Driving a cell: the checks before it, the clone, the id maps and the cgroup, the
//! release, its command's start and, whatever happened, its destruction and report.

use super::ceilings::{CellCeilings, PidNamespace};
use super::classify::{classify, Observed};
use super::cpu::{other_cpu, place_payload};
use super::deadline::Deadline;
use super::supervise::{Sinks, Supervision};
use super::{ms_since, CommandIo, EgressSession, PID1_NAME};
use crate::artifacts::ArtifactRequest;
use crate::cgroup::{cgroup_name, CellCgroup, CgroupLayout, ContainerCgroupPath};
use crate::control::SupervisorControl;
use crate::error::CellError;
use crate::host_identity::{HostIdRange, HostIdentity, HostLease, IdentitySource};
use crate::launcher::{self, ChildSetup};
use crate::output::OutputCapture;
use crate::protocol::{CellChannel, CellCommand, Pid1Channel};
use crate::report::{CleanupReport, RequestedCeilings, RlimitsOnlyRecord, RunReport};
use crate::stage::Stage;
use crate::terminal::{CallerTerminal, DEFAULT_WINDOW};
use crate::{rootfs, seccomp, sys};
use airlock_contract::{CellPlan, Rlimit};
use std::fs::File;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// Namespaces created by `clone`. The network namespace, the most expensive to create,
/// is unshared by the child itself while the supervisor writes its id maps and cgroup
/// membership, so the two costs overlap.
const CELL_NAMESPACES: libc::c_ulong = (libc::CLONE_NEWUSER
    | libc::CLONE_NEWNS
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUTS) as libc::c_ulong;

/// What must hold before a cell is cloned, checked once.
pub struct Preflight {
    supervisor: sys::ProcessStat,
    single: sys::SingleThreaded,
    ceilings: Ceilings,
    /// An OCI container's own cgroup (`linux.cgroupsPath`), which then holds the cell.
    container_cgroup: Option<ContainerCgroupPath>,
}

/// What enforces a cell's ceilings.
#[derive(Debug, Clone)]
pub enum Ceilings {
    /// A cgroup of its own: the rule.
    Cgroup(CgroupLayout),
    /// The plan's rlimits only ([`airlock_contract::RlimitsOnly`]): no cgroup is delegated
    /// to the caller, and the operator's class allows that. `why` is the refusal a run
    /// without that permission gets.
    Rlimits { why: String },
}

impl Preflight {
    /// The process is single-threaded (one read of /proc/self/stat serves the check and
    /// the cgroup's name), user namespaces may be created, the cgroups are usable (or the
    /// plan may go without: [`Ceilings::Rlimits`]) and Landlock is new enough. The user
    /// namespace and Landlock checks are doctor's own (crate::preflight).
    pub fn check(plan: &CellPlan) -> Result<Preflight, CellError> {
        let supervisor = sys::process_stat(std::process::id())
            .map_err(|e| CellError::io("/proc/self/stat", e))?;
        let Some(single) = sys::SingleThreaded::from_stat(&supervisor) else {
            return Err(CellError::NotSingleThreaded(supervisor.threads));
        };
        crate::preflight::user_namespaces(sys::geteuid())?;
        let ceilings = match CgroupLayout::detect() {
            Ok(layout) => Ceilings::Cgroup(layout),
            Err(CellError::Unavailable {
                control: control @ "cgroups.delegation",
                reason,
            }) if plan.without_cgroup.is_some() => Ceilings::Rlimits {
                why: format!("{control}: {reason}"),
            },
            Err(err) => return Err(err),
        };
        crate::preflight::landlock()?;
        Ok(Preflight {
            supervisor,
            single,
            ceilings,
            container_cgroup: None,
        })
    }

    /// The cell goes into the container cgroup at `path` (cgroup/container.rs); a cell
    /// without a cgroup of its own cannot (refused, never ignored).
    pub fn in_container_cgroup(
        mut self,
        path: Option<ContainerCgroupPath>,
    ) -> Result<Preflight, CellError> {
        if let (Some(path), Ceilings::Rlimits { why }) = (&path, &self.ceilings) {
            return Err(CellError::ContainerCgroup {
                path: path.as_path().to_path_buf(),
                rule: format!("the cell has no cgroup here ({why})"),
            });
        }
        if let (Some(path), false) = (&path, sys::geteuid() == 0) {
            return Err(CellError::ContainerCgroup {
                path: path.as_path().to_path_buf(),
                rule:
                    "a container cgroup needs root (a user's cells stay in its delegated subtree)"
                        .into(),
            });
        }
        self.container_cgroup = path;
        Ok(self)
    }
}

/// Start milestones measured before the payload's start, in ms since the run started.
#[derive(Default)]
pub struct Milestones {
    pub spawned_ms: f64,
    pub prepared_ms: f64,
    pub recorded_ms: f64,
}

/// A cell cloned and released: it finishes its setup on its own and parks at START.
pub struct Cell<'a> {
    pub supervision: Supervision<'a>,
    /// The cell's own host identity, held until the cell is gone.
    lease: HostLease,
    ceilings: Ceilings,
    /// A reference to the cell's mount namespace (see CellMounts).
    cell_mounts: Option<File>,
    /// The CPUs the payload may use: the supervisor's own.
    payload_cpus: Option<sys::CpuSet>,
    pub milestones: Milestones,
    /// See [`Cell::prepare_supervision`]: the mounts' helper and the cgroups of dead
    /// supervisors' cells that could not be removed.
    prepared: Option<(Option<CellMounts>, Vec<PathBuf>)>,
}

/// What the cell's pid 1 serves once its first command runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pid1Role {
    /// That command only (a one-shot run).
    OneShot,
    /// That command, the container's init, and further commands (EXEC) until it ends:
    /// an OCI runtime's container.
    Container,
    /// Further commands until CLOSE, whichever ends (a session).
    Session,
}

/// Clones the cell, writes its maps, creates and joins its cgroup, and releases it.
pub fn build<'a>(
    plan: &'a CellPlan,
    preflight: Preflight,
    started: Instant,
    (artifacts, on_suspected_escape): (
        Option<ArtifactRequest>,
        Option<crate::evidence::OnSuspectedEscape>,
    ),
    mut caller_terminal: Option<CallerTerminal>,
    role: Pid1Role,
    host_ids: HostIdRange,
) -> Result<Cell<'a>, CellError> {
    let Preflight {
        supervisor,
        single,
        ceilings,
        container_cgroup,
    } = preflight;
    // Held until the cell is gone (Cell::finish); opened before the clone, so the cell's
    // pid 1 holds the slot too (see host_identity.rs).
    let lease = crate::host_identity::lease_for_cell(host_ids)?;
    let host = lease.identity();
    // The cell is cloned next: while it creates its network namespace (the costliest
    // step of a cell start), the supervisor prepares what the release message carries.
    let payload_cpus = sys::allowed_cpus().ok();
    // Decided once, before the clone: in the child, until its maps are written, every id
    // is the overflow id, and its capabilities are those of its new user namespace.
    let clones_in_cell = cell_clones_its_sources();
    // Artifacts and a suspected escape's evidence are read through pid 1's root after
    // the payload ended: pid 1 waits for them. Without the wait, a payload that ends at
    // once can take pid 1 (and its root) with it before a supervisor that waited for a
    // CPU has opened anything.
    let pid1_waits_for_collection = artifacts.is_some() || on_suspected_escape.is_some();
    let spawned = spawn_cell(
        (single, &supervisor.command_line),
        (host, lease.slot_fd()),
        (plan, clones_in_cell, &ceilings),
        pid1_waits_for_collection,
        role,
        payload_cpus.as_ref(),
        caller_terminal.as_mut(),
    )?;
    // The cgroup is created while the cell builds its network namespace; the cell only
    // runs airlock's setup until it has joined it.
    let cgroup = match cell_ceilings(
        &ceilings,
        plan,
        (&supervisor, container_cgroup.as_ref()),
        spawned.pid,
    ) {
        Ok(cgroup) => cgroup,
        Err(err) => {
            kill_and_reap(&spawned.pidfd, spawned.pid);
            return Err(err);
        }
    };
    // A reference to the cell's mount namespace: pid 1's exit then does not unmount the
    // cell's ~30 mounts (an RCU grace period among them) before the supervisor learns of
    // it; see CellMounts.
    let cell_mounts = File::open(format!("/proc/{}/ns/mnt", spawned.pid)).ok();
    let abandon = |spawned: &SpawnedCell, cgroup: CellCeilings, err: CellError| {
        kill_and_reap(&spawned.pidfd, spawned.pid);
        cgroup.destroy();
        err
    };
    // The device nodes go with the maps: the cell builds /dev and masks /proc with them
    // before the release.
    // The cgroup exists by now: such a cell clones its view of it with everything else.
    let devices = if clones_in_cell {
        Ok(rootfs::deferred_cgroup_view(plan, &cgroup.view()))
    } else {
        rootfs::prepare_devices(plan)
    };
    let mapped = devices
        .map_err(launch_error)
        .and_then(|devices| {
            write_id_maps(spawned.pid, plan, host)?;
            spawned
                .sync
                .maps_written(devices)
                .map_err(|e| CellError::io("signalling the cell", e))
        })
        // The cell joins its cgroup now; it only runs airlock's setup until the release.
        .and_then(|_| cgroup.add_process(spawned.pid));
    if let Err(err) = mapped {
        return Err(abandon(&spawned, cgroup, err));
    }
    let spawned_ms = ms_since(started);
    let prepared = seccomp::program(&plan.seccomp).and_then(|program| {
        let cell_ids = (host.source == IdentitySource::Pool).then_some((host.uid, host.gid));
        if clones_in_cell {
            return Ok((program, Vec::new(), Vec::new()));
        }
        let (mut mounts, notes) = rootfs::prepare_sources(plan, cell_ids).map_err(launch_error)?;
        mounts.extend(rootfs::prepare_cgroup_view(plan, &cgroup.view()).map_err(launch_error)?);
        Ok((program, mounts, notes))
    });
    let prepared_ms = ms_since(started);
    let (program, mounts, notes) = match prepared {
        Ok(prepared) => prepared,
        Err(err) => return Err(abandon(&spawned, cgroup, err)),
    };
    // The cell finishes its setup (root, privileges, Landlock, seccomp) on its own CPU
    // while this thread goes on (the CLI writes the audit record); only the payload's
    // start waits. A failed send means the cell already ended (its setup failed, and it
    // said why on the socket): the supervision loop reads that and reports it.
    let _ = spawned.sync.release(&program, mounts);
    let released_ms = ms_since(started);
    let supervision = Supervision {
        plan,
        host,
        pid: spawned.pid,
        pidfd: spawned.pidfd,
        sync: Some(spawned.sync),
        ceilings: cgroup,
        stdout: None,
        stderr: None,
        sinks: Sinks::default(),
        output: OutputCapture::new(plan.limits.output_bytes),
        observed: Observed {
            released_ms,
            notes,
            shm_bytes: plan.limits.shm_bytes,
            ..Observed::default()
        },
        deadline: Deadline::Unset,
        stdin_relay: None,
        terminal_input: None,
        terminal: None,
        caller_terminal,
        window: None,
        caller: None,
        artifacts,
        parked: false,
        on_suspected_escape,
        pid1_waits_for_collection,
        door: None,
        interrupts: None,
    };
    Ok(Cell {
        supervision,
        lease,
        ceilings,
        cell_mounts,
        payload_cpus,
        milestones: Milestones {
            spawned_ms,
            prepared_ms,
            recorded_ms: 0.0,
        },
        prepared: None,
    })
}

impl Cell<'_> {
    /// Kills a cell whose command must not start and removes its cgroup; `err` says why.
    pub fn abandon(self, err: CellError) -> CellError {
        kill_and_reap(&self.supervision.pidfd, self.supervision.pid);
        let _ = self.supervision.ceilings.wait_empty(Duration::from_secs(5));
        self.supervision.ceilings.destroy();
        err
    }

    /// Starts `command` (the audit record `run_id` exists) with `limits` (wall time,
    /// output bytes) and supervises it until pid 1 is gone. Returns the cgroups of dead
    /// supervisors' cells that could not be removed meanwhile.
    pub fn run_command(
        &mut self,
        run_id: String,
        command: CellCommand,
        io: CommandIo,
        limits: (u64, u64),
        egress: &mut Option<&mut dyn EgressSession>,
        control: Option<&SupervisorControl>,
    ) -> Result<Vec<PathBuf>, CellError> {
        let id = command.id;
        self.supervise_with(
            |supervision| {
                supervision.observed.run_id = run_id;
                supervision.start(command, io, limits.0, limits.1);
            },
            |supervision| supervision.run(egress, control, Some(id)),
        )
    }

    /// What supervising needs besides the command, done before it arrives where there is
    /// time (a parked cell waiting for its claim): the helper that holds the cell's
    /// mounts (see CellMounts), and the reaping of dead supervisors' cells (which must not
    /// keep running or holding resources). A cold run does it while its payload starts.
    pub fn prepare_supervision(&mut self) {
        if self.prepared.is_some() {
            return;
        }
        let cell_mounts = self.cell_mounts.take().and_then(CellMounts::hold);
        let stale = match &self.ceilings {
            Ceilings::Cgroup(layout) => crate::cgroup::reap_leftovers(layout),
            Ceilings::Rlimits { .. } => Vec::new(),
        };
        self.prepared = Some((cell_mounts, stale));
    }

    /// Gives the payload its CPUs, runs `start` (which may start the cell's first
    /// command), then `supervise` (which returns once pid 1 is gone) while the cell's
    /// mounts are held and the cells of dead supervisors are reaped. Returns the cgroups
    /// of those that could not be removed.
    pub fn supervise_with(
        &mut self,
        start: impl FnOnce(&mut Supervision<'_>),
        supervise: impl FnOnce(&mut Supervision<'_>) -> Result<(), CellError>,
    ) -> Result<Vec<PathBuf>, CellError> {
        if let Some(cpus) = &self.payload_cpus {
            place_payload(
                self.supervision.pid,
                cpus,
                self.supervision.plan.limits.cpu_millis,
            );
        }
        start(&mut self.supervision);
        // Started while the payload starts, unless already done while parked.
        self.prepare_supervision();
        let (cell_mounts, stale) = self.prepared.take().unwrap_or_default();
        let ran = supervise(&mut self.supervision);
        // pid 1 is gone: the mounts go while the cgroup is torn down and the result is
        // recorded.
        if let Some(mounts) = cell_mounts {
            mounts.release(self.payload_cpus.as_ref());
        }
        ran.map(|()| stale)
    }

    /// Tears the cell's cgroup down and turns what was observed into the report.
    /// Whatever happened, nothing of the cell outlives this function.
    pub fn finish(
        self,
        ran: Result<Vec<PathBuf>, CellError>,
        egress: &mut Option<&mut dyn EgressSession>,
        started: Instant,
    ) -> RunReport {
        let Cell {
            mut supervision,
            lease,
            ceilings,
            milestones,
            ..
        } = self;
        let teardown_started = Instant::now();
        // Usually pid 1's exit already emptied the cgroup; `wait_empty` only kills (and on
        // v1 freezes, which is costly) when something is left.
        let emptied = supervision.ceilings.wait_empty(Duration::from_secs(5));
        let usage_counters = supervision.ceilings.usage();
        let mut leftovers: Vec<String> = Vec::new();
        if !emptied {
            leftovers.extend(
                supervision
                    .ceilings
                    .pids()
                    .iter()
                    .map(|p| format!("process {p}")),
            );
        }
        supervision.collect_after_cell_died();
        let writable = std::mem::take(&mut supervision.observed.writable_mounts);
        let on_suspected_escape = supervision.on_suspected_escape.take();
        let egress = egress.as_mut().map(|session| session.finish());
        let Supervision {
            plan,
            ceilings: cgroup,
            observed,
            output,
            ..
        } = supervision;
        leftovers.extend(
            cgroup
                .destroy()
                .into_iter()
                .map(|d| format!("cgroup {}", d.display())),
        );
        let mut report = match ran {
            Ok(stale) => {
                let mut report = classify(started, observed, output, usage_counters, egress);
                // Before the held writable paths go (with `writable`, at the end of this
                // scope): the evidence of a suspected escape.
                let suspected = report.status == crate::report::ResultClass::SuspectedEscape;
                crate::evidence::on_verdict(suspected, writable, on_suspected_escape.as_ref());
                record_ceilings(&mut report, &ceilings, plan);
                report.stale_cgroups_left = stale.iter().map(|d| d.display().to_string()).collect();
                report
            }
            Err(err) => RunReport::refused("", err.class(), err.to_string()),
        };
        let host = lease.identity();
        // Clean only when nothing of the cell can be left (see host_identity.rs).
        let gone = leftovers.is_empty();
        lease.release(gone);
        report.host_identity = Some(host);
        report.cleanup = CleanupReport {
            ok: gone,
            leftovers,
        };
        report.timings.spawned_ms = milestones.spawned_ms;
        report.timings.recorded_ms = milestones.recorded_ms;
        report.timings.prepared_ms = milestones.prepared_ms;
        report.timings.teardown_ms = ms_since(teardown_started);
        report.timings.wall_ms = ms_since(started);
        report
    }
}

/// The last reference to the cell's mount namespace, held by a helper thread until the
/// cell is gone. Dropping it unmounts the cell's mounts and shuts their file systems
/// down (about 0.3 ms with an RCU grace period, on this project's VM); on the helper, on
/// another CPU, that overlaps the teardown and the result's record instead of delaying
/// the process's exit. Should the process exit first, the kernel drops the reference.
struct CellMounts {
    helper_tid: std::sync::mpsc::Receiver<libc::pid_t>,
    release: std::sync::mpsc::SyncSender<()>,
}

impl CellMounts {
    fn hold(mounts: File) -> Option<CellMounts> {
        let (tid_sender, helper_tid) = std::sync::mpsc::sync_channel(1);
        let (release, released) = std::sync::mpsc::sync_channel::<()>(1);
        std::thread::Builder::new()
            .name("cell-mounts".into())
            .spawn(move || {
                let _ = tid_sender.send(sys::gettid());
                // Released, or the supervisor is done with it (its end dropped): either
                // way the reference goes now.
                let _ = released.recv();
                drop(mounts);
            })
            .ok()?;
        Some(CellMounts {
            helper_tid,
            release,
        })
    }

    /// Moves the helper to another of `cpus` (see [`other_cpu`]: queued behind the
    /// supervisor, it would run only when the supervisor exits, which then waits for it),
    /// then wakes it.
    fn release(self, cpus: Option<&sys::CpuSet>) {
        if let (Ok(tid), Some(cpu)) = (self.helper_tid.try_recv(), cpus.and_then(other_cpu)) {
            let _ = sys::set_affinity(tid, &sys::CpuSet::only(cpu));
        }
        let _ = self.release.send(());
    }
}

/// The cell's cgroup, created with its limits, or (rlimits only) its pid namespace.
fn cell_ceilings(
    ceilings: &Ceilings,
    plan: &CellPlan,
    (supervisor, container): (&sys::ProcessStat, Option<&ContainerCgroupPath>),
    pid: libc::pid_t,
) -> Result<CellCeilings, CellError> {
    match (ceilings, container) {
        (Ceilings::Cgroup(layout), Some(path)) => {
            CellCgroup::create_in_container(layout, path, &plan.limits).map(CellCeilings::Cgroup)
        }
        (Ceilings::Cgroup(layout), None) => {
            CellCgroup::create(layout, &cgroup_name(supervisor.start_time), &plan.limits)
                .map(CellCeilings::Cgroup)
        }
        // Preflight::in_container_cgroup refused a container cgroup without a cgroup.
        (Ceilings::Rlimits { .. }, _) => PidNamespace::of(pid).map(CellCeilings::Rlimits),
    }
}

/// What enforced the ceilings, in the report: the cgroup version, or what the contract
/// requested, what rlimits enforced instead and what they do not.
fn record_ceilings(report: &mut RunReport, ceilings: &Ceilings, plan: &CellPlan) {
    match (ceilings, &plan.without_cgroup) {
        (Ceilings::Cgroup(layout), _) => report.cgroup_version = Some(layout.version()),
        (Ceilings::Rlimits { why }, Some(granted)) => {
            report.rlimits_only = Some(RlimitsOnlyRecord {
                why: why.clone(),
                requested: RequestedCeilings::of(&plan.limits),
                granted: granted.clone(),
            });
        }
        // Preflight chooses rlimits only for a plan that allows them.
        (Ceilings::Rlimits { .. }, None) => {}
    }
}

/// The rlimits of the cell's pid 1 and of each payload process.
fn cell_rlimits(plan: &CellPlan, ceilings: &Ceilings) -> (Vec<Rlimit>, Vec<Rlimit>) {
    match (ceilings, &plan.without_cgroup) {
        (Ceilings::Rlimits { .. }, Some(granted)) => (
            granted.cell_rlimits(&plan.layout.rlimits),
            granted.payload_rlimits(),
        ),
        (Ceilings::Cgroup(_), _) | (Ceilings::Rlimits { .. }, None) => {
            (plan.layout.rlimits.clone(), Vec::new())
        }
    }
}

fn launch_error(stage: Stage) -> CellError {
    if stage.unavailable {
        CellError::Unavailable {
            control: "kernel",
            reason: format!("{}: {}", stage.name, stage.message),
        }
    } else {
        CellError::Launch {
            stage: stage.name,
            message: stage.message,
        }
    }
}

/// Writes the user namespace maps of the child: the cell identity maps to its own host
/// ids, which are never root.
fn write_id_maps(pid: libc::pid_t, plan: &CellPlan, host: HostIdentity) -> Result<(), CellError> {
    let write = |file: &str, text: String| {
        std::fs::write(format!("/proc/{pid}/{file}"), text)
            .map_err(|e| CellError::io(format!("writing {file} of the cell"), e))
    };
    write("setgroups", "deny".into())?;
    write("uid_map", format!("{} {} 1\n", plan.identity.uid, host.uid))?;
    write("gid_map", format!("{} {} 1\n", plan.identity.gid, host.gid))
}

/// Gives the cell's ends of a command's stdio pipes to the cell identity. A pipe is
/// created owned by its creator with mode 0600, and re-opening it through `/dev/stdin`
/// (that is, `/proc/self/fd/0`) checks that mode: owned by root outside the cell's maps,
/// a payload could use its fd 0/1/2 but not `/dev/stdin`, `/dev/stdout` or
/// `/dev/stderr`. Owned by the cell identity, still 0600, nobody else gains access.
pub(crate) fn give_pipes_to_cell(host: HostIdentity, ends: &[&OwnedFd]) -> Result<(), CellError> {
    if host.source != IdentitySource::Pool {
        // Created by the caller's uid, which is what the cell identity maps to.
        return Ok(());
    }
    for end in ends.iter() {
        sys::fchown(end.as_fd(), host.uid, host.gid)
            .map_err(|e| CellError::io("chown of a pipe", e))?;
    }
    Ok(())
}

/// A cloned cell waiting for its maps, with the supervisor's end of its socket.
struct SpawnedCell {
    pid: libc::pid_t,
    pidfd: OwnedFd,
    sync: CellChannel,
}

/// Kills a cell whose payload must not start (or that will not even be released) and
/// reaps its pid 1.
fn kill_and_reap(pidfd: &OwnedFd, pid: libc::pid_t) {
    let _ = sys::pidfd_send_signal(pidfd.as_fd(), libc::SIGKILL);
    let _ = sys::wait_child(pid, false);
}

/// Clones the cell. `supervisor` is this process: the proof that it is single-threaded
/// and its command line area (which pid 1 overwrites); `host` the cell's host identity
/// and the lock file of its slot (which pid 1 keeps open).
/// open_tree(OPEN_TREE_CLONE) needs CAP_SYS_ADMIN over the host's mount namespace: a
/// supervisor without it (not root, or root in a container) leaves the cloning to the
/// cell, in its own.
fn cell_clones_its_sources() -> bool {
    !crate::privilege::can_clone_mount_trees()
}

fn spawn_cell(
    (single, supervisor_command_line): (sys::SingleThreaded, &sys::CommandLineArea),
    (host, slot): (HostIdentity, Option<RawFd>),
    (plan, clones_in_cell, ceilings): (&CellPlan, bool, &Ceilings),
    waits_for_collection: bool,
    role: Pid1Role,
    payload_cpus: Option<&sys::CpuSet>,
    caller_terminal: Option<&mut CallerTerminal>,
) -> Result<SpawnedCell, CellError> {
    let window = caller_terminal
        .as_ref()
        .map_or(DEFAULT_WINDOW, |t| t.window());
    let (sync_parent, sync_child) =
        sys::seqpacket_pair().map_err(|e| CellError::io("socketpair", e))?;
    // START carries the command: sized like the engine's sockets.
    crate::control::size_for_commands(sync_parent.as_fd());
    let null: OwnedFd = File::open("/dev/null")
        .map_err(|e| CellError::io("/dev/null", e))?
        .into();
    if sys::geteuid() == 0 {
        // Supplementary groups survive into the user namespace and cannot be dropped there.
        sys::clear_supplementary_groups().map_err(|e| CellError::io("setgroups", e))?;
    }
    let setup_cpu = payload_cpus.and_then(other_cpu);
    let (rlimits, payload_rlimits) = cell_rlimits(plan, ceilings);
    // A pod's namespaces are joined for the clone only (pod_network.rs), and the clone
    // does not create those.
    let pod_network = crate::pod_network::enter(&plan.network)?;
    let joined = crate::pod_network::joined_flags(&plan.network) as libc::c_ulong;
    // pid 1 is a clone of this process, not an exec: without a name of its own its
    // /proc/1/cmdline would show the payload this process's command line, host paths of
    // the contract, the operator config and the state dir among it.
    // Created with the cell's host ids, so that they own its user namespace.
    let cloned = crate::host_identity::clone_owned_by(host, || {
        sys::clone_single_threaded(
            single,
            CELL_NAMESPACES & !joined,
            supervisor_command_line,
            PID1_NAME,
        )
    });
    let cloned = match pod_network {
        // The child stays: the pod's namespaces are its own from now on.
        Some(joined) if !matches!(cloned, Ok(Ok(sys::CloneOutcome::Child))) => {
            if let Err(err) = joined.leave() {
                if let Ok(Ok(sys::CloneOutcome::Parent { pid, pidfd })) = &cloned {
                    kill_and_reap(pidfd, *pid);
                }
                return Err(err);
            }
            cloned?
        }
        _ => cloned?,
    };
    match cloned {
        Ok(sys::CloneOutcome::Child) => {
            // No handle to the caller's stdin, terminal or output, or to an engine's
            // control socket, stays in the cell: only its socket and the null device.
            if let Some(terminal) = caller_terminal {
                terminal.forget();
            }
            // pid 1 keeps the host identity's slot too: it is held while pid 1 lives.
            let keep: Vec<RawFd> = [sync_child.as_raw_fd(), null.as_raw_fd()]
                .into_iter()
                .chain(slot)
                .collect();
            if sys::close_fds_except(&keep).is_err() {
                sys::exit_now(125);
            }
            std::mem::forget(sync_parent);
            launcher::run(ChildSetup {
                plan,
                sync: Pid1Channel::new(sync_child),
                null,
                waits_for_collection,
                session: role == Pid1Role::Session,
                serves_execs: role == Pid1Role::Container,
                setup_cpu,
                window,
                clones_in_cell,
                rlimits,
                payload_rlimits,
            })
        }
        Ok(sys::CloneOutcome::Parent { pid, pidfd }) => {
            if let Some(cpu) = setup_cpu {
                let _ = sys::set_affinity(pid, &sys::CpuSet::only(cpu));
            }
            Ok(SpawnedCell {
                pid,
                pidfd,
                sync: CellChannel::new(sync_parent),
            })
        }
        Err(e) => Err(CellError::Unavailable {
            control: "namespaces",
            reason: format!(
                "clone of a cell with user, mount, pid, ipc and uts namespaces failed: {e}"
            ),
        }),
    }
}
