//! `airlock serve`: the execution service (crates/server) with the operator's
//! configuration; its `[server]` section is documented in docs/api.md.

use crate::config::OperatorConfig;
use clap::Args;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Args)]
pub struct ServeArgs {
    /// Operator configuration (TOML) with a `[server]` section.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Directory of the audit store (default /var/lib/airlock as root, else the XDG state dir).
    #[arg(long)]
    state_dir: Option<PathBuf>,
}

pub fn serve(args: ServeArgs) -> ExitCode {
    match start(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("airlock serve: {}", crate::user_message(&err));
            ExitCode::from(1)
        }
    }
}

fn start(args: ServeArgs) -> anyhow::Result<()> {
    let mut config = OperatorConfig::load(args.config.as_deref())?;
    let engine = config.engine_config(config.state_dir(args.state_dir.as_deref()))?;
    let config_dir = crate::config_dir(args.config.as_deref());
    let server = std::mem::take(&mut config.server);
    let verifications = std::sync::Arc::new(airlock_server::verification::Verifications::default());
    let state_dir = engine.state_dir.clone();
    let images = std::sync::Arc::new(HostImages {
        images: config.images.clone(),
        state_dir: state_dir.clone(),
    });
    let policy = crate::approvals::ServicePolicy {
        classes: crate::class::load_classes(&config, args.config.as_deref())?,
        approvers: config.policy.approvers.clone(),
        store: engine.store_location(),
    };
    if !server.verify.classes.is_empty() {
        let schedule = crate::verify::Schedule {
            classes: server.verify.classes.clone(),
            every: std::time::Duration::from_secs(server.verify.interval_s),
            config: args.config.clone(),
            state_dir: state_dir.clone(),
        };
        schedule.check(&policy.classes)?;
        schedule.start(std::sync::Arc::clone(&verifications));
    }
    let tools_dir = config_dir.clone();
    // Every registry tool and the generic tools at /mcp, and the registry's tools at
    // POST /v1/tools/{name}/call, on the service's engine, as the service's tenants.
    let mcp: airlock_server::McpMount = Box::new(move |engine, authenticate| {
        let toolbox = crate::tool::toolbox_on(config, &tools_dir, state_dir, engine)
            .map_err(|e| format!("the tool registry: {}", crate::user_message(&e)))?;
        let toolbox = std::sync::Arc::new(toolbox);
        let state = airlock_agent::mcp::McpState::new(std::sync::Arc::clone(&toolbox))
            .map_err(|e| format!("the MCP tools: {e}"))?;
        let mcp = airlock_agent::mcp::http_router(
            state,
            std::sync::Arc::clone(&authenticate),
            Vec::new(),
        );
        Ok(axum::Router::new()
            .nest_service("/mcp", mcp)
            .merge(airlock_agent::mcp::tool_call_router(toolbox, authenticate)))
    });
    airlock_server::serve(airlock_server::ServeOptions {
        server,
        config_dir,
        engine,
        euid_is_root: euid_is_root(),
        mcp: Some(mcp),
        policy: Some(std::sync::Arc::new(policy)),
        verifications,
        images: Some(images),
    })?;
    Ok(())
}

/// The state directory's image store, read as `airlock run` reads it (the `[images]`
/// configuration: default registry, tags, unpacker limits).
struct HostImages {
    images: crate::config::ImagesConfig,
    state_dir: PathBuf,
}

impl airlock_server::ImageResolver for HostImages {
    fn resolve(
        &self,
        image: &str,
    ) -> Result<airlock_server::LeasedImage, (airlock_cell::report::ResultClass, String)> {
        let (image, lease) = crate::run_image::resolve(image, &self.images, &self.state_dir)?;
        Ok(airlock_server::LeasedImage {
            image,
            lease: Box::new(lease),
        })
    }
}

/// Whether this process's effective uid is 0 (from /proc/self/status: no libc call).
fn euid_is_root() -> bool {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with("Uid:"))
        .and_then(|l| l.split_whitespace().nth(2))
        == Some("0")
}
