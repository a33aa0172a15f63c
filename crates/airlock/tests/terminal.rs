//! The `terminal` contract option, through the real binary: the payload runs on a pty of
//! the cell's own devpts with the caller's window size; a person's terminal is relayed
//! raw and always restored; a program can drive the pty through pipes; and the
//! terminal-injection boundary (TIOCSTI, TIOCLINUX, the caller's own tty) stays closed.
//! Without the option nothing changes. Root; each test has its own `--state-dir`.
//!
//! The cases in `both_tiers!` run on the native cell and on gVisor, where runsc opens the
//! payload's pty on the host and sends its master to airlock's console socket
//! (crates/cell/src/gvisor/console.rs); where the tiers differ, the case says how. A
//! terminal handed to a service runs on the native tier only: on gVisor it is refused
//! (the last case).

mod common;

use common::host::Supervisor;
use common::served::Served;
use common::tier::Tier;
use common::{airlock_bin, CellRun};
use serde_json::Value;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

const TTY_CONTRACT: &str = "terminal: true\nenv: { PS1: 'cell$ ' }\n";

fn driver() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/pty_driver.py")
}

/// What the pty driver saw of one `airlock run` on its terminal.
struct Driven {
    report: Value,
    result: Value,
}

impl Driven {
    fn transcript(&self) -> &str {
        self.report["transcript"].as_str().unwrap_or("")
    }
    fn status(&self) -> i64 {
        self.report["status"].as_i64().unwrap_or(-1000)
    }
    /// The `airlock run` the driver started (its pid and start time name its cells).
    fn supervisor(&self) -> Supervisor {
        let supervisor = &self.report["supervisor"];
        Supervisor {
            pid: supervisor["pid"]
                .as_u64()
                .expect("the driver names airlock's pid") as u32,
            start_time: supervisor["start_time"].as_u64().unwrap(),
        }
    }

    /// The run was on `tier` and left nothing behind.
    fn assert_left_nothing(&self, tier: Tier) {
        if !self.result.is_null() {
            assert_eq!(
                self.result["plan"]["isolation"],
                tier.name(),
                "{}",
                self.describe()
            );
        }
        tier.assert_left_nothing(self.supervisor(), &self.result, &self.describe());
    }

    fn describe(&self) -> String {
        format!(
            "{}\nresult: {}",
            serde_json::to_string_pretty(&self.report).unwrap_or_default(),
            serde_json::to_string_pretty(&self.result).unwrap_or_default()
        )
    }
}

/// Runs `airlock run --contract <yaml> -- argv` on `tier` on a pty of `rows` x `cols`,
/// driven by `steps` (see tests/fixtures/pty_driver.py), in the driver's process with a
/// store of its own.
fn drive(
    tier: Tier,
    yaml: Option<&str>,
    rows: u16,
    cols: u16,
    steps: Value,
    argv: &[&str],
) -> Driven {
    drive_through(tier, None, yaml, rows, cols, steps, argv)
}

/// [`drive`], handed to `service` (`airlock run -v`, whose stderr says so) when given.
/// Checks that the run left nothing behind.
fn drive_through(
    tier: Tier,
    service: Option<&Served>,
    yaml: Option<&str>,
    rows: u16,
    cols: u16,
    steps: Value,
    argv: &[&str],
) -> Driven {
    let driven = drive_unchecked(tier, service, yaml, rows, cols, steps, argv);
    driven.assert_left_nothing(tier);
    driven
}

/// [`drive_through`] without the check: for a run whose caller checks later.
fn drive_unchecked(
    tier: Tier,
    service: Option<&Served>,
    yaml: Option<&str>,
    rows: u16,
    cols: u16,
    steps: Value,
    argv: &[&str],
) -> Driven {
    let dir = tempfile::tempdir().unwrap();
    let result = dir.path().join("result.json");
    let mut command = vec![airlock_bin().display().to_string(), "run".into()];
    match service {
        Some(_) => command.push("-v".into()),
        None => command.extend([
            "--state-dir".into(),
            dir.path().join("state").display().to_string(),
        ]),
    }
    command.extend(["--result".into(), result.display().to_string()]);
    let yaml = tier.contract(yaml);
    if let Some(yaml) = yaml {
        let contract = dir.path().join("contract.yaml");
        std::fs::write(&contract, yaml).unwrap();
        command.extend(["--contract".into(), contract.display().to_string()]);
    }
    command.push("--".into());
    command.extend(argv.iter().map(|a| a.to_string()));
    let _one_sandbox = tier.serial();
    let mut driver_command = Command::new("python3");
    match service {
        Some(service) => driver_command.env("AIRLOCK_SOCKET", service.sock()),
        None => driver_command.env_remove("AIRLOCK_SOCKET"),
    };
    let output = driver_command
        .arg(driver())
        .arg(steps.to_string())
        .arg(rows.to_string())
        .arg(cols.to_string())
        .args(&command)
        .output()
        .expect("python3 runs the pty driver");
    let report: Value = serde_json::from_slice(&output.stdout).unwrap_or_else(|_| {
        panic!(
            "driver failed: {}\n{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        )
    });
    let result = std::fs::read_to_string(&result)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or(Value::Null);
    Driven { report, result }
}

/// `airlock run` on `tier` with `stdin` piped in (a program driving a pty-based tool).
/// Checks that the run left nothing behind.
fn piped(tier: Tier, yaml: &str, stdin: &[u8], argv: &[&str]) -> CellRun {
    let dir = tempfile::tempdir().unwrap();
    let result = dir.path().join("result.json");
    let contract = dir.path().join("contract.yaml");
    std::fs::write(&contract, tier.contract(Some(yaml)).unwrap()).unwrap();
    let _one_sandbox = tier.serial();
    let mut child = Command::new(airlock_bin())
        .arg("run")
        .arg("--state-dir")
        .arg(dir.path().join("state"))
        .arg("--result")
        .arg(&result)
        .arg("--contract")
        .arg(&contract)
        .arg("--")
        .args(argv)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn airlock");
    let supervisor = Supervisor::of(&child);
    child.stdin.take().unwrap().write_all(stdin).unwrap();
    let mut run = CellRun::collect(child.wait_with_output().unwrap(), &result);
    run.supervisor = Some(supervisor);
    tier.assert_ran_on(&run);
    tier.assert_left_nothing(supervisor, &run.result, &run.describe());
    run
}

both_tiers! {
/// Natively the terminal is the cell's `/dev/pts/0`. On gVisor it is the host pty runsc
/// opened, which the Sentry serves as `host:[1]` (no path: `tty` names none); the
/// caller's resize reaches it through the master as natively.
fn with_a_terminal_the_payload_runs_on_its_own_pty_with_the_callers_window_size(tier) {
    require_cells!();
    let script = "tty; test -t 0 -a -t 1 -a -t 2 && echo all-terminals; stty size; \
                  read line; stty size";
    let run = drive(
        tier,
        Some(TTY_CONTRACT),
        33,
        101,
        serde_json::json!([
            ["expect", "33 101"],
            ["resize", 40, 120],
            ["sleep", 0.3],
            ["send", "\n"],
            ["expect", "40 120"],
        ]),
        &["sh", "-c", script],
    );
    let text = run.transcript();
    assert!(run.report["failed"].is_null(), "{}", run.describe());
    let name = match tier {
        Tier::Native => "/dev/pts/0",
        Tier::Gvisor => "not a tty",
    };
    assert!(text.contains(name), "{}", run.describe());
    assert!(text.contains("all-terminals"), "{}", run.describe());
    assert_eq!(run.status(), 0, "{}", run.describe());
    assert_eq!(
        run.result["stdin"]["mode"],
        "terminal",
        "{}",
        run.describe()
    );
}
}

/// An interactive bash on the cell's terminal (handed to `service` when given): it
/// answers a typed line, Ctrl-C ends its foreground job and not airlock (raw at the
/// caller, Ctrl-C is a byte the cell's line discipline makes that job's SIGINT), and its
/// exit status is the run's.
fn interactive_shell(tier: Tier, service: Option<&Served>) -> Driven {
    let run = drive_through(
        tier,
        service,
        Some(TTY_CONTRACT),
        24,
        80,
        serde_json::json!([
            ["expect", "cell\\$ "],
            ["send", "echo $((6 * 7))\n"],
            // The next line only once the prompt is back (see the python test below).
            ["expect", "[\r\n]42\r\n[\\s\\S]*cell\\$ "],
            ["send", "sleep 30\n"],
            ["sleep", 0.5],
            ["send", "\u{3}"],
            ["expect", "\\^C[\\s\\S]*cell\\$ "],
            ["send", "echo alive; exit 5\n"],
        ]),
        &["bash", "--norc", "-i"],
    );
    assert!(run.report["failed"].is_null(), "{}", run.describe());
    assert!(run.transcript().contains("alive"), "{}", run.describe());
    assert_eq!(run.status(), 5, "{}", run.describe());
    assert_eq!(run.result["status"], "task_error", "{}", run.describe());
    run
}

both_tiers! {
fn an_interactive_shell_answers_a_typed_line_and_ctrl_c_reaches_the_payload(tier) {
    require_cells!();
    interactive_shell(tier, None);
}
}

both_tiers! {
fn a_python_repl_in_the_cell_answers_through_the_pty(tier) {
    require_cells!();
    let run = drive(
        tier,
        Some(TTY_CONTRACT),
        24,
        80,
        serde_json::json!([
            ["expect", ">>> "],
            ["send", "print(6 * 7)\n"],
            // Ctrl-D only once the next prompt is up: readline may flush typed-ahead
            // input when it takes the terminal again (TCSAFLUSH).
            ["expect", "[\r\n]42\r\n>>> "],
            ["send", "\u{4}"],
        ]),
        &["python3", "-q", "-i"],
    );
    assert!(run.report["failed"].is_null(), "{}", run.describe());
    assert_eq!(run.status(), 0, "{}", run.describe());
}
}

both_tiers! {
fn the_callers_terminal_is_raw_during_the_run_and_restored_after_it(tier) {
    require_cells!();
    let run = drive(
        tier,
        Some(TTY_CONTRACT),
        24,
        80,
        serde_json::json!([["await_raw"], ["send", "x\n"]]),
        &["sh", "-c", "read x; echo got-$x"],
    );
    assert_eq!(run.report["raw_during_run"], true, "{}", run.describe());
    assert_eq!(run.report["modes_restored"], true, "{}", run.describe());
    assert!(run.transcript().contains("got-x"), "{}", run.describe());
}
}

both_tiers! {
fn the_callers_terminal_is_restored_after_a_deadline_kill(tier) {
    require_cells!();
    let run = drive(
        tier,
        Some("terminal: true\nresources: { wall_time_seconds: 1 }\n"),
        24,
        80,
        serde_json::json!([["await_raw"]]),
        &["sh", "-c", "trap '' TERM; sleep 30"],
    );
    assert_eq!(run.report["raw_during_run"], true, "{}", run.describe());
    assert_eq!(run.status(), 124, "{}", run.describe());
    assert_eq!(run.result["limit_fired"], "wall_time", "{}", run.describe());
    assert_eq!(run.report["modes_restored"], true, "{}", run.describe());
}
}

both_tiers! {
/// On gVisor the sandbox is killed and torn down before airlock dies of the signal:
/// nothing is left at once. Natively the cell dies with its supervisor, as without a
/// terminal, and its cgroups are reaped by the next run (as after a SIGKILL).
fn the_callers_terminal_is_restored_before_airlock_dies_of_a_signal(tier) {
    require_cells!();
    let mut ended = Vec::new();
    for signal in ["TERM", "HUP"] {
        let run = drive_unchecked(
            tier,
            None,
            Some(TTY_CONTRACT),
            24,
            80,
            serde_json::json!([["await_raw"], ["signal", signal]]),
            &["sleep", "30"],
        );
        assert_eq!(run.report["raw_during_run"], true, "{}", run.describe());
        // Killed by the signal, as without a terminal; the cell goes with it.
        assert!(run.status() < 0, "{signal}: {}", run.describe());
        assert_eq!(
            run.report["modes_restored"],
            true,
            "{signal}: {}",
            run.describe()
        );
        ended.push(run);
    }
    if tier == Tier::Native {
        drive(tier, None, 24, 80, serde_json::json!([]), &["true"]);
    }
    for run in &ended {
        run.assert_left_nothing(tier);
    }
}
}

both_tiers! {
/// On gVisor the plan's seccomp policy denies them in the Sentry (the spec's
/// `linux.seccomp`), before the host pty is reached.
fn tiocsti_and_tioclinux_on_the_cells_terminal_are_denied(tier) {
    require_cells!();
    // Typing into its own terminal would type into whatever reads it next; the filter
    // refuses it on the pty the payload was given as on any other.
    let probe = "import fcntl, termios\n\
                 for name, request in (('TIOCSTI', termios.TIOCSTI), ('TIOCLINUX', 0x541C)):\n\
                 \x20   try:\n\
                 \x20       fcntl.ioctl(0, request, b'x')\n\
                 \x20       print(name, 'ALLOWED')\n\
                 \x20   except OSError as err:\n\
                 \x20       print(name, 'denied', err.errno)\n";
    let run = drive(
        tier,
        Some(TTY_CONTRACT),
        24,
        80,
        serde_json::json!([]),
        &["python3", "-c", probe],
    );
    let text = run.transcript();
    assert!(
        text.contains(&format!("TIOCSTI denied {}", libc::EPERM)),
        "{}",
        run.describe()
    );
    assert!(
        text.contains(&format!("TIOCLINUX denied {}", libc::EPERM)),
        "{}",
        run.describe()
    );
    assert!(!text.contains("ALLOWED"), "{}", run.describe());
}
}

both_tiers! {
/// Natively the cell has its own devpts instance with its pty 0. On gVisor `/dev/pts` is
/// the Sentry's own devpts: the host pty runsc opened for the payload is not in it (the
/// payload holds it only as `host:[1]`, served by the Sentry), and a pair opened there
/// is the Sentry's.
fn the_payload_cannot_reach_the_callers_terminal_and_its_devpts_is_its_own(tier) {
    require_cells!();
    // The caller's pty is /dev/pts/N (N > 0) of the host's devpts; in the cell only its
    // own instance exists, with its own pty 0, and a new pair opened there is the
    // cell's pty 1.
    let probe = r#"
import os, sys
links = sorted({os.readlink('/proc/self/fd/%d' % fd) for fd in (0, 1, 2)})
print('stdio', links)
print('pts', sorted(os.listdir('/dev/pts')))
caller = sys.argv[1]
try:
    os.close(os.open(caller, os.O_RDWR | os.O_NOCTTY))
    print('caller', caller, 'OPENED')
except OSError as err:
    print('caller', caller, 'refused', err.errno)
master, slave = os.openpty()
print('new pair', os.ttyname(slave))
"#;
    // The driver's pty number is only known once it runs: the probe reads the caller's
    // path from the driver's report of a first run.
    let first = drive(
        tier,
        Some(TTY_CONTRACT),
        24,
        80,
        serde_json::json!([]),
        &["true"],
    );
    let caller = first.report["caller_tty"].as_str().unwrap().to_string();
    assert_ne!(caller, "/dev/pts/0");
    let run = drive(
        tier,
        Some(TTY_CONTRACT),
        24,
        80,
        serde_json::json!([]),
        &["python3", "-c", probe, &caller],
    );
    let text = run.transcript();
    let (stdio, pts) = match tier {
        Tier::Native => ("stdio ['/dev/pts/0']", "pts ['0', 'ptmx']"),
        Tier::Gvisor => ("stdio ['host:[1]']", "pts ['ptmx']"),
    };
    assert!(text.contains(stdio), "{}", run.describe());
    assert!(text.contains(pts), "{}", run.describe());
    assert!(text.contains("refused"), "{}", run.describe());
    assert!(!text.contains("OPENED"), "{}", run.describe());
    // Natively pty 0 is the payload's; the Sentry's devpts had none before.
    let pair = match tier {
        Tier::Native => "new pair /dev/pts/1",
        Tier::Gvisor => "new pair /dev/pts/0",
    };
    assert!(text.contains(pair), "{}", run.describe());
}
}

both_tiers! {
fn output_bytes_still_truncates_a_chatty_terminal_payload(tier) {
    require_cells!();
    let run = piped(
        tier,
        "terminal: true\nresources: { output_bytes: 1000 }\n",
        b"",
        &["sh", "-c", "yes | head -c 100000"],
    );
    assert_eq!(run.status(), "capacity_exceeded", "{}", run.describe());
    assert_eq!(
        run.limit_fired(),
        Some("output_bytes"),
        "{}",
        run.describe()
    );
    assert!(run.output.stdout.len() <= 1000, "{}", run.describe());
    let seen = run.result["output"]["stdout"]["bytes_seen"]
        .as_u64()
        .unwrap_or(0);
    assert!(seen >= 100_000, "{}", run.describe());
}
}

both_tiers! {
fn a_piped_caller_drives_the_terminal_and_its_eof_ends_the_payloads_input(tier) {
    require_cells!();
    // A program driving a pty-based tool: input relayed into the master, the end of it
    // typed as Ctrl-D, so `cat` ends on its own long before the deadline.
    let run = piped(
        tier,
        "terminal: true\nresources: { wall_time_seconds: 20 }\n",
        b"hello pty\n",
        &["sh", "-c", "test -t 0 && echo stdin-is-a-terminal; cat"],
    );
    assert_eq!(run.code(), 0, "{}", run.describe());
    assert!(
        run.stdout().contains("stdin-is-a-terminal"),
        "{}",
        run.describe()
    );
    // Echoed by the terminal, then printed by cat.
    assert_eq!(
        run.stdout().matches("hello pty").count(),
        2,
        "{}",
        run.describe()
    );
    assert_eq!(
        run.result["stdin"]["mode"],
        "terminal",
        "{}",
        run.describe()
    );
    assert_eq!(run.result["stdin"]["bytes"], 10, "{}", run.describe());
    assert_eq!(run.result["stdin"]["eof"], true, "{}", run.describe());
}
}

both_tiers! {
fn without_the_option_a_caller_terminal_is_not_given_to_the_payload(tier) {
    require_cells!();
    // tty_nr, field 7 of /proc/self/stat, is 0 without a controlling terminal.
    let script = "tty; test -t 1 || echo stdout-not-a-terminal; \
                  echo tty_nr=$(cut -d' ' -f7 /proc/self/stat)";
    let run = drive(
        tier,
        None,
        24,
        80,
        serde_json::json!([]),
        &["sh", "-c", script],
    );
    let text = run.transcript();
    assert!(text.contains("not a tty"), "{}", run.describe());
    assert!(text.contains("stdout-not-a-terminal"), "{}", run.describe());
    assert!(text.contains("tty_nr=0"), "{}", run.describe());
    assert_eq!(run.result["stdin"]["mode"], "none", "{}", run.describe());
    assert_eq!(run.report["modes_restored"], true, "{}", run.describe());
}
}

// ---- handed to a running service (crates/engine/src/handoff.rs) ----
// Native: a gVisor run in the service is supervised on one of its threads, which does
// not take a caller's terminal (the last case shows the refusal).

/// `airlock serve` on its unix socket only.
fn service() -> Served {
    Served::start("[server]\nlisten = [\"unix:SOCK\"]\n", |_| {})
}

fn handed_over(run: &Driven) -> bool {
    run.report["stderr"]
        .as_str()
        .is_some_and(|e| e.contains("handed to the service"))
}

#[test]
fn handed_to_a_service_the_payload_gets_a_cell_pts_that_follows_the_callers_window() {
    require_cells!();
    // The service's cell is in no session of the caller's: it gets no SIGWINCH, and
    // follows the window size by looking at the caller's terminal.
    let service = service();
    let script = "tty; stty size; read line; stty size";
    let run = drive_through(
        Tier::Native,
        Some(&service),
        Some(TTY_CONTRACT),
        33,
        101,
        serde_json::json!([
            ["expect", "33 101"],
            ["await_raw"],
            ["resize", 40, 120],
            ["sleep", 0.6],
            ["send", "\n"],
            ["expect", "40 120"],
        ]),
        &["sh", "-c", script],
    );
    assert!(handed_over(&run), "{}", run.describe());
    assert!(run.report["failed"].is_null(), "{}", run.describe());
    assert!(
        run.transcript().contains("/dev/pts/0"),
        "{}",
        run.describe()
    );
    assert_eq!(run.status(), 0, "{}", run.describe());
    assert_eq!(run.report["raw_during_run"], true, "{}", run.describe());
    assert_eq!(run.report["modes_restored"], true, "{}", run.describe());
    assert_eq!(
        run.result["stdin"]["mode"],
        "terminal",
        "{}",
        run.describe()
    );
}

#[test]
fn handed_to_a_service_an_interactive_shell_answers_and_ctrl_c_reaches_the_payload() {
    require_cells!();
    let service = service();
    let run = interactive_shell(Tier::Native, Some(&service));
    assert!(handed_over(&run), "{}", run.describe());
}

#[test]
fn handed_to_a_service_the_payload_cannot_reach_the_callers_terminal_or_type_into_its_own() {
    require_cells!();
    // The service holds the caller's terminal to relay it; the payload still sees only
    // its cell's devpts, and TIOCSTI/TIOCLINUX stay denied on it.
    let probe = r#"
import fcntl, os, sys, termios
print('stdio', sorted({os.readlink('/proc/self/fd/%d' % fd) for fd in (0, 1, 2)}))
print('pts', sorted(os.listdir('/dev/pts')))
caller = sys.argv[1]
try:
    os.close(os.open(caller, os.O_RDWR | os.O_NOCTTY))
    print('caller', caller, 'OPENED')
except OSError as err:
    print('caller', caller, 'refused', err.errno)
for name, request in (('TIOCSTI', termios.TIOCSTI), ('TIOCLINUX', 0x541C)):
    try:
        fcntl.ioctl(0, request, b'x')
        print(name, 'ALLOWED')
    except OSError as err:
        print(name, 'denied', err.errno)
"#;
    let service = service();
    let first = drive_through(
        Tier::Native,
        Some(&service),
        Some(TTY_CONTRACT),
        24,
        80,
        serde_json::json!([]),
        &["true"],
    );
    let caller = first.report["caller_tty"].as_str().unwrap().to_string();
    let run = drive_through(
        Tier::Native,
        Some(&service),
        Some(TTY_CONTRACT),
        24,
        80,
        serde_json::json!([]),
        &["python3", "-c", probe, &caller],
    );
    let text = run.transcript();
    assert!(handed_over(&run), "{}", run.describe());
    assert!(text.contains("stdio ['/dev/pts/0']"), "{}", run.describe());
    assert!(text.contains("pts ['0', 'ptmx']"), "{}", run.describe());
    assert!(text.contains("refused"), "{}", run.describe());
    assert!(
        text.contains(&format!("TIOCSTI denied {}", libc::EPERM)),
        "{}",
        run.describe()
    );
    assert!(
        text.contains(&format!("TIOCLINUX denied {}", libc::EPERM)),
        "{}",
        run.describe()
    );
    assert!(
        !text.contains("ALLOWED") && !text.contains("OPENED"),
        "{}",
        run.describe()
    );
}

#[test]
fn handed_to_a_service_a_client_killed_by_a_signal_restores_its_terminal_and_ends_the_cell() {
    require_cells!();
    let service = service();
    let marker = format!("tty-orphan-{}", std::process::id());
    let script = format!("sleep 30; : {marker}");
    for signal in ["TERM", "HUP"] {
        let run = drive_through(
            Tier::Native,
            Some(&service),
            Some(TTY_CONTRACT),
            24,
            80,
            serde_json::json!([["await_raw"], ["sleep", 0.3], ["signal", signal]]),
            &["sh", "-c", &script],
        );
        assert_eq!(run.report["raw_during_run"], true, "{}", run.describe());
        assert!(run.status() < 0, "{signal}: {}", run.describe());
        assert_eq!(
            run.report["modes_restored"],
            true,
            "{signal}: {}",
            run.describe()
        );
    }
    // Both runs were destroyed in the service when their clients went away.
    let ended = common::finished_runs(&service.state_dir(), &marker, 2);
    assert_eq!(ended.len(), 2, "{ended:?}");
    for run in ended {
        assert_eq!(run["status"], "runtime_fault", "{run}");
        let error = run["result"]["error"].as_str().unwrap_or_default();
        assert!(error.contains("the caller went away"), "{run}");
    }
    let left = Command::new("pgrep")
        .args(["-f", &marker])
        .output()
        .unwrap();
    assert!(
        left.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&left.stdout)
    );
}

/// A terminal handed to a service on gVisor is refused, not run without the caller's
/// window and signals: the service supervises a gVisor run on one of its threads, which
/// does not take a caller's terminal (crates/cell/src/gvisor/mod.rs). The client's
/// terminal is restored and nothing ran.
#[test]
fn handed_to_a_service_a_gvisor_terminal_is_refused_and_nothing_runs() {
    require_cells!();
    let service = service();
    let run = drive_through(
        Tier::Gvisor,
        Some(&service),
        Some(TTY_CONTRACT),
        24,
        80,
        serde_json::json!([]),
        &["sh", "-c", "echo PAYLOAD-RAN"],
    );
    assert!(handed_over(&run), "{}", run.describe());
    assert_eq!(run.status(), 125, "{}", run.describe());
    assert!(
        run.report["stderr"]
            .as_str()
            .is_some_and(|e| e.contains("gvisor.terminal")),
        "{}",
        run.describe()
    );
    assert!(
        !run.transcript().contains("PAYLOAD-RAN"),
        "{}",
        run.describe()
    );
    assert_eq!(run.report["modes_restored"], true, "{}", run.describe());
}
