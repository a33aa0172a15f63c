//! `airlock run`: contract -> plan -> audit record -> cell -> result.

use crate::config::OperatorConfig;
use crate::egress_session::ProxySession;
use crate::inputs::InputContents;
use crate::record::{self, InputHasher};
use airlock_cell::artifacts::ArtifactRequest;
use airlock_cell::report::{ResultClass, RunReport};
use airlock_cell::stdin_relay::StdinRecord;
use airlock_cell::{EgressSession, PayloadStdin, RunOptions};
use airlock_contract::{
    compile, default_contract, load_contract_file, CellPlan, CompileInput, ContractError,
    NetworkPlan,
};
use airlock_store::{RunHandle, RunStart, Store};
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
    /// The command and its arguments.
    #[arg(required = true, trailing_var_arg = true)]
    command: Vec<String>,
}

fn load_plan(args: &RunArgs) -> Result<CellPlan, ContractError> {
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
    compile(
        &contract,
        &CompileInput {
            base_dir: &base_dir,
            argv: &args.command,
        },
    )
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

/// A run refused before any cell existed: report it (stderr, result file) and exit 125.
fn refuse(
    args: &RunArgs,
    run_id: &str,
    status: ResultClass,
    error: String,
    plan: Option<&CellPlan>,
) -> ExitCode {
    eprintln!("airlock: {}: {error}", status.as_str());
    let report = RunReport::refused(run_id, status, error);
    let secrets = plan.map(|p| record::secrets_of(p, &[])).unwrap_or_default();
    if let Err(err) = write_result(args, &result_record(&report, plan, None), &secrets) {
        eprintln!("airlock: {err}");
    }
    ExitCode::from(125)
}

/// Records a run refused before its cell existed (bad contract, missing credential, ...)
/// so that refusals are audited too, then reports it.
fn refuse_recorded(
    store: &Store,
    args: &RunArgs,
    status: ResultClass,
    error: String,
    plan: Option<&CellPlan>,
) -> ExitCode {
    let start = RunStart {
        argv: args.command.clone(),
        input_sha256: InputHasher::new(&args.command).finish(),
        contract_sha256: plan.map(|p| p.contract_sha256.clone()).unwrap_or_default(),
        workload_class: args.workload_class.clone(),
        plan_json: json!(plan),
    };
    // The plan holds the secret env values; credentials were not resolved.
    let secrets = plan.map(|p| record::secrets_of(p, &[])).unwrap_or_default();
    let recorded = store.begin_run(start, secrets).and_then(|handle| {
        let mut report = RunReport::refused(&handle.run_id(), status, error.clone());
        report.cleanup.ok = true;
        record::finish(
            store,
            &handle,
            &report,
            &serde_json::to_value(&report).unwrap_or_default(),
        )?;
        Ok(handle.run_id())
    });
    match recorded {
        Ok(run_id) => refuse(args, &run_id, status, error, plan),
        Err(err) => refuse(
            args,
            "",
            status,
            format!("{error}; recording the refusal failed: {err}"),
            plan,
        ),
    }
}

/// Opens the audit store and marks runs of dead supervisors as aborted.
fn open_store(config: &OperatorConfig, args: &RunArgs) -> Result<Store, String> {
    let store =
        Store::open(&config.state_dir(args.state_dir.as_deref())).map_err(|err| err.to_string())?;
    if let Err(err) = store.reap_aborted() {
        eprintln!("airlock: warning: marking runs of dead supervisors as aborted failed: {err}");
    }
    Ok(store)
}

/// A run refused before its cell was cloned, recorded when the store can be opened.
fn refuse_early(
    config: &OperatorConfig,
    args: &RunArgs,
    status: ResultClass,
    error: String,
    plan: Option<&CellPlan>,
) -> ExitCode {
    match open_store(config, args) {
        Ok(store) => refuse_recorded(&store, args, status, error, plan),
        Err(store_error) => refuse(args, "", status, format!("{error}; {store_error}"), plan),
    }
}

/// What a run needs once every check before the cell passed.
struct Prepared {
    plan: CellPlan,
    credentials: Vec<(String, String)>,
    stdin: PayloadStdin,
    stdin_kind: StdinKind,
    start: RunStart,
    secrets: Vec<String>,
}

/// Every refusal that needs no cell: the contract, the allowlist's resolution, the
/// credentials, stdin and the inputs. A refusal is recorded and reported; its exit code
/// is the error.
fn prepare(args: &RunArgs, config: &OperatorConfig) -> Result<Prepared, ExitCode> {
    let plan = load_plan(args).map_err(|err| {
        let status = ResultClass::from_name(err.class()).unwrap_or(ResultClass::RuntimeFault);
        refuse_early(config, args, status, format!("contract: {err}"), None)
    })?;
    let refuse_plan =
        |status, error: String| refuse_early(config, args, status, error, Some(&plan));
    if let NetworkPlan::Allowlist { destinations } = &plan.network {
        let unresolvable = config.unresolvable(destinations);
        if !unresolvable.is_empty() {
            let error = unresolvable_error(&unresolvable, args.config.as_deref());
            return Err(refuse_plan(ResultClass::SandboxUnavailable, error));
        }
    }
    let credentials = airlock_cell::credential_env(&plan)
        .map_err(|err| refuse_plan(err.class(), err.to_string()))?;
    let mut hasher = InputHasher::new(&args.command);
    let (stdin, stdin_kind) = prepare_stdin(&plan)
        .and_then(|s| hasher.add_plan_inputs(&plan).map(|_| s).map_err(Into::into))
        .map_err(|err| {
            refuse_plan(
                ResultClass::RuntimeFault,
                format!("reading inputs: {err:#}"),
            )
        })?;
    let start = RunStart {
        argv: args.command.clone(),
        input_sha256: hasher.finish(),
        contract_sha256: plan.contract_sha256.clone(),
        workload_class: args.workload_class.clone(),
        plan_json: serde_json::to_value(&plan).unwrap_or_default(),
    };
    let secrets = record::secrets_of(&plan, &credentials);
    Ok(Prepared {
        plan,
        credentials,
        stdin,
        stdin_kind,
        start,
        secrets,
    })
}

/// The run's audit record, begun by the cell runtime's hook once the cell is released
/// (fail closed: no record, no payload) and finished at the end; and the content hash of
/// the read-only inputs, started at the same moment.
struct Recorder<'a> {
    config: &'a OperatorConfig,
    args: &'a RunArgs,
    start: RunStart,
    secrets: Vec<String>,
    store: Option<Store>,
    handle: Option<RunHandle>,
    audit_error: Option<String>,
    unhashed_inputs: Option<Vec<(PathBuf, PathBuf)>>,
    input_contents: Option<std::thread::JoinHandle<InputContents>>,
}

impl Recorder<'_> {
    fn begin(&mut self) -> Result<String, String> {
        let begun = self.open_and_begin();
        if let Err(err) = &begun {
            self.audit_error = Some(err.clone());
        }
        begun
    }

    fn open_and_begin(&mut self) -> Result<String, String> {
        let store = self.store.insert(open_store(self.config, self.args)?);
        let handle = store
            .begin_run(self.start.clone(), self.secrets.clone())
            .map_err(|err| err.to_string())?;
        let run_id = handle.run_id();
        self.handle = Some(handle);
        // The cell is cloned: a thread may start now. It reads the inputs while the
        // payload runs (see inputs.rs).
        let state_dir = self.config.state_dir(self.args.state_dir.as_deref());
        self.input_contents = self
            .unhashed_inputs
            .take()
            .filter(|inputs| !inputs.is_empty())
            .map(|inputs| {
                std::thread::spawn(move || crate::inputs::hash_contents(&inputs, &state_dir))
            });
        Ok(run_id)
    }

    /// The store and the run's handle; a run that failed before its cell was released
    /// is recorded now, so it is not lost.
    fn store_and_handle(&mut self) -> Result<(Store, RunHandle), String> {
        let store = match self.store.take() {
            Some(store) => store,
            None => open_store(self.config, self.args)?,
        };
        let handle = match self.handle.take() {
            Some(handle) => handle,
            None => store
                .begin_run(self.start.clone(), self.secrets.clone())
                .map_err(|err| err.to_string())?,
        };
        Ok((store, handle))
    }

    fn input_contents(&mut self) -> Option<InputContents> {
        self.input_contents.take().map(|hashing| {
            hashing.join().unwrap_or_else(|_| InputContents {
                error: Some("hashing the read-only inputs panicked".to_string()),
                ..InputContents::default()
            })
        })
    }
}

pub fn run(args: RunArgs, started: Instant) -> ExitCode {
    let loaded = OperatorConfig::load(args.config.as_deref())
        .and_then(|c| c.host_id_range().map(|range| (c, range)));
    let (config, host_ids) = match loaded {
        Ok(both) => both,
        Err(err) => {
            let error = crate::user_message(&err);
            return refuse(&args, "", ResultClass::RuntimeFault, error, None);
        }
    };
    let prepared = match prepare(&args, &config) {
        Ok(prepared) => prepared,
        Err(code) => return code,
    };
    let Prepared {
        plan,
        credentials,
        stdin,
        stdin_kind,
        start,
        secrets,
    } = prepared;
    let mut recorder = Recorder {
        config: &config,
        args: &args,
        start,
        secrets: secrets.clone(),
        store: None,
        handle: None,
        audit_error: None,
        unhashed_inputs: Some(crate::inputs::readonly_inputs(&plan)),
        input_contents: None,
    };
    let mut proxy = match &plan.network {
        NetworkPlan::Allowlist { destinations } => {
            Some(ProxySession::new(config.egress.clone(), destinations))
        }
        NetworkPlan::Deny => None,
    };
    let artifacts = args.output_dir.as_ref().map(|dir| ArtifactRequest {
        output_dir: dir.clone(),
        max_file_bytes: args.max_artifact_bytes,
        max_total_bytes: args.max_artifact_bytes.saturating_mul(16),
    });
    let mut report = airlock_cell::run_cell(
        &plan,
        RunOptions {
            before_start: Some(&mut || recorder.begin()),
            started,
            egress: proxy.as_mut().map(|p| p as &mut dyn EgressSession),
            artifacts,
            stream_output: true,
            stdin,
            credentials: &credentials,
            host_ids,
        },
    );
    report.stdin = Some(stdin_record(&stdin_kind, report.stdin.take()));
    print_problems(&report);
    if recorder.audit_error.is_some() {
        // No record could be written, so nothing ran.
        let record = result_record(&report, Some(&plan), None);
        if let Err(err) = write_result(&args, &record, &secrets) {
            eprintln!("airlock: {err}");
        }
        return ExitCode::from(125);
    }
    let (store, handle) = match recorder.store_and_handle() {
        Ok(both) => both,
        Err(err) => {
            eprintln!("airlock: {err}");
            return ExitCode::from(125);
        }
    };
    report.run_id = handle.run_id();
    let inputs = recorder.input_contents();
    deliver(&args, &plan, &secrets, &mut report, inputs.as_ref());
    print_summary(&report, &secrets);
    // The plan is already in the run's begin record; the stored result leaves it out, the
    // caller's result file has it.
    let mut stored_result = serde_json::to_value(&report).unwrap_or_default();
    if let Some(inputs) = &inputs {
        stored_result["inputs"] = json!(inputs);
    }
    if let Err(err) = record::finish(&store, &handle, &report, &stored_result) {
        eprintln!(
            "airlock: audit store: the run finished but its record could not be completed: {err}"
        );
        return ExitCode::from(125);
    }
    ExitCode::from(report.exit_code.clamp(0, 255) as u8)
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
fn deliver(
    args: &RunArgs,
    plan: &CellPlan,
    secrets: &[String],
    report: &mut RunReport,
    inputs: Option<&InputContents>,
) {
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
    if let Err(err) = write_result(args, &result_record(report, Some(plan), inputs), secrets) {
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
