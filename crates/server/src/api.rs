//! The request and response bodies of the `/v1` API (docs/openapi.json is generated from
//! these types).

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// `POST /v1/runs`: what to run and under which contract.
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RunBody {
    /// A contract of the service's configuration (`[server.contracts]`), by name: the
    /// run's workload class.
    #[serde(default)]
    pub contract: Option<String>,
    /// A contract in JSON (only tenants with `inline_contracts`).
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub contract_inline: Option<serde_json::Value>,
    pub argv: Vec<String>,
    /// Added to the contract's environment.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// The payload's stdin, whole (none: `/dev/null`).
    #[serde(default)]
    pub stdin: Option<String>,
    /// Shortens the contract's wall-time deadline, milliseconds.
    #[serde(default)]
    pub deadline_ms: Option<u64>,
    /// A workload class of the operator's policy (docs/policy.md) instead of a contract:
    /// the contract is generated from the class for `request`, or the request is denied
    /// (403 with its `policy.*` code) or waits for an approval (202 with its id).
    #[serde(default)]
    pub class: Option<String>,
    /// With `class`: the capabilities asked for on top of the class's template
    /// (docs/request.schema.json).
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub request: Option<airlock_policy::Asked>,
    /// With `class`: the approval (its id) of exactly this request, once decided.
    #[serde(default)]
    pub approval: Option<String>,
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct WaitQuery {
    /// Answer with the record only, once the run ended (no NDJSON stream).
    #[serde(default)]
    pub wait: bool,
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct RunsQuery {
    /// Workload class (the contract's name).
    pub class: Option<String>,
    /// `running`, `ok`, `task_error`, `aborted`, ...
    pub status: Option<String>,
    /// Runs started at or after this unix time, milliseconds.
    pub since: Option<i64>,
    /// At most this many (default 100, at most 1000: more is 400 `query.invalid`; a page
    /// also ends before its JSON passes 1 MiB).
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<usize>,
    /// The `next_cursor` of the previous page.
    pub cursor: Option<String>,
}

/// A page of a list: at most `limit` items (default 100, at most 1000) and 1 MiB of
/// JSON (unless its one item is larger); `cursor` is the previous page's `next_cursor`.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct PageQuery {
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<usize>,
    pub cursor: Option<String>,
}

/// A run as stored, with its audit entries.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct RunView {
    #[schema(value_type = Object)]
    pub run: airlock_store::RunRecord,
    #[schema(value_type = Vec<Object>)]
    pub events: Vec<airlock_store::AuditEntry>,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct RunList {
    #[schema(value_type = Vec<Object>)]
    pub runs: Vec<airlock_store::RunRecord>,
    /// Present when there are more: pass it as `cursor` for the next page.
    pub next_cursor: Option<String>,
}

/// `POST /v1/sessions`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SessionBody {
    #[serde(default)]
    pub contract: Option<String>,
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub contract_inline: Option<serde_json::Value>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Closed after this long without a command, seconds (at most the service's maximum).
    #[serde(default)]
    pub idle_timeout_s: Option<u64>,
    /// Closed this long after it opened, seconds (at most the service's maximum, and
    /// at most the class's for a class session).
    #[serde(default)]
    pub max_lifetime_s: Option<u64>,
    /// A workload class of the operator's policy (docs/policy.md) instead of a contract:
    /// the session's contract is generated from the class for `request` (denied: 403
    /// with its `policy.*` code; needing approval: 202 with its id). Each command is
    /// checked against the class's command policy, and the session's destinations may
    /// change within the class (`POST /v1/sessions/{id}/network`).
    #[serde(default)]
    pub class: Option<String>,
    /// With `class`: the capabilities asked for (docs/request.schema.json).
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub request: Option<airlock_policy::Asked>,
    /// With `class`: the approval (its id) of exactly this request, once decided.
    #[serde(default)]
    pub approval: Option<String>,
}

/// `POST /v1/sessions/{id}/network`: a change of a class session's destinations.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NetworkBody {
    /// Destinations to allow for new connections (`host`, `host:port`, `*.apex[:port]`).
    #[serde(default)]
    pub add: Vec<String>,
    /// Destinations to refuse for new connections (open ones may finish).
    #[serde(default)]
    pub remove: Vec<String>,
    /// The approval (its id) of exactly this change, once decided.
    #[serde(default)]
    pub approval: Option<String>,
}

/// A class session's destinations, as its egress proxy allows them now.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct NetworkView {
    pub session_id: String,
    pub allowed_domains: Vec<String>,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct SessionView {
    pub session_id: String,
    pub tenant: String,
    pub workload_class: String,
    pub idle_timeout_s: u64,
    pub max_lifetime_s: u64,
    /// The cell paths files may be written to and read from.
    pub writable_paths: Vec<String>,
    pub commands: Vec<CommandView>,
    /// A class session's destinations now (none for a contract's session).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allowed_domains: Option<Vec<String>>,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct SessionList {
    pub sessions: Vec<SessionView>,
    /// Present when there are more: pass it as `cursor` for the next page.
    pub next_cursor: Option<String>,
}

/// `POST /v1/sessions/{id}/exec`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ExecBody {
    pub argv: Vec<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    #[serde(default)]
    pub stdin: Option<String>,
    #[serde(default)]
    pub deadline_ms: Option<u64>,
    /// Answer at once with the command's id instead of streaming it.
    #[serde(default)]
    pub background: bool,
}

#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct CommandView {
    pub command_id: u64,
    pub run_id: String,
    pub argv: Vec<String>,
    pub running: bool,
    /// The command's record, once it ended.
    #[schema(value_type = Option<Object>)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub record: Option<serde_json::Value>,
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct FollowQuery {
    /// Keep streaming until the command ends.
    #[serde(default)]
    pub follow: bool,
}

/// `POST .../commands/{cid}/signal`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SignalBody {
    /// The signal for the command's process group: `HUP`, `INT`, `QUIT`, `KILL`, `USR1`,
    /// `USR2`, `TERM`, `CONT` or `STOP` (with or without `SIG`).
    pub signal: String,
}

/// `POST .../timeout`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TimeoutBody {
    pub idle_timeout_s: u64,
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct DirQuery {
    /// A directory within the session's writable paths.
    pub dir: String,
    /// At most this many entries (default 100, at most 1000; a page also ends before
    /// its JSON passes 1 MiB), by name.
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<usize>,
    /// The `next_cursor` of the previous page.
    pub cursor: Option<String>,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct DirEntry {
    pub name: String,
    /// `file`, `dir`, `symlink` or `other`.
    pub kind: String,
    pub size: u64,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct DirList {
    pub dir: String,
    pub entries: Vec<DirEntry>,
    /// Present when there are more: pass it as `cursor` for the next page.
    pub next_cursor: Option<String>,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Written {
    pub path: String,
    pub bytes: u64,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Verified {
    pub ok: bool,
    /// `fleet` (the operator: every run) or `tenant` (the caller's own runs).
    pub scope: String,
    pub entries: u64,
    pub runs: u64,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Health {
    pub ok: bool,
    pub detail: String,
}
