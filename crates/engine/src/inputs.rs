//! The content hash of a run's read-only inputs, computed while the payload runs.
//!
//! Hashing every byte before the start made the start grow with the inputs (a 2.9 GB
//! toolchain cost 15-24 s per run). The start now records only the inputs' identity
//! (record.rs); this walk reads the content on a thread started once the cell is
//! released, and its result is the record's `inputs`. Files whose identity (device,
//! inode, size, mtime, ctime) was hashed before are taken from the state directory's
//! cache (airlock_store::input_cache), so a large input is read once, not per run.

use airlock_contract::{CellPlan, MountPlan};
use airlock_store::input_cache::{FileIdentity, InputHashCache};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// `(target in the cell, host source)` of every read-only input of the plan.
pub fn readonly_inputs(plan: &CellPlan) -> Vec<(PathBuf, PathBuf)> {
    plan.mounts
        .iter()
        .filter_map(|mount| match mount {
            MountPlan::ReadonlyInput { source, target } => Some((target.clone(), source.clone())),
            _ => None,
        })
        .collect()
}

/// The `inputs` of a result record.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct InputContents {
    /// sha256 over every entry below the inputs, in sorted order: its path in the cell
    /// and its content hash (files), link target (symlinks) or type (anything else).
    pub sha256: String,
    pub files: u64,
    pub bytes: u64,
    /// Files whose hash came from the cache rather than from reading them.
    pub cached_files: u64,
    /// Why the hash is incomplete (an unreadable entry), if it is; `sha256` is then empty.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

struct Walk {
    digest: Sha256,
    contents: InputContents,
    cache: Option<InputHashCache>,
    fresh: Vec<(FileIdentity, String)>,
}

/// Starts hashing the content of `inputs` on a thread of its own (the start must not wait
/// for it, see above); `None` when there are none. [`join`] gives the result.
pub fn hash_in_background(
    inputs: Vec<(PathBuf, PathBuf)>,
    state_dir: PathBuf,
) -> Option<std::thread::JoinHandle<InputContents>> {
    (!inputs.is_empty()).then(|| std::thread::spawn(move || hash_contents(&inputs, &state_dir)))
}

/// The result of [`hash_in_background`].
pub fn join(hashing: std::thread::JoinHandle<InputContents>) -> InputContents {
    hashing.join().unwrap_or_else(|_| InputContents {
        error: Some("hashing the read-only inputs panicked".to_string()),
        ..InputContents::default()
    })
}

/// Hashes the content of `inputs`, using and filling the cache in `state_dir`.
pub fn hash_contents(inputs: &[(PathBuf, PathBuf)], state_dir: &Path) -> InputContents {
    let mut walk = Walk {
        digest: Sha256::new(),
        contents: InputContents::default(),
        // Without a cache (an unwritable state dir) everything is read: slower, as correct.
        cache: InputHashCache::open(state_dir).ok(),
        fresh: Vec::new(),
    };
    let walked = inputs.iter().try_for_each(|(target, source)| {
        // The input itself is followed, as its bind mount is; entries below it are not.
        let meta = std::fs::metadata(source)?;
        walk.entry(target, source, &meta)
    });
    if let Some(cache) = walk.cache.as_mut() {
        let _ = cache.remember(&walk.fresh);
    }
    let mut contents = walk.contents;
    match walked {
        Ok(()) => contents.sha256 = hex::encode(walk.digest.finalize()),
        Err(err) => contents.error = Some(err.to_string()),
    }
    contents
}

impl Walk {
    fn part(&mut self, path: &Path, kind: &[u8], value: &[u8]) {
        for bytes in [path.as_os_str().as_bytes(), kind, value] {
            self.digest.update((bytes.len() as u64).to_le_bytes());
            self.digest.update(bytes);
        }
    }

    fn entry(
        &mut self,
        target: &Path,
        source: &Path,
        meta: &std::fs::Metadata,
    ) -> std::io::Result<()> {
        let kind = meta.file_type();
        if kind.is_dir() {
            let mut names: Vec<_> = std::fs::read_dir(source)?
                .map(|e| e.map(|e| e.file_name()))
                .collect::<Result<_, _>>()?;
            names.sort();
            self.part(target, b"dir", b"");
            for name in names {
                let child = source.join(&name);
                let meta = std::fs::symlink_metadata(&child)?;
                self.entry(&target.join(&name), &child, &meta)?;
            }
        } else if kind.is_file() {
            let sha256 = self.file_hash(source, meta)?;
            self.part(target, b"file", sha256.as_bytes());
        } else if kind.is_symlink() {
            let link = std::fs::read_link(source)?;
            self.part(target, b"symlink", link.as_os_str().as_bytes());
        } else {
            self.part(target, b"other", b"");
        }
        Ok(())
    }

    fn file_hash(&mut self, source: &Path, meta: &std::fs::Metadata) -> std::io::Result<String> {
        let identity = FileIdentity::of(meta);
        self.contents.files += 1;
        self.contents.bytes += meta.len();
        let cached = self
            .cache
            .as_ref()
            .and_then(|cache| cache.lookup(&identity).ok().flatten());
        if let Some(sha256) = cached {
            self.contents.cached_files += 1;
            return Ok(sha256);
        }
        let sha256 = sha256_of(&mut open_regular(source, &identity)?)?;
        self.fresh.push((identity, sha256.clone()));
        Ok(sha256)
    }
}

/// The regular file `source` whose identity the walk saw, opened so that whatever took
/// its place meanwhile cannot stall the hash: `O_NONBLOCK` (a FIFO does not wait for a
/// writer), `O_NOFOLLOW` (a symlink is not followed), `O_NOCTTY`; then checked with
/// fstat to be that same regular file (another inode is an error, never hashed).
fn open_regular(source: &Path, seen: &FileIdentity) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW | libc::O_NOCTTY)
        .open(source)?;
    let meta = file.metadata()?;
    if !meta.is_file() || FileIdentity::of(&meta) != *seen {
        return Err(std::io::Error::other(format!(
            "{}: changed while the inputs were hashed (no longer the regular file seen)",
            source.display()
        )));
    }
    Ok(file)
}

/// sha256 of everything `reader` yields (fixed-size buffer: memory stays bounded).
fn sha256_of(reader: &mut impl Read) -> std::io::Result<String> {
    let mut digest = Sha256::new();
    let mut buf = vec![0u8; 256 * 1024];
    loop {
        let n = reader.read(&mut buf)?;
        if n == 0 {
            return Ok(hex::encode(digest.finalize()));
        }
        digest.update(&buf[..n]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree(root: &Path) {
        std::fs::create_dir_all(root.join("sub")).unwrap();
        std::fs::write(root.join("a.txt"), b"alpha").unwrap();
        std::fs::write(root.join("sub/b.bin"), vec![7u8; 100_000]).unwrap();
        std::os::unix::fs::symlink("a.txt", root.join("link")).unwrap();
    }

    #[test]
    fn the_second_hash_of_unchanged_inputs_reads_nothing_and_agrees() {
        let dir = tempfile::tempdir().unwrap();
        let (input, state) = (dir.path().join("in"), dir.path().join("state"));
        tree(&input);
        std::fs::create_dir(&state).unwrap();
        let inputs = [(PathBuf::from("/input"), input.clone())];
        let first = hash_contents(&inputs, &state);
        assert_eq!(
            (first.files, first.cached_files, first.bytes),
            (2, 0, 100_005)
        );
        let second = hash_contents(&inputs, &state);
        assert_eq!(second.cached_files, 2);
        assert_eq!(first.sha256, second.sha256);
        assert_eq!(first.sha256.len(), 64);
    }

    #[test]
    fn any_change_below_an_input_changes_the_hash() {
        let dir = tempfile::tempdir().unwrap();
        let (input, state) = (dir.path().join("in"), dir.path().join("state"));
        tree(&input);
        std::fs::create_dir(&state).unwrap();
        let inputs = [(PathBuf::from("/input"), input.clone())];
        let before = hash_contents(&inputs, &state).sha256;
        std::fs::write(input.join("sub/b.bin"), vec![8u8; 100_000]).unwrap();
        let content = hash_contents(&inputs, &state).sha256;
        assert_ne!(before, content, "same size, other bytes");
        std::fs::remove_file(input.join("link")).unwrap();
        std::os::unix::fs::symlink("sub", input.join("link")).unwrap();
        assert_ne!(
            content,
            hash_contents(&inputs, &state).sha256,
            "a symlink's target"
        );
    }

    #[test]
    fn a_fifo_in_place_of_a_file_is_an_error_not_a_wait() {
        let tmp = tempfile::tempdir().unwrap();
        let fifo = tmp.path().join("f");
        assert!(std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success());
        let file = tmp.path().join("file");
        std::fs::write(&file, b"x").unwrap();
        let seen = FileIdentity::of(&std::fs::metadata(&file).unwrap());
        // The walk saw a regular file; a FIFO is there when it is opened.
        let err = open_regular(&fifo, &seen).unwrap_err();
        assert!(
            err.to_string().contains("no longer the regular file"),
            "{err}"
        );
        assert!(open_regular(&file, &seen).is_ok());
    }

    #[test]
    fn an_unreadable_entry_is_reported_not_hidden() {
        let dir = tempfile::tempdir().unwrap();
        let inputs = [(PathBuf::from("/input"), dir.path().join("missing"))];
        let contents = hash_contents(&inputs, dir.path());
        assert!(contents.sha256.is_empty());
        assert!(contents.error.unwrap().contains("No such file"));
    }
}
