//! The result of `airlock verify`: a table (or JSON) on stdout, JUnit XML for CI systems,
//! and a record in the audit store.

use super::checks::{Check, Observation, Outcome, Verdict};
use super::RunSeen;
use airlock_store::{RunEnd, RunStart, Store};
use serde::Serialize;

/// The store's event kind of a verification's verdicts.
pub const VERIFY_EVENT: &str = "verify.result";
/// The workload class a verification is recorded under, apart from real runs' figures.
pub const VERIFY_CLASS: &str = "airlock-verify";

#[derive(Debug, Clone, Serialize)]
pub struct CheckResult {
    pub check: &'static str,
    pub verdict: Verdict,
    pub evidence: String,
    pub runs: Vec<RunSeen>,
}

impl CheckResult {
    pub fn new(check: Check, outcome: Outcome, _seen: &Observation, runs: &[RunSeen]) -> Self {
        CheckResult {
            check: check.name(),
            verdict: outcome.0,
            evidence: outcome.1,
            runs: runs.to_vec(),
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Planted {
    pub dir: String,
    pub endpoint: String,
    pub runtime_socket: String,
    pub marker_process: String,
    pub marker_pid: u32,
}

#[derive(Debug, Serialize)]
pub struct Summary {
    pub verified: String,
    /// What was planted for the checks (and removed at the end).
    pub planted: Planted,
    pub contract_sha256: String,
    pub image: String,
    pub class: Option<String>,
    pub checks: Vec<CheckResult>,
    pub duration_ms: u64,
}

impl Summary {
    /// Every check passed (or had nothing to try, and said so).
    pub fn passed(&self) -> bool {
        self.checks.iter().all(|c| c.verdict != Verdict::Fail)
    }

    fn failed(&self) -> Vec<&CheckResult> {
        (self.checks.iter())
            .filter(|c| c.verdict == Verdict::Fail)
            .collect()
    }
}

/// The table (or the JSON) on stdout.
pub fn print(summary: &Summary, json: bool) {
    if json {
        let mut value = serde_json::to_value(summary).unwrap_or_default();
        value["passed"] = summary.passed().into();
        println!(
            "{}",
            serde_json::to_string_pretty(&value).unwrap_or_default()
        );
        return;
    }
    println!("verifying {}", summary.verified);
    for check in &summary.checks {
        let via = check.runs.first().map_or("", |r| r.via);
        println!(
            "{:<5} {:<26} {:<13} {}",
            check.verdict.as_str(),
            check.check,
            via,
            check.evidence
        );
    }
    let failed = summary.failed();
    println!(
        "{} of {} checks failed ({} ms)",
        failed.len(),
        summary.checks.len(),
        summary.duration_ms
    );
}

fn xml_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            // XML 1.0 has no way to carry other control characters.
            c if c.is_control() && !matches!(c, '\n' | '\t' | '\r') => out.push('?'),
            c => out.push(c),
        }
    }
    out
}

/// The result as one JUnit `<testsuite>`: a test case per check, `<failure>` for a failed
/// one, `<skipped>` for one with nothing to try.
pub fn junit(summary: &Summary) -> String {
    let skipped = (summary.checks.iter())
        .filter(|c| c.verdict == Verdict::NotApplicable)
        .count();
    let mut xml = format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuite name=\"airlock verify\" \
         tests=\"{}\" failures=\"{}\" skipped=\"{skipped}\" time=\"{:.3}\">\n  \
         <properties><property name=\"verified\" value=\"{}\"/><property \
         name=\"contract_sha256\" value=\"{}\"/></properties>\n",
        summary.checks.len(),
        summary.failed().len(),
        summary.duration_ms as f64 / 1000.0,
        xml_escape(&summary.verified),
        summary.contract_sha256,
    );
    for check in &summary.checks {
        let evidence = xml_escape(&check.evidence);
        let body = match check.verdict {
            Verdict::Pass => format!("<system-out>{evidence}</system-out>"),
            Verdict::Fail => format!("<failure message=\"{evidence}\"/>"),
            Verdict::NotApplicable => format!("<skipped message=\"{evidence}\"/>"),
        };
        xml.push_str(&format!(
            "  <testcase classname=\"airlock.verify\" name=\"{}\">{body}</testcase>\n",
            check.check
        ));
    }
    xml.push_str("</testsuite>\n");
    xml
}

/// The verification in the audit store: a record of its own (class [`VERIFY_CLASS`]),
/// with a [`VERIFY_EVENT`] entry in the hash chain holding what was verified and every
/// verdict, and status `ok` only when every check passed.
pub fn record(location: &airlock_store::StoreLocation, summary: &Summary) -> anyhow::Result<()> {
    let store = Store::open_at(location)?;
    let body = serde_json::to_value(summary)?;
    let start = RunStart {
        argv: vec!["airlock".into(), "verify".into(), summary.verified.clone()],
        input_sha256: String::new(),
        contract_sha256: summary.contract_sha256.clone(),
        workload_class: VERIFY_CLASS.to_string(),
        plan_json: serde_json::json!({ "verify": summary.verified, "image": summary.image }),
        session_id: None,
        tenant: None,
    };
    let handle = store.begin_run(start, Vec::new())?;
    store.append_event(&handle, VERIFY_EVENT, body.clone())?;
    let passed = summary.passed();
    store.finish_run(
        &handle,
        RunEnd {
            status: if passed { "ok" } else { "task_error" }.to_string(),
            exit_code: Some(if passed { 0 } else { 1 }),
            wall_ms: summary.duration_ms as f64,
            cleanup_ok: true,
            result_json: body,
            ..RunEnd::default()
        },
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn summary(verdicts: &[(&'static str, Verdict, &str)]) -> Summary {
        Summary {
            verified: "the default contract, image host".into(),
            planted: Planted {
                dir: "/tmp/p".into(),
                endpoint: "127.0.0.1:1".into(),
                runtime_socket: "/tmp/p/runtime/docker.sock".into(),
                marker_process: "airlock-verify-process-0".into(),
                marker_pid: 1,
            },
            contract_sha256: "00".into(),
            image: "host".into(),
            class: None,
            checks: verdicts
                .iter()
                .map(|(check, verdict, evidence)| CheckResult {
                    check,
                    verdict: *verdict,
                    evidence: evidence.to_string(),
                    runs: Vec::new(),
                })
                .collect(),
            duration_ms: 1500,
        }
    }

    #[test]
    fn junit_marks_failures_and_skips_and_escapes_evidence() {
        let s = summary(&[
            ("fs.unmounted_read", Verdict::Pass, "refused"),
            (
                "egress.private_address",
                Verdict::Fail,
                "saw <1> & \"more\"",
            ),
            ("ceiling.disk", Verdict::NotApplicable, "no writable path"),
        ]);
        let xml = junit(&s);
        assert!(
            xml.contains("tests=\"3\" failures=\"1\" skipped=\"1\""),
            "{xml}"
        );
        assert!(
            xml.contains("<failure message=\"saw &lt;1&gt; &amp; &quot;more&quot;\"/>"),
            "{xml}"
        );
        assert!(
            xml.contains("<skipped message=\"no writable path\"/>"),
            "{xml}"
        );
    }

    #[test]
    fn not_applicable_does_not_fail_the_verification_but_a_failure_does() {
        assert!(summary(&[("a", Verdict::NotApplicable, "")]).passed());
        assert!(!summary(&[("a", Verdict::Pass, ""), ("b", Verdict::Fail, "")]).passed());
    }
}
