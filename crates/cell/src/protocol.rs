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
    let wire: ListenersWire = serde_json::from_slice(rest).ok()?;
    if kind != LISTENERS || wire != ListenersWire::for_plan(plan) {
        return None;
    }
    let endpoints = plan.network.transparent_endpoints();
    if fds.len() != 3 + endpoints.len() {
        return None;
    }
    let mut fds = fds.into_iter();
    let (http, socks, dns) = (fds.next()?, fds.next()?, fds.next()?);
    if bound_udp(&dns)? != SocketAddr::V4(TRANSPARENT_DNS) {
        return None;
    }
    let mut transparent = Vec::with_capacity(endpoints.len());
    for (endpoint, fd) in endpoints.into_iter().zip(fds) {
        let listener = std::net::TcpListener::from(fd);
        if listener.local_addr().ok()? != SocketAddr::V4(endpoint.address) {
            return None;
        }
        transparent.push((endpoint, OwnedFd::from(listener)));
    }
    Some(EgressListeners {
        http,
        socks,
        dns,
        transparent,
    })
}

/// The local address of a UDP socket; the fd is given back unchanged.
fn bound_udp(fd: &OwnedFd) -> Option<SocketAddr> {
    let socket = std::net::UdpSocket::from(fd.try_clone().ok()?);
    socket.local_addr().ok()
}
