//! airlock's own small part inside a gVisor session's sandbox: this binary, bound
//! read-only at [`HELPER_PATH`], run in one of these roles chosen by its first argument
//! (entered through [`run_inside_sandbox_if_requested`] first thing in `main`):
//!
//! - the session's holder, pid 1 of the sandbox: it says it is up (one line on its
//!   stdout, so the supervisor knows `runsc exec` can reach the container), then reaps
//!   the orphans of the session's commands until the sandbox is destroyed;
//! - a command's launcher, the process `runsc exec` starts: it leads a new session (so
//!   the command and its children are one process group, killed together), installs
//!   the plan's seccomp program and execs the command. runsc applies the spec's
//!   `linux.seccomp` to the container's first process only: Debian 12's runsc
//!   (20221219) starts an exec'd process without it (measured: `uname` denied to the
//!   first process ran in an exec'd one). So the filter is installed here, inside the
//!   Sentry, from the same program the native cell installs (the plan's, by its sha256);
//! - a signal to a command's process group (`kill(-pgid, sig)`), which `runsc kill`
//!   cannot send: it signals one process or all of them;
//! - the egress forwarder of an allowlisted sandbox: it listens on the plan's proxy
//!   addresses on gVisor's own loopback (the sandbox has no other network:
//!   `--network=none`) and, per accepted connection, asks the supervisor over its stdin
//!   (a host unix socket: the control channel) for a fresh host socket, passed back with
//!   `SCM_RIGHTS`, whose other end the supervisor connects to airlock's egress proxy;
//!   it relays bytes between the two. It also listens on the resolver's UDP address
//!   (`127.0.0.53:53`, where the sandbox's `/etc/resolv.conf` points, as natively) and
//!   relays each datagram, tagged with its sender, over a SOCK_SEQPACKET socket the
//!   supervisor gave it to the proxy's resolver. It decides nothing: the proxy does
//!   (docs/threat-model.md, "Tiers", says why a payload that kills or replaces it gains
//!   nothing);
//! - the unix forwarder of a sandbox whose run may ask the broker: the same, for one
//!   unix socket it binds at the broker's path (its host end is the run's broker
//!   socket, super::broker).
//!
//! Each runs as the payload's user with no capabilities and no_new_privs (the process
//! spec of every `runsc exec` is the first payload's: crates/oci `exec_process`), but for
//! the unix forwarder, which runs as the sandbox's root (still no capabilities and
//! no_new_privs), so that the payload can neither replace its socket nor signal it.
//! The forwarders' shared part (the bridge on the supervisor's side, the relay) is
//! super::route.

use crate::error::CellError;
use crate::sys;
use airlock_contract::CellPlan;
use std::path::{Path, PathBuf};

/// Where this binary is bound (read-only) in a session's sandbox.
pub const HELPER_PATH: &str = "/.airlock-sandbox";
const HOLDER_ARG: &str = "--airlock-gvisor-holder";
const LAUNCH_ARG: &str = "--airlock-gvisor-launch";
const SIGNAL_ARG: &str = "--airlock-gvisor-signal";
const FORWARD_ARG: &str = "--airlock-gvisor-forward";
const FORWARD_UNIX_ARG: &str = "--airlock-gvisor-forward-unix";
/// The message that carries the forwarder's end of the resolver's channel, after
/// [`super::route::FORWARDER_READY`].
pub const RESOLVER_ROUTE: u8 = b'D';
/// The most of a query relayed: the proxy's resolver takes queries of up to 512 bytes
/// and reads one byte more, so that it sees a larger one (cut here, as its own read
/// cuts it natively) and answers it FORMERR, as natively.
pub const MAX_DNS_QUERY: usize = 512 + 1;
/// The largest answer relayed (a query's question echoed, at most 512 bytes, and one
/// address record); a larger one is dropped.
pub const MAX_DNS_ANSWER: usize = 1024;
/// The sender tag before each relayed DNS message: the client's IPv4 address and port.
pub const DNS_TAG: usize = 6;
/// What the holder writes on its stdout once it runs.
pub const HOLDER_READY: &[u8] = b"airlock-holder-ready\n";
/// The launcher's exit status when the seccomp program cannot be installed (the
/// command never ran).
pub const LAUNCH_FAILED: i32 = 125;

/// The holder's command line.
pub fn holder_argv() -> Vec<String> {
    vec![HELPER_PATH.to_string(), HOLDER_ARG.to_string()]
}

/// The launcher's command line for `argv` under `plan`'s seccomp program.
pub fn launch_argv(plan: &CellPlan, argv: &[String]) -> Vec<String> {
    let mut line = vec![
        HELPER_PATH.to_string(),
        LAUNCH_ARG.to_string(),
        encode_program(&plan.seccomp.program),
        "--".to_string(),
    ];
    line.extend(argv.iter().cloned());
    line
}

/// The command line that sends `signal` to process group `pgid` inside the sandbox.
pub fn signal_argv(pgid: i32, signal: i32) -> Vec<String> {
    vec![
        HELPER_PATH.to_string(),
        SIGNAL_ARG.to_string(),
        pgid.to_string(),
        signal.to_string(),
    ]
}

/// The forwarder's command line: it listens on `addresses`, in order; a connection to
/// the `i`-th is requested from the supervisor as the byte `i`.
pub fn forwarder_argv(addresses: &[std::net::SocketAddrV4]) -> Vec<String> {
    let mut line = vec![HELPER_PATH.to_string(), FORWARD_ARG.to_string()];
    line.extend(addresses.iter().map(|a| a.to_string()));
    line
}

/// The unix forwarder's command line: it binds a socket at `path` (the broker's, in the
/// sandbox), and each connection to it is requested from the supervisor as the byte 0.
pub fn unix_forwarder_argv(path: &Path) -> Vec<String> {
    vec![
        HELPER_PATH.to_string(),
        FORWARD_UNIX_ARG.to_string(),
        path.display().to_string(),
    ]
}

/// The bundle of a session: the holder as the first process, and this binary bound
/// read-only (no setuid, no devices) at [`HELPER_PATH`] over an empty mount point in
/// the root skeleton.
pub fn make_session_spec(
    spec: &mut airlock_oci::spec_types::Spec,
    rootfs: &Path,
) -> Result<(), CellError> {
    let binary = this_binary()?;
    let point = rootfs.join(HELPER_PATH.trim_start_matches('/'));
    std::fs::write(&point, b"").map_err(|e| CellError::io(point.display().to_string(), e))?;
    let mount = airlock_oci::spec_types::MountBuilder::default()
        .destination(HELPER_PATH)
        .typ("bind")
        .source(binary)
        .options(vec![
            "bind".to_string(),
            "ro".to_string(),
            "nosuid".to_string(),
            "nodev".to_string(),
        ])
        .build();
    super::bundle::push_mount(spec, mount)?;
    let Some(process) = spec.process_mut() else {
        return Err(CellError::Launch {
            stage: "runtime spec".into(),
            message: "a spec without a process".into(),
        });
    };
    process.set_args(Some(holder_argv()));
    Ok(())
}

/// The file of the running binary (the supervisor is this binary, forked by the
/// engine's cell factory).
fn this_binary() -> Result<PathBuf, CellError> {
    std::fs::read_link("/proc/self/exe").map_err(|e| CellError::io("/proc/self/exe", e))
}

/// Becomes one of the roles above if `argv[1]` names one; returns otherwise.
pub fn run_inside_sandbox_if_requested() {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some(HOLDER_ARG) => hold(),
        Some(LAUNCH_ARG) => launch(&args[2..]),
        Some(SIGNAL_ARG) => signal_group(&args[2..]),
        Some(FORWARD_ARG) => forward(&args[2..]),
        Some(FORWARD_UNIX_ARG) => forward_unix(&args[2..]),
        _ => {}
    }
}

fn hold() -> ! {
    use std::io::Write;
    let mut stdout = std::io::stdout();
    let _ = stdout.write_all(HOLDER_READY).and_then(|()| stdout.flush());
    loop {
        match sys::wait_child(-1, false) {
            Ok(_) => {}
            // No child now: an orphan may become one later.
            Err(_) => std::thread::sleep(std::time::Duration::from_millis(500)),
        }
    }
}

fn launch(args: &[String]) -> ! {
    use std::os::unix::process::CommandExt;
    let (Some(program), Some("--")) = (args.first(), args.get(1).map(String::as_str)) else {
        fail(LAUNCH_FAILED, "the launcher's arguments are malformed")
    };
    let Some(argv) = args.get(2..).filter(|a| !a.is_empty()) else {
        fail(LAUNCH_FAILED, "no command")
    };
    let Some(program) = decode_program(program) else {
        fail(LAUNCH_FAILED, "the seccomp program is malformed")
    };
    // A group of its own: the deadline and kill reach the command's children too.
    // EPERM: it leads a group already (runsc may start it as one), which is enough.
    match sys::setsid() {
        Err(e) if e.raw_os_error() != Some(libc::EPERM) => {
            fail(LAUNCH_FAILED, &format!("setsid: {e}"))
        }
        _ => {}
    }
    // Set by the process spec already; asked again because seccomp(2) requires it.
    if let Err(e) = sys::prctl(libc::PR_SET_NO_NEW_PRIVS, 1) {
        fail(LAUNCH_FAILED, &format!("no_new_privs: {e}"));
    }
    if let Err(e) = sys::install_seccomp_filter(&program) {
        fail(
            LAUNCH_FAILED,
            &format!("installing the seccomp program: {e}"),
        );
    }
    let err = std::process::Command::new(&argv[0]).args(&argv[1..]).exec();
    let status = sys::exec_failure_status(err.raw_os_error().unwrap_or(libc::EACCES));
    fail(status, &format!("{}: {err}", argv[0]))
}

fn signal_group(args: &[String]) -> ! {
    let (pgid, signal) = match signal_target(args) {
        Ok(target) => target,
        Err(why) => fail(2, why),
    };
    match sys::kill(-pgid, signal) {
        Ok(()) => sys::exit_now(0),
        Err(e) => fail(1, &format!("kill -{signal} -{pgid}: {e}")),
    }
}

/// The process group and signal of the signal role: a command's group only, never
/// pid 1's (the holder's) nor "every process" (`kill(-1)`), nor anything but a signal.
fn signal_target(args: &[String]) -> Result<(i32, i32), &'static str> {
    let number = |at: usize| args.get(at).and_then(|a| a.parse::<i32>().ok());
    let (Some(pgid), Some(signal)) = (number(0), number(1)) else {
        return Err("usage: <pgid> <signal>");
    };
    if pgid <= 1 {
        return Err("not a command's process group");
    }
    if !(1..=64).contains(&signal) {
        return Err("not a signal");
    }
    Ok((pgid, signal))
}

/// The listening addresses of the forwarder role: at most 256 (one request byte each).
/// The resolver's address is not one of them: it is UDP, and always the forwarder's.
fn forward_addresses(args: &[String]) -> Result<Vec<std::net::SocketAddrV4>, String> {
    let addresses = args
        .iter()
        .map(|a| {
            a.parse()
                .map_err(|_| format!("not an IPv4 address and port: {a}"))
        })
        .collect::<Result<Vec<_>, String>>()?;
    if addresses.is_empty() || addresses.len() > 256 {
        return Err("the forwarder needs between 1 and 256 addresses".into());
    }
    Ok(addresses)
}

fn forward(args: &[String]) -> ! {
    let addresses = forward_addresses(args).unwrap_or_else(|why| fail(LAUNCH_FAILED, &why));
    let listeners: Vec<std::net::TcpListener> = addresses
        .iter()
        .map(|a| {
            std::net::TcpListener::bind(a)
                .unwrap_or_else(|e| fail(LAUNCH_FAILED, &format!("{a}: {e}")))
        })
        .collect();
    let dns = airlock_contract::TRANSPARENT_DNS;
    let resolver = std::net::UdpSocket::bind(dns)
        .unwrap_or_else(|e| fail(LAUNCH_FAILED, &format!("{dns}: {e}")));
    let control = control_channel();
    let resolver_route = receive_resolver_route(&control)
        .unwrap_or_else(|why| fail(LAUNCH_FAILED, &format!("the resolver's channel: {why}")));
    relay_resolver(resolver, resolver_route)
        .unwrap_or_else(|e| fail(LAUNCH_FAILED, &format!("the resolver's relay: {e}")));
    let accepting: Vec<_> = listeners
        .into_iter()
        .enumerate()
        .map(|(index, listener)| {
            let control = control.clone();
            std::thread::spawn(move || {
                serve_connections(listener.incoming(), index as u8, &control)
            })
        })
        .collect();
    for thread in accepting {
        let _ = thread.join();
    }
    // An accept loop ends when the supervisor closed the channel: nothing is carried.
    fail(1, "the control channel closed")
}

/// The unix forwarder (the broker's socket): it runs as the sandbox's root (no
/// capabilities), so the socket's directory, a tmpfs of the sandbox that is root's and
/// 0755, lets the payload connect to the socket (0666) but not remove or replace it.
fn forward_unix(args: &[String]) -> ! {
    use std::os::unix::fs::PermissionsExt;
    let [path] = args else {
        fail(LAUNCH_FAILED, "usage: <socket path>")
    };
    let listener = std::os::unix::net::UnixListener::bind(path)
        .unwrap_or_else(|e| fail(LAUNCH_FAILED, &format!("{path}: {e}")));
    if let Err(e) = std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666)) {
        fail(LAUNCH_FAILED, &format!("{path}: {e}"));
    }
    let control = control_channel();
    serve_connections(listener.incoming(), 0, &control);
    fail(1, "the control channel closed")
}

type Control = std::sync::Arc<std::sync::Mutex<std::os::unix::net::UnixStream>>;

/// fd 0, the control channel (`runsc exec`'s stdin: a host unix socket), once the
/// forwarder's ready byte is on it: the forwarder listens.
fn control_channel() -> Control {
    use std::io::Write;
    use std::os::fd::AsFd;
    let control = std::io::stdin()
        .as_fd()
        .try_clone_to_owned()
        .map(std::os::unix::net::UnixStream::from)
        .unwrap_or_else(|e| fail(LAUNCH_FAILED, &format!("the control channel: {e}")));
    if let Err(e) = (&control).write_all(&[super::route::FORWARDER_READY]) {
        fail(LAUNCH_FAILED, &format!("the control channel: {e}"));
    }
    std::sync::Arc::new(std::sync::Mutex::new(control))
}

/// Serves one listener's connections until the control channel fails.
fn serve_connections<S: super::route::Duplex>(
    connections: impl Iterator<Item = std::io::Result<S>>,
    index: u8,
    control: &std::sync::Mutex<std::os::unix::net::UnixStream>,
) {
    for connection in connections {
        let Ok(connection) = connection else { continue };
        match request_route(control, index) {
            Ok(Some(route)) => {
                // No thread (the sandbox's process limit): this connection closes.
                let _ = std::thread::Builder::new()
                    .spawn(move || super::route::relay(connection, route));
            }
            // Refused by the supervisor: this connection closes, the others go on.
            Ok(None) => {}
            Err(_) => std::process::exit(1),
        }
    }
}

/// Asks the supervisor for the host socket of one connection to listener `index`; `None`
/// when it has none for it. One request at a time: the answers are not tagged.
fn request_route(
    control: &std::sync::Mutex<std::os::unix::net::UnixStream>,
    index: u8,
) -> std::io::Result<Option<std::os::unix::net::UnixStream>> {
    use std::io::Write;
    use std::os::fd::AsFd;
    let channel = control.lock().unwrap_or_else(|e| e.into_inner());
    (&*channel).write_all(&[index])?;
    let mut answer = [0u8; 1];
    let (n, fds) = sys::recv_with_fds(channel.as_fd(), &mut answer, 1)?;
    if n == 0 {
        return Err(std::io::ErrorKind::UnexpectedEof.into());
    }
    Ok(fds
        .into_iter()
        .next()
        .map(std::os::unix::net::UnixStream::from))
}

/// The resolver's channel, which the supervisor sends right after the ready byte.
fn receive_resolver_route(control: &Control) -> Result<std::os::fd::OwnedFd, String> {
    use std::os::fd::AsFd;
    let control = control.lock().unwrap_or_else(|e| e.into_inner());
    let mut kind = [0u8; 1];
    let (n, fds) = sys::recv_with_fds(control.as_fd(), &mut kind, 1).map_err(|e| e.to_string())?;
    match (n, kind[0], fds.into_iter().next()) {
        (1, RESOLVER_ROUTE, Some(fd)) => Ok(fd),
        _ => Err("not sent".into()),
    }
}

/// Two threads: datagrams to `resolver` go to `route`, tagged with their sender; the
/// tagged answers from `route` go back to their sender. They end with the channel.
fn relay_resolver(
    resolver: std::net::UdpSocket,
    route: std::os::fd::OwnedFd,
) -> std::io::Result<()> {
    let (answers_from, answers_to) = (route.try_clone()?, resolver.try_clone()?);
    std::thread::Builder::new().spawn(move || relay_queries(&resolver, &route))?;
    std::thread::Builder::new().spawn(move || relay_answers(&answers_from, &answers_to))?;
    Ok(())
}

fn relay_queries(resolver: &std::net::UdpSocket, route: &std::os::fd::OwnedFd) {
    use std::os::fd::AsFd;
    // A longer datagram is cut to the buffer (recvfrom's own truncation).
    let mut message = [0u8; DNS_TAG + MAX_DNS_QUERY];
    loop {
        let from = match resolver.recv_from(&mut message[DNS_TAG..]) {
            Ok((n, std::net::SocketAddr::V4(from))) => (n, from),
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => return,
        };
        let (n, from) = from;
        if n == 0 {
            continue;
        }
        message[..4].copy_from_slice(&from.ip().octets());
        message[4..DNS_TAG].copy_from_slice(&from.port().to_be_bytes());
        if sys::send_with_fds(route.as_fd(), &message[..DNS_TAG + n], &[]).is_err() {
            return;
        }
    }
}

fn relay_answers(route: &std::os::fd::OwnedFd, resolver: &std::net::UdpSocket) {
    use std::os::fd::AsFd;
    let mut message = [0u8; DNS_TAG + MAX_DNS_ANSWER + 1];
    loop {
        let n = match sys::read(route.as_fd(), &mut message) {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if n <= DNS_TAG || n > DNS_TAG + MAX_DNS_ANSWER {
            continue;
        }
        let ip = std::net::Ipv4Addr::new(message[0], message[1], message[2], message[3]);
        let port = u16::from_be_bytes([message[4], message[5]]);
        let _ = resolver.send_to(&message[DNS_TAG..n], (ip, port));
    }
}

fn fail(status: i32, why: &str) -> ! {
    eprintln!("airlock: {why}");
    sys::exit_now(status)
}

/// The program as hex, eight bytes an instruction (code, jt, jf, k; little-endian).
fn encode_program(program: &[airlock_contract::seccomp::BpfInsn]) -> String {
    let mut text = String::with_capacity(program.len() * 16);
    for insn in program {
        let mut bytes = [0u8; 8];
        bytes[0..2].copy_from_slice(&insn.code.to_le_bytes());
        bytes[2] = insn.jt;
        bytes[3] = insn.jf;
        bytes[4..8].copy_from_slice(&insn.k.to_le_bytes());
        for b in bytes {
            text.push_str(&format!("{b:02x}"));
        }
    }
    text
}

fn decode_program(text: &str) -> Option<Vec<libc::sock_filter>> {
    if text.is_empty() || !text.len().is_multiple_of(16) || !text.is_ascii() {
        return None;
    }
    let bytes: Option<Vec<u8>> = (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).ok())
        .collect();
    let bytes = bytes?;
    Some(
        bytes
            .chunks(8)
            .map(|b| libc::sock_filter {
                code: u16::from_le_bytes([b[0], b[1]]),
                jt: b[2],
                jf: b[3],
                k: u32::from_le_bytes([b[4], b[5], b[6], b[7]]),
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use airlock_contract::seccomp::BpfInsn;

    #[test]
    fn a_program_survives_the_command_line() {
        let program = [
            BpfInsn::new(0x20, 0, 0, 4),
            BpfInsn::new(0x15, 1, 0, 0xc000_003e),
            BpfInsn::new(0x06, 0, 0, 0x7fff_0000),
        ];
        let decoded = decode_program(&encode_program(&program)).unwrap();
        assert_eq!(decoded.len(), 3);
        assert_eq!(
            (decoded[1].code, decoded[1].jt, decoded[1].jf, decoded[1].k),
            (0x15, 1, 0, 0xc000_003e)
        );
        assert!(decode_program("").is_none());
        assert!(decode_program("zz00000000000000").is_none());
        assert!(decode_program("0000").is_none());
    }

    #[test]
    fn the_forwarder_listens_on_the_addresses_it_was_given_and_on_nothing_else() {
        let addresses: Vec<std::net::SocketAddrV4> = vec![
            "127.0.0.1:3128".parse().unwrap(),
            "127.100.0.1:443".parse().unwrap(),
        ];
        let line = forwarder_argv(&addresses);
        assert_eq!(line[..2], [HELPER_PATH, FORWARD_ARG]);
        assert_eq!(forward_addresses(&line[2..]), Ok(addresses));
        assert!(forward_addresses(&[]).is_err());
        assert!(forward_addresses(&["localhost:3128".to_string()]).is_err());
        assert!(forward_addresses(&["[::1]:3128".to_string()]).is_err());
        let too_many: Vec<String> = (0..257)
            .map(|p| format!("127.0.0.1:{}", 2000 + p))
            .collect();
        assert!(forward_addresses(&too_many).is_err());
    }

    #[test]
    fn a_signal_never_reaches_pid_1_or_every_process() {
        let args = |pgid: &str, signal: &str| vec![pgid.to_string(), signal.to_string()];
        assert_eq!(signal_target(&signal_argv(7, 15)[2..]), Ok((7, 15)));
        assert!(signal_target(&args("1", "9")).is_err());
        assert!(signal_target(&args("0", "9")).is_err());
        assert!(signal_target(&args("-1", "9")).is_err());
        assert!(signal_target(&args("7", "0")).is_err());
        assert!(signal_target(&args("7", "x")).is_err());
        assert!(signal_target(&args("7", "")).is_err());
    }
}
