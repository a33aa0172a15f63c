//! The checks of `airlock verify` as data, and their verdicts as pure functions of what a
//! check observed: the run's result record, the probe's lines (verify/probe.py) and what
//! the host side saw (connections to its endpoint, its marker process, its socket, the
//! exported files, the store). Nothing here does I/O; verify/mod.rs gathers the
//! observations.

use airlock_cell::report::{Ceiling, ResultClass, RunReport};
use serde::Serialize;

/// Every check, in the order they run and are shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Check {
    UnmountedRead,
    WriteOutside,
    UnapprovedDomain,
    PrivateAddress,
    HostProcesses,
    RuntimeSocket,
    ProcessCeiling,
    MemoryCeiling,
    DiskCeiling,
    OutputCeiling,
    WallTimeCeiling,
    Residue,
    UndeclaredArtifact,
    CredentialRetained,
    BoundaryExercise,
    PermittedPath,
}

pub const ALL: [Check; 16] = [
    Check::UnmountedRead,
    Check::WriteOutside,
    Check::UnapprovedDomain,
    Check::PrivateAddress,
    Check::HostProcesses,
    Check::RuntimeSocket,
    Check::ProcessCeiling,
    Check::MemoryCeiling,
    Check::DiskCeiling,
    Check::OutputCeiling,
    Check::WallTimeCeiling,
    Check::Residue,
    Check::UndeclaredArtifact,
    Check::CredentialRetained,
    Check::BoundaryExercise,
    Check::PermittedPath,
];

impl Check {
    /// The stable name used in the table, the JSON, JUnit and the store.
    pub fn name(self) -> &'static str {
        match self {
            Check::UnmountedRead => "fs.unmounted_read",
            Check::WriteOutside => "fs.write_outside",
            Check::UnapprovedDomain => "egress.unapproved_domain",
            Check::PrivateAddress => "egress.private_address",
            Check::HostProcesses => "host.processes",
            Check::RuntimeSocket => "host.runtime_socket",
            Check::ProcessCeiling => "ceiling.processes",
            Check::MemoryCeiling => "ceiling.memory",
            Check::DiskCeiling => "ceiling.disk",
            Check::OutputCeiling => "ceiling.output",
            Check::WallTimeCeiling => "ceiling.wall_time",
            Check::Residue => "residue.fresh_run",
            Check::UndeclaredArtifact => "artifact.undeclared",
            Check::CredentialRetained => "credential.retained",
            Check::BoundaryExercise => "boundary.exercise",
            Check::PermittedPath => "permitted.smoke",
        }
    }

    /// The ceiling a ceiling check must see fire, with its class `capacity_exceeded`.
    pub fn ceiling(self) -> Option<Ceiling> {
        match self {
            Check::ProcessCeiling => Some(Ceiling::Pids),
            Check::MemoryCeiling => Some(Ceiling::Memory),
            Check::DiskCeiling => Some(Ceiling::Disk),
            Check::OutputCeiling => Some(Ceiling::OutputBytes),
            Check::WallTimeCeiling => Some(Ceiling::WallTime),
            Check::UnmountedRead
            | Check::WriteOutside
            | Check::UnapprovedDomain
            | Check::PrivateAddress
            | Check::HostProcesses
            | Check::RuntimeSocket
            | Check::Residue
            | Check::UndeclaredArtifact
            | Check::CredentialRetained
            | Check::BoundaryExercise
            | Check::PermittedPath => None,
        }
    }
}

/// The outcome of one check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// The control held: the attempt was refused and the host saw nothing of it.
    Pass,
    /// The control did not hold, or the check could not show that it did.
    Fail,
    /// The contract gives the check nothing to try (no writable path to fill, no smoke
    /// command): not a failure, and said so.
    NotApplicable,
}

impl Verdict {
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Pass => "pass",
            Verdict::Fail => "FAIL",
            Verdict::NotApplicable => "n/a",
        }
    }
}

/// One line the probe printed.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
pub struct ProbeLine {
    pub attempt: String,
    pub outcome: String,
    #[serde(default)]
    pub detail: String,
}

impl ProbeLine {
    pub fn reached(&self) -> bool {
        self.outcome == "reached"
    }
}

/// What the payload printed, read back: its attempts, and whether it ran to its end.
#[derive(Debug, Clone, Default)]
pub struct ProbeOutput {
    pub lines: Vec<ProbeLine>,
    pub done: bool,
}

impl ProbeOutput {
    pub fn parse(stdout: &str) -> ProbeOutput {
        let mut out = ProbeOutput::default();
        for line in stdout.lines() {
            if line == r#"{"probe": "done"}"# {
                out.done = true;
            } else if let Ok(parsed) = serde_json::from_str::<ProbeLine>(line) {
                out.lines.push(parsed);
            }
        }
        out
    }

    fn reached(&self) -> Vec<&ProbeLine> {
        self.lines.iter().filter(|l| l.reached()).collect()
    }

    /// `3 attempt(s) refused: read /x (Permission denied), ...`: for evidence, the
    /// distinct reasons of at most three attempts.
    fn summary(&self) -> String {
        let mut shown: Vec<String> = Vec::new();
        let mut reasons: Vec<&str> = Vec::new();
        for line in &self.lines {
            if shown.len() < 3 && !reasons.contains(&line.detail.as_str()) {
                reasons.push(&line.detail);
                shown.push(match line.detail.is_empty() {
                    true => line.attempt.clone(),
                    false => format!("{} ({})", line.attempt, line.detail),
                });
            }
        }
        let more = match self.lines.len() > shown.len() {
            true => ", ...",
            false => "",
        };
        format!(
            "{} attempt(s) refused: {}{more}",
            self.lines.len(),
            shown.join(", ")
        )
    }
}

/// What one check saw: its run (or runs) and the host side.
#[derive(Debug, Default)]
pub struct Observation {
    /// The run's result record; `None` when `airlock run` wrote none.
    pub report: Option<RunReport>,
    pub exit_code: i32,
    pub probe: ProbeOutput,
    /// Connections the fake internal endpoint accepted during the check.
    pub endpoint_connections: usize,
    /// Where a secret of the check (the marker's content, the credential's value) was
    /// found: `stdout`, `result file`, `store`, ...
    pub secret_found_in: Vec<String>,
    /// The marker process is still alive after the run.
    pub marker_alive: bool,
    /// Connections the fake container-runtime socket accepted.
    pub socket_accepts: usize,
    /// Files that reached the output directory.
    pub exported: Vec<String>,
    /// The run's record in the store: found, and how many of the probe's attempts its
    /// stored output holds.
    pub stored: Option<StoredRun>,
    /// Cells of the run still alive after it ended.
    pub cells_left: usize,
    /// Why the check has nothing to try; set by the planner from the contract alone.
    pub not_applicable: Option<String>,
    /// For a ceiling check: the declared value and the one the check ran with.
    pub ceiling_value: Option<String>,
}

#[derive(Debug, Default, Clone)]
pub struct StoredRun {
    pub status: String,
    pub attempts_recorded: usize,
    pub egress_denials: usize,
}

pub type Outcome = (Verdict, String);

fn fail(why: impl Into<String>) -> Outcome {
    (Verdict::Fail, why.into())
}

/// The verdict of `check` on what it observed.
pub fn verdict(check: Check, seen: &Observation) -> Outcome {
    if let Some(why) = &seen.not_applicable {
        return (Verdict::NotApplicable, why.clone());
    }
    if let Some(ceiling) = check.ceiling() {
        return ceiling_verdict(ceiling, seen);
    }
    match check {
        Check::PermittedPath => smoke_verdict(seen),
        Check::Residue => probe_verdict(seen, "the planted file is absent"),
        Check::UndeclaredArtifact => artifact_verdict(seen),
        Check::CredentialRetained => credential_verdict(seen),
        Check::BoundaryExercise => exercise_verdict(seen),
        Check::UnmountedRead => secret_verdict(seen, "marker content absent from every output"),
        Check::WriteOutside => probe_verdict(seen, "nothing written"),
        Check::UnapprovedDomain | Check::PrivateAddress => endpoint_verdict(seen),
        Check::HostProcesses => process_verdict(seen),
        Check::RuntimeSocket => socket_verdict(seen),
        Check::ProcessCeiling
        | Check::MemoryCeiling
        | Check::DiskCeiling
        | Check::OutputCeiling
        | Check::WallTimeCeiling => fail("a ceiling check without its ceiling"),
    }
}

/// The probe ran to its end and none of its attempts got through.
fn probe_verdict(seen: &Observation, held: &str) -> Outcome {
    if !seen.probe.done {
        return fail(format!(
            "the probe did not run to its end (exit {}{}): nothing was shown",
            seen.exit_code,
            why_not_run(seen)
        ));
    }
    let reached = seen.probe.reached();
    if !reached.is_empty() {
        let what: Vec<&str> = reached.iter().map(|l| l.attempt.as_str()).collect();
        return fail(format!("reached: {}", what.join("; ")));
    }
    (Verdict::Pass, format!("{}; {held}", seen.probe.summary()))
}

/// `, policy_denied: contract: ...`: why a run ended without its probe, when it says.
fn why_not_run(seen: &Observation) -> String {
    match &seen.report {
        Some(report) => match &report.error {
            Some(error) => format!(", {}: {error}", report.status.as_str()),
            None => format!(", {}", report.status.as_str()),
        },
        None => String::new(),
    }
}

fn secret_verdict(seen: &Observation, held: &str) -> Outcome {
    if !seen.secret_found_in.is_empty() {
        return fail(format!(
            "the marker's content was read: found in {}",
            seen.secret_found_in.join(", ")
        ));
    }
    probe_verdict(seen, held)
}

fn endpoint_verdict(seen: &Observation) -> Outcome {
    if seen.endpoint_connections > 0 {
        return fail(format!(
            "the endpoint saw {} connection(s)",
            seen.endpoint_connections
        ));
    }
    probe_verdict(seen, "endpoint saw 0 connections")
}

fn process_verdict(seen: &Observation) -> Outcome {
    if !seen.marker_alive {
        return fail("the marker process did not survive the run");
    }
    probe_verdict(seen, "marker process unseen and alive")
}

fn socket_verdict(seen: &Observation) -> Outcome {
    if seen.socket_accepts > 0 {
        return fail(format!(
            "the runtime socket accepted {} connection(s)",
            seen.socket_accepts
        ));
    }
    probe_verdict(seen, "socket accepted 0 connections")
}

fn artifact_verdict(seen: &Observation) -> Outcome {
    if !seen.exported.is_empty() {
        return fail(format!("exported: {}", seen.exported.join(", ")));
    }
    let written = seen.probe.reached().len();
    if !seen.probe.done || written == 0 {
        return fail("the undeclared file could not be written: nothing was shown");
    }
    (
        Verdict::Pass,
        format!("{written} undeclared file(s) written in the cell, none exported"),
    )
}

fn credential_verdict(seen: &Observation) -> Outcome {
    if !seen.secret_found_in.is_empty() {
        return fail(format!(
            "the credential's value is retained in {}",
            seen.secret_found_in.join(", ")
        ));
    }
    let injected = seen.probe.lines.iter().any(ProbeLine::reached);
    if !seen.probe.done || !injected {
        return fail("the credential did not reach the cell: nothing was shown");
    }
    (
        Verdict::Pass,
        "value printed by the payload; absent from result file, store record and store files"
            .to_string(),
    )
}

fn ceiling_verdict(ceiling: Ceiling, seen: &Observation) -> Outcome {
    let Some(report) = &seen.report else {
        return fail(format!("no result record (exit {})", seen.exit_code));
    };
    let fired = report.limit_fired.map_or("none", Ceiling::as_str);
    let class = report.status.as_str();
    // A refused fork kills nothing: the payload may handle it and end `ok`, with the
    // ceiling in `limits_hit` (docs/contract.md, `process_limit`).
    let hit = report.limit_fired == Some(ceiling) && report.status == ResultClass::CapacityExceeded
        || ceiling == Ceiling::Pids && report.limits_hit.contains(&ceiling);
    let value = (seen.ceiling_value.as_deref())
        .map(|v| format!(" ({v})"))
        .unwrap_or_default();
    if hit {
        (
            Verdict::Pass,
            format!("{} fired, class {class}{value}", ceiling.as_str()),
        )
    } else {
        fail(format!(
            "expected {} with class capacity_exceeded; got limit {fired}, class {class}, exit {}",
            ceiling.as_str(),
            seen.exit_code
        ))
    }
}

fn smoke_verdict(seen: &Observation) -> Outcome {
    match &seen.report {
        Some(report) if report.status == ResultClass::Ok && seen.exit_code == 0 => {
            (Verdict::Pass, "exit 0, class ok".to_string())
        }
        Some(report) => fail(format!(
            "exit {}, class {}",
            seen.exit_code,
            report.status.as_str()
        )),
        None => fail(format!("no result record (exit {})", seen.exit_code)),
    }
}

fn exercise_verdict(seen: &Observation) -> Outcome {
    let (verdict, evidence) = endpoint_verdict(seen);
    if verdict != Verdict::Pass {
        return (verdict, evidence);
    }
    if !seen.secret_found_in.is_empty() {
        return fail(format!(
            "the marker's content was read: found in {}",
            seen.secret_found_in.join(", ")
        ));
    }
    let Some(stored) = &seen.stored else {
        return fail("the run's record is not in the audit store");
    };
    if stored.attempts_recorded == 0 {
        return fail("the audit store's record of the run holds none of the denied attempts");
    }
    let cleanup_ok = seen.report.as_ref().is_some_and(|r| r.cleanup.ok);
    if !cleanup_ok || seen.cells_left > 0 {
        return fail(format!(
            "the cell was not destroyed: cleanup ok {cleanup_ok}, {} cell(s) left",
            seen.cells_left
        ));
    }
    (
        Verdict::Pass,
        format!(
            "marker unread, endpoint saw 0 connections; store has the run ({}) with {} denied \
             attempt(s) and {} egress denial(s); cell destroyed",
            stored.status, stored.attempts_recorded, stored.egress_denials
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn probe(lines: &[(&str, &str)]) -> ProbeOutput {
        ProbeOutput {
            lines: lines
                .iter()
                .map(|(attempt, outcome)| ProbeLine {
                    attempt: attempt.to_string(),
                    outcome: outcome.to_string(),
                    detail: String::new(),
                })
                .collect(),
            done: true,
        }
    }

    fn report(status: &str, limit: Option<&str>, hits: &[&str]) -> RunReport {
        let mut value =
            serde_json::to_value(RunReport::refused("r", ResultClass::Ok, String::new())).unwrap();
        value["status"] = serde_json::json!(status);
        value["limit_fired"] = serde_json::json!(limit);
        value["limits_hit"] = serde_json::json!(hits);
        value["cleanup"] = serde_json::json!({"ok": true, "leftovers": []});
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn every_check_has_a_distinct_name() {
        let mut names: Vec<&str> = ALL.iter().map(|c| c.name()).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), ALL.len());
    }

    #[test]
    fn a_probe_that_did_not_finish_never_passes() {
        let seen = Observation {
            probe: ProbeOutput::default(),
            ..Observation::default()
        };
        for check in [
            Check::UnmountedRead,
            Check::WriteOutside,
            Check::UnapprovedDomain,
            Check::HostProcesses,
            Check::RuntimeSocket,
            Check::Residue,
            Check::UndeclaredArtifact,
            Check::CredentialRetained,
        ] {
            let seen = Observation {
                marker_alive: true,
                ..Observation {
                    probe: seen.probe.clone(),
                    ..Observation::default()
                }
            };
            assert_eq!(verdict(check, &seen).0, Verdict::Fail, "{check:?}");
        }
    }

    #[test]
    fn an_attempt_that_got_through_fails_the_check() {
        let seen = Observation {
            probe: probe(&[("write /x", "refused"), ("write /y", "reached")]),
            ..Observation::default()
        };
        let (v, why) = verdict(Check::WriteOutside, &seen);
        assert_eq!(v, Verdict::Fail);
        assert!(why.contains("write /y"), "{why}");
    }

    #[test]
    fn host_side_evidence_fails_a_check_whatever_the_probe_says() {
        let refused = probe(&[("connect", "refused")]);
        let endpoint = Observation {
            probe: refused.clone(),
            endpoint_connections: 1,
            ..Observation::default()
        };
        assert_eq!(verdict(Check::PrivateAddress, &endpoint).0, Verdict::Fail);
        let socket = Observation {
            probe: refused.clone(),
            socket_accepts: 1,
            ..Observation::default()
        };
        assert_eq!(verdict(Check::RuntimeSocket, &socket).0, Verdict::Fail);
        let killed = Observation {
            probe: refused.clone(),
            marker_alive: false,
            ..Observation::default()
        };
        assert_eq!(verdict(Check::HostProcesses, &killed).0, Verdict::Fail);
        let read = Observation {
            probe: refused,
            secret_found_in: vec!["stdout".into()],
            ..Observation::default()
        };
        assert_eq!(verdict(Check::UnmountedRead, &read).0, Verdict::Fail);
    }

    #[test]
    fn a_ceiling_passes_only_when_it_fired_with_capacity_exceeded() {
        let fired = Observation {
            report: Some(report("capacity_exceeded", Some("memory"), &["memory"])),
            ..Observation::default()
        };
        assert_eq!(verdict(Check::MemoryCeiling, &fired).0, Verdict::Pass);
        assert_eq!(verdict(Check::DiskCeiling, &fired).0, Verdict::Fail);
        let survived = Observation {
            report: Some(report("ok", None, &[])),
            ..Observation::default()
        };
        for check in ALL.iter().filter(|c| c.ceiling().is_some()) {
            assert_eq!(verdict(*check, &survived).0, Verdict::Fail, "{check:?}");
        }
        let wrong_class = Observation {
            report: Some(report("task_error", Some("wall_time"), &["wall_time"])),
            ..Observation::default()
        };
        assert_eq!(
            verdict(Check::WallTimeCeiling, &wrong_class).0,
            Verdict::Fail
        );
    }

    #[test]
    fn a_refused_fork_the_payload_survived_is_the_process_ceiling() {
        let seen = Observation {
            report: Some(report("ok", None, &["pids"])),
            ..Observation::default()
        };
        assert_eq!(verdict(Check::ProcessCeiling, &seen).0, Verdict::Pass);
    }

    #[test]
    fn a_credential_never_injected_proves_nothing() {
        let seen = Observation {
            probe: probe(&[("print the injected credential", "refused")]),
            ..Observation::default()
        };
        assert_eq!(verdict(Check::CredentialRetained, &seen).0, Verdict::Fail);
    }

    #[test]
    fn the_exercise_needs_the_record_and_the_cell_gone() {
        let base = || Observation {
            probe: probe(&[("connect", "refused")]),
            report: Some(report("ok", None, &[])),
            stored: Some(StoredRun {
                status: "ok".into(),
                attempts_recorded: 3,
                egress_denials: 0,
            }),
            ..Observation::default()
        };
        assert_eq!(verdict(Check::BoundaryExercise, &base()).0, Verdict::Pass);
        let unrecorded = Observation {
            stored: None,
            ..base()
        };
        assert_eq!(
            verdict(Check::BoundaryExercise, &unrecorded).0,
            Verdict::Fail
        );
        let left = Observation {
            cells_left: 1,
            ..base()
        };
        assert_eq!(verdict(Check::BoundaryExercise, &left).0, Verdict::Fail);
    }

    #[test]
    fn not_applicable_is_said_and_not_a_failure() {
        let seen = Observation {
            not_applicable: Some("no writable path".into()),
            ..Observation::default()
        };
        assert_eq!(verdict(Check::DiskCeiling, &seen).0, Verdict::NotApplicable);
    }
}
