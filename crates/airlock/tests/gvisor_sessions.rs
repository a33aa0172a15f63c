//! Sessions on the gVisor tier through `airlock serve`'s HTTP API (a contract with
//! `isolation: gvisor`; crates/cell/src/gvisor/session.rs): one sandbox started once, each
//! command one `runsc exec` confined like the first payload, writable paths that persist
//! between commands, deadlines, kills, the idle timeout and the close enforced from
//! outside, and nothing of the sandbox left afterwards. An attack that exits 0 is a
//! breach.
//!
//! Needs Debian's `runsc` and root. The tests run one at a time: a sandbox costs a few
//! hundred milliseconds of two cores.

mod common;

use common::host::{self, Supervisor};
use common::route_probe::RouteProbe;
use common::served::Served;
use common::upstream::Upstream;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

const KEY: &str = "gvisor-sessions-key";

/// `airlock serve` with one gVisor contract, `gv` (the default contract on gVisor).
fn serve(idle_timeout_s: u64) -> Served {
    serve_contract(idle_timeout_s, "isolation: gvisor\n")
}

/// `airlock serve` with `contract` (YAML) as `gv`.
fn serve_contract(idle_timeout_s: u64, contract: &str) -> Served {
    serve_with(idle_timeout_s, contract, "", &[])
}

/// [`serve_contract`] with `files` (name, text) beside the contract, for it to name.
fn serve_contract_with(idle_timeout_s: u64, contract: &str, files: &[(&str, &str)]) -> Served {
    serve_with(idle_timeout_s, contract, "", files)
}

/// `airlock serve` with `contract` (YAML) as `gv`, `extra` (TOML) in its config and
/// `files` (name, text) beside the contract.
fn serve_with(idle_timeout_s: u64, contract: &str, extra: &str, files: &[(&str, &str)]) -> Served {
    let config = format!(
        r#"[server]
listen = ["unix:SOCK", "tcp:127.0.0.1:PORT"]
session_idle_timeout_s = {idle_timeout_s}
max_session_idle_timeout_s = {idle_timeout_s}
[server.contracts]
gv = "gv.yaml"
[server.tenants.alice]
api_key_sha256 = ["{key}"]
max_cells = 8
runs_per_minute = 1000
{extra}"#,
        key = common::sha256_hex(KEY),
    );
    Served::start(&config, |dir| {
        std::fs::write(dir.join("gv.yaml"), contract).unwrap();
        for (name, text) in files {
            std::fs::write(dir.join(name), text).unwrap();
        }
    })
}

/// Opens a session of the `gv` contract: its id.
fn open(served: &Served) -> String {
    let (code, body) = served.call(
        KEY,
        "POST",
        "/v1/sessions",
        Some(&json!({"contract": "gv"})),
    );
    assert_eq!(code, 201, "{body}\n{}", served.log());
    body["session_id"].as_str().unwrap().to_string()
}

/// Runs `argv` in session `id` (with `extra` fields in the request): its frames.
fn exec(served: &Served, id: &str, argv: &[&str], extra: Value) -> Vec<Value> {
    let mut body = json!({ "argv": argv });
    if let Value::Object(fields) = extra {
        body.as_object_mut().unwrap().extend(fields);
    }
    let (code, frames) = served.call(KEY, "POST", &format!("/v1/sessions/{id}/exec"), Some(&body));
    // 202: a background command, answered at once.
    assert!(
        code == 200 || code == 202,
        "{code} {frames}\n{}",
        served.log()
    );
    frames.as_array().cloned().unwrap_or_default()
}

fn stream(frames: &[Value], kind: &str) -> String {
    frames
        .iter()
        .filter(|f| f["type"] == kind)
        .map(|f| f["data"].as_str().unwrap_or_default())
        .collect()
}

/// The final record of a command's frames.
fn record(frames: &[Value]) -> Value {
    frames
        .iter()
        .find(|f| f["type"] == "result")
        .map(|f| f["record"].clone())
        .unwrap_or_else(|| panic!("no result frame: {frames:?}"))
}

/// The host directory of the service's one gVisor session: its supervisor is a child of
/// the service's cell factory (a child of the service).
fn cell_dir(served: &Served) -> PathBuf {
    let service = served.pid().unwrap();
    let parent = |pid: u32| -> Option<u32> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        let (_, after) = stat.rsplit_once(')')?;
        after.split_whitespace().nth(1)?.parse().ok()
    };
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/run/airlock-gvisor").unwrap().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = name.split('-').next().and_then(|p| p.parse().ok()) else {
            continue;
        };
        if parent(pid).and_then(parent) == Some(service) {
            found.push(entry.path());
        }
    }
    assert_eq!(found.len(), 1, "the session's cell directory: {found:?}");
    found.pop().unwrap()
}

fn chown_host_dev_null_to_root() {
    std::os::unix::fs::chown("/dev/null", Some(0), Some(0)).unwrap();
}

/// The host's /dev/null is still root's.
fn assert_host_dev_null_is_roots() {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata("/dev/null").unwrap();
    assert_eq!(
        (meta.uid(), meta.gid()),
        (0, 0),
        "the host's /dev/null was chowned"
    );
}

/// Nothing of the sandbox whose directory was `dir` is left: no directory, no mount, no
/// runsc process, no cgroup.
fn assert_left_nothing(dir: &Path) {
    assert!(!dir.exists(), "{} is left", dir.display());
    let needle = dir.display().to_string();
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let left: Vec<&str> = mounts.lines().filter(|l| l.contains(&needle)).collect();
    assert!(left.is_empty(), "mounts left: {left:?}");
    let procs = host::processes_with(&needle);
    assert!(procs.is_empty(), "runsc processes left: {procs:?}");
    let name = dir.file_name().unwrap().to_string_lossy().into_owned();
    let mut parts = name.split('-');
    let supervisor = Supervisor {
        pid: parts.next().unwrap().parse().unwrap(),
        start_time: parts.next().unwrap().parse().unwrap(),
    };
    let cgroups = host::cgroups_of(&supervisor);
    assert!(cgroups.is_empty(), "cgroups left: {cgroups:?}");
}

/// The supervisor named by cell directory `dir` exits (it is gone or a zombie) soon.
fn assert_supervisor_exits(dir: &Path) {
    let name = dir.file_name().unwrap().to_string_lossy().into_owned();
    let pid = name.split('-').next().unwrap();
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let state = stat
            .rsplit_once(')')
            .and_then(|(_, s)| s.split_whitespace().next());
        if matches!(state, None | Some("Z")) {
            return;
        }
        assert!(
            Instant::now() < until,
            "supervisor {pid} still runs: {stat}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Waits until `dir` is gone (the session's completion sequence ran).
fn wait_gone(dir: &Path, within: Duration) {
    let until = Instant::now() + within;
    while dir.exists() && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn close(served: &Served, id: &str) -> Value {
    let (code, body) = served.call(KEY, "DELETE", &format!("/v1/sessions/{id}"), None);
    assert_eq!(code, 200, "{body}\n{}", served.log());
    body
}

/// The record of run `id` in the service's store.
fn stored_run(served: &Served, id: &str) -> Value {
    let shown = served.cli(&["runs", "show", id, "--json"]);
    assert!(shown.status.success(), "{shown:?}");
    serde_json::from_slice(&shown.stdout).unwrap()
}

#[test]
fn three_commands_share_the_writable_paths_and_close_leaves_nothing() {
    require_cells!();
    let _serial = serial();
    let served = serve(300);
    let id = open(&served);
    let dir = cell_dir(&served);
    let first = exec(
        &served,
        &id,
        &["sh", "-c", "echo from-the-first > /tmp/shared; uname -r"],
        json!({}),
    );
    let host_release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    assert_eq!(record(&first)["status"], "ok", "{first:?}");
    assert!(
        !stream(&first, "stdout").contains(host_release.trim()),
        "the command saw the host's kernel: {first:?}"
    );
    let second = exec(&served, &id, &["cat", "/tmp/shared"], json!({}));
    assert_eq!(stream(&second, "stdout"), "from-the-first\n", "{second:?}");
    let third = exec(
        &served,
        &id,
        &["sh", "-c", "echo \"$EXTRA\"; id -u; pwd"],
        json!({"env": {"EXTRA": "added"}}),
    );
    assert_eq!(
        stream(&third, "stdout"),
        "added\n10001\n/tmp\n",
        "{third:?}"
    );
    let piped = exec(&served, &id, &["cat"], json!({"stdin": "piped in"}));
    assert_eq!(stream(&piped, "stdout"), "piped in", "{piped:?}");
    // An ended command's process spec and pid file are gone (a long session would fill
    // the cell directory's tmpfs otherwise).
    let left: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("exec-"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
    let mut run_ids: Vec<String> = [&first, &second, &third]
        .iter()
        .map(|f| record(f)["run_id"].as_str().unwrap().to_string())
        .collect();
    run_ids.dedup();
    assert_eq!(run_ids.len(), 3, "each command has its own record");
    let closed = close(&served, &id);
    assert_eq!(closed["status"], "ok", "{closed}");
    assert_eq!(closed["cleanup"]["ok"], true, "{closed}");
    assert_left_nothing(&dir);
    // Each command's record names the session; the session's record is complete; the
    // audit chain verifies.
    for run_id in &run_ids {
        let stored = stored_run(&served, run_id);
        assert_eq!(stored["run"]["session_id"], id.as_str(), "{stored}");
        assert_eq!(stored["run"]["status"], "ok", "{stored}");
    }
    let session = stored_run(&served, &id);
    assert_eq!(session["run"]["status"], "ok", "{session}");
    assert_eq!(session["run"]["plan"]["isolation"], "gvisor", "{session}");
    let verified = served.cli(&["audit", "verify"]);
    assert!(verified.status.success(), "{verified:?}");
}

/// A contract's custom seccomp profile confines a session's commands: runsc does not
/// apply the spec's `linux.seccomp` to an exec'd process, so airlock's launcher installs
/// the plan's program, compiled from the profile. A launcher that installed the default
/// program instead would let `mkdir` through.
#[test]
fn a_custom_seccomp_profile_denies_what_it_denies_in_a_sessions_commands() {
    require_cells!();
    let _serial = serial();
    let profile = r#"{"defaultAction": "SCMP_ACT_ALLOW", "syscalls": [
        {"names": ["unshare"], "action": "SCMP_ACT_ALLOW"},
        {"names": ["mkdir", "mkdirat"], "action": "SCMP_ACT_ERRNO"}
    ]}"#;
    let served = serve_contract_with(
        300,
        "isolation: gvisor\nseccomp_profile: profile.json\n",
        &[("profile.json", profile)],
    );
    let id = open(&served);
    let dir = cell_dir(&served);
    let probe = "import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
try:
    os.mkdir('/tmp/d'); print('mkdir ALLOWED')
except OSError as e:
    print('mkdir blocked errno', e.errno)
r = libc.unshare(0x10000000)
print('unshare', 'ALLOWED' if r == 0 else f'blocked errno {ctypes.get_errno()}')
open('/tmp/f', 'w').write('x'); print('write ALLOWED')
";
    let ran = exec(&served, &id, &["python3", "-c", probe], json!({}));
    assert_eq!(
        stream(&ran, "stdout"),
        "mkdir blocked errno 1\nunshare blocked errno 1\nwrite ALLOWED\n",
        "the profile's denial, the hardening's (the profile cannot allow unshare), and an ordinary call: {ran:?}"
    );
    let closed = close(&served, &id);
    assert_eq!(closed["cleanup"]["ok"], true, "{closed}");
    assert_left_nothing(&dir);
}

/// What only a one-shot gVisor run is served is refused to a session before any sandbox
/// exists: a terminal by the tier (its payload is the sandbox's first process on runsc's
/// console), broker actions by the engine, as on the native tier (a broker socket is per
/// run). Nothing runs, nothing is left.
#[test]
fn a_session_with_a_terminal_or_broker_actions_is_refused_naming_why() {
    require_cells!();
    let _serial = serial();
    for (contract, why) in [
        ("isolation: gvisor\nterminal: true\n", "gvisor.terminal"),
        (
            "isolation: gvisor\nbroker_actions: [notify]\n",
            "broker actions are served to one-shot runs only",
        ),
    ] {
        let served = serve_contract(300, contract);
        let (code, body) = served.call(
            KEY,
            "POST",
            "/v1/sessions",
            Some(&json!({"contract": "gv"})),
        );
        assert_ne!(code, 201, "{why}: {body}");
        assert!(body.to_string().contains(why), "{why}: {code} {body}");
        assert!(
            !Path::new("/run/airlock-gvisor").exists()
                || std::fs::read_dir("/run/airlock-gvisor")
                    .unwrap()
                    .next()
                    .is_none(),
            "{why}: a sandbox directory was made"
        );
    }
}

#[test]
fn a_background_command_is_listed_and_killed_with_its_children_and_the_session_goes_on() {
    require_cells!();
    let _serial = serial();
    // runsc chowns its stdio to the sandbox's user: the holder's, a command's without
    // stdin and the signal helper's must never be the host's /dev/null.
    chown_host_dev_null_to_root();
    let served = serve(300);
    let id = open(&served);
    let dir = cell_dir(&served);
    let started = exec(
        &served,
        &id,
        &["sh", "-c", "sleep 1000 & echo $! > /tmp/child; wait"],
        json!({"background": true}),
    );
    let command = started
        .first()
        .and_then(|f| f["command_id"].as_u64())
        .or_else(|| {
            // A background exec answers with one JSON object, not frames.
            let (_, body) = served.call(KEY, "GET", &format!("/v1/sessions/{id}"), None);
            body["commands"][0]["command_id"].as_u64()
        })
        .unwrap_or_else(|| panic!("no command id: {started:?}"));
    let (_, listed) = served.call(KEY, "GET", &format!("/v1/sessions/{id}"), None);
    assert_eq!(listed["commands"][0]["running"], true, "{listed}");
    // The child's pid is written once the command runs.
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        let child = exec(&served, &id, &["cat", "/tmp/child"], json!({}));
        if !stream(&child, "stdout").trim().is_empty() {
            break;
        }
        assert!(
            Instant::now() < until,
            "the background command did not start"
        );
    }
    let (code, body) = served.call(
        KEY,
        "POST",
        &format!("/v1/sessions/{id}/commands/{command}/signal"),
        Some(&json!({"signal": "KILL"})),
    );
    assert!(code == 200 || code == 202 || code == 204, "{code} {body}");
    let until = Instant::now() + Duration::from_secs(20);
    let ended = loop {
        let (_, view) = served.call(
            KEY,
            "GET",
            &format!("/v1/sessions/{id}/commands/{command}"),
            None,
        );
        if view["running"] == false {
            break view;
        }
        assert!(
            Instant::now() < until,
            "the killed command still runs: {view}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(ended["record"]["exit"]["signal"], 9, "{ended}");
    // Its child was in its process group: gone too (reaped by the holder).
    let check = "c=$(cat /tmp/child); for i in 1 2 3 4 5 6 7 8 9 10; do \
                 test -e /proc/$c || { echo gone; exit 0; }; sleep 0.3; done; echo ALIVE";
    let after = exec(&served, &id, &["sh", "-c", check], json!({}));
    assert_eq!(stream(&after, "stdout"), "gone\n", "{after:?}");
    assert_eq!(record(&after)["status"], "ok");
    close(&served, &id);
    assert_left_nothing(&dir);
    assert_host_dev_null_is_roots();
}

#[test]
fn a_commands_deadline_kills_only_that_command_and_the_session_goes_on() {
    require_cells!();
    let _serial = serial();
    let served = serve(300);
    let id = open(&served);
    let dir = cell_dir(&served);
    let started = Instant::now();
    // It ignores SIGTERM: the grace's SIGKILL ends it.
    let late = exec(
        &served,
        &id,
        &[
            "sh",
            "-c",
            "trap '' TERM; echo before > /tmp/kept; sleep 60",
        ],
        json!({"deadline_ms": 1500}),
    );
    let took = started.elapsed();
    let late = record(&late);
    assert_eq!(late["status"], "capacity_exceeded", "{late}");
    assert_eq!(late["limit_fired"], "wall_time", "{late}");
    assert!(took < Duration::from_secs(20), "{took:?}");
    let next = exec(&served, &id, &["cat", "/tmp/kept"], json!({}));
    assert_eq!(stream(&next, "stdout"), "before\n", "{next:?}");
    assert_eq!(record(&next)["status"], "ok");
    close(&served, &id);
    assert_left_nothing(&dir);
}

#[test]
fn the_idle_timeout_closes_the_session_from_outside_and_leaves_nothing() {
    require_cells!();
    let _serial = serial();
    let served = serve(2);
    let id = open(&served);
    let dir = cell_dir(&served);
    let ran = exec(&served, &id, &["true"], json!({}));
    assert_eq!(record(&ran)["status"], "ok");
    wait_gone(&dir, Duration::from_secs(30));
    assert_left_nothing(&dir);
    let session = stored_run(&served, &id);
    assert_eq!(session["run"]["status"], "ok", "{session}");
    assert_eq!(session["run"]["cleanup_ok"], true, "{session}");
    let notes = session["run"]["result"]["notes"].to_string();
    // The supervisor's own idle timeout, or the service's reaper (the tenant's, the
    // same 2 s): both from outside the sandbox.
    assert!(
        notes.contains("idle_timeout") || notes.contains("closed by the engine"),
        "{}\n{}",
        session["run"]["result"],
        served.log()
    );
    let (code, _) = served.call(
        KEY,
        "POST",
        &format!("/v1/sessions/{id}/exec"),
        Some(&json!({"argv": ["true"]})),
    );
    assert!(code >= 400, "a closed session ran a command");
}

#[test]
fn closing_with_a_command_running_ends_it_with_the_session() {
    require_cells!();
    let _serial = serial();
    let served = serve(300);
    let id = open(&served);
    let dir = cell_dir(&served);
    exec(
        &served,
        &id,
        &["sleep", "1000"],
        json!({"background": true}),
    );
    let closed = close(&served, &id);
    assert_eq!(closed["cleanup"]["ok"], true, "{closed}");
    assert_left_nothing(&dir);
    let (_, view) = served.call(KEY, "GET", &format!("/v1/sessions/{id}/commands/1"), None);
    if view["running"] != Value::Null {
        assert_eq!(view["running"], false, "{view}");
    }
}

/// Every way out, from inside one session's commands: host files, privileges, the
/// seccomp program (which runsc would not apply to an exec'd process: the control shows
/// the call is the Sentry's to serve without it), writes outside the writable paths and
/// the network.
#[test]
fn a_sessions_commands_cannot_cross_the_boundary() {
    require_cells!();
    let _serial = serial();
    chown_host_dev_null_to_root();
    let served = serve(300);
    let id = open(&served);
    let dir = cell_dir(&served);
    let marker_dir = tempfile::tempdir().unwrap();
    let marker = marker_dir.path().join("host-marker");
    std::fs::write(&marker, "MARKER-GVISOR-SESSION").unwrap();

    let files = format!(
        "for p in /etc/shadow /root/.bashrc {m} /proc/1/root{m} /run/airlock/ids /var/lib; do \
           if cat \"$p\" 2>/dev/null || test -e \"$p\"; then echo \"READ $p\"; exit 0; fi; \
         done; exit 1",
        m = marker.display()
    );
    let read = exec(&served, &id, &["sh", "-c", &files], json!({}));
    assert_eq!(record(&read)["exit_code"], 1, "{read:?}");
    assert!(!stream(&read, "stdout").contains("MARKER"));

    let status = exec(
        &served,
        &id,
        &[
            "sh",
            "-c",
            "grep -E '^(Uid|Gid|CapInh|CapPrm|CapEff|CapBnd|CapAmb|NoNewPrivs)' /proc/self/status",
        ],
        json!({}),
    );
    let status = stream(&status, "stdout");
    for line in [
        "CapInh:\t0000000000000000",
        "CapPrm:\t0000000000000000",
        "CapEff:\t0000000000000000",
        "CapBnd:\t0000000000000000",
    ] {
        assert!(status.contains(line), "{line} missing:\n{status}");
    }
    assert!(
        status.contains("Uid:\t10001\t10001\t10001\t10001"),
        "{status}"
    );
    // gVisor's /proc/self/status has no NoNewPrivs line: asked with prctl (39 is
    // PR_GET_NO_NEW_PRIVS); and a setuid-root binary gains nothing.
    let nnp = exec(
        &served,
        &id,
        &[
            "python3",
            "-c",
            "import ctypes; print(ctypes.CDLL(None).prctl(39, 0, 0, 0, 0))",
        ],
        json!({}),
    );
    assert_eq!(stream(&nnp, "stdout"), "1\n", "{nnp:?}");
    let setuid = exec(&served, &id, &["su", "-c", "id -u", "root"], json!({}));
    assert_ne!(record(&setuid)["exit_code"], 0, "{setuid:?}");
    assert!(!stream(&setuid, "stdout").contains('0'), "{setuid:?}");

    // A namespace the plan's seccomp program refuses (EPERM), while gVisor serves it to
    // an unprivileged process: the control runs the same call in the same sandbox as the
    // same user without airlock's launcher, and it succeeds.
    let unshare = exec(
        &served,
        &id,
        &["unshare", "--user", "--map-root-user", "id", "-u"],
        json!({}),
    );
    assert_ne!(record(&unshare)["exit_code"], 0, "{unshare:?}");
    assert!(
        stream(&unshare, "stderr").contains("Operation not permitted"),
        "{unshare:?}"
    );
    let name = dir.file_name().unwrap().to_string_lossy().into_owned();
    let control = Command::new("runsc")
        .arg(format!("--root={}", dir.join("state").display()))
        .args([
            "--network=none",
            "--platform=ptrace",
            "exec",
            "--user",
            "10001:10001",
        ])
        .arg(&name)
        .args(["unshare", "--user", "--map-root-user", "id", "-u"])
        // Not the host's /dev/null (output()'s default stdin): runsc chowns its stdio to
        // the sandbox's user.
        .stdin(std::process::Stdio::piped())
        .output()
        .unwrap();
    assert!(
        control.status.success() && String::from_utf8_lossy(&control.stdout).trim() == "0",
        "control: without the plan's filter the call is served: {control:?}"
    );

    let writes = "for p in /etc/x /usr/x /x /bin/x /proc/x /dev/x /.airlock-sandbox; do \
                    if echo breach > \"$p\" 2>/dev/null; then echo \"WROTE $p\"; exit 0; fi; \
                  done; exit 1";
    let wrote = exec(&served, &id, &["sh", "-c", writes], json!({}));
    assert_eq!(record(&wrote)["exit_code"], 1, "{wrote:?}");
    for host in ["/x", "/etc/x", "/usr/x"] {
        assert!(!Path::new(host).exists(), "{host} appeared on the host");
    }

    let listener = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    listener.set_nonblocking(true).unwrap();
    let script = format!(
        "import socket, sys\n\
         for a in ['127.0.0.1', '10.0.2.2', '8.8.8.8']:\n\
         \x20   try:\n\
         \x20       socket.create_connection((a, {port}), timeout=2).send(b'breach')\n\
         \x20       print('CONNECTED', a); sys.exit(0)\n\
         \x20   except OSError as e:\n\
         \x20       print('refused', a, e)\n\
         sys.exit(1)\n"
    );
    let net = exec(&served, &id, &["python3", "-c", &script], json!({}));
    assert_eq!(record(&net)["exit_code"], 1, "{net:?}");
    assert!(listener.accept().is_err(), "a connection arrived");

    close(&served, &id);
    assert_left_nothing(&dir);
    assert_host_dev_null_is_roots();
}

/// The session file API reaches a gVisor session's writable paths (seen from the host
/// through the gofer's root, where their tmpfs is bound) and nothing else: a client's
/// file is read by a command, a command's file is read back, a client's rewrite is seen
/// by the next command, and a planted symlink or a path outside the writable paths
/// leads nowhere.
#[test]
fn the_session_file_api_reaches_the_writable_paths_only() {
    require_cells!();
    let _serial = serial();
    let served = serve(300);
    let id = open(&served);
    let dir = cell_dir(&served);
    let base = format!("/v1/sessions/{id}");
    let put = |path: &str, body: &str| {
        served.call_text(KEY, "PUT", &format!("{base}/files/{path}"), Some(body))
    };
    let (code, body) = put("tmp/in.txt", "from the client");
    assert_eq!(code, 201, "{body}");
    let ran = exec(
        &served,
        &id,
        &[
            "sh",
            "-c",
            "cat /tmp/in.txt; echo made > /tmp/out.txt; ln -s /etc /tmp/etc-link",
        ],
        json!({}),
    );
    assert_eq!(stream(&ran, "stdout"), "from the client", "{ran:?}");
    let (code, body) = served.call_text(KEY, "GET", &format!("{base}/files/tmp/out.txt"), None);
    assert_eq!((code, body.as_str()), (200, "made\n"));
    let (code, body) = put("tmp/in.txt", "rewritten");
    assert_eq!(code, 201, "{body}");
    let again = exec(&served, &id, &["cat", "/tmp/in.txt"], json!({}));
    assert_eq!(stream(&again, "stdout"), "rewritten", "{again:?}");
    let (code, body) = served.call_text(
        KEY,
        "GET",
        &format!("{base}/files/tmp/etc-link/passwd"),
        None,
    );
    // The link resolves as the cell resolves it, to its own /etc: not a writable path.
    assert_eq!(code, 403, "the link leaves /tmp: {body}");
    assert!(body.contains("path.escapes"), "{body}");
    let (code, body) = served.call_text(KEY, "GET", &format!("{base}/files/etc/passwd"), None);
    assert_eq!(code, 403, "{body}");
    assert!(!body.contains("root:"), "{body}");
    close(&served, &id);
    assert_left_nothing(&dir);
}

/// The example tool box with its converter's contract on gVisor (`isolation: gvisor`
/// added): its tools run in a gVisor session of their own.
fn gvisor_tools() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/tools");
    let copied = Command::new("cp")
        .arg("-r")
        .arg(examples.join("."))
        .arg(dir.path())
        .status()
        .unwrap();
    assert!(copied.success());
    let contract = dir.path().join("converter.yaml");
    let text = std::fs::read_to_string(&contract).unwrap();
    std::fs::write(&contract, format!("isolation: gvisor\n{text}")).unwrap();
    dir
}

/// The session a tool's run belonged to ran on gVisor.
fn assert_ran_on_gvisor(config: &Path, state: &Path, run_id: &str) {
    let show = |id: &str| -> Value {
        let out = Command::new(common::airlock_bin())
            .args(["runs", "--state-dir"])
            .arg(state)
            .args(["show", id, "--json"])
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?} ({})", config.display());
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let run = show(run_id);
    let session = run["run"]["session_id"]
        .as_str()
        .expect("a tool runs in a session");
    let session = show(session);
    assert_eq!(session["run"]["plan"]["isolation"], "gvisor", "{session}");
    assert_eq!(session["run"]["status"], "ok", "{session}");
}

#[test]
fn a_tool_call_runs_on_gvisor() {
    require_cells!();
    let _serial = serial();
    let tools = gvisor_tools();
    let config = tools.path().join("airlock.toml");
    let state = tools.path().join("state");
    let out = Command::new(common::airlock_bin())
        .arg("tool")
        .arg("--config")
        .arg(&config)
        .arg("--state-dir")
        .arg(&state)
        .args(["call", "csv_to_json", "--input", r#"{"csv": "a,b\n1,2\n"}"#])
        .output()
        .unwrap();
    let reply: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", common::output_text(&out)));
    assert_eq!(reply["ok"], true, "{reply}");
    assert_eq!(reply["output"]["rows"][0]["b"], "2", "{reply}");
    assert_ran_on_gvisor(&config, &state, reply["run_id"].as_str().unwrap());
}

#[test]
fn an_mcp_tool_call_over_stdio_runs_on_gvisor() {
    require_cells!();
    let _serial = serial();
    let tools = gvisor_tools();
    let config = tools.path().join("airlock.toml");
    let state = tools.path().join("state");
    let mut mcp = Command::new(common::airlock_bin())
        .arg("mcp")
        .arg("--config")
        .arg(&config)
        .arg("--state-dir")
        .arg(&state)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = mcp.stdin.take().unwrap();
    let requests = [
        r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"gvisor-test","version":"1"}}}"#,
        r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
        r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"csv_to_json","arguments":{"csv":"a,b\n1,2\n"}}}"#,
    ];
    for request in requests {
        use std::io::Write;
        writeln!(stdin, "{request}").unwrap();
    }
    let mut lines = std::io::BufRead::lines(std::io::BufReader::new(mcp.stdout.take().unwrap()));
    let answer = loop {
        let line = lines.next().expect("an answer to the call").unwrap();
        let message: Value = serde_json::from_str(&line).unwrap();
        if message["id"] == 2 {
            break message;
        }
    };
    drop(stdin);
    let _ = mcp.wait();
    let result = &answer["result"];
    assert_ne!(result["isError"], true, "{answer}");
    assert_eq!(result["structuredContent"]["rows"][0]["a"], "1", "{answer}");
    let text: Value = serde_json::from_str(result["content"][0]["text"].as_str().unwrap()).unwrap();
    assert_ran_on_gvisor(&config, &state, text["run_id"].as_str().unwrap());
}

/// A session's supervisor killed with SIGKILL takes its sandbox with it (`runsc run` of
/// the holder and every `runsc exec` have its parent-death signal); what is left on the
/// host (directory, tmpfs, cgroups) is `airlock doctor`'s to reap, and it does.
#[test]
fn a_sessions_sandbox_dies_with_its_killed_supervisor_and_doctor_reaps_the_rest() {
    require_cells!();
    let _serial = serial();
    let served = serve(300);
    let id = open(&served);
    let dir = cell_dir(&served);
    exec(
        &served,
        &id,
        &["sleep", "1000"],
        json!({"background": true}),
    );
    let needle = dir.display().to_string();
    let until = Instant::now() + Duration::from_secs(20);
    while host::processes_with(&needle).len() < 3 {
        assert!(Instant::now() < until, "the command never started");
        std::thread::sleep(Duration::from_millis(50));
    }
    let name = dir.file_name().unwrap().to_string_lossy().into_owned();
    let supervisor: i32 = name.split('-').next().unwrap().parse().unwrap();
    // kill(1) of the pid this test found as the session's supervisor (by its cell).
    let killed = Command::new("kill")
        .args(["-KILL", &supervisor.to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let gone_by = Instant::now() + Duration::from_secs(10);
    while !host::processes_with(&needle).is_empty() {
        assert!(
            Instant::now() < gone_by,
            "the sandbox outlived its supervisor: {:?}",
            host::processes_with(&needle)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // A supervisor not reaped yet (the factory reaps once a second) still counts as
    // alive, and doctor leaves a live supervisor's cell alone.
    while Path::new(&format!("/proc/{supervisor}")).exists() {
        assert!(Instant::now() < gone_by, "the supervisor was never reaped");
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = Command::new(common::airlock_bin())
        .args(["doctor", "--json"])
        .output()
        .unwrap();
    let checks: Value = serde_json::from_slice(&out.stdout).unwrap();
    let reaped = checks
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["control"] == "gvisor.leftovers")
        .unwrap()
        .clone();
    assert_eq!(reaped["ok"], true, "{reaped}");
    assert_left_nothing(&dir);
    // The service recorded the session's end (its supervisor is gone).
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let session = stored_run(&served, &id);
        if session["run"]["status"] != "running" {
            assert_eq!(session["run"]["status"], "runtime_fault", "{session}");
            break;
        }
        assert!(Instant::now() < until, "the session's record stayed open");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The memory ceiling is the whole sandbox's (its kernel included): a command past it
/// is `capacity_exceeded` (`memory`), and the sandbox, killed by the host's OOM killer,
/// ends the session; its completion sequence still leaves nothing.
#[test]
fn a_command_past_the_memory_ceiling_ends_the_session_and_leaves_nothing() {
    require_cells!();
    let _serial = serial();
    let served = serve_contract(300, "isolation: gvisor\nresources:\n  memory_mb: 128\n");
    let id = open(&served);
    let dir = cell_dir(&served);
    let big = exec(
        &served,
        &id,
        &["python3", "-c", "x = bytearray(300 << 20); print(len(x))"],
        json!({}),
    );
    let big = record(&big);
    assert_eq!(big["status"], "capacity_exceeded", "{big}");
    assert_eq!(big["limit_fired"], "memory", "{big}");
    wait_gone(&dir, Duration::from_secs(20));
    assert_left_nothing(&dir);
    let session = stored_run(&served, &id);
    assert_eq!(session["run"]["cleanup_ok"], true, "{session}");
    assert_eq!(session["run"]["status"], "capacity_exceeded", "{session}");
}

/// A warm pool of the gVisor tier: a parked sandbox (its holder started, no command)
/// that a run claims; the run's command is confined exactly as a session's (the same
/// launcher, process spec and seccomp program), the claimed sandbox is destroyed with
/// nothing left, and the pool parks a new one.
#[test]
fn a_warm_gvisor_cell_runs_a_claimed_command_confined_and_is_replaced() {
    require_cells!();
    let _serial = serial();
    let config = format!(
        r#"[server]
listen = ["unix:SOCK", "tcp:127.0.0.1:PORT"]
[server.contracts]
gv = "gv.yaml"
[server.pools]
gv = 1
[server.tenants.alice]
api_key_sha256 = ["{key}"]
max_cells = 8
runs_per_minute = 1000
"#,
        key = common::sha256_hex(KEY),
    );
    let served = Served::start(&config, |dir| {
        std::fs::write(dir.join("gv.yaml"), "isolation: gvisor\n").unwrap();
    });
    let parked = wait_for_cell(&served, None);
    // Parked for a while: the run's wall time is its own, not the cell's.
    std::thread::sleep(Duration::from_secs(2));
    let script = "id -u; uname -r; \
                  unshare --user id -u 2>/dev/null && echo UNSHARED; \
                  echo breach > /etc/x 2>/dev/null && echo WROTE; \
                  grep CapEff /proc/self/status; \
                  echo kept > /tmp/t && cat /tmp/t";
    let (code, record) = served.call(
        KEY,
        "POST",
        "/v1/runs?wait=true",
        Some(&json!({"contract": "gv", "argv": ["sh", "-c", script]})),
    );
    assert_eq!(code, 200, "{record}\n{}", served.log());
    assert_eq!(record["status"], "ok", "{record}");
    let wall_ms = record["timings"]["wall_ms"].as_f64().unwrap();
    assert!(
        wall_ms < 1500.0,
        "{wall_ms} ms: the parked time was counted"
    );
    let stdout = record["output"]["stdout"]["head"].as_str().unwrap();
    let host_release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    assert!(stdout.starts_with("10001\n"), "{stdout}");
    assert!(!stdout.contains(host_release.trim()), "{stdout}");
    assert!(
        !stdout.contains("UNSHARED"),
        "the plan's filter was not applied: {stdout}"
    );
    assert!(!stdout.contains("WROTE"), "{stdout}");
    assert!(stdout.contains("CapEff:\t0000000000000000"), "{stdout}");
    assert!(stdout.ends_with("kept\n"), "{stdout}");
    // The parked sandbox ran it and is gone; the pool parked another.
    wait_gone(&parked, Duration::from_secs(20));
    assert_left_nothing(&parked);
    let next = wait_for_cell(&served, Some(&parked));
    assert_ne!(next, parked);
    let stored = stored_run(&served, record["run_id"].as_str().unwrap());
    assert_eq!(stored["run"]["plan"]["isolation"], "gvisor", "{stored}");
}

/// Waits until the pool `gv` has a parked cell (the service's metrics say so).
fn wait_parked(served: &Served) {
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let metrics = served.curl_unix(&["-s", "http://airlock/metrics"]);
        if String::from_utf8_lossy(&metrics.stdout).contains("airlock_pool_free{pool=\"gv\"} 1") {
            return;
        }
        assert!(Instant::now() < until, "no parked cell: {}", served.log());
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The service's one gVisor cell directory other than `not`, once it exists.
fn wait_for_cell(served: &Served, not: Option<&Path>) -> PathBuf {
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let service = served.pid().unwrap();
        let parent = |pid: u32| -> Option<u32> {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            let (_, after) = stat.rsplit_once(')')?;
            after.split_whitespace().nth(1)?.parse().ok()
        };
        let found = std::fs::read_dir("/run/airlock-gvisor")
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .filter(|p| Some(p.as_path()) != not)
            .find(|p| {
                let name = p.file_name().unwrap().to_string_lossy().into_owned();
                let pid = name.split('-').next().and_then(|p| p.parse().ok());
                pid.and_then(parent).and_then(parent) == Some(service)
                    && p.join("bundle/sandbox.pid").exists()
            });
        if let Some(dir) = found {
            return dir;
        }
        assert!(Instant::now() < until, "no parked cell: {}", served.log());
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The upstream of the allowlist cases: python's http.server on 127.0.0.2 (exempted
/// from the private-address rule), named `api.test` and `evil.test` by the operator's
/// resolver map, serving `hello.txt`.
struct AllowlistEnv {
    _www: tempfile::TempDir,
    upstream: Upstream,
    token: String,
}

const UPSTREAM_IP: &str = "127.0.0.2";
const EGRESS_CONFIG: &str =
    "[egress]\nresolve = { \"api.test\" = \"127.0.0.2\", \"evil.test\" = \"127.0.0.2\" }\n\
                             exempt_cidrs = [\"127.0.0.2/32\"]\n";

impl AllowlistEnv {
    fn start() -> AllowlistEnv {
        let www = tempfile::tempdir().unwrap();
        let token = format!("gvisor-session-egress-{}", std::process::id());
        std::fs::write(www.path().join("hello.txt"), &token).unwrap();
        let upstream = Upstream::start(www.path(), www.path(), UPSTREAM_IP, None);
        AllowlistEnv {
            _www: www,
            upstream,
            token,
        }
    }

    /// The gVisor contract allowing `api.test` on the upstream's port, with `extra`.
    fn contract(&self, extra: &str) -> String {
        format!(
            "isolation: gvisor\nnetwork:\n  mode: allowlist\n  allowed_domains: [\"api.test:{}\"]\n{extra}",
            self.upstream.port
        )
    }

    fn url(&self, host: &str, path: &str) -> String {
        format!("http://{host}:{}/{path}", self.upstream.port)
    }
}

/// The records of `host` in a report's `egress`.
fn egress_of(report: &Value, host: &str) -> Vec<Value> {
    report["egress"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .filter(|r| r["host"] == host)
        .collect()
}

/// An allowlisted session on gVisor: the egress route (the proxy on its private
/// listeners, the forwarder inside) lives as long as the sandbox, so three commands all
/// reach the allowlisted upstream (through the HTTP proxy, the SOCKS proxy, and the
/// resolver and a transparent listener for a proxy-unaware client); a name not on
/// the allowlist is denied with the native reason code and never reached; every
/// connection is in the session's record; closing leaves nothing.
#[test]
fn an_allowlisted_sessions_commands_reach_the_upstream_and_another_name_is_denied_as_natively() {
    require_cells!();
    let _serial = serial();
    let env = AllowlistEnv::start();
    let served = serve_with(300, &env.contract(""), EGRESS_CONFIG, &[]);
    let id = open(&served);
    let dir = cell_dir(&served);
    let url = env.url("api.test", "hello.txt");
    let first = exec(
        &served,
        &id,
        &["curl", "-sS", "--max-time", "20", &url],
        json!({}),
    );
    assert_eq!(stream(&first, "stdout"), env.token, "{first:?}");
    let socks = format!("curl -sS --max-time 20 -x \"$ALL_PROXY\" {url}");
    let second = exec(&served, &id, &["sh", "-c", &socks], json!({}));
    assert_eq!(stream(&second, "stdout"), env.token, "{second:?}");
    // A proxy-unaware client: the sandbox's resolver answers the allowlisted name with
    // its transparent address, as natively.
    let unaware = format!("getent hosts api.test && curl -sS --max-time 20 --noproxy '*' {url}");
    let third = exec(&served, &id, &["sh", "-c", &unaware], json!({}));
    let third_out = stream(&third, "stdout");
    assert!(third_out.starts_with("127.100.0.1 "), "{third:?}");
    assert!(third_out.ends_with(&env.token), "{third:?}");
    let evil = env.url("evil.test", "case-denied");
    let denied = exec(
        &served,
        &id,
        &["curl", "-s", "-i", "--max-time", "20", &evil],
        json!({}),
    );
    let response = stream(&denied, "stdout");
    assert!(response.contains("HTTP/1.1 403"), "{denied:?}");
    assert!(
        response.contains("X-Airlock-Reason: egress.not_allowlisted\r\n"),
        "{denied:?}"
    );
    let closed = close(&served, &id);
    assert_eq!(closed["status"], "ok", "{closed}");
    assert_eq!(closed["cleanup"]["ok"], true, "{closed}");
    assert_left_nothing(&dir);
    // The proxy, the bridge's threads and the private namespace were the supervisor's:
    // it exits, so none of them is left (a stuck thread would keep it alive).
    assert_supervisor_exits(&dir);
    let reached = egress_of(&closed, "api.test");
    assert_eq!(reached.len(), 3, "{closed}");
    for record in &reached {
        assert_eq!(record["decision"], "allowed", "{closed}");
        assert_eq!(
            record["address"],
            format!("{UPSTREAM_IP}:{}", env.upstream.port)
        );
    }
    let refused = egress_of(&closed, "evil.test");
    assert_eq!(refused.len(), 1, "{closed}");
    assert_eq!(refused[0]["decision"], "denied", "{closed}");
    assert_eq!(refused[0]["reason"], "egress.not_allowlisted", "{closed}");
    let log = env.upstream.log();
    assert_eq!(log.matches("GET /hello.txt").count(), 3, "{log}");
    assert!(!log.contains("case-denied"), "{log}");
    let stored = stored_run(&served, &id);
    assert_eq!(stored["run"]["status"], "ok", "{stored}");
    let verified = served.cli(&["audit", "verify"]);
    assert!(verified.status.success(), "{verified:?}");
}

/// Nothing but the proxy is reachable from a session's command (common/route_probe.rs):
/// not the upstream directly, the host's addresses, UDP, a host unix socket; a command
/// that kills the forwarder opens no route for itself nor for the next command, which
/// cannot reach the proxy either (the route is the forwarder's, and it is not replaced).
#[test]
fn nothing_else_is_reachable_from_a_sessions_commands_even_after_one_kills_the_forwarder() {
    require_cells!();
    let _serial = serial();
    let env = AllowlistEnv::start();
    let probe = RouteProbe::new(UPSTREAM_IP, env.upstream.port);
    let served = serve_with(
        300,
        &env.contract(&probe.contract_inputs()),
        EGRESS_CONFIG,
        &[],
    );
    let id = open(&served);
    let dir = cell_dir(&served);
    for (kill, when) in [(true, "the killing command"), (false, "the next command")] {
        let script = probe.script(kill);
        let frames = exec(&served, &id, &["python3", "-c", &script], json!({}));
        let stdout = stream(&frames, "stdout");
        assert_eq!(record(&frames)["exit_code"], 1, "{when}: {frames:?}");
        assert!(!stdout.contains("BREACH"), "{when}: {stdout}");
        assert!(
            stdout.contains("refused proxy after kill"),
            "{when}: {stdout}"
        );
    }
    let closed = close(&served, &id);
    assert_eq!(closed["cleanup"]["ok"], true, "{closed}");
    assert_left_nothing(&dir);
    probe.assert_nothing_arrived();
    assert!(
        !env.upstream.log().contains("GET"),
        "{}",
        env.upstream.log()
    );
}

/// A warm pool of an allowlisted gVisor contract: the parked sandbox's route is up before
/// its command is claimed; the claimed run reaches the upstream, its record has the
/// connection, and the cell leaves nothing.
#[test]
fn a_warm_allowlisted_gvisor_cell_runs_a_claimed_command_through_the_proxy() {
    require_cells!();
    let _serial = serial();
    let env = AllowlistEnv::start();
    let config = format!(
        r#"[server]
listen = ["unix:SOCK", "tcp:127.0.0.1:PORT"]
[server.contracts]
gv = "gv.yaml"
[server.pools]
gv = 1
[server.tenants.alice]
api_key_sha256 = ["{key}"]
max_cells = 8
runs_per_minute = 1000
{EGRESS_CONFIG}"#,
        key = common::sha256_hex(KEY),
    );
    let contract = env.contract("");
    let served = Served::start(&config, |dir| {
        std::fs::write(dir.join("gv.yaml"), &contract).unwrap();
    });
    let parked = wait_for_cell(&served, None);
    // Its directory exists before its route is up: claimed only once it is parked.
    wait_parked(&served);
    let url = env.url("api.test", "hello.txt");
    let (code, record) = served.call(
        KEY,
        "POST",
        "/v1/runs?wait=true",
        Some(&json!({"contract": "gv", "argv": ["curl", "-sS", "--max-time", "20", url]})),
    );
    assert_eq!(code, 200, "{record}\n{}", served.log());
    assert_eq!(record["status"], "ok", "{record}");
    assert_eq!(
        record["output"]["stdout"]["head"],
        env.token.as_str(),
        "{record}"
    );
    let reached = egress_of(&record, "api.test");
    assert_eq!(reached.len(), 1, "{record}");
    assert_eq!(reached[0]["decision"], "allowed", "{record}");
    wait_gone(&parked, Duration::from_secs(20));
    assert_left_nothing(&parked);
    assert_eq!(env.upstream.log().matches("GET /hello.txt").count(), 1);
}

/// The threads of process `pid` now.
fn threads_of(pid: u32) -> usize {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("Threads:"))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0)
}

/// The bridge's ceiling (crates/cell/src/gvisor/egress.rs: 128 connections relayed at
/// once, two supervisor threads each): a command that opens 300 connections to the
/// proxy and holds them open cannot make the session's supervisor spawn threads for each
/// (the proxy closes its excess at once, but a relay lasts until the sandbox's side
/// closes too). Once the command ended its connections' slots are free again: the next
/// command reaches the upstream.
#[test]
fn held_connections_leave_the_supervisors_threads_bounded_and_the_route_usable() {
    require_cells!();
    let _serial = serial();
    let env = AllowlistEnv::start();
    let contract = env.contract("resources:\n  process_limit: 1024\n  open_files: 1024\n");
    let served = serve_with(300, &contract, EGRESS_CONFIG, &[]);
    let id = open(&served);
    let dir = cell_dir(&served);
    let name = dir.file_name().unwrap().to_string_lossy().into_owned();
    let supervisor: u32 = name.split('-').next().unwrap().parse().unwrap();
    let idle = threads_of(supervisor);
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = {
        let done = done.clone();
        std::thread::spawn(move || {
            let mut most = 0;
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                most = most.max(threads_of(supervisor));
                std::thread::sleep(Duration::from_millis(50));
            }
            most
        })
    };
    let script = "import socket, time\n\
                  held = []\n\
                  for i in range(300):\n\
                  \x20   held.append(socket.create_connection(('127.0.0.1', 3128), timeout=10))\n\
                  print('opened', len(held), flush=True)\n\
                  time.sleep(8)\n";
    let flood = exec(&served, &id, &["python3", "-c", script], json!({}));
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    let most = sampler.join().unwrap();
    assert_eq!(stream(&flood, "stdout"), "opened 300\n", "{flood:?}");
    assert!(
        most <= idle + 2 * 128 + 16,
        "the supervisor went from {idle} to {most} threads"
    );
    let url = env.url("api.test", "hello.txt");
    let after = exec(
        &served,
        &id,
        &["curl", "-sS", "--max-time", "20", &url],
        json!({}),
    );
    assert_eq!(stream(&after, "stdout"), env.token, "{after:?}");
    let closed = close(&served, &id);
    assert_eq!(closed["cleanup"]["ok"], true, "{closed}");
    assert_left_nothing(&dir);
}

/// A session's network change on gVisor (`POST /v1/sessions/{id}/network`, a class
/// session): the change is handed to the sandbox's proxy as natively, so a removed
/// destination is refused with `egress.not_allowlisted` by the next connection and one
/// added back is reached again; every connection is in the session's record.
#[test]
fn a_gvisor_sessions_network_change_reaches_its_proxy() {
    require_cells!();
    let _serial = serial();
    let env = AllowlistEnv::start();
    let api = format!("api.test:{}", env.upstream.port);
    let config = format!(
        r#"[server]
listen = ["unix:SOCK", "tcp:127.0.0.1:PORT"]
[server.tenants.alice]
api_key_sha256 = ["{key}"]
{EGRESS_CONFIG}
[policy.classes.net]
description = "a gVisor session whose destinations change"
[policy.classes.net.template.network]
mode = "allowlist"
allowed_domains = ["{api}"]
[policy.classes.net.bounds]
isolation = "gvisor"
session = {{ allowed = true, max_lifetime_seconds = 600 }}
[policy.classes.net.commands]
unmatched = "allow"
"#,
        key = common::sha256_hex(KEY),
    );
    let served = Served::start(&config, |_| {});
    let (code, opened) = served.call(
        KEY,
        "POST",
        "/v1/sessions",
        Some(&json!({"class": "net", "idle_timeout_s": 300})),
    );
    assert_eq!(code, 201, "{opened}\n{}", served.log());
    let id = opened["session_id"].as_str().unwrap().to_string();
    let dir = cell_dir(&served);
    let url = env.url("api.test", "hello.txt");
    let fetch = || {
        let frames = exec(
            &served,
            &id,
            &["curl", "-s", "-i", "--max-time", "20", &url],
            json!({}),
        );
        stream(&frames, "stdout")
    };
    let change = |body: Value| {
        let path = format!("/v1/sessions/{id}/network");
        let (code, changed) = served.call(KEY, "POST", &path, Some(&body));
        assert_eq!(code, 200, "{changed}\n{}", served.log());
    };
    assert!(fetch().ends_with(&env.token), "reached before the change");
    change(json!({"remove": [api]}));
    let refused = fetch();
    assert!(
        refused.contains("X-Airlock-Reason: egress.not_allowlisted\r\n"),
        "{refused}"
    );
    change(json!({"add": [api]}));
    assert!(
        fetch().ends_with(&env.token),
        "reached after it was added back"
    );
    let closed = close(&served, &id);
    assert_eq!(closed["cleanup"]["ok"], true, "{closed}");
    assert_left_nothing(&dir);
    let decisions: Vec<Value> = egress_of(&closed, "api.test")
        .iter()
        .map(|r| r["decision"].clone())
        .collect();
    assert_eq!(decisions, ["allowed", "denied", "allowed"], "{closed}");
    assert_eq!(env.upstream.log().matches("GET /hello.txt").count(), 2);
}
