use airlock_cell::report::ResultClass;

/// What can go wrong in the engine itself (a run's own failures are its report's class).
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("audit store: {0}")]
    Store(#[from] airlock_store::StoreError),
    /// The run has no begin record, so it cannot be completed (nothing ran).
    #[error("the run has no audit record: {0}")]
    NotRecorded(String),
    #[error("cell factory: {context}: {source}")]
    Factory {
        context: String,
        source: std::io::Error,
    },
    #[error("cell factory: {0}")]
    FactoryProtocol(String),
}

impl EngineError {
    /// The result class of a run that failed this way.
    pub fn class(&self) -> ResultClass {
        match self {
            EngineError::Store(_)
            | EngineError::NotRecorded(_)
            | EngineError::Factory { .. }
            | EngineError::FactoryProtocol(_) => ResultClass::RuntimeFault,
        }
    }
}
