//! `airlock serve` through the real binary and real clients: curl over the unix socket and
//! TCP, a Python (httpx) client streaming NDJSON and parsing /metrics, every endpoint's
//! denied path, sessions, quotas, SIGKILL and SIGTERM of the server mid-run, and 32
//! clients at once with no record lost.

mod common;

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const ALICE: &str = "alice-key";
const BOB: &str = "bob-key";
const CAROL: &str = "carol-key";

struct Server {
    child: Option<Child>,
    dir: tempfile::TempDir,
    port: u16,
}

impl Server {
    fn start() -> Server {
        let dir = tempfile::tempdir().unwrap();
        let port = common::free_port();
        std::fs::copy(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/contracts/default.yaml"),
            dir.path().join("small.yaml"),
        )
        .unwrap();
        let config = format!(
            r#"[server]
listen = ["unix:{sock}", "tcp:127.0.0.1:{port}"]
max_body_bytes = 65536
max_file_bytes = 65536
body_timeout_ms = 3000
[server.contracts]
small = "small.yaml"
[server.pools]
small = 2
[server.tenants.alice]
api_key_sha256 = ["{alice}"]
max_cells = 40
runs_per_minute = 1000
[server.tenants.bob]
api_key_sha256 = ["{bob}"]
[server.tenants.carol]
api_key_sha256 = ["{carol}"]
runs_per_minute = 2
max_sessions = 1
[policy]
approvers = ["tenant:bob"]
[policy.classes.fetch]
description = "a session whose destinations change (docs/api.md)"
[policy.classes.fetch.template.network]
mode = "allowlist"
allowed_domains = ["api.test:8080"]
[policy.classes.fetch.bounds]
requestable_domains = ["files.test:8080"]
session = {{ allowed = true, max_lifetime_seconds = 600 }}
[policy.classes.fetch.commands]
unmatched = "allow"
"#,
            sock = dir.path().join("airlock.sock").display(),
            alice = common::sha256_hex(ALICE),
            bob = common::sha256_hex(BOB),
            carol = common::sha256_hex(CAROL),
        );
        std::fs::write(dir.path().join("airlock.toml"), config).unwrap();
        let mut server = Server {
            child: None,
            dir,
            port,
        };
        server.spawn();
        server
    }

    fn spawn(&mut self) {
        let _ = std::fs::remove_file(self.sock());
        let child = Command::new(common::airlock_bin())
            .arg("serve")
            .arg("--config")
            .arg(self.dir.path().join("airlock.toml"))
            .arg("--state-dir")
            .arg(self.state_dir())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(self.dir.path().join("serve.log")).unwrap())
            .spawn()
            .unwrap();
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if self.curl_unix(&["http://airlock/healthz"]).status.success() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("the server did not answer: {}", self.log());
    }

    fn sock(&self) -> PathBuf {
        self.dir.path().join("airlock.sock")
    }

    fn state_dir(&self) -> PathBuf {
        self.dir.path().join("state")
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("serve.log")).unwrap_or_default()
    }

    fn curl_unix(&self, args: &[&str]) -> Output {
        Command::new("curl")
            .args(["-sS", "--max-time", "120", "--unix-socket"])
            .arg(self.sock())
            .args(args)
            .output()
            .unwrap()
    }

    /// `curl` over TCP as the tenant of `key`: (HTTP status, body).
    fn tcp(&self, key: &str, method: &str, path: &str, body: Option<&str>) -> (u16, String) {
        let mut cmd = Command::new("curl");
        cmd.args([
            "-sS",
            "--max-time",
            "120",
            "-w",
            "\n%{http_code}",
            "-X",
            method,
        ]);
        cmd.args(["-H", &format!("Authorization: Bearer {key}")]);
        if let Some(body) = body {
            cmd.args([
                "-H",
                "content-type: application/json",
                "--data-binary",
                body,
            ]);
        }
        cmd.arg(format!("http://127.0.0.1:{}{path}", self.port));
        split_status(&cmd.output().unwrap())
    }

    fn signal(&mut self, signal: i32) -> std::process::ExitStatus {
        let mut child = self.child.take().unwrap();
        Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(child.id().to_string())
            .status()
            .unwrap();
        child.wait().unwrap()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn split_status(output: &Output) -> (u16, String) {
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", &text));
    (code.trim().parse().unwrap_or(0), body.to_string())
}

fn json(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"))
}

fn frames(text: &str) -> Vec<Value> {
    text.lines().filter(|l| !l.is_empty()).map(json).collect()
}

fn run_body(argv: &[&str]) -> String {
    serde_json::json!({"contract": "small", "argv": argv}).to_string()
}

/// Whether a process whose command line contains `marker` lives.
fn process_with(marker: &str) -> bool {
    std::fs::read_dir("/proc").unwrap().flatten().any(|entry| {
        std::fs::read(entry.path().join("cmdline"))
            .map(|c| {
                String::from_utf8_lossy(&c)
                    .replace('\0', " ")
                    .contains(marker)
            })
            .unwrap_or(false)
    })
}

fn wait_until(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn runs_stream_over_both_listeners_and_tenants_see_only_their_own() {
    require_cells!();
    let server = Server::start();
    // The unix socket, as root: the operator tenant.
    let out = server.curl_unix(&[
        "-N",
        "-H",
        "content-type: application/json",
        "--data-binary",
        &run_body(&["sh", "-c", "echo hi; echo err >&2; exit 3"]),
        "http://airlock/v1/runs",
    ]);
    let got = frames(&String::from_utf8_lossy(&out.stdout));
    let types: Vec<&str> = got.iter().map(|f| f["type"].as_str().unwrap()).collect();
    // stdout and stderr are two pipes: their frames may come in either order.
    assert_eq!(types.len(), 5, "{got:?}");
    assert_eq!(
        (types[0], types[3], types[4]),
        ("start", "exit", "result"),
        "{got:?}"
    );
    let data = |stream: &str| -> String {
        got.iter()
            .filter(|f| f["type"] == stream)
            .map(|f| f["data"].as_str().unwrap())
            .collect()
    };
    assert_eq!(
        (data("stdout"), data("stderr")),
        ("hi\n".into(), "err\n".into())
    );
    assert_eq!(got[3]["exit_code"], 3);
    assert_eq!(got[4]["record"]["status"], "task_error");
    let operator_run = got[0]["run_id"].as_str().unwrap().to_string();

    // TCP with alice's key, ?wait=true: the record only.
    let (code, body) = server.tcp(
        ALICE,
        "POST",
        "/v1/runs?wait=true",
        Some(&run_body(&["echo", "x"])),
    );
    assert_eq!(code, 200, "{body}");
    let record = json(&body);
    assert_eq!(record["status"], "ok");
    let alice_run = record["run_id"].as_str().unwrap().to_string();

    let (code, body) = server.tcp(ALICE, "GET", &format!("/v1/runs/{alice_run}"), None);
    assert_eq!(code, 200, "{body}");
    assert_eq!(json(&body)["run"]["tenant"], "alice");
    // Another tenant's run is not found, whether it exists or not.
    let (code, body) = server.tcp(BOB, "GET", &format!("/v1/runs/{alice_run}"), None);
    assert_eq!(
        (code, json(&body)["reason"].clone()),
        (404, "not_found".into())
    );
    let (code, _) = server.tcp(ALICE, "GET", &format!("/v1/runs/{operator_run}"), None);
    assert_eq!(code, 404);
    let (code, body) = server.tcp(BOB, "GET", "/v1/runs", None);
    assert_eq!(code, 200);
    assert_eq!(json(&body)["runs"].as_array().unwrap().len(), 0, "{body}");
    let (_, body) = server.tcp(ALICE, "GET", "/v1/runs?status=ok", None);
    let runs = json(&body)["runs"].as_array().unwrap().clone();
    assert!(
        runs.iter()
            .all(|r| r["tenant"] == "alice" && r["status"] == "ok"),
        "{runs:?}"
    );
    assert!(!runs.is_empty());

    // Wrong key, no key over TCP.
    let (code, body) = server.tcp("wrong", "GET", "/v1/runs", None);
    assert_eq!(
        (code, json(&body)["reason"].clone()),
        (401, "auth.bad_key".into())
    );
    let out = Command::new("curl")
        .args(["-sS", "-w", "\n%{http_code}"])
        .arg(format!("http://127.0.0.1:{}/v1/runs", server.port))
        .output()
        .unwrap();
    let (code, body) = split_status(&out);
    assert_eq!(
        (code, json(&body)["reason"].clone()),
        (401, "auth.missing_key".into())
    );

    // An inline contract needs the tenant's permission; an unknown one is refused and
    // recorded.
    let inline = r#"{"contract_inline": {"image": "host"}, "argv": ["true"]}"#;
    let (code, body) = server.tcp(ALICE, "POST", "/v1/runs", Some(inline));
    assert_eq!(
        (code, json(&body)["reason"].clone()),
        (403, "contract.inline_not_allowed".into())
    );
    assert!(
        json(&body)["run_id"].is_string(),
        "the refusal is recorded: {body}"
    );
    let (code, body) = server.tcp(
        ALICE,
        "POST",
        "/v1/runs",
        Some(r#"{"contract": "nope", "argv": ["true"]}"#),
    );
    assert_eq!(
        (code, json(&body)["reason"].clone()),
        (400, "contract.unknown".into())
    );

    // airlock's own variables are not a request's to set.
    let env = r#"{"contract": "small", "argv": ["true"], "env": {"HTTP_PROXY": "http://x.test"}}"#;
    let (code, body) = server.tcp(ALICE, "POST", "/v1/runs", Some(env));
    assert_eq!(
        (code, json(&body)["reason"].clone()),
        (422, "request.env_reserved".into())
    );

    // Oversized and malformed bodies.
    let big = run_body(&[&"x".repeat(100_000)]);
    let (code, _) = server.tcp(ALICE, "POST", "/v1/runs", Some(&big));
    assert_eq!(code, 413);
    let (code, body) = server.tcp(ALICE, "POST", "/v1/runs", Some("{not json"));
    assert_eq!(
        (code, json(&body)["class"].clone()),
        (400, "policy_denied".into())
    );

    let (code, body) = server.tcp(ALICE, "GET", "/v1/audit/verify", None);
    assert_eq!(code, 200, "{body}");
    assert_eq!(json(&body)["ok"], true);
}

#[test]
fn a_python_client_streams_ndjson_and_parses_the_metrics() {
    require_cells!();
    let server = Server::start();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/serve/client.py");
    let out = Command::new("python3")
        .arg(script)
        .arg(server.sock())
        .arg(ALICE)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let seen = json(String::from_utf8_lossy(&out.stdout).trim());
    assert_eq!(seen["types"][0], "start");
    assert_eq!(seen["stdout"], "one\n");
    assert_eq!(seen["exit_code"], 4);
    assert_eq!(seen["task_errors"], 1.0);
    let parsed: Vec<&str> = seen["families"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f.as_str().unwrap())
        .collect();
    for family in [
        "airlock_runs",
        "airlock_start_latency_seconds",
        "airlock_cells_alive",
        "airlock_pool_free",
    ] {
        assert!(parsed.contains(&family), "{family} not parsed: {parsed:?}");
    }
    let families: Vec<&str> = seen["declared"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f.as_str().unwrap())
        .collect();
    // Cleanup failures cannot be provoked from here: crates/server/src/metrics.rs tests
    // that family.
    for family in [
        "airlock_runs",
        "airlock_start_latency_seconds",
        "airlock_wall_time_seconds",
        "airlock_denials",
        "airlock_deadline_kills",
        "airlock_ceilings_fired",
        "airlock_pool_size",
        "airlock_pool_free",
        "airlock_sessions_active",
        "airlock_cells_alive",
    ] {
        assert!(
            families.contains(&family),
            "{family} missing from {families:?}"
        );
    }
}

#[test]
fn a_sessions_files_and_commands_persist_until_delete_and_never_leave_its_writable_paths() {
    require_cells!();
    let server = Server::start();
    let (code, body) = server.tcp(
        ALICE,
        "POST",
        "/v1/sessions",
        Some(r#"{"contract": "small"}"#),
    );
    assert_eq!(code, 201, "{body}");
    let session = json(&body);
    let id = session["session_id"].as_str().unwrap().to_string();
    assert!(
        session["writable_paths"]
            .as_array()
            .unwrap()
            .contains(&"/tmp".into()),
        "{session}"
    );
    let base = format!("/v1/sessions/{id}");

    // A file put by the client is read by a command, a file a command wrote is read back.
    let put = Command::new("curl")
        .args([
            "-sS",
            "-w",
            "\n%{http_code}",
            "-X",
            "PUT",
            "-H",
            &format!("Authorization: Bearer {ALICE}"),
        ])
        .args(["--data-binary", "from the client"])
        .arg(format!(
            "http://127.0.0.1:{}{base}/files/tmp/in.txt",
            server.port
        ))
        .output()
        .unwrap();
    assert_eq!(split_status(&put).0, 201, "{:?}", put);
    let exec = |argv: &[&str], background: bool| {
        let body = serde_json::json!({"argv": argv, "background": background}).to_string();
        server.tcp(ALICE, "POST", &format!("{base}/exec"), Some(&body))
    };
    let (code, body) = exec(&["sh", "-c", "cat /tmp/in.txt; stat -c %u /tmp/in.txt; echo made > /tmp/out.txt; ln -s /etc /tmp/etc-link; ln -s ../../../../etc/passwd /tmp/up-link"], false);
    assert_eq!(code, 200, "{body}");
    let got = frames(&body);
    let stdout: String = got
        .iter()
        .filter(|f| f["type"] == "stdout")
        .map(|f| f["data"].as_str().unwrap())
        .collect();
    assert!(stdout.starts_with("from the client"), "{stdout}");
    // The file is the cell identity's, as the payload sees it.
    assert!(stdout.contains("10001"), "{stdout}");
    let (code, body) = server.tcp(ALICE, "GET", &format!("{base}/files/tmp/out.txt"), None);
    assert_eq!((code, body.as_str()), (200, "made\n"));
    let (code, body) = server.tcp(ALICE, "GET", &format!("{base}/files?dir=/tmp"), None);
    assert_eq!(code, 200, "{body}");
    let names: Vec<String> = json(&body)["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap().to_string())
        .collect();
    assert!(
        names.contains(&"out.txt".to_string()) && names.contains(&"in.txt".to_string()),
        "{names:?}"
    );

    // Paths that try to leave: `..`, symlinks planted by the payload, outside the
    // writable paths, a symlink as the last component of a write.
    let (code, body) = server.tcp(
        ALICE,
        "GET",
        &format!("{base}/files/tmp/..%2Fetc%2Fpasswd"),
        None,
    );
    assert!(code == 400 || code == 404, "{code} {body}");
    assert!(!body.contains("root:"), "{body}");
    let (code, body) = server.tcp(
        ALICE,
        "GET",
        &format!("{base}/files/tmp/etc-link/passwd"),
        None,
    );
    assert_eq!(
        (code, json(&body)["reason"].clone()),
        (403, "path.escapes".into()),
        "the symlink resolves as in the cell, to its read-only /etc: {body}"
    );
    let (code, body) = server.tcp(ALICE, "GET", &format!("{base}/files/tmp/up-link"), None);
    assert_eq!(
        (code, json(&body)["reason"].clone()),
        (400, "path.kind".into()),
        "a symlink as the last component is not followed: {body}"
    );
    let (code, body) = server.tcp(ALICE, "GET", &format!("{base}/files/etc/passwd"), None);
    assert_eq!(
        (code, json(&body)["reason"].clone()),
        (403, "path.not_writable".into())
    );
    let put_link = Command::new("curl")
        .args([
            "-sS",
            "-w",
            "\n%{http_code}",
            "-X",
            "PUT",
            "-H",
            &format!("Authorization: Bearer {ALICE}"),
        ])
        .args(["--data-binary", "x"])
        .arg(format!(
            "http://127.0.0.1:{}{base}/files/tmp/etc-link/evil",
            server.port
        ))
        .output()
        .unwrap();
    assert_eq!(split_status(&put_link).0, 403, "{put_link:?}");
    assert!(!Path::new("/etc/evil").exists());
    // A file larger than max_file_bytes.
    let big = Command::new("curl")
        .args([
            "-sS",
            "-w",
            "\n%{http_code}",
            "-X",
            "PUT",
            "-H",
            &format!("Authorization: Bearer {ALICE}"),
        ])
        .args(["--data-binary", &"y".repeat(70_000)])
        .arg(format!(
            "http://127.0.0.1:{}{base}/files/tmp/big",
            server.port
        ))
        .output()
        .unwrap();
    let (code, body) = split_status(&big);
    assert_eq!(
        (code, json(&body)["reason"].clone()),
        (413, "file.too_large".into())
    );

    // Another tenant sees nothing of it.
    for path in [
        base.clone(),
        format!("{base}/files/tmp/out.txt"),
        format!("{base}/commands/1"),
    ] {
        assert_eq!(server.tcp(BOB, "GET", &path, None).0, 404, "{path}");
    }
    assert_eq!(
        server
            .tcp(
                BOB,
                "POST",
                &format!("{base}/exec"),
                Some(r#"{"argv":["true"]}"#)
            )
            .0,
        404
    );
    assert_eq!(server.tcp(BOB, "DELETE", &base, None).0, 404);

    // A background command: its output followed, then killed.
    let (code, body) = exec(&["sh", "-c", "echo started; exec sleep 600"], true);
    assert_eq!(code, 202, "{body}");
    let cid = json(&body)["command_id"].as_u64().unwrap();
    wait_until("the background command's output", || {
        let (_, out) = server.tcp(ALICE, "GET", &format!("{base}/commands/{cid}/output"), None);
        out.contains("started")
    });
    let (code, _) = server.tcp(
        ALICE,
        "POST",
        &format!("{base}/commands/{cid}/signal"),
        Some(r#"{"signal":"KILL"}"#),
    );
    assert_eq!(code, 204);
    let (_, out) = server.tcp(
        ALICE,
        "GET",
        &format!("{base}/commands/{cid}/output?follow=true"),
        None,
    );
    let last = frames(&out);
    assert_eq!(last.last().unwrap()["type"], "result", "{out}");
    let (_, body) = server.tcp(ALICE, "GET", &format!("{base}/commands/{cid}"), None);
    assert_eq!(json(&body)["running"], false);

    // TERM reaches the command's own handler (other signals than KILL are delivered);
    // a signal outside the set, and another tenant's signal, are refused.
    let trap = "trap 'echo got-term; exit 7' TERM; echo ready; while :; do sleep 0.1; done";
    let (code, body) = exec(&["sh", "-c", trap], true);
    assert_eq!(code, 202, "{body}");
    let cid = json(&body)["command_id"].as_u64().unwrap();
    let signal_path = format!("{base}/commands/{cid}/signal");
    wait_until("the trapping command is ready", || {
        let (_, out) = server.tcp(ALICE, "GET", &format!("{base}/commands/{cid}/output"), None);
        out.contains("ready")
    });
    let (code, body) = server.tcp(ALICE, "POST", &signal_path, Some(r#"{"signal":"SYS"}"#));
    assert_eq!(
        (code, json(&body)["reason"].clone()),
        (400, "signal.unsupported".into()),
        "{body}"
    );
    let (code, _) = server.tcp(BOB, "POST", &signal_path, Some(r#"{"signal":"TERM"}"#));
    assert_eq!(code, 404, "another tenant's command");
    let (code, body) = server.tcp(ALICE, "POST", &signal_path, Some(r#"{"signal":"SIGTERM"}"#));
    assert_eq!(code, 204, "{body}");
    let (_, out) = server.tcp(
        ALICE,
        "GET",
        &format!("{base}/commands/{cid}/output?follow=true"),
        None,
    );
    assert!(out.contains("got-term"), "the trap ran: {out}");
    let exit = frames(&out)
        .into_iter()
        .find(|f| f["type"] == "exit")
        .unwrap_or_else(|| panic!("an exit frame: {out}"));
    assert_eq!(exit["exit_code"], 7, "{exit}");

    let (code, body) = server.tcp(
        ALICE,
        "POST",
        &format!("{base}/timeout"),
        Some(r#"{"idle_timeout_s": 999999}"#),
    );
    assert_eq!(
        (code, json(&body)["reason"].clone()),
        (400, "session.timeout_out_of_range".into())
    );
    let (code, _) = server.tcp(
        ALICE,
        "POST",
        &format!("{base}/timeout"),
        Some(r#"{"idle_timeout_s": 600}"#),
    );
    assert_eq!(code, 200);

    // DELETE: the record, and then nothing of the session.
    let (code, body) = server.tcp(ALICE, "DELETE", &base, None);
    assert_eq!(code, 200, "{body}");
    assert_eq!(json(&body)["run_id"], id.as_str());
    assert_eq!(
        server
            .tcp(ALICE, "GET", &format!("{base}/files/tmp/out.txt"), None)
            .0,
        404
    );
    assert_eq!(server.tcp(ALICE, "GET", &base, None).0, 404);
    let (_, body) = server.tcp(ALICE, "GET", &format!("/v1/runs/{id}"), None);
    assert_ne!(json(&body)["run"]["status"], "running", "{body}");
}

#[test]
fn quotas_answer_429_with_retry_after() {
    require_cells!();
    let server = Server::start();
    let body = run_body(&["true"]);
    for _ in 0..2 {
        assert_eq!(
            server
                .tcp(CAROL, "POST", "/v1/runs?wait=true", Some(&body))
                .0,
            200
        );
    }
    let out = Command::new("curl")
        .args([
            "-sS",
            "-i",
            "-H",
            &format!("Authorization: Bearer {CAROL}"),
            "-H",
            "content-type: application/json",
        ])
        .args(["--data-binary", &body])
        .arg(format!("http://127.0.0.1:{}/v1/runs", server.port))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_lowercase();
    assert!(text.starts_with("http/1.1 429"), "{text}");
    assert!(text.contains("retry-after: "), "{text}");
    assert!(text.contains("quota.runs_per_minute"), "{text}");
    // Another tenant is not affected.
    assert_eq!(
        server.tcp(BOB, "POST", "/v1/runs?wait=true", Some(&body)).0,
        200
    );
}

#[test]
fn sigkill_of_the_server_leaves_no_cell_and_its_runs_are_aborted_at_restart() {
    require_cells!();
    let mut server = Server::start();
    let marker = format!("{}.{}", 300 + std::process::id() % 100, 7331);
    let mut streaming = Command::new("curl")
        .args([
            "-sS",
            "-N",
            "-H",
            &format!("Authorization: Bearer {ALICE}"),
            "-H",
            "content-type: application/json",
        ])
        .args(["--data-binary", &run_body(&["sleep", &marker])])
        .arg(format!("http://127.0.0.1:{}/v1/runs", server.port))
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    wait_until("the payload to start", || {
        process_with(&format!("sleep {marker}"))
    });
    let (_, body) = server.tcp(ALICE, "GET", "/v1/runs?status=running", None);
    let run_id = json(&body)["runs"][0]["run_id"]
        .as_str()
        .unwrap()
        .to_string();
    server.signal(9);
    wait_until("the cell to die with its server", || {
        !process_with(&format!("sleep {marker}"))
    });
    let _ = streaming.wait();
    server.spawn();
    let (_, body) = server.tcp(ALICE, "GET", &format!("/v1/runs/{run_id}"), None);
    assert_eq!(json(&body)["run"]["status"], "aborted", "{body}");
}

#[test]
fn sigterm_drains_running_commands_and_sessions_then_exits() {
    require_cells!();
    let mut server = Server::start();
    let (_, body) = server.tcp(
        ALICE,
        "POST",
        "/v1/sessions",
        Some(r#"{"contract": "small"}"#),
    );
    let session = json(&body)["session_id"].as_str().unwrap().to_string();
    let streaming = Command::new("curl")
        .args([
            "-sS",
            "-N",
            "-H",
            &format!("Authorization: Bearer {ALICE}"),
            "-H",
            "content-type: application/json",
        ])
        .args([
            "--data-binary",
            &run_body(&["sh", "-c", "echo begun; sleep 2; echo finished"]),
        ])
        .arg(format!("http://127.0.0.1:{}/v1/runs", server.port))
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    wait_until("the run to start", || {
        let (_, body) = server.tcp(ALICE, "GET", "/v1/runs?status=running&class=small", None);
        json(&body)["runs"].as_array().unwrap().len() >= 2
    });
    let status = server.signal(15);
    assert!(status.success(), "{status:?}: {}", server.log());
    let out = streaming.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("finished"),
        "the run finished during the drain: {text}"
    );
    assert!(text.contains(r#""type":"result""#), "{text}");
    server.spawn();
    let (_, body) = server.tcp(ALICE, "GET", &format!("/v1/runs/{session}"), None);
    let status = json(&body)["run"]["status"].clone();
    assert!(
        status != "running" && status != "aborted",
        "the drain closed the session: {body}"
    );
}

#[test]
fn thirty_two_clients_at_once_lose_no_record_and_the_chain_verifies() {
    require_cells!();
    let server = Server::start();
    let port = server.port;
    let clients: Vec<_> = (0..32)
        .map(|i| {
            std::thread::spawn(move || {
                let out = Command::new("curl")
                    .args(["-sS", "--max-time", "300", "-w", "\n%{http_code}"])
                    .args([
                        "-H",
                        &format!("Authorization: Bearer {ALICE}"),
                        "-H",
                        "content-type: application/json",
                    ])
                    .args([
                        "--data-binary",
                        &run_body(&["echo", &format!("client-{i}")]),
                    ])
                    .arg(format!("http://127.0.0.1:{port}/v1/runs?wait=true"))
                    .output()
                    .unwrap();
                split_status(&out)
            })
        })
        .collect();
    let mut ids = std::collections::BTreeSet::new();
    for client in clients {
        let (code, body) = client.join().unwrap();
        assert_eq!(code, 200, "{body}");
        let record = json(&body);
        assert_eq!(record["status"], "ok", "{body}");
        ids.insert(record["run_id"].as_str().unwrap().to_string());
    }
    assert_eq!(ids.len(), 32);
    let (_, body) = server.tcp(ALICE, "GET", "/v1/runs?limit=1000", None);
    let stored: std::collections::BTreeSet<String> = json(&body)["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["run_id"].as_str().unwrap().to_string())
        .collect();
    assert!(ids.is_subset(&stored), "records lost");
    let verify = Command::new(common::airlock_bin())
        .args(["audit", "--state-dir"])
        .arg(server.state_dir())
        .arg("verify")
        .output()
        .unwrap();
    assert!(
        verify.status.success(),
        "{}",
        String::from_utf8_lossy(&verify.stderr)
    );
}

/// The shell examples of docs/api.md, in order, in one shell with `set -e`.
fn api_doc_examples() -> String {
    let doc =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/api.md"))
            .unwrap();
    let mut script = String::new();
    let mut inside = false;
    for line in doc.lines() {
        match (inside, line.trim_end()) {
            (false, "```sh") => inside = true,
            (true, "```") => inside = false,
            (true, code) => {
                script.push_str(code);
                script.push('\n');
            }
            _ => {}
        }
    }
    script
}

#[test]
fn the_curl_examples_of_the_api_document_work() {
    require_cells!();
    let server = Server::start();
    let script = api_doc_examples();
    assert!(script.matches("curl").count() >= 15, "{script}");
    let out = Command::new("bash")
        .args(["-euo", "pipefail", "-c", &script])
        .env("SOCK", server.sock())
        .env("URL", format!("http://127.0.0.1:{}", server.port))
        .env("KEY", ALICE)
        .current_dir(server.dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "docs/api.md examples failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn airlock_run_is_handed_to_the_running_service_and_recorded_there() {
    require_cells!();
    let server = Server::start();
    let dir = tempfile::tempdir().unwrap();
    let run = |args: &[&str]| {
        Command::new(common::airlock_bin())
            .arg("run")
            .args(args)
            .current_dir(dir.path())
            .env("AIRLOCK_SOCKET", server.sock())
            .stdin(Stdio::null())
            .output()
            .unwrap()
    };
    let out = run(&[
        "-v",
        "--",
        "/bin/sh",
        "-c",
        "echo handed; echo err >&2; exit 3",
    ]);
    let text = common::output_text(&out);
    assert_eq!(out.status.code(), Some(3), "{text}\n{}", server.log());
    assert_eq!(String::from_utf8_lossy(&out.stdout), "handed\n", "{text}");
    assert!(text.contains("handed to the service"), "{text}");
    // The record is the service's, in its store, as the operator tenant (uid 0).
    let listed = Command::new(common::airlock_bin())
        .args(["runs", "list", "--json", "--all-users", "--state-dir"])
        .arg(server.state_dir())
        .output()
        .unwrap();
    let listed = String::from_utf8_lossy(&listed.stdout).to_string();
    assert!(listed.contains("/bin/sh"), "{listed}");
    // HTTP on the same socket still works beside it.
    assert!(server
        .curl_unix(&["http://airlock/healthz"])
        .status
        .success());
}

#[test]
fn the_service_offers_the_tools_over_mcp_to_tenant_keys_only() {
    require_cells!();
    let server = Server::start();
    let initialize = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"curl","version":"1"}}}"#;
    let post = |key: Option<&str>| {
        let mut cmd = Command::new("curl");
        cmd.args([
            "-sS",
            "--max-time",
            "60",
            "-w",
            "\n%{http_code}",
            "-X",
            "POST",
        ]);
        cmd.args(["-H", "content-type: application/json"]);
        cmd.args(["-H", "accept: application/json, text/event-stream"]);
        if let Some(key) = key {
            cmd.args(["-H", &format!("Authorization: Bearer {key}")]);
        }
        cmd.args(["--data-binary", initialize]);
        cmd.arg(format!("http://127.0.0.1:{}/mcp", server.port));
        split_status(&cmd.output().unwrap())
    };
    let (status, body) = post(Some(ALICE));
    assert_eq!(status, 200, "{body}\n{}", server.log());
    assert!(body.contains("serverInfo"), "{body}");
    let (status, body) = post(None);
    assert_eq!(status, 401, "{body}");
    let (status, body) = post(Some("not-a-tenant-key-at-all"));
    assert_eq!(status, 401, "{body}");
}

#[test]
fn registry_tools_are_called_over_http_with_the_tool_protocol() {
    require_cells!();
    let server = Server::start();
    let config = std::fs::read_to_string(server.dir.path().join("airlock.toml")).unwrap();
    assert!(
        !config.contains("[tools"),
        "the test server has no tools configured"
    );
    // No such tool: the protocol's refusal, recorded, no cell; and keys are required.
    let call = |key: &str| {
        server.tcp(
            key,
            "POST",
            "/v1/tools/no_such_tool/call",
            Some(r#"{"q": 1}"#),
        )
    };
    let (status, body) = call(ALICE);
    assert_eq!(status, 200, "{body}\n{}", server.log());
    let answer = json(&body);
    assert_eq!(answer["reply"]["ok"], false, "{body}");
    assert!(
        answer["reply"]["run_id"]
            .as_str()
            .is_some_and(|id| !id.is_empty()),
        "{body}"
    );
    assert_eq!(answer["meta"]["result_class"], "policy_denied", "{body}");
    let (status, _) = call("not-a-tenant-key-at-all");
    assert_eq!(status, 401);
}

#[test]
fn the_examples_db_query_tool_answers_over_the_service() {
    require_cells!();
    // The example registry (examples/tools) with a [server] section added.
    let dir = tempfile::tempdir().unwrap();
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/tools");
    let copied = Command::new("cp")
        .arg("-r")
        .arg(format!("{}/.", examples.display()))
        .arg(dir.path())
        .status()
        .unwrap();
    assert!(copied.success());
    let port = common::free_port();
    let mut config = std::fs::read_to_string(dir.path().join("airlock.toml")).unwrap();
    config.push_str(&format!(
        "\n[server]\nlisten = [\"unix:{}\", \"tcp:127.0.0.1:{port}\"]\n[server.tenants.alice]\napi_key_sha256 = [\"{}\"]\n",
        dir.path().join("airlock.sock").display(),
        common::sha256_hex(ALICE),
    ));
    std::fs::write(dir.path().join("airlock.toml"), config).unwrap();
    let mut server = Server {
        child: None,
        dir,
        port,
    };
    server.spawn();
    let input = r#"{"query": "SELECT name, stock FROM items ORDER BY stock DESC", "max_rows": 2}"#;
    let (status, body) = server.tcp(ALICE, "POST", "/v1/tools/db_query/call", Some(input));
    assert_eq!(status, 200, "{body}\n{}", server.log());
    let answer = json(&body);
    assert_eq!(answer["reply"]["ok"], true, "{body}\n{}", server.log());
    assert_eq!(
        answer["reply"]["output"]["rows"].as_array().map(Vec::len),
        Some(2),
        "{body}"
    );
    assert_eq!(answer["meta"]["result_class"], "ok", "{body}");
    // Input that breaks the schema never reaches a cell.
    let (_, body) = server.tcp(
        ALICE,
        "POST",
        "/v1/tools/db_query/call",
        Some(r#"{"query": ""}"#),
    );
    let refused = json(&body);
    assert_eq!(refused["reply"]["ok"], false, "{refused}");
    assert_eq!(
        refused["meta"]["result_class"], "policy_denied",
        "{refused}"
    );
}

/// Writes `parts` of one HTTP request to the server's TCP port, `pause` apart, and reads
/// the whole answer (the server closes the connection).
fn slow_request(server: &Server, parts: &[&[u8]], pause: Duration) -> String {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", server.port)).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    for (n, part) in parts.iter().enumerate() {
        if n > 0 {
            std::thread::sleep(pause);
        }
        stream.write_all(part).unwrap();
    }
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer);
    String::from_utf8_lossy(&answer).into_owned()
}

fn run_count(server: &Server) -> usize {
    let (status, body) = server.tcp(ALICE, "GET", "/v1/runs", None);
    assert_eq!(status, 200, "{body}");
    json(&body)["runs"].as_array().unwrap().len()
}

#[test]
fn a_body_that_does_not_arrive_in_time_is_answered_408_and_starts_no_cell() {
    require_cells!();
    let server = Server::start();
    let body = br#"{"contract": "small", "argv": ["/bin/echo", "slow-body"]}"#;
    let head = format!(
        "POST /v1/runs?wait=true HTTP/1.1\r\nHost: airlock\r\nAuthorization: Bearer {ALICE}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    // Within the bound (3 s), a body sent in pieces is served.
    let (first, rest) = body.split_at(20);
    let answer = slow_request(
        &server,
        &[head.as_bytes(), first, rest],
        Duration::from_millis(300),
    );
    assert!(
        answer.starts_with("HTTP/1.1 200"),
        "{answer}\n{}",
        server.log()
    );
    assert!(answer.contains("\"status\":\"ok\""), "{answer}");
    let before = run_count(&server);
    // A client that stops halfway is answered 408 at the bound; no run, no cell.
    let started = Instant::now();
    let answer = slow_request(&server, &[head.as_bytes(), first], Duration::ZERO);
    assert!(
        answer.starts_with("HTTP/1.1 408"),
        "{answer}\n{}",
        server.log()
    );
    assert!(answer.contains("request.body_timeout"), "{answer}");
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "answered at the bound"
    );
    assert_eq!(
        run_count(&server),
        before,
        "nothing ran for the stalled body"
    );
}

/// A `curl` posting `body` to `path` as alice, left streaming until the test kills it
/// (a client that goes away mid-stream: its socket closes with the process).
fn streaming_client(server: &Server, path: &str, body: &str) -> Child {
    Command::new("curl")
        .args(["-sS", "-N", "-H", &format!("Authorization: Bearer {ALICE}")])
        .args(["-H", "content-type: application/json"])
        .args(["--data-binary", body])
        .arg(format!("http://127.0.0.1:{}{path}", server.port))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

/// Kills `client` once `sleep {marker}` runs; asserts the payload is gone within 2 s.
/// Returns the cell's cgroup directories, as the payload's `/proc/<pid>/cgroup` named
/// them.
fn disconnect_and_expect_the_payload_killed(mut client: Child, marker: &str) -> Vec<PathBuf> {
    let payload = format!("sleep {marker}");
    wait_until("the payload to start", || process_with(&payload));
    let cgroups = cell_cgroups_of(&common::host::processes_with(&payload));
    assert!(!cgroups.is_empty(), "no cell cgroup for {payload}");
    client.kill().unwrap();
    let _ = client.wait();
    let gone = Instant::now();
    while process_with(&payload) {
        assert!(
            gone.elapsed() < Duration::from_secs(2),
            "the payload outlived its client by 2 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    cgroups
}

/// The cell cgroup directories of the processes `found` describes ("pid N (...): ...",
/// common::host::processes_with).
fn cell_cgroups_of(found: &[String]) -> Vec<PathBuf> {
    let cells = common::host::cell_cgroup_dirs();
    let pids = found.iter().filter_map(|line| {
        let pid = line.strip_prefix("pid ")?.split_whitespace().next()?;
        std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()
    });
    let mut dirs: Vec<PathBuf> = pids
        .flat_map(|cgroup| {
            let in_cells: Vec<PathBuf> = cells
                .iter()
                .filter(|dir| {
                    let name = dir.file_name().unwrap().to_string_lossy().into_owned();
                    cgroup
                        .lines()
                        .any(|l| l.contains(&format!("/airlock/{name}")))
                })
                .cloned()
                .collect();
            in_cells
        })
        .collect();
    dirs.sort();
    dirs.dedup();
    dirs
}

/// The record of alice's only run with `argv`, once it is complete.
fn completed_run(server: &Server, argv: &[&str]) -> Value {
    let mut record = Value::Null;
    wait_until("the run's record to be completed", || {
        let (_, body) = server.tcp(ALICE, "GET", "/v1/runs?limit=20", None);
        record = json(&body)["runs"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["argv"] == serde_json::json!(argv))
            .cloned()
            .unwrap_or(Value::Null);
        record["status"] != "running" && !record.is_null()
    });
    record
}

#[test]
fn a_client_that_disconnects_mid_stream_cancels_its_run_and_the_record_says_so() {
    require_cells!();
    let server = Server::start();
    for (n, path) in ["/v1/runs", "/v1/runs?wait=true"].iter().enumerate() {
        let marker = format!("{}.{}", 400 + std::process::id() % 100, 8100 + n);
        let argv = ["sleep", marker.as_str()];
        let client = streaming_client(&server, path, &run_body(&argv));
        let cgroups = disconnect_and_expect_the_payload_killed(client, &marker);
        let record = completed_run(&server, &argv);
        // The class of a cell destroyed because its caller went away, as for a
        // hand-off client (crates/cell/src/supervisor/classify.rs).
        assert_eq!(record["status"], "runtime_fault", "{path}: {record}");
        let error = record["result"]["error"].as_str().unwrap_or_default();
        assert!(error.contains("the caller went away"), "{path}: {record}");
        assert_eq!(record["cleanup_ok"], true, "{path}: {record}");
        // The cell is destroyed: its cgroups are gone.
        wait_until("the cell's cgroups to be removed", || {
            cgroups.iter().all(|dir| !dir.exists())
        });
    }
    // A client that stays gets its run as before.
    let (code, body) = server.tcp(ALICE, "POST", "/v1/runs", Some(&run_body(&["true"])));
    assert_eq!(code, 200, "{body}");
    assert_eq!(
        frames(&body).last().unwrap()["record"]["status"],
        "ok",
        "{body}"
    );
    let (_, body) = server.tcp(ALICE, "GET", "/v1/audit/verify", None);
    assert_eq!(json(&body)["ok"], true, "{body}");
}

#[test]
fn a_client_that_disconnects_from_a_session_command_kills_it_and_the_session_stays() {
    require_cells!();
    let server = Server::start();
    let (code, body) = server.tcp(
        ALICE,
        "POST",
        "/v1/sessions",
        Some(r#"{"contract": "small"}"#),
    );
    assert_eq!(code, 201, "{body}");
    let base = format!(
        "/v1/sessions/{}",
        json(&body)["session_id"].as_str().unwrap()
    );
    let marker = format!("{}.{}", 400 + std::process::id() % 100, 8200);
    let exec = serde_json::json!({"argv": ["sleep", marker]}).to_string();
    let client = streaming_client(&server, &format!("{base}/exec"), &exec);
    let cgroups = disconnect_and_expect_the_payload_killed(client, &marker);
    let command = format!("{base}/commands/1");
    let mut view = Value::Null;
    wait_until("the command's end", || {
        view = json(&server.tcp(ALICE, "GET", &command, None).1);
        view["running"] == false
    });
    assert_eq!(view["record"]["exit"]["signal"], 9, "{view}");
    // The session stays, and serves the next command.
    let (code, body) = server.tcp(
        ALICE,
        "POST",
        &format!("{base}/exec"),
        Some(r#"{"argv": ["true"]}"#),
    );
    assert_eq!(code, 200, "{body}");
    assert_eq!(
        frames(&body).last().unwrap()["record"]["status"],
        "ok",
        "{body}"
    );
    // A background command has no streaming client: it is not affected.
    let background = serde_json::json!({"argv": ["sleep", "0.3"], "background": true});
    let (code, body) = server.tcp(
        ALICE,
        "POST",
        &format!("{base}/exec"),
        Some(&background.to_string()),
    );
    assert_eq!(code, 202, "{body}");
    let id = json(&body)["command_id"].as_u64().unwrap();
    wait_until("the background command's end", || {
        let view = json(
            &server
                .tcp(ALICE, "GET", &format!("{base}/commands/{id}"), None)
                .1,
        );
        view["running"] == false && view["record"]["status"] == "ok"
    });
    // The session's cell lived until here.
    assert!(cgroups.iter().all(|dir| dir.exists()), "{cgroups:?}");
    let (code, _) = server.tcp(ALICE, "DELETE", &base, None);
    assert_eq!(code, 200);
    wait_until("the session's cgroups to be removed", || {
        cgroups.iter().all(|dir| !dir.exists())
    });
}
