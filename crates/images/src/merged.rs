//! What a stack of unpacked layers shows at one directory, without mounting it: the
//! overlayfs rules the cell's root follows (the top layer's entry wins, a whiteout, a
//! character device 0/0, hides the name below it, an opaque directory hides every lower
//! layer's entries). The CLI uses it to name the image's top-level and `/etc` entries in
//! the plan, and to read the image's own `/etc/passwd` for a `User` given by name.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

/// An entry of the merged view.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MergedKind {
    Dir,
    File,
    Symlink(PathBuf),
}

fn is_whiteout(meta: &fs::Metadata) -> bool {
    meta.file_type().is_char_device() && meta.rdev() == 0
}

fn is_opaque(dir: &Path) -> bool {
    let mut value = [0u8; 4];
    matches!(
        rustix::fs::getxattr(dir, "trusted.overlay.opaque", &mut value),
        Ok(1)
    ) && value[0] == b'y'
}

/// The entries of `dir` (relative to each layer's root) in the merged view of `layers`
/// (top first). Layers are searched from the top; a lower layer is not consulted below a
/// whiteout, a non-directory, or an opaque directory. Unreadable directories count as
/// empty: the view only names what exists.
pub fn merged_entries(layers: &[PathBuf], dir: &Path) -> BTreeMap<String, MergedKind> {
    let mut entries = BTreeMap::new();
    let mut hidden: Vec<String> = Vec::new();
    for layer in layers {
        let here = layer.join(dir);
        let Ok(meta) = fs::symlink_metadata(&here) else {
            continue;
        };
        if !meta.is_dir() {
            break;
        }
        for entry in fs::read_dir(&here).into_iter().flatten().flatten() {
            let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
                continue;
            };
            if entries.contains_key(&name) || hidden.contains(&name) {
                continue;
            }
            let Ok(meta) = entry.metadata() else { continue };
            if is_whiteout(&meta) {
                hidden.push(name);
                continue;
            }
            let kind = if meta.file_type().is_symlink() {
                match fs::read_link(entry.path()) {
                    Ok(target) => MergedKind::Symlink(target),
                    Err(_) => continue,
                }
            } else if meta.is_dir() {
                MergedKind::Dir
            } else {
                MergedKind::File
            };
            entries.insert(name, kind);
        }
        if is_opaque(&here) {
            break;
        }
    }
    entries
}

/// The content of the regular file at `path` (relative) in the merged view: the top
/// layer that has the name decides (a whiteout or another type there means none).
pub fn merged_file(layers: &[PathBuf], path: &Path) -> Option<Vec<u8>> {
    for layer in layers {
        let here = layer.join(path);
        let Ok(meta) = fs::symlink_metadata(&here) else {
            continue;
        };
        return meta.is_file().then(|| fs::read(&here).ok()).flatten();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_top_layer_wins_and_a_whiteout_hides_the_lower_entry() {
        let top = tempfile::tempdir().unwrap();
        let low = tempfile::tempdir().unwrap();
        fs::create_dir_all(top.path().join("etc")).unwrap();
        fs::create_dir_all(low.path().join("etc")).unwrap();
        fs::write(top.path().join("etc/a"), "top").unwrap();
        fs::write(low.path().join("etc/a"), "low").unwrap();
        fs::write(low.path().join("etc/b"), "low").unwrap();
        std::os::unix::fs::symlink("x", low.path().join("etc/c")).unwrap();
        let layers = vec![top.path().to_path_buf(), low.path().to_path_buf()];
        let entries = merged_entries(&layers, Path::new("etc"));
        assert_eq!(entries.len(), 3);
        assert_eq!(entries["c"], MergedKind::Symlink("x".into()));
        assert_eq!(merged_file(&layers, Path::new("etc/a")).unwrap(), b"top");
        assert_eq!(merged_file(&layers, Path::new("etc/b")).unwrap(), b"low");
        assert_eq!(merged_file(&layers, Path::new("etc/none")), None);
    }
}
