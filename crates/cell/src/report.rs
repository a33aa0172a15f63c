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

/// A ceiling of the contract. `limit_fired` names the one that decided the run's class
/// (it killed something, or the payload failed after hitting it); `limits_hit` every one
/// the run reached, fatal or not.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Ceiling {
    Memory,
    Pids,
    Cpu,
    WallTime,
    OutputBytes,
    Disk,
    /// `file_size_mb` (`RLIMIT_FSIZE`): a write past it was refused (`EFBIG`) or killed
    /// its writer (`SIGXFSZ`).
    FileSize,
    /// `/dev/shm` was full (`resources.shm_mb`).
    Shm,
}

impl Ceiling {
    pub fn as_str(self) -> &'static str {
        match self {
            Ceiling::Memory => "memory",
            Ceiling::Pids => "pids",
            Ceiling::Cpu => "cpu",
            Ceiling::WallTime => "wall_time",
            Ceiling::OutputBytes => "output_bytes",
            Ceiling::Disk => "disk",
            Ceiling::FileSize => "file_size",
            Ceiling::Shm => "shm",
        }
    }
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

/// Most lines [`RunReport::artifacts_of_note`] returns.
pub const MAX_ARTIFACT_LINES: usize = 10;
/// Hosts named per denial reason in [`RunReport::summary`].
const MAX_HOSTS_SHOWN: usize = 3;
/// Longest host name shown in a summary, in characters of its escaped form.
const MAX_HOST_CHARS: usize = 80;

/// The text of a record's field. Artifact paths are escaped by the collector and reason
/// codes are airlock's own; host names are the cell's and are escaped where used.
fn json_text(value: &serde_json::Value, key: &str) -> String {
    value
        .get(key)
        .and_then(|t| t.as_str())
        .unwrap_or("")
        .to_string()
}

/// `text` cut to [`MAX_HOST_CHARS`] characters.
fn shortened(text: &str) -> String {
    match text.char_indices().nth(MAX_HOST_CHARS) {
        Some((at, _)) => format!("{}...", &text[..at]),
        None => text.to_string(),
    }
}

/// Everything `airlock run` reports about one run.
#[derive(Debug, Serialize)]
pub struct RunReport {
    pub run_id: String,
    pub status: ResultClass,
    pub exit: ExitInfo,
    pub limit_fired: Option<Ceiling>,
    /// Every ceiling the run reached, whether or not it decided the class: a payload that
    /// handled a refused fork and exited 0 is `ok`, with `pids` here.
    pub limits_hit: Vec<Ceiling>,
    /// Human-readable cause for runtime faults, unavailable controls and exec failures.
    pub error: Option<String>,
    /// The exit code `airlock run` itself returns (docs/architecture.md, "Result classes").
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
    /// The host uid and gid the cell ran as (its own while it lived, as root; see
    /// host_identity.rs); `None` when no cell was started.
    pub host_identity: Option<crate::host_identity::HostIdentity>,
}

impl RunReport {
    /// A run that ended before a cell existed.
    pub fn refused(run_id: &str, status: ResultClass, error: String) -> RunReport {
        RunReport {
            run_id: run_id.to_string(),
            status,
            exit: ExitInfo::default(),
            limit_fired: None,
            limits_hit: Vec::new(),
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
            host_identity: None,
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

    /// One line per declared artifact that policy kept in the cell (too large, a
    /// symlink, a hard link, ...), and one per artifact that may be cut short by
    /// `file_size_mb`; undeclared files are only counted in [`RunReport::summary`]. Paths
    /// are as the collector escaped them; at most [`MAX_ARTIFACT_LINES`] lines.
    pub fn artifacts_of_note(&self) -> Vec<String> {
        let rejected = self.artifact_list("rejected").filter_map(|a| {
            let reason = json_text(a, "reason");
            (reason != crate::artifacts::reason::UNDECLARED).then(|| {
                let path = json_text(a, "path");
                format!("artifact {path} was not delivered ({reason})")
            })
        });
        let truncated = self
            .artifact_list("kept")
            .filter(|a| a.get("truncated").and_then(|t| t.as_bool()) == Some(true))
            .map(|a| {
                let path = json_text(a, "path");
                format!(
                    "artifact {path} is exactly file_size_mb long: a write past it was refused, \
                     so it may be cut short"
                )
            });
        let mut lines: Vec<String> = rejected.chain(truncated).collect();
        if lines.len() > MAX_ARTIFACT_LINES {
            let more = lines.len() - MAX_ARTIFACT_LINES + 1;
            lines.truncate(MAX_ARTIFACT_LINES - 1);
            lines.push(format!(
                "{more} more artifacts of note: see the result's artifacts"
            ));
        }
        lines
    }

    /// The one line the CLI prints at the end of a run that has something to say beyond
    /// its exit: the ceiling that fired and those hit, egress denials by reason (with the
    /// hosts, escaped), artifacts rejected, undelivered or cut short. `None` for a run
    /// with none of these. The record keeps the full lists.
    pub fn summary(&self) -> Option<String> {
        let mut parts = Vec::new();
        if let Some(limit) = self.limit_fired {
            parts.push(format!("the {} ceiling fired", limit.as_str()));
        }
        let hit: Vec<&str> = self
            .limits_hit
            .iter()
            .filter(|c| Some(**c) != self.limit_fired)
            .map(|c| c.as_str())
            .collect();
        if !hit.is_empty() {
            parts.push(format!("limits hit: {}", hit.join(", ")));
        }
        parts.extend(self.egress_summary());
        parts.extend(self.artifact_summary());
        if parts.is_empty() {
            return None;
        }
        Some(format!(
            "{}: exit {}; {}",
            self.status.as_str(),
            self.exit_code,
            parts.join("; ")
        ))
    }

    fn egress_summary(&self) -> Option<String> {
        let denied: Vec<&serde_json::Value> = self
            .egress
            .as_array()
            .into_iter()
            .flatten()
            .filter(|r| r.get("decision").and_then(|d| d.as_str()) == Some("denied"))
            .collect();
        if denied.is_empty() {
            return None;
        }
        // (reason, attempts, distinct hosts in order of first attempt)
        let mut reasons: Vec<(String, usize, Vec<String>)> = Vec::new();
        for record in &denied {
            let reason = json_text(record, "reason");
            // The name the payload asked for: anything, a terminal escape included.
            let host = shortened(&crate::host_files::escaped(
                json_text(record, "host").as_bytes(),
            ));
            let entry = match reasons.iter().position(|(r, _, _)| *r == reason) {
                Some(i) => &mut reasons[i],
                None => {
                    reasons.push((reason, 0, Vec::new()));
                    reasons.last_mut().expect("just pushed")
                }
            };
            entry.1 += 1;
            if !host.is_empty() && !entry.2.contains(&host) {
                entry.2.push(host);
            }
        }
        let by_reason: Vec<String> = reasons
            .into_iter()
            .map(|(reason, count, hosts)| {
                let shown = hosts.len().min(MAX_HOSTS_SHOWN);
                let mut list = hosts[..shown].join(", ");
                if hosts.len() > shown {
                    list.push_str(&format!(" and {} more", hosts.len() - shown));
                }
                match list.is_empty() {
                    true => format!("{reason} x{count}"),
                    false => format!("{reason} x{count}: {list}"),
                }
            })
            .collect();
        Some(format!(
            "egress: {} denied ({})",
            denied.len(),
            by_reason.join("; ")
        ))
    }

    fn artifact_summary(&self) -> Option<String> {
        let mut rejected: Vec<(String, usize)> = Vec::new();
        for artifact in self.artifact_list("rejected") {
            let reason = json_text(artifact, "reason");
            match rejected.iter_mut().find(|(r, _)| *r == reason) {
                Some(entry) => entry.1 += 1,
                None => rejected.push((reason, 1)),
            }
        }
        let truncated = self
            .artifact_list("kept")
            .filter(|a| a.get("truncated").and_then(|t| t.as_bool()) == Some(true))
            .count();
        let undelivered = self.artifact_list("undelivered").count();
        let mut parts = Vec::new();
        if !rejected.is_empty() {
            let total: usize = rejected.iter().map(|(_, n)| n).sum();
            let reasons: Vec<String> = rejected.iter().map(|(r, n)| format!("{r} x{n}")).collect();
            parts.push(format!("{total} rejected ({})", reasons.join(", ")));
        }
        if truncated > 0 {
            parts.push(format!("{truncated} possibly cut short by file_size_mb"));
        }
        if undelivered > 0 {
            parts.push(format!("{undelivered} undelivered"));
        }
        (!parts.is_empty()).then(|| format!("artifacts: {}", parts.join(", ")))
    }

    fn artifact_list(&self, key: &str) -> impl Iterator<Item = &serde_json::Value> {
        self.artifacts
            .get(key)
            .and_then(|list| list.as_array())
            .into_iter()
            .flatten()
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
    use super::{Ceiling, ResultClass, RunReport};
    use serde_json::json;

    fn finished(status: ResultClass, exit_code: i32) -> RunReport {
        let mut report = RunReport::refused("r", status, String::new());
        report.error = None;
        report.exit_code = exit_code;
        report
    }

    #[test]
    fn a_run_with_nothing_to_say_has_no_summary() {
        let mut report = finished(ResultClass::Ok, 0);
        report.egress = json!([{ "decision": "allowed", "host": "api.test", "reason": null }]);
        report.artifacts = json!({ "kept": [{ "path": "/output/a", "truncated": false }],
                                   "rejected": [], "undelivered": [] });
        assert_eq!(report.summary(), None);
        assert!(report.artifacts_of_note().is_empty());
    }

    #[test]
    fn the_summary_names_the_fired_ceiling_once_and_the_other_hits() {
        let mut report = finished(ResultClass::CapacityExceeded, 137);
        report.limit_fired = Some(Ceiling::Memory);
        report.limits_hit = vec![Ceiling::Memory, Ceiling::Pids];
        assert_eq!(
            report.summary().as_deref(),
            Some("capacity_exceeded: exit 137; the memory ceiling fired; limits hit: pids")
        );
    }

    #[test]
    fn egress_denials_are_counted_by_reason_with_their_hosts_escaped() {
        let mut report = finished(ResultClass::Ok, 0);
        let denied = |host: &str, reason: &str| json!({ "decision": "denied", "host": host, "reason": reason });
        report.egress = json!([
            denied("evil.test", "egress.not_allowlisted"),
            denied("evil.test", "egress.not_allowlisted"),
            denied("\u{1b}[2Jx.test\n", "egress.not_allowlisted"),
            denied("ten.test", "egress.private_address"),
        ]);
        let summary = report.summary().unwrap();
        assert_eq!(
            summary,
            "ok: exit 0; egress: 4 denied (egress.not_allowlisted x3: evil.test, \
             \\x1B[2Jx.test\\x0A; egress.private_address x1: ten.test)"
        );
        assert!(!summary.chars().any(char::is_control));
    }

    #[test]
    fn artifacts_that_did_not_leave_or_may_be_cut_short_are_lines_of_their_own() {
        let mut report = finished(ResultClass::Ok, 0);
        report.artifacts = json!({
            "kept": [{ "path": "/output/log", "truncated": true }],
            "rejected": [
                { "path": "/output/big", "reason": "artifact.too_large" },
                { "path": "/output/tmp", "reason": "artifact.undeclared" },
            ],
            "undelivered": [],
        });
        assert_eq!(
            report.artifacts_of_note(),
            [
                "artifact /output/big was not delivered (artifact.too_large)",
                "artifact /output/log is exactly file_size_mb long: a write past it was \
                 refused, so it may be cut short",
            ]
        );
        assert_eq!(
            report.summary().as_deref(),
            Some(
                "ok: exit 0; artifacts: 2 rejected (artifact.too_large x1, \
                 artifact.undeclared x1), 1 possibly cut short by file_size_mb"
            )
        );
    }

    #[test]
    fn at_most_ten_artifact_lines_are_printed() {
        let mut report = finished(ResultClass::Ok, 0);
        let rejected: Vec<_> = (0..50)
            .map(|i| json!({ "path": format!("/output/{i}"), "reason": "artifact.symlink" }))
            .collect();
        report.artifacts = json!({ "kept": [], "rejected": rejected, "undelivered": [] });
        let lines = report.artifacts_of_note();
        assert_eq!(lines.len(), super::MAX_ARTIFACT_LINES);
        assert_eq!(
            lines.last().unwrap(),
            "41 more artifacts of note: see the result's artifacts"
        );
    }

    #[test]
    fn every_ceiling_serialises_as_its_name() {
        for ceiling in [
            Ceiling::Memory,
            Ceiling::Pids,
            Ceiling::Cpu,
            Ceiling::WallTime,
            Ceiling::OutputBytes,
            Ceiling::Disk,
            Ceiling::FileSize,
        ] {
            assert_eq!(
                serde_json::to_value(ceiling).unwrap(),
                json!(ceiling.as_str())
            );
        }
    }

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
