//! `exec` and `--console-socket` of airlock's OCI runtime (crates/airlock/src/oci/exec.rs,
//! crates/cell/src/exec_door.rs) through containerd's runc shim, driven with `ctr`: a
//! further process of a running container runs in the container's cell (its files, its
//! pid namespace, its identity, no capability, seccomp, its pids ceiling), its output and
//! exit status come back, each exec has a record naming the container's run; a container
//! and an exec get a terminal of the cell's devpts through the console socket. Denied:
//! another identity, capabilities beyond the default set, an exec into a stopped
//! container, host files. Nothing is left after delete. Needs root, containerd, ctr,
//! busybox-static and util-linux's `script` (installed by .ci/run).

mod common;

use common::containerd::{self, text, Containerd};
use serde_json::{json, Value};
use std::process::{Command, Output};

fn started(containerd: &Containerd, id: &str, script: &str) {
    let out = containerd.run(&["-d"], id, &["/bin/sh", "-c", script]);
    assert!(
        out.status.success(),
        "{}\n{}",
        common::output_text(&out),
        containerd.log()
    );
    containerd.wait_status(id, "RUNNING");
}

fn exec(containerd: &Containerd, id: &str, exec_id: &str, script: &str) -> Output {
    containerd.ctr(&[
        "task",
        "exec",
        "--exec-id",
        exec_id,
        id,
        "/bin/sh",
        "-c",
        script,
    ])
}

/// The records of container `id`'s execs, newest first.
fn exec_records(containerd: &Containerd, id: &str) -> Vec<Value> {
    containerd
        .records()
        .into_iter()
        .filter(|r| r["result"]["container"]["id"] == id && !r["session_id"].is_null())
        .collect()
}

fn ended_and_deleted(containerd: &Containerd, id: &str) -> Value {
    let kill = containerd.ctr(&["task", "kill", "-s", "SIGKILL", id]);
    assert!(kill.status.success(), "{}", common::output_text(&kill));
    containerd.wait_status(id, "STOPPED");
    let delete = containerd.ctr(&["task", "delete", id]);
    assert!(delete.status.success(), "{}", common::output_text(&delete));
    let delete = containerd.ctr(&["container", "delete", id]);
    assert!(delete.status.success(), "{}", common::output_text(&delete));
    let record = containerd.record_of(id);
    containerd.assert_nothing_left(id, &record);
    no_exec_waiter_left(containerd);
    record
}

/// No `__exec-wait` of this test's namespace is alive.
fn no_exec_waiter_left(containerd: &Containerd) {
    let root = containerd.runtime_root().display().to_string();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        assert!(
            !(cmdline.contains("__exec-wait") && cmdline.contains(&root)),
            "an exec's waiter is left: {cmdline}"
        );
    }
}

/// What an exec sees of its cell: the file the container's init wrote, the cell's pid
/// namespace (its pid 1, the init's sleep, no host process), its identity, no
/// capability, seccomp, no host file.
const EXEC_PROBE: &str = r#"
cat /tmp/from-init
echo "uid=$(id -u)"
for p in /proc/[0-9]*; do echo "comm=$(cat $p/comm 2>/dev/null)"; done
grep -E '^(CapEff|CapPrm|CapBnd|NoNewPrivs|Seccomp):' /proc/self/status
echo "uidmap=$(cat /proc/self/uid_map)"
cat "HOST_SECRET_PATH" 2>/dev/null && echo "HOST FILE READ"
mount -t tmpfs none /tmp 2>/dev/null && echo "MOUNTED"
echo "exec says hi" >&2
exit 3
"#;

#[test]
fn an_exec_runs_in_the_containers_cell_with_its_output_status_and_record() {
    require_cells!();
    let containerd = Containerd::start("exec");
    let secret = containerd.path("host-secret");
    std::fs::write(&secret, "host secret\n").unwrap();
    started(
        &containerd,
        "t1",
        "echo written-by-init > /tmp/from-init; sleep 600",
    );
    let probe = EXEC_PROBE.replace("HOST_SECRET_PATH", &secret.display().to_string());
    let out = exec(&containerd, "t1", "x1", &probe);
    let stdout = text(&out);
    assert_eq!(
        out.status.code(),
        Some(3),
        "the exec's status: {}\n{}",
        common::output_text(&out),
        containerd.log()
    );
    assert!(
        stdout.contains("written-by-init"),
        "the same cell: {stdout}"
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("exec says hi"),
        "{}",
        common::output_text(&out)
    );
    assert!(
        stdout.contains("uid=10001"),
        "the container's identity: {stdout}"
    );
    assert!(
        stdout.contains("comm=airlock-init"),
        "the cell's pid 1: {stdout}"
    );
    assert!(
        stdout.contains("comm=sleep"),
        "the init's process: {stdout}"
    );
    assert!(
        !stdout.contains("comm=containerd"),
        "a host process: {stdout}"
    );
    containerd::assert_has_lines(&stdout, containerd::CONFINED);
    // uid 0 of process.json (what ctr sends for this image) is the container's identity,
    // mapped to an unprivileged host id: never host root.
    let map = stdout
        .lines()
        .find_map(|l| l.strip_prefix("uidmap="))
        .unwrap_or_default()
        .split_whitespace()
        .map(str::to_owned)
        .collect::<Vec<_>>();
    assert_eq!(map.first().map(String::as_str), Some("10001"), "{stdout}");
    assert_ne!(
        map.get(1).map(String::as_str),
        Some("0"),
        "host root: {stdout}"
    );
    for breach in ["HOST FILE READ", "host secret", "MOUNTED"] {
        assert!(!stdout.contains(breach), "{breach}: {stdout}");
    }
    // A second exec, successful, while the container runs on.
    let out = exec(&containerd, "t1", "x2", "cat /tmp/from-init");
    assert!(out.status.success(), "{}", common::output_text(&out));
    // A detached exec, signalled through the shim: the signal reaches the command.
    let out = containerd.ctr(&[
        "task",
        "exec",
        "-d",
        "--exec-id",
        "x3",
        "t1",
        "sleep",
        "600",
    ]);
    assert!(out.status.success(), "{}", common::output_text(&out));
    let kill = containerd.ctr(&["task", "kill", "--exec-id", "x3", "-s", "SIGTERM", "t1"]);
    assert!(kill.status.success(), "{}", common::output_text(&kill));
    let until = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let signalled = loop {
        let sleep = exec_records(&containerd, "t1")
            .into_iter()
            .find(|r| r["argv"][0] == "sleep" && r["status"] != "running");
        if let Some(record) = sleep {
            break record;
        }
        assert!(
            std::time::Instant::now() < until,
            "the signalled exec never ended"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    assert_eq!(signalled["exit_signal"], 15, "{signalled:#}");
    let records = exec_records(&containerd, "t1");
    assert_eq!(records.len(), 3, "{records:#?}");
    let probe_record = records
        .iter()
        .find(|r| r["exit_code"] == 3)
        .unwrap_or_else(|| panic!("{records:#?}"));
    assert_eq!(probe_record["status"], "task_error", "{probe_record:#}");
    assert_eq!(probe_record["workload_class"], "container");
    let container = ended_and_deleted(&containerd, "t1");
    assert_eq!(
        probe_record["session_id"], container["run_id"],
        "an exec is a command of the container's run"
    );
}

#[test]
fn an_execs_processes_count_against_the_containers_pids_ceiling() {
    require_cells!();
    let containerd = Containerd::start("exec-pids");
    std::fs::write(
        containerd.path("contracts/default.yaml"),
        "resources:\n  process_limit: 12\n",
    )
    .unwrap();
    started(&containerd, "t2", "sleep 600");
    // Sixty background sleeps (a bounded fork bomb) against a ceiling of twelve: the
    // shell ends when it cannot fork (busybox sh exits 2).
    let bomb = "for i in $(seq 60); do sleep 30 & done; echo ALL FORKED";
    let out = exec(&containerd, "t2", "x1", bomb);
    assert!(
        !text(&out).contains("ALL FORKED"),
        "sixty processes in a cell of twelve: {}",
        common::output_text(&out)
    );
    // The container's processes, as the shim lists them (the supervisor's descendants:
    // the cell's pid 1, the init's sleep, what the exec left running).
    let ps = containerd.ctr(&["task", "ps", "t2"]);
    let pids = text(&ps)
        .lines()
        .filter(|l| l.trim().chars().next().is_some_and(|c| c.is_ascii_digit()))
        .count();
    assert!(
        pids > 3 && pids <= 13,
        "the exec's processes are the cell's, held by its ceiling: {}",
        text(&ps)
    );
    let record = ended_and_deleted(&containerd, "t2");
    let hit = record["result"]["limits_hit"].to_string();
    assert!(hit.contains("pids"), "the container's ceiling fired: {hit}");
}

#[test]
fn a_container_and_an_exec_get_a_terminal_of_the_cell() {
    require_cells!();
    let containerd = Containerd::start("exec-tty");
    let runtime = containerd.runtime();
    let out = containerd.ctr_on_a_terminal(&[
        "run",
        "--runtime",
        "io.containerd.runc.v2",
        "--runc-binary",
        &runtime,
        "-t",
        "--rm",
        common::containerd::IMAGE,
        "t3",
        "/bin/sh",
        "-c",
        // A moment before the end: ctr copies the terminal's output while it runs.
        "tty; id -u; sleep 1",
    ]);
    let stdout = text(&out);
    assert!(
        stdout.contains("/dev/pts/"),
        "a terminal for the container: {}\n{}",
        common::output_text(&out),
        containerd.log()
    );
    assert!(stdout.contains("10001"), "{stdout}");
    let record = containerd.record_of("t3");
    assert_eq!(record["plan"]["terminal"], true, "{:#}", record["plan"]);
    started(&containerd, "t4", "sleep 600");
    let out = containerd.ctr_on_a_terminal(&[
        "task",
        "exec",
        "-t",
        "--exec-id",
        "x1",
        "t4",
        "/bin/sh",
        "-c",
        "tty; echo pts: $(ls /dev/pts); sleep 1",
    ]);
    assert!(
        text(&out).contains("/dev/pts/"),
        "a terminal for the exec: {}\n{}",
        common::output_text(&out),
        containerd.log()
    );
    // The cell's own devpts: its one pty, none of the host's.
    assert!(
        text(&out).contains("pts: 0 ptmx"),
        "{}",
        common::output_text(&out)
    );
    ended_and_deleted(&containerd, "t4");
}

/// `airlock-runc exec` as the shim calls it, on this test's state root and store.
fn runtime_exec(containerd: &Containerd, id: &str, process: &Value) -> Output {
    let path = containerd.path(&format!("process-{id}.json"));
    std::fs::write(&path, process.to_string()).unwrap();
    Command::new(common::airlock_bin())
        .args(["oci", "--root"])
        .arg(containerd.runtime_root())
        .args(["exec", "--process"])
        .arg(&path)
        .arg(id)
        .env("AIRLOCK_CONFIG", containerd.path("airlock.toml"))
        .env("AIRLOCK_CONTRACTS_DIR", containerd.path("contracts"))
        .output()
        .unwrap()
}

fn process(extra: Value) -> Value {
    let mut process = json!({
        "user": {"uid": 0, "gid": 0},
        "args": ["/bin/true"],
        "env": ["PATH=/bin"],
        "cwd": "/",
    });
    for (key, value) in extra.as_object().unwrap() {
        process[key] = value.clone();
    }
    process
}

#[test]
fn an_exec_as_another_user_with_capabilities_or_into_a_stopped_container_is_refused() {
    require_cells!();
    let containerd = Containerd::start("exec-denied");
    started(&containerd, "t2", "sleep 600");
    let out = runtime_exec(&containerd, "t2", &process(json!({})));
    assert!(out.status.success(), "{}", common::output_text(&out));
    for (asked, field) in [
        (
            json!({"user": {"uid": 4242, "gid": 4242}}),
            "process.json process.user",
        ),
        (
            json!({"capabilities": {"bounding": ["CAP_SYS_ADMIN"]}}),
            "process.json process.capabilities.bounding",
        ),
        (json!({"cwd": "/etc"}), "process.json process.cwd"),
        (json!({"terminal": true}), "process.json process.terminal"),
    ] {
        let out = runtime_exec(&containerd, "t2", &process(asked.clone()));
        assert!(
            !out.status.success(),
            "{asked}: {}",
            common::output_text(&out)
        );
        assert!(
            String::from_utf8_lossy(&out.stderr).contains(field),
            "{asked}: {}",
            common::output_text(&out)
        );
    }
    // Through the shim too: ctr's --user.
    let out = containerd.ctr(&[
        "task",
        "exec",
        "--user",
        "4242",
        "--exec-id",
        "x1",
        "t2",
        "/bin/true",
    ]);
    assert!(!out.status.success(), "{}", common::output_text(&out));
    assert!(
        common::output_text(&out).contains("process.user"),
        "{}",
        common::output_text(&out)
    );
    let refused = exec_records(&containerd, "t2");
    assert!(
        refused
            .iter()
            .filter(|r| r["status"] == "policy_denied")
            .count()
            >= 4,
        "refusals are recorded: {refused:#?}"
    );
    // A stopped container (its init ended, not deleted yet).
    started(&containerd, "t3", "sleep 1");
    containerd.wait_status("t3", "STOPPED");
    let out = exec(&containerd, "t3", "x1", "true");
    assert!(!out.status.success(), "{}", common::output_text(&out));
    let out = runtime_exec(&containerd, "t3", &process(json!({})));
    assert!(!out.status.success(), "{}", common::output_text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("cannot exec in a container that is stopped"),
        "{}",
        common::output_text(&out)
    );
    let delete = containerd.ctr(&["task", "delete", "t3"]);
    assert!(delete.status.success(), "{}", common::output_text(&delete));
    ended_and_deleted(&containerd, "t2");
}

/// A workload class decides on a container's command (docs/policy.md); an exec's command
/// would not be decided by it, so it is refused.
#[test]
fn an_exec_into_a_container_whose_class_decides_its_command_is_refused() {
    require_cells!();
    let containerd = Containerd::start("exec-class");
    let config = format!(
        "[store]\nstate_dir = \"{}\"\n\n[policy.classes.agents]\n\
         description = \"containers of the agent pods\"\n\n\
         [policy.classes.agents.commands]\ndefault = \"forbidden\"\nunmatched = \"allow\"\n",
        containerd.path("store").display()
    );
    std::fs::write(containerd.path("airlock.toml"), config).unwrap();
    let out = containerd.run(
        &["-d", "--annotation", "airlock.dev/class=agents"],
        "t1",
        &["/bin/sleep", "600"],
    );
    assert!(out.status.success(), "{}", common::output_text(&out));
    containerd.wait_status("t1", "RUNNING");
    let out = exec(&containerd, "t1", "x1", "echo EXEC RAN");
    assert!(!out.status.success(), "{}", common::output_text(&out));
    assert!(!text(&out).contains("EXEC RAN"));
    assert!(
        common::output_text(&out).contains("airlock.dev/class (agents)"),
        "{}",
        common::output_text(&out)
    );
    let refused = exec_records(&containerd, "t1");
    assert_eq!(refused.len(), 1, "{refused:#?}");
    assert_eq!(refused[0]["status"], "policy_denied");
    ended_and_deleted(&containerd, "t1");
}

/// `create` with a console socket but no terminal in the spec, and a terminal without a
/// console socket: each refused, as runc refuses them (on a copy of a bundle containerd
/// prepared, with a state root of this test's own).
#[test]
fn a_console_socket_without_a_terminal_and_a_terminal_without_one_are_refused() {
    require_cells!();
    let containerd = Containerd::start("console-refused");
    started(&containerd, "t1", "sleep 600");
    let prepared = containerd.path(&format!(
        "state/io.containerd.runtime.v2.task/{}/t1",
        containerd.namespace
    ));
    let mut spec: Value =
        serde_json::from_slice(&std::fs::read(prepared.join("config.json")).unwrap()).unwrap();
    spec["root"]["path"] = json!(prepared.join("rootfs"));
    let root = containerd.path("own-root");
    let console = containerd.path("console.sock");
    let _listener = std::os::unix::net::UnixListener::bind(&console).unwrap();
    let create = |name: &str, terminal: bool, console: Option<&std::path::Path>| {
        let bundle = containerd.path(name);
        std::fs::create_dir_all(&bundle).unwrap();
        let mut spec = spec.clone();
        spec["process"]["terminal"] = json!(terminal);
        std::fs::write(bundle.join("config.json"), spec.to_string()).unwrap();
        let mut command = Command::new(common::airlock_bin());
        command
            .args(["oci", "--root"])
            .arg(&root)
            .args(["create", "--bundle"])
            .arg(&bundle)
            .env("AIRLOCK_CONFIG", containerd.path("airlock.toml"))
            .env("AIRLOCK_CONTRACTS_DIR", containerd.path("contracts"));
        if let Some(console) = console {
            command.arg("--console-socket").arg(console);
        }
        command.arg(name).output().unwrap()
    };
    let out = create("c1", false, Some(&console));
    assert!(!out.status.success(), "{}", common::output_text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--console-socket without"),
        "{}",
        common::output_text(&out)
    );
    let out = create("c2", true, None);
    assert!(!out.status.success(), "{}", common::output_text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("a terminal needs --console-socket"),
        "{}",
        common::output_text(&out)
    );
    assert!(
        std::fs::read_dir(&root).map_or(true, |d| d.count() == 0),
        "a refused create leaves no state"
    );
    ended_and_deleted(&containerd, "t1");
}
