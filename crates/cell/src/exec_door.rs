//! A container's doors, for an OCI runtime's cell (crates/airlock/src/oci/): further
//! commands asked for while the container's payload (its init) runs (`airlock oci exec`),
//! and the console socket the payload's terminal master is handed to (runc's
//! `--console-socket`).
//!
//! Exec: the supervisor listens on a unix socket in the container's state directory
//! (root's, 0700; the peer must be root or this process's own user as well). A client
//! connects and hands over one end of a SOCK_SEQPACKET pair, so that every later message
//! is one packet with its descriptors; it sends one [`ToDoor::Run`] with the command's
//! stdio. The supervisor sends the command to the cell's pid 1, which spawns it as a
//! session spawns a further command: a child of pid 1, so with exactly what pid 1 holds
//! (the cell's identity, no capabilities, Landlock, seccomp, its namespaces and cgroup,
//! its rlimits), never a process entering the cell from outside with a confinement of
//! its own to get right. Events come back on the client's socket: the command's terminal,
//! its start (or exec failure), its end. The client may send signals; its hang-up kills
//! the command. When the payload ends, pid 1 kills every process of the cell, further
//! commands included, and the doors close with the supervision.

use crate::error::CellError;
use crate::protocol::{CellChannel, CellCommand, CommandStdio, FromCell};
use crate::sys;
use airlock_contract::CellPlan;
use serde::{Deserialize, Serialize};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::time::Duration;

/// Most descriptors one door message carries: a command's stdin, stdout and stderr.
const MAX_FDS: usize = 3;
/// How long an accepted connection may take to hand over its socket.
const HANDOVER_TIMEOUT: Duration = Duration::from_secs(2);

/// What a container's cell offers beyond its payload (see the module's documentation).
#[derive(Default)]
pub struct ContainerDoors {
    /// Where further commands are asked for; `None`: none are run.
    pub exec: Option<UnixListener>,
    /// Where the master of the payload's terminal (a plan with `terminal`) is sent, one
    /// descriptor with its name (`/dev/pts/N`) as the message, as runc does; the
    /// supervisor keeps no copy (the payload's terminal output is then not captured).
    pub console: Option<UnixStream>,
    /// The container's own cgroup (an OCI spec's `linux.cgroupsPath`); `None`: the
    /// cell's cgroup is airlock's own (crates/cell/src/cgroup/container.rs).
    pub cgroup: Option<crate::cgroup::ContainerCgroupPath>,
    /// Called once the payload has started (or failed to, or ended): an OCI runtime's
    /// `start` answers then, as runc's does, so a `kill` right after it finds the
    /// payload. `None`: nobody waits for it.
    pub on_payload_started: Option<PayloadStarted>,
}

/// See [`ContainerDoors::on_payload_started`].
pub type PayloadStarted = Box<dyn FnOnce() + Send>;

/// One further command.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecRequest {
    pub argv: Vec<String>,
    /// Added to the plan's environment; a name the plan (or a credential) sets keeps the
    /// plan's value, as a container's image environment does.
    pub env: Vec<(String, String)>,
    /// A terminal of its own in the cell's devpts (its master comes back with
    /// [`ExecEvent::Terminal`]); otherwise stdin, stdout and stderr travel with the
    /// request.
    pub terminal: bool,
}

/// Client -> supervisor.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ToDoor {
    /// The command (its stdio descriptors with it unless it asks for a terminal).
    Run(ExecRequest),
    /// Send `signal` to the command's process group.
    Signal { signal: i32 },
}

/// Supervisor -> client.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ExecEvent {
    /// The master of the command's terminal (one descriptor).
    Terminal,
    /// The command was exec'd.
    Started,
    /// It could not be exec'd (`status` 127: not found, 126: not executable); its end
    /// follows.
    Failed { status: i32, reason: String },
    /// Refused before it reached the cell.
    Refused { error: String },
    /// It ended (raw wait status).
    Ended { wait_status: i32 },
}

impl ExecEvent {
    fn descriptors(&self) -> usize {
        match self {
            ExecEvent::Terminal => 1,
            ExecEvent::Started
            | ExecEvent::Failed { .. }
            | ExecEvent::Refused { .. }
            | ExecEvent::Ended { .. } => 0,
        }
    }
}

fn send<M: Serialize>(sock: BorrowedFd<'_>, message: &M, fds: &[RawFd]) -> std::io::Result<()> {
    let body = serde_json::to_vec(message).map_err(std::io::Error::other)?;
    sys::send_with_fds(sock, &body, fds)
}

/// The next message; `None` at the peer's hang-up.
fn recv<M: for<'de> Deserialize<'de>>(
    sock: BorrowedFd<'_>,
) -> std::io::Result<Option<(M, Vec<OwnedFd>)>> {
    match sys::recv_message(sock, MAX_FDS)? {
        None => Ok(None),
        Some((body, fds)) => serde_json::from_slice(&body)
            .map(|message| Some((message, fds)))
            .map_err(std::io::Error::other),
    }
}

/// Sends a terminal's master to a console socket as runc does: one descriptor, the
/// message its slave's name.
pub fn send_console(console: &UnixStream, master: BorrowedFd<'_>) -> std::io::Result<()> {
    let name = format!("/dev/pts/{}", sys::pty_number(master)?);
    sys::send_with_fds(console.as_fd(), name.as_bytes(), &[master.as_raw_fd()])
}

/// The client's end of one further command (`airlock oci exec`).
pub struct ExecClient {
    sock: OwnedFd,
}

impl ExecClient {
    /// Connects to the door at `path` and hands over the client's socket.
    pub fn connect(path: &Path) -> std::io::Result<ExecClient> {
        let (ours, theirs) = sys::seqpacket_pair()?;
        let stream = UnixStream::connect(path)?;
        sys::send_with_fds(stream.as_fd(), b"x", &[theirs.as_raw_fd()])?;
        Ok(ExecClient { sock: ours })
    }

    /// Asks for the command; `stdio` (stdin, stdout, stderr) unless it has a terminal.
    pub fn run(&self, request: &ExecRequest, stdio: &[BorrowedFd<'_>]) -> std::io::Result<()> {
        let fds: Vec<RawFd> = stdio.iter().map(|f| f.as_raw_fd()).collect();
        send(self.sock.as_fd(), &ToDoor::Run(request.clone()), &fds)
    }

    pub fn signal(&self, signal: i32) -> std::io::Result<()> {
        send(self.sock.as_fd(), &ToDoor::Signal { signal }, &[])
    }

    /// The next event; `None` once the door closed (the container ended, and with it
    /// the command).
    pub fn next_event(&self) -> std::io::Result<Option<(ExecEvent, Vec<OwnedFd>)>> {
        match recv::<ExecEvent>(self.sock.as_fd())? {
            Some((event, fds)) if fds.len() != event.descriptors() => Err(std::io::Error::other(
                format!("{event:?} with {} descriptors", fds.len()),
            )),
            other => Ok(other),
        }
    }

    pub fn as_fd(&self) -> BorrowedFd<'_> {
        self.sock.as_fd()
    }
}

/// The signals a waiting client forwards to its command (the shim signals the pid it
/// was given, the client's). Blocked and read from a signalfd: the process must be
/// single-threaded.
pub const FORWARDED_SIGNALS: &[libc::c_int] = &[
    libc::SIGHUP,
    libc::SIGINT,
    libc::SIGQUIT,
    libc::SIGTERM,
    libc::SIGUSR1,
    libc::SIGUSR2,
    libc::SIGWINCH,
];

/// Blocks [`FORWARDED_SIGNALS`] into a signalfd to poll (see [`next_forwarded`]).
pub fn forward_signals() -> std::io::Result<OwnedFd> {
    sys::block_into_signalfd(FORWARDED_SIGNALS).map(|(fd, _)| fd)
}

/// The next signal read from [`forward_signals`]' descriptor.
pub fn next_forwarded(signals: BorrowedFd<'_>) -> Option<libc::c_int> {
    sys::read_signal(signals)
}

/// Waits for `fds` to be readable (`poll`, no timeout); their `revents`.
pub fn wait_readable(fds: &[BorrowedFd<'_>]) -> std::io::Result<Vec<i16>> {
    let mut entries: Vec<libc::pollfd> = fds
        .iter()
        .map(|fd| libc::pollfd {
            fd: fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    loop {
        match sys::poll(&mut entries, -1) {
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
            Ok(_) => return Ok(entries.iter().map(|e| e.revents).collect()),
        }
    }
}

/// One client of the door: `id` once its command went to the cell.
struct Asked {
    id: Option<u64>,
    sock: OwnedFd,
}

/// The supervisor's side of [`ContainerDoors`].
pub(crate) struct Door {
    exec: Option<UnixListener>,
    /// `None` once the payload's terminal went there.
    console: Option<UnixStream>,
    console_sent: bool,
    credentials: Vec<(String, String)>,
    asked: Vec<Asked>,
    /// The payload is command 0; further commands count from 1.
    next_id: u64,
    on_payload_started: Option<PayloadStarted>,
}

/// What the door needs of the supervision to start a command.
pub(crate) struct CellSide<'a> {
    pub plan: &'a CellPlan,
    pub host: crate::host_identity::HostIdentity,
    pub sync: Option<&'a CellChannel>,
}

impl Door {
    pub(crate) fn new(doors: ContainerDoors, credentials: &[(String, String)]) -> Door {
        if let Some(listener) = &doors.exec {
            // Accepted from the poll loop: never blocks it.
            let _ = listener.set_nonblocking(true);
        }
        Door {
            exec: doors.exec,
            console: doors.console,
            console_sent: false,
            credentials: credentials.to_vec(),
            asked: Vec::new(),
            next_id: 1,
            on_payload_started: doors.on_payload_started,
        }
    }

    /// The payload started, failed to start or ended: whoever waits for it is told, once.
    pub(crate) fn payload_started(&mut self) {
        if let Some(tell) = self.on_payload_started.take() {
            tell();
        }
    }

    /// The payload's terminal master: sent to the console socket if there is one (then
    /// `Ok(None)`: the supervisor keeps no copy), else given back.
    pub(crate) fn payload_terminal(&mut self, master: OwnedFd) -> Result<Option<OwnedFd>, String> {
        let Some(console) = self.console.take() else {
            return Ok(Some(master));
        };
        send_console(&console, master.as_fd()).map_err(|e| format!("the console socket: {e}"))?;
        self.console_sent = true;
        Ok(None)
    }

    pub(crate) fn has_console(&self) -> bool {
        self.console.is_some() || self.console_sent
    }

    pub(crate) fn console_sent(&self) -> bool {
        self.console_sent
    }

    /// The poll entries: the listener, then each client.
    pub(crate) fn poll_entries(&self) -> Vec<libc::pollfd> {
        let listener = self.exec.as_ref().map_or(-1, |l| l.as_raw_fd());
        std::iter::once(listener)
            .chain(self.asked.iter().map(|a| a.sock.as_raw_fd()))
            .map(|fd| libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            })
            .collect()
    }

    /// Acts on the entries [`Door::poll_entries`] gave, after a poll.
    pub(crate) fn on_ready(&mut self, entries: &[libc::pollfd], cell: &CellSide<'_>) {
        let ready =
            |e: &libc::pollfd| e.revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0;
        // From the last: a client that goes is removed without moving the others.
        for at in (0..self.asked.len()).rev() {
            if entries.get(at + 1).is_some_and(ready) {
                self.on_client(at, cell);
            }
        }
        if entries.first().is_some_and(ready) {
            self.accept();
        }
    }

    /// Whether command `id` is one of the door's (the payload's messages are not).
    pub(crate) fn owns(&self, id: u64) -> bool {
        self.asked.iter().any(|a| a.id == Some(id))
    }

    /// A message of the cell about one of the door's commands, passed on to its client.
    pub(crate) fn on_cell(&mut self, message: FromCell, fds: Vec<OwnedFd>) {
        let (id, event) = match message {
            FromCell::CommandTerminal { id } => (id, ExecEvent::Terminal),
            FromCell::CommandStarted { id } => (id, ExecEvent::Started),
            FromCell::ExecFailed { id, failure } => (
                id,
                ExecEvent::Failed {
                    status: failure.status,
                    reason: failure.describe(),
                },
            ),
            FromCell::CommandEnded { id, wait_status } => (id, ExecEvent::Ended { wait_status }),
            FromCell::Failed(_)
            | FromCell::Listeners(_)
            | FromCell::Terminal
            | FromCell::Parked
            | FromCell::Ended(_) => return,
        };
        let Some(at) = self.asked.iter().position(|a| a.id == Some(id)) else {
            return;
        };
        // Ours close only once sent (a terminal's master closed here would hang up the
        // command's terminal).
        let passed: Vec<RawFd> = fds.iter().map(|f| f.as_raw_fd()).collect();
        let ended = matches!(event, ExecEvent::Ended { .. });
        let _ = send(self.asked[at].sock.as_fd(), &event, &passed);
        drop(fds);
        if ended {
            self.asked.remove(at);
        }
    }

    fn accept(&mut self) {
        let Some(listener) = &self.exec else { return };
        while let Ok((stream, _)) = listener.accept() {
            if let Some(sock) = handed_over(&stream) {
                self.asked.push(Asked { id: None, sock });
            }
        }
    }

    fn on_client(&mut self, at: usize, cell: &CellSide<'_>) {
        let received = recv::<ToDoor>(self.asked[at].sock.as_fd());
        let id = self.asked[at].id;
        match (received, id) {
            (Ok(Some((ToDoor::Run(request), fds))), None) => match self.start(request, fds, cell) {
                Ok(id) => self.asked[at].id = Some(id),
                Err(error) => {
                    let refused = ExecEvent::Refused { error };
                    let _ = send(self.asked[at].sock.as_fd(), &refused, &[]);
                    self.asked.remove(at);
                }
            },
            (Ok(Some((ToDoor::Signal { signal }, _))), Some(id)) => {
                if let Some(sync) = cell.sync {
                    let _ = sync.kill_command(id, signal);
                }
            }
            // The client went away (or broke the protocol): nobody waits for the
            // command, which goes too.
            (_, id) => {
                if let (Some(id), Some(sync)) = (id, cell.sync) {
                    let _ = sync.kill_command(id, libc::SIGKILL);
                }
                self.asked.remove(at);
            }
        }
    }

    /// Sends the command to pid 1; its id.
    fn start(
        &mut self,
        request: ExecRequest,
        fds: Vec<OwnedFd>,
        cell: &CellSide<'_>,
    ) -> Result<u64, String> {
        if request.argv.is_empty() {
            return Err("an exec without a command".into());
        }
        let stdio = match (request.terminal, fds.len()) {
            (true, 0) => CommandStdio::NewTerminal,
            (false, 3) => CommandStdio::Passed,
            (_, n) => return Err(format!("an exec with {n} stdio descriptors")),
        };
        give_anonymous_pipes_to_cell(cell.host, &fds).map_err(|e| e.to_string())?;
        let env = exec_environment(cell.plan, &self.credentials, &request.env)
            .map_err(|e| e.to_string())?;
        let sync = cell.sync.ok_or("the container's cell is gone")?;
        let id = self.next_id;
        self.next_id += 1;
        let command = CellCommand {
            id,
            argv: request.argv,
            env,
            stdio,
        };
        let ends: Vec<BorrowedFd<'_>> = fds.iter().map(|f| f.as_fd()).collect();
        sync.exec(command, &ends)
            .map_err(|e| format!("the container's cell: {e}"))?;
        Ok(id)
    }
}

/// The client's socket, handed over on `stream`, if its peer is root or this process's
/// user (the state directory the listener is in is root's too).
fn handed_over(stream: &UnixStream) -> Option<OwnedFd> {
    let peer = sys::peer_identity(stream.as_fd()).ok()?;
    if peer.uid != 0 && peer.uid != sys::geteuid() {
        return None;
    }
    stream.set_nonblocking(false).ok()?;
    stream.set_read_timeout(Some(HANDOVER_TIMEOUT)).ok()?;
    let mut byte = [0u8; 1];
    let (n, mut fds) = sys::recv_stream_with_fds(stream.as_fd(), &mut byte, 1).ok()?;
    if n != 1 || fds.len() != 1 {
        return None;
    }
    fds.pop()
}

/// An exec's environment: its own variables under the plan's and the credentials' (a
/// name those set keeps their value), as a container's image environment is under its
/// contract's.
fn exec_environment(
    plan: &CellPlan,
    credentials: &[(String, String)],
    asked: &[(String, String)],
) -> Result<Vec<String>, CellError> {
    let planned = |name: &str| {
        plan.env.iter().any(|v| v.name == name) || credentials.iter().any(|(n, _)| n == name)
    };
    let own: Vec<(String, String)> = asked
        .iter()
        .filter(|(name, _)| !planned(name))
        .cloned()
        .collect();
    crate::supervisor::command_environment(plan, credentials, &own)
}

/// The command's stdio are the client's descriptors (the shim's pipes), passed as they
/// are. An anonymous pipe among them is given to the cell identity, as the pipes of a
/// payload are (build.rs, `give_pipes_to_cell`): re-opening it as `/dev/stdout` checks its
/// owner. Nothing else is chowned: a file or a device the client passed stays its own.
fn give_anonymous_pipes_to_cell(
    host: crate::host_identity::HostIdentity,
    fds: &[OwnedFd],
) -> Result<(), CellError> {
    let pipes: Vec<&OwnedFd> = fds
        .iter()
        .filter(|fd| {
            std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))
                .is_ok_and(|target| target.to_string_lossy().starts_with("pipe:"))
        })
        .collect();
    crate::supervisor::give_pipes_to_cell(host, &pipes)
}

/// The exit code of a raw wait status, as a shell gives it (128 + n for signal n).
pub fn exit_code(wait_status: i32) -> i32 {
    if libc::WIFEXITED(wait_status) {
        libc::WEXITSTATUS(wait_status)
    } else if libc::WIFSIGNALED(wait_status) {
        128 + libc::WTERMSIG(wait_status)
    } else {
        128
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan() -> CellPlan {
        let mut contract = airlock_contract::default_contract();
        contract.env.insert(
            "FROM_CONTRACT".into(),
            airlock_contract::EnvValue::Plain("kept".into()),
        );
        airlock_contract::compile(
            &contract,
            &airlock_contract::CompileInput::new(Path::new("/"), &["true".to_string()]),
        )
        .unwrap()
    }

    #[test]
    fn an_execs_environment_cannot_replace_the_contracts_or_a_credentials() {
        let plan = plan();
        let credentials = vec![("TOKEN".to_string(), "placeholder".to_string())];
        let asked = vec![
            ("FROM_CONTRACT".to_string(), "replaced".to_string()),
            ("TOKEN".to_string(), "stolen".to_string()),
            ("OWN".to_string(), "mine".to_string()),
        ];
        let env = exec_environment(&plan, &credentials, &asked).unwrap();
        assert!(env.contains(&"FROM_CONTRACT=kept".to_string()), "{env:?}");
        assert!(env.contains(&"TOKEN=placeholder".to_string()), "{env:?}");
        assert!(env.contains(&"OWN=mine".to_string()), "{env:?}");
        assert!(!env
            .iter()
            .any(|v| v.ends_with("replaced") || v.ends_with("stolen")));
    }

    #[test]
    fn exit_codes_are_a_shells() {
        assert_eq!(exit_code(3 << 8), 3);
        assert_eq!(exit_code(libc::SIGKILL), 137);
    }

    #[test]
    fn a_terminal_event_carries_one_descriptor_and_the_others_none() {
        assert_eq!(ExecEvent::Terminal.descriptors(), 1);
        assert_eq!(ExecEvent::Started.descriptors(), 0);
        assert_eq!(ExecEvent::Ended { wait_status: 0 }.descriptors(), 0);
    }
}
