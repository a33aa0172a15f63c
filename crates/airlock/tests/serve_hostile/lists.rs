//! Bounded answers (issue 33, item 4): every list is a page of at most `limit` items and
//! 1 MiB of JSON, with an opaque cursor. Big records (runs with large argv), then 30
//! concurrent maximal lists: the server's peak RSS stays under the bound docs/api.md
//! states; walking the cursors gives every run of the caller exactly once and never
//! another tenant's; a cursor that is not one is a 400 ErrorBody.

use crate::common;
use crate::common::served::Served;
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::path::Path;

const ALICE: &str = "alice-key";
const BOB: &str = "bob-key";
/// Runs of big records alice starts.
const BIG_RUNS: usize = 150;
/// Bytes of each of the three big arguments of such a run.
const ARG_BYTES: usize = 60 * 1024;
const MAX_PAGE_BYTES: usize = 1 << 20;
/// The bound docs/api.md states for the growth of the server's peak RSS under 30
/// concurrent `limit=1000` lists of these records.
const PEAK_GROWTH_BOUND_KB: u64 = 128 * 1024;

fn config() -> String {
    format!(
        r#"[server]
listen = ["unix:SOCK", "tcp:127.0.0.1:PORT"]
# All 30 lists at once are served (the default share of 8 would answer 22 of them 429).
max_blocking_per_tenant = 32
[server.contracts]
small = "small.yaml"
[server.tenants.alice]
api_key_sha256 = ["{alice}"]
runs_per_minute = 100000
max_cells = 8
[server.tenants.bob]
api_key_sha256 = ["{bob}"]
"#,
        alice = common::sha256_hex(ALICE),
        bob = common::sha256_hex(BOB),
    )
}

fn prepare(dir: &Path) {
    std::fs::copy(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/contracts/default.yaml"),
        dir.join("small.yaml"),
    )
    .unwrap();
}

/// `curl` over TCP as `key`, the body from a file (big bodies do not fit an argument).
fn post_file(served: &Served, key: &str, path: &str, body: &Value, file: &Path) -> (u16, Value) {
    std::fs::write(file, body.to_string()).unwrap();
    let out = std::process::Command::new("curl")
        .args([
            "-sS",
            "--max-time",
            "120",
            "-w",
            "\n%{http_code}",
            "-X",
            "POST",
        ])
        .args(["-H", &format!("Authorization: Bearer {key}")])
        .args(["-H", "content-type: application/json", "--data-binary"])
        .arg(format!("@{}", file.display()))
        .arg(format!("http://127.0.0.1:{}{path}", served.port))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, status) = text.rsplit_once('\n').unwrap_or(("", "0"));
    (
        status.trim().parse().unwrap_or(0),
        serde_json::from_str(body).unwrap_or(Value::Null),
    )
}

/// Alice's big runs, 8 at a time: their run ids.
fn seed_big_runs(served: &Served) -> BTreeSet<String> {
    let per_thread = BIG_RUNS / 6;
    std::thread::scope(|scope| {
        let workers: Vec<_> = (0..6)
            .map(|t| {
                scope.spawn(move || {
                    let file = served.path(&format!("body-{t}.json"));
                    (0..per_thread)
                        .map(|i| {
                            let big =
                                |c: char| format!("{t}-{i}-{}", c.to_string().repeat(ARG_BYTES));
                            let body = json!({"contract": "small",
                                "argv": ["true", big('a'), big('b'), big('c')]});
                            let (status, record) =
                                post_file(served, ALICE, "/v1/runs?wait=true", &body, &file);
                            assert_eq!(status, 200, "{record}");
                            record["run_id"].as_str().unwrap().to_string()
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().unwrap())
            .collect()
    })
}

/// Every item of a list, following `next_cursor`: the items' `field`, in order.
fn walk(served: &Served, key: &str, path: &str, list: &str, field: &str) -> Vec<Value> {
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let sep = if path.contains('?') { '&' } else { '?' };
        let url = match &cursor {
            Some(c) => format!("{path}{sep}cursor={c}"),
            None => path.to_string(),
        };
        let (status, text) = served.call_text(key, "GET", &url, None);
        assert_eq!(status, 200, "{url}: {text}");
        assert!(
            text.len() <= MAX_PAGE_BYTES,
            "{url}: a page of {} bytes",
            text.len()
        );
        let page: Value = serde_json::from_str(&text).unwrap();
        let items = page[list].as_array().unwrap();
        seen.extend(items.iter().map(|i| i[field].clone()));
        match page["next_cursor"].as_str() {
            Some(next) => {
                assert!(!items.is_empty(), "{url}: an empty page that goes on");
                cursor = Some(next.to_string());
            }
            None => return seen,
        }
    }
}

fn strings(values: Vec<Value>) -> Vec<String> {
    values
        .into_iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect()
}

fn exactly_once(walked: &[String]) -> BTreeSet<String> {
    let set: BTreeSet<String> = walked.iter().cloned().collect();
    assert_eq!(set.len(), walked.len(), "an item came twice: {walked:?}");
    set
}

#[test]
fn thirty_maximal_lists_of_big_records_stay_bounded_and_cursors_walk_each_run_once() {
    let _load = crate::exclusive();
    if !common::cells_available() {
        return;
    }
    let served = Served::start(&config(), prepare);
    let alice_runs = seed_big_runs(&served);
    let bob_runs: BTreeSet<String> = (0..5)
        .map(|_| {
            let (status, record) = served.call(
                BOB,
                "POST",
                "/v1/runs?wait=true",
                Some(&json!({"contract": "small", "argv": ["true"]})),
            );
            assert_eq!(status, 200, "{record}");
            record["run_id"].as_str().unwrap().to_string()
        })
        .collect();

    // 30 lists at once, each asking for all 1000.
    let rss_before = served.status_kb("VmRSS:");
    let hwm_before = served.status_kb("VmHWM:");
    let pages: Vec<String> = std::thread::scope(|scope| {
        let lists: Vec<_> = (0..30)
            .map(|_| scope.spawn(|| served.call_text(ALICE, "GET", "/v1/runs?limit=1000", None)))
            .collect();
        lists
            .into_iter()
            .map(|l| {
                let (status, text) = l.join().unwrap();
                assert_eq!(status, 200, "{text}");
                text
            })
            .collect()
    });
    let hwm_after = served.status_kb("VmHWM:");
    let peak_growth = hwm_after.saturating_sub(rss_before);
    eprintln!(
        "{BIG_RUNS} runs of ~{} KB argv; 30 concurrent GET /v1/runs?limit=1000: server VmRSS \
         {rss_before} kB before (VmHWM {hwm_before} kB), VmHWM {hwm_after} kB after: peak \
         growth {peak_growth} kB; VmRSS {} kB after (RssAnon {} kB, RssFile {} kB); pages \
         of {:?} bytes",
        3 * ARG_BYTES / 1024,
        served.status_kb("VmRSS:"),
        served.status_kb("RssAnon:"),
        served.status_kb("RssFile:"),
        pages.iter().map(String::len).take(3).collect::<Vec<_>>()
    );
    for text in &pages {
        assert!(
            text.len() <= MAX_PAGE_BYTES,
            "a page of {} bytes",
            text.len()
        );
        let page: Value = serde_json::from_str(text).unwrap();
        let runs = page["runs"].as_array().unwrap();
        assert!(
            !runs.is_empty() && runs.len() < BIG_RUNS,
            "{} runs",
            runs.len()
        );
        assert!(page["next_cursor"].is_string(), "the list goes on");
    }
    assert!(
        peak_growth < PEAK_GROWTH_BOUND_KB,
        "30 maximal lists took the server's peak RSS {peak_growth} kB above its RSS"
    );

    // The cursors walk every run of the caller exactly once, and only the caller's.
    let walked = strings(walk(
        &served,
        ALICE,
        "/v1/runs?limit=1000",
        "runs",
        "run_id",
    ));
    assert_eq!(exactly_once(&walked), alice_runs);
    let small_pages = strings(walk(&served, ALICE, "/v1/runs?limit=7", "runs", "run_id"));
    assert_eq!(small_pages, walked, "the same order whatever the page size");
    let bobs = strings(walk(&served, BOB, "/v1/runs?limit=2", "runs", "run_id"));
    assert_eq!(exactly_once(&bobs), bob_runs);
    // Alice's cursor in bob's hands is a position in bob's own list, no more.
    let (_, first) = served.call(ALICE, "GET", "/v1/runs?limit=3", None);
    let alice_cursor = first["next_cursor"].as_str().unwrap();
    let (status, page) = served.call(BOB, "GET", &format!("/v1/runs?cursor={alice_cursor}"), None);
    assert_eq!(status, 200, "{page}");
    assert!(page["runs"]
        .as_array()
        .unwrap()
        .iter()
        .all(|r| r["tenant"] == "bob" && bob_runs.contains(r["run_id"].as_str().unwrap())));

    // The denied paths: a forged cursor, another list's cursor, a zero limit.
    let sessions_cursor = hex_of("sessions\nsomething");
    for (query, reason) in [
        ("cursor=zz", "cursor.invalid"),
        ("cursor=", "cursor.invalid"),
        (
            &format!("cursor={}", hex_of("runs\nnot-a-position")) as &str,
            "cursor.invalid",
        ),
        (&format!("cursor={sessions_cursor}"), "cursor.invalid"),
        ("limit=0", "limit.zero"),
    ] {
        let out = served.curl_unix(&[
            "-w",
            "\n%{http_code} %{content_type}",
            &format!("http://airlock/v1/runs?{query}"),
        ]);
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let (body, tail) = text.rsplit_once('\n').unwrap();
        assert_eq!(tail, "400 application/json", "{query}: {text}");
        let body: Value = serde_json::from_str(body).unwrap();
        assert_eq!(body["reason"], reason, "{query}: {body}");
    }
}

fn hex_of(s: &str) -> String {
    s.bytes().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn sessions_and_a_sessions_files_are_paged_by_cursor() {
    let _load = crate::exclusive();
    if !common::cells_available() {
        return;
    }
    let served = Served::start(&config(), prepare);
    let opened: BTreeSet<String> = (0..3)
        .map(|_| {
            let (status, view) = served.call(
                ALICE,
                "POST",
                "/v1/sessions",
                Some(&json!({"contract": "small"})),
            );
            assert_eq!(status, 201, "{view}");
            view["session_id"].as_str().unwrap().to_string()
        })
        .collect();
    let walked = strings(walk(
        &served,
        ALICE,
        "/v1/sessions?limit=1",
        "sessions",
        "session_id",
    ));
    assert_eq!(exactly_once(&walked), opened);
    assert!(walk(
        &served,
        BOB,
        "/v1/sessions?limit=1",
        "sessions",
        "session_id"
    )
    .is_empty());
    let (status, err) = served.call(ALICE, "GET", "/v1/sessions?cursor=00ff", None);
    assert_eq!(
        (status, err["reason"].as_str()),
        (400, Some("cursor.invalid"))
    );

    let session = opened.iter().next().unwrap();
    let (status, frames) = served.call(
        ALICE,
        "POST",
        &format!("/v1/sessions/{session}/exec"),
        Some(&json!({"argv": ["sh", "-c", "for i in $(seq 1 250); do : > /tmp/f$i; done"]})),
    );
    assert_eq!(status, 200, "{frames}");
    let names = strings(walk(
        &served,
        ALICE,
        &format!("/v1/sessions/{session}/files?dir=/tmp&limit=100"),
        "entries",
        "name",
    ));
    let expected: BTreeSet<String> = (1..=250).map(|i| format!("f{i}")).collect();
    assert_eq!(exactly_once(&names), expected);
    for id in &opened {
        served.call(ALICE, "DELETE", &format!("/v1/sessions/{id}"), None);
    }
}
