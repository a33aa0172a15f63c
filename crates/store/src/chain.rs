//! The audit chain's rules, shared by both backends (SQLite and Postgres): the check
//! `verify` folds over the entries and run rows, and where `prune` may cut the chain.
//! Pure: the backends read the rows and feed them here, so a rule is written once.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::{
    entry_hash, kinds, AuditEntry, ChainBreak, Result, RunRecord, StoreError, VerifyReport,
    GENESIS_HASH,
};

pub(crate) fn broken(
    seq: Option<i64>,
    run_id: Option<&str>,
    reason: impl Into<String>,
) -> StoreError {
    StoreError::Tampered(ChainBreak {
        seq,
        run_id: run_id.map(str::to_string),
        reason: reason.into(),
    })
}

/// The check of one store's chain: feed every entry in `seq` order ([`Self::entry`]),
/// then close the chain against the recorded head ([`Self::end_of_chain`]), then feed
/// every run row ([`Self::run_row`]), then [`Self::finish`]. The first broken record is
/// the error.
pub(crate) struct ChainCheck {
    /// The newest prune checkpoint's body: where the chain may start.
    checkpoint: Option<Value>,
    /// Expected run rows, folded from the entries: (last seq, columns).
    expected: BTreeMap<String, (i64, serde_json::Map<String, Value>)>,
    prev: Option<(i64, String)>,
    first_seq: Option<i64>,
    entries: u64,
    runs: u64,
    head: Option<(i64, String)>,
}

impl ChainCheck {
    /// `checkpoint_body`: the body text of the newest `store.prune` entry, if any.
    pub fn new(checkpoint_body: Option<&str>) -> ChainCheck {
        ChainCheck {
            checkpoint: checkpoint_body.map(|b| serde_json::from_str(b).unwrap_or(Value::Null)),
            expected: BTreeMap::new(),
            prev: None,
            first_seq: None,
            entries: 0,
            runs: 0,
            head: None,
        }
    }

    /// The next entry in chain order, with its body exactly as stored (what was hashed).
    pub fn entry(&mut self, e: &AuditEntry, body_json: &str) -> Result<()> {
        let run = e.run_id.as_deref();
        self.entries += 1;
        match &self.prev {
            None => self.check_start(e)?,
            Some((pseq, phash)) => {
                if e.seq != pseq + 1 {
                    return Err(broken(
                        Some(e.seq),
                        run,
                        format!("entries {}..={} are missing (deleted)", pseq + 1, e.seq - 1),
                    ));
                }
                if &e.prev_hash != phash {
                    return Err(broken(
                        Some(e.seq),
                        run,
                        "prev_hash does not match the previous entry (entries edited or reordered)",
                    ));
                }
            }
        }
        let h = entry_hash(&e.prev_hash, e.seq, run, &e.kind, e.at, body_json);
        if h != e.hash {
            return Err(broken(
                Some(e.seq),
                run,
                "content does not match its hash (entry edited)",
            ));
        }
        if let Some(run_id) = run {
            self.fold_run_entry(e, run_id, body_json)?;
        }
        self.prev = Some((e.seq, e.hash.clone()));
        Ok(())
    }

    /// The first entry starts from the genesis hash, or from a prune checkpoint's anchor.
    fn check_start(&mut self, e: &AuditEntry) -> Result<()> {
        let run = e.run_id.as_deref();
        self.first_seq = Some(e.seq);
        if e.seq == 1 {
            if e.prev_hash != GENESIS_HASH {
                return Err(broken(
                    Some(e.seq),
                    run,
                    "first entry does not start from the genesis hash",
                ));
            }
            return Ok(());
        }
        let anchored = self.checkpoint.as_ref().is_some_and(|b| {
            b["pruned_through_seq"].as_i64() == Some(e.seq - 1)
                && b["anchor_hash"].as_str() == Some(e.prev_hash.as_str())
        });
        if !anchored {
            return Err(broken(
                Some(e.seq),
                run,
                format!(
                    "chain starts at seq {} but no prune checkpoint anchors entries before it (deleted?)",
                    e.seq
                ),
            ));
        }
        Ok(())
    }

    fn fold_run_entry(&mut self, e: &AuditEntry, run_id: &str, body_json: &str) -> Result<()> {
        let run = Some(run_id);
        match e.kind.as_str() {
            kinds::RUN_BEGIN | kinds::RUN_FINISH | kinds::RUN_ABORTED => {
                let body = serde_json::from_str::<Value>(body_json).unwrap_or(Value::Null);
                let Value::Object(m) = body else {
                    return Err(broken(Some(e.seq), run, "run entry body is not an object"));
                };
                let slot = self
                    .expected
                    .entry(run_id.to_string())
                    .or_insert((e.seq, Default::default()));
                if e.kind == kinds::RUN_BEGIN && !slot.1.is_empty() {
                    return Err(broken(
                        Some(e.seq),
                        run,
                        "second run.begin for the same run",
                    ));
                }
                if e.kind != kinds::RUN_BEGIN && slot.1.is_empty() {
                    return Err(broken(
                        Some(e.seq),
                        run,
                        "run ends before it begins (reordered?)",
                    ));
                }
                slot.0 = e.seq;
                slot.1.extend(m);
            }
            _ => {
                if !self.expected.contains_key(run_id) {
                    return Err(broken(
                        Some(e.seq),
                        run,
                        "event precedes its run.begin (reordered?)",
                    ));
                }
            }
        }
        Ok(())
    }

    /// Every entry was fed: the last one must be the recorded head (cutting off the
    /// newest entries is detected here).
    pub fn end_of_chain(&mut self, head_seq: i64, head_hash: &str) -> Result<()> {
        match &self.prev {
            Some((seq, hash)) if *seq == head_seq && hash == head_hash => {}
            None if head_seq == 0 => {}
            Some((seq, _)) => {
                return Err(broken(
                    Some(*seq),
                    None,
                    format!("chain ends at seq {seq} but the recorded head is seq {head_seq} (newest entries deleted or head edited)"),
                ))
            }
            None => {
                return Err(broken(
                    None,
                    None,
                    format!("audit log is empty but the recorded head is seq {head_seq} (entries deleted)"),
                ))
            }
        }
        self.head = Some((head_seq, head_hash.to_string()));
        Ok(())
    }

    /// One run row: it must equal the projection of its entries, column by column.
    pub fn run_row(&mut self, rec: &RunRecord) -> Result<()> {
        self.runs += 1;
        let Some((last_seq, exp)) = self.expected.remove(&rec.run_id) else {
            return Err(broken(
                None,
                Some(&rec.run_id),
                "run row has no audit entries (inserted outside the store)",
            ));
        };
        let Value::Object(row) = serde_json::to_value(rec)? else {
            unreachable!("RunRecord serialises to an object")
        };
        for (col, have) in &row {
            let want = exp.get(col).unwrap_or(&Value::Null);
            if have != want {
                return Err(broken(
                    Some(last_seq),
                    Some(&rec.run_id),
                    format!("run row column {col} = {have} differs from the audit trail ({want}) (row edited)"),
                ));
            }
        }
        Ok(())
    }

    /// Every run row was fed: a run the entries describe but no row holds was deleted.
    pub fn finish(self) -> Result<VerifyReport> {
        if let Some((run_id, (seq, _))) = self.expected.into_iter().next() {
            return Err(broken(
                Some(seq),
                Some(&run_id),
                "run row is missing (deleted)",
            ));
        }
        let (head_seq, head_hash) = self.head.expect("end_of_chain is called before finish");
        Ok(VerifyReport {
            entries: self.entries,
            runs: self.runs,
            first_seq: self.first_seq,
            head_seq,
            head_hash,
        })
    }
}

/// One run's place in the chain, as `prune` sees it.
pub(crate) struct RunSpan {
    pub run_id: String,
    /// Finished before the cutoff (so it may be removed).
    pub eligible: bool,
    pub min_seq: i64,
    pub max_seq: i64,
}

/// Where `prune` cuts the chain: the largest seq such that every entry at or below it
/// belongs to a run being removed (or to no run), and the runs removed. A run straddling
/// the cut is kept, which lowers the cut; iterate to the fixed point.
pub(crate) fn prune_cut(spans: &[RunSpan], head: i64) -> (i64, Vec<&str>) {
    let mut cut = head;
    loop {
        let lowered = spans
            .iter()
            .filter(|s| !s.eligible || s.max_seq > cut)
            .map(|s| s.min_seq - 1)
            .fold(cut, i64::min);
        if lowered == cut {
            break;
        }
        cut = lowered;
    }
    let doomed = spans
        .iter()
        .filter(|s| s.eligible && s.max_seq <= cut)
        .map(|s| s.run_id.as_str())
        .collect();
    (cut, doomed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn span(id: &str, eligible: bool, min_seq: i64, max_seq: i64) -> RunSpan {
        RunSpan {
            run_id: id.into(),
            eligible,
            min_seq,
            max_seq,
        }
    }

    #[test]
    fn a_run_straddling_the_cut_keeps_the_runs_after_it() {
        // a: 1..=2 old; b: 3..=6 young; c: 4..=5 old but inside b's span.
        let spans = [
            span("a", true, 1, 2),
            span("b", false, 3, 6),
            span("c", true, 4, 5),
        ];
        assert_eq!(prune_cut(&spans, 6), (2, vec!["a"]));
        assert_eq!(prune_cut(&spans[..1], 2), (2, vec!["a"]));
        assert_eq!(
            prune_cut(&[span("b", false, 1, 2)], 2).1,
            Vec::<&str>::new()
        );
    }
}
