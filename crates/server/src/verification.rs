//! The last periodic `airlock verify` of each configured class (`[server.verify]`,
//! docs/verify.md): shown in `/metrics`; a failed one holds `/readyz` not ready and
//! refuses the class's runs (`verify.failed`) until an operator acknowledges it
//! (`POST /v1/verify/{class}/ack`). The binary runs the verifications and reports here.

use crate::error::{ApiError, ErrorBody};
use crate::state::Path;
use crate::state::{Caller, Shared};
use airlock_cell::report::ResultClass;
use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;

/// The last verification of one class.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct ClassVerification {
    pub class: String,
    pub passed: bool,
    /// When it ended, unix milliseconds.
    pub at_unix_ms: u64,
    /// The checks that failed (or why the verification could not run).
    pub failed: Vec<String>,
    /// An operator acknowledged this failure: the class runs again.
    pub acknowledged: bool,
}

impl ClassVerification {
    /// Failed and not acknowledged: the service is not ready and the class's runs are
    /// refused.
    pub fn blocks(&self) -> bool {
        !self.passed && !self.acknowledged
    }
}

/// Every class's last verification.
#[derive(Debug, Default)]
pub struct Verifications {
    classes: Mutex<BTreeMap<String, ClassVerification>>,
}

impl Verifications {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, ClassVerification>> {
        self.classes.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Classes about to be verified for the first time: until then they count as failed
    /// (fail closed: no run of a class whose boundary was not shown to hold).
    pub fn expect(&self, classes: &[String]) {
        for class in classes {
            let pending = vec!["pending: not verified yet".to_string()];
            self.record(class, false, pending, 0);
        }
    }

    /// A verification ended: it replaces the class's last one, so a new failure needs a
    /// new acknowledgement.
    pub fn record(&self, class: &str, passed: bool, failed: Vec<String>, at_unix_ms: u64) {
        let entry = ClassVerification {
            class: class.to_string(),
            passed,
            at_unix_ms,
            failed,
            acknowledged: false,
        };
        self.lock().insert(class.to_string(), entry);
    }

    /// The operator acknowledged the class's failure; `None` for a class never verified.
    pub fn acknowledge(&self, class: &str) -> Option<ClassVerification> {
        let mut classes = self.lock();
        let entry = classes.get_mut(class)?;
        entry.acknowledged = true;
        Some(entry.clone())
    }

    pub fn blocking(&self) -> Vec<String> {
        (self.lock().values())
            .filter(|v| v.blocks())
            .map(|v| v.class.clone())
            .collect()
    }

    pub fn blocks(&self, class: &str) -> bool {
        self.lock()
            .get(class)
            .is_some_and(ClassVerification::blocks)
    }

    /// The gauges in Prometheus text, inserted before the exposition's `# EOF`.
    pub fn append_metrics(&self, text: &mut String) {
        let classes = self.lock();
        if classes.is_empty() {
            return;
        }
        let eof = text.rfind("# EOF").unwrap_or(text.len());
        let mut gauges = String::new();
        let families = [
            (
                "airlock_verify_passed",
                "1 when the class's last verification passed",
            ),
            (
                "airlock_verify_last_run_timestamp_seconds",
                "When the class's last verification ended",
            ),
            (
                "airlock_verify_blocking",
                "1 while a failed verification is unacknowledged: runs of the class are refused",
            ),
        ];
        for (name, help) in families {
            let _ = writeln!(gauges, "# HELP {name} {help}.\n# TYPE {name} gauge");
            for v in classes.values() {
                let value = match name {
                    "airlock_verify_passed" => u64::from(v.passed) as f64,
                    "airlock_verify_blocking" => u64::from(v.blocks()) as f64,
                    _ => v.at_unix_ms as f64 / 1000.0,
                };
                let _ = writeln!(gauges, "{name}{{class=\"{}\"}} {value}", v.class);
            }
        }
        text.insert_str(eof, &gauges);
    }
}

/// The refusal of a run of a class whose verification failed.
pub fn refusal(class: &str) -> ApiError {
    ApiError::new(
        StatusCode::FORBIDDEN,
        ResultClass::PolicyDenied,
        "verify.failed",
        format!(
            "the last verification of class {class} failed: its runs are refused until an \
             operator acknowledges it (POST /v1/verify/{class}/ack)"
        ),
    )
}

#[utoipa::path(post, path = "/v1/verify/{class}/ack",
    params(("class" = String, Path, description = "Workload class")),
    responses((status = 200, description = "The acknowledged verification", body = ClassVerification),
        (status = 401, body = ErrorBody),
        (status = 403, description = "Not the operator (`verify.not_operator`)", body = ErrorBody),
        (status = 404, description = "The class was never verified", body = ErrorBody)))]
pub async fn acknowledge(
    State(state): State<Shared>,
    Caller(tenant): Caller,
    Path(class): Path<String>,
) -> Result<Json<ClassVerification>, ApiError> {
    if !tenant.operator {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            ResultClass::PolicyDenied,
            "verify.not_operator",
            "only the operator (uid 0 on the unix socket) acknowledges a failed verification"
                .into(),
        ));
    }
    state
        .verifications
        .acknowledge(&class)
        .map(Json)
        .ok_or_else(|| {
            ApiError::new(
                StatusCode::NOT_FOUND,
                ResultClass::PolicyDenied,
                "verify.unknown_class",
                format!("class {class} has no verification"),
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failure_blocks_until_acknowledged_and_a_new_failure_blocks_again() {
        let board = Verifications::default();
        board.expect(&["a".to_string()]);
        assert_eq!(board.blocking(), ["a"], "not verified yet");
        board.record("a", true, vec![], 1000);
        assert!(board.blocking().is_empty());
        board.record("a", false, vec!["permitted.smoke".into()], 2000);
        assert_eq!(board.blocking(), ["a"]);
        assert!(board.blocks("a"));
        assert!(board.acknowledge("a").is_some());
        assert!(!board.blocks("a"));
        board.record("a", false, vec!["permitted.smoke".into()], 3000);
        assert!(board.blocks("a"));
        assert!(board.acknowledge("b").is_none());
    }

    #[test]
    fn the_gauges_come_before_the_end_of_the_exposition() {
        let board = Verifications::default();
        board.record("a", false, vec![], 2500);
        let mut text = "# HELP x y\n# EOF\n".to_string();
        board.append_metrics(&mut text);
        assert!(text.ends_with("# EOF\n"), "{text}");
        assert!(
            text.contains("airlock_verify_passed{class=\"a\"} 0\n"),
            "{text}"
        );
        assert!(
            text.contains("airlock_verify_blocking{class=\"a\"} 1\n"),
            "{text}"
        );
        assert!(
            text.contains("airlock_verify_last_run_timestamp_seconds{class=\"a\"} 2.5\n"),
            "{text}"
        );
    }
}
