//! `airlock doctor`: checks, one by one, that this host can enforce every control a cell
//! relies on. Each check exercises the real mechanism where that is cheap.

use crate::cgroup::{find_leftovers, CgroupLayout};
use crate::{landlock_policy, seccomp, sys};
use serde::Serialize;

#[derive(Debug, Serialize)]
pub struct Check {
    pub control: &'static str,
    pub ok: bool,
    pub detail: String,
}

fn check(control: &'static str, result: Result<String, String>) -> Check {
    match result {
        Ok(detail) => Check {
            control,
            ok: true,
            detail,
        },
        Err(detail) => Check {
            control,
            ok: false,
            detail,
        },
    }
}

fn namespace_file(name: &str) -> Result<String, String> {
    let path = format!("/proc/self/ns/{name}");
    std::fs::metadata(&path)
        .map(|_| format!("{path} present"))
        .map_err(|e| format!("{path}: {e}"))
}

pub fn run_checks() -> Vec<Check> {
    let mut checks = Vec::new();
    for ns in ["user", "mnt", "pid", "net", "ipc", "uts", "cgroup"] {
        checks.push(check(
            match ns {
                "user" => "namespace.user",
                "mnt" => "namespace.mount",
                "pid" => "namespace.pid",
                "net" => "namespace.net",
                "ipc" => "namespace.ipc",
                "uts" => "namespace.uts",
                _ => "namespace.cgroup",
            },
            namespace_file(ns),
        ));
    }
    checks.push(check(
        "namespace.user.unprivileged_map",
        std::fs::read_to_string("/proc/sys/user/max_user_namespaces")
            .map_err(|e| e.to_string())
            .and_then(|v| match v.trim().parse::<u64>() {
                Ok(0) => Err("user.max_user_namespaces is 0".into()),
                Ok(n) => Ok(format!("max_user_namespaces={n}")),
                Err(e) => Err(e.to_string()),
            }),
    ));
    let abi = landlock_policy::kernel_abi();
    checks.push(check(
        "landlock",
        if abi >= landlock_policy::REQUIRED_ABI as i64 {
            Ok(format!(
                "ABI {abi} (needs {})",
                landlock_policy::REQUIRED_ABI as i64
            ))
        } else {
            Err(format!(
                "ABI {abi}; the cell needs ABI {} (Linux 6.12+, lsm=landlock)",
                landlock_policy::REQUIRED_ABI as i64
            ))
        },
    ));
    checks.push(check(
        "seccomp",
        std::fs::read_to_string("/proc/self/status")
            .map_err(|e| e.to_string())
            .and_then(|s| {
                if s.contains("Seccomp:") {
                    Ok(())
                } else {
                    Err("kernel without CONFIG_SECCOMP".into())
                }
            })
            .and_then(|_| seccomp::compile(&seccomp::default_policy()).map_err(|e| e.to_string()))
            .map(|p| {
                format!(
                    "filter mode available; default filter is {} instructions",
                    p.len()
                )
            }),
    ));
    match CgroupLayout::detect() {
        Ok(layout) => {
            checks.push(check(
                "cgroups",
                Ok(format!("{} ({:?})", layout.version(), layout)),
            ));
            let leftovers = find_leftovers(&layout);
            checks.push(check(
                "cleanup.leftover_cells",
                if leftovers.is_empty() {
                    Ok("no cell cgroups without a live supervisor".into())
                } else {
                    Err(format!(
                        "{} leftover cell cgroup(s): {:?} (removed by the next `airlock run`)",
                        leftovers.len(),
                        leftovers
                    ))
                },
            ));
        }
        Err(e) => checks.push(check("cgroups", Err(e.to_string()))),
    }
    checks.push(check(
        "mount_api",
        if std::path::Path::new("/proc/self/mountinfo").exists() && sys::landlock_abi_version() >= 0
        {
            Ok("open_tree/move_mount/mount_setattr (Linux 5.12+) assumed by kernel version".into())
        } else {
            Err("no /proc/self/mountinfo".into())
        },
    ));
    checks.push(check(
        "identity",
        Ok(if sys::geteuid() == 0 {
            format!(
                "running as root: cell ids map to host ids {}+N, never 0",
                crate::HOST_ID_BASE
            )
        } else {
            format!(
                "running as uid {}: the cell identity maps to it",
                sys::geteuid()
            )
        }),
    ));
    checks
}
