//! What the host sees of this test process's own cells, for the tests that check nothing
//! outlives a run. Other cells run on the same machine (other engineers, concurrent test
//! binaries, an installed airlock, a copy under another name): they are none of these
//! tests' business, so cells are never recognised by a process name. A cell is recognised
//! by its cgroup, whose name starts with its supervisor's pid and start time
//! (`<pid>-<start time>-<nanoseconds>`, `cgroup_name` in crates/cell/src/cgroup/mod.rs);
//! [`run_supervisor`] records both for every `airlock run` a test starts. Once such a
//! supervisor has exited, any cgroup of its name, and any process in one, is a leak.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::Mutex;

/// One `airlock run` process started by this test process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Supervisor {
    pub pid: u32,
    /// Clock ticks since boot (field 22 of `/proc/<pid>/stat`): with the pid, it names the
    /// process across pid reuse, as in the cgroup's name.
    pub start_time: u64,
}

impl Supervisor {
    /// The supervisor `child` is. It must not have been waited for: until then its /proc
    /// entry stays, even once it has exited.
    pub fn of(child: &Child) -> Supervisor {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", child.id()))
            .expect("the unreaped child's /proc entry");
        // Fields after the parenthesised command name start at field 3.
        let start_time = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(19))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no start time in /proc/{}/stat: {stat}", child.id()));
        Supervisor {
            pid: child.id(),
            start_time,
        }
    }

    /// Whether a cell cgroup of this name belongs to this supervisor.
    pub fn owns(&self, cgroup_name: &str) -> bool {
        cgroup_name.starts_with(&format!("{}-{}-", self.pid, self.start_time))
    }
}

/// Supervisors this process started that have exited: nothing of theirs may be left.
static FINISHED: Mutex<Vec<Supervisor>> = Mutex::new(Vec::new());

fn finished_owner_of(cgroup_name: &str) -> bool {
    FINISHED
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .any(|s| s.owns(cgroup_name))
}

/// Runs `cmd` (an `airlock run`) to the end like `Command::output` (stdout and stderr
/// captured) and records its supervisor as one of this process's, now finished.
pub fn run_supervisor(cmd: &mut Command) -> (Output, Supervisor) {
    let child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn airlock");
    let supervisor = Supervisor::of(&child);
    let output = child.wait_with_output().expect("wait for airlock");
    FINISHED
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push(supervisor);
    (output, supervisor)
}

/// Processes (other than this one) whose command line contains `needle`.
pub fn processes_with(needle: &str) -> Vec<String> {
    let me = std::process::id();
    let mut found = Vec::new();
    for pid in pids().filter(|p| *p != me) {
        let Some(line) = cmdline(pid).filter(|c| c.contains(needle)) else {
            continue;
        };
        found.push(format!("pid {pid} ({}): {line}", state(pid)));
    }
    found
}

/// Every cell cgroup directory under `/sys/fs/cgroup/*/airlock/` (v1) or
/// `/sys/fs/cgroup/airlock/` (v2), whoever's.
pub fn cell_cgroup_dirs() -> Vec<PathBuf> {
    let mut found = Vec::new();
    let Ok(hierarchies) = std::fs::read_dir("/sys/fs/cgroup") else {
        return found;
    };
    let mut parents: Vec<PathBuf> = hierarchies
        .flatten()
        .map(|h| h.path().join("airlock"))
        .collect();
    parents.push(PathBuf::from("/sys/fs/cgroup/airlock"));
    for parent in parents {
        let Ok(cells) = std::fs::read_dir(parent) else {
            continue;
        };
        found.extend(
            cells
                .flatten()
                .filter(|c| c.file_type().is_ok_and(|t| t.is_dir()))
                .map(|c| c.path()),
        );
    }
    found
}

fn dir_name(dir: &Path) -> String {
    dir.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// The cgroup directories of `supervisor`'s cells (one per hierarchy on v1).
pub fn cgroups_of(supervisor: &Supervisor) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = cell_cgroup_dirs()
        .into_iter()
        .filter(|d| supervisor.owns(&dir_name(d)))
        .collect();
    dirs.sort();
    dirs
}

/// Cell cgroup directories of supervisors of this process that have exited (each removes
/// its cell's cgroup before it exits).
pub fn leftover_cgroups() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = cell_cgroup_dirs()
        .into_iter()
        .filter(|d| finished_owner_of(&dir_name(d)))
        .collect();
    dirs.sort();
    dirs
}

/// Processes in a cell cgroup of a supervisor of this process that has exited: every
/// process of a cell is in its cgroup (pid 1 joins it before it is released, the rest
/// are its descendants), so these are the cell processes that outlived their run.
pub fn leftover_cell_processes() -> Vec<String> {
    let mut pids: Vec<u32> = leftover_cgroups()
        .iter()
        .flat_map(|dir| {
            std::fs::read_to_string(dir.join("cgroup.procs"))
                .unwrap_or_default()
                .lines()
                .filter_map(|l| l.parse().ok())
                .collect::<Vec<u32>>()
        })
        .collect();
    pids.sort();
    pids.dedup();
    pids.into_iter()
        .map(|pid| {
            format!(
                "pid {pid} ({}): {}",
                state(pid),
                cmdline(pid).unwrap_or_default()
            )
        })
        .collect()
}

fn pids() -> impl Iterator<Item = u32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse().ok()))
}

fn cmdline(pid: u32) -> Option<String> {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .ok()
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
}

fn state(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("State:"))
                .map(str::to_string)
        })
        .unwrap_or_else(|| "State: ?".into())
}

/// The host's IPv4 addresses a sandbox must not reach: loopback, then every address of
/// its interfaces (`hostname -I`).
pub fn ipv4_addresses() -> Vec<String> {
    let listed = Command::new("hostname").arg("-I").output().unwrap();
    std::iter::once("127.0.0.1".to_string())
        .chain(
            String::from_utf8_lossy(&listed.stdout)
                .split_whitespace()
                .filter(|a| !a.contains(':'))
                .map(String::from),
        )
        .collect()
}
