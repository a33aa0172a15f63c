//! `airlock doctor`'s view of the gVisor tier: the runsc binary, its version and
//! platform, a real run end to end, and the sandboxes of dead supervisors, which it
//! reaps (their processes, runsc's state, the writable paths' tmpfs, the cgroups).

use super::bundle::{leftover_cells, STATE_ROOT};
use super::runsc::{RunscBinary, PLATFORM};
use crate::host_identity::HostIdRange;
use crate::report::ResultClass;
use std::path::Path;

/// `(control, ok detail or failure)` of each gVisor check. A host without runsc passes,
/// and so does a caller the tier needs root from (the tier is optional, and a gVisor run
/// there is refused, never run natively: doctor's exit says whether a default run
/// works); a runsc that this caller could use must work.
pub fn checks(host_ids: HostIdRange) -> Vec<(&'static str, Result<String, String>)> {
    let refused = |why: String| {
        vec![(
            "gvisor.runsc",
            Ok(format!(
                "not usable ({why}); contracts with isolation gvisor are refused (sandbox_unavailable)"
            )),
        )]
    };
    let binary = match RunscBinary::locate_and_ask() {
        Ok(binary) => binary,
        Err(err) => return refused(err.to_string()),
    };
    if crate::sys::geteuid() != 0 {
        return refused(format!(
            "{} found, but the gVisor tier needs root here",
            binary.path.display()
        ));
    }
    vec![
        (
            "gvisor.runsc",
            Ok(format!(
                "{} ({}), platform {PLATFORM}",
                binary.path.display(),
                binary.version
            )),
        ),
        // Before the end-to-end run, which would reap them itself.
        ("gvisor.leftovers", reap_leftovers()),
        ("gvisor.end_to_end", end_to_end(host_ids)),
    ]
}

/// `uname -r` on the tier through the real backend: it must run, answer with gVisor's
/// kernel (not the host's) and leave nothing behind.
fn end_to_end(host_ids: HostIdRange) -> Result<String, String> {
    let mut contract = airlock_contract::default_contract();
    contract.isolation = airlock_contract::Isolation::Gvisor;
    let argv = ["uname".to_string(), "-r".to_string()];
    let plan = airlock_contract::compile(
        &contract,
        &airlock_contract::CompileInput::new(Path::new("/"), &argv),
    )
    .map_err(|e| e.to_string())?;
    let report = super::run_gvisor(&plan, crate::RunOptions::bare(host_ids));
    let kernel = report
        .output
        .as_ref()
        .map(|o| o.stdout.head_text().trim().to_string())
        .unwrap_or_default();
    let host_kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    match report.status {
        ResultClass::Ok if report.cleanup.ok && kernel != host_kernel.trim() => Ok(format!(
            "uname -r ran on gVisor's kernel {kernel} (host {}) in {:.0} ms, nothing left",
            host_kernel.trim(),
            report.timings.wall_ms
        )),
        ResultClass::Ok if report.cleanup.ok => Err(format!(
            "uname -r answered the host's kernel {kernel}: not gVisor"
        )),
        status => Err(format!(
            "{}: {} {}",
            status.as_str(),
            report.error.unwrap_or_default(),
            report.cleanup.leftovers.join(", ")
        )),
    }
}

/// Removes the sandboxes of supervisors that are gone: `runsc delete --force` in their
/// state directory, SIGKILL to whatever is left in their cgroups, the tmpfs unmounted,
/// the directories and cgroups removed.
pub fn reap_leftovers() -> Result<String, String> {
    let cells = leftover_cells();
    if cells.is_empty() {
        return Ok(format!(
            "no sandbox of a dead supervisor under {STATE_ROOT}"
        ));
    }
    let mut left = Vec::new();
    for dir in &cells {
        left.extend(reap(dir));
    }
    if left.is_empty() {
        Ok(format!(
            "reaped {} sandbox(es) of dead supervisors: {}",
            cells.len(),
            cells
                .iter()
                .map(|c| c.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ))
    } else {
        Err(format!("could not reap: {}", left.join(", ")))
    }
}

fn reap(dir: &Path) -> Vec<String> {
    let name = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    if let Ok(binary) = RunscBinary::locate() {
        let runsc =
            super::runsc::Runsc::new(&binary, &dir.join("state"), &dir.join("runsc.log"), &name);
        let _ = runsc.delete();
    }
    kill_cgroup_members(&name);
    let mut left = super::remove_runsc_cgroups(&name);
    let cell = super::bundle::CellDir::existing(dir);
    left.extend(cell.remove());
    left
}

/// SIGKILL, until none is left, to every process in any hierarchy's `airlock/<name>`.
fn kill_cgroup_members(name: &str) {
    let Ok(hierarchies) = std::fs::read_dir("/sys/fs/cgroup") else {
        return;
    };
    let procs: Vec<_> = hierarchies
        .flatten()
        .map(|h| h.path().join("airlock").join(name).join("cgroup.procs"))
        .collect();
    for _ in 0..200 {
        let pids: Vec<libc::pid_t> = procs
            .iter()
            .flat_map(|p| {
                std::fs::read_to_string(p)
                    .unwrap_or_default()
                    .lines()
                    .filter_map(|l| l.parse().ok())
                    .collect::<Vec<_>>()
            })
            .collect();
        if pids.is_empty() {
            return;
        }
        for pid in pids {
            let _ = crate::sys::kill(pid, libc::SIGKILL);
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}
