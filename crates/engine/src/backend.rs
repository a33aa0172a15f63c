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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Engine, EngineConfig};
    use airlock_cell::report::ResultClass;

    fn gvisor_plan() -> CellPlan {
        let mut contract = airlock_contract::default_contract();
        contract.isolation = Isolation::Gvisor;
        let argv = ["/bin/true".to_string()];
        airlock_contract::compile(
            &contract,
            &airlock_contract::CompileInput::new(std::path::Path::new("/"), &argv),
        )
        .unwrap()
    }

    #[test]
    fn the_plans_tier_picks_the_backend() {
        assert_eq!(Backend::of(&gvisor_plan()), Backend::Gvisor);
        let mut native = gvisor_plan();
        native.isolation = Isolation::Native;
        assert_eq!(Backend::of(&native), Backend::NativeCell);
        assert!(Backend::NativeCell.clones_in_caller());
        assert!(!Backend::Gvisor.clones_in_caller());
    }

    /// A gVisor run through `Engine::run` from a threaded caller (this test harness's
    /// thread): supervised by the calling thread, recorded, with its status. Needs root
    /// and runsc (CI has both; elsewhere it says why it did not run).
    #[test]
    fn a_threaded_caller_runs_a_gvisor_plan_through_engine_run() {
        let root = std::fs::read_to_string("/proc/self/status")
            .unwrap_or_default()
            .lines()
            .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(2) == Some("0"));
        if !root {
            assert!(
                std::env::var_os("AIRLOCK_REQUIRE_ROOT_TESTS").is_none(),
                "this test needs root"
            );
            eprintln!("SKIPPED: not root (a gVisor run needs root)");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let engine = Engine::new(EngineConfig::new(
            dir.path().to_path_buf(),
            Default::default(),
        ));
        let recorded = std::sync::Arc::new(std::sync::Mutex::new(None));
        let seen = recorded.clone();
        let finished = engine
            .run(crate::RunRequest {
                plan: gvisor_plan(),
                workload_class: "test".into(),
                credentials: Vec::new(),
                stdin: airlock_cell::PayloadStdin::Null,
                artifacts: None,
                stdout: None,
                stderr: None,
                started: std::time::Instant::now(),
                tenant: None,
                on_recorded: Some(Box::new(move |id| {
                    *seen.lock().unwrap() = Some(id.to_string())
                })),
                caller: None,
            })
            .unwrap_or_else(|refused| panic!("refused: {:?}", refused.report.error));
        let report = engine.complete(finished).unwrap();
        assert_eq!(report.status, ResultClass::Ok, "{:?}", report.error);
        assert!(report.cleanup.ok, "{:?}", report.cleanup.leftovers);
        assert_eq!(
            recorded.lock().unwrap().as_deref(),
            Some(report.run_id.as_str())
        );
        assert_eq!(
            engine.factory_pid(),
            None,
            "the factory clones native cells only"
        );
        assert_eq!(engine.live_cells(), 0, "its unit of capacity is given back");
    }

    /// A gVisor run takes a unit of the engine's `max_cells` as a cloned cell does: with
    /// none free it is refused (`capacity_exceeded`, recorded) before runsc is asked for
    /// anything.
    #[test]
    fn a_gvisor_run_counts_against_the_engines_capacity() {
        let dir = tempfile::tempdir().unwrap();
        let mut config = EngineConfig::new(dir.path().to_path_buf(), Default::default());
        config.max_cells = 0;
        let engine = Engine::new(config);
        let refused = engine
            .run(crate::RunRequest {
                plan: gvisor_plan(),
                workload_class: "test".into(),
                credentials: Vec::new(),
                stdin: airlock_cell::PayloadStdin::Null,
                artifacts: None,
                stdout: None,
                stderr: None,
                started: std::time::Instant::now(),
                tenant: None,
                on_recorded: None,
                caller: None,
            })
            .err()
            .expect("no capacity left: refused");
        assert_eq!(refused.report.status, ResultClass::CapacityExceeded);
        let error = refused.report.error.clone().unwrap_or_default();
        assert!(error.contains("engine.capacity"), "{error}");
        let store = airlock_store::Store::open(dir.path()).unwrap();
        let record = store
            .show_run(&refused.report.run_id)
            .unwrap()
            .expect("its record");
        assert_eq!(record.run.status, "capacity_exceeded", "{:?}", record.run);
        assert_eq!(engine.live_cells(), 0);
    }
}
