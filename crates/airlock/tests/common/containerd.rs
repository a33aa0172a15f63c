//! A containerd of a test's own with airlock registered as the `airlock` runtime
//! (`airlock-runc`), its image (busybox-static) imported, driven with `ctr`: shared by
//! the OCI runtime tests (oci_*.rs). Needs root, containerd, ctr and busybox-static
//! (installed by .ci/run).

use super::host::{self, Supervisor};
use serde_json::Value;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

pub const IMAGE: &str = "airlock.test/busybox:1";

/// A containerd of this test, with airlock registered; killed on drop.
pub struct Containerd {
    pub dir: tempfile::TempDir,
    pub child: Child,
    pub namespace: String,
}

impl Containerd {
    pub fn start(test: &str) -> Containerd {
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
        symlink(super::airlock_bin(), d.join("bin/airlock-runc")).unwrap();
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

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    pub fn wait_ready(&self) {
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

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.path("containerd.log")).unwrap_or_default()
    }

    pub fn ctr(&self, args: &[&str]) -> Output {
        Command::new("/usr/bin/ctr")
            .arg("--address")
            .arg(self.path("c.sock"))
            .args(["-n", &self.namespace])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap()
    }

    /// `ctr ARGS` on a terminal of its own (`script` from util-linux): what `-t` needs.
    pub fn ctr_on_a_terminal(&self, args: &[&str]) -> Output {
        let mut line = format!(
            "/usr/bin/ctr --address {} -n {}",
            self.path("c.sock").display(),
            self.namespace
        );
        for arg in args {
            line.push_str(&format!(" '{}'", arg.replace('\'', "'\\''")));
        }
        Command::new("script")
            .args(["-qec", &line, "/dev/null"])
            .stdin(Stdio::null())
            .output()
            .unwrap()
    }

    /// The runtime's state root containerd's shim passes for this test's namespace.
    pub fn runtime_root(&self) -> PathBuf {
        Path::new("/run/containerd/runc").join(&self.namespace)
    }

    pub fn runtime(&self) -> String {
        self.path("bin/airlock-runc").display().to_string()
    }

    /// `ctr run` under airlock: `--runtime io.containerd.runc.v2 --runc-binary airlock-runc`.
    pub fn run(&self, extra: &[&str], id: &str, argv: &[&str]) -> Output {
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
    pub fn import_image(&self) {
        let tree = self.path("tree");
        for dir in ["bin", "tmp", "etc"] {
            std::fs::create_dir_all(tree.join(dir)).unwrap();
        }
        std::fs::copy("/usr/bin/busybox", tree.join("bin/busybox")).unwrap();
        for applet in [
            "sh", "cat", "echo", "id", "sleep", "ls", "grep", "mount", "touch", "seq", "true",
            "unshare", "head", "tail", "wget", "ip", "ping", "kill", "dd", "tty", "hostname",
            "readlink",
        ] {
            symlink("busybox", tree.join("bin").join(applet)).unwrap();
        }
        std::fs::write(tree.join("etc/passwd"), "root:x:0:0::/:/bin/sh\n").unwrap();
        let image = airlock_images::layout::NewImage {
            name: Some(IMAGE.into()),
            layers: vec![super::images::tree_layer(&tree)],
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
        assert!(out.status.success(), "{}", super::output_text(&out));
    }

    /// The run records of the store containerd's airlock writes to, newest first.
    pub fn records(&self) -> Vec<Value> {
        let store = self.path("store");
        let list = Command::new(super::airlock_bin())
            .args(["runs", "--state-dir"])
            .arg(&store)
            .args(["list", "--json"])
            .output()
            .unwrap();
        assert!(list.status.success(), "{}", super::output_text(&list));
        let runs: Vec<Value> = serde_json::from_slice(&list.stdout).unwrap();
        runs.iter()
            .map(|run| {
                let id = run["run_id"].as_str().unwrap();
                let show = Command::new(super::airlock_bin())
                    .args(["runs", "--state-dir"])
                    .arg(&store)
                    .args(["show", id, "--json"])
                    .output()
                    .unwrap();
                serde_json::from_slice::<Value>(&show.stdout).unwrap()["run"].clone()
            })
            .collect()
    }

    /// The state root the runc shim gives the runtime for this namespace.
    pub fn state_root(&self) -> PathBuf {
        Path::new("/run/containerd/runc").join(&self.namespace)
    }

    /// `airlock-runc --root <the shim's root> ARGS`: what the shim runs, for the commands
    /// `ctr` has no verb for (`update`, `events`).
    pub fn runtime_command(&self, args: &[&str]) -> Command {
        let mut command = Command::new(self.runtime());
        // containerd's environment, which the shim passes on: the same store.
        command
            .env("AIRLOCK_CONFIG", self.path("airlock.toml"))
            .env("AIRLOCK_CONTRACTS_DIR", self.path("contracts"))
            .arg("--root")
            .arg(self.state_root())
            .args(args);
        command
    }

    /// `ctr run` in the foreground, its output into `stdout`: for a container whose output
    /// the test follows while it drives it with other `ctr` commands.
    pub fn spawn_run(&self, extra: &[&str], id: &str, argv: &[&str], stdout: &Path) -> Child {
        let runtime = self.runtime();
        Command::new("/usr/bin/ctr")
            .arg("--address")
            .arg(self.path("c.sock"))
            .args(["-n", &self.namespace, "run", "--runtime"])
            .args(["io.containerd.runc.v2", "--runc-binary", &runtime])
            .args(extra)
            .args([IMAGE, id])
            .args(argv)
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(stdout).unwrap())
            .stderr(std::fs::File::create(stdout.with_extension("err")).unwrap())
            .spawn()
            .unwrap()
    }

    /// The audit events of run `run_id` (`airlock runs show --json`).
    pub fn events_of(&self, run_id: &str) -> Vec<Value> {
        let show = Command::new(super::airlock_bin())
            .args(["runs", "--state-dir"])
            .arg(self.path("store"))
            .args(["show", run_id, "--json"])
            .output()
            .unwrap();
        let detail: Value = serde_json::from_slice(&show.stdout).unwrap();
        detail["events"].as_array().cloned().unwrap_or_default()
    }

    /// The record of container `id` (not one of its execs', which name its run as their
    /// session).
    pub fn record_of(&self, id: &str) -> Value {
        self.records()
            .into_iter()
            .find(|r| r["result"]["container"]["id"] == id && r["session_id"].is_null())
            .unwrap_or_else(|| panic!("no record of container {id}: {:#?}", self.records()))
    }

    /// Nothing of container `id` is left: its supervisor, its cell's cgroups, its runtime
    /// state, mounts of its bundle.
    pub fn assert_nothing_left(&self, id: &str, record: &Value) {
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
        // ctr gives every container the cgroupsPath `/<namespace>/<id>`.
        let own: Vec<PathBuf> = cgroup_hierarchies()
            .iter()
            .map(|h| h.join(&self.namespace).join(id))
            .filter(|d| d.exists())
            .collect();
        assert!(own.is_empty(), "container cgroups left of {id}: {own:?}");
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
    pub fn wait_status(&self, id: &str, status: &str) {
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
        // Every container of this test's namespace, whatever the test called it.
        let listed = self.ctr(&["container", "ls", "-q"]);
        for id in String::from_utf8_lossy(&listed.stdout).split_whitespace() {
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

pub fn containerd_config(dir: &Path) -> String {
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

/// ctr's standard output as text.
/// The roots of the hierarchies a container cgroup is made in: the unified one where it
/// has the controllers (pure v2), else memory, pids, cpu and freezer of v1.
pub fn cgroup_hierarchies() -> Vec<PathBuf> {
    let root = Path::new("/sys/fs/cgroup");
    let unified = std::fs::read_to_string(root.join("cgroup.controllers")).unwrap_or_default();
    if unified.split_whitespace().any(|c| c == "memory") {
        return vec![root.to_path_buf()];
    }
    ["memory", "pids", "cpu", "freezer"]
        .iter()
        .map(|h| root.join(h))
        .collect()
}

pub fn text(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// What the probes print of a cell's `/proc/self/status`: no capability in any set that
/// matters, no new privileges, seccomp filtering.
pub const CONFINED: &[&str] = &[
    "CapEff:\t0000000000000000",
    "CapPrm:\t0000000000000000",
    "CapBnd:\t0000000000000000",
    "NoNewPrivs:\t1",
    "Seccomp:\t2",
];

/// Every line of `lines` is in `stdout`.
pub fn assert_has_lines(stdout: &str, lines: &[&str]) {
    for line in lines {
        assert!(stdout.contains(line), "{line:?} missing: {stdout}");
    }
}
