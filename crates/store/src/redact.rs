//! Secret redaction applied to every text before it reaches the database.

use serde_json::Value;

pub const REDACTED: &str = "[REDACTED]";

/// A fragment of a secret shorter than this is left alone at a head/tail cut, because
/// short fragments ("s", "ab") match ordinary text far too often. A secret split exactly
/// across a contiguous head/tail pair is redacted on both sides regardless of length.
pub const MIN_FRAGMENT: usize = 4;

/// The variable that turns redaction off, so that a test can show `airlock verify`'s
/// `credential.retained` check fail (crates/airlock/tests/verify.rs). Honoured only by a
/// build with debug assertions (the test profile); a release build, what is packaged and
/// run in production, compiles the switch out (docs/verify.md, "A verifier that can fail").
#[cfg(debug_assertions)]
pub const DISABLE_REDACTION_FOR_TESTS: &str = "AIRLOCK_TEST_ONLY_DISABLE_REDACTION";

#[cfg(debug_assertions)]
fn redaction_disabled_for_tests() -> bool {
    std::env::var_os(DISABLE_REDACTION_FOR_TESTS).is_some_and(|v| v == "1")
}

#[cfg(not(debug_assertions))]
fn redaction_disabled_for_tests() -> bool {
    false
}

/// The secrets of one run, longest first so that a secret containing another is
/// replaced whole.
#[derive(Clone, Default)]
pub struct Redactor {
    secrets: Vec<String>,
}

impl std::fmt::Debug for Redactor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Redactor({} secrets)", self.secrets.len())
    }
}

impl Redactor {
    pub fn new(secrets: Vec<String>) -> Self {
        if redaction_disabled_for_tests() {
            return Redactor::default();
        }
        let mut secrets: Vec<String> = secrets.into_iter().filter(|s| !s.is_empty()).collect();
        secrets.sort_by(|a, b| b.len().cmp(&a.len()).then(a.cmp(b)));
        secrets.dedup();
        Redactor { secrets }
    }

    pub fn is_empty(&self) -> bool {
        self.secrets.is_empty()
    }

    pub fn text(&self, s: &str) -> String {
        let mut out = s.to_string();
        for secret in &self.secrets {
            if out.contains(secret.as_str()) {
                out = out.replace(secret.as_str(), REDACTED);
            }
        }
        out
    }

    /// Redact every string (and object key) inside a JSON value.
    pub fn value(&self, v: Value) -> Value {
        if self.secrets.is_empty() {
            return v;
        }
        match v {
            Value::String(s) => Value::String(self.text(&s)),
            Value::Array(a) => Value::Array(a.into_iter().map(|x| self.value(x)).collect()),
            Value::Object(m) => Value::Object(
                m.into_iter()
                    .map(|(k, x)| (self.text(&k), self.value(x)))
                    .collect(),
            ),
            other => other,
        }
    }

    /// Redact a bounded head and tail of one output stream.
    ///
    /// Besides whole occurrences this removes: a secret split exactly across the cut
    /// (head ends with its first part, tail starts with the rest - what a small output
    /// captured as head+tail looks like); a head that ends in the first
    /// `>= MIN_FRAGMENT` bytes of a secret (the cap cut it); and a tail that starts with
    /// the last `>= MIN_FRAGMENT` bytes of a secret (the tail window cut it).
    pub fn head_tail(&self, head: &str, tail: &str) -> (String, String) {
        let mut head = head.to_string();
        let mut tail = tail.to_string();
        for secret in &self.secrets {
            // Split exactly across the boundary, any split point.
            for k in 1..secret.len() {
                if !secret.is_char_boundary(k) {
                    continue;
                }
                let (a, b) = secret.split_at(k);
                if head.ends_with(a) && tail.starts_with(b) {
                    head.truncate(head.len() - a.len());
                    head.push_str(REDACTED);
                    tail.replace_range(..b.len(), REDACTED);
                    break;
                }
            }
        }
        let mut head = self.text(&head);
        let mut tail = self.text(&tail);
        for secret in &self.secrets {
            // Longest prefix of the secret that the head ends with.
            for k in (MIN_FRAGMENT..secret.len()).rev() {
                if secret.is_char_boundary(k) && head.ends_with(&secret[..k]) {
                    head.truncate(head.len() - k);
                    head.push_str(REDACTED);
                    break;
                }
            }
            // Longest suffix of the secret that the tail starts with.
            for start in 1..=secret.len().saturating_sub(MIN_FRAGMENT) {
                if secret.is_char_boundary(start) && tail.starts_with(&secret[start..]) {
                    tail.replace_range(..secret.len() - start, REDACTED);
                    break;
                }
            }
        }
        (head, tail)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r() -> Redactor {
        Redactor::new(vec![
            "sk-live-0123456789".into(),
            "".into(),
            "hunter2".into(),
        ])
    }

    #[test]
    fn whole_occurrences_are_replaced() {
        assert_eq!(
            r().text("a sk-live-0123456789 b hunter2hunter2"),
            "a [REDACTED] b [REDACTED][REDACTED]"
        );
    }

    #[test]
    fn empty_secret_is_ignored() {
        assert_eq!(Redactor::new(vec!["".into()]).text("abc"), "abc");
    }

    #[test]
    fn nested_json_and_keys() {
        let v = serde_json::json!({"hunter2": ["x hunter2", {"k": "sk-live-0123456789"}], "n": 1});
        let out = serde_json::to_string(&r().value(v)).unwrap();
        assert!(
            !out.contains("hunter2") && !out.contains("sk-live"),
            "{out}"
        );
    }

    #[test]
    fn split_across_boundary() {
        let (h, t) = r().head_tail("output: sk-l", "ive-0123456789 done");
        assert_eq!(h, "output: [REDACTED]");
        assert_eq!(t, "[REDACTED] done");
        // Short split fragments are still caught when they are complementary.
        let (h, t) = r().head_tail("x s", "k-live-0123456789");
        assert_eq!((h.as_str(), t.as_str()), ("x [REDACTED]", "[REDACTED]"));
    }

    #[test]
    fn truncated_prefix_and_suffix() {
        let (h, t) = r().head_tail("token=sk-live-01", "89\nrest");
        assert_eq!(h, "token=[REDACTED]");
        // "89" is shorter than MIN_FRAGMENT and not complementary to the head: kept.
        assert_eq!(t, "89\nrest");
        let (_, t) = r().head_tail("nothing", "456789\nrest");
        assert_eq!(t, "[REDACTED]\nrest");
    }

    #[test]
    fn unrelated_text_untouched() {
        let (h, t) = r().head_tail("plain sk-", "text");
        assert_eq!((h.as_str(), t.as_str()), ("plain sk-", "text"));
    }
}
