//! Host checks that `airlock run` (the supervisor's preflight, before a cell is cloned)
//! and `airlock doctor` make the same way, so that doctor never says `ok` for a control a
//! run then refuses, and both name the same control and the same fix. Each check reads
//! the host once; the verdicts are pure functions of what was read.

use crate::error::CellError;
use crate::landlock_policy;

/// Landlock at the ABI the cell needs, or the refusal naming the fix.
pub fn landlock() -> Result<String, CellError> {
    landlock_verdict(landlock_policy::kernel_abi())
}

fn landlock_verdict(abi: i64) -> Result<String, CellError> {
    let required = landlock_policy::REQUIRED_ABI as i64;
    if abi >= required {
        return Ok(format!("ABI {abi} (needs {required})"));
    }
    let reason = if abi == 0 {
        format!(
            "Landlock is not enabled in this kernel (ABI 0) and the cell needs ABI {required}: boot Linux 6.12 or later with landlock in its lsm= list (for example lsm=landlock,lockdown,yama,integrity,apparmor; /sys/kernel/security/lsm shows the active list)"
        )
    } else {
        format!("the kernel offers Landlock ABI {abi} and the cell needs ABI {required}: boot Linux 6.12 or later")
    };
    Err(CellError::Unavailable {
        control: "landlock",
        reason,
    })
}

/// Whether this process may create the cell's user namespace: the per-namespace count
/// `user.max_user_namespaces` (0 forbids them, for everyone in this user namespace, root
/// included) and, for a caller who is not root, Debian's
/// `kernel.unprivileged_userns_clone` (0 forbids them).
pub fn user_namespaces(euid: u32) -> Result<String, CellError> {
    let read = |path: &str| std::fs::read_to_string(path).ok();
    user_namespaces_verdict(
        euid,
        read("/proc/sys/user/max_user_namespaces").as_deref(),
        read("/proc/sys/kernel/unprivileged_userns_clone").as_deref(),
    )
}

fn user_namespaces_verdict(
    euid: u32,
    max_user_namespaces: Option<&str>,
    unprivileged_userns_clone: Option<&str>,
) -> Result<String, CellError> {
    let refused = |reason: &str| CellError::Unavailable {
        control: "namespace.user",
        reason: reason.into(),
    };
    let max = max_user_namespaces.map(str::trim);
    if max == Some("0") {
        return Err(refused("user.max_user_namespaces is 0 in this user namespace: no user namespace, and so no cell, can be created; as root of this namespace (on a host: root): sysctl -w user.max_user_namespaces=15000 (and in /etc/sysctl.d/ to keep it)"));
    }
    if euid != 0 && unprivileged_userns_clone.map(str::trim) == Some("0") {
        return Err(refused("kernel.unprivileged_userns_clone=0 forbids user namespaces to users who are not root; as root: sysctl -w kernel.unprivileged_userns_clone=1 (and in /etc/sysctl.d/ to keep it)"));
    }
    Ok(format!(
        "user.max_user_namespaces={}",
        max.unwrap_or("unknown")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reason(result: Result<String, CellError>) -> (&'static str, String) {
        match result.unwrap_err() {
            CellError::Unavailable { control, reason } => (control, reason),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn landlock_disabled_at_boot_names_the_lsm_list() {
        let (control, why) = reason(landlock_verdict(0));
        assert_eq!(control, "landlock");
        assert!(why.contains("lsm=landlock"), "{why}");
        let (_, why) = reason(landlock_verdict(4));
        assert!(why.contains("ABI 4") && why.contains("6.12"), "{why}");
        assert!(landlock_verdict(6).is_ok() && landlock_verdict(7).is_ok());
    }

    #[test]
    fn no_user_namespaces_at_all_refuses_root_too_naming_the_sysctl() {
        for euid in [0, 1000] {
            let (control, why) = reason(user_namespaces_verdict(euid, Some("0\n"), None));
            assert_eq!(control, "namespace.user");
            assert!(why.contains("sysctl -w user.max_user_namespaces="), "{why}");
        }
        assert!(user_namespaces_verdict(0, Some("63000\n"), None).is_ok());
    }

    #[test]
    fn debians_switch_refuses_only_users_who_are_not_root() {
        let (_, why) = reason(user_namespaces_verdict(1000, Some("10"), Some("0\n")));
        assert!(
            why.contains("sysctl -w kernel.unprivileged_userns_clone=1"),
            "{why}"
        );
        assert!(user_namespaces_verdict(0, Some("10"), Some("0")).is_ok());
        assert!(user_namespaces_verdict(1000, Some("10"), Some("1")).is_ok());
    }
}
