//! `airlock run`: contract -> plan, then the engine's lifecycle (audit record -> cell ->
//! completion -> record); this module decides what only the command line knows (its
//! stdin, its environment's credentials, the result file) and reports on stderr.

use crate::config::OperatorConfig;
use airlock_cell::artifacts::ArtifactRequest;
use airlock_cell::report::{ResultClass, RunReport};
use airlock_cell::PayloadStdin;
use airlock_contract::{
    compile, default_contract, load_contract_file, read_seccomp_profile, CellPlan, CompileInput,
    ContractError, NetworkPlan, RlimitsOnly, HOST_IMAGE,
};
use airlock_engine::handoff::{
    self, classify_stdin, stdin_record, HandoffContract, HandoffDelivery, HandoffReply,
    HandoffRequest, StdinKind,
};
use airlock_engine::inputs::InputContents;
use airlock_engine::record;
use airlock_engine::{Engine, EngineConfig, FinishedRun, Refusal, RunRequest};
use clap::Args;
use serde_json::{json, Value};
use std::os::fd::AsFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

#[derive(Args)]
pub struct RunArgs {
    /// Execution contract (YAML, TOML or JSON). Without it the default contract applies:
    /// no network, read-only root, 16 MiB /tmp, no credentials, conservative limits.
    #[arg(long, short = 'c')]
    contract: Option<PathBuf>,
    /// Operator configuration (TOML): egress resolvers, host map, exempt CIDRs, store.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Directory of the audit store (default /var/lib/airlock as root, else the XDG state dir).
    #[arg(long)]
    state_dir: Option<PathBuf>,
    /// Workload class recorded with the run (for the per-class figures of `airlock stats`).
    #[arg(long, default_value = "default")]
    workload_class: String,
    /// Write the JSON result record to this file.
    #[arg(long)]
    result: Option<PathBuf>,
    /// Copy declared artifacts (`filesystem.output_allowlist`) into this directory.
    #[arg(long)]
    output_dir: Option<PathBuf>,
    /// Largest single artifact, in bytes.
    #[arg(long, default_value_t = 64 << 20)]
    max_artifact_bytes: u64,
    /// Run the cell in this process even when an airlock service is listening.
    #[arg(long)]
    local: bool,
    /// Say where the run goes (handed to the service, or in this process, and why).
    #[arg(long, short = 'v')]
    verbose: bool,
    /// `--class` and its request: the contract comes from a workload class (crate::class).
    #[command(flatten)]
    class: crate::class::RunClassArgs,
    /// The command and its arguments. Required unless the contract's `image` is an OCI
    /// image, whose `Entrypoint` + `Cmd` then run.
    #[arg(trailing_var_arg = true)]
    command: Vec<String>,
}

/// Why no plan: the run's class and message, or a usage error (exit 2), or the policy
/// step's own end (recorded and reported already).
enum PlanRefusal {
    Refused(ResultClass, String),
    Usage(String),
    Policy(crate::class::ClassStop),
}

impl From<ContractError> for PlanRefusal {
    fn from(err: ContractError) -> PlanRefusal {
        let status = ResultClass::from_name(err.class()).unwrap_or(ResultClass::RuntimeFault);
        PlanRefusal::Refused(status, format!("contract: {err}"))
    }
}

/// The plan, and the lease on its OCI image (held for the cell's life), if it has one.
fn load_plan(
    args: &RunArgs,
    config: &OperatorConfig,
    grant: &mut Option<crate::class::ClassGrant>,
) -> Result<(CellPlan, Option<airlock_images::Lease>), PlanRefusal> {
    let (contract, base_dir) = match &args.contract {
        _ if args.class.class.is_some() => {
            let store = config
                .store_location(args.state_dir.as_deref())
                .map_err(|err| PlanRefusal::Usage(crate::user_message(&err)))?;
            let granted = crate::class::contract_for_run(
                &args.class,
                config,
                args.config.as_deref(),
                &args.command,
                &store,
            )
            .map_err(PlanRefusal::Policy)?;
            let both = (granted.contract.clone(), granted.base_dir.clone());
            *grant = Some(granted);
            both
        }
        Some(path) => {
            let absolute = std::path::absolute(path).unwrap_or_else(|_| path.clone());
            let base = absolute
                .parent()
                .map(Path::to_path_buf)
                .unwrap_or_else(crate::current_dir);
            (load_contract_file(path)?, base)
        }
        None => (default_contract(), crate::current_dir()),
    };
    let resolved = if contract.image == HOST_IMAGE {
        if args.command.is_empty() {
            return Err(PlanRefusal::Usage(
                "a command is required: only a contract whose `image` is an OCI image may \
                 omit it (the image's Entrypoint and Cmd run)"
                    .to_owned(),
            ));
        }
        None
    } else {
        let state_dir = config.state_dir(args.state_dir.as_deref());
        let (image, lease) = crate::run_image::resolve(&contract.image, &config.images, &state_dir)
            .map_err(|(class, why)| PlanRefusal::Refused(class, why))?;
        Some((image, lease))
    };
    let seccomp_profile = read_seccomp_profile(&contract, &base_dir)?;
    let plan = compile(
        &contract,
        &CompileInput {
            base_dir: &base_dir,
            argv: &args.command,
            seccomp_profile: seccomp_profile.as_deref(),
            image: resolved.as_ref().map(|(image, _)| image),
            pod_network: None,
        },
    )?;
    let mut plan = plan;
    if let (Some(broker), Some(class)) = (plan.broker.as_mut(), &args.class.class) {
        // The class's grant made this contract: its broker requests are the class's.
        broker.class = Some(class.clone());
    }
    if let (Some(granted), Some(class)) = (grant.as_ref(), &args.class.class) {
        if granted.without_cgroup == airlock_policy::WithoutCgroup::Rlimits {
            // The operator's class, not the contract, allows a run without a cgroup.
            plan.without_cgroup = Some(RlimitsOnly::for_limits(class, &plan.limits));
        }
    }
    Ok((plan, resolved.map(|(_, lease)| lease)))
}

/// How the caller's stdin reaches the payload, decided before the cell starts without
/// reading any of it (reading would put the caller's pace on the start path, outside
/// the deadline): airlock_engine::handoff::classify_stdin, which a service applies to a
/// handed-off client's stdin the same way:
/// - a terminal, or no fd 0: the payload gets the cell's /dev/null (a tty handle would let
///   it type into the caller's terminal);
/// - for a plan with a terminal, any fd 0 (a terminal, /dev/null, a pipe): relayed by the
///   supervisor into the master of the payload's own terminal in the cell (a terminal of
///   the caller is put in raw mode for it; airlock_cell's terminal module);
/// - /dev/null: the same, without a relay;
/// - anything else (a pipe, a socket, a regular file, another device): relayed into a
///   pipe of the cell as it arrives and hashed on the way by the supervisor
///   (airlock_cell::stdin_relay). A pipe in the cell, not the caller's file: a host file
///   re-opened through `/dev/stdin` would be a host path, which Landlock refuses.
fn prepare_stdin(plan: &CellPlan) -> anyhow::Result<(PayloadStdin, StdinKind)> {
    let fd = std::io::stdin().as_fd().try_clone_to_owned().ok();
    Ok(classify_stdin(fd, plan.terminal)?)
}

/// A copy of one of this process's output descriptors, for the payload's output; none
/// when it is closed.
fn caller_output(fd: std::os::fd::BorrowedFd<'_>) -> Option<std::os::fd::OwnedFd> {
    fd.try_clone_to_owned().ok()
}

/// A run refused before any cell existed: record it (when the store can be opened),
/// report it (stderr, result file) and exit 125.
fn refuse(
    engine: &Engine,
    args: &RunArgs,
    status: ResultClass,
    error: String,
    plan: Option<&CellPlan>,
) -> ExitCode {
    let refused = engine.refuse(Refusal {
        argv: &args.command,
        workload_class: &args.workload_class,
        status,
        error,
        plan,
        tenant: None,
    });
    report_refusal(args, &refused.report, plan, &refused.secrets)
}

/// Reports a refused run on stderr and in the result file; exit 125.
fn report_refusal(
    args: &RunArgs,
    report: &RunReport,
    plan: Option<&CellPlan>,
    secrets: &[String],
) -> ExitCode {
    if let Some(error) = &report.error {
        eprintln!("airlock: {}: {error}", report.status.as_str());
    }
    if let Err(err) = write_result(args, &result_record(report, plan, None), secrets) {
        eprintln!("airlock: {err}");
    }
    ExitCode::from(125)
}

/// Every refusal the command line itself decides before a cell: the contract, the
/// allowlist's resolution, the credentials in this process's environment, stdin.
fn prepare(
    args: &RunArgs,
    config: &OperatorConfig,
    engine: &Engine,
    started: Instant,
    grant: &mut Option<crate::class::ClassGrant>,
) -> Result<(RunRequest, StdinKind, Option<airlock_images::Lease>), ExitCode> {
    let (plan, lease) = load_plan(args, config, grant).map_err(|err| match err {
        PlanRefusal::Refused(status, error) => refuse(engine, args, status, error, None),
        PlanRefusal::Usage(error) => {
            eprintln!("airlock run: {error}");
            ExitCode::from(2)
        }
        PlanRefusal::Policy(stop) => stop.report(),
    })?;
    let refuse_plan = |status, error: String| refuse(engine, args, status, error, Some(&plan));
    if let NetworkPlan::Allowlist { destinations } = &plan.network {
        let unresolvable = config
            .egress
            .unresolvable(destinations.iter().map(|d| d.host_pattern.as_str()));
        if !unresolvable.is_empty() {
            let error = unresolvable_error(&unresolvable, args.config.as_deref());
            return Err(refuse_plan(ResultClass::SandboxUnavailable, error));
        }
    }
    engine
        .decide_credentials(&plan, &args.workload_class)
        .map_err(|err| refuse_plan(ResultClass::PolicyDenied, err.to_string()))?;
    let credentials = airlock_cell::credential_env(&plan)
        .map_err(|err| refuse_plan(err.class(), err.to_string()))?;
    let (stdin, stdin_kind) = prepare_stdin(&plan).map_err(|err| {
        refuse_plan(
            ResultClass::RuntimeFault,
            format!("reading inputs: {err:#}"),
        )
    })?;
    let artifacts = args.output_dir.as_ref().map(|dir| ArtifactRequest {
        output_dir: dir.clone(),
        max_file_bytes: args.max_artifact_bytes,
        max_total_bytes: args.max_artifact_bytes.saturating_mul(16),
    });
    let request = RunRequest {
        plan,
        workload_class: args.workload_class.clone(),
        credentials,
        stdin,
        artifacts,
        stdout: caller_output(std::io::stdout().as_fd()),
        stderr: caller_output(std::io::stderr().as_fd()),
        started,
        tenant: None,
        on_recorded: None,
        // This process is the caller: the cell dies with it.
        caller: None,
    };
    Ok((request, stdin_kind, lease))
}

pub fn run(mut args: RunArgs, started: Instant) -> ExitCode {
    if args.class.class.is_some() && args.contract.is_some() {
        eprintln!(
            "airlock run: --class and --contract exclude each other: a class makes the contract"
        );
        return ExitCode::from(2);
    }
    if let Some(class) = &args.class.class {
        args.workload_class = class.clone();
    }
    if let Some(code) = hand_off(&args) {
        return code;
    }
    let loaded = OperatorConfig::load(args.config.as_deref()).and_then(|c| {
        let range = c.host_id_range()?;
        let broker = c.engine_broker()?;
        // A fleet store that is misconfigured refuses the run: never the local file instead.
        let postgres = c.store_postgres()?;
        Ok((c, (range, broker, postgres)))
    });
    let (config, (host_ids, broker, store_postgres)) = match loaded {
        Ok(both) => both,
        Err(err) => {
            let error = crate::user_message(&err);
            let report = RunReport::refused("", ResultClass::RuntimeFault, error);
            return report_refusal(&args, &report, None, &[]);
        }
    };
    let mut engine_config = EngineConfig::new(
        config.state_dir(args.state_dir.as_deref()),
        config.engine_egress(),
    );
    engine_config.host_ids = host_ids;
    engine_config.broker = broker;
    engine_config.quarantine_max_bytes = config.policy.quarantine_max_bytes;
    engine_config.store_postgres = store_postgres;
    engine_config.credential_rules = config.credential_rules();
    let engine = Engine::new(engine_config);
    // `_lease` lives until this function returns: the image cannot be removed while the
    // cell runs.
    let mut grant = None;
    let (request, stdin_kind, _lease) = match prepare(&args, &config, &engine, started, &mut grant)
    {
        Ok(prepared) => prepared,
        Err(code) => return code,
    };
    // This process is single-threaded: the cell is cloned here (the cold start).
    let mut finished = match crate::class::run_with_retries(&engine, request, grant.as_ref()) {
        Ok(finished) => finished,
        Err(refused) => {
            let plan = refused.plan.as_ref();
            return report_refusal(&args, &refused.report, plan, &refused.secrets);
        }
    };
    finished.report.stdin = Some(stdin_record(stdin_kind, finished.report.stdin.take()));
    print_problems(&finished.report);
    if finished.audit_error().is_some() {
        // No record could be written, so nothing ran.
        let record = result_record(&finished.report, Some(&finished.plan), None);
        if let Err(err) = write_result(&args, &record, &finished.secrets) {
            eprintln!("airlock: {err}");
        }
        if finished.report.status == ResultClass::StoreUnavailable {
            eprintln!(
                "airlock: store_unavailable: {} (nothing ran; retry later)",
                finished.audit_error().unwrap_or_default()
            );
            return ExitCode::from(airlock_cell::report::STORE_UNAVAILABLE_EXIT as u8);
        }
        return ExitCode::from(125);
    }
    deliver(&args, &mut finished);
    print_summary(&finished.report, &finished.secrets);
    let plan = &finished.plan;
    let credentials: Vec<String> = (plan.credentials.iter().map(|c| c.name.clone()))
        .chain(plan.secrets.iter().map(|s| s.name.clone()))
        .collect();
    let evidence_dir = finished.evidence_dir.clone();
    let interrupted_by = finished.report.interrupted_by;
    let code = match engine.complete(finished) {
        Ok(report) => {
            let store = engine.config().store_location();
            let class = &args.workload_class;
            let suspect = crate::quarantine::Suspect {
                class,
                requester: String::new(),
                credentials,
                writable_copy: evidence_dir,
            };
            crate::class::after_run(&store, &report, grant.as_ref(), suspect);
            ExitCode::from(report.exit_code.clamp(0, 255) as u8)
        }
        Err(err) => {
            eprintln!(
                "airlock: audit store: the run finished but its record could not be completed: {err}"
            );
            ExitCode::from(125)
        }
    };
    // Interrupted: its cell destroyed and recorded, airlock ends as the signal would have
    // ended it (a shell's loop stops at a Ctrl-C, `kill` sees its signal).
    if let Some(signal) = interrupted_by {
        airlock_cell::die_of_signal(signal);
    }
    code
}

/// What went wrong around the payload, before the summary: leftovers of dead cells that
/// could not be removed, notes on what was provided differently, airlock's own error.
fn print_problems(report: &RunReport) {
    for stale in &report.stale_cgroups_left {
        eprintln!("airlock: warning: could not remove the leftover cgroup {stale}");
    }
    for note in &report.notes {
        eprintln!("airlock: note: {note}");
    }
    if let Some(only) = &report.rlimits_only {
        let enforced: Vec<String> = only
            .granted
            .enforced
            .iter()
            .map(|c| {
                let rlimit = c.rlimit;
                format!(
                    "{} by {}={}",
                    c.ceiling,
                    rlimit.resource.kernel_name(),
                    rlimit.value
                )
            })
            .collect();
        eprintln!(
            "airlock: note: no cgroup: class {} allows rlimits only ({}); not enforced: the CPU rate, the cell's memory as a whole, usage counters (the record's rlimits_only says more)",
            only.granted.class,
            enforced.join(", ")
        );
    }
    if let Some(error) = &report.error {
        eprintln!("airlock: {}: {error}", report.status.as_str());
    }
}

/// The end of a run on stderr: a line per artifact of note (declared but rejected, or
/// cut short), then one line for the ceilings, egress denials and artifacts, so that
/// none of them passes unseen when the payload exits 0. Redacted like the store.
fn print_summary(report: &RunReport, secrets: &[String]) {
    let redactor = airlock_store::Redactor::new(secrets.to_vec());
    for line in report.artifacts_of_note() {
        eprintln!("airlock: {}", redactor.text(&line));
    }
    if let Some(summary) = report.summary() {
        eprintln!("airlock: {}", redactor.text(&summary));
    }
}

/// Why an allowlist cannot be served: which destinations, and what the operator must add.
fn unresolvable_error(destinations: &[&str], config: Option<&Path>) -> String {
    let why = match config {
        Some(path) => format!(
            "the operator configuration {} cannot resolve",
            path.display()
        ),
        None => "no operator configuration (--config) was given to resolve".to_string(),
    };
    format!(
        "egress: the contract allows {}, but {why} it: add the name to `[egress] resolve` \
         or set `[egress] upstream_resolvers` (docs/config.md)",
        destinations.join(", ")
    )
}

fn result_record(
    report: &RunReport,
    plan: Option<&CellPlan>,
    inputs: Option<&InputContents>,
) -> Value {
    let mut record = serde_json::to_value(report).unwrap_or_default();
    if let Some(inputs) = inputs {
        record["inputs"] = json!(inputs);
    }
    record["plan"] = json!(plan);
    record
}

/// Writes the `--result` file, if one was asked for: redacted like the store's records,
/// mode 0600, as a new file (an existing one is never replaced: see host_files).
fn write_result(args: &RunArgs, record: &Value, secrets: &[String]) -> Result<(), String> {
    let Some(path) = &args.result else {
        return Ok(());
    };
    let record = record::redact_result(record.clone(), secrets);
    let text = serde_json::to_string_pretty(&record).unwrap_or_default() + "\n";
    airlock_cell::host_files::write_new_file(path, text.as_bytes())
        .map(drop)
        .map_err(|err| {
            let shown = airlock_cell::host_files::escaped(path.as_os_str().as_bytes());
            format!("the result file {shown} was not written: {err}")
        })
}

/// A run that happened, at its end: artifacts the host side could not write and a result
/// file that could not be written make it `delivery_failed` (exit 123), in the result
/// file when there is one and in the store. stderr says what was lost, escaped and
/// redacted.
fn deliver(args: &RunArgs, finished: &mut FinishedRun) {
    let FinishedRun {
        report,
        plan,
        inputs,
        secrets,
        ..
    } = finished;
    let redactor = airlock_store::Redactor::new(secrets.to_vec());
    let lost = report.undelivered_artifacts();
    for line in &lost {
        eprintln!("airlock: {}", redactor.text(line));
    }
    if !lost.is_empty() {
        report.mark_delivery_failed(format!(
            "{} artifact(s) could not be written to the output directory (artifacts.undelivered \
             says which and why)",
            lost.len()
        ));
    }
    let record = result_record(report, Some(plan), inputs.as_ref());
    if let Err(err) = write_result(args, &record, secrets) {
        eprintln!("airlock: {}", redactor.text(&err));
        report.mark_delivery_failed(err);
    }
    if report.status == ResultClass::DeliveryFailed {
        eprintln!(
            "airlock: delivery_failed: the run finished (payload exit {}) but not everything \
             asked for was delivered (exit {})",
            report
                .exit
                .code
                .map_or_else(|| "none".to_string(), |c| c.to_string()),
            report.exit_code
        );
    }
}

// ---- the hand-off to a running service (crates/engine/src/handoff.rs) ----

/// The service's socket: `AIRLOCK_SOCKET`, else `/run/airlock/airlock.sock` as root and
/// `$XDG_RUNTIME_DIR/airlock/airlock.sock` otherwise (none without that variable).
pub(crate) fn service_socket() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("AIRLOCK_SOCKET") {
        return (!path.is_empty()).then(|| PathBuf::from(path));
    }
    if airlock_cell::peer::running_as_root() {
        return Some(PathBuf::from("/run/airlock/airlock.sock"));
    }
    std::env::var_os("XDG_RUNTIME_DIR")
        .filter(|dir| !dir.is_empty())
        .map(|dir| PathBuf::from(dir).join("airlock/airlock.sock"))
}

/// Why this run stays in this process whatever the service: options the service cannot
/// honour for the client (a store, a configuration or an output directory of its own).
fn stays_local(args: &RunArgs) -> Option<&'static str> {
    if args.local {
        Some("--local")
    } else if args.command.is_empty() {
        Some("no command: an OCI image's own, or a usage error")
    } else if args.state_dir.is_some() {
        Some("--state-dir names a store of its own")
    } else if args.config.is_some() {
        Some("--config names an operator configuration of its own")
    } else if args.output_dir.is_some() {
        Some("--output-dir: artifacts are collected in this process")
    } else if args.class.class.is_some() {
        Some("--class: the workload class is evaluated in this process")
    } else {
        None
    }
}

fn say(args: &RunArgs, what: std::fmt::Arguments<'_>) {
    if args.verbose {
        eprintln!("airlock: {what}");
    }
}

/// The contract as the service receives it, and the directory its relative paths are
/// against. `None`: this process reads it (and reports an unreadable one itself).
fn handoff_contract(args: &RunArgs) -> Option<(HandoffContract, PathBuf)> {
    let Some(path) = &args.contract else {
        return Some((HandoffContract::Default, crate::current_dir()));
    };
    let absolute = std::path::absolute(path).ok()?;
    let base = absolute.parent()?.to_path_buf();
    let format = path.extension()?.to_string_lossy().into_owned();
    let text = std::fs::read_to_string(path).ok()?;
    Some((HandoffContract::Text { text, format }, base))
}

/// The contract the service will parse, as this process reads it (`None`: the default
/// contract, or one that does not parse: the service refuses it, saying why).
fn parsed_contract(contract: &HandoffContract) -> Option<airlock_contract::Contract> {
    let HandoffContract::Text { text, format } = contract else {
        return None;
    };
    airlock_contract::ContractFormat::from_extension(format)
        .and_then(|format| airlock_contract::parse_contract(text, format).ok())
}

/// Whether a credential of the contract reads one of the well-known model keys.
fn reads_a_model_key(contract: Option<&airlock_contract::Contract>) -> bool {
    contract.is_some_and(|contract| {
        (contract.credentials.iter())
            .any(|c| airlock_contract::MODEL_KEY_VARIABLES.contains(&c.from_env.as_str()))
    })
}

/// The variables of this process's environment that the contract's credentials read,
/// for the service to resolve as this process would.
fn credential_values(contract: Option<&airlock_contract::Contract>) -> Vec<(String, String)> {
    let Some(contract) = contract else {
        return Vec::new();
    };
    contract
        .credentials
        .iter()
        .filter_map(|c| {
            std::env::var(&c.from_env)
                .ok()
                .map(|v| (c.from_env.clone(), v))
        })
        .collect()
}

/// For a contract with a terminal and a terminal on this process's stdin: that terminal,
/// raw while the service's cell runs the payload on a terminal of its own, exactly as in
/// a run in this process (the cell relays it and follows its window size; this process
/// restores it, also before it dies of a signal: crates/cell/src/terminal.rs).
fn raw_terminal_for(
    contract: Option<&airlock_contract::Contract>,
) -> std::io::Result<Option<airlock_cell::CallerTerminal>> {
    let stdin = std::io::stdin();
    let stdin = stdin.as_fd();
    if !contract.is_some_and(|c| c.terminal) || !airlock_cell::peer::is_terminal(stdin) {
        return Ok(None);
    }
    airlock_cell::CallerTerminal::enter(stdin).map(Some)
}

/// Hands the run to the service when one listens: `None` when it runs in this process
/// (no service, one that refuses connections, a run it declines, `--local`), otherwise
/// the exit code, with the same stderr and result file as a run in this process.
fn hand_off(args: &RunArgs) -> Option<ExitCode> {
    if let Some(why) = stays_local(args) {
        say(args, format_args!("running in this process ({why})"));
        return None;
    }
    let socket = service_socket()?;
    let stream = match std::os::unix::net::UnixStream::connect(&socket) {
        Ok(stream) => stream,
        Err(err) => {
            say(
                args,
                format_args!(
                    "no airlock service at {} ({err}): running in this process",
                    socket.display()
                ),
            );
            return None;
        }
    };
    let (contract, base_dir) = handoff_contract(args)?;
    let parsed = parsed_contract(&contract);
    if reads_a_model_key(parsed.as_ref()) {
        // A model key never crosses the socket: this process decides it under its own
        // operator configuration (refused, or lifted for the class).
        say(
            args,
            format_args!("running in this process (a credential reads a model key)"),
        );
        return None;
    }
    let credential_values = credential_values(parsed.as_ref());
    let request = HandoffRequest {
        contract,
        base_dir,
        argv: args.command.clone(),
        env: Vec::new(),
        workload_class: args.workload_class.clone(),
        wall_time_ms: None,
        credential_values,
        result_file: args.result.is_some(),
    };
    // Raw before the payload may start; restored (dropped) before anything is printed.
    let mut terminal = match raw_terminal_for(parsed.as_ref()) {
        Ok(terminal) => terminal,
        Err(err) => {
            say(
                args,
                format_args!("the terminal could not be made raw ({err}): running in this process"),
            );
            return None;
        }
    };
    let (stdin, stdout, stderr) = (std::io::stdin(), std::io::stdout(), std::io::stderr());
    let stdio = [stdin.as_fd(), stdout.as_fd(), stderr.as_fd()];
    if let Err(err) = handoff::send_request(&stream, &request, stdio) {
        say(
            args,
            format_args!(
                "the service at {} did not take the run ({err}): running in this process",
                socket.display()
            ),
        );
        return None;
    }
    if let Some(terminal) = terminal.as_mut() {
        // Taken signals are acted on while the payload runs (a fatal one restores the
        // terminal and ends this process; the service then destroys the cell).
        let _ = terminal.wait_readable(stream.as_fd());
    }
    let reply = handoff::recv_reply(&stream);
    // The payload is over, or never started.
    drop(terminal);
    match reply {
        Ok(Some(HandoffReply::Declined { why })) => {
            say(
                args,
                format_args!("the service declined ({why}): running in this process"),
            );
            None
        }
        Ok(Some(reply)) => {
            say(
                args,
                format_args!("handed to the service at {}", socket.display()),
            );
            Some(handed_off(args, &stream, reply))
        }
        Ok(None) | Err(_) => Some(service_died(args, reply.err())),
    }
}

/// The service's answer, delivered as a run in this process delivers its own.
fn handed_off(
    args: &RunArgs,
    stream: &std::os::unix::net::UnixStream,
    reply: HandoffReply,
) -> ExitCode {
    let (mut report, plan, inputs, delivery) = match reply {
        HandoffReply::Finished {
            report,
            plan,
            inputs,
            delivery,
        } => (*report, plan, inputs, delivery),
        HandoffReply::Refused { report, plan } => {
            print_problems(&report);
            let record = result_record(&report, plan.as_deref(), None);
            if let Err(err) = write_result(args, &record, &[]) {
                eprintln!("airlock: {err}");
            }
            return ExitCode::from(125);
        }
        HandoffReply::Declined { .. } | HandoffReply::Completed { .. } => {
            return service_died(args, None)
        }
    };
    // The service redacted the report and the plan already.
    print_problems(&report);
    // Without a result file the record is not built at all (the plan was not sent).
    let failure = args.result.as_ref().and_then(|_| {
        let record = result_record(&report, plan.as_deref(), inputs.as_ref());
        write_result(args, &record, &[]).err()
    });
    if let Some(err) = &failure {
        eprintln!("airlock: {err}");
        report.mark_delivery_failed(err.clone());
        eprintln!(
            "airlock: delivery_failed: the run finished (payload exit {}) but not everything \
             asked for was delivered (exit {})",
            report
                .exit
                .code
                .map_or_else(|| "none".to_string(), |c| c.to_string()),
            report.exit_code
        );
    }
    // A service that does not wait for a delivery (no result file was asked for, so
    // nothing can have failed) completes the record and answers without one.
    if delivery && handoff::send_delivery(stream, &HandoffDelivery { failure }).is_err() {
        return service_died(args, None);
    }
    print_summary(&report, &[]);
    match handoff::recv_reply(stream) {
        Ok(Some(HandoffReply::Completed { exit_code, error })) => match error {
            None => ExitCode::from(exit_code.clamp(0, 255) as u8),
            Some(error) => {
                eprintln!("airlock: {error}");
                ExitCode::from(125)
            }
        },
        other => service_died(args, other.err()),
    }
}

/// The service went away before the run's end was known: `runtime_fault`, exit 125.
fn service_died(args: &RunArgs, err: Option<airlock_engine::EngineError>) -> ExitCode {
    let detail = err.map(|e| format!(": {e}")).unwrap_or_default();
    let error = format!(
        "the airlock service ended the connection before the run's result{detail}; \
         its audit store has whatever it recorded"
    );
    let report = RunReport::refused("", ResultClass::RuntimeFault, error);
    report_refusal(args, &report, None, &[])
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        run: RunArgs,
    }

    fn args(line: &[&str]) -> RunArgs {
        Cli::parse_from(std::iter::once("run").chain(line.iter().copied())).run
    }

    #[test]
    fn a_plain_run_may_be_handed_to_a_service() {
        assert_eq!(stays_local(&args(&["--", "/bin/true"])), None);
        assert_eq!(
            stays_local(&args(&[
                "-c", "c.yaml", "-v", "--result", "r.json", "--", "true"
            ])),
            None
        );
    }

    #[test]
    fn a_run_with_a_store_config_or_output_dir_of_its_own_stays_in_this_process() {
        for line in [
            &["--local", "--", "true"][..],
            &["--state-dir", "/s", "--", "true"],
            &["--config", "a.toml", "--", "true"],
            &["--output-dir", "/o", "--", "true"],
            &[],
        ] {
            assert!(stays_local(&args(line)).is_some(), "{line:?}");
        }
    }
}
