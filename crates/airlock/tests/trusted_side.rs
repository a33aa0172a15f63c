//! The trusted side around the cell, through the real binary: stdin is streamed (and
//! bounded, and under the deadline), the process limit means what it says, `doctor` and
//! `run` agree for a user who cannot create cgroups, records belong to their caller, and
//! nothing printed for people is Rust debug output.

mod common;

use common::airlock_bin;
use serde_json::Value;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A copy of the binary that an unprivileged user can execute (the build tree may be
/// private to root).
fn world_executable_copy(dir: &Path) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let copy = dir.join("airlock");
    std::fs::copy(airlock_bin(), &copy).unwrap();
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(0o755)).unwrap();
    copy
}

/// `setpriv` to uid/gid 65534 with no supplementary groups.
fn as_nobody(program: &Path) -> Command {
    let mut cmd = Command::new("setpriv");
    cmd.args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(program)
        .env("HOME", "/nonexistent");
    cmd
}

#[test]
fn an_interactive_payload_answers_each_line_before_the_next_is_written() {
    require_cells!();
    let state = tempfile::tempdir().unwrap();
    let mut child = Command::new(airlock_bin())
        .args(["run", "--state-dir"])
        .arg(state.path())
        .args([
            "--",
            "sh",
            "-c",
            "while read line; do echo \"got $line\"; done",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    let (answers, received) = std::sync::mpsc::channel();
    let stdout = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let _ = answers.send(line.unwrap_or_default());
        }
    });
    // A request/response protocol (MCP, LSP, a REPL): the second request is only written
    // once the first is answered, so a stdin read to EOF before the start would hang here.
    for word in ["one", "two", "three"] {
        writeln!(input, "{word}").unwrap();
        input.flush().unwrap();
        let answer = received.recv_timeout(Duration::from_secs(10));
        assert_eq!(answer.as_deref(), Ok(format!("got {word}").as_str()));
    }
    drop(input);
    let status = child.wait().unwrap();
    assert!(status.success());
}

#[test]
fn a_slow_stdin_is_under_the_deadline_and_never_counted_as_startup() {
    require_cells!();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("c.yaml"),
        "resources:\n  wall_time_seconds: 2\n",
    )
    .unwrap();
    let result = dir.path().join("r.json");
    let started = Instant::now();
    // `sleep 8 | airlock run ... -- cat` with a 2 s deadline: airlock must end at 2 s.
    let mut writer = Command::new("sleep")
        .arg("8")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let out = Command::new(airlock_bin())
        .current_dir(dir.path())
        .args(["run", "-c", "c.yaml", "--state-dir", "state", "--result"])
        .arg(&result)
        .args(["--", "cat"])
        .stdin(Stdio::from(writer.stdout.take().unwrap()))
        .output()
        .unwrap();
    let elapsed = started.elapsed();
    let _ = writer.kill();
    let _ = writer.wait();
    let record: Value = serde_json::from_slice(&std::fs::read(&result).unwrap()).unwrap();
    assert_eq!(out.status.code(), Some(124), "{record}");
    assert_eq!(record["limit_fired"], "wall_time", "{record}");
    assert!(elapsed < Duration::from_secs(6), "took {elapsed:?}");
    let startup = record["timings"]["startup_ms"].as_f64().unwrap();
    assert!(
        startup < 1000.0,
        "waiting for stdin counted as startup: {startup} ms"
    );
    assert_eq!(record["stdin"]["mode"], "relayed", "{record}");
    assert_eq!(record["stdin"]["eof"], false, "{record}");
}

#[test]
fn an_endless_stdin_uses_no_host_disk_and_is_recorded() {
    require_cells!();
    let dir = tempfile::tempdir().unwrap();
    let result = dir.path().join("r.json");
    let mut yes = Command::new("yes").stdout(Stdio::piped()).spawn().unwrap();
    // The payload waits, then reads 64 MiB of the endless stream and stops.
    let airlock = Command::new(airlock_bin())
        .args(["run", "--state-dir"])
        .arg(dir.path().join("state"))
        .arg("--result")
        .arg(&result)
        .args(["--", "sh", "-c", "sleep 1; head -c 67108864 | wc -c"])
        .stdin(Stdio::from(yes.stdout.take().unwrap()))
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    // While the payload sleeps, the supervisor holds no spool file: only its store.
    let spools = deleted_files_held_by(airlock.id());
    let out = airlock.wait_with_output().unwrap();
    let _ = yes.kill();
    let _ = yes.wait();
    assert!(spools.is_empty(), "stdin spooled to {spools:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "67108864");
    let record: Value = serde_json::from_slice(&std::fs::read(&result).unwrap()).unwrap();
    assert_eq!(record["status"], "ok", "{record}");
    let read = record["stdin"]["bytes"].as_u64().unwrap();
    // What was read: what the payload took plus at most a pipe buffer and one chunk.
    assert!(
        (64 << 20..(64 << 20) + (1 << 20)).contains(&read),
        "{read} bytes read"
    );
    assert_eq!(record["stdin"]["eof"], false);
    assert_eq!(record["stdin"]["sha256"].as_str().unwrap().len(), 64);
}

/// Unlinked files `pid` has open (an unnamed spool file shows as `... (deleted)`).
fn deleted_files_held_by(pid: u32) -> Vec<String> {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|fds| {
            fds.flatten()
                .filter_map(|fd| std::fs::read_link(fd.path()).ok())
                .map(|target| target.display().to_string())
                .filter(|target| target.ends_with("(deleted)"))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn the_process_limit_counts_the_payloads_processes_exactly() {
    require_cells!();
    let dir = tempfile::tempdir().unwrap();
    // The shell plus two background children: three processes of the payload.
    let script = "sleep 1 & sleep 1 & wait && echo both-started";
    for (limit, works) in [(2, false), (3, true)] {
        let contract = format!("resources:\n  process_limit: {limit}\n");
        let run = common::run_in(dir.path(), Some(&contract), &[], &["sh", "-c", script]);
        assert_eq!(
            run.stdout().contains("both-started"),
            works,
            "process_limit {limit}: {}",
            run.describe()
        );
    }
}

#[test]
fn doctor_does_not_say_ok_for_cgroups_a_user_cannot_create() {
    require_cells!();
    let dir = tempfile::tempdir().unwrap();
    let copy = world_executable_copy(dir.path());
    let doctor = as_nobody(&copy).args(["doctor"]).output().unwrap();
    let text = String::from_utf8_lossy(&doctor.stdout);
    let cgroups = text
        .lines()
        .find(|l| l.split_whitespace().nth(1) == Some("cgroups"))
        .unwrap_or_else(|| panic!("no cgroups line:\n{text}"));
    // No subtree is delegated to uid 65534: both refuse before creating anything, for
    // the same reason (crates/cell/src/cgroup/mod.rs, `for_caller`).
    assert!(cgroups.starts_with("FAIL"), "{text}");
    assert!(cgroups.contains("cgroups.delegation"), "{text}");
    assert_eq!(doctor.status.code(), Some(1), "{text}");
    // And run agrees: the same user's run, with a state directory of its own (so that
    // its store and quarantine area are not what stops it), fails for the same reason.
    let state = dir.path().join("nobody-state");
    std::fs::create_dir(&state).unwrap();
    std::os::unix::fs::chown(&state, Some(65534), Some(65534)).unwrap();
    let run = as_nobody(&copy)
        .args(["run", "--state-dir"])
        .arg(&state)
        .args(["--", "true"])
        .output()
        .unwrap();
    assert_eq!(run.status.code(), Some(125));
    let said = String::from_utf8_lossy(&run.stderr);
    assert!(
        said.contains("sandbox_unavailable") && said.contains("cgroups.delegation"),
        "{said}"
    );
}

#[test]
fn runs_of_another_user_are_listed_only_when_asked_for() {
    require_cells!();
    let dir = tempfile::tempdir().unwrap();
    let copy = world_executable_copy(dir.path());
    let state = dir.path().join("shared-state");
    std::fs::create_dir(&state).unwrap();
    std::os::unix::fs::chown(&state, Some(65534), Some(65534)).unwrap();
    // The store is created by uid 65534; its refused run is recorded with that caller.
    let run = as_nobody(&copy)
        .args(["run", "--state-dir"])
        .arg(&state)
        .args(["--", "true"])
        .output()
        .unwrap();
    assert_eq!(run.status.code(), Some(125));
    // root refuses to open a store another user can write into (a planted link would have
    // it write through); an operator who takes the store over owns it first.
    let refused = Command::new(airlock_bin())
        .args(["runs", "list", "--state-dir"])
        .arg(&state)
        .output()
        .unwrap();
    assert_eq!(refused.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&refused.stderr).contains("belongs to uid 65534"));
    let chown = Command::new("chown")
        .arg("-R")
        .arg("0:0")
        .arg(&state)
        .status()
        .unwrap();
    assert!(chown.success());
    let list = |extra: &[&str]| -> Vec<Value> {
        let out = Command::new(airlock_bin())
            .args(["runs", "list", "--json", "--state-dir"])
            .arg(&state)
            .args(extra)
            .output()
            .unwrap();
        serde_json::from_slice(&out.stdout).unwrap()
    };
    assert!(
        list(&[]).is_empty(),
        "root sees another user's run by default"
    );
    let all = list(&["--all-users"]);
    assert_eq!(all.len(), 1);
    assert_eq!(all[0]["caller_uid"], 65534);
    let id = all[0]["run_id"].as_str().unwrap();
    let show = Command::new(airlock_bin())
        .args(["runs", "show", id, "--state-dir"])
        .arg(&state)
        .output()
        .unwrap();
    assert_eq!(show.status.code(), Some(1));
    let said = String::from_utf8_lossy(&show.stderr);
    assert!(
        said.contains("uid 65534") && said.contains("--all-users"),
        "{said}"
    );
}

#[test]
fn nothing_printed_for_people_is_rust_debug_output() {
    require_cells!();
    let state = tempfile::tempdir().unwrap();
    let run = Command::new(airlock_bin())
        .args(["run", "--state-dir"])
        .arg(state.path())
        .args(["--", "true"])
        .output()
        .unwrap();
    assert!(run.status.success());
    let list = Command::new(airlock_bin())
        .args(["runs", "list", "--json", "--state-dir"])
        .arg(state.path())
        .output()
        .unwrap();
    let runs: Vec<Value> = serde_json::from_slice(&list.stdout).unwrap();
    let id = runs[0]["run_id"].as_str().unwrap();
    let show = Command::new(airlock_bin())
        .args(["runs", "show", id, "--state-dir"])
        .arg(state.path())
        .output()
        .unwrap();
    let doctor = Command::new(airlock_bin()).arg("doctor").output().unwrap();
    for (what, bytes) in [("runs show", &show.stdout), ("doctor", &doctor.stdout)] {
        let text = String::from_utf8_lossy(bytes);
        for debug in ["Some(", "None", "V1 {", "V2 {", "LeftoverCgroup"] {
            assert!(!text.contains(debug), "{what} prints {debug:?}:\n{text}");
        }
    }
    assert!(String::from_utf8_lossy(&show.stdout).contains("exit       code 0 signal -"));
}

#[test]
fn a_reader_that_stops_early_is_not_an_error() {
    require_cells!();
    let state = tempfile::tempdir().unwrap();
    // More output than a pipe holds (64 KiB), so the writer meets the closed pipe.
    let long_argument = "x".repeat(8192);
    for _ in 0..12 {
        let run = Command::new(airlock_bin())
            .args(["run", "--state-dir"])
            .arg(state.path())
            .args(["--", "true", &long_argument])
            .output()
            .unwrap();
        assert!(run.status.success());
    }
    for args in [
        &["audit", "export", "--format", "jsonl"][..],
        &["runs", "list"][..],
    ] {
        // `airlock ... | head -c 1`: the reader closes the pipe after one byte.
        let mut child = Command::new(airlock_bin())
            .args(args)
            .arg("--state-dir")
            .arg(state.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdout = child.stdout.take().unwrap();
        let mut one = [0u8; 1];
        std::io::Read::read_exact(&mut stdout, &mut one).unwrap();
        drop(stdout);
        let out = child.wait_with_output().unwrap();
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(!said.contains("Broken pipe"), "{args:?}: {said}");
        assert!(!said.contains("panicked"), "{args:?}: {said}");
    }
}

#[test]
fn a_state_dir_other_users_can_write_to_refuses_the_run() {
    require_cells!();
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("shared");
    std::fs::create_dir(&state).unwrap();
    std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o777)).unwrap();
    let run = Command::new(airlock_bin())
        .args(["run", "--state-dir"])
        .arg(&state)
        .args(["--", "echo", "PAYLOAD-RAN"])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(125), "{said}");
    assert!(said.contains("writable by other users"), "{said}");
    assert!(!String::from_utf8_lossy(&run.stdout).contains("PAYLOAD-RAN"));
    assert!(
        !state.join("airlock.db").exists(),
        "no store was created there"
    );
}

#[test]
fn a_link_planted_in_the_state_dir_is_not_written_through() {
    require_cells!();
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let victim = dir.path().join("victim");
    std::fs::write(&victim, "victim").unwrap();
    let run = |argv: &[&str]| {
        Command::new(airlock_bin())
            .args(["run", "--state-dir"])
            .arg(&state)
            .arg("--")
            .args(argv)
            .output()
            .unwrap()
    };
    assert!(run(&["true"]).status.success());
    // Whoever could write there could make root write through a journal's name.
    let wal = state.join("airlock.db-wal");
    let _ = std::fs::remove_file(&wal);
    std::os::unix::fs::symlink(&victim, &wal).unwrap();
    let refused = run(&["echo", "PAYLOAD-RAN"]);
    let said = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(125), "{said}");
    assert!(
        said.contains("airlock.db-wal is not a plain file"),
        "{said}"
    );
    assert!(!String::from_utf8_lossy(&refused.stdout).contains("PAYLOAD-RAN"));
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "victim");
}

/// The cell factory's hidden argument is not a way in: started by anyone but the engine
/// (fd 0 not the engine's SEQPACKET socket), it forks nothing, even for a well-formed
/// spawn request written to its stdin, and says what it is.
#[test]
fn the_cell_factory_forks_nothing_for_a_caller_that_is_not_an_engine() {
    let forged = concat!(
        r#"{"Configure":{"egress":{},"host_ids":{"base":1000000000,"count":65536}}}"#,
        "\n",
        r#"{"Spawn":{"request":{}}}"#,
        "\n"
    );
    for stdin in ["null", "pipe"] {
        let mut factory = Command::new(airlock_bin())
            .arg("__airlock-cell-factory")
            .stdin(if stdin == "null" {
                Stdio::null()
            } else {
                Stdio::piped()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        if let Some(mut pipe) = factory.stdin.take() {
            let _ = pipe.write_all(forged.as_bytes());
        }
        let started = Instant::now();
        let out = factory.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "stdin {stdin}: {stderr}");
        assert!(
            stderr.contains("__airlock-cell-factory") && stderr.contains("engine's socket"),
            "stdin {stdin}: {stderr}"
        );
        assert!(started.elapsed() < Duration::from_secs(5), "stdin {stdin}");
        assert!(out.stdout.is_empty(), "stdin {stdin}");
    }
}

/// SIGINT, SIGTERM or SIGHUP to `airlock run` while its payload runs: the cell is
/// destroyed and its cgroups removed, the run is recorded with the signal named (never
/// left `running`, to be reaped `aborted` by a later run), and airlock then dies of that
/// signal, as a shell and `kill` expect of the command they signalled. With the signals'
/// default action airlock died at once and left its cell's cgroups behind.
#[test]
fn an_interrupted_run_destroys_and_records_its_cell_then_dies_of_the_signal() {
    use std::os::unix::process::ExitStatusExt;
    require_cells!();
    for (signal, name) in [
        (libc::SIGTERM, "SIGTERM"),
        (libc::SIGINT, "SIGINT"),
        (libc::SIGHUP, "SIGHUP"),
    ] {
        let state = tempfile::tempdir().unwrap();
        let child = Command::new(airlock_bin())
            .args(["run", "--state-dir"])
            .arg(state.path())
            .args(["--", "sleep", "600"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let supervisor = common::host::Supervisor::of(&child);
        let until = Instant::now() + Duration::from_secs(30);
        while common::host::cgroups_of(&supervisor).is_empty() {
            assert!(Instant::now() < until, "{name}: the cell never started");
            std::thread::sleep(Duration::from_millis(20));
        }
        // The payload runs once the cell's processes are more than pid 1.
        std::thread::sleep(Duration::from_millis(300));
        let sent = Command::new("kill")
            .args(["-s", name, &child.id().to_string()])
            .status()
            .unwrap();
        assert!(sent.success(), "{name}: kill");
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            out.status.signal(),
            Some(signal),
            "{name}: {:?} {stderr}",
            out.status
        );
        assert_eq!(
            common::host::cgroups_of(&supervisor),
            Vec::<std::path::PathBuf>::new(),
            "{name}: the cell's cgroups are gone when airlock has ended"
        );
        let list = Command::new(airlock_bin())
            .args(["runs", "list", "--json", "--state-dir"])
            .arg(state.path())
            .output()
            .unwrap();
        let runs: Value = serde_json::from_slice(&list.stdout).unwrap();
        let run = &runs[0];
        assert_eq!(run["status"], "runtime_fault", "{name}: {runs}");
        let shown = Command::new(airlock_bin())
            .args([
                "runs",
                "show",
                run["run_id"].as_str().unwrap(),
                "--json",
                "--state-dir",
            ])
            .arg(state.path())
            .output()
            .unwrap();
        let shown = String::from_utf8_lossy(&shown.stdout);
        assert!(
            shown.contains(&format!("airlock was sent {name}")),
            "{name}: {shown}"
        );
        let verify = Command::new(airlock_bin())
            .args(["audit", "verify", "--state-dir"])
            .arg(state.path())
            .output()
            .unwrap();
        assert!(
            verify.status.success(),
            "{}",
            String::from_utf8_lossy(&verify.stdout)
        );
    }
}
