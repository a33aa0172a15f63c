//! An `exec`'s `process.json` as a further command of a running container's cell (`airlock
//! oci exec`, what `ctr task exec` and `kubectl exec` reach through containerd's runc
//! shim). Pure: the caller reads the file and the container's facts, this module decides.
//!
//! The command runs as a child of the cell's pid 1, so with the confinement of the
//! container's payload whatever the file says; what the file may not ask for is refused,
//! naming its field and the rule, never silently dropped:
//! - `user`: uid 0 is the container's identity (root is never honoured, as at `create`);
//!   any other uid or gid must be the container's own (a cell has one identity, and its
//!   pid 1 holds no capability to change it);
//! - `capabilities` beyond the container default set are refused (the default set is
//!   accepted and dropped, as at `create`);
//! - `cwd` must be the container's working directory (pid 1's, which its commands
//!   inherit);
//! - `terminal: true` needs the runtime's `--console-socket` (the caller checks it).
//!
//! A refusal's field is the `process.json`'s (the caller says so, not `config.json`).

use crate::bundle::{check_capabilities, SpecRefusal};
use oci_spec::runtime::Process;
use std::path::PathBuf;

/// What the container's cell is, as its supervisor recorded it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RunningContainer {
    /// The cell's identity (uid, gid) inside its user namespace.
    pub uid: u32,
    pub gid: u32,
    /// The payload's working directory.
    pub cwd: PathBuf,
}

/// The exec, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecTerms {
    pub argv: Vec<String>,
    /// `NAME=value` entries as `(name, value)`.
    pub env: Vec<(String, String)>,
    pub terminal: bool,
}

fn refuse<T>(field: &str, rule: String) -> Result<T, SpecRefusal> {
    Err(SpecRefusal {
        field: field.to_owned(),
        rule,
    })
}

/// `process` checked against the rules above.
pub fn exec_terms(
    process: &Process,
    container: &RunningContainer,
) -> Result<ExecTerms, SpecRefusal> {
    let argv = process.args().clone().unwrap_or_default();
    if argv.is_empty() {
        return refuse("process.args", "an exec needs a command".into());
    }
    check_capabilities(process)?;
    check_user(process, container)?;
    if normal(process.cwd()) != normal(&container.cwd) {
        return refuse(
            "process.cwd",
            format!(
                "{}: an exec runs in the container's working directory ({})",
                process.cwd().display(),
                container.cwd.display()
            ),
        );
    }
    let env = process
        .env()
        .iter()
        .flatten()
        .filter_map(|e| e.split_once('='))
        .map(|(n, v)| (n.to_owned(), v.to_owned()))
        .collect();
    Ok(ExecTerms {
        argv,
        env,
        terminal: process.terminal().unwrap_or(false),
    })
}

/// Root is the container's identity; anyone else must be it.
fn check_user(process: &Process, container: &RunningContainer) -> Result<(), SpecRefusal> {
    let user = process.user();
    if user.uid() == 0 {
        return Ok(());
    }
    if (user.uid(), user.gid()) != (container.uid, container.gid) {
        return refuse(
            "process.user",
            format!(
                "uid {} gid {}: an exec runs as the container's identity (uid {} gid {}, or \
                 uid 0 for it); a cell has one identity and no capability to change it",
                user.uid(),
                user.gid(),
                container.uid,
                container.gid
            ),
        );
    }
    Ok(())
}

/// A path without a trailing `/` (`/work/` is `/work`), `/` for an empty one.
fn normal(path: &std::path::Path) -> PathBuf {
    let text = path.to_string_lossy();
    let trimmed = text.trim_end_matches('/');
    PathBuf::from(if trimmed.is_empty() { "/" } else { trimmed })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn container() -> RunningContainer {
        RunningContainer {
            uid: 1000,
            gid: 1000,
            cwd: "/".into(),
        }
    }

    /// What `ctr task exec` sends: the container's process with the exec's args.
    fn process(extra: serde_json::Value) -> Process {
        let mut value = json!({
            "user": {"uid": 0, "gid": 0},
            "args": ["sh", "-c", "cat /tmp/x"],
            "env": ["PATH=/usr/bin:/bin", "A=b=c"],
            "cwd": "/",
            "capabilities": {
                "bounding": ["CAP_CHOWN", "CAP_KILL"],
                "effective": ["CAP_CHOWN", "CAP_KILL"],
                "permitted": ["CAP_CHOWN", "CAP_KILL"]
            },
            "noNewPrivileges": true
        });
        for (key, v) in extra.as_object().unwrap() {
            value[key] = v.clone();
        }
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn ctrs_exec_is_accepted_as_the_containers_identity() {
        let terms = exec_terms(&process(json!({})), &container()).unwrap();
        assert_eq!(terms.argv, ["sh", "-c", "cat /tmp/x"]);
        assert_eq!(terms.env[1], ("A".to_string(), "b=c".to_string()));
        assert!(!terms.terminal);
        let own = process(json!({"user": {"uid": 1000, "gid": 1000}, "terminal": true}));
        assert!(exec_terms(&own, &container()).unwrap().terminal);
    }

    #[test]
    fn another_identity_is_refused() {
        let other = process(json!({"user": {"uid": 4242, "gid": 4242}}));
        let err = exec_terms(&other, &container()).unwrap_err();
        assert_eq!(err.field, "process.user");
        assert!(err.rule.contains("uid 4242"), "{err}");
    }

    #[test]
    fn capabilities_beyond_the_default_set_are_refused() {
        let privileged = process(json!({"capabilities": {"bounding": ["CAP_SYS_ADMIN"]}}));
        let err = exec_terms(&privileged, &container()).unwrap_err();
        assert_eq!(err.field, "process.capabilities.bounding");
        assert!(err.rule.contains("CAP_SYS_ADMIN"), "{err}");
    }

    #[test]
    fn another_working_directory_and_no_command_are_refused() {
        let elsewhere = process(json!({"cwd": "/etc"}));
        assert_eq!(
            exec_terms(&elsewhere, &container()).unwrap_err().field,
            "process.cwd"
        );
        let same = process(json!({"cwd": "/"}));
        assert!(exec_terms(&same, &container()).is_ok());
        let nothing = process(json!({"args": []}));
        assert_eq!(
            exec_terms(&nothing, &container()).unwrap_err().field,
            "process.args"
        );
    }
}
