//! A certificate authority made by a test: its leaves serve the tests' TLS upstreams and
//! the service's `tls:` listener.

/// A certificate authority made for the test.
pub struct TestCa {
    certificate: rcgen::Certificate,
    key: rcgen::KeyPair,
}

impl TestCa {
    pub fn new(name: &str) -> TestCa {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::new()).unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let certificate = params.self_signed(&key).unwrap();
        TestCa { certificate, key }
    }

    /// The CA's certificate, PEM (what a client trusts).
    pub fn certificate_pem(&self) -> String {
        self.certificate.pem()
    }

    /// A server certificate for `names` (DNS names or IP addresses) and its key, PEM.
    pub fn leaf(&self, names: &[&str]) -> (String, String) {
        let key = rcgen::KeyPair::generate().unwrap();
        let params =
            rcgen::CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
                .unwrap();
        let certificate = params
            .signed_by(&key, &self.certificate, &self.key)
            .unwrap();
        (certificate.pem(), key.serialize_pem())
    }
}
