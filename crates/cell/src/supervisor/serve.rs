//! A cell driven by the engine through its control socket ([`crate::control`]): built
//! ahead of its command and parked at START (a warm cell), then given its command.

use super::build::{self, Cell, Preflight};
use super::session::{serve_session, SessionLimits};
use super::supervise::{Parking, Sinks};
use super::{command_environment, wanted_artifacts, CommandIo, EgressSession, PayloadStdin};
use crate::artifacts::ArtifactRequest;
use crate::control::{CommandSpec, SupervisorControl, ToEngine, ToSupervisor};
use crate::error::CellError;
use crate::protocol::CellCommand;
use crate::report::RunReport;
use crate::sys;
use airlock_contract::CellPlan;
use std::os::fd::{AsRawFd, OwnedFd};
use std::time::{Duration, Instant};

/// How long a serving cell lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServeMode {
    /// The cell ends with its one command, artifacts collected, exactly like
    /// [`crate::run_cell`].
    OneShot,
    /// One cell serves several commands of one job, each in a process group of its own
    /// with its own stdio, limits and report; writable paths persist between them.
    Session {
        /// Destroyed when no command ran for this long.
        idle_timeout: Duration,
        /// Destroyed this long after it was built, whatever runs.
        max_lifetime: Duration,
    },
}

pub struct ServeOptions<'a> {
    /// SOCK_SEQPACKET, the engine's peer (see [`crate::control`]). EOF on it destroys
    /// the cell at once.
    pub control: OwnedFd,
    /// `(variable, value)` of every credential of the plan.
    pub credentials: &'a [(String, String)],
    pub egress: Option<&'a mut dyn EgressSession>,
    pub artifacts: Option<ArtifactRequest>,
    pub mode: ServeMode,
    /// Where the cell's own host uid and gid come from, as root (see host_identity.rs).
    pub host_ids: crate::host_identity::HostIdRange,
    /// See [`crate::RunOptions::on_suspected_escape`].
    pub on_suspected_escape: Option<crate::evidence::OnSuspectedEscape>,
}

/// Builds a cell for `plan`, parks it before its command (namespaces, mounts, cgroup
/// with limits, seccomp and Landlock applied to pid 1, egress listeners bound and the
/// proxy started), tells the engine ([`ToEngine::Parked`]) and is then driven by the
/// messages on `options.control` until the cell is destroyed; the last message is
/// [`ToEngine::Closed`] (or [`ToEngine::Failed`] for a cell that could not be built).
///
/// Preconditions: the process must be single-threaded, since it clones the cell (the
/// engine's cell factory forks one process per cell and calls this in it); this is
/// checked, and a multi-threaded caller gets [`ToEngine::Failed`]. A plan with a
/// terminal is refused. The call returns once the cell is gone; the process then exits
/// (the egress proxy's thread, if any, is stopped).
pub fn serve_cell(plan: &CellPlan, options: ServeOptions<'_>) {
    if plan.isolation == airlock_contract::Isolation::Gvisor {
        // runsc forks and execs its own processes: nothing is cloned here.
        return crate::gvisor::serve_gvisor(plan, options);
    }
    let started = Instant::now();
    let ServeOptions {
        control,
        credentials,
        mut egress,
        artifacts,
        mode,
        host_ids,
        on_suspected_escape,
    } = options;
    let control = SupervisorControl::new(control);
    let served = serve(
        plan,
        &control,
        credentials,
        &mut egress,
        artifacts,
        (mode, host_ids, on_suspected_escape),
        started,
    );
    if let Err(err) = served {
        let mut report = RunReport::refused("", err.class(), err.to_string());
        report.timings.wall_ms = super::ms_since(started);
        control.send(&ToEngine::Failed {
            report: Box::new(report),
        });
    }
}

/// Refusals that need no cell: a session's commands have stdio of their own, so a
/// session has no terminal (a one-shot cell's one command gets the cell's).
fn check_servable(plan: &CellPlan, mode: ServeMode) -> Result<(), CellError> {
    if plan.terminal && matches!(mode, ServeMode::Session { .. }) {
        return Err(CellError::Unsupported(
            "a session has no terminal: its commands each have their own stdio".into(),
        ));
    }
    Ok(())
}

fn serve(
    plan: &CellPlan,
    control: &SupervisorControl,
    credentials: &[(String, String)],
    egress: &mut Option<&mut dyn EgressSession>,
    artifacts: Option<ArtifactRequest>,
    (mode, host_ids, on_suspected_escape): (
        ServeMode,
        crate::host_identity::HostIdRange,
        Option<crate::evidence::OnSuspectedEscape>,
    ),
    started: Instant,
) -> Result<(), CellError> {
    check_servable(plan, mode)?;
    let preflight = Preflight::check(plan)?;
    // A credential without a value refuses the cell before it is built.
    command_environment(plan, credentials, &[])?;
    let artifacts = wanted_artifacts(plan, artifacts.as_ref());
    let role = match mode {
        ServeMode::Session { .. } => build::Pid1Role::Session,
        ServeMode::OneShot => build::Pid1Role::OneShot,
    };
    // The evidence's writable paths are held once the cell parks (pid 1 alive, waiting
    // for START), so pid 1 need not wait after its payload for them: only artifacts.
    let mut cell = build::build(
        plan,
        preflight,
        started,
        (artifacts, None),
        None,
        role,
        host_ids,
    )?;
    cell.supervision.on_suspected_escape = on_suspected_escape;
    match cell.supervision.wait_parked(egress, control)? {
        Parking::Parked => {}
        Parking::Gone => {
            let report = cell.finish(Ok(Vec::new()), egress, started);
            control.send(&ToEngine::Failed {
                report: Box::new(report),
            });
            return Ok(());
        }
        Parking::Closed(why) => return close(cell, why, control, egress, started),
    }
    let parked = |release| ToEngine::Parked {
        pid: cell.supervision.pid,
        cgroups: cell
            .supervision
            .ceilings
            .view()
            .into_iter()
            .map(|(_, host)| host)
            .collect(),
        release,
    };
    // A one-shot cell's command may be delivered before its record is committed and
    // released by the engine straight to pid 1 (see ToCell::StartHeld); the engine holds
    // the only write end.
    let release = match (mode, sys::pipe_cloexec()) {
        (ServeMode::OneShot, Ok((read_end, write_end))) => {
            control.send_parked(&parked(true), write_end);
            Some(read_end)
        }
        _ => {
            control.send(&parked(false));
            None
        }
    };
    // Parked: what supervising needs is done now, not after the command arrives.
    cell.prepare_supervision();
    // pid 1 waits for START, which only this process sends: it is alive.
    cell.supervision.hold_writable_mounts();
    if let ServeMode::Session {
        idle_timeout,
        max_lifetime,
    } = mode
    {
        let limits = SessionLimits {
            idle_timeout,
            max_lifetime,
            built: started,
        };
        let ran = cell.supervise_with(
            |_| {},
            |supervision| serve_session(supervision, control, credentials, limits, egress),
        );
        let report = cell.finish(ran, egress, started);
        control.send(&ToEngine::Closed {
            report: Box::new(report),
        });
        return Ok(());
    }
    let (id, run_id, spec, fds, held) = match wait_for_run(&cell, control)? {
        Waited::Run {
            id,
            run_id,
            spec,
            fds,
            held,
        } => (id, run_id, spec, fds, held),
        Waited::End(why) => return close(cell, why, control, egress, started),
    };
    // Not held: the pipe is not needed (and its read end must not wait in pid 1).
    let release = release.filter(|_| held);
    if held && release.is_none() {
        let error = "a held command for a cell without a release pipe".to_string();
        let refused = RunReport::refused(&run_id, crate::report::ResultClass::RuntimeFault, error);
        control.send(&ToEngine::CommandEnded {
            id,
            report: Box::new(refused),
        });
        return close(cell, "its command was refused", control, egress, started);
    }
    let prepared = command_limits(plan, &spec).and_then(|limits| {
        let env = command_environment(plan, credentials, &spec.env)?;
        let mut io = command_io(plan, cell.supervision.host, &spec, fds)?;
        io.release = release;
        let command = CellCommand {
            id,
            argv: spec.argv.clone(),
            env,
            stdio: io.stdio,
        };
        Ok((limits, command, io))
    });
    let (limits, command, io) = match prepared {
        Ok(prepared) => prepared,
        Err(err) => {
            let mut refused = RunReport::refused(&run_id, err.class(), err.to_string());
            refused.timings.wall_ms = super::ms_since(started);
            control.send(&ToEngine::CommandEnded {
                id,
                report: Box::new(refused),
            });
            return close(cell, "its command was refused", control, egress, started);
        }
    };
    // The supervision loop tells the engine of the exec and the exit as they happen.
    let ran = cell.run_command(run_id, command, io, limits, egress, Some(control));
    let report = cell.finish(ran, egress, started);
    control.send(&ToEngine::CommandEnded {
        id,
        report: Box::new(report.clone()),
    });
    control.send(&ToEngine::Closed {
        report: Box::new(report),
    });
    Ok(())
}

/// Destroys the cell and sends its final report.
fn close(
    mut cell: Cell<'_>,
    why: &str,
    control: &SupervisorControl,
    egress: &mut Option<&mut dyn EgressSession>,
    started: Instant,
) -> Result<(), CellError> {
    cell.supervision.destroy(why);
    let _ = sys::wait_child(cell.supervision.pid, false);
    let report = cell.finish(Ok(Vec::new()), egress, started);
    control.send(&ToEngine::Closed {
        report: Box::new(report),
    });
    Ok(())
}

/// What the engine said to a parked cell.
enum Waited {
    Run {
        id: u64,
        run_id: String,
        spec: CommandSpec,
        fds: Vec<OwnedFd>,
        held: bool,
    },
    /// The cell must go (Close, the engine's EOF, or the cell died while parked).
    End(&'static str),
}

/// Blocks until the engine sends the command, closes, or goes away, or the parked cell
/// dies.
fn wait_for_run(cell: &Cell<'_>, control: &SupervisorControl) -> Result<Waited, CellError> {
    loop {
        let mut fds = [
            libc::pollfd {
                fd: control.as_fd().as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: cell.supervision.pidfd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        sys::poll(&mut fds, -1).map_err(|e| CellError::io("poll", e))?;
        if fds[1].revents != 0 {
            return Ok(Waited::End("the parked cell died"));
        }
        if fds[0].revents == 0 {
            continue;
        }
        return Ok(match control.recv() {
            Ok(None) => Waited::End("the engine went away"),
            Err(_) => Waited::End("the engine broke the control protocol"),
            Ok(Some((ToSupervisor::Close, _))) => Waited::End("closed by the engine"),
            Ok(Some((ToSupervisor::Kill { .. }, _))) => Waited::End("killed by the engine"),
            // No command runs in a parked cell: a signal for one breaks the protocol.
            Ok(Some((ToSupervisor::Signal { .. }, _))) => {
                Waited::End("the engine signalled a command of a parked cell")
            }
            // Only a session's destinations change: asked of a one-shot cell, the
            // protocol is broken and the cell goes (fail closed).
            Ok(Some((ToSupervisor::SetDestinations { .. }, _))) => {
                Waited::End("the engine changed the destinations of a one-shot cell")
            }
            Ok(Some((
                ToSupervisor::Run {
                    id,
                    run_id,
                    command,
                    held,
                },
                fds,
            ))) => Waited::Run {
                id,
                run_id,
                spec: command,
                fds,
                held,
            },
        });
    }
}

/// The command's wall time and output budget: the plan's, or lower ones the command
/// asks for. A higher one is refused.
pub(crate) fn command_limits(plan: &CellPlan, spec: &CommandSpec) -> Result<(u64, u64), CellError> {
    if spec.argv.is_empty() {
        return Err(CellError::Protocol {
            message: "a command without argv".into(),
        });
    }
    let lowered = |limit: &'static str, asked: Option<u64>, allowed: u64| match asked {
        Some(asked) if asked > allowed => Err(CellError::AbovePlan {
            limit,
            asked,
            allowed,
        }),
        Some(asked) => Ok(asked),
        None => Ok(allowed),
    };
    Ok((
        lowered("wall_time_ms", spec.wall_time_ms, plan.limits.wall_time_ms)?,
        lowered("output_bytes", spec.output_bytes, plan.limits.output_bytes)?,
    ))
}

/// The command's pipes, around the descriptors that came with `Run` (in the order of
/// [`crate::control::CommandFds`]): stdin (if any), the stdout and stderr sinks, the
/// caller's (if watched).
pub(super) fn command_io(
    plan: &CellPlan,
    host: crate::host_identity::HostIdentity,
    spec: &CommandSpec,
    fds: Vec<OwnedFd>,
) -> Result<CommandIo, CellError> {
    let mut fds = fds.into_iter();
    let stdin = match spec.stdin {
        true => PayloadStdin::Relayed(fds.next().ok_or_else(missing_fd)?),
        false => PayloadStdin::Null,
    };
    let sinks = Sinks {
        stdout: Some(fds.next().ok_or_else(missing_fd)?),
        stderr: Some(fds.next().ok_or_else(missing_fd)?),
    };
    let caller = match spec.watch_caller {
        true => Some(fds.next().ok_or_else(missing_fd)?),
        false => None,
    };
    let mut io = CommandIo::open(plan, host, stdin, sinks)?;
    io.caller = caller;
    Ok(io)
}

fn missing_fd() -> CellError {
    CellError::Protocol {
        message: "a command without its descriptors".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan() -> CellPlan {
        airlock_contract::compile(
            &airlock_contract::default_contract(),
            &airlock_contract::CompileInput::new(std::path::Path::new("/"), &["true".to_string()]),
        )
        .unwrap()
    }

    fn spec(wall_time_ms: Option<u64>, output_bytes: Option<u64>) -> CommandSpec {
        CommandSpec {
            argv: vec!["true".into()],
            env: Vec::new(),
            wall_time_ms,
            output_bytes,
            stdin: false,
            watch_caller: false,
        }
    }

    #[test]
    fn a_command_may_lower_the_plans_limits() {
        let plan = plan();
        let (wall, out) = (plan.limits.wall_time_ms, plan.limits.output_bytes);
        assert_eq!(
            command_limits(&plan, &spec(None, None)).unwrap(),
            (wall, out)
        );
        assert_eq!(
            command_limits(&plan, &spec(Some(5), Some(7))).unwrap(),
            (5, 7)
        );
    }

    #[test]
    fn a_command_asking_for_more_than_the_plan_is_refused() {
        let plan = plan();
        let wall = plan.limits.wall_time_ms;
        let err = command_limits(&plan, &spec(Some(wall + 1), None)).unwrap_err();
        assert!(matches!(
            err,
            CellError::AbovePlan {
                limit: "wall_time_ms",
                ..
            }
        ));
        assert_eq!(err.class(), crate::report::ResultClass::PolicyDenied);
        let out = plan.limits.output_bytes;
        assert!(command_limits(&plan, &spec(None, Some(out + 1))).is_err());
    }

    #[test]
    fn a_session_with_a_terminal_is_refused_before_any_cell_is_built() {
        let session = ServeMode::Session {
            idle_timeout: Duration::from_secs(1),
            max_lifetime: Duration::from_secs(1),
        };
        let mut plan = plan();
        assert!(check_servable(&plan, session).is_ok());
        plan.terminal = true;
        assert!(check_servable(&plan, session).is_err());
        assert!(check_servable(&plan, ServeMode::OneShot).is_ok());
    }
}
