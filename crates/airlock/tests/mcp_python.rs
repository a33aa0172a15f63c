//! `airlock mcp` driven by the official MCP Python SDK (tests/fixtures/agent/mcp_client.py)
//! over stdio and over streamable HTTP: tools listed with their schemas, a call of each
//! kind, schema violations rejected, progress notifications, and a cancelled call whose
//! cell is gone; at `airlock serve`'s `/mcp`, tenants kept apart (sessions, runs,
//! quotas). The interpreter is `$AIRLOCK_TEST_PYTHON` (default `python3`) with the
//! `mcp` package installed (.ci/run installs it).

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/agent")
}

pub fn python() -> String {
    std::env::var("AIRLOCK_TEST_PYTHON").unwrap_or_else(|_| "python3".into())
}

fn drive(transport: &str) {
    let state = tempfile::tempdir().unwrap();
    let out = Command::new(python())
        .arg(fixtures().join("mcp_client.py"))
        .arg(transport)
        .arg(common::airlock_bin())
        .arg(fixtures().join("airlock.toml"))
        .arg(state.path())
        .output()
        .expect("the test's Python runs");
    let text = common::output_text(&out);
    assert!(
        out.status.success(),
        "the MCP client's checks failed:\n{text}"
    );
    let seen: serde_json::Value = serde_json::from_slice(
        out.stdout
            .split(|b| *b == b'\n')
            .find(|l| l.starts_with(b"{"))
            .unwrap_or(b"{}"),
    )
    .unwrap();
    assert!(seen["progress"].as_u64() >= Some(2), "{seen}");
    if transport == "serve" {
        assert_eq!(seen["tenants_kept_apart"], true, "{seen}");
    }
    assert!(
        !seen["cancelled_pids"].as_array().unwrap().is_empty(),
        "{seen}"
    );
}

#[test]
fn the_python_sdk_over_stdio_lists_calls_and_cancels() {
    require_cells!();
    drive("stdio");
}

#[test]
fn the_python_sdk_over_streamable_http_lists_calls_and_cancels() {
    require_cells!();
    drive("http");
}

#[test]
fn the_python_sdk_at_the_services_mcp_keeps_tenants_apart() {
    require_cells!();
    drive("serve");
}
