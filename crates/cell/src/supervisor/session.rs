//! A session: one cell serving several commands of one job (`ServeMode::Session`). Each
//! command has its own pipes, output budget, deadline (from its start), sinks and exec
//! outcome, and ends in a report of its own; the session's idle timeout and lifetime
//! are enforced from outside, and its end runs the completion sequence once.

use super::classify::{classify, Observed};
use super::deadline::{poll_timeout, Deadline, Step};
use super::serve::{command_io, command_limits};
use super::supervise::{poll_in, poll_out, raw, readable, CommandOutput, Supervision};
use super::{command_environment, ms_since, EgressSession};
use crate::cgroup::CgroupUsage;
use crate::control::{CommandSpec, SupervisorControl, ToEngine, ToSupervisor};
use crate::error::CellError;
use crate::output::OutputCapture;
use crate::protocol::{CellCommand, ExecFailure, FromCell, PayloadEnded};
use crate::report::{CleanupReport, RunReport};
use crate::stdin_relay::StdinRelay;
use crate::sys;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::time::{Duration, Instant};

/// How long a command's pipes are drained once its process ended (a background child
/// may hold them open for as long as it likes).
/// How long pid 1 gets, after CLOSE, to kill everything, report and exit.
const CLOSE_GRACE: Duration = Duration::from_secs(2);

/// The limits of a session's life.
pub struct SessionLimits {
    pub idle_timeout: Duration,
    pub max_lifetime: Duration,
    /// When the cell was built: `max_lifetime` runs from here.
    pub built: Instant,
}

/// One command of the session, from its START (or EXEC) to its end.
struct Running {
    id: u64,
    run_id: String,
    stdout: Option<OwnedFd>,
    stderr: Option<OwnedFd>,
    output: OutputCapture,
    sinks: super::supervise::Sinks,
    stdin_relay: Option<StdinRelay>,
    deadline: Deadline,
    started: Instant,
    exec_done_at: Option<Instant>,
    exec_failure: Option<ExecFailure>,
    deadline_fired: bool,
    /// The cgroup's counters at its start: its report counts what happened since.
    counters: CgroupUsage,
}

struct Session<'c> {
    control: Option<&'c SupervisorControl>,
    credentials: &'c [(String, String)],
    limits: SessionLimits,
    running: Vec<Running>,
    /// Commands started so far (the first goes with START, the others with EXEC).
    started: usize,
    /// When the last command ended (or the cell parked).
    idle_since: Instant,
    /// When CLOSE was sent to pid 1.
    closing: Option<Instant>,
}

/// Serves commands until the session ends (CLOSE, expiry, the engine's death, the cell's
/// death); returns once pid 1 is gone.
pub fn serve_session(
    supervision: &mut Supervision<'_>,
    control: &SupervisorControl,
    credentials: &[(String, String)],
    limits: SessionLimits,
    egress: &mut Option<&mut dyn EgressSession>,
) -> Result<(), CellError> {
    let mut session = Session {
        control: Some(control),
        credentials,
        limits,
        running: Vec::new(),
        started: 0,
        idle_since: Instant::now(),
        closing: None,
    };
    let mut buf = Vec::new();
    loop {
        let mut fds = vec![
            poll_in(raw_sync(supervision)),
            poll_in(supervision.pidfd.as_raw_fd()),
            poll_in(session.control.map_or(-1, |c| c.as_fd().as_raw_fd())),
        ];
        for command in &session.running {
            let relay = command.stdin_relay.as_ref().map(StdinRelay::interest);
            fds.push(poll_in(raw(&command.stdout)));
            fds.push(poll_in(raw(&command.stderr)));
            fds.push(poll_in(relay.as_ref().map_or(-1, |r| r.source)));
            fds.push(poll_out(relay.as_ref().map_or(-1, |r| r.sink)));
        }
        sys::poll(&mut fds, poll_timeout(session.next_wake()))
            .map_err(|e| CellError::io("poll", e))?;
        for (at, command) in session.running.iter_mut().enumerate() {
            let entries = &fds[3 + 4 * at..3 + 4 * at + 4];
            command.pump(entries, &mut buf);
        }
        if readable(&fds[0]) {
            session.on_cell_message(supervision);
        }
        if readable(&fds[2]) {
            session.on_control(supervision, egress);
        }
        if readable(&fds[1]) {
            // pid 1 is gone: what it said before is still queued.
            while supervision.sync.is_some() {
                session.on_cell_message(supervision);
            }
            supervision.reap_pid1();
            session.end_unfinished(supervision, &mut buf);
            return Ok(());
        }
        session.enforce(supervision);
    }
}

/// Hands a session's new destinations to its proxy. A cell built without one (its plan
/// denies the network) has no listener to reach anything through: refused, never a
/// silent no-op.
pub(crate) fn replace_destinations(
    egress: &mut Option<&mut dyn EgressSession>,
    destinations: &[airlock_contract::DestinationRule],
) -> Result<(), String> {
    match egress {
        Some(proxy) => proxy.replace_destinations(destinations),
        None => Err("the session's cell was built without network access".to_string()),
    }
}

fn raw_sync(supervision: &Supervision<'_>) -> i32 {
    supervision
        .sync
        .as_ref()
        .map_or(-1, |s| s.as_fd().as_raw_fd())
}

impl Running {
    /// Handles the command's poll entries: stdout, stderr, the relay's source and sink.
    fn pump(&mut self, entries: &[libc::pollfd], buf: &mut Vec<u8>) {
        self.output().pump([&entries[0], &entries[1]], buf);
        if let Some(relay) = self.stdin_relay.as_mut() {
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

    /// The command's own report: classified from its exit, its deadline, its output and
    /// what the cgroup counted while it ran.
    fn report(
        self,
        supervision: &Supervision<'_>,
        wait_status: Option<i32>,
        destroyed: Option<&str>,
    ) -> RunReport {
        let now = supervision.ceilings.usage();
        let counters = CgroupUsage {
            oom_kills: now.oom_kills.saturating_sub(self.counters.oom_kills),
            pids_limit_hits: now
                .pids_limit_hits
                .saturating_sub(self.counters.pids_limit_hits),
            ..now
        };
        let observed = Observed {
            exec_done_at: self.exec_done_at,
            exec_failure: self.exec_failure,
            ended: wait_status.map(|wait_status| PayloadEnded {
                wait_status,
                full_mounts: Vec::new(),
                shm_full: false,
            }),
            deadline_fired: self.deadline_fired,
            run_id: self.run_id,
            ended_at: Some(Instant::now()),
            stdin: self.stdin_relay.map(StdinRelay::finish),
            shm_bytes: supervision.plan.limits.shm_bytes,
            destroyed: destroyed.map(str::to_string),
            ..Observed::default()
        };
        let mut report = classify(self.started, observed, self.output, counters, None);
        report.timings.wall_ms = ms_since(self.started);
        // Nothing of a command is left to clean up on its own: the session's end is.
        report.cleanup = CleanupReport {
            ok: true,
            leftovers: Vec::new(),
        };
        report
    }
}

impl Session<'_> {
    fn next_wake(&self) -> Option<Instant> {
        let deadlines = self.running.iter().filter_map(|c| c.deadline.next_wake());
        let session = match self.closing {
            Some(sent) => vec![sent + CLOSE_GRACE],
            None => {
                let lifetime = self.limits.built + self.limits.max_lifetime;
                let idle = self
                    .running
                    .is_empty()
                    .then_some(self.idle_since + self.limits.idle_timeout);
                [Some(lifetime), idle].into_iter().flatten().collect()
            }
        };
        deadlines.chain(session).min()
    }

    fn send(&self, message: ToEngine) {
        if let Some(control) = self.control {
            control.send(&message);
        }
    }

    fn on_cell_message(&mut self, supervision: &mut Supervision<'_>) {
        let Some(sync) = supervision.sync.take() else {
            return;
        };
        let message = match sync.recv() {
            Ok(Some((message, _))) => message,
            // EOF (pid 1 is exiting) or a broken protocol: the pidfd ends the session.
            Ok(None) | Err(_) => return,
        };
        supervision.sync = Some(sync);
        match message {
            FromCell::CommandStarted { id } => {
                if let Some(command) = self.running.iter_mut().find(|c| c.id == id) {
                    command.exec_done_at = Some(Instant::now());
                }
                self.send(ToEngine::CommandStarted { id });
            }
            FromCell::ExecFailed { id, failure } => {
                if let Some(command) = self.running.iter_mut().find(|c| c.id == id) {
                    command.exec_failure = Some(failure);
                }
            }
            FromCell::CommandEnded { id, wait_status } => {
                if let Some(at) = self.running.iter().position(|c| c.id == id) {
                    let mut command = self.running.remove(at);
                    command.output().drain(&mut Vec::new());
                    let report = command.report(supervision, Some(wait_status), None);
                    supervision.observed.command_escaped |=
                        report.status == crate::report::ResultClass::SuspectedEscape;
                    self.send(ToEngine::CommandEnded {
                        id,
                        report: Box::new(report),
                    });
                }
                if self.running.is_empty() {
                    self.idle_since = Instant::now();
                }
            }
            FromCell::Ended(ended) => {
                supervision.observed.ended = Some(ended);
                supervision.collect_artifacts();
            }
            // Setup messages came before the cell parked.
            FromCell::Failed(_)
            | FromCell::Listeners(_)
            | FromCell::Terminal
            | FromCell::Parked => {}
            // Only a container's further commands have terminals of their own.
            FromCell::CommandTerminal { .. } => {}
        }
    }

    fn on_control(
        &mut self,
        supervision: &mut Supervision<'_>,
        egress: &mut Option<&mut dyn EgressSession>,
    ) {
        let Some(control) = self.control else { return };
        match control.recv() {
            Ok(Some((
                ToSupervisor::Run {
                    id,
                    run_id,
                    command,
                    ..
                },
                fds,
            ))) => {
                if let Err(err) = self.start(supervision, id, &run_id, command, fds) {
                    let report = RunReport::refused(&run_id, err.class(), err.to_string());
                    self.send(ToEngine::CommandEnded {
                        id,
                        report: Box::new(report),
                    });
                }
            }
            Ok(Some((ToSupervisor::Kill { id }, _))) => {
                if let Some(sync) = &supervision.sync {
                    let _ = sync.kill_command(id, libc::SIGKILL);
                }
            }
            Ok(Some((ToSupervisor::Signal { id, signal }, _))) => {
                if let Some(sync) = &supervision.sync {
                    let _ = sync.kill_command(id, signal.number());
                }
            }
            Ok(Some((
                ToSupervisor::SetDestinations {
                    change,
                    destinations,
                },
                _,
            ))) => {
                let error = replace_destinations(egress, &destinations).err();
                self.send(ToEngine::DestinationsSet { change, error });
            }
            Ok(Some((ToSupervisor::Close, _))) => self.close(supervision, "closed by the engine"),
            Ok(None) | Err(_) => {
                // The engine is gone: nobody will read a report, the cell goes at once.
                self.control = None;
                supervision.destroy("the engine went away");
            }
        }
    }

    /// Starts a command of the session: its limits (at most the plan's), environment
    /// and pipes, then START (the first) or EXEC.
    fn start(
        &mut self,
        supervision: &mut Supervision<'_>,
        id: u64,
        run_id: &str,
        spec: CommandSpec,
        fds: Vec<OwnedFd>,
    ) -> Result<(), CellError> {
        if self.closing.is_some() {
            return Err(CellError::Unsupported("the session is closing".into()));
        }
        if self.running.iter().any(|c| c.id == id) {
            return Err(CellError::Protocol {
                message: format!("command {id} is already running"),
            });
        }
        let plan = supervision.plan;
        let (wall_time_ms, output_bytes) = command_limits(plan, &spec)?;
        let env = command_environment(plan, self.credentials, &spec.env)?;
        if spec.watch_caller {
            // A session outlives its callers by design (idle timeout, maximum lifetime).
            return Err(CellError::Protocol {
                message: "a session command with a watched caller".into(),
            });
        }
        let io = command_io(plan, supervision.host, &spec, fds)?;
        let command = CellCommand {
            id,
            argv: spec.argv,
            env,
            stdio: io.stdio,
        };
        let Some(sync) = &supervision.sync else {
            return Err(CellError::Unsupported("the cell is gone".into()));
        };
        let ends: Vec<BorrowedFd<'_>> = io.cell_ends.iter().map(|f| f.as_fd()).collect();
        let sent = match self.started {
            0 => sync.start(command, &ends),
            _ => sync.exec(command, &ends),
        };
        sent.map_err(|e| CellError::io("starting a command", e))?;
        drop(io.cell_ends);
        if self.started == 0 && supervision.artifacts.is_some() {
            // The cell's mounts are final: held for a collection after a memory kill.
            supervision.observed.output_mounts =
                crate::artifacts::OutputMounts::open(supervision.pid, plan);
        }
        if self.started == 0 && supervision.observed.writable_mounts.is_empty() {
            // Held until the session's end (usually since the cell parked): a suspected
            // escape's evidence is copied from them before the cell is destroyed.
            supervision.hold_writable_mounts();
        }
        self.started += 1;
        let now = Instant::now();
        self.running.push(Running {
            id,
            run_id: run_id.to_string(),
            stdout: io.stdout,
            stderr: io.stderr,
            output: OutputCapture::new(output_bytes),
            sinks: io.sinks,
            stdin_relay: io.stdin_relay,
            deadline: Deadline::from_start(now, wall_time_ms),
            started: now,
            exec_done_at: None,
            exec_failure: None,
            deadline_fired: false,
            counters: supervision.ceilings.usage(),
        });
        Ok(())
    }

    /// Starts the completion sequence once: pid 1 kills everything, reports the session's
    /// end, waits for the artifacts' collection and exits.
    fn close(&mut self, supervision: &mut Supervision<'_>, why: &str) {
        if self.closing.is_some() {
            return;
        }
        self.closing = Some(Instant::now());
        supervision
            .observed
            .notes
            .push(format!("the session ended: {why}"));
        match &supervision.sync {
            Some(sync) if sync.close_session().is_ok() => {}
            _ => supervision.destroy(why),
        }
    }

    /// The deadlines of the running commands, the session's idle timeout and lifetime,
    /// and pid 1's grace after CLOSE.
    fn enforce(&mut self, supervision: &mut Supervision<'_>) {
        let now = Instant::now();
        for command in &mut self.running {
            let (deadline, step) = command.deadline.advance(now);
            command.deadline = deadline;
            let signal = match step {
                Some(Step::Terminate) => {
                    command.deadline_fired = true;
                    libc::SIGTERM
                }
                Some(Step::KillAllButPid1) => libc::SIGKILL,
                // pid 1 serves the other commands: only the command's group is killed.
                Some(Step::KillPid1) | None => continue,
            };
            if let Some(sync) = &supervision.sync {
                let _ = sync.kill_command(command.id, signal);
            }
        }
        if let Some(sent) = self.closing {
            if now >= sent + CLOSE_GRACE {
                supervision.destroy("the cell did not end after CLOSE");
            }
            return;
        }
        if now >= self.limits.built + self.limits.max_lifetime {
            let why = format!("max_lifetime: {} ms", self.limits.max_lifetime.as_millis());
            self.close(supervision, &why);
        } else if self.running.is_empty() && now >= self.idle_since + self.limits.idle_timeout {
            let why = format!(
                "idle_timeout: no command for {} ms",
                self.limits.idle_timeout.as_millis()
            );
            self.close(supervision, &why);
        }
    }

    /// Commands still running when pid 1 went (killed with the session): their reports.
    fn end_unfinished(&mut self, supervision: &Supervision<'_>, buf: &mut Vec<u8>) {
        for mut command in std::mem::take(&mut self.running) {
            command.output().drain(buf);
            let id = command.id;
            let report = command.report(supervision, None, Some("the session ended"));
            self.send(ToEngine::CommandEnded {
                id,
                report: Box::new(report),
            });
        }
    }
}
