//! airlock as an OCI runtime under containerd (`airlock-runc`, crates/airlock/src/oci/):
//! each test starts Debian's containerd of its own (its own root, state, socket and a
//! config that registers airlock as the `airlock` runtime), imports an image it built
//! (busybox-static), and drives containerd's runc shim with `ctr`. The container runs in
//! a cell (its boundary is checked from inside), its output and exit status come back
//! through the shim, it can be killed and deleted, it has a run record with its
//! identity, and nothing of it is left. Needs root, containerd, ctr and busybox-static
//! (installed by .ci/run).

mod common;

use common::host::{self, Supervisor};
use serde_json::Value;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const IMAGE: &str = "airlock.test/busybox:1";

/// A containerd of this test, with airlock registered; killed on drop.
struct Containerd {
    dir: tempfile::TempDir,
    child: Child,
    namespace: String,
}

impl Containerd {
    fn start(test: &str) -> Containerd {
        for tool in ["/usr/bin/containerd", "/usr/bin/ctr", "/usr/bin/busybox"] {
            assert!(
                Path::new(tool).exists(),
                "{tool} is missing: .ci/run installs containerd and busybox-static"
            );
        }
        // Under target/: overlayfs snapshots need a file system that is not overlayfs.
        let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
        let d = dir.path();
        std::fs::create_dir_all(d.join("bin")).unwrap();
        std::fs::create_dir_all(d.join("contracts")).unwrap();
        symlink(common::airlock_bin(), d.join("bin/airlock-runc")).unwrap();
        std::fs::write(d.join("config.toml"), containerd_config(d)).unwrap();
        std::fs::write(
            d.join("airlock.toml"),
            format!("[store]\nstate_dir = \"{}\"\n", d.join("store").display()),
        )
        .unwrap();
        let child = Command::new("/usr/bin/containerd")
            .arg("--config")
            .arg(d.join("config.toml"))
            .env("AIRLOCK_CONFIG", d.join("airlock.toml"))
            .env("AIRLOCK_CONTRACTS_DIR", d.join("contracts"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(d.join("containerd.log")).unwrap())
            .spawn()
            .unwrap();
        let containerd = Containerd {
            namespace: format!("airlock-test-{}-{test}", std::process::id()),
            dir,
            child,
        };
        containerd.wait_ready();
        containerd.import_image();
        containerd
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn wait_ready(&self) {
        let until = Instant::now() + Duration::from_secs(20);
        while !self.ctr(&["version"]).status.success() {
            assert!(
                Instant::now() < until,
                "containerd did not start: {}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.path("containerd.log")).unwrap_or_default()
    }

    fn ctr(&self, args: &[&str]) -> Output {
        Command::new("/usr/bin/ctr")
            .arg("--address")
            .arg(self.path("c.sock"))
            .args(["-n", &self.namespace])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap()
    }

    fn runtime(&self) -> String {
        self.path("bin/airlock-runc").display().to_string()
    }

    /// `ctr run` under airlock: `--runtime io.containerd.runc.v2 --runc-binary airlock-runc`.
    fn run(&self, extra: &[&str], id: &str, argv: &[&str]) -> Output {
        let runtime = self.runtime();
        let mut args = vec![
            "run",
            "--runtime",
            "io.containerd.runc.v2",
            "--runc-binary",
            &runtime,
        ];
        args.extend_from_slice(extra);
        args.extend_from_slice(&[IMAGE, id]);
        args.extend_from_slice(argv);
        self.ctr(&args)
    }

    /// An image of busybox-static and its applets, written as an OCI layout and imported.
    fn import_image(&self) {
        let tree = self.path("tree");
        for dir in ["bin", "tmp", "etc"] {
            std::fs::create_dir_all(tree.join(dir)).unwrap();
        }
        std::fs::copy("/usr/bin/busybox", tree.join("bin/busybox")).unwrap();
        for applet in [
            "sh", "cat", "echo", "id", "sleep", "ls", "grep", "mount", "touch", "seq", "true",
            "unshare", "head", "tail",
        ] {
            symlink("busybox", tree.join("bin").join(applet)).unwrap();
        }
        std::fs::write(tree.join("etc/passwd"), "root:x:0:0::/:/bin/sh\n").unwrap();
        let image = airlock_images::layout::NewImage {
            name: Some(IMAGE.into()),
            layers: vec![common::images::tree_layer(&tree)],
            gzip: false,
            defaults: airlock_images::oci::ProcessDefaults {
                cmd: Some(vec!["/bin/sh".into()]),
                ..Default::default()
            },
        };
        let layout = self.path("layout");
        airlock_images::layout::write_layout(&layout, &image).unwrap();
        let archive = self.path("image.tar");
        let mut builder = tar::Builder::new(std::fs::File::create(&archive).unwrap());
        builder.append_dir_all(".", &layout).unwrap();
        builder.finish().unwrap();
        let out = self.ctr(&["images", "import", archive.to_str().unwrap()]);
        assert!(out.status.success(), "{}", common::output_text(&out));
    }

    /// The run records of the store containerd's airlock writes to, newest first.
    fn records(&self) -> Vec<Value> {
        let store = self.path("store");
        let list = Command::new(common::airlock_bin())
            .args(["runs", "--state-dir"])
            .arg(&store)
            .args(["list", "--json"])
            .output()
            .unwrap();
        assert!(list.status.success(), "{}", common::output_text(&list));
        let runs: Vec<Value> = serde_json::from_slice(&list.stdout).unwrap();
        runs.iter()
            .map(|run| {
                let id = run["run_id"].as_str().unwrap();
                let show = Command::new(common::airlock_bin())
                    .args(["runs", "--state-dir"])
                    .arg(&store)
                    .args(["show", id, "--json"])
                    .output()
                    .unwrap();
                serde_json::from_slice::<Value>(&show.stdout).unwrap()["run"].clone()
            })
            .collect()
    }

    /// The record of container `id`.
    fn record_of(&self, id: &str) -> Value {
        self.records()
            .into_iter()
            .find(|r| r["result"]["container"]["id"] == id)
            .unwrap_or_else(|| panic!("no record of container {id}: {:#?}", self.records()))
    }

    /// Nothing of container `id` is left: its supervisor, its cell's cgroups, its runtime
    /// state, mounts of its bundle.
    fn assert_nothing_left(&self, id: &str, record: &Value) {
        let supervisor = Supervisor {
            pid: record["supervisor_pid"].as_u64().unwrap() as u32,
            start_time: record["supervisor_start_time"].as_u64().unwrap(),
        };
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", supervisor.pid));
        let same = stat.is_ok_and(|s| {
            s.rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().nth(19))
                .is_some_and(|t| t == supervisor.start_time.to_string())
        });
        assert!(!same, "the supervisor of {id} is still there");
        let cgroups = host::cgroups_of(&supervisor);
        assert!(cgroups.is_empty(), "cgroups left of {id}: {cgroups:?}");
        assert_eq!(record["cleanup_ok"], true, "{record:#}");
        let state = Path::new("/run/containerd/runc")
            .join(&self.namespace)
            .join(id);
        assert!(!state.exists(), "runtime state left: {}", state.display());
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        let bundle = format!("{}/{id}", self.namespace);
        let left: Vec<&str> = mounts.lines().filter(|l| l.contains(&bundle)).collect();
        assert!(left.is_empty(), "mounts left of {id}: {left:?}");
    }

    /// Waits until `ctr task ls` says `status` for `id`.
    fn wait_status(&self, id: &str, status: &str) {
        let until = Instant::now() + Duration::from_secs(20);
        loop {
            let out = self.ctr(&["task", "ls"]);
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            let line = text.lines().find(|l| l.starts_with(id)).unwrap_or("");
            if line.contains(status) {
                return;
            }
            assert!(Instant::now() < until, "{id} never {status}: {text}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        for id in ["t1", "t2", "t3", "t4"] {
            let _ = self.ctr(&["task", "kill", "-s", "SIGKILL", id]);
            let _ = self.ctr(&["task", "delete", "-f", id]);
            let _ = self.ctr(&["container", "delete", id]);
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        // Its shims exit with their containers, and their rootfs mounts with them; a test
        // that failed half-way may leave one under the directory (itself no mount point,
        // so `umount -R` of it does nothing): each is detached, deepest first.
        let root = self.dir.path().display().to_string();
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let mut under: Vec<&str> = (mounts.lines())
            .filter_map(|line| line.split(' ').nth(4))
            .filter(|point| point.starts_with(&root))
            .collect();
        under.sort_by_key(|point| std::cmp::Reverse(point.len()));
        for point in under {
            let _ = Command::new("umount").args(["-l", point]).output();
        }
    }
}

fn containerd_config(dir: &Path) -> String {
    let d = dir.display();
    format!(
        r#"version = 2
root = "{d}/root"
state = "{d}/state"
# ctr drives the shim directly; the CRI plugin (which needs CNI) is not this test's.
disabled_plugins = ["io.containerd.grpc.v1.cri"]
[grpc]
  address = "{d}/c.sock"
# What docs/kubernetes.md tells a cluster operator to add (read by the CRI plugin).
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.airlock]
  runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.airlock.options]
    BinaryName = "{d}/bin/airlock-runc"
"#
    )
}

fn text(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

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
    for line in [
        "CapEff:\t0000000000000000",
        "CapPrm:\t0000000000000000",
        "CapBnd:\t0000000000000000",
        "NoNewPrivs:\t1",
        "Seccomp:\t2",
        "done",
    ] {
        assert!(stdout.contains(line), "{line:?} missing: {stdout}");
    }
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

#[test]
fn exec_is_refused_saying_why() {
    require_cells!();
    let containerd = Containerd::start("exec");
    let out = containerd.run(&["-d"], "t2", &["/bin/sh", "-c", "sleep 600"]);
    assert!(out.status.success(), "{}", common::output_text(&out));
    containerd.wait_status("t2", "RUNNING");
    let exec = containerd.ctr(&["task", "exec", "--exec-id", "e1", "t2", "/bin/true"]);
    assert!(!exec.status.success());
    assert!(
        String::from_utf8_lossy(&exec.stderr).contains("exec is not supported by airlock"),
        "{}",
        common::output_text(&exec)
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
