//! airlock-egress: the supervisor-side egress proxy for allowlisted cells.
//!
//! A cell's network namespace holds only `lo`. The launcher binds two listening sockets on
//! `127.0.0.1` inside that namespace (HTTP proxy, SOCKS5) and hands them to the trusted
//! supervisor, which calls [`start_proxy`]. The proxy runs in the host namespace, so every
//! upstream connection it makes uses the host network - which is why it must decide, for
//! every attempt, whether the destination is allowed:
//!
//! 1. the host must match the contract's allowlist (exact name or `*.` sub-domain wildcard,
//!    and the port must be listed) - [`reason::NOT_ALLOWLISTED`];
//! 2. IP literals are refused unless the operator allows them - [`reason::IP_LITERAL`];
//! 3. the proxy resolves the name itself and refuses if *any* address is non-public
//!    ([`address`]) - [`reason::PRIVATE_ADDRESS`] - then connects to exactly the checked
//!    address, so DNS rebinding cannot redirect the connection;
//! 4. inside CONNECT/SOCKS tunnels a TLS ClientHello must name the same server -
//!    [`reason::SNI_MISMATCH`]; plain HTTP, forwarded or tunnelled, must carry a matching
//!    `Host` on every request - [`reason::HOST_MISMATCH`] - and unambiguous framing -
//!    [`reason::AMBIGUOUS_FRAMING`]; other plaintext needs the operator's
//!    `opaque_tunnels` - [`reason::PLAINTEXT_TUNNEL`];
//! 5. per-cell ceilings (connections, bytes, idle) - [`reason::LIMIT`].
//!
//! Every attempt yields exactly one [`ConnectionRecord`].
//!
//! # The transparent path
//!
//! Clients that ignore the proxy variables (Node's `fetch`, Go without `HTTPS_PROXY`, raw
//! sockets) reach allowlisted names through [`ProxyListeners::transparent`]: the launcher
//! binds, inside the cell, one loopback address per exact allowlisted name with a
//! listener on each of its ports, and a UDP socket for the cell's resolver
//! ([`ProxyListeners::dns`], answered by [`dns`]), which hands out exactly those
//! addresses and nothing else - it never forwards a query. A connection accepted on a
//! transparent listener is a tunnel to the name and port that listener stands for:
//! steps 1-5 above apply unchanged (record protocol `"transparent"`). Nothing else
//! becomes reachable: an address the resolver did not hand out has no listener in the
//! cell's network namespace, which holds only `lo`.
//!
//! # Deliberate trade-offs
//!
//! - **No SNI is allowed; unchecked plaintext is not.** The tunnel can only reach an
//!   address that was resolved and checked for the allowlisted name, so a hello without a
//!   name cannot ask for a second one. The SNI check exists to stop asking a shared front
//!   end (CDN, virtual hosting) for a *different* name; Encrypted Client Hello hides the
//!   inner name, the outer (public) name is what is checked. Plain HTTP can ask the same
//!   front end for another name in its `Host` header, so a non-TLS tunnel is read as HTTP
//!   and every request checked; a protocol that is neither is refused unless the operator
//!   lists the destination in `opaque_tunnels` (relayed uninspected).
//! - **Chaining (`upstream_proxy`)**: the proxy sends `CONNECT name:port` to the upstream
//!   proxy and resolves nothing itself, so the private-address rule cannot be applied to
//!   names (the corporate proxy is trusted to resolve and route); it still applies to IP
//!   literals. Plain-HTTP requests are also tunnelled with CONNECT through it.
//! - **One request per plain-HTTP connection** (`Connection: close` upstream): every request
//!   gets its own policy decision and record, and pipelined bytes after the request body
//!   are dropped rather than reaching the upstream unchecked.
//! - **Server-first protocols work**: while waiting for the client's first bytes (for the
//!   SNI check), the upstream-to-client direction already flows.
//! - **Records are bounded** at [`MAX_RECORDS`] per cell; past that, new connections
//!   are closed unserved and counted by [`ProxyHandle::dropped_records`].

pub mod address;
pub mod destination;
pub mod dns;
#[doc(hidden)]
pub mod fuzzing;
mod http;
mod intercept;
pub mod l7;
mod proxy;
pub mod reason;
mod request;
mod resolvable;
mod resolver;
pub mod secrets;
pub mod sni;
mod socks;
pub mod tls;
mod transparent;
mod tunnel;

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

pub use proxy::{ProxyHandle, MAX_RECORDS};

/// The operator's `[egress]` table (trusted; never from the contract or the model).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct EgressConfig {
    /// Static host map, like `curl --resolve`: `resolve = { "api.test" = "127.0.0.2" }`.
    pub resolve: BTreeMap<String, IpAddr>,
    /// Ranges exempt from the private-address rule, e.g. `["127.0.0.2/32"]`.
    #[schemars(with = "Vec<String>")]
    pub exempt_cidrs: Vec<ipnet::IpNet>,
    /// DNS servers for names not in `resolve`. Empty: such names are refused
    /// (`egress.resolve_failed`), i.e. fail closed.
    pub upstream_resolvers: Vec<SocketAddr>,
    /// Allow IP-literal destinations (still subject to the private-address rule).
    pub allow_ip_literals: bool,
    /// Optional `http://host:port` proxy to chain every upstream connection through (via
    /// CONNECT). `host` must be an IP literal or a key of `resolve`.
    pub upstream_proxy: Option<String>,
    /// Concurrent client connections per cell.
    #[schemars(range(min = 1, max = 4096))]
    pub max_connections: u32,
    /// Total bytes forwarded (up + down) per cell.
    #[schemars(range(min = 1, max = 1_099_511_627_776u64))]
    pub max_bytes: u64,
    /// A tunnel or request with no traffic for this long is closed.
    #[schemars(range(min = 1, max = 3_600_000))]
    pub idle_timeout_ms: u64,
    /// Upper bound for resolving + connecting upstream.
    #[schemars(range(min = 1, max = 600_000))]
    pub connect_timeout_ms: u64,
    /// Tunnel destinations (already allowlisted by the contract) that may carry a protocol
    /// that is neither TLS nor HTTP - SSH, SMTP, a database - relayed without inspection.
    /// Empty (the default): such tunnels are refused with `egress.plaintext_tunnel`. Only
    /// list destinations that serve one name: a shared HTTP front end listed here could be
    /// asked for another virtual host in bytes the proxy does not parse. Plain HTTP is
    /// still parsed and Host-checked on these destinations.
    pub opaque_tunnels: Vec<DestinationRule>,
    /// The roots (a PEM bundle) that verify the upstream of an intercepted TLS tunnel
    /// (a secret's host or a domain with an HTTP rule; docs/credentials.md). Default: the
    /// host's bundle, `/etc/ssl/certs/ca-certificates.crt`.
    pub tls_ca_file: Option<std::path::PathBuf>,
    /// The operator's secrets (`[secrets.NAME]`, a top-level table of the configuration
    /// copied here by the binary so that the engine sees it): not part of `[egress]`.
    #[serde(skip)]
    #[schemars(skip)]
    pub secrets: BTreeMap<String, secrets::SecretDefinition>,
}

impl Default for EgressConfig {
    fn default() -> Self {
        EgressConfig {
            resolve: BTreeMap::new(),
            exempt_cidrs: Vec::new(),
            upstream_resolvers: Vec::new(),
            allow_ip_literals: false,
            upstream_proxy: None,
            max_connections: 32,
            max_bytes: 256 * 1024 * 1024,
            idle_timeout_ms: 30_000,
            connect_timeout_ms: 10_000,
            opaque_tunnels: Vec::new(),
            tls_ca_file: None,
            secrets: BTreeMap::new(),
        }
    }
}

/// One allowlist entry (same shape as the contract crate's `DestinationRule`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct DestinationRule {
    /// Host name; a leading `*.` matches any sub-domain (not the apex).
    pub host_pattern: String,
    /// Allowed ports.
    pub ports: Vec<u16>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Decision {
    Allowed,
    Denied,
}

/// The outcome of one connection attempt through the proxy.
#[derive(Debug, Clone, Serialize)]
pub struct ConnectionRecord {
    /// `"http"` (plain forward), `"connect"` (HTTP CONNECT tunnel), `"socks5"`,
    /// `"transparent"` (a transparent listener) or `"dns"` (a query the cell's resolver
    /// refused; `port` 53, never `allowed`).
    pub protocol: &'static str,
    /// Requested host, normalised (lower case, no trailing dot); empty when the request
    /// was too malformed to name one.
    pub host: String,
    pub port: u16,
    /// The address actually connected to (or, for `egress.private_address`, the offending
    /// address). `None` when denied before resolution or when chained through
    /// `upstream_proxy` (the upstream proxy resolved the name).
    pub address: Option<SocketAddr>,
    pub decision: Decision,
    /// A [`reason`] code: why it was denied, or why an allowed tunnel was cut short
    /// (`egress.limit`, `egress.sni_mismatch`). `None` for a clean allowed connection.
    pub reason: Option<&'static str>,
    /// Bytes forwarded from the cell to the destination.
    pub bytes_up: u64,
    /// Bytes forwarded from the destination to the cell.
    pub bytes_down: u64,
    pub duration_ms: u64,
    pub started_at_unix_ms: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum EgressError {
    #[error("invalid upstream_proxy {value:?}: {why}")]
    InvalidUpstreamProxy { value: String, why: &'static str },
    #[error("cannot use the proxy listener: {0}")]
    Listener(#[source] std::io::Error),
    #[error("cannot start the proxy runtime: {0}")]
    Runtime(#[source] std::io::Error),
    #[error("cannot enumerate the host's addresses: {0}")]
    HostAddresses(#[source] std::io::Error),
    #[error("cannot build the DNS resolver: {0}")]
    Resolver(String),
    #[error("TLS interception: {0}")]
    Tls(#[from] tls::TlsError),
    #[error("transparent listener {address} for {host}: {why}")]
    Transparent {
        host: String,
        address: String,
        why: &'static str,
    },
}

impl EgressError {
    /// `true` when the operator's configuration is at fault (fix the config), `false` when
    /// the host failed us (a `runtime_fault`, safe to retry).
    pub fn is_config_error(&self) -> bool {
        match self {
            EgressError::InvalidUpstreamProxy { .. } => true,
            EgressError::Resolver(_) => true,
            // The roots the operator named (or the host's bundle) are unusable.
            EgressError::Tls(_) => true,
            EgressError::Listener(_) => false,
            EgressError::Runtime(_) => false,
            EgressError::HostAddresses(_) => false,
            // The launcher bound what the plan does not allow: airlock's own fault.
            EgressError::Transparent { .. } => false,
        }
    }
}

/// Start the proxy on the given (already listening) sockets and return at once.
///
/// The proxy runs on its own thread with a single-threaded tokio runtime; the caller stays
/// synchronous. Call [`ProxyHandle::shutdown`] to stop it and collect every record.
pub fn start_proxy(
    config: EgressConfig,
    rules: Vec<DestinationRule>,
    http_listener: std::net::TcpListener,
    socks_listener: Option<std::net::TcpListener>,
) -> Result<ProxyHandle, EgressError> {
    let listeners = ProxyListeners {
        http: http_listener,
        socks: socks_listener,
        dns: None,
        transparent: Vec::new(),
    };
    proxy::start(config, rules, listeners, RunPolicy::default())
}

/// [`start_proxy`] with the transparent path too.
pub fn start_proxy_on(
    config: EgressConfig,
    rules: Vec<DestinationRule>,
    listeners: ProxyListeners,
) -> Result<ProxyHandle, EgressError> {
    proxy::start(config, rules, listeners, RunPolicy::default())
}

/// [`start_proxy_on`] for a run that uses injected secrets: the proxy swaps each
/// injection's placeholder as docs/credentials.md describes and refuses every other use.
pub fn start_proxy_with_secrets(
    config: EgressConfig,
    rules: Vec<DestinationRule>,
    listeners: ProxyListeners,
    injections: Vec<secrets::Injection>,
) -> Result<ProxyHandle, EgressError> {
    proxy::start(
        config,
        rules,
        listeners,
        RunPolicy {
            injections,
            http_rules: Vec::new(),
            tls: None,
        },
    )
}

/// What a run adds to its destinations' allowlist: injected secrets and per-domain HTTP
/// rules.
#[derive(Debug, Default, Clone)]
pub struct RunPolicy {
    pub injections: Vec<secrets::Injection>,
    pub http_rules: Vec<l7::HttpRule>,
    /// The run's CA: with it, TLS to a secret's host or a domain with an HTTP rule is
    /// intercepted and checked like plain HTTP; without it such TLS is refused
    /// (`egress.tls_uninspectable`) for a rule's domain and tunnelled for a secret's.
    pub tls: Option<Arc<tls::RunCa>>,
}

/// [`start_proxy_on`] with a run's secrets and HTTP rules.
pub fn start_proxy_with_policy(
    config: EgressConfig,
    rules: Vec<DestinationRule>,
    listeners: ProxyListeners,
    policy: RunPolicy,
) -> Result<ProxyHandle, EgressError> {
    proxy::start(config, rules, listeners, policy)
}

/// Every socket the proxy serves, already bound (inside the cell's network namespace).
pub struct ProxyListeners {
    pub http: std::net::TcpListener,
    pub socks: Option<std::net::TcpListener>,
    /// The cell's resolver; it answers the names of `transparent`, with the address each
    /// of their listeners is bound on.
    pub dns: Option<std::net::UdpSocket>,
    pub transparent: Vec<TransparentListener>,
}

/// A listener standing for one allowlisted `host` on the port it is bound to.
pub struct TransparentListener {
    pub host: String,
    pub listener: std::net::TcpListener,
}

pub(crate) type SharedState = Arc<proxy::Shared>;
