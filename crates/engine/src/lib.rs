//! airlock-engine: the run lifecycle under every front end (the CLI, the service, MCP,
//! the agent loop). A run goes plan -> audit begin record (fail closed) -> cell ->
//! supervision -> completion sequence -> final record -> result; refusals before any
//! cell are recorded too.
//!
//! Cells are cloned only by single-threaded processes: [`Engine::run_here`] by the
//! caller itself (the CLI, which is single-threaded), everything else by the cell
//! factory ([`factory`]), a small single-threaded process of the same binary that forks
//! one supervisor process per cell for a threaded caller.

mod backend;
mod broker_session;
pub mod caller;
mod cells;
pub mod egress_session;
mod error;
pub mod factory;
pub mod handoff;
pub mod host;
pub mod inputs;
mod lifecycle;
mod pool;
pub mod record;
mod session;
mod stores;

pub use caller::Caller;
pub use error::EngineError;
pub use lifecycle::{
    BeginFailed, CommandLatency, FinishedRun, RecordedHook, RecordedRefusal, Refusal, RunRequest,
};
pub use pool::{PlanShape, PoolRefill, PoolStatus};
pub use session::{
    AfterClose, CommandRequest, CommandStatus, Session, SessionRequest, OPERATOR_ENDED,
};

use factory::CellFactory;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

/// What the engine needs of the operator's configuration.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// The audit store's directory.
    pub state_dir: PathBuf,
    /// A fleet's Postgres database for runs and the audit chain (`[store] url`) and this
    /// node's name in it (`[store] node`); `None`: they are in the state directory's
    /// SQLite file.
    pub store_postgres: Option<airlock_store::FleetStore>,
    /// The bound of the finish spool (`[store] spool_max_files`).
    pub store_spool_max_files: usize,
    /// The egress proxy's configuration (resolvers, host map, exempt CIDRs, ceilings).
    pub egress: airlock_egress::EgressConfig,
    /// The binary started as the cell factory (it calls
    /// [`factory::run_factory_if_requested`] first thing in `main`); usually this one.
    pub program: PathBuf,
    /// Most cells alive at once, parked ones included; a run beyond it is refused with
    /// `capacity_exceeded`.
    pub max_cells: usize,
    /// Where each cell's own host uid and gid come from, as root (`[host_ids]`).
    pub host_ids: airlock_cell::host_identity::HostIdRange,
    /// The operator's broker actions (`[broker]`), checked and compiled.
    pub broker: Arc<airlock_broker::Broker>,
    /// The most bytes of a suspected escape's writable paths kept in the quarantine area
    /// (`<state dir>/quarantine`); 0 keeps none.
    pub quarantine_max_bytes: u64,
    /// The supervisor's variables no credential may read, and the classes' lifts
    /// (`[credentials]`, docs/credentials.md); every run and session is decided by it.
    pub credential_rules: airlock_contract::CredentialRules,
}

impl EngineConfig {
    /// Where runs and the audit chain are written (and read).
    pub fn store_location(&self) -> airlock_store::StoreLocation {
        airlock_store::StoreLocation {
            state_dir: self.state_dir.clone(),
            postgres: self.store_postgres.clone(),
            spool_max_files: self.store_spool_max_files,
        }
    }
}

/// The quarantine area, under the state directory (root-only, 0700).
pub const QUARANTINE_DIR: &str = "quarantine";

impl EngineConfig {
    /// The defaults for a state directory and an egress configuration: this binary as the
    /// factory, at most 64 cells.
    pub fn new(state_dir: PathBuf, egress: airlock_egress::EgressConfig) -> EngineConfig {
        EngineConfig {
            state_dir,
            store_postgres: None,
            store_spool_max_files: airlock_store::spool::DEFAULT_MAX_FILES,
            egress,
            program: std::env::current_exe().unwrap_or_else(|_| PathBuf::from("/proc/self/exe")),
            max_cells: 64,
            host_ids: Default::default(),
            broker: Arc::new(airlock_broker::Broker::default()),
            quarantine_max_bytes: 64 << 20,
            credential_rules: airlock_contract::CredentialRules::with_model_keys(
                Vec::<String>::new(),
            ),
        }
    }
}

/// The run lifecycle. One engine per process; shared by reference between threads.
pub struct Engine {
    config: EngineConfig,
    /// Started on the first run, session or pool that needs it.
    factory: OnceLock<Result<Arc<CellFactory>, String>>,
    /// Cells alive now, of either tier: counted against `max_cells`.
    live: Arc<std::sync::atomic::AtomicUsize>,
    pools: pool::Pools,
    stores: Arc<stores::StorePool>,
}

impl Engine {
    pub fn new(config: EngineConfig) -> Engine {
        Engine {
            stores: Arc::new(stores::StorePool::new(config.store_location())),
            config,
            factory: OnceLock::new(),
            live: Arc::default(),
            pools: pool::Pools::default(),
        }
    }

    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    /// Which credentials a cell of `workload_class` may receive from `plan`
    /// ([`airlock_contract::decide_credentials`] under the operator's rules): the engine
    /// decides every run and session with it, and a door calls it before it reads any
    /// value from its environment.
    pub fn decide_credentials(
        &self,
        plan: &airlock_contract::CellPlan,
        workload_class: &str,
    ) -> Result<Vec<airlock_contract::LiftedCredential>, airlock_contract::CredentialForbidden>
    {
        airlock_contract::decide_credentials(
            &plan.credentials,
            &self.config.credential_rules,
            workload_class,
        )
    }

    /// Keeps `size` warm cells of `template`'s shape (its command is ignored) parked for
    /// [`Engine::run`]; 0 removes the pool.
    pub fn keep_warm(
        &self,
        template: airlock_contract::CellPlan,
        size: usize,
    ) -> Result<(), EngineError> {
        let factory = self.factory()?;
        self.pools
            .keep(factory, self.evidence_area(), template, size);
        Ok(())
    }

    /// For a long-lived threaded caller (the service): the audit store's WAL is
    /// checkpointed by a thread of the engine's instead of inside whichever record's
    /// commit crosses the threshold (see stores.rs).
    pub fn checkpoint_in_background(&self) -> Result<(), EngineError> {
        self.stores.checkpoint_in_background()
    }

    /// For a long-lived threaded caller (the service): finishes spooled while the store
    /// was unavailable are written by a thread of the engine's once it is back.
    pub fn replay_spool_in_background(&self) -> Result<(), EngineError> {
        self.stores.replay_in_background()
    }

    /// Whether the audit store answers now (a probe reused for a second: `/readyz`).
    pub fn store_health(&self) -> Result<(), String> {
        self.stores.health()
    }

    /// The pools and their parked cells.
    pub fn pool_status(&self) -> Vec<PoolStatus> {
        self.pools.status()
    }

    /// The factory process's pid, once it is started.
    pub fn factory_pid(&self) -> Option<u32> {
        match self.factory.get() {
            Some(Ok(factory)) => Some(factory.pid()),
            _ => None,
        }
    }

    /// Cells alive now (parked, running, or in a session).
    pub fn live_cells(&self) -> usize {
        self.live.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl Drop for Engine {
    /// Parked cells are destroyed, then the factory kills whatever else it forked.
    fn drop(&mut self) {
        self.pools.shut_down();
    }
}
