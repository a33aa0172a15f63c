//! `airlock run` handed to a running service (crates/engine/src/handoff.rs): the real
//! binary as the client, `serve_connection` hosted in this test process over an engine
//! whose cell factory is the real binary, the way `airlock serve` hosts it. A handed-off
//! run must end exactly like the same run in the client's process: exit code, stderr and
//! result file.

mod common;

use airlock_engine::handoff::{
    serve_connection, HandoffAdmission, HandoffGate, HandoffPeer, HandoffRefusal,
};
use airlock_engine::{Engine, EngineConfig};
use serde_json::Value;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::{Arc, Mutex};

/// Admits everyone and remembers who came (the proof that a run was handed over).
#[derive(Default)]
struct Doorman {
    peers: Mutex<Vec<HandoffPeer>>,
}

impl HandoffGate for Doorman {
    fn admit(&self, peer: &HandoffPeer) -> Result<HandoffAdmission, HandoffRefusal> {
        self.peers.lock().unwrap().push(peer.clone());
        Ok(HandoffAdmission {
            tenant: None,
            guard: Box::new(()),
        })
    }
}

/// A service: an engine, its store, a socket in a directory every user may traverse.
struct Service {
    dir: tempfile::TempDir,
    socket: PathBuf,
    gate: Arc<Doorman>,
    _state: tempfile::TempDir,
}

impl Service {
    fn start() -> Service {
        Service::start_with(Default::default())
    }

    /// A service whose operator configuration's `[egress]` is `egress`.
    fn start_with(egress: airlock_egress::EgressConfig) -> Service {
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let state = tempfile::tempdir().unwrap();
        let socket = dir.path().join("airlock.sock");
        let listener = UnixListener::bind(&socket).unwrap();
        std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o777)).unwrap();
        let mut config = EngineConfig::new(state.path().to_path_buf(), egress);
        config.program = common::airlock_bin();
        let engine = Arc::new(Engine::new(config));
        let gate = Arc::new(Doorman::default());
        let serving = Arc::clone(&gate);
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let (engine, gate) = (Arc::clone(&engine), Arc::clone(&serving));
                std::thread::spawn(move || {
                    let _ = serve_connection(stream, &engine, gate.as_ref());
                });
            }
        });
        Service {
            dir,
            socket,
            gate,
            _state: state,
        }
    }

    fn state_dir(&self) -> &Path {
        self._state.path()
    }

    fn peers(&self) -> Vec<HandoffPeer> {
        self.gate.peers.lock().unwrap().clone()
    }
}

/// One `airlock run` and its result file.
struct Ran {
    output: Output,
    result: Value,
}

impl Ran {
    fn code(&self) -> i32 {
        self.output.status.code().unwrap_or(-1)
    }

    fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.output.stderr).into_owned()
    }

    fn describe(&self) -> String {
        format!(
            "exit {:?}\nstdout: {}\nstderr: {}\nresult: {}",
            self.output.status,
            String::from_utf8_lossy(&self.output.stdout),
            self.stderr(),
            self.result
        )
    }
}

/// A credential in every client's environment (crates/airlock/tests/handoff.rs's runs
/// name it through `from_env`).
const CREDENTIAL_VAR: &str = "AIRLOCK_TEST_HANDOFF_TOKEN";
const CREDENTIAL_VALUE: &str = "handoff-credential-4f1c9a7e2b";

/// Where a run goes: the service at a socket, or this process with its own store.
enum Via<'a> {
    Service(&'a Path),
    Local(&'a Path),
}

fn airlock_run(dir: &Path, via: Via<'_>, contract: Option<&str>, argv: &[&str]) -> Ran {
    let result = dir.join(format!("result-{}.json", unique()));
    let mut cmd = Command::new(common::airlock_bin());
    cmd.current_dir(dir).arg("run").arg("--result").arg(&result);
    // The client's own environment holds the credential a contract may name.
    cmd.env(CREDENTIAL_VAR, CREDENTIAL_VALUE);
    match via {
        Via::Service(socket) => cmd.env("AIRLOCK_SOCKET", socket),
        Via::Local(state) => cmd
            .env_remove("AIRLOCK_SOCKET")
            .arg("--state-dir")
            .arg(state),
    };
    if let Some(yaml) = contract {
        let path = dir.join(format!("contract-{}.yaml", unique()));
        std::fs::write(&path, yaml).unwrap();
        cmd.arg("--contract").arg(path);
    }
    let output = cmd
        .arg("--")
        .args(argv)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let result = std::fs::read_to_string(&result)
        .ok()
        .and_then(|text| serde_json::from_str(&text).ok())
        .unwrap_or(Value::Null);
    Ran { output, result }
}

fn unique() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// A result record without what differs between any two runs (ids, times, usage, the
/// host identity a cell got, the start-up milestones).
fn comparable(mut record: Value) -> Value {
    if let Some(fields) = record.as_object_mut() {
        for volatile in [
            "run_id",
            "timings",
            "usage",
            "host_identity",
            "stale_cgroups_left",
        ] {
            fields.remove(volatile);
        }
    }
    let ids = regex_free_uuid_mask(&record.to_string());
    serde_json::from_str(&ids).unwrap()
}

/// Replaces every 36-character run id (8-4-4-4-12 hex) in `text` with zeros.
fn regex_free_uuid_mask(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < bytes.len() {
        if i + 36 <= bytes.len() && is_uuid(&bytes[i..i + 36]) {
            out.push_str("00000000-0000-0000-0000-000000000000");
            i += 36;
        } else {
            out.push(bytes[i] as char);
            i += 1;
        }
    }
    out
}

fn is_uuid(b: &[u8]) -> bool {
    b.iter().enumerate().all(|(i, c)| match i {
        8 | 13 | 18 | 23 => *c == b'-',
        _ => c.is_ascii_hexdigit(),
    })
}

/// The same run handed over and in this process end alike.
fn assert_same_end(contract: Option<&str>, argv: &[&str], expected_code: i32) -> Ran {
    let service = Service::start();
    let dir = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    let handed = airlock_run(dir.path(), Via::Service(&service.socket), contract, argv);
    assert_eq!(
        service.peers().len(),
        1,
        "not handed over: {}",
        handed.describe()
    );
    let local = airlock_run(dir.path(), Via::Local(state.path()), contract, argv);
    assert_eq!(handed.code(), expected_code, "{}", handed.describe());
    assert_eq!(local.code(), handed.code(), "{}", local.describe());
    assert_eq!(
        handed.output.stdout,
        local.output.stdout,
        "{}\n---\n{}",
        handed.describe(),
        local.describe()
    );
    assert_eq!(
        regex_free_uuid_mask(&handed.stderr()),
        regex_free_uuid_mask(&local.stderr()),
        "{}\n---\n{}",
        handed.describe(),
        local.describe()
    );
    assert_ne!(handed.result, Value::Null, "{}", handed.describe());
    assert_eq!(
        comparable(handed.result.clone()),
        comparable(local.result.clone()),
        "the result files differ"
    );
    handed
}

#[test]
fn a_successful_run_ends_alike_handed_over_and_in_process() {
    require_cells!();
    let handed = assert_same_end(None, &["/bin/echo", "hello"], 0);
    assert_eq!(String::from_utf8_lossy(&handed.output.stdout), "hello\n");
    assert_eq!(handed.result["status"], "ok");
}

#[test]
fn a_task_error_ends_alike_handed_over_and_in_process() {
    require_cells!();
    let handed = assert_same_end(None, &["/bin/sh", "-c", "echo oops >&2; exit 3"], 3);
    assert_eq!(handed.result["status"], "task_error");
    assert!(handed.stderr().contains("oops"), "{}", handed.describe());
}

#[test]
fn a_timeout_ends_alike_handed_over_and_in_process() {
    require_cells!();
    let contract = "resources:\n  wall_time_seconds: 1\n";
    let handed = assert_same_end(Some(contract), &["/bin/sleep", "30"], 124);
    assert_eq!(handed.result["limit_fired"], "wall_time");
}

#[test]
fn an_exec_the_cell_denies_ends_alike_handed_over_and_in_process() {
    require_cells!();
    // /dev/shm is noexec in the cell and Landlock withholds execute there: the boundary
    // refuses the exec.
    let handed = assert_same_end(
        None,
        &[
            "/bin/sh",
            "-c",
            "cp /bin/true /dev/shm/t && exec /dev/shm/t",
        ],
        126,
    );
    assert_eq!(handed.result["status"], "task_error");
}

#[test]
fn a_contract_refused_by_policy_ends_alike_handed_over_and_in_process() {
    require_cells!();
    let contract = "network:\n  mode: everywhere\n";
    let handed = assert_same_end(Some(contract), &["/bin/true"], 125);
    assert_ne!(handed.result["status"], "ok", "{}", handed.describe());
    assert!(
        handed.stderr().contains("contract"),
        "{}",
        handed.describe()
    );
}

/// Every file under `dir`, read as bytes, that contains `needle`.
fn files_containing(dir: &Path, needle: &str) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                pending.push(path);
            } else if std::fs::read(&path)
                .map(|bytes| bytes.windows(needle.len()).any(|w| w == needle.as_bytes()))
                .unwrap_or(false)
            {
                found.push(path);
            }
        }
    }
    found
}

#[test]
fn a_credential_from_the_clients_environment_is_handed_over_and_redacted_alike() {
    require_cells!();
    let contract =
        format!("credentials:\n  - name: token\n    env: TOKEN\n    from_env: {CREDENTIAL_VAR}\n");
    let script = format!("test \"$TOKEN\" = {CREDENTIAL_VALUE} && echo match; echo \"$TOKEN\" >&2");
    let service = Service::start();
    let dir = tempfile::tempdir().unwrap();
    let handed = airlock_run(
        dir.path(),
        Via::Service(&service.socket),
        Some(&contract),
        &["/bin/sh", "-c", &script],
    );
    assert_eq!(
        service.peers().len(),
        1,
        "not handed over: {}",
        handed.describe()
    );
    assert_eq!(handed.code(), 0, "{}", handed.describe());
    assert_eq!(String::from_utf8_lossy(&handed.output.stdout), "match\n");
    let result = handed.result.to_string();
    assert!(
        !result.contains(CREDENTIAL_VALUE),
        "the result keeps the value: {result}"
    );
    assert!(result.contains("[REDACTED]"), "{result}");
    let kept = files_containing(service.state_dir(), CREDENTIAL_VALUE);
    assert!(
        kept.is_empty(),
        "the service's store keeps the value: {kept:?}"
    );

    // Ends as it does in the client's process, and a credential the client lacks is
    // refused alike (exit 125, naming the variable).
    assert_same_end(Some(&contract), &["/bin/sh", "-c", &script], 0);
    let missing = "credentials:\n  - name: other\n    env: OTHER\n    from_env: AIRLOCK_TEST_UNSET_CREDENTIAL\n";
    let refused = assert_same_end(Some(missing), &["/bin/true"], 125);
    assert!(
        refused.stderr().contains("AIRLOCK_TEST_UNSET_CREDENTIAL"),
        "{}",
        refused.describe()
    );
}

#[test]
fn an_allowlist_is_handed_over_and_resolved_by_the_services_configuration() {
    require_cells!();
    let dir = tempfile::tempdir().unwrap();
    let www = dir.path().join("www");
    std::fs::create_dir(&www).unwrap();
    std::fs::write(www.join("hello.txt"), "hello from upstream\n").unwrap();
    let upstream = common::upstream::Upstream::start(dir.path(), &www, "127.0.0.2", None);
    let egress = airlock_egress::EgressConfig {
        resolve: [("api.test".to_string(), "127.0.0.2".parse().unwrap())].into(),
        exempt_cidrs: vec!["127.0.0.2/32".parse().unwrap()],
        ..Default::default()
    };
    let service = Service::start_with(egress);
    let contract = format!(
        "network:\n  mode: allowlist\n  allowed_domains: [\"api.test:{}\"]\n",
        upstream.port
    );
    let fetch = |url: String| {
        airlock_run(
            dir.path(),
            Via::Service(&service.socket),
            Some(&contract),
            &["curl", "-fsS", "--max-time", "20", &url],
        )
    };
    let allowed = fetch(format!("http://api.test:{}/hello.txt", upstream.port));
    assert_eq!(allowed.code(), 0, "{}", allowed.describe());
    assert_eq!(
        String::from_utf8_lossy(&allowed.output.stdout),
        "hello from upstream\n"
    );
    assert!(
        upstream.log().contains("GET /hello.txt"),
        "{}",
        upstream.log()
    );
    // A name outside the allowlist is refused by the service's proxy, with its reason
    // in the client's result file.
    let denied = fetch(format!("http://other.test:{}/hello.txt", upstream.port));
    assert_ne!(denied.code(), 0, "{}", denied.describe());
    assert!(
        denied.result.to_string().contains("egress.not_allowlisted"),
        "{}",
        denied.describe()
    );
    assert_eq!(service.peers().len(), 2, "both runs were handed over");
    // An allowlisted name the service's configuration cannot resolve: refused before
    // any cell, as a run in the client's process would be.
    let nowhere = airlock_run(
        dir.path(),
        Via::Service(&service.socket),
        Some("network:\n  mode: allowlist\n  allowed_domains: [\"nowhere.test:80\"]\n"),
        &["/bin/true"],
    );
    assert_eq!(nowhere.code(), 125, "{}", nowhere.describe());
    assert_eq!(nowhere.result["status"], "sandbox_unavailable");
    assert!(
        nowhere.stderr().contains("nowhere.test"),
        "{}",
        nowhere.describe()
    );
}

#[test]
fn a_read_only_input_resolves_against_the_clients_directory() {
    require_cells!();
    let service = Service::start();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("data.txt"), "the client's data\n").unwrap();
    let contract =
        "filesystem:\n  readonly_inputs:\n    - source: data.txt\n      target: /in/data.txt\n";
    let ran = airlock_run(
        dir.path(),
        Via::Service(&service.socket),
        Some(contract),
        &["/bin/cat", "/in/data.txt"],
    );
    assert_eq!(ran.code(), 0, "{}", ran.describe());
    assert_eq!(service.peers().len(), 1);
    assert_eq!(
        String::from_utf8_lossy(&ran.output.stdout),
        "the client's data\n"
    );
}

/// A directory only root may enter, with a file in it.
fn root_only_file(text: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("secret.txt");
    std::fs::write(&file, text).unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    (dir, file)
}

#[test]
fn a_client_that_is_not_root_cannot_mount_an_input_only_root_may_read() {
    require_cells!();
    let service = Service::start();
    let (_secret_dir, secret) = root_only_file("root's secret\n");
    // The client's own directory: readable by it (nobody), under the service's 0755 one.
    let dir = service.dir.path().join("client");
    std::fs::create_dir(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    let contract = dir.join("contract.yaml");
    std::fs::write(
        &contract,
        format!(
            "filesystem:\n  readonly_inputs:\n    - source: {}\n      target: /in/secret.txt\n",
            secret.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&contract, std::fs::Permissions::from_mode(0o644)).unwrap();
    let result = dir.join("result.json");
    let output = Command::new(common::airlock_bin())
        .current_dir(&dir)
        .env("AIRLOCK_SOCKET", &service.socket)
        .env("HOME", &dir)
        .uid(65534)
        .gid(65534)
        .args(["run", "--result"])
        .arg(&result)
        .arg("--contract")
        .arg(&contract)
        .args(["--", "/bin/cat", "/in/secret.txt"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(service.peers().len(), 1, "not handed over: {stderr}");
    assert_eq!(service.peers()[0].uid, 65534);
    assert_eq!(output.status.code(), Some(125), "{stdout}\n{stderr}");
    assert!(!stdout.contains("root's secret"), "{stdout}");
    assert!(stderr.contains("policy_denied"), "{stderr}");
    assert!(stderr.contains("may not read it"), "{stderr}");
    let record: Value = serde_json::from_str(&std::fs::read_to_string(&result).unwrap()).unwrap();
    assert_eq!(record["status"], "policy_denied");
    // The same contract from root is served: the refusal was the peer's identity.
    let as_root = airlock_run(
        &dir,
        Via::Service(&service.socket),
        Some(&std::fs::read_to_string(&contract).unwrap()),
        &["/bin/cat", "/in/secret.txt"],
    );
    assert_eq!(as_root.code(), 0, "{}", as_root.describe());
    assert_eq!(
        String::from_utf8_lossy(&as_root.output.stdout),
        "root's secret\n"
    );
}

use std::os::unix::process::CommandExt;

#[test]
fn no_service_or_one_refusing_connections_means_this_process_and_says_so_with_v() {
    require_cells!();
    // As nobody, with a store of its own: whatever the run in this process then does, the
    // host's default store is not touched.
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let home = dir.path().join("home");
    std::fs::create_dir(&home).unwrap();
    std::os::unix::fs::chown(&home, Some(65534), Some(65534)).unwrap();
    let absent = dir.path().join("absent.sock");
    let refusing = dir.path().join("refusing.sock");
    drop(UnixListener::bind(&refusing).unwrap());
    std::fs::set_permissions(&refusing, std::fs::Permissions::from_mode(0o777)).unwrap();
    for socket in [&absent, &refusing] {
        let run = |verbose: bool| {
            let mut cmd = Command::new(common::airlock_bin());
            cmd.current_dir(&home)
                .env("AIRLOCK_SOCKET", socket)
                .env("HOME", &home)
                .env("XDG_STATE_HOME", &home)
                .uid(65534)
                .gid(65534)
                .arg("run");
            if verbose {
                cmd.arg("-v");
            }
            let output = cmd
                .args(["--", "/bin/true"])
                .stdin(Stdio::null())
                .output()
                .unwrap();
            String::from_utf8_lossy(&output.stderr).into_owned()
        };
        let stderr = run(true);
        assert!(stderr.contains("no airlock service at"), "{stderr}");
        assert!(stderr.contains("running in this process"), "{stderr}");
        assert!(!run(false).contains("airlock service"));
    }
}

#[test]
fn local_forces_this_process_even_with_a_service() {
    require_cells!();
    let service = Service::start();
    let dir = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    let output = Command::new(common::airlock_bin())
        .current_dir(dir.path())
        .env("AIRLOCK_SOCKET", &service.socket)
        .args(["run", "--local", "-v", "--state-dir"])
        .arg(state.path())
        .args(["--", "/bin/true"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    assert!(
        stderr.contains("running in this process (--local)"),
        "{stderr}"
    );
    assert!(service.peers().is_empty());
}

#[test]
fn a_service_that_dies_mid_run_is_a_runtime_fault() {
    // A service that takes the request and goes away before answering.
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("dying.sock");
    let listener = UnixListener::bind(&socket).unwrap();
    let dying = std::thread::spawn(move || {
        let (mut stream, _) = listener.accept().unwrap();
        let mut start = [0u8; 12];
        std::io::Read::read_exact(&mut stream, &mut start).unwrap();
        let length = u32::from_le_bytes(start[8..].try_into().unwrap()) as usize;
        let mut request = vec![0u8; length];
        std::io::Read::read_exact(&mut stream, &mut request).unwrap();
        drop(stream);
    });
    let result = dir.path().join("result.json");
    let output = Command::new(common::airlock_bin())
        .env("AIRLOCK_SOCKET", &socket)
        .args(["run", "--result"])
        .arg(&result)
        .args(["--", "/bin/true"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    dying.join().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(125), "{stderr}");
    assert!(stderr.contains("runtime_fault"), "{stderr}");
    assert!(
        stderr.contains("the airlock service ended the connection"),
        "{stderr}"
    );
    let record: Value = serde_json::from_str(&std::fs::read_to_string(&result).unwrap()).unwrap();
    assert_eq!(record["status"], "runtime_fault");
}

#[test]
fn a_client_that_dies_mid_run_takes_its_run_in_the_service_with_it() {
    require_cells!();
    // Ctrl-C at the client's terminal ends a run in the client's process (the cell dies
    // with its supervisor); handed over, the service destroys the cell when the client's
    // connection hangs up, instead of letting it run to its deadline.
    let service = Service::start();
    let marker = format!("handoff-orphan-{}", std::process::id());
    let script = format!("echo started; sleep 30; : {marker}");
    let mut client = Command::new(common::airlock_bin())
        .env("AIRLOCK_SOCKET", &service.socket)
        .args(["run", "--", "sh", "-c", &script])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut started = [0u8; 8];
    std::io::Read::read_exact(client.stdout.as_mut().unwrap(), &mut started).unwrap();
    assert_eq!(&started, b"started\n");
    assert_eq!(service.peers().len(), 1, "not handed over");
    let killed_at = std::time::Instant::now();
    let sent = Command::new("kill")
        .args(["-INT", &client.id().to_string()])
        .status()
        .unwrap();
    assert!(sent.success());
    let status = client.wait().unwrap();
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(libc::SIGINT)
    );

    let ended = common::finished_runs(service.state_dir(), &marker, 1);
    assert_eq!(ended.len(), 1, "{ended:?}");
    let record = &ended[0];
    assert_eq!(record["status"], "runtime_fault", "{record}");
    let error = record["result"]["error"].as_str().unwrap_or_default();
    assert!(error.contains("the caller went away"), "{record}");
    assert!(
        killed_at.elapsed() < std::time::Duration::from_secs(15),
        "the cell ran on after its client died"
    );
    let left = Command::new("pgrep")
        .args(["-f", &marker])
        .output()
        .unwrap();
    assert!(
        left.stdout.is_empty(),
        "the payload outlived its client: {}",
        String::from_utf8_lossy(&left.stdout)
    );
}

#[test]
fn without_a_result_file_the_run_ends_alike_and_its_record_is_complete_when_the_client_exits() {
    require_cells!();
    // Without --result the client has nothing to deliver: the service completes the
    // record without waiting for a delivery and answers `Completed` only after its
    // commit (the exit code, stdout and stderr as in the client's process).
    let service = Service::start();
    let dir = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    let marker = format!("handoff-no-result-{}", std::process::id());
    let script = format!("echo out; echo err >&2; exit 3; : {marker}");
    let run = |via: Via<'_>| {
        let mut cmd = Command::new(common::airlock_bin());
        cmd.current_dir(dir.path()).arg("run");
        match via {
            Via::Service(socket) => cmd.env("AIRLOCK_SOCKET", socket),
            Via::Local(state) => cmd
                .env_remove("AIRLOCK_SOCKET")
                .arg("--state-dir")
                .arg(state),
        };
        cmd.args(["--", "sh", "-c", &script])
            .stdin(Stdio::null())
            .output()
            .unwrap()
    };
    let handed = run(Via::Service(&service.socket));
    // Read at once: the record must be complete by the time the client has exited.
    let listed = Command::new(common::airlock_bin())
        .args(["runs", "list", "--json", "--state-dir"])
        .arg(service.state_dir())
        .output()
        .unwrap();
    let local = run(Via::Local(state.path()));
    assert_eq!(service.peers().len(), 1, "not handed over");
    assert_eq!(handed.status.code(), Some(3), "{handed:?}");
    assert_eq!(local.status.code(), handed.status.code());
    assert_eq!(handed.stdout, b"out\n");
    assert_eq!(
        regex_free_uuid_mask(&String::from_utf8_lossy(&handed.stderr)),
        regex_free_uuid_mask(&String::from_utf8_lossy(&local.stderr)),
    );
    let runs: Value = serde_json::from_slice(&listed.stdout).unwrap();
    let record = (runs.as_array().into_iter().flatten())
        .find(|r| r["argv"].to_string().contains(&marker))
        .unwrap_or_else(|| panic!("no record: {runs}"));
    assert_eq!(record["status"], "task_error", "{record}");
    assert_eq!(record["exit_code"], 3, "{record}");
    assert!(!record["finished_at"].is_null(), "{record}");
}
