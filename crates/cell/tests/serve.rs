//! `serve_cell` through its control socket, as root: the test is the engine, and a copy
//! of this test binary, re-executed with the socket as its stdin, is the cell's
//! supervisor process (single-threaded, as `serve_cell` needs: this test has no harness
//! threads). Each scenario tries what the engine relies on: a parked cell runs nothing
//! before `Run`, a command's output reaches the sink it passed, `Close` and the engine's
//! death destroy the cell, a command's deadline runs from its start.

use airlock_cell::control::{socket_pair, CommandFds, CommandSpec, EngineControl, ToEngine};
use airlock_cell::report::{Ceiling, ResultClass, RunReport};
use airlock_cell::{serve_cell, ServeMode, ServeOptions};
use airlock_contract::CellPlan;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const ROLE: &str = "AIRLOCK_SERVE_TEST_PLAN";
/// `<idle_timeout ms>,<max_lifetime ms>` for a session; absent for a one-shot cell.
const SESSION: &str = "AIRLOCK_SERVE_TEST_SESSION";

fn main() {
    if let Ok(plan) = std::env::var(ROLE) {
        supervise(Path::new(&plan));
        return;
    }
    if !is_root() {
        assert!(
            std::env::var_os("AIRLOCK_REQUIRE_ROOT_TESTS").is_none(),
            "the serve tests need root"
        );
        println!("serve: skipped (not root)");
        return;
    }
    let scenarios: [(&str, fn()); 12] = [
        (
            "the_engine_learns_of_the_exec_then_the_exit_then_the_report",
            announces_in_order,
        ),
        (
            "a_parked_cell_runs_its_command_into_the_sink",
            runs_a_command,
        ),
        (
            "a_parked_cell_runs_nothing_before_run",
            runs_nothing_while_parked,
        ),
        ("close_destroys_a_parked_cell", close_destroys),
        ("the_engines_death_destroys_a_parked_cell", eof_destroys),
        (
            "a_commands_deadline_runs_from_its_start",
            deadline_from_start,
        ),
        (
            "a_command_above_the_plans_limits_is_refused",
            above_plan_refused,
        ),
        (
            "a_sessions_writable_paths_persist_between_commands",
            session_files_persist,
        ),
        (
            "a_daemon_does_not_outlive_the_sessions_close",
            session_daemon_dies,
        ),
        (
            "an_idle_session_expires_on_time_and_says_why",
            session_expires,
        ),
        (
            "a_commands_deadline_kills_that_command_only",
            session_deadline_is_per_command,
        ),
        ("kill_ends_a_background_command_of_a_session", session_kill),
    ];
    for (name, scenario) in scenarios {
        scenario();
        println!("test {name} ... ok");
    }
    println!("{} passed, 0 failed", scenarios.len());
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(2) == Some("0"))
}

/// The supervisor process: its stdin is the control socket.
fn supervise(plan: &Path) {
    let plan: airlock_contract::PlanTransfer =
        serde_json::from_slice(&std::fs::read(plan).unwrap()).unwrap();
    let plan = plan.into_plan();
    let control = std::io::stdin().as_fd().try_clone_to_owned().unwrap();
    let mode = match std::env::var(SESSION) {
        Ok(limits) => {
            let ms: Vec<u64> = limits.split(',').map(|n| n.parse().unwrap()).collect();
            ServeMode::Session {
                idle_timeout: Duration::from_millis(ms[0]),
                max_lifetime: Duration::from_millis(ms[1]),
            }
        }
        Err(_) => ServeMode::OneShot,
    };
    serve_cell(
        &plan,
        ServeOptions {
            control,
            credentials: &[],
            egress: None,
            artifacts: None,
            mode,
            host_ids: Default::default(),
            on_suspected_escape: None,
        },
    );
}

struct Served {
    engine: EngineControl,
    supervisor: Child,
    _plan: tempfile::NamedTempFile,
}

fn plan() -> CellPlan {
    airlock_contract::compile(
        &airlock_contract::default_contract(),
        &airlock_contract::CompileInput::new(Path::new("/"), &["true".to_string()]),
    )
    .unwrap()
}

fn serve(plan: &CellPlan) -> Served {
    serve_as(plan, None)
}

/// A session cell with `idle_timeout` and `max_lifetime` in ms.
fn session(idle_ms: u64, lifetime_ms: u64) -> Served {
    serve_as(&plan(), Some(format!("{idle_ms},{lifetime_ms}")))
}

fn serve_as(plan: &CellPlan, session: Option<String>) -> Served {
    let file = tempfile::NamedTempFile::new().unwrap();
    let transfer = airlock_contract::PlanTransfer::of(plan);
    std::fs::write(file.path(), serde_json::to_vec(&transfer).unwrap()).unwrap();
    let (ours, theirs) = socket_pair().unwrap();
    let mut command = Command::new(std::env::current_exe().unwrap());
    command.env(ROLE, file.path()).stdin(Stdio::from(theirs));
    if let Some(limits) = session {
        command.env(SESSION, limits);
    }
    let supervisor = command.spawn().unwrap();
    Served {
        engine: EngineControl::new(ours),
        supervisor,
        _plan: file,
    }
}

fn parked(engine: &EngineControl) -> (i32, Vec<PathBuf>) {
    match engine.recv().unwrap() {
        Some(ToEngine::Parked { pid, cgroups, .. }) => (pid, cgroups),
        other => panic!("expected Parked, got {other:?}"),
    }
}

fn procs(cgroup: &Path) -> Vec<String> {
    std::fs::read_to_string(cgroup.join("cgroup.procs"))
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

/// A command's descriptors: no stdin, these sinks, no watched caller.
fn sinks<'a>(stdout: BorrowedFd<'a>, stderr: BorrowedFd<'a>) -> CommandFds<'a> {
    CommandFds {
        stdin: None,
        stdout,
        stderr,
        caller: None,
    }
}

fn spec(argv: &[&str]) -> CommandSpec {
    CommandSpec {
        argv: argv.iter().map(|a| a.to_string()).collect(),
        env: Vec::new(),
        wall_time_ms: None,
        output_bytes: None,
        stdin: false,
        watch_caller: false,
    }
}

fn null() -> OwnedFd {
    OwnedFd::from(std::fs::File::open("/dev/null").unwrap())
}

/// Reads the engine's messages up to `Closed`: the command's report (if one ended) and
/// the final one.
fn until_closed(engine: &EngineControl) -> (Option<RunReport>, RunReport) {
    let mut ended = None;
    loop {
        match engine.recv().unwrap() {
            Some(ToEngine::CommandStarted { .. }) | Some(ToEngine::CommandExited { .. }) => {}
            Some(ToEngine::CommandEnded { report, .. }) => ended = Some(*report),
            Some(ToEngine::Closed { report }) => return (ended, *report),
            other => panic!("unexpected {other:?}"),
        }
    }
}

fn gone_within(cgroups: &[PathBuf], limit: Duration) -> bool {
    let until = Instant::now() + limit;
    while Instant::now() < until {
        if cgroups.iter().all(|c| !c.exists()) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    false
}

fn exits_cleanly(mut served: Served) {
    let status = served.supervisor.wait().unwrap();
    assert!(status.success(), "the supervisor process: {status}");
}

fn runs_a_command() {
    let served = serve(&plan());
    let (_, cgroups) = parked(&served.engine);
    let sink = tempfile::NamedTempFile::new().unwrap();
    let out = OwnedFd::from(sink.reopen().unwrap());
    let command = spec(&["echo", "hi"]);
    served
        .engine
        .run(1, "run-1", command, sinks(out.as_fd(), null().as_fd()))
        .unwrap();
    let (ended, closed) = until_closed(&served.engine);
    let ended = ended.expect("CommandEnded");
    assert_eq!(ended.status, ResultClass::Ok, "{ended:?}");
    assert_eq!(ended.exit.code, Some(0));
    assert_eq!(ended.run_id, "run-1");
    assert_eq!(std::fs::read_to_string(sink.path()).unwrap(), "hi\n");
    assert!(closed.cleanup.ok, "{:?}", closed.cleanup);
    assert!(gone_within(&cgroups, Duration::from_secs(1)));
    exits_cleanly(served);
}

/// A one-shot command's messages come in the order they happen: the exec, the exit (as
/// soon as pid 1 reports it, before the teardown), the command's report, the final one.
fn announces_in_order() {
    let served = serve(&plan());
    parked(&served.engine);
    let command = spec(&["sh", "-c", "exit 3"]);
    served
        .engine
        .run(1, "run-1", command, sinks(null().as_fd(), null().as_fd()))
        .unwrap();
    let mut seen = Vec::new();
    loop {
        match served.engine.recv().unwrap() {
            Some(ToEngine::CommandStarted { id }) => seen.push(format!("started {id}")),
            Some(ToEngine::CommandExited { id, exit }) => {
                seen.push(format!("exited {id} {:?}", exit.code))
            }
            Some(ToEngine::CommandEnded { id, report }) => {
                seen.push(format!("ended {id} {:?}", report.exit.code))
            }
            Some(ToEngine::Closed { .. }) => break,
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(
        seen,
        ["started 1", "exited 1 Some(3)", "ended 1 Some(3)"],
        "{seen:?}"
    );
    exits_cleanly(served);
}

fn runs_nothing_while_parked() {
    let served = serve(&plan());
    let (pid, cgroups) = parked(&served.engine);
    assert!(!cgroups.is_empty());
    // Parked for a while: only pid 1 is in the cell's cgroup.
    std::thread::sleep(Duration::from_millis(300));
    for cgroup in &cgroups {
        assert_eq!(procs(cgroup), [pid.to_string()], "{}", cgroup.display());
    }
    // pid 1 holds its socket to the supervisor and nothing else of the supervisor's
    // process: not the control socket (the supervisor's stdin and its copy of it).
    let sockets: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.unwrap().path()).ok())
        .map(|target| target.display().to_string())
        .filter(|target| target.starts_with("socket:"))
        .collect();
    assert_eq!(sockets.len(), 1, "pid 1's sockets: {sockets:?}");
    served.engine.close().unwrap();
    let (ended, closed) = until_closed(&served.engine);
    assert!(ended.is_none(), "no command ran");
    assert!(closed.cleanup.ok);
    exits_cleanly(served);
}

fn close_destroys() {
    let served = serve(&plan());
    let (pid, cgroups) = parked(&served.engine);
    served.engine.close().unwrap();
    let (_, closed) = until_closed(&served.engine);
    assert!(closed.cleanup.ok, "{:?}", closed.cleanup);
    assert!(gone_within(&cgroups, Duration::from_secs(1)));
    assert!(
        !Path::new(&format!("/proc/{pid}")).exists(),
        "pid 1 is gone"
    );
    exits_cleanly(served);
}

fn eof_destroys() {
    let Served {
        engine,
        mut supervisor,
        _plan,
    } = serve(&plan());
    let (_, cgroups) = parked(&engine);
    drop(engine);
    assert!(
        gone_within(&cgroups, Duration::from_secs(1)),
        "the cell's cgroup is gone within a second of the engine's death"
    );
    assert!(supervisor.wait().unwrap().success());
}

fn deadline_from_start() {
    let served = serve(&plan());
    parked(&served.engine);
    // Parked longer than the command's deadline: the deadline runs from its start.
    std::thread::sleep(Duration::from_millis(500));
    let mut command = spec(&["sleep", "5"]);
    command.wall_time_ms = Some(300);
    let started = Instant::now();
    served
        .engine
        .run(2, "run-2", command, sinks(null().as_fd(), null().as_fd()))
        .unwrap();
    let (ended, _) = until_closed(&served.engine);
    let ended = ended.expect("CommandEnded");
    assert_eq!(ended.status, ResultClass::CapacityExceeded, "{ended:?}");
    assert_eq!(ended.limit_fired, Some(Ceiling::WallTime));
    assert!(started.elapsed() < Duration::from_secs(4));
    exits_cleanly(served);
}

fn above_plan_refused() {
    let plan = plan();
    let served = serve(&plan);
    let (_, cgroups) = parked(&served.engine);
    let mut command = spec(&["true"]);
    command.wall_time_ms = Some(plan.limits.wall_time_ms + 1);
    served
        .engine
        .run(3, "run-3", command, sinks(null().as_fd(), null().as_fd()))
        .unwrap();
    let (ended, closed) = until_closed(&served.engine);
    let ended = ended.expect("CommandEnded");
    assert_eq!(ended.status, ResultClass::PolicyDenied);
    assert!(
        ended
            .error
            .as_deref()
            .unwrap_or("")
            .contains("wall_time_ms"),
        "{:?}",
        ended.error
    );
    assert!(closed.cleanup.ok);
    assert!(gone_within(&cgroups, Duration::from_secs(1)));
    exits_cleanly(served);
}

/// Runs `command` as command `id` of a session with a file as its stdout sink.
fn run_into_file(served: &Served, id: u64, command: CommandSpec) -> tempfile::NamedTempFile {
    let sink = tempfile::NamedTempFile::new().unwrap();
    let out = OwnedFd::from(sink.reopen().unwrap());
    served
        .engine
        .run(
            id,
            &format!("run-{id}"),
            command,
            sinks(out.as_fd(), null().as_fd()),
        )
        .unwrap();
    sink
}

/// The next `CommandEnded` (skipping `CommandStarted`), with its id.
fn next_ended(engine: &EngineControl) -> (u64, RunReport) {
    loop {
        match engine.recv().unwrap() {
            Some(ToEngine::CommandStarted { .. }) => {}
            Some(ToEngine::CommandEnded { id, report }) => return (id, *report),
            other => panic!("unexpected {other:?}"),
        }
    }
}

fn close_and_check(served: Served, cgroups: &[PathBuf]) -> RunReport {
    served.engine.close().unwrap();
    let (_, closed) = until_closed(&served.engine);
    assert!(closed.cleanup.ok, "{:?}", closed.cleanup);
    assert!(gone_within(cgroups, Duration::from_secs(1)));
    exits_cleanly(served);
    closed
}

fn session_files_persist() {
    let served = session(5_000, 30_000);
    let (_, cgroups) = parked(&served.engine);
    run_into_file(&served, 1, spec(&["sh", "-c", "echo kept > /tmp/f"]));
    let (id, first) = next_ended(&served.engine);
    assert_eq!((id, first.status), (1, ResultClass::Ok), "{first:?}");
    let sink = run_into_file(&served, 2, spec(&["cat", "/tmp/f"]));
    let (id, second) = next_ended(&served.engine);
    assert_eq!((id, second.status), (2, ResultClass::Ok), "{second:?}");
    assert_eq!(std::fs::read_to_string(sink.path()).unwrap(), "kept\n");
    close_and_check(served, &cgroups);
}

fn session_daemon_dies() {
    let served = session(5_000, 30_000);
    let (pid, cgroups) = parked(&served.engine);
    let daemon = "setsid sleep 1000 </dev/null >/dev/null 2>&1 & echo started";
    let sink = run_into_file(&served, 1, spec(&["sh", "-c", daemon]));
    let (_, report) = next_ended(&served.engine);
    assert_eq!(report.status, ResultClass::Ok, "{report:?}");
    assert_eq!(std::fs::read_to_string(sink.path()).unwrap(), "started\n");
    // The daemon runs on in the cell after its command ended.
    let running: Vec<String> = cgroups.iter().flat_map(|c| procs(c)).collect();
    assert!(
        running.iter().any(|p| *p != pid.to_string()),
        "the daemon is running: {running:?}"
    );
    close_and_check(served, &cgroups);
}

fn session_expires() {
    let served = session(300, 30_000);
    let (_, cgroups) = parked(&served.engine);
    let parked_at = Instant::now();
    let (ended, closed) = until_closed(&served.engine);
    let after = parked_at.elapsed();
    assert!(ended.is_none());
    assert!(
        after >= Duration::from_millis(250) && after < Duration::from_millis(1500),
        "expired after {after:?}"
    );
    assert!(
        closed.notes.iter().any(|n| n.contains("idle_timeout")),
        "{:?}",
        closed.notes
    );
    assert!(gone_within(&cgroups, Duration::from_secs(1)));
    exits_cleanly(served);
}

fn session_deadline_is_per_command() {
    let served = session(5_000, 30_000);
    let (_, cgroups) = parked(&served.engine);
    let mut slow = spec(&["sleep", "5"]);
    slow.wall_time_ms = Some(300);
    run_into_file(&served, 1, slow);
    let (id, report) = next_ended(&served.engine);
    assert_eq!(id, 1);
    assert_eq!(report.status, ResultClass::CapacityExceeded, "{report:?}");
    assert_eq!(report.limit_fired, Some(Ceiling::WallTime));
    // The session goes on.
    let sink = run_into_file(&served, 2, spec(&["echo", "still here"]));
    let (id, report) = next_ended(&served.engine);
    assert_eq!((id, report.status), (2, ResultClass::Ok), "{report:?}");
    assert_eq!(
        std::fs::read_to_string(sink.path()).unwrap(),
        "still here\n"
    );
    close_and_check(served, &cgroups);
}

fn session_kill() {
    let served = session(5_000, 30_000);
    let (_, cgroups) = parked(&served.engine);
    run_into_file(&served, 1, spec(&["sleep", "100"]));
    run_into_file(&served, 2, spec(&["echo", "meanwhile"]));
    let (id, report) = next_ended(&served.engine);
    assert_eq!((id, report.status), (2, ResultClass::Ok), "{report:?}");
    served.engine.kill(1).unwrap();
    let (id, report) = next_ended(&served.engine);
    assert_eq!(id, 1);
    assert_eq!(report.exit.signal, Some(libc::SIGKILL), "{report:?}");
    close_and_check(served, &cgroups);
}
