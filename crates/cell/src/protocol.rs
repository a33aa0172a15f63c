//! Messages on the SOCK_SEQPACKET pair between the supervisor and the cell's pid 1.
//! One message per packet; the first byte is the kind.

use crate::rootfs::{self, Prepared, PreparedWire};
use airlock_contract::{CellPlan, TransparentEndpoint, MAX_TRANSPARENT_LISTENERS, TRANSPARENT_DNS};
use serde::{Deserialize, Serialize};
use std::net::{SocketAddr, SocketAddrV4};
use std::os::fd::OwnedFd;

/// `[MAPPED][device nodes: JSON]`, the device trees as SCM_RIGHTS.
pub fn encode_mapped(devices: Vec<Prepared>) -> (Vec<u8>, Vec<OwnedFd>) {
    let (wire, fds) = rootfs::to_wire(devices);
    let mut message = vec![MAPPED];
    message.extend_from_slice(&serde_json::to_vec(&wire).unwrap_or_default());
    (message, fds)
}

/// The inverse of [`encode_mapped`]; `None` for a malformed message.
pub fn decode_mapped(message: &[u8]) -> Option<Vec<PreparedWire>> {
    let (&kind, rest) = message.split_first()?;
    if kind != MAPPED {
        return None;
    }
    serde_json::from_slice(rest).ok()
}

/// `[GO][program length: u32 LE][program: 8 bytes per instruction][mounts: JSON]`
pub fn encode_release(
    program: &[libc::sock_filter],
    mounts: Vec<Prepared>,
) -> (Vec<u8>, Vec<OwnedFd>) {
    let (wire, fds) = rootfs::to_wire(mounts);
    let mut message = vec![GO];
    message.extend_from_slice(&(program.len() as u32).to_le_bytes());
    for insn in program {
        message.extend_from_slice(&insn.code.to_le_bytes());
        message.extend_from_slice(&[insn.jt, insn.jf]);
        message.extend_from_slice(&insn.k.to_le_bytes());
    }
    message.extend_from_slice(&serde_json::to_vec(&wire).unwrap_or_default());
    (message, fds)
}

/// The inverse of [`encode_release`]; `None` for a malformed message.
pub fn decode_release(message: &[u8]) -> Option<(Vec<libc::sock_filter>, Vec<PreparedWire>)> {
    let (&kind, rest) = message.split_first()?;
    if kind != GO || rest.len() < 4 {
        return None;
    }
    let count = u32::from_le_bytes(rest[..4].try_into().ok()?) as usize;
    let program_bytes = rest.get(4..4 + count * 8)?;
    let program = program_bytes
        .chunks_exact(8)
        .map(|c| libc::sock_filter {
            code: u16::from_le_bytes([c[0], c[1]]),
            jt: c[2],
            jf: c[3],
            k: u32::from_le_bytes([c[4], c[5], c[6], c[7]]),
        })
        .collect();
    let wire = serde_json::from_slice(&rest[4 + count * 8..]).ok()?;
    Some((program, wire))
}

/// Supervisor -> cell: the user namespace maps are written; the cell may build the parts
/// of its root it creates itself. The message carries the device nodes.
pub const MAPPED: u8 = b'M';
/// Supervisor -> cell: cgroup joined; finish the setup (root, privileges, Landlock,
/// seccomp). The message carries the seccomp program and the mount plan, the mount trees
/// as SCM_RIGHTS.
pub const GO: u8 = b'G';
/// Supervisor -> cell: the audit record exists; start the payload.
pub const START: u8 = b'S';
/// Most descriptors one release message may carry.
pub const MAX_RELEASE_FDS: usize = 250;
/// Supervisor -> cell: artifacts collected; pid 1 may exit.
pub const COLLECTED: u8 = b'D';
/// Cell -> supervisor: a setup step failed (body: [`LaunchFailure`] as JSON).
pub const FAILED: u8 = b'E';
/// Cell -> supervisor: the egress listeners (body: [`ListenersWire`] as JSON), passed as
/// SCM_RIGHTS: HTTP, SOCKS, then the resolver's and the transparent sockets it names.
pub const LISTENERS: u8 = b'L';
/// Cell -> supervisor: the master of the payload's terminal (SCM_RIGHTS), for a plan
/// with a terminal; sent before the payload can start.
pub const TERMINAL: u8 = b'T';
/// Most descriptors one LISTENERS message may carry.
pub const MAX_LISTENER_FDS: usize = 3 + MAX_TRANSPARENT_LISTENERS;
/// Cell -> supervisor: the payload ended (body: [`PayloadEnded`] as JSON).
pub const ENDED: u8 = b'X';

#[derive(Debug, Serialize, Deserialize)]
pub struct LaunchFailure {
    pub stage: String,
    pub message: String,
    /// The step failed because the kernel lacks a feature (maps to `sandbox_unavailable`).
    pub unavailable: bool,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct PayloadEnded {
    /// Raw wait status of the payload process.
    pub wait_status: i32,
    /// Writable mounts that had no free space or inodes left when the payload ended.
    pub full_mounts: Vec<String>,
    /// `/dev/shm` had no free space or inodes left when the payload ended.
    #[serde(default)]
    pub shm_full: bool,
}

/// What a LISTENERS message carries after the two proxy listeners, in the order of its
/// descriptors: the resolver's socket, then one listener per transparent endpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListenersWire {
    pub dns: SocketAddrV4,
    pub transparent: Vec<SocketAddrV4>,
}

impl ListenersWire {
    /// The sockets `plan` asks for (the launcher binds exactly these).
    pub fn for_plan(plan: &CellPlan) -> ListenersWire {
        ListenersWire {
            dns: TRANSPARENT_DNS,
            transparent: plan
                .network
                .transparent_endpoints()
                .into_iter()
                .map(|e| e.address)
                .collect(),
        }
    }
}

/// The egress sockets of an allowlisted cell, as the supervisor hands them to the proxy.
#[derive(Debug)]
pub struct EgressListeners {
    pub http: OwnedFd,
    pub socks: OwnedFd,
    /// UDP, bound on [`TRANSPARENT_DNS`].
    pub dns: OwnedFd,
    /// Each bound on its endpoint's address.
    pub transparent: Vec<(TransparentEndpoint, OwnedFd)>,
}

/// `[LISTENERS][ListenersWire: JSON]`.
pub fn encode_listeners(wire: &ListenersWire) -> Vec<u8> {
    let mut message = vec![LISTENERS];
    message.extend_from_slice(&serde_json::to_vec(wire).unwrap_or_default());
    message
}

/// The inverse of [`encode_listeners`], checked against the plan: the sockets must be
/// exactly the ones the plan asks for, each bound where the plan says, so that no
/// listener is ever served as another name's. `None` for anything else.
pub fn decode_listeners(
    message: &[u8],
    fds: Vec<OwnedFd>,
    plan: &CellPlan,
) -> Option<EgressListeners> {
    let (&kind, rest) = message.split_first()?;
    let announced: ListenersWire = serde_json::from_slice(rest).ok()?;
    let expected = ListenersWire::for_plan(plan);
    if kind != LISTENERS || fds.len() != 3 + expected.transparent.len() {
        return None;
    }
    let mut fds = fds.into_iter();
    let (http, socks, dns) = (fds.next()?, fds.next()?, fds.next()?);
    let transparent: Vec<OwnedFd> = fds.collect();
    let bound = ListenersWire {
        dns: v4(bound_udp(&dns)?)?,
        transparent: transparent
            .iter()
            .map(|fd| v4(bound_tcp(fd)?))
            .collect::<Option<_>>()?,
    };
    if !matches_plan(&expected, &announced, &bound) {
        return None;
    }
    Some(EgressListeners {
        http,
        socks,
        dns,
        transparent: plan
            .network
            .transparent_endpoints()
            .into_iter()
            .zip(transparent)
            .collect(),
    })
}

/// What the cell announced and what its sockets are really bound to must both be what
/// the plan asks for, in the plan's order.
fn matches_plan(
    expected: &ListenersWire,
    announced: &ListenersWire,
    bound: &ListenersWire,
) -> bool {
    announced == expected && bound == expected
}

fn v4(addr: SocketAddr) -> Option<SocketAddrV4> {
    match addr {
        SocketAddr::V4(v4) => Some(v4),
        SocketAddr::V6(_) => None,
    }
}

/// The local address of a UDP socket; the fd itself is left as it is.
fn bound_udp(fd: &OwnedFd) -> Option<SocketAddr> {
    std::net::UdpSocket::from(fd.try_clone().ok()?)
        .local_addr()
        .ok()
}

/// The local address of a TCP listener; the fd itself is left as it is.
fn bound_tcp(fd: &OwnedFd) -> Option<SocketAddr> {
    std::net::TcpListener::from(fd.try_clone().ok()?)
        .local_addr()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wire(dns: &str, transparent: &[&str]) -> ListenersWire {
        ListenersWire {
            dns: dns.parse().unwrap(),
            transparent: transparent.iter().map(|a| a.parse().unwrap()).collect(),
        }
    }

    #[test]
    fn listeners_bound_where_the_plan_says_are_accepted() {
        let plan = wire("127.0.0.53:53", &["127.100.0.1:443", "127.100.0.2:22"]);
        assert!(matches_plan(&plan, &plan.clone(), &plan.clone()));
    }

    #[test]
    fn a_listener_bound_elsewhere_or_out_of_order_is_refused() {
        let plan = wire("127.0.0.53:53", &["127.100.0.1:443", "127.100.0.2:22"]);
        for bound in [
            wire("127.0.0.53:53", &["127.100.0.2:22", "127.100.0.1:443"]),
            wire("127.0.0.53:53", &["127.100.0.1:443", "127.100.0.1:22"]),
            wire("127.0.0.1:53", &["127.100.0.1:443", "127.100.0.2:22"]),
            wire("127.0.0.53:53", &["127.100.0.1:443"]),
        ] {
            assert!(!matches_plan(&plan, &plan, &bound), "{bound:?}");
            assert!(!matches_plan(&plan, &bound, &plan), "{bound:?}");
        }
    }

    #[test]
    fn sockets_not_bound_where_the_plan_says_are_refused() {
        let network = airlock_contract::NetworkPlan::Allowlist {
            destinations: vec![airlock_contract::DestinationRule {
                host_pattern: "api.test".into(),
                ports: vec![8443],
            }],
        };
        let mut plan = test_plan();
        plan.network = network;
        let message = encode_listeners(&ListenersWire::for_plan(&plan));
        let tcp = || OwnedFd::from(std::net::TcpListener::bind("127.0.0.1:0").unwrap());
        let udp = OwnedFd::from(std::net::UdpSocket::bind("127.0.0.1:0").unwrap());
        // The right message, but the sockets are bound on other addresses.
        assert!(decode_listeners(&message, vec![tcp(), tcp(), udp, tcp()], &plan).is_none());
        // Too few descriptors.
        assert!(decode_listeners(&message, vec![tcp(), tcp()], &plan).is_none());
        // Another message kind.
        let mut other = message.clone();
        other[0] = GO;
        assert!(decode_listeners(&other, Vec::new(), &plan).is_none());
    }

    fn test_plan() -> CellPlan {
        let contract = airlock_contract::default_contract();
        airlock_contract::compile(
            &contract,
            &airlock_contract::CompileInput {
                base_dir: std::path::Path::new("/"),
                argv: &["true".to_string()],
                seccomp_profile: None,
            },
        )
        .unwrap()
    }
}
