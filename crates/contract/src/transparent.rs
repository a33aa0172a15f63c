//! The transparent egress path of an allowlist plan: which loopback address the cell's
//! resolver hands out for each allowlisted name, and which listeners the launcher binds
//! there. A pure function of the allowlist, so the launcher (which binds), Landlock
//! (which allows the ports) and the supervisor (which checks what it was handed) derive
//! the same list without passing it around.
//!
//! Only exact names get an address. A wildcard (`*.pkg.test`) has no address of its own
//! and IP-literal entries are no names: both stay reachable through the proxies only.

use crate::plan::{DestinationRule, NetworkPlan};
use serde::{Deserialize, Serialize};
use std::net::{Ipv4Addr, SocketAddrV4};

/// Where the cell's resolver listens (UDP). Inside 127/8, which is local on `lo` as a
/// whole, so binding it needs no address or route setup; the same address
/// systemd-resolved uses, which some tools already expect.
pub const TRANSPARENT_DNS: SocketAddrV4 = SocketAddrV4::new(Ipv4Addr::new(127, 0, 0, 53), 53);

/// The first address handed out; the n-th name (counting from 0) gets this plus n.
const FIRST_ADDRESS: Ipv4Addr = Ipv4Addr::new(127, 100, 0, 1);

/// Most transparent listeners per cell. All of them travel in one SCM_RIGHTS message
/// with the proxies and the resolver, and the kernel passes at most 253 descriptors at
/// once; names past the cap keep the proxy path only.
pub const MAX_TRANSPARENT_LISTENERS: usize = 240;

/// One listener of the transparent path: connections to `address` are carried by the
/// proxy as if the cell had asked for a tunnel to `host:address.port()`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TransparentEndpoint {
    /// The allowlisted name (lower case, no trailing dot).
    pub host: String,
    pub address: SocketAddrV4,
}

impl NetworkPlan {
    /// The transparent listeners of this plan; none in `deny` or `pod` mode.
    pub fn transparent_endpoints(&self) -> Vec<TransparentEndpoint> {
        match self {
            NetworkPlan::Deny | NetworkPlan::Pod { .. } => Vec::new(),
            NetworkPlan::Allowlist { destinations } => transparent_endpoints(destinations),
        }
    }
}

/// Addresses in order of first appearance of each exact name; a name listed by several
/// rules gets one address with the union of their ports.
pub fn transparent_endpoints(destinations: &[DestinationRule]) -> Vec<TransparentEndpoint> {
    let mut names: Vec<(String, Vec<u16>)> = Vec::new();
    for rule in destinations {
        let Some(host) = exact_name(&rule.host_pattern) else {
            continue;
        };
        match names.iter_mut().find(|(name, _)| *name == host) {
            Some((_, ports)) => ports.extend(&rule.ports),
            None => names.push((host, rule.ports.clone())),
        }
    }
    let mut endpoints = Vec::new();
    for (index, (host, mut ports)) in names.into_iter().enumerate() {
        let ip = Ipv4Addr::from(u32::from(FIRST_ADDRESS) + index as u32);
        ports.sort_unstable();
        ports.dedup();
        for port in ports {
            if endpoints.len() == MAX_TRANSPARENT_LISTENERS {
                return endpoints;
            }
            endpoints.push(TransparentEndpoint {
                host: host.clone(),
                address: SocketAddrV4::new(ip, port),
            });
        }
    }
    endpoints
}

/// The allowlist entry as a name that can have an address: not a wildcard, not an IP.
fn exact_name(pattern: &str) -> Option<String> {
    let host = pattern.trim().to_ascii_lowercase();
    let host = host.strip_suffix('.').unwrap_or(&host).to_string();
    let is_name = !host.is_empty()
        && host.parse::<std::net::IpAddr>().is_err()
        && host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.');
    // A name ending in a number is an IP literal to some resolver (`127.1`).
    let numeric_tail = host
        .rsplit('.')
        .next()
        .is_some_and(|l| l.bytes().all(|b| b.is_ascii_digit()));
    (is_name && !numeric_tail).then_some(host)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(host: &str, ports: &[u16]) -> DestinationRule {
        DestinationRule {
            host_pattern: host.into(),
            ports: ports.to_vec(),
        }
    }

    fn addr(s: &str) -> SocketAddrV4 {
        s.parse().unwrap()
    }

    #[test]
    fn each_exact_name_gets_its_own_address_with_a_listener_per_port() {
        let got = transparent_endpoints(&[rule("api.test", &[443, 80]), rule("git.test", &[22])]);
        let want = [
            ("api.test", "127.100.0.1:80"),
            ("api.test", "127.100.0.1:443"),
            ("git.test", "127.100.0.2:22"),
        ];
        assert_eq!(got.len(), want.len());
        for (endpoint, (host, address)) in got.iter().zip(want) {
            assert_eq!(endpoint.host, host);
            assert_eq!(endpoint.address, addr(address));
        }
    }

    #[test]
    fn wildcards_and_ip_literals_get_no_transparent_address() {
        let got = transparent_endpoints(&[
            rule("*.pkg.test", &[443]),
            rule("10.9.8.7", &[22]),
            rule("127.1", &[80]),
            rule("[::1]", &[80]),
            rule("api.test", &[443]),
        ]);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].host, "api.test");
        assert_eq!(got[0].address, addr("127.100.0.1:443"));
    }

    #[test]
    fn a_name_listed_twice_shares_one_address() {
        let got =
            transparent_endpoints(&[rule("API.test.", &[443]), rule("api.test", &[8443, 443])]);
        let addresses: Vec<_> = got.iter().map(|e| e.address).collect();
        assert_eq!(
            addresses,
            [addr("127.100.0.1:443"), addr("127.100.0.1:8443")]
        );
    }

    #[test]
    fn listeners_are_capped_and_deny_mode_has_none() {
        let many: Vec<_> = (0..300)
            .map(|i| rule(&format!("n{i}.test"), &[443]))
            .collect();
        assert_eq!(
            transparent_endpoints(&many).len(),
            MAX_TRANSPARENT_LISTENERS
        );
        assert!(NetworkPlan::Deny.transparent_endpoints().is_empty());
    }
}
