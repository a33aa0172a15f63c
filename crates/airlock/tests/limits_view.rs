//! A payload can see its own limits where language runtimes look for them (the CPU
//! affinity mask and its cgroup under /sys/fs/cgroup), and nothing more: the view is
//! read-only and holds only its own cell.

mod common;

use common::CellRun;

fn run_script(contract: &str, script: &str) -> CellRun {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state").display().to_string();
    common::run_in(
        dir.path(),
        Some(contract),
        &["--state-dir", &state],
        &["sh", "-c", script],
    )
}

fn host_cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

#[test]
fn the_cpu_mask_matches_the_cpu_quota() {
    require_cells!();
    for (millis, expected) in [(500, 1), (1000, 1), (2000, 2.min(host_cpus()))] {
        let run = run_script(
            &format!("resources:\n  cpu_millis: {millis}\n"),
            "nproc; python3 -c 'import os; print(len(os.sched_getaffinity(0)))'",
        );
        let d = run.describe();
        let lines: Vec<&str> = run
            .output
            .stdout
            .split(|b| *b == b'\n')
            .map(|l| std::str::from_utf8(l).unwrap())
            .collect();
        assert_eq!(
            lines[0],
            expected.to_string(),
            "nproc at {millis} millicores\n{d}"
        );
        assert_eq!(
            lines[1],
            expected.to_string(),
            "affinity at {millis} millicores\n{d}"
        );
    }
}

#[test]
fn the_cell_reads_its_own_limits_under_sys_fs_cgroup() {
    require_cells!();
    let contract = "resources:\n  memory_mb: 96\n  cpu_millis: 500\n  process_limit: 20\n";
    let script = "for f in memory/memory.limit_in_bytes memory.max cpu/cpu.cfs_quota_us cpu.max \
                  pids/pids.max pids.max; do \
                  [ -f /sys/fs/cgroup/$f ] && echo \"$f=$(cat /sys/fs/cgroup/$f)\"; done; \
                  cat /proc/self/cgroup | grep -c ':/$'";
    let run = run_script(contract, script);
    let d = run.describe();
    assert_eq!(run.code(), 0, "{d}");
    let out = run.stdout();
    let memory = (96u64 << 20).to_string();
    match run.result["cgroup_version"].as_str() {
        Some("v1") => {
            assert!(
                out.contains(&format!("memory/memory.limit_in_bytes={memory}")),
                "{d}"
            );
            assert!(out.contains("cpu/cpu.cfs_quota_us=50000"), "{d}");
            assert!(
                out.contains("pids/pids.max=21"),
                "process_limit + airlock's pid 1\n{d}"
            );
        }
        Some("v2") => {
            assert!(out.contains(&format!("memory.max={memory}")), "{d}");
            assert!(out.contains("cpu.max=50000 100000"), "{d}");
            assert!(out.contains("pids.max=21"), "{d}");
        }
        other => panic!("unknown cgroup version {other:?}\n{d}"),
    }
}

#[test]
fn the_cgroup_view_is_read_only_and_holds_only_this_cell() {
    require_cells!();
    // Raise its own limits, add a process to it, reach a sibling or the parent: none may
    // work. The view is the cell's own directory, mounted read-only at its root.
    let script = r#"
for f in /sys/fs/cgroup/pids/pids.max /sys/fs/cgroup/pids.max \
         /sys/fs/cgroup/memory/memory.limit_in_bytes /sys/fs/cgroup/memory.max; do
  [ -e "$f" ] || continue
  if echo max > "$f" 2>/dev/null; then echo "WROTE $f"; fi
done
for d in /sys/fs/cgroup/*/ /sys/fs/cgroup/; do
  if mkdir "$d/escape" 2>/dev/null; then echo "MKDIR $d"; fi
  if echo $$ > "$d/cgroup.procs" 2>/dev/null; then echo "JOINED $d"; fi
  ls "$d/.." >/dev/null 2>&1 && [ "$(ls "$d/.." | grep -c -- '-')" -gt 0 ] && echo "SIBLINGS $d"
done
cat /sys/fs/cgroup/*/cgroup.procs /sys/fs/cgroup/cgroup.procs 2>/dev/null | sort -un | tr '\n' ' '
echo
echo done
"#;
    let run = run_script("resources:\n  process_limit: 16\n", script);
    let d = run.describe();
    let out = run.stdout();
    assert!(out.contains("done"), "{d}");
    for breach in ["WROTE", "MKDIR", "JOINED", "SIBLINGS"] {
        assert!(!out.contains(breach), "{breach}\n{d}");
    }
    // Only the cell's own processes are listed, by their pids in the cell (small numbers).
    let pids_line = out.lines().rev().nth(1).unwrap_or("");
    let pids: Vec<u32> = pids_line
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect();
    assert!(
        !pids.is_empty() && pids.iter().all(|p| *p < 100),
        "{pids:?}\n{d}"
    );
}
