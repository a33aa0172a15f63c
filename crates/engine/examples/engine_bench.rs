//! Benchmarks of the engine in one process (scripts/bench.sh runs them):
//!
//! - `claim N`: a warm pool of `/bin/true`'s shape, then N runs claiming from it, one at a
//!   time: the median claim-to-exec (command sent -> the payload's exec confirmed) and
//!   request-to-exit (the request handed to the engine -> the payload's exit known,
//!   begin record included), and the teardown after it.
//! - `threads T SECONDS`: T threads driving `/bin/true` runs through the engine (a warm
//!   pool of T cells, built-on-demand cells when it runs dry): runs per second, p50/p99.
//!
//! Both also report the CPU time per run, which the load of a shared machine moves far
//! less than wall-clock figures: `engine_cpu_ms_per_run` (this process: the engine's
//! threads, the store's records, the bench's own requests) and `cells_cpu_ms_per_run` (the
//! cell factory and everything it reaped: supervisors, cells' pid 1s, payloads).
//!
//! Output: one JSON object on stdout. This binary is also its own cell factory.

use airlock_cell::PayloadStdin;
use airlock_contract::{compile, default_contract, CellPlan, CompileInput};
use airlock_engine::{Engine, EngineConfig, RunRequest};
use std::path::Path;
use std::time::{Duration, Instant};

fn main() {
    airlock_engine::factory::run_factory_if_requested();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let state = tempfile::tempdir().expect("state dir");
    let mut config = EngineConfig::new(state.path().to_path_buf(), Default::default());
    config.program = std::env::current_exe().expect("own path");
    config.max_cells = 256;
    let engine = Engine::new(config);
    match args.first().map(String::as_str) {
        Some("claim") => claim(
            &engine,
            args.get(1).and_then(|n| n.parse().ok()).unwrap_or(200),
        ),
        Some("threads") => threads(
            &engine,
            args.get(1).and_then(|n| n.parse().ok()).unwrap_or(16),
            Duration::from_secs(args.get(2).and_then(|n| n.parse().ok()).unwrap_or(30)),
        ),
        _ => {
            eprintln!("usage: engine_bench claim N | threads T SECONDS");
            std::process::exit(2);
        }
    }
}

fn plan() -> CellPlan {
    let argv = vec!["/bin/true".to_string()];
    compile(
        &default_contract(),
        &CompileInput::new(Path::new("/"), &argv),
    )
    .expect("the default contract compiles")
}

fn request() -> RunRequest {
    RunRequest {
        plan: plan(),
        workload_class: "bench".into(),
        credentials: Vec::new(),
        stdin: PayloadStdin::Null,
        artifacts: None,
        stdout: None,
        stderr: None,
        started: Instant::now(),
        tenant: None,
        on_recorded: None,
        caller: None,
    }
}

fn wait_for_pool(engine: &Engine, n: usize) {
    let until = Instant::now() + Duration::from_secs(60);
    while engine.pool_status().iter().map(|p| p.parked).sum::<usize>() < n {
        assert!(Instant::now() < until, "the pool did not fill");
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn median(values: &mut [f64]) -> f64 {
    percentile(values, 0.5)
}

fn percentile(values: &mut [f64], p: f64) -> f64 {
    values.sort_by(|a, b| a.total_cmp(b));
    if values.is_empty() {
        return 0.0;
    }
    values[((values.len() - 1) as f64 * p).round() as usize]
}

/// CPU time (user + system) in clock ticks of `pid`, and of its reaped children when
/// `children`: fields 14-17 of `/proc/<pid>/stat`.
fn cpu_ticks(pid: u32, children: bool) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let fields: Vec<u64> = stat
        .rsplit_once(')')
        .map_or("", |(_, rest)| rest)
        .split_whitespace()
        .skip(11)
        .take(4)
        .map(|f| f.parse().unwrap_or(0))
        .collect();
    let taken = if children { 4 } else { 2 };
    fields.iter().take(taken).sum()
}

/// The CPU time of this process and of the cell side (the factory with every supervisor,
/// cell and payload it reaped), in ms.
struct CpuSnapshot {
    engine: u64,
    cells: u64,
}

/// `/proc`'s clock ticks per second (USER_HZ, fixed at 100 on x86-64 Linux).
const TICKS_PER_SECOND: f64 = 100.0;

impl CpuSnapshot {
    fn take(engine: &Engine) -> CpuSnapshot {
        CpuSnapshot {
            engine: cpu_ticks(std::process::id(), false),
            cells: engine.factory_pid().map_or(0, |pid| cpu_ticks(pid, true)),
        }
    }

    /// `(engine, cells)` ms of CPU per run since `self`. The factory reaps its exited
    /// supervisors once a second: give it that long first.
    fn per_run(&self, engine: &Engine, runs: usize) -> (f64, f64) {
        std::thread::sleep(Duration::from_millis(1100));
        let now = CpuSnapshot::take(engine);
        let per_run = |ticks: u64| ticks as f64 * 1000.0 / TICKS_PER_SECOND / runs.max(1) as f64;
        (
            per_run(now.engine - self.engine),
            per_run(now.cells - self.cells),
        )
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn claim(engine: &Engine, n: usize) {
    engine.keep_warm(plan(), 4).expect("factory");
    let mut to_exec = Vec::new();
    let mut to_exit = Vec::new();
    let mut teardown = Vec::new();
    wait_for_pool(engine, 4);
    let cpu = CpuSnapshot::take(engine);
    for _ in 0..n {
        // Every claim finds a parked cell: the measure is the claim, not the refill.
        wait_for_pool(engine, 4);
        let request = request();
        let started = request.started;
        let finished = engine.run(request).unwrap_or_else(|_| panic!("refused"));
        let latency = finished.latency.expect("a warm claim's latency");
        assert!(finished.audit_error().is_none());
        to_exec.push(ms(latency.exec_confirmed - latency.command_sent));
        to_exit.push(ms(latency.exit_known - started));
        teardown.push(ms(latency.closed - latency.exit_known));
        let report = engine.complete(finished).expect("record");
        assert_eq!(report.exit_code, 0, "{:?}", report.error);
    }
    let (engine_cpu, cells_cpu) = cpu.per_run(engine, n);
    println!(
        "{{\"claims\": {n}, \"claim_to_exec_ms_median\": {:.3}, \"request_to_exit_ms_median\": {:.3}, \"teardown_ms_median\": {:.3}, \"engine_cpu_ms_per_run\": {engine_cpu:.3}, \"cells_cpu_ms_per_run\": {cells_cpu:.3}}}",
        median(&mut to_exec),
        median(&mut to_exit),
        median(&mut teardown)
    );
}

fn threads(engine: &Engine, threads: usize, duration: Duration) {
    engine.keep_warm(plan(), threads).expect("factory");
    wait_for_pool(engine, threads);
    let cpu = CpuSnapshot::take(engine);
    let until = Instant::now() + duration;
    let started = Instant::now();
    let latencies: Vec<Vec<f64>> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(move || {
                    let mut mine = Vec::new();
                    while Instant::now() < until {
                        let request = request();
                        let t = request.started;
                        let finished = engine.run(request).unwrap_or_else(|_| panic!("refused"));
                        let report = engine.complete(finished).expect("record");
                        assert_eq!(report.exit_code, 0, "{:?}", report.error);
                        mine.push(ms(t.elapsed()));
                    }
                    mine
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().expect("worker"))
            .collect()
    });
    let elapsed = started.elapsed().as_secs_f64();
    let mut all: Vec<f64> = latencies.into_iter().flatten().collect();
    let runs = all.len();
    let (engine_cpu, cells_cpu) = cpu.per_run(engine, runs);
    println!(
        "{{\"threads\": {threads}, \"seconds\": {elapsed:.1}, \"runs\": {runs}, \"runs_per_second\": {:.1}, \"p50_ms\": {:.2}, \"p99_ms\": {:.2}, \"live_cells_after\": {}, \"engine_cpu_ms_per_run\": {engine_cpu:.3}, \"cells_cpu_ms_per_run\": {cells_cpu:.3}}}",
        runs as f64 / elapsed,
        percentile(&mut all, 0.5),
        percentile(&mut all, 0.99),
        engine.live_cells().saturating_sub(threads),
    );
}
