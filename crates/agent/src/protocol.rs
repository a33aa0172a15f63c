//! The tool protocol's verdicts (docs/tools.md): what the model receives is exactly
//! `{ok: true, output, run_id}` or `{ok: false, error: {class, reason, message}, run_id}`.
//! The message is built here from stable facts (a result class, a limit, a schema
//! violation), bounded, and redacted: never stderr, never a host path, never a secret.

use crate::schema::{bounded, Schema};
use airlock_cell::report::{ResultClass, RunReport};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The most characters of an error message the model receives.
pub const MESSAGE_CHARS: usize = 300;

/// Stable reason codes of a failed call.
pub mod reason {
    pub const UNKNOWN_TOOL: &str = "tool.unknown";
    pub const INPUT_NOT_JSON: &str = "input.not_json";
    pub const INPUT_SCHEMA: &str = "input.schema";
    pub const INPUT_TOO_LARGE: &str = "input.too_large";
    pub const CONTRACT: &str = "tool.contract";
    pub const CREDENTIAL: &str = airlock_contract::CREDENTIAL_FORBIDDEN;
    pub const EXIT: &str = "tool.exit";
    pub const OUTPUT_NOT_JSON: &str = "output.not_json";
    pub const OUTPUT_SCHEMA: &str = "output.schema";
    pub const OUTPUT_TRUNCATED: &str = "output.truncated";
    pub const CANCELLED: &str = "call.cancelled";
    pub const RUNTIME: &str = "run.runtime_fault";
}

/// The envelope the model receives.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ToolReply {
    Ok {
        ok: True,
        output: Value,
        run_id: String,
    },
    Err {
        ok: False,
        error: ErrorInfo,
        run_id: String,
    },
}

/// `true` on the wire, and only that.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "bool", into = "bool")]
pub struct True;
/// `false` on the wire, and only that.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "bool", into = "bool")]
pub struct False;

impl From<True> for bool {
    fn from(_: True) -> bool {
        true
    }
}
impl TryFrom<bool> for True {
    type Error = &'static str;
    fn try_from(b: bool) -> Result<True, Self::Error> {
        b.then_some(True).ok_or("expected true")
    }
}
impl From<False> for bool {
    fn from(_: False) -> bool {
        false
    }
}
impl TryFrom<bool> for False {
    type Error = &'static str;
    fn try_from(b: bool) -> Result<False, Self::Error> {
        (!b).then_some(False).ok_or("expected false")
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorInfo {
    /// A result class (docs/architecture.md, "Result classes").
    pub class: String,
    /// A stable reason code (`reason::*`).
    pub reason: String,
    /// Bounded, built by airlock: no stderr, no host path, no secret.
    pub message: String,
}

impl ToolReply {
    pub fn ok(output: Value, run_id: &str) -> ToolReply {
        ToolReply::Ok {
            ok: True,
            output,
            run_id: run_id.to_string(),
        }
    }

    pub fn error(class: ResultClass, reason: &str, message: &str, run_id: &str) -> ToolReply {
        ToolReply::Err {
            ok: False,
            error: ErrorInfo {
                class: class.as_str().to_string(),
                reason: reason.to_string(),
                message: bounded(message, MESSAGE_CHARS),
            },
            run_id: run_id.to_string(),
        }
    }

    pub fn is_ok(&self) -> bool {
        matches!(self, ToolReply::Ok { .. })
    }

    pub fn run_id(&self) -> &str {
        match self {
            ToolReply::Ok { run_id, .. } | ToolReply::Err { run_id, .. } => run_id,
        }
    }

    pub fn to_value(&self) -> Value {
        serde_json::to_value(self).unwrap_or_default()
    }
}

/// What the cell produced, as far as the verdict needs it.
pub struct CellOutcome<'a> {
    pub report: &'a RunReport,
    /// The first bytes of stdout, at most `cap + 1` of them.
    pub stdout: &'a [u8],
    /// How many bytes the tool wrote to stdout in all.
    pub stdout_seen: u64,
    pub cap: u64,
}

impl CellOutcome<'_> {
    /// Whether stdout is not all here: over the cap, or cut by the contract's output cap.
    pub fn truncated(&self) -> bool {
        self.stdout_seen > self.cap || (self.stdout.len() as u64) < self.stdout_seen
    }
}

/// The verdict on a call whose cell ran: a pure function of the run's report, its stdout
/// and the output schema.
pub fn verdict(outcome: &CellOutcome<'_>, output_schema: &Schema) -> ToolReply {
    let report = outcome.report;
    let run_id = &report.run_id;
    if outcome.truncated() {
        let message = format!(
            "the tool wrote {} bytes to stdout, over the cap of {} bytes; nothing of it is \
             returned",
            outcome.stdout_seen, outcome.cap
        );
        return ToolReply::error(
            ResultClass::CapacityExceeded,
            reason::OUTPUT_TRUNCATED,
            &message,
            run_id,
        );
    }
    if report.status != ResultClass::Ok {
        return failed_run(report);
    }
    let value: Value = match serde_json::from_slice(outcome.stdout) {
        Ok(value) => value,
        Err(err) => {
            let message = format!(
                "the tool's stdout is not one JSON value ({} bytes; {})",
                outcome.stdout.len(),
                err.classify_name()
            );
            return ToolReply::error(
                ResultClass::TaskError,
                reason::OUTPUT_NOT_JSON,
                &message,
                run_id,
            );
        }
    };
    match output_schema.check(&value) {
        Ok(()) => ToolReply::ok(value, run_id),
        Err(violation) => ToolReply::error(
            ResultClass::TaskError,
            reason::OUTPUT_SCHEMA,
            &format!("the tool's output does not match its schema: {violation}"),
            run_id,
        ),
    }
}

/// A run that did not end `ok`: its class, and a message from its signals only (the
/// report's own error text may carry host details, so it stays in the record).
pub fn failed_run(report: &RunReport) -> ToolReply {
    let (reason, message) = match (report.status, report.limit_fired) {
        (ResultClass::CapacityExceeded, Some(limit)) => (
            format!("limit.{}", limit.as_str()),
            format!("the tool was stopped by the {} ceiling", limit.as_str()),
        ),
        (ResultClass::TaskError, _) => (
            reason::EXIT.to_string(),
            format!(
                "the tool exited with status {}",
                report.exit.code.unwrap_or(report.exit_code)
            ),
        ),
        (status, _) => (
            format!("run.{}", status.as_str()),
            format!(
                "the tool's run ended {} (the audit record has the details)",
                status.as_str()
            ),
        ),
    };
    ToolReply::error(report.status, &reason, &message, &report.run_id)
}

trait ClassifyName {
    fn classify_name(&self) -> &'static str;
}

impl ClassifyName for serde_json::Error {
    fn classify_name(&self) -> &'static str {
        match self.classify() {
            serde_json::error::Category::Io => "unreadable",
            serde_json::error::Category::Syntax => "a syntax error",
            serde_json::error::Category::Data => "unexpected data",
            serde_json::error::Category::Eof => "it ends early",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn report(status: ResultClass) -> RunReport {
        let mut report = RunReport::refused("r1", status, "/var/lib/secret-host-path".into());
        report.exit.code = Some(0);
        report
    }

    fn schema() -> Schema {
        Schema::compile(json!({"type": "object", "required": ["rows"]})).unwrap()
    }

    fn outcome<'a>(report: &'a RunReport, stdout: &'a [u8], seen: u64) -> CellOutcome<'a> {
        CellOutcome {
            report,
            stdout,
            stdout_seen: seen,
            cap: 16,
        }
    }

    #[test]
    fn valid_output_is_ok_with_the_value_and_run_id() {
        let r = report(ResultClass::Ok);
        let reply = verdict(&outcome(&r, b"{\"rows\":[]}\n", 12), &schema());
        assert_eq!(
            reply.to_value(),
            json!({"ok": true, "output": {"rows": []}, "run_id": "r1"})
        );
    }

    #[test]
    fn output_over_the_cap_is_truncated_and_carries_none_of_it() {
        let r = report(ResultClass::Ok);
        let reply = verdict(&outcome(&r, b"{\"rows\":[1,2,3,4,5,6]", 17), &schema());
        let value = reply.to_value();
        assert_eq!(value["error"]["reason"], reason::OUTPUT_TRUNCATED);
        assert!(!value.to_string().contains("[1,2"), "{value}");
    }

    #[test]
    fn output_not_matching_the_schema_names_the_rule() {
        let r = report(ResultClass::Ok);
        let reply = verdict(&outcome(&r, b"{\"row\":1}", 9), &schema());
        let value = reply.to_value();
        assert_eq!(value["error"]["reason"], reason::OUTPUT_SCHEMA);
        assert_eq!(value["error"]["class"], "task_error");
    }

    #[test]
    fn two_json_values_are_not_one() {
        let r = report(ResultClass::Ok);
        let reply = verdict(&outcome(&r, b"{}{}", 4), &schema());
        assert_eq!(reply.to_value()["error"]["reason"], reason::OUTPUT_NOT_JSON);
    }

    #[test]
    fn a_failed_run_never_carries_its_error_text() {
        let r = report(ResultClass::RuntimeFault);
        let reply = verdict(&outcome(&r, b"", 0), &schema());
        assert!(!reply.to_value().to_string().contains("/var/lib"));
        assert_eq!(reply.to_value()["error"]["class"], "runtime_fault");
    }

    #[test]
    fn a_memory_kill_names_the_ceiling() {
        let mut r = report(ResultClass::CapacityExceeded);
        r.limit_fired = Some(airlock_cell::report::Ceiling::Memory);
        let reply = verdict(&outcome(&r, b"", 0), &schema());
        assert_eq!(reply.to_value()["error"]["reason"], "limit.memory");
    }

    #[test]
    fn messages_are_bounded() {
        let reply = ToolReply::error(ResultClass::TaskError, "x", &"a".repeat(5000), "");
        let ToolReply::Err { error, .. } = reply else {
            panic!()
        };
        assert!(error.message.chars().count() <= MESSAGE_CHARS + 3);
    }

    #[test]
    fn the_envelope_round_trips() {
        let reply = ToolReply::error(ResultClass::PolicyDenied, "input.schema", "m", "r");
        let back: ToolReply = serde_json::from_value(reply.to_value()).unwrap();
        assert_eq!(back, reply);
    }
}
