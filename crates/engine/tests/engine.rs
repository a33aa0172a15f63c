//! The engine through the real kernel, as root: runs from threads through the cell
//! factory, warm pools, sessions, and the deaths of their owners.
//!
//! A custom harness (`harness = false` in Cargo.toml): this binary is also the cell
//! factory, which the engine starts as `<this binary> __airlock-cell-factory`, so `main`
//! must hand over to it before anything else; and the owner-death tests start this
//! binary again as an owner process they kill.

use airlock_cell::report::{ResultClass, RunReport};
use airlock_cell::PayloadStdin;
use airlock_contract::{compile, default_contract, CellPlan, CompileInput};
use airlock_engine::{CommandRequest, Engine, EngineConfig, RunRequest, SessionRequest};
use std::io::Read;
use std::os::fd::OwnedFd;
use std::path::Path;
use std::time::{Duration, Instant};

const OWNER_ARG: &str = "__engine-test-owner";

fn main() {
    airlock_engine::factory::run_factory_if_requested();
    if std::env::args().nth(1).as_deref() == Some(OWNER_ARG) {
        owner_process();
    }
    let tests: &[(&str, fn())] = &[
        (
            "runs_from_many_threads_are_recorded",
            runs_from_many_threads_are_recorded,
        ),
        (
            "running_a_cell_changes_nothing_of_the_caller",
            running_a_cell_changes_nothing_of_the_caller,
        ),
        (
            "a_warm_cell_runs_the_claimed_command",
            a_warm_cell_runs_the_claimed_command,
        ),
        (
            "no_record_no_payload_for_a_parked_cell",
            no_record_no_payload_for_a_parked_cell,
        ),
        (
            "a_thousand_claims_leave_nothing_behind",
            a_thousand_claims_leave_nothing_behind,
        ),
        ("capacity_counts_parked_cells", capacity_counts_parked_cells),
        (
            "a_warm_cells_writable_paths_are_copied_on_a_suspected_escape",
            a_warm_cells_writable_paths_are_copied_on_a_suspected_escape,
        ),
        (
            "parked_cells_are_visible_to_doctor",
            parked_cells_are_visible_to_doctor,
        ),
        (
            "killing_the_owner_leaves_no_cell",
            killing_the_owner_leaves_no_cell,
        ),
        (
            "killing_the_factory_leaves_no_cell",
            killing_the_factory_leaves_no_cell,
        ),
        (
            "each_session_with_an_http_rule_trusts_its_own_run_ca",
            each_session_with_an_http_rule_trusts_its_own_run_ca,
        ),
        (
            "a_session_keeps_its_files_between_commands",
            a_session_keeps_its_files_between_commands,
        ),
        (
            "a_sessions_commands_never_outlive_it",
            a_sessions_commands_never_outlive_it,
        ),
        (
            "an_idle_session_expires_on_time",
            an_idle_session_expires_on_time,
        ),
        (
            "a_session_ends_at_its_lifetime",
            a_session_ends_at_its_lifetime,
        ),
        (
            "two_sessions_never_see_each_other",
            two_sessions_never_see_each_other,
        ),
        (
            "a_background_command_is_listed_and_killed",
            a_background_command_is_listed_and_killed,
        ),
    ];
    let filter: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    if !is_root() {
        if std::env::var_os("AIRLOCK_ALLOW_SKIPPED_ROOT_TESTS").is_some()
            && std::env::var_os("AIRLOCK_REQUIRE_ROOT_TESTS").is_none()
        {
            eprintln!("engine tests skipped: they need root (AIRLOCK_ALLOW_SKIPPED_ROOT_TESTS)");
            return;
        }
        eprintln!("engine tests need root (set AIRLOCK_ALLOW_SKIPPED_ROOT_TESTS to skip them)");
        std::process::exit(1);
    }
    let mut failed = Vec::new();
    let mut ran = 0;
    for (name, test) in tests {
        if !filter.is_empty() && !filter.iter().any(|f| name.contains(f.as_str())) {
            continue;
        }
        ran += 1;
        let started = Instant::now();
        let outcome = std::panic::catch_unwind(test);
        let took = started.elapsed().as_secs_f64();
        match outcome {
            Ok(()) => println!("test {name} ... ok ({took:.2} s)"),
            Err(_) => {
                println!("test {name} ... FAILED ({took:.2} s)");
                failed.push(*name);
            }
        }
    }
    println!(
        "\ntest result: {}. {} passed; {} failed",
        if failed.is_empty() { "ok" } else { "FAILED" },
        ran - failed.len(),
        failed.len()
    );
    if !failed.is_empty() {
        println!("failures: {}", failed.join(", "));
        std::process::exit(101);
    }
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(2).map(|u| u == "0"))
        })
        .unwrap_or(false)
}

fn engine(state: &Path) -> Engine {
    let mut config = EngineConfig::new(state.to_path_buf(), Default::default());
    config.program = std::env::current_exe().unwrap();
    Engine::new(config)
}

fn plan(argv: &[&str]) -> CellPlan {
    let argv: Vec<String> = argv.iter().map(|a| a.to_string()).collect();
    compile(
        &default_contract(),
        &CompileInput::new(Path::new("/"), &argv),
    )
    .unwrap()
}

/// A pipe: the write end for the payload's stdout, the read end for the test.
fn pipe() -> (std::fs::File, OwnedFd) {
    let (read, write) = std::io::pipe().unwrap();
    (
        std::fs::File::from(OwnedFd::from(read)),
        OwnedFd::from(write),
    )
}

fn request(plan: CellPlan, stdout: Option<OwnedFd>) -> RunRequest {
    RunRequest {
        plan,
        workload_class: "engine-test".into(),
        credentials: Vec::new(),
        stdin: PayloadStdin::Null,
        artifacts: None,
        stdout,
        stderr: None,
        started: Instant::now(),
        tenant: None,
        on_recorded: None,
        caller: None,
    }
}

/// Runs `argv` through the engine's threaded path; the report and what it printed.
fn run(engine: &Engine, argv: &[&str]) -> (RunReport, String) {
    let (mut out, write) = pipe();
    let finished = engine
        .run(request(plan(argv), Some(write)))
        .unwrap_or_else(|r| panic!("refused: {:?}", r.report.error));
    let report = engine.complete(finished).expect("record completed");
    let mut text = String::new();
    out.read_to_string(&mut text).unwrap();
    (report, text)
}

fn records(state: &Path) -> Vec<airlock_store::RunRecord> {
    airlock_store::Store::open(state)
        .unwrap()
        .list_runs(&Default::default())
        .unwrap()
}

/// Descendant pids of `pid` (children, their children, ...).
fn descendants(pid: u32) -> Vec<u32> {
    let mut found = Vec::new();
    let mut queue = vec![pid];
    while let Some(p) = queue.pop() {
        for task in std::fs::read_dir(format!("/proc/{p}/task"))
            .into_iter()
            .flatten()
            .flatten()
        {
            let children =
                std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
            for child in children.split_whitespace().filter_map(|c| c.parse().ok()) {
                found.push(child);
                queue.push(child);
            }
        }
    }
    found
}

fn alive(pid: u32) -> bool {
    // A zombie has exited: its cell, namespace and cgroup membership are gone.
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        s.rsplit_once(") ")
            .is_some_and(|(_, rest)| !rest.starts_with('Z'))
    })
}

fn wait_until(what: &str, within: Duration, mut done: impl FnMut() -> bool) {
    let until = Instant::now() + within;
    while !done() {
        assert!(Instant::now() < until, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// This process's open descriptors and what they are.
fn open_fds() -> Vec<String> {
    let mut fds: Vec<String> = std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .flatten()
        .map(|e| {
            let target = std::fs::read_link(e.path()).unwrap_or_default();
            format!(
                "{} -> {}",
                e.file_name().to_string_lossy(),
                target.display()
            )
        })
        // The read_dir's own descriptor.
        .filter(|f| !f.contains("/proc/") || !f.ends_with("/fd"))
        .collect();
    fds.sort();
    fds
}

// ----- runs -----

fn runs_from_many_threads_are_recorded() {
    let state = tempfile::tempdir().unwrap();
    let engine = engine(state.path());
    std::thread::scope(|scope| {
        for n in 0..6 {
            let engine = &engine;
            scope.spawn(move || {
                let word = format!("thread{n}");
                let (report, out) = run(engine, &["/bin/echo", &word]);
                assert_eq!(report.status, ResultClass::Ok, "{:?}", report.error);
                assert_eq!(out.trim(), word);
                assert!(report.cleanup.ok, "{:?}", report.cleanup.leftovers);
            });
        }
    });
    let runs = records(state.path());
    assert_eq!(runs.len(), 6);
    assert!(runs.iter().all(|r| r.status == "ok"), "{runs:?}");
    assert_eq!(engine.live_cells(), 0);
}

fn running_a_cell_changes_nothing_of_the_caller() {
    let state = tempfile::tempdir().unwrap();
    let engine = engine(state.path());
    // A worker thread first: this process is now threaded, like a server.
    let _ = run(&engine, &["/bin/true"]);
    let groups = std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find(|l| l.starts_with("Groups:"))
        .unwrap()
        .to_string();
    let env: Vec<_> = std::env::vars_os().collect();
    let fds = open_fds();
    let cwd = std::env::current_dir().unwrap();
    for _ in 0..5 {
        let (report, _) = run(
            &engine,
            &["/bin/sh", "-c", "echo out; echo err >&2; exit 3"],
        );
        assert_eq!(report.status, ResultClass::TaskError);
        assert_eq!(report.exit.code, Some(3));
    }
    let groups_after = std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find(|l| l.starts_with("Groups:"))
        .unwrap()
        .to_string();
    assert_eq!(groups, groups_after, "supplementary groups changed");
    assert_eq!(
        env,
        std::env::vars_os().collect::<Vec<_>>(),
        "environment changed"
    );
    assert_eq!(fds, open_fds(), "descriptors leaked");
    assert_eq!(cwd, std::env::current_dir().unwrap());
}

// ----- warm cells -----

fn wait_parked(engine: &Engine, n: usize) {
    wait_until("the pool is full", Duration::from_secs(20), || {
        engine.pool_status().iter().map(|p| p.parked).sum::<usize>() >= n
    });
}

fn a_warm_cell_runs_the_claimed_command() {
    let state = tempfile::tempdir().unwrap();
    let engine = engine(state.path());
    engine.keep_warm(plan(&["/bin/true"]), 2).unwrap();
    wait_parked(&engine, 2);
    let (report, out) = run(&engine, &["/bin/echo", "warm"]);
    assert_eq!(report.status, ResultClass::Ok, "{:?}", report.error);
    assert_eq!(out.trim(), "warm");
    // The claimed cell is gone and a new one takes its place.
    wait_parked(&engine, 2);
    assert_eq!(engine.live_cells(), 2);
    let runs = records(state.path());
    assert_eq!(runs.len(), 1);
    assert_eq!(runs[0].argv, ["/bin/echo", "warm"]);
}

/// A file named `name` somewhere below `dir`, and its text.
fn find_file(dir: &Path, name: &str) -> Option<String> {
    for entry in std::fs::read_dir(dir).ok()?.flatten() {
        let path = entry.path();
        if entry.file_type().ok()?.is_dir() {
            if let Some(found) = find_file(&path, name) {
                return Some(found);
            }
        } else if entry.file_name() == name {
            return std::fs::read_to_string(path).ok();
        }
    }
    None
}

/// A parked cell is given its own evidence directory when it is built: the run that
/// claims it keeps the copy of its writable paths like a cell built for the run.
fn a_warm_cells_writable_paths_are_copied_on_a_suspected_escape() {
    let state = tempfile::tempdir().unwrap();
    let engine = engine(state.path());
    engine.keep_warm(plan(&["/bin/true"]), 1).unwrap();
    wait_parked(&engine, 1);
    let parked: Vec<i32> = engine
        .pool_status()
        .iter()
        .flat_map(|p| p.supervisors.clone())
        .collect();
    // An x32 syscall: killed by the filter, a suspected escape.
    let script = "open('/tmp/left', 'w').write('warm evidence')\n\
                  import ctypes\nctypes.CDLL(None).syscall(0x40000000 | 39)\n";
    let finished = engine
        .run(request(plan(&["/usr/bin/python3", "-c", script]), None))
        .unwrap_or_else(|r| panic!("refused: {:?}", r.report.error));
    // The parked cell served it: its supervisor is no longer parked.
    let still: Vec<i32> = engine
        .pool_status()
        .iter()
        .flat_map(|p| p.supervisors.clone())
        .collect();
    assert!(
        still.iter().all(|pid| !parked.contains(pid)),
        "{parked:?} {still:?}"
    );
    assert_eq!(finished.report.status, ResultClass::SuspectedEscape);
    let copy = finished
        .evidence_dir
        .clone()
        .expect("an evidence directory");
    assert_eq!(find_file(&copy, "left").as_deref(), Some("warm evidence"));
    engine.complete(finished).unwrap();
}

fn no_record_no_payload_for_a_parked_cell() {
    use std::os::unix::fs::PermissionsExt;
    let state = tempfile::tempdir().unwrap();
    let engine = engine(state.path());
    engine.keep_warm(plan(&["/bin/true"]), 1).unwrap();
    wait_parked(&engine, 1);
    // A state directory others may write to is refused by the store: no begin record.
    std::fs::set_permissions(state.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let (mut out, write) = pipe();
    let finished = engine
        .run(request(plan(&["/bin/echo", "must-not-run"]), Some(write)))
        .unwrap_or_else(|r| panic!("refused: {:?}", r.report.error));
    assert!(finished.audit_error().is_some(), "a record was written");
    let mut text = String::new();
    out.read_to_string(&mut text).unwrap();
    assert_eq!(text, "", "the payload ran without a record");
    std::fs::set_permissions(state.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
}

fn cgroup_dirs() -> usize {
    [
        "/sys/fs/cgroup/memory/airlock",
        "/sys/fs/cgroup/pids/airlock",
        "/sys/fs/cgroup/airlock",
    ]
    .iter()
    .map(|d| {
        std::fs::read_dir(d)
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.path().is_dir())
            .count()
    })
    .sum()
}

fn a_thousand_claims_leave_nothing_behind() {
    let claims: usize = std::env::var("AIRLOCK_ENGINE_CLAIMS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(1000);
    let state = tempfile::tempdir().unwrap();
    // Descriptors opened once per process (the random number source of the run ids) are
    // open before the count.
    drop(run(&engine(state.path()), &["/bin/true"]));
    let cgroups_before = cgroup_dirs();
    let fds_before = open_fds();
    {
        let engine = engine(state.path());
        engine.keep_warm(plan(&["/bin/true"]), 4).unwrap();
        wait_parked(&engine, 4);
        for n in 0..claims {
            let (report, _) = run(&engine, &["/bin/true"]);
            assert_eq!(
                report.status,
                ResultClass::Ok,
                "claim {n}: {:?}",
                report.error
            );
        }
    }
    // The engine is dropped: its parked cells and factory are gone.
    wait_until("every cell is gone", Duration::from_secs(10), || {
        descendants(std::process::id()).iter().all(|p| !alive(*p))
    });
    wait_until("every cgroup is gone", Duration::from_secs(10), || {
        cgroup_dirs() <= cgroups_before
    });
    assert_eq!(fds_before, open_fds(), "descriptors leaked");
    assert_eq!(records(state.path()).len(), claims + 1);
}

fn capacity_counts_parked_cells() {
    let state = tempfile::tempdir().unwrap();
    let mut config = EngineConfig::new(state.path().to_path_buf(), Default::default());
    config.program = std::env::current_exe().unwrap();
    config.max_cells = 2;
    let engine = Engine::new(config);
    engine.keep_warm(plan(&["/bin/true"]), 2).unwrap();
    wait_parked(&engine, 2);
    // Both units are parked cells; a run of another shape needs a third.
    let finished = engine
        .run(request(
            plan(&["/bin/sh", "-c", "true"]).with_memory_mb(128),
            None,
        ))
        .unwrap_or_else(|r| panic!("refused: {:?}", r.report.error));
    assert_eq!(finished.report.status, ResultClass::CapacityExceeded);
    assert!(
        finished
            .report
            .error
            .as_deref()
            .unwrap_or("")
            .contains("engine.capacity"),
        "{:?}",
        finished.report.error
    );
}

/// `airlock doctor` counts live cells by their pid 1 (airlock_cell::census): the
/// engine's parked ones are there, parked, owned by this process.
fn parked_cells_are_visible_to_doctor() {
    let state = tempfile::tempdir().unwrap();
    let engine = engine(state.path());
    engine.keep_warm(plan(&["/bin/true"]), 2).unwrap();
    wait_parked(&engine, 2);
    let me = std::process::id();
    let mine: Vec<_> = airlock_cell::census::live_cells()
        .into_iter()
        .filter(|c| c.owner == me)
        .collect();
    assert_eq!(mine.len(), 2, "{mine:?}");
    assert!(mine.iter().all(|c| c.parked), "{mine:?}");
    assert!(airlock_cell::census::summary(&mine).contains("2 parked"));
}

trait WithMemory {
    fn with_memory_mb(self, mb: u64) -> Self;
}

impl WithMemory for CellPlan {
    fn with_memory_mb(mut self, mb: u64) -> CellPlan {
        self.limits.memory_bytes = mb << 20;
        self
    }
}

// ----- deaths -----

/// The owner process of the death tests: an engine with parked cells and a running
/// session command, its pids on stdout, then it waits to be killed.
fn owner_process() -> ! {
    let state = std::env::args().nth(2).expect("state dir");
    let engine = engine(Path::new(&state));
    engine.keep_warm(plan(&["/bin/true"]), 2).unwrap();
    wait_parked(&engine, 2);
    let session = engine
        .open_session(session_request(plan(&["/bin/true"])))
        .unwrap();
    session
        .exec(CommandRequest::new(&[
            "/bin/sh",
            "-c",
            "setsid sleep 1000 & sleep 1000",
        ]))
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    println!("ready {}", engine.factory_pid().unwrap_or(0));
    use std::io::Write;
    std::io::stdout().flush().unwrap();
    loop {
        std::thread::sleep(Duration::from_secs(60));
    }
}

/// The owner process, killed when the test ends however it ends.
struct Owner(std::process::Child);

impl Drop for Owner {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_owner(state: &Path) -> (Owner, u32, Vec<u32>) {
    use std::io::BufRead;
    let mut owner = std::process::Command::new(std::env::current_exe().unwrap())
        .arg(OWNER_ARG)
        .arg(state)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(owner.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let factory: u32 = line
        .trim()
        .strip_prefix("ready ")
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("owner said {line:?}"));
    let tree = descendants(owner.id());
    let owner = Owner(owner);
    // Factory, 3 supervisors, 3 cells' pid 1, payloads.
    assert!(tree.len() >= 7, "the owner's tree is {tree:?}");
    (owner, factory, tree)
}

fn killing_the_owner_leaves_no_cell() {
    let state = tempfile::tempdir().unwrap();
    let (owner, _, tree) = start_owner(state.path());
    // SIGKILL, as `Owner` ends it.
    drop(owner);
    wait_until_gone("every process of the owner", &tree);
}

fn killing_the_factory_leaves_no_cell() {
    let state = tempfile::tempdir().unwrap();
    let (_owner, factory, tree) = start_owner(state.path());
    let cells: Vec<u32> = tree.iter().copied().filter(|p| *p != factory).collect();
    kill_process(factory);
    wait_until_gone("every cell of the factory", &cells);
}

/// Waits until none of `pids` is alive; names those left (with their state and name).
fn wait_until_gone(what: &str, pids: &[u32]) {
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let left: Vec<String> = pids
            .iter()
            .filter(|p| alive(**p))
            .map(|p| {
                let stat = std::fs::read_to_string(format!("/proc/{p}/stat")).unwrap_or_default();
                let cgroup =
                    std::fs::read_to_string(format!("/proc/{p}/cgroup")).unwrap_or_default();
                format!("{stat} {cgroup}")
            })
            .collect();
        if left.is_empty() {
            return;
        }
        assert!(Instant::now() < until, "{what} is not gone: {left:#?}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn kill_process(pid: u32) {
    let status = std::process::Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}

// ----- sessions -----

fn session_request(plan: CellPlan) -> SessionRequest {
    SessionRequest {
        plan,
        workload_class: "engine-test".into(),
        credentials: Vec::new(),
        artifacts: None,
        idle_timeout: Duration::from_secs(30),
        max_lifetime: Duration::from_secs(120),
        tenant: None,
        after_close: None,
    }
}

fn command_output(session: &airlock_engine::Session, argv: &[&str]) -> (RunReport, String) {
    let (mut out, write) = pipe();
    let mut command = CommandRequest::new(argv);
    command.stdout = Some(write);
    let report = session.run(command).unwrap();
    let mut text = String::new();
    out.read_to_string(&mut text).unwrap();
    (report, text)
}

fn a_session_keeps_its_files_between_commands() {
    let state = tempfile::tempdir().unwrap();
    let engine = engine(state.path());
    let session = engine
        .open_session(session_request(plan(&["/bin/true"])))
        .unwrap();
    let (first, _) = command_output(&session, &["/bin/sh", "-c", "echo kept > /tmp/note"]);
    assert_eq!(first.status, ResultClass::Ok, "{:?}", first.error);
    let (second, out) = command_output(&session, &["/bin/cat", "/tmp/note"]);
    assert_eq!(second.status, ResultClass::Ok, "{:?}", second.error);
    assert_eq!(out.trim(), "kept");
    let session_id = session.id().to_string();
    let closed = session.close().unwrap();
    assert!(closed.cleanup.ok, "{:?}", closed.cleanup.leftovers);
    // Nothing of the closed session is reachable by the next one.
    let next = engine
        .open_session(session_request(plan(&["/bin/true"])))
        .unwrap();
    let (report, _) = command_output(&next, &["/bin/cat", "/tmp/note"]);
    assert_eq!(
        report.status,
        ResultClass::TaskError,
        "the file survived its session"
    );
    next.close().unwrap();
    // The session's record and its commands' records, which name it.
    let runs = records(state.path());
    let commands: Vec<_> = runs
        .iter()
        .filter(|r| r.session_id.as_deref() == Some(session_id.as_str()))
        .collect();
    assert_eq!(commands.len(), 2, "{runs:#?}");
    assert!(commands.iter().all(|r| r.status == "ok"));
    let own = runs
        .iter()
        .find(|r| r.run_id == session_id)
        .expect("session record");
    assert_ne!(own.status, "running");
}

/// A session's cell is built by the factory, whose supervisor makes the run CA
/// (crates/engine/src/host.rs): the cell's bundle is the host's plus one certificate of
/// its own, and two sessions get two CAs.
fn each_session_with_an_http_rule_trusts_its_own_run_ca() {
    let state = tempfile::tempdir().unwrap();
    let engine = engine(state.path());
    let contract = airlock_contract::parse_contract(
        "network:\n  mode: allowlist\n  allowed_domains: [api.test]\n  \
         http_rules:\n    - { host: api.test, methods: [GET] }\n",
        airlock_contract::ContractFormat::Yaml,
    )
    .unwrap();
    let argv = vec!["/bin/true".to_string()];
    let plan = compile(&contract, &CompileInput::new(Path::new("/"), &argv)).unwrap();
    let host_bundle = std::fs::read_to_string("/etc/ssl/certs/ca-certificates.crt").unwrap();
    let host_count = host_bundle.matches("BEGIN CERTIFICATE").count();
    let show = [
        "/bin/sh",
        "-c",
        "echo \"$SSL_CERT_FILE $NODE_EXTRA_CA_CERTS\"; \
         grep -c 'BEGIN CERTIFICATE' /etc/ssl/certs/ca-certificates.crt; \
         tail -n 3 /etc/ssl/certs/ca-certificates.crt | head -n 1",
    ];
    let mut last_lines = Vec::new();
    for _ in 0..2 {
        let session = engine.open_session(session_request(plan.clone())).unwrap();
        let (report, out) = command_output(&session, &show);
        assert_eq!(report.status, ResultClass::Ok, "{:?}", report.error);
        let lines: Vec<&str> = out.lines().collect();
        let bundle = "/etc/ssl/certs/ca-certificates.crt";
        assert_eq!(lines[0], format!("{bundle} {bundle}"), "{out}");
        assert_eq!(lines[1], (host_count + 1).to_string(), "{out}");
        last_lines.push(lines[2].to_string());
        session.close().unwrap();
    }
    assert_ne!(last_lines[0], last_lines[1], "two sessions, two CAs");
}

fn a_sessions_commands_never_outlive_it() {
    let state = tempfile::tempdir().unwrap();
    let engine = engine(state.path());
    let session = engine
        .open_session(session_request(plan(&["/bin/true"])))
        .unwrap();
    let (report, _) = command_output(
        &session,
        &[
            "/bin/sh",
            "-c",
            "setsid sleep 1000 >/dev/null 2>&1 & nohup sleep 1000 >/dev/null 2>&1 &",
        ],
    );
    assert_eq!(report.status, ResultClass::Ok, "{:?}", report.error);
    let tree = descendants(std::process::id());
    assert!(tree.iter().filter(|p| alive(**p)).count() >= 4, "{tree:?}");
    let closed = session.close().unwrap();
    assert!(closed.cleanup.ok, "{:?}", closed.cleanup.leftovers);
    wait_until("the daemons are gone", Duration::from_secs(5), || {
        tree.iter()
            .filter(|p| **p != engine.factory_pid().unwrap_or(0))
            .all(|p| !alive(*p))
    });
}

fn an_idle_session_expires_on_time() {
    let state = tempfile::tempdir().unwrap();
    let engine = engine(state.path());
    let mut request = session_request(plan(&["/bin/true"]));
    request.idle_timeout = Duration::from_millis(300);
    let session = engine.open_session(request).unwrap();
    let (report, _) = command_output(&session, &["/bin/true"]);
    assert_eq!(report.status, ResultClass::Ok);
    let idle_since = Instant::now();
    wait_until("the session expired", Duration::from_secs(5), || {
        session.closed().is_some()
    });
    let waited = idle_since.elapsed();
    assert!(
        waited >= Duration::from_millis(250),
        "expired early: {waited:?}"
    );
    assert!(
        waited < Duration::from_millis(2000),
        "expired late: {waited:?}"
    );
    let closed = session.closed().unwrap();
    assert!(closed.cleanup.ok, "{:?}", closed.cleanup.leftovers);
    assert!(
        session.exec(CommandRequest::new(&["/bin/true"])).is_err(),
        "an expired session ran a command"
    );
}

fn a_session_ends_at_its_lifetime() {
    let state = tempfile::tempdir().unwrap();
    let engine = engine(state.path());
    let mut request = session_request(plan(&["/bin/true"]));
    request.max_lifetime = Duration::from_millis(600);
    let built = Instant::now();
    let session = engine.open_session(request).unwrap();
    // Busy the whole time: the idle timeout never fires, the lifetime does.
    let sleeper = session
        .exec(CommandRequest::new(&["/bin/sleep", "30"]))
        .unwrap();
    wait_until("the session ended", Duration::from_secs(5), || {
        session.closed().is_some()
    });
    let lived = built.elapsed();
    assert!(
        lived >= Duration::from_millis(550),
        "ended early: {lived:?}"
    );
    assert!(lived < Duration::from_millis(3000), "ended late: {lived:?}");
    let closed = session.closed().unwrap();
    assert!(closed.cleanup.ok, "{:?}", closed.cleanup.leftovers);
    assert!(
        closed.notes.iter().any(|n| n.contains("lifetime")),
        "{:?}",
        closed.notes
    );
    let killed = session.wait(sleeper).unwrap();
    assert_ne!(killed.exit.code, Some(0), "{killed:?}");
}

fn two_sessions_never_see_each_other() {
    let state = tempfile::tempdir().unwrap();
    let engine = engine(state.path());
    let a = engine
        .open_session(session_request(plan(&["/bin/true"])))
        .unwrap();
    let b = engine
        .open_session(session_request(plan(&["/bin/true"])))
        .unwrap();
    // A leaves a file, a process, a System V queue and an abstract socket behind.
    let setup = a
        .exec(CommandRequest::new(&[
            "/usr/bin/python3",
            "-c",
            "import os,socket,sys,time\n\
             open('/tmp/secret-a','w').write('a')\n\
             s=socket.socket(socket.AF_UNIX); s.bind('\\0airlock-session-a'); s.listen()\n\
             import ctypes; libc=ctypes.CDLL(None); libc.msgget(0x5eed, 0o1666)\n\
             print('ready', flush=True); time.sleep(30)",
        ]))
        .unwrap();
    std::thread::sleep(Duration::from_millis(800));
    let probe = "import os,socket,ctypes\n\
        print('file', os.path.exists('/tmp/secret-a'))\n\
        print('procs', sorted(int(p) for p in os.listdir('/proc') if p.isdigit()) == sorted({1, os.getpid()}))\n\
        s=socket.socket(socket.AF_UNIX)\n\
        try:\n  s.connect('\\0airlock-session-a'); print('socket True')\n\
        except OSError: print('socket False')\n\
        libc=ctypes.CDLL(None); print('ipc', libc.msgget(0x5eed, 0) >= 0)";
    let (report, out) = command_output(&b, &["/usr/bin/python3", "-c", probe]);
    assert_eq!(report.status, ResultClass::Ok, "{:?} {out}", report.error);
    assert!(out.contains("file False"), "{out}");
    assert!(out.contains("socket False"), "{out}");
    assert!(out.contains("ipc False"), "{out}");
    // B sees its own pid 1 and the probe only, not A's python.
    assert!(out.contains("procs True"), "{out}");
    a.kill(setup).unwrap();
    a.close().unwrap();
    b.close().unwrap();
}

fn a_background_command_is_listed_and_killed() {
    let state = tempfile::tempdir().unwrap();
    let engine = engine(state.path());
    let session = engine
        .open_session(session_request(plan(&["/bin/true"])))
        .unwrap();
    let sleeper = session
        .exec(CommandRequest::new(&["/bin/sleep", "1000"]))
        .unwrap();
    let (report, _) = command_output(&session, &["/bin/true"]);
    assert_eq!(report.status, ResultClass::Ok, "the session went on");
    let listed = session.list();
    assert!(
        listed.iter().any(|c| c.id == sleeper && c.running),
        "{listed:?}"
    );
    session.kill(sleeper).unwrap();
    let killed = session.wait(sleeper).unwrap();
    assert_eq!(killed.exit.signal, Some(libc_sigkill()), "{killed:?}");
    assert!(session.list().iter().all(|c| !c.running));
    session.close().unwrap();
}

fn libc_sigkill() -> i32 {
    9
}
