//! One host identity per live cell (crates/cell/src/host_identity.rs), through the real
//! binary: concurrent cells run as different host uids, read from outside in /proc; a
//! cell that exhausts the per-user pipe quota leaves a concurrent cell its own; a range
//! with no free id refuses the run; an id comes back only once its cell is gone. Each
//! test has a range of its own (`[host_ids]` of airlock.toml), far from the default one,
//! so the cells of other tests and other processes on the machine are never counted.

mod common;

use serde_json::Value;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

const LOCK_DIR: &str = "/run/airlock/ids";

/// A started `airlock run` whose payload said it runs (its first output line).
struct Running {
    child: Child,
    /// Read to the end by `finish`: closed early, the supervisor's streamed output would
    /// meet a broken pipe.
    stdout: BufReader<ChildStdout>,
    first_line: String,
    result: PathBuf,
}

impl Running {
    /// Waits for the run's end: its exit code and result record.
    fn finish(mut self) -> (i32, Value) {
        let mut rest = String::new();
        let _ = self.stdout.read_to_string(&mut rest);
        let status = self.child.wait().unwrap();
        let text = std::fs::read_to_string(&self.result).unwrap_or_default();
        (
            status.code().unwrap_or(-1),
            serde_json::from_str(&text).unwrap_or(Value::Null),
        )
    }
}

fn config(dir: &Path, base: u32, count: u32) -> PathBuf {
    let path = dir.join(format!("airlock-{base}.toml"));
    std::fs::write(
        &path,
        format!("[host_ids]\nbase = {base}\ncount = {count}\n"),
    )
    .unwrap();
    path
}

fn command(dir: &Path, config: &Path, name: &str, argv: &[&str]) -> (Command, PathBuf) {
    let result = dir.join(format!("{name}.json"));
    let mut cmd = Command::new(common::airlock_bin());
    cmd.arg("run")
        .arg("--state-dir")
        .arg(common::state_dir())
        .arg("--config")
        .arg(config)
        .arg("--result")
        .arg(&result)
        .arg("--")
        .args(argv)
        .stdin(Stdio::null());
    (cmd, result)
}

/// Starts a run and waits until its payload printed its first line.
fn start(dir: &Path, config: &Path, name: &str, argv: &[&str]) -> Running {
    let (mut cmd, result) = command(dir, config, name, argv);
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut first_line = String::new();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    stdout.read_line(&mut first_line).unwrap();
    Running {
        child,
        stdout,
        first_line,
        result,
    }
}

/// Runs to the end: exit code, result record, stdout.
fn run(dir: &Path, config: &Path, name: &str, argv: &[&str]) -> (i32, Value, String) {
    let (mut cmd, result) = command(dir, config, name, argv);
    let output = cmd.output().unwrap();
    let record = std::fs::read_to_string(&result)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or(Value::Null);
    (
        output.status.code().unwrap_or(-1),
        record,
        String::from_utf8_lossy(&output.stdout).into_owned(),
    )
}

/// `(pid, real uid, comm)` of every host process whose real uid is in `ids`.
fn processes_in(ids: std::ops::RangeInclusive<u32>) -> Vec<(u32, u32, String)> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
            continue;
        };
        let field = |key: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(key))
                .map(|v| v.trim().to_string())
        };
        let uid = field("Uid:")
            .and_then(|v| v.split_whitespace().next()?.parse::<u32>().ok())
            .unwrap_or(0);
        if ids.contains(&uid) {
            found.push((pid, uid, field("Name:").unwrap_or_default()));
        }
    }
    found
}

fn host_uid(record: &Value) -> u32 {
    let identity = &record["host_identity"];
    assert_eq!(identity["source"], "pool", "{record:#}");
    assert_eq!(identity["uid"], identity["gid"], "{record:#}");
    identity["uid"].as_u64().unwrap() as u32
}

#[test]
fn concurrent_cells_run_as_different_host_ids_each_held_by_its_pid_1_too() {
    require_cells!();
    let dir = tempfile::tempdir().unwrap();
    let base = 1_700_000_000;
    let config = config(dir.path(), base, 8);
    let script = ["/bin/sh", "-c", "echo up; sleep 2"];
    let a = start(dir.path(), &config, "a", &script);
    let b = start(dir.path(), &config, "b", &script);
    assert_eq!((a.first_line.trim(), b.first_line.trim()), ("up", "up"));
    let seen = processes_in(base..=base + 7);
    let mut uids: Vec<u32> = seen.iter().map(|(_, uid, _)| *uid).collect();
    uids.sort_unstable();
    uids.dedup();
    assert_eq!(uids.len(), 2, "two cells, two host uids: {seen:?}");
    // Each cell's pid 1 holds its slot's lock file open: the slot survives the
    // supervisor (see host_identity.rs).
    for uid in &uids {
        let slot = PathBuf::from(format!("{LOCK_DIR}/{uid}"));
        let holders: Vec<u32> = seen
            .iter()
            .filter(|(_, u, comm)| u == uid && comm == "airlock-init")
            .map(|(pid, _, _)| *pid)
            .filter(|pid| {
                std::fs::read_dir(format!("/proc/{pid}/fd"))
                    .unwrap()
                    .flatten()
                    .any(|fd| std::fs::read_link(fd.path()).ok().as_ref() == Some(&slot))
            })
            .collect();
        assert_eq!(
            holders.len(),
            1,
            "pid 1 of uid {uid} holds {slot:?}: {seen:?}"
        );
    }
    let (code_a, record_a) = a.finish();
    let (code_b, record_b) = b.finish();
    assert_eq!((code_a, code_b), (0, 0), "{record_a:#}\n{record_b:#}");
    let mut recorded = vec![host_uid(&record_a), host_uid(&record_b)];
    recorded.sort_unstable();
    assert_eq!(recorded, uids, "the records name the uids the cells ran as");
}

#[test]
fn a_range_without_a_free_id_refuses_a_second_cell_and_the_id_returns_after_the_first() {
    require_cells!();
    let dir = tempfile::tempdir().unwrap();
    let base = 1_700_000_100;
    let config = config(dir.path(), base, 1);
    let holder = start(
        dir.path(),
        &config,
        "holder",
        &["/bin/sh", "-c", "echo up; sleep 2"],
    );
    assert_eq!(holder.first_line.trim(), "up");
    let (code, refused, _) = run(dir.path(), &config, "refused", &["/bin/true"]);
    assert_eq!(code, 125, "{refused:#}");
    assert_eq!(refused["status"], "sandbox_unavailable", "{refused:#}");
    let error = refused["error"].as_str().unwrap_or("");
    assert!(
        error.contains("host_identity") && error.contains(&format!("{base}..={base}")),
        "{error}"
    );
    let (code, held) = holder.finish();
    assert_eq!(code, 0, "{held:#}");
    assert_eq!(host_uid(&held), base);
    // Released once the holder's cell was gone, and marked clean.
    assert_eq!(std::fs::read(format!("{LOCK_DIR}/{base}")).unwrap(), b"");
    let (code, next, _) = run(dir.path(), &config, "next", &["/bin/true"]);
    assert_eq!(code, 0, "{next:#}");
    assert_eq!(host_uid(&next), base);
    // The store's record of the run names it too.
    let show = Command::new(common::airlock_bin())
        .args(["runs", "show", "--json", "--state-dir"])
        .arg(common::state_dir())
        .arg(next["run_id"].as_str().unwrap())
        .output()
        .unwrap();
    let stored: Value = serde_json::from_slice(&show.stdout).unwrap();
    assert_eq!(
        stored["run"]["result"]["host_identity"],
        next["host_identity"]
    );
}

#[test]
fn a_killed_supervisors_id_is_marked_and_taken_again_once_its_cell_is_gone() {
    require_cells!();
    let dir = tempfile::tempdir().unwrap();
    let base = 1_700_000_300;
    let config = config(dir.path(), base, 1);
    let mut victim = start(
        dir.path(),
        &config,
        "victim",
        &["/bin/sh", "-c", "echo up; sleep 30"],
    );
    assert_eq!(victim.first_line.trim(), "up");
    let supervisor = victim.child.id();
    victim.child.kill().unwrap();
    victim.child.wait().unwrap();
    // The slot still names the killed supervisor: whoever takes it next must look first.
    let mark = std::fs::read_to_string(format!("{LOCK_DIR}/{base}")).unwrap();
    assert_eq!(mark.trim(), supervisor.to_string());
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (code, record, _) = run(dir.path(), &config, "after", &["/bin/true"]);
        if code == 0 {
            assert_eq!(host_uid(&record), base);
            break;
        }
        assert_eq!(record["status"], "sandbox_unavailable", "{record:#}");
        assert!(
            Instant::now() < deadline,
            "the id never came back: {record:#}"
        );
        std::thread::sleep(Duration::from_millis(50));
        let _ = std::fs::remove_file(dir.path().join("after.json"));
    }
    assert!(processes_in(base..=base).is_empty());
}

/// The tests that lower the host's pipe quotas must not overlap.
static PIPE_QUOTA: Mutex<()> = Mutex::new(());

/// Sets `fs.pipe-user-pages-soft` and `-hard` for the test and restores the host's values
/// when dropped (a failed assertion included).
struct PipeQuota {
    saved: Vec<(PathBuf, String)>,
}

impl PipeQuota {
    fn lower(soft_pages: u64, hard_pages: u64) -> PipeQuota {
        let mut quota = PipeQuota { saved: Vec::new() };
        for (name, value) in [
            ("pipe-user-pages-soft", soft_pages),
            ("pipe-user-pages-hard", hard_pages),
        ] {
            let path = PathBuf::from("/proc/sys/fs").join(name);
            quota
                .saved
                .push((path.clone(), std::fs::read_to_string(&path).unwrap()));
            std::fs::write(&path, value.to_string()).unwrap();
        }
        quota
    }
}

impl Drop for PipeQuota {
    fn drop(&mut self) {
        for (path, value) in &self.saved {
            let _ = std::fs::write(path, value.trim());
        }
    }
}

/// Fills this user's pipe pages with 1 MiB pipes until the kernel refuses one more, then
/// holds them. Without CAP_SYS_RESOURCE a pipe may not grow past the soft quota.
const EXHAUST: &str = "
import fcntl, os, sys, time
pipes = []
while True:
    r, w = os.pipe()
    pipes.append((r, w))
    try:
        fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, 1 << 20)
    except PermissionError:
        break
    if len(pipes) > 64:
        sys.exit('the quota never ran out')
print('exhausted after', len(pipes) - 1, 'pipes of 1 MiB', flush=True)
time.sleep(3)
print('still alive holding', len(pipes), 'pipes')
";

/// One pipe raised to 1 MiB: what a process of a user under its quota may do.
const ONE_PIPE: &str = "
import fcntl, os
r, w = os.pipe()
fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, 1 << 20)
print('raised to', fcntl.fcntl(w, fcntl.F_GETPIPE_SZ))
";

#[test]
fn a_cell_that_exhausts_the_per_user_pipe_quota_does_not_affect_a_concurrent_cell() {
    require_cells!();
    let _serial = PIPE_QUOTA.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), 1_700_000_200, 2);
    // 4 MiB per user: four 1 MiB pipes at most (root is exempt: CAP_SYS_RESOURCE).
    let quota = PipeQuota::lower(1024, 0);
    let hog = start(dir.path(), &config, "hog", &["python3", "-c", EXHAUST]);
    assert!(
        hog.first_line.starts_with("exhausted after"),
        "{:?}",
        hog.first_line
    );
    let (code, other, stdout) = run(dir.path(), &config, "other", &["python3", "-c", ONE_PIPE]);
    let (hog_code, hog_record) = hog.finish();
    drop(quota);
    assert_eq!(
        code, 0,
        "the concurrent cell lost its pipe quota: {other:#}"
    );
    assert_eq!(stdout.trim(), "raised to 1048576");
    assert_eq!(hog_code, 0, "{hog_record:#}");
    let hog_out = hog_record["output"]["stdout"]["head"].to_string();
    assert!(hog_out.contains("still alive"), "{hog_record:#}");
    assert_ne!(host_uid(&hog_record), host_uid(&other));
}

/// Opens inotify instances until the kernel refuses one more, then holds them.
const EXHAUST_INOTIFY: &str = "
import ctypes, time
libc = ctypes.CDLL(None, use_errno=True)
held = []
while len(held) < 100000:
    fd = libc.inotify_init1(0)
    if fd < 0:
        break
    held.append(fd)
print('refused after', len(held), 'errno', ctypes.get_errno(), flush=True)
time.sleep(3)
print('still alive holding', len(held))
";

const ONE_INOTIFY: &str = "
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
fd = libc.inotify_init1(0)
print('inotify', 'ok' if fd >= 0 else 'refused', ctypes.get_errno())
";

/// inotify instances are counted per user namespace owner (fs.inotify.max_user_instances
/// at the host level): each cell's namespace is owned by its own host uid, not by root.
#[test]
fn a_cell_that_exhausts_its_inotify_instances_does_not_affect_a_concurrent_cell() {
    require_cells!();
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), 1_700_000_400, 2);
    let hog = start(
        dir.path(),
        &config,
        "hog",
        &["python3", "-c", EXHAUST_INOTIFY],
    );
    assert!(
        hog.first_line.starts_with("refused after") && hog.first_line.contains("errno 24"),
        "{:?}",
        hog.first_line
    );
    let (code, other, stdout) = run(
        dir.path(),
        &config,
        "other",
        &["python3", "-c", ONE_INOTIFY],
    );
    let (hog_code, hog_record) = hog.finish();
    assert_eq!(code, 0, "{other:#}");
    assert_eq!(stdout.trim(), "inotify ok 0", "{other:#}");
    assert_eq!(hog_code, 0, "{hog_record:#}");
    assert!(
        hog_record["output"]["stdout"]["head"]
            .to_string()
            .contains("still alive"),
        "{hog_record:#}"
    );
}
