//! Numbered schema migrations, tracked in `PRAGMA user_version`.
//!
//! Each migration runs in its own `BEGIN IMMEDIATE` transaction and re-reads the
//! version inside it, so many processes opening a fresh store at once apply each step
//! exactly once. Migrations are append-only: never edit a released one.

use rusqlite::Connection;

/// Version 1: runs, the audit chain and its head pointer.
const V1: &str = r#"
CREATE TABLE runs (
    run_id TEXT PRIMARY KEY NOT NULL,
    started_at INTEGER NOT NULL,
    finished_at INTEGER,
    argv_json TEXT NOT NULL,
    input_sha256 TEXT NOT NULL,
    contract_sha256 TEXT NOT NULL,
    workload_class TEXT NOT NULL,
    plan_json TEXT,
    status TEXT NOT NULL,
    exit_code INTEGER,
    exit_signal INTEGER,
    limit_fired TEXT,
    usage_json TEXT,
    startup_ms REAL,
    wall_ms REAL,
    stdout_head TEXT,
    stdout_tail TEXT,
    stderr_head TEXT,
    stderr_tail TEXT,
    cleanup_ok INTEGER,
    cleanup_leftovers_json TEXT,
    result_json TEXT,
    supervisor_pid INTEGER NOT NULL,
    supervisor_start_time INTEGER NOT NULL,
    boot_id TEXT NOT NULL
);
CREATE TABLE audit_log (
    seq INTEGER PRIMARY KEY,
    run_id TEXT,
    kind TEXT NOT NULL,
    at INTEGER NOT NULL,
    body_json TEXT NOT NULL,
    prev_hash TEXT NOT NULL,
    hash TEXT NOT NULL
);
CREATE TABLE chain_head (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    seq INTEGER NOT NULL,
    hash TEXT NOT NULL
);
INSERT INTO chain_head (id, seq, hash)
    VALUES (1, 0, '0000000000000000000000000000000000000000000000000000000000000000');
"#;

/// Version 2: indexes for `reap_aborted` (runs at every CLI start), `list_runs` and
/// `show_run`, which scanned whole tables in version 1. Kept to three because every index
/// is one more WAL frame per write and one more page to recover when the store opens.
const V2: &str = r#"
CREATE INDEX runs_running ON runs (status) WHERE status = 'running';
CREATE INDEX runs_started ON runs (started_at);
CREATE INDEX audit_log_run ON audit_log (run_id, seq);
"#;

/// Version 3: who started each run (the real uid of the calling process), so that a
/// shared store lists a user's own runs by default. Rows of earlier versions have NULL.
const V3: &str = r#"
ALTER TABLE runs ADD COLUMN caller_uid INTEGER;
"#;

/// Version 4: the session a run is a command of (NULL for a run of its own), so that a
/// session's commands are listed together.
const V4: &str = r#"
ALTER TABLE runs ADD COLUMN session_id TEXT;
"#;

/// Requests waiting for (or decided by) an approver, and the capability-review records a
/// policy denial leaves for an operator (the policy layer: docs/policy.md). Every change
/// of either is also an audit entry.
const APPROVALS_AND_REVIEWS: &str = r#"
CREATE TABLE approvals (
    approval_id TEXT PRIMARY KEY NOT NULL,
    created_at INTEGER NOT NULL,
    expires_at INTEGER NOT NULL,
    workload_class TEXT NOT NULL,
    requester TEXT NOT NULL,
    argv_json TEXT NOT NULL,
    asked_json TEXT NOT NULL,
    what_json TEXT NOT NULL,
    capability_keys_json TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    status TEXT NOT NULL,
    decided_by TEXT,
    decided_at INTEGER,
    reason TEXT,
    scope TEXT,
    grant_expires_at INTEGER,
    used_at INTEGER
);
CREATE INDEX approvals_status ON approvals (status, workload_class);
CREATE TABLE capability_reviews (
    review_id TEXT PRIMARY KEY NOT NULL,
    created_at INTEGER NOT NULL,
    run_id TEXT,
    workload_class TEXT NOT NULL,
    requester TEXT NOT NULL,
    argv_json TEXT NOT NULL,
    asked_json TEXT NOT NULL,
    reason_code TEXT NOT NULL,
    detail TEXT NOT NULL
);
"#;

/// The transcripts of `airlock agent` (crates/store/src/transcripts.rs), redacted.
const AGENT_TRANSCRIPTS: &str = r#"
CREATE TABLE agent_transcripts (
    id TEXT PRIMARY KEY,
    started_at INTEGER NOT NULL,
    finished_at INTEGER NOT NULL,
    model TEXT NOT NULL,
    endpoint TEXT NOT NULL,
    task TEXT NOT NULL,
    outcome TEXT NOT NULL,
    turns INTEGER NOT NULL,
    tool_calls INTEGER NOT NULL,
    messages TEXT NOT NULL
);
CREATE INDEX agent_transcripts_started ON agent_transcripts (started_at);
"#;

/// The service tenant a run belongs to (`airlock serve`; NULL for the command line's runs),
/// so that one tenant's runs are listed and shown only to it.
const RUN_TENANTS: &str = r#"
ALTER TABLE runs ADD COLUMN tenant TEXT;
"#;

/// The fleet node that ran each run (crates/store/src/node.rs): the same column as a
/// fleet's Postgres (its migration 2), so both backends have one set of columns. NULL in
/// a node's own file, whose runs are all this node's, and for runs recorded before it.
const RUN_NODES: &str = r#"
ALTER TABLE runs ADD COLUMN node TEXT;
"#;

/// A run's plan in a table of its own, written once by the begin record. In `runs` it made
/// every finish record rewrite it: SQLite rewrites the whole record of a row whose size an
/// `UPDATE` changes, ~10 KB of overflow pages for a compiled plan (4 of a finish record's 9
/// WAL frames, docs/benchmarks.md). Runs recorded before keep theirs in `runs.plan_json`.
const RUN_PLANS: &str = r#"
CREATE TABLE run_plans (
    run_id TEXT PRIMARY KEY NOT NULL,
    plan_json TEXT
);
"#;

pub const MIGRATIONS: &[&str] = &[
    V1,
    V2,
    V3,
    V4,
    APPROVALS_AND_REVIEWS,
    AGENT_TRANSCRIPTS,
    RUN_TENANTS,
    RUN_NODES,
    RUN_PLANS,
];
pub const LATEST: i64 = MIGRATIONS.len() as i64;

pub fn version(conn: &Connection) -> rusqlite::Result<i64> {
    conn.query_row("PRAGMA user_version", [], |r| r.get(0))
}

/// Apply migrations up to `target`. Returns the version found before migrating.
pub fn migrate(conn: &Connection, target: i64) -> rusqlite::Result<i64> {
    let before = version(conn)?;
    for (i, sql) in MIGRATIONS.iter().enumerate().take(target as usize) {
        let v = i as i64 + 1;
        conn.execute_batch("BEGIN IMMEDIATE")?;
        let res = (|| {
            if version(conn)? < v {
                conn.execute_batch(sql)?;
                conn.execute_batch(&format!("PRAGMA user_version = {v}"))?;
            }
            Ok(())
        })();
        match res {
            Ok(()) => conn.execute_batch("COMMIT")?,
            Err(e) => {
                let _ = conn.execute_batch("ROLLBACK");
                return Err(e);
            }
        }
    }
    Ok(before)
}
