//! `airlock mcp`: the MCP server over stdio (one client, this process's stdin and
//! stdout) or, with `--listen`, over streamable HTTP at `/mcp` behind a Bearer key taken
//! from an environment variable (the service mounts the same router, docs/tools.md).

use crate::tool::ToolSource;
use airlock_agent::mcp::{http_router, serve_stdio, single_key, McpState};
use clap::Args;
use std::process::ExitCode;
use std::sync::Arc;

#[derive(Args)]
pub struct McpArgs {
    #[command(flatten)]
    source: ToolSource,
    /// Serve streamable HTTP on this address (e.g. 127.0.0.1:8931) instead of stdio; the
    /// bound address is printed on stderr.
    #[arg(long)]
    listen: Option<String>,
    /// With --listen: the environment variable holding the Bearer key clients must send.
    #[arg(long, default_value = "AIRLOCK_MCP_KEY")]
    key_env: String,
}

pub fn mcp(args: McpArgs) -> ExitCode {
    let served = crate::tool::toolbox(&args.source)
        .and_then(|toolbox| Ok(McpState::new(Arc::new(toolbox))?))
        .and_then(|state| {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()?;
            runtime.block_on(serve(state, &args))
        });
    match served {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("airlock: mcp: {}", crate::user_message(&err));
            ExitCode::from(1)
        }
    }
}

/// The tenant `airlock mcp --listen`'s runs are recorded under: its one key's.
const STANDALONE_TENANT: &str = "mcp";

async fn serve(state: Arc<McpState>, args: &McpArgs) -> anyhow::Result<()> {
    let Some(listen) = &args.listen else {
        serve_stdio(state).await?;
        return Ok(());
    };
    let key = std::env::var(&args.key_env)
        .map_err(|_| anyhow::anyhow!("--listen needs a Bearer key in ${}", args.key_env))?;
    if key.len() < 16 {
        anyhow::bail!(
            "the Bearer key in ${} is shorter than 16 characters",
            args.key_env
        );
    }
    let listener = tokio::net::TcpListener::bind(listen).await?;
    let address = listener.local_addr()?;
    let authenticate = single_key(key, STANDALONE_TENANT);
    let router =
        axum::Router::new().nest_service("/mcp", http_router(state, authenticate, Vec::new()));
    eprintln!("airlock: mcp: listening on http://{address}/mcp");
    axum::serve(listener, router).await?;
    Ok(())
}
