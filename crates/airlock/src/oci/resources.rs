//! The runtime's commands on a running container's cgroup: `pause` and `resume` (the
//! cell frozen and thawed), `update` (its limits lowered, or raised again up to the
//! plan's ceilings: crates/oci/src/update.rs decides), `events` (its counters in runc's
//! event format). The cell's cgroup is found by its supervisor's pid and start time
//! (crates/cell/src/cgroup/live.rs); the supervisor itself stays outside it, so a paused
//! cell's deadline keeps running and its record is still completed.

use super::state::{self, Status, Stored};
use airlock_cell::cgroup::{CellCgroup, CgroupLayout, CgroupStats, LimitChanges};
use airlock_oci::update::{resource_update, ResourceUpdate};
use serde_json::{json, Value};
use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

/// The audit event of an update, on the container's run record.
const UPDATE_EVENT: &str = "container.update";
/// An update the kernel did not take (all or part of it), after its `container.update`.
const UPDATE_FAILED_EVENT: &str = "container.update_failed";

/// The cgroup of a container's cell.
pub fn cell_cgroup(stored: &Stored) -> Result<CellCgroup, String> {
    let layout = CgroupLayout::detect().map_err(|e| format!("container {}: {e}", stored.id))?;
    // A container with `linux.cgroupsPath` has its cell below the supervisor's cgroup.
    CellCgroup::of_supervisor(&layout, stored.pid, stored.pid_start)
        .or_else(|| CellCgroup::of_container_supervisor(&layout, stored.pid, stored.pid_start))
        .ok_or_else(|| {
            format!(
                "container {}: its cell has no cgroup (it ended, or its ceilings are rlimits \
             only, without which pause, resume, update and stats cannot be done)",
                stored.id
            )
        })
}

/// A stopped container's cgroup (its bundle's `linux.cgroupsPath`) that its supervisor
/// could not remove (it was killed): removed when it is airlock's and empty
/// (`airlock_cell::cgroup::remove_abandoned`). Nothing to do when it is gone, as after
/// every ordinary end.
pub fn remove_abandoned_cgroup(stored: &Stored, systemd: bool) -> Result<(), String> {
    let config = stored.bundle.join("config.json");
    let Ok(bytes) = std::fs::read(&config) else {
        return Ok(());
    };
    let raw = serde_json::from_slice::<oci_spec::runtime::Spec>(&bytes)
        .ok()
        .and_then(|spec| spec.linux().as_ref()?.cgroups_path().clone())
        .map(|p| p.to_string_lossy().into_owned())
        .filter(|p| !p.is_empty());
    let Some(raw) = raw else {
        return Ok(());
    };
    // A path that was refused at create has nothing to remove.
    let Ok(path) = airlock_oci::cgroups_path::container_cgroup(&raw, systemd) else {
        return Ok(());
    };
    let Ok(path) = airlock_cell::cgroup::ContainerCgroupPath::new(path) else {
        return Ok(());
    };
    let layout = CgroupLayout::detect().map_err(|e| format!("container {}: {e}", stored.id))?;
    airlock_cell::cgroup::remove_abandoned(&layout, &path)
        .map_err(|e| format!("container {}: delete: {e}", stored.id))
}

/// Whether a running container's cell is frozen (what `state` reports as paused).
pub fn is_paused(stored: &Stored) -> bool {
    cell_cgroup(stored).is_ok_and(|cgroup| cgroup.is_paused())
}

pub fn pause(root: &Path, id: &str) -> Result<ExitCode, String> {
    let stored = state::load(root, id)?;
    match state::status(&stored) {
        Status::Running => {}
        Status::Paused => return Err(format!("container {id} is already paused")),
        other => {
            return Err(format!(
                "cannot pause a container that is {}: {id}",
                other.as_str()
            ))
        }
    }
    cell_cgroup(&stored)?
        .pause()
        .map_err(|e| format!("container {id}: pause: {e}"))?;
    Ok(ExitCode::SUCCESS)
}

pub fn resume(root: &Path, id: &str) -> Result<ExitCode, String> {
    let stored = state::load(root, id)?;
    if state::status(&stored) != Status::Paused {
        return Err(format!("container {id} is not paused"));
    }
    cell_cgroup(&stored)?
        .resume()
        .map_err(|e| format!("container {id}: resume: {e}"))?;
    Ok(ExitCode::SUCCESS)
}

/// After a SIGKILL to a paused container's processes: the cell is thawed, so that they
/// die (a frozen v1 task acts on no signal) and its pid 1 reaps them and reports. Not
/// asked whether it is still frozen: on v2 a frozen cell reads `frozen 0` while a killed
/// task is on its way out and `frozen 1` again once it is gone, so a check made then
/// would leave the rest frozen for good. Thawing a thawed cell changes nothing.
pub fn thaw_after_kill(stored: &Stored) {
    if let Ok(cgroup) = cell_cgroup(stored) {
        let _ = cgroup.resume();
    }
}

/// `update --resources FILE|-`: the request is decided against the plan's ceilings,
/// recorded on the run, then written into the cell's cgroup.
pub fn update(root: &Path, id: &str, resources: Option<&Path>) -> Result<ExitCode, String> {
    let Some(resources) = resources else {
        return Err(format!(
            "container {id}: update needs --resources FILE (- for stdin), the spec's \
             linux.resources as JSON; runc's single-value flags are not supported"
        ));
    };
    let stored = state::load(root, id)?;
    if state::status(&stored) == Status::Stopped {
        return Err(format!("container {id} not running"));
    }
    let Some(ceilings) = &stored.limits else {
        return Err(format!(
            "container {id}: its state holds no ceilings (created by an older airlock): \
             update refused"
        ));
    };
    let request = read_resources(resources)?;
    let update = resource_update(&request, ceilings, stored.isolation)
        .map_err(|refusal| format!("container {id}: {refusal}"))?;
    if update.is_empty() {
        return Ok(ExitCode::SUCCESS);
    }
    let cgroup = cell_cgroup(&stored)?;
    record(
        &stored,
        UPDATE_EVENT,
        update_body(&stored, &update, ceilings),
    )
    .map_err(|e| {
        format!(
            "container {id}: the update could not be recorded on run {} (not made): {e}",
            stored.run_id
        )
    })?;
    let applied = cgroup.change_limits(&LimitChanges {
        memory_bytes: update.memory_bytes,
        process_limit: update.process_limit,
        cpu_millis: update.cpu_millis,
    });
    if let Err(err) = applied {
        // v1 refuses a memory limit below what it cannot reclaim (EBUSY): the record
        // must not keep saying the limit was set.
        let error = format!("container {id}: update: {err}");
        let body = json!({"container": id, "error": error});
        return Err(match record(&stored, UPDATE_FAILED_EVENT, body) {
            Ok(()) => error,
            Err(e) => format!("{error}; and its failure was not recorded: {e}"),
        });
    }
    Ok(ExitCode::SUCCESS)
}

fn read_resources(from: &Path) -> Result<oci_spec::runtime::LinuxResources, String> {
    let parsed = if from == Path::new("-") {
        serde_json::from_reader(std::io::stdin().lock())
    } else {
        let file = std::fs::File::open(from)
            .map_err(|e| format!("--resources {}: {e}", from.display()))?;
        serde_json::from_reader(std::io::BufReader::new(file))
    };
    parsed.map_err(|e| {
        format!(
            "--resources {}: not linux.resources JSON: {e}",
            from.display()
        )
    })
}

/// What an update sets, and the ceilings it was checked against.
fn update_body(
    stored: &Stored,
    update: &ResourceUpdate,
    ceilings: &airlock_contract::Limits,
) -> Value {
    json!({
        "container": stored.id,
        "set": update,
        "ceilings": {
            "memory_bytes": ceilings.memory_bytes,
            "process_limit": ceilings.process_limit,
            "cpu_millis": ceilings.cpu_millis,
        },
    })
}

/// An event on the container's run record (the store of the operator configuration).
fn record(stored: &Stored, kind: &str, body: Value) -> Result<(), String> {
    let config = super::supervise::load_config()?;
    let location = config
        .store_location(None)
        .map_err(|e| crate::user_message(&e))?;
    airlock_store::Store::open_at(&location)
        .and_then(|store| store.append_run_event(&stored.run_id, kind, body))
        .map_err(|e| e.to_string())
}

/// `events --stats`: one stats event; `events`: one every `interval` until the
/// container stops (no OOM events: the run's record counts its OOM kills).
pub fn events(root: &Path, id: &str, stats: bool, interval: &str) -> Result<ExitCode, String> {
    let every = parse_interval(interval)?;
    let stored = state::load(root, id)?;
    let mut streamed = false;
    loop {
        if state::status(&stored) == Status::Stopped {
            return match stats {
                true => Err(format!("container {id} not running")),
                false => Ok(ExitCode::SUCCESS),
            };
        }
        let cgroup = match cell_cgroup(&stored) {
            Ok(cgroup) => cgroup,
            // The cell had a cgroup and has none now: it ended, and its supervisor,
            // still alive, is completing the record (it removes the cgroup before it
            // exits). The stream ends with the container, as when it is stopped.
            Err(_) if streamed => return Ok(ExitCode::SUCCESS),
            Err(err) => return Err(err),
        };
        println!("{}", stats_event(id, &cgroup.stats()));
        if stats {
            return Ok(ExitCode::SUCCESS);
        }
        streamed = true;
        std::thread::sleep(every);
    }
}

/// `5s`, `500ms`, `1m` or plain seconds, as runc's `--interval`.
fn parse_interval(text: &str) -> Result<Duration, String> {
    let bad = || format!("--interval {text:?}: a duration such as 5s or 500ms");
    let (number, unit) = match text.find(|c: char| !c.is_ascii_digit()) {
        Some(at) => text.split_at(at),
        None => (text, "s"),
    };
    let n: u64 = number.parse().map_err(|_| bad())?;
    let every = match unit {
        "ms" => Duration::from_millis(n),
        "s" => Duration::from_secs(n),
        "m" => Duration::from_secs(n * 60),
        _ => return Err(bad()),
    };
    if every.is_zero() {
        return Err(bad());
    }
    Ok(every)
}

/// runc's stats event (libcontainer's `types.Event` with `types.Stats`, as go-runc and
/// containerd decode it): `null`-free, unlimited as runc reports it (memory: the
/// largest number; pids: 0).
pub fn stats_event(id: &str, stats: &CgroupStats) -> Value {
    json!({
        "type": "stats",
        "id": id,
        "data": {
            "cpu": {
                "usage": {
                    "total": stats.cpu_usage_ns.unwrap_or(0),
                    "kernel": stats.cpu_kernel_ns.unwrap_or(0),
                    "user": stats.cpu_user_ns.unwrap_or(0),
                },
                "throttling": {
                    "periods": stats.cpu_periods,
                    "throttledPeriods": stats.cpu_throttled_periods,
                    "throttledTime": stats.cpu_throttled_ns,
                },
            },
            "memory": {
                "cache": stats.memory_cache_bytes,
                "usage": {
                    "limit": stats.memory_limit_bytes.unwrap_or(u64::MAX),
                    "usage": stats.memory_usage_bytes,
                    "max": stats.memory_peak_bytes,
                    "failcnt": stats.memory_limit_hits,
                },
                "raw": {"oom_kill": stats.oom_kills},
            },
            "pids": {
                "current": stats.pids_current,
                "limit": stats.pids_limit.unwrap_or(0),
            },
            "blkio": {},
            "hugetlb": {},
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intervals_are_read_as_runcs() {
        assert_eq!(parse_interval("5s"), Ok(Duration::from_secs(5)));
        assert_eq!(parse_interval("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_interval("2"), Ok(Duration::from_secs(2)));
        assert!(parse_interval("0s").is_err());
        assert!(parse_interval("fast").is_err());
    }

    #[test]
    fn the_stats_event_has_runcs_shape() {
        let stats = CgroupStats {
            cpu_usage_ns: Some(9),
            memory_usage_bytes: 4096,
            memory_limit_bytes: None,
            pids_current: 2,
            pids_limit: Some(65),
            ..CgroupStats::default()
        };
        let event = stats_event("c1", &stats);
        assert_eq!(event["type"], "stats");
        assert_eq!(event["id"], "c1");
        assert_eq!(event["data"]["cpu"]["usage"]["total"], 9);
        assert_eq!(event["data"]["memory"]["usage"]["usage"], 4096);
        assert_eq!(event["data"]["memory"]["usage"]["limit"], u64::MAX);
        assert_eq!(event["data"]["pids"]["current"], 2);
        assert_eq!(event["data"]["pids"]["limit"], 65);
    }
}
