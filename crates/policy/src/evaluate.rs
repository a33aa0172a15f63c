//! The evaluation of a request against its class, in the seed's order: does the task
//! run code at all (or only registered tools); is the command allowed (command policy);
//! are the asked capabilities within the class's bounds. It ends as granted (with the
//! generated contract, what was asked and what was granted), denied (a stable reason
//! code), or needs approval (what, and the contract an approval would grant).
//! Pure: the caller resolves paths on the host before, and runs or records after.

use crate::class::WorkloadClass;
use crate::command::{CommandVerdict, Decision};
use crate::reason::{Denial, DenyReason};
use crate::request::{Asked, AskedInput};
use airlock_contract::{
    Contract, Credential, Isolation, MappedInput, NetworkMode, ReadonlyInput, WritablePath,
};
use serde::Serialize;

/// One thing that needs a person's approval.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ApprovalItem {
    Domain { domain: String },
    Credential { name: String },
    Command { words: Vec<String>, why: String },
}

impl ApprovalItem {
    /// The capability's key: what an approval scoped to "this capability for this class"
    /// covers (`domain:pypi.test:443`, `credential:TOKEN`, `command:git push`).
    pub fn key(&self) -> String {
        match self {
            ApprovalItem::Domain { domain } => format!("domain:{domain}"),
            ApprovalItem::Credential { name } => format!("credential:{name}"),
            ApprovalItem::Command { words, .. } => format!("command:{}", words.join(" ")),
        }
    }
}

/// What a granted request gets beyond its template.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct Granted {
    pub domains: Vec<String>,
    pub memory_mb: i64,
    pub cpu_millis: i64,
    pub process_limit: i64,
    pub wall_time_seconds: i64,
    pub output_bytes: i64,
    pub credentials: Vec<String>,
    pub inputs: Vec<AskedInput>,
    pub tty: bool,
    pub exec_in_writable_paths: bool,
    /// The session's lifetime, when a session was asked for.
    pub session_lifetime_seconds: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "decision", rename_all = "snake_case")]
pub enum Evaluation {
    Granted {
        contract: Box<Contract>,
        asked: Asked,
        granted: Granted,
        command: CommandVerdict,
    },
    Denied {
        reason: Denial,
        asked: Asked,
    },
    NeedsApproval {
        what: Vec<ApprovalItem>,
        /// What an approval of every item grants.
        contract: Box<Contract>,
        asked: Asked,
        granted: Granted,
        command: CommandVerdict,
    },
}

impl Evaluation {
    pub fn denial(&self) -> Option<&Denial> {
        match self {
            Evaluation::Denied { reason, .. } => Some(reason),
            _ => None,
        }
    }
}

/// Evaluates `asked` for running `argv` in `class`.
pub fn evaluate(class: &WorkloadClass, argv: &[String], asked: &Asked) -> Evaluation {
    let denied = |reason| Evaluation::Denied {
        reason,
        asked: asked.clone(),
    };
    if let Err(denial) = check_execution(class, argv) {
        return denied(denial);
    }
    let command = class.commands.evaluate(argv);
    if let Some(forbidden) = command
        .commands
        .iter()
        .find(|c| c.decision == Decision::Forbidden)
    {
        return denied(Denial::new(
            DenyReason::CommandForbidden,
            format!("{} ({})", forbidden.words.join(" "), forbidden.why),
        ));
    }
    let (contract, granted, what) = match grant_capabilities(class, asked) {
        Ok(granted) => granted,
        Err(denial) => return denied(denial),
    };
    conclude((contract, granted, what), asked, command)
}

/// Opening a session of `class`: its capabilities against the bounds as for a run (a
/// session is asked for, for at most the class's lifetime when the request names
/// none), with no command yet: each command of the session is checked when it comes
/// ([`check_session_command`]).
pub fn evaluate_session(class: &WorkloadClass, asked: &Asked) -> Evaluation {
    let mut asked = asked.clone();
    asked.session.get_or_insert(crate::request::AskedSession {
        lifetime_seconds: class.bounds.session.max_lifetime_seconds,
    });
    let no_command = CommandVerdict {
        decision: Decision::Allow,
        commands: Vec::new(),
    };
    match grant_capabilities(class, &asked) {
        Ok(grant) => conclude(grant, &asked, no_command),
        Err(reason) => Evaluation::Denied { reason, asked },
    }
}

/// One command of an open class session: the class's code-execution rule and its
/// command policy. A command the policy routes to an approver is refused: approvals
/// cover requests, not the commands of a session already open.
pub fn check_session_command(
    class: &WorkloadClass,
    argv: &[String],
) -> Result<CommandVerdict, Denial> {
    check_execution(class, argv)?;
    let verdict = class.commands.evaluate(argv);
    let strictest = |decision| verdict.commands.iter().find(|c| c.decision == decision);
    if let Some(forbidden) = strictest(Decision::Forbidden) {
        return Err(Denial::new(
            DenyReason::CommandForbidden,
            format!("{} ({})", forbidden.words.join(" "), forbidden.why),
        ));
    }
    if let Some(prompt) = strictest(Decision::Prompt) {
        return Err(Denial::new(
            DenyReason::CommandNeedsApproval,
            format!("{} ({})", prompt.words.join(" "), prompt.why),
        ));
    }
    Ok(verdict)
}

/// The contract validated, and the command's approval items added: granted, or what
/// needs approval.
fn conclude(
    (contract, granted, mut what): Grant,
    asked: &Asked,
    command: CommandVerdict,
) -> Evaluation {
    if let Err(err) = airlock_contract::validate_contract(&contract) {
        return Evaluation::Denied {
            reason: Denial::new(DenyReason::RequestInvalid, err.to_string()),
            asked: asked.clone(),
        };
    }
    what.extend(
        command
            .commands
            .iter()
            .filter(|c| c.decision == Decision::Prompt)
            .map(|c| ApprovalItem::Command {
                words: c.words.clone(),
                why: c.why.clone(),
            }),
    );
    what.sort();
    what.dedup();
    let contract = Box::new(contract);
    let asked = asked.clone();
    if what.is_empty() {
        Evaluation::Granted {
            contract,
            asked,
            granted,
            command,
        }
    } else {
        Evaluation::NeedsApproval {
            what,
            contract,
            asked,
            granted,
            command,
        }
    }
}

/// Step one: a class without code execution runs only its registered tools.
fn check_execution(class: &WorkloadClass, argv: &[String]) -> Result<(), Denial> {
    let Some(program) = argv.first() else {
        return Err(Denial::new(
            DenyReason::CommandMissing,
            "the request names no command",
        ));
    };
    if class.execution.code || class.execution.tools.contains(program) {
        return Ok(());
    }
    Err(Denial::new(
        DenyReason::CodeExecutionNotAllowed,
        format!(
            "{program} is not a registered tool of the class (tools: {})",
            class.execution.tools.join(", ")
        ),
    ))
}

type Grant = (Contract, Granted, Vec<ApprovalItem>);

/// Step three: the template with every asked capability within the bounds applied, and
/// what of it needs an approval.
fn grant_capabilities(class: &WorkloadClass, asked: &Asked) -> Result<Grant, Denial> {
    let mut contract = class.template.clone();
    let mut what = Vec::new();
    grant_resources(class, asked, &mut contract)?;
    let domains = grant_domains(class, asked, &mut contract, &mut what)?;
    let credentials = grant_credentials(class, asked, &mut contract, &mut what)?;
    grant_inputs(class, &asked.inputs, &mut contract)?;
    let exec = grant_exec(class, asked, &mut contract)?;
    if asked.tty && !class.bounds.tty {
        return Err(Denial::new(
            DenyReason::TtyNotAllowed,
            "the class gives no terminal",
        ));
    }
    contract.terminal |= asked.tty;
    contract.isolation = granted_isolation(class, asked)?;
    let session = grant_session(class, asked)?;
    let r = &contract.resources;
    let granted = Granted {
        domains,
        memory_mb: r.memory_mb,
        cpu_millis: r.cpu_millis,
        process_limit: r.process_limit,
        wall_time_seconds: r.wall_time_seconds,
        output_bytes: r.output_bytes,
        credentials,
        inputs: asked.inputs.clone(),
        tty: contract.terminal,
        exec_in_writable_paths: exec,
        session_lifetime_seconds: session,
    };
    Ok((contract, granted, what))
}

/// The strongest of the template's tier, the class's required tier and the asked one; a
/// request asking for less than the class requires is denied rather than raised, so the
/// caller learns that its ask was not what ran.
fn granted_isolation(class: &WorkloadClass, asked: &Asked) -> Result<Isolation, Denial> {
    let required = class.bounds.isolation;
    match asked.isolation {
        Some(tier) if tier < required => Err(Denial::new(
            DenyReason::IsolationBelowClass,
            format!(
                "isolation {} < the class's {}",
                tier.as_str(),
                required.as_str()
            ),
        )),
        tier => Ok(class
            .template
            .isolation
            .max(required)
            .max(tier.unwrap_or_default())),
    }
}

/// A figure asked for within its bound replaces the template's.
fn bounded(
    asked: Option<i64>,
    bound: Option<i64>,
    reason: DenyReason,
    name: &str,
    field: &mut i64,
) -> Result<(), Denial> {
    let Some(value) = asked else { return Ok(()) };
    let limit = bound.unwrap_or(*field);
    if value > limit {
        return Err(Denial::new(reason, format!("{name} {value} > {limit}")));
    }
    *field = value;
    Ok(())
}

fn grant_resources(
    class: &WorkloadClass,
    asked: &Asked,
    contract: &mut Contract,
) -> Result<(), Denial> {
    let b = &class.bounds;
    let r = &mut contract.resources;
    bounded(
        asked.memory_mb,
        b.max_memory_mb,
        DenyReason::MemoryAboveClass,
        "memory_mb",
        &mut r.memory_mb,
    )?;
    bounded(
        asked.cpu_millis,
        b.max_cpu_millis,
        DenyReason::CpuAboveClass,
        "cpu_millis",
        &mut r.cpu_millis,
    )?;
    bounded(
        asked.process_limit,
        b.max_process_limit,
        DenyReason::ProcessesAboveClass,
        "process_limit",
        &mut r.process_limit,
    )?;
    bounded(
        asked.wall_time_seconds,
        b.max_wall_time_seconds,
        DenyReason::WallTimeAboveClass,
        "wall_time_seconds",
        &mut r.wall_time_seconds,
    )?;
    bounded(
        asked.output_bytes,
        b.max_output_bytes,
        DenyReason::OutputAboveClass,
        "output_bytes",
        &mut r.output_bytes,
    )
}

/// Whether the class's `bound` entry covers the asked destination: the same text, or a
/// `*.apex[:port]` bound and a sub-domain of apex with the same port part.
pub fn domain_within(bound: &str, asked: &str) -> bool {
    let asked = asked.to_ascii_lowercase();
    let bound = bound.to_ascii_lowercase();
    if bound == asked {
        return true;
    }
    let Some(apex_port) = bound.strip_prefix("*.") else {
        return false;
    };
    let (apex, port) = split_port(apex_port);
    let (host, asked_port) = split_port(&asked);
    port == asked_port && host.ends_with(&format!(".{apex}")) && !host.starts_with("*.")
}

fn split_port(destination: &str) -> (&str, Option<&str>) {
    match destination.rsplit_once(':') {
        Some((host, port)) if port.bytes().all(|b| b.is_ascii_digit()) => (host, Some(port)),
        _ => (destination, None),
    }
}

fn grant_domains(
    class: &WorkloadClass,
    asked: &Asked,
    contract: &mut Contract,
    what: &mut Vec<ApprovalItem>,
) -> Result<Vec<String>, Denial> {
    for domain in &asked.domains {
        let in_template = contract.network.mode == NetworkMode::Allowlist
            && contract
                .network
                .allowed_domains
                .iter()
                .any(|d| d.eq_ignore_ascii_case(domain));
        if in_template {
            continue;
        }
        if !class
            .bounds
            .requestable_domains
            .iter()
            .any(|b| domain_within(b, domain))
        {
            return Err(Denial::new(DenyReason::DomainNotInClass, domain.clone()));
        }
        what.push(ApprovalItem::Domain {
            domain: domain.clone(),
        });
        contract.network.mode = NetworkMode::Allowlist;
        contract.network.allowed_domains.push(domain.clone());
    }
    Ok(asked.domains.clone())
}

fn grant_credentials(
    class: &WorkloadClass,
    asked: &Asked,
    contract: &mut Contract,
    what: &mut Vec<ApprovalItem>,
) -> Result<Vec<String>, Denial> {
    for name in &asked.credentials {
        if contract.credentials.iter().any(|c| &c.name == name) {
            continue;
        }
        let offered: Option<&Credential> = class
            .bounds
            .requestable_credentials
            .iter()
            .find(|c| &c.name == name);
        let Some(credential) = offered else {
            return Err(Denial::new(DenyReason::CredentialNotInClass, name.clone()));
        };
        what.push(ApprovalItem::Credential { name: name.clone() });
        contract.credentials.push(credential.clone());
    }
    Ok(asked.credentials.clone())
}

/// `path` when it is absolute and has no `.`, `..` or empty components (a trailing `/`
/// removed); inputs are compared lexically, so nothing may walk out of a root.
pub fn normal_absolute(path: &str) -> Option<String> {
    let rest = path.strip_prefix('/')?;
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    if rest.is_empty() {
        return Some("/".to_string());
    }
    let clean = rest
        .split('/')
        .all(|c| !c.is_empty() && c != "." && c != "..");
    clean.then(|| format!("/{rest}"))
}

/// Whether `path` is `root` or below it (both normal absolute paths).
fn at_or_below(root: &str, path: &str) -> bool {
    root == "/" || path == root || path.starts_with(&format!("{root}/"))
}

fn grant_inputs(
    class: &WorkloadClass,
    inputs: &[AskedInput],
    contract: &mut Contract,
) -> Result<(), Denial> {
    for input in inputs {
        let source = normal_absolute(&input.source);
        let target = normal_absolute(&input.target);
        let root = class.bounds.input_roots.iter().find(|root| {
            source
                .as_deref()
                .is_some_and(|s| normal_absolute(&root.host).is_some_and(|h| at_or_below(&h, s)))
        });
        let Some(root) = root else {
            return Err(Denial::new(
                DenyReason::InputNotInClass,
                input.source.clone(),
            ));
        };
        let target_ok = target.as_deref().is_some_and(|t| {
            normal_absolute(&root.mount_under).is_some_and(|m| at_or_below(&m, t))
        });
        if !target_ok {
            return Err(Denial::new(
                DenyReason::InputTargetNotAllowed,
                format!(
                    "{} (inputs of {} mount under {})",
                    input.target, root.host, root.mount_under
                ),
            ));
        }
        contract
            .filesystem
            .readonly_inputs
            .push(ReadonlyInput::Mapped(MappedInput {
                source: source.unwrap_or_default(),
                target: target.unwrap_or_default(),
            }));
    }
    Ok(())
}

fn grant_exec(
    class: &WorkloadClass,
    asked: &Asked,
    contract: &mut Contract,
) -> Result<bool, Denial> {
    if class.bounds.exec_in_writable_paths {
        return Ok(true);
    }
    if asked.exec_in_writable_paths == Some(true) {
        return Err(Denial::new(
            DenyReason::ExecInWritableNotAllowed,
            "the class's writable paths are not executable",
        ));
    }
    for path in &mut contract.filesystem.writable_paths {
        *path = WritablePath::Detailed(airlock_contract::DetailedWritablePath {
            path: match path {
                WritablePath::Path(p) => p.clone(),
                WritablePath::Detailed(d) => d.path.clone(),
            },
            size_mb: match path {
                WritablePath::Path(_) => airlock_contract::DEFAULT_WRITABLE_SIZE_MB,
                WritablePath::Detailed(d) => d.size_mb,
            },
            exec: false,
        });
    }
    Ok(false)
}

fn grant_session(class: &WorkloadClass, asked: &Asked) -> Result<Option<u64>, Denial> {
    let Some(session) = asked.session else {
        return Ok(None);
    };
    let bounds = class.bounds.session;
    if !bounds.allowed {
        return Err(Denial::new(
            DenyReason::SessionNotAllowed,
            "the class runs one command per cell",
        ));
    }
    if session.lifetime_seconds > bounds.max_lifetime_seconds {
        return Err(Denial::new(
            DenyReason::SessionLifetimeAboveClass,
            format!(
                "lifetime_seconds {} > {}",
                session.lifetime_seconds, bounds.max_lifetime_seconds
            ),
        ));
    }
    Ok(Some(session.lifetime_seconds))
}
