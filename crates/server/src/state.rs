//! What every request handler shares: the engine, the store (opened once), the tenants
//! and their quotas, the contracts, the open sessions, the metrics, and the drain state.

use crate::config::ServerConfig;
use crate::error::ApiError;
use crate::metrics::Metrics;
use crate::plans::Contracts;
use crate::quota::{BlockingPermit, Limits, Permit, Quotas, Work};
use crate::sessions::SessionEntry;
use crate::tenants::{Peer, Tenant, Tenants};
use airlock_engine::{Engine, PlanShape};
use airlock_store::Store;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

pub struct AppState {
    pub engine: Arc<Engine>,
    /// The service's own connection (queries); the engine keeps its own for records.
    pub store: Mutex<Store>,
    pub tenants: Tenants,
    pub config: ServerConfig,
    pub quotas: Arc<Quotas>,
    pub contracts: Contracts,
    pub sessions: Mutex<BTreeMap<String, Arc<SessionEntry>>>,
    pub metrics: Metrics,
    pub draining: AtomicBool,
    pub work: Arc<InFlight>,
    /// Each pool's name (its contract's) and shape.
    pub pools: BTreeMap<String, PlanShape>,
    /// The policy layer, when the operator configured workload classes.
    pub policy: Option<Arc<dyn crate::approvals::ClassPolicy>>,
    /// The last periodic verification of each class of `[server.verify]`.
    pub verifications: Arc<crate::verification::Verifications>,
}

pub type Shared = Arc<AppState>;

impl AppState {
    pub fn limits(&self, tenant: &Tenant) -> Limits {
        match self.config.tenants.get(&tenant.name) {
            Some(config) if !tenant.operator => Limits::of(config),
            _ => Limits::UNBOUNDED,
        }
    }

    pub fn inline_allowed(&self, tenant: &Tenant) -> bool {
        tenant.operator
            || self
                .config
                .tenants
                .get(&tenant.name)
                .is_some_and(|t| t.inline_contracts)
    }

    /// Admits new work of `tenant`, or says why not (draining: 503; a quota: 429).
    pub fn admit(self: &Arc<Self>, tenant: &Tenant, work: Work) -> Result<Permit, ApiError> {
        if self.draining.load(Ordering::SeqCst) {
            return Err(ApiError::draining());
        }
        self.quotas
            .admit(&tenant.name, self.limits(tenant), work, Instant::now())
            .inspect_err(|err| self.metrics.deny("", &tenant.name, &err.body.reason))
    }

    /// Runs `f` on a thread of the blocking pool for `tenant`, within its share
    /// (`server.max_blocking_per_tenant`: else 429 at once) and answered by `limit` at the
    /// latest (503 `file.deadline`). The share's slot travels with `f` onto its thread and
    /// is given back when that thread is done, however it ends; a request whose client
    /// went away drops only its wait.
    pub async fn blocking<T: Send + 'static>(
        self: &Arc<Self>,
        tenant: &Tenant,
        what: &str,
        limit: std::time::Duration,
        f: impl FnOnce() -> Result<T, ApiError> + Send + 'static,
    ) -> Result<T, ApiError> {
        let permit = self.blocking_share(tenant)?;
        let task = tokio::task::spawn_blocking(move || {
            let _permit = permit;
            f()
        });
        match tokio::time::timeout(limit, task).await {
            Ok(joined) => {
                joined.map_err(|err| ApiError::internal("server.task", err.to_string()))?
            }
            Err(_) => Err(crate::files::timed_out(what, limit)),
        }
    }

    /// A slot of `tenant`'s share of the blocking pool (none for the operator), or 429
    /// `quota.blocking` at once.
    fn blocking_share(&self, tenant: &Tenant) -> Result<Option<BlockingPermit>, ApiError> {
        if tenant.operator {
            return Ok(None);
        }
        self.quotas
            .blocking(&tenant.name, self.config.max_blocking_per_tenant)
            .map(Some)
            .inspect_err(|err| self.metrics.deny("", &tenant.name, &err.body.reason))
    }

    /// Runs `f` with the store on a blocking thread, within `tenant`'s share of the pool:
    /// requests queued on the store's lock hold threads, so a flood of one tenant's
    /// queries is answered 429 instead of taking the pool from every other tenant.
    pub async fn with_store<T: Send + 'static>(
        self: &Arc<Self>,
        tenant: &Tenant,
        f: impl FnOnce(&Store) -> airlock_store::Result<T> + Send + 'static,
    ) -> Result<T, ApiError> {
        let state = Arc::clone(self);
        let permit = self.blocking_share(tenant)?;
        tokio::task::spawn_blocking(move || {
            let _permit = permit;
            let store = state.store.lock().unwrap_or_else(|p| p.into_inner());
            f(&store)
        })
        .await
        .map_err(|err| ApiError::internal("server.task", err.to_string()))?
        .map_err(|err| ApiError::store(&err))
    }
}

/// Work in flight (runs and session commands), so that a drain waits for it.
#[derive(Default)]
pub struct InFlight {
    count: Mutex<usize>,
    idle: tokio::sync::Notify,
}

pub struct WorkGuard(Arc<InFlight>);

impl InFlight {
    pub fn enter(self: &Arc<Self>) -> WorkGuard {
        *self.count.lock().unwrap_or_else(|p| p.into_inner()) += 1;
        WorkGuard(Arc::clone(self))
    }

    pub fn count(&self) -> usize {
        *self.count.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub async fn wait_idle(&self) {
        loop {
            let notified = self.idle.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.count() == 0 {
                return;
            }
            notified.await;
        }
    }
}

impl Drop for WorkGuard {
    fn drop(&mut self) {
        *self.0.count.lock().unwrap_or_else(|p| p.into_inner()) -= 1;
        self.0.idle.notify_waiters();
    }
}

/// The tenant of the request (see tenants.rs).
pub struct Caller(pub Tenant);

impl FromRequestParts<Shared> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &Shared) -> Result<Caller, ApiError> {
        tenant_of(parts, state).map(Caller)
    }
}

/// The tenant of a request: its key, else its connection's peer.
pub fn tenant_of(parts: &Parts, state: &Shared) -> Result<Tenant, ApiError> {
    let peer = parts.extensions.get::<Peer>().copied().unwrap_or(Peer::Tcp);
    let authorization = parts
        .headers
        .get(axum::http::header::AUTHORIZATION)
        .map(|v| v.to_str().unwrap_or("invalid"));
    state.tenants.resolve(peer, authorization)
}

/// A JSON body whose rejections are API errors naming what is wrong: not JSON
/// (400 `body.invalid_json`, with the line and column), JSON of the wrong shape (422
/// `body.invalid_field`, naming the field), not declared `application/json` (415
/// `body.content_type`), longer than `max_body_bytes` (413 `request.too_large`).
pub struct ApiJson<T>(pub T);

impl<T: serde::de::DeserializeOwned> FromRequest<Shared> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &Shared) -> Result<ApiJson<T>, ApiError> {
        match axum::Json::<T>::from_request(req, state).await {
            Ok(axum::Json(value)) => Ok(ApiJson(value)),
            Err(rejection) => Err(json_rejection(rejection)),
        }
    }
}

/// The one mapping of a JSON body's rejection to its reason code.
pub fn json_rejection(rejection: axum::extract::rejection::JsonRejection) -> ApiError {
    use axum::extract::rejection::JsonRejection as R;
    let reason = match &rejection {
        R::JsonSyntaxError(_) => "body.invalid_json",
        R::JsonDataError(_) => "body.invalid_field",
        R::MissingJsonContentType(_) => "body.content_type",
        _ if rejection.status() == axum::http::StatusCode::PAYLOAD_TOO_LARGE => "request.too_large",
        _ => "request.invalid",
    };
    let mut err = ApiError::bad_request(reason, rejection.body_text());
    err.status = rejection.status();
    err
}

/// A JSON body parsed only when the handler asks ([`LateJson::parse`]): the handler
/// first looks up the resource its path names, so that an unknown one is 404 whatever
/// the body's content type (404 before 415).
pub struct LateJson(Request);

impl FromRequest<Shared> for LateJson {
    type Rejection = ApiError;

    async fn from_request(req: Request, _state: &Shared) -> Result<LateJson, ApiError> {
        Ok(LateJson(req))
    }
}

impl LateJson {
    pub async fn parse<T: serde::de::DeserializeOwned>(
        self,
        state: &Shared,
    ) -> Result<T, ApiError> {
        ApiJson::<T>::from_request(self.0, state)
            .await
            .map(|ApiJson(v)| v)
    }
}

/// The query string, its rejection (a value of the wrong type, a missing parameter)
/// 400 `query.invalid` naming the parameter.
pub struct Query<T>(pub T);

impl<T: serde::de::DeserializeOwned> FromRequestParts<Shared> for Query<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &Shared) -> Result<Query<T>, ApiError> {
        match axum::extract::Query::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Query(value)) => Ok(Query(value)),
            Err(rejection) => Err(ApiError::bad_request(
                "query.invalid",
                rejection.body_text(),
            )),
        }
    }
}

/// The path's parameters, its rejection (a command id that is not a number) 400
/// `path.invalid` naming the parameter.
pub struct Path<T>(pub T);

impl<T: serde::de::DeserializeOwned + Send> FromRequestParts<Shared> for Path<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &Shared) -> Result<Path<T>, ApiError> {
        match axum::extract::Path::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Path(value)) => Ok(Path(value)),
            Err(rejection) => Err(ApiError::bad_request("path.invalid", rejection.body_text())),
        }
    }
}

/// A raw body (an upload) whose rejection (too large) is an API error with a reason.
pub struct ApiBytes(pub axum::body::Bytes);

impl FromRequest<Shared> for ApiBytes {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &Shared) -> Result<ApiBytes, ApiError> {
        match axum::body::Bytes::from_request(req, state).await {
            Ok(bytes) => Ok(ApiBytes(bytes)),
            Err(rejection) => {
                let status = rejection.status();
                let reason = if status == axum::http::StatusCode::PAYLOAD_TOO_LARGE {
                    "file.too_large"
                } else {
                    "request.invalid"
                };
                let mut err = ApiError::bad_request(reason, rejection.body_text());
                err.status = status;
                Err(err)
            }
        }
    }
}
