//! `airlock verify`: the seed's negative suite and boundary exercise against a contract,
//! class or image, on this host. Every check is an `airlock run` of this same binary (so
//! through the service when one listens and the run can be handed off, exactly as a real
//! run of that contract would go), whose payload (verify/probe.py) tries the forbidden
//! thing, while this process watches what it planted (verify/plant.rs). The verdicts are
//! pure functions of what was seen (verify/checks.rs); docs/verify.md says what each check
//! proves.

mod checks;
mod derive;
mod output;
mod plant;
mod schedule;

pub use schedule::Schedule;

use crate::config::OperatorConfig;
use airlock_cell::report::RunReport;
use airlock_contract::{default_contract, load_contract_file, Contract, Resources};
use anyhow::Context;
use checks::{Check, Observation, ProbeOutput, StoredRun, Verdict};
use clap::Args;
use plant::Plants;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::Instant;

const PROBE: &str = include_str!("probe.py");
/// A name no resolver knows: `.test` is reserved (RFC 2606), and nothing in airlock maps
/// it unless an operator configuration does.
pub const UNAPPROVED_NAME: &str = "unapproved.verify.airlock.test";
/// The name the private-address check asks the proxy for, besides the address literals.
pub const PRIVATE_NAME: &str = "private.verify.airlock.test";

#[derive(Args)]
pub struct VerifyArgs {
    /// The contract to verify (YAML, TOML or JSON); default: the default contract.
    #[arg(long, short = 'c', conflicts_with = "class")]
    contract: Option<PathBuf>,
    /// Verify a workload class of the configuration (its template; its `smoke` command).
    #[arg(long)]
    class: Option<String>,
    /// Verify with this OCI image as the cell's root (replaces the contract's `image`).
    #[arg(long)]
    image: Option<String>,
    /// Operator configuration, passed to every run (a run with it stays in this process).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Directory of the audit store, passed to every run.
    #[arg(long)]
    state_dir: Option<PathBuf>,
    /// Print the result as JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// Write the result as JUnit XML to this file.
    #[arg(long)]
    junit: Option<PathBuf>,
    /// The permitted path: a shell command that must succeed under the same contract.
    #[arg(long)]
    smoke: Option<String>,
    /// Run every cell in this process even when an airlock service is listening.
    #[arg(long)]
    local: bool,
    /// Where to plant the markers and the fake socket (must not exist; removed at the
    /// end). Default: a fresh directory under $TMPDIR.
    #[arg(long)]
    plant_dir: Option<PathBuf>,
    /// Port of the fake internal endpoint on 127.0.0.1 (0: any free port).
    #[arg(long, default_value_t = 0)]
    endpoint_port: u16,
}

/// What is verified: the contract, where its relative paths point, and how a run names it.
struct Target {
    contract: Contract,
    base_dir: PathBuf,
    /// The user's contract file, run as it is when nothing overrides it.
    file: Option<PathBuf>,
    class: Option<String>,
    /// The permitted path's command (argv).
    smoke: Option<Vec<String>>,
}

impl Target {
    fn describe(&self) -> String {
        let what = match (&self.class, &self.file) {
            (Some(class), _) => format!("class {class}"),
            (None, Some(file)) => format!("contract {}", file.display()),
            (None, None) => "the default contract".to_string(),
        };
        format!("{what}, image {}", self.contract.image)
    }
}

pub fn verify(args: VerifyArgs) -> ExitCode {
    match verify_all(&args) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(err) => {
            eprintln!("airlock: verify: {}", crate::user_message(&err));
            ExitCode::from(125)
        }
    }
}

fn verify_all(args: &VerifyArgs) -> anyhow::Result<bool> {
    let started = Instant::now();
    let config = OperatorConfig::load(args.config.as_deref())?;
    let target = target(args, &config)?;
    let dir = match &args.plant_dir {
        Some(dir) => dir.clone(),
        None => std::env::temp_dir().join(format!("airlock-verify-{}", plant::random_hex(8)?)),
    };
    let plants = Plants::plant(&dir, args.endpoint_port)?;
    let work = plants.dir.join("work");
    std::fs::create_dir(&work)?;
    let mut runner = Runner {
        args,
        service: service_listening(args),
        target: &target,
        state_dir: config.state_dir(args.state_dir.as_deref()),
        store: config.store_location(args.state_dir.as_deref())?,
        work,
        plants,
        count: 0,
    };
    let planted = runner.plants.describe();
    let results: Vec<output::CheckResult> = checks::ALL
        .iter()
        .map(|check| runner.check(*check))
        .collect();
    drop(runner);
    let summary = output::Summary {
        verified: target.describe(),
        planted,
        contract_sha256: airlock_contract::contract_sha256(&target.contract),
        image: target.contract.image.clone(),
        class: target.class.clone(),
        checks: results,
        duration_ms: started.elapsed().as_millis() as u64,
    };
    output::print(&summary, args.json);
    if let Some(path) = &args.junit {
        std::fs::write(path, output::junit(&summary))
            .with_context(|| format!("writing {}", path.display()))?;
    }
    output::record(&config.store_location(args.state_dir.as_deref())?, &summary)?;
    Ok(summary.passed())
}

fn target(args: &VerifyArgs, config: &OperatorConfig) -> anyhow::Result<Target> {
    let mut target = match (&args.class, &args.contract) {
        (Some(name), _) => {
            let classes = crate::class::load_classes(config, args.config.as_deref())?;
            let loaded = classes
                .get(name)
                .with_context(|| format!("no workload class {name} in the configuration"))?;
            Target {
                contract: loaded.class.template.clone(),
                base_dir: loaded.base_dir.clone(),
                file: None,
                class: Some(name.clone()),
                smoke: loaded.class.smoke.clone(),
            }
        }
        (None, Some(path)) => {
            let absolute = std::path::absolute(path)?;
            Target {
                contract: load_contract_file(path)?,
                base_dir: absolute.parent().map(Path::to_path_buf).unwrap_or_default(),
                file: Some(path.clone()),
                class: None,
                smoke: None,
            }
        }
        (None, None) => Target {
            contract: default_contract(),
            base_dir: crate::current_dir(),
            file: None,
            class: None,
            smoke: None,
        },
    };
    if let Some(image) = &args.image {
        target.contract.image = image.clone();
    }
    if let Some(command) = &args.smoke {
        target.smoke = Some(vec!["/bin/sh".into(), "-c".into(), command.clone()]);
    }
    Ok(target)
}

/// What a check saw, and its runs.
type Observed = (Observation, Vec<RunSeen>);

/// How a check's run names its contract.
enum ContractArg {
    /// The contract under test, as a real run of it would name it.
    AsIs,
    /// A contract derived from it (verify/derive.rs).
    Derived(Box<Contract>),
}

/// One `airlock run` of a check, as it ended.
struct RunOutcome {
    exit_code: i32,
    stdout: String,
    stderr: String,
    report: Option<RunReport>,
    result_text: String,
    via_service: bool,
    supervisor_pid: u32,
}

impl RunOutcome {
    fn observation(&self) -> Observation {
        Observation {
            report: self.report.clone(),
            exit_code: self.exit_code,
            probe: ProbeOutput::parse(&self.stdout),
            ..Observation::default()
        }
    }

    /// Which of this run's outputs hold `secret`.
    fn holding(&self, secret: &str) -> Vec<String> {
        let places = [
            ("stdout", &self.stdout),
            ("stderr", &self.stderr),
            ("result file", &self.result_text),
        ];
        places
            .iter()
            .filter(|(_, text)| text.contains(secret))
            .map(|(place, _)| place.to_string())
            .collect()
    }

    fn run_id(&self) -> Option<String> {
        self.report.as_ref().map(|r| r.run_id.clone())
    }
}

struct Runner<'a> {
    args: &'a VerifyArgs,
    /// An airlock service listens and the runs may be handed to it: `--state-dir` then
    /// goes only to the runs that stay here (the service records in its own store, which
    /// must be the one given for the boundary exercise to find its run).
    service: bool,
    target: &'a Target,
    state_dir: PathBuf,
    /// Where the checks' runs are recorded (the fleet's store with `[store] url`).
    store: airlock_store::StoreLocation,
    work: PathBuf,
    plants: Plants,
    count: u32,
}

impl Runner<'_> {
    fn check(&mut self, check: Check) -> output::CheckResult {
        let (seen, runs) = match self.observe(check) {
            Ok(observed) => observed,
            Err(err) => {
                let seen = Observation {
                    not_applicable: None,
                    ..Observation::default()
                };
                let why = format!("the check could not run: {}", crate::user_message(&err));
                return output::CheckResult::new(check, (Verdict::Fail, why), &seen, &[]);
            }
        };
        let outcome = checks::verdict(check, &seen);
        output::CheckResult::new(check, outcome, &seen, &runs)
    }

    /// The check's runs and what the host saw of them.
    fn observe(&mut self, check: Check) -> anyhow::Result<Observed> {
        match check {
            Check::UnmountedRead => self.unmounted_read(),
            Check::WriteOutside => self.write_outside(),
            Check::UnapprovedDomain => self.egress("egress-name", UNAPPROVED_NAME),
            Check::PrivateAddress => self.egress("egress-private", PRIVATE_NAME),
            Check::HostProcesses => self.host_processes(),
            Check::RuntimeSocket => self.runtime_socket(),
            Check::ProcessCeiling => {
                let derived = derive::with_processes(&self.target.contract);
                let (declared, used) = self.values(&derived, |r| r.process_limit);
                let beyond = (used + 4).to_string();
                let value = format!("process_limit {declared} declared, {used} verified");
                self.ceiling(derived, &["processes-beyond", &beyond], value)
            }
            Check::MemoryCeiling => {
                let derived = derive::with_memory(&self.target.contract);
                let (declared, used) = self.values(&derived, |r| r.memory_mb);
                let beyond = (used + 64).to_string();
                let value = format!("memory_mb {declared} declared, {used} verified");
                self.ceiling(derived, &["memory", &beyond], value)
            }
            Check::DiskCeiling => self.disk(),
            Check::OutputCeiling => {
                let derived = derive::with_output(&self.target.contract);
                let (declared, used) = self.values(&derived, |r| r.output_bytes);
                let beyond = (used + (128 << 10)).to_string();
                let value = format!("output_bytes {declared} declared, {used} verified");
                self.ceiling(derived, &["flood", &beyond], value)
            }
            Check::WallTimeCeiling => {
                let derived = derive::with_wall_time(&self.target.contract);
                let (declared, used) = self.values(&derived, |r| r.wall_time_seconds);
                let value = format!("wall_time_seconds {declared} declared, {used} verified");
                self.ceiling(derived, &["sleep", "30"], value)
            }
            Check::Residue => self.residue(),
            Check::UndeclaredArtifact => self.undeclared_artifact(),
            Check::CredentialRetained => self.credential(),
            Check::BoundaryExercise => self.exercise(),
            Check::PermittedPath => self.smoke(),
        }
    }

    /// A resource of the contract under test, and of the derived contract.
    fn values(&self, derived: &Contract, of: fn(&Resources) -> i64) -> (i64, i64) {
        (of(&self.target.contract.resources), of(&derived.resources))
    }

    fn ceiling(
        &mut self,
        derived: Contract,
        probe: &[&str],
        value: String,
    ) -> anyhow::Result<Observed> {
        let run = self.probe(ContractArg::Derived(Box::new(derived)), probe, &[])?;
        let mut seen = run.observation();
        seen.ceiling_value = Some(value);
        Ok((seen, vec![RunSeen::of(&run)]))
    }

    fn unmounted_read(&mut self) -> anyhow::Result<Observed> {
        let paths = self.exposed(&self.plants.marker);
        let mut argv = vec!["read"];
        argv.extend(paths.iter().map(String::as_str));
        let run = self.probe(ContractArg::AsIs, &argv, &[])?;
        let mut seen = run.observation();
        seen.secret_found_in = run.holding(&self.plants.marker_content);
        Ok((seen, vec![RunSeen::of(&run)]))
    }

    /// `mode` of the probe against `name` and the endpoint's port.
    fn egress(&mut self, mode: &str, name: &str) -> anyhow::Result<Observed> {
        let port = self.plants.endpoint_port.to_string();
        let argv = match mode {
            "egress-name" => [mode, name, &port],
            _ => [mode, &port, name],
        };
        let run = self.probe(ContractArg::AsIs, &argv, &[])?;
        let (seen, run) = self.endpoint_seen(run);
        Ok((seen, vec![RunSeen::of(&run)]))
    }

    fn runtime_socket(&mut self) -> anyhow::Result<Observed> {
        let paths = self.exposed(&self.plants.socket);
        let mut argv = vec!["socket"];
        argv.extend(paths.iter().map(String::as_str));
        let run = self.probe(ContractArg::AsIs, &argv, &[])?;
        let mut seen = run.observation();
        seen.socket_accepts = self.plants.socket_accepts();
        Ok((seen, vec![RunSeen::of(&run)]))
    }

    /// The host path of a planted file, and every cell path the contract mounts it at.
    fn exposed(&self, host_path: &Path) -> Vec<String> {
        let mut paths = vec![host_path.to_string_lossy().into_owned()];
        let target = self.target;
        paths.extend(derive::exposed_at(
            &target.contract,
            &target.base_dir,
            host_path,
        ));
        paths
    }

    fn endpoint_seen(&self, run: RunOutcome) -> (Observation, RunOutcome) {
        let mut seen = run.observation();
        seen.endpoint_connections = self.plants.endpoint_connections();
        (seen, run)
    }

    fn write_outside(&mut self) -> anyhow::Result<Observed> {
        let name = format!("airlock-verify-{}", plant::random_hex(6)?);
        let host_target = self.plants.write_target.join(&name);
        let target = self.target;
        let mut targets = derive::write_targets(&target.contract, &name);
        targets.push(host_target.to_string_lossy().into_owned());
        let mut argv = vec!["write"];
        argv.extend(targets.iter().map(String::as_str));
        let run = self.probe(ContractArg::AsIs, &argv, &[])?;
        let mut seen = run.observation();
        if host_target.exists() {
            seen.secret_found_in.push(host_target.display().to_string());
        }
        Ok((seen, vec![RunSeen::of(&run)]))
    }

    fn host_processes(&mut self) -> anyhow::Result<Observed> {
        let reversed: String = self.plants.process_marker.chars().rev().collect();
        let ns = |kind: &str| -> anyhow::Result<String> {
            let link = std::fs::read_link(format!("/proc/self/ns/{kind}"))?;
            Ok(link.to_string_lossy().into_owned())
        };
        let (pidns, netns) = (ns("pid")?, ns("net")?);
        let pid = self.plants.marker_pid().to_string();
        let run = self.probe(
            ContractArg::AsIs,
            &["processes", &reversed, &pid, &pidns, &netns],
            &[],
        )?;
        let mut seen = run.observation();
        seen.marker_alive = self.plants.marker_alive();
        Ok((seen, vec![RunSeen::of(&run)]))
    }

    fn disk(&mut self) -> anyhow::Result<Observed> {
        let Some(derived) = derive::with_disk(&self.target.contract) else {
            return Ok((not_applicable("the contract has no writable path"), vec![]));
        };
        let first = derive::writable_dirs(&derived).remove(0);
        let value = format!("{first} filled, at most {} MiB", derive::DISK_MB);
        self.ceiling(derived, &["fill", &first], value)
    }

    fn residue(&mut self) -> anyhow::Result<Observed> {
        let mut dirs = derive::writable_dirs(&self.target.contract);
        dirs.push("/dev/shm".to_string());
        let name = format!("airlock-verify-residue-{}", plant::random_hex(6)?);
        let mut argv = vec!["plant", name.as_str()];
        argv.extend(dirs.iter().map(String::as_str));
        let first = self.probe(ContractArg::AsIs, &argv, &[])?;
        let planted = ProbeOutput::parse(&first.stdout);
        if !planted.lines.iter().any(checks::ProbeLine::reached) {
            let mut seen = first.observation();
            seen.probe.done = false;
            return Ok((seen, vec![RunSeen::of(&first)]));
        }
        argv[0] = "find";
        let second = self.probe(ContractArg::AsIs, &argv, &[])?;
        Ok((
            second.observation(),
            vec![RunSeen::of(&first), RunSeen::of(&second)],
        ))
    }

    fn undeclared_artifact(&mut self) -> anyhow::Result<Observed> {
        let dirs = derive::writable_dirs(&self.target.contract);
        if dirs.is_empty() {
            return Ok((not_applicable("the contract has no writable path"), vec![]));
        }
        let name = format!("airlock-verify-undeclared-{}", plant::random_hex(6)?);
        let out = self.work.join(format!("out-{}", self.count));
        let mut argv = vec!["plant", name.as_str()];
        argv.extend(dirs.iter().map(String::as_str));
        let extra = [
            "--output-dir".to_string(),
            out.to_string_lossy().into_owned(),
        ];
        let run = self.invoke(ContractArg::AsIs, &extra, &probe_argv(&argv), &[], false)?;
        let mut seen = run.observation();
        seen.exported = files_named(&out, &name);
        Ok((seen, vec![RunSeen::of(&run)]))
    }

    fn credential(&mut self) -> anyhow::Result<Observed> {
        let value = format!("airlock-verify-credential-{}", plant::random_hex(16)?);
        let derived = derive::with_credential(&self.target.contract);
        let env = [(derive::CREDENTIAL_ENV.to_string(), value.clone())];
        let argv = probe_argv(&["credential", derive::CREDENTIAL_ENV]);
        // The value comes from this process's environment: a hand-off carries it to the
        // service, whose store (this one) is then searched like a local run's.
        let run = self.invoke(
            ContractArg::Derived(Box::new(derived)),
            &[],
            &argv,
            &env,
            false,
        )?;
        let mut seen = run.observation();
        seen.secret_found_in = (run.holding(&value).into_iter())
            .filter(|place| place == "result file")
            .collect();
        if let Some(run_id) = run.run_id() {
            if stored_text(&self.store, &run_id)?.contains(&value) {
                seen.secret_found_in.push("the store's record".to_string());
            }
        }
        if store_files_hold(&self.state_dir, &value) {
            seen.secret_found_in.push("the store's files".to_string());
        }
        Ok((seen, vec![RunSeen::of(&run)]))
    }

    fn exercise(&mut self) -> anyhow::Result<Observed> {
        let port = self.plants.endpoint_port.to_string();
        let paths = self.exposed(&self.plants.exercise_marker);
        let mut argv = vec!["exercise", port.as_str()];
        argv.extend(paths.iter().map(String::as_str));
        let run = self.probe(ContractArg::AsIs, &argv, &[])?;
        let (mut seen, run) = self.endpoint_seen(run);
        seen.secret_found_in = run.holding(&self.plants.exercise_content);
        if let Some(run_id) = run.run_id() {
            seen.stored = stored_run(&self.store, &run_id)?;
        }
        seen.cells_left = airlock_cell::census::live_cells()
            .iter()
            .filter(|cell| cell.supervisor == run.supervisor_pid)
            .count();
        Ok((seen, vec![RunSeen::of(&run)]))
    }

    fn smoke(&mut self) -> anyhow::Result<Observed> {
        let Some(argv) = self.target.smoke.clone() else {
            return Ok((
                not_applicable("no smoke command (--smoke, or the class's `smoke`)"),
                vec![],
            ));
        };
        let run = match &self.target.class {
            // A class's permitted path goes through its policy, as a request of it would.
            Some(class) => {
                let extra = ["--class".to_string(), class.clone()];
                self.invoke_with(None, &extra, &argv, &[], false)?
            }
            None => self.invoke(ContractArg::AsIs, &[], &argv, &[], false)?,
        };
        Ok((run.observation(), vec![RunSeen::of(&run)]))
    }

    fn probe(
        &mut self,
        contract: ContractArg,
        args: &[&str],
        env: &[(String, String)],
    ) -> anyhow::Result<RunOutcome> {
        self.invoke(contract, &[], &probe_argv(args), env, false)
    }

    fn invoke(
        &mut self,
        contract: ContractArg,
        extra: &[String],
        argv: &[String],
        env: &[(String, String)],
        local: bool,
    ) -> anyhow::Result<RunOutcome> {
        let file = self.contract_file(contract)?;
        self.invoke_with(file, extra, argv, env, local)
    }

    /// The contract file of a run: the user's, or a derived one written to the work
    /// directory; `None` for the default contract, as a real run without `-c` has.
    fn contract_file(&mut self, contract: ContractArg) -> anyhow::Result<Option<PathBuf>> {
        let target = self.target;
        let unchanged = self.args.image.is_none() && target.class.is_none();
        let derived = match contract {
            ContractArg::AsIs if unchanged => return Ok(target.file.clone()),
            ContractArg::AsIs => target.contract.clone(),
            ContractArg::Derived(contract) => *contract,
        };
        self.count += 1;
        let path = self.work.join(format!("contract-{}.json", self.count));
        let text = serde_json::to_string_pretty(&derive::absolute(&derived, &target.base_dir))?;
        std::fs::write(&path, text)?;
        Ok(Some(path))
    }

    /// `airlock run` of this binary: the path a real run takes.
    fn invoke_with(
        &mut self,
        contract: Option<PathBuf>,
        extra: &[String],
        argv: &[String],
        env: &[(String, String)],
        local: bool,
    ) -> anyhow::Result<RunOutcome> {
        self.count += 1;
        let result = self.work.join(format!("result-{}.json", self.count));
        let mut cmd = Command::new(std::env::current_exe()?);
        cmd.args(["run", "-v", "--result"]).arg(&result);
        if let Some(contract) = &contract {
            cmd.arg("--contract").arg(contract);
        }
        if let Some(config) = &self.args.config {
            cmd.arg("--config").arg(config);
        }
        // `--output-dir` and `--class`, the only extra options, keep a run here too
        // (run.rs, `stays_local`).
        let stays_here = local || self.args.local || !self.service || !extra.is_empty();
        if let (Some(state_dir), true) = (&self.args.state_dir, stays_here) {
            cmd.arg("--state-dir").arg(state_dir);
        }
        // Probe runs fail on purpose: they are kept apart from the figures of real runs
        // (`airlock stats`). A class's smoke run is a request of the class, and its own.
        if !extra.iter().any(|arg| arg == "--class") {
            cmd.args(["--workload-class", output::VERIFY_CLASS]);
        }
        if local || self.args.local {
            cmd.arg("--local");
        }
        cmd.args(extra).arg("--").args(argv);
        cmd.envs(env.iter().map(|(k, v)| (k, v)));
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let child = cmd.spawn().context("starting airlock run")?;
        let supervisor_pid = child.id();
        let out = child.wait_with_output()?;
        let result_text = std::fs::read_to_string(&result).unwrap_or_default();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        Ok(RunOutcome {
            exit_code: out.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            via_service: stderr.contains("airlock: handed to the service"),
            stderr,
            report: serde_json::from_str(&result_text).ok(),
            result_text,
            supervisor_pid,
        })
    }
}

/// Whether an airlock service answers where `airlock run` would hand its runs to, and
/// nothing of this verification keeps them here.
fn service_listening(args: &VerifyArgs) -> bool {
    if args.local || args.config.is_some() {
        return false;
    }
    crate::run::service_socket()
        .is_some_and(|socket| std::os::unix::net::UnixStream::connect(socket).is_ok())
}

/// What the output says of one run of a check.
#[derive(Debug, Clone, serde::Serialize)]
pub struct RunSeen {
    pub run_id: Option<String>,
    pub via: &'static str,
    pub exit_code: i32,
}

impl RunSeen {
    fn of(run: &RunOutcome) -> RunSeen {
        RunSeen {
            run_id: run.run_id(),
            via: if run.via_service {
                "service"
            } else {
                "this process"
            },
            exit_code: run.exit_code,
        }
    }
}

fn not_applicable(why: &str) -> Observation {
    Observation {
        not_applicable: Some(why.to_string()),
        ..Observation::default()
    }
}

fn probe_argv(args: &[&str]) -> Vec<String> {
    let head = ["python3", "-c", PROBE];
    head.iter().chain(args).map(|s| s.to_string()).collect()
}

/// Files below `dir` whose name holds `name`.
fn files_named(dir: &Path, name: &str) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            found.extend(files_named(&path, name));
        } else if entry.file_name().to_string_lossy().contains(name) {
            found.push(path.display().to_string());
        }
    }
    found
}

/// The run's record and audit entries in the store, as text.
fn stored_text(location: &airlock_store::StoreLocation, run_id: &str) -> anyhow::Result<String> {
    let store = airlock_store::Store::open_at(location)?;
    let Some(detail) = store.show_run(run_id)? else {
        return Ok(String::new());
    };
    Ok(serde_json::to_string(&detail)?)
}

/// Whether any file of the store holds `secret` (the database, its WAL, the caches).
fn store_files_hold(state_dir: &Path, secret: &str) -> bool {
    let mut files = Vec::new();
    collect_files(state_dir, &mut files);
    files.iter().any(|file| {
        std::fs::read(file).is_ok_and(|bytes| {
            bytes
                .windows(secret.len())
                .any(|window| window == secret.as_bytes())
        })
    })
}

fn collect_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        match entry.file_type() {
            Ok(kind) if kind.is_dir() => collect_files(&path, out),
            Ok(kind) if kind.is_file() => out.push(path),
            _ => {}
        }
    }
}

/// The run as the audit store holds it: its status, how many of the probe's attempts its
/// stored output keeps, and its egress denials.
fn stored_run(
    location: &airlock_store::StoreLocation,
    run_id: &str,
) -> anyhow::Result<Option<StoredRun>> {
    let store = airlock_store::Store::open_at(location)?;
    let Some(detail) = store.show_run(run_id)? else {
        return Ok(None);
    };
    let run = &detail.run;
    let output = [&run.stdout_head, &run.stdout_tail]
        .iter()
        .filter_map(|s| s.as_deref())
        .collect::<Vec<_>>()
        .join("\n");
    let attempts = ProbeOutput::parse(&output).lines.len();
    let denials = (detail.events.iter())
        .filter(|e| e.kind == airlock_store::kinds::EGRESS_DECISION)
        .filter(|e| e.body["decision"] != "allow")
        .count();
    Ok(Some(StoredRun {
        status: run.status.clone(),
        attempts_recorded: attempts,
        egress_denials: denials,
    }))
}
