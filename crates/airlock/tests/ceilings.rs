//! Resource ceilings, end to end: every limit of the contract fires, is classified from
//! real signals, and nothing of the cell survives the run (docs/architecture.md: "Launch sequence", "Result classes").
//!
//! Each case runs on both tiers (`native` and `gvisor` tests of one module, see
//! common/tier.rs) unless its comment says why it cannot apply to one.
//!
//! The tests run one at a time (a process-wide lock): several of them measure wall time
//! or peak memory, which a fork bomb or a busy loop next door would distort on a small
//! host.

mod common;

use common::tier::Tier;
use common::{host, CellRun};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A string no other process on the host carries in its command line, usable as a
/// `sleep` argument (`sleep 300.<digits>`).
fn marker_digits() -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!(
        "{}{:09}{}",
        std::process::id(),
        nanos,
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// Cgroup directories the run left: those named after its supervisor (its pid and start
/// time begin the name), which has exited. Other cells on the host, whoever runs them,
/// do not count.
fn cgroup_dirs_of(run: &CellRun) -> Vec<PathBuf> {
    let supervisor = run
        .supervisor
        .as_ref()
        .unwrap_or_else(|| panic!("the run's supervisor is unknown\n{}", run.describe()));
    host::cgroups_of(supervisor)
}

/// Everything the run left behind on the host: marker processes and cgroup dirs.
fn assert_nothing_left(run: &CellRun, marker: &str) {
    let procs = host::processes_with(marker);
    assert!(
        procs.is_empty(),
        "processes of the cell survived the run: {procs:#?}\n{}",
        run.describe()
    );
    let dirs = cgroup_dirs_of(run);
    assert!(
        dirs.is_empty(),
        "cgroup dirs of the run are left: {dirs:?}\n{}",
        run.describe()
    );
    assert_eq!(
        run.result["cleanup"]["ok"],
        true,
        "cleanup not ok\n{}",
        run.describe()
    );
}

fn timed(tier: Tier, contract: &str, argv: &[&str]) -> (CellRun, Duration) {
    let started = Instant::now();
    let run = tier.run(Some(contract), argv);
    (run, started.elapsed())
}

fn usage_f64(run: &CellRun, field: &str) -> f64 {
    run.result["usage"][field]
        .as_f64()
        .unwrap_or_else(|| panic!("usage.{field} missing\n{}", run.describe()))
}

// ---------------------------------------------------------------------------------------
// 1. memory

both_tiers! {
    fn memory_ceiling_kills_a_500_mb_allocation(tier) {
        require_cells!();
        let _serial = serial();
        let run = tier.run(
            Some("resources:\n  memory_mb: 128\n"),
            &[
                "python3",
                "-c",
                "b = bytearray(500 * 2**20)\nfor i in range(0, len(b), 4096): b[i] = 1\nprint('allocated', len(b))",
            ],
        );
        assert_eq!(run.status(), "capacity_exceeded", "{}", run.describe());
        assert_eq!(run.limit_fired(), Some("memory"), "{}", run.describe());
        assert_eq!(run.code(), 137, "{}", run.describe());
        assert_eq!(run.result["exit_code"], 137, "{}", run.describe());
        assert!(
            usage_f64(&run, "oom_kills") >= 1.0,
            "no oom kill counted\n{}",
            run.describe()
        );
        assert!(
            !run.stdout().contains("allocated"),
            "the allocation succeeded\n{}",
            run.describe()
        );
        let peak = usage_f64(&run, "memory_peak_bytes");
        assert!(
            peak <= 129.0 * 1024.0 * 1024.0,
            "memory peak {peak} above the 128 MiB ceiling\n{}",
            run.describe()
        );
    }
}

// ---------------------------------------------------------------------------------------
// 2. pids

/// Native only: on gVisor the payload's processes are gVisor's tasks, `process_limit` is
/// `RLIMIT_NPROC` inside its kernel and the host cgroup's pids counter sees the Sentry's
/// threads, not the bomb's forks, so `pids_limit_hits` and `pids_peak` cannot say what
/// this test asserts. The gVisor tier's own case is gvisor.rs's
/// `forks_beyond_the_process_limit_are_refused_inside_the_sandbox`.
#[test]
fn fork_bomb_is_contained_by_the_process_limit() {
    require_cells!();
    let _serial = serial();
    let marker = format!("forkbomb{}", marker_digits());
    // dash forks without exec, so every bomb process carries the marker in its cmdline.
    let script = format!("bomb(){{ bomb|bomb& }}; bomb; sleep 1; : {marker}");
    let (run, elapsed) = timed(
        Tier::Native,
        "resources:\n  process_limit: 64\n  wall_time_seconds: 5\n",
        &["/bin/sh", "-c", &script],
    );
    println!(
        "fork bomb: {:?}, pids_peak {}, pids_limit_hits {}",
        elapsed, run.result["usage"]["pids_peak"], run.result["usage"]["pids_limit_hits"]
    );
    assert!(
        run.result["limits_hit"]
            .as_array()
            .is_some_and(|hits| hits.contains(&"pids".into())),
        "{}",
        run.describe()
    );
    // The ceiling refuses forks; it kills nothing. The bomb's first shell ends on its own
    // (0 when its `sleep` could still be forked, 2 when it could not), and that code is
    // the run's: `ok` with the hit recorded, or the pids ceiling when the shell failed.
    let own_code = run.result["exit"]["code"]
        .as_i64()
        .unwrap_or_else(|| panic!("the shell did not exit on its own\n{}", run.describe()));
    assert_eq!(i64::from(run.code()), own_code, "{}", run.describe());
    let (status, limit) = match own_code {
        0 => ("ok", None),
        _ => ("capacity_exceeded", Some("pids")),
    };
    assert_eq!(run.status(), status, "{}", run.describe());
    assert_eq!(run.limit_fired(), limit, "{}", run.describe());
    assert!(
        usage_f64(&run, "pids_limit_hits") > 0.0,
        "no pids limit hit counted\n{}",
        run.describe()
    );
    // 64 of the payload plus airlock's own pid 1 (docs/contract.md, `process_limit`).
    assert!(
        usage_f64(&run, "pids_peak") <= 65.0,
        "pids peak above the limit\n{}",
        run.describe()
    );
    // The host is healthy: it can still start processes...
    let probe = Command::new("/bin/sh")
        .args(["-c", "echo alive"])
        .output()
        .expect("the host cannot spawn a process after the fork bomb");
    assert_eq!(String::from_utf8_lossy(&probe.stdout), "alive\n");
    // ... and nothing of the bomb is left.
    assert_nothing_left(&run, &marker);
    let orphans = host::leftover_cell_processes();
    assert!(
        orphans.is_empty(),
        "cell processes outlived their supervisor after the fork bomb: {orphans:#?}\n{}",
        run.describe()
    );
}

// ---------------------------------------------------------------------------------------
// 3. wall time: busy, SIGTERM-ignoring, daemonised

const TWO_SECONDS: &str = "resources:\n  wall_time_seconds: 2\n";
/// Deadline (2 s) + grace (1 s) + slack.
const DEADLINE_BOUND: Duration = Duration::from_secs(5);

fn assert_killed_at_deadline(run: &CellRun, elapsed: Duration, marker: &str) {
    println!("{marker}: airlock run took {elapsed:?}");
    assert!(
        elapsed < DEADLINE_BOUND,
        "the run took {elapsed:?}, more than deadline + grace + slack ({DEADLINE_BOUND:?})\n{}",
        run.describe()
    );
    assert!(
        elapsed >= Duration::from_millis(1900),
        "the run ended before its deadline ({elapsed:?})\n{}",
        run.describe()
    );
    assert_eq!(run.code(), 124, "{}", run.describe());
    assert_eq!(run.status(), "capacity_exceeded", "{}", run.describe());
    assert_eq!(run.limit_fired(), Some("wall_time"), "{}", run.describe());
    assert_nothing_left(run, marker);
}

both_tiers! {
    fn busy_loop_dies_at_the_deadline(tier) {
        require_cells!();
        let _serial = serial();
        let marker = format!("busy{}", marker_digits());
        let script = format!("while :; do :; done; : {marker}");
        let (run, elapsed) = timed(tier, TWO_SECONDS, &["/bin/sh", "-c", &script]);
        assert_killed_at_deadline(&run, elapsed, &marker);
    }
}

both_tiers! {
    fn sigterm_ignoring_process_dies_at_the_deadline(tier) {
        require_cells!();
        let _serial = serial();
        let marker = format!("noterm{}", marker_digits());
        let script = format!("trap '' TERM; while :; do :; done; : {marker}");
        let (run, elapsed) = timed(tier, TWO_SECONDS, &["/bin/sh", "-c", &script]);
        assert_killed_at_deadline(&run, elapsed, &marker);
    }
}

both_tiers! {
    fn double_forked_setsid_daemon_dies_with_the_cell(tier) {
        require_cells!();
        let _serial = serial();
        let digits = marker_digits();
        let marker = format!("sleep 300.{digits}");
        // setsid + background + exiting parent: the daemon is reparented and in its own
        // session; only its marker (the sleep argument) identifies it.
        let script = format!("setsid sh -c '{marker} &'; sleep 60");
        let (run, elapsed) = timed(tier, TWO_SECONDS, &["/bin/sh", "-c", &script]);
        assert_killed_at_deadline(&run, elapsed, &format!("300.{digits}"));
    }
}

both_tiers! {
    fn sigterm_ignoring_daemon_dies_at_the_deadline(tier) {
        require_cells!();
        let _serial = serial();
        let digits = marker_digits();
        let script = format!(
            "setsid sh -c 'trap \"\" TERM; while :; do sleep 0.1; done; : 300.{digits}' & sleep 60"
        );
        let (run, elapsed) = timed(tier, TWO_SECONDS, &["/bin/sh", "-c", &script]);
        assert_killed_at_deadline(&run, elapsed, &format!("300.{digits}"));
    }
}

// ---------------------------------------------------------------------------------------
// 4. stopped processes

both_tiers! {
    fn stopped_process_does_not_survive_a_normal_exit(tier) {
        require_cells!();
        let _serial = serial();
        let digits = marker_digits();
        // The child stops itself; the payload exits 0 right after, leaving it behind.
        let script = format!("sh -c 'kill -STOP $$; sleep 300.{digits}' & sleep 0.3; exit 0");
        let (run, elapsed) = timed(tier, "{}\n", &["/bin/sh", "-c", &script]);
        println!("stopped child, normal exit: {elapsed:?}");
        assert_eq!(run.code(), 0, "{}", run.describe());
        assert_eq!(run.status(), "ok", "{}", run.describe());
        assert!(
            elapsed < Duration::from_secs(5),
            "the run waited for the stopped child ({elapsed:?})\n{}",
            run.describe()
        );
        assert_nothing_left(&run, &format!("300.{digits}"));
    }
}

both_tiers! {
    fn stopped_process_does_not_survive_the_deadline(tier) {
        require_cells!();
        let _serial = serial();
        let digits = marker_digits();
        let script = format!("sh -c 'kill -STOP $$; sleep 300.{digits}' & sleep 60");
        let (run, elapsed) = timed(tier, TWO_SECONDS, &["/bin/sh", "-c", &script]);
        assert_killed_at_deadline(&run, elapsed, &format!("300.{digits}"));
    }
}

// ---------------------------------------------------------------------------------------
// 5. output flood

/// Runs airlock under `/usr/bin/time -v` (or polls its VmHWM) and returns the run and the
/// supervisor's peak RSS in KiB.
fn run_measuring_rss(
    tier: Tier,
    dir: &Path,
    contract: &str,
    argv: &[&str],
) -> (CellRun, u64, &'static str) {
    let contract_path = dir.join("contract.yaml");
    std::fs::write(&contract_path, tier.contract(Some(contract)).unwrap()).unwrap();
    let result_path = dir.join("result.json");
    let time_log = dir.join("time.txt");
    let gnu_time = Path::new("/usr/bin/time").exists();
    let mut cmd = if gnu_time {
        let mut c = Command::new("/usr/bin/time");
        c.arg("-v")
            .arg("-o")
            .arg(&time_log)
            .arg(common::airlock_bin());
        c
    } else {
        Command::new(common::airlock_bin())
    };
    cmd.current_dir(dir)
        .arg("run")
        .arg("--state-dir")
        .arg(common::state_dir())
        .arg("--result")
        .arg(&result_path)
        .arg("--contract")
        .arg(&contract_path)
        .arg("--")
        .args(argv)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("spawn airlock");
    let mut polled_kib = 0u64;
    if !gnu_time {
        let status_path = format!("/proc/{}/status", child.id());
        while child.try_wait().unwrap().is_none() {
            if let Ok(status) = std::fs::read_to_string(&status_path) {
                if let Some(kib) = status
                    .lines()
                    .find(|l| l.starts_with("VmHWM:"))
                    .and_then(|l| l.split_whitespace().nth(1))
                    .and_then(|v| v.parse::<u64>().ok())
                {
                    polled_kib = polled_kib.max(kib);
                }
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    let output = child.wait_with_output().unwrap();
    let result = std::fs::read_to_string(&result_path)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or(serde_json::Value::Null);
    let run = CellRun {
        output,
        result,
        supervisor: None,
    };
    if gnu_time {
        let log = std::fs::read_to_string(&time_log).unwrap_or_default();
        let kib = log
            .lines()
            .find(|l| l.contains("Maximum resident set size"))
            .and_then(|l| l.rsplit(':').next())
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or_else(|| panic!("no maxrss in /usr/bin/time output: {log}"));
        (run, kib, "/usr/bin/time -v")
    } else {
        (run, polled_kib, "polled VmHWM")
    }
}

both_tiers! {
fn one_gib_output_flood_is_truncated_with_bounded_supervisor_memory(tier) {
    require_cells!();
    let _serial = serial();
    const GIB: u64 = 1 << 30;
    const LIMIT: u64 = 1 << 20;
    let dir = tempfile::tempdir().unwrap();
    let started = Instant::now();
    let (run, rss_kib, how) = run_measuring_rss(
        tier,
        dir.path(),
        &format!("resources:\n  output_bytes: {LIMIT}\n"),
        &["head", "-c", &GIB.to_string(), "/dev/zero"],
    );
    let elapsed = started.elapsed();
    assert_eq!(run.result["plan"]["isolation"], tier.name(), "{}", run.describe());
    println!(
        "1 GiB flood: supervisor peak RSS {rss_kib} KiB ({:.1} MiB, {how}), {elapsed:?}",
        rss_kib as f64 / 1024.0
    );
    let output = &run.result["output"];
    assert_eq!(run.status(), "capacity_exceeded", "{}", run.describe());
    assert_eq!(
        run.limit_fired(),
        Some("output_bytes"),
        "{}",
        run.describe()
    );
    assert_eq!(output["truncated"], true, "{}", run.describe());
    assert_eq!(output["limit_bytes"], LIMIT, "{}", run.describe());
    assert_eq!(output["stdout"]["bytes_seen"], GIB, "{}", run.describe());
    assert_eq!(output["forwarded_bytes"], LIMIT, "{}", run.describe());
    let kept = output["stdout"]["head"].as_str().unwrap_or("").len()
        + output["stdout"]["tail"].as_str().unwrap_or("").len();
    assert!(
        kept as u64 <= LIMIT,
        "head + tail keep {kept} bytes, more than the limit\n{}",
        run.describe()
    );
    assert!(
        rss_kib > 0 && rss_kib < 64 * 1024,
        "supervisor peak RSS {rss_kib} KiB is not below 64 MiB\n{}",
        run.describe()
    );
}
}

// ---------------------------------------------------------------------------------------
// 6. disk

both_tiers! {
    fn full_writable_path_is_a_disk_ceiling(tier) {
        require_cells!();
        let _serial = serial();
        let run = tier.run(
            Some("filesystem:\n  writable_paths:\n    - { path: /tmp, size_mb: 1 }\n"),
            &["dd", "if=/dev/zero", "of=/tmp/fill", "bs=64k", "count=100"],
        );
        assert_eq!(run.status(), "capacity_exceeded", "{}", run.describe());
        assert_eq!(run.limit_fired(), Some("disk"), "{}", run.describe());
        assert_ne!(run.code(), 0, "{}", run.describe());
        assert!(
            run.stderr().contains("No space left on device"),
            "dd did not hit ENOSPC\n{}",
            run.describe()
        );
    }
}

both_tiers! {
    fn a_write_that_fits_is_not_a_disk_ceiling(tier) {
        require_cells!();
        let _serial = serial();
        let run = tier.run(
            Some("filesystem:\n  writable_paths:\n    - { path: /tmp, size_mb: 1 }\n"),
            &["dd", "if=/dev/zero", "of=/tmp/fill", "bs=64k", "count=4"],
        );
        assert_eq!(run.status(), "ok", "{}", run.describe());
        assert_eq!(run.limit_fired(), None, "{}", run.describe());
    }
}

// ---------------------------------------------------------------------------------------
// 7. cpu quota

both_tiers! {
    fn cpu_quota_holds_a_busy_loop_to_its_share(tier) {
        require_cells!();
        let _serial = serial();
        let (run, elapsed) = timed(tier,
            "resources:\n  cpu_millis: 100\n",
            &["timeout", "2", "sh", "-c", "while :; do :; done"],
        );
        let cpu_ms = usage_f64(&run, "cpu_user_ms") + usage_f64(&run, "cpu_system_ms");
        // The quota is a share of wall time. On gVisor the whole sandbox is under it, the
        // Sentry's start included: the run lasts longer than the loop's 2 s (9.5-13.5 s
        // measured here), and its share is what the quota bounds.
        let wall_ms = elapsed.as_secs_f64() * 1000.0;
        println!(
            "cpu quota 10%: {cpu_ms:.0} ms of cpu in a {elapsed:?} run ({:.1}% of its wall time)",
            100.0 * cpu_ms / wall_ms
        );
        assert!(
            matches!(run.status(), "ok" | "task_error"),
            "{}",
            run.describe()
        );
        // timeout(1) ran its 2 s and killed the loop.
        assert_eq!(run.code(), 124, "{}", run.describe());
        assert!(
            elapsed >= Duration::from_millis(1900),
            "the loop did not run for 2 s ({elapsed:?})\n{}",
            run.describe()
        );
        assert!(
            cpu_ms > 20.0,
            "no cpu time counted at all ({cpu_ms} ms): usage is not measured\n{}",
            run.describe()
        );
        assert!(
            cpu_ms <= 0.25 * wall_ms,
            "the loop used {cpu_ms} ms of cpu in a {wall_ms:.0} ms run under a 10% quota \
             (expected <= 25% of it)\n{}",
            run.describe()
        );
    }
}

// ---------------------------------------------------------------------------------------
// 8. usage and timings

both_tiers! {
    fn usage_and_timings_are_present_and_plausible(tier) {
        require_cells!();
        let _serial = serial();
        let run = tier.sh("i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done; echo done");
        assert_eq!(run.status(), "ok", "{}", run.describe());
        let t = &run.result["timings"];
        let startup = t["startup_ms"].as_f64().expect("startup_ms");
        let wall = t["wall_ms"].as_f64().expect("wall_ms");
        println!("timings: startup {startup:.1} ms, wall {wall:.1} ms");
        assert!(startup > 0.0, "startup_ms {startup}\n{}", run.describe());
        assert!(wall >= startup, "wall_ms < startup_ms\n{}", run.describe());
        assert!(wall < 60_000.0, "wall_ms {wall}\n{}", run.describe());
        assert!(
            usage_f64(&run, "memory_peak_bytes") > 0.0,
            "{}",
            run.describe()
        );
        assert!(usage_f64(&run, "pids_peak") >= 1.0, "{}", run.describe());
        assert_eq!(usage_f64(&run, "oom_kills"), 0.0, "{}", run.describe());
        assert_eq!(
            usage_f64(&run, "pids_limit_hits"),
            0.0,
            "{}",
            run.describe()
        );
        let cpu = usage_f64(&run, "cpu_user_ms") + usage_f64(&run, "cpu_system_ms");
        assert!(
            cpu > 0.0 && cpu <= wall * 2.0 + 10.0,
            "cpu {cpu} ms implausible for a {wall} ms run\n{}",
            run.describe()
        );
    }
}

both_tiers! {
    /// A payload killed at the deadline burned about two seconds of cpu; the record must
    /// say so (accounting that only sees processes reaped before the kill reports ~0).
    fn usage_counts_the_cpu_of_a_payload_killed_at_the_deadline(tier) {
        require_cells!();
        let _serial = serial();
        for attempt in 0..5 {
            let (run, elapsed) = timed(tier,
                TWO_SECONDS,
                &["/bin/sh", "-c", "trap '' TERM; while :; do :; done"],
            );
            let cpu = usage_f64(&run, "cpu_user_ms") + usage_f64(&run, "cpu_system_ms");
            println!("attempt {attempt}: {cpu:.0} ms cpu in {elapsed:?}");
            assert_eq!(run.limit_fired(), Some("wall_time"), "{}", run.describe());
            assert!(
                cpu >= 1000.0,
                "a busy loop ran ~2 s but usage reports {cpu} ms of cpu\n{}",
                run.describe()
            );
        }
    }
}

// ---------------------------------------------------------------------------------------
// 9. exit codes

both_tiers! {
    fn payload_exit_code_is_passed_through(tier) {
        require_cells!();
        let _serial = serial();
        let run = tier.sh("exit 3");
        assert_eq!(run.code(), 3, "{}", run.describe());
        assert_eq!(run.status(), "task_error", "{}", run.describe());
        assert_eq!(run.result["exit"]["code"], 3, "{}", run.describe());
        assert_eq!(run.result["exit_code"], 3, "{}", run.describe());
        assert_eq!(run.limit_fired(), None, "{}", run.describe());
    }
}

both_tiers! {
    fn command_not_found_is_127(tier) {
        require_cells!();
        let _serial = serial();
        for argv in [
            &["airlock-no-such-command-xyz"][..],
            &["/no/such/dir/command"][..],
        ] {
            let run = tier.run(None, argv);
            assert_eq!(run.code(), 127, "{argv:?}\n{}", run.describe());
            assert_eq!(run.result["exit_code"], 127, "{}", run.describe());
            assert_eq!(run.status(), "task_error", "{}", run.describe());
        }
    }
}

both_tiers! {
    fn non_executable_file_is_126(tier) {
        require_cells!();
        let _serial = serial();
        // A regular, non-executable file visible in the cell (host /usr is mounted).
        let candidates = [
            "/usr/lib/os-release",
            "/usr/share/common-licenses/GPL-3",
            "/usr/share/dict/words",
        ];
        let file = candidates
            .iter()
            .find(|p| {
                use std::os::unix::fs::PermissionsExt;
                std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 == 0)
            })
            .expect("no non-executable regular file under /usr");
        let run = tier.run(None, &[file]);
        assert_eq!(run.code(), 126, "{}", run.describe());
        assert_eq!(run.result["exit_code"], 126, "{}", run.describe());
        assert_eq!(run.status(), "task_error", "{}", run.describe());
        // A directory cannot be executed either.
        let run = tier.run(None, &["/usr/share"]);
        assert_eq!(run.code(), 126, "{}", run.describe());
    }
}

/// Both tiers at once: it runs no cell itself, and checks what every case above left.
#[test]
fn no_orphaned_cell_process_outlives_these_tests() {
    require_cells!();
    let _serial = serial();
    // Under the lock every supervisor these tests started has exited: a process in one
    // of their cells' cgroups outlived its run. Cells of anyone else (other test
    // binaries, other airlock binaries, whatever their name) are not these tests'.
    let left = host::leftover_cell_processes();
    assert!(
        left.is_empty(),
        "cell processes of these tests outlived their supervisor: {left:#?}"
    );
    let cgroups = host::leftover_cgroups();
    assert!(
        cgroups.is_empty(),
        "cgroups of these tests' cells outlived their supervisor: {cgroups:#?}"
    );
}
