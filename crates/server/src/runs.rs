//! One-shot runs: `POST /v1/runs` (NDJSON frames as they happen, or the record with
//! `?wait=true`), `GET /v1/runs/{id}`, `GET /v1/runs`, and `GET /v1/audit/verify`.

use crate::api::{RunBody, RunList, RunView, RunsQuery, Verified, WaitQuery};
use crate::error::{ApiError, ErrorBody};
use crate::output::{self, Ended, Frame, OutputLog, Stream};
use crate::page::{self, Page};
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
        (status = 422, description = "The contract did not compile (the refusal is recorded), or the command breaks a command rule (`request.*`: not recorded)", body = ErrorBody),
        (status = 429, description = "Over a quota or capacity; see Retry-After", body = ErrorBody),
        (status = 503, description = "Draining (`server.draining`), or the audit store cannot be reached (`store.unavailable`: nothing ran); see Retry-After", body = ErrorBody)))]
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
    plans::check_wanted(&body.argv, &body.env)?;
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
    } else if let Some(refused) = unrecorded_refusal(&log).await {
        // No begin record: nothing ran. An unavailable store is its own answer (503),
        // not a run that ended in a fault.
        drop(hangup);
        return Err(refused);
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

/// The answer for a run that ended without a begin record because the store is
/// unavailable: `store.unavailable` (503). `None` for any other end (answered as usual).
async fn unrecorded_refusal(log: &OutputLog) -> Option<ApiError> {
    let ended = wait_ended(log).await;
    let status = ended.record["status"].as_str()?;
    (status == ResultClass::StoreUnavailable.as_str()).then(|| {
        let error = ended.record["error"].as_str().unwrap_or_default();
        ApiError::store_unavailable(format!("the run was not started: {error}"))
    })
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
    let detail = state
        .with_store(&tenant, move |store| store.show_run(&id))
        .await?;
    match detail {
        Some(detail) if tenant.may_see(detail.run.tenant.as_deref()) => Ok(Json(RunView {
            run: detail.run,
            events: detail.events,
        })),
        _ => Err(ApiError::not_found("run")),
    }
}

#[utoipa::path(get, path = "/v1/runs", params(RunsQuery),
    responses((status = 200, body = RunList),
        (status = 400, description = "`cursor.invalid`, `limit.zero`, `query.invalid` (a limit over 1000)", body = ErrorBody),
        (status = 401, body = ErrorBody)))]
pub async fn list_runs(
    State(state): State<Shared>,
    Caller(tenant): Caller,
    Query(query): Query<RunsQuery>,
) -> Result<Response, ApiError> {
    let limit = page::limit(query.limit)?;
    let before = query.cursor.as_deref().map(run_position).transpose()?;
    let filter = airlock_store::RunFilter {
        status: query.status,
        workload_class: query.class,
        since: query.since,
        tenant: (!tenant.operator).then(|| tenant.name.clone()),
        ..Default::default()
    };
    let (page, next) = state
        .with_store(&tenant, move |store| {
            runs_page(store, &filter, before, limit)
        })
        .await??;
    Ok(page.finish(next))
}

/// A page of runs and its next cursor, read a few records at a time and written into the
/// page as they come, on the store's thread under its lock: only the page's bytes leave,
/// so concurrent lists hold a page each, never their records.
fn runs_page(
    store: &airlock_store::Store,
    filter: &airlock_store::RunFilter,
    mut before: Option<(i64, String)>,
    limit: usize,
) -> airlock_store::Result<Result<(Page, Option<String>), ApiError>> {
    let mut page = Page::new("runs", limit, &[]);
    loop {
        // One more than fits, to know whether the list goes on.
        let want = RUNS_PER_FETCH.min(page.room_for_more(RUNS_FIRST_FETCH) + 1);
        let chunk = store.list_runs(&airlock_store::RunFilter {
            before: before.clone(),
            limit: Some(want),
            ..filter.clone()
        })?;
        let fetched = chunk.len();
        for run in chunk {
            match page.push(&run) {
                Err(err) => return Ok(Err(err)),
                Ok(true) => before = Some((run.started_at, run.run_id)),
                Ok(false) => {
                    let next =
                        before.map(|(at, id)| page::encode_cursor("runs", &format!("{at}:{id}")));
                    return Ok(Ok((page, next)));
                }
            }
        }
        if fetched < want {
            return Ok(Ok((page, None)));
        }
    }
}

/// Records read from the store at once for a list: at most, and for its first page.
const RUNS_PER_FETCH: usize = 16;
const RUNS_FIRST_FETCH: usize = 4;

/// The (started_at, run id) a runs cursor names.
fn run_position(cursor: &str) -> Result<(i64, String), ApiError> {
    let position = page::decode_cursor("runs", cursor)?;
    position
        .split_once(':')
        .and_then(|(at, id)| Some((at.parse().ok()?, id.to_string())))
        .filter(|(_, id)| !id.is_empty())
        .ok_or_else(|| {
            ApiError::bad_request(
                "cursor.invalid",
                "cursor is not a next_cursor of this list (runs)".into(),
            )
        })
}

#[utoipa::path(get, path = "/v1/audit/verify",
    responses((status = 200, description = "The whole chain is intact; the counts are the caller's own runs and their entries (the fleet's for the operator)", body = Verified), (status = 401, body = ErrorBody),
        (status = 409, description = "The audit chain is broken", body = ErrorBody),
        (status = 429, description = "The tenant's share of the blocking pool is in use (`quota.blocking`)", body = ErrorBody),
        (status = 503, description = "The store cannot be reached (`store.unavailable`, Retry-After): nothing was checked", body = ErrorBody)))]
pub async fn verify(
    State(state): State<Shared>,
    Caller(tenant): Caller,
) -> Result<Json<Verified>, ApiError> {
    let verified = state
        .with_store(&tenant.clone(), move |store| {
            Ok(store
                .verify()
                .map(|report| verified_for(store, &tenant, report)))
        })
        .await?;
    match verified {
        Ok(verified) => verified.map(Json).map_err(|err| ApiError::store(&err)),
        Err(err) => Err(verify_failure(&err)),
    }
}

/// What a failed verification answers: a broken chain is 409 `audit.chain_broken`; a store
/// that cannot be reached says nothing about the chain (503 `store.unavailable`); anything
/// else is a fault of the check (500), never reported as tampering.
fn verify_failure(err: &airlock_store::StoreError) -> ApiError {
    match err.class() {
        airlock_store::ErrorClass::Tampered => ApiError::new(
            axum::http::StatusCode::CONFLICT,
            ResultClass::RuntimeFault,
            "audit.chain_broken",
            err.to_string(),
        ),
        _ => ApiError::store(err),
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
