//! When a failed run is run again (seed 004): only a `runtime_fault` (airlock's own
//! failure, not the task's), only when the request carries an idempotency key (the
//! caller says running it twice is harmless), at most the class's `max_retries` times,
//! with an exponential backoff. A retry is the same request under the same grant: never
//! a wider network, more memory or a weaker filter.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// The most retries a class may allow.
pub const MAX_RETRIES: u32 = 5;
/// The longest wait between two attempts.
pub const MAX_BACKOFF: Duration = Duration::from_secs(30);

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RetryRules {
    /// How many times a `runtime_fault` is retried (0..=5; default 0: never).
    #[serde(default)]
    pub max_retries: u32,
    /// The wait before the first retry; doubled before each next one (at most 30 s).
    #[serde(default = "default_backoff_ms")]
    pub backoff_ms: u64,
}

impl Default for RetryRules {
    fn default() -> Self {
        RetryRules {
            max_retries: 0,
            backoff_ms: default_backoff_ms(),
        }
    }
}

fn default_backoff_ms() -> u64 {
    500
}

/// The wait before retry number `retries_done + 1` of a run that ended `status`, or
/// `None` when it is not retried.
pub fn retry_delay(
    status: &str,
    retries_done: u32,
    idempotency_key: Option<&str>,
    rules: &RetryRules,
) -> Option<Duration> {
    let retryable = status == "runtime_fault" && idempotency_key.is_some_and(|k| !k.is_empty());
    if !retryable || retries_done >= rules.max_retries.min(MAX_RETRIES) {
        return None;
    }
    let factor = 1u64.checked_shl(retries_done).unwrap_or(u64::MAX);
    let wait = Duration::from_millis(rules.backoff_ms.saturating_mul(factor));
    Some(wait.min(MAX_BACKOFF))
}

#[cfg(test)]
mod tests {
    use super::*;

    const RULES: RetryRules = RetryRules {
        max_retries: 3,
        backoff_ms: 100,
    };

    #[test]
    fn only_a_runtime_fault_with_an_idempotency_key_is_retried() {
        assert!(retry_delay("runtime_fault", 0, Some("k"), &RULES).is_some());
        assert_eq!(retry_delay("runtime_fault", 0, None, &RULES), None);
        assert_eq!(retry_delay("runtime_fault", 0, Some(""), &RULES), None);
        for status in [
            "task_error",
            "ok",
            "policy_denied",
            "capacity_exceeded",
            "suspected_escape",
            "sandbox_unavailable",
        ] {
            assert_eq!(retry_delay(status, 0, Some("k"), &RULES), None, "{status}");
        }
    }

    #[test]
    fn retries_are_bounded_and_back_off_exponentially() {
        let delays: Vec<_> = (0..5)
            .map(|n| retry_delay("runtime_fault", n, Some("k"), &RULES))
            .collect();
        let ms = |m| Some(Duration::from_millis(m));
        assert_eq!(delays, [ms(100), ms(200), ms(400), None, None]);
        let many = RetryRules {
            max_retries: 100,
            backoff_ms: 20_000,
        };
        assert_eq!(
            retry_delay("runtime_fault", 5, Some("k"), &many),
            None,
            "at most MAX_RETRIES"
        );
        assert_eq!(
            retry_delay("runtime_fault", 4, Some("k"), &many),
            Some(MAX_BACKOFF)
        );
    }

    #[test]
    fn a_class_without_retries_never_retries() {
        assert_eq!(
            retry_delay("runtime_fault", 0, Some("k"), &RetryRules::default()),
            None
        );
    }
}
