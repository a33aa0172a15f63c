//! The trusted side of a run: prepares everything a cell needs, clones it, releases it,
//! streams its output, enforces the deadline from outside, collects artifacts, destroys it
//! and derives the result. Poll-driven. The process must be single-threaded when the
//! cell is cloned (checked); after that the egress proxy runs on its own thread and a
//! helper thread holds the cell's mount namespace (see CellMounts).

use crate::artifacts::{self, ArtifactRequest};
use crate::cgroup::{cgroup_name, CellCgroup, CgroupLayout};
use crate::error::CellError;
use crate::host_identity::{HostIdRange, HostIdentity, HostLease};
use crate::launcher::{self, ChildSetup, Stage};
use crate::output::{OutputCapture, Stream};
use crate::protocol::{self, EgressListeners, LaunchFailure, PayloadEnded};
use crate::report::{Ceiling, CleanupReport, ExitInfo, ResultClass, RunReport, Timings, Usage};
use crate::stdin_relay::{StdinRecord, StdinRelay};
use crate::terminal::{CallerTerminal, DEFAULT_WINDOW};
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

/// Longest we wait for the cell's pipes to close after its pid 1 is gone.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(2);
/// Bytes read from the payload's stdout or stderr at a time (a full pipe).
const OUTPUT_CHUNK: usize = 64 * 1024;

/// The egress proxy, started once the cell hands over its listeners.
pub trait EgressSession {
    /// Takes the sockets bound inside the cell's netns (HTTP proxy, SOCKS5, the
    /// resolver, the transparent listeners), already checked against the plan.
    fn start(&mut self, listeners: EgressListeners) -> Result<(), String>;
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
    /// The payload's stdin.
    pub stdin: PayloadStdin,
    /// `(variable, value)` of every credential of the plan, from [`credential_env`].
    pub credentials: &'a [(String, String)],
    /// Where the cell's own host uid and gid come from, as root (see host_identity.rs).
    pub host_ids: HostIdRange,
}

/// What the payload reads on stdin. For a plan with a terminal, a relayed stdin (a
/// terminal included) goes into the terminal's master instead of a pipe.
pub enum PayloadStdin {
    /// The cell's /dev/null: the caller's stdin is a terminal (which would give the cell a
    /// handle to the caller's tty), /dev/null, or there is none.
    Null,
    /// Anything else (a pipe, a socket, a file), relayed into a pipe of the cell as it
    /// arrives and hashed on the way (see [`crate::stdin_relay`]); the report's `stdin`
    /// says what was read.
    Relayed(OwnedFd),
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

/// Writes the user namespace maps of the child: the cell identity maps to its own host
/// ids, which are never root.
fn write_id_maps(pid: libc::pid_t, plan: &CellPlan, host: HostIdentity) -> Result<(), CellError> {
    let (host_uid, host_gid) = (host.uid, host.gid);
    let write = |file: &str, text: String| {
        std::fs::write(format!("/proc/{pid}/{file}"), text)
            .map_err(|e| CellError::io(format!("writing {file} of the cell"), e))
    };
    write("setgroups", "deny".into())?;
    write("uid_map", format!("{} {host_uid} 1\n", plan.identity.uid))?;
    write("gid_map", format!("{} {host_gid} 1\n", plan.identity.gid))
}

/// Gives the cell's ends of its stdio pipes to the cell identity. A pipe is created owned
/// by its creator with mode 0600, and re-opening it through `/dev/stdin` (that is,
/// `/proc/self/fd/0`) checks that mode: owned by root outside the cell's maps, a payload
/// could use its fd 0/1/2 but not `/dev/stdin`, `/dev/stdout` or `/dev/stderr`. Owned by
/// the cell identity, still 0600, nobody else gains access.
fn give_pipes_to_cell(host: HostIdentity, ends: &[&OwnedFd]) -> Result<(), CellError> {
    if sys::geteuid() != 0 {
        // Created by the caller's uid, which is what the cell identity maps to.
        return Ok(());
    }
    for end in ends.iter() {
        sys::fchown(end.as_fd(), host.uid, host.gid)
            .map_err(|e| CellError::io("chown of a pipe", e))?;
    }
    Ok(())
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
    stdin_relay: Option<StdinRelay>,
    /// For a plan with a terminal: the caller's stdin, relayed into the terminal's master
    /// once the cell sends it.
    terminal_input: Option<OwnedFd>,
}

fn open_pipes(
    plan: &CellPlan,
    stdin: PayloadStdin,
    host: HostIdentity,
) -> Result<Pipes, CellError> {
    let pipe = || sys::pipe_cloexec().map_err(|e| CellError::io("pipe", e));
    let (stdout_read, stdout_write) = pipe()?;
    let (stderr_read, stderr_write) = pipe()?;
    let (notify_read, notify_write) = pipe()?;
    let (sync_parent, sync_child) =
        sys::seqpacket_pair().map_err(|e| CellError::io("socketpair", e))?;
    let null = || -> Result<OwnedFd, CellError> {
        Ok(File::open("/dev/null")
            .map_err(|e| CellError::io("/dev/null", e))?
            .into())
    };
    let mut terminal_input = None;
    let (stdin, stdin_relay) = match stdin {
        // The payload reads its terminal; pid 1's own stdin is the null device.
        PayloadStdin::Relayed(source) if plan.terminal => {
            terminal_input = Some(source);
            (null()?, None)
        }
        PayloadStdin::Null => (
            File::open("/dev/null")
                .map_err(|e| CellError::io("/dev/null", e))?
                .into(),
            None,
        ),
        PayloadStdin::Relayed(source) => {
            let (relay, cell_end) =
                StdinRelay::new(source).map_err(|e| CellError::io("stdin pipe", e))?;
            give_pipes_to_cell(host, &[&cell_end])?;
            (cell_end, Some(relay))
        }
    };
    give_pipes_to_cell(host, &[&stdout_write, &stderr_write])?;
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
        stdin_relay,
        terminal_input,
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
    artifacts: Option<artifacts::ArtifactReport>,
    /// The output mounts, held from the payload's start until the artifacts are
    /// collected (see [`artifacts::OutputMounts`]).
    output_mounts: artifacts::OutputMounts,
    run_id: String,
    released_ms: f64,
    ended_at: Option<Instant>,
    /// What was relayed on stdin, when it was.
    stdin: Option<StdinRecord>,
    /// See [`RunReport::notes`].
    notes: Vec<String>,
    /// Size of the cell's `/dev/shm` (see [`shm_exhausted`]).
    shm_bytes: u64,
}

/// For a plan with a terminal whose caller's stdin is a terminal too: that terminal,
/// raw for the run (see [`crate::terminal`]).
fn enter_caller_terminal(
    plan: &CellPlan,
    stdin: &PayloadStdin,
) -> Result<Option<CallerTerminal>, CellError> {
    match stdin {
        PayloadStdin::Relayed(fd) if plan.terminal && sys::is_terminal(fd.as_fd()) => {
            CallerTerminal::enter(fd.as_fd())
                .map(Some)
                .map_err(|e| CellError::io("the caller's terminal", e))
        }
        _ => Ok(None),
    }
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
    // Held until the cell is gone (finish_run); opened before the clone, so the cell's
    // pid 1 holds the slot too (see host_identity.rs).
    let lease = crate::host_identity::lease_for_cell(options.host_ids)?;
    let host = lease.identity();
    // Before the clone and any thread: the signals it takes must be blocked everywhere.
    let mut caller_terminal = enter_caller_terminal(plan, &options.stdin)?;
    // The cell is cloned next: while it creates its network namespace (the costliest
    // step of a cell start), the supervisor prepares what the release message carries.
    // The CPUs the payload may use: the supervisor's own.
    let payload_cpus = sys::allowed_cpus().ok();
    let cell = spawn_cell(
        plan,
        &env,
        options,
        host,
        payload_cpus.as_ref(),
        caller_terminal.as_mut(),
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
            write_id_maps(cell.pid, plan, host)?;
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
        let (mut mounts, notes) = rootfs::prepare_sources(plan, host).map_err(launch_error)?;
        mounts.extend(rootfs::prepare_cgroup_view(&cgroup.view()).map_err(launch_error)?);
        Ok(Release {
            program,
            mounts,
            notes,
        })
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
    supervision.caller_terminal = caller_terminal;
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
                // The payload gets CPUs of the caller's back (see other_cpu): as many as
                // its quota can use, which is what runtimes that size their thread pools
                // from the affinity mask (nproc, Go, the JVM, libuv) then see. They start
                // at a CPU other than this thread's, where the cell did its setup: the
                // supervisor is busy finishing the record while the payload starts.
                let allowed = cpus.cpus();
                let spread = other_cpu(cpus)
                    .and_then(|cpu| allowed.iter().position(|c| *c == cpu))
                    .unwrap_or(0);
                let mask = payload_cpu_set(&allowed, plan.limits.cpu_millis, spread);
                let _ = sys::set_affinity(supervision.pid, &sys::CpuSet::of(&mask));
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
    finish_run(plan, options, &layout, (cgroup, lease), result, milestones)
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
    plan: &CellPlan,
    options: &mut RunOptions<'_>,
    layout: &CgroupLayout,
    (cgroup, lease): (CellCgroup, HostLease),
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
    let host = lease.identity();
    // Clean only when nothing of the cell can be left (see host_identity.rs).
    lease.release(leftovers.is_empty());
    let (mut observed, output, stale_cgroups_left) = result?;
    collect_after_cell_died(plan, options, &mut observed);
    let egress = options.egress.as_mut().map(|session| session.finish());
    let mut report = classify(options, observed, output, usage_counters, egress);
    report.cgroup_version = Some(layout.version());
    report.host_identity = Some(host);
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
    stdin_relay: Option<StdinRelay>,
    terminal_input: Option<OwnedFd>,
}

/// Kills a cell whose payload must not start (or that will not even be released) and
/// reaps its pid 1.
fn kill_and_reap(pidfd: &OwnedFd, pid: libc::pid_t) {
    let _ = sys::pidfd_send_signal(pidfd.as_fd(), libc::SIGKILL);
    let _ = sys::wait_child(pid, false);
}

/// The CPUs a payload with a quota of `cpu_millis` may run on: `ceil(cpu_millis / 1000)`
/// of `allowed` (at least one, at most all), starting at index `spread` (the CPU the cell
/// set itself up on, which other_cpu spreads over concurrent cells). A pure decision: the quota (cpu.max) is what limits
/// the CPU time; the mask only tells the payload how many CPUs that time is worth.
fn payload_cpu_set(allowed: &[usize], cpu_millis: u32, spread: usize) -> Vec<usize> {
    if allowed.is_empty() {
        return Vec::new();
    }
    let wanted = (cpu_millis as usize).div_ceil(1000).clamp(1, allowed.len());
    let mut chosen: Vec<usize> = (0..wanted)
        .map(|i| allowed[(spread + i) % allowed.len()])
        .collect();
    chosen.sort_unstable();
    chosen
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
    host: HostIdentity,
    payload_cpus: Option<&sys::CpuSet>,
    caller_terminal: Option<&mut CallerTerminal>,
    supervisor_command_line: &sys::CommandLineArea,
) -> Result<SpawnedCell, CellError> {
    let window = caller_terminal
        .as_ref()
        .map_or(DEFAULT_WINDOW, |t| t.window());
    let stdin = std::mem::replace(&mut options.stdin, PayloadStdin::Null);
    let pipes = open_pipes(plan, stdin, host)?;
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
        stdin_relay,
        terminal_input,
    } = pipes;
    // pid 1 is a clone of this process, not an exec: without a name of its own its
    // /proc/1/cmdline would show the payload this process's command line, host paths of
    // the contract, the operator config and the state dir among it.
    // Created with the cell's host ids, so that they own its user namespace.
    let cloned = crate::host_identity::clone_owned_by(host, || {
        sys::clone_cell_named(CELL_NAMESPACES, supervisor_command_line, PID1_NAME)
    })?;
    match cloned {
        Ok(sys::CloneOutcome::Child) => {
            // No handle to the caller's stdin or terminal stays in the cell.
            drop((
                stdout_read,
                stderr_read,
                notify_read,
                sync_parent,
                stdin_relay,
                terminal_input,
            ));
            if let Some(terminal) = caller_terminal {
                terminal.forget();
            }
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
                window,
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
                stdin_relay,
                terminal_input,
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
    /// For the result: what the mounts could not give as planned.
    notes: Vec<String>,
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
        stdin_relay,
        terminal_input,
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
            notes: release.notes,
            shm_bytes: plan.limits.shm_bytes,
            ..Observed::default()
        },
        deadline: Deadline::Pending(released_at + Duration::from_millis(plan.limits.wall_time_ms)),
        stream_output: options.stream_output,
        cgroup,
        stdin_relay,
        terminal_input,
        terminal: None,
        caller_terminal: None,
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
    /// `None` unless the caller's stdin is relayed; taken when pid 1 is gone.
    stdin_relay: Option<StdinRelay>,
    /// The caller's stdin, waiting for the payload's terminal (then relayed into it).
    terminal_input: Option<OwnedFd>,
    /// The master of the payload's terminal, once the cell sent it; `None` again at its
    /// end (every holder of the slave is gone).
    terminal: Option<OwnedFd>,
    /// The caller's terminal, raw until the run ends (restored when this is dropped).
    caller_terminal: Option<CallerTerminal>,
}

/// A `poll` entry waiting for input on `fd` (negative fds are ignored by poll).
fn poll_in(fd: i32) -> libc::pollfd {
    libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    }
}

/// A `poll` entry waiting for room to write on `fd` (errors and hang-ups are always
/// reported).
fn poll_out(fd: i32) -> libc::pollfd {
    libc::pollfd {
        fd,
        events: libc::POLLOUT,
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
            let relay = self.stdin_relay.as_ref().map(StdinRelay::interest);
            let mut fds = [
                poll_in(raw(&self.stdout)),
                poll_in(raw(&self.stderr)),
                poll_in(raw(&self.notify)),
                poll_in(raw(&self.sync)),
                poll_in(self.pidfd.as_raw_fd()),
                poll_in(relay.as_ref().map_or(-1, |r| r.source)),
                poll_out(relay.as_ref().map_or(-1, |r| r.sink)),
                poll_in(raw(&self.terminal)),
                poll_in(
                    self.caller_terminal
                        .as_ref()
                        .and_then(CallerTerminal::signals)
                        .map_or(-1, |fd| fd.as_raw_fd()),
                ),
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
                self.hold_output_mounts(options);
            }
            if ready(3) {
                self.read_message(options)?;
            }
            if let Some(relay) = self.stdin_relay.as_mut() {
                if ready(5) {
                    relay.on_source_ready();
                }
                if fds[6].revents != 0 {
                    relay.on_sink_ready();
                }
            }
            if ready(7) {
                self.pump_terminal(&mut buf);
            }
            if fds[8].revents != 0 {
                if let Some(caller) = self.caller_terminal.as_mut() {
                    caller.on_signals(self.terminal.as_ref().map(|t| t.as_fd()));
                }
            }
            if ready(4) {
                // pid 1 is gone, and with it every process of the pid namespace.
                self.observed.ended_at = Some(Instant::now());
                self.observed.stdin = self.stdin_relay.take().map(StdinRelay::finish);
                if let Ok(Some(reaped)) = sys::wait_child(self.pid, false) {
                    self.observed.pid1_status = Some(reaped.status);
                    self.observed.rusage = Some(reaped.usage);
                }
                self.drain(&mut buf);
                // Restored before anything else is printed.
                drop(self.caller_terminal.take());
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
                self.forward(stream, &buf[..n]);
                true
            }
        }
    }

    /// Counts `chunk` against `output_bytes` and forwards what the budget allows.
    fn forward(&mut self, stream: Stream, chunk: &[u8]) {
        let is_stdout = matches!(stream, Stream::Stdout);
        let forward = self.output.accept(stream, chunk);
        if self.stream_output && !forward.is_empty() {
            let _ = if is_stdout {
                std::io::stdout()
                    .write_all(forward)
                    .and_then(|_| std::io::stdout().flush())
            } else {
                std::io::stderr().write_all(forward)
            };
        }
    }

    /// Reads one chunk of the payload's terminal: its stdout and stderr, merged as a
    /// terminal merges them. EIO (the last holder of the slave closed it) is its end.
    fn pump_terminal(&mut self, buf: &mut Vec<u8>) {
        if buf.is_empty() {
            buf.resize(OUTPUT_CHUNK, 0);
        }
        let Some(master) = self.terminal.as_ref() else {
            return;
        };
        match sys::read(master.as_fd(), buf) {
            Err(err) if err.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(err) if err.kind() == std::io::ErrorKind::Interrupted => {}
            Ok(0) | Err(_) => self.terminal = None,
            Ok(n) => self.forward(Stream::Stdout, &buf[..n]),
        }
    }

    /// The cell sent the master of the payload's terminal: relay the caller's stdin into
    /// it from now on.
    fn take_terminal(&mut self, master: OwnedFd) {
        if let Some(source) = self.terminal_input.take() {
            // Without a relay the payload's terminal gets no input; its output still
            // counts.
            self.stdin_relay = StdinRelay::into_terminal(source, &master).ok();
        }
        self.terminal = Some(master);
    }

    /// After pid 1 exited: read what is left in the pipes, bounded in time.
    fn drain(&mut self, buf: &mut Vec<u8>) {
        let until = Instant::now() + DRAIN_TIMEOUT;
        while self.stdout.is_some() || self.stderr.is_some() || self.terminal.is_some() {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            let mut fds = [
                poll_in(raw(&self.stdout)),
                poll_in(raw(&self.stderr)),
                poll_in(raw(&self.terminal)),
            ];
            if sys::poll(&mut fds, left.as_millis() as i32).unwrap_or(0) == 0 {
                continue;
            }
            if fds[0].revents != 0 {
                self.pump(Stream::Stdout, buf);
            }
            if fds[1].revents != 0 {
                self.pump(Stream::Stderr, buf);
            }
            if fds[2].revents != 0 {
                self.pump_terminal(buf);
            }
        }
        if self.notify.is_some() {
            self.read_exec_notification();
        }
    }

    /// Once the payload runs, the cell's mounts are final: opens the ones that hold
    /// declared outputs, so they can be collected even if pid 1 dies with the payload.
    fn hold_output_mounts(&mut self, options: &RunOptions<'_>) {
        let running = self.observed.exec_done_at.is_some();
        if running && wanted_artifacts(self.plan, options).is_some() {
            self.observed.output_mounts = artifacts::OutputMounts::open(self.pid, self.plan);
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
        let (buf, mut fds) = match sys::recv_message(sync.as_fd(), protocol::MAX_LISTENER_FDS) {
            Ok(Some(message)) => message,
            _ => return Ok(()),
        };
        self.sync = Some(sync);
        let body = &buf[1..];
        match buf[0] {
            protocol::FAILED => {
                self.observed.launch_failure = serde_json::from_slice(body).ok();
            }
            protocol::LISTENERS => {
                let started = match (
                    protocol::decode_listeners(&buf, fds, self.plan),
                    options.egress.as_mut(),
                ) {
                    (None, _) => Err("the cell's egress sockets are not the plan's".to_string()),
                    (Some(listeners), Some(session)) => session.start(listeners),
                    (Some(_), None) => {
                        Err("the plan allows egress but no proxy was configured".to_string())
                    }
                };
                if let Err(err) = started {
                    // Fail closed: no proxy means the cell must not run at all.
                    self.observed.egress_error = Some(err);
                    let _ = sys::pidfd_send_signal(self.pidfd.as_fd(), libc::SIGKILL);
                }
            }
            protocol::TERMINAL if fds.len() == 1 => {
                self.take_terminal(fds.pop().expect("one fd"));
            }
            protocol::ENDED => {
                self.observed.ended = serde_json::from_slice(body).ok();
                if let Some(request) = wanted_artifacts(self.plan, options) {
                    if self.observed.output_mounts.is_empty() {
                        // The payload's exec failed: nothing was held, pid 1 is alive.
                        self.observed.output_mounts =
                            artifacts::OutputMounts::open(self.pid, self.plan);
                    }
                    let mounts = std::mem::take(&mut self.observed.output_mounts);
                    self.observed.artifacts = Some(artifacts::collect(&mounts, self.plan, request));
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

/// What the caller asked to collect, if the plan declares any outputs.
fn wanted_artifacts<'o>(
    plan: &CellPlan,
    options: &'o RunOptions<'_>,
) -> Option<&'o ArtifactRequest> {
    options
        .artifacts
        .as_ref()
        .filter(|_| !plan.output_allowlist.is_empty())
}

/// Collects the artifacts of a cell whose pid 1 died before it could report the
/// payload's end (a memory kill of the whole cell), through the mounts held since the
/// payload started. Called once the cgroup is empty: nothing of the cell runs any more.
fn collect_after_cell_died(plan: &CellPlan, options: &RunOptions<'_>, observed: &mut Observed) {
    if observed.artifacts.is_some() || observed.output_mounts.is_empty() {
        return;
    }
    if let Some(request) = wanted_artifacts(plan, options) {
        let mounts = std::mem::take(&mut observed.output_mounts);
        observed.artifacts = Some(artifacts::collect(&mounts, plan, request));
    }
}

/// Picks the one class of the run from what was observed.
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
    let exit = payload_exit(&observed);
    let limits_hit = limits_hit(&observed, &output, &usage, exit);
    let verdict = verdict(&observed, &egress, &usage, exit, &limits_hit);
    let mut notes = observed.notes.clone();
    if verdict.limit == Some(Ceiling::Shm) && !shm_seen_full(&observed) {
        notes.push(format!(
            "the shm ceiling is inferred: the payload was killed by SIGBUS with {} MiB of \
             memory at its peak, at least the size of /dev/shm, which was no longer full when \
             the payload had ended",
            usage.memory_peak_bytes >> 20
        ));
    }
    RunReport {
        run_id: observed.run_id.clone(),
        status: verdict.status,
        exit,
        limit_fired: verdict.limit,
        limits_hit,
        error: verdict.error,
        exit_code: verdict.exit_code,
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
        artifacts: observed
            .artifacts
            .and_then(|a| serde_json::to_value(a).ok())
            .unwrap_or_default(),
        cleanup: CleanupReport::default(),
        stale_cgroups_left: Vec::new(),
        stdin: observed.stdin,
        notes,
        host_identity: None,
    }
}

/// How the payload ended: its status as pid 1 reported it or, when the whole cell was
/// killed (deadline, a memory kill that took pid 1 too) and pid 1 could not report, the
/// signal that killed pid 1, which took the payload with it.
fn payload_exit(observed: &Observed) -> ExitInfo {
    let reported = observed.ended.as_ref().map(|e| e.wait_status);
    let pid1_killed = observed.pid1_status.filter(|s| libc::WIFSIGNALED(*s));
    match reported.or(pid1_killed) {
        Some(s) if libc::WIFEXITED(s) => ExitInfo {
            code: Some(libc::WEXITSTATUS(s)),
            signal: None,
        },
        Some(s) if libc::WIFSIGNALED(s) => ExitInfo {
            code: None,
            signal: Some(libc::WTERMSIG(s)),
        },
        _ => ExitInfo::default(),
    }
}

/// The code `airlock run` returns for a payload that ended this way: its own, or 128 plus
/// the signal that killed it (137 when nothing is known: the cell was killed).
fn payload_code(exit: ExitInfo) -> i32 {
    exit.code
        .unwrap_or_else(|| exit.signal.map_or(137, |s| 128 + s))
}

/// Every ceiling the run reached, fatal or not: the deadline timer, the cgroup's oom kill
/// and pids refusal counters, the output counter, writable mounts left without space,
/// and `file_size_mb` (the payload killed by SIGXFSZ, or an artifact exactly at the
/// limit, which is where the kernel cuts a write short).
fn limits_hit(
    observed: &Observed,
    output: &OutputCapture,
    usage: &Usage,
    exit: ExitInfo,
) -> Vec<Ceiling> {
    let disk_full = observed
        .ended
        .as_ref()
        .is_some_and(|e| !e.full_mounts.is_empty());
    let artifact_cut = observed
        .artifacts
        .as_ref()
        .is_some_and(|a| a.kept.iter().any(|k| k.truncated));
    // Seen full by pid 1, or inferred from a SIGBUS death (see shm_exhausted); a full
    // writable path explains a SIGBUS first.
    let shm =
        shm_seen_full(observed) || (!disk_full && shm_exhausted(&exit, usage, observed.shm_bytes));
    [
        (Ceiling::WallTime, observed.deadline_fired),
        (Ceiling::Memory, usage.oom_kills > 0),
        (Ceiling::Pids, usage.pids_limit_hits > 0),
        (Ceiling::Shm, shm),
        (Ceiling::Disk, disk_full),
        (
            Ceiling::FileSize,
            exit.signal == Some(libc::SIGXFSZ) || artifact_cut,
        ),
        (Ceiling::OutputBytes, output.truncated),
    ]
    .into_iter()
    .filter_map(|(ceiling, hit)| hit.then_some(ceiling))
    .collect()
}

/// The class of a run, the ceiling that decided it and the code `airlock run` returns.
struct Verdict {
    status: ResultClass,
    limit: Option<Ceiling>,
    exit_code: i32,
    error: Option<String>,
}

impl Verdict {
    fn new(status: ResultClass, limit: Option<Ceiling>, exit_code: i32) -> Verdict {
        Verdict {
            status,
            limit,
            exit_code,
            error: None,
        }
    }

    fn because(mut self, error: impl Into<String>) -> Verdict {
        self.error = Some(error.into());
        self
    }
}

/// Order matters: what airlock itself saw fail or refused comes first, then what killed
/// the payload from outside (the deadline, the memory ceiling), then how the payload
/// ended on its own.
fn verdict(
    observed: &Observed,
    egress: &EgressSummary,
    usage: &Usage,
    exit: ExitInfo,
    hits: &[Ceiling],
) -> Verdict {
    let code = payload_code(exit);
    if let Some(failure) = &observed.launch_failure {
        let class = if failure.unavailable {
            ResultClass::SandboxUnavailable
        } else {
            ResultClass::RuntimeFault
        };
        let error = format!(
            "cell setup failed at {}: {}",
            failure.stage, failure.message
        );
        return Verdict::new(class, None, 125).because(error);
    }
    if let Some(err) = &observed.egress_error {
        let error = format!("egress proxy could not start: {err}");
        return Verdict::new(ResultClass::RuntimeFault, None, 125).because(error);
    }
    if egress.metadata_probes > 0 {
        let error = format!(
            "{} connection attempt(s) to a cloud metadata endpoint",
            egress.metadata_probes
        );
        return Verdict::new(ResultClass::SuspectedEscape, None, code).because(error);
    }
    if observed.deadline_fired {
        return Verdict::new(ResultClass::CapacityExceeded, Some(Ceiling::WallTime), 124);
    }
    if usage.oom_kills > 0 {
        // The kernel killed a process of the cell: the payload itself (its code is then
        // 137, also when the whole cell went and nobody could report) or one of its
        // children, after which the payload's own code stands.
        return Verdict::new(ResultClass::CapacityExceeded, Some(Ceiling::Memory), code);
    }
    if let Some(text) = &observed.exec_error {
        let code = text
            .split_whitespace()
            .next()
            .and_then(|c| c.parse().ok())
            .unwrap_or(126);
        return Verdict::new(ResultClass::TaskError, None, code).because(text.clone());
    }
    if exit.signal == Some(libc::SIGSYS) {
        // Only a foreign-architecture or x32 system call is killed by the filter.
        return Verdict::new(ResultClass::SuspectedEscape, None, code)
            .because("the payload was killed by seccomp for a system call of a foreign ABI");
    }
    if observed.ended.is_none() {
        return Verdict::new(ResultClass::RuntimeFault, None, 125)
            .because("the cell ended without reporting the payload's status");
    }
    payload_verdict(egress, exit, hits)
}

/// The class of a payload that ended on its own. A ceiling it hit decides the class only
/// if the payload then failed (or the ceiling's signal killed it): a payload that caught
/// a refused fork or write and exited 0 is `ok`, with the hit in `limits_hit`. Nothing
/// was killed by airlock, so the code is the payload's own.
fn payload_verdict(egress: &EgressSummary, exit: ExitInfo, hits: &[Ceiling]) -> Verdict {
    let code = payload_code(exit);
    if exit.signal == Some(libc::SIGXFSZ) {
        return Verdict::new(ResultClass::CapacityExceeded, Some(Ceiling::FileSize), code);
    }
    let failed_at = [
        Ceiling::Pids,
        Ceiling::Shm,
        Ceiling::Disk,
        Ceiling::FileSize,
    ]
    .into_iter()
    .find(|c| code != 0 && hits.contains(c));
    if let Some(ceiling) = failed_at {
        return Verdict::new(ResultClass::CapacityExceeded, Some(ceiling), code);
    }
    if hits.contains(&Ceiling::OutputBytes) {
        // The caller did not get all of the output: a result state whatever the exit.
        return Verdict::new(
            ResultClass::CapacityExceeded,
            Some(Ceiling::OutputBytes),
            code,
        );
    }
    match code {
        0 => Verdict::new(ResultClass::Ok, None, 0),
        _ if egress.denials > 0 => Verdict::new(ResultClass::PolicyDenied, None, code),
        _ => Verdict::new(ResultClass::TaskError, None, code),
    }
}

/// Whether a SIGBUS death is `/dev/shm` running out although it was not full when pid 1
/// looked: SIGBUS means a page of a mapping could not be backed, which in a cell is a full
/// tmpfs (a full writable path is caught before, as `disk`) or a file truncated under
/// its mapping. A helper of the payload may empty `/dev/shm` the moment the payload dies
/// (Python's resource tracker unlinks the segments it registered, and it learns of the
/// death before pid 1 does), so the evidence left is the cell's memory peak: tmpfs pages
/// are the cell's memory, and a peak below `/dev/shm`'s size means it never filled.
fn shm_exhausted(exit: &ExitInfo, usage: &Usage, shm_bytes: u64) -> bool {
    exit.signal == Some(libc::SIGBUS) && shm_bytes > 0 && usage.memory_peak_bytes >= shm_bytes
}

/// Pid 1 found `/dev/shm` full when the payload ended.
fn shm_seen_full(observed: &Observed) -> bool {
    observed.ended.as_ref().is_some_and(|e| e.shm_full)
}

#[cfg(test)]
mod tests {
    use super::payload_cpu_set;

    #[test]
    fn the_cpu_mask_matches_the_quota() {
        let allowed = [0, 1, 2, 3];
        assert_eq!(payload_cpu_set(&allowed, 1000, 0), [0]);
        assert_eq!(payload_cpu_set(&allowed, 250, 0), [0], "at least one CPU");
        assert_eq!(
            payload_cpu_set(&allowed, 1500, 0),
            [0, 1],
            "a part of a CPU counts"
        );
        assert_eq!(
            payload_cpu_set(&allowed, 64000, 0),
            [0, 1, 2, 3],
            "at most all"
        );
        assert!(payload_cpu_set(&[], 1000, 0).is_empty());
    }

    #[test]
    fn concurrent_cells_are_spread_over_the_allowed_cpus() {
        let allowed = [2, 5, 7];
        assert_eq!(payload_cpu_set(&allowed, 1000, 1), [5]);
        assert_eq!(payload_cpu_set(&allowed, 2000, 2), [2, 7], "wraps around");
    }
}
