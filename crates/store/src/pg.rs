//! The fleet backend: runs and the audit chain in a shared Postgres database
//! (`[store] url = "postgres://..."`), so several nodes (or several `airlock serve`
//! instances) write one chain and any of them answers for any run.
//!
//! Same semantics as SQLite: the same tables and columns, the same entry hash, the same
//! checks (`chain.rs` holds them for both). Body texts are stored as `TEXT`, never `jsonb`,
//! because `jsonb` rewrites the text and the hash is over the exact bytes. Every write
//! transaction first locks the chain head row (`SELECT ... FOR UPDATE`), which serialises
//! writers across processes and nodes the way SQLite's `BEGIN IMMEDIATE` does: one linear
//! chain, and each check-then-write (finish only a running run) sees every earlier commit.
//!
//! Nodes: each run records the node whose supervisor runs it (`node.rs`), and a node
//! reaps only its own runs ([`Fleet::running_of_this_node`]): another node's supervisors
//! are not in this process table, so their absence here proves nothing.
//!
//! Node claims ([`Fleet::claim_node`]): a node name is written by one holder at a time,
//! one process table ([`NodeHolder`]: boot id and pid namespace). The `nodes` table
//! records each name's holder; every connection of the holder keeps a shared session
//! advisory lock on the name's row for as long as it is open. That lock is the lease: it
//! needs no clock and no renewal thread (`airlock run` stays single-threaded), lasts as
//! long as a short `airlock run` or a long `airlock serve`, and ends when the process
//! does (its connection closes; a crashed machine's once the server's TCP keepalive ends
//! its sessions). Another holder's claim is refused while any such session is live;
//! once none is, it takes the name, and the runs the earlier holder left `running` are
//! its to mark aborted (that holder can no longer record their ends).
//!
//! Transport ([`PostgresUrl::parse`]): a unix socket or a loopback address may be
//! plaintext; any other host only with `sslmode=verify-full` and `sslrootcert=` (rustls,
//! `pg_tls.rs`): records never cross a network in plaintext or to an unverified server.

use std::cell::RefCell;
use std::io::Write;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use postgres::config::Host;
use postgres::{Client, NoTls, Row, Transaction};
use serde_json::{json, Value};

use crate::chain::{self, ChainCheck, RunSpan};
use crate::node::{self, NodeHolder, NodeName, RunJudgement};
use crate::pg_tls;
use crate::{
    json_col, kinds, now_ms, parse_json_col, proc_info, AuditEntry, ClassStats, Result, RunDetail,
    RunFilter, RunRecord, StatsFold, StoreError, VerifyReport, ENTRY_COLUMNS, RUN_COLUMNS,
    STATUS_RUNNING,
};
use std::collections::BTreeMap;

/// How long connecting may take before the store counts as unreachable (a refusal).
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// The first wait before reconnecting a lost connection; doubled per failed attempt up to
/// [`RECONNECT_MAX`], each wait jittered to 50-100% of its value so that the nodes (and
/// the connections of one node) that lost the server together do not return together.
pub const RECONNECT_MIN: Duration = Duration::from_millis(100);
/// The longest wait between two reconnection attempts.
pub const RECONNECT_MAX: Duration = Duration::from_secs(5);

/// A checked `postgres://` URL: parsed, and with a transport that does not send audit
/// records over a network unverified ([`PostgresUrl::parse`]). Its text may hold a
/// password: it is never shown; [`Self::shown`] is the form for messages.
#[derive(Clone)]
pub struct PostgresUrl {
    config: postgres::Config,
    transport: Transport,
    /// A host given by name, resolved when connecting (see [`PostgresUrl::connect`]).
    by_name: Option<NamedHost>,
    shown: String,
}

impl std::fmt::Debug for PostgresUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.shown)
    }
}

/// How the connection is carried, decided from the URL's hosts and `sslmode`.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Transport {
    /// Unix sockets and loopback addresses only.
    Plaintext,
    /// `sslmode=verify-full`: the chain verified against `sslrootcert`, the name checked.
    VerifiedTls { root_cert: PathBuf },
}

/// The one host of a URL given by name, and what its addresses must be.
#[derive(Debug, Clone, PartialEq, Eq)]
struct NamedHost {
    name: String,
    port: u16,
    /// `localhost` without TLS: every address it resolves to must be a loopback one.
    loopback_only: bool,
}

/// What a URL's host entry is, for the transport rules.
#[derive(Debug, Clone, PartialEq, Eq)]
enum HostKind {
    Socket,
    Loopback,
    /// `localhost` (any case): loopback only if it resolves only to loopback addresses.
    Localhost,
    /// An address or a name elsewhere on a network.
    Network(String),
    /// Only `hostaddr`s, no host: no name a certificate could be checked against.
    AddressOnly,
}

/// The `sslmode` values of libpq, all of which a URL may name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SslMode {
    Disable,
    Allow,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

impl SslMode {
    fn parse(v: &str) -> std::result::Result<SslMode, String> {
        Ok(match v {
            "disable" => SslMode::Disable,
            "allow" => SslMode::Allow,
            "prefer" => SslMode::Prefer,
            "require" => SslMode::Require,
            "verify-ca" => SslMode::VerifyCa,
            "verify-full" => SslMode::VerifyFull,
            _ => {
                return Err(format!(
                    "sslmode={v}: not one of disable, allow, prefer, require, verify-ca, \
                     verify-full"
                ))
            }
        })
    }
}

/// The TLS parameters of a URL, taken out of its query before postgres parses the rest
/// (it knows neither `verify-*` nor `sslrootcert`).
#[derive(Debug, Default, PartialEq, Eq)]
struct TlsParams {
    sslmode: Option<String>,
    sslrootcert: Option<String>,
}

fn split_tls_params(url: &str) -> (String, TlsParams) {
    let Some((base, query)) = url.split_once('?') else {
        return (url.to_string(), TlsParams::default());
    };
    let mut tls = TlsParams::default();
    let mut kept = Vec::new();
    for pair in query.split('&') {
        match pair.split_once('=') {
            Some(("sslmode", v)) => tls.sslmode = Some(v.to_string()),
            Some(("sslrootcert", v)) => tls.sslrootcert = Some(v.to_string()),
            _ => kept.push(pair),
        }
    }
    if kept.is_empty() {
        (base.to_string(), tls)
    } else {
        (format!("{base}?{}", kept.join("&")), tls)
    }
}

fn host_kinds(config: &postgres::Config) -> Vec<HostKind> {
    let hosts = config.get_hosts().iter().map(|h| match h {
        Host::Unix(_) => HostKind::Socket,
        Host::Tcp(name) if name.eq_ignore_ascii_case("localhost") => HostKind::Localhost,
        Host::Tcp(name) if is_loopback_address(name) => HostKind::Loopback,
        Host::Tcp(name) => HostKind::Network(name.clone()),
    });
    let addrs = config.get_hostaddrs().iter().map(|a| {
        if a.is_loopback() {
            HostKind::Loopback
        } else {
            HostKind::Network(format!("hostaddr {a}"))
        }
    });
    let address_only = config
        .get_hosts()
        .is_empty()
        .then_some(HostKind::AddressOnly);
    hosts.chain(addrs).chain(address_only).collect()
}

/// The transport for `mode` and these hosts (pure): the rules of [`PostgresUrl::parse`].
fn decide_transport(
    mode: Option<SslMode>,
    root_cert: Option<&str>,
    hosts: &[HostKind],
) -> std::result::Result<Transport, String> {
    let network = hosts.iter().find_map(|h| match h {
        HostKind::Network(name) => Some(name.as_str()),
        _ => None,
    });
    match mode {
        Some(SslMode::VerifyFull) => {
            if hosts.contains(&HostKind::Socket) {
                return Err(
                    "sslmode=verify-full with a unix socket directory: Postgres has no \
                            TLS over a unix socket (give only TCP hosts, or drop sslmode)"
                        .into(),
                );
            }
            if hosts.contains(&HostKind::AddressOnly) {
                return Err(
                    "sslmode=verify-full with only hostaddr: give host=<name on the \
                            certificate> too (hostaddr is where to connect, host what the \
                            certificate must name)"
                        .into(),
                );
            }
            match root_cert {
                Some(path) if Path::new(path).is_absolute() => Ok(Transport::VerifiedTls {
                    root_cert: PathBuf::from(path),
                }),
                Some(path) => Err(format!(
                    "sslrootcert={path}: must be an absolute path (the CA file the server's \
                     certificate is verified against)"
                )),
                None => Err(
                    "sslmode=verify-full needs sslrootcert=<CA file>: the server's \
                             certificate is verified against that file only"
                        .into(),
                ),
            }
        }
        Some(weak @ (SslMode::Require | SslMode::VerifyCa)) => Err(format!(
            "sslmode={}: {} - give sslmode=verify-full with sslrootcert=<CA file> (or, on a \
             unix socket or loopback address, no sslmode)",
            if weak == SslMode::Require {
                "require"
            } else {
                "verify-ca"
            },
            if weak == SslMode::Require {
                "encrypts without checking who answers"
            } else {
                "checks the chain but not that it names the host"
            }
        )),
        None | Some(SslMode::Disable | SslMode::Allow | SslMode::Prefer) => match network {
            Some(name) => Err(format!(
                "host {name:?} is not a unix socket directory or a loopback address: audit \
                 records cross a network only over verified TLS (sslmode=verify-full with \
                 sslrootcert=<CA file>){}",
                match mode {
                    Some(SslMode::Disable) => "; sslmode=disable sends them in plaintext",
                    Some(_) => "; sslmode=allow/prefer may send them in plaintext",
                    None => "",
                }
            )),
            None => Ok(Transport::Plaintext),
        },
    }
}

/// The one host given by name, which [`PostgresUrl::connect`] resolves on the calling
/// thread (postgres would resolve it on a thread of its own, and `airlock run` clones
/// its cell from a process that must be single-threaded). A URL naming a host without
/// `hostaddr` has exactly that one host; with `hostaddr` (one per host) nothing is
/// resolved.
fn named_host(
    config: &postgres::Config,
    kinds: &[HostKind],
    transport: &Transport,
) -> std::result::Result<Option<NamedHost>, String> {
    let names: Vec<&str> = config
        .get_hosts()
        .iter()
        .zip(kinds)
        .filter_map(|(h, kind)| match (h, kind) {
            (Host::Tcp(name), HostKind::Localhost) => Some(name.as_str()),
            (Host::Tcp(name), HostKind::Network(_)) if name.parse::<IpAddr>().is_err() => {
                Some(name.as_str())
            }
            _ => None,
        })
        .collect();
    let Some(name) = names.first() else {
        return Ok(None);
    };
    let (hosts, addrs) = (config.get_hosts().len(), config.get_hostaddrs().len());
    if addrs > 0 {
        // Where to connect is given: the names are only what the certificate must name.
        return match addrs == hosts {
            true => Ok(None),
            false => Err(format!(
                "{hosts} hosts and {addrs} hostaddrs: give one hostaddr per host"
            )),
        };
    }
    if hosts != 1 {
        return Err(format!(
            "host {name:?} is a name: a URL naming its host by name (without hostaddr) has \
             that one host"
        ));
    }
    Ok(Some(NamedHost {
        name: name.to_string(),
        port: config.get_ports().first().copied().unwrap_or(5432),
        loopback_only: *transport == Transport::Plaintext,
    }))
}

impl PostgresUrl {
    /// Parse and check `url`. Refused: anything that is not a Postgres connection string,
    /// one that names no host, and one whose records could cross a network unverified:
    /// a host that is neither a unix socket directory nor a loopback address needs
    /// `sslmode=verify-full` and `sslrootcert=<CA file>` (`disable`, `allow`, `prefer`,
    /// `require` and `verify-ca` are refused, for every host: this airlock verifies TLS
    /// fully or does not use it). `localhost` is accepted where loopback is, and must then
    /// resolve only to loopback addresses ([`Self::connect`]).
    pub fn parse(url: &str) -> Result<PostgresUrl> {
        let invalid = |why: String| StoreError::InvalidUrl(why);
        if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
            return Err(invalid(
                "must start with postgres:// (e.g. postgres://airlock@/airlock?host=/run/postgresql)"
                    .into(),
            ));
        }
        let (rest, tls) = split_tls_params(url);
        let mode = tls
            .sslmode
            .as_deref()
            .map(SslMode::parse)
            .transpose()
            .map_err(invalid)?;
        let mut config = postgres::Config::from_str(&rest)
            .map_err(|e| invalid(format!("not a Postgres connection URL: {e}")))?;
        if config.get_hosts().is_empty() && config.get_hostaddrs().is_empty() {
            return Err(invalid(
                "names no host: give a unix socket directory (?host=/run/postgresql) or a \
                 loopback address (127.0.0.1)"
                    .into(),
            ));
        }
        let kinds = host_kinds(&config);
        let transport =
            decide_transport(mode, tls.sslrootcert.as_deref(), &kinds).map_err(invalid)?;
        let by_name = named_host(&config, &kinds, &transport).map_err(invalid)?;
        config.ssl_mode(match transport {
            Transport::Plaintext => postgres::config::SslMode::Disable,
            Transport::VerifiedTls { .. } => postgres::config::SslMode::Require,
        });
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(CONNECT_TIMEOUT);
        }
        config.application_name("airlock");
        let shown = shown(&config, &transport);
        Ok(PostgresUrl {
            config,
            transport,
            by_name,
            shown,
        })
    }

    /// The URL without its password, for messages.
    pub fn shown(&self) -> &str {
        &self.shown
    }

    /// Whether records to this database travel over verified TLS.
    pub fn uses_tls(&self) -> bool {
        matches!(self.transport, Transport::VerifiedTls { .. })
    }

    /// Connect, with TLS when the URL asks for it. A host given by name is resolved here,
    /// on the calling thread, and tried address by address; `localhost` without TLS is
    /// refused if any of its addresses is not a loopback one (a hosts file or resolver
    /// could point it elsewhere, and the records would leave the machine in plaintext).
    fn connect(&self) -> std::result::Result<Client, ConnectFailure> {
        let Some(named) = &self.by_name else {
            return self.connect_with(&self.config);
        };
        let addrs = resolve(named)?;
        let mut last = None;
        for addr in addrs {
            let mut config = self.config.clone();
            config.hostaddr(addr);
            match self.connect_with(&config) {
                Ok(client) => return Ok(client),
                Err(e) => {
                    last = Some(ConnectFailure {
                        detail: format!("{addr}: {}", e.detail),
                        outage: e.outage,
                    })
                }
            }
        }
        Err(last.unwrap_or_else(|| ConnectFailure {
            detail: format!("host {:?} resolves to no address", named.name),
            outage: true,
        }))
    }

    fn connect_with(
        &self,
        config: &postgres::Config,
    ) -> std::result::Result<Client, ConnectFailure> {
        let connected = match &self.transport {
            Transport::Plaintext => config.connect(NoTls),
            Transport::VerifiedTls { root_cert } => {
                let tls = pg_tls::VerifiedTls::from_ca_file(root_cert)
                    .map_err(ConnectFailure::refused)?;
                config.connect(tls)
            }
        };
        connected.map_err(|e| ConnectFailure {
            detail: pg_detail(&e),
            outage: is_connection_loss(&e),
        })
    }
}

/// Why connecting failed, and whether that is an outage (the server down or unreachable:
/// retry) or a refusal (a certificate, a password, a name that resolves off loopback:
/// fix the configuration).
#[derive(Debug)]
struct ConnectFailure {
    detail: String,
    outage: bool,
}

impl ConnectFailure {
    fn refused(detail: String) -> ConnectFailure {
        ConnectFailure {
            detail,
            outage: false,
        }
    }
}

/// The addresses of a named host, resolved by the C library on this thread; for
/// `localhost` without TLS, only if every one is a loopback address.
fn resolve(named: &NamedHost) -> std::result::Result<Vec<IpAddr>, ConnectFailure> {
    use std::net::ToSocketAddrs;
    let addrs: Vec<IpAddr> = (named.name.as_str(), named.port)
        .to_socket_addrs()
        .map_err(|e| ConnectFailure {
            detail: format!("host {:?} cannot be resolved: {e}", named.name),
            outage: true,
        })?
        .map(|a| a.ip())
        .collect();
    if named.loopback_only {
        if let Some(away) = addrs.iter().find(|a| !a.is_loopback()) {
            return Err(ConnectFailure::refused(format!(
                "host {:?} resolves to {away}, which is not a loopback address: without TLS \
                 records go only to unix sockets and loopback addresses",
                named.name
            )));
        }
    }
    Ok(addrs)
}

/// An address literal of the loopback network.
fn is_loopback_address(name: &str) -> bool {
    name.trim_matches(['[', ']'])
        .parse::<IpAddr>()
        .is_ok_and(|a| a.is_loopback())
}

fn shown(config: &postgres::Config, transport: &Transport) -> String {
    let names: Vec<String> = config
        .get_hosts()
        .iter()
        .map(|h| match h {
            Host::Tcp(name) => name.clone(),
            Host::Unix(dir) => dir.display().to_string(),
        })
        .collect();
    let addrs: Vec<String> = config
        .get_hostaddrs()
        .iter()
        .map(IpAddr::to_string)
        .collect();
    // With both, the names are what certificates must name and the addresses where to
    // connect: shown as the URL gives them.
    let (hosts, hostaddr) = match (names.is_empty(), addrs.is_empty()) {
        (true, _) => (addrs, None),
        (false, true) => (names, None),
        (false, false) => (names, Some(addrs.join(","))),
    };
    let mut query: Vec<String> = hostaddr
        .map(|a| format!("hostaddr={a}"))
        .into_iter()
        .collect();
    if let Transport::VerifiedTls { root_cert } = transport {
        query.push(format!(
            "sslmode=verify-full&sslrootcert={}",
            root_cert.display()
        ));
    }
    let ports: Vec<String> = config.get_ports().iter().map(u16::to_string).collect();
    format!(
        "postgres://{}@{}{}/{}{}",
        config.get_user().unwrap_or(""),
        hosts.join(","),
        if ports.is_empty() {
            String::new()
        } else {
            format!(":{}", ports.join(","))
        },
        config.get_dbname().unwrap_or(""),
        if query.is_empty() {
            String::new()
        } else {
            format!("?{}", query.join("&"))
        }
    )
}

/// Postgres migrations, tracked in `airlock_schema.version`, applied under an advisory
/// lock so nodes starting together apply each exactly once. Append-only. Version 1 is
/// SQLite's runs and audit chain as of its migration `RUN_TENANTS` (the same columns).
const MIGRATIONS: &[&str] = &[
    r#"
CREATE TABLE runs (
    run_id TEXT PRIMARY KEY NOT NULL,
    started_at BIGINT NOT NULL,
    finished_at BIGINT,
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
    startup_ms DOUBLE PRECISION,
    wall_ms DOUBLE PRECISION,
    stdout_head TEXT,
    stdout_tail TEXT,
    stderr_head TEXT,
    stderr_tail TEXT,
    cleanup_ok BOOLEAN,
    cleanup_leftovers_json TEXT,
    result_json TEXT,
    supervisor_pid BIGINT NOT NULL,
    supervisor_start_time BIGINT NOT NULL,
    boot_id TEXT NOT NULL,
    caller_uid BIGINT,
    session_id TEXT,
    tenant TEXT
);
CREATE TABLE audit_log (
    seq BIGINT PRIMARY KEY,
    run_id TEXT,
    kind TEXT NOT NULL,
    at BIGINT NOT NULL,
    body_json TEXT NOT NULL,
    prev_hash TEXT NOT NULL,
    hash TEXT NOT NULL
);
CREATE TABLE chain_head (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    seq BIGINT NOT NULL,
    hash TEXT NOT NULL
);
INSERT INTO chain_head (id, seq, hash)
    VALUES (1, 0, '0000000000000000000000000000000000000000000000000000000000000000');
CREATE INDEX runs_running ON runs (status) WHERE status = 'running';
CREATE INDEX runs_started ON runs (started_at);
CREATE INDEX audit_log_run ON audit_log (run_id, seq);
"#,
    RUN_NODES,
    NODE_CLAIMS,
];
/// Version 2: the fleet node whose supervisor runs each run (`node.rs`), so a restarted
/// node reaps only its own runs; NULL for runs recorded before it (SQLite's `RUN_NODES`).
const RUN_NODES: &str = r#"
ALTER TABLE runs ADD COLUMN node TEXT;
CREATE INDEX runs_running_node ON runs (node) WHERE status = 'running';
"#;
/// Version 3: who holds each node name ([`Fleet::claim_node`]), and the pid namespace of
/// the holder that recorded each run (with `boot_id`, the holder); NULL for runs recorded
/// before claims, which are judged as before in their own boot only (`node::judge_run`).
const NODE_CLAIMS: &str = r#"
CREATE TABLE nodes (
    id SERIAL PRIMARY KEY,
    name TEXT NOT NULL UNIQUE,
    boot_id TEXT NOT NULL,
    pid_ns BIGINT NOT NULL,
    claimed_at BIGINT NOT NULL
);
ALTER TABLE runs ADD COLUMN pid_ns BIGINT;
"#;
pub const LATEST: i64 = MIGRATIONS.len() as i64;
/// The advisory lock class of node names ("air\x01"): (class, nodes.id) is held shared
/// by every connection of a name's holder; (class, 0) serialises claims.
const NODE_LOCK_CLASS: i32 = 0x6169_7201;
/// The advisory lock key of migrations ("airlock" in ASCII).
const MIGRATION_LOCK: i64 = 0x0061_6972_6c6f_636b;

/// A fleet's shared store as a node opens it: the database, and the name this node's
/// runs are recorded under (and reaped by).
#[derive(Debug, Clone)]
pub struct FleetStore {
    pub url: PostgresUrl,
    pub node: NodeName,
}

/// The connection to a fleet's database. One thread at a time, like a SQLite connection.
pub(crate) struct Fleet {
    /// `None` once the connection was lost (or while it is dropped): the next use
    /// reconnects, within [`Backoff`].
    client: RefCell<Option<Client>>,
    /// What to reconnect to.
    store: FleetStore,
    backoff: RefCell<Backoff>,
    shown: String,
    node: NodeName,
    holder: NodeHolder,
}

/// When the next reconnection may be tried: bounded exponential backoff with jitter
/// ([`RECONNECT_MIN`], [`RECONNECT_MAX`]). Between attempts a use fails at once (the
/// store is unavailable), so neither runs nor `/readyz` wait on a dead server.
#[derive(Debug, Default)]
struct Backoff {
    failures: u32,
    not_before: Option<std::time::Instant>,
    last_error: String,
}

impl Backoff {
    /// Why no attempt is made now, if it is too early for one.
    fn wait_left(&self, now: std::time::Instant) -> Option<Duration> {
        self.not_before
            .and_then(|at| at.checked_duration_since(now))
            .filter(|left| !left.is_zero())
    }

    fn failed(&mut self, now: std::time::Instant, error: String) {
        self.failures = self.failures.saturating_add(1);
        self.not_before = Some(now + backoff_wait(self.failures, jitter()));
        self.last_error = error;
    }

    fn succeeded(&mut self) {
        *self = Backoff::default();
    }
}

/// The wait after `failures` failed attempts (pure): `RECONNECT_MIN * 2^(failures-1)`,
/// capped at [`RECONNECT_MAX`], scaled by `jitter` in [0.5, 1.0].
fn backoff_wait(failures: u32, jitter: f64) -> Duration {
    let doublings = failures.saturating_sub(1).min(16);
    let full = (RECONNECT_MIN * 2u32.pow(doublings)).min(RECONNECT_MAX);
    full.mul_f64(jitter.clamp(0.5, 1.0))
}

/// A factor in [0.5, 1.0) from the process's random hasher keys and the clock.
fn jitter() -> f64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    0.5 + (h.finish() >> 11) as f64 / (1u64 << 53) as f64 / 2.0
}

fn pg_err(shown: &str, e: postgres::Error) -> StoreError {
    if is_connection_loss(&e) {
        return StoreError::Unreachable {
            target: shown.to_string(),
            detail: pg_detail(&e),
            outage: true,
        };
    }
    StoreError::Postgres {
        target: shown.to_string(),
        detail: pg_detail(&e),
    }
}

/// The error says the server went away, not that a statement failed: the connection is
/// closed, its socket failed, or the server ended the session (class 08, connection
/// exception; 57P01-57P03, shut down or not accepting connections yet).
fn is_connection_loss(e: &postgres::Error) -> bool {
    if e.is_closed() {
        return true;
    }
    if let Some(db) = e.as_db_error() {
        let code = db.code().code();
        return code.starts_with("08") || matches!(code, "57P01" | "57P02" | "57P03");
    }
    let mut src = std::error::Error::source(e);
    while let Some(inner) = src {
        if let Some(io) = inner.downcast_ref::<std::io::Error>() {
            // A TLS handshake refused (the certificate, its name) arrives as an I/O
            // error carrying rustls's: a refusal to fix, not an outage to wait out.
            let tls_refusal = io.get_ref().is_some_and(|why| why.is::<rustls::Error>());
            return !tls_refusal;
        }
        src = inner.source();
    }
    false
}

/// The server's message and code, or the error with its chain of causes (a TLS failure
/// says why the certificate was refused only there).
fn pg_detail(e: &postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{} ({})", db.message(), db.code().code()),
        None => {
            let mut s = e.to_string();
            let mut src = std::error::Error::source(e);
            while let Some(inner) = src {
                s.push_str(": ");
                s.push_str(&inner.to_string());
                src = inner.source();
            }
            s
        }
    }
}

impl From<postgres::Error> for StoreError {
    fn from(e: postgres::Error) -> Self {
        // The target is filled in by `Fleet::ctx` at the boundary.
        pg_err("", e)
    }
}

impl Drop for Fleet {
    /// Closing the connection blocks on the client's runtime, and dropping a runtime is
    /// refused on an async runtime's thread too: both happen where [`off_runtime`] says.
    fn drop(&mut self) {
        if let Some(client) = self.client.get_mut().take() {
            off_runtime(move || drop(client));
        }
    }
}

/// Runs `f` where the sync client may block: on this thread, or, on a thread that drives
/// an async runtime (the service's handlers), on a scoped thread of its own. The client
/// blocks on a runtime of its own, which tokio refuses inside another; SQLite's calls
/// block the same way, so callers see no difference. Outside a runtime no thread is
/// started: `airlock run` clones its cell from a single-threaded process.
fn off_runtime<T: Send>(f: impl FnOnce() -> T + Send) -> T {
    if tokio::runtime::Handle::try_current().is_err() {
        return f();
    }
    std::thread::scope(|s| {
        s.spawn(f)
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    })
}

impl Fleet {
    /// `f` with the connection (see [`off_runtime`]).
    /// A lost connection is reconnected first (within the backoff), and a use that finds
    /// the server gone drops the connection, so the next use reconnects: a restarted
    /// server is used again without restarting this process.
    fn with_client<T: Send>(&self, f: impl FnOnce(&mut Client) -> Result<T> + Send) -> Result<T> {
        let mut slot = self.client.borrow_mut();
        if slot.as_ref().is_none_or(Client::is_closed) {
            if let Some(dead) = slot.take() {
                off_runtime(move || drop(dead));
            }
            *slot = Some(self.reconnect()?);
        }
        let client: &mut Client = slot.as_mut().expect("connected above");
        let result = off_runtime(move || f(client)).map_err(|e| self.ctx(e));
        if result.as_ref().is_err_and(StoreError::is_unavailable) {
            if let Some(dead) = slot.take() {
                off_runtime(move || drop(dead));
            }
        }
        result
    }

    /// A new connection, its node name claimed again (the claim's session lock ended with
    /// the old connection); refused at once while the backoff says wait.
    fn reconnect(&self) -> Result<Client> {
        let now = std::time::Instant::now();
        let unreachable = |failure: ConnectFailure| StoreError::Unreachable {
            target: self.shown.clone(),
            detail: failure.detail,
            outage: failure.outage,
        };
        if let Some(left) = self.backoff.borrow().wait_left(now) {
            let backoff = self.backoff.borrow();
            return Err(unreachable(ConnectFailure {
                detail: format!(
                    "connection lost; reconnection attempt {} in {} ms (last: {})",
                    backoff.failures + 1,
                    left.as_millis(),
                    backoff.last_error
                ),
                outage: true,
            }));
        }
        let url = &self.store.url;
        let connected = off_runtime(|| url.connect()).and_then(|mut client| {
            let (node, holder) = (&self.store.node, &self.holder);
            let claimed = off_runtime(|| claim_node_on(&mut client, node, holder));
            match claimed {
                Ok(None) => Ok(client),
                // Another process table took the name while this one was away: refused.
                Ok(Some((recorded, _))) => Err(ConnectFailure::refused(format!(
                    "node name {:?} is held by {recorded} now",
                    node.as_str()
                ))),
                Err(e) => Err(ConnectFailure {
                    detail: pg_detail(&e),
                    outage: is_connection_loss(&e),
                }),
            }
        });
        match connected {
            Ok(client) => {
                self.backoff.borrow_mut().succeeded();
                Ok(client)
            }
            Err(failure) => {
                self.backoff
                    .borrow_mut()
                    .failed(now, failure.detail.clone());
                Err(unreachable(failure))
            }
        }
    }

    /// One round trip (`/readyz`'s probe).
    pub fn ping(&self) -> Result<()> {
        self.with_client(|client| {
            client.simple_query("SELECT 1")?;
            Ok(())
        })
    }

    /// Connect and migrate. A server that cannot be reached is an error: the caller
    /// refuses the run (there is no fallback to the local store).
    /// The node name is claimed for `holder` before anything is written (see
    /// [`Fleet::claim_node`]).
    pub fn connect(store: &FleetStore, holder: NodeHolder) -> Result<Fleet> {
        let url = &store.url;
        let shown = url.shown.clone();
        let client = off_runtime(|| url.connect()).map_err(|failure| StoreError::Unreachable {
            target: shown.clone(),
            detail: failure.detail,
            outage: failure.outage,
        })?;
        let fleet = Fleet {
            client: RefCell::new(Some(client)),
            store: store.clone(),
            backoff: RefCell::default(),
            shown,
            node: store.node.clone(),
            holder,
        };
        let found = fleet.migrate(LATEST)?;
        if found > LATEST {
            return Err(StoreError::SchemaTooNew {
                path: fleet.shown.clone().into(),
                found,
                supported: LATEST,
            });
        }
        fleet.claim_node()?;
        Ok(fleet)
    }

    /// Claim this node's name for this holder, or refuse: the name's row records its
    /// holder, and each of the holder's connections holds (NODE_LOCK_CLASS, id) shared
    /// until it closes. The same holder joins; another takes the name only when no
    /// session holds that lock (every process of the earlier holder is gone). Claims are
    /// serialised by (NODE_LOCK_CLASS, 0), and the lock is taken before the claim
    /// commits, so two claimants never both see the name free.
    fn claim_node(&self) -> Result<()> {
        let (node, holder) = (self.node.as_str(), &self.holder);
        let name = &self.node;
        let refused = self.with_client(|client| Ok(claim_node_on(client, name, holder)?))?;
        match refused {
            None => Ok(()),
            Some((recorded, sessions)) => Err(StoreError::NodeNameHeld {
                target: self.shown.clone(),
                node: node.to_string(),
                holder: recorded.to_string(),
                me: holder.to_string(),
                sessions,
            }),
        }
    }

    /// The holder this connection claimed the node name for.
    pub fn holder(&self) -> &NodeHolder {
        &self.holder
    }

    pub fn shown(&self) -> &str {
        &self.shown
    }

    /// The node this connection records runs for.
    pub fn node(&self) -> &NodeName {
        &self.node
    }

    fn ctx(&self, e: StoreError) -> StoreError {
        match e {
            StoreError::Postgres { target, detail } if target.is_empty() => StoreError::Postgres {
                target: self.shown.clone(),
                detail,
            },
            StoreError::Unreachable {
                target,
                detail,
                outage,
            } if target.is_empty() => StoreError::Unreachable {
                target: self.shown.clone(),
                detail,
                outage,
            },
            other => other,
        }
    }

    /// Apply migrations up to `target`; returns the version found.
    fn migrate(&self, target: i64) -> Result<i64> {
        self.with_client(|client| {
            let mut tx = client.transaction()?;
            tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])?;
            tx.batch_execute(
                "CREATE TABLE IF NOT EXISTS airlock_schema (
                     id INTEGER PRIMARY KEY CHECK (id = 1), version BIGINT NOT NULL);
                 INSERT INTO airlock_schema (id, version) VALUES (1, 0) ON CONFLICT DO NOTHING",
            )?;
            let found: i64 = tx
                .query_one("SELECT version FROM airlock_schema WHERE id = 1", &[])?
                .get(0);
            for (i, sql) in MIGRATIONS.iter().enumerate().take(target as usize) {
                let v = i as i64 + 1;
                if found < v {
                    tx.batch_execute(sql)?;
                    tx.execute("UPDATE airlock_schema SET version = $1 WHERE id = 1", &[&v])?;
                }
            }
            tx.commit()?;
            Ok(found)
        })
    }

    /// The fleet database's schema version (`airlock_schema`).
    pub fn schema_version(&self) -> Result<i64> {
        self.with_client(|client| {
            let row = client.query_one("SELECT version FROM airlock_schema WHERE id = 1", &[])?;
            Ok(row.get(0))
        })
    }

    /// Run `f` in a transaction that holds the chain head's row lock from its first
    /// statement: writers queue there, and `f` sees every earlier writer's commit.
    fn write_tx<T: Send>(
        &self,
        f: impl FnOnce(&mut Transaction<'_>) -> Result<T> + Send,
    ) -> Result<T> {
        self.with_client(|client| {
            let mut tx = client.transaction()?;
            tx.query_one("SELECT seq FROM chain_head WHERE id = 1 FOR UPDATE", &[])?;
            let v = f(&mut tx)?;
            tx.commit()?;
            Ok(v)
        })
    }

    /// Run `f` on one snapshot (REPEATABLE READ, read only): `verify` and exports see one
    /// consistent chain while other nodes keep writing.
    fn read_tx<T: Send>(
        &self,
        f: impl FnOnce(&mut Transaction<'_>) -> Result<T> + Send,
    ) -> Result<T> {
        self.with_client(|client| {
            let mut tx = client
                .build_transaction()
                .isolation_level(postgres::IsolationLevel::RepeatableRead)
                .read_only(true)
                .start()?;
            let v = f(&mut tx)?;
            tx.commit()?;
            Ok(v)
        })
    }

    pub fn begin(&self, run_id: &str, started_at: i64, body: &Value) -> Result<()> {
        let s = |k: &str| body[k].as_str().unwrap_or_default().to_string();
        let int = |k: &str| body[k].as_i64();
        self.write_tx(|tx| {
            append_entry(tx, Some(run_id), kinds::RUN_BEGIN, started_at, body)?;
            tx.execute(
                "INSERT INTO runs (run_id, started_at, argv_json, input_sha256, contract_sha256,
                    workload_class, plan_json, status, supervisor_pid, supervisor_start_time,
                    boot_id, caller_uid, session_id, tenant, node, pid_ns)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15,
                    $16)",
                &[
                    &run_id,
                    &started_at,
                    &body["argv"].to_string(),
                    &s("input_sha256"),
                    &s("contract_sha256"),
                    &s("workload_class"),
                    &json_col(&body["plan"]),
                    &STATUS_RUNNING,
                    &int("supervisor_pid").unwrap_or(0),
                    &int("supervisor_start_time").unwrap_or(0),
                    &s("boot_id"),
                    &int("caller_uid"),
                    &body["session_id"].as_str(),
                    &body["tenant"].as_str(),
                    &body["node"].as_str(),
                    &body["pid_ns"].as_i64(),
                ],
            )?;
            Ok(())
        })
    }

    /// Append an event to an existing run (any state).
    pub fn append_event(&self, run_id: &str, kind: &str, at: i64, body: &Value) -> Result<()> {
        self.write_tx(|tx| {
            if tx
                .query_opt("SELECT 1 FROM runs WHERE run_id = $1", &[&run_id])?
                .is_none()
            {
                return Err(StoreError::RunNotFound(run_id.to_string()));
            }
            append_entry(tx, Some(run_id), kind, at, body)?;
            Ok(())
        })
    }

    pub fn finish(
        &self,
        run_id: &str,
        finished_at: i64,
        events: &[(String, Value)],
        body: &Value,
    ) -> Result<()> {
        let int = |k: &str| body[k].as_i64().map(|v| v as i32);
        self.write_tx(|tx| {
            let status: Option<String> = tx
                .query_opt("SELECT status FROM runs WHERE run_id = $1", &[&run_id])?
                .map(|r| r.get(0));
            crate::check_finishable(run_id, status.as_deref())?;
            for (kind, event) in events {
                append_entry(tx, Some(run_id), kind, finished_at, event)?;
            }
            append_entry(tx, Some(run_id), kinds::RUN_FINISH, finished_at, body)?;
            tx.execute(
                "UPDATE runs SET finished_at = $2, status = $3, exit_code = $4, exit_signal = $5,
                    limit_fired = $6, usage_json = $7, startup_ms = $8, wall_ms = $9,
                    stdout_head = $10, stdout_tail = $11, stderr_head = $12, stderr_tail = $13,
                    cleanup_ok = $14, cleanup_leftovers_json = $15, result_json = $16
                 WHERE run_id = $1",
                &[
                    &run_id,
                    &finished_at,
                    &body["status"].as_str(),
                    &int("exit_code"),
                    &int("exit_signal"),
                    &body["limit_fired"].as_str(),
                    &json_col(&body["usage"]),
                    &body["startup_ms"].as_f64(),
                    &body["wall_ms"].as_f64(),
                    &body["stdout_head"].as_str(),
                    &body["stdout_tail"].as_str(),
                    &body["stderr_head"].as_str(),
                    &body["stderr_tail"].as_str(),
                    &body["cleanup_ok"].as_bool(),
                    &json_col(&body["cleanup_leftovers"]),
                    &json_col(&body["result"]),
                ],
            )?;
            Ok(())
        })
    }

    /// The running runs this node may mark aborted, and why: its holder's whose
    /// supervisor is gone from this process table, an earlier holder's of the name (gone:
    /// this one could claim it), and runs recorded before runs had a node (migration 2)
    /// or a holder (migration 3) whose supervisor ran in this boot and is gone, as
    /// before (`node::judge_run`). Another node's runs are never returned: their
    /// supervisors are not in this process table.
    pub fn stale_runs_of_this_node(&self) -> Result<Vec<(String, String)>> {
        let node = self.node.as_str();
        let rows = self.with_client(|client| {
            Ok(client.query(
                "SELECT run_id, supervisor_pid, supervisor_start_time, boot_id, pid_ns,
                        node IS NOT NULL
                 FROM runs WHERE status = 'running' AND (node = $1 OR node IS NULL)",
                &[&node],
            )?)
        })?;
        Ok(rows
            .iter()
            .filter_map(|r| {
                let sup = proc_info::ProcessIdentity {
                    pid: r.get::<_, i64>(1) as u32,
                    start_time: r.get::<_, i64>(2) as u64,
                    boot_id: r.get(3),
                };
                let judged =
                    node::judge_run(&self.holder, &self.node, r.get(5), &sup.boot_id, r.get(4));
                let reason = match judged {
                    RunJudgement::ByProcess => proc_info::staleness(&sup)?,
                    RunJudgement::HolderGone(why) => why,
                    RunJudgement::NotOurs => return None,
                };
                Some((r.get(0), reason))
            })
            .collect())
    }

    /// Mark `run_id` aborted if it is still running; whether this call did it.
    pub fn abort(&self, run_id: &str, at: i64, body: &Value) -> Result<bool> {
        self.write_tx(|tx| {
            let n = tx.execute(
                "UPDATE runs SET status = 'aborted', finished_at = $2
                 WHERE run_id = $1 AND status = 'running'",
                &[&run_id, &at],
            )?;
            if n == 1 {
                append_entry(tx, Some(run_id), kinds::RUN_ABORTED, at, body)?;
            }
            Ok(n == 1)
        })
    }

    pub fn list_runs(&self, filter: &RunFilter) -> Result<Vec<RunRecord>> {
        let mut sql = format!("SELECT {RUN_COLUMNS} FROM runs WHERE 1 = 1");
        let mut args: Vec<Box<dyn postgres::types::ToSql + Sync>> = Vec::new();
        let mut arg =
            |sql: &mut String, col: &str, op: &str, v: Box<dyn postgres::types::ToSql + Sync>| {
                args.push(v);
                sql.push_str(&format!(" AND {col} {op} ${}", args.len()));
            };
        if let Some(s) = &filter.status {
            arg(&mut sql, "status", "=", Box::new(s.clone()));
        }
        if let Some(c) = &filter.workload_class {
            arg(&mut sql, "workload_class", "=", Box::new(c.clone()));
        }
        if let Some(t) = filter.since {
            arg(&mut sql, "started_at", ">=", Box::new(t));
        }
        if let Some(t) = filter.until {
            arg(&mut sql, "started_at", "<", Box::new(t));
        }
        if let Some(uid) = filter.caller_uid {
            arg(&mut sql, "caller_uid", "=", Box::new(i64::from(uid)));
        }
        if let Some(session) = &filter.session_id {
            arg(&mut sql, "session_id", "=", Box::new(session.clone()));
        }
        if let Some(tenant) = &filter.tenant {
            arg(&mut sql, "tenant", "=", Box::new(tenant.clone()));
        }
        if let Some((started_at, run_id)) = &filter.before {
            args.push(Box::new(*started_at));
            args.push(Box::new(run_id.clone()));
            let (at, id) = (args.len() - 1, args.len());
            sql.push_str(&format!(
                " AND (started_at < ${at} OR (started_at = ${at} AND run_id < ${id}))"
            ));
        }
        sql.push_str(" ORDER BY started_at DESC, run_id DESC");
        if let Some(n) = filter.limit {
            sql.push_str(&format!(" LIMIT {n}"));
        }
        let params: Vec<&(dyn postgres::types::ToSql + Sync)> =
            args.iter().map(|a| a.as_ref()).collect();
        let rows = self.with_client(|client| Ok(client.query(&sql, &params)?))?;
        Ok(rows.iter().map(run_from_row).collect())
    }

    pub fn show_run(&self, run_id: &str) -> Result<Option<RunDetail>> {
        self.read_tx(|tx| {
            let Some(row) = tx.query_opt(
                &format!("SELECT {RUN_COLUMNS} FROM runs WHERE run_id = $1"),
                &[&run_id],
            )?
            else {
                return Ok(None);
            };
            let events = tx
                .query(
                    &format!(
                        "SELECT {ENTRY_COLUMNS} FROM audit_log WHERE run_id = $1 ORDER BY seq"
                    ),
                    &[&run_id],
                )?
                .iter()
                .map(|r| entry_from_row(r).0)
                .collect();
            Ok(Some(RunDetail {
                run: run_from_row(&row),
                events,
            }))
        })
    }

    /// The lines are read in one snapshot, then written (the writer need not be `Send`).
    pub fn export_jsonl(&self, out: &mut dyn Write) -> Result<u64> {
        let io = StoreError::Export;
        let lines = self.read_tx(|tx| {
            let mut lines = Vec::new();
            for row in tx.query(
                &format!("SELECT {ENTRY_COLUMNS} FROM audit_log ORDER BY seq"),
                &[],
            )? {
                let mut v = serde_json::to_value(entry_from_row(&row).0)?;
                v["type"] = json!("audit");
                lines.push(v);
            }
            for row in tx.query(
                &format!("SELECT {RUN_COLUMNS} FROM runs ORDER BY started_at, run_id"),
                &[],
            )? {
                let mut v = serde_json::to_value(run_from_row(&row))?;
                v["type"] = json!("run");
                lines.push(v);
            }
            Ok(lines)
        })?;
        for v in &lines {
            serde_json::to_writer(&mut *out, v)?;
            out.write_all(b"\n").map_err(io)?;
        }
        out.flush().map_err(io)?;
        Ok(lines.len() as u64)
    }

    pub fn tenant_counts(&self, tenant: &str) -> Result<crate::TenantCounts> {
        self.read_tx(|tx| {
            let runs: i64 = tx
                .query_one("SELECT COUNT(*) FROM runs WHERE tenant = $1", &[&tenant])?
                .get(0);
            let entries: i64 = tx
                .query_one(
                    "SELECT COUNT(*) FROM audit_log
                     WHERE run_id IN (SELECT run_id FROM runs WHERE tenant = $1)",
                    &[&tenant],
                )?
                .get(0);
            Ok(crate::TenantCounts {
                runs: runs as u64,
                entries: entries as u64,
            })
        })
    }

    pub fn stats(&self) -> Result<BTreeMap<String, ClassStats>> {
        self.read_tx(|tx| {
            let mut fold = StatsFold::default();
            for r in tx.query(
                "SELECT workload_class, status, startup_ms, limit_fired, cleanup_ok FROM runs",
                &[],
            )? {
                fold.run(
                    r.get(0),
                    r.get(1),
                    r.get(2),
                    r.get::<_, Option<String>>(3).as_deref(),
                    r.get(4),
                );
            }
            // The decision is read in Rust (`denial_code`), as SQLite's json_extract does;
            // the LIKE only skips bodies that cannot hold one.
            let mut counts: BTreeMap<(String, String), u64> = BTreeMap::new();
            for r in tx.query(
                "SELECT r.workload_class, a.body_json
                 FROM audit_log a JOIN runs r ON r.run_id = a.run_id
                 WHERE a.body_json LIKE '%\"decision\"%'",
                &[],
            )? {
                let body: String = r.get(1);
                let body = serde_json::from_str(&body).unwrap_or(Value::Null);
                if let Some(code) = crate::denial_code(&body) {
                    *counts.entry((r.get(0), code)).or_default() += 1;
                }
            }
            for ((class, code), n) in counts {
                fold.denials(class, code, n);
            }
            Ok(fold.finish())
        })
    }

    /// `Store::prune` on the fleet's chain (see there): the same cut, the same checkpoint.
    pub fn prune(&self, cutoff: i64) -> Result<usize> {
        self.write_tx(|tx| {
            let spans: Vec<RunSpan> = tx
                .query(
                    "SELECT a.run_id,
                            COALESCE(r.status != 'running' AND r.finished_at IS NOT NULL
                                     AND r.finished_at < $1, false),
                            MIN(a.seq), MAX(a.seq)
                     FROM audit_log a LEFT JOIN runs r ON r.run_id = a.run_id
                     WHERE a.run_id IS NOT NULL GROUP BY a.run_id, r.status, r.finished_at",
                    &[&cutoff],
                )?
                .iter()
                .map(|r| RunSpan {
                    run_id: r.get(0),
                    eligible: r.get(1),
                    min_seq: r.get(2),
                    max_seq: r.get(3),
                })
                .collect();
            let head: i64 = tx
                .query_one("SELECT seq FROM chain_head WHERE id = 1", &[])?
                .get(0);
            let (cut, doomed) = chain::prune_cut(&spans, head);
            if doomed.is_empty() {
                return Ok(0);
            }
            let Some(anchor) = tx.query_opt(
                "SELECT seq, hash FROM audit_log WHERE seq <= $1 ORDER BY seq DESC LIMIT 1",
                &[&cut],
            )?
            else {
                return Ok(0);
            };
            let (anchor_seq, anchor_hash): (i64, String) = (anchor.get(0), anchor.get(1));
            tx.execute("DELETE FROM audit_log WHERE seq <= $1", &[&anchor_seq])?;
            for id in &doomed {
                tx.execute("DELETE FROM runs WHERE run_id = $1", &[id])?;
            }
            append_entry(
                tx,
                None,
                kinds::STORE_PRUNE,
                now_ms(),
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

    pub fn verify(&self) -> Result<VerifyReport> {
        self.read_tx(|tx| {
            let head = tx.query_one("SELECT seq, hash FROM chain_head WHERE id = 1", &[])?;
            let checkpoint: Option<String> = tx
                .query_opt(
                    "SELECT body_json FROM audit_log WHERE kind = $1 ORDER BY seq DESC LIMIT 1",
                    &[&kinds::STORE_PRUNE],
                )?
                .map(|r| r.get(0));
            let mut check = ChainCheck::new(checkpoint.as_deref());
            // A portal streams the chain in batches instead of holding it all in memory.
            let portal = tx.bind(
                &format!("SELECT {ENTRY_COLUMNS} FROM audit_log ORDER BY seq"),
                &[],
            )?;
            loop {
                let rows = tx.query_portal(&portal, 1000)?;
                if rows.is_empty() {
                    break;
                }
                for row in &rows {
                    let (e, body_json) = entry_from_row(row);
                    check.entry(&e, &body_json)?;
                }
            }
            check.end_of_chain(head.get(0), head.get::<_, &str>(1))?;
            for row in tx.query(
                &format!("SELECT {RUN_COLUMNS} FROM runs ORDER BY run_id"),
                &[],
            )? {
                check.run_row(&run_from_row(&row))?;
            }
            check.finish()
        })
    }
}

/// The claim of [`Fleet::claim_node`] on `client`: `None` when this holder holds the name
/// now, else the recorded holder and its live sessions. Also what a reconnection does.
fn claim_node_on(
    client: &mut Client,
    node: &NodeName,
    holder: &NodeHolder,
) -> std::result::Result<Option<(NodeHolder, Vec<i32>)>, postgres::Error> {
    let node = node.as_str();
    let mut tx = client.transaction()?;
    tx.execute("SELECT pg_advisory_xact_lock($1, 0)", &[&NODE_LOCK_CLASS])?;
    tx.execute(
        "INSERT INTO nodes (name, boot_id, pid_ns, claimed_at) VALUES ($1, $2, $3, $4)
             ON CONFLICT (name) DO NOTHING",
        &[&node, &holder.boot_id, &holder.pid_ns, &now_ms()],
    )?;
    let row = tx.query_one(
        "SELECT id, boot_id, pid_ns FROM nodes WHERE name = $1",
        &[&node],
    )?;
    let id: i32 = row.get(0);
    let recorded = NodeHolder {
        boot_id: row.get(1),
        pid_ns: row.get(2),
    };
    if recorded != *holder {
        let sessions: Vec<i32> = tx
            .query(
                "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted
                         AND classid = $1::bigint::oid AND objid = $2::bigint::oid
                         AND objsubid = 2 ORDER BY pid",
                &[&i64::from(NODE_LOCK_CLASS), &i64::from(id)],
            )?
            .iter()
            .map(|r| r.get(0))
            .collect();
        if !sessions.is_empty() {
            return Ok(Some((recorded, sessions)));
        }
        tx.execute(
            "UPDATE nodes SET boot_id = $2, pid_ns = $3, claimed_at = $4 WHERE id = $1",
            &[&id, &holder.boot_id, &holder.pid_ns, &now_ms()],
        )?;
    }
    // Session level: held past this commit, until the connection closes.
    tx.execute(
        "SELECT pg_advisory_lock_shared($1, $2)",
        &[&NODE_LOCK_CLASS, &id],
    )?;
    tx.commit()?;
    Ok(None)
}

/// Append one entry; the transaction holds the head's row lock ([`Fleet::write_tx`]).
fn append_entry(
    tx: &mut Transaction<'_>,
    run_id: Option<&str>,
    kind: &str,
    at: i64,
    body: &Value,
) -> Result<i64> {
    let body_json = body.to_string();
    let head = tx.query_one("SELECT seq, hash FROM chain_head WHERE id = 1", &[])?;
    let (head_seq, head_hash): (i64, String) = (head.get(0), head.get(1));
    let seq = head_seq + 1;
    let hash = crate::entry_hash(&head_hash, seq, run_id, kind, at, &body_json);
    tx.execute(
        "INSERT INTO audit_log (seq, run_id, kind, at, body_json, prev_hash, hash)
         VALUES ($1, $2, $3, $4, $5, $6, $7)",
        &[&seq, &run_id, &kind, &at, &body_json, &head_hash, &hash],
    )?;
    tx.execute(
        "UPDATE chain_head SET seq = $1, hash = $2 WHERE id = 1",
        &[&seq, &hash],
    )?;
    Ok(seq)
}

fn run_from_row(r: &Row) -> RunRecord {
    let argv: Option<String> = r.get(3);
    RunRecord {
        run_id: r.get(0),
        started_at: r.get(1),
        finished_at: r.get(2),
        argv: argv
            .and_then(|a| serde_json::from_str(&a).ok())
            .unwrap_or_default(),
        input_sha256: r.get(4),
        contract_sha256: r.get(5),
        workload_class: r.get(6),
        plan: parse_json_col(r.get(7)),
        status: r.get(8),
        exit_code: r.get(9),
        exit_signal: r.get(10),
        limit_fired: r.get(11),
        usage: parse_json_col(r.get(12)),
        startup_ms: r.get(13),
        wall_ms: r.get(14),
        stdout_head: r.get(15),
        stdout_tail: r.get(16),
        stderr_head: r.get(17),
        stderr_tail: r.get(18),
        cleanup_ok: r.get(19),
        cleanup_leftovers: parse_json_col(r.get(20)),
        result: parse_json_col(r.get(21)),
        supervisor_pid: r.get::<_, i64>(22) as u32,
        supervisor_start_time: r.get::<_, i64>(23) as u64,
        boot_id: r.get(24),
        caller_uid: r.get::<_, Option<i64>>(25).map(|u| u as u32),
        session_id: r.get(26),
        tenant: r.get(27),
        node: r.get(28),
    }
}

fn entry_from_row(r: &Row) -> (AuditEntry, String) {
    let body_json: String = r.get(4);
    let body = serde_json::from_str(&body_json).unwrap_or(Value::Null);
    (
        AuditEntry {
            seq: r.get(0),
            run_id: r.get(1),
            kind: r.get(2),
            at: r.get(3),
            body,
            prev_hash: r.get(5),
            hash: r.get(6),
        },
        body_json,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::GENESIS_HASH;

    #[test]
    fn without_tls_only_sockets_and_loopback_are_accepted() {
        for ok in [
            "postgres://airlock@/airlock?host=/run/postgresql",
            "postgres://airlock@127.0.0.1:5433/airlock",
            "postgresql://airlock:pw@127.0.0.2/airlock",
            "postgres://airlock@[::1]:5432/airlock",
            "postgres://airlock@127.0.0.1/airlock?sslmode=disable",
            "postgres://airlock@/airlock?host=/run/postgresql&sslmode=prefer",
        ] {
            let url = PostgresUrl::parse(ok).unwrap_or_else(|e| panic!("{ok}: {e}"));
            assert!(!url.uses_tls(), "{ok}");
        }
        for (bad, why) in [
            (
                "postgres://airlock@db.internal/airlock",
                "only over verified TLS",
            ),
            ("postgres://airlock@10.0.0.5/airlock", "not a unix socket"),
            (
                "postgres://airlock@/airlock?hostaddr=10.0.0.5",
                "hostaddr 10.0.0.5",
            ),
            ("postgres://airlock@/airlock", "names no host"),
            ("mysql://x@/y", "must start with postgres://"),
            (
                "postgres://airlock@10.0.0.5/airlock?sslmode=disable",
                "sslmode=disable sends them in plaintext",
            ),
            (
                "postgres://airlock@10.0.0.5/airlock?sslmode=allow",
                "may send them in plaintext",
            ),
            (
                "postgres://airlock@10.0.0.5/airlock?sslmode=prefer",
                "may send them in plaintext",
            ),
            ("postgres://airlock@127.0.0.1/a?sslmode=bogus", "not one of"),
        ] {
            let err = PostgresUrl::parse(bad).unwrap_err().to_string();
            assert!(err.contains(why), "{bad}: {err}");
        }
    }

    #[test]
    fn a_network_host_needs_verify_full_with_a_ca_file() {
        let url = PostgresUrl::parse(
            "postgres://airlock@db.fleet.test:5432/airlock?sslmode=verify-full\
             &sslrootcert=/etc/airlock/pg-ca.pem&connect_timeout=3",
        )
        .unwrap();
        assert!(url.uses_tls());
        assert_eq!(
            url.by_name
                .as_ref()
                .map(|n| (n.name.as_str(), n.loopback_only)),
            Some(("db.fleet.test", false))
        );
        assert_eq!(
            url.config.get_connect_timeout(),
            Some(&Duration::from_secs(3))
        );
        let by_address = "postgres://airlock@192.0.2.7/airlock?sslmode=verify-full\
                          &sslrootcert=/ca.pem";
        assert!(PostgresUrl::parse(by_address).unwrap().by_name.is_none());
        for (bad, why) in [
            (
                "postgres://airlock@10.0.0.5/airlock?sslmode=require",
                "sslmode=require: encrypts without checking who answers",
            ),
            (
                "postgres://airlock@10.0.0.5/airlock?sslmode=verify-ca&sslrootcert=/ca.pem",
                "sslmode=verify-ca: checks the chain but not that it names the host",
            ),
            (
                "postgres://airlock@127.0.0.1/airlock?sslmode=require",
                "give sslmode=verify-full",
            ),
            (
                "postgres://airlock@10.0.0.5/airlock?sslmode=verify-full",
                "needs sslrootcert=<CA file>",
            ),
            (
                "postgres://airlock@10.0.0.5/airlock?sslmode=verify-full&sslrootcert=ca.pem",
                "must be an absolute path",
            ),
            (
                "postgres://airlock@/airlock?host=/run/postgresql&sslmode=verify-full\
                 &sslrootcert=/ca.pem",
                "no TLS over a unix socket",
            ),
            (
                "postgres://airlock@/airlock?hostaddr=10.0.0.5&sslmode=verify-full\
                 &sslrootcert=/ca.pem",
                "give host=<name on the certificate>",
            ),
            (
                "postgres://airlock@a.fleet.test,b.fleet.test/airlock?sslmode=verify-full\
                 &sslrootcert=/ca.pem",
                "has that one host",
            ),
        ] {
            let err = PostgresUrl::parse(bad).unwrap_err().to_string();
            assert!(err.contains(why), "{bad}: {err}");
        }
    }

    #[test]
    fn localhost_is_resolved_and_must_be_loopback_only() {
        let url = PostgresUrl::parse("postgres://airlock@localhost:5433/airlock").unwrap();
        let named = url.by_name.clone().unwrap();
        assert!(named.loopback_only && named.port == 5433);
        // This machine's localhost is loopback (whatever mix of 127.0.0.1 and ::1).
        let addrs = resolve(&named).unwrap();
        assert!(!addrs.is_empty() && addrs.iter().all(IpAddr::is_loopback));
        // A name that resolves elsewhere (an address literal stands in for a hosts file
        // entry pointing localhost away) is refused by the same check.
        let away = NamedHost {
            name: "192.0.2.9".into(),
            ..named
        };
        let err = resolve(&away).unwrap_err().detail;
        assert!(err.contains("not a loopback address"), "{err}");
    }

    #[test]
    fn tls_parameters_are_taken_out_of_the_query() {
        let (rest, tls) =
            split_tls_params("postgres://a@h/d?sslmode=verify-full&host=/x&sslrootcert=/ca.pem");
        assert_eq!(rest, "postgres://a@h/d?host=/x");
        assert_eq!(tls.sslmode.as_deref(), Some("verify-full"));
        assert_eq!(tls.sslrootcert.as_deref(), Some("/ca.pem"));
        assert_eq!(
            split_tls_params("postgres://a@h/d?sslmode=disable").0,
            "postgres://a@h/d"
        );
    }

    #[test]
    fn the_password_is_never_shown() {
        let url = PostgresUrl::parse("postgres://airlock:s3cret@127.0.0.1:5433/runs").unwrap();
        assert_eq!(url.shown(), "postgres://airlock@127.0.0.1:5433/runs");
        assert!(!format!("{url:?}").contains("s3cret"));
        let tls = PostgresUrl::parse(
            "postgres://airlock:s3cret@db.fleet.test:5433/runs?hostaddr=192.0.2.7\
             &sslmode=verify-full&sslrootcert=/etc/airlock/pg-ca.pem",
        )
        .unwrap();
        assert_eq!(
            tls.shown(),
            "postgres://airlock@db.fleet.test:5433/runs?hostaddr=192.0.2.7\
             &sslmode=verify-full&sslrootcert=/etc/airlock/pg-ca.pem"
        );
    }

    #[test]
    fn reconnection_waits_grow_to_their_bound_and_are_jittered() {
        assert_eq!(backoff_wait(1, 1.0), RECONNECT_MIN);
        assert_eq!(backoff_wait(2, 1.0), RECONNECT_MIN * 2);
        assert_eq!(backoff_wait(4, 1.0), RECONNECT_MIN * 8);
        assert_eq!(backoff_wait(40, 1.0), RECONNECT_MAX);
        assert_eq!(backoff_wait(40, 0.5), RECONNECT_MAX / 2);
        // Out-of-range factors are clamped: never longer than the bound, never zero.
        assert_eq!(backoff_wait(40, 7.0), RECONNECT_MAX);
        assert_eq!(backoff_wait(1, 0.0), RECONNECT_MIN / 2);
        let factors: Vec<f64> = (0..64).map(|_| jitter()).collect();
        assert!(
            factors.iter().all(|j| (0.5..1.0).contains(j)),
            "{factors:?}"
        );
        assert!(
            factors.iter().any(|j| (j - factors[0]).abs() > 1e-9),
            "no jitter: {factors:?}"
        );
        let mut backoff = Backoff::default();
        let now = std::time::Instant::now();
        assert_eq!(backoff.wait_left(now), None);
        backoff.failed(now, "refused".into());
        let left = backoff.wait_left(now).unwrap();
        assert!(
            left >= RECONNECT_MIN / 2 && left <= RECONNECT_MIN,
            "{left:?}"
        );
        assert_eq!(backoff.wait_left(now + RECONNECT_MAX), None);
        backoff.succeeded();
        assert_eq!(backoff.wait_left(now), None);
    }

    #[test]
    fn genesis_is_the_sqlite_genesis() {
        assert!(MIGRATIONS[0].contains(GENESIS_HASH));
    }
}
