//! Workload classes on the command line: `airlock class list|show|resolve`, and the
//! policy step of `airlock run --class NAME [--request req.json]`: the request is
//! evaluated against the operator's class before anything else; a denial is recorded
//! (`policy_denied`, its reason code, a capability-review record) and never reaches a
//! cell; a grant runs with the generated contract, and its record shows what was asked
//! and what was granted; a request that needs approval waits in `pending_approval`
//! (crate::approvals). The evaluation itself is airlock-policy's (docs/policy.md).

use crate::config::OperatorConfig;
use airlock_cell::report::{ResultClass, RunReport};
use airlock_contract::Contract;
use airlock_policy::{Asked, Denial, DenyReason, Evaluation, WorkloadClass};
use airlock_store::{RunStart, Store, StoreLocation};
use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Exit status of a request left waiting for an approval (EX_TEMPFAIL: try again).
pub const EXIT_PENDING: u8 = 75;

/// A class as loaded: where its relative paths are relative to.
pub struct LoadedClass {
    pub class: WorkloadClass,
    pub base_dir: PathBuf,
    /// The file it came from.
    pub source: PathBuf,
}

/// Every class of the configuration: `[policy.classes.NAME]` and one file per class in
/// `[policy] classes_dir` (relative to the configuration's directory). A name defined
/// twice is an error.
pub fn load_classes(
    config: &OperatorConfig,
    config_path: Option<&Path>,
) -> anyhow::Result<BTreeMap<String, LoadedClass>> {
    let config_dir = crate::config_dir(config_path);
    let mut classes = BTreeMap::new();
    for (name, class) in &config.policy.classes {
        let loaded = LoadedClass {
            class: class.clone(),
            base_dir: config_dir.clone(),
            source: config_path.map(Path::to_path_buf).unwrap_or_default(),
        };
        classes.insert(name.clone(), loaded);
    }
    let Some(dir) = &config.policy.classes_dir else {
        return Ok(classes);
    };
    let dir = config_dir.join(dir);
    let entries =
        std::fs::read_dir(&dir).with_context(|| format!("policy.classes_dir {}", dir.display()))?;
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "toml"))
        .collect();
    files.sort();
    for file in files {
        let name = file
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        let text = std::fs::read_to_string(&file)
            .with_context(|| format!("reading class file {}", file.display()))?;
        let class = airlock_policy::parse_class(&name, &text)
            .with_context(|| format!("class file {}", file.display()))?;
        if classes.contains_key(&name) {
            bail!(
                "class {name} is defined twice (the configuration and {})",
                file.display()
            );
        }
        let loaded = LoadedClass {
            class,
            base_dir: dir.clone(),
            source: file,
        };
        classes.insert(name, loaded);
    }
    Ok(classes)
}

#[derive(Args)]
pub struct ClassArgs {
    /// Operator configuration holding the classes (`[policy]`).
    #[arg(long, global = true)]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: ClassCommand,
}

#[derive(Subcommand)]
enum ClassCommand {
    /// The classes and what each is for.
    List,
    /// One class as loaded (JSON): template, bounds, execution, command rules.
    Show { name: String },
    /// Dry run: the contract a request would get, or its denial with the reason code, or
    /// what needs approval. Exit 0 granted, 1 denied, 75 needs approval.
    Resolve {
        name: String,
        /// The request (JSON): the capabilities asked for (docs/request.schema.json).
        #[arg(long)]
        request: Option<PathBuf>,
        /// The command the request would run (checked by the command policy).
        #[arg(trailing_var_arg = true)]
        command: Vec<String>,
    },
}

pub fn class_command(args: ClassArgs) -> ExitCode {
    let result = (|| -> anyhow::Result<ExitCode> {
        let config = OperatorConfig::load(args.config.as_deref())?;
        let classes = load_classes(&config, args.config.as_deref())?;
        match args.command {
            ClassCommand::List => {
                for (name, loaded) in &classes {
                    println!("{name:<20} {}", loaded.class.description);
                }
                Ok(ExitCode::SUCCESS)
            }
            ClassCommand::Show { name } => {
                let loaded = find(&classes, &name)?;
                let shown = json!({
                    "name": name,
                    "source": loaded.source,
                    "class": loaded.class,
                });
                println!("{}", serde_json::to_string_pretty(&shown)?);
                Ok(ExitCode::SUCCESS)
            }
            ClassCommand::Resolve {
                name,
                request,
                command,
            } => {
                let loaded = find(&classes, &name)?;
                let asked = read_request(request.as_deref())?;
                let evaluation = evaluate(loaded, &command, &asked);
                println!("{}", serde_json::to_string_pretty(&evaluation)?);
                Ok(ExitCode::from(match evaluation {
                    Evaluation::Granted { .. } => 0,
                    Evaluation::Denied { .. } => 1,
                    Evaluation::NeedsApproval { .. } => EXIT_PENDING,
                }))
            }
        }
    })();
    result.unwrap_or_else(|err| {
        eprintln!("airlock: {}", crate::user_message(&err));
        ExitCode::from(2)
    })
}

fn find<'a>(
    classes: &'a BTreeMap<String, LoadedClass>,
    name: &str,
) -> anyhow::Result<&'a LoadedClass> {
    classes.get(name).with_context(|| {
        let known: Vec<&str> = classes.keys().map(String::as_str).collect();
        format!("no class {name:?} (classes: {})", known.join(", "))
    })
}

fn read_request(path: Option<&Path>) -> anyhow::Result<Asked> {
    let Some(path) = path else {
        return Ok(Asked::default());
    };
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading the request {}", path.display()))?;
    Ok(Asked::from_json(&text)?)
}

/// The evaluation, with the request's input sources and the class's input roots
/// resolved on the host first (symlinks followed), so that a link below a root cannot
/// lead outside it: the policy compares paths lexically.
pub fn evaluate(loaded: &LoadedClass, argv: &[String], asked: &Asked) -> Evaluation {
    let (class, asked) = resolved_paths(loaded, asked);
    airlock_policy::evaluate(&class, argv, &asked)
}

/// [`evaluate`] for opening a session (no command yet).
pub fn evaluate_session(loaded: &LoadedClass, asked: &Asked) -> Evaluation {
    let (class, asked) = resolved_paths(loaded, asked);
    airlock_policy::evaluate_session(&class, &asked)
}

fn resolved_paths(loaded: &LoadedClass, asked: &Asked) -> (WorkloadClass, Asked) {
    let mut class = loaded.class.clone();
    for root in &mut class.bounds.input_roots {
        root.host = resolved(&root.host);
    }
    let mut asked = asked.clone();
    for input in &mut asked.inputs {
        input.source = resolved(&input.source);
    }
    (class, asked)
}

/// `path` with its symlinks resolved when it exists and is absolute; else as it is (the
/// policy then refuses what is not a clean absolute path).
fn resolved(path: &str) -> String {
    if !path.starts_with('/') {
        return path.to_string();
    }
    std::fs::canonicalize(path)
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_else(|_| path.to_string())
}

/// `airlock run`'s class options.
#[derive(Args, Default)]
pub struct RunClassArgs {
    /// Workload class the request is evaluated against (docs/policy.md); the contract is
    /// generated from its template. Excludes --contract.
    #[arg(long)]
    pub class: Option<String>,
    /// The capabilities asked for on top of the class's template (JSON).
    #[arg(long, requires = "class")]
    pub request: Option<PathBuf>,
    /// The tenant the request is made for; only root (the trusted front end) may say.
    /// Default: the caller's uid.
    #[arg(long, requires = "class")]
    pub tenant: Option<String>,
    /// An approval (its id) of exactly this request.
    #[arg(long, requires = "class")]
    pub approval: Option<String>,
    /// Wait up to this many seconds for a needed approval (default: return its id).
    #[arg(long, requires = "class", default_value_t = 0)]
    pub wait_approval: u64,
}

/// The contract a granted request runs with, and what the record says about the grant.
pub struct ClassGrant {
    pub contract: Contract,
    pub base_dir: PathBuf,
    /// The `policy.decision` event added to the run's record once it is complete.
    pub decision: Value,
    /// The class's retry rules and the request's idempotency key, when it has one.
    pub retry: Option<(airlock_policy::retry::RetryRules, String)>,
    /// A session's granted lifetime (a session request only).
    pub session_lifetime_seconds: Option<u64>,
    /// What the class allows where no cgroup is delegated to the caller.
    pub without_cgroup: airlock_policy::WithoutCgroup,
}

/// Why a class request goes no further.
#[derive(Debug)]
pub enum ClassStop {
    /// The command line, the request or the configuration is wrong (exit 2; 400).
    Usage(String),
    /// Denied, and recorded as run `run_id` (exit 125; 403).
    Denied {
        code: String,
        message: String,
        run_id: Option<String>,
    },
    /// Stored waiting for an approver (exit 75 with the id on stdout; 202).
    Pending {
        approval_id: String,
        needs: Vec<String>,
    },
}

impl ClassStop {
    /// Reports the stop on the command line; the exit status.
    pub fn report(self) -> ExitCode {
        match self {
            ClassStop::Usage(error) => {
                eprintln!("airlock run: {error}");
                ExitCode::from(2)
            }
            ClassStop::Denied {
                message, run_id, ..
            } => {
                let run = run_id
                    .map_or_else(|| "its record failed".to_string(), |id| format!("run {id}"));
                eprintln!("airlock: policy_denied: {message} ({run})");
                ExitCode::from(125)
            }
            ClassStop::Pending { approval_id, needs } => {
                eprintln!(
                    "airlock: pending_approval: {approval_id} needs approval of {} \
                     (airlock approvals approve {approval_id})",
                    needs.join(", ")
                );
                println!("{approval_id}");
                ExitCode::from(EXIT_PENDING)
            }
        }
    }
}

/// The policy step of `airlock run --class`: the grant, or why not (recorded).
pub fn contract_for_run(
    args: &RunClassArgs,
    config: &OperatorConfig,
    config_path: Option<&Path>,
    argv: &[String],
    store: &StoreLocation,
) -> Result<ClassGrant, ClassStop> {
    let name = args.class.as_deref().unwrap_or_default();
    let usage = |err: anyhow::Error| ClassStop::Usage(crate::user_message(&err));
    let classes = load_classes(config, config_path).map_err(usage)?;
    let loaded = find(&classes, name).map_err(usage)?;
    let requester = requester(args).map_err(usage)?;
    let request = Request {
        class: name,
        requester: &requester,
        argv,
        store,
        tenant: None,
    };
    let asked = match read_request(args.request.as_deref()) {
        Ok(asked) => asked,
        Err(err) => {
            let denial = Denial::new(DenyReason::RequestInvalid, crate::user_message(&err));
            return Err(request.deny(&Asked::default(), &denial));
        }
    };
    decide_request(
        &request,
        loaded,
        &asked,
        args.approval.as_deref(),
        args.wait_approval,
    )
}

/// Decides one request of class `loaded`: the grant (with the approvals it spent), the
/// recorded denial, or the pending approval (waited for up to `wait_seconds`).
pub fn decide_request(
    request: &Request<'_>,
    loaded: &LoadedClass,
    asked: &Asked,
    approval: Option<&str>,
    wait_seconds: u64,
) -> Result<ClassGrant, ClassStop> {
    let argv = request.argv;
    if asked.session.is_some() {
        return Err(ClassStop::Usage(
            "the request asks for a session: `airlock run` runs one command in one cell; \
             a class session is opened through the service (`POST /v1/sessions` with a \
             `class`)"
                .to_string(),
        ));
    }
    let evaluation = evaluate(loaded, argv, asked);
    if let Some(denial) = lockfile_denial(&evaluation, asked) {
        return Err(request.deny(asked, &denial));
    }
    conclude(request, loaded, evaluation, (approval, wait_seconds))
}

/// Decides opening a session of class `loaded` (its capabilities, no command: each
/// command is checked when it comes, [`check_session_command`]): the grant, the
/// recorded denial, or the pending approval.
pub fn decide_session(
    request: &Request<'_>,
    loaded: &LoadedClass,
    asked: &Asked,
    approval: Option<&str>,
) -> Result<ClassGrant, ClassStop> {
    let evaluation = evaluate_session(loaded, asked);
    conclude(request, loaded, evaluation, (approval, 0))
}

/// One command of an open session of class `loaded`: refused (and recorded like any
/// denial, under the session's tenant) when the class's command policy forbids it or
/// would route it to an approver; it never reaches the cell then.
pub fn check_session_command(request: &Request<'_>, loaded: &LoadedClass) -> Result<(), ClassStop> {
    airlock_policy::check_session_command(&loaded.class, request.argv)
        .map(drop)
        .map_err(|denial| request.deny(&Asked::default(), &denial))
}

/// The grant of an evaluation (with the approvals it spent), its recorded denial, or
/// its pending approval.
fn conclude(
    request: &Request<'_>,
    loaded: &LoadedClass,
    evaluation: Evaluation,
    (approval, wait_seconds): (Option<&str>, u64),
) -> Result<ClassGrant, ClassStop> {
    let grant = |contract: Box<Contract>,
                 asked: &Asked,
                 granted: &airlock_policy::Granted,
                 command: &airlock_policy::CommandVerdict,
                 approvals: &[String]| ClassGrant {
        contract: *contract,
        base_dir: loaded.base_dir.clone(),
        decision: request.grant_event(asked, granted, command, approvals),
        retry: retry_of(loaded, asked),
        session_lifetime_seconds: granted.session_lifetime_seconds,
        without_cgroup: loaded.class.ceilings_without_cgroup,
    };
    match evaluation {
        Evaluation::Granted {
            contract,
            asked,
            granted,
            command,
        } => Ok(grant(contract, &asked, &granted, &command, &[])),
        Evaluation::Denied { reason, asked } => Err(request.deny(&asked, &reason)),
        Evaluation::NeedsApproval {
            what,
            contract,
            asked,
            granted,
            command,
        } => {
            let approvals = crate::approvals::approvals_for(
                request,
                loaded,
                (approval, wait_seconds),
                &what,
                &asked,
            )?;
            Ok(grant(contract, &asked, &granted, &command, &approvals))
        }
    }
}

/// Why an `npm ci` the class grants may not run: it needs a `package-lock.json` pinning
/// every package with a hash in one of the request's read-only inputs, checked here on
/// the host before any cell exists (crates/policy/src/lockfile.rs).
fn lockfile_denial(evaluation: &Evaluation, asked: &Asked) -> Option<Denial> {
    let (Evaluation::Granted { command, .. } | Evaluation::NeedsApproval { command, .. }) =
        evaluation
    else {
        return None;
    };
    if !airlock_policy::lockfile::runs_npm_ci(command) {
        return None;
    }
    let missing = |detail: String| Some(Denial::new(DenyReason::LockfileMissing, detail));
    let Some(text) = asked
        .inputs
        .iter()
        .find_map(|i| read_lockfile(&resolved(&i.source)))
    else {
        return missing("npm ci needs a package-lock.json in a read-only input".to_string());
    };
    airlock_policy::lockfile::check_npm_lockfile(&text)
        .err()
        .and_then(missing)
}

/// `dir/package-lock.json`, a regular file (not through a link), bounded.
fn read_lockfile(dir: &str) -> Option<String> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(Path::new(dir).join("package-lock.json"))
        .ok()?;
    if !file.metadata().ok()?.is_file() {
        return None;
    }
    let mut text = String::new();
    file.take(airlock_policy::lockfile::MAX_LOCKFILE_BYTES)
        .read_to_string(&mut text)
        .ok()?;
    Some(text)
}

fn retry_of(
    loaded: &LoadedClass,
    asked: &Asked,
) -> Option<(airlock_policy::retry::RetryRules, String)> {
    asked
        .idempotency_key
        .clone()
        .map(|key| (loaded.class.retry, key))
}

/// Runs `request` (in this process, like `airlock run`), and again after a
/// `runtime_fault` as the class's retry rules allow for a request with an idempotency
/// key: the same plan, credentials and destinations, never more. Each failed attempt is
/// recorded as its own run. A request whose stdin is a stream is not retried (what the
/// first attempt read is gone).
pub fn run_with_retries(
    engine: &airlock_engine::Engine,
    mut request: airlock_engine::RunRequest,
    grant: Option<&ClassGrant>,
) -> Result<airlock_engine::FinishedRun, Box<airlock_engine::RecordedRefusal>> {
    let retry = grant.and_then(|g| g.retry.as_ref());
    let mut retries_done = 0;
    loop {
        let again = retry.and_then(|_| request_again(&request));
        let outcome = engine.run_here(request);
        let status = match &outcome {
            Ok(finished) => finished.report.status,
            Err(refused) => refused.report.status,
        };
        let delay = retry.and_then(|(rules, key)| {
            airlock_policy::retry::retry_delay(status.as_str(), retries_done, Some(key), rules)
        });
        let (Some(delay), Some(next)) = (delay, again) else {
            return outcome;
        };
        if let Ok(finished) = outcome {
            // The failed attempt's record is completed as it ended.
            if let Err(err) = engine.complete(finished) {
                eprintln!("airlock: warning: a failed attempt's record was not completed: {err}");
            }
        }
        retries_done += 1;
        let most = retry.map_or(0, |(rules, _)| rules.max_retries);
        eprintln!(
            "airlock: runtime_fault: retrying ({retries_done} of {most}) in {} ms",
            delay.as_millis()
        );
        std::thread::sleep(delay);
        request = next;
    }
}

/// The same request for another attempt, when it can be repeated as it was.
fn request_again(request: &airlock_engine::RunRequest) -> Option<airlock_engine::RunRequest> {
    if !matches!(request.stdin, airlock_cell::PayloadStdin::Null) {
        return None;
    }
    let copy = |fd: &Option<std::os::fd::OwnedFd>| fd.as_ref().and_then(|f| f.try_clone().ok());
    Some(airlock_engine::RunRequest {
        plan: request.plan.clone(),
        workload_class: request.workload_class.clone(),
        credentials: request.credentials.clone(),
        stdin: airlock_cell::PayloadStdin::Null,
        artifacts: request.artifacts.clone(),
        stdout: copy(&request.stdout),
        stderr: copy(&request.stderr),
        started: std::time::Instant::now(),
        tenant: request.tenant.clone(),
        on_recorded: None,
        caller: None,
    })
}

/// Who asks: `tenant:NAME` when root says so, else the caller's uid.
fn requester(args: &RunClassArgs) -> anyhow::Result<String> {
    let uid = airlock_store::caller_uid().unwrap_or(u32::MAX);
    match &args.tenant {
        None => Ok(format!("uid:{uid}")),
        Some(_) if uid != 0 => bail!("--tenant: only root may make a request for a tenant"),
        Some(name) => {
            Ok(airlock_policy::approval::Identity::parse(&format!("tenant:{name}"))?.to_string())
        }
    }
}

/// One request being decided: enough to record it.
pub struct Request<'a> {
    pub class: &'a str,
    pub requester: &'a str,
    pub argv: &'a [String],
    /// Runs (a denial's record) go to the fleet's store with `[store] url`; approvals and
    /// reviews stay in the state directory's file (docs/architecture.md, "Fleets").
    pub store: &'a StoreLocation,
    /// The service's tenant the run is recorded for (none on the command line).
    pub tenant: Option<&'a str>,
}

impl Request<'_> {
    fn grant_event(
        &self,
        asked: &Asked,
        granted: &airlock_policy::Granted,
        command: &airlock_policy::CommandVerdict,
        approvals: &[String],
    ) -> Value {
        json!({
            "decision": "grant",
            "class": self.class,
            "requester": self.requester,
            "asked": asked,
            "granted": granted,
            "command": command,
            "approvals": approvals,
        })
    }

    /// Records a denial: a run record `policy_denied` (no plan, no cell) whose
    /// `policy.decision` event carries the reason code (counted by `airlock stats`), and
    /// a capability-review record.
    pub fn deny(&self, asked: &Asked, denial: &Denial) -> ClassStop {
        let mut message = format!("{denial} (class {})", self.class);
        let recorded = self.record_denial(asked, denial, &message);
        if let Err(err) = &recorded {
            message += &format!(
                "; recording the denial failed: {}",
                crate::user_message(err)
            );
        }
        ClassStop::Denied {
            code: denial.code().to_string(),
            message,
            run_id: recorded.ok(),
        }
    }

    fn record_denial(
        &self,
        asked: &Asked,
        denial: &Denial,
        message: &str,
    ) -> anyhow::Result<String> {
        let store = Store::open_at(self.store)?;
        let start = RunStart {
            argv: self.argv.to_vec(),
            input_sha256: airlock_engine::record::InputHasher::new(self.argv).finish(),
            contract_sha256: String::new(),
            workload_class: self.class.to_string(),
            plan_json: Value::Null,
            session_id: None,
            tenant: self.tenant.map(str::to_string),
        };
        let handle = store.begin_run(start, Vec::new())?;
        let event = json!({
            "decision": "deny",
            "reason_code": denial.code(),
            "detail": denial.detail,
            "class": self.class,
            "requester": self.requester,
            "asked": asked,
        });
        store.append_event(&handle, airlock_store::kinds::POLICY_DECISION, event)?;
        let report = RunReport::refused(
            &handle.run_id(),
            ResultClass::PolicyDenied,
            message.to_string(),
        );
        let stored = serde_json::to_value(&report)?;
        airlock_engine::record::finish(&store, &handle, &report, &stored)?;
        store.record_review(airlock_store::approvals::NewReview {
            run_id: Some(handle.run_id()),
            workload_class: self.class.to_string(),
            requester: self.requester.to_string(),
            argv: self.argv.to_vec(),
            asked: serde_json::to_value(asked)?,
            reason_code: denial.code().to_string(),
            detail: denial.detail.clone(),
        })?;
        Ok(handle.run_id())
    }
}

/// After the run's record is complete: the `policy.decision` event of a class run
/// (asked vs granted), and the quarantine of a suspected escape's evidence.
pub fn after_run(
    store: &StoreLocation,
    report: &RunReport,
    grant: Option<&ClassGrant>,
    mut suspect: crate::quarantine::Suspect<'_>,
) {
    if let Some(grant) = grant {
        record_grant(store, &report.run_id, grant);
    }
    let uid = format!("uid:{}", airlock_store::caller_uid().unwrap_or(u32::MAX));
    let requester = grant.and_then(|g| g.decision["requester"].as_str());
    suspect.requester = requester.unwrap_or(&uid).to_string();
    crate::quarantine::preserve_if_suspected(store, report, &suspect);
}

fn record_grant(location: &StoreLocation, run_id: &str, grant: &ClassGrant) {
    let recorded = Store::open_at(location).and_then(|store| {
        store.append_run_event(
            run_id,
            airlock_store::kinds::POLICY_DECISION,
            grant.decision.clone(),
        )
    });
    if let Err(err) = recorded {
        eprintln!("airlock: warning: the run's policy decision was not recorded: {err}");
    }
}

#[derive(Subcommand)]
pub enum ReviewsCommand {
    /// Every capability-review record, oldest first.
    List {
        #[arg(long)]
        json: bool,
    },
}

/// `airlock reviews list`: the capability-review records policy denials left.
pub fn reviews(state_dir: &Path, json_output: bool) -> anyhow::Result<ExitCode> {
    let store = Store::open(state_dir)?;
    let reviews = store.list_reviews()?;
    if json_output {
        println!("{}", serde_json::to_string_pretty(&reviews)?);
        return Ok(ExitCode::SUCCESS);
    }
    for r in reviews {
        println!(
            "{}  {:<16} {:<34} {:<14} {}",
            r.review_id, r.workload_class, r.reason_code, r.requester, r.detail
        );
    }
    Ok(ExitCode::SUCCESS)
}
