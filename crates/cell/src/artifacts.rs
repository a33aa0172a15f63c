//! Artifact collection: only declared, regular, single-link files inside the writable
//! output paths leave the cell, size-capped and sha256-hashed.
//!
//! Runs in the supervisor after the payload ended and every other process of the cell was
//! killed (so nothing changes underneath), while the cell's pid 1 still holds the mount
//! namespace open. Files are reached through `/proc/<pid1>/root` with `openat2`, which
//! refuses symlinks and magic links at every step, so a payload cannot point the collector
//! at a host file.

use crate::sys;
use airlock_contract::{CellPlan, MountPlan};
use serde::Serialize;
use sha2::{Digest, Sha256};
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};

/// Walk limits: a payload cannot make collection take unbounded time.
const MAX_ENTRIES: usize = 10_000;
const MAX_DEPTH: usize = 32;

pub mod reason {
    pub const UNDECLARED: &str = "artifact.undeclared";
    pub const SYMLINK: &str = "artifact.symlink";
    pub const NOT_REGULAR: &str = "artifact.not_regular";
    pub const HARDLINK: &str = "artifact.hardlink";
    pub const TOO_LARGE: &str = "artifact.too_large";
    pub const TOTAL_TOO_LARGE: &str = "artifact.total_too_large";
    pub const UNREADABLE: &str = "artifact.unreadable";
    pub const TOO_MANY: &str = "artifact.too_many_entries";
}

/// Where accepted artifacts go and how large they may be.
#[derive(Debug, Clone)]
pub struct ArtifactRequest {
    pub output_dir: PathBuf,
    pub max_file_bytes: u64,
    pub max_total_bytes: u64,
}

#[derive(Debug, Serialize)]
pub struct ArtifactKept {
    /// Path inside the cell.
    pub path: String,
    pub size_bytes: u64,
    pub sha256: String,
    /// Where it was copied to on the host.
    pub stored_at: PathBuf,
}

#[derive(Debug, Serialize)]
pub struct ArtifactRejection {
    pub path: String,
    pub reason: &'static str,
}

#[derive(Debug, Default, Serialize)]
pub struct ArtifactReport {
    pub kept: Vec<ArtifactKept>,
    pub rejected: Vec<ArtifactRejection>,
}

/// Matches a `/`-separated glob where `*` and `?` stay within one path segment.
pub fn glob_matches(pattern: &str, path: &str) -> bool {
    let pattern: Vec<&str> = pattern.trim_matches('/').split('/').collect();
    let path: Vec<&str> = path.trim_matches('/').split('/').collect();
    pattern.len() == path.len()
        && pattern
            .iter()
            .zip(&path)
            .all(|(p, s)| segment_matches(p.as_bytes(), s.as_bytes()))
}

fn segment_matches(pattern: &[u8], text: &[u8]) -> bool {
    match (pattern.first(), text.first()) {
        (None, None) => true,
        (Some(b'*'), _) => {
            segment_matches(&pattern[1..], text)
                || (!text.is_empty() && segment_matches(pattern, &text[1..]))
        }
        (Some(b'?'), Some(_)) => segment_matches(&pattern[1..], &text[1..]),
        (Some(b'['), Some(c)) => match class_matches(&pattern[1..], *c) {
            Some((true, rest)) => segment_matches(rest, &text[1..]),
            Some((false, _)) => false,
            // An unclosed `[` is a literal.
            None => *c == b'[' && segment_matches(&pattern[1..], &text[1..]),
        },
        (Some(p), Some(t)) if p == t => segment_matches(&pattern[1..], &text[1..]),
        _ => false,
    }
}

/// Matches `c` against a class body (`abc]`, `a-z]`, `!x]`); returns whether it matched
/// and the pattern after the closing `]`, or `None` when there is no `]`.
fn class_matches(body: &[u8], c: u8) -> Option<(bool, &[u8])> {
    let (negated, body) = match body.first() {
        Some(b'!') | Some(b'^') => (true, &body[1..]),
        _ => (false, body),
    };
    let close = body.iter().skip(1).position(|b| *b == b']')? + 1;
    let (set, rest) = (&body[..close], &body[close + 1..]);
    let mut found = false;
    let mut i = 0;
    while i < set.len() {
        if i + 2 < set.len() && set[i + 1] == b'-' {
            found |= (set[i]..=set[i + 2]).contains(&c);
            i += 3;
        } else {
            found |= set[i] == c;
            i += 1;
        }
    }
    Some((found != negated, rest))
}

struct Collector<'a> {
    request: &'a ArtifactRequest,
    globs: &'a [String],
    report: ArtifactReport,
    entries: usize,
    total_bytes: u64,
}

/// Collects the plan's declared artifacts from the cell whose pid 1 is `pid1`.
pub fn collect(pid1: libc::pid_t, plan: &CellPlan, request: &ArtifactRequest) -> serde_json::Value {
    let mut collector = Collector {
        request,
        globs: &plan.output_allowlist,
        report: ArtifactReport::default(),
        entries: 0,
        total_bytes: 0,
    };
    let cell_root = format!("/proc/{pid1}/root");
    match File::open(&cell_root) {
        Ok(root) => {
            let root: OwnedFd = root.into();
            for mount in &plan.mounts {
                let MountPlan::WritableTmpfs { target, .. } = mount else {
                    continue;
                };
                let prefix = target.display().to_string();
                // Only walk writable paths that hold declared outputs.
                if !plan
                    .output_allowlist
                    .iter()
                    .any(|g| g.starts_with(&format!("{prefix}/")))
                {
                    continue;
                }
                if let Ok(dir) = sys::open_no_symlinks(
                    root.as_fd(),
                    target,
                    libc::O_RDONLY | libc::O_DIRECTORY,
                    true,
                ) {
                    collector.walk(dir, &prefix, 0);
                }
            }
        }
        Err(err) => collector.report.rejected.push(ArtifactRejection {
            path: format!("{cell_root}: {err}"),
            reason: reason::UNREADABLE,
        }),
    }
    serde_json::to_value(collector.report).unwrap_or_default()
}

impl Collector<'_> {
    fn reject(&mut self, path: &str, reason: &'static str) {
        self.report.rejected.push(ArtifactRejection {
            path: path.to_string(),
            reason,
        });
    }

    fn declared(&self, path: &str) -> bool {
        self.globs.iter().any(|g| glob_matches(g, path))
    }

    fn walk(&mut self, dir: OwnedFd, cell_path: &str, depth: usize) {
        let listing = match std::fs::read_dir(format!(
            "/proc/self/fd/{}",
            std::os::fd::AsRawFd::as_raw_fd(&dir)
        )) {
            Ok(l) => l,
            Err(_) => return self.reject(cell_path, reason::UNREADABLE),
        };
        let mut names: Vec<_> = listing.flatten().map(|e| e.file_name()).collect();
        names.sort();
        for name in names {
            self.entries += 1;
            if self.entries > MAX_ENTRIES {
                return self.reject(cell_path, reason::TOO_MANY);
            }
            let child_path = format!("{cell_path}/{}", name.to_string_lossy());
            // O_PATH|O_NOFOLLOW opens a symlink itself, so its type can be checked.
            let Ok(handle) =
                sys::open_no_symlinks(dir.as_fd(), Path::new(&name), libc::O_PATH, false)
            else {
                self.reject(&child_path, reason::UNREADABLE);
                continue;
            };
            let Ok(meta) = File::from(handle).metadata() else {
                self.reject(&child_path, reason::UNREADABLE);
                continue;
            };
            let file_type = meta.file_type();
            if file_type.is_dir() {
                if depth < MAX_DEPTH {
                    if let Ok(sub) = sys::open_no_symlinks(
                        dir.as_fd(),
                        Path::new(&name),
                        libc::O_RDONLY | libc::O_DIRECTORY,
                        false,
                    ) {
                        self.walk(sub, &child_path, depth + 1);
                    }
                }
                continue;
            }
            if !self.declared(&child_path) {
                self.reject(&child_path, reason::UNDECLARED);
                continue;
            }
            use std::os::unix::fs::MetadataExt;
            let rejection = if file_type.is_symlink() {
                Some(reason::SYMLINK)
            } else if !file_type.is_file() {
                Some(reason::NOT_REGULAR)
            } else if meta.nlink() > 1 {
                // A second name could be an undeclared file's content under a declared name.
                Some(reason::HARDLINK)
            } else if meta.len() > self.request.max_file_bytes {
                Some(reason::TOO_LARGE)
            } else if self.total_bytes + meta.len() > self.request.max_total_bytes {
                Some(reason::TOTAL_TOO_LARGE)
            } else {
                None
            };
            if let Some(reason) = rejection {
                self.reject(&child_path, reason);
                continue;
            }
            match self.copy_out(&dir, &name, &child_path, meta.ino()) {
                Ok(kept) => {
                    self.total_bytes += kept.size_bytes;
                    self.report.kept.push(kept);
                }
                Err(reason) => self.reject(&child_path, reason),
            }
        }
    }

    fn copy_out(
        &self,
        dir: &OwnedFd,
        name: &std::ffi::OsStr,
        cell_path: &str,
        inode: u64,
    ) -> Result<ArtifactKept, &'static str> {
        use std::os::unix::fs::MetadataExt;
        let fd = sys::open_no_symlinks(
            dir.as_fd(),
            Path::new(name),
            libc::O_RDONLY | libc::O_NONBLOCK,
            false,
        )
        .map_err(|_| reason::UNREADABLE)?;
        let mut source = File::from(fd);
        let meta = source.metadata().map_err(|_| reason::UNREADABLE)?;
        if meta.ino() != inode || !meta.is_file() {
            return Err(reason::NOT_REGULAR);
        }
        let relative = cell_path.trim_start_matches('/');
        let destination = self.request.output_dir.join(relative);
        if let Some(parent) = destination.parent() {
            std::fs::create_dir_all(parent).map_err(|_| reason::UNREADABLE)?;
        }
        let mut out = File::create(&destination).map_err(|_| reason::UNREADABLE)?;
        let mut hasher = Sha256::new();
        let mut buf = vec![0u8; 64 * 1024];
        let mut size = 0u64;
        loop {
            let n = source.read(&mut buf).map_err(|_| reason::UNREADABLE)?;
            if n == 0 {
                break;
            }
            size += n as u64;
            if size > self.request.max_file_bytes {
                drop(out);
                let _ = std::fs::remove_file(&destination);
                return Err(reason::TOO_LARGE);
            }
            hasher.update(&buf[..n]);
            out.write_all(&buf[..n]).map_err(|_| reason::UNREADABLE)?;
        }
        Ok(ArtifactKept {
            path: cell_path.to_string(),
            size_bytes: size,
            sha256: hex::encode(hasher.finalize()),
            stored_at: destination,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::glob_matches;

    #[test]
    fn globs_stay_within_segments() {
        assert!(glob_matches("/output/report.pdf", "/output/report.pdf"));
        assert!(glob_matches("/output/*.pdf", "/output/a.pdf"));
        assert!(!glob_matches("/output/*.pdf", "/output/sub/a.pdf"));
        assert!(!glob_matches("/output/*.pdf", "/output/a.pdf.txt"));
        assert!(glob_matches("/output/r?port.pdf", "/output/report.pdf"));
        assert!(!glob_matches("/output/report.pdf", "/tmp/report.pdf"));
        assert!(glob_matches("/output/r[0-9].txt", "/output/r7.txt"));
        assert!(!glob_matches("/output/r[0-9].txt", "/output/rx.txt"));
        assert!(glob_matches("/output/r[!0-9].txt", "/output/rx.txt"));
        assert!(glob_matches("/output/[ab]*", "/output/beta"));
    }
}
