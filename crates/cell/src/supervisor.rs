//! The trusted side of a run: prepares everything a cell needs, clones it, releases it,
//! streams its output, enforces the deadline from outside, collects artifacts, destroys it
//! and derives the result. Poll-driven. The process must be single-threaded when the
//! cell is cloned (checked); after that the egress proxy runs on its own thread and a
//! helper thread holds the cell's mount namespace (see CellMounts).

use crate::artifacts::{self, ArtifactRequest};
use crate::cgroup::{cgroup_name, CellCgroup, CgroupLayout};
use crate::error::CellError;
use crate::launcher::{self, ChildSetup, Stage};
use crate::output::{OutputCapture, Stream};
use crate::protocol::{self, LaunchFailure, PayloadEnded};
use crate::report::{Ceiling, CleanupReport, ExitInfo, ResultClass, RunReport, Timings, Usage};
use crate::{rootfs, seccomp, sys};
use airlock_contract::{CellPlan, SeccompPlan};
use std::ffi::CString;
use std::fs::File;
use std::io::Write;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::time::{Duration, Instant};

/// Time between SIGTERM at the deadline and SIGKILL of the whole cell.
pub const TERM_GRACE: Duration = Duration::from_millis(1000);
/// After the payload and its descendants are killed, how long the cell's pid 1 gets to
/// reap them and report (so the payload's status and CPU time are known) before it is
/// killed too.
const REAPER_GRACE: Duration = Duration::from_millis(300);

/// Where the deadline enforcement stands.
#[derive(Debug, Clone, Copy)]
enum Deadline {
    Pending(Instant),
    /// SIGTERM sent at the deadline; SIGKILL when the grace period ends.
    Terminating(Instant),
    /// Everything but pid 1 killed; pid 1 itself is killed at this instant.
    Reaping(Instant),
    Done,
}

/// What `/proc/1/comm` and `/proc/1/cmdline` of a cell read.
pub const PID1_NAME: &std::ffi::CStr = c"airlock-init";

/// Host ids of cell identities when airlock runs as root: cell uid N is host uid
/// `HOST_ID_BASE + N`, far away from real users and never 0.
pub const HOST_ID_BASE: u32 = 1_000_000_000;
/// Longest we wait for the cell's pipes to close after its pid 1 is gone.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(2);
/// Bytes read from the payload's stdout or stderr at a time (a full pipe).
const OUTPUT_CHUNK: usize = 64 * 1024;

/// The egress proxy, started once the cell hands over its listeners.
pub trait EgressSession {
    /// Takes the listening sockets (HTTP proxy, SOCKS5) bound inside the cell's netns.
    fn start(&mut self, http: OwnedFd, socks: OwnedFd) -> Result<(), String>;
    /// Stops the proxy and summarises what it saw.
    fn finish(&mut self) -> EgressSummary;
}

/// What the egress proxy reports for the result.
#[derive(Debug, Default)]
pub struct EgressSummary {
    /// One record per connection attempt.
    pub records: serde_json::Value,
    pub denials: usize,
    /// Attempts to reach a cloud metadata endpoint: behaviour aimed at the boundary.
    pub metadata_probes: usize,
}

/// Called once the cell is released and before its payload starts. The CLI writes the
/// audit record here, overlapping the write with the cell's own setup; an error refuses
/// the run (the cell is killed before the payload could start).
pub type BeforeStart<'a> = &'a mut dyn FnMut() -> Result<String, String>;

pub struct RunOptions<'a> {
    pub before_start: Option<BeforeStart<'a>>,
    /// When the run started (the CLI passes its own start so startup covers everything).
    pub started: Instant,
    pub egress: Option<&'a mut dyn EgressSession>,
    pub artifacts: Option<ArtifactRequest>,
    /// Forward the payload's output to our stdout/stderr as it arrives.
    pub stream_output: bool,
    /// The payload's stdin. `None`: our stdin when it is a pipe or file, /dev/null when
    /// it is a terminal.
    pub stdin: Option<OwnedFd>,
    /// `(variable, value)` of every credential of the plan, from [`credential_env`].
    pub credentials: &'a [(String, String)],
}

/// Values taken from the supervisor's environment for the plan's credentials.
pub fn credential_env(plan: &CellPlan) -> Result<Vec<(String, String)>, CellError> {
    plan.credentials
        .iter()
        .map(|c| match std::env::var(&c.from_env) {
            Ok(value) => Ok((c.env.clone(), value)),
            Err(_) => Err(CellError::MissingCredential {
                name: c.name.clone(),
                from_env: c.from_env.clone(),
            }),
        })
        .collect()
}

/// The payload's environment: the plan's variables plus the credential values the caller
/// resolved (see [`credential_env`]); a credential of the plan without a value refuses
/// the run.
fn cell_environment(
    plan: &CellPlan,
    credentials: &[(String, String)],
) -> Result<Vec<CString>, CellError> {
    if let Some(missing) = plan
        .credentials
        .iter()
        .find(|c| !credentials.iter().any(|(env, _)| *env == c.env))
    {
        return Err(CellError::MissingCredential {
            name: missing.name.clone(),
            from_env: missing.from_env.clone(),
        });
    }
    Ok(plan
        .env
        .iter()
        .map(|v| (v.name.as_str(), v.value.as_str()))
        .chain(credentials.iter().map(|(n, v)| (n.as_str(), v.as_str())))
        .filter_map(|(n, v)| CString::new(format!("{n}={v}")).ok())
        .collect())
}

fn seccomp_program(plan: &CellPlan) -> Result<Vec<libc::sock_filter>, CellError> {
    let policy = match &plan.seccomp {
        SeccompPlan::Default => return Ok(seccomp::default_program()),
        SeccompPlan::DockerJson { path } => {
            let json = std::fs::read_to_string(path)
                .map_err(|e| CellError::io(format!("seccomp profile {}", path.display()), e))?;
            seccomp::policy_from_docker_json(&json)?
        }
    };
    Ok(seccomp::compile(&policy)?)
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

/// Writes the user namespace maps of the child: the cell identity maps to one host id,
/// which is never root.
fn write_id_maps(pid: libc::pid_t, plan: &CellPlan) -> Result<(), CellError> {
    let (host_uid, host_gid) = if sys::geteuid() == 0 {
        (
            HOST_ID_BASE + plan.identity.uid,
            HOST_ID_BASE + plan.identity.gid,
        )
    } else {
        (sys::geteuid(), sys::getegid())
    };
    let write = |file: &str, text: String| {
        std::fs::write(format!("/proc/{pid}/{file}"), text)
            .map_err(|e| CellError::io(format!("writing {file} of the cell"), e))
    };
    write("setgroups", "deny".into())?;
    write("uid_map", format!("{} {host_uid} 1\n", plan.identity.uid))?;
    write("gid_map", format!("{} {host_gid} 1\n", plan.identity.gid))
}

struct Pipes {
    stdout_read: OwnedFd,
    stdout_write: OwnedFd,
    stderr_read: OwnedFd,
    stderr_write: OwnedFd,
    notify_read: OwnedFd,
    notify_write: OwnedFd,
    sync_parent: OwnedFd,
    sync_child: OwnedFd,
    stdin: OwnedFd,
}

fn open_pipes(stdin: Option<OwnedFd>) -> Result<Pipes, CellError> {
    let pipe = || sys::pipe_cloexec().map_err(|e| CellError::io("pipe", e));
    let (stdout_read, stdout_write) = pipe()?;
    let (stderr_read, stderr_write) = pipe()?;
    let (notify_read, notify_write) = pipe()?;
    let (sync_parent, sync_child) =
        sys::seqpacket_pair().map_err(|e| CellError::io("socketpair", e))?;
    // A terminal on stdin would give the cell a handle to the caller's tty; only pipes and
    // files are passed through.
    let stdin = if let Some(fd) = stdin {
        fd
    } else if sys::isatty(0) {
        File::open("/dev/null")
            .map_err(|e| CellError::io("/dev/null", e))?
            .into()
    } else {
        std::io::stdin()
            .as_fd()
            .try_clone_to_owned()
            .map_err(|e| CellError::io("stdin", e))?
    };
    Ok(Pipes {
        stdout_read,
        stdout_write,
        stderr_read,
        stderr_write,
        notify_read,
        notify_write,
        sync_parent,
        sync_child,
        stdin,
    })
}

/// Namespaces created by `clone`. The network namespace, the most expensive to create,
/// is unshared by the child itself while the supervisor writes its id maps and cgroup
/// membership, so the two costs overlap.
const CELL_NAMESPACES: libc::c_ulong = (libc::CLONE_NEWUSER
    | libc::CLONE_NEWNS
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUTS) as libc::c_ulong;

/// What happened while the cell ran.
#[derive(Default)]
struct Observed {
    exec_done_at: Option<Instant>,
    exec_error: Option<String>,
    launch_failure: Option<LaunchFailure>,
    ended: Option<PayloadEnded>,
    deadline_fired: bool,
    pid1_status: Option<i32>,
    rusage: Option<libc::rusage>,
    egress_error: Option<String>,
    artifacts: serde_json::Value,
    run_id: String,
    released_ms: f64,
    ended_at: Option<Instant>,
}

/// Runs `plan` in a fresh cell. Never panics on cell failures: every outcome, including
/// airlock's own errors, becomes a [`RunReport`].
pub fn run_cell(plan: &CellPlan, mut options: RunOptions<'_>) -> RunReport {
    match start_and_supervise(plan, &mut options) {
        Ok(report) => report,
        Err(err) => {
            let mut report = RunReport::refused("", err.class(), err.to_string());
            report.timings.wall_ms = ms_since(options.started);
            report
        }
    }
}

fn ms_since(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1000.0
}

fn start_and_supervise(
    plan: &CellPlan,
    options: &mut RunOptions<'_>,
) -> Result<RunReport, CellError> {
    // One read of /proc/self/stat serves the check and the cgroup's name.
    let supervisor =
        sys::process_stat(std::process::id()).map_err(|e| CellError::io("/proc/self/stat", e))?;
    if supervisor.threads != 1 {
        return Err(CellError::NotSingleThreaded(supervisor.threads));
    }
    let layout = CgroupLayout::detect()?;
    if crate::landlock_policy::kernel_abi() < crate::landlock_policy::REQUIRED_ABI as i64 {
        return Err(CellError::Unavailable {
            control: "landlock",
            reason: format!(
                "kernel offers Landlock ABI {}, the cell needs ABI {} (Linux 6.12)",
                crate::landlock_policy::kernel_abi(),
                crate::landlock_policy::REQUIRED_ABI as i64
            ),
        });
    }
    let env = cell_environment(plan, options.credentials)?;
    // The cell is cloned next: while it creates its network namespace (the costliest
    // step of a cell start), the supervisor prepares what the release message carries.
    // The CPUs the payload may use: the supervisor's own.
    let payload_cpus = sys::allowed_cpus().ok();
    let cell = spawn_cell(
        plan,
        &env,
        options,
        payload_cpus.as_ref(),
        &supervisor.command_line,
    )?;
    // The cgroup is created while the cell builds its network namespace; the cell only
    // runs airlock's setup until it has joined it.
    let cgroup =
        match CellCgroup::create(&layout, &cgroup_name(supervisor.start_time), &plan.limits) {
            Ok(cgroup) => cgroup,
            Err(err) => {
                kill_and_reap(&cell.pidfd, cell.pid);
                return Err(err);
            }
        };
    // A reference to the cell's mount namespace: pid 1's exit then does not unmount the
    // cell's ~30 mounts (an RCU grace period among them) before the supervisor learns of
    // it; see CellMounts.
    let cell_mounts = std::fs::File::open(format!("/proc/{}/ns/mnt", cell.pid)).ok();
    let started = options.started;
    let hook = options.before_start.take();
    // The device nodes go with the maps: the cell builds /dev and masks /proc with them
    // before the release.
    let mapped = rootfs::prepare_devices()
        .map_err(launch_error)
        .and_then(|devices| {
            write_id_maps(cell.pid, plan)?;
            let (message, fds) = protocol::encode_mapped(devices);
            let raw: Vec<i32> = fds.iter().map(|f| f.as_raw_fd()).collect();
            sys::send_with_fds(cell.sync.as_fd(), &message, &raw)
                .map_err(|e| CellError::io("signalling the cell", e))
        })
        // The cell joins its cgroup now; it only runs airlock's setup until the release.
        .and_then(|_| cgroup.add_process(cell.pid));
    if let Err(err) = mapped {
        kill_and_reap(&cell.pidfd, cell.pid);
        cgroup.destroy();
        return Err(err);
    }
    let spawned_ms = ms_since(started);
    let prepared = seccomp_program(plan).and_then(|program| {
        let mounts = rootfs::prepare_sources(plan).map_err(launch_error)?;
        Ok(Release { program, mounts })
    });
    let prepared_ms = ms_since(started);
    let release_message = match prepared {
        Ok(prepared) => prepared,
        Err(err) => {
            kill_and_reap(&cell.pidfd, cell.pid);
            cgroup.destroy();
            return Err(err);
        }
    };
    // The cell finishes its setup (root, privileges, Landlock, seccomp) on its own
    // CPU while this thread writes the audit record; only the payload's start
    // waits for the record. The record comes after the release, not on a thread
    // of its own started earlier: the two CPUs are then used by one task each,
    // and the release is not delayed by the record's share of this CPU.
    let mut supervision = release_cell(plan, options, cell, &cgroup, release_message);
    let (recorded, recorded_ms) = match hook {
        None => (Ok(String::new()), 0.0),
        Some(hook) => (
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(hook))
                .unwrap_or_else(|_| Err("the audit hook panicked".to_string())),
            ms_since(started),
        ),
    };
    let milestones = StartMilestones {
        spawned_ms,
        recorded_ms,
        prepared_ms,
    };
    let result = match recorded {
        Ok(run_id) => {
            supervision.observed.run_id = run_id;
            if let Some(cpus) = &payload_cpus {
                // The payload gets the caller's CPUs back (see other_cpu).
                let _ = sys::set_affinity(supervision.pid, cpus);
            }
            supervision.start_payload();
            // Started while the payload runs: the helper has reported its thread id
            // long before it is needed.
            let cell_mounts = cell_mounts.and_then(CellMounts::hold);
            // Cells of supervisors that died must not keep running or holding
            // resources; reaped while the payload runs, off the start's path.
            let stale_cgroups_left = crate::cgroup::reap_leftovers(&layout);
            let ran = supervision.run(options);
            // pid 1 is gone: the mounts go while the cgroup is torn down and the
            // result is recorded.
            if let Some(mounts) = cell_mounts {
                mounts.release(payload_cpus.as_ref());
            }
            ran.map(|()| (supervision.observed, supervision.output, stale_cgroups_left))
        }
        Err(err) => {
            // No record, no payload: the cell never got START.
            kill_and_reap(&supervision.pidfd, supervision.pid);
            Err(CellError::Refused(err))
        }
    };
    finish_run(options, &layout, cgroup, result, milestones)
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
    fn hold(mounts: std::fs::File) -> Option<CellMounts> {
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

/// Tears the cell's cgroup down and turns what was observed into the report.
fn finish_run(
    options: &mut RunOptions<'_>,
    layout: &CgroupLayout,
    cgroup: CellCgroup,
    result: Result<(Observed, OutputCapture, Vec<std::path::PathBuf>), CellError>,
    milestones: StartMilestones,
) -> Result<RunReport, CellError> {
    // Whatever happened, nothing of the cell may outlive this function.
    let teardown_started = Instant::now();
    // Usually pid 1's exit already emptied the cgroup; `wait_empty` only kills (and on v1
    // freezes, which is costly) when something is left.
    let emptied = cgroup.wait_empty(Duration::from_secs(5));
    let usage_counters = cgroup.usage();
    let mut leftovers: Vec<String> = Vec::new();
    if !emptied {
        leftovers.extend(cgroup.pids().iter().map(|p| format!("process {p}")));
    }
    leftovers.extend(
        cgroup
            .destroy()
            .into_iter()
            .map(|d| format!("cgroup {}", d.display())),
    );
    let (observed, output, stale_cgroups_left) = result?;
    let egress = options.egress.as_mut().map(|session| session.finish());
    let mut report = classify(options, observed, output, usage_counters, egress);
    report.cgroup_version = Some(layout.version());
    report.stale_cgroups_left = stale_cgroups_left
        .iter()
        .map(|d| d.display().to_string())
        .collect();
    report.cleanup = CleanupReport {
        ok: leftovers.is_empty(),
        leftovers,
    };
    report.timings.spawned_ms = milestones.spawned_ms;
    report.timings.recorded_ms = milestones.recorded_ms;
    report.timings.prepared_ms = milestones.prepared_ms;
    report.timings.teardown_ms = ms_since(teardown_started);
    report.timings.wall_ms = ms_since(options.started);
    Ok(report)
}

/// A cloned cell waiting for its release message, with the supervisor's ends of its pipes.
struct SpawnedCell {
    pid: libc::pid_t,
    pidfd: OwnedFd,
    stdout: OwnedFd,
    stderr: OwnedFd,
    notify: OwnedFd,
    sync: OwnedFd,
}

/// Kills a cell whose payload must not start (or that will not even be released) and
/// reaps its pid 1.
fn kill_and_reap(pidfd: &OwnedFd, pid: libc::pid_t) {
    let _ = sys::pidfd_send_signal(pidfd.as_fd(), libc::SIGKILL);
    let _ = sys::wait_child(pid, false);
}

/// One of `cpus` other than the one this thread runs on, for work that should not wait
/// for this thread to block: some schedulers (this project's VM packs tasks onto one
/// vCPU) queue a new or woken task behind the task that made it. Used for the cell's setup
/// (both sides pin the cell there right after the clone, whichever runs first; the
/// supervisor gives the cell `cpus` back before it starts the payload) and for the
/// helper that drops the cell's mounts.
fn other_cpu(cpus: &sys::CpuSet) -> Option<usize> {
    let here = sys::current_cpu();
    let others: Vec<usize> = cpus
        .cpus()
        .into_iter()
        .filter(|c| Some(*c) != here)
        .collect();
    // Spread concurrent supervisors' cells over the other CPUs.
    (!others.is_empty()).then(|| others[std::process::id() as usize % others.len()])
}

fn spawn_cell(
    plan: &CellPlan,
    env: &[CString],
    options: &mut RunOptions<'_>,
    payload_cpus: Option<&sys::CpuSet>,
    supervisor_command_line: &sys::CommandLineArea,
) -> Result<SpawnedCell, CellError> {
    let pipes = open_pipes(options.stdin.take())?;
    if sys::geteuid() == 0 {
        // Supplementary groups survive into the user namespace and cannot be dropped there.
        sys::clear_supplementary_groups().map_err(|e| CellError::io("setgroups", e))?;
    }
    let has_artifacts = options.artifacts.is_some() && !plan.output_allowlist.is_empty();
    let setup_cpu = payload_cpus.and_then(other_cpu);
    let Pipes {
        stdout_read,
        stdout_write,
        stderr_read,
        stderr_write,
        notify_read,
        notify_write,
        sync_parent,
        sync_child,
        stdin,
    } = pipes;
    // pid 1 is a clone of this process, not an exec: without a name of its own its
    // /proc/1/cmdline would show the payload this process's command line, host paths of
    // the contract, the operator config and the state dir among it.
    match sys::clone_cell_named(CELL_NAMESPACES, supervisor_command_line, PID1_NAME) {
        Ok(sys::CloneOutcome::Child) => {
            drop((stdout_read, stderr_read, notify_read, sync_parent));
            launcher::run(ChildSetup {
                plan,
                env,
                sync: sync_child,
                exec_notify: notify_write,
                stdin,
                stdout: stdout_write,
                stderr: stderr_write,
                has_artifacts,
                setup_cpu,
            })
        }
        // The cell's ends close here, or the pipes would never report EOF.
        Ok(sys::CloneOutcome::Parent { pid, pidfd }) => {
            if let Some(cpu) = setup_cpu {
                let _ = sys::set_affinity(pid, &sys::CpuSet::only(cpu));
            }
            Ok(SpawnedCell {
                pid,
                pidfd,
                stdout: stdout_read,
                stderr: stderr_read,
                notify: notify_read,
                sync: sync_parent,
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

/// What the release message hands the cell: its seccomp program and the mount trees.
struct Release {
    program: Vec<libc::sock_filter>,
    mounts: Vec<rootfs::Prepared>,
}

/// Start milestones measured before the release, in ms since the run started.
struct StartMilestones {
    spawned_ms: f64,
    recorded_ms: f64,
    prepared_ms: f64,
}

/// Sends the release message (seccomp program and mount trees): the cell finishes its
/// setup, then waits for [`protocol::START`] before it starts the payload. The deadline
/// runs from here.
fn release_cell<'a>(
    plan: &'a CellPlan,
    options: &RunOptions<'_>,
    cell: SpawnedCell,
    cgroup: &'a CellCgroup,
    release: Release,
) -> Supervision<'a> {
    let (message, fds) = protocol::encode_release(&release.program, release.mounts);
    let raw: Vec<i32> = fds.iter().map(|f| f.as_raw_fd()).collect();
    // A failed send means the cell already ended (its setup failed, and it said why on
    // the socket): the supervision loop reads that and reports it.
    let _ = sys::send_with_fds(cell.sync.as_fd(), &message, &raw);
    drop(fds);
    let released_at = Instant::now();
    let released_ms = (released_at - options.started).as_secs_f64() * 1000.0;
    let SpawnedCell {
        pid,
        pidfd,
        stdout,
        stderr,
        notify,
        sync,
    } = cell;
    Supervision {
        plan,
        pid,
        pidfd,
        sync: Some(sync),
        notify: Some(notify),
        stdout: Some(stdout),
        stderr: Some(stderr),
        output: OutputCapture::new(plan.limits.output_bytes),
        observed: Observed {
            released_ms,
            ..Observed::default()
        },
        deadline: Deadline::Pending(released_at + Duration::from_millis(plan.limits.wall_time_ms)),
        stream_output: options.stream_output,
        cgroup,
    }
}

struct Supervision<'a> {
    plan: &'a CellPlan,
    pid: libc::pid_t,
    pidfd: OwnedFd,
    /// `None` once the cell closed its end (pid 1 is exiting), like the pipes below: a
    /// closed socket would make every poll return at once.
    sync: Option<OwnedFd>,
    notify: Option<OwnedFd>,
    stdout: Option<OwnedFd>,
    stderr: Option<OwnedFd>,
    output: OutputCapture,
    observed: Observed,
    deadline: Deadline,
    stream_output: bool,
    cgroup: &'a CellCgroup,
}

/// A `poll` entry waiting for input on `fd` (negative fds are ignored by poll).
fn poll_in(fd: i32) -> libc::pollfd {
    libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    }
}

fn raw(fd: &Option<OwnedFd>) -> i32 {
    fd.as_ref().map_or(-1, |f| f.as_raw_fd())
}

impl Supervision<'_> {
    /// The audit record exists: the cell may start its payload. A failed send means the
    /// cell already ended; the supervision loop reads why.
    fn start_payload(&self) {
        if let Some(sync) = &self.sync {
            let _ = sys::send_with_fds(sync.as_fd(), &[protocol::START], &[]);
        }
    }

    fn run(&mut self, options: &mut RunOptions<'_>) -> Result<(), CellError> {
        // The output buffer is allocated on first output: most tool calls print little,
        // and every fresh page costs a fault.
        let mut buf = Vec::new();
        loop {
            let timeout = self.next_timeout();
            let mut fds = [
                poll_in(raw(&self.stdout)),
                poll_in(raw(&self.stderr)),
                poll_in(raw(&self.notify)),
                poll_in(raw(&self.sync)),
                poll_in(self.pidfd.as_raw_fd()),
            ];
            sys::poll(&mut fds, timeout).map_err(|e| CellError::io("poll", e))?;
            let ready =
                |i: usize| fds[i].revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0;
            if ready(0) {
                self.pump(Stream::Stdout, &mut buf);
            }
            if ready(1) {
                self.pump(Stream::Stderr, &mut buf);
            }
            if ready(2) {
                self.read_exec_notification();
            }
            if ready(3) {
                self.read_message(options)?;
            }
            if ready(4) {
                // pid 1 is gone, and with it every process of the pid namespace.
                self.observed.ended_at = Some(Instant::now());
                if let Ok(Some(reaped)) = sys::wait_child(self.pid, false) {
                    self.observed.pid1_status = Some(reaped.status);
                    self.observed.rusage = Some(reaped.usage);
                }
                self.drain(&mut buf);
                return Ok(());
            }
            self.enforce_deadline();
        }
    }

    fn next_timeout(&self) -> i32 {
        let next = match self.deadline {
            Deadline::Pending(at) => at,
            Deadline::Terminating(sent) => sent + TERM_GRACE,
            Deadline::Reaping(at) => at,
            Deadline::Done => return -1,
        };
        next.saturating_duration_since(Instant::now())
            .as_millis()
            .min(i32::MAX as u128) as i32
    }

    fn enforce_deadline(&mut self) {
        let now = Instant::now();
        self.deadline = match self.deadline {
            Deadline::Pending(at) if now >= at => {
                self.observed.deadline_fired = true;
                // pid 1 ignores SIGTERM from outside its namespace; the payload and its
                // children get the chance to finish cleanly.
                self.cgroup.signal_all(libc::SIGTERM);
                Deadline::Terminating(now)
            }
            Deadline::Terminating(sent) if now >= sent + TERM_GRACE => {
                // Kill everything but pid 1, which reaps the payload (so its status and
                // CPU time are accounted) and reports before it goes too.
                let _ = self.cgroup.kill_all_except(self.pid);
                Deadline::Reaping(now + REAPER_GRACE)
            }
            Deadline::Reaping(at) if now >= at => {
                // Killing pid 1 kills the whole pid namespace; the cgroup kill catches
                // anything in between.
                let _ = sys::pidfd_send_signal(self.pidfd.as_fd(), libc::SIGKILL);
                let _ = self.cgroup.kill_all();
                Deadline::Done
            }
            unchanged => unchanged,
        };
    }

    /// Reads one chunk of a stream; closes it at EOF.
    fn pump(&mut self, stream: Stream, buf: &mut Vec<u8>) -> bool {
        if buf.is_empty() {
            buf.resize(OUTPUT_CHUNK, 0);
        }
        let slot = match stream {
            Stream::Stdout => &mut self.stdout,
            Stream::Stderr => &mut self.stderr,
        };
        let Some(fd) = slot.as_ref() else {
            return false;
        };
        match sys::read(fd.as_fd(), buf) {
            Ok(0) | Err(_) => {
                *slot = None;
                false
            }
            Ok(n) => {
                let is_stdout = matches!(stream, Stream::Stdout);
                let forward = self.output.accept(stream, &buf[..n]);
                if self.stream_output && !forward.is_empty() {
                    let _ = if is_stdout {
                        std::io::stdout()
                            .write_all(forward)
                            .and_then(|_| std::io::stdout().flush())
                    } else {
                        std::io::stderr().write_all(forward)
                    };
                }
                true
            }
        }
    }

    /// After pid 1 exited: read what is left in the pipes, bounded in time.
    fn drain(&mut self, buf: &mut Vec<u8>) {
        let until = Instant::now() + DRAIN_TIMEOUT;
        while self.stdout.is_some() || self.stderr.is_some() {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            let mut fds = [poll_in(raw(&self.stdout)), poll_in(raw(&self.stderr))];
            if sys::poll(&mut fds, left.as_millis() as i32).unwrap_or(0) == 0 {
                continue;
            }
            if fds[0].revents != 0 {
                self.pump(Stream::Stdout, buf);
            }
            if fds[1].revents != 0 {
                self.pump(Stream::Stderr, buf);
            }
        }
        if self.notify.is_some() {
            self.read_exec_notification();
        }
    }

    /// EOF on the notification pipe means the payload's exec closed its last write end
    /// (or the cell died before exec: then a launch failure explains the run and the time
    /// is not reported). Data means exec failed and says why.
    fn read_exec_notification(&mut self) {
        let Some(fd) = self.notify.take() else { return };
        let mut text = [0u8; 512];
        match sys::read(fd.as_fd(), &mut text) {
            Ok(0) => self.observed.exec_done_at = Some(Instant::now()),
            Ok(n) => {
                self.observed.exec_error = Some(String::from_utf8_lossy(&text[..n]).into_owned())
            }
            Err(_) => {}
        }
    }

    fn read_message(&mut self, options: &mut RunOptions<'_>) -> Result<(), CellError> {
        // Cell messages are small JSON documents (a launch failure, the payload's end).
        // EOF or a broken socket leaves `sync` at None: the cell is gone.
        let Some(sync) = self.sync.take() else {
            return Ok(());
        };
        let (buf, mut fds) = match sys::recv_message(sync.as_fd(), 2) {
            Ok(Some(message)) => message,
            _ => return Ok(()),
        };
        self.sync = Some(sync);
        let body = &buf[1..];
        match buf[0] {
            protocol::FAILED => {
                self.observed.launch_failure = serde_json::from_slice(body).ok();
            }
            protocol::LISTENERS if fds.len() == 2 => {
                let socks = fds.pop().expect("two fds");
                let http = fds.pop().expect("two fds");
                let started = match options.egress.as_mut() {
                    Some(session) => session.start(http, socks),
                    None => Err("the plan allows egress but no proxy was configured".to_string()),
                };
                if let Err(err) = started {
                    // Fail closed: no proxy means the cell must not run at all.
                    self.observed.egress_error = Some(err);
                    let _ = sys::pidfd_send_signal(self.pidfd.as_fd(), libc::SIGKILL);
                }
            }
            protocol::ENDED => {
                self.observed.ended = serde_json::from_slice(body).ok();
                if let Some(request) = options
                    .artifacts
                    .as_ref()
                    .filter(|_| !self.plan.output_allowlist.is_empty())
                {
                    self.observed.artifacts = artifacts::collect(self.pid, self.plan, request);
                    if let Some(sync) = &self.sync {
                        let _ = sys::send_with_fds(sync.as_fd(), &[protocol::COLLECTED], &[]);
                    }
                }
            }
            _ => {}
        }
        Ok(())
    }
}

/// Picks the one class of the run from what was observed. Order matters: a run that hit
/// the deadline is a wall-time run even if it also filled its disk.
fn classify(
    options: &RunOptions<'_>,
    observed: Observed,
    output: OutputCapture,
    counters: crate::cgroup::CgroupUsage,
    egress: Option<EgressSummary>,
) -> RunReport {
    let usage = Usage::from_parts(observed.rusage.as_ref(), counters);
    let startup_ms = observed
        .exec_done_at
        .filter(|_| observed.launch_failure.is_none() && observed.exec_error.is_none())
        .map_or(0.0, |t| (t - options.started).as_secs_f64() * 1000.0);
    let egress = egress.unwrap_or_default();
    let wait_status = observed.ended.as_ref().map(|e| e.wait_status);
    // When the whole cell was killed (deadline, or a v2 group OOM kill), pid 1 could not
    // report the payload's status; the signal that killed pid 1 took the payload too.
    let pid1_killed = observed.pid1_status.filter(|s| libc::WIFSIGNALED(*s));
    let exit = match wait_status.or(pid1_killed) {
        Some(s) if libc::WIFEXITED(s) => ExitInfo {
            code: Some(libc::WEXITSTATUS(s)),
            signal: None,
        },
        Some(s) if libc::WIFSIGNALED(s) => ExitInfo {
            code: None,
            signal: Some(libc::WTERMSIG(s)),
        },
        _ => ExitInfo::default(),
    };
    let payload_code = exit
        .code
        .unwrap_or_else(|| exit.signal.map_or(137, |s| 128 + s));
    let mut error = None;
    let (status, limit, exit_code) = if let Some(failure) = &observed.launch_failure {
        error = Some(format!(
            "cell setup failed at {}: {}",
            failure.stage, failure.message
        ));
        let class = if failure.unavailable {
            ResultClass::SandboxUnavailable
        } else {
            ResultClass::RuntimeFault
        };
        (class, None, 125)
    } else if let Some(err) = &observed.egress_error {
        error = Some(format!("egress proxy could not start: {err}"));
        (ResultClass::RuntimeFault, None, 125)
    } else if egress.metadata_probes > 0 {
        error = Some(format!(
            "{} connection attempt(s) to a cloud metadata endpoint",
            egress.metadata_probes
        ));
        (ResultClass::SuspectedEscape, None, payload_code)
    } else if observed.deadline_fired {
        (ResultClass::CapacityExceeded, Some(Ceiling::WallTime), 124)
    } else if usage.oom_kills > 0 {
        (ResultClass::CapacityExceeded, Some(Ceiling::Memory), 137)
    } else if let Some(text) = &observed.exec_error {
        error = Some(text.clone());
        let code = text
            .split_whitespace()
            .next()
            .and_then(|c| c.parse().ok())
            .unwrap_or(126);
        (ResultClass::TaskError, None, code)
    } else if exit.signal == Some(libc::SIGSYS) {
        // Only a foreign-architecture or x32 system call is killed by the filter.
        error = Some("the payload was killed by seccomp for a system call of a foreign ABI".into());
        (ResultClass::SuspectedEscape, None, payload_code)
    } else if wait_status.is_none() {
        error = Some("the cell ended without reporting the payload's status".into());
        (ResultClass::RuntimeFault, None, 125)
    } else if usage.pids_limit_hits > 0 {
        (ResultClass::CapacityExceeded, Some(Ceiling::Pids), 137)
    } else if payload_code != 0
        && !observed
            .ended
            .as_ref()
            .is_none_or(|e| e.full_mounts.is_empty())
    {
        (
            ResultClass::CapacityExceeded,
            Some(Ceiling::Disk),
            payload_code,
        )
    } else if output.truncated {
        (
            ResultClass::CapacityExceeded,
            Some(Ceiling::OutputBytes),
            payload_code,
        )
    } else if payload_code != 0 && egress.denials > 0 {
        (ResultClass::PolicyDenied, None, payload_code)
    } else if payload_code == 0 {
        (ResultClass::Ok, None, 0)
    } else {
        (ResultClass::TaskError, None, payload_code)
    };
    RunReport {
        run_id: observed.run_id.clone(),
        status,
        exit,
        limit_fired: limit,
        error,
        exit_code,
        timings: Timings {
            released_ms: observed.released_ms,
            startup_ms,
            ended_ms: observed
                .ended_at
                .map_or(0.0, |t| (t - options.started).as_secs_f64() * 1000.0),
            ..Timings::default()
        },
        usage,
        output: Some(output),
        cgroup_version: None,
        egress: egress.records,
        artifacts: observed.artifacts,
        cleanup: CleanupReport::default(),
        stale_cgroups_left: Vec::new(),
    }
}
