use airlock_cell::report::ResultClass;

/// What can go wrong in the engine itself (a run's own failures are its report's class).
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("audit store: {0}")]
    Store(#[from] airlock_store::StoreError),
    /// The run has no begin record, so it cannot be completed (nothing ran).
    #[error("the run has no audit record: {0}")]
    NotRecorded(String),
    /// As [`EngineError::NotRecorded`], because the store cannot be reached now.
    #[error("the audit store is unavailable, nothing ran: {0}")]
    StoreUnavailable(String),
    #[error("cell factory: {context}: {source}")]
    Factory {
        context: String,
        source: std::io::Error,
    },
    #[error("cell factory: {0}")]
    FactoryProtocol(String),
    /// Every cell the engine may keep alive (`max_cells`, parked ones included) is.
    #[error("engine.capacity: all {max_cells} cells this engine may keep alive are in use")]
    Capacity { max_cells: usize },
    #[error("the session's cell could not be built: {0}")]
    SessionFailed(String),
    #[error("the session is closed")]
    SessionClosed,
    #[error("the session has no command {0}")]
    NoSuchCommand(u64),
    /// The session's destinations could not be replaced (its cell has no egress proxy):
    /// nothing changed.
    #[error("the session's destinations were not changed: {0}")]
    DestinationsNotSet(String),
    /// A command no cell may be sent ([`airlock_contract::check_exec`]): nothing ran.
    #[error("{0}")]
    CommandRefused(#[from] airlock_contract::CommandInputError),
    /// A credential reads a variable the operator forbids in cells
    /// ([`airlock_contract::decide_credentials`]): nothing ran.
    #[error("{0}")]
    CredentialForbidden(#[from] airlock_contract::CredentialForbidden),
}

impl EngineError {
    /// The result class of a run that failed this way.
    pub fn class(&self) -> ResultClass {
        match self {
            EngineError::Store(e) if e.is_unavailable() => ResultClass::StoreUnavailable,
            EngineError::StoreUnavailable(_) => ResultClass::StoreUnavailable,
            EngineError::Store(_)
            | EngineError::NotRecorded(_)
            | EngineError::Factory { .. }
            | EngineError::FactoryProtocol(_) => ResultClass::RuntimeFault,
            EngineError::Capacity { .. } => ResultClass::CapacityExceeded,
            EngineError::SessionFailed(_)
            | EngineError::SessionClosed
            | EngineError::NoSuchCommand(_) => ResultClass::RuntimeFault,
            EngineError::DestinationsNotSet(_)
            | EngineError::CommandRefused(_)
            | EngineError::CredentialForbidden(_) => ResultClass::PolicyDenied,
        }
    }
}
