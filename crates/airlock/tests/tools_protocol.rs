//! The tool protocol through the real binary (`airlock tool`): the example tools, input
//! validated before any plan or cell, output validated against its schema, the 1 MiB cap
//! (a 10 MB tool is `truncated`, none of it handed on), stderr only in the audit record,
//! the environment and `/proc` of a tool, and schemas with remote references refused at
//! load, never fetched (a loopback server counts the requests).

mod common;

use serde_json::{json, Value};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/agent")
}

fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/tools")
}

fn tool_cmd(config: &Path, state: &Path, args: &[&str]) -> Output {
    Command::new(common::airlock_bin())
        .arg("tool")
        .arg("--config")
        .arg(config)
        .arg("--state-dir")
        .arg(state)
        .args(args)
        .output()
        .expect("airlock runs")
}

/// `airlock tool call NAME --input INPUT`: the envelope, and the whole output.
fn call_in(config: &Path, state: &Path, name: &str, input: &Value) -> (Value, Output) {
    let out = tool_cmd(
        config,
        state,
        &["call", name, "--input", &input.to_string()],
    );
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let envelope = serde_json::from_str(stdout.trim()).unwrap_or_else(|e| {
        panic!(
            "stdout is one JSON value ({e}): {stdout:?} {}",
            common::output_text(&out)
        )
    });
    (envelope, out)
}

fn call(name: &str, input: Value) -> (Value, Output) {
    call_in(
        &fixtures().join("airlock.toml"),
        common::state_dir(),
        name,
        &input,
    )
}

/// What the store holds of run `id` (`airlock runs show`).
fn record_of(id: &str) -> String {
    let out = Command::new(common::airlock_bin())
        .args(["runs", "--state-dir"])
        .arg(common::state_dir())
        .args(["show", id])
        .output()
        .unwrap();
    common::output_text(&out)
}

#[test]
fn the_example_tools_answer_with_validated_output() {
    require_cells!();
    let config = examples().join("airlock.toml");
    let state = common::state_dir();
    let query =
        json!({"query": "SELECT name, stock FROM items ORDER BY stock DESC", "max_rows": 2});
    let (reply, out) = call_in(&config, state, "db_query", &query);
    assert_eq!(reply["ok"], true, "{reply} {}", common::output_text(&out));
    assert_eq!(
        reply["output"]["rows"],
        json!([["washer", 3100], ["bolt", 1200]])
    );
    assert_eq!(reply["output"]["truncated"], true);
    assert_eq!(reply["run_id"].as_str().map(str::len), Some(36));

    let (reply, _) = call_in(&config, state, "csv_to_json", &json!({"csv": "a,b\n1,2\n"}));
    assert_eq!(
        reply["output"],
        json!({"columns": ["a", "b"], "rows": [{"a": "1", "b": "2"}]})
    );

    let (reply, _) = call_in(
        &config,
        state,
        "python_snippet",
        &json!({"code": "print(6 * 7)"}),
    );
    assert_eq!(reply["output"], json!({"printed": "42\n", "error": null}));
}

/// `airlock tool --config airlock.toml` from the configuration's own directory: its
/// relative paths are read against that directory, as with an absolute `--config` (the
/// empty parent of a bare file name once reached the contract compiler as a relative base).
#[test]
fn a_relative_config_path_is_read_against_its_own_directory() {
    require_cells!();
    let out = Command::new(common::airlock_bin())
        .current_dir(examples())
        .args(["tool", "--config", "airlock.toml", "--state-dir"])
        .arg(common::state_dir())
        .args(["call", "csv_to_json", "--input", r#"{"csv": "a,b\n1,2\n"}"#])
        .output()
        .expect("airlock runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let reply: Value = serde_json::from_str(stdout.trim())
        .unwrap_or_else(|e| panic!("one JSON value ({e}): {}", common::output_text(&out)));
    assert_eq!(reply["ok"], true, "{reply} {}", common::output_text(&out));
    assert_eq!(reply["output"]["rows"], json!([{"a": "1", "b": "2"}]));
}

#[test]
fn the_database_is_read_only_in_the_cell() {
    require_cells!();
    let config = examples().join("airlock.toml");
    let query = json!({"query": "DELETE FROM items"});
    let (reply, _) = call_in(&config, common::state_dir(), "db_query", &query);
    assert_eq!(reply["ok"], false, "{reply}");
    assert_eq!(reply["error"]["reason"], "tool.exit");
    let again = json!({"query": "SELECT count(*) FROM items"});
    let (reply, _) = call_in(&config, common::state_dir(), "db_query", &again);
    assert_eq!(reply["output"]["rows"], json!([[5]]), "{reply}");
}

#[test]
fn invalid_input_is_refused_naming_the_field_before_any_plan_or_cell() {
    require_cells!();
    // `strict`'s contract does not exist: planning it would fail as `tool.contract`, so an
    // `input.schema` refusal shows that nothing after the validation ran.
    let (reply, out) = call("strict", json!({"count": 0}));
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(reply["ok"], false);
    assert_eq!(reply["error"]["reason"], "input.schema", "{reply}");
    assert_eq!(reply["error"]["class"], "policy_denied");
    let message = reply["error"]["message"].as_str().unwrap();
    assert!(message.contains("/count"), "{message}");
    // The refusal is recorded, with no cell: no host identity was ever taken.
    let record = record_of(reply["run_id"].as_str().unwrap());
    assert!(record.contains("input.schema"), "{record}");
    assert!(record.contains("\"host_identity\":null"), "{record}");
    // Valid input gets as far as the contract.
    let (reply, _) = call("strict", json!({"count": 1}));
    assert_eq!(reply["error"]["reason"], "tool.contract", "{reply}");
    assert!(
        !reply.to_string().contains("missing-contract"),
        "no host path: {reply}"
    );
}

#[test]
fn input_that_is_not_json_and_unknown_tools_are_refused() {
    require_cells!();
    let out = tool_cmd(
        &fixtures().join("airlock.toml"),
        common::state_dir(),
        &["call", "echo", "--input", "{nope"],
    );
    let reply: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(reply["error"]["reason"], "input.not_json");
    let (reply, _) = call("no_such_tool", json!({}));
    assert_eq!(reply["error"]["reason"], "tool.unknown");
}

#[test]
fn the_tool_gets_exactly_the_validated_json_on_stdin() {
    require_cells!();
    let input = json!({"b": [1, 2.5, "é"], "a": {"nested": null}});
    let (reply, _) = call("echo", input.clone());
    assert_eq!(
        reply,
        json!({"ok": true, "output": {"echo": input}, "run_id": reply["run_id"]})
    );
}

#[test]
fn output_not_matching_its_schema_is_an_error_not_the_output() {
    require_cells!();
    let (reply, _) = call("wrong_shape", json!({}));
    assert_eq!(reply["ok"], false);
    assert_eq!(reply["error"]["reason"], "output.schema", "{reply}");
    assert_eq!(reply["error"]["class"], "task_error");
    assert!(reply.get("output").is_none());
}

#[test]
fn a_tool_printing_10_mb_is_truncated_and_none_of_it_is_handed_on() {
    require_cells!();
    let (reply, out) = call("flood", json!({}));
    assert_eq!(reply["ok"], false);
    assert_eq!(reply["error"]["reason"], "output.truncated", "{reply}");
    assert_eq!(reply["error"]["class"], "capacity_exceeded");
    assert!(
        out.stdout.len() < 1024,
        "the envelope is small: {} bytes",
        out.stdout.len()
    );
    assert!(!String::from_utf8_lossy(&out.stdout).contains("xxxx"));
    assert!(String::from_utf8_lossy(&out.stderr).contains("truncated true"));
}

#[test]
fn stderr_goes_to_the_audit_record_only() {
    require_cells!();
    let (reply, out) = call("stderr_secret", json!({"text": "hello"}));
    assert_eq!(reply["ok"], true, "{reply}");
    let all = common::output_text(&out);
    assert!(!all.contains("STDERR-MARKER"), "{all}");
    let record = record_of(reply["run_id"].as_str().unwrap());
    assert!(
        record.contains("STDERR-MARKER"),
        "the record keeps stderr: {record}"
    );
}

#[test]
fn a_tool_sees_neither_the_callers_environment_nor_other_processes_environ() {
    require_cells!();
    let marker = "caller-secret-3f9a1c";
    let out = Command::new(common::airlock_bin())
        .env("AIRLOCK_TEST_API_KEY", marker)
        .env("SOME_HOST_SECRET", marker)
        .arg("tool")
        .arg("--config")
        .arg(fixtures().join("airlock.toml"))
        .arg("--state-dir")
        .arg(common::state_dir())
        .args(["call", "env_probe", "--input", "{}"])
        .output()
        .unwrap();
    let reply: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(reply["ok"], true, "{reply}");
    let text = reply.to_string();
    assert!(!text.contains(marker), "{text}");
    assert!(!text.contains("AIRLOCK_TEST_API_KEY"), "{text}");
    // pid 1 (airlock's) is unreadable; the tool's own environ is the plan's.
    let proc = &reply["output"]["echo"]["proc"];
    assert!(
        proc["1"]
            .as_str()
            .is_some_and(|s| s.starts_with("unreadable")),
        "{proc}"
    );
}

/// A loopback HTTP server answering every request with a schema, counting them.
fn counting_server() -> (u16, Arc<AtomicUsize>) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let count = Arc::new(AtomicUsize::new(0));
    let seen = Arc::clone(&count);
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            seen.fetch_add(1, Ordering::SeqCst);
            let mut stream = stream;
            let mut buf = [0u8; 4096];
            let _ = stream.read(&mut buf);
            let body = "{\"type\": \"string\"}";
            let _ = write!(
                stream,
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                body.len()
            );
        }
    });
    (port, count)
}

#[test]
fn a_schema_with_a_remote_ref_is_refused_at_load_and_never_fetched() {
    let (port, count) = counting_server();
    let dir = tempfile::tempdir().unwrap();
    let refs = [
        format!("input_schema = {{ type = \"object\", properties = {{ q = {{ \"$ref\" = \"http://127.0.0.1:{port}/s.json\" }} }} }}\noutput_schema = {{ type = \"object\" }}"),
        format!("input_schema = {{ type = \"object\" }}\noutput_schema = {{ \"$id\" = \"http://127.0.0.1:{port}/base/\", \"$ref\" = \"s.json\" }}"),
        format!("input_schema = {{ \"$defs\" = {{ a = {{ \"$ref\" = \"http://127.0.0.1:{port}/s.json#/x\" }} }} }}\noutput_schema = {{ type = \"object\" }}"),
    ];
    for (i, schemas) in refs.iter().enumerate() {
        let config = dir.path().join(format!("remote-{i}.toml"));
        let text = format!(
            "[tools.remote]\ndescription = \"r\"\ncontract = \"c.yaml\"\ncommand = [\"true\"]\n{schemas}\n"
        );
        std::fs::write(&config, text).unwrap();
        let out = tool_cmd(&config, dir.path(), &["list"]);
        let text = common::output_text(&out);
        assert_eq!(out.status.code(), Some(2), "{text}");
        assert!(
            text.contains("tools.remote."),
            "names the tool and field: {text}"
        );
        assert!(
            text.contains("never fetched") || text.contains("$id"),
            "{text}"
        );
    }
    std::thread::sleep(std::time::Duration::from_millis(200));
    assert_eq!(
        count.load(Ordering::SeqCst),
        0,
        "no request reached the schema server"
    );
}

#[test]
fn list_and_describe_show_the_registry() {
    let state = tempfile::tempdir().unwrap();
    let out = tool_cmd(
        &examples().join("airlock.toml"),
        state.path(),
        &["list", "--json"],
    );
    let listed: Value = serde_json::from_slice(&out.stdout).unwrap();
    let names: Vec<&str> = listed
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    assert_eq!(names, ["csv_to_json", "db_query", "python_snippet"]);
    let out = tool_cmd(
        &examples().join("airlock.toml"),
        state.path(),
        &["describe", "db_query"],
    );
    let described: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(described["input_schema"]["required"], json!(["query"]));
    assert_eq!(described["max_output_bytes"], 1048576);
}

#[test]
fn a_tool_cell_that_is_a_suspected_escape_is_quarantined_with_its_writable_paths() {
    require_cells!();
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/contracts/default.yaml"),
        dir.path().join("default.yaml"),
    )
    .unwrap();
    // It leaves a file in /tmp, then makes a syscall of the x32 ABI, which the filter
    // kills (SIGSYS): aimed at the boundary.
    let config = dir.path().join("airlock.toml");
    std::fs::write(
        &config,
        "[tools.escape]\ndescription = \"leaves a file, then an x32 syscall\"\n\
         contract = \"default.yaml\"\n\
         command = [\"python3\", \"-c\", \"open('/tmp/left.txt', 'w').write('left behind')\\n\
         import ctypes\\nctypes.CDLL(None).syscall(0x40000000 | 39)\"]\n\
         input_schema = { type = \"object\" }\noutput_schema = { type = \"object\" }\n",
    )
    .unwrap();
    let state = dir.path().join("state");
    let (envelope, out) = call_in(&config, &state, "escape", &json!({}));
    assert_eq!(
        envelope["ok"],
        false,
        "{envelope} {}",
        common::output_text(&out)
    );
    let quarantine = |args: &[&str]| {
        let out = Command::new(common::airlock_bin())
            .arg("quarantine")
            .args(args)
            .arg("--state-dir")
            .arg(&state)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let listed = quarantine(&["list"]);
    assert!(
        listed.contains("tool:escape"),
        "nothing quarantined: {listed:?}"
    );
    let run_id = listed.split_whitespace().next().unwrap().to_string();
    let shown: Value = serde_json::from_str(&quarantine(&["show", &run_id])).unwrap();
    assert_eq!(
        shown["record"]["run"]["status"], "suspected_escape",
        "{shown}"
    );
    let manifest = &shown["manifest"];
    assert_eq!(manifest["writable_paths_copied"], true, "{shown}");
    assert_eq!(
        manifest["writable"]["copied"],
        json!([["/tmp/left.txt", 11]]),
        "{shown}"
    );
    assert_eq!(manifest["tenant_flagged"], "uid:0", "{shown}");
}
