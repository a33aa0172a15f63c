//! Address policy: which destination addresses a cell may never reach.
//!
//! The rule is deny-by-range, applied to *every* address a name resolves to (not just the
//! one we connect to), so a DNS answer that mixes a public and a private address is refused
//! as a whole. Tunnelling forms that embed an IPv4 address inside IPv6 (mapped, compatible,
//! 6to4, NAT64) are judged by the embedded address, because a dual-stack socket or a
//! translator would deliver the packets there.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;

/// Why an address is not a public destination.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AddressClass {
    Unspecified,
    ThisNetwork,
    Loopback,
    Private,
    SharedCgnat,
    UniqueLocal,
    LinkLocal,
    SiteLocal,
    Metadata,
    Multicast,
    Broadcast,
    Documentation,
    Benchmark,
    /// IETF special-purpose or reserved space (240/4, 192.0.0/24, 100::/64, 2001::/23, ...).
    Reserved,
    /// Teredo embeds an obfuscated IPv4 address; no legitimate agent destination uses it.
    Teredo,
    /// Anything outside IPv6 global unicast (2000::/3) not covered above.
    NonGlobalV6,
    /// One of this host's own interface addresses.
    HostOwn,
}

/// Classify an address on its own (no exemptions, no host addresses).
/// `None` means a public unicast address.
pub fn classify(ip: IpAddr) -> Option<AddressClass> {
    match ip {
        IpAddr::V4(v4) => classify_v4(v4),
        IpAddr::V6(v6) => classify_v6(v6),
    }
}

fn classify_v4(ip: Ipv4Addr) -> Option<AddressClass> {
    use AddressClass::*;
    let o = ip.octets();
    let n = u32::from(ip);
    let in_net = |base: [u8; 4], len: u32| -> bool {
        let mask = if len == 0 { 0 } else { u32::MAX << (32 - len) };
        n & mask == u32::from(Ipv4Addr::from(base)) & mask
    };
    // Metadata endpoints first: they sit inside wider ranges but deserve their own class
    // (the service escalates them to `suspected_escape`).
    if ip == Ipv4Addr::new(169, 254, 169, 254) || ip == Ipv4Addr::new(100, 100, 100, 200) {
        return Some(Metadata);
    }
    if ip.is_unspecified() {
        return Some(Unspecified);
    }
    if ip.is_broadcast() {
        return Some(Broadcast);
    }
    let class = if o[0] == 0 {
        ThisNetwork
    } else if o[0] == 127 {
        Loopback
    } else if in_net([10, 0, 0, 0], 8)
        || in_net([172, 16, 0, 0], 12)
        || in_net([192, 168, 0, 0], 16)
    {
        Private
    } else if in_net([100, 64, 0, 0], 10) {
        SharedCgnat
    } else if in_net([169, 254, 0, 0], 16) {
        LinkLocal
    } else if in_net([192, 0, 2, 0], 24)
        || in_net([198, 51, 100, 0], 24)
        || in_net([203, 0, 113, 0], 24)
    {
        Documentation
    } else if in_net([198, 18, 0, 0], 15) {
        Benchmark
    } else if in_net([224, 0, 0, 0], 4) {
        Multicast
    } else if in_net([240, 0, 0, 0], 4)
        || in_net([192, 0, 0, 0], 24)
        || in_net([192, 88, 99, 0], 24)
    {
        Reserved
    } else {
        return None;
    };
    Some(class)
}

/// The IPv4 address embedded in a tunnelling/translation form, if `ip` is one.
pub fn embedded_v4(ip: Ipv6Addr) -> Option<Ipv4Addr> {
    let s = ip.segments();
    let o = ip.octets();
    let tail = Ipv4Addr::new(o[12], o[13], o[14], o[15]);
    // ::ffff:a.b.c.d (mapped)
    if s[..5] == [0, 0, 0, 0, 0] && s[5] == 0xffff {
        return Some(tail);
    }
    // ::a.b.c.d (compatible, deprecated); :: and ::1 are handled by the caller first.
    if s[..6] == [0, 0, 0, 0, 0, 0] {
        return Some(tail);
    }
    // 64:ff9b::/96 (well-known NAT64 prefix)
    if s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
        return Some(tail);
    }
    // 2002:aabb:ccdd::/48 (6to4)
    if s[0] == 0x2002 {
        return Some(Ipv4Addr::new(o[2], o[3], o[4], o[5]));
    }
    None
}

fn classify_v6(ip: Ipv6Addr) -> Option<AddressClass> {
    use AddressClass::*;
    let s = ip.segments();
    if ip.is_unspecified() {
        return Some(Unspecified);
    }
    if ip.is_loopback() {
        return Some(Loopback);
    }
    if ip == Ipv6Addr::new(0xfd00, 0x0ec2, 0, 0, 0, 0, 0, 0x0254) {
        return Some(Metadata);
    }
    if let Some(v4) = embedded_v4(ip) {
        return classify_v4(v4);
    }
    let class = if s[0] == 0x0064 && s[1] == 0xff9b && s[2] == 0x0001 {
        // 64:ff9b:1::/48, local-use NAT64 (RFC 8215): the embedding is site-specific.
        Reserved
    } else if s[0] & 0xfe00 == 0xfc00 {
        UniqueLocal
    } else if s[0] & 0xffc0 == 0xfe80 {
        LinkLocal
    } else if s[0] & 0xffc0 == 0xfec0 {
        SiteLocal
    } else if s[0] & 0xff00 == 0xff00 {
        Multicast
    } else if (s[0] == 0x2001 && s[1] == 0x0db8) || (s[0] == 0x3fff && s[1] < 0x1000) {
        // 2001:db8::/32 and 3fff::/20 (RFC 9637)
        Documentation
    } else if s[0] == 0x2001 && s[1] == 0x0002 && s[2] == 0 {
        Benchmark
    } else if s[0] == 0x2001 && s[1] == 0 {
        Teredo
    } else if (s[0] == 0x2001 && s[1] < 0x0200) || (s[0] == 0x0100 && s[1..4] == [0, 0, 0]) {
        // 2001::/23 IETF protocol assignments; 100::/64 discard-only.
        Reserved
    } else if s[0] & 0xe000 != 0x2000 {
        NonGlobalV6
    } else {
        return None;
    };
    Some(class)
}

/// Everything the address rule needs besides the address itself.
#[derive(Debug, Clone, Default)]
pub struct AddressPolicy {
    /// Operator-trusted ranges that bypass the rule (e.g. a test upstream on 127.0.0.2).
    pub exempt: Vec<IpNet>,
    /// This host's own interface addresses.
    pub host_addresses: Vec<IpAddr>,
}

impl AddressPolicy {
    /// `None` if the cell may connect to `ip`; otherwise why not.
    pub fn check(&self, ip: IpAddr) -> Option<AddressClass> {
        let embedded: Option<IpAddr> = match ip {
            IpAddr::V6(v6) if !v6.is_unspecified() && !v6.is_loopback() => {
                embedded_v4(v6).map(IpAddr::V4)
            }
            _ => None,
        };
        let exempt = |a: IpAddr| self.exempt.iter().any(|net| net.contains(&a));
        if exempt(ip) || embedded.is_some_and(exempt) {
            return None;
        }
        if let Some(class) = classify(ip) {
            return Some(class);
        }
        let own = |a: IpAddr| self.host_addresses.contains(&a);
        if own(ip) || embedded.is_some_and(own) {
            return Some(AddressClass::HostOwn);
        }
        None
    }
}

/// This host's interface addresses, to be refused as destinations.
pub fn host_addresses() -> std::io::Result<Vec<IpAddr>> {
    let mut out: Vec<IpAddr> = if_addrs::get_if_addrs()?
        .into_iter()
        .map(|iface| iface.ip())
        .collect();
    out.sort();
    out.dedup();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::AddressClass::*;
    use super::*;

    #[test]
    fn classifier_table() {
        let cases: &[(&str, Option<AddressClass>)] = &[
            // public
            ("1.1.1.1", None),
            ("93.184.215.14", None),
            ("8.8.8.8", None),
            ("2606:4700::1111", None),
            ("2a00:1450:4001:80b::200e", None),
            // IPv4 specials
            ("0.0.0.0", Some(Unspecified)),
            ("0.1.2.3", Some(ThisNetwork)),
            ("127.0.0.1", Some(Loopback)),
            ("127.255.255.254", Some(Loopback)),
            ("10.0.0.1", Some(Private)),
            ("172.16.0.1", Some(Private)),
            ("172.31.255.255", Some(Private)),
            ("172.32.0.1", None),
            ("192.168.1.1", Some(Private)),
            ("100.64.0.1", Some(SharedCgnat)),
            ("100.127.255.255", Some(SharedCgnat)),
            ("100.128.0.1", None),
            ("100.100.100.200", Some(Metadata)),
            ("169.254.169.254", Some(Metadata)),
            ("169.254.1.1", Some(LinkLocal)),
            ("224.0.0.1", Some(Multicast)),
            ("239.255.255.250", Some(Multicast)),
            ("255.255.255.255", Some(Broadcast)),
            ("240.0.0.1", Some(Reserved)),
            ("192.0.0.8", Some(Reserved)),
            ("192.88.99.1", Some(Reserved)),
            ("192.0.2.1", Some(Documentation)),
            ("198.51.100.7", Some(Documentation)),
            ("203.0.113.9", Some(Documentation)),
            ("198.18.0.1", Some(Benchmark)),
            ("198.19.255.255", Some(Benchmark)),
            ("198.20.0.1", None),
            // IPv6 specials
            ("::", Some(Unspecified)),
            ("::1", Some(Loopback)),
            ("fc00::1", Some(UniqueLocal)),
            ("fd12:3456::1", Some(UniqueLocal)),
            ("fd00:ec2::254", Some(Metadata)),
            ("fe80::1", Some(LinkLocal)),
            ("febf::1", Some(LinkLocal)),
            ("fec0::1", Some(SiteLocal)),
            ("ff02::1", Some(Multicast)),
            ("2001:db8::1", Some(Documentation)),
            ("3fff::1", Some(Documentation)),
            ("3fff:0fff::1", Some(Documentation)),
            ("3fff:1000::1", None),
            ("2001:2::1", Some(Benchmark)),
            ("2001:0:4136:e378::1", Some(Teredo)),
            ("2001:10::1", Some(Reserved)),
            ("100::1", Some(Reserved)),
            ("4000::1", Some(NonGlobalV6)),
            ("1::1", Some(NonGlobalV6)),
            ("::2:1", Some(ThisNetwork)),
            // IPv4-mapped
            ("::ffff:127.0.0.1", Some(Loopback)),
            ("::ffff:10.0.0.1", Some(Private)),
            ("::ffff:169.254.169.254", Some(Metadata)),
            ("::ffff:8.8.8.8", None),
            // IPv4-compatible
            ("::127.0.0.1", Some(Loopback)),
            ("::10.1.2.3", Some(Private)),
            ("::8.8.8.8", None),
            // NAT64 well-known prefix
            ("64:ff9b::7f00:1", Some(Loopback)),
            ("64:ff9b::a9fe:a9fe", Some(Metadata)),
            ("64:ff9b::c0a8:101", Some(Private)),
            ("64:ff9b::808:808", None),
            ("64:ff9b:1::a00:1", Some(Reserved)),
            // 6to4
            ("2002:7f00:1::1", Some(Loopback)),
            ("2002:a00:1::", Some(Private)),
            ("2002:a9fe:a9fe::1", Some(Metadata)),
            ("2002:6440:1::1", Some(SharedCgnat)),
            ("2002:808:808::1", None),
        ];
        for (text, want) in cases {
            let ip: IpAddr = text.parse().unwrap();
            assert_eq!(classify(ip), *want, "classify({text})");
        }
    }

    #[test]
    fn exemptions_and_host_addresses() {
        let policy = AddressPolicy {
            exempt: vec!["127.0.0.2/32".parse().unwrap()],
            host_addresses: vec!["203.0.114.7".parse().unwrap()],
        };
        let check = |s: &str| policy.check(s.parse().unwrap());
        assert_eq!(check("127.0.0.2"), None);
        assert_eq!(check("::ffff:127.0.0.2"), None);
        assert_eq!(check("127.0.0.1"), Some(Loopback));
        assert_eq!(check("203.0.114.7"), Some(HostOwn));
        assert_eq!(check("::ffff:203.0.114.7"), Some(HostOwn));
        assert_eq!(check("2002:cb00:7207::1"), Some(HostOwn));
        assert_eq!(check("203.0.114.8"), None);
    }

    #[test]
    fn host_addresses_include_loopback() {
        let addrs = host_addresses().unwrap();
        assert!(addrs.iter().any(|a| a.is_loopback()), "{addrs:?}");
    }
}
