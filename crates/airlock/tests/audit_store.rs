//! End-to-end tests of the SQLite audit store through the `airlock` binary: concurrent
//! writers, supervisors that die, stores that cannot be written, tampering, secret
//! redaction, the run records and the figures derived from them.
//!
//! Every test uses its own fresh `--state-dir`. The cases whose records come from a cell
//! run on both tiers (common/tier.rs); the store's own cases (tampering, a store that
//! cannot be written, concurrency) do not depend on the tier. The killed-supervisor case
//! is the native cell's: a gVisor sandbox outlives a supervisor killed with SIGKILL until
//! `doctor` or the next run reaps it (gvisor.rs, `doctor_reaps_the_sandbox_...`).

mod common;

use serde_json::Value;
use std::collections::BTreeSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Host-side python3 (for sqlite3 tampering).
fn python() -> &'static str {
    if Path::new("/usr/bin/python3").exists() {
        "/usr/bin/python3"
    } else {
        "python3"
    }
}

/// Every `airlock run` reaps leftover cells of dead supervisors, which would hide a cell
/// that outlives its supervisor: the supervisor-kill test runs alone (write lock), every
/// other test shares the read lock.
static CELLS: std::sync::RwLock<()> = std::sync::RwLock::new(());

fn shared() -> std::sync::RwLockReadGuard<'static, ()> {
    CELLS.read().unwrap_or_else(|e| e.into_inner())
}

fn exclusive() -> std::sync::RwLockWriteGuard<'static, ()> {
    CELLS.write().unwrap_or_else(|e| e.into_inner())
}

struct Store {
    dir: tempfile::TempDir,
    state: PathBuf,
}

struct Out {
    what: String,
    output: Output,
}

impl Out {
    fn code(&self) -> i32 {
        self.output.status.code().unwrap_or(-1)
    }
    fn stdout(&self) -> String {
        String::from_utf8_lossy(&self.output.stdout).into_owned()
    }
    fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.output.stderr).into_owned()
    }
    fn describe(&self) -> String {
        format!(
            "{}\nexit {}\nstdout: {}\nstderr: {}",
            self.what,
            self.code(),
            self.stdout(),
            self.stderr()
        )
    }
    fn json(&self) -> Value {
        serde_json::from_slice(&self.output.stdout)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.describe()))
    }
}

impl Store {
    fn new() -> Store {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        Store { dir, state }
    }

    /// `airlock <args> --state-dir S` with stdin from `stdin` (or /dev/null) and extra env.
    fn cmd(&self, args: &[&str], stdin: Option<&[u8]>, envs: &[(&str, &str)]) -> Out {
        let mut cmd = Command::new(common::airlock_bin());
        // Right after the subcommand: `run` takes everything after `--` as the payload.
        let (first, rest) = args.split_first().expect("a subcommand");
        cmd.current_dir(self.dir.path())
            .arg(first)
            .arg("--state-dir")
            .arg(&self.state)
            .args(rest)
            .envs(envs.iter().copied())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            });
        let mut child = cmd.spawn().expect("spawn airlock");
        if let Some(data) = stdin {
            let mut pipe = child.stdin.take().unwrap();
            pipe.write_all(data).unwrap();
        }
        let output = child.wait_with_output().unwrap();
        Out {
            what: format!("airlock {}", args.join(" ")),
            output,
        }
    }

    fn airlock(&self, args: &[&str]) -> Out {
        self.cmd(args, None, &[])
    }

    /// `airlock run --state-dir S [extra] -- argv`.
    fn run(&self, extra: &[&str], argv: &[&str]) -> Out {
        let mut args = vec!["run"];
        args.extend_from_slice(extra);
        args.push("--");
        args.extend_from_slice(argv);
        self.airlock(&args)
    }

    fn list(&self) -> Vec<Value> {
        let out = self.airlock(&["runs", "list", "--json", "--limit", "1000"]);
        assert_eq!(out.code(), 0, "{}", out.describe());
        out.json().as_array().cloned().unwrap_or_default()
    }

    fn show(&self, id: &str) -> Value {
        let out = self.airlock(&["runs", "show", id, "--json"]);
        assert_eq!(out.code(), 0, "{}", out.describe());
        out.json()
    }

    fn verify(&self) -> Out {
        self.airlock(&["audit", "verify"])
    }

    fn db(&self) -> PathBuf {
        self.state.join("airlock.db")
    }

    fn write_contract(&self, yaml: &str) -> PathBuf {
        let path = self
            .dir
            .path()
            .join(format!("contract-{}.yaml", unique("c")));
        std::fs::write(&path, yaml).unwrap();
        path
    }
}

fn unique(label: &str) -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!(
        "{label}{}x{}x{nanos}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

#[test]
fn thirty_two_concurrent_runs_are_all_recorded() {
    require_cells!();
    let _cells = shared();
    let store = Store::new();
    // The store does not exist yet: all 32 race to create it too.
    let children: Vec<_> = (0..32)
        .map(|_| {
            Command::new(common::airlock_bin())
                .arg("run")
                .arg("--state-dir")
                .arg(&store.state)
                .args(["--", "true"])
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawn airlock")
        })
        .collect();
    let mut failures = Vec::new();
    for child in children {
        let out = child.wait_with_output().unwrap();
        if !out.status.success() {
            failures.push(format!(
                "exit {:?}: {}",
                out.status.code(),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
    }
    assert!(failures.is_empty(), "failed runs: {failures:#?}");
    let runs = store.list();
    assert_eq!(runs.len(), 32, "{}", serde_json::to_string(&runs).unwrap());
    let ids: BTreeSet<&str> = runs.iter().filter_map(|r| r["run_id"].as_str()).collect();
    assert_eq!(ids.len(), 32, "distinct run ids: {ids:?}");
    for r in &runs {
        assert_eq!(r["status"], "ok", "{r}");
        assert_eq!(r["exit_code"], 0, "{r}");
    }
    let verify = store.verify();
    assert_eq!(verify.code(), 0, "{}", verify.describe());
    assert!(verify.stdout().contains("32 runs"), "{}", verify.describe());
}

/// Pids of processes whose argv is exactly `argv`.
fn processes_with_argv(argv: &[&str]) -> Vec<i32> {
    let want: Vec<u8> = argv
        .iter()
        .flat_map(|a| [a.as_bytes(), b"\0"].concat())
        .collect();
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        if let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) {
            if cmdline == want {
                found.push(pid);
            }
        }
    }
    found
}

#[test]
fn killed_supervisor_marks_the_run_aborted_and_takes_the_cell_along() {
    require_cells!();
    let _cells = exclusive();
    let store = Store::new();
    // A unique duration identifies this test's payload among all processes.
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    let duration = format!("30.{}{:09}", std::process::id() % 1000, nanos);
    let payload = ["sleep", duration.as_str()];
    let mut supervisor = Command::new(common::airlock_bin())
        .arg("run")
        .arg("--state-dir")
        .arg(&store.state)
        .arg("--")
        .args(payload)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();

    // Wait until the store shows it running and the payload exists.
    let deadline = Instant::now() + Duration::from_secs(20);
    let run_id = loop {
        let running: Vec<Value> = store
            .list()
            .into_iter()
            .filter(|r| r["status"] == "running")
            .collect();
        if running.len() == 1 && !processes_with_argv(&payload).is_empty() {
            break running[0]["run_id"].as_str().unwrap().to_string();
        }
        if Instant::now() > deadline {
            let _ = supervisor.kill();
            panic!("the run never showed as running: {:?}", store.list());
        }
        std::thread::sleep(Duration::from_millis(50));
    };

    // Mid-run: let the cell settle into running the payload.
    std::thread::sleep(Duration::from_millis(1000));
    supervisor.kill().unwrap(); // SIGKILL
    supervisor.wait().unwrap();

    // Any store start reaps runs of dead supervisors.
    let runs = store.list();
    let run = runs
        .iter()
        .find(|r| r["run_id"] == run_id.as_str())
        .unwrap_or_else(|| panic!("run {run_id} missing: {runs:?}"));
    assert_eq!(run["status"], "aborted", "{run}");

    // The cell dies with its supervisor: give the kernel a moment, then look.
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut left = processes_with_argv(&payload);
    while !left.is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
        left = processes_with_argv(&payload);
    }
    // Clean up whatever is left (only the processes this test started), then judge.
    for pid in &left {
        let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
    }
    assert!(
        left.is_empty(),
        "payload `{}` (pids {left:?}) outlived its SIGKILLed supervisor by 5 s",
        payload.join(" ")
    );

    let verify = store.verify();
    assert_eq!(verify.code(), 0, "{}", verify.describe());
    let detail = store.show(&run_id);
    assert!(
        detail["events"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["kind"] == "run.aborted"),
        "{detail}"
    );
}

/// Unmounts on drop (even when the test fails).
struct Mount(PathBuf);

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

fn sh_ok(script: &str) {
    let status = Command::new("sh").arg("-c").arg(script).status().unwrap();
    assert!(status.success(), "`{script}` failed");
}

fn assert_refused(store: &Store, why: &str) {
    let result = store.dir.path().join("refused.json");
    let run = store.run(&["--result", result.to_str().unwrap()], &["echo", "RAN"]);
    assert_eq!(run.code(), 125, "{why}: {}", run.describe());
    assert!(
        run.stderr().contains("audit store"),
        "{why}: stderr must name the audit store: {}",
        run.describe()
    );
    assert_eq!(
        run.stdout(),
        "",
        "{why}: the payload must not run: {}",
        run.describe()
    );
    let record: Value = std::fs::read_to_string(&result)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or(Value::Null);
    assert_eq!(record["status"], "runtime_fault", "{why}: {record}");
}

#[test]
fn read_only_store_refuses_to_run() {
    require_cells!();
    let _cells = shared();
    let store = Store::new();
    let first = store.run(&[], &["true"]);
    assert_eq!(first.code(), 0, "{}", first.describe());
    let s = store.state.display().to_string();
    sh_ok(&format!("mount --bind '{s}' '{s}'"));
    let _mount = Mount(store.state.clone());
    sh_ok(&format!("mount -o remount,bind,ro '{s}'"));
    assert_refused(&store, "read-only store");
}

#[test]
fn full_disk_store_refuses_to_run() {
    require_cells!();
    let _cells = shared();
    let store = Store::new();
    std::fs::create_dir_all(&store.state).unwrap();
    let s = store.state.display().to_string();
    sh_ok(&format!("mount -t tmpfs -o size=256k tmpfs '{s}'"));
    let _mount = Mount(store.state.clone());
    // Fill it up.
    let mut filler = std::fs::File::create(store.state.join("filler")).unwrap();
    let block = vec![0u8; 4096];
    while filler.write_all(&block).is_ok() {}
    let _ = filler.sync_all();
    assert_refused(&store, "full disk");
}

/// Runs `script` (python3) against the store's database with `db` bound to a connection.
fn tamper(store: &Store, script: &str) {
    let program = format!(
        r#"
import sqlite3, sys
db = sqlite3.connect(sys.argv[1])
cols = {{t: [r[1] for r in db.execute("PRAGMA table_info(%s)" % t)]
         for (t,) in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}}
assert "exit_code" in cols["runs"] and "run_id" in cols["runs"], cols
assert {{"seq", "body_json", "hash", "prev_hash"}} <= set(cols["audit_log"]), cols
{script}
db.commit()
db.close()
"#
    );
    let out = Command::new(python())
        .arg("-c")
        .arg(&program)
        .arg(store.db())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "tampering script failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A store with three finished runs (the middle one exits 3); returns their ids, oldest first.
fn store_with_runs() -> (Store, Vec<String>) {
    let store = Store::new();
    for code in [0, 3, 0] {
        let run = store.run(&[], &["sh", "-c", &format!("echo run; exit {code}")]);
        assert_eq!(run.code(), code, "{}", run.describe());
    }
    let mut runs = store.list();
    runs.sort_by_key(|r| r["started_at"].as_i64());
    let ids: Vec<String> = runs
        .iter()
        .map(|r| r["run_id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(ids.len(), 3);
    let verify = store.verify();
    assert_eq!(verify.code(), 0, "before tampering: {}", verify.describe());
    (store, ids)
}

/// `(seq, run_id, kind)` of every audit entry.
fn entries(store: &Store) -> Vec<(i64, String, String)> {
    let out = Command::new(python())
        .arg("-c")
        .arg(
            "import sqlite3, sys, json\n\
             db = sqlite3.connect(sys.argv[1])\n\
             print(json.dumps(list(db.execute('SELECT seq, run_id, kind FROM audit_log ORDER BY seq'))))",
        )
        .arg(store.db())
        .output()
        .unwrap();
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    v.as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e[0].as_i64().unwrap(),
                e[1].as_str().unwrap_or("").to_string(),
                e[2].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

fn assert_verify_fails_naming(store: &Store, names: &[String], case: &str) {
    let verify = store.verify();
    assert_ne!(verify.code(), 0, "{case}: {}", verify.describe());
    let text = format!("{}{}", verify.stdout(), verify.stderr());
    assert!(
        names.iter().any(|n| text.contains(n.as_str())),
        "{case}: the output must name one of {names:?}: {}",
        verify.describe()
    );
}

#[test]
fn tampering_edited_run_row_is_detected() {
    require_cells!();
    let _cells = shared();
    let (store, ids) = store_with_runs();
    tamper(
        &store,
        &format!(
            "n = db.execute(\"UPDATE runs SET exit_code = 0, status = 'ok' WHERE run_id = ?\", ('{}',)).rowcount\nassert n == 1",
            ids[1]
        ),
    );
    assert_verify_fails_naming(&store, &[ids[1].clone()], "edited run row");
}

#[test]
fn tampering_deleted_audit_entry_is_detected() {
    require_cells!();
    let _cells = shared();
    let (store, ids) = store_with_runs();
    let all = entries(&store);
    // The middle run's run.finish.
    let (seq, _, _) = all
        .iter()
        .find(|(_, run, kind)| run == &ids[1] && kind == "run.finish")
        .cloned()
        .unwrap_or_else(|| panic!("no run.finish for {}: {all:?}", ids[1]));
    tamper(
        &store,
        &format!("assert db.execute('DELETE FROM audit_log WHERE seq = {seq}').rowcount == 1"),
    );
    assert_verify_fails_naming(
        &store,
        &[
            format!("seq {seq}"),
            format!("{seq}..={seq}"),
            format!("seq {}", seq + 1),
            ids[1].clone(),
        ],
        "deleted entry",
    );
}

#[test]
fn tampering_swapped_entry_bodies_are_detected() {
    require_cells!();
    let _cells = shared();
    let (store, ids) = store_with_runs();
    let all = entries(&store);
    let finish = |id: &str| {
        all.iter()
            .find(|(_, run, kind)| run == id && kind == "run.finish")
            .map(|e| e.0)
            .unwrap_or_else(|| panic!("no run.finish for {id}: {all:?}"))
    };
    let (a, b) = (finish(&ids[0]), finish(&ids[1]));
    tamper(
        &store,
        &format!(
            "ba = db.execute('SELECT body_json FROM audit_log WHERE seq = {a}').fetchone()[0]\n\
             bb = db.execute('SELECT body_json FROM audit_log WHERE seq = {b}').fetchone()[0]\n\
             assert ba != bb\n\
             db.execute('UPDATE audit_log SET body_json = ? WHERE seq = {a}', (bb,))\n\
             db.execute('UPDATE audit_log SET body_json = ? WHERE seq = {b}', (ba,))"
        ),
    );
    assert_verify_fails_naming(
        &store,
        &[
            format!("seq {a}"),
            format!("seq {b}"),
            ids[0].clone(),
            ids[1].clone(),
        ],
        "swapped bodies",
    );
}

/// Asserts `secret` appears nowhere in the store's files or its export, after a verify.
fn assert_secret_absent(store: &Store, run: &Out, secret: &str) {
    // Verify first (it opens and reads everything); judge its outcome last, so that a
    // verify failure does not hide a leak.
    let verify = store.verify();
    for name in ["airlock.db", "airlock.db-wal", "airlock.db-shm"] {
        let path = store.state.join(name);
        let Ok(bytes) = std::fs::read(&path) else {
            continue;
        };
        assert!(
            !bytes.windows(secret.len()).any(|w| w == secret.as_bytes()),
            "the secret is stored in {}\n{}",
            path.display(),
            run.describe()
        );
    }
    let export_file = store.dir.path().join("export.jsonl");
    let export = store.airlock(&[
        "audit",
        "export",
        "--format",
        "jsonl",
        "--output",
        export_file.to_str().unwrap(),
    ]);
    assert_eq!(export.code(), 0, "{}", export.describe());
    let exported = std::fs::read_to_string(&export_file).unwrap();
    assert!(!exported.is_empty(), "{}", export.describe());
    assert!(
        !exported.contains(secret),
        "the secret is in the export\n{}",
        run.describe()
    );
    let export_stdout = store.airlock(&["audit", "export", "--format", "jsonl"]);
    assert_eq!(export_stdout.code(), 0, "{}", export_stdout.describe());
    assert!(
        !export_stdout.stdout().contains(secret),
        "the secret is in the export (stdout)"
    );
    let runs = store.list();
    assert_eq!(runs.len(), 1);
    let id = runs[0]["run_id"].as_str().unwrap();
    let shown = store.airlock(&["runs", "show", id, "--json"]);
    assert_eq!(shown.code(), 0, "{}", shown.describe());
    assert!(
        !shown.stdout().contains(secret),
        "runs show leaks the secret: {}",
        shown.stdout()
    );
    let detail = shown.json();
    for field in ["stdout_head", "stderr_head"] {
        let text = detail["run"][field].as_str().unwrap_or("");
        assert!(
            text.contains("[REDACTED]"),
            "{field} must show [REDACTED]: {}",
            shown.stdout()
        );
    }
    assert_eq!(verify.code(), 0, "{}", verify.describe());
}

both_tiers! {
fn secret_env_values_never_reach_the_store(tier) {
    require_cells!();
    let _cells = shared();
    let store = Store::new();
    let secret = unique("s3cr3t-XYZ-");
    let yaml = format!("env:\n  API_TOKEN: {{ value: \"{secret}\", secret: true }}\n");
    let contract = store.write_contract(&tier.contract(Some(&yaml)).unwrap());
    let run = store.run(
        &["--contract", contract.to_str().unwrap()],
        &[
            "sh",
            "-c",
            "echo \"token=$API_TOKEN\"; echo \"token=$API_TOKEN\" >&2",
        ],
    );
    assert_eq!(run.code(), 0, "{}", run.describe());
    // The payload really had it (output streams to the caller unredacted).
    assert!(run.stdout().contains(&secret), "{}", run.describe());
    assert_secret_absent(&store, &run, &secret);
}
}

both_tiers! {
fn credential_values_never_reach_the_store(tier) {
    require_cells!();
    let _cells = shared();
    let store = Store::new();
    let secret = unique("cred-XYZ-");
    let yaml = "credentials:\n  - { name: tok, env: TOKEN, from_env: HOST_TOKEN }\n";
    let contract = store.write_contract(&tier.contract(Some(yaml)).unwrap());
    let run = store.cmd(
        &[
            "run",
            "--contract",
            contract.to_str().unwrap(),
            "--",
            "sh",
            "-c",
            "echo \"token=$TOKEN\"; echo \"token=$TOKEN\" >&2",
        ],
        None,
        &[("HOST_TOKEN", secret.as_str())],
    );
    assert_eq!(run.code(), 0, "{}", run.describe());
    assert!(run.stdout().contains(&secret), "{}", run.describe());
    assert_secret_absent(&store, &run, &secret);
}
}

fn is_hex64(v: &Value) -> bool {
    v.as_str()
        .is_some_and(|s| s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit()))
}

both_tiers! {
fn run_records_carry_hashes_class_and_timings(tier) {
    require_cells!();
    let _cells = shared();
    let store = Store::new();
    let contract = tier
        .contract(None)
        .map(|yaml| store.write_contract(&yaml).display().to_string());
    let run_with = |stdin: &[u8]| -> Value {
        let before: BTreeSet<String> = store
            .list()
            .iter()
            .map(|r| r["run_id"].as_str().unwrap().to_string())
            .collect();
        let mut args = vec!["run", "--workload-class", "hashing"];
        if let Some(contract) = &contract {
            args.extend(["--contract", contract.as_str()]);
        }
        args.extend(["--", "cat"]);
        let out = store.cmd(&args, Some(stdin), &[]);
        assert_eq!(out.code(), 0, "{}", out.describe());
        assert_eq!(out.output.stdout, stdin, "{}", out.describe());
        let new: Vec<Value> = store
            .list()
            .into_iter()
            .filter(|r| !before.contains(r["run_id"].as_str().unwrap()))
            .collect();
        assert_eq!(new.len(), 1, "{}", out.describe());
        store.show(new[0]["run_id"].as_str().unwrap())
    };
    let a = run_with(b"first input\n");
    let b = run_with(b"second input\n");
    let c = run_with(b"first input\n");
    for d in [&a, &b, &c] {
        let r = &d["run"];
        assert!(is_hex64(&r["input_sha256"]), "{d}");
        assert!(is_hex64(&r["contract_sha256"]), "{d}");
        assert_eq!(r["workload_class"], "hashing", "{d}");
        assert_eq!(r["plan"]["isolation"], tier.name(), "{d}");
        assert_eq!(r["status"], "ok", "{d}");
        assert_eq!(r["exit_code"], 0, "{d}");
        let startup = r["startup_ms"].as_f64().unwrap_or(-1.0);
        let wall = r["wall_ms"].as_f64().unwrap_or(-1.0);
        assert!(startup > 0.0 && wall >= startup, "{d}");
        assert!(r["finished_at"].as_i64().is_some(), "{d}");
        assert!(
            r["stdout_head"].as_str().unwrap_or("").contains("input"),
            "{d}"
        );
    }
    // stdin is read while the payload runs: its hash is recorded with the run's end, in
    // the result's `stdin`; the input hash (command and read-only inputs) is known at
    // the start.
    let stdin_hash = |d: &Value| d["run"]["result"]["stdin"]["sha256"].clone();
    for d in [&a, &b, &c] {
        assert!(is_hex64(&stdin_hash(d)), "{d}");
        assert_eq!(d["run"]["result"]["stdin"]["mode"], "relayed", "{d}");
        assert_eq!(d["run"]["result"]["stdin"]["eof"], true, "{d}");
    }
    assert_eq!(a["run"]["result"]["stdin"]["bytes"], 12);
    assert_ne!(
        stdin_hash(&a),
        stdin_hash(&b),
        "different stdin, different hash"
    );
    assert_eq!(stdin_hash(&a), stdin_hash(&c), "same stdin, same hash");
    assert_eq!(
        a["run"]["input_sha256"], c["run"]["input_sha256"],
        "same command and inputs, same input hash"
    );
    assert_eq!(a["run"]["contract_sha256"], b["run"]["contract_sha256"]);
    let verify = store.verify();
    assert_eq!(verify.code(), 0, "{}", verify.describe());
}
}

#[test]
fn stats_by_class_and_prune_keep_the_chain_verifiable() {
    require_cells!();
    let _cells = shared();
    let store = Store::new();
    for (class, n) in [("alpha", 3), ("beta", 2)] {
        for _ in 0..n {
            let run = store.run(&["--workload-class", class], &["true"]);
            assert_eq!(run.code(), 0, "{}", run.describe());
        }
    }
    let stats = store.airlock(&["stats", "--json"]);
    assert_eq!(stats.code(), 0, "{}", stats.describe());
    let s = stats.json();
    for (class, n) in [("alpha", 3), ("beta", 2)] {
        let c = &s[class];
        assert_eq!(c["runs"], n, "{class}: {}", stats.describe());
        assert_eq!(c["ok"], n, "{class}: {}", stats.describe());
        let p50 = c["startup_ms_p50"].as_f64().unwrap_or(-1.0);
        let p99 = c["startup_ms_p99"].as_f64().unwrap_or(-1.0);
        assert!(
            p50 > 0.0 && p99 >= p50,
            "{class}: p50 {p50} p99 {p99}: {}",
            stats.describe()
        );
    }
    assert!(
        s.get("default").is_none(),
        "no runs of class default: {}",
        stats.describe()
    );

    std::thread::sleep(Duration::from_millis(1100));
    let prune = store.airlock(&["runs", "prune", "--older-than", "1s"]);
    assert_eq!(prune.code(), 0, "{}", prune.describe());
    assert!(
        prune.stdout().contains("pruned 5 run"),
        "{}",
        prune.describe()
    );
    assert!(store.list().is_empty(), "{:?}", store.list());
    let verify = store.verify();
    assert_eq!(verify.code(), 0, "after prune: {}", verify.describe());

    // The store keeps working, and verifying, after a prune.
    let run = store.run(&["--workload-class", "alpha"], &["true"]);
    assert_eq!(run.code(), 0, "{}", run.describe());
    let prune0 = store.airlock(&["runs", "prune", "--older-than", "0s"]);
    assert_eq!(prune0.code(), 0, "{}", prune0.describe());
    assert!(store.list().is_empty(), "{:?}", store.list());
    let verify = store.verify();
    assert_eq!(
        verify.code(),
        0,
        "after second prune: {}",
        verify.describe()
    );
}

/// Every class a run can end in is a status the store accepts, and nothing else is: the
/// cell crate and the store crate name the classes on their own (neither depends on the
/// other).
#[test]
fn result_classes_and_the_stores_finish_statuses_are_the_same_names() {
    let classes: Vec<&str> = airlock_cell::report::ResultClass::ALL
        .iter()
        .map(|c| c.as_str())
        .collect();
    assert_eq!(classes, airlock_store::FINISH_STATUSES);
}
