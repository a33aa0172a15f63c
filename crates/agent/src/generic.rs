//! The generic tools MCP offers besides the registry's, all under the registry's
//! `generic_contract` (unset: the default contract): run a command, run a Python
//! snippet, and sessions (open, exec, read a file, write a file, close). Each command
//! runs in a cell (a session's commands in the session's one cell); each result carries
//! the run id, the result class, the exit code, the limit that fired and whether its
//! stdout was cut. stderr stays in the run's record: a command that wants it returned
//! redirects it (`2>&1`).

use crate::call::{CallMeta, ToolBox};
use crate::exec::{self, Cancel, CommandRun, Execution};
use crate::AgentError;
use airlock_engine::caller::{Admitted, Work};
use airlock_engine::{Caller, Session};
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The most sessions open at once through one server.
pub const MAX_SESSIONS: usize = 16;
/// How long a session may live (the cell's lifetime, enforced by its supervisor).
pub const SESSION_LIFETIME: Duration = Duration::from_secs(30 * 60);

/// What a generic command returns.
#[derive(Debug, Clone, Serialize)]
pub struct CommandResult {
    #[serde(flatten)]
    pub meta: CallMeta,
    /// The first `max_output_bytes` of stdout, as text (invalid UTF-8 replaced).
    pub stdout: String,
    pub stdout_bytes: u64,
    pub stderr_bytes: u64,
}

impl CommandResult {
    fn of(execution: &Execution, cap: u64) -> CommandResult {
        let truncated =
            execution.stdout_seen > cap || (execution.stdout.len() as u64) < execution.stdout_seen;
        let shown = &execution.stdout[..execution.stdout.len().min(cap as usize)];
        let output = execution.report.output.as_ref();
        CommandResult {
            meta: CallMeta::of(&execution.report, truncated),
            stdout: String::from_utf8_lossy(shown).into_owned(),
            stdout_bytes: execution.stdout_seen,
            stderr_bytes: output.map_or(0, |o| o.stderr.bytes_seen),
        }
    }
}

struct OpenSession {
    session: Arc<Session>,
    output_bytes: u64,
    /// The tenant that opened it: only that tenant's calls can reach it (`None`: the
    /// stdio server's one local client).
    owner: Option<String>,
    /// Its cell's and session's slots of the owner's quotas.
    _admitted: Option<Admitted>,
}

/// The generic tools of one server: its open sessions, each bound to the tenant that
/// opened it.
pub struct Generic {
    toolbox: Arc<ToolBox>,
    sessions: Mutex<BTreeMap<String, OpenSession>>,
}

impl Generic {
    pub fn new(toolbox: Arc<ToolBox>) -> Generic {
        Generic {
            toolbox,
            sessions: Mutex::new(BTreeMap::new()),
        }
    }

    fn cap(&self) -> u64 {
        self.toolbox.registry.max_output_bytes
    }

    fn plan(&self, argv: &[String]) -> Result<airlock_contract::CellPlan, AgentError> {
        let contract = self.toolbox.registry.generic_contract.as_deref();
        let planned = self
            .toolbox
            .planner
            .plan(contract, argv)
            .map_err(|err| AgentError::Agent(format!("generic contract: {}", err.detail)))?;
        Ok(planned.plan)
    }

    /// Runs `argv` in a cell of its own, for `caller` (see [`admit`]).
    pub fn run_command(
        &self,
        argv: Vec<String>,
        stdin: &str,
        caller: Option<&Caller>,
        cancel: &Cancel,
    ) -> Result<CommandResult, AgentError> {
        check_argv(&argv)?;
        let _admitted = admit(caller, Work::Run)?;
        let plan = self.plan(&argv)?;
        let run = CommandRun {
            argv,
            stdin: stdin.as_bytes(),
            cap: self.cap(),
            keep_stderr: false,
            wall_time_ms: None,
        };
        let cell = self.cell("generic", caller);
        let executed = exec::run_once(&self.toolbox.engine, plan, cell, run, cancel)?;
        Ok(CommandResult::of(&executed, self.cap()))
    }

    /// A generic tool's cell of `workload_class` for `caller`: no credentials, a
    /// suspected escape's evidence as the planner keeps it.
    fn cell<'a>(&self, workload_class: &'a str, caller: Option<&'a Caller>) -> exec::Cell<'a> {
        let tenant = caller.map(Caller::tenant);
        exec::Cell {
            workload_class,
            credentials: Vec::new(),
            tenant,
            after_close: self.toolbox.planner.after_close(workload_class, tenant),
        }
    }

    /// Runs a Python snippet (`python3 -c CODE`) in a cell of its own.
    pub fn run_python(
        &self,
        code: &str,
        caller: Option<&Caller>,
        cancel: &Cancel,
    ) -> Result<CommandResult, AgentError> {
        let argv = vec!["python3".to_string(), "-c".to_string(), code.to_string()];
        self.run_command(argv, "", caller, cancel)
    }

    /// Opens a session owned by `caller`'s tenant; its id.
    pub fn session_open(&self, caller: Option<&Caller>) -> Result<String, AgentError> {
        if self.lock().len() >= MAX_SESSIONS {
            return Err(AgentError::Agent(format!(
                "{MAX_SESSIONS} sessions are open; close one first"
            )));
        }
        let admitted = admit(caller, Work::Session)?;
        let plan = self.plan(&["true".to_string()])?;
        let output_bytes = plan.limits.output_bytes;
        let cell = self.cell("generic-session", caller);
        let session = exec::open_session(&self.toolbox.engine, plan, cell, SESSION_LIFETIME)?;
        let id = session.id().to_string();
        self.lock().insert(
            id.clone(),
            OpenSession {
                session,
                output_bytes,
                owner: caller.map(|c| c.tenant().to_string()),
                _admitted: admitted,
            },
        );
        Ok(id)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, OpenSession>> {
        self.sessions.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Session `id`, if `caller` owns it. Another tenant's session is answered exactly
    /// as one that does not exist: its id tells nothing.
    fn session(
        &self,
        id: &str,
        caller: Option<&Caller>,
    ) -> Result<(Arc<Session>, u64), AgentError> {
        self.lock()
            .get(id)
            .filter(|open| owns(open.owner.as_deref(), caller))
            .map(|open| (Arc::clone(&open.session), open.output_bytes))
            .ok_or_else(|| no_session(id))
    }

    /// Runs `argv` in session `id`.
    pub fn session_exec(
        &self,
        id: &str,
        argv: Vec<String>,
        stdin: &str,
        caller: Option<&Caller>,
        cancel: &Cancel,
    ) -> Result<CommandResult, AgentError> {
        let (session, output_bytes) = self.session(id, caller)?;
        check_argv(&argv)?;
        let _admitted = admit(caller, Work::Command)?;
        let run = CommandRun {
            argv,
            stdin: stdin.as_bytes(),
            cap: self.cap(),
            keep_stderr: false,
            wall_time_ms: None,
        };
        let executed = exec::run_in(&session, output_bytes, run, cancel)?;
        Ok(CommandResult::of(&executed, self.cap()))
    }

    /// The content of `path` in session `id` (its first `max_output_bytes`).
    pub fn session_read_file(
        &self,
        id: &str,
        path: &str,
        caller: Option<&Caller>,
        cancel: &Cancel,
    ) -> Result<CommandResult, AgentError> {
        let argv = vec!["cat".to_string(), "--".to_string(), path.to_string()];
        self.session_exec(id, argv, "", caller, cancel)
    }

    /// Writes `content` to `path` in session `id` (created or replaced).
    pub fn session_write_file(
        &self,
        id: &str,
        path: &str,
        content: &str,
        caller: Option<&Caller>,
        cancel: &Cancel,
    ) -> Result<CommandResult, AgentError> {
        let argv = ["sh", "-c", "cat > \"$1\"", "sh", path]
            .map(String::from)
            .to_vec();
        self.session_exec(id, argv, content, caller, cancel)
    }

    /// Closes session `id` (if `caller` owns it): its cell is destroyed.
    pub fn session_close(&self, id: &str, caller: Option<&Caller>) -> Result<CallMeta, AgentError> {
        let open = {
            let mut sessions = self.lock();
            match sessions.get(id) {
                Some(open) if owns(open.owner.as_deref(), caller) => sessions.remove(id),
                _ => None,
            }
        }
        .ok_or_else(|| no_session(id))?;
        // A command still running in it holds the session: it is destroyed when that
        // command ends (nothing can reach it by its id any more).
        let session = Arc::try_unwrap(open.session).map_err(|_| {
            AgentError::Agent(
                "a command of the session is running; its cell is destroyed when it ends".into(),
            )
        })?;
        let report = session.close()?;
        Ok(CallMeta::of(&report, false))
    }
}

/// Whether `caller` is the tenant that opened a session owned by `owner`.
/// A command built from a tool call's arguments, as every door checks it
/// ([`airlock_contract::check_command`]): refused before any cell or quota slot, naming
/// the argument and the rule.
fn check_argv(argv: &[String]) -> Result<(), AgentError> {
    let input = airlock_contract::CommandInput {
        argv,
        ..airlock_contract::CommandInput::default()
    };
    airlock_contract::check_command(&input).map_err(|err| AgentError::Refused {
        class: airlock_cell::report::ResultClass::PolicyDenied,
        reason: err.reason().to_string(),
        message: err.to_string(),
    })
}

fn owns(owner: Option<&str>, caller: Option<&Caller>) -> bool {
    owner == caller.map(Caller::tenant)
}

fn no_session(id: &str) -> AgentError {
    AgentError::Agent(format!(
        "no open session {:?}",
        crate::schema::bounded(id, 64)
    ))
}

/// Takes `work`'s slot of `caller`'s quotas; nothing to take for the stdio server.
fn admit(caller: Option<&Caller>, work: Work) -> Result<Option<Admitted>, AgentError> {
    caller
        .map(|c| c.admit(work))
        .transpose()
        .map_err(|refused| AgentError::Refused {
            class: refused.class,
            reason: refused.reason,
            message: refused.message,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_is_reachable_only_by_the_tenant_that_opened_it() {
        let alice = Caller::unbounded("alice".into());
        let bob = Caller::unbounded("bob".into());
        assert!(owns(Some("alice"), Some(&alice)));
        assert!(!owns(Some("alice"), Some(&bob)));
        assert!(!owns(Some("alice"), None));
        assert!(!owns(None, Some(&alice)));
        assert!(owns(None, None));
    }
}
