//! Boundary tests: each one runs the real `airlock` binary and has the payload try to cross
//! one boundary of the cell. An attempt that succeeds fails the test.
//!
//! The cases in `both_tiers!` run on the native cell and on gVisor (`<case>::native`,
//! `<case>::gvisor`, common/tier.rs). The others are the native cell's own, and say so
//! where they are declared: they test a mechanism gVisor does not have (airlock's pid 1,
//! its seccomp program and its foreign-ABI kill, the cell's host processes seen from the
//! host, Landlock), a contract the gVisor tier refuses before anything runs (an egress
//! allowlist, an image root: `gvisor.rs` shows the refusal), or
//! something that does not depend on the tier (contract refusals, `doctor`).
mod common;

use common::tier::Tier;
use common::CellRun;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A value nobody else will produce: pid, time and a counter.
fn random_token() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!(
        "{:x}{:x}{}",
        std::process::id(),
        nanos,
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

/// Repository root (the workspace), for the example contracts.
fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// `python3 -c script` in a default cell.
fn py(tier: Tier, script: &str) -> CellRun {
    tier.run(None, &["/usr/bin/python3", "-c", script])
}

/// A `airlock run` command on `tier` with a result file in `dir`, not yet started.
fn airlock_cmd(tier: Tier, dir: &Path, result_path: &Path, argv: &[&str]) -> Command {
    let mut cmd = Command::new(common::airlock_bin());
    cmd.current_dir(dir)
        .arg("run")
        .arg("--state-dir")
        .arg(common::state_dir())
        .arg("--result")
        .arg(result_path);
    cmd.args(tier_contract(tier, dir));
    cmd.arg("--").args(argv).stdin(Stdio::null());
    cmd
}

/// `--contract <file>` naming the tier's default contract, for a command line built by
/// hand; nothing on the native tier (its default needs no file).
fn tier_contract(tier: Tier, dir: &Path) -> Vec<String> {
    let Some(yaml) = tier.contract(None) else {
        return Vec::new();
    };
    let path = dir.join(format!("tier-contract-{}.yaml", random_token()));
    std::fs::write(&path, yaml).unwrap();
    vec!["--contract".into(), path.display().to_string()]
}

/// Lines of the form `name: verdict` printed by the probe scripts below.
fn verdicts(run: &CellRun) -> Vec<(String, String)> {
    run.stdout()
        .lines()
        .filter_map(|l| l.split_once(": "))
        .map(|(a, b)| (a.trim().to_owned(), b.trim().to_owned()))
        .collect()
}

/// Asserts each probe in `names` printed a line `name: blocked...`.
fn assert_blocked(run: &CellRun, names: &[&str]) {
    if std::env::var_os("AIRLOCK_TEST_VERBOSE").is_some() {
        eprintln!("{}", run.stdout());
    }
    let v = verdicts(run);
    for name in names {
        let verdict = v
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
            .unwrap_or_else(|| panic!("probe `{name}` printed nothing\n{}", run.describe()));
        assert!(
            verdict.starts_with("blocked"),
            "boundary crossed: `{name}` -> `{verdict}`\n{}",
            run.describe()
        );
    }
}

// 0 ---------------------------------------------------------------------------------------

/// Without root the suite cannot run; cargo counts a test that returns early as passed,
/// so a run without root must fail unless skipping was asked for, and CI's variable
/// fails it even then.
/// Runs no cell: the harness's own rule, the same for both tiers.
#[test]
fn tests_that_need_root_fail_without_it_unless_skipping_is_asked_for() {
    use common::{without_root, WithoutRoot};
    assert!(matches!(without_root(false, false), WithoutRoot::Fail(why)
        if why.contains("needs root") && why.contains(common::ALLOW_SKIP_VAR)));
    assert_eq!(without_root(false, true), WithoutRoot::Skip);
    for allow_skip in [false, true] {
        assert!(
            matches!(without_root(true, allow_skip), WithoutRoot::Fail(why)
            if why.contains(common::REQUIRE_ROOT_VAR))
        );
    }
}

// 1 ---------------------------------------------------------------------------------------

both_tiers! {
fn host_shadow_file_is_unreadable(tier) {
    require_cells!();
    let host_shadow = std::fs::read_to_string("/etc/shadow").unwrap_or_default();
    let first = host_shadow.lines().next().unwrap_or("").to_owned();

    let run = tier.sh(
        "cat /etc/shadow; echo \"cat: exit $?\"; \
         cat /etc/gshadow; echo \"gcat: exit $?\"; \
         python3 -c '\n\
try:\n    open(\"/etc/shadow\").read(); print(\"py: READ\")\n\
except (PermissionError, FileNotFoundError) as e: print(\"py: blocked\", type(e).__name__)\n'",
    );
    let d = run.describe();
    assert_eq!(run.code(), 0, "{d}");
    let v = verdicts(&run);
    let cat = v.iter().find(|(n, _)| n == "cat").map(|(_, v)| v.clone());
    assert!(
        cat.as_deref().is_some_and(|c| c != "exit 0"),
        "cat /etc/shadow must fail\n{d}"
    );
    assert_blocked(&run, &["py"]);
    if !first.is_empty() {
        let everything = format!("{}{}", run.stdout(), run.stderr());
        assert!(!everything.contains(&first), "host shadow leaked\n{d}");
        // The user name with its hash field (root:<hash>) must never appear either.
        let mut fields = first.split(':');
        let user = fields.next().unwrap_or("");
        let hash = fields.next().unwrap_or("");
        if hash.len() > 2 {
            assert!(!everything.contains(hash), "host password hash leaked\n{d}");
        }
        assert!(
            !run.stdout().contains(&format!("{user}:{hash}:")),
            "host shadow entry leaked\n{d}"
        );
    }
}
}

// 2 ---------------------------------------------------------------------------------------

struct Marker(Vec<PathBuf>);
impl Drop for Marker {
    fn drop(&mut self) {
        for p in &self.0 {
            let _ = std::fs::remove_file(p);
        }
    }
}

both_tiers! {
fn host_marker_files_are_invisible(tier) {
    require_cells!();
    let token = random_token();
    let name = format!("airlock-marker-{token}");
    // The content is never written literally in the script: the probes search for a
    // bracket pattern that matches it.
    let content = format!("MARKER-{token}-CONTENT");
    let pattern = format!("MARKER-{token}-CONTEN[T]");
    let paths = vec![
        PathBuf::from(format!("/var/tmp/{name}")),
        PathBuf::from(format!("/root/{name}")),
        PathBuf::from(format!("/tmp/{name}")),
    ];
    let _cleanup = Marker(paths.clone());
    for p in &paths {
        std::fs::write(p, format!("{content}\n")).unwrap();
    }

    let script = format!(
        r#"
# Positive control inside the cell, so a probe that finds nothing is known to work.
printf 'MARKER-%s-CONTENT\n' '{token}' > /tmp/{name}-control
for p in /var/tmp/{name} /root/{name} /tmp/{name} /proc/1/root/var/tmp/{name} /proc/1/root/root/{name} /proc/self/root/var/tmp/{name}; do
  cat "$p" 2>/dev/null && echo "FOUND-cat $p"
done
for d in /proc/[0-9]*; do
  cat "$d/root/var/tmp/{name}" "$d/root/root/{name}" "$d/root/tmp/{name}" "$d/cwd/{name}" 2>/dev/null && echo "FOUND-proc $d"
done
find / -name '{name}*' 2>/dev/null | sed 's/^/FOUND-find /'
find /proc/1/root/ -xdev -name '{name}*' 2>/dev/null | sed 's/^/FOUND-find1 /'
grep -rsl --devices=skip --exclude-dir=proc --exclude-dir=usr --exclude-dir=sys '{pattern}' / 2>/dev/null | sed 's/^/FOUND-grep /'
grep -rsl --devices=skip '{pattern}' /proc/1/root/tmp /proc/1/root/var /proc/1/root/root 2>/dev/null | sed 's/^/FOUND-grep1 /'
echo probes-done
"#
    );
    let run = tier.sh(&script);
    let d = run.describe();
    assert!(run.stdout().contains("probes-done"), "{d}");
    assert!(
        !run.stdout().contains(&content) && !run.stderr().contains(&content),
        "host marker content leaked\n{d}"
    );
    let stdout = run.stdout();
    let found: Vec<&str> = stdout.lines().filter(|l| l.starts_with("FOUND-")).collect();
    let control = format!("/tmp/{name}-control");
    for probe in ["FOUND-find ", "FOUND-grep "] {
        assert!(
            found.contains(&format!("{probe}{control}").as_str()),
            "the probe `{probe}` does not work: it missed the cell's own control file\n{d}"
        );
    }
    let leaks: Vec<&&str> = found.iter().filter(|l| !l.ends_with("-control")).collect();
    assert!(leaks.is_empty(), "host marker visible: {leaks:?}\n{d}");
    assert_eq!(run.code(), 0, "{d}");
    // The host's /tmp marker is untouched and the cell's /tmp is not the host's.
    assert_eq!(
        std::fs::read_to_string(&paths[2]).unwrap(),
        format!("{content}\n")
    );
}
}

// 3 ---------------------------------------------------------------------------------------

both_tiers! {
fn writes_outside_writable_paths_fail(tier) {
    require_cells!();
    let token = random_token();
    let host_hostname = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    let script = format!(
        r#"
t() {{ if sh -c "$2" 2>/dev/null; then echo "$1: WROTE"; else echo "$1: blocked"; fi; }}
t root 'touch /x-{token}'
t usr 'touch /usr/x-{token}'
t usr-bin 'cp /bin/sh /usr/bin/x-{token}'
t bin 'touch /bin/x-{token}'
t lib 'touch /lib/x-{token}'
t etc 'touch /etc/x-{token}'
t etc-passwd 'echo evil::0:0::/:/bin/sh >> /etc/passwd'
t etc-hosts 'echo 1.2.3.4 evil >> /etc/hosts'
t dev 'touch /dev/x-{token}'
t dev-null-replace 'rm -f /dev/null'
t proc 'touch /proc/x-{token}'
t proc-hostname 'echo evil > /proc/sys/kernel/hostname'
t proc-core-pattern 'echo "|/tmp/evil" > /proc/sys/kernel/core_pattern'
t proc-sysrq 'echo h > /proc/sysrq-trigger'
t proc-self-mem-usr 'printf x | dd of=/proc/1/mem bs=1 seek=4096 conv=notrunc'
t sys 'mkdir -p /sys/x-{token}'
t mkdir-root 'mkdir /newdir-{token}'
t chmod-root 'chmod 777 /'
t mkdir-usr-local 'mkdir /usr/local/x-{token}'
if echo hi > /tmp/x-{token} && [ "$(cat /tmp/x-{token})" = hi ]; then echo "tmp: writable"; else echo "tmp: FAILED"; fi
if echo hi > /dev/shm/x-{token}; then echo "shm: writable"; else echo "shm: blocked"; fi
hostname
"#
    );
    let run = tier.sh(&script);
    let d = run.describe();
    assert_eq!(run.code(), 0, "{d}");
    assert_blocked(
        &run,
        &[
            "root",
            "usr",
            "usr-bin",
            "bin",
            "lib",
            "etc",
            "etc-passwd",
            "etc-hosts",
            "dev",
            "dev-null-replace",
            "proc",
            "proc-hostname",
            "proc-core-pattern",
            "proc-sysrq",
            "proc-self-mem-usr",
            "sys",
            "mkdir-root",
            "chmod-root",
            "mkdir-usr-local",
        ],
    );
    assert!(
        run.stdout().contains("tmp: writable"),
        "/tmp is the contract's writable path and must accept writes\n{d}"
    );
    // Nothing reached the host.
    for p in [
        format!("/usr/x-{token}"),
        format!("/usr/bin/x-{token}"),
        format!("/usr/local/x-{token}"),
        format!("/bin/x-{token}"),
        format!("/x-{token}"),
        format!("/tmp/x-{token}"),
        format!("/dev/shm/x-{token}"),
    ] {
        assert!(!Path::new(&p).exists(), "{p} appeared on the host\n{d}");
    }
    assert_eq!(
        std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap(),
        host_hostname,
        "host hostname changed\n{d}"
    );
    assert!(
        run.stdout().lines().any(|l| l == "airlock"),
        "cell hostname\n{d}"
    );
}
}

// 4 ---------------------------------------------------------------------------------------

both_tiers! {
fn network_is_denied(tier) {
    require_cells!();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let nameserver = std::fs::read_to_string("/etc/resolv.conf")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("nameserver ").map(|s| s.trim().to_owned()))
        .filter(|s| s.parse::<std::net::Ipv4Addr>().is_ok())
        .unwrap_or_else(|| "8.8.4.4".to_owned());

    let script = format!(
        r#"
import socket, subprocess
def probe(name, fn):
    try:
        r = fn()
        print(f"{{name}}: CONNECTED {{r}}")
    except Exception as e:
        print(f"{{name}}: blocked {{type(e).__name__}} {{e}}")
def tcp(host, port):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(3)
    s.connect((host, port))
    s.sendall(b"hello from the cell\n")
    return s.getsockname()
def udp(host, port):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(2)
    return s.sendto(b"\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00\x07example\x03com\x00\x00\x01\x00\x01", (host, port))
def tcp6(host, port):
    s = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
    s.settimeout(3)
    s.connect((host, port))
    return s.getsockname()
probe("host-listener", lambda: tcp("127.0.0.1", {port}))
probe("host-listener-6", lambda: tcp6("::1", {port}))
probe("metadata", lambda: tcp("169.254.169.254", 80))
probe("public-tcp", lambda: tcp("1.1.1.1", 443))
probe("dns-test", lambda: socket.getaddrinfo("example.test", 80))
probe("dns-com", lambda: socket.getaddrinfo("example.com", 443))
probe("udp-google", lambda: udp("8.8.8.8", 53))
probe("udp-nameserver", lambda: udp("{nameserver}", 53))
r = subprocess.run(["getent", "hosts", "example.com"], capture_output=True)
print("getent:", "blocked" if r.returncode != 0 else "RESOLVED " + r.stdout.decode())
r = subprocess.run(["bash", "-c", "echo hi > /dev/tcp/127.0.0.1/{port}"], capture_output=True)
print("bash-dev-tcp:", "blocked" if r.returncode != 0 else "CONNECTED")
with open("/proc/net/dev") as f:
    names = [l.split(":")[0].strip() for l in f.readlines()[2:]]
print("ifaces:", ",".join(names))
r = subprocess.run(["ip", "-o", "link"], capture_output=True)
print("iplink:", ",".join(l.split(":")[1].strip() for l in r.stdout.decode().splitlines()) or "none", r.returncode)
"#
    );
    let run = py(tier, &script);
    let d = run.describe();
    assert_eq!(run.code(), 0, "{d}");
    assert_blocked(
        &run,
        &[
            "host-listener",
            "host-listener-6",
            "metadata",
            "public-tcp",
            "dns-test",
            "dns-com",
            "udp-google",
            "udp-nameserver",
            "getent",
            "bash-dev-tcp",
        ],
    );
    let v = verdicts(&run);
    let ifaces = v
        .iter()
        .find(|(n, _)| n == "ifaces")
        .map(|(_, v)| v.clone());
    assert_eq!(ifaces.as_deref(), Some("lo"), "only lo in the cell\n{d}");
    if let Some((_, iplink)) = v.iter().find(|(n, _)| n == "iplink") {
        if !iplink.starts_with("none") {
            assert!(iplink.starts_with("lo "), "only lo in `ip link`\n{d}");
        }
    }
    // The host listener never saw a connection.
    let deadline = Instant::now() + Duration::from_millis(300);
    loop {
        match listener.accept() {
            Ok((_, peer)) => panic!("the cell reached the host listener from {peer}\n{d}"),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => panic!("accept: {e}"),
        }
        if Instant::now() > deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
}

// 5 ---------------------------------------------------------------------------------------

both_tiers! {
fn host_processes_are_invisible(tier) {
    require_cells!();
    let me = std::process::id();
    let script = format!(
        r#"
pids=; for p in /proc/[0-9]*; do pids="$pids ${{p#/proc/}}"; done; echo "pids: $pids"
if kill -0 {me} 2>/dev/null; then echo "kill-0: SIGNALLED"; else echo "kill-0: blocked"; fi
if kill -0 1 2>/dev/null; then echo "kill-0-1: ok"; else echo "kill-0-1: no"; fi
if [ -e /proc/{me} ]; then echo "proc-entry: VISIBLE"; else echo "proc-entry: blocked"; fi
ps -e -o pid=,comm= | sed 's/^/ps /'
"#
    );
    let run = tier.sh(&script);
    let d = run.describe();
    assert_eq!(run.code(), 0, "{d}");
    assert_blocked(&run, &["kill-0", "proc-entry"]);
    let v = verdicts(&run);
    let pids: Vec<u32> = v
        .iter()
        .find(|(n, _)| n == "pids")
        .map(|(_, p)| {
            p.split_whitespace()
                .filter_map(|x| x.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    assert!(!pids.is_empty(), "{d}");
    assert!(
        pids.len() <= 10,
        "the cell sees more processes than its own: {pids:?}\n{d}"
    );
    assert!(!pids.contains(&me), "{d}");
    assert!(
        pids.iter().all(|&p| p < 100),
        "pids of a fresh pid namespace are small: {pids:?}\n{d}"
    );
    let stdout = run.stdout();
    let ps: Vec<&str> = stdout
        .lines()
        .filter_map(|l| l.strip_prefix("ps "))
        .collect();
    assert!(ps.len() <= 8, "ps shows {ps:?}\n{d}");
    for comm in ["cargo", "systemd", "init", "boundaries", "sshd"] {
        assert!(
            !ps.iter().any(|l| l.split_whitespace().nth(1) == Some(comm)),
            "host process {comm} visible\n{d}"
        );
    }
}
}

// 6 ---------------------------------------------------------------------------------------

fn status_field<'a>(status: &'a str, key: &str) -> Option<&'a str> {
    status
        .lines()
        .find_map(|l| l.strip_prefix(key).and_then(|r| r.strip_prefix(':')))
        .map(str::trim)
}

/// Native only: it reads the cell's processes from the host; on gVisor the payload's processes
/// are the Sentry's tasks, not host processes (the sandbox's host ids: crates/oci's tests).
#[test]
fn privileges_are_dropped_inside_and_outside() {
    require_cells!();
    let run = common::sh("cat /proc/self/status; echo \"idu: $(id -u) $(id -g) $(id -G)\"");
    let d = run.describe();
    assert_eq!(run.code(), 0, "{d}");
    let out = run.stdout();
    for cap in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
        assert_eq!(
            status_field(&out, cap),
            Some("0000000000000000"),
            "{cap}\n{d}"
        );
    }
    assert_eq!(status_field(&out, "NoNewPrivs"), Some("1"), "{d}");
    assert_eq!(status_field(&out, "Seccomp"), Some("2"), "{d}");
    let uids: Vec<&str> = status_field(&out, "Uid")
        .unwrap_or("")
        .split_whitespace()
        .collect();
    assert_eq!(uids, ["10001"; 4], "{d}");
    let gids: Vec<&str> = status_field(&out, "Gid")
        .unwrap_or("")
        .split_whitespace()
        .collect();
    assert_eq!(gids, ["10001"; 4], "{d}");
    assert!(out.contains("idu: 10001 10001 10001\n"), "{d}");

    // From the host: every process of a running cell has a non-root host uid.
    let token = random_token();
    let sleep_arg = format!(
        "3.{}",
        token
            .bytes()
            .map(|b| b % 10)
            .map(|b| (b'0' + b) as char)
            .collect::<String>()
    );
    let dir = tempfile::tempdir().unwrap();
    let result_path = dir.path().join("r.json");
    let mut child = airlock_cmd(
        Tier::Native,
        dir.path(),
        &result_path,
        &["/bin/sleep", &sleep_arg],
    )
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(3);
    let mut payload = None;
    while payload.is_none() && Instant::now() < deadline {
        for entry in std::fs::read_dir("/proc").unwrap().flatten() {
            let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
                continue;
            };
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let args: Vec<&[u8]> = cmdline.split(|&b| b == 0).collect();
            if args.len() >= 2 && args[0].ends_with(b"sleep") && args[1] == sleep_arg.as_bytes() {
                payload = Some(pid);
                break;
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let payload = payload.expect("the cell's sleep process was not found on the host");
    let pidns = std::fs::read_link(format!("/proc/{payload}/ns/pid")).unwrap();
    let mut cell_procs = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if std::fs::read_link(format!("/proc/{pid}/ns/pid"))
            .ok()
            .as_ref()
            != Some(&pidns)
        {
            continue;
        }
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        let comm = status_field(&status, "Name").unwrap_or("?").to_owned();
        let uid = status_field(&status, "Uid").unwrap_or("").to_owned();
        let gid = status_field(&status, "Gid").unwrap_or("").to_owned();
        let capeff = status_field(&status, "CapEff").unwrap_or("").to_owned();
        cell_procs.push((pid, comm, uid, gid, capeff));
    }
    let _ = child.kill();
    let output = child.wait_with_output().unwrap();
    assert!(!cell_procs.is_empty());
    for (pid, comm, uid, gid, capeff) in &cell_procs {
        assert!(
            !uid.is_empty() && uid.split_whitespace().all(|u| u != "0"),
            "cell process {pid} ({comm}) runs as host uid {uid}; all: {cell_procs:?}\n{output:?}"
        );
        assert!(
            gid.split_whitespace().all(|g| g != "0"),
            "cell process {pid} ({comm}) runs as host gid {gid}; all: {cell_procs:?}"
        );
        assert_eq!(
            capeff, "0000000000000000",
            "cell process {pid} ({comm}) holds capabilities; all: {cell_procs:?}"
        );
    }
}

/// The cell's setup uses helper processes (the old root's detach runs in one, with every
/// capability of the cell's user namespace). None may be left when the payload starts:
/// the payload sees only pid 1 and itself, and pid 1 holds no capability either.
/// Native only: airlock's pid 1 exists only in the native cell (on gVisor the payload is the
/// sandbox's init).
#[test]
fn the_payload_starts_with_no_helper_left_and_pid_1_unprivileged() {
    require_cells!();
    let run = py(
        Tier::Native,
        r#"
import os
me = os.getpid()
for p in sorted(os.listdir("/proc"), key=lambda p: (len(p), p)):
    if not p.isdigit():
        continue
    try:
        status = open(f"/proc/{p}/status").read()
    except OSError:
        continue
    f = {k: v.strip() for k, _, v in (l.partition(":") for l in status.splitlines())}
    who = "self" if int(p) == me else f["Name"]
    print("proc", p, who, f["State"].split()[0], f["CapEff"], f["CapPrm"])
"#,
    );
    let d = run.describe();
    assert_eq!(run.code(), 0, "{d}");
    let stdout = run.stdout();
    let procs: Vec<Vec<&str>> = stdout
        .lines()
        .filter_map(|l| l.strip_prefix("proc "))
        .map(|l| l.split_whitespace().collect())
        .collect();
    let pids: Vec<&str> = procs.iter().map(|p| p[0]).collect();
    assert_eq!(pids.len(), 2, "only pid 1 and the payload: {procs:?}\n{d}");
    assert_eq!(pids[0], "1", "{procs:?}\n{d}");
    assert_eq!(procs[1][1], "self", "{procs:?}\n{d}");
    for p in &procs {
        assert_ne!(p[2], "Z", "a zombie is left: {p:?}\n{d}");
        assert_eq!(
            (p[3], p[4]),
            ("0000000000000000", "0000000000000000"),
            "process {p:?} holds capabilities\n{d}"
        );
    }
}

/// pid 1 of the cell is a clone of the supervisor, not an exec: what the payload can read
/// of it (`/proc/1/cmdline`, `comm`, `status`, `environ` if readable, and the same of its
/// own parent) must not show the host's `airlock run` command line (host paths of the
/// contract, the operator config and the state dir) or environment, only a neutral name.
/// Native only: airlock's pid 1 exists only in the native cell.
#[test]
fn pid_1_shows_a_neutral_name_and_nothing_of_the_host_command_line() {
    require_cells!();
    let marker = format!("hostpath{}", random_token());
    let dir = tempfile::Builder::new().prefix(&marker).tempdir().unwrap();
    let contract = dir.path().join(format!("contract-{marker}.yaml"));
    std::fs::write(&contract, "{}\n").unwrap();
    let config = dir.path().join(format!("config-{marker}.toml"));
    std::fs::write(&config, "").unwrap();
    let state = dir.path().join(format!("state-{marker}"));
    let result_path = dir.path().join("result.json");
    let probe = r#"
import json, os
def read(path):
    try:
        return open(path, "rb").read().decode("latin-1")
    except OSError as e:
        return f"unreadable: {e.strerror}"
out = {}
for pid in sorted({"1", str(os.getppid())}):
    for name in ("cmdline", "comm", "status", "environ"):
        out[f"/proc/{pid}/{name}"] = read(f"/proc/{pid}/{name}")
print(json.dumps(out))
"#;
    let output = Command::new(common::airlock_bin())
        .current_dir(dir.path())
        .arg("run")
        .arg("--contract")
        .arg(&contract)
        .arg("--config")
        .arg(&config)
        .arg("--state-dir")
        .arg(&state)
        .arg("--result")
        .arg(&result_path)
        .args(["--", "/usr/bin/python3", "-c", probe])
        .env("AIRLOCK_TEST_HOST_MARKER", &marker)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let run = CellRun::collect(output, &result_path);
    let d = run.describe();
    assert_eq!(run.code(), 0, "{d}");
    let seen: serde_json::Value = serde_json::from_str(run.stdout().trim())
        .unwrap_or_else(|e| panic!("probe output is not JSON ({e})\n{d}"));
    for (path, text) in seen.as_object().expect("an object of files") {
        let text = text.as_str().unwrap();
        assert!(
            !text.contains(&marker) && !text.contains("AIRLOCK_TEST_HOST_MARKER"),
            "{path} shows the host's command line or environment: {text:?}\n{d}"
        );
    }
    assert_eq!(seen["/proc/1/cmdline"], "airlock-init\0", "{d}");
    assert_eq!(seen["/proc/1/comm"], "airlock-init\n", "{d}");
    let status = seen["/proc/1/status"].as_str().unwrap();
    assert_eq!(status_field(status, "Name"), Some("airlock-init"), "{d}");
    let environ = seen["/proc/1/environ"].as_str().unwrap();
    assert!(
        environ.starts_with("unreadable") || environ.bytes().all(|b| b == 0),
        "/proc/1/environ is readable and not blank: {environ:?}\n{d}"
    );
}

// 7 ---------------------------------------------------------------------------------------

both_tiers! {
fn dangerous_syscalls_are_blocked(tier) {
    require_cells!();
    let script = r#"
import ctypes, ctypes.util, os, socket, subprocess, fcntl, termios, time
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def sc(name, nr, *args):
    r = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) if isinstance(a, int) else a for a in args])
    e = ctypes.get_errno()
    print(f"{name}: " + (f"blocked errno={e} {os.strerror(e)}" if r == -1 else f"ALLOWED ret={r}"))
def cmd(name, argv):
    r = subprocess.run(argv, capture_output=True)
    print(f"{name}: " + (f"blocked exit={r.returncode} {r.stderr.decode().strip()[:80]}" if r.returncode != 0 else "ALLOWED " + r.stdout.decode()[:80]))
def call(name, fn):
    try:
        r = fn()
        print(f"{name}: ALLOWED {r}")
    except OSError as e:
        print(f"{name}: blocked {type(e).__name__} errno={e.errno}")

# namespaces
r = libc.unshare(0x10000000); e = ctypes.get_errno()
print("unshare-user: " + (f"blocked errno={e}" if r == -1 else "ALLOWED"))
r = libc.unshare(0x00020000); e = ctypes.get_errno()
print("unshare-mount: " + (f"blocked errno={e}" if r == -1 else "ALLOWED"))
r = libc.unshare(0x40000000); e = ctypes.get_errno()
print("unshare-net: " + (f"blocked errno={e}" if r == -1 else "ALLOWED"))
cmd("unshare-U-cmd", ["unshare", "-U", "-r", "id"])
cmd("unshare-m-cmd", ["unshare", "-m", "true"])
# clone(CLONE_NEWUSER|SIGCHLD) through the raw syscall: a child would return 0
sc("clone-newuser", 56, 0x10000000 | 17, 0, 0, 0, 0)
# gVisor has no /proc/self/ns (nothing there to join): the root directory stands in
fd = os.open("/proc/self/ns/mnt" if os.path.exists("/proc/self/ns/mnt") else "/", os.O_RDONLY)
sc("setns", 308, fd, 0)
# mount
os.makedirs("/tmp/m", exist_ok=True)
cmd("mount-cmd", ["mount", "-t", "tmpfs", "none", "/tmp/m"])
r = libc.mount(b"none", b"/tmp/m", b"tmpfs", 0, None); e = ctypes.get_errno()
print("mount-libc: " + (f"blocked errno={e}" if r == -1 else "ALLOWED"))
sc("umount2", 166, ctypes.c_char_p(b"/usr"), 2)
sc("pivot_root", 155, ctypes.c_char_p(b"/tmp"), ctypes.c_char_p(b"/tmp/m"))
sc("chroot", 161, ctypes.c_char_p(b"/tmp"))
sc("open_tree", 428, -100, ctypes.c_char_p(b"/usr"), 1)
sc("fsopen", 430, ctypes.c_char_p(b"tmpfs"), 0)
# kernel attack surface
sc("keyctl", 250, 0, -3, 1)
sc("add_key", 248, ctypes.c_char_p(b"user"), ctypes.c_char_p(b"k"), ctypes.c_char_p(b"v"), 1, -3)
params = ctypes.create_string_buffer(120)
sc("io_uring_setup", 425, 8, params)
attr = ctypes.create_string_buffer(128)
ctypes.memmove(attr, (ctypes.c_uint32 * 4)(1, 4, 4, 1), 16)
sc("bpf", 321, 0, attr, 128)
pattr = ctypes.create_string_buffer(128)
ctypes.memmove(pattr, (ctypes.c_uint32 * 2)(1, 128), 8)
sc("perf_event_open", 298, pattr, 0, -1, -1, 0)
sc("userfaultfd", 323, 0)
sc("kexec_load", 246, 0, 0, 0, 0)
sc("init_module", 175, 0, 0, ctypes.c_char_p(b""))
sc("reboot", 169, 0xfee1dead, 0x28121969, 0x4321fedc, 0)
sc("swapon", 167, ctypes.c_char_p(b"/tmp/x"), 0)
sc("acct", 163, ctypes.c_char_p(b"/tmp/acct"))
sc("settimeofday", 164, 0, 0)
sc("sethostname", 170, ctypes.c_char_p(b"evil"), 4)
sc("iopl", 172, 3)
sc("ioperm", 173, 0, 1024, 1)
sc("open_by_handle_at", 304, 3, 0, 0)
# ptrace
sc("ptrace-traceme", 101, 0, 0, 0, 0)
victim = subprocess.Popen(["sleep", "5"])
time.sleep(0.1)
sc("ptrace-attach", 101, 16, victim.pid, 0, 0)
sc("ptrace-seize", 101, 0x4206, victim.pid, 0, 0)
local = ctypes.create_string_buffer(8)
iov_l = (ctypes.c_void_p * 2)(ctypes.cast(local, ctypes.c_void_p), 8)
iov_r = (ctypes.c_void_p * 2)(0x400000, 8)
sc("process_vm_readv", 310, victim.pid, iov_l, 1, iov_r, 1, 0)
call("proc-pid-mem", lambda: open(f"/proc/{victim.pid}/mem", "rb").read(1))
victim.kill()
# terminal injection on a fresh pty
master, slave = os.openpty()
call("tiocsti-fcntl", lambda: fcntl.ioctl(slave, termios.TIOCSTI, b"x"))
ch = ctypes.c_char(b"x")
r = libc.ioctl(slave, ctypes.c_ulong(termios.TIOCSTI), ctypes.byref(ch)); e = ctypes.get_errno()
print("tiocsti-libc: " + (f"blocked errno={e}" if r == -1 else "ALLOWED"))
# the kernel truncates the ioctl request to 32 bits: high bits must not slip past the filter
r = libc.ioctl(slave, ctypes.c_ulong((1 << 32) | termios.TIOCSTI), ctypes.byref(ch)); e = ctypes.get_errno()
print("tiocsti-highbits: " + (f"blocked errno={e}" if r == -1 else "ALLOWED"))
call("tiocsti-stdin", lambda: fcntl.ioctl(0, termios.TIOCSTI, b"x"))
# identity
r = libc.setuid(0); e = ctypes.get_errno()
print("setuid0: " + (f"blocked errno={e}" if r == -1 else "ALLOWED"))
r = libc.setgid(0); e = ctypes.get_errno()
print("setgid0: " + (f"blocked errno={e}" if r == -1 else "ALLOWED"))
sc("setresuid0", 117, 0, 0, 0)
sc("setgroups0", 116, 1, (ctypes.c_uint * 1)(0))
# socket families
call("af-vsock", lambda: socket.socket(40, socket.SOCK_STREAM))
call("af-alg", lambda: socket.socket(38, socket.SOCK_SEQPACKET))
call("af-packet", lambda: socket.socket(17, socket.SOCK_RAW, 0x0300))
call("af-packet-dgram", lambda: socket.socket(17, socket.SOCK_DGRAM, 0x0300))
call("raw-inet", lambda: socket.socket(socket.AF_INET, socket.SOCK_RAW, 1))
print("done: yes")
"#;
    let run = py(tier, script);
    let d = run.describe();
    assert!(run.stdout().contains("done: yes"), "{d}");
    assert_eq!(run.code(), 0, "{d}");
    assert_eq!(run.status(), "ok", "{d}");
    assert_blocked(
        &run,
        &[
            "unshare-user",
            "unshare-mount",
            "unshare-net",
            "unshare-U-cmd",
            "unshare-m-cmd",
            "clone-newuser",
            "setns",
            "mount-cmd",
            "mount-libc",
            "umount2",
            "pivot_root",
            "chroot",
            "open_tree",
            "fsopen",
            "keyctl",
            "add_key",
            "io_uring_setup",
            "bpf",
            "perf_event_open",
            "userfaultfd",
            "kexec_load",
            "init_module",
            "reboot",
            "swapon",
            "acct",
            "settimeofday",
            "sethostname",
            "iopl",
            "ioperm",
            "open_by_handle_at",
            "ptrace-traceme",
            "ptrace-attach",
            "ptrace-seize",
            "process_vm_readv",
            "proc-pid-mem",
            "tiocsti-fcntl",
            "tiocsti-libc",
            "tiocsti-highbits",
            "tiocsti-stdin",
            "setuid0",
            "setgid0",
            "setresuid0",
            "setgroups0",
            "af-vsock",
            "af-alg",
            "af-packet",
            "af-packet-dgram",
            "raw-inet",
        ],
    );
    // TIOCSTI on a real pty is refused by the filter itself (EPERM), not by the tty layer.
    for name in ["tiocsti-fcntl", "tiocsti-libc", "tiocsti-highbits"] {
        let v = verdicts(&run);
        let verdict = &v.iter().find(|(n, _)| n == name).unwrap().1;
        assert!(
            verdict.contains("errno=1"),
            "{name} must fail with EPERM: {verdict}\n{d}"
        );
    }
}
}

/// Native only: airlock's seccomp program and its kill; the Sentry serves (or refuses) a
/// foreign ABI itself (see `dangerous_syscalls_are_blocked`'s gVisor gap).
#[test]
fn foreign_abi_syscall_kills_the_cell_as_suspected_escape() {
    require_cells!();
    // x32: the x32 bit on getpid.
    let run = py(
        Tier::Native,
        "import ctypes\nctypes.CDLL(None).syscall(0x40000000 | 39)\nprint('survived')",
    );
    let d = run.describe();
    assert!(!run.stdout().contains("survived"), "{d}");
    assert_eq!(run.status(), "suspected_escape", "{d}");
    assert_eq!(run.result["exit"]["signal"].as_i64(), Some(31), "{d}");
    assert_eq!(run.code(), 128 + 31, "{d}");

    // i386: int 0x80 (getpid = 20 in the i386 table) from a tiny mmap'd code page.
    let run = py(
        Tier::Native,
        r#"
import ctypes, mmap
code = bytes([0xb8, 20, 0, 0, 0, 0xcd, 0x80, 0xc3])  # mov eax,20; int 0x80; ret
buf = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
buf.write(code)
addr = ctypes.addressof(ctypes.c_char.from_buffer(buf))
ctypes.CFUNCTYPE(ctypes.c_int)(addr)()
print('survived')
"#,
    );
    let d = run.describe();
    assert!(!run.stdout().contains("survived"), "{d}");
    assert_eq!(run.status(), "suspected_escape", "{d}");
    assert_eq!(run.result["exit"]["signal"].as_i64(), Some(31), "{d}");
}

// 8 ---------------------------------------------------------------------------------------

both_tiers! {
fn host_file_descriptors_do_not_leak_into_the_cell(tier) {
    require_cells!();
    let dir = tempfile::tempdir().unwrap();
    let secret = dir.path().join("secret-fd-file");
    std::fs::write(&secret, "fd-secret-content\n").unwrap();
    let result_path = dir.path().join("r.json");
    let probe = "import os\nfor fd in sorted(os.listdir('/proc/self/fd'), key=int):\n    try: t = os.readlink(f'/proc/self/fd/{fd}')\n    except OSError as e: t = str(e)\n    print(f'fd {fd} -> {t}')\nfor fd in (3, 7, 8, 9):\n    try: print('read', fd, os.read(fd, 100))\n    except OSError: pass\n";
    // Open fds 7, 8 and 9 without CLOEXEC in the shell that execs airlock.
    let script = format!(
        "exec 7<'{}' 8>>'{}' 9<>/dev/null; exec '{}' run --state-dir '{}' --result '{}' {} -- /usr/bin/python3 -c \"$PROBE\"",
        secret.display(),
        dir.path().join("append").display(),
        common::airlock_bin().display(),
        common::state_dir().display(),
        result_path.display(),
        tier_contract(tier, dir.path()).join(" ")
    );
    let output = Command::new("/bin/sh")
        .arg("-c")
        .arg(&script)
        .env("PROBE", probe)
        .current_dir(dir.path())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let run = CellRun::collect(output, &result_path);
    assert_eq!(run.result["plan"]["isolation"], tier.name(), "{}", run.describe());
    let d = run.describe();
    assert_eq!(run.code(), 0, "{d}");
    let fds: Vec<(u32, String)> = run
        .stdout()
        .lines()
        .filter_map(|l| l.strip_prefix("fd "))
        .filter_map(|l| l.split_once(" -> "))
        .map(|(a, b)| (a.parse().unwrap(), b.to_owned()))
        .collect();
    let numbers: BTreeSet<u32> = fds.iter().map(|(n, _)| *n).collect();
    // 0, 1, 2 and the directory fd listdir itself opens.
    assert!(
        numbers.is_subset(&BTreeSet::from([0, 1, 2, 3])),
        "extra fds in the cell: {fds:?}\n{d}"
    );
    for (n, target) in &fds {
        if *n == 3 {
            assert!(
                target.contains("/proc/"),
                "fd 3 is not listdir's: {target}\n{d}"
            );
        }
        assert!(!target.contains("secret-fd-file"), "{d}");
        assert!(!target.contains("append"), "{d}");
    }
    assert!(!run.stdout().contains("fd-secret-content"), "{d}");
    assert!(!run.stdout().contains("read "), "{d}");
}
}

// 9 ---------------------------------------------------------------------------------------

both_tiers! {
fn host_environment_does_not_leak(tier) {
    require_cells!();
    let secret = format!("s3cr3t-{}", random_token());
    let dir = tempfile::tempdir().unwrap();

    // `env` as the payload itself: its environment is exactly the plan's.
    let result_path = dir.path().join("r1.json");
    let output = airlock_cmd(tier, dir.path(), &result_path, &["/usr/bin/env"])
        .env("AIRLOCK_TEST_SECRET", &secret)
        .env("HTTP_PROXY", "http://host-proxy.test:1")
        .env("LD_PRELOAD", "/tmp/evil.so")
        .output()
        .unwrap();
    let run = CellRun::collect(output, &result_path);
    assert_eq!(run.result["plan"]["isolation"], tier.name(), "{}", run.describe());
    let d = run.describe();
    assert_eq!(run.code(), 0, "{d}");
    assert!(!run.stdout().contains(&secret), "host secret leaked\n{d}");
    let seen: BTreeSet<String> = run.stdout().lines().map(str::to_owned).collect();
    let planned: BTreeSet<String> = run.result["plan"]["env"]
        .as_array()
        .expect("plan.env")
        .iter()
        .map(|e| {
            format!(
                "{}={}",
                e["name"].as_str().unwrap(),
                e["value"].as_str().unwrap()
            )
        })
        .collect();
    assert_eq!(seen, planned, "cell env must be exactly the plan's\n{d}");
    let names: BTreeSet<&str> = seen.iter().filter_map(|l| l.split('=').next()).collect();
    assert_eq!(
        names,
        BTreeSet::from(["HOME", "LANG", "PATH", "TMPDIR"]),
        "{d}"
    );

    // Nor anywhere a process in the cell can read.
    let result_path = dir.path().join("r2.json");
    let output = airlock_cmd(tier,
        dir.path(),
        &result_path,
        &[
            "/bin/sh",
            "-c",
            "for f in /proc/[0-9]*/environ; do tr '\\0' '\\n' < $f; done; cat /proc/1/cmdline; echo; echo end",
        ],
    )
    .env("AIRLOCK_TEST_SECRET", &secret)
    .output()
    .unwrap();
    let run = CellRun::collect(output, &result_path);
    let d = run.describe();
    assert_eq!(run.code(), 0, "{d}");
    assert!(run.stdout().contains("end"), "{d}");
    assert!(!run.stdout().contains(&secret), "host secret leaked\n{d}");
    assert!(!run.stdout().contains("AIRLOCK_TEST_SECRET"), "{d}");
}
}

// 10 --------------------------------------------------------------------------------------

both_tiers! {
fn nothing_survives_between_runs(tier) {
    require_cells!();
    let token = random_token();
    let first = tier.sh(&format!(
        "echo residue > /tmp/residue-{token} && echo residue > /dev/shm/residue-{token} && \
         mkdir -p /tmp/dir-{token} && echo ok"
    ));
    assert_eq!(first.code(), 0, "{}", first.describe());
    assert!(first.stdout().contains("ok"), "{}", first.describe());

    let second = tier.sh(&format!(
        "ls -a /tmp /dev/shm; \
         for p in /tmp/residue-{token} /dev/shm/residue-{token} /tmp/dir-{token}; do \
           if [ -e $p ]; then echo \"residue: FOUND $p\"; fi; done; echo checked"
    ));
    let d = second.describe();
    assert_eq!(second.code(), 0, "{d}");
    assert!(second.stdout().contains("checked"), "{d}");
    assert!(!second.stdout().contains(&token), "residue visible\n{d}");
    // And none on the host either.
    for p in [
        format!("/tmp/residue-{token}"),
        format!("/dev/shm/residue-{token}"),
    ] {
        assert!(!Path::new(&p).exists(), "{p} reached the host");
    }
}
}

// 11 --------------------------------------------------------------------------------------

/// Runs airlock on a pseudo-terminal that is its controlling terminal (stdin), with
/// stdout/stderr going to files, and prints whatever the terminal received afterwards:
/// with echo on, anything the cell injected with TIOCSTI would show up there.
const PTY_DRIVER: &str = r#"
import os, pty, select, sys, time
airlock, result, probe, out, err, state = sys.argv[1:7]
extra = sys.argv[7:]
pid, master = pty.fork()
if pid == 0:
    os.dup2(os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), 1)
    os.dup2(os.open(err, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), 2)
    os.execv(airlock, [airlock, "run", "--state-dir", state, "--result", result, *extra, "--", "/usr/bin/python3", "-c", probe])
_, status = os.waitpid(pid, 0)
received = b""
while select.select([master], [], [], 0.2)[0]:
    try:
        chunk = os.read(master, 4096)
    except OSError:
        break
    if not chunk:
        break
    received += chunk
print("exit", os.waitstatus_to_exitcode(status))
print("received", repr(received))
"#;

both_tiers! {
fn no_controlling_terminal_even_when_airlock_has_one(tier) {
    require_cells!();
    let dir = tempfile::tempdir().unwrap();
    let result_path = dir.path().join("r.json");
    let (out, err) = (dir.path().join("out"), dir.path().join("err"));
    let probe = r#"
import os, fcntl, termios, subprocess
r = subprocess.run(["tty"], capture_output=True)
print("tty-cmd:", r.stdout.decode().strip(), r.returncode)
try:
    os.open("/dev/tty", os.O_RDWR); print("devtty: OPENED")
except OSError as e:
    print("devtty: blocked", e.errno)
try:
    fcntl.ioctl(0, termios.TIOCSTI, b"x"); print("tiocsti-0: ALLOWED")
except OSError as e:
    print("tiocsti-0: blocked", e.errno)
print("isatty:", os.isatty(0), os.isatty(1), os.isatty(2))
"#;
    let driver = Command::new("python3")
        .args(["-c", PTY_DRIVER])
        .arg(common::airlock_bin())
        .arg(&result_path)
        .arg(probe)
        .arg(&out)
        .arg(&err)
        .arg(common::state_dir())
        .args(tier_contract(tier, dir.path()))
        .current_dir(dir.path())
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&driver.stdout).into_owned();
    let output = std::process::Output {
        status: driver.status,
        stdout: std::fs::read(&out).unwrap_or_default(),
        stderr: std::fs::read(&err).unwrap_or_default(),
    };
    let run = CellRun::collect(output, &result_path);
    let d = format!(
        "{}\ndriver: {report}{}",
        run.describe(),
        String::from_utf8_lossy(&driver.stderr)
    );
    assert!(report.contains("exit 0"), "{d}");
    assert_eq!(run.result["plan"]["isolation"], tier.name(), "{}", run.describe());
    assert!(
        run.stdout().contains("tty-cmd: not a tty 1"),
        "`tty` must say not a tty\n{d}"
    );
    assert_blocked(&run, &["devtty", "tiocsti-0"]);
    assert!(
        report.contains("received b''"),
        "the terminal received input from the cell\n{d}"
    );
}
}

// 12 --------------------------------------------------------------------------------------

/// Probes of a read-only input file at /in/data.txt and directory at /indir.
const READONLY_PROBES: &str = r#"
[ -e /in/data.txt ] && cat /in/data.txt; [ -e /indir ] && cat /indir/file.txt
t() { if sh -c "$2" 2>/dev/null; then echo "$1: WROTE"; else echo "$1: blocked"; fi; }
if [ -e /in/data.txt ]; then
t append 'echo more >> /in/data.txt'
t truncate 'echo new > /in/data.txt'
t rm 'rm -f /in/data.txt'
t mv 'mv /in/data.txt /in/moved'
t chmod 'chmod 777 /in/data.txt'
python3 -c '
try:
    open("/in/data.txt", "a").write("x"); print("py-append: WROTE")
except OSError as e: print("py-append: blocked", e.errno)
'
fi
if [ -e /indir ]; then
t touch-dir 'touch /indir/new'
t dir-file 'echo x >> /indir/file.txt'
t dir-rm 'rm -f /indir/file.txt'
t dir-mkdir 'mkdir /indir/sub'
fi
"#;

fn readonly_fixture(dir: &Path) -> PathBuf {
    let input = dir.join("data.txt");
    std::fs::write(&input, "original input\n").unwrap();
    std::fs::create_dir(dir.join("indir")).unwrap();
    std::fs::write(dir.join("indir/file.txt"), "in a dir\n").unwrap();
    std::fs::write(dir.join("indir/run.sh"), "#!/bin/sh\necho ran\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(
        dir.join("indir/run.sh"),
        std::fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    input
}

fn assert_fixture_unchanged(dir: &Path, d: &str) {
    assert_eq!(
        std::fs::read_to_string(dir.join("data.txt")).unwrap(),
        "original input\n",
        "host input changed\n{d}"
    );
    assert_eq!(
        std::fs::read_to_string(dir.join("indir/file.txt")).unwrap(),
        "in a dir\n",
        "host input changed\n{d}"
    );
    let names: BTreeSet<_> = std::fs::read_dir(dir.join("indir"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        names,
        BTreeSet::from(["file.txt".to_owned(), "run.sh".to_owned()]),
        "{d}"
    );
}

both_tiers! {
fn readonly_input_directory_is_readable_but_not_writable(tier) {
    require_cells!();
    let dir = tempfile::tempdir().unwrap();
    readonly_fixture(dir.path());
    let contract = "filesystem:\n  readonly_inputs:\n    - indir/\n";
    let run = tier.run_in(
        dir.path(),
        Some(contract),
        &[],
        &["/bin/sh", "-c", READONLY_PROBES],
    );
    let d = run.describe();
    assert_eq!(run.code(), 0, "{d}");
    assert!(run.stdout().starts_with("in a dir\n"), "{d}");
    assert_blocked(&run, &["touch-dir", "dir-file", "dir-rm", "dir-mkdir"]);
    assert_fixture_unchanged(dir.path(), &d);
}
}

both_tiers! {
fn readonly_input_file_is_readable_but_not_writable(tier) {
    require_cells!();
    let dir = tempfile::tempdir().unwrap();
    let input = readonly_fixture(dir.path());
    let contract = format!(
        "filesystem:\n  readonly_inputs:\n    - source: {}\n      target: /in/data.txt\n    - indir/\n",
        input.display()
    );
    let run = tier.run_in(
        dir.path(),
        Some(&contract),
        &[],
        &["/bin/sh", "-c", READONLY_PROBES],
    );
    let d = run.describe();
    assert_eq!(run.code(), 0, "{d}");
    assert!(
        run.stdout().starts_with("original input\nin a dir\n"),
        "{d}"
    );
    assert_blocked(
        &run,
        &[
            "append",
            "truncate",
            "rm",
            "mv",
            "chmod",
            "py-append",
            "touch-dir",
            "dir-file",
            "dir-rm",
            "dir-mkdir",
        ],
    );
    assert_fixture_unchanged(dir.path(), &d);
}
}

/// Native only: the example contract as written (its tier is the default).
#[test]
fn document_tools_example_converts_the_report() {
    require_cells!();
    let root = repo_root();
    let contract = root.join("examples/contracts/document-tools.yaml");
    let out = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (contract, out_dir) = (contract.to_string_lossy(), out.path().to_string_lossy());
    let extra = ["--contract", &contract, "--output-dir", &out_dir];
    let run = common::run_in(dir.path(), None, &extra, &["/input/convert.sh"]);
    let d = run.describe();
    assert_eq!(run.code(), 0, "{d}");
    assert_eq!(run.status(), "ok", "{d}");
    assert!(run.stdout().contains("wrote /output/report.pdf"), "{d}");
    // The artifact keeps its cell path under the output directory.
    let kept = run.result["artifacts"]["kept"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(kept.len(), 1, "exactly one artifact kept\n{d}");
    assert_eq!(kept[0]["path"], "/output/report.pdf", "{d}");
    let stored = out.path().join("output/report.pdf");
    let pdf = std::fs::read_to_string(&stored)
        .unwrap_or_else(|e| panic!("artifact {}: {e}\n{d}", stored.display()));
    assert!(pdf.starts_with("%PDF-airlock-example"), "{pdf}\n{d}");
    // Only the allowlisted artifact leaves the cell.
    let names: Vec<_> = std::fs::read_dir(out.path().join("output"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert_eq!(names, ["report.pdf"], "{d}");
    let top: Vec<_> = std::fs::read_dir(out.path())
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert_eq!(top, ["output"], "{d}");
}

both_tiers! {
gvisor_gap("gVisor gap: runsc 20221219 shows the writable and input bind mounts without the spec's nosuid,nodev (noexec and ro are shown); what the flags would stop is out of the payload's reach there: mknod of a device is EPERM, and a setuid file it makes is its own (chown to root EPERM)")
fn inputs_are_read_only_nosuid_nodev_and_exec_false_writable_paths_are_noexec(tier) {
    require_cells!();
    // Inputs keep exec (an input may be the script the payload runs, as in the issue's
    // `airlock run --contract document-tools.yaml -- /input/convert.sh`) but are read-only,
    // nosuid and nodev; code the payload writes itself in a path with `exec: false` cannot
    // be executed directly. (Writable paths are executable by default: permitted_exec.rs.)
    let dir = tempfile::tempdir().unwrap();
    let input = readonly_fixture(dir.path());
    std::fs::write(&input, "#!/bin/sh\necho ran-file\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&input, std::fs::Permissions::from_mode(0o755)).unwrap();
    let contract = format!(
        "filesystem:\n  readonly_inputs:\n    - source: {}\n      target: /in/data.txt\n    - indir/\n  writable_paths:\n    - {{ path: tmp/, exec: false }}\n",
        input.display()
    );
    let script = r#"
t() { if sh -c "$2" >/dev/null 2>&1; then echo "$1: EXECUTED"; else echo "$1: blocked"; fi; }
printf '#!/bin/sh\necho written\n' > /tmp/w.sh && chmod +x /tmp/w.sh
t exec-written '/tmp/w.sh'
t write-input 'echo x >> /in/data.txt'
/in/data.txt
grep -E ' /in/data.txt | /indir | /tmp ' /proc/self/mountinfo
"#;
    let run = tier.run_in(dir.path(), Some(&contract), &[], &["/bin/sh", "-c", script]);
    let d = run.describe();
    assert_eq!(run.code(), 0, "{d}");
    assert_blocked(&run, &["exec-written", "write-input"]);
    assert!(
        run.stdout().contains("ran-file"),
        "an input script must be executable\n{d}"
    );
    let mut seen = 0;
    for line in run.stdout().lines().filter(|l| l.contains(" - ")) {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let (mount_point, opts) = (
            fields.get(4).copied().unwrap_or(""),
            fields.get(5).copied().unwrap_or(""),
        );
        let has = |o: &str| opts.split(',').any(|x| x == o);
        assert!(
            has("nosuid") && has("nodev"),
            "mount without nosuid/nodev: {line}\n{d}"
        );
        if mount_point == "/tmp" {
            assert!(
                has("noexec") && has("rw"),
                "writable path must be rw,noexec: {line}\n{d}"
            );
        } else {
            assert!(has("ro"), "input must be read-only: {line}\n{d}");
        }
        seen += 1;
    }
    assert!(
        seen >= 3,
        "expected the two inputs and /tmp in mountinfo\n{d}"
    );
}
}

// 13 --------------------------------------------------------------------------------------

/// Tier-independent: the contract is refused before any tier runs.
#[test]
fn seed_contract_is_refused_for_its_malformed_image_digest() {
    require_cells!();
    let contract = repo_root().join("examples/contracts/seed-004.yaml");
    let dir = tempfile::tempdir().unwrap();
    let contract = contract.to_string_lossy();
    let run = common::run_in(
        dir.path(),
        None,
        &["--contract", &contract],
        &["/bin/echo", "PAYLOAD-RAN"],
    );
    let d = run.describe();
    assert_eq!(run.code(), 125, "{d}");
    // `sha256:pinned-image-digest` is no digest: the reference itself is refused.
    assert_eq!(run.status(), "policy_denied", "{d}");
    assert!(!run.stdout().contains("PAYLOAD-RAN"), "{d}");
    let error = run.result["error"].as_str().unwrap_or("");
    assert!(error.contains("image"), "error must name `image`\n{d}");
    assert!(run.stderr().contains("image"), "{d}");
}

// 14 --------------------------------------------------------------------------------------

/// Tier-independent: `doctor` (its gVisor part: gvisor.rs's `doctor_reports_runsc_...`).
#[test]
fn doctor_reports_every_control() {
    require_cells!();
    let output = Command::new(common::airlock_bin())
        .arg("doctor")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let msg = format!(
        "exit {:?}\nstdout: {stdout}\nstderr: {}",
        output.status.code(),
        String::from_utf8_lossy(&output.stderr)
    );
    // `cleanup.leftover_cells` reports every dead supervisor's cell on the host, whoever
    // ran it (another test binary killing a supervisor on purpose, another airlock): host
    // state, not a control. Every other check must pass.
    let failed: Vec<&str> = stdout
        .lines()
        .filter(|l| {
            !l.starts_with("ok") && l.split_whitespace().nth(1) != Some("cleanup.leftover_cells")
        })
        .collect();
    assert!(failed.is_empty(), "checks failed: {failed:#?}\n{msg}");
    let only_leftovers_failed = output.status.code() == Some(1)
        && stdout
            .lines()
            .any(|l| l.starts_with("FAIL cleanup.leftover_cells"));
    assert!(
        output.status.code() == Some(0) || only_leftovers_failed,
        "{msg}"
    );
    for control in ["landlock", "seccomp", "cgroups"] {
        let lines: Vec<&str> = stdout
            .lines()
            .filter(|l| l.split_whitespace().nth(1) == Some(control))
            .collect();
        assert_eq!(lines.len(), 1, "one line for {control}\n{msg}");
        assert!(lines[0].starts_with("ok"), "{control} not ok\n{msg}");
    }
    for ns in ["user", "mount", "pid", "net", "ipc", "uts", "cgroup"] {
        assert!(
            stdout
                .lines()
                .any(|l| l.starts_with("ok") && l.contains(&format!("namespace.{ns} "))),
            "namespace.{ns}\n{msg}"
        );
    }
}

// Outputs -------------------------------------------------------------------------------

both_tiers! {
fn artifacts_cannot_smuggle_host_files_out(tier) {
    require_cells!();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    std::fs::create_dir(&out).unwrap();
    let contract =
        "filesystem:\n  writable_paths: [tmp/, output/]\n  output_allowlist: [\"output/*\"]\n";
    let script = "ln -s /etc/shadow /output/shadow; ln -s ../etc/passwd /output/passwd; \
                  ln -s /proc/1/root/etc/hostname /output/host; ln -s /tmp /output/dirlink; \
                  mkfifo /output/fifo; echo fine > /output/good; echo secret > /tmp/not-allowlisted";
    let run = tier.run_in(
        dir.path(),
        Some(contract),
        &["--output-dir", out.to_str().unwrap()],
        &["/bin/sh", "-c", script],
    );
    let d = run.describe();
    assert_eq!(run.code(), 0, "{d}");
    assert_eq!(run.status(), "ok", "{d}");
    // Walk everything that reached the host.
    let mut files = Vec::new();
    let mut stack = vec![out.clone()];
    while let Some(p) = stack.pop() {
        for e in std::fs::read_dir(&p).unwrap().flatten() {
            let meta = std::fs::symlink_metadata(e.path()).unwrap();
            assert!(
                !meta.file_type().is_symlink(),
                "a symlink left the cell: {}\n{d}",
                e.path().display()
            );
            if meta.is_dir() {
                stack.push(e.path());
            } else {
                assert!(
                    meta.is_file(),
                    "{} is not a regular file\n{d}",
                    e.path().display()
                );
                files.push(e.path());
            }
        }
    }
    let names: BTreeSet<String> = files
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, BTreeSet::from(["good".to_owned()]), "{d}");
    assert_eq!(std::fs::read_to_string(&files[0]).unwrap(), "fine\n", "{d}");
    let rejected = run.result["artifacts"]["rejected"].to_string();
    // A FIFO made on gVisor is the Sentry's own (its gofer makes none on the host
    // tmpfs): there is nothing to reject, and that nothing but `good` is kept is asserted
    // above.
    let smuggled: &[&str] = match tier {
        Tier::Native => &["shadow", "passwd", "host", "dirlink", "fifo"],
        Tier::Gvisor => &["shadow", "passwd", "host", "dirlink"],
    };
    for name in smuggled {
        assert!(
            rejected.contains(&format!("/output/{name}")),
            "{name} must be listed as rejected\n{d}"
        );
    }
}
}

// Egress through the proxies ------------------------------------------------------------

/// Native only: the gVisor tier's allowlist route has its own cases in gvisor.rs
/// (`nothing_else_is_reachable_and_killing_the_forwarder_opens_no_route`).
#[test]
fn allowlisted_egress_cannot_reach_host_loopback_or_metadata() {
    require_cells!();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    // Even a trusted allowlist entry that names the host's loopback must not open it: the
    // proxy's address policy refuses private and loopback addresses after resolution.
    let contract = format!(
        "network:\n  mode: allowlist\n  allowed_domains: [api.test, \"localhost:{port}\"]\n"
    );
    let script = format!(
        r#"
import socket, struct
def http_connect(name, target):
    try:
        s = socket.create_connection(("127.0.0.1", 3128), timeout=5)
        s.sendall(f"CONNECT {{target}} HTTP/1.1\r\nHost: {{target}}\r\n\r\n".encode())
        line = s.recv(200).split(b"\r\n")[0].decode()
        print(f"{{name}}: " + ("OPENED " if " 200" in line else "blocked ") + line)
    except Exception as e:
        print(f"{{name}}: blocked {{e}}")
def http_get(name, url):
    try:
        s = socket.create_connection(("127.0.0.1", 3128), timeout=5)
        s.sendall(f"GET {{url}} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        line = s.recv(200).split(b"\r\n")[0].decode()
        print(f"{{name}}: " + ("blocked " if (" 403" in line or " 502" in line) else "OPENED ") + line)
    except Exception as e:
        print(f"{{name}}: blocked {{e}}")
def socks(name, host, port):
    try:
        s = socket.create_connection(("127.0.0.1", 1080), timeout=5)
        s.sendall(b"\x05\x01\x00"); s.recv(2)
        h = host.encode()
        s.sendall(b"\x05\x01\x00\x03" + bytes([len(h)]) + h + struct.pack(">H", port))
        rep = s.recv(10)
        print(f"{{name}}: " + ("OPENED" if len(rep) > 1 and rep[1] == 0 else f"blocked rep={{rep[1] if len(rep) > 1 else None}}"))
    except Exception as e:
        print(f"{{name}}: blocked {{e}}")
def direct(name, host, port):
    try:
        socket.create_connection((host, port), timeout=3); print(f"{{name}}: OPENED")
    except Exception as e:
        print(f"{{name}}: blocked {{e}}")
http_connect("connect-localhost", "localhost:{port}")
http_connect("connect-loopback-ip", "127.0.0.1:{port}")
http_connect("connect-not-allowlisted", "evil.test:443")
http_get("get-localhost", "http://localhost:{port}/")
socks("socks-localhost", "localhost", {port})
socks("socks-loopback-ip", "127.0.0.1", {port})
direct("direct-host-port", "127.0.0.1", {port})
direct("direct-public", "1.1.1.1", 443)
http_connect("connect-metadata", "169.254.169.254:80")
print("done: yes")
"#
    );
    // The operator resolves both names to loopback and exempts nothing: the refusal below
    // is the address policy's, not a failed lookup (an allowlist the config cannot
    // resolve is refused before the cell starts).
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("airlock.toml");
    std::fs::write(
        &config,
        "[egress]\nresolve = { \"api.test\" = \"127.0.0.1\", \"localhost\" = \"127.0.0.1\" }\n",
    )
    .unwrap();
    let config = config.display().to_string();
    let run = common::run_in(
        dir.path(),
        Some(&contract),
        &["--config", &config],
        &["/usr/bin/python3", "-c", &script],
    );
    let d = run.describe();
    assert!(run.stdout().contains("done: yes"), "{d}");
    assert!(
        run.result["egress"]
            .to_string()
            .contains("egress.private_address"),
        "the address policy refused loopback\n{d}"
    );
    assert_blocked(
        &run,
        &[
            "connect-localhost",
            "connect-loopback-ip",
            "connect-not-allowlisted",
            "get-localhost",
            "socks-localhost",
            "socks-loopback-ip",
            "direct-host-port",
            "direct-public",
            "connect-metadata",
        ],
    );
    // A metadata-endpoint attempt is behaviour aimed at the boundary (docs/architecture.md, "Result classes").
    assert_eq!(run.status(), "suspected_escape", "{d}");
    let deadline = Instant::now() + Duration::from_millis(300);
    loop {
        match listener.accept() {
            Ok((_, peer)) => panic!("the cell reached the host listener from {peer}\n{d}"),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => panic!("accept: {e}"),
        }
        if Instant::now() > deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

// Kernel controls named in the contract or applied beneath the namespaces -----------------

/// Python helpers the probes below share: `sc` makes a raw syscall, `call` a Python call;
/// each prints `name: blocked ...` or `name: ALLOWED ...`.
const PROBE_HELPERS: &str = r#"
import ctypes, os, socket
libc = ctypes.CDLL(None, use_errno=True)
def sc(name, nr, *args):
    r = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args])
    e = ctypes.get_errno()
    print(f"{name}: " + (f"blocked errno={e}" if r == -1 else f"ALLOWED ret={r}"))
def call(name, fn):
    try:
        print(f"{name}: ALLOWED {fn()}")
    except OSError as e:
        print(f"{name}: blocked errno={e.errno}")
"#;

both_tiers! {
/// On gVisor the profile is the spec's `linux.seccomp`, which the Sentry applies
/// (crates/oci/src/seccomp.rs); natively it is the cell's BPF program. The same denial,
/// with the same errno (`EPERM`; this runsc answers every denial with `EPERM`, whatever a
/// profile's `errnoRet`: docs/threat-model.md, "Tiers"), on both.
fn a_custom_seccomp_profile_applies_but_cannot_reopen_what_the_hardening_denies(tier) {
    require_cells!();
    let dir = tempfile::tempdir().unwrap();
    // Allows everything, names the escape primitives explicitly, and denies mkdir.
    std::fs::write(
        dir.path().join("profile.json"),
        r#"{"defaultAction": "SCMP_ACT_ALLOW", "syscalls": [
            {"names": ["unshare", "setns", "mount", "keyctl", "ptrace", "bpf", "io_uring_setup", "clone3"], "action": "SCMP_ACT_ALLOW"},
            {"names": ["mkdir", "mkdirat"], "action": "SCMP_ACT_ERRNO"}
        ]}"#,
    )
    .unwrap();
    let probe = format!(
        "{PROBE_HELPERS}
call('mkdir-denied-by-profile', lambda: os.mkdir('/tmp/d'))
call('write-allowed', lambda: open('/tmp/f', 'w').write('x'))
sc('unshare-user', 272, 0x10000000)
sc('mount', 165, 0, 0, 0, 0, 0)
sc('keyctl', 250, 0, 0, 0, 0, 0)
sc('ptrace-traceme', 101, 0, 0, 0, 0)
sc('bpf', 321, 0, 0, 0)
sc('io-uring-setup', 425, 1, 0)
sc('clone-newuser', 56, 0x10000000 | 17, 0, 0, 0, 0)
"
    );
    let run = tier.run_in(
        dir.path(),
        Some("seccomp_profile: profile.json\n"),
        &[],
        &["/usr/bin/python3", "-c", &probe],
    );
    let d = run.describe();
    assert_eq!(run.code(), 0, "{d}");
    assert!(
        run.stdout().contains("write-allowed: ALLOWED"),
        "the profile must not break ordinary calls\n{d}"
    );
    assert!(
        run.stdout().contains("mkdir-denied-by-profile: blocked errno=1\n"),
        "the profile's denial, with its errno (EPERM)\n{d}"
    );
    assert_blocked(
        &run,
        &[
            "mkdir-denied-by-profile",
            "unshare-user",
            "mount",
            "keyctl",
            "ptrace-traceme",
            "bpf",
            "io-uring-setup",
            "clone-newuser",
        ],
    );

    // A profile that is not valid Docker seccomp JSON refuses the run: nothing weaker runs.
    std::fs::write(dir.path().join("broken.json"), "{ not json").unwrap();
    let run = tier.run_in(
        dir.path(),
        Some("seccomp_profile: broken.json\n"),
        &[],
        &["/bin/echo", "PAYLOAD-RAN"],
    );
    let d = run.describe();
    assert_eq!(run.code(), 125, "{d}");
    assert_eq!(run.status(), "sandbox_unavailable", "{d}");
    assert!(!run.stdout().contains("PAYLOAD-RAN"), "{d}");
}
}

both_tiers! {
fn the_cells_own_loopback_is_reachable_but_the_hosts_is_not(tier) {
    require_cells!();
    // The cell's netns has only `lo`: a server the payload starts is the payload's own and
    // reachable (Landlock does not filter TCP, docs/threat-model.md), while the host's
    // loopback is another namespace. The cell listens on the very port the host listener
    // holds: a connect that reached the host would be seen below.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let probe = format!(
        "{PROBE_HELPERS}
server = socket.socket(); server.bind(('127.0.0.1', {port})); server.listen(1)
print('listening: yes')
client = socket.create_connection(('127.0.0.1', {port}), timeout=2)
peer, _ = server.accept(); peer.sendall(b'own-server')
print('own-loopback:', client.recv(20).decode())
server.close(); peer.close(); client.close()
call('connect-host-port-after-own-server-closed', lambda: socket.create_connection(('127.0.0.1', {port}), timeout=2))
"
    );
    let run = py(tier, &probe);
    let d = run.describe();
    assert_eq!(run.code(), 0, "{d}");
    assert!(run.stdout().contains("listening: yes"), "{d}");
    assert!(
        run.stdout().contains("own-loopback: own-server"),
        "the payload reaches its own server\n{d}"
    );
    assert_blocked(&run, &["connect-host-port-after-own-server-closed"]);
    assert!(
        run.stdout().contains("errno=111"),
        "nothing listens on that port in the cell: ECONNREFUSED\n{d}"
    );
    let deadline = Instant::now() + Duration::from_millis(300);
    loop {
        match listener.accept() {
            Ok((_, peer)) => panic!("the cell reached the host listener from {peer}\n{d}"),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => panic!("accept: {e}"),
        }
        if Instant::now() > deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
}

both_tiers! {
fn host_abstract_unix_sockets_are_out_of_reach(tier) {
    require_cells!();
    let name = format!("airlock-test-{}", random_token());
    let probe = format!(
        "{PROBE_HELPERS}
def attempt():
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(2)
    s.connect('\\0{name}')
    return 'connected'
call('abstract-connect', attempt)
"
    );
    // The host listens on an abstract socket (python, since std has no abstract-name API
    // on stable) until the cell has tried.
    let mut host = Command::new("python3")
        .args([
            "-c",
            &format!(
                "import socket, sys, select\ns = socket.socket(socket.AF_UNIX); s.bind('\\0{name}'); s.listen(1)\nprint('ready', flush=True)\nr, _, _ = select.select([s], [], [], 15)\nprint('accepted' if r else 'nothing', flush=True)"
            ),
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut host_out = std::io::BufReader::new(host.stdout.take().unwrap());
    let mut line = String::new();
    std::io::BufRead::read_line(&mut host_out, &mut line).unwrap();
    assert_eq!(line.trim(), "ready");
    let run = py(tier, &probe);
    let _ = host.kill();
    let _ = host.wait();
    let d = run.describe();
    assert_eq!(run.code(), 0, "{d}");
    assert_blocked(&run, &["abstract-connect"]);
}
}

// 15 --------------------------------------------------------------------------------------

/// Native only: Docker's masks and read-only /proc paths are mounts of the cell's pid 1.
/// gVisor's /proc has none of these files and this runsc does not mount the spec's
/// `readonlyPaths`: the next test says what it does instead.
#[test]
fn proc_masks_and_read_only_paths_of_docker_apply() {
    let tier = Tier::Native;
    require_cells!();
    // Docker's masked /proc files read empty (and are mount points, so no other path
    // leads to their content); its read-only /proc paths are read-only mounts.
    let probe = r#"
import os
mounts = {}
for line in open("/proc/self/mountinfo"):
    fields = line.split()
    mounts[fields[4]] = fields[5].split(",")
for name in ["interrupts", "kcore", "keys", "latency_stats", "sched_debug", "timer_list", "timer_stats"]:
    path = "/proc/" + name
    if not os.path.exists(path):
        print(f"{name}: absent")
        continue
    with open(path, "rb") as f:
        data = f.read(4096)
    masked = path in mounts
    print(f"{name}: " + ("masked" if masked and data == b"" else f"EXPOSED masked={masked} bytes={len(data)}"))
for name in ["acpi", "asound", "scsi"]:
    path = "/proc/" + name
    if os.path.isdir(path):
        print(f"{name}: " + ("masked" if os.listdir(path) == [] and path in mounts else "EXPOSED " + str(os.listdir(path)[:3])))
for name in ["bus", "fs", "irq", "sys", "sysrq-trigger"]:
    path = "/proc/" + name
    if os.path.exists(path):
        print(f"{name}: " + ("read-only" if "ro" in mounts.get(path, []) else "WRITABLE " + str(mounts.get(path))))
"#;
    let run = py(tier, probe);
    let d = run.describe();
    assert_eq!(run.code(), 0, "{d}");
    let out = run.stdout();
    assert!(!out.contains("EXPOSED") && !out.contains("WRITABLE"), "{d}");
    // Every path this kernel has must have been checked (so the test cannot pass by
    // finding nothing), and /proc/interrupts and /proc/sys exist on every kernel.
    let expected = [
        ("interrupts", "masked"),
        ("kcore", "masked"),
        ("keys", "masked"),
        ("timer_list", "masked"),
        ("sched_debug", "masked"),
        ("acpi", "masked"),
        ("bus", "read-only"),
        ("sys", "read-only"),
        ("sysrq-trigger", "read-only"),
    ];
    for (name, state) in expected {
        if Path::new("/proc").join(name).exists() {
            let line = format!("{name}: {state}");
            assert!(out.lines().any(|l| l == line), "missing {line:?}: {d}");
        }
    }
    assert!(out.lines().any(|l| l == "interrupts: masked"), "{d}");
    assert!(out.lines().any(|l| l == "sys: read-only"), "{d}");
    // On the host the same file has content: the mask is what hides it.
    assert!(!std::fs::read_to_string("/proc/interrupts")
        .unwrap()
        .is_empty());
}

/// gVisor only (the test above is the native cell's): this runsc (20221219) does not
/// apply the spec's `linux.readonlyPaths` (measured: with `/proc/sys` in it, no mount
/// appears and mountinfo lists `/proc` alone), so airlock does not set them. What it
/// has instead: none of Docker's masked or read-only /proc files exist in the Sentry's
/// /proc but `/proc/sys`, which is the Sentry's own (not the host's) and refuses the
/// payload's writes itself.
#[test]
fn on_gvisor_proc_has_no_host_file_and_proc_sys_refuses_writes() {
    require_cells!();
    let probe = r#"
import os
for name in ["interrupts", "kcore", "keys", "latency_stats", "sched_debug", "timer_list",
             "timer_stats", "acpi", "asound", "scsi", "bus", "fs", "irq", "sysrq-trigger"]:
    print(f"{name}: " + ("PRESENT" if os.path.exists("/proc/" + name) else "absent"))
for path in ["kernel/hostname", "kernel/domainname", "vm/overcommit_memory", "net/ipv4/ip_forward"]:
    try:
        with open("/proc/sys/" + path, "w") as f:
            f.write("1")
        print(f"{path}: WRITTEN")
    except OSError as e:
        print(f"{path}: refused errno={e.errno}")
print("hostname: " + open("/proc/sys/kernel/hostname").read().strip())
"#;
    let run = py(Tier::Gvisor, probe);
    let d = run.describe();
    assert_eq!(run.code(), 0, "{d}");
    let out = run.stdout();
    assert!(!out.contains("PRESENT") && !out.contains("WRITTEN"), "{d}");
    assert_eq!(out.matches(": absent").count(), 14, "{d}");
    assert_eq!(
        out.matches(&format!(": refused errno={}", libc::EACCES))
            .count(),
        4,
        "{d}"
    );
    // The Sentry's /proc/sys (the cell's own hostname), not the host's.
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    assert_ne!(host.trim(), "airlock");
    assert!(out.lines().any(|l| l == "hostname: airlock"), "{d}");
}

// 16 --------------------------------------------------------------------------------------

/// Deletes a host SysV shared memory segment when dropped.
struct HostShm(i64);

impl Drop for HostShm {
    fn drop(&mut self) {
        let _ = Command::new("python3")
            .args([
                "-c",
                &format!(
                    "import ctypes; ctypes.CDLL(None).shmctl({}, 0, None)",
                    self.0
                ),
            ])
            .status();
    }
}

/// A SysV shared memory segment on the host under a key only test `test` of this process
/// knows:
/// its key, and its deletion when dropped.
fn host_shm_segment(test: i64) -> (i64, HostShm) {
    // One key per test of this process: the tests run at the same time.
    let key: i64 = 0x4100_0000 | (i64::from(std::process::id() & 0xffff) << 4) | test;
    let made = Command::new("python3")
        .args([
            "-c",
            &format!("import ctypes; print(ctypes.CDLL(None).shmget({key}, 4096, 0o1600))"),
        ])
        .output()
        .unwrap();
    let shmid: i64 = String::from_utf8_lossy(&made.stdout)
        .trim()
        .parse()
        .unwrap();
    assert!(shmid >= 0, "host shmget failed");
    (key, HostShm(shmid))
}

/// Python that prints `host-shm: hidden errno=2` when the host segment `key` is neither
/// listed nor reachable by its key.
fn host_shm_probe(key: i64) -> String {
    format!(
        r#"
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
# ipc namespace: the host's segment is neither listed nor reachable by key
try:
    rows = open("/proc/sysvipc/shm").readlines()[1:]
except FileNotFoundError:
    rows = []  # gVisor has no /proc/sysvipc: the lookup by key below is the check there
listed = any(line.split()[0] == "{key}" for line in rows)
r = libc.shmget({key}, 0, 0); e = ctypes.get_errno()
print("host-shm: " + ("REACHED" if listed or r >= 0 else f"hidden errno={{e}}"))
"#
    )
}

/// The host segment `key` was hidden from the payload (`out`) and is there for the host,
/// so the check could have failed.
fn assert_host_shm_hidden(out: &str, key: i64, d: &str) {
    assert!(
        out.lines()
            .any(|l| l.starts_with("host-shm: hidden errno=2")),
        "{d}"
    );
    let seen = std::fs::read_to_string("/proc/sysvipc/shm").unwrap();
    assert!(
        seen.lines()
            .skip(1)
            .any(|l| l.split_whitespace().next() == Some(&key.to_string())),
        "the host segment is missing on the host"
    );
}

/// Native only: cgroup namespace roots and locked securebits are the native cell's. The
/// next test says what gVisor has instead.
#[test]
fn host_cgroups_ipc_and_securebits_stay_out_of_reach() {
    let tier = Tier::Native;
    require_cells!();
    let (key, _shm) = host_shm_segment(1);
    let probe = format!(
        r#"{shm}
# cgroup namespace: the cell's cgroups are its roots, the host's paths are not shown
paths = [line.rstrip("\n").split(":", 2)[2] for line in open("/proc/self/cgroup")]
print("cgroups: " + ("root" if paths and all(p == "/" for p in paths) else "LEAKED " + repr(paths)))
# securebits: noroot, no_setuid_fixup, keep_caps locked, no_cap_ambient_raise, all locked
bits = libc.prctl(27, 0, 0, 0, 0)
print("securebits: " + ("locked" if bits == 0xef else f"WEAK {{bits:#x}}"))
"#,
        shm = host_shm_probe(key)
    );
    let run = py(tier, &probe);
    let d = run.describe();
    assert_eq!(run.code(), 0, "{d}");
    let out = run.stdout();
    assert!(out.lines().any(|l| l == "cgroups: root"), "{d}");
    assert!(out.lines().any(|l| l == "securebits: locked"), "{d}");
    assert_host_shm_hidden(&out, key, &d);
}

/// gVisor only (the test above is the native cell's): gVisor's kernel has no securebits
/// (`PR_GET_SECUREBITS` is `EINVAL`) and its /proc/self/cgroup lists no cgroup. What holds
/// instead: the host's shm key is out of reach, no cgroup path of the host is shown, and
/// the payload has no capability in any set and cannot become root, so there is nothing
/// securebits would lock.
#[test]
fn on_gvisor_host_ipc_and_cgroups_stay_out_of_reach_and_no_capability_exists() {
    require_cells!();
    let (key, _shm) = host_shm_segment(2);
    let probe = format!(
        r#"{shm}
import os
print("cgroup-lines: " + repr(open("/proc/self/cgroup").read()))
r = libc.prctl(27, 0, 0, 0, 0); e = ctypes.get_errno()
print("securebits: " + (f"none errno={{e}}" if r == -1 else f"bits={{r:#x}}"))
caps = [l.split()[1] for l in open("/proc/self/status") if l.startswith(("CapPrm", "CapEff", "CapBnd", "CapInh"))]
print("caps: " + ("none" if len(caps) == 4 and all(int(c, 16) == 0 for c in caps) else "HELD " + repr(caps)))
try:
    os.setuid(0)
    print("setuid-0: BECAME ROOT")
except OSError as err:
    print(f"setuid-0: refused errno={{err.errno}}")
"#,
        shm = host_shm_probe(key)
    );
    let run = py(Tier::Gvisor, &probe);
    let d = run.describe();
    assert_eq!(run.code(), 0, "{d}");
    let out = run.stdout();
    assert!(out.lines().any(|l| l == "cgroup-lines: ''"), "{d}");
    assert!(
        out.lines()
            .any(|l| l == format!("securebits: none errno={}", libc::EINVAL)),
        "{d}"
    );
    assert!(out.lines().any(|l| l == "caps: none"), "{d}");
    assert!(
        out.lines()
            .any(|l| l == format!("setuid-0: refused errno={}", libc::EPERM)),
        "{d}"
    );
    assert_host_shm_hidden(&out, key, &d);
}
