//! The plan's system call policy as the spec's `linux.seccomp`: runsc (`--oci-seccomp`)
//! compiles it into the filter gVisor's kernel applies to the payload's calls, so the
//! calls airlock denies natively are denied inside the Sentry too (`unshare`, `mount`,
//! `ptrace`, `io_uring_setup`, TIOCSTI, ... which the Sentry would otherwise serve).
//!
//! The policy is the one the native program is compiled from
//! (`airlock_contract::seccomp::default_policy`, or a custom profile's policy as compile
//! parsed and hardened it: `SeccompPlan::custom_policy`); the translation keeps its
//! meaning:
//! - a syscall's conditional rules come first, in their order, then one entry with its
//!   `otherwise` action: runsc tries a syscall's entries in order, the first match wins
//!   (as the native program's "first matching rule, else otherwise");
//! - a 32-bit comparison (an `int` argument: the kernel, and gVisor's, reads only the low
//!   32 bits) is a masked comparison of the low 32 bits, so high bits cannot dodge it;
//!   an ordering comparison of 32 bits has no such form and is refused (fail closed).
//!
//! What differs, measured with Debian 12's runsc: the errno of a denial with a specific
//! errno after conditional rules of the same call is the default's (`EPERM`) rather than
//! the rule's (`socket` of a refused family is `EPERM`, not `EAFNOSUPPORT`): still denied.

use crate::OciError;
use airlock_contract::seccomp::{
    compile, default_policy, program_sha256, ArgCondition, ArgOp, SeccompAction, SeccompPolicy,
    X86_64_SYSCALLS,
};
use airlock_contract::{CellPlan, SeccompProfile};
use oci_spec::runtime::{
    Arch, LinuxSeccomp, LinuxSeccompAction, LinuxSeccompArg, LinuxSeccompArgBuilder,
    LinuxSeccompBuilder, LinuxSeccompOperator, LinuxSyscall, LinuxSyscallBuilder,
};
use std::collections::BTreeMap;

/// The low 32 bits of an argument.
const LOW_32: u64 = 0xffff_ffff;

/// Names runsc's own syscall table gives a call, where they differ from Linux's. runsc
/// looks each name of an entry up in that table and skips a name it does not know (a
/// warning in its log, runsc/specutils/seccomp), so a call named only by its Linux name
/// would fall to the default action. Measured with Debian 12's runsc: `pselect6` under
/// the translated default policy was `EPERM` (Python's `select.select`, bash's
/// readline) while `select`, `poll` and `ppoll` ran; its table names the call `pselect`.
/// An entry names both: a runsc that knows one skips the other.
const RUNSC_NAMES: &[(&str, &str)] = &[("pselect6", "pselect")];

/// The spec's seccomp section for `plan`: the default policy, or the contract's custom
/// profile as compile hardened it. A custom policy is translated only if it compiles to
/// the program the plan names (its sha256): a plan without it (one read back) or with
/// another is refused rather than run with a filter the record does not name.
pub fn plan_seccomp(plan: &CellPlan) -> Result<LinuxSeccomp, OciError> {
    let path = match &plan.seccomp.profile {
        SeccompProfile::Default => return policy_seccomp(&default_policy()),
        SeccompProfile::DockerJson { path } => path.display(),
    };
    let refused = |why: &str| OciError::Seccomp(format!("the custom profile {path}: {why}"));
    let policy = plan
        .seccomp
        .custom_policy
        .as_ref()
        .ok_or_else(|| refused("the plan carries no policy compiled from it"))?;
    let program = compile(policy).map_err(|e| refused(&e))?;
    if program_sha256(&program) != plan.seccomp.filter.sha256 {
        return Err(refused(
            "its policy does not compile to the program the plan names",
        ));
    }
    policy_seccomp(policy)
}

/// `policy` as OCI seccomp entries: every conditional rule (per syscall, in order), then
/// each syscall's `otherwise`, grouped by action.
pub fn policy_seccomp(policy: &SeccompPolicy) -> Result<LinuxSeccomp, OciError> {
    let mut conditional = Vec::new();
    let mut otherwise: BTreeMap<(u8, u16), Vec<String>> = BTreeMap::new();
    for (nr, rules) in &policy.syscalls {
        let name = syscall_name(*nr)?;
        for rule in &rules.rules {
            let args = rule
                .conditions
                .iter()
                .map(|c| arg(name, c))
                .collect::<Result<Vec<_>, _>>()?;
            conditional.push(entry(oci_names(name), rule.action, Some(args))?);
        }
        otherwise
            .entry(action_key(rules.otherwise))
            .or_default()
            .extend(oci_names(name));
    }
    let mut syscalls = conditional;
    for (key, names) in otherwise {
        syscalls.push(entry(names, action_of_key(key), None)?);
    }
    let (default_action, default_errno) = action(policy.default_action);
    let mut builder = LinuxSeccompBuilder::default()
        .default_action(default_action)
        .architectures(vec![Arch::ScmpArchX86_64])
        .syscalls(syscalls);
    if let Some(errno) = default_errno {
        builder = builder.default_errno_ret(errno);
    }
    Ok(builder.build()?)
}

/// The names an entry gives a call: its Linux name, and runsc's where it differs.
fn oci_names(name: &str) -> Vec<String> {
    let runsc = RUNSC_NAMES.iter().filter(|(linux, _)| *linux == name);
    std::iter::once(name)
        .chain(runsc.map(|(_, own)| *own))
        .map(str::to_string)
        .collect()
}

fn syscall_name(nr: u32) -> Result<&'static str, OciError> {
    X86_64_SYSCALLS
        .iter()
        .find(|(_, n)| *n == nr)
        .map(|(name, _)| *name)
        .ok_or_else(|| OciError::Seccomp(format!("syscall number {nr} has no x86_64 name")))
}

fn entry(
    names: Vec<String>,
    seccomp_action: SeccompAction,
    args: Option<Vec<LinuxSeccompArg>>,
) -> Result<LinuxSyscall, OciError> {
    let (action, errno) = action(seccomp_action);
    let mut builder = LinuxSyscallBuilder::default().names(names).action(action);
    if let Some(errno) = errno {
        builder = builder.errno_ret(errno);
    }
    if let Some(args) = args {
        builder = builder.args(args);
    }
    Ok(builder.build()?)
}

fn action(action: SeccompAction) -> (LinuxSeccompAction, Option<u32>) {
    match action {
        SeccompAction::Allow => (LinuxSeccompAction::ScmpActAllow, None),
        SeccompAction::Errno(errno) => (LinuxSeccompAction::ScmpActErrno, Some(u32::from(errno))),
        SeccompAction::KillProcess => (LinuxSeccompAction::ScmpActKillProcess, None),
    }
}

/// An ordering key for grouping by action (`SeccompAction` is not `Ord`).
fn action_key(action: SeccompAction) -> (u8, u16) {
    match action {
        SeccompAction::Allow => (0, 0),
        SeccompAction::Errno(errno) => (1, errno),
        SeccompAction::KillProcess => (2, 0),
    }
}

fn action_of_key(key: (u8, u16)) -> SeccompAction {
    match key {
        (0, _) => SeccompAction::Allow,
        (1, errno) => SeccompAction::Errno(errno),
        _ => SeccompAction::KillProcess,
    }
}

fn arg(name: &str, condition: &ArgCondition) -> Result<LinuxSeccompArg, OciError> {
    use LinuxSeccompOperator as Op;
    let (op, value, value_two) = match (condition.op, condition.width32) {
        (ArgOp::Eq, true) => (Op::ScmpCmpMaskedEq, LOW_32, Some(condition.value & LOW_32)),
        (ArgOp::MaskedEq(mask), true) => {
            (Op::ScmpCmpMaskedEq, mask & LOW_32, Some(condition.value))
        }
        (ArgOp::MaskedEq(mask), false) => (Op::ScmpCmpMaskedEq, mask, Some(condition.value)),
        (op, false) => (ordering(op), condition.value, None),
        (op, true) => {
            return Err(OciError::Seccomp(format!(
                "{name}: a 32-bit {op:?} comparison of argument {} has no OCI form",
                condition.index
            )))
        }
    };
    let mut builder = LinuxSeccompArgBuilder::default()
        .index(usize::from(condition.index))
        .value(value)
        .op(op);
    if let Some(two) = value_two {
        builder = builder.value_two(two);
    }
    Ok(builder.build()?)
}

fn ordering(op: ArgOp) -> LinuxSeccompOperator {
    use LinuxSeccompOperator as Op;
    match op {
        ArgOp::Eq => Op::ScmpCmpEq,
        ArgOp::Ne => Op::ScmpCmpNe,
        ArgOp::Lt => Op::ScmpCmpLt,
        ArgOp::Le => Op::ScmpCmpLe,
        ArgOp::Gt => Op::ScmpCmpGt,
        ArgOp::Ge => Op::ScmpCmpGe,
        ArgOp::MaskedEq(_) => Op::ScmpCmpMaskedEq,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use airlock_contract::seccomp::syscall_number;
    use airlock_contract::PlanTransfer;

    fn entries_for<'a>(seccomp: &'a LinuxSeccomp, name: &str) -> Vec<&'a LinuxSyscall> {
        seccomp
            .syscalls()
            .as_ref()
            .unwrap()
            .iter()
            .filter(|s| s.names().iter().any(|n| n == name))
            .collect()
    }

    #[test]
    fn the_default_policy_translates_with_its_rules_first_and_32_bit_masks() {
        let seccomp = policy_seccomp(&default_policy()).unwrap();
        assert_eq!(seccomp.default_action(), LinuxSeccompAction::ScmpActErrno);
        assert_eq!(seccomp.default_errno_ret(), Some(1), "EPERM");
        // ioctl: TIOCSTI and TIOCLINUX denied on the low 32 bits of the request, then
        // everything else allowed.
        let ioctl = entries_for(&seccomp, "ioctl");
        assert_eq!(ioctl.len(), 3, "{ioctl:?}");
        let tiocsti = ioctl[0].args().as_ref().unwrap()[0];
        assert_eq!(tiocsti.index(), 1);
        assert_eq!(tiocsti.op(), LinuxSeccompOperator::ScmpCmpMaskedEq);
        assert_eq!(tiocsti.value(), LOW_32);
        assert_eq!(tiocsti.value_two(), Some(0x5412));
        assert_eq!(ioctl[0].action(), LinuxSeccompAction::ScmpActErrno);
        assert_eq!(ioctl[2].action(), LinuxSeccompAction::ScmpActAllow);
        assert!(ioctl[2].args().is_none());
        // clone: allowed only without namespace flags, denied otherwise.
        let clone = entries_for(&seccomp, "clone");
        assert_eq!(clone.len(), 2);
        assert_eq!(clone[0].action(), LinuxSeccompAction::ScmpActAllow);
        assert_eq!(
            clone[0].args().as_ref().unwrap()[0].op(),
            LinuxSeccompOperator::ScmpCmpMaskedEq
        );
        assert_eq!(clone[1].action(), LinuxSeccompAction::ScmpActErrno);
        // Each conditional entry of a call precedes its unconditional one.
        let all = seccomp.syscalls().as_ref().unwrap();
        let last_conditional = all.iter().rposition(|s| s.args().is_some()).unwrap();
        let first_plain = all.iter().position(|s| s.args().is_none()).unwrap();
        assert!(last_conditional < first_plain);
        // What airlock denies natively is denied here: not allowed by any entry.
        for name in [
            "unshare",
            "mount",
            "ptrace",
            "io_uring_setup",
            "chroot",
            "bpf",
        ] {
            assert!(syscall_number(name).is_some(), "{name}");
            for e in entries_for(&seccomp, name) {
                assert_ne!(e.action(), LinuxSeccompAction::ScmpActAllow, "{name}");
            }
        }
        assert!(!entries_for(&seccomp, "read").is_empty());
        // pselect6 is allowed under runsc's own name too.
        let pselect = entries_for(&seccomp, "pselect");
        assert_eq!(pselect.len(), 1);
        assert_eq!(pselect[0].action(), LinuxSeccompAction::ScmpActAllow);
        assert!(pselect[0].names().iter().any(|n| n == "pselect6"));
    }

    fn custom_plan() -> CellPlan {
        let contract = airlock_contract::parse_contract(
            "seccomp_profile: p.json\n",
            airlock_contract::ContractFormat::Yaml,
        )
        .unwrap();
        let argv = ["true".to_string()];
        let mut input = airlock_contract::CompileInput::new(std::path::Path::new("/"), &argv);
        input.seccomp_profile = Some(
            r#"{"defaultAction": "SCMP_ACT_ALLOW", "syscalls": [
                {"names": ["mkdir"], "action": "SCMP_ACT_ERRNO", "errnoRet": 13}]}"#,
        );
        airlock_contract::compile(&contract, &input).unwrap()
    }

    #[test]
    fn a_custom_profile_is_its_own_policy_and_only_the_one_the_plan_names() {
        let plan = custom_plan();
        let seccomp = plan_seccomp(&plan).unwrap();
        assert_eq!(seccomp.default_action(), LinuxSeccompAction::ScmpActAllow);
        let mkdir = entries_for(&seccomp, "mkdir");
        assert_eq!(mkdir.len(), 1);
        assert_eq!(mkdir[0].errno_ret(), Some(13), "the profile's errno");
        // The hardening comes with it.
        assert_ne!(
            entries_for(&seccomp, "unshare")[0].action(),
            LinuxSeccompAction::ScmpActAllow
        );
        // Read back without its policy, or with another one: refused, never the default.
        let mut without = plan.clone();
        without.seccomp.custom_policy = None;
        assert!(plan_seccomp(&without).is_err());
        let mut other = plan.clone();
        let policy = other.seccomp.custom_policy.as_mut().unwrap();
        policy.syscalls.remove(&syscall_number("mkdir").unwrap());
        let err = plan_seccomp(&other).unwrap_err();
        assert!(err.to_string().contains("does not compile to"), "{err}");
        // The policy travels with the plan to the cell factory.
        let back: airlock_contract::PlanTransfer =
            serde_json::from_slice(&serde_json::to_vec(&PlanTransfer::of(&plan)).unwrap()).unwrap();
        assert!(plan_seccomp(&back.into_plan()).is_ok());
    }

    #[test]
    fn a_32_bit_ordering_comparison_is_refused_not_widened() {
        let mut policy = default_policy();
        let nr = syscall_number("personality").unwrap();
        let rules = policy.syscalls.get_mut(&nr).unwrap();
        rules.rules[0].conditions[0].op = ArgOp::Lt;
        let err = policy_seccomp(&policy).unwrap_err();
        assert!(err.to_string().contains("personality"), "{err}");
    }
}
