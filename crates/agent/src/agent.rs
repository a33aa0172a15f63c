//! The agent loop (`airlock agent`): the task goes to an OpenAI-compatible endpoint with
//! the registry's tools as function tools; each tool call is answered through the tool
//! protocol (validated arguments in a cell, only the envelope back), until the model
//! answers without a tool call, `max_turns` model turns pass or the deadline does. Two
//! wire formats: Chat Completions (`openai.rs`), where `shell` is a function tool taking
//! OpenAI's shell action (`commands`, `timeout_ms`, `max_output_length`) answered with a
//! `shell_call_output`, and the Responses API (`responses.rs`), where the model's own
//! `shell_call` items are answered with `shell_call_output` items. Either way all shell
//! commands of the task run in one session's cell. The transcript is stored redacted.

use crate::call::ToolBox;
use crate::exec::{self, Cancel};
use crate::openai::{ChatClient, ChatRequest, Message};
use crate::responses::{self, OutputItem, ResponsesRequest};
use crate::shell::{self, ShellAction, ShellCallOutput};
use crate::AgentError;
use airlock_engine::Session;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The function tool that takes OpenAI's shell action.
pub const SHELL_TOOL: &str = "shell";

/// The endpoint's wire format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelApi {
    /// `POST /chat/completions`.
    ChatCompletions,
    /// `POST /responses`.
    Responses,
}

pub struct AgentOptions {
    pub model: String,
    /// Recorded with the transcript.
    pub endpoint: String,
    pub api: ModelApi,
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

impl AgentOutcome {
    fn new() -> AgentOutcome {
        AgentOutcome {
            answer: None,
            outcome: "max_turns",
            turns: 0,
            tool_calls: 0,
            transcript_id: None,
            error: None,
        }
    }

    fn model_failed(&mut self, error: String) {
        self.outcome = "model_error";
        self.error = Some(error);
    }
}

/// The Chat Completions function tools offered: every registry tool, and the shell tool
/// when asked.
pub fn function_tools(toolbox: &ToolBox, with_shell: bool) -> Vec<crate::openai::FunctionTool> {
    use crate::openai::FunctionTool;
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
    client: &'a ChatClient,
    options: &'a AgentOptions,
    deadline: Instant,
    shell: Option<(Arc<Session>, u64)>,
    outcome: AgentOutcome,
}

/// Runs `task` to its end and stores its transcript.
pub fn run_agent(
    toolbox: &ToolBox,
    client: &ChatClient,
    options: &AgentOptions,
    task: &str,
) -> AgentOutcome {
    let started_ms = unix_ms();
    let mut state = Loop {
        toolbox,
        client,
        options,
        deadline: Instant::now() + options.deadline,
        shell: None,
        outcome: AgentOutcome::new(),
    };
    let transcript = match options.api {
        ModelApi::ChatCompletions => state.chat(task),
        ModelApi::Responses => state.responses(task),
    };
    // The shell's session (and its cell) ends with the task.
    let mut outcome = std::mem::replace(&mut state.outcome, AgentOutcome::new());
    drop(state);
    outcome.transcript_id =
        store_transcript(toolbox, options, task, &outcome, transcript, started_ms)
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
    /// Whether another model turn may start (and counts it).
    fn next_turn(&mut self) -> bool {
        if self.outcome.turns >= self.options.max_turns {
            return false;
        }
        if Instant::now() >= self.deadline {
            self.outcome.outcome = "deadline";
            return false;
        }
        self.outcome.turns += 1;
        true
    }

    /// The Chat Completions conversation; its messages.
    fn chat(&mut self, task: &str) -> Value {
        let tools = function_tools(self.toolbox, self.options.shell);
        let mut messages = vec![Message::user(task)];
        while self.next_turn() {
            let request = ChatRequest {
                model: &self.options.model,
                messages: &messages,
                tools: &tools,
            };
            let reply = match self.client.complete(&request, self.deadline) {
                Ok(response) => response.choices.into_iter().next().map(|c| c.message),
                Err(err) => {
                    self.outcome.model_failed(err.to_string());
                    break;
                }
            };
            let Some(reply) = reply else {
                self.outcome
                    .model_failed("the endpoint returned no choice".into());
                break;
            };
            let calls = reply.tool_calls.clone().unwrap_or_default();
            messages.push(reply.clone());
            if calls.is_empty() {
                self.outcome.outcome = "answered";
                self.outcome.answer = reply.content;
                break;
            }
            for call in &calls {
                let content = match self.options.shell && call.function.name == SHELL_TOOL {
                    true => self.chat_shell_call(&call.id, &call.function.arguments),
                    false => self.tool_call(&call.function.name, &call.function.arguments),
                };
                messages.push(Message::tool(&call.id, content));
            }
        }
        serde_json::to_value(&messages).unwrap_or_default()
    }

    /// The Responses conversation; its items.
    fn responses(&mut self, task: &str) -> Value {
        let tools = responses::tools(self.toolbox, self.options.shell);
        let mut items = vec![responses::user_item(task)];
        while self.next_turn() {
            let request = ResponsesRequest {
                model: &self.options.model,
                input: &items,
                tools: &tools,
                store: false,
            };
            let reply = match self.client.respond(&request, self.deadline) {
                Ok(reply) => reply,
                Err(err) => {
                    self.outcome.model_failed(err.to_string());
                    break;
                }
            };
            let mut answers = Vec::new();
            let mut text = None;
            for item in reply.output {
                match responses::read_item(&item) {
                    OutputItem::FunctionCall {
                        call_id,
                        name,
                        arguments,
                    } => {
                        let output = self.tool_call(&name, &arguments);
                        answers.push(responses::function_output_item(&call_id, output));
                    }
                    OutputItem::ShellCall { call_id, action } => {
                        let output = self.responses_shell_call(&call_id, action);
                        answers.push(responses::shell_output_item(&output));
                    }
                    OutputItem::Message(said) => text = Some(said),
                    OutputItem::Other => {}
                }
                items.push(item);
            }
            if answers.is_empty() {
                self.outcome.outcome = "answered";
                self.outcome.answer = text;
                break;
            }
            items.extend(answers);
        }
        Value::Array(items)
    }

    /// Milliseconds left before the task's deadline: a tool call's command is cut there.
    fn remaining_ms(&self) -> u64 {
        self.deadline
            .saturating_duration_since(Instant::now())
            .as_millis() as u64
    }

    /// A registry tool's call: the envelope, as text.
    fn tool_call(&mut self, name: &str, arguments: &str) -> String {
        self.outcome.tool_calls += 1;
        let cancel = Cancel::default();
        let remaining_ms = Some(self.remaining_ms());
        let result = self
            .toolbox
            .call_text_within(name, arguments, &cancel, remaining_ms);
        result.reply.to_value().to_string()
    }

    /// A Chat Completions `shell` function call: the `shell_call_output`, as text.
    fn chat_shell_call(&mut self, call_id: &str, arguments: &str) -> String {
        self.outcome.tool_calls += 1;
        let ran = serde_json::from_str::<ShellAction>(arguments)
            .map_err(|err| format!("the shell action is not valid: {err}"))
            .and_then(|action| self.run_shell(call_id, action));
        match ran {
            Ok(output) => {
                let value = serde_json::to_value(&output).unwrap_or_default();
                self.toolbox.redacted_value(value).to_string()
            }
            Err(why) => json!({"type": "shell_call_output", "call_id": call_id,
                               "error": crate::schema::bounded(&why, 300)})
            .to_string(),
        }
    }

    /// A Responses `shell_call`: its `shell_call_output` (a refusal when no shell was
    /// offered or the action is not one: nothing runs).
    fn responses_shell_call(
        &mut self,
        call_id: &str,
        action: Result<ShellAction, String>,
    ) -> ShellCallOutput {
        self.outcome.tool_calls += 1;
        if !self.options.shell {
            return responses::shell_refusal(call_id, "no shell tool was offered for this task");
        }
        let ran = action.and_then(|action| self.run_shell(call_id, action));
        let output = ran.unwrap_or_else(|why| responses::shell_refusal(call_id, &why));
        let value = serde_json::to_value(&output).unwrap_or_default();
        serde_json::from_value(self.toolbox.redacted_value(value)).unwrap_or(output)
    }

    /// Runs a shell action in the task's session, its timeout cut at the deadline.
    fn run_shell(
        &mut self,
        call_id: &str,
        mut action: ShellAction,
    ) -> Result<ShellCallOutput, String> {
        let (session, output_bytes) = self.shell_session().map_err(|err| {
            format!(
                "no shell: {}",
                crate::schema::bounded(&err.to_string(), 200)
            )
        })?;
        let timeout = action.timeout_ms.unwrap_or(shell::DEFAULT_TIMEOUT_MS);
        action.timeout_ms = Some(timeout.min(self.remaining_ms()).max(1));
        let cancel = Cancel::default();
        Ok(shell::run_shell(
            &session,
            output_bytes,
            call_id,
            &action,
            &cancel,
        ))
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
        let cell = exec::Cell {
            workload_class: "agent-shell",
            credentials: Vec::new(),
            tenant: None,
            after_close: self.toolbox.planner.after_close("agent-shell", None),
        };
        let session = exec::open_session(
            &self.toolbox.engine,
            planned.plan,
            cell,
            self.options.deadline,
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
    messages: Value,
    started_ms: i64,
) -> Result<String, AgentError> {
    let store = airlock_store::Store::open(&toolbox.engine.config().state_dir)?;
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
