//! The parts of the OCI image spec (and docker's v2 schema 2, its ancestor) airlock
//! reads. Unknown fields are ignored, as the spec asks of readers.

use crate::digest::Digest;
use crate::error::{ImageError, Result};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

pub const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
pub const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
pub const OCI_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
pub const OCI_LAYER_TAR: &str = "application/vnd.oci.image.layer.v1.tar";
pub const OCI_LAYER_GZIP: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
const DOCKER_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";
const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
const DOCKER_LAYER_GZIP: &str = "application/vnd.docker.image.rootfs.diff.tar.gzip";
const DOCKER_LAYER_TAR: &str = "application/vnd.docker.image.rootfs.diff.tar";

/// The media type of every index/list the client accepts (also the registry's Accept).
pub const INDEX_TYPES: [&str; 2] = [OCI_INDEX, DOCKER_LIST];
pub const MANIFEST_TYPES: [&str; 2] = [OCI_MANIFEST, DOCKER_MANIFEST];

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Descriptor {
    pub media_type: String,
    pub digest: Digest,
    pub size: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub platform: Option<Platform>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Platform {
    pub architecture: String,
    pub os: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub variant: Option<String>,
}

impl Platform {
    /// This host's platform in OCI's words (`linux/amd64`, `linux/arm64`).
    pub fn host() -> Platform {
        let architecture = match std::env::consts::ARCH {
            "x86_64" => "amd64",
            "aarch64" => "arm64",
            other => other,
        };
        Platform {
            architecture: architecture.to_string(),
            os: "linux".to_string(),
            variant: None,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Index {
    pub schema_version: u32,
    #[serde(default)]
    pub media_type: Option<String>,
    pub manifests: Vec<Descriptor>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Manifest {
    pub schema_version: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub media_type: Option<String>,
    pub config: Descriptor,
    pub layers: Vec<Descriptor>,
}

/// The image configuration: the platform, the process defaults and the layers' diff ids.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ImageConfig {
    #[serde(default)]
    pub architecture: String,
    #[serde(default)]
    pub os: String,
    #[serde(default)]
    pub config: ProcessDefaults,
    pub rootfs: RootFs,
}

/// What the image says its process runs as; the contract overrides each.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct ProcessDefaults {
    #[serde(rename = "User", default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    #[serde(rename = "Env", default, skip_serializing_if = "Option::is_none")]
    pub env: Option<Vec<String>>,
    #[serde(
        rename = "Entrypoint",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub entrypoint: Option<Vec<String>>,
    #[serde(rename = "Cmd", default, skip_serializing_if = "Option::is_none")]
    pub cmd: Option<Vec<String>>,
    #[serde(
        rename = "WorkingDir",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub working_dir: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct RootFs {
    #[serde(rename = "type")]
    pub kind: String,
    pub diff_ids: Vec<Digest>,
}

/// How a layer blob is compressed, from its media type. zstd layers are refused (no
/// decoder is built in); an unknown type is refused rather than guessed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    None,
    Gzip,
}

pub fn layer_compression(media_type: &str) -> Result<Compression> {
    match media_type {
        OCI_LAYER_TAR | DOCKER_LAYER_TAR => Ok(Compression::None),
        OCI_LAYER_GZIP | DOCKER_LAYER_GZIP => Ok(Compression::Gzip),
        other => Err(ImageError::format(
            "layer",
            format!("media type {other:?} is not a tar or tar+gzip layer"),
        )),
    }
}

/// The host platform's manifest of an index; a non-linux or foreign-architecture image
/// cannot run here, so there is no fallback to "the first one".
pub fn pick_platform<'a>(index: &'a Index, host: &Platform) -> Result<&'a Descriptor> {
    index
        .manifests
        .iter()
        .filter(|d| MANIFEST_TYPES.contains(&d.media_type.as_str()))
        .find(|d| match &d.platform {
            Some(p) => p.os == host.os && p.architecture == host.architecture,
            // A single-image layout's index often gives no platform; the config's
            // platform is checked once it is read.
            None => index.manifests.len() == 1,
        })
        .ok_or_else(|| {
            ImageError::format(
                "index",
                format!("no manifest for {}/{}", host.os, host.architecture),
            )
        })
}

/// Parses a JSON document of the image, naming `what` in the error.
pub fn parse_json<T: serde::de::DeserializeOwned>(what: &str, bytes: &[u8]) -> Result<T> {
    serde_json::from_slice(bytes).map_err(|e| ImageError::format(what, e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn descriptor(arch: &str, n: char) -> Descriptor {
        Descriptor {
            media_type: OCI_MANIFEST.to_string(),
            digest: Digest::from_hex(&n.to_string().repeat(64)).unwrap(),
            size: 1,
            platform: Some(Platform {
                architecture: arch.to_string(),
                os: "linux".to_string(),
                variant: None,
            }),
            annotations: BTreeMap::new(),
        }
    }

    #[test]
    fn a_multi_platform_index_picks_the_hosts_platform() {
        let index = Index {
            schema_version: 2,
            media_type: Some(OCI_INDEX.to_string()),
            manifests: vec![descriptor("arm64", 'a'), descriptor("amd64", 'b')],
        };
        let host = Platform {
            architecture: "amd64".to_string(),
            os: "linux".to_string(),
            variant: None,
        };
        assert_eq!(
            pick_platform(&index, &host).unwrap().digest.hex(),
            "b".repeat(64)
        );
        let only_arm = Index {
            manifests: vec![descriptor("arm64", 'a')],
            ..index
        };
        assert!(pick_platform(&only_arm, &host).is_err());
    }

    #[test]
    fn zstd_and_unknown_layer_types_are_refused() {
        assert_eq!(
            layer_compression(OCI_LAYER_GZIP).unwrap(),
            Compression::Gzip
        );
        assert!(layer_compression("application/vnd.oci.image.layer.v1.tar+zstd").is_err());
        assert!(layer_compression("text/plain").is_err());
    }
}
