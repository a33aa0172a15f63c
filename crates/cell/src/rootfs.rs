//! Builds the cell's root filesystem inside its new mount namespace (runs in the cell's
//! pid 1, before privileges are dropped).
//!
//! Sources are cloned as detached mount trees by the supervisor, in the host's mount
//! namespace, so the staging tmpfs (mounted over `/tmp` of the cell's private mount
//! namespace, then pivoted into) cannot hide an input that lives under the host's `/tmp`.
//! Every clone is restricted (read-only, nosuid, nodev) with `mount_setattr(AT_RECURSIVE)`,
//! which, unlike a bind remount, also covers submounts.

use crate::launcher::Stage;
use crate::sys;
use airlock_contract::{CellPlan, EtcEntry, MountPlan, NetworkPlan};
use std::fs::{self, File};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::{symlink, DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// Where the new root is assembled before `pivot_root`.
const STAGING: &str = "/tmp";
const DEVICE_NODES: &[&str] = &["null", "zero", "full", "random", "urandom", "tty"];
/// Docker's masked `/proc` paths: directories get an empty read-only tmpfs, files
/// `/dev/null`. Paths this kernel lacks are skipped.
const PROC_MASKED_DIRS: &[&str] = &["acpi", "asound", "scsi"];
const PROC_MASKED_FILES: &[&str] = &[
    "interrupts",
    "kcore",
    "keys",
    "latency_stats",
    "sched_debug",
    "timer_list",
    "timer_stats",
];
const PROC_READONLY: &[&str] = &["bus", "fs", "irq", "sys", "sysrq-trigger"];

enum Source {
    Tree { fd: OwnedFd, is_dir: bool },
    Symlink(PathBuf),
}

/// A mount source opened by the supervisor, waiting to be placed at `target` in the cell.
pub struct Prepared {
    target: PathBuf,
    source: Source,
}

/// How a [`Prepared`] travels to the cell: everything but the descriptor, which goes
/// alongside as SCM_RIGHTS (in the order of the `tree` entries).
#[derive(serde::Serialize, serde::Deserialize)]
pub enum PreparedWire {
    Tree { target: PathBuf, is_dir: bool },
    Symlink { target: PathBuf, link: PathBuf },
}

pub fn to_wire(prepared: Vec<Prepared>) -> (Vec<PreparedWire>, Vec<OwnedFd>) {
    let mut fds = Vec::new();
    let wire = prepared
        .into_iter()
        .map(|Prepared { target, source }| match source {
            Source::Tree { fd, is_dir } => {
                fds.push(fd);
                PreparedWire::Tree { target, is_dir }
            }
            Source::Symlink(link) => PreparedWire::Symlink { target, link },
        })
        .collect();
    (wire, fds)
}

pub fn from_wire(wire: Vec<PreparedWire>, fds: Vec<OwnedFd>) -> Result<Vec<Prepared>, Stage> {
    let mut fds = fds.into_iter();
    wire.into_iter()
        .map(|item| {
            Ok(match item {
                PreparedWire::Tree { target, is_dir } => {
                    let fd = fds.next().ok_or_else(|| {
                        Stage::new("release", "fewer mount fds than mounts".into())
                    })?;
                    Prepared {
                        target,
                        source: Source::Tree { fd, is_dir },
                    }
                }
                PreparedWire::Symlink { target, link } => Prepared {
                    target,
                    source: Source::Symlink(link),
                },
            })
        })
        .collect()
}

fn open_path(path: &Path, follow: bool) -> std::io::Result<File> {
    let mut flags = libc::O_PATH | libc::O_CLOEXEC;
    if !follow {
        flags |= libc::O_NOFOLLOW;
    }
    fs::OpenOptions::new()
        .read(true)
        .custom_flags(flags)
        .open(path)
}

/// Clones the mount tree at `path` and restricts it with `attrs`.
fn restricted_clone(path: &Path, attrs: u64, follow: bool) -> Result<Source, Stage> {
    restricted_clone_with_owner(path, attrs, follow).map(|(source, _)| source)
}

/// [`restricted_clone`], also returning the uid and gid owning `path` (after `follow`).
fn restricted_clone_with_owner(
    path: &Path,
    attrs: u64,
    follow: bool,
) -> Result<(Source, (u32, u32)), Stage> {
    let file = open_path(path, follow).map_err(|e| Stage::io("rootfs.open_source", path, e))?;
    let meta = file
        .metadata()
        .map_err(|e| Stage::io("rootfs.stat_source", path, e))?;
    let fd =
        sys::clone_mount_tree(file.as_fd()).map_err(|e| Stage::io("rootfs.clone_tree", path, e))?;
    sys::set_mount_attributes(fd.as_fd(), attrs, true)
        .map_err(|e| Stage::io("rootfs.restrict_tree", path, e))?;
    let is_dir = meta.is_dir();
    Ok((Source::Tree { fd, is_dir }, (meta.uid(), meta.gid())))
}

/// How read-only inputs show their owners in the cell. The host uid and gid owning an
/// input's root appear as the cell identity (an idmapped mount), so tools that insist on
/// owning what they read (git's "dubious ownership") work; other owners keep appearing as
/// `nobody`. One owner only: an id map is one-to-one, so no map can show every host id as
/// the cell's. The owner's permission bits then apply to the cell (a 0600 file of the
/// owner becomes readable), which the operator granted by naming the input; the mount
/// stays read-only, nosuid and nodev, so ownership lends no write and no privilege.
struct InputOwners {
    /// The cell identity's host uid and gid; `None` when airlock is not root: the
    /// caller's own files already map to the cell identity, and idmapping needs root.
    cell: Option<(u32, u32)>,
    /// One user namespace per distinct owner, its maps taking that owner to `cell`.
    namespaces: Vec<((u32, u32), OwnedFd)>,
}

impl InputOwners {
    fn new(host: crate::host_identity::HostIdentity) -> InputOwners {
        InputOwners {
            cell: (sys::geteuid() == 0).then_some((host.uid, host.gid)),
            namespaces: Vec::new(),
        }
    }

    /// Shows files of `owner` in `tree` as the cell identity's. An error (a filesystem
    /// without idmapped mounts) leaves the tree as it was: an ownership view is no
    /// boundary, so the run goes on with the host's owners and a note in the result.
    fn show_as_cell(&mut self, tree: &Source, owner: (u32, u32)) -> Result<(), String> {
        let (Some(cell), Source::Tree { fd, .. }) = (self.cell, tree) else {
            return Ok(());
        };
        if owner == cell {
            return Ok(());
        }
        let index = match self.namespaces.iter().position(|(o, _)| *o == owner) {
            Some(index) => index,
            None => {
                let userns = sys::user_namespace_with_maps(
                    &format!("{} {} 1\n", owner.0, cell.0),
                    &format!("{} {} 1\n", owner.1, cell.1),
                )
                .map_err(|e| format!("no user namespace for the id map: {e}"))?;
                self.namespaces.push((owner, userns));
                self.namespaces.len() - 1
            }
        };
        sys::set_mount_idmap(fd.as_fd(), self.namespaces[index].1.as_fd())
            .map_err(|e| format!("no idmapped mount: {e}"))
    }
}

fn mirror_or_clone(
    host: &Path,
    target: &Path,
    attrs: u64,
    optional: bool,
) -> Result<Option<Prepared>, Stage> {
    let meta = match fs::symlink_metadata(host) {
        Ok(m) => m,
        Err(e) if optional && e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Stage::io("rootfs.host_path", host, e)),
    };
    let source = if meta.file_type().is_symlink() {
        Source::Symlink(fs::read_link(host).map_err(|e| Stage::io("rootfs.readlink", host, e))?)
    } else {
        restricted_clone(host, attrs, false)?
    };
    Ok(Some(Prepared {
        target: target.to_path_buf(),
        source,
    }))
}

const RO: u64 = sys::MOUNT_ATTR_RDONLY | sys::MOUNT_ATTR_NOSUID | sys::MOUNT_ATTR_NODEV;

/// Opens and clones every host source of the plan, with notes for the result on what
/// could not be done as planned (see [`InputOwners`]). Runs in the supervisor: as the
/// invoking user it can reach inputs under private directories (a root-owned 0700 temp
/// dir, say) that the cell's unprivileged identity could not traverse, and the detached
/// trees it creates can be attached in the cell's mount namespace.
pub fn prepare_sources(
    plan: &CellPlan,
    host: crate::host_identity::HostIdentity,
) -> Result<(Vec<Prepared>, Vec<String>), Stage> {
    let mut prepared = Vec::new();
    let mut notes = Vec::new();
    let mut owners = InputOwners::new(host);
    for mount in &plan.mounts {
        match mount {
            MountPlan::HostSystem { path, optional } => {
                prepared.extend(mirror_or_clone(path, path, RO, *optional)?);
            }
            MountPlan::ReadonlyInput { source, target } => {
                // Inputs may be scripts the payload runs (`/input/convert.sh`), so they keep
                // exec; they stay read-only, nosuid and nodev.
                let (tree, owner) = restricted_clone_with_owner(source, RO, true)?;
                if let Err(why) = owners.show_as_cell(&tree, owner) {
                    notes.push(format!(
                        "readonly input {}: its files keep their host owners (shown as nobody): {why}",
                        target.display()
                    ));
                }
                prepared.push(Prepared {
                    target: target.clone(),
                    source: tree,
                });
            }
            // Writable paths are fresh tmpfs mounts the cell makes itself.
            MountPlan::WritableTmpfs { .. } => {}
        }
    }
    for entry in &plan.etc {
        prepared.extend(prepare_etc_entry(entry)?);
    }
    Ok((prepared, notes))
}

/// One entry of the cell's `/etc` (the plan's vetted host entries and the contract's
/// additions), read-only and noexec: configuration, never code.
fn prepare_etc_entry(entry: &EtcEntry) -> Result<Option<Prepared>, Stage> {
    const ETC: u64 = RO | sys::MOUNT_ATTR_NOEXEC;
    match entry {
        // The host's own layout, symlinks included (`os-release` -> `../usr/lib/...`);
        // what this host lacks is skipped.
        EtcEntry::Host { path } => mirror_or_clone(path, path, ETC, true),
        // The operator named the file: a symlink is followed, and it must exist.
        EtcEntry::Contract { source, target } => Ok(Some(Prepared {
            target: target.clone(),
            source: restricted_clone(source, ETC, true)?,
        })),
    }
}

/// The cell's own cgroup directories, read-only under `/sys/fs/cgroup` where language
/// runtimes look for their limits (the JVM, Go, .NET and Node read `memory.max` /
/// `memory.limit_in_bytes` and `cpu.max` / `cpu.cfs_quota_us` there, found through
/// `/proc/self/mountinfo` and `/proc/self/cgroup`, which the cell's cgroup namespace roots
/// at this cgroup). `view` is `(target in the cell, host directory)`, from
/// [`crate::cgroup::CellCgroup::view`]. Read-only, nosuid, nodev, noexec: the cell reads
/// its own limits and usage and can change nothing (nor could it with write access: it
/// has no capabilities, and Landlock grants only reads there).
pub fn prepare_cgroup_view(view: &[(PathBuf, PathBuf)]) -> Result<Vec<Prepared>, Stage> {
    view.iter()
        .map(|(target, host)| {
            Ok(Prepared {
                target: target.clone(),
                source: restricted_clone(host, RO | sys::MOUNT_ATTR_NOEXEC, false)?,
            })
        })
        .collect()
}

/// The host's device nodes for the cell's `/dev`, cloned by the supervisor. They travel
/// with the id maps, so the cell can mask `/proc` (with `/dev/null`) before the release.
pub fn prepare_devices() -> Result<Vec<Prepared>, Stage> {
    DEVICE_NODES
        .iter()
        .map(|node| {
            let host = Path::new("/dev").join(node);
            // Device nodes must not be nodev, and read-only would not stop writes to them
            // anyway; nosuid+noexec is what applies.
            let source = restricted_clone(
                &host,
                sys::MOUNT_ATTR_NOSUID | sys::MOUNT_ATTR_NOEXEC,
                false,
            )?;
            Ok(Prepared {
                target: host,
                source,
            })
        })
        .collect()
}

/// Creates `path` and missing parents. Tries the leaf first: parents usually exist, and
/// every avoided syscall is paid back on every cell start.
fn mkdirs(path: &Path) -> Result<(), Stage> {
    match fs::DirBuilder::new().mode(0o755).create(path) {
        Ok(()) => return Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => return Ok(()),
        Err(_) => {}
    }
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(path)
        .map_err(|e| Stage::io("rootfs.mkdir", path, e))
}

fn tmpfs_options(size_bytes: u64, mode: &str) -> std::ffi::CString {
    std::ffi::CString::new(format!("size={size_bytes},mode={mode}")).expect("no NUL")
}

fn mount_tmpfs(
    target: &Path,
    size_bytes: u64,
    mode: &str,
    flags: libc::c_ulong,
) -> Result<(), Stage> {
    let options = tmpfs_options(size_bytes, mode);
    sys::mount(
        Some(Path::new("tmpfs")),
        target,
        Some(c"tmpfs"),
        flags,
        Some(&options),
    )
    .map_err(|e| Stage::io("rootfs.mount_tmpfs", target, e))
}

fn place(item: Prepared) -> Result<(), Stage> {
    let at = &item.target;
    if let Some(parent) = at.parent() {
        mkdirs(parent)?;
    }
    match item.source {
        Source::Symlink(link) => symlink(&link, at).map_err(|e| Stage::io("rootfs.symlink", at, e)),
        Source::Tree { fd, is_dir } => {
            if is_dir {
                mkdirs(at)?;
            } else {
                File::create(at).map_err(|e| Stage::io("rootfs.mountpoint", at, e))?;
            }
            sys::attach_mount(fd.as_fd(), at).map_err(|e| Stage::io("rootfs.attach", at, e))
        }
    }
}

fn write_text(path: &Path, text: &str) -> Result<(), Stage> {
    fs::write(path, text).map_err(|e| Stage::io("rootfs.write_etc", path, e))
}

/// The generated `/etc`: just enough for name lookups of the cell user and `localhost`.
fn write_etc(plan: &CellPlan) -> Result<(), Stage> {
    let etc = Path::new("/etc");
    mkdirs(etc)?;
    let (uid, gid) = (plan.identity.uid, plan.identity.gid);
    let home = plan.workdir.display();
    write_text(&etc.join("passwd"), &format!("cell:x:{uid}:{gid}:airlock cell:{home}:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"))?;
    write_text(
        &etc.join("group"),
        &format!("cell:x:{gid}:\nnogroup:x:65534:\n"),
    )?;
    write_text(
        &etc.join("hosts"),
        &format!(
            "127.0.0.1\tlocalhost\n::1\tlocalhost\n127.0.1.1\t{}\n",
            plan.hostname
        ),
    )?;
    write_text(&etc.join("hostname"), &format!("{}\n", plan.hostname))?;
    // A deny cell has no resolver (no resolv.conf, hosts from files only); an
    // allowlisted one asks the in-cell resolver of the transparent egress path.
    let hosts = match plan.network {
        NetworkPlan::Deny => "files",
        NetworkPlan::Allowlist { .. } => "files dns",
    };
    write_text(
        &etc.join("nsswitch.conf"),
        &format!("passwd: files\ngroup: files\nshadow: files\nhosts: {hosts}\n"),
    )?;
    Ok(())
}

/// The in-cell resolver of the transparent egress path; it answers at once (it never
/// asks anyone), so one short attempt is plenty.
fn resolv_conf() -> String {
    format!(
        "# airlock: answers only the allowlisted names, never forwards a query\n\
         nameserver {}\noptions timeout:2 attempts:1\n",
        airlock_contract::TRANSPARENT_DNS.ip()
    )
}

fn build_dev() -> Result<(), Stage> {
    let dev = Path::new("/dev");
    mkdirs(dev)?;
    mount_tmpfs(dev, 64 * 1024, "0755", libc::MS_NOSUID | libc::MS_NOEXEC)?;
    for (name, target) in [
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
        ("ptmx", "pts/ptmx"),
    ] {
        symlink(target, dev.join(name))
            .map_err(|e| Stage::io("rootfs.dev_symlink", &dev.join(name), e))?;
    }
    let pts = dev.join("pts");
    mkdirs(&pts)?;
    sys::mount(
        Some(Path::new("devpts")),
        &pts,
        Some(c"devpts"),
        libc::MS_NOSUID | libc::MS_NOEXEC,
        Some(c"newinstance,ptmxmode=0666,mode=0620"),
    )
    .map_err(|e| Stage::io("rootfs.devpts", &pts, e))
}

/// Where POSIX shared memory lives (`shm_open`, Python's `SharedMemory`).
const SHM: &str = "/dev/shm";

/// `/dev/shm`, sized by the plan: its pages are memory of the cell's cgroup, and filling
/// it is the `shm` ceiling (a write fails with ENOSPC, a page of a mapping with SIGBUS).
fn mount_shm(plan: &CellPlan) -> Result<(), Stage> {
    let shm = Path::new(SHM);
    mkdirs(shm)?;
    mount_tmpfs(
        shm,
        plan.limits.shm_bytes,
        "1777",
        libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
    )
}

/// Whether `/dev/shm` has no free blocks or inodes left (the `shm` ceiling).
pub fn shm_is_full() -> bool {
    matches!(sys::statfs_free(Path::new(SHM)), Ok((0, _)) | Ok((_, 0)))
}

const PROC_FLAGS: libc::c_ulong = libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC;

/// Docker's masked and read-only `/proc` paths (needs `/dev/null` in place).
fn restrict_proc() -> Result<(), Stage> {
    let proc_dir = Path::new("/proc");
    let hidden = PROC_FLAGS;
    let dev_null = Path::new("/dev/null");
    let empty_dir = tmpfs_options(4096, "0555");
    let masks = PROC_MASKED_DIRS
        .iter()
        .map(|name| (name, true))
        .chain(PROC_MASKED_FILES.iter().map(|name| (name, false)));
    for (name, is_dir) in masks {
        let path = proc_dir.join(name);
        let mounted = if is_dir {
            sys::mount(
                Some(Path::new("tmpfs")),
                &path,
                Some(c"tmpfs"),
                hidden | libc::MS_RDONLY,
                Some(&empty_dir),
            )
        } else {
            sys::mount(Some(dev_null), &path, None, libc::MS_BIND, None)
        };
        match mounted {
            Err(e) if e.raw_os_error() != Some(libc::ENOENT) => {
                return Err(Stage::io("rootfs.proc_mask", &path, e))
            }
            _ => {}
        }
    }
    for name in PROC_READONLY {
        let path = proc_dir.join(name);
        let file = match open_path(&path, false) {
            Ok(file) => file,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => continue,
            Err(e) => return Err(Stage::io("rootfs.proc_readonly", &path, e)),
        };
        let tree = sys::clone_mount_tree(file.as_fd())
            .map_err(|e| Stage::io("rootfs.proc_readonly", &path, e))?;
        sys::set_mount_attributes(
            tree.as_fd(),
            sys::MOUNT_ATTR_RDONLY
                | sys::MOUNT_ATTR_NOSUID
                | sys::MOUNT_ATTR_NODEV
                | sys::MOUNT_ATTR_NOEXEC,
            true,
        )
        .map_err(|e| Stage::io("rootfs.proc_readonly", &path, e))?;
        sys::attach_mount(tree.as_fd(), &path)
            .map_err(|e| Stage::io("rootfs.proc_readonly", &path, e))?;
    }
    Ok(())
}

/// First half, run as soon as the id maps exist (while the supervisor still writes the
/// audit record): the new root tmpfs with a fresh `/proc`, the pivot into it (the old
/// root is detached in the background: wait for the returned value before the payload
/// runs), then everything the cell creates itself - `/dev` with the host's device nodes
/// (`devices`, from the supervisor), the generated `/etc`, Docker's `/proc` masks and the
/// writable tmpfs mounts.
pub fn build_skeleton(
    plan: &CellPlan,
    devices: Vec<Prepared>,
) -> Result<sys::BackgroundDetach, Stage> {
    // Nothing we mount may propagate back to the host, and host mounts must not appear later.
    sys::mount(
        None,
        Path::new("/"),
        None,
        libc::MS_REC | libc::MS_PRIVATE,
        None,
    )
    .map_err(|e| Stage::io("rootfs.make_private", Path::new("/"), e))?;
    let staging = Path::new(STAGING);
    mount_tmpfs(
        staging,
        plan.rootfs.size_bytes,
        "0755",
        libc::MS_NOSUID | libc::MS_NODEV,
    )?;
    // A new proc is only allowed while a fully visible one exists in the namespace: the
    // host's, until the old root is detached.
    let proc_dir = staging.join("proc");
    mkdirs(&proc_dir)?;
    sys::mount(
        Some(Path::new("proc")),
        &proc_dir,
        Some(c"proc"),
        PROC_FLAGS,
        None,
    )
    .map_err(|e| Stage::io("rootfs.proc", &proc_dir, e))?;
    // The tmpfs becomes the root at once; the cell's own parts and the release's trees
    // are then placed at their final paths.
    std::env::set_current_dir(staging)
        .map_err(|e| Stage::io("rootfs.chdir_staging", staging, e))?;
    sys::pivot_root_to_cwd().map_err(|e| Stage::io("rootfs.pivot_root", staging, e))?;
    // The old root now sits on top of the new one; detaching it removes every host path.
    // Path walks start at this process's root, the new one, so the steps below do not see
    // the old root while it is being detached.
    let detach = sys::BackgroundDetach::start()
        .map_err(|e| Stage::io("rootfs.detach_old_root", Path::new("/"), e))?;
    std::env::set_current_dir("/")
        .map_err(|e| Stage::io("rootfs.chdir_root", Path::new("/"), e))?;
    build_dev()?;
    mount_shm(plan)?;
    for device in devices {
        place(device)?;
    }
    write_etc(plan)?;
    if matches!(plan.network, NetworkPlan::Allowlist { .. }) {
        write_text(Path::new("/etc/resolv.conf"), &resolv_conf())?;
    }
    restrict_proc()?;
    for mount in &plan.mounts {
        if let MountPlan::WritableTmpfs {
            target,
            size_bytes,
            exec,
        } = mount
        {
            mkdirs(target)?;
            mount_tmpfs(target, *size_bytes, "0755", writable_flags(*exec))?;
        }
    }
    Ok(detach)
}

/// Mount flags of a writable tmpfs. nosuid and nodev always: they are what stops a file
/// the payload writes from carrying privilege. `noexec` only when the plan withholds exec:
/// it is no boundary (an interpreter or `memfd_create` + `execve` runs the same code), so
/// it is a choice the contract makes, not a control.
fn writable_flags(exec: bool) -> libc::c_ulong {
    let always = libc::MS_NOSUID | libc::MS_NODEV;
    if exec {
        always
    } else {
        always | libc::MS_NOEXEC
    }
}

/// Second half, after release: attaches the supervisor's mount trees (system dirs,
/// inputs, `/etc` entries) and makes the root read-only. On return the working directory
/// is the plan's `workdir`.
pub fn finish(plan: &CellPlan, prepared: Vec<Prepared>) -> Result<(), Stage> {
    for item in prepared {
        place(item)?;
    }
    if plan.rootfs.readonly {
        let root = open_path(Path::new("/"), true)
            .map_err(|e| Stage::io("rootfs.readonly_root", Path::new("/"), e))?;
        sys::set_mount_attributes(
            root.as_fd(),
            sys::MOUNT_ATTR_RDONLY | sys::MOUNT_ATTR_NOSUID | sys::MOUNT_ATTR_NODEV,
            false,
        )
        .map_err(|e| Stage::io("rootfs.readonly_root", Path::new("/"), e))?;
    }
    std::env::set_current_dir(&plan.workdir)
        .map_err(|e| Stage::io("rootfs.chdir_workdir", &plan.workdir, e))?;
    // Verify we really are where the plan says (no symlink detour).
    let cwd =
        std::env::current_dir().map_err(|e| Stage::io("rootfs.verify_cwd", &plan.workdir, e))?;
    if cwd != plan.workdir {
        return Err(Stage::new(
            "rootfs.verify_cwd",
            format!(
                "working directory is {} instead of {}",
                cwd.display(),
                plan.workdir.display()
            ),
        ));
    }
    Ok(())
}

/// Writable mounts with no free blocks or inodes left (the `disk` ceiling).
pub fn full_writable_mounts(plan: &CellPlan) -> Vec<String> {
    plan.mounts
        .iter()
        .filter_map(|m| match m {
            MountPlan::WritableTmpfs { target, .. } => Some(target),
            _ => None,
        })
        .filter(|target| matches!(sys::statfs_free(target), Ok((0, _)) | Ok((_, 0))))
        .map(|t| t.display().to_string())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::writable_flags;

    #[test]
    fn writable_paths_are_always_nosuid_and_nodev_and_noexec_only_when_asked() {
        for exec in [true, false] {
            let flags = writable_flags(exec);
            assert_ne!(flags & libc::MS_NOSUID, 0, "exec={exec}");
            assert_ne!(flags & libc::MS_NODEV, 0, "exec={exec}");
            assert_eq!(flags & libc::MS_NOEXEC != 0, !exec, "exec={exec}");
        }
    }
}
