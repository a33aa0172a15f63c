//! `airlock tool list|describe|call`: the operator's tool registry (`[tools]` of the
//! configuration, docs/tools.md) and one call through the tool protocol. Also what
//! `airlock mcp` and `airlock agent` share: the tool box (registry, engine, planner).

use crate::config::OperatorConfig;
use airlock_agent::call::{PlanError, PlannedCell, Planner};
use airlock_agent::exec::Cancel;
use airlock_agent::{Registry, ToolBox};
use airlock_cell::report::ResultClass;
use airlock_contract::{compile, load_contract_file, read_seccomp_profile, CompileInput};
use airlock_engine::Engine;
use clap::{Args, Subcommand};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

/// Where the registry and the store come from (every tool-facing command).
#[derive(Args, Clone)]
pub struct ToolSource {
    /// Operator configuration (TOML) with the `[tools]` registry.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Directory of the audit store.
    #[arg(long)]
    pub state_dir: Option<PathBuf>,
}

#[derive(Args)]
pub struct ToolArgs {
    #[command(flatten)]
    source: ToolSource,
    #[command(subcommand)]
    command: ToolCommand,
}

#[derive(Subcommand)]
enum ToolCommand {
    /// The registry's tools: name and description.
    List {
        #[arg(long)]
        json: bool,
    },
    /// One tool: its description, input and output schemas, contract and command.
    Describe { name: String },
    /// Call a tool: the input is validated, run in a cell, the envelope printed.
    Call {
        name: String,
        /// The tool's input, one JSON value.
        #[arg(long)]
        input: String,
    },
}

pub fn tool(args: ToolArgs) -> ExitCode {
    let toolbox = match toolbox(&args.source) {
        Ok(toolbox) => toolbox,
        Err(err) => {
            eprintln!("airlock: {}", crate::user_message(&err));
            return ExitCode::from(2);
        }
    };
    match args.command {
        ToolCommand::List { json } => list(&toolbox.registry, json),
        ToolCommand::Describe { name } => describe(&toolbox.registry, &name),
        ToolCommand::Call { name, input } => call(&toolbox, &name, &input),
    }
}

fn list(registry: &Registry, json: bool) -> ExitCode {
    if json {
        let tools: Vec<_> = registry
            .tools
            .values()
            .map(|t| serde_json::json!({"name": t.name, "description": t.description}))
            .collect();
        println!(
            "{}",
            serde_json::to_string_pretty(&tools).unwrap_or_default()
        );
    } else {
        for tool in registry.tools.values() {
            println!("{:<24} {}", tool.name, tool.description);
        }
    }
    ExitCode::SUCCESS
}

fn describe(registry: &Registry, name: &str) -> ExitCode {
    let Some(tool) = registry.get(name) else {
        eprintln!("airlock: no tool named {name:?} in the registry");
        return ExitCode::from(2);
    };
    let described = serde_json::json!({
        "name": tool.name,
        "description": tool.description,
        "input_schema": tool.input.source(),
        "output_schema": tool.output.source(),
        "contract": tool.contract,
        "command": tool.command,
        "max_output_bytes": tool.max_output_bytes,
    });
    println!(
        "{}",
        serde_json::to_string_pretty(&described).unwrap_or_default()
    );
    ExitCode::SUCCESS
}

/// Prints the envelope the model would receive on stdout, the run's facts on stderr;
/// exit 0 when the call is `ok`, 1 when it is not.
fn call(toolbox: &ToolBox, name: &str, input: &str) -> ExitCode {
    let result = toolbox.call_text(name, input, &Cancel::default());
    println!("{}", result.reply.to_value());
    let meta = &result.meta;
    eprintln!(
        "airlock: tool {name}: run {} {} exit {} limit {} truncated {}",
        if meta.run_id.is_empty() {
            "-"
        } else {
            &meta.run_id
        },
        meta.result_class,
        meta.exit_code.map_or("-".to_string(), |c| c.to_string()),
        meta.limit_fired.as_deref().unwrap_or("-"),
        meta.truncated
    );
    match result.reply.is_ok() {
        true => ExitCode::SUCCESS,
        false => ExitCode::from(1),
    }
}

/// The registry of the configuration, an engine on its store and the CLI's planner.
pub fn toolbox(source: &ToolSource) -> anyhow::Result<ToolBox> {
    let config = OperatorConfig::load(source.config.as_deref())?;
    let base_dir = crate::config_dir(source.config.as_deref());
    let state_dir = config.state_dir(source.state_dir.as_deref());
    let engine = Arc::new(Engine::new(config.engine_config(state_dir.clone())?));
    toolbox_on(config, &base_dir, state_dir, engine)
}

/// The registry of `config` (relative paths against `base_dir`) on an existing engine:
/// `airlock serve` offers the tools on its own.
pub fn toolbox_on(
    config: OperatorConfig,
    base_dir: &Path,
    state_dir: PathBuf,
    engine: Arc<Engine>,
) -> anyhow::Result<ToolBox> {
    let registry = Registry::load(&config.tools, base_dir)?;
    let store = engine.config().store_location();
    let planner = Arc::new(CliPlanner {
        config,
        state_dir,
        store,
    });
    Ok(ToolBox::new(registry, engine, planner))
}

/// Contracts as `airlock run` reads them: an OCI image through the image store (its lease
/// held while the cell lives), an allowlist only when the configuration resolves it.
struct CliPlanner {
    config: OperatorConfig,
    state_dir: PathBuf,
    /// Where a suspected escape's record is read from for its quarantine.
    store: airlock_store::StoreLocation,
}

impl Planner for CliPlanner {
    fn plan(&self, contract: Option<&Path>, argv: &[String]) -> Result<PlannedCell, PlanError> {
        let refused = |err: airlock_contract::ContractError| PlanError {
            class: ResultClass::from_name(err.class()).unwrap_or(ResultClass::RuntimeFault),
            detail: format!("contract: {err}"),
        };
        let (contract, base_dir) = match contract {
            Some(path) => (
                load_contract_file(path).map_err(refused)?,
                path.parent()
                    .map(Path::to_path_buf)
                    .unwrap_or_else(crate::current_dir),
            ),
            None => (airlock_contract::default_contract(), crate::current_dir()),
        };
        let resolved = match contract.image == airlock_contract::HOST_IMAGE {
            true => None,
            false => Some(
                crate::run_image::resolve(&contract.image, &self.config.images, &self.state_dir)
                    .map_err(|(class, detail)| PlanError { class, detail })?,
            ),
        };
        let profile = read_seccomp_profile(&contract, &base_dir).map_err(refused)?;
        let plan = compile(
            &contract,
            &CompileInput {
                base_dir: &base_dir,
                argv,
                seccomp_profile: profile.as_deref(),
                image: resolved.as_ref().map(|(image, _)| image),
                pod_network: None,
            },
        )
        .map_err(refused)?;
        if let airlock_contract::NetworkPlan::Allowlist { destinations } = &plan.network {
            let unresolvable = self
                .config
                .egress
                .unresolvable(destinations.iter().map(|d| d.host_pattern.as_str()));
            if !unresolvable.is_empty() {
                return Err(PlanError {
                    class: ResultClass::SandboxUnavailable,
                    detail: format!(
                        "egress: the configuration cannot resolve {}",
                        unresolvable.join(", ")
                    ),
                });
            }
        }
        Ok(PlannedCell {
            plan,
            keep_alive: resolved.map(|(_, lease)| Box::new(lease) as Box<dyn std::any::Any + Send>),
        })
    }

    /// A suspected escape of a tool, MCP or agent cell is quarantined like any run's:
    /// its record and writable paths kept, its requester (the tenant, or this process's
    /// uid) flagged.
    fn after_close(
        &self,
        workload_class: &str,
        tenant: Option<&str>,
    ) -> Option<airlock_engine::AfterClose> {
        let store = self.store.clone();
        let class = workload_class.to_string();
        let requester = match tenant {
            Some(tenant) => {
                airlock_policy::approval::Identity::Tenant(tenant.to_string()).to_string()
            }
            None => airlock_policy::approval::Identity::Uid(
                airlock_store::caller_uid().unwrap_or(u32::MAX),
            )
            .to_string(),
        };
        Some(Box::new(move |report, copy| {
            let suspect = crate::quarantine::Suspect {
                class: &class,
                requester,
                credentials: Vec::new(),
                writable_copy: copy.map(std::path::PathBuf::from),
            };
            crate::quarantine::preserve_if_suspected(&store, report, &suspect);
        }))
    }
}
