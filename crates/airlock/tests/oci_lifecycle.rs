//! The OCI runtime's lifecycle as opencontainers/runtime-tools' validation checks it,
//! ported (runtime-tools is Go and is not built on these machines): the cases of
//! `validation/create`, `state`, `start`, `kill`, `delete` and `pidfile` that apply to
//! a runtime of one process per container (no `exec`), driven through `airlock oci`
//! on a bundle of busybox-static, without containerd. Needs root (cells) and busybox.

mod common;

use serde_json::{json, Value};
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

struct Runtime {
    dir: tempfile::TempDir,
}

impl Runtime {
    fn new() -> Runtime {
        assert!(
            Path::new("/usr/bin/busybox").exists(),
            ".ci/run installs busybox-static"
        );
        let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
        std::fs::write(
            dir.path().join("airlock.toml"),
            format!(
                "[store]\nstate_dir = \"{}\"\n",
                dir.path().join("store").display()
            ),
        )
        .unwrap();
        Runtime { dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// A bundle whose process runs `script`.
    fn bundle(&self, name: &str, script: &str) -> PathBuf {
        let bundle = self.path(name);
        let rootfs = bundle.join("rootfs");
        std::fs::create_dir_all(rootfs.join("bin")).unwrap();
        std::fs::copy("/usr/bin/busybox", rootfs.join("bin/busybox")).unwrap();
        for applet in ["sh", "sleep", "echo"] {
            symlink("busybox", rootfs.join("bin").join(applet)).unwrap();
        }
        let spec = json!({
            "ociVersion": "1.0.2",
            "process": {"user": {"uid": 0, "gid": 0}, "args": ["/bin/sh", "-c", script],
                        "env": ["PATH=/bin"], "cwd": "/"},
            "root": {"path": "rootfs", "readonly": true},
            "hostname": "lifecycle",
            "mounts": [{"destination": "/proc", "type": "proc", "source": "proc"}],
            "linux": {"namespaces": [{"type": "pid"}, {"type": "mount"}, {"type": "ipc"},
                                     {"type": "uts"}, {"type": "network"}]}
        });
        std::fs::write(bundle.join("config.json"), spec.to_string()).unwrap();
        bundle
    }

    fn oci(&self, args: &[&str]) -> Output {
        // The supervisor inherits create's stdio: files, never a pipe to wait on.
        let create = args.contains(&"create");
        let out_path = self.path(&format!("container.out.{}", args.last().unwrap()));
        let err_path = self.path("create.err");
        let mut output = Command::new(common::airlock_bin())
            .arg("oci")
            .arg("--root")
            .arg(self.path("root"))
            .args(args)
            .env("AIRLOCK_CONFIG", self.path("airlock.toml"))
            .env("AIRLOCK_CONTRACTS_DIR", self.path("contracts"))
            .stdin(Stdio::null())
            .stdout(match create {
                true => Stdio::from(std::fs::File::create(&out_path).unwrap()),
                false => Stdio::piped(),
            })
            .stderr(match create {
                true => Stdio::from(std::fs::File::create(&err_path).unwrap()),
                false => Stdio::piped(),
            })
            .output()
            .unwrap();
        if create {
            output.stderr = std::fs::read(&err_path).unwrap();
        }
        output
    }

    fn create(&self, bundle: &Path, id: &str) -> Output {
        let pid_file = self.path(&format!("{id}.pid"));
        self.oci(&[
            "create",
            "--bundle",
            bundle.to_str().unwrap(),
            "--pid-file",
            pid_file.to_str().unwrap(),
            id,
        ])
    }

    fn state(&self, id: &str) -> Result<Value, String> {
        let out = self.oci(&["state", id]);
        if out.status.success() {
            Ok(serde_json::from_slice(&out.stdout).unwrap())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).into_owned())
        }
    }

    fn wait_status(&self, id: &str, status: &str) -> Value {
        let until = Instant::now() + Duration::from_secs(20);
        loop {
            let state = self.state(id).unwrap();
            if state["status"] == status {
                return state;
            }
            assert!(Instant::now() < until, "{id} never {status}: {state}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

fn ok(out: &Output) {
    assert!(out.status.success(), "{}", common::output_text(out));
}

fn failed_with(out: &Output, words: &str) {
    assert!(!out.status.success(), "{}", common::output_text(out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains(words), "{words:?}: {stderr}");
}

/// create -> state created (pid = the pid file's, bundle, id) -> start -> running ->
/// kill -> stopped -> delete -> no state; and each step where it does not apply refused.
#[test]
fn the_lifecycle_of_runtime_tools_validation() {
    require_cells!();
    let rt = Runtime::new();
    let bundle = rt.bundle("b1", "echo started; sleep 600");
    failed_with(&rt.oci(&["state", "c1"]), "does not exist");
    ok(&rt.create(&bundle, "c1"));
    // validation/create: an id in use is refused.
    failed_with(&rt.create(&bundle, "c1"), "exists");
    // (The refused create's output file is not the container's.)
    let output = rt.path("container.out.c1");
    // validation/state and pidfile.
    let state = rt.state("c1").unwrap();
    assert_eq!(state["status"], "created", "{state}");
    assert_eq!(state["id"], "c1");
    assert_eq!(state["bundle"], bundle.to_str().unwrap());
    let pid: u64 = std::fs::read_to_string(rt.path("c1.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert_eq!(state["pid"], pid, "{state}");
    // The payload is held until start.
    assert_eq!(std::fs::read_to_string(&output).unwrap(), "");
    // validation/delete: not while it lives, without --force.
    failed_with(&rt.oci(&["delete", "c1"]), "not stopped");
    // validation/start.
    ok(&rt.oci(&["start", "c1"]));
    rt.wait_status("c1", "running");
    failed_with(&rt.oci(&["start", "c1"]), "cannot start");
    let until = Instant::now() + Duration::from_secs(10);
    while !std::fs::read_to_string(&output)
        .unwrap()
        .contains("started")
    {
        assert!(Instant::now() < until, "no output from the payload");
        std::thread::sleep(Duration::from_millis(20));
    }
    // validation/kill.
    ok(&rt.oci(&["kill", "c1", "KILL"]));
    let stopped = rt.wait_status("c1", "stopped");
    assert_eq!(stopped["pid"], 0);
    failed_with(&rt.oci(&["kill", "c1", "TERM"]), "not running");
    ok(&rt.oci(&["delete", "c1"]));
    failed_with(&rt.oci(&["state", "c1"]), "does not exist");
    failed_with(&rt.oci(&["delete", "c1"]), "does not exist");
}

/// validation/delete with --force: a created container (held payload) and a running one.
#[test]
fn delete_force_ends_a_created_and_a_running_container() {
    require_cells!();
    let rt = Runtime::new();
    let bundle = rt.bundle("b2", "sleep 600");
    ok(&rt.create(&bundle, "held"));
    ok(&rt.oci(&["delete", "--force", "held"]));
    failed_with(&rt.oci(&["state", "held"]), "does not exist");
    ok(&rt.create(&bundle, "running"));
    ok(&rt.oci(&["start", "running"]));
    rt.wait_status("running", "running");
    ok(&rt.oci(&["delete", "--force", "running"]));
    failed_with(&rt.oci(&["state", "running"]), "does not exist");
}

/// `start` answers once the payload runs, as runc's does: a signal sent the moment
/// `start` returns reaches the payload (it was lost when `start` answered before the
/// cell's pid 1 had spawned it, and the container ran on). Repeated: the window was a
/// fraction of a millisecond.
#[test]
fn a_signal_right_after_start_reaches_the_payload() {
    require_cells!();
    let rt = Runtime::new();
    let bundle = rt.bundle("b4", "sleep 600");
    for round in 0..8 {
        let id = format!("signalled{round}");
        ok(&rt.create(&bundle, &id));
        let supervisor = rt.state(&id).unwrap()["pid"].as_u64().unwrap() as u32;
        ok(&rt.oci(&["start", &id]));
        // The supervisor's child is the cell's pid 1; the payload is pid 1's child.
        let grandchildren: Vec<u32> = children(supervisor)
            .into_iter()
            .flat_map(children)
            .collect();
        assert!(
            !grandchildren.is_empty(),
            "round {round}: `start` answered before the payload existed"
        );
        ok(&rt.oci(&["kill", &id, "TERM"]));
        rt.wait_status(&id, "stopped");
        ok(&rt.oci(&["delete", &id]));
    }
}

/// The children of `pid`, all its threads' (the supervisor is threaded).
fn children(pid: u32) -> Vec<u32> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten();
    tasks
        .flatten()
        .flat_map(|task| {
            let listed = std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
            listed
                .split_whitespace()
                .filter_map(|c| c.parse().ok())
                .collect::<Vec<u32>>()
        })
        .collect()
}

/// A spec that names a host namespace (runtime-tools' linux_ns_path) is refused at create,
/// with the error in `--log` as the shim reads it, and leaves no state.
#[test]
fn a_namespace_path_is_refused_at_create_with_a_json_log_line() {
    require_cells!();
    let rt = Runtime::new();
    let bundle = rt.bundle("b3", "true");
    let config = bundle.join("config.json");
    let mut spec: Value = serde_json::from_slice(&std::fs::read(&config).unwrap()).unwrap();
    spec["linux"]["namespaces"][0]["path"] = json!("/proc/1/ns/pid");
    std::fs::write(&config, spec.to_string()).unwrap();
    let log = rt.path("log.json");
    let out = rt.oci(&[
        "--log",
        log.to_str().unwrap(),
        "--log-format",
        "json",
        "create",
        "--bundle",
        bundle.to_str().unwrap(),
        "ns",
    ]);
    assert!(!out.status.success());
    let line: Value = serde_json::from_str(
        std::fs::read_to_string(&log)
            .unwrap()
            .lines()
            .last()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(line["level"], "error");
    assert!(
        line["msg"]
            .as_str()
            .unwrap()
            .contains("linux.namespaces[pid].path"),
        "{line}"
    );
    failed_with(&rt.oci(&["state", "ns"]), "does not exist");
}
