//! airlock-store: the run records and the tamper-evident audit trail of airlock.
//!
//! One SQLite file (`airlock.db`, WAL mode) in a state directory holds:
//!
//! * `runs` - one row per run, written when the run starts (`status = running`) and
//!   updated when it ends (or marked `aborted` when its supervisor died);
//! * `audit_log` - an append-only hash chain. Every write (run begin, every event, run
//!   finish, abort, prune checkpoint) appends one entry whose
//!   `hash = sha256(domain || prev_hash || seq || run_id || kind || at || body_json)`;
//! * `chain_head` - the seq and hash of the newest entry, so cutting off the end of the
//!   chain is detected too.
//!
//! The run row is a *projection* of its audit entries: `begin` carries the start columns,
//! `finish`/`aborted` the end columns, and [`Store::verify`] recomputes the projection and
//! compares it column by column. Editing, deleting or reordering a run row or an audit
//! entry therefore breaks either the chain or a projection, and `verify` names the first
//! broken record. Anyone who can write the file can still rebuild a consistent chain from
//! scratch; to detect that, keep the head hash `verify` reports somewhere else (a SIEM via
//! [`Store::export_jsonl`], a log line).
//!
//! Secrets handed to [`Store::begin_run`] stay in the [`RunHandle`] (memory only); every
//! string written for that run is redacted first.

pub mod approvals;
mod chain;
mod error;
pub mod input_cache;
mod node;
mod pg;
mod pg_tls;
mod proc_info;
mod redact;
mod schema;
pub mod spool;
mod transcripts;

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rusqlite::config::DbConfig;
use rusqlite::{params, Connection, OpenFlags, OptionalExtension};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

pub use error::{ChainBreak, ErrorClass, StoreError};
pub use node::{NodeHolder, NodeName};
pub use pg::{FleetStore, PostgresUrl};
pub use redact::{Redactor, REDACTED};
pub use spool::{Finished, PendingFinish, Replayed, Spool};
pub use transcripts::{StoredTranscript, TranscriptRecord};

pub type Result<T, E = StoreError> = std::result::Result<T, E>;
/// A run id: a UUIDv7 in its hyphenated text form (time-ordered, sorts by start).
pub type RunId = String;

pub const DB_FILE: &str = "airlock.db";
pub const BUSY_TIMEOUT: Duration = Duration::from_secs(10);
/// Checkpoint the WAL every this many pages. The first connection after the last one
/// closed rebuilds the WAL index by reading the whole WAL, so a small WAL keeps `open`
/// cheap (measured: 1000 pages ~1.1 ms per open+begin+finish, 200 pages ~0.6 ms); the
/// price is a checkpoint (two fsyncs) about every 20 runs. A begin+finish pair writes
/// about 9 pages.
pub const WAL_AUTOCHECKPOINT_PAGES: u32 = 200;
/// `prev_hash` of the very first audit entry.
pub const GENESIS_HASH: &str = "0000000000000000000000000000000000000000000000000000000000000000";
/// The schema version this code writes.
pub const SCHEMA_VERSION: i64 = schema::LATEST;

/// Audit entry kinds written by the store itself. Callers may not append these.
pub mod kinds {
    pub const RUN_BEGIN: &str = "run.begin";
    pub const RUN_FINISH: &str = "run.finish";
    pub const RUN_ABORTED: &str = "run.aborted";
    pub const STORE_PRUNE: &str = "store.prune";
    /// Suggested kinds for `append_event` (any `[a-z0-9._-]+` name is accepted).
    pub const POLICY_DECISION: &str = "policy.decision";
    pub const EGRESS_DECISION: &str = "egress.decision";
    pub const LIMIT_FIRED: &str = "limit.fired";
    pub const ARTIFACT_KEPT: &str = "artifact.kept";
    pub const ARTIFACT_REJECTED: &str = "artifact.rejected";
    pub const CLEANUP: &str = "cleanup";
    /// One request to a run's broker: the action, the request's hash, the decision
    /// (`reason_code` when denied) and the handler's outcome (docs/credentials.md).
    pub const BROKER_ACTION: &str = "broker.action";
    /// A decision on a change of a class session's destinations, in the session's
    /// record: who asked, what, the decision (its `reason_code` when denied), the
    /// destinations before and after (docs/policy.md).
    pub const SESSION_NETWORK: &str = "session.network";

    pub(crate) const RESERVED: &[&str] = &[RUN_BEGIN, RUN_FINISH, RUN_ABORTED, STORE_PRUNE];
}

/// Final status classes a run may be finished with (docs/architecture.md, "Result classes").
pub const FINISH_STATUSES: &[&str] = &[
    "ok",
    "task_error",
    "policy_denied",
    "capacity_exceeded",
    "runtime_fault",
    "sandbox_unavailable",
    "suspected_escape",
    "delivery_failed",
    "store_unavailable",
];
pub const STATUS_RUNNING: &str = "running";
pub const STATUS_ABORTED: &str = "aborted";

/// A run may be finished only while it is `running` (not twice, not once reaped).
fn check_finishable(run_id: &str, status: Option<&str>) -> Result<()> {
    match status {
        None => Err(StoreError::RunNotFound(run_id.to_string())),
        Some(STATUS_RUNNING) => Ok(()),
        Some(other) => Err(StoreError::RunNotRunning {
            run_id: run_id.to_string(),
            status: other.to_string(),
        }),
    }
}

fn check_event_kind(kind: &str) -> Result<()> {
    if !valid_kind(kind) || kinds::RESERVED.contains(&kind) {
        return Err(StoreError::InvalidInput(format!(
            "event kind {kind:?} is reserved or not of the form [a-z0-9._-]{{1,64}}"
        )));
    }
    Ok(())
}

/// The real uid of this process: what [`Store::begin_run`] records as a run's caller.
pub fn caller_uid() -> Option<u32> {
    proc_info::real_uid()
}

/// The state directory: `/var/lib/airlock` for root, else
/// `$XDG_STATE_HOME/airlock` (default `~/.local/state/airlock`).
pub fn default_state_dir() -> PathBuf {
    if proc_info::effective_uid() == Some(0) {
        return PathBuf::from("/var/lib/airlock");
    }
    if let Some(x) = std::env::var_os("XDG_STATE_HOME").filter(|x| Path::new(x).is_absolute()) {
        return PathBuf::from(x).join("airlock");
    }
    match std::env::var_os("HOME").filter(|h| !h.is_empty()) {
        Some(home) => PathBuf::from(home).join(".local/state/airlock"),
        None => PathBuf::from("/var/lib/airlock"),
    }
}

/// What the caller knows when a run starts.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct RunStart {
    pub argv: Vec<String>,
    pub input_sha256: String,
    pub contract_sha256: String,
    /// Empty means `"default"`.
    pub workload_class: String,
    pub plan_json: Value,
    /// The run id of the session this run is a command of (see airlock-engine's
    /// sessions); `None` for a run of its own or a session's own record.
    #[serde(default)]
    pub session_id: Option<String>,
    /// The service tenant the run belongs to (`airlock serve`); `None` for a run of the
    /// command line.
    #[serde(default)]
    pub tenant: Option<String>,
}

/// What the caller knows when a run ends.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct RunEnd {
    /// One of [`FINISH_STATUSES`].
    pub status: String,
    pub exit_code: Option<i32>,
    pub exit_signal: Option<i32>,
    /// `memory`, `pids`, `cpu`, `wall_time`, `output_bytes`, `disk`.
    pub limit_fired: Option<String>,
    /// e.g. `{"cpu_usec": .., "memory_peak_bytes": .., "pids_peak": ..}`.
    pub usage: Value,
    pub startup_ms: f64,
    pub wall_ms: f64,
    pub stdout_head: String,
    pub stdout_tail: String,
    pub stderr_head: String,
    pub stderr_tail: String,
    pub cleanup_ok: bool,
    pub cleanup_leftovers: Value,
    pub result_json: Value,
    /// Events `(kind, body)` appended just before the finish entry, in the same
    /// transaction (one commit per run end instead of one per event).
    #[serde(default)]
    pub events: Vec<(String, Value)>,
}

/// One run as stored. Field names are also the keys of the `run.begin`/`run.finish`
/// audit bodies, which is what lets `verify` compare the row with its entries.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunRecord {
    pub run_id: RunId,
    /// Unix time in milliseconds.
    pub started_at: i64,
    pub finished_at: Option<i64>,
    pub argv: Vec<String>,
    pub input_sha256: String,
    pub contract_sha256: String,
    pub workload_class: String,
    pub plan: Value,
    pub status: String,
    pub exit_code: Option<i32>,
    pub exit_signal: Option<i32>,
    pub limit_fired: Option<String>,
    pub usage: Value,
    pub startup_ms: Option<f64>,
    pub wall_ms: Option<f64>,
    pub stdout_head: Option<String>,
    pub stdout_tail: Option<String>,
    pub stderr_head: Option<String>,
    pub stderr_tail: Option<String>,
    pub cleanup_ok: Option<bool>,
    pub cleanup_leftovers: Value,
    pub result: Value,
    pub supervisor_pid: u32,
    pub supervisor_start_time: u64,
    pub boot_id: String,
    /// Real uid of the process that started the run; `None` for runs recorded before
    /// schema version 3.
    pub caller_uid: Option<u32>,
    /// The session this run is a command of (schema version 4).
    pub session_id: Option<String>,
    /// The service tenant of the run (migration `RUN_TENANTS`); `None` outside the service.
    pub tenant: Option<String>,
    /// The fleet node whose supervisor ran it (`[store] node`, migration `RUN_NODES`);
    /// `None` in a node's own SQLite file and for runs recorded before nodes were.
    #[serde(default)]
    pub node: Option<String>,
}

/// One entry of the audit chain.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AuditEntry {
    pub seq: i64,
    pub run_id: Option<RunId>,
    pub kind: String,
    /// Unix time in milliseconds.
    pub at: i64,
    pub body: Value,
    pub prev_hash: String,
    pub hash: String,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RunDetail {
    pub run: RunRecord,
    /// Every audit entry of the run in order, including `run.begin` / `run.finish`.
    pub events: Vec<AuditEntry>,
}

#[derive(Debug, Clone, Default)]
pub struct RunFilter {
    pub status: Option<String>,
    pub workload_class: Option<String>,
    /// Inclusive lower bound on `started_at` (unix ms).
    pub since: Option<i64>,
    /// Exclusive upper bound on `started_at` (unix ms).
    pub until: Option<i64>,
    pub limit: Option<usize>,
    /// Only runs started by this real uid.
    pub caller_uid: Option<u32>,
    /// Only the commands of this session.
    pub session_id: Option<String>,
    /// Only the runs of this service tenant.
    pub tenant: Option<String>,
    /// Only the runs after this one in the newest-first order (`started_at`, `run_id`):
    /// the last run of the previous page, so a page goes on where the last one ended.
    pub before: Option<(i64, String)>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ClassStats {
    pub runs: u64,
    pub running: u64,
    pub finished: u64,
    pub ok: u64,
    /// ok / finished (aborted counts as finished); `None` before any run finished.
    pub completion_rate: Option<f64>,
    pub startup_ms_p50: Option<f64>,
    pub startup_ms_p99: Option<f64>,
    pub by_status: BTreeMap<String, u64>,
    /// Events whose body has `"decision": "deny"` (or `denied`/`reject`/`rejected`),
    /// counted by their `reason_code`.
    pub denials: BTreeMap<String, u64>,
    /// Runs with `limit_fired = wall_time`.
    pub timeouts: u64,
    pub cleanup_failures: u64,
}

/// One tenant's share of the store ([`Store::tenant_counts`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct TenantCounts {
    pub runs: u64,
    pub entries: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct VerifyReport {
    pub entries: u64,
    pub runs: u64,
    pub first_seq: Option<i64>,
    pub head_seq: i64,
    /// Keep this somewhere else to detect a wholesale rewrite of the file.
    pub head_hash: String,
}

/// An open run. Holds the run's secrets (memory only) for redaction.
#[derive(Debug)]
pub struct RunHandle {
    run_id: RunId,
    started_at: i64,
    redactor: Redactor,
}

impl RunHandle {
    pub fn run_id(&self) -> String {
        self.run_id.clone()
    }
    pub fn started_at(&self) -> i64 {
        self.started_at
    }
    /// Redact a text with this run's secrets (for callers that log elsewhere too).
    pub fn redact(&self, s: &str) -> String {
        self.redactor.text(s)
    }
}

/// Where a store lives. The state directory always holds the node's local SQLite file
/// (the input cache, approvals, reviews, transcripts: per-node data); with `postgres`, runs
/// and the audit chain are in that shared database instead of the local file
/// (docs/architecture.md, "Fleets").
#[derive(Debug, Clone)]
pub struct StoreLocation {
    pub state_dir: PathBuf,
    pub postgres: Option<FleetStore>,
    /// The bound of the finish spool (`spool.rs`, `[store] spool_max_files`).
    pub spool_max_files: usize,
}

impl StoreLocation {
    /// The embedded default: everything in `state_dir`'s SQLite file.
    pub fn local(state_dir: impl Into<PathBuf>) -> StoreLocation {
        StoreLocation {
            state_dir: state_dir.into(),
            postgres: None,
            spool_max_files: spool::DEFAULT_MAX_FILES,
        }
    }
}

pub struct Store {
    conn: Connection,
    path: PathBuf,
    /// Runs and the audit chain, when they are a fleet's (Postgres); `None`: `conn`'s.
    /// Boxed: the client is large, and a `Store` is held inline by the engine's states.
    fleet: Option<Box<pg::Fleet>>,
    /// Where finishes go while the store is unavailable (`spool.rs`). Boxed, as `fleet`.
    spool: Box<Spool>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("path", &self.path)
            .field("fleet", &self.fleet.as_ref().map(|f| f.shown()))
            .finish()
    }
}

fn is_busy(e: &rusqlite::Error) -> bool {
    matches!(
        e.sqlite_error_code(),
        Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
    )
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

impl From<rusqlite::Error> for StoreError {
    fn from(source: rusqlite::Error) -> Self {
        // The path is filled in by `Store::ctx` at the public boundary.
        StoreError::Sqlite {
            path: PathBuf::new(),
            source,
        }
    }
}

/// Hash of one audit entry. Every variable field is length-prefixed, so no two
/// different entries serialise to the same bytes.
pub fn entry_hash(
    prev_hash: &str,
    seq: i64,
    run_id: Option<&str>,
    kind: &str,
    at: i64,
    body_json: &str,
) -> String {
    let mut h = Sha256::new();
    h.update(b"airlock-audit-v1\0");
    let mut field = |b: &[u8]| {
        h.update((b.len() as u64).to_be_bytes());
        h.update(b);
    };
    field(prev_hash.as_bytes());
    field(&seq.to_be_bytes());
    match run_id {
        Some(r) => field(format!("R{r}").as_bytes()),
        None => field(b"-"),
    }
    field(kind.as_bytes());
    field(&at.to_be_bytes());
    field(body_json.as_bytes());
    hex::encode(h.finalize())
}

/// Append one entry to the chain. Must run inside a write (`BEGIN IMMEDIATE`)
/// transaction: the head read and the insert are then atomic across processes.
fn append_entry(
    conn: &Connection,
    run_id: Option<&str>,
    kind: &str,
    at: i64,
    body: &Value,
) -> rusqlite::Result<i64> {
    let body_json = body.to_string();
    let (head_seq, head_hash): (i64, String) = conn
        .prepare_cached("SELECT seq, hash FROM chain_head WHERE id = 1")?
        .query_row([], |r| Ok((r.get(0)?, r.get(1)?)))?;
    let seq = head_seq + 1;
    let hash = entry_hash(&head_hash, seq, run_id, kind, at, &body_json);
    conn.prepare_cached(
        "INSERT INTO audit_log (seq, run_id, kind, at, body_json, prev_hash, hash)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
    )?
    .execute(params![seq, run_id, kind, at, body_json, head_hash, hash])?;
    conn.prepare_cached("UPDATE chain_head SET seq = ?1, hash = ?2 WHERE id = 1")?
        .execute(params![seq, hash])?;
    Ok(seq)
}

fn json_col(v: &Value) -> Option<String> {
    match v {
        Value::Null => None,
        v => Some(v.to_string()),
    }
}

fn parse_json_col(s: Option<String>) -> Value {
    s.and_then(|s| serde_json::from_str(&s).ok())
        .unwrap_or(Value::Null)
}

/// The columns of a run as [`run_from_row`] reads them, with `$plan` the expression of its
/// plan's JSON.
macro_rules! run_columns {
    ($plan:literal) => {
        concat!(
            "run_id, started_at, finished_at, argv_json, input_sha256, \
             contract_sha256, workload_class, ",
            $plan,
            ", status, exit_code, exit_signal, limit_fired, \
             usage_json, startup_ms, wall_ms, stdout_head, stdout_tail, stderr_head, stderr_tail, \
             cleanup_ok, cleanup_leftovers_json, result_json, supervisor_pid, supervisor_start_time, \
             boot_id, caller_uid, session_id, tenant, node"
        )
    };
}

/// A fleet's (Postgres) `runs` holds the plan; its `UPDATE` keeps the TOASTed value.
const RUN_COLUMNS: &str = run_columns!("plan_json");

/// SQLite's: the plan from `run_plans` (schema.rs, `RUN_PLANS`), or from the row itself
/// for a run recorded before that table. Selected `FROM runs`.
const SQLITE_RUN_COLUMNS: &str = run_columns!(
    "COALESCE(plan_json, (SELECT p.plan_json FROM run_plans p WHERE p.run_id = runs.run_id))"
);

fn run_from_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<RunRecord> {
    let argv: Option<String> = r.get(3)?;
    Ok(RunRecord {
        run_id: r.get(0)?,
        started_at: r.get(1)?,
        finished_at: r.get(2)?,
        argv: argv
            .and_then(|a| serde_json::from_str(&a).ok())
            .unwrap_or_default(),
        input_sha256: r.get(4)?,
        contract_sha256: r.get(5)?,
        workload_class: r.get(6)?,
        plan: parse_json_col(r.get(7)?),
        status: r.get(8)?,
        exit_code: r.get(9)?,
        exit_signal: r.get(10)?,
        limit_fired: r.get(11)?,
        usage: parse_json_col(r.get(12)?),
        startup_ms: r.get(13)?,
        wall_ms: r.get(14)?,
        stdout_head: r.get(15)?,
        stdout_tail: r.get(16)?,
        stderr_head: r.get(17)?,
        stderr_tail: r.get(18)?,
        cleanup_ok: r.get(19)?,
        cleanup_leftovers: parse_json_col(r.get(20)?),
        result: parse_json_col(r.get(21)?),
        supervisor_pid: r.get(22)?,
        supervisor_start_time: r.get::<_, i64>(23)? as u64,
        boot_id: r.get(24)?,
        caller_uid: r.get(25)?,
        session_id: r.get(26)?,
        tenant: r.get(27)?,
        node: r.get(28)?,
    })
}

fn entry_from_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<(AuditEntry, String)> {
    let body_json: String = r.get(4)?;
    let body = serde_json::from_str(&body_json).unwrap_or(Value::Null);
    Ok((
        AuditEntry {
            seq: r.get(0)?,
            run_id: r.get(1)?,
            kind: r.get(2)?,
            at: r.get(3)?,
            body,
            prev_hash: r.get(5)?,
            hash: r.get(6)?,
        },
        body_json,
    ))
}

const ENTRY_COLUMNS: &str = "seq, run_id, kind, at, body_json, prev_hash, hash";

fn valid_kind(kind: &str) -> bool {
    !kind.is_empty()
        && kind.len() <= 64
        && kind
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b))
}

/// Nearest-rank percentile of sorted data.
fn percentile(sorted: &[f64], p: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = (p * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

/// Per-class statistics folded from run rows and denial events; both backends feed it.
#[derive(Default)]
pub(crate) struct StatsFold {
    out: BTreeMap<String, ClassStats>,
    startups: HashMap<String, Vec<f64>>,
}

impl StatsFold {
    pub fn run(
        &mut self,
        class: String,
        status: String,
        startup_ms: Option<f64>,
        limit_fired: Option<&str>,
        cleanup_ok: Option<bool>,
    ) {
        let s = self.out.entry(class.clone()).or_default();
        s.runs += 1;
        *s.by_status.entry(status.clone()).or_default() += 1;
        if status == STATUS_RUNNING {
            s.running += 1;
            return;
        }
        s.finished += 1;
        if status == "ok" {
            s.ok += 1;
        }
        if let Some(ms) = startup_ms {
            self.startups.entry(class).or_default().push(ms);
        }
        if limit_fired == Some("wall_time") {
            s.timeouts += 1;
        }
        if cleanup_ok == Some(false) {
            s.cleanup_failures += 1;
        }
    }

    /// `n` denial events of runs of `class` with this reason code.
    pub fn denials(&mut self, class: String, code: String, n: u64) {
        *self
            .out
            .entry(class)
            .or_default()
            .denials
            .entry(code)
            .or_default() += n;
    }

    pub fn finish(mut self) -> BTreeMap<String, ClassStats> {
        for (class, s) in self.out.iter_mut() {
            s.completion_rate = (s.finished > 0).then(|| s.ok as f64 / s.finished as f64);
            if let Some(v) = self.startups.get_mut(class) {
                v.sort_by(f64::total_cmp);
                s.startup_ms_p50 = percentile(v, 0.50);
                s.startup_ms_p99 = percentile(v, 0.99);
            }
        }
        self.out
    }
}

/// The denial an event body records, if it is one: its `reason_code` (`unknown` when it
/// names none). What SQLite's `json_extract` query selects, for the other backend.
pub(crate) fn denial_code(body: &Value) -> Option<String> {
    let decision = body.get("decision")?.as_str()?.to_lowercase();
    if !["deny", "denied", "reject", "rejected"].contains(&decision.as_str()) {
        return None;
    }
    Some(match body.get("reason_code") {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Null) | None => "unknown".to_string(),
        Some(other) => other.to_string(),
    })
}

/// Files airlock keeps in a state directory: the store and its journals, the input cache.
const STATE_FILES: &[&str] = &[
    DB_FILE,
    "airlock.db-wal",
    "airlock.db-shm",
    "airlock.db-journal",
    input_cache::CACHE_FILE,
    "input-hashes.db-wal",
    "input-hashes.db-shm",
    "input-hashes.db-journal",
];

/// The state directory's files are written by a privileged airlock, so nobody else may be
/// able to put anything there: a symlink or hard link planted as `airlock.db-wal` would
/// have root write through it, and records could be edited. Refused: a directory others
/// can write to (group or world write bit) or owned by another user than this one or
/// root, and any of airlock's file names that is not a plain, single-link file.
pub(crate) fn check_state_dir(dir: &Path) -> Result<()> {
    use std::os::unix::fs::MetadataExt;
    let unsafe_dir = |reason: String| StoreError::UnsafeStateDir {
        path: dir.to_path_buf(),
        reason,
    };
    let meta = std::fs::metadata(dir).map_err(|source| StoreError::Dir {
        path: dir.to_path_buf(),
        source,
    })?;
    if meta.mode() & 0o022 != 0 {
        return Err(unsafe_dir(format!(
            "it is writable by other users (mode {:o}), who could plant links for airlock to \
             write through or edit its records: `chmod go-w` it or choose another --state-dir",
            meta.mode() & 0o7777
        )));
    }
    // Unknown: only a root-owned directory passes (fail closed).
    let me = proc_info::effective_uid().unwrap_or(u32::MAX);
    if meta.uid() != me && meta.uid() != 0 {
        return Err(unsafe_dir(format!(
            "it belongs to uid {}, not to this user (uid {me}) or root",
            meta.uid()
        )));
    }
    for name in STATE_FILES {
        let Ok(file) = std::fs::symlink_metadata(dir.join(name)) else {
            continue;
        };
        if !file.file_type().is_file() || file.nlink() > 1 {
            return Err(unsafe_dir(format!(
                "{name} is not a plain file of its own (a symlink, a hard link, a FIFO or a \
                 directory): airlock does not write through it; remove it"
            )));
        }
    }
    Ok(())
}

/// The first of `dir` and its ancestors that exists but is not a directory (a file where
/// the store's directory or one of its parents should be), if any.
fn non_directory_on_the_way(dir: &Path) -> Option<PathBuf> {
    dir.ancestors()
        .find(|p| !p.as_os_str().is_empty() && p.exists())
        .filter(|p| !p.is_dir())
        .map(Path::to_path_buf)
}

impl Store {
    /// Open (creating if needed) the store in `state_dir`, migrating it to the current
    /// schema. Fails if the store cannot be written.
    pub fn open(state_dir: &Path) -> Result<Store> {
        Self::open_with_schema(state_dir, schema::LATEST)
    }

    /// Open the store at `location`: its state directory's SQLite file, and with a
    /// Postgres URL the fleet's database for runs and the audit chain. A database that
    /// cannot be reached is an error (fail closed), never a fallback to the local file.
    /// With a fleet store, the node name is claimed for this process's holder (its
    /// boot and pid namespace) for as long as the store is open: another holder's live
    /// claim is an error ([`StoreError::NodeNameHeld`]).
    pub fn open_at(location: &StoreLocation) -> Result<Store> {
        let mut store = Self::open(&location.state_dir)?;
        store.spool = Box::new(Spool::new(&location.state_dir, location.spool_max_files));
        if let Some(fleet) = &location.postgres {
            let holder = NodeHolder::of_this_process()?;
            store.fleet = Some(Box::new(pg::Fleet::connect(fleet, holder)?));
        }
        Ok(store)
    }

    /// [`Store::open_at`] as `holder` claims the node name instead of this process: for
    /// tests that stand for another machine in-process. The binary never calls it (it
    /// opens with [`Store::open_at`]), so no configuration or environment can make a
    /// process claim under another holder's identity; code that links this crate can
    /// write the database directly anyway.
    #[doc(hidden)]
    pub fn open_at_as_holder(location: &StoreLocation, holder: NodeHolder) -> Result<Store> {
        let mut store = Self::open(&location.state_dir)?;
        store.spool = Box::new(Spool::new(&location.state_dir, location.spool_max_files));
        if let Some(fleet) = &location.postgres {
            store.fleet = Some(Box::new(pg::Fleet::connect(fleet, holder)?));
        }
        Ok(store)
    }

    /// Where runs and the audit chain are: the SQLite file's path, or the fleet's URL
    /// (without its password).
    pub fn describe(&self) -> String {
        match &self.fleet {
            Some(fleet) => fleet.shown().to_string(),
            None => self.path.display().to_string(),
        }
    }

    /// Open the store at `default_state_dir()`.
    pub fn open_default() -> Result<Store> {
        Self::open(&default_state_dir())
    }

    /// Open and migrate only up to `version` (used to build old-schema fixtures).
    #[doc(hidden)]
    pub fn open_with_schema(state_dir: &Path, version: i64) -> Result<Store> {
        let path = state_dir.join(DB_FILE);
        if let Some(blocker) = non_directory_on_the_way(state_dir) {
            return Err(StoreError::NotADirectory {
                path: state_dir.to_path_buf(),
                blocker,
            });
        }
        if !state_dir.is_dir() {
            use std::os::unix::fs::DirBuilderExt;
            // 0700: the store holds output heads and tails of every run.
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(state_dir)
                .map_err(|source| {
                    let path = state_dir.to_path_buf();
                    match source.raw_os_error() {
                        Some(30) => StoreError::ReadOnly {
                            path,
                            detail: source.to_string(),
                        },
                        Some(28) => StoreError::DiskFull {
                            path,
                            detail: source.to_string(),
                        },
                        _ => StoreError::Dir { path, source },
                    }
                })?;
        }
        check_state_dir(state_dir)?;
        let conn = Connection::open_with_flags(
            &path,
            OpenFlags::SQLITE_OPEN_READ_WRITE
                | OpenFlags::SQLITE_OPEN_CREATE
                | OpenFlags::SQLITE_OPEN_NO_MUTEX
                | OpenFlags::SQLITE_OPEN_NOFOLLOW,
        )
        .map_err(|e| StoreError::from_sqlite(&path, e))?;
        let store = Store {
            conn,
            path,
            fleet: None,
            spool: Box::new(Spool::new(state_dir, spool::DEFAULT_MAX_FILES)),
        };
        // Switching a fresh file to WAL needs an exclusive lock and SQLite does not call
        // the busy handler for it, so processes creating the store at the same moment can
        // see SQLITE_BUSY here. Every step of `init` is idempotent: retry it.
        let deadline = std::time::Instant::now() + BUSY_TIMEOUT;
        loop {
            match store.init(version) {
                Ok(()) => return Ok(store),
                Err(StoreError::Sqlite { source, .. })
                    if is_busy(&source) && std::time::Instant::now() < deadline =>
                {
                    std::thread::sleep(Duration::from_millis(2));
                }
                Err(e) => return Err(store.ctx(e)),
            }
        }
    }

    fn init(&self, version: i64) -> Result<()> {
        // SQLite silently falls back to read-only when it cannot open the file for
        // writing; an audit store that cannot be written must not look usable.
        if self.conn.is_readonly(rusqlite::MAIN_DB)? {
            return Err(StoreError::ReadOnly {
                path: self.path.clone(),
                detail: "the database file cannot be opened for writing".into(),
            });
        }
        self.conn.busy_timeout(BUSY_TIMEOUT)?;
        // WAL + NORMAL: commits do not fsync (only checkpoints do); a power loss can lose
        // the last commits but never corrupts the file. This keeps begin/finish cheap.
        self.conn.execute_batch(&format!(
            "PRAGMA synchronous = NORMAL; PRAGMA wal_autocheckpoint = {WAL_AUTOCHECKPOINT_PAGES}"
        ))?;
        // The CLI is usually the last connection: by default closing it would checkpoint
        // the WAL (fsync) and delete the WAL and shm files, and the next open would
        // recreate them - about 2 ms per run. The WAL is checkpointed by the periodic
        // auto-checkpoint instead.
        self.conn
            .set_db_config(DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, true)?;
        let found = schema::version(&self.conn)?;
        if found > schema::LATEST {
            return Err(StoreError::SchemaTooNew {
                path: self.path.clone(),
                found,
                supported: schema::LATEST,
            });
        }
        if found < version {
            // journal_mode is persistent in the file; only set it when creating or
            // upgrading, so the common open path stays one read.
            let mode: String = self
                .conn
                .query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))?;
            if !mode.eq_ignore_ascii_case("wal") {
                return Err(StoreError::InvalidInput(format!(
                    "cannot switch {} to WAL mode (got {mode})",
                    self.path.display()
                )));
            }
            schema::migrate(&self.conn, version)?;
        }
        Ok(())
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The fleet database's schema version, when runs and the audit chain are a fleet's.
    pub fn fleet_schema_version(&self) -> Result<Option<i64>> {
        self.fleet
            .as_ref()
            .map(|fleet| fleet.schema_version())
            .transpose()
    }

    /// The local SQLite file's schema version.
    pub fn schema_version(&self) -> Result<i64> {
        schema::version(&self.conn).map_err(|e| self.ctx(e.into()))
    }

    /// Attach the database path to an error and classify SQLite failures.
    fn ctx(&self, e: StoreError) -> StoreError {
        match e {
            StoreError::Sqlite { source, .. } => StoreError::from_sqlite(&self.path, source),
            other => other,
        }
    }

    /// Run `f` in a `BEGIN IMMEDIATE` transaction: writers queue on the lock (up to the
    /// busy timeout) instead of failing on upgrade, and the chain head read in `f` is
    /// the head the entry is appended to.
    fn write_tx<T>(&self, f: impl FnOnce(&Connection) -> Result<T>) -> Result<T> {
        self.conn
            .execute_batch("BEGIN IMMEDIATE")
            .map_err(|e| self.ctx(e.into()))?;
        match f(&self.conn) {
            Ok(v) => match self.conn.execute_batch("COMMIT") {
                Ok(()) => Ok(v),
                Err(e) => {
                    let _ = self.conn.execute_batch("ROLLBACK");
                    Err(self.ctx(e.into()))
                }
            },
            Err(e) => {
                let _ = self.conn.execute_batch("ROLLBACK");
                Err(self.ctx(e))
            }
        }
    }

    fn read_tx<T>(&self, f: impl FnOnce(&Connection) -> Result<T>) -> Result<T> {
        self.conn
            .execute_batch("BEGIN")
            .map_err(|e| self.ctx(e.into()))?;
        let res = f(&self.conn);
        let _ = self.conn.execute_batch("COMMIT");
        res.map_err(|e| self.ctx(e))
    }

    /// Record the start of a run. The caller must not start the run if this fails.
    pub fn begin_run(&self, start: RunStart, secrets: Vec<String>) -> Result<RunHandle> {
        let redactor = Redactor::new(secrets);
        let run_id = uuid::Uuid::now_v7().hyphenated().to_string();
        let started_at = now_ms();
        let me = proc_info::current();
        let workload_class = if start.workload_class.is_empty() {
            "default".to_string()
        } else {
            start.workload_class
        };
        let mut body = json!({
            "run_id": run_id,
            "started_at": started_at,
            "argv": start.argv,
            "input_sha256": start.input_sha256,
            "contract_sha256": start.contract_sha256,
            "workload_class": workload_class,
            "plan": start.plan_json,
            "status": STATUS_RUNNING,
            "supervisor_pid": me.pid,
            "supervisor_start_time": me.start_time,
            "boot_id": me.boot_id,
            "caller_uid": proc_info::real_uid(),
            "session_id": start.session_id,
            "tenant": start.tenant,
            "node": self.fleet.as_ref().map(|f| f.node().as_str()),
        });
        if let Some(fleet) = &self.fleet {
            // With the boot id, the holder that may judge this run by its pid (node.rs);
            // only in a fleet's chain, so SQLite's entries stay as they were.
            body["pid_ns"] = json!(fleet.holder().pid_ns);
        }
        let body = redactor.value(body);
        // Columns are taken from the redacted body, so row and audit entry agree.
        let s = |k: &str| body[k].as_str().unwrap_or_default().to_string();
        let argv_json = body["argv"].to_string();
        if let Some(fleet) = &self.fleet {
            fleet.begin(&run_id, started_at, &body)?;
            return Ok(RunHandle {
                run_id,
                started_at,
                redactor,
            });
        }
        self.write_tx(|c| {
            append_entry(c, Some(&run_id), kinds::RUN_BEGIN, started_at, &body)?;
            // The plan goes to a row of its own, which the finish record leaves alone.
            c.prepare_cached("INSERT INTO run_plans (run_id, plan_json) VALUES (?1, ?2)")?
                .execute(params![run_id, json_col(&body["plan"])])?;
            c.prepare_cached(
                "INSERT INTO runs (run_id, started_at, argv_json, input_sha256, contract_sha256,
                    workload_class, status, supervisor_pid, supervisor_start_time,
                    boot_id, caller_uid, session_id, tenant)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)",
            )?
            .execute(params![
                run_id,
                started_at,
                argv_json,
                s("input_sha256"),
                s("contract_sha256"),
                s("workload_class"),
                STATUS_RUNNING,
                me.pid,
                me.start_time as i64,
                s("boot_id"),
                body["caller_uid"].as_u64(),
                body["session_id"].as_str(),
                body["tenant"].as_str(),
            ])?;
            Ok(())
        })?;
        Ok(RunHandle {
            run_id,
            started_at,
            redactor,
        })
    }

    /// Append an event (policy/egress decision, ceiling fired, artifact kept/rejected,
    /// cleanup, ...) to a run. The body is redacted with the run's secrets.
    pub fn append_event(&self, h: &RunHandle, kind: &str, body: Value) -> Result<()> {
        check_event_kind(kind)?;
        let body = h.redactor.value(body);
        let at = now_ms();
        if let Some(fleet) = &self.fleet {
            return fleet.append_event(&h.run_id, kind, at, &body);
        }
        self.write_tx(|c| {
            let exists: Option<i64> = c
                .prepare_cached("SELECT 1 FROM runs WHERE run_id = ?1")?
                .query_row([&h.run_id], |r| r.get(0))
                .optional()?;
            if exists.is_none() {
                return Err(StoreError::RunNotFound(h.run_id.clone()));
            }
            append_entry(c, Some(&h.run_id), kind, at, &body)?;
            Ok(())
        })
    }

    /// Record the end of a run. Fails if the run is not `running` any more (finished
    /// twice, or reaped as `aborted`).
    pub fn finish_run(&self, h: &RunHandle, end: RunEnd) -> Result<()> {
        let pending = self.pending_finish(h, end)?;
        self.write_finish(&pending)
    }

    /// [`Store::finish_run`], or, when the store is unavailable, the finish kept in the
    /// state directory's spool (fsynced) and written once the store is back
    /// ([`Store::replay_spool`]). A full spool is [`StoreError::SpoolFull`]: the finish
    /// is lost, counted in [`spool::lost_finishes`]; the caller logs it.
    pub fn finish_run_or_spool(&self, h: &RunHandle, end: RunEnd) -> Result<Finished> {
        let pending = self.pending_finish(h, end)?;
        match self.write_finish(&pending) {
            Ok(()) => Ok(Finished::Written),
            Err(e) if e.is_unavailable() => {
                let kept = self.spool.put(&pending, &e.to_string());
                if kept.is_err() {
                    spool::count_lost();
                }
                kept.map(Finished::Spooled)
            }
            Err(e) => Err(e),
        }
    }

    /// Writes the spool's pending finishes into the store, oldest first, removing each
    /// once it is in (see `spool.rs`). Stops at the first that the store cannot take
    /// because it is unavailable again (that error is returned; the rest stay pending).
    pub fn replay_spool(&self) -> Result<Replayed> {
        let _one_at_a_time = spool::REPLAYING.lock().unwrap_or_else(|p| p.into_inner());
        let mut done = Replayed::default();
        for (path, pending) in self.spool.pending()? {
            match self.write_finish(&pending) {
                Ok(()) => done.written += 1,
                // Already ended: by this spool before (the file outlived its commit) when
                // ended with this finish, else by something that must not have happened
                // (reaped despite the pending finish, pruned): then the finish is lost.
                Err(StoreError::RunNotRunning { status, .. })
                    if status == pending.body["status"].as_str().unwrap_or_default() =>
                {
                    done.already += 1
                }
                Err(StoreError::RunNotRunning { .. } | StoreError::RunNotFound(_)) => {
                    spool::count_lost();
                    done.lost.push(pending.run_id.clone());
                }
                Err(e) => return Err(e),
            }
            self.spool.remove(&path)?;
        }
        Ok(done)
    }

    /// A cheap check that the store answers (one round trip); reconnects a fleet's lost
    /// connection (within its backoff).
    pub fn ping(&self) -> Result<()> {
        if let Some(fleet) = &self.fleet {
            return fleet.ping();
        }
        self.conn
            .query_row("SELECT seq FROM chain_head WHERE id = 1", [], |_| Ok(()))
            .map_err(|e| self.ctx(e.into()))
    }

    /// The state directory's finish spool.
    pub fn spool(&self) -> &Spool {
        &self.spool
    }

    /// The end of a run as it is written: checked, redacted, timed.
    fn pending_finish(&self, h: &RunHandle, end: RunEnd) -> Result<PendingFinish> {
        for (kind, _) in &end.events {
            check_event_kind(kind)?;
        }
        let events: Vec<(String, Value)> = end
            .events
            .iter()
            .map(|(kind, body)| (kind.clone(), h.redactor.value(body.clone())))
            .collect();
        if !FINISH_STATUSES.contains(&end.status.as_str()) {
            return Err(StoreError::InvalidInput(format!(
                "unknown status {:?}; expected one of {}",
                end.status,
                FINISH_STATUSES.join(", ")
            )));
        }
        let finite = |x: f64| x.is_finite().then_some(x);
        let (stdout_head, stdout_tail) = h.redactor.head_tail(&end.stdout_head, &end.stdout_tail);
        let (stderr_head, stderr_tail) = h.redactor.head_tail(&end.stderr_head, &end.stderr_tail);
        let finished_at = now_ms();
        let body = h.redactor.value(json!({
            "finished_at": finished_at,
            "status": end.status,
            "exit_code": end.exit_code,
            "exit_signal": end.exit_signal,
            "limit_fired": end.limit_fired,
            "usage": end.usage,
            "startup_ms": finite(end.startup_ms),
            "wall_ms": finite(end.wall_ms),
            "stdout_head": stdout_head,
            "stdout_tail": stdout_tail,
            "stderr_head": stderr_head,
            "stderr_tail": stderr_tail,
            "cleanup_ok": end.cleanup_ok,
            "cleanup_leftovers": end.cleanup_leftovers,
            "result": end.result_json,
        }));
        Ok(PendingFinish {
            run_id: h.run_id.clone(),
            finished_at,
            events,
            body,
        })
    }

    /// Writes a finish (now, or replayed from the spool): only a `running` run's.
    fn write_finish(&self, pending: &PendingFinish) -> Result<()> {
        let PendingFinish {
            run_id,
            finished_at,
            events,
            body,
        } = pending;
        let finished_at = *finished_at;
        if let Some(fleet) = &self.fleet {
            return fleet.finish(run_id, finished_at, events, body);
        }
        self.write_tx(|c| {
            let status: Option<String> = c
                .prepare_cached("SELECT status FROM runs WHERE run_id = ?1")?
                .query_row([run_id], |r| r.get(0))
                .optional()?;
            check_finishable(run_id, status.as_deref())?;
            for (kind, event) in events {
                append_entry(c, Some(run_id), kind, finished_at, event)?;
            }
            append_entry(c, Some(run_id), kinds::RUN_FINISH, finished_at, body)?;
            c.prepare_cached(
                "UPDATE runs SET finished_at = ?2, status = ?3, exit_code = ?4, exit_signal = ?5,
                    limit_fired = ?6, usage_json = ?7, startup_ms = ?8, wall_ms = ?9,
                    stdout_head = ?10, stdout_tail = ?11, stderr_head = ?12, stderr_tail = ?13,
                    cleanup_ok = ?14, cleanup_leftovers_json = ?15, result_json = ?16
                 WHERE run_id = ?1",
            )?
            .execute(params![
                run_id,
                finished_at,
                body["status"].as_str(),
                body["exit_code"].as_i64(),
                body["exit_signal"].as_i64(),
                body["limit_fired"].as_str(),
                json_col(&body["usage"]),
                body["startup_ms"].as_f64(),
                body["wall_ms"].as_f64(),
                body["stdout_head"].as_str(),
                body["stdout_tail"].as_str(),
                body["stderr_head"].as_str(),
                body["stderr_tail"].as_str(),
                body["cleanup_ok"].as_bool(),
                json_col(&body["cleanup_leftovers"]),
                json_col(&body["result"]),
            ])?;
            Ok(())
        })
    }

    /// Mark as `aborted` every `running` run whose supervisor is gone: another boot,
    /// pid not alive, or pid alive with a different start time (reused). In a fleet's
    /// store only this node's runs are judged (`[store] node`), and only by the process
    /// table that holds the name (`pg.rs`, "Node claims"): its own runs by pid, runs of an
    /// earlier holder of the name as gone (it had no session left when this one claimed
    /// the name). Another node's supervisor is not in this process table, so its absence
    /// here says nothing. The entry names the node that marked it (`reaped_by`).
    ///
    /// The spool's pending finishes are written first: those runs ended for real, and
    /// a run whose finish is still pending (the store went away again) is not reaped.
    pub fn reap_aborted(&self) -> Result<Vec<RunId>> {
        self.replay_spool()?;
        let pending = self.spool.pending_runs()?;
        let stale: Vec<(String, String)> = match &self.fleet {
            Some(fleet) => fleet.stale_runs_of_this_node()?,
            None => self
                .running_supervisors()?
                .into_iter()
                .filter_map(|(run_id, sup)| Some((run_id, proc_info::staleness(&sup)?)))
                .collect(),
        };
        let mut reaped = Vec::new();
        for (run_id, reason) in stale {
            if pending.contains(&run_id) {
                continue;
            }
            let at = now_ms();
            let mut body = json!({"finished_at": at, "status": STATUS_ABORTED, "reason": reason});
            if let Some(fleet) = &self.fleet {
                body["reaped_by"] = json!(fleet.node().as_str());
                if fleet.abort(&run_id, at, &body)? {
                    reaped.push(run_id);
                }
                continue;
            }
            let done = self.write_tx(|c| {
                // Another process may have reaped or finished it meanwhile.
                let n = c
                    .prepare_cached(
                        "UPDATE runs SET status = 'aborted', finished_at = ?2
                         WHERE run_id = ?1 AND status = 'running'",
                    )?
                    .execute(params![run_id, at])?;
                if n == 1 {
                    append_entry(c, Some(&run_id), kinds::RUN_ABORTED, at, &body)?;
                }
                Ok(n == 1)
            })?;
            if done {
                reaped.push(run_id);
            }
        }
        Ok(reaped)
    }

    /// The local file's running runs and their supervisors.
    fn running_supervisors(&self) -> Result<Vec<(String, proc_info::ProcessIdentity)>> {
        let mut stmt = self
            .conn
            .prepare_cached(
                "SELECT run_id, supervisor_pid, supervisor_start_time, boot_id
                 FROM runs WHERE status = 'running'",
            )
            .map_err(|e| self.ctx(e.into()))?;
        let rows = stmt
            .query_map([], |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    proc_info::ProcessIdentity {
                        pid: r.get(1)?,
                        start_time: r.get::<_, i64>(2)? as u64,
                        boot_id: r.get(3)?,
                    },
                ))
            })
            .and_then(|rows| rows.collect::<rusqlite::Result<Vec<_>>>())
            .map_err(|e| self.ctx(e.into()))?;
        Ok(rows)
    }

    pub fn list_runs(&self, filter: &RunFilter) -> Result<Vec<RunRecord>> {
        if let Some(fleet) = &self.fleet {
            return fleet.list_runs(filter);
        }
        let mut sql = format!("SELECT {SQLITE_RUN_COLUMNS} FROM runs WHERE 1 = 1");
        let mut args: Vec<rusqlite::types::Value> = Vec::new();
        if let Some(s) = &filter.status {
            sql.push_str(" AND status = ?");
            args.push(s.clone().into());
        }
        if let Some(c) = &filter.workload_class {
            sql.push_str(" AND workload_class = ?");
            args.push(c.clone().into());
        }
        if let Some(t) = filter.since {
            sql.push_str(" AND started_at >= ?");
            args.push(t.into());
        }
        if let Some(t) = filter.until {
            sql.push_str(" AND started_at < ?");
            args.push(t.into());
        }
        if let Some(uid) = filter.caller_uid {
            sql.push_str(" AND caller_uid = ?");
            args.push(i64::from(uid).into());
        }
        if let Some(session) = &filter.session_id {
            sql.push_str(" AND session_id = ?");
            args.push(session.clone().into());
        }
        if let Some(tenant) = &filter.tenant {
            sql.push_str(" AND tenant = ?");
            args.push(tenant.clone().into());
        }
        if let Some((started_at, run_id)) = &filter.before {
            sql.push_str(" AND (started_at < ? OR (started_at = ? AND run_id < ?))");
            args.extend([(*started_at).into(), (*started_at).into()]);
            args.push(run_id.clone().into());
        }
        sql.push_str(" ORDER BY started_at DESC, run_id DESC");
        if let Some(n) = filter.limit {
            sql.push_str(&format!(" LIMIT {n}"));
        }
        let run = || -> rusqlite::Result<Vec<RunRecord>> {
            let mut stmt = self.conn.prepare(&sql)?;
            let rows = stmt.query_map(rusqlite::params_from_iter(args.iter()), run_from_row)?;
            rows.collect()
        };
        run().map_err(|e| self.ctx(e.into()))
    }

    pub fn show_run(&self, run_id: &str) -> Result<Option<RunDetail>> {
        if let Some(fleet) = &self.fleet {
            return fleet.show_run(run_id);
        }
        self.read_tx(|c| {
            let run = c
                .query_row(
                    &format!("SELECT {SQLITE_RUN_COLUMNS} FROM runs WHERE run_id = ?1"),
                    [run_id],
                    run_from_row,
                )
                .optional()?;
            let Some(run) = run else { return Ok(None) };
            let mut stmt = c.prepare(&format!(
                "SELECT {ENTRY_COLUMNS} FROM audit_log WHERE run_id = ?1 ORDER BY seq"
            ))?;
            let events = stmt
                .query_map([run_id], entry_from_row)?
                .map(|r| r.map(|(e, _)| e))
                .collect::<rusqlite::Result<Vec<_>>>()?;
            Ok(Some(RunDetail { run, events }))
        })
    }

    /// Write the whole store as JSON lines for a SIEM: first every audit entry in chain
    /// order (`"type": "audit"`), then every run (`"type": "run"`). Returns the line count.
    pub fn export_jsonl<W: Write>(&self, mut out: W) -> Result<u64> {
        if let Some(fleet) = &self.fleet {
            return fleet.export_jsonl(&mut out);
        }
        let io = StoreError::Export;
        self.read_tx(|c| {
            let mut n = 0u64;
            let mut stmt = c.prepare(&format!(
                "SELECT {ENTRY_COLUMNS} FROM audit_log ORDER BY seq"
            ))?;
            let mut rows = stmt.query([])?;
            while let Some(row) = rows.next()? {
                let (e, _) = entry_from_row(row)?;
                let mut v = serde_json::to_value(&e)?;
                v["type"] = json!("audit");
                serde_json::to_writer(&mut out, &v)?;
                out.write_all(b"\n").map_err(io)?;
                n += 1;
            }
            let mut stmt = c.prepare(&format!(
                "SELECT {SQLITE_RUN_COLUMNS} FROM runs ORDER BY started_at, run_id"
            ))?;
            let mut rows = stmt.query([])?;
            while let Some(row) = rows.next()? {
                let mut v = serde_json::to_value(run_from_row(row)?)?;
                v["type"] = json!("run");
                serde_json::to_writer(&mut out, &v)?;
                out.write_all(b"\n").map_err(io)?;
                n += 1;
            }
            out.flush().map_err(io)?;
            Ok(n)
        })
    }

    /// How many runs of `tenant` the store holds, and how many audit entries are about
    /// them: what `GET /v1/audit/verify` shows a tenant (the fleet's counts are the
    /// operator's).
    pub fn tenant_counts(&self, tenant: &str) -> Result<TenantCounts> {
        if let Some(fleet) = &self.fleet {
            return fleet.tenant_counts(tenant);
        }
        self.read_tx(|c| {
            let runs: i64 = c.query_row(
                "SELECT COUNT(*) FROM runs WHERE tenant = ?1",
                [tenant],
                |r| r.get(0),
            )?;
            let entries: i64 = c.query_row(
                "SELECT COUNT(*) FROM audit_log
                 WHERE run_id IN (SELECT run_id FROM runs WHERE tenant = ?1)",
                [tenant],
                |r| r.get(0),
            )?;
            Ok(TenantCounts {
                runs: runs as u64,
                entries: entries as u64,
            })
        })
    }

    /// Per workload class statistics.
    pub fn stats(&self) -> Result<BTreeMap<String, ClassStats>> {
        if let Some(fleet) = &self.fleet {
            return fleet.stats();
        }
        self.read_tx(|c| {
            let mut fold = StatsFold::default();
            let mut stmt = c.prepare(
                "SELECT workload_class, status, startup_ms, limit_fired, cleanup_ok FROM runs",
            )?;
            let mut rows = stmt.query([])?;
            while let Some(r) = rows.next()? {
                fold.run(
                    r.get(0)?,
                    r.get(1)?,
                    r.get(2)?,
                    r.get::<_, Option<String>>(3)?.as_deref(),
                    r.get(4)?,
                );
            }
            let mut stmt = c.prepare(
                "SELECT r.workload_class,
                        COALESCE(json_extract(a.body_json, '$.reason_code'), 'unknown'),
                        COUNT(*)
                 FROM audit_log a JOIN runs r ON r.run_id = a.run_id
                 WHERE json_valid(a.body_json)
                   AND lower(json_extract(a.body_json, '$.decision'))
                       IN ('deny', 'denied', 'reject', 'rejected')
                 GROUP BY 1, 2",
            )?;
            let mut rows = stmt.query([])?;
            while let Some(r) = rows.next()? {
                let n: i64 = r.get(2)?;
                fold.denials(r.get(0)?, r.get(1)?, n as u64);
            }
            Ok(fold.finish())
        })
    }

    /// Delete finished runs (and their audit entries) that finished before
    /// `now - older_than`. Only a prefix of the chain is removed; a `store.prune`
    /// checkpoint entry records the hash of the last removed entry, which is the anchor
    /// `verify` checks the first remaining entry against. Returns the runs removed.
    pub fn prune(&self, older_than: Duration) -> Result<usize> {
        let cutoff = now_ms().saturating_sub(older_than.as_millis() as i64);
        if let Some(fleet) = &self.fleet {
            return fleet.prune(cutoff);
        }
        self.write_tx(|c| {
            // (run_id, eligible, min seq, max seq) of every run that has entries.
            let mut stmt = c.prepare(
                "SELECT a.run_id,
                        r.status != 'running' AND r.finished_at IS NOT NULL AND r.finished_at < ?1,
                        MIN(a.seq), MAX(a.seq)
                 FROM audit_log a LEFT JOIN runs r ON r.run_id = a.run_id
                 WHERE a.run_id IS NOT NULL GROUP BY a.run_id",
            )?;
            let spans = stmt
                .query_map([cutoff], |r| {
                    Ok(chain::RunSpan {
                        run_id: r.get(0)?,
                        eligible: r.get::<_, Option<bool>>(1)?.unwrap_or(false),
                        min_seq: r.get(2)?,
                        max_seq: r.get(3)?,
                    })
                })?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            drop(stmt);
            let head: i64 =
                c.query_row("SELECT seq FROM chain_head WHERE id = 1", [], |r| r.get(0))?;
            let (cut, doomed) = chain::prune_cut(&spans, head);
            if doomed.is_empty() {
                return Ok(0);
            }
            let anchor: Option<(i64, String)> = c
                .query_row(
                    "SELECT seq, hash FROM audit_log WHERE seq <= ?1 ORDER BY seq DESC LIMIT 1",
                    [cut],
                    |r| Ok((r.get(0)?, r.get(1)?)),
                )
                .optional()?;
            let Some((anchor_seq, anchor_hash)) = anchor else {
                return Ok(0);
            };
            c.execute("DELETE FROM audit_log WHERE seq <= ?1", [anchor_seq])?;
            let mut del = c.prepare("DELETE FROM runs WHERE run_id = ?1")?;
            let mut del_plan = c.prepare("DELETE FROM run_plans WHERE run_id = ?1")?;
            for id in &doomed {
                del.execute([id])?;
                del_plan.execute([id])?;
            }
            drop((del, del_plan));
            let at = now_ms();
            append_entry(
                c,
                None,
                kinds::STORE_PRUNE,
                at,
                &json!({
                    "pruned_through_seq": anchor_seq,
                    "anchor_hash": anchor_hash,
                    "runs_pruned": doomed.len(),
                    "cutoff": cutoff,
                }),
            )?;
            Ok(doomed.len())
        })
    }

    /// Check the whole audit trail; `Err(StoreError::Tampered)` names the first broken
    /// record (chain order first, then run rows).
    pub fn verify(&self) -> Result<VerifyReport> {
        if let Some(fleet) = &self.fleet {
            return fleet.verify();
        }
        self.read_tx(verify_in)
    }

    /// Leaves this connection's WAL checkpoints to [`Store::checkpoint_passive`] calls
    /// instead of the commit that crosses [`WAL_AUTOCHECKPOINT_PAGES`]: a long-lived
    /// threaded caller (the service) checkpoints on a thread of its own, so the two
    /// fsyncs of a checkpoint never land in a request's begin or finish record.
    pub fn leave_checkpoints_to_caller(&self) -> Result<()> {
        self.conn
            .execute_batch("PRAGMA wal_autocheckpoint = 0")
            .map_err(|e| self.ctx(e.into()))
    }

    /// Copies what it can of the WAL into the main file without waiting for writers or
    /// readers (`PRAGMA wal_checkpoint(PASSIVE)`); the WAL is reused from its start once
    /// all of it was copied. Returns the WAL's frames and how many are checkpointed.
    pub fn checkpoint_passive(&self) -> Result<(i64, i64)> {
        self.conn
            .query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |row| {
                Ok((row.get(1)?, row.get(2)?))
            })
            .map_err(|e| self.ctx(e.into()))
    }

    /// Checkpoint the WAL into the main file (e.g. before copying or inspecting it).
    pub fn checkpoint(&self) -> Result<()> {
        self.conn
            .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
            .map_err(|e| self.ctx(e.into()))
    }
}

fn verify_in(c: &Connection) -> Result<VerifyReport> {
    let (head_seq, head_hash): (i64, String) =
        c.query_row("SELECT seq, hash FROM chain_head WHERE id = 1", [], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })?;
    let checkpoint: Option<String> = c
        .query_row(
            "SELECT body_json FROM audit_log WHERE kind = ?1 ORDER BY seq DESC LIMIT 1",
            [kinds::STORE_PRUNE],
            |r| r.get(0),
        )
        .optional()?;
    let mut check = chain::ChainCheck::new(checkpoint.as_deref());
    let mut stmt = c.prepare(&format!(
        "SELECT {ENTRY_COLUMNS} FROM audit_log ORDER BY seq"
    ))?;
    let mut rows = stmt.query([])?;
    while let Some(row) = rows.next()? {
        let (e, body_json) = entry_from_row(row)?;
        check.entry(&e, &body_json)?;
    }
    drop(rows);
    drop(stmt);
    check.end_of_chain(head_seq, &head_hash)?;
    let mut stmt = c.prepare(&format!(
        "SELECT {SQLITE_RUN_COLUMNS} FROM runs ORDER BY run_id"
    ))?;
    let mut rows = stmt.query([])?;
    while let Some(row) = rows.next()? {
        check.run_row(&run_from_row(row)?)?;
    }
    check.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    impl Store {
        /// Every audit entry in chain order.
        fn export_jsonl_entries(&self) -> Vec<AuditEntry> {
            let mut out = Vec::new();
            self.export_jsonl(&mut out).unwrap();
            String::from_utf8(out)
                .unwrap()
                .lines()
                .map(|l| serde_json::from_str::<Value>(l).unwrap())
                .filter(|v| v["type"] == "audit")
                .map(|mut v| {
                    v.as_object_mut().unwrap().remove("type");
                    serde_json::from_value(v).unwrap()
                })
                .collect()
        }
    }

    #[test]
    fn percentile_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 0.5), Some(50.0));
        assert_eq!(percentile(&v, 0.99), Some(99.0));
        assert_eq!(percentile(&[3.0], 0.99), Some(3.0));
        assert_eq!(percentile(&[], 0.5), None);
    }

    #[test]
    fn hash_is_field_separated() {
        let a = entry_hash(GENESIS_HASH, 1, Some("ab"), "c", 0, "{}");
        let b = entry_hash(GENESIS_HASH, 1, Some("a"), "bc", 0, "{}");
        let n = entry_hash(GENESIS_HASH, 1, None, "c", 0, "{}");
        assert_ne!(a, b);
        assert_ne!(a, n);
        assert_eq!(a, entry_hash(GENESIS_HASH, 1, Some("ab"), "c", 0, "{}"));
    }

    fn begun(store: &Store, argv: &str) -> RunHandle {
        let start = RunStart {
            argv: vec![argv.into()],
            ..RunStart::default()
        };
        store.begin_run(start, vec!["s3cret".into()]).unwrap()
    }

    fn ended(status: &str) -> RunEnd {
        RunEnd {
            status: status.into(),
            stdout_tail: "said s3cret".into(),
            events: vec![("cleanup".into(), json!({"ok": true}))],
            ..RunEnd::default()
        }
    }

    #[test]
    fn spooled_finishes_are_replayed_in_order_once_and_keep_the_chain_valid() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let (a, b) = (begun(&store, "a"), begun(&store, "b"));
        // As finish_run_or_spool keeps them when the store is unavailable: b ended first.
        let pb = store.pending_finish(&b, ended("task_error")).unwrap();
        let pa = store.pending_finish(&a, ended("ok")).unwrap();
        store.spool.put(&pb, "down").unwrap();
        store.spool.put(&pa, "down").unwrap();
        // Redacted before it reached the disk.
        let on_disk: Vec<u8> = std::fs::read_dir(store.spool.dir())
            .unwrap()
            .flat_map(|e| std::fs::read(e.unwrap().path()).unwrap())
            .collect();
        assert!(!String::from_utf8_lossy(&on_disk).contains("s3cret"));
        let done = store.replay_spool().unwrap();
        assert_eq!((done.written, done.already), (2, 0), "{done:?}");
        assert!(store.spool.is_empty());
        let order: Vec<String> = store
            .export_jsonl_entries()
            .into_iter()
            .filter(|e| e.kind == kinds::RUN_FINISH)
            .map(|e| e.run_id.unwrap())
            .collect();
        assert_eq!(order, [b.run_id(), a.run_id()], "replayed in spooled order");
        let show = |h: &RunHandle| store.show_run(&h.run_id()).unwrap().unwrap().run;
        assert_eq!(show(&a).status, "ok");
        assert_eq!(show(&b).status, "task_error");
        let report = store.verify().unwrap();
        // A file that outlived its commit (a crash before the unlink) is replayed again:
        // found already finished, only removed; the chain does not grow.
        store.spool.put(&pa, "down").unwrap();
        let again = store.replay_spool().unwrap();
        assert_eq!((again.written, again.already), (0, 1), "{again:?}");
        assert!(again.lost.is_empty());
        assert_eq!(store.verify().unwrap(), report);
    }

    #[test]
    fn a_pending_finish_whose_run_ended_otherwise_is_counted_lost() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let a = begun(&store, "a");
        let pending = store.pending_finish(&a, ended("ok")).unwrap();
        // The run ended otherwise meanwhile (here: finished with another status).
        store.finish_run(&a, ended("runtime_fault")).unwrap();
        store.spool.put(&pending, "down").unwrap();
        let before = spool::lost_finishes();
        let done = store.replay_spool().unwrap();
        assert_eq!(done.lost, [a.run_id()]);
        assert!(spool::lost_finishes() > before);
        assert!(store.spool.is_empty());
        store.verify().unwrap();
    }

    #[test]
    fn kinds_are_validated() {
        assert!(valid_kind("egress.decision"));
        assert!(!valid_kind(""));
        assert!(!valid_kind("Egress"));
        assert!(!valid_kind("a b"));
    }
}
