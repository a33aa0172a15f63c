use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum BrokerError {
    /// An action of the operator's `[broker]` that cannot be served as written.
    #[error("broker.actions.{action}: {why}")]
    Action { action: String, why: String },
    #[error("broker socket: {what} {}: {source}", path.display())]
    Socket {
        what: String,
        path: PathBuf,
        source: std::io::Error,
    },
}
