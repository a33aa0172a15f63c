//! `airlock oci exec --process process.json --pid-file F [--detach] [--console-socket S]
//! ID`: a further process in a running container's cell, what `ctr task exec` and
//! `kubectl exec` reach through containerd's runc shim.
//!
//! The process is a child of the cell's pid 1 (airlock_cell::exec_door), asked for at the
//! supervisor's door in the state directory: it has the container payload's confinement
//! (identity, no capabilities, Landlock, seccomp, namespaces, cgroup and ceilings), never
//! a weaker one. process.json is checked first (airlock_oci::exec, pure). This process
//! waits for the command's end and exits with its status (128+n for a signal), forwarding
//! the signals it gets: its pid is the one in `--pid-file`. With `--detach` (what the
//! shim passes) a copy of it (`oci __exec-wait`) does that and this one exits once the
//! command started; the copy is reparented to the shim, a child subreaper, which reaps
//! it as runc's shim reaps a detached runc exec's process.
//!
//! Each exec is a run record of its own: a command of the container's run (its
//! `session_id` is the container's run id), with the container's identity and workload
//! class; a refused one is recorded as `policy_denied`.

use super::commands::Globals;
use super::state::{self, Status};
use airlock_cell::exec_door::{self, ExecClient, ExecEvent, ExecRequest};
use airlock_cell::report::{ExitInfo, ResultClass, RunReport};
use airlock_oci::bundle::ContainerIdentity;
use airlock_oci::exec::{exec_terms, ExecTerms, RunningContainer};
use airlock_store::{RunHandle, RunStart, Store};
use serde::{Deserialize, Serialize};
use std::io::{Read, Write};
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// The supervisor's door for further commands, in the container's state directory.
pub fn door_socket(dir: &Path) -> PathBuf {
    dir.join("x")
}

/// The container's doors (airlock_cell::exec_door): the listener further commands are
/// asked for at, and the console socket, connected, when `create` was given one.
pub fn doors(
    dir: &Path,
    console: Option<&Path>,
) -> Result<airlock_cell::exec_door::ContainerDoors, String> {
    let exec = UnixListener::bind(door_socket(dir))
        .map_err(|e| format!("the exec socket in {}: {e}", dir.display()))?;
    let console = match console {
        Some(path) => Some(
            UnixStream::connect(path)
                .map_err(|e| format!("--console-socket {}: {e}", path.display()))?,
        ),
        None => None,
    };
    Ok(airlock_cell::exec_door::ContainerDoors {
        exec: Some(exec),
        console,
        cgroup: None,
        on_payload_started: None,
    })
}

/// What an exec needs to know of its container, written by the supervisor.
fn facts_path(dir: &Path) -> PathBuf {
    dir.join("exec.json")
}

/// How long a detached exec waits for its copy's word.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// The container as its supervisor planned it: its identity and working directory, and
/// what the exec's record carries of the container's.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ExecFacts {
    pub container: RunningContainer,
    pub contract_sha256: String,
    pub workload_class: String,
    pub identity: ContainerIdentity,
    /// The workload class (`airlock.dev/class`) that decided on the container's command,
    /// if one did: an exec's command would not be decided by it, so it is refused.
    pub decided_by_class: Option<String>,
}

impl ExecFacts {
    pub fn of(
        plan: &airlock_contract::CellPlan,
        class: &str,
        terms: &airlock_oci::bundle::ContainerTerms,
    ) -> Self {
        ExecFacts {
            container: RunningContainer {
                uid: plan.identity.uid,
                gid: plan.identity.gid,
                cwd: plan.workdir.clone(),
            },
            contract_sha256: plan.contract_sha256.clone(),
            workload_class: class.to_owned(),
            identity: terms.identity.clone(),
            decided_by_class: match &terms.selection {
                airlock_oci::bundle::Selection::Class(name) => Some(name.clone()),
                airlock_oci::bundle::Selection::Contract(_)
                | airlock_oci::bundle::Selection::Default => None,
            },
        }
    }

    pub fn save(&self, dir: &Path) -> std::io::Result<()> {
        std::fs::write(facts_path(dir), serde_json::to_vec(self)?)
    }

    fn load(dir: &Path, id: &str) -> Result<ExecFacts, String> {
        let text =
            std::fs::read(facts_path(dir)).map_err(|_| format!("container {id} does not exist"))?;
        serde_json::from_slice(&text).map_err(|e| format!("container {id}: exec.json: {e}"))
    }
}

/// The command line of an exec.
pub struct ExecArgs {
    pub process: Option<PathBuf>,
    pub pid_file: Option<PathBuf>,
    pub console_socket: Option<PathBuf>,
    pub detach: bool,
    pub id: String,
}

pub fn exec(globals: &Globals, args: ExecArgs) -> Result<ExitCode, String> {
    if args.detach {
        return detach(globals, &args);
    }
    let pid_file = args.pid_file.clone();
    run_exec(globals, &args, &mut |started| {
        started?;
        match &pid_file {
            Some(path) => super::commands::write_pid_file(path, std::process::id()),
            None => Ok(()),
        }
    })
}

/// The copy a detached exec started (`__exec-wait`): tells `word` how the start went.
pub fn exec_wait(globals: &Globals, args: ExecArgs, word: &Path) -> ExitCode {
    let mut told = false;
    let outcome = run_exec(globals, &args, &mut |started| {
        told = true;
        tell(word, &started)
    });
    match outcome {
        Ok(code) => code,
        Err(error) => {
            if !told {
                let _ = tell(word, &Err(error.clone()));
            }
            super::Log {
                path: globals.log.clone(),
                json: globals.log_format == "json",
                stderr: false,
            }
            .error(&error);
            ExitCode::from(1)
        }
    }
}

fn tell(word: &Path, started: &Result<(), String>) -> Result<(), String> {
    let text = match started {
        Ok(()) => "ok".to_owned(),
        Err(error) => format!("error: {error}"),
    };
    let mut stream = UnixStream::connect(word).map_err(|e| format!("exec's socket: {e}"))?;
    stream
        .write_all(text.as_bytes())
        .map_err(|e| format!("exec's socket: {e}"))?;
    started.clone()
}

/// Starts the copy that waits for the command, and returns once the command started
/// (its pid, the copy's, in `--pid-file`), or with the copy's error.
fn detach(globals: &Globals, args: &ExecArgs) -> Result<ExitCode, String> {
    let dir = state::dir(&globals.root, &args.id)?;
    if !dir.is_dir() {
        return Err(format!("container {} does not exist", args.id));
    }
    let word = dir.join(format!("e{}", std::process::id()));
    let _ = std::fs::remove_file(&word);
    let listener = UnixListener::bind(&word)
        .and_then(|l| l.set_nonblocking(true).map(|()| l))
        .map_err(|e| format!("exec's socket in {}: {e}", dir.display()))?;
    let result = spawn_waiter(globals, args, &word, &listener);
    let _ = std::fs::remove_file(&word);
    let pid = result?;
    if let Some(path) = &args.pid_file {
        super::commands::write_pid_file(path, pid)?;
    }
    Ok(ExitCode::SUCCESS)
}

fn spawn_waiter(
    globals: &Globals,
    args: &ExecArgs,
    word: &Path,
    listener: &UnixListener,
) -> Result<u32, String> {
    let exe = std::env::current_exe().map_err(|e| format!("this binary: {e}"))?;
    let mut command = std::process::Command::new(exe);
    command.arg("oci").arg("--root").arg(&globals.root);
    if let Some(log) = &globals.log {
        command.arg("--log").arg(log);
    }
    command.args(["--log-format", &globals.log_format, "__exec-wait", "--word"]);
    command.arg(word);
    if let Some(process) = &args.process {
        command.arg("--process").arg(process);
    }
    if let Some(console) = &args.console_socket {
        command.arg("--console-socket").arg(console);
        // The command's stdio is its terminal; the caller's stdio (go-runc reads it to its
        // end before `exec` counts as returned) must not stay open in the waiter.
        command
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null());
    }
    command.arg(&args.id);
    // The exec's stdio (the shim's pipes) are inherited: they are the command's.
    let mut child = command
        .spawn()
        .map_err(|e| format!("starting the exec's waiter: {e}"))?;
    let until = Instant::now() + START_TIMEOUT;
    let answer = loop {
        match listener.accept() {
            Ok((mut stream, _)) => {
                let mut answer = String::new();
                let _ = stream.set_nonblocking(false);
                let _ = stream.read_to_string(&mut answer);
                break answer;
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if let Ok(Some(status)) = child.try_wait() {
                    return Err(format!(
                        "the exec's waiter ended ({status}) before its start"
                    ));
                }
                if Instant::now() > until {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(format!(
                        "the exec did not start within {} s",
                        START_TIMEOUT.as_secs()
                    ));
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            Err(e) => return Err(format!("exec's socket: {e}")),
        }
    };
    match answer.strip_prefix("ok") {
        Some(_) => Ok(child.id()),
        None => {
            let _ = child.wait();
            Err(answer.trim().trim_start_matches("error: ").to_owned())
        }
    }
}

/// The exec from its checks to its end; `started` is called once, when the command was
/// exec'd or could not be. The command's exit code.
fn run_exec(
    globals: &Globals,
    args: &ExecArgs,
    started: &mut dyn FnMut(Result<(), String>) -> Result<(), String>,
) -> Result<ExitCode, String> {
    // Taken before anything runs: a signal the shim sends is the command's.
    let signals = exec_door::forward_signals().map_err(|e| format!("signals: {e}"))?;
    let id = &args.id;
    let checked = checked(globals, args)?;
    let record = ExecRecord::begin(
        checked.store,
        &checked.facts,
        &checked.container_run,
        &checked.terms.argv,
    )?;
    let client = ask(&checked.dir, &checked.terms).map_err(|e| format!("container {id}: {e}"))?;
    let start = await_start(&client, checked.console.as_ref());
    let told = started(start.clone());
    match (start, told) {
        (Err(error), _) => {
            record.finish(Ended::Refused(error.clone()));
            return Err(format!("container {id}: exec: {error}"));
        }
        // Nobody learns of the command (no pid file, no caller): it does not run on.
        (Ok(()), Err(error)) => {
            let _ = client.signal(libc::SIGKILL);
            record.finish(await_end(&client, &signals));
            return Err(format!("container {id}: exec: {error}"));
        }
        (Ok(()), Ok(())) => {}
    }
    let ended = await_end(&client, &signals);
    let code = ended.exit_code();
    record.finish(ended);
    Ok(ExitCode::from(code.clamp(0, 255) as u8))
}

/// An exec that may run: its container is running and its process.json passed.
struct Checked {
    dir: PathBuf,
    /// The container's run id (the exec's record names it as its session).
    container_run: String,
    facts: ExecFacts,
    terms: ExecTerms,
    /// Connected, for an exec with a terminal.
    console: Option<UnixStream>,
    store: Store,
}

/// The container's state and process.json checked; a refusal of process.json (or of
/// the container's class) is recorded.
fn checked(globals: &Globals, args: &ExecArgs) -> Result<Checked, String> {
    let id = &args.id;
    let stored = state::load(&globals.root, id)?;
    match state::status(&stored) {
        Status::Running => {}
        other => {
            return Err(format!(
                "cannot exec in a container that is {}: {id}",
                other.as_str()
            ))
        }
    }
    let dir = state::dir(&globals.root, id)?;
    let facts = ExecFacts::load(&dir, id)?;
    let asked = read_process(args.process.as_deref())?;
    let store = open_store()?;
    let checked = not_decided_by_class(&facts)
        .and_then(|()| {
            exec_terms(&asked, &facts.container)
                .map_err(|e| format!("process.json {}: {}", e.field, e.rule))
        })
        .and_then(|terms| console_matches(terms, args.console_socket.as_deref()));
    match checked {
        Ok((terms, console)) => Ok(Checked {
            dir,
            container_run: stored.run_id,
            facts,
            terms,
            console,
            store,
        }),
        Err(error) => {
            let argv = asked.args().clone().unwrap_or_default();
            let run = refuse(&store, &facts, &stored.run_id, &argv, &error);
            Err(format!("container {id}: exec refused (run {run}): {error}"))
        }
    }
}

/// Asks the container's supervisor for the command, with this process's stdio (the
/// shim's) unless it has a terminal.
fn ask(dir: &Path, terms: &ExecTerms) -> Result<ExecClient, String> {
    let client = ExecClient::connect(&door_socket(dir))
        .map_err(|e| format!("its supervisor does not answer: {e}"))?;
    let request = ExecRequest {
        argv: terms.argv.clone(),
        env: terms.env.clone(),
        terminal: terms.terminal,
    };
    let (stdin, stdout, stderr) = (std::io::stdin(), std::io::stdout(), std::io::stderr());
    let stdio: Vec<BorrowedFd<'_>> = match terms.terminal {
        true => Vec::new(),
        false => vec![stdin.as_fd(), stdout.as_fd(), stderr.as_fd()],
    };
    client
        .run(&request, &stdio)
        .map_err(|e| format!("exec: {e}"))?;
    Ok(client)
}

/// A container whose command a workload class decided takes no exec: the class's command
/// policy would not decide on the exec's command (not built), and a command nobody
/// decided on does not run in its cell.
fn not_decided_by_class(facts: &ExecFacts) -> Result<(), String> {
    match &facts.decided_by_class {
        None => Ok(()),
        Some(class) => Err(format!(
            "annotation airlock.dev/class ({class}): the workload class decides on the \
             container's command, and an exec's command is not decided by it: exec is refused \
             for such a container"
        )),
    }
}

fn read_process(path: Option<&Path>) -> Result<oci_spec::runtime::Process, String> {
    let path =
        path.ok_or("--process is required: airlock takes an exec's process from its process.json")?;
    let bytes = std::fs::read(path).map_err(|e| format!("--process {}: {e}", path.display()))?;
    serde_json::from_slice(&bytes).map_err(|e| format!("--process {}: {e}", path.display()))
}

/// A terminal needs the console socket and the console socket a terminal, as runc's.
fn console_matches(
    terms: ExecTerms,
    console: Option<&Path>,
) -> Result<(ExecTerms, Option<UnixStream>), String> {
    match (terms.terminal, console) {
        (true, Some(path)) => {
            let stream = UnixStream::connect(path)
                .map_err(|e| format!("--console-socket {}: {e}", path.display()))?;
            Ok((terms, Some(stream)))
        }
        (false, None) => Ok((terms, None)),
        (true, None) => {
            Err("process.json process.terminal: a terminal needs --console-socket".into())
        }
        (false, Some(_)) => {
            Err("--console-socket without process.terminal: there is no terminal to send".into())
        }
    }
}

/// Until the command was exec'd: its terminal goes to the console socket on the way.
fn await_start(client: &ExecClient, console: Option<&UnixStream>) -> Result<(), String> {
    loop {
        match client.next_event() {
            Ok(Some((ExecEvent::Terminal, fds))) => {
                let (Some(console), Some(master)) = (console, fds.first()) else {
                    return Err("a terminal nobody asked for".into());
                };
                exec_door::send_console(console, master.as_fd())
                    .map_err(|e| format!("the console socket: {e}"))?;
            }
            Ok(Some((ExecEvent::Started, _))) => return Ok(()),
            Ok(Some((ExecEvent::Failed { reason, .. }, _))) => return Err(reason),
            Ok(Some((ExecEvent::Refused { error }, _))) => return Err(error),
            Ok(Some((ExecEvent::Ended { .. }, _))) | Ok(None) => {
                return Err("the container ended before the exec started".into())
            }
            Err(e) => return Err(format!("the supervisor's door: {e}")),
        }
    }
}

/// How the exec ended.
enum Ended {
    /// Its raw wait status.
    Exited(i32),
    /// The container ended first (its pid 1 killed every process of the cell).
    WithTheContainer,
    /// It never ran.
    Refused(String),
}

impl Ended {
    fn exit_code(&self) -> i32 {
        match self {
            Ended::Exited(status) => exec_door::exit_code(*status),
            Ended::WithTheContainer => 128 + libc::SIGKILL,
            Ended::Refused(_) => 125,
        }
    }
}

/// Until the command ended, forwarding the signals this process gets to it.
fn await_end(client: &ExecClient, signals: &std::os::fd::OwnedFd) -> Ended {
    loop {
        let Ok(ready) = exec_door::wait_readable(&[client.as_fd(), signals.as_fd()]) else {
            return Ended::WithTheContainer;
        };
        if ready[1] != 0 {
            while let Some(signal) = exec_door::next_forwarded(signals.as_fd()) {
                let _ = client.signal(signal);
            }
        }
        if ready[0] != 0 {
            match client.next_event() {
                Ok(Some((ExecEvent::Ended { wait_status }, _))) => {
                    return Ended::Exited(wait_status)
                }
                Ok(Some(_)) => {}
                Ok(None) | Err(_) => return Ended::WithTheContainer,
            }
        }
    }
}

fn open_store() -> Result<Store, String> {
    let config = super::supervise::load_config()?;
    let location = config
        .store_location(None)
        .map_err(|e| crate::user_message(&e))?;
    Store::open_at(&location).map_err(|e| format!("the audit store: {e}"))
}

fn start_of(facts: &ExecFacts, container_run: &str, argv: &[String]) -> RunStart {
    RunStart {
        argv: argv.to_vec(),
        input_sha256: airlock_engine::record::InputHasher::new(argv).finish(),
        contract_sha256: facts.contract_sha256.clone(),
        workload_class: facts.workload_class.clone(),
        plan_json: serde_json::Value::Null,
        session_id: Some(container_run.to_owned()),
        tenant: None,
    }
}

/// Records a refused exec (`policy_denied`); its run id, or why it is not recorded.
fn refuse(
    store: &Store,
    facts: &ExecFacts,
    container_run: &str,
    argv: &[String],
    error: &str,
) -> String {
    let handle = match store.begin_run(start_of(facts, container_run, argv), Vec::new()) {
        Ok(handle) => handle,
        Err(e) => return format!("not recorded: {e}"),
    };
    let mut report = RunReport::refused(
        &handle.run_id(),
        ResultClass::PolicyDenied,
        error.to_owned(),
    );
    report.container = Some(facts.identity.clone());
    let stored = serde_json::to_value(&report).unwrap_or_default();
    match airlock_engine::record::finish(store, &handle, &report, &stored) {
        Ok(_) => handle.run_id(),
        Err(e) => format!("{} not completed: {e}", handle.run_id()),
    }
}

/// The exec's record, begun before it is asked for (no record, no command).
struct ExecRecord {
    store: Store,
    handle: RunHandle,
    identity: ContainerIdentity,
    started: Instant,
}

impl ExecRecord {
    fn begin(
        store: Store,
        facts: &ExecFacts,
        container_run: &str,
        argv: &[String],
    ) -> Result<ExecRecord, String> {
        let handle = store
            .begin_run(start_of(facts, container_run, argv), Vec::new())
            .map_err(|e| format!("the exec's record was not begun (nothing ran): {e}"))?;
        Ok(ExecRecord {
            store,
            handle,
            identity: facts.identity.clone(),
            started: Instant::now(),
        })
    }

    fn finish(self, ended: Ended) {
        let run_id = self.handle.run_id();
        let code = ended.exit_code();
        let mut report = match &ended {
            Ended::Refused(error) => {
                RunReport::refused(&run_id, ResultClass::RuntimeFault, error.clone())
            }
            Ended::Exited(_) | Ended::WithTheContainer => {
                let mut report = RunReport::refused(&run_id, ResultClass::Ok, String::new());
                report.error = None;
                report.exit_code = code;
                report.status = if code == 0 {
                    ResultClass::Ok
                } else {
                    ResultClass::TaskError
                };
                report
            }
        };
        if let Ended::Exited(status) = ended {
            report.exit = ExitInfo {
                code: libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status)),
                signal: libc::WIFSIGNALED(status).then(|| libc::WTERMSIG(status)),
            };
        }
        if matches!(ended, Ended::WithTheContainer) {
            report
                .notes
                .push("the container ended first: its processes were killed with it".into());
        }
        report.container = Some(self.identity.clone());
        report.timings.wall_ms = self.started.elapsed().as_secs_f64() * 1000.0;
        let stored = serde_json::to_value(&report).unwrap_or_default();
        let _ = airlock_engine::record::finish(&self.store, &self.handle, &report, &stored);
    }
}
