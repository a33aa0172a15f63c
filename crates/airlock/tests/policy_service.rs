//! Workload classes and approvals on a real `airlock serve`, with curl: `POST /v1/runs`
//! naming a class answers 202 with the pending approval's id when the request needs
//! one; `GET /v1/approvals` lists it (an approver sees every request, anyone else its
//! own); `POST /v1/approvals/{id}` refuses a non-approver and the requesting tenant
//! itself (403 with the reason code) and records an approver's decision; the same
//! request then runs once, and a second time is refused.

mod common;

use common::served::Served;
use serde_json::{json, Value};

const AGENT: &str = "agent-key";
const REVIEWER: &str = "reviewer-key";
const NOSY: &str = "nosy-key";

/// The agent tenant is an approver too: its own request is still not its to approve.
const CONFIG: &str = r#"
[server]
listen = ["unix:SOCK", "tcp:127.0.0.1:PORT"]
[server.contracts]
probe-contract = "probe.yaml"
[server.tenants.agent]
api_key_sha256 = ["AGENT"]
[server.tenants.reviewer]
api_key_sha256 = ["REVIEWER"]
[server.tenants.nosy]
api_key_sha256 = ["NOSY"]

[policy]
approvers = ["tenant:reviewer", "tenant:agent"]

[egress]
resolve = { "files.test" = "127.0.0.1", "api.test" = "127.0.0.1" }

[policy.classes.t]
description = "test class"
approvals = { pending_seconds = 900, max_grant_seconds = 60 }

[policy.classes.t.template.resources]
memory_mb = 128

[policy.classes.t.bounds]
max_memory_mb = 256
requestable_domains = ["files.test:443"]

[policy.classes.t.commands]
default = "forbidden"
unmatched = "allow"

[policy.classes.probe]
description = "egress probe"
[policy.classes.probe.template.network]
mode = "allowlist"
allowed_domains = ["api.test"]
[policy.classes.probe.template.filesystem]
writable_paths = ["/tmp"]
[policy.classes.probe.commands]
unmatched = "allow"
"#;

/// The service of these tests: its tenants' key hashes in the configuration, and the
/// contract its `probe` class names beside it.
fn start() -> Served {
    let config = CONFIG
        .replace("AGENT", &common::sha256_hex(AGENT))
        .replace("REVIEWER", &common::sha256_hex(REVIEWER))
        .replace("NOSY", &common::sha256_hex(NOSY));
    Served::start(&config, |dir| {
        std::fs::write(
            dir.join("probe.yaml"),
            "network:\n  mode: allowlist\n  allowed_domains: [api.test]\n\
             filesystem:\n  writable_paths: [/tmp]\n",
        )
        .unwrap();
    })
}

fn class_run(argv: &[&str], asked: Value, approval: Option<&str>) -> Value {
    let mut body = json!({"class": "t", "argv": argv, "request": asked});
    if let Some(id) = approval {
        body["approval"] = json!(id);
    }
    body
}

#[test]
fn a_class_run_waits_for_an_approver_other_than_its_tenant_then_runs_once() {
    require_cells!();
    let service = start();
    let asked = json!({"domains": ["files.test:443"]});
    let request = class_run(&["true"], asked.clone(), None);
    let (status, pending) = service.call(AGENT, "POST", "/v1/runs?wait=true", Some(&request));
    assert_eq!(status, 202, "{pending}\n{}", service.log());
    assert_eq!(pending["status"], "pending_approval");
    assert_eq!(pending["needs"], json!(["domain:files.test:443"]));
    let id = pending["approval_id"].as_str().unwrap().to_string();

    // The requester sees its own request; a tenant that is no approver sees nothing else.
    let (status, listed) = service.call(AGENT, "GET", "/v1/approvals", None);
    assert_eq!(status, 200);
    assert_eq!(listed["approvals"][0]["approval_id"], id.as_str());
    assert_eq!(listed["approvals"][0]["requester"], "tenant:agent");
    let (_, seen) = service.call(NOSY, "GET", "/v1/approvals", None);
    assert_eq!(seen["approvals"], json!([]));
    let (_, seen) = service.call(REVIEWER, "GET", "/v1/approvals", None);
    assert_eq!(seen["approvals"][0]["approval_id"], id.as_str());

    let approve = json!({"decision": "approve", "reason": "needed for the fixture"});
    let path = format!("/v1/approvals/{id}");
    let (status, refused) = service.call(NOSY, "POST", &path, Some(&approve));
    assert_eq!(status, 403, "{refused}");
    assert_eq!(refused["reason"], "approval.not_an_approver");
    let (status, refused) = service.call(AGENT, "POST", &path, Some(&approve));
    assert_eq!(status, 403, "{refused}");
    assert_eq!(refused["reason"], "approval.self_approval");
    let (status, decided) = service.call(REVIEWER, "POST", &path, Some(&approve));
    assert_eq!(status, 200, "{decided}");
    assert_eq!(decided["status"], "approved");
    assert_eq!(decided["decided_by"], "tenant:reviewer");
    assert_eq!(decided["scope"], "request");
    let (status, again) = service.call(REVIEWER, "POST", &path, Some(&approve));
    assert_eq!(
        status, 409,
        "a decided request is not decided twice: {again}"
    );

    // Another command is another request: the approval does not cover it.
    let other = class_run(&["sh", "-c", "echo other"], asked.clone(), Some(&id));
    let (status, refused) = service.call(AGENT, "POST", "/v1/runs?wait=true", Some(&other));
    assert_eq!(status, 400, "{refused}");
    let approved = class_run(&["true"], asked.clone(), Some(&id));
    let (status, record) = service.call(AGENT, "POST", "/v1/runs?wait=true", Some(&approved));
    assert_eq!(status, 200, "{record}\n{}", service.log());
    assert_eq!(record["status"], "ok", "{record}");
    let run_id = record["run_id"].as_str().unwrap();
    let (_, shown) = service.call(AGENT, "GET", &format!("/v1/runs/{run_id}"), None);
    assert_eq!(shown["run"]["tenant"], "agent");
    assert_eq!(shown["run"]["workload_class"], "t");
    let decision = shown["events"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["kind"] == "policy.decision")
        .unwrap_or_else(|| panic!("no policy.decision event: {shown}"));
    assert_eq!(decision["body"]["approvals"][0], id.as_str());
    assert_eq!(decision["body"]["requester"], "tenant:agent");
    assert_eq!(decision["body"]["granted"]["domains"][0], "files.test:443");

    let (status, reused) = service.call(AGENT, "POST", "/v1/runs?wait=true", Some(&approved));
    assert_eq!(status, 403, "single use: {reused}");
    assert_eq!(reused["reason"], "policy.approval_expired");
    assert!(reused["run_id"].is_string(), "the denial is recorded");

    // Every decision is in the audit chain, with who and why.
    let all = service.cli(&["approvals", "list", "--all", "--json"]);
    let all: Value = serde_json::from_slice(&all.stdout).unwrap();
    assert_eq!(all[0]["decided_by"], "tenant:reviewer");
    assert_eq!(all[0]["reason"], "needed for the fixture");
    assert_eq!(all[0]["status"], "used");
    let (status, verified) = service.call(AGENT, "GET", "/v1/audit/verify", None);
    assert_eq!((status, &verified["ok"]), (200, &json!(true)), "{verified}");
}

#[test]
fn a_class_run_outside_its_bounds_is_denied_with_its_code_and_no_cell() {
    require_cells!();
    let service = start();
    let request = class_run(&["true"], json!({"domains": ["other.test:443"]}), None);
    let (status, denied) = service.call(AGENT, "POST", "/v1/runs?wait=true", Some(&request));
    assert_eq!(status, 403, "{denied}");
    assert_eq!(denied["reason"], "policy.domain_not_in_class");
    assert_eq!(denied["class"], "policy_denied");
    let run_id = denied["run_id"].as_str().expect("the denial is recorded");
    let (_, shown) = service.call(AGENT, "GET", &format!("/v1/runs/{run_id}"), None);
    assert_eq!(shown["run"]["status"], "policy_denied");
    assert!(shown["run"]["plan"].is_null(), "no plan, no cell: {shown}");
    let (status, refused) = service.call(
        AGENT,
        "POST",
        "/v1/runs",
        Some(&json!({"class": "nope", "argv": ["true"]})),
    );
    assert_eq!((status, &refused["reason"]), (400, &json!("class.unknown")));
    let both = json!({"class": "t", "contract": "x", "argv": ["true"]});
    let (status, _) = service.call(AGENT, "POST", "/v1/runs", Some(&both));
    assert_eq!(status, 400);
}

#[test]
fn a_suspected_escape_through_the_service_keeps_its_writable_paths_and_flags_its_tenant() {
    require_cells!();
    let service = start();
    // Asking the proxy for the cloud metadata endpoint is a suspected escape.
    let probe = "import socket\nopen('/tmp/notes.txt', 'w').write('left in tmp')\n\
                 s = socket.create_connection(('127.0.0.1', 3128), timeout=5)\n\
                 s.sendall(b'CONNECT 169.254.169.254:80 HTTP/1.1\\r\\nHost: x\\r\\n\\r\\n')\n\
                 print(s.recv(100))\n";
    let body = json!({"class": "probe", "argv": ["python3", "-c", probe]});
    let (status, record) = service.call(AGENT, "POST", "/v1/runs?wait=true", Some(&body));
    assert_eq!(status, 200, "{record}\n{}", service.log());
    assert_eq!(record["status"], "suspected_escape", "{record}");
    let run_id = record["run_id"].as_str().unwrap();
    let shown = service.cli(&["quarantine", "show", run_id]);
    let shown: Value = serde_json::from_slice(&shown.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&shown.stderr)));
    let manifest = &shown["manifest"];
    assert_eq!(manifest["writable_paths_copied"], true, "{shown}");
    assert_eq!(
        manifest["writable"]["copied"],
        json!([["/tmp/notes.txt", 11]]),
        "{manifest}"
    );
    assert_eq!(manifest["tenant_flagged"], "tenant:agent");
    let copy = service
        .state_dir()
        .join("quarantine")
        .join(run_id)
        .join("writable/tmp/notes.txt");
    assert_eq!(std::fs::read_to_string(copy).unwrap(), "left in tmp");
    let reviews = service.cli(&["reviews", "list", "--json"]);
    let reviews: Value = serde_json::from_slice(&reviews.stdout).unwrap();
    assert_eq!(reviews[0]["reason_code"], "suspected_escape");
    assert_eq!(reviews[0]["requester"], "tenant:agent");
}

#[test]
fn a_suspected_escape_of_a_named_contract_run_through_the_service_is_quarantined_too() {
    require_cells!();
    let service = start();
    let probe = "import socket\nopen('/tmp/notes.txt', 'w').write('named contract')\n\
                 s = socket.create_connection(('127.0.0.1', 3128), timeout=5)\n\
                 s.sendall(b'CONNECT 169.254.169.254:80 HTTP/1.1\\r\\nHost: x\\r\\n\\r\\n')\n\
                 print(s.recv(100))\n";
    let body = json!({"contract": "probe-contract", "argv": ["python3", "-c", probe]});
    let (status, record) = service.call(AGENT, "POST", "/v1/runs?wait=true", Some(&body));
    assert_eq!(status, 200, "{record}\n{}", service.log());
    assert_eq!(record["status"], "suspected_escape", "{record}");
    let run_id = record["run_id"].as_str().unwrap();
    let shown = service.cli(&["quarantine", "show", run_id]);
    let shown: Value = serde_json::from_slice(&shown.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&shown.stderr)));
    let manifest = &shown["manifest"];
    assert_eq!(manifest["writable_paths_copied"], true, "{shown}");
    assert_eq!(manifest["tenant_flagged"], "tenant:agent", "{manifest}");
    let copy = service
        .state_dir()
        .join("quarantine")
        .join(run_id)
        .join("writable/tmp/notes.txt");
    assert_eq!(std::fs::read_to_string(copy).unwrap(), "named contract");
    // No unclaimed copy is left in the area.
    let leftovers: Vec<String> = std::fs::read_dir(service.state_dir().join("quarantine"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".cell-"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}
