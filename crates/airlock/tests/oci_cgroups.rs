//! The OCI runtime's commands on a running container's cgroup, under containerd
//! (tests/common/containerd.rs): `ctr task pause`/`resume` freeze and thaw the cell (a
//! counter stops, then goes on), a paused container is still killed and deleted with
//! nothing left, and its contract's deadline still ends it; `update` (go-runc's
//! `update --resources -`, which the ctr of Debian 12 has no verb for: run as the shim
//! runs it) lowers a limit that the kernel then enforces, and cannot raise one above the
//! contract's ceiling; `events --stats` prints runc's stats event. Needs root,
//! containerd, ctr and busybox-static (installed by .ci/run).

mod common;

use common::containerd::Containerd;
use serde_json::Value;
use std::io::Write;
use std::path::Path;
use std::process::{Child, Output, Stdio};
use std::time::{Duration, Instant};

/// Prints a number that goes up every 50 ms.
const COUNTER: &str = "i=0; while true; do i=$((i+1)); echo $i; sleep 0.05; done";

/// The last number the counter wrote to `out`.
fn last_count(out: &Path) -> u64 {
    let text = std::fs::read_to_string(out).unwrap_or_default();
    text.lines()
        .rev()
        .find_map(|l| l.trim().parse().ok())
        .unwrap_or(0)
}

fn wait_for(what: &str, timeout: Duration, mut done: impl FnMut() -> bool) {
    let until = Instant::now() + timeout;
    while !done() {
        assert!(
            Instant::now() < until,
            "{what} did not happen in {timeout:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn wait_exit(child: &mut Child, timeout: Duration) -> std::process::ExitStatus {
    let until = Instant::now() + timeout;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if Instant::now() > until {
            let _ = child.kill();
            panic!("ctr run did not end in {timeout:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `airlock-runc state ID`'s status.
fn runtime_status(containerd: &Containerd, id: &str) -> String {
    let out = containerd.runtime_command(&["state", id]).output().unwrap();
    assert!(out.status.success(), "{}", common::output_text(&out));
    let state: Value = serde_json::from_slice(&out.stdout).unwrap();
    state["status"].as_str().unwrap().to_owned()
}

/// `update --resources - ID` with `json` on stdin, as go-runc runs it.
fn update(containerd: &Containerd, id: &str, json: &str) -> Output {
    let mut child = containerd
        .runtime_command(&["update", "--resources=-", id])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(json.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

fn stats(containerd: &Containerd, id: &str) -> Value {
    let out = containerd
        .runtime_command(&["events", "--stats", id])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", common::output_text(&out));
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn a_paused_container_stops_resumes_and_is_killed_and_deleted_while_paused() {
    require_cells!();
    let containerd = Containerd::start("pause");
    let out = containerd.path("t1.out");
    let mut run = containerd.spawn_run(&[], "t1", &["/bin/sh", "-c", COUNTER], &out);
    wait_for("the counter", Duration::from_secs(30), || {
        last_count(&out) > 3
    });

    let pause = containerd.ctr(&["task", "pause", "t1"]);
    assert!(pause.status.success(), "{}", common::output_text(&pause));
    containerd.wait_status("t1", "PAUSED");
    assert_eq!(runtime_status(&containerd, "t1"), "paused");
    let frozen_at = last_count(&out);
    std::thread::sleep(Duration::from_millis(800));
    assert_eq!(
        last_count(&out),
        frozen_at,
        "a paused container's counter advanced"
    );
    // A second pause is refused; so is a resume of a running container (below).
    let again = containerd
        .runtime_command(&["pause", "t1"])
        .output()
        .unwrap();
    assert!(!again.status.success(), "{}", common::output_text(&again));

    let resume = containerd.ctr(&["task", "resume", "t1"]);
    assert!(resume.status.success(), "{}", common::output_text(&resume));
    containerd.wait_status("t1", "RUNNING");
    assert_eq!(runtime_status(&containerd, "t1"), "running");
    wait_for("the counter after resume", Duration::from_secs(10), || {
        last_count(&out) > frozen_at + 3
    });
    let resume_running = containerd
        .runtime_command(&["resume", "t1"])
        .output()
        .unwrap();
    assert!(!resume_running.status.success());
    assert!(
        String::from_utf8_lossy(&resume_running.stderr).contains("is not paused"),
        "{}",
        common::output_text(&resume_running)
    );

    // Paused again, then killed: the kill thaws the cell so SIGKILL lands.
    let pause = containerd.ctr(&["task", "pause", "t1"]);
    assert!(pause.status.success(), "{}", common::output_text(&pause));
    containerd.wait_status("t1", "PAUSED");
    let kill = containerd.ctr(&["task", "kill", "-s", "SIGKILL", "t1"]);
    assert!(kill.status.success(), "{}", common::output_text(&kill));
    let status = wait_exit(&mut run, Duration::from_secs(30));
    assert_eq!(status.code(), Some(137), "ctr run reports the SIGKILL");
    let delete = containerd.ctr(&["container", "delete", "t1"]);
    assert!(delete.status.success(), "{}", common::output_text(&delete));
    let record = containerd.record_of("t1");
    assert_eq!(record["exit_signal"], 9, "{record:#}");
    containerd.assert_nothing_left("t1", &record);
}

#[test]
fn a_paused_container_cannot_outlive_its_contracts_deadline() {
    require_cells!();
    let containerd = Containerd::start("pause-deadline");
    std::fs::write(
        containerd.path("contracts/short.yaml"),
        "resources:\n  wall_time_seconds: 3\n",
    )
    .unwrap();
    let out = containerd.run(
        &["-d", "--annotation", "airlock.dev/contract=short"],
        "t2",
        &["/bin/sh", "-c", "sleep 600"],
    );
    assert!(out.status.success(), "{}", common::output_text(&out));
    containerd.wait_status("t2", "RUNNING");
    let pause = containerd.ctr(&["task", "pause", "t2"]);
    assert!(pause.status.success(), "{}", common::output_text(&pause));
    let paused = Instant::now();
    assert_eq!(runtime_status(&containerd, "t2"), "paused");
    containerd.wait_status("t2", "STOPPED");
    assert!(
        paused.elapsed() < Duration::from_secs(15),
        "ended by the deadline, not by anything else: {:?}",
        paused.elapsed()
    );
    let delete = containerd.ctr(&["task", "delete", "t2"]);
    assert!(delete.status.success(), "{}", common::output_text(&delete));
    let delete = containerd.ctr(&["container", "delete", "t2"]);
    assert!(delete.status.success(), "{}", common::output_text(&delete));
    let record = containerd.record_of("t2");
    assert_eq!(record["limit_fired"], "wall_time", "{record:#}");
    containerd.assert_nothing_left("t2", &record);
}

/// Allocates (and touches) 64 MiB on SIGUSR1; on SIGUSR2 once more, then exits 3.
const ALLOCATOR: &str = "
trap 'dd if=/dev/zero of=/dev/null bs=64M count=1 2>/dev/null && echo ALLOCATED-BEFORE' USR1
trap 'dd if=/dev/zero of=/dev/null bs=64M count=1 2>/dev/null && echo ALLOCATED-AFTER; exit 3' USR2
echo ready
while true; do sleep 0.1; done
";

#[test]
fn an_update_lowers_limits_the_kernel_enforces_and_cannot_raise_them_above_the_contract() {
    require_cells!();
    let containerd = Containerd::start("update");
    std::fs::write(
        containerd.path("contracts/bounded.yaml"),
        "resources:\n  memory_mb: 128\n  process_limit: 16\n  cpu_millis: 1000\n",
    )
    .unwrap();
    let ceiling = 128u64 << 20;
    let out = containerd.path("t3.out");
    let mut run = containerd.spawn_run(
        &["--annotation", "airlock.dev/contract=bounded"],
        "t3",
        &["/bin/sh", "-c", ALLOCATOR],
        &out,
    );
    let output = || std::fs::read_to_string(&out).unwrap_or_default();
    wait_for("the container", Duration::from_secs(30), || {
        output().contains("ready")
    });

    // Its stats, in runc's format, from the cell's own cgroup.
    let event = stats(&containerd, "t3");
    assert_eq!(event["type"], "stats", "{event:#}");
    assert_eq!(event["id"], "t3");
    let data = &event["data"];
    assert_eq!(data["memory"]["usage"]["limit"], ceiling, "{event:#}");
    assert!(data["memory"]["usage"]["usage"].as_u64().unwrap() > 0);
    assert_eq!(data["pids"]["limit"], 17, "16 tasks + airlock's pid 1");
    let tasks = data["pids"]["current"].as_u64().unwrap();
    assert!((2..=4).contains(&tasks), "pid 1, sh, sleep: {event:#}");

    // 64 MiB fit under the contract's 128.
    let usr1 = containerd.ctr(&["task", "kill", "-s", "SIGUSR1", "t3"]);
    assert!(usr1.status.success(), "{}", common::output_text(&usr1));
    wait_for("the first allocation", Duration::from_secs(20), || {
        output().contains("ALLOCATED-BEFORE")
    });

    // Raising above the contract's ceiling, or to unlimited, is refused by name.
    for (json, names) in [
        (
            r#"{"memory":{"limit":268435456}}"#,
            ["memory.limit", "ceiling of 134217728 bytes"],
        ),
        (r#"{"memory":{"limit":-1}}"#, ["memory.limit", "unlimited"]),
        (
            r#"{"pids":{"limit":1000}}"#,
            ["pids.limit", "ceiling of 16 tasks"],
        ),
        (
            r#"{"cpu":{"quota":400000,"period":100000}}"#,
            ["cpu.quota", "ceiling of 1000"],
        ),
        (r#"{"cpu":{"cpus":"0"}}"#, ["cpu.cpus", "does not apply"]),
    ] {
        let raised = update(&containerd, "t3", json);
        let said = common::output_text(&raised);
        assert!(!raised.status.success(), "BREACH: {json} accepted: {said}");
        for name in names {
            assert!(said.contains(name), "{name:?} not named: {said}");
        }
    }
    assert_eq!(
        stats(&containerd, "t3")["data"]["memory"]["usage"]["limit"],
        ceiling
    );

    // Lowered to 32 MiB: recorded, then enforced.
    let lowered = update(
        &containerd,
        "t3",
        r#"{"devices":[{"allow":false,"access":"rwm"}],"memory":{"limit":33554432},"pids":{"limit":8}}"#,
    );
    assert!(
        lowered.status.success(),
        "{}",
        common::output_text(&lowered)
    );
    let data = stats(&containerd, "t3")["data"].clone();
    assert_eq!(data["memory"]["usage"]["limit"], 32u64 << 20, "{data:#}");
    assert_eq!(data["pids"]["limit"], 9, "{data:#}");
    let usr2 = containerd.ctr(&["task", "kill", "-s", "SIGUSR2", "t3"]);
    assert!(usr2.status.success(), "{}", common::output_text(&usr2));
    let status = wait_exit(&mut run, Duration::from_secs(30));
    assert!(
        !output().contains("ALLOCATED-AFTER"),
        "BREACH: 64 MiB allocated under a 32 MiB limit: {}",
        output()
    );
    // v1 kills the largest task (dd: the shell exits 3); v2's memory.oom.group the cell.
    assert!(
        matches!(status.code(), Some(3 | 137)),
        "{status:?}: {}",
        output()
    );
    let delete = containerd.ctr(&["container", "delete", "t3"]);
    assert!(delete.status.success(), "{}", common::output_text(&delete));

    let record = containerd.record_of("t3");
    let hit = record["result"]["limits_hit"].to_string();
    assert!(
        hit.contains("memory"),
        "the lowered memory limit fired: {hit}"
    );
    let events = containerd.events_of(record["run_id"].as_str().unwrap());
    let updates: Vec<&Value> = events
        .iter()
        .filter(|e| e["kind"] == "container.update")
        .collect();
    assert_eq!(updates.len(), 1, "only the accepted update: {events:#?}");
    let body = updates[0]["body"].to_string();
    assert!(
        body.contains("33554432") && body.contains("134217728"),
        "{body}"
    );
    containerd.assert_nothing_left("t3", &record);
}

/// `delete --force` of a paused container, and the event stream, through the runtime as
/// the shim runs it (`ctr task delete --force` kills first, which the test above covers).
#[test]
fn a_paused_container_is_deleted_by_force_and_its_event_stream_ends_with_it() {
    require_cells!();
    let containerd = Containerd::start("pause-delete");
    let out = containerd.run(&["-d"], "t2", &["/bin/sh", "-c", "sleep 600"]);
    assert!(out.status.success(), "{}", common::output_text(&out));
    containerd.wait_status("t2", "RUNNING");
    let stream_out = containerd.path("events.out");
    let mut stream = containerd
        .runtime_command(&["events", "--interval=100ms", "t2"])
        .stdout(std::fs::File::create(&stream_out).unwrap())
        .spawn()
        .unwrap();
    let pause = containerd
        .runtime_command(&["pause", "t2"])
        .output()
        .unwrap();
    assert!(pause.status.success(), "{}", common::output_text(&pause));
    assert_eq!(runtime_status(&containerd, "t2"), "paused");
    let lines = || {
        std::fs::read_to_string(&stream_out)
            .unwrap_or_default()
            .lines()
            .count()
    };
    wait_for("three stats events", Duration::from_secs(10), || {
        lines() >= 3
    });
    let deleting = Instant::now();
    let delete = containerd
        .runtime_command(&["delete", "--force", "t2"])
        .output()
        .unwrap();
    assert!(delete.status.success(), "{}", common::output_text(&delete));
    // delete --force gives the supervisor 10 s to complete the record, then kills it.
    assert!(
        deleting.elapsed() < Duration::from_secs(10),
        "the paused cell's supervisor did not end after the kill ({:?})",
        deleting.elapsed()
    );
    let status = wait_exit(&mut stream, Duration::from_secs(10));
    assert!(
        status.success(),
        "the stream ends with the container: {status:?}"
    );
    for line in std::fs::read_to_string(&stream_out).unwrap().lines() {
        let event: Value = serde_json::from_str(line).unwrap();
        assert_eq!(event["type"], "stats", "{event}");
    }
    // The shim learns of the exit; its delete finds the runtime's state gone.
    containerd.wait_status("t2", "STOPPED");
    let _ = containerd.ctr(&["task", "delete", "t2"]);
    let delete = containerd.ctr(&["container", "delete", "t2"]);
    assert!(delete.status.success(), "{}", common::output_text(&delete));
    let record = containerd.record_of("t2");
    assert_eq!(record["exit_signal"], 9, "{record:#}");
    containerd.assert_nothing_left("t2", &record);
}

/// A memory limit below what the cell holds: v1 refuses it (EBUSY once it cannot
/// reclaim), and the record says the update failed; v2 takes it and the OOM killer acts.
#[test]
fn an_update_the_kernel_refuses_is_recorded_as_failed() {
    require_cells!();
    let containerd = Containerd::start("update-refused");
    std::fs::write(
        containerd.path("contracts/bounded.yaml"),
        "resources:\n  memory_mb: 128\n",
    )
    .unwrap();
    // tail of an endless stream keeps its last 64 MiB resident.
    let out = containerd.run(
        &["-d", "--annotation", "airlock.dev/contract=bounded"],
        "t1",
        &["/bin/sh", "-c", "tail -c 67108864 /dev/zero"],
    );
    assert!(out.status.success(), "{}", common::output_text(&out));
    containerd.wait_status("t1", "RUNNING");
    wait_for("64 MiB held", Duration::from_secs(30), || {
        let usage = stats(&containerd, "t1")["data"]["memory"]["usage"]["usage"].clone();
        usage.as_u64().unwrap() > 64 << 20
    });
    let lowered = update(&containerd, "t1", r#"{"memory":{"limit":16777216}}"#);
    let state = containerd.state_root().join("t1/state.json");
    let stored: Value = serde_json::from_slice(&std::fs::read(state).unwrap()).unwrap();
    let run_id = stored["run_id"].as_str().unwrap().to_owned();
    let kinds: Vec<String> = containerd
        .events_of(&run_id)
        .iter()
        .map(|e| e["kind"].as_str().unwrap_or("").to_owned())
        .collect();
    if lowered.status.success() {
        // v2: memory.max below usage reclaims, then kills.
        assert!(
            !kinds.contains(&"container.update_failed".to_owned()),
            "{kinds:?}"
        );
        containerd.wait_status("t1", "STOPPED");
    } else {
        let said = common::output_text(&lowered);
        assert!(said.contains("memory.limit_in_bytes"), "{said}");
        assert!(
            kinds.ends_with(&["container.update".into(), "container.update_failed".into()]),
            "{kinds:?}"
        );
        let limit = stats(&containerd, "t1")["data"]["memory"]["usage"]["limit"].clone();
        assert_eq!(limit, 128u64 << 20, "unchanged");
        let kill = containerd.ctr(&["task", "kill", "-s", "SIGKILL", "t1"]);
        assert!(kill.status.success(), "{}", common::output_text(&kill));
        containerd.wait_status("t1", "STOPPED");
    }
    let delete = containerd.ctr(&["task", "delete", "t1"]);
    assert!(delete.status.success(), "{}", common::output_text(&delete));
    let delete = containerd.ctr(&["container", "delete", "t1"]);
    assert!(delete.status.success(), "{}", common::output_text(&delete));
    let record = containerd.record_of("t1");
    containerd.assert_nothing_left("t1", &record);
}

#[test]
fn the_cgroup_commands_refuse_what_has_no_running_cell() {
    require_cells!();
    let containerd = Containerd::start("cgroup-refusals");
    for args in [
        &["pause", "t4"][..],
        &["resume", "t4"],
        &["events", "--stats", "t4"],
        &["update", "--resources=-", "t4"],
    ] {
        let out = containerd.runtime_command(args).output().unwrap();
        assert!(
            !out.status.success(),
            "{args:?}: {}",
            common::output_text(&out)
        );
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("does not exist"),
            "{args:?}: {}",
            common::output_text(&out)
        );
    }
    let out = containerd.run(&[], "t4", &["/bin/true"]);
    assert!(out.status.success(), "{}", common::output_text(&out));
    // Stopped (its task deleted by `ctr run`, its state too): nothing to pause.
    let paused = containerd
        .runtime_command(&["pause", "t4"])
        .output()
        .unwrap();
    assert!(!paused.status.success(), "{}", common::output_text(&paused));
}

/// A cgroupsPath of this test's own (`/airlock-cgtest-<pid>-<name>/pod/<id>`): its top
/// directory is removed when the test ends, whatever happened.
struct TestCgroup {
    top: String,
}

impl TestCgroup {
    fn new(name: &str) -> TestCgroup {
        TestCgroup {
            top: format!("airlock-cgtest-{}-{name}", std::process::id()),
        }
    }

    /// The cgroupsPath of container `id`.
    fn path(&self, id: &str) -> String {
        format!("/{}/pod/{id}", self.top)
    }

    /// Its directory in each hierarchy.
    fn dirs(&self, id: &str) -> Vec<std::path::PathBuf> {
        common::containerd::cgroup_hierarchies()
            .iter()
            .map(|h| h.join(&self.path(id)[1..]))
            .collect()
    }

    fn top_dirs(&self) -> Vec<std::path::PathBuf> {
        common::containerd::cgroup_hierarchies()
            .iter()
            .map(|h| h.join(&self.top))
            .collect()
    }
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        for top in self.top_dirs() {
            for dir in walk_down(&top).into_iter().rev() {
                let _ = std::fs::remove_dir(dir);
            }
        }
    }
}

fn walk_down(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut all = vec![dir.to_path_buf()];
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            all.extend(walk_down(&entry.path()));
        }
    }
    all
}

fn procs(dir: &Path) -> Vec<u32> {
    std::fs::read_to_string(dir.join("cgroup.procs"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

/// `/proc/<pid>/cgroup`'s path in the hierarchy at `root` (v2's line when it is the
/// unified root).
fn cgroup_of(pid: u32, root: &Path) -> String {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
    let controller = root.file_name().unwrap().to_string_lossy().into_owned();
    text.lines()
        .find_map(|line| {
            let mut fields = line.splitn(3, ':');
            let (_, controllers, path) = (fields.next()?, fields.next()?, fields.next()?);
            let wanted = if controller == "cgroup" {
                controllers.is_empty()
            } else {
                controllers.split(',').any(|c| c == controller)
            };
            wanted.then(|| path.to_owned())
        })
        .unwrap_or_default()
}

/// The value of the first of `names` in `ctr task metrics`' table.
fn metric(table: &str, names: &[&str]) -> Option<u64> {
    table.lines().find_map(|line| {
        let mut fields = line.split_whitespace();
        let name = fields.next()?;
        names.contains(&name).then(|| fields.next()?.parse().ok())?
    })
}

fn read_number(path: &Path) -> u64 {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .trim()
        .parse()
        .unwrap_or(0)
}

#[test]
fn a_container_with_a_cgroups_path_runs_there_and_ctr_metrics_count_its_payload() {
    require_cells!();
    let containerd = Containerd::start("cgpath");
    let cgroup = TestCgroup::new("run");
    std::fs::write(
        containerd.path("contracts/bounded.yaml"),
        "resources:\n  memory_mb: 128\n  process_limit: 16\n",
    )
    .unwrap();
    let path = cgroup.path("c1");
    // tail of an endless stream keeps its last 20 MiB resident.
    let out = containerd.run(
        &[
            "-d",
            "--annotation",
            "airlock.dev/contract=bounded",
            "--cgroup",
            &path,
        ],
        "c1",
        &["/bin/sh", "-c", "tail -c 20971520 /dev/zero"],
    );
    assert!(out.status.success(), "{}", common::output_text(&out));
    containerd.wait_status("c1", "RUNNING");
    let state = containerd.state_root().join("c1/state.json");
    let stored: Value = serde_json::from_slice(&std::fs::read(state).unwrap()).unwrap();
    let supervisor = stored["pid"].as_u64().unwrap() as u32;

    let roots = common::containerd::cgroup_hierarchies();
    for (root, dir) in roots.iter().zip(cgroup.dirs("c1")) {
        // The shim's lookup by the pid-file pid finds the container cgroup...
        assert_eq!(cgroup_of(supervisor, root), path, "{}", root.display());
        assert_eq!(
            procs(&dir),
            vec![supervisor],
            "only the supervisor in {dir:?}"
        );
        // ...and every process of the payload is in its cell, below it.
        let cell = procs(&dir.join("cell"));
        assert!(cell.len() >= 2, "pid 1, sh/tail in {dir:?}: {cell:?}");
        for pid in cell {
            assert_eq!(cgroup_of(pid, root), format!("{path}/cell"));
        }
    }

    // The ceilings sit at the container cgroup (pids: 16 + pid 1 + the supervisor's 8).
    let v2 = roots.len() == 1;
    let dirs = cgroup.dirs("c1");
    let (memory_dir, pids_dir) = (&dirs[0], &dirs[if v2 { 0 } else { 1 }]);
    let memory_limit = if v2 {
        "memory.max"
    } else {
        "memory.limit_in_bytes"
    };
    assert_eq!(read_number(&memory_dir.join(memory_limit)), 128 << 20);
    assert_eq!(read_number(&pids_dir.join("pids.max")), 16 + 1 + 8);
    if !v2 {
        // v1 also gives the cell its exact ceilings.
        assert_eq!(read_number(&pids_dir.join("cell/pids.max")), 17);
        assert_eq!(
            read_number(&memory_dir.join("cell").join(memory_limit)),
            128 << 20
        );
    }

    // ctr task metrics (the shim reads the pid-file pid's cgroup) count the 20 MiB.
    let until = Instant::now() + Duration::from_secs(30);
    let usage = loop {
        let metrics = containerd.ctr(&["task", "metrics", "c1"]);
        let table = common::output_text(&metrics);
        let usage = metric(&table, &["memory.usage_in_bytes", "memory.usage"]).unwrap_or(0);
        if usage >= 20 << 20 {
            break usage;
        }
        assert!(
            Instant::now() < until,
            "metrics never showed 20 MiB: {table}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(usage < 128 << 20, "{usage}");
    let metrics = common::output_text(&containerd.ctr(&["task", "metrics", "c1"]));
    assert_eq!(
        metric(&metrics, &["memory.limit_in_bytes", "memory.limit"]),
        Some(128 << 20),
        "{metrics}"
    );

    let kill = containerd.ctr(&["task", "kill", "-s", "SIGKILL", "c1"]);
    assert!(kill.status.success(), "{}", common::output_text(&kill));
    containerd.wait_status("c1", "STOPPED");
    let delete = containerd.ctr(&["task", "delete", "c1"]);
    assert!(delete.status.success(), "{}", common::output_text(&delete));
    let delete = containerd.ctr(&["container", "delete", "c1"]);
    assert!(delete.status.success(), "{}", common::output_text(&delete));
    let record = containerd.record_of("c1");
    containerd.assert_nothing_left("c1", &record);
    // Nothing airlock created is left: the container cgroup nor its parents.
    for dir in cgroup.top_dirs() {
        assert!(!dir.exists(), "left: {}", dir.display());
    }
}

#[test]
fn an_oom_in_a_container_cgroup_kills_the_payload_not_its_supervisor() {
    require_cells!();
    let containerd = Containerd::start("cgpath-oom");
    let cgroup = TestCgroup::new("oom");
    std::fs::write(
        containerd.path("contracts/small.yaml"),
        "resources:\n  memory_mb: 32\n",
    )
    .unwrap();
    // The payload cannot undo the score that makes it the OOM killer's choice.
    let lowered = containerd.run(
        &["--cgroup", &cgroup.path("c0")],
        "c0",
        &[
            "/bin/sh",
            "-c",
            "echo -1000 > /proc/self/oom_score_adj && echo LOWERED; echo 0 > /proc/self/oom_score_adj && echo RAISED-TO-0; true",
        ],
    );
    let said = common::output_text(&lowered);
    assert!(
        !said.contains("LOWERED") && !said.contains("RAISED-TO-0"),
        "BREACH: the payload changed its OOM score: {said}"
    );
    // containerd's event stream: the shim watches the container cgroup for OOM kills
    // (what the CRI turns into kubelet's OOMKilled).
    let events_out = containerd.path("events.out");
    let mut events = std::process::Command::new("/usr/bin/ctr")
        .arg("--address")
        .arg(containerd.path("c.sock"))
        .args(["events"])
        .stdout(std::fs::File::create(&events_out).unwrap())
        .spawn()
        .unwrap();
    let out = containerd.run(
        &[
            "--annotation",
            "airlock.dev/contract=small",
            "--cgroup",
            &cgroup.path("c1"),
        ],
        "c1",
        &["/bin/tail", "-c", "67108864", "/dev/zero"],
    );
    assert_eq!(
        out.status.code(),
        Some(137),
        "{}",
        common::output_text(&out)
    );
    let said_oom = || {
        std::fs::read_to_string(&events_out)
            .unwrap_or_default()
            .lines()
            .any(|l| l.contains("/tasks/oom") && l.contains("c1"))
    };
    let until = Instant::now() + Duration::from_secs(5);
    while !said_oom() && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = events.kill();
    let _ = events.wait();
    assert!(
        said_oom(),
        "containerd saw no OOM of c1: {}",
        std::fs::read_to_string(&events_out).unwrap_or_default()
    );
    let record = containerd.record_of("c1");
    // A record completed by the supervisor, which survived the OOM.
    assert_eq!(record["status"], "capacity_exceeded", "{record:#}");
    let hit = record["result"]["limits_hit"].to_string();
    assert!(hit.contains("memory"), "recorded as an OOM: {record:#}");
    containerd.assert_nothing_left("c1", &record);
    for dir in cgroup.top_dirs() {
        assert!(!dir.exists(), "left: {}", dir.display());
    }
}

/// Runs container `id` with `--cgroup path` and returns what ctr said; it must fail.
fn refused(containerd: &Containerd, id: &str, path: &str) -> String {
    let out = containerd.run(&["--cgroup", path], id, &["/bin/true"]);
    let said = common::output_text(&out);
    assert!(
        !out.status.success(),
        "BREACH: cgroupsPath {path} taken: {said}"
    );
    eprintln!("{path}: {said}");
    let _ = containerd.ctr(&["container", "delete", id]);
    said
}

#[test]
fn cgroups_paths_outside_the_root_the_root_a_foreign_or_a_live_containers_are_refused() {
    require_cells!();
    let containerd = Containerd::start("cgpath-refusals");
    let cgroup = TestCgroup::new("refusals");

    let said = refused(&containerd, "r1", &format!("/{}/../../etc", cgroup.top));
    assert!(
        said.contains("linux.cgroupsPath") && said.contains("`..`"),
        "{said}"
    );
    let said = refused(&containerd, "r2", "/");
    assert!(said.contains("root cgroup"), "{said}");
    let said = refused(&containerd, "r3", "kubepods/r3");
    assert!(said.contains("relative cgroup path"), "{said}");

    // A cgroup holding a process of the host's.
    let foreign = cgroup.dirs("foreign");
    for dir in &foreign {
        std::fs::create_dir_all(dir).unwrap();
    }
    let mut sleeper = std::process::Command::new("/bin/sleep")
        .arg("60")
        .spawn()
        .unwrap();
    std::fs::write(foreign[0].join("cgroup.procs"), sleeper.id().to_string()).unwrap();
    let said = refused(&containerd, "r4", &cgroup.path("foreign"));
    assert!(
        said.contains("already holds process") && said.contains(&cgroup.top),
        "{said}"
    );
    assert_eq!(procs(&foreign[0]), vec![sleeper.id()], "left as it was");
    let _ = sleeper.kill();
    let _ = sleeper.wait();

    // Another live container's cgroup.
    let live = cgroup.path("live");
    let out = containerd.run(&["-d", "--cgroup", &live], "l1", &["/bin/sleep", "600"]);
    assert!(out.status.success(), "{}", common::output_text(&out));
    containerd.wait_status("l1", "RUNNING");
    let said = refused(&containerd, "r5", &live);
    assert!(said.contains("already holds process"), "{said}");
    // The live one is untouched and still ends cleanly.
    let kill = containerd.ctr(&["task", "kill", "-s", "SIGKILL", "l1"]);
    assert!(kill.status.success(), "{}", common::output_text(&kill));
    containerd.wait_status("l1", "STOPPED");
    let _ = containerd.ctr(&["task", "delete", "l1"]);
    let delete = containerd.ctr(&["container", "delete", "l1"]);
    assert!(delete.status.success(), "{}", common::output_text(&delete));
    let record = containerd.record_of("l1");
    containerd.assert_nothing_left("l1", &record);
    for dir in cgroup.dirs("live") {
        assert!(!dir.exists(), "left: {}", dir.display());
    }
}

/// `--systemd-cgroup` (ctr's `--runc-systemd-cgroup`, containerd's `SystemdCgroup`):
/// `slice:prefix:name` is the scope in the slice expanded as systemd does, made by
/// airlock itself (no D-Bus).
#[test]
fn a_systemd_cgroups_path_is_the_scope_in_its_expanded_slice() {
    require_cells!();
    let containerd = Containerd::start("cgpath-systemd");
    let top = format!("airlockcgtest{}", std::process::id());
    // Removes the slices whatever happens.
    let _slices = TestCgroup {
        top: format!("{top}.slice"),
    };
    let cgroups_path = format!("{top}-pod1.slice:airlock:c1");
    let scope = format!("/{top}.slice/{top}-pod1.slice/airlock-c1.scope");
    let out = containerd.run(
        &["-d", "--runc-systemd-cgroup", "--cgroup", &cgroups_path],
        "c1",
        &["/bin/sleep", "600"],
    );
    assert!(out.status.success(), "{}", common::output_text(&out));
    containerd.wait_status("c1", "RUNNING");
    let state = containerd.state_root().join("c1/state.json");
    let stored: Value = serde_json::from_slice(&std::fs::read(state).unwrap()).unwrap();
    let supervisor = stored["pid"].as_u64().unwrap() as u32;
    let roots = common::containerd::cgroup_hierarchies();
    for root in &roots {
        assert_eq!(cgroup_of(supervisor, root), scope, "{}", root.display());
        let cell = procs(&root.join(&scope[1..]).join("cell"));
        assert!(!cell.is_empty(), "the cell in {}", root.display());
    }
    // Without the flag the same text is a cgroupfs path: relative, refused.
    let said = refused(&containerd, "c2", &cgroups_path);
    assert!(said.contains("relative cgroup path"), "{said}");

    let kill = containerd.ctr(&["task", "kill", "-s", "SIGKILL", "c1"]);
    assert!(kill.status.success(), "{}", common::output_text(&kill));
    containerd.wait_status("c1", "STOPPED");
    let _ = containerd.ctr(&["task", "delete", "c1"]);
    let delete = containerd.ctr(&["container", "delete", "c1"]);
    assert!(delete.status.success(), "{}", common::output_text(&delete));
    let record = containerd.record_of("c1");
    containerd.assert_nothing_left("c1", &record);
    for root in &roots {
        let slice = root.join(format!("{top}.slice"));
        assert!(!slice.exists(), "left: {}", slice.display());
    }
}

/// A supervisor SIGKILLed cannot remove its container cgroup (its cell dies with it):
/// the runtime's `delete` does, when it is airlock's and empty. Its parents, which the
/// dead supervisor may or may not have made, are left (the test's guard removes them).
#[test]
fn delete_removes_the_container_cgroup_a_killed_supervisor_left() {
    require_cells!();
    let containerd = Containerd::start("cgpath-killed");
    let cgroup = TestCgroup::new("killed");
    let out = containerd.run(
        &["-d", "--cgroup", &cgroup.path("c1")],
        "c1",
        &["/bin/sleep", "600"],
    );
    assert!(out.status.success(), "{}", common::output_text(&out));
    containerd.wait_status("c1", "RUNNING");
    let state = containerd.state_root().join("c1/state.json");
    let stored: Value = serde_json::from_slice(&std::fs::read(state).unwrap()).unwrap();
    let supervisor = stored["pid"].as_u64().unwrap() as i32;
    // The supervisor of this test's own container, by its pid-file pid.
    let killed = std::process::Command::new("/bin/kill")
        .args(["-KILL", &supervisor.to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    containerd.wait_status("c1", "STOPPED");
    for dir in cgroup.dirs("c1") {
        assert!(dir.join("cell").exists(), "left by the killed supervisor");
    }
    let delete = containerd.ctr(&["task", "delete", "c1"]);
    assert!(delete.status.success(), "{}", common::output_text(&delete));
    let delete = containerd.ctr(&["container", "delete", "c1"]);
    assert!(delete.status.success(), "{}", common::output_text(&delete));
    for dir in cgroup.dirs("c1") {
        assert!(!dir.exists(), "left after delete: {}", dir.display());
    }
}

/// `ctr run --cgroup ""`: no cgroupsPath, so the cell's cgroup is airlock's own
/// `/airlock/<supervisor pid>-<start>-<ns>` and the supervisor stays where the shim put it.
#[test]
fn without_a_cgroups_path_the_cell_is_in_airlocks_own_cgroup() {
    require_cells!();
    let containerd = Containerd::start("cgpath-none");
    let out = containerd.run(&["-d", "--cgroup", ""], "c1", &["/bin/sleep", "600"]);
    assert!(out.status.success(), "{}", common::output_text(&out));
    containerd.wait_status("c1", "RUNNING");
    let state = containerd.state_root().join("c1/state.json");
    let stored: Value = serde_json::from_slice(&std::fs::read(state).unwrap()).unwrap();
    let supervisor = stored["pid"].as_u64().unwrap() as u32;
    let prefix = format!("/airlock/{supervisor}-");
    for root in common::containerd::cgroup_hierarchies() {
        let own = cgroup_of(supervisor, &root);
        assert!(!own.starts_with("/airlock"), "{own}");
        assert!(
            !root.join(&containerd.namespace).join("c1").exists(),
            "no container cgroup"
        );
        let cells: Vec<String> = std::fs::read_dir(root.join("airlock"))
            .unwrap()
            .flatten()
            .map(|e| format!("/airlock/{}", e.file_name().to_string_lossy()))
            .filter(|name| name.starts_with(&prefix))
            .collect();
        assert_eq!(cells.len(), 1, "{}: {cells:?}", root.display());
    }
    let kill = containerd.ctr(&["task", "kill", "-s", "SIGKILL", "c1"]);
    assert!(kill.status.success(), "{}", common::output_text(&kill));
    containerd.wait_status("c1", "STOPPED");
    let _ = containerd.ctr(&["task", "delete", "c1"]);
    let delete = containerd.ctr(&["container", "delete", "c1"]);
    assert!(delete.status.success(), "{}", common::output_text(&delete));
    let record = containerd.record_of("c1");
    containerd.assert_nothing_left("c1", &record);
}

/// Every cgroup hierarchy mounted under /sys/fs/cgroup (runsc makes its path in the ones
/// airlock does not use too).
fn all_hierarchies() -> Vec<std::path::PathBuf> {
    let root = Path::new("/sys/fs/cgroup");
    if root.join("cgroup.procs").exists() {
        return vec![root.to_path_buf()];
    }
    std::fs::read_dir(root)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.join("cgroup.procs").exists())
        .collect()
}

/// Fails unless runsc is installed (the gVisor tier's container tests need it: a host
/// without it is not one these tests may pass on).
fn require_runsc() {
    let found = ["/usr/bin/runsc", "/usr/local/bin/runsc", "/usr/sbin/runsc"]
        .iter()
        .any(|p| Path::new(p).exists());
    assert!(
        found,
        "runsc is not installed (the gVisor tier's tests need it)"
    );
}

/// A container whose contract selects `isolation: gvisor`, with a cgroupsPath: runsc's
/// sandbox and gofer sit in the container cgroup's `cell` leaf, the supervisor (and
/// `runsc run`) in the container cgroup with the ceilings; `ctr task metrics` counts the
/// payload's memory; the memory ceiling holds and is recorded; nothing is left.
#[test]
fn a_gvisor_container_runs_in_its_cgroups_path_within_its_ceilings_and_leaves_nothing() {
    require_cells!();
    require_runsc();
    let containerd = Containerd::start("cgpath-gvisor");
    let cgroup = TestCgroup::new("gvisor");
    std::fs::write(
        containerd.path("contracts/gvisor.yaml"),
        "isolation: gvisor\nresources:\n  memory_mb: 256\n  process_limit: 16\n  wall_time_seconds: 120\n",
    )
    .unwrap();
    let annotation = ["--annotation", "airlock.dev/contract=gvisor"];
    let out = containerd.run(
        &[annotation[0], annotation[1], "--cgroup", &cgroup.path("c0")],
        "c0",
        &[
            "/bin/sh",
            "-c",
            "echo hello from $(uname -r); touch /bin/x && echo BREACH-IMAGE-WRITTEN; test -e /usr/lib/os-release && echo BREACH-HOST-USR; true",
        ],
    );
    let said = common::output_text(&out);
    assert!(out.status.success(), "{said}");
    assert!(said.contains("hello from 4.4.0"), "gVisor's kernel: {said}");
    // The image's tree is read-only and the host's system tree is not in the sandbox.
    assert!(!said.contains("BREACH"), "{said}");
    let record = containerd.record_of("c0");
    assert_eq!(record["status"], "ok", "{record:#}");
    containerd.assert_nothing_left("c0", &record);

    // A long-lived one: where its processes are, and what metrics say.
    let path = cgroup.path("c1");
    let out = containerd.run(
        &["-d", annotation[0], annotation[1], "--cgroup", &path],
        "c1",
        &["/bin/sh", "-c", "tail -c 41943040 /dev/zero"],
    );
    assert!(out.status.success(), "{}", common::output_text(&out));
    containerd.wait_status("c1", "RUNNING");
    let state = containerd.state_root().join("c1/state.json");
    let stored: Value = serde_json::from_slice(&std::fs::read(state).unwrap()).unwrap();
    let supervisor = stored["pid"].as_u64().unwrap() as u32;
    let roots = common::containerd::cgroup_hierarchies();
    let dirs = cgroup.dirs("c1");
    // `start` lets the supervisor start `runsc run`, which then makes the sandbox.
    wait_for("the sandbox and its gofer", Duration::from_secs(30), || {
        dirs.iter().all(|d| procs(&d.join("cell")).len() >= 2)
    });
    for (root, dir) in roots.iter().zip(&dirs) {
        assert_eq!(cgroup_of(supervisor, root), path, "{}", root.display());
        // The sandbox and its gofer (runsc's processes) in the leaf.
        let cell = procs(&dir.join("cell"));
        for pid in &cell {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            assert!(
                String::from_utf8_lossy(&cmdline).contains("runsc"),
                "pid {pid} in {dir:?} is not runsc's"
            );
        }
        // Nothing but the supervisor and `runsc run` (its child) at the container cgroup.
        for pid in procs(dir) {
            assert!(
                pid == supervisor || parent_of(pid) == supervisor,
                "pid {pid} at {dir:?}"
            );
        }
    }
    let v2 = roots.len() == 1;
    let memory_limit = if v2 {
        "memory.max"
    } else {
        "memory.limit_in_bytes"
    };
    assert_eq!(read_number(&dirs[0].join(memory_limit)), 256 << 20);
    // A second gVisor container cannot take the live one's cgroup.
    let taken = containerd.run(
        &[annotation[0], annotation[1], "--cgroup", &path],
        "c3",
        &["/bin/true"],
    );
    let said = common::output_text(&taken);
    assert!(
        !taken.status.success(),
        "BREACH: a live container's cgroup taken: {said}"
    );
    assert!(said.contains("a container cgroup must be empty"), "{said}");
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        let metrics = containerd.ctr(&["task", "metrics", "c1"]);
        let table = common::output_text(&metrics);
        let usage = metric(&table, &["memory.usage_in_bytes", "memory.usage"]).unwrap_or(0);
        if usage >= 40 << 20 {
            assert!(usage <= 256 << 20, "{table}");
            break;
        }
        assert!(
            Instant::now() < until,
            "metrics never showed the payload's 40 MiB: {table}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let kill = containerd.ctr(&["task", "kill", "-s", "SIGKILL", "c1"]);
    assert!(kill.status.success(), "{}", common::output_text(&kill));
    containerd.wait_status("c1", "STOPPED");
    for args in [["task", "delete", "c1"], ["container", "delete", "c1"]] {
        let delete = containerd.ctr(&args);
        assert!(delete.status.success(), "{}", common::output_text(&delete));
    }
    let record = containerd.record_of("c1");
    containerd.assert_nothing_left("c1", &record);

    // Over the memory ceiling: killed, recorded as the memory ceiling.
    let out = containerd.run(
        &[annotation[0], annotation[1], "--cgroup", &cgroup.path("c2")],
        "c2",
        &["/bin/tail", "-c", "536870912", "/dev/zero"],
    );
    assert!(!out.status.success(), "{}", common::output_text(&out));
    let record = containerd.record_of("c2");
    assert_eq!(record["status"], "capacity_exceeded", "{record:#}");
    let hit = record["result"]["limits_hit"].to_string();
    assert!(
        hit.contains("memory"),
        "recorded as the memory ceiling: {record:#}"
    );
    containerd.assert_nothing_left("c2", &record);

    // No runsc process, state or cgroup of these containers anywhere.
    for hierarchy in all_hierarchies() {
        let top = hierarchy.join(&cgroup.top);
        assert!(!top.exists(), "left: {}", top.display());
    }
    let runsc_left: Vec<String> = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
        .filter(|c| c.contains("runsc") && c.contains(&cgroup.top))
        .collect();
    assert!(runsc_left.is_empty(), "runsc left: {runsc_left:?}");
}

fn parent_of(pid: u32) -> u32 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    stat.rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse().ok())
        .unwrap_or(0)
}
