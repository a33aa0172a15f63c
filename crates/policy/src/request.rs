//! What a request may ask for on top of its class's template. Strict: a field that is not
//! here (cleanup, mounts of its own choosing, seccomp, the contract itself) is a parse
//! error, so a request cannot set its own limits or disable a control.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The capabilities a request asks for (`--request req.json`); everything optional.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Asked {
    /// Destinations to reach on top of the template's (`host`, `host:port`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub domains: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_mb: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_millis: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub process_limit: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wall_time_seconds: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_bytes: Option<i64>,
    /// Credentials of the class's `requestable_credentials`, by name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub credentials: Vec<String>,
    /// Host paths to mount read-only, each within one of the class's input roots.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub inputs: Vec<AskedInput>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub tty: bool,
    /// The isolation tier asked for; it may raise the class's, never lower it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub isolation: Option<airlock_contract::Isolation>,
    /// Ask that files written in writable paths may be executed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exec_in_writable_paths: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<AskedSession>,
    /// Says that running this request twice is harmless: only then may a
    /// `runtime_fault` be retried (the class's `retry`). Not a capability.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AskedInput {
    /// Absolute host path.
    pub source: String,
    /// Absolute path in the cell.
    pub target: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AskedSession {
    pub lifetime_seconds: u64,
}

impl Asked {
    /// Parses a request document (JSON).
    pub fn from_json(text: &str) -> Result<Asked, crate::PolicyError> {
        serde_json::from_str(text).map_err(|err| crate::PolicyError::Request(err.to_string()))
    }
}
