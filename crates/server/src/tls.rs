//! TLS for `tls:ADDR:PORT` listeners: the operator's certificate chain and key
//! (`server.tls_cert_file`, `server.tls_key_file`, PEM), rustls on ring, HTTP/1.1 only
//! (the service's connections are served by hyper's HTTP/1 builder). API keys travel in
//! a header, so a listener reachable from another host must not be plain TCP
//! (config.rs refuses that unless the operator says a proxy in front terminates TLS).

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use std::path::Path;
use std::sync::Arc;
use tokio_rustls::TlsAcceptor;

/// Why the service's certificate or key cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsSetupError {
    #[error("server.tls_cert_file {path}: {why}")]
    Certificate { path: String, why: String },
    #[error("server.tls_key_file {path}: {why}")]
    Key { path: String, why: String },
    #[error("server.tls_cert_file and server.tls_key_file do not form a usable pair: {0}")]
    Pair(String),
}

/// The acceptor of every `tls:` listener, from the PEM files the configuration names.
pub fn acceptor(cert_file: &Path, key_file: &Path) -> Result<TlsAcceptor, TlsSetupError> {
    let chain = certificate_chain(cert_file)?;
    let key = private_key(key_file)?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsSetupError::Pair(e.to_string()))?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(|e| TlsSetupError::Pair(e.to_string()))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}

fn certificate_chain(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsSetupError> {
    let failed = |why: String| TlsSetupError::Certificate {
        path: path.display().to_string(),
        why,
    };
    let chain = CertificateDer::pem_file_iter(path)
        .map_err(|e| failed(e.to_string()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| failed(e.to_string()))?;
    if chain.is_empty() {
        return Err(failed("no PEM certificate in the file".into()));
    }
    Ok(chain)
}

fn private_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsSetupError> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| TlsSetupError::Key {
        path: path.display().to_string(),
        why: e.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(dir: &Path) -> (std::path::PathBuf, std::path::PathBuf) {
        let cert = rcgen::generate_simple_self_signed(vec!["airlock.test".into()]).unwrap();
        let (cert_file, key_file) = (dir.join("cert.pem"), dir.join("key.pem"));
        std::fs::write(&cert_file, cert.cert.pem()).unwrap();
        std::fs::write(&key_file, cert.key_pair.serialize_pem()).unwrap();
        (cert_file, key_file)
    }

    #[test]
    fn a_certificate_and_its_key_make_an_acceptor() {
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = pair(dir.path());
        assert!(acceptor(&cert, &key).is_ok());
    }

    #[test]
    fn a_missing_or_empty_file_or_a_key_of_another_certificate_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = pair(dir.path());
        let other = dir.path().join("other");
        std::fs::create_dir(&other).unwrap();
        let (_, other_key) = pair(&other);
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "").unwrap();
        let message = |r: Result<TlsAcceptor, TlsSetupError>| r.err().unwrap().to_string();
        assert!(message(acceptor(&dir.path().join("none.pem"), &key))
            .starts_with("server.tls_cert_file "));
        assert!(message(acceptor(&empty, &key)).contains("no PEM certificate"));
        assert!(message(acceptor(&cert, &empty)).starts_with("server.tls_key_file "));
        assert!(message(acceptor(&cert, &other_key)).contains("usable pair"));
    }
}
