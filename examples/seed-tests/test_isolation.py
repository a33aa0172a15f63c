"""Seed 000's three isolation tests ("every tool PR must pass the three isolation tests
above or the merge blocks"), run through `airlock tool call` as the seed writes them.

    AIRLOCK_BIN=target/x86_64-unknown-linux-gnu/debug/airlock pytest examples/seed-tests

`sandbox_ai_agent_tool_execution` is the seed's function with airlock in place of
`docker run`: it maps airlock's envelope onto the seed's return values (a ceiling that
stopped the tool is "tool killed: ...", as the seed's 137/124 exit codes were)."""
import json
import os
import pathlib
import subprocess
import tempfile

HERE = pathlib.Path(__file__).resolve().parent
AIRLOCK = os.environ.get("AIRLOCK_BIN") or str(
    HERE.parents[1] / "target/x86_64-unknown-linux-gnu/debug/airlock")
STATE = tempfile.mkdtemp(prefix="airlock-seed-tests-")


def call(tool_input: dict, timeout=30) -> dict:
    proc = subprocess.run(
        [AIRLOCK, "tool", "--config", str(HERE / "airlock.toml"), "--state-dir", STATE,
         "call", "sandbox_probe", "--input", json.dumps(tool_input)],
        capture_output=True, check=False, timeout=timeout + 30)
    return json.loads(proc.stdout)


def sandbox_ai_agent_tool_execution(tool_input: dict, timeout=30) -> dict:
    envelope = call(tool_input, timeout)
    if envelope["ok"]:
        return envelope["output"]
    error = envelope["error"]
    if error["class"] == "capacity_exceeded":
        return {"error": f"tool killed: {error['reason']}", "run_id": envelope["run_id"]}
    return {"error": error["message"], "reason": error["reason"], "run_id": envelope["run_id"]}


def test_privilege():
    out = sandbox_ai_agent_tool_execution({"query": "cat /etc/shadow"})
    assert "error" in out
    # The host's /etc/shadow exists; the cell has none of it (and the message names no path).
    assert pathlib.Path("/etc/shadow").exists()
    assert out["reason"] == "tool.exit" and "/etc" not in out["error"]


def test_network():
    out = sandbox_ai_agent_tool_execution({"query": "fetch https://evil.test"})
    assert "error" in out
    assert out["reason"] == "tool.exit"


def test_resource():
    out = sandbox_ai_agent_tool_execution({"query": "alloc 500mb"})
    assert out.get("error", "").startswith("tool killed")
    assert out["error"] == "tool killed: limit.memory"


def test_resource_threads():
    out = sandbox_ai_agent_tool_execution({"query": "spawn 200 threads"})
    assert out.get("error", "").startswith("tool killed")
    assert out["error"] == "tool killed: limit.pids"


def test_a_harmless_query_still_answers():
    assert sandbox_ai_agent_tool_execution({"query": "SELECT 1"}) == {"rows": [], "truncated": False}
