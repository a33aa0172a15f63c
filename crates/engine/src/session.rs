//! Sessions: one cell serving several commands of one job (its writable paths persist
//! between them), never shared between jobs. The session has a record of its own, begun
//! when its cell is built and completed when it is destroyed (closed, idle too long or
//! past its lifetime, all enforced from outside by its supervisor); each command has its
//! own record, begun before the command is sent to the cell and naming the session.
//!
//! One reader thread per session reads the supervisor's reports and completes each
//! command's record as it ends, whether or not anyone waits for it (a background
//! command's end is recorded too).

use crate::cells::{supervisor_gone, wait_parked, Stdio};
use crate::factory::CellHost;
use crate::host::{HostMode, HostRequest};
use crate::record::{self, InputHasher};
use crate::stores::StorePool;
use crate::{Engine, EngineError};
use airlock_cell::artifacts::ArtifactRequest;
use airlock_cell::control::{CommandSpec, ToEngine};
use airlock_cell::report::{ResultClass, RunReport};
use airlock_cell::PayloadStdin;
use airlock_contract::CellPlan;
use airlock_contract::PlanTransfer;
use airlock_store::{RunHandle, RunStart, Store};
use std::collections::BTreeMap;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// A session to open: the plan of its cell (its `argv` is not run), and how long it may
/// live.
pub struct SessionRequest {
    pub plan: CellPlan,
    pub workload_class: String,
    pub credentials: Vec<(String, String)>,
    /// Where the declared artifacts go when the session ends.
    pub artifacts: Option<ArtifactRequest>,
    /// Destroyed when no command ran for this long.
    pub idle_timeout: Duration,
    /// Destroyed this long after it was built, whatever runs.
    pub max_lifetime: Duration,
    /// The service tenant the session and its commands are recorded for.
    pub tenant: Option<String>,
    /// Called once the session's record is complete, with its final report and, when
    /// it was a suspected escape, where its writable paths were copied (the front end
    /// keeps or removes the copy). `None`: a copy is removed.
    pub after_close: Option<AfterClose>,
}

/// See [`SessionRequest::after_close`].
pub type AfterClose = Box<dyn FnOnce(&RunReport, Option<&std::path::Path>) + Send>;

/// One command of a session.
pub struct CommandRequest {
    pub argv: Vec<String>,
    /// Added to the plan's environment.
    pub env: Vec<(String, String)>,
    pub stdin: PayloadStdin,
    pub stdout: Option<OwnedFd>,
    pub stderr: Option<OwnedFd>,
    /// May only lower the plan's.
    pub wall_time_ms: Option<u64>,
    /// May only lower the plan's.
    pub output_bytes: Option<u64>,
}

impl CommandRequest {
    /// `argv` with no stdin, output captured only, the plan's limits.
    pub fn new(argv: &[&str]) -> CommandRequest {
        CommandRequest {
            argv: argv.iter().map(|a| a.to_string()).collect(),
            env: Vec::new(),
            stdin: PayloadStdin::Null,
            stdout: None,
            stderr: None,
            wall_time_ms: None,
            output_bytes: None,
        }
    }
}

/// A command of a session, as [`Session::list`] shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommandStatus {
    pub id: u64,
    pub run_id: String,
    pub argv: Vec<String>,
    pub running: bool,
}

enum CommandState {
    Running {
        argv: Vec<String>,
        record: Option<(Store, RunHandle)>,
    },
    Ended {
        argv: Vec<String>,
        report: Box<RunReport>,
    },
}

#[derive(Default)]
struct SessionState {
    commands: BTreeMap<u64, CommandState>,
    run_ids: BTreeMap<u64, String>,
    /// The supervisor's answers to destination changes, by change number: `None`
    /// applied, `Some(why)` not.
    destination_answers: BTreeMap<u64, Option<String>>,
    /// The session's final report, once its cell is destroyed.
    closed: Option<Box<RunReport>>,
    /// Why the operator ended the session ([`Session::end_by_operator`]), if it did.
    ended_by_operator: Option<String>,
}

type Shared = Arc<(Mutex<SessionState>, Condvar)>;

/// An open session. Dropping it without [`Session::close`] destroys the cell too (its
/// supervisor sees EOF on its control socket).
pub struct Session {
    /// The engine's store connections (a session does not borrow its engine).
    stores: Arc<StorePool>,
    host: Arc<CellHost>,
    run_id: String,
    secrets: Vec<String>,
    shared: Shared,
    reader: Option<std::thread::JoinHandle<()>>,
    next_id: AtomicU64,
    next_change: AtomicU64,
    plan: CellPlan,
    workload_class: String,
    tenant: Option<String>,
    /// pid 1 of the session's cell, in this process's pid namespace.
    cell_pid: i32,
    /// Revokes the session's provider tokens; dropped after `Drop for Session` destroyed
    /// the cell.
    _revoker: crate::egress_session::TokenRevoker,
}

impl Engine {
    /// Builds a session's cell and begins its record.
    pub fn open_session(&self, request: SessionRequest) -> Result<Session, EngineError> {
        let SessionRequest {
            mut plan,
            workload_class,
            credentials,
            artifacts,
            idle_timeout,
            max_lifetime,
            tenant,
            after_close,
        } = request;
        plan.credentials_lifted = self.decide_credentials(&plan, &workload_class)?;
        record::check_exec(&[], &plan, &credentials, &[])?;
        if plan.broker.is_some() {
            // A session's socket would outlive each command's authorization: not built.
            return Err(EngineError::SessionFailed(
                "broker actions are served to one-shot runs only, not sessions".to_string(),
            ));
        }
        let ready =
            crate::egress_session::prepare_secrets(&self.config.egress, &plan, max_lifetime)
                .map_err(|err| EngineError::SessionFailed(err.to_string()))?;
        let (placeholders, hidden, injections) = crate::egress_session::split_prepared(ready);
        let mut credentials = credentials;
        credentials.extend(placeholders);
        let mut secrets = record::secrets_of(&plan, &credentials);
        secrets.extend(hidden);
        // Revokes the provider tokens when the session ends (or fails to open).
        let revoker = crate::egress_session::TokenRevoker(injections.clone());
        let host = self.spawn_host(HostRequest {
            plan: PlanTransfer::of(&plan),
            credentials,
            secrets: injections,
            artifacts,
            // Copied at the session's end if one of its commands was a suspected
            // escape (the session is closed at once then, see read_reports).
            on_suspected_escape: self.on_suspected_escape(),
            mode: HostMode::Session {
                idle_timeout_ms: idle_timeout.as_millis() as u64,
                max_lifetime_ms: max_lifetime.as_millis() as u64,
            },
        })?;
        let argv = vec!["<session>".to_string()];
        let start = RunStart {
            argv: argv.clone(),
            input_sha256: InputHasher::new(&argv).finish(),
            contract_sha256: plan.contract_sha256.clone(),
            workload_class: workload_class.clone(),
            plan_json: serde_json::to_value(&plan).unwrap_or_default(),
            session_id: None,
            tenant: tenant.clone(),
        };
        // Written while the supervisor builds the cell.
        let (store, handle) = self
            .begin_record(start, &secrets)
            .map_err(crate::lifecycle::BeginFailed::into_error)?;
        let cell_pid = match wait_parked(&host.control) {
            Ok(pid) => pid,
            Err(report) => {
                let _ = record::finish(&store, &handle, &report, &stored(&report));
                return Err(EngineError::SessionFailed(
                    report.error.clone().unwrap_or_default(),
                ));
            }
        };
        let session_id = handle.run_id();
        let closing = Closing {
            evidence_dir: host.evidence_dir.clone(),
            after_close,
        };
        let host = Arc::new(host);
        let shared: Shared = Arc::default();
        let reader = {
            let host = Arc::clone(&host);
            let shared = Arc::clone(&shared);
            let stores = Arc::clone(&self.stores);
            std::thread::Builder::new()
                .name("session-reports".into())
                .spawn(move || read_reports(&host, &shared, &stores, (store, handle), closing))
                .map_err(|source| EngineError::Factory {
                    context: "starting a session's reader thread".into(),
                    source,
                })?
        };
        Ok(Session {
            stores: Arc::clone(&self.stores),
            host,
            run_id: session_id,
            secrets,
            shared,
            reader: Some(reader),
            next_id: AtomicU64::new(1),
            next_change: AtomicU64::new(1),
            plan,
            workload_class,
            tenant,
            cell_pid,
            _revoker: revoker,
        })
    }
}

fn stored(report: &RunReport) -> serde_json::Value {
    serde_json::to_value(report).unwrap_or_default()
}

impl Session {
    /// The session's own run id (its commands' records name it as their session).
    pub fn id(&self) -> &str {
        &self.run_id
    }

    /// The plan the session's cell was built from (its writable paths, its identity).
    pub fn plan(&self) -> &CellPlan {
        &self.plan
    }

    /// pid 1 of the session's cell as this process sees it (the factory and its
    /// supervisors share this process's pid namespace): its `/proc/<pid>/root` is the
    /// cell's root, while the cell lives.
    pub fn cell_pid(&self) -> i32 {
        self.cell_pid
    }

    /// The tenant the session is recorded for.
    pub fn tenant(&self) -> Option<&str> {
        self.tenant.as_deref()
    }

    /// Starts a command and returns its id at once (a background command); its report is
    /// [`Session::wait`]'s. The command's record is begun before it is sent to the cell.
    pub fn exec(&self, command: CommandRequest) -> Result<u64, EngineError> {
        if self.closed().is_some() {
            return Err(EngineError::SessionClosed);
        }
        record::check_exec(&command.argv, &self.plan, &[], &command.env)?;
        let id = self.next_id.fetch_add(1, Ordering::SeqCst);
        let start = RunStart {
            argv: command.argv.clone(),
            input_sha256: InputHasher::new(&command.argv).finish(),
            contract_sha256: self.plan.contract_sha256.clone(),
            workload_class: self.workload_class.clone(),
            plan_json: serde_json::Value::Null,
            session_id: Some(self.run_id.clone()),
            tenant: self.tenant.clone(),
        };
        let store = self.stores.take()?;
        let handle = store
            .begin_run(start, self.secrets.clone())
            .map_err(EngineError::Store)?;
        let run_id = handle.run_id();
        {
            let (state, _) = &*self.shared;
            let mut state = state.lock().unwrap_or_else(|p| p.into_inner());
            state.run_ids.insert(id, run_id.clone());
            state.commands.insert(
                id,
                CommandState::Running {
                    argv: command.argv.clone(),
                    record: Some((store, handle)),
                },
            );
        }
        let stdio = Stdio::of(command.stdin, command.stdout, command.stderr)?;
        let spec = CommandSpec {
            argv: command.argv,
            env: command.env,
            wall_time_ms: command.wall_time_ms,
            output_bytes: command.output_bytes,
            stdin: stdio.stdin.is_some(),
            watch_caller: false,
        };
        stdio
            .send(&self.host.control, id, &run_id, spec, false)
            .map_err(|err| EngineError::FactoryProtocol(err.to_string()))?;
        Ok(id)
    }

    /// Runs a command and waits for its report.
    pub fn run(&self, command: CommandRequest) -> Result<RunReport, EngineError> {
        let id = self.exec(command)?;
        self.wait(id)
    }

    /// Waits until command `id` ended; its report (its record is complete by then).
    pub fn wait(&self, id: u64) -> Result<RunReport, EngineError> {
        let (state, ended) = &*self.shared;
        let mut state = state.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            match state.commands.get(&id) {
                None => return Err(EngineError::NoSuchCommand(id)),
                Some(CommandState::Ended { report, .. }) => return Ok((**report).clone()),
                Some(CommandState::Running { .. }) => {}
            }
            state = ended.wait(state).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Kills command `id` (its process group in the cell); the session goes on.
    pub fn kill(&self, id: u64) -> Result<(), EngineError> {
        self.host
            .control
            .kill(id)
            .map_err(|err| EngineError::FactoryProtocol(err.to_string()))
    }

    /// Sends `signal` to command `id`'s process group (nothing if it has ended).
    pub fn signal(
        &self,
        id: u64,
        signal: airlock_cell::control::CommandSignal,
    ) -> Result<(), EngineError> {
        self.host
            .control
            .signal(id, signal)
            .map_err(|err| EngineError::FactoryProtocol(err.to_string()))
    }

    /// Replaces the destinations the session's egress proxy allows (a change the policy
    /// layer granted): returns once the proxy decides every new connection against
    /// them. Connections already open may finish. A session whose cell was built
    /// without network access has no proxy: refused.
    pub fn set_destinations(
        &self,
        destinations: Vec<airlock_contract::DestinationRule>,
    ) -> Result<(), EngineError> {
        if !matches!(
            self.plan.network,
            airlock_contract::NetworkPlan::Allowlist { .. }
        ) {
            return Err(EngineError::DestinationsNotSet(
                "the session's cell was built without network access (network mode deny)"
                    .to_string(),
            ));
        }
        if self.closed().is_some() {
            return Err(EngineError::SessionClosed);
        }
        let change = self.next_change.fetch_add(1, Ordering::SeqCst);
        self.host
            .control
            .set_destinations(change, destinations)
            .map_err(|err| EngineError::FactoryProtocol(err.to_string()))?;
        let (state, changed) = &*self.shared;
        let mut state = state.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if let Some(answer) = state.destination_answers.remove(&change) {
                return answer.map_or(Ok(()), |why| Err(EngineError::DestinationsNotSet(why)));
            }
            if state.closed.is_some() {
                return Err(EngineError::SessionClosed);
            }
            state = changed.wait(state).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Every command so far, running or ended.
    pub fn list(&self) -> Vec<CommandStatus> {
        let (state, _) = &*self.shared;
        let state = state.lock().unwrap_or_else(|p| p.into_inner());
        state
            .commands
            .iter()
            .map(|(id, command)| {
                let (argv, running) = match command {
                    CommandState::Running { argv, .. } => (argv.clone(), true),
                    CommandState::Ended { argv, .. } => (argv.clone(), false),
                };
                CommandStatus {
                    id: *id,
                    run_id: state.run_ids.get(id).cloned().unwrap_or_default(),
                    argv,
                    running,
                }
            })
            .collect()
    }

    /// The session's final report, if its cell is already destroyed (closed or expired).
    pub fn closed(&self) -> Option<RunReport> {
        let (state, _) = &*self.shared;
        let state = state.lock().unwrap_or_else(|p| p.into_inner());
        state.closed.as_deref().cloned()
    }

    /// [`Session::close`] from a shared reference, for a session other threads may be
    /// waiting on (their commands end with the cell): asks for the cell's destruction
    /// and waits for the final report; its record is complete by then.
    pub fn end(&self) -> Result<RunReport, EngineError> {
        let _ = self.host.control.close();
        let (state, changed) = &*self.shared;
        let mut state = state.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if let Some(report) = &state.closed {
                return Ok((**report).clone());
            }
            state = changed.wait(state).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// [`Session::end`] on the operator's behalf (the service's drain): the session's
    /// record, and those of its commands still running, say so ([`OPERATOR_ENDED`]).
    pub fn end_by_operator(&self, why: &str) -> Result<RunReport, EngineError> {
        {
            let (state, _) = &*self.shared;
            let mut state = state.lock().unwrap_or_else(|p| p.into_inner());
            if state.closed.is_none() {
                state.ended_by_operator = Some(why.to_string());
            }
        }
        self.end()
    }

    /// Destroys the session's cell (the completion sequence runs once, for the whole
    /// session) and returns its final report; its record is complete by then.
    pub fn close(mut self) -> Result<RunReport, EngineError> {
        // Already gone (expired) is not an error: the report says why it ended.
        let _ = self.host.control.close();
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
        self.closed()
            .ok_or_else(|| EngineError::SessionFailed("no final report".into()))
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        if let Some(reader) = self.reader.take() {
            let _ = self.host.control.close();
            let _ = reader.join();
        }
    }
}

/// The reader thread: completes each command's record as its report arrives, and the
/// session's when the cell is destroyed.
fn read_reports(
    host: &CellHost,
    shared: &Shared,
    stores: &StorePool,
    (store, handle): (Store, RunHandle),
    closing: Closing,
) {
    let (state, changed) = &**shared;
    // The first command that was a suspected escape: the session is closed at once.
    let mut escaped: Option<String> = None;
    let final_report = loop {
        match host.control.recv() {
            Ok(Some(ToEngine::CommandEnded { id, report })) => {
                let mut guard = state.lock().unwrap_or_else(|p| p.into_inner());
                if report.status == ResultClass::SuspectedEscape && escaped.is_none() {
                    // Nothing more runs in a cell whose command aimed at the boundary;
                    // the completion sequence runs as at any close.
                    let _ = host.control.close();
                    escaped = Some(guard.run_ids.get(&id).cloned().unwrap_or_default());
                }
                let mut report = report;
                // A command the cell's destruction ended (runtime_fault) after the
                // operator ended the session was ended by the operator; an outcome of
                // its own (ok, task_error, a limit) stays what it was.
                if let (Some(why), ResultClass::RuntimeFault) =
                    (guard.ended_by_operator.clone(), report.status)
                {
                    ended_by_operator(&mut report, &why);
                }
                end_command(&mut guard, id, report, stores);
                drop(guard);
                changed.notify_all();
            }
            Ok(Some(ToEngine::DestinationsSet { change, error })) => {
                let mut guard = state.lock().unwrap_or_else(|p| p.into_inner());
                guard.destination_answers.insert(change, error);
                drop(guard);
                changed.notify_all();
            }
            Ok(Some(ToEngine::Closed { report })) | Ok(Some(ToEngine::Failed { report })) => {
                break report;
            }
            Ok(Some(_)) => {}
            Ok(None) | Err(_) => break Box::new(supervisor_gone(&handle.run_id())),
        }
    };
    let mut guard = state.lock().unwrap_or_else(|p| p.into_inner());
    let mut final_report = final_report;
    if let Some(why) = guard.ended_by_operator.clone() {
        ended_by_operator(&mut final_report, &why);
    }
    // Commands without an end report died with the cell.
    let unfinished: Vec<u64> = guard
        .commands
        .iter()
        .filter(|(_, c)| matches!(c, CommandState::Running { .. }))
        .map(|(id, _)| *id)
        .collect();
    for id in unfinished {
        let run_id = guard.run_ids.get(&id).cloned().unwrap_or_default();
        let mut report = final_report.clone();
        report.run_id = run_id;
        end_command(&mut guard, id, report, stores);
    }
    let mut report = final_report;
    report.run_id = handle.run_id();
    if let Some(command) = escaped {
        closed_for_escape(&mut report, &command);
    }
    let _ = record::finish(&store, &handle, &report, &stored(&report));
    stores.give_back(store);
    guard.closed = Some(report.clone());
    drop(guard);
    changed.notify_all();
    closing.after_close(&report);
}

/// What happens once the session's record is complete: its evidence is handed to the
/// front end, or removed when nobody takes it.
struct Closing {
    evidence_dir: Option<std::path::PathBuf>,
    after_close: Option<AfterClose>,
}

impl Closing {
    fn after_close(self, report: &RunReport) {
        let copy = self.evidence_dir.filter(|d| d.exists());
        match self.after_close {
            Some(after_close) => after_close(report, copy.as_deref()),
            None => {
                if let Some(copy) = copy {
                    let _ = std::fs::remove_dir_all(copy);
                }
            }
        }
    }
}

/// The start of the `error` of a record the operator ended: a stable prefix (a reason
/// code) that says the service ended it, not the payload, the tenant or a fault.
pub const OPERATOR_ENDED: &str = "server.drained";

/// A session (or a command of it) ended by the operator: `capacity_exceeded`, as the
/// service withdrew the capacity it ran on (as its refusal of new work while it drains
/// is), its `error` starting with [`OPERATOR_ENDED`]. A suspected escape stays one.
fn ended_by_operator(report: &mut RunReport, why: &str) {
    if report.status == ResultClass::SuspectedEscape {
        return;
    }
    report.status = ResultClass::CapacityExceeded;
    report.error = Some(format!("{OPERATOR_ENDED}: ended by the operator: {why}"));
}

/// The session's own record says why it ended: one of its commands was a suspected
/// escape (the command's own record has its evidence).
fn closed_for_escape(report: &mut RunReport, command: &str) {
    let command = if command.is_empty() {
        "a command"
    } else {
        command
    };
    report.notes.push(format!(
        "the session was closed: its command {command} was a suspected escape"
    ));
    report.status = ResultClass::SuspectedEscape;
}

/// Records the end of command `id` and keeps its report for [`Session::wait`].
fn end_command(state: &mut SessionState, id: u64, mut report: Box<RunReport>, stores: &StorePool) {
    let Some(CommandState::Running { argv, record }) = state.commands.remove(&id) else {
        return;
    };
    report.run_id = state.run_ids.get(&id).cloned().unwrap_or_default();
    if let Some((store, handle)) = record {
        let _ = record::finish(&store, &handle, &report, &stored(&report));
        stores.give_back(store);
    }
    state
        .commands
        .insert(id, CommandState::Ended { argv, report });
}
