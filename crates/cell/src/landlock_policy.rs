//! Landlock rules matching the mount plan: the payload can read and execute the system
//! tree and inputs, write only its writable paths and device nodes, execute in a writable
//! path only where the plan allows it, and neither signal nor reach abstract unix sockets
//! outside the cell. Requires Landlock ABI 6 (Linux 6.12); anything less is refused, never
//! silently weakened.
//!
//! TCP is deliberately not restricted here. Landlock can only filter TCP by port, not by
//! address, and the cell's network namespace holds nothing but `lo`: every TCP connect
//! stays inside the cell, where the only listeners are the payload's own and (with an
//! allowlist) airlock's enforcing proxies. The namespace is the egress boundary; a port
//! filter on top of it would add nothing but break the payload's own test servers,
//! databases and kernels (docs/threat-model.md).

use crate::stage::Stage;
use airlock_contract::{CellPlan, MountPlan};
use landlock::{
    Access, AccessFs, BitFlags, CompatLevel, Compatible, PathBeneath, PathFd, Ruleset, RulesetAttr,
    RulesetCreatedAttr, RulesetStatus, Scope, ABI,
};
use std::path::Path;

/// The lowest ABI that has everything the cell relies on (fs rights and scopes).
pub const REQUIRED_ABI: ABI = ABI::V6;

fn unavailable(stage: &'static str, err: impl std::fmt::Display) -> Stage {
    Stage::unavailable(stage, err.to_string())
}

/// Every filesystem right of [`REQUIRED_ABI`] except execute.
fn all_but_execute() -> BitFlags<AccessFs> {
    AccessFs::from_all(REQUIRED_ABI) & !AccessFs::Execute
}

/// The path rules of `plan`, in order: a path without a rule gets no access at all.
/// `/dev/shm` is airlock's, not the contract's, and never executable.
pub fn fs_rules(plan: &CellPlan) -> Vec<(String, BitFlags<AccessFs>)> {
    let read_exec = AccessFs::ReadFile | AccessFs::ReadDir | AccessFs::Execute;
    let read = AccessFs::ReadFile | AccessFs::ReadDir;
    let device = AccessFs::ReadFile | AccessFs::WriteFile | AccessFs::IoctlDev;

    let mut rules: Vec<(String, BitFlags<AccessFs>)> = vec![
        ("/".into(), AccessFs::ReadDir.into()),
        ("/etc".into(), read),
        ("/proc".into(), read),
        // The cell's own cgroup, read-only (rootfs::prepare_cgroup_view).
        ("/sys/fs/cgroup".into(), read),
        ("/dev".into(), AccessFs::ReadDir.into()),
        ("/dev/pts".into(), device | AccessFs::ReadDir),
        ("/dev/shm".into(), all_but_execute()),
    ];
    for node in ["null", "zero", "full", "random", "urandom", "tty"] {
        rules.push((format!("/dev/{node}"), device));
    }
    for mount in &plan.mounts {
        let (path, access) = match mount {
            MountPlan::HostSystem { path, .. } => (path, read_exec),
            MountPlan::ReadonlyInput { target, .. } => (target, read_exec),
            MountPlan::WritableTmpfs { target, exec, .. } if *exec => {
                (target, AccessFs::from_all(REQUIRED_ABI))
            }
            MountPlan::WritableTmpfs { target, .. } => (target, all_but_execute()),
        };
        rules.push((path.display().to_string(), access));
    }
    rules
}

/// Applies the ruleset to the calling process (and so to everything it execs).
pub fn restrict(plan: &CellPlan) -> Result<(), Stage> {
    let ruleset = Ruleset::default()
        .set_compatibility(CompatLevel::HardRequirement)
        .handle_access(AccessFs::from_all(REQUIRED_ABI))
        .and_then(|r| r.scope(Scope::AbstractUnixSocket | Scope::Signal))
        .map_err(|e| unavailable("landlock.ruleset", e))?;
    let mut created = ruleset
        .create()
        .map_err(|e| unavailable("landlock.create", e))?;
    for (path, access) in fs_rules(plan) {
        // Paths of the plan that did not materialise (optional host dirs such as /lib32)
        // simply get no rule: no rule means no access.
        let Ok(fd) = PathFd::new(Path::new(&path)) else {
            continue;
        };
        // A rule on a file (an input file, a device node) may only carry file rights.
        let access = if Path::new(&path).is_dir() {
            access
        } else {
            access & AccessFs::from_file(REQUIRED_ABI)
        };
        created = created
            .add_rule(PathBeneath::new(fd, access))
            .map_err(|e| Stage::new("landlock.add_rule", format!("{path}: {e}")))?;
    }
    let status = created
        .restrict_self()
        .map_err(|e| unavailable("landlock.restrict_self", e))?;
    if status.ruleset != RulesetStatus::FullyEnforced {
        return Err(unavailable(
            "landlock.restrict_self",
            match status.ruleset {
                RulesetStatus::PartiallyEnforced => {
                    "the kernel enforced only part of the Landlock ruleset"
                }
                _ => "the kernel did not enforce the Landlock ruleset",
            },
        ));
    }
    Ok(())
}

/// The Landlock ABI of the running kernel (0 when unsupported).
pub fn kernel_abi() -> i64 {
    crate::sys::landlock_abi_version()
}

#[cfg(test)]
mod tests {
    use super::*;
    use airlock_contract::{compile, parse_contract, CompileInput, ContractFormat};

    fn plan(yaml: &str) -> CellPlan {
        let contract = parse_contract(yaml, ContractFormat::Yaml).unwrap();
        let argv = ["true".to_owned()];
        compile(
            &contract,
            &CompileInput {
                base_dir: Path::new("/"),
                argv: &argv,
                seccomp_profile: None,
            },
        )
        .unwrap()
    }

    fn access_of(rules: &[(String, BitFlags<AccessFs>)], path: &str) -> BitFlags<AccessFs> {
        rules
            .iter()
            .find(|(p, _)| p == path)
            .map(|(_, access)| *access)
            .unwrap_or_else(|| panic!("no rule for {path}"))
    }

    #[test]
    fn execute_is_granted_only_on_the_writable_paths_that_allow_it() {
        let rules = fs_rules(&plan(
            "filesystem:\n  writable_paths: [work, { path: data, exec: false }]\n",
        ));
        assert!(access_of(&rules, "/work").contains(AccessFs::Execute));
        assert!(!access_of(&rules, "/data").contains(AccessFs::Execute));
        assert!(access_of(&rules, "/data").contains(AccessFs::WriteFile));
        assert!(!access_of(&rules, "/dev/shm").contains(AccessFs::Execute));
    }

    #[test]
    fn nothing_outside_the_writable_paths_is_writable() {
        let rules = fs_rules(&plan("filesystem:\n  writable_paths: [work]\n"));
        let write = AccessFs::WriteFile | AccessFs::MakeReg | AccessFs::RemoveFile;
        for (path, access) in &rules {
            let writable = access.intersects(write);
            let expected =
                matches!(path.as_str(), "/work" | "/dev/shm") || path.starts_with("/dev/");
            assert_eq!(writable, expected, "{path}: {access:?}");
        }
        for path in ["/usr", "/etc", "/proc", "/"] {
            assert!(!access_of(&rules, path).intersects(write), "{path}");
        }
    }
}
