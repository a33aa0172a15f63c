//! The host side of one gVisor cell: its directory under [`STATE_ROOT`] (the bundle with
//! its root skeleton and `config.json`, runsc's state directory, runsc's log), the
//! size-capped host tmpfs of each writable path, and their removal.
//!
//! ```text
//! /run/airlock-gvisor/<cell>/          0711 root, like its parent: runsc's gofer runs as
//!                                      the sandbox root's host id, which must traverse it
//!                                      (`/run/airlock` is 0700, so not under it)
//!   bundle/config.json                 0600 root (the payload's environment is in it)
//!   bundle/rootfs/                     the read-only root: mount points, /etc files
//!   state/                             runsc --root
//!   runsc.log
//!   w/<n>/                             tmpfs (size=cap, nosuid, nodev), owned by the
//!                                      payload's host id: writable path n
//! ```

use crate::error::CellError;
use crate::sys;
use airlock_contract::{CellPlan, EtcEntry, MountPlan, RootImage};
use std::ffi::CString;
use std::fs;
use std::os::fd::OwnedFd;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Where gVisor cells keep their host side (root's, 0711; `doctor` reaps what a dead
/// supervisor left here).
pub const STATE_ROOT: &str = "/run/airlock-gvisor";

/// The size of a cell directory's tmpfs: the bundle's `config.json`, the root skeleton
/// (empty mount points and the generated `/etc` files) and runsc's state and log.
const CELL_DIR_BYTES: u64 = 16 << 20;

/// The host directories of one cell.
pub struct CellDir {
    pub dir: PathBuf,
    /// The writable paths' tmpfs mounts, in plan order, mounted so far.
    pub writable: Vec<PathBuf>,
}

impl CellDir {
    fn null_device_path(&self) -> PathBuf {
        self.dir.join("null")
    }

    /// The cell's own null device, opened for reading and writing: what runsc's
    /// processes get instead of the host's /dev/null (see [`CellDir::create`]).
    pub fn open_null(&self) -> Result<OwnedFd, CellError> {
        fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(self.null_device_path())
            .map(OwnedFd::from)
            .map_err(|e| CellError::io("the cell's null device", e))
    }

    pub fn bundle(&self) -> PathBuf {
        self.dir.join("bundle")
    }
    pub fn rootfs(&self) -> PathBuf {
        self.dir.join("bundle/rootfs")
    }
    pub fn state(&self) -> PathBuf {
        self.dir.join("state")
    }
    pub fn log(&self) -> PathBuf {
        self.dir.join("runsc.log")
    }

    /// Whether runsc's state directory still holds a container (`runsc run` removes its
    /// own when it ends; one killed on the way does not).
    pub fn runsc_state_left(&self) -> bool {
        fs::read_dir(self.state()).is_ok_and(|mut entries| entries.next().is_some())
    }

    /// The directory of a cell a dead supervisor left (doctor reaps it): its writable
    /// paths' tmpfs are whatever is mounted under its `w/`.
    pub fn existing(dir: &Path) -> CellDir {
        let writable = fs::read_dir(dir.join("w"))
            .map(|entries| entries.flatten().map(|e| e.path()).collect())
            .unwrap_or_default();
        CellDir {
            dir: dir.to_path_buf(),
            writable,
        }
    }

    /// Creates the cell's directory `name` (new: an existing one is an error).
    pub fn create(name: &str) -> Result<CellDir, CellError> {
        let root = Path::new(STATE_ROOT);
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o711)
            .create(root)
            .map_err(|e| CellError::io(STATE_ROOT, e))?;
        let dir = root.join(name);
        fs::DirBuilder::new()
            .mode(0o711)
            .create(&dir)
            .map_err(|e| CellError::io(format!("creating {}", dir.display()), e))?;
        // A tmpfs of its own, so that teardown detaches the whole tree at once: unlinking
        // the skeleton's entries one by one, while the dead sandbox's mount namespaces
        // that bound them are still being freed, took 3-60 ms per run. No mount flags: the
        // gofer remounts the root read-only inside its user namespace, where nosuid or
        // nodev here would be locked and the remount refused (as the host file system
        // under /run had none; the payload writes only to the writable paths' own tmpfs).
        let data = CString::new(format!("size={CELL_DIR_BYTES},mode=0711")).expect("no NUL");
        if let Err(e) = sys::mount(
            Some(Path::new("tmpfs")),
            &dir,
            Some(c"tmpfs"),
            0,
            Some(&data),
        ) {
            let _ = fs::remove_dir(&dir);
            return Err(CellError::io(
                format!("mounting the tmpfs {}", dir.display()),
                e,
            ));
        }
        let cell = CellDir {
            dir,
            writable: Vec::new(),
        };
        for sub in ["bundle", "bundle/rootfs", "state", "w"] {
            mkdir(&cell.dir.join(sub), 0o711)?;
        }
        // The null device runsc's processes get where there is no stdio: runsc chowns
        // its stdio to the sandbox's user, and the host's /dev/null was found owned by
        // `nobody` after a session's holder had it. This node is the cell's alone.
        sys::make_char_device(&cell.null_device_path(), 0o600, 1, 3)
            .map_err(|e| CellError::io("the cell's null device", e))?;
        // The root's own mode (the payload sees it as `/`).
        set_mode(&cell.rootfs(), 0o755)?;
        Ok(cell)
    }

    /// One tmpfs per writable path of `plan` (its size cap, nosuid, nodev, and noexec
    /// where the plan says), owned by the payload's host id `owner`.
    /// Where an OCI image's layer is bound for the gofer: runsc's gofer runs as the
    /// sandbox root's host id, which cannot traverse the directories a layer lives in
    /// (containerd's state is 0700), but can this cell directory's (0711).
    fn image(&self) -> PathBuf {
        self.dir.join("image")
    }

    /// Binds the plan's image layer (if it has an image root) read-only, nosuid, nodev at
    /// [`CellDir::image`]; `remove` detaches it.
    pub fn mount_image(&self, plan: &CellPlan) -> Result<(), CellError> {
        let Some(layer) = image_layer(plan)? else {
            return Ok(());
        };
        let image = self.image();
        mkdir(&image, 0o755)?;
        let failed = |e| CellError::io(format!("binding the image {}", layer.display()), e);
        sys::mount(Some(layer), &image, None, libc::MS_BIND, None).map_err(failed)?;
        let flags = libc::MS_REMOUNT | libc::MS_BIND | libc::MS_RDONLY;
        sys::mount(
            None,
            &image,
            None,
            flags | libc::MS_NOSUID | libc::MS_NODEV,
            None,
        )
        .map_err(failed)
    }

    pub fn mount_writable(&mut self, plan: &CellPlan, owner: u32) -> Result<(), CellError> {
        for mount in &plan.mounts {
            let MountPlan::WritableTmpfs {
                size_bytes, exec, ..
            } = mount
            else {
                continue;
            };
            let dir = self.dir.join("w").join(self.writable.len().to_string());
            mkdir(&dir, 0o700)?;
            let mut flags = libc::MS_NOSUID | libc::MS_NODEV;
            if !exec {
                flags |= libc::MS_NOEXEC;
            }
            let data = std::ffi::CString::new(format!(
                "size={size_bytes},mode=0755,uid={owner},gid={owner}"
            ))
            .expect("no NUL in numbers");
            sys::mount(
                Some(Path::new("tmpfs")),
                &dir,
                Some(c"tmpfs"),
                flags,
                Some(&data),
            )
            .map_err(|e| CellError::io(format!("mounting the tmpfs {}", dir.display()), e))?;
            self.writable.push(dir);
        }
        Ok(())
    }

    /// The root skeleton: the merged-`/usr` symlinks and the mount points of `plan`'s
    /// host mounts, and the generated `/etc` files. Returns the host system directories
    /// to bind and the `/etc` entries that exist on the host.
    #[allow(clippy::type_complexity)]
    #[allow(clippy::type_complexity)]
    pub fn build_root(
        &self,
        plan: &CellPlan,
    ) -> Result<(Vec<(PathBuf, PathBuf)>, Vec<(PathBuf, PathBuf)>), CellError> {
        let rootfs = self.rootfs();
        let bound = self.image();
        let image = image_layer(plan)?.map(|_| bound.as_path());
        let mut system = Vec::new();
        for mount in &plan.mounts {
            match mount {
                MountPlan::HostSystem { path, optional } => match fs::symlink_metadata(path) {
                    Ok(meta) if meta.file_type().is_symlink() => {
                        let target = fs::read_link(path)
                            .map_err(|e| CellError::io(path.display().to_string(), e))?;
                        symlink(&target, &under(&rootfs, path))?;
                    }
                    Ok(_) => {
                        mount_point(&rootfs, path, true)?;
                        system.push((path.clone(), path.clone()));
                    }
                    Err(_) if *optional => {}
                    Err(e) => return Err(CellError::io(path.display().to_string(), e)),
                },
                MountPlan::ReadonlyInput { source, target } => {
                    mount_point(&rootfs, target, source.is_dir())?;
                }
                MountPlan::WritableTmpfs { target, .. } => mount_point(&rootfs, target, true)?,
                MountPlan::ImageSystem { path, link } => {
                    let layer = image.ok_or_else(no_image_layer)?;
                    if let Some(source) = image_entry(&rootfs, layer, path, link.as_deref())? {
                        system.push((source, path.clone()));
                    }
                }
                // Not a host mount: the sandbox's own tmpfs, where the broker's
                // forwarder binds the socket (broker.rs); only its mount point is here.
                MountPlan::BrokerSocket { target, .. } => {
                    mount_point(&rootfs, super::broker::socket_dir(target)?, true)?
                }
            }
        }
        for dir in ["proc", "dev", "etc"] {
            mount_point(&rootfs, Path::new("/").join(dir).as_path(), true)?;
        }
        for (name, text) in airlock_contract::generated_etc_files(plan) {
            write_new(&rootfs.join("etc").join(name), text.as_bytes(), 0o644)?;
        }
        let etc = self.etc_entries(plan, &rootfs, image)?;
        Ok((system, etc))
    }

    /// The `/etc` entries of `plan` that exist on the host, each with its mount point.
    #[allow(clippy::type_complexity)]
    fn etc_entries(
        &self,
        plan: &CellPlan,
        rootfs: &Path,
        image: Option<&Path>,
    ) -> Result<Vec<(PathBuf, PathBuf)>, CellError> {
        let mut entries = Vec::new();
        for entry in &plan.etc {
            let (source, target, required) = match entry {
                EtcEntry::Host { path } => (path.clone(), path.clone(), false),
                EtcEntry::Contract { source, target } | EtcEntry::Pod { source, target } => {
                    (source.clone(), target.clone(), true)
                }
                EtcEntry::Image { path, link } => {
                    let layer = image.ok_or_else(no_image_layer)?;
                    if let Some(source) = image_entry(rootfs, layer, path, link.as_deref())? {
                        entries.push((source, path.clone()));
                    }
                    continue;
                }
            };
            // A host entry that is a symlink is mirrored as one, as in the native cell
            // (`/etc/mtab`, the time zone); a contract's source is followed.
            if !required {
                if let Ok(link) = fs::read_link(&source) {
                    symlink(&link, &under(rootfs, &target))?;
                    continue;
                }
            }
            match fs::metadata(&source) {
                Ok(meta) => {
                    mount_point(rootfs, &target, meta.is_dir())?;
                    entries.push((source, target));
                }
                Err(e) if required => {
                    return Err(CellError::io(source.display().to_string(), e));
                }
                Err(_) => {}
            }
        }
        Ok(entries)
    }

    /// Writes `config.json` (0600: it holds the payload's environment).
    pub fn write_spec(&self, json: &[u8]) -> Result<(), CellError> {
        write_new(&self.bundle().join("config.json"), json, 0o600)
    }

    /// Unmounts the writable tmpfs mounts and removes the directory. Returns what is
    /// left (a path that could not be removed or unmounted).
    pub fn remove(self) -> Vec<String> {
        let mut left = Vec::new();
        match sys::umount_detach(&self.image()) {
            Ok(()) => {}
            // No image root, or its bind is gone already.
            Err(e) if matches!(e.raw_os_error(), Some(libc::EINVAL | libc::ENOENT)) => {}
            Err(e) => left.push(format!("mount {}: {e}", self.image().display())),
        }
        for dir in &self.writable {
            match sys::umount_detach(dir) {
                Ok(()) => {}
                // Not a mount (a reaped cell whose tmpfs was never mounted, or is gone).
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {}
                Err(e) => left.push(format!("mount {}: {e}", dir.display())),
            }
        }
        match sys::umount_detach(&self.dir) {
            // Its tree goes with the mount; the mount point is left, empty.
            Ok(()) => {}
            // A directory of an earlier layout, or one whose tmpfs is already gone.
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {}
            Err(e) => left.push(format!("mount {}: {e}", self.dir.display())),
        }
        if let Err(e) = fs::remove_dir_all(&self.dir) {
            left.push(format!("{}: {e}", self.dir.display()));
        }
        left
    }
}

/// `cell_path` (absolute) below `rootfs`.
/// The image's one unpacked layer (a container's rootfs is one); `None` for the host
/// image. Stacking several layers (an overlayfs the gofer would serve) is not built for
/// this tier: refused, never run on something else.
fn image_layer(plan: &CellPlan) -> Result<Option<&Path>, CellError> {
    match &plan.rootfs.image {
        RootImage::Host => Ok(None),
        RootImage::Oci { layers, .. } => match layers.as_slice() {
            [single] => Ok(Some(single.as_path())),
            _ => Err(CellError::Unavailable {
                control: "gvisor.image",
                reason: format!(
                    "an OCI image root of {} layers on the gVisor tier (one layer is built)",
                    layers.len()
                ),
            }),
        },
    }
}

fn no_image_layer() -> CellError {
    CellError::Unavailable {
        control: "gvisor.image",
        reason: "an image entry in a plan without an OCI image root".into(),
    }
}

/// One entry of the image at `path` (a cell path): a symlink of the image (`link`) made
/// in the skeleton, else its mount point made and its host source returned, to bind
/// read-only. The source is refused if any component below the layer is a symlink:
/// runsc binds a host path following symlinks, and an image's link must never name a
/// host path.
fn image_entry(
    rootfs: &Path,
    layer: &Path,
    path: &Path,
    link: Option<&Path>,
) -> Result<Option<PathBuf>, CellError> {
    if let Some(target) = link {
        symlink(target, &under(rootfs, path))?;
        return Ok(None);
    }
    let mut source = layer.to_path_buf();
    let mut meta = None;
    for component in path.components().skip(1) {
        source.push(component);
        let found = fs::symlink_metadata(&source)
            .map_err(|e| CellError::io(source.display().to_string(), e))?;
        if found.file_type().is_symlink() {
            return Err(CellError::Unavailable {
                control: "gvisor.image",
                reason: format!(
                    "{} is a symlink in the image where the plan has none",
                    source.display()
                ),
            });
        }
        meta = Some(found);
    }
    mount_point(rootfs, path, meta.is_some_and(|m| m.is_dir()))?;
    Ok(Some(source))
}

fn under(rootfs: &Path, cell_path: &Path) -> PathBuf {
    rootfs.join(cell_path.strip_prefix("/").unwrap_or(cell_path))
}

/// A directory or an empty file at `cell_path` in the skeleton, parents included.
fn mount_point(rootfs: &Path, cell_path: &Path, dir: bool) -> Result<(), CellError> {
    let path = under(rootfs, cell_path);
    let parent = path.parent().unwrap_or(rootfs);
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(parent)
        .map_err(|e| CellError::io(format!("mount point {}", parent.display()), e))?;
    if dir {
        match fs::DirBuilder::new().mode(0o755).create(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && path.is_dir() => Ok(()),
            Err(e) => Err(CellError::io(format!("mount point {}", path.display()), e)),
        }
    } else {
        fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o644)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&path)
            .map(drop)
            .map_err(|e| CellError::io(format!("mount point {}", path.display()), e))
    }
}

fn symlink(target: &Path, link: &Path) -> Result<(), CellError> {
    std::os::unix::fs::symlink(target, link)
        .map_err(|e| CellError::io(format!("symlink {}", link.display()), e))
}

fn mkdir(path: &Path, mode: u32) -> Result<(), CellError> {
    fs::DirBuilder::new()
        .mode(mode)
        .create(path)
        .map_err(|e| CellError::io(format!("creating {}", path.display()), e))?;
    set_mode(path, mode)
}

/// The mode exactly (the umask is not the cell's business).
fn set_mode(path: &Path, mode: u32) -> Result<(), CellError> {
    fs::set_permissions(path, fs::Permissions::from_mode(mode))
        .map_err(|e| CellError::io(format!("chmod {}", path.display()), e))
}

fn write_new(path: &Path, bytes: &[u8], mode: u32) -> Result<(), CellError> {
    use std::io::Write;
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .map_err(|e| CellError::io(format!("writing {}", path.display()), e))?;
    file.write_all(bytes)
        .map_err(|e| CellError::io(format!("writing {}", path.display()), e))?;
    set_mode(path, mode)
}

/// Cells under [`STATE_ROOT`] whose supervisor is gone (the directory's name is its
/// cgroup's, `<supervisor pid>-<start time>-<ns>`), for `doctor`.
pub fn leftover_cells() -> Vec<PathBuf> {
    let Ok(entries) = fs::read_dir(STATE_ROOT) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            crate::cgroup::is_cell_name(&name) && !crate::cgroup::supervisor_alive(&name)
        })
        .map(|e| e.path())
        .collect()
}

/// Appends a mount, as its builder made it, to the spec's own.
pub(super) fn push_mount(
    spec: &mut airlock_oci::spec_types::Spec,
    built: Result<airlock_oci::spec_types::Mount, impl std::fmt::Display>,
) -> Result<(), CellError> {
    let mount = built.map_err(|e| CellError::Launch {
        stage: "runtime spec".into(),
        message: e.to_string(),
    })?;
    let mut mounts = spec.mounts().clone().unwrap_or_default();
    mounts.push(mount);
    spec.set_mounts(Some(mounts));
    Ok(())
}
