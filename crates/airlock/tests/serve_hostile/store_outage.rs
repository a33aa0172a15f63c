//! A store outage is neither an attack nor a loss (issue 33, item 6): `airlock serve` on a
//! real Postgres (`[store] url`, a throw-away server from Debian's binaries) under a load
//! of 32 clients running short commands (`/bin/true`, `sleep 0.2`), while Postgres is
//! stopped (`pg_ctl stop -m fast`) and started again, then crashed (SIGKILL of the
//! postmaster) and started again:
//!
//! * `/readyz` flips to 503 naming the store, and back to 200 after each restart;
//! * runs asked for during an outage are refused 503 `store_unavailable` with
//!   Retry-After, never `runtime_fault`;
//! * runs in flight when it dropped (`sleep 3`) answer their real class, and every run a
//!   client saw accepted has its finish in Postgres with that class once the service's
//!   spool is replayed: 0 lost finishes;
//! * during an outage `GET /v1/audit/verify` is 503 `store.unavailable` and `airlock
//!   audit verify` exits 122, never `chain_broken`; after recovery both are clean.
//!
//! Needs root (cells) and Debian's `postgresql` (.ci/run installs it).

#[path = "../../../store/tests/pg_server/mod.rs"]
mod pg_server;

use crate::common;
use crate::common::served::Served;
use pg_server::PgServer;
use serde_json::Value;
use std::collections::BTreeMap;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const KEY: &str = "store-outage-tenant-key";
const CLIENTS: usize = 32;
/// Runs started just before each outage that are still running when it begins.
const IN_FLIGHT: usize = 4;

/// One answer of `POST /v1/runs?wait=true`.
#[derive(Debug, Clone)]
struct Answer {
    status: u16,
    retry_after: Option<u64>,
    body: Value,
    /// What the client asked to run.
    argv: Vec<String>,
}

impl Answer {
    fn run_id(&self) -> Option<&str> {
        self.body["run_id"].as_str().filter(|id| !id.is_empty())
    }
}

fn config(url: &str) -> String {
    format!(
        r#"[store]
url = "{url}"
[server]
listen = ["unix:SOCK", "tcp:127.0.0.1:PORT"]
[server.contracts]
small = "small.yaml"
[server.tenants.load]
api_key_sha256 = ["{key}"]
max_cells = 60
runs_per_minute = 1000000
"#,
        key = common::sha256_hex(KEY)
    )
}

fn start_service(url: &str) -> Served {
    Served::start(&config(url), |dir| {
        std::fs::copy(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../../examples/contracts/default.yaml"),
            dir.join("small.yaml"),
        )
        .unwrap();
    })
}

/// `POST /v1/runs?wait=true` of `argv` as the load tenant, with its Retry-After.
fn run(served: &Served, argv: &[&str]) -> Answer {
    let body = serde_json::json!({"contract": "small", "argv": argv}).to_string();
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "120", "-X", "POST"])
        .args(["-H", &format!("Authorization: Bearer {KEY}")])
        .args([
            "-H",
            "content-type: application/json",
            "--data-binary",
            &body,
        ])
        .args(["-w", "\n%{http_code} %header{retry-after}"])
        .arg(format!(
            "http://127.0.0.1:{}/v1/runs?wait=true",
            served.port
        ))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, trailer) = text.rsplit_once('\n').unwrap_or(("", ""));
    let mut trailer = trailer.split_whitespace();
    Answer {
        status: trailer.next().and_then(|s| s.parse().ok()).unwrap_or(0),
        retry_after: trailer.next().and_then(|s| s.parse().ok()),
        body: serde_json::from_str(body).unwrap_or_else(|_| Value::String(body.into())),
        argv: argv.iter().map(|a| a.to_string()).collect(),
    }
}

/// `POST /v1/runs` of `argv`, its NDJSON stream read as it comes: `begun` gets the run id
/// once the `start` frame (the begin record exists) arrives; the answer is the `result`
/// frame's record.
fn streamed_run(port: u16, argv: &[&str], begun: std::sync::mpsc::Sender<String>) -> Answer {
    use std::io::BufRead;
    let body = serde_json::json!({"contract": "small", "argv": argv}).to_string();
    let mut curl = Command::new("curl")
        .args(["-sS", "-N", "--max-time", "120", "-X", "POST"])
        .args(["-H", &format!("Authorization: Bearer {KEY}")])
        .args([
            "-H",
            "content-type: application/json",
            "--data-binary",
            &body,
        ])
        .arg(format!("http://127.0.0.1:{port}/v1/runs"))
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut answer = Answer {
        status: 0,
        retry_after: None,
        body: Value::Null,
        argv: argv.iter().map(|a| a.to_string()).collect(),
    };
    for line in std::io::BufReader::new(curl.stdout.take().unwrap()).lines() {
        let frame: Value = serde_json::from_str(&line.unwrap()).unwrap_or_default();
        match frame["type"].as_str() {
            Some("start") => {
                let _ = begun.send(frame["run_id"].as_str().unwrap_or_default().into());
            }
            Some("result") => {
                answer.status = 200;
                answer.body = frame["record"].clone();
            }
            _ => {}
        }
    }
    let _ = curl.wait();
    answer
}

/// `/readyz`: (status, detail).
fn readyz(served: &Served) -> (u16, String) {
    let out = served.curl_unix(&["-w", "\n%{http_code}", "http://airlock/readyz"]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
    let body: Value = serde_json::from_str(body).unwrap_or_default();
    (
        code.trim().parse().unwrap_or(0),
        body["detail"].as_str().unwrap_or_default().to_string(),
    )
}

/// Polls `/readyz` until it answers `code`; the detail it answered then.
fn wait_readyz(served: &Served, code: u16, within: Duration) -> String {
    let deadline = Instant::now() + within;
    loop {
        let (got, detail) = readyz(served);
        if got == code {
            return detail;
        }
        assert!(
            Instant::now() < deadline,
            "/readyz still {got} ({detail}), not {code}, after {within:?}: {}",
            served.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// 32 clients running short commands until stopped; every answer kept.
struct Load {
    stop: Arc<AtomicBool>,
    answers: Arc<Mutex<Vec<Answer>>>,
    clients: Vec<std::thread::JoinHandle<()>>,
}

impl Load {
    fn start(served: &Arc<Served>) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let answers = Arc::new(Mutex::new(Vec::new()));
        let clients = (0..CLIENTS)
            .map(|i| {
                let (served, stop, answers) = (served.clone(), stop.clone(), answers.clone());
                std::thread::spawn(move || {
                    let argv: &[&str] = if i % 2 == 0 {
                        &["/bin/true"]
                    } else {
                        &["sleep", "0.2"]
                    };
                    while !stop.load(Ordering::Relaxed) {
                        let answer = run(&served, argv);
                        let refused = answer.status == 503;
                        answers.lock().unwrap().push(answer);
                        if refused {
                            // Not Retry-After's 5 s: the test wants answers during the outage.
                            std::thread::sleep(Duration::from_millis(100));
                        }
                    }
                })
            })
            .collect();
        Load {
            stop,
            answers,
            clients,
        }
    }

    fn finish(self) -> Vec<Answer> {
        self.stop.store(true, Ordering::Relaxed);
        for client in self.clients {
            client.join().unwrap();
        }
        std::mem::take(&mut *self.answers.lock().unwrap())
    }
}

#[derive(Debug, Clone, Copy)]
enum Outage {
    /// `pg_ctl stop -m fast`.
    FastStop,
    /// SIGKILL of the postmaster.
    Crash,
}

/// One outage under load; every answer the clients got, the in-flight runs' among them.
fn outage_under_load(served: &Arc<Served>, pg: &mut PgServer, outage: Outage) -> Vec<Answer> {
    let load = Load::start(served);
    std::thread::sleep(Duration::from_secs(2));
    // Runs in flight when the outage begins: their begin record is written (the
    // stream's `start` frame), they end while it lasts.
    let (begun, begun_rx) = std::sync::mpsc::channel();
    let in_flight: Vec<_> = (0..IN_FLIGHT)
        .map(|_| {
            let (port, begun) = (served.port, begun.clone());
            std::thread::spawn(move || streamed_run(port, &["sleep", "3"], begun))
        })
        .collect();
    for _ in 0..IN_FLIGHT {
        let started = begun_rx.recv_timeout(Duration::from_secs(60));
        assert!(
            started.is_ok(),
            "{outage:?}: an in-flight run did not begin"
        );
    }
    match outage {
        Outage::FastStop => pg.stop_fast(),
        Outage::Crash => pg.kill_postmaster(),
    }
    let down = Instant::now();
    let detail = wait_readyz(served, 503, Duration::from_secs(10));
    let flipped_down = down.elapsed();
    assert!(
        detail.contains("store unavailable") && detail.contains("postgres://"),
        "{outage:?}: /readyz does not name the store: {detail}"
    );
    // While it is down: verification is not possible, and says so (not chain_broken).
    let (code, verify) = served.call(KEY, "GET", "/v1/audit/verify", None);
    assert_eq!(code, 503, "{outage:?}: verify during the outage: {verify}");
    assert_eq!(verify["reason"], "store.unavailable", "{verify}");
    assert_eq!(verify["class"], "store_unavailable", "{verify}");
    let cli = served.cli(&["audit", "verify"]);
    assert_eq!(
        cli.status.code(),
        Some(122),
        "{outage:?}: airlock audit verify during the outage: {}",
        common::output_text(&cli)
    );
    assert!(!String::from_utf8_lossy(&cli.stderr).contains("FAILED"));
    // The outage lasts past the in-flight runs' end (3 s after their start).
    std::thread::sleep(Duration::from_secs(4).saturating_sub(down.elapsed()));
    pg.restart();
    let up = Instant::now();
    wait_readyz(served, 200, Duration::from_secs(30));
    let flipped_up = up.elapsed();
    std::thread::sleep(Duration::from_secs(2));
    let mut answers = load.finish();
    answers.extend(in_flight.into_iter().map(|t| t.join().unwrap()));
    let refused = answers.iter().filter(|a| a.status == 503).count();
    eprintln!(
        "store_outage {outage:?}: {} answers, {refused} refused 503 store_unavailable; \
         /readyz 503 {} ms after the stop, 200 {} ms after the restart",
        answers.len(),
        flipped_down.as_millis(),
        flipped_up.as_millis()
    );
    answers
}

/// Every answer is a run that ended in its real class (200, `ok`) or a refusal for the
/// store (503 `store_unavailable` with Retry-After); nothing is a `runtime_fault`.
fn check_answers(outage: Outage, answers: &[Answer]) {
    let mut refused = 0;
    for answer in answers {
        match answer.status {
            200 => assert_eq!(
                answer.body["status"], "ok",
                "{outage:?}: an accepted run did not end ok: {answer:?}"
            ),
            503 => {
                refused += 1;
                assert_eq!(answer.body["class"], "store_unavailable", "{answer:?}");
                assert_eq!(answer.body["reason"], "store.unavailable", "{answer:?}");
                assert!(answer.retry_after.is_some_and(|s| s >= 1), "{answer:?}");
                assert!(
                    answer.run_id().is_none(),
                    "a refusal has no run: {answer:?}"
                );
            }
            _ => panic!("{outage:?}: neither a run nor a store refusal: {answer:?}"),
        }
    }
    assert!(
        refused > 0,
        "{outage:?}: no run was asked for during the outage"
    );
    let in_flight: Vec<&Answer> = answers.iter().filter(|a| a.argv[1..] == ["3"]).collect();
    assert_eq!(in_flight.len(), IN_FLIGHT);
    for answer in in_flight {
        assert_eq!(answer.status, 200, "{outage:?}: in flight: {answer:?}");
        assert!(answer.run_id().is_some(), "{answer:?}");
    }
}

/// The pending finishes in a spool directory (its lock file is no finish).
fn finishes_in(spool: &std::path::Path) -> Vec<String> {
    std::fs::read_dir(spool)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".finish.json"))
        .collect()
}

/// Waits until the service's spool holds no pending finish.
fn wait_spool_empty(served: &Served) {
    let spool = served.state_dir().join("spool");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let pending = finishes_in(&spool);
        if pending.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "spooled finishes not replayed after 30 s: {pending:?}: {}",
            served.log()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn a_postgres_outage_refuses_runs_as_store_unavailable_and_loses_no_finish() {
    let _load = crate::exclusive();
    crate::require_cells!();
    let Some(mut pg) = PgServer::start() else {
        return;
    };
    let url = pg.create_db("outage");
    let served = Arc::new(start_service(&url));
    wait_readyz(&served, 200, Duration::from_secs(60));
    let mut accepted: Vec<Answer> = Vec::new();
    for outage in [Outage::FastStop, Outage::Crash] {
        let answers = outage_under_load(&served, &mut pg, outage);
        check_answers(outage, &answers);
        accepted.extend(answers.into_iter().filter(|a| a.status == 200));
    }
    let log = served.log();
    assert!(
        log.contains("is kept in") && log.contains("spooled finish(es) written"),
        "no finish was spooled and replayed (were the in-flight runs in flight?): {log}"
    );
    wait_spool_empty(&served);

    // 0 lost finishes: every accepted run is in Postgres with the class its client saw.
    let stored: BTreeMap<String, String> = pg
        .psql("outage", "SELECT run_id || ' ' || status FROM runs")
        .lines()
        .filter_map(|l| l.split_once(' '))
        .map(|(id, status)| (id.to_string(), status.to_string()))
        .collect();
    let mut missing = Vec::new();
    for answer in &accepted {
        let id = answer.run_id().expect("an accepted run has its id");
        match stored.get(id).map(String::as_str) {
            Some("ok") => {}
            other => missing.push(format!("{id}: {other:?}")),
        }
    }
    assert!(
        missing.is_empty(),
        "{} of {} accepted runs lack their finish: {missing:?}",
        missing.len(),
        accepted.len()
    );
    let faults = pg.psql(
        "outage",
        "SELECT count(*) FROM runs WHERE status IN ('runtime_fault', 'aborted')",
    );
    assert_eq!(
        faults, "0",
        "runs recorded as faults or aborted for an outage"
    );
    eprintln!(
        "store_outage: {} accepted runs over two outages, all finished in the store",
        accepted.len()
    );

    // The chain after two outages and their recovery verifies clean, by API and CLI.
    let (code, verified) = served.call(KEY, "GET", "/v1/audit/verify", None);
    assert_eq!(code, 200, "verify after recovery: {verified}");
    assert_eq!(verified["ok"], true, "{verified}");
    let cli = served.cli(&["audit", "verify"]);
    assert!(cli.status.success(), "{}", common::output_text(&cli));
    assert!(String::from_utf8_lossy(&cli.stdout).contains("audit chain intact"));
}

#[test]
fn a_service_started_while_postgres_is_down_does_not_start_and_a_spool_left_behind_is_replayed() {
    let _load = crate::exclusive();
    crate::require_cells!();
    let Some(mut pg) = PgServer::start() else {
        return;
    };
    let url = pg.create_db("leftover");
    let mut served = start_service(&url);
    wait_readyz(&served, 200, Duration::from_secs(60));
    // A run in flight when Postgres goes down and then the service is killed: its finish
    // is only in the spool.
    let background = {
        let port = served.port;
        std::thread::spawn(move || {
            let body = r#"{"contract": "small", "argv": ["sleep", "2"]}"#;
            Command::new("curl")
                .args(["-sS", "--max-time", "60", "-X", "POST"])
                .args(["-H", &format!("Authorization: Bearer {KEY}")])
                .args([
                    "-H",
                    "content-type: application/json",
                    "--data-binary",
                    body,
                ])
                .arg(format!("http://127.0.0.1:{port}/v1/runs?wait=true"))
                .output()
                .unwrap()
        })
    };
    std::thread::sleep(Duration::from_millis(1000));
    pg.stop_fast();
    let answer = background.join().unwrap();
    let answer: Value = serde_json::from_slice(&answer.stdout).unwrap();
    assert_eq!(answer["status"], "ok", "{answer}");
    let run_id = answer["run_id"].as_str().unwrap().to_string();
    served.kill();
    let spool = served.state_dir().join("spool");
    assert_eq!(
        finishes_in(&spool).len(),
        1,
        "not spooled: {}",
        served.log()
    );

    // No store: the service refuses to start rather than run unrecorded.
    let out = served.serve().output().unwrap();
    assert!(!out.status.success(), "serve started without its store");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("cannot be reached"),
        "{}",
        common::output_text(&out)
    );

    // Back: the next service writes the left-behind finish before it reaps the runs of
    // the killed one, so the run ends as it did (ok), not aborted.
    pg.restart();
    let _service = KillOnDrop(
        served
            .serve()
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    while readyz(&served).0 != 200 {
        assert!(
            Instant::now() < deadline,
            "the restarted service is not ready"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let status = pg.psql(
        "leftover",
        &format!("SELECT status FROM runs WHERE run_id = '{run_id}'"),
    );
    assert_eq!(status, "ok", "the spooled finish was not replayed first");
    assert!(finishes_in(&spool).is_empty(), "{:?}", finishes_in(&spool));
    let cli = served.cli(&["audit", "verify"]);
    assert!(cli.status.success(), "{}", common::output_text(&cli));
}

/// A service started by the test itself, killed when the test ends (or fails).
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn a_full_spool_still_answers_the_outcome_and_logs_the_lost_finish() {
    let _load = crate::exclusive();
    crate::require_cells!();
    let Some(mut pg) = PgServer::start() else {
        return;
    };
    let url = pg.create_db("full");
    // Room for one pending finish; two runs end during the outage.
    let served = Arc::new(Served::start(
        &format!("{}\n", config(&url)).replace("[server]", "spool_max_files = 1\n[server]"),
        |dir| {
            std::fs::copy(
                std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                    .join("../../examples/contracts/default.yaml"),
                dir.join("small.yaml"),
            )
            .unwrap();
        },
    ));
    wait_readyz(&served, 200, Duration::from_secs(60));
    let (begun, begun_rx) = std::sync::mpsc::channel();
    let runs: Vec<_> = (0..2)
        .map(|_| {
            let (port, begun) = (served.port, begun.clone());
            std::thread::spawn(move || streamed_run(port, &["sleep", "1"], begun))
        })
        .collect();
    let ids: Vec<String> = (0..2)
        .map(|_| begun_rx.recv_timeout(Duration::from_secs(60)).unwrap())
        .collect();
    pg.stop_fast();
    let answers: Vec<Answer> = runs.into_iter().map(|t| t.join().unwrap()).collect();
    for answer in &answers {
        assert_eq!(answer.status, 200, "{answer:?}");
        assert_eq!(
            answer.body["status"], "ok",
            "the outcome was not answered: {answer:?}"
        );
    }
    let log = served.log();
    assert!(
        log.contains("holds its bound of 1 pending finishes")
            && log.contains("is lost")
            && log.contains("1 finish(es) lost since start"),
        "the lost finish was not logged: {log}"
    );
    pg.restart();
    wait_readyz(&served, 200, Duration::from_secs(30));
    wait_spool_empty(&served);
    // The one spooled finish is written; the lost one's run is still `running`.
    let statuses: Vec<String> = ids
        .iter()
        .map(|id| {
            pg.psql(
                "full",
                &format!("SELECT status FROM runs WHERE run_id = '{id}'"),
            )
        })
        .collect();
    let mut sorted = statuses.clone();
    sorted.sort();
    assert_eq!(sorted, ["ok", "running"], "{statuses:?}");
}
