//! airlock-broker: structured requests a cell hands the trusted side (docs/credentials.md,
//! "The broker"). The operator configures actions (`[broker.actions.NAME]`): a request
//! schema, who may ask, and a handler the trusted side runs with its own credential. A
//! run whose contract names actions gets a unix socket mounted in its cell; each request
//! on it is authorized ([`decide::authorize`]), executed outside the cell
//! ([`handler`]) and recorded ([`server::ActionRecord`]).

pub mod config;
pub mod decide;
mod error;
pub mod handler;
mod schema;
pub mod server;

pub use config::BrokerConfig;
pub use decide::{Reason, RunGrant};
pub use error::BrokerError;
pub use server::{ActionRecord, BrokerServer, Decision};

use config::{ActionConfig, HandlerConfig};
use std::collections::BTreeMap;

/// The operator's actions, checked and with their schemas compiled.
#[derive(Debug, Default)]
pub struct Broker {
    actions: BTreeMap<String, Action>,
}

#[derive(Debug)]
pub struct Action {
    pub name: String,
    pub config: ActionConfig,
    schema: schema::Schema,
}

/// The longest a handler command may be given.
const MAX_TIMEOUT_SECONDS: u64 = 3600;
/// The most of a command's output handed back to a cell.
const MAX_OUTPUT_BYTES: u64 = 16 << 20;

impl Broker {
    /// Checks every action and compiles its schema: an action that cannot be served as
    /// written is an error when the configuration loads, not when a cell asks.
    pub fn new(config: &BrokerConfig) -> Result<Broker, BrokerError> {
        let mut actions = BTreeMap::new();
        for (name, action) in &config.actions {
            let invalid = |why: String| BrokerError::Action {
                action: name.clone(),
                why,
            };
            if !decide::is_plain_name(name) {
                return Err(invalid(
                    "an action's name is letters, digits, `.`, `_` and `-`".to_string(),
                ));
            }
            check_action(action).map_err(invalid)?;
            let schema = schema::Schema::compile(action.schema.clone())
                .map_err(|why| invalid(format!("schema: {why}")))?;
            actions.insert(
                name.clone(),
                Action {
                    name: name.clone(),
                    config: action.clone(),
                    schema,
                },
            );
        }
        Ok(Broker { actions })
    }

    pub fn action(&self, name: &str) -> Option<&Action> {
        self.actions.get(name)
    }

    pub fn is_empty(&self) -> bool {
        self.actions.is_empty()
    }

    /// The names a contract may not name because no action has them.
    pub fn undefined<'a>(&self, names: &'a [String]) -> Vec<&'a str> {
        names
            .iter()
            .filter(|n| !self.actions.contains_key(*n))
            .map(String::as_str)
            .collect()
    }
}

/// The bounds and shapes of one action's configuration.
fn check_action(action: &ActionConfig) -> Result<(), String> {
    if action.max_request_bytes == 0 || action.max_request_bytes > server::MAX_LINE_BYTES {
        return Err(format!(
            "max_request_bytes must be 1 to {}",
            server::MAX_LINE_BYTES
        ));
    }
    match &action.handler {
        HandlerConfig::StoreArtifact(store) => {
            if !store.directory.is_absolute() {
                return Err("handler.directory must be an absolute path".to_string());
            }
            let fields = [Some(&store.name_field), store.group_field.as_ref()];
            if fields.iter().flatten().any(|f| f.is_empty()) || store.content_field.is_empty() {
                return Err("handler fields must be non-empty".to_string());
            }
            if store.max_bytes == 0 {
                return Err("handler.max_bytes must be at least 1".to_string());
            }
        }
        HandlerConfig::Command(command) => {
            if !command.argv.first().is_some_and(|a| a.starts_with('/')) {
                return Err("handler.argv[0] must be an absolute path".to_string());
            }
            if !(1..=MAX_TIMEOUT_SECONDS).contains(&command.timeout_seconds) {
                return Err(format!(
                    "handler.timeout_seconds must be 1 to {MAX_TIMEOUT_SECONDS}"
                ));
            }
            if command.max_output_bytes > MAX_OUTPUT_BYTES {
                return Err(format!(
                    "handler.max_output_bytes must be at most {MAX_OUTPUT_BYTES}"
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
