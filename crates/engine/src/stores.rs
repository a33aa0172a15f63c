//! Connections to the audit store, kept open between runs. Opening one checks the state
//! directory, reads the schema and marks runs of dead supervisors aborted: milliseconds
//! that a warm run's budget (well under one) cannot pay per record. A connection serves
//! one thread at a time, so idle ones wait here.

use crate::EngineError;
use airlock_store::Store;
use std::path::PathBuf;
use std::sync::Mutex;

/// Idle connections kept at most; more threads than this open (and then close) their own.
const MAX_IDLE: usize = 32;

pub(crate) struct StorePool {
    state_dir: PathBuf,
    idle: Mutex<Vec<Store>>,
}

impl StorePool {
    pub fn new(state_dir: PathBuf) -> StorePool {
        StorePool {
            state_dir,
            idle: Mutex::new(Vec::new()),
        }
    }

    /// An open connection: an idle one, or a new one (the state directory is checked and
    /// runs of dead supervisors are marked aborted, as every opening does).
    pub fn take(&self) -> Result<Store, EngineError> {
        let idle = self.idle.lock().unwrap_or_else(|p| p.into_inner()).pop();
        match idle {
            Some(store) => Ok(store),
            None => {
                let store = Store::open(&self.state_dir)?;
                // A failure here loses nothing of this run; the next opening retries it.
                let _ = store.reap_aborted();
                Ok(store)
            }
        }
    }

    pub fn give_back(&self, store: Store) {
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        if idle.len() < MAX_IDLE {
            idle.push(store);
        }
    }
}
