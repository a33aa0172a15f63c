//! Workload classes and approvals on the service: `GET /v1/approvals`, `POST
//! /v1/approvals/{id}`, and `POST /v1/runs` naming a `class`. The policy layer itself
//! (the classes, the approvals' rules and store) is the binary's
//! (crates/airlock/src/class.rs, crates/airlock/src/approvals.rs); it is handed in as a
//! [`ClassPolicy`], so the service only maps identities and answers.

use crate::error::{ApiError, ErrorBody};
use crate::state::Path;
use crate::state::{ApiJson, Caller, Shared};
use crate::tenants::Tenant;
use airlock_cell::report::{ResultClass, RunReport};
use airlock_contract::Contract;
use airlock_policy::approval::{Identity, Scope};
use airlock_policy::Asked;
use airlock_store::approvals::ApprovalRecord;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::sync::Arc;

/// The policy layer the service asks (implemented by the binary over the operator's
/// classes and the audit store). Every method may block (store access).
pub trait ClassPolicy: Send + Sync {
    /// The workload classes the operator defined (`[policy.classes]`): the only class
    /// names `/metrics` shows as they are. None by default: every class is `unknown`.
    fn class_names(&self) -> Vec<String> {
        Vec::new()
    }
    /// Requests waiting for a decision now, as `viewer` may see them: an approver every
    /// request, anyone else its own.
    fn pending(&self, viewer: &Identity) -> Result<Vec<ApprovalRecord>, PolicyRefusal>;
    /// Records `approver`'s decision on request `id`.
    fn decide(
        &self,
        id: &str,
        approver: &Identity,
        decision: &Decision,
    ) -> Result<ApprovalRecord, PolicyRefusal>;
    /// Evaluates a run request against its class: the contract to run, or why not
    /// (a denial is recorded by the policy layer; a request needing approval is stored
    /// pending).
    fn plan_run(&self, request: ClassRequest) -> Result<ClassGrant, PolicyRefusal>;
    /// After a run of a named or inline contract (no class) whose record is complete:
    /// keeps a suspected escape's evidence (`writable_copy`, where the completion
    /// sequence copied its writable paths) as for a class run and flags `requester`,
    /// or removes the copy of a run that was none.
    fn after_contract_run(
        &self,
        report: &RunReport,
        workload_class: &str,
        requester: &Identity,
        writable_copy: Option<&std::path::Path>,
    );
    /// Evaluates opening a session of a class (its capabilities; no command yet): the
    /// contract and lifetime, or why not, as for [`ClassPolicy::plan_run`].
    fn plan_session(&self, request: ClassRequest) -> Result<SessionGrant, PolicyRefusal>;
    /// Checks one command of a class session against its class before it reaches the
    /// cell; a refusal is recorded (a `policy_denied` run of the session's tenant).
    fn check_session_command(
        &self,
        session: &ClassSession,
        requester: &Identity,
        argv: &[String],
    ) -> Result<(), PolicyRefusal>;
    /// Decides a change of a class session's destinations within its class. A denial
    /// or a pending approval is recorded by the policy layer; a grant is recorded in the
    /// session's record when the caller reports it applied ([`NetworkGrant::applied`]).
    fn change_network(
        &self,
        session: &ClassSession,
        request: NetworkRequest,
    ) -> Result<NetworkGrant, PolicyRefusal>;
}

/// A granted session request: its contract, its lifetime, and what the policy layer
/// records once the session's record exists (the `policy.decision` event).
pub struct SessionGrant {
    pub contract: Contract,
    pub base_dir: PathBuf,
    pub lifetime_seconds: u64,
    pub opened: Box<dyn FnOnce(&str) + Send>,
}

/// A session opened from a class, as the policy layer is told of it.
#[derive(Debug, Clone)]
pub struct ClassSession {
    pub class: String,
    /// The session's own run id: its record carries the network decisions.
    pub session_id: String,
    pub tenant: String,
    /// The destinations its proxy allows now.
    pub domains: Vec<String>,
}

/// A change of a session's destinations, as asked.
pub struct NetworkRequest {
    pub requester: Identity,
    pub change: airlock_policy::NetworkChange,
    /// The approval (its id) of exactly this change, once decided.
    pub approval: Option<String>,
}

/// A granted change: the session's whole list and its proxy rules once applied.
pub struct NetworkGrant {
    pub domains: Vec<String>,
    pub rules: Vec<airlock_contract::DestinationRule>,
    pub applied: Applied,
}

/// Records a granted change's outcome in the session's record: applied (`None`) or why
/// not.
pub type Applied = Box<dyn FnOnce(Option<&str>) + Send>;

/// One run request naming a class.
pub struct ClassRequest {
    pub class: String,
    pub requester: Identity,
    /// The tenant the run is recorded for.
    pub tenant: String,
    pub argv: Vec<String>,
    pub asked: Asked,
    /// The approval (its id) the request comes back with.
    pub approval: Option<String>,
}

/// A granted request: its generated contract, and what the policy layer records once
/// the run's record is complete (the `policy.decision` event, a quarantine).
pub struct ClassGrant {
    pub contract: Contract,
    pub base_dir: PathBuf,
    pub after_run: AfterRun,
}

/// Called with the completed run's report and, for a suspected escape, where the
/// completion sequence copied the cell's writable paths.
pub type AfterRun = Box<dyn FnOnce(&RunReport, Option<&std::path::Path>) + Send>;

/// Why the policy layer did not give what was asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PolicyRefusal {
    /// The request is stored waiting for an approver: 202 with its id.
    Pending {
        approval_id: String,
        needs: Vec<String>,
    },
    /// Denied (recorded as run `run_id`): 403.
    Denied {
        code: String,
        message: String,
        run_id: Option<String>,
    },
    /// The caller may not do this (not an approver, its own request): 403.
    Forbidden {
        code: String,
        message: String,
    },
    NotFound {
        code: String,
        message: String,
    },
    /// The approval is no longer decidable (decided, expired): 409.
    Conflict {
        code: String,
        message: String,
    },
    /// The request itself is wrong: 400.
    Invalid {
        code: String,
        message: String,
    },
    Fault {
        code: String,
        message: String,
    },
}

/// `POST /v1/approvals/{id}`: an approver's decision.
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Decision {
    /// `approve` or `deny`.
    pub decision: DecisionKind,
    /// Why (kept in the audit chain).
    #[serde(default)]
    pub reason: String,
    /// `request` (this request, once; the default) or `class_capability` (its
    /// capabilities for every request of the class, for `for_seconds`).
    #[serde(default = "default_scope")]
    #[schema(value_type = String)]
    pub scope: Scope,
    /// How long the approval holds (at most the class's `max_grant_seconds`).
    #[serde(default)]
    pub for_seconds: Option<u64>,
}

fn default_scope() -> Scope {
    Scope::Request
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum DecisionKind {
    Approve,
    Deny,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ApprovalList {
    #[schema(value_type = Vec<Object>)]
    pub approvals: Vec<ApprovalRecord>,
    /// Present when there are more: pass it as `cursor` for the next page.
    pub next_cursor: Option<String>,
}

/// The answer to a run request that needs approval (202).
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct PendingApproval {
    /// Always `pending_approval`.
    pub status: String,
    pub approval_id: String,
    /// The capabilities that need approval (`domain:files.test`, ...).
    pub needs: Vec<String>,
}

/// The identity a tenant decides and requests as: the operator (uid 0 on the unix
/// socket) is `uid:0`, every other tenant `tenant:NAME` whether it came by key or by
/// uid, so that neither way lets it approve its own request.
pub fn identity_of(tenant: &Tenant) -> Identity {
    if tenant.operator {
        Identity::Uid(0)
    } else {
        Identity::Tenant(tenant.name.clone())
    }
}

impl PolicyRefusal {
    pub fn into_api_error(self) -> ApiError {
        let denied = ResultClass::PolicyDenied;
        let (status, class, code, message, run_id) = match self {
            PolicyRefusal::Pending { approval_id, .. } => (
                StatusCode::ACCEPTED,
                denied,
                "policy.needs_approval".to_string(),
                format!("pending approval {approval_id}"),
                None,
            ),
            PolicyRefusal::Denied {
                code,
                message,
                run_id,
            } => (StatusCode::FORBIDDEN, denied, code, message, run_id),
            PolicyRefusal::Forbidden { code, message } => {
                (StatusCode::FORBIDDEN, denied, code, message, None)
            }
            PolicyRefusal::NotFound { code, message } => {
                (StatusCode::NOT_FOUND, denied, code, message, None)
            }
            PolicyRefusal::Conflict { code, message } => {
                (StatusCode::CONFLICT, denied, code, message, None)
            }
            PolicyRefusal::Invalid { code, message } => {
                (StatusCode::BAD_REQUEST, denied, code, message, None)
            }
            PolicyRefusal::Fault { code, message } => (
                StatusCode::INTERNAL_SERVER_ERROR,
                ResultClass::RuntimeFault,
                code,
                message,
                None,
            ),
        };
        let mut error = ApiError::new(status, class, &code, message);
        error.body.run_id = run_id;
        error
    }
}

fn policy_of(state: &Shared) -> Result<Arc<dyn ClassPolicy>, ApiError> {
    state.policy.clone().ok_or_else(|| {
        ApiError::new(
            StatusCode::NOT_FOUND,
            ResultClass::PolicyDenied,
            "policy.not_configured",
            "the service has no workload classes configured ([policy])".into(),
        )
    })
}

/// Runs a blocking call of the policy layer off the runtime.
pub async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, PolicyRefusal> + Send + 'static,
) -> Result<T, PolicyRefusal> {
    tokio::task::spawn_blocking(f).await.unwrap_or_else(|err| {
        Err(PolicyRefusal::Fault {
            code: "server.task".into(),
            message: err.to_string(),
        })
    })
}

#[utoipa::path(get, path = "/v1/approvals", params(crate::api::PageQuery),
    responses((status = 200, description = "Requests waiting for a decision, by id", body = ApprovalList),
        (status = 400, description = "`cursor.invalid`, `limit.zero`, `query.invalid` (a limit over 1000)", body = ErrorBody),
        (status = 401, body = ErrorBody)))]
pub async fn list_approvals(
    State(state): State<Shared>,
    Caller(tenant): Caller,
    axum::extract::Query(query): axum::extract::Query<crate::api::PageQuery>,
) -> Result<Response, ApiError> {
    let limit = crate::page::limit(query.limit)?;
    let after = query
        .cursor
        .as_deref()
        .map(|c| crate::page::decode_cursor("approvals", c))
        .transpose()?;
    let policy = policy_of(&state)?;
    let identity = identity_of(&tenant);
    let mut listed = blocking(move || policy.pending(&identity))
        .await
        .map_err(PolicyRefusal::into_api_error)?;
    listed.sort_by(|a, b| a.approval_id.cmp(&b.approval_id));
    let mut page = crate::page::Page::new("approvals", limit, &[]);
    let mut last: Option<String> = None;
    let mut more = false;
    for record in listed.iter().filter(|r| {
        after
            .as_ref()
            .is_none_or(|a| r.approval_id.as_str() > a.as_str())
    }) {
        if !page.push(record)? {
            more = true;
            break;
        }
        last = Some(record.approval_id.clone());
    }
    let next = more
        .then(|| last.map(|id| crate::page::encode_cursor("approvals", &id)))
        .flatten();
    Ok(page.finish(next))
}

#[utoipa::path(post, path = "/v1/approvals/{id}", request_body = Decision,
    params(("id" = String, Path, description = "Approval id")),
    responses((status = 200, description = "The decided approval", body = Object),
        (status = 401, body = ErrorBody),
        (status = 403, description = "Not an approver (`approval.not_an_approver`), or the requester itself (`approval.self_approval`)", body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 409, description = "Decided already or expired", body = ErrorBody)))]
pub async fn decide_approval(
    State(state): State<Shared>,
    Caller(tenant): Caller,
    Path(id): Path<String>,
    ApiJson(decision): ApiJson<Decision>,
) -> Result<Json<ApprovalRecord>, ApiError> {
    let policy = policy_of(&state)?;
    let approver = identity_of(&tenant);
    let record = blocking(move || policy.decide(&id, &approver, &decision))
        .await
        .map_err(PolicyRefusal::into_api_error)?;
    Ok(Json(record))
}

/// The answer to a refusal of the policy layer: 202 with the pending approval's id, or
/// the refusal with its code (counted in the metrics under `class`).
pub fn refusal_response(
    state: &Shared,
    tenant: &Tenant,
    class: &str,
    refusal: PolicyRefusal,
) -> Response {
    // Waiting for an approver is no denial.
    if let Some(code) = denial_code(&refusal) {
        state.metrics.deny(class, &tenant.name, code);
    }
    match refusal {
        PolicyRefusal::Pending { approval_id, needs } => {
            let body = PendingApproval {
                status: "pending_approval".into(),
                approval_id,
                needs,
            };
            (StatusCode::ACCEPTED, Json(body)).into_response()
        }
        refusal => refusal.into_api_error().into_response(),
    }
}

/// The policy step of `POST /v1/sessions` with a `class`.
pub async fn plan_class_session(
    state: &Shared,
    tenant: &Tenant,
    class: &str,
    asked: Asked,
    approval: Option<String>,
) -> Result<SessionGrant, Response> {
    let policy = policy_of(state).map_err(IntoResponse::into_response)?;
    let request = ClassRequest {
        class: class.to_string(),
        requester: identity_of(tenant),
        tenant: tenant.name.clone(),
        argv: Vec::new(),
        asked,
        approval,
    };
    blocking(move || policy.plan_session(request))
        .await
        .map_err(|refusal| refusal_response(state, tenant, class, refusal))
}

/// The policy layer, or 404 `policy.not_configured`.
pub fn configured_policy(state: &Shared) -> Result<Arc<dyn ClassPolicy>, ApiError> {
    policy_of(state)
}

/// The policy step of `POST /v1/runs` with a `class`: the contract, or the answer (202
/// with the pending approval's id, or the refusal).
pub async fn plan_class_run(
    state: &Shared,
    tenant: &Tenant,
    class: &str,
    argv: &[String],
    asked: Asked,
    approval: Option<String>,
) -> Result<ClassGrant, Response> {
    let policy = policy_of(state).map_err(IntoResponse::into_response)?;
    let request = ClassRequest {
        class: class.to_string(),
        requester: identity_of(tenant),
        tenant: tenant.name.clone(),
        argv: argv.to_vec(),
        asked,
        approval,
    };
    blocking(move || policy.plan_run(request))
        .await
        .map_err(|refusal| refusal_response(state, tenant, class, refusal))
}

/// The reason code a refusal counts under in the metrics; none for a pending request.
fn denial_code(refusal: &PolicyRefusal) -> Option<&str> {
    match refusal {
        PolicyRefusal::Pending { .. } => None,
        PolicyRefusal::Denied { code, .. }
        | PolicyRefusal::Forbidden { code, .. }
        | PolicyRefusal::NotFound { code, .. }
        | PolicyRefusal::Conflict { code, .. }
        | PolicyRefusal::Invalid { code, .. }
        | PolicyRefusal::Fault { code, .. } => Some(code),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tenant_is_the_same_identity_by_key_or_by_uid_and_the_operator_is_uid_0() {
        let alice = Tenant {
            name: "alice".into(),
            operator: false,
        };
        assert_eq!(identity_of(&alice), Identity::Tenant("alice".into()));
        let operator = Tenant {
            name: "operator".into(),
            operator: true,
        };
        assert_eq!(identity_of(&operator), Identity::Uid(0));
    }

    #[test]
    fn a_pending_request_answers_202_and_a_self_approval_403_with_its_code() {
        let pending = PolicyRefusal::Pending {
            approval_id: "a1".into(),
            needs: vec!["domain:x.test".into()],
        };
        assert_eq!(pending.into_api_error().status, StatusCode::ACCEPTED);
        let own = PolicyRefusal::Forbidden {
            code: "approval.self_approval".into(),
            message: "tenant:a made this request".into(),
        }
        .into_api_error();
        assert_eq!(own.status, StatusCode::FORBIDDEN);
        assert_eq!(own.body.reason, "approval.self_approval");
    }

    #[test]
    fn a_decision_defaults_to_this_request_only() {
        let decision: Decision = serde_json::from_str(r#"{"decision":"approve"}"#).unwrap();
        assert_eq!(decision.scope, Scope::Request);
        assert!(serde_json::from_str::<Decision>(r#"{"decision":"maybe"}"#).is_err());
    }
}
