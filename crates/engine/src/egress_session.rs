//! Connects the cell runtime's egress hook to the proxy of `airlock-egress`.

use airlock_cell::report::{EgressDecision, EgressRecord};
use airlock_cell::{EgressListeners, EgressSession, EgressSummary};
use airlock_contract::{CellPlan, SecretDelivery};
use airlock_egress::address::{classify, AddressClass};
use airlock_egress::secrets::{Injection, SecretError};
use airlock_egress::{
    start_proxy_with_policy, ConnectionRecord, Decision, DestinationRule, EgressConfig,
    ProxyHandle, ProxyListeners, RunPolicy, TransparentListener,
};

/// A run's injected secrets (docs/credentials.md): for each secret of the plan the
/// operator's definition, its value read now and a fresh placeholder. When one fails,
/// the provider tokens already issued for the others are revoked at once.
pub fn prepare_secrets(
    config: &EgressConfig,
    plan: &CellPlan,
    lifetime: std::time::Duration,
) -> Result<Vec<PreparedSecret>, SecretError> {
    let mut ready = Vec::with_capacity(plan.secrets.len());
    for secret in &plan.secrets {
        let prepared = config
            .secrets
            .get(&secret.name)
            .ok_or_else(|| SecretError::Undefined {
                name: secret.name.clone(),
            })
            .and_then(|definition| {
                check_delivery(&secret.name, definition, secret.deliver)?;
                definition.prepare(&secret.name, lifetime)
            });
        match prepared {
            Ok(injection) => ready.push(PreparedSecret {
                env: secret.env.clone(),
                injection,
                deliver: secret.deliver,
            }),
            Err(err) => {
                drop(TokenRevoker(
                    ready.into_iter().map(|p| p.injection).collect(),
                ));
                return Err(err);
            }
        }
    }
    Ok(ready)
}

/// A secret may enter the cell's environment only as a provider's token: short-lived
/// (its lifetime was checked against the deadline) and revoked when the run ends. A
/// long-lived value (a variable, a file, a command's output) never does.
fn check_delivery(
    name: &str,
    definition: &airlock_egress::secrets::SecretDefinition,
    deliver: SecretDelivery,
) -> Result<(), SecretError> {
    if deliver == SecretDelivery::Env && !definition.is_provider() {
        return Err(SecretError::Definition {
            name: name.to_string(),
            why: "deliver: env needs a token provider source (a short-lived, revoked token)",
        });
    }
    Ok(())
}

/// One secret ready for a run: the cell variable that gets its placeholder (or, for
/// `deliver: env`, the token itself).
pub struct PreparedSecret {
    pub env: String,
    pub injection: Injection,
    pub deliver: SecretDelivery,
}

impl PreparedSecret {
    /// What the cell's variable holds.
    fn cell_value(&self) -> &str {
        match self.deliver {
            SecretDelivery::Placeholder => &self.injection.placeholder,
            SecretDelivery::Env => &self.injection.value,
        }
    }
}

/// What the cell gets (its variables, placeholders only), what the records never show
/// (values and placeholders), and what the proxy swaps.
pub fn split_prepared(
    prepared: Vec<PreparedSecret>,
) -> (Vec<(String, String)>, Vec<String>, Vec<Injection>) {
    let env = prepared
        .iter()
        .map(|p| (p.env.clone(), p.cell_value().to_string()))
        .collect();
    let hidden = prepared
        .iter()
        .flat_map(|p| [p.injection.value.clone(), p.injection.placeholder.clone()])
        .collect();
    let injections = prepared.into_iter().map(|p| p.injection).collect();
    (env, hidden, injections)
}

/// Revokes a run's provider tokens when dropped: at the end of the run or session, on
/// every path out (a failed start included). A failure is reported on stderr (the token
/// still expires on its own); it never carries the token.
pub struct TokenRevoker(pub Vec<Injection>);

impl Drop for TokenRevoker {
    fn drop(&mut self) {
        for injection in &self.0 {
            if let Err(err) = injection.revoke() {
                eprintln!("airlock: {err}");
            }
        }
    }
}

pub struct ProxySession {
    config: EgressConfig,
    rules: Vec<DestinationRule>,
    policy: RunPolicy,
    handle: Option<ProxyHandle>,
    /// Why the run's TLS interception could not be set up: the proxy then refuses to
    /// start (fail closed) rather than run without it.
    tls_failure: Option<String>,
    pub records: Vec<ConnectionRecord>,
}

impl ProxySession {
    pub fn new(
        config: EgressConfig,
        destinations: &[airlock_contract::DestinationRule],
        http_rules: &[airlock_contract::HttpRulePlan],
        injections: Vec<Injection>,
    ) -> ProxySession {
        let http_rules = http_rules
            .iter()
            .map(|r| airlock_egress::l7::HttpRule {
                host_pattern: r.host.clone(),
                methods: r.methods.clone(),
                path_prefixes: r.path_prefixes.clone(),
            })
            .collect();
        let rules = proxy_rules(destinations);
        ProxySession {
            config,
            rules,
            policy: RunPolicy {
                injections,
                http_rules,
                tls: None,
            },
            handle: None,
            tls_failure: None,
            records: Vec::new(),
        }
    }
}

/// The plan's destinations as the proxy takes them (the same shape).
fn proxy_rules(destinations: &[airlock_contract::DestinationRule]) -> Vec<DestinationRule> {
    destinations
        .iter()
        .map(|d| DestinationRule {
            host_pattern: d.host_pattern.clone(),
            ports: d.ports.clone(),
        })
        .collect()
}

impl ProxySession {
    /// The run's interception, from [`install_run_ca`].
    pub fn with_tls(mut self, tls: &Result<Option<RunTls>, String>) -> ProxySession {
        match tls {
            Ok(tls) => self.policy.tls = tls.as_ref().map(|t| t.ca.clone()),
            Err(why) => self.tls_failure = Some(why.clone()),
        }
        self
    }
}

impl EgressSession for ProxySession {
    fn start(&mut self, listeners: EgressListeners) -> Result<(), String> {
        if let Some(why) = &self.tls_failure {
            return Err(format!("TLS interception: {why}"));
        }
        let transparent = listeners
            .transparent
            .into_iter()
            .map(|(endpoint, fd)| TransparentListener {
                host: endpoint.host,
                listener: std::net::TcpListener::from(fd),
            })
            .collect();
        let listeners = ProxyListeners {
            http: std::net::TcpListener::from(listeners.http),
            socks: Some(std::net::TcpListener::from(listeners.socks)),
            dns: Some(std::net::UdpSocket::from(listeners.dns)),
            transparent,
        };
        // The proxy holds the values; this session forgets them once it is started.
        let policy = std::mem::take(&mut self.policy);
        let handle =
            start_proxy_with_policy(self.config.clone(), self.rules.clone(), listeners, policy)
                .map_err(|e| e.to_string())?;
        self.handle = Some(handle);
        Ok(())
    }

    fn replace_destinations(
        &mut self,
        destinations: &[airlock_contract::DestinationRule],
    ) -> Result<(), String> {
        let rules = proxy_rules(destinations);
        match &self.handle {
            Some(handle) => {
                handle.replace_destinations(&rules);
                self.rules = rules;
                Ok(())
            }
            None => Err("the session's egress proxy is not running".to_string()),
        }
    }

    fn finish(&mut self) -> EgressSummary {
        if let Some(handle) = self.handle.take() {
            self.records = handle.shutdown();
        }
        let denied: Vec<&ConnectionRecord> = self
            .records
            .iter()
            .filter(|r| r.decision == Decision::Denied)
            .collect();
        EgressSummary {
            records: self.records.iter().map(egress_record).collect(),
            denials: denied.len(),
            metadata_probes: denied.iter().filter(|r| targets_metadata(r)).count(),
        }
    }
}

/// The proxy's record as the cell's result records it (the same fields: the JSON of the
/// result is unchanged).
fn egress_record(record: &ConnectionRecord) -> EgressRecord {
    EgressRecord {
        protocol: record.protocol.to_string(),
        host: record.host.clone(),
        port: record.port,
        address: record.address,
        decision: match record.decision {
            Decision::Allowed => EgressDecision::Allowed,
            Decision::Denied => EgressDecision::Denied,
        },
        reason: record.reason.map(str::to_string),
        bytes_up: record.bytes_up,
        bytes_down: record.bytes_down,
        duration_ms: record.duration_ms,
        started_at_unix_ms: record.started_at_unix_ms,
    }
}

/// Whether a refused attempt aimed at a cloud metadata endpoint, by resolved address or by
/// an IP literal in the request.
fn targets_metadata(record: &ConnectionRecord) -> bool {
    let literal = record
        .host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .parse()
        .ok();
    record
        .address
        .map(|a| a.ip())
        .into_iter()
        .chain(literal)
        .any(|ip| classify(ip) == Some(AddressClass::Metadata))
}

/// Where the cell finds its trust bundle, and the variables that point the common
/// runtimes at it (OpenSSL-based tools, Python requests, Node, curl).
pub const CELL_TRUST_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";
const TRUST_VARIABLES: &[&str] = &[
    "SSL_CERT_FILE",
    "REQUESTS_CA_BUNDLE",
    "NODE_EXTRA_CA_CERTS",
    "CURL_CA_BUNDLE",
];

/// A run's TLS interception (docs/credentials.md, "HTTPS"): its CA, whose key lives
/// only in this process, and the cell's trust bundle file (the host's bundle plus the
/// CA's certificate, public), removed when the run ends.
pub struct RunTls {
    pub ca: std::sync::Arc<airlock_egress::tls::RunCa>,
    _bundle: tempfile::NamedTempFile,
}

/// Whether a plan's TLS must be intercepted: it has secrets or HTTP rules to apply
/// inside it.
pub fn needs_interception(plan: &CellPlan) -> bool {
    matches!(
        plan.network,
        airlock_contract::NetworkPlan::Allowlist { .. }
    ) && (!plan.secrets.is_empty() || !plan.http_rules.is_empty())
}

/// Makes the run's CA and installs its certificate in the cell's trust view: the
/// bundle is mounted (read-only, as data) over the system bundle path, and the trust
/// variables point at it. `Ok(None)` for a plan that needs no interception.
pub fn install_run_ca(plan: &mut CellPlan) -> Result<Option<RunTls>, String> {
    if !needs_interception(plan) {
        return Ok(None);
    }
    let ca = airlock_egress::tls::RunCa::generate().map_err(|e| e.to_string())?;
    let bundle = write_bundle(&airlock_egress::tls::trust_bundle(&ca))
        .map_err(|e| format!("writing the cell's trust bundle: {e}"))?;
    plan.etc.push(airlock_contract::EtcEntry::Contract {
        source: bundle.path().to_path_buf(),
        target: CELL_TRUST_BUNDLE.into(),
    });
    for name in TRUST_VARIABLES {
        plan.env.retain(|var| var.name != *name);
        plan.env.push(airlock_contract::EnvVar {
            name: name.to_string(),
            value: CELL_TRUST_BUNDLE.to_string(),
            secret: false,
        });
    }
    Ok(Some(RunTls {
        ca: std::sync::Arc::new(ca),
        _bundle: bundle,
    }))
}

/// World-readable: a cell of an unprivileged caller clones it as that user, and it holds
/// only certificates.
fn write_bundle(bytes: &[u8]) -> std::io::Result<tempfile::NamedTempFile> {
    use std::io::Write;
    use std::os::unix::fs::PermissionsExt;
    let mut file = tempfile::Builder::new()
        .prefix("airlock-trust-")
        .suffix(".crt")
        .tempfile()?;
    file.write_all(bytes)?;
    file.flush()?;
    file.as_file()
        .set_permissions(std::fs::Permissions::from_mode(0o644))?;
    Ok(file)
}
