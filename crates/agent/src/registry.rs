//! The operator's tool registry: `[tools.NAME]` tables of the operator configuration and,
//! with `[tools] dir`, one file per tool (`NAME.toml` or `NAME.json`). Trusted input: it
//! names the contract every call runs under. Loaded once; every schema is compiled here,
//! so a schema with a remote reference refuses the whole registry (docs/tools.md).

use crate::schema::Schema;
use crate::AgentError;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The default cap on a tool's stdout (one JSON value): 1 MiB.
pub const DEFAULT_MAX_OUTPUT_BYTES: u64 = 1 << 20;
/// Names under `[tools]` that are settings, not tools.
pub const RESERVED_NAMES: &[&str] = &["dir", "max_output_bytes", "generic_contract", "agent"];

/// `[tools]` of the operator configuration.
#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(default)]
pub struct ToolsConfig {
    /// A directory of one file per tool: `NAME.toml` or `NAME.json`, each with the fields
    /// of a `[tools.NAME]` table. Relative to the configuration file.
    pub dir: Option<PathBuf>,
    /// Cap on a tool's stdout, bytes; over it the call is `truncated` (never partial JSON).
    pub max_output_bytes: u64,
    /// The contract the generic MCP tools (run a command, run Python, sessions) run under;
    /// unset: the default contract (no network, read-only root, 16 MiB /tmp).
    pub generic_contract: Option<PathBuf>,
    /// The agent loop (`airlock agent`).
    pub agent: AgentSettings,
    /// The tools, by name (`[tools.NAME]`).
    #[serde(flatten)]
    pub entries: BTreeMap<String, ToolSpec>,
}

impl Default for ToolsConfig {
    fn default() -> Self {
        ToolsConfig {
            dir: None,
            max_output_bytes: DEFAULT_MAX_OUTPUT_BYTES,
            generic_contract: None,
            agent: AgentSettings::default(),
            entries: BTreeMap::new(),
        }
    }
}

/// `[tools.agent]`: the model endpoint of `airlock agent`. The API key never enters a
/// cell, a record or an error message.
#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct AgentSettings {
    /// The Chat Completions endpoint's base URL (`.../v1`); `--base-url` overrides it.
    pub base_url: Option<String>,
    /// The environment variable holding the API key.
    pub api_key_env: String,
    /// A file holding the API key, read when the variable is unset.
    pub api_key_file: Option<PathBuf>,
    /// Most model turns of one task; `--max-turns` overrides it.
    pub max_turns: u32,
    /// Seconds one task may take, model and tools together; `--deadline` overrides it.
    pub deadline_seconds: u64,
}

impl Default for AgentSettings {
    fn default() -> Self {
        AgentSettings {
            base_url: None,
            api_key_env: "OPENAI_API_KEY".to_string(),
            api_key_file: None,
            max_turns: 16,
            deadline_seconds: 600,
        }
    }
}

/// One tool as the operator writes it.
#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ToolSpec {
    /// What the tool does, for the model.
    pub description: String,
    /// JSON Schema of the tool's input (an object schema; only local `#...` references).
    pub input_schema: serde_json::Value,
    /// JSON Schema of the one JSON value the tool prints on stdout.
    pub output_schema: serde_json::Value,
    /// The contract the tool runs under, relative to the file that names it.
    pub contract: PathBuf,
    /// Reserved for workload classes (the policy layer); a tool naming one is refused
    /// until classes exist in this build.
    #[serde(default)]
    pub class: Option<String>,
    /// The command; unset, the contract's OCI image's Entrypoint and Cmd run.
    #[serde(default)]
    pub command: Option<Vec<String>>,
    /// This tool's stdout cap, at most `[tools] max_output_bytes`.
    #[serde(default)]
    pub max_output_bytes: Option<u64>,
}

/// A loaded tool: schemas compiled, paths absolute.
#[derive(Debug)]
pub struct Tool {
    pub name: String,
    pub description: String,
    pub input: Schema,
    pub output: Schema,
    pub contract: PathBuf,
    /// Empty: the image's entrypoint.
    pub command: Vec<String>,
    pub max_output_bytes: u64,
}

/// Every tool of the operator's configuration, by name.
#[derive(Debug, Default)]
pub struct Registry {
    pub tools: BTreeMap<String, Tool>,
    pub generic_contract: Option<PathBuf>,
    pub max_output_bytes: u64,
    pub agent: AgentSettings,
}

impl Registry {
    /// Loads `config` (its relative paths against `base_dir`, the configuration file's
    /// directory) and the tool files of its `dir`.
    pub fn load(config: &ToolsConfig, base_dir: &Path) -> Result<Registry, AgentError> {
        let mut registry = Registry {
            tools: BTreeMap::new(),
            generic_contract: config.generic_contract.as_ref().map(|p| base_dir.join(p)),
            max_output_bytes: config.max_output_bytes,
            agent: config.agent.clone(),
        };
        for (name, spec) in &config.entries {
            registry.add(name, spec, base_dir)?;
        }
        if let Some(dir) = &config.dir {
            for (name, spec, file_dir) in read_tool_dir(&base_dir.join(dir))? {
                registry.add(&name, &spec, &file_dir)?;
            }
        }
        Ok(registry)
    }

    fn add(&mut self, name: &str, spec: &ToolSpec, base_dir: &Path) -> Result<(), AgentError> {
        let tool = load_tool(name, spec, base_dir, self.max_output_bytes)?;
        if self.tools.insert(name.to_string(), tool).is_some() {
            return Err(tool_error(name, "defined twice (a table and a file)"));
        }
        Ok(())
    }

    pub fn get(&self, name: &str) -> Option<&Tool> {
        self.tools.get(name)
    }
}

fn tool_error(tool: &str, message: &str) -> AgentError {
    AgentError::Tool {
        tool: tool.to_string(),
        message: message.to_string(),
    }
}

/// Whether `name` can be a tool's name: what OpenAI function names and MCP tool names
/// both accept.
pub fn valid_tool_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        && !RESERVED_NAMES.contains(&name)
}

fn load_tool(
    name: &str,
    spec: &ToolSpec,
    base_dir: &Path,
    max_output_bytes: u64,
) -> Result<Tool, AgentError> {
    if !valid_tool_name(name) {
        return Err(tool_error(
            name,
            "a tool name is 1-64 of [A-Za-z0-9_-] and not a setting's name",
        ));
    }
    if let Some(class) = &spec.class {
        return Err(tool_error(
            name,
            &format!(
                "class {class:?}: workload classes are not available in this build; name a \
                 `contract` instead"
            ),
        ));
    }
    let schema = |field: &'static str, source: &serde_json::Value| {
        Schema::compile(source.clone()).map_err(|message| AgentError::Schema {
            tool: name.to_string(),
            field,
            message,
        })
    };
    let max = spec.max_output_bytes.unwrap_or(max_output_bytes);
    if max > max_output_bytes || max == 0 {
        return Err(tool_error(
            name,
            &format!("max_output_bytes must be 1..={max_output_bytes}"),
        ));
    }
    let command = spec.command.clone().unwrap_or_default();
    if spec.command.is_some() && command.is_empty() {
        return Err(tool_error(name, "command is empty"));
    }
    Ok(Tool {
        name: name.to_string(),
        description: spec.description.clone(),
        input: schema("input_schema", &spec.input_schema)?,
        output: schema("output_schema", &spec.output_schema)?,
        contract: base_dir.join(&spec.contract),
        command,
        max_output_bytes: max,
    })
}

/// The tool files of `dir`, sorted by name: `(name, spec, the file's directory)`.
fn read_tool_dir(dir: &Path) -> Result<Vec<(String, ToolSpec, PathBuf)>, AgentError> {
    let read_err = |source| AgentError::Read {
        path: dir.to_path_buf(),
        source,
    };
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(read_err)?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|path| matches!(extension(path), Some("toml" | "json")))
        .collect();
    files.sort();
    files
        .into_iter()
        .map(|path| {
            let text = std::fs::read_to_string(&path).map_err(|source| AgentError::Read {
                path: path.clone(),
                source,
            })?;
            let spec = parse_tool_file(&path, &text)?;
            let name = path
                .file_stem()
                .and_then(|s| s.to_str())
                .unwrap_or_default()
                .to_string();
            Ok((name, spec, dir.to_path_buf()))
        })
        .collect()
}

fn extension(path: &Path) -> Option<&str> {
    path.extension().and_then(|e| e.to_str())
}

fn parse_tool_file(path: &Path, text: &str) -> Result<ToolSpec, AgentError> {
    let parsed = match extension(path) {
        Some("json") => serde_json::from_str(text).map_err(|e| e.to_string()),
        _ => toml::from_str(text).map_err(|e| e.to_string().trim_end().to_string()),
    };
    parsed.map_err(|message| AgentError::Parse {
        path: path.to_path_buf(),
        message,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(text: &str) -> ToolsConfig {
        toml::from_str(text).unwrap()
    }

    const TOOL: &str = r#"
[echo]
description = "echo"
contract = "c.yaml"
command = ["cat"]
input_schema = { type = "object" }
output_schema = { type = "object" }
"#;

    #[test]
    fn a_table_tool_loads_with_its_contract_beside_the_config() {
        let registry = Registry::load(&config(TOOL), Path::new("/etc/airlock")).unwrap();
        let tool = registry.get("echo").unwrap();
        assert_eq!(tool.contract, Path::new("/etc/airlock/c.yaml"));
        assert_eq!(tool.max_output_bytes, DEFAULT_MAX_OUTPUT_BYTES);
    }

    #[test]
    fn a_class_is_refused_until_classes_exist() {
        let text = TOOL.replace("command =", "class = \"batch\"\ncommand =");
        let err = Registry::load(&config(&text), Path::new("/")).unwrap_err();
        assert!(err.to_string().contains("workload classes"), "{err}");
    }

    #[test]
    fn a_remote_ref_refuses_the_registry_naming_the_tool_and_field() {
        let text = TOOL.replace(
            "input_schema = { type = \"object\" }",
            "input_schema = { \"$ref\" = \"http://127.0.0.1:9/s.json\" }",
        );
        let err = Registry::load(&config(&text), Path::new("/")).unwrap_err();
        assert!(
            err.to_string().starts_with("tools.echo.input_schema"),
            "{err}"
        );
    }

    #[test]
    fn tool_files_in_the_directory_are_loaded_by_stem() {
        let dir = tempfile::tempdir().unwrap();
        let body = TOOL.replace("[echo]\n", "");
        std::fs::write(dir.path().join("upper.toml"), body).unwrap();
        std::fs::write(dir.path().join("README.md"), "not a tool").unwrap();
        let text = format!("dir = {:?}\n", dir.path());
        let registry = Registry::load(&config(&text), Path::new("/")).unwrap();
        assert_eq!(registry.tools.keys().collect::<Vec<_>>(), ["upper"]);
        assert_eq!(
            registry.get("upper").unwrap().contract,
            dir.path().join("c.yaml")
        );
    }

    #[test]
    fn a_per_tool_cap_above_the_global_one_is_refused() {
        let text = TOOL.replace("command =", "max_output_bytes = 99999999\ncommand =");
        assert!(Registry::load(&config(&text), Path::new("/")).is_err());
    }

    /// docs/tool.schema.json is the schema of one tool file; `AIRLOCK_BLESS=1` rewrites it.
    #[test]
    fn checked_in_tool_schema_matches_the_types() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/tool.schema.json");
        let schema = serde_json::to_string_pretty(&schemars::schema_for!(ToolSpec)).unwrap() + "\n";
        if std::env::var_os("AIRLOCK_BLESS").is_some() {
            std::fs::write(&path, &schema).unwrap();
        }
        let checked_in = std::fs::read_to_string(&path).unwrap_or_default();
        assert_eq!(
            checked_in, schema,
            "docs/tool.schema.json is stale: AIRLOCK_BLESS=1 cargo test -p airlock-agent"
        );
    }

    #[test]
    fn tool_names_are_function_names() {
        assert!(valid_tool_name("db_query"));
        assert!(!valid_tool_name("db query"));
        assert!(!valid_tool_name("agent"));
        assert!(!valid_tool_name(""));
    }
}
