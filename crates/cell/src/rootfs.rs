//! Builds the cell's root filesystem inside its new mount namespace (runs in the cell's
//! pid 1, before privileges are dropped).
//!
//! Sources are cloned as detached mount trees by the supervisor, in the host's mount
//! namespace, so the staging tmpfs (mounted over `/tmp` of the cell's private mount
//! namespace, then pivoted into) cannot hide an input that lives under the host's `/tmp`.
//! Every clone is restricted (read-only, nosuid, nodev) with `mount_setattr(AT_RECURSIVE)`,
//! which, unlike a bind remount, also covers submounts.

use crate::kernel::Kernel;
use crate::stage::Stage;
use crate::sys;
use airlock_contract::{
    CellPlan, EtcEntry, MountFlags, MountKind, MountPlan, MountSpec, ProcMask, RootImage, RootStep,
    SHM,
};
use std::ffi::CString;
use std::fs::{self, File};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// Where the new root is assembled before `pivot_root`.
const STAGING: &str = "/tmp";

enum Source {
    Tree {
        fd: OwnedFd,
        is_dir: bool,
    },
    Symlink(PathBuf),
    /// A host path the cell clones itself, in its own mount namespace (see
    /// [`deferred_cgroup_view`]).
    Deferred {
        path: PathBuf,
        attrs: u64,
    },
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
    Tree {
        target: PathBuf,
        is_dir: bool,
    },
    Symlink {
        target: PathBuf,
        link: PathBuf,
    },
    Deferred {
        target: PathBuf,
        path: PathBuf,
        attrs: u64,
    },
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
            Source::Deferred { path, attrs } => PreparedWire::Deferred {
                target,
                path,
                attrs,
            },
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
                // Runs in the cell: the clone is made in its mount namespace.
                PreparedWire::Deferred {
                    target,
                    path,
                    attrs,
                } => Prepared {
                    target,
                    source: restricted_clone(&path, attrs, false)?,
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

/// A pod's own file (CRI's `hosts`, `hostname`, `resolv.conf`), cloned restricted: a
/// regular file, checked on the descriptor that is cloned; a symlink is refused, never
/// followed (nor mounted as a link, which would show the host path it names).
fn restricted_clone_file(path: &Path, attrs: u64) -> Result<Source, Stage> {
    let file = open_path(path, false).map_err(|e| Stage::io("rootfs.open_source", path, e))?;
    let meta = file
        .metadata()
        .map_err(|e| Stage::io("rootfs.stat_source", path, e))?;
    if !meta.is_file() {
        return Err(Stage::new(
            "rootfs.pod_file",
            format!(
                "{}: a pod's /etc file must be a regular file (a link is never followed)",
                path.display()
            ),
        ));
    }
    let fd =
        sys::clone_mount_tree(file.as_fd()).map_err(|e| Stage::io("rootfs.clone_tree", path, e))?;
    sys::set_mount_attributes(fd.as_fd(), attrs, true)
        .map_err(|e| Stage::io("rootfs.restrict_tree", path, e))?;
    Ok(Source::Tree { fd, is_dir: false })
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
    fn new(cell: Option<(u32, u32)>) -> InputOwners {
        InputOwners {
            cell,
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

/// `MOUNT_ATTR_*` bits of `flags`, for `mount_setattr`.
fn tree_attrs(flags: &MountFlags) -> u64 {
    [
        (flags.readonly, sys::MOUNT_ATTR_RDONLY),
        (flags.nosuid, sys::MOUNT_ATTR_NOSUID),
        (flags.nodev, sys::MOUNT_ATTR_NODEV),
        (flags.noexec, sys::MOUNT_ATTR_NOEXEC),
    ]
    .into_iter()
    .filter(|(set, _)| *set)
    .fold(0, |all, (_, attr)| all | attr)
}

/// Opens and clones every host source of the plan, with notes for the result on what
/// could not be done as planned (see [`InputOwners`]). Runs in the supervisor: as the
/// invoking user it can reach inputs under private directories (a root-owned 0700 temp
/// dir, say) that the cell's unprivileged identity could not traverse, and the detached
/// trees it creates can be attached in the cell's mount namespace. `cell_ids` is the cell
/// identity's host uid and gid when airlock runs as root (see [`InputOwners`]).
pub fn prepare_sources(
    plan: &CellPlan,
    cell_ids: Option<(u32, u32)>,
) -> Result<(Vec<Prepared>, Vec<String>), Stage> {
    let mut prepared = Vec::new();
    let mut notes = Vec::new();
    let mut owners = InputOwners::new(cell_ids);
    let image = ImageTree::open(plan)?;
    for mount in &plan.mounts {
        match mount {
            MountPlan::HostSystem { path, optional } => {
                let attrs = tree_attrs(&plan.layout.trees.system);
                prepared.extend(mirror_or_clone(path, path, attrs, *optional)?);
            }
            MountPlan::ImageSystem { path, link } => {
                let attrs = tree_attrs(&plan.layout.trees.system);
                prepared.push(image.entry(path, link, attrs)?);
            }
            MountPlan::ReadonlyInput { source, target } => {
                // Inputs may be scripts the payload runs (`/input/convert.sh`), so they keep
                // exec; they stay read-only, nosuid and nodev.
                let attrs = tree_attrs(&plan.layout.trees.inputs);
                let (tree, owner) = restricted_clone_with_owner(source, attrs, true)?;
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
            // The broker's socket (bound by the trusted side for this run): read-only,
            // nosuid, nodev, noexec; connecting to it needs none of those.
            MountPlan::BrokerSocket { source, target } => {
                let attrs = sys::MOUNT_ATTR_RDONLY
                    | sys::MOUNT_ATTR_NOSUID
                    | sys::MOUNT_ATTR_NODEV
                    | sys::MOUNT_ATTR_NOEXEC;
                prepared.push(Prepared {
                    target: target.clone(),
                    source: restricted_clone(source, attrs, false)?,
                });
            }
        }
    }
    for entry in &plan.etc {
        let attrs = tree_attrs(&plan.layout.trees.etc);
        prepared.extend(prepare_etc_entry(entry, attrs, &image)?);
    }
    Ok((prepared, notes))
}

/// Where the entries of an OCI image root are cloned from: the one unpacked layer as it
/// is, or a detached read-only overlayfs of the layers (no upper layer), reached through
/// its descriptor (`/proc/self/fd/N`). `None` for the host image.
struct ImageTree {
    root: Option<PathBuf>,
    _overlay: Option<OwnedFd>,
}

impl ImageTree {
    fn open(plan: &CellPlan) -> Result<ImageTree, Stage> {
        let RootImage::Oci {
            layers, reference, ..
        } = &plan.rootfs.image
        else {
            return Ok(ImageTree {
                root: None,
                _overlay: None,
            });
        };
        if let [single] = layers.as_slice() {
            return Ok(ImageTree {
                root: Some(single.clone()),
                _overlay: None,
            });
        }
        let dirs: Vec<&Path> = layers.iter().map(PathBuf::as_path).collect();
        let attrs = tree_attrs(&plan.layout.trees.system);
        let overlay = sys::overlay_lower_only(&dirs, attrs)
            .map_err(|e| Stage::new("rootfs.image_overlay", format!("{reference}: {e}")))?;
        Ok(ImageTree {
            root: Some(PathBuf::from(format!(
                "/proc/self/fd/{}",
                overlay.as_raw_fd()
            ))),
            _overlay: Some(overlay),
        })
    }

    /// The image's entry at `path` (absolute in the cell): its symlink as planned, or a
    /// restricted clone of its tree, never following a symlink the image controls.
    fn entry(&self, path: &Path, link: &Option<PathBuf>, attrs: u64) -> Result<Prepared, Stage> {
        let Some(root) = &self.root else {
            return Err(Stage::new(
                "rootfs.image_entry",
                format!("{}: the plan's root is not an image", path.display()),
            ));
        };
        let source = match link {
            Some(link) => Source::Symlink(link.clone()),
            None => {
                let below = path.strip_prefix("/").unwrap_or(path);
                restricted_clone(&root.join(below), attrs, false)?
            }
        };
        Ok(Prepared {
            target: path.to_path_buf(),
            source,
        })
    }
}

/// One entry of the cell's `/etc` (the plan's vetted host entries and the contract's
/// additions), read-only and noexec: configuration, never code.
fn prepare_etc_entry(
    entry: &EtcEntry,
    attrs: u64,
    image: &ImageTree,
) -> Result<Option<Prepared>, Stage> {
    match entry {
        // The image's own /etc: its shadow is the image's, never the host's.
        EtcEntry::Image { path, link } => image.entry(path, link, attrs).map(Some),
        // The host's own layout, symlinks included (`os-release` -> `../usr/lib/...`);
        // what this host lacks is skipped.
        EtcEntry::Host { path } => mirror_or_clone(path, path, attrs, true),
        // The operator named the file: a symlink is followed, and it must exist.
        EtcEntry::Contract { source, target } => Ok(Some(Prepared {
            target: target.clone(),
            source: restricted_clone(source, attrs, true)?,
        })),
        EtcEntry::Pod { source, target } => Ok(Some(Prepared {
            target: target.clone(),
            source: restricted_clone_file(source, attrs)?,
        })),
    }
}

/// The cell's own cgroup directories, read-only under `/sys/fs/cgroup` where language
/// runtimes look for their limits (the JVM, Go, .NET and Node read `memory.max` /
/// `memory.limit_in_bytes` and `cpu.max` / `cpu.cfs_quota_us` there, found through
/// `/proc/self/mountinfo` and `/proc/self/cgroup`, which the cell's cgroup namespace roots
/// at this cgroup). `view` is `(target in the cell, host directory)`, from
/// [`crate::cgroup::CellCgroup::view`]. Read-only, nosuid, nodev, noexec (the plan's
/// `trees.cgroup_view`): the cell reads its own limits and usage and can change nothing
/// (nor could it with write access: it has no capabilities, and Landlock grants only
/// reads there).
pub fn prepare_cgroup_view(
    plan: &CellPlan,
    view: &[(PathBuf, PathBuf)],
) -> Result<Vec<Prepared>, Stage> {
    let attrs = tree_attrs(&plan.layout.trees.cgroup_view);
    view.iter()
        .map(|(target, host)| {
            Ok(Prepared {
                target: target.clone(),
                source: restricted_clone(host, attrs, false)?,
            })
        })
        .collect()
}

/// [`prepare_cgroup_view`] for a supervisor that cannot clone mount trees (it is not
/// root: `open_tree(OPEN_TREE_CLONE)` needs CAP_SYS_ADMIN over the mount namespace, which
/// only the cell has, over its own): sent with the id maps instead of the device nodes,
/// it is cloned by the cell as it arrives, with every other source the cell then clones
/// for itself, all before its staging tmpfs and its pivot hide the host's paths
/// (`crates/cell/src/launcher.rs`).
pub fn deferred_cgroup_view(plan: &CellPlan, view: &[(PathBuf, PathBuf)]) -> Vec<Prepared> {
    let attrs = tree_attrs(&plan.layout.trees.cgroup_view);
    view.iter()
        .map(|(target, host)| Prepared {
            target: target.clone(),
            source: Source::Deferred {
                path: host.clone(),
                attrs,
            },
        })
        .collect()
}

/// The host's device nodes for the cell's `/dev`, cloned by the supervisor. They travel
/// with the id maps, so the cell can mask `/proc` (with `/dev/null`) before the release.
pub fn prepare_devices(plan: &CellPlan) -> Result<Vec<Prepared>, Stage> {
    let attrs = tree_attrs(&plan.layout.trees.dev_nodes);
    plan.layout
        .dev_nodes
        .iter()
        .map(|host| {
            let source = restricted_clone(host, attrs, false)?;
            Ok(Prepared {
                target: host.clone(),
                source,
            })
        })
        .collect()
}

fn mount_flags(flags: &MountFlags) -> libc::c_ulong {
    [
        (flags.readonly, libc::MS_RDONLY),
        (flags.nosuid, libc::MS_NOSUID),
        (flags.nodev, libc::MS_NODEV),
        (flags.noexec, libc::MS_NOEXEC),
    ]
    .into_iter()
    .filter(|(set, _)| *set)
    .fold(0, |all, (_, flag)| all | flag)
}

fn mode_option(mode: u32) -> String {
    format!("{mode:04o}")
}

/// Where `target` of the cell is before the pivot: below the staging directory.
fn staged(target: &Path) -> PathBuf {
    match target.strip_prefix("/") {
        Ok(below) if below.as_os_str().is_empty() => PathBuf::from(STAGING),
        Ok(below) => Path::new(STAGING).join(below),
        Err(_) => Path::new(STAGING).join(target),
    }
}

fn mount_spec<K: Kernel>(kernel: &mut K, spec: &MountSpec, at: &Path) -> Result<(), Stage> {
    let flags = mount_flags(&spec.flags);
    let (source, fstype, data, stage) = match spec.kind {
        MountKind::Tmpfs { size_bytes, mode } => (
            "tmpfs",
            c"tmpfs",
            Some(format!("size={size_bytes},mode={}", mode_option(mode))),
            "rootfs.mount_tmpfs",
        ),
        MountKind::Proc => ("proc", c"proc", None, "rootfs.proc"),
        MountKind::Devpts { ptmx_mode, mode } => (
            "devpts",
            c"devpts",
            Some(format!(
                "newinstance,ptmxmode={},mode={}",
                mode_option(ptmx_mode),
                mode_option(mode)
            )),
            "rootfs.devpts",
        ),
    };
    let data = data.map(|d| CString::new(d).expect("no NUL in mount options"));
    // The staging directory (the new root) exists already.
    if spec.target != Path::new("/") {
        mkdirs(kernel, at)?;
    }
    kernel
        .mount(
            Some(Path::new(source)),
            at,
            Some(fstype),
            flags,
            data.as_deref(),
        )
        .map_err(|e| Stage::io(stage, at, e))
}

fn mkdirs<K: Kernel>(kernel: &mut K, path: &Path) -> Result<(), Stage> {
    kernel
        .mkdirs(path)
        .map_err(|e| Stage::io("rootfs.mkdir", path, e))
}

fn place<K: Kernel>(kernel: &mut K, item: Prepared) -> Result<(), Stage> {
    let at = &item.target;
    if let Some(parent) = at.parent() {
        mkdirs(kernel, parent)?;
    }
    match item.source {
        Source::Symlink(link) => kernel
            .symlink(&link, at)
            .map_err(|e| Stage::io("rootfs.symlink", at, e)),
        Source::Tree { fd, is_dir } => {
            if is_dir {
                mkdirs(kernel, at)?;
            } else if kernel.is_dir(at) != Some(false) {
                // An existing file is its own mount point: one inside a read-only tree
                // (the run's trust bundle over the host's, egress_session.rs) cannot be
                // created again.
                kernel
                    .create_file(at)
                    .map_err(|e| Stage::io("rootfs.mountpoint", at, e))?;
            }
            kernel
                .attach_tree(fd, at)
                .map_err(|e| Stage::io("rootfs.attach", at, e))
        }
        // `from_wire` clones deferred sources as they arrive in the cell.
        Source::Deferred { path, .. } => Err(Stage::new(
            "rootfs.attach",
            format!("{}: a deferred source was never cloned", path.display()),
        )),
    }
}

/// Hides a `/proc` path (Docker's masks); a path this kernel lacks is skipped.
fn mask_proc<K: Kernel>(
    kernel: &mut K,
    path: &Path,
    with: ProcMask,
    flags: &MountFlags,
) -> Result<(), Stage> {
    let mounted = match with {
        ProcMask::EmptyDir => kernel.mount(
            Some(Path::new("tmpfs")),
            path,
            Some(c"tmpfs"),
            mount_flags(flags),
            Some(c"size=4096,mode=0555"),
        ),
        ProcMask::DevNull => kernel.mount(
            Some(Path::new("/dev/null")),
            path,
            None,
            libc::MS_BIND,
            None,
        ),
    };
    match mounted {
        Err(e) if e.raw_os_error() != Some(libc::ENOENT) => {
            Err(Stage::io("rootfs.proc_mask", path, e))
        }
        _ => Ok(()),
    }
}

fn readonly_proc<K: Kernel>(kernel: &mut K, path: &Path, flags: &MountFlags) -> Result<(), Stage> {
    match kernel.rebind_restricted(path, tree_attrs(flags)) {
        Err(e) if e.raw_os_error() != Some(libc::ENOENT) => {
            Err(Stage::io("rootfs.proc_readonly", path, e))
        }
        _ => Ok(()),
    }
}

/// First half, run as soon as the id maps exist (while the supervisor still writes the
/// audit record): walks the plan's root steps - the new root tmpfs with a fresh `/proc`,
/// the pivot into it (the old root is detached in the background: wait for the returned
/// value before the payload runs), then everything the cell creates itself: `/dev` with
/// the host's device nodes (`devices`, from the supervisor), the generated `/etc`,
/// Docker's `/proc` masks and the writable tmpfs mounts.
pub fn build_skeleton<K: Kernel>(
    kernel: &mut K,
    plan: &CellPlan,
    devices: Vec<Prepared>,
) -> Result<K::Detach, Stage> {
    // Nothing we mount may propagate back to the host, and host mounts must not appear later.
    kernel
        .mount(
            None,
            Path::new("/"),
            None,
            libc::MS_REC | libc::MS_PRIVATE,
            None,
        )
        .map_err(|e| Stage::io("rootfs.make_private", Path::new("/"), e))?;
    let mut detach = None;
    let mut devices = Some(devices);
    // The generated files share `/etc`: it is made once.
    let mut made_parent: Option<&Path> = None;
    for step in &plan.layout.root_steps {
        match step {
            RootStep::Mount(spec) if detach.is_none() => {
                mount_spec(kernel, spec, &staged(&spec.target))?
            }
            RootStep::Mount(spec) => mount_spec(kernel, spec, &spec.target)?,
            RootStep::PivotRoot => detach = Some(pivot(kernel)?),
            RootStep::Symlink { link, target } => kernel
                .symlink(target, link)
                .map_err(|e| Stage::io("rootfs.dev_symlink", link, e))?,
            RootStep::DeviceNodes => {
                for device in devices.take().unwrap_or_default() {
                    place(kernel, device)?;
                }
            }
            RootStep::WriteFile { path, text } => {
                let parent = path.parent();
                if let Some(parent) = parent.filter(|p| made_parent != Some(*p)) {
                    mkdirs(kernel, parent)?;
                }
                made_parent = parent;
                kernel
                    .write_file(path, text)
                    .map_err(|e| Stage::io("rootfs.write_etc", path, e))?
            }
            RootStep::MaskProc { path, with, flags } => mask_proc(kernel, path, *with, flags)?,
            RootStep::ReadonlyProc { path, flags } => readonly_proc(kernel, path, flags)?,
        }
    }
    detach.ok_or_else(|| Stage::new("rootfs.pivot_root", "the plan has no pivot step".into()))
}

/// The staged tmpfs becomes the root at once; the cell's own parts and the release's
/// trees are then placed at their final paths.
fn pivot<K: Kernel>(kernel: &mut K) -> Result<K::Detach, Stage> {
    let staging = Path::new(STAGING);
    kernel
        .chdir(staging)
        .map_err(|e| Stage::io("rootfs.chdir_staging", staging, e))?;
    kernel
        .pivot_root_to_cwd()
        .map_err(|e| Stage::io("rootfs.pivot_root", staging, e))?;
    // The old root now sits on top of the new one; detaching it removes every host path.
    // Path walks start at this process's root, the new one, so the steps after this do
    // not see the old root while it is being detached.
    let detach = kernel
        .start_detach()
        .map_err(|e| Stage::io("rootfs.detach_old_root", Path::new("/"), e))?;
    kernel
        .chdir(Path::new("/"))
        .map_err(|e| Stage::io("rootfs.chdir_root", Path::new("/"), e))?;
    Ok(detach)
}

/// Second half, after release: attaches the supervisor's mount trees (system dirs,
/// inputs, `/etc` entries) and makes the root read-only. On return the working directory
/// is the plan's `workdir`.
pub fn finish<K: Kernel>(
    kernel: &mut K,
    plan: &CellPlan,
    prepared: Vec<Prepared>,
) -> Result<(), Stage> {
    for item in prepared {
        place(kernel, item)?;
    }
    if plan.rootfs.readonly {
        kernel
            .restrict_root(tree_attrs(&plan.layout.trees.root))
            .map_err(|e| Stage::io("rootfs.readonly_root", Path::new("/"), e))?;
    }
    kernel
        .chdir(&plan.workdir)
        .map_err(|e| Stage::io("rootfs.chdir_workdir", &plan.workdir, e))?;
    // Verify we really are where the plan says (no symlink detour).
    let cwd = kernel
        .current_dir()
        .map_err(|e| Stage::io("rootfs.verify_cwd", &plan.workdir, e))?;
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

/// Whether `/dev/shm` has no free blocks or inodes left (the `shm` ceiling).
pub fn shm_is_full() -> bool {
    matches!(sys::statfs_free(Path::new(SHM)), Ok((0, _)) | Ok((_, 0)))
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
    use super::*;
    use crate::kernel::recording::{Call, RecordingKernel};
    use airlock_contract::{compile, parse_contract, CompileInput, ContractFormat};
    use std::ffi::CStr;

    fn plan(yaml: &str) -> CellPlan {
        let contract = parse_contract(yaml, ContractFormat::Yaml).unwrap();
        compile(
            &contract,
            &CompileInput::new(Path::new("/jobs"), &["true".to_owned()]),
        )
        .unwrap()
    }

    fn mount(
        source: Option<&str>,
        target: &str,
        fstype: Option<&CStr>,
        flags: libc::c_ulong,
        data: Option<&str>,
    ) -> Call {
        Call::Mount {
            source: source.map(PathBuf::from),
            target: target.into(),
            fstype: fstype.map(CStr::to_owned),
            flags,
            data: data.map(|d| CString::new(d).unwrap()),
        }
    }

    fn tmpfs(target: &str, flags: libc::c_ulong, data: &str) -> Call {
        mount(Some("tmpfs"), target, Some(c"tmpfs"), flags, Some(data))
    }

    fn mkdirs(path: &str) -> Call {
        Call::Mkdirs(path.into())
    }

    const NOSUID: libc::c_ulong = libc::MS_NOSUID;
    const NODEV: libc::c_ulong = libc::MS_NODEV;
    const NOEXEC: libc::c_ulong = libc::MS_NOEXEC;

    /// Everything up to and including the generated `/etc` of a deny-mode cell, without
    /// device nodes: the part every plan shares.
    fn common_prefix(shm_bytes: u64) -> Vec<Call> {
        let symlink = |target: &str, link: &str| Call::Symlink {
            target: target.into(),
            link: link.into(),
        };
        vec![
            mount(None, "/", None, libc::MS_REC | libc::MS_PRIVATE, None),
            tmpfs("/tmp", NOSUID | NODEV, "size=1048576,mode=0755"),
            mkdirs("/tmp/proc"),
            mount(
                Some("proc"),
                "/tmp/proc",
                Some(c"proc"),
                NOSUID | NODEV | NOEXEC,
                None,
            ),
            Call::Chdir("/tmp".into()),
            Call::PivotRoot,
            Call::StartDetach,
            Call::Chdir("/".into()),
            mkdirs("/dev"),
            tmpfs("/dev", NOSUID | NOEXEC, "size=65536,mode=0755"),
            symlink("/proc/self/fd", "/dev/fd"),
            symlink("/proc/self/fd/0", "/dev/stdin"),
            symlink("/proc/self/fd/1", "/dev/stdout"),
            symlink("/proc/self/fd/2", "/dev/stderr"),
            symlink("pts/ptmx", "/dev/ptmx"),
            mkdirs("/dev/pts"),
            mount(
                Some("devpts"),
                "/dev/pts",
                Some(c"devpts"),
                NOSUID | NOEXEC,
                Some("newinstance,ptmxmode=0666,mode=0620"),
            ),
            mkdirs("/dev/shm"),
            tmpfs(
                "/dev/shm",
                NOSUID | NODEV | NOEXEC,
                &format!("size={shm_bytes},mode=1777"),
            ),
        ]
    }

    fn proc_masks() -> Vec<Call> {
        let hidden = NOSUID | NODEV | NOEXEC | libc::MS_RDONLY;
        let mut calls: Vec<Call> = ["acpi", "asound", "scsi"]
            .iter()
            .map(|d| tmpfs(&format!("/proc/{d}"), hidden, "size=4096,mode=0555"))
            .collect();
        for file in [
            "interrupts",
            "kcore",
            "keys",
            "latency_stats",
            "sched_debug",
            "timer_list",
            "timer_stats",
        ] {
            calls.push(mount(
                Some("/dev/null"),
                &format!("/proc/{file}"),
                None,
                libc::MS_BIND,
                None,
            ));
        }
        for path in ["bus", "fs", "irq", "sys", "sysrq-trigger"] {
            calls.push(Call::RebindRestricted {
                path: format!("/proc/{path}").into(),
                attrs: sys::MOUNT_ATTR_RDONLY
                    | sys::MOUNT_ATTR_NOSUID
                    | sys::MOUNT_ATTR_NODEV
                    | sys::MOUNT_ATTR_NOEXEC,
            });
        }
        calls
    }

    fn written(calls: &[Call]) -> Vec<(String, String)> {
        calls
            .iter()
            .filter_map(|c| match c {
                Call::WriteFile { path, text } => Some((path.display().to_string(), text.clone())),
                _ => None,
            })
            .collect()
    }

    fn skeleton(plan: &CellPlan, devices: Vec<Prepared>) -> Vec<Call> {
        let mut kernel = RecordingKernel::default();
        build_skeleton(&mut kernel, plan, devices).unwrap();
        kernel.calls
    }

    #[test]
    fn the_default_cell_builds_its_root_in_the_planned_order() {
        let plan = plan("{}\n");
        let mut expected = common_prefix(64 << 20);
        expected.push(mkdirs("/etc"));
        for name in ["passwd", "group", "hosts", "hostname", "nsswitch.conf"] {
            expected.push(Call::WriteFile {
                path: Path::new("/etc").join(name),
                text: written(&skeleton(&plan, vec![]))
                    .into_iter()
                    .find(|(p, _)| *p == format!("/etc/{name}"))
                    .unwrap()
                    .1,
            });
        }
        expected.extend(proc_masks());
        expected.push(mkdirs("/tmp"));
        expected.push(tmpfs("/tmp", NOSUID | NODEV, "size=16777216,mode=0755"));
        assert_eq!(skeleton(&plan, vec![]), expected);
    }

    #[test]
    fn the_generated_etc_names_the_cell_user_and_has_no_resolver_in_deny_mode() {
        let files = written(&skeleton(&plan("hostname: box\nworkdir: /tmp/w\n"), vec![]));
        let text = |name: &str| {
            files
                .iter()
                .find(|(p, _)| *p == format!("/etc/{name}"))
                .map(|(_, t)| t.clone())
        };
        assert_eq!(
            text("passwd").unwrap(),
            "cell:x:10001:10001:airlock cell:/tmp/w:/bin/sh\n\
             nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
        );
        assert_eq!(text("group").unwrap(), "cell:x:10001:\nnogroup:x:65534:\n");
        assert_eq!(
            text("hosts").unwrap(),
            "127.0.0.1\tlocalhost\n::1\tlocalhost\n127.0.1.1\tbox\n"
        );
        assert_eq!(text("hostname").unwrap(), "box\n");
        assert!(text("nsswitch.conf").unwrap().ends_with("hosts: files\n"));
        assert_eq!(text("resolv.conf"), None);
    }

    #[test]
    fn an_allowlisted_cell_gets_the_in_cell_resolver() {
        let plan = plan("network:\n  mode: allowlist\n  allowed_domains: [api.test]\n");
        let files = written(&skeleton(&plan, vec![]));
        let names: Vec<&str> = files.iter().map(|(p, _)| p.as_str()).collect();
        assert_eq!(
            names,
            [
                "/etc/passwd",
                "/etc/group",
                "/etc/hosts",
                "/etc/hostname",
                "/etc/nsswitch.conf",
                "/etc/resolv.conf"
            ]
        );
        assert!(files[4].1.ends_with("hosts: files dns\n"));
        let resolver = airlock_contract::TRANSPARENT_DNS.ip();
        assert!(
            files[5].1.contains(&format!("nameserver {resolver}\n")),
            "{}",
            files[5].1
        );
    }

    #[test]
    fn writable_paths_come_last_each_nosuid_nodev_and_noexec_only_when_asked() {
        let plan = plan(
            "filesystem:\n  writable_paths: [output, { path: data, exec: false, size_mb: 2 }]\n",
        );
        let calls = skeleton(&plan, vec![]);
        let tail = &calls[calls.len() - 4..];
        assert_eq!(
            tail,
            [
                mkdirs("/output"),
                tmpfs("/output", NOSUID | NODEV, "size=16777216,mode=0755"),
                mkdirs("/data"),
                tmpfs("/data", NOSUID | NODEV | NOEXEC, "size=2097152,mode=0755"),
            ]
        );
        // The masks come right before the writable paths.
        let masks = proc_masks();
        assert_eq!(calls[calls.len() - 4 - masks.len()..calls.len() - 4], masks);
    }

    #[test]
    fn device_nodes_are_placed_after_shm_and_before_etc() {
        let plan = plan("{}\n");
        let null = File::open("/dev/null").unwrap();
        let devices = vec![
            Prepared {
                target: "/dev/null".into(),
                source: Source::Tree {
                    fd: OwnedFd::from(null),
                    is_dir: false,
                },
            },
            Prepared {
                target: "/dev/tty".into(),
                source: Source::Symlink("/dev/pts/0".into()),
            },
        ];
        let calls = skeleton(&plan, devices);
        let prefix = common_prefix(64 << 20);
        assert_eq!(calls[..prefix.len()], prefix);
        assert_eq!(
            calls[prefix.len()..prefix.len() + 5],
            [
                mkdirs("/dev"),
                Call::CreateFile("/dev/null".into()),
                Call::AttachTree("/dev/null".into()),
                mkdirs("/dev"),
                Call::Symlink {
                    target: "/dev/pts/0".into(),
                    link: "/dev/tty".into()
                },
            ]
        );
        assert_eq!(calls[prefix.len() + 5], mkdirs("/etc"));
    }

    #[test]
    fn the_supervisors_trees_get_the_plans_restrictions() {
        let trees = plan("{}\n").layout.trees;
        let ro = sys::MOUNT_ATTR_RDONLY | sys::MOUNT_ATTR_NOSUID | sys::MOUNT_ATTR_NODEV;
        assert_eq!(tree_attrs(&trees.system), ro);
        assert_eq!(tree_attrs(&trees.inputs), ro, "inputs stay executable");
        assert_eq!(tree_attrs(&trees.etc), ro | sys::MOUNT_ATTR_NOEXEC);
        assert_eq!(tree_attrs(&trees.cgroup_view), ro | sys::MOUNT_ATTR_NOEXEC);
        assert_eq!(
            tree_attrs(&trees.dev_nodes),
            sys::MOUNT_ATTR_NOSUID | sys::MOUNT_ATTR_NOEXEC,
            "device nodes must not be nodev"
        );
        assert_eq!(tree_attrs(&trees.root), ro);
    }

    #[test]
    fn finish_attaches_the_trees_then_makes_the_root_read_only_and_enters_the_workdir() {
        let plan = plan("filesystem:\n  readonly_inputs: [input]\n  writable_paths: [tmp]\n");
        let dir = File::open("/").unwrap();
        let trees = vec![
            Prepared {
                target: "/usr".into(),
                source: Source::Tree {
                    fd: OwnedFd::from(dir),
                    is_dir: true,
                },
            },
            Prepared {
                target: "/lib".into(),
                source: Source::Symlink("usr/lib".into()),
            },
        ];
        let mut kernel = RecordingKernel::default();
        finish(&mut kernel, &plan, trees).unwrap();
        assert_eq!(
            kernel.calls,
            [
                mkdirs("/"),
                mkdirs("/usr"),
                Call::AttachTree("/usr".into()),
                mkdirs("/"),
                Call::Symlink {
                    target: "usr/lib".into(),
                    link: "/lib".into()
                },
                Call::RestrictRoot(
                    sys::MOUNT_ATTR_RDONLY | sys::MOUNT_ATTR_NOSUID | sys::MOUNT_ATTR_NODEV
                ),
                Call::Chdir("/tmp".into()),
            ]
        );
        let writable_root = self::plan("filesystem:\n  readonly_root: false\n");
        let mut kernel = RecordingKernel::default();
        finish(&mut kernel, &writable_root, vec![]).unwrap();
        assert_eq!(kernel.calls, [Call::Chdir("/tmp".into())]);
    }

    #[test]
    fn a_plan_without_a_pivot_is_refused() {
        let mut plan = plan("{}\n");
        plan.layout.root_steps.retain(|s| *s != RootStep::PivotRoot);
        let mut kernel = RecordingKernel::default();
        let error = build_skeleton(&mut kernel, &plan, vec![]).unwrap_err();
        assert_eq!(error.name, "rootfs.pivot_root");
    }
}
