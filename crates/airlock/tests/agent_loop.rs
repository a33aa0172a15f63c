//! `airlock agent` against a scripted OpenAI-compatible server in this repository
//! (tests/fixtures/agent/chat_server.py): a 429 then success, tool calls with valid and
//! invalid arguments, an oversized output, a tool writing secrets to stderr and one
//! looking for the API key. The assertions are on what the server received: only the
//! tool protocol's envelopes, no stderr, no API key, no host path. Also OpenAI's shell
//! action mapped onto a session, and the official `openai` package against the same
//! server.

mod common;

use serde_json::{json, Value};
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

const API_KEY: &str = "sk-test-agent-key-5b2f0c9e";

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/agent")
}

fn python() -> String {
    std::env::var("AIRLOCK_TEST_PYTHON").unwrap_or_else(|_| "python3".into())
}

struct ChatServer {
    child: Child,
    port: u16,
    record: PathBuf,
}

impl Drop for ChatServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl ChatServer {
    fn start(dir: &Path, script: &Value) -> ChatServer {
        let script_path = dir.join("script.json");
        std::fs::write(&script_path, script.to_string()).unwrap();
        let record = dir.join("received.jsonl");
        let mut child = Command::new(python())
            .arg(fixtures().join("chat_server.py"))
            .arg(&script_path)
            .arg(&record)
            .stdout(Stdio::piped())
            .spawn()
            .expect("the test server starts");
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let port = line
            .trim()
            .strip_prefix("listening ")
            .unwrap()
            .parse()
            .unwrap();
        ChatServer {
            child,
            port,
            record,
        }
    }

    fn base_url(&self) -> String {
        format!("http://127.0.0.1:{}/v1", self.port)
    }

    fn received(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.record)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }
}

fn tool_call(id: &str, name: &str, arguments: &str) -> Value {
    json!({"id": id, "type": "function", "function": {"name": name, "arguments": arguments}})
}

fn assistant(calls: Vec<Value>) -> Value {
    json!({"status": 200, "body": {"id": "c", "object": "chat.completion", "model": "test-model",
        "choices": [{"index": 0, "finish_reason": "tool_calls",
                     "message": {"role": "assistant", "content": null, "tool_calls": calls}}]}})
}

fn answer(text: &str) -> Value {
    json!({"status": 200, "body": {"id": "c", "object": "chat.completion", "model": "test-model",
        "choices": [{"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "content": text}}]}})
}

fn agent(server: &ChatServer, state: &Path, extra: &[&str], task: &str) -> std::process::Output {
    Command::new(common::airlock_bin())
        .env("AIRLOCK_TEST_API_KEY", API_KEY)
        .arg("agent")
        .arg("--config")
        .arg(fixtures().join("airlock.toml"))
        .arg("--state-dir")
        .arg(state)
        .args([
            "--model",
            "test-model",
            "--base-url",
            &server.base_url(),
            "--max-turns",
            "4",
        ])
        .args(extra)
        .arg(task)
        .output()
        .unwrap()
}

/// The tool message answering call `id` in the last request the server received.
fn tool_message(last: &Value, id: &str) -> Value {
    let message = last["body"]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["tool_call_id"] == id)
        .unwrap_or_else(|| panic!("no tool message for {id}: {last}"))
        .clone();
    serde_json::from_str(message["content"].as_str().unwrap()).unwrap()
}

#[test]
fn the_model_receives_only_validated_envelopes_never_stderr_keys_or_host_paths() {
    require_cells!();
    let dir = tempfile::tempdir().unwrap();
    let script = json!([
        {"status": 429, "body": {"error": {"message": "slow down"}}},
        assistant(vec![
            tool_call("call_valid", "echo", r#"{"text": "hello"}"#),
            tool_call("call_invalid", "strict", r#"{"count": "many"}"#),
            tool_call("call_not_json", "echo", "{not json"),
            tool_call("call_flood", "flood", "{}"),
            tool_call("call_stderr", "stderr_secret", r#"{"text": "t"}"#),
            tool_call("call_env", "env_probe", "{}"),
            tool_call("call_unknown", "rm_rf", "{}"),
        ]),
        answer("all done"),
    ]);
    let server = ChatServer::start(dir.path(), &script);
    let state = dir.path().join("state");
    let out = agent(&server, &state, &[], "Call the tools.");
    let text = common::output_text(&out);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "all done");
    let received = server.received();
    assert_eq!(
        received.len(),
        3,
        "a 429, its retry, the answer: {received:?}"
    );
    for request in &received {
        assert_eq!(request["authorization"], format!("Bearer {API_KEY}"));
        let raw = request["raw"].as_str().unwrap();
        assert!(
            !raw.contains(API_KEY),
            "the key is only in the header: {raw}"
        );
        assert!(!raw.contains("AIRLOCK_TEST_API_KEY"), "{raw}");
        assert!(
            !raw.contains("STDERR-MARKER") && !raw.contains("id_rsa"),
            "no stderr: {raw}"
        );
        for host_path in [
            state.to_str().unwrap(),
            fixtures().to_str().unwrap(),
            "/work/",
            "/var/lib/airlock",
        ] {
            assert!(!raw.contains(host_path), "no host path {host_path}: {raw}");
        }
        assert_eq!(request["body"]["tools"][0]["type"], "function");
    }
    let last = &received[2];
    let valid = tool_message(last, "call_valid");
    assert_eq!(valid["ok"], true);
    assert_eq!(valid["output"], json!({"echo": {"text": "hello"}}));
    assert_eq!(valid["run_id"].as_str().map(str::len), Some(36));
    assert_eq!(
        tool_message(last, "call_invalid")["error"]["reason"],
        "input.schema"
    );
    assert_eq!(
        tool_message(last, "call_not_json")["error"]["reason"],
        "input.not_json"
    );
    let flood = tool_message(last, "call_flood");
    assert_eq!(flood["error"]["reason"], "output.truncated");
    assert!(
        last["raw"].as_str().unwrap().len() < 64 << 10,
        "nothing of the 10 MB reached the model"
    );
    assert_eq!(tool_message(last, "call_stderr")["ok"], true);
    assert_eq!(tool_message(last, "call_env")["ok"], true);
    assert_eq!(
        tool_message(last, "call_unknown")["error"]["reason"],
        "tool.unknown"
    );
    // Every tool message is exactly an envelope.
    for message in last["body"]["messages"].as_array().unwrap() {
        if message["role"] == "tool" {
            let envelope: Value =
                serde_json::from_str(message["content"].as_str().unwrap()).unwrap();
            let keys: Vec<&String> = envelope.as_object().unwrap().keys().collect();
            assert!(
                keys == ["ok", "output", "run_id"] || keys == ["error", "ok", "run_id"],
                "{envelope}"
            );
        }
    }
    // The transcript is stored, redacted.
    let stderr = String::from_utf8_lossy(&out.stderr);
    let id = stderr.split("transcript ").nth(1).unwrap().trim();
    let store = airlock_store::Store::open(&state).unwrap();
    let transcript = store
        .transcript(id)
        .unwrap()
        .expect("the transcript is stored");
    assert_eq!(transcript.outcome, "answered");
    assert_eq!(transcript.tool_calls, 7);
    assert!(!transcript.messages.to_string().contains(API_KEY));
}

#[test]
fn the_deadline_cuts_a_tool_call_and_ends_the_task() {
    require_cells!();
    let dir = tempfile::tempdir().unwrap();
    let script = json!([
        assistant(vec![tool_call("call_slow", "sleep", r#"{"seconds": 50}"#)]),
        answer("too late"),
    ]);
    let server = ChatServer::start(dir.path(), &script);
    let started = std::time::Instant::now();
    let out = agent(
        &server,
        &dir.path().join("state"),
        &["--deadline", "4"],
        "Sleep.",
    );
    let text = common::output_text(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("deadline after"), "{text}");
    assert!(
        started.elapsed() < std::time::Duration::from_secs(40),
        "{text}"
    );
    // The tool's cell was cut at the deadline; the model was not asked again.
    assert_eq!(server.received().len(), 1, "{text}");
}

#[test]
fn a_contract_taking_the_api_key_as_a_credential_is_refused() {
    require_cells!();
    let dir = tempfile::tempdir().unwrap();
    let contract = dir.path().join("greedy.yaml");
    std::fs::write(
        &contract,
        "image: host\ncredentials:\n  - { name: key, from_env: AIRLOCK_TEST_API_KEY, env: KEY }\n",
    )
    .unwrap();
    let config = dir.path().join("airlock.toml");
    std::fs::write(&config, format!(
        "[tools.agent]\napi_key_env = \"AIRLOCK_TEST_API_KEY\"\n[tools.greedy]\ndescription = \"g\"\ncontract = {:?}\ncommand = [\"env\"]\ninput_schema = {{ type = \"object\" }}\noutput_schema = {{ type = \"object\" }}\n",
        contract
    )).unwrap();
    let script = json!([
        assistant(vec![tool_call("call_1", "greedy", "{}")]),
        answer("ok")
    ]);
    let server = ChatServer::start(dir.path(), &script);
    let out = Command::new(common::airlock_bin())
        .env("AIRLOCK_TEST_API_KEY", API_KEY)
        .args(["agent", "--config"])
        .arg(&config)
        .arg("--state-dir")
        .arg(dir.path().join("state"))
        .args(["--model", "m", "--base-url", &server.base_url(), "task"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", common::output_text(&out));
    let received = server.received();
    let reply = tool_message(&received[1], "call_1");
    assert_eq!(
        reply["error"]["reason"], "policy.credential_forbidden",
        "{reply}"
    );
    assert!(!received[1]["raw"].as_str().unwrap().contains(API_KEY));
}

#[test]
fn openai_shell_actions_run_in_one_session() {
    require_cells!();
    let dir = tempfile::tempdir().unwrap();
    let action = json!({"commands": ["echo kept > /tmp/f", "cat /tmp/f; echo to-stderr >&2", "sleep 30"],
                        "timeout_ms": 1500, "max_output_length": 64});
    let script = json!([
        assistant(vec![tool_call("call_sh", "shell", &action.to_string())]),
        answer("shell done"),
    ]);
    let server = ChatServer::start(dir.path(), &script);
    let out = agent(
        &server,
        &dir.path().join("state"),
        &["--shell"],
        "Use the shell.",
    );
    assert_eq!(out.status.code(), Some(0), "{}", common::output_text(&out));
    let received = server.received();
    let output = tool_message(&received[1], "call_sh");
    assert_eq!(output["type"], "shell_call_output");
    assert_eq!(output["call_id"], "call_sh");
    assert_eq!(output["max_output_length"], 64);
    let entries = output["output"].as_array().unwrap();
    assert_eq!(
        entries[0]["outcome"],
        json!({"type": "exit", "exit_code": 0})
    );
    assert_eq!(
        entries[1]["stdout"], "kept\n",
        "files persist between commands: {output}"
    );
    assert_eq!(entries[1]["stderr"], "to-stderr\n");
    assert_eq!(entries[2]["outcome"]["type"], "timeout", "{output}");
    let offered = received[0]["body"]["tools"].as_array().unwrap();
    assert_eq!(offered.last().unwrap()["function"]["name"], "shell");
}

#[test]
fn the_openai_python_package_round_trips_tool_calls_through_airlock() {
    require_cells!();
    let dir = tempfile::tempdir().unwrap();
    let script = json!([
        {"status": 503, "body": {"error": {"message": "try later"}}},
        assistant(vec![tool_call("call_py", "echo", r#"{"from": "openai-python"}"#)]),
        answer("round trip"),
    ]);
    let server = ChatServer::start(dir.path(), &script);
    let out = Command::new(python())
        .arg(fixtures().join("openai_client.py"))
        .arg(server.base_url())
        .arg(common::airlock_bin())
        .arg(fixtures().join("airlock.toml"))
        .arg(dir.path().join("state"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", common::output_text(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("round trip"));
    let received = server.received();
    let reply = tool_message(received.last().unwrap(), "call_py");
    assert_eq!(
        reply["output"],
        json!({"echo": {"from": "openai-python"}}),
        "{reply}"
    );
}

/// A scripted Responses API answer whose output is `items` (with the fields the official
/// SDK's `Response` requires).
fn response(items: Vec<Value>) -> Value {
    json!({"status": 200, "body": {"id": "resp_1", "object": "response", "created_at": 1764547200,
        "model": "test-model", "output": items, "parallel_tool_calls": true,
        "tool_choice": "auto", "tools": [], "status": "completed"}})
}

fn shell_call(call_id: &str, commands: &[&str]) -> Value {
    json!({"type": "shell_call", "id": format!("sh_{call_id}"), "call_id": call_id,
           "status": "completed", "caller": {"type": "direct"},
           "action": {"commands": commands, "timeout_ms": 20000, "max_output_length": 256}})
}

fn said(text: &str) -> Value {
    json!({"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
           "content": [{"type": "output_text", "text": text, "annotations": []}]})
}

/// The input item of type `kind` answering `call_id` in a request the server received.
fn answer_item(request: &Value, kind: &str, call_id: &str) -> Value {
    request["body"]["input"]
        .as_array()
        .unwrap()
        .iter()
        .find(|item| item["type"] == kind && item["call_id"] == call_id)
        .unwrap_or_else(|| panic!("no {kind} for {call_id}: {request}"))
        .clone()
}

#[test]
fn a_responses_api_agent_uses_airlock_as_its_shell() {
    require_cells!();
    let dir = tempfile::tempdir().unwrap();
    let reasoning = json!({"type": "reasoning", "id": "rs_1", "summary": [],
                           "encrypted_content": "opaque-to-airlock"});
    let script = json!([
        {"status": 429, "body": {"error": {"message": "slow down"}}},
        response(vec![
            reasoning.clone(),
            shell_call("call_sh1", &["echo kept > /tmp/f", "cat /tmp/f; echo to-stderr >&2; exit 3"]),
            json!({"type": "function_call", "id": "fc_1", "call_id": "call_fn", "name": "echo",
                   "arguments": "{\"via\": \"responses\"}", "status": "completed"}),
        ]),
        response(vec![shell_call("call_sh2", &["cat /tmp/f", "cat /proc/1/environ | tr '\\0' '\\n'"])]),
        response(vec![said("all done")]),
    ]);
    let server = ChatServer::start(dir.path(), &script);
    let out = agent(
        &server,
        &dir.path().join("state"),
        &["--api", "responses", "--shell"],
        "Use the shell.",
    );
    let text = common::output_text(&out);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(text.contains("all done"), "{text}");
    let received = server.received();
    assert_eq!(received.len(), 4, "a 429, then three turns: {received:?}");
    // What was offered: the registry's tools as function tools, and the local shell.
    let offered = received[1]["body"]["tools"].as_array().unwrap();
    assert!(offered.contains(&json!({"type": "shell", "environment": {"type": "local"}})));
    assert!(offered
        .iter()
        .any(|t| t["type"] == "function" && t["name"] == "echo"));
    // Turn 2 passes the model's items back untouched and answers each call.
    let second = &received[2];
    let input = second["body"]["input"].as_array().unwrap();
    assert!(
        input.contains(&reasoning),
        "reasoning items go back as they came"
    );
    let shell = answer_item(second, "shell_call_output", "call_sh1");
    assert_eq!(shell["max_output_length"], 256);
    let entries = shell["output"].as_array().unwrap();
    assert_eq!(
        entries[0]["outcome"],
        json!({"type": "exit", "exit_code": 0})
    );
    assert_eq!(entries[1]["stdout"], "kept\n");
    assert_eq!(entries[1]["stderr"], "to-stderr\n");
    assert_eq!(
        entries[1]["outcome"],
        json!({"type": "exit", "exit_code": 3})
    );
    let function = answer_item(second, "function_call_output", "call_fn");
    let envelope: Value = serde_json::from_str(function["output"].as_str().unwrap()).unwrap();
    assert_eq!(envelope["ok"], true, "{envelope}");
    assert_eq!(envelope["output"]["echo"], json!({"via": "responses"}));
    // Turn 3: the same cell (the file persists), and no API key in the cell's pid 1.
    let later = answer_item(&received[3], "shell_call_output", "call_sh2");
    assert_eq!(later["output"][0]["stdout"], "kept\n", "{later}");
    for request in &received {
        let raw = request["raw"].as_str().unwrap();
        assert!(
            !raw.contains(API_KEY),
            "the API key never reaches the model"
        );
        assert_eq!(request["authorization"], format!("Bearer {API_KEY}"));
    }
    // The official SDK's types accept every item and tool airlock sent.
    let checked = Command::new(python())
        .arg(fixtures().join("responses_wire.py"))
        .arg(dir.path().join("script.json"))
        .arg(&server.record)
        .output()
        .unwrap();
    assert!(
        checked.status.success(),
        "{}",
        common::output_text(&checked)
    );
}

#[test]
fn a_shell_call_without_the_shell_offered_runs_nothing() {
    require_cells!();
    let dir = tempfile::tempdir().unwrap();
    let script = json!([
        response(vec![shell_call("call_x", &["echo ran"])]),
        response(vec![said("ok")]),
    ]);
    let server = ChatServer::start(dir.path(), &script);
    let out = agent(
        &server,
        &dir.path().join("state"),
        &["--api", "responses"],
        "No shell for you.",
    );
    assert_eq!(out.status.code(), Some(0), "{}", common::output_text(&out));
    let received = server.received();
    let offered = received[0]["body"]["tools"].as_array().unwrap();
    assert!(!offered.iter().any(|t| t["type"] == "shell"), "{offered:?}");
    let refused = answer_item(&received[1], "shell_call_output", "call_x");
    let entry = &refused["output"][0];
    assert_eq!(entry["outcome"], json!({"type": "exit", "exit_code": 126}));
    assert!(
        entry["stderr"].as_str().unwrap().contains("no shell tool"),
        "{entry}"
    );
    assert_eq!(entry["stdout"], "", "nothing ran: {entry}");
}
