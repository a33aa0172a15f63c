//! The result of one run: exactly one class, derived from real signals (exit status, the
//! cgroup counters, the deadline timer, the output counter, tmpfs free space, seccomp
//! kills), never from the payload's output.

use crate::artifacts::{ArtifactKept, ArtifactReport};
use crate::counters::CgroupUsage;
use crate::output::OutputCapture;
use serde::{Deserialize, Deserializer, Serialize};
use std::collections::BTreeMap;
use std::net::SocketAddr;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
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
    /// The audit store cannot be reached (a fleet's Postgres is down, the local file
    /// reports I/O errors): the run was refused before anything ran, since no run starts
    /// without its begin record. Not an attack and not airlock failing: retry later.
    StoreUnavailable,
}

/// The exit code of `airlock run` for [`ResultClass::DeliveryFailed`]: below the 124-127
/// that `timeout` and `docker run` use, and not a code those tools give.
pub const DELIVERY_FAILED_EXIT: i32 = 123;

/// The exit code of `airlock run` (and `airlock audit verify`) for
/// [`ResultClass::StoreUnavailable`]: next below [`DELIVERY_FAILED_EXIT`], so a script can
/// tell "retry later" from 125 (airlock refused or failed).
pub const STORE_UNAVAILABLE_EXIT: i32 = 122;

impl ResultClass {
    pub const ALL: [ResultClass; 9] = [
        ResultClass::Ok,
        ResultClass::TaskError,
        ResultClass::PolicyDenied,
        ResultClass::CapacityExceeded,
        ResultClass::RuntimeFault,
        ResultClass::SandboxUnavailable,
        ResultClass::SuspectedEscape,
        ResultClass::DeliveryFailed,
        ResultClass::StoreUnavailable,
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
            ResultClass::StoreUnavailable => "store_unavailable",
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
            | ResultClass::SuspectedEscape
            | ResultClass::StoreUnavailable => None,
        }
    }
}

/// A ceiling of the contract. `limit_fired` names the one that decided the run's class
/// (it killed something, or the payload failed after hitting it); `limits_hit` every one
/// the run reached, fatal or not.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
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

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExitInfo {
    pub code: Option<i32>,
    pub signal: Option<i32>,
}

#[derive(Debug, Default, Clone, Copy, Serialize, Deserialize)]
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

#[derive(Debug, Default, Clone, Copy, Serialize, Deserialize)]
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

#[derive(Debug, Default, Clone, Serialize, Deserialize)]
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

/// A name from one of the report's fixed vocabularies (a reason code, a mode). An
/// alias, so that serde does not take the field for data borrowed from its input.
pub type Name = &'static str;

/// One of `known`, by name: the report's fixed vocabularies (reason codes, modes) are
/// `&'static str` on the side that produces them, and a report read back from another
/// process holds only names that side could have produced.
pub(crate) fn known_name<'de, D: Deserializer<'de>>(
    deserializer: D,
    known: &[&'static str],
) -> Result<&'static str, D::Error> {
    let name = String::deserialize(deserializer)?;
    known
        .iter()
        .find(|k| **k == name)
        .copied()
        .ok_or_else(|| serde::de::Error::custom(format!("unknown name {name:?}")))
}

fn cgroup_version<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Name>, D::Error> {
    match Option::<String>::deserialize(d)? {
        None => Ok(None),
        Some(v) => known_name(serde_json::Value::String(v), &["v1", "v2"])
            .map(Some)
            .map_err(serde::de::Error::custom),
    }
}

/// What the proxy decided about one connection attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EgressDecision {
    Allowed,
    Denied,
}

/// One connection attempt through the egress proxy, as the result records it. The cell
/// does not know the proxy (the crates' direction is contract <- cell, egress <- airlock):
/// the caller's [`crate::EgressSession`] turns its proxy's records into these.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EgressRecord {
    /// `http`, `connect`, `socks5`, `transparent` or `dns`.
    pub protocol: String,
    /// Requested host, as the proxy normalised it (the cell's bytes: escape to print).
    pub host: String,
    pub port: u16,
    /// The address actually connected to (or the offending one).
    pub address: Option<SocketAddr>,
    pub decision: EgressDecision,
    /// A reason code (`egress.*`): why it was denied or cut short.
    pub reason: Option<String>,
    pub bytes_up: u64,
    pub bytes_down: u64,
    pub duration_ms: u64,
    pub started_at_unix_ms: u64,
}

/// One request to the run's broker, as the result records it (the engine turns the
/// broker's records into these, as it does the proxy's; docs/credentials.md).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BrokerActionRecord {
    /// The action the request named (the cell's bytes: escape to print).
    pub action: String,
    /// sha256 of the canonical JSON of the request.
    pub request_sha256: String,
    pub request_bytes: u64,
    /// `granted` or `denied`.
    pub decision: String,
    /// Why it was denied (`broker.*`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// A granted request's handler: its exit code (a command's), the bytes it wrote (or
    /// read back), where it stored the file, and why it failed (`broker.*`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    #[serde(default)]
    pub bytes: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stored_as: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    pub duration_ms: u64,
    pub started_at_unix_ms: u64,
}

/// `text` cut to [`MAX_HOST_CHARS`] characters.
fn shortened(text: &str) -> String {
    match text.char_indices().nth(MAX_HOST_CHARS) {
        Some((at, _)) => format!("{}...", &text[..at]),
        None => text.to_string(),
    }
}

/// Everything `airlock run` reports about one run. It crosses a process boundary (a
/// serving cell's supervisor sends it to the engine), so it reads back what it writes.
#[derive(Debug, Clone, Serialize, Deserialize)]
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
    #[serde(deserialize_with = "cgroup_version")]
    pub cgroup_version: Option<Name>,
    /// One record per connection attempt; `None` for a cell without egress.
    pub egress: Option<Vec<EgressRecord>>,
    /// One record per request to the run's broker (empty without one).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub broker: Vec<BrokerActionRecord>,
    /// `None` when no artifacts were asked for or the plan declares none.
    pub artifacts: Option<ArtifactReport>,
    pub cleanup: CleanupReport,
    /// Cgroups of dead supervisors' cells that this run's start could not remove.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stale_cgroups_left: Vec<String>,
    /// What the payload got on stdin: set by the supervisor when it relayed a pipe, by
    /// the caller otherwise (it knows what it passed).
    pub stdin: Option<crate::stdin_relay::StdinRecord>,
    /// What the cell got differently from its plan without weakening a control (a
    /// read-only input on a filesystem without idmapped mounts keeps its host owners).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
    /// The container this run was, when the OCI runtime interface (`airlock-runc`) ran
    /// it: its id and, under Kubernetes, the pod's namespace, name and container name.
    /// Set by the caller (it knows the bundle); `None` for every other run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container: Option<airlock_oci::bundle::ContainerIdentity>,
    /// The signal (SIGINT, SIGTERM, SIGHUP) sent to a one-shot `airlock run` while its
    /// payload ran: the cell was destroyed and recorded, and the caller then ends the
    /// process as the signal would have ([`crate::die_of_signal`]). Not recorded: the
    /// record's error names the signal.
    #[serde(skip)]
    pub interrupted_by: Option<i32>,
    /// The host uid and gid the cell ran as (its own while it lived, as root; see
    /// host_identity.rs); `None` when no cell was started.
    pub host_identity: Option<crate::host_identity::HostIdentity>,
    /// Set when the ceilings were enforced by rlimits only, without a cgroup (the
    /// operator's class allowed it; `cgroup_version` is then `None`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rlimits_only: Option<RlimitsOnlyRecord>,
}

/// A run without a cgroup, against the threat statement (docs/threat-model.md): what the
/// contract requested, which class allowed less, what enforced each ceiling and what was
/// not enforced.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RlimitsOnlyRecord {
    /// The refusal a run without the class's permission gets (`cgroups.delegation: ...`).
    pub why: String,
    pub requested: RequestedCeilings,
    /// The class, the rlimits that enforced the ceilings and what they leave out.
    #[serde(flatten)]
    pub granted: airlock_contract::RlimitsOnly,
}

/// The contract's ceilings that a cgroup enforces, as requested.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct RequestedCeilings {
    pub memory_bytes: u64,
    pub process_limit: u32,
    pub cpu_millis: u32,
    pub wall_time_ms: u64,
}

impl RequestedCeilings {
    pub fn of(limits: &airlock_contract::Limits) -> RequestedCeilings {
        RequestedCeilings {
            memory_bytes: limits.memory_bytes,
            process_limit: limits.process_limit,
            cpu_millis: limits.cpu_millis,
            wall_time_ms: limits.wall_time_ms,
        }
    }
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
            egress: None,
            broker: Vec::new(),
            artifacts: None,
            cleanup: CleanupReport {
                ok: true,
                leftovers: Vec::new(),
            },
            stdin: None,
            stale_cgroups_left: Vec::new(),
            notes: Vec::new(),
            container: None,
            host_identity: None,
            rlimits_only: None,
            interrupted_by: None,
        }
    }

    /// One line per artifact the host side could not write (`artifacts.undelivered`),
    /// with the path as the collector escaped it: safe to print on a terminal.
    pub fn undelivered_artifacts(&self) -> Vec<String> {
        self.artifacts
            .iter()
            .flat_map(|a| &a.undelivered)
            .map(|a| {
                format!(
                    "artifact {} not delivered ({}): {}",
                    a.path, a.reason, a.error
                )
            })
            .collect()
    }

    /// One line per declared artifact that policy kept in the cell (too large, a
    /// symlink, a hard link, ...), and one per artifact that may be cut short by
    /// `file_size_mb`; undeclared files are only counted in [`RunReport::summary`]. Paths
    /// are as the collector escaped them; at most [`MAX_ARTIFACT_LINES`] lines.
    pub fn artifacts_of_note(&self) -> Vec<String> {
        let artifacts = self.artifacts.iter();
        let rejected = artifacts
            .clone()
            .flat_map(|a| &a.rejected)
            .filter(|a| a.reason != crate::artifacts::reason::UNDECLARED)
            .map(|a| format!("artifact {} was not delivered ({})", a.path, a.reason));
        let truncated = self.kept_artifacts().filter(|a| a.truncated).map(|a| {
            let path = &a.path;
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
        parts.extend(self.broker_summary());
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

    /// Brokered requests: how many were granted, and the refusals by reason code.
    fn broker_summary(&self) -> Option<String> {
        if self.broker.is_empty() {
            return None;
        }
        let granted = self
            .broker
            .iter()
            .filter(|r| r.decision == "granted")
            .count();
        let mut refused: BTreeMap<&str, usize> = BTreeMap::new();
        for reason in self.broker.iter().filter_map(|r| r.reason.as_deref()) {
            *refused.entry(reason).or_default() += 1;
        }
        let mut text = format!("broker: {granted} granted");
        if !refused.is_empty() {
            let reasons: Vec<String> = refused
                .iter()
                .map(|(reason, n)| format!("{reason} x{n}"))
                .collect();
            text.push_str(&format!(
                ", {} denied ({})",
                self.broker.len() - granted,
                reasons.join(", ")
            ));
        }
        Some(text)
    }

    fn egress_summary(&self) -> Option<String> {
        let denied: Vec<&EgressRecord> = self
            .egress
            .iter()
            .flatten()
            .filter(|r| r.decision == EgressDecision::Denied)
            .collect();
        if denied.is_empty() {
            return None;
        }
        // (reason, attempts, distinct hosts in order of first attempt)
        let mut reasons: Vec<(String, usize, Vec<String>)> = Vec::new();
        for record in &denied {
            let reason = record.reason.clone().unwrap_or_default();
            // The name the payload asked for: anything, a terminal escape included.
            let host = shortened(&crate::host_files::escaped(record.host.as_bytes()));
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
        for artifact in self.artifacts.iter().flat_map(|a| &a.rejected) {
            let reason = artifact.reason.to_string();
            match rejected.iter_mut().find(|(r, _)| *r == reason) {
                Some(entry) => entry.1 += 1,
                None => rejected.push((reason, 1)),
            }
        }
        let truncated = self.kept_artifacts().filter(|a| a.truncated).count();
        let undelivered = self.artifacts.iter().flat_map(|a| &a.undelivered).count();
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

    fn kept_artifacts(&self) -> impl Iterator<Item = &ArtifactKept> {
        self.artifacts.iter().flat_map(|a| &a.kept)
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
    use super::{
        BrokerActionRecord, Ceiling, EgressDecision, EgressRecord, ResultClass, RunReport,
    };
    use crate::artifacts::{reason, ArtifactKept, ArtifactRejection, ArtifactReport};
    use serde_json::json;

    fn attempt(decision: EgressDecision, host: &str, reason: Option<&str>) -> EgressRecord {
        EgressRecord {
            protocol: "connect".into(),
            host: host.into(),
            port: 443,
            address: None,
            decision,
            reason: reason.map(str::to_string),
            bytes_up: 0,
            bytes_down: 0,
            duration_ms: 1,
            started_at_unix_ms: 1,
        }
    }

    fn kept(path: &str, truncated: bool) -> ArtifactKept {
        ArtifactKept {
            path: path.into(),
            size_bytes: 1,
            sha256: String::new(),
            stored_at: String::new(),
            truncated,
            executable: false,
        }
    }

    fn rejected(path: &str, reason: &'static str) -> ArtifactRejection {
        ArtifactRejection {
            path: path.into(),
            reason,
        }
    }

    fn finished(status: ResultClass, exit_code: i32) -> RunReport {
        let mut report = RunReport::refused("r", status, String::new());
        report.error = None;
        report.exit_code = exit_code;
        report
    }

    #[test]
    fn a_run_with_nothing_to_say_has_no_summary() {
        let mut report = finished(ResultClass::Ok, 0);
        report.egress = Some(vec![attempt(EgressDecision::Allowed, "api.test", None)]);
        report.artifacts = Some(ArtifactReport {
            kept: vec![kept("/output/a", false)],
            ..ArtifactReport::default()
        });
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
    fn brokered_requests_are_counted_granted_and_denied_by_reason() {
        let mut report = finished(ResultClass::Ok, 0);
        let record = |decision: &str, reason: Option<&str>| BrokerActionRecord {
            action: "store_case_document".to_string(),
            request_sha256: String::new(),
            request_bytes: 10,
            decision: decision.to_string(),
            reason: reason.map(str::to_string),
            exit_code: None,
            bytes: 0,
            stored_as: None,
            error: None,
            duration_ms: 0,
            started_at_unix_ms: 0,
        };
        report.broker = vec![
            record("granted", None),
            record("denied", Some("broker.schema_invalid")),
            record("denied", Some("broker.schema_invalid")),
            record("denied", Some("broker.unknown_action")),
        ];
        assert_eq!(
            report.summary().as_deref(),
            Some(
                "ok: exit 0; broker: 1 granted, 3 denied (broker.schema_invalid x2, \
                 broker.unknown_action x1)"
            )
        );
    }

    #[test]
    fn egress_denials_are_counted_by_reason_with_their_hosts_escaped() {
        let mut report = finished(ResultClass::Ok, 0);
        let denied = |host: &str, reason: &str| attempt(EgressDecision::Denied, host, Some(reason));
        report.egress = Some(vec![
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
        report.artifacts = Some(ArtifactReport {
            kept: vec![kept("/output/log", true)],
            rejected: vec![
                rejected("/output/big", reason::TOO_LARGE),
                rejected("/output/tmp", reason::UNDECLARED),
            ],
            undelivered: Vec::new(),
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
            .map(|i| rejected(&format!("/output/{i}"), reason::SYMLINK))
            .collect();
        report.artifacts = Some(ArtifactReport {
            rejected,
            ..ArtifactReport::default()
        });
        let lines = report.artifacts_of_note();
        assert_eq!(lines.len(), super::MAX_ARTIFACT_LINES);
        assert_eq!(
            lines.last().unwrap(),
            "41 more artifacts of note: see the result's artifacts"
        );
    }

    #[test]
    fn a_report_reads_back_what_it_writes() {
        let mut report = finished(ResultClass::CapacityExceeded, 137);
        report.limit_fired = Some(Ceiling::Memory);
        report.limits_hit = vec![Ceiling::Memory, Ceiling::Shm];
        report.cgroup_version = Some("v1");
        report.egress = Some(vec![attempt(
            EgressDecision::Denied,
            "evil.test",
            Some("egress.not_allowlisted"),
        )]);
        report.artifacts = Some(ArtifactReport {
            kept: vec![kept("/output/a", true)],
            rejected: vec![rejected("/output/l", reason::SYMLINK)],
            undelivered: Vec::new(),
        });
        report.stdin = Some(crate::stdin_relay::StdinRecord::none());
        report.output = Some(crate::output::OutputCapture::new(10));
        let text = serde_json::to_string(&report).unwrap();
        let back: RunReport = serde_json::from_str(&text).unwrap();
        assert_eq!(serde_json::to_string(&back).unwrap(), text);
    }

    #[test]
    fn a_report_with_a_name_outside_its_vocabulary_is_refused() {
        let mut report = serde_json::to_value(finished(ResultClass::Ok, 0)).unwrap();
        report["cgroup_version"] = json!("v3");
        assert!(serde_json::from_value::<RunReport>(report).is_err());
        let artifacts = json!({ "kept": [], "undelivered": [],
            "rejected": [{ "path": "/output/x", "reason": "artifact.made_up" }] });
        assert!(serde_json::from_value::<ArtifactReport>(artifacts).is_err());
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
