//! A container's state directory, `<root>/<id>/`, as runc keeps one: `state.json`
//! (written by the supervisor), the start socket the supervisor waits on (`s`), the
//! socket `create` waits on for the supervisor's word (`n`). Its status is derived, as
//! runc's: stopped once the supervisor is gone (or a zombie), else created or running.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// What the supervisor records of its container.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Stored {
    pub id: String,
    pub bundle: PathBuf,
    pub rootfs: PathBuf,
    pub created: String,
    /// The supervisor's pid (the `--pid-file` one) and its start time, so that a reused
    /// pid is not taken for the container.
    pub pid: u32,
    pub pid_start: u64,
    pub annotations: BTreeMap<String, String>,
    /// The run's id in the audit store.
    pub run_id: String,
    /// Set by the supervisor once `start` released the payload.
    pub started: bool,
    /// The plan's limits: the ceilings an `update` cannot raise a limit above.
    #[serde(default)]
    pub limits: Option<airlock_contract::Limits>,
    /// The cell's tier: a gVisor cell's cgroup holds the sandbox, not the payload.
    #[serde(default)]
    pub isolation: airlock_contract::Isolation,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Created,
    Running,
    /// Running, with its cell frozen (`pause`).
    Paused,
    Stopped,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Created => "created",
            Status::Running => "running",
            Status::Paused => "paused",
            Status::Stopped => "stopped",
        }
    }
}

pub fn dir(root: &Path, id: &str) -> Result<PathBuf, String> {
    let valid = !id.is_empty()
        && id.len() <= 128
        && !id.starts_with('.')
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '+'));
    if !valid {
        return Err(format!(
            "container id {id:?} is invalid (letters, digits, '-', '_', '.', '+')"
        ));
    }
    Ok(root.join(id))
}

pub fn start_socket(dir: &Path) -> PathBuf {
    dir.join("s")
}

pub fn notify_socket(dir: &Path) -> PathBuf {
    dir.join("n")
}

/// The stored state; "does not exist" (the shim looks for those words) when there is none.
pub fn load(root: &Path, id: &str) -> Result<Stored, String> {
    let path = dir(root, id)?.join("state.json");
    let text =
        std::fs::read_to_string(&path).map_err(|_| format!("container {id} does not exist"))?;
    serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))
}

/// Written whole and renamed, so a reader never sees half of it.
pub fn save(dir: &Path, stored: &Stored) -> std::io::Result<()> {
    let tmp = dir.join("state.json.tmp");
    std::fs::write(&tmp, serde_json::to_vec(stored)?)?;
    std::fs::rename(tmp, dir.join("state.json"))
}

pub fn status(stored: &Stored) -> Status {
    if !alive(stored.pid, stored.pid_start) {
        Status::Stopped
    } else if stored.started && super::resources::is_paused(stored) {
        Status::Paused
    } else if stored.started {
        Status::Running
    } else {
        Status::Created
    }
}

/// runc's state JSON.
pub fn state_json(stored: &Stored) -> serde_json::Value {
    let status = status(stored);
    let pid = if status == Status::Stopped {
        0
    } else {
        stored.pid
    };
    serde_json::json!({
        "ociVersion": airlock_oci::OCI_VERSION,
        "id": stored.id,
        "pid": pid,
        "status": status.as_str(),
        "bundle": stored.bundle,
        "rootfs": stored.rootfs,
        "created": stored.created,
        "owner": "",
        "annotations": stored.annotations,
    })
}

/// `(state letter, start time in clock ticks)` of a process, from `/proc/<pid>/stat`.
pub fn proc_stat(pid: u32) -> Option<(char, u64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The name is in parentheses and may hold anything: fields count from the last ')'.
    let rest = &text[text.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split(' ').collect();
    let state = fields.first()?.chars().next()?;
    let start = fields.get(19)?.parse().ok()?;
    Some((state, start))
}

/// The process lives and is the one recorded (a zombie has ended).
pub fn alive(pid: u32, start: u64) -> bool {
    matches!(proc_stat(pid), Some((state, s)) if s == start && state != 'Z' && state != 'X')
}

/// Every descendant of `pid`, parents before children.
pub fn descendants(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    let mut queue = vec![pid];
    while let Some(parent) = queue.pop() {
        let tasks = std::fs::read_dir(format!("/proc/{parent}/task"))
            .into_iter()
            .flatten();
        for task in tasks.flatten() {
            let children =
                std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
            for child in children.split_whitespace().filter_map(|c| c.parse().ok()) {
                out.push(child);
                queue.push(child);
            }
        }
    }
    out
}

/// A signal by number or name (`9`, `KILL`, `SIGKILL`).
pub fn parse_signal(text: &str) -> Result<i32, String> {
    if let Ok(n) = text.parse::<i32>() {
        return Ok(n);
    }
    let name = text.trim_start_matches("SIG");
    let n = match name {
        "HUP" => 1,
        "INT" => 2,
        "QUIT" => 3,
        "KILL" => 9,
        "USR1" => 10,
        "USR2" => 12,
        "PIPE" => 13,
        "ALRM" => 14,
        "TERM" => 15,
        "CONT" => 18,
        "STOP" => 19,
        "WINCH" => 28,
        _ => return Err(format!("unknown signal {text:?}")),
    };
    Ok(n)
}

pub fn signal(pid: u32, signal: i32) -> std::io::Result<()> {
    let pid = rustix::process::Pid::from_raw(pid as i32)
        .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    let signal = rustix::process::Signal::from_named_raw(signal)
        .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    rustix::process::kill_process(pid, signal).map_err(std::io::Error::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_is_alive_and_has_a_start_time() {
        let pid = std::process::id();
        let (_, start) = proc_stat(pid).unwrap();
        assert!(alive(pid, start));
        assert!(
            !alive(pid, start + 1),
            "another start time is another process"
        );
    }

    #[test]
    fn signals_by_number_and_name() {
        assert_eq!(parse_signal("9"), Ok(9));
        assert_eq!(parse_signal("SIGTERM"), Ok(15));
        assert_eq!(parse_signal("KILL"), Ok(9));
        assert!(parse_signal("SIGNOPE").is_err());
    }

    #[test]
    fn an_id_is_a_name_never_a_path() {
        assert!(dir(Path::new("/r"), "abc-1").is_ok());
        for bad in ["", "../x", "a/b", ".hidden"] {
            assert!(dir(Path::new("/r"), bad).is_err(), "{bad}");
        }
    }
}
