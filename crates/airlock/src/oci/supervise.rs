//! The container's supervisor: the process `create` starts and whose pid the shim gets.
//! It is a single-threaded `airlock run` of the bundle: config.json -> terms
//! (airlock_oci::bundle, pure) -> the platform's contract narrowed by them -> plan ->
//! `Engine::run_container_here` (`run_here` with the container's doors: exec.rs). Once
//! the begin record exists (the engine's `on_recorded` hook) it tells `create` the
//! container is created and holds the payload until `start` connects to its socket;
//! then the cell runs it, and this process completes the record (with the container's
//! identity) and exits with the payload's exit code.
//!
//! Its stdio are the container's (the shim's pipes): it writes nothing of its own there;
//! its errors go to `--log` and, before the container is created, to `create`.

use super::commands::Globals;
use super::state::{self, Stored};
use super::Log;
use crate::config::OperatorConfig;
use airlock_cell::report::ResultClass;
use airlock_contract::{
    compile, default_contract, load_contract_file, read_seccomp_profile, CellIdentity, CellPlan,
    CompileInput, Contract, ImageDefaults, ResolvedImage,
};
use airlock_engine::handoff::classify_stdin;
use airlock_engine::{Engine, Refusal, RunRequest};
use airlock_images::merged::{merged_entries, MergedKind};
use airlock_oci::bundle::{apply_terms, container_terms, ContainerTerms, Selection};
use sha2::{Digest, Sha256};
use std::io::{Read, Write};
use std::os::fd::AsFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// The operator configuration's path (else `/etc/airlock/config.toml` when it exists).
const CONFIG_ENV: &str = "AIRLOCK_CONFIG";
/// The directory of the contracts `airlock.dev/contract` names (and `default.*`).
const CONTRACTS_ENV: &str = "AIRLOCK_CONTRACTS_DIR";
const CONTRACTS_DIR: &str = "/etc/airlock/contracts";
/// The workload class the records of containers are counted under.
const WORKLOAD_CLASS: &str = "container";
/// The field of the plan the spec's own seccomp profile is recorded as.
const SPEC_SECCOMP: &str = "config.json#linux.seccomp";

/// Why a container does not run: refused here (to be recorded with the command it asked
/// for), or by the policy step, which recorded it.
enum Stop {
    Refuse(Vec<String>, String),
    Recorded(String),
}

/// `create`'s end of the conversation: told "ok" once, or the error.
type Notifier = Arc<Mutex<Option<UnixStream>>>;

fn tell(notifier: &Notifier, word: &str) {
    if let Some(mut stream) = notifier.lock().ok().and_then(|mut n| n.take()) {
        let _ = stream.write_all(word.as_bytes());
    }
}

pub fn supervise(
    globals: &Globals,
    bundle: &Path,
    console_socket: Option<&Path>,
    id: &str,
) -> ExitCode {
    let started = Instant::now();
    // Its stderr is the container's: errors go to --log and to create, which reports them.
    let log = Log {
        path: globals.log.clone(),
        json: globals.log_format == "json",
        stderr: false,
    };
    let Ok(dir) = state::dir(&globals.root, id) else {
        return ExitCode::from(125);
    };
    let notifier: Notifier = match UnixStream::connect(state::notify_socket(&dir)) {
        Ok(stream) => Arc::new(Mutex::new(Some(stream))),
        Err(err) => {
            log.error(&format!("container {id}: create's socket: {err}"));
            return ExitCode::from(125);
        }
    };
    let fail = |error: String| {
        log.error(&error);
        tell(&notifier, &format!("error: {error}"));
        ExitCode::from(125)
    };
    let config = match load_config() {
        Ok(config) => config,
        Err(err) => return fail(format!("container {id}: {err}")),
    };
    let engine = match engine(&config) {
        Ok(engine) => engine,
        Err(err) => return fail(format!("container {id}: {err}")),
    };
    let planned = plan(bundle, id, &config)
        .and_then(|planned| terminal_matches(planned, console_socket.is_some()))
        .and_then(|planned| with_cgroup(planned, globals.systemd_cgroup));
    let ((terms, plan, class), cgroup) = match planned {
        Ok(both) => both,
        Err(Stop::Recorded(error)) => return fail(format!("container {id} refused: {error}")),
        Err(Stop::Refuse(argv, error)) => {
            // Refused before any cell: recorded like any refused run.
            let refused = engine.refuse(Refusal {
                argv: &argv,
                workload_class: WORKLOAD_CLASS,
                status: ResultClass::PolicyDenied,
                error: error.clone(),
                plan: None,
                tenant: None,
            });
            let run = refused.report.run_id;
            return fail(format!("container {id} refused (run {run}): {error}"));
        }
    };
    super::pod::plan(&plan);
    let start_listener = match UnixListener::bind(state::start_socket(&dir)) {
        Ok(listener) => listener,
        Err(err) => return fail(format!("container {id}: the start socket: {err}")),
    };
    let answer = StartAnswer::new(plan.isolation);
    let doors = match container_doors(&dir, console_socket, &plan) {
        Ok(doors) => airlock_cell::exec_door::ContainerDoors {
            cgroup,
            on_payload_started: answer.on_payload_started(),
            ..doors
        },
        Err(err) => return fail(format!("container {id}: {err}")),
    };
    let facts = super::exec::ExecFacts::of(&plan, &class, &terms);
    if let Err(err) = facts.save(&dir) {
        return fail(format!("container {id}: exec.json: {err}"));
    }
    let stored = Stored {
        id: id.to_owned(),
        bundle: bundle.to_path_buf(),
        rootfs: terms.rootfs.clone(),
        created: super::now_rfc3339(),
        pid: std::process::id(),
        pid_start: state::proc_stat(std::process::id()).map_or(0, |(_, s)| s),
        annotations: annotations(bundle),
        run_id: String::new(),
        started: false,
        limits: Some(plan.limits),
        isolation: plan.isolation,
    };
    let request = match request(plan, class, started, console_socket.is_some()) {
        Ok(request) => request,
        Err(err) => return fail(format!("container {id}: {err}")),
    };
    let hook = held_start(
        dir,
        stored,
        start_listener,
        notifier.clone(),
        log,
        answer.clone(),
    );
    let code = run(&engine, (request, doors), hook, &terms, &notifier, id);
    // A cell that ended without a word about its payload: `start` is answered as
    // before, the container is stopped now.
    answer.answer();
    code
}

/// `start`'s connection. runc's `start` returns with the container's process running;
/// here the cell's pid 1 spawns the payload after the supervisor got the start word, so
/// on the native tier the answer waits for the payload's start (the door's
/// `on_payload_started`): a `kill` right after `start` finds the payload, where it
/// found none and was lost. A gVisor cell has no door: answered at once.
#[derive(Clone)]
struct StartAnswer {
    pending: Arc<Mutex<Option<UnixStream>>>,
    at_payload: bool,
}

impl StartAnswer {
    fn new(isolation: airlock_contract::Isolation) -> StartAnswer {
        StartAnswer {
            pending: Arc::default(),
            at_payload: isolation == airlock_contract::Isolation::Native,
        }
    }

    fn on_payload_started(&self) -> Option<airlock_cell::exec_door::PayloadStarted> {
        let answer = self.clone();
        self.at_payload
            .then(|| Box::new(move || answer.answer()) as airlock_cell::exec_door::PayloadStarted)
    }

    /// Answers now, or once the payload has started.
    fn answer_or_hold(&self, mut stream: UnixStream) {
        match self.at_payload {
            true => *self.pending.lock().unwrap_or_else(|e| e.into_inner()) = Some(stream),
            false => {
                let _ = stream.write_all(b"ok");
            }
        }
    }

    fn answer(&self) {
        let held = self
            .pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(mut stream) = held {
            let _ = stream.write_all(b"ok");
        }
    }
}

/// A terminal needs the console socket its master goes to, and a console socket a
/// terminal, as runc's `create` says.
fn terminal_matches(
    planned: (ContainerTerms, CellPlan, String),
    console: bool,
) -> Result<(ContainerTerms, CellPlan, String), Stop> {
    let argv = planned.0.argv.clone();
    let refuse = |error: &str| Err(Stop::Refuse(argv, error.to_owned()));
    match (planned.0.terminal, console) {
        (true, false) => refuse("config.json process.terminal: a terminal needs --console-socket"),
        (false, true) => refuse(
            "--console-socket without config.json process.terminal: there is no terminal to send",
        ),
        _ => Ok(planned),
    }
}

/// The terms, the plan and the workload class of a container.
type Planned = (ContainerTerms, CellPlan, String);

/// The container's own cgroup, from `linux.cgroupsPath` read with `--systemd-cgroup`
/// (airlock_oci::cgroups_path); `None` (airlock's own `/airlock/<name>`) without one.
fn with_cgroup(
    planned: Planned,
    systemd: bool,
) -> Result<(Planned, Option<airlock_cell::cgroup::ContainerCgroupPath>), Stop> {
    let Some(raw) = planned.0.cgroups_path.clone().filter(|p| !p.is_empty()) else {
        return Ok((planned, None));
    };
    let refuse = |error: String| Err(Stop::Refuse(planned.0.argv.clone(), error));
    let path = match airlock_oci::cgroups_path::container_cgroup(&raw, systemd) {
        Ok(path) => path,
        Err(refusal) => return refuse(refusal.to_string()),
    };
    match airlock_cell::cgroup::ContainerCgroupPath::new(path) {
        Ok(path) => Ok((planned, Some(path))),
        Err(err) => refuse(err.to_string()),
    }
}

/// The container's doors: the exec socket and the console. A gVisor cell gets no exec
/// socket (runsc's exec is not wired: an exec finds no socket and fails); its console is
/// refused with its terminal by the tier's preflight.
fn container_doors(
    dir: &Path,
    console_socket: Option<&Path>,
    plan: &CellPlan,
) -> Result<airlock_cell::exec_door::ContainerDoors, String> {
    if plan.isolation == airlock_contract::Isolation::Gvisor {
        return Ok(airlock_cell::exec_door::ContainerDoors {
            exec: None,
            console: None,
            cgroup: None,
            on_payload_started: None,
        });
    }
    super::exec::doors(dir, console_socket)
}

/// The engine's hook once the begin record exists: the state is written, `create` told,
/// and the payload held until `start` connects. A state that cannot be written ends
/// this process (and so the cell) before anything runs.
fn held_start(
    dir: PathBuf,
    mut stored: Stored,
    listener: UnixListener,
    notifier: Notifier,
    log: Log,
    answer: StartAnswer,
) -> airlock_engine::RecordedHook {
    Box::new(move |run_id: &str| {
        stored.run_id = run_id.to_owned();
        // The pod's namespaces are held before the shim can learn this pid (pod.rs).
        let saved = state::save(&dir, &stored).map_err(|e| format!("state: {e}"));
        if let Err(err) = saved.and_then(|()| super::pod::hold()) {
            let error = format!("container {}: {err}", stored.id);
            log.error(&error);
            tell(&notifier, &format!("error: {error}"));
            std::process::exit(125);
        }
        tell(&notifier, "ok");
        loop {
            let Ok((mut stream, _)) = listener.accept() else {
                std::process::exit(125);
            };
            let mut word = String::new();
            let _ = stream.read_to_string(&mut word);
            if word != "start" {
                continue;
            }
            stored.started = true;
            if state::save(&dir, &stored).is_err() {
                let _ = stream.write_all(b"state not saved");
                continue;
            }
            let _ = std::fs::remove_file(state::start_socket(&dir));
            answer.answer_or_hold(stream);
            return;
        }
    })
}

/// The run, its record completed with the container's identity; the payload's exit code.
fn run(
    engine: &Engine,
    (mut request, doors): (RunRequest, airlock_cell::exec_door::ContainerDoors),
    hook: airlock_engine::RecordedHook,
    terms: &ContainerTerms,
    notifier: &Notifier,
    id: &str,
) -> ExitCode {
    request.on_recorded = Some(hook);
    let ran = engine.run_container_here(request, doors);
    if let Err(error) = super::pod::release() {
        tell(notifier, &format!("error: container {id}: {error}"));
        return ExitCode::from(125);
    }
    let mut finished = match ran {
        Ok(finished) => finished,
        Err(refused) => {
            let error = refused.report.error.unwrap_or_default();
            tell(notifier, &format!("error: container {id} refused: {error}"));
            return ExitCode::from(125);
        }
    };
    if let Some(error) = finished.report.error.clone() {
        // Told only when the cell failed before the record (no "ok" was sent).
        tell(notifier, &format!("error: container {id}: {error}"));
    }
    tell(
        notifier,
        &format!("error: container {id}: the cell ended before its start"),
    );
    finished.report.container = Some(terms.identity.clone());
    match engine.complete(finished) {
        Ok(report) => ExitCode::from(report.exit_code.clamp(0, 255) as u8),
        Err(_) => ExitCode::from(125),
    }
}

fn config_path() -> Option<PathBuf> {
    std::env::var_os(CONFIG_ENV)
        .map(PathBuf::from)
        .or_else(|| Some(PathBuf::from("/etc/airlock/config.toml")).filter(|p| p.exists()))
}

pub(super) fn load_config() -> Result<OperatorConfig, String> {
    OperatorConfig::load(config_path().as_deref()).map_err(|e| crate::user_message(&e))
}

/// The engine of the operator's configuration (its store, a fleet's Postgres included).
fn engine(config: &OperatorConfig) -> Result<Engine, String> {
    let engine_config = config
        .engine_config(config.state_dir(None))
        .map_err(|e| crate::user_message(&e))?;
    Ok(Engine::new(engine_config))
}

/// The bundle's plan: its terms applied to the platform's contract, compiled with the
/// bundle's root as the image, and the workload class it is recorded under. On refusal,
/// the command (for the record) and why.
#[allow(clippy::type_complexity)]
fn plan(
    bundle: &Path,
    id: &str,
    config: &OperatorConfig,
) -> Result<(ContainerTerms, CellPlan, String), Stop> {
    let config_json = bundle.join("config.json");
    let bytes = std::fs::read(&config_json)
        .map_err(|e| Stop::Refuse(Vec::new(), format!("{}: {e}", config_json.display())))?;
    let spec: oci_spec::runtime::Spec = serde_json::from_slice(&bytes)
        .map_err(|e| Stop::Refuse(Vec::new(), format!("{}: {e}", config_json.display())))?;
    // A refused spec is recorded with the command it asked for.
    let asked = || {
        spec.process()
            .as_ref()
            .and_then(|p| p.args().clone())
            .unwrap_or_default()
    };
    let terms =
        container_terms(&spec, id, bundle).map_err(|e| Stop::Refuse(asked(), e.to_string()))?;
    let refused = |error: String| Stop::Refuse(terms.argv.clone(), error);
    let named = |name: Option<&str>| {
        named_contract(name, &contracts_dir())
            .map(|(contract, dir)| (contract, dir, WORKLOAD_CLASS.to_owned()))
            .map_err(refused)
    };
    let (mut contract, base_dir, class) = match &terms.selection {
        Selection::Class(name) => class_contract(name, config, &terms.argv)?,
        Selection::Contract(name) => named(Some(name))?,
        Selection::Default => named(None)?,
    };
    apply_terms(&mut contract, &terms, SPEC_SECCOMP).map_err(|e| refused(e.to_string()))?;
    let profile = match &terms.seccomp_profile {
        Some(profile) => Some(profile.clone()),
        None => read_seccomp_profile(&contract, &base_dir)
            .map_err(|e| refused(format!("contract: {e}")))?,
    };
    let image = bundle_image(&terms, &bytes);
    let plan = compile(
        &contract,
        &CompileInput {
            base_dir: &base_dir,
            argv: &terms.argv,
            seccomp_profile: profile.as_deref(),
            image: Some(&image),
            pod_network: terms.pod_input(),
        },
    )
    .map_err(|e| refused(format!("contract: {e}")))?;
    Ok((terms, plan, class))
}

/// `airlock.dev/class`: the operator's workload class grants the container's command (as
/// `airlock run --class` does, its decision and denials recorded); a request that needs
/// an approval is refused (a container cannot wait for one).
fn class_contract(
    name: &str,
    config: &OperatorConfig,
    argv: &[String],
) -> Result<(Contract, PathBuf, String), Stop> {
    let refuse = |error: String| Stop::Refuse(argv.to_vec(), error);
    let args = crate::class::RunClassArgs {
        class: Some(name.to_owned()),
        request: None,
        tenant: None,
        approval: None,
        wait_approval: 0,
    };
    let store = config
        .store_location(None)
        .map_err(|e| refuse(crate::user_message(&e)))?;
    let config_path = config_path();
    match crate::class::contract_for_run(&args, config, config_path.as_deref(), argv, &store) {
        Ok(grant) => Ok((grant.contract, grant.base_dir, name.to_owned())),
        Err(crate::class::ClassStop::Usage(error)) => Err(refuse(format!(
            "annotation airlock.dev/class ({name}): {error}"
        ))),
        // The policy step recorded its denial.
        Err(crate::class::ClassStop::Denied {
            message, run_id, ..
        }) => Err(Stop::Recorded(format!(
            "annotation airlock.dev/class ({name}): policy_denied: {message} (run {})",
            run_id.unwrap_or_default()
        ))),
        Err(crate::class::ClassStop::Pending { needs, .. }) => Err(refuse(format!(
            "annotation airlock.dev/class ({name}): the command needs an approval of {} \
             (a container cannot wait for one)",
            needs.join(", ")
        ))),
    }
}

fn contracts_dir() -> PathBuf {
    std::env::var_os(CONTRACTS_ENV)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(CONTRACTS_DIR))
}

/// The platform's contract: the one `airlock.dev/contract` names, else `default.*` of
/// the directory, else airlock's default contract; with the directory its relative
/// paths are against.
fn named_contract(name: Option<&str>, dir: &Path) -> Result<(Contract, PathBuf), String> {
    let find = |name: &str| {
        ["yaml", "yml", "toml", "json"]
            .iter()
            .map(|ext| dir.join(format!("{name}.{ext}")))
            .find(|p| p.is_file())
    };
    let path = match name {
        Some(name) => Some(find(name).ok_or_else(|| {
            format!(
                "annotation airlock.dev/contract: no contract {name:?} in {} (name.yaml, \
                 .toml or .json)",
                dir.display()
            )
        })?),
        None => find("default"),
    };
    let contract = match path {
        Some(path) => load_contract_file(&path).map_err(|e| format!("contract: {e}"))?,
        None => default_contract(),
    };
    Ok((contract, dir.to_path_buf()))
}

/// The bundle's root as the plan's image: one layer, the spec's process as its defaults,
/// identified by config.json's digest.
fn bundle_image(terms: &ContainerTerms, config_json: &[u8]) -> ResolvedImage {
    let layers = vec![terms.rootfs.clone()];
    let listing = |dir: &str| {
        merged_entries(&layers, Path::new(dir))
            .into_iter()
            .map(|(name, kind)| match kind {
                MergedKind::Symlink(target) => (name, Some(target)),
                _ => (name, None),
            })
            .collect()
    };
    ResolvedImage {
        reference: format!("oci-bundle:{}", terms.identity.id),
        digest: format!("sha256:{}", hex::encode(Sha256::digest(config_json))),
        top_level: listing(""),
        etc: listing("etc"),
        defaults: ImageDefaults {
            user: terms.user.map(|(uid, gid)| CellIdentity { uid, gid }),
            env: terms.env.clone(),
            working_dir: Some(terms.cwd.clone()),
            command: terms.argv.clone(),
        },
        layers,
    }
}

fn request(
    plan: CellPlan,
    class: String,
    started: Instant,
    console: bool,
) -> Result<RunRequest, String> {
    let credentials = airlock_cell::credential_env(&plan).map_err(|e| e.to_string())?;
    // With a console the terminal's master is the shim's: its input comes from there.
    let stdin_fd = match console {
        true => None,
        false => std::io::stdin().as_fd().try_clone_to_owned().ok(),
    };
    let (stdin, _) = classify_stdin(stdin_fd, plan.terminal).map_err(|e| format!("stdin: {e}"))?;
    Ok(RunRequest {
        plan,
        workload_class: class,
        credentials,
        stdin,
        artifacts: None,
        stdout: std::io::stdout().as_fd().try_clone_to_owned().ok(),
        stderr: std::io::stderr().as_fd().try_clone_to_owned().ok(),
        started,
        tenant: None,
        on_recorded: None,
        // This process is the caller: the cell dies with it.
        caller: None,
    })
}

/// The spec's annotations, for `state`.
fn annotations(bundle: &Path) -> std::collections::BTreeMap<String, String> {
    std::fs::read(bundle.join("config.json"))
        .ok()
        .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
        .and_then(|v| serde_json::from_value(v["annotations"].clone()).ok())
        .unwrap_or_default()
}
