//! Contracts with an OCI image through `airlock serve`: a named contract's image is
//! resolved and leased when the service starts (a missing one stops it, naming the
//! command that fetches it); an inline contract's image is resolved per request and
//! leased by its run or session, so `airlock image rm` is refused while a cell may use
//! it; an unpinned or unknown image is refused before any cell.

mod common;

use common::images::python_image;
use common::served::Served;
use serde_json::{json, Value};
use std::path::Path;
use std::process::{Command, Output, Stdio};

const KEY: &str = "alice-image-key";

/// `[server]` with a unix socket, TCP, alice (allowed inline contracts), and `contracts`
/// as `[server.contracts]` lines.
fn config(contracts: &str) -> String {
    format!(
        "[server]\nlisten = [\"unix:SOCK\", \"tcp:127.0.0.1:PORT\"]\n[server.contracts]\n\
         {contracts}\n[server.tenants.alice]\napi_key_sha256 = [\"{}\"]\n\
         inline_contracts = true\n",
        common::sha256_hex(KEY)
    )
}

/// curl over TCP as alice: (HTTP status, body).
fn call(service: &Served, method: &str, path: &str, body: Option<&Value>) -> (u16, String) {
    let body = body.map(Value::to_string);
    service.call_text(KEY, method, path, body.as_deref())
}

/// A run as alice with `?wait=true`: (HTTP status, the record or the error).
fn run(service: &Served, body: Value) -> (u16, Value) {
    let (status, answer) = service.call(KEY, "POST", "/v1/runs?wait=true", Some(&body));
    assert!(answer.is_object(), "{answer} {}", service.log());
    (status, answer)
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
    let layouts = tempfile::tempdir().unwrap();
    let mut reference = String::new();
    let mut service = Served::start(&config("py = \"py.yaml\""), |dir| {
        reference = python_image(&dir.join("state"), layouts.path());
        std::fs::write(dir.join("py.yaml"), format!("image: {reference}\n")).unwrap();
    });
    let state = service.state_dir();

    // No argv: the image's Entrypoint, as its User and WorkingDir, JSON on stdin.
    let (status, record) = run(
        &service,
        json!({"contract": "py", "argv": [], "stdin": "{\"n\": 7}"}),
    );
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
    let (_, stored) = call(&service, "GET", &format!("/v1/runs/{run_id}"), None);
    let digest = reference.split('@').nth(1).unwrap();
    assert!(
        stored.contains(digest),
        "the record names {digest}: {stored}"
    );

    // The image's root: a host-only file is not there.
    let marker = service.path("host-marker");
    std::fs::write(&marker, "host only").unwrap();
    let (_, record) = run(
        &service,
        json!({"contract": "py", "argv": ["python3", "-c",
        format!("import os; print(os.path.exists({:?}), os.path.exists('/app/tool.py'))", marker)]}),
    );
    assert_eq!(
        record["output"]["stdout"]["head"], "False True\n",
        "{record}"
    );

    // `airlock run` with the same image contract is handed to the service, which runs
    // it on the image from its own store (pinned by digest: the same content).
    let handed = Command::new(common::airlock_bin())
        .env("AIRLOCK_SOCKET", service.sock())
        .args(["run", "-v", "--contract"])
        .arg(service.path("py.yaml"))
        .args([
            "--",
            "python3",
            "-c",
            "import os; print(os.getuid(), os.path.exists('/app/tool.py'))",
        ])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let said = common::output_text(&handed);
    assert!(handed.status.success(), "{said}");
    assert!(said.contains("handed to the service"), "{said}");
    assert_eq!(
        String::from_utf8_lossy(&handed.stdout),
        "1000 True\n",
        "{said}"
    );

    // The service holds the named contract's image for as long as it runs.
    let rm = image_rm(&state, &reference);
    assert!(
        !rm.status.success(),
        "rm of a leased image: {}",
        common::output_text(&rm)
    );
    service.kill();
    let rm = image_rm(&state, &reference);
    assert!(rm.status.success(), "{}", common::output_text(&rm));

    // Without its image the service does not start, and says how to fetch it.
    let out = service.serve().output().unwrap();
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
    let layouts = tempfile::tempdir().unwrap();
    let mut reference = String::new();
    let service = Served::start(&config("small = \"small.yaml\""), |dir| {
        reference = python_image(&dir.join("state"), layouts.path());
        std::fs::copy(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/contracts/default.yaml"),
            dir.join("small.yaml"),
        )
        .unwrap();
    });
    let state = service.state_dir();

    let inline = json!({"image": reference, "filesystem": {"writable_paths": ["/tmp"]}});
    let (status, text) = call(
        &service,
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
        let (status, text) = call(
            &service,
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
    let rm = image_rm(&state, &reference);
    assert!(
        !rm.status.success(),
        "rm while a session uses it: {}",
        common::output_text(&rm)
    );
    let (status, text) = call(&service, "DELETE", &format!("/v1/sessions/{session}"), None);
    assert_eq!(status, 200, "{text}");
    // ... and can once it is closed.
    let rm = image_rm(&state, &reference);
    assert!(rm.status.success(), "{}", common::output_text(&rm));

    // A removed image, a tag and a malformed reference: refused before any cell, each
    // with its class; no run starts.
    let refused = |image: &str| {
        let (status, answer) = run(
            &service,
            json!({"contract_inline": {"image": image}, "argv": ["true"]}),
        );
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
    let (_, list) = call(&service, "GET", "/v1/runs?status=ok", None);
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
