//! `airlock_agent::mcp::http_router` on a listener of this test, as `airlock serve`
//! mounts it: the authentication passed in decides, before MCP sees a request.

mod common;

use airlock_agent::call::HostPlanner;
use airlock_agent::mcp::{http_router, McpState};
use airlock_agent::{Registry, ToolBox, ToolsConfig};
use airlock_cell::report::ResultClass;
use airlock_engine::caller::Refused;
use airlock_engine::Caller;
use std::path::Path;
use std::sync::Arc;

fn state(state_dir: &Path) -> Arc<McpState> {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/agent");
    let text = std::fs::read_to_string(fixtures.join("airlock.toml")).unwrap();
    let table: toml::Table = toml::from_str(&text).unwrap();
    let tools: ToolsConfig = table["tools"].clone().try_into().unwrap();
    let registry = Registry::load(&tools, &fixtures).unwrap();
    let mut config = airlock_engine::EngineConfig::new(state_dir.to_path_buf(), Default::default());
    config.program = common::airlock_bin();
    let engine = Arc::new(airlock_engine::Engine::new(config));
    McpState::new(Arc::new(ToolBox::new(
        registry,
        engine,
        Arc::new(HostPlanner),
    )))
    .unwrap()
}

const INITIALIZE: &str = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"router-test","version":"1"}}}"#;

#[test]
fn only_requests_with_an_accepted_bearer_key_reach_mcp() {
    let dir = tempfile::tempdir().unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let accepted = ["tenant-a-key-0123456789", "tenant-b-key-9876543210"];
    let authenticate: airlock_agent::mcp::Authenticate = Arc::new(move |parts| {
        let offered = parts
            .headers
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        match offered {
            Some(key) if accepted.contains(&key) => Ok(Caller::unbounded(key.to_string())),
            _ => Err(Refused {
                class: ResultClass::PolicyDenied,
                reason: "auth.bad_key".into(),
                message: "not a key of this test".into(),
            }),
        }
    });
    let router = axum::Router::new().nest_service(
        "/mcp",
        http_router(state(dir.path()), authenticate, Vec::new()),
    );
    let address = runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, router).await });
        address
    });
    let url = format!("http://{address}/mcp");
    let client = reqwest::blocking::Client::new();
    let post = |key: Option<&str>| {
        let mut request = client
            .post(&url)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .body(INITIALIZE);
        if let Some(key) = key {
            request = request.bearer_auth(key);
        }
        let response = request.send().unwrap();
        (
            response.status().as_u16(),
            response.text().unwrap_or_default(),
        )
    };
    assert_eq!(post(None).0, 401);
    assert_eq!(post(Some("tenant-c-key-0000000000")).0, 401);
    for key in accepted {
        let (status, body) = post(Some(key));
        assert_eq!(status, 200, "{body}");
        assert!(body.contains("\"airlock\""), "the server's info: {body}");
    }
}
