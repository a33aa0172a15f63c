//! `/healthz` (the process answers), `/readyz` (the store is open and every pool is full),
//! `/metrics` (Prometheus text 0.0.4 or OpenMetrics, by `Accept`).

use crate::api::Health;
use crate::metrics::Format;
use crate::state::Shared;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use std::collections::BTreeMap;

#[utoipa::path(get, path = "/healthz", security(()), responses((status = 200, body = Health)))]
pub async fn healthz() -> Json<Health> {
    Json(Health {
        ok: true,
        detail: "serving".into(),
    })
}

#[utoipa::path(get, path = "/readyz", security(()),
    responses((status = 200, body = Health), (status = 503, description = "Pools still filling, draining, the audit store unreachable (`detail` names it), or a class's verification failed and is not acknowledged", body = Health)))]
pub async fn readyz(State(state): State<Shared>) -> Response {
    if let Err(unreachable) = store_health(&state).await {
        let detail = format!(
            "store unavailable: {unreachable} (new runs are refused with store_unavailable)"
        );
        let body = Json(Health { ok: false, detail });
        return (StatusCode::SERVICE_UNAVAILABLE, body).into_response();
    }
    let status = state.engine.pool_status();
    let filling: Vec<String> = state
        .pools
        .iter()
        .filter(|(_, shape)| {
            !status
                .iter()
                .any(|p| &p.shape == *shape && p.parked >= p.size)
        })
        .map(|(name, _)| name.clone())
        .collect();
    let draining = state.draining.load(std::sync::atomic::Ordering::SeqCst);
    let unverified = state.verifications.blocking();
    let ok = filling.is_empty() && !draining && unverified.is_empty();
    let detail = if draining {
        "draining".to_string()
    } else if !unverified.is_empty() {
        format!(
            "verification failed for class {} (runs of it are refused until an operator \
             acknowledges: POST /v1/verify/CLASS/ack)",
            unverified.join(", ")
        )
    } else if ok {
        "store open, pools full".to_string()
    } else {
        format!("pools filling: {}", filling.join(", "))
    };
    let code = if ok {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (code, Json(Health { ok, detail })).into_response()
}

/// The engine's probe of the audit store (cached: see airlock_engine's `store_health`), on
/// a blocking thread.
async fn store_health(state: &Shared) -> Result<(), String> {
    let engine = std::sync::Arc::clone(&state.engine);
    tokio::task::spawn_blocking(move || engine.store_health())
        .await
        .unwrap_or_else(|e| Err(format!("the store probe failed: {e}")))
}

#[utoipa::path(get, path = "/metrics", security(()),
    params(("Accept" = Option<String>, Header, description = "`application/openmetrics-text` for OpenMetrics 1.0.0; otherwise Prometheus text 0.0.4")),
    responses((status = 200, description = "Prometheus text 0.0.4 (`text/plain; version=0.0.4`), or OpenMetrics 1.0.0 (`application/openmetrics-text; version=1.0.0`) when `Accept` prefers it", content((String = "text/plain"), (String = "application/openmetrics-text")))))]
pub async fn metrics(State(state): State<Shared>, headers: HeaderMap) -> Response {
    let format = Format::negotiate(
        headers
            .get(axum::http::header::ACCEPT)
            .and_then(|v| v.to_str().ok()),
    );
    let mut open: BTreeMap<String, i64> = BTreeMap::new();
    for entry in state
        .sessions
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .values()
    {
        *open.entry(entry.tenant.clone()).or_default() += 1;
    }
    let mut text = state.metrics.render(&state.engine, &state.pools, &open);
    state.verifications.append_metrics(&mut text);
    (
        [(axum::http::header::CONTENT_TYPE, format.content_type())],
        format.express(&text),
    )
        .into_response()
}
