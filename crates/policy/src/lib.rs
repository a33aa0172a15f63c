//! airlock-policy: the trusted layer between a request and a contract. The model asks
//! (a class name, a command, capabilities); the operator's workload classes decide:
//! granted (the contract is generated from the class's template), denied (a stable reason
//! code), or needs approval. Pure: no I/O, no clock; the binary loads the files, keeps
//! the approvals and runs the cell.
//!
//! This is a convenience in front of the boundary, not the boundary: what contains a
//! command is its cell (namespaces, seccomp, Landlock, cgroups, the egress proxy). The
//! command policy in particular only sees argv and the scripts it can parse
//! (docs/policy.md).

pub mod approval;
mod class;
pub mod command;
mod evaluate;
pub mod lockfile;
mod network;
mod reason;
mod request;
pub mod retry;
pub mod shell;

pub use class::{
    ApprovalRules, ClassBounds, ClassProblem, Execution, InputRoot, SessionBounds, WithoutCgroup,
    WorkloadClass,
};
pub use command::{CommandPolicy, CommandRule, CommandVerdict, Decision, Fallback, PatternToken};
pub use evaluate::{
    check_session_command, domain_within, evaluate, evaluate_session, normal_absolute,
    ApprovalItem, Evaluation, Granted,
};
pub use network::{destination_rules, evaluate_network_change, NetworkChange, NetworkEvaluation};
pub use reason::{Denial, DenyReason};
pub use request::{Asked, AskedInput, AskedSession};

use schemars::JsonSchema;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    #[error("class {name}: {problems}")]
    Class { name: String, problems: String },
    #[error("class {name}: {message}")]
    ClassSyntax { name: String, message: String },
    #[error("request: {0}")]
    Request(String),
    #[error("approver {0:?}: an identity is `uid:N` or `tenant:NAME`")]
    Approver(String),
}

/// The operator config's `[policy]` table.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct PolicyConfig {
    /// A directory of class files, one per class: `NAME.toml` holds the class `NAME`.
    pub classes_dir: Option<PathBuf>,
    /// Classes defined in the configuration itself (`[policy.classes.NAME]`).
    pub classes: BTreeMap<String, WorkloadClass>,
    /// Who may decide approvals: `uid:N` (a local operator, as `airlock approvals` sees
    /// it) or `tenant:NAME` (an identity the service authenticated). Nobody may decide a
    /// request of their own identity.
    pub approvers: Vec<String>,
    /// The most bytes of a suspected escape's writable paths copied into the quarantine
    /// area before its cell is destroyed (default 64 MiB; 0 copies none). The copy stops
    /// at the cap and its manifest says so.
    #[serde(default = "default_quarantine_max_bytes")]
    pub quarantine_max_bytes: u64,
}

fn default_quarantine_max_bytes() -> u64 {
    64 << 20
}

impl Default for PolicyConfig {
    fn default() -> Self {
        PolicyConfig {
            classes_dir: None,
            classes: BTreeMap::new(),
            approvers: Vec::new(),
            quarantine_max_bytes: default_quarantine_max_bytes(),
        }
    }
}

impl PolicyConfig {
    /// Every problem of the configured classes and approvers.
    pub fn check(&self) -> Result<(), PolicyError> {
        for approver in &self.approvers {
            approval::Identity::parse(approver)?;
        }
        self.classes
            .iter()
            .try_for_each(|(name, class)| check_class(name, class))
    }
}

/// Parses one class file (TOML: the body of a class).
pub fn parse_class(name: &str, text: &str) -> Result<WorkloadClass, PolicyError> {
    let class: WorkloadClass = toml::from_str(text).map_err(|err| PolicyError::ClassSyntax {
        name: name.to_string(),
        message: err.to_string().trim_end().to_string(),
    })?;
    check_class(name, &class)?;
    Ok(class)
}

/// A class name: what `--class` and file names carry.
pub fn valid_class_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
}

fn check_class(name: &str, class: &WorkloadClass) -> Result<(), PolicyError> {
    let mut problems: Vec<String> = class.problems().iter().map(ToString::to_string).collect();
    if !valid_class_name(name) {
        problems.insert(0, "the name must be 1-64 of [a-z0-9_-]".to_string());
    }
    if problems.is_empty() {
        return Ok(());
    }
    Err(PolicyError::Class {
        name: name.to_string(),
        problems: problems.join("; "),
    })
}

/// JSON Schema of one class file (docs/class.schema.json).
pub fn class_json_schema() -> serde_json::Value {
    serde_json::to_value(schemars::schema_for!(WorkloadClass))
        .expect("a generated schema serialises")
}

/// JSON Schema of a request document (docs/request.schema.json).
pub fn request_json_schema() -> serde_json::Value {
    serde_json::to_value(schemars::schema_for!(Asked)).expect("a generated schema serialises")
}

#[cfg(test)]
mod tests;
