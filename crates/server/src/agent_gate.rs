//! The tenant of a request to the agent's routes (`/mcp`, `POST /v1/tools/{name}/call`)
//! as the engine's [`Caller`]: resolved exactly as the API resolves it (a tenant's key on
//! any listener, the peer's uid on the unix socket) and admitted against the same quotas.

use crate::error::ApiError;
use crate::quota::Work as QuotaWork;
use crate::state::{tenant_of, Shared};
use airlock_cell::report::ResultClass;
use airlock_engine::caller::{Admitted, Refused, Work};
use airlock_engine::Caller;
use axum::http::request::Parts;
use axum::http::StatusCode;
use std::sync::Arc;

/// Who a request is, or why it is refused (before any route of the agent's sees it).
pub type Authenticate = Arc<dyn Fn(&Parts) -> Result<Caller, Refused> + Send + Sync>;

/// The service's [`Authenticate`].
pub fn authenticate(state: &Shared) -> Authenticate {
    let state = Arc::clone(state);
    Arc::new(move |parts: &Parts| {
        let tenant = tenant_of(parts, &state).map_err(refused)?;
        let admitting = Arc::clone(&state);
        let name = tenant.name.clone();
        let admit = Arc::new(move |work: Work| {
            admitting
                .admit(&tenant, quota_work(work))
                .map(Admitted::new)
                .map_err(refused)
        });
        Ok(Caller::new(name, admit))
    })
}

fn quota_work(work: Work) -> QuotaWork {
    match work {
        Work::Run => QuotaWork::Run,
        Work::Session => QuotaWork::Session,
        Work::Command => QuotaWork::Command,
    }
}

/// An API error as a refusal: over a quota or draining is `capacity_exceeded`, anything
/// else (no key, a wrong key, an unknown uid) `policy_denied`.
fn refused(err: ApiError) -> Refused {
    let class = match err.status {
        StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE => {
            ResultClass::CapacityExceeded
        }
        _ => ResultClass::PolicyDenied,
    };
    Refused {
        class,
        reason: err.body.reason,
        message: err.body.error,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quota_and_drain_refusals_are_capacity_the_rest_policy() {
        let over = refused(ApiError::too_many("quota.cells", "full".into(), 1));
        assert_eq!(over.class, ResultClass::CapacityExceeded);
        assert_eq!(over.reason, "quota.cells");
        assert_eq!(
            refused(ApiError::draining()).class,
            ResultClass::CapacityExceeded
        );
        let key = refused(ApiError::unauthorized("auth.bad_key", "no"));
        assert_eq!(key.class, ResultClass::PolicyDenied);
        assert_eq!(key.reason, "auth.bad_key");
    }
}
