//! Request schemas: compiled once when the configuration loads, never fetching anything.
//! A `$ref` not local to the schema is refused before compiling, and the validator is
//! built offline, as for tool schemas (crates/agent/src/schema.rs).

use serde_json::Value;

pub struct Schema {
    validator: jsonschema::Validator,
}

impl std::fmt::Debug for Schema {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Schema")
    }
}

/// The most of a violation's text handed back: a rule quotes the instance, which may be
/// large.
const RULE_CHARS: usize = 200;

impl Schema {
    pub fn compile(source: &Value) -> Result<Schema, String> {
        if !source.is_object() {
            return Err("a schema must be a JSON object".to_string());
        }
        if let Some(at) = first_remote_ref(source, "") {
            return Err(format!(
                "the $ref at {at} is not local to the schema (only \"#...\" references are \
                 allowed; remote schemas are never fetched)"
            ));
        }
        let validator = jsonschema::options()
            .offline()
            .build(source)
            .map_err(|err| bounded(&err.to_string(), RULE_CHARS))?;
        Ok(Schema { validator })
    }

    /// The first violation of `value`: where (a JSON pointer) and the rule it breaks.
    pub fn check(&self, value: &Value) -> Result<(), String> {
        match self.validator.iter_errors(value).next() {
            None => Ok(()),
            Some(err) => {
                let at = err.instance_path().to_string();
                let at = if at.is_empty() { "the request" } else { &at };
                Err(format!("{at}: {}", bounded(&err.to_string(), RULE_CHARS)))
            }
        }
    }
}

/// Where the first `$ref` not starting with `#` (or a remote `$id`) is.
fn first_remote_ref(value: &Value, at: &str) -> Option<String> {
    match value {
        Value::Object(map) => map.iter().find_map(|(key, child)| {
            let here = format!("{at}/{}", key.replace('~', "~0").replace('/', "~1"));
            let is_ref = matches!(key.as_str(), "$ref" | "$dynamicRef" | "$recursiveRef");
            let remote_ref = is_ref && child.as_str().is_some_and(|r| !r.starts_with('#'));
            // A base URI would make later relative references resolve remotely.
            let remote_id = key == "$id" && child.as_str().is_some_and(|id| id.contains("://"));
            if remote_ref || remote_id {
                Some(here)
            } else {
                first_remote_ref(child, &here)
            }
        }),
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
        let schema = json!({"properties": {"q": {"$ref": "http://schemas.test/s.json"}}});
        let err = Schema::compile(&schema).unwrap_err();
        assert!(err.contains("/properties/q/$ref"), "{err}");
    }

    #[test]
    fn a_remote_base_id_is_refused() {
        let schema = json!({"$id": "https://schemas.test/x", "type": "object"});
        assert!(Schema::compile(&schema).is_err());
    }

    #[test]
    fn a_violation_names_the_field_that_breaks_the_rule() {
        let schema = json!({
            "type": "object",
            "properties": {"case_id": {"type": "string", "pattern": "^[0-9]+$"}}
        });
        let schema = Schema::compile(&schema).unwrap();
        assert!(schema.check(&json!({"case_id": "4821"})).is_ok());
        let err = schema.check(&json!({"case_id": "48/21"})).unwrap_err();
        assert!(err.starts_with("/case_id: "), "{err}");
    }
}
