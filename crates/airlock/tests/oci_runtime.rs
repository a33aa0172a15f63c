//! airlock as an OCI runtime under containerd (`airlock-runc`, crates/airlock/src/oci/):
//! each test starts Debian's containerd of its own (its own root, state, socket and a
//! config that registers airlock as the `airlock` runtime), imports an image it built
//! (busybox-static), and drives containerd's runc shim with `ctr`. The container runs in
//! a cell (its boundary is checked from inside), its output and exit status come back
//! through the shim, it can be killed and deleted, it has a run record with its
//! identity, and nothing of it is left. Needs root, containerd, ctr and busybox-static
//! (installed by .ci/run).

mod common;

use common::containerd::{self, text, Containerd};
use serde_json::Value;
use std::path::Path;

/// The cell's boundary from inside a container: not root, no capability, no new
/// privileges, seccomp filtering, a read-only root, no mount, no host file of this test.
const BOUNDARY_PROBE: &str = r#"
echo "uid=$(id -u)"
grep -E '^(CapEff|CapPrm|CapBnd|NoNewPrivs|Seccomp):' /proc/self/status
touch /written-to-root 2>/dev/null && echo "ROOT WRITABLE"
mount -t tmpfs none /tmp 2>/dev/null && echo "MOUNTED"
unshare -U -r /bin/true 2>/dev/null && echo "USER NAMESPACE MADE"
cat "$HOST_SECRET" 2>/dev/null && echo "HOST FILE READ"
ls /proc/1/root/ >/dev/null 2>&1 && ls /proc/1/root/ | grep -q containerd && echo "HOST ROOT SEEN"
echo done
exit 7
"#;

#[test]
fn a_container_runs_in_a_cell_under_containerd_with_its_record_and_nothing_left() {
    require_cells!();
    let containerd = Containerd::start("run");
    let secret = containerd.path("host-secret");
    std::fs::write(&secret, "host secret\n").unwrap();
    let env = format!("HOST_SECRET={}", secret.display());
    let out = containerd.run(
        &["--rm", "--env", &env],
        "t1",
        &["/bin/sh", "-c", BOUNDARY_PROBE],
    );
    let stdout = text(&out);
    assert_eq!(
        out.status.code(),
        Some(7),
        "{}\n{}",
        common::output_text(&out),
        containerd.log()
    );
    assert!(
        stdout.contains("uid=10001"),
        "the contract's identity, not root: {stdout}"
    );
    containerd::assert_has_lines(&stdout, containerd::CONFINED);
    assert!(stdout.contains("done"), "the probe ended: {stdout}");
    for breach in [
        "ROOT WRITABLE",
        "MOUNTED",
        "USER NAMESPACE MADE",
        "HOST FILE READ",
        "host secret",
        "HOST ROOT SEEN",
    ] {
        assert!(!stdout.contains(breach), "{breach}: {stdout}");
    }
    let record = containerd.record_of("t1");
    assert_eq!(record["status"], "task_error", "{record:#}");
    assert_eq!(record["exit_code"], 7);
    assert_eq!(record["workload_class"], "container");
    assert!(record["stdout_head"]
        .as_str()
        .unwrap()
        .contains("uid=10001"));
    containerd.assert_nothing_left("t1", &record);
}

#[test]
fn a_running_container_is_killed_and_deleted_through_the_shim() {
    require_cells!();
    let containerd = Containerd::start("kill");
    let out = containerd.run(&["-d"], "t2", &["/bin/sh", "-c", "echo up; sleep 600"]);
    assert!(
        out.status.success(),
        "{}\n{}",
        common::output_text(&out),
        containerd.log()
    );
    containerd.wait_status("t2", "RUNNING");
    let ps = containerd.ctr(&["task", "ps", "t2"]);
    assert!(
        text(&ps).lines().count() >= 3,
        "supervisor, cell pid 1, payload: {}",
        text(&ps)
    );
    let kill = containerd.ctr(&["task", "kill", "-s", "SIGKILL", "t2"]);
    assert!(kill.status.success(), "{}", common::output_text(&kill));
    containerd.wait_status("t2", "STOPPED");
    let delete = containerd.ctr(&["task", "delete", "t2"]);
    assert!(delete.status.success(), "{}", common::output_text(&delete));
    assert!(text(&delete).contains("137") || delete.status.success());
    let delete = containerd.ctr(&["container", "delete", "t2"]);
    assert!(delete.status.success(), "{}", common::output_text(&delete));
    let record = containerd.record_of("t2");
    assert_eq!(record["exit_signal"], 9, "{record:#}");
    containerd.assert_nothing_left("t2", &record);
}

#[test]
fn a_privileged_container_is_refused_with_the_error_the_shim_reports_and_recorded() {
    require_cells!();
    let containerd = Containerd::start("privileged");
    let out = containerd.run(
        &["--rm", "--cap-add", "CAP_SYS_ADMIN"],
        "t3",
        &["/bin/true"],
    );
    assert!(!out.status.success(), "{}", common::output_text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("process.capabilities")
            && stderr.contains("beyond the container default set"),
        "the shim reports airlock's error: {stderr}"
    );
    let refused = containerd
        .records()
        .into_iter()
        .find(|r| r["argv"][0] == "/bin/true")
        .expect("the refusal is recorded");
    assert_eq!(refused["status"], "policy_denied", "{refused:#}");
    let state = Path::new("/run/containerd/runc")
        .join(&containerd.namespace)
        .join("t3");
    assert!(!state.exists());
    // --privileged: the host's devices are the first thing refused.
    let out = containerd.run(&["--rm", "--privileged"], "t3", &["/bin/true"]);
    assert!(!out.status.success(), "{}", common::output_text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("linux.devices: host devices are never given"),
        "{}",
        common::output_text(&out)
    );
}

#[test]
fn the_platforms_contract_is_chosen_by_annotation_and_its_ceilings_hold() {
    require_cells!();
    let containerd = Containerd::start("contract");
    std::fs::write(
        containerd.path("contracts/small.yaml"),
        "resources:\n  process_limit: 8\n  memory_mb: 64\n",
    )
    .unwrap();
    // Twenty background sleeps against a ceiling of eight processes.
    let script = "n=0; for i in $(seq 20); do sleep 5 & done 2>/dev/null; \
                  cat /sys/fs/cgroup/pids.max 2>/dev/null; echo forked; exit 0";
    let out = containerd.run(
        &["--rm", "--annotation", "airlock.dev/contract=small"],
        "t4",
        &["/bin/sh", "-c", script],
    );
    let record = containerd.record_of("t4");
    assert!(
        record["plan"]["limits"]["process_limit"] == 8,
        "the contract named by the annotation: {:#}",
        record["plan"]["limits"]
    );
    let hit = record["result"]["limits_hit"].to_string();
    assert!(
        hit.contains("pids"),
        "the pids ceiling fired: {hit}\n{}",
        common::output_text(&out)
    );
    // 200 MB held by tail against a ceiling of 64 MiB.
    let hog = "head -c 300000000 /dev/zero | tail -c 200000000 >/dev/null";
    let out = containerd.run(
        &["--rm", "--annotation", "airlock.dev/contract=small"],
        "t3",
        &["/bin/sh", "-c", hog],
    );
    assert!(!out.status.success(), "{}", common::output_text(&out));
    let record = containerd.record_of("t3");
    let hit = record["result"]["limits_hit"].to_string();
    assert!(hit.contains("memory"), "the memory ceiling fired: {hit}");
    let missing = containerd.run(
        &["--rm", "--annotation", "airlock.dev/contract=absent"],
        "t1",
        &["/bin/true"],
    );
    assert!(!missing.status.success());
    assert!(
        String::from_utf8_lossy(&missing.stderr).contains("no contract \"absent\""),
        "{}",
        common::output_text(&missing)
    );
}

/// `airlock.dev/class`: the operator's workload class makes the contract and decides on
/// the container's command, as for `airlock run --class`.
#[test]
fn a_workload_class_by_annotation_grants_or_denies_the_containers_command() {
    require_cells!();
    let containerd = Containerd::start("class");
    let config = format!(
        r#"[store]
state_dir = "{}"

[policy.classes.agents]
description = "containers of the agent pods"

[policy.classes.agents.template.resources]
process_limit = 6

[policy.classes.agents.commands]
default = "forbidden"
unmatched = "allow"

[[policy.classes.agents.commands.rules]]
pattern = ["/bin/false"]
decision = "forbidden"
match = ["/bin/false"]
not_match = ["/bin/true"]
"#,
        containerd.path("store").display()
    );
    std::fs::write(containerd.path("airlock.toml"), config).unwrap();
    let class = ["--rm", "--annotation", "airlock.dev/class=agents"];
    let out = containerd.run(&class, "t1", &["/bin/sh", "-c", "echo granted"]);
    assert_eq!(out.status.code(), Some(0), "{}", common::output_text(&out));
    assert!(text(&out).contains("granted"));
    let record = containerd.record_of("t1");
    assert_eq!(record["workload_class"], "agents", "{record:#}");
    assert_eq!(record["plan"]["limits"]["process_limit"], 6);
    let denied = containerd.run(&class, "t2", &["/bin/false"]);
    assert!(!denied.status.success());
    let stderr = String::from_utf8_lossy(&denied.stderr);
    assert!(
        stderr.contains("airlock.dev/class (agents): policy_denied"),
        "{}",
        common::output_text(&denied)
    );
    // Recorded once, by the policy step.
    let denials: Vec<Value> = containerd
        .records()
        .into_iter()
        .filter(|r| r["argv"][0] == "/bin/false")
        .collect();
    assert_eq!(denials.len(), 1, "{denials:#?}");
    assert_eq!(denials[0]["status"], "policy_denied");
}
