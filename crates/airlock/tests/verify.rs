//! `airlock verify`, end to end: the real binary verifies a contract on this host, and a
//! verifier that can fail: for every check whose control an input can weaken, a test
//! weakens exactly that control and sees that check, and only that check, fail with a
//! non-zero exit (docs/verify.md lists the controls no input can weaken).

mod common;

use serde_json::Value;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

/// Every check, as `airlock verify --json` names them.
const CHECKS: [&str; 16] = [
    "fs.unmounted_read",
    "fs.write_outside",
    "egress.unapproved_domain",
    "egress.private_address",
    "host.processes",
    "host.runtime_socket",
    "ceiling.processes",
    "ceiling.memory",
    "ceiling.disk",
    "ceiling.output",
    "ceiling.wall_time",
    "residue.fresh_run",
    "artifact.undeclared",
    "credential.retained",
    "boundary.exercise",
    "permitted.smoke",
];

/// One `airlock verify` in a directory of its own, with its plants under `plant`.
struct Verification {
    dir: tempfile::TempDir,
}

impl Verification {
    fn new() -> Verification {
        Verification {
            dir: tempfile::tempdir().unwrap(),
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Where verify plants (it creates the directory, and removes it at the end).
    fn plant(&self) -> PathBuf {
        self.path("plant")
    }

    fn state(&self) -> PathBuf {
        self.path("state")
    }

    fn write(&self, name: &str, text: &str) -> PathBuf {
        let path = self.path(name);
        std::fs::write(&path, text).unwrap();
        path
    }

    /// `airlock verify --json` with `args`, its store and plants of its own, no service.
    fn run(&self, args: &[&str], env: &[(&str, &str)]) -> (Output, Value) {
        let out = Command::new(common::airlock_bin())
            .arg("verify")
            .arg("--json")
            .arg("--state-dir")
            .arg(self.state())
            .arg("--plant-dir")
            .arg(self.plant())
            .args(args)
            .env("AIRLOCK_SOCKET", "")
            .envs(env.iter().copied())
            .current_dir(self.dir.path())
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let json = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        (out, json)
    }
}

fn verdicts(json: &Value) -> Vec<(String, String)> {
    json["checks"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|c| {
            (
                c["check"].as_str().unwrap_or("").to_string(),
                c["verdict"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect()
}

fn failed(json: &Value) -> Vec<String> {
    verdicts(json)
        .into_iter()
        .filter(|(_, v)| v == "fail")
        .map(|(c, _)| c)
        .collect()
}

fn describe(out: &Output, json: &Value) -> String {
    format!(
        "exit {:?}\n{}\nstderr: {}",
        out.status.code(),
        serde_json::to_string_pretty(json).unwrap_or_default(),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// `check` failed, alone, with exit 1; and everything planted is gone.
fn assert_only_failed(v: &Verification, out: &Output, json: &Value, check: &str) {
    assert_eq!(failed(json), [check], "{}", describe(out, json));
    assert_eq!(out.status.code(), Some(1), "{}", describe(out, json));
    assert!(!v.plant().exists(), "the plants were left behind");
}

#[test]
fn every_check_passes_on_the_default_contract_and_the_plants_are_removed() {
    require_cells!();
    let v = Verification::new();
    let junit = v.path("verify.xml");
    let (out, json) = v.run(
        &[
            "--smoke",
            "echo permitted",
            "--junit",
            junit.to_str().unwrap(),
        ],
        &[],
    );
    let names: Vec<String> = verdicts(&json).into_iter().map(|(c, _)| c).collect();
    assert_eq!(names, CHECKS, "{}", describe(&out, &json));
    assert!(
        verdicts(&json).iter().all(|(_, verdict)| verdict == "pass"),
        "{}",
        describe(&out, &json)
    );
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out, &json));
    assert_eq!(json["passed"], true);
    assert!(
        json["duration_ms"].as_u64().unwrap() < 30_000,
        "{}",
        describe(&out, &json)
    );
    let xml = std::fs::read_to_string(&junit).unwrap();
    assert!(
        xml.contains("tests=\"16\" failures=\"0\" skipped=\"0\""),
        "{xml}"
    );
    assert!(!v.plant().exists(), "the plants were left behind");
    let pid = json["planted"]["marker_pid"].as_u64().unwrap();
    let name = json["planted"]["marker_process"].as_str().unwrap();
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    assert!(
        !String::from_utf8_lossy(&cmdline).contains(name),
        "the marker process outlived the verification"
    );
    // The verification is in the audit store, in the hash chain.
    let export = Command::new(common::airlock_bin())
        .args(["audit", "export", "--state-dir"])
        .arg(v.state())
        .output()
        .unwrap();
    let export = String::from_utf8_lossy(&export.stdout);
    let entry = export
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|e| e["kind"] == "verify.result")
        .unwrap_or_else(|| panic!("no verify.result entry in {export}"));
    assert_eq!(
        entry["body"]["checks"].as_array().map(Vec::len),
        Some(16),
        "{entry}"
    );
    assert_eq!(
        entry["body"]["contract_sha256"], json["contract_sha256"],
        "{entry}"
    );
    let verified = Command::new(common::airlock_bin())
        .args(["audit", "verify", "--state-dir"])
        .arg(v.state())
        .output()
        .unwrap();
    assert!(verified.status.success(), "{verified:?}");
}

#[test]
fn the_table_says_each_verdict_and_its_evidence() {
    require_cells!();
    let v = Verification::new();
    let out = Command::new(common::airlock_bin())
        .arg("verify")
        .arg("--state-dir")
        .arg(v.state())
        .env("AIRLOCK_SOCKET", "")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{table}");
    assert!(
        table.contains("egress.private_address") && table.contains("endpoint saw 0 connections"),
        "{table}"
    );
    assert!(
        table.contains("n/a   permitted.smoke"),
        "no smoke command is not a failure, and said so: {table}"
    );
    assert!(table.contains("0 of 16 checks failed"), "{table}");
}

// ---- a verifier that can fail: one weakened control, one failed check ----

/// A contract mounting `sub` of the plant directory at `/mnt/weak` (the probe looks for
/// its planted files wherever the contract's inputs show them).
fn contract_with_input(v: &Verification, sub: &str) -> PathBuf {
    let source = v.plant().join(sub);
    v.write(
        "weak.yaml",
        &format!(
            "filesystem:\n  readonly_inputs: [{{ source: {}, target: /mnt/weak }}]\n",
            source.display()
        ),
    )
}

#[test]
fn a_contract_mounting_the_markers_directory_fails_the_unmounted_read_check() {
    require_cells!();
    let v = Verification::new();
    let contract = contract_with_input(&v, "marker");
    let (out, json) = v.run(&["--contract", contract.to_str().unwrap()], &[]);
    assert_only_failed(&v, &out, &json, "fs.unmounted_read");
}

/// A contract allowing `name` on the endpoint's port, and an operator configuration that
/// maps it to the endpoint's address, exempting that address when `exempt`.
fn egress_weakened(v: &Verification, name: &str, exempt: bool) -> (Output, Value) {
    let port = common::free_port();
    let contract = v.write(
        "weak.yaml",
        &format!("network:\n  mode: allowlist\n  allowed_domains: [\"{name}:{port}\"]\n"),
    );
    let exempt = if exempt { "\"127.0.0.1/32\"" } else { "" };
    let config = v.write(
        "airlock.toml",
        &format!(
            "[egress]\nresolve = {{ \"{name}\" = \"127.0.0.1\" }}\nexempt_cidrs = [{exempt}]\n"
        ),
    );
    let port = port.to_string();
    v.run(
        &[
            "--contract",
            contract.to_str().unwrap(),
            "--config",
            config.to_str().unwrap(),
            "--endpoint-port",
            &port,
        ],
        &[],
    )
}

#[test]
fn allowing_the_unapproved_name_fails_the_unapproved_domain_check() {
    require_cells!();
    let v = Verification::new();
    let (out, json) = egress_weakened(&v, "unapproved.verify.airlock.test", true);
    assert_only_failed(&v, &out, &json, "egress.unapproved_domain");
}

#[test]
fn exempting_the_endpoints_address_fails_the_private_address_check() {
    require_cells!();
    let v = Verification::new();
    let (out, json) = egress_weakened(&v, "private.verify.airlock.test", true);
    assert_only_failed(&v, &out, &json, "egress.private_address");
}

#[test]
fn the_same_name_without_the_exemption_is_refused_as_a_private_address() {
    require_cells!();
    let v = Verification::new();
    let (out, json) = egress_weakened(&v, "private.verify.airlock.test", false);
    assert_eq!(
        failed(&json),
        Vec::<String>::new(),
        "{}",
        describe(&out, &json)
    );
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out, &json));
}

#[test]
fn a_contract_mounting_the_runtime_socket_fails_the_runtime_socket_check() {
    require_cells!();
    let v = Verification::new();
    let contract = contract_with_input(&v, "runtime");
    let (out, json) = v.run(&["--contract", contract.to_str().unwrap()], &[]);
    assert_only_failed(&v, &out, &json, "host.runtime_socket");
}

#[test]
fn an_output_allowlist_taking_every_file_fails_the_undeclared_artifact_check() {
    require_cells!();
    let v = Verification::new();
    let contract = v.write(
        "weak.yaml",
        "filesystem:\n  writable_paths: [/tmp]\n  output_allowlist: ['tmp/*']\n",
    );
    let (out, json) = v.run(&["--contract", contract.to_str().unwrap()], &[]);
    assert_only_failed(&v, &out, &json, "artifact.undeclared");
}

#[test]
fn a_store_without_redaction_fails_the_credential_check() {
    require_cells!();
    let v = Verification::new();
    let (out, json) = v.run(&[], &[("AIRLOCK_TEST_ONLY_DISABLE_REDACTION", "1")]);
    assert_only_failed(&v, &out, &json, "credential.retained");
}

#[test]
fn a_contract_mounting_the_exercise_marker_fails_the_boundary_exercise() {
    require_cells!();
    let v = Verification::new();
    let contract = contract_with_input(&v, "exercise");
    let (out, json) = v.run(&["--contract", contract.to_str().unwrap()], &[]);
    assert_only_failed(&v, &out, &json, "boundary.exercise");
}

#[test]
fn a_failing_smoke_command_fails_the_permitted_path_check() {
    require_cells!();
    let v = Verification::new();
    let (out, json) = v.run(&["--smoke", "exit 3"], &[]);
    assert_only_failed(&v, &out, &json, "permitted.smoke");
}

#[test]
fn a_plant_directory_that_exists_is_refused_and_left_alone() {
    let v = Verification::new();
    std::fs::create_dir(v.plant()).unwrap();
    std::fs::write(v.plant().join("keep"), "mine").unwrap();
    let (out, _) = v.run(&[], &[]);
    assert_eq!(out.status.code(), Some(125), "{out:?}");
    assert_eq!(
        std::fs::read_to_string(v.plant().join("keep")).unwrap(),
        "mine"
    );
}

// ---- a class, and a running service ----

/// An operator configuration with one class, `quick`, whose smoke command is `smoke`.
fn class_config(v: &Verification, smoke: &str) -> PathBuf {
    v.write(
        "airlock.toml",
        &format!(
            "[policy.classes.quick]\ndescription = \"quick\"\nsmoke = {smoke}\n\
             [policy.classes.quick.commands]\nunmatched = \"allow\"\n\
             [policy.classes.quick.template.resources]\nmemory_mb = 256\n"
        ),
    )
}

#[test]
fn a_class_is_verified_with_its_own_smoke_command_through_its_policy() {
    require_cells!();
    let v = Verification::new();
    let config = class_config(&v, r#"["/bin/sh", "-c", "echo smoke"]"#);
    let args = ["--class", "quick", "--config", config.to_str().unwrap()];
    let (out, json) = v.run(&args, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out, &json));
    assert!(
        verdicts(&json).iter().all(|(_, verdict)| verdict == "pass"),
        "{}",
        describe(&out, &json)
    );
    assert_eq!(json["class"], "quick");
    // The smoke run was a request of the class: its record names the class.
    let smoke = json["checks"][15]["runs"][0]["run_id"].as_str().unwrap();
    let shown = Command::new(common::airlock_bin())
        .args(["runs", "show", smoke, "--json", "--state-dir"])
        .arg(v.state())
        .output()
        .unwrap();
    let shown = String::from_utf8_lossy(&shown.stdout);
    assert!(shown.contains("\"workload_class\": \"quick\""), "{shown}");
}

#[test]
fn a_class_whose_policy_refuses_its_own_smoke_command_fails_the_permitted_path() {
    require_cells!();
    let v = Verification::new();
    let config = v.write(
        "airlock.toml",
        "[policy.classes.quick]\ndescription = \"quick\"\nsmoke = [\"/bin/true\"]\n\
         [policy.classes.quick.commands]\nunmatched = \"forbidden\"\n",
    );
    let args = ["--class", "quick", "--config", config.to_str().unwrap()];
    let (out, json) = v.run(&args, &[]);
    assert_only_failed(&v, &out, &json, "permitted.smoke");
}

/// `airlock serve` on a socket of its own, recording in `state`.
struct Service {
    child: std::process::Child,
    socket: PathBuf,
}

impl Service {
    fn start(v: &Verification) -> Service {
        let socket = v.path("airlock.sock");
        let config = v.write(
            "serve.toml",
            &format!("[server]\nlisten = [\"unix:{}\"]\n", socket.display()),
        );
        let child = Command::new(common::airlock_bin())
            .args(["serve", "--config"])
            .arg(config)
            .arg("--state-dir")
            .arg(v.state())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(v.path("serve.log")).unwrap())
            .spawn()
            .unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while !socket.exists() || std::os::unix::net::UnixStream::connect(&socket).is_err() {
            assert!(
                std::time::Instant::now() < deadline,
                "airlock serve did not start"
            );
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        Service { child, socket }
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn through_a_running_service_the_runs_are_handed_off_and_every_check_passes() {
    require_cells!();
    let v = Verification::new();
    let service = Service::start(&v);
    let out = Command::new(common::airlock_bin())
        .args(["verify", "--json", "--smoke", "true", "--state-dir"])
        .arg(v.state())
        .arg("--plant-dir")
        .arg(v.plant())
        .env("AIRLOCK_SOCKET", &service.socket)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let json: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out, &json));
    let via = |check: &str| -> String {
        let found = json["checks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["check"] == check)
            .unwrap();
        found["runs"][0]["via"].as_str().unwrap_or("").to_string()
    };
    for check in [
        "fs.unmounted_read",
        "egress.private_address",
        "ceiling.memory",
        "boundary.exercise",
        "permitted.smoke",
        // Its value, from this process's environment, travels with the hand-off; the
        // service's store is searched for it.
        "credential.retained",
    ] {
        assert_eq!(via(check), "service", "{check}: {}", describe(&out, &json));
    }
    // It keeps its run in the client's process, as `airlock run --output-dir` would.
    assert_eq!(via("artifact.undeclared"), "this process");
}

// ---- periodic verification in `airlock serve` ----

/// `curl` to the service: over its unix socket as the operator (uid 0), or over TCP with
/// `key`. Returns (HTTP status, body).
fn curl(socket: &std::path::Path, tcp: Option<(u16, &str)>, args: &[&str]) -> (u16, String) {
    let mut cmd = Command::new("curl");
    cmd.args(["-sS", "--max-time", "60", "-w", "\n%{http_code}"]);
    let base = match tcp {
        Some((port, key)) => {
            cmd.args(["-H", &format!("Authorization: Bearer {key}")]);
            format!("http://127.0.0.1:{port}")
        }
        None => {
            cmd.arg("--unix-socket").arg(socket);
            "http://airlock".to_string()
        }
    };
    let (path, rest) = args.split_first().unwrap();
    cmd.args(rest).arg(format!("{base}{path}"));
    let text = String::from_utf8_lossy(&cmd.output().unwrap().stdout).into_owned();
    let (body, status) = text.rsplit_once('\n').unwrap_or(("", "0"));
    (status.trim().parse().unwrap_or(0), body.to_string())
}

fn class_run_body(class: &str) -> String {
    format!(r#"{{"class": "{class}", "argv": ["true"]}}"#)
}

#[test]
fn a_service_verifying_its_classes_is_not_ready_and_refuses_a_failed_class_until_acknowledged() {
    require_cells!();
    let v = Verification::new();
    let socket = v.path("airlock.sock");
    let port = common::free_port();
    const KEY: &str = "verify-test-tenant-key";
    let config = v.write(
        "airlock.toml",
        &format!(
            "[server]\nlisten = [\"unix:{}\", \"tcp:127.0.0.1:{port}\"]\n\
             [server.tenants.alice]\napi_key_sha256 = [\"{}\"]\n\
             [server.verify]\nclasses = [\"broken\", \"sound\"]\ninterval_s = 3600\n\
             [policy.classes.broken]\ndescription = \"its smoke command fails\"\n\
             smoke = [\"/bin/false\"]\n\
             [policy.classes.broken.commands]\nunmatched = \"allow\"\n\
             [policy.classes.sound]\ndescription = \"its smoke command succeeds\"\n\
             smoke = [\"/bin/true\"]\n\
             [policy.classes.sound.commands]\nunmatched = \"allow\"\n",
            socket.display(),
            common::sha256_hex(KEY),
        ),
    );
    let mut child = Command::new(common::airlock_bin())
        .args(["serve", "--config"])
        .arg(&config)
        .arg("--state-dir")
        .arg(v.state())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(v.path("serve.log")).unwrap())
        .spawn()
        .unwrap();
    let log = || std::fs::read_to_string(v.path("serve.log")).unwrap_or_default();
    // Until both classes are verified the service is not ready (fail closed).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    let metrics = loop {
        let (_, metrics) = curl(&socket, None, &["/metrics"]);
        let verified = |class: &str| {
            metrics.contains(&format!(
                "airlock_verify_last_run_timestamp_seconds{{class=\"{class}\"}}"
            )) && !metrics.contains(&format!(
                "airlock_verify_last_run_timestamp_seconds{{class=\"{class}\"}} 0\n"
            ))
        };
        if verified("broken") && verified("sound") {
            break metrics;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("the classes were not verified: {metrics}\n{}", log());
        }
        std::thread::sleep(std::time::Duration::from_millis(250));
    };
    assert!(
        metrics.contains("airlock_verify_passed{class=\"broken\"} 0\n")
            && metrics.contains("airlock_verify_passed{class=\"sound\"} 1\n")
            && metrics.contains("airlock_verify_blocking{class=\"broken\"} 1\n"),
        "{metrics}"
    );
    let (status, body) = curl(&socket, None, &["/readyz"]);
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("broken"), "{body}");
    let post = |class: &str| {
        let body = class_run_body(class);
        curl(
            &socket,
            None,
            &[
                "/v1/runs",
                "-H",
                "content-type: application/json",
                "--data-binary",
                &body,
            ],
        )
    };
    let (status, body) = post("broken");
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("verify.failed"), "{body}");
    let (status, body) = post("sound");
    assert_eq!(status, 200, "{body}");
    // Only the operator acknowledges.
    let ack = ["/v1/verify/broken/ack", "-X", "POST"];
    let (status, body) = curl(&socket, Some((port, KEY)), &ack);
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("verify.not_operator"), "{body}");
    let (status, body) = curl(&socket, None, &ack);
    assert_eq!(status, 200, "{body}");
    let (status, body) = curl(&socket, None, &["/readyz"]);
    assert_eq!(status, 200, "{body}");
    let (status, body) = post("broken");
    assert_eq!(status, 200, "{body}");
    let _ = child.kill();
    let _ = child.wait();
}

#[test]
fn a_schedule_naming_a_class_that_does_not_exist_stops_the_service() {
    let v = Verification::new();
    let socket = v.path("airlock.sock");
    let config = v.write(
        "airlock.toml",
        &format!(
            "[server]\nlisten = [\"unix:{}\"]\n[server.verify]\nclasses = [\"nope\"]\n",
            socket.display()
        ),
    );
    let out = Command::new(common::airlock_bin())
        .args(["serve", "--config"])
        .arg(&config)
        .arg("--state-dir")
        .arg(v.state())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no workload class nope"),
        "{out:?}"
    );
}

// ---- an image ----

/// The image `name` of scripts/test-images.sh, as an OCI layout imported into `state`;
/// its pinned reference.
fn imported(v: &Verification, name: &str) -> String {
    use airlock_images::layout::{write_layout, NewImage};
    let tree = common::test_image_trees().join(name);
    let image = NewImage {
        name: Some(format!("airlock.test/{name}:1")),
        layers: vec![common::images::tree_layer(&tree)],
        gzip: false,
        defaults: Default::default(),
    };
    let layout = v.path(&format!("layout-{name}"));
    write_layout(&layout, &image).unwrap();
    let out = Command::new(common::airlock_bin())
        .args(["image", "--state-dir"])
        .arg(v.state())
        .arg("import")
        .arg(&layout)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

#[test]
fn an_image_with_python_is_verified_with_the_image_as_the_cells_root() {
    require_cells!();
    let v = Verification::new();
    let reference = imported(&v, "python");
    let (out, json) = v.run(&["--image", &reference], &[]);
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out, &json));
    assert_eq!(json["image"], reference.as_str());
    assert!(
        verdicts(&json)
            .iter()
            .all(|(check, verdict)| verdict == "pass" || check == "permitted.smoke"),
        "{}",
        describe(&out, &json)
    );
}

#[test]
fn an_image_the_probe_cannot_run_in_fails_closed() {
    require_cells!();
    let v = Verification::new();
    let reference = imported(&v, "distroless");
    let (out, json) = v.run(&["--image", &reference], &[]);
    assert_eq!(out.status.code(), Some(1), "{}", describe(&out, &json));
    for check in [
        "fs.unmounted_read",
        "egress.private_address",
        "ceiling.memory",
        "boundary.exercise",
    ] {
        assert!(
            failed(&json).contains(&check.to_string()),
            "{check} passed without its probe: {}",
            describe(&out, &json)
        );
    }
}
