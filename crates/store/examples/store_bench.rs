//! Cost of the per-tool-call store path (release build):
//! `cargo run --release -p airlock-store --example store_bench [-- N [DIR]]`
//!
//! Prints median and p99 of: open alone, begin+finish on an open store, and
//! open+begin+finish (what the CLI does around every run).

use std::time::{Duration, Instant};

use airlock_store::{RunEnd, RunStart, Store};
use serde_json::json;

fn start() -> RunStart {
    RunStart {
        argv: vec!["/bin/true".into()],
        input_sha256: "a".repeat(64),
        contract_sha256: "b".repeat(64),
        workload_class: "bench".into(),
        plan_json: json!({"net": "none", "memory": "256M", "pids": 64}),
        session_id: None,
        tenant: None,
    }
}

fn end() -> RunEnd {
    RunEnd {
        status: "ok".into(),
        exit_code: Some(0),
        usage: json!({"cpu_usec": 900, "memory_peak_bytes": 1 << 20, "pids_peak": 1}),
        startup_ms: 2.1,
        wall_ms: 2.9,
        stdout_head: "hello\n".into(),
        cleanup_ok: true,
        cleanup_leftovers: json!([]),
        result_json: json!({"artifacts": []}),
        ..Default::default()
    }
}

fn report(name: &str, mut v: Vec<Duration>) {
    v.sort();
    let p = |q: f64| v[((q * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1];
    println!(
        "{name:<28} median {:>8.1} us   p99 {:>8.1} us   (n={})",
        p(0.5).as_secs_f64() * 1e6,
        p(0.99).as_secs_f64() * 1e6,
        v.len()
    );
}

fn main() {
    let mut args = std::env::args().skip(1);
    let n: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(2000);
    let tmp;
    let dir = match args.next() {
        Some(d) => std::path::PathBuf::from(d),
        None => {
            tmp = std::env::temp_dir().join(format!("airlock-store-bench-{}", std::process::id()));
            tmp.clone()
        }
    };
    let secrets = vec!["sk-bench-secret-value".to_string()];
    drop(Store::open(&dir).expect("open"));

    let mut open = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        let s = Store::open(&dir).expect("open");
        open.push(t.elapsed());
        drop(s);
    }
    let store = Store::open(&dir).expect("open");
    let mut bf = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        let h = store.begin_run(start(), secrets.clone()).expect("begin");
        store.finish_run(&h, end()).expect("finish");
        bf.push(t.elapsed());
    }
    drop(store);
    let mut all = Vec::with_capacity(n);
    let (mut o3, mut bf3, mut c3) = (vec![], vec![], vec![]);
    for _ in 0..n {
        let t = Instant::now();
        let s = Store::open(&dir).expect("open");
        let t1 = t.elapsed();
        let h = s.begin_run(start(), secrets.clone()).expect("begin");
        s.finish_run(&h, end()).expect("finish");
        let t2 = t.elapsed();
        drop(s);
        all.push(t.elapsed());
        o3.push(t1);
        bf3.push(t2 - t1);
        c3.push(t.elapsed() - t2);
    }
    report("  of which open", o3);
    report("  of which begin+finish", bf3);
    report("  of which close", c3);
    report("open", open);
    report("begin+finish (open store)", bf);
    report("open+begin+finish+close", all);
    let s = Store::open(&dir).expect("open");
    let t = Instant::now();
    let r = s.verify().expect("verify");
    println!("verify of {} entries: {:?}", r.entries, t.elapsed());
    if std::env::args().nth(2).is_none() {
        let _ = std::fs::remove_dir_all(&dir);
    }
}
