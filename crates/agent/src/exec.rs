//! Running one command in a cell and keeping its stdout: every call runs as the one
//! command of an engine session (so a call can be cancelled: its command is killed and
//! the session's cell destroyed), its validated input on stdin through a pipe, its
//! stdout into an unlinked temporary file of which at most `cap + 1` bytes are read
//! back, its stderr captured (bounded) into the run's audit record only.

use crate::AgentError;
use airlock_cell::report::RunReport;
use airlock_cell::PayloadStdin;
use airlock_contract::CellPlan;
use airlock_engine::{AfterClose, CommandRequest, Engine, Session, SessionRequest};
use std::io::{Read, Seek, Write};
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

/// Room left in a command's output budget for its stderr (both streams count against the
/// contract's `output_bytes`), so that a chatty stderr does not cut a valid stdout short.
pub const STDERR_BUDGET: u64 = 64 << 10;
/// How long a session may outlive its command's deadline (build and teardown).
const SESSION_SLACK: Duration = Duration::from_secs(60);

/// What a command produced.
pub struct Execution {
    pub report: RunReport,
    /// At most `cap + 1` bytes.
    pub stdout: Vec<u8>,
    pub stdout_seen: u64,
    /// At most `cap + 1` bytes, when stderr was asked for (the shell tool's format).
    pub stderr: Option<Vec<u8>>,
}

/// A cancellation slot shared between the thread waiting for a command and whoever may
/// cancel it: firing it kills the command (if it runs) and marks the call cancelled.
#[derive(Clone, Default)]
pub struct Cancel(Arc<Mutex<CancelState>>);

#[derive(Default)]
struct CancelState {
    fired: bool,
    running: Option<(Weak<Session>, u64)>,
}

impl Cancel {
    pub fn fire(&self) {
        let mut state = self.0.lock().unwrap_or_else(|p| p.into_inner());
        state.fired = true;
        if let Some((session, id)) = &state.running {
            if let Some(session) = session.upgrade() {
                let _ = session.kill(*id);
            }
        }
    }

    pub fn fired(&self) -> bool {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).fired
    }

    /// Registers a started command; kills it at once when the slot already fired.
    fn started(&self, session: &Arc<Session>, id: u64) {
        let mut state = self.0.lock().unwrap_or_else(|p| p.into_inner());
        state.running = Some((Arc::downgrade(session), id));
        if state.fired {
            let _ = session.kill(id);
        }
    }

    fn ended(&self) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).running = None;
    }
}

/// One command to run.
pub struct CommandRun<'a> {
    pub argv: Vec<String>,
    pub stdin: &'a [u8],
    /// The stdout cap: at most this many bytes plus one are kept.
    pub cap: u64,
    pub keep_stderr: bool,
    /// Lowers the plan's wall time.
    pub wall_time_ms: Option<u64>,
}

/// Who a cell is for and what it carries: its workload class, the credential values
/// its plan names, the service tenant it is recorded for (`None` from the CLI), and what
/// becomes of a suspected escape's evidence (`Planner::after_close`).
pub struct Cell<'a> {
    pub workload_class: &'a str,
    pub credentials: Vec<(String, String)>,
    pub tenant: Option<&'a str>,
    pub after_close: Option<AfterClose>,
}

/// Opens a session for `plan` (one cell) that lives at least `lifetime`.
pub fn open_session(
    engine: &Engine,
    plan: CellPlan,
    cell: Cell<'_>,
    lifetime: Duration,
) -> Result<Arc<Session>, AgentError> {
    let wall = Duration::from_millis(plan.limits.wall_time_ms);
    let session = engine.open_session(SessionRequest {
        plan,
        workload_class: cell.workload_class.to_string(),
        credentials: cell.credentials,
        artifacts: None,
        idle_timeout: wall.max(lifetime) + SESSION_SLACK,
        max_lifetime: wall.max(lifetime) + SESSION_SLACK,
        tenant: cell.tenant.map(String::from),
        after_close: cell.after_close,
    })?;
    Ok(Arc::new(session))
}

/// Runs `plan`'s command once in a cell of its own, destroyed when it ends.
pub fn run_once(
    engine: &Engine,
    plan: CellPlan,
    cell: Cell<'_>,
    command: CommandRun<'_>,
    cancel: &Cancel,
) -> Result<Execution, AgentError> {
    let output_bytes = plan.limits.output_bytes;
    let session = open_session(engine, plan, cell, Duration::ZERO)?;
    let executed = run_in(&session, output_bytes, command, cancel);
    // The last reference: the session's cell is destroyed here (Session's Drop).
    drop(session);
    executed
}

/// Runs one command in an open session and waits for it.
pub fn run_in(
    session: &Arc<Session>,
    plan_output_bytes: u64,
    command: CommandRun<'_>,
    cancel: &Cancel,
) -> Result<Execution, AgentError> {
    let io = |err: std::io::Error| AgentError::Agent(format!("tool stdio: {err}"));
    let mut stdout = tempfile::tempfile().map_err(io)?;
    let mut stderr = match command.keep_stderr {
        true => Some(tempfile::tempfile().map_err(io)?),
        false => None,
    };
    let (stdin_read, mut stdin_write) = std::io::pipe().map_err(io)?;
    let input = command.stdin.to_vec();
    // The pipe holds 64 KiB; the rest is written while the command reads it. A command
    // that never reads ends, and so does this write (EPIPE).
    let writer = std::thread::Builder::new()
        .name("tool-stdin".into())
        .spawn(move || {
            let _ = stdin_write.write_all(&input);
        })
        .map_err(io)?;
    let budget = plan_output_bytes.min(command.cap + 1 + STDERR_BUDGET);
    let sink = |file: &std::fs::File| file.try_clone().map(OwnedFd::from).map_err(io);
    let id = session.exec(CommandRequest {
        argv: command.argv,
        env: Vec::new(),
        stdin: PayloadStdin::Relayed(OwnedFd::from(stdin_read)),
        stdout: Some(sink(&stdout)?),
        stderr: stderr.as_ref().map(sink).transpose()?,
        wall_time_ms: command.wall_time_ms,
        output_bytes: Some(budget),
    })?;
    cancel.started(session, id);
    let report = session.wait(id);
    cancel.ended();
    let _ = writer.join();
    let report = report?;
    let stdout_seen = report
        .output
        .as_ref()
        .map_or(0, |output| output.stdout.bytes_seen);
    let kept = read_head(&mut stdout, command.cap + 1).map_err(io)?;
    let stderr = match stderr.as_mut() {
        Some(file) => Some(read_head(file, command.cap + 1).map_err(io)?),
        None => None,
    };
    Ok(Execution {
        report,
        stdout: kept,
        stdout_seen,
        stderr,
    })
}

/// The first `limit` bytes of `file`.
fn read_head(file: &mut std::fs::File, limit: u64) -> std::io::Result<Vec<u8>> {
    file.rewind()?;
    let mut bytes = Vec::new();
    file.take(limit).read_to_end(&mut bytes)?;
    Ok(bytes)
}
