use crate::report::ResultClass;
use std::path::PathBuf;

/// Failures of the cell runtime. `class()` maps each to a result class of docs/architecture.md ("Result classes").
#[derive(Debug, thiserror::Error)]
pub enum CellError {
    /// A control the contract needs cannot be enforced on this host.
    #[error("{control} cannot be enforced on this host: {reason}")]
    Unavailable {
        control: &'static str,
        reason: String,
    },
    #[error("cgroup {path}: {source}")]
    Cgroup {
        path: PathBuf,
        source: std::io::Error,
    },
    /// A launcher step inside the new cell failed; `stage` names the step.
    #[error("cell setup failed at {stage}: {message}")]
    Launch { stage: String, message: String },
    #[error("{context}: {source}")]
    Io {
        context: String,
        source: std::io::Error,
    },
    /// The plan's seccomp program is not the filter it names (never a bad profile: those
    /// are refused when the contract is compiled).
    #[error("seccomp: {0}")]
    Seccomp(String),
    #[error("credential {name}: the supervisor variable {from_env} is not set")]
    MissingCredential { name: String, from_env: String },
    #[error(
        "the supervisor has {0} threads; a cell may only be cloned from a single-threaded process"
    )]
    NotSingleThreaded(usize),
    /// The caller's last check before release (the audit record) failed.
    #[error("{0}")]
    Refused(String),
    /// A file airlock writes on the host (an artifact, the result record) could not be
    /// written safely; `destination` is escaped for a terminal (see `host_files::escaped`).
    #[error("cannot write {destination}: {}: {source}", refusal.explain())]
    HostWrite {
        destination: String,
        refusal: crate::host_files::WriteRefusal,
        source: std::io::Error,
    },
    /// A message between the supervisor and the cell, or on a serving cell's control
    /// socket, that is not one of the protocol's (crates/cell/src/protocol.rs,
    /// crates/cell/src/control.rs).
    #[error("protocol: {message}")]
    Protocol { message: String },
    /// A command asked for more than the plan allows: a command's limits may only lower
    /// the plan's.
    #[error("the command asks for {limit} = {asked}, above the plan's {allowed}")]
    AbovePlan {
        limit: &'static str,
        asked: u64,
        allowed: u64,
    },
    /// What a serving cell was asked cannot be done with this plan or in this state.
    #[error("{0}")]
    Unsupported(String),
    /// One of the plan's pod namespaces (network, ipc, uts) cannot be joined as it is
    /// (not a namespace of that type, the host's, unreadable): see pod_network.rs.
    #[error("pod {kind} namespace {}: {rule}", .path.display())]
    PodNamespace {
        kind: &'static str,
        path: PathBuf,
        rule: String,
    },
    /// A container's cgroup (an OCI spec's `linux.cgroupsPath`) that may not be used
    /// (cgroup/container.rs).
    #[error("container cgroup {}: {rule}", .path.display())]
    ContainerCgroup { path: PathBuf, rule: String },
    /// A range of host ids that would reach the host's own users or beyond 2^31 (the CLI
    /// checks the configuration's bounds first; see host_identity.rs).
    #[error("host id range of {count} ids from {base}: {rule}")]
    InvalidHostIdRange {
        base: u32,
        count: u32,
        rule: &'static str,
    },
}

impl CellError {
    pub fn class(&self) -> ResultClass {
        match self {
            CellError::Unavailable { .. } => ResultClass::SandboxUnavailable,
            CellError::MissingCredential { .. }
            | CellError::AbovePlan { .. }
            | CellError::PodNamespace { .. }
            | CellError::ContainerCgroup { .. } => ResultClass::PolicyDenied,
            CellError::Cgroup { .. }
            | CellError::Seccomp(_)
            | CellError::Launch { .. }
            | CellError::Io { .. }
            | CellError::NotSingleThreaded(_)
            | CellError::Refused(_)
            | CellError::Protocol { .. }
            | CellError::Unsupported(_)
            | CellError::InvalidHostIdRange { .. } => ResultClass::RuntimeFault,
            CellError::HostWrite { .. } => ResultClass::DeliveryFailed,
        }
    }

    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> CellError {
        CellError::Io {
            context: context.into(),
            source,
        }
    }
}
