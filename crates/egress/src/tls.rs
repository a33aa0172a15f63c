//! TLS interception for the hosts the proxy must read inside: a run's secret hosts and
//! the domains with an HTTP rule (docs/credentials.md, "HTTPS").
//!
//! A [`RunCa`] is made for each run (or session) that needs one; its private key lives
//! only in this process's memory and dies with the run. The cell trusts the CA's
//! certificate (the engine installs it in the cell's trust bundle); the proxy terminates
//! the cell's TLS with a leaf certificate minted for the tunnel's host, reads the plain
//! HTTP inside with the same checks as any plain-HTTP request, and re-encrypts upstream
//! with full verification against the host's roots (or the operator's `tls_ca_file`).
//! A verification failure refuses the request; there is no unverified fallback.

use std::collections::HashMap;
use std::fmt;
use std::path::Path;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Where a Debian-family host keeps its trust bundle: the upstream leg's default roots,
/// and the file the cell's bundle starts from.
pub const HOST_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";

/// The only application protocol offered to the cell (and upstream): the proxy's request
/// checks read HTTP/1.x. A client that insists on h2 fails its handshake cleanly
/// (`no_application_protocol`).
const ALPN_HTTP1: &[u8] = b"http/1.1";

/// Leaf configurations kept per run; a run that names more hosts than this re-mints.
const MAX_CACHED_LEAVES: usize = 256;

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot make the run's certificate authority: {0}")]
    Generate(String),
    #[error("cannot mint a certificate for {host:?}: {why}")]
    Leaf { host: String, why: String },
    #[error("cannot read the upstream roots {path}: {why}")]
    Roots { path: String, why: String },
    #[error("TLS configuration: {0}")]
    Config(String),
}

/// A run's certificate authority. `Debug` shows nothing of the key, and nothing here
/// writes it anywhere: it is never serialised.
pub struct RunCa {
    certificate: rcgen::Certificate,
    key: rcgen::KeyPair,
    /// One key for every leaf of the run (the leaves differ only in their names).
    leaf_key: rcgen::KeyPair,
}

impl fmt::Debug for RunCa {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RunCa").finish_non_exhaustive()
    }
}

impl RunCa {
    /// A fresh CA (ECDSA P-256), its key from the kernel's random source via ring.
    pub fn generate() -> Result<RunCa, TlsError> {
        let failed = |e: rcgen::Error| TlsError::Generate(e.to_string());
        let key = rcgen::KeyPair::generate().map_err(failed)?;
        let leaf_key = rcgen::KeyPair::generate().map_err(failed)?;
        let mut params = rcgen::CertificateParams::new(Vec::new()).map_err(failed)?;
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "airlock run CA");
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Constrained(0));
        params.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::CrlSign,
        ];
        let certificate = params.self_signed(&key).map_err(failed)?;
        Ok(RunCa {
            certificate,
            key,
            leaf_key,
        })
    }

    /// The CA's certificate (public), PEM: what the cell's trust bundle adds.
    pub fn certificate_pem(&self) -> String {
        self.certificate.pem()
    }

    /// A leaf certificate for `host` (a DNS name or an IP literal), signed by this CA.
    fn leaf(&self, host: &str) -> Result<CertificateDer<'static>, TlsError> {
        let failed = |e: rcgen::Error| TlsError::Leaf {
            host: host.to_string(),
            why: e.to_string(),
        };
        let mut params = rcgen::CertificateParams::new(vec![host.to_string()]).map_err(failed)?;
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, host);
        params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
        let leaf = params
            .signed_by(&self.leaf_key, &self.certificate, &self.key)
            .map_err(failed)?;
        Ok(leaf.der().clone())
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The run's interception state: its CA, the leaf configurations minted so far, and the
/// upstream leg's verifying client configuration.
pub struct Interceptor {
    ca: Arc<RunCa>,
    leaves: Mutex<HashMap<String, Arc<ServerConfig>>>,
    upstream: Arc<ClientConfig>,
}

impl Interceptor {
    /// `roots`: the operator's `tls_ca_file`, or [`HOST_BUNDLE`].
    pub fn new(ca: Arc<RunCa>, roots: &Path) -> Result<Interceptor, TlsError> {
        let store = load_roots(roots)?;
        let mut upstream = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Config(e.to_string()))?
            .with_root_certificates(store)
            .with_no_client_auth();
        upstream.alpn_protocols = vec![ALPN_HTTP1.to_vec()];
        Ok(Interceptor {
            ca,
            leaves: Mutex::new(HashMap::new()),
            upstream: Arc::new(upstream),
        })
    }

    /// The server configuration that answers the cell for `host` (cached per run).
    pub fn server_config(&self, host: &str) -> Result<Arc<ServerConfig>, TlsError> {
        let mut leaves = self.leaves.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(config) = leaves.get(host) {
            return Ok(config.clone());
        }
        let leaf = self.ca.leaf(host)?;
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(self.ca.leaf_key.serialize_der()));
        let mut config = ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Config(e.to_string()))?
            .with_no_client_auth()
            .with_single_cert(vec![leaf], key)
            .map_err(|e| TlsError::Config(e.to_string()))?;
        config.alpn_protocols = vec![ALPN_HTTP1.to_vec()];
        let config = Arc::new(config);
        if leaves.len() >= MAX_CACHED_LEAVES {
            leaves.clear();
        }
        leaves.insert(host.to_string(), config.clone());
        Ok(config)
    }

    pub fn upstream(&self) -> Arc<ClientConfig> {
        self.upstream.clone()
    }
}

/// The cell's trust bundle: the host's bundle (when it has one) and the run CA's
/// certificate, so clients trust the proxy's leaves for intercepted hosts and the
/// upstreams' own certificates for tunnelled ones.
pub fn trust_bundle(ca: &RunCa) -> Vec<u8> {
    let mut bundle = std::fs::read(HOST_BUNDLE).unwrap_or_default();
    if !bundle.is_empty() && !bundle.ends_with(b"\n") {
        bundle.push(b'\n');
    }
    bundle.extend_from_slice(ca.certificate_pem().as_bytes());
    bundle
}

/// The name the upstream's certificate must carry: the tunnel's host.
pub fn server_name(host: &str) -> Option<ServerName<'static>> {
    ServerName::try_from(host.to_string()).ok()
}

/// Every certificate of a PEM bundle; an unreadable file or one without any certificate
/// is an error (an empty root store would refuse every upstream, silently).
fn load_roots(path: &Path) -> Result<RootCertStore, TlsError> {
    let failed = |why: String| TlsError::Roots {
        path: path.display().to_string(),
        why,
    };
    let mut store = RootCertStore::empty();
    let certificates = CertificateDer::pem_file_iter(path).map_err(|e| failed(e.to_string()))?;
    for certificate in certificates {
        let certificate = certificate.map_err(|e| failed(e.to_string()))?;
        // A bundle may hold a certificate webpki cannot use as an anchor (an old
        // encoding); skipping it only narrows what is trusted.
        let _ = store.add(certificate);
    }
    if store.is_empty() {
        return Err(failed("no usable certificate".into()));
    }
    Ok(store)
}

/// Whether a failed upstream handshake was the certificate's fault (not signed by the
/// roots, wrong name, expired), as opposed to the connection's.
pub fn is_certificate_failure(err: &std::io::Error) -> bool {
    err.get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        .is_some_and(|e| {
            matches!(
                e,
                rustls::Error::InvalidCertificate(_) | rustls::Error::NoCertificatesPresented
            )
        })
}

/// A stream whose first bytes were already read (the ClientHello the SNI check saw):
/// they are replayed before the rest.
pub struct Replay<S> {
    prefix: Vec<u8>,
    at: usize,
    inner: S,
}

impl<S> Replay<S> {
    pub fn new(prefix: Vec<u8>, inner: S) -> Replay<S> {
        Replay {
            prefix,
            at: 0,
            inner,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Replay<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = &mut *self;
        if this.at < this.prefix.len() {
            let n = (this.prefix.len() - this.at).min(buf.remaining());
            buf.put_slice(&this.prefix[this.at..this.at + n]);
            this.at += n;
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Replay<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_leaf_is_signed_by_the_run_ca_for_its_host_and_cached() {
        let ca = Arc::new(RunCa::generate().unwrap());
        let dir = std::env::temp_dir().join(format!("airlock-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let roots = dir.join("ca.pem");
        std::fs::write(&roots, ca.certificate_pem()).unwrap();
        let interceptor = Interceptor::new(ca.clone(), &roots).unwrap();
        let first = interceptor.server_config("api.test").unwrap();
        let again = interceptor.server_config("api.test").unwrap();
        assert!(Arc::ptr_eq(&first, &again));
        assert_eq!(first.alpn_protocols, vec![b"http/1.1".to_vec()]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn roots_without_a_certificate_are_an_error_not_an_empty_store() {
        let dir = std::env::temp_dir().join(format!("airlock-tls-empty-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let roots = dir.join("empty.pem");
        std::fs::write(&roots, "not a certificate\n").unwrap();
        let ca = Arc::new(RunCa::generate().unwrap());
        assert!(matches!(
            Interceptor::new(ca, &roots),
            Err(TlsError::Roots { .. })
        ));
        assert!(matches!(
            load_roots(&dir.join("missing.pem")),
            Err(TlsError::Roots { .. })
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_replayed_stream_yields_the_bytes_already_read_first() {
        use tokio::io::AsyncReadExt;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let read = runtime.block_on(async {
            let mut stream = Replay::new(b"hello ".to_vec(), &b"world"[..]);
            let mut all = Vec::new();
            stream.read_to_end(&mut all).await.unwrap();
            all
        });
        assert_eq!(read, b"hello world");
    }

    #[test]
    fn the_ca_debug_form_shows_no_key() {
        let ca = RunCa::generate().unwrap();
        let shown = format!("{ca:?}");
        assert!(!shown.contains("PRIVATE"), "{shown}");
        assert!(ca
            .certificate_pem()
            .starts_with("-----BEGIN CERTIFICATE-----"));
    }
}
