//! The policy layer's records (docs/policy.md): requests waiting for an approver
//! (`pending_approval`), their decisions, and the capability-review records a policy
//! denial leaves. Every change is also an entry of the audit chain (no run id: an
//! approval is not a run), so who decided what, when and why is tamper-evident like the
//! runs. The decisions themselves (who may approve, for how long) are airlock-policy's;
//! this module stores what was decided and refuses a change of a request that is no
//! longer in the state the caller saw.

use crate::{append_entry, now_ms, parse_json_col, Result, Store, StoreError};
use rusqlite::{params, OptionalExtension};
use serde::Serialize;
use serde_json::{json, Value};

pub const STATUS_PENDING: &str = "pending_approval";
pub const STATUS_APPROVED: &str = "approved";
pub const STATUS_DENIED: &str = "denied";
pub const STATUS_EXPIRED: &str = "expired";
/// A request-scoped approval after the run it approved started.
pub const STATUS_USED: &str = "used";

pub mod kinds {
    pub const APPROVAL_REQUEST: &str = "approval.request";
    pub const APPROVAL_DECISION: &str = "approval.decision";
    pub const APPROVAL_EXPIRED: &str = "approval.expired";
    pub const APPROVAL_USED: &str = "approval.used";
    pub const CAPABILITY_REVIEW: &str = "capability.review";
}

/// A request that needs an approval, as the policy layer hands it over.
#[derive(Debug, Clone, Serialize)]
pub struct NewApproval {
    pub workload_class: String,
    /// `uid:N` or `tenant:NAME`.
    pub requester: String,
    pub argv: Vec<String>,
    pub asked: Value,
    /// The items needing approval, as the policy layer describes them.
    pub what: Value,
    /// The capability keys the items stand for (what a class-scoped approval covers).
    pub capability_keys: Vec<String>,
    /// Identifies the request (class, argv, asked, requester) for a request-scoped use.
    pub fingerprint: String,
    pub expires_at: i64,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ApprovalRecord {
    pub approval_id: String,
    pub created_at: i64,
    pub expires_at: i64,
    pub workload_class: String,
    pub requester: String,
    pub argv: Vec<String>,
    pub asked: Value,
    pub what: Value,
    pub capability_keys: Vec<String>,
    pub fingerprint: String,
    pub status: String,
    pub decided_by: Option<String>,
    pub decided_at: Option<i64>,
    pub reason: Option<String>,
    pub scope: Option<String>,
    pub grant_expires_at: Option<i64>,
    pub used_at: Option<i64>,
}

/// An approver's decision on one pending request.
#[derive(Debug, Clone, Serialize)]
pub struct ApprovalDecision {
    pub approve: bool,
    pub decided_by: String,
    pub reason: String,
    /// `request` or `class_capability` (approvals only).
    pub scope: Option<String>,
    pub grant_expires_at: Option<i64>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ReviewRecord {
    pub review_id: String,
    pub created_at: i64,
    pub run_id: Option<String>,
    pub workload_class: String,
    pub requester: String,
    pub argv: Vec<String>,
    pub asked: Value,
    pub reason_code: String,
    pub detail: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct NewReview {
    pub run_id: Option<String>,
    pub workload_class: String,
    pub requester: String,
    pub argv: Vec<String>,
    pub asked: Value,
    pub reason_code: String,
    pub detail: String,
}

const APPROVAL_COLUMNS: &str = "approval_id, created_at, expires_at, workload_class, requester, \
    argv_json, asked_json, what_json, capability_keys_json, fingerprint, status, decided_by, \
    decided_at, reason, scope, grant_expires_at, used_at";

fn approval_from_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<ApprovalRecord> {
    let strings = |v: Value| -> Vec<String> { serde_json::from_value(v).unwrap_or_default() };
    Ok(ApprovalRecord {
        approval_id: r.get(0)?,
        created_at: r.get(1)?,
        expires_at: r.get(2)?,
        workload_class: r.get(3)?,
        requester: r.get(4)?,
        argv: strings(parse_json_col(r.get(5)?)),
        asked: parse_json_col(r.get(6)?),
        what: parse_json_col(r.get(7)?),
        capability_keys: strings(parse_json_col(r.get(8)?)),
        fingerprint: r.get(9)?,
        status: r.get(10)?,
        decided_by: r.get(11)?,
        decided_at: r.get(12)?,
        reason: r.get(13)?,
        scope: r.get(14)?,
        grant_expires_at: r.get(15)?,
        used_at: r.get(16)?,
    })
}

fn new_id() -> String {
    uuid::Uuid::now_v7().hyphenated().to_string()
}

impl Store {
    /// Stores a request as `pending_approval` until `expires_at` (and its audit entry).
    pub fn create_approval(&self, new: NewApproval) -> Result<ApprovalRecord> {
        let id = new_id();
        let at = now_ms();
        self.write_tx(|c| {
            let body = json!({"approval_id": id, "at": at, "request": new});
            append_entry(c, None, kinds::APPROVAL_REQUEST, at, &body)?;
            c.execute(
                "INSERT INTO approvals (approval_id, created_at, expires_at, workload_class,
                    requester, argv_json, asked_json, what_json, capability_keys_json,
                    fingerprint, status)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
                params![
                    id,
                    at,
                    new.expires_at,
                    new.workload_class,
                    new.requester,
                    json!(new.argv).to_string(),
                    new.asked.to_string(),
                    new.what.to_string(),
                    json!(new.capability_keys).to_string(),
                    new.fingerprint,
                    STATUS_PENDING,
                ],
            )?;
            Ok(())
        })?;
        self.approval(&id)?
            .ok_or_else(|| StoreError::InvalidInput(format!("approval {id} vanished")))
    }

    pub fn approval(&self, id: &str) -> Result<Option<ApprovalRecord>> {
        let sql = format!("SELECT {APPROVAL_COLUMNS} FROM approvals WHERE approval_id = ?1");
        self.conn
            .query_row(&sql, [id], approval_from_row)
            .optional()
            .map_err(|e| self.ctx(e.into()))
    }

    /// Approvals with `status` (all when `None`), oldest first.
    pub fn list_approvals(&self, status: Option<&str>) -> Result<Vec<ApprovalRecord>> {
        let sql = format!(
            "SELECT {APPROVAL_COLUMNS} FROM approvals WHERE ?1 IS NULL OR status = ?1
             ORDER BY created_at, approval_id"
        );
        let run = || -> rusqlite::Result<Vec<ApprovalRecord>> {
            let mut stmt = self.conn.prepare(&sql)?;
            let rows = stmt.query_map([status], approval_from_row)?;
            rows.collect()
        };
        run().map_err(|e| self.ctx(e.into()))
    }

    /// Marks every pending request past its deadline `expired` (one audit entry each);
    /// returns how many.
    pub fn expire_approvals(&self, now: i64) -> Result<usize> {
        self.write_tx(|c| {
            let ids: Vec<String> = c
                .prepare(
                    "SELECT approval_id FROM approvals WHERE status = ?1 AND expires_at <= ?2",
                )?
                .query_map(params![STATUS_PENDING, now], |r| r.get(0))?
                .collect::<rusqlite::Result<_>>()?;
            for id in &ids {
                c.execute(
                    "UPDATE approvals SET status = ?2 WHERE approval_id = ?1",
                    params![id, STATUS_EXPIRED],
                )?;
                let body = json!({"approval_id": id, "at": now, "status": STATUS_EXPIRED});
                append_entry(c, None, kinds::APPROVAL_EXPIRED, now, &body)?;
            }
            Ok(ids.len())
        })
    }

    /// Records an approver's decision on a request that is still pending and before its
    /// deadline at `now`; `None` when it is not (decided meanwhile, or expired).
    pub fn decide_approval(
        &self,
        id: &str,
        decision: &ApprovalDecision,
        now: i64,
    ) -> Result<Option<ApprovalRecord>> {
        let status = if decision.approve {
            STATUS_APPROVED
        } else {
            STATUS_DENIED
        };
        let changed = self.write_tx(|c| {
            let n = c.execute(
                "UPDATE approvals SET status = ?2, decided_by = ?3, decided_at = ?4, reason = ?5,
                    scope = ?6, grant_expires_at = ?7
                 WHERE approval_id = ?1 AND status = ?8 AND expires_at > ?4",
                params![
                    id,
                    status,
                    decision.decided_by,
                    now,
                    decision.reason,
                    decision.scope,
                    decision.grant_expires_at,
                    STATUS_PENDING,
                ],
            )?;
            if n == 1 {
                let body =
                    json!({"approval_id": id, "at": now, "status": status, "decision": decision});
                append_entry(c, None, kinds::APPROVAL_DECISION, now, &body)?;
            }
            Ok(n == 1)
        })?;
        if !changed {
            return Ok(None);
        }
        self.approval(id)
    }

    /// Spends a request-scoped approval on the run it approved: it must be approved, of
    /// this fingerprint and not past its grant. False when it is not (used already,
    /// expired, another request's).
    pub fn use_approval(&self, id: &str, fingerprint: &str, now: i64) -> Result<bool> {
        self.write_tx(|c| {
            let n = c.execute(
                "UPDATE approvals SET status = ?2, used_at = ?4
                 WHERE approval_id = ?1 AND status = ?3 AND scope = 'request'
                   AND fingerprint = ?5 AND grant_expires_at > ?4",
                params![id, STATUS_USED, STATUS_APPROVED, now, fingerprint],
            )?;
            if n == 1 {
                let body = json!({"approval_id": id, "at": now, "status": STATUS_USED});
                append_entry(c, None, kinds::APPROVAL_USED, now, &body)?;
            }
            Ok(n == 1)
        })
    }

    /// Approvals of `class` scoped to its capabilities that still hold at `now`.
    pub fn capability_grants(&self, class: &str, now: i64) -> Result<Vec<ApprovalRecord>> {
        Ok(self
            .list_approvals(Some(STATUS_APPROVED))?
            .into_iter()
            .filter(|a| {
                a.workload_class == class
                    && a.scope.as_deref() == Some("class_capability")
                    && a.grant_expires_at.is_some_and(|t| t > now)
            })
            .collect())
    }

    /// Leaves a capability-review record of a policy denial (and its audit entry).
    pub fn record_review(&self, new: NewReview) -> Result<String> {
        let id = new_id();
        let at = now_ms();
        self.write_tx(|c| {
            let body = json!({"review_id": id, "at": at, "review": new});
            append_entry(c, None, kinds::CAPABILITY_REVIEW, at, &body)?;
            c.execute(
                "INSERT INTO capability_reviews (review_id, created_at, run_id, workload_class,
                    requester, argv_json, asked_json, reason_code, detail)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
                params![
                    id,
                    at,
                    new.run_id,
                    new.workload_class,
                    new.requester,
                    json!(new.argv).to_string(),
                    new.asked.to_string(),
                    new.reason_code,
                    new.detail,
                ],
            )?;
            Ok(())
        })?;
        Ok(id)
    }

    pub fn list_reviews(&self) -> Result<Vec<ReviewRecord>> {
        let run = || -> rusqlite::Result<Vec<ReviewRecord>> {
            let mut stmt = self.conn.prepare(
                "SELECT review_id, created_at, run_id, workload_class, requester, argv_json,
                        asked_json, reason_code, detail
                 FROM capability_reviews ORDER BY created_at, review_id",
            )?;
            let rows = stmt.query_map([], |r| {
                Ok(ReviewRecord {
                    review_id: r.get(0)?,
                    created_at: r.get(1)?,
                    run_id: r.get(2)?,
                    workload_class: r.get(3)?,
                    requester: r.get(4)?,
                    argv: serde_json::from_value(parse_json_col(r.get(5)?)).unwrap_or_default(),
                    asked: parse_json_col(r.get(6)?),
                    reason_code: r.get(7)?,
                    detail: r.get(8)?,
                })
            })?;
            rows.collect()
        };
        run().map_err(|e| self.ctx(e.into()))
    }

    /// Appends an event to a run known only by its id (a finished one too): the policy
    /// layer's `policy.decision` after the engine completed the record. The body holds no
    /// secret values (the caller's to ensure: it is not redacted).
    pub fn append_run_event(&self, run_id: &str, kind: &str, body: Value) -> Result<()> {
        crate::check_event_kind(kind)?;
        let at = now_ms();
        if let Some(fleet) = &self.fleet {
            return fleet.append_event(run_id, kind, at, &body);
        }
        self.write_tx(|c| {
            let exists: Option<i64> = c
                .query_row("SELECT 1 FROM runs WHERE run_id = ?1", [run_id], |r| {
                    r.get(0)
                })
                .optional()?;
            if exists.is_none() {
                return Err(StoreError::RunNotFound(run_id.to_string()));
            }
            append_entry(c, Some(run_id), kind, at, &body)?;
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store() -> (tempfile::TempDir, Store) {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("state")).unwrap();
        (dir, store)
    }

    fn pending(store: &Store, expires_at: i64) -> ApprovalRecord {
        store
            .create_approval(NewApproval {
                workload_class: "repo-tests".into(),
                requester: "tenant:agent".into(),
                argv: vec!["make".into()],
                asked: json!({"domains": ["files.test"]}),
                what: json!([{"kind": "domain", "domain": "files.test"}]),
                capability_keys: vec!["domain:files.test".into()],
                fingerprint: "f1".into(),
                expires_at,
            })
            .unwrap()
    }

    fn approve(scope: &str, until: i64) -> ApprovalDecision {
        ApprovalDecision {
            approve: true,
            decided_by: "uid:0".into(),
            reason: "ok".into(),
            scope: Some(scope.into()),
            grant_expires_at: Some(until),
        }
    }

    #[test]
    fn a_pending_request_is_decided_once_and_every_step_is_in_the_chain() {
        let (_dir, store) = store();
        let far = now_ms() + 60_000;
        let request = pending(&store, far);
        assert_eq!(request.status, STATUS_PENDING);
        let decided =
            store.decide_approval(&request.approval_id, &approve("request", far), now_ms());
        assert_eq!(decided.unwrap().unwrap().status, STATUS_APPROVED);
        let again = store.decide_approval(&request.approval_id, &approve("request", far), now_ms());
        assert!(
            again.unwrap().is_none(),
            "a decided request is not decided twice"
        );
        assert!(!store
            .use_approval(&request.approval_id, "other", now_ms())
            .unwrap());
        assert!(store
            .use_approval(&request.approval_id, "f1", now_ms())
            .unwrap());
        assert!(
            !store
                .use_approval(&request.approval_id, "f1", now_ms())
                .unwrap(),
            "single use"
        );
        let report = store.verify().unwrap();
        assert_eq!(report.entries, 3);
    }

    #[test]
    fn a_request_past_its_deadline_expires_and_cannot_be_decided() {
        let (_dir, store) = store();
        let now = now_ms();
        let request = pending(&store, now + 10);
        assert!(store
            .decide_approval(
                &request.approval_id,
                &approve("request", now + 99),
                now + 10
            )
            .unwrap()
            .is_none());
        assert_eq!(store.expire_approvals(now + 10).unwrap(), 1);
        assert_eq!(
            store
                .approval(&request.approval_id)
                .unwrap()
                .unwrap()
                .status,
            STATUS_EXPIRED
        );
        store.verify().unwrap();
    }

    #[test]
    fn capability_grants_hold_only_for_their_class_until_they_expire() {
        let (_dir, store) = store();
        let now = now_ms();
        let request = pending(&store, now + 60_000);
        store
            .decide_approval(
                &request.approval_id,
                &approve("class_capability", now + 1000),
                now,
            )
            .unwrap();
        assert_eq!(store.capability_grants("repo-tests", now).unwrap().len(), 1);
        assert!(store
            .capability_grants("repo-tests", now + 1000)
            .unwrap()
            .is_empty());
        assert!(store.capability_grants("other", now).unwrap().is_empty());
    }

    #[test]
    fn reviews_are_listed_and_chained() {
        let (_dir, store) = store();
        store
            .record_review(NewReview {
                run_id: None,
                workload_class: "c".into(),
                requester: "uid:0".into(),
                argv: vec!["rm".into()],
                asked: json!({}),
                reason_code: "policy.command_forbidden".into(),
                detail: "rm -rf /".into(),
            })
            .unwrap();
        let reviews = store.list_reviews().unwrap();
        assert_eq!(reviews[0].reason_code, "policy.command_forbidden");
        store.verify().unwrap();
    }
}
