//! The cell factory: cells for threaded callers. A cell is cloned, and a supervisor
//! forked, only by a single-threaded process; a server or an engine driven from many
//! threads is not one. So the engine starts one small process of the same binary (this
//! module's [`serve_factory`], entered through [`run_factory_if_requested`] first thing
//! in `main`), and asks it over a SOCK_SEQPACKET pair to fork one supervisor process per
//! cell. The supervisor's end of the cell's control socket travels with the request as
//! SCM_RIGHTS; from then on the engine talks to the supervisor directly
//! (airlock_cell::control), and the factory only reaps.
//!
//! Deaths: the factory holds its socket to the engine; EOF on it (the engine exited or
//! was killed) makes it kill every supervisor it forked and exit. Each supervisor dies
//! with the factory (parent-death signal) and sees EOF on its control socket when the
//! engine dies; each cell dies with its supervisor. Nothing outlives the caller.

use crate::host::{self, HostRequest};
use crate::{EngineConfig, EngineError};
use airlock_cell::control::EngineControl;
use airlock_cell::host_identity::HostIdRange;
use airlock_cell::process::{self, Forked};
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// The argument that makes a binary the factory (see [`run_factory_if_requested`]);
/// `airlock doctor` finds the factory's cells by it.
pub use airlock_cell::census::FACTORY_ARG;

/// Most descriptors one factory request carries: the supervisor's control socket.
const MAX_REQUEST_FDS: usize = 1;

/// Engine -> factory, one per packet. The factory itself reads a `Spawn` as
/// `ToFactory<IgnoredAny>` (checked, not built): the supervisor it forks decodes the
/// request from the same bytes, so the factory, which every cell of the engine waits
/// for, neither builds nor frees a plan per cell.
#[derive(Debug, Serialize, Deserialize)]
enum ToFactory<Request = Box<HostRequest>> {
    /// The first message: what every supervisor needs of the operator's configuration
    /// (boxed: the same JSON, and the factory's `ToFactory<IgnoredAny>` stays small).
    Configure {
        egress: Box<airlock_egress::EgressConfig>,
        host_ids: HostIdRange,
    },
    /// Fork a supervisor for `request`; the packet carries its control socket.
    Spawn { request: Request },
}

/// Factory -> engine, one per request.
#[derive(Debug, Serialize, Deserialize)]
enum FromFactory {
    Spawned { pid: i32 },
    Refused { error: String },
}

/// The engine's handle on its factory process. Requests are serialised: a fork takes a
/// fraction of a millisecond, and the cell is built by the supervisor afterwards.
pub struct CellFactory {
    sock: Mutex<OwnedFd>,
    child: Mutex<Child>,
    /// Supervisor processes alive (their [`CellHost`]s not dropped yet).
    live: Arc<AtomicUsize>,
    max_cells: usize,
}

/// A supervisor process the factory forked, and the engine's end of its control socket.
/// Dropping it closes the socket, which destroys the cell if it still exists.
pub struct CellHost {
    pub pid: i32,
    pub control: EngineControl,
    /// Where its supervisor copies the cell's writable paths if its verdict is a
    /// suspected escape (the request's `on_suspected_escape`).
    pub evidence_dir: Option<std::path::PathBuf>,
    _counted: LiveCell,
}

/// One unit of the engine's capacity, given back when the host (or a gVisor run) is
/// dropped.
pub(crate) struct LiveCell(Arc<AtomicUsize>);

impl LiveCell {
    /// Takes one unit of `live`, or refuses when all `max_cells` are in use.
    pub(crate) fn take(live: &Arc<AtomicUsize>, max_cells: usize) -> Result<LiveCell, EngineError> {
        let taken = live.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
            (n < max_cells).then_some(n + 1)
        });
        match taken {
            Ok(_) => Ok(LiveCell(Arc::clone(live))),
            Err(_) => Err(EngineError::Capacity { max_cells }),
        }
    }
}

impl Drop for LiveCell {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl CellFactory {
    /// Starts `program FACTORY_ARG` (a binary that calls [`run_factory_if_requested`]),
    /// its stdin the factory's end of the socket, and configures it. Safe from any
    /// thread: the standard library spawns with exec.
    /// `live` counts every cell of the engine against `max_cells`, the gVisor tier's too.
    pub fn start(
        program: &Path,
        config: &EngineConfig,
        live: Arc<AtomicUsize>,
    ) -> Result<CellFactory, EngineError> {
        let io = |context: &str| {
            let context = context.to_string();
            move |source| EngineError::Factory { context, source }
        };
        let (ours, theirs) = process::seqpacket_pair().map_err(io("socketpair"))?;
        // A Spawn carries the plan and its argv.
        airlock_cell::control::size_for_commands(ours.as_fd());
        let child = Command::new(program)
            .arg(FACTORY_ARG)
            .stdin(Stdio::from(theirs))
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(io(&format!("starting {}", program.display())))?;
        let factory = CellFactory {
            sock: Mutex::new(ours),
            child: Mutex::new(child),
            live,
            max_cells: config.max_cells,
        };
        let configure = ToFactory::Configure {
            egress: Box::new(config.egress.clone()),
            host_ids: config.host_ids,
        };
        factory.send(&configure, &[])?;
        Ok(factory)
    }

    /// Asks for a supervisor process serving `request`; returns once it is forked (the
    /// cell is then being built: [`EngineControl::recv`] gives `Parked` or `Failed`).
    pub fn spawn(&self, request: HostRequest) -> Result<CellHost, EngineError> {
        let counted = self.count_one()?;
        let evidence_dir = request.on_suspected_escape.as_ref().map(|e| e.dir.clone());
        let (engine_end, supervisor_end) =
            process::seqpacket_pair().map_err(|source| EngineError::Factory {
                context: "socketpair".into(),
                source,
            })?;
        let message = ToFactory::Spawn {
            request: Box::new(request),
        };
        let sock = self.sock.lock().unwrap_or_else(|p| p.into_inner());
        send(&sock, &message, &[supervisor_end.as_raw_fd()])?;
        drop(supervisor_end);
        let reply = process::recv_message(sock.as_fd(), 0)
            .map_err(|source| EngineError::Factory {
                context: "reading the factory's reply".into(),
                source,
            })?
            .ok_or_else(|| EngineError::FactoryProtocol("the factory process is gone".into()))?;
        match serde_json::from_slice(&reply.0) {
            Ok(FromFactory::Spawned { pid }) => Ok(CellHost {
                pid,
                control: EngineControl::new(engine_end),
                evidence_dir,
                _counted: counted,
            }),
            Ok(FromFactory::Refused { error }) => Err(EngineError::FactoryProtocol(error)),
            Err(err) => Err(EngineError::FactoryProtocol(format!(
                "malformed reply from the factory: {err}"
            ))),
        }
    }

    /// Takes one unit of capacity, or refuses when every one is in use.
    fn count_one(&self) -> Result<LiveCell, EngineError> {
        LiveCell::take(&self.live, self.max_cells)
    }

    /// The factory's pid (for tests and `doctor`).
    pub fn pid(&self) -> u32 {
        self.child.lock().unwrap_or_else(|p| p.into_inner()).id()
    }

    fn send(&self, message: &ToFactory, fds: &[i32]) -> Result<(), EngineError> {
        let sock = self.sock.lock().unwrap_or_else(|p| p.into_inner());
        send(&sock, message, fds)
    }
}

impl Drop for CellFactory {
    /// Closing the socket is the factory's signal to kill what it forked and exit.
    fn drop(&mut self) {
        let sock = self.sock.get_mut().unwrap_or_else(|p| p.into_inner());
        // The descriptor is replaced by a fresh null one so that the real one closes now.
        if let Ok(null) = std::fs::File::open("/dev/null") {
            drop(std::mem::replace(sock, OwnedFd::from(null)));
        }
        let child = self.child.get_mut().unwrap_or_else(|p| p.into_inner());
        let _ = child.wait();
    }
}

fn send(sock: &OwnedFd, message: &ToFactory, fds: &[i32]) -> Result<(), EngineError> {
    let body =
        serde_json::to_vec(message).map_err(|e| EngineError::FactoryProtocol(e.to_string()))?;
    process::send_with_fds(sock.as_fd(), &body, fds).map_err(|source| EngineError::Factory {
        context: "writing to the factory".into(),
        source,
    })
}

/// Becomes the factory if this process was started as one (`argv[1] == FACTORY_ARG`);
/// returns otherwise. Call it first thing in `main`, before any thread exists.
pub fn run_factory_if_requested() {
    if std::env::args_os().nth(1).is_some_and(|a| a == FACTORY_ARG) {
        // fd 0 was set up by CellFactory::start as the factory's socket.
        serve_factory(take_stdin_socket())
    }
}

/// Fd 0 as an owned socket, and the null device in its place.
fn take_stdin_socket() -> OwnedFd {
    let duplicate = std::io::stdin()
        .as_fd()
        .try_clone_to_owned()
        .unwrap_or_else(|_| process::exit_now(125));
    if process::null_stdin().is_err() {
        process::exit_now(125);
    }
    duplicate
}

/// The factory's loop: one fork per request, reaping exited supervisors as it goes.
fn serve_factory(sock: OwnedFd) -> ! {
    let me = std::process::id() as i32;
    let mut children = BTreeSet::new();
    let mut configured = None;
    loop {
        reap(&mut children);
        let (body, mut fds) = match recv_polled(&sock, &mut children) {
            Ok(Some(message)) => message,
            Ok(None) => {
                // The engine is gone: so is everything it asked for.
                end_supervisors(&mut children);
                process::exit_now(0)
            }
            Err(err) => {
                // Not started by an engine (fd 0 is no SEQPACKET socket), or a broken one:
                // nothing is forked for whoever wrote to it.
                end_supervisors(&mut children);
                eprintln!(
                    "airlock: {FACTORY_ARG} is the engine's cell factory; its stdin must be \
                     the engine's socket: {err}"
                );
                process::exit_now(2)
            }
        };
        match serde_json::from_slice::<ToFactory<serde::de::IgnoredAny>>(&body) {
            Ok(ToFactory::Configure { egress, host_ids }) => configured = Some((*egress, host_ids)),
            Ok(ToFactory::Spawn { .. }) if fds.len() == 1 => {
                let control = fds.pop().expect("one descriptor");
                let reply = match &configured {
                    None => FromFactory::Refused {
                        error: "the factory was not configured".into(),
                    },
                    Some(config) => fork_supervisor(me, &sock, &body, control, config),
                };
                if let FromFactory::Spawned { pid } = reply {
                    children.insert(pid);
                }
                let body = serde_json::to_vec(&reply).unwrap_or_default();
                let _ = process::send_with_fds(sock.as_fd(), &body, &[]);
            }
            _ => {
                let reply = FromFactory::Refused {
                    error: "malformed factory request".into(),
                };
                let body = serde_json::to_vec(&reply).unwrap_or_default();
                let _ = process::send_with_fds(sock.as_fd(), &body, &[]);
            }
        }
    }
}

/// Waits for the next request, reaping exited supervisors once a second meanwhile.
fn recv_polled(
    sock: &OwnedFd,
    children: &mut BTreeSet<i32>,
) -> std::io::Result<Option<(Vec<u8>, Vec<OwnedFd>)>> {
    while !process::readable_within(sock.as_fd(), 1000)? {
        reap(children);
    }
    process::recv_message(sock.as_fd(), MAX_REQUEST_FDS)
}

/// Once the engine is gone: each supervisor sees EOF on its own control socket and
/// destroys its cell; they get a moment to finish that (a supervisor killed in the middle
/// of a teardown could leave a v1 cgroup frozen), then whatever is left is killed.
fn end_supervisors(children: &mut BTreeSet<i32>) {
    let until = std::time::Instant::now() + SUPERVISOR_GRACE;
    while !children.is_empty() && std::time::Instant::now() < until {
        reap(children);
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    for pid in children.iter() {
        let _ = process::kill(*pid, libc::SIGKILL);
    }
}

/// How long supervisors get to destroy their cells once the engine is gone.
const SUPERVISOR_GRACE: std::time::Duration = std::time::Duration::from_secs(3);

fn reap(children: &mut BTreeSet<i32>) {
    while let Some((pid, _)) = process::reap_exited() {
        children.remove(&pid);
    }
}

/// Forks the supervisor of one cell. The child closes the factory's socket, dies with
/// the factory, decodes its request from `spawn` (the `ToFactory::Spawn` packet), serves
/// the cell and exits; the parent keeps nothing of the cell.
fn fork_supervisor(
    factory: i32,
    sock: &OwnedFd,
    spawn: &[u8],
    control: OwnedFd,
    (egress, host_ids): &(airlock_egress::EgressConfig, HostIdRange),
) -> FromFactory {
    match process::fork() {
        Ok(Forked::Child) => {
            // The factory's socket is the parent's; this child never returns to the loop
            // that owns it, so it closes the descriptor itself.
            process::close_inherited(sock.as_raw_fd());
            process::die_with_parent(factory);
            match serde_json::from_slice::<ToFactory>(spawn) {
                Ok(ToFactory::Spawn { request }) => {
                    host::serve(*request, control, egress.clone(), *host_ids)
                }
                // The factory checked the packet's JSON, not its types: a request this
                // binary cannot decode builds no cell, and the engine is told why.
                Ok(ToFactory::Configure { .. }) | Err(_) => {
                    host::refuse(control, "malformed factory request")
                }
            }
            process::exit_now(0)
        }
        Ok(Forked::Parent(pid)) => {
            drop(control);
            FromFactory::Spawned { pid }
        }
        Err(err) => FromFactory::Refused {
            error: format!("fork: {err}"),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::de::IgnoredAny;

    fn spawn_packet() -> Vec<u8> {
        let plan = airlock_contract::compile(
            &airlock_contract::default_contract(),
            &airlock_contract::CompileInput::new(Path::new("/"), &["true".to_string()]),
        )
        .expect("the default contract compiles");
        let message = ToFactory::Spawn {
            request: Box::new(HostRequest {
                plan: airlock_contract::PlanTransfer::of(&plan),
                credentials: Vec::new(),
                secrets: Vec::new(),
                artifacts: None,
                mode: host::HostMode::OneShot,
                on_suspected_escape: None,
            }),
        };
        serde_json::to_vec(&message).expect("encodes")
    }

    #[test]
    fn the_supervisor_decodes_the_request_the_factory_only_checked() {
        let packet = spawn_packet();
        let checked = serde_json::from_slice::<ToFactory<IgnoredAny>>(&packet);
        assert!(matches!(checked, Ok(ToFactory::Spawn { .. })));
        let decoded = serde_json::from_slice::<ToFactory>(&packet);
        let Ok(ToFactory::Spawn { request }) = decoded else {
            panic!("the supervisor could not decode the factory's packet: {decoded:?}");
        };
        assert_eq!(request.plan.into_plan().argv, ["true"]);
    }

    #[test]
    fn a_spawn_that_is_json_but_no_request_passes_the_factory_and_is_refused_by_the_supervisor() {
        // The factory forks for it (it checks the JSON only); the supervisor's decode
        // fails and it answers Failed instead of building a cell (fork_supervisor).
        let wrong = br#"{"Spawn":{"request":{"plan":7}}}"#;
        assert!(matches!(
            serde_json::from_slice::<ToFactory<IgnoredAny>>(wrong),
            Ok(ToFactory::Spawn { .. })
        ));
        assert!(serde_json::from_slice::<ToFactory>(wrong).is_err());
        // Not JSON at all: the factory itself refuses it, as before.
        assert!(serde_json::from_slice::<ToFactory<IgnoredAny>>(b"{\"Spawn\":").is_err());
    }
}
