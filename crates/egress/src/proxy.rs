//! Runtime, listeners, shared per-cell state and the destination decision.

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::address::{host_addresses, AddressPolicy};
use crate::destination::{parse_host, Allowlist, ParsedHost};
use crate::resolver::DestinationResolver;
use crate::{
    reason, ConnectionRecord, Decision, DestinationRule, EgressConfig, EgressError, ProxyListeners,
    SharedState, TransparentListener,
};

/// Records kept per cell. Past this the proxy refuses new connections outright (and counts
/// them in [`ProxyHandle::dropped_records`]) instead of growing the supervisor's memory
/// without bound: a cell that opens 100k connections has long left normal behaviour.
pub const MAX_RECORDS: usize = 100_000;

/// Sockets accepted beyond `max_connections` are still answered with a proper
/// `egress.limit` refusal; past this many extra the proxy closes them without reading.
const REFUSAL_HEADROOM: u32 = 64;

pub struct Shared {
    /// Replaced whole while the proxy runs ([`ProxyHandle::replace_destinations`]): a
    /// session's destinations change under a live cell (docs/policy.md).
    allowlist: RwLock<Arc<Allowlist>>,
    pub resolver: DestinationResolver,
    pub policy: AddressPolicy,
    pub allow_ip_literals: bool,
    pub upstream_proxy: Option<SocketAddr>,
    pub max_connections: u32,
    pub max_bytes: u64,
    pub idle: Duration,
    pub connect_timeout: Duration,
    /// Destinations whose non-TLS, non-HTTP tunnels are relayed uninspected.
    pub opaque_tunnels: Allowlist,
    /// The run's injected secrets (crate::secrets).
    pub injections: Vec<crate::secrets::Injection>,
    /// The run's per-domain HTTP rules (crate::l7).
    pub http_rules: Vec<crate::l7::HttpRule>,
    /// The run's TLS interception (crate::tls), when it has a CA.
    pub interceptor: Option<crate::tls::Interceptor>,
    bytes_total: AtomicU64,
    active: AtomicU32,
    records: Mutex<Vec<ConnectionRecord>>,
    dropped_records: AtomicU64,
    /// Refused DNS queries recorded so far (see [`MAX_DNS_RECORDS`]).
    dns_records: AtomicU64,
    shutdown: watch::Receiver<bool>,
}

/// Refused DNS queries recorded per cell; past this they are only counted in
/// [`ProxyHandle::dropped_records`]. A cell that floods its resolver must not crowd
/// its connection records out of [`MAX_RECORDS`].
pub const MAX_DNS_RECORDS: u64 = 1024;

impl Shared {
    /// The destinations allowed now. A connection is decided against the list of the
    /// moment it is opened; one already open keeps going when the list changes.
    pub fn allowlist(&self) -> Arc<Allowlist> {
        Arc::clone(&self.allowlist.read().unwrap_or_else(|e| e.into_inner()))
    }

    /// Account `n` bytes against the cell's budget; `false` once the budget is exceeded.
    pub fn consume(&self, n: usize) -> bool {
        let prev = self.bytes_total.fetch_add(n as u64, Ordering::Relaxed);
        prev.saturating_add(n as u64) <= self.max_bytes
    }

    fn budget_exhausted(&self) -> bool {
        self.bytes_total.load(Ordering::Relaxed) >= self.max_bytes
    }

    pub fn shutdown_signal(&self) -> watch::Receiver<bool> {
        self.shutdown.clone()
    }

    fn push_record(&self, record: ConnectionRecord) {
        let mut records = self.records.lock().unwrap_or_else(|e| e.into_inner());
        if records.len() < MAX_RECORDS {
            records.push(record);
        } else {
            self.dropped_records.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Record a refused DNS query for `name`, within [`MAX_DNS_RECORDS`].
    pub fn record_dns_refusal(&self, name: &str) {
        if self.dns_records.fetch_add(1, Ordering::Relaxed) >= MAX_DNS_RECORDS {
            self.dropped_records.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let mut attempt = Attempt::begin("dns");
        attempt.host = name.chars().take(255).collect();
        attempt.port = 53;
        // A name carrying a placeholder is an attempt to send it out through DNS.
        let code = if crate::secrets::contains_marker(name.as_bytes()) {
            reason::SECRET_WRONG_DESTINATION
        } else {
            reason::DNS_REFUSED
        };
        attempt.deny(self, code);
    }

    fn records_full(&self) -> bool {
        self.records.lock().unwrap_or_else(|e| e.into_inner()).len() >= MAX_RECORDS
    }
}

/// Wait until shutdown is requested (or the handle is gone).
pub async fn shutdown_requested(rx: &mut watch::Receiver<bool>) {
    let _ = rx.wait_for(|v| *v).await;
}

/// Run `f` unless shutdown is requested first (`None` then).
pub async fn or_shutdown<F: std::future::Future>(shared: &Shared, f: F) -> Option<F::Output> {
    let mut rx = shared.shutdown_signal();
    tokio::select! {
        out = f => Some(out),
        _ = shutdown_requested(&mut rx) => None,
    }
}

/// Policy decision and connect, abandoned (as `egress.upstream_failed`) on shutdown.
pub async fn decide_and_connect_or_shutdown(
    shared: &Shared,
    raw_host: &str,
    port: u16,
) -> Result<Opened, Refusal> {
    or_shutdown(shared, decide_and_connect(shared, raw_host, port))
        .await
        .unwrap_or(Err(Refusal::new(reason::UPSTREAM_FAILED)))
}

/// One connection attempt in progress; becomes a [`ConnectionRecord`] when finished.
pub struct Attempt {
    pub protocol: &'static str,
    pub host: String,
    pub port: u16,
    pub address: Option<SocketAddr>,
    started: Instant,
    started_at_unix_ms: u64,
}

impl Attempt {
    pub fn begin(protocol: &'static str) -> Self {
        let started_at_unix_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0);
        Attempt {
            protocol,
            host: String::new(),
            port: 0,
            address: None,
            started: Instant::now(),
            started_at_unix_ms,
        }
    }

    /// Record the requested destination (bounded, normalised where possible).
    pub fn target(&mut self, raw_host: &str, port: u16) {
        self.host = canonical_host(raw_host);
        self.port = port;
    }

    pub fn deny(self, shared: &Shared, reason: &'static str) {
        self.finish(shared, Decision::Denied, Some(reason), 0, 0);
    }

    pub fn finish(
        self,
        shared: &Shared,
        decision: Decision,
        reason: Option<&'static str>,
        bytes_up: u64,
        bytes_down: u64,
    ) {
        shared.push_record(ConnectionRecord {
            protocol: self.protocol,
            // A placeholder sent as a name never reaches a record (docs/credentials.md).
            host: crate::secrets::mask(&self.host),
            port: self.port,
            address: self.address,
            decision,
            reason,
            bytes_up,
            bytes_down,
            duration_ms: self.started.elapsed().as_millis() as u64,
            started_at_unix_ms: self.started_at_unix_ms,
        });
    }
}

/// The form of a host used in records and for comparisons.
pub fn canonical_host(raw: &str) -> String {
    match parse_host(raw) {
        ParsedHost::Name(n) => n,
        ParsedHost::Ip(ip) => ip.to_string(),
        ParsedHost::BadNumeric | ParsedHost::Invalid => raw
            .chars()
            .take(255)
            .collect::<String>()
            .to_ascii_lowercase(),
    }
}

impl Shared {
    /// The run's secrets and HTTP rules, as the request checks take them.
    pub fn run_policy(&self) -> (&[crate::secrets::Injection], &[crate::l7::HttpRule]) {
        (&self.injections, &self.http_rules)
    }

    /// The interceptor when TLS to `host` (canonical) must be read: a secret may go there
    /// or an HTTP rule names it. Every other host keeps its plain tunnel.
    pub fn interceptor_for(&self, host: &str) -> Option<&crate::tls::Interceptor> {
        let interceptor = self.interceptor.as_ref()?;
        let secret_host = self.injections.iter().any(|injection| {
            injection
                .hosts
                .iter()
                .any(|pattern| crate::secrets::host_matches(pattern, host))
        });
        let ruled = crate::l7::rule_for(&self.http_rules, host).is_some();
        (secret_host || ruled).then_some(interceptor)
    }

    /// Whether the operator lets a tunnel to `raw_host:port` carry uninspected bytes.
    pub fn allows_opaque_tunnel(&self, raw_host: &str, port: u16) -> bool {
        match parse_host(raw_host) {
            ParsedHost::Name(name) => self.opaque_tunnels.permits(&name, port),
            ParsedHost::Ip(ip) => self.opaque_tunnels.permits_ip(ip, port),
            ParsedHost::BadNumeric | ParsedHost::Invalid => false,
        }
    }
}

/// Why a destination was refused, and the address involved if any.
#[derive(Debug)]
pub struct Refusal {
    pub reason: &'static str,
    pub address: Option<SocketAddr>,
}

impl Refusal {
    fn new(reason: &'static str) -> Self {
        Refusal {
            reason,
            address: None,
        }
    }
}

/// An allowed, connected upstream.
pub struct Opened {
    pub stream: TcpStream,
    /// The destination address connected to (`None` when chained).
    pub address: Option<SocketAddr>,
    /// Bytes the upstream proxy sent after its CONNECT response (belong to the tunnel).
    pub upstream_prefix: Vec<u8>,
}

/// The whole destination policy, then the connection: allowlist, IP-literal rule, own
/// resolution, address rule on every answer, connect to exactly a checked address.
pub async fn decide_and_connect(
    shared: &Shared,
    raw_host: &str,
    port: u16,
) -> Result<Opened, Refusal> {
    let deadline = Instant::now() + shared.connect_timeout;
    if crate::secrets::contains_marker(raw_host.as_bytes()) {
        return Err(Refusal::new(reason::SECRET_WRONG_DESTINATION));
    }
    let (name, addrs) = match parse_host(raw_host) {
        ParsedHost::Invalid => return Err(Refusal::new(reason::NOT_ALLOWLISTED)),
        ParsedHost::BadNumeric => return Err(Refusal::new(reason::IP_LITERAL)),
        ParsedHost::Ip(ip) => {
            if !shared.allow_ip_literals {
                return Err(Refusal::new(reason::IP_LITERAL));
            }
            if !shared.allowlist().permits_ip(ip, port) {
                return Err(Refusal::new(reason::NOT_ALLOWLISTED));
            }
            (None, vec![ip])
        }
        ParsedHost::Name(name) => {
            if !shared.allowlist().permits(&name, port) {
                return Err(Refusal::new(reason::NOT_ALLOWLISTED));
            }
            if shared.upstream_proxy.is_some() {
                // Chained: the upstream proxy resolves the name, so there is nothing for us
                // to check it against (documented trade-off in the crate docs).
                (Some(name), Vec::new())
            } else {
                let addrs = shared
                    .resolver
                    .resolve(&name)
                    .await
                    .ok_or(Refusal::new(reason::RESOLVE_FAILED))?;
                (Some(name), addrs)
            }
        }
    };
    for ip in &addrs {
        if shared.policy.check(*ip).is_some() {
            return Err(Refusal {
                reason: reason::PRIVATE_ADDRESS,
                address: Some(SocketAddr::new(*ip, port)),
            });
        }
    }
    if shared.budget_exhausted() {
        return Err(Refusal::new(reason::LIMIT));
    }
    if let Some(proxy) = shared.upstream_proxy {
        let target = match (&name, addrs.first()) {
            (Some(n), _) => format!("{n}:{port}"),
            (None, Some(IpAddr::V6(v6))) => format!("[{v6}]:{port}"),
            (None, Some(ip)) => format!("{ip}:{port}"),
            (None, None) => return Err(Refusal::new(reason::UPSTREAM_FAILED)),
        };
        return connect_via_proxy(proxy, &target, deadline)
            .await
            .ok_or(Refusal::new(reason::UPSTREAM_FAILED));
    }
    let mut last = None;
    for ip in addrs {
        let addr = SocketAddr::new(ip, port);
        last = Some(addr);
        let remaining = deadline.saturating_duration_since(Instant::now());
        if remaining.is_zero() {
            break;
        }
        if let Ok(Ok(stream)) = tokio::time::timeout(remaining, TcpStream::connect(addr)).await {
            let _ = stream.set_nodelay(true);
            return Ok(Opened {
                stream,
                address: Some(addr),
                upstream_prefix: Vec::new(),
            });
        }
    }
    Err(Refusal {
        reason: reason::UPSTREAM_FAILED,
        address: last,
    })
}

async fn connect_via_proxy(proxy: SocketAddr, target: &str, deadline: Instant) -> Option<Opened> {
    let work = async {
        let mut stream = TcpStream::connect(proxy).await.ok()?;
        let _ = stream.set_nodelay(true);
        let request = format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n");
        stream.write_all(request.as_bytes()).await.ok()?;
        let mut buf = Vec::with_capacity(1024);
        let mut chunk = [0u8; 4096];
        loop {
            let n = stream.read(&mut chunk).await.ok()?;
            if n == 0 {
                return None;
            }
            buf.extend_from_slice(&chunk[..n]);
            let mut headers = [httparse::EMPTY_HEADER; 64];
            let mut response = httparse::Response::new(&mut headers);
            match response.parse(&buf) {
                Ok(httparse::Status::Complete(len)) => {
                    let code = response.code?;
                    if !(200..300).contains(&code) {
                        return None;
                    }
                    return Some(Opened {
                        stream,
                        address: None,
                        upstream_prefix: buf[len..].to_vec(),
                    });
                }
                Ok(httparse::Status::Partial) if buf.len() < 16 * 1024 => continue,
                _ => return None,
            }
        }
    };
    tokio::time::timeout_at(deadline.into(), work)
        .await
        .ok()
        .flatten()
}

/// Parse `http://host:port` (host: IP literal or a key of the static map).
fn parse_upstream_proxy(value: &str, config: &EgressConfig) -> Result<SocketAddr, EgressError> {
    let bad = |why| EgressError::InvalidUpstreamProxy {
        value: value.to_string(),
        why,
    };
    let rest = value
        .strip_prefix("http://")
        .ok_or_else(|| bad("only http:// proxies are supported"))?;
    let authority = rest.strip_suffix('/').unwrap_or(rest);
    let (host, port) = crate::http::split_authority(authority, Some(80))
        .ok_or_else(|| bad("expected http://host:port"))?;
    let ip = match parse_host(&host) {
        ParsedHost::Ip(ip) => ip,
        ParsedHost::Name(name) => *config
            .resolve
            .iter()
            .find(|(k, _)| crate::destination::normalize_name(k) == name)
            .map(|(_, v)| v)
            .ok_or_else(|| bad("host must be an IP literal or a key of `resolve`"))?,
        _ => return Err(bad("invalid host")),
    };
    Ok(SocketAddr::new(ip, port))
}

/// Which protocol a listener speaks.
#[derive(Debug, Clone)]
pub(crate) enum ListenerKind {
    Http,
    Socks5,
    /// A transparent listener: every connection is a tunnel to this name and port.
    Transparent {
        host: Arc<str>,
        port: u16,
    },
}

/// Returned by [`crate::start_proxy`]; stops the proxy on [`ProxyHandle::shutdown`] or drop.
pub struct ProxyHandle {
    shared: SharedState,
    stop: Option<watch::Sender<bool>>,
    thread: Option<JoinHandle<()>>,
    http_addr: SocketAddr,
    socks_addr: Option<SocketAddr>,
}

impl ProxyHandle {
    /// Stop accepting, close every tunnel, join the proxy thread, return every record.
    pub fn shutdown(mut self) -> Vec<ConnectionRecord> {
        self.stop_and_join();
        std::mem::take(
            &mut *self
                .shared
                .records
                .lock()
                .unwrap_or_else(|e| e.into_inner()),
        )
    }

    /// A snapshot of the records written so far (finished attempts only).
    pub fn records_so_far(&self) -> Vec<ConnectionRecord> {
        self.shared
            .records
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Connections refused without a record because [`MAX_RECORDS`] was reached.
    pub fn dropped_records(&self) -> u64 {
        self.shared.dropped_records.load(Ordering::Relaxed)
    }

    /// Total bytes forwarded so far (up + down, all connections).
    pub fn bytes_total(&self) -> u64 {
        self.shared.bytes_total.load(Ordering::Relaxed)
    }

    /// Replaces the destinations the proxy allows: every connection opened from now on
    /// is decided against `rules`; connections already open are left to finish (their
    /// destination was allowed when they were opened).
    pub fn replace_destinations(&self, rules: &[DestinationRule]) {
        let next = Arc::new(Allowlist::new(rules));
        *self
            .shared
            .allowlist
            .write()
            .unwrap_or_else(|e| e.into_inner()) = next;
    }

    /// The HTTP proxy listener's local address.
    pub fn http_addr(&self) -> SocketAddr {
        self.http_addr
    }

    /// The SOCKS5 listener's local address, if one was given.
    pub fn socks_addr(&self) -> Option<SocketAddr> {
        self.socks_addr
    }

    fn stop_and_join(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(true);
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for ProxyHandle {
    fn drop(&mut self) {
        self.stop_and_join();
    }
}

pub fn start(
    config: EgressConfig,
    rules: Vec<DestinationRule>,
    listeners: ProxyListeners,
    policy: crate::RunPolicy,
) -> Result<ProxyHandle, EgressError> {
    let ProxyListeners {
        http: http_listener,
        socks: socks_listener,
        dns: dns_socket,
        transparent,
    } = listeners;
    let allowlist = Allowlist::new(&rules);
    let transparent = check_transparent(&allowlist, transparent)?;
    let upstream_proxy = config
        .upstream_proxy
        .as_deref()
        .map(|v| parse_upstream_proxy(v, &config))
        .transpose()?;
    let host_addresses = host_addresses().map_err(EgressError::HostAddresses)?;
    let roots = config
        .tls_ca_file
        .clone()
        .unwrap_or_else(|| crate::tls::HOST_BUNDLE.into());
    let interceptor = policy
        .tls
        .as_ref()
        .map(|ca| crate::tls::Interceptor::new(ca.clone(), &roots))
        .transpose()?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .thread_name("airlock-egress")
        .build()
        .map_err(EgressError::Runtime)?;

    let (stop_tx, stop_rx) = watch::channel(false);
    let (shared, http, socks, transparent, dns) = {
        let _guard = runtime.enter();
        let resolver = DestinationResolver::new(
            &config.resolve,
            &config.upstream_resolvers,
            Duration::from_millis(config.connect_timeout_ms),
        )?;
        let to_tokio = |l: std::net::TcpListener| -> Result<TcpListener, EgressError> {
            l.set_nonblocking(true).map_err(EgressError::Listener)?;
            TcpListener::from_std(l).map_err(EgressError::Listener)
        };
        let http = to_tokio(http_listener)?;
        let socks = socks_listener.map(to_tokio).transpose()?;
        let transparent = transparent
            .into_iter()
            .map(|(kind, l)| Ok((kind, to_tokio(l)?)))
            .collect::<Result<Vec<_>, EgressError>>()?;
        let dns = dns_socket
            .map(|s| {
                s.set_nonblocking(true).map_err(EgressError::Listener)?;
                tokio::net::UdpSocket::from_std(s).map_err(EgressError::Listener)
            })
            .transpose()?;
        let shared = Arc::new(Shared {
            allowlist: RwLock::new(Arc::new(allowlist)),
            resolver,
            policy: AddressPolicy {
                exempt: config.exempt_cidrs.clone(),
                host_addresses,
            },
            allow_ip_literals: config.allow_ip_literals,
            upstream_proxy,
            max_connections: config.max_connections,
            max_bytes: config.max_bytes,
            idle: Duration::from_millis(config.idle_timeout_ms.max(1)),
            connect_timeout: Duration::from_millis(config.connect_timeout_ms.max(1)),
            opaque_tunnels: Allowlist::new(&config.opaque_tunnels),
            injections: policy.injections,
            http_rules: policy.http_rules,
            interceptor,
            bytes_total: AtomicU64::new(0),
            active: AtomicU32::new(0),
            records: Mutex::new(Vec::new()),
            dropped_records: AtomicU64::new(0),
            dns_records: AtomicU64::new(0),
            shutdown: stop_rx,
        });
        (shared, http, socks, transparent, dns)
    };
    let names = crate::transparent::resolver_names(&transparent);
    let http_addr = http.local_addr().map_err(EgressError::Listener)?;
    let socks_addr = match &socks {
        Some(s) => Some(s.local_addr().map_err(EgressError::Listener)?),
        None => None,
    };

    let task_shared = shared.clone();
    let thread = std::thread::Builder::new()
        .name("airlock-egress".into())
        .spawn(move || {
            runtime.block_on(async move {
                let mut loops = JoinSet::new();
                loops.spawn(accept_loop(task_shared.clone(), http, ListenerKind::Http));
                if let Some(socks) = socks {
                    loops.spawn(accept_loop(
                        task_shared.clone(),
                        socks,
                        ListenerKind::Socks5,
                    ));
                }
                for (kind, listener) in transparent {
                    loops.spawn(accept_loop(task_shared.clone(), listener, kind));
                }
                if let Some(dns) = dns {
                    loops.spawn(crate::transparent::serve_dns(
                        task_shared.clone(),
                        dns,
                        names,
                    ));
                }
                while loops.join_next().await.is_some() {}
            });
            // Dropping the runtime here cancels anything still pending (e.g. DNS tasks).
            drop(runtime);
        })
        .map_err(EgressError::Runtime)?;

    Ok(ProxyHandle {
        shared,
        stop: Some(stop_tx),
        thread: Some(thread),
        http_addr,
        socks_addr,
    })
}

/// The transparent listeners as accept-loop kinds. Fails closed when a listener is not on
/// an IPv4 loopback address or stands for a name and port the allowlist does not permit:
/// the resolver would hand out an address for it.
fn check_transparent(
    allowlist: &Allowlist,
    listeners: Vec<TransparentListener>,
) -> Result<Vec<(ListenerKind, std::net::TcpListener)>, EgressError> {
    listeners
        .into_iter()
        .map(|TransparentListener { host, listener }| {
            let address = listener.local_addr().map_err(EgressError::Listener)?;
            let why = match (address, parse_host(&host)) {
                (SocketAddr::V4(v4), ParsedHost::Name(name)) if v4.ip().is_loopback() => {
                    if allowlist.permits(&name, v4.port()) {
                        let kind = ListenerKind::Transparent {
                            host: name.into(),
                            port: v4.port(),
                        };
                        return Ok((kind, listener));
                    }
                    "the allowlist does not permit this name and port"
                }
                (SocketAddr::V4(v4), _) if v4.ip().is_loopback() => "not a host name",
                _ => "not an IPv4 loopback address",
            };
            Err(EgressError::Transparent {
                host,
                address: address.to_string(),
                why,
            })
        })
        .collect()
}

/// Releases a connection slot when the connection's task ends.
pub struct ConnectionSlot(SharedState);

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        self.0.active.fetch_sub(1, Ordering::Relaxed);
    }
}

async fn accept_loop(shared: SharedState, listener: TcpListener, kind: ListenerKind) {
    let mut tasks = JoinSet::new();
    let mut shutdown = shared.shutdown_signal();
    loop {
        tokio::select! {
            _ = shutdown_requested(&mut shutdown) => break,
            Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
            accepted = listener.accept() => {
                let stream = match accepted {
                    Ok((stream, _)) => stream,
                    Err(_) => {
                        // EMFILE and friends: back off instead of spinning.
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        continue;
                    }
                };
                let prev = shared.active.fetch_add(1, Ordering::Relaxed);
                let slot = ConnectionSlot(shared.clone());
                if shared.records_full() {
                    shared.dropped_records.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                let protocol = match kind {
                    ListenerKind::Http => "http",
                    ListenerKind::Socks5 => "socks5",
                    ListenerKind::Transparent { .. } => crate::transparent::PROTOCOL,
                };
                if prev >= shared.max_connections.saturating_add(REFUSAL_HEADROOM) {
                    Attempt::begin(protocol).deny(&shared, reason::LIMIT);
                    continue;
                }
                let over_limit = prev >= shared.max_connections;
                let shared = shared.clone();
                match &kind {
                    ListenerKind::Http => {
                        tasks.spawn(crate::http::handle(shared, stream, over_limit, slot))
                    }
                    ListenerKind::Socks5 => {
                        tasks.spawn(crate::socks::handle(shared, stream, over_limit, slot))
                    }
                    ListenerKind::Transparent { host, port } => {
                        let destination = (host.clone(), *port);
                        tasks.spawn(crate::transparent::handle(
                            shared, stream, over_limit, slot, destination,
                        ))
                    }
                };
            }
        }
    }
    drop(listener);
    while tasks.join_next().await.is_some() {}
}
