//! The broker's decisions, without I/O: whether a request line is granted, and the
//! record's identity of a request (the sha256 of its canonical JSON).

use crate::{Action, Broker};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

/// Why a request was refused (or, after its grant, why its handler failed): the reason
/// codes of the result, the store and docs/credentials.md.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Reason {
    /// Not one JSON object `{"action": "...", "request": {...}}` on one line.
    Malformed,
    /// No `[broker.actions.NAME]` of that name.
    UnknownAction,
    /// The run's contract (or class template) does not name the action.
    NotNamed,
    /// The run's class is not among the action's `classes` (or, for a contract run, the
    /// action is not open to contracts).
    ClassNotAllowed,
    TenantNotAllowed,
    /// Over the action's `max_request_bytes`, or content over the handler's `max_bytes`.
    TooLarge,
    SchemaInvalid,
    /// A file or group name that is not a plain, bounded name.
    NameInvalid,
    /// A file of that name exists and the action does not overwrite.
    Exists,
    HandlerFailed,
    /// The request did not arrive in full before the read deadline.
    Timeout,
}

impl Reason {
    pub fn code(self) -> &'static str {
        match self {
            Reason::Malformed => "broker.malformed",
            Reason::UnknownAction => "broker.unknown_action",
            Reason::NotNamed => "broker.not_named",
            Reason::ClassNotAllowed => "broker.class_not_allowed",
            Reason::TenantNotAllowed => "broker.tenant_not_allowed",
            Reason::TooLarge => "broker.too_large",
            Reason::SchemaInvalid => "broker.schema_invalid",
            Reason::NameInvalid => "broker.name_invalid",
            Reason::Exists => "broker.exists",
            Reason::HandlerFailed => "broker.handler_failed",
            Reason::Timeout => "broker.timeout",
        }
    }
}

/// A refusal: its reason and a message for the cell (never a handler's credential).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Denial {
    pub reason: Reason,
    pub message: String,
}

impl Denial {
    pub fn new(reason: Reason, message: impl Into<String>) -> Denial {
        Denial {
            reason,
            message: message.into(),
        }
    }
}

/// What a run may ask for, fixed by the trusted side before the cell starts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunGrant {
    /// The actions the run's contract names.
    pub actions: Vec<String>,
    /// The workload class whose grant made the run's contract; `None` for a contract run.
    pub class: Option<String>,
    /// The service tenant the run belongs to; `None` for the command line.
    pub tenant: Option<String>,
}

/// The envelope of one request line.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Envelope {
    action: String,
    request: Value,
}

/// A granted request: the action and the request value its schema accepted.
#[derive(Debug)]
pub struct Granted<'a> {
    pub action: &'a Action,
    pub request: Value,
}

/// The line the cell sent, parsed as far as it goes: the action it names (if any) and
/// the hash the record carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub action: String,
    pub request_sha256: String,
}

/// The record's identity of `line`: the named action (bounded) and the sha256 of the
/// canonical JSON of its `request` (keys sorted, no whitespace), or of the raw bytes
/// when the line is not an envelope.
pub fn identify(line: &[u8]) -> Identity {
    match serde_json::from_slice::<Envelope>(line) {
        Ok(envelope) => Identity {
            action: crate::schema::bounded(&envelope.action, 128),
            request_sha256: sha256_hex(canonical_json(&envelope.request).as_bytes()),
        },
        Err(_) => Identity {
            action: String::new(),
            request_sha256: sha256_hex(line),
        },
    }
}

/// Whether `line` is granted for a run of `grant`, every check in order: the envelope,
/// the action's existence, the run naming it, its class and tenant, the action's size
/// cap and its schema. The handler's own checks (a file name) follow in handler.rs.
pub fn authorize<'a>(
    broker: &'a Broker,
    grant: &RunGrant,
    line: &[u8],
) -> Result<Granted<'a>, Denial> {
    let envelope: Envelope = serde_json::from_slice(line).map_err(|err| {
        Denial::new(
            Reason::Malformed,
            format!(
                "a request is one line of JSON {{\"action\": \"...\", \"request\": {{...}}}}: {err}"
            ),
        )
    })?;
    let action = broker.action(&envelope.action).ok_or_else(|| {
        Denial::new(
            Reason::UnknownAction,
            format!(
                "no broker action {:?}",
                crate::schema::bounded(&envelope.action, 64)
            ),
        )
    })?;
    check_named(action, grant)?;
    check_class(action, grant)?;
    check_tenant(action, grant)?;
    check_size(action.config.max_request_bytes, line.len() as u64)?;
    action
        .schema
        .check(&envelope.request)
        .map_err(|violation| Denial::new(Reason::SchemaInvalid, schema_message(&violation)))?;
    Ok(Granted {
        action,
        request: envelope.request,
    })
}

/// A violation as the cell reads it: where in its request, and the rule broken.
fn schema_message(violation: &airlock_schema::Violation) -> String {
    match violation.pointer.is_empty() {
        true => format!("the request: {}", violation.rule),
        false => violation.to_string(),
    }
}

fn check_named(action: &Action, grant: &RunGrant) -> Result<(), Denial> {
    if grant.actions.contains(&action.name) {
        Ok(())
    } else {
        Err(Denial::new(
            Reason::NotNamed,
            format!(
                "this run's contract does not name the action {:?}",
                action.name
            ),
        ))
    }
}

/// A class run needs its class in the action's `classes`; a contract run needs the
/// action open to contracts.
fn check_class(action: &Action, grant: &RunGrant) -> Result<(), Denial> {
    let allowed = match &grant.class {
        Some(class) => action.config.classes.iter().any(|c| c == class),
        None => action.config.contract,
    };
    if allowed {
        return Ok(());
    }
    let who = match &grant.class {
        Some(class) => format!("the class {class:?}"),
        None => "a run from a contract (no class)".to_string(),
    };
    Err(Denial::new(
        Reason::ClassNotAllowed,
        format!("the action {:?} is not allowed for {who}", action.name),
    ))
}

fn check_tenant(action: &Action, grant: &RunGrant) -> Result<(), Denial> {
    let tenants = &action.config.tenants;
    let allowed = tenants.is_empty()
        || grant
            .tenant
            .as_ref()
            .is_some_and(|t| tenants.iter().any(|allowed| allowed == t));
    if allowed {
        Ok(())
    } else {
        Err(Denial::new(
            Reason::TenantNotAllowed,
            format!(
                "the action {:?} is not allowed for this tenant",
                action.name
            ),
        ))
    }
}

pub fn check_size(max: u64, size: u64) -> Result<(), Denial> {
    if size <= max {
        Ok(())
    } else {
        Err(Denial::new(
            Reason::TooLarge,
            format!("the request is {size} bytes; the most is {max}"),
        ))
    }
}

/// A file or group name a handler may write: 1 to 128 characters of letters, digits,
/// `.`, `_` and `-`, starting with a letter or digit, without `..`. No separator, no
/// parent, no hidden file, no control character, whatever the file system.
pub fn is_plain_name(name: &str) -> bool {
    let mut chars = name.chars();
    let starts_well = chars.next().is_some_and(|c| c.is_ascii_alphanumeric());
    starts_well
        && name.len() <= 128
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
        && !name.contains("..")
}

/// JSON with object keys sorted at every level and no whitespace: one text per value,
/// whatever order the cell wrote its keys in.
pub fn canonical_json(value: &Value) -> String {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            let fields: Vec<String> = keys
                .into_iter()
                .map(|key| {
                    let name = Value::String(key.clone()).to_string();
                    format!("{name}:{}", canonical_json(&map[key]))
                })
                .collect();
            format!("{{{}}}", fields.join(","))
        }
        Value::Array(items) => {
            let items: Vec<String> = items.iter().map(canonical_json).collect();
            format!("[{}]", items.join(","))
        }
        scalar => scalar.to_string(),
    }
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}
