//! What `airlock run` writes to the audit store: the input hash, the run record at start
//! and at the end, and one event per decision (egress, ceilings, artifacts, cleanup).

use airlock_cell::report::{ResultClass, RunReport};
use airlock_contract::CellPlan;
use airlock_store::{kinds, Finished, Redactor, RunEnd, RunHandle, Store};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

/// sha256 over the command and the identity of each read-only input, each
/// length-prefixed so that moving bytes between parts changes the hash. Content is not
/// part of it: stdin is read while the payload runs (the result's `stdin`), and the inputs'
/// content hash is the result's `inputs`, computed off the start path.
pub struct InputHasher(Sha256);

impl InputHasher {
    pub fn new(argv: &[String]) -> InputHasher {
        let mut hasher = Sha256::new();
        let argv_json = serde_json::to_vec(argv).unwrap_or_default();
        hasher.update((argv_json.len() as u64).to_le_bytes());
        hasher.update(&argv_json);
        InputHasher(hasher)
    }

    pub fn add_part(&mut self, label: &str, bytes: &[u8]) {
        self.0.update((label.len() as u64).to_le_bytes());
        self.0.update(label.as_bytes());
        self.0.update((bytes.len() as u64).to_le_bytes());
        self.0.update(bytes);
    }

    /// Identifies every read-only input by its host source and the identity of that
    /// source (device, inode, size, mtime, ctime): a few `stat` calls, whatever the
    /// input's size, so the start does not grow with it. The content hash is computed
    /// while the payload runs ([`crate::inputs`]) and recorded with the run's end. An
    /// error names the input's host source and its target in the cell.
    pub fn add_plan_inputs(&mut self, plan: &CellPlan) -> std::io::Result<()> {
        for (target, source) in crate::inputs::readonly_inputs(plan) {
            let meta = std::fs::metadata(&source).map_err(|err| {
                std::io::Error::new(
                    err.kind(),
                    format!(
                        "read-only input {} (mounted at {}): {err}",
                        source.display(),
                        target.display()
                    ),
                )
            })?;
            let identity = airlock_store::input_cache::FileIdentity::of(&meta);
            let label = target.display().to_string();
            self.add_part(
                &label,
                format!("{}\0{}", source.display(), identity.key()).as_bytes(),
            );
        }
        Ok(())
    }

    pub fn finish(self) -> String {
        hex::encode(self.0.finalize())
    }
}

/// Values that must never reach the store: credentials and secret env values.
pub fn secrets_of(plan: &CellPlan, credentials: &[(String, String)]) -> Vec<String> {
    plan.env
        .iter()
        .filter(|v| v.secret)
        .map(|v| v.value.clone())
        .chain(credentials.iter().map(|(_, value)| value.clone()))
        .filter(|v| !v.is_empty())
        .collect()
}

/// `record` (a result record) with every secret replaced as the store replaces it: whole
/// occurrences everywhere, and in the bounded output head and tail also the fragments a
/// cut can leave (see `Redactor::head_tail`).
pub fn redact_result(mut record: Value, secrets: &[String]) -> Value {
    let redactor = Redactor::new(secrets.to_vec());
    if redactor.is_empty() {
        return record;
    }
    for stream in ["stdout", "stderr"] {
        let capture = &mut record["output"][stream];
        if let (Some(head), Some(tail)) = (capture["head"].as_str(), capture["tail"].as_str()) {
            let (head, tail) = redactor.head_tail(head, tail);
            capture["head"] = json!(head);
            capture["tail"] = json!(tail);
        }
    }
    redactor.value(record)
}

/// Event kind of an artifact the host side could not write (see `artifacts.undelivered`).
pub const ARTIFACT_UNDELIVERED: &str = "artifact.undelivered";
/// Event kind of a run whose outputs were not all delivered.
pub const DELIVERY_FAILED: &str = "delivery.failed";

/// Event kind of a ceiling the run reached without it deciding the run's class.
pub const LIMIT_HIT: &str = "limit.hit";

fn limit_name(report: &RunReport) -> Option<String> {
    report.limit_fired.map(|l| l.as_str().to_string())
}

fn value_of<T: serde::Serialize>(item: &T) -> Value {
    serde_json::to_value(item).unwrap_or_default()
}

/// The run's decisions as events: egress, ceilings, artifacts, errors, cleanup.
fn events_of(report: &RunReport) -> Vec<(String, Value)> {
    let mut events = Vec::new();
    let mut push = |kind: &str, body: Value| events.push((kind.to_string(), body));
    for record in report.egress.iter().flatten() {
        let mut body = value_of(record);
        if let Some(reason) = &record.reason {
            body["reason_code"] = json!(reason);
        }
        push(kinds::EGRESS_DECISION, body);
    }
    for record in &report.broker {
        let mut body = value_of(record);
        if let Some(reason) = record.reason.as_ref().or(record.error.as_ref()) {
            body["reason_code"] = json!(reason);
        }
        push(kinds::BROKER_ACTION, body);
    }
    if let Some(limit) = limit_name(report) {
        push(
            kinds::LIMIT_FIRED,
            json!({ "limit": limit, "status": report.status.as_str() }),
        );
    }
    for hit in report
        .limits_hit
        .iter()
        .filter(|c| Some(**c) != report.limit_fired)
    {
        push(
            LIMIT_HIT,
            json!({ "limit": hit.as_str(), "status": report.status.as_str() }),
        );
    }
    let artifacts = report.artifacts.iter();
    for artifact in artifacts.clone().flat_map(|a| &a.kept) {
        push(kinds::ARTIFACT_KEPT, value_of(artifact));
    }
    for artifact in artifacts.clone().flat_map(|a| &a.rejected) {
        let mut body = value_of(artifact);
        body["decision"] = json!("rejected");
        body["reason_code"] = json!(artifact.reason);
        push(kinds::ARTIFACT_REJECTED, body);
    }
    for artifact in artifacts.flat_map(|a| &a.undelivered) {
        let mut body = value_of(artifact);
        body["decision"] = json!("undelivered");
        body["reason_code"] = json!(artifact.reason);
        push(ARTIFACT_UNDELIVERED, body);
    }
    if let Some(error) = &report.error {
        let kind = if report.status == ResultClass::DeliveryFailed {
            DELIVERY_FAILED
        } else {
            kinds::POLICY_DECISION
        };
        push(
            kind,
            json!({ "status": report.status.as_str(), "error": error }),
        );
    }
    push(
        kinds::CLEANUP,
        json!({ "ok": report.cleanup.ok, "leftovers": report.cleanup.leftovers }),
    );
    events
}

/// Finishes the run record together with its events, in one transaction; while the store
/// is unavailable, into the state directory's spool (written when it is back). Either
/// way it is logged when the finish is not in the store now: spooled, or lost (the spool
/// full) — never silently.
pub fn finish(
    store: &Store,
    handle: &RunHandle,
    report: &RunReport,
    result: &Value,
) -> airlock_store::Result<Finished> {
    let finished = store.finish_run_or_spool(handle, end_of(report, result));
    match &finished {
        Ok(Finished::Written) => {}
        Ok(Finished::Spooled(path)) => eprintln!(
            "airlock: audit store unavailable: the finish of run {} ({}) is kept in {} and \
             written when the store is back",
            handle.run_id(),
            report.status.as_str(),
            path.display()
        ),
        Err(err) if err.is_unavailable() => eprintln!(
            "airlock: {err} ({} finish(es) lost since start)",
            airlock_store::spool::lost_finishes()
        ),
        Err(_) => {}
    }
    finished
}

/// The store's end of a run from its report.
fn end_of(report: &RunReport, result: &Value) -> RunEnd {
    let output = report.output.as_ref();
    let text =
        |f: fn(&airlock_cell::output::OutputCapture) -> String| output.map(f).unwrap_or_default();
    RunEnd {
        status: report.status.as_str().to_string(),
        exit_code: report.exit.code,
        exit_signal: report.exit.signal,
        limit_fired: limit_name(report),
        usage: serde_json::to_value(report.usage).unwrap_or_default(),
        startup_ms: report.timings.startup_ms,
        wall_ms: report.timings.wall_ms,
        stdout_head: text(|o| o.stdout.head_text()),
        stdout_tail: text(|o| o.stdout.tail_text()),
        stderr_head: text(|o| o.stderr.head_text()),
        stderr_tail: text(|o| o.stderr.tail_text()),
        cleanup_ok: report.cleanup.ok,
        cleanup_leftovers: json!(report.cleanup.leftovers),
        result_json: result.clone(),
        events: events_of(report),
    }
}

/// [`airlock_contract::check_exec`] of what the cell will exec for `plan`'s command (or
/// `command`, a session's, with its own additions): its argv, the plan's environment, the
/// credentials' and the command's additions.
pub(crate) fn check_exec(
    argv: &[String],
    plan: &CellPlan,
    credentials: &[(String, String)],
    additions: &[(String, String)],
) -> Result<(), airlock_contract::CommandInputError> {
    let mut base = airlock_contract::plan_env(plan);
    base.extend(pairs(credentials));
    let env = pairs(additions);
    airlock_contract::check_exec(&airlock_contract::CommandInput {
        argv,
        env: &env,
        base_env: &base,
        cwd: None,
    })
}

/// `(name, value)` pairs borrowed, as [`airlock_contract::CommandInput`] takes them.
pub(crate) fn pairs(vars: &[(String, String)]) -> Vec<(&str, &str)> {
    vars.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect()
}
