//! Contract validation through the real binary: every broken contract is refused before
//! anything runs (exit 125, class `policy_denied`), and the error names the field path and
//! the rule. Valid TOML and JSON contracts run.
mod common;

use common::CellRun;
use serde_json::Value;
use std::path::Path;
use std::process::{Command, Stdio};

/// What the payload prints if it ever runs.
const RAN: &str = "PAYLOAD-RAN-7f3a";

/// Writes `text` to `contract.<ext>` in a fresh directory and runs
/// `airlock run --contract contract.<ext> --result r.json -- /bin/echo RAN`.
fn run_contract(ext: &str, text: &str) -> CellRun {
    let dir = tempfile::tempdir().unwrap();
    run_contract_in(dir.path(), ext, text)
}

fn run_contract_in(dir: &Path, ext: &str, text: &str) -> CellRun {
    run_contract_argv(dir, ext, text, &["/bin/echo", RAN])
}

fn run_contract_argv(dir: &Path, ext: &str, text: &str, argv: &[&str]) -> CellRun {
    let contract = dir.join(format!("contract.{ext}"));
    std::fs::write(&contract, text).unwrap();
    let result_path = dir.join("r.json");
    let output = Command::new(common::airlock_bin())
        .current_dir(dir)
        .arg("run")
        .arg("--state-dir")
        .arg(common::state_dir())
        .arg("--contract")
        .arg(&contract)
        .arg("--result")
        .arg(&result_path)
        .arg("--")
        .args(argv)
        .stdin(Stdio::null())
        .output()
        .expect("spawn airlock");
    let result = std::fs::read_to_string(&result_path)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or(Value::Null);
    CellRun {
        output,
        result,
        supervisor: None,
    }
}

/// Asserts the contract is refused: exit 125, the payload never ran, stderr carries every
/// expected `field: rule` message, and the result record (if written) says policy_denied.
fn assert_refused(ext: &str, text: &str, expected: &[&str]) {
    let run = run_contract(ext, text);
    let d = run.describe();
    assert_eq!(run.code(), 125, "contract {text:?} must be refused\n{d}");
    assert!(
        !run.stdout().contains(RAN),
        "payload ran under a refused contract {text:?}\n{d}"
    );
    assert!(
        run.result["exit"]["code"].is_null() && run.result["exit"]["signal"].is_null(),
        "a refused contract has no payload exit\n{d}"
    );
    for message in expected {
        assert!(
            run.stderr().contains(message),
            "stderr must name the field and rule `{message}` for contract {text:?}\n{d}"
        );
    }
    if !run.result.is_null() {
        assert_eq!(run.status(), "policy_denied", "{d}");
        let error = run.result["error"].as_str().unwrap_or("");
        for message in expected {
            assert!(
                error.contains(message),
                "result error must carry `{message}`\n{d}"
            );
        }
    }
}

#[test]
fn unknown_top_level_field() {
    assert_refused(
        "yaml",
        "imagee: host\n",
        &["imagee: unknown field (expected one of `image`"],
    );
}

#[test]
fn unknown_nested_field() {
    assert_refused(
        "yaml",
        "resources:\n  memroy_mb: 128\n",
        &["resources.memroy_mb: unknown field"],
    );
    // Inside the seed's `execution_contract` wrapper too.
    assert_refused(
        "yaml",
        "execution_contract:\n  network:\n    mode: deny\n    allowd_domains: []\n",
        &["network.allowd_domains: unknown field"],
    );
}

#[test]
fn memory_mb_zero() {
    assert_refused(
        "yaml",
        "resources:\n  memory_mb: 0\n",
        &["resources.memory_mb: must be at least 4"],
    );
}

#[test]
fn negative_process_limit() {
    assert_refused(
        "yaml",
        "resources:\n  process_limit: -3\n",
        &["resources.process_limit: must be at least 1"],
    );
}

#[test]
fn dotdot_in_writable_path() {
    assert_refused(
        "yaml",
        "filesystem:\n  writable_paths:\n    - tmp/../etc\n",
        &["filesystem.writable_paths[0]: must not contain `..`"],
    );
}

#[test]
fn mount_target_under_etc() {
    assert_refused(
        "yaml",
        "filesystem:\n  writable_paths:\n    - /etc/cron.d\n",
        &["filesystem.writable_paths[0]: must not be or lie under /etc: the runtime provides it"],
    );
    assert_refused(
        "yaml",
        "filesystem:\n  readonly_inputs:\n    - source: /etc/hostname\n      target: /etc/passwd\n",
        &["filesystem.readonly_inputs[0].target: must not be or lie under /etc: the runtime provides it"],
    );
}

#[test]
fn duplicate_targets() {
    assert_refused(
        "yaml",
        "filesystem:\n  writable_paths:\n    - /data\n    - data/\n",
        &["filesystem.writable_paths[1]: duplicates the target /data of filesystem.writable_paths[0]"],
    );
}

#[test]
fn deny_mode_with_domains() {
    assert_refused(
        "yaml",
        "network:\n  mode: deny\n  allowed_domains: [api.test]\n",
        &["network.allowed_domains: must be empty when network.mode is deny"],
    );
}

#[test]
fn bad_domains() {
    for (domain, rule) in [
        ("https://api.test", "must be a host name, not a URL"),
        ("10.0.0.1", "must be a DNS name, not an IP address literal"),
        ("a..test", "must not have an empty label"),
        (
            "*.org",
            "a `*.` wildcard must cover a domain of at least two labels",
        ),
    ] {
        assert_refused(
            "yaml",
            &format!("network:\n  mode: allowlist\n  allowed_domains: [\"{domain}\"]\n"),
            &[&format!("network.allowed_domains[0]: {rule}")],
        );
    }
}

#[test]
fn uid_zero() {
    assert_refused(
        "yaml",
        "identity:\n  uid: 0\n  gid: 0\n",
        &[
            "identity.uid: must not be 0: the cell identity is never root",
            "identity.gid: must not be 0: the cell identity is never root",
        ],
    );
}

#[test]
fn cleanup_destroy_runtime_false() {
    assert_refused(
        "yaml",
        "cleanup:\n  destroy_runtime: false\n",
        &["cleanup.destroy_runtime: must be true: cells are always destroyed"],
    );
}

#[test]
fn reserved_env_http_proxy() {
    assert_refused(
        "yaml",
        "env:\n  HTTP_PROXY: http://evil.test:3128\n",
        &["env.HTTP_PROXY: is reserved"],
    );
    // Reserved in any case.
    assert_refused(
        "yaml",
        "env:\n  https_proxy: http://evil.test:3128\n",
        &["env.https_proxy: is reserved"],
    );
}

#[test]
fn output_allowlist_outside_writable_paths() {
    assert_refused(
        "yaml",
        "filesystem:\n  output_allowlist:\n    - output/report.pdf\n",
        &["filesystem.output_allowlist[0]: must lie inside a writable path (/tmp)"],
    );
}

#[test]
fn several_violations_reported_at_once() {
    assert_refused(
        "yaml",
        "identity:\n  uid: 0\nresources:\n  memory_mb: 0\ncleanup:\n  retain_outputs_only: false\n",
        &[
            "identity.uid: must not be 0",
            "resources.memory_mb: must be at least 4",
            "cleanup.retain_outputs_only: must be true",
        ],
    );
}

#[test]
fn unsupported_extension() {
    assert_refused(
        "ini",
        "[resources]\nmemory_mb = 128\n",
        &["unknown contract extension `ini`"],
    );
}

#[test]
fn malformed_yaml() {
    let run = run_contract("yaml", "resources: {memory_mb: [1\n");
    assert_eq!(run.code(), 125, "{}", run.describe());
    assert!(!run.stdout().contains(RAN), "{}", run.describe());
    assert!(
        run.stderr().contains("does not parse") && run.stderr().contains("line 1"),
        "a syntax error carries its position\n{}",
        run.describe()
    );
    if !run.result.is_null() {
        assert_eq!(run.status(), "policy_denied", "{}", run.describe());
    }
}

#[test]
fn duplicate_key_is_refused() {
    let run = run_contract("yaml", "image: host\nimage: host\n");
    assert_eq!(run.code(), 125, "{}", run.describe());
    assert!(!run.stdout().contains(RAN), "{}", run.describe());
    assert!(
        run.stderr().contains("duplicate") && run.stderr().contains("image"),
        "{}",
        run.describe()
    );
}

#[test]
fn missing_contract_file_is_a_runtime_fault() {
    let dir = tempfile::tempdir().unwrap();
    let result_path = dir.path().join("r.json");
    let output = Command::new(common::airlock_bin())
        .arg("run")
        .arg("--state-dir")
        .arg(common::state_dir())
        .arg("--contract")
        .arg(dir.path().join("absent.yaml"))
        .arg("--result")
        .arg(&result_path)
        .args(["--", "/bin/echo", RAN])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let result: Value = std::fs::read_to_string(&result_path)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or(Value::Null);
    let run = CellRun {
        output,
        result,
        supervisor: None,
    };
    assert_ne!(run.code(), 0, "{}", run.describe());
    assert!(!run.stdout().contains(RAN), "{}", run.describe());
    if !run.result.is_null() {
        assert_eq!(run.status(), "runtime_fault", "{}", run.describe());
    }
}

#[test]
fn valid_toml_contract_runs() {
    require_cells!();
    let run = run_contract(
        "toml",
        "hostname = \"tomlcell\"\n\n[resources]\nmemory_mb = 128\nprocess_limit = 16\n\n[env]\nGREETING = \"from-toml\"\n",
    );
    let d = run.describe();
    assert_eq!(run.code(), 0, "{d}");
    assert_eq!(run.status(), "ok", "{d}");
    assert_eq!(run.stdout(), format!("{RAN}\n"), "{d}");
    assert_eq!(
        run.result["plan"]["limits"]["memory_bytes"].as_u64(),
        Some(128 << 20),
        "{d}"
    );
    assert_eq!(run.result["plan"]["hostname"], "tomlcell", "{d}");
}

#[test]
fn valid_json_contract_runs() {
    require_cells!();
    let run = run_contract(
        "json",
        r#"{"execution_contract": {"image": "host", "resources": {"memory_mb": 96, "process_limit": 8}, "network": {"mode": "deny", "allowed_domains": []}}}"#,
    );
    let d = run.describe();
    assert_eq!(run.code(), 0, "{d}");
    assert_eq!(run.status(), "ok", "{d}");
    assert_eq!(run.stdout(), format!("{RAN}\n"), "{d}");
    assert_eq!(
        run.result["plan"]["limits"]["memory_bytes"].as_u64(),
        Some(96 << 20),
        "{d}"
    );
    assert_eq!(
        run.result["plan"]["limits"]["process_limit"].as_u64(),
        Some(8),
        "{d}"
    );
}

#[test]
fn contract_values_are_enforced_not_just_parsed() {
    require_cells!();
    let dir = tempfile::tempdir().unwrap();
    let run = run_contract_argv(
        dir.path(),
        "yml",
        "identity: {uid: 4242, gid: 4343}\nhostname: checked\nenv: {MARK: yes-it-is}\n",
        &["/bin/sh", "-c", "id -u; id -g; hostname; echo $MARK"],
    );
    assert_eq!(run.code(), 0, "{}", run.describe());
    assert_eq!(
        run.stdout(),
        "4242\n4343\nchecked\nyes-it-is\n",
        "{}",
        run.describe()
    );
}
