//! A tool call from request to verdict: the input is parsed and validated against the
//! tool's input schema before anything else (no plan, no cell: a refusal is recorded
//! with its class), the contract compiled, the command run in a cell of its own with
//! exactly the validated JSON on stdin, its stdout judged by `protocol::verdict`.

use crate::exec::{self, Cancel, CommandRun, Execution};
use crate::protocol::{self, reason, CellOutcome, ToolReply};
use crate::registry::{Registry, Tool};
use airlock_cell::report::{ResultClass, RunReport};
use airlock_contract::CellPlan;
use airlock_engine::caller::Work;
use airlock_engine::{AfterClose, Caller, Engine, Refusal};
use serde::Serialize;
use serde_json::Value;
use std::path::Path;
use std::sync::Arc;

/// The most bytes of a tool's input accepted.
pub const MAX_INPUT_BYTES: usize = 1 << 20;

/// A compiled plan and whatever must live as long as its cell (an image's lease).
pub struct PlannedCell {
    pub plan: CellPlan,
    pub keep_alive: Option<Box<dyn std::any::Any + Send>>,
}

/// Why no plan: a result class and the whole story for the record (not for the model).
pub struct PlanError {
    pub class: ResultClass,
    pub detail: String,
}

/// Turns a contract (unset: the default contract) and a command into a plan. The CLI's
/// planner resolves OCI images through the image store; [`HostPlanner`] knows only the
/// host's root.
pub trait Planner: Send + Sync {
    fn plan(&self, contract: Option<&Path>, argv: &[String]) -> Result<PlannedCell, PlanError>;
    /// What becomes of a suspected escape's evidence (its writable paths, copied before
    /// the cell was destroyed) for a cell of `workload_class` run for `tenant`: the CLI's
    /// planner quarantines it; `None` removes the copy.
    fn after_close(&self, _workload_class: &str, _tenant: Option<&str>) -> Option<AfterClose> {
        None
    }
}

/// Contracts with `image: host` only.
pub struct HostPlanner;

impl Planner for HostPlanner {
    fn plan(&self, contract: Option<&Path>, argv: &[String]) -> Result<PlannedCell, PlanError> {
        let refused = |err: airlock_contract::ContractError| PlanError {
            class: ResultClass::from_name(err.class()).unwrap_or(ResultClass::RuntimeFault),
            detail: format!("contract: {err}"),
        };
        let (contract, base) = match contract {
            Some(path) => (
                airlock_contract::load_contract_file(path).map_err(refused)?,
                path.parent().unwrap_or(Path::new("/")).to_path_buf(),
            ),
            None => (airlock_contract::default_contract(), std::env::temp_dir()),
        };
        let profile = airlock_contract::read_seccomp_profile(&contract, &base).map_err(refused)?;
        let mut input = airlock_contract::CompileInput::new(&base, argv);
        input.seccomp_profile = profile.as_deref();
        let plan = airlock_contract::compile(&contract, &input).map_err(refused)?;
        Ok(PlannedCell {
            plan,
            keep_alive: None,
        })
    }
}

/// What every result carries besides the envelope (MCP's structured results, the CLI).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct CallMeta {
    pub run_id: String,
    pub result_class: String,
    pub exit_code: Option<i32>,
    pub limit_fired: Option<String>,
    pub truncated: bool,
}

impl CallMeta {
    fn refused(run_id: &str, class: ResultClass) -> CallMeta {
        CallMeta {
            run_id: run_id.to_string(),
            result_class: class.as_str().to_string(),
            exit_code: None,
            limit_fired: None,
            truncated: false,
        }
    }

    pub fn of(report: &RunReport, truncated: bool) -> CallMeta {
        CallMeta {
            run_id: report.run_id.clone(),
            result_class: report.status.as_str().to_string(),
            exit_code: report.exit.code,
            limit_fired: report.limit_fired.map(|l| l.as_str().to_string()),
            truncated,
        }
    }
}

pub struct CallResult {
    pub reply: ToolReply,
    pub meta: CallMeta,
}

/// The registry, the engine and the planner: everything a tool call needs.
pub struct ToolBox {
    pub registry: Registry,
    pub engine: Arc<Engine>,
    pub planner: Arc<dyn Planner>,
    /// Values that must never reach the model (API keys), redacted from every message.
    pub secrets: Vec<String>,
}

impl ToolBox {
    pub fn new(registry: Registry, engine: Arc<Engine>, planner: Arc<dyn Planner>) -> ToolBox {
        ToolBox {
            registry,
            engine,
            planner,
            secrets: Vec::new(),
        }
    }

    /// Calls tool `name` with `input` (JSON text, as a model sends function arguments).
    pub fn call_text(&self, name: &str, input: &str, cancel: &Cancel) -> CallResult {
        self.call_text_within(name, input, cancel, None)
    }

    /// [`ToolBox::call_text`] for a service's `caller`: its cell takes a slot of the
    /// caller's quotas (or the call is refused, recorded, with the quota's reason) and
    /// the run is recorded under its tenant.
    pub fn call_text_as(
        &self,
        name: &str,
        input: &str,
        caller: &Caller,
        cancel: &Cancel,
    ) -> CallResult {
        match self.parse_input(name, input, Some(caller)) {
            Ok(value) => self.call_within(name, &value, Some(caller), cancel, None),
            Err(refused) => *refused,
        }
    }

    /// [`ToolBox::call_text`] whose command's wall time is at most `wall_cap_ms` (the
    /// agent loop's deadline); the contract's wall time otherwise.
    pub fn call_text_within(
        &self,
        name: &str,
        input: &str,
        cancel: &Cancel,
        wall_cap_ms: Option<u64>,
    ) -> CallResult {
        match self.parse_input(name, input, None) {
            Ok(value) => self.call_within(name, &value, None, cancel, wall_cap_ms),
            Err(refused) => *refused,
        }
    }

    fn parse_input(
        &self,
        name: &str,
        input: &str,
        caller: Option<&Caller>,
    ) -> Result<Value, Box<CallResult>> {
        if input.len() > MAX_INPUT_BYTES {
            let message = format!("the input is over {MAX_INPUT_BYTES} bytes");
            return Err(Box::new(self.refuse(
                name,
                caller,
                reason::INPUT_TOO_LARGE,
                &message,
            )));
        }
        serde_json::from_str::<Value>(input).map_err(|err| {
            let message = format!("the input is not JSON: {err}");
            Box::new(self.refuse(name, caller, reason::INPUT_NOT_JSON, &message))
        })
    }

    /// Calls tool `name` with `input`.
    pub fn call(&self, name: &str, input: &Value, cancel: &Cancel) -> CallResult {
        self.call_within(name, input, None, cancel, None)
    }

    /// [`ToolBox::call`] for a service's `caller` (see [`ToolBox::call_text_as`]).
    pub fn call_as(
        &self,
        name: &str,
        input: &Value,
        caller: &Caller,
        cancel: &Cancel,
    ) -> CallResult {
        self.call_within(name, input, Some(caller), cancel, None)
    }

    fn call_within(
        &self,
        name: &str,
        input: &Value,
        caller: Option<&Caller>,
        cancel: &Cancel,
        wall_cap_ms: Option<u64>,
    ) -> CallResult {
        let Some(tool) = self.registry.get(name) else {
            let message = format!(
                "there is no tool named {:?}",
                crate::schema::bounded(name, 64)
            );
            return self.refuse(name, caller, reason::UNKNOWN_TOOL, &message);
        };
        if let Err(violation) = tool.input.check(input) {
            let message = format!("the input does not match the tool's schema: {violation}");
            return self.refuse(name, caller, reason::INPUT_SCHEMA, &message);
        }
        // The quota slot is held until the cell is gone.
        let _admitted = match caller.map(|c| c.admit(Work::Run)).transpose() {
            Ok(admitted) => admitted,
            Err(refused) => {
                let message = crate::schema::bounded(&refused.message, protocol::MESSAGE_CHARS);
                return self.refuse_recorded(
                    name,
                    caller,
                    refused.class,
                    &refused.reason,
                    &message,
                    &message,
                );
            }
        };
        let planned = match self.plan_for(tool, caller) {
            Ok(planned) => planned,
            Err(refused) => return *refused,
        };
        let stdin = serde_json::to_vec(input).unwrap_or_default();
        let wall_time_ms = wall_cap_ms.map(|cap| cap.clamp(1, planned.plan.limits.wall_time_ms));
        let tenant = caller.map(Caller::tenant);
        let executed = self.execute(tool, planned.plan, tenant, &stdin, cancel, wall_time_ms);
        drop(planned.keep_alive);
        match executed {
            Ok(execution) => self.judge(tool, &execution, cancel),
            Err(err) => self.failed(name, caller, &err.to_string()),
        }
    }

    fn plan_for(
        &self,
        tool: &Tool,
        caller: Option<&Caller>,
    ) -> Result<PlannedCell, Box<CallResult>> {
        let planned = self
            .planner
            .plan(Some(&tool.contract), &tool.command)
            .map_err(|err| {
                let message = "the tool's contract could not be compiled (the audit record \
                               has the details)";
                Box::new(self.refuse_recorded(
                    &tool.name,
                    caller,
                    err.class,
                    reason::CONTRACT,
                    message,
                    &err.detail,
                ))
            })?;
        // The engine's one decision (it decides the run again): refused here, before
        // any value is read from this process's environment, with its own reason.
        let class = format!("tool:{}", tool.name);
        if let Err(forbidden) = self.engine.decide_credentials(&planned.plan, &class) {
            let message = format!(
                "the tool's contract asks for {}, which the operator forbids in cells",
                forbidden.from_env
            );
            return Err(Box::new(self.refuse_recorded(
                &tool.name,
                caller,
                ResultClass::PolicyDenied,
                forbidden.reason(),
                &message,
                &forbidden.to_string(),
            )));
        }
        Ok(planned)
    }

    fn execute(
        &self,
        tool: &Tool,
        plan: CellPlan,
        tenant: Option<&str>,
        stdin: &[u8],
        cancel: &Cancel,
        wall_time_ms: Option<u64>,
    ) -> Result<Execution, crate::AgentError> {
        let credentials = airlock_cell::credential_env(&plan)
            .map_err(|err| crate::AgentError::Agent(err.to_string()))?;
        let command = CommandRun {
            argv: plan.argv.clone(),
            stdin,
            cap: tool.max_output_bytes,
            keep_stderr: false,
            wall_time_ms,
        };
        let class = format!("tool:{}", tool.name);
        let cell = exec::Cell {
            workload_class: &class,
            credentials,
            tenant,
            after_close: self.planner.after_close(&class, tenant),
        };
        exec::run_once(&self.engine, plan, cell, command, cancel)
    }

    fn judge(&self, tool: &Tool, execution: &Execution, cancel: &Cancel) -> CallResult {
        let outcome = CellOutcome {
            report: &execution.report,
            stdout: &execution.stdout,
            stdout_seen: execution.stdout_seen,
            cap: tool.max_output_bytes,
        };
        let reply = if cancel.fired() {
            ToolReply::error(
                execution.report.status,
                reason::CANCELLED,
                "the call was cancelled; its cell is destroyed",
                &execution.report.run_id,
            )
        } else {
            protocol::verdict(&outcome, &tool.output)
        };
        CallResult {
            reply: self.redacted(reply),
            meta: CallMeta::of(&execution.report, outcome.truncated()),
        }
    }

    /// A call refused before any plan: recorded, with its reason.
    fn refuse(
        &self,
        name: &str,
        caller: Option<&Caller>,
        reason: &str,
        message: &str,
    ) -> CallResult {
        self.refuse_recorded(
            name,
            caller,
            ResultClass::PolicyDenied,
            reason,
            message,
            message,
        )
    }

    fn refuse_recorded(
        &self,
        name: &str,
        caller: Option<&Caller>,
        class: ResultClass,
        reason: &str,
        message: &str,
        detail: &str,
    ) -> CallResult {
        let argv = vec![format!("tool:{}", crate::schema::bounded(name, 64))];
        let recorded = self.engine.refuse(Refusal {
            argv: &argv,
            workload_class: &argv[0],
            status: class,
            error: format!("{reason}: {detail}"),
            plan: None,
            tenant: caller.map(Caller::tenant),
        });
        let run_id = recorded.report.run_id;
        CallResult {
            reply: self.redacted(ToolReply::error(class, reason, message, &run_id)),
            meta: CallMeta::refused(&run_id, class),
        }
    }

    fn failed(&self, name: &str, caller: Option<&Caller>, detail: &str) -> CallResult {
        let message = "airlock could not run the tool (the audit record has the details)";
        self.refuse_recorded(
            name,
            caller,
            ResultClass::RuntimeFault,
            reason::RUNTIME,
            message,
            detail,
        )
    }

    /// Secrets never reach the model, whatever a message quotes.
    pub fn redacted(&self, reply: ToolReply) -> ToolReply {
        if self.secrets.is_empty() {
            return reply;
        }
        serde_json::from_value(self.redacted_value(reply.to_value())).unwrap_or(reply)
    }

    /// `value` with every secret replaced.
    pub fn redacted_value(&self, value: Value) -> Value {
        airlock_store::Redactor::new(self.secrets.clone()).value(value)
    }
}
