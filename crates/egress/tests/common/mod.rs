//! Helpers shared by the egress crate's integration tests.
#![allow(dead_code)]

use airlock_egress::DestinationRule;
use std::io::Read;
use std::net::{Ipv4Addr, TcpStream};
use std::time::Duration;

/// The tests' upstream servers listen here (`api.test` resolves to it).
pub const UPSTREAM_IP: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 2);
/// Upper bound for any one read or write of a test, so a hang fails instead of blocking.
pub const IO_TIMEOUT: Duration = Duration::from_secs(5);

pub fn rule(host: &str, ports: &[u16]) -> DestinationRule {
    DestinationRule {
        host_pattern: host.into(),
        ports: ports.to_vec(),
    }
}

/// Everything the peer sends until it closes (or the read times out), as text.
pub fn read_to_end(s: &mut TcpStream) -> String {
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    String::from_utf8_lossy(&out).into_owned()
}
