//! Destination names: normalisation, IP-literal detection and allowlist matching.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::DestinationRule;

/// What a client-supplied host string turned out to be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ParsedHost {
    /// A syntactically valid DNS name, lower-cased, without a trailing dot.
    Name(String),
    /// An IP literal in any spelling a resolver library would accept (dotted quad,
    /// `inet_aton` shorthands such as `127.1` or `0x7f000001`, bracketed or bare IPv6).
    Ip(IpAddr),
    /// Looks numeric (last label all digits / hex) but is no valid address: always refused
    /// as an IP literal, because some resolver somewhere would turn it into one.
    BadNumeric,
    /// Not a valid host name at all (cannot match any rule).
    Invalid,
}

/// Lower-case and strip one trailing dot.
pub fn normalize_name(raw: &str) -> String {
    let lower = raw.to_ascii_lowercase();
    match lower.strip_suffix('.') {
        Some(s) => s.to_string(),
        None => lower,
    }
}

pub fn parse_host(raw: &str) -> ParsedHost {
    if let Some(inner) = raw.strip_prefix('[') {
        return match inner.strip_suffix(']').map(str::parse::<Ipv6Addr>) {
            Some(Ok(v6)) => ParsedHost::Ip(IpAddr::V6(v6)),
            // Zone ids (`[fe80::1%eth0]`) and junk in brackets are numeric-looking enough.
            _ => ParsedHost::BadNumeric,
        };
    }
    if let Ok(ip) = raw.parse::<IpAddr>() {
        return ParsedHost::Ip(ip);
    }
    if raw.contains(':') {
        return ParsedHost::BadNumeric;
    }
    let name = normalize_name(raw);
    if name.is_empty() || name.len() > 253 {
        return ParsedHost::Invalid;
    }
    let labels: Vec<&str> = name.split('.').collect();
    let last = labels[labels.len() - 1];
    if is_numeric_label(last) {
        return match inet_aton(&name) {
            Some(v4) => ParsedHost::Ip(IpAddr::V4(v4)),
            None => ParsedHost::BadNumeric,
        };
    }
    let label_ok = |l: &&str| {
        !l.is_empty()
            && l.len() <= 63
            && l.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    };
    if labels.iter().all(label_ok) {
        ParsedHost::Name(name)
    } else {
        ParsedHost::Invalid
    }
}

/// A top-level label that is a number: no real TLD is, but `inet_aton` accepts it.
fn is_numeric_label(label: &str) -> bool {
    if label.is_empty() {
        return false;
    }
    if let Some(hex) = label.strip_prefix("0x") {
        return hex.bytes().all(|b| b.is_ascii_hexdigit());
    }
    label.bytes().all(|b| b.is_ascii_digit())
}

/// The permissive IPv4 syntax of BSD `inet_aton` (1 to 4 parts; decimal, octal, hex).
fn inet_aton(s: &str) -> Option<Ipv4Addr> {
    let parts: Vec<&str> = s.split('.').collect();
    if parts.is_empty() || parts.len() > 4 {
        return None;
    }
    let mut nums = Vec::with_capacity(4);
    for p in &parts {
        let v = if let Some(h) = p.strip_prefix("0x") {
            if h.is_empty() {
                0
            } else {
                u64::from_str_radix(h, 16).ok()?
            }
        } else if p.len() > 1 && p.starts_with('0') {
            u64::from_str_radix(&p[1..], 8).ok()?
        } else {
            p.parse::<u64>().ok()?
        };
        nums.push(v);
    }
    let (init, last) = nums.split_at(nums.len() - 1);
    if init.iter().any(|&v| v > 255) {
        return None;
    }
    let last_bits = 8 * (4 - init.len() as u32);
    if last[0] >= 1u64 << last_bits {
        return None;
    }
    let mut value: u64 = 0;
    for (i, v) in init.iter().enumerate() {
        value |= v << (24 - 8 * i as u32);
    }
    value |= last[0];
    Some(Ipv4Addr::from(value as u32))
}

/// The compiled allowlist.
#[derive(Debug, Clone, Default)]
pub struct Allowlist {
    rules: Vec<CompiledRule>,
}

#[derive(Debug, Clone)]
struct CompiledRule {
    pattern: Pattern,
    ports: Vec<u16>,
}

#[derive(Debug, Clone)]
enum Pattern {
    Exact(String),
    /// `*.example.org` stored as `.example.org`: sub-domains only, never the apex.
    Suffix(String),
}

impl Allowlist {
    pub fn new(rules: &[DestinationRule]) -> Self {
        let rules = rules
            .iter()
            .map(|r| {
                let host = normalize_name(r.host_pattern.trim());
                let pattern = match host.strip_prefix("*.") {
                    Some(rest) if !rest.is_empty() => Pattern::Suffix(format!(".{rest}")),
                    _ => Pattern::Exact(host),
                };
                CompiledRule {
                    pattern,
                    ports: r.ports.clone(),
                }
            })
            .collect();
        Allowlist { rules }
    }

    /// `host` must already be normalised (see [`normalize_name`]) or an IP's text form.
    pub fn permits(&self, host: &str, port: u16) -> bool {
        self.rules.iter().any(|rule| {
            let host_ok = match &rule.pattern {
                Pattern::Exact(h) => h == host,
                Pattern::Suffix(suffix) => host.len() > suffix.len() && host.ends_with(suffix),
            };
            host_ok && rule.ports.contains(&port)
        })
    }

    /// Allowlist check for an IP literal destination: a rule may name the address in its
    /// canonical text form, with or without brackets for IPv6.
    pub fn permits_ip(&self, ip: IpAddr, port: u16) -> bool {
        let text = ip.to_string();
        self.permits(&text, port) || (ip.is_ipv6() && self.permits(&format!("[{text}]"), port))
    }
}

/// Case-insensitive host comparison ignoring one trailing dot.
pub fn same_host(a: &str, b: &str) -> bool {
    normalize_name(a) == normalize_name(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(p: &str, ports: &[u16]) -> DestinationRule {
        DestinationRule {
            host_pattern: p.into(),
            ports: ports.to_vec(),
        }
    }

    #[test]
    fn parse_hosts() {
        let ip = |s: &str| ParsedHost::Ip(s.parse().unwrap());
        assert_eq!(parse_host("API.Test."), ParsedHost::Name("api.test".into()));
        assert_eq!(
            parse_host("a_b.example.org"),
            ParsedHost::Name("a_b.example.org".into())
        );
        assert_eq!(parse_host("127.0.0.1"), ip("127.0.0.1"));
        assert_eq!(parse_host("127.1"), ip("127.0.0.1"));
        assert_eq!(parse_host("0x7f000001"), ip("127.0.0.1"));
        assert_eq!(parse_host("2130706433"), ip("127.0.0.1"));
        assert_eq!(parse_host("0177.0.0.1"), ip("127.0.0.1"));
        assert_eq!(parse_host("10.0.0.1."), ip("10.0.0.1"));
        assert_eq!(parse_host("[::ffff:127.0.0.1]"), ip("::ffff:127.0.0.1"));
        assert_eq!(parse_host("::1"), ip("::1"));
        assert_eq!(parse_host("[fe80::1%eth0]"), ParsedHost::BadNumeric);
        assert_eq!(parse_host("999.1.1.1"), ParsedHost::BadNumeric);
        assert_eq!(parse_host("foo.123"), ParsedHost::BadNumeric);
        assert_eq!(parse_host("api%2etest"), ParsedHost::Invalid);
        assert_eq!(parse_host("a..b"), ParsedHost::Invalid);
        assert_eq!(parse_host(""), ParsedHost::Invalid);
        assert_eq!(parse_host("user@api.test"), ParsedHost::Invalid);
    }

    #[test]
    fn allowlist_matching() {
        let list = Allowlist::new(&[
            rule("api.test", &[80, 443]),
            rule("*.example.org", &[443]),
            rule("10.9.8.7", &[22]),
        ]);
        assert!(list.permits("api.test", 443));
        assert!(!list.permits("api.test", 8443));
        assert!(!list.permits("sub.api.test", 443));
        assert!(list.permits("a.example.org", 443));
        assert!(list.permits("a.b.example.org", 443));
        assert!(!list.permits("example.org", 443));
        assert!(!list.permits("evilexample.org", 443));
        assert!(!list.permits("a.example.org", 80));
        assert!(list.permits_ip("10.9.8.7".parse().unwrap(), 22));
        assert!(!list.permits_ip("10.9.8.7".parse().unwrap(), 23));
    }
}
