//! Connects the cell runtime's egress hook to the proxy of `airlock-egress`.

use airlock_cell::report::{EgressDecision, EgressRecord};
use airlock_cell::{EgressListeners, EgressSession, EgressSummary};
use airlock_contract::CellPlan;
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
            .and_then(|definition| definition.prepare(&secret.name, lifetime));
        match prepared {
            Ok(injection) => ready.push(PreparedSecret {
                env: secret.env.clone(),
                injection,
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

/// One secret ready for a run: the cell variable that gets its placeholder.
pub struct PreparedSecret {
    pub env: String,
    pub injection: Injection,
}

/// What the cell gets (its variables, placeholders only), what the records never show
/// (values and placeholders), and what the proxy swaps.
pub fn split_prepared(
    prepared: Vec<PreparedSecret>,
) -> (Vec<(String, String)>, Vec<String>, Vec<Injection>) {
    let env = prepared
        .iter()
        .map(|p| (p.env.clone(), p.injection.placeholder.clone()))
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
        let rules = destinations
            .iter()
            .map(|d| DestinationRule {
                host_pattern: d.host_pattern.clone(),
                ports: d.ports.clone(),
            })
            .collect();
        ProxySession {
            config,
            rules,
            policy: RunPolicy {
                injections,
                http_rules,
            },
            handle: None,
            records: Vec::new(),
        }
    }
}

impl EgressSession for ProxySession {
    fn start(&mut self, listeners: EgressListeners) -> Result<(), String> {
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
