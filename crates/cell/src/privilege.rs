//! What this process may do in the host's namespaces, for the steps that need more than
//! an ordinary user has: cloning mount trees needs CAP_SYS_ADMIN over the host's mount
//! namespace, which root on a host has and root in a container usually does not (Docker
//! and Kubernetes drop it).

/// `CAP_SYS_ADMIN` (linux/capability.h).
const CAP_SYS_ADMIN: u32 = 21;

/// Whether the supervisor can clone mount trees itself; otherwise each cell clones its
/// sources in its own mount namespace (crates/cell/src/launcher.rs).
pub fn can_clone_mount_trees() -> bool {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    has_capability(&status, CAP_SYS_ADMIN)
}

/// Whether `cap` is in the effective set of a `/proc/<pid>/status` text.
fn has_capability(status: &str, cap: u32) -> bool {
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .is_some_and(|set| set & (1 << cap) != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_effective_set_is_read_bit_by_bit() {
        let host_root = "Name:\tx\nCapInh:\t0000000000000000\nCapEff:\t000001ffffffffff\n";
        assert!(has_capability(host_root, CAP_SYS_ADMIN));
        // Docker's default set: chown, dac_override, fowner, fsetid, kill, setgid, setuid,
        // setpcap, net_bind_service, net_raw, sys_chroot, mknod, audit_write, setfcap.
        let docker_root = "CapEff:\t00000000a80425fb\n";
        assert!(!has_capability(docker_root, CAP_SYS_ADMIN));
        assert!(!has_capability(
            "CapEff:\t0000000000000000\n",
            CAP_SYS_ADMIN
        ));
        assert!(!has_capability("no such line\n", CAP_SYS_ADMIN));
    }
}
