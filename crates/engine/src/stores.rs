//! Connections to the audit store, kept open between runs. Opening one checks the state
//! directory, reads the schema and marks runs of dead supervisors aborted: milliseconds
//! that a warm run's budget (well under one) cannot pay per record. A connection serves
//! one thread at a time, so idle ones wait here.

use crate::EngineError;
use airlock_store::{Replayed, Spool, Store, StoreLocation};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

/// Idle connections kept at most; more threads than this open (and then close) their own.
const MAX_IDLE: usize = 32;
/// How often the background checkpointer copies the WAL into the database (see
/// [`StorePool::checkpoint_in_background`]). At 200 runs a second (about 9 pages each)
/// the WAL stays under 500 pages.
const CHECKPOINT_INTERVAL: Duration = Duration::from_millis(250);
/// How often the replay thread looks for spooled finishes to write (see
/// [`StorePool::replay_in_background`]).
const REPLAY_INTERVAL: Duration = Duration::from_millis(500);
/// How long one probe of the store's health is reused ([`StorePool::health`]): however
/// often `/readyz` is asked, the store sees at most one probe per this interval.
const HEALTH_TTL: Duration = Duration::from_secs(1);

pub(crate) struct StorePool {
    location: StoreLocation,
    idle: Mutex<Vec<Store>>,
    /// Connections leave their checkpoints to the background thread.
    background_checkpoints: AtomicBool,
    /// The last probe of [`StorePool::health`] and when it was made.
    health: Mutex<Option<(Instant, Result<(), String>)>>,
    replaying: AtomicBool,
}

impl StorePool {
    pub fn new(location: StoreLocation) -> StorePool {
        StorePool {
            location,
            idle: Mutex::new(Vec::new()),
            background_checkpoints: AtomicBool::new(false),
            health: Mutex::new(None),
            replaying: AtomicBool::new(false),
        }
    }

    /// Whether the store answers: one cheap round trip on a pooled connection (which
    /// reconnects a lost one, within its backoff), reused for [`HEALTH_TTL`]. Concurrent
    /// callers wait for the one probe in progress instead of making their own.
    pub fn health(&self) -> Result<(), String> {
        let mut cached = self.health.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((at, result)) = cached.as_ref() {
            if at.elapsed() < HEALTH_TTL {
                return result.clone();
            }
        }
        let probed = self.take().map_err(|e| e.to_string()).and_then(|store| {
            let pinged = store.ping().map_err(|e| e.to_string());
            self.give_back(store);
            pinged
        });
        *cached = Some((Instant::now(), probed.clone()));
        probed
    }

    /// From now on a thread of this process writes the spool's pending finishes into the
    /// store once it is back (checked every [`REPLAY_INTERVAL`], in spooled order). The
    /// thread ends with the pool. Only for a threaded caller (the service).
    pub fn replay_in_background(self: &Arc<Self>) -> Result<(), EngineError> {
        if self.replaying.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        let pool = Arc::downgrade(self);
        std::thread::Builder::new()
            .name("store-spool".into())
            .spawn(move || replay_until_gone(&pool, REPLAY_INTERVAL))
            .map_err(|source| EngineError::Factory {
                context: "the store's spool replay thread".into(),
                source,
            })?;
        Ok(())
    }

    /// Writes what the spool holds, if anything, and logs what it did.
    fn replay_once(&self) {
        let spool = Spool::new(&self.location.state_dir, self.location.spool_max_files);
        if spool.is_empty() {
            return;
        }
        // Opening a new connection replays too (reap_aborted), before it reaps.
        let Ok(store) = self.take() else { return };
        match store.replay_spool() {
            Ok(done) if done != Replayed::default() => eprintln!(
                "airlock: audit store is back: {} spooled finish(es) written, {} already \
                 written{}",
                done.written,
                done.already,
                if done.lost.is_empty() {
                    String::new()
                } else {
                    format!(", LOST (run ended otherwise): {}", done.lost.join(", "))
                }
            ),
            Ok(_) => {}
            Err(err) if err.is_unavailable() => {}
            Err(err) => eprintln!("airlock: replaying the finish spool: {err}"),
        }
        self.give_back(store);
    }

    /// An open connection: an idle one, or a new one (the state directory is checked and
    /// runs of dead supervisors are marked aborted, as every opening does).
    pub fn take(&self) -> Result<Store, EngineError> {
        let idle = self.idle.lock().unwrap_or_else(|p| p.into_inner()).pop();
        match idle {
            Some(store) => Ok(store),
            None => {
                let store = Store::open_at(&self.location)?;
                // A failure here loses nothing of this run; the next opening retries it.
                let _ = store.reap_aborted();
                if self.background_checkpoints.load(Ordering::Acquire) {
                    store.leave_checkpoints_to_caller()?;
                }
                Ok(store)
            }
        }
    }

    /// From now on the WAL is checkpointed by a thread of this process every
    /// [`CHECKPOINT_INTERVAL`], not inside a record's commit: a checkpoint's two fsyncs
    /// (10-20 ms on this project's VM) then never delay a run. The thread ends with the
    /// pool. Only for a threaded caller: the CLI's runs clone from a single thread.
    pub fn checkpoint_in_background(self: &Arc<Self>) -> Result<(), EngineError> {
        self.checkpoint_every(CHECKPOINT_INTERVAL)
    }

    fn checkpoint_every(self: &Arc<Self>, interval: Duration) -> Result<(), EngineError> {
        if self.background_checkpoints.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        for store in self.idle.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            store.leave_checkpoints_to_caller()?;
        }
        // The local file's WAL: with a fleet store it holds the node's own data only, and
        // Postgres checkpoints itself.
        let checkpointer = Store::open(&self.location.state_dir)?;
        checkpointer.leave_checkpoints_to_caller()?;
        let pool = Arc::downgrade(self);
        std::thread::Builder::new()
            .name("store-checkpoint".into())
            .spawn(move || checkpoint_until_gone(&pool, &checkpointer, interval))
            .map_err(|source| EngineError::Factory {
                context: "the store's checkpoint thread".into(),
                source,
            })?;
        Ok(())
    }

    pub fn give_back(&self, store: Store) {
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        if idle.len() < MAX_IDLE {
            idle.push(store);
        }
    }
}

fn replay_until_gone(pool: &Weak<StorePool>, interval: Duration) {
    loop {
        std::thread::sleep(interval);
        let Some(pool) = pool.upgrade() else { return };
        pool.replay_once();
    }
}

fn checkpoint_until_gone(pool: &Weak<StorePool>, checkpointer: &Store, interval: Duration) {
    while pool.strong_count() > 0 {
        std::thread::sleep(interval);
        // A failed checkpoint loses nothing: the frames stay in the WAL for the next one.
        let _ = checkpointer.checkpoint_passive();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use airlock_store::{RunEnd, RunStart};

    /// A pool checkpointed every `interval`, its database file's size, and the same
    /// after 40 records of ~6 KB written through one of its connections.
    fn forty_records(interval: Duration) -> (tempfile::TempDir, u64, u64) {
        let dir = tempfile::tempdir().unwrap();
        let pool = Arc::new(StorePool::new(StoreLocation::local(dir.path())));
        pool.checkpoint_every(interval).unwrap();
        let store = pool.take().unwrap();
        let size = || {
            std::fs::metadata(dir.path().join(airlock_store::DB_FILE))
                .unwrap()
                .len()
        };
        let before = size();
        for _ in 0..40 {
            let start = RunStart {
                argv: vec!["true".into()],
                input_sha256: "a".repeat(64),
                contract_sha256: "b".repeat(64),
                workload_class: "wal".into(),
                plan_json: serde_json::json!({ "layout": "x".repeat(6000) }),
                session_id: None,
                tenant: None,
            };
            let handle = store.begin_run(start, vec![]).unwrap();
            let end = RunEnd {
                status: "ok".into(),
                ..RunEnd::default()
            };
            store.finish_run(&handle, end).unwrap();
        }
        let after = size();
        pool.give_back(store);
        (dir, before, after)
    }

    #[test]
    fn no_commit_checkpoints_once_the_thread_does() {
        // The database file grows only when the WAL is copied into it: 240 KB of records
        // stay in the WAL when no checkpoint ran (the thread's first is an hour away).
        let (_dir, before, after) = forty_records(Duration::from_secs(3600));
        assert!(
            after < before + (100 << 10),
            "a commit checkpointed: {before} -> {after}"
        );
    }

    #[test]
    fn the_background_thread_checkpoints_what_commits_left_in_the_wal() {
        let (dir, before, _) = forty_records(Duration::from_millis(20));
        let db = dir.path().join(airlock_store::DB_FILE);
        let until = std::time::Instant::now() + Duration::from_secs(10);
        while std::fs::metadata(&db).unwrap().len() < before + (200 << 10) {
            assert!(
                std::time::Instant::now() < until,
                "no checkpoint copied the WAL"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}
