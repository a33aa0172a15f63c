//! A workload class: the contract template every request of the class starts from, the
//! bounds of what a request may ask for on top of it, whether the class runs code at all,
//! and its command policy. Written by the operator (trusted), never by the model.

use crate::command::CommandPolicy;
use airlock_contract::{Contract, Credential, Isolation};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// One workload class (docs/policy.md).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WorkloadClass {
    /// What the class is for, shown by `airlock class list`.
    pub description: String,
    /// The contract a request of this class gets when it asks for nothing (default: the
    /// default contract). Relative paths in it are relative to the file the class is
    /// defined in.
    #[serde(default = "airlock_contract::default_contract")]
    pub template: Contract,
    #[serde(default)]
    pub execution: Execution,
    #[serde(default)]
    pub bounds: ClassBounds,
    #[serde(default)]
    pub commands: CommandPolicy,
    #[serde(default)]
    pub approvals: ApprovalRules,
    /// Whether a `runtime_fault` is run again (only for a request with an idempotency
    /// key).
    #[serde(default)]
    pub retry: crate::retry::RetryRules,
    /// The permitted path `airlock verify --class` proves: a command (argv) that must
    /// succeed when requested of this class (docs/verify.md). Not serialised when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub smoke: Option<Vec<String>>,
    /// What a run of the class gets where no cgroup is delegated to its caller (an
    /// ordinary user without a delegated subtree).
    #[serde(default)]
    pub ceilings_without_cgroup: WithoutCgroup,
}

/// The operator's choice for a run that no cgroup can hold (docs/policy.md).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum WithoutCgroup {
    /// The run is refused (`sandbox_unavailable`, `cgroups.delegation`): the rule.
    #[default]
    Refuse,
    /// The ceilings are enforced by rlimits only (RLIMIT_AS per process, RLIMIT_NPROC per
    /// cell, RLIMIT_CPU per process, RLIMIT_FSIZE); the CPU rate, the memory of the cell
    /// as a whole and the usage counters are not, and the run's record says so
    /// (docs/threat-model.md).
    Rlimits,
}

/// Whether the class runs arbitrary code (a shell, an interpreter) or only its tools.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Execution {
    /// `false`: only the programs in `tools` may be the command (no shell, no
    /// interpreter); the command policy still applies to them.
    #[serde(default = "yes")]
    pub code: bool,
    /// The registered tools: exact argv[0] values (`/input/convert.sh`, `pandoc`).
    #[serde(default)]
    pub tools: Vec<String>,
}

impl Default for Execution {
    fn default() -> Self {
        Execution {
            code: true,
            tools: Vec::new(),
        }
    }
}

/// The most a request may ask for. A figure a request does not ask for stays the
/// template's; one it asks for may be anything up to the bound (a bound below the
/// template's own value caps nothing the template already has).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ClassBounds {
    pub max_memory_mb: Option<i64>,
    pub max_cpu_millis: Option<i64>,
    pub max_process_limit: Option<i64>,
    pub max_wall_time_seconds: Option<i64>,
    pub max_output_bytes: Option<i64>,
    /// Destinations (`host`, `host:port`, `*.domain[:port]`) a request may ask for on top
    /// of the template's allowlist; each one needs an approval. Anything else is denied.
    #[serde(default)]
    pub requestable_domains: Vec<String>,
    /// Credentials a request may ask for by name; each one needs an approval.
    #[serde(default)]
    pub requestable_credentials: Vec<Credential>,
    /// Host directories a request may mount read-only, and under which cell directory.
    #[serde(default)]
    pub input_roots: Vec<InputRoot>,
    #[serde(default)]
    pub session: SessionBounds,
    /// Whether files written in writable paths may be executed. `false` makes every
    /// writable path of the generated contract `exec: false`.
    #[serde(default = "yes")]
    pub exec_in_writable_paths: bool,
    /// Whether a request may ask for a terminal.
    #[serde(default)]
    pub tty: bool,
    /// The weakest isolation tier a run of the class may have: `gvisor` makes every run
    /// of the class a gVisor run whatever its template or request says (a request asking
    /// for `native` is denied, `policy.isolation_below_class`). A request may always ask
    /// for a stronger tier than the template's.
    #[serde(default, skip_serializing_if = "Isolation::is_native")]
    pub isolation: Isolation,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct InputRoot {
    /// Absolute host directory: a requested input's source must lie at or below it.
    pub host: String,
    /// Absolute cell directory: the input's target must lie at or below it.
    pub mount_under: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SessionBounds {
    #[serde(default)]
    pub allowed: bool,
    /// Longest lifetime a session of the class may have.
    #[serde(default)]
    pub max_lifetime_seconds: u64,
}

/// How long approvals wait and last for the class.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ApprovalRules {
    /// How long a request waits in `pending_approval` before it expires.
    #[serde(default = "default_pending_seconds")]
    pub pending_seconds: u64,
    /// The longest an approval scoped to the class's capability may last.
    #[serde(default = "default_max_grant_seconds")]
    pub max_grant_seconds: u64,
}

impl Default for ApprovalRules {
    fn default() -> Self {
        ApprovalRules {
            pending_seconds: default_pending_seconds(),
            max_grant_seconds: default_max_grant_seconds(),
        }
    }
}

fn yes() -> bool {
    true
}
fn default_pending_seconds() -> u64 {
    900
}
fn default_max_grant_seconds() -> u64 {
    8 * 3600
}

/// A class that cannot be used as written: the field and the rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClassProblem {
    pub field: String,
    pub rule: String,
}

impl std::fmt::Display for ClassProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.field, self.rule)
    }
}

impl WorkloadClass {
    /// Every problem of the class: its template breaks a contract rule, a rule's
    /// examples do not behave, an input root is not absolute, a bound is below 1.
    pub fn problems(&self) -> Vec<ClassProblem> {
        let mut problems = Vec::new();
        let mut push = |field: String, rule: String| problems.push(ClassProblem { field, rule });
        if let Err(err) = airlock_contract::validate_contract(&self.template) {
            push("template".into(), err.to_string());
        }
        for failure in self.commands.check_examples() {
            push("commands".into(), failure.to_string());
        }
        for (i, root) in self.bounds.input_roots.iter().enumerate() {
            for (name, path) in [("host", &root.host), ("mount_under", &root.mount_under)] {
                if crate::evaluate::normal_absolute(path).is_none() {
                    push(
                        format!("bounds.input_roots[{i}].{name}"),
                        "must be an absolute path without `.` or `..`".into(),
                    );
                }
            }
        }
        let b = &self.bounds;
        for (name, value) in [
            ("max_memory_mb", b.max_memory_mb),
            ("max_cpu_millis", b.max_cpu_millis),
            ("max_process_limit", b.max_process_limit),
            ("max_wall_time_seconds", b.max_wall_time_seconds),
            ("max_output_bytes", b.max_output_bytes),
        ] {
            if value.is_some_and(|v| v < 1) {
                push(format!("bounds.{name}"), "must be at least 1".into());
            }
        }
        if !self.execution.code && self.execution.tools.is_empty() {
            push(
                "execution.tools".into(),
                "a class without code execution needs at least one registered tool".into(),
            );
        }
        if self.retry.max_retries > crate::retry::MAX_RETRIES {
            push(
                "retry.max_retries".into(),
                format!("must be at most {}", crate::retry::MAX_RETRIES),
            );
        }
        if self.approvals.pending_seconds == 0 {
            push(
                "approvals.pending_seconds".into(),
                "must be at least 1".into(),
            );
        }
        problems
    }
}
