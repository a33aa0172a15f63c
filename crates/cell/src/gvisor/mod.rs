//! The gVisor tier: the same plan, run on gVisor's user-space kernel (`runsc`) instead of
//! the native cell. The payload's system calls are served by gVisor's Sentry; the host
//! kernel sees only the Sentry's and the gofer's own (filtered) calls.
//!
//! One run, like [`crate::run_cell`]'s (docs/architecture.md, "Tiers"):
//! preflight (root, runsc answers) -> the cell's host directory, its cgroup (airlock's,
//! created with the ceilings; runsc joins it), two host ids (the sandbox's root and the
//! payload's), the writable paths' host tmpfs, the root skeleton, `config.json`
//! (crates/oci) -> the audit hook (no record, no sandbox) -> `runsc run` with the
//! payload's stdio (one runsc process: create, start, wait, delete; runsc.rs says why) ->
//! supervise: output through [`OutputCapture`], stdin relayed, the deadline from outside
//! (`runsc kill --all TERM`, a grace, then SIGKILL of every process of the cgroup: the
//! Sentry, the gofer, the platform's stubs, and of `runsc run`), the payload's status from
//! `runsc run`'s exit -> every process of the cgroup killed and reaped (this process is
//! their subreaper), `runsc delete --force` if `run` left its state -> artifacts from the
//! host tmpfs -> counters -> everything removed and checked -> one class, by the native
//! cell's classification.

mod broker;
mod bundle;
mod console;
mod egress;
pub mod health;
pub mod inside;
mod route;
mod runsc;
mod session;

pub use bundle::{leftover_cells, STATE_ROOT};
pub use runsc::{RunscBinary, PLATFORM};
pub use session::serve_gvisor;

use crate::artifacts::{self, ArtifactReport, OutputMounts};
use crate::cgroup::{CellCgroup, CgroupLayout, CgroupUsage, ContainerCgroupPath};
use crate::error::CellError;
use crate::host_identity::{self, HostLease};
use crate::output::{OutputCapture, Stream};
use crate::protocol::PayloadEnded;
use crate::report::{CleanupReport, RunReport};
use crate::stdin_relay::StdinRelay;
use crate::supervisor::classify::{self, Observed};
use crate::supervisor::{command_environment, PayloadStdin, RunOptions, TERM_GRACE};
use crate::sys;
use crate::terminal::{CallerTerminal, DEFAULT_WINDOW};
use airlock_contract::{CellPlan, Isolation, Limits, NetworkPlan};
use bundle::CellDir;
use console::{ConsoleSocket, Window};
use runsc::{Runsc, WaitOutcome};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Host tasks of a sandbox before its payload forks: the Sentry's and the gofer's
/// threads (37 measured for `sleep` with runsc 20221219 on the ptrace platform).
const SANDBOX_BASE_TASKS: u64 = 64;
/// Host tasks per payload task on the ptrace platform (its stub threads: about 13 per
/// process measured, see docs/threat-model.md, "Tiers").
const HOST_TASKS_PER_TASK: u64 = 16;
/// Tasks allowed in a container cgroup for `runsc run` (a Go process: its threads), which
/// the supervisor starts in the container cgroup, beside the supervisor's own.
const RUNSC_RUN_TASKS: u64 = 32;
/// The sandbox's and gofer's `oom_score_adj` in a container cgroup: the OOM killer takes
/// them (the Sentry holds the payload's memory) before the supervisor or `runsc run`.
const SANDBOX_OOM_SCORE_ADJ: i32 = 1000;

/// Runs `plan.argv` on the gVisor tier; never panics on sandbox failures: every outcome,
/// airlock's own errors included, becomes a [`RunReport`]. A host that cannot run the
/// tier refuses the run (`sandbox_unavailable`): it never runs on the native cell instead.
pub fn run_gvisor(plan: &CellPlan, mut options: RunOptions<'_>) -> RunReport {
    match gvisor_run(plan, &mut options) {
        Ok(report) => report,
        Err(err) => {
            let mut report = RunReport::refused("", err.class(), err.to_string());
            report.timings.wall_ms = ms_since(options.started);
            report
        }
    }
}

/// Whether this host can run `plan` in a gVisor session or parked cell, and with which
/// runsc binary. A broker socket is per run: it is served to one-shot runs only. So is a
/// terminal: as natively, a session's commands have stdio of their own.
pub fn preflight(plan: &CellPlan) -> Result<PathBuf, CellError> {
    let one_shot_only = |control, what: &str| {
        Err(CellError::Unavailable {
            control,
            reason: format!(
                "{what} on gVisor is served to one-shot runs only, not to a session or a parked cell"
            ),
        })
    };
    if plan.broker.is_some() {
        return one_shot_only("gvisor.broker", "a broker socket");
    }
    if plan.terminal {
        return one_shot_only("gvisor.terminal", "a terminal");
    }
    one_shot_preflight(plan)
}

/// Whether this host can run `plan` once on the gVisor tier, and with which runsc binary.
fn one_shot_preflight(plan: &CellPlan) -> Result<PathBuf, CellError> {
    let unavailable = |control, reason: &str| {
        Err(CellError::Unavailable {
            control,
            reason: reason.to_string(),
        })
    };
    if plan.isolation != Isolation::Gvisor {
        return unavailable("gvisor.plan", "the plan is not a gVisor plan");
    }
    if sys::geteuid() != 0 {
        return unavailable(
            "gvisor.root",
            "the gVisor tier needs root here (runsc's cgroup, id maps and the writable paths' host tmpfs)",
        );
    }
    // Validation refuses these for the tier; a plan that comes another way is refused too.
    if !matches!(
        plan.network,
        NetworkPlan::Deny | NetworkPlan::Allowlist { .. }
    ) {
        return unavailable(
            "gvisor.network",
            "only network.mode deny and allowlist are built for gVisor",
        );
    }
    if plan.terminal && has_routes(plan) {
        // A payload with a route out (egress, the broker) is a `runsc exec` behind its
        // forwarders; its console is not wired.
        return unavailable(
            "gvisor.terminal",
            "a terminal on gVisor is built for network.mode deny without broker actions only",
        );
    }
    RunscBinary::locate()
}

/// Whether the plan's payload reaches something outside the sandbox through a
/// forwarder: the egress proxy (allowlist) or the run's broker.
fn has_routes(plan: &CellPlan) -> bool {
    matches!(plan.network, NetworkPlan::Allowlist { .. }) || broker::socket_of(plan).is_some()
}

fn ms_since(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1000.0
}

/// The cgroup ceilings of a sandbox: the plan's memory and CPU for the whole sandbox
/// (its kernel included), and a pids backstop for the host tasks. The payload's own
/// `process_limit` is `RLIMIT_NPROC` inside gVisor (crates/oci).
fn sandbox_limits(limits: &Limits, in_container: bool) -> Limits {
    let runsc_run = if in_container { RUNSC_RUN_TASKS } else { 0 };
    let tasks =
        SANDBOX_BASE_TASKS + HOST_TASKS_PER_TASK * u64::from(limits.process_limit) + runsc_run;
    Limits {
        // `cell_pids_max` adds one for the native cell's pid 1.
        process_limit: u32::try_from(tasks - 1).unwrap_or(u32::MAX),
        ..*limits
    }
}

/// Everything of one sandbox on the host, removed by [`Sandbox::teardown`].
struct Sandbox {
    dir: CellDir,
    cgroup: CellCgroup,
    runsc: Runsc,
    leases: [HostLease; 2],
    name: String,
    layout_version: &'static str,
    /// The cgroup runsc is given, relative to each hierarchy's root: airlock's
    /// `/airlock/<name>`, or a container's `<cgroupsPath>/cell`.
    runsc_cgroup: PathBuf,
    /// What runsc will make of `runsc_cgroup` in hierarchies airlock does not use.
    runsc_made: RunscCgroups,
    /// Every host process seen in the sandbox's cgroup, to reap (this process is their
    /// subreaper once their parent is gone).
    seen: std::collections::BTreeSet<libc::pid_t>,
    /// runsc processes outside the sandbox's cgroup that teardown kills and reaps: the
    /// holder (`runsc run`) and forwarders (`runsc exec`) of a run with routes out.
    runsc_children: Vec<libc::pid_t>,
    /// The files of the forwarders' and the payload's `runsc exec`s.
    exec_files: Vec<session::ExecFiles>,
}

fn gvisor_run(plan: &CellPlan, options: &mut RunOptions<'_>) -> Result<RunReport, CellError> {
    let started = options.started;
    let doors = options.doors.take();
    if doors
        .as_ref()
        .is_some_and(|d| d.exec.is_some() || d.console.is_some())
    {
        // Fail closed: a container's exec and console are the native cell's (pid 1 spawns
        // further commands); runsc's are not wired.
        return Err(CellError::Unsupported(
            "a container's exec and console socket are not built for the gVisor tier".into(),
        ));
    }
    let container = doors.and_then(|d| d.cgroup);
    let binary = one_shot_preflight(plan)?;
    // Before any runsc process: the signals it takes are blocked from here on.
    let caller_terminal = enter_caller_terminal(plan, &options.stdin)?;
    let env = command_environment(plan, options.credentials, &[])?;
    // A supervisor killed with SIGKILL takes its sandbox with it (runsc.rs) but leaves
    // its directory, tmpfs and cgroups: the next run reaps them, as `doctor` does.
    let _ = health::reap_leftovers();
    // A payload with a route out (egress, the broker) starts only once its forwarders
    // listen: a holder is the first process, the forwarders and the payload are
    // `runsc exec`s.
    let pid1 = match has_routes(plan) {
        true => Pid1::SessionHolder,
        false if plan.terminal => Pid1::PayloadOnTerminal(Window::of(
            &caller_terminal
                .as_ref()
                .map_or(DEFAULT_WINDOW, CallerTerminal::window),
        )),
        false => Pid1::Payload,
    };
    let mut sandbox = Sandbox::prepare(plan, &binary, options.host_ids, env, pid1, container)?;
    let prepared_ms = ms_since(started);
    let ran = sandbox.run(plan, options, caller_terminal);
    let teardown_started = Instant::now();
    let output_mounts = ran.as_ref().ok().map(|run| &run.output_mounts);
    let (counters, cleanup, artifacts) =
        sandbox.teardown(plan, output_mounts, options.artifacts.as_ref());
    let egress = options.egress.as_mut().map(|session| session.finish());
    let ran = ran.map(|mut run| {
        // Restored before anything else is printed; a signal taken meanwhile ends this
        // process only now, its sandbox gone.
        if let Some((terminal, signal)) = run.caller_terminal.take().zip(run.fatal_signal) {
            terminal.die_of(signal)
        }
        run
    });
    let report = match ran {
        Ok(run) => {
            let mut observed = run.observed;
            observed.artifacts = artifacts;
            observed.rusage = add_cpu(observed.rusage, cleanup.reaped_usage);
            let observed =
                observed_ending(observed, run.outcome, counters, run.full_mounts.clone());
            let mut report = classify::classify(started, observed, run.output, counters, egress);
            report.timings.prepared_ms = prepared_ms;
            report.timings.recorded_ms = run.recorded_ms;
            report
        }
        Err(err) => RunReport::refused("", err.class(), err.to_string()),
    };
    Ok(with_cleanup(report, cleanup, teardown_started, started))
}

/// The report with what the teardown found: a sandbox that left something behind is
/// airlock's fault, whatever the payload did.
fn with_cleanup(
    mut report: RunReport,
    cleanup: Teardown,
    teardown_started: Instant,
    started: Instant,
) -> RunReport {
    report.cgroup_version = Some(cleanup.cgroup_version);
    report.host_identity = Some(cleanup.payload_identity);
    report.timings.teardown_ms = ms_since(teardown_started);
    report.timings.wall_ms = ms_since(started);
    report.cleanup = cleanup.report;
    if !report.cleanup.ok && report.status == crate::report::ResultClass::Ok {
        report.status = crate::report::ResultClass::RuntimeFault;
        report.error = Some("the sandbox left something behind".into());
        report.exit_code = 125;
    }
    report
}

/// What the run of the payload left for the classification.
struct Ran {
    observed: Observed,
    output: OutputCapture,
    outcome: WaitOutcome,
    recorded_ms: f64,
    output_mounts: OutputMounts,
    /// Writable paths without free space or inodes when the payload ended.
    full_mounts: Vec<String>,
    /// The caller's terminal, raw until this is dropped.
    caller_terminal: Option<CallerTerminal>,
    /// A signal that ends this process once the sandbox is gone (see [`CallerTerminal`]).
    fatal_signal: Option<libc::c_int>,
}

/// The caller's terminal, raw for the run, when the plan has a terminal and the caller's
/// stdin is one (as natively, crate::terminal). Its signals are blocked process-wide, so
/// only a single-threaded process takes it: `airlock run`'s own. A run handed to the
/// service (supervised on a thread of it, whose client owns its terminal) is refused
/// rather than run without the caller's window and signals.
fn enter_caller_terminal(
    plan: &CellPlan,
    stdin: &PayloadStdin,
) -> Result<Option<CallerTerminal>, CellError> {
    let caller_is_terminal =
        matches!(stdin, PayloadStdin::Relayed(fd) if sys::is_terminal(fd.as_fd()));
    if plan.terminal && caller_is_terminal {
        let threads = sys::process_stat(std::process::id())
            .map_err(|e| CellError::io("/proc/self/stat", e))?
            .threads;
        if threads != 1 {
            return Err(CellError::Unavailable {
                control: "gvisor.terminal",
                reason: "a caller's terminal on gVisor is relayed by `airlock run`'s own process only, not by a service".into(),
            });
        }
    }
    crate::supervisor::enter_caller_terminal(plan, stdin)
}

/// What the sandbox's first process is.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Pid1 {
    /// The plan's payload (a one-shot run).
    Payload,
    /// The plan's payload on a terminal of this size, whose master runsc sends to the
    /// console socket ([`console`]).
    PayloadOnTerminal(Window),
    /// A session's holder ([`inside`]): it keeps the sandbox alive and reaps orphans;
    /// each command is a `runsc exec` of its own.
    SessionHolder,
}

impl Sandbox {
    fn prepare(
        plan: &CellPlan,
        binary: &Path,
        host_ids: crate::host_identity::HostIdRange,
        env: Vec<String>,
        pid1: Pid1,
        container: Option<ContainerCgroupPath>,
    ) -> Result<Sandbox, CellError> {
        let layout = CgroupLayout::detect()?;
        let start_time = sys::process_stat(std::process::id())
            .map_err(|e| CellError::io("/proc/self/stat", e))?
            .start_time;
        let name = crate::cgroup::cgroup_name(start_time);
        let leases = [
            host_identity::lease_for_cell(host_ids)?,
            host_identity::lease_for_cell(host_ids)?,
        ];
        let (cgroup, runsc_cgroup) = sandbox_cgroup(&layout, &name, plan, container.as_ref())?;
        let runsc_made = RunscCgroups::before(&layout, &runsc_cgroup);
        let dir = match CellDir::create(&name) {
            Ok(dir) => dir,
            Err(err) => {
                cgroup.destroy();
                return Err(err);
            }
        };
        let runsc = Runsc::new(binary, &dir.state(), &dir.log(), &name);
        let mut sandbox = Sandbox {
            dir,
            cgroup,
            runsc,
            leases,
            name,
            layout_version: layout.version(),
            runsc_cgroup,
            runsc_made,
            seen: Default::default(),
            runsc_children: Vec::new(),
            exec_files: Vec::new(),
        };
        let oom_score_adj = container.map(|_| SANDBOX_OOM_SCORE_ADJ);
        if let Err(err) = sandbox.write_bundle(plan, env, pid1, oom_score_adj) {
            sandbox.abandon();
            return Err(err);
        }
        Ok(sandbox)
    }

    fn write_bundle(
        &mut self,
        plan: &CellPlan,
        env: Vec<String>,
        pid1: Pid1,
        oom_score_adj: Option<i32>,
    ) -> Result<(), CellError> {
        let payload_id = self.leases[1].identity().uid;
        self.dir.mount_writable(plan, payload_id)?;
        self.dir.mount_image(plan)?;
        let (system, etc_entries) = self.dir.build_root(plan)?;
        let host = airlock_oci::BundleHost {
            rootfs: self.dir.rootfs(),
            system,
            etc_entries,
            writable: self.dir.writable.clone(),
            // The cgroup airlock made: runsc joins it and writes no limits of its own.
            cgroups_path: Path::new("/").join(&self.runsc_cgroup),
            root_host_id: self.leases[0].identity().uid,
            payload_host_id: payload_id,
            oom_score_adj,
        };
        let mut spec =
            airlock_oci::runtime_spec(plan, &host, env).map_err(|e| CellError::Launch {
                stage: "runtime spec".into(),
                message: e.to_string(),
            })?;
        match pid1 {
            Pid1::SessionHolder => inside::make_session_spec(&mut spec, &self.dir.rootfs())?,
            Pid1::PayloadOnTerminal(window) => console::make_terminal_spec(&mut spec, window)?,
            Pid1::Payload => {}
        }
        if let Some((_, target)) = broker::socket_of(plan) {
            broker::add_socket_dir(&mut spec, target)?;
        }
        let json = serde_json::to_vec_pretty(&spec)
            .map_err(|e| CellError::io("runtime spec", std::io::Error::other(e)))?;
        self.dir.write_spec(&json)
    }

    /// Removes what `prepare` made when nothing was started.
    fn abandon(self) {
        let Sandbox {
            dir,
            cgroup,
            leases,
            ..
        } = self;
        dir.remove();
        cgroup.destroy();
        for lease in leases {
            lease.release(true);
        }
    }

    /// From the begin record to the end of `runsc run`: no record, no sandbox.
    fn run(
        &mut self,
        plan: &CellPlan,
        options: &mut RunOptions<'_>,
        caller_terminal: Option<CallerTerminal>,
    ) -> Result<Ran, CellError> {
        // The sandbox's processes are `runsc run`'s children; should it die first, they
        // become this process's (its subreaper), which reaps them at teardown.
        sys::prctl(libc::PR_SET_CHILD_SUBREAPER, 1)
            .map_err(|e| CellError::io("becoming the sandbox's subreaper", e))?;
        let behind_forwarder = has_routes(plan);
        if behind_forwarder {
            self.start_routes(plan, options)?;
        }
        let recorded = match options.before_start.take() {
            None => Ok(String::new()),
            Some(hook) => std::panic::catch_unwind(std::panic::AssertUnwindSafe(hook))
                .unwrap_or_else(|_| Err("the audit hook panicked".to_string())),
        };
        let recorded_ms = ms_since(options.started);
        let run_id = recorded.map_err(CellError::Refused)?;
        let stdin = std::mem::replace(&mut options.stdin, PayloadStdin::Null);
        // An empty pipe (its write end closed), never the host's /dev/null: runsc
        // chowns its stdio to the sandbox's user, and that would be the host's node.
        let empty = || {
            sys::pipe_cloexec()
                .map(|(read, _)| read)
                .map_err(|e| CellError::io("stdin pipe", e))
        };
        // With a terminal, the caller's stdin goes into its master, once runsc sent it.
        let (stdin_end, mut relay, terminal_input) = match stdin {
            PayloadStdin::Null => (empty()?, None, None),
            PayloadStdin::Relayed(source) if plan.terminal => (empty()?, None, Some(source)),
            PayloadStdin::Relayed(source) => {
                let (relay, cell_end) =
                    StdinRelay::new(source).map_err(|e| CellError::io("stdin pipe", e))?;
                (cell_end, Some(relay), None)
            }
        };
        let console = match plan.terminal {
            true => Some(ConsoleSocket::bind(&self.dir.dir)?),
            false => None,
        };
        let pipe = || sys::pipe_cloexec().map_err(|e| CellError::io("pipe", e));
        let (stdout_read, stdout_write) = pipe()?;
        let (stderr_read, stderr_write) = pipe()?;
        let output_mounts = OutputMounts::open_host_dirs(plan, &self.dir.writable);
        let mut observed = Observed {
            run_id,
            released_ms: ms_since(options.started),
            ..Observed::default()
        };
        let stdio = [stdin_end, stdout_write, stderr_write];
        let (runsc_run, payload_files) = if behind_forwarder {
            let env = command_environment(plan, options.credentials, &[])?;
            let files = self.exec_files(plan, inside::launch_argv(plan, &plan.argv), env)?;
            let child = self
                .runsc
                .spawn_exec(&files.process, &files.internal_pid, stdio)?;
            (child, Some(files))
        } else {
            let console_path = console.as_ref().map(ConsoleSocket::path);
            let child = self
                .runsc
                .spawn_run(&self.dir.bundle(), stdio, console_path)?;
            (child, None)
        };
        // The payload starts inside `runsc run` once the sandbox is up (or in its
        // `runsc exec` behind the forwarder); its start-up is counted to here and the
        // sandbox's boot is in the wall time.
        observed.exec_done_at = Some(Instant::now());
        let runsc_pid = runsc_run.id() as libc::pid_t;
        let runsc_exit =
            sys::pidfd_open(runsc_pid).map_err(|e| CellError::io("pidfd of runsc run", e))?;
        let deadline = Instant::now() + Duration::from_millis(plan.limits.wall_time_ms);
        let terminal = match console {
            Some(console) => console.receive_master(&runsc_exit, deadline)?,
            None => None,
        };
        if let Some(master) = &terminal {
            let window = (caller_terminal.as_ref()).map_or(DEFAULT_WINDOW, CallerTerminal::window);
            let _ = sys::set_window_size(master.as_fd(), &window);
            if let Some(source) = terminal_input {
                relay = Some(
                    StdinRelay::into_terminal(source, master)
                        .map_err(|e| CellError::io("the terminal's input", e))?,
                );
            }
        }
        let mut supervision = Supervision {
            capture: OutputCapture::new(plan.limits.output_bytes),
            stdout: Some(stdout_read),
            stderr: Some(stderr_read),
            terminal,
            stdout_sink: options.stdout_sink.take(),
            stderr_sink: options.stderr_sink.take(),
            relay,
            caller_terminal,
            fatal_signal: None,
        };
        let sandbox = SandboxHandles {
            runsc: &self.runsc,
            runsc_pid,
            cgroup: &self.cgroup,
        };
        supervision.until_exit(
            &sandbox,
            deadline,
            runsc_exit,
            &mut observed,
            &mut self.seen,
        )?;
        self.seen.extend(self.cgroup.pids());
        let status = sys::wait_child(runsc_pid, false)
            .map_err(|e| CellError::io("reaping runsc run", e))?
            .map(|reaped| {
                observed.rusage = Some(reaped.usage);
                reaped.status
            });
        observed.ended_at = Some(Instant::now());
        supervision.drain();
        observed.stdin = supervision.relay.take().map(StdinRelay::finish);
        let ended = match &payload_files {
            Some(files) => payload_exec_ended(&self.runsc, status, files),
            None => self.runsc.run_ended(&self.dir.bundle(), status),
        };
        let outcome = match ended {
            Ok(outcome) => outcome,
            Err(err) => {
                // runsc could not find or load the command: the payload's exec failure
                // (127/126, as natively), not a fault of the tier.
                observed.exec_failure = Some(runsc::exec_failure(&err, &plan.argv).ok_or(err)?);
                observed.exec_done_at = None;
                WaitOutcome::SandboxGone
            }
        };
        let full_mounts = full_writable_paths(plan, &self.dir.writable);
        Ok(Ran {
            observed,
            output: supervision.capture,
            outcome,
            recorded_ms,
            output_mounts,
            full_mounts,
            caller_terminal: supervision.caller_terminal.take(),
            fatal_signal: supervision.fatal_signal,
        })
    }

    /// The completion sequence: the sandbox killed and deleted, its cgroup emptied, the
    /// artifacts collected from the host tmpfs, the counters read, then every trace
    /// removed and checked.
    fn teardown(
        self,
        plan: &CellPlan,
        output_mounts: Option<&OutputMounts>,
        request: Option<&artifacts::ArtifactRequest>,
    ) -> (CgroupUsage, Teardown, Option<ArtifactReport>) {
        let mut left = Vec::new();
        for pid in &self.runsc_children {
            let _ = sys::kill(*pid, libc::SIGKILL);
        }
        for pid in &self.runsc_children {
            let _ = sys::wait_child(*pid, false);
        }
        for files in &self.exec_files {
            files.remove();
        }
        // Killed and reaped first: runsc's delete waits for its gofer to be gone, and an
        // unreaped zombie of it would hold the delete for runsc's 5 s timeout.
        let mut seen = self.seen.clone();
        seen.extend(self.cgroup.pids());
        let _ = self.cgroup.kill_all();
        if !self.cgroup.wait_empty(Duration::from_secs(5)) {
            left.push(format!("processes left in cgroup {}", self.name));
        }
        let reaped_usage = reap(&seen);
        // `runsc run` deletes the sandbox it made when it ends; one killed on the way
        // (the deadline's last step) leaves its state, which `delete` removes.
        if self.dir.runsc_state_left() {
            if let Err(err) = self.runsc.delete() {
                left.push(format!("runsc delete: {err}"));
            }
        }
        let artifacts = match (output_mounts, request) {
            (Some(mounts), Some(request)) if !plan.output_allowlist.is_empty() => {
                Some(artifacts::collect(mounts, plan, request))
            }
            _ => None,
        };
        let counters = self.cgroup.usage();
        left.extend(
            self.cgroup
                .destroy()
                .iter()
                .map(|p| p.display().to_string()),
        );
        left.extend(self.runsc_made.remove());
        let dir = self.dir.dir.clone();
        left.extend(self.dir.remove());
        left.extend(mounts_under(&dir));
        if dir.exists() {
            left.push(dir.display().to_string());
        }
        let payload_identity = self.leases[1].identity();
        let cgroup_version = self.layout_version;
        let clean = left.is_empty();
        for lease in self.leases {
            lease.release(clean);
        }
        let teardown = Teardown {
            report: CleanupReport {
                ok: clean,
                leftovers: left,
            },
            payload_identity,
            cgroup_version,
            reaped_usage,
        };
        (counters, teardown, artifacts)
    }
}

impl Sandbox {
    /// The routes out of the sandbox, before its payload starts: the holder, then the
    /// egress route (an allowlisted run) and the broker's (a run naming actions).
    fn start_routes(
        &mut self,
        plan: &CellPlan,
        options: &mut RunOptions<'_>,
    ) -> Result<(), CellError> {
        let egress = match plan.network {
            NetworkPlan::Allowlist { .. } => {
                Some(egress::start_route(plan, options.egress.as_deref_mut())?)
            }
            _ => None,
        };
        let holder = session::start_holder(self)?;
        self.runsc_children.push(holder.runsc_pid);
        if let Some(pending) = egress {
            self.start_egress_forwarder(plan, options.credentials, pending)?;
        }
        if let Some((source, target)) = broker::socket_of(plan) {
            let pending = broker::start_route(source.to_path_buf())?;
            self.start_broker_forwarder(plan, target, pending)?;
        }
        Ok(())
    }

    /// The egress forwarder (a `runsc exec` of the payload's user whose stdin is the
    /// control channel), listening on gVisor's loopback where the proxy's listeners are
    /// natively; the proxy already runs on its listeners in a private network namespace.
    /// Returns once it listens; teardown kills and reaps it.
    fn start_egress_forwarder(
        &mut self,
        plan: &CellPlan,
        credentials: &[(String, String)],
        mut pending: egress::Pending,
    ) -> Result<(), CellError> {
        let env = command_environment(plan, credentials, &[])?;
        let argv = inside::forwarder_argv(&egress::forwarded_addresses(plan));
        let files = self.exec_files(plan, argv, env)?;
        self.spawn_forwarder(&files, pending.sandbox_end()?)?;
        pending.forwarder_ready()
    }

    /// The broker's unix forwarder: a `runsc exec` as the sandbox's root (no
    /// capabilities, no_new_privs, no environment), so that the socket's directory is
    /// not the payload's to change, and a process the payload cannot signal.
    fn start_broker_forwarder(
        &mut self,
        plan: &CellPlan,
        target: &Path,
        mut pending: route::Pending,
    ) -> Result<(), CellError> {
        let argv = inside::unix_forwarder_argv(target);
        let mut process =
            airlock_oci::exec_process(plan, argv, Vec::new()).map_err(|e| CellError::Launch {
                stage: "runsc exec process spec".into(),
                message: e.to_string(),
            })?;
        process.set_user(sandbox_root_user());
        let files =
            self.keep_exec_files(|sandbox, n| session::write_process_file(sandbox, n, &process))?;
        self.spawn_forwarder(&files, pending.sandbox_end()?)?;
        pending.forwarder_ready()
    }

    /// Starts a forwarder's `runsc exec` with its control channel as stdin.
    fn spawn_forwarder(
        &mut self,
        files: &session::ExecFiles,
        channel: OwnedFd,
    ) -> Result<(), CellError> {
        let child = self.runsc.spawn_exec(
            &files.process,
            &files.internal_pid,
            [channel, self.dir.open_null()?, self.dir.open_null()?],
        )?;
        self.runsc_children.push(child.id() as libc::pid_t);
        Ok(())
    }

    /// A `runsc exec` process spec for `argv`, removed at teardown.
    fn exec_files(
        &mut self,
        plan: &CellPlan,
        argv: Vec<String>,
        env: Vec<String>,
    ) -> Result<session::ExecFiles, CellError> {
        self.keep_exec_files(|sandbox, n| session::process_file(plan, sandbox, n, argv, env))
    }

    /// The next `runsc exec`'s files, made by `write` (given this sandbox and the exec's
    /// number), kept for teardown to remove.
    fn keep_exec_files(
        &mut self,
        write: impl FnOnce(&Sandbox, u64) -> Result<session::ExecFiles, CellError>,
    ) -> Result<session::ExecFiles, CellError> {
        let files = write(self, self.exec_files.len() as u64 + 1)?;
        self.exec_files.push(files.clone());
        Ok(files)
    }
}

/// The payload's end when it ran as a `runsc exec`: its status, or runsc's failure to
/// start it.
fn payload_exec_ended(
    runsc: &Runsc,
    status: Option<i32>,
    files: &session::ExecFiles,
) -> Result<WaitOutcome, CellError> {
    if let Some(err) = runsc.exec_failed(status, &files.internal_pid) {
        return Err(err);
    }
    Ok(match status.filter(|s| libc::WIFEXITED(*s)) {
        Some(s) => WaitOutcome::Exited(libc::WEXITSTATUS(s)),
        None => WaitOutcome::SandboxGone,
    })
}

/// The sandbox's root (uid and gid 0 inside its user namespace, mapped to the sandbox
/// root's host id), with no supplementary groups.
fn sandbox_root_user() -> airlock_oci::spec_types::User {
    let mut user = airlock_oci::spec_types::User::default();
    user.set_uid(0);
    user.set_gid(0);
    user.set_additional_gids(None);
    user
}

struct Teardown {
    report: CleanupReport,
    payload_identity: host_identity::HostIdentity,
    cgroup_version: &'static str,
    /// The CPU of the sandbox's processes this process reaped (see [`reap`]).
    reaped_usage: Option<libc::rusage>,
}

/// Reaps the sandbox's processes that became this process's children (all dead: their
/// cgroup is empty). A pid that is not a child of this process is left alone. Returns
/// their CPU: on the ptrace platform the payload's code runs in the Sentry's stub
/// processes, which the sandbox process does not reap when it is killed from outside
/// (the deadline, a ceiling), so its own usage would miss the payload's CPU.
///
/// A dead process whose parent (another process of the sandbox) has not finished dying
/// is not this process's child yet: it is tried again until it is reaped or gone (reaped
/// by its parent), for at most [`REAP_WAIT`].
fn reap(pids: &std::collections::BTreeSet<libc::pid_t>) -> Option<libc::rusage> {
    let until = Instant::now() + REAP_WAIT;
    let mut usage = None;
    let mut left: Vec<libc::pid_t> = pids.iter().copied().collect();
    while !left.is_empty() {
        left.retain(|pid| match sys::wait_child(*pid, true) {
            Ok(Some(reaped)) => {
                usage = add_cpu(usage, Some(reaped.usage));
                false
            }
            _ => Path::new("/proc").join(pid.to_string()).exists(),
        });
        if Instant::now() >= until {
            break;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    usage
}

/// How long [`reap`] waits for the sandbox's dead processes to become reapable.
const REAP_WAIT: Duration = Duration::from_millis(500);

/// The user and system CPU of two usages together (the only fields the report reads).
fn add_cpu(a: Option<libc::rusage>, b: Option<libc::rusage>) -> Option<libc::rusage> {
    let add = |x: libc::timeval, y: libc::timeval| {
        let micros = (x.tv_sec + y.tv_sec) * 1_000_000 + x.tv_usec + y.tv_usec;
        libc::timeval {
            tv_sec: micros / 1_000_000,
            tv_usec: micros % 1_000_000,
        }
    };
    match (a, b) {
        (Some(mut a), Some(b)) => {
            a.ru_utime = add(a.ru_utime, b.ru_utime);
            a.ru_stime = add(a.ru_stime, b.ru_stime);
            Some(a)
        }
        (a, b) => a.or(b),
    }
}

/// The payload's end as the classification reads it. A sandbox that died without a
/// status was killed from outside: by the deadline (known), the memory ceiling (the
/// cgroup's oom kills) or the pids backstop (its refusals); each is a kill of the
/// payload. With none of them it stays unexplained: `runtime_fault`.
fn observed_ending(
    mut observed: Observed,
    outcome: WaitOutcome,
    counters: CgroupUsage,
    full_mounts: Vec<String>,
) -> Observed {
    let killed_by_ceiling =
        observed.deadline_fired || counters.oom_kills > 0 || counters.pids_limit_hits > 0;
    observed.ended = match outcome {
        WaitOutcome::Exited(status) => Some(PayloadEnded {
            wait_status: runsc::wait_status(status),
            full_mounts,
            shm_full: false,
        }),
        WaitOutcome::SandboxGone if killed_by_ceiling => Some(PayloadEnded {
            wait_status: libc::SIGKILL,
            full_mounts: Vec::new(),
            shm_full: false,
        }),
        WaitOutcome::SandboxGone => None,
    };
    if matches!(outcome, WaitOutcome::Exited(129..=192)) {
        observed.notes.push(
            "gvisor: runsc reports a signal death as 128 + the signal; read as that signal".into(),
        );
    }
    observed
}

/// The cell paths of the writable paths whose host tmpfs has no space or inodes left
/// (the `disk` ceiling, as the native cell's pid 1 reports it).
fn full_writable_paths(plan: &CellPlan, dirs: &[PathBuf]) -> Vec<String> {
    let targets = plan.mounts.iter().filter_map(|m| match m {
        airlock_contract::MountPlan::WritableTmpfs { target, .. } => Some(target),
        _ => None,
    });
    targets
        .zip(dirs)
        .filter(|(_, dir)| {
            sys::statfs_free(dir).is_ok_and(|(blocks, inodes)| blocks == 0 || inodes == 0)
        })
        .map(|(target, _)| target.display().to_string())
        .collect()
}

/// The sandbox's cgroup and the path runsc is given (relative to each hierarchy's root).
/// Airlock's own: `/airlock/<name>` with the sandbox's ceilings. A container's
/// (`linux.cgroupsPath`, crates/cell/src/cgroup/container.rs): the container cgroup C
/// with the ceilings and this supervisor (and so `runsc run`, its child), and runsc's
/// sandbox and gofer in the leaf `C/cell`, which airlock made: runsc joins a cgroup that
/// exists and writes no limits there (on v2 the leaf has no controllers: C holds a
/// process), so the ceilings are C's, which cover its subtree.
fn sandbox_cgroup(
    layout: &CgroupLayout,
    name: &str,
    plan: &CellPlan,
    container: Option<&ContainerCgroupPath>,
) -> Result<(CellCgroup, PathBuf), CellError> {
    let limits = sandbox_limits(&plan.limits, container.is_some());
    match container {
        None => Ok((
            CellCgroup::create(layout, name, &limits)?,
            Path::new("airlock").join(name),
        )),
        Some(path) => Ok((
            CellCgroup::create_in_container(layout, path, &limits)?,
            path.as_path().join(crate::cgroup::CELL_LEAF),
        )),
    }
}

/// What runsc makes of its cgroup path in the hierarchies airlock does not use (cpuset,
/// blkio, devices, ...: runsc creates the path in every hierarchy it knows and does not
/// remove what it made of a cgroup it joined). Found before `runsc run` as the
/// directories of the path that do not exist yet, removed at teardown deepest first.
struct RunscCgroups {
    /// Per hierarchy, the missing directories of the path, shallowest first.
    missing: Vec<Vec<PathBuf>>,
}

impl RunscCgroups {
    fn before(layout: &CgroupLayout, relative: &Path) -> RunscCgroups {
        RunscCgroups::in_hierarchies(other_hierarchies(layout), relative)
    }

    fn in_hierarchies(hierarchies: Vec<PathBuf>, relative: &Path) -> RunscCgroups {
        let missing = hierarchies
            .into_iter()
            .map(|root| {
                let mut dir = root;
                let mut missing = Vec::new();
                for component in relative.components() {
                    dir.push(component);
                    if !dir.exists() {
                        missing.push(dir.clone());
                    }
                }
                missing
            })
            .collect();
        RunscCgroups { missing }
    }

    /// Removes what runsc made; returns what is left of its own cgroup. A parent it made
    /// that another sandbox or container uses by now (has a child) is left to that one.
    fn remove(&self) -> Vec<String> {
        let mut left = Vec::new();
        for missing in &self.missing {
            for (depth, dir) in missing.iter().enumerate().rev() {
                // The deepest is runsc's cgroup itself; the others are parents.
                let leaf = depth + 1 == missing.len();
                match std::fs::remove_dir(dir) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) if leaf => left.push(format!("{}: {e}", dir.display())),
                    Err(_) => {}
                }
            }
        }
        left
    }
}

/// The v1 hierarchies mounted under `/sys/fs/cgroup` other than airlock's (none on v2:
/// its single hierarchy is airlock's).
fn other_hierarchies(layout: &CgroupLayout) -> Vec<PathBuf> {
    if let CgroupLayout::V2(_) = layout {
        return Vec::new();
    }
    let ours: Vec<PathBuf> = layout
        .roots()
        .iter()
        .filter_map(|r| std::fs::canonicalize(r).ok())
        .collect();
    let Ok(entries) = std::fs::read_dir(crate::cgroup::CGROUP_ROOT) else {
        return Vec::new();
    };
    let mut others: Vec<PathBuf> = entries
        .flatten()
        .filter_map(|e| std::fs::canonicalize(e.path()).ok())
        .filter(|root| root.join("cgroup.procs").exists() && !ours.contains(root))
        .collect();
    others.sort();
    others.dedup();
    others
}

/// What runsc left of a dead supervisor's sandbox `airlock/<name>` in any hierarchy
/// (doctor's reaping, health.rs: which of them runsc made is not known any more).
fn remove_runsc_cgroups(name: &str) -> Vec<String> {
    let Ok(hierarchies) = std::fs::read_dir("/sys/fs/cgroup") else {
        return Vec::new();
    };
    let mut left = Vec::new();
    for hierarchy in hierarchies.flatten() {
        let dir = hierarchy.path().join("airlock").join(name);
        match std::fs::remove_dir(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => left.push(format!("{}: {e}", dir.display())),
        }
    }
    left
}

/// Mounts of this process's mount namespace at or below `dir`.
fn mounts_under(dir: &Path) -> Vec<String> {
    let prefix = dir.to_string_lossy().into_owned();
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .filter(|point| *point == prefix || point.starts_with(&format!("{prefix}/")))
        .map(|point| format!("mount {point}"))
        .collect()
}

/// The supervisor's side of the payload's stdio while the sandbox runs.
struct Supervision {
    capture: OutputCapture,
    stdout: Option<OwnedFd>,
    stderr: Option<OwnedFd>,
    /// The master of the payload's terminal (a plan with `terminal`): its output is the
    /// payload's stdout, as natively.
    terminal: Option<OwnedFd>,
    stdout_sink: Option<OwnedFd>,
    stderr_sink: Option<OwnedFd>,
    relay: Option<StdinRelay>,
    /// The caller's terminal, raw for the run: its resizes go to the master.
    caller_terminal: Option<CallerTerminal>,
    /// A signal taken for the caller's terminal that ends this process: the sandbox is
    /// killed at once and torn down first.
    fatal_signal: Option<libc::c_int>,
}

/// Where the deadline is: the payload runs, was sent SIGTERM at a moment, or the whole
/// sandbox was killed.
#[derive(Clone, Copy)]
enum Deadline {
    Running(Instant),
    Terminating(Instant),
    Killed,
}

impl Supervision {
    /// Output, stdin and the deadline, until `runsc run` ended.
    fn until_exit(
        &mut self,
        sandbox: &SandboxHandles<'_>,
        deadline: Instant,
        sandbox_exit: OwnedFd,
        observed: &mut Observed,
        seen: &mut std::collections::BTreeSet<libc::pid_t>,
    ) -> Result<(), CellError> {
        for fd in [&self.stdout, &self.stderr].into_iter().flatten() {
            sys::set_nonblocking(fd.as_fd()).map_err(|e| CellError::io("output pipe", e))?;
        }
        let mut state = Deadline::Running(deadline);
        loop {
            if self.poll_once(&sandbox_exit, state_timeout(state))? {
                return Ok(());
            }
            state = match (self.fatal_signal, state) {
                (Some(_), Deadline::Running(_) | Deadline::Terminating(_)) => {
                    kill_sandbox(sandbox, seen);
                    Deadline::Killed
                }
                _ => advance(state, sandbox, observed, seen),
            };
        }
    }

    /// One poll round; true once `runsc run` ended.
    fn poll_once(&mut self, sandbox_exit: &OwnedFd, timeout_ms: i32) -> Result<bool, CellError> {
        let relay = self.relay.as_ref().map(StdinRelay::interest);
        let raw = |fd: &Option<OwnedFd>| fd.as_ref().map_or(-1, |f| f.as_raw_fd());
        let signals = (self.caller_terminal.as_ref())
            .and_then(CallerTerminal::signals)
            .map_or(-1, |fd| fd.as_raw_fd());
        let mut fds = [
            pollfd(sandbox_exit.as_raw_fd(), libc::POLLIN),
            pollfd(raw(&self.stdout), libc::POLLIN),
            pollfd(raw(&self.stderr), libc::POLLIN),
            pollfd(relay.as_ref().map_or(-1, |r| r.source), libc::POLLIN),
            pollfd(relay.as_ref().map_or(-1, |r| r.sink), libc::POLLOUT),
            pollfd(raw(&self.terminal), libc::POLLIN),
            pollfd(signals, libc::POLLIN),
        ];
        match sys::poll(&mut fds, timeout_ms) {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => return Ok(false),
            Err(e) => return Err(CellError::io("poll", e)),
        }
        let ready = |i: usize| fds[i].revents != 0;
        if ready(1) {
            self.forward(Pipe::Stdout);
        }
        if ready(2) {
            self.forward(Pipe::Stderr);
        }
        if let Some(relay) = self.relay.as_mut() {
            if ready(3) {
                relay.on_source_ready();
            }
            if ready(4) {
                relay.on_sink_ready();
            }
        }
        if ready(5) {
            self.forward(Pipe::Terminal);
        }
        if ready(6) {
            self.take_signals();
        }
        Ok(ready(0))
    }

    /// The caller's terminal's signals: a resize is copied to the master, a fatal one
    /// kept for the end.
    fn take_signals(&mut self) {
        let master = self.terminal.as_ref().map(|m| m.as_fd());
        if let Some(caller) = self.caller_terminal.as_mut() {
            if let Some(signal) = caller.take_signals(master) {
                self.fatal_signal.get_or_insert(signal);
            }
        }
    }

    /// Reads what one pipe has and forwards what the output cap allows.
    fn forward(&mut self, pipe: Pipe) {
        let (fd, sink) = match pipe {
            Pipe::Stdout => (&mut self.stdout, &self.stdout_sink),
            Pipe::Stderr => (&mut self.stderr, &self.stderr_sink),
            // EIO once the sandbox closed the pty's replica: the end, as for a pipe.
            Pipe::Terminal => (&mut self.terminal, &self.stdout_sink),
        };
        let Some(source) = fd.as_ref() else { return };
        let mut chunk = [0u8; 65536];
        match sys::read(source.as_fd(), &mut chunk) {
            Ok(0) => *fd = None,
            Ok(n) => {
                let allowed = self.capture.accept(pipe.stream(), &chunk[..n]);
                if let Some(sink) = sink {
                    write_all(sink, allowed);
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => *fd = None,
        }
    }

    /// What is left in the pipes once the sandbox ended: up to EOF, or to "nothing more
    /// now" should a process of the sandbox still hold a write end.
    fn drain(&mut self) {
        for pipe in [Pipe::Stdout, Pipe::Stderr, Pipe::Terminal] {
            for _ in 0..4096 {
                let seen = |c: &OutputCapture| c.stdout.bytes_seen + c.stderr.bytes_seen;
                let before = seen(&self.capture);
                let open = match pipe {
                    Pipe::Stdout => self.stdout.is_some(),
                    Pipe::Stderr => self.stderr.is_some(),
                    Pipe::Terminal => self.terminal.is_some(),
                };
                if !open {
                    break;
                }
                self.forward(pipe);
                if seen(&self.capture) == before {
                    break;
                }
            }
        }
    }
}

/// One of the payload's outputs: a pipe, or its terminal's master.
#[derive(Clone, Copy)]
enum Pipe {
    Stdout,
    Stderr,
    Terminal,
}

impl Pipe {
    fn stream(self) -> Stream {
        match self {
            // A terminal merges stdout and stderr, as natively.
            Pipe::Stdout | Pipe::Terminal => Stream::Stdout,
            Pipe::Stderr => Stream::Stderr,
        }
    }
}

fn write_all(sink: &OwnedFd, mut bytes: &[u8]) {
    while !bytes.is_empty() {
        match sys::write(sink.as_fd(), bytes) {
            Ok(0) => return,
            Ok(n) => bytes = &bytes[n..],
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            // A sink that went away loses the forwarded copy; the capture keeps its own.
            Err(_) => return,
        }
    }
}

fn pollfd(fd: i32, events: libc::c_short) -> libc::pollfd {
    libc::pollfd {
        fd,
        events,
        revents: 0,
    }
}

/// How long the poll may sleep in `state`.
fn state_timeout(state: Deadline) -> i32 {
    let until = match state {
        Deadline::Running(at) => at,
        Deadline::Terminating(sent) => sent + TERM_GRACE,
        Deadline::Killed => return 100,
    };
    let left = until.saturating_duration_since(Instant::now());
    i32::try_from(left.as_millis()).unwrap_or(i32::MAX).max(1)
}

/// What the deadline acts on: runsc's command line, the `runsc run` process and the
/// sandbox's cgroup.
struct SandboxHandles<'a> {
    runsc: &'a Runsc,
    runsc_pid: libc::pid_t,
    cgroup: &'a CellCgroup,
}

/// The deadline's next step, from outside the sandbox: SIGTERM to every process of the
/// container at the deadline; after the grace, SIGKILL to every host process of the
/// sandbox (the Sentry and the gofer: the payload's processes exist only inside them)
/// and to `runsc run`, which is outside the cgroup (teardown deletes what it leaves).
/// The processes killed are added to `seen` first: the platform's stubs, born during the
/// run, are reaped (and their CPU counted) only if they are known.
fn advance(
    state: Deadline,
    sandbox: &SandboxHandles<'_>,
    observed: &mut Observed,
    seen: &mut std::collections::BTreeSet<libc::pid_t>,
) -> Deadline {
    let now = Instant::now();
    match state {
        Deadline::Running(at) if now >= at => {
            observed.deadline_fired = true;
            // A sandbox already gone has nothing to signal; the kill follows anyway.
            let _ = sandbox.runsc.kill_all("SIGTERM");
            Deadline::Terminating(now)
        }
        Deadline::Terminating(sent) if now >= sent + TERM_GRACE => {
            kill_sandbox(sandbox, seen);
            Deadline::Killed
        }
        other => other,
    }
}

/// SIGKILL to every host process of the sandbox and to `runsc run`, each added to `seen`
/// first (see [`advance`]).
fn kill_sandbox(sandbox: &SandboxHandles<'_>, seen: &mut std::collections::BTreeSet<libc::pid_t>) {
    seen.extend(sandbox.cgroup.pids());
    let _ = sandbox.cgroup.kill_all();
    let _ = sys::kill(sandbox.runsc_pid, libc::SIGKILL);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_broker_socket_is_refused_to_sessions_and_parked_cells_only() {
        let mut contract = airlock_contract::default_contract();
        contract.isolation = Isolation::Gvisor;
        contract.broker_actions = vec!["notify".into()];
        let argv = ["/bin/true".to_string()];
        let mut plan = airlock_contract::compile(
            &contract,
            &airlock_contract::CompileInput::new(Path::new("/"), &argv),
        )
        .unwrap();
        plan.mounts.push(airlock_contract::MountPlan::BrokerSocket {
            source: "/run/x/broker.sock".into(),
            target: airlock_contract::BROKER_SOCKET.into(),
        });
        match preflight(&plan) {
            Err(CellError::Unavailable { control, .. }) => assert_eq!(control, "gvisor.broker"),
            other => panic!("a session with a broker socket: {other:?}"),
        }
        assert!(
            has_routes(&plan),
            "a one-shot run serves it through a forwarder"
        );
        plan.mounts.pop();
        plan.broker = None;
        plan.terminal = true;
        match preflight(&plan) {
            Err(CellError::Unavailable { control, .. }) => assert_eq!(control, "gvisor.terminal"),
            other => panic!("a session with a terminal: {other:?}"),
        }
    }

    #[test]
    fn what_runsc_made_of_its_path_is_removed_and_what_was_there_is_left() {
        let root = tempfile::tempdir().unwrap();
        let (cpuset, blkio) = (root.path().join("cpuset"), root.path().join("blkio"));
        std::fs::create_dir_all(cpuset.join("kubepods")).unwrap();
        std::fs::create_dir_all(&blkio).unwrap();
        let relative = Path::new("kubepods/c1/cell");
        let made = RunscCgroups::in_hierarchies(vec![cpuset.clone(), blkio.clone()], relative);
        // runsc makes the whole path; meanwhile a sibling container uses blkio's parent.
        std::fs::create_dir_all(cpuset.join(relative)).unwrap();
        std::fs::create_dir_all(blkio.join(relative)).unwrap();
        std::fs::create_dir_all(blkio.join("kubepods/c2")).unwrap();
        assert!(made.remove().is_empty());
        assert!(cpuset.join("kubepods").is_dir(), "there before: left");
        assert!(!cpuset.join("kubepods/c1").exists());
        assert!(!blkio.join("kubepods/c1").exists());
        assert!(
            blkio.join("kubepods/c2").is_dir(),
            "a sibling's parent is left"
        );
    }

    #[test]
    fn the_cpu_of_reaped_processes_adds_to_the_sandbox_process_own() {
        let usage = |sec, usec| {
            let mut r = sys::zero_rusage();
            r.ru_utime = libc::timeval {
                tv_sec: sec,
                tv_usec: usec,
            };
            r.ru_stime = libc::timeval {
                tv_sec: 0,
                tv_usec: usec,
            };
            r
        };
        let sum = add_cpu(Some(usage(1, 600_000)), Some(usage(0, 700_000))).unwrap();
        assert_eq!((sum.ru_utime.tv_sec, sum.ru_utime.tv_usec), (2, 300_000));
        assert_eq!((sum.ru_stime.tv_sec, sum.ru_stime.tv_usec), (1, 300_000));
        assert!(add_cpu(None, None).is_none());
        let one = add_cpu(None, Some(usage(3, 0))).unwrap();
        assert_eq!(one.ru_utime.tv_sec, 3);
    }

    #[test]
    fn the_pids_backstop_leaves_room_for_the_sandbox_and_its_stubs() {
        let limits = Limits {
            cpu_millis: 1000,
            memory_bytes: 256 << 20,
            process_limit: 32,
            wall_time_ms: 1000,
            output_bytes: 1 << 20,
            open_files: 1024,
            file_size_bytes: 1 << 20,
            shm_bytes: 64 << 20,
        };
        let sandbox = sandbox_limits(&limits, false);
        assert_eq!(sandbox.cell_pids_max(), 64 + 16 * 32);
        assert_eq!(sandbox.memory_bytes, limits.memory_bytes);
        assert_eq!(sandbox.cpu_millis, limits.cpu_millis);
        // In a container cgroup `runsc run` (the supervisor's child) counts too.
        let in_container = sandbox_limits(&limits, true);
        assert_eq!(in_container.cell_pids_max(), 64 + 16 * 32 + RUNSC_RUN_TASKS);
    }

    #[test]
    fn a_sandbox_gone_without_a_ceiling_is_unexplained_and_with_one_is_a_kill() {
        let gone = observed_ending(
            Observed::default(),
            WaitOutcome::SandboxGone,
            CgroupUsage::default(),
            Vec::new(),
        );
        assert!(gone.ended.is_none());
        let oom = observed_ending(
            Observed::default(),
            WaitOutcome::SandboxGone,
            CgroupUsage {
                oom_kills: 1,
                ..CgroupUsage::default()
            },
            Vec::new(),
        );
        assert_eq!(oom.ended.map(|e| e.wait_status), Some(libc::SIGKILL));
        let exited = observed_ending(
            Observed::default(),
            WaitOutcome::Exited(3),
            CgroupUsage::default(),
            Vec::new(),
        );
        assert_eq!(exited.ended.map(|e| e.wait_status), Some(3 << 8));
    }
}
