//! The API description is the API (issue 33, item 7): docs/openapi.json passes
//! `openapi-spec-validator`; every path it describes is served with exactly its methods
//! (a wrong one 405 with `Allow`); every error, the framework's own included, is an
//! `application/json` `ErrorBody`; an unknown session is 404 whatever the body's type;
//! `schemathesis` (stateful, as each of two tenants) finds no failure against the real
//! server; `?wait=true` on a session's exec answers the command's record; the audit
//! check's counts are the caller's own; the official MCP SDK ends its session without
//! "termination failed". Python is `$AIRLOCK_TEST_PYTHON` (.ci/run's venv, which has
//! `mcp`, `openapi-spec-validator` and `schemathesis`).

use crate::common;
use crate::common::served::Served;
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

const ALICE: &str = "alice-openapi-key";
const BOB: &str = "bob-openapi-key";

fn python() -> String {
    std::env::var("AIRLOCK_TEST_PYTHON").unwrap_or_else(|_| "python3".into())
}

fn description() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/openapi.json")
}

fn described() -> Value {
    serde_json::from_str(&std::fs::read_to_string(description()).unwrap()).unwrap()
}

/// Two tenants on TCP, the operator on the unix socket, one small contract.
fn start() -> Served {
    let config = format!(
        r#"[server]
listen = ["unix:SOCK", "tcp:127.0.0.1:PORT"]
max_body_bytes = 65536
max_file_bytes = 65536
body_timeout_ms = 3000
[server.contracts]
small = "small.yaml"
[server.tenants.alice]
api_key_sha256 = ["{alice}"]
runs_per_minute = 100000
[server.tenants.bob]
api_key_sha256 = ["{bob}"]
runs_per_minute = 100000
"#,
        alice = common::sha256_hex(ALICE),
        bob = common::sha256_hex(BOB),
    );
    Served::start(&config, |dir| {
        std::fs::copy(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/contracts/default.yaml"),
            dir.join("small.yaml"),
        )
        .unwrap();
    })
}

/// One answer, whole: status, headers (lower-cased names), body.
struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or(Value::Null)
    }

    /// An `ErrorBody`, served as `application/json`: its reason.
    fn error_reason(&self) -> String {
        let what = format!("{} {:?} {}", self.status, self.headers, self.body);
        let content_type = self.header("content-type").unwrap_or_default();
        assert!(content_type.starts_with("application/json"), "{what}");
        let body = self.json();
        for field in ["class", "reason", "error"] {
            assert!(body[field].is_string(), "no {field}: {what}");
        }
        body["reason"].as_str().unwrap().to_string()
    }
}

/// `curl -X METHOD` over TCP as the tenant of `key`, with extra curl arguments.
fn request(served: &Served, key: &str, method: &str, path: &str, extra: &[&str]) -> Answer {
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "60", "-D", "-", "-X", method])
        .args(["-H", &format!("Authorization: Bearer {key}")])
        .args(extra)
        .arg(format!("http://127.0.0.1:{}{path}", served.port))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_lowercase(), v.trim().to_string()))
        .collect();
    Answer {
        status,
        headers,
        body: body.to_string(),
    }
}

fn json_body(body: &str) -> Vec<String> {
    vec![
        "-H".into(),
        "content-type: application/json".into(),
        "--data-binary".into(),
        body.into(),
    ]
}

fn args(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

#[test]
fn the_description_passes_openapi_spec_validator() {
    let _load = crate::shared();
    let out = Command::new(python())
        .args(["-m", "openapi_spec_validator"])
        .arg(description())
        .output()
        .expect("the venv's python runs");
    assert!(out.status.success(), "{}", common::output_text(&out));
}

#[test]
fn the_frameworks_own_rejections_are_error_bodies() {
    let _load = crate::shared();
    let served = start();
    let big = format!("{{\"argv\": [\"{}\"]}}", "x".repeat(70_000));
    let table: Vec<(&str, &str, Vec<String>, u16, &str)> = vec![
        ("POST", "/v1/runs", json_body("{"), 400, "body.invalid_json"),
        (
            "POST",
            "/v1/runs",
            json_body("{\"argv\": 5}"),
            422,
            "body.invalid_field",
        ),
        (
            "POST",
            "/v1/runs",
            vec![
                "-H".into(),
                "content-type: text/plain".into(),
                "--data-binary".into(),
                "{}".into(),
            ],
            415,
            "body.content_type",
        ),
        (
            "POST",
            "/v1/runs",
            json_body(&big),
            413,
            "request.too_large",
        ),
        ("GET", "/v1/no-such-route", vec![], 404, "not_found"),
        ("GET", "/no/such/route", vec![], 404, "not_found"),
        ("DELETE", "/v1/runs", vec![], 405, "method.not_allowed"),
        ("PUT", "/healthz", vec![], 405, "method.not_allowed"),
        ("GET", "/v1/runs?limit=many", vec![], 400, "query.invalid"),
        ("GET", "/v1/runs?limit=1001", vec![], 400, "query.invalid"),
        (
            "GET",
            "/v1/runs?since=yesterday",
            vec![],
            400,
            "query.invalid",
        ),
        (
            "GET",
            "/v1/sessions/s1/commands/one",
            vec![],
            400,
            "path.invalid",
        ),
        ("GET", "/v1/sessions/s1/files", vec![], 400, "query.invalid"),
        // 404 before 415: an unknown session whatever the body's content type.
        (
            "POST",
            "/v1/sessions/no-such-session/exec",
            vec![
                "-H".into(),
                "content-type: text/plain".into(),
                "--data-binary".into(),
                "x".into(),
            ],
            404,
            "not_found",
        ),
        (
            "POST",
            "/v1/sessions/no-such-session/timeout",
            vec!["--data-binary".into(), "x".into()],
            404,
            "not_found",
        ),
        ("PUT", "/mcp", vec![], 405, "method.not_allowed"),
        (
            "POST",
            "/mcp",
            vec![
                "-H".into(),
                "content-type: text/plain".into(),
                "-H".into(),
                "accept: application/json, text/event-stream".into(),
                "--data-binary".into(),
                "x".into(),
            ],
            415,
            "body.content_type",
        ),
        (
            "DELETE",
            "/mcp",
            vec!["-H".into(), "mcp-session-id: no-such".into()],
            404,
            "not_found",
        ),
    ];
    for (method, path, extra, status, reason) in table {
        let answer = request(&served, ALICE, method, path, &args(&extra));
        assert_eq!(
            (answer.status, answer.error_reason().as_str()),
            (status, reason),
            "{method} {path}: {}",
            answer.body
        );
    }
    let wrong = request(&served, ALICE, "DELETE", "/v1/runs", &[]);
    let allow: BTreeSet<&str> = wrong
        .header("allow")
        .unwrap()
        .split(',')
        .map(str::trim)
        .collect();
    assert_eq!(allow, BTreeSet::from(["GET", "HEAD", "POST"]));
    let nobody = request(&served, "not-a-key", "GET", "/v1/runs", &[]);
    assert_eq!(
        (nobody.status, nobody.error_reason().as_str()),
        (401, "auth.bad_key")
    );
}

/// A concrete path for a described one (its parameters filled with plausible values).
fn concrete(path: &str) -> String {
    path.replace("{id}", "no-such")
        .replace("{cid}", "1")
        .replace("{path}", "work/a")
        .replace("{class}", "no-such")
        .replace("{name}", "no-such")
}

#[test]
fn every_described_path_is_served_with_exactly_its_methods() {
    let _load = crate::shared();
    let served = start();
    let doc = described();
    const METHODS: [&str; 6] = ["GET", "POST", "PUT", "DELETE", "PATCH", "TRACE"];
    for (path, item) in doc["paths"].as_object().unwrap() {
        let described: BTreeSet<String> = item
            .as_object()
            .unwrap()
            .keys()
            .map(|m| m.to_uppercase())
            .filter(|m| METHODS.contains(&m.as_str()))
            .collect();
        for method in METHODS {
            let answer = request(
                &served,
                ALICE,
                method,
                &concrete(path),
                &["--max-time", "10", "-H", "mcp-session-id: no-such"],
            );
            let what = format!("{method} {path}: {} {}", answer.status, answer.body);
            if described.contains(method) {
                assert_ne!(answer.status, 405, "{what}");
                assert_ne!(answer.json()["error"], "no such route", "{what}");
                assert_ne!(answer.status, 0, "{what}");
            } else {
                assert_eq!(answer.status, 405, "{what}");
                assert_eq!(answer.error_reason(), "method.not_allowed", "{what}");
                let allow: BTreeSet<String> = answer
                    .header("allow")
                    .unwrap_or_default()
                    .split(',')
                    .map(|m| m.trim().to_string())
                    .filter(|m| m != "HEAD")
                    .collect();
                assert_eq!(allow, described, "{what}");
            }
        }
    }
}

#[test]
fn a_session_exec_with_wait_true_answers_the_commands_record() {
    let _load = crate::shared();
    if !common::cells_available() {
        return;
    }
    let served = start();
    let (status, opened) = served.call(
        ALICE,
        "POST",
        "/v1/sessions",
        Some(&json!({"contract": "small"})),
    );
    assert_eq!(status, 201, "{opened}");
    let id = opened["session_id"].as_str().unwrap().to_string();
    let exec = format!("/v1/sessions/{id}/exec?wait=true");
    let command = json!({"argv": ["sh", "-c", "echo waited; exit 3"]});
    let (status, record) = served.call(ALICE, "POST", &exec, Some(&command));
    assert_eq!(status, 200, "{record}");
    assert!(record.is_object(), "the record, not frames: {record}");
    assert_eq!(record["exit_code"], 3, "{record}");
    let background = json!({"argv": ["true"], "background": true});
    let (status, refused) = served.call(ALICE, "POST", &exec, Some(&background));
    assert_eq!(
        (status, &refused["reason"]),
        (400, &json!("exec.wait_background"))
    );
    let (status, _) = served.call(ALICE, "DELETE", &format!("/v1/sessions/{id}"), None);
    assert_eq!(status, 200);
}

#[test]
fn the_audit_checks_counts_are_the_callers_own_runs() {
    let _load = crate::shared();
    if !common::cells_available() {
        return;
    }
    let served = start();
    let run = json!({"contract": "small", "argv": ["true"]});
    for key in [ALICE, ALICE, BOB] {
        let (status, record) = served.call(key, "POST", "/v1/runs?wait=true", Some(&run));
        assert_eq!(status, 200, "{record}");
    }
    let (_, alice) = served.call(ALICE, "GET", "/v1/audit/verify", None);
    let (_, bob) = served.call(BOB, "GET", "/v1/audit/verify", None);
    assert_eq!(
        (&alice["scope"], &alice["runs"]),
        (&json!("tenant"), &json!(2)),
        "{alice}"
    );
    assert_eq!(
        (&bob["scope"], &bob["runs"]),
        (&json!("tenant"), &json!(1)),
        "{bob}"
    );
    assert!(alice["entries"].as_u64().unwrap() > bob["entries"].as_u64().unwrap());
    let out = served.curl_unix(&["http://airlock/v1/audit/verify"]);
    let operator: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(operator["scope"], "fleet", "{operator}");
    assert!(operator["runs"].as_u64().unwrap() >= 3, "{operator}");
    assert!(
        operator["entries"].as_u64() > alice["entries"].as_u64(),
        "{operator}"
    );
}

/// The official MCP Python SDK opens a session at `/mcp`, lists tools and closes: its
/// `DELETE` is answered as the specification says (the SDK takes 200 or 204 and logs
/// "Session termination failed" otherwise), and the session is gone afterwards.
const MCP_END: &str = r#"
import anyio, httpx2, logging, sys
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

class Seen(logging.Handler):
    records = []
    def emit(self, record):
        Seen.records.append(record.getMessage())
logging.getLogger().addHandler(Seen())
logging.getLogger().setLevel(logging.DEBUG)
url, key = sys.argv[1], sys.argv[2]
ids, deletes = [], []

async def note(response):
    if response.headers.get("mcp-session-id") and not ids:
        ids.append(response.headers["mcp-session-id"])
    if response.request.method == "DELETE":
        deletes.append(response.status_code)

async def main():
    headers = {"Authorization": f"Bearer {key}"}
    async with httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(60.0),
                                  event_hooks={"response": [note]}) as http:
        async with streamable_http_client(url, http_client=http) as (read, write):
            async with ClientSession(read, write) as session:
                await session.initialize()
                await session.list_tools()
        after = await http.post(url, json={"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
                                headers={"Mcp-Session-Id": ids[0],
                                         "Accept": "application/json, text/event-stream"})
        print("after", after.status_code)

anyio.run(main)
print("deletes", deletes)
failed = [m for m in Seen.records if "termination failed" in m.lower()]
print("termination_failed", len(failed), failed)
"#;

#[test]
fn the_mcp_sdk_ends_its_session_without_error() {
    let _load = crate::shared();
    let served = start();
    let url = format!("http://127.0.0.1:{}/mcp", served.port);
    let out = Command::new(python())
        .args(["-c", MCP_END, &url, ALICE])
        .output()
        .expect("the venv's python runs");
    let text = common::output_text(&out);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("deletes [204]"),
        "the SDK ended its session: {text}"
    );
    assert!(text.contains("termination_failed 0 []"), "{text}");
    assert!(text.contains("after 404"), "the session is gone: {text}");
}

/// schemathesis against the real server, as one tenant: every phase its version has
/// (examples, coverage, fuzzing, stateful), every check, bounded in examples and time.
fn schemathesis(served: &Served, key: &str) {
    let report = served.path(&format!("schemathesis-{key}.xml"));
    let out = Command::new(python())
        .args(["-m", "schemathesis.cli", "run"])
        .arg(description())
        .args(["--url", &format!("http://127.0.0.1:{}", served.port)])
        .args(["-H", &format!("Authorization: Bearer {key}")])
        .args(["--phases", "examples,coverage,fuzzing,stateful"])
        // Every check but positive_data_acceptance, which takes every schema-valid
        // request for one the server must accept: the API's rules beyond a JSON schema
        // (a contract or a class is needed, reserved variables, a class's bounds) are
        // refusals, each documented with its status and ErrorBody.
        .args(["--exclude-checks", "positive_data_acceptance"])
        .args(["--max-examples", "15", "--max-time", "60"])
        .args(["--request-timeout", "30", "--seed", "33", "--no-color"])
        .args(["--generation-database", "none", "--report", "junit"])
        .arg("--report-junit-path")
        .arg(&report)
        .env("SCHEMATHESIS_HOOKS", "")
        // Its cache (.schemathesis/) in the test's directory, not the source tree.
        .current_dir(served.dir.path())
        .output()
        .expect("the venv's python runs");
    let text = common::output_text(&out);
    assert!(out.status.success(), "schemathesis as {key}:\n{text}");
    let phases = text.split("Test Phases:").nth(1).unwrap_or_default();
    for phase in ["Coverage", "Fuzzing", "Stateful"] {
        let ran = phases
            .lines()
            .any(|l| l.contains(phase) && l.contains('✅'));
        assert!(
            ran,
            "schemathesis's {phase} phase did not run as {key}:\n{text}"
        );
    }
}

#[test]
fn schemathesis_finds_no_failure_as_either_tenant() {
    let _load = crate::exclusive();
    if !common::cells_available() {
        return;
    }
    let served = start();
    schemathesis(&served, ALICE);
    schemathesis(&served, BOB);
}
