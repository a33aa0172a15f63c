//! Text -> [`Contract`]. Parsing happens in two steps: the format's own parser builds a
//! generic value (so syntax errors keep their line and column), then the value is mapped onto
//! the typed contract with the path of the first field that does not fit
//! (`filesystem.readonly_inputs[0].target`), which a line number in a converted TOML or JSON
//! document would not give.

use crate::contract::Contract;
use crate::error::{ContractError, ContractFormat, FieldError};
use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};
use std::fmt;

const WRAPPER_KEY: &str = "execution_contract";

pub(crate) fn parse_document(text: &str, format: ContractFormat) -> Result<Contract, ContractError> {
    let parse_error = |message: String| ContractError::Parse { format, message };
    let StrictValue(document) = match format {
        ContractFormat::Yaml => serde_saphyr::from_str(text).map_err(|e| parse_error(yaml_message(&e)))?,
        ContractFormat::Toml => toml::from_str(text).map_err(|e| parse_error(toml_message(text, &e)))?,
        ContractFormat::Json => serde_json::from_str(text).map_err(|e| parse_error(e.to_string()))?,
    };
    let mut top_level = match document {
        Value::Object(map) => map,
        Value::Null => return Err(parse_error("the document is empty".to_owned())),
        other => {
            return Err(parse_error(format!(
                "expected a mapping at the top level, found {}",
                kind_of(&other)
            )))
        }
    };
    let contract = match top_level.remove(WRAPPER_KEY) {
        Some(inner) => {
            let strays: Vec<FieldError> = top_level
                .keys()
                .map(|key| {
                    FieldError::new(
                        key.clone(),
                        format!("unknown field: a document with `{WRAPPER_KEY}` has no other top-level keys"),
                    )
                })
                .collect();
            if !strays.is_empty() {
                return Err(ContractError::Invalid(strays));
            }
            inner
        }
        None => Value::Object(top_level),
    };
    serde_path_to_error::deserialize(contract).map_err(|error| ContractError::Invalid(vec![shape_error(&error)]))
}

/// Turns serde's "unknown field `x`, expected one of ..." (reported at the enclosing map) into
/// an error addressed at the unknown field itself.
fn shape_error(error: &serde_path_to_error::Error<serde_json::Error>) -> FieldError {
    let mut path = String::new();
    for segment in error.path().iter() {
        match segment {
            serde_path_to_error::Segment::Seq { index } => path.push_str(&format!("[{index}]")),
            serde_path_to_error::Segment::Map { key } => push_key(&mut path, key),
            serde_path_to_error::Segment::Enum { variant } => push_key(&mut path, variant),
            serde_path_to_error::Segment::Unknown => push_key(&mut path, "?"),
        }
    }
    let message = error.inner().to_string();
    if let Some(rest) = message.strip_prefix("unknown field `") {
        if let Some((field, expected)) = rest.split_once('`') {
            if !path.ends_with(field) {
                push_key(&mut path, field);
            }
            let expected = expected.trim_start_matches(',').trim();
            return FieldError::new(path, format!("unknown field ({expected})"));
        }
    }
    if path.is_empty() {
        path.push_str("contract");
    }
    FieldError::new(path, message)
}

fn push_key(path: &mut String, key: &str) {
    if !path.is_empty() {
        path.push('.');
    }
    path.push_str(key);
}

fn kind_of(value: &Value) -> &'static str {
    match value {
        Value::Null => "nothing",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "a mapping",
    }
}

fn yaml_message(error: &serde_saphyr::Error) -> String {
    let message = error.to_string();
    match error.location() {
        Some(location) if !message.contains("line") => {
            format!("{message} at line {} column {}", location.line(), location.column())
        }
        _ => message,
    }
}

fn toml_message(text: &str, error: &toml::de::Error) -> String {
    let message = error.message().trim_end().to_owned();
    match error.span() {
        Some(span) => {
            let (line, column) = line_and_column(text, span.start);
            format!("{message} at line {line} column {column}")
        }
        None => message,
    }
}

fn line_and_column(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |tail| tail.chars().count()) + 1;
    (line, column)
}

/// A generic document value that, unlike `serde_json::Value`, refuses duplicate keys: a
/// contract saying `mode: deny` and later `mode: allowlist` must not quietly mean either.
struct StrictValue(Value);

impl<'de> Deserialize<'de> for StrictValue {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(StrictValueVisitor).map(StrictValue)
    }
}

struct StrictValueVisitor;

impl<'de> Visitor<'de> for StrictValueVisitor {
    type Value = Value;

    fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
        formatter.write_str("a contract value")
    }

    fn visit_bool<E: de::Error>(self, value: bool) -> Result<Value, E> {
        Ok(Value::Bool(value))
    }

    fn visit_i64<E: de::Error>(self, value: i64) -> Result<Value, E> {
        Ok(Value::from(value))
    }

    fn visit_u64<E: de::Error>(self, value: u64) -> Result<Value, E> {
        Ok(Value::from(value))
    }

    fn visit_f64<E: de::Error>(self, value: f64) -> Result<Value, E> {
        serde_json::Number::from_f64(value)
            .map(Value::Number)
            .ok_or_else(|| E::custom("numbers must be finite"))
    }

    fn visit_str<E: de::Error>(self, value: &str) -> Result<Value, E> {
        Ok(Value::String(value.to_owned()))
    }

    fn visit_string<E: de::Error>(self, value: String) -> Result<Value, E> {
        Ok(Value::String(value))
    }

    fn visit_unit<E: de::Error>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_none<E: de::Error>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        StrictValue::deserialize(deserializer).map(|StrictValue(value)| value)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        while let Some(StrictValue(item)) = seq.next_element()? {
            items.push(item);
        }
        Ok(Value::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut entries = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            let StrictValue(value) = map.next_value()?;
            if entries.contains_key(&key) {
                return Err(de::Error::custom(format!("duplicate key `{key}`")));
            }
            entries.insert(key, value);
        }
        Ok(Value::Object(entries))
    }
}
