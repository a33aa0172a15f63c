//! Workload classes through the real binary: the example classes load and resolve; a
//! request above its class, or a forbidden command, is denied with its code, recorded
//! (`policy_denied`, a capability review, the denial counted by `airlock stats`) and
//! never reaches a cell; a granted one runs with the generated contract and its record
//! shows asked vs granted; approvals (pending, self-approval refused, scoped, single
//! use, expiry, waiting).

mod common;

use common::airlock_bin;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

fn repo_file(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(name)
}

fn airlock(args: &[&str]) -> Output {
    Command::new(airlock_bin())
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn json_of(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}\n{}", text(&out.stdout), text(&out.stderr)))
}

/// A test's own configuration and state directory.
struct Setup {
    dir: tempfile::TempDir,
}

/// A class `t` running anything but `rm -rf`, with `files.test` requestable and
/// `git push` behind a prompt.
const CLASS: &str = r#"
[policy]
approvers = ["uid:0"]

[egress]
resolve = { "files.test" = "127.0.0.1" }

[policy.classes.t]
description = "test class"
approvals = { pending_seconds = PENDING, max_grant_seconds = 60 }

[policy.classes.t.template.resources]
memory_mb = 128

[policy.classes.t.bounds]
max_memory_mb = 256
requestable_domains = ["files.test:443"]

[policy.classes.t.commands]
default = "forbidden"
unmatched = "allow"

[[policy.classes.t.commands.rules]]
pattern = ["rm", "-rf"]
decision = "forbidden"
match = ["rm -rf /"]
not_match = ["rm x"]

[[policy.classes.t.commands.rules]]
pattern = ["git", "push"]
decision = "prompt"
match = ["git push"]
not_match = ["git pull"]
"#;

impl Setup {
    fn new() -> Setup {
        Setup::with_pending_seconds(900)
    }

    fn with_pending_seconds(seconds: u64) -> Setup {
        let dir = tempfile::tempdir().unwrap();
        let config = CLASS.replace("PENDING", &seconds.to_string());
        std::fs::write(dir.path().join("airlock.toml"), config).unwrap();
        Setup { dir }
    }

    fn config(&self) -> String {
        self.dir.path().join("airlock.toml").display().to_string()
    }

    fn state(&self) -> String {
        self.dir.path().join("state").display().to_string()
    }

    fn request(&self, json: &str) -> String {
        let path = self.dir.path().join(format!("req-{}.json", json.len()));
        std::fs::write(&path, json).unwrap();
        path.display().to_string()
    }

    /// `airlock run --class t [extra] -- argv` with this setup's config and state.
    fn run(&self, extra: &[&str], argv: &[&str]) -> Output {
        let mut args = vec!["run", "--class", "t"];
        args.extend(extra);
        args.push("--");
        args.extend(argv);
        self.cli(&args)
    }

    /// `airlock ARGS` with this setup's config (and state directory, but for `class`),
    /// placed before a `--`.
    fn cli(&self, args: &[&str]) -> Output {
        let state = self.state();
        let config = self.config();
        let mut options = vec!["--config", &config];
        if args[0] != "class" {
            options.extend(["--state-dir", &state]);
        }
        let split = args.iter().position(|a| *a == "--").unwrap_or(args.len());
        let mut all: Vec<&str> = args[..split].to_vec();
        all.extend(options);
        all.extend(&args[split..]);
        airlock(&all)
    }

    fn runs(&self) -> Vec<Value> {
        let out = self.cli(&["runs", "list", "--json", "--all-users"]);
        json_of(&out).as_array().cloned().unwrap_or_default()
    }

    fn events(&self, run_id: &str) -> Vec<Value> {
        let out = self.cli(&["runs", "show", run_id, "--json"]);
        json_of(&out)["events"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    fn policy_event(&self, run_id: &str) -> Value {
        self.events(run_id)
            .into_iter()
            .find(|e| e["kind"] == "policy.decision")
            .unwrap_or_else(|| panic!("no policy.decision event for {run_id}"))["body"]
            .clone()
    }
}

fn examples_config() -> String {
    repo_file("examples/classes/operator/airlock.toml")
        .display()
        .to_string()
}

#[test]
fn every_example_class_loads_and_resolves() {
    let config = examples_config();
    let listed = airlock(&["class", "list", "--config", &config]);
    assert!(listed.status.success(), "{}", text(&listed.stderr));
    let names: Vec<String> = text(&listed.stdout)
        .lines()
        .map(|l| l.split_whitespace().next().unwrap_or("").to_string())
        .collect();
    assert_eq!(
        names,
        [
            "case-documents",
            "document-conversion",
            "package-install",
            "package-run",
            "python-tool",
            "read-only-analysis",
            "repo-tests"
        ]
    );
    let cases: [(&str, &[&str], i32); 7] = [
        ("document-conversion", &["/input/convert.sh"], 0),
        (
            "document-conversion",
            &["bash", "-c", "/input/convert.sh"],
            1,
        ),
        ("repo-tests", &["bash", "-lc", "cd /work && make test"], 0),
        ("repo-tests", &["sh", "-c", "make && git push origin"], 1),
        ("python-tool", &["python3", "-m", "pip", "install", "x"], 1),
        (
            "package-install",
            &[
                "pip",
                "install",
                "--require-hashes",
                "-r",
                "/lock/requirements.txt",
            ],
            0,
        ),
        ("read-only-analysis", &["find", "/data", "-name", "x"], 75),
    ];
    for (class, argv, expected) in cases {
        let mut args = vec!["class", "resolve", class, "--config", &config, "--"];
        args.extend(argv);
        let out = airlock(&args);
        assert_eq!(
            out.status.code(),
            Some(expected),
            "{class} {argv:?}: {}",
            text(&out.stdout)
        );
        let evaluation = json_of(&out);
        let decision = evaluation["decision"].as_str().unwrap();
        assert_eq!(
            decision,
            ["granted", "denied", "needs_approval"]
                [[0, 1, 75].iter().position(|c| *c == expected).unwrap()]
        );
        if expected == 0 {
            assert!(evaluation["contract"]["resources"]["memory_mb"].is_i64());
        }
    }
    let shown = airlock(&["class", "show", "document-conversion", "--config", &config]);
    let shown = json_of(&shown);
    assert_eq!(shown["class"]["execution"]["tools"][0], "/input/convert.sh");
    assert_eq!(shown["class"]["template"]["resources"]["memory_mb"], 768);
}

#[test]
fn the_document_conversion_class_runs_its_tool_and_nothing_else() {
    require_cells!();
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().join("out");
    let state = dir.path().join("state");
    let config = examples_config();
    let run = |argv: &[&str]| {
        let mut args = vec!["run", "--config", &config, "--class", "document-conversion"];
        args.extend([
            "--state-dir",
            state.to_str().unwrap(),
            "--output-dir",
            out_dir.to_str().unwrap(),
        ]);
        args.push("--");
        args.extend(argv);
        airlock(&args)
    };
    let converted = run(&["/input/convert.sh"]);
    assert_eq!(
        converted.status.code(),
        Some(0),
        "{}",
        text(&converted.stderr)
    );
    assert!(out_dir.join("output/report.pdf").is_file());
    let shell = run(&["/bin/sh", "-c", "/input/convert.sh"]);
    assert_eq!(shell.status.code(), Some(125));
    assert!(text(&shell.stderr).contains("policy.code_execution_not_allowed"));
}

#[test]
fn resolve_prints_the_denial_with_its_code() {
    let setup = Setup::new();
    let req = setup.request(r#"{"memory_mb": 512}"#);
    let out = setup.cli(&["class", "resolve", "t", "--request", &req, "--", "true"]);
    assert_eq!(out.status.code(), Some(1));
    let evaluation = json_of(&out);
    assert_eq!(evaluation["decision"], "denied");
    assert_eq!(evaluation["reason"]["reason"], "policy.memory_above_class");
    assert_eq!(evaluation["reason"]["detail"], "memory_mb 512 > 256");
}

#[test]
fn a_request_above_the_class_is_denied_recorded_and_reviewed_without_a_cell() {
    let setup = Setup::new();
    let req = setup.request(r#"{"memory_mb": 4096}"#);
    let out = setup.run(&["--request", &req], &["true"]);
    assert_eq!(out.status.code(), Some(125), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("policy.memory_above_class"),
        "{}",
        text(&out.stderr)
    );
    let runs = setup.runs();
    assert_eq!(runs.len(), 1);
    let run = &runs[0];
    assert_eq!(run["status"], "policy_denied");
    assert_eq!(run["workload_class"], "t");
    // No plan was compiled, so no cell was cloned and no cgroup created.
    assert!(run["plan"].is_null());
    assert!(run["result"]["cgroup_version"].is_null());
    assert!(run["result"]["host_identity"].is_null());
    let event = setup.policy_event(run["run_id"].as_str().unwrap());
    assert_eq!(event["decision"], "deny");
    assert_eq!(event["reason_code"], "policy.memory_above_class");
    assert_eq!(event["asked"]["memory_mb"], 4096);
    let stats = json_of(&setup.cli(&["stats", "--json"]));
    assert_eq!(stats["t"]["denials"]["policy.memory_above_class"], 1);
    let reviews = json_of(&setup.cli(&["reviews", "list", "--json"]));
    assert_eq!(reviews[0]["reason_code"], "policy.memory_above_class");
    assert_eq!(reviews[0]["run_id"], run["run_id"]);
    let verified = setup.cli(&["audit", "verify"]);
    assert!(verified.status.success(), "{}", text(&verified.stderr));
}

#[test]
fn a_forbidden_command_in_a_script_never_reaches_a_cell() {
    let setup = Setup::new();
    let out = setup.run(&[], &["bash", "-lc", "echo hi && (cd / && rm -rf /)"]);
    assert_eq!(out.status.code(), Some(125), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("policy.command_forbidden"));
    assert!(
        text(&out.stdout).is_empty(),
        "nothing ran: {}",
        text(&out.stdout)
    );
    let runs = setup.runs();
    assert_eq!(runs[0]["status"], "policy_denied");
    // No plan was compiled: no cell was cloned, no cgroup made, no host identity leased.
    assert!(runs[0]["plan"].is_null());
    assert!(runs[0]["result"]["cgroup_version"].is_null());
    assert!(runs[0]["result"]["host_identity"].is_null());
    let event = setup.policy_event(runs[0]["run_id"].as_str().unwrap());
    assert_eq!(event["reason_code"], "policy.command_forbidden");
    let reviews = json_of(&setup.cli(&["reviews", "list", "--json"]));
    assert_eq!(reviews[0]["reason_code"], "policy.command_forbidden");
}

#[test]
fn a_domain_outside_the_class_is_denied() {
    let setup = Setup::new();
    let req = setup.request(r#"{"domains": ["elsewhere.test:443"]}"#);
    let out = setup.run(&["--request", &req], &["true"]);
    assert_eq!(out.status.code(), Some(125));
    assert!(text(&out.stderr).contains("policy.domain_not_in_class"));
}

#[test]
fn a_request_that_names_a_control_is_refused_as_invalid() {
    let setup = Setup::new();
    let req = setup.request(r#"{"cleanup": {"destroy_runtime": false}}"#);
    let out = setup.run(&["--request", &req], &["true"]);
    assert_eq!(out.status.code(), Some(125));
    assert!(
        text(&out.stderr).contains("policy.request_invalid"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn config_check_loads_the_class_files_and_runs_their_examples() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("classes")).unwrap();
    let config = dir.path().join("airlock.toml");
    std::fs::write(&config, "[policy]\nclasses_dir = \"classes\"\n").unwrap();
    let bad =
        "description = \"x\"\n[template]\n[[commands.rules]]\npattern = [\"git\", \"push\"]\n\
               decision = \"forbidden\"\nmatch = [\"git status\"]\n";
    std::fs::write(dir.path().join("classes/bad.toml"), bad).unwrap();
    let out = airlock(&["config", "check", config.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("rules[0]: example `git status` must match but does not"),
        "{}",
        text(&out.stderr)
    );
    let ok = airlock(&["config", "check", &examples_config()]);
    assert!(ok.status.success(), "{}", text(&ok.stderr));
}

#[test]
fn a_session_request_is_not_run_as_one_command() {
    let setup = Setup::new();
    let req = setup.request(r#"{"session": {"lifetime_seconds": 10}}"#);
    let out = setup.run(&["--request", &req], &["true"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
}

#[test]
fn class_and_contract_exclude_each_other() {
    let setup = Setup::new();
    let out = setup.run(&["--contract", "x.yaml"], &["true"]);
    assert_eq!(out.status.code(), Some(2));
}

/// The pending request's id, printed on stdout by a run that needs approval.
fn pending_id(out: &Output) -> String {
    assert_eq!(out.status.code(), Some(75), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("pending_approval"));
    text(&out.stdout).trim().to_string()
}

#[test]
fn the_requester_cannot_approve_its_own_request() {
    let setup = Setup::new();
    let req = setup.request(r#"{"domains": ["files.test:443"]}"#);
    // Made by root for itself: root is an approver, but not of its own request.
    let id = pending_id(&setup.run(&["--request", &req], &["true"]));
    let listed = json_of(&setup.cli(&["approvals", "list", "--json"]));
    assert_eq!(listed[0]["approval_id"], id.as_str());
    assert_eq!(listed[0]["status"], "pending_approval");
    assert_eq!(listed[0]["capability_keys"][0], "domain:files.test:443");
    let out = setup.cli(&["approvals", "approve", &id, "--reason", "mine"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("approval.self_approval"),
        "{}",
        text(&out.stderr)
    );
    let still = json_of(&setup.cli(&["approvals", "list", "--json"]));
    assert_eq!(still[0]["status"], "pending_approval");
}

#[test]
fn a_denied_approval_ends_the_request_as_a_recorded_denial() {
    let setup = Setup::new();
    let id = pending_id(&setup.run(&["--tenant", "agent-7"], &["git", "push"]));
    let out = setup.cli(&["approvals", "deny", &id, "--reason", "no publishing"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let again = setup.run(
        &["--tenant", "agent-7", "--approval", &id],
        &["git", "push"],
    );
    assert_eq!(again.status.code(), Some(125));
    assert!(text(&again.stderr).contains("policy.approval_denied"));
    assert!(text(&again.stderr).contains("no publishing"));
    // The decision is in the audit chain: who, what, when, why.
    let export = setup.cli(&["audit", "export"]);
    let decision = text(&export.stdout)
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .find(|e| e["kind"] == "approval.decision")
        .expect("an approval.decision entry");
    assert_eq!(decision["body"]["decision"]["decided_by"], "uid:0");
    assert_eq!(decision["body"]["decision"]["reason"], "no publishing");
    assert!(decision["at"].as_i64().unwrap() > 0);
}

#[test]
fn a_pending_request_expires() {
    let setup = Setup::with_pending_seconds(1);
    let id = pending_id(&setup.run(&["--tenant", "agent-7"], &["git", "push"]));
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let out = setup.cli(&["approvals", "approve", &id, "--reason", "late"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("approval.not_pending: the request is expired"),
        "{}",
        text(&out.stderr)
    );
    let all = json_of(&setup.cli(&["approvals", "list", "--all", "--json"]));
    assert_eq!(all[0]["status"], "expired");
    assert!(json_of(&setup.cli(&["approvals", "list", "--json"]))
        .as_array()
        .unwrap()
        .is_empty());
}

#[test]
fn a_domain_inside_the_class_runs_once_approved_and_the_approval_is_single_use() {
    require_cells!();
    let setup = Setup::new();
    let req = setup.request(r#"{"domains": ["files.test:443"]}"#);
    let tenant = ["--tenant", "agent-7", "--request", &req];
    let id = pending_id(&setup.run(&tenant, &["true"]));
    let out = setup.cli(&[
        "approvals",
        "approve",
        &id,
        "--reason",
        "needed for the fixture",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let mut with_approval = tenant.to_vec();
    with_approval.extend(["--approval", &id]);
    let ran = setup.run(&with_approval, &["sh", "-c", "echo ran"]);
    assert_ne!(ran.status.code(), Some(75));
    // The fingerprint includes argv: this approval was for `true`.
    assert_eq!(ran.status.code(), Some(2), "{}", text(&ran.stderr));
    let ran = setup.run(&with_approval, &["true"]);
    assert_eq!(ran.status.code(), Some(0), "{}", text(&ran.stderr));
    let runs = setup.runs();
    let granted = runs
        .iter()
        .find(|r| r["status"] == "ok")
        .expect("the approved run");
    assert_eq!(granted["plan"]["network"]["mode"], "allowlist");
    let event = setup.policy_event(granted["run_id"].as_str().unwrap());
    assert_eq!(event["decision"], "grant");
    assert_eq!(event["asked"]["domains"][0], "files.test:443");
    assert_eq!(event["granted"]["domains"][0], "files.test:443");
    assert_eq!(event["approvals"][0], id.as_str());
    assert_eq!(event["requester"], "tenant:agent-7");
    let reused = setup.run(&with_approval, &["true"]);
    assert_eq!(reused.status.code(), Some(125));
    assert!(
        text(&reused.stderr).contains("single use"),
        "{}",
        text(&reused.stderr)
    );
}

#[test]
fn a_granted_run_uses_the_class_template_and_records_asked_and_granted() {
    require_cells!();
    let setup = Setup::new();
    let req = setup.request(r#"{"memory_mb": 200}"#);
    let out = setup.run(&["--request", &req], &["sh", "-c", "echo hello"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "hello\n");
    let runs = setup.runs();
    assert_eq!(runs[0]["workload_class"], "t");
    assert_eq!(runs[0]["plan"]["limits"]["memory_bytes"], 200 << 20);
    let event = setup.policy_event(runs[0]["run_id"].as_str().unwrap());
    assert_eq!(event["asked"]["memory_mb"], 200);
    assert_eq!(event["granted"]["memory_mb"], 200);
    assert_eq!(event["granted"]["cpu_millis"], 1000);
    let stats = json_of(&setup.cli(&["stats", "--json"]));
    assert_eq!(stats["t"]["ok"], 1);
}

#[test]
fn a_class_scoped_approval_covers_later_requests_until_it_expires() {
    require_cells!();
    let setup = Setup::new();
    let id = pending_id(&setup.run(&["--tenant", "agent-7"], &["git", "push"]));
    let out = setup.cli(&[
        "approvals",
        "approve",
        &id,
        "--scope",
        "class_capability",
        "--for",
        "2",
        "--reason",
        "release day",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let too_long = pending_id(&setup.run(&["--tenant", "agent-8"], &["git", "push", "--tags"]));
    let refused = setup.cli(&[
        "approvals",
        "approve",
        &too_long,
        "--scope",
        "class_capability",
        "--for",
        "61",
    ]);
    assert!(
        text(&refused.stderr).contains("approval.grant_too_long"),
        "{}",
        text(&refused.stderr)
    );
    // Another tenant's identical command is covered while the approval holds (git is
    // not installed in every image: the run's own exit does not matter, its start does).
    let covered = setup.run(&["--tenant", "agent-9"], &["git", "push"]);
    assert_ne!(covered.status.code(), Some(75), "{}", text(&covered.stderr));
    assert_ne!(
        covered.status.code(),
        Some(125),
        "{}",
        text(&covered.stderr)
    );
    std::thread::sleep(std::time::Duration::from_millis(2500));
    let after = setup.run(&["--tenant", "agent-9"], &["git", "push"]);
    pending_id(&after);
}

#[test]
fn a_run_waits_for_its_approval_when_asked_to() {
    require_cells!();
    let setup = Setup::new();
    let state = setup.state();
    let config = setup.config();
    let mut waiting = Command::new(airlock_bin())
        .args([
            "run",
            "--config",
            &config,
            "--state-dir",
            &state,
            "--class",
            "t",
        ])
        .args([
            "--tenant",
            "agent-7",
            "--wait-approval",
            "120",
            "--",
            "git",
            "push",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Poll for the pending request instead of sleeping a fixed time.
    let id = loop {
        let listed = json_of(&setup.cli(&["approvals", "list", "--json"]));
        if let Some(id) = listed[0]["approval_id"].as_str() {
            break id.to_string();
        }
        assert!(
            waiting.try_wait().unwrap().is_none(),
            "the run did not wait"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    let out = setup.cli(&["approvals", "approve", &id, "--reason", "go"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let done = waiting.wait_with_output().unwrap();
    assert_ne!(done.status.code(), Some(75), "{}", text(&done.stderr));
    assert_ne!(done.status.code(), Some(125), "{}", text(&done.stderr));
    let used = json_of(&setup.cli(&["approvals", "list", "--all", "--json"]));
    assert_eq!(used[0]["status"], "used");
}

/// A class whose cell may use its egress proxy (api.test) and delivers /out files.
const PROBE_CLASS: &str = r#"
[egress]
resolve = { "api.test" = "127.0.0.1" }

[policy.classes.probe]
description = "egress probe"
[policy.classes.probe.template.network]
mode = "allowlist"
allowed_domains = ["api.test"]
[policy.classes.probe.template.filesystem]
writable_paths = ["/tmp", "/out"]
output_allowlist = ["/out/*"]
[policy.classes.probe.commands]
unmatched = "allow"
"#;

#[test]
fn a_suspected_escape_leaves_its_evidence_in_a_root_only_quarantine() {
    require_cells!();
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("airlock.toml");
    std::fs::write(&config, PROBE_CLASS).unwrap();
    let state = dir.path().join("state");
    let out_dir = dir.path().join("delivered");
    // Asking the proxy for the cloud metadata endpoint is a suspected escape.
    let probe = "import socket\nopen('/out/notes.txt', 'w').write('left behind')\n\
                 s = socket.create_connection(('127.0.0.1', 3128), timeout=5)\n\
                 s.sendall(b'CONNECT 169.254.169.254:80 HTTP/1.1\\r\\nHost: x\\r\\n\\r\\n')\n\
                 print(s.recv(100))\n";
    let (config, state_arg, out_arg) = (
        config.display().to_string(),
        state.display().to_string(),
        out_dir.display().to_string(),
    );
    let run = airlock(&[
        "run",
        "--config",
        &config,
        "--state-dir",
        &state_arg,
        "--class",
        "probe",
        "--output-dir",
        &out_arg,
        "--",
        "python3",
        "-c",
        probe,
    ]);
    assert!(
        text(&run.stderr).contains("suspected_escape"),
        "{}",
        text(&run.stderr)
    );
    assert!(
        text(&run.stderr).contains("evidence quarantined"),
        "{}",
        text(&run.stderr)
    );
    let listed = airlock(&["quarantine", "list", "--state-dir", &state_arg]);
    let line = text(&listed.stdout);
    let run_id = line
        .split_whitespace()
        .next()
        .expect("a quarantined run")
        .to_string();
    assert!(line.contains("probe"), "{line}");
    let shown = json_of(&airlock(&[
        "quarantine",
        "show",
        &run_id,
        "--state-dir",
        &state_arg,
    ]));
    assert_eq!(shown["manifest"]["files"][0], "/out/notes.txt");
    assert_eq!(shown["record"]["run"]["status"], "suspected_escape");
    let area = state.join("quarantine");
    assert_eq!(
        std::fs::metadata(&area).unwrap().permissions().mode() & 0o777,
        0o700
    );
    let evidence = area.join(&run_id).join("artifacts/0");
    assert_eq!(std::fs::read_to_string(evidence).unwrap(), "left behind");
    let reviews = airlock(&["reviews", "list", "--json", "--state-dir", &state_arg]);
    assert_eq!(json_of(&reviews)[0]["reason_code"], "suspected_escape");
}

/// A class whose runs fail with `runtime_fault` (its template's input is missing when
/// the run starts), retried at most twice.
const FLAKY_CLASS: &str = r#"
[policy.classes.flaky]
description = "retries"
retry = { max_retries = 2, backoff_ms = 10 }
[policy.classes.flaky.template.filesystem]
readonly_inputs = [{ source = "/nonexistent-airlock-policy-test/input", target = "/input" }]
[policy.classes.flaky.commands]
unmatched = "allow"

[policy.classes.steady]
description = "retries, with a task that fails"
retry = { max_retries = 2, backoff_ms = 10 }
[policy.classes.steady.commands]
unmatched = "allow"
"#;

/// The statuses of the runs of `class` recorded in `state`.
fn statuses(config: &str, state: &str, class: &str) -> Vec<String> {
    let out = airlock(&[
        "runs",
        "list",
        "--json",
        "--all-users",
        "--class",
        class,
        "--config",
        config,
        "--state-dir",
        state,
    ]);
    json_of(&out)
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["status"].as_str().unwrap().to_string())
        .collect()
}

fn flaky_setup() -> (tempfile::TempDir, String, String) {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("airlock.toml");
    std::fs::write(&config, FLAKY_CLASS).unwrap();
    let state = dir.path().join("state").display().to_string();
    (dir, config.display().to_string(), state)
}

#[test]
fn a_runtime_fault_is_retried_at_most_max_retries_times_only_with_an_idempotency_key() {
    let (dir, config, state) = flaky_setup();
    let keyed = dir.path().join("keyed.json");
    std::fs::write(&keyed, r#"{"idempotency_key": "job-42"}"#).unwrap();
    let keyed = keyed.display().to_string();
    let run = |extra: &[&str]| {
        let mut args = vec![
            "run",
            "--config",
            &config,
            "--state-dir",
            &state,
            "--class",
            "flaky",
        ];
        args.extend(extra);
        args.extend(["--", "true"]);
        airlock(&args)
    };
    let out = run(&["--request", &keyed]);
    assert_eq!(out.status.code(), Some(125), "{}", text(&out.stderr));
    assert_eq!(
        text(&out.stderr).matches("retrying").count(),
        2,
        "{}",
        text(&out.stderr)
    );
    assert_eq!(statuses(&config, &state, "flaky"), ["runtime_fault"; 3]);
    let unkeyed = run(&[]);
    assert_eq!(unkeyed.status.code(), Some(125));
    assert!(!text(&unkeyed.stderr).contains("retrying"));
    assert_eq!(
        statuses(&config, &state, "flaky").len(),
        4,
        "no retry without a key"
    );
}

#[test]
fn a_task_error_is_never_retried() {
    require_cells!();
    let (dir, config, state) = flaky_setup();
    let keyed = dir.path().join("keyed.json");
    std::fs::write(&keyed, r#"{"idempotency_key": "job-43"}"#).unwrap();
    let keyed = keyed.display().to_string();
    let out = airlock(&[
        "run",
        "--config",
        &config,
        "--state-dir",
        &state,
        "--class",
        "steady",
        "--request",
        &keyed,
        "--",
        "false",
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert!(!text(&out.stderr).contains("retrying"));
    assert_eq!(statuses(&config, &state, "steady"), ["task_error"]);
}

#[test]
fn a_suspected_escape_keeps_the_cells_writable_paths_copied_before_destruction_up_to_the_cap() {
    require_cells!();
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("airlock.toml");
    let revoked = dir.path().join("revoked.log");
    let (issue, revoke) = (dir.path().join("issue.sh"), dir.path().join("revoke.sh"));
    // A token provider of the test, logging every revocation.
    let scripts = [
        (&issue, "#!/bin/sh\necho '{\"token\": \"tok-quarantined\", \"expires_at_unix\": 99999999999}'\n".to_string()),
        (&revoke, format!("#!/bin/sh\ncat >> {0}\necho >> {0}\n", revoked.display())),
    ];
    for (path, text) in scripts {
        std::fs::write(path, text).unwrap();
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let secret = format!(
        "[secrets.api]\nsource = {{ provider = {{ command = [\"{}\"], revoke = [\"{}\"] }} }}\n\
         hosts = [\"api.test\"]\n\
         placement = {{ header = {{ name = \"Authorization\", format = \"Bearer {{}}\" }} }}\n",
        issue.display(),
        revoke.display()
    );
    std::fs::write(
        &config,
        format!(
            "[policy]\nquarantine_max_bytes = 4096\n{secret}{PROBE_CLASS}\
             [[policy.classes.probe.template.secrets]]\nname = \"api\"\nenv = \"API_TOKEN\"\n"
        ),
    )
    .unwrap();
    let state = dir.path().join("state");
    // Files in a writable path that is no output: gone with the cell, unless copied.
    let probe = "import os, socket\nopen('/tmp/a.txt', 'w').write('left in tmp')\n\
                 os.mkdir('/tmp/sub')\nopen('/tmp/sub/b.txt', 'w').write('deeper')\n\
                 os.symlink('/etc/passwd', '/tmp/link')\n\
                 open('/tmp/zbig', 'w').write('x' * 10000)\n\
                 s = socket.create_connection(('127.0.0.1', 3128), timeout=5)\n\
                 s.sendall(b'CONNECT 169.254.169.254:80 HTTP/1.1\\r\\nHost: x\\r\\n\\r\\n')\n\
                 print(s.recv(100))\n";
    let (config, state_arg) = (config.display().to_string(), state.display().to_string());
    let class_run = |argv: &[&str]| {
        let mut args = vec![
            "run",
            "--config",
            &config,
            "--state-dir",
            &state_arg,
            "--class",
            "probe",
            "--",
        ];
        args.extend(argv);
        airlock(&args)
    };
    let run = class_run(&["python3", "-c", probe]);
    assert!(
        text(&run.stderr).contains("evidence quarantined"),
        "{}",
        text(&run.stderr)
    );
    let listed = airlock(&["quarantine", "list", "--state-dir", &state_arg]);
    let listed = text(&listed.stdout);
    let run_id = listed.split_whitespace().next().expect("a quarantined run");
    let shown = json_of(&airlock(&[
        "quarantine",
        "show",
        run_id,
        "--state-dir",
        &state_arg,
    ]));
    let manifest = &shown["manifest"];
    assert_eq!(manifest["writable_paths_copied"], true, "{shown}");
    let writable = &manifest["writable"];
    assert_eq!(
        writable["copied"],
        serde_json::json!([["/tmp/a.txt", 11], ["/tmp/sub/b.txt", 6]]),
        "{writable}"
    );
    let skipped = writable["skipped"].as_array().unwrap();
    assert!(
        skipped.contains(&serde_json::json!(["/tmp/link", "symlink"])),
        "{writable}"
    );
    assert!(
        skipped.contains(&serde_json::json!(["/tmp/zbig", "cap"])),
        "{writable}"
    );
    assert_eq!(writable["capped"], true);
    assert_eq!(writable["max_bytes"], 4096);
    assert_eq!(manifest["tenant_flagged"], "uid:0");
    assert_eq!(manifest["credentials_revoked"], serde_json::json!(["api"]));
    assert_eq!(
        std::fs::read_to_string(&revoked).unwrap().trim(),
        "tok-quarantined",
        "the run's provider token was revoked"
    );
    let copy = state.join("quarantine").join(run_id).join("writable");
    assert_eq!(
        std::fs::read_to_string(copy.join("tmp/a.txt")).unwrap(),
        "left in tmp"
    );
    assert!(!copy.join("tmp/link").exists() && !copy.join("tmp/zbig").exists());
    assert_eq!(
        std::fs::metadata(copy.join("tmp"))
            .unwrap()
            .permissions()
            .mode()
            & 0o777,
        0o700
    );
    let reviews = json_of(&airlock(&[
        "reviews",
        "list",
        "--json",
        "--state-dir",
        &state_arg,
    ]));
    assert_eq!(reviews[0]["reason_code"], "suspected_escape");
    assert_eq!(reviews[0]["run_id"], run_id);
    // A run that is no suspected escape leaves nothing in the area.
    let fine = class_run(&["sh", "-c", "echo kept >/tmp/a.txt"]);
    assert_eq!(fine.status.code(), Some(0), "{}", text(&fine.stderr));
    let names: Vec<String> = std::fs::read_dir(state.join("quarantine"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        names,
        [run_id.to_string()],
        "only the quarantined run's directory"
    );
}
