//! OpenAI's shell tool calls (`shell_call` with `action: {commands, timeout_ms,
//! max_output_length}`, answered with `shell_call_output`) mapped onto an engine
//! session: the commands of one agent task run, in order, in one cell under the generic
//! contract, each as `sh -c COMMAND`, so files persist between them as in a shell.
//! Unlike a registry tool's, a shell command's stderr is part of the answer (the format
//! has a field for it): the model runs its own commands, bounded by
//! `max_output_length` characters of stdout and stderr together.

use crate::exec::{self, Cancel, CommandRun, Execution};
use airlock_cell::report::{Ceiling, ResultClass};
use airlock_engine::Session;
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// The default of `timeout_ms` (Azure's documented default).
pub const DEFAULT_TIMEOUT_MS: u64 = 10_000;
/// The default of `max_output_length`, characters.
pub const DEFAULT_MAX_OUTPUT_LENGTH: u64 = 4096;
/// The most characters of output one shell command may ask for.
pub const MAX_OUTPUT_LENGTH: u64 = 1 << 20;

/// `action` of a `shell_call`.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ShellAction {
    pub commands: Vec<String>,
    #[serde(default)]
    pub timeout_ms: Option<u64>,
    #[serde(default)]
    pub max_output_length: Option<u64>,
}

/// A `shell_call` item of the Responses API.
#[derive(Debug, Clone, Deserialize)]
pub struct ShellCall {
    #[serde(rename = "type")]
    pub kind: String,
    pub call_id: String,
    pub action: ShellAction,
}

/// The `shell_call_output` item answering a call.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ShellCallOutput {
    #[serde(rename = "type")]
    pub kind: String,
    pub call_id: String,
    pub max_output_length: u64,
    pub output: Vec<ShellCommandOutput>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ShellCommandOutput {
    pub stdout: String,
    pub stderr: String,
    pub outcome: ShellOutcome,
    /// airlock's own: the command's run id (its record).
    pub run_id: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ShellOutcome {
    Exit { exit_code: i32 },
    Timeout,
}

/// Runs `action` in `session` (whose plan's output cap is `plan_output_bytes`).
pub fn run_shell(
    session: &Arc<Session>,
    plan_output_bytes: u64,
    call_id: &str,
    action: &ShellAction,
    cancel: &Cancel,
) -> ShellCallOutput {
    let max_chars = action
        .max_output_length
        .unwrap_or(DEFAULT_MAX_OUTPUT_LENGTH)
        .min(MAX_OUTPUT_LENGTH);
    let timeout_ms = action.timeout_ms.unwrap_or(DEFAULT_TIMEOUT_MS);
    let output = action
        .commands
        .iter()
        .map(|command| {
            let run = CommandRun {
                argv: vec!["sh".into(), "-c".into(), command.clone()],
                stdin: &[],
                // Characters are at most 4 bytes.
                cap: max_chars.saturating_mul(4),
                keep_stderr: true,
                wall_time_ms: Some(timeout_ms),
            };
            match exec::run_in(session, plan_output_bytes, run, cancel) {
                Ok(execution) => command_output(&execution, max_chars),
                Err(err) => ShellCommandOutput {
                    stdout: String::new(),
                    stderr: format!("airlock: the command could not run: {}", short(&err)),
                    outcome: ShellOutcome::Exit { exit_code: 125 },
                    run_id: String::new(),
                },
            }
        })
        .collect();
    ShellCallOutput {
        kind: "shell_call_output".into(),
        call_id: call_id.to_string(),
        max_output_length: max_chars,
        output,
    }
}

fn short(err: &crate::AgentError) -> String {
    // Engine errors name no host path the model does not know; bounded anyway.
    crate::schema::bounded(&err.to_string(), 200)
}

/// One command's entry: stdout first, then stderr, together at most `max_chars`.
pub fn command_output(execution: &Execution, max_chars: u64) -> ShellCommandOutput {
    let report = &execution.report;
    let timed_out = report.status == ResultClass::CapacityExceeded
        && report.limit_fired == Some(Ceiling::WallTime);
    let stdout = String::from_utf8_lossy(&execution.stdout);
    let stderr = String::from_utf8_lossy(execution.stderr.as_deref().unwrap_or_default());
    let (stdout, stderr) = split_budget(&stdout, &stderr, max_chars as usize);
    ShellCommandOutput {
        stdout,
        stderr,
        outcome: match timed_out {
            true => ShellOutcome::Timeout,
            false => ShellOutcome::Exit {
                exit_code: report.exit.code.unwrap_or(report.exit_code),
            },
        },
        run_id: report.run_id.clone(),
    }
}

/// `stdout` and `stderr` cut so that together they are at most `max` characters,
/// stdout first.
pub fn split_budget(stdout: &str, stderr: &str, max: usize) -> (String, String) {
    let out: String = stdout.chars().take(max).collect();
    let left = max - out.chars().count();
    let err: String = stderr.chars().take(left).collect();
    (out, err)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_goes_to_stdout_first() {
        assert_eq!(split_budget("abcd", "xyz", 5), ("abcd".into(), "x".into()));
        assert_eq!(split_budget("abcdef", "xyz", 3), ("abc".into(), "".into()));
    }

    #[test]
    fn a_shell_call_parses_from_the_responses_shape() {
        let call: ShellCall = serde_json::from_value(serde_json::json!({
            "type": "shell_call", "call_id": "call_1",
            "action": {"commands": ["ls"], "timeout_ms": 1000, "max_output_length": 64}
        }))
        .unwrap();
        assert_eq!(call.action.commands, ["ls"]);
    }

    #[test]
    fn a_timeout_outcome_is_tagged() {
        let value = serde_json::to_value(ShellOutcome::Timeout).unwrap();
        assert_eq!(value, serde_json::json!({"type": "timeout"}));
        let value = serde_json::to_value(ShellOutcome::Exit { exit_code: 2 }).unwrap();
        assert_eq!(value, serde_json::json!({"type": "exit", "exit_code": 2}));
    }
}
