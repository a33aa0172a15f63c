//! Unpacking one layer into an empty directory without following anything the layer
//! controls.
//!
//! Every entry's parent is walked one component at a time from the layer's root with
//! `openat2(RESOLVE_IN_ROOT | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS |
//! RESOLVE_NO_XDEV)`, so a symlink the layer planted is never a way out (it is refused
//! as a parent); the entry itself is made with `*at` calls on that parent that never
//! follow the last component (`O_CREAT | O_EXCL | O_NOFOLLOW`, `mkdirat`, `symlinkat`, a
//! hardlink through an `O_PATH` descriptor resolved the same way). Whiteouts become
//! overlayfs whiteouts inside this layer's own directory; the layers are stacked only at
//! mount time, so no layer's entries ever touch another's files.

use crate::digest::{Digest, HashingReader};
use crate::error::{ImageError, Result};
use rustix::fs::{AtFlags, FileType, Mode, OFlags, ResolveFlags, Timestamps};
use rustix::io::Errno;
use std::ffi::OsStr;
use std::io::Read;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;

/// Ceilings of one layer (decompression bombs, inode floods). `[images]` in the operator
/// config sets them; docs/config.md gives the defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Uncompressed bytes of the whole layer stream.
    pub max_layer_bytes: u64,
    /// Bytes of one file.
    pub max_file_bytes: u64,
    /// Entries of the layer.
    pub max_entries: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_layer_bytes: 8 << 30,
            max_file_bytes: 4 << 30,
            max_entries: 1_000_000,
        }
    }
}

/// What one unpack produced: the diff id (sha256 of the uncompressed stream, exactly the
/// bytes the parser read) and counts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unpacked {
    pub diff_id: Digest,
    pub entries: u64,
    pub bytes: u64,
}

const MAX_NAME: usize = 255;
const MAX_PATH: usize = 4096;
const MAX_DEPTH: usize = 128;
/// uids and gids above this cannot be mapped into a cell (its user namespace maps 65536).
const MAX_ID: u64 = 65535;
const OPAQUE: &[u8] = b".wh..wh..opq";
const WHITEOUT: &[u8] = b".wh.";

/// Unpacks the uncompressed tar stream `layer` into `root`, an empty directory. On an
/// error the caller removes the directory: a half-unpacked layer is never used.
pub fn unpack_layer(layer: impl Read, root: BorrowedFd<'_>, limits: &Limits) -> Result<Unpacked> {
    // One byte over the limit is enough to know it was exceeded.
    let mut stream = HashingReader::new(layer.take(limits.max_layer_bytes.saturating_add(1)));
    let mut archive = tar::Archive::new(&mut stream);
    let (entries, bytes) = unpack_entries(&mut archive, root, limits)?;
    let (diff_id, count) = stream.finish().map_err(read_error)?;
    if count > limits.max_layer_bytes {
        return Err(layer_limit(limits));
    }
    Ok(Unpacked {
        diff_id,
        entries,
        bytes,
    })
}

/// Each entry in turn, counting entries and bytes against the limits.
fn unpack_entries<R: Read>(
    archive: &mut tar::Archive<R>,
    root: BorrowedFd<'_>,
    limits: &Limits,
) -> Result<(u64, u64)> {
    let mut entries = 0u64;
    let mut bytes = 0u64;
    for entry in archive.entries().map_err(read_error)? {
        let mut entry = entry.map_err(read_error)?;
        entries += 1;
        if entries > limits.max_entries {
            return Err(ImageError::Limit {
                what: "the entry count",
                limit: limits.max_entries,
            });
        }
        let size = entry.size();
        if size > limits.max_file_bytes {
            return Err(ImageError::Limit {
                what: "a file's size",
                limit: limits.max_file_bytes,
            });
        }
        bytes += size;
        if bytes > limits.max_layer_bytes {
            return Err(layer_limit(limits));
        }
        unpack_entry(root, &mut entry)?;
    }
    Ok((entries, bytes))
}

fn layer_limit(limits: &Limits) -> ImageError {
    ImageError::Limit {
        what: "the layer's uncompressed size",
        limit: limits.max_layer_bytes,
    }
}

fn read_error(e: std::io::Error) -> ImageError {
    ImageError::Io {
        context: "reading layer",
        path: "tar".into(),
        source: e,
    }
}

/// The entry's path as components below the layer root. Absolute names and `..` are
/// refused (never re-rooted: a layer that names them was not made by a build); `.` and
/// empty components (`./etc//x/`) are dropped.
pub fn entry_components(raw: &[u8]) -> std::result::Result<Vec<&[u8]>, &'static str> {
    if raw.starts_with(b"/") {
        return Err("an absolute name");
    }
    if raw.len() > MAX_PATH {
        return Err("a name longer than 4096 bytes");
    }
    let mut components = Vec::new();
    for c in raw.split(|b| *b == b'/') {
        match c {
            b"" | b"." => {}
            b".." => return Err("a `..` component"),
            c if c.len() > MAX_NAME => return Err("a component longer than 255 bytes"),
            c if c.contains(&0) => return Err("a NUL byte"),
            c => components.push(c),
        }
    }
    if components.len() > MAX_DEPTH {
        return Err("more than 128 components");
    }
    Ok(components)
}

/// What an entry's last component asks for besides its tar type.
#[derive(Debug, PartialEq, Eq)]
pub enum Special<'a> {
    None,
    /// `.wh..wh..opq`: the parent hides everything below it in lower layers.
    Opaque,
    /// `.wh.<name>`: `name` is deleted from lower layers.
    Whiteout(&'a [u8]),
}

pub fn special(name: &[u8]) -> std::result::Result<Special<'_>, &'static str> {
    if name == OPAQUE {
        return Ok(Special::Opaque);
    }
    let Some(target) = name.strip_prefix(WHITEOUT) else {
        return Ok(Special::None);
    };
    match target {
        b"" | b"." | b".." => Err("a whiteout of the directory itself or its parent"),
        t if t.starts_with(WHITEOUT) => Err("an unknown `.wh..wh.` name"),
        t => Ok(Special::Whiteout(t)),
    }
}

/// Permission bits kept: setuid and setgid are dropped (a root-owned setuid file in an
/// image must never be a way to privilege), the sticky bit stays (`/tmp`).
pub fn kept_mode(mode: u32) -> u32 {
    mode & 0o1777
}

fn unpack_entry<R: Read>(root: BorrowedFd<'_>, entry: &mut tar::Entry<'_, R>) -> Result<()> {
    let raw = entry.path_bytes().into_owned();
    let shown = String::from_utf8_lossy(&raw).into_owned();
    let refuse = |reason: &str| ImageError::unsafe_entry(&shown, reason);
    let components = entry_components(&raw).map_err(refuse)?;
    let kind = entry.header().entry_type();
    let Some((name, parents)) = components.split_last() else {
        // The layer's root itself (`./`): a directory entry changes nothing we keep; any
        // other type would replace the root (umoci's CVE-2021-29136 was a `.` symlink).
        return match kind {
            tar::EntryType::Directory => Ok(()),
            _ => Err(refuse("replaces the layer root")),
        };
    };
    let parent = open_parent(root, parents).map_err(|e| refuse(&e))?;
    match special(name).map_err(refuse)? {
        Special::Opaque => {
            return rustix::fs::fsetxattr(
                &parent,
                "trusted.overlay.opaque",
                b"y",
                rustix::fs::XattrFlags::empty(),
            )
            .map_err(|e| refuse(&format!("marking the directory opaque: {e}")));
        }
        Special::Whiteout(target) => return whiteout(&parent, target).map_err(|e| refuse(&e)),
        Special::None => {}
    }
    let name = OsStr::from_bytes(name);
    let header = entry.header();
    let owner = ownership(header).map_err(refuse)?;
    let mode = kept_mode(header.mode().map_err(read_error)?);
    match kind {
        tar::EntryType::Directory => directory(&parent, name, owner, mode),
        tar::EntryType::Regular | tar::EntryType::Continuous => {
            let mtime = header.mtime().unwrap_or(0);
            regular(&parent, name, owner, mode, mtime, entry)
        }
        tar::EntryType::Symlink => {
            let target = entry
                .link_name_bytes()
                .ok_or_else(|| refuse("a symlink without a target"))?
                .into_owned();
            symlink(&parent, name, owner, &target)
        }
        tar::EntryType::Link => {
            let target = entry
                .link_name_bytes()
                .ok_or_else(|| refuse("a hardlink without a target"))?
                .into_owned();
            hardlink(root, &parent, name, &target)
        }
        tar::EntryType::Char | tar::EntryType::Block => Err("a device node".to_string()),
        tar::EntryType::Fifo => Err("a FIFO".to_string()),
        other => Err(format!("an unsupported entry type {other:?}")),
    }
    .map_err(|e| refuse(&e))
}

type Owner = (rustix::fs::Uid, rustix::fs::Gid);

fn ownership(header: &tar::Header) -> std::result::Result<Owner, &'static str> {
    let old = header.as_old();
    let uid = numeric(header.uid(), &old.uid).ok_or("an unreadable uid")?;
    let gid = numeric(header.gid(), &old.gid).ok_or("an unreadable gid")?;
    if uid > MAX_ID || gid > MAX_ID {
        return Err("an owner above 65535, which no cell can map");
    }
    Ok((
        rustix::fs::Uid::from_raw(uid as u32),
        rustix::fs::Gid::from_raw(gid as u32),
    ))
}

/// A numeric header field; one left empty (all NUL or spaces, as some writers leave
/// uid and gid) is 0, as GNU tar reads it.
fn numeric(parsed: std::io::Result<u64>, raw: &[u8]) -> Option<u64> {
    match parsed {
        Ok(n) => Some(n),
        Err(_) if raw.iter().all(|b| *b == 0 || *b == b' ') => Some(0),
        Err(_) => None,
    }
}

/// Never follows a symlink, never leaves `dir`, never crosses a mount.
fn strict() -> ResolveFlags {
    ResolveFlags::IN_ROOT
        | ResolveFlags::NO_SYMLINKS
        | ResolveFlags::NO_MAGICLINKS
        | ResolveFlags::NO_XDEV
}

fn open_dir(dir: BorrowedFd<'_>, name: &OsStr) -> rustix::io::Result<OwnedFd> {
    rustix::fs::openat2(
        dir,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
        strict(),
    )
}

/// The entry's parent directory, creating missing ones (0755, root's: a later directory
/// entry of the layer sets its own). A parent that is a symlink or not a directory is
/// refused: an archive made from a filesystem never lists a path through a symlink.
fn open_parent(root: BorrowedFd<'_>, parents: &[&[u8]]) -> std::result::Result<OwnedFd, String> {
    let mut dir = rustix::io::dup(root).map_err(|e| format!("opening the layer root: {e}"))?;
    for component in parents {
        let name = OsStr::from_bytes(component);
        let next = match open_dir(dir.as_fd(), name) {
            Err(Errno::NOENT) => {
                rustix::fs::mkdirat(&dir, name, Mode::from_raw_mode(0o755))
                    .map_err(|e| format!("creating a parent: {e}"))?;
                open_dir(dir.as_fd(), name)
            }
            other => other,
        };
        dir = next.map_err(|e| match e {
            Errno::LOOP | Errno::NOTDIR => "a parent is a symlink or not a directory".to_string(),
            e => format!("opening a parent: {e}"),
        })?;
    }
    Ok(dir)
}

/// The type of what is at `name` in `dir`, without following it.
fn existing(dir: &OwnedFd, name: &OsStr) -> std::result::Result<Option<FileType>, String> {
    match rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(stat) => Ok(Some(FileType::from_raw_mode(stat.st_mode))),
        Err(Errno::NOENT) => Ok(None),
        Err(e) => Err(format!("inspecting the name: {e}")),
    }
}

/// Clears `name` for a new non-directory entry (a later entry of the same name replaces
/// the earlier one, as tar does; the old one is unlinked, never written through). A
/// directory is not replaced by a non-directory: that would need a recursive removal
/// inside the layer, and no build produces it.
fn clear_for_file(dir: &OwnedFd, name: &OsStr) -> std::result::Result<(), String> {
    match existing(dir, name)? {
        None => Ok(()),
        Some(FileType::Directory) => Err("replaces a directory with a non-directory".to_string()),
        Some(_) => rustix::fs::unlinkat(dir, name, AtFlags::empty())
            .map_err(|e| format!("replacing an earlier entry: {e}")),
    }
}

fn set_owner_and_mode(fd: &OwnedFd, owner: Owner, mode: u32) -> std::result::Result<(), String> {
    // chown first: it clears setuid/setgid, which are dropped anyway; chmod last so the
    // bits are exactly `mode`.
    rustix::fs::fchown(fd, Some(owner.0), Some(owner.1)).map_err(|e| format!("chown: {e}"))?;
    rustix::fs::fchmod(fd, Mode::from_raw_mode(mode)).map_err(|e| format!("chmod: {e}"))
}

fn directory(
    dir: &OwnedFd,
    name: &OsStr,
    owner: Owner,
    mode: u32,
) -> std::result::Result<(), String> {
    match existing(dir, name)? {
        Some(FileType::Directory) => {}
        Some(_) => {
            // A directory entry after a symlink of the same name replaces the symlink; it
            // is never a chmod through it (CVE-2021-32760, RUSTSEC-2026-0067).
            rustix::fs::unlinkat(dir, name, AtFlags::empty())
                .map_err(|e| format!("replacing an earlier entry: {e}"))?;
            rustix::fs::mkdirat(dir, name, Mode::from_raw_mode(0o700))
                .map_err(|e| format!("mkdir: {e}"))?;
        }
        None => rustix::fs::mkdirat(dir, name, Mode::from_raw_mode(0o700))
            .map_err(|e| format!("mkdir: {e}"))?,
    }
    let fd = open_dir(dir.as_fd(), name).map_err(|e| format!("opening the directory: {e}"))?;
    set_owner_and_mode(&fd, owner, mode)
}

fn regular<R: Read>(
    dir: &OwnedFd,
    name: &OsStr,
    owner: Owner,
    mode: u32,
    mtime: u64,
    content: &mut tar::Entry<'_, R>,
) -> std::result::Result<(), String> {
    clear_for_file(dir, name)?;
    let fd = rustix::fs::openat(
        dir,
        name,
        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o600),
    )
    .map_err(|e| format!("creating the file: {e}"))?;
    let mut file = std::fs::File::from(fd);
    std::io::copy(content, &mut file).map_err(|e| format!("writing the file: {e}"))?;
    let fd = OwnedFd::from(file);
    set_owner_and_mode(&fd, owner, mode)?;
    // The modification time matters to tools (Python compares it with its .pyc files).
    let when = rustix::fs::Timespec {
        tv_sec: mtime.min(i64::MAX as u64) as i64,
        tv_nsec: 0,
    };
    rustix::fs::futimens(
        &fd,
        &Timestamps {
            last_access: when,
            last_modification: when,
        },
    )
    .map_err(|e| format!("setting the time: {e}"))
}

fn symlink(
    dir: &OwnedFd,
    name: &OsStr,
    owner: Owner,
    target: &[u8],
) -> std::result::Result<(), String> {
    if target.is_empty() || target.len() > MAX_PATH || target.contains(&0) {
        return Err("a symlink target that is empty, over 4096 bytes or has a NUL".to_string());
    }
    clear_for_file(dir, name)?;
    // The target is text the cell's kernel resolves inside the cell's root later; it is
    // never followed here.
    rustix::fs::symlinkat(OsStr::from_bytes(target), dir, name)
        .map_err(|e| format!("symlink: {e}"))?;
    rustix::fs::chownat(
        dir,
        name,
        Some(owner.0),
        Some(owner.1),
        AtFlags::SYMLINK_NOFOLLOW,
    )
    .map_err(|e| format!("chown: {e}"))
}

/// A hardlink's target is an entry of this layer, named like any entry and resolved from
/// the layer root without following a symlink; then linked through its descriptor, so
/// no path the layer controls is walked twice.
fn hardlink(
    root: BorrowedFd<'_>,
    dir: &OwnedFd,
    name: &OsStr,
    target: &[u8],
) -> std::result::Result<(), String> {
    let components = entry_components(target).map_err(|e| format!("a hardlink target with {e}"))?;
    if components.is_empty() {
        return Err("a hardlink to the layer root".to_string());
    }
    let path = components.join(&b'/');
    let source = rustix::fs::openat2(
        root,
        OsStr::from_bytes(&path),
        OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
        strict(),
    )
    .map_err(|e| match e {
        Errno::NOENT => "a hardlink to a name this layer does not have".to_string(),
        Errno::LOOP | Errno::NOTDIR => "a hardlink through a symlink".to_string(),
        e => format!("opening the hardlink target: {e}"),
    })?;
    let stat = rustix::fs::fstat(&source).map_err(|e| format!("stat: {e}"))?;
    if FileType::from_raw_mode(stat.st_mode) == FileType::Directory {
        return Err("a hardlink to a directory".to_string());
    }
    if let Some(here) = existing(dir, name)? {
        let same = rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW)
            .is_ok_and(|s| s.st_ino == stat.st_ino && s.st_dev == stat.st_dev);
        if same {
            return Ok(());
        }
        if here == FileType::Directory {
            return Err("replaces a directory with a hardlink".to_string());
        }
        rustix::fs::unlinkat(dir, name, AtFlags::empty())
            .map_err(|e| format!("replacing an earlier entry: {e}"))?;
    }
    rustix::fs::linkat(&source, "", dir, name, AtFlags::EMPTY_PATH)
        .map_err(|e| format!("link: {e}"))
}

/// An overlayfs whiteout (a 0:0 character device) at `target` in this layer's directory.
fn whiteout(dir: &OwnedFd, target: &[u8]) -> std::result::Result<(), String> {
    if target.contains(&b'/') {
        return Err("a whiteout name with a slash".to_string());
    }
    let name = OsStr::from_bytes(target);
    if existing(dir, name)?.is_some() {
        return Err("a whiteout of a name the same layer creates".to_string());
    }
    rustix::fs::mknodat(
        dir,
        name,
        FileType::CharacterDevice,
        Mode::empty(),
        rustix::fs::makedev(0, 0),
    )
    .map_err(|e| format!("creating the whiteout: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn absolute_names_and_dotdot_are_refused_dot_and_empty_components_dropped() {
        assert_eq!(
            entry_components(b"./etc//passwd").unwrap(),
            [b"etc" as &[u8], b"passwd"]
        );
        assert_eq!(entry_components(b"./").unwrap(), Vec::<&[u8]>::new());
        assert!(entry_components(b"/etc/passwd").is_err());
        assert!(entry_components(b"a/../../etc").is_err());
        assert!(entry_components(b"..").is_err());
        assert!(entry_components(&[b'a'; 300]).is_err());
    }

    #[test]
    fn whiteouts_of_the_directory_itself_or_its_parent_are_refused() {
        assert_eq!(special(b".wh..wh..opq").unwrap(), Special::Opaque);
        assert_eq!(special(b".wh.foo").unwrap(), Special::Whiteout(b"foo"));
        assert_eq!(special(b"foo").unwrap(), Special::None);
        for bad in [&b".wh."[..], b".wh..", b".wh...", b".wh..wh.x"] {
            assert!(special(bad).is_err(), "{}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn setuid_and_setgid_are_dropped_the_sticky_bit_kept() {
        assert_eq!(kept_mode(0o4755), 0o755);
        assert_eq!(kept_mode(0o2755), 0o755);
        assert_eq!(kept_mode(0o1777), 0o1777);
        assert_eq!(kept_mode(0o100644), 0o644);
    }
}
