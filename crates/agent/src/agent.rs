//! The agent loop (`airlock agent`): the task goes to an OpenAI-compatible Chat
//! Completions endpoint with the registry's tools as function tools; each tool call is
//! answered through the tool protocol (validated arguments in a cell, only the envelope
//! back), until the model answers without a tool call, `max_turns` model turns pass or
//! the deadline does. With `shell`, a `shell` function tool takes OpenAI's shell action
//! (`commands`, `timeout_ms`, `max_output_length`) and answers with `shell_call_output`,
//! all commands of the task in one session's cell. The transcript is stored redacted.

use crate::call::ToolBox;
use crate::exec::{self, Cancel};
use crate::openai::{ChatClient, ChatRequest, FunctionTool, Message, ToolCall};
use crate::shell::{self, ShellAction};
use crate::AgentError;
use airlock_engine::Session;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The function tool that takes OpenAI's shell action.
pub const SHELL_TOOL: &str = "shell";

pub struct AgentOptions {
    pub model: String,
    /// Recorded with the transcript.
    pub endpoint: String,
    pub max_turns: u32,
    pub deadline: Duration,
    pub shell: bool,
}

/// How a task ended.
#[derive(Debug)]
pub struct AgentOutcome {
    /// The model's last answer, when it gave one.
    pub answer: Option<String>,
    /// `answered`, `max_turns`, `deadline` or `model_error`.
    pub outcome: &'static str,
    pub turns: u32,
    pub tool_calls: u32,
    pub transcript_id: Option<String>,
    /// Why the model endpoint failed, redacted.
    pub error: Option<String>,
}

/// The function tools offered: every registry tool, and the shell tool when asked.
pub fn function_tools(toolbox: &ToolBox, with_shell: bool) -> Vec<FunctionTool> {
    let mut tools: Vec<FunctionTool> = toolbox
        .registry
        .tools
        .values()
        .map(|t| FunctionTool::new(&t.name, &t.description, t.input.source().clone()))
        .collect();
    if with_shell {
        tools.push(FunctionTool::new(
            SHELL_TOOL,
            "Run shell commands, in order, in one sandboxed cell for this task (files persist between calls).",
            json!({"type": "object", "required": ["commands"], "additionalProperties": false,
                   "properties": {"commands": {"type": "array", "items": {"type": "string"}},
                                  "timeout_ms": {"type": "integer", "minimum": 1},
                                  "max_output_length": {"type": "integer", "minimum": 1}}}),
        ));
    }
    tools
}

struct Loop<'a> {
    toolbox: &'a ToolBox,
    options: &'a AgentOptions,
    shell: Option<(Arc<Session>, u64)>,
    tool_calls: u32,
}

/// Runs `task` to its end and stores its transcript.
pub fn run_agent(
    toolbox: &ToolBox,
    client: &ChatClient,
    options: &AgentOptions,
    task: &str,
) -> AgentOutcome {
    let started = Instant::now();
    let started_ms = unix_ms();
    let deadline = started + options.deadline;
    let tools = function_tools(toolbox, options.shell);
    let mut messages = vec![Message::user(task)];
    let mut state = Loop {
        toolbox,
        options,
        shell: None,
        tool_calls: 0,
    };
    let mut outcome = AgentOutcome {
        answer: None,
        outcome: "max_turns",
        turns: 0,
        tool_calls: 0,
        transcript_id: None,
        error: None,
    };
    while outcome.turns < options.max_turns {
        if Instant::now() >= deadline {
            outcome.outcome = "deadline";
            break;
        }
        let request = ChatRequest {
            model: &options.model,
            messages: &messages,
            tools: &tools,
        };
        outcome.turns += 1;
        let reply = match client.complete(&request, deadline) {
            Ok(response) => response.choices.into_iter().next().map(|c| c.message),
            Err(err) => {
                outcome.outcome = "model_error";
                outcome.error = Some(err.to_string());
                break;
            }
        };
        let Some(reply) = reply else {
            outcome.outcome = "model_error";
            outcome.error = Some("the endpoint returned no choice".into());
            break;
        };
        let calls = reply.tool_calls.clone().unwrap_or_default();
        messages.push(reply.clone());
        if calls.is_empty() {
            outcome.outcome = "answered";
            outcome.answer = reply.content;
            break;
        }
        for call in &calls {
            let content = state.answer(call, deadline);
            messages.push(Message::tool(&call.id, content));
        }
    }
    outcome.tool_calls = state.tool_calls;
    drop(state);
    outcome.transcript_id =
        store_transcript(toolbox, options, task, &outcome, &messages, started_ms)
            .map_err(|err| {
                outcome
                    .error
                    .get_or_insert(format!("transcript not stored: {err}"))
                    .clone()
            })
            .ok();
    outcome
}

impl Loop<'_> {
    /// The content of the tool message answering `call`.
    /// A tool call's command is cut at the task's deadline.
    fn answer(&mut self, call: &ToolCall, deadline: Instant) -> String {
        self.tool_calls += 1;
        let cancel = Cancel::default();
        let remaining_ms = deadline
            .saturating_duration_since(Instant::now())
            .as_millis() as u64;
        if self.options.shell && call.function.name == SHELL_TOOL {
            return self.shell_call(call, &cancel, remaining_ms);
        }
        let result = self.toolbox.call_text_within(
            &call.function.name,
            &call.function.arguments,
            &cancel,
            Some(remaining_ms),
        );
        result.reply.to_value().to_string()
    }

    fn shell_call(&mut self, call: &ToolCall, cancel: &Cancel, remaining_ms: u64) -> String {
        let mut action: ShellAction = match serde_json::from_str(&call.function.arguments) {
            Ok(action) => action,
            Err(err) => {
                let message = format!("the shell action is not valid: {err}");
                return json!({"type": "shell_call_output", "call_id": call.id,
                              "error": crate::schema::bounded(&message, 300)})
                .to_string();
            }
        };
        let (session, output_bytes) = match self.shell_session() {
            Ok(open) => open,
            Err(err) => {
                return json!({"type": "shell_call_output", "call_id": call.id,
                              "error": format!("no shell: {}", crate::schema::bounded(&err.to_string(), 200))})
                .to_string()
            }
        };
        let timeout = action.timeout_ms.unwrap_or(shell::DEFAULT_TIMEOUT_MS);
        action.timeout_ms = Some(timeout.min(remaining_ms).max(1));
        let output = shell::run_shell(&session, output_bytes, &call.id, &action, cancel);
        let value = serde_json::to_value(&output).unwrap_or_default();
        self.toolbox.redacted_value(value).to_string()
    }

    fn shell_session(&mut self) -> Result<(Arc<Session>, u64), AgentError> {
        if let Some((session, bytes)) = &self.shell {
            return Ok((Arc::clone(session), *bytes));
        }
        let contract = self.toolbox.registry.generic_contract.as_deref();
        let planned = self
            .toolbox
            .planner
            .plan(contract, &["true".to_string()])
            .map_err(|err| AgentError::Agent(format!("generic contract: {}", err.detail)))?;
        let bytes = planned.plan.limits.output_bytes;
        let session = exec::open_session(
            &self.toolbox.engine,
            planned.plan,
            "agent-shell",
            Vec::new(),
            self.options.deadline,
            None,
        )?;
        self.shell = Some((Arc::clone(&session), bytes));
        Ok((session, bytes))
    }
}

fn unix_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

fn store_transcript(
    toolbox: &ToolBox,
    options: &AgentOptions,
    task: &str,
    outcome: &AgentOutcome,
    messages: &[Message],
    started_ms: i64,
) -> Result<String, AgentError> {
    let store = airlock_store::Store::open(&toolbox.engine.config().state_dir)?;
    let messages: Value = serde_json::to_value(messages).unwrap_or_default();
    let id = store.record_transcript(
        started_ms,
        airlock_store::TranscriptRecord {
            model: options.model.clone(),
            endpoint: options.endpoint.clone(),
            task: task.to_string(),
            outcome: outcome.outcome.to_string(),
            turns: outcome.turns,
            tool_calls: outcome.tool_calls,
            messages,
            secrets: toolbox.secrets.clone(),
        },
    )?;
    Ok(id)
}
