//! A session's files, reached from the host through the cell's root
//! (`/proc/<cell pid 1>/root`) and only within the plan's writable paths.
//!
//! A path is resolved as the cell itself resolves it: from the cell's root with
//! `RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS`, so `..` and the symlinks the payload planted
//! (absolute ones too) resolve within the cell's root, never the host's; whatever it
//! resolves to must then lie on one of the writable mounts (compared by mount id). The
//! last component is never followed (`O_NOFOLLOW`).
//!
//! Nothing the cell made can stall the thread that serves the request: the target is
//! first opened `O_PATH` (which opens nothing: no FIFO waits for a peer, no device runs
//! its open), its type is checked with `fstat`, and only a regular file (or, to list, a
//! directory) is then reopened through `/proc/thread-self/fd` — the very inode checked,
//! with `O_NONBLOCK | O_NOCTTY`. A FIFO, a socket, a device or a symlink is a 400
//! `path.kind` naming the path and its type. Every operation has a byte bound
//! (`max_file_bytes`) and a deadline ([`Deadline`]).
//!
//! Everything past the cell's root is done as the writable mount's owner (the cell's host
//! identity), on the calling thread only: the kernel refuses to create a file for an id
//! its tmpfs (made in the cell's user namespace) cannot represent, written files belong
//! to the cell, and the service reads no more of the cell than the cell's own identity can.

use crate::error::ApiError;
use airlock_cell::report::ResultClass;
use airlock_contract::{CellPlan, MountPlan};
use axum::http::StatusCode;
use rustix::fs::{AtFlags, FileType, Mode, OFlags, ResolveFlags, StatxFlags};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Component, Path, PathBuf};
use std::time::{Duration, Instant};

/// Bytes read or written between two looks at the deadline.
const CHUNK: usize = 64 << 10;

/// When a file operation must have ended: checked between its steps and chunks (the
/// caller also stops waiting for it then: see `AppState::blocking`).
#[derive(Debug, Clone, Copy)]
pub struct Deadline {
    at: Instant,
    limit: Duration,
}

impl Deadline {
    pub fn after(limit: Duration) -> Deadline {
        Deadline {
            at: Instant::now() + limit,
            limit,
        }
    }

    fn check(&self, shown: &Path) -> Result<(), ApiError> {
        if Instant::now() < self.at {
            return Ok(());
        }
        Err(timed_out(&shown.display().to_string(), self.limit))
    }
}

/// The answer to an operation past its deadline.
pub fn timed_out(what: &str, limit: Duration) -> ApiError {
    let mut err = ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        ResultClass::CapacityExceeded,
        "file.deadline",
        format!(
            "{what}: not done within server.file_op_timeout_ms ({} ms)",
            limit.as_millis()
        ),
    );
    err.retry_after = Some(1);
    err
}

/// The cell paths files may be written in: the plan's writable tmpfs mounts.
pub fn writable_paths(plan: &CellPlan) -> Vec<PathBuf> {
    plan.mounts
        .iter()
        .filter_map(|m| match m {
            MountPlan::WritableTmpfs { target, .. } => Some(target.clone()),
            _ => None,
        })
        .collect()
}

/// A request's cell path split into its writable mount and the path within it. Only
/// plain components: no `.`, no `..`, nothing empty, no NUL byte (no kernel path can
/// hold one: 422, before anything is opened).
pub fn locate(path: &str, writable: &[PathBuf]) -> Result<(PathBuf, PathBuf), ApiError> {
    if path.contains('\0') {
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            ResultClass::PolicyDenied,
            "path.invalid",
            format!(
                "{:?}: a path cannot hold a NUL byte",
                path.chars().take(256).collect::<String>()
            ),
        ));
    }
    let path = Path::new("/").join(path.trim_start_matches('/'));
    for component in path.components() {
        if !matches!(component, Component::RootDir | Component::Normal(_)) {
            return Err(ApiError::bad_request(
                "path.invalid",
                format!("{}: only plain path components (no `..`)", path.display()),
            ));
        }
    }
    writable
        .iter()
        .filter_map(|mount| {
            path.strip_prefix(mount)
                .ok()
                .map(|rest| (mount.clone(), rest.to_path_buf()))
        })
        .max_by_key(|(mount, _)| mount.as_os_str().len())
        .ok_or_else(|| {
            ApiError::forbidden(
                "path.not_writable",
                format!(
                    "{} is not within the session's writable paths",
                    path.display()
                ),
            )
        })
}

fn io_error(path: &Path, err: rustix::io::Errno) -> ApiError {
    use rustix::io::Errno;
    let shown = path.display();
    match err {
        Errno::NOENT => ApiError::not_found("file"),
        Errno::LOOP | Errno::XDEV => ApiError::forbidden(
            "path.escapes",
            format!("{shown}: the path leaves the session's writable paths"),
        ),
        Errno::FBIG | Errno::NOSPC | Errno::DQUOT => ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            ResultClass::CapacityExceeded,
            "file.too_large",
            format!("{shown}: {err}"),
        ),
        Errno::ISDIR | Errno::NOTDIR | Errno::NXIO => {
            ApiError::bad_request("path.kind", format!("{shown}: {err}"))
        }
        Errno::ACCESS | Errno::PERM | Errno::ROFS => ApiError::forbidden(
            "path.denied",
            format!("{shown}: {err} (as the cell's own identity)"),
        ),
        Errno::EXIST => ApiError::new(
            StatusCode::CONFLICT,
            ResultClass::PolicyDenied,
            "path.changed",
            format!("{shown}: created by the cell while it was being written"),
        ),
        Errno::SRCH => ApiError::not_found("session"),
        _ => ApiError::internal("file.io", format!("{shown}: {err}")),
    }
}

/// What a file is, as an answer names it.
fn kind_name(kind: FileType) -> &'static str {
    match kind {
        FileType::RegularFile => "a regular file",
        FileType::Directory => "a directory",
        FileType::Fifo => "a FIFO",
        FileType::Socket => "a unix socket",
        FileType::Symlink => "a symbolic link",
        FileType::CharacterDevice => "a character device",
        FileType::BlockDevice => "a block device",
        FileType::Unknown => "a file of unknown type",
    }
}

/// The pure decision: is a file of this type one the operation may open?
fn kind_allowed(kind: FileType, wanted: FileType, shown: &Path) -> Result<(), ApiError> {
    if kind == wanted {
        return Ok(());
    }
    Err(ApiError::bad_request(
        "path.kind",
        format!(
            "{}: {}, not {}",
            shown.display(),
            kind_name(kind),
            kind_name(wanted)
        ),
    ))
}

/// The cell's root: `root` is a magic link, followed here on purpose. Opening it through
/// the held /proc/<pid> descriptor fails once that process is gone (ESRCH), so a reused
/// pid can never be another process's root.
fn open_root(proc_dir: &OwnedFd, shown: &Path) -> Result<OwnedFd, ApiError> {
    rustix::fs::openat(
        proc_dir.as_fd(),
        "root",
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| io_error(shown, e))
}

/// The id of the mount `fd` is on. A kernel that does not report it (before 5.8) cannot
/// tell a writable mount from another: an error, never a check that passes by default.
fn mount_id(fd: &OwnedFd, shown: &Path) -> Result<u64, ApiError> {
    let st = rustix::fs::statx(fd, "", AtFlags::EMPTY_PATH, StatxFlags::MNT_ID)
        .map_err(|e| io_error(shown, e))?;
    if !StatxFlags::from_bits_retain(st.stx_mask).contains(StatxFlags::MNT_ID) {
        return Err(ApiError::internal(
            "file.io",
            format!(
                "{}: the kernel does not report mount ids (statx STATX_MNT_ID, Linux 5.8)",
                shown.display()
            ),
        ));
    }
    Ok(st.stx_mnt_id)
}

/// The writable mount `mount` inside the cell's root, with no symlink at all on its way
/// (its path is the operator's).
fn open_mount(root: &OwnedFd, mount: &Path) -> Result<OwnedFd, ApiError> {
    let relative = mount.strip_prefix("/").unwrap_or(mount);
    rustix::fs::openat2(
        root.as_fd(),
        relative,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
        ResolveFlags::IN_ROOT | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
    )
    .map_err(|e| io_error(mount, e))
}

/// Where a request's path is looked up: the cell's root, the mount its path names, and
/// the ids of every writable mount (what it may resolve to).
struct Cell {
    root: OwnedFd,
    mount: OwnedFd,
    writable_ids: Vec<u64>,
}

impl Cell {
    fn open(proc_dir: &OwnedFd, writable: &[PathBuf], mount: &Path) -> Result<Cell, ApiError> {
        let root = open_root(proc_dir, mount)?;
        let mut writable_ids = Vec::with_capacity(writable.len());
        for path in writable {
            writable_ids.push(mount_id(&open_mount(&root, path)?, path)?);
        }
        let mount = open_mount(&root, mount)?;
        Ok(Cell {
            root,
            mount,
            writable_ids,
        })
    }

    /// `path` (absolute, in the cell) as an `O_PATH` descriptor, resolved as the cell
    /// would (its root is `/`), its last component not followed; refused unless it is on
    /// a writable mount.
    fn resolve(&self, path: &Path, shown: &Path) -> Result<OwnedFd, ApiError> {
        self.resolve_with(path, OFlags::NOFOLLOW, shown)
    }

    /// The directory a new file at `shown` goes in: `dir` is a component of the request's
    /// path, not its last, so a symlink there is followed (within the cell's root).
    fn resolve_dir(&self, dir: &Path, shown: &Path) -> Result<OwnedFd, ApiError> {
        self.resolve_with(dir, OFlags::empty(), shown)
    }

    fn resolve_with(&self, path: &Path, follow: OFlags, shown: &Path) -> Result<OwnedFd, ApiError> {
        let relative = path.strip_prefix("/").unwrap_or(path);
        let relative = if relative.as_os_str().is_empty() {
            Path::new(".")
        } else {
            relative
        };
        let fd = rustix::fs::openat2(
            self.root.as_fd(),
            relative,
            OFlags::PATH | follow | OFlags::CLOEXEC,
            Mode::empty(),
            ResolveFlags::IN_ROOT | ResolveFlags::NO_MAGICLINKS,
        )
        .map_err(|e| io_error(shown, e))?;
        self.on_writable_mount(&fd, shown)?;
        Ok(fd)
    }

    fn on_writable_mount(&self, fd: &OwnedFd, shown: &Path) -> Result<(), ApiError> {
        if self.writable_ids.contains(&mount_id(fd, shown)?) {
            return Ok(());
        }
        Err(ApiError::forbidden(
            "path.escapes",
            format!(
                "{}: resolves (in the cell) outside the session's writable paths",
                shown.display()
            ),
        ))
    }
}

fn file_type(fd: &OwnedFd, shown: &Path) -> Result<(FileType, u64), ApiError> {
    let st = rustix::fs::fstat(fd).map_err(|e| io_error(shown, e))?;
    Ok((FileType::from_raw_mode(st.st_mode), st.st_size as u64))
}

/// The inode behind an `O_PATH` descriptor, opened for I/O: the same inode whose type was
/// checked, whatever the cell renamed meanwhile. Never blocks (`O_NONBLOCK`), never
/// becomes a controlling terminal.
fn reopen(checked: &OwnedFd, flags: OFlags, shown: &Path) -> Result<OwnedFd, ApiError> {
    rustix::fs::open(
        format!("/proc/thread-self/fd/{}", checked.as_raw_fd()),
        flags | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| io_error(shown, e))
}

/// Runs `f` on this thread as the owner of `mount_fd` (effective uid and gid; the saved
/// ids stay, so the thread's own come back after). A thread that cannot get its own
/// identity back must not serve anything else: the process aborts.
fn as_owner_of<T>(
    mount_fd: &OwnedFd,
    shown: &Path,
    f: impl FnOnce() -> Result<T, ApiError>,
) -> Result<T, ApiError> {
    use rustix::thread::{set_thread_res_gid, set_thread_res_uid};
    let owner = rustix::fs::fstat(mount_fd).map_err(|e| io_error(shown, e))?;
    let (uid, gid) = (rustix::process::geteuid(), rustix::process::getegid());
    let to = |e| io_error(shown, e);
    set_thread_res_gid(None, Some(rustix::fs::Gid::from_raw(owner.st_gid)), None).map_err(to)?;
    if let Err(err) = set_thread_res_uid(None, Some(rustix::fs::Uid::from_raw(owner.st_uid)), None)
    {
        if set_thread_res_gid(None, Some(gid), None).is_err() {
            std::process::abort();
        }
        return Err(to(err));
    }
    let result = f();
    if set_thread_res_uid(None, Some(uid), None).is_err()
        || set_thread_res_gid(None, Some(gid), None).is_err()
    {
        std::process::abort();
    }
    result
}

/// The regular file at `path` opened for writing and truncated, or created (as a regular
/// file, `O_EXCL`) in its directory when there is none.
fn open_for_write(cell: &Cell, path: &Path, shown: &Path) -> Result<OwnedFd, ApiError> {
    match cell.resolve(path, shown) {
        Ok(existing) => {
            kind_allowed(file_type(&existing, shown)?.0, FileType::RegularFile, shown)?;
            reopen(&existing, OFlags::WRONLY | OFlags::TRUNC, shown)
        }
        Err(err) if err.status == StatusCode::NOT_FOUND => {
            let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
                return Err(err);
            };
            let dir = cell.resolve_dir(parent, shown)?;
            kind_allowed(file_type(&dir, shown)?.0, FileType::Directory, shown)?;
            let dir = reopen(&dir, OFlags::RDONLY | OFlags::DIRECTORY, shown)?;
            rustix::fs::openat(
                &dir,
                name,
                OFlags::WRONLY
                    | OFlags::CREATE
                    | OFlags::EXCL
                    | OFlags::NOFOLLOW
                    | OFlags::NONBLOCK
                    | OFlags::NOCTTY
                    | OFlags::CLOEXEC,
                Mode::from_raw_mode(0o644),
            )
            .map_err(|e| io_error(shown, e))
        }
        Err(err) => Err(err),
    }
}

/// Writes `data` at `path` (created or truncated) as the cell's identity.
pub fn write(
    proc_dir: &OwnedFd,
    writable: &[PathBuf],
    path: &str,
    data: &[u8],
    deadline: Deadline,
) -> Result<u64, ApiError> {
    let (mount, rest) = locate(path, writable)?;
    let shown = mount.join(&rest);
    if rest.as_os_str().is_empty() {
        return Err(ApiError::bad_request(
            "path.kind",
            format!("{}: a directory, not a regular file", shown.display()),
        ));
    }
    let cell = Cell::open(proc_dir, writable, &mount)?;
    let file = as_owner_of(&cell.mount, &shown, || {
        open_for_write(&cell, &shown, &shown)
    })?;
    // The created or reopened inode is checked again: nothing but a regular file on a
    // writable mount is ever written.
    kind_allowed(file_type(&file, &shown)?.0, FileType::RegularFile, &shown)?;
    cell.on_writable_mount(&file, &shown)?;
    let mut file = std::fs::File::from(file);
    for chunk in data.chunks(CHUNK) {
        deadline.check(&shown)?;
        std::io::Write::write_all(&mut file, chunk).map_err(|e| io_error_of(&shown, &e))?;
    }
    Ok(data.len() as u64)
}

fn io_error_of(shown: &Path, err: &std::io::Error) -> ApiError {
    io_error(
        shown,
        rustix::io::Errno::from_io_error(err).unwrap_or(rustix::io::Errno::IO),
    )
}

fn too_large(shown: &Path, cap: usize) -> ApiError {
    ApiError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        ResultClass::CapacityExceeded,
        "file.too_large",
        format!(
            "{}: larger than server.max_file_bytes ({cap})",
            shown.display()
        ),
    )
}

/// The content of the regular file at `path`, at most `cap` bytes (a larger one is 413).
pub fn read(
    proc_dir: &OwnedFd,
    writable: &[PathBuf],
    path: &str,
    cap: usize,
    deadline: Deadline,
) -> Result<Vec<u8>, ApiError> {
    let (mount, rest) = locate(path, writable)?;
    let shown = mount.join(&rest);
    let cell = Cell::open(proc_dir, writable, &mount)?;
    let file = as_owner_of(&cell.mount, &shown, || {
        let checked = cell.resolve(&shown, &shown)?;
        let (kind, size) = file_type(&checked, &shown)?;
        kind_allowed(kind, FileType::RegularFile, &shown)?;
        if size > cap as u64 {
            return Err(too_large(&shown, cap));
        }
        reopen(&checked, OFlags::RDONLY, &shown)
    })?;
    let mut file = std::fs::File::from(file);
    let mut data = Vec::new();
    let mut buf = vec![0u8; CHUNK];
    loop {
        deadline.check(&shown)?;
        let n = std::io::Read::read(&mut file, &mut buf).map_err(|e| io_error_of(&shown, &e))?;
        if n == 0 {
            return Ok(data);
        }
        if data.len() + n > cap {
            return Err(too_large(&shown, cap));
        }
        data.extend_from_slice(&buf[..n]);
    }
}

/// The entries of the directory at `path`.
pub fn list(
    proc_dir: &OwnedFd,
    writable: &[PathBuf],
    path: &str,
    deadline: Deadline,
) -> Result<Vec<crate::api::DirEntry>, ApiError> {
    let (mount, rest) = locate(path, writable)?;
    let shown = mount.join(&rest);
    let cell = Cell::open(proc_dir, writable, &mount)?;
    let dir = as_owner_of(&cell.mount, &shown, || {
        let checked = cell.resolve(&shown, &shown)?;
        kind_allowed(file_type(&checked, &shown)?.0, FileType::Directory, &shown)?;
        reopen(&checked, OFlags::RDONLY | OFlags::DIRECTORY, &shown)
    })?;
    let entries = rustix::fs::Dir::read_from(&dir).map_err(|e| io_error(&shown, e))?;
    let mut listed = Vec::new();
    for entry in entries.flatten() {
        deadline.check(&shown)?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name == "." || name == ".." {
            continue;
        }
        // fstatat never opens the entry: a FIFO or a socket listed is only looked at.
        let stat = rustix::fs::statat(&dir, entry.file_name(), AtFlags::SYMLINK_NOFOLLOW);
        let (kind, size) = match stat {
            Ok(st) => {
                let kind = match FileType::from_raw_mode(st.st_mode) {
                    FileType::RegularFile => "file",
                    FileType::Directory => "dir",
                    FileType::Symlink => "symlink",
                    _ => "other",
                };
                (kind, st.st_size as u64)
            }
            Err(_) => ("other", 0),
        };
        listed.push(crate::api::DirEntry {
            name,
            kind: kind.to_string(),
            size,
        });
    }
    listed.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(listed)
}

/// `/proc/<pid>` of the cell's pid 1, held for the session's life.
pub fn open_proc_dir(pid: i32) -> std::io::Result<OwnedFd> {
    rustix::fs::open(
        format!("/proc/{pid}"),
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(std::io::Error::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn writable() -> Vec<PathBuf> {
        vec![
            PathBuf::from("/tmp"),
            PathBuf::from("/work"),
            PathBuf::from("/work/out"),
        ]
    }

    #[test]
    fn a_path_is_split_at_its_innermost_writable_mount() {
        assert_eq!(
            locate("tmp/a/b.txt", &writable()).unwrap(),
            ("/tmp".into(), "a/b.txt".into())
        );
        assert_eq!(
            locate("/work/out/x", &writable()).unwrap(),
            ("/work/out".into(), "x".into())
        );
        assert_eq!(
            locate("/tmp", &writable()).unwrap(),
            ("/tmp".into(), "".into())
        );
    }

    #[test]
    fn dot_dot_is_refused_before_anything_is_opened() {
        let err = locate("tmp/../etc/passwd", &writable()).unwrap_err();
        assert_eq!(err.body.reason, "path.invalid");
        assert_eq!(err.status, 400);
    }

    #[test]
    fn a_path_outside_the_writable_mounts_is_forbidden() {
        let err = locate("etc/passwd", &writable()).unwrap_err();
        assert_eq!(err.body.reason, "path.not_writable");
        // A prefix of a name is not its directory.
        assert!(locate("/tmpfoo/x", &writable()).is_err());
    }
}
