//! The `[server]` section of the operator configuration (docs/api.md): where the service
//! listens, its tenants and their quotas, the named contracts requests may run under, the
//! warm pools, and the bounds of what a client may send.

use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::PathBuf;

#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    /// `unix:/path/to.sock` and `tcp:127.0.0.1:8420` listeners. Empty: one unix socket
    /// at `/run/airlock/airlock.sock` as root, `$XDG_RUNTIME_DIR/airlock/airlock.sock`
    /// otherwise.
    pub listen: Vec<String>,
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
        }
    }
}

/// One listener of `listen`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Listen {
    Unix(PathBuf),
    Tcp(std::net::SocketAddr),
}

impl Listen {
    /// `unix:PATH` (absolute) or `tcp:ADDR:PORT`.
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
        Err(format!(
            "{text}: a listener is `unix:PATH` or `tcp:ADDR:PORT`"
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
    /// Every bound and reference checked: listeners parse, pools name contracts, key
    /// hashes are sha256 hex, no uid or key belongs to two tenants.
    pub fn check(&self) -> Result<(), String> {
        if !self.verify.classes.is_empty() && self.verify.interval_s < 60 {
            return Err("server.verify.interval_s: must be at least 60".into());
        }
        for listen in &self.listen {
            Listen::parse(listen).map_err(|e| format!("server.listen: {e}"))?;
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
        assert!(Listen::parse("unix:rel.sock").is_err());
        assert!(Listen::parse("http://x.test").is_err());
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
