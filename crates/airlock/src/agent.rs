//! `airlock agent`: one task through an OpenAI-compatible endpoint (Chat Completions or
//! the Responses API) with the registry's tools (docs/tools.md). The API key is read from its environment
//! variable (or `[tools.agent] api_key_file`) and removed from this process's
//! environment before anything else starts, so no child (the cell factory, a
//! supervisor) inherits it; it is never in a cell, a record or an error message.

use crate::tool::ToolSource;
use airlock_agent::agent::{run_agent, AgentOptions, ModelApi};
use airlock_agent::openai::ChatClient;
use clap::Args;
use std::process::ExitCode;
use std::time::Duration;

#[derive(Args)]
pub struct AgentArgs {
    #[command(flatten)]
    source: ToolSource,
    /// The model name sent to the endpoint.
    #[arg(long)]
    model: String,
    /// The endpoint's base URL (`.../v1`); default `[tools.agent] base_url`.
    #[arg(long)]
    base_url: Option<String>,
    /// Most model turns.
    #[arg(long)]
    max_turns: Option<u32>,
    /// Seconds the whole task may take.
    #[arg(long)]
    deadline: Option<u64>,
    /// Offer a shell (OpenAI's shell action) running in one session's cell: a `shell`
    /// function tool over Chat Completions, the local `shell` tool over Responses.
    #[arg(long)]
    shell: bool,
    /// The endpoint's wire format: `chat` (`POST /chat/completions`) or `responses`
    /// (`POST /responses`, OpenAI's Responses API).
    #[arg(long, value_enum, default_value_t = Api::Chat)]
    api: Api,
    /// The task.
    task: String,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum Api {
    Chat,
    Responses,
}

pub fn agent(args: AgentArgs) -> ExitCode {
    match run(args) {
        Ok(code) => code,
        Err(err) => {
            eprintln!("airlock: agent: {}", crate::user_message(&err));
            ExitCode::from(2)
        }
    }
}

fn run(args: AgentArgs) -> anyhow::Result<ExitCode> {
    // The engine's credentials rule already forbids `api_key_env` in every cell
    // (OperatorConfig::credential_rules).
    let mut toolbox = crate::tool::toolbox(&args.source)?;
    let settings = toolbox.registry.agent.clone();
    let api_key = take_api_key(&settings)?;
    toolbox.secrets.push(api_key.clone());
    let base_url = args.base_url.or(settings.base_url.clone()).ok_or_else(|| {
        anyhow::anyhow!("no endpoint: pass --base-url or set [tools.agent] base_url")
    })?;
    let client = ChatClient::new(&base_url, api_key)?;
    let options = AgentOptions {
        model: args.model,
        endpoint: base_url,
        api: match args.api {
            Api::Chat => ModelApi::ChatCompletions,
            Api::Responses => ModelApi::Responses,
        },
        max_turns: args.max_turns.unwrap_or(settings.max_turns),
        deadline: Duration::from_secs(args.deadline.unwrap_or(settings.deadline_seconds)),
        shell: args.shell,
    };
    let outcome = run_agent(&toolbox, &client, &options, &args.task);
    if let Some(answer) = &outcome.answer {
        println!("{answer}");
    }
    eprintln!(
        "airlock: agent: {} after {} turn(s), {} tool call(s); transcript {}",
        outcome.outcome,
        outcome.turns,
        outcome.tool_calls,
        outcome.transcript_id.as_deref().unwrap_or("not stored")
    );
    if let Some(error) = &outcome.error {
        eprintln!("airlock: agent: {error}");
    }
    Ok(match outcome.outcome {
        "answered" => ExitCode::SUCCESS,
        _ => ExitCode::from(1),
    })
}

/// The key, from its variable (then removed from the environment) or its file.
fn take_api_key(settings: &airlock_agent::registry::AgentSettings) -> anyhow::Result<String> {
    if let Ok(key) = std::env::var(&settings.api_key_env) {
        // Single-threaded still: nothing reads the environment concurrently.
        std::env::remove_var(&settings.api_key_env);
        if !key.is_empty() {
            return Ok(key);
        }
    }
    match &settings.api_key_file {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| anyhow::anyhow!("tools.agent.api_key_file: {e}"))?;
            Ok(text.trim_end_matches(['\r', '\n']).to_string())
        }
        None => anyhow::bail!(
            "no API key: set ${} or [tools.agent] api_key_file",
            settings.api_key_env
        ),
    }
}
