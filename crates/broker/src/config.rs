//! The operator's `[broker]` section (docs/credentials.md, "The broker"): the actions a
//! cell may ask the trusted side to perform. Trusted: it comes from whoever runs airlock,
//! never from a contract or a cell.

use schemars::JsonSchema;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::PathBuf;

/// `[broker]`: the actions by name.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct BrokerConfig {
    /// `[broker.actions.NAME]`: what a cell may ask for, who may ask, and who does it.
    pub actions: BTreeMap<String, ActionConfig>,
}

/// One brokered action.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ActionConfig {
    /// What the action does (shown to whoever writes the payload).
    pub description: String,
    /// JSON Schema every request must match (an object schema; only local `#...`
    /// references, nothing is ever fetched).
    pub schema: serde_json::Value,
    /// Workload classes (`airlock run --class NAME`) whose runs may use the action.
    #[serde(default)]
    pub classes: Vec<String>,
    /// Whether a run made from a contract file (no class) may use the action. Off by
    /// default: whoever writes a contract chooses its class label, so only a class grant
    /// is an authorization of its own.
    #[serde(default)]
    pub contract: bool,
    /// Service tenants whose runs may use the action; empty: any tenant, and the command
    /// line.
    #[serde(default)]
    pub tenants: Vec<String>,
    /// Largest request (the whole JSON line the cell sends), bytes.
    #[serde(default = "default_max_request_bytes")]
    pub max_request_bytes: u64,
    pub handler: HandlerConfig,
}

fn default_max_request_bytes() -> u64 {
    1 << 20
}

/// Who performs a granted request: a built-in handler or an operator command.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, tag = "kind", rename_all = "snake_case")]
pub enum HandlerConfig {
    /// Writes the request's payload as a file of `directory`.
    StoreArtifact(StoreArtifactConfig),
    /// Runs an operator command outside any cell with the validated request on stdin.
    Command(CommandConfig),
}

/// The built-in `store_artifact` handler.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StoreArtifactConfig {
    /// Absolute directory the files are written to (it must exist).
    pub directory: PathBuf,
    /// The request's string field naming the file.
    #[serde(default = "default_name_field")]
    pub name_field: String,
    /// An optional string field naming a sub-directory (created when missing): the file
    /// lands in `directory/<group>/<name>`; validated like the name.
    #[serde(default)]
    pub group_field: Option<String>,
    /// The request's string field holding the content.
    #[serde(default = "default_content_field")]
    pub content_field: String,
    /// How the content is written in the request.
    #[serde(default)]
    pub encoding: ContentEncoding,
    /// Largest content (decoded), bytes.
    #[serde(default = "default_max_bytes")]
    pub max_bytes: u64,
    /// Whether an existing file of the same name is replaced; off: the request is
    /// refused with `broker.exists`.
    #[serde(default)]
    pub overwrite: bool,
}

fn default_name_field() -> String {
    "name".to_string()
}
fn default_content_field() -> String {
    "content".to_string()
}
fn default_max_bytes() -> u64 {
    16 << 20
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ContentEncoding {
    /// Standard base64 with padding.
    #[default]
    Base64,
    /// The string's UTF-8 bytes as they are.
    Text,
}

/// The `command` handler.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CommandConfig {
    /// argv; argv[0] an absolute path (no shell, no `PATH` lookup).
    pub argv: Vec<String>,
    /// The command's whole environment (nothing of airlock's is inherited but `PATH`):
    /// literal values.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Variables of airlock's own environment passed on to the command (a credential the
    /// operator keeps out of the configuration file). Unset: the request is refused.
    #[serde(default)]
    pub env_from: Vec<String>,
    /// The command's deadline; it is killed past it.
    #[serde(default = "default_timeout_seconds")]
    pub timeout_seconds: u64,
    /// Most bytes of the command's stdout handed back to the cell.
    #[serde(default = "default_max_output_bytes")]
    pub max_output_bytes: u64,
}

fn default_timeout_seconds() -> u64 {
    30
}
fn default_max_output_bytes() -> u64 {
    64 << 10
}
