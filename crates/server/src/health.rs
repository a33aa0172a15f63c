//! `/healthz` (the process answers), `/readyz` (the store is open and every pool is full),
//! `/metrics` (Prometheus text).

use crate::api::Health;
use crate::state::Shared;
use axum::extract::State;
use axum::http::StatusCode;
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
    responses((status = 200, body = Health), (status = 503, description = "Pools still filling, draining, or a class's verification failed and is not acknowledged", body = Health)))]
pub async fn readyz(State(state): State<Shared>) -> Response {
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

#[utoipa::path(get, path = "/metrics", security(()),
    responses((status = 200, description = "The metrics: OpenMetrics text (Prometheus text 0.0.4 when negotiated by Accept)",
        content((String = "application/openmetrics-text"), (String = "text/plain")))))]
pub async fn metrics(State(state): State<Shared>) -> Response {
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
        [(
            axum::http::header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        text,
    )
        .into_response()
}
