//! Shared helpers of the integration tests: they run the real `airlock` binary and read
//! the result record it writes.
#![allow(dead_code)]

pub mod containerd;
pub mod host;
pub mod images;
pub mod logging_upstream;
pub mod route_probe;
pub mod served;
pub mod test_ca;
pub mod tier;
pub mod upstream;

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// The lowercase hex sha256 of `bytes` (tenant key hashes, artifact digests).
pub fn sha256_hex(bytes: impl AsRef<[u8]>) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(bytes.as_ref()))
}

/// A loopback TCP port free at the moment of the call.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Path of the binary under test.
pub fn airlock_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_airlock"))
}

/// The audit store of this test process's runs. Not the host's default
/// (`/var/lib/airlock`): other airlock binaries on the machine share that one, and a newer
/// one may migrate it to a schema this build refuses, or its load may slow these runs.
/// One per test process, under cargo's per-target scratch directory (or the temp dir
/// when that is not writable, as for a test binary run by another user); those of test
/// processes that have exited are removed on the way.
pub fn state_dir() -> &'static Path {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let name = format!("airlock-state-{}", std::process::id());
        [
            PathBuf::from(env!("CARGO_TARGET_TMPDIR")),
            std::env::temp_dir(),
        ]
        .into_iter()
        .find_map(|scratch| {
            remove_exited_state_dirs(&scratch);
            let dir = scratch.join(&name);
            std::fs::create_dir_all(&dir).ok().map(|_| dir)
        })
        .expect("no writable directory for the tests' state dir")
    })
}

fn remove_exited_state_dirs(scratch: &Path) {
    for entry in std::fs::read_dir(scratch).into_iter().flatten().flatten() {
        let name = entry.file_name();
        let owner = name.to_str().and_then(|n| n.strip_prefix("airlock-state-"));
        if owner.is_some_and(|pid| !Path::new("/proc").join(pid).exists()) {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// Set to skip the tests that need root when not root, knowingly.
pub const ALLOW_SKIP_VAR: &str = "AIRLOCK_ALLOW_SKIPPED_ROOT_TESTS";
/// Set by CI: a test that needs root fails without it, whatever else is set.
pub const REQUIRE_ROOT_VAR: &str = "AIRLOCK_REQUIRE_ROOT_TESTS";

/// What a test that needs root does in a process that is not root.
#[derive(Debug, PartialEq, Eq)]
pub enum WithoutRoot {
    /// Fail, saying why: cargo would count a test that returns early as passed, and a
    /// green run without root must not read as a passed boundary suite.
    Fail(&'static str),
    /// Return early: whoever runs the tests asked for it ([`ALLOW_SKIP_VAR`]).
    Skip,
}

/// The decision for a process that is not root, from the two variables' presence.
pub fn without_root(require_root: bool, allow_skip: bool) -> WithoutRoot {
    match (require_root, allow_skip) {
        (true, _) => WithoutRoot::Fail(
            "this test needs root (it runs cells) and AIRLOCK_REQUIRE_ROOT_TESTS is set",
        ),
        (false, false) => WithoutRoot::Fail(
            "this test needs root (it runs cells): run the tests as root, or set \
             AIRLOCK_ALLOW_SKIPPED_ROOT_TESTS=1 to skip the tests that need root knowingly",
        ),
        (false, true) => WithoutRoot::Skip,
    }
}

fn euid_is_root() -> bool {
    // /proc/self/status carries the effective uid (no libc call, no unsafe).
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with("Uid:"))
        .and_then(|l| l.split_whitespace().nth(2))
        == Some("0")
}

/// Whether the calling test can run cells (they need root). Not root, it fails the test
/// unless [`ALLOW_SKIP_VAR`] asks to skip it (see [`without_root`]).
pub fn cells_available() -> bool {
    if euid_is_root() {
        return true;
    }
    let set = |var| std::env::var_os(var).is_some();
    match without_root(set(REQUIRE_ROOT_VAR), set(ALLOW_SKIP_VAR)) {
        WithoutRoot::Fail(why) => panic!("{why}"),
        WithoutRoot::Skip => {
            eprintln!("SKIPPED (not root, {ALLOW_SKIP_VAR} is set): this test runs cells");
            false
        }
    }
}

/// Returns from the calling test when it cannot run cells and skipping was asked for;
/// fails it when not root otherwise (see [`cells_available`]).
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
    /// The run's supervisor, when the test started it with [`host::run_supervisor`]: it
    /// names the run's cgroups (see [`host::cgroups_of`]).
    pub supervisor: Option<host::Supervisor>,
}

impl CellRun {
    /// The run's output plus the result record it wrote (`Null` when it wrote none).
    pub fn collect(output: Output, result_path: &Path) -> CellRun {
        let result = std::fs::read_to_string(result_path)
            .ok()
            .and_then(|t| serde_json::from_str(&t).ok())
            .unwrap_or(Value::Null);
        CellRun {
            output,
            result,
            supervisor: None,
        }
    }

    /// Runs `cmd` (an `airlock run` writing its result to `result_path`) and collects it,
    /// with its supervisor recorded as this test process's.
    pub fn of(cmd: &mut Command, result_path: &Path) -> CellRun {
        let (output, supervisor) = host::run_supervisor(cmd);
        CellRun {
            supervisor: Some(supervisor),
            ..CellRun::collect(output, result_path)
        }
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
/// to a temp file in `dir`), in `dir`, with stdin from /dev/null, recording the run in
/// [`state_dir`] unless `extra` names another.
pub fn run_in(dir: &Path, contract_yaml: Option<&str>, extra: &[&str], argv: &[&str]) -> CellRun {
    let result_path = dir.join(format!("result-{}.json", unique()));
    let mut cmd = Command::new(airlock_bin());
    cmd.current_dir(dir)
        .arg("run")
        .arg("--result")
        .arg(&result_path);
    if !extra.contains(&"--state-dir") {
        cmd.arg("--state-dir").arg(state_dir());
    }
    if let Some(yaml) = contract_yaml {
        let contract = dir.join(format!("contract-{}.yaml", unique()));
        std::fs::write(&contract, yaml).unwrap();
        cmd.arg("--contract").arg(&contract);
    }
    cmd.args(extra).arg("--").args(argv).stdin(Stdio::null());
    CellRun::of(&mut cmd, &result_path)
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

/// A finished command's exit and output, for an assertion's message.
pub fn output_text(out: &Output) -> String {
    format!(
        "exit {:?}\nstdout: {}\nstderr: {}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The root trees of scripts/test-images.sh (built once, cached under target/): the
/// directory that holds them.
pub fn test_image_trees() -> PathBuf {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/test-images.sh");
    let built = Command::new("bash").arg(script).output().unwrap();
    assert!(
        built.status.success(),
        "{}",
        String::from_utf8_lossy(&built.stderr)
    );
    PathBuf::from(String::from_utf8(built.stdout).unwrap().trim())
}

/// The finished records in the store at `state_dir` whose argv contains `marker`, once
/// there are `count` of them (`airlock runs list --json`, polled for 20 s at most).
#[allow(dead_code)]
pub fn finished_runs(state_dir: &Path, marker: &str, count: usize) -> Vec<Value> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let listed = Command::new(airlock_bin())
            .args(["runs", "list", "--json", "--limit", "50", "--state-dir"])
            .arg(state_dir)
            .output()
            .unwrap();
        let runs: Value = serde_json::from_slice(&listed.stdout).unwrap_or(Value::Null);
        let ended: Vec<Value> = (runs.as_array().into_iter().flatten())
            .filter(|r| r["argv"].to_string().contains(marker) && !r["finished_at"].is_null())
            .cloned()
            .collect();
        if ended.len() >= count {
            return ended;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "not {count} finished: {runs}"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}
