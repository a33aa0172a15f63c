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
            Ok(RustlsStream(Box::new(tls)))
        })
    }
}

/// A TLS stream to the server. Boxed: a rustls connection is large.
pub(crate) struct RustlsStream<S>(Box<tokio_rustls::client::TlsStream<S>>);

impl<S: AsyncRead + AsyncWrite + Unpin> TlsStream for RustlsStream<S> {
    /// No channel binding: the server is authenticated by the verified chain and name,
    /// and SCRAM falls back to its plain form (the server's `tls-server-end-point` would
    /// need the certificate's signature hash, which rustls does not expose).
    fn channel_binding(&self) -> ChannelBinding {
        ChannelBinding::none()
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for RustlsStream<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.0).poll_read(cx, buf)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for RustlsStream<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut *self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.0).poll_shutdown(cx)
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
