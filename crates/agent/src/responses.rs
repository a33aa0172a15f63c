//! OpenAI's Responses API as the agent's endpoint (`airlock agent --api responses`): the
//! registry's tools are offered as function tools and, with `--shell`, the Responses
//! `shell` tool in local mode (`{"type": "shell", "environment": {"type": "local"}}`): the
//! model emits `shell_call` items, airlock runs their commands in the task's one session
//! cell (`shell.rs`) and answers each with a `shell_call_output` item. The conversation
//! is stateless (`store: false`): every turn sends the whole item list, the model's own
//! output items passed back as they came (reasoning items too), as the API expects.
//!
//! The items are the endpoint's wire format, kept as JSON values so that an item this
//! client does not know is passed back untouched; what airlock reads of them is typed
//! ([`OutputItem`]) and what it writes has exactly the fields of OpenAI's types.

use crate::call::ToolBox;
use crate::shell::{ShellAction, ShellCallOutput, ShellCommandOutput, ShellOutcome};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

#[derive(Debug, Clone, Serialize)]
pub struct ResponsesRequest<'a> {
    pub model: &'a str,
    pub input: &'a [Value],
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    pub tools: &'a [Value],
    /// Nothing is kept on the endpoint's side between turns.
    pub store: bool,
}

#[derive(Debug, Clone, Deserialize)]
pub struct ResponsesReply {
    pub output: Vec<Value>,
}

/// What airlock acts on in a response's output.
#[derive(Debug, Clone, PartialEq)]
pub enum OutputItem {
    FunctionCall {
        call_id: String,
        name: String,
        arguments: String,
    },
    /// A `shell_call`; its action as sent, or why it is not one.
    ShellCall {
        call_id: String,
        action: Result<ShellAction, String>,
    },
    /// The text of an assistant message.
    Message(String),
    /// Anything else (reasoning, ...): passed back, not acted on.
    Other,
}

/// Reads one output item.
pub fn read_item(item: &Value) -> OutputItem {
    let text = |key: &str| item.get(key).and_then(Value::as_str).map(String::from);
    match item.get("type").and_then(Value::as_str) {
        Some("function_call") => OutputItem::FunctionCall {
            call_id: text("call_id").unwrap_or_default(),
            name: text("name").unwrap_or_default(),
            arguments: text("arguments").unwrap_or_default(),
        },
        Some("shell_call") => OutputItem::ShellCall {
            call_id: text("call_id").unwrap_or_default(),
            action: serde_json::from_value(item.get("action").cloned().unwrap_or_default())
                .map_err(|err| format!("the shell action is not valid: {err}")),
        },
        Some("message") => OutputItem::Message(message_text(item)),
        _ => OutputItem::Other,
    }
}

/// The `output_text` parts of a message, joined.
fn message_text(item: &Value) -> String {
    item.get("content")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|part| part.get("type").and_then(Value::as_str) == Some("output_text"))
        .filter_map(|part| part.get("text").and_then(Value::as_str))
        .collect()
}

/// The tools offered: every registry tool as a Responses function tool (not `strict`: a
/// registry schema need not meet strict mode's rules; airlock validates the arguments
/// itself), and the local shell tool when asked.
pub fn tools(toolbox: &ToolBox, with_shell: bool) -> Vec<Value> {
    let mut tools: Vec<Value> = toolbox
        .registry
        .tools
        .values()
        .map(|tool| {
            json!({"type": "function", "name": tool.name, "description": tool.description,
                   "parameters": tool.input.source(), "strict": false})
        })
        .collect();
    if with_shell {
        tools.push(json!({"type": "shell", "environment": {"type": "local"}}));
    }
    tools
}

/// The user's task as the first input item.
pub fn user_item(task: &str) -> Value {
    json!({"type": "message", "role": "user", "content": task})
}

/// The `function_call_output` item answering call `call_id` with `output` (the envelope).
pub fn function_output_item(call_id: &str, output: String) -> Value {
    json!({"type": "function_call_output", "call_id": call_id, "output": output})
}

/// The `shell_call_output` item, with exactly the fields of OpenAI's type (airlock's run
/// ids stay in the transcript's records, not on the wire).
pub fn shell_output_item(output: &ShellCallOutput) -> Value {
    let entries: Vec<Value> = output.output.iter().map(shell_entry).collect();
    json!({"type": "shell_call_output", "call_id": output.call_id,
           "max_output_length": output.max_output_length, "output": entries})
}

fn shell_entry(entry: &ShellCommandOutput) -> Value {
    json!({"stdout": entry.stdout, "stderr": entry.stderr, "outcome": entry.outcome})
}

/// The answer to a shell call airlock cannot run (no shell offered, an invalid action):
/// one entry whose stderr says why, exit code 126 as a shell's "cannot execute".
pub fn shell_refusal(call_id: &str, why: &str) -> ShellCallOutput {
    ShellCallOutput {
        kind: "shell_call_output".into(),
        call_id: call_id.to_string(),
        max_output_length: crate::shell::DEFAULT_MAX_OUTPUT_LENGTH,
        output: vec![ShellCommandOutput {
            stdout: String::new(),
            stderr: format!("airlock: {}", crate::schema::bounded(why, 300)),
            outcome: ShellOutcome::Exit { exit_code: 126 },
            run_id: String::new(),
        }],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_items_are_read_as_openai_sends_them() {
        let shell = json!({"type": "shell_call", "id": "sh_1", "call_id": "call_1",
            "status": "completed", "caller": {"type": "direct"},
            "action": {"commands": ["ls"], "timeout_ms": 1000, "max_output_length": 64}});
        let OutputItem::ShellCall { call_id, action } = read_item(&shell) else {
            panic!("a shell call");
        };
        assert_eq!(call_id, "call_1");
        assert_eq!(action.unwrap().commands, ["ls"]);
        let function = json!({"type": "function_call", "id": "fc_1", "call_id": "call_2",
                              "name": "echo", "arguments": "{}", "status": "completed"});
        assert!(
            matches!(read_item(&function), OutputItem::FunctionCall { name, .. } if name == "echo")
        );
        let message = json!({"type": "message", "role": "assistant", "id": "m",
            "content": [{"type": "output_text", "text": "done", "annotations": []}]});
        assert_eq!(read_item(&message), OutputItem::Message("done".into()));
        assert_eq!(
            read_item(&json!({"type": "reasoning", "summary": []})),
            OutputItem::Other
        );
    }

    #[test]
    fn a_malformed_shell_action_is_refused_not_run() {
        let item = json!({"type": "shell_call", "call_id": "c", "action": {"commands": "ls"}});
        let OutputItem::ShellCall { action, .. } = read_item(&item) else {
            panic!("a shell call");
        };
        assert!(action.is_err());
    }

    #[test]
    fn a_shell_output_item_has_only_openais_fields() {
        let output = shell_refusal("call_9", "no shell");
        let item = shell_output_item(&output);
        let mut keys: Vec<&str> = item
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        keys.sort();
        assert_eq!(keys, ["call_id", "max_output_length", "output", "type"]);
        let entry = item["output"][0].as_object().unwrap();
        assert!(!entry.contains_key("run_id"));
        assert_eq!(
            item["output"][0]["outcome"],
            json!({"type": "exit", "exit_code": 126})
        );
    }
}
