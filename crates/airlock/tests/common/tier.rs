//! The isolation tier a test runs its cells on (issue 21: the boundary, ceiling and
//! artifact suites run against both tiers). [`both_tiers!`](crate::both_tiers) turns one
//! test body into a `native` and a `gvisor` test; the body's runs go through the
//! [`Tier`]'s `run_in`/`run`/`sh`, which add `isolation: gvisor` to the contract on the
//! gVisor tier and check that its sandbox left nothing on the host.
//!
//! A case that cannot apply to one tier says why where it is declared (a comment, or a
//! test that only exists for one tier), never by returning early.

use super::{host, run_in, CellRun};
use serde_json::Value;
use std::path::Path;
use std::sync::{Mutex, MutexGuard};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tier {
    Native,
    Gvisor,
}

/// One gVisor sandbox at a time per test process: a sandbox costs a few hundred
/// milliseconds of two cores, and the ceilings' timings would feel its neighbours.
static GVISOR_SERIAL: Mutex<()> = Mutex::new(());

impl Tier {
    /// The contract as this tier runs it: on gVisor, `isolation: gvisor` first. A contract
    /// written as one flow mapping (`{...}`) cannot take a line before it: a test writes
    /// its contracts in block style (the empty `{}` is the default contract).
    pub fn contract(self, yaml: Option<&str>) -> Option<String> {
        match self {
            Tier::Native => yaml.map(str::to_string),
            Tier::Gvisor => {
                let yaml = yaml.unwrap_or("");
                let body = if yaml.trim() == "{}" { "" } else { yaml };
                assert!(
                    !body.trim_start().starts_with('{'),
                    "a contract for both tiers is written in block style: {yaml}"
                );
                Some(format!("isolation: gvisor\n{body}"))
            }
        }
    }

    /// [`run_in`] on this tier; a gVisor run is checked to have left nothing behind.
    pub fn run_in(self, dir: &Path, yaml: Option<&str>, extra: &[&str], argv: &[&str]) -> CellRun {
        self.run_as_given_in(dir, self.contract(yaml).as_deref(), extra, argv)
    }

    /// [`Tier::run_in`] with the contract as given: the tier comes from elsewhere (a
    /// class's `bounds.isolation`). The run is still checked to have run on this tier.
    pub fn run_as_given_in(
        self,
        dir: &Path,
        contract: Option<&str>,
        extra: &[&str],
        argv: &[&str],
    ) -> CellRun {
        let _one_sandbox = self.serial();
        let run = run_in(dir, contract, extra, argv);
        self.assert_ran_on(&run);
        if self == Tier::Gvisor {
            assert_sandbox_left_nothing(&run);
        }
        run
    }

    /// The run's record says it ran on this tier (a run refused before its plan existed
    /// has none to say): a test of both tiers cannot pass by running twice natively.
    pub fn assert_ran_on(self, run: &CellRun) {
        let isolation = &run.result["plan"]["isolation"];
        if isolation.is_null() {
            return;
        }
        assert_eq!(isolation, self.name(), "{}", run.describe());
    }

    /// The tier as a contract's `isolation` and a record's `plan.isolation` name it.
    pub fn name(self) -> &'static str {
        match self {
            Tier::Native => "native",
            Tier::Gvisor => "gvisor",
        }
    }

    /// [`Tier::run_in`] in a fresh temporary directory.
    pub fn run(self, yaml: Option<&str>, argv: &[&str]) -> CellRun {
        let dir = tempfile::tempdir().unwrap();
        self.run_in(dir.path(), yaml, &[], argv)
    }

    /// `sh -c script` with the default contract on this tier.
    pub fn sh(self, script: &str) -> CellRun {
        self.run(None, &["/bin/sh", "-c", script])
    }

    /// Nothing of the cells of `supervisor` (an `airlock run` that ended, started by a
    /// test without [`host::run_supervisor`]: a pty driver's) is left: its cgroups, and
    /// on gVisor everything of its sandbox (see [`assert_left_nothing_of`]).
    pub fn assert_left_nothing(self, supervisor: host::Supervisor, result: &Value, describe: &str) {
        match self {
            Tier::Native => {
                let cgroups = host::cgroups_of(&supervisor);
                assert!(cgroups.is_empty(), "cgroups left: {cgroups:?}\n{describe}");
            }
            Tier::Gvisor => assert_left_nothing_of(supervisor, result, describe),
        }
    }

    /// One gVisor sandbox at a time in this test process (see [`GVISOR_SERIAL`]).
    pub fn serial(self) -> Option<MutexGuard<'static, ()>> {
        (self == Tier::Gvisor).then(|| GVISOR_SERIAL.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

/// Nothing of a gVisor run's sandbox is left on the host: its cgroups (every hierarchy,
/// runsc makes some airlock does not use), its directory under /run/airlock-gvisor, a
/// mount there, a process naming it (runsc's sandbox and gofer carry `--root=<its dir>`).
pub fn assert_sandbox_left_nothing(run: &CellRun) {
    let supervisor = run.supervisor.expect("started by run_supervisor");
    assert_left_nothing_of(supervisor, &run.result, &run.describe());
}

/// [`assert_sandbox_left_nothing`] for `supervisor`'s run, whose result is `result`.
pub fn assert_left_nothing_of(supervisor: host::Supervisor, result: &Value, describe: &str) {
    assert_sandboxes_of_left_nothing(&supervisor, describe);
    // A run refused before it wrote a result (a contract error) has no cleanup to report.
    if !result.is_null() {
        assert_eq!(result["cleanup"]["ok"], true, "{describe}");
    }
}

/// Nothing is left on the host of the gVisor sandboxes `supervisor` (an `airlock run`, or
/// an `airlock serve` whose runs have all ended) made; `context` goes into the message.
pub fn assert_sandboxes_of_left_nothing(supervisor: &host::Supervisor, context: &str) {
    let prefix = format!("{}-{}-", supervisor.pid, supervisor.start_time);
    let cgroups = host::cgroups_of(supervisor);
    assert!(cgroups.is_empty(), "cgroups left: {cgroups:?}\n{context}");
    let dirs: Vec<_> = std::fs::read_dir("/run/airlock-gvisor")
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with(&prefix))
                .collect()
        })
        .unwrap_or_default();
    assert!(dirs.is_empty(), "cell directories left: {dirs:?}");
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let left: Vec<&str> = mounts
        .lines()
        .filter(|l| l.contains(&format!("/run/airlock-gvisor/{prefix}")))
        .collect();
    assert!(left.is_empty(), "mounts left: {left:?}");
    let procs = host::processes_with(&format!("/run/airlock-gvisor/{prefix}"));
    assert!(procs.is_empty(), "runsc processes left: {procs:?}");
}

/// `both_tiers! { fn name(tier) { body } }`: a module `name` with the tests `native` and
/// `gvisor`, each running `body` with `tier` bound to its [`Tier`]. Attributes before
/// `fn` (`#[ignore]`, docs) go on both.
///
/// `both_tiers! { gvisor_gap("why") fn name(tier) { body } }`: the same, with the gVisor
/// test `#[ignore]`d for a known gap of the tier, named in `why` (cargo lists it as
/// ignored with that reason; `--ignored` runs it and shows the gap failing).
#[macro_export]
macro_rules! both_tiers {
    (gvisor_gap($why:literal) $(#[$attr:meta])* fn $name:ident($tier:ident) $body:block) => {
        $crate::both_tiers!(@tiers [$(#[$attr])*] [#[ignore = $why]] $name $tier $body);
    };
    ($(#[$attr:meta])* fn $name:ident($tier:ident) $body:block) => {
        $crate::both_tiers!(@tiers [$(#[$attr])*] [] $name $tier $body);
    };
    (@tiers [$($attr:tt)*] [$($gap:tt)*] $name:ident $tier:ident $body:block) => {
        mod $name {
            #[allow(unused_imports)]
            use super::*;

            $($attr)*
            #[test]
            fn native() {
                let $tier = $crate::common::tier::Tier::Native;
                $body
            }

            $($attr)*
            #[test]
            $($gap)*
            fn gvisor() {
                let $tier = $crate::common::tier::Tier::Gvisor;
                $body
            }
        }
    };
}
