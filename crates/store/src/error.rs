use std::fmt;
use std::path::PathBuf;

/// Where `verify()` found the audit trail to be inconsistent.
///
/// `seq` names the audit entry (if the break is in the chain) and `run_id` the run
/// (if the entry or row belongs to one), so an operator can go straight to the record.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ChainBreak {
    pub seq: Option<i64>,
    pub run_id: Option<String>,
    pub reason: String,
}

impl fmt::Display for ChainBreak {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.seq, &self.run_id) {
            (Some(seq), Some(run)) => write!(f, "audit entry seq {seq} (run {run})")?,
            (Some(seq), None) => write!(f, "audit entry seq {seq}")?,
            (None, Some(run)) => write!(f, "run {run}")?,
            (None, None) => write!(f, "audit chain")?,
        }
        write!(f, ": {}", self.reason)
    }
}

/// Coarse classification of a [`StoreError`], for callers that map errors to exit codes,
/// metrics or HTTP statuses without matching on every variant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorClass {
    /// The store cannot be written (read-only file system, immutable file, permissions).
    ReadOnly,
    /// No space left for the database or its WAL.
    DiskFull,
    /// Another writer held the lock longer than the busy timeout.
    Busy,
    /// The file is not a usable airlock database (corrupt, foreign, or newer schema).
    Corrupt,
    /// Anything else the operating system or SQLite reported.
    Io,
    /// The caller asked for something invalid (unknown status, reserved event kind, ...).
    InvalidInput,
    /// The run named by the caller does not exist.
    NotFound,
    /// The run is not in a state that allows the operation (e.g. finished twice).
    Conflict,
    /// `verify()` found the audit trail altered.
    Tampered,
    /// The store cannot be reached right now (a fleet's Postgres down or restarting, its
    /// connection lost, the local file's I/O failing): nothing is wrong with the records,
    /// retry later. New runs are refused (`store_unavailable`), a run's finish is spooled.
    Unavailable,
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("audit store {path} is read-only: {detail}")]
    ReadOnly { path: PathBuf, detail: String },
    #[error("audit store {path}: disk full: {detail}")]
    DiskFull { path: PathBuf, detail: String },
    #[error(
        "audit store {path} is busy (another writer held the lock past the busy timeout): {detail}"
    )]
    Busy { path: PathBuf, detail: String },
    #[error("audit store {path} is corrupt or not an airlock database: {detail}")]
    Corrupt { path: PathBuf, detail: String },
    #[error("audit store {path} has schema version {found}, newer than this airlock supports ({supported}); upgrade airlock")]
    SchemaTooNew {
        path: PathBuf,
        found: i64,
        supported: i64,
    },
    #[error(
        "audit store directory {}: {} is not a directory (choose another --state-dir or store.state_dir)",
        .path.display(), .blocker.display()
    )]
    NotADirectory { path: PathBuf, blocker: PathBuf },
    #[error("audit store directory {}: {reason}", .path.display())]
    UnsafeStateDir { path: PathBuf, reason: String },
    #[error("audit store directory {path}: {source}")]
    Dir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("audit store {path}: {source}")]
    Sqlite {
        path: PathBuf,
        #[source]
        source: rusqlite::Error,
    },
    #[error("audit store export: cannot write: {0}")]
    Export(#[source] std::io::Error),
    #[error("audit store: cannot encode record: {0}")]
    Encode(#[from] serde_json::Error),
    #[error("audit store: invalid input: {0}")]
    InvalidInput(String),
    #[error("audit store: run {0} not found")]
    RunNotFound(String),
    #[error("audit store: run {run_id} is already {status}")]
    RunNotRunning { run_id: String, status: String },
    #[error("audit store tampered: {0}")]
    Tampered(ChainBreak),
    #[error("audit store url (store.url): {0}")]
    InvalidUrl(String),
    #[error("audit store {target} cannot be reached (runs are refused, never recorded elsewhere): {detail}")]
    Unreachable {
        target: String,
        detail: String,
        /// The server is down or cannot be reached (retry later: [`ErrorClass::Unavailable`]),
        /// rather than refused (its certificate, a password, a name off loopback: a
        /// configuration to fix, [`ErrorClass::Io`]).
        outage: bool,
    },
    #[error("audit store {target}: {detail}")]
    Postgres { target: String, detail: String },
    /// The store was unavailable and the local spool of pending finishes is at its bound
    /// (`spool.rs`): this finish is not kept (counted in [`crate::spool::lost_finishes`]).
    #[error(
        "audit store unavailable ({cause}) and the finish spool {} holds its bound of {max_files} \
         pending finishes: the finish of run {run_id} is lost",
        .dir.display()
    )]
    SpoolFull {
        dir: PathBuf,
        max_files: usize,
        run_id: String,
        cause: String,
    },
    #[error("audit store finish spool {}: {source}", .path.display())]
    Spool {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Another process table holds this node name in the fleet's store (`pg.rs`, "Node
    /// claims"): writing as it too would let each judge the other's runs by its own pids.
    #[error(
        "audit store {target}: store node name {node:?} is held by {holder} with {} live \
         database session(s) (server pids {}); this process ({me}) may not write as it: \
         give each machine (or container) its own [store] node (docs/config.md); if that \
         holder is gone, its sessions end when the server's TCP keepalive notices, or end \
         them with SELECT pg_terminate_backend(pid)",
        .sessions.len(),
        .sessions.iter().map(i32::to_string).collect::<Vec<_>>().join(", ")
    )]
    NodeNameHeld {
        target: String,
        node: String,
        holder: String,
        me: String,
        sessions: Vec<i32>,
    },
}

impl StoreError {
    pub fn class(&self) -> ErrorClass {
        match self {
            StoreError::ReadOnly { .. } => ErrorClass::ReadOnly,
            StoreError::DiskFull { .. } => ErrorClass::DiskFull,
            StoreError::Busy { .. } => ErrorClass::Busy,
            StoreError::Corrupt { .. } => ErrorClass::Corrupt,
            StoreError::SchemaTooNew { .. } => ErrorClass::Corrupt,
            StoreError::NotADirectory { .. } => ErrorClass::InvalidInput,
            StoreError::UnsafeStateDir { .. } => ErrorClass::InvalidInput,
            StoreError::Dir { source, .. } => io_class(source),
            StoreError::Sqlite { source, .. } => sqlite_class(source),
            StoreError::Export(source) => io_class(source),
            StoreError::Encode(_) => ErrorClass::InvalidInput,
            StoreError::InvalidInput(_) => ErrorClass::InvalidInput,
            StoreError::RunNotFound(_) => ErrorClass::NotFound,
            StoreError::RunNotRunning { .. } => ErrorClass::Conflict,
            StoreError::Tampered(_) => ErrorClass::Tampered,
            StoreError::InvalidUrl(_) => ErrorClass::InvalidInput,
            StoreError::Unreachable { outage: true, .. } => ErrorClass::Unavailable,
            StoreError::Unreachable { outage: false, .. } => ErrorClass::Io,
            StoreError::Postgres { .. } => ErrorClass::Io,
            StoreError::NodeNameHeld { .. } => ErrorClass::Conflict,
            StoreError::SpoolFull { .. } => ErrorClass::Unavailable,
            StoreError::Spool { source, .. } => io_class(source),
        }
    }

    /// The store cannot be reached right now ([`ErrorClass::Unavailable`]).
    pub fn is_unavailable(&self) -> bool {
        self.class() == ErrorClass::Unavailable
    }

    /// Map a SQLite error to the variant an operator can act on. SQLite reports
    /// ENOSPC as SQLITE_FULL and EROFS/EPERM on its files as READONLY or CANTOPEN.
    pub(crate) fn from_sqlite(path: &std::path::Path, e: rusqlite::Error) -> StoreError {
        use rusqlite::ErrorCode;
        let path = path.to_path_buf();
        if let rusqlite::Error::SqliteFailure(ffi, ref msg) = e {
            let detail = match msg {
                Some(m) => format!("{m} ({})", ffi.extended_code),
                None => format!("{ffi}"),
            };
            match ffi.code {
                ErrorCode::ReadOnly => return StoreError::ReadOnly { path, detail },
                ErrorCode::DiskFull => return StoreError::DiskFull { path, detail },
                ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked => {
                    return StoreError::Busy { path, detail }
                }
                ErrorCode::DatabaseCorrupt | ErrorCode::NotADatabase => {
                    return StoreError::Corrupt { path, detail }
                }
                ErrorCode::CannotOpen
                | ErrorCode::PermissionDenied
                | ErrorCode::SystemIoFailure => {
                    // SQLite folds errno into the extended code only partly; ask the
                    // file system directly so "read-only" and "disk full" are named.
                    if let Some(class) = probe_dir(&path) {
                        return match class {
                            ErrorClass::DiskFull => StoreError::DiskFull { path, detail },
                            _ => StoreError::ReadOnly { path, detail },
                        };
                    }
                }
                _ => {}
            }
        }
        StoreError::Sqlite { path, source: e }
    }
}

/// SQLite's own I/O failure (`SQLITE_IOERR`: the device or file system failed under it) is
/// an outage of the store, like a lost Postgres connection; other SQLite errors are not.
fn sqlite_class(e: &rusqlite::Error) -> ErrorClass {
    match e.sqlite_error_code() {
        Some(rusqlite::ErrorCode::SystemIoFailure) => ErrorClass::Unavailable,
        _ => ErrorClass::Io,
    }
}

fn io_class(e: &std::io::Error) -> ErrorClass {
    match e.raw_os_error() {
        Some(28) | Some(122) => ErrorClass::DiskFull, // ENOSPC, EDQUOT
        Some(30) | Some(1) | Some(13) => ErrorClass::ReadOnly, // EROFS, EPERM, EACCES
        _ => ErrorClass::Io,
    }
}

/// Try to create a scratch file beside the database to learn why SQLite could not write.
fn probe_dir(db_path: &std::path::Path) -> Option<ErrorClass> {
    let dir = db_path.parent()?;
    let probe = dir.join(format!(".airlock-probe-{}", std::process::id()));
    let res = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&probe)
        .and_then(|mut f| std::io::Write::write_all(&mut f, &[0u8; 4096]).and(f.sync_all()));
    let _ = std::fs::remove_file(&probe);
    match res {
        Ok(()) => None,
        Err(e) => match io_class(&e) {
            ErrorClass::Io => None,
            c => Some(c),
        },
    }
}
