//! A pod's network namespace ([`NetworkPlan::Pod`]): joined by the supervisor, as root,
//! right before it clones the cell, and left right after. The clone then creates the
//! cell's own user, mount, pid, ipc, uts namespaces and the cell its own cgroup
//! namespace, but no network namespace: the cell's processes share the pod's.
//!
//! Why the supervisor and not the cell: joining a network namespace needs
//! `CAP_SYS_ADMIN` over the user namespace that owns it (the host's, for a CNI's
//! namespace), which the cell, root only of its own new user namespace, never has. For
//! the same reason the cell cannot change the pod's network: its interfaces, addresses,
//! routes and raw sockets all need `CAP_NET_ADMIN`/`CAP_NET_RAW` there.
//!
//! The supervisor goes back to its own network namespace after the clone: its own
//! traffic (a fleet store over TCP, the broker) stays the host's, not the pod's.
//!
//! What is checked, on the descriptor that is joined (no race with the path): it is a
//! namespace (nsfs) of type network, and neither the host's (pid 1's) nor the
//! supervisor's own: joining either would be host networking.

use crate::error::CellError;
use crate::sys;
use airlock_contract::NetworkPlan;
use std::fs::File;
use std::os::fd::AsFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// The namespaces a pod network must not be: `(what, path)`.
const HOST_NETWORKS: &[(&str, &str)] = &[
    ("the host's network namespace (pid 1's)", "/proc/1/ns/net"),
    (
        "the supervisor's own network namespace (host networking)",
        "/proc/thread-self/ns/net",
    ),
];

/// A namespace's identity: nsfs device and inode, as `stat` reports them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NamespaceId {
    pub dev: u64,
    pub ino: u64,
}

/// The supervisor's own network namespace while it is in a pod's: [`Joined::leave`]
/// takes it back there.
#[must_use = "the supervisor must leave the pod's network namespace after the clone"]
pub struct Joined {
    own: File,
}

/// Joins the plan's pod network namespace, if it has one, after checking it.
pub fn enter(network: &NetworkPlan) -> Result<Option<Joined>, CellError> {
    let NetworkPlan::Pod { namespace } = network else {
        return Ok(None);
    };
    let refused = |rule: String| CellError::PodNetwork {
        path: namespace.clone(),
        rule,
    };
    let target = File::open(namespace).map_err(|e| refused(format!("cannot be opened: {e}")))?;
    let kind = sys::namespace_type(target.as_fd()).ok();
    let hosts =
        host_networks().map_err(|(path, e)| CellError::io(path.display().to_string(), e))?;
    check(kind, identity(&target).map_err(refused)?, &hosts).map_err(refused)?;
    let own = File::open(HOST_NETWORKS[1].1).map_err(|e| CellError::io(HOST_NETWORKS[1].1, e))?;
    sys::setns(target.as_fd(), libc::CLONE_NEWNET).map_err(|e| {
        refused(format!(
            "cannot be joined ({e}): joining a pod's network namespace needs root"
        ))
    })?;
    Ok(Some(Joined { own }))
}

impl Joined {
    /// Back to the supervisor's own network namespace. An error leaves this process in
    /// the pod's: the caller abandons the cell and the run.
    pub fn leave(self) -> Result<(), CellError> {
        sys::setns(self.own.as_fd(), libc::CLONE_NEWNET)
            .map_err(|e| CellError::io("returning to the supervisor's network namespace", e))
    }
}

/// The decision, pure: a namespace of type network that is none of `hosts`.
pub fn check(
    kind: Option<libc::c_int>,
    joined: NamespaceId,
    hosts: &[(&'static str, NamespaceId)],
) -> Result<(), String> {
    match kind {
        Some(libc::CLONE_NEWNET) => {}
        Some(_) => return Err("is a namespace of another type, not a network namespace".into()),
        None => return Err("is not a namespace (nsfs) at all".into()),
    }
    match hosts.iter().find(|(_, host)| *host == joined) {
        Some((what, _)) => Err(format!(
            "is {what}: a cell never joins it (that would be host networking)"
        )),
        None => Ok(()),
    }
}

fn identity(file: &File) -> Result<NamespaceId, String> {
    let meta = file
        .metadata()
        .map_err(|e| format!("cannot be read: {e}"))?;
    Ok(NamespaceId {
        dev: meta.dev(),
        ino: meta.ino(),
    })
}

/// The namespaces of [`HOST_NETWORKS`]. Pid 1's may be hidden even from root (a
/// restricted container: its namespaces need ptrace access to pid 1, which a missing
/// capability or an LSM denies); then the supervisor's own, the node's network as the
/// container runtime sees it, is the reference. Any other failure is an error.
fn host_networks() -> Result<Vec<(&'static str, NamespaceId)>, (PathBuf, std::io::Error)> {
    let mut hosts = Vec::new();
    for (what, path) in HOST_NETWORKS {
        let meta = match std::fs::metadata(path) {
            Ok(meta) => meta,
            Err(e) if *path == HOST_NETWORKS[0].1 && hidden(&e) => continue,
            Err(e) => return Err((Path::new(path).to_owned(), e)),
        };
        let id = NamespaceId {
            dev: meta.dev(),
            ino: meta.ino(),
        };
        hosts.push((*what, id));
    }
    Ok(hosts)
}

fn hidden(error: &std::io::Error) -> bool {
    matches!(error.raw_os_error(), Some(libc::EACCES | libc::EPERM))
}

#[cfg(test)]
mod tests {
    use super::*;

    const POD: NamespaceId = NamespaceId { dev: 4, ino: 100 };
    const HOST: NamespaceId = NamespaceId { dev: 4, ino: 1 };
    const OWN: NamespaceId = NamespaceId { dev: 4, ino: 2 };

    fn hosts() -> Vec<(&'static str, NamespaceId)> {
        vec![("the host's", HOST), ("the supervisor's own", OWN)]
    }

    #[test]
    fn a_network_namespace_of_its_own_is_joined() {
        assert_eq!(check(Some(libc::CLONE_NEWNET), POD, &hosts()), Ok(()));
    }

    #[test]
    fn the_hosts_and_the_supervisors_network_are_refused() {
        let host = check(Some(libc::CLONE_NEWNET), HOST, &hosts()).unwrap_err();
        assert!(host.starts_with("is the host's"), "{host}");
        let own = check(Some(libc::CLONE_NEWNET), OWN, &hosts()).unwrap_err();
        assert!(own.contains("host networking"), "{own}");
    }

    #[test]
    fn a_file_or_another_namespace_type_is_refused() {
        let ipc = check(Some(libc::CLONE_NEWIPC), POD, &hosts()).unwrap_err();
        assert!(ipc.contains("not a network namespace"), "{ipc}");
        let file = check(None, POD, &hosts()).unwrap_err();
        assert!(file.contains("not a namespace"), "{file}");
    }

    #[test]
    fn a_plan_without_a_pod_network_joins_nothing() {
        assert!(enter(&NetworkPlan::Deny).unwrap().is_none());
    }
}
