//! What `airlock run` writes to the audit store: the input hash, the run record at start
//! and at the end, and one event per decision (egress, ceilings, artifacts, cleanup).

use airlock_cell::report::{ResultClass, RunReport};
use airlock_contract::{CellPlan, MountPlan};
use airlock_store::{kinds, Redactor, RunEnd, RunHandle, Store};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use std::io::Read;
use std::path::Path;

/// sha256 over the command, stdin and the read-only inputs, each length-prefixed so that
/// moving bytes between parts changes the hash.
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

    /// Hashes everything `reader` yields (copying it to `copy` on the way, if given).
    pub fn add_stream(
        &mut self,
        label: &str,
        reader: &mut impl Read,
        mut copy: Option<&mut std::fs::File>,
    ) -> std::io::Result<()> {
        use std::io::Write;
        let mut digest = Sha256::new();
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = reader.read(&mut buf)?;
            if n == 0 {
                break;
            }
            digest.update(&buf[..n]);
            if let Some(out) = copy.as_mut() {
                out.write_all(&buf[..n])?;
            }
        }
        self.add_part(label, &digest.finalize());
        Ok(())
    }

    /// Hashes a read-only input: a file's content, or for a directory every file below it
    /// (path and content), in sorted order.
    pub fn add_input(&mut self, target: &Path, source: &Path) -> std::io::Result<()> {
        let meta = std::fs::metadata(source)?;
        if meta.is_dir() {
            let mut entries: Vec<_> = std::fs::read_dir(source)?
                .flatten()
                .map(|e| e.path())
                .collect();
            entries.sort();
            for entry in entries {
                let name = entry.file_name().map(|n| n.to_owned()).unwrap_or_default();
                self.add_input(&target.join(name), &entry)?;
            }
        } else if meta.is_file() {
            let mut file_hash = Sha256::new();
            let mut file = std::fs::File::open(source)?;
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                let n = file.read(&mut buf)?;
                if n == 0 {
                    break;
                }
                file_hash.update(&buf[..n]);
            }
            self.add_part(&target.display().to_string(), &file_hash.finalize());
        }
        Ok(())
    }

    pub fn add_plan_inputs(&mut self, plan: &CellPlan) -> std::io::Result<()> {
        for mount in &plan.mounts {
            if let MountPlan::ReadonlyInput { source, target } = mount {
                self.add_input(target, source)?;
            }
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

fn limit_name(report: &RunReport) -> Option<String> {
    report
        .limit_fired
        .and_then(|l| serde_json::to_value(l).ok())
        .and_then(|v| v.as_str().map(str::to_owned))
}

/// The run's decisions as events: egress, ceilings, artifacts, errors, cleanup.
fn events_of(report: &RunReport) -> Vec<(String, Value)> {
    let mut events = Vec::new();
    let mut push = |kind: &str, body: Value| events.push((kind.to_string(), body));
    for record in report.egress.as_array().into_iter().flatten() {
        let mut body = record.clone();
        if let Some(reason) = record.get("reason").cloned() {
            body["reason_code"] = reason;
        }
        push(kinds::EGRESS_DECISION, body);
    }
    if let Some(limit) = limit_name(report) {
        push(
            kinds::LIMIT_FIRED,
            json!({ "limit": limit, "status": report.status.as_str() }),
        );
    }
    for artifact in report
        .artifacts
        .get("kept")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        push(kinds::ARTIFACT_KEPT, artifact.clone());
    }
    for artifact in report
        .artifacts
        .get("rejected")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let mut body = artifact.clone();
        body["decision"] = json!("rejected");
        body["reason_code"] = artifact.get("reason").cloned().unwrap_or(Value::Null);
        push(kinds::ARTIFACT_REJECTED, body);
    }
    for artifact in report
        .artifacts
        .get("undelivered")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let mut body = artifact.clone();
        body["decision"] = json!("undelivered");
        body["reason_code"] = artifact.get("reason").cloned().unwrap_or(Value::Null);
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

/// Finishes the run record together with its events, in one transaction.
pub fn finish(
    store: &Store,
    handle: &RunHandle,
    report: &RunReport,
    result: &Value,
) -> airlock_store::Result<()> {
    let output = report.output.as_ref();
    let text =
        |f: fn(&airlock_cell::output::OutputCapture) -> String| output.map(f).unwrap_or_default();
    store.finish_run(
        handle,
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
        },
    )
}
