//! One run from plan to record: the audit begin record (fail closed: no record, no
//! payload), the cell, the completion sequence, the final record. Refusals before any
//! cell existed are recorded too.

use crate::egress_session::ProxySession;
use crate::inputs::{self, InputContents};
use crate::record::{self, InputHasher};
use crate::{Engine, EngineError};
use airlock_cell::artifacts::ArtifactRequest;
use airlock_cell::report::{ResultClass, RunReport};
use airlock_cell::{EgressSession, PayloadStdin, RunOptions};
use airlock_contract::{CellPlan, NetworkPlan};
use airlock_store::{RunHandle, RunStart, Store};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// A command to run in a fresh cell, with everything decided: the compiled plan (its
/// `argv` is the command), the credential values, stdin and where declared artifacts go.
pub struct RunRequest {
    pub plan: CellPlan,
    /// Recorded with the run (for the per-class figures of `airlock stats`).
    pub workload_class: String,
    /// `(variable, value)` of every credential of the plan.
    pub credentials: Vec<(String, String)>,
    pub stdin: PayloadStdin,
    pub artifacts: Option<ArtifactRequest>,
    /// Where the payload's output is forwarded as it arrives (it is captured, bounded, in
    /// the report either way).
    pub stdout: Option<OwnedFd>,
    pub stderr: Option<OwnedFd>,
    /// When the caller started handling the request (the start-up figure covers it).
    pub started: Instant,
    /// The service tenant the run is recorded for; `None` for the command line.
    pub tenant: Option<String>,
    /// Called with the run id once the begin record exists, before the payload starts
    /// ([`Engine::run`] only): the service's `start` frame.
    pub on_recorded: Option<RecordedHook>,
    /// A descriptor of the caller's (a hand-off client's socket): when its far end hangs
    /// up, the cell is destroyed (`runtime_fault`, "the caller went away"), as a cell
    /// dies with a caller it runs in. Watched by a cell the factory cloned; a run
    /// supervised on the caller's thread ([`Engine::run_here`], the gVisor tier) ends at
    /// its deadline instead.
    pub caller: Option<OwnedFd>,
}

/// See [`RunRequest::on_recorded`].
pub type RecordedHook = Box<dyn FnOnce(&str) + Send>;

/// A run whose cell is gone and whose record is not complete yet: the caller delivers
/// what it promised (artifacts, a result file) and then [`Engine::complete`]s it, so
/// that a failed delivery is part of the record.
pub struct FinishedRun {
    pub report: RunReport,
    pub plan: CellPlan,
    /// The content hash of the read-only inputs, computed while the payload ran.
    pub inputs: Option<InputContents>,
    /// Values that must never reach the store or a result file.
    pub secrets: Vec<String>,
    /// For a run through the factory: when its command was sent, started and ended.
    pub latency: Option<CommandLatency>,
    /// Where the cell's writable paths were copied if its verdict was a suspected escape
    /// (the directory exists only then, with its `writable-manifest.json`).
    pub evidence_dir: Option<PathBuf>,
    record: Result<(Store, RunHandle), BeginFailed>,
    /// For a run on a parked cell: wakes the pool's refill when dropped (with this run,
    /// or later: [`FinishedRun::take_refill`]).
    pub(crate) refill: Option<crate::pool::PoolRefill>,
}

/// Why a run's begin record could not be written (then nothing ran): the class the run
/// ends in (`store_unavailable` while the store cannot be reached, else `runtime_fault`)
/// and the store's message.
#[derive(Debug, Clone)]
pub struct BeginFailed {
    pub class: ResultClass,
    pub error: String,
}

impl BeginFailed {
    pub(crate) fn of(err: &EngineError) -> BeginFailed {
        BeginFailed {
            class: err.class(),
            error: err.to_string(),
        }
    }

    /// As an engine error, keeping an unavailable store apart.
    pub fn into_error(self) -> EngineError {
        match self.class {
            ResultClass::StoreUnavailable => EngineError::StoreUnavailable(self.error),
            _ => EngineError::NotRecorded(self.error),
        }
    }
}

/// The milestones of a command sent to a parked cell, as the engine saw them.
#[derive(Debug, Clone, Copy)]
pub struct CommandLatency {
    pub command_sent: Instant,
    /// The supervisor confirmed the payload's exec.
    pub exec_confirmed: Instant,
    /// The command's report arrived: its exit is known.
    pub exit_known: Instant,
    /// The cell is destroyed and its final report arrived.
    pub closed: Instant,
}

impl FinishedRun {
    pub(crate) fn new(
        mut report: RunReport,
        plan: CellPlan,
        inputs: Option<InputContents>,
        secrets: Vec<String>,
        record: Result<(Store, RunHandle), BeginFailed>,
    ) -> FinishedRun {
        match &record {
            Ok((_, handle)) => report.run_id = handle.run_id(),
            // The class of the missing record, not of the cell it stopped.
            Err(failed) if failed.class == ResultClass::StoreUnavailable => {
                report.status = ResultClass::StoreUnavailable;
                report.exit_code = airlock_cell::report::STORE_UNAVAILABLE_EXIT;
            }
            Err(_) => {}
        }
        FinishedRun {
            report,
            plan,
            inputs,
            secrets,
            latency: None,
            evidence_dir: None,
            record,
            refill: None,
        }
    }

    /// The pool refill this run holds, for a caller that answers its client after
    /// [`Engine::complete`] and wants the next cell built only then.
    pub fn take_refill(&mut self) -> Option<crate::pool::PoolRefill> {
        self.refill.take()
    }

    /// Why no audit record exists, if none does: then nothing ran (the payload never
    /// got its start), and the run cannot be completed.
    pub fn audit_error(&self) -> Option<&str> {
        self.record.as_ref().err().map(|f| f.error.as_str())
    }
}

/// A run refused before its cell existed.
pub struct Refusal<'a> {
    pub argv: &'a [String],
    pub workload_class: &'a str,
    pub status: ResultClass,
    pub error: String,
    /// The plan, when the contract compiled.
    pub plan: Option<&'a CellPlan>,
    /// The service tenant of the refused request; `None` for the command line.
    pub tenant: Option<&'a str>,
}

/// The record of a refusal: its run id, or why it could not be recorded.
pub struct RecordedRefusal {
    pub report: RunReport,
    pub secrets: Vec<String>,
    /// The refused request's plan, when the engine refused a compiled plan.
    pub plan: Option<CellPlan>,
}

impl Engine {
    /// Records a run refused before any cell existed (a bad contract, a missing
    /// credential, an unresolvable allowlist, ...) so that refusals are audited too. When
    /// the store cannot be opened the refusal's error says so as well.
    pub fn refuse(&self, refusal: Refusal<'_>) -> RecordedRefusal {
        // The plan holds the secret env values; credentials were not resolved.
        let secrets = refusal
            .plan
            .map(|p| record::secrets_of(p, &[]))
            .unwrap_or_default();
        let start = RunStart {
            argv: refusal.argv.to_vec(),
            input_sha256: InputHasher::new(refusal.argv).finish(),
            contract_sha256: refusal
                .plan
                .map(|p| p.contract_sha256.clone())
                .unwrap_or_default(),
            workload_class: refusal.workload_class.to_string(),
            plan_json: serde_json::to_value(refusal.plan).unwrap_or_default(),
            session_id: None,
            tenant: refusal.tenant.map(str::to_string),
        };
        let recorded = self.open_store().and_then(|store| {
            let handle = store
                .begin_run(start, secrets.clone())
                .map_err(EngineError::Store)?;
            let mut report =
                RunReport::refused(&handle.run_id(), refusal.status, refusal.error.clone());
            report.cleanup.ok = true;
            let stored = serde_json::to_value(&report).unwrap_or_default();
            let finished = record::finish(&store, &handle, &report, &stored);
            self.stores.give_back(store);
            finished.map_err(EngineError::Store)?;
            Ok(report)
        });
        let report = recorded.unwrap_or_else(|err| {
            let error = format!("{}; recording the refusal failed: {err}", refusal.error);
            RunReport::refused("", refusal.status, error)
        });
        RecordedRefusal {
            report,
            secrets,
            plan: None,
        }
    }

    /// Runs `request` in a cell cloned by this process, which must be single-threaded
    /// (checked: a threaded caller gets a `runtime_fault` report and nothing runs; see
    /// [`Engine::run`] for threaded callers). The audit record is begun by the cell
    /// runtime's hook once the cell is released, overlapping the write with the cell's
    /// own setup: the cold start of `airlock run`. The plan's tier picks the backend
    /// (backend.rs); a gVisor run clones nothing and may come from any thread.
    pub fn run_here(&self, request: RunRequest) -> Result<FinishedRun, Box<RecordedRefusal>> {
        self.run_here_with(request, None)
    }

    /// [`Engine::run_here`] for an OCI runtime's container: the cell also runs the
    /// further commands asked for at `doors.exec` while its payload runs, and sends the
    /// payload's terminal to `doors.console` (airlock_cell::exec_door).
    pub fn run_container_here(
        &self,
        request: RunRequest,
        doors: airlock_cell::exec_door::ContainerDoors,
    ) -> Result<FinishedRun, Box<RecordedRefusal>> {
        self.run_here_with(request, Some(doors))
    }

    fn run_here_with(
        &self,
        request: RunRequest,
        doors: Option<airlock_cell::exec_door::ContainerDoors>,
    ) -> Result<FinishedRun, Box<RecordedRefusal>> {
        let (request, mut broker) = self.with_broker(request)?;
        let (prepared, request) = self.prepare(request)?;
        let RunRequest {
            mut plan,
            credentials,
            stdin,
            artifacts,
            stdout,
            stderr,
            started,
            on_recorded,
            ..
        } = request;
        let mut on_recorded = on_recorded;
        // The run's CA lives in this process (the proxy's) and dies with the run.
        let tls = crate::egress_session::install_run_ca(&mut plan);
        let mut recorder = Recorder {
            engine: self,
            start: prepared.start,
            secrets: prepared.secrets.clone(),
            record: None,
            unhashed_inputs: Some(inputs::readonly_inputs(&plan)),
            input_contents: None,
        };
        let _revoker = crate::egress_session::TokenRevoker(prepared.injections.clone());
        let mut proxy = self
            .proxy_for(&plan, prepared.injections)
            .map(|p| p.with_tls(&tls));
        let on_suspected_escape = self.on_suspected_escape();
        let evidence_dir = on_suspected_escape.as_ref().map(|e| e.dir.clone());
        let backend = crate::backend::Backend::of(&plan);
        let report = backend.run_one_shot(
            &plan,
            RunOptions {
                before_start: Some(&mut || {
                    let begun = recorder.begin();
                    // The cell is cloned: the broker's thread may start now.
                    if let (Ok(_), Some(broker)) = (&begun, broker.as_mut()) {
                        broker.serve();
                    }
                    if let (Ok(run_id), Some(hook)) = (&begun, on_recorded.take()) {
                        hook(run_id);
                    }
                    begun
                }),
                started,
                egress: proxy.as_mut().map(|p| p as &mut dyn EgressSession),
                artifacts,
                stdout_sink: stdout,
                stderr_sink: stderr,
                stdin,
                credentials: &credentials,
                host_ids: self.config.host_ids,
                on_suspected_escape,
                doors,
            },
        );
        let mut report = report;
        crate::broker_session::finish_broker(broker, &mut report);
        let mut finished = recorder.finished(report, plan);
        finished.evidence_dir = evidence_dir;
        Ok(finished)
    }

    /// The completion sequence's quarantine step for one run: a new directory in the
    /// quarantine area that the cell's writable paths are copied into, before the cell
    /// is destroyed, if its verdict is a suspected escape. `None` when the operator keeps
    /// none (or the area stopped being private since the run's check refused nothing).
    pub(crate) fn on_suspected_escape(&self) -> Option<airlock_cell::evidence::OnSuspectedEscape> {
        self.evidence_area().for_one_cell()
    }

    /// See [`EvidenceArea::check`].
    pub(crate) fn quarantine_area(&self) -> Result<Option<std::path::PathBuf>, String> {
        self.evidence_area().check()
    }

    pub(crate) fn evidence_area(&self) -> EvidenceArea {
        EvidenceArea {
            area: self.config.state_dir.join(crate::QUARANTINE_DIR),
            max_bytes: self.config.quarantine_max_bytes,
        }
    }

    /// The run's broker started for its plan (broker_session.rs), or the run refused
    /// and recorded when it cannot be.
    #[allow(clippy::type_complexity)]
    pub(crate) fn with_broker(
        &self,
        mut request: RunRequest,
    ) -> Result<(RunRequest, Option<airlock_broker::BrokerServer>), Box<RecordedRefusal>> {
        match self.start_broker(&mut request.plan, request.tenant.as_deref()) {
            Ok(broker) => Ok((request, broker)),
            Err(refused) => {
                let mut recorded = self.refuse(Refusal {
                    argv: &request.plan.argv,
                    workload_class: &request.workload_class,
                    status: refused.status,
                    error: refused.error,
                    plan: Some(&request.plan),
                    tenant: request.tenant.as_deref(),
                });
                recorded.plan = Some(request.plan);
                Err(Box::new(recorded))
            }
        }
    }

    /// Completes the record of a finished run (after the caller's delivery, which may
    /// have made it `delivery_failed`). The plan is already in the begin record; the
    /// stored result leaves it out.
    pub fn complete(&self, finished: FinishedRun) -> Result<RunReport, EngineError> {
        let (store, handle) = finished.record.map_err(BeginFailed::into_error)?;
        let mut stored = serde_json::to_value(&finished.report).unwrap_or_default();
        if let Some(inputs) = &finished.inputs {
            stored["inputs"] = serde_json::json!(inputs);
        }
        let finished_record = record::finish(&store, &handle, &finished.report, &stored);
        self.stores.give_back(store);
        match finished_record {
            // Spooled: written when the store is back. Lost to a full spool: counted and
            // logged (record::finish); the run's outcome is still the caller's.
            Ok(_) => Ok(finished.report),
            Err(airlock_store::StoreError::SpoolFull { .. }) => Ok(finished.report),
            Err(err) => Err(EngineError::Store(err)),
        }
    }

    /// Every check of a request that needs no cell: the credentials and the identity of
    /// the read-only inputs. A refusal is recorded and carries the request's plan.
    pub(crate) fn prepare(
        &self,
        mut request: RunRequest,
    ) -> Result<(PreparedRun, RunRequest), Box<RecordedRefusal>> {
        let checked = self
            .grant_credentials(&mut request)
            .and_then(|()| self.check(&request))
            .and_then(|prepared| self.with_secrets(prepared, &request));
        match checked {
            Ok((prepared, placeholders)) => {
                let mut request = request;
                request.credentials.extend(placeholders);
                Ok((prepared, request))
            }
            Err(mut refused) => {
                refused.plan = Some(request.plan);
                Err(refused)
            }
        }
    }

    /// The run's injected secrets (egress_session.rs): the proxy gets them, the records
    /// hide their values and placeholders, the cell gets the placeholders (returned).
    #[allow(clippy::type_complexity)]
    fn with_secrets(
        &self,
        mut prepared: PreparedRun,
        request: &RunRequest,
    ) -> Result<(PreparedRun, Vec<(String, String)>), Box<RecordedRefusal>> {
        let plan = &request.plan;
        let lifetime = std::time::Duration::from_millis(plan.limits.wall_time_ms);
        let ready = crate::egress_session::prepare_secrets(&self.config.egress, plan, lifetime)
            .map_err(|err| {
                Box::new(self.refuse(Refusal {
                    argv: &plan.argv,
                    workload_class: &request.workload_class,
                    status: ResultClass::PolicyDenied,
                    error: err.to_string(),
                    plan: Some(plan),
                    tenant: request.tenant.as_deref(),
                }))
            })?;
        let (placeholders, hidden, injections) = crate::egress_session::split_prepared(ready);
        prepared.secrets.extend(hidden);
        prepared.injections = injections;
        Ok((prepared, placeholders))
    }

    /// The credentials decision, first: a forbidden one refuses the run before anything
    /// else looks at the request; a lifted one is written into the plan (its record).
    fn grant_credentials(&self, request: &mut RunRequest) -> Result<(), Box<RecordedRefusal>> {
        match self.decide_credentials(&request.plan, &request.workload_class) {
            Ok(lifted) => {
                request.plan.credentials_lifted = lifted;
                Ok(())
            }
            Err(forbidden) => Err(Box::new(self.refuse(Refusal {
                argv: &request.plan.argv,
                workload_class: &request.workload_class,
                status: ResultClass::PolicyDenied,
                error: forbidden.to_string(),
                plan: Some(&request.plan),
                tenant: request.tenant.as_deref(),
            }))),
        }
    }

    fn check(&self, request: &RunRequest) -> Result<PreparedRun, Box<RecordedRefusal>> {
        let plan = &request.plan;
        let refuse = |status, error: String| {
            Box::new(self.refuse(Refusal {
                argv: &plan.argv,
                workload_class: &request.workload_class,
                status,
                error,
                plan: Some(plan),
                tenant: request.tenant.as_deref(),
            }))
        };
        // The last door: whatever composed the plan, the cell execs exactly it.
        if let Err(err) = record::check_exec(&plan.argv, plan, &request.credentials, &[]) {
            return Err(refuse(ResultClass::PolicyDenied, err.to_string()));
        }
        if let Some(missing) = plan
            .credentials
            .iter()
            .find(|c| !request.credentials.iter().any(|(env, _)| *env == c.env))
        {
            let err = airlock_cell::CellError::MissingCredential {
                name: missing.name.clone(),
                from_env: missing.from_env.clone(),
            };
            return Err(refuse(err.class(), err.to_string()));
        }
        if let Err(why) = self.quarantine_area() {
            return Err(refuse(ResultClass::SandboxUnavailable, why));
        }
        let mut hasher = InputHasher::new(&plan.argv);
        hasher
            .add_plan_inputs(plan)
            .map_err(|err| refuse(ResultClass::RuntimeFault, format!("reading inputs: {err}")))?;
        Ok(PreparedRun {
            start: RunStart {
                argv: plan.argv.clone(),
                input_sha256: hasher.finish(),
                contract_sha256: plan.contract_sha256.clone(),
                workload_class: request.workload_class.clone(),
                plan_json: serde_json::to_value(plan).unwrap_or_default(),
                session_id: None,
                tenant: request.tenant.clone(),
            },
            secrets: record::secrets_of(plan, &request.credentials),
            injections: Vec::new(),
        })
    }

    /// The egress proxy of an allowlisted plan (started when the cell hands over its
    /// listeners).
    pub(crate) fn proxy_for(
        &self,
        plan: &CellPlan,
        injections: Vec<airlock_egress::secrets::Injection>,
    ) -> Option<ProxySession> {
        match &plan.network {
            NetworkPlan::Allowlist { destinations } => Some(ProxySession::new(
                self.config.egress.clone(),
                destinations,
                &plan.http_rules,
                injections,
            )),
            // A pod's network is governed by its CNI and NetworkPolicy, not a proxy.
            NetworkPlan::Deny | NetworkPlan::Pod { .. } => None,
        }
    }

    /// A connection to the audit store (see stores.rs).
    pub(crate) fn open_store(&self) -> Result<Store, EngineError> {
        self.stores.take()
    }
}

pub(crate) struct PreparedRun {
    pub start: RunStart,
    pub secrets: Vec<String>,
    /// The run's injected secrets, for its proxy.
    pub injections: Vec<airlock_egress::secrets::Injection>,
}

/// The run's audit record, begun by the cell runtime's hook once the cell is released
/// and finished at the end; and the content hash of the read-only inputs, started at the
/// same moment.
struct Recorder<'a> {
    engine: &'a Engine,
    start: RunStart,
    secrets: Vec<String>,
    /// `None` until the hook ran; then the store and handle, or why there are none.
    record: Option<Result<(Store, RunHandle), BeginFailed>>,
    unhashed_inputs: Option<Vec<(PathBuf, PathBuf)>>,
    input_contents: Option<std::thread::JoinHandle<InputContents>>,
}

impl Recorder<'_> {
    fn begin(&mut self) -> Result<String, String> {
        let begun = self.open_and_begin();
        let run_id = begun
            .as_ref()
            .map(|(_, h)| h.run_id())
            .map_err(|failed| failed.error.clone());
        self.record = Some(begun);
        if run_id.is_ok() {
            // The cell is cloned: a thread may start now. It reads the inputs while the
            // payload runs (see inputs.rs).
            let state_dir = self.engine.config.state_dir.clone();
            self.input_contents = self
                .unhashed_inputs
                .take()
                .and_then(|inputs| inputs::hash_in_background(inputs, state_dir));
        }
        run_id
    }

    fn open_and_begin(&self) -> Result<(Store, RunHandle), BeginFailed> {
        self.engine.begin_record(self.start.clone(), &self.secrets)
    }

    /// The run at its end. A run that failed before its cell was released (the hook never
    /// ran) is recorded now, so it is not lost; a hook that failed means nothing ran.
    fn finished(mut self, report: RunReport, plan: CellPlan) -> FinishedRun {
        let record = match self.record.take() {
            Some(record) => record,
            None => self.open_and_begin(),
        };
        let inputs = self.input_contents.take().map(inputs::join);
        FinishedRun::new(report, plan, inputs, self.secrets, record)
    }
}

/// Where the evidence of a suspected escape goes (`<state dir>/quarantine`), and how
/// much of a cell's writable paths is copied (`[policy] quarantine_max_bytes`).
#[derive(Debug, Clone)]
pub(crate) struct EvidenceArea {
    area: PathBuf,
    max_bytes: u64,
}

impl EvidenceArea {
    /// A fresh directory of the area for one cell's copy; `None` when the operator keeps
    /// none or the area is not private.
    pub(crate) fn for_one_cell(&self) -> Option<airlock_cell::evidence::OnSuspectedEscape> {
        let area = self.check().ok().flatten()?;
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        Some(airlock_cell::evidence::OnSuspectedEscape {
            dir: area.join(format!(".cell-{}-{nanos}", std::process::id())),
            max_bytes: self.max_bytes,
        })
    }

    /// The area, created 0700 when missing; `Ok(None)` when the operator keeps no
    /// evidence (`quarantine_max_bytes = 0`). An area that is not a private directory
    /// (a link, a file, a mode open to others) is an error: a suspected escape's
    /// evidence could not be kept there, so every run is refused until the operator
    /// mends it, rather than run without its quarantine.
    pub(crate) fn check(&self) -> Result<Option<PathBuf>, String> {
        use std::os::unix::fs::{DirBuilderExt, MetadataExt};
        if self.max_bytes == 0 {
            return Ok(None);
        }
        let area = &self.area;
        // The state directory itself may not exist yet (the store creates it when the
        // record begins, after this).
        let _ = std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(area);
        // A state directory that is not one (a file, below a file, not creatable) is the
        // store's failure, not the area's: the begin record fails with its own error
        // (`runtime_fault`) before any payload starts, so nothing could need the area.
        if !area.parent().is_some_and(Path::is_dir) {
            return Ok(None);
        }
        let refused = |why: String| {
            Err(format!(
                "the quarantine area {} {why}: a suspected escape's evidence could not be \
                 kept (make it a directory of mode 0700, or set [policy] \
                 quarantine_max_bytes = 0 to keep none)",
                area.display()
            ))
        };
        match std::fs::symlink_metadata(area) {
            Err(err) => refused(format!("cannot be created: {err}")),
            Ok(meta) if !meta.is_dir() => refused("is not a directory".to_string()),
            Ok(meta) if meta.mode() & 0o077 != 0 => refused(format!(
                "is open to others (mode {:o})",
                meta.mode() & 0o7777
            )),
            Ok(_) => Ok(Some(area.clone())),
        }
    }
}
