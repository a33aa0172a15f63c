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
