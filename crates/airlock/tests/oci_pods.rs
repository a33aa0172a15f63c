//! Pod networking under airlock's OCI runtime: a container whose spec names a network
//! namespace (`linux.namespaces[network].path`, as Kubernetes' CNI gives a pod's) joins
//! it when the platform's contract says `network.mode: pod`, and keeps airlock's cell
//! otherwise (its own user, mount, pid, ipc, uts namespaces, no capability, seccomp).
//! The "pod" here is a named network namespace of the test's own (`ip netns add`, its
//! loopback up, a server on it); containerd of the test's own runs the container with
//! `ctr run --with-ns network:<path>`; seen from the host, only the cell's processes are
//! in the pod's network, its supervisor is back in its own. Refused: the same without a pod contract, the
//! host's network namespace, a path that is no network namespace, other namespaces.
//! Needs root, containerd, ctr, busybox-static, iproute2 and python3 (.ci/run).

mod common;

use common::containerd::Containerd;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The server's port inside the pod's network namespace (its own: nothing else listens).
const PORT: u16 = 18080;
const GREETING: &str = "hello from the pod network";
const POD_CONTRACT: &str = "network:\n  mode: pod\n";

fn text(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A named network namespace standing in for a pod's (what a CNI plugin makes), with a
/// server on its loopback; the server is killed and the namespace deleted on drop.
struct PodNetwork {
    name: String,
    server: Child,
}

impl PodNetwork {
    fn create(test: &str, root: &Path) -> PodNetwork {
        assert!(
            Path::new("/usr/sbin/ip").exists() && Path::new("/usr/bin/python3").exists(),
            "iproute2 and python3 are missing: .ci/run installs them"
        );
        let name = format!("airlock-test-{}-{test}", std::process::id());
        ip(&["netns", "add", &name]);
        // Deterministic: no unprivileged ICMP sockets, so `ping` needs a raw socket.
        in_netns(&name, &["ip", "link", "set", "lo", "up"]);
        in_netns(
            &name,
            &["sysctl", "-q", "-w", "net.ipv4.ping_group_range=1 0"],
        );
        let site = root.join("site");
        std::fs::create_dir_all(&site).unwrap();
        std::fs::write(site.join("hello.txt"), format!("{GREETING}\n")).unwrap();
        let server = Command::new("/usr/sbin/ip")
            .args([
                "netns",
                "exec",
                &name,
                "/usr/bin/python3",
                "-m",
                "http.server",
            ])
            .args(["--bind", "127.0.0.1", &PORT.to_string(), "--directory"])
            .arg(&site)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let pod = PodNetwork { name, server };
        pod.wait_serving();
        pod
    }

    fn path(&self) -> String {
        format!("/var/run/netns/{}", self.name)
    }

    fn with_ns(&self) -> String {
        format!("network:{}", self.path())
    }

    fn wait_serving(&self) {
        let url = format!("http://127.0.0.1:{PORT}/hello.txt");
        let until = Instant::now() + Duration::from_secs(20);
        loop {
            let out = Command::new("/usr/sbin/ip")
                .args(["netns", "exec", &self.name, "/usr/bin/busybox", "wget"])
                .args(["-q", "-O", "-", &url])
                .output()
                .unwrap();
            if text(&out).contains(GREETING) {
                return;
            }
            assert!(Instant::now() < until, "the pod's server never answered");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for PodNetwork {
    fn drop(&mut self) {
        let _ = self.server.kill();
        let _ = self.server.wait();
        let _ = Command::new("/usr/sbin/ip")
            .args(["netns", "delete", &self.name])
            .output();
    }
}

fn ip(args: &[&str]) -> Output {
    let out = Command::new("/usr/sbin/ip").args(args).output().unwrap();
    assert!(
        out.status.success(),
        "ip {args:?}: {}",
        common::output_text(&out)
    );
    out
}

fn in_netns(name: &str, argv: &[&str]) -> Output {
    let mut args = vec!["netns", "exec", name];
    args.extend_from_slice(argv);
    ip(&args)
}

/// From inside the pod's network: the pod's server is reached; the network cannot be
/// changed (no capability over it: an address, a link, a raw socket); the host's
/// processes and files stay out of reach; the server is still reached after the tries.
const POD_PROBE: &str = r#"
wget -q -O - "http://127.0.0.1:$PORT/hello.txt" || echo "SERVER NOT REACHED"
grep -E '^(CapEff|CapPrm|CapBnd|NoNewPrivs|Seccomp):' /proc/self/status
ip addr add 10.77.0.1/32 dev lo 2>/dev/null && echo "ADDRESS ADDED"
ip link set lo down 2>/dev/null && echo "LINK DOWN"
ping -c 1 -W 1 127.0.0.1 >/dev/null 2>&1 && echo "RAW SOCKET"
ls "/proc/$SERVER_PID" >/dev/null 2>&1 && echo "HOST PID SEEN"
kill -0 "$SERVER_PID" 2>/dev/null && echo "HOST PID SIGNALLED"
cat "$HOST_SECRET" 2>/dev/null && echo "HOST FILE READ"
unshare -U -r -n /bin/true 2>/dev/null && echo "NETWORK NAMESPACE MADE"
wget -q -O - "http://127.0.0.1:$PORT/hello.txt" >/dev/null || echo "SERVER LOST"
echo done
"#;

#[test]
fn a_pod_contracts_container_joins_the_pod_network_and_holds_no_power_over_it() {
    require_cells!();
    let containerd = Containerd::start("pod");
    let pod = PodNetwork::create("pod", containerd.dir.path());
    std::fs::write(containerd.path("contracts/pod.yaml"), POD_CONTRACT).unwrap();
    let secret = containerd.path("host-secret");
    std::fs::write(&secret, "host secret\n").unwrap();
    let env = [
        format!("HOST_SECRET={}", secret.display()),
        format!("SERVER_PID={}", pod.server.id()),
        format!("PORT={PORT}"),
    ];
    let with_ns = pod.with_ns();
    let out = containerd.run(
        &[
            "--rm",
            "--annotation",
            "airlock.dev/contract=pod",
            "--with-ns",
            &with_ns,
            "--env",
            &env[0],
            "--env",
            &env[1],
            "--env",
            &env[2],
        ],
        "t1",
        &["/bin/sh", "-c", POD_PROBE],
    );
    let stdout = text(&out);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}\n{}",
        common::output_text(&out),
        containerd.log()
    );
    assert!(stdout.contains(GREETING), "the pod's server: {stdout}");
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
        "SERVER NOT REACHED",
        "ADDRESS ADDED",
        "LINK DOWN",
        "RAW SOCKET",
        "HOST PID SEEN",
        "HOST PID SIGNALLED",
        "HOST FILE READ",
        "host secret",
        "NETWORK NAMESPACE MADE",
        "SERVER LOST",
    ] {
        assert!(!stdout.contains(breach), "{breach}: {stdout}");
    }
    // Seen from the host: the pod's network is as it was.
    let addresses = text(&in_netns(
        &pod.name,
        &["ip", "-o", "addr", "show", "dev", "lo"],
    ));
    assert!(!addresses.contains("10.77.0.1"), "{addresses}");
    let link = text(&in_netns(&pod.name, &["ip", "-o", "link", "show", "lo"]));
    assert!(link.contains("UP"), "{link}");
    // The record says which network the cell had.
    let record = containerd.record_of("t1");
    assert_eq!(record["status"], "ok", "{record:#}");
    assert_eq!(record["plan"]["network"]["mode"], "pod", "{record:#}");
    assert_eq!(record["plan"]["network"]["namespace"], pod.path());
    containerd.assert_nothing_left("t1", &record);
}

/// Runs `/bin/true` with `extra` and returns the shim's error (the run must fail).
fn refused(containerd: &Containerd, id: &str, extra: &[&str]) -> String {
    let mut args = vec!["--rm"];
    args.extend_from_slice(extra);
    let out = containerd.run(&args, id, &["/bin/true"]);
    assert!(
        !out.status.success(),
        "must be refused: {}",
        common::output_text(&out)
    );
    let _ = containerd.ctr(&["container", "delete", id]);
    stderr(&out)
}

#[test]
fn a_pod_network_is_refused_without_a_pod_contract_and_the_hosts_or_a_non_namespace_ever() {
    require_cells!();
    let containerd = Containerd::start("podrefused");
    let pod = PodNetwork::create("podrefused", containerd.dir.path());
    std::fs::write(containerd.path("contracts/pod.yaml"), POD_CONTRACT).unwrap();
    let with_ns = pod.with_ns();
    // The pod's author names a network; the default contract (network: deny) decides.
    let error = refused(&containerd, "t1", &["--with-ns", &with_ns]);
    assert!(
        error.contains(&format!("linux.namespaces[network].path ({})", pod.path()))
            && error.contains("network.mode deny does not allow joining a pod's network"),
        "{error}"
    );
    let contract = ["--annotation", "airlock.dev/contract=pod"];
    // The host's network: this test's own (containerd's and the supervisor's), and pid
    // 1's (where pid 1's namespaces are hidden even from root, as in some CI
    // containers, it cannot be opened: refused all the same).
    let cases: [(&str, String, &str); 5] = [
        (
            "t2",
            format!("network:/proc/{}/ns/net", std::process::id()),
            "(host networking)",
        ),
        (
            "t2",
            "network:/proc/1/ns/net".into(),
            "pod network namespace /proc/1/ns/net: ",
        ),
        (
            "t3",
            format!("network:{}", containerd.path("config.toml").display()),
            "is not a namespace",
        ),
        (
            "t4",
            format!("network:/proc/{}/ns/uts", std::process::id()),
            "not a network namespace",
        ),
        (
            "t1",
            "ipc:/proc/1/ns/ipc".into(),
            "linux.namespaces[ipc].path (/proc/1/ns/ipc)",
        ),
    ];
    for (id, ns, says) in &cases {
        let mut extra = contract.to_vec();
        extra.extend_from_slice(&["--with-ns", ns]);
        if ns.starts_with("ipc:") {
            extra.extend_from_slice(&["--with-ns", &with_ns]);
        }
        let error = refused(&containerd, id, &extra);
        assert!(error.contains(says), "{ns}: {error}");
    }
    // A pod contract where there is no pod network.
    let error = refused(&containerd, "t2", &contract);
    assert!(
        error.contains("network.mode pod joins the pod's network namespace"),
        "{error}"
    );
    // Every refusal is recorded as policy_denied, and nothing of them is left.
    let records = containerd.records();
    assert_eq!(records.len(), 7, "{records:#?}");
    for record in &records {
        assert_eq!(record["status"], "policy_denied", "{record:#}");
    }
    for id in ["t1", "t2", "t3", "t4"] {
        let state = Path::new("/run/containerd/runc")
            .join(&containerd.namespace)
            .join(id);
        assert!(!state.exists(), "runtime state left: {}", state.display());
    }
}

/// The namespace a `/proc/<pid>/ns/net`-like path refers to: (nsfs device, inode).
fn namespace_of(path: &str) -> (u64, u64) {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    (meta.dev(), meta.ino())
}

/// Seen from the host while the container runs: its processes are in the pod's network
/// namespace, its supervisor is back in its own (the host's: its own traffic, a fleet
/// store, never goes through the pod's network).
#[test]
fn only_the_cell_is_in_the_pods_network_and_its_supervisor_is_back_in_its_own() {
    require_cells!();
    let containerd = Containerd::start("podsupervisor");
    let pod = PodNetwork::create("podsupervisor", containerd.dir.path());
    std::fs::write(containerd.path("contracts/pod.yaml"), POD_CONTRACT).unwrap();
    let with_ns = pod.with_ns();
    let out = containerd.run(
        &[
            "-d",
            "--annotation",
            "airlock.dev/contract=pod",
            "--with-ns",
            &with_ns,
        ],
        "t2",
        &["/bin/sh", "-c", "sleep 600"],
    );
    assert!(out.status.success(), "{}", common::output_text(&out));
    containerd.wait_status("t2", "RUNNING");
    let tasks = text(&containerd.ctr(&["task", "ls"]));
    let supervisor: u32 = tasks
        .lines()
        .find(|l| l.starts_with("t2"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|pid| pid.parse().ok())
        .unwrap_or_else(|| panic!("no pid of t2: {tasks}"));
    let host = namespace_of("/proc/self/ns/net");
    let pod_ns = namespace_of(&pod.path());
    assert_ne!(host, pod_ns);
    assert_eq!(
        namespace_of(&format!("/proc/{supervisor}/ns/net")),
        host,
        "the supervisor went back to its own network namespace"
    );
    let ps = text(&containerd.ctr(&["task", "ps", "t2"]));
    let cell: Vec<u32> = ps
        .lines()
        .filter_map(|l| l.split_whitespace().next()?.parse().ok())
        .filter(|pid| *pid != supervisor)
        .collect();
    assert!(!cell.is_empty(), "the cell's processes: {ps}");
    for pid in &cell {
        assert_eq!(
            namespace_of(&format!("/proc/{pid}/ns/net")),
            pod_ns,
            "cell process {pid} is in the pod's network namespace"
        );
    }
    let kill = containerd.ctr(&["task", "kill", "-s", "SIGKILL", "t2"]);
    assert!(kill.status.success(), "{}", common::output_text(&kill));
    containerd.wait_status("t2", "STOPPED");
    let delete = containerd.ctr(&["task", "delete", "t2"]);
    assert!(delete.status.success(), "{}", common::output_text(&delete));
    let _ = containerd.ctr(&["container", "delete", "t2"]);
    let record = containerd.record_of("t2");
    containerd.assert_nothing_left("t2", &record);
}
