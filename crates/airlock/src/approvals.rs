//! Approvals: a request the policy says needs one waits in `pending_approval` for a
//! bounded time (the class's `approvals.pending_seconds`); a configured approver, never
//! the requester, approves (for this request only, or for the capability in the class
//! for a time) or denies it, with a reason. Every step is an audit entry (the store).
//! [`list_pending`] and [`decide`] are what `airlock approvals` and the service's
//! `GET /v1/approvals`, `POST /v1/approvals/{id}` call.

use crate::class::{ClassStop, LoadedClass, Request};
use crate::config::OperatorConfig;
use airlock_policy::approval::{self, Identity, Scope};
use airlock_policy::{ApprovalItem, Asked, Denial, DenyReason};
use airlock_policy::{NetworkChange, NetworkEvaluation};
use airlock_server::approvals::{
    ClassGrant as ServiceGrant, ClassPolicy, ClassRequest, ClassSession, Decision, DecisionKind,
    NetworkGrant, NetworkRequest, PolicyRefusal, SessionGrant,
};
use airlock_store::approvals::{
    ApprovalDecision, ApprovalRecord, NewApproval, STATUS_APPROVED, STATUS_DENIED, STATUS_EXPIRED,
    STATUS_PENDING,
};
use airlock_store::{Store, StoreError, StoreLocation};
use clap::{Args, Subcommand};
use serde_json::json;
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// Requests waiting for a decision now (those past their deadline are expired first).
pub fn list_pending(store: &Store, now: i64) -> Result<Vec<ApprovalRecord>, StoreError> {
    store.expire_approvals(now)?;
    store.list_approvals(Some(STATUS_PENDING))
}

/// An approver's choice.
#[derive(Debug, Clone)]
pub struct Choice {
    pub approve: bool,
    pub reason: String,
    pub scope: Scope,
    /// How long the approval lasts (default: the class's); ignored for a denial.
    pub for_seconds: Option<u64>,
}

/// Why a decision was not recorded.
#[derive(Debug)]
pub enum DecideError {
    NotFound(String),
    /// The class of the request is no longer configured: nothing bounds the grant.
    UnknownClass(String),
    Refused(approval::Refusal),
    Store(StoreError),
}

impl DecideError {
    /// A stable code for callers (the service maps it to an HTTP status).
    pub fn code(&self) -> &'static str {
        match self {
            DecideError::NotFound(_) => "approval.not_found",
            DecideError::UnknownClass(_) => "approval.unknown_class",
            DecideError::Refused(refusal) => refusal.code(),
            DecideError::Store(_) => "approval.store",
        }
    }
}

impl std::fmt::Display for DecideError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let code = self.code();
        match self {
            DecideError::NotFound(id) => write!(f, "{code}: no approval {id}"),
            DecideError::UnknownClass(class) => {
                write!(f, "{code}: class {class} is not configured")
            }
            // The refusal's text starts with its code.
            DecideError::Refused(refusal) => write!(f, "{refusal}"),
            DecideError::Store(err) => write!(f, "{code}: {err}"),
        }
    }
}

/// Records `approver`'s choice on request `id`: only a configured approver who is not
/// the requester, only while it is pending and before its deadline, and a class-scoped
/// approval no longer than the class allows.
pub fn decide(
    store: &Store,
    approvers: &[String],
    classes: &BTreeMap<String, LoadedClass>,
    id: &str,
    approver: &Identity,
    choice: &Choice,
    now: i64,
) -> Result<ApprovalRecord, DecideError> {
    store.expire_approvals(now).map_err(DecideError::Store)?;
    let record = store
        .approval(id)
        .map_err(DecideError::Store)?
        .ok_or_else(|| DecideError::NotFound(id.to_string()))?;
    approval::decidable(&record.status, record.expires_at, now).map_err(DecideError::Refused)?;
    let requester = Identity::parse(&record.requester).map_err(|_| {
        DecideError::Refused(approval::Refusal::NotAnApprover(record.requester.clone()))
    })?;
    approval::authorize(approver, &requester, approvers).map_err(DecideError::Refused)?;
    let class = classes
        .get(&record.workload_class)
        .ok_or_else(|| DecideError::UnknownClass(record.workload_class.clone()))?;
    let seconds = approval::grant_seconds(choice.scope, choice.for_seconds, &class.class.approvals)
        .map_err(DecideError::Refused)?;
    let decision = ApprovalDecision {
        approve: choice.approve,
        decided_by: approver.to_string(),
        reason: choice.reason.clone(),
        scope: choice.approve.then(|| choice.scope.as_str().to_string()),
        grant_expires_at: choice.approve.then(|| now + seconds as i64 * 1000),
    };
    store
        .decide_approval(id, &decision, now)
        .map_err(DecideError::Store)?
        .ok_or_else(|| {
            DecideError::Refused(approval::Refusal::NotPending("decided meanwhile".into()))
        })
}

/// Identifies one request: class, requester, command and what it asked for.
fn fingerprint(request: &Request<'_>, asked: &Asked) -> String {
    let text = json!([request.class, request.requester, request.argv, asked]).to_string();
    hex::encode(Sha256::digest(text.as_bytes()))
}

/// The approvals that let a request needing `what` run: the one named by `--approval`
/// (spent), or class-scoped approvals covering every item. Otherwise the request is
/// stored `pending_approval` and waited for (bounded by `--wait-approval` and its
/// deadline) or its id returned (exit 75).
pub fn approvals_for(
    request: &Request<'_>,
    loaded: &LoadedClass,
    (approval, wait_seconds): (Option<&str>, u64),
    what: &[ApprovalItem],
    asked: &Asked,
) -> Result<Vec<String>, ClassStop> {
    let fault = |err: StoreError| ClassStop::Usage(format!("audit store: {err}"));
    let store = Store::open(&request.store.state_dir).map_err(fault)?;
    let now = now_ms();
    store.expire_approvals(now).map_err(fault)?;
    let print = fingerprint(request, asked);
    if let Some(id) = approval {
        return spend(&store, request, asked, id, &print, now);
    }
    let grants = store.capability_grants(request.class, now).map_err(fault)?;
    let keys: Vec<String> = grants
        .iter()
        .flat_map(|g| g.capability_keys.clone())
        .collect();
    if approval::covers(&keys, what) {
        let needed: Vec<String> = what.iter().map(ApprovalItem::key).collect();
        let used = grants
            .iter()
            .filter(|g| g.capability_keys.iter().any(|k| needed.contains(k)));
        return Ok(used.map(|g| g.approval_id.clone()).collect());
    }
    let pending = store
        .create_approval(NewApproval {
            workload_class: request.class.to_string(),
            requester: request.requester.to_string(),
            argv: request.argv.to_vec(),
            asked: json!(asked),
            what: json!(what),
            capability_keys: what.iter().map(ApprovalItem::key).collect(),
            fingerprint: print.clone(),
            expires_at: now + loaded.class.approvals.pending_seconds as i64 * 1000,
        })
        .map_err(fault)?;
    wait_for(&store, request, asked, &pending, wait_seconds, &print)
}

fn pending_stop(record: &ApprovalRecord) -> ClassStop {
    ClassStop::Pending {
        approval_id: record.approval_id.clone(),
        needs: record.capability_keys.clone(),
    }
}

/// Waits (polling the store) until the request is decided, its deadline passes or
/// `seconds` are over.
fn wait_for(
    store: &Store,
    request: &Request<'_>,
    asked: &Asked,
    pending: &ApprovalRecord,
    seconds: u64,
    print: &str,
) -> Result<Vec<String>, ClassStop> {
    let until = Instant::now() + Duration::from_secs(seconds);
    loop {
        let now = now_ms();
        let _ = store.expire_approvals(now);
        let current = store.approval(&pending.approval_id).ok().flatten();
        let status = current
            .as_ref()
            .map_or(STATUS_EXPIRED, |c| c.status.as_str());
        if status != STATUS_PENDING {
            return spend(store, request, asked, &pending.approval_id, print, now);
        }
        if Instant::now() >= until {
            return Err(pending_stop(pending));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Uses approval `id` for this request: a request-scoped one is spent (once), a
/// class-scoped one must be of this class; denied or expired ends the request as a
/// recorded denial.
fn spend(
    store: &Store,
    request: &Request<'_>,
    asked: &Asked,
    id: &str,
    print: &str,
    now: i64,
) -> Result<Vec<String>, ClassStop> {
    let fault = |err: StoreError| ClassStop::Usage(format!("audit store: {err}"));
    let Some(record) = store.approval(id).map_err(fault)? else {
        return Err(ClassStop::Usage(format!("--approval: no approval {id}")));
    };
    if record.fingerprint != print && record.scope.as_deref() != Some("class_capability") {
        return Err(ClassStop::Usage(format!(
            "--approval {id} approves another request (class {}, {:?})",
            record.workload_class, record.argv
        )));
    }
    match record.status.as_str() {
        STATUS_PENDING => Err(pending_stop(&record)),
        STATUS_DENIED => {
            let detail = format!(
                "{id} denied by {}: {}",
                record.decided_by.unwrap_or_default(),
                record.reason.unwrap_or_default()
            );
            Err(request.deny(asked, &Denial::new(DenyReason::ApprovalDenied, detail)))
        }
        STATUS_APPROVED if record.scope.as_deref() == Some("class_capability") => {
            let holds = record.workload_class == request.class
                && record.grant_expires_at.is_some_and(|t| t > now);
            if holds {
                return Ok(vec![id.to_string()]);
            }
            Err(request.deny(
                asked,
                &Denial::new(DenyReason::ApprovalExpired, format!("{id} no longer holds")),
            ))
        }
        STATUS_APPROVED if store.use_approval(id, print, now).map_err(fault)? => {
            Ok(vec![id.to_string()])
        }
        status => Err(request.deny(
            asked,
            &Denial::new(
                DenyReason::ApprovalExpired,
                format!("{id} is {status}: approvals are single use and expire"),
            ),
        )),
    }
}

#[derive(Args)]
pub struct ApprovalsArgs {
    /// Operator configuration (`[policy] approvers`, the classes).
    #[arg(long, global = true)]
    config: Option<PathBuf>,
    /// Directory of the audit store.
    #[arg(long, global = true)]
    state_dir: Option<PathBuf>,
    #[command(subcommand)]
    command: ApprovalsCommand,
}

#[derive(Subcommand)]
enum ApprovalsCommand {
    /// Requests waiting for a decision (with --all: every request and its decision).
    List {
        #[arg(long)]
        all: bool,
        #[arg(long)]
        json: bool,
    },
    /// Approve a pending request, as this uid (a configured approver, not the requester).
    Approve {
        id: String,
        #[arg(long, default_value = "")]
        reason: String,
        /// `request` (this request, once) or `class_capability` (its capabilities for
        /// every request of the class, for --for seconds).
        #[arg(long, default_value = "request")]
        scope: String,
        /// How long the approval holds (at most the class's `max_grant_seconds`).
        #[arg(long = "for")]
        for_seconds: Option<u64>,
    },
    /// Deny a pending request, with the reason.
    Deny {
        id: String,
        #[arg(long)]
        reason: String,
    },
}

pub fn approvals_command(args: ApprovalsArgs) -> ExitCode {
    let result = (|| -> anyhow::Result<ExitCode> {
        let config = OperatorConfig::load(args.config.as_deref())?;
        let store = Store::open(&config.state_dir(args.state_dir.as_deref()))?;
        let now = now_ms();
        let (id, choice) = match args.command {
            ApprovalsCommand::List { all, json } => {
                let records = if all {
                    store.expire_approvals(now)?;
                    store.list_approvals(None)?
                } else {
                    list_pending(&store, now)?
                };
                print_approvals(&records, json)?;
                return Ok(ExitCode::SUCCESS);
            }
            ApprovalsCommand::Approve {
                id,
                reason,
                scope,
                for_seconds,
            } => {
                let scope = Scope::parse(&scope)
                    .ok_or_else(|| anyhow::anyhow!("--scope: `request` or `class_capability`"))?;
                (
                    id,
                    Choice {
                        approve: true,
                        reason,
                        scope,
                        for_seconds,
                    },
                )
            }
            ApprovalsCommand::Deny { id, reason } => (
                id,
                Choice {
                    approve: false,
                    reason,
                    scope: Scope::Request,
                    for_seconds: None,
                },
            ),
        };
        let classes = crate::class::load_classes(&config, args.config.as_deref())?;
        let approver = Identity::Uid(airlock_store::caller_uid().unwrap_or(u32::MAX));
        let approvers = &config.policy.approvers;
        match decide(&store, approvers, &classes, &id, &approver, &choice, now) {
            Ok(record) => {
                println!("{} {} by {}", record.approval_id, record.status, approver);
                Ok(ExitCode::SUCCESS)
            }
            Err(err) => {
                eprintln!("airlock: {err}");
                Ok(ExitCode::from(1))
            }
        }
    })();
    result.unwrap_or_else(|err| {
        eprintln!("airlock: {}", crate::user_message(&err));
        ExitCode::from(2)
    })
}

fn print_approvals(records: &[ApprovalRecord], json_output: bool) -> anyhow::Result<()> {
    if json_output {
        println!("{}", serde_json::to_string_pretty(records)?);
        return Ok(());
    }
    for r in records {
        println!(
            "{}  {:<16} {:<16} {:<14} {}  {:?}",
            r.approval_id,
            r.status,
            r.workload_class,
            r.requester,
            r.capability_keys.join(","),
            r.argv
        );
    }
    Ok(())
}

/// The policy layer as the service asks it (crates/server/src/approvals.rs): the
/// classes loaded once at start, the approvers, and the audit store of the state
/// directory.
pub struct ServicePolicy {
    pub classes: BTreeMap<String, LoadedClass>,
    pub approvers: Vec<String>,
    /// Approvals live in its state directory's file; runs where `[store] url` says.
    pub store: StoreLocation,
}

impl ServicePolicy {
    fn store(&self) -> Result<Store, PolicyRefusal> {
        Store::open(&self.store.state_dir).map_err(store_fault)
    }

    fn loaded(&self, class: &str) -> Result<&LoadedClass, PolicyRefusal> {
        self.classes
            .get(class)
            .ok_or_else(|| PolicyRefusal::Invalid {
                code: "class.unknown".into(),
                message: format!("no workload class {class:?}"),
            })
    }

    /// Appends `body` to run `run_id`'s record; a failure refuses what it records.
    fn record(
        &self,
        run_id: &str,
        kind: &str,
        body: serde_json::Value,
    ) -> Result<(), PolicyRefusal> {
        self.store()?
            .append_run_event(run_id, kind, body)
            .map_err(store_fault)
    }
}

/// What a class session's records say it was opened with (its placeholder argv, as a
/// contract session's record has).
const SESSION_ARGV: &str = "<session>";
/// What a network change's approval and denial records name as the command: the change
/// and the session it is for (an approval of one session's change covers no other).
const SESSION_NETWORK_ARGV: &str = "<session network>";

/// One decision on a session's destinations, as its `session.network` event says it.
struct NetworkEvent<'a> {
    session: &'a ClassSession,
    requester: &'a str,
    change: &'a NetworkChange,
}

impl NetworkEvent<'_> {
    fn body(&self, decision: &str, after: &[String]) -> serde_json::Value {
        json!({
            "decision": decision,
            "class": self.session.class,
            "requester": self.requester,
            "add": self.change.add,
            "remove": self.change.remove,
            "before": self.session.domains,
            "after": after,
        })
    }

    fn denied(&self, code: &str, message: &str, denial_run: Option<&str>) -> serde_json::Value {
        let mut body = self.body("deny", &self.session.domains);
        body["reason_code"] = json!(code);
        body["detail"] = json!(message);
        body["denial_run_id"] = json!(denial_run);
        body
    }
}

fn store_fault(err: StoreError) -> PolicyRefusal {
    PolicyRefusal::Fault {
        code: "store".into(),
        message: err.to_string(),
    }
}

/// How a refused decision answers over HTTP: the caller's identity is wrong (403), the
/// approval is no longer open (409), the decision itself is wrong (400).
fn refusal_of(err: DecideError) -> PolicyRefusal {
    let (code, message) = (err.code().to_string(), err.to_string());
    match err {
        DecideError::NotFound(_) => PolicyRefusal::NotFound { code, message },
        DecideError::Refused(
            approval::Refusal::SelfApproval(_) | approval::Refusal::NotAnApprover(_),
        ) => PolicyRefusal::Forbidden { code, message },
        DecideError::Refused(approval::Refusal::GrantTooLong { .. }) => {
            PolicyRefusal::Invalid { code, message }
        }
        DecideError::Refused(_) | DecideError::UnknownClass(_) => {
            PolicyRefusal::Conflict { code, message }
        }
        DecideError::Store(_) => PolicyRefusal::Fault { code, message },
    }
}

fn stop_refusal(stop: ClassStop) -> PolicyRefusal {
    match stop {
        ClassStop::Usage(message) => PolicyRefusal::Invalid {
            code: "policy.request_invalid".into(),
            message,
        },
        ClassStop::Denied {
            code,
            message,
            run_id,
        } => PolicyRefusal::Denied {
            code,
            message,
            run_id,
        },
        ClassStop::Pending { approval_id, needs } => PolicyRefusal::Pending { approval_id, needs },
    }
}

/// Whether `viewer` sees `record` among the pending requests: an approver sees every
/// one, anyone else only its own.
fn sees(viewer: &Identity, approvers: &[String], record: &ApprovalRecord) -> bool {
    record.requester == viewer.to_string()
        || approvers
            .iter()
            .any(|a| Identity::parse(a).is_ok_and(|a| &a == viewer))
}

impl ClassPolicy for ServicePolicy {
    fn class_names(&self) -> Vec<String> {
        self.classes.keys().cloned().collect()
    }

    fn pending(&self, viewer: &Identity) -> Result<Vec<ApprovalRecord>, PolicyRefusal> {
        let store = self.store()?;
        let pending = list_pending(&store, now_ms()).map_err(store_fault)?;
        Ok(pending
            .into_iter()
            .filter(|r| sees(viewer, &self.approvers, r))
            .collect())
    }

    fn decide(
        &self,
        id: &str,
        approver: &Identity,
        decision: &Decision,
    ) -> Result<ApprovalRecord, PolicyRefusal> {
        let store = self.store()?;
        let choice = Choice {
            approve: decision.decision == DecisionKind::Approve,
            reason: decision.reason.clone(),
            scope: decision.scope,
            for_seconds: decision.for_seconds,
        };
        let classes = &self.classes;
        decide(
            &store,
            &self.approvers,
            classes,
            id,
            approver,
            &choice,
            now_ms(),
        )
        .map_err(refusal_of)
    }

    fn plan_run(&self, request: ClassRequest) -> Result<ServiceGrant, PolicyRefusal> {
        let loaded = self.loaded(&request.class)?;
        let requester = request.requester.to_string();
        let decided = Request {
            class: &request.class,
            requester: &requester,
            argv: &request.argv,
            store: &self.store,
            tenant: Some(&request.tenant),
        };
        let approval = request.approval.as_deref();
        let grant = crate::class::decide_request(&decided, loaded, &request.asked, approval, 0)
            .map_err(stop_refusal)?;
        let (store, class) = (self.store.clone(), request.class.clone());
        Ok(ServiceGrant {
            contract: grant.contract.clone(),
            base_dir: grant.base_dir.clone(),
            after_run: Box::new(move |report, writable_copy| {
                let suspect = crate::quarantine::Suspect {
                    class: &class,
                    requester: String::new(),
                    credentials: Vec::new(),
                    writable_copy: writable_copy.map(PathBuf::from),
                };
                crate::class::after_run(&store, report, Some(&grant), suspect);
            }),
        })
    }

    fn after_contract_run(
        &self,
        report: &airlock_cell::report::RunReport,
        workload_class: &str,
        requester: &Identity,
        writable_copy: Option<&std::path::Path>,
    ) {
        let suspect = crate::quarantine::Suspect {
            class: workload_class,
            requester: requester.to_string(),
            credentials: Vec::new(),
            writable_copy: writable_copy.map(PathBuf::from),
        };
        crate::quarantine::preserve_if_suspected(&self.store, report, &suspect);
    }

    fn plan_session(&self, request: ClassRequest) -> Result<SessionGrant, PolicyRefusal> {
        let loaded = self.loaded(&request.class)?;
        let requester = request.requester.to_string();
        let argv = [SESSION_ARGV.to_string()];
        let decided = Request {
            class: &request.class,
            requester: &requester,
            argv: &argv,
            store: &self.store,
            tenant: Some(&request.tenant),
        };
        let approval = request.approval.as_deref();
        let grant = crate::class::decide_session(&decided, loaded, &request.asked, approval)
            .map_err(stop_refusal)?;
        let location = self.store.clone();
        let decision = grant.decision.clone();
        Ok(SessionGrant {
            lifetime_seconds: grant.session_lifetime_seconds.unwrap_or(0),
            contract: grant.contract,
            base_dir: grant.base_dir,
            opened: Box::new(move |session_id| {
                let recorded = Store::open_at(&location).and_then(|store| {
                    store.append_run_event(
                        session_id,
                        airlock_store::kinds::POLICY_DECISION,
                        decision,
                    )
                });
                if let Err(err) = recorded {
                    eprintln!(
                        "airlock: warning: the session's policy decision was not recorded: {err}"
                    );
                }
            }),
        })
    }

    fn check_session_command(
        &self,
        session: &ClassSession,
        requester: &Identity,
        argv: &[String],
    ) -> Result<(), PolicyRefusal> {
        let loaded = self.loaded(&session.class)?;
        let requester = requester.to_string();
        let decided = Request {
            class: &session.class,
            requester: &requester,
            argv,
            store: &self.store,
            tenant: Some(&session.tenant),
        };
        crate::class::check_session_command(&decided, loaded).map_err(stop_refusal)
    }

    fn change_network(
        &self,
        session: &ClassSession,
        request: NetworkRequest,
    ) -> Result<NetworkGrant, PolicyRefusal> {
        let loaded = self.loaded(&session.class)?;
        let requester = request.requester.to_string();
        let event = NetworkEvent {
            session,
            requester: &requester,
            change: &request.change,
        };
        let argv = [SESSION_NETWORK_ARGV.to_string(), session.session_id.clone()];
        let decided = Request {
            class: &session.class,
            requester: &requester,
            argv: &argv,
            store: &self.store,
            tenant: Some(&session.tenant),
        };
        let asked = Asked {
            domains: request.change.add.clone(),
            ..Asked::default()
        };
        let evaluation = airlock_policy::evaluate_network_change(
            &loaded.class,
            &session.domains,
            &request.change,
        );
        let (domains, approvals) = match evaluation {
            NetworkEvaluation::Granted { domains } => (domains, Vec::new()),
            NetworkEvaluation::Denied { reason } => {
                let stop = decided.deny(&asked, &reason);
                return Err(self.network_stop(&event, stop));
            }
            NetworkEvaluation::NeedsApproval { what, domains } => {
                let approval = (request.approval.as_deref(), 0);
                match approvals_for(&decided, loaded, approval, &what, &asked) {
                    Ok(used) => (domains, used),
                    Err(stop) => return Err(self.network_stop(&event, stop)),
                }
            }
        };
        let rules = airlock_policy::destination_rules(&domains).map_err(|denial| {
            PolicyRefusal::Invalid {
                code: denial.code().to_string(),
                message: denial.to_string(),
            }
        })?;
        let mut granted = event.body("grant", &domains);
        granted["approvals"] = json!(approvals);
        // Recorded before it applies: a change the chain does not show never happens.
        self.record(
            &session.session_id,
            airlock_store::kinds::SESSION_NETWORK,
            granted.clone(),
        )?;
        let location = self.store.clone();
        let session_id = session.session_id.clone();
        Ok(NetworkGrant {
            domains,
            rules,
            applied: Box::new(move |error| {
                let Some(error) = error else { return };
                granted["applied"] = json!(false);
                granted["error"] = json!(error);
                let recorded = Store::open_at(&location).and_then(|store| {
                    store.append_run_event(
                        &session_id,
                        airlock_store::kinds::SESSION_NETWORK,
                        granted,
                    )
                });
                if let Err(err) = recorded {
                    eprintln!("airlock: warning: a failed network change was not recorded: {err}");
                }
            }),
        })
    }
}

impl ServicePolicy {
    /// A change that goes no further: denied (its denial record and review are written
    /// by then) or pending, recorded in the session's record too.
    fn network_stop(&self, event: &NetworkEvent<'_>, stop: ClassStop) -> PolicyRefusal {
        let body = match &stop {
            ClassStop::Denied {
                code,
                message,
                run_id,
            } => Some(event.denied(code, message, run_id.as_deref())),
            ClassStop::Pending { approval_id, needs } => {
                let mut body = event.body("pending_approval", &event.session.domains);
                body["approval_id"] = json!(approval_id);
                body["needs"] = json!(needs);
                Some(body)
            }
            ClassStop::Usage(_) => None,
        };
        let refusal = stop_refusal(stop);
        let recorded = body.map_or(Ok(()), |body| {
            self.record(
                &event.session.session_id,
                airlock_store::kinds::SESSION_NETWORK,
                body,
            )
        });
        match recorded {
            Ok(()) => refusal,
            Err(fault) => fault,
        }
    }
}
