//! Integration tests of the audit store. Some spawn this test binary again as a child
//! process (`AIRLOCK_STORE_CHILD`), some need root for mounts (CI runs as root).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod records;

use airlock_store::*;
use records::{end, start};
use serde_json::json;

const CHILD_ENV: &str = "AIRLOCK_STORE_CHILD";

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(2).map(|u| u == "0"))
        })
        .unwrap_or(false)
}

fn sh(cmd: &str, args: &[&str]) {
    let st = Command::new(cmd).args(args).status().expect(cmd);
    assert!(st.success(), "{cmd} {args:?} failed: {st}");
}

/// Unmounts on drop, so a failing assertion does not leave mounts behind.
struct Mount(PathBuf);
impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// Entry point of child processes; a no-op in a normal test run.
#[test]
fn child_process() {
    let Ok(mode) = std::env::var(CHILD_ENV) else {
        return;
    };
    let (what, dir) = mode.split_once(':').expect("mode:dir");
    // Start line: all children open the store at the same moment.
    if let Ok(go) = std::env::var("AIRLOCK_STORE_GO") {
        let deadline = Instant::now() + Duration::from_secs(60);
        while !Path::new(&go).exists() {
            assert!(Instant::now() < deadline, "no start signal");
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    let store = Store::open(Path::new(dir)).expect("open");
    let h = store
        .begin_run(start("child"), vec!["child-secret-value".into()])
        .expect("begin");
    println!("RUN_ID={}", h.run_id());
    match what {
        "write" => {
            store
                .append_event(&h, kinds::POLICY_DECISION, json!({"decision": "allow"}))
                .expect("event");
            store.finish_run(&h, end("ok")).expect("finish");
        }
        "hang" => {
            std::thread::sleep(Duration::from_secs(120));
        }
        other => panic!("unknown child mode {other}"),
    }
}

fn spawn_child(mode: &str, dir: &Path, go: Option<&Path>) -> std::process::Child {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    if let Some(go) = go {
        cmd.env("AIRLOCK_STORE_GO", go);
    }
    cmd.args([
        "--exact",
        "child_process",
        "--nocapture",
        "--test-threads=1",
    ])
    .env(CHILD_ENV, format!("{mode}:{}", dir.display()))
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .expect("spawn child")
}

fn run_id_from(out: &str) -> Option<String> {
    // The harness prints "test child_process ... " before the child's own output.
    out.lines().find_map(|l| {
        l.split_once("RUN_ID=")
            .and_then(|(_, rest)| rest.split_whitespace().next().map(str::to_string))
    })
}

#[test]
fn begin_event_finish_roundtrip() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    assert_eq!(store.schema_version().unwrap(), SCHEMA_VERSION);
    let h = store.begin_run(start(""), vec![]).unwrap();
    let id = h.run_id();
    assert_eq!(uuid_version(&id), 7);
    let running = store.show_run(&id).unwrap().unwrap();
    assert_eq!(running.run.status, "running");
    assert_eq!(running.run.workload_class, "default");
    assert_eq!(running.run.supervisor_pid, std::process::id());
    store
        .append_event(
            &h,
            kinds::EGRESS_DECISION,
            json!({"decision": "deny", "reason_code": "egress.private_address"}),
        )
        .unwrap();
    let mut e = end("capacity_exceeded");
    e.limit_fired = Some("wall_time".into());
    e.exit_signal = Some(9);
    e.exit_code = None;
    store.finish_run(&h, e).unwrap();
    let d = store.show_run(&id).unwrap().unwrap();
    assert_eq!(d.run.status, "capacity_exceeded");
    assert_eq!(d.run.exit_signal, Some(9));
    assert_eq!(d.run.limit_fired.as_deref(), Some("wall_time"));
    assert_eq!(d.run.startup_ms, Some(2.5));
    assert_eq!(d.run.usage["pids_peak"], 1);
    assert_eq!(d.run.cleanup_ok, Some(true));
    assert!(d.run.finished_at.unwrap() >= d.run.started_at);
    let kinds: Vec<_> = d.events.iter().map(|e| e.kind.as_str()).collect();
    assert_eq!(kinds, ["run.begin", "egress.decision", "run.finish"]);

    // Finishing twice, unknown statuses and reserved kinds are refused.
    let err = store.finish_run(&h, end("ok")).unwrap_err();
    assert_eq!(err.class(), ErrorClass::Conflict, "{err}");
    let h2 = store.begin_run(start("x"), vec![]).unwrap();
    assert_eq!(
        store.finish_run(&h2, end("fine")).unwrap_err().class(),
        ErrorClass::InvalidInput
    );
    assert_eq!(
        store
            .append_event(&h2, "run.finish", json!({}))
            .unwrap_err()
            .class(),
        ErrorClass::InvalidInput
    );
    assert!(store.show_run("nope").unwrap().is_none());
    let report = store.verify().unwrap();
    assert_eq!((report.entries, report.runs), (4, 2));
}

fn uuid_version(id: &str) -> u32 {
    // xxxxxxxx-xxxx-Vxxx-...
    id.as_bytes()[14].to_ascii_lowercase() as u32 - b'0' as u32
}

#[test]
fn list_runs_filters() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let a = store.begin_run(start("alpha"), vec![]).unwrap();
    store.finish_run(&a, end("ok")).unwrap();
    std::thread::sleep(Duration::from_millis(3));
    let b = store.begin_run(start("beta"), vec![]).unwrap();
    store.finish_run(&b, end("task_error")).unwrap();
    let c = store.begin_run(start("beta"), vec![]).unwrap();
    let all = store.list_runs(&RunFilter::default()).unwrap();
    assert_eq!(all.len(), 3);
    assert_eq!(all[0].run_id, c.run_id(), "newest first");
    let f = |status: Option<&str>, class: Option<&str>| RunFilter {
        status: status.map(Into::into),
        workload_class: class.map(Into::into),
        ..Default::default()
    };
    assert_eq!(store.list_runs(&f(Some("running"), None)).unwrap().len(), 1);
    assert_eq!(store.list_runs(&f(None, Some("beta"))).unwrap().len(), 2);
    assert_eq!(
        store.list_runs(&f(Some("ok"), Some("beta"))).unwrap().len(),
        0
    );
    let since = RunFilter {
        since: Some(b.started_at()),
        ..Default::default()
    };
    assert_eq!(store.list_runs(&since).unwrap().len(), 2);
    let until = RunFilter {
        until: Some(b.started_at()),
        ..Default::default()
    };
    assert_eq!(store.list_runs(&until).unwrap()[0].run_id, a.run_id());
    let lim = RunFilter {
        limit: Some(1),
        ..Default::default()
    };
    assert_eq!(store.list_runs(&lim).unwrap().len(), 1);
}

#[test]
fn thirty_two_processes_write_concurrently() {
    let dir = tempfile::tempdir().unwrap();
    // Children open a store that does not exist yet: creation and migration race too.
    let go = tempfile::tempdir().unwrap();
    let go = go.path().join("go");
    let children: Vec<_> = (0..32)
        .map(|_| spawn_child("write", dir.path(), Some(&go)))
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    std::fs::write(&go, b"").unwrap();
    let mut ids = Vec::new();
    for child in children {
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "child failed: {out:?}");
        ids.push(run_id_from(&String::from_utf8_lossy(&out.stdout)).expect("run id"));
    }
    let mut unique = ids.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), 32);
    let store = Store::open(dir.path()).unwrap();
    let runs = store.list_runs(&RunFilter::default()).unwrap();
    assert_eq!(runs.len(), 32);
    assert!(runs.iter().all(|r| r.status == "ok"));
    let mut stored: Vec<_> = runs.iter().map(|r| r.run_id.clone()).collect();
    stored.sort();
    assert_eq!(stored, unique);
    let report = store.verify().unwrap();
    assert_eq!((report.entries, report.runs, report.head_seq), (96, 32, 96));
}

#[test]
fn sigkilled_supervisor_is_reaped_as_aborted() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    // A run of this (live) process must survive the reaper.
    let mine = store.begin_run(start("x"), vec![]).unwrap();

    let mut child = spawn_child("hang", dir.path(), None);
    let mut line = String::new();
    let mut reader = BufReader::new(child.stdout.take().unwrap());
    let id = loop {
        line.clear();
        assert!(
            reader.read_line(&mut line).unwrap() > 0,
            "child exited early"
        );
        if let Some(id) = run_id_from(&line) {
            break id;
        }
    };
    assert_eq!(store.show_run(&id).unwrap().unwrap().run.status, "running");
    // While the child lives, nothing is reaped.
    assert!(store.reap_aborted().unwrap().is_empty());
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();

    let reaped = store.reap_aborted().unwrap();
    assert_eq!(reaped, vec![id.clone()]);
    let d = store.show_run(&id).unwrap().unwrap();
    assert_eq!(d.run.status, "aborted");
    assert!(d.run.finished_at.is_some());
    let last = d.events.last().unwrap();
    assert_eq!(last.kind, kinds::RUN_ABORTED);
    assert!(
        last.body["reason"].as_str().unwrap().contains("gone"),
        "{last:?}"
    );
    assert_eq!(
        store.show_run(&mine.run_id()).unwrap().unwrap().run.status,
        "running"
    );
    assert!(store.reap_aborted().unwrap().is_empty(), "reaped twice");
    store.verify().unwrap();
}

#[test]
fn read_only_store_is_refused_clearly() {
    if !is_root() {
        eprintln!(
            "SKIPPED read_only_store_is_refused_clearly: needs root for a read-only bind mount"
        );
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("state");
    {
        let store = Store::open(&dir).unwrap();
        let h = store.begin_run(start("x"), vec![]).unwrap();
        store.finish_run(&h, end("ok")).unwrap();
    }
    let d = dir.to_str().unwrap();
    sh("mount", &["--bind", d, d]);
    let _m = Mount(dir.clone());
    sh("mount", &["-o", "remount,bind,ro", d]);
    // Root ignores mode bits, but not a read-only mount.
    assert!(
        std::fs::write(dir.join("probe"), b"x").is_err(),
        "mount is not read-only"
    );

    let err = Store::open(&dir)
        .and_then(|s| s.begin_run(start("x"), vec![]))
        .unwrap_err();
    eprintln!("read-only store error: {err}");
    assert_eq!(err.class(), ErrorClass::ReadOnly, "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains(&format!(
            "audit store {}/airlock.db is read-only",
            dir.display()
        )),
        "{msg}"
    );
}

#[test]
fn full_disk_fails_begin_run_clearly() {
    if !is_root() {
        eprintln!("SKIPPED full_disk_fails_begin_run_clearly: needs root to mount a tmpfs");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let mnt = tmp.path().join("tiny");
    std::fs::create_dir(&mnt).unwrap();
    sh(
        "mount",
        &[
            "-t",
            "tmpfs",
            "-o",
            "size=512k",
            "tmpfs",
            mnt.to_str().unwrap(),
        ],
    );
    let _m = Mount(mnt.clone());
    let dir = mnt.join("state");
    let store = Store::open(&dir).unwrap();
    let h = store.begin_run(start("x"), vec![]).unwrap();
    store.finish_run(&h, end("ok")).unwrap();

    // Fill the file system.
    let filler = mnt.join("filler");
    {
        use std::io::Write;
        let mut f = std::fs::File::create(&filler).unwrap();
        let block = vec![0u8; 4096];
        while f.write_all(&block).is_ok() {}
    }
    let big = RunStart {
        argv: vec!["x".repeat(16 * 1024)],
        ..start("x")
    };
    let err = store.begin_run(big, vec![]).unwrap_err();
    eprintln!("full disk error: {err}");
    assert_eq!(err.class(), ErrorClass::DiskFull, "{err}");
    assert!(err.to_string().contains("disk full"), "{err}");
    assert!(err.to_string().contains("airlock.db"), "{err}");
    let small = store.begin_run(start("x"), vec![]);
    assert!(small.is_err(), "a small begin_run must not fit either");

    // Nothing half-written: after freeing space the store works and verifies.
    std::fs::remove_file(&filler).unwrap();
    let h = store.begin_run(start("x"), vec![]).unwrap();
    store.finish_run(&h, end("ok")).unwrap();
    assert_eq!(store.verify().unwrap().runs, 2);
}

/// A store with three finished runs of three entries each plus one event.
fn populated(dir: &Path) -> (Store, Vec<String>) {
    let store = Store::open(dir).unwrap();
    let mut ids = vec![];
    for i in 0..3 {
        let h = store.begin_run(start("t"), vec![]).unwrap();
        store
            .append_event(
                &h,
                kinds::ARTIFACT_KEPT,
                json!({"path": format!("out/{i}"), "sha256": "c".repeat(64)}),
            )
            .unwrap();
        store.finish_run(&h, end("ok")).unwrap();
        ids.push(h.run_id());
    }
    store.verify().unwrap();
    (store, ids)
}

fn raw(dir: &Path) -> rusqlite::Connection {
    rusqlite::Connection::open(dir.join(DB_FILE)).unwrap()
}

fn tampered(store: &Store) -> ChainBreak {
    match store.verify() {
        Err(StoreError::Tampered(b)) => b,
        other => panic!("tampering not detected: {other:?}"),
    }
}

#[test]
fn editing_a_run_row_is_detected() {
    let dir = tempfile::tempdir().unwrap();
    let (store, ids) = populated(dir.path());
    raw(dir.path())
        .execute("UPDATE runs SET exit_code = 3 WHERE run_id = ?1", [&ids[1]])
        .unwrap();
    let b = tampered(&store);
    assert_eq!(b.run_id.as_deref(), Some(ids[1].as_str()));
    assert!(b.reason.contains("exit_code"), "{b}");
    assert!(store.verify().unwrap_err().to_string().contains(&ids[1]));

    // Also a status flip (e.g. hiding a policy denial) on another run.
    raw(dir.path())
        .execute("UPDATE runs SET exit_code = 0 WHERE run_id = ?1", [&ids[1]])
        .unwrap();
    store.verify().unwrap();
    raw(dir.path())
        .execute(
            "UPDATE runs SET stdout_head = 'nothing to see' WHERE run_id = ?1",
            [&ids[2]],
        )
        .unwrap();
    assert_eq!(tampered(&store).run_id.as_deref(), Some(ids[2].as_str()));
}

#[test]
fn editing_or_deleting_a_runs_plan_is_detected() {
    // The plan has a table of its own (schema RUN_PLANS); verify reads it as the row's.
    let dir = tempfile::tempdir().unwrap();
    let (store, ids) = populated(dir.path());
    raw(dir.path())
        .execute(
            "UPDATE run_plans SET plan_json = '{\"net\":\"host\"}' WHERE run_id = ?1",
            [&ids[0]],
        )
        .unwrap();
    let b = tampered(&store);
    assert_eq!(b.run_id.as_deref(), Some(ids[0].as_str()));
    assert!(b.reason.contains("plan"), "{b}");

    let dir = tempfile::tempdir().unwrap();
    let (store, ids) = populated(dir.path());
    raw(dir.path())
        .execute("DELETE FROM run_plans WHERE run_id = ?1", [&ids[1]])
        .unwrap();
    assert_eq!(tampered(&store).run_id.as_deref(), Some(ids[1].as_str()));
}

#[test]
fn deleting_or_inserting_a_run_row_is_detected() {
    let dir = tempfile::tempdir().unwrap();
    let (store, ids) = populated(dir.path());
    raw(dir.path())
        .execute("DELETE FROM runs WHERE run_id = ?1", [&ids[0]])
        .unwrap();
    let b = tampered(&store);
    assert_eq!(b.run_id.as_deref(), Some(ids[0].as_str()));
    assert!(b.reason.contains("missing"), "{b}");

    let dir = tempfile::tempdir().unwrap();
    let (store, _) = populated(dir.path());
    raw(dir.path())
        .execute(
            "INSERT INTO runs SELECT 'forged', started_at, finished_at, argv_json, input_sha256,
                contract_sha256, workload_class, plan_json, status, exit_code, exit_signal,
                limit_fired, usage_json, startup_ms, wall_ms, stdout_head, stdout_tail,
                stderr_head, stderr_tail, cleanup_ok, cleanup_leftovers_json, result_json,
                supervisor_pid, supervisor_start_time, boot_id, caller_uid, session_id, tenant, node
                FROM runs LIMIT 1",
            [],
        )
        .unwrap();
    let b = tampered(&store);
    assert_eq!(b.run_id.as_deref(), Some("forged"));
}

#[test]
fn editing_an_event_is_detected() {
    let dir = tempfile::tempdir().unwrap();
    let (store, ids) = populated(dir.path());
    // seq 5 is the artifact event of the second run.
    raw(dir.path())
        .execute(
            "UPDATE audit_log SET body_json = replace(body_json, 'out/1', 'out/evil') WHERE seq = 5",
            [],
        )
        .unwrap();
    let b = tampered(&store);
    assert_eq!(b.seq, Some(5));
    assert_eq!(b.run_id.as_deref(), Some(ids[1].as_str()));
    assert!(b.reason.contains("edited"), "{b}");
}

#[test]
fn editing_an_entry_and_its_hash_is_detected_by_the_next_entry() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _) = populated(dir.path());
    let c = raw(dir.path());
    let (prev, run, kind, at, body): (String, String, String, i64, String) = c
        .query_row(
            "SELECT prev_hash, run_id, kind, at, body_json FROM audit_log WHERE seq = 5",
            [],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?)),
        )
        .unwrap();
    let body = body.replace("out/1", "out/evil");
    let h = entry_hash(&prev, 5, Some(&run), &kind, at, &body);
    c.execute(
        "UPDATE audit_log SET body_json = ?1, hash = ?2 WHERE seq = 5",
        rusqlite::params![body, h],
    )
    .unwrap();
    assert_eq!(tampered(&store).seq, Some(6));
}

#[test]
fn deleting_entries_is_detected() {
    for (seq, expect_seq, words) in [
        (5, 6, "missing"),
        (1, 2, "prune checkpoint"),
        (9, 8, "head"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let (store, _) = populated(dir.path());
        raw(dir.path())
            .execute("DELETE FROM audit_log WHERE seq = ?1", [seq])
            .unwrap();
        let b = tampered(&store);
        assert_eq!(b.seq, Some(expect_seq), "deleting seq {seq}: {b}");
        assert!(b.reason.contains(words), "deleting seq {seq}: {b}");
    }
}

#[test]
fn secrets_never_reach_the_store() {
    const SECRET: &str = "sk-LIVE-9f8e7d6c5b4a39281706";
    const HALF_A: &str = "sk-LIVE-9f8e7";
    const HALF_B: &str = "d6c5b4a39281706";
    assert_eq!(format!("{HALF_A}{HALF_B}"), SECRET);
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let st = RunStart {
        argv: vec!["curl".into(), format!("-HAuthorization: Bearer {SECRET}")],
        plan_json: json!({"env": {"API_KEY": SECRET}, SECRET: 1}),
        ..start("s")
    };
    let h = store
        .begin_run(st, vec![SECRET.into(), "other-secret".into()])
        .unwrap();
    store
        .append_event(
            &h,
            kinds::EGRESS_DECISION,
            json!({"decision": "deny", "url": format!("https://x/?k={SECRET}")}),
        )
        .unwrap();
    let e = RunEnd {
        stdout_head: format!("token {SECRET}\nand the start of {HALF_A}"),
        stdout_tail: format!("{HALF_B} end"),
        stderr_head: format!("err {SECRET}"),
        stderr_tail: format!("{} more", &SECRET[6..]),
        usage: json!({"note": SECRET}),
        cleanup_leftovers: json!([SECRET]),
        result_json: json!({"stdout": SECRET}),
        ..end("ok")
    };
    store.finish_run(&h, e).unwrap();
    let d = store.show_run(&h.run_id()).unwrap().unwrap();
    assert!(d
        .run
        .stdout_head
        .as_deref()
        .unwrap()
        .ends_with("start of [REDACTED]"));
    assert_eq!(d.run.stdout_tail.as_deref(), Some("[REDACTED] end"));
    assert!(d.run.argv[1].contains("[REDACTED]"));

    let mut export = Vec::new();
    let lines = store.export_jsonl(&mut export).unwrap();
    assert_eq!(lines, 4);
    for l in export.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
        serde_json::from_slice::<serde_json::Value>(l).expect("valid JSON line");
    }

    let needles = [SECRET, HALF_A, HALF_B, &SECRET[6..]];
    let check = |what: &str, bytes: &[u8]| {
        for n in needles {
            assert!(
                !bytes.windows(n.len()).any(|w| w == n.as_bytes()),
                "{n:?} found in {what}"
            );
        }
    };
    check("export", &export);
    // The WAL holds the data before the checkpoint, the main file after it.
    for stage in ["before checkpoint", "after checkpoint"] {
        for suffix in ["", "-wal", "-shm"] {
            let p = dir.path().join(format!("{DB_FILE}{suffix}"));
            if let Ok(bytes) = std::fs::read(&p) {
                check(&format!("{} {stage}", p.display()), &bytes);
            }
        }
        store.checkpoint().unwrap();
    }
    // The check itself can fail: the event was really written.
    let db = std::fs::read(dir.path().join(DB_FILE)).unwrap();
    assert!(db
        .windows(b"egress.decision".len())
        .any(|w| w == b"egress.decision"));
    store.verify().unwrap();
}

#[test]
fn prune_removes_old_runs_and_keeps_the_chain_verifiable() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let mut old = vec![];
    for _ in 0..2 {
        let h = store.begin_run(start("p"), vec![]).unwrap();
        store
            .append_event(&h, kinds::CLEANUP, json!({"ok": true}))
            .unwrap();
        store.finish_run(&h, end("ok")).unwrap();
        old.push(h.run_id());
    }
    let running = store.begin_run(start("p"), vec![]).unwrap();
    let later = store.begin_run(start("p"), vec![]).unwrap();
    store.finish_run(&later, end("ok")).unwrap();
    std::thread::sleep(Duration::from_millis(5));

    assert_eq!(
        store.prune(Duration::from_secs(3600)).unwrap(),
        0,
        "nothing is an hour old"
    );
    // `later` is old enough but its entries come after the running run's begin: it stays
    // until that run ends, so only a prefix of the chain is ever removed.
    assert_eq!(store.prune(Duration::ZERO).unwrap(), 2);
    let report = store.verify().unwrap();
    assert_eq!(report.first_seq, Some(7));
    let left: Vec<_> = store
        .list_runs(&RunFilter::default())
        .unwrap()
        .into_iter()
        .map(|r| r.run_id)
        .collect();
    assert_eq!(left, vec![later.run_id(), running.run_id()]);
    assert!(store.show_run(&old[0]).unwrap().is_none());

    store.finish_run(&running, end("task_error")).unwrap();
    std::thread::sleep(Duration::from_millis(5));
    assert_eq!(store.prune(Duration::ZERO).unwrap(), 2);
    store.verify().unwrap();
    assert!(store.list_runs(&RunFilter::default()).unwrap().is_empty());
    let plans: i64 = raw(dir.path())
        .query_row("SELECT count(*) FROM run_plans", [], |r| r.get(0))
        .unwrap();
    assert_eq!(plans, 0, "a pruned run's plan is pruned with it");
    let h = store.begin_run(start("p"), vec![]).unwrap();
    store.finish_run(&h, end("ok")).unwrap();
    let report = store.verify().unwrap();
    assert_eq!(report.runs, 1);

    // The checkpoint is load-bearing: deleting it is detected.
    raw(dir.path())
        .execute("DELETE FROM audit_log WHERE kind = 'store.prune'", [])
        .unwrap();
    assert!(matches!(store.verify(), Err(StoreError::Tampered(_))));
}

const FIXTURE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/v1.db");

/// Regenerates tests/fixtures/v1.db with the schema-1 code path:
/// `cargo test -p airlock-store --test store -- --ignored generate_v1_fixture`
#[test]
#[ignore]
fn generate_v1_fixture() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = Store::open_with_schema(dir.path(), 1).unwrap();
        assert_eq!(store.schema_version().unwrap(), 1);
        let h = store
            .begin_run(start("fixture"), vec!["fixture-secret".into()])
            .unwrap();
        store
            .append_event(&h, kinds::POLICY_DECISION, json!({"decision": "deny", "reason_code": "egress.not_allowlisted", "note": "fixture-secret"}))
            .unwrap();
        store.finish_run(&h, end("policy_denied")).unwrap();
        let h = store.begin_run(start("fixture"), vec![]).unwrap();
        store.finish_run(&h, end("ok")).unwrap();
        store.begin_run(start("other"), vec![]).unwrap();
        store.verify().unwrap();
    }
    let c = raw(dir.path());
    let mode: String = c
        .query_row("PRAGMA journal_mode = DELETE", [], |r| r.get(0))
        .unwrap();
    assert_eq!(mode, "delete");
    drop(c);
    std::fs::create_dir_all(Path::new(FIXTURE).parent().unwrap()).unwrap();
    std::fs::copy(dir.path().join(DB_FILE), FIXTURE).unwrap();
}

#[test]
fn v1_fixture_migrates_without_loss() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(FIXTURE, dir.path().join(DB_FILE)).unwrap();
    let (v, head, runs, entries): (i64, String, i64, i64) = {
        let c = raw(dir.path());
        let v = c
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .unwrap();
        let head = c
            .query_row("SELECT hash FROM chain_head", [], |r| r.get(0))
            .unwrap();
        let runs = c
            .query_row("SELECT count(*) FROM runs", [], |r| r.get(0))
            .unwrap();
        let entries = c
            .query_row("SELECT count(*) FROM audit_log", [], |r| r.get(0))
            .unwrap();
        (v, head, runs, entries)
    };
    assert_eq!((v, runs, entries), (1, 3, 6));

    let store = Store::open(dir.path()).unwrap();
    assert_eq!(store.schema_version().unwrap(), SCHEMA_VERSION);
    let report = store.verify().unwrap();
    assert_eq!((report.runs, report.entries), (3, 6));
    assert_eq!(
        report.head_hash, head,
        "migration must not rewrite the chain"
    );
    let indexes: i64 = raw(dir.path())
        .query_row(
            "SELECT count(*) FROM sqlite_master WHERE type = 'index' AND name LIKE 'runs_%'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(indexes, 2);
    let denied = store
        .list_runs(&RunFilter {
            status: Some("policy_denied".into()),
            ..Default::default()
        })
        .unwrap();
    assert_eq!(denied.len(), 1);
    let d = store.show_run(&denied[0].run_id).unwrap().unwrap();
    assert_eq!(d.events[1].body["reason_code"], "egress.not_allowlisted");
    assert_eq!(d.events[1].body["note"], "[REDACTED]");
    assert_eq!(store.stats().unwrap()["fixture"].runs, 2);
    // Runs recorded before version 3 have no caller; new ones have the real uid.
    let old_runs = store.list_runs(&RunFilter::default()).unwrap();
    assert!(old_runs.iter().all(|r| r.caller_uid.is_none()));
    // The migrated store keeps working on the same chain.
    let h = store.begin_run(start("new"), vec![]).unwrap();
    store.finish_run(&h, end("ok")).unwrap();
    assert_eq!(store.verify().unwrap().entries, 8);
    let mine = store
        .list_runs(&RunFilter {
            caller_uid: Some(real_uid()),
            ..Default::default()
        })
        .unwrap();
    assert_eq!(mine.len(), 1, "only the run started after the migration");
    assert_eq!(mine[0].run_id, h.run_id());
}

/// Real uid of this test process, as the kernel reports it.
fn real_uid() -> u32 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("Uid:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[test]
fn newer_schema_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    drop(Store::open(dir.path()).unwrap());
    raw(dir.path())
        .execute_batch("PRAGMA user_version = 99")
        .unwrap();
    let err = Store::open(dir.path()).unwrap_err();
    assert_eq!(err.class(), ErrorClass::Corrupt);
    assert!(err.to_string().contains("schema version 99"), "{err}");
}

#[test]
fn default_state_dir_follows_euid_and_xdg() {
    let d = default_state_dir();
    if is_root() {
        assert_eq!(d, PathBuf::from("/var/lib/airlock"));
    } else {
        assert!(d.ends_with("airlock"), "{}", d.display());
    }
}

/// Cost of the per-tool-call path: open the store, begin, finish. Prints the figure;
/// the bound is loose because this runs in debug builds on a shared 2-core box (see
/// `examples/store_bench.rs` for the release-build measurement).
#[test]
fn open_begin_finish_is_cheap() {
    let dir = tempfile::tempdir().unwrap();
    drop(Store::open(dir.path()).unwrap());
    let n = 200;
    let t = Instant::now();
    for _ in 0..n {
        let store = Store::open(dir.path()).unwrap();
        let h = store
            .begin_run(start("bench"), vec!["s3cret".into()])
            .unwrap();
        store.finish_run(&h, end("ok")).unwrap();
    }
    let per = t.elapsed() / n;
    eprintln!("open+begin+finish (debug build): {per:?} per run");
    assert!(per < Duration::from_millis(20), "{per:?}");
}

#[test]
fn a_state_dir_others_can_write_to_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let Err(err) = Store::open(dir.path()) else {
        panic!("a state dir others can write to was opened")
    };
    assert_eq!(err.class(), ErrorClass::InvalidInput);
    assert!(
        err.to_string()
            .contains("writable by other users (mode 777)"),
        "{err}"
    );
    assert!(!dir.path().join(DB_FILE).exists(), "nothing was created");
}

#[test]
fn a_link_planted_at_a_journal_name_is_not_written_through() {
    let dir = tempfile::tempdir().unwrap();
    let victim = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(victim.path(), b"victim").unwrap();
    drop(Store::open(dir.path()).unwrap());
    for (name, hard) in [("airlock.db-wal", false), ("airlock.db-shm", true)] {
        let planted = dir.path().join(name);
        let _ = std::fs::remove_file(&planted);
        if hard {
            std::fs::hard_link(victim.path(), &planted).unwrap();
        } else {
            std::os::unix::fs::symlink(victim.path(), &planted).unwrap();
        }
        let Err(err) = Store::open(dir.path()) else {
            panic!("a state dir others can write to was opened")
        };
        assert!(
            err.to_string()
                .contains(&format!("{name} is not a plain file")),
            "{err}"
        );
        std::fs::remove_file(&planted).unwrap();
    }
    assert_eq!(std::fs::read(victim.path()).unwrap(), b"victim");
    // With the links gone the store opens again, its records intact.
    Store::open(dir.path()).unwrap().verify().unwrap();
}

/// Frames in the WAL after `runs` begin+finish pairs with a large plan, and what a
/// passive checkpoint then copied (`leave`: checkpoints left to the caller).
fn wal_after(runs: usize, leave: bool) -> (i64, i64) {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    if leave {
        store.leave_checkpoints_to_caller().unwrap();
    }
    // About a page and a half of plan per record, like a compiled plan's JSON.
    let mut begin = start("wal");
    begin.plan_json = json!({ "layout": "x".repeat(6000) });
    for _ in 0..runs {
        let handle = store.begin_run(begin.clone(), vec![]).unwrap();
        store.finish_run(&handle, end("ok")).unwrap();
    }
    let checkpointed = store.checkpoint_passive().unwrap();
    store.verify().unwrap();
    checkpointed
}

/// WAL frames written by `runs` begin records with a compiled plan's size (~10 KB: three
/// overflow pages), each followed by its finish record when `finish`.
fn wal_frames_of(runs: usize, finish: bool) -> i64 {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    store.leave_checkpoints_to_caller().unwrap();
    let mut begin = start("wal");
    begin.plan_json = json!({ "layout": "x".repeat(9500) });
    for _ in 0..runs {
        let handle = store.begin_run(begin.clone(), vec![]).unwrap();
        if finish {
            store.finish_run(&handle, end("ok")).unwrap();
        }
    }
    store.checkpoint_passive().unwrap().0
}

#[test]
fn a_finish_record_does_not_rewrite_the_plan() {
    // With the plan in the `runs` row, each finish record's UPDATE rewrote its overflow
    // pages (and freed the old ones: a freelist page and page 1 too).
    let runs = 20;
    let (pairs, begins) = (wal_frames_of(runs, true), wal_frames_of(runs, false));
    let per_finish = (pairs - begins) as f64 / runs as f64;
    eprintln!("{runs} begin+finish: {pairs} WAL frames, {runs} begins: {begins}");
    assert!(
        per_finish <= 6.0,
        "{per_finish} WAL frames per finish record"
    );
}

#[test]
fn a_caller_that_checkpoints_itself_gets_no_checkpoint_inside_a_commit() {
    // With the automatic checkpoint, the WAL never grows much past its threshold: some
    // commit paid for a checkpoint. Left to the caller, it grows until the caller's
    // passive checkpoint copies all of it.
    let threshold = i64::from(WAL_AUTOCHECKPOINT_PAGES);
    let (automatic, _) = wal_after(60, false);
    assert!(automatic < threshold + 50, "{automatic} frames");
    let (frames, copied) = wal_after(60, true);
    assert!(
        frames > threshold + 50,
        "{frames} frames: a commit checkpointed"
    );
    assert_eq!(
        copied, frames,
        "the passive checkpoint copied the whole WAL"
    );
}
