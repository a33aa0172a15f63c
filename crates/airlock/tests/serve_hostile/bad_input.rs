//! Bad input from a tenant (issue 33, item 5): one validation of a command's argv and
//! environment (`airlock_contract::check_command`), through every door of the real
//! binary — `POST /v1/runs`, `POST /v1/runs/stream`, `POST /v1/sessions`,
//! `POST /v1/sessions/{id}/exec`, `airlock run` and an MCP tool call — each refusal a
//! 422 `ErrorBody` (or the CLI's and MCP's refusal) naming the field and the rule,
//! before any cell: no payload record, no live cell, no session left. And the allowed
//! edge: the largest command accepted runs, and its record is what the payload saw.

use crate::common::served::Served;
use crate::common::{self, sha256_hex};
use serde_json::{json, Value};
use sha2::Digest;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};

const ALICE: &str = "alice-key";
/// Room for the 3 MB bodies: the command's own bound refuses them, not the body's.
const MAX_BODY_BYTES: usize = 8 << 20;
/// airlock_contract::MAX_COMMAND_BYTES, as the docs state it.
const MAX_COMMAND_BYTES: usize = 256 * 1024;

fn start() -> Served {
    let config = format!(
        r#"[server]
listen = ["unix:SOCK", "tcp:127.0.0.1:PORT"]
max_body_bytes = {MAX_BODY_BYTES}
[server.contracts]
small = "small.yaml"
[server.tenants.alice]
api_key_sha256 = ["{alice}"]
max_cells = 8
max_sessions = 4
runs_per_minute = 10000
"#,
        alice = sha256_hex(ALICE),
    );
    Served::start(&config, |dir| {
        std::fs::copy(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/contracts/default.yaml"),
            dir.join("small.yaml"),
        )
        .unwrap();
    })
}

/// `body` sent from a file (a 3 MB body is too long for curl's own command line).
fn send(server: &Served, method: &str, path: &str, body: &[u8]) -> (u16, Value) {
    let file = server.path(&format!("body-{}", sha256_hex(body)));
    std::fs::write(&file, body).unwrap();
    let (status, text) =
        server.call_text(ALICE, method, path, Some(&format!("@{}", file.display())));
    std::fs::remove_file(&file).unwrap();
    let value = serde_json::from_str(&text).unwrap_or_else(|_| {
        let frames: Vec<Value> = text
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect();
        Value::from(frames)
    });
    (status, value)
}

fn post(server: &Served, path: &str, body: &Value) -> (u16, Value) {
    send(server, "POST", path, body.to_string().as_bytes())
}

/// `POST /v1/runs/stream`: the JSON line, then the payload's stdin (none).
fn post_streamed(server: &Served, body: &Value) -> (u16, Value) {
    let mut bytes = body.to_string().into_bytes();
    bytes.push(b'\n');
    send(server, "POST", "/v1/runs/stream?wait=true", &bytes)
}

fn cells_alive(server: &Served) -> f64 {
    let out = server.curl_unix(&["http://airlock/metrics"]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.lines()
        .find_map(|l| l.strip_prefix("airlock_cells_alive "))
        .unwrap_or_else(|| panic!("no airlock_cells_alive in /metrics: {text}"))
        .trim()
        .parse()
        .unwrap()
}

/// Every record in the store: (status, argv).
fn records(server: &Served) -> Vec<Value> {
    let (status, list) = server.call(ALICE, "GET", "/v1/runs?limit=1000", None);
    assert_eq!(status, 200, "{list}");
    list["runs"].as_array().unwrap().clone()
}

/// The bad inputs: (what, argv, env, the reason, the field the message names).
fn bad_inputs() -> Vec<(&'static str, Vec<String>, Value, &'static str, String)> {
    let chunk = "a".repeat(100_000);
    let many = |n: usize| {
        let mut argv = vec!["echo".to_string()];
        argv.extend(std::iter::repeat_n(chunk.clone(), n));
        argv
    };
    let echo = || vec!["echo".to_string(), "x".to_string()];
    let key = |k: &str| json!({ k: "v" });
    let key_field = |k: &str| format!("env key \"{}\"", k.escape_debug());
    let invalid = "request.env_key_invalid";
    vec![
        ("empty key", echo(), key(""), invalid, key_field("")),
        ("key =", echo(), key("="), invalid, key_field("=")),
        ("key A=B", echo(), key("A=B"), invalid, key_field("A=B")),
        ("key NUL", echo(), key("A\0B"), invalid, key_field("A\0B")),
        (
            "key HTTP_PROXY=x#",
            echo(),
            key("HTTP_PROXY=x#"),
            invalid,
            key_field("HTTP_PROXY=x#"),
        ),
        ("key 1A", echo(), key("1A"), invalid, key_field("1A")),
        (
            "reserved, upper case",
            echo(),
            key("HTTP_PROXY"),
            "request.env_reserved",
            "env.HTTP_PROXY".into(),
        ),
        (
            "reserved, lower case",
            echo(),
            key("https_proxy"),
            "request.env_reserved",
            "env.https_proxy".into(),
        ),
        (
            "NUL in argv",
            vec!["echo".into(), "a\0b".into()],
            json!({}),
            "request.nul_byte",
            "argv[1]".into(),
        ),
        (
            "NUL in an env value",
            echo(),
            json!({"FOO": "x\0y"}),
            "request.nul_byte",
            "env.FOO".into(),
        ),
        (
            "one argument of 200 KB",
            vec!["echo".into(), "a".repeat(200_000)],
            json!({}),
            "request.arg_too_large",
            "argv[1]".into(),
        ),
        (
            "argv of 500 KB",
            many(5),
            json!({}),
            "request.argv_too_large",
            "argv and env".into(),
        ),
        (
            "argv of 3 MB",
            many(30),
            json!({}),
            "request.argv_too_large",
            "argv and env".into(),
        ),
        (
            "one env value of 200 KB",
            echo(),
            json!({"BIG": "a".repeat(200_000)}),
            "request.arg_too_large",
            "env.BIG".into(),
        ),
        (
            "env of 300 KB",
            echo(),
            json!({"A": chunk, "B": chunk, "C": chunk}),
            "request.argv_too_large",
            "argv and env".into(),
        ),
    ]
}

/// A 422 `ErrorBody` of class `policy_denied`, `reason`, its message naming `field`.
fn assert_refused(what: &str, door: &str, answer: (u16, Value), reason: &str, field: &str) {
    let (status, body) = answer;
    let shown = body.to_string();
    let shown = &shown[..shown.len().min(600)];
    assert_eq!(status, 422, "{door}, {what}: {shown}");
    assert_eq!(body["class"], "policy_denied", "{door}, {what}: {shown}");
    assert_eq!(body["reason"], reason, "{door}, {what}: {shown}");
    let error = body["error"].as_str().unwrap_or_default();
    assert!(
        error.contains(field),
        "{door}, {what}: the message names {field:?}: {shown}"
    );
}

#[test]
fn every_door_of_the_service_refuses_bad_commands_before_any_cell() {
    let _load = crate::shared();
    crate::require_cells!();
    let server = start();
    let cases = bad_inputs();
    for (what, argv, env, reason, field) in &cases {
        let body = json!({"contract": "small", "argv": argv, "env": env});
        let answer = post(&server, "/v1/runs?wait=true", &body);
        assert_refused(what, "POST /v1/runs", answer, reason, field);
        let answer = post_streamed(&server, &body);
        assert_refused(what, "POST /v1/runs/stream", answer, reason, field);
    }
    // Sessions take environment additions when opened.
    for (what, _, env, reason, field) in cases.iter().filter(|c| c.2 != json!({})) {
        let body = json!({"contract": "small", "env": env});
        let answer = post(&server, "/v1/sessions", &body);
        assert_refused(what, "POST /v1/sessions", answer, reason, field);
    }
    let (status, list) = server.call(ALICE, "GET", "/v1/sessions", None);
    assert_eq!((status, list["sessions"].clone()), (200, json!([])));
    assert_eq!(cells_alive(&server), 0.0, "no cell was built");

    // A malformed command is answered, not recorded (docs/api.md): nothing ran, and no
    // tenant writes its megabytes into the store.
    assert_eq!(records(&server), Vec::<Value>::new());

    // A session's commands: refused before they are recorded or sent to its cell.
    let (status, session) = server.call(
        ALICE,
        "POST",
        "/v1/sessions",
        Some(&json!({"contract": "small"})),
    );
    assert_eq!(status, 201, "{session}");
    let id = session["session_id"].as_str().unwrap().to_string();
    let exec = format!("/v1/sessions/{id}/exec");
    for (what, argv, env, reason, field) in &cases {
        let body = json!({"argv": argv, "env": env});
        let answer = post(&server, &exec, &body);
        assert_refused(what, "POST /v1/sessions/{id}/exec", answer, reason, field);
    }
    let (_, view) = server.call(ALICE, "GET", &format!("/v1/sessions/{id}"), None);
    assert_eq!(view["commands"], json!([]), "no command was started");
    assert_eq!(records(&server).len(), 1, "only the session's record");
    assert_eq!(cells_alive(&server), 1.0, "the session's cell alone");

    // The session still runs what is well formed, exactly as sent; stdin is bytes (a
    // NUL there is data, not a command).
    let body = json!({"argv": ["sh", "-c", "wc -c; printf %s \"$FOO\""], "env": {"FOO": "b=c"},
                      "stdin": "a\u{0}b"});
    let (status, frames) = post(&server, &exec, &body);
    assert_eq!(status, 200, "{frames}");
    let stdout: String = frames
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["type"] == "stdout")
        .map(|f| f["data"].as_str().unwrap_or("").to_string())
        .collect();
    assert_eq!(stdout.split_whitespace().collect::<Vec<_>>(), ["3", "b=c"]);
    let (status, _) = server.call(ALICE, "DELETE", &format!("/v1/sessions/{id}"), None);
    assert!(status < 300, "{status}");
    wait_for(|| cells_alive(&server) == 0.0, "the session's cell to go");
}

fn wait_for(mut done: impl FnMut() -> bool, what: &str) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !done() {
        assert!(std::time::Instant::now() < deadline, "waited for {what}");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// The byte count of an `request.argv_too_large` refusal's message.
fn counted_bytes(error: &str) -> usize {
    let words: Vec<&str> = error.split_whitespace().collect();
    let at = words.iter().position(|w| *w == "bytes").unwrap();
    words[at - 1].parse().unwrap()
}

#[test]
fn the_largest_command_accepted_runs_exactly_as_recorded() {
    let _load = crate::shared();
    crate::require_cells!();
    let server = start();
    // The payload hashes its own argv as the kernel gave it, and the variable it got.
    let script = "sha256sum < /proc/$$/cmdline; printf %s \"$FOO\" | sha256sum";
    let foo = "f=".repeat(500);
    let command = |last: usize| {
        let mut argv: Vec<String> = vec!["sh".into(), "-c".into(), script.into(), "x".into()];
        argv.push("a".repeat(100_000));
        argv.push("b".repeat(100_000));
        argv.push("c".repeat(last));
        argv
    };
    let body = |argv: &[String]| json!({"contract": "small", "argv": argv, "env": {"FOO": foo}});
    // Over the bound by a known count: each refusal says by how much (the request's
    // own command first, then with the plan's environment), so the last argument
    // shrinks to exactly the bound.
    let mut last = 100_000;
    let (argv, record) = loop {
        let argv = command(last);
        let (status, answer) = post(&server, "/v1/runs?wait=true", &body(&argv));
        if status != 422 {
            assert_eq!(status, 200);
            break (argv, answer);
        }
        assert_eq!(answer["reason"], "request.argv_too_large", "{answer}");
        last -= counted_bytes(answer["error"].as_str().unwrap()) - MAX_COMMAND_BYTES;
    };
    assert_eq!(record["status"], "ok", "{record}");
    let (status, answer) = post(&server, "/v1/runs?wait=true", &body(&command(last + 1)));
    assert_eq!(status, 422, "one byte over the bound: {answer}");
    assert!(
        answer["error"].as_str().unwrap().contains("262145 bytes"),
        "{answer}"
    );
    // The record's argv is the one sent, and the one the payload ran.
    let run_id = record["run_id"].as_str().unwrap();
    let (_, view) = server.call(ALICE, "GET", &format!("/v1/runs/{run_id}"), None);
    let recorded: Vec<String> = serde_json::from_value(view["run"]["argv"].clone()).unwrap();
    assert_eq!(recorded, argv);
    let cmdline: Vec<u8> = recorded
        .iter()
        .flat_map(|a| a.bytes().chain(std::iter::once(0)))
        .collect();
    let stdout = &record["output"]["stdout"];
    let seen = stdout["head"].as_str().unwrap_or_default().to_string()
        + stdout["tail"].as_str().unwrap_or_default();
    let hashes: Vec<&str> = seen
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert_eq!(
        hashes[..2],
        [
            hex(&sha2::Sha256::digest(&cmdline)),
            hex(&sha2::Sha256::digest(foo.as_bytes()))
        ],
        "{seen}"
    );
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn airlock_run_refuses_a_command_too_large_for_a_cell_before_one_exists() {
    let _load = crate::shared();
    crate::require_cells!();
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    // Three arguments of 100 KB: the kernel would exec airlock with them, a cell's
    // bound is smaller.
    let chunk = "a".repeat(100_000);
    let out = Command::new(common::airlock_bin())
        .env("AIRLOCK_SOCKET", dir.path().join("no-service.sock"))
        .args(["run", "--state-dir"])
        .arg(&state)
        .args(["--", "echo", &chunk, &chunk, &chunk])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{stderr}");
    assert!(
        stderr.contains("policy_denied: argv and env:") && stderr.contains("262144"),
        "{stderr}"
    );
    // Recorded as a refusal; no cell ran (its record has no exit code).
    let list = Command::new(common::airlock_bin())
        .args(["runs", "list", "--json", "--state-dir"])
        .arg(&state)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&list.stdout);
    assert!(text.contains("policy_denied"), "{text}");
    assert!(!text.contains("\"success\""), "{text}");
}

#[test]
fn a_handed_off_airlock_run_over_the_bound_is_refused_by_the_service() {
    let _load = crate::shared();
    crate::require_cells!();
    let server = start();
    let dir = tempfile::tempdir().unwrap();
    let chunk = "a".repeat(100_000);
    let out = Command::new(common::airlock_bin())
        .current_dir(dir.path())
        .env("AIRLOCK_SOCKET", server.sock())
        .args(["run", "--verbose", "--", "echo", &chunk, &chunk, &chunk])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{stderr}");
    assert!(
        stderr.contains("policy_denied: argv and env:"),
        "the service's refusal: {stderr}"
    );
    // The service refused it (its store has the refusal, the operator's: a hand-off
    // over the unix socket is root's), and no cell was built.
    let out = server.curl_unix(&["http://airlock/v1/runs?limit=1000"]);
    let list: Value = serde_json::from_slice(&out.stdout).unwrap();
    let refused: Vec<&Value> = list["runs"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["status"] == "policy_denied")
        .collect();
    assert_eq!(refused.len(), 1, "{stderr}");
    assert!(refused[0]["exit_code"].is_null());
    assert_eq!(cells_alive(&server), 0.0);
}

/// One JSON-RPC message to `airlock mcp` on its stdin; its answer (for a request).
fn rpc(
    stdin: &mut impl Write,
    lines: &mut impl Iterator<Item = String>,
    message: Value,
) -> Option<Value> {
    writeln!(stdin, "{message}").unwrap();
    stdin.flush().unwrap();
    message.get("id")?;
    lines
        .map(|l| serde_json::from_str::<Value>(&l).unwrap())
        .find(|m| m.get("id") == message.get("id"))
}

#[test]
fn an_mcp_tool_call_with_a_nul_in_its_argv_is_refused_naming_it() {
    let _load = crate::shared();
    crate::require_cells!();
    let dir = tempfile::tempdir().unwrap();
    let mut mcp = Command::new(common::airlock_bin())
        .args(["mcp", "--state-dir"])
        .arg(dir.path().join("state"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = mcp.stdin.take().unwrap();
    let mut lines = BufReader::new(mcp.stdout.take().unwrap())
        .lines()
        .map(Result::unwrap);
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-03-26", "capabilities": {},
        "clientInfo": {"name": "bad-input", "version": "1"}}});
    rpc(&mut stdin, &mut lines, init).expect("initialize answered");
    let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    rpc(&mut stdin, &mut lines, initialized);
    let call = |id: u64, command: Value| {
        json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
               "params": {"name": "run_command", "arguments": {"command": command}}})
    };
    let answer = rpc(&mut stdin, &mut lines, call(2, json!(["echo", "a\u{0}b"]))).unwrap();
    let text = answer.to_string();
    assert_eq!(answer["result"]["isError"], true, "{text}");
    assert!(text.contains("request.nul_byte"), "{text}");
    assert!(text.contains("argv[1]"), "{text}");
    // The same door runs a well-formed command.
    let answer = rpc(&mut stdin, &mut lines, call(3, json!(["echo", "ok"]))).unwrap();
    assert_ne!(answer["result"]["isError"], true, "{answer}");
    let ran = &answer["result"]["structuredContent"];
    assert_eq!(
        (ran["result_class"].clone(), ran["stdout"].clone()),
        (json!("ok"), json!("ok\n")),
        "{answer}"
    );
    drop(stdin);
    let _ = mcp.wait();
}

#[test]
fn a_command_whose_every_byte_is_escaped_on_the_wire_still_reaches_its_cell() {
    let _load = crate::shared();
    crate::require_cells!();
    let server = start();
    // 250 KB of control characters: JSON carries each as `\u0001`, six bytes, in the
    // factory's Spawn (the plan) and again in the supervisor's Run.
    let controls = "\u{1}".repeat(125_000);
    let argv = [
        "sh",
        "-c",
        "printf %s \"$1$2\" | wc -c",
        "x",
        &controls,
        &controls,
    ];
    let body = json!({"contract": "small", "argv": argv});
    let (status, record) = post(&server, "/v1/runs?wait=true", &body);
    let shown = record.to_string();
    assert_eq!(status, 200, "{}", &shown[..shown.len().min(600)]);
    assert_eq!(record["status"], "ok", "{}", &shown[..shown.len().min(600)]);
    let stdout = record["output"]["stdout"]["head"]
        .as_str()
        .unwrap_or_default();
    assert_eq!(stdout.trim(), "250000");
}
