//! Classification: the one class of a command's run, the ceiling that decided it and the
//! exit code, from what the supervisor observed (exit status, the cgroup's counters, the
//! deadline, the output counter, full mounts, egress denials), never from the output.

use super::EgressSummary;
use crate::artifacts::{self, ArtifactReport};
use crate::output::OutputCapture;
use crate::protocol::{ExecFailure, LaunchFailure, PayloadEnded};
use crate::report::{Ceiling, CleanupReport, ExitInfo, ResultClass, RunReport, Timings, Usage};
use crate::stdin_relay::StdinRecord;
use std::time::Instant;

/// What happened while the cell ran.
#[derive(Default)]
pub struct Observed {
    pub exec_done_at: Option<Instant>,
    pub exec_failure: Option<ExecFailure>,
    pub launch_failure: Option<LaunchFailure>,
    pub ended: Option<PayloadEnded>,
    pub deadline_fired: bool,
    pub pid1_status: Option<i32>,
    pub rusage: Option<libc::rusage>,
    pub egress_error: Option<String>,
    pub artifacts: Option<ArtifactReport>,
    /// The output mounts, held from the payload's start until the artifacts are
    /// collected (see [`artifacts::OutputMounts`]).
    pub output_mounts: artifacts::OutputMounts,
    /// Every writable path, held from the payload's start when a suspected escape's
    /// evidence is wanted (see [`crate::evidence`]).
    pub writable_mounts: crate::evidence::WritableMounts,
    /// A command of this session was a suspected escape (its own report says which):
    /// the session's verdict is one too, so its writable paths are kept.
    pub command_escaped: bool,
    pub run_id: String,
    pub released_ms: f64,
    pub ended_at: Option<Instant>,
    /// What was relayed on stdin, when it was.
    pub stdin: Option<StdinRecord>,
    /// See [`RunReport::notes`].
    pub notes: Vec<String>,
    /// Size of the cell's `/dev/shm` (see [`shm_exhausted`]).
    pub shm_bytes: u64,
    /// Why the supervisor destroyed the cell before its command ended on its own (a
    /// serving cell's engine closed it or went away).
    pub destroyed: Option<String>,
    /// The signal sent to `airlock run` that destroyed the cell (see
    /// [`RunReport::interrupted_by`]).
    pub interrupted_by: Option<i32>,
}

/// Picks the one class of the run from what was observed.
pub fn classify(
    started: Instant,
    observed: Observed,
    output: OutputCapture,
    counters: crate::cgroup::CgroupUsage,
    egress: Option<EgressSummary>,
) -> RunReport {
    let usage = Usage::from_parts(observed.rusage.as_ref(), counters);
    let startup_ms = observed
        .exec_done_at
        .filter(|_| observed.launch_failure.is_none() && observed.exec_failure.is_none())
        .map_or(0.0, |t| (t - started).as_secs_f64() * 1000.0);
    let records = egress.as_ref().map(|e| e.records.clone());
    let egress = egress.unwrap_or_default();
    let exit = payload_exit(&observed);
    let limits_hit = limits_hit(&observed, &output, &usage, exit);
    let verdict = verdict(&observed, &egress, &usage, exit, &limits_hit);
    let mut notes = observed.notes.clone();
    if verdict.limit == Some(Ceiling::Shm) && !shm_seen_full(&observed) {
        notes.push(format!(
            "the shm ceiling is inferred: the payload was killed by SIGBUS with {} MiB of \
             memory at its peak, at least the size of /dev/shm, which was no longer full when \
             the payload had ended",
            usage.memory_peak_bytes >> 20
        ));
    }
    RunReport {
        run_id: observed.run_id.clone(),
        status: verdict.status,
        exit,
        limit_fired: verdict.limit,
        limits_hit,
        error: verdict.error,
        exit_code: verdict.exit_code,
        timings: Timings {
            released_ms: observed.released_ms,
            startup_ms,
            ended_ms: observed
                .ended_at
                .map_or(0.0, |t| (t - started).as_secs_f64() * 1000.0),
            ..Timings::default()
        },
        usage,
        output: Some(output),
        cgroup_version: None,
        egress: records,
        broker: Vec::new(),
        artifacts: observed.artifacts,
        cleanup: CleanupReport::default(),
        stale_cgroups_left: Vec::new(),
        stdin: observed.stdin,
        notes,
        container: None,
        host_identity: None,
        rlimits_only: None,
        interrupted_by: observed.interrupted_by,
    }
}

/// How the payload ended: its status as pid 1 reported it or, when the whole cell was
/// killed (deadline, a memory kill that took pid 1 too) and pid 1 could not report, the
/// signal that killed pid 1, which took the payload with it.
pub fn payload_exit(observed: &Observed) -> ExitInfo {
    let reported = observed.ended.as_ref().map(|e| e.wait_status);
    let pid1_killed = observed.pid1_status.filter(|s| libc::WIFSIGNALED(*s));
    match reported.or(pid1_killed) {
        Some(s) if libc::WIFEXITED(s) => ExitInfo {
            code: Some(libc::WEXITSTATUS(s)),
            signal: None,
        },
        Some(s) if libc::WIFSIGNALED(s) => ExitInfo {
            code: None,
            signal: Some(libc::WTERMSIG(s)),
        },
        _ => ExitInfo::default(),
    }
}

/// The code `airlock run` returns for a payload that ended this way: its own, or 128 plus
/// the signal that killed it (137 when nothing is known: the cell was killed).
pub fn payload_code(exit: ExitInfo) -> i32 {
    exit.code
        .unwrap_or_else(|| exit.signal.map_or(137, |s| 128 + s))
}

/// Every ceiling the run reached, fatal or not: the deadline timer, the cgroup's oom kill
/// and pids refusal counters, the output counter, writable mounts left without space,
/// and `file_size_mb` (the payload killed by SIGXFSZ, or an artifact exactly at the
/// limit, which is where the kernel cuts a write short).
pub fn limits_hit(
    observed: &Observed,
    output: &OutputCapture,
    usage: &Usage,
    exit: ExitInfo,
) -> Vec<Ceiling> {
    let disk_full = observed
        .ended
        .as_ref()
        .is_some_and(|e| !e.full_mounts.is_empty());
    let artifact_cut = observed
        .artifacts
        .as_ref()
        .is_some_and(|a| a.kept.iter().any(|k| k.truncated));
    // Seen full by pid 1, or inferred from a SIGBUS death (see shm_exhausted); a full
    // writable path explains a SIGBUS first.
    let shm =
        shm_seen_full(observed) || (!disk_full && shm_exhausted(&exit, usage, observed.shm_bytes));
    [
        (Ceiling::WallTime, observed.deadline_fired),
        (Ceiling::Memory, usage.oom_kills > 0),
        (Ceiling::Pids, usage.pids_limit_hits > 0),
        (Ceiling::Shm, shm),
        (Ceiling::Disk, disk_full),
        (
            Ceiling::FileSize,
            exit.signal == Some(libc::SIGXFSZ) || artifact_cut,
        ),
        (Ceiling::Cpu, exit.signal == Some(libc::SIGXCPU)),
        (Ceiling::OutputBytes, output.truncated),
    ]
    .into_iter()
    .filter_map(|(ceiling, hit)| hit.then_some(ceiling))
    .collect()
}

/// The class of a run, the ceiling that decided it and the code `airlock run` returns.
pub struct Verdict {
    pub status: ResultClass,
    pub limit: Option<Ceiling>,
    pub exit_code: i32,
    pub error: Option<String>,
}

impl Verdict {
    fn new(status: ResultClass, limit: Option<Ceiling>, exit_code: i32) -> Verdict {
        Verdict {
            status,
            limit,
            exit_code,
            error: None,
        }
    }

    fn because(mut self, error: impl Into<String>) -> Verdict {
        self.error = Some(error.into());
        self
    }
}

/// Order matters: what airlock itself saw fail or refused comes first, then what killed
/// the payload from outside (the deadline, the memory ceiling), then how the payload
/// ended on its own.
pub fn verdict(
    observed: &Observed,
    egress: &EgressSummary,
    usage: &Usage,
    exit: ExitInfo,
    hits: &[Ceiling],
) -> Verdict {
    let code = payload_code(exit);
    if let Some(failure) = &observed.launch_failure {
        let class = if failure.unavailable {
            ResultClass::SandboxUnavailable
        } else {
            ResultClass::RuntimeFault
        };
        let error = format!(
            "cell setup failed at {}: {}",
            failure.stage, failure.message
        );
        return Verdict::new(class, None, 125).because(error);
    }
    if let Some(err) = &observed.egress_error {
        let error = format!("egress proxy could not start: {err}");
        return Verdict::new(ResultClass::RuntimeFault, None, 125).because(error);
    }
    if observed.command_escaped {
        let error = "a command of the session was a suspected escape".to_string();
        return Verdict::new(ResultClass::SuspectedEscape, None, code).because(error);
    }
    if egress.metadata_probes > 0 {
        let error = format!(
            "{} connection attempt(s) to a cloud metadata endpoint",
            egress.metadata_probes
        );
        return Verdict::new(ResultClass::SuspectedEscape, None, code).because(error);
    }
    if observed.deadline_fired {
        return Verdict::new(ResultClass::CapacityExceeded, Some(Ceiling::WallTime), 124);
    }
    if usage.oom_kills > 0 {
        // The kernel killed a process of the cell: the payload itself (its code is then
        // 137, also when the whole cell went and nobody could report) or one of its
        // children, after which the payload's own code stands.
        return Verdict::new(ResultClass::CapacityExceeded, Some(Ceiling::Memory), code);
    }
    if let Some(failure) = &observed.exec_failure {
        return Verdict::new(ResultClass::TaskError, None, failure.status)
            .because(failure.describe());
    }
    if exit.signal == Some(libc::SIGSYS) {
        // Only a foreign-architecture or x32 system call is killed by the filter.
        return Verdict::new(ResultClass::SuspectedEscape, None, code)
            .because("the payload was killed by seccomp for a system call of a foreign ABI");
    }
    if let Some(why) = &observed.destroyed {
        return Verdict::new(ResultClass::RuntimeFault, None, 125).because(format!(
            "the cell was destroyed before its command ended: {why}"
        ));
    }
    if observed.ended.is_none() {
        return Verdict::new(ResultClass::RuntimeFault, None, 125)
            .because("the cell ended without reporting the payload's status");
    }
    payload_verdict(egress, exit, hits)
}

/// The class of a payload that ended on its own. A ceiling it hit decides the class only
/// if the payload then failed (or the ceiling's signal killed it): a payload that caught
/// a refused fork or write and exited 0 is `ok`, with the hit in `limits_hit`. Nothing
/// was killed by airlock, so the code is the payload's own.
pub fn payload_verdict(egress: &EgressSummary, exit: ExitInfo, hits: &[Ceiling]) -> Verdict {
    let code = payload_code(exit);
    if exit.signal == Some(libc::SIGXFSZ) {
        return Verdict::new(ResultClass::CapacityExceeded, Some(Ceiling::FileSize), code);
    }
    if exit.signal == Some(libc::SIGXCPU) {
        // RLIMIT_CPU, set only for a run with rlimits only (RlimitsOnly in the plan).
        return Verdict::new(ResultClass::CapacityExceeded, Some(Ceiling::Cpu), code);
    }
    let failed_at = [
        Ceiling::Pids,
        Ceiling::Shm,
        Ceiling::Disk,
        Ceiling::FileSize,
    ]
    .into_iter()
    .find(|c| code != 0 && hits.contains(c));
    if let Some(ceiling) = failed_at {
        return Verdict::new(ResultClass::CapacityExceeded, Some(ceiling), code);
    }
    if hits.contains(&Ceiling::OutputBytes) {
        // The caller did not get all of the output: a result state whatever the exit.
        return Verdict::new(
            ResultClass::CapacityExceeded,
            Some(Ceiling::OutputBytes),
            code,
        );
    }
    match code {
        0 => Verdict::new(ResultClass::Ok, None, 0),
        _ if egress.denials > 0 => Verdict::new(ResultClass::PolicyDenied, None, code),
        _ => Verdict::new(ResultClass::TaskError, None, code),
    }
}

/// Whether a SIGBUS death is `/dev/shm` running out although it was not full when pid 1
/// looked: SIGBUS means a page of a mapping could not be backed, which in a cell is a full
/// tmpfs (a full writable path is caught before, as `disk`) or a file truncated under
/// its mapping. A helper of the payload may empty `/dev/shm` the moment the payload dies
/// (Python's resource tracker unlinks the segments it registered, and it learns of the
/// death before pid 1 does), so the evidence left is the cell's memory peak: tmpfs pages
/// are the cell's memory, and a peak below `/dev/shm`'s size means it never filled.
pub fn shm_exhausted(exit: &ExitInfo, usage: &Usage, shm_bytes: u64) -> bool {
    exit.signal == Some(libc::SIGBUS) && shm_bytes > 0 && usage.memory_peak_bytes >= shm_bytes
}

/// Pid 1 found `/dev/shm` full when the payload ended.
pub fn shm_seen_full(observed: &Observed) -> bool {
    observed.ended.as_ref().is_some_and(|e| e.shm_full)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exited(code: i32) -> Option<PayloadEnded> {
        Some(PayloadEnded {
            wait_status: code << 8,
            full_mounts: Vec::new(),
            shm_full: false,
        })
    }

    fn killed_by(signal: i32) -> Option<PayloadEnded> {
        Some(PayloadEnded {
            wait_status: signal,
            full_mounts: Vec::new(),
            shm_full: false,
        })
    }

    /// One row of the table: what was observed, and the class, ceiling and code expected.
    struct Case {
        name: &'static str,
        observed: Observed,
        usage: Usage,
        output_truncated: bool,
        egress: EgressSummary,
        expected: (ResultClass, Option<Ceiling>, i32),
    }

    fn case(name: &'static str, expected: (ResultClass, Option<Ceiling>, i32)) -> Case {
        Case {
            name,
            observed: Observed {
                ended: exited(0),
                ..Observed::default()
            },
            usage: Usage::default(),
            output_truncated: false,
            egress: EgressSummary::default(),
            expected,
        }
    }

    impl Case {
        fn ended(mut self, ended: Option<PayloadEnded>) -> Case {
            self.observed.ended = ended;
            self
        }
        fn observed(mut self, change: impl FnOnce(&mut Observed)) -> Case {
            change(&mut self.observed);
            self
        }
        fn usage(mut self, change: impl FnOnce(&mut Usage)) -> Case {
            change(&mut self.usage);
            self
        }
        fn denials(mut self, denials: usize, metadata_probes: usize) -> Case {
            self.egress.denials = denials;
            self.egress.metadata_probes = metadata_probes;
            self
        }
        fn truncated(mut self) -> Case {
            self.output_truncated = true;
            self
        }

        fn decide(self) -> (Verdict, Vec<Ceiling>) {
            let mut output = OutputCapture::new(1024);
            output.truncated = self.output_truncated;
            let exit = payload_exit(&self.observed);
            let hits = limits_hit(&self.observed, &output, &self.usage, exit);
            let verdict = verdict(&self.observed, &self.egress, &self.usage, exit, &hits);
            (verdict, hits)
        }
    }

    fn launch_failure(unavailable: bool) -> LaunchFailure {
        LaunchFailure {
            stage: "seccomp".into(),
            message: "EINVAL".into(),
            unavailable,
        }
    }

    fn exec_failure(status: i32) -> ExecFailure {
        ExecFailure {
            status,
            path: "/work/x".into(),
            reason: "Permission denied".into(),
        }
    }

    fn table() -> Vec<Case> {
        use Ceiling as C;
        use ResultClass as R;
        vec![
            case("exit 0", (R::Ok, None, 0)),
            case("exit non-zero", (R::TaskError, None, 3)).ended(exited(3)),
            case(
                "exit non-zero after egress denials",
                (R::PolicyDenied, None, 3),
            )
            .ended(exited(3))
            .denials(2, 0),
            case("exit 0 after egress denials", (R::Ok, None, 0)).denials(2, 0),
            case("metadata probe", (R::SuspectedEscape, None, 0)).denials(1, 1),
            case(
                "killed by seccomp (SIGSYS)",
                (R::SuspectedEscape, None, 128 + 31),
            )
            .ended(killed_by(libc::SIGSYS)),
            case(
                "SIGXFSZ",
                (R::CapacityExceeded, Some(C::FileSize), 128 + 25),
            )
            .ended(killed_by(libc::SIGXFSZ)),
            case(
                "SIGXCPU (RLIMIT_CPU, rlimits only)",
                (R::CapacityExceeded, Some(C::Cpu), 128 + 24),
            )
            .ended(killed_by(libc::SIGXCPU)),
            case(
                "SIGBUS, shm seen full",
                (R::CapacityExceeded, Some(C::Shm), 128 + 7),
            )
            .ended(Some(PayloadEnded {
                wait_status: libc::SIGBUS,
                full_mounts: Vec::new(),
                shm_full: true,
            })),
            case(
                "SIGBUS, shm inferred",
                (R::CapacityExceeded, Some(C::Shm), 128 + 7),
            )
            .ended(killed_by(libc::SIGBUS))
            .observed(|o| o.shm_bytes = 64 << 20)
            .usage(|u| u.memory_peak_bytes = 65 << 20),
            case("SIGBUS below shm's size", (R::TaskError, None, 128 + 7))
                .ended(killed_by(libc::SIGBUS))
                .observed(|o| o.shm_bytes = 64 << 20)
                .usage(|u| u.memory_peak_bytes = 1 << 20),
            case(
                "disk full, then failed",
                (R::CapacityExceeded, Some(C::Disk), 1),
            )
            .ended(Some(PayloadEnded {
                wait_status: 1 << 8,
                full_mounts: vec!["/work".into()],
                shm_full: false,
            })),
            case("oom kill", (R::CapacityExceeded, Some(C::Memory), 137))
                .ended(killed_by(libc::SIGKILL))
                .usage(|u| u.oom_kills = 1),
            case(
                "oom kill of the whole cell",
                (R::CapacityExceeded, Some(C::Memory), 137),
            )
            .ended(None)
            .observed(|o| o.pid1_status = Some(libc::SIGKILL))
            .usage(|u| u.oom_kills = 1),
            case(
                "pids refused, then failed",
                (R::CapacityExceeded, Some(C::Pids), 1),
            )
            .ended(exited(1))
            .usage(|u| u.pids_limit_hits = 4),
            case("pids refused, handled", (R::Ok, None, 0)).usage(|u| u.pids_limit_hits = 4),
            case("deadline", (R::CapacityExceeded, Some(C::WallTime), 124))
                .ended(killed_by(libc::SIGTERM))
                .observed(|o| o.deadline_fired = true),
            case("output cap", (R::CapacityExceeded, Some(C::OutputBytes), 0)).truncated(),
            case("launch failure", (R::RuntimeFault, None, 125))
                .ended(None)
                .observed(|o| o.launch_failure = Some(launch_failure(false))),
            case("control unavailable", (R::SandboxUnavailable, None, 125))
                .ended(None)
                .observed(|o| o.launch_failure = Some(launch_failure(true))),
            case("egress proxy error", (R::RuntimeFault, None, 125))
                .ended(None)
                .observed(|o| o.egress_error = Some("no proxy".into())),
            case("exec failure 126", (R::TaskError, None, 126))
                .ended(exited(126))
                .observed(|o| o.exec_failure = Some(exec_failure(126))),
            case("exec failure 127", (R::TaskError, None, 127))
                .ended(exited(127))
                .observed(|o| o.exec_failure = Some(exec_failure(127))),
            case("no report from pid 1", (R::RuntimeFault, None, 125)).ended(None),
            case("destroyed by the engine", (R::RuntimeFault, None, 125))
                .ended(None)
                .observed(|o| o.destroyed = Some("closed".into())),
        ]
    }

    #[test]
    fn each_signal_leads_to_its_class_ceiling_and_code() {
        for case in table() {
            let (name, expected) = (case.name, case.expected);
            let (verdict, _) = case.decide();
            assert_eq!(
                (verdict.status, verdict.limit, verdict.exit_code),
                expected,
                "{name}"
            );
        }
    }

    #[test]
    fn the_table_covers_every_class() {
        let seen: Vec<ResultClass> = table().iter().map(|c| c.expected.0).collect();
        for class in ResultClass::ALL {
            // delivery_failed is decided after classification, when the host side could
            // not write what was asked for (RunReport::mark_delivery_failed);
            // store_unavailable before any cell runs, by the engine, when no begin record
            // could be written (airlock_engine's FinishedRun).
            if ![ResultClass::DeliveryFailed, ResultClass::StoreUnavailable].contains(&class) {
                assert!(seen.contains(&class), "{class:?} has no row");
            }
        }
    }

    #[test]
    fn a_ceiling_reached_without_deciding_the_class_is_still_listed() {
        let (verdict, hits) = case("pids handled", (ResultClass::Ok, None, 0))
            .usage(|u| u.pids_limit_hits = 1)
            .truncated()
            .decide();
        assert_eq!(verdict.limit, Some(Ceiling::OutputBytes));
        assert_eq!(hits, [Ceiling::Pids, Ceiling::OutputBytes]);
    }

    #[test]
    fn the_exec_failure_is_the_runs_error() {
        let (verdict, _) = case("exec", (ResultClass::TaskError, None, 127))
            .observed(|o| o.exec_failure = Some(exec_failure(127)))
            .decide();
        assert_eq!(verdict.error.as_deref(), Some("/work/x: Permission denied"));
    }
}
