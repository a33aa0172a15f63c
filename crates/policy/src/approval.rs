//! Who may decide an approval, and what an approval covers. Pure; the store keeps the
//! requests and decisions, the binary and the service call these.

use crate::PolicyError;
use serde::{Deserialize, Serialize};

/// An identity: a local uid (what `airlock` sees as the caller) or a tenant the service
/// authenticated.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(into = "String", try_from = "String")]
pub enum Identity {
    Uid(u32),
    Tenant(String),
}

impl Identity {
    pub fn parse(text: &str) -> Result<Identity, PolicyError> {
        let bad = || PolicyError::Approver(text.to_string());
        match text.split_once(':') {
            Some(("uid", n)) => n.parse().map(Identity::Uid).map_err(|_| bad()),
            Some(("tenant", name)) if !name.is_empty() && !name.contains(char::is_whitespace) => {
                Ok(Identity::Tenant(name.to_string()))
            }
            _ => Err(bad()),
        }
    }
}

impl std::fmt::Display for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Identity::Uid(uid) => write!(f, "uid:{uid}"),
            Identity::Tenant(name) => write!(f, "tenant:{name}"),
        }
    }
}

impl From<Identity> for String {
    fn from(identity: Identity) -> String {
        identity.to_string()
    }
}

impl TryFrom<String> for Identity {
    type Error = PolicyError;
    fn try_from(text: String) -> Result<Identity, PolicyError> {
        Identity::parse(&text)
    }
}

/// What an approval covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Scope {
    /// This request only, once.
    Request,
    /// The request's capabilities for every request of its class, until it expires.
    ClassCapability,
}

impl Scope {
    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Request => "request",
            Scope::ClassCapability => "class_capability",
        }
    }

    pub fn parse(text: &str) -> Option<Scope> {
        match text {
            "request" => Some(Scope::Request),
            "class_capability" => Some(Scope::ClassCapability),
            _ => None,
        }
    }
}

/// Why an identity may not decide a request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("approval.not_an_approver: {0} is not one of the configured approvers")]
    NotAnApprover(String),
    #[error("approval.self_approval: {0} made this request and cannot decide it")]
    SelfApproval(String),
    #[error("approval.not_pending: the request is {0}")]
    NotPending(String),
    #[error("approval.expired: the request waited past its deadline")]
    Expired,
    #[error("approval.grant_too_long: {asked} s > the class's {max} s")]
    GrantTooLong { asked: u64, max: u64 },
}

impl Refusal {
    pub fn code(&self) -> &'static str {
        match self {
            Refusal::NotAnApprover(_) => "approval.not_an_approver",
            Refusal::SelfApproval(_) => "approval.self_approval",
            Refusal::NotPending(_) => "approval.not_pending",
            Refusal::Expired => "approval.expired",
            Refusal::GrantTooLong { .. } => "approval.grant_too_long",
        }
    }
}

/// Whether `approver` may decide a request `requester` made: a configured approver, and
/// never the requester itself (so a tenant, and the model acting as it, cannot approve
/// its own request even when it is also an approver).
pub fn authorize(
    approver: &Identity,
    requester: &Identity,
    approvers: &[String],
) -> Result<(), Refusal> {
    if approver == requester {
        return Err(Refusal::SelfApproval(approver.to_string()));
    }
    let listed = approvers
        .iter()
        .any(|a| Identity::parse(a).is_ok_and(|a| &a == approver));
    if !listed {
        return Err(Refusal::NotAnApprover(approver.to_string()));
    }
    Ok(())
}

/// Whether a pending request may still be decided at `now_ms`.
pub fn decidable(status: &str, expires_at_ms: i64, now_ms: i64) -> Result<(), Refusal> {
    if status != "pending_approval" {
        return Err(Refusal::NotPending(status.to_string()));
    }
    if now_ms >= expires_at_ms {
        return Err(Refusal::Expired);
    }
    Ok(())
}

/// How long an approval lasts: a request-scoped one as long as the request may wait; a
/// class-scoped one as asked, at most the class's `max_grant_seconds`.
pub fn grant_seconds(
    scope: Scope,
    asked: Option<u64>,
    rules: &crate::ApprovalRules,
) -> Result<u64, Refusal> {
    let wanted = asked.unwrap_or(match scope {
        Scope::Request => rules.pending_seconds,
        Scope::ClassCapability => rules.max_grant_seconds,
    });
    if scope == Scope::ClassCapability && wanted > rules.max_grant_seconds {
        return Err(Refusal::GrantTooLong {
            asked: wanted,
            max: rules.max_grant_seconds,
        });
    }
    Ok(wanted.max(1))
}

/// Whether the capability keys `granted` cover every item `needed` (by [`crate::ApprovalItem::key`]).
pub fn covers(granted: &[String], needed: &[crate::ApprovalItem]) -> bool {
    needed.iter().all(|item| granted.contains(&item.key()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identities_parse_and_print_the_same() {
        assert_eq!(Identity::parse("uid:0").unwrap(), Identity::Uid(0));
        assert_eq!(
            Identity::parse("tenant:agent-7").unwrap().to_string(),
            "tenant:agent-7"
        );
        for bad in ["0", "uid:x", "tenant:", "user:alice", "tenant:a b"] {
            assert!(Identity::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_requester_cannot_approve_its_own_request_even_as_an_approver() {
        let approvers = vec!["uid:0".to_string(), "tenant:agent-7".to_string()];
        let me = Identity::Uid(0);
        assert_eq!(
            authorize(&me, &me, &approvers),
            Err(Refusal::SelfApproval("uid:0".into()))
        );
        let tenant = Identity::Tenant("agent-7".into());
        assert!(authorize(&tenant, &tenant, &approvers).is_err());
        assert_eq!(authorize(&me, &tenant, &approvers), Ok(()));
    }

    #[test]
    fn only_configured_approvers_decide() {
        let refused = authorize(
            &Identity::Uid(1000),
            &Identity::Uid(1001),
            &["uid:0".into()],
        );
        assert_eq!(refused.unwrap_err().code(), "approval.not_an_approver");
    }

    #[test]
    fn a_request_is_decidable_only_while_pending_and_before_its_deadline() {
        assert_eq!(decidable("pending_approval", 100, 99), Ok(()));
        assert_eq!(
            decidable("pending_approval", 100, 100),
            Err(Refusal::Expired)
        );
        assert_eq!(
            decidable("approved", 100, 1).unwrap_err().code(),
            "approval.not_pending"
        );
    }

    #[test]
    fn a_class_scoped_approval_lasts_at_most_the_classs_maximum() {
        let rules = crate::ApprovalRules {
            pending_seconds: 60,
            max_grant_seconds: 3600,
        };
        assert_eq!(grant_seconds(Scope::Request, None, &rules), Ok(60));
        assert_eq!(
            grant_seconds(Scope::ClassCapability, None, &rules),
            Ok(3600)
        );
        assert_eq!(
            grant_seconds(Scope::ClassCapability, Some(10), &rules),
            Ok(10)
        );
        assert_eq!(
            grant_seconds(Scope::ClassCapability, Some(3601), &rules)
                .unwrap_err()
                .code(),
            "approval.grant_too_long"
        );
    }

    #[test]
    fn a_grant_covers_a_request_only_when_it_holds_every_needed_key() {
        let needed = vec![
            crate::ApprovalItem::Domain {
                domain: "pkg.test".into(),
            },
            crate::ApprovalItem::Credential {
                name: "TOKEN".into(),
            },
        ];
        assert!(covers(
            &["domain:pkg.test".into(), "credential:TOKEN".into()],
            &needed
        ));
        assert!(!covers(&["domain:pkg.test".into()], &needed));
    }
}
