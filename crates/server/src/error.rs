//! Errors: the crate's own ([`ServerError`], starting the service) and the API's
//! ([`ApiError`], one HTTP answer), whose body carries a result class and a reason code
//! like a run's result does.

use airlock_cell::report::ResultClass;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

/// Why the service could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("server configuration: {0}")]
    Config(String),
    #[error("contract {name} ({path}): {source}")]
    Contract {
        name: String,
        path: String,
        source: airlock_contract::ContractError,
    },
    #[error("listener {listen}: {source}")]
    Listen {
        listen: String,
        source: std::io::Error,
    },
    #[error(transparent)]
    Tls(#[from] crate::tls::TlsSetupError),
    #[error("audit store: {0}")]
    Store(#[from] airlock_store::StoreError),
    #[error("engine: {0}")]
    Engine(#[from] airlock_engine::EngineError),
    #[error("{context}: {source}")]
    Io {
        context: String,
        source: std::io::Error,
    },
}

/// Retry-After of a `store.unavailable` answer: about the reconnection backoff's bound
/// (airlock_store's `RECONNECT_MAX`), so a client does not ask faster than it is tried.
pub const STORE_RETRY_AFTER_SECS: u64 = 5;

/// The body of every error answer (docs/openapi.json `ErrorBody`).
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct ErrorBody {
    /// A result class (`policy_denied`, `capacity_exceeded`, `runtime_fault`, ...).
    pub class: String,
    /// A stable reason code (`auth.bad_key`, `quota.runs_per_minute`, ...).
    pub reason: String,
    pub error: String,
    /// The run the refusal was recorded as, when it was.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub run_id: Option<String>,
}

#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: StatusCode,
    pub body: ErrorBody,
    /// Seconds, for 429 and 503.
    pub retry_after: Option<u64>,
}

impl ApiError {
    pub fn new(status: StatusCode, class: ResultClass, reason: &str, error: String) -> ApiError {
        ApiError {
            status,
            body: ErrorBody {
                class: class.as_str().to_string(),
                reason: reason.to_string(),
                error,
                run_id: None,
            },
            retry_after: None,
        }
    }

    pub fn unauthorized(reason: &str, error: &str) -> ApiError {
        ApiError::new(
            StatusCode::UNAUTHORIZED,
            ResultClass::PolicyDenied,
            reason,
            error.to_string(),
        )
    }

    /// Absent, or another tenant's: the same answer, so ids of others cannot be probed.
    pub fn not_found(what: &str) -> ApiError {
        ApiError::new(
            StatusCode::NOT_FOUND,
            ResultClass::PolicyDenied,
            "not_found",
            format!("no such {what}"),
        )
    }

    pub fn bad_request(reason: &str, error: String) -> ApiError {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            ResultClass::PolicyDenied,
            reason,
            error,
        )
    }

    pub fn forbidden(reason: &str, error: String) -> ApiError {
        ApiError::new(
            StatusCode::FORBIDDEN,
            ResultClass::PolicyDenied,
            reason,
            error,
        )
    }

    pub fn too_many(reason: &str, error: String, retry_after: u64) -> ApiError {
        let mut err = ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            ResultClass::CapacityExceeded,
            reason,
            error,
        );
        err.retry_after = Some(retry_after.max(1));
        err
    }

    pub fn internal(reason: &str, error: String) -> ApiError {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            ResultClass::RuntimeFault,
            reason,
            error,
        )
    }

    pub fn draining() -> ApiError {
        let mut err = ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            ResultClass::CapacityExceeded,
            "server.draining",
            "the service is shutting down and takes no new work".into(),
        );
        err.retry_after = Some(5);
        err
    }

    /// The audit store cannot be reached now (503, `store.unavailable`, Retry-After):
    /// nothing ran and nothing is wrong with the records; ask again.
    pub fn store_unavailable(error: String) -> ApiError {
        let mut err = ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            ResultClass::StoreUnavailable,
            "store.unavailable",
            error,
        );
        err.retry_after = Some(STORE_RETRY_AFTER_SECS);
        err
    }

    /// A store failure of a query: unavailable is 503, the rest a fault.
    pub fn store(err: &airlock_store::StoreError) -> ApiError {
        match err.is_unavailable() {
            true => ApiError::store_unavailable(err.to_string()),
            false => ApiError::internal("store", err.to_string()),
        }
    }

    /// A command no cell may be sent ([`airlock_contract::check_command`]): 422, its
    /// reason the rule (`request.env_key_invalid`, `request.nul_byte`, ...), its message
    /// naming the field.
    pub fn command_input(err: &airlock_contract::CommandInputError) -> ApiError {
        ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            ResultClass::PolicyDenied,
            err.reason(),
            err.to_string(),
        )
    }

    /// An engine failure as an answer: a refused command is 422, capacity 429, an
    /// unavailable store 503, the rest a fault.
    pub fn engine(err: &airlock_engine::EngineError) -> ApiError {
        if let airlock_engine::EngineError::CommandRefused(refused) = err {
            return ApiError::command_input(refused);
        }
        if let airlock_engine::EngineError::CredentialForbidden(forbidden) = err {
            return ApiError::forbidden(forbidden.reason(), forbidden.to_string());
        }
        match err.class() {
            ResultClass::CapacityExceeded => {
                ApiError::too_many("engine.capacity", err.to_string(), 1)
            }
            ResultClass::StoreUnavailable => ApiError::store_unavailable(err.to_string()),
            _ => ApiError::internal("engine", err.to_string()),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, axum::Json(self.body)).into_response();
        if let Some(seconds) = self.retry_after {
            if let Ok(value) = HeaderValue::from_str(&seconds.to_string()) {
                response.headers_mut().insert(header::RETRY_AFTER, value);
            }
        }
        response
    }
}

/// The longest framework error text kept as an [`ErrorBody`]'s `error`.
const FRAMEWORK_TEXT_BYTES: usize = 4096;

/// The layer over every route (the API's and the agent's): an error answer whose body
/// is not `application/json` (the framework's own: a wrong method, a body limit, rmcp's
/// refusals) becomes an [`ErrorBody`] with the same status and headers (`Allow`,
/// `Retry-After`), so every error of the service is one shape (docs/api.md).
pub async fn json_errors(
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let response = next.run(request).await;
    if !is_bare_error(&response) {
        return response;
    }
    let (parts, body) = response.into_parts();
    let text = axum::body::to_bytes(body, FRAMEWORK_TEXT_BYTES)
        .await
        .map(|b| String::from_utf8_lossy(&b).trim().to_string())
        .unwrap_or_default();
    let mut rewritten = framework_error(parts.status, text).into_response();
    for (name, value) in &parts.headers {
        if name != header::CONTENT_TYPE && name != header::CONTENT_LENGTH {
            rewritten.headers_mut().append(name, value.clone());
        }
    }
    rewritten
}

fn is_bare_error(response: &Response) -> bool {
    let status = response.status();
    let json = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    (status.is_client_error() || status.is_server_error()) && !json
}

/// The pure decision: the reason code of a framework's error answer, by its status.
pub fn framework_error(status: StatusCode, text: String) -> ApiError {
    let (class, reason) = match status {
        StatusCode::NOT_FOUND => (ResultClass::PolicyDenied, "not_found"),
        StatusCode::METHOD_NOT_ALLOWED => (ResultClass::PolicyDenied, "method.not_allowed"),
        StatusCode::PAYLOAD_TOO_LARGE => (ResultClass::PolicyDenied, "request.too_large"),
        StatusCode::UNSUPPORTED_MEDIA_TYPE => (ResultClass::PolicyDenied, "body.content_type"),
        StatusCode::NOT_ACCEPTABLE => (ResultClass::PolicyDenied, "request.not_acceptable"),
        StatusCode::REQUEST_TIMEOUT => (ResultClass::PolicyDenied, "request.timeout"),
        s if s.is_server_error() => (ResultClass::RuntimeFault, "server.fault"),
        _ => (ResultClass::PolicyDenied, "request.invalid"),
    };
    let error = match text.is_empty() {
        true => status
            .canonical_reason()
            .unwrap_or("refused")
            .to_lowercase(),
        false => text,
    };
    ApiError::new(status, class, reason, error)
}

/// The answer of a route no router serves.
pub async fn no_such_route() -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        ResultClass::PolicyDenied,
        "not_found",
        "no such route".into(),
    )
}

/// The answer of a route served, but not with this method (axum adds `Allow`).
pub async fn method_not_allowed() -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        ResultClass::PolicyDenied,
        "method.not_allowed",
        "the route does not take this method (see Allow)".into(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn framework_statuses_have_their_own_reasons() {
        for (status, reason) in [
            (StatusCode::NOT_FOUND, "not_found"),
            (StatusCode::METHOD_NOT_ALLOWED, "method.not_allowed"),
            (StatusCode::PAYLOAD_TOO_LARGE, "request.too_large"),
            (StatusCode::UNSUPPORTED_MEDIA_TYPE, "body.content_type"),
            (StatusCode::BAD_REQUEST, "request.invalid"),
            (StatusCode::BAD_GATEWAY, "server.fault"),
        ] {
            let err = framework_error(status, String::new());
            assert_eq!((err.status, err.body.reason.as_str()), (status, reason));
            assert!(!err.body.error.is_empty());
        }
    }
}
