//! Name resolution for destinations.
//!
//! Order: the operator's static map (`resolve`, like `curl --resolve`), then the configured
//! upstream DNS servers. With no upstream servers, names outside the map fail closed.
//!
//! Upstream DNS uses hickory-resolver (>= 0.26.1) rather than a hand-written client: it
//! already does query-id and source-port randomisation, 0x20-style case checks are
//! available, it falls back to TCP on truncation and validates response/question matching;
//! getting those right by hand is exactly the kind of code a proxy should not own. The
//! resolver is built with no search domains, no hosts file and an explicit server list, so
//! nothing of the host's own resolver configuration leaks into policy.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use hickory_resolver::config::{
    ConnectionConfig, LookupIpStrategy, NameServerConfig, ResolveHosts, ResolverConfig,
};
use hickory_resolver::net::runtime::TokioRuntimeProvider;
use hickory_resolver::{Resolver, TokioResolver};

use crate::destination::normalize_name;
use crate::EgressError;

pub struct DestinationResolver {
    static_map: BTreeMap<String, IpAddr>,
    dns: Option<TokioResolver>,
    timeout: Duration,
}

impl DestinationResolver {
    /// Must be called inside the proxy's tokio runtime context.
    pub fn new(
        static_map: &BTreeMap<String, IpAddr>,
        upstream: &[SocketAddr],
        timeout: Duration,
    ) -> Result<Self, EgressError> {
        let static_map = static_map
            .iter()
            .map(|(k, v)| (normalize_name(k), *v))
            .collect();
        let dns = if upstream.is_empty() {
            None
        } else {
            let servers = upstream
                .iter()
                .map(|addr| {
                    let mut udp = ConnectionConfig::udp();
                    udp.port = addr.port();
                    let mut tcp = ConnectionConfig::tcp();
                    tcp.port = addr.port();
                    NameServerConfig::new(addr.ip(), true, vec![udp, tcp])
                })
                .collect();
            let config = ResolverConfig::from_parts(None, vec![], servers);
            let mut builder =
                Resolver::builder_with_config(config, TokioRuntimeProvider::default());
            let opts = builder.options_mut();
            opts.use_hosts_file = ResolveHosts::Never;
            opts.ip_strategy = LookupIpStrategy::Ipv4AndIpv6;
            opts.ndots = 0;
            opts.timeout = timeout.min(Duration::from_secs(5));
            opts.attempts = 2;
            opts.cache_size = 256;
            Some(
                builder
                    .build()
                    .map_err(|e| EgressError::Resolver(e.to_string()))?,
            )
        };
        Ok(DestinationResolver {
            static_map,
            dns,
            timeout,
        })
    }

    /// Every address for `name` (already normalised), or `None` if it cannot be resolved.
    pub async fn resolve(&self, name: &str) -> Option<Vec<IpAddr>> {
        if let Some(ip) = self.static_map.get(name) {
            return Some(vec![*ip]);
        }
        let dns = self.dns.as_ref()?;
        // A trailing dot makes the query absolute: no search-domain expansion.
        let fqdn = format!("{name}.");
        let lookup = tokio::time::timeout(self.timeout, dns.lookup_ip(fqdn.as_str()))
            .await
            .ok()?
            .ok()?;
        let addrs: Vec<IpAddr> = lookup.iter().collect();
        if addrs.is_empty() {
            None
        } else {
            Some(addrs)
        }
    }
}
