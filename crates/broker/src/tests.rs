//! The broker's decisions and handlers, named for what they guarantee.

use crate::config::{BrokerConfig, HandlerConfig};
use crate::decide::{authorize, canonical_json, identify, is_plain_name, Reason, RunGrant};
use crate::handler::{self, Prepared};
use crate::server::{BrokerServer, Decision};
use crate::Broker;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::sync::Arc;

fn config(storage: &Path, extra: &str) -> BrokerConfig {
    let text = format!(
        r#"
[actions.store_case_document]
description = "store a generated document for a case"
classes = ["casework"]
max_request_bytes = 4096
{extra}
[actions.store_case_document.schema]
type = "object"
required = ["case_id", "file_name", "content"]
additionalProperties = false
[actions.store_case_document.schema.properties.case_id]
type = "string"
pattern = "^[0-9]{{1,10}}$"
[actions.store_case_document.schema.properties.file_name]
type = "string"
[actions.store_case_document.schema.properties.content]
type = "string"
[actions.store_case_document.handler]
kind = "store_artifact"
directory = "{}"
name_field = "file_name"
group_field = "case_id"
max_bytes = 64
"#,
        storage.display()
    );
    toml::from_str(&text).unwrap()
}

fn broker(storage: &Path) -> Broker {
    Broker::new(&config(storage, "")).unwrap()
}

fn class_grant(class: &str) -> RunGrant {
    RunGrant {
        actions: vec!["store_case_document".to_string()],
        class: Some(class.to_string()),
        tenant: None,
    }
}

fn line(action: &str, request: Value) -> Vec<u8> {
    serde_json::to_vec(&json!({"action": action, "request": request})).unwrap()
}

fn pdf_request(name: &str) -> Value {
    json!({"case_id": "4821", "file_name": name, "content": "JVBERi0xLjQK"})
}

fn reason_of(broker: &Broker, grant: &RunGrant, bytes: &[u8]) -> Reason {
    authorize(broker, grant, bytes).unwrap_err().reason
}

#[test]
fn a_request_of_the_right_class_matching_its_schema_is_granted() {
    let dir = tempfile::tempdir().unwrap();
    let broker = broker(dir.path());
    let granted = authorize(
        &broker,
        &class_grant("casework"),
        &line("store_case_document", pdf_request("report.pdf")),
    )
    .unwrap();
    assert_eq!(granted.action.name, "store_case_document");
}

#[test]
fn an_action_the_operator_never_defined_is_unknown() {
    let dir = tempfile::tempdir().unwrap();
    let broker = broker(dir.path());
    let reason = reason_of(
        &broker,
        &class_grant("casework"),
        &line("drop_tables", json!({})),
    );
    assert_eq!(reason, Reason::UnknownAction);
}

#[test]
fn an_action_the_run_did_not_name_is_refused_even_for_an_allowed_class() {
    let dir = tempfile::tempdir().unwrap();
    let broker = broker(dir.path());
    let grant = RunGrant {
        actions: vec![],
        ..class_grant("casework")
    };
    let reason = reason_of(
        &broker,
        &grant,
        &line("store_case_document", pdf_request("a.pdf")),
    );
    assert_eq!(reason, Reason::NotNamed);
}

#[test]
fn another_class_and_a_contract_run_are_not_allowed_unless_the_action_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let request = line("store_case_document", pdf_request("a.pdf"));
    let broker = broker(dir.path());
    assert_eq!(
        reason_of(&broker, &class_grant("research"), &request),
        Reason::ClassNotAllowed
    );
    let contract_run = RunGrant {
        class: None,
        ..class_grant("casework")
    };
    assert_eq!(
        reason_of(&broker, &contract_run, &request),
        Reason::ClassNotAllowed
    );
    let open = Broker::new(&config(dir.path(), "contract = true")).unwrap();
    assert!(authorize(&open, &contract_run, &request).is_ok());
}

#[test]
fn a_tenant_outside_the_actions_tenants_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let broker = Broker::new(&config(dir.path(), "tenants = [\"acme\"]")).unwrap();
    let request = line("store_case_document", pdf_request("a.pdf"));
    let mut grant = class_grant("casework");
    assert_eq!(
        reason_of(&broker, &grant, &request),
        Reason::TenantNotAllowed
    );
    grant.tenant = Some("acme".to_string());
    assert!(authorize(&broker, &grant, &request).is_ok());
}

#[test]
fn a_request_over_the_actions_cap_is_too_large_before_its_schema_is_checked() {
    let dir = tempfile::tempdir().unwrap();
    let broker = broker(dir.path());
    let big = json!({"case_id": "x", "file_name": "a", "content": "A".repeat(5000)});
    let reason = reason_of(
        &broker,
        &class_grant("casework"),
        &line("store_case_document", big),
    );
    assert_eq!(reason, Reason::TooLarge);
}

#[test]
fn a_request_breaking_its_schema_is_refused_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let broker = broker(dir.path());
    let bad = json!({"case_id": "48-21", "file_name": "a.pdf", "content": ""});
    let denial = authorize(
        &broker,
        &class_grant("casework"),
        &line("store_case_document", bad),
    )
    .unwrap_err();
    assert_eq!(denial.reason, Reason::SchemaInvalid);
    assert!(denial.message.contains("/case_id"), "{}", denial.message);
}

#[test]
fn a_line_that_is_not_an_envelope_is_malformed() {
    let dir = tempfile::tempdir().unwrap();
    let broker = broker(dir.path());
    for bad in [
        &b"not json"[..],
        br#"{"action": "x"}"#,
        br#"{"action":"x","request":{},"extra":1}"#,
    ] {
        assert_eq!(
            reason_of(&broker, &class_grant("casework"), bad),
            Reason::Malformed
        );
    }
}

#[test]
fn plain_names_have_no_separator_no_parent_and_a_bounded_length() {
    for good in ["report.pdf", "4821", "a_b-c.tar.gz"] {
        assert!(is_plain_name(good), "{good}");
    }
    let long = "a".repeat(129);
    for bad in [
        "", "../x", "a/b", "..", "a..b", ".hidden", "-rf", "a\\b", "a\0", "é", &long,
    ] {
        assert!(!is_plain_name(bad), "{bad:?}");
    }
}

#[test]
fn a_file_name_with_a_parent_is_refused_by_the_store_handler() {
    let dir = tempfile::tempdir().unwrap();
    let broker = broker(dir.path());
    let action = broker.action("store_case_document").unwrap();
    let denial = handler::prepare(&action.config.handler, &pdf_request("../escape.pdf"))
        .err()
        .unwrap();
    assert_eq!(denial.reason, Reason::NameInvalid);
}

#[test]
fn content_over_the_handlers_cap_is_too_large() {
    let dir = tempfile::tempdir().unwrap();
    let broker = broker(dir.path());
    let action = broker.action("store_case_document").unwrap();
    let mut request = pdf_request("a.pdf");
    request["content"] = json!("QUFB".repeat(30));
    let denial = handler::prepare(&action.config.handler, &request)
        .err()
        .unwrap();
    assert_eq!(denial.reason, Reason::TooLarge);
}

#[test]
fn a_stored_file_lands_in_its_group_and_is_never_replaced_unless_configured() {
    let dir = tempfile::tempdir().unwrap();
    let broker = broker(dir.path());
    let handler = &broker.action("store_case_document").unwrap().config.handler;
    let store = || {
        let prepared = handler::prepare(handler, &pdf_request("report.pdf")).unwrap();
        handler::execute(handler, prepared)
    };
    let first = store();
    assert_eq!(first.result.unwrap()["stored"], "4821/report.pdf");
    assert_eq!(first.outcome.bytes, 9);
    let written = std::fs::read(dir.path().join("4821/report.pdf")).unwrap();
    assert_eq!(written, b"%PDF-1.4\n");
    let second = store();
    assert_eq!(second.result.unwrap_err().reason, Reason::Exists);
    assert_eq!(second.outcome.error.as_deref(), Some("broker.exists"));
    let leftovers: Vec<_> = std::fs::read_dir(dir.path().join("4821"))
        .unwrap()
        .collect();
    assert_eq!(leftovers.len(), 1, "no temporary file is left behind");
}

fn command_handler(script: &str, extra: &str) -> HandlerConfig {
    let text = format!("kind = \"command\"\nargv = [\"/bin/sh\", \"-c\", {script:?}]\n{extra}");
    toml::from_str(&text).unwrap()
}

#[test]
fn a_command_gets_the_canonical_request_on_stdin_and_only_its_own_environment() {
    let handler = command_handler(
        "read -r line; printf '{\"got\":%s,\"token\":\"%s\",\"home\":\"%s\"}' \"$line\" \"$STORE_TOKEN\" \"$HOME\"",
        "env = { STORE_TOKEN = \"s3cr3t\" }",
    );
    let prepared = handler::prepare(&handler, &json!({"b": 1, "a": [true]})).unwrap();
    let Prepared::Command(stdin) = &prepared else {
        panic!("a command handler");
    };
    assert_eq!(stdin, r#"{"a":[true],"b":1}"#);
    let handled = handler::execute(&handler, prepared);
    let result = handled.result.unwrap();
    assert_eq!(result["output"]["got"], json!({"a": [true], "b": 1}));
    assert_eq!(result["output"]["token"], "s3cr3t");
    assert_eq!(
        result["output"]["home"], "",
        "nothing of airlock's environment"
    );
    assert_eq!(handled.outcome.exit_code, Some(0));
}

#[test]
fn a_failing_command_is_a_handler_failure_with_its_exit_code() {
    let handler = command_handler("exit 3", "");
    let prepared = handler::prepare(&handler, &json!({})).unwrap();
    let handled = handler::execute(&handler, prepared);
    assert_eq!(handled.result.unwrap_err().reason, Reason::HandlerFailed);
    assert_eq!(handled.outcome.exit_code, Some(3));
}

#[test]
fn a_command_past_its_deadline_is_killed() {
    let handler = command_handler("sleep 30", "timeout_seconds = 1");
    let started = std::time::Instant::now();
    let prepared = handler::prepare(&handler, &json!({})).unwrap();
    let handled = handler::execute(&handler, prepared);
    assert!(started.elapsed() < std::time::Duration::from_secs(20));
    let denial = handled.result.unwrap_err();
    assert!(denial.message.contains("deadline"), "{}", denial.message);
    assert_eq!(handled.outcome.exit_code, None);
}

#[test]
fn a_commands_output_is_capped() {
    let handler = command_handler(
        "head -c 100000 /dev/zero | tr '\\0' a",
        "max_output_bytes = 10",
    );
    let prepared = handler::prepare(&handler, &json!({})).unwrap();
    let handled = handler::execute(&handler, prepared);
    assert_eq!(handled.result.unwrap()["output"], "aaaaaaaaaa");
}

#[test]
fn the_request_hash_ignores_key_order_and_whitespace() {
    let a = identify(br#"{"action":"x","request":{"b":1,"a":{"d":2,"c":3}}}"#);
    let b = identify(br#"{ "request": { "a": {"c": 3, "d": 2}, "b": 1 }, "action": "x" }"#);
    assert_eq!(a, b);
    assert_eq!(
        canonical_json(&json!({"b": [1, {"z": 0, "y": 1}], "a": "é"})),
        r#"{"a":"é","b":[1,{"y":1,"z":0}]}"#
    );
    let other = identify(br#"{"action":"x","request":{"b":2}}"#);
    assert_ne!(a.request_sha256, other.request_sha256);
}

#[test]
fn loading_refuses_remote_schemas_relative_directories_and_relative_commands() {
    let dir = tempfile::tempdir().unwrap();
    let mut remote = config(dir.path(), "");
    let action = remote.actions.get_mut("store_case_document").unwrap();
    action.schema = json!({"$ref": "https://schemas.test/doc.json"});
    assert!(Broker::new(&remote).is_err());
    let relative = config(Path::new("storage"), "");
    assert!(Broker::new(&relative).is_err());
    let mut command = config(dir.path(), "");
    command
        .actions
        .get_mut("store_case_document")
        .unwrap()
        .handler = toml::from_str("kind = \"command\"\nargv = [\"sh\"]").unwrap();
    assert!(Broker::new(&command).is_err());
}

fn ask(socket: &Path, bytes: &[u8]) -> Value {
    let mut stream = std::os::unix::net::UnixStream::connect(socket).unwrap();
    stream.write_all(bytes).unwrap();
    stream.write_all(b"\n").unwrap();
    let mut reply = String::new();
    BufReader::new(stream).read_line(&mut reply).unwrap();
    serde_json::from_str(&reply).unwrap()
}

#[test]
fn the_socket_answers_one_request_per_connection_records_each_and_is_gone_after_finish() {
    let dir = tempfile::tempdir().unwrap();
    let storage = dir.path().join("storage");
    std::fs::create_dir(&storage).unwrap();
    let broker = Arc::new(broker(&storage));
    let mut server =
        BrokerServer::bind(&dir.path().join("sockets"), broker, class_grant("casework")).unwrap();
    server.serve();
    let socket = server.socket_path().to_path_buf();
    let granted = ask(&socket, &line("store_case_document", pdf_request("r.pdf")));
    assert_eq!(granted["ok"], true, "{granted}");
    let denied = ask(&socket, &line("nope", json!({})));
    assert_eq!(denied["error"]["reason"], "broker.unknown_action");
    let records = server.finish();
    assert_eq!(records.len(), 2);
    assert_eq!(records[0].decision, Decision::Granted);
    assert_eq!(records[0].outcome.as_ref().unwrap().bytes, 9);
    assert_eq!(records[1].reason.as_deref(), Some("broker.unknown_action"));
    assert!(std::os::unix::net::UnixStream::connect(&socket).is_err());
    assert!(!socket.exists());
}

#[test]
fn the_toml_config_reads_the_schema_as_json() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), "");
    let schema = &config.actions["store_case_document"].schema;
    assert_eq!(schema["properties"]["case_id"]["pattern"], "^[0-9]{1,10}$");
}
