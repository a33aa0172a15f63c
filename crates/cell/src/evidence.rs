//! The completion sequence's step on a suspected escape: before the cell's writable
//! paths are destroyed, their files are copied into the directory the caller named
//! (the engine: the quarantine area of the state directory), bounded by a byte cap.
//! Regular files only, never through a symlink (links, devices, fifos and sockets are
//! listed as skipped); copying stops at the cap and the manifest says so.
//!
//! The writable paths are held open from the payload's start (like
//! [`crate::artifacts::OutputMounts`]): an open directory keeps its tmpfs reachable after
//! the cell's pid 1 and mount namespace are gone, and the verdict (a metadata probe the
//! proxy saw, a foreign system call) is only known once the cell ended.

use crate::host_files::{escaped, HostDir};
use crate::sys;
use airlock_contract::{CellPlan, MountPlan};
use serde::{Deserialize, Serialize};
use std::ffi::OsStr;
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// How deep below a writable path the copy goes, and how many entries it looks at.
const MAX_DEPTH: usize = 32;
const MAX_ENTRIES: usize = 100_000;
/// The manifest the copy leaves in its directory.
pub const MANIFEST: &str = "writable-manifest.json";

/// Where a suspected escape's writable paths go, and how much of them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OnSuspectedEscape {
    /// A directory that must not exist yet; created 0700 (its parent must exist).
    pub dir: PathBuf,
    /// The most bytes of file content copied, in all.
    pub max_bytes: u64,
}

/// What the copy kept and left.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EvidenceManifest {
    /// Cell paths copied (escaped like artifact paths), with their sizes.
    pub copied: Vec<(String, u64)>,
    /// Cell paths not copied, with why (`symlink`, `not_regular`, `cap`, `unreadable`).
    pub skipped: Vec<(String, String)>,
    pub bytes: u64,
    pub max_bytes: u64,
    /// The cap stopped the copy: later files were not looked at.
    pub capped: bool,
    /// Why nothing could be copied at all, if so.
    pub error: Option<String>,
}

/// Every writable tmpfs of the plan, held open from the payload's start.
#[derive(Default)]
pub struct WritableMounts {
    dirs: Vec<(Vec<u8>, OwnedFd)>,
}

impl WritableMounts {
    /// Opens every writable path of `plan` in the cell whose pid 1 is `pid1` (alive).
    pub fn open(pid1: libc::pid_t, plan: &CellPlan) -> WritableMounts {
        let Ok(root) = File::open(format!("/proc/{pid1}/root")) else {
            return WritableMounts::default();
        };
        let dirs = plan
            .mounts
            .iter()
            .filter_map(|mount| match mount {
                MountPlan::WritableTmpfs { target, .. } => Some(target.as_path()),
                _ => None,
            })
            .filter_map(|target| {
                let flags = libc::O_RDONLY | libc::O_DIRECTORY;
                sys::open_no_symlinks(root.as_fd(), target, flags, true)
                    .ok()
                    .map(|dir| (target.as_os_str().as_bytes().to_vec(), dir))
            })
            .collect();
        WritableMounts { dirs }
    }

    pub fn is_empty(&self) -> bool {
        self.dirs.is_empty()
    }
}

/// Copies `mounts` into `request.dir` (which it creates), and writes the manifest there.
/// Nothing of the cell may run any more.
pub fn preserve(mounts: &WritableMounts, request: &OnSuspectedEscape) -> EvidenceManifest {
    let mut copy = Copy {
        manifest: EvidenceManifest {
            max_bytes: request.max_bytes,
            ..EvidenceManifest::default()
        },
        entries: 0,
    };
    match create_private(&request.dir) {
        Ok(root) => {
            for (prefix, dir) in &mounts.dirs {
                if let Ok(dir) = dir.try_clone() {
                    copy.walk(dir, prefix, &root, 0);
                }
            }
            let text = serde_json::to_vec_pretty(&copy.manifest).unwrap_or_default();
            if let Ok(mut file) = root.new_file(OsStr::new(MANIFEST)) {
                let _ = file.write_all(&text).map(|()| file.commit());
            }
        }
        Err(err) => copy.manifest.error = Some(err),
    }
    copy.manifest
}

fn create_private(dir: &Path) -> Result<HostDir, String> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?;
    HostDir::open_or_create(dir).map_err(|e| e.to_string())
}

struct Copy {
    manifest: EvidenceManifest,
    entries: usize,
}

impl Copy {
    fn skip(&mut self, path: &[u8], why: &str) {
        self.manifest.skipped.push((escaped(path), why.to_string()));
    }

    fn walk(&mut self, dir: OwnedFd, cell_path: &[u8], into: &HostDir, depth: usize) {
        let listing = std::fs::read_dir(format!(
            "/proc/self/fd/{}",
            std::os::fd::AsRawFd::as_raw_fd(&dir)
        ));
        let Ok(listing) = listing else {
            return self.skip(cell_path, "unreadable");
        };
        let mut names: Vec<_> = listing.flatten().map(|e| e.file_name()).collect();
        names.sort();
        for name in names {
            if self.manifest.capped {
                return;
            }
            self.entries += 1;
            if self.entries > MAX_ENTRIES {
                self.manifest.capped = true;
                return self.skip(cell_path, "too_many_entries");
            }
            let child = [cell_path, b"/", name.as_bytes()].concat();
            self.visit(&dir, &name, &child, into, depth);
        }
    }

    fn visit(&mut self, dir: &OwnedFd, name: &OsStr, child: &[u8], into: &HostDir, depth: usize) {
        // O_PATH|O_NOFOLLOW opens a symlink itself, so its type can be checked.
        let meta = sys::open_no_symlinks(dir.as_fd(), Path::new(name), libc::O_PATH, false)
            .and_then(|handle| File::from(handle).metadata());
        let Ok(meta) = meta else {
            return self.skip(child, "unreadable");
        };
        let kind = meta.file_type();
        if kind.is_dir() {
            let flags = libc::O_RDONLY | libc::O_DIRECTORY;
            if depth >= MAX_DEPTH {
                return self.skip(child, "too_deep");
            }
            match sys::open_no_symlinks(dir.as_fd(), Path::new(name), flags, false) {
                Ok(sub) => self.walk(sub, child, into, depth + 1),
                Err(_) => self.skip(child, "unreadable"),
            }
            return;
        }
        if kind.is_symlink() {
            return self.skip(child, "symlink");
        }
        if !kind.is_file() {
            return self.skip(child, "not_regular");
        }
        if self.manifest.bytes + meta.len() > self.manifest.max_bytes {
            // The cap says where the copy stopped: nothing after it is looked at.
            self.manifest.capped = true;
            return self.skip(child, "cap");
        }
        match self.copy_file(dir, name, child, into) {
            Ok(size) => {
                self.manifest.bytes += size;
                self.manifest.copied.push((escaped(child), size));
            }
            Err(why) => self.skip(child, why),
        }
    }

    fn copy_file(
        &mut self,
        dir: &OwnedFd,
        name: &OsStr,
        child: &[u8],
        into: &HostDir,
    ) -> Result<u64, &'static str> {
        let flags = libc::O_RDONLY | libc::O_NONBLOCK;
        let fd = sys::open_no_symlinks(dir.as_fd(), Path::new(name), flags, false)
            .map_err(|_| "unreadable")?;
        let source = File::from(fd);
        if !source.metadata().map_err(|_| "unreadable")?.is_file() {
            return Err("not_regular");
        }
        // The cell path's directories become directories of the copy (0700).
        let components: Vec<&[u8]> = child
            .split(|b| *b == b'/')
            .filter(|c| !c.is_empty())
            .collect();
        let dirs = &components[..components.len().saturating_sub(1)];
        let Some((first, rest)) = dirs.split_first() else {
            return Err("unwritable");
        };
        let mut target = into
            .subdir(OsStr::from_bytes(first))
            .map_err(|_| "unwritable")?;
        for component in rest {
            target = target
                .subdir(OsStr::from_bytes(component))
                .map_err(|_| "unwritable")?;
        }
        let mut out = target.new_file(name).map_err(|_| "unwritable")?;
        let room = self.manifest.max_bytes - self.manifest.bytes;
        // The file may have grown since its size was read: never past the cap.
        let copied = std::io::copy(&mut source.take(room), &mut out).map_err(|_| "unreadable")?;
        out.commit().map_err(|_| "unwritable")?;
        Ok(copied)
    }
}

/// The evidence of a cell whose verdict is a suspected escape: copied when `request` asks
/// for it and the mounts were held, else nothing.
pub fn on_verdict(
    suspected: bool,
    mounts: WritableMounts,
    request: Option<&OnSuspectedEscape>,
) -> Option<EvidenceManifest> {
    let request = request?;
    suspected.then(|| preserve(&mounts, request))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_request_or_no_suspicion_copies_nothing() {
        let request = OnSuspectedEscape {
            dir: PathBuf::from("/nonexistent/never"),
            max_bytes: 1,
        };
        assert!(on_verdict(false, WritableMounts::default(), Some(&request)).is_none());
        assert!(on_verdict(true, WritableMounts::default(), None).is_none());
    }

    #[test]
    fn an_existing_directory_is_never_written_into() {
        let dir = tempfile::tempdir().unwrap();
        let request = OnSuspectedEscape {
            dir: dir.path().to_path_buf(),
            max_bytes: 10,
        };
        let manifest = preserve(&WritableMounts::default(), &request);
        assert!(manifest.error.is_some(), "{manifest:?}");
    }
}
