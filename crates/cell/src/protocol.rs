//! Messages on the SOCK_SEQPACKET pair between the supervisor and the cell's pid 1: one
//! typed enum per direction ([`ToCell`], [`FromCell`]), one message per packet, its body
//! JSON and its descriptors SCM_RIGHTS, each variant saying how many it carries. They are
//! encoded and decoded here only; each side holds a channel whose methods are named for
//! what they mean ([`CellChannel`] for the supervisor, [`Pid1Channel`] for the cell).

use crate::error::CellError;
use crate::rootfs::{self, Prepared, PreparedWire};
use crate::sys;
use airlock_contract::{CellPlan, TransparentEndpoint, TRANSPARENT_DNS};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::net::{SocketAddr, SocketAddrV4};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};

/// Most descriptors one message may carry (a release's mount trees are the most).
pub const MAX_FDS: usize = 250;

/// Supervisor -> the cell's pid 1.
#[derive(Serialize, Deserialize)]
pub enum ToCell {
    /// The user namespace maps are written: the cell may build the parts of its root it
    /// creates itself. Descriptors: the device nodes' trees, in the order of `devices`.
    Mapped { devices: Vec<PreparedWire> },
    /// The cell joined its cgroup: finish the setup (root, privileges, Landlock, seccomp)
    /// and park. Descriptors: the mount trees, in the order of `mounts`.
    Release {
        /// The seccomp program, one [`pack`]ed instruction each.
        program: Vec<u64>,
        mounts: Vec<PreparedWire>,
    },
    /// The audit record exists: start the cell's first command. Descriptors: its stdin,
    /// stdout and stderr, unless the command uses the cell's terminal.
    Start(CellCommand),
    /// `Start`, held: the command is delivered before its audit record is committed and
    /// pid 1 prepares it, but spawns it only once a byte arrives on one more descriptor
    /// (after the stdio ones), the read end of a pipe whose write end only the engine
    /// holds: the engine writes it once the record is committed. EOF on it (the engine
    /// is gone, or gave up on the record) ends the cell without running anything.
    StartHeld(CellCommand),
    /// A further command of a session (descriptors as for `Start`).
    Exec(CellCommand),
    /// Send `signal` to the process group of command `id`.
    Kill { id: u64, signal: i32 },
    /// End the session: kill every process of the cell and report [`FromCell::Ended`].
    Close,
    /// The artifacts are collected: pid 1 may exit.
    Collected,
}

/// The cell's pid 1 -> supervisor.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum FromCell {
    /// A setup step failed; pid 1 exits.
    Failed(LaunchFailure),
    /// The egress listeners bound in the cell's network namespace. Descriptors: HTTP,
    /// SOCKS, then the resolver's and the transparent sockets the body names.
    Listeners(ListenersWire),
    /// The master of the payload's terminal (one descriptor), for a plan with one; sent
    /// before any command can start.
    Terminal,
    /// The master of command `id`'s own terminal (one descriptor), allocated in the
    /// cell's devpts for a command with [`CommandStdio::NewTerminal`], before its spawn.
    CommandTerminal { id: u64 },
    /// The setup is complete (seccomp applied, the host's root detached): pid 1 waits for
    /// [`ToCell::Start`].
    Parked,
    /// Command `id` was exec'd.
    CommandStarted { id: u64 },
    /// Command `id` could not be exec'd (its process exited with `failure.status`).
    ExecFailed { id: u64, failure: ExecFailure },
    /// Command `id` of a session ended (raw wait status).
    CommandEnded { id: u64, wait_status: i32 },
    /// The cell's payload (a one-shot cell's command, or a session's last process) ended.
    Ended(PayloadEnded),
}

/// One command for the cell to run, resolved on the cell's PATH by pid 1.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CellCommand {
    pub id: u64,
    pub argv: Vec<String>,
    /// `NAME=value`: the plan's environment, the credential values and the command's own.
    pub env: Vec<String>,
    pub stdio: CommandStdio,
}

/// Where a command's stdin, stdout and stderr are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum CommandStdio {
    /// The three descriptors that travel with the message (pipes of the supervisor).
    Passed,
    /// The cell's terminal, which the command takes as its controlling one.
    Terminal,
    /// A terminal of the command's own, allocated by pid 1 in the cell's devpts when it
    /// spawns the command (an OCI container's `exec` with a console socket): the master
    /// goes to the supervisor ([`FromCell::CommandTerminal`]), the slave is the
    /// command's stdio and controlling terminal.
    NewTerminal,
}

/// Why a command could not be exec'd, as a shell reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecFailure {
    /// 127: not found; 126: found but not executable.
    pub status: i32,
    pub path: String,
    pub reason: String,
}

impl ExecFailure {
    /// The text of the run's error: `<path>: <reason>`.
    pub fn describe(&self) -> String {
        format!("{}: {}", self.path, self.reason)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LaunchFailure {
    pub stage: String,
    pub message: String,
    /// The step failed because the kernel lacks a feature (maps to `sandbox_unavailable`).
    pub unavailable: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PayloadEnded {
    /// Raw wait status of the payload process.
    pub wait_status: i32,
    /// Writable mounts that had no free space or inodes left when the payload ended.
    pub full_mounts: Vec<String>,
    /// `/dev/shm` had no free space or inodes left when the payload ended.
    #[serde(default)]
    pub shm_full: bool,
}

/// The descriptors of a command's stdio.
fn stdio_descriptors(command: &CellCommand) -> usize {
    match command.stdio {
        CommandStdio::Passed => 3,
        CommandStdio::Terminal | CommandStdio::NewTerminal => 0,
    }
}

/// A message type of this protocol: how many descriptors travel with each message.
trait Message: Serialize + DeserializeOwned {
    fn descriptors(&self) -> usize;
}

impl Message for ToCell {
    fn descriptors(&self) -> usize {
        match self {
            ToCell::Mapped { devices } => trees(devices),
            ToCell::Release { mounts, .. } => trees(mounts),
            ToCell::Start(command) | ToCell::Exec(command) => stdio_descriptors(command),
            ToCell::StartHeld(command) => stdio_descriptors(command) + 1,
            ToCell::Kill { .. } | ToCell::Close | ToCell::Collected => 0,
        }
    }
}

impl Message for FromCell {
    fn descriptors(&self) -> usize {
        match self {
            FromCell::Listeners(wire) => 3 + wire.transparent.len(),
            FromCell::Terminal | FromCell::CommandTerminal { .. } => 1,
            FromCell::Failed(_)
            | FromCell::Parked
            | FromCell::CommandStarted { .. }
            | FromCell::ExecFailed { .. }
            | FromCell::CommandEnded { .. }
            | FromCell::Ended(_) => 0,
        }
    }
}

fn trees(items: &[PreparedWire]) -> usize {
    items
        .iter()
        .filter(|i| matches!(i, PreparedWire::Tree { .. }))
        .count()
}

/// The body of one packet.
fn encode<M: Message>(message: &M) -> Vec<u8> {
    // These types serialise infallibly (no maps with non-string keys, no custom code).
    serde_json::to_vec(message).unwrap_or_default()
}

/// The inverse of [`encode`], with the packet's descriptors: a body that is not a
/// message, or the wrong number of descriptors for it, is refused.
fn decode<M: Message>(body: &[u8], fds: Vec<OwnedFd>) -> Result<(M, Vec<OwnedFd>), CellError> {
    let message: M = serde_json::from_slice(body).map_err(|e| CellError::Protocol {
        message: format!("malformed message: {e}"),
    })?;
    if message.descriptors() != fds.len() {
        return Err(CellError::Protocol {
            message: format!(
                "a message with {} descriptors, {} expected",
                fds.len(),
                message.descriptors()
            ),
        });
    }
    Ok((message, fds))
}

fn send<M: Message>(sock: &OwnedFd, message: &M, fds: &[RawFd]) -> std::io::Result<()> {
    sys::send_with_fds(sock.as_fd(), &encode(message), fds)
}

/// The next message; `None` when the peer closed its end (or the socket broke).
fn recv<M: Message>(sock: &OwnedFd) -> Result<Option<(M, Vec<OwnedFd>)>, CellError> {
    match sys::recv_message(sock.as_fd(), MAX_FDS) {
        Ok(Some((body, fds))) => decode(&body, fds).map(Some),
        Ok(None) | Err(_) => Ok(None),
    }
}

/// One seccomp instruction in a `u64`: code, jt, jf, k.
pub fn pack(insn: &libc::sock_filter) -> u64 {
    (insn.code as u64) << 48 | (insn.jt as u64) << 40 | (insn.jf as u64) << 32 | insn.k as u64
}

/// The inverse of [`pack`].
pub fn unpack(word: u64) -> libc::sock_filter {
    libc::sock_filter {
        code: (word >> 48) as u16,
        jt: (word >> 40) as u8,
        jf: (word >> 32) as u8,
        k: word as u32,
    }
}

fn raw_fds(fds: &[OwnedFd]) -> Vec<RawFd> {
    fds.iter().map(|f| f.as_raw_fd()).collect()
}

/// The supervisor's end of the socket pair: one method per message it sends.
pub struct CellChannel {
    sock: OwnedFd,
}

impl CellChannel {
    pub fn new(sock: OwnedFd) -> CellChannel {
        CellChannel { sock }
    }

    pub fn as_fd(&self) -> BorrowedFd<'_> {
        self.sock.as_fd()
    }

    /// The id maps are written; the device nodes go with the message.
    pub fn maps_written(&self, devices: Vec<Prepared>) -> std::io::Result<()> {
        let (devices, fds) = rootfs::to_wire(devices);
        send(&self.sock, &ToCell::Mapped { devices }, &raw_fds(&fds))
    }

    /// Releases the cell into the rest of its setup: the seccomp program and the mount
    /// trees.
    pub fn release(
        &self,
        program: &[libc::sock_filter],
        mounts: Vec<Prepared>,
    ) -> std::io::Result<()> {
        let (mounts, fds) = rootfs::to_wire(mounts);
        let program = program.iter().map(pack).collect();
        send(
            &self.sock,
            &ToCell::Release { program, mounts },
            &raw_fds(&fds),
        )
    }

    /// Starts the cell's first command (`stdio`: stdin, stdout, stderr, for
    /// [`CommandStdio::Passed`]).
    pub fn start(&self, command: CellCommand, stdio: &[BorrowedFd<'_>]) -> std::io::Result<()> {
        let fds: Vec<RawFd> = stdio.iter().map(|f| f.as_raw_fd()).collect();
        send(&self.sock, &ToCell::Start(command), &fds)
    }

    /// [`ToCell::StartHeld`]: `stdio`, then the release pipe's read end.
    pub fn start_held(
        &self,
        command: CellCommand,
        stdio: &[BorrowedFd<'_>],
        release: BorrowedFd<'_>,
    ) -> std::io::Result<()> {
        let fds: Vec<RawFd> = stdio
            .iter()
            .chain([&release])
            .map(|f| f.as_raw_fd())
            .collect();
        send(&self.sock, &ToCell::StartHeld(command), &fds)
    }

    /// Starts a further command of a session.
    pub fn exec(&self, command: CellCommand, stdio: &[BorrowedFd<'_>]) -> std::io::Result<()> {
        let fds: Vec<RawFd> = stdio.iter().map(|f| f.as_raw_fd()).collect();
        send(&self.sock, &ToCell::Exec(command), &fds)
    }

    pub fn kill_command(&self, id: u64, signal: i32) -> std::io::Result<()> {
        send(&self.sock, &ToCell::Kill { id, signal }, &[])
    }

    pub fn close_session(&self) -> std::io::Result<()> {
        send(&self.sock, &ToCell::Close, &[])
    }

    pub fn artifacts_collected(&self) -> std::io::Result<()> {
        send(&self.sock, &ToCell::Collected, &[])
    }

    /// The cell's next message with its descriptors; `None` once pid 1 closed its end.
    pub fn recv(&self) -> Result<Option<(FromCell, Vec<OwnedFd>)>, CellError> {
        recv(&self.sock)
    }
}

/// pid 1's end of the socket pair: one method per message it sends. Send errors are the
/// supervisor's death, which the parent-death signal and the next receive handle.
pub struct Pid1Channel {
    sock: OwnedFd,
}

impl Pid1Channel {
    pub fn new(sock: OwnedFd) -> Pid1Channel {
        Pid1Channel { sock }
    }

    pub fn as_fd(&self) -> BorrowedFd<'_> {
        self.sock.as_fd()
    }

    pub fn setup_failed(&self, failure: LaunchFailure) {
        let _ = send(&self.sock, &FromCell::Failed(failure), &[]);
    }

    pub fn listeners(&self, wire: ListenersWire, fds: &[RawFd]) -> std::io::Result<()> {
        send(&self.sock, &FromCell::Listeners(wire), fds)
    }

    pub fn terminal(&self, master: BorrowedFd<'_>) -> std::io::Result<()> {
        send(&self.sock, &FromCell::Terminal, &[master.as_raw_fd()])
    }

    /// The master of command `id`'s own terminal.
    pub fn command_terminal(&self, id: u64, master: BorrowedFd<'_>) -> std::io::Result<()> {
        send(
            &self.sock,
            &FromCell::CommandTerminal { id },
            &[master.as_raw_fd()],
        )
    }

    pub fn parked(&self) {
        let _ = send(&self.sock, &FromCell::Parked, &[]);
    }

    pub fn command_started(&self, id: u64) {
        let _ = send(&self.sock, &FromCell::CommandStarted { id }, &[]);
    }

    pub fn exec_failed(&self, id: u64, failure: ExecFailure) {
        let _ = send(&self.sock, &FromCell::ExecFailed { id, failure }, &[]);
    }

    pub fn command_ended(&self, id: u64, wait_status: i32) {
        let _ = send(&self.sock, &FromCell::CommandEnded { id, wait_status }, &[]);
    }

    pub fn payload_ended(&self, ended: PayloadEnded) {
        let _ = send(&self.sock, &FromCell::Ended(ended), &[]);
    }

    /// The supervisor's next message; `None` once it closed its end (it died).
    pub fn recv(&self) -> Result<Option<(ToCell, Vec<OwnedFd>)>, CellError> {
        recv(&self.sock)
    }

    /// Whether the supervisor's end is closed already.
    pub fn hung_up(&self) -> bool {
        let mut state = [libc::pollfd {
            fd: self.sock.as_raw_fd(),
            events: 0,
            revents: 0,
        }];
        sys::poll(&mut state, 0).is_ok_and(|_| state[0].revents & libc::POLLHUP != 0)
    }
}

/// What a LISTENERS message carries after the two proxy listeners, in the order of its
/// descriptors: the resolver's socket, then one listener per transparent endpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListenersWire {
    pub dns: SocketAddrV4,
    pub transparent: Vec<SocketAddrV4>,
}

impl ListenersWire {
    /// The sockets `plan` asks for (the launcher binds exactly these).
    pub fn for_plan(plan: &CellPlan) -> ListenersWire {
        ListenersWire {
            dns: TRANSPARENT_DNS,
            transparent: plan
                .network
                .transparent_endpoints()
                .into_iter()
                .map(|e| e.address)
                .collect(),
        }
    }
}

/// The egress sockets of an allowlisted cell, as the supervisor hands them to the proxy.
#[derive(Debug)]
pub struct EgressListeners {
    pub http: OwnedFd,
    pub socks: OwnedFd,
    /// UDP, bound on [`TRANSPARENT_DNS`].
    pub dns: OwnedFd,
    /// Each bound on its endpoint's address.
    pub transparent: Vec<(TransparentEndpoint, OwnedFd)>,
}

/// Checks the sockets of a [`FromCell::Listeners`] message against the plan: they must be
/// exactly the ones the plan asks for, each bound where the plan says, so that no
/// listener is ever served as another name's. `None` for anything else.
pub fn checked_listeners(
    announced: &ListenersWire,
    fds: Vec<OwnedFd>,
    plan: &CellPlan,
) -> Option<EgressListeners> {
    let expected = ListenersWire::for_plan(plan);
    if fds.len() != 3 + expected.transparent.len() {
        return None;
    }
    let mut fds = fds.into_iter();
    let (http, socks, dns) = (fds.next()?, fds.next()?, fds.next()?);
    let transparent: Vec<OwnedFd> = fds.collect();
    let bound = ListenersWire {
        dns: v4(bound_udp(&dns)?)?,
        transparent: transparent
            .iter()
            .map(|fd| v4(bound_tcp(fd)?))
            .collect::<Option<_>>()?,
    };
    if !matches_plan(&expected, announced, &bound) {
        return None;
    }
    Some(EgressListeners {
        http,
        socks,
        dns,
        transparent: plan
            .network
            .transparent_endpoints()
            .into_iter()
            .zip(transparent)
            .collect(),
    })
}

/// What the cell announced and what its sockets are really bound to must both be what
/// the plan asks for, in the plan's order.
fn matches_plan(
    expected: &ListenersWire,
    announced: &ListenersWire,
    bound: &ListenersWire,
) -> bool {
    announced == expected && bound == expected
}

fn v4(addr: SocketAddr) -> Option<SocketAddrV4> {
    match addr {
        SocketAddr::V4(v4) => Some(v4),
        SocketAddr::V6(_) => None,
    }
}

/// The local address of a UDP socket; the fd itself is left as it is.
fn bound_udp(fd: &OwnedFd) -> Option<SocketAddr> {
    std::net::UdpSocket::from(fd.try_clone().ok()?)
        .local_addr()
        .ok()
}

/// The local address of a TCP listener; the fd itself is left as it is.
fn bound_tcp(fd: &OwnedFd) -> Option<SocketAddr> {
    std::net::TcpListener::from(fd.try_clone().ok()?)
        .local_addr()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wire(dns: &str, transparent: &[&str]) -> ListenersWire {
        ListenersWire {
            dns: dns.parse().unwrap(),
            transparent: transparent.iter().map(|a| a.parse().unwrap()).collect(),
        }
    }

    #[test]
    fn listeners_bound_where_the_plan_says_are_accepted() {
        let plan = wire("127.0.0.53:53", &["127.100.0.1:443", "127.100.0.2:22"]);
        assert!(matches_plan(&plan, &plan.clone(), &plan.clone()));
    }

    #[test]
    fn a_listener_bound_elsewhere_or_out_of_order_is_refused() {
        let plan = wire("127.0.0.53:53", &["127.100.0.1:443", "127.100.0.2:22"]);
        for bound in [
            wire("127.0.0.53:53", &["127.100.0.2:22", "127.100.0.1:443"]),
            wire("127.0.0.53:53", &["127.100.0.1:443", "127.100.0.1:22"]),
            wire("127.0.0.1:53", &["127.100.0.1:443", "127.100.0.2:22"]),
            wire("127.0.0.53:53", &["127.100.0.1:443"]),
        ] {
            assert!(!matches_plan(&plan, &plan, &bound), "{bound:?}");
            assert!(!matches_plan(&plan, &bound, &plan), "{bound:?}");
        }
    }

    #[test]
    fn sockets_not_bound_where_the_plan_says_are_refused() {
        let network = airlock_contract::NetworkPlan::Allowlist {
            destinations: vec![airlock_contract::DestinationRule {
                host_pattern: "api.test".into(),
                ports: vec![8443],
            }],
        };
        let mut plan = test_plan();
        plan.network = network;
        let announced = ListenersWire::for_plan(&plan);
        let tcp = || OwnedFd::from(std::net::TcpListener::bind("127.0.0.1:0").unwrap());
        let udp = OwnedFd::from(std::net::UdpSocket::bind("127.0.0.1:0").unwrap());
        // The right message, but the sockets are bound on other addresses.
        assert!(checked_listeners(&announced, vec![tcp(), tcp(), udp, tcp()], &plan).is_none());
        // Too few descriptors.
        assert!(checked_listeners(&announced, vec![tcp(), tcp()], &plan).is_none());
    }

    fn fd() -> OwnedFd {
        OwnedFd::from(std::fs::File::open("/dev/null").unwrap())
    }

    fn fds(n: usize) -> Vec<OwnedFd> {
        (0..n).map(|_| fd()).collect()
    }

    /// Encodes `message`, decodes it with `n` descriptors and encodes the result again.
    fn round_trip<M: Message>(message: &M, n: usize) -> (M, Vec<u8>) {
        let body = encode(message);
        let (decoded, received) = decode::<M>(&body, fds(n)).expect("decodes");
        assert_eq!(received.len(), n);
        let again = encode(&decoded);
        assert_eq!(body, again, "a round trip keeps every field");
        (decoded, body)
    }

    fn command(stdio: CommandStdio) -> CellCommand {
        CellCommand {
            id: 7,
            argv: vec!["/bin/echo".into(), "hi there".into()],
            env: vec!["PATH=/usr/bin:/bin".into(), "TOKEN=s3cret".into()],
            stdio,
        }
    }

    #[test]
    fn every_message_to_the_cell_survives_a_round_trip() {
        let tree = |t: &str| PreparedWire::Tree {
            target: t.into(),
            is_dir: true,
        };
        let link = PreparedWire::Symlink {
            target: "/bin".into(),
            link: "usr/bin".into(),
        };
        let program = [
            libc::sock_filter {
                code: 0x20,
                jt: 0,
                jf: 0,
                k: 4,
            },
            libc::sock_filter {
                code: 0x15,
                jt: 1,
                jf: 2,
                k: 0xc000_003e,
            },
        ];
        let packed: Vec<u64> = program.iter().map(pack).collect();
        for (message, n) in [
            (
                ToCell::Mapped {
                    devices: vec![tree("/dev/null"), tree("/dev/zero")],
                },
                2,
            ),
            (
                ToCell::Release {
                    program: packed.clone(),
                    mounts: vec![tree("/usr"), link],
                },
                1,
            ),
            (ToCell::Start(command(CommandStdio::Passed)), 3),
            (ToCell::Start(command(CommandStdio::Terminal)), 0),
            (ToCell::StartHeld(command(CommandStdio::Passed)), 4),
            (ToCell::Exec(command(CommandStdio::Passed)), 3),
            (ToCell::Exec(command(CommandStdio::NewTerminal)), 0),
            (ToCell::Kill { id: 3, signal: 15 }, 0),
            (ToCell::Close, 0),
            (ToCell::Collected, 0),
        ] {
            let (decoded, body) = round_trip(&message, n);
            let text = String::from_utf8_lossy(&body).into_owned();
            match (&message, &decoded) {
                (ToCell::Start(a), ToCell::Start(b))
                | (ToCell::StartHeld(a), ToCell::StartHeld(b))
                | (ToCell::Exec(a), ToCell::Exec(b)) => {
                    assert_eq!(a, b)
                }
                (ToCell::Kill { id: a, signal: x }, ToCell::Kill { id: b, signal: y }) => {
                    assert_eq!((a, x), (b, y))
                }
                (ToCell::Release { program, .. }, ToCell::Release { program: got, .. }) => {
                    assert_eq!(program, got);
                    let insns: Vec<libc::sock_filter> = got.iter().copied().map(unpack).collect();
                    assert_eq!(
                        insns
                            .iter()
                            .map(|i| (i.code, i.jt, i.jf, i.k))
                            .collect::<Vec<_>>(),
                        [(0x20, 0, 0, 4), (0x15, 1, 2, 0xc000_003e)]
                    );
                }
                (ToCell::Mapped { .. }, ToCell::Mapped { .. })
                | (ToCell::Close, ToCell::Close)
                | (ToCell::Collected, ToCell::Collected) => {}
                _ => panic!("decoded as another message: {text}"),
            }
        }
    }

    #[test]
    fn every_message_from_the_cell_survives_a_round_trip() {
        let wire = ListenersWire {
            dns: TRANSPARENT_DNS,
            transparent: vec!["127.100.0.1:443".parse().unwrap()],
        };
        for (message, n) in [
            (
                FromCell::Failed(LaunchFailure {
                    stage: "seccomp".into(),
                    message: "EINVAL".into(),
                    unavailable: true,
                }),
                0,
            ),
            (FromCell::Listeners(wire), 4),
            (FromCell::Terminal, 1),
            (FromCell::CommandTerminal { id: 4 }, 1),
            (FromCell::Parked, 0),
            (FromCell::CommandStarted { id: 1 }, 0),
            (
                FromCell::ExecFailed {
                    id: 2,
                    failure: ExecFailure {
                        status: 127,
                        path: "nope".into(),
                        reason: "command not found".into(),
                    },
                },
                0,
            ),
            (
                FromCell::CommandEnded {
                    id: 3,
                    wait_status: 9,
                },
                0,
            ),
            (
                FromCell::Ended(PayloadEnded {
                    wait_status: 256,
                    full_mounts: vec!["/tmp".into()],
                    shm_full: true,
                }),
                0,
            ),
        ] {
            let (decoded, _) = round_trip(&message, n);
            assert_eq!(decoded, message);
        }
    }

    #[test]
    fn a_message_with_the_wrong_number_of_descriptors_is_refused() {
        let body = encode(&ToCell::Start(command(CommandStdio::Passed)));
        assert!(decode::<ToCell>(&body, fds(2)).is_err());
        assert!(decode::<ToCell>(&body, fds(4)).is_err());
        let body = encode(&FromCell::Terminal);
        assert!(decode::<FromCell>(&body, Vec::new()).is_err());
        let body = encode(&FromCell::Parked);
        assert!(decode::<FromCell>(&body, fds(1)).is_err());
    }

    #[test]
    fn a_body_that_is_no_message_is_refused() {
        assert!(decode::<ToCell>(b"S", Vec::new()).is_err());
        assert!(decode::<FromCell>(b"{\"Launch\":1}", Vec::new()).is_err());
        // A message of the other direction is not one of this one.
        assert!(decode::<FromCell>(&encode(&ToCell::Close), Vec::new()).is_err());
    }

    #[test]
    fn messages_travel_through_a_socket_pair_with_their_descriptors() {
        let (a, b) = sys::seqpacket_pair().unwrap();
        let (supervisor, cell) = (CellChannel::new(a), Pid1Channel::new(b));
        let (r, w) = sys::pipe_cloexec().unwrap();
        let null = fd();
        supervisor
            .start(
                command(CommandStdio::Passed),
                &[null.as_fd(), w.as_fd(), w.as_fd()],
            )
            .unwrap();
        let (message, received) = cell.recv().unwrap().unwrap();
        assert!(matches!(message, ToCell::Start(c) if c == command(CommandStdio::Passed)));
        // The received write end is the pipe's.
        sys::write(received[1].as_fd(), b"x").unwrap();
        let mut buf = [0u8; 1];
        assert_eq!(sys::read(r.as_fd(), &mut buf).unwrap(), 1);
        cell.command_started(7);
        let (message, _) = supervisor.recv().unwrap().unwrap();
        assert_eq!(message, FromCell::CommandStarted { id: 7 });
        drop(cell);
        assert!(supervisor.recv().unwrap().is_none(), "EOF is None");
    }

    fn test_plan() -> CellPlan {
        let contract = airlock_contract::default_contract();
        airlock_contract::compile(
            &contract,
            &airlock_contract::CompileInput::new(std::path::Path::new("/"), &["true".to_string()]),
        )
        .unwrap()
    }
}
