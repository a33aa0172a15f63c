//! `airlock run` handed to a running service: the protocol on the service's unix stream
//! socket and the service's side of it ([`serve_connection`]).
//!
//! The client sends [`HANDOFF_MAGIC`], then one frame (a little-endian u32 length and
//! that many bytes of JSON: a [`HandoffRequest`]) whose length prefix carries its stdin,
//! stdout and stderr as SCM_RIGHTS. The service answers with one [`HandoffReply`] frame:
//! `Declined` (it does not serve this run: the client runs it in-process, nothing was
//! recorded), `Refused` (recorded, nothing ran: exit 125) or `Finished` (the run's result,
//! redacted like the store's records). After `Finished` the client writes its result file
//! itself (as itself, where it asked), tells the service whether that worked
//! ([`HandoffDelivery`]), and the service completes the record (a failed delivery is part
//! of it, as for a local run) and sends `Completed` with the exit code. A client that
//! asked for no result file ([`HandoffRequest::result_file`]) has nothing to deliver:
//! `Finished` comes without the plan and says `delivery: false`, and `Completed` follows
//! once the record is complete, with no delivery in between.
//!
//! The service never trusts the client's view of the run: it parses and compiles the
//! contract itself, and every host path the contract names (the seccomp profile, the
//! read-only inputs, `etc_files`) is opened on a thread whose file-system identity is the
//! peer's (uid, gid and groups from SO_PEERCRED/SO_PEERGROUPS): a path the peer may not
//! read is refused (`policy_denied`), and one it may is pinned by the descriptor opened
//! as the peer (`/proc/<service>/fd/<n>`) so that swapping a symlink afterwards changes
//! nothing (docs/threat-model.md, "Hand-off").

use crate::inputs::InputContents;
use crate::{record, Engine, EngineError, Refusal, RunRequest};
use airlock_cell::peer;
use airlock_cell::report::{ResultClass, RunReport};
use airlock_cell::stdin_relay::StdinRecord;
use airlock_cell::PayloadStdin;
use airlock_contract::{
    compile, default_contract, parse_contract, read_seccomp_profile, CellPlan, CompileInput,
    Contract, ContractFormat, EnvVar, EtcEntry, MountPlan, NetworkPlan, ResolvedImage, HOST_IMAGE,
};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// The first 8 bytes a hand-off client sends; the service routes its socket on them.
pub const HANDOFF_MAGIC: [u8; 8] = *b"ALHAND01";
/// Largest request frame the service reads (a contract and an argv).
const MAX_REQUEST_BYTES: usize = 1 << 20;
/// Largest reply frame a client reads (a report carries its output's bounded head and
/// tail and its egress records).
const MAX_REPLY_BYTES: usize = 256 << 20;
/// The descriptors of a request: stdin, stdout, stderr.
const REQUEST_FDS: usize = 3;

/// Which contract the run uses.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum HandoffContract {
    /// The default contract (`airlock run` without `--contract`).
    Default,
    /// A contract document as the client read it; `format` is its file's extension.
    Text { text: String, format: String },
    /// A contract the service knows by name ([`HandoffGate::named_contract`]).
    Named { name: String },
}

/// What the client asks the service to run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HandoffRequest {
    pub contract: HandoffContract,
    /// Relative paths of the contract resolve here (the contract file's directory, or the
    /// client's working directory), and only as far as the peer may read.
    pub base_dir: PathBuf,
    pub argv: Vec<String>,
    /// Added to the plan's environment (not secret; a name given twice: this value wins).
    pub env: Vec<(String, String)>,
    pub workload_class: String,
    /// May only lower the contract's `wall_time_ms`.
    pub wall_time_ms: Option<u64>,
    /// The client's environment variables that the contract's credentials read
    /// (`from_env`), as the client has them: the run gets them exactly as a run in the
    /// client's process would, and its records redact them alike.
    #[serde(default)]
    pub credential_values: Vec<(String, String)>,
    /// Whether the client writes a result file (`--result`). Without one it has nothing
    /// to deliver: the service completes the record without waiting for a
    /// [`HandoffDelivery`] and sends `Finished` without the plan (the result file is the
    /// only use of it). A client that does not say (an older one) writes one.
    #[serde(default = "yes")]
    pub result_file: bool,
}

fn yes() -> bool {
    true
}

/// Service -> client.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum HandoffReply {
    /// Not served here (nothing recorded, nothing ran): the client runs it in-process.
    Declined { why: String },
    /// Refused before its payload started (recorded when the store could be opened).
    Refused {
        report: Box<RunReport>,
        plan: Option<Box<CellPlan>>,
    },
    /// The run is over; its record waits for the client's [`HandoffDelivery`], unless
    /// `delivery` is false (the client asked for no result file: `Completed` follows
    /// without one).
    Finished {
        report: Box<RunReport>,
        /// `None` if it could not be redacted, or was not asked for (no result file).
        plan: Option<Box<CellPlan>>,
        inputs: Option<InputContents>,
        /// Whether the service waits for a [`HandoffDelivery`] (a service that does not
        /// say, an older one, does).
        #[serde(default = "yes")]
        delivery: bool,
    },
    /// The record is complete (`error`: it could not be, exit 125).
    Completed {
        exit_code: i32,
        error: Option<String>,
    },
}

/// Client -> service after `Finished`: whether its result file was written.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HandoffDelivery {
    /// Why the result file could not be written (the run becomes `delivery_failed`).
    pub failure: Option<String>,
}

/// The connected client, as the kernel saw it at `connect`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HandoffPeer {
    pub uid: u32,
    pub gid: u32,
    pub pid: i32,
}

/// The service's yes to a client: its tenant, and what it holds for the run's life (a
/// quota slot), released when the run ends.
pub struct HandoffAdmission {
    pub tenant: Option<String>,
    pub guard: Box<dyn Send>,
}

/// The service's no: recorded as a refused run of this class.
#[derive(Debug, Clone)]
pub struct HandoffRefusal {
    pub class: ResultClass,
    pub error: String,
}

/// The service's tenant and quota check, and the contracts it knows by name.
pub trait HandoffGate: Sync {
    fn admit(&self, peer: &HandoffPeer) -> Result<HandoffAdmission, HandoffRefusal>;
    /// The contract called `name`, if the service has one.
    fn named_contract(&self, _name: &str) -> Option<Contract> {
        None
    }
    /// A client contract's OCI image (pinned by digest, so the same content in any
    /// store), resolved in the service's own image store and leased for the run; `None`
    /// when the service cannot serve it (no store, not in it, a reference its policy
    /// refuses): the client then runs it in its own process with its own store and
    /// policy.
    fn image(&self, _reference: &str) -> Option<LeasedImage> {
        None
    }
}

/// A resolved OCI image and the lease that keeps its layers from removal while held.
pub struct LeasedImage {
    pub image: ResolvedImage,
    pub lease: ImageLease,
}

/// Held while a cell may use an image's layers.
pub type ImageLease = Box<dyn std::any::Any + Send + Sync>;

/// A gate that admits every peer into no tenant (a single-user host, the benchmarks).
pub struct AdmitEveryone;

impl HandoffGate for AdmitEveryone {
    fn admit(&self, _peer: &HandoffPeer) -> Result<HandoffAdmission, HandoffRefusal> {
        Ok(HandoffAdmission {
            tenant: None,
            guard: Box::new(()),
        })
    }
}

fn protocol(message: impl Into<String>) -> EngineError {
    EngineError::FactoryProtocol(format!("hand-off: {}", message.into()))
}

fn io_error(context: &str) -> impl FnOnce(std::io::Error) -> EngineError + '_ {
    move |source| EngineError::Factory {
        context: format!("hand-off: {context}"),
        source,
    }
}

/// Writes one frame: the length, then the JSON body. The descriptors travel with the
/// length (so that they arrive with the first bytes the peer reads of the frame).
fn write_frame<M: Serialize>(
    mut stream: &UnixStream,
    message: &M,
    fds: &[BorrowedFd<'_>],
) -> Result<(), EngineError> {
    let body = serde_json::to_vec(message).map_err(|e| protocol(e.to_string()))?;
    let length = u32::try_from(body.len())
        .map_err(|_| protocol("a frame too large"))?
        .to_le_bytes();
    if fds.is_empty() {
        stream.write_all(&length).map_err(io_error("write"))?;
    } else {
        let raw: Vec<i32> = fds.iter().map(|f| f.as_raw_fd()).collect();
        peer::send_with_fds(stream.as_fd(), &length, &raw).map_err(io_error("sendmsg"))?;
    }
    stream.write_all(&body).map_err(io_error("write"))
}

/// Reads one frame of at most `max` bytes and up to `max_fds` descriptors; `None` when
/// the peer closed the connection before a frame began.
fn read_frame<M: DeserializeOwned>(
    mut stream: &UnixStream,
    max: usize,
    max_fds: usize,
) -> Result<Option<(M, Vec<OwnedFd>)>, EngineError> {
    let mut length = [0u8; 4];
    let (got, fds) =
        peer::recv_with_fds(stream.as_fd(), &mut length, max_fds).map_err(io_error("recvmsg"))?;
    if got == 0 {
        return Ok(None);
    }
    stream
        .read_exact(&mut length[got..])
        .map_err(io_error("read"))?;
    let length = u32::from_le_bytes(length) as usize;
    if length > max {
        return Err(protocol(format!(
            "a frame of {length} bytes (at most {max})"
        )));
    }
    let mut body = vec![0u8; length];
    stream.read_exact(&mut body).map_err(io_error("read"))?;
    let message = serde_json::from_slice(&body).map_err(|e| protocol(e.to_string()))?;
    Ok(Some((message, fds)))
}

// ---- the client's side (airlock run) ----

/// Sends the magic and `request` with the client's stdin, stdout and stderr.
pub fn send_request(
    mut stream: &UnixStream,
    request: &HandoffRequest,
    stdio: [BorrowedFd<'_>; 3],
) -> Result<(), EngineError> {
    stream
        .write_all(&HANDOFF_MAGIC)
        .map_err(io_error("write"))?;
    write_frame(stream, request, &stdio)
}

/// The service's next reply; `None` when it closed the connection (it died).
pub fn recv_reply(stream: &UnixStream) -> Result<Option<HandoffReply>, EngineError> {
    Ok(read_frame(stream, MAX_REPLY_BYTES, 0)?.map(|(reply, _)| reply))
}

pub fn send_delivery(stream: &UnixStream, delivery: &HandoffDelivery) -> Result<(), EngineError> {
    write_frame(stream, delivery, &[])
}

// ---- what the payload reads on stdin (shared with the in-process path) ----

/// How the caller's stdin reaches the payload (see `crates/airlock/src/run.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StdinKind {
    Terminal,
    NullDevice,
    Stream,
    IntoTerminal,
}

/// Decides from the descriptor alone, reading none of it: a terminal (or none) gives
/// the payload the null device (a tty handle would let it type into the caller's
/// terminal), unless the plan has a terminal (everything goes into it); the null device
/// is not relayed; anything else is relayed into a pipe of the cell.
pub fn classify_stdin(
    fd: Option<OwnedFd>,
    terminal_plan: bool,
) -> std::io::Result<(PayloadStdin, StdinKind)> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let Some(fd) = fd else {
        return Ok((PayloadStdin::Null, StdinKind::Terminal));
    };
    if terminal_plan {
        return Ok((PayloadStdin::Relayed(fd), StdinKind::IntoTerminal));
    }
    if peer::is_terminal(fd.as_fd()) {
        return Ok((PayloadStdin::Null, StdinKind::Terminal));
    }
    let meta = std::fs::File::from(fd.try_clone()?).metadata()?;
    // The null device is character device 1:3.
    if meta.file_type().is_char_device() && meta.rdev() == libc::makedev(1, 3) {
        return Ok((PayloadStdin::Null, StdinKind::NullDevice));
    }
    Ok((PayloadStdin::Relayed(fd), StdinKind::Stream))
}

/// What the payload got on stdin, for the record.
pub fn stdin_record(kind: StdinKind, relayed: Option<StdinRecord>) -> StdinRecord {
    match kind {
        StdinKind::Terminal => StdinRecord::none(),
        StdinKind::NullDevice => StdinRecord {
            mode: "null",
            ..StdinRecord::none()
        },
        // A relay that never started (the cell failed first) read nothing.
        StdinKind::Stream => relayed.unwrap_or(StdinRecord {
            mode: "relayed",
            eof: false,
            ..StdinRecord::none()
        }),
        StdinKind::IntoTerminal => relayed.unwrap_or(StdinRecord {
            mode: "terminal",
            eof: false,
            ..StdinRecord::none()
        }),
    }
}

// ---- the service's side ----

/// Serves one hand-off connection (its first 8 bytes not read yet): admits the peer,
/// compiles its contract as described above, runs it through [`Engine::run`] (a warm
/// cell when a pool of its shape exists) with the passed descriptors as the payload's
/// stdio, and answers with the result. Errors are the connection's (a broken or
/// malformed client); a run's own failures are its reply.
pub fn serve_connection(
    stream: UnixStream,
    engine: &Engine,
    gate: &dyn HandoffGate,
) -> Result<(), EngineError> {
    let started = Instant::now();
    let identity = peer::peer_identity(stream.as_fd()).map_err(io_error("SO_PEERCRED"))?;
    let mut magic = [0u8; 8];
    (&stream).read_exact(&mut magic).map_err(io_error("read"))?;
    if magic != HANDOFF_MAGIC {
        return Err(protocol("not a hand-off client"));
    }
    let (request, fds): (HandoffRequest, _) = read_frame(&stream, MAX_REQUEST_BYTES, REQUEST_FDS)?
        .ok_or_else(|| protocol("the client closed the connection"))?;
    let Ok([stdin, stdout, stderr]) = <[OwnedFd; 3]>::try_from(fds) else {
        return Err(protocol("a request without its stdin, stdout and stderr"));
    };
    let peer = HandoffPeer {
        uid: identity.uid,
        gid: identity.gid,
        pid: identity.pid,
    };
    let refuse = |class, error: String, plan: Option<&CellPlan>, tenant: Option<&str>| {
        let recorded = engine.refuse(Refusal {
            argv: &request.argv,
            workload_class: &request.workload_class,
            status: class,
            error,
            plan,
            tenant,
        });
        HandoffReply::Refused {
            report: Box::new(redacted_report(&recorded.report, &recorded.secrets)),
            plan: plan.and_then(|p| redacted_plan(p, &recorded.secrets)),
        }
    };
    // Held until this function returns: the run is over by then.
    let admission = match gate.admit(&peer) {
        Ok(admission) => admission,
        Err(refusal) => {
            let reply = refuse(refusal.class, refusal.error, None, None);
            return write_frame(&stream, &reply, &[]);
        }
    };
    let tenant = admission.tenant.as_deref();
    let loaded = match load_as_peer(&request, &identity, gate) {
        Ok(loaded) => loaded,
        Err(Loading::Declined(why)) => {
            return write_frame(&stream, &HandoffReply::Declined { why }, &[])
        }
        Err(Loading::Refused(class, error)) => {
            return write_frame(&stream, &refuse(class, error, None, tenant), &[]);
        }
        Err(Loading::RefusedPlan(class, error, plan)) => {
            return write_frame(&stream, &refuse(class, error, Some(&plan), tenant), &[]);
        }
    };
    // The image's lease lives until this function returns: the run is over by then.
    let PeerPlan {
        plan,
        pins,
        image_lease: _image_lease,
    } = loaded;
    if let Some(error) = unresolvable(engine, &plan) {
        let reply = refuse(ResultClass::SandboxUnavailable, error, Some(&plan), tenant);
        return write_frame(&stream, &reply, &[]);
    }
    // Decided before any value the client sent is looked at.
    if let Err(forbidden) = engine.decide_credentials(&plan, &request.workload_class) {
        let reply = refuse(
            ResultClass::PolicyDenied,
            forbidden.to_string(),
            Some(&plan),
            tenant,
        );
        return write_frame(&stream, &reply, &[]);
    }
    let credentials = airlock_cell::credential_env_from(&plan, |name| {
        (request.credential_values.iter())
            .find(|(from_env, _)| from_env == name)
            .map(|(_, value)| value.clone())
    });
    let credentials = match credentials {
        Ok(credentials) => credentials,
        Err(err) => {
            let reply = refuse(err.class(), err.to_string(), Some(&plan), tenant);
            return write_frame(&stream, &reply, &[]);
        }
    };
    let (stdin, stdin_kind) = match classify_stdin(Some(stdin), plan.terminal) {
        Ok(classified) => classified,
        Err(err) => {
            let error = format!("reading inputs: {err}");
            let reply = refuse(ResultClass::RuntimeFault, error, Some(&plan), tenant);
            return write_frame(&stream, &reply, &[]);
        }
    };
    let run = engine.run(RunRequest {
        plan,
        workload_class: request.workload_class.clone(),
        credentials,
        stdin,
        artifacts: None,
        stdout: Some(stdout),
        stderr: Some(stderr),
        started,
        tenant: admission.tenant.clone(),
        on_recorded: None,
        // The client's death (Ctrl-C at its terminal) ends its run, as it would end a
        // run in its own process; a copy that fails only loses that.
        caller: stream.try_clone().ok().map(OwnedFd::from),
    });
    // The inputs are mounted (or the run is over): their pinned descriptors may go.
    drop(pins);
    let mut finished = match run {
        Ok(finished) => finished,
        Err(refused) => {
            let reply = HandoffReply::Refused {
                report: Box::new(redacted_report(&refused.report, &refused.secrets)),
                plan: refused
                    .plan
                    .as_ref()
                    .and_then(|p| redacted_plan(p, &refused.secrets)),
            };
            return write_frame(&stream, &reply, &[]);
        }
    };
    finished.report.stdin = Some(stdin_record(stdin_kind, finished.report.stdin.take()));
    if finished.audit_error().is_some() {
        // No record, so nothing ran: reported like a refusal.
        let reply = HandoffReply::Refused {
            report: Box::new(redacted_report(&finished.report, &finished.secrets)),
            plan: redacted_plan(&finished.plan, &finished.secrets),
        };
        return write_frame(&stream, &reply, &[]);
    }
    // The next warm cell is built once the client has its answer (PoolRefill).
    let _refill = finished.take_refill();
    let delivery = request.result_file;
    let reply = HandoffReply::Finished {
        report: Box::new(redacted_report(&finished.report, &finished.secrets)),
        plan: delivery
            .then(|| redacted_plan(&finished.plan, &finished.secrets))
            .flatten(),
        inputs: finished.inputs.take(),
        delivery,
    };
    let sent = write_frame(&stream, &reply, &[]);
    if let Some(failure) = delivery_failure(&stream, sent, delivery) {
        finished.report.mark_delivery_failed(failure);
    }
    let completed = match engine.complete(finished) {
        Ok(report) => HandoffReply::Completed {
            exit_code: report.exit_code,
            error: None,
        },
        Err(err) => HandoffReply::Completed {
            exit_code: 125,
            error: Some(format!(
                "audit store: the run finished but its record could not be completed: {err}"
            )),
        },
    };
    // A client gone by now loses nothing: the record is complete.
    let _ = write_frame(&stream, &completed, &[]);
    Ok(())
}

/// Why the client's result was not delivered, once `Finished` was `sent`: the send
/// failed (the client went away), or its [`HandoffDelivery`] says, when it has a result
/// file to deliver. A client without one has nothing more to say.
fn delivery_failure(
    stream: &UnixStream,
    sent: Result<(), EngineError>,
    delivery: bool,
) -> Option<String> {
    let gone = || Some("the client went away before its result was delivered".to_string());
    match (sent, delivery) {
        (Err(_), _) => gone(),
        (Ok(()), false) => None,
        (Ok(()), true) => match read_frame::<HandoffDelivery>(stream, MAX_REQUEST_BYTES, 0) {
            Ok(Some((delivery, _))) => delivery.failure,
            // Its result file is not known to exist.
            Ok(None) | Err(_) => gone(),
        },
    }
}

/// `report` with every secret replaced as the store's records replace it (its output's
/// head and tail included). A report that cannot be redacted is not sent.
fn redacted_report(report: &RunReport, secrets: &[String]) -> RunReport {
    if secrets.is_empty() {
        return report.clone();
    }
    let json = serde_json::to_value(report).unwrap_or_default();
    let json = if report.output.is_some() {
        record::redact_result(json, secrets)
    } else {
        airlock_store::Redactor::new(secrets.to_vec()).value(json)
    };
    serde_json::from_value(json).unwrap_or_else(|_| {
        RunReport::refused(
            &report.run_id,
            ResultClass::RuntimeFault,
            "the result could not be redacted for the client".into(),
        )
    })
}

/// `plan` with every secret value replaced; `None` if that fails (it is not sent then).
fn redacted_plan(plan: &CellPlan, secrets: &[String]) -> Option<Box<CellPlan>> {
    if secrets.is_empty() {
        return Some(Box::new(plan.clone()));
    }
    let json = serde_json::to_value(plan).ok()?;
    let json = airlock_store::Redactor::new(secrets.to_vec()).value(json);
    serde_json::from_value(json).ok().map(Box::new)
}

/// A compiled plan whose host paths were opened as the peer, and those descriptors.
struct PeerPlan {
    plan: CellPlan,
    pins: Vec<OwnedFd>,
    /// The image's lease, held like the pins until the run is over.
    image_lease: Option<ImageLease>,
}

/// Why a request has no plan.
enum Loading {
    /// Not for this service (the client runs it in-process).
    Declined(String),
    Refused(ResultClass, String),
    RefusedPlan(ResultClass, String, Box<CellPlan>),
}

impl From<airlock_contract::ContractError> for Loading {
    fn from(err: airlock_contract::ContractError) -> Loading {
        let class = ResultClass::from_name(err.class()).unwrap_or(ResultClass::RuntimeFault);
        Loading::Refused(class, format!("contract: {err}"))
    }
}

/// Parses, checks and compiles the request's contract on a thread whose file-system
/// identity is the peer's (see the module's description), and pins the host paths of
/// the plan.
fn load_as_peer(
    request: &HandoffRequest,
    peer: &peer::PeerIdentity,
    gate: &dyn HandoffGate,
) -> Result<PeerPlan, Loading> {
    // The peer's own command and additions, as every door checks them (the engine
    // checks the whole plan again before any cell).
    let additions = record::pairs(&request.env);
    airlock_contract::check_command(&airlock_contract::CommandInput {
        argv: &request.argv,
        env: &additions,
        ..airlock_contract::CommandInput::default()
    })
    .map_err(|err| Loading::Refused(ResultClass::PolicyDenied, err.to_string()))?;
    let contract = match &request.contract {
        HandoffContract::Default => default_contract(),
        HandoffContract::Text { text, format } => {
            let format = ContractFormat::from_extension(format).ok_or_else(|| {
                Loading::Refused(
                    ResultClass::PolicyDenied,
                    format!("contract: unknown contract format `{format}`"),
                )
            })?;
            parse_contract(text, format)?
        }
        HandoffContract::Named { name } => gate.named_contract(name).ok_or_else(|| {
            Loading::Refused(
                ResultClass::PolicyDenied,
                format!("the service has no contract named `{name}`"),
            )
        })?,
    };
    if let Some(why) = declined(&request.base_dir) {
        return Err(Loading::Declined(why));
    }
    let image = match contract.image == HOST_IMAGE {
        true => None,
        false => Some(gate.image(&contract.image).ok_or_else(|| {
            Loading::Declined(format!(
                "the service does not have image {} in its store",
                contract.image
            ))
        })?),
    };
    let loaded = std::thread::scope(|scope| {
        scope
            .spawn(|| {
                peer::become_peer_for_files(peer).map_err(|err| {
                    Loading::Refused(
                        ResultClass::RuntimeFault,
                        format!("taking the client's identity for its paths: {err}"),
                    )
                })?;
                compile_as_peer(
                    &contract,
                    request,
                    peer.uid,
                    image.as_ref().map(|i| &i.image),
                )
            })
            .join()
    });
    let PeerPlan { mut plan, pins, .. } = loaded.unwrap_or_else(|_| {
        Err(Loading::Refused(
            ResultClass::RuntimeFault,
            "compiling the contract panicked".into(),
        ))
    })?;
    lower_limits(&mut plan, request)
        .map_err(|(class, error)| Loading::RefusedPlan(class, error, Box::new(plan.clone())))?;
    add_env(&mut plan, &request.env);
    Ok(PeerPlan {
        plan,
        pins,
        image_lease: image.map(|leased| leased.lease),
    })
}

/// What the service does not run for a client, before compiling: relative base
/// directories.
fn declined(base_dir: &Path) -> Option<String> {
    if !base_dir.is_absolute() {
        return Some("the base directory is not absolute".into());
    }
    None
}

/// An allowlist the service's operator configuration cannot resolve: the run would fail
/// every connection while it looked fine, so it is refused as `airlock run` refuses it.
/// The service's configuration is the operator's: it decides how names resolve.
fn unresolvable(engine: &Engine, plan: &CellPlan) -> Option<String> {
    let NetworkPlan::Allowlist { destinations } = &plan.network else {
        return None;
    };
    let patterns = destinations.iter().map(|d| d.host_pattern.as_str());
    let unresolvable = engine.config().egress.unresolvable(patterns);
    (!unresolvable.is_empty()).then(|| {
        format!(
            "egress: the contract allows {}, but the service's operator configuration cannot \
             resolve it: add the name to `[egress] resolve` or set `[egress] \
             upstream_resolvers` (docs/config.md)",
            unresolvable.join(", ")
        )
    })
}

/// On the peer's thread: the seccomp profile read, the plan compiled, and every host
/// path of the plan opened and checked.
fn compile_as_peer(
    contract: &Contract,
    request: &HandoffRequest,
    uid: u32,
    image: Option<&ResolvedImage>,
) -> Result<PeerPlan, Loading> {
    let profile = read_seccomp_profile(contract, &request.base_dir)?;
    let mut plan = compile(
        contract,
        &CompileInput {
            base_dir: &request.base_dir,
            argv: &request.argv,
            seccomp_profile: profile.as_deref(),
            image,
            pod_network: None,
        },
    )?;
    let mut pins = Vec::new();
    let mut denied = None;
    let mut pin = |source: &mut PathBuf, what: &str, target: &Path| {
        if denied.is_some() {
            return;
        }
        match pin_as_peer(source) {
            Ok((fd, pinned)) => {
                *source = pinned;
                pins.push(fd);
            }
            Err(err) => {
                denied = Some(format!(
                    "{what} {} (mounted at {}): the client (uid {uid}) may not read it: {err}",
                    source.display(),
                    target.display()
                ))
            }
        }
    };
    for mount in &mut plan.mounts {
        if let MountPlan::ReadonlyInput { source, target } = mount {
            pin(source, "read-only input", target);
        }
    }
    for entry in &mut plan.etc {
        if let EtcEntry::Contract { source, target } | EtcEntry::Pod { source, target } = entry {
            pin(source, "etc file", target);
        }
    }
    match denied {
        Some(error) => Err(Loading::RefusedPlan(
            ResultClass::PolicyDenied,
            error,
            Box::new(plan),
        )),
        None => Ok(PeerPlan {
            plan,
            pins,
            image_lease: None,
        }),
    }
}

/// Opens `path` (following symlinks, as this thread's identity) and checks that it may
/// be read (a directory: read and searched). The path the runtime mounts then is the
/// descriptor's, in this process: the very file checked.
fn pin_as_peer(path: &Path) -> std::io::Result<(OwnedFd, PathBuf)> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH)
        .open(path)?;
    let is_dir = file.metadata()?.is_dir();
    let mode = if is_dir {
        libc::R_OK | libc::X_OK
    } else {
        libc::R_OK
    };
    peer::may_access(file.as_fd(), mode)?;
    let fd = OwnedFd::from(file);
    let pinned = pinned_path(std::process::id(), fd.as_raw_fd());
    Ok((fd, pinned))
}

/// The path through which another process of the host reaches this process's
/// descriptor `fd` (the cell's supervisor mounts inputs from it).
fn pinned_path(pid: u32, fd: i32) -> PathBuf {
    PathBuf::from(format!("/proc/{pid}/fd/{fd}"))
}

/// The request's deadline, which may only lower the contract's.
fn lower_limits(
    plan: &mut CellPlan,
    request: &HandoffRequest,
) -> Result<(), (ResultClass, String)> {
    match request.wall_time_ms {
        Some(asked) if asked > plan.limits.wall_time_ms => Err((
            ResultClass::PolicyDenied,
            format!(
                "the request asks for wall_time_ms {asked}, above the contract's {}",
                plan.limits.wall_time_ms
            ),
        )),
        Some(asked) => {
            plan.limits.wall_time_ms = asked;
            Ok(())
        }
        None => Ok(()),
    }
}

/// The request's environment additions: a name the plan has gets the new value.
fn add_env(plan: &mut CellPlan, additions: &[(String, String)]) {
    for (name, value) in additions {
        match plan.env.iter_mut().find(|v| v.name == *name) {
            Some(var) => {
                var.value = value.clone();
                var.secret = false;
            }
            None => plan.env.push(EnvVar {
                name: name.clone(),
                value: value.clone(),
                secret: false,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan() -> CellPlan {
        compile(
            &default_contract(),
            &CompileInput::new(Path::new("/"), &["true".to_string()]),
        )
        .unwrap()
    }

    fn request(wall_time_ms: Option<u64>) -> HandoffRequest {
        HandoffRequest {
            contract: HandoffContract::Default,
            base_dir: "/".into(),
            argv: vec!["true".into()],
            env: Vec::new(),
            workload_class: "default".into(),
            wall_time_ms,
            credential_values: vec![("API_TOKEN".into(), "value".into())],
            result_file: false,
        }
    }

    #[test]
    fn an_older_peer_that_does_not_say_delivers_a_result_and_waits_for_it() {
        let mut json = serde_json::to_value(request(None)).unwrap();
        json.as_object_mut().unwrap().remove("result_file");
        let parsed: HandoffRequest = serde_json::from_value(json).unwrap();
        assert!(parsed.result_file);
        let finished = serde_json::json!({"Finished": {
            "report": RunReport::refused("r", ResultClass::Ok, String::new()),
            "plan": null, "inputs": null}});
        let parsed: HandoffReply = serde_json::from_value(finished).unwrap();
        assert!(matches!(
            parsed,
            HandoffReply::Finished { delivery: true, .. }
        ));
    }

    #[test]
    fn a_request_may_lower_the_deadline_but_not_raise_it() {
        let mut plan = plan();
        let allowed = plan.limits.wall_time_ms;
        assert!(lower_limits(&mut plan, &request(Some(allowed + 1))).is_err());
        assert_eq!(plan.limits.wall_time_ms, allowed);
        lower_limits(&mut plan, &request(Some(5))).unwrap();
        assert_eq!(plan.limits.wall_time_ms, 5);
        lower_limits(&mut plan, &request(None)).unwrap();
        assert_eq!(plan.limits.wall_time_ms, 5);
    }

    #[test]
    fn env_additions_replace_a_plan_variable_and_are_not_secret() {
        let mut plan = plan();
        let first = plan.env[0].name.clone();
        add_env(
            &mut plan,
            &[(first.clone(), "x".into()), ("NEW_ONE".into(), "y".into())],
        );
        let find = |n: &str| plan.env.iter().find(|v| v.name == n).unwrap().clone();
        assert_eq!(find(&first).value, "x");
        assert_eq!(find("NEW_ONE").value, "y");
        assert!(!find("NEW_ONE").secret);
    }

    #[test]
    fn relative_base_directories_are_left_to_the_client() {
        assert!(declined(Path::new("relative")).is_some());
        assert!(declined(Path::new("/abs")).is_none());
    }

    #[test]
    fn a_pinned_path_names_the_descriptor_of_this_process() {
        assert_eq!(pinned_path(42, 7), PathBuf::from("/proc/42/fd/7"));
        let file = tempfile::NamedTempFile::new().unwrap();
        let (fd, pinned) = pin_as_peer(file.path()).unwrap();
        assert_eq!(
            std::fs::metadata(&pinned).unwrap().len(),
            std::fs::metadata(file.path()).unwrap().len()
        );
        drop(fd);
        assert!(pin_as_peer(Path::new("/nonexistent/airlock")).is_err());
    }

    #[test]
    fn frames_and_their_descriptors_cross_a_stream_socket() {
        let (client, server) = UnixStream::pair().unwrap();
        let null = std::fs::File::open("/dev/null").unwrap();
        send_request(
            &client,
            &request(Some(3)),
            [null.as_fd(), null.as_fd(), null.as_fd()],
        )
        .unwrap();
        let mut magic = [0u8; 8];
        (&server).read_exact(&mut magic).unwrap();
        assert_eq!(magic, HANDOFF_MAGIC);
        let (got, fds): (HandoffRequest, _) =
            read_frame(&server, MAX_REQUEST_BYTES, 3).unwrap().unwrap();
        assert_eq!(got, request(Some(3)));
        assert_eq!(fds.len(), 3);
        write_frame(&server, &HandoffReply::Declined { why: "w".into() }, &[]).unwrap();
        assert!(matches!(
            recv_reply(&client).unwrap(),
            Some(HandoffReply::Declined { .. })
        ));
        drop(server);
        assert!(recv_reply(&client).unwrap().is_none());
    }

    #[test]
    fn an_oversized_frame_is_refused_before_it_is_read() {
        let (client, server) = UnixStream::pair().unwrap();
        (&client).write_all(&(u32::MAX).to_le_bytes()).unwrap();
        assert!(read_frame::<HandoffDelivery>(&server, 16, 0).is_err());
    }
}
