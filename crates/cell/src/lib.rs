//! airlock-cell: the Linux cell runtime. It applies a [`airlock_contract::CellPlan`]:
//! namespaces, root filesystem, capabilities, Landlock, seccomp, cgroup ceilings, the
//! deadline, output capture, artifact collection and teardown.
//!
//! All `unsafe` code lives in [`sys`].

pub mod artifacts;
pub mod cgroup;
mod default_filter;
pub mod doctor;
mod error;
pub mod host_files;
pub mod host_identity;
mod landlock_policy;
mod launcher;
pub mod output;
mod protocol;
pub mod report;
mod rootfs;
pub mod seccomp;
pub mod stdin_relay;
mod supervisor;
mod sys;
mod syscalls;
mod terminal;

pub use error::CellError;
pub use protocol::EgressListeners;
pub use supervisor::{
    credential_env, run_cell, BeforeStart, EgressSession, EgressSummary, PayloadStdin, RunOptions,
    TERM_GRACE,
};
