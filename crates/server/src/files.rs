//! A session's files, reached from the host through the cell's root
//! (`/proc/<cell pid 1>/root`) and only within the plan's writable paths. The writable
//! mount is opened inside the root with `RESOLVE_IN_ROOT` and no symlinks at all (its path
//! is the operator's); the rest of the path inside that mount with `RESOLVE_IN_ROOT |
//! RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV`: `..` and symlinks planted by the payload
//! resolve within the mount and never leave it, nor cross into another mount.
//!
//! Everything past the mount is done as the mount's owner (the cell's host identity), on
//! the calling thread only: the kernel refuses to create a file for an id its tmpfs (made
//! in the cell's user namespace) cannot represent, written files belong to the cell, and
//! the service reads no more of the cell than the cell's own identity can.

use crate::error::ApiError;
use airlock_contract::{CellPlan, MountPlan};
use rustix::fs::{Mode, OFlags, ResolveFlags};
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Component, Path, PathBuf};

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
/// plain components: no `.`, no `..`, nothing empty.
pub fn locate(path: &str, writable: &[PathBuf]) -> Result<(PathBuf, PathBuf), ApiError> {
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
            axum::http::StatusCode::PAYLOAD_TOO_LARGE,
            airlock_cell::report::ResultClass::CapacityExceeded,
            "file.too_large",
            format!("{shown}: {err}"),
        ),
        Errno::ISDIR | Errno::NOTDIR => {
            ApiError::bad_request("path.kind", format!("{shown}: {err}"))
        }
        Errno::SRCH => ApiError::not_found("session"),
        _ => ApiError::internal("file.io", format!("{shown}: {err}")),
    }
}

/// The writable mount `mount` of the cell whose `/proc/<pid>` directory is `proc_dir`.
fn open_mount(proc_dir: &OwnedFd, mount: &Path) -> Result<OwnedFd, ApiError> {
    // `root` is a magic link: followed here on purpose, to the cell's root. Opening it
    // through the held /proc/<pid> descriptor fails once that process is gone (ESRCH),
    // so a reused pid can never be another process's root.
    let root = rustix::fs::openat(
        proc_dir.as_fd(),
        "root",
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| io_error(mount, e))?;
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

fn within(
    mount: &OwnedFd,
    rest: &Path,
    flags: OFlags,
    mode: Mode,
    shown: &Path,
) -> Result<OwnedFd, ApiError> {
    let rest = if rest.as_os_str().is_empty() {
        Path::new(".")
    } else {
        rest
    };
    rustix::fs::openat2(
        mount.as_fd(),
        rest,
        flags | OFlags::CLOEXEC,
        mode,
        ResolveFlags::IN_ROOT | ResolveFlags::NO_MAGICLINKS | ResolveFlags::NO_XDEV,
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

/// Writes `data` at `path` (created or truncated) as the cell's identity.
pub fn write(
    proc_dir: &OwnedFd,
    writable: &[PathBuf],
    path: &str,
    data: &[u8],
) -> Result<u64, ApiError> {
    let (mount, rest) = locate(path, writable)?;
    let shown = mount.join(&rest);
    if rest.as_os_str().is_empty() {
        return Err(ApiError::bad_request(
            "path.kind",
            format!("{}: a directory", shown.display()),
        ));
    }
    let mount_fd = open_mount(proc_dir, &mount)?;
    // O_NOFOLLOW: a symlink as the last component is refused, never written through.
    let file = as_owner_of(&mount_fd, &shown, || {
        within(
            &mount_fd,
            &rest,
            OFlags::WRONLY | OFlags::CREATE | OFlags::TRUNC | OFlags::NOFOLLOW,
            Mode::from_raw_mode(0o644),
            &shown,
        )
    })?;
    let mut file = std::fs::File::from(file);
    std::io::Write::write_all(&mut file, data).map_err(|e| {
        io_error(
            &shown,
            rustix::io::Errno::from_io_error(&e).unwrap_or(rustix::io::Errno::IO),
        )
    })?;
    Ok(data.len() as u64)
}

/// The content of the regular file at `path`, at most `cap` bytes (a larger one is 413).
pub fn read(
    proc_dir: &OwnedFd,
    writable: &[PathBuf],
    path: &str,
    cap: usize,
) -> Result<Vec<u8>, ApiError> {
    let (mount, rest) = locate(path, writable)?;
    let shown = mount.join(&rest);
    let mount_fd = open_mount(proc_dir, &mount)?;
    let file = as_owner_of(&mount_fd, &shown, || {
        within(
            &mount_fd,
            &rest,
            OFlags::RDONLY | OFlags::NONBLOCK,
            Mode::empty(),
            &shown,
        )
    })?;
    let stat = rustix::fs::fstat(&file).map_err(|e| io_error(&shown, e))?;
    if rustix::fs::FileType::from_raw_mode(stat.st_mode) != rustix::fs::FileType::RegularFile {
        return Err(ApiError::bad_request(
            "path.kind",
            format!("{}: not a regular file", shown.display()),
        ));
    }
    let mut data = Vec::new();
    let mut limited = std::io::Read::take(std::fs::File::from(file), cap as u64 + 1);
    std::io::Read::read_to_end(&mut limited, &mut data)
        .map_err(|e| ApiError::internal("file.io", format!("{}: {e}", shown.display())))?;
    if data.len() > cap {
        return Err(ApiError::new(
            axum::http::StatusCode::PAYLOAD_TOO_LARGE,
            airlock_cell::report::ResultClass::CapacityExceeded,
            "file.too_large",
            format!(
                "{}: larger than server.max_file_bytes ({cap})",
                shown.display()
            ),
        ));
    }
    Ok(data)
}

/// The entries of the directory at `path`.
pub fn list(
    proc_dir: &OwnedFd,
    writable: &[PathBuf],
    path: &str,
) -> Result<Vec<crate::api::DirEntry>, ApiError> {
    let (mount, rest) = locate(path, writable)?;
    let shown = mount.join(&rest);
    let mount_fd = open_mount(proc_dir, &mount)?;
    let dir = as_owner_of(&mount_fd, &shown, || {
        within(
            &mount_fd,
            &rest,
            OFlags::RDONLY | OFlags::DIRECTORY,
            Mode::empty(),
            &shown,
        )
    })?;
    let entries = rustix::fs::Dir::read_from(&dir).map_err(|e| io_error(&shown, e))?;
    let mut listed = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name == "." || name == ".." {
            continue;
        }
        let stat = rustix::fs::statat(
            &dir,
            entry.file_name(),
            rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
        );
        let (kind, size) = match stat {
            Ok(st) => {
                let kind = match rustix::fs::FileType::from_raw_mode(st.st_mode) {
                    rustix::fs::FileType::RegularFile => "file",
                    rustix::fs::FileType::Directory => "dir",
                    rustix::fs::FileType::Symlink => "symlink",
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
