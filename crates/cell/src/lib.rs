//! airlock-cell: the Linux cell runtime. It applies a [`airlock_contract::CellPlan`]:
//! namespaces, root filesystem, capabilities, Landlock, seccomp, cgroup ceilings, the
//! deadline, output capture, artifact collection and teardown.
//!
//! All `unsafe` code lives in [`sys`].

// The seccomp filter checks for AUDIT_ARCH_X86_64 and is keyed on x86-64 syscall numbers,
// `sys` makes raw x86-64 system calls: built for another architecture the cell would
// not be confined as planned, so it does not build at all.
#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
compile_error!(
    "airlock-cell supports only x86-64 Linux: its seccomp filter (AUDIT_ARCH_X86_64, the x86-64 \
     syscall table) and its raw system calls are x86-64's"
);

pub mod artifacts;
pub mod cgroup;
mod counters;
pub mod doctor;
mod error;
pub mod host_files;
mod kernel;
mod landlock_policy;
mod launcher;
pub mod output;
mod protocol;
pub mod report;
mod rootfs;
pub mod seccomp;
mod stage;
pub mod stdin_relay;
mod supervisor;
mod sys;
mod terminal;

pub use error::CellError;
pub use protocol::EgressListeners;
pub use supervisor::{
    credential_env, run_cell, BeforeStart, EgressSession, EgressSummary, PayloadStdin, RunOptions,
    HOST_ID_BASE, TERM_GRACE,
};
