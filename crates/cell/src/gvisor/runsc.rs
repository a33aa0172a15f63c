//! The `runsc` command line, one sandbox at a time: `run`, `kill`, `delete`, each with the
//! cell's own state directory (`--root`) and the same global flags (runsc reads its
//! configuration from the flags of every call, not from its state). Never `runsc do`,
//! which builds its own bundle and network.
//!
//! One `runsc run` per payload: it creates the sandbox, starts the payload, waits for it
//! and deletes the sandbox in one Go process, a child of the supervisor, which exits with
//! the payload's status (128 + the signal for a signal death, as a shell reports it).
//! `create`, `start` and `delete` as three processes cost two more Go start-ups per run
//! (docs/benchmarks.md, the gVisor tier). `run` also keeps the status: this runsc (Debian
//! 12's, 20221219) loses it when a separate `runsc wait` asks after the sandbox exited
//! ("sandbox no longer running and its exit status is unavailable", every time for
//! `/bin/true`), while `run` reaps the sandbox process it started itself.
//! `kill --all` (the deadline's SIGTERM) and `delete --force` (a sandbox `run` did not
//! remove) are separate calls on the same state.

use crate::error::CellError;
use crate::protocol::ExecFailure;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// runsc's exit status when it failed itself (`Fatalf`), not the payload.
const RUNSC_FAILED: i32 = 128;

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

    /// `runsc run` of `bundle`, started and not waited for: `stdio` becomes the payload's
    /// stdin, stdout and stderr (runsc's own errors go to its log), or, with a
    /// `console_socket`, runsc's only (the payload's are the terminal's). The sandbox process's
    /// pid is written to the bundle's `sandbox.pid` (see [`Runsc::run_ended`]).
    pub fn spawn_run(
        &self,
        bundle: &Path,
        stdio: [OwnedFd; 3],
        console_socket: Option<&Path>,
    ) -> Result<Child, CellError> {
        let [stdin, stdout, stderr] = stdio;
        let mut command = self.command();
        command
            .arg("run")
            .arg(format!("--bundle={}", bundle.display()))
            .arg(format!("--pid-file={}", pid_file(bundle).display()));
        if let Some(socket) = console_socket {
            // A spec with `process.terminal`: runsc sends the pty's master there.
            command.arg(format!("--console-socket={}", socket.display()));
        }
        command
            .arg(&self.id)
            .stdin(Stdio::from(stdin))
            .stdout(Stdio::from(stdout))
            .stderr(Stdio::from(stderr));
        // `run` starts the sandbox and its gofer attached (they die with it): so the whole
        // sandbox dies with the supervisor, even one killed with SIGKILL.
        crate::sys::kill_with_spawner(&mut command);
        command.spawn().map_err(|e| {
            // The binary cannot even be started (ENOEXEC, EACCES, ...): no tier.
            unavailable(format!("starting {} run: {e}", self.binary.display()))
        })
    }

    /// How the payload ended, from the `wait4` status of `runsc run` (`None`: it was
    /// never reaped). A sandbox that was never created (no pid in `sandbox.pid`) is a
    /// launch failure, or no working runsc if it logged nothing; runsc's own failure
    /// (exit 128 with `running container: ...` in its log) is a launch failure, which
    /// [`exec_failure`] reads as the payload's when it could not find or load the
    /// command. Anything else is the payload's status.
    pub fn run_ended(&self, bundle: &Path, status: Option<i32>) -> Result<WaitOutcome, CellError> {
        let Some(status) = status.filter(|s| libc::WIFEXITED(*s)) else {
            // `runsc run` itself was killed (the deadline's last step): no status.
            return Ok(WaitOutcome::SandboxGone);
        };
        let code = libc::WEXITSTATUS(status);
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        let created = read_pid(&pid_file(bundle)).is_some();
        if !created && log.trim().is_empty() {
            // A runsc logs why it failed; a binary that failed silently is not one.
            return Err(unavailable(format!(
                "{} run exited {code} without creating a sandbox or logging anything: not a working runsc",
                self.binary.display()
            )));
        }
        if !created || (code == RUNSC_FAILED && log.contains("running container:")) {
            return Err(CellError::Launch {
                stage: "runsc run".into(),
                message: format!("exit status: {code}: {}", last_log_line(&self.log)),
            });
        }
        Ok(WaitOutcome::Exited(code))
    }

    /// `runsc exec` of the process spec in the file `process` in the running sandbox,
    /// started and not waited for: `stdio` becomes the command's stdin, stdout and
    /// stderr; its pid inside the sandbox is written to `internal_pid`. It exits with the
    /// command's status (128 + the signal for a signal death), and dies with this
    /// process (a command is never left running without its supervisor).
    pub fn spawn_exec(
        &self,
        process: &Path,
        internal_pid: &Path,
        stdio: [OwnedFd; 3],
    ) -> Result<Child, CellError> {
        let [stdin, stdout, stderr] = stdio;
        let mut command = self.command();
        command
            .arg("exec")
            .arg(format!("--process={}", process.display()))
            .arg(format!("--internal-pid-file={}", internal_pid.display()))
            .arg(&self.id)
            .stdin(Stdio::from(stdin))
            .stdout(Stdio::from(stdout))
            .stderr(Stdio::from(stderr));
        crate::sys::kill_with_spawner(&mut command);
        command
            .spawn()
            .map_err(|e| unavailable(format!("starting {} exec: {e}", self.binary.display())))
    }

    /// `runsc exec`'s own failure, from its `wait4` status: runsc's exit 128 before it
    /// wrote the command's pid (the command never started: the sandbox is gone, the
    /// process spec was refused), with what runsc logged. `None`: the status is the
    /// command's (its own `exit 128` included: its pid was written when it started).
    pub fn exec_failed(&self, status: Option<i32>, internal_pid: &Path) -> Option<CellError> {
        let code = status
            .filter(|s| libc::WIFEXITED(*s))
            .map(|s| libc::WEXITSTATUS(s))?;
        if code != RUNSC_FAILED || read_pid(internal_pid).is_some() {
            return None;
        }
        Some(CellError::Launch {
            stage: "runsc exec".into(),
            message: format!("exit status: {code}: {}", last_log_line(&self.log)),
        })
    }

    /// Signals one process of the container (`pid` as the sandbox sees it).
    pub fn kill_process(&self, pid: i32, signal: &str) -> Result<(), CellError> {
        let mut command = self.command();
        command
            .arg("kill")
            .arg(format!("--pid={pid}"))
            .arg(&self.id)
            .arg(signal);
        self.run(command, "kill")
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

pub(super) fn pid_file(bundle: &Path) -> PathBuf {
    bundle.join("sandbox.pid")
}

pub(super) fn read_pid(path: &Path) -> Option<libc::pid_t> {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|text| text.trim().parse().ok())
        .filter(|pid: &libc::pid_t| *pid > 1)
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

/// The payload's exec failure in a failed `runsc run`, as the native cell reports one:
/// runsc looks the command up on the plan's PATH and loads it itself when it starts the
/// payload, so a
/// command it cannot find (`error finding executable`) is 127 and one it finds but cannot
/// load (`failed to load <path>: <why>`: permission denied, a directory, not an
/// executable format) is 126. `None` for any other failure, which stays the tier's.
pub fn exec_failure(err: &CellError, argv: &[String]) -> Option<ExecFailure> {
    let CellError::Launch { stage, message } = err else {
        return None;
    };
    if stage != "runsc run" {
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

    /// A runsc of a temp dir's log and bundle: (runsc, bundle, its tempdir).
    fn fake(log: &str, pid: Option<&str>) -> (Runsc, PathBuf, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let log_path = dir.path().join("runsc.log");
        std::fs::write(&log_path, log).unwrap();
        if let Some(pid) = pid {
            std::fs::write(pid_file(dir.path()), pid).unwrap();
        }
        let runsc = Runsc::new(Path::new("/usr/bin/runsc"), dir.path(), &log_path, "c");
        (runsc, dir.path().to_path_buf(), dir)
    }

    #[test]
    fn runs_end_is_the_payloads_status_unless_runsc_failed_or_never_made_a_sandbox() {
        let exited = |code: i32| Some(code << 8);
        let (runsc, bundle, _dir) = fake("", Some("4242\n"));
        assert_eq!(
            runsc.run_ended(&bundle, exited(3)).unwrap(),
            WaitOutcome::Exited(3)
        );
        // 128 without runsc's error is the payload's own `exit 128`.
        assert_eq!(
            runsc.run_ended(&bundle, exited(128)).unwrap(),
            WaitOutcome::Exited(128)
        );
        // runsc run killed itself (the deadline's last step): no status of the payload.
        assert_eq!(
            runsc.run_ended(&bundle, Some(libc::SIGKILL)).unwrap(),
            WaitOutcome::SandboxGone
        );
        assert_eq!(
            runsc.run_ended(&bundle, None).unwrap(),
            WaitOutcome::SandboxGone
        );
        let failed = r#"{"msg":"running container: starting container: creating process: failed to load /x: permission denied","level":"error"}"#;
        let (runsc, bundle, _dir) = fake(failed, Some("4242"));
        let err = runsc.run_ended(&bundle, exited(128)).unwrap_err();
        assert!(
            matches!(&err, CellError::Launch { stage, .. } if stage == "runsc run"),
            "{err}"
        );
        assert_eq!(exec_failure(&err, &["x".into()]).unwrap().status, 126);
        // No sandbox was made: runsc's failure if it said why, no runsc at all if not.
        let (runsc, bundle, _dir) = fake("creating container: cgroup: permission denied", None);
        assert!(matches!(
            runsc.run_ended(&bundle, exited(0)),
            Err(CellError::Launch { .. })
        ));
        let (runsc, bundle, _dir) = fake("", None);
        let err = runsc.run_ended(&bundle, exited(0)).unwrap_err();
        assert!(
            matches!(
                err,
                CellError::Unavailable {
                    control: "gvisor.runsc",
                    ..
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn a_command_runsc_cannot_find_or_load_is_the_payloads_exec_failure() {
        let start = |message: &str| CellError::Launch {
            stage: "runsc run".into(),
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
        // Any other failure of run, or of another step, stays the tier's.
        assert!(exec_failure(&start("exit status: 128: cgroup gone"), &argv).is_none());
        let create = CellError::Launch {
            stage: "runsc kill".into(),
            message: "error finding executable".into(),
        };
        assert!(exec_failure(&create, &argv).is_none());
    }

    #[test]
    fn an_exec_that_never_started_its_command_is_runscs_failure_not_the_commands() {
        let exited = |code: i32| Some(code << 8);
        let (runsc, dir, _tmp) = fake(r#"{"msg":"loading sandbox: file does not exist"}"#, None);
        let pid = dir.join("exec-1.pid");
        let err = runsc.exec_failed(exited(128), &pid).expect("runsc failed");
        assert!(err.to_string().contains("loading sandbox"), "{err}");
        // Any other status, or the command's own 128 once it started, is the command's.
        assert!(runsc.exec_failed(exited(3), &pid).is_none());
        assert!(runsc.exec_failed(Some(libc::SIGKILL), &pid).is_none());
        std::fs::write(&pid, "7").unwrap();
        assert!(runsc.exec_failed(exited(128), &pid).is_none());
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
