//! `airlock doctor`: checks, one by one, that this host can enforce every control a cell
//! relies on. Each check exercises the real mechanism where that is cheap.

use crate::cgroup::{cgroup_name, find_leftovers, CellCgroup, CgroupLayout};
use crate::host_identity::{HostIdRange, HostIdentityPool};
use crate::sys;
use serde::Serialize;

#[derive(Debug, Serialize)]
pub struct Check {
    pub control: &'static str,
    pub ok: bool,
    pub detail: String,
}

fn check(control: &'static str, result: Result<String, String>) -> Check {
    match result {
        Ok(detail) => Check {
            control,
            ok: true,
            detail,
        },
        Err(detail) => Check {
            control,
            ok: false,
            detail,
        },
    }
}

fn namespace_file(name: &str) -> Result<String, String> {
    let path = format!("/proc/self/ns/{name}");
    std::fs::metadata(&path)
        .map(|_| format!("{path} present"))
        .map_err(|e| format!("{path}: {e}"))
}

/// [`run_checks_with`] the default range of host ids.
pub fn run_checks() -> Vec<Check> {
    run_checks_with(HostIdRange::default())
}

/// Every check, for cells whose host ids come from `host_ids` (the operator's
/// `host_ids` of airlock.toml).
pub fn run_checks_with(host_ids: HostIdRange) -> Vec<Check> {
    let mut checks = Vec::new();
    for ns in ["user", "mnt", "pid", "net", "ipc", "uts", "cgroup"] {
        checks.push(check(
            match ns {
                "user" => "namespace.user.kernel",
                "mnt" => "namespace.mount",
                "pid" => "namespace.pid",
                "net" => "namespace.net",
                "ipc" => "namespace.ipc",
                "uts" => "namespace.uts",
                _ => "namespace.cgroup",
            },
            namespace_file(ns),
        ));
    }
    // What a run's preflight refuses, checked by the same function (crate::preflight).
    checks.push(check(
        "namespace.user",
        crate::preflight::user_namespaces(sys::geteuid()).map_err(|e| e.to_string()),
    ));
    let sysctl = |name: &str| std::fs::read_to_string(format!("/proc/sys/kernel/{name}")).ok();
    checks.push(check(
        "namespace.user.restrictions",
        userns_restrictions(
            sys::geteuid(),
            sysctl("apparmor_restrict_unprivileged_userns").as_deref(),
        ),
    ));
    checks.push(check(
        "landlock",
        crate::preflight::landlock().map_err(|e| e.to_string()),
    ));
    checks.push(check(
        "seccomp",
        std::fs::read_to_string("/proc/self/status")
            .map_err(|e| e.to_string())
            .and_then(|s| {
                if s.contains("Seccomp:") {
                    Ok(())
                } else {
                    Err("kernel without CONFIG_SECCOMP".into())
                }
            })
            .map(|_| {
                format!(
                    "filter mode available; default filter is {} instructions",
                    airlock_contract::seccomp::DEFAULT_FILTER.len()
                )
            }),
    ));
    match CgroupLayout::detect() {
        Ok(layout) => {
            checks.push(check("cgroups", cgroup_probe(&layout)));
            let leftovers = find_leftovers(&layout);
            checks.push(check(
                "cleanup.leftover_cells",
                if leftovers.is_empty() {
                    Ok("no cell cgroups without a live supervisor".into())
                } else {
                    Err(format!(
                        "{} leftover cell cgroup(s): {} (removed by the next `airlock run`)",
                        leftovers.len(),
                        leftovers
                            .iter()
                            .map(|l| format!("{} ({} processes)", l.path.display(), l.processes))
                            .collect::<Vec<_>>()
                            .join(", ")
                    ))
                },
            ));
        }
        Err(e) => checks.push(check("cgroups", Err(e.to_string()))),
    }
    checks.push(check("mount_api", mount_api()));
    checks.push(check("cgroups.migration_speed", Ok(migration_hint())));
    checks.push(check("identity", host_identity(host_ids)));
    checks.push(check("cell.end_to_end", end_to_end(host_ids)));
    for (control, result) in crate::gvisor::health::checks(host_ids) {
        checks.push(check(control, result));
    }
    checks
}

/// Creates a cell cgroup with the default contract's limits and removes it again, exactly
/// as a run does: finding the controllers is not enough when this user cannot write them
/// (doctor must not say `ok` for a control `run` then fails on).
fn cgroup_probe(layout: &CgroupLayout) -> Result<String, String> {
    let limits = default_limits()?;
    let started = sys::process_stat(std::process::id())
        .map_err(|e| format!("/proc/self/stat: {e}"))?
        .start_time;
    let probe = CellCgroup::create(layout, &cgroup_name(started), &limits)
        .map_err(|e| format!("{}; cannot create a cell cgroup: {e}", layout.describe()))?;
    let left = probe.destroy();
    if !left.is_empty() {
        return Err(format!(
            "{}; a probe cgroup could not be removed: {}",
            layout.describe(),
            left.iter()
                .map(|d| d.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    Ok(format!(
        "{}; a cell cgroup with limits was created and removed",
        layout.describe()
    ))
}

fn default_limits() -> Result<airlock_contract::Limits, String> {
    let argv = ["/bin/true".to_string()];
    airlock_contract::compile(
        &airlock_contract::default_contract(),
        &airlock_contract::CompileInput::new(std::path::Path::new("/"), &argv),
    )
    .map(|plan| plan.limits)
    .map_err(|e| e.to_string())
}

/// Moving a process into a cgroup takes a global lock whose first writer waits for an RCU
/// grace period (~15 ms here) unless a cgroup2 mount has `favordynmods`. Not a control,
/// only speed: reported, never failed.
fn migration_hint() -> String {
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
    let cgroup2: Vec<&str> = mounts
        .lines()
        .filter(|l| l.split_whitespace().nth(2) == Some("cgroup2"))
        .collect();
    match cgroup2.iter().find(|l| l.contains("favordynmods")) {
        Some(_) => "a cgroup2 mount has favordynmods: cheap cgroup joins".into(),
        None => match cgroup2.first().and_then(|l| l.split_whitespace().nth(1)) {
            Some(at) => {
                format!("slow first cgroup join; for speed: mount -o remount,favordynmods {at}")
            }
            None => "no cgroup2 mount: cgroup joins may wait for an RCU grace period".into(),
        },
    }
}

/// Ubuntu's `kernel.apparmor_restrict_unprivileged_userns` (1 lets only binaries with an
/// AppArmor profile that allows `userns` create user namespaces: packaging/apparmor/airlock).
/// Not a refusal of its own: whether this binary may is what `mount_api` below finds out,
/// as a cell would. Debian's `kernel.unprivileged_userns_clone` is the run's preflight's
/// (`namespace.user`). `None`: the kernel has no such switch. Root is never restricted.
fn userns_restrictions(euid: u32, apparmor_restrict: Option<&str>) -> Result<String, String> {
    if euid == 0 {
        return Ok("running as root: no userns restriction applies".into());
    }
    if apparmor_restrict.map(str::trim) == Some("1") {
        return Ok("kernel.apparmor_restrict_unprivileged_userns=1: user namespaces need an AppArmor profile allowing them; install packaging/apparmor/airlock into /etc/apparmor.d/ and load it (apparmor_parser -r /etc/apparmor.d/airlock); mount_api below shows whether this binary may".into());
    }
    Ok("no AppArmor restriction of user namespaces for this user".into())
}

/// Whose ids cells run as: as root, the range and how many of its slots live cells hold
/// now (one uid + gid each, see host_identity.rs).
fn host_identity(range: HostIdRange) -> Result<String, String> {
    if sys::geteuid() != 0 {
        return Ok(format!(
            "running as uid {}: the cell identity maps to it (no range without root)",
            sys::geteuid()
        ));
    }
    let held = HostIdentityPool::open(range)
        .and_then(|pool| pool.held())
        .map_err(|e| e.to_string())?;
    Ok(format!(
        "running as root: each live cell runs as its own host uid and gid from {}..={} \
         ({} ids, never 0); {held} held now",
        range.base(),
        range.last(),
        range.count()
    ))
}

/// Clones `/usr` as a detached, read-only tree: the new mount API calls every cell start
/// relies on (open_tree, mount_setattr; move_mount follows in the cell), where a run of
/// this caller makes them: in the host's mount namespace with CAP_SYS_ADMIN, in a mount
/// namespace of a new user namespace otherwise (the cell's, see rootfs::deferred_cgroup_view).
fn mount_api() -> Result<String, String> {
    if crate::privilege::can_clone_mount_trees() {
        return clone_usr()
            .map(|()| "open_tree + mount_setattr on a detached clone of /usr".into());
    }
    let child = crate::process::fork().map_err(|e| format!("fork: {e}"))?;
    let crate::process::Forked::Parent(pid) = child else {
        let code = match sys::unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWNS) {
            Err(_) => 2,
            Ok(()) => i32::from(clone_usr().is_err()),
        };
        sys::exit_now(code);
    };
    let status = sys::wait_child(pid, false)
        .map_err(|e| format!("wait: {e}"))?
        .map_or(-1, |reaped| reaped.status);
    match (libc::WIFEXITED(status), libc::WEXITSTATUS(status)) {
        (true, 0) => Ok("without CAP_SYS_ADMIN: open_tree + mount_setattr on a detached clone of /usr in a new user and mount namespace, as each cell does".into()),
        (true, 2) => Err("unshare(CLONE_NEWUSER | CLONE_NEWNS) failed: unprivileged user namespaces are not available to this user".into()),
        _ => Err("open_tree/mount_setattr of /usr failed in a new user and mount namespace".into()),
    }
}

fn clone_usr() -> Result<(), String> {
    use std::os::fd::AsFd;
    let usr = std::fs::File::open("/usr").map_err(|e| format!("/usr: {e}"))?;
    let tree = sys::clone_mount_tree(usr.as_fd()).map_err(|e| format!("open_tree(/usr): {e}"))?;
    sys::set_mount_attributes(
        tree.as_fd(),
        sys::MOUNT_ATTR_RDONLY | sys::MOUNT_ATTR_NOSUID,
        true,
    )
    .map_err(|e| format!("mount_setattr: {e}"))
}

/// Runs `/bin/true` in a cell with the default contract: every control at once.
fn end_to_end(host_ids: HostIdRange) -> Result<String, String> {
    let contract = airlock_contract::default_contract();
    let argv = ["/bin/true".to_string()];
    let plan = airlock_contract::compile(
        &contract,
        &airlock_contract::CompileInput::new(std::path::Path::new("/"), &argv),
    )
    .map_err(|e| e.to_string())?;
    let report = crate::run_cell(&plan, crate::RunOptions::bare(host_ids));
    match report.status {
        crate::report::ResultClass::Ok if report.cleanup.ok => Ok(format!(
            "/bin/true ran in a full cell (started in {:.2} ms, gone after {:.2} ms, cgroup {})",
            report.timings.startup_ms,
            report.timings.wall_ms,
            report.cgroup_version.unwrap_or("?")
        )),
        status => Err(format!(
            "{}: {}",
            status.as_str(),
            report.error.unwrap_or_default()
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ubuntus_apparmor_restriction_names_the_shipped_profile() {
        let said = userns_restrictions(1000, Some("1\n")).unwrap();
        assert!(said.contains("packaging/apparmor/airlock"), "{said}");
    }

    #[test]
    fn root_is_not_restricted_by_apparmor() {
        assert!(userns_restrictions(0, Some("1")).is_ok());
    }
}
