//! `airlock image import`: an OCI image layout (a directory, or a tar of one; what
//! `docker save` writes since docker 25 too) or a legacy `docker save` archive
//! (`manifest.json` with `Config` and `Layers` paths). Every blob goes through the store's
//! verification: a layout blob whose content does not hash to its name is refused.

use crate::digest::Digest;
use crate::error::{ImageError, Result};
use crate::oci::{self, Descriptor, Index, Manifest, Platform};
use crate::reference::ImageRef;
use crate::store::{ImageRecord, ImageStore, StoreLock};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::fs::File;
use std::path::Path;

/// Where the layout's files are: a directory (read on demand) or a tar whose regular
/// files were all stored as blobs while it was read once.
enum Source<'a> {
    Dir(&'a Path),
    Tar(BTreeMap<String, (Digest, u64)>),
}

/// The annotation containerd and docker put the full reference in.
const IMAGE_NAME: &str = "io.containerd.image.name";
/// The OCI annotation: a tag, or (as some tools write it) a full reference.
const REF_NAME: &str = "org.opencontainers.image.ref.name";

/// Imports the image(s) of `path`. `name` overrides the name (and tag) the archive
/// gives; an archive that names nothing needs it.
pub fn import(
    store: &ImageStore,
    path: &Path,
    name: Option<&ImageRef>,
) -> Result<Vec<ImageRecord>> {
    let lock = store.lock()?;
    let meta = std::fs::metadata(path).map_err(ImageError::io("reading", path))?;
    let source = if meta.is_dir() {
        Source::Dir(path)
    } else {
        Source::Tar(read_tar(store, path)?)
    };
    let result = if source.has("index.json") {
        import_layout(store, &lock, &source, name)
    } else if source.has("manifest.json") {
        import_docker(store, &lock, &source, name)
    } else {
        Err(ImageError::format(
            &path.display().to_string(),
            "neither an OCI layout (index.json) nor a docker save archive (manifest.json)",
        ))
    };
    source.discard_unreferenced(store)?;
    result
}

impl Source<'_> {
    fn has(&self, file: &str) -> bool {
        match self {
            Source::Dir(dir) => dir.join(file).is_file(),
            Source::Tar(files) => files.contains_key(file),
        }
    }

    /// A file of the archive by path: stored (verified against what it hashed to) and
    /// read back from the store.
    fn stored(&self, store: &ImageStore, file: &str) -> Result<(Digest, u64)> {
        match self {
            Source::Dir(dir) => {
                let path = dir.join(file);
                let f = File::open(&path).map_err(ImageError::io("reading", &path))?;
                store.put_blob(f, None)
            }
            Source::Tar(files) => files
                .get(file)
                .cloned()
                .ok_or_else(|| ImageError::format(file, "not in the archive")),
        }
    }

    /// A layout file by name (`index.json`, `manifest.json`): not content-addressed, so
    /// it is read, never stored.
    fn json<T: serde::de::DeserializeOwned>(&self, store: &ImageStore, file: &str) -> Result<T> {
        let bytes = match self {
            Source::Dir(dir) => {
                let path = dir.join(file);
                std::fs::read(&path).map_err(ImageError::io("reading", &path))?
            }
            Source::Tar(_) => store.read_blob(&self.stored(store, file)?.0)?,
        };
        oci::parse_json(file, &bytes)
    }

    /// Removes what a tar's scan stored that no image references (its `index.json`,
    /// files of other platforms, blobs of a refused image).
    fn discard_unreferenced(&self, store: &ImageStore) -> Result<()> {
        let Source::Tar(files) = self else {
            return Ok(());
        };
        let images = store.list()?;
        for (digest, _) in files.values() {
            let referenced = images.iter().any(|i| {
                i.digest == *digest
                    || i.config == *digest
                    || i.layers.iter().any(|l| l.blob == *digest)
            });
            if !referenced {
                let _ = std::fs::remove_file(store.blob_path(digest));
            }
        }
        Ok(())
    }

    /// The layout blob a descriptor names, into the store: its content must hash to the
    /// descriptor's digest (and have its size), else it is refused and removed.
    fn blob(&self, store: &ImageStore, descriptor: &Descriptor) -> Result<()> {
        let file = format!("blobs/sha256/{}", descriptor.digest.hex());
        let expected = (&descriptor.digest, descriptor.size);
        match self {
            Source::Dir(dir) => {
                let path = dir.join(&file);
                let f = File::open(&path).map_err(ImageError::io("reading", &path))?;
                store.put_blob(f, Some(expected)).map(drop)
            }
            Source::Tar(_) => {
                let (digest, size) = self.stored(store, &file)?;
                check_stored(store, expected, &digest, size)
            }
        }
    }
}

/// A tar's file was stored under the digest it hashed to; the descriptor's digest must be
/// that one. Otherwise the bytes are refused (and removed: they are no image's).
fn check_stored(
    store: &ImageStore,
    (want, want_size): (&Digest, u64),
    got: &Digest,
    size: u64,
) -> Result<()> {
    let refuse = |err| {
        let _ = std::fs::remove_file(store.blob_path(got));
        Err(err)
    };
    if want != got {
        return refuse(ImageError::DigestMismatch {
            expected: want.to_string(),
            actual: got.to_string(),
        });
    }
    if size != want_size {
        return refuse(ImageError::SizeMismatch {
            digest: want.to_string(),
            size,
            expected: want_size,
        });
    }
    Ok(())
}

/// Reads the tar once, storing every regular file as a blob, and resolving symlinks
/// (docker save links repeated layers) to the file they name inside the archive.
fn read_tar(store: &ImageStore, path: &Path) -> Result<BTreeMap<String, (Digest, u64)>> {
    let file = File::open(path).map_err(ImageError::io("reading", path))?;
    let mut archive = tar::Archive::new(std::io::BufReader::new(file));
    let mut files = BTreeMap::new();
    let mut links = Vec::new();
    let read_err = ImageError::io("reading", path);
    for entry in archive.entries().map_err(read_err)? {
        let entry = entry.map_err(ImageError::io("reading", path))?;
        let name = normalise(&String::from_utf8_lossy(&entry.path_bytes()));
        match entry.header().entry_type() {
            tar::EntryType::Regular | tar::EntryType::Continuous => {
                let stored = store.put_blob(entry, None)?;
                files.insert(name, stored);
            }
            tar::EntryType::Symlink => {
                let target = entry.link_name_bytes().unwrap_or_default();
                let dir = name.rsplit_once('/').map_or("", |(d, _)| d);
                let joined = format!("{dir}/{}", String::from_utf8_lossy(&target));
                links.push((name, normalise(&joined)));
            }
            _ => {}
        }
    }
    for (name, target) in links {
        if let Some(stored) = files.get(&target).cloned() {
            files.insert(name, stored);
        }
    }
    Ok(files)
}

/// `./a/../b//c` -> `b/c`, never above the archive's top.
fn normalise(path: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            p => parts.push(p),
        }
    }
    parts.join("/")
}

fn import_layout(
    store: &ImageStore,
    lock: &StoreLock,
    source: &Source<'_>,
    name: Option<&ImageRef>,
) -> Result<Vec<ImageRecord>> {
    let index: Index = source.json(store, "index.json")?;
    let mut records = Vec::new();
    for descriptor in &index.manifests {
        let (reference, tag) = layout_name(descriptor, name)?;
        let manifest = resolve_manifest(store, source, descriptor)?;
        records.push(add(
            store,
            lock,
            source,
            &manifest,
            &reference,
            tag.as_deref(),
        )?);
    }
    if records.is_empty() {
        return Err(ImageError::format("index.json", "lists no manifest"));
    }
    Ok(records)
}

/// The host's image manifest a layout's descriptor leads to: itself, or the host
/// platform's entry of a nested index.
fn resolve_manifest(
    store: &ImageStore,
    source: &Source<'_>,
    descriptor: &Descriptor,
) -> Result<Descriptor> {
    source.blob(store, descriptor)?;
    if !oci::INDEX_TYPES.contains(&descriptor.media_type.as_str()) {
        return Ok(descriptor.clone());
    }
    let nested: Index = oci::parse_json("index", &store.read_blob(&descriptor.digest)?)?;
    let chosen = oci::pick_platform(&nested, &Platform::host())?.clone();
    source.blob(store, &chosen)?;
    Ok(chosen)
}

fn add(
    store: &ImageStore,
    lock: &StoreLock,
    source: &Source<'_>,
    descriptor: &Descriptor,
    name: &str,
    tag: Option<&str>,
) -> Result<ImageRecord> {
    if !oci::MANIFEST_TYPES.contains(&descriptor.media_type.as_str()) {
        return Err(ImageError::format(
            &descriptor.digest.to_string(),
            format!(
                "media type {:?} is not an image manifest",
                descriptor.media_type
            ),
        ));
    }
    let manifest = store.manifest(&descriptor.digest)?;
    source.blob(store, &manifest.config)?;
    for layer in &manifest.layers {
        source.blob(store, layer)?;
    }
    store.add_image(lock, name, tag, &descriptor.digest)
}

/// The name and tag of a layout's manifest: the operator's `--name`, else the full
/// reference in the annotations, else refused (an image needs a name to be pinned by).
fn layout_name(
    descriptor: &Descriptor,
    name: Option<&ImageRef>,
) -> Result<(String, Option<String>)> {
    if let Some(name) = name {
        return Ok((name.name(), name.tag.clone()));
    }
    let annotated = descriptor.annotations.get(IMAGE_NAME).or_else(|| {
        descriptor
            .annotations
            .get(REF_NAME)
            .filter(|r| r.contains(['/', ':']))
    });
    match annotated {
        Some(text) => {
            let reference = ImageRef::parse(text, None)?;
            Ok((reference.name(), reference.tag))
        }
        None => Err(ImageError::format(
            "index.json",
            "the manifest carries no image name; give one with --name",
        )),
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct DockerManifest {
    config: String,
    #[serde(default)]
    repo_tags: Option<Vec<String>>,
    layers: Vec<String>,
}

/// A legacy `docker save` archive: the config and uncompressed layers by path. airlock
/// writes the OCI manifest docker never made; its digest is the image's from then on.
fn import_docker(
    store: &ImageStore,
    lock: &StoreLock,
    source: &Source<'_>,
    name: Option<&ImageRef>,
) -> Result<Vec<ImageRecord>> {
    let entries: Vec<DockerManifest> = source.json(store, "manifest.json")?;
    let mut records = Vec::new();
    for entry in entries {
        let (config, config_size) = source.stored(store, &normalise(&entry.config))?;
        let mut layers = Vec::new();
        for layer in &entry.layers {
            let (digest, size) = source.stored(store, &normalise(layer))?;
            layers.push(descriptor(oci::OCI_LAYER_TAR, digest, size));
        }
        let manifest = Manifest {
            schema_version: 2,
            media_type: Some(oci::OCI_MANIFEST.to_string()),
            config: descriptor(oci::OCI_CONFIG, config, config_size),
            layers,
        };
        let bytes = serde_json::to_vec(&manifest).expect("a manifest always serialises");
        let (digest, _) = store.put_blob(&bytes[..], None)?;
        let (reference, tag) = match (name, entry.repo_tags.as_deref()) {
            (Some(name), _) => (name.name(), name.tag.clone()),
            (None, Some([first, ..])) => {
                let r = ImageRef::parse(first, None)?;
                (r.name(), r.tag)
            }
            (None, _) => {
                return Err(ImageError::format(
                    "manifest.json",
                    "the image carries no RepoTags; give a name with --name",
                ))
            }
        };
        records.push(store.add_image(lock, &reference, tag.as_deref(), &digest)?);
    }
    Ok(records)
}

fn descriptor(media_type: &str, digest: Digest, size: u64) -> Descriptor {
    Descriptor {
        media_type: media_type.to_string(),
        digest,
        size,
        platform: None,
        annotations: BTreeMap::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn archive_paths_are_normalised_without_leaving_the_top() {
        assert_eq!(normalise("./blobs//sha256/x"), "blobs/sha256/x");
        assert_eq!(normalise("abc/../blobs/x"), "blobs/x");
        assert_eq!(normalise("../../x"), "x");
    }
}
