//! The container's supervisor holds its cell's pod namespaces while the payload runs.
//!
//! Under the CRI plugin, a pod's application containers are given
//! `/proc/<sandbox pid>/ns/{net,ipc,uts}` (containerd's `WithPodNamespaces`), where the
//! sandbox pid is the one the shim got from `--pid-file`: under airlock the sandbox's
//! supervisor, which lives in the host's namespaces. So once the cell is built, and
//! before `create` is told the container exists (the shim learns the pid only then),
//! the supervisor joins the cell's uts and ipc namespaces and, under `network.mode:
//! pod`, the pod's network namespace the cell is in: those paths then name the pod's,
//! as runc's init process would. A cell of its own network (`deny`) keeps the
//! supervisor in the host's network, so a container given that path is refused as host
//! networking (pod_network.rs in the cell crate): a loopback-only cell is not shared.
//!
//! It never joins the cell's user, mount or pid namespaces: it stays the host-side
//! supervisor (the store, the cgroups, the deadline). Only the main thread moves (the
//! one `/proc/<pid>/ns` shows); threads started before it (the broker, the input
//! hashing) stay in the host's.
//!
//! The store: the begin record's connection is opened before the join (a socket keeps
//! the network namespace it was made in) and the record is completed with it; the
//! supervisor goes back to its own namespaces as soon as the engine returns, before the
//! completion, so no connection to the store (a fleet's Postgres on a loopback address
//! included) is ever opened from the pod's network, where the payload could answer it.
//! A supervisor that cannot go back does not complete the record (it is reaped as
//! aborted).

use airlock_cell::pod_network::{hold_cell_namespaces, Joined, Kind, IPC, NETWORK, UTS};
use airlock_contract::{CellPlan, Isolation, NetworkPlan};
use std::sync::Mutex;

/// One container per supervisor process: what it holds, and what it will hold.
static HELD: Mutex<Holding> = Mutex::new(Holding::Nothing);

enum Holding {
    Nothing,
    Planned(&'static [Kind]),
    Held(Joined),
}

/// The namespaces this container's supervisor holds for its plan: none for a gVisor
/// cell (its sandbox is runsc's, whose namespaces are not a pod's to share).
fn kinds_for(plan: &CellPlan) -> &'static [Kind] {
    match (plan.isolation, &plan.network) {
        (Isolation::Gvisor, _) => &[],
        (Isolation::Native, NetworkPlan::Pod { .. }) => &[NETWORK, IPC, UTS],
        (Isolation::Native, NetworkPlan::Deny | NetworkPlan::Allowlist { .. }) => &[IPC, UTS],
    }
}

/// Called with the container's plan, before the engine runs it.
pub fn plan(plan: &CellPlan) {
    let kinds = kinds_for(plan);
    if !kinds.is_empty() {
        *lock() = Holding::Planned(kinds);
    }
}

/// Called in the engine's `on_recorded` hook, before `create` is told: the main thread
/// joins the cell's namespaces. An error ends the container (the caller exits).
pub fn hold() -> Result<(), String> {
    let mut held = lock();
    let Holding::Planned(kinds) = *held else {
        return Ok(());
    };
    let pid1 = cell_pid1()?;
    let joined = hold_cell_namespaces(pid1, kinds).map_err(|e| format!("pod namespaces: {e}"))?;
    *held = Holding::Held(joined);
    Ok(())
}

/// Back to the supervisor's own namespaces, once the engine returned and before the
/// record is completed.
pub fn release() -> Result<(), String> {
    match std::mem::replace(&mut *lock(), Holding::Nothing) {
        Holding::Held(joined) => joined.leave().map_err(|e| format!("pod namespaces: {e}")),
        Holding::Nothing | Holding::Planned(_) => Ok(()),
    }
}

fn lock() -> std::sync::MutexGuard<'static, Holding> {
    HELD.lock().unwrap_or_else(|p| p.into_inner())
}

/// The cell's pid 1: the main thread's only child (the engine clones the cell from this
/// single-threaded process), in a user namespace of its own.
fn cell_pid1() -> Result<u32, String> {
    let me = std::process::id();
    let path = format!("/proc/{me}/task/{me}/children");
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{path}: {e}"))?;
    let children: Vec<u32> = text
        .split_whitespace()
        .filter_map(|c| c.parse().ok())
        .collect();
    let [pid1] = children[..] else {
        return Err(format!(
            "the cell's pid 1 is not this supervisor's only child ({children:?})"
        ));
    };
    let userns = |pid: &str| std::fs::read_link(format!("/proc/{pid}/ns/user")).ok();
    match (userns("self"), userns(&pid1.to_string())) {
        (Some(own), Some(cell)) if own != cell => Ok(pid1),
        _ => Err(format!(
            "child {pid1} is not a cell (no user namespace of its own)"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pod_cells_supervisor_holds_its_network_ipc_and_uts_and_a_deny_cells_not_its_network() {
        let names = |kinds: &[Kind]| kinds.iter().map(|k| k.name).collect::<Vec<_>>();
        assert_eq!(names(&[NETWORK, IPC, UTS]), ["net", "ipc", "uts"]);
        let mut plan = airlock_contract::compile(
            &airlock_contract::default_contract(),
            &airlock_contract::CompileInput::new(std::path::Path::new("/"), &["true".into()]),
        )
        .unwrap();
        assert_eq!(names(kinds_for(&plan)), ["ipc", "uts"]);
        plan.network = NetworkPlan::Pod {
            namespace: "/var/run/netns/cni-1".into(),
            ipc: None,
            uts: None,
        };
        assert_eq!(names(kinds_for(&plan)), ["net", "ipc", "uts"]);
        plan.isolation = Isolation::Gvisor;
        assert!(kinds_for(&plan).is_empty());
    }
}
