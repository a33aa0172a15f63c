//! The trusted side of a run: prepares everything a cell needs, clones it, releases it,
//! starts its command, streams its output to the caller's sinks, enforces the deadline
//! from outside, collects artifacts, destroys it and derives the result. Poll-driven.
//! The process must be single-threaded when the cell is cloned (checked by
//! [`run_cell`]; the precondition of [`serve_cell`]); after that the egress proxy runs on
//! its own thread and a helper thread holds the cell's mount namespace (see CellMounts).
//!
//! Modules: `build` (clone, maps, cgroup, release, teardown), `supervise` (the poll
//! loop), `deadline` (its state machine), `classify` (the result class), `cpu` (CPU
//! placement), `serve` (a cell driven by the engine's control socket).

mod build;
mod ceilings;
pub(crate) mod classify;
mod cpu;
pub(crate) mod deadline;
pub(crate) mod interrupts;
pub(crate) mod serve;
pub(crate) mod session;
pub(crate) mod supervise;

pub(crate) use build::give_pipes_to_cell;
pub use deadline::TERM_GRACE;
pub use serve::{serve_cell, ServeMode, ServeOptions};

use crate::artifacts::ArtifactRequest;
use crate::error::CellError;
use crate::protocol::{CellCommand, CommandStdio, EgressListeners};
use crate::report::{EgressRecord, RunReport};
use crate::stdin_relay::StdinRelay;
use crate::sys;
use crate::terminal::CallerTerminal;
use airlock_contract::CellPlan;
use build::Preflight;
use std::fs::File;
use std::os::fd::{AsFd, OwnedFd};
use std::time::Instant;
use supervise::Sinks;

/// What `/proc/1/comm` and `/proc/1/cmdline` of a cell read.
pub const PID1_NAME: &std::ffi::CStr = c"airlock-init";

/// The egress proxy, started once the cell hands over its listeners.
pub trait EgressSession {
    /// Takes the sockets bound inside the cell's netns (HTTP proxy, SOCKS5, the
    /// resolver, the transparent listeners), already checked against the plan.
    fn start(&mut self, listeners: EgressListeners) -> Result<(), String>;
    /// Replaces the destinations of a running proxy: connections opened from now on are
    /// decided against them (a session's network change, docs/policy.md). An error when
    /// the proxy is not running.
    fn replace_destinations(
        &mut self,
        destinations: &[airlock_contract::DestinationRule],
    ) -> Result<(), String>;
    /// Stops the proxy and summarises what it saw.
    fn finish(&mut self) -> EgressSummary;
}

/// What the egress proxy reports for the result.
#[derive(Debug, Default)]
pub struct EgressSummary {
    /// One record per connection attempt.
    pub records: Vec<EgressRecord>,
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
    /// Where the payload's stdout (and, with a terminal, everything it prints) is
    /// forwarded as it arrives, within `output_bytes`; `None`: captured only. The CLI
    /// passes a copy of its fd 1.
    pub stdout_sink: Option<OwnedFd>,
    /// Where the payload's stderr is forwarded; the CLI passes a copy of its fd 2.
    pub stderr_sink: Option<OwnedFd>,
    /// The payload's stdin.
    pub stdin: PayloadStdin,
    /// `(variable, value)` of every credential of the plan (the CLI takes them from its
    /// environment with [`credential_env`]).
    pub credentials: &'a [(String, String)],
    /// Where the cell's own host uid and gid come from, as root (see host_identity.rs).
    pub host_ids: crate::host_identity::HostIdRange,
    /// The completion sequence's step when the verdict is `suspected_escape`: the
    /// writable paths are copied there before the cell is destroyed (crate::evidence).
    pub on_suspected_escape: Option<crate::evidence::OnSuspectedEscape>,
    /// An OCI runtime's container: further commands while the payload runs, and the
    /// console socket its terminal goes to (see [`crate::exec_door`]). `None` for
    /// everything else.
    pub doors: Option<crate::exec_door::ContainerDoors>,
}

impl RunOptions<'_> {
    /// A run with nothing attached: no hooks, egress, artifacts, sinks, stdin or
    /// credentials (doctor's end-to-end probes).
    pub fn bare(host_ids: crate::host_identity::HostIdRange) -> Self {
        RunOptions {
            before_start: None,
            started: Instant::now(),
            egress: None,
            artifacts: None,
            stdout_sink: None,
            stderr_sink: None,
            stdin: PayloadStdin::Null,
            credentials: &[],
            host_ids,
            on_suspected_escape: None,
            doors: None,
        }
    }
}

/// What the payload reads on stdin. For a plan with a terminal, a relayed stdin (a
/// terminal included) goes into the terminal's master instead of a pipe.
pub enum PayloadStdin {
    /// The null device: the caller's stdin is a terminal (which would give the cell a
    /// handle to the caller's tty), /dev/null, or there is none.
    Null,
    /// Anything else (a pipe, a socket, a file), relayed into a pipe of the cell as it
    /// arrives and hashed on the way (see [`crate::stdin_relay`]); the report's `stdin`
    /// says what was read.
    Relayed(OwnedFd),
}

/// Values taken from the supervisor's environment for the plan's credentials. A helper
/// for the CLI: other callers pass the values they hold.
pub fn credential_env(plan: &CellPlan) -> Result<Vec<(String, String)>, CellError> {
    credential_env_from(plan, |name| std::env::var(name).ok())
}

/// [`credential_env`] with the caller's environment given by `lookup` (a service takes
/// the values its hand-off client sent from its own environment).
pub fn credential_env_from(
    plan: &CellPlan,
    lookup: impl Fn(&str) -> Option<String>,
) -> Result<Vec<(String, String)>, CellError> {
    plan.credentials
        .iter()
        .map(|c| match lookup(&c.from_env) {
            Some(value) => Ok((c.env.clone(), value)),
            None => Err(CellError::MissingCredential {
                name: c.name.clone(),
                from_env: c.from_env.clone(),
            }),
        })
        .collect()
}

/// A command's environment: the plan's variables, the credential values the caller
/// resolved, then the command's own additions (a later name replaces an earlier one); a
/// credential of the plan without a value refuses the run.
pub(crate) fn command_environment(
    plan: &CellPlan,
    credentials: &[(String, String)],
    additions: &[(String, String)],
) -> Result<Vec<String>, CellError> {
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
    let mut env: Vec<(&str, &str)> = Vec::new();
    let all = plan
        .env
        .iter()
        .map(|v| (v.name.as_str(), v.value.as_str()))
        .chain(credentials.iter().map(|(n, v)| (n.as_str(), v.as_str())))
        .chain(additions.iter().map(|(n, v)| (n.as_str(), v.as_str())));
    for (name, value) in all {
        match env.iter_mut().find(|(n, _)| *n == name) {
            Some(entry) => entry.1 = value,
            None => env.push((name, value)),
        }
    }
    Ok(env
        .into_iter()
        // A NUL cannot be passed to execve; such a variable is left out.
        .filter(|(n, v)| !n.contains('\0') && !v.contains('\0'))
        .map(|(n, v)| format!("{n}={v}"))
        .collect())
}

/// The supervisor's side of one command's stdio, and the cell's ends that go with START.
pub(crate) struct CommandIo {
    pub stdio: CommandStdio,
    /// stdin, stdout, stderr of the command, sent with START and closed here then.
    pub cell_ends: Vec<OwnedFd>,
    pub stdout: Option<OwnedFd>,
    pub stderr: Option<OwnedFd>,
    pub stdin_relay: Option<StdinRelay>,
    /// For a plan with a terminal: the caller's stdin, relayed into the terminal's master.
    pub terminal_input: Option<OwnedFd>,
    pub sinks: Sinks,
    /// For a held command (serve.rs): the read end of the release pipe, sent with START.
    pub release: Option<OwnedFd>,
    /// A descriptor of the caller's whose hang-up destroys the cell (serve.rs, see
    /// [`crate::control::CommandSpec::watch_caller`]).
    pub caller: Option<OwnedFd>,
}

impl CommandIo {
    /// Pipes for the command's output and, for a relayed stdin, its input; with a
    /// terminal, none: the command uses the cell's terminal.
    fn open(
        plan: &CellPlan,
        host: crate::host_identity::HostIdentity,
        stdin: PayloadStdin,
        sinks: Sinks,
    ) -> Result<CommandIo, CellError> {
        if plan.terminal {
            return Ok(CommandIo {
                stdio: CommandStdio::Terminal,
                cell_ends: Vec::new(),
                stdout: None,
                stderr: None,
                stdin_relay: None,
                terminal_input: match stdin {
                    PayloadStdin::Relayed(source) => Some(source),
                    PayloadStdin::Null => None,
                },
                sinks,
                release: None,
                caller: None,
            });
        }
        let pipe = || sys::pipe_cloexec().map_err(|e| CellError::io("pipe", e));
        let (stdout_read, stdout_write) = pipe()?;
        let (stderr_read, stderr_write) = pipe()?;
        let (stdin, stdin_relay) = match stdin {
            PayloadStdin::Null => (
                OwnedFd::from(File::open("/dev/null").map_err(|e| CellError::io("/dev/null", e))?),
                None,
            ),
            PayloadStdin::Relayed(source) => {
                let (relay, cell_end) =
                    StdinRelay::new(source).map_err(|e| CellError::io("stdin pipe", e))?;
                build::give_pipes_to_cell(host, &[&cell_end])?;
                (cell_end, Some(relay))
            }
        };
        build::give_pipes_to_cell(host, &[&stdout_write, &stderr_write])?;
        Ok(CommandIo {
            stdio: CommandStdio::Passed,
            cell_ends: vec![stdin, stdout_write, stderr_write],
            stdout: Some(stdout_read),
            stderr: Some(stderr_read),
            stdin_relay,
            terminal_input: None,
            sinks,
            release: None,
            caller: None,
        })
    }
}

/// For a plan with a terminal whose caller's stdin is a terminal too: that terminal,
/// raw for the run (see [`crate::terminal`]).
pub(crate) fn enter_caller_terminal(
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

/// Runs `plan.argv` in a fresh cell (the cold path of `airlock run`). Never panics on
/// cell failures: every outcome, including airlock's own errors, becomes a
/// [`RunReport`].
///
/// Preconditions: none the caller must uphold. The process must be single-threaded for
/// the clone; this is checked, and a multi-threaded caller gets a `runtime_fault`
/// report (such a caller uses [`serve_cell`] in a process of its own). With a terminal
/// plan and a terminal on stdin, the caller's terminal is raw for the run and SIGWINCH,
/// SIGINT, SIGQUIT and SIGTSTP are taken while it lasts.
pub fn run_cell(plan: &CellPlan, mut options: RunOptions<'_>) -> RunReport {
    match cold_run(plan, &mut options) {
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

/// What the caller asked to collect, if the plan declares any outputs.
fn wanted_artifacts(plan: &CellPlan, request: Option<&ArtifactRequest>) -> Option<ArtifactRequest> {
    request
        .filter(|_| !plan.output_allowlist.is_empty())
        .cloned()
}

fn cold_run(plan: &CellPlan, options: &mut RunOptions<'_>) -> Result<RunReport, CellError> {
    let container_cgroup = options.doors.as_mut().and_then(|d| d.cgroup.take());
    let in_container = container_cgroup.is_some();
    let preflight = Preflight::check(plan)?.in_container_cgroup(container_cgroup)?;
    let env = command_environment(plan, options.credentials, &[])?;
    // Before the clone and any thread: the signals it takes must be blocked everywhere.
    let caller_terminal = enter_caller_terminal(plan, &options.stdin)?;
    // A one-shot run without a terminal of the caller's takes its interrupts (a
    // container's supervisor is signalled through the OCI runtime's `kill` instead).
    let interrupts = match (&caller_terminal, &options.doors) {
        (None, None) => Some(
            interrupts::Interrupts::take()
                .map_err(|e| CellError::io("taking SIGINT, SIGTERM and SIGHUP", e))?,
        ),
        _ => None,
    };
    let stdin = std::mem::replace(&mut options.stdin, PayloadStdin::Null);
    let sinks = Sinks {
        stdout: options.stdout_sink.take(),
        stderr: options.stderr_sink.take(),
    };
    let artifacts = wanted_artifacts(plan, options.artifacts.as_ref());
    let started = options.started;
    let role = match options.doors {
        Some(_) => build::Pid1Role::Container,
        None => build::Pid1Role::OneShot,
    };
    let mut cell = build::build(
        plan,
        preflight,
        started,
        (artifacts, options.on_suspected_escape.clone()),
        caller_terminal,
        role,
        options.host_ids,
    )?;
    cell.supervision.door =
        (options.doors.take()).map(|doors| crate::exec_door::Door::new(doors, options.credentials));
    cell.supervision.interrupts = interrupts;
    // Opened while the cell finishes its setup; an error kills the cell like any other.
    let io = match CommandIo::open(plan, cell.supervision.host, stdin, sinks) {
        Ok(io) => io,
        Err(err) => return Err(cell.abandon(err)),
    };
    // A container's console gets the payload's terminal before the container is
    // reported created (its caller waits for it first).
    if let Err(err) = cell.supervision.await_console(&mut options.egress) {
        return Err(cell.abandon(err));
    }
    let (recorded, recorded_ms) = match options.before_start.take() {
        None => (Ok(String::new()), 0.0),
        Some(hook) => (
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(hook))
                .unwrap_or_else(|_| Err("the audit hook panicked".to_string())),
            ms_since(started),
        ),
    };
    cell.milestones.recorded_ms = recorded_ms;
    let run_id = match recorded {
        Ok(run_id) => run_id,
        // No record, no payload: the cell never got START.
        Err(err) => return Err(cell.abandon(CellError::Refused(err))),
    };
    if in_container {
        // The mounts' helper thread (else started with the payload) starts now, so every
        // thread of this supervisor is counted in the container's exact pids ceiling.
        cell.prepare_supervision();
        let pids = plan.limits.cell_pids_max();
        if let Err(err) = cell.supervision.ceilings.fix_container_pids(pids) {
            return Err(cell.abandon(err));
        }
    }
    let command = CellCommand {
        id: 0,
        argv: plan.argv.clone(),
        env,
        stdio: io.stdio,
    };
    let limits = (plan.limits.wall_time_ms, plan.limits.output_bytes);
    let ran = cell.run_command(run_id, command, io, limits, &mut options.egress, None);
    Ok(cell.finish(ran, &mut options.egress, started))
}
