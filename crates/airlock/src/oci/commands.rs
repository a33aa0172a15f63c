//! The runtime's commands on a container's state directory. `create` starts the
//! supervisor (supervise.rs) and waits for its word; the others read the state and
//! signal processes.

use super::state::{self, Status, Stored};
use super::{OciCommand, DEFAULT_ROOT};
use std::io::{Read, Write};
use std::os::unix::fs::DirBuilderExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// How long `create` waits for the cell and the begin record.
const CREATE_TIMEOUT: Duration = Duration::from_secs(120);

/// The global options the supervisor is started with too.
pub struct Globals {
    pub root: PathBuf,
    pub log: Option<PathBuf>,
    pub log_format: String,
    /// `--systemd-cgroup`: how `linux.cgroupsPath` is read.
    pub systemd_cgroup: bool,
}

pub fn dispatch(globals: &Globals, command: OciCommand) -> Result<ExitCode, String> {
    let root = globals.root.as_path();
    match command {
        OciCommand::Create {
            bundle,
            pid_file,
            console_socket,
            id,
            ..
        } => create(
            globals,
            &bundle,
            (pid_file.as_deref(), console_socket.as_deref()),
            &id,
        ),
        OciCommand::Start { id } => start(root, &id),
        OciCommand::State { id } => {
            let stored = state::load(root, &id)?;
            println!("{:#}", state::state_json(&stored));
            Ok(ExitCode::SUCCESS)
        }
        OciCommand::Kill { all, id, signal } => kill(root, &id, &signal, all),
        OciCommand::Delete { force, id } => delete(globals, &id, force),
        OciCommand::Ps { format, id, .. } => ps(root, &id, &format),
        OciCommand::Features => {
            println!("{:#}", features());
            Ok(ExitCode::SUCCESS)
        }
        OciCommand::Exec {
            process,
            pid_file,
            console_socket,
            detach,
            id,
            ..
        } => super::exec::exec(
            globals,
            super::exec::ExecArgs {
                process,
                pid_file,
                console_socket,
                detach,
                id,
            },
        ),
        OciCommand::ExecWait {
            word,
            process,
            console_socket,
            id,
        } => {
            let args = super::exec::ExecArgs {
                process,
                pid_file: None,
                console_socket,
                detach: false,
                id,
            };
            Ok(super::exec::exec_wait(globals, args, &word))
        }
        OciCommand::Update { resources, id } => {
            super::resources::update(root, &id, resources.as_deref())
        }
        OciCommand::Pause { id } => super::resources::pause(root, &id),
        OciCommand::Resume { id } => super::resources::resume(root, &id),
        OciCommand::Events {
            stats,
            interval,
            id,
        } => super::resources::events(root, &id, stats, &interval),
        OciCommand::Supervise {
            bundle,
            console_socket,
            id,
        } => Ok(super::supervise::supervise(
            globals,
            &bundle,
            console_socket.as_deref(),
            &id,
        )),
    }
}

/// Starts the supervisor and returns once it says the container is created (the cell
/// built, the begin record written), with its pid in `pid_file`; or fails with its
/// error, leaving nothing behind.
fn create(
    globals: &Globals,
    bundle: &Path,
    (pid_file, console_socket): (Option<&Path>, Option<&Path>),
    id: &str,
) -> Result<ExitCode, String> {
    let dir = state::dir(&globals.root, id)?;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o711)
        .create(&globals.root)
        .map_err(|e| format!("state root {}: {e}", globals.root.display()))?;
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&dir)
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::AlreadyExists => format!("container with id exists: {id}"),
            _ => format!("state directory {}: {e}", dir.display()),
        })?;
    let outcome = spawn_supervisor(globals, (bundle, console_socket), id, &dir);
    match outcome {
        Ok(pid) => {
            if let Some(path) = pid_file {
                write_pid_file(path, pid)?;
            }
            Ok(ExitCode::SUCCESS)
        }
        Err(err) => {
            let _ = std::fs::remove_dir_all(&dir);
            Err(err)
        }
    }
}

fn spawn_supervisor(
    globals: &Globals,
    (bundle, console_socket): (&Path, Option<&Path>),
    id: &str,
    dir: &Path,
) -> Result<u32, String> {
    let bundle = std::path::absolute(bundle).map_err(|e| format!("--bundle: {e}"))?;
    let listener = UnixListener::bind(state::notify_socket(dir))
        .and_then(|l| l.set_nonblocking(true).map(|()| l))
        .map_err(|e| format!("create's socket in {}: {e}", dir.display()))?;
    let exe = std::env::current_exe().map_err(|e| format!("this binary: {e}"))?;
    let mut command = std::process::Command::new(exe);
    command.arg("oci").arg("--root").arg(&globals.root);
    if let Some(log) = &globals.log {
        command.arg("--log").arg(log);
    }
    command
        .args([
            "--log-format",
            &globals.log_format,
            "__supervise",
            "--bundle",
        ])
        .arg(&bundle);
    if globals.systemd_cgroup {
        command.arg("--systemd-cgroup");
    }
    if let Some(console) = console_socket {
        let console = std::path::absolute(console).map_err(|e| format!("--console-socket: {e}"))?;
        command.arg("--console-socket").arg(console);
        // The payload's stdio is its terminal; the caller's stdio (go-runc reads it to
        // its end before `create` counts as returned) must not stay open in here.
        command
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null());
    }
    command.arg(id);
    // The container's stdio (the shim's pipes) are inherited: they are the payload's.
    let mut child = command
        .spawn()
        .map_err(|e| format!("starting the supervisor: {e}"))?;
    let until = Instant::now() + CREATE_TIMEOUT;
    let word = loop {
        if Instant::now() > until {
            // Fail closed: a cell that is not built in time is ended, not waited for.
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!(
                "the container was not created within {} s",
                CREATE_TIMEOUT.as_secs()
            ));
        }
        match listener.accept() {
            Ok((mut stream, _)) => {
                let mut word = String::new();
                let _ = stream.set_nonblocking(false);
                let _ = stream.read_to_string(&mut word);
                break word;
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if let Ok(Some(status)) = child.try_wait() {
                    return Err(format!(
                        "the supervisor ended ({status}) before the container was created"
                    ));
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            Err(e) => return Err(format!("create's socket: {e}")),
        }
    };
    let _ = std::fs::remove_file(state::notify_socket(dir));
    match word.strip_prefix("ok") {
        Some(_) => Ok(child.id()),
        None => {
            let _ = child.wait();
            Err(word.trim().trim_start_matches("error: ").to_owned())
        }
    }
}

pub(super) fn write_pid_file(path: &Path, pid: u32) -> Result<(), String> {
    let tmp = path.with_extension("airlock-tmp");
    std::fs::write(&tmp, pid.to_string())
        .and_then(|()| std::fs::rename(&tmp, path))
        .map_err(|e| format!("--pid-file {}: {e}", path.display()))
}

/// Releases the held payload: the supervisor waits on the start socket.
fn start(root: &Path, id: &str) -> Result<ExitCode, String> {
    let stored = state::load(root, id)?;
    match state::status(&stored) {
        Status::Created => {}
        other => {
            return Err(format!(
                "cannot start a container that is {}: {id}",
                other.as_str()
            ))
        }
    }
    let dir = state::dir(root, id)?;
    let mut stream = UnixStream::connect(state::start_socket(&dir))
        .map_err(|e| format!("container {id}: its supervisor does not answer: {e}"))?;
    stream
        .write_all(b"start")
        .and_then(|()| stream.shutdown(std::net::Shutdown::Write))
        .map_err(|e| format!("container {id}: start: {e}"))?;
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    if answer.trim() != "ok" {
        return Err(format!("container {id} did not start: {}", answer.trim()));
    }
    Ok(ExitCode::SUCCESS)
}

/// The cell's pid 1 (the supervisor's child) and the payload's processes under it.
fn cell_processes(stored: &Stored) -> (Vec<u32>, Vec<u32>) {
    let children = state::descendants(stored.pid);
    let direct: Vec<u32> = std::fs::read_dir(format!("/proc/{}/task", stored.pid))
        .into_iter()
        .flatten()
        .flatten()
        .flat_map(|t| {
            std::fs::read_to_string(t.path().join("children"))
                .unwrap_or_default()
                .split_whitespace()
                .filter_map(|c| c.parse().ok())
                .collect::<Vec<u32>>()
        })
        .collect();
    let payload = children
        .into_iter()
        .filter(|p| !direct.contains(p))
        .collect();
    (direct, payload)
}

/// SIGKILL to every process of the payload (pid 1 reports their end).
fn kill_payload(stored: &Stored) {
    let (_, payload) = cell_processes(stored);
    for pid in payload {
        let _ = state::signal(pid, libc::SIGKILL);
    }
}

fn kill(root: &Path, id: &str, signal: &str, all: bool) -> Result<ExitCode, String> {
    let signal = state::parse_signal(signal)?;
    let stored = state::load(root, id)?;
    match state::status(&stored) {
        Status::Stopped => Err(format!("container {id} not running")),
        // No payload yet: the container ends with its supervisor (the cell dies with it;
        // the begin record is reaped as aborted).
        Status::Created => state::signal(stored.pid, libc::SIGKILL)
            .map(|()| ExitCode::SUCCESS)
            .map_err(|e| format!("container {id}: kill: {e}")),
        status @ (Status::Running | Status::Paused) => {
            let (pid1s, payload) = cell_processes(&stored);
            let targets: Vec<u32> = if all {
                payload
            } else {
                // The payload's first process: the oldest child of the cell's pid 1 (its
                // execs and the orphans it adopted came later).
                payload
                    .into_iter()
                    .filter(|p| pid1s.iter().any(|p1| parent_of(*p) == Some(*p1)))
                    .min_by_key(|p| state::proc_stat(*p).map_or(u64::MAX, |(_, start)| start))
                    .into_iter()
                    .collect()
            };
            for pid in targets {
                let _ = state::signal(pid, signal);
            }
            // As runc: a paused container is thawed for SIGKILL only (other signals wait).
            if status == Status::Paused && signal == libc::SIGKILL {
                super::resources::thaw_after_kill(&stored);
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn parent_of(pid: u32) -> Option<u32> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &text[text.rfind(')')? + 2..];
    rest.split(' ').nth(1)?.parse().ok()
}

fn delete(globals: &Globals, id: &str, force: bool) -> Result<ExitCode, String> {
    let root = globals.root.as_path();
    let stored = state::load(root, id)?;
    let dir = state::dir(root, id)?;
    match state::status(&stored) {
        Status::Stopped => {}
        status @ (Status::Running | Status::Paused) if force => {
            // The payload is killed; the supervisor completes the record and ends.
            kill_payload(&stored);
            if status == Status::Paused {
                super::resources::thaw_after_kill(&stored);
            }
            // A native container's `start` answers once its payload runs (StartAnswer in
            // supervise.rs); a gVisor container's at once, so its payload may not exist
            // yet. Whatever payload appears is killed as it appears.
            wait_gone(&stored, Duration::from_secs(10), || kill_payload(&stored));
        }
        Status::Created if force => {
            let _ = state::signal(stored.pid, libc::SIGKILL);
            wait_gone(&stored, Duration::from_secs(10), || {});
        }
        status => {
            return Err(format!(
                "cannot delete container {id} that is not stopped: {}",
                status.as_str()
            ))
        }
    }
    super::resources::remove_abandoned_cgroup(&stored, globals.systemd_cgroup)?;
    std::fs::remove_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    Ok(ExitCode::SUCCESS)
}

/// Waits for the supervisor to end, running `meanwhile` between looks; SIGKILL once
/// `grace` has passed.
fn wait_gone(stored: &Stored, grace: Duration, meanwhile: impl Fn()) {
    let until = Instant::now() + grace;
    while state::alive(stored.pid, stored.pid_start) {
        meanwhile();
        if Instant::now() > until {
            let _ = state::signal(stored.pid, libc::SIGKILL);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn ps(root: &Path, id: &str, format: &str) -> Result<ExitCode, String> {
    let stored = state::load(root, id)?;
    let pids: Vec<u32> = match state::status(&stored) {
        Status::Stopped => Vec::new(),
        _ => std::iter::once(stored.pid)
            .chain(state::descendants(stored.pid))
            .collect(),
    };
    match format {
        "json" => println!("{}", serde_json::json!(pids)),
        _ => {
            println!("PID");
            for pid in pids {
                println!("{pid}");
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The runtime-spec's features document: what a spec may use here.
fn features() -> serde_json::Value {
    serde_json::json!({
        "ociVersionMin": "1.0.0",
        "ociVersionMax": "1.1.0",
        "hooks": [],
        "mountOptions": ["bind", "rbind", "ro"],
        "linux": {
            "namespaces": ["cgroup", "ipc", "mount", "network", "pid", "user", "uts"],
            "capabilities": [],
            "cgroup": {"v1": true, "v2": true, "systemd": false, "systemdUser": false},
            "seccomp": {"enabled": true, "actions": ["SCMP_ACT_ERRNO", "SCMP_ACT_KILL", "SCMP_ACT_KILL_PROCESS", "SCMP_ACT_ALLOW"]},
            "apparmor": {"enabled": false},
            "selinux": {"enabled": false},
            "intelRdt": {"enabled": false}
        },
        "annotations": {
            "io.github.airlock.runtime": "airlock",
            "io.github.airlock.state-root": DEFAULT_ROOT
        }
    })
}
