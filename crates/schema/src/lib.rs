//! airlock-schema: JSON Schemas from the operator (tool schemas, broker request schemas),
//! compiled once at load, never fetching anything. A `$ref` that is not local to the
//! schema (`#...`), or a remote base `$id`, is refused before compiling, naming where it
//! is; the validator is also built offline, so a reference the walk missed cannot be
//! fetched either (docs/tools.md, "Schemas").

use serde_json::Value;

/// A compiled schema and its text (offered to MCP clients and models as it is).
pub struct Schema {
    source: Value,
    validator: jsonschema::Validator,
}

impl std::fmt::Debug for Schema {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Schema")
            .field("source", &self.source)
            .finish()
    }
}

/// Why a value does not match its schema: where (a JSON pointer into the value) and the
/// first rule it breaks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    pub pointer: String,
    pub rule: String,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let at = if self.pointer.is_empty() {
            "the value"
        } else {
            &self.pointer
        };
        write!(f, "{at}: {}", self.rule)
    }
}

/// The most of a rule's text handed on: a rule quotes the instance, which may be large.
const RULE_CHARS: usize = 200;

impl Schema {
    /// Compiles `source`, refusing remote references and anything but an object schema.
    pub fn compile(source: Value) -> Result<Schema, String> {
        if !source.is_object() {
            return Err("a schema must be a JSON object".to_string());
        }
        if let Some(at) = first_remote_ref(&source, "") {
            return Err(format!(
                "the $ref at {at} is not local to the schema (only \"#...\" references are \
                 allowed; remote schemas are never fetched)"
            ));
        }
        let validator = jsonschema::options()
            .offline()
            .build(&source)
            .map_err(|err| bounded(&err.to_string(), RULE_CHARS))?;
        Ok(Schema { source, validator })
    }

    pub fn source(&self) -> &Value {
        &self.source
    }

    /// The first violation of `value`, if any.
    pub fn check(&self, value: &Value) -> Result<(), Violation> {
        match self.validator.iter_errors(value).next() {
            None => Ok(()),
            Some(err) => Err(Violation {
                pointer: err.instance_path().to_string(),
                rule: bounded(&err.to_string(), RULE_CHARS),
            }),
        }
    }
}

/// Where the first `$ref` not starting with `#` is, as a JSON pointer into the schema.
pub fn first_remote_ref(value: &Value, at: &str) -> Option<String> {
    match value {
        Value::Object(map) => {
            for (key, child) in map {
                let here = format!("{at}/{}", key.replace('~', "~0").replace('/', "~1"));
                let is_ref = key == "$ref" || key == "$dynamicRef" || key == "$recursiveRef";
                if is_ref && child.as_str().is_some_and(|r| !r.starts_with('#')) {
                    return Some(here);
                }
                if key == "$id" && child.as_str().is_some_and(|id| id.contains("://")) {
                    // A base URI would make later relative references resolve remotely.
                    return Some(here);
                }
                if let Some(found) = first_remote_ref(child, &here) {
                    return Some(found);
                }
            }
            None
        }
        Value::Array(items) => items
            .iter()
            .enumerate()
            .find_map(|(i, item)| first_remote_ref(item, &format!("{at}/{i}"))),
        _ => None,
    }
}

/// `text` cut to at most `max` characters, on a character boundary, marked when cut.
pub fn bounded(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        None => text.to_string(),
        Some((cut, _)) => format!("{}...", &text[..cut]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_remote_ref_is_refused_naming_where_it_is() {
        let schema =
            json!({"type": "object", "properties": {"q": {"$ref": "http://127.0.0.1:1/s.json"}}});
        let err = Schema::compile(schema).unwrap_err();
        assert!(err.contains("/properties/q/$ref"), "{err}");
    }

    #[test]
    fn a_local_ref_compiles_and_validates() {
        let schema = json!({
            "type": "object",
            "$defs": {"n": {"type": "integer"}},
            "properties": {"n": {"$ref": "#/$defs/n"}},
            "required": ["n"]
        });
        let schema = Schema::compile(schema).unwrap();
        assert!(schema.check(&json!({"n": 3})).is_ok());
        let violation = schema.check(&json!({"n": "x"})).unwrap_err();
        assert_eq!(violation.pointer, "/n");
    }

    #[test]
    fn an_absolute_id_is_refused() {
        let schema = json!({"$id": "https://schemas.test/x", "type": "object"});
        assert!(Schema::compile(schema).is_err());
    }

    #[test]
    fn a_missing_required_field_is_named() {
        let schema = Schema::compile(json!({"type": "object", "required": ["query"]})).unwrap();
        let violation = schema.check(&json!({})).unwrap_err();
        assert!(violation.rule.contains("query"), "{violation}");
    }

    #[test]
    fn bounded_cuts_on_a_character_boundary() {
        assert_eq!(bounded("ééé", 2), "éé...");
        assert_eq!(bounded("ab", 2), "ab");
    }

    #[test]
    fn a_violation_names_the_field_that_breaks_the_rule() {
        let schema = json!({
            "type": "object",
            "properties": {"case_id": {"type": "string", "pattern": "^[0-9]+$"}}
        });
        let schema = Schema::compile(schema).unwrap();
        assert!(schema.check(&json!({"case_id": "4821"})).is_ok());
        let violation = schema.check(&json!({"case_id": "48/21"})).unwrap_err();
        assert_eq!(violation.pointer, "/case_id");
        assert!(
            violation.to_string().starts_with("/case_id: "),
            "{violation}"
        );
    }
}
