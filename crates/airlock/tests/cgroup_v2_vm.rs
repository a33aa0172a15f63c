//! Runs airlock's checks in a small VM through `scripts/vm/run-in-vm.sh`, whose only
//! cgroup hierarchy is v2. The host may be on cgroup v1 or a hybrid: the VM boots its own
//! Linux >= 6.12 kernel with `cgroup_no_v1=all`.
//!
//! - `scripts/vm/cgroup-v2-checks.sh`: the ceilings as root and as an ordinary user with a
//!   delegated v2 subtree, the refusal without one, and `user.max_user_namespaces=0`
//!   refused alike by `doctor` and `run`.
//! - `scripts/vm/oci-cgroup-v2-checks.sh`: the OCI runtime's pause/resume, update and
//!   events --stats on a v2 cell.
//! - `scripts/vm/no-landlock-checks.sh`, booted with an `lsm=` list without landlock:
//!   refused alike by `doctor` and `run`.
//!
//! Needs the one-time `scripts/vm/prepare.sh` (QEMU, busybox-static, gcc, the cached guest
//! kernel). Without it the tests are skipped with a message, or fail when
//! AIRLOCK_REQUIRE_ROOT_TESTS is set (CI).

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::Instant;

/// One guest at a time: two TCG guests on a small machine would each take twice as long.
static ONE_GUEST: Mutex<()> = Mutex::new(());

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("repository root")
}

/// The guest's console after running `script` (relative to the repository) with `env`;
/// `None` when the VM's prerequisites are missing and skipping is allowed. Fails the test
/// unless the guest reported success.
fn run_in_vm(script: &str, env: &[(&str, &str)]) -> Option<String> {
    let _one = ONE_GUEST.lock().unwrap_or_else(|e| e.into_inner());
    let root = repo_root();
    let runner = root.join("scripts/vm/run-in-vm.sh");
    let airlock = env!("CARGO_BIN_EXE_airlock");
    let check = Command::new(&runner)
        .arg("--check")
        .env("AIRLOCK_BIN", airlock)
        .stdin(Stdio::null())
        .output()
        .expect("run scripts/vm/run-in-vm.sh --check");
    if !check.status.success() {
        let why = String::from_utf8_lossy(&check.stderr);
        if std::env::var_os("AIRLOCK_REQUIRE_ROOT_TESTS").is_some() {
            panic!(
                "the VM test cannot run (AIRLOCK_REQUIRE_ROOT_TESTS is set); \
                 run scripts/vm/prepare.sh as root first:\n{why}"
            );
        }
        eprintln!("SKIPPED: VM test; run scripts/vm/prepare.sh as root first:\n{why}");
        return None;
    }
    let started = Instant::now();
    let output = Command::new(&runner)
        .arg(script)
        .current_dir(&root)
        .env("AIRLOCK_BIN", airlock)
        .envs(env.iter().copied())
        // Boot plus checks take 20-40 s under TCG; a hung guest must not hang CI.
        .env(
            "AIRLOCK_VM_TIMEOUT",
            std::env::var("AIRLOCK_VM_TIMEOUT").unwrap_or_else(|_| "240".into()),
        )
        .stdin(Stdio::null())
        .output()
        .expect("run scripts/vm/run-in-vm.sh");
    let console = String::from_utf8_lossy(&output.stdout).into_owned();
    let describe = format!(
        "run-in-vm.sh {script} exited {:?} after {:.1}s\n--- stderr\n{}\n--- console\n{console}",
        output.status.code(),
        started.elapsed().as_secs_f64(),
        String::from_utf8_lossy(&output.stderr),
    );
    // Printed on failure by the test harness (or always with --nocapture).
    println!("{describe}");
    assert!(output.status.success(), "{script} failed:\n{describe}");
    assert!(
        console.contains("AIRLOCK-VM-EXIT=0"),
        "the guest did not report success:\n{describe}"
    );
    assert!(
        console.contains(" passed, 0 failed"),
        "the checks' summary is missing:\n{describe}"
    );
    Some(console)
}

/// Every check named must have passed (a check that silently stopped running fails).
fn assert_passed(console: &str, checks: &[&str]) {
    for check in checks {
        assert!(
            console.contains(&format!("PASS: {check}")),
            "missing PASS: {check}\n{console}"
        );
    }
}

#[test]
fn cells_enforce_limits_on_a_pure_cgroup_v2_host_as_root_and_as_a_delegated_user() {
    let Some(console) = run_in_vm("scripts/vm/cgroup-v2-checks.sh", &[]) else {
        return;
    };
    assert_passed(
        &console,
        &[
            "doctor: every check ok, cgroups v2",
            "doctor as uid 1001: every check ok, cells under the delegated",
            "user-memory: exit 137, capacity_exceeded",
            "user-pids: exit 137, capacity_exceeded",
            "user-walltime: exit 124, capacity_exceeded",
            "uid 1001: the cell's cpu.max throttled the busy loop",
            "uid 1001: no cell cgroup and no process left",
            "doctor as uid 1002: FAIL cgroups, naming the delegation",
            "run as uid 1002: refused, exit 125, sandbox_unavailable",
            "doctor: FAIL namespace.user, naming the sysctl",
            "run: refused, exit 125, sandbox_unavailable, naming namespace.user",
        ],
    );
}

#[test]
fn without_landlock_in_the_kernel_doctor_and_run_refuse_alike() {
    let Some(console) = run_in_vm(
        "scripts/vm/no-landlock-checks.sh",
        &[("AIRLOCK_VM_LSM", "lockdown,yama,integrity,apparmor")],
    ) else {
        return;
    };
    assert_passed(
        &console,
        &[
            "the guest kernel runs without Landlock",
            "doctor: FAIL landlock, naming the lsm= list, exit 1",
            "run: refused, exit 125, sandbox_unavailable, naming landlock",
        ],
    );
}

/// The OCI runtime's `pause`/`resume`, `update` and `events --stats` on v2 (this CI
/// machine's cells use v1 controllers: tests/oci_cgroups.rs covers those), and a
/// container with `linux.cgroupsPath` (its cgroup, its cell leaf, OOM, cleanup).
#[test]
fn the_oci_runtime_pauses_updates_and_reads_a_v2_cell() {
    let Some(console) = run_in_vm("scripts/vm/oci-cgroup-v2-checks.sh", &[]) else {
        return;
    };
    assert_passed(
        &console,
        &[
            "the container runs in a v2 cell",
            "pause: cgroup.freeze 1, cgroup.events frozen 1",
            "state: paused",
            "update: memory.max, pids.max and cpu.max lowered",
            "update above the ceiling: refused, memory.max unchanged",
            "events --stats: runc's event, the lowered limit, tasks and CPU time",
            "a paused container is killed",
            "no cell cgroup left",
            "cgroupsPath: the supervisor (the shim's pid) is in the container cgroup",
            "cgroupsPath: the payload is in the cell below it, the supervisor alone above",
            // The supervisor's task count (the exact pids ceiling's allowance) varies.
            "cgroupsPath: the ceilings at the container cgroup (pids 16+1+the supervisor's",
            "cgroupsPath: the container cgroup's memory.current counts the payload's 20 MiB",
            "cgroupsPath: pause freezes the cell, not the supervisor",
            "cgroupsPath: update writes the container cgroup (pids 8+1+8)",
            "cgroupsPath: an OOM ends the payload, the supervisor records it (capacity_exceeded, memory)",
            "cgroupsPath: nothing airlock created is left",
            "cgroupsPath: a fork bomb gets exactly the cell's pids ceiling (sh + 15 = process_limit 16)",
            "cgroupsPath: the fork bomb is recorded as the pids ceiling (capacity_exceeded, pids)",
            "cgroupsPath: .. refused by name",
        ],
    );
}
