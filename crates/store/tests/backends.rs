//! The store's semantics, run against both backends: the embedded SQLite file and a
//! fleet's Postgres (a real server this test starts: tests/pg_server). Each `backend_test!`
//! is one test per backend (`..::sqlite`, `..::postgres`), so a rule that holds for one and
//! not the other fails by name. SQLite-only matters (the state directory's files, WAL,
//! read-only and full disks, old-schema fixtures) stay in tests/store.rs.

#[path = "pg_server/mod.rs"]
mod pg_server;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod records;

use airlock_store::*;
use pg_server::{PgServer, TestPki};
use records::{end, start};
use serde_json::json;

const CHILD_ENV: &str = "AIRLOCK_STORE_BACKEND_CHILD";

/// One store under test: its location, and a raw SQL door for tampering.
struct Fixture {
    dir: tempfile::TempDir,
    server: Option<PgServer>,
    location: StoreLocation,
}

impl Fixture {
    fn sqlite() -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let location = StoreLocation::local(dir.path().join("state"));
        Fixture {
            dir,
            server: None,
            location,
        }
    }

    /// `None`: no Postgres binaries and skipping was asked for.
    fn postgres() -> Option<Fixture> {
        let server = PgServer::start()?;
        let url = server.create_db("airlock");
        let dir = tempfile::tempdir().unwrap();
        let location = StoreLocation {
            state_dir: dir.path().join("state"),
            postgres: Some(fleet(&url, "node-a")),
            spool_max_files: airlock_store::spool::DEFAULT_MAX_FILES,
        };
        Some(Fixture {
            dir,
            server: Some(server),
            location,
        })
    }

    fn open(&self) -> Store {
        Store::open_at(&self.location).unwrap()
    }

    /// Runs `sql` on the backend's database directly, as someone with write access to it.
    fn tamper(&self, sql: &str) {
        match &self.server {
            Some(pg) => {
                pg.psql("airlock", sql);
            }
            None => {
                let db = self.location.state_dir.join(DB_FILE);
                rusqlite::Connection::open(db)
                    .unwrap()
                    .execute_batch(sql)
                    .unwrap();
            }
        }
    }

    fn scratch(&self) -> &Path {
        self.dir.path()
    }
}

/// The fleet store at `url` as node `node` opens it.
fn fleet(url: &str, node: &str) -> FleetStore {
    FleetStore {
        url: PostgresUrl::parse(url).unwrap(),
        node: NodeName::parse(node).unwrap(),
    }
}

macro_rules! backend_test {
    ($name:ident, $body:expr) => {
        mod $name {
            use super::*;
            #[test]
            fn sqlite() {
                let f: fn(&Fixture) = $body;
                f(&Fixture::sqlite());
            }
            #[test]
            fn postgres() {
                let f: fn(&Fixture) = $body;
                if let Some(fx) = Fixture::postgres() {
                    f(&fx);
                }
            }
        }
    };
}

fn tampered(store: &Store) -> ChainBreak {
    match store.verify() {
        Err(StoreError::Tampered(b)) => b,
        other => panic!("expected tampering to be detected, got {other:?}"),
    }
}

/// Three finished runs with an event each.
fn populated(store: &Store) -> Vec<String> {
    (0..3)
        .map(|i| {
            let h = store.begin_run(start("c"), vec![]).unwrap();
            store
                .append_event(
                    &h,
                    kinds::EGRESS_DECISION,
                    json!({"decision": "allow", "i": i}),
                )
                .unwrap();
            store.finish_run(&h, end("ok")).unwrap();
            h.run_id()
        })
        .collect()
}

backend_test!(begin_event_finish_roundtrip, |fx| {
    let store = fx.open();
    let h = store
        .begin_run(start("default"), vec!["s3cr3t-token".into()])
        .unwrap();
    let running = store.show_run(&h.run_id()).unwrap().unwrap();
    assert_eq!(running.run.status, STATUS_RUNNING);
    store
        .append_event(
            &h,
            kinds::POLICY_DECISION,
            json!({"decision": "deny", "reason_code": "net", "seen": "s3cr3t-token"}),
        )
        .unwrap();
    let mut e = end("task_error");
    e.exit_code = Some(3);
    e.stderr_tail = "token s3cr3t-token leaked".into();
    e.events = vec![(kinds::CLEANUP.into(), json!({"ok": true}))];
    store.finish_run(&h, e).unwrap();
    let d = store.show_run(&h.run_id()).unwrap().unwrap();
    assert_eq!(d.run.status, "task_error");
    assert_eq!(d.run.exit_code, Some(3));
    assert_eq!(d.run.argv, vec!["/bin/echo", "hi"]);
    assert_eq!(d.run.plan, json!({"net": "none"}));
    assert_eq!(d.run.cleanup_ok, Some(true));
    assert_eq!(d.run.usage["pids_peak"], 1);
    let kinds: Vec<&str> = d.events.iter().map(|e| e.kind.as_str()).collect();
    assert_eq!(
        kinds,
        [
            kinds::RUN_BEGIN,
            kinds::POLICY_DECISION,
            kinds::CLEANUP,
            kinds::RUN_FINISH
        ]
    );
    let mut exported = Vec::new();
    store.export_jsonl(&mut exported).unwrap();
    let exported = String::from_utf8(exported).unwrap();
    assert!(
        !exported.contains("s3cr3t-token"),
        "a secret reached the store"
    );
    assert_eq!(exported.lines().count(), 5);
    // Finishing twice is refused, and so is a reserved kind.
    let again = store.finish_run(&h, end("ok")).unwrap_err();
    assert_eq!(again.class(), ErrorClass::Conflict, "{again}");
    assert!(store
        .append_event(&h, kinds::RUN_FINISH, json!({}))
        .is_err());
    let report = store.verify().unwrap();
    assert_eq!((report.entries, report.runs, report.head_seq), (4, 1, 4));
    let stats = store.stats().unwrap();
    assert_eq!(stats["default"].denials.get("net"), Some(&1));
    assert_eq!(stats["default"].finished, 1);
});

backend_test!(list_runs_pages_go_on_after_the_cursor_each_run_once, |fx| {
    let store = fx.open();
    // Runs begun in the same millisecond share started_at: the run id decides their
    // order, so a page boundary between them neither repeats nor skips one.
    let mut by_tenant: std::collections::BTreeMap<&str, Vec<String>> = Default::default();
    for i in 0..23 {
        let tenant = if i % 3 == 0 { "t2" } else { "t1" };
        let mut s = start("paged");
        s.tenant = Some(tenant.into());
        let h = store.begin_run(s, vec![]).unwrap();
        by_tenant.entry(tenant).or_default().push(h.run_id());
    }
    for (tenant, begun) in &by_tenant {
        let mut walked = Vec::new();
        let mut before = None;
        loop {
            let page = store
                .list_runs(&RunFilter {
                    tenant: Some(tenant.to_string()),
                    limit: Some(4),
                    before: before.clone(),
                    ..Default::default()
                })
                .unwrap();
            assert!(page.iter().all(|r| r.tenant.as_deref() == Some(*tenant)));
            let Some(last) = page.last() else { break };
            before = Some((last.started_at, last.run_id.clone()));
            walked.extend(page.into_iter().map(|r| r.run_id));
        }
        let all: Vec<String> = store
            .list_runs(&RunFilter {
                tenant: Some(tenant.to_string()),
                ..Default::default()
            })
            .unwrap()
            .into_iter()
            .map(|r| r.run_id)
            .collect();
        assert_eq!(walked, all, "the pages are the whole list, in order");
        let mut sorted = walked.clone();
        sorted.sort();
        sorted.dedup();
        let mut expected = begun.clone();
        expected.sort();
        assert_eq!(sorted, expected, "each of the tenant's runs exactly once");
    }
});

backend_test!(list_runs_filters, |fx| {
    let store = fx.open();
    let a = store.begin_run(start("alpha"), vec![]).unwrap();
    let mut s = start("beta");
    s.tenant = Some("t1".into());
    s.session_id = Some("sess".into());
    let b = store.begin_run(s, vec![]).unwrap();
    store.finish_run(&a, end("ok")).unwrap();
    let all = store.list_runs(&RunFilter::default()).unwrap();
    assert_eq!(all.len(), 2);
    assert_eq!(all[0].run_id, b.run_id(), "newest first");
    let only = |f: RunFilter| {
        store
            .list_runs(&f)
            .unwrap()
            .into_iter()
            .map(|r| r.run_id)
            .collect::<Vec<_>>()
    };
    assert_eq!(
        only(RunFilter {
            status: Some("ok".into()),
            ..Default::default()
        }),
        [a.run_id()]
    );
    assert_eq!(
        only(RunFilter {
            workload_class: Some("beta".into()),
            tenant: Some("t1".into()),
            session_id: Some("sess".into()),
            ..Default::default()
        }),
        [b.run_id()]
    );
    assert_eq!(
        only(RunFilter {
            limit: Some(1),
            since: Some(0),
            ..Default::default()
        })
        .len(),
        1
    );
    assert!(only(RunFilter {
        until: Some(0),
        ..Default::default()
    })
    .is_empty());
    assert!(store.show_run("no-such-run").unwrap().is_none());
});

backend_test!(an_edited_run_row_is_named, |fx| {
    let store = fx.open();
    let ids = populated(&store);
    store.verify().unwrap();
    fx.tamper(&format!(
        "UPDATE runs SET status = 'ok', exit_code = 0 WHERE run_id = '{}'",
        ids[1]
    ));
    fx.tamper(&format!(
        "UPDATE runs SET stdout_head = 'forged' WHERE run_id = '{}'",
        ids[1]
    ));
    let b = tampered(&store);
    assert_eq!(b.run_id.as_deref(), Some(ids[1].as_str()), "{b}");
    assert!(b.reason.contains("stdout_head"), "{b}");
});

backend_test!(an_edited_entry_is_named, |fx| {
    let store = fx.open();
    let ids = populated(&store);
    // The event of the second run is seq 5 (begin 4, event 5, finish 6).
    fx.tamper("UPDATE audit_log SET body_json = '{\"decision\":\"deny\"}' WHERE seq = 5");
    let b = tampered(&store);
    assert_eq!(
        (b.seq, b.run_id.as_deref()),
        (Some(5), Some(ids[1].as_str()))
    );
    assert!(b.reason.contains("hash"), "{b}");
});

backend_test!(deleted_and_cut_off_entries_are_named, |fx| {
    let store = fx.open();
    populated(&store);
    fx.tamper("DELETE FROM audit_log WHERE seq = 9");
    let b = tampered(&store);
    assert!(b.reason.contains("head"), "cut-off end: {b}");
    fx.tamper("DELETE FROM audit_log WHERE seq = 4");
    let b = tampered(&store);
    assert_eq!(b.seq, Some(5), "{b}");
    assert!(b.reason.contains("missing"), "{b}");
});

backend_test!(a_deleted_run_row_is_named, |fx| {
    let store = fx.open();
    let ids = populated(&store);
    fx.tamper(&format!("DELETE FROM runs WHERE run_id = '{}'", ids[2]));
    let b = tampered(&store);
    assert_eq!(b.run_id.as_deref(), Some(ids[2].as_str()));
    assert!(b.reason.contains("missing"), "{b}");
});

backend_test!(prune_keeps_the_chain_verifiable, |fx| {
    let store = fx.open();
    let old = populated(&store);
    let young = store.begin_run(start("c"), vec![]).unwrap();
    std::thread::sleep(Duration::from_millis(30));
    assert_eq!(store.prune(Duration::from_millis(10)).unwrap(), 3);
    for id in &old {
        assert!(store.show_run(id).unwrap().is_none());
    }
    let report = store.verify().unwrap();
    assert_eq!(report.first_seq, Some(10), "{report:?}");
    assert_eq!(report.runs, 1);
    store.finish_run(&young, end("ok")).unwrap();
    store.verify().unwrap();
    // Deleting the checkpoint leaves a chain that starts nowhere.
    fx.tamper("DELETE FROM audit_log WHERE kind = 'store.prune'");
    let b = tampered(&store);
    assert!(b.reason.contains("prune checkpoint"), "{b}");
});

backend_test!(approvals_events_reach_the_runs_store, |fx| {
    // The policy layer appends `policy.decision` to a finished run by its id: it must
    // land in the chain that holds the run (the fleet's, with Postgres).
    let store = fx.open();
    let id = populated(&store).remove(0);
    store
        .append_run_event(&id, kinds::POLICY_DECISION, json!({"decision": "allow"}))
        .unwrap();
    let d = store.show_run(&id).unwrap().unwrap();
    assert_eq!(d.events.last().unwrap().kind, kinds::POLICY_DECISION);
    store.verify().unwrap();
    assert!(store
        .append_run_event("nope", kinds::POLICY_DECISION, json!({}))
        .is_err());
});

// ---- several processes ---------------------------------------------------------------

/// Entry point of child processes; a no-op in a normal test run. `write:N` writes N runs
/// from N threads, each with its own connection; `hang` begins a run and waits to be
/// killed.
#[test]
fn child_process() {
    let Ok(mode) = std::env::var(CHILD_ENV) else {
        return;
    };
    let location = StoreLocation {
        state_dir: PathBuf::from(std::env::var("AIRLOCK_STORE_DIR").unwrap()),
        postgres: std::env::var("AIRLOCK_STORE_URL").ok().map(|u| {
            let node = std::env::var("AIRLOCK_STORE_NODE").unwrap_or("node-a".into());
            fleet(&u, &node)
        }),
        spool_max_files: airlock_store::spool::DEFAULT_MAX_FILES,
    };
    // Another machine's process, as far as node claims go: another holder identity
    // (the library's test door; the binary only ever opens as its own process).
    let open = |location: &StoreLocation| match std::env::var("AIRLOCK_STORE_PID_NS") {
        Ok(ns) => Store::open_at_as_holder(location, holder(ns.parse().unwrap())),
        Err(_) => Store::open_at(location),
    };
    if let Ok(go) = std::env::var("AIRLOCK_STORE_GO") {
        let deadline = Instant::now() + Duration::from_secs(60);
        while !Path::new(&go).exists() {
            assert!(Instant::now() < deadline, "no start signal");
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    if let Some(n) = mode.strip_prefix("write:") {
        let n: usize = n.parse().unwrap();
        let threads: Vec<_> = (0..n)
            .map(|_| {
                let location = location.clone();
                std::thread::spawn(move || {
                    let store = Store::open_at(&location).expect("open");
                    let h = store.begin_run(start("child"), vec![]).expect("begin");
                    println!("RUN_ID={}", h.run_id());
                    store
                        .append_event(&h, kinds::POLICY_DECISION, json!({"decision": "allow"}))
                        .expect("event");
                    store.finish_run(&h, end("ok")).expect("finish");
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
    } else if mode == "open" {
        match Store::open_at(&location) {
            Ok(_) => println!("OPENED"),
            Err(e) => println!("OPEN_ERROR={e}"),
        }
    } else if mode == "hang" {
        let store = open(&location).expect("open");
        let h = store.begin_run(start("child"), vec![]).expect("begin");
        println!("RUN_ID={}", h.run_id());
        std::thread::sleep(Duration::from_secs(120));
    } else {
        panic!("unknown child mode {mode}");
    }
}

fn spawn_child(mode: &str, fx: &Fixture, go: Option<&Path>) -> std::process::Child {
    spawn_child_of("node-a", mode, fx, go)
}

/// A child writing as fleet node `node` (with Postgres).
fn spawn_child_of(node: &str, mode: &str, fx: &Fixture, go: Option<&Path>) -> std::process::Child {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.env("AIRLOCK_STORE_NODE", node);
    if let Some(go) = go {
        cmd.env("AIRLOCK_STORE_GO", go);
    }
    if let Some(server) = &fx.server {
        cmd.env("AIRLOCK_STORE_URL", server.url("airlock"));
    }
    cmd.args([
        "--exact",
        "child_process",
        "--nocapture",
        "--test-threads=1",
    ])
    .env(CHILD_ENV, mode)
    .env("AIRLOCK_STORE_DIR", &fx.location.state_dir)
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .expect("spawn child")
}

fn run_ids(out: &str) -> Vec<String> {
    out.lines()
        .filter_map(|l| {
            l.split_once("RUN_ID=")
                .and_then(|(_, rest)| rest.split_whitespace().next().map(str::to_string))
        })
        .collect()
}

backend_test!(thirty_two_writers_in_two_processes, |fx| {
    let go = fx.scratch().join("go");
    let children: Vec<_> = (0..2)
        .map(|_| spawn_child("write:16", fx, Some(&go)))
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    std::fs::write(&go, b"").unwrap();
    let mut ids = Vec::new();
    for child in children {
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "child failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        ids.extend(run_ids(&String::from_utf8_lossy(&out.stdout)));
    }
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 32);
    let store = fx.open();
    let runs = store.list_runs(&RunFilter::default()).unwrap();
    let mut stored: Vec<_> = runs.iter().map(|r| r.run_id.clone()).collect();
    stored.sort();
    assert_eq!(stored, ids, "no record lost");
    assert!(runs.iter().all(|r| r.status == "ok"));
    let report = store.verify().unwrap();
    assert_eq!((report.entries, report.runs, report.head_seq), (96, 32, 96));
});

backend_test!(a_sigkilled_writer_leaves_a_verifiable_chain, |fx| {
    let store = fx.open();
    let mine = store.begin_run(start("x"), vec![]).unwrap();
    let mut child = spawn_child("hang", fx, None);
    let mut reader = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    let id = loop {
        line.clear();
        assert!(
            reader.read_line(&mut line).unwrap() > 0,
            "child exited early"
        );
        if let Some(id) = run_ids(&line).pop() {
            break id;
        }
    };
    assert!(store.reap_aborted().unwrap().is_empty(), "the child lives");
    child.kill().unwrap(); // SIGKILL, mid-run
    child.wait().unwrap();
    store.verify().unwrap();
    assert_eq!(store.reap_aborted().unwrap(), vec![id.clone()]);
    let d = store.show_run(&id).unwrap().unwrap();
    assert_eq!(d.run.status, STATUS_ABORTED);
    assert_eq!(d.events.last().unwrap().kind, kinds::RUN_ABORTED);
    assert_eq!(
        store.show_run(&mine.run_id()).unwrap().unwrap().run.status,
        STATUS_RUNNING
    );
    store.finish_run(&mine, end("ok")).unwrap();
    store.verify().unwrap();
});

// ---- Postgres only -------------------------------------------------------------------

/// The run id a `hang` child prints once its run has begun.
fn begun_run(child: &mut std::process::Child) -> String {
    let mut reader = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    loop {
        line.clear();
        assert!(
            reader.read_line(&mut line).unwrap() > 0,
            "child exited early"
        );
        if let Some(id) = run_ids(&line).pop() {
            return id;
        }
    }
}

/// This boot's holder in pid namespace `pid_ns`: another process table, as a container on
/// this kernel is one (a test's stand-in for another machine: a real one differs in boot
/// id too, which `node::judge_run`'s tests cover).
fn holder(pid_ns: i64) -> NodeHolder {
    NodeHolder {
        pid_ns,
        ..NodeHolder::of_this_process().unwrap()
    }
}

/// A `hang` child of node `node` whose holder is pid namespace `pid_ns`.
fn spawn_holder(node: &str, pid_ns: i64, fx: &Fixture) -> std::process::Child {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([
        "--exact",
        "child_process",
        "--nocapture",
        "--test-threads=1",
    ])
    .env(CHILD_ENV, "hang")
    .env("AIRLOCK_STORE_NODE", node)
    .env("AIRLOCK_STORE_PID_NS", pid_ns.to_string())
    .env(
        "AIRLOCK_STORE_URL",
        fx.server.as_ref().unwrap().url("airlock"),
    )
    .env(
        "AIRLOCK_STORE_DIR",
        fx.scratch().join(format!("state-{pid_ns}")),
    )
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    cmd.spawn().expect("spawn child")
}

/// The fleet store as node `node` of holder `pid_ns` opens it.
fn open_holder(fx: &Fixture, node: &str, pid_ns: i64) -> Result<Store> {
    let mut location = fx.location.clone();
    location.postgres.as_mut().unwrap().node = NodeName::parse(node).unwrap();
    Store::open_at_as_holder(&location, holder(pid_ns))
}

#[test]
fn a_node_name_held_by_a_live_holder_is_refused_to_another() {
    let Some(fx) = Fixture::postgres() else {
        return;
    };
    // Machine A holds node "shared" with a run open.
    let mut a = spawn_holder("shared", 1001, &fx);
    let run_a = begun_run(&mut a);
    // Machine B, given the same name, is refused while A lives: by name, holder and fix.
    let err = open_holder(&fx, "shared", 1002).unwrap_err();
    assert!(matches!(err, StoreError::NodeNameHeld { .. }), "{err:?}");
    assert_eq!(err.class(), ErrorClass::Conflict);
    let msg = err.to_string();
    for part in [
        "store node name \"shared\" is held by boot ",
        "pid namespace 1001 with 1 live database session(s)",
        "pid namespace 1002) may not write as it",
        "its own [store] node",
        "pg_terminate_backend",
    ] {
        assert!(msg.contains(part), "{part:?} not in {msg}");
    }
    // So is this test process itself (its real pid namespace is not A's).
    let err = Store::open_at(&open_as_location(&fx, "shared")).unwrap_err();
    assert!(matches!(err, StoreError::NodeNameHeld { .. }), "{err:?}");
    // A's run is untouched by anyone else meanwhile.
    let other = open_holder(&fx, "node-b", 1002).unwrap();
    assert!(other.reap_aborted().unwrap().is_empty());
    assert_eq!(status_of(&other, &run_a), STATUS_RUNNING);
    // A dies (SIGKILL: its session ends with it). B takes the name, and A's run, whose
    // supervisor can no longer record its end, is B's to mark aborted.
    a.kill().unwrap();
    a.wait().unwrap();
    let b = open_holder(&fx, "shared", 1002).unwrap();
    assert_eq!(b.reap_aborted().unwrap(), vec![run_a.clone()]);
    let detail = b.show_run(&run_a).unwrap().unwrap();
    let aborted = detail.events.last().unwrap();
    let reason = aborted.body["reason"].as_str().unwrap();
    assert!(
        reason.contains("node shared's earlier holder") && reason.contains("pid namespace 1001"),
        "{reason}"
    );
    assert_eq!(aborted.body["reaped_by"], "shared");
    b.verify().unwrap();
    // Now B holds it: A, restarted, is refused in turn.
    let err = open_holder(&fx, "shared", 1001).unwrap_err();
    assert!(err.to_string().contains("pid namespace 1002 with"), "{err}");
}

#[test]
fn a_holders_processes_share_the_name_and_never_reap_each_others_live_runs() {
    let Some(fx) = Fixture::postgres() else {
        return;
    };
    let mut a = spawn_holder("shared", 1001, &fx);
    let run_a = begun_run(&mut a);
    // Another process of A's process table joins and judges A's run by its pid: alive.
    let a2 = open_holder(&fx, "shared", 1001).unwrap();
    assert!(a2.reap_aborted().unwrap().is_empty());
    assert_eq!(status_of(&a2, &run_a), STATUS_RUNNING);
    let h = a2.begin_run(start("x"), vec![]).unwrap();
    a2.finish_run(&h, end("ok")).unwrap();
    a.kill().unwrap();
    a.wait().unwrap();
    // One of A's connections is still open: the name stays A's.
    let err = open_holder(&fx, "shared", 1002).unwrap_err();
    assert!(matches!(err, StoreError::NodeNameHeld { .. }), "{err:?}");
    // A's restarted process reaps the dead supervisor's run by its pid, as before.
    assert_eq!(a2.reap_aborted().unwrap(), vec![run_a.clone()]);
    assert!(a2
        .show_run(&run_a)
        .unwrap()
        .unwrap()
        .events
        .last()
        .unwrap()
        .body["reason"]
        .as_str()
        .unwrap()
        .contains("supervisor pid"));
    a2.verify().unwrap();
}

#[test]
fn a_released_name_can_be_taken_by_another_holder() {
    let Some(fx) = Fixture::postgres() else {
        return;
    };
    let first = open_holder(&fx, "shared", 1001).unwrap();
    let second = open_holder(&fx, "shared", 1001).unwrap();
    drop(first);
    assert!(
        open_holder(&fx, "shared", 1002).is_err(),
        "one session is left"
    );
    drop(second); // The last of A's connections closes: the claim is released.
    let b = open_holder(&fx, "shared", 1002).unwrap();
    let h = b.begin_run(start("x"), vec![]).unwrap();
    b.finish_run(&h, end("ok")).unwrap();
    b.verify().unwrap();
    // Other names are independent of it.
    open_holder(&fx, "node-c", 1001).unwrap();
}

#[test]
fn claims_racing_from_two_holders_leave_the_name_to_one() {
    let Some(fx) = Fixture::postgres() else {
        return;
    };
    drop(open_holder(&fx, "other", 1000).unwrap()); // migrate before the race
                                                    // Four processes of each of two holders open the store at once and keep it open.
    let claimed = std::sync::Barrier::new(8);
    let results: Vec<(i64, bool)> = std::thread::scope(|s| {
        let threads: Vec<_> = [1001, 1002]
            .iter()
            .flat_map(|&ns| std::iter::repeat_n(ns, 4))
            .map(|ns| {
                let (fx, claimed) = (&fx, &claimed);
                s.spawn(move || {
                    let store = open_holder(fx, "shared", ns);
                    if let Err(e) = &store {
                        assert!(matches!(e, StoreError::NodeNameHeld { .. }), "{e:?}");
                    }
                    claimed.wait(); // every claim is made while the winners hold theirs
                    (ns, store.is_ok())
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    });
    let winners: Vec<i64> = results.iter().filter(|r| r.1).map(|r| r.0).collect();
    assert!(!winners.is_empty(), "{results:?}");
    assert!(winners.iter().all(|&ns| ns == winners[0]), "{results:?}");
    assert_eq!(
        winners.len(),
        4,
        "the winner's every process joins: {results:?}"
    );
}

/// The fixture's location as node `node`.
fn open_as_location(fx: &Fixture, node: &str) -> StoreLocation {
    let mut location = fx.location.clone();
    location.postgres.as_mut().unwrap().node = NodeName::parse(node).unwrap();
    location
}

/// The store as fleet node `node` opens it (its state directory is the fixture's).
fn open_as(fx: &Fixture, node: &str) -> Store {
    let mut location = fx.location.clone();
    location.postgres.as_mut().unwrap().node = NodeName::parse(node).unwrap();
    Store::open_at(&location).unwrap()
}

fn status_of(store: &Store, run_id: &str) -> String {
    store.show_run(run_id).unwrap().unwrap().run.status
}

#[test]
fn a_restarted_node_reaps_only_its_own_runs() {
    let Some(fx) = Fixture::postgres() else {
        return;
    };
    // Two nodes, one process each, each with a run open; both supervisors die.
    let mut a = spawn_child_of("node-a", "hang", &fx, None);
    let mut b = spawn_child_of("node-b", "hang", &fx, None);
    let (run_a, run_b) = (begun_run(&mut a), begun_run(&mut b));
    for child in [&mut a, &mut b] {
        child.kill().unwrap(); // SIGKILL, mid-run
        child.wait().unwrap();
    }
    // Node A restarts: its run is aborted; B's stays running although its supervisor is
    // gone from this machine too, because B's supervisors are not A's to judge.
    let node_a = open_as(&fx, "node-a");
    assert_eq!(node_a.reap_aborted().unwrap(), vec![run_a.clone()]);
    assert_eq!(status_of(&node_a, &run_a), STATUS_ABORTED);
    assert_eq!(status_of(&node_a, &run_b), STATUS_RUNNING);
    let detail = node_a.show_run(&run_a).unwrap().unwrap();
    let aborted = detail.events.last().unwrap();
    assert_eq!(aborted.kind, kinds::RUN_ABORTED);
    assert_eq!(aborted.body["reaped_by"], "node-a", "{aborted:?}");
    assert_eq!(detail.run.node.as_deref(), Some("node-a"));
    node_a.verify().unwrap();
    // Node B restarts and reaps its own.
    let node_b = open_as(&fx, "node-b");
    assert_eq!(node_b.reap_aborted().unwrap(), vec![run_b.clone()]);
    assert_eq!(status_of(&node_a, &run_b), STATUS_ABORTED);
    assert_eq!(
        node_b
            .show_run(&run_b)
            .unwrap()
            .unwrap()
            .run
            .node
            .as_deref(),
        Some("node-b")
    );
    node_a.verify().unwrap();
}

#[test]
fn a_live_run_of_another_node_is_left_running() {
    let Some(fx) = Fixture::postgres() else {
        return;
    };
    let mut b = spawn_child_of("node-b", "hang", &fx, None);
    let run_b = begun_run(&mut b);
    let node_a = open_as(&fx, "node-a");
    assert!(node_a.reap_aborted().unwrap().is_empty());
    assert_eq!(status_of(&node_a, &run_b), STATUS_RUNNING);
    b.kill().unwrap();
    b.wait().unwrap();
}

#[test]
fn a_node_rebooted_since_its_run_began_reaps_it() {
    let Some(fx) = Fixture::postgres() else {
        return;
    };
    let store = fx.open();
    let h = store.begin_run(start("x"), vec![]).unwrap();
    // The run as one of this node's supervisors recorded it in an earlier boot (edited
    // in: a test cannot reboot; `verify` would name the edit, so it is not asked here).
    fx.tamper(&format!(
        "UPDATE runs SET boot_id = 'an-earlier-boot' WHERE run_id = '{}'",
        h.run_id()
    ));
    assert_eq!(store.reap_aborted().unwrap(), vec![h.run_id()]);
    let aborted = store.show_run(&h.run_id()).unwrap().unwrap();
    let reason = aborted.events.last().unwrap().body["reason"].to_string();
    assert!(
        reason.contains("earlier holder (boot an-earlier-boot") && reason.contains("is gone"),
        "{reason}"
    );
    // The same run as another node's: not this node's to judge, reboot or not.
    let other = store.begin_run(start("x"), vec![]).unwrap();
    fx.tamper(&format!(
        "UPDATE runs SET boot_id = 'an-earlier-boot', node = 'node-b' WHERE run_id = '{}'",
        other.run_id()
    ));
    assert!(store.reap_aborted().unwrap().is_empty());
}

#[test]
fn runs_recorded_before_nodes_are_judged_by_boot_as_before() {
    let Some(fx) = Fixture::postgres() else {
        return;
    };
    let store = fx.open();
    let here = store.begin_run(start("x"), vec![]).unwrap();
    let away = store.begin_run(start("x"), vec![]).unwrap();
    // Rows of a database migrated from version 1: no node. One of this boot with a dead
    // supervisor (reaped, as version 1 did), one of another boot (another machine's,
    // perhaps: left alone, as version 1 did).
    fx.tamper(&format!(
        "UPDATE runs SET node = NULL, supervisor_pid = 999999 WHERE run_id = '{}';
         UPDATE runs SET node = NULL, boot_id = 'another-boot' WHERE run_id = '{}'",
        here.run_id(),
        away.run_id()
    ));
    assert_eq!(store.reap_aborted().unwrap(), vec![here.run_id()]);
    assert_eq!(status_of(&store, &away.run_id()), STATUS_RUNNING);
}

#[test]
fn an_unreachable_fleet_store_is_an_error_not_a_fallback() {
    let dir = tempfile::tempdir().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let location = StoreLocation {
        state_dir: dir.path().join("state"),
        postgres: Some(fleet(
            &format!("postgres://airlock@127.0.0.1:{port}/airlock"),
            "node-a",
        )),
        spool_max_files: airlock_store::spool::DEFAULT_MAX_FILES,
    };
    let err = Store::open_at(&location).unwrap_err();
    assert!(matches!(err, StoreError::Unreachable { .. }), "{err:?}");
    assert!(err.to_string().contains("cannot be reached"), "{err}");
    // Nobody listens: an outage (retry later), not a refusal.
    assert_eq!(err.class(), ErrorClass::Unavailable, "{err}");
}

#[test]
fn migrations_apply_once_and_a_newer_schema_is_refused() {
    let Some(fx) = Fixture::postgres() else {
        return;
    };
    drop(fx.open());
    drop(fx.open());
    assert_eq!(
        fx.server
            .as_ref()
            .unwrap()
            .psql("airlock", "SELECT version FROM airlock_schema"),
        "3"
    );
    fx.tamper("UPDATE airlock_schema SET version = 99");
    let err = Store::open_at(&fx.location).unwrap_err();
    assert!(
        matches!(err, StoreError::SchemaTooNew { found: 99, .. }),
        "{err:?}"
    );
}

#[test]
fn a_fleet_database_of_version_1_gains_the_node_column() {
    let Some(fx) = Fixture::postgres() else {
        return;
    };
    drop(fx.open());
    // The database as version 1 left it: no node column.
    fx.tamper(
        "DROP INDEX runs_running_node; ALTER TABLE runs DROP COLUMN node;
         DROP TABLE nodes; ALTER TABLE runs DROP COLUMN pid_ns;
         UPDATE airlock_schema SET version = 1",
    );
    let store = fx.open();
    assert_eq!(store.fleet_schema_version().unwrap(), Some(3));
    let h = store.begin_run(start("x"), vec![]).unwrap();
    store.finish_run(&h, end("ok")).unwrap();
    let run = store.show_run(&h.run_id()).unwrap().unwrap().run;
    assert_eq!(run.node.as_deref(), Some("node-a"));
    store.verify().unwrap();
}

#[test]
fn a_fleet_database_of_version_2_gains_node_claims() {
    let Some(fx) = Fixture::postgres() else {
        return;
    };
    let store = fx.open();
    let here = store.begin_run(start("x"), vec![]).unwrap();
    let away = store.begin_run(start("x"), vec![]).unwrap();
    drop(store);
    // The database as version 2 left it: no claims, runs without a holder. One run of
    // this boot with a dead supervisor, one of another boot (perhaps another machine
    // that shared the name before claims: not this holder's to judge).
    fx.tamper(&format!(
        "DROP TABLE nodes; ALTER TABLE runs DROP COLUMN pid_ns;
         UPDATE airlock_schema SET version = 2;
         UPDATE runs SET supervisor_pid = 999999 WHERE run_id = '{}';
         UPDATE runs SET boot_id = 'another-boot' WHERE run_id = '{}'",
        here.run_id(),
        away.run_id()
    ));
    let store = fx.open();
    assert_eq!(store.fleet_schema_version().unwrap(), Some(3));
    assert_eq!(store.reap_aborted().unwrap(), vec![here.run_id()]);
    assert_eq!(status_of(&store, &away.run_id()), STATUS_RUNNING);
    // The name is claimed from now on.
    let err = open_holder(&fx, "node-a", 1002).unwrap_err();
    assert!(matches!(err, StoreError::NodeNameHeld { .. }), "{err:?}");
}

backend_test!(the_store_is_usable_on_an_async_runtimes_thread, |fx| {
    // `airlock serve` calls the store from its handlers, on the runtime's threads.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let location = fx.location.clone();
    runtime.block_on(async move {
        let store = Store::open_at(&location).unwrap();
        let h = store.begin_run(start("async"), vec![]).unwrap();
        store.finish_run(&h, end("ok")).unwrap();
        assert_eq!(store.list_runs(&RunFilter::default()).unwrap().len(), 1);
        let mut out = Vec::new();
        assert_eq!(store.export_jsonl(&mut out).unwrap(), 3);
        store.verify().unwrap();
    });
});

backend_test!(reordered_entries_are_named, |fx| {
    let store = fx.open();
    let ids = populated(&store);
    // Swap the bodies of two entries (seq 4 = begin of run 2, seq 5 = its event).
    fx.tamper(
        "CREATE TEMP TABLE t AS SELECT seq, body_json FROM audit_log WHERE seq IN (4, 5);
         UPDATE audit_log SET body_json = (SELECT body_json FROM t WHERE t.seq = 9 - audit_log.seq)
             WHERE seq IN (4, 5);",
    );
    let b = tampered(&store);
    assert_eq!(
        (b.seq, b.run_id.as_deref()),
        (Some(4), Some(ids[1].as_str()))
    );
});

backend_test!(swapped_whole_entries_are_named, |fx| {
    let store = fx.open();
    populated(&store);
    // Hashes included: the chain's links break.
    fx.tamper(
        "UPDATE audit_log SET seq = 1000 WHERE seq = 5;
         UPDATE audit_log SET seq = 5 WHERE seq = 6;
         UPDATE audit_log SET seq = 6 WHERE seq = 1000;",
    );
    assert_eq!(tampered(&store).seq, Some(5));
});

fn real_uid() -> u32 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("Uid:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

backend_test!(runs_are_filtered_by_the_caller_that_started_them, |fx| {
    let store = fx.open();
    let h = store.begin_run(start("mine"), vec![]).unwrap();
    store.finish_run(&h, end("ok")).unwrap();
    let shown = store.show_run(&h.run_id()).unwrap().unwrap();
    assert_eq!(shown.run.caller_uid, Some(real_uid()));
    let other = store
        .list_runs(&RunFilter {
            caller_uid: Some(real_uid() + 1),
            ..Default::default()
        })
        .unwrap();
    assert!(other.is_empty(), "another uid sees none of these runs");
    // The caller is part of the hash-chained begin entry.
    assert_eq!(shown.events[0].body["caller_uid"], real_uid());
    store.verify().unwrap();
});

backend_test!(stats_per_workload_class, |fx| {
    let store = fx.open();
    for (i, status) in ["ok", "ok", "ok", "task_error"].iter().enumerate() {
        let h = store.begin_run(start("web"), vec![]).unwrap();
        if i < 2 {
            store
                .append_event(
                    &h,
                    kinds::EGRESS_DECISION,
                    json!({"decision": "deny", "reason_code": "egress.private_address"}),
                )
                .unwrap();
        }
        store
            .append_event(
                &h,
                kinds::EGRESS_DECISION,
                json!({"decision": "allow", "reason_code": "egress.allowlisted"}),
            )
            .unwrap();
        let mut e = end(status);
        e.startup_ms = (i + 1) as f64;
        if i == 3 {
            e.limit_fired = Some("wall_time".into());
            e.cleanup_ok = false;
            e.cleanup_leftovers = json!(["pid 42"]);
        }
        store.finish_run(&h, e).unwrap();
    }
    store.begin_run(start("web"), vec![]).unwrap();
    let h = store.begin_run(start("batch"), vec![]).unwrap();
    store
        .append_event(
            &h,
            kinds::ARTIFACT_REJECTED,
            json!({"decision": "rejected", "reason_code": "artifact.symlink"}),
        )
        .unwrap();
    store.finish_run(&h, end("policy_denied")).unwrap();

    let stats = store.stats().unwrap();
    let web = &stats["web"];
    assert_eq!((web.runs, web.running, web.finished, web.ok), (5, 1, 4, 3));
    assert_eq!(web.completion_rate, Some(0.75));
    assert_eq!(web.startup_ms_p50, Some(2.0));
    assert_eq!(web.startup_ms_p99, Some(4.0));
    assert_eq!(web.denials.get("egress.private_address"), Some(&2));
    assert!(!web.denials.contains_key("egress.allowlisted"));
    assert_eq!((web.timeouts, web.cleanup_failures), (1, 1));
    let batch = &stats["batch"];
    assert_eq!(batch.completion_rate, Some(0.0));
    assert_eq!(batch.denials.get("artifact.symlink"), Some(&1));
    assert_eq!(batch.by_status.get("policy_denied"), Some(&1));
});

// ---- TLS to the fleet's database -----------------------------------------------------

/// A server with `ssl=on` and a certificate of a test CA for `db.fleet.test`, this
/// machine's non-loopback address (reachable only over TLS) and 127.0.0.1; the address
/// the tests connect to (the non-loopback one; 127.0.0.1 on a machine without one, and
/// then only the loopback case is covered).
fn tls_server(pki_dir: &Path) -> Option<(PgServer, TestPki, String)> {
    tls_server_with(pki_dir, false)
}

/// [`tls_server`]; `scram`: clients of the non-loopback address log in with a password.
fn tls_server_with(pki_dir: &Path, scram: bool) -> Option<(PgServer, TestPki, String)> {
    let addr = pg_server::non_loopback_ipv4().map(|a| a.to_string());
    let target = addr.clone().unwrap_or_else(|| {
        eprintln!("no non-loopback IPv4 address: TLS is tested over 127.0.0.1 only");
        "127.0.0.1".into()
    });
    let mut names = vec!["DNS:db.fleet.test".to_string(), "IP:127.0.0.1".into()];
    names.extend(addr.iter().map(|a| format!("IP:{a}")));
    let pki = TestPki::make(pki_dir, &names);
    let server = PgServer::start_with(pg_server::ServerOptions {
        tls_only_addresses: addr.into_iter().collect(),
        tls: Some(pki.server_files()),
        scram,
    })?;
    server.psql("postgres", "CREATE DATABASE airlock");
    Some((server, pki, target))
}

fn tls_location(dir: &Path, url: &str) -> StoreLocation {
    StoreLocation {
        state_dir: dir.join("state"),
        postgres: Some(fleet(url, "node-a")),
        spool_max_files: airlock_store::spool::DEFAULT_MAX_FILES,
    }
}

#[test]
fn verify_full_connects_over_tls_and_records_a_run() {
    let pki_dir = tempfile::tempdir().unwrap();
    let Some((pg, pki, addr)) = tls_server(pki_dir.path()) else {
        return;
    };
    for host in [
        // By address: the certificate names it (an IP subjectAltName).
        format!("{addr}:{}", pg.port),
        // By name, connecting to the address: the certificate names db.fleet.test.
        format!("db.fleet.test:{}", pg.port),
    ] {
        // With a name, hostaddr says where to connect (no resolver entry is needed).
        let hostaddr = if host.starts_with("db.") {
            format!("hostaddr={addr}&")
        } else {
            String::new()
        };
        let url = format!(
            "postgres://postgres@{host}/airlock?{hostaddr}sslmode=verify-full&sslrootcert={}",
            pki.ca.display()
        );
        let store = Store::open_at(&tls_location(pki_dir.path(), &url)).unwrap();
        // The server sees this connection encrypted (and from the address: the
        // pg_hba.conf line for it is `hostssl`, so a plaintext one would be refused).
        let seen = pg.tls_connections("airlock", "airlock");
        assert!(seen.lines().any(|l| l.starts_with("t|")), "{host}: {seen}");
        assert!(!seen.lines().any(|l| l.starts_with("f|")), "{host}: {seen}");
        let h = store.begin_run(start("tls"), vec![]).unwrap();
        store.finish_run(&h, end("ok")).unwrap();
        assert_eq!(status_of(&store, &h.run_id()), "ok");
        store.verify().unwrap();
    }
}

#[test]
fn a_password_login_over_tls_is_bound_to_the_tls_session() {
    let pki_dir = tempfile::tempdir().unwrap();
    let Some((pg, pki, addr)) = tls_server_with(pki_dir.path(), true) else {
        return;
    };
    if addr == "127.0.0.1" {
        return; // the loopback address logs in by trust (initdb's pg_hba.conf)
    }
    pg.psql(
        "postgres",
        "ALTER USER postgres PASSWORD 'fleet-test-password'",
    );
    // channel_binding=require: the login fails unless SCRAM-SHA-256-PLUS was used.
    let url = format!(
        "postgres://postgres:fleet-test-password@{addr}:{}/airlock?channel_binding=require\
         &sslmode=verify-full&sslrootcert={}",
        pg.port,
        pki.ca.display()
    );
    let store = Store::open_at(&tls_location(pki_dir.path(), &url)).unwrap();
    let h = store.begin_run(start("scram"), vec![]).unwrap();
    store.finish_run(&h, end("ok")).unwrap();
    store.verify().unwrap();
    // The wrong password is refused (the server did ask for one).
    let wrong = url.replace("fleet-test-password", "not-the-password");
    let err = Store::open_at(&tls_location(pki_dir.path(), &wrong)).unwrap_err();
    assert!(
        err.to_string().contains("password authentication failed"),
        "{err}"
    );
}

#[test]
fn a_server_certificate_of_another_ca_is_refused() {
    let pki_dir = tempfile::tempdir().unwrap();
    let Some((pg, pki, addr)) = tls_server(pki_dir.path()) else {
        return;
    };
    let url = format!(
        "postgres://postgres@{addr}:{}/airlock?sslmode=verify-full&sslrootcert={}",
        pg.port,
        pki.other_ca.display()
    );
    let err = Store::open_at(&tls_location(pki_dir.path(), &url)).unwrap_err();
    assert!(matches!(err, StoreError::Unreachable { .. }), "{err:?}");
    assert!(err.to_string().contains("UnknownIssuer"), "{err}");
    // A refused certificate is no outage: nothing to wait for (runtime_fault, not
    // store_unavailable).
    assert_ne!(err.class(), ErrorClass::Unavailable, "{err}");
    assert_eq!(
        pg.psql(
            "airlock",
            "SELECT count(*) FROM pg_tables WHERE tablename = 'runs'"
        ),
        "0"
    );
}

#[test]
fn a_certificate_for_another_host_name_is_refused() {
    let pki_dir = tempfile::tempdir().unwrap();
    let Some((pg, pki, addr)) = tls_server(pki_dir.path()) else {
        return;
    };
    // The right server at the right address, but the URL says it is db.other.test.
    let url = format!(
        "postgres://postgres@db.other.test:{}/airlock?hostaddr={addr}&sslmode=verify-full\
         &sslrootcert={}",
        pg.port,
        pki.ca.display()
    );
    let err = Store::open_at(&tls_location(pki_dir.path(), &url)).unwrap_err();
    assert!(matches!(err, StoreError::Unreachable { .. }), "{err:?}");
    assert!(
        err.to_string()
            .contains("certificate not valid for name \"db.other.test\""),
        "{err}"
    );
    assert_ne!(err.class(), ErrorClass::Unavailable, "{err}");
}

#[test]
fn weak_sslmodes_for_a_network_address_are_refused_before_connecting() {
    let addr = pg_server::non_loopback_ipv4()
        .map(|a| a.to_string())
        .unwrap_or_else(|| "192.0.2.1".into());
    for (mode, why) in [
        ("require", "encrypts without checking who answers"),
        (
            "verify-ca",
            "checks the chain but not that it names the host",
        ),
        ("prefer", "may send them in plaintext"),
        ("disable", "sends them in plaintext"),
    ] {
        let url =
            format!("postgres://postgres@{addr}:5432/airlock?sslmode={mode}&sslrootcert=/ca.pem");
        let err = PostgresUrl::parse(&url).unwrap_err().to_string();
        assert!(err.contains(why), "{mode}: {err}");
    }
}

#[test]
fn localhost_by_name_reaches_a_loopback_server() {
    let Some(pg) = PgServer::start() else {
        return;
    };
    pg.psql("postgres", "CREATE DATABASE airlock");
    let dir = tempfile::tempdir().unwrap();
    let url = format!("postgres://postgres@localhost:{}/airlock", pg.port);
    let store = Store::open_at(&tls_location(dir.path(), &url)).unwrap();
    let h = store.begin_run(start("local"), vec![]).unwrap();
    store.finish_run(&h, end("ok")).unwrap();
    store.verify().unwrap();
}

#[test]
fn localhost_resolving_elsewhere_is_refused() {
    if !root_or_skip() {
        return;
    }
    // A child whose /etc/hosts (in a mount namespace of its own: the machine's file is
    // untouched) maps localhost to a TEST-NET address: without TLS that is refused
    // before anything is sent there.
    let dir = tempfile::tempdir().unwrap();
    let out = open_with_hosts(
        dir.path(),
        "192.0.2.77 localhost\n",
        "postgres://airlock@localhost:5432/airlock",
    );
    assert!(
        out.contains("resolves to 192.0.2.77, which is not a loopback address"),
        "{out}"
    );
}

/// The output of a child (mode `open`) that opens the store at `url` with `hosts` as
/// its /etc/hosts, in a mount namespace of its own (the machine's file is untouched).
fn open_with_hosts(dir: &Path, hosts: &str, url: &str) -> String {
    let file = dir.join("hosts");
    std::fs::write(&file, hosts).unwrap();
    let out = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "--", "sh", "-c"])
        .arg(r#"mount --bind "$1" /etc/hosts && shift && exec "$@""#)
        .arg("sh")
        .arg(&file)
        .arg(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_process",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, "open")
        .env("AIRLOCK_STORE_DIR", dir.join("state"))
        .env("AIRLOCK_STORE_URL", url)
        .output()
        .unwrap();
    format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn a_network_host_by_name_is_resolved_and_verified() {
    if !root_or_skip() {
        return;
    }
    let pki_dir = tempfile::tempdir().unwrap();
    let Some((pg, pki, addr)) = tls_server(pki_dir.path()) else {
        return;
    };
    // db.fleet.test resolves (in the child's own /etc/hosts) to the server's address; no
    // hostaddr: airlock resolves the name itself and checks the certificate names it.
    let url = format!(
        "postgres://postgres@db.fleet.test:{}/airlock?sslmode=verify-full&sslrootcert={}",
        pg.port,
        pki.ca.display()
    );
    let out = open_with_hosts(pki_dir.path(), &format!("{addr} db.fleet.test\n"), &url);
    assert!(out.contains("OPENED"), "{out}");
    assert_eq!(
        pg.psql("airlock", "SELECT version FROM airlock_schema"),
        "3"
    );
    // Another name that resolves to the same server is not on its certificate: refused.
    let other = url.replace("db.fleet.test", "db.other.test");
    let out = open_with_hosts(pki_dir.path(), &format!("{addr} db.other.test\n"), &other);
    assert!(out.contains("not valid for name"), "{out}");
}

/// Whether this test may go on: it needs root (a mount namespace with its own
/// /etc/hosts). Without root it is skipped, said so, unless `AIRLOCK_REQUIRE_ROOT_TESTS`
/// is set (the convention of crates/airlock/tests/common): then it fails.
fn root_or_skip() -> bool {
    if is_root() {
        return true;
    }
    assert!(
        std::env::var_os("AIRLOCK_REQUIRE_ROOT_TESTS").is_none(),
        "this test needs root (a mount namespace with its own /etc/hosts)"
    );
    eprintln!("SKIPPED: needs root (a mount namespace with its own /etc/hosts)");
    false
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("Uid:"))
        .and_then(|l| l.split_whitespace().nth(2))
        == Some("0")
}

/// A fleet store outlives a Postgres restart: while the server is down every use fails as
/// unavailable (never as tampering), a run's finish goes to the spool, and once the
/// server is back the same `Store` reconnects (within its backoff), the spool is written
/// and the chain verifies clean; a second server crash (SIGKILL) the same.
#[test]
fn a_fleet_store_reconnects_after_a_restart_and_its_spooled_finish_is_written() {
    let Some(mut fx) = Fixture::postgres() else {
        return;
    };
    let store = fx.open();
    for crash in [false, true] {
        let handle = store.begin_run(start("across"), vec![]).unwrap();
        let pg = fx.server.as_mut().unwrap();
        match crash {
            false => pg.stop_fast(),
            true => pg.kill_postmaster(),
        }
        let err = store.ping().unwrap_err();
        assert_eq!(err.class(), ErrorClass::Unavailable, "{err}");
        let err = store.verify().unwrap_err();
        assert_eq!(err.class(), ErrorClass::Unavailable, "not tampering: {err}");
        assert!(store.begin_run(start("refused"), vec![]).is_err());
        let kept = store.finish_run_or_spool(&handle, end("ok")).unwrap();
        let Finished::Spooled(path) = kept else {
            panic!("the finish was not spooled: {kept:?}");
        };
        assert!(path.exists());
        pg.restart();
        // Reconnects within the backoff's bound (5 s) without reopening the store.
        let deadline = Instant::now() + Duration::from_secs(10);
        while let Err(err) = store.ping() {
            assert!(Instant::now() < deadline, "no reconnection: {err}");
            std::thread::sleep(Duration::from_millis(50));
        }
        let done = store.replay_spool().unwrap();
        assert_eq!((done.written, done.already), (1, 0), "{done:?}");
        assert!(store.spool().is_empty());
        let run = store.show_run(&handle.run_id()).unwrap().unwrap().run;
        assert_eq!(run.status, "ok");
        store.verify().unwrap();
    }
}
