//! Sessions: one cell serving several commands of one job. `POST /v1/sessions`, its
//! commands (streamed or in the background), their output and signals, its files, its
//! idle timeout, and `DELETE` (the completion sequence, the record).
//!
//! The engine's supervisor enforces the session's maximum lifetime and the service's
//! ceiling of idle time; the tenant's own idle timeout (which `POST .../timeout` extends)
//! is enforced here, by [`reap`].

use crate::api::PageQuery;
use crate::api::{
    CommandView, DirList, DirQuery, ExecBody, FollowQuery, NetworkBody, NetworkView, SessionBody,
    SessionList, SessionView, SignalBody, TimeoutBody, WaitQuery, Written,
};
use crate::approvals::{self, ClassPolicy, ClassSession, NetworkRequest, PolicyRefusal};
use crate::error::{ApiError, ErrorBody};
use crate::files;
use crate::output::{self, Frame, OutputLog};
use crate::page::{self, Page};
use crate::plans::Wanted;
use crate::quota::{Permit, Work};
use crate::runs::{ended_of, ndjson, output_pipes, record_refusal, stdin_of};
use crate::state::{ApiBytes, ApiJson, Caller, LateJson, Path, Query, Shared};
use crate::tenants::Tenant;
use airlock_cell::control::CommandSignal;
use airlock_cell::report::ResultClass;
use airlock_contract::{check_command, CommandInput};
use airlock_engine::{record, CommandRequest, Session, SessionRequest};
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use std::collections::BTreeMap;
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub struct CommandEntry {
    pub run_id: String,
    pub argv: Vec<String>,
    pub log: Arc<OutputLog>,
}

pub struct SessionEntry {
    pub session: Arc<Session>,
    pub tenant: String,
    pub workload_class: String,
    proc_dir: OwnedFd,
    writable: Vec<PathBuf>,
    secrets: Vec<String>,
    commands: Mutex<BTreeMap<u64, Arc<CommandEntry>>>,
    /// (last activity, idle timeout).
    idle: Mutex<(Instant, Duration)>,
    max_lifetime: Duration,
    /// A session opened from a workload class: its commands and network changes are
    /// decided by the class.
    class: Option<ClassState>,
    _permit: Permit,
    /// An inline contract's image, leased while the session's cell may use it.
    _image_lease: Option<crate::plans::ImageLease>,
}

/// What a class session's policy decisions need: the class, and the destinations its
/// proxy allows now (the lock also orders concurrent changes).
struct ClassState {
    name: String,
    domains: Mutex<Vec<String>>,
}

impl ClassState {
    fn domains(&self) -> Vec<String> {
        self.domains
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

impl SessionEntry {
    fn class_session(&self, class: &ClassState, domains: Vec<String>) -> ClassSession {
        ClassSession {
            class: class.name.clone(),
            session_id: self.session.id().to_string(),
            tenant: self.tenant.clone(),
            domains,
        }
    }

    fn touch(&self) {
        self.idle.lock().unwrap_or_else(|p| p.into_inner()).0 = Instant::now();
    }

    fn idle_timeout(&self) -> Duration {
        self.idle.lock().unwrap_or_else(|p| p.into_inner()).1
    }

    fn command(&self, id: u64) -> Option<Arc<CommandEntry>> {
        self.commands
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&id)
            .cloned()
    }

    fn view(&self) -> SessionView {
        let commands = self
            .commands
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|(id, c)| command_view(*id, c))
            .collect();
        SessionView {
            session_id: self.session.id().to_string(),
            tenant: self.tenant.clone(),
            workload_class: self.workload_class.clone(),
            idle_timeout_s: self.idle_timeout().as_secs(),
            max_lifetime_s: self.max_lifetime.as_secs(),
            writable_paths: self
                .writable
                .iter()
                .map(|p| p.display().to_string())
                .collect(),
            commands,
            allowed_domains: self.class.as_ref().map(ClassState::domains),
        }
    }

    /// Whether the tenant's idle timeout has passed with no command running.
    fn idle_expired(&self, now: Instant) -> bool {
        let (last, timeout) = *self.idle.lock().unwrap_or_else(|p| p.into_inner());
        let running = self
            .commands
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .any(|c| c.log.ended().is_none());
        !running && now.duration_since(last) >= timeout
    }
}

fn command_view(id: u64, command: &CommandEntry) -> CommandView {
    let ended = command.log.ended();
    CommandView {
        command_id: id,
        run_id: command.run_id.clone(),
        argv: command.argv.clone(),
        running: ended.is_none(),
        record: ended.map(|e| e.record),
    }
}

/// The session `id` if `tenant` may see it (else 404, as for one that does not exist).
fn session_of(state: &Shared, tenant: &Tenant, id: &str) -> Result<Arc<SessionEntry>, ApiError> {
    let sessions = state.sessions.lock().unwrap_or_else(|p| p.into_inner());
    match sessions.get(id) {
        Some(entry) if tenant.may_see(Some(&entry.tenant)) => Ok(Arc::clone(entry)),
        _ => Err(ApiError::not_found("session")),
    }
}

fn seconds(value: Option<u64>, default: u64, max: u64) -> Result<Duration, ApiError> {
    let value = value.unwrap_or(default);
    if value == 0 || value > max {
        return Err(ApiError::bad_request(
            "session.timeout_out_of_range",
            format!("{value} s: must be between 1 and {max}"),
        ));
    }
    Ok(Duration::from_secs(value))
}

#[utoipa::path(post, path = "/v1/sessions", request_body = SessionBody,
    responses((status = 201, body = SessionView), (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 422, body = ErrorBody), (status = 429, body = ErrorBody),
        (status = 503, body = ErrorBody)))]
pub async fn create_session(
    State(state): State<Shared>,
    Caller(tenant): Caller,
    ApiJson(body): ApiJson<SessionBody>,
) -> Result<Response, ApiError> {
    let config = &state.config;
    let idle = seconds(
        body.idle_timeout_s,
        config
            .session_idle_timeout_s
            .min(config.max_session_idle_timeout_s),
        config.max_session_idle_timeout_s,
    )?;
    let lifetime = seconds(
        body.max_lifetime_s,
        config.max_session_lifetime_s,
        config.max_session_lifetime_s,
    )?;
    crate::plans::check_wanted(&[], &body.env)?;
    let permit = state.admit(&tenant, Work::Session)?;
    // A session's plan is compiled with a placeholder command: its commands come later.
    let placeholder = ["<session>".to_string()];
    let wanted = Wanted {
        contract: body.contract.as_deref(),
        inline: body.contract_inline.as_ref(),
        argv: &placeholder,
        env: &body.env,
        deadline_ms: None,
    };
    let planned = match body.class.as_deref() {
        None => state
            .contracts
            .plan(&wanted, state.inline_allowed(&tenant))
            .map(|planned| (planned, lifetime, None)),
        Some(name) => {
            let grant = match class_session_grant(&state, &tenant, name, &body).await? {
                Ok(grant) => grant,
                Err(answer) => return Ok(answer),
            };
            let lifetime = lifetime.min(Duration::from_secs(grant.lifetime_seconds));
            let class = ClassState {
                name: name.to_string(),
                domains: Mutex::new(allowed_domains(&grant.contract)),
            };
            state
                .contracts
                .plan_granted(&grant.contract, &grant.base_dir, name, &wanted)
                .map(|planned| (planned, lifetime, Some((class, grant.opened))))
        }
    };
    let (planned, lifetime, policy) = match planned {
        Ok(planned) => planned,
        Err(refusal) => return Err(record_refusal(&state, &tenant, &[], refusal).await),
    };
    let crate::plans::Planned {
        plan,
        class,
        lease: image_lease,
    } = planned;
    let (class_state, record_grant) = match policy {
        Some((class_state, record_grant)) => (Some(class_state), Some(record_grant)),
        None => (None, None),
    };
    let writable = files::writable_paths(&plan);
    let secrets = record::secrets_of(&plan, &[]);
    let request = SessionRequest {
        plan,
        workload_class: class.clone(),
        credentials: Vec::new(),
        artifacts: None,
        // The supervisor's own idle limit is the ceiling; the tenant's is enforced by reap.
        idle_timeout: Duration::from_secs(config.max_session_idle_timeout_s),
        max_lifetime: lifetime,
        tenant: Some(tenant.name.clone()),
        after_close: quarantine_after_close(&state, &tenant, &class),
    };
    let engine = Arc::clone(&state.engine);
    let opened = tokio::task::spawn_blocking(move || engine.open_session(request))
        .await
        .map_err(|e| ApiError::internal("server.task", e.to_string()))?
        .map_err(|e| ApiError::engine(&e))?;
    let proc_dir = files::open_proc_dir(opened.cell_pid())
        .map_err(|e| ApiError::internal("session.proc", e.to_string()))?;
    let entry = Arc::new(SessionEntry {
        session: Arc::new(opened),
        tenant: tenant.name.clone(),
        workload_class: class,
        proc_dir,
        writable,
        secrets,
        commands: Mutex::default(),
        idle: Mutex::new((Instant::now(), idle)),
        max_lifetime: lifetime,
        class: class_state,
        _permit: permit,
        _image_lease: image_lease,
    });
    if let Some(record_grant) = record_grant {
        let session_id = entry.session.id().to_string();
        // The grant joins the session's record (a store write: off the runtime).
        let _ = tokio::task::spawn_blocking(move || record_grant(&session_id)).await;
    }
    let view = entry.view();
    state
        .sessions
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(view.session_id.clone(), entry);
    Ok((axum::http::StatusCode::CREATED, Json(view)).into_response())
}

/// Keeps a session's evidence once its record is complete, if it was a suspected
/// escape (the policy layer's quarantine, its tenant flagged); without a policy layer
/// the engine removes the copy.
fn quarantine_after_close(
    state: &Shared,
    tenant: &Tenant,
    class: &str,
) -> Option<airlock_engine::AfterClose> {
    let policy = state.policy.clone()?;
    let requester = approvals::identity_of(tenant);
    let class = class.to_string();
    Some(Box::new(move |report, copy| {
        policy.after_contract_run(report, &class, &requester, copy)
    }))
}

/// The policy step of a class session: the grant, or the answer (202 pending, 403).
async fn class_session_grant(
    state: &Shared,
    tenant: &Tenant,
    class: &str,
    body: &SessionBody,
) -> Result<Result<approvals::SessionGrant, Response>, ApiError> {
    if body.contract.is_some() || body.contract_inline.is_some() || !body.env.is_empty() {
        return Err(ApiError::bad_request(
            "class.exclusive",
            "a class session gets its contract and environment from the class: no \
             `contract`, `contract_inline` or `env`"
                .into(),
        ));
    }
    let asked = body.request.clone().unwrap_or_default();
    Ok(approvals::plan_class_session(state, tenant, class, asked, body.approval.clone()).await)
}

/// The destinations a class's contract starts a session with.
fn allowed_domains(contract: &airlock_contract::Contract) -> Vec<String> {
    match contract.network.mode {
        airlock_contract::NetworkMode::Allowlist => contract.network.allowed_domains.clone(),
        airlock_contract::NetworkMode::Deny | airlock_contract::NetworkMode::Pod => Vec::new(),
    }
}

#[utoipa::path(get, path = "/v1/sessions", params(PageQuery),
    responses((status = 200, body = SessionList),
        (status = 400, description = "`cursor.invalid`, `limit.zero`, `query.invalid` (a limit over 1000)", body = ErrorBody),
        (status = 401, body = ErrorBody)))]
pub async fn list_sessions(
    State(state): State<Shared>,
    Caller(tenant): Caller,
    Query(query): Query<PageQuery>,
) -> Result<Response, ApiError> {
    let limit = page::limit(query.limit)?;
    let after = query
        .cursor
        .as_deref()
        .map(|c| page::decode_cursor("sessions", c))
        .transpose()?;
    // The caller's sessions after the cursor, one more than a page, by id; their views
    // are made once the map is unlocked.
    let visible: Vec<(String, Arc<SessionEntry>)> = {
        let sessions = state.sessions.lock().unwrap_or_else(|p| p.into_inner());
        let from = match &after {
            Some(id) => std::ops::Bound::Excluded(id.as_str()),
            None => std::ops::Bound::Unbounded,
        };
        sessions
            .range::<str, _>((from, std::ops::Bound::Unbounded))
            .filter(|(_, s)| tenant.may_see(Some(&s.tenant)))
            .take(limit + 1)
            .map(|(id, s)| (id.clone(), Arc::clone(s)))
            .collect()
    };
    let mut page = Page::new("sessions", limit, &[]);
    let mut last = None;
    let mut more = false;
    for (id, entry) in visible {
        if !page.push(&entry.view())? {
            more = true;
            break;
        }
        last = Some(id);
    }
    let next = more
        .then(|| last.map(|id| page::encode_cursor("sessions", &id)))
        .flatten();
    Ok(page.finish(next))
}

#[utoipa::path(get, path = "/v1/sessions/{id}", params(("id" = String, Path)),
    responses((status = 200, body = SessionView), (status = 404, body = ErrorBody)))]
pub async fn get_session(
    State(state): State<Shared>,
    Caller(tenant): Caller,
    Path(id): Path<String>,
) -> Result<Json<SessionView>, ApiError> {
    Ok(Json(session_of(&state, &tenant, &id)?.view()))
}

#[utoipa::path(post, path = "/v1/sessions/{id}/exec", params(("id" = String, Path), WaitQuery), request_body = ExecBody,
    responses(
        (status = 200, description = "NDJSON frames like a run's (start names the command id too); with wait=true the command's record (JSON) once it ended", content((String = "application/x-ndjson"), (Object = "application/json"))),
        (status = 400, description = "wait=true with background=true (`exec.wait_background`)", body = ErrorBody),
        (status = 202, description = "A background command", body = CommandView),
        (status = 404, body = ErrorBody),
        (status = 422, description = "The command breaks a command rule (`request.*`)", body = ErrorBody),
        (status = 429, body = ErrorBody), (status = 503, body = ErrorBody)))]
pub async fn exec(
    State(state): State<Shared>,
    Caller(tenant): Caller,
    Path(id): Path<String>,
    Query(query): Query<WaitQuery>,
    body: LateJson,
) -> Result<Response, ApiError> {
    let entry = session_of(&state, &tenant, &id)?;
    let body: ExecBody = body.parse(&state).await?;
    if query.wait && body.background {
        return Err(ApiError::bad_request(
            "exec.wait_background",
            "wait=true answers once the command ended; a background command answers at once".into(),
        ));
    }
    check_exec_body(&entry, &body)?;
    if let Err(answer) = check_class_command(&state, &tenant, &entry, &body.argv).await? {
        return Ok(answer);
    }
    let permit = state.admit(&tenant, Work::Command)?;
    entry.touch();
    let log = OutputLog::new(state.config.max_stream_bytes)
        .map_err(|e| ApiError::internal("output.spill", e.to_string()))?;
    let (stdout, stderr) = output_pipes(&log)?;
    let command = CommandRequest {
        argv: body.argv.clone(),
        env: body.env.into_iter().collect(),
        stdin: stdin_of(body.stdin)?,
        stdout: Some(stdout),
        stderr: Some(stderr),
        wall_time_ms: body.deadline_ms,
        output_bytes: None,
    };
    let session = Arc::clone(&entry.session);
    let command_id = tokio::task::spawn_blocking(move || session.exec(command))
        .await
        .map_err(|e| ApiError::internal("server.task", e.to_string()))?
        .map_err(|e| match e {
            airlock_engine::EngineError::SessionClosed => ApiError::not_found("session"),
            other => ApiError::engine(&other),
        })?;
    let run_id = entry
        .session
        .list()
        .into_iter()
        .find(|c| c.id == command_id)
        .map(|c| c.run_id)
        .unwrap_or_default();
    log.set_run_id(&run_id);
    let command = Arc::new(CommandEntry {
        run_id: run_id.clone(),
        argv: body.argv,
        log: Arc::clone(&log),
    });
    entry
        .commands
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(command_id, Arc::clone(&command));
    watch_command(&state, &entry, command_id, permit);
    if body.background {
        let view = command_view(command_id, &command);
        return Ok((axum::http::StatusCode::ACCEPTED, Json(view)).into_response());
    }
    let start = Frame::Start {
        run_id,
        command_id: Some(command_id),
    };
    let on_disconnect = KillOnDisconnect {
        session: Arc::clone(&entry.session),
        id: command_id,
        log: Arc::clone(&log),
    };
    if query.wait {
        // Held while waiting: a client that goes away kills its command, as when streamed.
        let ended = crate::runs::wait_ended(&log).await;
        drop(on_disconnect);
        return Ok(Json(ended.record).into_response());
    }
    Ok(ndjson(output::ndjson_body(
        log,
        Some(start),
        true,
        on_disconnect,
    )))
}

/// A foreground command belongs to the request that streams it: held by its response
/// body, which the server drops when the client goes away, this kills the command if
/// it has not ended by then (its log has no end yet). The session stays: it outlives
/// its callers by design (the supervisor refuses to watch a session command's caller).
/// A background command has no such body and is not affected.
struct KillOnDisconnect {
    session: Arc<Session>,
    id: u64,
    log: Arc<OutputLog>,
}

impl Drop for KillOnDisconnect {
    fn drop(&mut self) {
        if self.log.ended().is_some() {
            return;
        }
        let (session, id) = (Arc::clone(&self.session), self.id);
        // The signal is a round trip on the session's control socket: off the runtime's
        // threads.
        let kill = move || {
            let _ = session.signal(id, CommandSignal::Kill);
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => drop(runtime.spawn_blocking(kill)),
            Err(_) => kill(),
        }
    }
}

/// A session command's argv and environment additions as [`check_command`] decides,
/// the session's own environment counted in its size: 422 before anything is recorded
/// or admitted.
fn check_exec_body(entry: &SessionEntry, body: &ExecBody) -> Result<(), ApiError> {
    let additions: Vec<(&str, &str)> = body
        .env
        .iter()
        .map(|(name, value)| (name.as_str(), value.as_str()))
        .collect();
    let session_env = airlock_contract::plan_env(entry.session.plan());
    check_command(&CommandInput {
        argv: &body.argv,
        env: &additions,
        base_env: &session_env,
        cwd: None,
    })
    .map_err(|err| ApiError::command_input(&err))
}

/// A class session's command against its class's command policy, before it reaches
/// the cell: the refusal (recorded by the policy layer) as the answer.
async fn check_class_command(
    state: &Shared,
    tenant: &Tenant,
    entry: &SessionEntry,
    argv: &[String],
) -> Result<Result<(), Response>, ApiError> {
    let Some(class) = &entry.class else {
        return Ok(Ok(()));
    };
    let policy = approvals::configured_policy(state)?;
    let session = entry.class_session(class, class.domains());
    let requester = approvals::identity_of(tenant);
    let argv = argv.to_vec();
    let checked =
        approvals::blocking(move || policy.check_session_command(&session, &requester, &argv))
            .await;
    Ok(checked.map_err(|refusal| approvals::refusal_response(state, tenant, &class.name, refusal)))
}

#[utoipa::path(post, path = "/v1/sessions/{id}/network", params(("id" = String, Path)), request_body = NetworkBody,
    responses((status = 200, description = "Applied: new connections are decided against the list", body = NetworkView),
        (status = 202, description = "A destination needs an approval: stored pending; the same change with `approval` applies once it is approved", body = crate::approvals::PendingApproval),
        (status = 400, body = ErrorBody),
        (status = 403, description = "Denied by the session's class (its `policy.*` reason code)", body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 409, description = "Not a class session (`session.not_from_class`), or its cell has no network (`session.network_unavailable`)", body = ErrorBody)))]
pub async fn change_network(
    State(state): State<Shared>,
    Caller(tenant): Caller,
    Path(id): Path<String>,
    body: LateJson,
) -> Result<Response, ApiError> {
    let entry = session_of(&state, &tenant, &id)?;
    let body: NetworkBody = body.parse(&state).await?;
    let Some(class) = entry.class.as_ref().map(|c| c.name.clone()) else {
        return Err(ApiError::new(
            axum::http::StatusCode::CONFLICT,
            ResultClass::PolicyDenied,
            "session.not_from_class",
            "only a session opened from a workload class may change its destinations: \
             nothing else bounds the change"
                .into(),
        ));
    };
    let policy = approvals::configured_policy(&state)?;
    let request = NetworkRequest {
        requester: approvals::identity_of(&tenant),
        change: airlock_policy::NetworkChange {
            add: body.add,
            remove: body.remove,
        },
        approval: body.approval,
    };
    entry.touch();
    let task_entry = Arc::clone(&entry);
    let changed = tokio::task::spawn_blocking(move || {
        apply_network_change(&task_entry, policy.as_ref(), request)
    })
    .await
    .map_err(|e| ApiError::internal("server.task", e.to_string()))?;
    match changed {
        Ok(allowed_domains) => Ok(Json(NetworkView {
            session_id: id,
            allowed_domains,
        })
        .into_response()),
        Err(NetworkStop::Policy(refusal)) => Ok(approvals::refusal_response(
            &state, &tenant, &class, refusal,
        )),
        Err(NetworkStop::Engine(airlock_engine::EngineError::SessionClosed)) => {
            Err(ApiError::not_found("session"))
        }
        Err(NetworkStop::Engine(err @ airlock_engine::EngineError::DestinationsNotSet(_))) => {
            Err(ApiError::new(
                axum::http::StatusCode::CONFLICT,
                ResultClass::PolicyDenied,
                "session.network_unavailable",
                err.to_string(),
            ))
        }
        Err(NetworkStop::Engine(err)) => Err(ApiError::engine(&err)),
    }
}

/// Why a network change was not applied.
enum NetworkStop {
    Policy(PolicyRefusal),
    Engine(airlock_engine::EngineError),
}

/// Decides the change against the session's current list and applies it to its proxy;
/// the list is held locked throughout, so two changes never interleave.
fn apply_network_change(
    entry: &SessionEntry,
    policy: &dyn ClassPolicy,
    request: NetworkRequest,
) -> Result<Vec<String>, NetworkStop> {
    let Some(class) = &entry.class else {
        return Ok(Vec::new());
    };
    let mut domains = class.domains.lock().unwrap_or_else(|p| p.into_inner());
    let session = entry.class_session(class, domains.clone());
    let grant = policy
        .change_network(&session, request)
        .map_err(NetworkStop::Policy)?;
    match entry.session.set_destinations(grant.rules) {
        Ok(()) => {
            (grant.applied)(None);
            *domains = grant.domains.clone();
            Ok(grant.domains)
        }
        Err(err) => {
            (grant.applied)(Some(&err.to_string()));
            Err(NetworkStop::Engine(err))
        }
    }
}

/// Waits for command `id` on a blocking thread and completes its log with its end.
fn watch_command(state: &Shared, entry: &Arc<SessionEntry>, id: u64, permit: Permit) {
    let guard = state.work.enter();
    let (state, entry) = (Arc::clone(state), Arc::clone(entry));
    tokio::task::spawn_blocking(move || {
        let (_permit, _guard) = (permit, guard);
        let report = entry.session.wait(id);
        let Some(command) = entry.command(id) else {
            return;
        };
        let report = report.unwrap_or_else(|err| {
            airlock_cell::report::RunReport::refused(&command.run_id, err.class(), err.to_string())
        });
        // A command's own wall time; its start is the session's cell's, not a request's.
        let wall = report.timings.wall_ms / 1000.0;
        state.metrics.observe(
            &entry.workload_class,
            &entry.tenant,
            &report,
            (None, Some(wall)),
        );
        command.log.finish(ended_of(&report, &entry.secrets));
        entry.touch();
    });
}

fn command_of(
    state: &Shared,
    tenant: &Tenant,
    id: &str,
    cid: u64,
) -> Result<(Arc<SessionEntry>, Arc<CommandEntry>), ApiError> {
    let entry = session_of(state, tenant, id)?;
    let command = entry
        .command(cid)
        .ok_or_else(|| ApiError::not_found("command"))?;
    Ok((entry, command))
}

#[utoipa::path(get, path = "/v1/sessions/{id}/commands/{cid}", params(("id" = String, Path), ("cid" = u64, Path)),
    responses((status = 200, body = CommandView), (status = 404, body = ErrorBody)))]
pub async fn get_command(
    State(state): State<Shared>,
    Caller(tenant): Caller,
    Path((id, cid)): Path<(String, u64)>,
) -> Result<Json<CommandView>, ApiError> {
    let (_, command) = command_of(&state, &tenant, &id, cid)?;
    Ok(Json(command_view(cid, &command)))
}

#[utoipa::path(get, path = "/v1/sessions/{id}/commands/{cid}/output", params(("id" = String, Path), ("cid" = u64, Path), FollowQuery),
    responses((status = 200, description = "NDJSON frames: the output so far (and, with follow=true, until the command ends)", content_type = "application/x-ndjson"),
        (status = 404, body = ErrorBody)))]
pub async fn command_output(
    State(state): State<Shared>,
    Caller(tenant): Caller,
    Path((id, cid)): Path<(String, u64)>,
    Query(query): Query<FollowQuery>,
) -> Result<Response, ApiError> {
    let (_, command) = command_of(&state, &tenant, &id, cid)?;
    // A reader of a command's output does not own it: its disconnect changes nothing.
    Ok(ndjson(output::ndjson_body(
        Arc::clone(&command.log),
        None,
        query.follow,
        (),
    )))
}

#[utoipa::path(post, path = "/v1/sessions/{id}/commands/{cid}/signal", params(("id" = String, Path), ("cid" = u64, Path)), request_body = SignalBody,
    responses((status = 204, description = "Sent"), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn signal(
    State(state): State<Shared>,
    Caller(tenant): Caller,
    Path((id, cid)): Path<(String, u64)>,
    body: LateJson,
) -> Result<axum::http::StatusCode, ApiError> {
    let (entry, _) = command_of(&state, &tenant, &id, cid)?;
    let body: SignalBody = body.parse(&state).await?;
    let Some(signal) = CommandSignal::from_name(&body.signal) else {
        let known: Vec<&str> = CommandSignal::ALL.iter().map(|s| s.name()).collect();
        return Err(ApiError::bad_request(
            "signal.unsupported",
            format!(
                "{:?} is not one of {}",
                body.signal.chars().take(32).collect::<String>(),
                known.join(", ")
            ),
        ));
    };
    entry
        .session
        .signal(cid, signal)
        .map_err(|e| ApiError::engine(&e))?;
    Ok(axum::http::StatusCode::NO_CONTENT)
}

#[utoipa::path(post, path = "/v1/sessions/{id}/timeout", params(("id" = String, Path)), request_body = TimeoutBody,
    responses((status = 200, body = SessionView), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn set_timeout(
    State(state): State<Shared>,
    Caller(tenant): Caller,
    Path(id): Path<String>,
    body: LateJson,
) -> Result<Json<SessionView>, ApiError> {
    let entry = session_of(&state, &tenant, &id)?;
    let body: TimeoutBody = body.parse(&state).await?;
    let idle = seconds(
        Some(body.idle_timeout_s),
        0,
        state.config.max_session_idle_timeout_s,
    )?;
    *entry.idle.lock().unwrap_or_else(|p| p.into_inner()) = (Instant::now(), idle);
    Ok(Json(entry.view()))
}

#[utoipa::path(delete, path = "/v1/sessions/{id}", params(("id" = String, Path)),
    responses((status = 200, description = "The session's final record (the completion sequence ran)", body = Object),
        (status = 404, body = ErrorBody)))]
pub async fn delete_session(
    State(state): State<Shared>,
    Caller(tenant): Caller,
    Path(id): Path<String>,
) -> Result<Json<serde_json::Value>, ApiError> {
    session_of(&state, &tenant, &id)?;
    let entry = state
        .sessions
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .remove(&id)
        .ok_or_else(|| ApiError::not_found("session"))?;
    Ok(Json(end_session(entry).await?))
}

/// Runs the session's completion sequence; its final record.
pub async fn end_session(entry: Arc<SessionEntry>) -> Result<serde_json::Value, ApiError> {
    let session = Arc::clone(&entry.session);
    let report = tokio::task::spawn_blocking(move || session.end())
        .await
        .map_err(|e| ApiError::internal("server.task", e.to_string()))?
        .map_err(|e| ApiError::engine(&e))?;
    Ok(ended_of(&report, &entry.secrets).record)
}

/// Ends sessions idle past their tenant's timeout, and forgets those whose cell is gone
/// (their lifetime passed: the supervisor destroyed them and their record is complete).
pub async fn reap(state: &Shared) {
    let now = Instant::now();
    let expired: Vec<Arc<SessionEntry>> = {
        let mut sessions = state.sessions.lock().unwrap_or_else(|p| p.into_inner());
        let ids: Vec<String> = sessions
            .iter()
            .filter(|(_, s)| s.idle_expired(now) || s.session.closed().is_some())
            .map(|(id, _)| id.clone())
            .collect();
        ids.iter().filter_map(|id| sessions.remove(id)).collect()
    };
    for entry in expired {
        let _ = end_session(entry).await;
    }
}

/// Ends every session on the operator's behalf (the drain), all at once, until `until`;
/// their records say the operator ended them. The number that had not ended by then.
pub async fn end_all(state: &Shared, until: tokio::time::Instant) -> usize {
    let all: Vec<Arc<SessionEntry>> =
        std::mem::take(&mut *state.sessions.lock().unwrap_or_else(|p| p.into_inner()))
            .into_values()
            .collect();
    let mut ending = tokio::task::JoinSet::new();
    for entry in all {
        let session = Arc::clone(&entry.session);
        ending.spawn_blocking(move || {
            let _ = session.end_by_operator("the service was stopped (SIGTERM or SIGINT)");
            drop(entry);
        });
    }
    while tokio::time::timeout_at(until, ending.join_next())
        .await
        .is_ok_and(|joined| joined.is_some())
    {}
    ending.len()
}

/// The deadline of one file operation (`server.file_op_timeout_ms`).
fn file_deadline(state: &Shared) -> Duration {
    Duration::from_millis(state.config.file_op_timeout_ms)
}

fn file_path(path: &str) -> String {
    format!("/{}", path.trim_start_matches('/'))
}

#[utoipa::path(put, path = "/v1/sessions/{id}/files/{path}", params(("id" = String, Path), ("path" = String, Path, description = "A cell path within a writable path")),
    request_body(content = Vec<u8>, content_type = "application/octet-stream"),
    responses((status = 201, body = Written), (status = 400, description = "Not a regular file (`path.kind`: a FIFO, a socket, a device, a symlink, a directory)", body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 409, description = "The cell created the file while it was being written (`path.changed`)", body = ErrorBody), (status = 413, body = ErrorBody),
        (status = 422, description = "A NUL byte in the path (`path.invalid`)", body = ErrorBody),
        (status = 429, description = "Over the tenant's share of the blocking pool (`quota.blocking`); see Retry-After", body = ErrorBody),
        (status = 503, description = "Not done within file_op_timeout_ms (`file.deadline`)", body = ErrorBody)))]
pub async fn put_file(
    State(state): State<Shared>,
    Caller(tenant): Caller,
    Path((id, path)): Path<(String, String)>,
    ApiBytes(body): ApiBytes,
) -> Result<Response, ApiError> {
    let entry = session_of(&state, &tenant, &id)?;
    entry.touch();
    let shown = file_path(&path);
    let limit = file_deadline(&state);
    let bytes = state
        .blocking(&tenant, &shown, limit, move || {
            let deadline = files::Deadline::after(limit);
            files::write(&entry.proc_dir, &entry.writable, &path, &body, deadline)
        })
        .await?;
    Ok((
        axum::http::StatusCode::CREATED,
        Json(Written { path: shown, bytes }),
    )
        .into_response())
}

#[utoipa::path(get, path = "/v1/sessions/{id}/files/{path}", params(("id" = String, Path), ("path" = String, Path)),
    responses((status = 200, description = "The file's bytes", content_type = "application/octet-stream"),
        (status = 400, description = "Not a regular file (`path.kind`)", body = ErrorBody), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody), (status = 413, body = ErrorBody),
        (status = 422, description = "A NUL byte in the path (`path.invalid`)", body = ErrorBody),
        (status = 429, description = "Over the tenant's share of the blocking pool (`quota.blocking`)", body = ErrorBody),
        (status = 503, description = "Not done within file_op_timeout_ms (`file.deadline`)", body = ErrorBody)))]
pub async fn get_file(
    State(state): State<Shared>,
    Caller(tenant): Caller,
    Path((id, path)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    let entry = session_of(&state, &tenant, &id)?;
    entry.touch();
    let cap = state.config.max_file_bytes;
    let limit = file_deadline(&state);
    let data = state
        .blocking(&tenant, &file_path(&path), limit, move || {
            let deadline = files::Deadline::after(limit);
            files::read(&entry.proc_dir, &entry.writable, &path, cap, deadline)
        })
        .await?;
    Ok((
        [(axum::http::header::CONTENT_TYPE, "application/octet-stream")],
        data,
    )
        .into_response())
}

#[utoipa::path(get, path = "/v1/sessions/{id}/files", params(("id" = String, Path), DirQuery),
    responses((status = 200, body = DirList), (status = 400, description = "Not a directory (`path.kind`)", body = ErrorBody), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 422, description = "A NUL byte in the path (`path.invalid`)", body = ErrorBody),
        (status = 429, description = "Over the tenant's share of the blocking pool (`quota.blocking`)", body = ErrorBody),
        (status = 503, description = "Not done within file_op_timeout_ms (`file.deadline`)", body = ErrorBody)))]
pub async fn list_files(
    State(state): State<Shared>,
    Caller(tenant): Caller,
    Path(id): Path<String>,
    Query(query): Query<DirQuery>,
) -> Result<Response, ApiError> {
    let limit = page::limit(query.limit)?;
    let after = query
        .cursor
        .as_deref()
        .map(|c| page::decode_cursor("files", c))
        .transpose()?;
    let entry = session_of(&state, &tenant, &id)?;
    let dir = query.dir.clone();
    let deadline_after = file_deadline(&state);
    let mut entries = state
        .blocking(&tenant, &file_path(&dir), deadline_after, move || {
            let deadline = files::Deadline::after(deadline_after);
            files::list(&entry.proc_dir, &entry.writable, &dir, deadline)
        })
        .await?;
    // By name, so a cursor (the last name of a page) says where the next one starts.
    entries.sort_by(|a, b| a.name.cmp(&b.name));
    let shown = file_path(&query.dir);
    let mut page = Page::new("entries", limit, &[("dir", &shown)]);
    let mut last: Option<String> = None;
    let mut more = false;
    for listed in entries
        .iter()
        .filter(|e| after.as_ref().is_none_or(|a| e.name.as_str() > a.as_str()))
    {
        if !page.push(listed)? {
            more = true;
            break;
        }
        last = Some(listed.name.clone());
    }
    let next = more
        .then(|| last.map(|name| page::encode_cursor("files", &name)))
        .flatten();
    Ok(page.finish(next))
}
