//! The seam between the engine and the isolation tiers. One plan (the policy, decided by
//! `compile`), and the backend its tier names turns it into what that backend runs: the
//! native cell (crates/cell: namespaces, seccomp, Landlock, cloned by a single-threaded
//! process) or the gVisor sandbox (crates/cell/src/gvisor: the plan as an OCI bundle,
//! crates/oci, driven through `runsc`). Everything above the engine (the CLI, the service,
//! MCP, the tools) hands the engine a plan and gets one report shape, records and result
//! classes back, whichever tier ran it. A microVM tier would be a third variant here, with
//! its own `run_one_shot` arm (docs/threat-model.md, "Tiers").

use airlock_cell::report::RunReport;
use airlock_cell::RunOptions;
use airlock_contract::{CellPlan, Isolation};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Backend {
    /// The Linux cell on the host kernel.
    NativeCell,
    /// gVisor's `runsc`.
    Gvisor,
}

impl Backend {
    pub(crate) fn of(plan: &CellPlan) -> Backend {
        match plan.isolation {
            Isolation::Native => Backend::NativeCell,
            Isolation::Gvisor => Backend::Gvisor,
        }
    }

    /// Runs `plan.argv` once, supervised by this process, and destroys the sandbox.
    pub(crate) fn run_one_shot(self, plan: &CellPlan, options: RunOptions<'_>) -> RunReport {
        match self {
            Backend::NativeCell => airlock_cell::run_cell(plan, options),
            Backend::Gvisor => airlock_cell::gvisor::run_gvisor(plan, options),
        }
    }

    /// Whether the backend clones a cell itself, which only a single-threaded process may
    /// do (so a threaded caller goes through the cell factory). runsc forks and execs
    /// its own processes: a gVisor run is supervised by any thread.
    pub(crate) fn clones_in_caller(self) -> bool {
        match self {
            Backend::NativeCell => true,
            Backend::Gvisor => false,
        }
    }

    /// Why a parked cell or a session of this backend cannot be served, if it cannot:
    /// the gVisor tier runs one-shot runs only, for now (refused, never run natively).
    pub(crate) fn refuses_serving(self) -> Option<&'static str> {
        match self {
            Backend::NativeCell => None,
            Backend::Gvisor => Some(
                "sandbox_unavailable: gvisor.serving: sessions and warm cells of the gVisor tier are not built; it runs one-shot runs only",
            ),
        }
    }
}
