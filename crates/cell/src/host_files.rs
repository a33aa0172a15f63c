//! Files airlock writes on the host, as root: artifacts below the caller's output
//! directory and the `--result` record.
//!
//! Whoever can write into those directories (the caller, another user of a shared
//! directory, a previous run's payload through its artifacts) must not be able to make
//! root write anywhere else or clobber anything. So:
//!
//! - The destination directory is opened once, with `O_DIRECTORY | O_NOFOLLOW`: the path
//!   leading to it is the caller's choice and resolves as usual, but its own last component
//!   may not be a symlink (a symlink there is refused, not followed).
//! - Everything below it is reached relative to that descriptor with `openat2` and
//!   `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV`: no
//!   symlink in any component, no `..`, no crossing into another mount.
//! - Content goes to a fresh temporary file (`O_CREAT | O_EXCL`, mode 0600) in the target
//!   directory, is fsynced, and is then moved to its name with
//!   `renameat2(RENAME_NOREPLACE)` (`linkat` on filesystems without that flag). Whatever
//!   already exists at the name - a file of an earlier run, a symlink, a FIFO, a hard link
//!   to `/etc/passwd`, a directory - is never replaced, opened or written through: the
//!   write is refused with [`WriteRefusal::Exists`].
//!
//! Names are bytes end to end; [`escaped`] is how they are shown in JSON and on a terminal.

use crate::error::CellError;
use crate::sys;
use std::ffi::{OsStr, OsString};
use std::fmt::Write as _;
use std::fs::File;
use std::io::{self, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// Files airlock creates are readable by their owner only: artifacts and records may hold
/// whatever the payload or its contract had (the umask can only narrow this further).
pub const FILE_MODE: u32 = 0o600;
/// An artifact whose file in the cell was executable: still its owner's only.
pub const EXECUTABLE_FILE_MODE: u32 = 0o700;
/// Directories airlock creates below an output directory.
pub const DIR_MODE: u32 = 0o700;

/// Why a host-side write was refused or failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteRefusal {
    /// Something already exists at the destination name.
    Exists,
    /// A directory on the way below the destination directory is a symlink, not a
    /// directory, or another mount.
    UnsafePath,
    /// The destination directory itself cannot be used.
    DirectoryUnusable,
    /// The filesystem refused the write (read-only, full, permissions).
    WriteFailed,
}

impl WriteRefusal {
    /// The reason code of an artifact that could not be delivered for this cause.
    pub fn artifact_reason(self) -> &'static str {
        match self {
            WriteRefusal::Exists => "artifact.destination_exists",
            WriteRefusal::UnsafePath => "artifact.destination_unsafe",
            WriteRefusal::DirectoryUnusable => "artifact.output_dir_unusable",
            WriteRefusal::WriteFailed => "artifact.write_failed",
        }
    }

    /// The rule, in words, for error messages.
    pub fn explain(self) -> &'static str {
        match self {
            WriteRefusal::Exists => {
                "it already exists, and airlock never replaces or writes through an existing \
                 file; remove it or choose a path that does not exist yet"
            }
            WriteRefusal::UnsafePath => {
                "a directory on the way is a symlink, not a directory or another mount, and \
                 airlock follows none below the destination directory"
            }
            WriteRefusal::DirectoryUnusable => {
                "the destination directory cannot be used (it must be a directory, not a \
                 symlink to one, and writable)"
            }
            WriteRefusal::WriteFailed => "the filesystem refused the write",
        }
    }
}

/// `bytes` (a file name or path) as text that is both lossless and safe to print: a
/// backslash becomes `\\`; every byte that is not valid UTF-8, and every byte of a control
/// character (C0, DEL, C1: newlines, terminal escape sequences) or of a bidirectional
/// override, becomes `\xHH` (upper-case hex). Everything else is kept as is, so ordinary
/// names read unchanged. [`unescaped`] inverts it.
pub fn escaped(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len());
    for chunk in bytes.utf8_chunks() {
        for c in chunk.valid().chars() {
            if c == '\\' {
                out.push_str("\\\\");
            } else if needs_escape(c) {
                push_hex(&mut out, c.encode_utf8(&mut [0; 4]).as_bytes());
            } else {
                out.push(c);
            }
        }
        push_hex(&mut out, chunk.invalid());
    }
    out
}

/// Characters that can change what a terminal shows: controls and bidi overrides.
fn needs_escape(c: char) -> bool {
    c.is_control() || matches!(c, '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}')
}

fn push_hex(out: &mut String, bytes: &[u8]) {
    for b in bytes {
        let _ = write!(out, "\\x{b:02X}");
    }
}

/// The bytes [`escaped`] encoded; `None` for text it cannot have produced.
pub fn unescaped(text: &str) -> Option<Vec<u8>> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match (bytes[i], bytes.get(i + 1)) {
            (b'\\', Some(b'\\')) => {
                out.push(b'\\');
                i += 2;
            }
            (b'\\', Some(b'x')) => {
                let hex = std::str::from_utf8(bytes.get(i + 2..i + 4)?).ok()?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 4;
            }
            (b'\\', _) => return None,
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    Some(out)
}

fn shown(path: &Path) -> String {
    escaped(path.as_os_str().as_bytes())
}

fn host_write(path: &Path, refusal: WriteRefusal, source: io::Error) -> CellError {
    CellError::HostWrite {
        destination: shown(path),
        refusal,
        source,
    }
}

/// A directory on the host that airlock writes into, held open.
pub struct HostDir {
    fd: OwnedFd,
    path: PathBuf,
}

impl HostDir {
    /// The caller's destination directory, created (with its missing parents) when absent.
    /// A symlink or anything but a directory at `path` itself is refused.
    pub fn open_or_create(path: &Path) -> Result<HostDir, CellError> {
        use std::os::unix::fs::DirBuilderExt;
        let unusable = |e| host_write(path, WriteRefusal::DirectoryUnusable, e);
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent).map_err(unusable)?;
        }
        // mkdir never follows a symlink at its last component: it fails with EEXIST and
        // the open below refuses the symlink.
        match std::fs::DirBuilder::new().mode(DIR_MODE).create(path) {
            Err(e) if e.kind() != io::ErrorKind::AlreadyExists => return Err(unusable(e)),
            _ => {}
        }
        HostDir::open(path, libc::O_NOFOLLOW)
    }

    /// The existing directory `path`, following it as the caller wrote it (the directory
    /// of a `--result` file: its location is the caller's choice, only the file's own name
    /// is protected).
    pub fn open_as_given(path: &Path) -> Result<HostDir, CellError> {
        HostDir::open(path, 0)
    }

    fn open(path: &Path, extra_flags: libc::c_int) -> Result<HostDir, CellError> {
        use std::os::unix::fs::OpenOptionsExt;
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECTORY | extra_flags)
            .open(path)
            .map_err(|e| host_write(path, WriteRefusal::DirectoryUnusable, e))?;
        Ok(HostDir {
            fd: file.into(),
            path: path.to_path_buf(),
        })
    }

    /// Where this directory is, as the caller would name it.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The directory `name` in this one, created (0700) when missing; a symlink, a
    /// non-directory or a mount point at `name` is refused.
    pub fn subdir(&self, name: &OsStr) -> Result<HostDir, CellError> {
        let path = self.path.join(name);
        check_one_component(name, &path)?;
        match sys::mkdirat(self.fd.as_fd(), Path::new(name), DIR_MODE) {
            Err(e) if e.raw_os_error() != Some(libc::EEXIST) => {
                return Err(host_write(&path, WriteRefusal::WriteFailed, e))
            }
            _ => {}
        }
        let fd = sys::open_no_symlinks(
            self.fd.as_fd(),
            Path::new(name),
            libc::O_RDONLY | libc::O_DIRECTORY,
            false,
        )
        .map_err(|e| {
            let refusal = match e.raw_os_error() {
                Some(libc::ELOOP | libc::ENOTDIR | libc::EXDEV) => WriteRefusal::UnsafePath,
                _ => WriteRefusal::WriteFailed,
            };
            host_write(&path, refusal, e)
        })?;
        Ok(HostDir { fd, path })
    }

    /// A new file to be called `name` in this directory: written through the returned
    /// [`NewFile`], placed by [`NewFile::commit`], discarded if dropped.
    pub fn new_file(&self, name: &OsStr) -> Result<NewFile<'_>, CellError> {
        let path = self.path.join(name);
        check_one_component(name, &path)?;
        // Refusing early saves copying the content only to be refused at the rename,
        // which stays the check that counts.
        if self.occupied(name) {
            return Err(host_write(&path, WriteRefusal::Exists, eexist()));
        }
        for _ in 0..16 {
            let temp = temp_name();
            match sys::create_exclusive(self.fd.as_fd(), Path::new(&temp), FILE_MODE) {
                Ok(fd) => {
                    return Ok(NewFile {
                        dir: self,
                        temp: Some(temp),
                        name: name.to_owned(),
                        file: File::from(fd),
                    })
                }
                // A payload may have delivered an artifact of that very name.
                Err(e) if e.raw_os_error() == Some(libc::EEXIST) => continue,
                Err(e) => return Err(host_write(&path, WriteRefusal::WriteFailed, e)),
            }
        }
        Err(host_write(&path, WriteRefusal::WriteFailed, eexist()))
    }

    /// Whether anything, a dangling symlink included, is at `name`.
    fn occupied(&self, name: &OsStr) -> bool {
        match sys::open_no_symlinks(self.fd.as_fd(), Path::new(name), libc::O_PATH, false) {
            Ok(_) => true,
            Err(e) => e.raw_os_error() != Some(libc::ENOENT),
        }
    }

    fn sync(&self) -> io::Result<()> {
        File::from(self.fd.try_clone()?).sync_all()
    }
}

fn eexist() -> io::Error {
    io::Error::from_raw_os_error(libc::EEXIST)
}

/// Names handed to this module come from a directory listing or a path's file name;
/// anything that could step elsewhere is refused rather than trusted.
fn check_one_component(name: &OsStr, path: &Path) -> Result<(), CellError> {
    let bytes = name.as_bytes();
    if bytes.is_empty() || bytes == b"." || bytes == b".." || bytes.contains(&b'/') {
        return Err(host_write(
            path,
            WriteRefusal::UnsafePath,
            io::Error::new(io::ErrorKind::InvalidInput, "not a single file name"),
        ));
    }
    Ok(())
}

/// A temporary name no earlier run can have taken (pid, counter and clock), hidden.
fn temp_name() -> OsString {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    OsString::from(format!(
        ".airlock-{}-{}-{nanos:08x}.partial",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    ))
}

/// A file being written under a temporary name; see [`HostDir::new_file`].
pub struct NewFile<'a> {
    dir: &'a HostDir,
    /// `None` once renamed to `name`.
    temp: Option<OsString>,
    name: OsString,
    file: File,
}

impl NewFile<'_> {
    /// Gives the file [`EXECUTABLE_FILE_MODE`] (set on the descriptor, so the umask does
    /// not narrow it and nothing else is touched).
    pub fn make_executable(&self) -> Result<(), CellError> {
        use std::os::unix::fs::PermissionsExt;
        let path = self.dir.path.join(&self.name);
        self.file
            .set_permissions(std::fs::Permissions::from_mode(EXECUTABLE_FILE_MODE))
            .map_err(|e| host_write(&path, WriteRefusal::WriteFailed, e))
    }

    /// Flushes the content to disk and gives the file its name, unless something is
    /// already there. Returns the file's path.
    pub fn commit(mut self) -> Result<PathBuf, CellError> {
        let path = self.dir.path.join(&self.name);
        let failed = |e| host_write(&path, WriteRefusal::WriteFailed, e);
        self.file.sync_all().map_err(failed)?;
        let temp = self
            .temp
            .clone()
            .expect("a new file has its temporary name");
        let dirfd = self.dir.fd.as_fd();
        let (temp_path, name_path) = (Path::new(&temp), Path::new(&self.name));
        match sys::rename_noreplace(dirfd, temp_path, name_path) {
            Ok(()) => self.temp = None,
            // The filesystem lacks RENAME_NOREPLACE: a hard link is just as exclusive; the
            // temporary name is removed by drop.
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                sys::link_within(dirfd, temp_path, name_path).map_err(|e| refusal_of(&path, e))?
            }
            Err(e) => return Err(refusal_of(&path, e)),
        }
        // The name itself must survive a crash too.
        self.dir.sync().map_err(failed)?;
        Ok(path)
    }
}

fn refusal_of(path: &Path, e: io::Error) -> CellError {
    let refusal = match e.raw_os_error() {
        Some(libc::EEXIST | libc::ENOTEMPTY) => WriteRefusal::Exists,
        _ => WriteRefusal::WriteFailed,
    };
    host_write(path, refusal, e)
}

impl Write for NewFile<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.file.write(buf)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.file.flush()
    }
}

impl Drop for NewFile<'_> {
    fn drop(&mut self) {
        if let Some(temp) = &self.temp {
            let _ = sys::unlinkat(self.dir.fd.as_fd(), Path::new(temp));
        }
    }
}

/// Writes `bytes` as the new file `path` (mode 0600), refusing to replace anything that
/// exists there. The directory of `path` is taken as the caller wrote it.
pub fn write_new_file(path: &Path, bytes: &[u8]) -> Result<PathBuf, CellError> {
    let Some(name) = path.file_name() else {
        return Err(host_write(
            path,
            WriteRefusal::UnsafePath,
            io::Error::new(io::ErrorKind::InvalidInput, "the path names no file"),
        ));
    };
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => HostDir::open_as_given(p)?,
        // Messages name `r.json` as the caller wrote it, not `./r.json`.
        _ => HostDir {
            path: PathBuf::new(),
            ..HostDir::open_as_given(Path::new("."))?
        },
    };
    let mut file = dir.new_file(name)?;
    file.write_all(bytes)
        .map_err(|e| host_write(path, WriteRefusal::WriteFailed, e))?;
    file.commit()?;
    Ok(path.to_path_buf())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    fn refusal(err: CellError) -> WriteRefusal {
        match err {
            CellError::HostWrite { refusal, .. } => refusal,
            other => panic!("not a host write error: {other}"),
        }
    }

    fn write_in(dir: &HostDir, name: &str, bytes: &[u8]) -> Result<PathBuf, CellError> {
        let mut file = dir.new_file(OsStr::new(name))?;
        file.write_all(bytes).unwrap();
        file.commit()
    }

    /// Every entry of `dir`, to show that no temporary file is left behind.
    fn names(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn an_executable_new_file_is_0700_whatever_the_umask() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = HostDir::open_or_create(&tmp.path().join("out")).unwrap();
        let mut file = dir.new_file(OsStr::new("run.sh")).unwrap();
        file.write_all(b"#!/bin/sh\n").unwrap();
        file.make_executable().unwrap();
        let path = file.commit().unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().mode() & 0o7777, 0o700);
    }

    #[test]
    fn a_new_file_gets_its_content_and_mode_0600_and_no_temporary_is_left() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = HostDir::open_or_create(&tmp.path().join("out")).unwrap();
        let path = write_in(&dir, "a.txt", b"content").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"content");
        assert_eq!(std::fs::metadata(&path).unwrap().mode() & 0o777, 0o600);
        assert_eq!(names(dir.path()), ["a.txt"]);
    }

    #[test]
    fn an_existing_file_is_refused_and_left_unchanged() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(tmp.path().join("a.txt"), "earlier run").unwrap();
        let dir = HostDir::open_or_create(tmp.path()).unwrap();
        let err = write_in(&dir, "a.txt", b"new").unwrap_err();
        assert!(err.to_string().contains("remove it"), "{err}");
        assert_eq!(refusal(err), WriteRefusal::Exists);
        assert_eq!(
            std::fs::read_to_string(tmp.path().join("a.txt")).unwrap(),
            "earlier run"
        );
        assert_eq!(names(tmp.path()), ["a.txt"]);
    }

    #[test]
    fn a_symlink_at_the_name_is_not_written_through() {
        let tmp = tempfile::tempdir().unwrap();
        let victim = tmp.path().join("victim");
        std::fs::write(&victim, "precious").unwrap();
        let out = tmp.path().join("out");
        std::fs::create_dir(&out).unwrap();
        std::os::unix::fs::symlink(&victim, out.join("a.txt")).unwrap();
        std::os::unix::fs::symlink("/nonexistent/dangling", out.join("b.txt")).unwrap();
        let dir = HostDir::open_or_create(&out).unwrap();
        for name in ["a.txt", "b.txt"] {
            let err = write_in(&dir, name, b"attacker").unwrap_err();
            assert_eq!(refusal(err), WriteRefusal::Exists, "{name}");
        }
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
        assert!(!Path::new("/nonexistent/dangling").exists());
    }

    #[test]
    fn a_hard_link_fifo_or_directory_at_the_name_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let victim = tmp.path().join("victim");
        std::fs::write(&victim, "precious").unwrap();
        let out = tmp.path().join("out");
        std::fs::create_dir(&out).unwrap();
        std::fs::hard_link(&victim, out.join("hard")).unwrap();
        // mkfifo(1) keeps the test free of unsafe code.
        let made = std::process::Command::new("mkfifo")
            .arg(out.join("fifo"))
            .status()
            .unwrap();
        assert!(made.success());
        std::fs::create_dir(out.join("dir")).unwrap();
        let dir = HostDir::open_or_create(&out).unwrap();
        for name in ["hard", "fifo", "dir"] {
            let err = write_in(&dir, name, b"attacker").unwrap_err();
            assert_eq!(refusal(err), WriteRefusal::Exists, "{name}");
        }
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
        assert!(std::fs::read_dir(out.join("dir")).unwrap().next().is_none());
    }

    #[test]
    fn the_rename_refuses_what_appeared_after_the_temporary_was_created() {
        let tmp = tempfile::tempdir().unwrap();
        let victim = tmp.path().join("victim");
        std::fs::write(&victim, "precious").unwrap();
        let dir = HostDir::open_or_create(&tmp.path().join("out")).unwrap();
        let mut file = dir.new_file(OsStr::new("late")).unwrap();
        file.write_all(b"attacker").unwrap();
        std::os::unix::fs::symlink(&victim, dir.path().join("late")).unwrap();
        assert_eq!(refusal(file.commit().unwrap_err()), WriteRefusal::Exists);
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
        assert_eq!(names(dir.path()), ["late"], "the temporary file is removed");
    }

    #[test]
    fn a_symlinked_or_non_directory_subdir_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let elsewhere = tmp.path().join("elsewhere");
        std::fs::create_dir(&elsewhere).unwrap();
        let out = tmp.path().join("out");
        std::fs::create_dir(&out).unwrap();
        std::os::unix::fs::symlink(&elsewhere, out.join("link")).unwrap();
        std::fs::write(out.join("file"), "").unwrap();
        let dir = HostDir::open_or_create(&out).unwrap();
        for name in ["link", "file"] {
            let err = dir.subdir(OsStr::new(name)).err().expect(name);
            assert_eq!(refusal(err), WriteRefusal::UnsafePath, "{name}");
        }
        assert!(std::fs::read_dir(&elsewhere).unwrap().next().is_none());
        let sub = dir.subdir(OsStr::new("new")).unwrap();
        let mode = std::fs::metadata(sub.path()).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
    }

    #[test]
    fn a_symlinked_or_file_destination_directory_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let elsewhere = tmp.path().join("elsewhere");
        std::fs::create_dir(&elsewhere).unwrap();
        std::os::unix::fs::symlink(&elsewhere, tmp.path().join("link")).unwrap();
        std::fs::write(tmp.path().join("file"), "").unwrap();
        for name in ["link", "file"] {
            let err = HostDir::open_or_create(&tmp.path().join(name))
                .err()
                .expect(name);
            assert_eq!(refusal(err), WriteRefusal::DirectoryUnusable, "{name}");
        }
        assert!(std::fs::read_dir(&elsewhere).unwrap().next().is_none());
    }

    #[test]
    fn names_that_could_leave_the_directory_are_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = HostDir::open_or_create(tmp.path()).unwrap();
        for name in ["", ".", "..", "a/b", "../x"] {
            let err = dir.new_file(OsStr::new(name)).err().expect(name);
            assert_eq!(refusal(err), WriteRefusal::UnsafePath, "{name:?}");
            let err = dir.subdir(OsStr::new(name)).err().expect(name);
            assert_eq!(refusal(err), WriteRefusal::UnsafePath, "{name:?}");
        }
    }

    #[test]
    fn non_utf8_names_stay_distinct_files() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = HostDir::open_or_create(tmp.path()).unwrap();
        for (byte, content) in [(0xffu8, "ff"), (0xfe, "fe")] {
            let name = [b'n', byte];
            let mut file = dir.new_file(OsStr::from_bytes(&name)).unwrap();
            file.write_all(content.as_bytes()).unwrap();
            file.commit().unwrap();
        }
        let read = |b: u8| std::fs::read(tmp.path().join(OsStr::from_bytes(&[b'n', b]))).unwrap();
        assert_eq!((read(0xff), read(0xfe)), (b"ff".to_vec(), b"fe".to_vec()));
    }

    #[test]
    fn write_new_file_refuses_an_existing_result_and_a_missing_directory() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("r.json");
        write_new_file(&path, b"{}").unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().mode() & 0o777, 0o600);
        let again = write_new_file(&path, b"other").unwrap_err();
        assert_eq!(refusal(again), WriteRefusal::Exists);
        assert_eq!(std::fs::read(&path).unwrap(), b"{}");
        let missing = write_new_file(&tmp.path().join("nodir/r.json"), b"{}").unwrap_err();
        assert_eq!(refusal(missing), WriteRefusal::DirectoryUnusable);
    }

    #[test]
    fn escaping_is_lossless_and_leaves_no_control_byte() {
        let cases: [&[u8]; 6] = [
            b"report.pdf",
            b"n\xff",
            b"back\\slash\\x41",
            b"line\nbreak\x1b[31mred\x07",
            "\u{9b}csi \u{202e}rtl caf\u{e9}".as_bytes(),
            b"\xe2\x82",
        ];
        for bytes in cases {
            let text = escaped(bytes);
            assert!(
                !text.chars().any(needs_escape),
                "{text:?} keeps a control character"
            );
            assert_eq!(unescaped(&text).as_deref(), Some(bytes), "{text}");
        }
        assert_eq!(escaped(b"report.pdf"), "report.pdf");
        assert_eq!(escaped(b"n\xff"), "n\\xFF");
        assert_eq!(escaped(b"a\\b"), "a\\\\b");
        assert_eq!(escaped(b"a\nb"), "a\\x0Ab");
        assert_eq!(escaped("caf\u{e9}".as_bytes()), "caf\u{e9}");
        assert_ne!(escaped(b"n\xff"), escaped(b"n\xfe"));
        assert_eq!(unescaped("bad\\q"), None);
    }
}
