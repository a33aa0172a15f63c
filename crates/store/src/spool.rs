//! The finish spool: where the end of a run goes when the store cannot take it.
//!
//! A run that was begun (its `run.begin` is in the chain) ran for real; when the store is
//! unreachable at its end (a fleet's Postgres restarting), its finish is written to
//! `<state dir>/spool/`, one file per pending finish, and written into the store when it
//! is back ([`crate::Store::replay_spool`]): on the engine's replay thread, and before
//! any `reap_aborted` (which would otherwise mark those runs aborted).
//!
//! * Durable before it is reported: each file is written under a temporary name,
//!   fsynced, renamed into place and the directory fsynced, so a pending finish that was
//!   reported as spooled survives a crash of the process or the machine; a crash before
//!   the rename leaves only a temporary file, which replay ignores and removes.
//! * Ordered: names start with the time of the finish and a process-wide counter, and
//!   replay goes in name order.
//! * Idempotent: a pending finish is removed only after it is in the store, and writing
//!   a finish checks that the run is still `running`; a file replayed twice (a crash
//!   between the commit and the unlink, two replayers) is found already finished and only
//!   removed. The chain is appended to as for any finish, so it stays one valid chain.
//! * Bounded: at most `max_files` pending finishes ([`DEFAULT_MAX_FILES`]); a finish past
//!   the bound is refused ([`StoreError::SpoolFull`]), counted ([`lost_finishes`]) and
//!   logged by the caller, which still answers the run's outcome.

use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::{Result, StoreError};

/// The spool's directory in a state directory.
pub const SPOOL_DIR: &str = "spool";
/// Pending finishes kept at most, by default (`[store] spool_max_files`). A finish is a
/// few KB (its output head and tail are bounded), so the default bounds the spool to a
/// few tens of MB.
pub const DEFAULT_MAX_FILES: usize = 4096;
const SUFFIX: &str = ".finish.json";
const TMP_PREFIX: &str = ".tmp-";
const LOCK_FILE: &str = ".lock";

static LOST: AtomicU64 = AtomicU64::new(0);
static SEQ: AtomicU64 = AtomicU64::new(0);
/// One replay at a time in this process: the files are replayed in order.
pub(crate) static REPLAYING: Mutex<()> = Mutex::new(());

/// Finishes this process could neither write nor spool (the spool was full), since it
/// started. Never silent: each is also logged by whoever got the error.
pub fn lost_finishes() -> u64 {
    LOST.load(Ordering::Relaxed)
}

pub(crate) fn count_lost() {
    LOST.fetch_add(1, Ordering::Relaxed);
}

/// The end of a run as the store writes it, already redacted with the run's secrets: what
/// a spool file holds, and what [`crate::Store::finish_run`] writes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PendingFinish {
    pub run_id: String,
    pub finished_at: i64,
    /// Events appended just before the finish entry.
    pub events: Vec<(String, Value)>,
    /// The `run.finish` body.
    pub body: Value,
}

/// Where [`crate::Store::finish_run_or_spool`] put a finish.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Finished {
    /// In the store.
    Written,
    /// In this spool file, written to the store once it is back.
    Spooled(PathBuf),
}

/// What one [`crate::Store::replay_spool`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Replayed {
    /// Finishes written into the store.
    pub written: usize,
    /// Files whose finish was already in the store (replayed before): only removed.
    pub already: usize,
    /// Files whose run is gone or was ended otherwise (aborted, pruned): removed, and
    /// counted in [`lost_finishes`].
    pub lost: Vec<String>,
}

/// A state directory's spool.
#[derive(Debug, Clone)]
pub struct Spool {
    dir: PathBuf,
    max_files: usize,
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> StoreError + '_ {
    move |source| StoreError::Spool {
        path: path.to_path_buf(),
        source,
    }
}

impl Spool {
    pub fn new(state_dir: &Path, max_files: usize) -> Spool {
        Spool {
            dir: state_dir.join(SPOOL_DIR),
            max_files,
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Keeps `pending` durably (file and directory fsynced) and returns its file; refused
    /// when the spool holds its bound already. `cause` is why the store did not take it.
    pub fn put(&self, pending: &PendingFinish, cause: &str) -> Result<PathBuf> {
        self.private_dir()?;
        // Counting and adding are one step for every writer of this state directory
        // (threads of the service, other airlock processes): the bound is exact.
        let _bound = self.lock()?;
        if self.files()?.len() >= self.max_files {
            return Err(StoreError::SpoolFull {
                dir: self.dir.clone(),
                max_files: self.max_files,
                run_id: pending.run_id.clone(),
                cause: cause.to_string(),
            });
        }
        let name = format!(
            "{:020}-{:010}-{:010}-{}{SUFFIX}",
            pending.finished_at.max(0),
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed),
            pending.run_id
        );
        let path = self.dir.join(&name);
        let tmp = self.dir.join(format!("{TMP_PREFIX}{name}"));
        let bytes = serde_json::to_vec(pending)?;
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            // O_CREAT|O_EXCL: a link planted under this name is refused, not followed.
            .open(&tmp)
            .map_err(io(&tmp))?;
        file.write_all(&bytes)
            .and_then(|()| file.sync_all())
            .map_err(io(&tmp))?;
        drop(file);
        std::fs::rename(&tmp, &path).map_err(io(&path))?;
        self.sync_dir()?;
        Ok(path)
    }

    /// The pending finishes, oldest first. Temporary files (a crash before their rename)
    /// are removed: their finish was never reported as spooled.
    pub fn pending(&self) -> Result<Vec<(PathBuf, PendingFinish)>> {
        let mut out = Vec::new();
        for path in self.files()? {
            let bytes = std::fs::read(&path).map_err(io(&path))?;
            let pending: PendingFinish = serde_json::from_slice(&bytes)
                .map_err(|e| io(&path)(std::io::Error::new(std::io::ErrorKind::InvalidData, e)))?;
            out.push((path, pending));
        }
        Ok(out)
    }

    /// No finish is pending (a missing or unreadable directory counts as empty).
    pub fn is_empty(&self) -> bool {
        self.files().map_or(true, |f| f.is_empty())
    }

    /// The runs with a pending finish.
    pub fn pending_runs(&self) -> Result<std::collections::HashSet<String>> {
        Ok(self.pending()?.into_iter().map(|(_, p)| p.run_id).collect())
    }

    /// Removes a replayed file (already gone is fine: another replayer removed it).
    pub fn remove(&self, path: &Path) -> Result<()> {
        match std::fs::remove_file(path) {
            Ok(()) => self.sync_dir(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io(path)(e)),
        }
    }

    /// The spool's finish files in name (= spooled) order; removes stale temporary ones.
    fn files(&self) -> Result<Vec<PathBuf>> {
        let entries = match std::fs::read_dir(&self.dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(io(&self.dir)(e)),
        };
        let mut files = Vec::new();
        for entry in entries {
            let entry = entry.map_err(io(&self.dir))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with(TMP_PREFIX) {
                // Another thread may be writing it right now: only old ones are stale.
                let stale = entry
                    .metadata()
                    .and_then(|m| m.modified())
                    .ok()
                    .and_then(|t| t.elapsed().ok())
                    .is_some_and(|age| age > std::time::Duration::from_secs(60));
                if stale {
                    let _ = std::fs::remove_file(entry.path());
                }
                continue;
            }
            if name.ends_with(SUFFIX) && entry.file_type().is_ok_and(|t| t.is_file()) {
                files.push(entry.path());
            }
        }
        files.sort();
        Ok(files)
    }

    /// The spool directory, created 0700; one that is a link or open to others is refused
    /// (fail closed: nobody else may plant links for the writes below to follow, or read
    /// the finishes' output heads and tails).
    fn private_dir(&self) -> Result<()> {
        use std::os::unix::fs::MetadataExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&self.dir)
            .map_err(io(&self.dir))?;
        let meta = std::fs::symlink_metadata(&self.dir).map_err(io(&self.dir))?;
        if !meta.is_dir() || meta.mode() & 0o077 != 0 {
            return Err(io(&self.dir)(std::io::Error::new(
                std::io::ErrorKind::PermissionDenied,
                format!(
                    "not a private directory (mode {:o}): make it a directory of mode 0700",
                    meta.mode() & 0o7777
                ),
            )));
        }
        Ok(())
    }

    /// An exclusive `flock` on `<spool>/.lock`, held until the guard drops.
    fn lock(&self) -> Result<std::fs::File> {
        let path = self.dir.join(LOCK_FILE);
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&path)
            .map_err(io(&path))?;
        file.lock().map_err(io(&path))?;
        Ok(file)
    }

    fn sync_dir(&self) -> Result<()> {
        std::fs::File::open(&self.dir)
            .and_then(|d| d.sync_all())
            .map_err(io(&self.dir))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pending(run_id: &str, finished_at: i64) -> PendingFinish {
        PendingFinish {
            run_id: run_id.into(),
            finished_at,
            events: vec![("cleanup".into(), json!({"ok": true}))],
            body: json!({"status": "ok", "finished_at": finished_at}),
        }
    }

    #[test]
    fn pending_finishes_come_back_in_the_order_they_were_spooled() {
        let dir = tempfile::tempdir().unwrap();
        let spool = Spool::new(dir.path(), 10);
        // Same finish time: the counter orders them; a later time sorts after.
        for (run, at) in [("c", 5), ("a", 5), ("b", 7)] {
            spool.put(&pending(run, at), "down").unwrap();
        }
        let runs: Vec<String> = spool
            .pending()
            .unwrap()
            .into_iter()
            .map(|(_, p)| p.run_id)
            .collect();
        assert_eq!(runs, ["c", "a", "b"]);
        assert_eq!(spool.pending().unwrap()[0].1, pending("c", 5));
    }

    #[test]
    fn the_spool_is_bounded_and_refuses_past_its_bound() {
        let dir = tempfile::tempdir().unwrap();
        let spool = Spool::new(dir.path(), 2);
        spool.put(&pending("a", 1), "down").unwrap();
        spool.put(&pending("b", 2), "down").unwrap();
        let err = spool.put(&pending("c", 3), "connection lost").unwrap_err();
        assert!(matches!(err, StoreError::SpoolFull { max_files: 2, .. }));
        let text = err.to_string();
        assert!(
            text.contains("run c is lost") && text.contains("connection lost"),
            "{text}"
        );
        assert_eq!(spool.pending().unwrap().len(), 2);
        // Room again once one is replayed.
        let first = spool.pending().unwrap().remove(0).0;
        spool.remove(&first).unwrap();
        spool.remove(&first).unwrap();
        spool.put(&pending("c", 3), "down").unwrap();
    }

    #[test]
    fn the_bound_holds_for_writers_at_the_same_moment() {
        let dir = tempfile::tempdir().unwrap();
        let spool = Spool::new(dir.path(), 3);
        let kept: usize = std::thread::scope(|s| {
            let writers: Vec<_> = (0..16)
                .map(|i| {
                    let spool = &spool;
                    s.spawn(move || spool.put(&pending(&format!("r{i}"), i), "down").is_ok())
                })
                .collect();
            writers
                .into_iter()
                .map(|w| w.join().unwrap() as usize)
                .sum()
        });
        assert_eq!(kept, 3);
        assert_eq!(spool.pending().unwrap().len(), 3);
    }

    #[test]
    fn a_spooled_file_is_complete_private_and_no_temporary_is_left() {
        let dir = tempfile::tempdir().unwrap();
        let spool = Spool::new(dir.path(), 10);
        let path = spool.put(&pending("a", 1), "down").unwrap();
        use std::os::unix::fs::PermissionsExt;
        let meta = std::fs::metadata(&path).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        let back: PendingFinish = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        assert_eq!(back, pending("a", 1));
        let names: Vec<String> = std::fs::read_dir(spool.dir())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n != LOCK_FILE)
            .collect();
        assert_eq!(names.len(), 1, "{names:?}");
        assert!(names[0].ends_with(SUFFIX), "{names:?}");
        // A crash before the rename leaves a temporary file: it is no pending finish.
        std::fs::write(spool.dir().join(".tmp-x.finish.json"), b"{").unwrap();
        assert_eq!(spool.pending().unwrap().len(), 1);
    }

    #[test]
    fn a_spool_directory_open_to_others_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let spool = Spool::new(dir.path(), 10);
        std::fs::create_dir(spool.dir()).unwrap();
        std::fs::set_permissions(spool.dir(), std::fs::Permissions::from_mode(0o777)).unwrap();
        let err = spool.put(&pending("a", 1), "down").unwrap_err();
        assert!(err.to_string().contains("not a private directory"), "{err}");
        assert!(spool.pending().unwrap().is_empty());
    }

    #[test]
    fn a_link_planted_in_the_spool_is_not_written_through() {
        let dir = tempfile::tempdir().unwrap();
        let spool = Spool::new(dir.path(), 10);
        std::fs::create_dir_all(spool.dir()).unwrap();
        // A link where the next temporary file would be: create_new + O_NOFOLLOW refuse.
        let victim = dir.path().join("victim");
        std::fs::write(&victim, b"keep").unwrap();
        let seq = SEQ.load(Ordering::Relaxed);
        let name = format!(
            "{TMP_PREFIX}{:020}-{:010}-{:010}-a{SUFFIX}",
            1,
            std::process::id(),
            seq
        );
        std::os::unix::fs::symlink(&victim, spool.dir().join(name)).unwrap();
        let put = spool.put(&pending("a", 1), "down");
        // Either refused (the link was in the way) or written under another counter value
        // by a concurrent test: the victim is untouched either way.
        let _ = put;
        assert_eq!(std::fs::read(&victim).unwrap(), b"keep");
    }
}
