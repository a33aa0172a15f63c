//! `airlock run`: contract -> plan -> cell -> result.

use airlock_cell::artifacts::ArtifactRequest;
use airlock_cell::report::{ResultClass, RunReport};
use airlock_cell::RunOptions;
use airlock_contract::{
    compile, default_contract, load_contract_file, CellPlan, CompileInput, ContractError,
};
use clap::Args;
use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

#[derive(Args)]
pub struct RunArgs {
    /// Execution contract (YAML, TOML or JSON). Without it the default contract applies:
    /// no network, read-only root, 16 MiB /tmp, no credentials, conservative limits.
    #[arg(long, short = 'c')]
    contract: Option<PathBuf>,
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
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
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

fn new_run_id() -> String {
    uuid::Uuid::now_v7().to_string()
}

pub fn run(args: RunArgs, started: Instant) -> ExitCode {
    let run_id = new_run_id();
    let plan = match load_plan(&args) {
        Ok(plan) => plan,
        Err(err) => {
            eprintln!("airlock: contract: {err}");
            let status = match err.class() {
                "sandbox_unavailable" => ResultClass::SandboxUnavailable,
                "runtime_fault" => ResultClass::RuntimeFault,
                _ => ResultClass::PolicyDenied,
            };
            let report = RunReport::refused(&run_id, status, err.to_string());
            write_result(&args, &report, None);
            return ExitCode::from(125);
        }
    };
    if let Ok(layout) = airlock_cell::cgroup::CgroupLayout::detect() {
        // Cells of supervisors that died must not keep running or holding resources.
        for left in airlock_cell::cgroup::reap_leftovers(&layout) {
            eprintln!(
                "airlock: warning: could not remove leftover cgroup {}",
                left.display()
            );
        }
    }
    let artifacts = args.output_dir.as_ref().map(|dir| ArtifactRequest {
        output_dir: dir.clone(),
        max_file_bytes: args.max_artifact_bytes,
        max_total_bytes: plan.limits.output_bytes.max(args.max_artifact_bytes),
    });
    let report = airlock_cell::run_cell(
        &plan,
        RunOptions {
            run_id: &run_id,
            started,
            egress: None,
            artifacts,
            stream_output: true,
        },
    );
    if let Some(error) = &report.error {
        eprintln!("airlock: {}: {error}", report.status.as_str());
    }
    write_result(&args, &report, Some(&plan));
    ExitCode::from(report.exit_code.clamp(0, 255) as u8)
}

fn write_result(args: &RunArgs, report: &RunReport, plan: Option<&CellPlan>) {
    let Some(path) = &args.result else { return };
    let mut record = serde_json::to_value(report).unwrap_or_default();
    record["plan"] = json!(plan);
    let text = serde_json::to_string_pretty(&record).unwrap_or_default();
    if let Err(err) = std::fs::write(path, text + "\n") {
        eprintln!("airlock: cannot write result {}: {err}", path.display());
    }
}
