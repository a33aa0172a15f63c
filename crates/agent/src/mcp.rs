//! The MCP server (the official Rust SDK, `rmcp`): over stdio (`airlock mcp`) and as a
//! streamable-HTTP service ([`http_router`], which `airlock serve` mounts at `/mcp`
//! behind its tenant keys). It offers every registry tool with its `inputSchema` and
//! `outputSchema` (results: the output in `structuredContent`, the envelope as text) and
//! the generic tools of `generic.rs`. Every result's `_meta.airlock` carries the run id,
//! result class, exit code, limit fired and truncation. A call with a progress token gets
//! a progress notification every second while its cell runs; a cancelled call kills its
//! command and destroys its cell before the handler returns.

use crate::call::{CallMeta, ToolBox};
use crate::exec::Cancel;
use crate::generic::{CommandResult, Generic};
use crate::protocol::{reason, ToolReply};
use crate::schema::Schema;
use crate::AgentError;
use airlock_cell::report::ResultClass;
use airlock_engine::caller::Refused;
use airlock_engine::Caller;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
    JsonObject, ListToolsResult, MetaObject, PaginatedRequestParams, ProgressNotificationParam,
    ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::{RequestContext, RoleServer};
use rmcp::{ErrorData, ServerHandler, ServiceExt};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How often a long call reports progress.
const PROGRESS_EVERY: Duration = Duration::from_secs(1);

/// The generic tools: name, description, input schema, output schema.
fn generic_tool_specs() -> Vec<(&'static str, &'static str, Value, Value)> {
    let argv = json!({"type": "array", "items": {"type": "string"}, "minItems": 1,
                      "description": "argv: the program and its arguments (no shell)"});
    let session = json!({"type": "string", "description": "the id session_open returned"});
    // Nullable fields as `anyOf` of single types, not a `type` array: clients that map
    // tool schemas onto a single-`type` dialect (the MCP Inspector's `--strict` check
    // names Gemini's function declarations) keep the constraint.
    let nullable = |kind: &str| json!({"anyOf": [{"type": kind}, {"type": "null"}]});
    let command_result = json!({
        "type": "object",
        "required": ["run_id", "result_class", "truncated", "stdout"],
        "properties": {
            "run_id": {"type": "string"},
            "result_class": {"type": "string"},
            "exit_code": nullable("integer"),
            "limit_fired": nullable("string"),
            "truncated": {"type": "boolean"},
            "stdout": {"type": "string"},
            "stdout_bytes": {"type": "integer"},
            "stderr_bytes": {"type": "integer"}
        }
    });
    let object = |properties: Value, required: &[&str]| {
        json!({"type": "object", "properties": properties, "required": required,
               "additionalProperties": false})
    };
    vec![
        ("run_command", "Run a command in a fresh cell (no network unless the operator's contract allows it). stdout is returned; stderr stays in the audit record (redirect it with sh -c '... 2>&1' to see it).",
         object(json!({"command": argv, "stdin": {"type": "string"}}), &["command"]), command_result.clone()),
        ("run_python", "Run a Python 3 snippet (python3 -c CODE) in a fresh cell; what it prints is returned.",
         object(json!({"code": {"type": "string"}}), &["code"]), command_result.clone()),
        ("session_open", "Open a session: one cell whose files persist between its commands until session_close.",
         object(json!({}), &[]),
         json!({"type": "object", "required": ["session_id"], "properties": {"session_id": {"type": "string"}}})),
        ("session_exec", "Run a command in an open session.",
         object(json!({"session_id": session, "command": argv, "stdin": {"type": "string"}}), &["session_id", "command"]), command_result.clone()),
        ("session_read_file", "Read a file of an open session (its first max_output_bytes).",
         object(json!({"session_id": session, "path": {"type": "string"}}), &["session_id", "path"]), command_result.clone()),
        ("session_write_file", "Write a file in an open session (a writable path of its contract).",
         object(json!({"session_id": session, "path": {"type": "string"}, "content": {"type": "string"}}), &["session_id", "path", "content"]), command_result),
        ("session_close", "Close a session: its cell is destroyed.",
         object(json!({"session_id": session}), &["session_id"]),
         json!({"type": "object", "required": ["run_id", "result_class"], "properties": {
             "run_id": {"type": "string"}, "result_class": {"type": "string"},
             "exit_code": nullable("integer"), "limit_fired": nullable("string"),
             "truncated": {"type": "boolean"}}})),
    ]
}

struct GenericTool {
    name: &'static str,
    description: &'static str,
    input: Schema,
    output: Value,
}

/// What every MCP connection of one server shares.
pub struct McpState {
    toolbox: Arc<ToolBox>,
    generic: Generic,
    generic_tools: Vec<GenericTool>,
}

impl McpState {
    /// Refuses a registry whose tool names collide with a generic tool's.
    pub fn new(toolbox: Arc<ToolBox>) -> Result<Arc<McpState>, AgentError> {
        let mut generic_tools = Vec::new();
        for (name, description, input, output) in generic_tool_specs() {
            if toolbox.registry.get(name).is_some() {
                return Err(AgentError::Tool {
                    tool: name.to_string(),
                    message: "is the name of a generic MCP tool; rename it".into(),
                });
            }
            let input = Schema::compile(input).map_err(AgentError::Agent)?;
            generic_tools.push(GenericTool {
                name,
                description,
                input,
                output,
            });
        }
        Ok(Arc::new(McpState {
            generic: Generic::new(Arc::clone(&toolbox)),
            toolbox,
            generic_tools,
        }))
    }

    fn tools(&self) -> Vec<Tool> {
        let registry = self.toolbox.registry.tools.values().map(|tool| {
            Tool::new(
                tool.name.clone(),
                tool.description.clone(),
                object(tool.input.source()),
            )
            .with_raw_output_schema(Arc::new(object(tool.output.source())))
        });
        let generic = self.generic_tools.iter().map(|tool| {
            Tool::new(tool.name, tool.description, object(tool.input.source()))
                .with_raw_output_schema(Arc::new(object(&tool.output)))
        });
        registry.chain(generic).collect()
    }

    /// Runs one call to its end (blocking: on a thread of its own), for `caller` (the
    /// service's tenant; `None` over stdio).
    fn call(
        &self,
        name: &str,
        arguments: Value,
        caller: Option<&Caller>,
        cancel: &Cancel,
    ) -> CallToolResult {
        if let Some(tool) = self.generic_tools.iter().find(|t| t.name == name) {
            return match tool.input.check(&arguments) {
                Ok(()) => self.call_generic(name, &arguments, caller, cancel),
                Err(violation) => refused_generic(&format!(
                    "the input does not match the tool's schema: {violation}"
                )),
            };
        }
        let result = match caller {
            Some(caller) => self.toolbox.call_as(name, &arguments, caller, cancel),
            None => self.toolbox.call(name, &arguments, cancel),
        };
        registry_result(&result.reply, &result.meta)
    }

    fn call_generic(
        &self,
        name: &str,
        args: &Value,
        caller: Option<&Caller>,
        cancel: &Cancel,
    ) -> CallToolResult {
        let text = |key: &str| args.get(key).and_then(Value::as_str).unwrap_or_default();
        let argv = || -> Vec<String> {
            args.get("command")
                .and_then(Value::as_array)
                .map(|items| {
                    items
                        .iter()
                        .filter_map(|v| v.as_str().map(String::from))
                        .collect()
                })
                .unwrap_or_default()
        };
        let generic = &self.generic;
        let session = text("session_id");
        let ran = match name {
            "run_command" => generic.run_command(argv(), text("stdin"), caller, cancel),
            "run_python" => generic.run_python(text("code"), caller, cancel),
            "session_exec" => generic.session_exec(session, argv(), text("stdin"), caller, cancel),
            "session_read_file" => generic.session_read_file(session, text("path"), caller, cancel),
            "session_write_file" => {
                let (path, content) = (text("path"), text("content"));
                generic.session_write_file(session, path, content, caller, cancel)
            }
            "session_open" => {
                return match generic.session_open(caller) {
                    Ok(id) => structured(json!({"session_id": id}), None, false),
                    Err(err) => generic_error(&err),
                }
            }
            _ => {
                return match generic.session_close(session, caller) {
                    Ok(meta) => structured(json!(meta), Some(&meta), false),
                    Err(err) => generic_error(&err),
                }
            }
        };
        match ran {
            Ok(result) => command_result(&result),
            Err(err) => generic_error(&err),
        }
    }
}

fn object(value: &Value) -> JsonObject {
    value.as_object().cloned().unwrap_or_default()
}

fn airlock_meta(meta: &CallMeta) -> MetaObject {
    let mut object = JsonObject::new();
    object.insert("airlock".into(), json!(meta));
    MetaObject(object)
}

/// A result with `value` as its structured content and its text rendering.
fn structured(value: Value, meta: Option<&CallMeta>, is_error: bool) -> CallToolResult {
    let mut result = match is_error {
        true => CallToolResult::error(vec![ContentBlock::text(value.to_string())]),
        false => CallToolResult::structured(value),
    };
    result.meta = meta.map(airlock_meta);
    result
}

fn command_result(result: &CommandResult) -> CallToolResult {
    let value = json!(result);
    let failed = result.meta.result_class != ResultClass::Ok.as_str();
    let mut out = CallToolResult::structured(value);
    out.is_error = Some(failed);
    out.meta = Some(airlock_meta(&result.meta));
    out
}

/// A registry tool's result: the output as structured content, the envelope as text.
fn registry_result(reply: &ToolReply, meta: &CallMeta) -> CallToolResult {
    let mut envelope = reply.to_value();
    envelope["meta"] = json!(meta);
    let text = vec![ContentBlock::text(envelope.to_string())];
    let mut result = match reply {
        ToolReply::Ok { output, .. } => {
            let mut ok = CallToolResult::success(text);
            ok.structured_content = Some(output.clone());
            ok
        }
        ToolReply::Err { .. } => CallToolResult::error(text),
    };
    result.meta = Some(airlock_meta(meta));
    result
}

fn refused_generic(message: &str) -> CallToolResult {
    let reply = ToolReply::error(ResultClass::PolicyDenied, reason::INPUT_SCHEMA, message, "");
    CallToolResult::error(vec![ContentBlock::text(reply.to_value().to_string())])
}

fn generic_error(err: &AgentError) -> CallToolResult {
    let message = crate::schema::bounded(&err.to_string(), crate::protocol::MESSAGE_CHARS);
    let reply = match err {
        AgentError::Refused { class, reason, .. } => ToolReply::error(*class, reason, &message, ""),
        _ => ToolReply::error(ResultClass::RuntimeFault, reason::RUNTIME, &message, ""),
    };
    CallToolResult::error(vec![ContentBlock::text(reply.to_value().to_string())])
}

/// One MCP connection's handler.
#[derive(Clone)]
pub struct McpServer {
    state: Arc<McpState>,
    /// Over HTTP every call must come with the [`Caller`] that [`http_router`]'s
    /// authentication put on its request; a call without one is refused (fail closed,
    /// should the router ever be mounted without it).
    over_http: bool,
}

impl McpServer {
    /// The stdio server's handler: its one client is the local user who started it.
    pub fn new(state: Arc<McpState>) -> McpServer {
        McpServer {
            state,
            over_http: false,
        }
    }

    fn over_http(state: Arc<McpState>) -> McpServer {
        McpServer {
            state,
            over_http: true,
        }
    }
}

/// The caller the HTTP layer authenticated for this request, if any.
fn caller_of(context: &RequestContext<RoleServer>) -> Option<Caller> {
    context
        .extensions
        .get::<axum::http::request::Parts>()
        .and_then(|parts| parts.extensions.get::<Caller>())
        .cloned()
}

impl ServerHandler for McpServer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("airlock", env!("CARGO_PKG_VERSION")))
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(self.state.tools()))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let name = request.name.to_string();
        let arguments = Value::Object(request.arguments.unwrap_or_default());
        let caller = caller_of(&context);
        if self.over_http && caller.is_none() {
            return Err(ErrorData::invalid_request(
                "the request has no authenticated tenant",
                None,
            ));
        }
        let cancel = Cancel::default();
        let state = Arc::clone(&self.state);
        let call_cancel = cancel.clone();
        let mut running = tokio::task::spawn_blocking(move || {
            state.call(&name, arguments, caller.as_ref(), &call_cancel)
        });
        let progress_token = context.meta.get_progress_token();
        let mut ticks = tokio::time::interval(PROGRESS_EVERY);
        ticks.tick().await;
        let mut seconds = 0u32;
        loop {
            tokio::select! {
                done = &mut running => {
                    let result = done.map_err(|e| ErrorData::internal_error(e.to_string(), None))?;
                    if cancel.fired() {
                        return Err(ErrorData::internal_error("the call was cancelled; its cell is destroyed", None));
                    }
                    return Ok(result.into());
                }
                _ = context.ct.cancelled(), if !cancel.fired() => cancel.fire(),
                _ = ticks.tick() => {
                    seconds += 1;
                    if let Some(token) = &progress_token {
                        let param = ProgressNotificationParam::new(token.clone(), f64::from(seconds))
                            .with_message(format!("running in its cell for {seconds} s"));
                        let _ = context.peer.notify_progress(param).await;
                    }
                }
            }
        }
    }
}

/// Serves MCP on this process's stdin and stdout until the client closes them.
pub async fn serve_stdio(state: Arc<McpState>) -> Result<(), AgentError> {
    let running = McpServer::new(state)
        .serve(rmcp::transport::stdio())
        .await
        .map_err(|e| AgentError::Agent(format!("mcp: {e}")))?;
    running
        .waiting()
        .await
        .map_err(|e| AgentError::Agent(format!("mcp: {e}")))?;
    Ok(())
}

/// Who a request is (its tenant and that tenant's quotas), or why it is refused: the
/// service's tenant resolution, or [`single_key`].
pub type Authenticate =
    Arc<dyn Fn(&axum::http::request::Parts) -> Result<Caller, Refused> + Send + Sync>;

/// The streamable-HTTP MCP service as an axum router, to be mounted (e.g. at `/mcp`). A
/// request that `authenticate` refuses is answered 401 before MCP sees it; one that it
/// accepts carries its [`Caller`] to every tool call, whose cells are admitted against
/// the caller's quotas and recorded under its tenant. Each MCP session belongs to the
/// tenant whose request opened it: another tenant's request naming its
/// `Mcp-Session-Id` is answered 404, as an unknown session is. Hosts other than loopback
/// are refused by rmcp unless `allowed_hosts` names them (DNS rebinding).
pub fn http_router(
    state: Arc<McpState>,
    authenticate: Authenticate,
    allowed_hosts: Vec<String>,
) -> axum::Router {
    use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
    use rmcp::transport::streamable_http_server::{
        StreamableHttpServerConfig, StreamableHttpService,
    };
    let mut config = StreamableHttpServerConfig::default();
    if !allowed_hosts.is_empty() {
        config.allowed_hosts = allowed_hosts;
    }
    let service = StreamableHttpService::new(
        move || Ok(McpServer::over_http(Arc::clone(&state))),
        Arc::new(LocalSessionManager::default()),
        config,
    );
    let owners = Arc::new(SessionOwners::default());
    axum::Router::new()
        .fallback_service(service)
        .layer(axum::middleware::from_fn(move |request, next| {
            let gate = Gate {
                authenticate: Arc::clone(&authenticate),
                owners: Some(Arc::clone(&owners)),
            };
            gate.pass(request, next)
        }))
}

/// The tenant that opened each MCP session, by its `Mcp-Session-Id`.
#[derive(Default)]
struct SessionOwners(Mutex<HashMap<String, String>>);

const SESSION_HEADER: &str = "mcp-session-id";

impl SessionOwners {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, String>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn may_use(&self, session: &str, tenant: &str) -> bool {
        session_verdict(self.lock().get(session).map(String::as_str), tenant)
    }

    /// What a response says about sessions: a new one opened for `tenant`, or one gone.
    fn learn(
        &self,
        asked: Option<&str>,
        method: &axum::http::Method,
        response: &axum::response::Response,
        tenant: &str,
    ) {
        let opened = response
            .headers()
            .get(SESSION_HEADER)
            .and_then(|v| v.to_str().ok());
        let status = response.status();
        match (asked, opened) {
            (None, Some(opened)) => {
                self.lock().insert(opened.to_string(), tenant.to_string());
            }
            (Some(asked), _)
                if status == axum::http::StatusCode::NOT_FOUND
                    || (*method == axum::http::Method::DELETE && status.is_success()) =>
            {
                self.lock().remove(asked);
            }
            _ => {}
        }
    }
}

/// The pure decision: a session is usable by the tenant that opened it; one this
/// router never saw opened is unknown (404), as another tenant's is: rmcp would accept
/// the `DELETE` of any id.
fn session_verdict(owner: Option<&str>, tenant: &str) -> bool {
    owner == Some(tenant)
}

/// The authentication in front of the agent's routes.
struct Gate {
    authenticate: Authenticate,
    /// Set for `/mcp`: its sessions are bound to their tenants.
    owners: Option<Arc<SessionOwners>>,
}

impl Gate {
    async fn pass(
        self,
        request: axum::extract::Request,
        next: axum::middleware::Next,
    ) -> axum::response::Response {
        let (mut parts, body) = request.into_parts();
        if self.owners.is_some() && !MCP_METHODS.contains(&parts.method) {
            return method_not_allowed();
        }
        let caller = match (self.authenticate)(&parts) {
            Ok(caller) => caller,
            Err(refused) => return refusal(axum::http::StatusCode::UNAUTHORIZED, &refused),
        };
        let asked = parts
            .headers
            .get(SESSION_HEADER)
            .and_then(|v| v.to_str().ok())
            .map(String::from);
        if let (Some(owners), Some(asked)) = (&self.owners, &asked) {
            if !owners.may_use(asked, caller.tenant()) {
                let refused = Refused {
                    class: ResultClass::PolicyDenied,
                    reason: "not_found".into(),
                    message: "no such MCP session (Mcp-Session-Id)".into(),
                };
                return refusal(axum::http::StatusCode::NOT_FOUND, &refused);
            }
        }
        let method = parts.method.clone();
        let tenant = caller.tenant().to_string();
        parts.extensions.insert(caller);
        let response = next
            .run(axum::extract::Request::from_parts(parts, body))
            .await;
        if let Some(owners) = &self.owners {
            owners.learn(asked.as_deref(), &method, &response, &tenant);
            return ended_session_answer(&method, response);
        }
        response
    }
}

/// The methods of the streamable-HTTP transport at `/mcp`.
const MCP_METHODS: [axum::http::Method; 3] = [
    axum::http::Method::GET,
    axum::http::Method::POST,
    axum::http::Method::DELETE,
];

/// Any other method at `/mcp`: 405 with `Allow`, before a session id is looked at (an
/// unknown one would otherwise answer 404 for a method that never applies).
fn method_not_allowed() -> axum::response::Response {
    let refused = Refused {
        class: ResultClass::PolicyDenied,
        reason: "method.not_allowed".into(),
        message: "/mcp takes GET, POST and DELETE (see Allow)".into(),
    };
    let mut response = refusal(axum::http::StatusCode::METHOD_NOT_ALLOWED, &refused);
    response.headers_mut().insert(
        axum::http::header::ALLOW,
        axum::http::HeaderValue::from_static("GET,POST,DELETE"),
    );
    response
}

/// A session's `DELETE` as the MCP specification and its SDKs expect it: rmcp answers
/// 202, which the official Python SDK logs as "Session termination failed" (it takes
/// 200 or 204); the session is gone, so this answers 204 No Content.
fn ended_session_answer(
    method: &axum::http::Method,
    mut response: axum::response::Response,
) -> axum::response::Response {
    if *method == axum::http::Method::DELETE
        && response.status() == axum::http::StatusCode::ACCEPTED
    {
        *response.status_mut() = axum::http::StatusCode::NO_CONTENT;
        *response.body_mut() = axum::body::Body::empty();
        response
            .headers_mut()
            .remove(axum::http::header::CONTENT_LENGTH);
        response
            .headers_mut()
            .remove(axum::http::header::CONTENT_TYPE);
    }
    response
}

/// A refusal as the API's error body: `{error, reason, class}`.
fn refusal(status: axum::http::StatusCode, refused: &Refused) -> axum::response::Response {
    use axum::response::IntoResponse;
    let body = json!({
        "error": refused.message,
        "reason": refused.reason,
        "class": refused.class.as_str(),
    });
    (status, axum::Json(body)).into_response()
}

/// One Bearer key, one tenant (`airlock mcp --listen`): `key` compared in constant time,
/// the caller `tenant` with no quotas.
pub fn single_key(key: String, tenant: &str) -> Authenticate {
    let tenant = tenant.to_string();
    Arc::new(move |parts: &axum::http::request::Parts| {
        let offered = parts
            .headers
            .get(axum::http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        match offered {
            Some(offered) if constant_time_eq(offered.as_bytes(), key.as_bytes()) => {
                Ok(Caller::unbounded(tenant.clone()))
            }
            _ => Err(Refused {
                class: ResultClass::PolicyDenied,
                reason: "auth.bad_key".into(),
                message: "a Bearer key is required (Authorization: Bearer KEY)".into(),
            }),
        }
    })
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// `POST /v1/tools/{name}/call`, the body the tool's input (JSON): the tool protocol over
/// HTTP, answered `{reply, meta}` (the envelope a model gets, and the call's run id,
/// result class, exit code, limit fired and truncation), authenticated like `/mcp`; the
/// call's cell is admitted against the caller's quotas (over one: 429, the same body)
/// and recorded under its tenant. A client that goes away cancels the call: its cell is
/// killed.
pub fn tool_call_router(toolbox: Arc<ToolBox>, authenticate: Authenticate) -> axum::Router {
    axum::Router::new()
        .route("/v1/tools/{name}/call", axum::routing::post(call_tool))
        .with_state(toolbox)
        .layer(axum::middleware::from_fn(move |request, next| {
            let gate = Gate {
                authenticate: Arc::clone(&authenticate),
                owners: None,
            };
            gate.pass(request, next)
        }))
}

/// Fires the call's cancel when the request's future is dropped before the call ended.
struct CancelOnDrop(Option<Cancel>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if let Some(cancel) = self.0.take() {
            cancel.fire();
        }
    }
}

async fn call_tool(
    axum::extract::State(toolbox): axum::extract::State<Arc<ToolBox>>,
    axum::extract::Path(name): axum::extract::Path<String>,
    axum::Extension(caller): axum::Extension<Caller>,
    input: String,
) -> axum::response::Response {
    let cancel = Cancel::default();
    let mut on_drop = CancelOnDrop(Some(cancel.clone()));
    let called =
        tokio::task::spawn_blocking(move || toolbox.call_text_as(&name, &input, &caller, &cancel))
            .await;
    on_drop.0 = None;
    use axum::response::IntoResponse;
    match called {
        Ok(result) => {
            let status = match over_quota(&result.reply) {
                true => axum::http::StatusCode::TOO_MANY_REQUESTS,
                false => axum::http::StatusCode::OK,
            };
            let body = json!({"reply": result.reply, "meta": result.meta});
            (status, axum::Json(body)).into_response()
        }
        Err(_) => refusal(
            axum::http::StatusCode::INTERNAL_SERVER_ERROR,
            &Refused {
                class: ResultClass::RuntimeFault,
                reason: "server.task".into(),
                message: "the tool call failed inside the service".into(),
            },
        ),
    }
}

/// Whether a call was refused by one of its tenant's quotas (answered 429 over HTTP).
fn over_quota(reply: &ToolReply) -> bool {
    matches!(reply, ToolReply::Err { error, .. } if error.reason.starts_with("quota."))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_compare_whole() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"abcd"));
    }

    #[test]
    fn an_mcp_session_is_usable_only_by_the_tenant_that_opened_it() {
        assert!(session_verdict(Some("alice"), "alice"));
        assert!(!session_verdict(Some("alice"), "bob"));
        assert!(!session_verdict(None, "bob"), "an unknown session is 404");
    }

    #[test]
    fn only_quota_refusals_are_answered_429() {
        let quota = ToolReply::error(ResultClass::CapacityExceeded, "quota.cells", "m", "r");
        assert!(over_quota(&quota));
        let schema = ToolReply::error(ResultClass::PolicyDenied, "input.schema", "m", "r");
        assert!(!over_quota(&schema));
    }

    #[test]
    fn every_generic_schema_compiles() {
        for (name, _, input, output) in generic_tool_specs() {
            Schema::compile(input).unwrap_or_else(|e| panic!("{name}: {e}"));
            Schema::compile(output).unwrap_or_else(|e| panic!("{name}: {e}"));
        }
    }

    #[test]
    fn a_registry_error_has_no_structured_content_and_carries_the_run() {
        let reply = ToolReply::error(ResultClass::TaskError, "output.schema", "m", "r1");
        let meta = CallMeta {
            run_id: "r1".into(),
            result_class: "task_error".into(),
            exit_code: Some(0),
            limit_fired: None,
            truncated: false,
        };
        let result = registry_result(&reply, &meta);
        assert_eq!(result.is_error, Some(true));
        assert!(result.structured_content.is_none());
        let meta = result.meta.unwrap();
        assert_eq!(meta.0["airlock"]["run_id"], "r1");
    }
}
