//! One-shot runs: `POST /v1/runs` (NDJSON frames as they happen, or the record with
//! `?wait=true`), `GET /v1/runs/{id}`, `GET /v1/runs`, and `GET /v1/audit/verify`.

use crate::api::{RunBody, RunList, RunView, RunsQuery, Verified, WaitQuery};
use crate::error::{ApiError, ErrorBody};
use crate::output::{self, Ended, Frame, OutputLog, Stream};
use crate::plans::{self, PlanRefusal, Wanted};
use crate::quota::Work;
use crate::state::{ApiJson, Caller, Shared};
use crate::state::{Path, Query};
use crate::stdin_stream;
use crate::tenants::Tenant;
use airlock_cell::report::{ResultClass, RunReport};
use airlock_cell::PayloadStdin;
use airlock_engine::{record, Engine, Refusal, RunRequest};
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::time::Instant;

pub const NDJSON: &str = "application/x-ndjson";

#[utoipa::path(post, path = "/v1/runs", request_body = RunBody, params(WaitQuery),
    responses(
        (status = 200, description = "NDJSON frames (start, stdout, stderr, exit, result) as they happen; with wait=true the run's record", content_type = "application/x-ndjson"),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 202, description = "A `class` request that needs approval: stored pending; the same request with `approval` runs once it is approved", body = crate::approvals::PendingApproval),
        (status = 403, description = "Not allowed, or a `class` request denied by the policy (its `policy.*` reason code)", body = ErrorBody),
        (status = 413, body = ErrorBody),
        (status = 422, description = "The contract did not compile (the refusal is recorded)", body = ErrorBody),
        (status = 429, description = "Over a quota or capacity; see Retry-After", body = ErrorBody),
        (status = 503, description = "Draining", body = ErrorBody)))]
pub async fn create_run(
    State(state): State<Shared>,
    Caller(tenant): Caller,
    Query(query): Query<WaitQuery>,
    ApiJson(body): ApiJson<RunBody>,
) -> Result<Response, ApiError> {
    let stdin = StdinSource::Inline(body.stdin.clone());
    start_run(state, tenant, query, body, stdin).await
}

#[utoipa::path(post, path = "/v1/runs/stream", params(WaitQuery),
    request_body(content = String, content_type = "application/octet-stream",
        description = "One line of JSON (a RunBody without `stdin`), a newline, then the payload's stdin until the body ends"),
    responses(
        (status = 200, description = "As `POST /v1/runs`: NDJSON frames, or the record with wait=true", content_type = "application/x-ndjson"),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 202, description = "A `class` request that needs approval (its stdin is not read)", body = crate::approvals::PendingApproval),
        (status = 403, body = ErrorBody),
        (status = 408, description = "The JSON line did not arrive within body_timeout_ms", body = ErrorBody),
        (status = 413, description = "The JSON line is longer than max_body_bytes", body = ErrorBody),
        (status = 422, body = ErrorBody), (status = 429, body = ErrorBody), (status = 503, body = ErrorBody)))]
pub async fn create_streamed_run(
    State(state): State<Shared>,
    Caller(tenant): Caller,
    Query(query): Query<WaitQuery>,
    body: axum::body::Body,
) -> Result<Response, ApiError> {
    let within = std::time::Duration::from_millis(state.config.body_timeout_ms);
    let head = stdin_stream::read_head(body, state.config.max_body_bytes, within).await?;
    let stdin = StdinSource::Streamed {
        first: head.first,
        rest: head.rest,
    };
    start_run(state, tenant, query, head.body, stdin).await
}

/// Where a run's stdin comes from.
enum StdinSource {
    /// The request's `stdin` text, whole (none: `/dev/null`).
    Inline(Option<String>),
    /// The request body after its JSON line (stdin_stream.rs).
    Streamed {
        first: axum::body::Bytes,
        rest: axum::body::BodyDataStream,
    },
}

impl StdinSource {
    /// The payload's stdin, and for a streamed one the sender whose drop (the run's
    /// end) stops its relay.
    fn into_payload(
        self,
    ) -> Result<(PayloadStdin, Option<tokio::sync::oneshot::Sender<()>>), ApiError> {
        match self {
            StdinSource::Inline(text) => Ok((stdin_of(text)?, None)),
            StdinSource::Streamed { first, rest } => {
                let (read, write) =
                    output::pipe().map_err(|e| ApiError::internal("server.pipe", e.to_string()))?;
                let (ended, run_ended) = tokio::sync::oneshot::channel();
                stdin_stream::spawn_relay(write, first, rest, run_ended);
                Ok((PayloadStdin::Relayed(read), Some(ended)))
            }
        }
    }
}

/// A one-shot run: admitted, planned, started, and answered as frames or its record.
async fn start_run(
    state: Shared,
    tenant: Tenant,
    query: WaitQuery,
    body: RunBody,
    stdin: StdinSource,
) -> Result<Response, ApiError> {
    let permit = state.admit(&tenant, Work::Run)?;
    let (planned, after_run) = match plan_request(&state, &tenant, body.clone()).await? {
        Ok(planned) => planned,
        Err(answer) => return Ok(answer),
    };
    let plans::Planned {
        plan,
        class,
        lease: image_lease,
    } = planned;
    let log = OutputLog::new(state.config.max_stream_bytes)
        .map_err(|e| ApiError::internal("output.spill", e.to_string()))?;
    let (stdout, stderr) = output_pipes(&log)?;
    let (stdin, stdin_relay) = stdin.into_payload()?;
    let (begun, begun_rx) = tokio::sync::oneshot::channel::<String>();
    let (hangup, watched) = Hangup::pair()?;
    let request = RunRequest {
        plan,
        workload_class: class.clone(),
        credentials: Vec::new(),
        stdin,
        artifacts: None,
        stdout: Some(stdout),
        stderr: Some(stderr),
        started: Instant::now(),
        tenant: Some(tenant.name.clone()),
        on_recorded: Some(Box::new(move |run_id| {
            let _ = begun.send(run_id.to_string());
        })),
        caller: Some(watched),
    };
    let guard = state.work.enter();
    let task_state = Arc::clone(&state);
    let task_log = Arc::clone(&log);
    let tenant_name = tenant.name.clone();
    let requester = crate::approvals::identity_of(&tenant);
    tokio::task::spawn_blocking(move || {
        // The image stays leased until the cell is gone and its record complete.
        // A streamed stdin's relay ends with the run (the sender's drop).
        let _held = (permit, guard, image_lease, stdin_relay);
        let (report, secrets, latency, evidence) = run_to_end(&task_state.engine, request);
        match (after_run, &task_state.policy) {
            (Some(after_run), _) => after_run(&report, evidence.as_deref()),
            (None, Some(policy)) => {
                policy.after_contract_run(&report, &class, &requester, evidence.as_deref())
            }
            // No policy layer to keep it: no copy is left behind unclaimed.
            (None, None) => discard_evidence(evidence.as_deref()),
        }
        task_state
            .metrics
            .observe(&class, &tenant_name, &report, latency.unzip());
        task_log.finish(ended_of(&report, &secrets));
    });
    let run_id = begun_rx.await.ok();
    if let Some(run_id) = &run_id {
        log.set_run_id(run_id);
    }
    if query.wait {
        // This future is dropped when the client goes away, and `hangup` with it.
        let ended = wait_ended(&log).await;
        drop(hangup);
        return Ok(Json(ended.record).into_response());
    }
    let start = run_id.map(|run_id| Frame::Start {
        run_id,
        command_id: None,
    });
    Ok(ndjson(output::ndjson_body(log, start, true, hangup)))
}

/// The service's end of a socket pair whose other end the run's supervisor watches
/// (`RunRequest::caller`): held by the request's future and then by its response body,
/// both of which the server drops when the client disconnects. Its close is the
/// hang-up on which the supervisor destroys the cell (`runtime_fault`, "the caller went
/// away", as for a hand-off client that goes away); the run's record is still completed
/// by its blocking task. A run that ended first is not affected.
struct Hangup {
    _held: std::os::unix::net::UnixStream,
}

impl Hangup {
    fn pair() -> Result<(Hangup, OwnedFd), ApiError> {
        let (held, watched) = std::os::unix::net::UnixStream::pair()
            .map_err(|e| ApiError::internal("server.socketpair", e.to_string()))?;
        Ok((Hangup { _held: held }, OwnedFd::from(watched)))
    }
}

/// What runs after a class run's record is complete (the policy layer's).
type AfterRun = Option<crate::approvals::AfterRun>;

fn discard_evidence(dir: Option<&std::path::Path>) {
    if let Some(dir) = dir.filter(|d| d.exists()) {
        let _ = std::fs::remove_dir_all(dir);
    }
}

/// The plan of a run request: from its named or inline contract, or from its workload
/// class through the policy layer (whose answer, 202 pending or a denial, ends the
/// request as the inner `Err`).
async fn plan_request(
    state: &Shared,
    tenant: &Tenant,
    body: RunBody,
) -> Result<Result<(plans::Planned, AfterRun), Response>, ApiError> {
    let wanted = Wanted {
        contract: body.contract.as_deref(),
        inline: body.contract_inline.as_ref(),
        argv: &body.argv,
        env: &body.env,
        deadline_ms: body.deadline_ms,
    };
    let Some(class) = body.class.as_deref() else {
        return match state.contracts.plan(&wanted, state.inline_allowed(tenant)) {
            Ok(planned) => Ok(Ok((planned, None))),
            Err(refusal) => Err(record_refusal(state, tenant, &body.argv, refusal).await),
        };
    };
    if body.contract.is_some() || body.contract_inline.is_some() || !body.env.is_empty() {
        return Err(ApiError::bad_request(
            "class.exclusive",
            "a class run gets its contract and environment from the class: no `contract`, \
             `contract_inline` or `env`"
                .into(),
        ));
    }
    if state.verifications.blocks(class) {
        return Err(crate::verification::refusal(class));
    }
    let asked = body.request.clone().unwrap_or_default();
    let grant = match crate::approvals::plan_class_run(
        state,
        tenant,
        class,
        &body.argv,
        asked,
        body.approval.clone(),
    )
    .await
    {
        Ok(grant) => grant,
        Err(answer) => return Ok(Err(answer)),
    };
    let planned = state
        .contracts
        .plan_granted(&grant.contract, &grant.base_dir, class, &wanted);
    match planned {
        Ok(planned) => Ok(Ok((planned, Some(grant.after_run)))),
        Err(refusal) => Err(record_refusal(state, tenant, &body.argv, refusal).await),
    }
}

pub fn ndjson(body: axum::body::Body) -> Response {
    ([(axum::http::header::CONTENT_TYPE, NDJSON)], body).into_response()
}

/// Waits for the end of the command `log` belongs to.
pub async fn wait_ended(log: &OutputLog) -> Ended {
    loop {
        if let Some(ended) = log.ended() {
            return ended;
        }
        log.changed_since(usize::MAX - 1).await;
    }
}

/// The two output pipes of a command: their read ends feed `log`, their write ends are
/// the command's stdout and stderr.
pub fn output_pipes(log: &Arc<OutputLog>) -> Result<(OwnedFd, OwnedFd), ApiError> {
    let pipe = || output::pipe().map_err(|e| ApiError::internal("server.pipe", e.to_string()));
    let (out_read, out_write) = pipe()?;
    let (err_read, err_write) = pipe()?;
    output::spawn_reader(Arc::clone(log), Stream::Stdout, out_read);
    output::spawn_reader(Arc::clone(log), Stream::Stderr, err_read);
    Ok((out_write, err_write))
}

/// The payload's stdin: `/dev/null`, or a pipe the request's text is written into.
pub fn stdin_of(text: Option<String>) -> Result<PayloadStdin, ApiError> {
    let Some(text) = text else {
        return Ok(PayloadStdin::Null);
    };
    let (read, write) =
        output::pipe().map_err(|e| ApiError::internal("server.pipe", e.to_string()))?;
    output::spawn_stdin_writer(write, text.into_bytes());
    Ok(PayloadStdin::Relayed(read))
}

/// (request to payload start, payload start to exit), seconds.
type Latency = Option<(f64, f64)>;

/// Runs `request` through the engine and completes its record; its report, secrets,
/// latency and the copy of its writable paths (a suspected escape's).
fn run_to_end(
    engine: &Engine,
    request: RunRequest,
) -> (RunReport, Vec<String>, Latency, Option<std::path::PathBuf>) {
    let started = request.started;
    match engine.run(request) {
        Ok(finished) => {
            let evidence = finished.evidence_dir.clone();
            let (report, secrets, latency) = complete(engine, finished, started);
            (report, secrets, latency, evidence)
        }
        Err(refused) => (refused.report, refused.secrets, None, None),
    }
}

/// Completes the record of a finished run.
fn complete(
    engine: &Engine,
    finished: airlock_engine::FinishedRun,
    started: Instant,
) -> (RunReport, Vec<String>, Latency) {
    let secrets = finished.secrets.clone();
    let latency = finished.latency.map(|l| {
        let start = l.exec_confirmed.saturating_duration_since(started);
        let wall = l.exit_known.saturating_duration_since(l.exec_confirmed);
        (start.as_secs_f64(), wall.as_secs_f64())
    });
    if finished.audit_error().is_some() {
        return (finished.report, secrets, None);
    }
    let mut report = finished.report.clone();
    match engine.complete(finished) {
        Ok(report) => (report, secrets, latency),
        Err(err) => {
            report.status = ResultClass::RuntimeFault;
            report.error = Some(format!("the run's record could not be completed: {err}"));
            (report, secrets, latency)
        }
    }
}

/// The last two frames of a command, redacted like the store's records.
pub fn ended_of(report: &RunReport, secrets: &[String]) -> Ended {
    let record = record::redact_result(serde_json::to_value(report).unwrap_or_default(), secrets);
    Ended {
        exit: Frame::Exit {
            status: report.status.as_str().to_string(),
            exit_code: report.exit.code,
            signal: report.exit.signal,
            limit_fired: report.limit_fired.map(|l| l.as_str().to_string()),
            dropped_bytes: 0,
        },
        record,
    }
}

/// Records a request refused before any cell (the contract did not compile, names
/// nothing known, ...) and answers with the run id of the refusal.
pub async fn record_refusal(
    state: &Shared,
    tenant: &Tenant,
    argv: &[String],
    refusal: PlanRefusal,
) -> ApiError {
    let PlanRefusal {
        mut error,
        class,
        workload_class,
    } = refusal;
    state
        .metrics
        .deny(&workload_class, &tenant.name, &error.body.reason);
    let engine = Arc::clone(&state.engine);
    let (argv, tenant_name, message) =
        (argv.to_vec(), tenant.name.clone(), error.body.error.clone());
    let recorded = tokio::task::spawn_blocking(move || {
        engine
            .refuse(Refusal {
                argv: &argv,
                workload_class: &workload_class,
                status: class,
                error: message,
                plan: None,
                tenant: Some(&tenant_name),
            })
            .report
            .run_id
    })
    .await;
    if let Ok(run_id) = recorded.map(|id| (!id.is_empty()).then_some(id)) {
        error.body.run_id = run_id;
    }
    *error
}

#[utoipa::path(get, path = "/v1/runs/{id}", params(("id" = String, Path, description = "Run id")),
    responses((status = 200, body = RunView), (status = 401, body = ErrorBody),
        (status = 404, description = "No such run, or another tenant's", body = ErrorBody)))]
pub async fn get_run(
    State(state): State<Shared>,
    Caller(tenant): Caller,
    Path(id): Path<String>,
) -> Result<Json<RunView>, ApiError> {
    let detail = state.with_store(move |store| store.show_run(&id)).await?;
    match detail {
        Some(detail) if tenant.may_see(detail.run.tenant.as_deref()) => Ok(Json(RunView {
            run: detail.run,
            events: detail.events,
        })),
        _ => Err(ApiError::not_found("run")),
    }
}

/// The most runs one list answers (docs/openapi.json `limit`'s maximum).
const MAX_LIST: usize = 1000;

#[utoipa::path(get, path = "/v1/runs", params(RunsQuery),
    responses((status = 200, body = RunList), (status = 401, body = ErrorBody)))]
pub async fn list_runs(
    State(state): State<Shared>,
    Caller(tenant): Caller,
    Query(query): Query<RunsQuery>,
) -> Result<Json<RunList>, ApiError> {
    if query.limit.is_some_and(|limit| limit > MAX_LIST) {
        let error = format!("limit: at most {MAX_LIST}");
        return Err(ApiError::bad_request("query.invalid", error));
    }
    let filter = airlock_store::RunFilter {
        status: query.status,
        workload_class: query.class,
        since: query.since,
        limit: Some(query.limit.unwrap_or(100)),
        tenant: (!tenant.operator).then(|| tenant.name.clone()),
        ..Default::default()
    };
    let runs = state
        .with_store(move |store| store.list_runs(&filter))
        .await?;
    Ok(Json(RunList { runs }))
}

#[utoipa::path(get, path = "/v1/audit/verify",
    responses((status = 200, description = "The whole chain is intact; the counts are the caller's own runs and their entries (the fleet's for the operator)", body = Verified), (status = 401, body = ErrorBody),
        (status = 409, description = "The audit chain is broken", body = ErrorBody)))]
pub async fn verify(
    State(state): State<Shared>,
    Caller(tenant): Caller,
) -> Result<Json<Verified>, ApiError> {
    let state = Arc::clone(&state);
    let verified = tokio::task::spawn_blocking(move || {
        let store = state.store.lock().unwrap_or_else(|p| p.into_inner());
        store
            .verify()
            .map(|report| verified_for(&store, &tenant, report))
    })
    .await
    .map_err(|e| ApiError::internal("server.task", e.to_string()))?;
    match verified {
        Ok(verified) => verified
            .map(Json)
            .map_err(|err| ApiError::internal("store", err.to_string())),
        Err(err) => Err(ApiError::new(
            axum::http::StatusCode::CONFLICT,
            ResultClass::RuntimeFault,
            "audit.chain_broken",
            err.to_string(),
        )),
    }
}

/// What an intact chain's check tells `tenant`: the fleet's counts only to the operator,
/// a tenant its own runs' (another tenant's activity is not its business).
fn verified_for(
    store: &airlock_store::Store,
    tenant: &Tenant,
    report: airlock_store::VerifyReport,
) -> airlock_store::Result<Verified> {
    if tenant.operator {
        return Ok(Verified {
            ok: true,
            scope: "fleet".into(),
            entries: report.entries,
            runs: report.runs,
        });
    }
    let own = store.tenant_counts(&tenant.name)?;
    Ok(Verified {
        ok: true,
        scope: "tenant".into(),
        entries: own.entries,
        runs: own.runs,
    })
}
