//! Pod networking under airlock's OCI runtime: a container whose spec names a network
//! namespace (`linux.namespaces[network].path`, as Kubernetes' CNI gives a pod's) joins
//! it when the platform's contract says `network.mode: pod`, and keeps airlock's cell
//! otherwise (its own user, mount, pid, ipc, uts namespaces, no capability, seccomp).
//! The "pod" here is a named network namespace of the test's own (`ip netns add`, its
//! loopback up, a server on it); containerd of the test's own runs the container with
//! `ctr run --with-ns network:<path>`. A pod's application container, as the CRI plugin
//! makes it, is given the sandbox's `/proc/<pid>/ns/{net,ipc,uts}` and CRI's standard
//! bind mounts: under airlock that pid is the sandbox's supervisor, which holds its
//! cell's namespaces (crates/airlock/src/oci/pod.rs), so the application container
//! shares the sandbox's network, SysV IPC and host name, and reads the pod's files
//! read-only. Refused: the same without a pod contract, the host's namespaces, a path
//! that is no namespace of the type, pid/user/mount namespaces, other bind mounts.
//! Needs root, containerd, ctr, busybox-static, iproute2 and python3 (.ci/run).

mod common;

use common::containerd::{self, text, Containerd};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The server's port inside the pod's network namespace (its own: nothing else listens).
const PORT: u16 = 18080;
const GREETING: &str = "hello from the pod network";
const POD_CONTRACT: &str = "network:\n  mode: pod\n";

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
    containerd::assert_has_lines(&stdout, containerd::CONFINED);
    assert!(stdout.contains("done"), "the probe ended: {stdout}");
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
            "host networking",
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
        // Under a pod contract an ipc path is checked as the network's: pid 1's is the
        // host's (or hidden: refused all the same).
        (
            "t1",
            "ipc:/proc/1/ns/ipc".into(),
            "pod ipc namespace /proc/1/ns/ipc: ",
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

/// The pid `ctr task ls` shows for `id`: its supervisor's.
fn supervisor_of(containerd: &Containerd, id: &str) -> u32 {
    let tasks = text(&containerd.ctr(&["task", "ls"]));
    tasks
        .lines()
        .find(|l| l.split_whitespace().next() == Some(id))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|pid| pid.parse().ok())
        .unwrap_or_else(|| panic!("no pid of {id}: {tasks}"))
}

/// The cell's processes of `id` (`ctr task ps`), its supervisor left out.
fn cell_processes(containerd: &Containerd, id: &str, supervisor: u32) -> Vec<u32> {
    let ps = text(&containerd.ctr(&["task", "ps", id]));
    let cell: Vec<u32> = ps
        .lines()
        .filter_map(|l| l.split_whitespace().next()?.parse().ok())
        .filter(|pid| *pid != supervisor)
        .collect();
    assert!(!cell.is_empty(), "the cell's processes of {id}: {ps}");
    cell
}

/// Ends a detached container and checks nothing of it is left.
fn stop_and_check(containerd: &Containerd, id: &str) {
    let kill = containerd.ctr(&["task", "kill", "-s", "SIGKILL", id]);
    assert!(kill.status.success(), "{}", common::output_text(&kill));
    containerd.wait_status(id, "STOPPED");
    let delete = containerd.ctr(&["task", "delete", id]);
    assert!(delete.status.success(), "{}", common::output_text(&delete));
    let _ = containerd.ctr(&["container", "delete", id]);
    let record = containerd.record_of(id);
    containerd.assert_nothing_left(id, &record);
}

/// Seen from the host while a pod container runs: its cell is in the pod's network
/// namespace, and its supervisor's main thread holds the cell's network, ipc and uts
/// namespaces (what CRI's `/proc/<pid>/ns/...` paths for the pod's other containers
/// name) but keeps the host's user, mount and pid namespaces: it stays the host-side
/// supervisor.
#[test]
fn the_supervisor_holds_the_pods_network_ipc_and_uts_and_keeps_the_hosts_others() {
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
    let supervisor = supervisor_of(&containerd, "t2");
    let pod_ns = namespace_of(&pod.path());
    assert_ne!(namespace_of("/proc/self/ns/net"), pod_ns);
    let cell = cell_processes(&containerd, "t2", supervisor);
    let of = |pid: u32, kind: &str| namespace_of(&format!("/proc/{pid}/ns/{kind}"));
    for pid in &cell {
        assert_eq!(
            of(*pid, "net"),
            pod_ns,
            "cell process {pid}: the pod's network"
        );
        for kind in ["ipc", "uts"] {
            assert_eq!(of(*pid, kind), of(supervisor, kind), "{kind} of {pid}");
            assert_ne!(
                of(*pid, kind),
                namespace_of(&format!("/proc/self/ns/{kind}"))
            );
        }
    }
    assert_eq!(
        of(supervisor, "net"),
        pod_ns,
        "the supervisor holds the pod's network"
    );
    for kind in ["user", "mnt", "pid"] {
        assert_eq!(
            of(supervisor, kind),
            namespace_of(&format!("/proc/self/ns/{kind}")),
            "the supervisor keeps the host's {kind} namespace"
        );
        assert_ne!(
            of(cell[0], kind),
            of(supervisor, kind),
            "the cell's own {kind}"
        );
    }
    stop_and_check(&containerd, "t2");
}

/// CRI's files of a pod, where its plugin keeps them under containerd's root, and
/// kubelet's termination log of container `app`.
struct PodFiles {
    sandbox: PathBuf,
    termination_log: PathBuf,
    /// kubelet's projected service-account volume (a read-only bind under CRI).
    token: PathBuf,
}

const TOKEN_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
const POD_HOSTS: &str = "127.0.0.1\tlocalhost\n10.0.0.5\tpod-a.pods.test pod-a\n";

impl PodFiles {
    fn create(containerd: &Containerd, sandbox_id: &str) -> PodFiles {
        let sandbox = containerd
            .path("root/io.containerd.grpc.v1.cri/sandboxes")
            .join(sandbox_id);
        std::fs::create_dir_all(&sandbox).unwrap();
        std::fs::write(sandbox.join("hosts"), POD_HOSTS).unwrap();
        std::fs::write(sandbox.join("hostname"), "pod-a\n").unwrap();
        std::fs::write(
            sandbox.join("resolv.conf"),
            "nameserver 10.96.0.10\nsearch pods.test\n",
        )
        .unwrap();
        let logs = containerd.path("kubelet/pods/0b5e9a4c/containers/app");
        std::fs::create_dir_all(&logs).unwrap();
        let termination_log = logs.join("5d41402a");
        std::fs::write(&termination_log, "").unwrap();
        let token = containerd
            .path("kubelet/pods/0b5e9a4c/volumes/kubernetes.io~projected/kube-api-access-x");
        std::fs::create_dir_all(&token).unwrap();
        std::fs::write(token.join("token"), "pod-token\n").unwrap();
        PodFiles {
            sandbox,
            termination_log,
            token,
        }
    }

    /// `--mount` arguments as CRI's (writable, as the CRI plugin asks).
    fn mounts(&self) -> Vec<String> {
        let bind = |src: &Path, dst: &str| {
            format!("type=bind,src={},dst={dst},options=rbind:rw", src.display())
        };
        vec![
            bind(&self.sandbox.join("hosts"), "/etc/hosts"),
            bind(&self.sandbox.join("hostname"), "/etc/hostname"),
            bind(&self.sandbox.join("resolv.conf"), "/etc/resolv.conf"),
            bind(&self.termination_log, "/dev/termination-log"),
            format!(
                "type=bind,src={},dst={TOKEN_DIR},options=rbind:ro",
                self.token.display()
            ),
        ]
    }
}

/// The `ctr run` arguments of a pod's application container: the sandbox supervisor's
/// namespaces as CRI names them, the CRI annotations, `extra` and CRI's mounts.
fn application_args(supervisor: u32, sandbox_id: &str, files: &PodFiles) -> Vec<String> {
    let mut args: Vec<String> = [
        "--annotation",
        "airlock.dev/contract=pod-app",
        "--annotation",
        &format!("io.kubernetes.cri.sandbox-id={sandbox_id}"),
        "--annotation",
        "io.kubernetes.cri.container-name=app",
    ]
    .iter()
    .map(|a| a.to_string())
    .collect();
    for kind in ["net", "ipc", "uts"] {
        let name = if kind == "net" { "network" } else { kind };
        args.push("--with-ns".into());
        args.push(format!("{name}:/proc/{supervisor}/ns/{kind}"));
    }
    for mount in files.mounts() {
        args.push("--mount".into());
        args.push(mount);
    }
    args
}

/// From inside the application container: the pod's server, the sandbox's host name
/// and namespaces, the pod's files read-only; no capability, no host pid or file.
const APPLICATION_PROBE: &str = r#"
wget -q -O - "http://127.0.0.1:$PORT/hello.txt" || echo "SERVER NOT REACHED"
echo "hostname=$(hostname)"
echo "ipc=$(readlink /proc/self/ns/ipc) uts=$(readlink /proc/self/ns/uts)"
cat /proc/sysvipc/msg
cat /etc/hosts /etc/resolv.conf /etc/hostname
echo "10.6.6.6 evil" >> /etc/hosts 2>/dev/null && echo "HOSTS WRITTEN"
echo x > /etc/resolv.conf 2>/dev/null && echo "RESOLV WRITTEN"
echo bye > /dev/termination-log 2>/dev/null && echo "TERMINATION LOG WRITTEN"
cat /var/run/secrets/kubernetes.io/serviceaccount/token
echo x > /var/run/secrets/kubernetes.io/serviceaccount/token 2>/dev/null && echo "TOKEN WRITTEN"
hostname other 2>/dev/null && echo "HOSTNAME CHANGED"
grep -E '^(CapEff|CapPrm|CapBnd|NoNewPrivs|Seccomp):' /proc/self/status
ls "/proc/$SERVER_PID" >/dev/null 2>&1 && echo "HOST PID SEEN"
kill -0 "$SANDBOX_SUPERVISOR" 2>/dev/null && echo "HOST PID SIGNALLED"
cat "$HOST_SECRET" 2>/dev/null && echo "HOST FILE READ"
echo done
"#;

fn readlink(path: &str) -> String {
    std::fs::read_link(path)
        .unwrap_or_else(|e| panic!("{path}: {e}"))
        .display()
        .to_string()
}

/// A pod as the CRI plugin runs it, driven with `ctr`: a sandbox container joined to the
/// pod's network under a pod contract, then an application container given the
/// sandbox's `/proc/<pid>/ns/{net,ipc,uts}` (the pid `ctr task ls` shows: its
/// supervisor's) and CRI's writable binds of the pod's hosts, hostname, resolv.conf and
/// termination log. It reaches the pod's server, has the sandbox's host name, SysV IPC
/// (a message queue made in the sandbox's ipc namespace) and namespaces, reads the
/// pod's files and cannot write them, holds no capability and sees nothing of the host.
#[test]
fn a_pods_application_container_shares_the_sandboxs_namespaces_and_reads_its_files() {
    require_cells!();
    let containerd = Containerd::start("podapp");
    let pod = PodNetwork::create("podapp", containerd.dir.path());
    std::fs::write(
        containerd.path("contracts/pod.yaml"),
        format!("{POD_CONTRACT}hostname: pod-a\n"),
    )
    .unwrap();
    std::fs::write(containerd.path("contracts/pod-app.yaml"), POD_CONTRACT).unwrap();
    let files = PodFiles::create(&containerd, "sbx1");
    let with_ns = pod.with_ns();
    let out = containerd.run(
        &[
            "-d",
            "--annotation",
            "airlock.dev/contract=pod",
            "--with-ns",
            &with_ns,
        ],
        "sbx1",
        &["/bin/sh", "-c", "sleep 600"],
    );
    assert!(out.status.success(), "{}", common::output_text(&out));
    containerd.wait_status("sbx1", "RUNNING");
    let supervisor = supervisor_of(&containerd, "sbx1");
    let sandbox_cell = cell_processes(&containerd, "sbx1", supervisor);
    // A message queue in the sandbox's ipc namespace, made from the host.
    let queue = Command::new("/usr/bin/nsenter")
        .arg(format!("--ipc=/proc/{supervisor}/ns/ipc"))
        .args(["/usr/bin/ipcmk", "-Q"])
        .output()
        .unwrap();
    assert!(queue.status.success(), "{}", common::output_text(&queue));
    let secret = containerd.path("host-secret");
    std::fs::write(&secret, "host secret\n").unwrap();
    let env = [
        format!("HOST_SECRET={}", secret.display()),
        format!("SERVER_PID={}", pod.server.id()),
        format!("SANDBOX_SUPERVISOR={supervisor}"),
        format!("PORT={PORT}"),
    ];
    let mut args = vec!["--rm".to_owned()];
    for var in &env {
        args.extend(["--env".to_owned(), var.clone()]);
    }
    args.extend(application_args(supervisor, "sbx1", &files));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = containerd.run(&args, "app", &["/bin/sh", "-c", APPLICATION_PROBE]);
    let stdout = text(&out);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}\n{}",
        common::output_text(&out),
        containerd.log()
    );
    let sandbox_ipc = readlink(&format!("/proc/{}/ns/ipc", sandbox_cell[0]));
    let sandbox_uts = readlink(&format!("/proc/{}/ns/uts", sandbox_cell[0]));
    for line in [
        GREETING,
        "hostname=pod-a",
        &format!("ipc={sandbox_ipc} uts={sandbox_uts}"),
        "10.0.0.5\tpod-a.pods.test pod-a",
        "nameserver 10.96.0.10",
        "pod-token",
        "CapEff:\t0000000000000000",
        "CapBnd:\t0000000000000000",
        "NoNewPrivs:\t1",
        "Seccomp:\t2",
        "done",
    ] {
        assert!(stdout.contains(line), "{line:?} missing: {stdout}");
    }
    // The queue made in the sandbox's ipc namespace is listed (one line beyond the
    // header of /proc/sysvipc/msg).
    let queue_id = text(&queue)
        .trim()
        .rsplit(' ')
        .next()
        .unwrap_or_default()
        .to_owned();
    let listed = stdout
        .lines()
        .skip_while(|l| !l.trim_start().starts_with("key"))
        .nth(1)
        .unwrap_or_default();
    assert_eq!(
        listed.split_whitespace().nth(1),
        Some(queue_id.as_str()),
        "the sandbox's message queue: {stdout}"
    );
    for breach in [
        "SERVER NOT REACHED",
        "HOSTS WRITTEN",
        "RESOLV WRITTEN",
        "TERMINATION LOG WRITTEN",
        "TOKEN WRITTEN",
        "HOSTNAME CHANGED",
        "HOST PID SEEN",
        "HOST PID SIGNALLED",
        "HOST FILE READ",
        "host secret",
    ] {
        assert!(!stdout.contains(breach), "{breach}: {stdout}");
    }
    // Nothing changed on the host's side.
    assert_eq!(
        std::fs::read_to_string(files.sandbox.join("hosts")).unwrap(),
        POD_HOSTS
    );
    assert_eq!(std::fs::read_to_string(&files.termination_log).unwrap(), "");
    let record = containerd.record_of("app");
    assert_eq!(record["status"], "ok", "{record:#}");
    let network = &record["plan"]["network"];
    assert_eq!(network["mode"], "pod", "{record:#}");
    assert_eq!(network["ipc"], format!("/proc/{supervisor}/ns/ipc"));
    assert_eq!(network["uts"], format!("/proc/{supervisor}/ns/uts"));
    containerd.assert_nothing_left("app", &record);
    stop_and_check(&containerd, "sbx1");
    // No process of either container is left in the pod's namespaces: only the
    // test's server is in its network.
    let pod_ns = namespace_of(&pod.path());
    let in_pod: Vec<u32> = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .filter(|pid: &u32| {
            use std::os::unix::fs::MetadataExt;
            std::fs::metadata(format!("/proc/{pid}/ns/net"))
                .is_ok_and(|m| (m.dev(), m.ino()) == pod_ns)
        })
        .collect();
    assert_eq!(in_pod, [pod.server.id()], "processes in the pod's network");
    let path = pod.path();
    drop(pod);
    assert!(!Path::new(&path).exists(), "{path} left");
}

/// Refused for an application container: the host's (the test's, i.e. the supervisor's
/// own) ipc or uts namespace, one that is not of its type, the sandbox's without a pod
/// contract, the sandbox's pid namespace, CRI's file of another pod or at another
/// destination, a writable bind elsewhere. The sandbox runs on, untouched.
#[test]
fn an_application_containers_host_namespaces_and_other_mounts_are_refused() {
    require_cells!();
    let containerd = Containerd::start("podapprefused");
    let pod = PodNetwork::create("podapprefused", containerd.dir.path());
    std::fs::write(containerd.path("contracts/pod.yaml"), POD_CONTRACT).unwrap();
    std::fs::write(containerd.path("contracts/pod-app.yaml"), POD_CONTRACT).unwrap();
    let files = PodFiles::create(&containerd, "sbx2");
    let with_ns = pod.with_ns();
    let out = containerd.run(
        &[
            "-d",
            "--annotation",
            "airlock.dev/contract=pod",
            "--with-ns",
            &with_ns,
        ],
        "sbx2",
        &["/bin/sh", "-c", "sleep 600"],
    );
    assert!(out.status.success(), "{}", common::output_text(&out));
    containerd.wait_status("sbx2", "RUNNING");
    let supervisor = supervisor_of(&containerd, "sbx2");
    let me = std::process::id();
    let base = application_args(supervisor, "sbx2", &files);
    let replace = |from: &str, to: String| -> Vec<String> {
        base.iter()
            .map(|a| if a == from { to.clone() } else { a.clone() })
            .collect()
    };
    let ipc = format!("ipc:/proc/{supervisor}/ns/ipc");
    let uts = format!("uts:/proc/{supervisor}/ns/uts");
    let hosts = format!(
        "type=bind,src={},dst=/etc/hosts,options=rbind:rw",
        files.sandbox.join("hosts").display()
    );
    let other_pod = containerd.path("root/io.containerd.grpc.v1.cri/sandboxes/other");
    std::fs::create_dir_all(&other_pod).unwrap();
    std::fs::write(other_pod.join("hosts"), "10.9.9.9 other\n").unwrap();
    let mut cases: Vec<(Vec<String>, String)> = vec![
        (
            replace(&ipc, format!("ipc:/proc/{me}/ns/ipc")),
            "pod ipc namespace".into(),
        ),
        (
            replace(&uts, format!("uts:/proc/{me}/ns/uts")),
            "pod uts namespace".into(),
        ),
        (
            replace(&uts, format!("uts:/proc/{supervisor}/ns/ipc")),
            "not a uts namespace".into(),
        ),
        // The default contract (network deny): a pod's namespaces are the platform's
        // decision, not the pod author's.
        (
            replace("airlock.dev/contract=pod-app", "x=y".into()),
            "network.mode deny does not allow joining a pod's network".into(),
        ),
        (
            replace(
                &hosts,
                format!(
                    "type=bind,src={},dst=/etc/hosts,options=rbind:rw",
                    other_pod.join("hosts").display()
                ),
            ),
            "(/etc/hosts)".into(),
        ),
        (
            replace(
                &hosts,
                format!(
                    "type=bind,src={},dst=/data/hosts,options=rbind:rw",
                    files.sandbox.join("hosts").display()
                ),
            ),
            "(/data/hosts)".into(),
        ),
    ];
    // The pod's file a symlink (to a host secret): never followed.
    let linked = PodFiles::create(&containerd, "sbx-link");
    let secret = containerd.path("host-secret");
    std::fs::write(&secret, "host secret\n").unwrap();
    std::fs::remove_file(linked.sandbox.join("hosts")).unwrap();
    std::os::unix::fs::symlink(&secret, linked.sandbox.join("hosts")).unwrap();
    cases.push((
        application_args(supervisor, "sbx-link", &linked),
        "must be a regular file (a link is never followed)".into(),
    ));
    let mut pid = base.clone();
    pid.extend(["--with-ns".into(), format!("pid:/proc/{supervisor}/ns/pid")]);
    cases.push((pid, "linux.namespaces[pid].path".into()));
    // The default contract (network deny) and no network path: the sandbox's ipc and
    // uts are still a pod's.
    let mut no_network = replace("airlock.dev/contract=pod-app", "x=y".into());
    let at = no_network
        .iter()
        .position(|a| a.starts_with("network:"))
        .unwrap();
    no_network.drain(at - 1..=at);
    cases.push((no_network, "network.mode pod".into()));
    for (n, (args, says)) in cases.iter().enumerate() {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let error = refused(&containerd, &format!("bad{n}"), &args);
        assert!(error.contains(says.as_str()), "case {n} ({says}): {error}");
    }
    // The sandbox is untouched, and nothing of the refused ones is left.
    assert_eq!(supervisor_of(&containerd, "sbx2"), supervisor);
    for n in 0..cases.len() {
        let state = Path::new("/run/containerd/runc")
            .join(&containerd.namespace)
            .join(format!("bad{n}"));
        assert!(!state.exists(), "runtime state left: {}", state.display());
    }
    stop_and_check(&containerd, "sbx2");
}

/// A container with a network of its own (the default contract, `deny`): its supervisor
/// holds its cell's ipc and uts but stays in the host's network, so a container given
/// that supervisor's `/proc/<pid>/ns/net` as a pod's network is refused as host
/// networking (a loopback-only cell is not shared), while its ipc and uts are the cell's.
#[test]
fn a_deny_cells_supervisor_keeps_the_hosts_network_which_is_never_joined() {
    require_cells!();
    let containerd = Containerd::start("poddeny");
    std::fs::write(containerd.path("contracts/pod.yaml"), POD_CONTRACT).unwrap();
    let out = containerd.run(&["-d"], "own", &["/bin/sh", "-c", "sleep 600"]);
    assert!(out.status.success(), "{}", common::output_text(&out));
    containerd.wait_status("own", "RUNNING");
    let supervisor = supervisor_of(&containerd, "own");
    let cell = cell_processes(&containerd, "own", supervisor);
    let of = |pid: u32, kind: &str| namespace_of(&format!("/proc/{pid}/ns/{kind}"));
    assert_eq!(of(supervisor, "net"), namespace_of("/proc/self/ns/net"));
    assert_ne!(of(cell[0], "net"), of(supervisor, "net"));
    for kind in ["ipc", "uts"] {
        assert_eq!(of(supervisor, kind), of(cell[0], kind), "{kind}");
    }
    let network = format!("network:/proc/{supervisor}/ns/net");
    let error = refused(
        &containerd,
        "joiner",
        &[
            "--annotation",
            "airlock.dev/contract=pod",
            "--with-ns",
            &network,
        ],
    );
    assert!(error.contains("host networking"), "{error}");
    stop_and_check(&containerd, "own");
}
