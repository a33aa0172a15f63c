//! The OCI runtime command line (`airlock oci ...`, or this binary invoked as
//! `airlock-runc`): what containerd's runc shim (`io.containerd.runc.v2`, through
//! containerd/go-runc) calls, so that a RuntimeClass whose `BinaryName` is airlock runs
//! every container in a cell under its contract, with its records (docs/kubernetes.md).
//!
//! One container is one run of the engine in a supervisor process of its own
//! (`supervise.rs`): `create` starts it and returns once the cell is built and the begin
//! record written; the payload is held until `start`. The supervisor's pid is the one
//! in `--pid-file`: it is reparented to the shim (a child subreaper) when `create` exits,
//! and exits with the payload's status, which is how the shim learns it.
//! `exec` (`exec.rs`) asks that supervisor for a further process of the container's cell
//! (its pid 1 spawns it, so it has the payload's confinement); a terminal's master goes
//! to the `--console-socket` as runc's does.

mod commands;
mod exec;
mod pod;
mod resources;
mod state;
mod supervise;

use clap::{Parser, Subcommand};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// runc's default state root, as airlock's own (a node may have runc too).
const DEFAULT_ROOT: &str = "/run/airlock-runc";

#[derive(Parser, Debug)]
#[command(
    name = "airlock-runc",
    about = "airlock as an OCI runtime (containerd's runc shim drives it)"
)]
pub struct OciCli {
    /// Directory of the containers' state (the shim passes one per namespace).
    #[arg(long, global = true, default_value = DEFAULT_ROOT)]
    root: PathBuf,
    /// Where errors are written for the shim (it reports the last one).
    #[arg(long, global = true)]
    log: Option<PathBuf>,
    /// `text` or `json` (`{"level":"error","msg":...}` lines, what the shim reads).
    #[arg(long = "log-format", global = true, default_value = "text")]
    log_format: String,
    /// `linux.cgroupsPath` is systemd's `slice:prefix:name` (the scope's directories are
    /// made by airlock itself, not through systemd: crates/oci/src/cgroups_path.rs).
    #[arg(long = "systemd-cgroup", global = true)]
    systemd_cgroup: bool,
    /// Accepted and ignored, as runc's.
    #[arg(long, global = true)]
    debug: bool,
    #[command(subcommand)]
    command: OciCommand,
}

#[derive(Subcommand, Debug)]
pub enum OciCommand {
    /// Build the container's cell and hold its process until `start`.
    Create {
        #[arg(long, short = 'b', default_value = ".")]
        bundle: PathBuf,
        #[arg(long = "pid-file")]
        pid_file: Option<PathBuf>,
        #[arg(long = "console-socket")]
        console_socket: Option<PathBuf>,
        #[arg(long = "no-pivot")]
        no_pivot: bool,
        #[arg(long = "no-new-keyring")]
        no_new_keyring: bool,
        #[arg(long)]
        detach: bool,
        id: String,
    },
    /// Release the held process (its begin record exists).
    Start { id: String },
    /// The container's state as runc prints it (JSON).
    State { id: String },
    /// Send a signal to the container's process (`--all`: every process of the cell).
    Kill {
        #[arg(long, short = 'a')]
        all: bool,
        id: String,
        #[arg(default_value = "SIGTERM")]
        signal: String,
    },
    /// Remove a stopped container's state (`--force`: kill it first).
    Delete {
        #[arg(long, short = 'f')]
        force: bool,
        id: String,
    },
    /// The container's processes (`--format json`: a JSON array of pids).
    Ps {
        #[arg(long, short = 'f', default_value = "table")]
        format: String,
        id: String,
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        ps_args: Vec<String>,
    },
    /// What this runtime supports (the runtime-spec's features document).
    Features,
    /// Run a further process in a running container's cell (its confinement, its
    /// cgroup and ceilings), from process.json (exec.rs).
    Exec {
        #[arg(long, short = 'p')]
        process: Option<PathBuf>,
        #[arg(long = "pid-file")]
        pid_file: Option<PathBuf>,
        #[arg(long = "console-socket")]
        console_socket: Option<PathBuf>,
        #[arg(long, short = 'd')]
        detach: bool,
        id: String,
        /// runc's command-line form of the process (without --process): refused.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        command: Vec<String>,
    },
    /// The copy of a detached exec that waits for its command (internal).
    #[command(name = "__exec-wait", hide = true)]
    ExecWait {
        #[arg(long)]
        word: PathBuf,
        #[arg(long)]
        process: Option<PathBuf>,
        #[arg(long = "console-socket")]
        console_socket: Option<PathBuf>,
        id: String,
    },
    /// Change a running container's memory, pids and CPU limits: lower them, or raise
    /// them again up to its contract's ceilings (`--resources FILE`, `-` for stdin: the
    /// spec's linux.resources as JSON, what containerd's shim passes).
    Update {
        #[arg(long, short = 'r')]
        resources: Option<PathBuf>,
        id: String,
    },
    /// Freeze every process of the container's cell.
    Pause { id: String },
    /// Thaw a paused container's cell.
    Resume { id: String },
    /// The cell's counters as runc's stats events: one (`--stats`), or one every
    /// `--interval` until the container stops.
    Events {
        #[arg(long)]
        stats: bool,
        #[arg(long, default_value = "5s")]
        interval: String,
        id: String,
    },
    /// The supervisor `create` starts (internal).
    #[command(name = "__supervise", hide = true)]
    Supervise {
        #[arg(long)]
        bundle: PathBuf,
        #[arg(long = "console-socket")]
        console_socket: Option<PathBuf>,
        id: String,
    },
}

/// True when this binary was started as `airlock-runc` (a symlink or a copy).
pub fn invoked_as_runtime() -> bool {
    std::env::args_os()
        .next()
        .map(PathBuf::from)
        .and_then(|p| p.file_name().map(|n| n == "airlock-runc"))
        .unwrap_or(false)
}

/// `airlock-runc ARGS` or `airlock oci ARGS`: `args` start with the program's name.
pub fn main(args: impl IntoIterator<Item = std::ffi::OsString>) -> ExitCode {
    let cli = OciCli::parse_from(args);
    let log = Log {
        path: cli.log.clone(),
        json: cli.log_format == "json",
        stderr: true,
    };
    let globals = commands::Globals {
        root: cli.root,
        log: cli.log,
        log_format: cli.log_format,
        systemd_cgroup: cli.systemd_cgroup,
    };
    match commands::dispatch(&globals, cli.command) {
        Ok(code) => code,
        Err(err) => {
            log.error(&err);
            ExitCode::from(1)
        }
    }
}

/// Where errors go: the `--log` file (for the shim, which reports the last error line),
/// and stderr unless it is the container's (the supervisor's).
pub(crate) struct Log {
    pub(crate) path: Option<PathBuf>,
    pub(crate) json: bool,
    pub(crate) stderr: bool,
}

impl Log {
    pub(crate) fn error(&self, message: &str) {
        if self.stderr {
            eprintln!("airlock-runc: {message}");
        }
        let Some(path) = &self.path else {
            return;
        };
        let line = if self.json {
            serde_json::json!({"level": "error", "msg": message, "time": now_rfc3339()}).to_string()
        } else {
            format!("airlock-runc: {message}")
        };
        append_line(path, &line);
    }
}

pub(crate) fn append_line(path: &Path, line: &str) {
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path);
    if let Ok(mut file) = file {
        let _ = writeln!(file, "{line}");
    }
}

/// Now as RFC 3339 in UTC (the state's `created`), without a date crate.
pub(crate) fn now_rfc3339() -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let secs = now.as_secs() as i64;
    let (days, rem) = (secs.div_euclid(86400), secs.rem_euclid(86400));
    // Howard Hinnant's days-to-civil.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:09}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        now.subsec_nanos()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shims_command_lines_parse() {
        let parse = |line: &str| OciCli::try_parse_from(line.split(' ')).map(|c| c.command);
        assert!(matches!(
            parse("airlock-runc --root /run/r --log /b/log.json --log-format json --systemd-cgroup create --bundle /b --pid-file /b/init.pid c1"),
            Ok(OciCommand::Create { ref id, .. }) if id == "c1"
        ));
        assert!(matches!(
            parse("airlock-runc --root /r kill --all c1 9"),
            Ok(OciCommand::Kill { all: true, ref signal, .. }) if signal == "9"
        ));
        assert!(matches!(
            parse("airlock-runc --root /r delete --force c1"),
            Ok(OciCommand::Delete { force: true, .. })
        ));
        assert!(matches!(
            parse("airlock-runc --root /r ps --format json c1"),
            Ok(OciCommand::Ps { .. })
        ));
        assert!(matches!(
            parse("airlock-runc --root /r update --resources=- c1"),
            Ok(OciCommand::Update { resources: Some(ref r), .. }) if r.as_os_str() == "-"
        ));
        assert!(matches!(
            parse("airlock-runc --root /r events --stats c1"),
            Ok(OciCommand::Events { stats: true, .. })
        ));
        assert!(matches!(
            parse("airlock-runc --root /r events --interval=5s c1"),
            Ok(OciCommand::Events { stats: false, ref interval, .. }) if interval == "5s"
        ));
        assert!(matches!(
            parse("airlock-runc state c1"),
            Ok(OciCommand::State { .. })
        ));
        // go-runc's exec: --process first, then its options, then the id.
        assert!(matches!(
            parse("airlock-runc --root /r exec --process /tmp/p.json --pid-file /b/e.pid --console-socket /tmp/c.sock --detach c1"),
            Ok(OciCommand::Exec { detach: true, ref id, console_socket: Some(_), process: Some(_), .. }) if id == "c1"
        ));
        assert!(matches!(
            parse("airlock-runc --root /r create --bundle /b --pid-file /b/p --console-socket /tmp/c.sock c1"),
            Ok(OciCommand::Create { console_socket: Some(_), .. })
        ));
    }

    #[test]
    fn the_created_time_is_rfc3339() {
        let now = now_rfc3339();
        assert_eq!(now.len(), 30, "{now}");
        assert!(now.starts_with("20") && now.ends_with('Z'), "{now}");
    }
}
