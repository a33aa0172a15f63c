//! The control protocol of a serving cell ([`crate::serve_cell`]): typed messages on a
//! SOCK_SEQPACKET socket between the engine and the cell's supervisor process, one
//! message per packet, its body JSON, its descriptors SCM_RIGHTS. The engine runs in
//! another process and holds only its end of the socket: [`EngineControl`] is that end,
//! [`SupervisorControl`] the supervisor's.
//!
//! Order: the supervisor sends [`ToEngine::Parked`] once the cell is built and waits
//! (or [`ToEngine::Failed`] if it could not be built); the engine sends
//! [`ToSupervisor::Run`] with the command's stdio; the supervisor answers
//! [`ToEngine::CommandStarted`], then [`ToEngine::CommandEnded`] with the command's
//! report, and [`ToEngine::Closed`] with the final one once the cell is destroyed.
//! [`ToSupervisor::Close`], or EOF on the socket (the engine died), destroys the cell at
//! once.

use crate::error::CellError;
use crate::report::{ExitInfo, RunReport};
use crate::sys;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::path::PathBuf;

/// Most descriptors a control message carries (stdin, stdout sink, stderr sink, the
/// caller's liveness).
pub const MAX_CONTROL_FDS: usize = 4;
/// The supervisor's send buffer: one packet carries a whole report (its output's head
/// and tail, every egress record), and a SOCK_SEQPACKET message must fit the buffer.
const REPORT_SEND_BUFFER: usize = 16 << 20;
/// The send buffer of every socket a command travels on (the engine's end of the
/// factory's and of the control socket, the supervisor's end of pid 1's): a
/// SOCK_SEQPACKET message must fit it, and the system's default (`wmem_default`, often
/// 208 KiB) is smaller than a command the kernel would run. It carries a command of
/// [`airlock_contract::MAX_COMMAND_BYTES`] twice (a one-shot run's plan holds its argv
/// and so does its `Run`), every byte JSON-escaped (`\u0001`: 6 bytes), and the plan.
pub const COMMAND_SEND_BUFFER: usize = 8 << 20;
const _: () =
    assert!(COMMAND_SEND_BUFFER >= 2 * 6 * airlock_contract::MAX_COMMAND_BYTES + (2 << 20));

/// Sizes `sock`'s send buffer for a command (see [`COMMAND_SEND_BUFFER`]). Without the
/// privilege to exceed the system's maximum, the buffer stays at that maximum and a
/// command too large for it fails to send: the run ends `runtime_fault` before its
/// payload starts, never with a different command.
pub fn size_for_commands(sock: BorrowedFd<'_>) {
    let _ = sys::raise_send_buffer(sock, COMMAND_SEND_BUFFER);
}

/// One command for a serving cell.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommandSpec {
    pub argv: Vec<String>,
    /// Added to the plan's environment and the credentials (a name given twice: the
    /// command's value wins).
    pub env: Vec<(String, String)>,
    /// May only lower the plan's `wall_time_ms`; a higher one is refused.
    pub wall_time_ms: Option<u64>,
    /// May only lower the plan's `output_bytes`; a higher one is refused.
    pub output_bytes: Option<u64>,
    /// A stdin descriptor travels with the message (otherwise the command reads the null
    /// device).
    pub stdin: bool,
    /// A descriptor of the caller's travels last: when its far end hangs up (the caller
    /// died or went away), a one-shot cell is destroyed, as a cell dies with a caller in
    /// whose process it runs (a handed-off `airlock run` whose client got Ctrl-C).
    #[serde(default)]
    pub watch_caller: bool,
}

/// The descriptors that travel with a command, in this order: `stdin` (when
/// [`CommandSpec::stdin`]), the output sinks, `caller` (when [`CommandSpec::watch_caller`]).
#[derive(Clone, Copy)]
pub struct CommandFds<'a> {
    pub stdin: Option<BorrowedFd<'a>>,
    pub stdout: BorrowedFd<'a>,
    pub stderr: BorrowedFd<'a>,
    pub caller: Option<BorrowedFd<'a>>,
}

/// Engine -> supervisor.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ToSupervisor {
    /// Run `command`. Descriptors: stdin (if `command.stdin`), then the stdout and stderr
    /// sinks the output is forwarded to. For a one-shot cell the first and only command.
    Run {
        id: u64,
        /// The audit record's id, for the report (empty for a held command: the engine
        /// names the record in the report it keeps).
        run_id: String,
        command: CommandSpec,
        /// Sent before the audit record is committed: pid 1 gets the command at once
        /// but spawns it only when the engine writes the release byte (see
        /// [`EngineControl::release`]). Only for a cell parked with a release pipe.
        #[serde(default)]
        held: bool,
    },
    /// Kill command `id` (of a one-shot cell: the cell).
    Kill { id: u64 },
    /// Send `signal` to session command `id`'s process group (inside the cell).
    Signal { id: u64, signal: CommandSignal },
    /// Replace a session's egress destinations (a decision of the policy layer, within
    /// its class): connections opened from now on are decided against `destinations`.
    /// Answered with [`ToEngine::DestinationsSet`] carrying the same `change`.
    SetDestinations {
        change: u64,
        destinations: Vec<airlock_contract::DestinationRule>,
    },
    /// Destroy the cell.
    Close,
}

/// The signals a session command's process group may be sent: the ones a shell user
/// sends a job. pid 1 sends them inside the cell's pid namespace, so nothing outside the
/// cell can be reached whatever the number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum CommandSignal {
    Hup,
    Int,
    Quit,
    Kill,
    Usr1,
    Usr2,
    Term,
    Cont,
    Stop,
}

impl CommandSignal {
    pub const ALL: [CommandSignal; 9] = [
        CommandSignal::Hup,
        CommandSignal::Int,
        CommandSignal::Quit,
        CommandSignal::Kill,
        CommandSignal::Usr1,
        CommandSignal::Usr2,
        CommandSignal::Term,
        CommandSignal::Cont,
        CommandSignal::Stop,
    ];

    /// The name without `SIG`, as `kill -l` prints it.
    pub fn name(self) -> &'static str {
        match self {
            CommandSignal::Hup => "HUP",
            CommandSignal::Int => "INT",
            CommandSignal::Quit => "QUIT",
            CommandSignal::Kill => "KILL",
            CommandSignal::Usr1 => "USR1",
            CommandSignal::Usr2 => "USR2",
            CommandSignal::Term => "TERM",
            CommandSignal::Cont => "CONT",
            CommandSignal::Stop => "STOP",
        }
    }

    pub fn number(self) -> i32 {
        match self {
            CommandSignal::Hup => libc::SIGHUP,
            CommandSignal::Int => libc::SIGINT,
            CommandSignal::Quit => libc::SIGQUIT,
            CommandSignal::Kill => libc::SIGKILL,
            CommandSignal::Usr1 => libc::SIGUSR1,
            CommandSignal::Usr2 => libc::SIGUSR2,
            CommandSignal::Term => libc::SIGTERM,
            CommandSignal::Cont => libc::SIGCONT,
            CommandSignal::Stop => libc::SIGSTOP,
        }
    }

    /// `TERM`, `SIGTERM` or `sigterm`; anything else is no signal of this set.
    pub fn from_name(name: &str) -> Option<CommandSignal> {
        let upper = name.trim().to_ascii_uppercase();
        let bare = upper.strip_prefix("SIG").unwrap_or(&upper);
        CommandSignal::ALL.into_iter().find(|s| s.name() == bare)
    }
}

/// Supervisor -> engine.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum ToEngine {
    /// The cell is built and parked before its first command.
    Parked {
        /// pid 1 of the cell, in the supervisor's pid namespace.
        pid: i32,
        /// The cell's cgroup directories on the host (one per hierarchy on v1).
        cgroups: Vec<PathBuf>,
        /// The packet carries the write end of the cell's release pipe (a one-shot cell):
        /// a command may be sent held and released once its record is committed.
        #[serde(default)]
        release: bool,
    },
    /// The command's payload was exec'd.
    CommandStarted {
        id: u64,
    },
    /// A one-shot cell's command exited (its report follows once the cell is torn down):
    /// the moment its caller may learn how it ended.
    CommandExited {
        id: u64,
        exit: ExitInfo,
    },
    CommandEnded {
        id: u64,
        report: Box<RunReport>,
    },
    /// The answer to [`ToSupervisor::SetDestinations`]: applied (`error: None`) before
    /// this is sent, or why not (the cell has no egress proxy, it is not a session).
    DestinationsSet {
        change: u64,
        error: Option<String>,
    },
    /// The cell is destroyed: the final report, cleanup included.
    Closed {
        report: Box<RunReport>,
    },
    /// The cell could not be built (or was refused before it parked).
    Failed {
        report: Box<RunReport>,
    },
}

/// How many descriptors travel with a message.
trait Message: Serialize + DeserializeOwned {
    fn descriptors(&self) -> usize;
}

impl Message for ToSupervisor {
    fn descriptors(&self) -> usize {
        match self {
            ToSupervisor::Run { command, .. } => {
                2 + usize::from(command.stdin) + usize::from(command.watch_caller)
            }
            ToSupervisor::Kill { .. }
            | ToSupervisor::Signal { .. }
            | ToSupervisor::SetDestinations { .. }
            | ToSupervisor::Close => 0,
        }
    }
}

impl Message for ToEngine {
    fn descriptors(&self) -> usize {
        match self {
            ToEngine::Parked { release, .. } => usize::from(*release),
            _ => 0,
        }
    }
}

/// The body of one control packet.
pub fn encode<M: Serialize>(message: &M) -> Vec<u8> {
    // These types serialise infallibly (no maps with non-string keys).
    serde_json::to_vec(message).unwrap_or_default()
}

/// The inverse of [`encode`], with the packet's descriptors, checked against what the
/// message says it carries.
fn decode<M: Message>(body: &[u8], fds: Vec<OwnedFd>) -> Result<(M, Vec<OwnedFd>), CellError> {
    let message: M = serde_json::from_slice(body).map_err(|e| CellError::Protocol {
        message: format!("malformed control message: {e}"),
    })?;
    if message.descriptors() != fds.len() {
        return Err(CellError::Protocol {
            message: format!(
                "a control message with {} descriptors, {} expected",
                fds.len(),
                message.descriptors()
            ),
        });
    }
    Ok((message, fds))
}

fn send<M: Message>(sock: BorrowedFd<'_>, message: &M, fds: &[RawFd]) -> Result<(), CellError> {
    sys::send_with_fds(sock, &encode(message), fds).map_err(|e| CellError::io("control socket", e))
}

/// The next message; `Ok(None)` when the peer closed its end.
fn recv<M: Message>(sock: BorrowedFd<'_>) -> Result<Option<(M, Vec<OwnedFd>)>, CellError> {
    match sys::recv_message(sock, MAX_CONTROL_FDS) {
        Ok(Some((body, fds))) => decode(&body, fds).map(Some),
        Ok(None) => Ok(None),
        Err(e) if e.raw_os_error() == Some(libc::ECONNRESET) => Ok(None),
        Err(e) => Err(CellError::io("control socket", e)),
    }
}

/// A control socket pair (SOCK_SEQPACKET, close-on-exec): the engine keeps one end and
/// gives the other to the process that calls [`crate::serve_cell`].
pub fn socket_pair() -> Result<(OwnedFd, OwnedFd), CellError> {
    sys::seqpacket_pair().map_err(|e| CellError::io("control socket pair", e))
}

/// The engine's end of a serving cell's control socket.
pub struct EngineControl {
    sock: OwnedFd,
    /// The write end of the parked cell's release pipe, until the command is released.
    release: std::sync::Mutex<Option<OwnedFd>>,
}

impl EngineControl {
    pub fn new(sock: OwnedFd) -> EngineControl {
        size_for_commands(sock.as_fd());
        EngineControl {
            sock,
            release: std::sync::Mutex::new(None),
        }
    }

    /// Whether a command can be sent held (the cell parked with a release pipe).
    pub fn can_hold(&self) -> bool {
        self.release_slot().is_some()
    }

    fn release_slot(&self) -> std::sync::MutexGuard<'_, Option<OwnedFd>> {
        self.release.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Lets a held command start: its audit record is committed. One byte into the
    /// release pipe, read by the cell's pid 1 directly (no other process on the way).
    pub fn release(&self) -> Result<(), CellError> {
        let release = self
            .release_slot()
            .take()
            .ok_or_else(|| CellError::Protocol {
                message: "no held command to release".into(),
            })?;
        match sys::write(release.as_fd(), &[1]) {
            Ok(1) => Ok(()),
            Ok(_) => Err(CellError::Protocol {
                message: "the release byte was not written".into(),
            }),
            Err(e) => Err(CellError::io("release pipe", e)),
        }
    }

    pub fn as_fd(&self) -> BorrowedFd<'_> {
        self.sock.as_fd()
    }

    /// Runs `command` with its descriptors ([`CommandFds`]).
    pub fn run(
        &self,
        id: u64,
        run_id: &str,
        command: CommandSpec,
        fds: CommandFds<'_>,
    ) -> Result<(), CellError> {
        self.send_run(id, run_id, command, fds, false)
    }

    /// [`EngineControl::run`], held: the command starts at [`EngineControl::release`]
    /// (only when [`EngineControl::can_hold`]).
    pub fn run_held(
        &self,
        id: u64,
        command: CommandSpec,
        fds: CommandFds<'_>,
    ) -> Result<(), CellError> {
        if !self.can_hold() {
            return Err(CellError::Protocol {
                message: "a held command for a cell without a release pipe".into(),
            });
        }
        self.send_run(id, "", command, fds, true)
    }

    fn send_run(
        &self,
        id: u64,
        run_id: &str,
        command: CommandSpec,
        fds: CommandFds<'_>,
        held: bool,
    ) -> Result<(), CellError> {
        if command.stdin != fds.stdin.is_some() || command.watch_caller != fds.caller.is_some() {
            return Err(CellError::Protocol {
                message: "a command's descriptor flags and its descriptors disagree".into(),
            });
        }
        let fds: Vec<RawFd> = [fds.stdin, Some(fds.stdout), Some(fds.stderr), fds.caller]
            .into_iter()
            .flatten()
            .map(|f| f.as_raw_fd())
            .collect();
        let message = ToSupervisor::Run {
            id,
            run_id: run_id.to_string(),
            command,
            held,
        };
        send(self.sock.as_fd(), &message, &fds)?;
        if !held {
            // Nothing will be released: the pipe's end goes now.
            drop(self.release_slot().take());
        }
        Ok(())
    }

    pub fn kill(&self, id: u64) -> Result<(), CellError> {
        send(self.sock.as_fd(), &ToSupervisor::Kill { id }, &[])
    }

    pub fn signal(&self, id: u64, signal: CommandSignal) -> Result<(), CellError> {
        send(self.sock.as_fd(), &ToSupervisor::Signal { id, signal }, &[])
    }

    pub fn close(&self) -> Result<(), CellError> {
        send(self.sock.as_fd(), &ToSupervisor::Close, &[])
    }

    /// Asks a session's supervisor to replace its egress destinations; the answer is a
    /// [`ToEngine::DestinationsSet`] with the same `change`.
    pub fn set_destinations(
        &self,
        change: u64,
        destinations: Vec<airlock_contract::DestinationRule>,
    ) -> Result<(), CellError> {
        let message = ToSupervisor::SetDestinations {
            change,
            destinations,
        };
        send(self.sock.as_fd(), &message, &[])
    }

    /// The supervisor's next message; `None` once its process is gone. The release
    /// pipe that comes with `Parked` is kept here.
    pub fn recv(&self) -> Result<Option<ToEngine>, CellError> {
        let Some((message, mut fds)) = recv::<ToEngine>(self.sock.as_fd())? else {
            return Ok(None);
        };
        if let Some(release) = fds.pop() {
            *self.release_slot() = Some(release);
        }
        Ok(Some(message))
    }
}

/// The supervisor's end of a serving cell's control socket.
pub struct SupervisorControl {
    sock: OwnedFd,
}

impl SupervisorControl {
    pub fn new(sock: OwnedFd) -> SupervisorControl {
        // Without it a report still arrives, without its egress records (see `send`).
        let _ = sys::raise_send_buffer(sock.as_fd(), REPORT_SEND_BUFFER);
        SupervisorControl { sock }
    }

    pub fn as_fd(&self) -> BorrowedFd<'_> {
        self.sock.as_fd()
    }

    /// Send errors mean the engine is gone: the next receive sees EOF and destroys the
    /// cell, so they are not reported twice. A report too large for one packet is sent
    /// without its egress records, and says so.
    pub fn send(&self, message: &ToEngine) {
        match send(self.sock.as_fd(), message, &[]) {
            Err(CellError::Io { source, .. }) if source.raw_os_error() == Some(libc::EMSGSIZE) => {
                if let Some(smaller) = without_egress_records(message) {
                    let _ = send(self.sock.as_fd(), &smaller, &[]);
                }
            }
            _ => {}
        }
    }

    /// `Parked` with the write end of the cell's release pipe (this process keeps no
    /// copy: the engine is then the only holder).
    pub fn send_parked(&self, message: &ToEngine, release: OwnedFd) {
        let _ = send(self.sock.as_fd(), message, &[release.as_raw_fd()]);
    }

    /// The engine's next message with its descriptors; `None` once it closed its end.
    pub fn recv(&self) -> Result<Option<(ToSupervisor, Vec<OwnedFd>)>, CellError> {
        recv(self.sock.as_fd())
    }
}

/// `message` with its report's egress records left out (and a note saying how many),
/// for a report too large for one packet; `None` for a message without a report.
fn without_egress_records(message: &ToEngine) -> Option<ToEngine> {
    let trim = |report: &RunReport| {
        let mut report = report.clone();
        let left_out = report.egress.take().map_or(0, |records| records.len());
        report.notes.push(format!(
            "the report was too large for the control socket: its {left_out} egress \
             record(s) were left out"
        ));
        Box::new(report)
    };
    Some(match message {
        ToEngine::CommandEnded { id, report } => ToEngine::CommandEnded {
            id: *id,
            report: trim(report),
        },
        ToEngine::Closed { report } => ToEngine::Closed {
            report: trim(report),
        },
        ToEngine::Failed { report } => ToEngine::Failed {
            report: trim(report),
        },
        ToEngine::Parked { .. }
        | ToEngine::CommandStarted { .. }
        | ToEngine::CommandExited { .. }
        | ToEngine::DestinationsSet { .. } => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::ResultClass;

    fn spec(stdin: bool) -> CommandSpec {
        CommandSpec {
            argv: vec!["/bin/echo".into(), "hi".into()],
            env: vec![("LANG".into(), "C.UTF-8".into())],
            wall_time_ms: Some(500),
            output_bytes: None,
            stdin,
            watch_caller: false,
        }
    }

    /// `stdin`, the two sinks and `caller`, borrowed from `held` (four descriptors).
    fn fds<'a>(held: &'a [OwnedFd], stdin: bool, caller: bool) -> CommandFds<'a> {
        CommandFds {
            stdin: stdin.then(|| held[0].as_fd()),
            stdout: held[1].as_fd(),
            stderr: held[2].as_fd(),
            caller: caller.then(|| held[3].as_fd()),
        }
    }

    fn null() -> OwnedFd {
        OwnedFd::from(std::fs::File::open("/dev/null").unwrap())
    }

    #[test]
    fn signal_names_are_read_with_or_without_sig_and_nothing_else() {
        assert_eq!(CommandSignal::from_name("TERM"), Some(CommandSignal::Term));
        assert_eq!(CommandSignal::from_name("sigint"), Some(CommandSignal::Int));
        assert_eq!(
            CommandSignal::from_name("SIGKILL").map(CommandSignal::number),
            Some(9)
        );
        assert_eq!(CommandSignal::from_name("9"), None);
        assert_eq!(CommandSignal::from_name("SYS"), None);
        assert_eq!(CommandSignal::from_name(""), None);
    }

    #[test]
    fn every_message_to_the_supervisor_survives_a_round_trip() {
        for (message, n) in [
            (
                ToSupervisor::Run {
                    id: 1,
                    run_id: "r1".into(),
                    command: spec(true),
                    held: false,
                },
                3,
            ),
            (
                ToSupervisor::Run {
                    id: 2,
                    run_id: "r2".into(),
                    command: spec(false),
                    held: true,
                },
                2,
            ),
            (
                ToSupervisor::Run {
                    id: 3,
                    run_id: "r3".into(),
                    command: CommandSpec {
                        watch_caller: true,
                        ..spec(true)
                    },
                    held: false,
                },
                4,
            ),
            (ToSupervisor::Kill { id: 4 }, 0),
            (
                ToSupervisor::Signal {
                    id: 5,
                    signal: CommandSignal::Term,
                },
                0,
            ),
            (ToSupervisor::Close, 0),
        ] {
            let fds = (0..n).map(|_| null()).collect();
            let (decoded, fds) = decode::<ToSupervisor>(&encode(&message), fds).unwrap();
            assert_eq!(decoded, message);
            assert_eq!(fds.len(), n);
        }
    }

    #[test]
    fn every_message_to_the_engine_survives_a_round_trip() {
        let report = || {
            Box::new(RunReport::refused(
                "r",
                ResultClass::RuntimeFault,
                "x".into(),
            ))
        };
        for message in [
            ToEngine::Parked {
                pid: 42,
                cgroups: vec!["/sys/fs/cgroup/pids/airlock/c".into()],
                release: false,
            },
            ToEngine::CommandStarted { id: 1 },
            ToEngine::CommandExited {
                id: 1,
                exit: ExitInfo {
                    code: Some(0),
                    signal: None,
                },
            },
            ToEngine::CommandEnded {
                id: 1,
                report: report(),
            },
            ToEngine::Closed { report: report() },
            ToEngine::Failed { report: report() },
        ] {
            let body = encode(&message);
            let (decoded, _) = decode::<ToEngine>(&body, Vec::new()).unwrap();
            assert_eq!(encode(&decoded), body);
        }
    }

    #[test]
    fn a_report_too_large_for_a_packet_loses_its_egress_records_and_says_so() {
        let mut report = RunReport::refused("r", ResultClass::Ok, String::new());
        report.egress = Some(Vec::new());
        let message = ToEngine::Closed {
            report: Box::new(report),
        };
        let Some(ToEngine::Closed { report }) = without_egress_records(&message) else {
            panic!("a report stays a report");
        };
        assert!(report.egress.is_none());
        assert!(report.notes[0].contains("egress record(s) were left out"));
        assert!(without_egress_records(&ToEngine::CommandStarted { id: 1 }).is_none());
    }

    #[test]
    fn a_run_without_its_sinks_is_refused() {
        let message = ToSupervisor::Run {
            id: 1,
            run_id: String::new(),
            command: spec(true),
            held: false,
        };
        assert!(decode::<ToSupervisor>(&encode(&message), vec![null(), null()]).is_err());
        assert!(decode::<ToSupervisor>(b"{}", Vec::new()).is_err());
    }

    #[test]
    fn the_engine_and_the_supervisor_talk_through_a_socket_pair() {
        let (a, b) = sys::seqpacket_pair().unwrap();
        let (engine, supervisor) = (EngineControl::new(a), SupervisorControl::new(b));
        let held: Vec<OwnedFd> = (0..4).map(|_| null()).collect();
        engine
            .run(7, "run", spec(false), fds(&held, false, false))
            .unwrap();
        let (message, received) = supervisor.recv().unwrap().unwrap();
        assert!(matches!(message, ToSupervisor::Run { id: 7, .. }));
        assert_eq!(received.len(), 2);
        assert!(
            engine
                .run(8, "run", spec(true), fds(&held, false, false))
                .is_err(),
            "a stdin flag without a descriptor is not sent"
        );
        assert!(
            engine
                .run(9, "run", spec(false), fds(&held, false, true))
                .is_err(),
            "a caller's descriptor without its flag is not sent"
        );
        let watched = CommandSpec {
            watch_caller: true,
            ..spec(true)
        };
        engine
            .run(10, "run", watched, fds(&held, true, true))
            .unwrap();
        let (message, received) = supervisor.recv().unwrap().unwrap();
        assert!(matches!(message, ToSupervisor::Run { id: 10, .. }));
        assert_eq!(received.len(), 4);
        supervisor.send(&ToEngine::CommandStarted { id: 7 });
        assert!(matches!(
            engine.recv().unwrap(),
            Some(ToEngine::CommandStarted { id: 7 })
        ));
        drop(supervisor);
        assert!(engine.recv().unwrap().is_none());
    }

    #[test]
    fn a_held_command_is_released_through_the_pipe_that_came_with_parked() {
        let (a, b) = sys::seqpacket_pair().unwrap();
        let (engine, supervisor) = (EngineControl::new(a), SupervisorControl::new(b));
        let held: Vec<OwnedFd> = (0..4).map(|_| null()).collect();
        assert!(
            engine
                .run_held(1, spec(false), fds(&held, false, false))
                .is_err(),
            "no release pipe yet: nothing may be held"
        );
        let (read_end, write_end) = sys::pipe_cloexec().unwrap();
        let parked = ToEngine::Parked {
            pid: 1,
            cgroups: Vec::new(),
            release: true,
        };
        supervisor.send_parked(&parked, write_end);
        assert!(matches!(
            engine.recv().unwrap(),
            Some(ToEngine::Parked { .. })
        ));
        assert!(engine.can_hold());
        engine
            .run_held(1, spec(false), fds(&held, false, false))
            .unwrap();
        let (message, _) = supervisor.recv().unwrap().unwrap();
        assert!(matches!(message, ToSupervisor::Run { held: true, .. }));
        engine.release().unwrap();
        let mut byte = [0u8; 2];
        assert_eq!(sys::read(read_end.as_fd(), &mut byte).unwrap(), 1);
        // The engine held the only write end, and gave it up with the release.
        assert_eq!(sys::read(read_end.as_fd(), &mut byte).unwrap(), 0);
        assert!(engine.release().is_err(), "a command is released once");
    }
}
