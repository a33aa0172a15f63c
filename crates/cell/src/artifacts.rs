//! Artifact collection: only declared, regular, single-link files inside the writable
//! output paths leave the cell, size-capped and sha256-hashed.
//!
//! Runs in the supervisor after the payload ended and every other process of the cell was
//! killed (so nothing changes underneath). The output mounts are opened through
//! `/proc/<pid1>/root` once the payload runs and held until then ([`OutputMounts`]), so a
//! cell whose pid 1 died too is still collected. Everything below them is reached with
//! `openat2`, which refuses symlinks and magic links at every step, so a payload cannot
//! point the collector at a host file.

use crate::host_files::{escaped, HostDir, WriteRefusal};
use crate::sys;
use crate::CellError;
use airlock_contract::{CellPlan, MountPlan};
use serde::{Deserialize, Deserializer, Serialize};
use sha2::{Digest, Sha256};
use std::ffi::OsStr;
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// Walk limits: a payload cannot make collection take unbounded time.
const MAX_ENTRIES: usize = 10_000;
const MAX_DEPTH: usize = 32;

/// Why an artifact was rejected (the cell side: policy) or not delivered (the host side
/// could not write it: see [`crate::host_files::WriteRefusal::artifact_reason`] for those).
pub mod reason {
    pub const UNDECLARED: &str = "artifact.undeclared";
    pub const SYMLINK: &str = "artifact.symlink";
    pub const NOT_REGULAR: &str = "artifact.not_regular";
    pub const HARDLINK: &str = "artifact.hardlink";
    pub const TOO_LARGE: &str = "artifact.too_large";
    pub const TOTAL_TOO_LARGE: &str = "artifact.total_too_large";
    pub const UNREADABLE: &str = "artifact.unreadable";
    pub const TOO_MANY: &str = "artifact.too_many_entries";
    /// Every code the cell side gives.
    pub const ALL: [&str; 8] = [
        UNDECLARED,
        SYMLINK,
        NOT_REGULAR,
        HARDLINK,
        TOO_LARGE,
        TOTAL_TOO_LARGE,
        UNREADABLE,
        TOO_MANY,
    ];
}

/// A reason code read back from a report: one of [`reason::ALL`] or a host-side
/// [`WriteRefusal`]'s.
fn reason_code<'de, D: Deserializer<'de>>(deserializer: D) -> Result<&'static str, D::Error> {
    let host_side = [
        WriteRefusal::Exists,
        WriteRefusal::UnsafePath,
        WriteRefusal::DirectoryUnusable,
        WriteRefusal::WriteFailed,
    ]
    .map(WriteRefusal::artifact_reason);
    let known: Vec<&'static str> = reason::ALL.into_iter().chain(host_side).collect();
    crate::report::known_name(deserializer, &known)
}

/// Where accepted artifacts go and how large they may be.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ArtifactRequest {
    pub output_dir: PathBuf,
    pub max_file_bytes: u64,
    pub max_total_bytes: u64,
}

/// Paths in these records are the cell's bytes, written as [`escaped`] writes them
/// (lossless: `\\` for a backslash, `\xHH` for a byte that is not printable UTF-8).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ArtifactKept {
    /// Path inside the cell.
    pub path: String,
    pub size_bytes: u64,
    pub sha256: String,
    /// Where it was copied to on the host.
    pub stored_at: String,
    /// The file is exactly as large as the cell's `file_size_mb` allows: a write past
    /// that size was refused (`RLIMIT_FSIZE`), so its content may be cut short. Its size
    /// alone cannot tell a file that was cut from one that fits exactly, so both are
    /// flagged.
    pub truncated: bool,
    /// The cell's file had an execute bit: the host copy is `0700` rather than `0600`.
    pub executable: bool,
}

/// An artifact refused by policy: it never leaves the cell.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ArtifactRejection {
    pub path: String,
    #[serde(deserialize_with = "reason_code")]
    pub reason: crate::report::Name,
}

/// An artifact policy accepted but the host side could not write: lost, which makes the
/// run `delivery_failed`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ArtifactUndelivered {
    pub path: String,
    #[serde(deserialize_with = "reason_code")]
    pub reason: crate::report::Name,
    pub error: String,
}

#[derive(Debug, Default, Clone, Serialize, Deserialize)]
pub struct ArtifactReport {
    pub kept: Vec<ArtifactKept>,
    pub rejected: Vec<ArtifactRejection>,
    pub undelivered: Vec<ArtifactUndelivered>,
}

/// Why one artifact did not arrive.
enum CopyFailure {
    Rejected(&'static str),
    Undelivered(WriteRefusal, String),
}

/// The cause and message of a host-side error.
fn host_failure(err: CellError) -> (WriteRefusal, String) {
    let refusal = match &err {
        CellError::HostWrite { refusal, .. } => *refusal,
        _ => WriteRefusal::WriteFailed,
    };
    (refusal, err.to_string())
}

impl From<CellError> for CopyFailure {
    fn from(err: CellError) -> CopyFailure {
        let (refusal, error) = host_failure(err);
        CopyFailure::Undelivered(refusal, error)
    }
}

/// Matches a `/`-separated glob. `*`, `?` and `[...]` stay within one path segment; a
/// segment that is exactly `**` matches zero or more whole segments (`/output/**` is every
/// file below `/output`, `/output/**/*.txt` every `.txt` file at any depth). The path is
/// the cell's bytes: `?` matches one byte, whatever the encoding.
///
/// The cost is bounded by the sizes of the pattern and the path (a table over their
/// segments, and a single-backtrack scan within a segment), never exponential: the
/// patterns are the contract's, the names are the payload's.
pub fn glob_matches(pattern: &str, path: &[u8]) -> bool {
    let (pattern, path) = (segments(pattern.as_bytes()), segments(path));
    // `reached[j]`: the pattern's segments so far match the path's first `j` segments.
    let mut reached = vec![false; path.len() + 1];
    reached[0] = true;
    for glob in &pattern {
        let mut next = vec![false; path.len() + 1];
        if *glob == b"**" {
            let mut any = false;
            for (j, slot) in next.iter_mut().enumerate() {
                any |= reached[j];
                *slot = any;
            }
        } else {
            for j in 1..=path.len() {
                next[j] = reached[j - 1] && segment_matches(glob, path[j - 1]);
            }
        }
        reached = next;
    }
    reached[path.len()]
}

/// The segments of a `/`-separated path, without leading or trailing slashes.
fn segments(bytes: &[u8]) -> Vec<&[u8]> {
    let start = bytes.iter().position(|b| *b != b'/').unwrap_or(bytes.len());
    let end = bytes
        .iter()
        .rposition(|b| *b != b'/')
        .map_or(start, |i| i + 1);
    bytes[start..end.max(start)].split(|b| *b == b'/').collect()
}

/// One element of a segment's pattern; everything but `*` matches exactly one byte.
enum Token<'a> {
    Star,
    Any,
    Class { set: &'a [u8], negated: bool },
    Byte(u8),
}

impl Token<'_> {
    fn matches(&self, c: u8) -> bool {
        match self {
            Token::Star => true,
            Token::Any => true,
            Token::Class { set, negated } => class_contains(set, c) != *negated,
            Token::Byte(b) => *b == c,
        }
    }
}

fn tokens(pattern: &[u8]) -> Vec<Token<'_>> {
    let mut out = Vec::with_capacity(pattern.len());
    let mut i = 0;
    while i < pattern.len() {
        let token = match pattern[i] {
            b'*' => Token::Star,
            b'?' => Token::Any,
            b'[' => match class_at(&pattern[i + 1..]) {
                Some((token, used)) => {
                    out.push(token);
                    i += 1 + used;
                    continue;
                }
                // An unclosed `[` is a literal.
                None => Token::Byte(b'['),
            },
            b => Token::Byte(b),
        };
        out.push(token);
        i += 1;
    }
    out
}

/// The class whose body (after `[`) starts `body` (`abc]`, `a-z]`, `!x]`) and how many
/// bytes it takes, `]` included; `None` when there is no `]`.
fn class_at(body: &[u8]) -> Option<(Token<'_>, usize)> {
    let (negated, skip) = match body.first() {
        Some(b'!') | Some(b'^') => (true, 1),
        _ => (false, 0),
    };
    let set_start = &body[skip..];
    // A `]` right after the opening (or its `!`) is a member, not the end.
    let close = set_start.iter().skip(1).position(|b| *b == b']')? + 1;
    let set = &set_start[..close];
    Some((Token::Class { set, negated }, skip + close + 1))
}

fn class_contains(set: &[u8], c: u8) -> bool {
    let mut i = 0;
    while i < set.len() {
        if i + 2 < set.len() && set[i + 1] == b'-' {
            if (set[i]..=set[i + 2]).contains(&c) {
                return true;
            }
            i += 3;
        } else {
            if set[i] == c {
                return true;
            }
            i += 1;
        }
    }
    false
}

/// Matches one segment: the classic wildcard scan that, on a mismatch, only ever retries
/// from the last `*` (one byte further each time), so at most |pattern| x |text| steps.
fn segment_matches(pattern: &[u8], text: &[u8]) -> bool {
    let tokens = tokens(pattern);
    let (mut t, mut s) = (0, 0);
    // The token after the last `*` seen and the text position that `*` resumes from.
    let mut retry: Option<(usize, usize)> = None;
    while s < text.len() {
        match tokens.get(t) {
            Some(Token::Star) => {
                retry = Some((t + 1, s));
                t += 1;
            }
            Some(token) if token.matches(text[s]) => {
                t += 1;
                s += 1;
            }
            _ => match retry {
                Some((after_star, from)) => {
                    retry = Some((after_star, from + 1));
                    t = after_star;
                    s = from + 1;
                }
                None => return false,
            },
        }
    }
    tokens[t..].iter().all(|token| matches!(token, Token::Star))
}

struct Collector<'a> {
    request: &'a ArtifactRequest,
    globs: &'a [String],
    /// The cell's `RLIMIT_FSIZE`: a file of exactly this size may have been cut short.
    file_size_limit: u64,
    report: ArtifactReport,
    entries: usize,
    total_bytes: u64,
    /// The output directory, opened at the first artifact to deliver (a run without
    /// artifacts creates none); the message of its error, if it could not be.
    output: Option<Result<HostDir, (WriteRefusal, String)>>,
}

/// The writable mounts of a cell that hold declared outputs, opened through its root.
///
/// Opened once the payload runs (the cell's mounts are all in place by then, and a
/// payload cannot move or unmount them), and held until collection: an open directory
/// keeps its tmpfs alive and reachable after the cell's pid 1 and its mount namespace are
/// gone, so the outputs of a cell killed as a whole (a memory kill that takes pid 1 too,
/// or a group OOM kill on cgroup v2) are still validated and collected.
#[derive(Default)]
pub struct OutputMounts {
    /// `(cell path of the mount, its root directory)`.
    dirs: Vec<(Vec<u8>, OwnedFd)>,
    /// Why the cell's root could not be opened, if it could not.
    unreadable: Option<String>,
}

impl OutputMounts {
    /// Opens the writable paths of `plan` that hold declared outputs, in the cell whose
    /// pid 1 is `pid1` (which must be alive).
    pub fn open(pid1: libc::pid_t, plan: &CellPlan) -> OutputMounts {
        let cell_root = format!("/proc/{pid1}/root");
        let root = match File::open(&cell_root) {
            Ok(root) => root,
            Err(err) => {
                return OutputMounts {
                    dirs: Vec::new(),
                    unreadable: Some(format!("{cell_root}: {err}")),
                }
            }
        };
        let dirs = output_mount_targets(plan)
            .filter_map(|target| {
                let flags = libc::O_RDONLY | libc::O_DIRECTORY;
                sys::open_no_symlinks(root.as_fd(), target, flags, true)
                    .ok()
                    .map(|dir| (target.as_os_str().as_bytes().to_vec(), dir))
            })
            .collect();
        OutputMounts {
            dirs,
            unreadable: None,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.dirs.is_empty() && self.unreadable.is_none()
    }

    /// The gVisor tier's: the host tmpfs of each writable path of `plan` (`dirs`, in plan
    /// order) that holds declared outputs. The payload cannot replace them (they are
    /// mounts of the host, outside its sandbox), so they are opened by their host path.
    pub fn open_host_dirs(plan: &CellPlan, dirs: &[PathBuf]) -> OutputMounts {
        let writable = plan
            .mounts
            .iter()
            .filter(|m| matches!(m, MountPlan::WritableTmpfs { .. }));
        let wanted: Vec<&Path> = output_mount_targets(plan).collect();
        let dirs = writable
            .zip(dirs)
            .filter_map(|(mount, dir)| {
                let MountPlan::WritableTmpfs { target, .. } = mount else {
                    return None;
                };
                if !wanted.contains(&target.as_path()) {
                    return None;
                }
                let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW;
                let opened = File::options()
                    .read(true)
                    .custom_flags(flags)
                    .open(dir)
                    .ok()?;
                Some((
                    target.as_os_str().as_bytes().to_vec(),
                    OwnedFd::from(opened),
                ))
            })
            .collect();
        OutputMounts {
            dirs,
            unreadable: None,
        }
    }
}

/// The writable paths of `plan` that some output glob lies inside.
fn output_mount_targets(plan: &CellPlan) -> impl Iterator<Item = &Path> {
    plan.mounts.iter().filter_map(|mount| {
        let MountPlan::WritableTmpfs { target, .. } = mount else {
            return None;
        };
        let prefix = target.as_os_str().as_bytes();
        let holds_outputs = plan.output_allowlist.iter().any(|g| {
            g.as_bytes().starts_with(prefix) && g.as_bytes().get(prefix.len()) == Some(&b'/')
        });
        holds_outputs.then_some(target.as_path())
    })
}

/// Collects the plan's declared artifacts from `mounts`. Nothing of the cell may run any
/// more (its payload ended and every other process was killed), so nothing changes
/// underneath.
pub fn collect(
    mounts: &OutputMounts,
    plan: &CellPlan,
    request: &ArtifactRequest,
) -> ArtifactReport {
    let mut collector = Collector {
        request,
        globs: &plan.output_allowlist,
        file_size_limit: plan.limits.file_size_bytes,
        report: ArtifactReport::default(),
        entries: 0,
        total_bytes: 0,
        output: None,
    };
    if let Some(error) = &mounts.unreadable {
        collector.report.rejected.push(ArtifactRejection {
            path: escaped(error.as_bytes()),
            reason: reason::UNREADABLE,
        });
    }
    for (prefix, dir) in &mounts.dirs {
        match dir.try_clone() {
            Ok(dir) => collector.walk(dir, prefix, 0),
            Err(_) => collector.reject(prefix, reason::UNREADABLE),
        }
    }
    collector.report
}

impl Collector<'_> {
    fn reject(&mut self, path: &[u8], reason: &'static str) {
        self.report.rejected.push(ArtifactRejection {
            path: escaped(path),
            reason,
        });
    }

    fn declared(&self, path: &[u8]) -> bool {
        self.globs.iter().any(|g| glob_matches(g, path))
    }

    fn walk(&mut self, dir: OwnedFd, cell_path: &[u8], depth: usize) {
        let listing = match std::fs::read_dir(format!(
            "/proc/self/fd/{}",
            std::os::fd::AsRawFd::as_raw_fd(&dir)
        )) {
            Ok(l) => l,
            Err(_) => return self.reject(cell_path, reason::UNREADABLE),
        };
        // Names stay bytes: a lossy conversion would give two files one name.
        let mut names: Vec<_> = listing.flatten().map(|e| e.file_name()).collect();
        names.sort();
        for name in names {
            self.entries += 1;
            if self.entries > MAX_ENTRIES {
                return self.reject(cell_path, reason::TOO_MANY);
            }
            let child_path = [cell_path, b"/", name.as_bytes()].concat();
            self.visit(&dir, &name, &child_path, depth);
        }
    }

    fn visit(&mut self, dir: &OwnedFd, name: &OsStr, child_path: &[u8], depth: usize) {
        use std::os::unix::fs::MetadataExt;
        // O_PATH|O_NOFOLLOW opens a symlink itself, so its type can be checked.
        let Ok(meta) = sys::open_no_symlinks(dir.as_fd(), Path::new(name), libc::O_PATH, false)
            .and_then(|handle| File::from(handle).metadata())
        else {
            return self.reject(child_path, reason::UNREADABLE);
        };
        let file_type = meta.file_type();
        if file_type.is_dir() {
            if depth < MAX_DEPTH {
                if let Ok(sub) = sys::open_no_symlinks(
                    dir.as_fd(),
                    Path::new(name),
                    libc::O_RDONLY | libc::O_DIRECTORY,
                    false,
                ) {
                    self.walk(sub, child_path, depth + 1);
                }
            }
            return;
        }
        if !self.declared(child_path) {
            return self.reject(child_path, reason::UNDECLARED);
        }
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
            return self.reject(child_path, reason);
        }
        match self.copy_out(dir, name, child_path, meta.ino()) {
            Ok(kept) => {
                self.total_bytes += kept.size_bytes;
                self.report.kept.push(kept);
            }
            Err(CopyFailure::Rejected(reason)) => self.reject(child_path, reason),
            Err(CopyFailure::Undelivered(refusal, error)) => {
                self.report.undelivered.push(ArtifactUndelivered {
                    path: escaped(child_path),
                    reason: refusal.artifact_reason(),
                    error,
                })
            }
        }
    }

    /// The host directory that `cell_path`'s file goes into: the output directory plus
    /// the cell path's directories, created as needed, never through a symlink.
    fn destination_dir(&mut self, cell_path: &[u8]) -> Result<HostDir, CopyFailure> {
        let output_dir = &self.request.output_dir;
        let root = self
            .output
            .get_or_insert_with(|| HostDir::open_or_create(output_dir).map_err(host_failure));
        let root = match root {
            Ok(root) => root,
            Err((refusal, error)) => return Err(CopyFailure::Undelivered(*refusal, error.clone())),
        };
        let mut components = cell_path.split(|b| *b == b'/').filter(|c| !c.is_empty());
        let _file_name = components.next_back();
        let mut dir = root.subdir(OsStr::from_bytes(components.next().unwrap_or(b".")))?;
        for component in components {
            dir = dir.subdir(OsStr::from_bytes(component))?;
        }
        Ok(dir)
    }

    fn copy_out(
        &mut self,
        dir: &OwnedFd,
        name: &OsStr,
        cell_path: &[u8],
        inode: u64,
    ) -> Result<ArtifactKept, CopyFailure> {
        use std::os::unix::fs::MetadataExt;
        let unreadable = |_| CopyFailure::Rejected(reason::UNREADABLE);
        let fd = sys::open_no_symlinks(
            dir.as_fd(),
            Path::new(name),
            libc::O_RDONLY | libc::O_NONBLOCK,
            false,
        )
        .map_err(unreadable)?;
        let mut source = File::from(fd);
        let meta = source.metadata().map_err(unreadable)?;
        if meta.ino() != inode || !meta.is_file() {
            return Err(CopyFailure::Rejected(reason::NOT_REGULAR));
        }
        let host_dir = self.destination_dir(cell_path)?;
        let mut out = host_dir.new_file(name)?;
        // Only the owner's execute bit, and never setuid, setgid or sticky: the copy is
        // the caller's to run, not anyone else's.
        let executable = meta.mode() & 0o111 != 0;
        if executable {
            out.make_executable()?;
        }
        let mut hasher = Sha256::new();
        let mut buf = vec![0u8; 64 * 1024];
        let mut size = 0u64;
        loop {
            let n = source.read(&mut buf).map_err(unreadable)?;
            if n == 0 {
                break;
            }
            size += n as u64;
            if size > self.request.max_file_bytes {
                // Dropping `out` removes the partial copy.
                return Err(CopyFailure::Rejected(reason::TOO_LARGE));
            }
            hasher.update(&buf[..n]);
            out.write_all(&buf[..n]).map_err(|e| {
                let path = host_dir.path().join(name);
                CopyFailure::from(CellError::HostWrite {
                    destination: escaped(path.as_os_str().as_bytes()),
                    refusal: WriteRefusal::WriteFailed,
                    source: e,
                })
            })?;
        }
        let stored_at = out.commit()?;
        Ok(ArtifactKept {
            path: escaped(cell_path),
            size_bytes: size,
            sha256: hex::encode(hasher.finalize()),
            stored_at: escaped(stored_at.as_os_str().as_bytes()),
            truncated: self.file_size_limit > 0 && size == self.file_size_limit,
            executable,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::glob_matches;

    #[test]
    fn globs_stay_within_segments() {
        let glob_matches = |p: &str, s: &str| glob_matches(p, s.as_bytes());
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

    #[test]
    fn globs_match_names_that_are_not_utf8_byte_for_byte() {
        assert!(glob_matches("/output/*", b"/output/n\xff"));
        assert!(glob_matches("/output/n?", b"/output/n\xfe"));
        assert!(!glob_matches("/output/n?", b"/output/n\xc3\xa9"));
        assert!(!glob_matches("/output/*", b"/output/sub/n\xff"));
    }

    #[test]
    fn a_double_star_segment_matches_any_depth_below_its_prefix() {
        let glob_matches = |p: &str, s: &str| glob_matches(p, s.as_bytes());
        assert!(glob_matches("/output/**", "/output/a/b/c.txt"));
        assert!(glob_matches("/output/**", "/output/x"));
        assert!(glob_matches("/output/**/*.txt", "/output/c.txt"));
        assert!(glob_matches("/output/**/*.txt", "/output/a/b/c.txt"));
        assert!(!glob_matches("/output/**/*.txt", "/output/a/b/c.pdf"));
        assert!(glob_matches("/output/a/**/z", "/output/a/z"));
        assert!(glob_matches("/output/a/**/z", "/output/a/b/c/z"));
        assert!(!glob_matches("/output/a/**/z", "/output/b/z"));
        // Only a whole segment is `**`; within a segment two stars are one.
        assert!(!glob_matches("/output/a**", "/output/ab/c"));
        assert!(glob_matches("/output/a**", "/output/abc"));
    }

    #[test]
    fn a_double_star_never_reaches_outside_its_prefix() {
        let glob_matches = |p: &str, s: &str| glob_matches(p, s.as_bytes());
        assert!(!glob_matches("/output/**", "/tmp/a"));
        assert!(!glob_matches("/output/**", "/outputs/a"));
        assert!(!glob_matches("/output/**", "/tmp/output/a"));
        assert!(!glob_matches("/output/**/x", "/tmp/output/x"));
    }

    #[test]
    fn hostile_patterns_and_names_are_matched_in_bounded_time() {
        let started = std::time::Instant::now();
        let name = format!("/output/{}", "a".repeat(200));
        let stars = format!("/output/{}b", "*a".repeat(40));
        assert!(!glob_matches(&stars, name.as_bytes()));
        let deep = format!("/output/{}x", "a/".repeat(32));
        let double_stars = format!("/output/{}y", "**/".repeat(40));
        assert!(!glob_matches(&double_stars, deep.as_bytes()));
        let mixed = format!("/output/{}*b", "**/*a*a*a*/".repeat(16));
        assert!(!glob_matches(&mixed, deep.as_bytes()));
        assert!(
            started.elapsed() < std::time::Duration::from_millis(500),
            "took {:?}",
            started.elapsed()
        );
    }

    #[test]
    fn classes_keep_their_rules() {
        let glob_matches = |p: &str, s: &str| glob_matches(p, s.as_bytes());
        assert!(glob_matches("/output/[]x]", "/output/]"));
        assert!(glob_matches("/output/[!]]", "/output/a"));
        assert!(!glob_matches("/output/[!]]", "/output/]"));
        assert!(glob_matches("/output/a[", "/output/a["));
        assert!(glob_matches("/output/*[0-9]", "/output/report7"));
        assert!(!glob_matches("/output/*[0-9]", "/output/report"));
    }
}
