//! A fleet node's name: which node's supervisor a run in the shared store belongs to, so
//! that a node that restarts marks `aborted` only its own runs whose supervisors are gone
//! (`Store::reap_aborted`), never another node's (whose processes it cannot see).
//!
//! A node is one host's process table: every process writing runs under one name must see
//! the others' pids (one machine, one pid namespace). The default,
//! `<hostname>/<machine-id>`, is stable across restarts and reboots of a machine and
//! differs between machines; `[store] node` overrides it (docs/config.md), e.g. for
//! containers whose hostname or machine id is not their own.

use crate::{Result, StoreError};

/// Who holds a node name in a fleet's store: one process table in one boot of one kernel
/// (boot id and pid namespace). Every process of that table may write as the node, and
/// judge its runs by pid; no other may while one of them is connected (`pg.rs`, "Node
/// claims"). Two machines differ in boot id; two containers on one kernel in pid
/// namespace; a rebooted machine in boot id (its earlier processes are all gone).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeHolder {
    pub boot_id: String,
    /// The inode of the pid namespace (`/proc/self/ns/pid`): an inode is reused only
    /// after every process of the namespace has exited.
    pub pid_ns: i64,
}

impl NodeHolder {
    /// The calling process's holder identity. Without a boot id or a pid namespace to
    /// name, no claim can tell this machine from another: an error, not a guess.
    pub fn of_this_process() -> Result<NodeHolder> {
        let boot_id = crate::proc_info::boot_id();
        if boot_id.is_empty() {
            return Err(StoreError::InvalidInput(
                "fleet node holder: /proc/sys/kernel/random/boot_id is unreadable, so this \
                 process cannot be told from another machine's"
                    .into(),
            ));
        }
        let link = std::fs::read_link("/proc/self/ns/pid").map_err(|e| {
            StoreError::InvalidInput(format!(
                "fleet node holder: /proc/self/ns/pid: {e} (its pid namespace names this \
                 process table)"
            ))
        })?;
        let pid_ns = parse_ns_link(&link.to_string_lossy()).ok_or_else(|| {
            StoreError::InvalidInput(format!(
                "fleet node holder: /proc/self/ns/pid is {link:?}, not pid:[<inode>]"
            ))
        })?;
        Ok(NodeHolder { boot_id, pid_ns })
    }
}

impl std::fmt::Display for NodeHolder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "boot {} pid namespace {}", self.boot_id, self.pid_ns)
    }
}

/// The inode of a `pid:[4026531836]` namespace link.
fn parse_ns_link(link: &str) -> Option<i64> {
    link.strip_prefix("pid:[")?.strip_suffix(']')?.parse().ok()
}

/// What a node may do with a `running` run of the fleet's store (pure; `pg.rs` feeds it
/// the rows its claim makes this node's to judge).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RunJudgement {
    /// Recorded by this holder: its supervisor is in this process table, judge by pid.
    ByProcess,
    /// Recorded under this node name by an earlier holder, which had no session left
    /// when this one claimed the name: that supervisor can no longer record its end.
    HolderGone(String),
    /// Not this holder's to judge (a pre-holder row of another boot).
    NotOurs,
}

/// The judgement of a running run recorded by (`boot_id`, `pid_ns`) under this node's
/// name (`of_this_node`), or before runs had nodes (`!of_this_node`). Rows without a
/// pid namespace predate claims: judged by pid in their own boot, as before, and
/// otherwise left (their holder may have been another machine sharing the name).
pub(crate) fn judge_run(
    me: &NodeHolder,
    node: &NodeName,
    of_this_node: bool,
    boot_id: &str,
    pid_ns: Option<i64>,
) -> RunJudgement {
    match (of_this_node, pid_ns) {
        (true, Some(ns)) if boot_id == me.boot_id && ns == me.pid_ns => RunJudgement::ByProcess,
        (true, Some(ns)) => RunJudgement::HolderGone(format!(
            "node {node}'s earlier holder (boot {boot_id} pid namespace {ns}) is gone: it \
             held no session when this holder ({me}) claimed the name"
        )),
        _ if boot_id == me.boot_id => RunJudgement::ByProcess,
        _ => RunJudgement::NotOurs,
    }
}

/// The longest node name accepted (a DNS name's length, with room for a machine id).
pub const MAX_NODE_NAME: usize = 253;

/// Where the default name's machine id is read; the second path is the older D-Bus one.
const MACHINE_ID_FILES: &[&str] = &["/etc/machine-id", "/var/lib/dbus/machine-id"];
/// The host name of this process's UTS namespace.
const HOSTNAME_FILE: &str = "/proc/sys/kernel/hostname";

/// A checked node name: 1 to [`MAX_NODE_NAME`] characters of `[A-Za-z0-9._:/-]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeName(String);

impl NodeName {
    /// Check `name`. Refused: empty, too long, or a character outside `[A-Za-z0-9._:/-]`
    /// (the name is shown in messages and compared byte for byte).
    pub fn parse(name: &str) -> Result<NodeName> {
        let invalid =
            |why: String| StoreError::InvalidInput(format!("store node name {name:?}: {why}"));
        if name.is_empty() || name.len() > MAX_NODE_NAME {
            return Err(invalid(format!(
                "must be 1 to {MAX_NODE_NAME} characters long"
            )));
        }
        if let Some(c) = name
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || "._:/-".contains(*c)))
        {
            return Err(invalid(format!("{c:?} is not one of [A-Za-z0-9._:/-]")));
        }
        Ok(NodeName(name.to_string()))
    }

    /// The default name from a host name and a machine id: `<hostname>/<machine-id>`.
    pub fn from_machine(hostname: &str, machine_id: &str) -> Result<NodeName> {
        let (hostname, machine_id) = (hostname.trim(), machine_id.trim());
        if machine_id.is_empty() {
            return Err(StoreError::InvalidInput(
                "no machine id to name this store node by (/etc/machine-id is empty): set \
                 [store] node to a name unique to this machine"
                    .into(),
            ));
        }
        NodeName::parse(&format!("{hostname}/{machine_id}"))
    }

    /// This machine's default name (see the module's documentation). A machine without a
    /// readable machine id has no stable default: an error, so a fleet node is never
    /// named by something that could be another machine's too.
    pub fn of_this_machine() -> Result<NodeName> {
        let machine_id = MACHINE_ID_FILES
            .iter()
            .find_map(|p| std::fs::read_to_string(p).ok())
            .ok_or_else(|| {
                StoreError::InvalidInput(format!(
                    "no machine id to name this store node by (none of {} is readable): set \
                     [store] node to a name unique to this machine",
                    MACHINE_ID_FILES.join(", ")
                ))
            })?;
        let hostname = std::fs::read_to_string(HOSTNAME_FILE).unwrap_or_default();
        NodeName::from_machine(&hostname, &machine_id)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for NodeName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_is_host_name_and_machine_id() {
        let node = NodeName::from_machine("worker-3\n", "0123abcd\n").unwrap();
        assert_eq!(node.as_str(), "worker-3/0123abcd");
        let err = NodeName::from_machine("worker-3", "\n").unwrap_err();
        assert!(err.to_string().contains("[store] node"), "{err}");
    }

    #[test]
    fn odd_names_are_refused_by_rule() {
        for ok in ["a", "node-1.fleet", "pod:airlock-0", "h/0123"] {
            NodeName::parse(ok).unwrap_or_else(|e| panic!("{ok}: {e}"));
        }
        for (bad, why) in [
            ("", "1 to 253"),
            ("a b", "' ' is not one of"),
            ("x'; DROP", "'\\'' is not one of"),
            ("caf\u{e9}", "is not one of"),
        ] {
            let err = NodeName::parse(bad).unwrap_err().to_string();
            assert!(err.contains(why), "{bad:?}: {err}");
        }
        assert!(NodeName::parse(&"n".repeat(254)).is_err());
    }

    fn holder(boot: &str, ns: i64) -> NodeHolder {
        NodeHolder {
            boot_id: boot.into(),
            pid_ns: ns,
        }
    }

    #[test]
    fn a_run_is_judged_by_pid_only_under_its_own_holder() {
        let me = holder("b1", 7);
        let node = NodeName::parse("n").unwrap();
        assert_eq!(
            judge_run(&me, &node, true, "b1", Some(7)),
            RunJudgement::ByProcess
        );
        // Another pid namespace of this boot (a container), another boot (a reboot or
        // another machine): an earlier holder, gone since this one claimed the name.
        for (boot, ns) in [("b1", 8), ("b0", 7)] {
            let RunJudgement::HolderGone(why) = judge_run(&me, &node, true, boot, Some(ns)) else {
                panic!("{boot} {ns}")
            };
            assert!(why.contains("node n's earlier holder") && why.contains("is gone"));
        }
        // Rows from before claims: this boot's by pid, another boot's left alone.
        assert_eq!(
            judge_run(&me, &node, true, "b1", None),
            RunJudgement::ByProcess
        );
        assert_eq!(
            judge_run(&me, &node, true, "b0", None),
            RunJudgement::NotOurs
        );
        assert_eq!(
            judge_run(&me, &node, false, "b1", None),
            RunJudgement::ByProcess
        );
        assert_eq!(
            judge_run(&me, &node, false, "b0", None),
            RunJudgement::NotOurs
        );
    }

    #[test]
    fn this_process_has_a_holder() {
        let me = NodeHolder::of_this_process().unwrap();
        assert_eq!(me, NodeHolder::of_this_process().unwrap());
        assert_eq!(parse_ns_link("pid:[4026531836]"), Some(4026531836));
        assert_eq!(parse_ns_link("net:[4026531836]"), None);
    }

    #[test]
    fn this_machine_has_a_name() {
        // The test machines have /etc/machine-id (systemd/dbus); the name is stable.
        if std::path::Path::new("/etc/machine-id").exists() {
            assert_eq!(
                NodeName::of_this_machine().unwrap(),
                NodeName::of_this_machine().unwrap()
            );
        }
    }
}
