//! The content-addressed image store under the state directory:
//!
//! ```text
//! <state>/images/lock                  flock'd while the index or the store changes
//! <state>/images/index.json            the images: name, tags, manifest digest, layers
//! <state>/images/blobs/sha256/<hex>    manifests, configs, layer blobs, as fetched
//! <state>/images/layers/<diff-id hex>/ each layer unpacked once (crate::unpack)
//! <state>/images/leases/<hex>          flock'd (shared) by each live cell of an image
//! <state>/images/tmp/                  downloads and unpacks in progress
//! ```
//!
//! A blob enters only under the digest its content hashes to, and the small ones
//! (manifests, configs) are hashed again on every read; a layer is unpacked from its blob
//! through a hash of both the compressed and the uncompressed stream, and used only when
//! both match. The whole tree is 0700 root's, like the rest of the state directory.

use crate::digest::{Digest, HashingReader};
use crate::error::{ImageError, Result};
use crate::oci::{self, Compression, ImageConfig, Manifest, Platform};
use crate::reference::ImageRef;
use crate::unpack::{unpack_layer, Limits};
use rustix::fs::FlockOperation;
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use std::fs::{self, File};
use std::io::{Read, Write};
use std::os::fd::AsFd;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

/// One image of the index. `digest` is the manifest's: what plans and records carry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageRecord {
    /// `registry/repository`, or the repository alone for an image imported without a
    /// registry.
    pub name: String,
    pub tags: Vec<String>,
    pub digest: Digest,
    pub config: Digest,
    pub layers: Vec<LayerRecord>,
    /// Seconds since the epoch of the first import or pull.
    pub added: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayerRecord {
    pub blob: Digest,
    pub diff_id: Digest,
    pub media_type: String,
    pub size: u64,
}

impl ImageRecord {
    /// `name@digest`, the form every record and log line uses.
    pub fn pinned(&self) -> String {
        format!("{}@{}", self.name, self.digest)
    }
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct Index {
    images: Vec<ImageRecord>,
}

/// What `gc` removed.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize)]
pub struct GcReport {
    pub blobs: usize,
    pub layers: usize,
    pub bytes: u64,
}

pub struct ImageStore {
    root: PathBuf,
    limits: Limits,
}

/// The store's lock: held while the index, the blobs or the layers change, so a gc never
/// sees an import's blobs before its image is in the index.
pub struct StoreLock {
    _file: File,
}

/// A live cell's hold on an image: `remove` refuses the image while any lease is held,
/// and so `gc` (which keeps what the index references) keeps its layers. Released on drop
/// (or when the process dies: it is an flock).
pub struct Lease {
    _file: File,
}

impl ImageStore {
    /// Opens (creating 0700) the store under `state_dir`.
    pub fn open(state_dir: &Path, limits: Limits) -> Result<ImageStore> {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(state_dir)
            .map_err(ImageError::io("creating", state_dir))?;
        check_owner(state_dir)?;
        let root = state_dir.join("images");
        for dir in ["blobs/sha256", "layers", "leases", "tmp"] {
            let path = root.join(dir);
            fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(&path)
                .map_err(ImageError::io("creating", &path))?;
        }
        Ok(ImageStore { root, limits })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn lock(&self) -> Result<StoreLock> {
        let path = self.root.join("lock");
        let file = File::options()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(ImageError::io("opening", &path))?;
        rustix::fs::flock(&file, FlockOperation::LockExclusive)
            .map_err(|e| ImageError::io("locking", &path)(e.into()))?;
        Ok(StoreLock { _file: file })
    }

    pub fn blob_path(&self, digest: &Digest) -> PathBuf {
        self.root.join("blobs/sha256").join(digest.hex())
    }

    pub fn layer_dir(&self, diff_id: &Digest) -> PathBuf {
        self.root.join("layers").join(diff_id.hex())
    }

    fn temp_path(&self, what: &str) -> PathBuf {
        use std::sync::atomic::{AtomicU64, Ordering};
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        self.root
            .join("tmp")
            .join(format!("{what}-{}-{n}", std::process::id()))
    }

    /// Stores the bytes of `content` under the digest they hash to. With `expected`, a
    /// blob that hashes to anything else (or has another size) is refused and its bytes
    /// removed; nothing is stored under a name it does not hash to.
    pub fn put_blob(
        &self,
        content: impl Read,
        expected: Option<(&Digest, u64)>,
    ) -> Result<(Digest, u64)> {
        let temp = self.temp_path("blob");
        let result = self.write_blob(content, &temp, expected);
        if result.is_err() {
            let _ = fs::remove_file(&temp);
        }
        result
    }

    fn write_blob(
        &self,
        content: impl Read,
        temp: &Path,
        expected: Option<(&Digest, u64)>,
    ) -> Result<(Digest, u64)> {
        let mut file = File::options()
            .write(true)
            .create_new(true)
            .open(temp)
            .map_err(ImageError::io("creating", temp))?;
        // Never read more than the descriptor promised (plus one byte to notice).
        let cap = expected.map_or(u64::MAX, |(_, size)| size.saturating_add(1));
        let mut reader = HashingReader::new(content.take(cap));
        std::io::copy(&mut reader, &mut file).map_err(ImageError::io("writing", temp))?;
        file.sync_all().map_err(ImageError::io("writing", temp))?;
        let (digest, size) = reader.finish().map_err(ImageError::io("reading", temp))?;
        if let Some((want, want_size)) = expected {
            want.check(&digest)?;
            if size != want_size {
                return Err(ImageError::SizeMismatch {
                    digest: want.to_string(),
                    size,
                    expected: want_size,
                });
            }
        }
        let path = self.blob_path(&digest);
        fs::rename(temp, &path).map_err(ImageError::io("storing", &path))?;
        Ok((digest, size))
    }

    pub fn has_blob(&self, digest: &Digest) -> bool {
        self.blob_path(digest).is_file()
    }

    /// A small blob (manifest, config, index), hashed again before use: a blob changed on
    /// disk since it was stored is refused and removed.
    pub fn read_blob(&self, digest: &Digest) -> Result<Vec<u8>> {
        const MAX_JSON: u64 = 4 << 20;
        let path = self.blob_path(digest);
        let file = File::open(&path).map_err(ImageError::io("reading", &path))?;
        let mut bytes = Vec::new();
        file.take(MAX_JSON + 1)
            .read_to_end(&mut bytes)
            .map_err(ImageError::io("reading", &path))?;
        if bytes.len() as u64 > MAX_JSON {
            return Err(ImageError::format(
                &digest.to_string(),
                "a JSON blob over 4 MiB",
            ));
        }
        self.verified(digest, Digest::of(&bytes))?;
        Ok(bytes)
    }

    /// Refuses `actual` unless it is `digest`, removing the blob that hashed to it.
    fn verified(&self, digest: &Digest, actual: Digest) -> Result<()> {
        digest.check(&actual).inspect_err(|_| {
            let _ = fs::remove_file(self.blob_path(digest));
        })
    }

    pub fn manifest(&self, digest: &Digest) -> Result<Manifest> {
        oci::parse_json("manifest", &self.read_blob(digest)?)
    }

    pub fn config(&self, record: &ImageRecord) -> Result<ImageConfig> {
        oci::parse_json("config", &self.read_blob(&record.config)?)
    }

    /// Unpacks the layer blob `layer` (whose uncompressed content must hash to `diff_id`)
    /// into the layer store once. Both digests are checked over exactly the bytes read; on
    /// any mismatch or refusal the half-made directory is removed, and a blob that does
    /// not match its digest is removed too.
    pub fn ensure_layer(&self, layer: &LayerRecord) -> Result<PathBuf> {
        let target = self.layer_dir(&layer.diff_id);
        if target.is_dir() {
            return Ok(target);
        }
        let compression = oci::layer_compression(&layer.media_type)?;
        let temp = self.temp_path("layer");
        fs::DirBuilder::new()
            .mode(0o755)
            .create(&temp)
            .map_err(ImageError::io("creating", &temp))?;
        let result = self.unpack_into(layer, compression, &temp);
        if let Err(err) = result {
            let _ = fs::remove_dir_all(&temp);
            return Err(err);
        }
        fs::rename(&temp, &target).map_err(ImageError::io("storing", &target))?;
        Ok(target)
    }

    fn unpack_into(&self, layer: &LayerRecord, compression: Compression, dir: &Path) -> Result<()> {
        let path = self.blob_path(&layer.blob);
        let blob = File::open(&path).map_err(ImageError::io("reading", &path))?;
        let mut compressed = HashingReader::new(std::io::BufReader::new(blob));
        let root = File::open(dir).map_err(ImageError::io("opening", dir))?;
        let unpacked = match compression {
            Compression::None => unpack_layer(&mut compressed, root.as_fd(), &self.limits),
            Compression::Gzip => unpack_layer(
                flate2::read::GzDecoder::new(&mut compressed),
                root.as_fd(),
                &self.limits,
            ),
        };
        let (blob_digest, _) = compressed
            .finish()
            .map_err(ImageError::io("reading", &path))?;
        // The blob's own digest first: a changed blob is the cause of any other error.
        self.verified(&layer.blob, blob_digest)?;
        let unpacked = unpacked?;
        if unpacked.diff_id != layer.diff_id {
            return Err(ImageError::DiffIdMismatch {
                layer: layer.blob.to_string(),
                expected: layer.diff_id.to_string(),
                actual: unpacked.diff_id.to_string(),
            });
        }
        Ok(())
    }

    fn read_index(&self) -> Result<Index> {
        let path = self.root.join("index.json");
        match fs::read(&path) {
            Ok(bytes) => oci::parse_json("index.json", &bytes),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Index::default()),
            Err(e) => Err(ImageError::io("reading", &path)(e)),
        }
    }

    fn write_index(&self, index: &Index) -> Result<()> {
        let path = self.root.join("index.json");
        let temp = self.temp_path("index");
        let bytes = serde_json::to_vec_pretty(index).expect("the index always serialises");
        let mut file = File::create_new(&temp).map_err(ImageError::io("creating", &temp))?;
        file.write_all(&bytes)
            .and_then(|()| file.sync_all())
            .map_err(ImageError::io("writing", &temp))?;
        fs::rename(&temp, &path).map_err(ImageError::io("writing", &path))
    }

    pub fn list(&self) -> Result<Vec<ImageRecord>> {
        Ok(self.read_index()?.images)
    }

    /// Adds the image whose manifest blob `digest` is in the store (its config and layer
    /// blobs too): checks the platform, unpacks every layer, records it under `name` with
    /// `tag`. The caller holds the lock.
    pub fn add_image(
        &self,
        _lock: &StoreLock,
        name: &str,
        tag: Option<&str>,
        digest: &Digest,
    ) -> Result<ImageRecord> {
        let manifest = self.manifest(digest)?;
        let config: ImageConfig =
            oci::parse_json("config", &self.read_blob(&manifest.config.digest)?)?;
        check_platform(&config, &Platform::host())?;
        if config.rootfs.diff_ids.len() != manifest.layers.len() {
            return Err(ImageError::format(
                &digest.to_string(),
                "the manifest's layers and the config's diff_ids differ in number",
            ));
        }
        let mut layers = Vec::new();
        for (descriptor, diff_id) in manifest.layers.iter().zip(&config.rootfs.diff_ids) {
            let layer = LayerRecord {
                blob: descriptor.digest.clone(),
                diff_id: diff_id.clone(),
                media_type: descriptor.media_type.clone(),
                size: descriptor.size,
            };
            self.ensure_layer(&layer)?;
            layers.push(layer);
        }
        let mut index = self.read_index()?;
        let record = match index
            .images
            .iter_mut()
            .find(|i| i.digest == *digest && i.name == name)
        {
            Some(existing) => {
                add_tag(&mut existing.tags, tag);
                existing.clone()
            }
            None => {
                let mut record = ImageRecord {
                    name: name.to_string(),
                    tags: Vec::new(),
                    digest: digest.clone(),
                    config: manifest.config.digest.clone(),
                    layers,
                    added: now(),
                };
                add_tag(&mut record.tags, tag);
                index.images.push(record.clone());
                record
            }
        };
        // A tag names one image of a repository: the same tag moves off any other.
        if let Some(tag) = tag {
            for other in index.images.iter_mut() {
                if other.name == name && other.digest != *digest {
                    other.tags.retain(|t| t != tag);
                }
            }
        }
        self.write_index(&index)?;
        Ok(record)
    }

    /// The one image `query` names: `name@digest`, `name:tag`, a digest, or a prefix of
    /// at least 12 hex digits of one.
    pub fn find(&self, query: &str) -> Result<ImageRecord> {
        let images = self.list()?;
        let matches: Vec<&ImageRecord> = images.iter().filter(|i| matches(i, query)).collect();
        match matches.as_slice() {
            [] => Err(ImageError::NotFound(query.to_string())),
            [one] => Ok((*one).clone()),
            many => Err(ImageError::Ambiguous {
                reference: query.to_string(),
                count: many.len(),
            }),
        }
    }

    /// The image a typed reference names, under the tag rule: a pinned reference must
    /// match the recorded name and digest; a tag alone is refused unless `allow_tags`, and
    /// then stands for the digest it was recorded with (never re-resolved here).
    pub fn resolve(&self, reference: &ImageRef, allow_tags: bool) -> Result<ImageRecord> {
        crate::registry::check_pinned(reference, allow_tags)?;
        let name = reference.name();
        let images = self.list()?;
        let found = images.into_iter().find(|i| {
            i.name == name
                && match (&reference.digest, &reference.tag) {
                    (Some(digest), _) => i.digest == *digest,
                    (None, Some(tag)) => i.tags.iter().any(|t| t == tag),
                    (None, None) => false,
                }
        });
        found.ok_or_else(|| ImageError::NotFound(reference.to_string()))
    }

    /// The unpacked layer directories of `record`, top layer first (overlayfs's
    /// `lowerdir` order). Every one must exist: a missing layer is an error, never an
    /// image with a layer left out.
    pub fn layer_dirs(&self, record: &ImageRecord) -> Result<Vec<PathBuf>> {
        record
            .layers
            .iter()
            .rev()
            .map(|layer| {
                let dir = self.layer_dir(&layer.diff_id);
                if dir.is_dir() {
                    Ok(dir)
                } else {
                    Err(ImageError::NotFound(format!(
                        "layer {} of {}",
                        layer.diff_id,
                        record.pinned()
                    )))
                }
            })
            .collect()
    }

    fn lease_path(&self, digest: &Digest) -> PathBuf {
        self.root.join("leases").join(digest.hex())
    }

    fn lease_file(&self, digest: &Digest) -> Result<File> {
        let path = self.lease_path(digest);
        File::options()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(ImageError::io("opening", &path))
    }

    /// Takes a live cell's lease on the image, then checks it is still in the index (a
    /// `remove` that won the race took it out, and this lease then guards nothing).
    pub fn lease(&self, record: &ImageRecord) -> Result<Lease> {
        let file = self.lease_file(&record.digest)?;
        rustix::fs::flock(&file, FlockOperation::LockShared)
            .map_err(|e| ImageError::io("locking", self.lease_path(&record.digest))(e.into()))?;
        if !self.list()?.iter().any(|i| i.digest == record.digest) {
            return Err(ImageError::NotFound(record.pinned()));
        }
        Ok(Lease { _file: file })
    }

    /// Removes the image `query` names from the index (blobs and layers stay until `gc`).
    /// Refused while a live cell holds a lease on it.
    pub fn remove(&self, query: &str) -> Result<ImageRecord> {
        let lock = self.lock()?;
        let record = self.find(query)?;
        let lease = self.lease_file(&record.digest)?;
        if rustix::fs::flock(&lease, FlockOperation::NonBlockingLockExclusive).is_err() {
            return Err(ImageError::InUse(record.pinned()));
        }
        let mut index = self.read_index()?;
        index
            .images
            .retain(|i| !(i.digest == record.digest && i.name == record.name));
        self.write_index(&index)?;
        drop(lock);
        Ok(record)
    }

    /// Removes every blob and unpacked layer no image of the index references, and what
    /// an interrupted import left in `tmp/`. Images a live cell uses are in the index
    /// (`remove` refuses them), so their layers stay.
    pub fn gc(&self) -> Result<GcReport> {
        let _lock = self.lock()?;
        let images = self.list()?;
        let mut blobs = BTreeSet::new();
        let mut layers = BTreeSet::new();
        for image in &images {
            blobs.insert(image.digest.hex().to_string());
            blobs.insert(image.config.hex().to_string());
            for layer in &image.layers {
                blobs.insert(layer.blob.hex().to_string());
                layers.insert(layer.diff_id.hex().to_string());
            }
        }
        let mut report = GcReport::default();
        for (dir, keep) in [("blobs/sha256", &blobs), ("layers", &layers)] {
            let path = self.root.join(dir);
            for entry in fs::read_dir(&path).map_err(ImageError::io("reading", &path))? {
                let entry = entry.map_err(ImageError::io("reading", &path))?;
                let name = entry.file_name().to_string_lossy().into_owned();
                if keep.contains(&name) {
                    continue;
                }
                let target = entry.path();
                report.bytes += disk_usage(&target);
                if dir == "layers" {
                    fs::remove_dir_all(&target).map_err(ImageError::io("removing", &target))?;
                    report.layers += 1;
                } else {
                    fs::remove_file(&target).map_err(ImageError::io("removing", &target))?;
                    report.blobs += 1;
                }
            }
        }
        let tmp = self.root.join("tmp");
        for entry in fs::read_dir(&tmp)
            .map_err(ImageError::io("reading", &tmp))?
            .flatten()
        {
            let _ = fs::remove_dir_all(entry.path()).or_else(|_| fs::remove_file(entry.path()));
        }
        Ok(report)
    }
}

/// The state directory must be this user's and writable by nobody else: the layers in it
/// become cells' roots, so whoever could write there could change what every cell runs.
fn check_owner(dir: &Path) -> Result<()> {
    use std::os::unix::fs::MetadataExt;
    let meta = fs::metadata(dir).map_err(ImageError::io("reading", dir))?;
    let ours = meta.uid() == rustix::process::geteuid().as_raw();
    if ours && meta.mode() & 0o022 == 0 {
        Ok(())
    } else {
        Err(ImageError::format(
            &dir.display().to_string(),
            "the state directory must be owned by this user and writable by nobody else",
        ))
    }
}

fn add_tag(tags: &mut Vec<String>, tag: Option<&str>) {
    if let Some(tag) = tag {
        if !tags.iter().any(|t| t == tag) {
            tags.push(tag.to_string());
        }
    }
}

/// Whether `query` names `image` (see [`ImageStore::find`]).
pub fn matches(image: &ImageRecord, query: &str) -> bool {
    if let Some((name, digest)) = query.split_once('@') {
        return name == image.name && digest == image.digest.to_string();
    }
    let hex = query.strip_prefix("sha256:").unwrap_or(query);
    if hex.len() >= 12
        && hex.bytes().all(|b| b.is_ascii_hexdigit())
        && image.digest.hex().starts_with(hex)
    {
        return true;
    }
    match query.rsplit_once(':') {
        Some((name, tag)) if !tag.contains('/') => {
            name == image.name && image.tags.iter().any(|t| t == tag)
        }
        _ => false,
    }
}

/// An image for another OS or architecture cannot run here; an empty field (some
/// hand-made images) is taken as this host's.
pub fn check_platform(config: &ImageConfig, host: &Platform) -> Result<()> {
    let os_ok = config.os.is_empty() || config.os == host.os;
    let arch_ok = config.architecture.is_empty() || config.architecture == host.architecture;
    if os_ok && arch_ok {
        Ok(())
    } else {
        Err(ImageError::format(
            "config",
            format!(
                "the image is for {}/{}, this host is {}/{}",
                config.os, config.architecture, host.os, host.architecture
            ),
        ))
    }
}

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Bytes of the files under `path` (not following symlinks), for gc's report.
pub fn disk_usage(path: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let Ok(meta) = fs::symlink_metadata(path) else {
        return 0;
    };
    if !meta.is_dir() {
        return meta.blocks() * 512;
    }
    let own = meta.blocks() * 512;
    fs::read_dir(path)
        .map(|entries| {
            entries
                .flatten()
                .map(|e| disk_usage(&e.path()))
                .sum::<u64>()
        })
        .unwrap_or(0)
        + own
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(name: &str, tags: &[&str], hex: char) -> ImageRecord {
        let d = Digest::from_hex(&hex.to_string().repeat(64)).unwrap();
        ImageRecord {
            name: name.to_string(),
            tags: tags.iter().map(|t| t.to_string()).collect(),
            digest: d.clone(),
            config: d,
            layers: Vec::new(),
            added: 0,
        }
    }

    #[test]
    fn an_image_is_found_by_pinned_name_tag_digest_or_a_long_prefix() {
        let image = record("reg.test/py", &["3.12"], 'a');
        assert!(matches(
            &image,
            &format!("reg.test/py@sha256:{}", "a".repeat(64))
        ));
        assert!(matches(&image, "reg.test/py:3.12"));
        assert!(matches(&image, &format!("sha256:{}", "a".repeat(64))));
        assert!(matches(&image, "aaaaaaaaaaaa"));
        assert!(
            !matches(&image, "aaaa"),
            "a short prefix is too easy to mistype"
        );
        assert!(!matches(&image, "reg.test/py:3.11"));
        assert!(!matches(
            &image,
            &format!("other@sha256:{}", "a".repeat(64))
        ));
    }

    #[test]
    fn a_foreign_platform_is_refused_an_empty_one_taken_as_the_hosts() {
        let host = Platform::host();
        let config = |os: &str, arch: &str| ImageConfig {
            architecture: arch.to_string(),
            os: os.to_string(),
            config: Default::default(),
            rootfs: oci::RootFs {
                kind: "layers".to_string(),
                diff_ids: Vec::new(),
            },
        };
        assert!(check_platform(&config("linux", &host.architecture), &host).is_ok());
        assert!(check_platform(&config("", ""), &host).is_ok());
        assert!(check_platform(&config("windows", &host.architecture), &host).is_err());
        assert!(check_platform(&config("linux", "s390x"), &host).is_err());
    }
}
