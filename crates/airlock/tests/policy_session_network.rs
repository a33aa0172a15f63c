//! Network policy on a live session, on a real `airlock serve` with curl: a session
//! opened from a workload class changes its destinations through
//! `POST /v1/sessions/{id}/network`, decided like a request's domains. A destination
//! added mid-session is reachable for the session's next connection, a removed one is
//! refused with `egress.not_allowlisted`, one outside the class is denied
//! (`policy.domain_not_in_class`) and never reached, one the class lets a request ask
//! for waits for an approver other than the session's tenant. Every decision is in the
//! session's record; another tenant gets 404. A class session's commands go through
//! the class's command policy before they reach the cell, and a session whose command
//! is a suspected escape is closed with its writable paths quarantined.
//!
//! The upstream is python's http.server on 127.0.0.2 (exempted from the private-address
//! rule), named `api.test`, `files.test` and `evil.test` by the operator's resolver map.

mod common;

use common::served::Served;
use common::upstream::Upstream;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

const AGENT: &str = "agent-key";
const REVIEWER: &str = "reviewer-key";
const NOSY: &str = "nosy-key";

const CONFIG: &str = r#"
[server]
listen = ["unix:SOCK", "tcp:127.0.0.1:PORT"]
[server.contracts]
plain = "plain.yaml"
[server.tenants.agent]
api_key_sha256 = ["AGENT"]
[server.tenants.reviewer]
api_key_sha256 = ["REVIEWER"]
[server.tenants.nosy]
api_key_sha256 = ["NOSY"]

[policy]
approvers = ["tenant:reviewer", "tenant:agent"]

[egress]
resolve = { "api.test" = "127.0.0.2", "files.test" = "127.0.0.2", "evil.test" = "127.0.0.2" }
exempt_cidrs = ["127.0.0.2/32"]

[policy.classes.net]
description = "a session whose destinations change"
[policy.classes.net.template.network]
mode = "allowlist"
allowed_domains = ["api.test:UPSTREAM"]
[policy.classes.net.template.filesystem]
writable_paths = ["/tmp"]
[policy.classes.net.bounds]
requestable_domains = ["files.test:UPSTREAM"]
session = { allowed = true, max_lifetime_seconds = 600 }
[policy.classes.net.commands]
default = "forbidden"
unmatched = "allow"
[[policy.classes.net.commands.rules]]
pattern = ["rm"]
decision = "forbidden"
justification = "nothing is deleted here"
match = ["rm -rf /tmp"]
not_match = ["ls /tmp"]
"#;

struct Service {
    served: Served,
    upstream: Upstream,
    _www: tempfile::TempDir,
}

impl Service {
    fn start() -> Service {
        let www = tempfile::tempdir().unwrap();
        let root = www.path().join("www");
        std::fs::create_dir_all(&root).unwrap();
        for name in ["api.txt", "files.txt", "evil.txt"] {
            std::fs::write(root.join(name), format!("served {name}\n")).unwrap();
        }
        let upstream = Upstream::start(www.path(), &root, "127.0.0.2", None);
        let config = CONFIG
            .replace("UPSTREAM", &upstream.port.to_string())
            .replace("AGENT", &common::sha256_hex(AGENT))
            .replace("REVIEWER", &common::sha256_hex(REVIEWER))
            .replace("NOSY", &common::sha256_hex(NOSY));
        let plain = format!(
            "network:\n  mode: allowlist\n  allowed_domains: [\"api.test:{}\"]\n",
            upstream.port
        );
        let served = Served::start(&config, |dir| {
            std::fs::write(dir.join("plain.yaml"), plain).unwrap();
        });
        Service {
            served,
            upstream,
            _www: www,
        }
    }

    fn log(&self) -> String {
        self.served.log()
    }

    /// `curl` over TCP as the tenant of `key`: (HTTP status, body as JSON, or NDJSON
    /// frames as an array, or a string).
    fn call(&self, key: &str, method: &str, path: &str, body: Option<&Value>) -> (u16, Value) {
        self.served.call(key, method, path, body)
    }

    /// Opens a session of class `net` as the agent: its id.
    fn open(&self) -> String {
        let body = json!({"class": "net", "idle_timeout_s": 300});
        let (status, opened) = self.call(AGENT, "POST", "/v1/sessions", Some(&body));
        assert_eq!(status, 201, "{opened}\n{}", self.log());
        opened["session_id"].as_str().unwrap().to_string()
    }

    /// Runs `curl -i` for `http://HOST:UPSTREAM/FILE` in the session: (exit code, the
    /// response as curl printed it, headers included).
    fn fetch(&self, session: &str, host: &str, file: &str) -> (i64, String) {
        let url = format!("http://{host}:{}/{file}", self.upstream.port);
        let argv = json!(["curl", "-sS", "-i", "--max-time", "20", url]);
        let (status, frames) = self.call(
            AGENT,
            "POST",
            &format!("/v1/sessions/{session}/exec"),
            Some(&json!({ "argv": argv })),
        );
        assert_eq!(status, 200, "{frames}\n{}", self.log());
        let frames = frames.as_array().cloned().unwrap_or_default();
        let stdout: String = frames
            .iter()
            .filter(|f| f["type"] == "stdout")
            .map(|f| f["data"].as_str().unwrap_or_default())
            .collect();
        let exit = frames
            .iter()
            .find(|f| f["type"] == "exit")
            .and_then(|f| f["exit_code"].as_i64())
            .unwrap_or(-1);
        (exit, stdout)
    }

    fn change(&self, key: &str, session: &str, change: Value) -> (u16, Value) {
        self.call(
            key,
            "POST",
            &format!("/v1/sessions/{session}/network"),
            Some(&change),
        )
    }

    /// The `session.network` events of the session's record, oldest first.
    fn network_events(&self, session: &str) -> Vec<Value> {
        let (status, record) = self.call(AGENT, "GET", &format!("/v1/runs/{session}"), None);
        assert_eq!(status, 200, "{record}");
        record["events"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["kind"] == "session.network")
            .map(|e| e["body"].clone())
            .collect()
    }
}

fn reached(response: &str) -> bool {
    response.starts_with("HTTP/1.") && response.contains(" 200 ")
}

#[test]
fn a_destination_added_mid_session_is_reachable_and_a_removed_or_outside_one_is_not() {
    require_cells!();
    let service = Service::start();
    let session = service.open();
    let port = service.upstream.port;
    let api = format!("api.test:{port}");

    let (exit, response) = service.fetch(&session, "api.test", "api.txt");
    assert!(reached(&response), "{exit} {response}\n{}", service.log());
    assert!(response.contains("served api.txt"), "{response}");

    // Removed: the next connection is refused by the proxy, with its reason.
    let (status, changed) = service.change(AGENT, &session, json!({"remove": [api]}));
    assert_eq!(status, 200, "{changed}");
    assert_eq!(changed["allowed_domains"], json!([]));
    let (_, response) = service.fetch(&session, "api.test", "api.txt");
    assert!(!reached(&response), "{response}");
    assert!(
        response.contains("X-Airlock-Reason: egress.not_allowlisted"),
        "{response}"
    );

    // Added back (the class's own destination: no approval): the next connection
    // reaches it.
    let (status, changed) = service.change(AGENT, &session, json!({"add": [api]}));
    assert_eq!(status, 200, "{changed}");
    assert_eq!(changed["allowed_domains"], json!([api]));
    let (_, response) = service.fetch(&session, "api.test", "api.txt");
    assert!(reached(&response), "{response}");

    // Outside the class: denied with its code, and never reached.
    let evil = format!("evil.test:{port}");
    let (status, denied) = service.change(AGENT, &session, json!({"add": [evil]}));
    assert_eq!(status, 403, "{denied}");
    assert_eq!(denied["reason"], "policy.domain_not_in_class");
    let (_, response) = service.fetch(&session, "evil.test", "evil.txt");
    assert!(!reached(&response), "{response}");
    assert!(
        response.contains("X-Airlock-Reason: egress.not_allowlisted"),
        "{response}"
    );
    let (_, view) = service.call(AGENT, "GET", &format!("/v1/sessions/{session}"), None);
    assert_eq!(view["allowed_domains"], json!([api]));

    let log = service.upstream.log();
    assert_eq!(log.matches("GET /api.txt").count(), 2, "{log}");
    assert!(!log.contains("evil.txt"), "{log}");

    // Who, what, the decision, before and after: in the session's record.
    let events = service.network_events(&session);
    let decisions: Vec<&str> = events
        .iter()
        .map(|e| e["decision"].as_str().unwrap())
        .collect();
    assert_eq!(decisions, ["grant", "grant", "deny"], "{events:#?}");
    assert!(events.iter().all(|e| e["requester"] == "tenant:agent"));
    assert_eq!(events[0]["remove"], json!([api]));
    assert_eq!(events[0]["after"], json!([]));
    assert_eq!(events[1]["after"], json!([api]));
    assert_eq!(events[2]["reason_code"], "policy.domain_not_in_class");
    assert_eq!(events[2]["add"], json!([evil]));
    let (status, verified) = service.call(AGENT, "GET", "/v1/audit/verify", None);
    assert_eq!(status, 200, "{verified}");
    assert_eq!(verified["ok"], true, "{verified}");
}

#[test]
fn a_requestable_destination_waits_for_an_approver_other_than_the_sessions_tenant() {
    require_cells!();
    let service = Service::start();
    let session = service.open();
    let files = format!("files.test:{}", service.upstream.port);
    let add = json!({"add": [files]});

    let (status, pending) = service.change(AGENT, &session, add.clone());
    assert_eq!(status, 202, "{pending}\n{}", service.log());
    assert_eq!(pending["status"], "pending_approval");
    assert_eq!(pending["needs"], json!([format!("domain:{files}")]));
    let id = pending["approval_id"].as_str().unwrap().to_string();
    // Pending is not allowed.
    let (_, response) = service.fetch(&session, "files.test", "files.txt");
    assert!(!reached(&response), "{response}");

    let approve = json!({"decision": "approve", "reason": "the job needs its files"});
    let path = format!("/v1/approvals/{id}");
    let (status, refused) = service.call(AGENT, "POST", &path, Some(&approve));
    assert_eq!(status, 403, "{refused}");
    assert_eq!(refused["reason"], "approval.self_approval");
    // Not yet approved: the change with the approval's id is still pending.
    let with_approval = json!({"add": [files], "approval": id});
    let (status, _) = service.change(AGENT, &session, with_approval.clone());
    assert_eq!(status, 202);
    let (status, decided) = service.call(REVIEWER, "POST", &path, Some(&approve));
    assert_eq!(status, 200, "{decided}");

    let (status, changed) = service.change(AGENT, &session, with_approval);
    assert_eq!(status, 200, "{changed}");
    assert!(changed["allowed_domains"]
        .as_array()
        .unwrap()
        .contains(&json!(files)));
    let (_, response) = service.fetch(&session, "files.test", "files.txt");
    assert!(reached(&response), "{response}");
    assert!(response.contains("served files.txt"), "{response}");
    let log = service.upstream.log();
    assert_eq!(log.matches("GET /files.txt").count(), 1, "{log}");

    // The approval was for this change of this session, once.
    let other = service.open();
    let reuse = json!({"add": [files], "approval": id});
    let (status, refused) = service.change(AGENT, &other, reuse);
    assert_eq!(status, 400, "{refused}");

    let events = service.network_events(&session);
    let decisions: Vec<&str> = events
        .iter()
        .map(|e| e["decision"].as_str().unwrap())
        .collect();
    assert_eq!(
        decisions,
        ["pending_approval", "pending_approval", "grant"],
        "{events:#?}"
    );
    assert_eq!(events[2]["approvals"], json!([id]));
}

#[test]
fn another_tenant_cannot_change_a_session_and_a_contract_session_has_no_class_to_change_within() {
    require_cells!();
    let service = Service::start();
    let session = service.open();
    let api = format!("api.test:{}", service.upstream.port);

    let (status, refused) = service.change(NOSY, &session, json!({"remove": [api]}));
    assert_eq!(status, 404, "{refused}");
    let (status, refused) = service.change(REVIEWER, &session, json!({"remove": [api]}));
    assert_eq!(status, 404, "{refused}");
    let (_, response) = service.fetch(&session, "api.test", "api.txt");
    assert!(reached(&response), "{response}");
    assert!(service.network_events(&session).is_empty());

    let body = json!({"contract": "plain"});
    let (status, opened) = service.call(AGENT, "POST", "/v1/sessions", Some(&body));
    assert_eq!(status, 201, "{opened}");
    let plain = opened["session_id"].as_str().unwrap();
    let (status, refused) = service.change(AGENT, plain, json!({"remove": [api]}));
    assert_eq!(status, 409, "{refused}");
    assert_eq!(refused["reason"], "session.not_from_class");
}

#[test]
fn a_class_session_checks_each_command_before_it_reaches_the_cell() {
    require_cells!();
    let service = Service::start();
    let session = service.open();
    let exec = |argv: Value| {
        service.call(
            AGENT,
            "POST",
            &format!("/v1/sessions/{session}/exec"),
            Some(&json!({ "argv": argv })),
        )
    };
    let (status, made) = exec(json!(["sh", "-c", "echo kept > /tmp/kept"]));
    assert_eq!(status, 200, "{made}");
    let (status, refused) = exec(json!(["sh", "-c", "true && rm -rf /tmp/kept"]));
    assert_eq!(status, 403, "{refused}");
    assert_eq!(refused["reason"], "policy.command_forbidden");
    let run_id = refused["run_id"].as_str().unwrap().to_string();
    let (_, record) = service.call(AGENT, "GET", &format!("/v1/runs/{run_id}"), None);
    assert_eq!(record["run"]["status"], "policy_denied", "{record}");
    // It never reached the cell: one command ran, and its file is still there.
    let (_, view) = service.call(AGENT, "GET", &format!("/v1/sessions/{session}"), None);
    assert_eq!(view["commands"].as_array().unwrap().len(), 1, "{view}");
    let (status, kept) = service.call(
        AGENT,
        "GET",
        &format!("/v1/sessions/{session}/files/tmp/kept"),
        None,
    );
    assert_eq!((status, kept), (200, json!("kept\n")));

    // A session the class's bounds do not give is denied at the door.
    let body = json!({"class": "net", "request": {"session": {"lifetime_seconds": 601}}});
    let (status, refused) = service.call(AGENT, "POST", "/v1/sessions", Some(&body));
    assert_eq!(status, 403, "{refused}");
    assert_eq!(refused["reason"], "policy.session_lifetime_above_class");
}

#[test]
fn a_session_is_closed_when_one_of_its_commands_is_a_suspected_escape() {
    require_cells!();
    let service = Service::start();
    let session = service.open();
    let exec = |argv: Value| {
        service.call(
            AGENT,
            "POST",
            &format!("/v1/sessions/{session}/exec"),
            Some(&json!({ "argv": argv })),
        )
    };
    let (status, _) = exec(json!(["sh", "-c", "echo left behind > /tmp/notes.txt"]));
    assert_eq!(status, 200);
    // A syscall of the x32 ABI: the filter kills it (SIGSYS), aimed at the boundary.
    let x32 = "import ctypes\nctypes.CDLL(None).syscall(0x40000000 | 39)\nprint('survived')";
    let (status, frames) = exec(json!(["/usr/bin/python3", "-c", x32]));
    assert_eq!(status, 200, "{frames}");
    let frames = frames.as_array().cloned().unwrap_or_default();
    let exit = frames.iter().find(|f| f["type"] == "exit").unwrap();
    assert_eq!(exit["status"], "suspected_escape", "{frames:?}");

    // The session ends by itself: its record says why, and nothing more runs in it.
    let deadline = Instant::now() + Duration::from_secs(30);
    let record = loop {
        let (_, record) = service.call(AGENT, "GET", &format!("/v1/runs/{session}"), None);
        if record["run"]["status"] != "running" || Instant::now() > deadline {
            break record;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(record["run"]["status"], "suspected_escape", "{record}");
    assert!(
        record.to_string().contains("was a suspected escape"),
        "{record}"
    );
    let (status, refused) = exec(json!(["true"]));
    assert_eq!(status, 404, "{refused}");

    // The session's writable paths were copied before its cell was destroyed, and kept
    // in the quarantine under the session's record, its tenant flagged.
    let shown = service.served.cli(&["quarantine", "show", &session]);
    let shown: Value = serde_json::from_slice(&shown.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&shown.stderr)));
    let manifest = &shown["manifest"];
    assert_eq!(manifest["writable_paths_copied"], true, "{shown}");
    assert_eq!(manifest["tenant_flagged"], "tenant:agent", "{manifest}");
    let copy = service
        .served
        .state_dir()
        .join("quarantine")
        .join(&session)
        .join("writable/tmp/notes.txt");
    assert_eq!(std::fs::read_to_string(copy).unwrap(), "left behind\n");
}
