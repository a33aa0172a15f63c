//! airlock-cell: the Linux cell runtime. It applies a [`airlock_contract::CellPlan`]:
//! namespaces, root filesystem, capabilities, Landlock, seccomp, cgroup ceilings, the
//! deadline, output capture, artifact collection and teardown.
//!
//! Two entry points: [`run_cell`] (the CLI's cold path: build a cell, run `plan.argv`,
//! destroy it) and [`serve_cell`] (the engine's: build a cell ahead of its command, park
//! it, run the command the engine sends on its control socket, see [`control`]).
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
pub mod census;
pub mod cgroup;
pub mod control;
mod counters;
pub mod doctor;
mod error;
pub mod evidence;
pub mod exec_door;
pub mod gvisor;
pub mod host_files;
pub mod host_identity;
mod kernel;
mod landlock_policy;
mod launcher;
pub mod output;
pub mod peer;
pub mod pod_network;
mod preflight;
mod privilege;
pub mod process;
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
    credential_env, credential_env_from, run_cell, serve_cell, BeforeStart, EgressSession,
    EgressSummary, PayloadStdin, RunOptions, ServeMode, ServeOptions, PID1_NAME, TERM_GRACE,
};
pub use terminal::CallerTerminal;

/// Ends this process as `signal` would have (its default action), for a caller whose run
/// was interrupted ([`report::RunReport::interrupted_by`]) once its record is complete.
pub fn die_of_signal(signal: libc::c_int) -> ! {
    sys::die_of(signal)
}
