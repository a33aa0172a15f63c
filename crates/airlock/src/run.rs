//! `airlock run`: contract -> plan, then the engine's lifecycle (audit record -> cell ->
//! completion -> record); this module decides what only the command line knows (its
//! stdin, its environment's credentials, the result file) and reports on stderr.

use crate::config::OperatorConfig;
use airlock_cell::artifacts::ArtifactRequest;
use airlock_cell::report::{ResultClass, RunReport};
use airlock_cell::stdin_relay::StdinRecord;
use airlock_cell::PayloadStdin;
use airlock_contract::{
    compile, default_contract, load_contract_file, read_seccomp_profile, CellPlan, CompileInput,
    ContractError, NetworkPlan, HOST_IMAGE,
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
    /// The command and its arguments. Required unless the contract's `image` is an OCI
    /// image, whose `Entrypoint` + `Cmd` then run.
    #[arg(trailing_var_arg = true)]
    command: Vec<String>,
}

/// Why no plan: the run's class and message, or a usage error (exit 2).
enum PlanRefusal {
    Refused(ResultClass, String),
    Usage(String),
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
) -> Result<(CellPlan, Option<airlock_images::Lease>), PlanRefusal> {
    let (contract, base_dir) = match &args.contract {
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
        let (image, lease) = crate::run_image::resolve(&contract.image, config, &state_dir)
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
        },
    )?;
    Ok((plan, resolved.map(|(_, lease)| lease)))
}

/// How the caller's stdin reaches the payload, decided before the cell starts without
/// reading any of it (reading would put the caller's pace on the start path, outside
/// the deadline):
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
enum StdinKind {
    Terminal,
    NullDevice,
    Stream,
    IntoTerminal,
}

fn prepare_stdin(plan: &CellPlan) -> anyhow::Result<(PayloadStdin, StdinKind)> {
    use std::io::IsTerminal;
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let stdin = std::io::stdin();
    if stdin.is_terminal() && !plan.terminal {
        return Ok((PayloadStdin::Null, StdinKind::Terminal));
    }
    let Ok(fd) = stdin.as_fd().try_clone_to_owned() else {
        // No fd 0 at all (closed by the caller): nothing to read.
        return Ok((PayloadStdin::Null, StdinKind::Terminal));
    };
    if plan.terminal {
        // Everything goes to the payload's terminal; /dev/null is an immediate EOF there.
        return Ok((PayloadStdin::Relayed(fd), StdinKind::IntoTerminal));
    }
    let meta = std::fs::File::from(fd.try_clone()?).metadata()?;
    // The null device is character device 1:3.
    if meta.file_type().is_char_device() && meta.rdev() == libc::makedev(1, 3) {
        return Ok((PayloadStdin::Null, StdinKind::NullDevice));
    }
    Ok((PayloadStdin::Relayed(fd), StdinKind::Stream))
}

/// A copy of one of this process's output descriptors, for the payload's output; none
/// when it is closed.
fn caller_output(fd: std::os::fd::BorrowedFd<'_>) -> Option<std::os::fd::OwnedFd> {
    fd.try_clone_to_owned().ok()
}

/// What the payload got on stdin, for the record.
fn stdin_record(kind: &StdinKind, relayed: Option<StdinRecord>) -> StdinRecord {
    match kind {
        StdinKind::Terminal => StdinRecord::none(),
        StdinKind::NullDevice => StdinRecord {
            mode: "null",
            ..StdinRecord::none()
        },
        // A relay that never started (the cell failed first) read nothing.
        StdinKind::Stream => relayed.unwrap_or(StdinRecord {
            mode: "relayed",
            eof: false,
            ..StdinRecord::none()
        }),
        StdinKind::IntoTerminal => relayed.unwrap_or(StdinRecord {
            mode: "terminal",
            eof: false,
            ..StdinRecord::none()
        }),
    }
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
) -> Result<(RunRequest, StdinKind, Option<airlock_images::Lease>), ExitCode> {
    let (plan, lease) = load_plan(args, config).map_err(|err| match err {
        PlanRefusal::Refused(status, error) => refuse(engine, args, status, error, None),
        PlanRefusal::Usage(error) => {
            eprintln!("airlock run: {error}");
            ExitCode::from(2)
        }
    })?;
    let refuse_plan = |status, error: String| refuse(engine, args, status, error, Some(&plan));
    if let NetworkPlan::Allowlist { destinations } = &plan.network {
        let unresolvable = config.unresolvable(destinations);
        if !unresolvable.is_empty() {
            let error = unresolvable_error(&unresolvable, args.config.as_deref());
            return Err(refuse_plan(ResultClass::SandboxUnavailable, error));
        }
    }
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
    };
    Ok((request, stdin_kind, lease))
}

pub fn run(args: RunArgs, started: Instant) -> ExitCode {
    let loaded = OperatorConfig::load(args.config.as_deref())
        .and_then(|c| c.host_id_range().map(|range| (c, range)));
    let (config, host_ids) = match loaded {
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
    let engine = Engine::new(engine_config);
    // `_lease` lives until this function returns: the image cannot be removed while the
    // cell runs.
    let (request, stdin_kind, _lease) = match prepare(&args, &config, &engine, started) {
        Ok(prepared) => prepared,
        Err(code) => return code,
    };
    // This process is single-threaded: the cell is cloned here (the cold start).
    let mut finished = match engine.run_here(request) {
        Ok(finished) => finished,
        Err(refused) => {
            let plan = refused.plan.as_ref();
            return report_refusal(&args, &refused.report, plan, &refused.secrets);
        }
    };
    finished.report.stdin = Some(stdin_record(&stdin_kind, finished.report.stdin.take()));
    print_problems(&finished.report);
    if finished.audit_error().is_some() {
        // No record could be written, so nothing ran.
        let record = result_record(&finished.report, Some(&finished.plan), None);
        if let Err(err) = write_result(&args, &record, &finished.secrets) {
            eprintln!("airlock: {err}");
        }
        return ExitCode::from(125);
    }
    deliver(&args, &mut finished);
    print_summary(&finished.report, &finished.secrets);
    match engine.complete(finished) {
        Ok(report) => ExitCode::from(report.exit_code.clamp(0, 255) as u8),
        Err(err) => {
            eprintln!(
                "airlock: audit store: the run finished but its record could not be completed: {err}"
            );
            ExitCode::from(125)
        }
    }
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
