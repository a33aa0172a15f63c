//! Runs for threaded callers: through the cell factory, from a warm pool when one is
//! kept for the plan's shape. Fail closed: no record, no payload. A warm cell is sent its
//! command held while the begin record is written, and released (one byte on a pipe
//! read by its pid 1) once the record is committed; for a cell built on demand the
//! record is written while the supervisor builds the cell.

use crate::factory::{CellFactory, CellHost, LiveCell};
use crate::host::{HostMode, HostRequest};
use crate::inputs;
use crate::lifecycle::{CommandLatency, FinishedRun, RecordedRefusal, Refusal, RunRequest};
use crate::pool::PlanShape;
use crate::{Engine, EngineError};
use airlock_cell::control::{CommandFds, CommandSpec, EngineControl, ToEngine};
use airlock_cell::report::{ResultClass, RunReport};
use airlock_cell::PayloadStdin;
use airlock_contract::PlanTransfer;
use airlock_store::{RunHandle, Store};
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;
use std::time::Instant;

/// The id of the one command of a one-shot cell.
const ONLY_COMMAND: u64 = 1;

impl Engine {
    /// Runs `request` in a cell cloned by the cell factory: callable from any thread of
    /// any process. A warm cell of the plan's shape is claimed when a pool keeps one
    /// (see [`Engine::keep_warm`]); otherwise a cell is built for the request.
    pub fn run(&self, mut request: RunRequest) -> Result<FinishedRun, Box<RecordedRefusal>> {
        // Computed once: neither the broker (a plan with one is never served warm) nor the
        // checks below change the plan of a run that may claim a cell.
        let shape = PlanShape::of_own(&mut request.plan);
        let pooled = self.pools.keeps(&shape);
        if !crate::backend::Backend::of(&request.plan).clones_in_caller() && !pooled {
            // Nothing to clone: supervised by this thread (backend.rs), counted against
            // the engine's capacity as a cloned cell is. A gVisor plan with a pool of
            // its shape goes through the factory like a native one: a parked sandbox
            // runs it (crates/cell/src/gvisor/session.rs, one-shot mode).
            let _counted = match LiveCell::take(&self.live, self.config.max_cells) {
                Ok(counted) => counted,
                Err(err) => return Err(Box::new(self.over_capacity(&request, &err))),
            };
            return self.run_here(request);
        }
        let (request, mut broker) = self.with_broker(request)?;
        // This process is threaded already (the factory clones the cell): the broker's
        // thread starts now.
        if let Some(broker) = broker.as_mut() {
            broker.serve();
        }
        let (prepared, request) = self.prepare(request)?;
        // Revokes the run's provider tokens when this function returns: the cell is gone.
        let _revoker = crate::egress_session::TokenRevoker(prepared.injections.clone());
        let RunRequest {
            plan,
            credentials,
            stdin,
            stdout,
            stderr,
            artifacts,
            on_recorded,
            caller,
            ..
        } = request;
        // A parked cell has no credentials and no artifact destination of its own: only
        // requests without either are served warm.
        // Nor one with a broker: its socket is mounted for the run.
        let warm = (credentials.is_empty() && artifacts.is_none() && plan.broker.is_none())
            .then(|| self.pools.claim(&shape))
            .flatten();
        let parked = warm.is_some();
        // A parked cell was given its evidence directory when it was built (pool.rs).
        let on_suspected_escape = (!parked).then(|| self.on_suspected_escape()).flatten();
        let host = match warm {
            Some(host) => Ok(host),
            None => self.spawn_host(HostRequest {
                plan: PlanTransfer::of(&plan),
                credentials,
                secrets: prepared.injections.clone(),
                artifacts,
                mode: HostMode::OneShot,
                on_suspected_escape,
            }),
        };
        let evidence_dir = host.as_ref().ok().and_then(|h| h.evidence_dir.clone());
        let secrets = prepared.secrets.clone();
        // A parked cell gets its command before the record, held: the supervisor prepares
        // it and hands it to pid 1 while the record is written, and the engine releases
        // it straight to pid 1 once the record is committed (no record, no release: the
        // payload cannot start before its record exists).
        let stdio = Stdio::of(stdin, stdout, stderr).map(|mut stdio| {
            stdio.caller = caller;
            stdio
        });
        let (stdio, held) = match (stdio, &host) {
            (Ok(stdio), Ok(host)) if parked && host.control.can_hold() => {
                let sent = send_command(host, "", &plan.argv, stdio, true);
                (None, Some(sent))
            }
            (stdio, _) => (Some(stdio), None),
        };
        let record = self.begin_record(prepared.start, &secrets);
        if let (Ok((_, handle)), Some(hook)) = (&record, on_recorded) {
            hook(&handle.run_id());
        }
        let mut latency = None;
        let (report, inputs) = match (host, &record) {
            (Err(err), _) => (RunReport::refused("", err.class(), err.to_string()), None),
            (Ok(host), Err(err)) => {
                // No record: the cell is destroyed before its command could start (a held
                // command's release pipe closes with the host: pid 1 reads EOF and ends).
                drop(host);
                (RunReport::refused("", err.class, err.error.clone()), None)
            }
            (Ok(host), Ok((_, handle))) => {
                let hashing = inputs::hash_in_background(
                    inputs::readonly_inputs(&plan),
                    self.config.state_dir.clone(),
                );
                let run_id = handle.run_id();
                let driven = match (held, stdio) {
                    (Some(sent), _) => sent.and_then(|()| {
                        // A failed release means pid 1 is gone: its report says why.
                        let released = Instant::now();
                        let _ = host.control.release();
                        read_reports(&host, &run_id, released)
                    }),
                    (None, Some(Err(err))) => Err(Box::new(RunReport::refused(
                        &run_id,
                        err.class(),
                        err.to_string(),
                    ))),
                    (None, Some(Ok(stdio))) => {
                        // Built for this run: the record was written while it was built.
                        let ready = match parked {
                            true => Ok(()),
                            false => wait_parked(&host.control).map(drop),
                        };
                        ready.and_then(|()| {
                            let sent = Instant::now();
                            send_command(&host, &run_id, &plan.argv, stdio, false)?;
                            read_reports(&host, &run_id, sent)
                        })
                    }
                    (None, None) => Err(Box::new(supervisor_gone(&run_id))),
                };
                let report = match driven {
                    Ok((report, milestones)) => {
                        latency = Some(milestones);
                        report
                    }
                    Err(report) => *report,
                };
                let inputs = hashing.map(inputs::join);
                (report, inputs)
            }
        };
        let mut report = report;
        crate::broker_session::finish_broker(broker, &mut report);
        let mut finished = FinishedRun::new(report, plan, inputs, secrets, record);
        // A claimed cell's replacement is built once the run is answered (PoolRefill).
        finished.refill = parked.then(|| self.pools.refill_on_drop());
        finished.latency = latency;
        finished.evidence_dir = evidence_dir;
        Ok(finished)
    }

    /// The recorded refusal of a run the engine has no capacity for.
    fn over_capacity(&self, request: &RunRequest, err: &EngineError) -> RecordedRefusal {
        self.refuse(Refusal {
            argv: &request.plan.argv,
            workload_class: &request.workload_class,
            status: err.class(),
            error: err.to_string(),
            plan: Some(&request.plan),
            tenant: request.tenant.as_deref(),
        })
    }

    /// Asks the factory (started on first use) for a supervisor process, counted against
    /// the engine's capacity while it lives.
    pub(crate) fn spawn_host(&self, request: HostRequest) -> Result<CellHost, EngineError> {
        self.factory()?.spawn(request)
    }

    pub(crate) fn factory(&self) -> Result<Arc<CellFactory>, EngineError> {
        let started = self.factory.get_or_init(|| {
            CellFactory::start(&self.config.program, &self.config, Arc::clone(&self.live))
                .map(Arc::new)
                .map_err(|e| e.to_string())
        });
        started
            .as_ref()
            .map(Arc::clone)
            .map_err(|err| EngineError::FactoryProtocol(err.clone()))
    }

    /// Begins the audit record of a run on the engine's shared store.
    pub(crate) fn begin_record(
        &self,
        start: airlock_store::RunStart,
        secrets: &[String],
    ) -> Result<(Store, RunHandle), crate::lifecycle::BeginFailed> {
        let failed = |err: EngineError| crate::lifecycle::BeginFailed::of(&err);
        let store = self.open_store().map_err(failed)?;
        match store.begin_run(start, secrets.to_vec()) {
            Ok(handle) => Ok((store, handle)),
            Err(err) => {
                self.stores.give_back(store);
                Err(failed(EngineError::Store(err)))
            }
        }
    }
}

/// A command's descriptors as the control protocol sends them.
pub(crate) struct Stdio {
    pub stdin: Option<OwnedFd>,
    pub stdout: OwnedFd,
    pub stderr: OwnedFd,
    /// See [`crate::RunRequest::caller`].
    pub caller: Option<OwnedFd>,
}

impl Stdio {
    /// Output nobody asked for goes to the null device (it is still captured, bounded,
    /// in the report).
    pub fn of(
        stdin: PayloadStdin,
        stdout: Option<OwnedFd>,
        stderr: Option<OwnedFd>,
    ) -> Result<Stdio, EngineError> {
        let null = || -> Result<OwnedFd, EngineError> {
            std::fs::OpenOptions::new()
                .write(true)
                .open("/dev/null")
                .map(OwnedFd::from)
                .map_err(|source| EngineError::Factory {
                    context: "/dev/null".into(),
                    source,
                })
        };
        Ok(Stdio {
            stdin: match stdin {
                PayloadStdin::Null => None,
                PayloadStdin::Relayed(fd) => Some(fd),
            },
            stdout: stdout.map_or_else(null, Ok)?,
            stderr: stderr.map_or_else(null, Ok)?,
            caller: None,
        })
    }

    pub fn send(
        &self,
        control: &EngineControl,
        id: u64,
        run_id: &str,
        command: CommandSpec,
        held: bool,
    ) -> Result<(), airlock_cell::CellError> {
        let fds = CommandFds {
            stdin: self.stdin.as_ref().map(|f| f.as_fd()),
            stdout: self.stdout.as_fd(),
            stderr: self.stderr.as_fd(),
            caller: self.caller.as_ref().map(|f| f.as_fd()),
        };
        match held {
            true => control.run_held(id, command, fds),
            false => control.run(id, run_id, command, fds),
        }
    }
}

/// Gives a parked cell its one command (`held`: to be released, see
/// [`EngineControl::release`]). The engine's copies of the descriptors close here.
fn send_command(
    host: &CellHost,
    run_id: &str,
    argv: &[String],
    stdio: Stdio,
    held: bool,
) -> Result<(), Box<RunReport>> {
    let command = CommandSpec {
        argv: argv.to_vec(),
        env: Vec::new(),
        wall_time_ms: None,
        output_bytes: None,
        stdin: stdio.stdin.is_some(),
        watch_caller: stdio.caller.is_some(),
    };
    stdio
        .send(&host.control, ONLY_COMMAND, run_id, command, held)
        .map_err(|err| Box::new(RunReport::refused(run_id, err.class(), err.to_string())))
}

/// Reads a one-shot cell's reports: the command's, then the final one (with the cleanup
/// of the destroyed cell), and when each arrived (`command_sent`: when the command was
/// sent, or released).
fn read_reports(
    host: &CellHost,
    run_id: &str,
    command_sent: Instant,
) -> Result<(RunReport, CommandLatency), Box<RunReport>> {
    let control = &host.control;
    let mut exec_confirmed = None;
    let mut exit_known = None;
    loop {
        match control.recv() {
            Ok(Some(ToEngine::CommandStarted { .. })) => exec_confirmed = Some(Instant::now()),
            Ok(Some(ToEngine::CommandExited { .. })) => exit_known = Some(Instant::now()),
            Ok(Some(ToEngine::CommandEnded { .. })) => {
                exit_known.get_or_insert_with(Instant::now);
            }
            Ok(Some(ToEngine::Closed { report })) => {
                let closed = Instant::now();
                let exit_known = exit_known.unwrap_or(closed);
                let latency = CommandLatency {
                    command_sent,
                    exec_confirmed: exec_confirmed.unwrap_or(exit_known),
                    exit_known,
                    closed,
                };
                return Ok((*report, latency));
            }
            Ok(Some(ToEngine::Failed { report })) => return Err(report),
            Ok(Some(ToEngine::Parked { .. })) | Ok(Some(ToEngine::DestinationsSet { .. })) => {}
            Ok(None) | Err(_) => return Err(Box::new(supervisor_gone(run_id))),
        }
    }
}

/// Blocks until the cell is parked and returns its pid 1; a cell that could not be built
/// is its report.
pub(crate) fn wait_parked(control: &EngineControl) -> Result<i32, Box<RunReport>> {
    loop {
        match control.recv() {
            Ok(Some(ToEngine::Parked { pid, .. })) => return Ok(pid),
            Ok(Some(ToEngine::Failed { report })) | Ok(Some(ToEngine::Closed { report })) => {
                return Err(report)
            }
            Ok(Some(_)) => {}
            Ok(None) | Err(_) => return Err(Box::new(supervisor_gone(""))),
        }
    }
}

pub(crate) fn supervisor_gone(run_id: &str) -> RunReport {
    RunReport::refused(
        run_id,
        ResultClass::RuntimeFault,
        "the cell's supervisor process ended without a report".to_string(),
    )
}
