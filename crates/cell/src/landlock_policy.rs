//! Landlock rules matching the mount plan: the payload can read and execute the system
//! tree and inputs, write only its writable paths and device nodes, connect to no TCP port
//! except the egress proxies and the transparent listeners' ports, and neither signal nor
//! reach abstract unix sockets outside
//! the cell. Requires Landlock ABI 6 (Linux 6.12); anything less is refused, never
//! silently weakened.

use crate::launcher::Stage;
use airlock_contract::{CellPlan, MountPlan, NetworkPlan, HTTP_PROXY_PORT, SOCKS_PROXY_PORT};
use landlock::{
    Access, AccessFs, AccessNet, CompatLevel, Compatible, NetPort, PathBeneath, PathFd, Ruleset,
    RulesetAttr, RulesetCreatedAttr, RulesetStatus, Scope, ABI,
};
use std::path::Path;

/// The lowest ABI that has everything the cell relies on (fs, TCP, scopes).
pub const REQUIRED_ABI: ABI = ABI::V6;

fn unavailable(stage: &'static str, err: impl std::fmt::Display) -> Stage {
    Stage {
        name: stage.into(),
        message: err.to_string(),
        unavailable: true,
    }
}

/// Applies the ruleset to the calling process (and so to everything it execs).
pub fn restrict(plan: &CellPlan) -> Result<(), Stage> {
    let abi = REQUIRED_ABI;
    let read_exec = AccessFs::ReadFile | AccessFs::ReadDir | AccessFs::Execute;
    let read = AccessFs::ReadFile | AccessFs::ReadDir;
    let device = AccessFs::ReadFile | AccessFs::WriteFile | AccessFs::IoctlDev;

    let mut rules: Vec<(String, landlock::BitFlags<AccessFs>)> = vec![
        ("/".into(), AccessFs::ReadDir.into()),
        ("/etc".into(), read),
        ("/proc".into(), read),
        ("/dev".into(), AccessFs::ReadDir.into()),
        ("/dev/pts".into(), device | AccessFs::ReadDir),
        (
            "/dev/shm".into(),
            AccessFs::from_all(abi) & !AccessFs::Execute,
        ),
    ];
    for node in ["null", "zero", "full", "random", "urandom", "tty"] {
        rules.push((format!("/dev/{node}"), device));
    }
    for mount in &plan.mounts {
        match mount {
            MountPlan::HostSystem { path, .. } => {
                rules.push((path.display().to_string(), read_exec))
            }
            MountPlan::ReadonlyInput { target, .. } => {
                rules.push((target.display().to_string(), read_exec))
            }
            MountPlan::WritableTmpfs { target, .. } => rules.push((
                target.display().to_string(),
                AccessFs::from_all(abi) & !AccessFs::Execute,
            )),
        }
    }

    let ruleset = Ruleset::default()
        .set_compatibility(CompatLevel::HardRequirement)
        .handle_access(AccessFs::from_all(abi))
        .and_then(|r| r.handle_access(AccessNet::ConnectTcp))
        .and_then(|r| r.scope(Scope::AbstractUnixSocket | Scope::Signal))
        .map_err(|e| unavailable("landlock.ruleset", e))?;
    let mut created = ruleset
        .create()
        .map_err(|e| unavailable("landlock.create", e))?;
    for (path, access) in rules {
        // Paths of the plan that did not materialise (optional host dirs such as /lib32)
        // simply get no rule: no rule means no access.
        let Ok(fd) = PathFd::new(Path::new(&path)) else {
            continue;
        };
        // A rule on a file (an input file, a device node) may only carry file rights.
        let access = if Path::new(&path).is_dir() {
            access
        } else {
            access & AccessFs::from_file(abi)
        };
        created = created
            .add_rule(PathBeneath::new(fd, access))
            .map_err(|e| Stage::new("landlock.add_rule", format!("{path}: {e}")))?;
    }
    if let NetworkPlan::Allowlist { .. } = plan.network {
        for port in [HTTP_PROXY_PORT, SOCKS_PROXY_PORT] {
            created = created
                .add_rule(NetPort::new(port, AccessNet::ConnectTcp))
                .map_err(|e| Stage::new("landlock.add_rule", e.to_string()))?;
        }
    }
    for port in transparent_ports(plan) {
        created = created
            .add_rule(NetPort::new(port, AccessNet::ConnectTcp))
            .map_err(|e| Stage::new("landlock.add_rule", e.to_string()))?;
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

/// The ports of the transparent listeners (empty in `deny` mode). Landlock's TCP rules
/// name ports, not addresses; that is enough here, because the cell's network namespace
/// holds only `lo`: a connect to one of these ports reaches a listener of the cell or
/// nothing (the transparent listeners are the only sockets bound on them).
fn transparent_ports(plan: &CellPlan) -> Vec<u16> {
    let mut ports: Vec<u16> = plan
        .network
        .transparent_endpoints()
        .iter()
        .map(|e| e.address.port())
        .collect();
    ports.sort_unstable();
    ports.dedup();
    ports
}

/// The Landlock ABI of the running kernel (0 when unsupported).
pub fn kernel_abi() -> i64 {
    crate::sys::landlock_abi_version()
}
