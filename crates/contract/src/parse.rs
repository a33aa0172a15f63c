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

pub(crate) fn parse_document(
    text: &str,
    format: ContractFormat,
) -> Result<Contract, ContractError> {
    let parse_error = |message: String| ContractError::Parse { format, message };
    // Some editors start UTF-8 files with a byte-order mark; no format treats it as
    // content, and JSON parsers reject it at "line 1 column 1".
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    // An empty file is far more likely a mistake than a request for the default contract
    // (and TOML would otherwise read it as exactly that).
    if text.trim().is_empty() {
        return Err(parse_error("the document is empty".to_owned()));
    }
    let StrictValue(document) = match format {
        ContractFormat::Yaml => {
            serde_saphyr::from_str(text).map_err(|e| parse_error(yaml_message(&e)))?
        }
        ContractFormat::Toml => {
            toml::from_str(text).map_err(|e| parse_error(toml_message(text, &e)))?
        }
        ContractFormat::Json => {
            serde_json::from_str(text).map_err(|e| parse_error(e.to_string()))?
        }
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
    serde_path_to_error::deserialize(contract)
        .map_err(|error| ContractError::Invalid(vec![shape_error(&error)]))
}

/// Maps a shape error onto a field error. serde reports an unknown field as "unknown field
/// `x`, expected one of ..."; the path already ends at `x`, so only the list is kept.
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
        if let Some((_field, expected)) = rest.split_once('`') {
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
    // The snippet rendering spans several lines; the message and its position are enough.
    let message = error.without_snippet().to_string();
    let message = message.trim().trim_start_matches("error: ").to_owned();
    match error.location() {
        Some(location) if !message.contains("line") => {
            format!(
                "{message} at line {} column {}",
                location.line(),
                location.column()
            )
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
    let column = before
        .rsplit('\n')
        .next()
        .map_or(0, |tail| tail.chars().count())
        + 1;
    (line, column)
}

/// A generic document value that, unlike `serde_json::Value`, refuses duplicate keys: a
/// contract saying `mode: deny` and later `mode: allowlist` must not quietly mean either.
struct StrictValue(Value);

impl<'de> Deserialize<'de> for StrictValue {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer
            .deserialize_any(StrictValueVisitor)
            .map(StrictValue)
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

#[cfg(test)]
pub(crate) mod tests {
    use crate::{parse_contract, ContractError, ContractFormat, NetworkMode, ReadonlyInput};

    pub(crate) const SEED_YAML: &str = include_str!("../../../examples/contracts/seed-004.yaml");

    const SEED_TOML: &str = r#"
[execution_contract]
image = "document-tools@sha256:pinned-image-digest"
credentials = []

[execution_contract.identity]
uid = 10001
gid = 10001

[execution_contract.filesystem]
readonly_root = true
readonly_inputs = ["input/report.docx"]
writable_paths = ["output/", "tmp/"]
output_allowlist = ["output/report.pdf"]

[execution_contract.network]
mode = "deny"
allowed_domains = []

[execution_contract.resources]
cpu_millis = 1000
memory_mb = 768
process_limit = 64
wall_time_seconds = 90
output_bytes = 5242880

[execution_contract.cleanup]
destroy_runtime = true
retain_outputs_only = true
"#;

    const SEED_JSON: &str = r#"{
  "execution_contract": {
    "image": "document-tools@sha256:pinned-image-digest",
    "identity": { "uid": 10001, "gid": 10001 },
    "filesystem": {
      "readonly_root": true,
      "readonly_inputs": ["input/report.docx"],
      "writable_paths": ["output/", "tmp/"],
      "output_allowlist": ["output/report.pdf"]
    },
    "network": { "mode": "deny", "allowed_domains": [] },
    "resources": {
      "cpu_millis": 1000,
      "memory_mb": 768,
      "process_limit": 64,
      "wall_time_seconds": 90,
      "output_bytes": 5242880
    },
    "credentials": [],
    "cleanup": { "destroy_runtime": true, "retain_outputs_only": true }
  }
}"#;

    fn invalid(text: &str, format: ContractFormat) -> Vec<String> {
        match parse_contract(text, format) {
            Err(ContractError::Invalid(errors)) => errors.iter().map(ToString::to_string).collect(),
            other => panic!("expected Invalid, got {other:?}"),
        }
    }

    fn parse_message(text: &str, format: ContractFormat) -> String {
        match parse_contract(text, format) {
            Err(ContractError::Parse { message, .. }) => message,
            other => panic!("expected Parse, got {other:?}"),
        }
    }

    #[test]
    fn a_byte_order_mark_is_not_part_of_the_document() {
        for (text, format) in [
            ("\u{feff}{\"hostname\": \"bom\"}", ContractFormat::Json),
            ("\u{feff}hostname: bom\n", ContractFormat::Yaml),
            ("\u{feff}hostname = \"bom\"\n", ContractFormat::Toml),
        ] {
            let contract = parse_contract(text, format).unwrap();
            assert_eq!(contract.hostname, "bom", "{format:?}");
        }
    }

    #[test]
    fn seed_contract_parses_as_written() {
        let contract = parse_contract(SEED_YAML, ContractFormat::Yaml).unwrap();
        assert_eq!(contract.image, "document-tools@sha256:pinned-image-digest");
        assert_eq!(contract.identity.uid, 10001);
        assert_eq!(
            contract.filesystem.readonly_inputs,
            [ReadonlyInput::Path("input/report.docx".into())]
        );
        assert_eq!(contract.filesystem.writable_paths.len(), 2);
        assert_eq!(contract.network.mode, NetworkMode::Deny);
        assert_eq!(contract.resources.memory_mb, 768);
        assert_eq!(contract.resources.output_bytes, 5_242_880);
        // Not in the seed: filled in from the default contract.
        assert_eq!(contract.resources.open_files, 256);
        assert_eq!(contract.hostname, "airlock");
    }

    #[test]
    fn seed_contract_reads_the_same_in_every_format() {
        let yaml = parse_contract(SEED_YAML, ContractFormat::Yaml).unwrap();
        assert_eq!(
            parse_contract(SEED_TOML, ContractFormat::Toml).unwrap(),
            yaml
        );
        assert_eq!(
            parse_contract(SEED_JSON, ContractFormat::Json).unwrap(),
            yaml
        );
    }

    #[test]
    fn bare_and_wrapped_forms_are_the_same_contract() {
        let bare: String = SEED_YAML
            .lines()
            .skip(1)
            .map(|line| format!("{}\n", line.strip_prefix("  ").unwrap()))
            .collect();
        assert_eq!(
            parse_contract(&bare, ContractFormat::Yaml).unwrap(),
            parse_contract(SEED_YAML, ContractFormat::Yaml).unwrap()
        );
    }

    #[test]
    fn unknown_top_level_field_is_named() {
        let errors = invalid("image: host\nimgae: other\n", ContractFormat::Yaml);
        assert_eq!(errors.len(), 1);
        assert!(
            errors[0].starts_with("imgae: unknown field (expected one of `image`, "),
            "{errors:?}"
        );
    }

    #[test]
    fn unknown_nested_field_is_named_with_its_path() {
        let errors = invalid("filesystem:\n  readonly_rot: true\n", ContractFormat::Yaml);
        assert!(
            errors[0].starts_with("filesystem.readonly_rot: unknown field (expected one of"),
            "{errors:?}"
        );
        let errors = invalid(
            "filesystem:\n  readonly_inputs:\n    - { source: a, target: b, mode: rw }\n",
            ContractFormat::Yaml,
        );
        assert_eq!(
            errors,
            ["filesystem.readonly_inputs[0].mode: unknown field (expected `source` or `target`)"]
        );
        let errors = invalid(
            r#"{"execution_contract": {"network": {"mode": "deny", "proxy": "x"}}}"#,
            ContractFormat::Json,
        );
        assert!(
            errors[0].starts_with("network.proxy: unknown field"),
            "{errors:?}"
        );
    }

    #[test]
    fn wrong_types_are_named_with_their_path() {
        assert_eq!(
            invalid("[resources]\nmemory_mb = \"lots\"\n", ContractFormat::Toml),
            ["resources.memory_mb: invalid type: string \"lots\", expected i64"]
        );
        assert_eq!(
            invalid("network:\n  mode: open\n", ContractFormat::Yaml),
            ["network.mode: unknown variant `open`, expected one of `deny`, `allowlist`, `pod`"]
        );
        assert_eq!(
            invalid("filesystem:\n  writable_paths: [3]\n", ContractFormat::Yaml),
            ["filesystem.writable_paths[0]: invalid type: integer `3`, expected a path or a map with `path`, `size_mb` and `exec`"]
        );
    }

    #[test]
    fn stray_keys_next_to_the_wrapper_are_rejected() {
        assert_eq!(
            invalid("execution_contract:\n  image: host\nimage: other\n", ContractFormat::Yaml),
            ["image: unknown field: a document with `execution_contract` has no other top-level keys"]
        );
    }

    #[test]
    fn duplicate_keys_are_rejected_in_every_format() {
        let yaml = parse_message(
            "network:\n  mode: deny\n  mode: allowlist\n",
            ContractFormat::Yaml,
        );
        assert!(
            yaml.contains("duplicate") && yaml.contains("line 3"),
            "{yaml}"
        );
        let toml = parse_message("hostname = \"a\"\nhostname = \"b\"\n", ContractFormat::Toml);
        assert!(
            toml.contains("duplicate") && toml.contains("line 2"),
            "{toml}"
        );
        let json = parse_message(
            r#"{"network": {"mode": "deny", "mode": "allowlist"}}"#,
            ContractFormat::Json,
        );
        assert_eq!(json, "duplicate key `mode` at line 1 column 49");
    }

    #[test]
    fn syntax_errors_carry_line_and_column() {
        assert_eq!(
            parse_message("image: host\nnetwork: [\n", ContractFormat::Yaml),
            "unclosed bracket '[' at line 2, column 10"
        );
        let toml = parse_message("image = \"host\"\nhostname = \n", ContractFormat::Toml);
        assert!(toml.ends_with("at line 2 column 12"), "{toml}");
        assert_eq!(
            parse_message("{\"image\": \"host\",\n \"x\": }", ContractFormat::Json),
            "expected value at line 2 column 7"
        );
    }

    #[test]
    fn empty_and_non_mapping_documents_are_parse_errors() {
        for format in [
            ContractFormat::Yaml,
            ContractFormat::Toml,
            ContractFormat::Json,
        ] {
            assert_eq!(parse_message(" \n", format), "the document is empty");
        }
        assert_eq!(
            parse_message("- a\n- b\n", ContractFormat::Yaml),
            "expected a mapping at the top level, found a list"
        );
    }

    #[test]
    fn an_empty_mapping_is_the_default_contract() {
        assert_eq!(
            parse_contract("{}", ContractFormat::Json).unwrap(),
            crate::default_contract()
        );
    }

    #[test]
    fn an_unknown_field_named_like_its_parent_keeps_both_names() {
        match parse_contract("network:\n  network: x\n", ContractFormat::Yaml) {
            Err(ContractError::Invalid(errors)) => {
                assert_eq!(errors[0].path, "network.network", "{errors:?}")
            }
            other => panic!("{other:?}"),
        }
    }
}
