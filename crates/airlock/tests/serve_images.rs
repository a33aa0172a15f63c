//! Contracts with an OCI image through `airlock serve`: a named contract's image is
//! resolved and leased when the service starts (a missing one stops it, naming the
//! command that fetches it); an inline contract's image is resolved per request and
//! leased by its run or session, so `airlock image rm` is refused while a cell may use
//! it; an unpinned or unknown image is refused before any cell.

mod common;

use common::images::python_image;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const KEY: &str = "alice-image-key";

struct Service {
    child: Child,
    dir: PathBuf,
    port: u16,
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The operator configuration in `dir`, with `contracts` as `[server.contracts]` lines.
fn configure(dir: &Path, contracts: &str) -> u16 {
    let port = common::free_port();
    let config = format!(
        r#"[server]
listen = ["unix:{sock}", "tcp:127.0.0.1:{port}"]
[server.contracts]
{contracts}
[server.tenants.alice]
api_key_sha256 = ["{key}"]
inline_contracts = true
"#,
        sock = dir.join("airlock.sock").display(),
        key = common::sha256_hex(KEY),
    );
    std::fs::write(dir.join("airlock.toml"), config).unwrap();
    port
}

fn serve(dir: &Path, state: &Path) -> Command {
    let mut serve = Command::new(common::airlock_bin());
    serve
        .arg("serve")
        .arg("--config")
        .arg(dir.join("airlock.toml"))
        .arg("--state-dir")
        .arg(state);
    serve
}

fn start(dir: &Path, state: &Path, port: u16) -> Service {
    let log = std::fs::File::create(dir.join("serve.log")).unwrap();
    let child = serve(dir, state)
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    let mut service = Service {
        child,
        dir: dir.to_path_buf(),
        port,
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while service.call("GET", "/healthz", None).0 != 200 {
        if let Ok(Some(status)) = service.child.try_wait() {
            panic!("airlock serve exited ({status}): {}", service.log());
        }
        assert!(Instant::now() < deadline, "no answer: {}", service.log());
        std::thread::sleep(Duration::from_millis(100));
    }
    service
}

impl Service {
    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("serve.log")).unwrap_or_default()
    }

    /// curl over TCP as alice: (HTTP status, body).
    fn call(&self, method: &str, path: &str, body: Option<&Value>) -> (u16, String) {
        let mut curl = Command::new("curl");
        curl.args([
            "-sS",
            "--max-time",
            "120",
            "-w",
            "\n%{http_code}",
            "-X",
            method,
        ])
        .args(["-H", &format!("Authorization: Bearer {KEY}")]);
        if let Some(body) = body {
            curl.args(["-H", "content-type: application/json", "--data-binary"])
                .arg(body.to_string());
        }
        curl.arg(format!("http://127.0.0.1:{}{path}", self.port));
        let out = curl.output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let (body, code) = text.rsplit_once('\n').unwrap_or(("", &text));
        (code.trim().parse().unwrap_or(0), body.to_string())
    }

    fn run(&self, body: Value) -> (u16, Value) {
        let (status, text) = self.call("POST", "/v1/runs?wait=true", Some(&body));
        let value =
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text} {}", self.log()));
        (status, value)
    }
}

fn image_rm(state: &Path, reference: &str) -> Output {
    Command::new(common::airlock_bin())
        .args(["image", "--state-dir"])
        .arg(state)
        .args(["rm", reference])
        .output()
        .unwrap()
}

/// The payload's JSON stdout from a run's record.
fn tool_reply(record: &Value) -> Value {
    let stdout = record["output"]["stdout"]["head"]
        .as_str()
        .unwrap_or_else(|| panic!("no stdout: {record}"));
    serde_json::from_str(stdout).unwrap_or_else(|e| panic!("{e}: {record}"))
}

#[test]
fn a_named_image_contract_runs_its_entrypoint_through_the_service_and_stays_leased() {
    require_cells!();
    let (dir, state, layouts) = (
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
    );
    let reference = python_image(state.path(), layouts.path());
    std::fs::write(dir.path().join("py.yaml"), format!("image: {reference}\n")).unwrap();
    let port = configure(dir.path(), "py = \"py.yaml\"");
    let service = start(dir.path(), state.path(), port);

    // No argv: the image's Entrypoint, as its User and WorkingDir, JSON on stdin.
    let (status, record) =
        service.run(json!({"contract": "py", "argv": [], "stdin": "{\"n\": 7}"}));
    assert_eq!(status, 200, "{record}");
    assert_eq!(record["status"], "ok", "{record}");
    let reply = tool_reply(&record);
    assert_eq!(reply["echo"], json!({"n": 7}), "{reply}");
    assert_eq!(
        (reply["uid"].clone(), reply["cwd"].clone()),
        (json!(1000), json!("/app"))
    );
    // The image's own /etc/shadow, never the host's.
    assert_eq!(
        reply["shadow"], "root:image-shadow:19000::::::\n",
        "{reply}"
    );
    // The stored record's plan names the image by its digest.
    let run_id = record["run_id"].as_str().unwrap();
    let (_, stored) = service.call("GET", &format!("/v1/runs/{run_id}"), None);
    let digest = reference.split('@').nth(1).unwrap();
    assert!(
        stored.contains(digest),
        "the record names {digest}: {stored}"
    );

    // The image's root: a host-only file is not there.
    let marker = dir.path().join("host-marker");
    std::fs::write(&marker, "host only").unwrap();
    let (_, record) = service.run(json!({"contract": "py", "argv": ["python3", "-c",
        format!("import os; print(os.path.exists({:?}), os.path.exists('/app/tool.py'))", marker)]}));
    assert_eq!(
        record["output"]["stdout"]["head"], "False True\n",
        "{record}"
    );

    // The service holds the named contract's image for as long as it runs.
    let rm = image_rm(state.path(), &reference);
    assert!(
        !rm.status.success(),
        "rm of a leased image: {}",
        common::output_text(&rm)
    );
    drop(service);
    let rm = image_rm(state.path(), &reference);
    assert!(rm.status.success(), "{}", common::output_text(&rm));

    // Without its image the service does not start, and says how to fetch it.
    let out = serve(dir.path(), state.path()).output().unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(
        said.contains("server.contracts.py") && said.contains("airlock image pull"),
        "{said}"
    );
}

#[test]
fn an_inline_image_contract_is_leased_by_its_session_and_bad_references_start_nothing() {
    require_cells!();
    let (dir, state, layouts) = (
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
    );
    let reference = python_image(state.path(), layouts.path());
    std::fs::copy(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/contracts/default.yaml"),
        dir.path().join("small.yaml"),
    )
    .unwrap();
    let port = configure(dir.path(), "small = \"small.yaml\"");
    let service = start(dir.path(), state.path(), port);

    let inline = json!({"image": reference, "filesystem": {"writable_paths": ["/tmp"]}});
    let (status, text) = service.call(
        "POST",
        "/v1/sessions",
        Some(&json!({"contract_inline": inline})),
    );
    assert_eq!(status, 201, "{text} {}", service.log());
    let session = serde_json::from_str::<Value>(&text).unwrap()["session_id"]
        .as_str()
        .unwrap()
        .to_string();
    let exec = |argv: Value| {
        let (status, text) = service.call(
            "POST",
            &format!("/v1/sessions/{session}/exec"),
            Some(&json!({"argv": argv})),
        );
        assert_eq!(status, 200, "{text}");
        text
    };
    // The image has no shell: Python writes and reads.
    exec(json!([
        "python3",
        "-c",
        "open('/tmp/f', 'w').write('kept')"
    ]));
    let out = exec(json!([
        "python3",
        "-c",
        "import os; print(open('/tmp/f').read(), os.getuid(), os.path.exists('/app/tool.py') and 'image')"
    ]));
    assert!(
        out.contains("kept") && out.contains("1000") && out.contains("image"),
        "{out}"
    );

    // The session's image cannot be removed while its cell lives...
    let rm = image_rm(state.path(), &reference);
    assert!(
        !rm.status.success(),
        "rm while a session uses it: {}",
        common::output_text(&rm)
    );
    let (status, text) = service.call("DELETE", &format!("/v1/sessions/{session}"), None);
    assert_eq!(status, 200, "{text}");
    // ... and can once it is closed.
    let rm = image_rm(state.path(), &reference);
    assert!(rm.status.success(), "{}", common::output_text(&rm));

    // A removed image, a tag and a malformed reference: refused before any cell, each
    // with its class; no run starts.
    let refused = |image: &str| {
        let (status, answer) =
            service.run(json!({"contract_inline": {"image": image}, "argv": ["true"]}));
        (
            status,
            answer["class"].clone(),
            answer["reason"].clone(),
            answer["error"].to_string(),
        )
    };
    let (status, class, reason, error) = refused(&reference);
    assert_eq!(
        (status, class, reason),
        (422, json!("sandbox_unavailable"), json!("contract.image"))
    );
    assert!(error.contains("airlock image pull"), "{error}");
    let (status, class, _, _) = refused("airlock.test/python:1");
    assert_eq!(
        (status, class),
        (422, json!("policy_denied")),
        "a tag is not a pin"
    );
    let (_, list) = service.call("GET", "/v1/runs?status=ok", None);
    let ok_runs: Value = serde_json::from_str(&list).unwrap();
    assert_eq!(
        ok_runs["runs"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["argv"] == json!(["true"]))
            .count(),
        0,
        "{ok_runs}"
    );
}
