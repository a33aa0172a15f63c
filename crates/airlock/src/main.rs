//! The `airlock` command line: run a command in a cell, check the host, and (later
//! issues) query the audit store.

mod agent;
mod approvals;
mod audit;
mod class;
mod config;
mod image;
mod mcp;
mod oci;
mod quarantine;
mod run;
mod run_image;
mod serve;
mod tool;
mod verify;

use clap::{Parser, Subcommand};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

/// `airlock --version`: the package version and the commit it was built from.
const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), " (", env!("AIRLOCK_COMMIT"), ")");

#[derive(Parser)]
#[command(
    name = "airlock",
    version = VERSION,
    about = "Run untrusted commands in disposable, kernel-enforced cells"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a command in a fresh cell under an execution contract.
    Run(run::RunArgs),
    /// Query the run records of the audit store.
    Runs {
        #[command(flatten)]
        store: audit::StoreArgs,
        #[command(subcommand)]
        command: audit::RunsCommand,
    },
    /// Verify or export the tamper-evident audit trail.
    Audit {
        #[command(flatten)]
        store: audit::StoreArgs,
        #[command(subcommand)]
        command: audit::AuditCommand,
    },
    /// Figures by workload class: runs, completion, startup latency, denials, timeouts.
    Stats {
        #[command(flatten)]
        store: audit::StoreArgs,
        #[arg(long)]
        json: bool,
    },
    /// Check an operator configuration, or print its JSON Schema.
    Config {
        #[command(subcommand)]
        command: ConfigCommand,
    },
    /// Import, list, inspect, remove and garbage-collect OCI images (cell roots).
    Image(image::ImageArgs),
    /// Workload classes: list, show, and resolve a request to its contract (dry run).
    Class(class::ClassArgs),
    /// Requests waiting for an approver: list, approve, deny.
    Approvals(approvals::ApprovalsArgs),
    /// Capability-review records left by policy denials.
    Reviews {
        #[command(flatten)]
        store: audit::StoreArgs,
        #[command(subcommand)]
        command: class::ReviewsCommand,
    },
    /// Evidence kept of suspected escapes: list, show.
    Quarantine {
        #[command(flatten)]
        store: audit::StoreArgs,
        #[command(subcommand)]
        command: quarantine::QuarantineCommand,
    },
    /// The operator's tools: list, describe, call one through the tool protocol.
    Tool(tool::ToolArgs),
    /// Serve the tools over MCP (stdio, or streamable HTTP with --listen).
    Mcp(mcp::McpArgs),
    /// Run a task with an OpenAI-compatible model and the operator's tools.
    Agent(agent::AgentArgs),
    /// Run the execution service: the /v1 HTTP API on a unix socket (and TCP).
    Serve(serve::ServeArgs),
    /// Prove on this host that a contract's, class's or image's boundary holds: the
    /// seed's negative suite and boundary exercise, through the path a real run takes.
    Verify(verify::VerifyArgs),
    /// Check that this host can enforce every control of a cell.
    Doctor {
        /// Print the checks as JSON.
        #[arg(long)]
        json: bool,
        /// The operator configuration whose `host_ids` range the identity check shows.
        #[arg(long)]
        config: Option<PathBuf>,
    },
    /// Print shell completions (bash, zsh, fish, elvish, powershell) to stdout.
    Completions { shell: clap_complete::Shell },
    /// Write the man pages (airlock.1 and one per subcommand) into a directory.
    Man { out: PathBuf },
    /// The OCI runtime command line containerd's runc shim drives (create, start, state,
    /// kill, delete, ps, features); also this binary invoked as `airlock-runc`
    /// (docs/kubernetes.md). `airlock oci --help` lists its commands.
    #[command(disable_help_flag = true)]
    Oci {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<std::ffi::OsString>,
    },
}

#[derive(Subcommand)]
enum ConfigCommand {
    /// Parse and bound-check an operator configuration file; exit 1 on a problem.
    Check { file: PathBuf },
    /// Print the JSON Schema of the operator configuration (docs/config.schema.json).
    Schema,
}

fn main() -> ExitCode {
    let started = Instant::now();
    // Started inside a gVisor session's sandbox (its holder, a command's launcher, a
    // signal to a command's group): that is all this process does.
    airlock_cell::gvisor::inside::run_inside_sandbox_if_requested();
    // Started as the engine's cell factory: that is all this process does.
    airlock_engine::factory::run_factory_if_requested();
    // The OCI runtime's command line is runc's, not this one's (global options first).
    if oci::invoked_as_runtime() {
        return oci::main(std::env::args_os());
    }
    if std::env::args_os().nth(1).is_some_and(|a| a == "oci") {
        return oci::main(std::env::args_os().skip(1));
    }
    let cli = Cli::parse();
    match cli.command {
        Command::Run(args) => run::run(args, started),
        Command::Runs { store, command } => audit::runs(store, command),
        Command::Audit { store, command } => audit::audit(store, command),
        Command::Stats { store, json } => audit::stats(store, json),
        Command::Config { command } => config_command(command),
        Command::Image(args) => image::image(args),
        Command::Class(args) => class::class_command(args),
        Command::Approvals(args) => approvals::approvals_command(args),
        Command::Reviews { store, command } => audit::reviews(store, command),
        Command::Quarantine { store, command } => audit::quarantine(store, command),
        Command::Tool(args) => tool::tool(args),
        Command::Mcp(args) => mcp::mcp(args),
        Command::Agent(args) => agent::agent(args),
        Command::Serve(args) => serve::serve(args),
        Command::Verify(args) => verify::verify(args),
        Command::Doctor { json, config } => doctor(json, config.as_deref()),
        Command::Completions { shell } => {
            let mut command = <Cli as clap::CommandFactory>::command();
            clap_complete::generate(shell, &mut command, "airlock", &mut std::io::stdout());
            ExitCode::SUCCESS
        }
        Command::Oci { args } => oci::main(std::iter::once("oci".into()).chain(args)),
        Command::Man { out } => match write_man_pages(&out) {
            Ok(()) => ExitCode::SUCCESS,
            Err(err) => {
                eprintln!("airlock: man pages into {}: {err}", out.display());
                ExitCode::from(1)
            }
        },
    }
}

/// airlock.1 and airlock-<subcommand>.1 for each subcommand.
fn write_man_pages(out: &std::path::Path) -> std::io::Result<()> {
    std::fs::create_dir_all(out)?;
    let command = <Cli as clap::CommandFactory>::command().version(VERSION);
    clap_mangen::generate_to(command, out)
}

fn config_command(command: ConfigCommand) -> ExitCode {
    match command {
        ConfigCommand::Schema => {
            let schema = config::config_json_schema();
            println!(
                "{}",
                serde_json::to_string_pretty(&schema).unwrap_or_default()
            );
            ExitCode::SUCCESS
        }
        ConfigCommand::Check { file } => match config::OperatorConfig::load(Some(&file))
            .and_then(|c| class::load_classes(&c, Some(&file)).map(drop))
        {
            Ok(_) => {
                println!("{}: ok", file.display());
                ExitCode::SUCCESS
            }
            Err(err) => {
                eprintln!("airlock: {}", user_message(&err));
                ExitCode::from(1)
            }
        },
    }
}

fn doctor(json: bool, config: Option<&std::path::Path>) -> ExitCode {
    let loaded = config::OperatorConfig::load(config).and_then(|c| {
        let range = c.host_id_range()?;
        let classes = class::load_classes(&c, config)?;
        Ok((range, classes))
    });
    let (range, classes) = match loaded {
        Ok(loaded) => loaded,
        Err(err) => {
            eprintln!("airlock: {}", user_message(&err));
            return ExitCode::from(1);
        }
    };
    let mut checks = airlock_cell::doctor::run_checks_with(range);
    checks.extend(rlimits_only_classes(&classes));
    // Not a check: what lives now, parked warm cells included.
    let cells = airlock_cell::census::live_cells();
    checks.push(airlock_cell::doctor::Check {
        control: "cells.live",
        ok: true,
        detail: airlock_cell::census::summary(&cells),
    });
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&checks).unwrap_or_default()
        );
    } else {
        for c in &checks {
            println!(
                "{:<4} {:<34} {}",
                if c.ok { "ok" } else { "FAIL" },
                c.control,
                c.detail
            );
        }
    }
    if checks.iter().all(|c| c.ok) {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

/// The operator's classes that may run without a delegated cgroup, with rlimits only
/// (docs/policy.md): not a check of the host, what the `cgroups` check means for them.
fn rlimits_only_classes(
    classes: &std::collections::BTreeMap<String, class::LoadedClass>,
) -> Option<airlock_cell::doctor::Check> {
    let names: Vec<&str> = classes
        .iter()
        .filter(|(_, c)| c.class.ceilings_without_cgroup == airlock_policy::WithoutCgroup::Rlimits)
        .map(|(name, _)| name.as_str())
        .collect();
    (!names.is_empty()).then(|| airlock_cell::doctor::Check {
        control: "cgroups.rlimits_only",
        ok: true,
        detail: format!(
            "class(es) {} may run where no cgroup is delegated, with rlimits only (RLIMIT_AS per process, RLIMIT_NPROC per cell, RLIMIT_CPU per process, RLIMIT_FSIZE; not the CPU rate, the cell's memory as a whole or usage counters), and their records say so; every other run needs the cgroups above",
            names.join(", ")
        ),
    })
}

/// An error and its causes as one line for people. Our errors already say their source
/// (`cannot write: Broken pipe`), so a cause whose text is already in the line is not
/// repeated, as anyhow's `{:#}` would.
fn user_message(err: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in err.chain() {
        let text = cause.to_string();
        if line.contains(&text) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&text);
    }
    line
}

/// Directory used for relative paths of the default contract.
fn current_dir() -> PathBuf {
    std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/"))
}

/// The directory a configuration file's relative paths are read against: the file's own,
/// made absolute first (`airlock.toml`'s parent is the empty path), or the current one.
fn config_dir(config: Option<&Path>) -> PathBuf {
    config
        .and_then(|p| std::path::absolute(p).ok())
        .and_then(|p| p.parent().map(Path::to_path_buf))
        .unwrap_or_else(current_dir)
}
