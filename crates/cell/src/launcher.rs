//! The cell side of a run: what the cloned child does, in order, until it execs the
//! payload. It runs as pid 1 of the new pid namespace, in fresh user, mount, net, ipc and
//! uts namespaces, and becomes the cell's reaper once the payload is started.
//!
//! Order (docs/architecture.md, "Launch sequence"): network namespace, `lo` and hostname (overlapping with the
//! supervisor's id-map writes) -> wait for the maps -> identity -> new root tmpfs with a
//! fresh /proc, pivot_root, and the old root's detaching started in the background ->
//! the root's own parts (/dev, /etc, /proc masks, writable paths) -> wait for the release
//! (seccomp program + mount trees) -> cgroup namespace -> the release's mounts -> egress
//! listeners -> setsid -> the payload's terminal, if the plan has one -> stdio ->
//! rlimits -> capabilities and securebits -> no_new_privs -> Landlock -> close-on-exec for fds >= 3 -> seccomp (last) -> the old
//! root is detached -> park: tell the supervisor, wait for START, which carries the
//! command (argv, environment, stdio descriptors; the audit record exists, the setup above
//! overlapped its commit) -> resolve it on the command's PATH and spawn it (a vfork-style
//! child that only execs, in a process group of its own, after taking the terminal as its
//! controlling one in a session of its own when there is one).

use crate::kernel::RealKernel;
use crate::protocol::{
    self, CellCommand, CommandStdio, ExecFailure, LaunchFailure, PayloadEnded, Pid1Channel, ToCell,
};
use crate::stage::Stage;
use crate::{landlock_policy, rootfs, sys};
use airlock_contract::{
    CellPlan, NetworkPlan, Rlimit, RlimitResource, Securebit, HTTP_PROXY_PORT, SOCKS_PROXY_PORT,
};
use std::ffi::CString;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// Everything the child needs, prepared by the supervisor before `clone`. The command
/// is not among it: it arrives with START.
pub struct ChildSetup<'a> {
    pub plan: &'a CellPlan,
    pub sync: Pid1Channel,
    /// The null device: pid 1's own stdin, stdout and stderr.
    pub null: OwnedFd,
    /// pid 1 waits after the payload's end until the supervisor says COLLECTED: its
    /// root stays reachable through /proc/<pid>/root for the artifacts' collection and a
    /// suspected escape's evidence.
    pub waits_for_collection: bool,
    /// A session's pid 1 serves further commands after the first, until CLOSE.
    pub session: bool,
    /// A container's pid 1 (an OCI runtime's cell) serves further commands (EXEC) while
    /// its payload runs, and ends with the payload, whatever else runs.
    pub serves_execs: bool,
    /// Where the setup runs (see the supervisor's `other_cpu`).
    pub setup_cpu: Option<usize>,
    /// The window size of the payload's terminal, for a plan with one: the caller's,
    /// taken before the clone so that the payload's first look at it is already right.
    pub window: libc::winsize,
    /// The cell clones its mount sources itself: the supervisor is not root and cannot
    /// (see [`rootfs::deferred_cgroup_view`]).
    pub clones_in_cell: bool,
    /// pid 1's rlimits, and so every process's of the cell: the plan's, or those of its
    /// `without_cgroup` when it runs without a cgroup.
    pub rlimits: Vec<Rlimit>,
    /// Set in each payload process just before its exec (rlimits only: the address
    /// space and CPU time that are not pid 1's to share).
    pub payload_rlimits: Vec<Rlimit>,
}

/// Entry point of the cloned child. Never returns.
pub fn run(setup: ChildSetup<'_>) -> ! {
    let (old_root_detach, terminal) = match prepare(&setup) {
        Ok(prepared) => prepared,
        Err(stage) => fail(&setup, stage),
    };
    // The host's paths are gone before anything of the payload can run.
    if let Err(err) = old_root_detach.wait() {
        fail(
            &setup,
            Stage::io("rootfs.detach_old_root", Path::new("/"), err),
        );
    }
    // The payload must not inherit the runtime's ignored SIGPIPE; pid 1 is not
    // affected: the kernel does not deliver default-action signals to a pid namespace's
    // init.
    if let Err(err) = sys::reset_signal_state() {
        fail(&setup, Stage::errno("spawn_payload", err));
    }
    // Parked: nothing of the payload runs before START (its audit record exists).
    setup.sync.parked();
    let (command, stdio) = match wait_for_start(&setup) {
        Ok(start) => start,
        Err(stage) => fail(&setup, stage),
    };
    let payload = match spawn_command(&setup, &command, &stdio, terminal.as_ref()) {
        Ok(pid) => pid,
        Err(err) => fail(&setup, Stage::errno("spawn_payload", err)),
    };
    // pid 1 keeps no end of the payload's pipes: their EOF is the payload's.
    drop(stdio);
    if setup.session {
        serve_session(setup, (command.id, payload))
    }
    // The payload and its descendants hold the terminal now; when the last of them
    // closes it, the supervisor's master reads the end.
    drop(terminal);
    if setup.serves_execs {
        reap_serving_execs(setup, payload)
    }
    reap(setup, payload)
}

/// How often a session's pid 1 looks for ended commands while it waits for messages.
const SESSION_REAP_MS: i32 = 10;

/// pid 1 of a session after its first command started: spawns each further command
/// (EXEC) in a process group of its own, reports each command's end, kills a command's
/// group on KILL, and on CLOSE kills everything, reports the session's end, waits for
/// the artifacts' collection and exits. The supervisor's death (EOF) ends the cell.
fn serve_session(setup: ChildSetup<'_>, first: (u64, libc::pid_t)) -> ! {
    let mut commands = vec![first];
    loop {
        reap_commands(&setup, &mut commands);
        if let Served::Close = serve_next_message(&setup, &mut commands) {
            break;
        }
    }
    end_session(setup)
}

/// What a serving pid 1 was asked by the supervisor's last message.
enum Served {
    Continue,
    Close,
}

/// Waits up to [`SESSION_REAP_MS`] for a message from the supervisor and serves it: EXEC
/// spawns a further command, KILL signals a command's process group; CLOSE is returned
/// for the caller to decide; anything else has no meaning in a serving cell.
fn serve_next_message(setup: &ChildSetup<'_>, commands: &mut Vec<(u64, libc::pid_t)>) -> Served {
    let mut state = [libc::pollfd {
        fd: setup.sync.as_fd().as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    }];
    if sys::poll(&mut state, SESSION_REAP_MS).unwrap_or(0) == 0 {
        return Served::Continue;
    }
    match receive(setup) {
        Ok((ToCell::Exec(command), fds)) if !command.argv.is_empty() => {
            spawn_further(setup, &command, &fds, commands)
        }
        Ok((ToCell::Kill { id, signal }, _)) => {
            if let Some((_, group)) = commands.iter().find(|(c, _)| *c == id) {
                let _ = sys::kill(-group, signal);
            }
        }
        Ok((ToCell::Close, _)) => return Served::Close,
        Ok(_) | Err(_) => {}
    }
    Served::Continue
}

/// Spawns a further command (EXEC) and tracks it; a spawn that fails is reported as the
/// command's exec failure.
fn spawn_further(
    setup: &ChildSetup<'_>,
    command: &CellCommand,
    fds: &[OwnedFd],
    commands: &mut Vec<(u64, libc::pid_t)>,
) {
    match spawn_command(setup, command, fds, None) {
        Ok(pid) => commands.push((command.id, pid)),
        Err(err) => setup.sync.exec_failed(
            command.id,
            ExecFailure {
                status: 126,
                path: command.argv[0].clone(),
                reason: err.to_string(),
            },
        ),
    }
}

/// pid 1 of a container's cell once its payload (the container's init) started: runs
/// each further command (EXEC, `airlock oci exec`) in a process group of its own, with
/// everything pid 1 holds (its identity, no capabilities, Landlock, seccomp, the cell's
/// namespaces and cgroup: the same confinement as the payload, by inheritance), reports
/// their ends, signals a command's group on KILL, and when the payload ends kills every
/// process of the cell and reports the payload's end, as a container ends with its init.
fn reap_serving_execs(setup: ChildSetup<'_>, payload: libc::pid_t) -> ! {
    let mut commands: Vec<(u64, libc::pid_t)> = Vec::new();
    let wait_status = loop {
        if let Some(status) = reap_around_payload(&setup, payload, &mut commands) {
            break status;
        }
        // CLOSE has no meaning while the payload runs: the container ends with it.
        let _ = serve_next_message(&setup, &mut commands);
    };
    // Daemons, double forks and the further commands go with the payload.
    let _ = sys::kill(-1, libc::SIGKILL);
    while let Ok(Some(_)) = sys::wait_child(-1, false) {}
    report_end(setup, wait_status)
}

/// Reaps every child that ended: reports a further command's end, returns the payload's
/// wait status once it ended.
fn reap_around_payload(
    setup: &ChildSetup<'_>,
    payload: libc::pid_t,
    commands: &mut Vec<(u64, libc::pid_t)>,
) -> Option<i32> {
    while let Ok(Some(reaped)) = sys::wait_child(-1, true) {
        if reaped.pid == payload {
            return Some(reaped.status);
        }
        if let Some(at) = commands.iter().position(|(_, pid)| *pid == reaped.pid) {
            let (id, _) = commands.remove(at);
            setup.sync.command_ended(id, reaped.status);
        }
    }
    None
}

/// Reaps every child that ended (commands and orphans the cell inherited) and reports
/// the commands' ends.
fn reap_commands(setup: &ChildSetup<'_>, commands: &mut Vec<(u64, libc::pid_t)>) {
    while let Ok(Some(reaped)) = sys::wait_child(-1, true) {
        if let Some(at) = commands.iter().position(|(_, pid)| *pid == reaped.pid) {
            let (id, _) = commands.remove(at);
            setup.sync.command_ended(id, reaped.status);
        }
    }
}

/// CLOSE: every process of the cell goes (daemons included), then the session's end is
/// reported like a one-shot payload's.
fn end_session(setup: ChildSetup<'_>) -> ! {
    let _ = sys::kill(-1, libc::SIGKILL);
    while let Ok(Some(_)) = sys::wait_child(-1, false) {}
    report_end(setup, 0)
}

/// Tells the supervisor which setup step failed and why, and ends the cell.
fn fail(setup: &ChildSetup<'_>, stage: Stage) -> ! {
    let failure = LaunchFailure {
        stage: stage.name,
        message: stage.message,
        unavailable: stage.unavailable,
    };
    setup.sync.setup_failed(failure);
    sys::exit_now(125);
}

/// Everything up to seccomp. Returns the detaching of the host's root, which runs in the
/// background meanwhile, and the payload's terminal when the plan asks for one.
fn prepare(setup: &ChildSetup<'_>) -> Result<(sys::BackgroundDetach, Option<OwnedFd>), Stage> {
    let plan = setup.plan;
    if let Some(cpu) = setup.setup_cpu {
        // Ran before the supervisor could move us: leave its CPU to it.
        if sys::current_cpu() != Some(cpu) {
            let _ = sys::set_affinity(0, &sys::CpuSet::only(cpu));
        }
    }
    // If the supervisor dies from here on, so does the cell.
    sys::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong)
        .map_err(|e| Stage::errno("pdeathsig", e))?;
    // Work that needs no id map, done while the supervisor writes the maps: the child
    // already holds every capability of its new user namespace.
    // A pod cell is in the pod's network namespace already (pod_network.rs), which it
    // has no power over.
    if !matches!(plan.network, NetworkPlan::Pod { .. }) {
        sys::unshare(libc::CLONE_NEWNET).map_err(|e| Stage::errno("net_namespace", e))?;
        sys::loopback_up().map_err(|e| Stage::errno("loopback", e))?;
    }
    // A pod's uts namespace (joined at the clone) keeps the pod's host name, which the
    // cell has no power to change anyway.
    if !matches!(plan.network, NetworkPlan::Pod { uts: Some(_), .. }) {
        sys::sethostname(&plan.hostname).map_err(|e| Stage::errno("hostname", e))?;
    }
    // The supervisor may already be gone (the death signal only covers later deaths):
    // waiting for its go-ahead settles it - EOF means it died.
    let mut devices = match receive(setup)? {
        (ToCell::Mapped { devices }, fds) => rootfs::from_wire(devices, fds)?,
        _ => return Err(unexpected("the id maps")),
    };
    // Cloned now, with the maps written (the sources are read as the caller, whom the
    // cell's root maps to) and before the staging tmpfs over /tmp could hide one.
    // Such a cell received its cgroup view (cloned by `from_wire`) instead of devices.
    let mut sources = Vec::new();
    if setup.clones_in_cell {
        let cgroup_view = std::mem::replace(&mut devices, rootfs::prepare_devices(plan)?);
        sources = rootfs::prepare_sources(plan, None)?.0;
        sources.extend(cgroup_view);
    }
    sys::set_ids(plan.identity.uid, plan.identity.gid).map_err(|e| Stage::errno("identity", e))?;
    // Changing ids clears the parent-death signal: set it again, then make sure the
    // supervisor did not die in between (its end of the socket would have hung up).
    sys::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong)
        .map_err(|e| Stage::errno("pdeathsig", e))?;
    if setup.sync.hung_up() {
        sys::exit_now(125);
    }
    // Built while the supervisor prepares the release; nothing of the payload runs
    // before START.
    let mut kernel = RealKernel::default();
    let old_root_detach = rootfs::build_skeleton(&mut kernel, plan, devices)?;
    let (program, mounts) = match receive(setup)? {
        (ToCell::Release { program, mounts }, fds) => (
            program
                .into_iter()
                .map(protocol::unpack)
                .collect::<Vec<_>>(),
            rootfs::from_wire(mounts, fds)?,
        ),
        _ => return Err(unexpected("the release")),
    };
    sources.extend(mounts);
    let mounts = sources;
    // The supervisor has placed us in the cell cgroup; make it our cgroup root.
    sys::unshare(libc::CLONE_NEWCGROUP).map_err(|e| Stage::errno("cgroup_namespace", e))?;
    rootfs::finish(&mut kernel, plan, mounts)?;
    if let NetworkPlan::Allowlist { .. } = plan.network {
        pass_egress_listeners(&setup.sync, plan)?;
    }
    // A new session has no controlling terminal: no TIOCSTI into the caller's shell.
    sys::setsid().map_err(|e| Stage::errno("setsid", e))?;
    let terminal = if plan.terminal {
        Some(open_terminal(setup)?)
    } else {
        None
    };
    // pid 1's own stdio is the null device; a command gets its own with START. Fds 0-2
    // stay taken, so that descriptors received later never land on them.
    for target in 0..3 {
        sys::dup2(setup.null.as_raw_fd(), target).map_err(|e| Stage::errno("stdio", e))?;
    }
    set_rlimits(&setup.rlimits)?;
    drop_privileges(&plan.layout.securebits)?;
    sys::prctl(libc::PR_SET_NO_NEW_PRIVS, 1).map_err(|e| Stage::errno("no_new_privs", e))?;
    landlock_policy::restrict(&mut kernel, &plan.layout.landlock)?;
    sys::cloexec_from_3().map_err(|e| Stage::errno("close_fds", e))?;
    sys::install_seccomp_filter(&program).map_err(|e| Stage::errno("seccomp", e))?;
    Ok((old_root_detach, terminal))
}

/// Opens the payload's terminal in the cell's own devpts (mounted `newinstance` by the
/// rootfs, after the identity switch: the pair belongs to the cell identity) and hands
/// the master to the supervisor; returns the slave. Before Landlock and seccomp, which
/// then apply to the payload's use of it like to any other file it holds.
fn open_terminal(setup: &ChildSetup<'_>) -> Result<OwnedFd, Stage> {
    let (master, slave) = sys::open_pty_pair().map_err(|e| Stage::errno("terminal", e))?;
    sys::set_window_size(master.as_fd(), &setup.window).map_err(|e| Stage::errno("terminal", e))?;
    setup
        .sync
        .terminal(master.as_fd())
        .map_err(|e| Stage::errno("terminal", e))?;
    // Our copy of the master closes here: the supervisor's is the only one.
    Ok(slave)
}

/// Receives the next supervisor message (with its descriptors). EOF, the supervisor's
/// death, ends the cell quietly.
fn receive(setup: &ChildSetup<'_>) -> Result<(ToCell, Vec<OwnedFd>), Stage> {
    match setup.sync.recv() {
        Ok(Some(message)) => Ok(message),
        Ok(None) => sys::exit_now(125),
        Err(err) => Err(Stage::new("sync", err.to_string())),
    }
}

/// Blocks until the engine releases a held command (one byte: its audit record is
/// committed). EOF or an error means it never will: the cell ends without running
/// anything (the supervisor reports the run as never started).
fn wait_for_release(release: OwnedFd) {
    let mut byte = [0u8; 1];
    loop {
        match sys::read(release.as_fd(), &mut byte) {
            Ok(1) => return,
            Err(err) if err.kind() == std::io::ErrorKind::Interrupted => continue,
            Ok(_) | Err(_) => sys::exit_now(0),
        }
    }
}

fn unexpected(waiting_for: &str) -> Stage {
    Stage::new(
        "sync",
        format!("another message than {waiting_for} arrived"),
    )
}

/// Blocks until START arrives with the command and its stdio descriptors; a held START
/// (see [`ToCell::StartHeld`]) also until its release.
fn wait_for_start(setup: &ChildSetup<'_>) -> Result<(CellCommand, Vec<OwnedFd>), Stage> {
    match receive(setup)? {
        (ToCell::Start(command), fds) if !command.argv.is_empty() => Ok((command, fds)),
        (ToCell::StartHeld(command), mut fds) if !command.argv.is_empty() => {
            let release = fds
                .pop()
                .ok_or_else(|| unexpected("a release descriptor"))?;
            wait_for_release(release);
            Ok((command, fds))
        }
        (ToCell::Start(_) | ToCell::StartHeld(_), _) => {
            Err(Stage::new("sync", "START without a command".into()))
        }
        // Closed before any command: the cell ends without running anything.
        (ToCell::Close, _) => sys::exit_now(0),
        _ => Err(unexpected("START")),
    }
}

/// Binds the proxies, the resolver's socket and the transparent listeners inside the
/// cell's network namespace (still privileged in it: port 53 and the allowlisted ports
/// below 1024 need that) and hands them to the supervisor.
fn pass_egress_listeners(sync: &Pid1Channel, plan: &CellPlan) -> Result<(), Stage> {
    let failed = |addr: &dyn std::fmt::Display, e: std::io::Error| {
        Stage::new("egress_listeners", format!("{addr}: {e}"))
    };
    let bind = |addr: std::net::SocketAddrV4| {
        std::net::TcpListener::bind(addr).map_err(|e| failed(&addr, e))
    };
    let localhost = |port| std::net::SocketAddrV4::new(std::net::Ipv4Addr::LOCALHOST, port);
    let wire = protocol::ListenersWire::for_plan(plan);
    let http = bind(localhost(HTTP_PROXY_PORT))?;
    let socks = bind(localhost(SOCKS_PROXY_PORT))?;
    let dns = std::net::UdpSocket::bind(wire.dns).map_err(|e| failed(&wire.dns, e))?;
    let transparent = wire
        .transparent
        .iter()
        .map(|addr| bind(*addr))
        .collect::<Result<Vec<_>, Stage>>()?;
    let fds: Vec<RawFd> = [http.as_raw_fd(), socks.as_raw_fd(), dns.as_raw_fd()]
        .into_iter()
        .chain(transparent.iter().map(|l| l.as_raw_fd()))
        .collect();
    sync.listeners(wire, &fds)
        .map_err(|e| Stage::errno("egress_listeners", e))
    // Our copies close here; the supervisor's proxy owns the sockets.
}

fn set_rlimits(rlimits: &[Rlimit]) -> Result<(), Stage> {
    for rlimit in rlimits {
        sys::set_rlimit(resource_limit(rlimit)).map_err(|e| {
            Stage::new("rlimits", format!("{}: {e}", rlimit.resource.kernel_name()))
        })?;
    }
    Ok(())
}

/// The kernel's form of a planned rlimit: soft and hard alike, but for CPU time, whose
/// hard limit is a second later (SIGXCPU at the soft one ends a process that does not
/// handle it; one that does gets SIGKILL at the hard one).
fn resource_limit(rlimit: &Rlimit) -> sys::ResourceLimit {
    let resource = match rlimit.resource {
        RlimitResource::Core => libc::RLIMIT_CORE,
        RlimitResource::Nofile => libc::RLIMIT_NOFILE,
        RlimitResource::Fsize => libc::RLIMIT_FSIZE,
        RlimitResource::Nproc => libc::RLIMIT_NPROC,
        RlimitResource::As => libc::RLIMIT_AS,
        RlimitResource::Cpu => libc::RLIMIT_CPU,
    };
    let hard = match rlimit.resource {
        RlimitResource::Cpu => rlimit.value.saturating_add(1),
        RlimitResource::Core
        | RlimitResource::Nofile
        | RlimitResource::Fsize
        | RlimitResource::Nproc
        | RlimitResource::As => rlimit.value,
    };
    sys::ResourceLimit {
        resource,
        soft: rlimit.value,
        hard,
    }
}

/// Empties every capability set and locks the plan's securebits so that no later execve
/// (even of a file with capabilities, or as uid 0) can regain any.
fn drop_privileges(securebits: &[Securebit]) -> Result<(), Stage> {
    let bits = securebits.iter().fold(0, |all, bit| all | bit.bit());
    sys::prctl(libc::PR_SET_SECUREBITS, bits as libc::c_ulong)
        .map_err(|e| Stage::errno("securebits", e))?;
    sys::prctl3(
        libc::PR_CAP_AMBIENT,
        libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong,
        0,
    )
    .map_err(|e| Stage::errno("ambient_caps", e))?;
    for cap in 0..=63 {
        match sys::prctl(libc::PR_CAPBSET_DROP, cap) {
            Ok(_) => {}
            // EINVAL: beyond the last capability this kernel knows.
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => break,
            Err(e) => return Err(Stage::new("bounding_caps", format!("cap {cap}: {e}"))),
        }
    }
    sys::clear_capability_sets().map_err(|e| Stage::errno("capabilities", e))
}

fn path_var(env: &[CString]) -> Vec<PathBuf> {
    env.iter()
        .find_map(|e| e.as_bytes().strip_prefix(b"PATH="))
        .map(|p| {
            p.split(|b| *b == b':')
                .map(|d| PathBuf::from(std::ffi::OsStr::from_bytes(d)))
                .collect()
        })
        .unwrap_or_default()
}

/// Resolves argv[0] against the *command's* PATH (execvp would use the supervisor's).
fn resolve_command(command: &str, env: &[CString]) -> Option<PathBuf> {
    if command.contains('/') {
        return Some(PathBuf::from(command));
    }
    path_var(env)
        .into_iter()
        .map(|dir| dir.join(command))
        .find(|candidate| {
            std::fs::metadata(candidate)
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
}

fn cstrings(items: &[String]) -> Vec<CString> {
    items
        .iter()
        .map(|a| CString::new(a.as_bytes()).unwrap_or_default())
        .collect()
}

/// Spawns a child that only execs `command` (resolved on its PATH) with `stdio` (stdin,
/// stdout, stderr) or the terminal, and tells the supervisor whether the exec happened:
/// [`Pid1Channel::command_started`], or the [`ExecFailure`] (the child's exit status is
/// then 126 or 127).
fn spawn_command(
    setup: &ChildSetup<'_>,
    command: &CellCommand,
    stdio: &[OwnedFd],
    terminal: Option<&OwnedFd>,
) -> std::io::Result<libc::pid_t> {
    let argv = cstrings(&command.argv);
    let env = cstrings(&command.env);
    let path = resolve_command(&command.argv[0], &env)
        .map(|p| CString::new(p.as_os_str().as_bytes()).unwrap_or_default());
    // Its own terminal: the master is the supervisor's before the command runs, the
    // slave closes here once the command holds it.
    let own_terminal = match command.stdio {
        CommandStdio::NewTerminal => Some(command_terminal(setup, command.id)?),
        CommandStdio::Passed | CommandStdio::Terminal => None,
    };
    let terminal = own_terminal.as_ref().or(terminal);
    let io = match (command.stdio, stdio) {
        (CommandStdio::Terminal | CommandStdio::NewTerminal, _) => sys::ExecStdio::Terminal(
            terminal
                .ok_or_else(|| std::io::Error::other("the plan has no terminal"))?
                .as_fd(),
        ),
        (CommandStdio::Passed, [stdin, stdout, stderr]) => {
            sys::ExecStdio::Fds([stdin.as_fd(), stdout.as_fd(), stderr.as_fd()])
        }
        (CommandStdio::Passed, _) => {
            return Err(std::io::Error::other(
                "START without three stdio descriptors",
            ))
        }
    };
    let rlimits: Vec<sys::ResourceLimit> =
        setup.payload_rlimits.iter().map(resource_limit).collect();
    let spawned = sys::spawn_exec(path.as_deref(), &argv, &env, io, &rlimits)?;
    let failure = match (&path, spawned.exec_error) {
        (None, _) => Some(ExecFailure {
            status: 127,
            path: command.argv[0].clone(),
            reason: "command not found".into(),
        }),
        (Some(path), Some(err)) => Some(exec_failure(path, &err)),
        (Some(_), None) => None,
    };
    match failure {
        Some(failure) => setup.sync.exec_failed(command.id, failure),
        None => setup.sync.command_started(command.id),
    }
    Ok(spawned.pid)
}

/// A new pseudo-terminal of the cell's devpts for command `id`: the master goes to the
/// supervisor, the slave is returned. Opened by pid 1 under its own confinement (Landlock
/// grants /dev/pts, seccomp refuses only TIOCSTI and TIOCLINUX among ioctls), so the
/// pair belongs to the cell's identity like the payload's terminal.
fn command_terminal(setup: &ChildSetup<'_>, id: u64) -> std::io::Result<OwnedFd> {
    let (master, slave) = sys::open_pty_pair()?;
    sys::set_window_size(master.as_fd(), &crate::terminal::DEFAULT_WINDOW)?;
    setup.sync.command_terminal(id, master.as_fd())?;
    Ok(slave)
}

/// Why the payload's exec failed. The kernel answers EACCES for a directory too;
/// "Permission denied" would send the user looking for a permission problem.
fn exec_failure(path: &CString, err: &std::io::Error) -> ExecFailure {
    let status = sys::exec_failure_status(err.raw_os_error().unwrap_or(0));
    let is_dir =
        std::fs::metadata(std::ffi::OsStr::from_bytes(path.as_bytes())).is_ok_and(|m| m.is_dir());
    ExecFailure {
        status,
        path: path.to_string_lossy().into_owned(),
        reason: if is_dir {
            "is a directory, not a command".into()
        } else {
            err.to_string()
        },
    }
}

/// pid 1 after the payload started: reap everything, and when the payload ends, kill what
/// it left behind, report, wait for artifact collection and exit (which tears the pid
/// namespace down).
fn reap(setup: ChildSetup<'_>, payload: libc::pid_t) -> ! {
    let wait_status = loop {
        match sys::wait_child(-1, false) {
            Ok(Some(reaped)) if reaped.pid == payload => break reaped.status,
            Ok(_) => continue,
            Err(_) => break 0,
        }
    };
    // Daemons, double forks and stopped processes go with the payload.
    let _ = sys::kill(-1, libc::SIGKILL);
    while let Ok(Some(_)) = sys::wait_child(-1, false) {}
    report_end(setup, wait_status)
}

/// Reports the payload's end (with what pid 1 sees of the cell's mounts), waits for the
/// artifacts' collection and exits, which tears the pid namespace down.
fn report_end(setup: ChildSetup<'_>, wait_status: i32) -> ! {
    let ended = PayloadEnded {
        wait_status,
        full_mounts: rootfs::full_writable_mounts(setup.plan),
        shm_full: rootfs::shm_is_full(),
    };
    setup.sync.payload_ended(ended);
    if setup.waits_for_collection {
        // The supervisor reads artifacts and evidence through /proc/<pid>/root while we
        // are alive:
        // COLLECTED (or its death) lets us go.
        let _ = setup.sync.recv();
    }
    sys::exit_now(0)
}
