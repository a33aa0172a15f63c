//! A client of OpenAI-compatible endpoints (Chat Completions, and the Responses API of
//! `responses.rs`): reqwest with rustls, the API
//! key only in the `Authorization` header of this process's requests, retries with
//! exponential backoff on 429 and 5xx (and on connection failures). An error never
//! carries the key or the endpoint's body beyond a bounded, redacted excerpt.

use crate::AgentError;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::time::{Duration, Instant};

/// Attempts per request, the first included.
pub const ATTEMPTS: u32 = 5;
/// The first retry's delay; each further one doubles it.
pub const FIRST_BACKOFF: Duration = Duration::from_millis(200);

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Message {
    pub role: String,
    #[serde(default)]
    pub content: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCall>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
}

impl Message {
    pub fn user(text: &str) -> Message {
        Message::text("user", text)
    }

    pub fn system(text: &str) -> Message {
        Message::text("system", text)
    }

    fn text(role: &str, text: &str) -> Message {
        Message {
            role: role.into(),
            content: Some(text.into()),
            tool_calls: None,
            tool_call_id: None,
        }
    }

    pub fn tool(call_id: &str, content: String) -> Message {
        Message {
            role: "tool".into(),
            content: Some(content),
            tool_calls: None,
            tool_call_id: Some(call_id.into()),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ToolCall {
    pub id: String,
    #[serde(rename = "type", default = "function_type")]
    pub kind: String,
    pub function: FunctionCall,
}

fn function_type() -> String {
    "function".into()
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct FunctionCall {
    pub name: String,
    /// JSON text, as the model wrote it (it may not be valid JSON).
    pub arguments: String,
}

/// A function tool offered to the model.
#[derive(Debug, Clone, Serialize)]
pub struct FunctionTool {
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub function: FunctionSpec,
}

#[derive(Debug, Clone, Serialize)]
pub struct FunctionSpec {
    pub name: String,
    pub description: String,
    /// The tool's input JSON Schema.
    pub parameters: Value,
}

impl FunctionTool {
    pub fn new(name: &str, description: &str, parameters: Value) -> FunctionTool {
        FunctionTool {
            kind: "function",
            function: FunctionSpec {
                name: name.into(),
                description: description.into(),
                parameters,
            },
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct ChatRequest<'a> {
    pub model: &'a str,
    pub messages: &'a [Message],
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    pub tools: &'a [FunctionTool],
}

#[derive(Debug, Clone, Deserialize)]
pub struct ChatResponse {
    pub choices: Vec<Choice>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Choice {
    pub message: Message,
    #[serde(default)]
    pub finish_reason: Option<String>,
}

/// One endpoint (its base URL, `.../v1`) with one key.
pub struct ChatClient {
    http: reqwest::blocking::Client,
    base_url: String,
    api_key: String,
}

/// Whether a response status is worth another attempt.
pub fn retryable(status: u16) -> bool {
    status == 429 || (500..600).contains(&status)
}

/// The delay before retry `n` (1-based).
pub fn backoff(n: u32) -> Duration {
    FIRST_BACKOFF * 2u32.pow(n.saturating_sub(1).min(6))
}

impl ChatClient {
    pub fn new(base_url: &str, api_key: String) -> Result<ChatClient, AgentError> {
        let http = reqwest::blocking::Client::builder()
            .use_rustls_tls()
            .timeout(Duration::from_secs(300))
            .build()
            .map_err(|e| AgentError::Model(format!("client: {}", e.without_url())))?;
        Ok(ChatClient {
            http,
            base_url: base_url.trim_end_matches('/').to_string(),
            api_key,
        })
    }

    /// One completion, retried on 429, 5xx and connection failures until `deadline`.
    pub fn complete(
        &self,
        request: &ChatRequest<'_>,
        deadline: Instant,
    ) -> Result<ChatResponse, AgentError> {
        self.post("chat/completions", request, deadline)
    }

    /// One response of the Responses API (`POST /responses`), retried as [`Self::complete`].
    pub fn respond(
        &self,
        request: &crate::responses::ResponsesRequest<'_>,
        deadline: Instant,
    ) -> Result<crate::responses::ResponsesReply, AgentError> {
        self.post("responses", request, deadline)
    }

    fn post<T: serde::de::DeserializeOwned>(
        &self,
        path: &str,
        request: &impl Serialize,
        deadline: Instant,
    ) -> Result<T, AgentError> {
        let url = format!("{}/{path}", self.base_url);
        let mut attempt = 1;
        loop {
            let remaining = deadline.saturating_duration_since(Instant::now());
            if remaining.is_zero() {
                return Err(AgentError::Model("the deadline passed".into()));
            }
            let outcome = self.attempt(&url, request, remaining);
            let retry = match &outcome {
                Err(Attempt::Status(status, _)) => retryable(*status),
                Err(Attempt::Transport(_)) => true,
                _ => false,
            };
            if !retry || attempt >= ATTEMPTS {
                return outcome.map_err(|failed| AgentError::Model(self.redact(failed.describe())));
            }
            std::thread::sleep(backoff(attempt).min(remaining));
            attempt += 1;
        }
    }

    fn attempt<T: serde::de::DeserializeOwned>(
        &self,
        url: &str,
        request: &impl Serialize,
        timeout: Duration,
    ) -> Result<T, Attempt> {
        let response = self
            .http
            .post(url)
            .bearer_auth(&self.api_key)
            .timeout(timeout)
            .json(request)
            .send()
            .map_err(|e| Attempt::Transport(e.without_url().to_string()))?;
        let status = response.status().as_u16();
        let body = response
            .text()
            .map_err(|e| Attempt::Transport(e.without_url().to_string()))?;
        if !(200..300).contains(&status) {
            return Err(Attempt::Status(status, body));
        }
        serde_json::from_str(&body).map_err(|e| Attempt::Body(e.to_string()))
    }

    fn redact(&self, text: String) -> String {
        airlock_store::Redactor::new(vec![self.api_key.clone()]).text(&text)
    }
}

enum Attempt {
    Status(u16, String),
    Transport(String),
    Body(String),
}

impl Attempt {
    fn describe(self) -> String {
        let excerpt = |text: &str| crate::schema::bounded(text.trim(), 200);
        match self {
            Attempt::Status(status, body) => format!("HTTP {status}: {}", excerpt(&body)),
            Attempt::Transport(why) => format!("unreachable: {}", excerpt(&why)),
            Attempt::Body(why) => format!("not the answer expected: {}", excerpt(&why)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rate_limits_and_server_errors_are_retried_client_errors_are_not() {
        assert!(retryable(429));
        assert!(retryable(503));
        assert!(!retryable(400));
        assert!(!retryable(401));
    }

    #[test]
    fn backoff_doubles() {
        assert_eq!(backoff(1), FIRST_BACKOFF);
        assert_eq!(backoff(3), FIRST_BACKOFF * 4);
    }

    #[test]
    fn a_tool_call_parses_as_openai_sends_it() {
        let message: Message = serde_json::from_value(serde_json::json!({
            "role": "assistant", "content": null,
            "tool_calls": [{"id": "call_1", "type": "function",
                            "function": {"name": "db_query", "arguments": "{\"query\":\"x\"}"}}]
        }))
        .unwrap();
        assert_eq!(message.tool_calls.unwrap()[0].function.name, "db_query");
    }
}
