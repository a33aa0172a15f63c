//! The result tells the truth (issue 10): every case here was once recorded wrongly. A
//! ceiling that was hit but did not kill is recorded as hit, with the payload's own exit
//! code; a write cut short by `file_size_mb` is the `file_size` ceiling and its artifact
//! is flagged; an artifact that did not leave is said so on stderr; declared outputs
//! written before a memory kill are collected; waiting for stdin and hashing inputs are
//! not start-up; egress denials of a run that exits 0 are summarised on stderr. Plus the
//! `**` output glob and the execute bit of artifacts.
//!
//! Every run has its own state directory: the machine's /var/lib/airlock is shared with
//! binaries of other schemas.

mod common;

use common::CellRun;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// A test's directory with its own state dir; `--output-dir` is `<dir>/out`.
struct Env {
    dir: tempfile::TempDir,
}

impl Env {
    fn new() -> Env {
        Env {
            dir: tempfile::tempdir().unwrap(),
        }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn out(&self) -> PathBuf {
        self.path().join("out")
    }

    fn state(&self) -> String {
        self.path().join("state").display().to_string()
    }

    /// `airlock run --state-dir S [extra] -- argv` under `contract`.
    fn run(&self, contract: &str, extra: &[&str], argv: &[&str]) -> CellRun {
        let state = self.state();
        let mut args = vec!["--state-dir", state.as_str()];
        args.extend_from_slice(extra);
        common::run_in(self.path(), Some(contract), &args, argv)
    }

    /// [`Env::run`] collecting artifacts into [`Env::out`].
    fn run_collecting(&self, contract: &str, extra: &[&str], argv: &[&str]) -> CellRun {
        let out = self.out().display().to_string();
        let mut args = vec!["--output-dir", out.as_str()];
        args.extend_from_slice(extra);
        self.run(contract, &args, argv)
    }
}

fn limits_hit(run: &CellRun) -> Vec<String> {
    run.result["limits_hit"]
        .as_array()
        .unwrap_or_else(|| panic!("no limits_hit in the result\n{}", run.describe()))
        .iter()
        .map(|l| l.as_str().unwrap_or("").to_string())
        .collect()
}

fn kept(run: &CellRun, path: &str) -> Value {
    run.result["artifacts"]["kept"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|a| a["path"] == path)
        .cloned()
        .unwrap_or_else(|| panic!("{path} was not kept\n{}", run.describe()))
}

/// The summary line `airlock run` printed last (`airlock: <status>: exit N; ...`).
fn summary_line(run: &CellRun) -> String {
    let status = run.status().to_string();
    run.stderr()
        .lines()
        .rfind(|l| l.starts_with(&format!("airlock: {status}: exit ")))
        .unwrap_or_else(|| panic!("no summary line on stderr\n{}", run.describe()))
        .to_string()
}

// ---------------------------------------------------------------------------------------
// A ceiling hit is not a ceiling fired.

#[test]
fn a_payload_that_handles_a_refused_thread_keeps_its_exit_code_and_the_pids_hit_is_recorded() {
    require_cells!();
    let env = Env::new();
    let script = "\
import threading, time
threads = []
try:
    for _ in range(50):
        t = threading.Thread(target=time.sleep, args=(0.5,))
        t.start()
        threads.append(t)
except RuntimeError as e:
    print('refused after', len(threads), 'threads:', e)
for t in threads:
    t.join()
";
    let run = env.run(
        "resources:\n  process_limit: 8\n",
        &[],
        &["python3", "-c", script],
    );
    assert!(run.stdout().contains("refused after"), "{}", run.describe());
    assert!(
        run.result["usage"]["pids_limit_hits"].as_u64() > Some(0),
        "{}",
        run.describe()
    );
    assert_eq!(run.code(), 0, "nothing was killed\n{}", run.describe());
    assert_eq!(run.result["exit_code"], 0, "{}", run.describe());
    assert_eq!(run.status(), "ok", "{}", run.describe());
    assert_eq!(run.limit_fired(), None, "{}", run.describe());
    assert_eq!(limits_hit(&run), ["pids"], "{}", run.describe());
    assert!(
        summary_line(&run).contains("limits hit: pids"),
        "{}",
        run.describe()
    );
}

#[test]
fn a_payload_that_fails_after_a_refused_fork_is_the_pids_ceiling_with_its_own_code() {
    require_cells!();
    let env = Env::new();
    let script = "\
import sys, threading, time
try:
    for _ in range(50):
        threading.Thread(target=time.sleep, args=(0.5,), daemon=True).start()
except RuntimeError:
    sys.exit(4)
";
    let run = env.run(
        "resources:\n  process_limit: 8\n",
        &[],
        &["python3", "-c", script],
    );
    assert_eq!(run.status(), "capacity_exceeded", "{}", run.describe());
    assert_eq!(run.limit_fired(), Some("pids"), "{}", run.describe());
    assert_eq!(run.code(), 4, "the payload's own code\n{}", run.describe());
}

// ---------------------------------------------------------------------------------------
// file_size_mb

const FILE_SIZE_CONTRACT: &str = "\
filesystem:
  writable_paths: [output/]
  output_allowlist: [output/*]
resources:
  file_size_mb: 1
";

#[test]
fn a_write_killed_by_file_size_mb_is_the_file_size_ceiling_and_its_artifact_is_flagged() {
    require_cells!();
    let env = Env::new();
    // head is the payload itself: SIGXFSZ kills it at 1 MiB.
    let run = env.run_collecting(
        FILE_SIZE_CONTRACT,
        &[],
        &[
            "/bin/sh",
            "-c",
            "exec head -c 3000000 /dev/zero > /output/big.bin",
        ],
    );
    assert_eq!(
        run.result["exit"]["signal"],
        libc_sigxfsz(),
        "{}",
        run.describe()
    );
    assert_eq!(run.status(), "capacity_exceeded", "{}", run.describe());
    assert_eq!(run.limit_fired(), Some("file_size"), "{}", run.describe());
    assert_eq!(run.code(), 128 + libc_sigxfsz(), "{}", run.describe());
    let artifact = kept(&run, "/output/big.bin");
    assert_eq!(artifact["size_bytes"], 1 << 20, "{}", run.describe());
    assert_eq!(artifact["truncated"], true, "{}", run.describe());
    assert!(
        run.stderr()
            .contains("/output/big.bin is exactly file_size_mb long"),
        "{}",
        run.describe()
    );
}

#[test]
fn a_refused_write_the_payload_survives_is_a_file_size_hit_and_its_artifact_is_flagged() {
    require_cells!();
    let env = Env::new();
    // Python ignores SIGXFSZ: the write fails with EFBIG, which the payload catches.
    let script = "\
try:
    open('/output/big.bin', 'wb').write(b'x' * 3000000)
except OSError as e:
    print('caught', e.errno)
open('/output/small.txt', 'w').write('fits')
";
    let run = env.run_collecting(FILE_SIZE_CONTRACT, &[], &["python3", "-c", script]);
    assert!(run.stdout().contains("caught 27"), "{}", run.describe());
    assert_eq!(run.code(), 0, "{}", run.describe());
    assert_eq!(run.status(), "ok", "{}", run.describe());
    assert_eq!(limits_hit(&run), ["file_size"], "{}", run.describe());
    assert_eq!(
        kept(&run, "/output/big.bin")["truncated"],
        true,
        "{}",
        run.describe()
    );
    assert_eq!(
        kept(&run, "/output/small.txt")["truncated"],
        false,
        "{}",
        run.describe()
    );
    let summary = summary_line(&run);
    assert!(summary.contains("limits hit: file_size"), "{summary}");
    assert!(
        summary.contains("artifacts: 1 possibly cut short by file_size_mb"),
        "{summary}"
    );
}

fn libc_sigxfsz() -> i32 {
    25
}

// ---------------------------------------------------------------------------------------
// Artifacts that do not leave are said so.

#[test]
fn an_artifact_over_its_size_limit_is_reported_on_stderr_not_dropped_silently() {
    require_cells!();
    let env = Env::new();
    let run = env.run_collecting(
        "filesystem:\n  writable_paths: [output/]\n  output_allowlist: [output/*]\n",
        &["--max-artifact-bytes", "10"],
        &[
            "/bin/sh",
            "-c",
            "echo 0123456789abcdef > /output/big.txt; echo ok > /output/small.txt",
        ],
    );
    assert_eq!(run.code(), 0, "{}", run.describe());
    let rejected = &run.result["artifacts"]["rejected"];
    assert_eq!(rejected[0]["path"], "/output/big.txt", "{}", run.describe());
    assert_eq!(
        rejected[0]["reason"],
        "artifact.too_large",
        "{}",
        run.describe()
    );
    assert!(
        run.stderr()
            .contains("airlock: artifact /output/big.txt was not delivered (artifact.too_large)"),
        "{}",
        run.describe()
    );
    assert!(
        summary_line(&run).contains("artifacts: 1 rejected (artifact.too_large x1)"),
        "{}",
        run.describe()
    );
    assert!(!env.out().join("output/big.txt").exists());
    assert!(env.out().join("output/small.txt").exists());
}

// ---------------------------------------------------------------------------------------
// The completion sequence runs after a memory kill.

#[test]
fn declared_outputs_written_before_a_memory_kill_are_collected() {
    require_cells!();
    let contract = "\
filesystem:
  writable_paths: [output/, { path: /tmp, size_mb: 512 }]
  output_allowlist: [output/*]
resources:
  memory_mb: 64
";
    let alloc = "b = bytearray(500 * 2**20)\nfor i in range(0, len(b), 4096): b[i] = 1";
    let cases = [
        // The payload allocates past memory_mb: the OOM killer takes it.
        (
            "an allocation",
            format!("echo before > /output/a.txt; exec python3 -c '{alloc}'"),
        ),
        // tmpfs pages count against memory_mb and no kill frees them: the OOM killer
        // goes on to the cell's pid 1, and nobody is left to report the payload's end.
        (
            "a tmpfs fill",
            "echo before > /output/a.txt; dd if=/dev/zero of=/tmp/fill bs=1M count=300".into(),
        ),
    ];
    for (what, script) in cases {
        let env = Env::new();
        let run = env.run_collecting(contract, &[], &["/bin/sh", "-c", &script]);
        assert_eq!(
            run.status(),
            "capacity_exceeded",
            "{what}\n{}",
            run.describe()
        );
        assert_eq!(
            run.limit_fired(),
            Some("memory"),
            "{what}\n{}",
            run.describe()
        );
        assert_eq!(run.code(), 137, "{what}\n{}", run.describe());
        let artifact = kept(&run, "/output/a.txt");
        assert_eq!(artifact["size_bytes"], 7, "{what}\n{}", run.describe());
        assert_eq!(
            std::fs::read_to_string(env.out().join("output/a.txt")).unwrap(),
            "before\n",
            "{what}"
        );
    }
}

// ---------------------------------------------------------------------------------------
// Start-up is the cell's start only.

#[test]
fn a_slow_stdin_and_a_large_input_are_not_counted_as_startup() {
    require_cells!();
    let env = Env::new();
    // 200 MB of read-only input, never hashed before (a fresh state dir has no cache).
    let input = env.path().join("big.bin");
    let mut file = std::fs::File::create(&input).unwrap();
    let chunk = vec![0x5au8; 1 << 20];
    for _ in 0..200 {
        std::io::Write::write_all(&mut file, &chunk).unwrap();
    }
    drop(file);
    std::fs::write(
        env.path().join("c.yaml"),
        "filesystem:\n  readonly_inputs: [{ source: big.bin, target: /input/big.bin }]\n",
    )
    .unwrap();
    let result = env.path().join("r.json");
    let mut writer = Command::new("/bin/sh")
        .args(["-c", "sleep 3; echo late"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let out = Command::new(common::airlock_bin())
        .current_dir(env.path())
        .args([
            "run",
            "-c",
            "c.yaml",
            "--state-dir",
            &env.state(),
            "--result",
        ])
        .arg(&result)
        .args(["--", "cat"])
        .stdin(Stdio::from(writer.stdout.take().unwrap()))
        .output()
        .unwrap();
    let _ = writer.wait();
    let run = CellRun::collect(out, &result);
    assert_eq!(run.status(), "ok", "{}", run.describe());
    assert_eq!(run.stdout(), "late\n", "{}", run.describe());
    let startup = run.result["timings"]["startup_ms"].as_f64().unwrap();
    assert!(
        startup < 1000.0,
        "stdin or input hashing counted as start-up: {startup} ms\n{}",
        run.describe()
    );
    assert_eq!(
        run.result["inputs"]["bytes"],
        200u64 << 20,
        "the input was hashed, off the start\n{}",
        run.describe()
    );
}

// ---------------------------------------------------------------------------------------
// Denials are never silent.

#[test]
fn a_denied_egress_attempt_followed_by_exit_0_is_summarised_on_stderr() {
    require_cells!();
    let env = Env::new();
    let config = env.path().join("airlock.toml");
    std::fs::write(
        &config,
        "[egress]\nresolve = { \"api.test\" = \"127.0.0.2\", \"evil.test\" = \"127.0.0.2\" }\n",
    )
    .unwrap();
    let contract = "network:\n  mode: allowlist\n  allowed_domains: [\"api.test\"]\n";
    let script = "curl -sS --max-time 5 https://evil.test/ 2>/dev/null; \
                  curl -sS --max-time 5 http://evil.test/ >/dev/null 2>&1; exit 0";
    let run = env.run(
        contract,
        &["--config", config.to_str().unwrap()],
        &["/bin/sh", "-c", script],
    );
    assert_eq!(run.code(), 0, "{}", run.describe());
    assert_eq!(run.status(), "ok", "{}", run.describe());
    let denied = run.result["egress"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["decision"] == "denied")
        .count();
    assert_eq!(
        denied,
        2,
        "the record keeps every attempt\n{}",
        run.describe()
    );
    let summary = summary_line(&run);
    assert_eq!(
        summary,
        "airlock: ok: exit 0; egress: 2 denied (egress.not_allowlisted x2: evil.test)",
        "{}",
        run.describe()
    );
}

#[test]
fn a_run_with_nothing_to_say_prints_no_summary() {
    require_cells!();
    let env = Env::new();
    let run = env.run("{}\n", &[], &["/bin/sh", "-c", "echo hi"]);
    assert_eq!(run.status(), "ok", "{}", run.describe());
    assert!(
        !run.stderr().contains("airlock: ok: exit"),
        "{}",
        run.describe()
    );
}

// ---------------------------------------------------------------------------------------
// Output globs and the execute bit.

#[test]
fn a_double_star_output_glob_keeps_files_at_every_depth() {
    require_cells!();
    let env = Env::new();
    let run = env.run_collecting(
        "filesystem:\n  writable_paths: [output/, tmp/]\n  output_allowlist: [\"output/**\"]\n",
        &[],
        &[
            "/bin/sh",
            "-c",
            "mkdir -p /output/a/b && echo deep > /output/a/b/c.txt && echo top > /output/x \
             && echo no > /tmp/y",
        ],
    );
    assert_eq!(run.status(), "ok", "{}", run.describe());
    for (path, content) in [("output/a/b/c.txt", "deep\n"), ("output/x", "top\n")] {
        kept(&run, &format!("/{path}"));
        assert_eq!(
            std::fs::read_to_string(env.out().join(path)).unwrap(),
            content
        );
    }
    assert!(!env.out().join("tmp").exists(), "{}", run.describe());
}

#[test]
fn an_executable_artifact_stays_executable_for_its_owner_only() {
    use std::os::unix::fs::PermissionsExt;
    require_cells!();
    let env = Env::new();
    let run = env.run_collecting(
        "filesystem:\n  writable_paths: [output/]\n  output_allowlist: [output/*]\n",
        &[],
        &[
            "/bin/sh",
            "-c",
            "printf '#!/bin/sh\\necho ran\\n' > /output/tool.sh && chmod 4755 /output/tool.sh \
             && echo data > /output/data.txt && chmod 0644 /output/data.txt",
        ],
    );
    assert_eq!(run.status(), "ok", "{}", run.describe());
    assert_eq!(kept(&run, "/output/tool.sh")["executable"], true);
    assert_eq!(kept(&run, "/output/data.txt")["executable"], false);
    let mode = |name: &str| {
        std::fs::metadata(env.out().join("output").join(name))
            .unwrap()
            .permissions()
            .mode()
            & 0o7777
    };
    assert_eq!(mode("tool.sh"), 0o700, "no setuid, owner only");
    assert_eq!(mode("data.txt"), 0o600);
    let ran = Command::new(env.out().join("output/tool.sh"))
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&ran.stdout), "ran\n");
}
