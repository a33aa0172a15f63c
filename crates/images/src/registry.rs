//! `airlock image pull`: an OCI distribution registry over HTTPS only (ureq + rustls).
//! Every manifest and blob is checked against its digest before it is stored; a tag is
//! resolved once, and the digest of the manifest it named is what the store records.
//! Credentials come from the operator's config and live only in this process: a cell
//! never sees them (the pull is not in any cell).

use crate::digest::Digest;
use crate::error::{ImageError, Result};
use crate::oci::{self, Descriptor, Index, Platform};
use crate::reference::ImageRef;
use crate::store::{ImageRecord, ImageStore};
use std::collections::BTreeMap;
use std::io::Read;
use std::time::Duration;

/// A registry account (`[images.registries."host:port"]`).
#[derive(Debug, Clone)]
pub struct Credentials {
    pub username: String,
    pub password: String,
}

/// How the client reaches registries.
#[derive(Debug, Clone, Default)]
pub struct ClientOptions {
    /// PEM certificates that are the only roots trusted for registries; empty: the
    /// Mozilla roots.
    pub ca_pem: Vec<u8>,
    /// Per registry host (`host` or `host:port`).
    pub credentials: BTreeMap<String, Credentials>,
    /// Whether a reference with a tag and no digest may be pulled (resolved once).
    pub allow_tags: bool,
}

/// What a pull reports as it goes (a progress bar on a terminal).
pub trait Progress {
    fn blob_started(&mut self, digest: &Digest, size: u64);
    fn advanced(&mut self, bytes: u64);
    fn blob_done(&mut self);
}

/// A [`Progress`] that reports nothing.
pub struct Quiet;

impl Progress for Quiet {
    fn blob_started(&mut self, _: &Digest, _: u64) {}
    fn advanced(&mut self, _: u64) {}
    fn blob_done(&mut self) {}
}

pub struct Registry {
    agent: ureq::Agent,
    options: ClientOptions,
    /// Bearer tokens by registry and scope, fetched on a 401 challenge.
    tokens: BTreeMap<String, String>,
}

const MAX_MANIFEST: u64 = 4 << 20;

fn net_error(url: &str, e: impl std::fmt::Display) -> ImageError {
    ImageError::format(url, e.to_string())
}

impl Registry {
    pub fn new(options: ClientOptions) -> Result<Registry> {
        let mut tls = ureq::tls::TlsConfig::builder();
        if !options.ca_pem.is_empty() {
            let mut roots = Vec::new();
            for item in ureq::tls::parse_pem(&options.ca_pem) {
                if let ureq::tls::PemItem::Certificate(cert) =
                    item.map_err(|e| net_error("images.ca_file", e))?
                {
                    roots.push(cert);
                }
            }
            if roots.is_empty() {
                return Err(ImageError::format(
                    "images.ca_file",
                    "holds no PEM certificate",
                ));
            }
            tls = tls.root_certs(ureq::tls::RootCerts::Specific(std::sync::Arc::new(roots)));
        }
        let config = ureq::Agent::config_builder()
            .https_only(true)
            .http_status_as_error(false)
            .max_redirects(5)
            .timeout_global(Some(Duration::from_secs(3600)))
            .timeout_connect(Some(Duration::from_secs(15)))
            .tls_config(tls.build())
            .build();
        Ok(Registry {
            agent: config.into(),
            options,
            tokens: BTreeMap::new(),
        })
    }

    /// Pulls `reference` into `store` and records it. A tag alone is refused unless the
    /// options allow tags.
    pub fn pull(
        &mut self,
        store: &ImageStore,
        reference: &ImageRef,
        progress: &mut dyn Progress,
    ) -> Result<ImageRecord> {
        let registry = reference
            .registry
            .clone()
            .ok_or_else(|| ImageError::Reference {
                reference: reference.to_string(),
                reason: "names no registry, and images.default_registry is not set".to_string(),
            })?;
        check_pinned(reference, self.options.allow_tags)?;
        let lock = store.lock()?;
        let wanted = match &reference.digest {
            Some(digest) => digest.to_string(),
            None => reference
                .tag
                .clone()
                .expect("check_pinned: a tag or a digest"),
        };
        let (mut digest, mut media_type) = self.fetch_manifest(
            store,
            &registry,
            reference,
            &wanted,
            reference.digest.as_ref(),
        )?;
        if oci::INDEX_TYPES.contains(&media_type.as_str()) {
            let index: Index = oci::parse_json("index", &store.read_blob(&digest)?)?;
            let chosen = oci::pick_platform(&index, &Platform::host())?.clone();
            let at = chosen.digest.to_string();
            (digest, media_type) =
                self.fetch_manifest(store, &registry, reference, &at, Some(&chosen.digest))?;
        }
        if !oci::MANIFEST_TYPES.contains(&media_type.as_str()) {
            return Err(ImageError::format(
                &digest.to_string(),
                format!("media type {media_type:?} is not an image manifest"),
            ));
        }
        let manifest = store.manifest(&digest)?;
        self.fetch_blob(store, &registry, reference, &manifest.config, &mut Quiet)?;
        for layer in &manifest.layers {
            oci::layer_compression(&layer.media_type)?;
            self.fetch_blob(store, &registry, reference, layer, progress)?;
        }
        store.add_image(&lock, &reference.name(), reference.tag.as_deref(), &digest)
    }

    /// Fetches a manifest (or index) by tag or digest, stores it under the digest of its
    /// bytes and returns that digest and its media type. With `expected`, other bytes are
    /// refused.
    fn fetch_manifest(
        &mut self,
        store: &ImageStore,
        registry: &str,
        reference: &ImageRef,
        at: &str,
        expected: Option<&Digest>,
    ) -> Result<(Digest, String)> {
        let url = format!(
            "https://{registry}/v2/{}/manifests/{at}",
            reference.repository
        );
        let accept = [oci::INDEX_TYPES, oci::MANIFEST_TYPES].concat().join(", ");
        let mut response = self.get(registry, reference, &url, Some(&accept))?;
        let header_type = response
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .map(|v| v.split(';').next().unwrap_or(v).trim().to_string());
        let bytes = response
            .body_mut()
            .with_config()
            .limit(MAX_MANIFEST)
            .read_to_vec()
            .map_err(|e| net_error(&url, e))?;
        let actual = Digest::of(&bytes);
        if let Some(expected) = expected {
            expected.check(&actual)?;
        }
        let (digest, _) = store.put_blob(&bytes[..], Some((&actual, bytes.len() as u64)))?;
        let media_type = media_type_of(&bytes).or(header_type).unwrap_or_default();
        Ok((digest, media_type))
    }

    /// Fetches a blob the store does not hold yet, streaming it through the digest check.
    fn fetch_blob(
        &mut self,
        store: &ImageStore,
        registry: &str,
        reference: &ImageRef,
        descriptor: &Descriptor,
        progress: &mut dyn Progress,
    ) -> Result<()> {
        if store.has_blob(&descriptor.digest) {
            return Ok(());
        }
        let url = format!(
            "https://{registry}/v2/{}/blobs/{}",
            reference.repository, descriptor.digest
        );
        let response = self.get(registry, reference, &url, None)?;
        progress.blob_started(&descriptor.digest, descriptor.size);
        let reader = Counting {
            inner: response.into_body().into_reader(),
            progress: &mut *progress,
        };
        let stored = store.put_blob(reader, Some((&descriptor.digest, descriptor.size)));
        progress.blob_done();
        stored.map(drop)
    }

    /// GET with the registry's auth: anonymous first, then on a 401 the challenge's
    /// scheme (Basic with the configured account, or a Bearer token from the realm).
    fn get(
        &mut self,
        registry: &str,
        reference: &ImageRef,
        url: &str,
        accept: Option<&str>,
    ) -> Result<ureq::http::Response<ureq::Body>> {
        let token_key = format!("{registry}/{}", reference.repository);
        let mut authorization = self.tokens.get(&token_key).map(|t| format!("Bearer {t}"));
        for _ in 0..2 {
            let mut request = self.agent.get(url);
            if let Some(accept) = accept {
                request = request.header("Accept", accept);
            }
            if let Some(auth) = &authorization {
                request = request.header("Authorization", auth);
            }
            let response = request.call().map_err(|e| net_error(url, e))?;
            let status = response.status().as_u16();
            if status == 401 && authorization.is_none() {
                let challenge = response
                    .headers()
                    .get("www-authenticate")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or_default()
                    .to_string();
                authorization = Some(self.answer(registry, &token_key, &challenge)?);
                continue;
            }
            if status != 200 {
                return Err(net_error(url, format!("the registry answered {status}")));
            }
            return Ok(response);
        }
        Err(net_error(url, "the registry refused the credentials (401)"))
    }

    fn answer(&mut self, registry: &str, token_key: &str, challenge: &str) -> Result<String> {
        let account = self.options.credentials.get(registry);
        let basic = account.map(|c| {
            format!(
                "Basic {}",
                base64(&format!("{}:{}", c.username, c.password))
            )
        });
        let (scheme, params) = parse_challenge(challenge);
        match scheme.as_str() {
            "basic" => basic.ok_or_else(|| {
                net_error(
                    registry,
                    "the registry asks for an account; add it to [images.registries]",
                )
            }),
            "bearer" => {
                let realm = params
                    .get("realm")
                    .ok_or_else(|| net_error(registry, "a Bearer challenge without a realm"))?;
                let mut url = realm.clone();
                let query: Vec<String> = ["service", "scope"]
                    .iter()
                    .filter_map(|k| params.get(*k).map(|v| format!("{k}={}", percent(v))))
                    .collect();
                if !query.is_empty() {
                    url = format!("{url}?{}", query.join("&"));
                }
                let mut request = self.agent.get(&url);
                if let Some(basic) = &basic {
                    request = request.header("Authorization", basic);
                }
                let mut response = request.call().map_err(|e| net_error(&url, e))?;
                if response.status().as_u16() != 200 {
                    return Err(net_error(
                        &url,
                        format!("the token service answered {}", response.status()),
                    ));
                }
                let body = response
                    .body_mut()
                    .with_config()
                    .limit(1 << 20)
                    .read_to_vec()
                    .map_err(|e| net_error(&url, e))?;
                let token: TokenResponse = oci::parse_json("token", &body)?;
                let token = token
                    .token
                    .or(token.access_token)
                    .ok_or_else(|| net_error(&url, "no token in the answer"))?;
                self.tokens.insert(token_key.to_string(), token.clone());
                Ok(format!("Bearer {token}"))
            }
            _ => Err(net_error(
                registry,
                format!("an unknown auth challenge {challenge:?}"),
            )),
        }
    }
}

#[derive(serde::Deserialize)]
struct TokenResponse {
    token: Option<String>,
    access_token: Option<String>,
}

/// A tag alone is a moving name: refused unless the operator allows tags.
pub fn check_pinned(reference: &ImageRef, allow_tags: bool) -> Result<()> {
    if reference.digest.is_some() || allow_tags {
        return Ok(());
    }
    Err(ImageError::Reference {
        reference: reference.to_string(),
        reason: "a tag without a digest; pin the image (name@sha256:...), or allow tags with \
                 images.allow_tags"
            .to_string(),
    })
}

fn media_type_of(bytes: &[u8]) -> Option<String> {
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Typed {
        media_type: Option<String>,
    }
    serde_json::from_slice::<Typed>(bytes).ok()?.media_type
}

/// `Bearer realm="https://auth",service="reg",scope="repository:x:pull"` -> scheme
/// (lower case) and parameters.
pub fn parse_challenge(header: &str) -> (String, BTreeMap<String, String>) {
    let (scheme, rest) = header.trim().split_once(' ').unwrap_or((header.trim(), ""));
    let mut params = BTreeMap::new();
    let mut rest = rest.trim();
    while let Some((key, after)) = rest.split_once('=') {
        let key = key
            .trim()
            .trim_start_matches(',')
            .trim()
            .to_ascii_lowercase();
        let (value, next) = if let Some(quoted) = after.strip_prefix('"') {
            let end = quoted.find('"').unwrap_or(quoted.len());
            (&quoted[..end], quoted.get(end + 1..).unwrap_or(""))
        } else {
            let end = after.find(',').unwrap_or(after.len());
            (&after[..end], &after[end..])
        };
        params.insert(key, value.to_string());
        rest = next.trim_start_matches(',').trim();
    }
    (scheme.to_ascii_lowercase(), params)
}

fn base64(text: &str) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in text.as_bytes().chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

fn percent(value: &str) -> String {
    value
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            b => format!("%{b:02X}"),
        })
        .collect()
}

struct Counting<'a, R> {
    inner: R,
    progress: &'a mut dyn Progress,
}

impl<R: Read> Read for Counting<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.progress.advanced(n as u64);
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tag_is_refused_unless_tags_are_allowed() {
        let tag = ImageRef::parse("reg.test/py:3.12", None).unwrap();
        assert!(check_pinned(&tag, false)
            .unwrap_err()
            .to_string()
            .contains("images.allow_tags"));
        assert!(check_pinned(&tag, true).is_ok());
        let pinned = tag.pinned(Digest::of(b""));
        assert!(check_pinned(&pinned, false).is_ok());
    }

    #[test]
    fn a_bearer_challenge_gives_its_realm_service_and_scope() {
        let (scheme, params) = parse_challenge(
            r#"Bearer realm="https://auth.test/token",service="reg.test",scope="repository:a/b:pull""#,
        );
        assert_eq!(scheme, "bearer");
        assert_eq!(params["realm"], "https://auth.test/token");
        assert_eq!(params["service"], "reg.test");
        assert_eq!(params["scope"], "repository:a/b:pull");
        let (scheme, params) = parse_challenge(r#"Basic realm="Registry Realm""#);
        assert_eq!(
            (scheme.as_str(), params["realm"].as_str()),
            ("basic", "Registry Realm")
        );
    }

    #[test]
    fn basic_credentials_are_base64_as_rfc_4648_gives_them() {
        assert_eq!(base64("user:pass"), "dXNlcjpwYXNz");
        assert_eq!(base64("a"), "YQ==");
        assert_eq!(base64("ab"), "YWI=");
        assert_eq!(percent("repository:a/b:pull"), "repository%3Aa%2Fb%3Apull");
    }
}
