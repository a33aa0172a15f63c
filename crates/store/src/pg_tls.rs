//! TLS to a fleet's Postgres over rustls (ring), for `sslmode=verify-full`: the server's
//! chain is verified against the CA file of `sslrootcert=` only (never the host's bundle:
//! the operator names who may sign the database's certificate), and the certificate must
//! name the host the URL names (`host=`; the address connected to may come from
//! `hostaddr=` or from resolving that name).
//!
//! This is postgres's `MakeTlsConnect` written here over tokio-rustls, which the
//! workspace already links for the egress proxy, rather than one more crate.

use std::future::Future;
use std::io;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use postgres::tls::{ChannelBinding, MakeTlsConnect, TlsConnect, TlsStream};
use rustls::ClientConfig;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Connects with TLS verified against one CA file.
#[derive(Clone)]
pub(crate) struct VerifiedTls {
    config: Arc<ClientConfig>,
}

impl VerifiedTls {
    /// The client configuration trusting exactly the certificates of `ca_file` (PEM). A
    /// file that cannot be read or holds no certificate is an error naming it.
    pub fn from_ca_file(ca_file: &Path) -> Result<VerifiedTls, String> {
        let shown = ca_file.display();
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_file_iter(ca_file)
            .map_err(|e| format!("sslrootcert {shown}: cannot be read: {e}"))?
        {
            let cert = cert.map_err(|e| format!("sslrootcert {shown}: not PEM: {e}"))?;
            roots
                .add(cert)
                .map_err(|e| format!("sslrootcert {shown}: not a CA certificate: {e}"))?;
        }
        if roots.is_empty() {
            return Err(format!("sslrootcert {shown}: holds no certificate"));
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS configuration: {e}"))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        Ok(VerifiedTls {
            config: Arc::new(config),
        })
    }
}

impl<S> MakeTlsConnect<S> for VerifiedTls
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = RustlsStream<S>;
    type TlsConnect = OneHandshake;
    type Error = io::Error;

    /// `domain`: the URL's `host` (empty without one, which the name check refuses).
    fn make_tls_connect(&mut self, domain: &str) -> io::Result<OneHandshake> {
        let name = ServerName::try_from(domain.to_string()).map_err(|_| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "{domain:?} is not a host name or address to check the certificate against"
                ),
            )
        })?;
        Ok(OneHandshake {
            config: self.config.clone(),
            name,
        })
    }
}

pub(crate) struct OneHandshake {
    config: Arc<ClientConfig>,
    name: ServerName<'static>,
}

impl<S> TlsConnect<S> for OneHandshake
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = RustlsStream<S>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<RustlsStream<S>>> + Send>>;

    fn connect(self, stream: S) -> Self::Future {
        let connector = tokio_rustls::TlsConnector::from(self.config);
        Box::pin(async move {
            let tls = connector.connect(self.name, stream).await?;
            let end_point = tls
                .get_ref()
                .1
                .peer_certificates()
                .and_then(|chain| chain.first())
                .and_then(|leaf| end_point_hash(leaf));
            Ok(RustlsStream {
                tls: Box::new(tls),
                end_point,
            })
        })
    }
}

/// A TLS stream to the server. Boxed: a rustls connection is large.
pub(crate) struct RustlsStream<S> {
    tls: Box<tokio_rustls::client::TlsStream<S>>,
    /// `tls-server-end-point` of the server's certificate, when its hash is known.
    end_point: Option<Vec<u8>>,
}

impl<S: AsyncRead + AsyncWrite + Unpin> TlsStream for RustlsStream<S> {
    /// SCRAM with channel binding (`SCRAM-SHA-256-PLUS`) binds the password exchange to
    /// this TLS session, so even a certificate wrongly issued for the host cannot relay
    /// it; without a known hash SCRAM runs unbound (the verified chain and name still
    /// authenticate the server).
    fn channel_binding(&self) -> ChannelBinding {
        match &self.end_point {
            Some(hash) => ChannelBinding::tls_server_end_point(hash.clone()),
            None => ChannelBinding::none(),
        }
    }
}

/// `tls-server-end-point` (RFC 5929, 4.1): the certificate hashed with its signature's
/// hash function (SHA-256 for MD5 and SHA-1); `None` for another signature (RSA-PSS,
/// Ed25519), for which it is not defined here.
fn end_point_hash(cert_der: &[u8]) -> Option<Vec<u8>> {
    use sha2::Digest;
    let (cert, _) = der_element(cert_der, DER_SEQUENCE)?;
    let (_tbs, rest) = der_element(cert, DER_SEQUENCE)?;
    let (algorithm, _) = der_element(rest, DER_SEQUENCE)?;
    let (oid, _) = der_element(algorithm, DER_OID)?;
    Some(match signature_hash(oid)? {
        Hash::Sha256 => sha2::Sha256::digest(cert_der).to_vec(),
        Hash::Sha384 => sha2::Sha384::digest(cert_der).to_vec(),
        Hash::Sha512 => sha2::Sha512::digest(cert_der).to_vec(),
    })
}

const DER_SEQUENCE: u8 = 0x30;
const DER_OID: u8 = 0x06;

enum Hash {
    Sha256,
    Sha384,
    Sha512,
}

/// The hash of a signature algorithm (its OID's DER content), as the end point uses it.
fn signature_hash(oid: &[u8]) -> Option<Hash> {
    const RSA: &[u8] = &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01];
    const ECDSA_SHA2: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x03];
    // ecdsa-with-SHA1 is 1.2.840.10045.4.1, one arc shorter than the SHA-2 ones.
    const ECDSA_SHA1: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x01];
    let (last, head) = oid.split_last()?;
    match (head, last) {
        (RSA, 4 | 5 | 11) | (ECDSA_SHA2, 2) => Some(Hash::Sha256),
        (RSA, 12) | (ECDSA_SHA2, 3) => Some(Hash::Sha384),
        (RSA, 13) | (ECDSA_SHA2, 4) => Some(Hash::Sha512),
        _ if oid == ECDSA_SHA1 => Some(Hash::Sha256),
        _ => None,
    }
}

/// One DER element of `tag` at the start of `input`: its content and what follows.
fn der_element(input: &[u8], tag: u8) -> Option<(&[u8], &[u8])> {
    let (&found, rest) = input.split_first()?;
    let (&first, rest) = rest.split_first()?;
    if found != tag {
        return None;
    }
    let (len, rest) = match first {
        short @ 0..=0x7f => (usize::from(short), rest),
        long => {
            let n = usize::from(long & 0x7f);
            if n == 0 || n > 4 || rest.len() < n {
                return None;
            }
            let len = rest[..n]
                .iter()
                .fold(0usize, |len, &b| (len << 8) | usize::from(b));
            (len, &rest[n..])
        }
    };
    (rest.len() >= len).then(|| rest.split_at(len))
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for RustlsStream<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.tls).poll_read(cx, buf)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for RustlsStream<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut *self.tls).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.tls).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.tls).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refusal(path: &Path) -> String {
        match VerifiedTls::from_ca_file(path) {
            Ok(_) => panic!("{} was accepted as a CA file", path.display()),
            Err(e) => e,
        }
    }

    #[test]
    fn a_ca_file_that_cannot_serve_is_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing.pem");
        let err = refusal(&missing);
        assert!(
            err.contains("missing.pem") && err.contains("cannot be read"),
            "{err}"
        );
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "no certificate here\n").unwrap();
        assert!(refusal(&empty).contains("holds no certificate"));
    }

    #[test]
    fn the_end_point_is_the_certificate_hashed_with_its_signature_hash() {
        use sha2::Digest;
        let p256 = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let p384 = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P384_SHA384).unwrap();
        let ed = rcgen::KeyPair::generate_for(&rcgen::PKCS_ED25519).unwrap();
        let cert = |key: &rcgen::KeyPair| {
            rcgen::CertificateParams::new(vec!["db.fleet.test".to_string()])
                .unwrap()
                .self_signed(key)
                .unwrap()
                .der()
                .to_vec()
        };
        let (a, b, c) = (cert(&p256), cert(&p384), cert(&ed));
        assert_eq!(end_point_hash(&a), Some(sha2::Sha256::digest(&a).to_vec()));
        assert_eq!(end_point_hash(&b), Some(sha2::Sha384::digest(&b).to_vec()));
        assert_eq!(end_point_hash(&c), None, "not defined for Ed25519 here");
        assert_eq!(end_point_hash(&a[..40]), None, "truncated");
        assert_eq!(end_point_hash(b"not DER"), None);
    }

    #[test]
    fn a_name_the_certificate_cannot_be_checked_against_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let ca = dir.path().join("ca.pem");
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(Vec::<String>::new())
            .unwrap()
            .self_signed(&key)
            .unwrap();
        std::fs::write(&ca, cert.pem()).unwrap();
        let mut tls = VerifiedTls::from_ca_file(&ca).unwrap();
        let refused = MakeTlsConnect::<tokio::net::TcpStream>::make_tls_connect(&mut tls, "").err();
        assert!(refused.is_some(), "an empty host name");
        MakeTlsConnect::<tokio::net::TcpStream>::make_tls_connect(&mut tls, "db.fleet.test")
            .unwrap();
    }
}
