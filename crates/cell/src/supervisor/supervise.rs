//! The poll loop of a released cell: its messages, its command's output, stdin relay and
//! terminal, pid 1's pidfd, the deadline and, for a serving cell, the engine's control
//! socket.

use super::ceilings::CellCeilings;
use super::classify::{self, Observed};
use super::deadline::{poll_timeout, Deadline, Step};
use super::{CommandIo, EgressSession};
use crate::artifacts::{self, ArtifactRequest};
use crate::control::{SupervisorControl, ToEngine, ToSupervisor};
use crate::error::CellError;
use crate::exec_door::{CellSide, Door};
use crate::output::{OutputCapture, Stream};
use crate::protocol::{self, CellChannel, CellCommand, FromCell};
use crate::report::ExitInfo;
use crate::stdin_relay::StdinRelay;
use crate::sys;
use crate::terminal::{CallerTerminal, WindowFollower, WINDOW_FOLLOW_INTERVAL_MS};
use airlock_contract::CellPlan;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::time::{Duration, Instant};

/// The fixed entries of the supervision loop's poll; a container's door's follow.
const DOOR_ENTRIES: usize = 10;
/// Longest we wait for the cell's pipes to close after its pid 1 is gone.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(2);
/// Bytes read from the payload's stdout or stderr at a time (a full pipe).
const OUTPUT_CHUNK: usize = 64 * 1024;

/// Where a command's output goes as it arrives: descriptors the caller passed (the CLI
/// passes copies of its stdout and stderr). Nothing is written to this process's own
/// stdout or stderr.
#[derive(Default)]
pub struct Sinks {
    pub stdout: Option<OwnedFd>,
    pub stderr: Option<OwnedFd>,
}

impl Sinks {
    /// Writes all of `data` to the stream's sink; a sink that fails (the reader went
    /// away) is dropped, the output is still counted and captured.
    fn write(&mut self, stream: Stream, data: &[u8]) {
        let slot = match stream {
            Stream::Stdout => &mut self.stdout,
            Stream::Stderr => &mut self.stderr,
        };
        if let Some(fd) = slot.as_ref() {
            if write_all(fd.as_fd(), data).is_err() {
                *slot = None;
            }
        }
    }
}

fn write_all(fd: BorrowedFd<'_>, mut data: &[u8]) -> std::io::Result<()> {
    while !data.is_empty() {
        match sys::write(fd, data) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => data = &data[n..],
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Reads one chunk of a command's stream into its capture and sink; closes the stream at
/// EOF (or an error: the cell's end is gone).
pub fn pump_stream(
    slot: &mut Option<OwnedFd>,
    stream: Stream,
    output: &mut OutputCapture,
    sinks: &mut Sinks,
    buf: &mut Vec<u8>,
) -> bool {
    if buf.is_empty() {
        buf.resize(OUTPUT_CHUNK, 0);
    }
    let Some(fd) = slot.as_ref() else {
        return false;
    };
    match sys::read(fd.as_fd(), buf) {
        Ok(0) | Err(_) => {
            *slot = None;
            false
        }
        Ok(n) => {
            forward_chunk(output, sinks, stream, &buf[..n]);
            true
        }
    }
}

/// How long a command's pipes are still read after its process ended (what a background
/// child holding them writes later is not waited for).
pub const DRAIN_AFTER_END: Duration = Duration::from_millis(200);

/// A session command's output pipes, its capture and its sinks, borrowed from the
/// command (native or gVisor) for one pump.
pub struct CommandOutput<'a> {
    pub stdout: &'a mut Option<OwnedFd>,
    pub stderr: &'a mut Option<OwnedFd>,
    pub capture: &'a mut OutputCapture,
    pub sinks: &'a mut Sinks,
}

impl CommandOutput<'_> {
    /// Reads whichever of stdout and stderr `ready` (their poll entries) says can be read.
    pub fn pump(&mut self, ready: [&libc::pollfd; 2], buf: &mut Vec<u8>) {
        if readable(ready[0]) {
            pump_stream(self.stdout, Stream::Stdout, self.capture, self.sinks, buf);
        }
        if readable(ready[1]) {
            pump_stream(self.stderr, Stream::Stderr, self.capture, self.sinks, buf);
        }
    }

    /// After the command's process ended: what is left in its pipes, bounded in time.
    pub fn drain(&mut self, buf: &mut Vec<u8>) {
        let until = Instant::now() + DRAIN_AFTER_END;
        while self.stdout.is_some() || self.stderr.is_some() {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            let mut fds = [poll_in(raw(self.stdout)), poll_in(raw(self.stderr))];
            if sys::poll(&mut fds, left.as_millis() as i32).unwrap_or(0) > 0 {
                self.pump([&fds[0], &fds[1]], buf);
            }
        }
    }
}

/// Counts `chunk` against the command's `output_bytes` and forwards what the budget
/// allows.
pub fn forward_chunk(output: &mut OutputCapture, sinks: &mut Sinks, stream: Stream, chunk: &[u8]) {
    let is_stdout = matches!(stream, Stream::Stdout);
    let forward = output.accept(stream, chunk);
    if !forward.is_empty() {
        let stream = if is_stdout {
            Stream::Stdout
        } else {
            Stream::Stderr
        };
        sinks.write(stream, forward);
    }
}

/// How waiting for a cell to park ended.
pub enum Parking {
    /// The cell is ready for its command.
    Parked,
    /// The cell ended (its setup failed, or it was killed) before it parked.
    Gone,
    /// The engine closed the control socket (or asked to close) first.
    Closed(&'static str),
}

pub struct Supervision<'a> {
    pub plan: &'a CellPlan,
    /// The host uid and gid the cell identity maps to (its commands' pipes go to them).
    pub host: crate::host_identity::HostIdentity,
    pub pid: libc::pid_t,
    pub pidfd: OwnedFd,
    /// `None` once the cell closed its end (pid 1 is exiting), like the pipes below: a
    /// closed socket would make every poll return at once.
    pub sync: Option<CellChannel>,
    pub ceilings: CellCeilings,
    pub stdout: Option<OwnedFd>,
    pub stderr: Option<OwnedFd>,
    pub sinks: Sinks,
    pub output: OutputCapture,
    pub observed: Observed,
    pub deadline: Deadline,
    /// `None` unless the caller's stdin is relayed; taken when pid 1 is gone.
    pub stdin_relay: Option<StdinRelay>,
    /// The caller's stdin, waiting for the payload's terminal (then relayed into it).
    pub terminal_input: Option<OwnedFd>,
    /// The master of the payload's terminal, once the cell sent it; `None` again at its
    /// end (every holder of the slave is gone).
    pub terminal: Option<OwnedFd>,
    /// The caller's terminal, raw until the run ends (restored when this is dropped).
    pub caller_terminal: Option<CallerTerminal>,
    /// A caller's terminal in another process (a serving cell's): its window size is
    /// followed, see [`WindowFollower`].
    pub window: Option<WindowFollower>,
    /// A descriptor of the caller's whose hang-up destroys the cell (see
    /// [`crate::control::CommandSpec::watch_caller`]); `None` once it hung up.
    pub caller: Option<OwnedFd>,
    /// What the caller asked to collect, if the plan declares outputs.
    pub artifacts: Option<ArtifactRequest>,
    /// The cell said it is parked at START.
    pub parked: bool,
    /// Where a suspected escape's writable paths go (crate::evidence), if anywhere.
    pub on_suspected_escape: Option<crate::evidence::OnSuspectedEscape>,
    /// pid 1 waits after the payload's end until told the collection is done (it was
    /// built with artifacts or evidence to collect).
    pub pid1_waits_for_collection: bool,
    /// A container's further commands and console socket (crate::exec_door).
    pub door: Option<Door>,
    /// A one-shot `airlock run`'s interrupts, while its cell lives (see
    /// [`super::interrupts`]).
    pub interrupts: Option<super::interrupts::Interrupts>,
}

/// A `poll` entry waiting for input on `fd` (negative fds are ignored by poll).
pub fn poll_in(fd: i32) -> libc::pollfd {
    libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    }
}

/// A `poll` entry waiting for room to write on `fd` (errors and hang-ups are always
/// reported).
pub fn poll_out(fd: i32) -> libc::pollfd {
    libc::pollfd {
        fd,
        events: libc::POLLOUT,
        revents: 0,
    }
}

/// The descriptor to poll for `fd`: -1 (ignored by poll) once it is closed.
pub fn raw(fd: &Option<OwnedFd>) -> i32 {
    fd.as_ref().map_or(-1, |f| f.as_raw_fd())
}

pub fn readable(entry: &libc::pollfd) -> bool {
    entry.revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0
}

impl Supervision<'_> {
    fn sync_raw(&self) -> i32 {
        self.sync.as_ref().map_or(-1, |s| s.as_fd().as_raw_fd())
    }

    /// Sends START with `command` and its descriptors; the command's deadline and output
    /// budget run from here. A failed send means the cell already ended; the supervision
    /// loop reads why.
    pub fn start(
        &mut self,
        command: CellCommand,
        io: CommandIo,
        wall_time_ms: u64,
        output_bytes: u64,
    ) {
        if let Some(sync) = &self.sync {
            let ends: Vec<BorrowedFd<'_>> = io.cell_ends.iter().map(|f| f.as_fd()).collect();
            let _ = match &io.release {
                Some(release) => sync.start_held(command, &ends, release.as_fd()),
                None => sync.start(command, &ends),
            };
        }
        // The cell's ends close here, or the pipes would never report EOF.
        drop(io.cell_ends);
        self.stdout = io.stdout;
        self.stderr = io.stderr;
        self.stdin_relay = io.stdin_relay;
        if self.caller_terminal.is_none() {
            self.window =
                (io.terminal_input.as_ref()).and_then(|fd| WindowFollower::of(fd.as_fd()));
        }
        self.terminal_input = io.terminal_input;
        self.caller = io.caller;
        self.sinks = io.sinks;
        self.output = OutputCapture::new(output_bytes);
        self.deadline = Deadline::from_start(Instant::now(), wall_time_ms);
        self.relay_into_terminal();
        self.follow_window();
    }

    /// Copies a changed caller's window size to the payload's terminal (see
    /// [`WindowFollower`]).
    fn follow_window(&mut self) {
        if let (Some(window), Some(master)) = (self.window.as_mut(), self.terminal.as_ref()) {
            window.follow(master.as_fd());
        }
    }

    /// How long the supervision loop may sleep: until the deadline's next step, or the
    /// next look at a followed window.
    fn loop_timeout(&self) -> i32 {
        let timeout = poll_timeout(self.deadline.next_wake());
        match (&self.window, timeout) {
            (None, timeout) => timeout,
            (Some(_), -1) => WINDOW_FOLLOW_INTERVAL_MS,
            (Some(_), timeout) => timeout.min(WINDOW_FOLLOW_INTERVAL_MS),
        }
    }

    /// Until the cell parks at START (or ends, or the engine goes away): its setup
    /// messages (a failure, the egress listeners, the terminal).
    pub fn wait_parked(
        &mut self,
        egress: &mut Option<&mut dyn EgressSession>,
        control: &SupervisorControl,
    ) -> Result<Parking, CellError> {
        loop {
            let mut fds = [
                poll_in(self.sync_raw()),
                poll_in(self.pidfd.as_raw_fd()),
                // Only its hang-up matters here: a command is read once the cell parked.
                libc::pollfd {
                    fd: control.as_fd().as_raw_fd(),
                    events: 0,
                    revents: 0,
                },
            ];
            sys::poll(&mut fds, -1).map_err(|e| CellError::io("poll", e))?;
            if readable(&fds[0]) {
                self.read_message(egress)?;
                if self.parked {
                    return Ok(Parking::Parked);
                }
            }
            if fds[1].revents != 0 {
                self.reap_pid1();
                return Ok(Parking::Gone);
            }
            if fds[2].revents != 0 {
                return Ok(Parking::Closed("the engine went away"));
            }
        }
    }

    /// Supervises the running command until pid 1 is gone. With `control`, the engine
    /// may close the cell meanwhile (or go away, which destroys it at once).
    pub fn run(
        &mut self,
        egress: &mut Option<&mut dyn EgressSession>,
        mut control: Option<&SupervisorControl>,
        command: Option<u64>,
    ) -> Result<(), CellError> {
        // What the engine has been told of its command: the exec, then the exit.
        let mut announced = Announced::default();
        // The output buffer is allocated on first output: most tool calls print little,
        // and every fresh page costs a fault.
        let mut buf = Vec::new();
        loop {
            let timeout = self.loop_timeout();
            let relay = self.stdin_relay.as_ref().map(StdinRelay::interest);
            let mut fds = vec![
                poll_in(raw(&self.stdout)),
                poll_in(raw(&self.stderr)),
                poll_in(self.sync_raw()),
                poll_in(self.pidfd.as_raw_fd()),
                poll_in(relay.as_ref().map_or(-1, |r| r.source)),
                poll_out(relay.as_ref().map_or(-1, |r| r.sink)),
                poll_in(raw(&self.terminal)),
                poll_in(self.signals_raw()),
                poll_in(control.map_or(-1, |c| c.as_fd().as_raw_fd())),
                // Only its hang-up (what a client sends meanwhile is not read here).
                libc::pollfd {
                    fd: raw(&self.caller),
                    events: libc::POLLRDHUP,
                    revents: 0,
                },
            ];
            // A container's door: its listener and clients, after the fixed entries.
            fds.extend(
                self.door
                    .as_ref()
                    .map(Door::poll_entries)
                    .unwrap_or_default(),
            );
            sys::poll(&mut fds, timeout).map_err(|e| CellError::io("poll", e))?;
            self.serve_door(&fds[DOOR_ENTRIES..]);
            if readable(&fds[0]) {
                self.pump(Stream::Stdout, &mut buf);
            }
            if readable(&fds[1]) {
                self.pump(Stream::Stderr, &mut buf);
            }
            if readable(&fds[2]) {
                self.read_message(egress)?;
                if let (Some(control), Some(id)) = (control, command) {
                    announced.update(self, control, id);
                }
            }
            if let Some(relay) = self.stdin_relay.as_mut() {
                if readable(&fds[4]) {
                    relay.on_source_ready();
                }
                if fds[5].revents != 0 {
                    relay.on_sink_ready();
                }
            }
            if readable(&fds[6]) {
                self.pump_terminal(&mut buf);
            }
            if fds[7].revents != 0 {
                self.on_signals();
            }
            if readable(&fds[8]) {
                if let Some(why) = control.and_then(control_ends_cell) {
                    self.destroy(why);
                    control = None;
                }
            }
            if fds[9].revents != 0 {
                self.caller = None;
                self.destroy("the caller went away");
            }
            self.follow_window();
            if readable(&fds[3]) {
                // pid 1 is gone, and with it every process of the pid namespace. What it
                // said before it went is still queued (its end is closed: no read
                // blocks).
                while self.sync.is_some() {
                    self.read_message(egress)?;
                }
                self.reap_pid1();
                // An interrupt that came as the cell ended: the run is recorded as it
                // ended, and the caller still ends as the signal would have ended it.
                if let Some(signal) = self.interrupts.as_ref().and_then(|i| i.next()) {
                    self.observed.interrupted_by.get_or_insert(signal);
                }
                // A container's further commands died with the cell: their clients
                // learn it now (EOF), not when this process exits.
                self.door = None;
                self.drain(&mut buf);
                // Restored before anything else is printed.
                drop(self.caller_terminal.take());
                return Ok(());
            }
            self.enforce_deadline();
        }
    }

    /// A container's door after a poll: new clients, their commands and signals.
    fn serve_door(&mut self, entries: &[libc::pollfd]) {
        if let Some(mut door) = self.door.take() {
            let cell = CellSide {
                plan: self.plan,
                host: self.host,
                sync: self.sync.as_ref(),
            };
            door.on_ready(entries, &cell);
            self.door = Some(door);
        }
    }

    /// Until the payload's terminal went to the container's console socket (a plan with
    /// a terminal and a door with a console): the runtime's caller waits for it before it
    /// starts the container, so it is sent before the container is reported created. The
    /// cell's setup messages before it (the egress listeners) are handled on the way.
    pub fn await_console(
        &mut self,
        egress: &mut Option<&mut dyn EgressSession>,
    ) -> Result<(), CellError> {
        let wanted = self.plan.terminal && self.door.as_ref().is_some_and(Door::has_console);
        while wanted && !self.door.as_ref().is_some_and(Door::console_sent) {
            if let Some(failure) = &self.observed.launch_failure {
                return Err(CellError::Protocol {
                    message: format!("{}: {}", failure.stage, failure.message),
                });
            }
            let mut fds = [poll_in(self.sync_raw()), poll_in(self.pidfd.as_raw_fd())];
            sys::poll(&mut fds, -1).map_err(|e| CellError::io("poll", e))?;
            if readable(&fds[0]) {
                self.read_message(egress)?;
            } else if fds[1].revents != 0 || self.sync.is_none() {
                return Err(CellError::Protocol {
                    message: "the cell ended before its terminal was sent to the console \
                              socket"
                        .into(),
                });
            }
        }
        Ok(())
    }

    /// How the payload ended, once pid 1 reported it.
    fn reported_exit(&self) -> Option<ExitInfo> {
        self.observed
            .ended
            .as_ref()
            .map(|_| classify::payload_exit(&self.observed))
    }

    /// pid 1 is gone: its status and CPU time, and the end of the stdin relay.
    pub fn reap_pid1(&mut self) {
        self.observed.ended_at = Some(Instant::now());
        self.observed.stdin = self.stdin_relay.take().map(StdinRelay::finish);
        if let Ok(Some(reaped)) = sys::wait_child(self.pid, false) {
            self.observed.pid1_status = Some(reaped.status);
            self.observed.rusage = Some(reaped.usage);
        }
    }

    /// The signalfd the loop polls: the caller's terminal's, or the interrupts' (-1 for
    /// none).
    fn signals_raw(&self) -> i32 {
        let terminal = self
            .caller_terminal
            .as_ref()
            .and_then(CallerTerminal::signals);
        let interrupts = self.interrupts.as_ref().map(|i| i.fd());
        terminal.or(interrupts).map_or(-1, |fd| fd.as_raw_fd())
    }

    /// Signals taken meanwhile: the caller's terminal acts on its own (a fatal one
    /// restores the terminal and ends the process); an interrupt destroys the cell, whose
    /// end is then recorded as any other's.
    fn on_signals(&mut self) {
        if let Some(caller) = self.caller_terminal.as_mut() {
            caller.on_signals(self.terminal.as_ref().map(|t| t.as_fd()));
        } else if let Some(signal) = self.interrupts.as_ref().and_then(|i| i.next()) {
            self.observed.interrupted_by.get_or_insert(signal);
            self.destroy(&format!(
                "airlock was sent {}",
                super::interrupts::name(signal)
            ));
        }
    }

    /// Destroys the cell at once: SIGKILL to pid 1 (which takes the pid namespace) and
    /// to the cgroup. `why` explains the run's end unless its command already ended.
    pub fn destroy(&mut self, why: &str) {
        if self.observed.ended.is_none() {
            self.observed.destroyed = Some(why.to_string());
        }
        // Every process of the cell is in pid 1's namespace, which the kernel kills with
        // pid 1; the teardown's wait for an empty cgroup kills anything left. No freeze
        // here: a supervisor killed between a v1 freeze and its thaw (its owner died, the
        // reason this runs) would leave the cell frozen and unkillable.
        let _ = sys::pidfd_send_signal(self.pidfd.as_fd(), libc::SIGKILL);
    }

    fn enforce_deadline(&mut self) {
        let (deadline, step) = self.deadline.advance(Instant::now());
        self.deadline = deadline;
        match step {
            None => {}
            Some(Step::Terminate) => {
                self.observed.deadline_fired = true;
                // pid 1 ignores SIGTERM from outside its namespace; the payload and its
                // children get the chance to finish cleanly.
                self.ceilings.signal_all(libc::SIGTERM);
            }
            Some(Step::KillAllButPid1) => {
                // pid 1 reaps the payload (so its status and CPU time are accounted) and
                // reports before it goes too.
                let _ = self.ceilings.kill_all_except(self.pid);
            }
            Some(Step::KillPid1) => {
                // Killing pid 1 kills the whole pid namespace; the cgroup kill catches
                // anything in between.
                let _ = sys::pidfd_send_signal(self.pidfd.as_fd(), libc::SIGKILL);
                let _ = self.ceilings.kill_all();
            }
        }
    }

    /// Reads one chunk of a stream; closes it at EOF.
    fn pump(&mut self, stream: Stream, buf: &mut Vec<u8>) -> bool {
        let slot = match stream {
            Stream::Stdout => &mut self.stdout,
            Stream::Stderr => &mut self.stderr,
        };
        pump_stream(slot, stream, &mut self.output, &mut self.sinks, buf)
    }

    fn forward(&mut self, stream: Stream, chunk: &[u8]) {
        forward_chunk(&mut self.output, &mut self.sinks, stream, chunk);
    }

    /// Reads one chunk of the payload's terminal: its stdout and stderr, merged as a
    /// terminal merges them. EIO (the last holder of the slave closed it) is its end.
    fn pump_terminal(&mut self, buf: &mut Vec<u8>) {
        if buf.is_empty() {
            buf.resize(OUTPUT_CHUNK, 0);
        }
        let Some(master) = self.terminal.as_ref() else {
            return;
        };
        match sys::read(master.as_fd(), buf) {
            Err(err) if err.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(err) if err.kind() == std::io::ErrorKind::Interrupted => {}
            Ok(0) | Err(_) => self.terminal = None,
            Ok(n) => self.forward(Stream::Stdout, &buf[..n]),
        }
    }

    /// Once both the payload's terminal and the caller's stdin are here: relay the one
    /// into the other. Without a relay the payload's terminal gets no input; its output
    /// still counts.
    fn relay_into_terminal(&mut self) {
        if let Some(master) = &self.terminal {
            if let Some(source) = self.terminal_input.take() {
                self.stdin_relay = StdinRelay::into_terminal(source, master).ok();
            }
        }
    }

    /// After pid 1 exited: read what is left in the pipes, bounded in time.
    fn drain(&mut self, buf: &mut Vec<u8>) {
        let until = Instant::now() + DRAIN_TIMEOUT;
        while self.stdout.is_some() || self.stderr.is_some() || self.terminal.is_some() {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            let mut fds = [
                poll_in(raw(&self.stdout)),
                poll_in(raw(&self.stderr)),
                poll_in(raw(&self.terminal)),
            ];
            if sys::poll(&mut fds, left.as_millis() as i32).unwrap_or(0) == 0 {
                continue;
            }
            if fds[0].revents != 0 {
                self.pump(Stream::Stdout, buf);
            }
            if fds[1].revents != 0 {
                self.pump(Stream::Stderr, buf);
            }
            if fds[2].revents != 0 {
                self.pump_terminal(buf);
            }
        }
    }

    /// Once the payload runs, the cell's mounts are final: opens the ones that hold
    /// declared outputs, so they can be collected even if pid 1 dies with the payload.
    fn hold_output_mounts(&mut self) {
        if self.artifacts.is_some() {
            self.observed.output_mounts = artifacts::OutputMounts::open(self.pid, self.plan);
        }
        if self.observed.writable_mounts.is_empty() {
            // Not held while parked (a cold run: START was sent before the cell parked):
            // only reachable while pid 1 lives.
            self.hold_writable_mounts();
        }
    }

    /// Opens the writable paths a suspected escape's evidence is copied from, through
    /// `/proc/<pid 1>/root`: pid 1 must be alive, its mounts final. A parked cell's are
    /// (it built its root before parking, and the payload cannot mount), and its pid 1
    /// waits for START: held then, nothing can race. Read at the payload's
    /// `CommandStarted`, pid 1 may already be gone with a payload that ended quickly
    /// while the supervisor waited for a CPU (a zombie's root cannot be opened), and
    /// the evidence with it.
    pub fn hold_writable_mounts(&mut self) {
        if self.on_suspected_escape.is_some() {
            self.observed.writable_mounts =
                crate::evidence::WritableMounts::open(self.pid, self.plan);
        }
    }

    fn read_message(
        &mut self,
        egress: &mut Option<&mut dyn EgressSession>,
    ) -> Result<(), CellError> {
        // EOF or a broken socket leaves `sync` at None: the cell is gone.
        let Some(sync) = self.sync.take() else {
            return Ok(());
        };
        let (message, mut fds) = match sync.recv() {
            Ok(Some(message)) => message,
            Ok(None) => return Ok(()),
            Err(err) => {
                // Not the protocol: the cell is not airlock's any more.
                self.observed.launch_failure = Some(protocol::LaunchFailure {
                    stage: "sync".into(),
                    message: err.to_string(),
                    unavailable: false,
                });
                self.destroy("the cell broke the protocol");
                return Ok(());
            }
        };
        self.sync = Some(sync);
        if let (Some(door), Some(id)) = (self.door.as_mut(), further_command(&message)) {
            if door.owns(id) {
                door.on_cell(message, fds);
                return Ok(());
            }
        }
        match message {
            FromCell::Failed(failure) => self.observed.launch_failure = Some(failure),
            FromCell::Listeners(announced) => self.start_egress(&announced, fds, egress),
            FromCell::Terminal => {
                self.terminal = self.payload_terminal(fds.pop());
                self.relay_into_terminal();
            }
            // Only the door's commands have terminals of their own.
            FromCell::CommandTerminal { .. } => {}
            FromCell::Parked => self.parked = true,
            FromCell::CommandStarted { .. } => {
                self.observed.exec_done_at = Some(Instant::now());
                self.hold_output_mounts();
                self.tell_payload_started();
            }
            FromCell::ExecFailed { failure, .. } => {
                self.observed.exec_failure = Some(failure);
                self.tell_payload_started();
            }
            FromCell::CommandEnded { .. } => {}
            FromCell::Ended(ended) => {
                self.observed.ended = Some(ended);
                self.tell_payload_started();
                self.collect_artifacts();
            }
        }
        Ok(())
    }

    fn tell_payload_started(&mut self) {
        if let Some(door) = self.door.as_mut() {
            door.payload_started();
        }
    }

    /// The payload's terminal master: the supervisor's, or the container's console
    /// socket's. A console that cannot take it ends the cell (its caller would wait for
    /// it forever).
    fn payload_terminal(&mut self, master: Option<OwnedFd>) -> Option<OwnedFd> {
        let Some(door) = self.door.as_mut() else {
            return master;
        };
        match door.payload_terminal(master?) {
            Ok(kept) => kept,
            Err(error) => {
                self.observed.launch_failure = Some(protocol::LaunchFailure {
                    stage: "console".into(),
                    message: error,
                    unavailable: false,
                });
                self.destroy("its terminal could not be sent to the console socket");
                None
            }
        }
    }

    pub fn start_egress(
        &mut self,
        announced: &protocol::ListenersWire,
        fds: Vec<OwnedFd>,
        egress: &mut Option<&mut dyn EgressSession>,
    ) {
        let started = match (
            protocol::checked_listeners(announced, fds, self.plan),
            egress.as_mut(),
        ) {
            (None, _) => Err("the cell's egress sockets are not the plan's".to_string()),
            (Some(listeners), Some(session)) => session.start(listeners),
            (Some(_), None) => {
                Err("the plan allows egress but no proxy was configured".to_string())
            }
        };
        if let Err(err) = started {
            // Fail closed: no proxy means the cell must not run at all.
            self.observed.egress_error = Some(err);
            let _ = sys::pidfd_send_signal(self.pidfd.as_fd(), libc::SIGKILL);
        }
    }

    /// The payload ended and pid 1 waits (when it was built to): hold what a suspected
    /// escape's evidence needs and collect the artifacts, then let it go.
    pub fn collect_artifacts(&mut self) {
        if !self.pid1_waits_for_collection {
            return;
        }
        if self.observed.writable_mounts.is_empty() {
            // Not held yet (a cold run, or an exec that failed): pid 1 is alive.
            self.hold_writable_mounts();
        }
        if let Some(request) = self.artifacts.clone() {
            if self.observed.output_mounts.is_empty() {
                // The payload's exec failed: nothing was held, pid 1 is alive.
                self.observed.output_mounts = artifacts::OutputMounts::open(self.pid, self.plan);
            }
            let mounts = std::mem::take(&mut self.observed.output_mounts);
            self.observed.artifacts = Some(artifacts::collect(&mounts, self.plan, &request));
        }
        if let Some(sync) = &self.sync {
            let _ = sync.artifacts_collected();
        }
    }

    /// Collects the artifacts of a cell whose pid 1 died before it could report the
    /// payload's end (a memory kill of the whole cell), through the mounts held since the
    /// payload started. Called once the cgroup is empty: nothing of the cell runs any more.
    pub fn collect_after_cell_died(&mut self) {
        if self.observed.artifacts.is_some() || self.observed.output_mounts.is_empty() {
            return;
        }
        if let Some(request) = &self.artifacts {
            let mounts = std::mem::take(&mut self.observed.output_mounts);
            self.observed.artifacts = Some(artifacts::collect(&mounts, self.plan, request));
        }
    }
}

/// The further command a cell's message is about, if it is about one.
fn further_command(message: &FromCell) -> Option<u64> {
    match message {
        FromCell::CommandTerminal { id }
        | FromCell::CommandStarted { id }
        | FromCell::ExecFailed { id, .. }
        | FromCell::CommandEnded { id, .. } => Some(*id),
        FromCell::Failed(_)
        | FromCell::Listeners(_)
        | FromCell::Terminal
        | FromCell::Parked
        | FromCell::Ended(_) => None,
    }
}

/// What the engine has been told of a one-shot cell's command.
#[derive(Default)]
struct Announced {
    started: bool,
    exited: bool,
}

impl Announced {
    /// Tells the engine what it does not know yet: that the payload was exec'd, and how it
    /// exited (pid 1 reports that before the cell is torn down, which takes milliseconds:
    /// the command's report follows then).
    fn update(&mut self, supervision: &Supervision<'_>, control: &SupervisorControl, id: u64) {
        if !self.started && supervision.observed.exec_done_at.is_some() {
            self.started = true;
            control.send(&ToEngine::CommandStarted { id });
        }
        if !self.exited {
            if let Some(exit) = supervision.reported_exit() {
                self.exited = true;
                control.send(&ToEngine::CommandExited { id, exit });
            }
        }
    }
}

/// What a control message means for a one-shot cell's running command: `Some(why)` to
/// destroy the cell now. A further `Run`, or a `Signal` (for session commands), is not
/// for a one-shot cell and is ignored.
fn control_ends_cell(control: &SupervisorControl) -> Option<&'static str> {
    match control.recv() {
        Ok(None) => Some("the engine went away"),
        Err(_) => Some("the engine broke the control protocol"),
        Ok(Some((ToSupervisor::Close, _))) => Some("closed by the engine"),
        Ok(Some((ToSupervisor::Kill { .. }, _))) => Some("killed by the engine"),
        Ok(Some((ToSupervisor::Run { .. }, _))) => None,
        Ok(Some((ToSupervisor::Signal { .. }, _))) => None,
        // Only a session's destinations change; the engine never asks a one-shot cell.
        Ok(Some((ToSupervisor::SetDestinations { .. }, _))) => None,
    }
}
