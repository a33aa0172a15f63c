//! airlock-engine: the run lifecycle under every front end (the CLI, the service, MCP,
//! the agent loop). A run goes plan -> audit begin record (fail closed) -> cell ->
//! supervision -> completion sequence -> final record -> result; refusals before any
//! cell are recorded too.
//!
//! Cells are cloned only by single-threaded processes: [`Engine::run_here`] by the
//! caller itself (the CLI, which is single-threaded), everything else by the cell
//! factory ([`factory`]), a small single-threaded process of the same binary that forks
//! one supervisor process per cell for a threaded caller.

pub mod egress_session;
pub mod factory;
pub mod host;
mod error;
pub mod inputs;
mod lifecycle;
pub mod record;

pub use error::EngineError;
pub use lifecycle::{FinishedRun, RecordedRefusal, Refusal, RunRequest};

use std::path::PathBuf;

/// What the engine needs of the operator's configuration.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// The audit store's directory.
    pub state_dir: PathBuf,
    /// The egress proxy's configuration (resolvers, host map, exempt CIDRs, ceilings).
    pub egress: airlock_egress::EgressConfig,
}

/// The run lifecycle. One engine per process; shared by reference between threads.
pub struct Engine {
    config: EngineConfig,
}

impl Engine {
    pub fn new(config: EngineConfig) -> Engine {
        Engine { config }
    }

    pub fn config(&self) -> &EngineConfig {
        &self.config
    }
}
