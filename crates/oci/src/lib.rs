//! airlock-oci: a [`CellPlan`] as an OCI runtime spec (`config.json` of a bundle), which
//! the gVisor tier (`crates/cell/src/gvisor/`) hands to `runsc run`. Pure: the host
//! paths the runtime prepared (the bundle's root skeleton, each writable path's size-capped
//! host tmpfs, the cgroup, the host ids) come in as [`BundleHost`]; nothing is read or
//! written here.
//!
//! What the spec says, and why:
//! - The root is the bundle's skeleton (mount points, merged-`/usr` symlinks, the generated
//!   `/etc` files), read-only; the host's system directories, `/etc` entries and read-only
//!   inputs are read-only bind mounts (`nosuid`, `nodev`), exactly the plan's mounts.
//! - Writable paths are bind mounts of host tmpfs directories the supervisor mounted with
//!   the plan's size caps: the cap is the host kernel's, and the supervisor can still read
//!   them after the sandbox is gone (artifact collection).
//! - Identity: a user namespace whose maps send the sandbox's root (what runsc's gofer
//!   runs as) and the payload's uid/gid to two host ids of airlock's range, one each, so
//!   nothing of the sandbox is root on the host and a file the payload writes through the
//!   gofer is owned by the cell's own host id, never by a host user's.
//! - No capabilities in any set, `noNewPrivileges`, rlimits from the plan (`RLIMIT_NPROC`
//!   is the payload's `process_limit`: gVisor's kernel counts its tasks, which are not
//!   host tasks one for one).
//! - The plan's system call policy as `linux.seccomp` (seccomp.rs), which runsc applies
//!   inside the Sentry (`--oci-seccomp`): what airlock denies natively, gVisor's kernel
//!   denies too.
//! - No resources in the spec: the cgroup at `cgroupsPath` is airlock's own, created with
//!   the ceilings before `runsc run`; runsc joins an existing cgroup without owning it.

pub mod bundle;
pub mod cgroups_path;
pub mod exec;
pub mod update;

use airlock_contract::{CellPlan, MountPlan};
use oci_spec::runtime::{
    Capabilities, LinuxBuilder, LinuxCapabilitiesBuilder, LinuxIdMapping, LinuxIdMappingBuilder,
    LinuxNamespace, LinuxNamespaceBuilder, LinuxNamespaceType, Mount, MountBuilder,
    PosixRlimitBuilder, PosixRlimitType, ProcessBuilder, RootBuilder, Spec, SpecBuilder,
    UserBuilder,
};
use std::path::{Path, PathBuf};

/// The runtime-spec types, for a caller that adjusts a spec made here.
pub use oci_spec::runtime as spec_types;
pub use oci_spec::runtime::Spec as RuntimeSpec;

/// The spec's version: what the runsc of Debian 12 reports (`runsc --version`: spec
/// 1.0.2-dev) accepts.
pub const OCI_VERSION: &str = "1.0.2";

#[derive(Debug, thiserror::Error)]
pub enum OciError {
    #[error("building the runtime spec: {0}")]
    Spec(#[from] oci_spec::OciSpecError),
    #[error("the plan has {planned} writable paths but the bundle {prepared}")]
    WritableMismatch { planned: usize, prepared: usize },
    #[error("the payload's uid or gid is the sandbox root's (0), which would map it to the gofer's host id")]
    RootPayload,
    #[error("the plan's seccomp policy as the spec's linux.seccomp: {0}")]
    Seccomp(String),
}

/// What the runtime prepared on the host for one bundle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BundleHost {
    /// The bundle's root directory (the skeleton of mount points).
    pub rootfs: PathBuf,
    /// `(host source, cell target)` of the system tree's directories to bind: the plan's
    /// host system directories that are directories on this host (a symlink of merged
    /// `/usr` is in the skeleton instead, an absent optional one is nowhere), or the
    /// entries of an OCI image's layer (its symlinks are in the skeleton).
    pub system: Vec<(PathBuf, PathBuf)>,
    /// `(host source, cell target)` of each `/etc` entry that exists on the host.
    pub etc_entries: Vec<(PathBuf, PathBuf)>,
    /// One host directory (a size-capped tmpfs) per writable path of the plan, in order.
    pub writable: Vec<PathBuf>,
    /// The cgroup airlock created, relative to each hierarchy's root (`/airlock/<name>`).
    pub cgroups_path: PathBuf,
    /// The host id (uid and gid) the sandbox's root maps to: runsc's gofer runs as it.
    pub root_host_id: u32,
    /// The host id (uid and gid) the payload's identity maps to.
    pub payload_host_id: u32,
    /// The sandbox's and gofer's `oom_score_adj` (runsc applies the spec's
    /// `process.oomScoreAdj` to both); `None`: they inherit runsc's.
    pub oom_score_adj: Option<i32>,
}

/// The runtime spec of `plan` on the host paths of `host`; `env` is the payload's exact
/// environment (`NAME=value`, credentials included: the caller resolved them).
pub fn runtime_spec(
    plan: &CellPlan,
    host: &BundleHost,
    env: Vec<String>,
) -> Result<Spec, OciError> {
    if plan.identity.uid == 0 || plan.identity.gid == 0 {
        return Err(OciError::RootPayload);
    }
    let root = RootBuilder::default()
        .path(host.rootfs.clone())
        .readonly(true)
        .build()?;
    let mut spec = SpecBuilder::default()
        .version(OCI_VERSION)
        .root(root)
        .hostname(plan.hostname.clone())
        .mounts(mounts(plan, host)?)
        .process(process(plan, env, host.oom_score_adj)?)
        .linux(linux(plan, host)?)
        .build()?;
    spec.set_annotations(None);
    spec.set_hooks(None);
    Ok(spec)
}

/// The process of a command `runsc exec` starts in a running sandbox (a session's):
/// confined exactly as the first payload (its user, no_new_privileges, no capability in
/// any set, its rlimits and working directory), with its own `args` and environment.
pub fn exec_process(
    plan: &CellPlan,
    args: Vec<String>,
    env: Vec<String>,
) -> Result<oci_spec::runtime::Process, OciError> {
    // Only the sandbox's processes carry the container's oom_score_adj (runsc applies
    // it to the sandbox and gofer), not a command inside it.
    let mut process = process(plan, env, None)?;
    process.set_args(Some(args));
    Ok(process)
}

fn process(
    plan: &CellPlan,
    env: Vec<String>,
    oom_score_adj: Option<i32>,
) -> Result<oci_spec::runtime::Process, OciError> {
    let user = UserBuilder::default()
        .uid(plan.identity.uid)
        .gid(plan.identity.gid)
        .additional_gids(Vec::<u32>::new())
        .build()?;
    let none = Capabilities::new();
    let capabilities = LinuxCapabilitiesBuilder::default()
        .bounding(none.clone())
        .effective(none.clone())
        .inheritable(none.clone())
        .permitted(none.clone())
        .ambient(none)
        .build()?;
    let mut process = ProcessBuilder::default()
        .terminal(false)
        .user(user)
        .args(plan.argv.clone())
        .env(env)
        .cwd(plan.workdir.clone())
        .no_new_privileges(true)
        .capabilities(capabilities)
        .rlimits(rlimits(plan)?)
        .build()?;
    process.set_apparmor_profile(None);
    process.set_selinux_label(None);
    process.set_oom_score_adj(oom_score_adj);
    Ok(process)
}

/// The payload's rlimits. `RLIMIT_NPROC` is the contract's `process_limit`, enforced by
/// gVisor's kernel for the payload's tasks (a refused fork is `EAGAIN` there).
fn rlimits(plan: &CellPlan) -> Result<Vec<oci_spec::runtime::PosixRlimit>, OciError> {
    let limits = &plan.limits;
    [
        (PosixRlimitType::RlimitCore, 0),
        (PosixRlimitType::RlimitNofile, limits.open_files),
        (PosixRlimitType::RlimitFsize, limits.file_size_bytes),
        (
            PosixRlimitType::RlimitNproc,
            u64::from(limits.process_limit),
        ),
    ]
    .into_iter()
    .map(|(typ, value)| {
        PosixRlimitBuilder::default()
            .typ(typ)
            .soft(value)
            .hard(value)
            .build()
            .map_err(OciError::from)
    })
    .collect()
}

fn linux(plan: &CellPlan, host: &BundleHost) -> Result<oci_spec::runtime::Linux, OciError> {
    let namespaces = [
        LinuxNamespaceType::Pid,
        LinuxNamespaceType::Network,
        LinuxNamespaceType::Ipc,
        LinuxNamespaceType::Uts,
        LinuxNamespaceType::Mount,
        LinuxNamespaceType::User,
    ]
    .into_iter()
    .map(|typ| LinuxNamespaceBuilder::default().typ(typ).build())
    .collect::<Result<Vec<LinuxNamespace>, _>>()?;
    let mut linux = LinuxBuilder::default()
        .namespaces(namespaces)
        .uid_mappings(id_maps(
            host.root_host_id,
            plan.identity.uid,
            host.payload_host_id,
        )?)
        .gid_mappings(id_maps(
            host.root_host_id,
            plan.identity.gid,
            host.payload_host_id,
        )?)
        .cgroups_path(host.cgroups_path.clone())
        .seccomp(seccomp::plan_seccomp(plan)?)
        .build()?;
    linux.set_resources(None);
    linux.set_masked_paths(None);
    linux.set_readonly_paths(None);
    Ok(linux)
}

/// Two one-id maps: the sandbox's root to `root_host`, the payload's `id` to
/// `payload_host`. runsc needs its root mapped (its gofer runs as it); one id each, so
/// no other id of the sandbox exists on the host.
fn id_maps(root_host: u32, id: u32, payload_host: u32) -> Result<Vec<LinuxIdMapping>, OciError> {
    let map = |container_id, host_id| {
        LinuxIdMappingBuilder::default()
            .container_id(container_id)
            .host_id(host_id)
            .size(1u32)
            .build()
    };
    Ok(vec![map(0, root_host)?, map(id, payload_host)?])
}

/// The sandbox's mounts in order: gVisor's own `/proc`, `/dev` and `/dev/shm` (served by
/// its kernel, not the host's), then the plan's mounts on the host paths of `host`.
fn mounts(plan: &CellPlan, host: &BundleHost) -> Result<Vec<Mount>, OciError> {
    let planned = plan
        .mounts
        .iter()
        .filter(|m| matches!(m, MountPlan::WritableTmpfs { .. }))
        .count();
    if planned != host.writable.len() {
        return Err(OciError::WritableMismatch {
            planned,
            prepared: host.writable.len(),
        });
    }
    let mut mounts = vec![
        kernel_mount("/proc", "proc", &["nosuid", "nodev", "noexec"])?,
        kernel_mount("/dev", "tmpfs", &["nosuid", "mode=755"])?,
        kernel_mount(
            "/dev/shm",
            "tmpfs",
            &[
                "nosuid",
                "nodev",
                &format!("size={}", plan.limits.shm_bytes),
            ],
        )?,
    ];
    for (source, target) in &host.system {
        mounts.push(bind(source, target, &["ro", "nosuid", "nodev"])?);
    }
    for (source, target) in &host.etc_entries {
        mounts.push(bind(source, target, &["ro", "nosuid", "nodev", "noexec"])?);
    }
    let mut writable = host.writable.iter();
    for mount in &plan.mounts {
        match mount {
            MountPlan::ReadonlyInput { source, target } => {
                mounts.push(bind(source, target, &["ro", "nosuid", "nodev"])?);
            }
            MountPlan::WritableTmpfs { target, exec, .. } => {
                let dir = writable.next().expect("counted above");
                let mut options = vec!["rw", "nosuid", "nodev"];
                if !exec {
                    options.push("noexec");
                }
                mounts.push(bind(dir, target, &options)?);
            }
            // The system tree (the host's or the image's) is `host.system`; the broker's
            // socket is no host mount on gVisor: the tier's forwarder binds it inside
            // the sandbox (crates/cell/src/gvisor/broker.rs).
            MountPlan::HostSystem { .. }
            | MountPlan::ImageSystem { .. }
            | MountPlan::BrokerSocket { .. } => {}
        }
    }
    Ok(mounts)
}

fn kernel_mount(target: &str, typ: &str, options: &[&str]) -> Result<Mount, OciError> {
    Ok(MountBuilder::default()
        .destination(target)
        .typ(typ)
        .source(typ)
        .options(options.iter().map(|o| o.to_string()).collect::<Vec<_>>())
        .build()?)
}

fn bind(source: &Path, target: &Path, options: &[&str]) -> Result<Mount, OciError> {
    let options = std::iter::once("rbind")
        .chain(options.iter().copied())
        .map(String::from)
        .collect::<Vec<_>>();
    Ok(MountBuilder::default()
        .destination(target)
        .typ("bind")
        .source(source)
        .options(options)
        .build()?)
}

mod seccomp;

#[cfg(test)]
mod bundle_tests;
#[cfg(test)]
mod tests;
