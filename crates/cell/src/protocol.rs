//! Messages on the SOCK_SEQPACKET pair between the supervisor and the cell's pid 1.
//! One message per packet; the first byte is the kind.

use serde::{Deserialize, Serialize};

/// Supervisor -> cell: user namespace maps written, cgroup joined; go on.
pub const GO: u8 = b'G';
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
}
