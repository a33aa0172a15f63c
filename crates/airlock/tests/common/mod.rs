//! Shared helpers of the integration tests: they run the real `airlock` binary and read
//! the result record it writes.
#![allow(dead_code)]

pub mod host;

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// Path of the binary under test.
pub fn airlock_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_airlock"))
}

/// Cells need root (or at least a kernel with everything `airlock doctor` checks). CI runs
/// as root and sets AIRLOCK_REQUIRE_ROOT_TESTS=1, which turns a skip into a failure.
pub fn cells_available() -> bool {
    // SAFETY-free check: /proc/self/status carries the effective uid.
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let euid_is_root = status
        .lines()
        .find(|l| l.starts_with("Uid:"))
        .and_then(|l| l.split_whitespace().nth(2))
        == Some("0");
    if euid_is_root {
        return true;
    }
    if std::env::var_os("AIRLOCK_REQUIRE_ROOT_TESTS").is_some() {
        panic!("these tests must run as root (AIRLOCK_REQUIRE_ROOT_TESTS is set)");
    }
    eprintln!("SKIPPED: cell tests need root; run them as root (CI does)");
    false
}

/// Skips the calling test (with a message) when cells cannot run here.
#[macro_export]
macro_rules! require_cells {
    () => {
        if !$crate::common::cells_available() {
            return;
        }
    };
}

/// Result of one `airlock run`.
pub struct CellRun {
    pub output: Output,
    pub result: Value,
}

impl CellRun {
    /// The run's output plus the result record it wrote (`Null` when it wrote none).
    pub fn collect(output: Output, result_path: &Path) -> CellRun {
        let result = std::fs::read_to_string(result_path)
            .ok()
            .and_then(|t| serde_json::from_str(&t).ok())
            .unwrap_or(Value::Null);
        CellRun { output, result }
    }

    pub fn stdout(&self) -> String {
        String::from_utf8_lossy(&self.output.stdout).into_owned()
    }
    pub fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.output.stderr).into_owned()
    }
    pub fn code(&self) -> i32 {
        self.output.status.code().unwrap_or(-1)
    }
    pub fn status(&self) -> &str {
        self.result["status"].as_str().unwrap_or("")
    }
    pub fn limit_fired(&self) -> Option<&str> {
        self.result["limit_fired"].as_str()
    }
    /// Everything about the run, for assertion messages.
    pub fn describe(&self) -> String {
        format!(
            "exit {}\nstdout: {}\nstderr: {}\nresult: {}",
            self.code(),
            self.stdout(),
            self.stderr(),
            serde_json::to_string_pretty(&self.result).unwrap_or_default()
        )
    }
}

/// Runs `airlock run [extra args] -- argv` with an optional contract (YAML text written
/// to a temp file in `dir`), in `dir`, with stdin from /dev/null.
pub fn run_in(dir: &Path, contract_yaml: Option<&str>, extra: &[&str], argv: &[&str]) -> CellRun {
    let result_path = dir.join(format!("result-{}.json", unique()));
    let mut cmd = Command::new(airlock_bin());
    cmd.current_dir(dir)
        .arg("run")
        .arg("--result")
        .arg(&result_path);
    if let Some(yaml) = contract_yaml {
        let contract = dir.join(format!("contract-{}.yaml", unique()));
        std::fs::write(&contract, yaml).unwrap();
        cmd.arg("--contract").arg(&contract);
    }
    cmd.args(extra).arg("--").args(argv).stdin(Stdio::null());
    CellRun::collect(cmd.output().expect("spawn airlock"), &result_path)
}

/// `run_in` with a fresh temporary directory.
pub fn run(contract_yaml: Option<&str>, argv: &[&str]) -> CellRun {
    let dir = tempfile::tempdir().unwrap();
    run_in(dir.path(), contract_yaml, &[], argv)
}

/// `sh -c script` in a cell with the default contract.
pub fn sh(script: &str) -> CellRun {
    run(None, &["/bin/sh", "-c", script])
}

fn unique() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    format!(
        "{}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}
