//! The OpenAPI 3.1 document of the `/v1` API, generated from the handlers' and bodies'
//! types (docs/openapi.json; a test fails when the committed one is stale, another when
//! it and the router disagree on a path). The agent's routes (`/mcp`, the tool calls),
//! which the binary builds, are described here from what they answer; the framework's
//! own answers every route can give (401, 400/413/415/422 of a body, 400/404 of a path)
//! are added to each operation by [`StandardErrors`], one rule for all.

use crate::{api, approvals, error, health, runs, sessions, verification};
use utoipa::OpenApi;

#[derive(OpenApi)]
#[openapi(
    info(title = "airlock", description = "The execution service: runs, sessions, files, records (docs/api.md)"),
    paths(
        runs::create_run, runs::create_streamed_run, runs::get_run, runs::list_runs, runs::verify,
        sessions::create_session, sessions::list_sessions, sessions::get_session,
        sessions::exec, sessions::get_command, sessions::command_output, sessions::signal,
        sessions::set_timeout, sessions::delete_session, sessions::put_file,
        sessions::get_file, sessions::list_files, sessions::change_network,
        health::healthz, health::readyz, health::metrics,
        approvals::list_approvals, approvals::decide_approval,
        verification::acknowledge,
        agent_routes::mcp_post, agent_routes::mcp_get, agent_routes::mcp_delete,
        agent_routes::tool_call,
    ),
    components(schemas(
        error::ErrorBody, api::RunBody, api::RunView, api::RunList, api::SessionBody,
        api::SessionView, api::SessionList, api::ExecBody, api::CommandView, api::SignalBody,
        api::TimeoutBody, api::NetworkBody, api::NetworkView, api::DirEntry, api::DirList, api::Written, api::Verified, api::Health,
        approvals::Decision, approvals::DecisionKind, approvals::ApprovalList,
        approvals::PendingApproval, verification::ClassVerification,
    )),
    modifiers(&BearerAuth, &StandardErrors),
    security(("bearer" = []))
)]
pub struct ApiDoc;

struct BearerAuth;

/// The agent's routes (`crates/agent/src/mcp.rs`, mounted by `airlock serve`): their
/// descriptions only, the handlers are the agent crate's.
// Descriptions only: nothing calls these, utoipa reads their annotations.
#[allow(dead_code)]
mod agent_routes {
    use crate::error::ErrorBody;

    /// One JSON-RPC message of the MCP streamable-HTTP transport (2025-03-26 and later).
    #[utoipa::path(post, path = "/mcp", tag = "mcp",
        request_body(content = Object, content_type = "application/json",
            description = "A JSON-RPC request, notification or response (Accept must list application/json and text/event-stream)"),
        params(("mcp-session-id" = Option<String>, Header, description = "The session, from the initialize answer (absent for initialize)")),
        responses(
            (status = 200, description = "The JSON-RPC answer, as an event stream or JSON", content((String = "text/event-stream"), (Object = "application/json"))),
            (status = 202, description = "A notification or response accepted"),
            (status = 400, description = "Not a JSON-RPC message, or no session id", body = ErrorBody),
            (status = 404, description = "No such MCP session, or another tenant's", body = ErrorBody),
            (status = 406, description = "Accept does not list application/json and text/event-stream", body = ErrorBody),
            (status = 415, description = "Not application/json", body = ErrorBody),
            (status = 422, description = "A JSON-RPC message MCP does not take", body = ErrorBody),
            (status = 500, body = ErrorBody)))]
    pub fn mcp_post() {}

    /// The server's event stream of an MCP session.
    #[utoipa::path(get, path = "/mcp", tag = "mcp",
        params(("mcp-session-id" = Option<String>, Header, description = "The session")),
        responses(
            (status = 200, description = "Server-sent events", content_type = "text/event-stream"),
            (status = 400, description = "No session id", body = ErrorBody),
            (status = 404, description = "No such MCP session, or another tenant's", body = ErrorBody),
            (status = 406, description = "Accept does not list text/event-stream", body = ErrorBody),
            (status = 409, description = "The session's stream is already open", body = ErrorBody),
            (status = 500, body = ErrorBody)))]
    pub fn mcp_get() {}

    /// Ends an MCP session (the specification's session termination).
    #[utoipa::path(delete, path = "/mcp", tag = "mcp",
        params(("mcp-session-id" = Option<String>, Header, description = "The session to end")),
        responses(
            (status = 204, description = "The session ended"),
            (status = 400, description = "No session id", body = ErrorBody),
            (status = 404, description = "No such MCP session, or another tenant's", body = ErrorBody),
            (status = 500, body = ErrorBody)))]
    pub fn mcp_delete() {}

    /// One call of a registry tool: the body is the tool's input, answered with the
    /// envelope a model gets and the call's metadata.
    #[utoipa::path(post, path = "/v1/tools/{name}/call", tag = "tools",
        params(("name" = String, Path, description = "A tool of the registry")),
        request_body(content = Option<serde_json::Value>, content_type = "application/json",
            description = "The tool's input, any text: the tool's own schema decides it, and refuses it in the reply (`{reply: {ok: false, error}}`), not by status"),
        responses(
            (status = 200, description = "`{reply, meta}`: the reply (ok or an error naming its reason: an unknown tool, an input the tool's schema refuses) and the run's id, class, exit code", body = Object),
            (status = 413, body = ErrorBody),
            (status = 429, description = "Over one of the tenant's quotas: the same `{reply, meta}` body", body = Object),
            (status = 500, body = ErrorBody)))]
    pub fn tool_call() {}
}

impl utoipa::Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

/// The answers every operation can give by the framework's rules, added where its
/// annotation does not name them: 401 without a tenant (unless the route is open); a
/// JSON body's 400 (not JSON), 413, 415 (not application/json) and 422 (wrong shape);
/// any body's 413; a path parameter's 400 (of the wrong type) and 404 (no such
/// resource); a query's 400; and 500 for a fault inside the service.
struct StandardErrors;

impl utoipa::Modify for StandardErrors {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        for item in openapi.paths.paths.values_mut() {
            for operation in operations(item) {
                for (status, description) in standard_statuses(operation) {
                    let responses = &mut operation.responses.responses;
                    if !responses.contains_key(status) {
                        responses.insert(status.to_string(), error_response(description));
                    }
                }
            }
        }
    }
}

fn operations(
    item: &mut utoipa::openapi::PathItem,
) -> impl Iterator<Item = &mut utoipa::openapi::path::Operation> {
    [
        item.get.as_mut(),
        item.put.as_mut(),
        item.post.as_mut(),
        item.delete.as_mut(),
        item.patch.as_mut(),
    ]
    .into_iter()
    .flatten()
}

/// The pure rule: which framework statuses `operation` can answer.
fn standard_statuses(
    operation: &utoipa::openapi::path::Operation,
) -> Vec<(&'static str, &'static str)> {
    use utoipa::openapi::path::ParameterIn;
    let open = operation
        .security
        .as_ref()
        .is_some_and(|s| s.iter().all(|r| *r == Default::default()));
    let params = operation.parameters.as_deref().unwrap_or_default();
    let has = |place: ParameterIn| params.iter().any(|p| p.parameter_in == place);
    let body = operation.request_body.as_ref();
    let json_body = body.is_some_and(|b| b.content.contains_key("application/json"));
    let mut statuses = Vec::new();
    if !open {
        statuses.push(("401", "No tenant: no key, a wrong key, an unknown uid"));
        statuses.push(("500", "A fault inside the service (its store, a task)"));
    }
    if json_body {
        statuses.push(("400", "The body is not JSON (`body.invalid_json`)"));
        statuses.push((
            "415",
            "The body is not application/json (`body.content_type`)",
        ));
        statuses.push((
            "422",
            "The body's JSON has the wrong shape (`body.invalid_field`)",
        ));
    }
    if body.is_some() {
        statuses.push(("413", "The body is over its limit (`request.too_large`)"));
    }
    if has(ParameterIn::Path) {
        statuses.push(("400", "A path parameter of the wrong type (`path.invalid`)"));
        statuses.push(("404", "No such resource, or another tenant's (`not_found`)"));
    }
    if has(ParameterIn::Query) {
        statuses.push((
            "400",
            "A query parameter of the wrong type (`query.invalid`)",
        ));
    }
    statuses
}

fn error_response(description: &str) -> utoipa::openapi::RefOr<utoipa::openapi::Response> {
    use utoipa::openapi::{ContentBuilder, Ref, ResponseBuilder};
    ResponseBuilder::new()
        .description(description)
        .content(
            "application/json",
            ContentBuilder::new()
                .schema(Some(Ref::from_schema_name("ErrorBody")))
                .build(),
        )
        .build()
        .into()
}

/// The document as committed: pretty JSON with a final newline.
pub fn document() -> String {
    let mut doc = ApiDoc::openapi();
    // The crate's version would make every release rewrite the file.
    doc.info.version = "1".into();
    doc.to_pretty_json().unwrap_or_default() + "\n"
}

#[cfg(test)]
mod tests {
    fn committed() -> std::path::PathBuf {
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/openapi.json")
    }

    /// `AIRLOCK_BLESS=1 cargo test -p airlock-server openapi` rewrites docs/openapi.json.
    #[test]
    fn the_committed_openapi_document_matches_the_types() {
        let expected = super::document();
        if std::env::var_os("AIRLOCK_BLESS").is_some_and(|v| v == "1") {
            std::fs::write(committed(), &expected).unwrap();
            return;
        }
        let actual = std::fs::read_to_string(committed()).unwrap_or_default();
        assert!(
            actual == expected,
            "docs/openapi.json is out of date; regenerate it with \
             `AIRLOCK_BLESS=1 cargo test -p airlock-server openapi`"
        );
    }

    /// Every path the router serves is described, and every path described is served
    /// (by the router, or by the agent's routes the binary merges: src/lib.rs).
    #[test]
    fn the_document_and_the_router_have_the_same_paths() {
        let doc: serde_json::Value = serde_json::from_str(&super::document()).unwrap();
        let documented: std::collections::BTreeSet<String> =
            doc["paths"].as_object().unwrap().keys().cloned().collect();
        let mut served: std::collections::BTreeSet<String> =
            crate::api_paths().into_iter().collect();
        served.extend(crate::AGENT_PATHS.iter().map(|p| p.to_string()));
        assert_eq!(documented, served);
    }

    #[test]
    fn every_query_parameter_is_in_the_query_and_limit_is_bounded() {
        let doc: serde_json::Value = serde_json::from_str(&super::document()).unwrap();
        let params = doc["paths"]["/v1/runs"]["get"]["parameters"]
            .as_array()
            .unwrap();
        assert!(params.iter().all(|p| p["in"] == "query"), "{params:?}");
        let limit = params.iter().find(|p| p["name"] == "limit").unwrap();
        assert_eq!(limit["schema"]["maximum"], 1000);
        for (path, item) in doc["paths"].as_object().unwrap() {
            for (method, op) in item.as_object().unwrap() {
                for p in op["parameters"].as_array().into_iter().flatten() {
                    if p["in"] == "path" {
                        let name = p["name"].as_str().unwrap();
                        assert!(
                            path.contains(&format!("{{{name}}}")),
                            "{method} {path}: {name}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn a_json_body_route_documents_its_framework_errors_as_error_body() {
        let doc: serde_json::Value = serde_json::from_str(&super::document()).unwrap();
        let exec = &doc["paths"]["/v1/sessions/{id}/exec"]["post"]["responses"];
        for status in ["400", "401", "404", "413", "415", "422", "429", "503"] {
            let schema = &exec[status]["content"]["application/json"]["schema"]["$ref"];
            assert_eq!(schema, "#/components/schemas/ErrorBody", "{status}");
        }
        let health = &doc["paths"]["/healthz"]["get"]["responses"];
        assert!(health["401"].is_null(), "an open route has no 401");
    }

    #[test]
    fn the_document_is_openapi_3_1_and_has_every_route() {
        let doc: serde_json::Value = serde_json::from_str(&super::document()).unwrap();
        assert!(doc["openapi"].as_str().unwrap().starts_with("3.1"));
        for path in [
            "/v1/runs",
            "/v1/runs/{id}",
            "/v1/sessions/{id}/exec",
            "/v1/sessions/{id}/network",
            "/v1/audit/verify",
            "/v1/approvals",
            "/v1/approvals/{id}",
            "/metrics",
        ] {
            assert!(doc["paths"][path].is_object(), "{path} missing");
        }
    }
}
