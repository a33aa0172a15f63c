//! A cache of read-only input file hashes, keyed by file identity, so that a large input
//! (a toolchain, a dataset) is read and hashed once, not at every run.
//!
//! Kept in its own SQLite file beside the audit store (`input-hashes.db`): it is derived
//! data, never part of the audit chain, and losing it only costs a re-hash. The key is
//! what changes whenever a file's content can have changed: device, inode, size, mtime
//! and ctime (nanoseconds). ctime cannot be set from user space, so rewriting a file and
//! restoring its mtime still misses the cache.

use crate::{Result, StoreError};
use rusqlite::{params, Connection, OpenFlags, OptionalExtension};
use std::path::{Path, PathBuf};

pub const CACHE_FILE: &str = "input-hashes.db";

/// What identifies one version of a file's content on this host.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FileIdentity {
    pub dev: u64,
    pub ino: u64,
    pub size: u64,
    pub mtime_ns: i128,
    pub ctime_ns: i128,
}

impl FileIdentity {
    pub fn of(meta: &std::fs::Metadata) -> FileIdentity {
        use std::os::unix::fs::MetadataExt;
        let ns = |secs: i64, nanos: i64| i128::from(secs) * 1_000_000_000 + i128::from(nanos);
        FileIdentity {
            dev: meta.dev(),
            ino: meta.ino(),
            size: meta.size(),
            mtime_ns: ns(meta.mtime(), meta.mtime_nsec()),
            ctime_ns: ns(meta.ctime(), meta.ctime_nsec()),
        }
    }

    /// `dev:ino:size:mtime_ns:ctime_ns`: the cache's key (text, because SQLite integers
    /// are 64-bit and nothing may be truncated) and the identity the start's input hash
    /// covers. A fixed format, unlike `Debug`, so hashes stay comparable across builds.
    pub fn key(&self) -> String {
        format!(
            "{}:{}:{}:{}:{}",
            self.dev, self.ino, self.size, self.mtime_ns, self.ctime_ns
        )
    }
}

pub struct InputHashCache {
    conn: Connection,
    path: PathBuf,
}

impl InputHashCache {
    /// Opens (creating if needed) the cache in `state_dir`, which must exist.
    pub fn open(state_dir: &Path) -> Result<InputHashCache> {
        let path = state_dir.join(CACHE_FILE);
        crate::check_state_dir(state_dir)?;
        let conn = Connection::open_with_flags(
            &path,
            OpenFlags::SQLITE_OPEN_READ_WRITE
                | OpenFlags::SQLITE_OPEN_CREATE
                | OpenFlags::SQLITE_OPEN_NO_MUTEX
                | OpenFlags::SQLITE_OPEN_NOFOLLOW,
        )
        .map_err(|e| StoreError::from_sqlite(&path, e))?;
        let setup = || -> rusqlite::Result<()> {
            conn.busy_timeout(std::time::Duration::from_secs(5))?;
            conn.execute_batch(
                "PRAGMA journal_mode = WAL;
                 CREATE TABLE IF NOT EXISTS file_hashes (
                     identity TEXT PRIMARY KEY NOT NULL,
                     sha256 TEXT NOT NULL
                 );",
            )
        };
        setup().map_err(|e| StoreError::from_sqlite(&path, e))?;
        Ok(InputHashCache { conn, path })
    }

    pub fn lookup(&self, identity: &FileIdentity) -> Result<Option<String>> {
        self.conn
            .prepare_cached("SELECT sha256 FROM file_hashes WHERE identity = ?1")
            .and_then(|mut stmt| stmt.query_row([identity.key()], |r| r.get(0)).optional())
            .map_err(|e| StoreError::from_sqlite(&self.path, e))
    }

    /// Remembers hashes computed by this run, in one transaction.
    pub fn remember(&mut self, hashes: &[(FileIdentity, String)]) -> Result<()> {
        if hashes.is_empty() {
            return Ok(());
        }
        let write = |conn: &mut Connection| -> rusqlite::Result<()> {
            let tx = conn.transaction()?;
            {
                let mut stmt = tx.prepare_cached(
                    "INSERT OR REPLACE INTO file_hashes (identity, sha256) VALUES (?1, ?2)",
                )?;
                for (identity, sha256) in hashes {
                    stmt.execute(params![identity.key(), sha256])?;
                }
            }
            tx.commit()
        };
        write(&mut self.conn).map_err(|e| StoreError::from_sqlite(&self.path, e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn identity_of(path: &Path) -> FileIdentity {
        FileIdentity::of(&std::fs::metadata(path).unwrap())
    }

    #[test]
    fn a_remembered_hash_is_found_until_the_file_changes() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("input.bin");
        std::fs::write(&file, b"first").unwrap();
        let mut cache = InputHashCache::open(dir.path()).unwrap();
        let before = identity_of(&file);
        cache.remember(&[(before, "abc".into())]).unwrap();
        assert_eq!(cache.lookup(&before).unwrap().as_deref(), Some("abc"));
        std::thread::sleep(std::time::Duration::from_millis(5));
        std::fs::write(&file, b"other").unwrap();
        let after = identity_of(&file);
        assert_ne!(before, after, "same size, new content: ctime differs");
        assert_eq!(cache.lookup(&after).unwrap(), None);
    }

    #[test]
    fn the_cache_survives_reopening() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f");
        std::fs::write(&file, b"x").unwrap();
        let identity = identity_of(&file);
        InputHashCache::open(dir.path())
            .unwrap()
            .remember(&[(identity, "h".into())])
            .unwrap();
        let reopened = InputHashCache::open(dir.path()).unwrap();
        assert_eq!(reopened.lookup(&identity).unwrap().as_deref(), Some("h"));
    }
}
