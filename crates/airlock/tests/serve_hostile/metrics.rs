//! `/metrics` under a tenant that names classes to forge series and blow up the server
//! (issue 33, item 3): after quotes, newlines, braces, a whole forged series, 500 KB names
//! and 10,000 distinct unknown names, the official Prometheus parsers (Python
//! `prometheus_client`, text 0.0.4 and OpenMetrics) and `promtool check metrics` accept
//! the scrape, no series names a class the configuration does not define, the series
//! count stays where it was, and the server's RSS does not grow with the names.

use crate::common;
use crate::common::served::Served;
use serde_json::Value;
use std::path::Path;
use std::process::{Command, Stdio};

const MALLORY: &str = "mallory-key";
const CAROL: &str = "carol-key";

fn config() -> String {
    format!(
        r#"[server]
listen = ["unix:SOCK", "tcp:127.0.0.1:PORT"]
[server.contracts]
small = "small.yaml"
[server.tenants.mallory]
api_key_sha256 = ["{mallory}"]
runs_per_minute = 100000
max_cells = 16
[server.tenants.carol]
api_key_sha256 = ["{carol}"]
runs_per_minute = 2
max_sessions = 4
"#,
        mallory = common::sha256_hex(MALLORY),
        carol = common::sha256_hex(CAROL),
    )
}

fn prepare(dir: &Path) {
    std::fs::copy(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/contracts/default.yaml"),
        dir.join("small.yaml"),
    )
    .unwrap();
}

/// The families docs/api.md lists (their sample names in text 0.0.4).
const DOCUMENTED: [&str; 13] = [
    "airlock_runs_total",
    "airlock_start_latency_seconds",
    "airlock_wall_time_seconds",
    "airlock_denials_total",
    "airlock_deadline_kills_total",
    "airlock_ceilings_fired_total",
    "airlock_cleanup_failures_total",
    "airlock_pool_size",
    "airlock_pool_free",
    "airlock_sessions_active",
    "airlock_cells_alive",
    "airlock_metrics_series_dropped_total",
    "airlock_store_finishes_lost_total",
];

/// The hostile tenant's requests, sent by one Python (httpx) client over keep-alive:
/// `names` run requests naming each as its contract, every one refused.
const INJECT: &str = r#"
import json, sys, httpx
url, key, path = sys.argv[1], sys.argv[2], sys.argv[3]
names = json.load(open(path))
codes = {}
with httpx.Client(base_url=url, headers={"Authorization": "Bearer " + key}, timeout=120) as c:
    for name in names:
        r = c.post("/v1/runs?wait=true", json={"contract": name, "argv": ["true"]})
        codes[r.status_code] = codes.get(r.status_code, 0) + 1
print(json.dumps(codes))
"#;

/// Parses a scrape with the official parsers: what they saw, or why they refused it.
const PARSE: &str = r#"
import json, sys
from prometheus_client.parser import text_string_to_metric_families as text_parse
from prometheus_client.openmetrics.parser import text_string_to_metric_families as om_parse
text, openmetrics = open(sys.argv[1]).read(), open(sys.argv[2]).read()
def seen(families):
    out = {"families": [], "samples": [], "classes": set(), "tenants": set()}
    for f in families:
        out["families"].append(f.name)
        if not f.documentation:
            raise SystemExit("no HELP for " + f.name)
        for s in f.samples:
            out["samples"].append([s.name, s.labels, s.value])
            if "class" in s.labels: out["classes"].add(s.labels["class"])
            if "tenant" in s.labels: out["tenants"].add(s.labels["tenant"])
    out["classes"] = sorted(out["classes"]); out["tenants"] = sorted(out["tenants"])
    return out
print(json.dumps({"text": seen(text_parse(text)), "openmetrics": seen(om_parse(openmetrics))}))
"#;

struct Scrape {
    text: String,
    openmetrics: String,
}

fn scrape(served: &Served) -> Scrape {
    let get = |accept: &str, want_type: &str| {
        let out = served.curl_unix(&[
            "-f",
            "-H",
            &format!("Accept: {accept}"),
            "-w",
            "\n%{content_type}",
            "http://airlock/metrics",
        ]);
        assert!(out.status.success(), "{}", common::output_text(&out));
        let all = String::from_utf8(out.stdout).unwrap();
        let (body, content_type) = all.rsplit_once('\n').unwrap();
        assert_eq!(content_type, want_type, "Accept: {accept}");
        format!("{body}\n")
    };
    Scrape {
        text: get("*/*", "text/plain; version=0.0.4; charset=utf-8"),
        openmetrics: get(
            "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5",
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        ),
    }
}

/// The official parsers' view of a scrape (both formats); panics if either refuses it.
fn parsed(served: &Served, scrape: &Scrape) -> Value {
    let text = served.path("scrape.txt");
    let om = served.path("scrape.om");
    std::fs::write(&text, &scrape.text).unwrap();
    std::fs::write(&om, format!("{}\n", scrape.openmetrics.trim_end())).unwrap();
    let out = Command::new("python3")
        .args(["-c", PARSE])
        .arg(&text)
        .arg(&om)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "the Prometheus parser refused the scrape: {}\n{}",
        common::output_text(&out),
        scrape.text
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn promtool_accepts(text: &str) {
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool (Debian's prometheus package, installed by .ci/run)");
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool check metrics: {}\n{text}",
        common::output_text(&out)
    );
}

fn inject(served: &Served, names: &[String]) -> Value {
    let path = served.path("names.json");
    std::fs::write(&path, serde_json::to_vec(names).unwrap()).unwrap();
    let out = Command::new("python3")
        .args(["-c", INJECT])
        .arg(format!("http://127.0.0.1:{}", served.port))
        .arg(MALLORY)
        .arg(&path)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", common::output_text(&out));
    serde_json::from_slice(&out.stdout).unwrap()
}

fn series(view: &Value) -> usize {
    view["samples"].as_array().unwrap().len()
}

#[test]
fn injected_class_names_forge_nothing_and_grow_nothing() {
    let _load = crate::shared();
    if !common::cells_available() {
        return;
    }
    let served = Served::start(&config(), prepare);
    // One real run, so the families of a run have series of a known class.
    let (status, record) = served.call(
        MALLORY,
        "POST",
        "/v1/runs?wait=true",
        Some(&serde_json::json!({"contract": "small", "argv": ["true"]})),
    );
    assert_eq!(status, 200, "{record}");
    let first = scrape(&served);
    promtool_accepts(&first.text);
    let before = parsed(&served, &first);
    // Every documented family is described (HELP and TYPE, under its sample name), even
    // one with no series yet; the parser keeps the ones with samples.
    for family in DOCUMENTED {
        let described = |what: &str| {
            let line = format!("# {what} {family} ");
            first.text.lines().any(|l| l.starts_with(&line))
        };
        assert!(
            described("HELP") && described("TYPE"),
            "{family} is documented but not exported:\n{}",
            first.text
        );
    }
    let zero = |name: &str, labels: Value| {
        before["text"]["samples"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s[0] == name && s[1] == labels && s[2] == 0.0)
    };
    assert!(zero(
        "airlock_cleanup_failures_total",
        serde_json::json!({"class": "small", "tenant": "mallory"})
    ));
    assert!(zero(
        "airlock_sessions_active",
        serde_json::json!({"tenant": "mallory"})
    ));
    let rss_before = served.status_kb("VmRSS:");

    let mut hostile: Vec<String> = [
        "\"",
        "a\nb",
        "}",
        "{a=\"b\"}",
        "x\",tenant=\"operator\"} 1e9\nairlock_cells_alive 1e9\n# TYPE forged counter\nforged_total{a=\"",
        "\\",
        "ünïcödé",
    ]
    .map(String::from)
    .to_vec();
    hostile.extend((0..100).map(|i| format!("{i}{}", "x".repeat(500 * 1024))));
    hostile.extend((0..10_000).map(|i| format!("unknown-{i}")));
    let codes = inject(&served, &hostile);
    let refused: u64 = codes
        .as_object()
        .unwrap()
        .iter()
        .filter(|(code, _)| code.starts_with('4'))
        .map(|(_, n)| n.as_u64().unwrap())
        .sum();
    assert_eq!(refused, hostile.len() as u64, "every name refused: {codes}");

    let after_scrape = scrape(&served);
    promtool_accepts(&after_scrape.text);
    let after = parsed(&served, &after_scrape);
    for format in ["text", "openmetrics"] {
        let classes = after[format]["classes"].as_array().unwrap();
        assert!(
            classes
                .iter()
                .all(|c| ["", "small", "unknown"].contains(&c.as_str().unwrap()))
                && classes.contains(&Value::from("unknown")),
            "{format}: only the configuration's classes (and unknown) are label values: \
             {classes:?}"
        );
        let families = after[format]["families"].as_array().unwrap();
        assert!(
            families
                .iter()
                .all(|f| f.as_str().unwrap().starts_with("airlock_")),
            "{format}: a forged family: {families:?}"
        );
    }
    let cells_alive = after["text"]["samples"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s[0] == "airlock_cells_alive")
        .unwrap()[2]
        .as_f64()
        .unwrap();
    assert!(cells_alive < 100.0, "a forged value: {cells_alive}");
    // The names added one denials series (class unknown, reason of the refusal), nothing
    // per name.
    let grown = series(&after["text"]) - series(&before["text"]);
    assert!(
        grown <= 8,
        "10,107 names added {grown} series:\n{}",
        after_scrape.text
    );
    let rss_after = served.status_kb("VmRSS:");
    let grown_kb = rss_after.saturating_sub(rss_before);
    eprintln!(
        "server VmRSS {rss_before} kB before, {rss_after} kB after 10,107 injected names \
         (100 of 500 KB); VmHWM {} kB",
        served.status_kb("VmHWM:")
    );
    assert!(
        grown_kb < 32 * 1024,
        "the names' bytes stayed in the server: VmRSS grew by {grown_kb} kB"
    );
}

/// `runs_per_minute` counts what starts a payload (runs, session commands), not session
/// opens (issue 33, item 7); the refusal is counted in `/metrics` under its reason.
#[test]
fn session_opens_are_not_runs_for_runs_per_minute() {
    let _load = crate::shared();
    if !common::cells_available() {
        return;
    }
    let served = Served::start(&config(), prepare);
    let sessions: Vec<String> = (0..3)
        .map(|_| {
            let (status, view) = served.call(
                CAROL,
                "POST",
                "/v1/sessions",
                Some(&serde_json::json!({"contract": "small"})),
            );
            assert_eq!(status, 201, "3 opens within runs_per_minute = 2: {view}");
            view["session_id"].as_str().unwrap().to_string()
        })
        .collect();
    let exec = |id: &str| {
        served.call(
            CAROL,
            "POST",
            &format!("/v1/sessions/{id}/exec"),
            Some(&serde_json::json!({"argv": ["true"]})),
        )
    };
    assert_eq!(exec(&sessions[0]).0, 200);
    assert_eq!(exec(&sessions[1]).0, 200);
    let (status, refused) = exec(&sessions[2]);
    assert_eq!(status, 429, "a third start in the minute: {refused}");
    assert_eq!(refused["reason"], "quota.runs_per_minute");
    let text = scrape(&served).text;
    assert!(
        text.contains(
            "airlock_denials_total{class=\"\",tenant=\"carol\",reason=\"quota.runs_per_minute\"} 1\n"
        ),
        "{text}"
    );
    for id in &sessions {
        served.call(CAROL, "DELETE", &format!("/v1/sessions/{id}"), None);
    }
}
