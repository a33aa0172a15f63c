use std::path::PathBuf;

/// Everything that can go wrong in the agent crate before or around a tool's cell.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("tools: reading {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("tools: {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("tools.{tool}: {message}")]
    Tool { tool: String, message: String },
    #[error("tools.{tool}.{field}: {message}")]
    Schema {
        tool: String,
        field: &'static str,
        message: String,
    },
    #[error("no tool named {0:?} in the registry")]
    UnknownTool(String),
    #[error("engine: {0}")]
    Engine(#[from] airlock_engine::EngineError),
    #[error("audit store: {0}")]
    Store(#[from] airlock_store::StoreError),
    #[error("agent: {0}")]
    Agent(String),
    /// The service refused the caller's work (a quota, a drain) before any cell.
    #[error("{reason}: {message}")]
    Refused {
        class: airlock_cell::report::ResultClass,
        reason: String,
        message: String,
    },
    #[error("model endpoint: {0}")]
    Model(String),
}
