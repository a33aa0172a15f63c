//! A session on the gVisor tier, served to the engine through the same control socket
//! as a native session ([`crate::control`]; crates/engine's `Session` drives either):
//!
//! - the sandbox is started once (`runsc run` of the bundle, its own runsc state
//!   directory under the cell directory), its first process the holder
//!   ([`super::inside`]), which reaps orphans and keeps the sandbox alive;
//! - each command is one `runsc exec` with the first payload's process spec (user,
//!   no_new_privileges, no capabilities, rlimits, crates/oci `exec_process`) and its own
//!   argv, environment additions, stdio, output budget and deadline; its launcher
//!   installs the plan's seccomp program inside the Sentry and leads a process group;
//! - the deadline is enforced from outside: SIGTERM to the command's group, the grace,
//!   SIGKILL to the group and to the command's process (`runsc kill --pid`);
//! - the writable paths' host tmpfs mounts live with the sandbox, so files persist
//!   between commands;
//! - the idle timeout and the maximum lifetime are enforced here; the end (CLOSE, expiry,
//!   the engine's death, the sandbox's death) runs the one-shot run's completion
//!   sequence once: every runsc process killed and reaped, the sandbox's cgroup emptied,
//!   `runsc delete`, the declared artifacts collected from the host tmpfs, everything
//!   removed and checked, then the session's final report.
//!
//! An allowlisted plan's egress route (egress.rs: the proxy on listeners in a private
//! network namespace, the forwarder inside the sandbox) is built once, after the holder,
//! and lives as long as the sandbox: every command reaches the network through it, and
//! its records are the session's (in its final report), or the one command's in a
//! parked one-shot cell, as on the native tier. It ends with the sandbox.

use super::inside;
use super::runsc::{self, WaitOutcome};
use super::{health, ms_since, observed_ending, preflight, Pid1, Sandbox};
use crate::artifacts::{ArtifactRequest, OutputMounts};
use crate::cgroup::CgroupUsage;
use crate::control::{CommandSpec, SupervisorControl, ToEngine, ToSupervisor};
use crate::error::CellError;
use crate::output::OutputCapture;
use crate::protocol::PayloadEnded;
use crate::report::{CleanupReport, RunReport};
use crate::stdin_relay::StdinRelay;
use crate::supervisor::classify::{classify, Observed};
use crate::supervisor::deadline::{poll_timeout, Deadline, Step};
use crate::supervisor::serve::command_limits;
use crate::supervisor::supervise::{poll_in, poll_out, raw, readable, CommandOutput, Sinks};
use crate::supervisor::{
    command_environment, EgressSession, EgressSummary, ServeMode, ServeOptions,
};
use crate::sys;
use airlock_contract::CellPlan;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// How long the holder may take to start (a sandbox boots in a few hundred
/// milliseconds; a loaded two-core machine is slower).
const HOLDER_START: Duration = Duration::from_secs(30);
/// How long a command's pipes are drained once its process ended (a background child
/// may hold them open for as long as it likes).
/// A parked one-shot cell waits for its command as long as the engine keeps it (as a
/// native parked cell does); its command's own deadline applies once it runs.
const PARKED_FOR_EVER: Duration = Duration::from_secs(10 * 365 * 24 * 3600);
/// Poll entries per running command: its runsc exec's exit, stdout, stderr, the stdin
/// relay's source and sink.
const ENTRIES: usize = 5;

/// Serves `plan` on the gVisor tier for the engine (see [`crate::serve_cell`], which
/// hands gVisor plans here). The last message is [`ToEngine::Closed`], or
/// [`ToEngine::Failed`] for a session that could not start.
pub fn serve_gvisor(plan: &CellPlan, options: ServeOptions<'_>) {
    let started = Instant::now();
    let control = SupervisorControl::new(options.control);
    let served = start_session(
        plan,
        options.credentials,
        options.host_ids,
        options.egress,
        &control,
    )
    .map(|mut cell| {
        let life = match options.mode {
            // A parked cell (a warm pool's, or one built for a threaded caller's run):
            // the same sandbox, ended by its one command.
            ServeMode::OneShot => {
                cell.one_shot = Some(None);
                Life {
                    idle_timeout: PARKED_FOR_EVER,
                    max_lifetime: PARKED_FOR_EVER,
                    built: Instant::now(),
                }
            }
            ServeMode::Session {
                idle_timeout,
                max_lifetime,
            } => Life {
                idle_timeout,
                max_lifetime,
                built: Instant::now(),
            },
        };
        cell.serve(&control, life, options.artifacts, started);
    });
    if let Err(err) = served {
        let mut report = RunReport::refused("", err.class(), err.to_string());
        report.timings.wall_ms = ms_since(started);
        control.send(&ToEngine::Failed {
            report: Box::new(report),
        });
    }
}

/// The limits of a session's life, enforced here.
struct Life {
    idle_timeout: Duration,
    max_lifetime: Duration,
    built: Instant,
}

/// The holder's `runsc run` process: its exit is the sandbox's end.
pub(super) struct Holder {
    pub(super) runsc_pid: libc::pid_t,
    exit: OwnedFd,
}

/// One command: its `runsc exec` process and everything the supervisor keeps of it.
struct Command {
    id: u64,
    run_id: String,
    /// `runsc exec`'s host pid and pidfd.
    pid: libc::pid_t,
    exit: OwnedFd,
    /// Its process spec and where runsc writes its pid inside the sandbox (its process
    /// group), in the cell directory: removed when it ends.
    files: ExecFiles,
    stdout: Option<OwnedFd>,
    stderr: Option<OwnedFd>,
    output: OutputCapture,
    sinks: Sinks,
    relay: Option<StdinRelay>,
    deadline: Deadline,
    started: Instant,
    deadline_fired: bool,
    counters: CgroupUsage,
}

struct GvisorSession<'p, 'e> {
    plan: &'p CellPlan,
    credentials: &'p [(String, String)],
    sandbox: Sandbox,
    holder: Holder,
    output_mounts: OutputMounts,
    running: Vec<Command>,
    /// `runsc exec`s of the signal helper not reaped yet, with their files.
    signallers: Vec<(libc::pid_t, ExecFiles)>,
    /// Files under the cell directory: process specs and pid files, one set a command.
    files: u64,
    idle_since: Instant,
    /// Why the session ends, once it does.
    ending: Option<String>,
    /// A one-shot cell: `Some` once it serves one command only, with that command's
    /// report once it ended (the cell's final report is the command's).
    one_shot: Option<Option<Box<RunReport>>>,
    /// Commands started so far.
    started: u64,
    /// A one-shot command's caller, whose hang-up destroys the cell
    /// ([`CommandSpec::watch_caller`]).
    caller: Option<OwnedFd>,
    /// An allowlisted plan's proxy, running from the start to the end of the sandbox.
    egress: Option<&'e mut (dyn EgressSession + 'e)>,
}

/// Prepares the sandbox, starts the holder and tells the engine the session is parked.
fn start_session<'p, 'e>(
    plan: &'p CellPlan,
    credentials: &'p [(String, String)],
    host_ids: crate::host_identity::HostIdRange,
    mut egress: Option<&'e mut (dyn EgressSession + 'e)>,
    control: &SupervisorControl,
) -> Result<GvisorSession<'p, 'e>, CellError> {
    let binary = preflight(plan)?;
    let env = command_environment(plan, credentials, &[])?;
    // A supervisor killed with SIGKILL leaves its directory and cgroups: reaped here.
    let _ = health::reap_leftovers();
    // The sandbox's processes become this process's once their runsc parent is gone.
    sys::prctl(libc::PR_SET_CHILD_SUBREAPER, 1)
        .map_err(|e| CellError::io("becoming the sandbox's subreaper", e))?;
    let mut sandbox = Sandbox::prepare(plan, &binary, host_ids, env, Pid1::SessionHolder, None)?;
    let holder = match start_holder_and_route(&mut sandbox, plan, credentials, &mut egress) {
        Ok(holder) => holder,
        Err(err) => {
            let _ = sandbox.teardown(plan, None, None);
            return Err(err);
        }
    };
    let output_mounts = OutputMounts::open_host_dirs(plan, &sandbox.dir.writable);
    // Numbered after the forwarder's (the sandbox's own exec files).
    let files = sandbox.exec_files.len() as u64;
    // The engine's "cell pid" is where the cell's file system is seen from the host
    // (`/proc/<pid>/root`, the service's session file API): the gofer's root is the
    // container's, the writable paths' host tmpfs bound in it, and its user namespace
    // maps the payload's ids. The Sentry's own root is an empty directory. No gofer:
    // the session is refused (its files could not be reached, nor told apart).
    let Some(gofer) = gofer_of(holder.runsc_pid) else {
        let _ = sys::kill(holder.runsc_pid, libc::SIGKILL);
        let _ = sys::wait_child(holder.runsc_pid, false);
        let _ = sandbox.teardown(plan, None, None);
        return Err(CellError::Launch {
            stage: "runsc run".into(),
            message: "the session's sandbox has no gofer process".into(),
        });
    };
    control.send(&ToEngine::Parked {
        pid: gofer,
        cgroups: Vec::new(),
        release: false,
    });
    Ok(GvisorSession {
        plan,
        credentials,
        sandbox,
        holder,
        output_mounts,
        running: Vec::new(),
        signallers: Vec::new(),
        files,
        idle_since: Instant::now(),
        ending: None,
        one_shot: None,
        started: 0,
        caller: None,
        egress,
    })
}

/// The holder, then for an allowlisted plan the egress route (the proxy started on its
/// private listeners, the forwarder listening inside): no command starts before the
/// route is up, and a route that cannot be built refuses the session. A failure kills
/// the holder; the caller tears the sandbox down.
fn start_holder_and_route(
    sandbox: &mut Sandbox,
    plan: &CellPlan,
    credentials: &[(String, String)],
    egress: &mut Option<&mut (dyn EgressSession + '_)>,
) -> Result<Holder, CellError> {
    let allowlisted = matches!(
        plan.network,
        airlock_contract::NetworkPlan::Allowlist { .. }
    );
    let pending = match allowlisted {
        true => Some(super::egress::start_route(plan, egress.as_deref_mut())?),
        false => None,
    };
    let holder = start_holder(sandbox)?;
    let Some(pending) = pending else {
        return Ok(holder);
    };
    match sandbox.start_egress_forwarder(plan, credentials, pending) {
        Ok(()) => Ok(holder),
        Err(err) => {
            let _ = sys::kill(holder.runsc_pid, libc::SIGKILL);
            let _ = sys::wait_child(holder.runsc_pid, false);
            Err(err)
        }
    }
}

/// The gofer `runsc run` started (its child named `runsc-gofer`).
fn gofer_of(runsc_pid: libc::pid_t) -> Option<libc::pid_t> {
    let entries = std::fs::read_dir("/proc").ok()?;
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<libc::pid_t>().ok())
        .find(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let parent = stat
                .rsplit_once(')')
                .and_then(|(_, after)| after.split_whitespace().nth(1)?.parse().ok());
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            parent == Some(runsc_pid) && cmdline.starts_with(b"runsc-gofer\0")
        })
}

/// `runsc run` of the holder; returns once the holder said it runs (so `runsc exec`
/// finds a running container).
pub(super) fn start_holder(sandbox: &Sandbox) -> Result<Holder, CellError> {
    let (ready_read, ready_write) =
        sys::pipe_cloexec().map_err(|e| CellError::io("the holder's pipe", e))?;
    let child = sandbox.runsc.spawn_run(
        &sandbox.dir.bundle(),
        [
            sandbox.dir.open_null()?,
            ready_write,
            sandbox.dir.open_null()?,
        ],
        None,
    )?;
    let runsc_pid = child.id() as libc::pid_t;
    let exit = match sys::pidfd_open(runsc_pid) {
        Ok(exit) => exit,
        Err(e) => {
            let _ = sys::kill(runsc_pid, libc::SIGKILL);
            let _ = sys::wait_child(runsc_pid, false);
            return Err(CellError::io("pidfd of runsc run", e));
        }
    };
    let holder = Holder { runsc_pid, exit };
    match wait_ready(sandbox, &holder, &ready_read) {
        Ok(()) => Ok(holder),
        Err(err) => {
            let _ = sys::kill(runsc_pid, libc::SIGKILL);
            let _ = sys::wait_child(runsc_pid, false);
            Err(err)
        }
    }
}

/// Reads the holder's ready line; `runsc run` ending first is its failure.
fn wait_ready(sandbox: &Sandbox, holder: &Holder, ready: &OwnedFd) -> Result<(), CellError> {
    let until = Instant::now() + HOLDER_START;
    let mut said = Vec::new();
    while !said.ends_with(inside::HOLDER_READY) {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(CellError::Launch {
                stage: "runsc run".into(),
                message: format!(
                    "the session's holder did not start within {} s",
                    HOLDER_START.as_secs()
                ),
            });
        }
        let mut fds = [poll_in(ready.as_raw_fd()), poll_in(holder.exit.as_raw_fd())];
        match sys::poll(&mut fds, poll_timeout(Some(Instant::now() + left))) {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(CellError::io("poll", e)),
        }
        if readable(&fds[0]) {
            let mut chunk = [0u8; 64];
            match sys::read(ready.as_fd(), &mut chunk) {
                Ok(n) if n > 0 => said.extend_from_slice(&chunk[..n]),
                _ => {}
            }
        }
        if readable(&fds[1]) && !said.ends_with(inside::HOLDER_READY) {
            let status = sys::wait_child(holder.runsc_pid, false)
                .ok()
                .flatten()
                .map(|r| r.status);
            let outcome = sandbox.runsc.run_ended(&sandbox.dir.bundle(), status)?;
            return Err(CellError::Launch {
                stage: "runsc run".into(),
                message: format!("the session's sandbox ended before its holder ran ({outcome:?})"),
            });
        }
    }
    Ok(())
}

impl GvisorSession<'_, '_> {
    /// Serves commands until the session ends, then runs the completion sequence and
    /// sends the final report.
    fn serve(
        mut self,
        control: &SupervisorControl,
        life: Life,
        artifacts: Option<ArtifactRequest>,
        started: Instant,
    ) {
        let mut control = Some(control);
        let mut buf = Vec::new();
        while self.ending.is_none() {
            let mut fds = vec![
                poll_in(control.map_or(-1, |c| c.as_fd().as_raw_fd())),
                poll_in(self.holder.exit.as_raw_fd()),
                poll_in(raw(&self.caller)),
            ];
            for command in &self.running {
                let relay = command.relay.as_ref().map(StdinRelay::interest);
                fds.push(poll_in(command.exit.as_raw_fd()));
                fds.push(poll_in(raw(&command.stdout)));
                fds.push(poll_in(raw(&command.stderr)));
                fds.push(poll_in(relay.as_ref().map_or(-1, |r| r.source)));
                fds.push(poll_out(relay.as_ref().map_or(-1, |r| r.sink)));
            }
            match sys::poll(&mut fds, poll_timeout(self.next_wake(&life))) {
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    self.ending = Some(format!("poll: {e}"));
                    break;
                }
            }
            let mut ended = Vec::new();
            for (at, command) in self.running.iter_mut().enumerate() {
                let entries = &fds[3 + ENTRIES * at..3 + ENTRIES * (at + 1)];
                command.pump(&entries[1..], &mut buf);
                if readable(&entries[0]) {
                    ended.push(command.id);
                }
            }
            for id in ended {
                self.end_command(id, control, &mut buf);
            }
            if readable(&fds[0]) {
                self.on_control(&mut control);
            }
            if readable(&fds[1]) {
                self.ending = Some("the sandbox ended on its own".into());
            }
            if readable(&fds[2]) {
                self.ending = Some("the caller went away".into());
            }
            self.enforce(&life);
            self.reap_signallers();
        }
        let why = self.ending.take().unwrap_or_default();
        let report = self.close(&why, control, artifacts.as_ref(), started);
        if let Some(control) = control {
            control.send(&ToEngine::Closed {
                report: Box::new(report),
            });
        }
    }

    fn next_wake(&self, life: &Life) -> Option<Instant> {
        let deadlines = self.running.iter().filter_map(|c| c.deadline.next_wake());
        let lifetime = life.built + life.max_lifetime;
        let idle = self
            .running
            .is_empty()
            .then_some(self.idle_since + life.idle_timeout);
        // The signal helpers are reaped as they end (a few hundred milliseconds).
        let signallers =
            (!self.signallers.is_empty()).then(|| Instant::now() + Duration::from_millis(50));
        deadlines
            .chain([Some(lifetime), idle, signallers].into_iter().flatten())
            .min()
    }

    fn on_control(&mut self, control: &mut Option<&SupervisorControl>) {
        let Some(channel) = *control else { return };
        match channel.recv() {
            Ok(Some((
                ToSupervisor::Run {
                    id,
                    run_id,
                    command,
                    ..
                },
                fds,
            ))) => match self.start_command(id, &run_id, command, fds) {
                Ok(()) => channel.send(&ToEngine::CommandStarted { id }),
                Err(err) => {
                    let report = RunReport::refused(&run_id, err.class(), err.to_string());
                    channel.send(&ToEngine::CommandEnded {
                        id,
                        report: Box::new(report),
                    });
                }
            },
            Ok(Some((ToSupervisor::Kill { id }, _))) => self.kill(id),
            Ok(Some((ToSupervisor::Signal { id, signal }, _))) => match signal.number() {
                libc::SIGKILL => self.kill(id),
                number => self.signal_group(id, number),
            },
            Ok(Some((
                ToSupervisor::SetDestinations {
                    change,
                    destinations,
                },
                _,
            ))) => {
                let error = crate::supervisor::session::replace_destinations(
                    &mut self.egress,
                    &destinations,
                )
                .err();
                channel.send(&ToEngine::DestinationsSet { change, error });
            }
            Ok(Some((ToSupervisor::Close, _))) => {
                self.ending = Some("closed by the engine".into());
            }
            Ok(None) | Err(_) => {
                // The engine is gone: nobody will read a report, the sandbox goes at once.
                *control = None;
                self.ending = Some("the engine went away".into());
            }
        }
    }

    /// Starts one command: its limits (at most the plan's), environment, pipes, process
    /// spec (the first payload's, with the launcher's argv) and `runsc exec`.
    fn start_command(
        &mut self,
        id: u64,
        run_id: &str,
        spec: CommandSpec,
        fds: Vec<OwnedFd>,
    ) -> Result<(), CellError> {
        if self.running.iter().any(|c| c.id == id) {
            return Err(CellError::Protocol {
                message: format!("command {id} is already running"),
            });
        }
        if spec.watch_caller && self.one_shot.is_none() {
            // A session outlives its callers by design (idle timeout, maximum lifetime).
            return Err(CellError::Protocol {
                message: "a session command with a watched caller".into(),
            });
        }
        if self.one_shot.is_some() && self.started > 0 {
            return Err(CellError::Protocol {
                message: "a one-shot cell runs one command".into(),
            });
        }
        let (wall_time_ms, output_bytes) = command_limits(self.plan, &spec)?;
        let env = command_environment(self.plan, self.credentials, &spec.env)?;
        let mut fds = fds.into_iter();
        let mut next = || {
            fds.next().ok_or_else(|| CellError::Protocol {
                message: "a command without its descriptors".into(),
            })
        };
        let source = if spec.stdin { Some(next()?) } else { None };
        let sinks = Sinks {
            stdout: Some(next()?),
            stderr: Some(next()?),
        };
        let caller = if spec.watch_caller {
            Some(next()?)
        } else {
            None
        };
        let (stdin_end, relay) = match source {
            None => (self.sandbox.dir.open_null()?, None),
            Some(source) => {
                let (relay, end) =
                    StdinRelay::new(source).map_err(|e| CellError::io("stdin pipe", e))?;
                (end, Some(relay))
            }
        };
        let pipe = || sys::pipe_cloexec().map_err(|e| CellError::io("pipe", e));
        let (stdout_read, stdout_write) = pipe()?;
        let (stderr_read, stderr_write) = pipe()?;
        let argv = inside::launch_argv(self.plan, &spec.argv);
        let files = self.process_file(argv, env)?;
        let child = self.sandbox.runsc.spawn_exec(
            &files.process,
            &files.internal_pid,
            [stdin_end, stdout_write, stderr_write],
        );
        let child = match child {
            Ok(child) => child,
            Err(err) => {
                files.remove();
                return Err(err);
            }
        };
        let pid = child.id() as libc::pid_t;
        let exit = sys::pidfd_open(pid).map_err(|e| CellError::io("pidfd of runsc exec", e))?;
        self.started += 1;
        self.caller = caller;
        let now = Instant::now();
        self.running.push(Command {
            id,
            run_id: run_id.to_string(),
            pid,
            exit,
            files,
            stdout: Some(stdout_read),
            stderr: Some(stderr_read),
            output: OutputCapture::new(output_bytes),
            sinks,
            relay,
            deadline: Deadline::from_start(now, wall_time_ms),
            started: now,
            deadline_fired: false,
            counters: self.sandbox.cgroup.usage(),
        });
        Ok(())
    }

    /// Writes a `runsc exec` process spec for `argv` (see [`process_file`]).
    fn process_file(
        &mut self,
        argv: Vec<String>,
        env: Vec<String>,
    ) -> Result<ExecFiles, CellError> {
        self.files += 1;
        process_file(self.plan, &self.sandbox, self.files, argv, env)
    }

    /// Command `id`'s `runsc exec` ended: its status, what is left in its pipes, its
    /// report.
    fn end_command(&mut self, id: u64, control: Option<&SupervisorControl>, buf: &mut Vec<u8>) {
        let Some(at) = self.running.iter().position(|c| c.id == id) else {
            return;
        };
        let mut command = self.running.remove(at);
        let status = sys::wait_child(command.pid, false)
            .ok()
            .flatten()
            .map(|r| r.status);
        command.output().drain(buf);
        let failed = self
            .sandbox
            .runsc
            .exec_failed(status, &command.files.internal_pid);
        command.files.remove();
        // A one-shot cell's connections are its command's: the proxy stops with it.
        let egress = match self.one_shot {
            Some(_) => self.finish_egress(),
            None => None,
        };
        let report = match failed {
            Some(err) => RunReport::refused(&command.run_id, err.class(), err.to_string()),
            None => command.report(&self.sandbox, status, None, egress),
        };
        if let Some(only) = self.one_shot.as_mut() {
            // The cell ends with its command; its report is the cell's final one.
            *only = Some(Box::new(report));
            self.ending = Some("its command ended".into());
            return;
        }
        if let Some(control) = control {
            control.send(&ToEngine::CommandEnded {
                id,
                report: Box::new(report),
            });
        }
        if self.running.is_empty() {
            self.idle_since = Instant::now();
        }
    }

    /// The running commands' deadlines, and the session's idle timeout and lifetime.
    fn enforce(&mut self, life: &Life) {
        let now = Instant::now();
        let mut due = Vec::new();
        for command in &mut self.running {
            let (deadline, step) = command.deadline.advance(now);
            command.deadline = deadline;
            match step {
                Some(Step::Terminate) => {
                    command.deadline_fired = true;
                    due.push((command.id, libc::SIGTERM));
                }
                Some(Step::KillAllButPid1) => due.push((command.id, libc::SIGKILL)),
                // The holder serves the other commands: only the command's group goes.
                Some(Step::KillPid1) | None => {}
            }
        }
        for (id, signal) in due {
            match signal {
                libc::SIGKILL => self.kill(id),
                _ => self.signal_group(id, signal),
            }
        }
        if self.ending.is_some() {
            return;
        }
        if now >= life.built + life.max_lifetime {
            self.ending = Some(format!(
                "max_lifetime: {} ms",
                life.max_lifetime.as_millis()
            ));
        } else if self.running.is_empty() && now >= self.idle_since + life.idle_timeout {
            self.ending = Some(format!(
                "idle_timeout: no command for {} ms",
                life.idle_timeout.as_millis()
            ));
        }
    }

    /// SIGKILL to command `id`'s process group and to its process (which `runsc kill`
    /// reaches even when the sandbox cannot start the signal helper: its pids are
    /// used up).
    fn kill(&mut self, id: u64) {
        self.signal_group(id, libc::SIGKILL);
        if let Some(pid) = self.internal_pid(id) {
            let _ = self.sandbox.runsc.kill_process(pid, "SIGKILL");
        }
    }

    /// Sends `signal` to command `id`'s process group inside the sandbox (a `runsc exec`
    /// of the signal helper, as the payload's user, not waited for). Nothing for a
    /// command that ended or whose process is not started yet.
    fn signal_group(&mut self, id: u64, signal: i32) {
        let Some(pgid) = self.internal_pid(id) else {
            return;
        };
        let env = command_environment(self.plan, self.credentials, &[]).unwrap_or_default();
        let Ok(files) = self.process_file(inside::signal_argv(pgid, signal), env) else {
            return;
        };
        let null = || self.sandbox.dir.open_null();
        let stdio = [null(), null(), null()];
        let [Ok(a), Ok(b), Ok(c)] = stdio else {
            files.remove();
            return;
        };
        match self
            .sandbox
            .runsc
            .spawn_exec(&files.process, &files.internal_pid, [a, b, c])
        {
            Ok(child) => self.signallers.push((child.id() as libc::pid_t, files)),
            Err(_) => files.remove(),
        }
    }

    fn internal_pid(&self, id: u64) -> Option<i32> {
        let command = self.running.iter().find(|c| c.id == id)?;
        runsc::read_pid(&command.files.internal_pid)
    }

    fn reap_signallers(&mut self) {
        self.signallers.retain(|(pid, files)| {
            let ended = matches!(sys::wait_child(*pid, true), Ok(Some(_)) | Err(_));
            if ended {
                files.remove();
            }
            !ended
        });
    }

    /// The completion sequence, once: the host ends of the sandbox killed (every
    /// `runsc exec`, the holder's `runsc run`, which takes the sandbox with it), the
    /// commands still running reported as ended with the session, then the one-shot
    /// run's teardown (cgroup emptied, `runsc delete`, artifacts, everything removed and
    /// checked). Returns the session's final report.
    fn close(
        mut self,
        why: &str,
        control: Option<&SupervisorControl>,
        artifacts: Option<&ArtifactRequest>,
        started: Instant,
    ) -> RunReport {
        let teardown_started = Instant::now();
        let host_ends: Vec<libc::pid_t> = self
            .running
            .iter()
            .map(|c| c.pid)
            .chain(self.signallers.iter().map(|(pid, _)| *pid))
            .chain([self.holder.runsc_pid])
            .collect();
        // The sandbox's own processes die with `runsc run` and become this process's
        // children (its subreaper): known before they die, so that teardown reaps them
        // (runsc's delete waits for the sandbox process to be gone).
        self.sandbox.seen.extend(self.sandbox.cgroup.pids());
        self.sandbox.seen.extend(runsc::read_pid(&runsc::pid_file(
            &self.sandbox.dir.bundle(),
        )));
        for pid in &host_ends {
            let _ = sys::kill(*pid, libc::SIGKILL);
        }
        for pid in &host_ends {
            let _ = sys::wait_child(*pid, false);
        }
        let mut egress = self.finish_egress();
        let mut buf = Vec::new();
        for mut command in std::mem::take(&mut self.running) {
            command.output().drain(&mut buf);
            let id = command.id;
            let connections = match self.one_shot {
                Some(_) => egress.take(),
                None => None,
            };
            let report = command.report(&self.sandbox, None, Some(why), connections);
            if let Some(only) = self.one_shot.as_mut() {
                *only = Some(Box::new(report));
                continue;
            }
            if let Some(control) = control {
                control.send(&ToEngine::CommandEnded {
                    id,
                    report: Box::new(report),
                });
            }
        }
        let only = self.one_shot.take().flatten();
        let sandbox_died = why == "the sandbox ended on its own";
        let (counters, cleanup, artifacts) =
            self.sandbox
                .teardown(self.plan, Some(&self.output_mounts), artifacts);
        if let Some(mut report) = only {
            report.artifacts = artifacts;
            // From the command's start, not the cell's (a warm cell waited parked).
            let ran_ms = report.timings.wall_ms;
            let mut report = super::with_cleanup(*report, cleanup, teardown_started, started);
            report.timings.wall_ms = ran_ms + report.timings.teardown_ms;
            return report;
        }
        let observed = Observed {
            exec_done_at: Some(started),
            artifacts,
            rusage: cleanup.reaped_usage,
            ended_at: Some(Instant::now()),
            notes: vec![format!("the session ended: {why}")],
            ..Observed::default()
        };
        let outcome = match sandbox_died {
            true => WaitOutcome::SandboxGone,
            false => WaitOutcome::Exited(0),
        };
        let observed = observed_ending(observed, outcome, counters, Vec::new());
        let report = classify(started, observed, OutputCapture::new(0), counters, egress);
        super::with_cleanup(report, cleanup, teardown_started, started)
    }

    /// Stops the proxy (once) and returns what it saw.
    fn finish_egress(&mut self) -> Option<EgressSummary> {
        self.egress.take().map(|proxy| proxy.finish())
    }
}

/// Writes a `runsc exec` process spec (0600: it holds the command's environment) for
/// `argv` to the cell directory, numbered `n`; returns it and the path for the internal
/// pid.
pub(super) fn process_file(
    plan: &CellPlan,
    sandbox: &Sandbox,
    n: u64,
    argv: Vec<String>,
    env: Vec<String>,
) -> Result<ExecFiles, CellError> {
    let process = airlock_oci::exec_process(plan, argv, env).map_err(|e| CellError::Launch {
        stage: "runsc exec process spec".into(),
        message: e.to_string(),
    })?;
    write_process_file(sandbox, n, &process)
}

/// Writes `process` as the `n`-th `runsc exec`'s process spec of `sandbox`.
pub(super) fn write_process_file(
    sandbox: &Sandbox,
    n: u64,
    process: &airlock_oci::spec_types::Process,
) -> Result<ExecFiles, CellError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let json = serde_json::to_vec(process)
        .map_err(|e| CellError::io("process spec", std::io::Error::other(e)))?;
    let path = sandbox.dir.dir.join(format!("exec-{n}.json"));
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
        .map_err(|e| CellError::io(path.display().to_string(), e))?;
    file.write_all(&json)
        .map_err(|e| CellError::io(path.display().to_string(), e))?;
    let internal_pid = sandbox.dir.dir.join(format!("exec-{n}.pid"));
    Ok(ExecFiles {
        process: path,
        internal_pid,
    })
}

/// A `runsc exec`'s files in the cell directory: its process spec (0600: the command's
/// environment) and its pid inside the sandbox. runsc reads the spec when it starts;
/// both go when the exec ends, so a long session does not fill the cell directory's
/// tmpfs (about 6 KiB a command, the seccomp program included).
#[derive(Clone)]
pub(super) struct ExecFiles {
    pub(super) process: PathBuf,
    pub(super) internal_pid: PathBuf,
}

impl ExecFiles {
    pub(super) fn remove(&self) {
        let _ = std::fs::remove_file(&self.process);
        let _ = std::fs::remove_file(&self.internal_pid);
    }
}

impl Command {
    /// Handles the command's poll entries: stdout, stderr, the relay's source and sink.
    fn pump(&mut self, entries: &[libc::pollfd], buf: &mut Vec<u8>) {
        self.output().pump([&entries[0], &entries[1]], buf);
        if let Some(relay) = self.relay.as_mut() {
            if readable(&entries[2]) {
                relay.on_source_ready();
            }
            if entries[3].revents != 0 {
                relay.on_sink_ready();
            }
        }
    }

    fn output(&mut self) -> CommandOutput<'_> {
        CommandOutput {
            stdout: &mut self.stdout,
            stderr: &mut self.stderr,
            capture: &mut self.output,
            sinks: &mut self.sinks,
        }
    }

    /// The command's own report: classified from `runsc exec`'s status (`None`: it was
    /// killed with the session), its deadline, its output and what the cgroup counted
    /// while it ran.
    fn report(
        self,
        sandbox: &Sandbox,
        status: Option<i32>,
        destroyed: Option<&str>,
        egress: Option<EgressSummary>,
    ) -> RunReport {
        let now = sandbox.cgroup.usage();
        let counters = CgroupUsage {
            oom_kills: now.oom_kills.saturating_sub(self.counters.oom_kills),
            pids_limit_hits: now
                .pids_limit_hits
                .saturating_sub(self.counters.pids_limit_hits),
            ..now
        };
        let wait_status = status
            .filter(|s| libc::WIFEXITED(*s))
            .map(|s| runsc::wait_status(libc::WEXITSTATUS(s)));
        let observed = Observed {
            exec_done_at: Some(self.started),
            ended: wait_status.map(|wait_status| PayloadEnded {
                wait_status,
                full_mounts: Vec::new(),
                shm_full: false,
            }),
            deadline_fired: self.deadline_fired,
            run_id: self.run_id,
            ended_at: Some(Instant::now()),
            stdin: self.relay.map(StdinRelay::finish),
            destroyed: destroyed.map(str::to_string),
            ..Observed::default()
        };
        let mut report = classify(self.started, observed, self.output, counters, egress);
        report.timings.wall_ms = ms_since(self.started);
        // Nothing of a command is left to clean up on its own: the session's end is.
        report.cleanup = CleanupReport {
            ok: true,
            leftovers: Vec::new(),
        };
        report
    }
}
