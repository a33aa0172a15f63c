//! The `[server]` section of the operator configuration (docs/api.md): where the service
//! listens, its tenants and their quotas, the named contracts requests may run under, the
//! warm pools, and the bounds of what a client may send.

use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::PathBuf;

#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    /// `unix:/path/to.sock`, `tcp:127.0.0.1:8420` and `tls:0.0.0.0:8443` listeners. Empty:
    /// one unix socket at `/run/airlock/airlock.sock` as root,
    /// `$XDG_RUNTIME_DIR/airlock/airlock.sock` otherwise. A plain `tcp:` listener must be
    /// on a loopback address unless `allow_plaintext_tcp` is set.
    pub listen: Vec<String>,
    /// The certificate chain (PEM) of every `tls:` listener; a relative path is taken
    /// from the configuration file's directory.
    pub tls_cert_file: Option<PathBuf>,
    /// The private key (PEM, PKCS#8, PKCS#1 or SEC1) of `tls_cert_file`.
    pub tls_key_file: Option<PathBuf>,
    /// Lets a plain `tcp:` listener bind a non-loopback address: only for a proxy in
    /// front that terminates TLS, since API keys travel in a request header.
    pub allow_plaintext_tcp: bool,
    /// The tenant of connections on the unix socket from uid 0 (it sees every tenant's
    /// runs and sessions).
    pub operator_tenant: String,
    /// Tenants by name.
    pub tenants: BTreeMap<String, TenantConfig>,
    /// Contracts requests may name (`"contract": "NAME"`), by name; a relative path is
    /// taken from the configuration file's directory. The name is the run's workload class.
    pub contracts: BTreeMap<String, PathBuf>,
    /// Warm cells kept parked per named contract (its plan shape with no command).
    pub pools: BTreeMap<String, usize>,
    /// Largest JSON request body, bytes.
    pub max_body_bytes: usize,
    /// Largest file a `PUT .../files/{path}` may write, and a `GET` may read, bytes.
    pub max_file_bytes: usize,
    /// Largest request head (request line and headers), bytes.
    pub max_header_bytes: usize,
    /// How long a client may take to send its request head, milliseconds.
    pub header_timeout_ms: u64,
    /// How long a client may take to send a request body, milliseconds.
    pub body_timeout_ms: u64,
    /// A session's idle timeout when the request names none, seconds.
    pub session_idle_timeout_s: u64,
    /// The most a session's idle timeout may be set or extended to, seconds.
    pub max_session_idle_timeout_s: u64,
    /// A session's maximum lifetime when the request names none, and its ceiling, seconds.
    pub max_session_lifetime_s: u64,
    /// Output of one command kept for `GET .../output` and streaming, bytes; beyond it
    /// output is counted and dropped (the record's capture is the contract's).
    pub max_stream_bytes: usize,
    /// Threads of the shared blocking pool one tenant's requests may hold at once (file
    /// operations, session commands' starts); beyond it a request is answered 429
    /// `quota.blocking` at once, so no tenant can starve the others' requests. The
    /// operator's tenant is not bounded.
    pub max_blocking_per_tenant: usize,
    /// How long one session file operation (a `PUT`, `GET` or listing) may take,
    /// milliseconds; past it the request is answered 503 `file.deadline`.
    pub file_op_timeout_ms: u64,
    /// How long a drain (SIGTERM, SIGINT) waits for work in flight before it ends it,
    /// milliseconds: sessions are then ended and recorded as ended by the operator
    /// (`server.drained`), and the service stops.
    pub drain_grace_ms: u64,
    /// Series `/metrics` keeps at most for the families a request adds to (runs,
    /// latencies, denials, ceilings, cleanup failures, deadline kills); beyond it a new
    /// series is dropped and counted in `airlock_metrics_series_dropped_total`.
    pub metrics_max_series: usize,
    /// Periodic `airlock verify` of workload classes (docs/verify.md). Off by default.
    pub verify: VerifySchedule,
}

/// `[server.verify]`: which classes the service verifies, and how often.
#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct VerifySchedule {
    /// Workload classes (`[policy]`) to verify, the first time at start-up. Empty (the
    /// default): no periodic verification.
    pub classes: Vec<String>,
    /// Seconds from the start of one round of verifications to the next (at least 60).
    pub interval_s: u64,
}

impl Default for VerifySchedule {
    fn default() -> Self {
        VerifySchedule {
            classes: Vec::new(),
            interval_s: 3600,
        }
    }
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            listen: Vec::new(),
            tls_cert_file: None,
            tls_key_file: None,
            allow_plaintext_tcp: false,
            operator_tenant: "operator".into(),
            tenants: BTreeMap::new(),
            contracts: BTreeMap::new(),
            pools: BTreeMap::new(),
            max_body_bytes: 1 << 20,
            max_file_bytes: 16 << 20,
            max_header_bytes: 16 << 10,
            header_timeout_ms: 10_000,
            body_timeout_ms: 30_000,
            session_idle_timeout_s: 300,
            max_session_idle_timeout_s: 3600,
            max_session_lifetime_s: 4 * 3600,
            max_stream_bytes: 8 << 20,
            max_blocking_per_tenant: 8,
            file_op_timeout_ms: 10_000,
            drain_grace_ms: 30_000,
            metrics_max_series: 10_000,
            verify: VerifySchedule::default(),
        }
    }
}

#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct TenantConfig {
    /// sha256 (hex) of each API key of the tenant (`Authorization: Bearer KEY`); the
    /// keys themselves are never in the configuration.
    pub api_key_sha256: Vec<String>,
    /// Unix socket peers with these uids are this tenant.
    pub uids: Vec<u32>,
    /// Whether requests may carry a contract inline instead of naming one. An inline
    /// contract decides its own mounts, so only trusted tenants get this.
    pub inline_contracts: bool,
    /// Cells of the tenant alive at once (runs and sessions).
    pub max_cells: usize,
    /// Sessions of the tenant open at once.
    pub max_sessions: usize,
    /// Runs and session commands started per minute.
    pub runs_per_minute: u32,
    /// Session commands of the tenant running at once (each is watched by a thread of
    /// the service's blocking pool while it runs, so the pool is sized from this).
    pub max_commands: usize,
}

impl Default for TenantConfig {
    fn default() -> Self {
        TenantConfig {
            api_key_sha256: Vec::new(),
            uids: Vec::new(),
            inline_contracts: false,
            max_cells: 8,
            max_sessions: 4,
            runs_per_minute: 600,
            max_commands: 16,
        }
    }
}

/// One listener of `listen`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Listen {
    Unix(PathBuf),
    Tcp(std::net::SocketAddr),
    /// TCP with TLS (the `tls_cert_file` and `tls_key_file` pair).
    Tls(std::net::SocketAddr),
}

impl Listen {
    /// `unix:PATH` (absolute), `tcp:ADDR:PORT` or `tls:ADDR:PORT`.
    pub fn parse(text: &str) -> Result<Listen, String> {
        if let Some(path) = text.strip_prefix("unix:") {
            let path = PathBuf::from(path);
            if !path.is_absolute() {
                return Err(format!("{text}: a unix socket path must be absolute"));
            }
            return Ok(Listen::Unix(path));
        }
        if let Some(addr) = text.strip_prefix("tcp:") {
            return addr
                .parse()
                .map(Listen::Tcp)
                .map_err(|err| format!("{text}: {err}"));
        }
        if let Some(addr) = text.strip_prefix("tls:") {
            return addr
                .parse()
                .map(Listen::Tls)
                .map_err(|err| format!("{text}: {err}"));
        }
        Err(format!(
            "{text}: a listener is `unix:PATH`, `tcp:ADDR:PORT` or `tls:ADDR:PORT`"
        ))
    }
}

/// The default socket: `/run/airlock/airlock.sock` as root, else under the user's
/// runtime directory (or the temp dir without one).
pub fn default_socket(euid_is_root: bool) -> PathBuf {
    if euid_is_root {
        return PathBuf::from("/run/airlock/airlock.sock");
    }
    std::env::var_os("XDG_RUNTIME_DIR")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir)
        .join("airlock/airlock.sock")
}

impl ServerConfig {
    /// A listener's transport against the rules: TLS needs its certificate and key, and
    /// plain TCP stays on loopback unless the operator says TLS ends in front of it.
    fn check_transport(&self, text: &str, listen: &Listen) -> Result<(), String> {
        match listen {
            Listen::Unix(_) => Ok(()),
            Listen::Tls(_) if self.tls_cert_file.is_none() || self.tls_key_file.is_none() => {
                Err(format!(
                    "server.listen: {text}: a tls: listener needs server.tls_cert_file and \
                     server.tls_key_file"
                ))
            }
            Listen::Tls(_) => Ok(()),
            Listen::Tcp(addr) if !addr.ip().is_loopback() && !self.allow_plaintext_tcp => {
                Err(format!(
                    "server.listen: {text}: plain TCP off loopback would carry API keys in \
                     clear; listen on tls:{addr} with server.tls_cert_file and \
                     server.tls_key_file (or set server.allow_plaintext_tcp when a proxy in \
                     front terminates TLS)"
                ))
            }
            Listen::Tcp(_) => Ok(()),
        }
    }

    /// Threads of the service's blocking pool: every tenant's caps at once (its cells,
    /// each watched by a thread while it lives; its sessions' opening and ending; its
    /// running session commands; its share for file and store work) and a reserve for
    /// the operator's and the service's own work, and never fewer than tokio's default.
    /// So no tenant, nor all of them together within their quotas, can leave another's
    /// request waiting for a thread.
    pub fn blocking_pool_size(&self) -> usize {
        const RESERVE: usize = 128;
        const TOKIO_DEFAULT: usize = 512;
        let tenants = self.tenants.values().fold(0usize, |sum, t| {
            sum.saturating_add(t.max_cells)
                .saturating_add(t.max_sessions)
                .saturating_add(t.max_commands)
                .saturating_add(self.max_blocking_per_tenant)
        });
        tenants.saturating_add(RESERVE).max(TOKIO_DEFAULT)
    }

    /// Every bound and reference checked: listeners parse, pools name contracts, key
    /// hashes are sha256 hex, no uid or key belongs to two tenants.
    pub fn check(&self) -> Result<(), String> {
        if !self.verify.classes.is_empty() && self.verify.interval_s < 60 {
            return Err("server.verify.interval_s: must be at least 60".into());
        }
        // Zero would refuse every file operation, or end every drain (and every file
        // operation) before it began: not a bound but a broken service.
        for (key, value) in [
            (
                "max_blocking_per_tenant",
                self.max_blocking_per_tenant as u64,
            ),
            ("file_op_timeout_ms", self.file_op_timeout_ms),
            ("drain_grace_ms", self.drain_grace_ms),
        ] {
            if value == 0 {
                return Err(format!("server.{key}: must be at least 1"));
            }
        }
        for listen in &self.listen {
            let parsed = Listen::parse(listen).map_err(|e| format!("server.listen: {e}"))?;
            self.check_transport(listen, &parsed)?;
        }
        if self.tls_cert_file.is_some() != self.tls_key_file.is_some() {
            return Err("server.tls_cert_file and server.tls_key_file: set both or neither".into());
        }
        for name in self.pools.keys() {
            if !self.contracts.contains_key(name) {
                return Err(format!(
                    "server.pools.{name}: no contract of that name in server.contracts"
                ));
            }
        }
        let mut uids = BTreeMap::new();
        let mut keys = BTreeMap::new();
        for (name, tenant) in &self.tenants {
            if name == &self.operator_tenant {
                return Err(format!(
                    "server.tenants.{name}: the operator tenant is uid 0's, not configurable"
                ));
            }
            for key in &tenant.api_key_sha256 {
                if key.len() != 64 || !key.bytes().all(|b| b.is_ascii_hexdigit()) {
                    return Err(format!(
                        "server.tenants.{name}.api_key_sha256: {key:?} is not a sha256 in hex"
                    ));
                }
                if let Some(other) = keys.insert(key.to_ascii_lowercase(), name) {
                    return Err(format!(
                        "server.tenants: {name} and {other} share an API key"
                    ));
                }
            }
            for uid in &tenant.uids {
                if let Some(other) = uids.insert(*uid, name) {
                    return Err(format!(
                        "server.tenants: {name} and {other} share uid {uid}"
                    ));
                }
            }
        }
        let bounded = [
            ("max_body_bytes", self.max_body_bytes as u64, 1, 1 << 30),
            ("max_file_bytes", self.max_file_bytes as u64, 1, 1 << 32),
            (
                "max_header_bytes",
                self.max_header_bytes as u64,
                8192,
                1 << 20,
            ),
            ("max_stream_bytes", self.max_stream_bytes as u64, 1, 1 << 32),
            (
                "metrics_max_series",
                self.metrics_max_series as u64,
                100,
                1_000_000,
            ),
            ("header_timeout_ms", self.header_timeout_ms, 1, 600_000),
            ("body_timeout_ms", self.body_timeout_ms, 1, 3_600_000),
        ];
        for (key, value, min, max) in bounded {
            if !(min..=max).contains(&value) {
                return Err(format!(
                    "server.{key} = {value}: must be between {min} and {max} (docs/api.md)"
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listeners_are_unix_paths_or_tcp_addresses() {
        assert_eq!(
            Listen::parse("unix:/run/a.sock"),
            Ok(Listen::Unix("/run/a.sock".into()))
        );
        assert_eq!(
            Listen::parse("tcp:127.0.0.1:8420"),
            Ok(Listen::Tcp("127.0.0.1:8420".parse().unwrap()))
        );
        assert_eq!(
            Listen::parse("tls:[::]:8443"),
            Ok(Listen::Tls("[::]:8443".parse().unwrap()))
        );
        assert!(Listen::parse("unix:rel.sock").is_err());
        assert!(Listen::parse("http://x.test").is_err());
        assert!(Listen::parse("tls:x.test:8443").is_err());
    }

    fn listening_on(listen: &str) -> ServerConfig {
        ServerConfig {
            listen: vec![listen.into()],
            ..ServerConfig::default()
        }
    }

    #[test]
    fn plain_tcp_off_loopback_is_refused_unless_tls_ends_in_front() {
        for loopback in ["tcp:127.0.0.1:8420", "tcp:127.9.0.1:1", "tcp:[::1]:8420"] {
            listening_on(loopback).check().unwrap();
        }
        for open in ["tcp:0.0.0.0:8420", "tcp:10.0.0.5:8420", "tcp:[::]:8420"] {
            let err = listening_on(open).check().unwrap_err();
            assert!(err.contains("API keys in clear"), "{open}: {err}");
            assert!(err.contains("server.allow_plaintext_tcp"), "{err}");
        }
        let mut proxied = listening_on("tcp:0.0.0.0:8420");
        proxied.allow_plaintext_tcp = true;
        proxied.check().unwrap();
    }

    #[test]
    fn a_tls_listener_needs_its_certificate_and_key() {
        let mut config = listening_on("tls:0.0.0.0:8443");
        let err = config.check().unwrap_err();
        assert!(err.contains("needs server.tls_cert_file and server.tls_key_file"));
        config.tls_cert_file = Some("cert.pem".into());
        assert!(config.check().unwrap_err().contains("needs"));
        config.tls_key_file = Some("key.pem".into());
        config.check().unwrap();
        let mut half = ServerConfig {
            tls_key_file: Some("key.pem".into()),
            ..ServerConfig::default()
        };
        assert!(half.check().unwrap_err().contains("set both or neither"));
        half.tls_cert_file = Some("cert.pem".into());
        half.check().unwrap();
    }

    #[test]
    fn a_pool_must_name_a_contract() {
        let mut config = ServerConfig::default();
        config.pools.insert("small".into(), 2);
        assert!(config.check().unwrap_err().contains("server.pools.small"));
        config.contracts.insert("small".into(), "c.yaml".into());
        config.check().unwrap();
    }

    #[test]
    fn two_tenants_cannot_share_a_uid_or_a_key() {
        let mut config = ServerConfig::default();
        let tenant = TenantConfig {
            uids: vec![1000],
            ..TenantConfig::default()
        };
        config.tenants.insert("a".into(), tenant.clone());
        config.tenants.insert("b".into(), tenant);
        assert!(config.check().unwrap_err().contains("share uid 1000"));
        let mut config = ServerConfig::default();
        let tenant = TenantConfig {
            api_key_sha256: vec!["ab".repeat(32)],
            ..TenantConfig::default()
        };
        config.tenants.insert("a".into(), tenant.clone());
        config.tenants.insert("b".into(), tenant);
        assert!(config.check().unwrap_err().contains("share an API key"));
    }

    #[test]
    fn a_key_hash_must_be_sha256_hex() {
        let mut config = ServerConfig::default();
        let tenant = TenantConfig {
            api_key_sha256: vec!["plain-key".into()],
            ..TenantConfig::default()
        };
        config.tenants.insert("a".into(), tenant);
        assert!(config.check().unwrap_err().contains("not a sha256"));
    }
}
