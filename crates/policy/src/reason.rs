//! Why a request was denied: one enum, each variant with a stable code that records,
//! figures (`airlock stats`) and callers match on. Codes never change meaning; a new
//! reason gets a new code.

use serde::Serialize;

/// A denial: the reason and what it concerns (a domain, a figure, a command).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Denial {
    pub reason: DenyReason,
    /// What the reason is about, for people: `"memory_mb 4096 > 2048"`, `"rm -rf /"`.
    pub detail: String,
}

impl Denial {
    pub fn new(reason: DenyReason, detail: impl Into<String>) -> Denial {
        Denial {
            reason,
            detail: detail.into(),
        }
    }

    pub fn code(&self) -> &'static str {
        self.reason.code()
    }
}

impl std::fmt::Display for Denial {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.code(), self.detail)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(into = "&'static str")]
pub enum DenyReason {
    /// The class allows only its registered tools and the command is none of them.
    CodeExecutionNotAllowed,
    /// The request names no command.
    CommandMissing,
    /// A command (or a command of a shell script) matches a `forbidden` rule, or the
    /// class's default is `forbidden` for it.
    CommandForbidden,
    MemoryAboveClass,
    CpuAboveClass,
    ProcessesAboveClass,
    WallTimeAboveClass,
    OutputAboveClass,
    DomainNotInClass,
    CredentialNotInClass,
    InputNotInClass,
    InputTargetNotAllowed,
    TtyNotAllowed,
    ExecInWritableNotAllowed,
    SessionNotAllowed,
    SessionLifetimeAboveClass,
    /// The contract generated from the template and the grant breaks a contract rule
    /// (a malformed domain, say): nothing is run.
    RequestInvalid,
    /// An approver refused the request.
    ApprovalDenied,
    /// The request waited for an approval longer than the class allows.
    ApprovalExpired,
    /// An install the class allows only from a lockfile of hashes (`npm ci`) comes
    /// without one, or with one that leaves a package unpinned.
    LockfileMissing,
    /// A command of a class session that the command policy routes to an approver:
    /// approvals cover requests, not commands of an open session, so it is refused.
    CommandNeedsApproval,
    /// The request asks for a weaker isolation tier than the class requires.
    IsolationBelowClass,
}

impl DenyReason {
    pub const ALL: [DenyReason; 22] = [
        DenyReason::CodeExecutionNotAllowed,
        DenyReason::CommandMissing,
        DenyReason::CommandForbidden,
        DenyReason::MemoryAboveClass,
        DenyReason::CpuAboveClass,
        DenyReason::ProcessesAboveClass,
        DenyReason::WallTimeAboveClass,
        DenyReason::OutputAboveClass,
        DenyReason::DomainNotInClass,
        DenyReason::CredentialNotInClass,
        DenyReason::InputNotInClass,
        DenyReason::InputTargetNotAllowed,
        DenyReason::TtyNotAllowed,
        DenyReason::ExecInWritableNotAllowed,
        DenyReason::SessionNotAllowed,
        DenyReason::SessionLifetimeAboveClass,
        DenyReason::RequestInvalid,
        DenyReason::ApprovalDenied,
        DenyReason::ApprovalExpired,
        DenyReason::LockfileMissing,
        DenyReason::CommandNeedsApproval,
        DenyReason::IsolationBelowClass,
    ];

    pub const fn code(self) -> &'static str {
        match self {
            DenyReason::CodeExecutionNotAllowed => "policy.code_execution_not_allowed",
            DenyReason::CommandMissing => "policy.command_missing",
            DenyReason::CommandForbidden => "policy.command_forbidden",
            DenyReason::MemoryAboveClass => "policy.memory_above_class",
            DenyReason::CpuAboveClass => "policy.cpu_above_class",
            DenyReason::ProcessesAboveClass => "policy.processes_above_class",
            DenyReason::WallTimeAboveClass => "policy.wall_time_above_class",
            DenyReason::OutputAboveClass => "policy.output_above_class",
            DenyReason::DomainNotInClass => "policy.domain_not_in_class",
            DenyReason::CredentialNotInClass => "policy.credential_not_in_class",
            DenyReason::InputNotInClass => "policy.input_not_in_class",
            DenyReason::InputTargetNotAllowed => "policy.input_target_not_allowed",
            DenyReason::TtyNotAllowed => "policy.tty_not_allowed",
            DenyReason::ExecInWritableNotAllowed => "policy.exec_in_writable_not_allowed",
            DenyReason::SessionNotAllowed => "policy.session_not_allowed",
            DenyReason::SessionLifetimeAboveClass => "policy.session_lifetime_above_class",
            DenyReason::RequestInvalid => "policy.request_invalid",
            DenyReason::ApprovalDenied => "policy.approval_denied",
            DenyReason::ApprovalExpired => "policy.approval_expired",
            DenyReason::LockfileMissing => "policy.lockfile_missing",
            DenyReason::CommandNeedsApproval => "policy.command_needs_approval",
            DenyReason::IsolationBelowClass => "policy.isolation_below_class",
        }
    }
}

impl From<DenyReason> for &'static str {
    fn from(reason: DenyReason) -> &'static str {
        reason.code()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_reason_has_its_own_code_under_policy() {
        let mut codes: Vec<_> = DenyReason::ALL.iter().map(|r| r.code()).collect();
        assert!(codes.iter().all(|c| c.starts_with("policy.")));
        codes.sort();
        codes.dedup();
        assert_eq!(codes.len(), DenyReason::ALL.len());
    }

    #[test]
    fn a_denial_serialises_its_code() {
        let denial = Denial::new(DenyReason::MemoryAboveClass, "memory_mb 9 > 8");
        let json = serde_json::to_value(&denial).unwrap();
        assert_eq!(json["reason"], "policy.memory_above_class");
        assert_eq!(
            denial.to_string(),
            "policy.memory_above_class: memory_mb 9 > 8"
        );
    }
}
