//! The result of one run: exactly one class, derived from real signals (exit status, the
//! cgroup counters, the deadline timer, the output counter, tmpfs free space, seccomp
//! kills), never from the payload's output.

use crate::cgroup::CgroupUsage;
use crate::output::OutputCapture;
use serde::Serialize;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ResultClass {
    Ok,
    TaskError,
    PolicyDenied,
    CapacityExceeded,
    RuntimeFault,
    SandboxUnavailable,
    SuspectedEscape,
    /// The run completed but airlock could not deliver what the caller asked for: an
    /// artifact the host side could not write, or the `--result` file.
    DeliveryFailed,
}

/// The exit code of `airlock run` for [`ResultClass::DeliveryFailed`]: below the 124-127
/// that `timeout` and `docker run` use, and not a code those tools give.
pub const DELIVERY_FAILED_EXIT: i32 = 123;

impl ResultClass {
    pub const ALL: [ResultClass; 8] = [
        ResultClass::Ok,
        ResultClass::TaskError,
        ResultClass::PolicyDenied,
        ResultClass::CapacityExceeded,
        ResultClass::RuntimeFault,
        ResultClass::SandboxUnavailable,
        ResultClass::SuspectedEscape,
        ResultClass::DeliveryFailed,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ResultClass::Ok => "ok",
            ResultClass::TaskError => "task_error",
            ResultClass::PolicyDenied => "policy_denied",
            ResultClass::CapacityExceeded => "capacity_exceeded",
            ResultClass::RuntimeFault => "runtime_fault",
            ResultClass::SandboxUnavailable => "sandbox_unavailable",
            ResultClass::SuspectedEscape => "suspected_escape",
            ResultClass::DeliveryFailed => "delivery_failed",
        }
    }

    /// The class named `name` (as `as_str` spells it), e.g. from another crate's error.
    pub fn from_name(name: &str) -> Option<ResultClass> {
        ResultClass::ALL
            .into_iter()
            .find(|class| class.as_str() == name)
    }

    /// The class and exit code of a run that had this class before something it was asked
    /// to deliver was lost. A run that completed on its own terms (`ok`, `task_error`)
    /// becomes `delivery_failed`; a class about the cell itself (a ceiling, a denial, a
    /// fault, an escape) says more and stays, with the loss recorded beside it.
    pub fn after_delivery_failure(self) -> Option<(ResultClass, i32)> {
        match self {
            ResultClass::Ok | ResultClass::TaskError | ResultClass::DeliveryFailed => {
                Some((ResultClass::DeliveryFailed, DELIVERY_FAILED_EXIT))
            }
            ResultClass::PolicyDenied
            | ResultClass::CapacityExceeded
            | ResultClass::RuntimeFault
            | ResultClass::SandboxUnavailable
            | ResultClass::SuspectedEscape => None,
        }
    }
}

/// Which ceiling ended or marked the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Ceiling {
    Memory,
    Pids,
    Cpu,
    WallTime,
    OutputBytes,
    Disk,
    /// `/dev/shm` was full (`resources.shm_mb`).
    Shm,
}

#[derive(Debug, Default, Clone, Copy, Serialize)]
pub struct ExitInfo {
    pub code: Option<i32>,
    pub signal: Option<i32>,
}

#[derive(Debug, Default, Clone, Copy, Serialize)]
pub struct Timings {
    /// Milestones of the start, each in ms from the start of `run`: the cell was cloned
    /// and its cgroup created and joined, its seccomp program and mount trees were ready,
    /// the audit record was written, the cell was released.
    pub spawned_ms: f64,
    pub prepared_ms: f64,
    pub recorded_ms: f64,
    pub released_ms: f64,
    /// From the start of `run` to the payload's successful exec.
    pub startup_ms: f64,
    /// From the start of `run` until pid 1 of the cell was gone.
    pub ended_ms: f64,
    /// From the start of `run` until the cell was gone.
    pub wall_ms: f64,
    /// Time spent destroying the cell after the payload ended.
    pub teardown_ms: f64,
}

#[derive(Debug, Default, Clone, Copy, Serialize)]
pub struct Usage {
    pub cpu_user_ms: f64,
    pub cpu_system_ms: f64,
    pub memory_peak_bytes: u64,
    pub pids_peak: u64,
    pub oom_kills: u64,
    pub pids_limit_hits: u64,
}

impl Usage {
    pub fn from_parts(rusage: Option<&libc::rusage>, cgroup: CgroupUsage) -> Usage {
        let ms = |tv: libc::timeval| tv.tv_sec as f64 * 1000.0 + tv.tv_usec as f64 / 1000.0;
        Usage {
            cpu_user_ms: rusage.map_or(0.0, |r| ms(r.ru_utime)),
            cpu_system_ms: rusage.map_or(0.0, |r| ms(r.ru_stime)),
            memory_peak_bytes: cgroup.memory_peak_bytes,
            pids_peak: cgroup.pids_peak,
            oom_kills: cgroup.oom_kills,
            pids_limit_hits: cgroup.pids_limit_hits,
        }
    }
}

#[derive(Debug, Default, Clone, Serialize)]
pub struct CleanupReport {
    pub ok: bool,
    /// Anything that could not be removed (cgroup dirs, processes).
    pub leftovers: Vec<String>,
}

/// Everything `airlock run` reports about one run.
#[derive(Debug, Serialize)]
pub struct RunReport {
    pub run_id: String,
    pub status: ResultClass,
    pub exit: ExitInfo,
    pub limit_fired: Option<Ceiling>,
    /// Human-readable cause for runtime faults, unavailable controls and exec failures.
    pub error: Option<String>,
    /// The exit code `airlock run` itself returns (DESIGN.md §4).
    pub exit_code: i32,
    pub timings: Timings,
    pub usage: Usage,
    pub output: Option<OutputCapture>,
    pub cgroup_version: Option<&'static str>,
    pub egress: serde_json::Value,
    pub artifacts: serde_json::Value,
    pub cleanup: CleanupReport,
    /// Cgroups of dead supervisors' cells that this run's start could not remove.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub stale_cgroups_left: Vec<String>,
    /// What the payload got on stdin: set by the supervisor when it relayed a pipe, by
    /// the caller otherwise (it knows what it passed).
    pub stdin: Option<crate::stdin_relay::StdinRecord>,
    /// What the cell got differently from its plan without weakening a control (a
    /// read-only input on a filesystem without idmapped mounts keeps its host owners).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

impl RunReport {
    /// A run that ended before a cell existed.
    pub fn refused(run_id: &str, status: ResultClass, error: String) -> RunReport {
        RunReport {
            run_id: run_id.to_string(),
            status,
            exit: ExitInfo::default(),
            limit_fired: None,
            error: Some(error),
            exit_code: 125,
            timings: Timings::default(),
            usage: Usage::default(),
            output: None,
            cgroup_version: None,
            egress: serde_json::Value::Null,
            artifacts: serde_json::Value::Null,
            cleanup: CleanupReport {
                ok: true,
                leftovers: Vec::new(),
            },
            stdin: None,
            stale_cgroups_left: Vec::new(),
            notes: Vec::new(),
        }
    }

    /// One line per artifact the host side could not write (`artifacts.undelivered`),
    /// with the path as the collector escaped it: safe to print on a terminal.
    pub fn undelivered_artifacts(&self) -> Vec<String> {
        let undelivered = self.artifacts.get("undelivered").and_then(|u| u.as_array());
        let text = |v: &serde_json::Value, key: &str| {
            v.get(key)
                .and_then(|t| t.as_str())
                .unwrap_or("")
                .to_string()
        };
        undelivered
            .into_iter()
            .flatten()
            .map(|a| {
                let (path, reason, error) = (text(a, "path"), text(a, "reason"), text(a, "error"));
                format!("artifact {path} not delivered ({reason}): {error}")
            })
            .collect()
    }

    /// Records that something the caller asked for was not delivered: `cause` joins the
    /// error, and the class and exit code follow [`ResultClass::after_delivery_failure`].
    pub fn mark_delivery_failed(&mut self, cause: String) {
        if let Some((status, exit_code)) = self.status.after_delivery_failure() {
            self.status = status;
            self.exit_code = exit_code;
        }
        self.error = Some(match self.error.take() {
            Some(earlier) => format!("{earlier}; {cause}"),
            None => cause,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::{ResultClass, RunReport};

    // The spellings themselves are checked against the store's list of finish statuses
    // (crates/airlock/tests/audit_store.rs) and against serde's names below.
    #[test]
    fn every_class_round_trips_through_its_name() {
        for class in ResultClass::ALL {
            assert_eq!(ResultClass::from_name(class.as_str()), Some(class));
            assert_eq!(
                serde_json::to_value(class).unwrap(),
                serde_json::json!(class.as_str()),
                "the result JSON and the name agree"
            );
        }
        assert_eq!(ResultClass::from_name("aborted"), None);
    }

    #[test]
    fn a_lost_delivery_turns_a_finished_run_into_delivery_failed_with_exit_123() {
        for class in [ResultClass::Ok, ResultClass::TaskError] {
            let mut report = RunReport::refused("r", class, "payload said no".into());
            report.error = None;
            report.mark_delivery_failed("the result file r.json could not be written".into());
            assert_eq!(report.status, ResultClass::DeliveryFailed);
            assert_eq!(report.exit_code, 123);
            assert_eq!(
                report.error.as_deref(),
                Some("the result file r.json could not be written")
            );
        }
    }

    #[test]
    fn a_class_about_the_cell_survives_a_lost_delivery_and_the_loss_is_recorded() {
        for class in ResultClass::ALL {
            if matches!(
                class,
                ResultClass::Ok | ResultClass::TaskError | ResultClass::DeliveryFailed
            ) {
                continue;
            }
            let mut report = RunReport::refused("r", class, "the memory ceiling".into());
            report.exit_code = 137;
            report.mark_delivery_failed("artifact lost".into());
            assert_eq!((report.status, report.exit_code), (class, 137));
            assert_eq!(
                report.error.as_deref(),
                Some("the memory ceiling; artifact lost")
            );
        }
    }
}
