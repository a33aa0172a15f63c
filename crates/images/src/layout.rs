//! Writing an OCI image layout: what airlock's tests and benchmarks build their images
//! with (there is no public registry on the machines they run on), and what `docker
//! build`-less operators can make images with from plain tar layers.

use crate::digest::Digest;
use crate::error::{ImageError, Result};
use crate::oci::{
    self, Descriptor, ImageConfig, Index, Manifest, Platform, ProcessDefaults, RootFs,
};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;

/// An image to write: its layers as uncompressed tars, bottom first.
#[derive(Debug, Clone, Default)]
pub struct NewImage {
    /// The full reference put in the index's `io.containerd.image.name` annotation.
    pub name: Option<String>,
    pub layers: Vec<Vec<u8>>,
    /// gzip the layer blobs (the diff ids stay the digests of the tars).
    pub gzip: bool,
    pub defaults: ProcessDefaults,
}

/// What was written: the manifest's digest (the image's identity) and its parts.
#[derive(Debug, Clone)]
pub struct Written {
    pub manifest: Digest,
    pub config: Digest,
    pub layer_blobs: Vec<Digest>,
}

fn put(dir: &Path, bytes: &[u8]) -> Result<Digest> {
    let digest = Digest::of(bytes);
    let path = dir.join("blobs/sha256").join(digest.hex());
    std::fs::create_dir_all(dir.join("blobs/sha256")).map_err(ImageError::io("creating", dir))?;
    std::fs::write(&path, bytes).map_err(ImageError::io("writing", &path))?;
    Ok(digest)
}

fn descriptor(media_type: &str, digest: Digest, size: usize) -> Descriptor {
    Descriptor {
        media_type: media_type.to_string(),
        digest,
        size: size as u64,
        platform: None,
        annotations: BTreeMap::new(),
    }
}

/// Writes the blobs of `image` into the layout `dir` and returns the manifest's
/// descriptor (not yet in any index).
pub fn write_blobs(dir: &Path, image: &NewImage) -> Result<(Descriptor, Written)> {
    let mut layers = Vec::new();
    let mut diff_ids = Vec::new();
    for tar in &image.layers {
        diff_ids.push(Digest::of(tar));
        let (media_type, blob) = if image.gzip {
            let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            gz.write_all(tar)
                .map_err(ImageError::io("compressing", dir))?;
            (
                oci::OCI_LAYER_GZIP,
                gz.finish().map_err(ImageError::io("compressing", dir))?,
            )
        } else {
            (oci::OCI_LAYER_TAR, tar.clone())
        };
        layers.push(descriptor(media_type, put(dir, &blob)?, blob.len()));
    }
    let host = Platform::host();
    let config = ImageConfig {
        architecture: host.architecture.clone(),
        os: host.os.clone(),
        config: image.defaults.clone(),
        rootfs: RootFs {
            kind: "layers".to_string(),
            diff_ids,
        },
    };
    let config_bytes = serde_json::to_vec(&config).expect("a config always serialises");
    let config_digest = put(dir, &config_bytes)?;
    let manifest = Manifest {
        schema_version: 2,
        media_type: Some(oci::OCI_MANIFEST.to_string()),
        config: descriptor(oci::OCI_CONFIG, config_digest.clone(), config_bytes.len()),
        layers: layers.clone(),
    };
    let manifest_bytes = serde_json::to_vec(&manifest).expect("a manifest always serialises");
    let manifest_digest = put(dir, &manifest_bytes)?;
    let mut entry = descriptor(
        oci::OCI_MANIFEST,
        manifest_digest.clone(),
        manifest_bytes.len(),
    );
    entry.platform = Some(host);
    if let Some(name) = &image.name {
        entry
            .annotations
            .insert("io.containerd.image.name".to_string(), name.clone());
    }
    let written = Written {
        manifest: manifest_digest,
        config: config_digest,
        layer_blobs: layers.into_iter().map(|l| l.digest).collect(),
    };
    Ok((entry, written))
}

/// Writes `oci-layout` and an `index.json` listing `manifests`.
pub fn write_index(dir: &Path, manifests: Vec<Descriptor>) -> Result<()> {
    let index = Index {
        schema_version: 2,
        media_type: Some(oci::OCI_INDEX.to_string()),
        manifests,
    };
    let files = [
        ("oci-layout", br#"{"imageLayoutVersion":"1.0.0"}"#.to_vec()),
        (
            "index.json",
            serde_json::to_vec(&index).expect("an index always serialises"),
        ),
    ];
    for (name, bytes) in files {
        let path = dir.join(name);
        std::fs::write(&path, bytes).map_err(ImageError::io("writing", &path))?;
    }
    Ok(())
}

/// A one-image layout in `dir`.
pub fn write_layout(dir: &Path, image: &NewImage) -> Result<Written> {
    let (entry, written) = write_blobs(dir, image)?;
    write_index(dir, vec![entry])?;
    Ok(written)
}
