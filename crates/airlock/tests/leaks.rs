//! Leaks: a thousand runs of every kind (normal and non-zero exits, memory kills,
//! processes left behind, deadline kills) leave no cgroup, process, mount or file
//! descriptor behind.

mod common;

use common::host;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Instant;

/// The tests of this file must not overlap: the thousand runs compare this process's fd
/// and mount counts before and after, which the other test's pipes would change.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

const RUNS: usize = 1000;
const WORKERS: usize = 2;

/// What one run does and how it must be classified.
struct Kind {
    name: &'static str,
    contract: &'static str,
    argv: &'static [&'static str],
    status: &'static str,
    code: i32,
}

const NORMAL: Kind = Kind {
    name: "normal",
    contract: "{}\n",
    argv: &["/bin/true"],
    status: "ok",
    code: 0,
};
const FAILING: Kind = Kind {
    name: "non-zero exit",
    contract: "{}\n",
    argv: &["/bin/sh", "-c", "echo failing >&2; exit 7"],
    status: "task_error",
    code: 7,
};
const MEMORY: Kind = Kind {
    name: "memory kill",
    contract: "resources:\n  memory_mb: 32\n",
    argv: &[
        "python3",
        "-c",
        "b = bytearray(200 * 2**20)\nfor i in range(0, len(b), 4096): b[i] = 1",
    ],
    status: "capacity_exceeded",
    code: 137,
};
const LEFT_BEHIND: Kind = Kind {
    name: "background process left behind",
    contract: "{}\n",
    argv: &["/bin/sh", "-c", "setsid sleep 300 & sleep 60 & exit 0"],
    status: "ok",
    code: 0,
};
const TIMEOUT: Kind = Kind {
    name: "timeout",
    contract: "resources:\n  wall_time_seconds: 1\n",
    argv: &[
        "/bin/sh",
        "-c",
        "trap '' TERM; sleep 30 & while :; do sleep 0.05; done",
    ],
    status: "capacity_exceeded",
    code: 124,
};

fn kind_of(i: usize) -> &'static Kind {
    match i % 50 {
        7 => &TIMEOUT, // 20 of 1000
        17 | 42 => &MEMORY,
        27 => &LEFT_BEHIND,
        n if n % 5 == 3 => &FAILING,
        _ => &NORMAL,
    }
}

fn count_lines(path: &str) -> usize {
    std::fs::read_to_string(path).unwrap().lines().count()
}

fn fd_count() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

#[test]
fn a_thousand_mixed_runs_leave_nothing_behind() {
    require_cells!();
    let _serial = serial();
    let dirs: Vec<_> = (0..WORKERS).map(|_| tempfile::tempdir().unwrap()).collect();
    // Only this process's own cells count (see common/host.rs): cells of other airlock
    // binaries on the host, whatever their name, are not leaks of these runs.
    let cgroups_before = host::leftover_cgroups();
    let procs_before = host::leftover_cell_processes();
    let mounts_before = count_lines("/proc/self/mountinfo");
    let fds_before = fd_count();
    println!(
        "before: {} mounts, {} fds, {} leftover cgroups, {} leftover cell processes",
        mounts_before,
        fds_before,
        cgroups_before.len(),
        procs_before.len()
    );

    let next = AtomicUsize::new(0);
    let failures: Mutex<Vec<String>> = Mutex::new(Vec::new());
    let counts: Mutex<std::collections::BTreeMap<&str, usize>> = Mutex::default();
    let run_ids: Mutex<Vec<String>> = Mutex::default();
    let seen_stale: Mutex<std::collections::BTreeSet<PathBuf>> = Mutex::default();
    let started = Instant::now();
    std::thread::scope(|scope| {
        for dir in &dirs {
            let (next, failures, counts, run_ids, seen_stale) =
                (&next, &failures, &counts, &run_ids, &seen_stale);
            scope.spawn(move || loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= RUNS {
                    break;
                }
                let kind = kind_of(i);
                let run = common::run_in(dir.path(), Some(kind.contract), &[], kind.argv);
                *counts.lock().unwrap().entry(kind.name).or_default() += 1;
                if let Some(id) = run.result["run_id"].as_str() {
                    run_ids.lock().unwrap().push(id.to_string());
                }
                // The next run (ours or anyone's) reaps cgroups of dead supervisors,
                // which would hide this run's leak: look right away.
                let left = run.supervisor.as_ref().map(host::cgroups_of).unwrap_or_default();
                if !left.is_empty() {
                    seen_stale.lock().unwrap().extend(left);
                }
                let cleanup_ok = run.result["cleanup"]["ok"] == true;
                if run.status() != kind.status || run.code() != kind.code || !cleanup_ok {
                    failures.lock().unwrap().push(format!(
                        "run {i} ({}): expected {} / exit {}, got {} / exit {}, cleanup ok {cleanup_ok}\n{}",
                        kind.name,
                        kind.status,
                        kind.code,
                        run.status(),
                        run.code(),
                        run.describe()
                    ));
                }
                if (i + 1) % 250 == 0 {
                    println!("{} runs, {:?}", i + 1, started.elapsed());
                }
                // Keep the temp dirs small: result and contract files are per run.
                for entry in std::fs::read_dir(dir.path()).unwrap().flatten() {
                    let _ = std::fs::remove_file(entry.path());
                }
            });
        }
    });
    let elapsed = started.elapsed();

    // Every supervisor we started has exited: any cgroup of theirs, or process in one,
    // is a leak.
    let mut cgroups_after = host::leftover_cgroups();
    cgroups_after.extend(seen_stale.into_inner().unwrap());
    cgroups_after.sort();
    cgroups_after.dedup();
    let procs_after = host::leftover_cell_processes();
    let mounts_after = count_lines("/proc/self/mountinfo");
    let fds_after = fd_count();
    let run_ids = run_ids.into_inner().unwrap();
    println!(
        "{RUNS} runs in {elapsed:?} ({:.1} runs/s), {:?}",
        RUNS as f64 / elapsed.as_secs_f64(),
        counts.lock().unwrap()
    );
    println!(
        "after: {mounts_after} mounts (before {mounts_before}), {fds_after} fds (before {fds_before}), \
         {} leftover cgroups (before {}), {} leftover cell processes (before {})",
        cgroups_after.len(),
        cgroups_before.len(),
        procs_after.len(),
        procs_before.len()
    );

    let failures = failures.into_inner().unwrap();
    assert!(
        failures.is_empty(),
        "{} of {RUNS} runs misbehaved; first ones:\n{}",
        failures.len(),
        failures
            .iter()
            .take(3)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n---\n")
    );
    assert_eq!(run_ids.len(), RUNS, "some runs wrote no result record");
    assert!(
        cgroups_after.is_empty(),
        "cgroup dirs of these runs outlived their supervisor: {cgroups_after:#?}"
    );
    assert!(
        procs_after.is_empty(),
        "cell processes of these runs outlived their supervisor: {procs_after:#?}"
    );
    assert_eq!(
        mounts_after, mounts_before,
        "mount count of the test process changed"
    );
    assert_eq!(
        fds_after, fds_before,
        "fd count of the test process changed"
    );
}

#[test]
fn a_dead_supervisors_cell_is_killed_and_its_cgroup_removed_by_the_next_run() {
    require_cells!();
    let _serial = serial();
    // One run creates airlock's parent cgroups.
    let first = common::sh("true");
    assert_eq!(first.code(), 0, "{}", first.describe());
    let parent = ["/sys/fs/cgroup/pids/airlock", "/sys/fs/cgroup/airlock"]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| p.is_dir())
        .expect("airlock's parent cgroup exists after a run");
    // A leftover as a supervisor killed mid-creation leaves it: named after a pid that is
    // not a live supervisor, present in one hierarchy only, with a process still inside.
    let marker = format!(
        "300.{}{}",
        std::process::id(),
        Instant::now().elapsed().as_nanos()
    );
    let stale = parent.join(format!("{}-1-{}", u32::MAX - 7, std::process::id()));
    std::fs::create_dir(&stale).unwrap();
    let mut straggler = std::process::Command::new("sleep")
        .arg(&marker)
        .spawn()
        .unwrap();
    std::fs::write(stale.join("cgroup.procs"), straggler.id().to_string()).unwrap();

    let doctor = std::process::Command::new(common::airlock_bin())
        .arg("doctor")
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&doctor.stdout).into_owned();
    assert!(
        report
            .lines()
            .any(|l| l.contains("cleanup.leftover_cells")
                && l.contains(&stale.display().to_string())),
        "doctor must report the leftover\n{report}"
    );

    let next = common::sh("true");
    let reaped = straggler.try_wait().unwrap().is_some() || {
        std::thread::sleep(std::time::Duration::from_millis(200));
        straggler.try_wait().unwrap().is_some()
    };
    let _ = straggler.kill();
    let _ = straggler.wait();
    assert_eq!(next.code(), 0, "{}", next.describe());
    assert!(
        reaped,
        "the process in the leftover cgroup survived the next run"
    );
    assert!(
        !stale.exists(),
        "the leftover cgroup {} was not removed",
        stale.display()
    );
}
