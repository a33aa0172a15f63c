//! Queries over the audit store: `runs list|show|prune`, `audit verify|export`, `stats`.

use crate::config::OperatorConfig;
use airlock_store::{RunFilter, Store};
use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

#[derive(Args)]
pub struct StoreArgs {
    /// Directory of the audit store.
    #[arg(long, global = true)]
    state_dir: Option<PathBuf>,
    /// Operator configuration (for `[store] state_dir`).
    #[arg(long, global = true)]
    config: Option<PathBuf>,
}

impl StoreArgs {
    fn open(&self) -> anyhow::Result<Store> {
        let config = OperatorConfig::load(self.config.as_deref())?;
        let location = config.store_location(self.state_dir.as_deref())?;
        let store = Store::open_at(&location).with_context(|| match &location.postgres {
            Some(fleet) => format!("opening the audit store {}", fleet.url.shown()),
            None => format!(
                "opening the audit store in {}",
                location.state_dir.display()
            ),
        })?;
        store.reap_aborted()?;
        Ok(store)
    }
}

#[derive(Subcommand)]
pub enum RunsCommand {
    /// List runs, newest first.
    List {
        #[arg(long)]
        status: Option<String>,
        #[arg(long = "class")]
        workload_class: Option<String>,
        /// Only runs started within this age (e.g. 30m, 12h, 7d).
        #[arg(long)]
        since: Option<String>,
        /// Only runs started before this age.
        #[arg(long)]
        until: Option<String>,
        #[arg(long, default_value_t = 50)]
        limit: usize,
        #[arg(long)]
        json: bool,
        /// Include runs started by other users (and runs recorded before callers were).
        #[arg(long)]
        all_users: bool,
        /// Only the commands of this session (its run id).
        #[arg(long)]
        session: Option<String>,
    },
    /// Show one run with its events.
    Show {
        id: String,
        #[arg(long)]
        json: bool,
        /// Show the run even if another user started it.
        #[arg(long)]
        all_users: bool,
    },
    /// Delete finished runs older than an age (e.g. 30d); the audit chain stays verifiable.
    Prune {
        #[arg(long)]
        older_than: String,
    },
}

#[derive(Subcommand)]
pub enum AuditCommand {
    /// Check the hash chain; names the first edited, deleted or reordered record.
    Verify,
    /// Export every audit entry and run as JSON lines (for a SIEM).
    Export {
        #[arg(long, default_value = "jsonl")]
        format: String,
        /// Write to this file instead of stdout.
        #[arg(long)]
        output: Option<PathBuf>,
    },
}

/// The caller filter of `runs list|show`: by default a user sees the runs they started
/// (docs/threat-model.md, "Who reads the store").
fn own_runs_only(all_users: bool) -> Option<u32> {
    if all_users {
        None
    } else {
        // Without a readable uid nothing matches: fail closed, show nothing.
        Some(airlock_store::caller_uid().unwrap_or(u32::MAX))
    }
}

/// Parses ages like `90s`, `30m`, `12h`, `30d`.
pub fn parse_age(text: &str) -> anyhow::Result<Duration> {
    let (number, unit) = text.split_at(
        text.find(|c: char| !c.is_ascii_digit())
            .unwrap_or(text.len()),
    );
    let n: u64 = number
        .parse()
        .with_context(|| format!("age {text:?}: expected a number followed by s, m, h or d"))?;
    let seconds = match unit {
        "s" => n,
        "m" => n * 60,
        "h" => n * 3600,
        "d" => n * 86400,
        _ => bail!("age {text:?}: unit must be s, m, h or d"),
    };
    Ok(Duration::from_secs(seconds))
}

fn unix_ms_ago(age: Duration) -> i64 {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    now.saturating_sub(age).as_millis() as i64
}

/// `println!` that returns the write error instead of panicking: `airlock runs list | head`
/// closes the pipe early, which is the reader's choice, not a failure (see [`fail`]).
macro_rules! out {
    ($($arg:tt)*) => {
        writeln!(std::io::stdout(), $($arg)*)?
    };
}

fn fail(err: anyhow::Error) -> ExitCode {
    if reader_left(&err) {
        // Like `cat | head`: the reader stopped reading; nothing is wrong with the store.
        return ExitCode::SUCCESS;
    }
    eprintln!("airlock: {}", crate::user_message(&err));
    if store_unavailable(&err) {
        // Not a failure of the records: the store cannot be reached now; retry later.
        return ExitCode::from(airlock_cell::report::STORE_UNAVAILABLE_EXIT as u8);
    }
    ExitCode::from(1)
}

/// The error is the store being unreachable (a fleet's Postgres down, ...).
fn store_unavailable(err: &anyhow::Error) -> bool {
    err.chain()
        .filter_map(|e| e.downcast_ref::<airlock_store::StoreError>())
        .any(airlock_store::StoreError::is_unavailable)
}

/// The error is a closed stdout (EPIPE), directly or as the source of a store error.
fn reader_left(err: &anyhow::Error) -> bool {
    use airlock_store::StoreError;
    err.chain().any(|cause| {
        let kind = match cause.downcast_ref::<StoreError>() {
            Some(StoreError::Export(io)) => Some(io.kind()),
            // The exporter streams JSON straight into stdout.
            Some(StoreError::Encode(json)) => json.io_error_kind(),
            _ => cause.downcast_ref::<std::io::Error>().map(|io| io.kind()),
        };
        kind == Some(std::io::ErrorKind::BrokenPipe)
    })
}

/// A value that may be missing, for people: `-` instead of `None`.
fn or_dash<T: std::fmt::Display>(value: Option<T>) -> String {
    value.map_or_else(|| "-".to_string(), |v| v.to_string())
}

pub fn runs(store_args: StoreArgs, command: RunsCommand) -> ExitCode {
    let result = (|| -> anyhow::Result<ExitCode> {
        let store = store_args.open()?;
        match command {
            RunsCommand::List {
                status,
                workload_class,
                since,
                until,
                limit,
                json,
                all_users,
                session,
            } => {
                let filter = RunFilter {
                    status,
                    workload_class,
                    since: since
                        .as_deref()
                        .map(parse_age)
                        .transpose()?
                        .map(unix_ms_ago),
                    until: until
                        .as_deref()
                        .map(parse_age)
                        .transpose()?
                        .map(unix_ms_ago),
                    limit: Some(limit),
                    caller_uid: own_runs_only(all_users),
                    session_id: session,
                    tenant: None,
                    before: None,
                };
                let runs = store.list_runs(&filter)?;
                if json {
                    out!("{}", serde_json::to_string_pretty(&runs)?);
                } else {
                    out!(
                        "{:<36}  {:<17}  {:<10}  {:>5}  {:>9}  command",
                        "run id",
                        "status",
                        "class",
                        "exit",
                        "wall ms"
                    );
                    for r in runs {
                        let exit = r
                            .exit_code
                            .map(|c| c.to_string())
                            .or(r.exit_signal.map(|s| format!("sig{s}")))
                            .unwrap_or("-".into());
                        out!(
                            "{:<36}  {:<17}  {:<10}  {:>5}  {:>9.1}  {}",
                            r.run_id,
                            r.status,
                            r.workload_class,
                            exit,
                            r.wall_ms.unwrap_or(0.0),
                            r.argv.join(" ")
                        );
                    }
                }
            }
            RunsCommand::Show {
                id,
                json,
                all_users,
            } => {
                let Some(detail) = store.show_run(&id)? else {
                    bail!("no run {id}")
                };
                if let Some(me) = own_runs_only(all_users) {
                    if detail.run.caller_uid != Some(me) {
                        bail!(
                            "run {id} was started by {}, not by uid {me}; \
                             pass --all-users to show runs of other users",
                            detail
                                .run
                                .caller_uid
                                .map_or("an unrecorded caller".to_string(), |u| format!("uid {u}"))
                        )
                    }
                }
                if json {
                    out!("{}", serde_json::to_string_pretty(&detail)?);
                } else {
                    let r = &detail.run;
                    out!("run        {}", r.run_id);
                    out!(
                        "status     {}{}",
                        r.status,
                        r.limit_fired
                            .as_ref()
                            .map(|l| format!(" ({l})"))
                            .unwrap_or_default()
                    );
                    out!("command    {}", r.argv.join(" "));
                    out!("class      {}", r.workload_class);
                    out!(
                        "exit       code {} signal {}",
                        or_dash(r.exit_code),
                        or_dash(r.exit_signal)
                    );
                    out!(
                        "timings    startup {:.2} ms, wall {:.2} ms",
                        r.startup_ms.unwrap_or(0.0),
                        r.wall_ms.unwrap_or(0.0)
                    );
                    out!("input      sha256 {}", r.input_sha256);
                    out!("contract   sha256 {}", r.contract_sha256);
                    out!("usage      {}", r.usage);
                    out!(
                        "cleanup    ok={} leftovers={}",
                        or_dash(r.cleanup_ok),
                        r.cleanup_leftovers
                    );
                    out!(
                        "stdout     {:?} ... {:?}",
                        r.stdout_head.as_deref().unwrap_or(""),
                        r.stdout_tail.as_deref().unwrap_or("")
                    );
                    out!(
                        "stderr     {:?} ... {:?}",
                        r.stderr_head.as_deref().unwrap_or(""),
                        r.stderr_tail.as_deref().unwrap_or("")
                    );
                    out!("events");
                    for e in &detail.events {
                        out!("  #{:<6} {:<18} {}", e.seq, e.kind, e.body);
                    }
                }
            }
            RunsCommand::Prune { older_than } => {
                let removed = store.prune(parse_age(&older_than)?)?;
                out!("pruned {removed} run(s) older than {older_than}");
            }
        }
        Ok(ExitCode::SUCCESS)
    })();
    result.unwrap_or_else(fail)
}

pub fn audit(store_args: StoreArgs, command: AuditCommand) -> ExitCode {
    let result = (|| -> anyhow::Result<ExitCode> {
        let store = store_args.open()?;
        match command {
            AuditCommand::Verify => match store.verify() {
                Ok(report) => {
                    out!(
                        "audit chain intact: {} entries, {} runs, head #{} {}",
                        report.entries,
                        report.runs,
                        report.head_seq,
                        report.head_hash
                    );
                    Ok(ExitCode::SUCCESS)
                }
                // Only a broken chain is a failed verification (2); a store that cannot
                // be reached says nothing about the chain (store_unavailable's code).
                Err(err) if err.is_unavailable() => {
                    eprintln!("airlock: audit verify: store_unavailable, nothing checked: {err}");
                    Ok(ExitCode::from(
                        airlock_cell::report::STORE_UNAVAILABLE_EXIT as u8,
                    ))
                }
                Err(err) => {
                    eprintln!("airlock: audit verify FAILED: {err}");
                    Ok(ExitCode::from(2))
                }
            },
            AuditCommand::Export { format, output } => {
                if format != "jsonl" {
                    bail!("export format {format:?} is not supported (use jsonl)");
                }
                let count = match output {
                    Some(path) => {
                        let file = std::fs::File::create(&path)
                            .with_context(|| format!("creating {}", path.display()))?;
                        let mut writer = std::io::BufWriter::new(file);
                        let n = store.export_jsonl(&mut writer)?;
                        writer.flush()?;
                        n
                    }
                    None => store.export_jsonl(std::io::stdout().lock())?,
                };
                eprintln!("exported {count} line(s)");
                Ok(ExitCode::SUCCESS)
            }
        }
    })();
    result.unwrap_or_else(fail)
}

/// `airlock reviews`: the capability-review records of policy denials (crate::class).
pub fn reviews(store_args: StoreArgs, command: crate::class::ReviewsCommand) -> ExitCode {
    let crate::class::ReviewsCommand::List { json } = command;
    let config = OperatorConfig::load(store_args.config.as_deref());
    let listed = config
        .and_then(|c| crate::class::reviews(&c.state_dir(store_args.state_dir.as_deref()), json));
    listed.unwrap_or_else(fail)
}

/// `airlock quarantine`: the evidence kept of suspected escapes (crate::quarantine).
pub fn quarantine(
    store_args: StoreArgs,
    command: crate::quarantine::QuarantineCommand,
) -> ExitCode {
    let config = OperatorConfig::load(store_args.config.as_deref());
    let dir = config.map(|c| c.state_dir(store_args.state_dir.as_deref()));
    dir.and_then(|d| crate::quarantine::quarantine_command(&d, command))
        .unwrap_or_else(fail)
}

pub fn stats(store_args: StoreArgs, json: bool) -> ExitCode {
    let result = (|| -> anyhow::Result<ExitCode> {
        let store = store_args.open()?;
        let stats = store.stats()?;
        if json {
            out!("{}", serde_json::to_string_pretty(&stats)?);
            return Ok(ExitCode::SUCCESS);
        }
        out!(
            "{:<14} {:>6} {:>10} {:>12} {:>12} {:>9} {:>9}  denials",
            "class",
            "runs",
            "completion",
            "startup p50",
            "startup p99",
            "timeouts",
            "cleanup!"
        );
        for (class, s) in stats {
            let pct = s
                .completion_rate
                .map(|r| format!("{:.1}%", r * 100.0))
                .unwrap_or("-".into());
            let ms = |v: Option<f64>| v.map(|v| format!("{v:.2} ms")).unwrap_or("-".into());
            let denials: Vec<String> = s.denials.iter().map(|(k, v)| format!("{k}={v}")).collect();
            out!(
                "{:<14} {:>6} {:>10} {:>12} {:>12} {:>9} {:>9}  {}",
                class,
                s.runs,
                pct,
                ms(s.startup_ms_p50),
                ms(s.startup_ms_p99),
                s.timeouts,
                s.cleanup_failures,
                denials.join(", ")
            );
        }
        Ok(ExitCode::SUCCESS)
    })();
    result.unwrap_or_else(fail)
}
