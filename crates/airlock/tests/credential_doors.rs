//! Issue 32, item 1: the model's API key (and any variable the operator keeps for the
//! host) never reaches a cell, on any door. Every door is a row of [`Door`]: a contract,
//! tool or class asking for `OPENAI_API_KEY` (a unique random marker here) is refused
//! with `policy.credential_forbidden`, and the marker is in no output, record or log.
//! The allowed paths too: an ordinary credential still arrives, the operator's per-class
//! lift works and the record names it, and the `[secrets]` placeholder path still swaps
//! the key in at the proxy while the cell sees only its placeholder.

mod common;

use common::served::Served;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

const FORBIDDEN: &str = "policy.credential_forbidden";
/// The service tenant's API key (TCP, `/mcp`).
const TENANT_KEY: &str = "credential-doors-tenant-key";

/// Every entry point that starts a cell for a caller. A new door needs a row here, and
/// [`every_cli_command_is_a_door_or_says_why_not`] fails until the CLI's command is
/// listed either here or among the commands that start no cell with credentials.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Door {
    /// `airlock run` in its own process (a contract, and a class's template).
    Run,
    /// `airlock run` handed to a running `airlock serve`: the client's environment
    /// passed through to the service.
    Handoff,
    /// `POST /v1/runs` of `airlock serve` (a named contract, and a class).
    ServeRun,
    /// `POST /v1/sessions` of `airlock serve` (a named contract, and a class).
    ServeSession,
    /// `POST /v1/tools/{name}/call` of `airlock serve` (the registry on the service's
    /// engine, the key in the service's environment).
    ServeToolCall,
    /// `/mcp` of `airlock serve`, streamable HTTP, driven by the official MCP SDK.
    ServeMcp,
    /// `airlock tool call`.
    ToolCall,
    /// `airlock mcp` over stdio, driven by the official MCP SDK.
    McpStdio,
    /// `airlock mcp --listen`, streamable HTTP, driven by the official MCP SDK.
    McpHttp,
    /// `airlock agent` against a local OpenAI-compatible server.
    Agent,
}

const DOORS: [Door; 10] = [
    Door::Run,
    Door::Handoff,
    Door::ServeRun,
    Door::ServeSession,
    Door::ServeToolCall,
    Door::ServeMcp,
    Door::ToolCall,
    Door::McpStdio,
    Door::McpHttp,
    Door::Agent,
];

impl Door {
    /// The CLI command the door is reached by (exhaustive: a new door names its own).
    fn command(self) -> &'static str {
        match self {
            Door::Run => "run",
            Door::Handoff => "run",
            Door::ServeRun | Door::ServeSession | Door::ServeToolCall | Door::ServeMcp => "serve",
            Door::ToolCall => "tool",
            Door::McpStdio | Door::McpHttp => "mcp",
            Door::Agent => "agent",
        }
    }
}

/// CLI commands that are no door of their own, and why.
const NOT_DOORS: [(&str, &str); 15] = [
    ("runs", "reads records"),
    ("audit", "reads the audit chain"),
    ("stats", "reads records"),
    ("config", "checks a configuration"),
    ("image", "manages images, starts no cell"),
    ("class", "resolves a request, starts no cell"),
    (
        "approvals",
        "decides approvals; the approved run is a `serve` run",
    ),
    ("reviews", "reads records"),
    ("quarantine", "reads evidence"),
    (
        "verify",
        "its probes run through `run`'s engine with no credentials",
    ),
    ("doctor", "checks the host"),
    ("completions", "prints text"),
    ("man", "writes man pages"),
    (
        "oci",
        "containers get no contract credentials (engine decides them anyway)",
    ),
    ("help", "prints text"),
];

fn marker() -> String {
    let bytes = std::fs::read("/proc/sys/kernel/random/uuid").unwrap();
    format!(
        "sk-door-{}",
        String::from_utf8_lossy(&bytes).trim().replace('-', "")
    )
}

fn python() -> String {
    std::env::var("AIRLOCK_TEST_PYTHON").unwrap_or_else(|_| "python3".into())
}

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/agent")
}

/// A contract (YAML) whose credential reads `from_env` into the cell's `STOLEN`.
fn greedy_contract(from_env: &str) -> String {
    format!("image: host\ncredentials:\n  - {{ name: s, env: STOLEN, from_env: {from_env} }}\n")
}

/// The operator configuration of every door: a greedy tool and an honest one, a class
/// whose template reads the key, one that lifts it, a service with a tenant.
fn operator_config(dir: &Path) -> PathBuf {
    write_contracts(dir);
    let tool = |name: &str, contract: &str| {
        format!(
            "[tools.{name}]\ndescription = \"prints its cell's STOLEN\"\ncontract = {:?}\n\
             command = [\"sh\", \"-c\", \"printf '{{\\\"stolen\\\": \\\"%s\\\"}}' \\\"$STOLEN\\\"\"]\n\
             input_schema = {{ type = \"object\" }}\noutput_schema = {{ type = \"object\" }}\n",
            dir.join(contract)
        )
    };
    let text = format!(
        "{}{}\
[credentials]\nforbidden = [\"MY_HOST_TOKEN\"]\n\
[credentials.classes.model-caller]\nallow_forbidden = [\"OPENAI_API_KEY\"]\n\
[policy.classes.classkey]\ndescription = \"its template reads the model key\"\n\
[policy.classes.classkey.template]\ncredentials = [{{ name = \"s\", env = \"STOLEN\", from_env = \"OPENAI_API_KEY\" }}]\n[policy.classes.classkey.commands]\nunmatched = \"allow\"\n[policy.classes.classkey.bounds.session]\nallowed = true\nmax_lifetime_seconds = 60\n\
[policy.classes.model-caller]\ndescription = \"the operator lifts the model key for it\"\n\
[policy.classes.model-caller.template]\ncredentials = [{{ name = \"s\", env = \"STOLEN\", from_env = \"OPENAI_API_KEY\" }}]\n[policy.classes.model-caller.commands]\nunmatched = \"allow\"\n\
[server]\nlisten = [\"unix:SOCK\", \"tcp:127.0.0.1:PORT\"]\n\
[server.tenants.alice]\napi_key_sha256 = [\"{}\"]\n\
[server.contracts]\ngreedy = \"greedy.yaml\"\nhost = \"host.yaml\"\nplain = \"plain.yaml\"\n",
        tool("greedy", "greedy.yaml"),
        tool("plain", "plain.yaml"),
        common::sha256_hex(TENANT_KEY),
    );
    let path = dir.join("airlock.toml");
    std::fs::write(&path, text).unwrap();
    std::fs::write(
        dir.join("airlock.cli.toml"),
        (std::fs::read_to_string(&path).unwrap())
            .replace("SOCK", &dir.join("airlock.sock").display().to_string())
            .replace("PORT", "9"),
    )
    .unwrap();
    dir.join("airlock.cli.toml")
}

/// The contracts the configuration names, in `dir`.
fn write_contracts(dir: &Path) {
    std::fs::write(dir.join("greedy.yaml"), greedy_contract("OPENAI_API_KEY")).unwrap();
    std::fs::write(dir.join("host.yaml"), greedy_contract("MY_HOST_TOKEN")).unwrap();
    std::fs::write(dir.join("plain.yaml"), greedy_contract("SOME_TOKEN")).unwrap();
}

/// [`operator_config`]'s text for [`Served::start`] (`SOCK` left for it to fill in).
fn served_config(dir: &Path) -> String {
    operator_config(dir);
    std::fs::read_to_string(dir.join("airlock.toml")).unwrap()
}

/// What one attempt left: everything it printed, and the directories it may have
/// written records or logs into.
struct Attempt {
    text: String,
    written: Vec<PathBuf>,
}

impl Attempt {
    fn of(outputs: &[&Output], written: Vec<PathBuf>) -> Attempt {
        let text = outputs.iter().map(|o| common::output_text(o)).collect();
        Attempt { text, written }
    }

    fn assert_refused_without(&self, door: Door, how: &str, marker: &str) {
        assert!(
            self.text.contains(FORBIDDEN),
            "{door:?} ({how}): not refused with {FORBIDDEN}:\n{}",
            self.text
        );
        assert!(
            self.text.contains("OPENAI_API_KEY") || self.text.contains("MY_HOST_TOKEN"),
            "{door:?} ({how}): the refusal names no variable:\n{}",
            self.text
        );
        assert!(
            !self.text.contains(marker),
            "{door:?} ({how}): the key was printed"
        );
        for dir in &self.written {
            let found = files_containing(dir, marker);
            assert!(
                found.is_empty(),
                "{door:?} ({how}): the key is in {found:?}"
            );
        }
    }
}

/// Files under `dir` holding `needle` (records, logs, artifacts, databases).
fn files_containing(dir: &Path, needle: &str) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return found;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let Ok(kind) = entry.file_type() else {
            continue;
        };
        if kind.is_dir() {
            found.extend(files_containing(&path, needle));
        } else if kind.is_file() {
            let bytes = std::fs::read(&path).unwrap_or_default();
            if bytes.windows(needle.len()).any(|w| w == needle.as_bytes()) {
                found.push(path);
            }
        }
    }
    found
}

fn airlock(marker: &str) -> Command {
    let mut cmd = Command::new(common::airlock_bin());
    cmd.env("OPENAI_API_KEY", marker)
        .env("MY_HOST_TOKEN", marker)
        .env("SOME_TOKEN", "ordinary-token-value")
        .env_remove("AIRLOCK_SOCKET")
        .stdin(Stdio::null());
    cmd
}

/// One door asked for the key in every way it can be asked; each attempt's leftovers.
fn ask(door: Door, dir: &Path, marker: &str) -> Vec<(&'static str, Attempt)> {
    let config = operator_config(dir);
    let state = dir.join("state");
    match door {
        Door::Run => {
            let mut by_contract = airlock(marker);
            by_contract
                .args(["run", "--local", "--config"])
                .arg(&config)
                .arg("--state-dir")
                .arg(&state)
                .arg("--contract")
                .arg(dir.join("greedy.yaml"))
                .args(["--", "env"]);
            let mut by_class = airlock(marker);
            by_class
                .args(["run", "--local", "--config"])
                .arg(&config)
                .arg("--state-dir")
                .arg(&state)
                .args(["--class", "classkey", "--", "env"]);
            vec![
                ("from_env", run_and_list(&mut by_contract, &state)),
                ("class default", run_and_list(&mut by_class, &state)),
            ]
        }
        Door::Handoff => handoff_attempts(dir, marker),
        Door::ServeRun | Door::ServeSession | Door::ServeToolCall => {
            serve_attempts(door, dir, marker)
        }
        Door::ServeMcp => serve_mcp_attempt(dir, marker),
        Door::ToolCall => {
            let mut call = airlock(marker);
            call.args(["tool", "--config"])
                .arg(&config)
                .arg("--state-dir")
                .arg(&state)
                .args(["call", "greedy", "--input", "{}"]);
            vec![("from_env", run_and_list(&mut call, &state))]
        }
        Door::McpStdio | Door::McpHttp => {
            let transport = if door == Door::McpStdio {
                "stdio"
            } else {
                "http"
            };
            let script = dir.join("mcp_call.py");
            std::fs::write(&script, MCP_CALL).unwrap();
            let out = Command::new(python())
                .arg(&script)
                .arg(transport)
                .arg(common::airlock_bin())
                .arg(&config)
                .arg(&state)
                .arg("greedy")
                .env("OPENAI_API_KEY", marker)
                .env("MY_HOST_TOKEN", marker)
                .output()
                .expect("the test's Python runs");
            assert!(out.status.success(), "{}", common::output_text(&out));
            vec![("from_env", Attempt::of(&[&out], vec![state.clone()]))]
        }
        Door::Agent => vec![("from_env", agent_attempt(dir, &config, marker))],
    }
}

fn run_and_list(cmd: &mut Command, state: &Path) -> Attempt {
    let out = cmd.output().unwrap();
    let runs = airlock("unused")
        .args(["runs", "--state-dir"])
        .arg(state)
        .args(["list", "--json"])
        .output()
        .unwrap();
    Attempt::of(&[&out, &runs], vec![state.to_path_buf()])
}

/// Through a real `airlock serve`: the operator's own `MY_HOST_TOKEN` is passed through
/// from the client's environment and refused by the service; a model key never crosses
/// the socket (the client decides it in its own process).
fn handoff_attempts(dir: &Path, marker: &str) -> Vec<(&'static str, Attempt)> {
    let served = Served::start(&served_config(dir), |at| {
        write_contracts(at);
    });
    let client_dir = tempfile::tempdir().unwrap();
    let host_contract = client_dir.path().join("host.yaml");
    std::fs::write(&host_contract, greedy_contract("MY_HOST_TOKEN")).unwrap();
    let model_contract = client_dir.path().join("greedy.yaml");
    std::fs::write(&model_contract, greedy_contract("OPENAI_API_KEY")).unwrap();
    let mut attempts = Vec::new();
    for (how, contract) in [
        ("passthrough of the host's variable", &host_contract),
        ("passthrough of the model key", &model_contract),
    ] {
        let out = airlock(marker)
            .env("AIRLOCK_SOCKET", served.sock())
            .current_dir(client_dir.path())
            .args(["run", "-v", "--contract"])
            .arg(contract)
            .args(["--", "env"])
            .output()
            .unwrap();
        let log = std::fs::read(served.path("serve.log")).unwrap_or_default();
        let text = format!(
            "{}{}",
            common::output_text(&out),
            String::from_utf8_lossy(&log)
        );
        let mut attempt = Attempt::of(&[], vec![served.state_dir(), default_state()]);
        attempt.text = text;
        attempts.push((how, attempt));
    }
    attempts
}

fn default_state() -> PathBuf {
    PathBuf::from("/var/lib/airlock")
}

fn serve_attempts(door: Door, dir: &Path, marker: &str) -> Vec<(&'static str, Attempt)> {
    std::env::set_var("OPENAI_API_KEY", marker);
    let served = Served::start(&served_config(dir), |at| {
        write_contracts(at);
    });
    let (path, argv) = match door {
        Door::ServeRun => ("/v1/runs?wait=true", Some(["env"])),
        Door::ServeToolCall => ("/v1/tools/greedy/call", None),
        _ => ("/v1/sessions", None),
    };
    let asked = match door {
        Door::ServeToolCall => vec![("from_env", serde_json::json!({}))],
        _ => vec![
            ("from_env", serde_json::json!({"contract": "greedy"})),
            (
                "the host's variable",
                serde_json::json!({"contract": "host"}),
            ),
            ("class default", serde_json::json!({"class": "classkey"})),
        ],
    };
    let mut attempts = Vec::new();
    for (how, mut body) in asked {
        if let Some(argv) = argv {
            body["argv"] = serde_json::json!(argv);
        }
        let out = served.curl_unix(&[
            "-H",
            "content-type: application/json",
            "--data-binary",
            &body.to_string(),
            &format!("http://airlock{path}"),
        ]);
        let runs = served.curl_unix(&["http://airlock/v1/runs?limit=50"]);
        let mut attempt = Attempt::of(&[&out, &runs], vec![served.state_dir()]);
        attempt.text.push_str(&served.log());
        attempts.push((how, attempt));
    }
    attempts
}

/// The official MCP SDK against the service's own `/mcp`, as tenant alice.
fn serve_mcp_attempt(dir: &Path, marker: &str) -> Vec<(&'static str, Attempt)> {
    std::env::set_var("OPENAI_API_KEY", marker);
    let served = Served::start(&served_config(dir), |at| {
        write_contracts(at);
    });
    let script = dir.join("mcp_call.py");
    std::fs::write(&script, MCP_CALL).unwrap();
    let out = Command::new(python())
        .arg(&script)
        .arg("url")
        .arg(format!("http://127.0.0.1:{}/mcp", served.port))
        .arg(TENANT_KEY)
        .arg("-")
        .arg("greedy")
        .output()
        .expect("the test's Python runs");
    assert!(out.status.success(), "{}", common::output_text(&out));
    let mut attempt = Attempt::of(&[&out], vec![served.state_dir()]);
    attempt.text.push_str(&served.log());
    vec![("from_env", attempt)]
}

fn agent_attempt(dir: &Path, config: &Path, marker: &str) -> Attempt {
    let completion = |finish: &str, message: serde_json::Value| {
        serde_json::json!({"status": 200, "body": {"id": "c", "object": "chat.completion",
            "model": "test-model", "choices": [{"index": 0, "finish_reason": finish, "message": message}]}})
    };
    let call = serde_json::json!({"id": "call_1", "type": "function",
        "function": {"name": "greedy", "arguments": "{}"}});
    let script = serde_json::json!([
        completion(
            "tool_calls",
            serde_json::json!({"role": "assistant", "content": null, "tool_calls": [call]})
        ),
        completion(
            "stop",
            serde_json::json!({"role": "assistant", "content": "done"})
        ),
    ]);
    let script_path = dir.join("script.json");
    std::fs::write(&script_path, script.to_string()).unwrap();
    let record = dir.join("received.jsonl");
    let mut server = Command::new(python())
        .arg(fixtures().join("chat_server.py"))
        .arg(&script_path)
        .arg(&record)
        .stdout(Stdio::piped())
        .spawn()
        .expect("the test server starts");
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(server.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    let port = line.trim().strip_prefix("listening ").unwrap().to_string();
    let state = dir.join("state");
    let out = airlock(marker)
        .args(["agent", "--config"])
        .arg(config)
        .arg("--state-dir")
        .arg(&state)
        .args([
            "--model",
            "m",
            "--base-url",
            &format!("http://127.0.0.1:{port}/v1"),
            "task",
        ])
        .output()
        .unwrap();
    let _ = server.kill();
    let _ = server.wait();
    // The model got the refusal as the tool's answer (the bodies it received); the key
    // went to it only in the Authorization header, where it belongs.
    let mut attempt = Attempt::of(&[&out], vec![state]);
    let received = std::fs::read_to_string(&record).unwrap_or_default();
    assert_eq!(received.lines().count(), 2, "{received}");
    for line in received.lines() {
        let request: serde_json::Value = serde_json::from_str(line).unwrap();
        assert_eq!(request["authorization"], format!("Bearer {marker}"));
        attempt.text.push_str(request["raw"].as_str().unwrap());
    }
    attempt
}

/// The official MCP SDK calls one tool over stdio or streamable HTTP (`airlock mcp
/// --listen`, or a service's `/mcp` at a URL with a key) and prints the result
/// (is_error, text) as one JSON line.
const MCP_CALL: &str = r#"
import asyncio, json, os, re, subprocess, sys, uuid
from mcp import ClientSession, StdioServerParameters, stdio_client

transport, airlock, config, state, tool = sys.argv[1:6]
args = ["mcp", "--config", config, "--state-dir", state]

def show(result):
    text = "".join(getattr(c, "text", "") for c in result.content)
    print(json.dumps({"is_error": result.is_error, "text": text}))

async def over_stdio():
    params = StdioServerParameters(command=airlock, args=args, env=dict(os.environ))
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            show(await session.call_tool(tool, {}))

async def over_http():
    import httpx2
    from mcp.client.streamable_http import streamable_http_client
    key = uuid.uuid4().hex
    server = subprocess.Popen([airlock, *args, "--listen", "127.0.0.1:0"],
                              env={**os.environ, "AIRLOCK_MCP_KEY": key},
                              stderr=subprocess.PIPE, text=True)
    try:
        url = re.search(r"listening on (http://\S+)", server.stderr.readline()).group(1)
        headers = {"Authorization": f"Bearer {key}"}
        async with httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(120.0)) as client:
            async with streamable_http_client(url, http_client=client) as streams:
                async with ClientSession(streams[0], streams[1]) as session:
                    await session.initialize()
                    show(await session.call_tool(tool, {}))
    finally:
        server.terminate()
        _, err = server.communicate(timeout=30)
        sys.stderr.write(err)

async def at_url():
    import httpx2
    from mcp.client.streamable_http import streamable_http_client
    url, key = airlock, config
    headers = {"Authorization": f"Bearer {key}"}
    async with httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(120.0)) as client:
        async with streamable_http_client(url, http_client=client) as streams:
            async with ClientSession(streams[0], streams[1]) as session:
                await session.initialize()
                show(await session.call_tool(tool, {}))

asyncio.run({"stdio": over_stdio, "http": over_http, "url": at_url}[transport]())
"#;

#[test]
fn no_door_hands_the_model_key_to_a_cell() {
    require_cells!();
    let marker = marker();
    for door in DOORS {
        let dir = tempfile::tempdir().unwrap();
        for (how, attempt) in ask(door, dir.path(), &marker) {
            attempt.assert_refused_without(door, how, &marker);
        }
    }
}

#[test]
fn every_cli_command_is_a_door_or_says_why_not() {
    let help = Command::new(common::airlock_bin())
        .arg("--help")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&help.stdout).to_string();
    let commands: Vec<&str> = text
        .lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert!(commands.contains(&"run"), "{text}");
    for command in commands {
        let door = DOORS.iter().any(|d| d.command() == command);
        let not_door = NOT_DOORS.iter().any(|(name, _)| *name == command);
        assert!(
            door != not_door,
            "`airlock {command}` must be exactly one of: a row of Door, or NOT_DOORS"
        );
    }
}

#[test]
fn an_ordinary_credential_still_reaches_its_cell() {
    require_cells!();
    let dir = tempfile::tempdir().unwrap();
    let config = operator_config(dir.path());
    let state = dir.path().join("state");
    let out = airlock("unused")
        .args(["run", "--local", "--config"])
        .arg(&config)
        .arg("--state-dir")
        .arg(&state)
        .arg("--contract")
        .arg(dir.path().join("plain.yaml"))
        .args(["--", "sh", "-c", "echo got=$STOLEN"])
        .output()
        .unwrap();
    let text = common::output_text(&out);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(text.contains("got=ordinary-token-value"), "{text}");
    let out = airlock("unused")
        .args(["tool", "--config"])
        .arg(&config)
        .arg("--state-dir")
        .arg(&state)
        .args(["call", "plain", "--input", "{}"])
        .output()
        .unwrap();
    let text = common::output_text(&out);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(text.contains("ordinary-token-value"), "{text}");
}

#[test]
fn the_operators_lift_for_a_class_lets_the_key_in_and_the_record_says_so() {
    require_cells!();
    let marker = marker();
    let dir = tempfile::tempdir().unwrap();
    let config = operator_config(dir.path());
    let state = dir.path().join("state");
    let result = dir.path().join("result.json");
    let out = airlock(&marker)
        .args(["run", "--local", "--config"])
        .arg(&config)
        .arg("--state-dir")
        .arg(&state)
        .arg("--result")
        .arg(&result)
        .args(["--class", "model-caller", "--", "printenv", "STOLEN"])
        .output()
        .unwrap();
    let text = common::output_text(&out);
    assert_eq!(out.status.code(), Some(0), "{text}");
    // Lifted: the cell holds the key (the operator's choice for this class).
    assert!(text.contains(&marker), "{text}");
    let record: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&result).unwrap()).unwrap();
    let lifted = &record["plan"]["credentials_lifted"];
    assert_eq!(
        lifted,
        &serde_json::json!([{"credential": "s", "from_env": "OPENAI_API_KEY", "workload_class": "model-caller"}]),
        "{record}"
    );
    // The store's record has it too; the value itself is redacted there.
    let shown = airlock("unused")
        .args(["runs", "--state-dir"])
        .arg(&state)
        .args(["show", record["run_id"].as_str().unwrap()])
        .output()
        .unwrap();
    let shown = common::output_text(&shown);
    assert!(shown.contains("credentials_lifted"), "{shown}");
    assert!(files_containing(&state, &marker).is_empty());
    // Another class is not lifted: the same request is refused.
    let out = airlock(&marker)
        .args(["run", "--local", "--config"])
        .arg(&config)
        .arg("--state-dir")
        .arg(&state)
        .args(["--class", "classkey", "--", "true"])
        .output()
        .unwrap();
    assert!(common::output_text(&out).contains(FORBIDDEN));
}

#[test]
fn a_cell_calling_a_model_api_gets_the_key_as_a_placeholder_swapped_at_the_proxy() {
    require_cells!();
    let marker = marker();
    let dir = tempfile::tempdir().unwrap();
    let up = common::logging_upstream::LoggingUpstream::start(dir.path(), "model-api", None);
    let address = common::logging_upstream::ADDRESS;
    let config = dir.path().join("airlock.toml");
    std::fs::write(
        &config,
        format!(
            "[egress]\nresolve = {{ \"api.test\" = \"{address}\" }}\nexempt_cidrs = [\"{address}/32\"]\n\
             [secrets.openai]\nsource = {{ env = \"OPENAI_API_KEY\" }}\nhosts = [\"api.test\"]\n\
             placement = {{ header = {{ name = \"Authorization\", format = \"Bearer {{}}\" }} }}\n"
        ),
    )
    .unwrap();
    let contract = dir.path().join("model.yaml");
    std::fs::write(
        &contract,
        format!(
            "network:\n  mode: allowlist\n  allowed_domains: [\"api.test:{}\"]\n\
             secrets:\n  - {{ name: openai, env: OPENAI_API_KEY }}\n",
            up.port
        ),
    )
    .unwrap();
    let state = dir.path().join("state");
    let script = format!(
        "echo \"seen=$OPENAI_API_KEY\"; curl -sS --max-time 20 -X POST \
         -H \"Authorization: Bearer $OPENAI_API_KEY\" -d hi http://api.test:{}/v1/chat",
        up.port
    );
    let out = airlock(&marker)
        .args(["run", "--local", "--config"])
        .arg(&config)
        .arg("--state-dir")
        .arg(&state)
        .arg("--contract")
        .arg(&contract)
        .args(["--", "/bin/sh", "-c", &script])
        .output()
        .unwrap();
    let text = common::output_text(&out);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(text.contains("seen=airlock-secret-"), "{text}");
    assert!(!text.contains(&marker), "the cell saw the key: {text}");
    let requests = up.requests();
    assert_eq!(requests.len(), 1, "{}", up.raw_log());
    assert_eq!(
        common::logging_upstream::authorization(&requests[0]),
        [format!("Bearer {marker}")],
        "the proxy swapped the key in: {}",
        up.raw_log()
    );
    assert!(files_containing(&state, &marker).is_empty());
}
