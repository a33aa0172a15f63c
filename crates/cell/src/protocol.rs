//! Messages on the SOCK_SEQPACKET pair between the supervisor and the cell's pid 1.
//! One message per packet; the first byte is the kind.

use crate::rootfs::{self, Prepared, PreparedWire};
use serde::{Deserialize, Serialize};
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
/// Cell -> supervisor: the egress listeners, passed as SCM_RIGHTS (HTTP, then SOCKS).
pub const LISTENERS: u8 = b'L';
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
