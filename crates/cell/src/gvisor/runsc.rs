//! The `runsc` command line, one sandbox at a time: `create`, `start`, `kill`, `delete`,
//! each with the cell's own state directory (`--root`) and the same global flags (runsc
//! reads its configuration from the flags of every call, not from its state). Never
//! `runsc do`, which builds its own bundle and network.
//!
//! Not `runsc wait`: this runsc (Debian 12's, 20221219) loses the status when the
//! sandbox exits before or while `wait` asks it ("sandbox no longer running and its exit
//! status is unavailable", every time for `/bin/true`). The sandbox process exits with the
//! payload's status itself, so the supervisor is its child subreaper (it is orphaned when
//! `runsc create` exits) and reads the status with `wait4` on the pid `create` wrote.

use crate::error::CellError;
use crate::protocol::ExecFailure;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Where the runsc binary is looked for when `AIRLOCK_RUNSC` does not name one.
const SEARCH_PATH: &[&str] = &["/usr/bin", "/usr/local/bin", "/usr/sbin", "/usr/local/sbin"];

/// The runsc binary and its identity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunscBinary {
    pub path: PathBuf,
    /// `runsc --version`'s first line (`runsc version 0.0~20221219.0`).
    pub version: String,
}

/// The platform runsc runs the Sentry on. `ptrace` needs no device; `kvm` needs a
/// `/dev/kvm` that can run a guest, which these machines' cannot.
pub const PLATFORM: &str = "ptrace";

impl RunscBinary {
    /// `AIRLOCK_RUNSC`, else `runsc` in the usual directories: an executable file.
    /// Missing: the tier cannot be enforced (`sandbox_unavailable`). Whether it works is
    /// seen at `create` (a runsc that logs nothing is not one, see [`Runsc::create`]) and
    /// by `doctor` ([`RunscBinary::locate_and_ask`]); a run does not pay for another
    /// runsc process to ask its version.
    pub fn locate() -> Result<PathBuf, CellError> {
        use std::os::unix::fs::PermissionsExt;
        let path = match std::env::var_os("AIRLOCK_RUNSC") {
            Some(path) => PathBuf::from(path),
            None => SEARCH_PATH
                .iter()
                .map(|dir| Path::new(dir).join("runsc"))
                .find(|p| p.is_file())
                .ok_or_else(|| unavailable("no runsc binary in /usr/bin, /usr/local/bin, /usr/sbin or /usr/local/sbin (install Debian's runsc package)".into()))?,
        };
        match std::fs::metadata(&path) {
            Ok(meta) if meta.is_file() && meta.permissions().mode() & 0o111 != 0 => Ok(path),
            Ok(_) => Err(unavailable(format!(
                "{} is not an executable file",
                path.display()
            ))),
            Err(e) => Err(unavailable(format!("{}: {e}", path.display()))),
        }
    }

    /// [`RunscBinary::locate`], and its version must answer (`doctor`).
    pub fn locate_and_ask() -> Result<RunscBinary, CellError> {
        let path = RunscBinary::locate()?;
        let output = Command::new(&path)
            .arg("--version")
            .stdin(Stdio::null())
            .output()
            .map_err(|e| unavailable(format!("{}: {e}", path.display())))?;
        let text = String::from_utf8_lossy(&output.stdout);
        let version = text.lines().next().unwrap_or("").trim().to_string();
        if !output.status.success() || !version.starts_with("runsc version") {
            return Err(unavailable(format!(
                "{} --version did not answer as runsc ({}): {}",
                path.display(),
                output.status,
                String::from_utf8_lossy(&output.stderr).trim()
            )));
        }
        Ok(RunscBinary { path, version })
    }
}

fn unavailable(reason: String) -> CellError {
    CellError::Unavailable {
        control: "gvisor.runsc",
        reason,
    }
}

/// One sandbox's runsc: the binary, its state directory and the container id.
pub struct Runsc {
    binary: PathBuf,
    state: PathBuf,
    log: PathBuf,
    pub id: String,
}

/// How the sandbox ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitOutcome {
    /// The container's init process ended with this status (runsc reports a signal
    /// death as 128 + the signal).
    Exited(i32),
    /// The sandbox itself died (killed from outside: the memory or pids ceiling, the
    /// deadline's kill) and runsc has no status for the payload.
    SandboxGone,
}

impl Runsc {
    pub fn new(binary: &Path, state: &Path, log: &Path, id: &str) -> Runsc {
        Runsc {
            binary: binary.to_path_buf(),
            state: state.to_path_buf(),
            log: log.to_path_buf(),
            id: id.to_string(),
        }
    }

    fn command(&self) -> Command {
        let mut command = Command::new(&self.binary);
        command
            .arg(format!("--root={}", self.state.display()))
            .arg("--network=none")
            // The spec's `linux.seccomp` (the plan's policy, crates/oci) is applied by the
            // Sentry to the payload's calls; without this flag runsc ignores it.
            .arg("--oci-seccomp")
            .arg(format!("--platform={PLATFORM}"))
            .arg(format!("--log={}", self.log.display()))
            // runsc's own errors go to its log, not to the payload's stderr pipe.
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        command
    }

    /// `runsc create`: the sandbox (Sentry and gofer) is built, the payload not started.
    /// `stdio` becomes the payload's stdin, stdout and stderr.
    /// Returns the sandbox process's pid (from `--pid-file`).
    pub fn create(&self, bundle: &Path, stdio: [OwnedFd; 3]) -> Result<libc::pid_t, CellError> {
        let [stdin, stdout, stderr] = stdio;
        let pid_file = bundle.join("sandbox.pid");
        let mut command = self.command();
        command
            .arg("create")
            .arg(format!("--bundle={}", bundle.display()))
            .arg(format!("--pid-file={}", pid_file.display()))
            .arg(&self.id)
            .stdin(Stdio::from(stdin))
            .stdout(Stdio::from(stdout))
            .stderr(Stdio::from(stderr));
        self.run(command, "create")?;
        std::fs::read_to_string(&pid_file)
            .ok()
            .and_then(|text| text.trim().parse().ok())
            .filter(|pid: &libc::pid_t| *pid > 1)
            .ok_or_else(|| CellError::Launch {
                stage: "runsc create".into(),
                message: format!("no sandbox pid in {}", pid_file.display()),
            })
    }

    pub fn start(&self) -> Result<(), CellError> {
        let mut command = self.command();
        command.arg("start").arg(&self.id);
        self.run(command, "start")
    }

    /// Signals every process of the container (`--all`).
    pub fn kill_all(&self, signal: &str) -> Result<(), CellError> {
        let mut command = self.command();
        command.args(["kill", "--all"]).arg(&self.id).arg(signal);
        self.run(command, "kill")
    }

    /// `runsc delete --force`: the sandbox's processes are killed and its state removed.
    pub fn delete(&self) -> Result<(), CellError> {
        let mut command = self.command();
        command.args(["delete", "--force"]).arg(&self.id);
        self.run(command, "delete")
    }

    fn run(&self, mut command: Command, step: &str) -> Result<(), CellError> {
        let status = command.status().map_err(|e| {
            // The binary cannot even be started (ENOEXEC, EACCES, ...): no tier.
            unavailable(format!("starting {} {step}: {e}", self.binary.display()))
        })?;
        if status.success() {
            return Ok(());
        }
        if std::fs::metadata(&self.log).map_or(true, |m| m.len() == 0) {
            // A runsc logs why it failed; a binary that failed silently is not one.
            return Err(unavailable(format!(
                "{} {step} exited {status} without logging anything: not a working runsc",
                self.binary.display()
            )));
        }
        Err(CellError::Launch {
            stage: format!("runsc {step}"),
            message: format!("{status}: {}", last_log_line(&self.log)),
        })
    }
}

/// What runsc last logged: its error, when a call failed.
fn last_log_line(log: &Path) -> String {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("(runsc logged nothing)")
        .chars()
        .take(600)
        .collect()
}

/// The payload's exec failure in a failed `runsc start`, as the native cell reports one:
/// runsc looks the command up on the plan's PATH and loads it itself at `start`, so a
/// command it cannot find (`error finding executable`) is 127 and one it finds but cannot
/// load (`failed to load <path>: <why>`: permission denied, a directory, not an
/// executable format) is 126. `None` for any other failure, which stays the tier's.
pub fn exec_failure(err: &CellError, argv: &[String]) -> Option<ExecFailure> {
    let CellError::Launch { stage, message } = err else {
        return None;
    };
    if stage != "runsc start" {
        return None;
    }
    let path = argv.first().cloned().unwrap_or_default();
    if message.contains("error finding executable") {
        return Some(ExecFailure {
            status: 127,
            path,
            reason: "command not found".into(),
        });
    }
    let (_, why) = message.split_once("failed to load ")?;
    let why = why.split('"').next().unwrap_or(why);
    let (loaded, reason) = why.split_once(": ")?;
    let reason = reason.trim();
    Some(ExecFailure {
        // ENOENT is 127 wherever it comes from, as `sys::exec_failure_status` says.
        status: if reason == "no such file or directory" {
            127
        } else {
            126
        },
        path: loaded.to_string(),
        reason: reason.to_string(),
    })
}

/// How the sandbox process ended (its `wait4` status): it exits with the payload's
/// status; killed by a signal, it was killed from outside and has none.
pub fn sandbox_outcome(status: i32) -> WaitOutcome {
    if libc::WIFEXITED(status) {
        WaitOutcome::Exited(libc::WEXITSTATUS(status))
    } else {
        WaitOutcome::SandboxGone
    }
}

/// The payload's wait status (as `waitpid` gives it) for runsc's exit status. runsc
/// reports a signal death as 128 + the signal, as a shell does; a status in 129..=192 is
/// read as that signal, which an `exit(137)` of the payload cannot be told from.
pub fn wait_status(exit_status: i32) -> i32 {
    match exit_status {
        129..=192 => exit_status - 128,
        code => (code & 0xff) << 8,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sandbox_exit_is_the_payloads_and_a_signal_means_it_was_killed_from_outside() {
        assert_eq!(sandbox_outcome(3 << 8), WaitOutcome::Exited(3));
        assert_eq!(sandbox_outcome(137 << 8), WaitOutcome::Exited(137));
        assert_eq!(sandbox_outcome(libc::SIGKILL), WaitOutcome::SandboxGone);
    }

    #[test]
    fn a_command_runsc_cannot_find_or_load_is_the_payloads_exec_failure() {
        let start = |message: &str| CellError::Launch {
            stage: "runsc start".into(),
            message: message.into(),
        };
        let argv = vec!["tool".to_string()];
        let missing = start(
            r#"exit status: 128: {"msg":"starting container: starting root container: starting sandbox: error finding executable \"tool\" in PATH [/usr/bin]: no such file or directory","level":"error"}"#,
        );
        let failure = exec_failure(&missing, &argv).unwrap();
        assert_eq!((failure.status, failure.path.as_str()), (127, "tool"));
        let denied = start(
            r#"exit status: 128: {"msg":"starting container: starting root container: starting sandbox: creating process: failed to load /usr/lib/os-release: permission denied","level":"error"}"#,
        );
        let failure = exec_failure(&denied, &argv).unwrap();
        assert_eq!(failure.status, 126);
        assert_eq!(failure.describe(), "/usr/lib/os-release: permission denied");
        let absent = start(
            r#"exit status: 128: {"msg":"starting sandbox: creating process: failed to load /no/such/tool: no such file or directory"}"#,
        );
        assert_eq!(exec_failure(&absent, &argv).unwrap().status, 127);
        // Any other failure of start, or of another step, stays the tier's.
        assert!(exec_failure(&start("exit status: 128: cgroup gone"), &argv).is_none());
        let create = CellError::Launch {
            stage: "runsc create".into(),
            message: "error finding executable".into(),
        };
        assert!(exec_failure(&create, &argv).is_none());
    }

    #[test]
    fn runsc_statuses_become_wait_statuses() {
        for (runsc, exited, code, signal) in [
            (0, true, 0, 0),
            (3, true, 3, 0),
            (128, true, 128, 0),
            (137, false, 0, libc::SIGKILL),
            (143, false, 0, libc::SIGTERM),
            (255, true, 255, 0),
        ] {
            let status = wait_status(runsc);
            assert_eq!(libc::WIFEXITED(status), exited, "{runsc}");
            if exited {
                assert_eq!(libc::WEXITSTATUS(status), code, "{runsc}");
            } else {
                assert_eq!(libc::WTERMSIG(status), signal, "{runsc}");
            }
        }
    }
}
