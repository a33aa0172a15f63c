//! A pod's namespaces ([`NetworkPlan::Pod`]): its network namespace, and for a pod's
//! application container also its ipc and uts namespaces, joined by the supervisor, as
//! root, right before it clones the cell, and left right after. The clone then creates
//! the cell's own user, mount and pid namespaces (and the ipc and uts ones the plan
//! does not join), the cell its own cgroup namespace, but no network namespace: the
//! cell's processes share the pod's.
//!
//! Why the supervisor and not the cell: joining a namespace needs `CAP_SYS_ADMIN` over
//! the user namespace that owns it (the host's, for a CNI's network namespace; the
//! sandbox cell's, for the ipc and uts namespaces its supervisor holds), which the cell,
//! root only of its own new user namespace, never has. For the same reason the cell
//! cannot change what it joined: the pod's interfaces, addresses, routes and raw sockets
//! need `CAP_NET_ADMIN`/`CAP_NET_RAW` there, its host name `CAP_SYS_ADMIN`.
//!
//! The supervisor goes back to its own namespaces after the clone: the checks below run
//! before it holds any pod's (crates/airlock/src/oci/pod.rs holds the cell's only
//! after the clone), so "its own" is the node's, as the container runtime sees it.
//!
//! What is checked, on the descriptor that is joined (no race with the path): it is a
//! namespace (nsfs) of the expected type, and neither the host's (pid 1's) nor the
//! supervisor's own: joining either would share the host's network, SysV IPC or host
//! name.

use crate::error::CellError;
use crate::sys;
use airlock_contract::NetworkPlan;
use std::fs::File;
use std::os::fd::AsFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// A kind of namespace a pod shares with its containers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Kind {
    /// As in `/proc/<pid>/ns/<name>`.
    pub name: &'static str,
    /// Its `CLONE_NEW*` type.
    pub flag: libc::c_int,
    /// Named in errors ("pod ipc namespace ...").
    pub label: &'static str,
    /// What sharing the host's would be.
    host_sharing: &'static str,
}

pub const NETWORK: Kind = Kind {
    name: "net",
    flag: libc::CLONE_NEWNET,
    label: "network",
    host_sharing: "host networking",
};
pub const IPC: Kind = Kind {
    name: "ipc",
    flag: libc::CLONE_NEWIPC,
    label: "ipc",
    host_sharing: "the host's SysV IPC and POSIX message queues",
};
pub const UTS: Kind = Kind {
    name: "uts",
    flag: libc::CLONE_NEWUTS,
    label: "uts",
    host_sharing: "the host's host name",
};

/// A namespace's identity: nsfs device and inode, as `stat` reports them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NamespaceId {
    pub dev: u64,
    pub ino: u64,
}

/// The supervisor's own namespaces while it is in a pod's: [`Joined::leave`] takes it
/// back there.
#[must_use = "the supervisor must leave the pod's namespaces after the clone"]
pub struct Joined {
    own: Vec<(Kind, File)>,
}

/// The namespaces of the plan's pod, in the order they are joined.
pub fn pod_namespaces(network: &NetworkPlan) -> Vec<(Kind, &Path)> {
    let NetworkPlan::Pod {
        namespace,
        ipc,
        uts,
    } = network
    else {
        return Vec::new();
    };
    let mut joined = vec![(NETWORK, namespace.as_path())];
    joined.extend(ipc.as_deref().map(|path| (IPC, path)));
    joined.extend(uts.as_deref().map(|path| (UTS, path)));
    joined
}

/// The `CLONE_NEW*` flags of the namespaces the plan joins (the clone does not create
/// them).
pub fn joined_flags(network: &NetworkPlan) -> libc::c_int {
    pod_namespaces(network)
        .iter()
        .fold(0, |flags, (kind, _)| flags | kind.flag)
}

/// Joins the plan's pod namespaces, if it has any, after checking each. A failure
/// leaves this process in its own namespaces.
pub fn enter(network: &NetworkPlan) -> Result<Option<Joined>, CellError> {
    let namespaces = pod_namespaces(network);
    if namespaces.is_empty() {
        return Ok(None);
    }
    let mut joined = Joined { own: Vec::new() };
    for (kind, path) in namespaces {
        if let Err(err) = join(kind, path, &mut joined) {
            // Back to where it was: the refusal must not leave it in a pod's.
            joined.leave()?;
            return Err(err);
        }
    }
    Ok(Some(joined))
}

fn join(kind: Kind, path: &Path, joined: &mut Joined) -> Result<(), CellError> {
    let refused = |rule: String| CellError::PodNamespace {
        kind: kind.label,
        path: path.to_path_buf(),
        rule,
    };
    let target = File::open(path).map_err(|e| refused(format!("cannot be opened: {e}")))?;
    let found = sys::namespace_type(target.as_fd()).ok();
    let hosts =
        host_namespaces(kind).map_err(|(path, e)| CellError::io(path.display().to_string(), e))?;
    check(kind, found, identity(&target).map_err(refused)?, &hosts).map_err(refused)?;
    let own_path = own_path(kind);
    let own =
        File::open(&own_path).map_err(|e| CellError::io(own_path.display().to_string(), e))?;
    sys::setns(target.as_fd(), kind.flag).map_err(|e| {
        refused(format!(
            "cannot be joined ({e}): joining a pod's namespace needs root"
        ))
    })?;
    joined.own.push((kind, own));
    Ok(())
}

/// The supervisor joins its cell's namespaces of `kinds` (never its user, mount or pid
/// namespaces: it stays the host-side supervisor), so that `/proc/<supervisor>/ns/...`,
/// the paths CRI gives a pod's other containers, name the cell's: what runc's init
/// process would show. `cell_pid1` is the cell's pid 1, this process's unreaped child
/// (its pid cannot be reused). Only the calling thread moves: threads started before
/// stay where they were. A failure leaves this thread in its own namespaces.
pub fn hold_cell_namespaces(cell_pid1: u32, kinds: &[Kind]) -> Result<Joined, CellError> {
    let mut held = Joined { own: Vec::new() };
    for kind in kinds {
        if let Err(err) = hold_one(cell_pid1, *kind, &mut held) {
            held.leave()?;
            return Err(err);
        }
    }
    Ok(held)
}

fn hold_one(cell_pid1: u32, kind: Kind, held: &mut Joined) -> Result<(), CellError> {
    let path = PathBuf::from(format!("/proc/{cell_pid1}/ns/{}", kind.name));
    let shown = path.display().to_string();
    let target = File::open(&path).map_err(|e| CellError::io(shown.clone(), e))?;
    let found = sys::namespace_type(target.as_fd()).map_err(|e| CellError::io(shown, e))?;
    if found != kind.flag {
        return Err(CellError::PodNamespace {
            kind: kind.label,
            path,
            rule: "the cell's namespace is of another type".into(),
        });
    }
    let own_path = own_path(kind);
    let own =
        File::open(&own_path).map_err(|e| CellError::io(own_path.display().to_string(), e))?;
    sys::setns(target.as_fd(), kind.flag)
        .map_err(|e| CellError::io(format!("joining the cell's {} namespace", kind.label), e))?;
    held.own.push((kind, own));
    Ok(())
}

impl Joined {
    /// Back to the supervisor's own namespaces. An error leaves this process in the
    /// pod's: the caller abandons the cell and the run.
    pub fn leave(self) -> Result<(), CellError> {
        for (kind, own) in self.own.iter().rev() {
            sys::setns(own.as_fd(), kind.flag).map_err(|e| {
                CellError::io(
                    format!("returning to the supervisor's {} namespace", kind.label),
                    e,
                )
            })?;
        }
        Ok(())
    }
}

/// The decision, pure: a namespace of `kind`'s type that is none of `hosts`.
pub fn check(
    kind: Kind,
    found: Option<libc::c_int>,
    joined: NamespaceId,
    hosts: &[(&'static str, NamespaceId)],
) -> Result<(), String> {
    match found {
        Some(flag) if flag == kind.flag => {}
        Some(_) => {
            return Err(format!(
                "is a namespace of another type, not a {} namespace",
                kind.label
            ))
        }
        None => return Err("is not a namespace (nsfs) at all".into()),
    }
    match hosts.iter().find(|(_, host)| *host == joined) {
        Some((what, _)) => Err(format!(
            "is {what}: a cell never joins it (that would be {})",
            kind.host_sharing
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

fn own_path(kind: Kind) -> PathBuf {
    PathBuf::from(format!("/proc/thread-self/ns/{}", kind.name))
}

/// The namespaces of `kind` a pod's must not be: the host's (pid 1's) and the
/// supervisor's own. Pid 1's may be hidden even from root (a restricted container: its
/// namespaces need ptrace access to pid 1, which a missing capability or an LSM denies);
/// then the supervisor's own, the node's as the container runtime sees it, is the
/// reference. Any other failure is an error.
fn host_namespaces(
    kind: Kind,
) -> Result<Vec<(&'static str, NamespaceId)>, (PathBuf, std::io::Error)> {
    let references = [
        (
            "the host's namespace (pid 1's)",
            PathBuf::from(format!("/proc/1/ns/{}", kind.name)),
            true,
        ),
        ("the supervisor's own namespace", own_path(kind), false),
    ];
    let mut hosts = Vec::new();
    for (what, path, may_be_hidden) in references {
        let meta = match std::fs::metadata(&path) {
            Ok(meta) => meta,
            Err(e) if may_be_hidden && hidden(&e) => continue,
            Err(e) => return Err((path, e)),
        };
        let id = NamespaceId {
            dev: meta.dev(),
            ino: meta.ino(),
        };
        hosts.push((what, id));
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
    fn a_namespace_of_its_own_of_the_expected_type_is_joined() {
        for kind in [NETWORK, IPC, UTS] {
            assert_eq!(check(kind, Some(kind.flag), POD, &hosts()), Ok(()));
        }
    }

    #[test]
    fn the_hosts_and_the_supervisors_namespaces_are_refused() {
        let host = check(NETWORK, Some(libc::CLONE_NEWNET), HOST, &hosts()).unwrap_err();
        assert!(host.starts_with("is the host's"), "{host}");
        let own = check(NETWORK, Some(libc::CLONE_NEWNET), OWN, &hosts()).unwrap_err();
        assert!(own.contains("host networking"), "{own}");
        let ipc = check(IPC, Some(libc::CLONE_NEWIPC), HOST, &hosts()).unwrap_err();
        assert!(ipc.contains("the host's SysV IPC"), "{ipc}");
        let uts = check(UTS, Some(libc::CLONE_NEWUTS), OWN, &hosts()).unwrap_err();
        assert!(uts.contains("the host's host name"), "{uts}");
    }

    #[test]
    fn a_file_or_another_namespace_type_is_refused() {
        let ipc = check(NETWORK, Some(libc::CLONE_NEWIPC), POD, &hosts()).unwrap_err();
        assert!(ipc.contains("not a network namespace"), "{ipc}");
        let net = check(UTS, Some(libc::CLONE_NEWNET), POD, &hosts()).unwrap_err();
        assert!(net.contains("not a uts namespace"), "{net}");
        let file = check(IPC, None, POD, &hosts()).unwrap_err();
        assert!(file.contains("not a namespace"), "{file}");
    }

    #[test]
    fn a_plan_without_a_pod_joins_nothing_and_a_pods_ipc_and_uts_are_not_cloned() {
        assert!(enter(&NetworkPlan::Deny).unwrap().is_none());
        assert_eq!(joined_flags(&NetworkPlan::Deny), 0);
        let pod = NetworkPlan::Pod {
            namespace: "/var/run/netns/cni-1".into(),
            ipc: Some("/proc/7/ns/ipc".into()),
            uts: None,
        };
        assert_eq!(joined_flags(&pod), libc::CLONE_NEWNET | libc::CLONE_NEWIPC);
        let kinds: Vec<&str> = pod_namespaces(&pod).iter().map(|(k, _)| k.name).collect();
        assert_eq!(kinds, ["net", "ipc"]);
    }
}
