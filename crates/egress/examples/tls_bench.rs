//! The cost of TLS interception: an HTTPS request through a CONNECT tunnel the proxy
//! intercepts (a domain with an HTTP rule: the cell's TLS terminated with a leaf of the
//! run CA, the request checked, re-encrypted and verified upstream) against the same
//! request to a host that is only tunnelled, interleaved in one run, one connection (and
//! full TLS handshake) per request. The upstream is a rustls server on 127.0.0.2 with a
//! certificate from a CA made here. Prints JSON.
//!
//! `cargo run -p airlock-egress --release --example tls_bench [-- ITERATIONS]`

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use airlock_egress::l7::HttpRule;
use airlock_egress::tls::RunCa;
use airlock_egress::{
    start_proxy_with_policy, DestinationRule, EgressConfig, ProxyListeners, RunPolicy,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
use rustls_pki_types::pem::PemObject;

const SERVER_IP: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 2);
const INTERCEPTED: &str = "intercept.test";
const TUNNELLED: &str = "tunnel.test";

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A CA and a server certificate from it for both names: (CA PEM, server config).
fn upstream_tls() -> (String, Arc<rustls::ServerConfig>) {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(Vec::new()).unwrap();
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca = params.self_signed(&ca_key).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let leaf = rcgen::CertificateParams::new(vec![INTERCEPTED.into(), TUNNELLED.into()])
        .unwrap()
        .signed_by(&key, &ca, &ca_key)
        .unwrap();
    let config = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![leaf.der().clone()],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
        )
        .unwrap();
    (ca.pem(), Arc::new(config))
}

/// Answers every request with a fixed 200 over TLS and closes.
fn https_server(config: Arc<rustls::ServerConfig>) -> SocketAddr {
    let l = TcpListener::bind((SERVER_IP, 0)).unwrap();
    let addr = l.local_addr().unwrap();
    thread::spawn(move || {
        for s in l.incoming() {
            let Ok(s) = s else { continue };
            let config = config.clone();
            thread::spawn(move || {
                let Ok(connection) = rustls::ServerConnection::new(config) else {
                    return;
                };
                let mut tls = rustls::StreamOwned::new(connection, s);
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                    match tls.read(&mut chunk) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                }
                let _ = tls.write_all(
                    b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok",
                );
                tls.conn.send_close_notify();
                let _ = tls.flush();
            });
        }
    });
    addr
}

/// CONNECT, a full TLS handshake, one GET and its whole response.
fn request(
    proxy: SocketAddr,
    host: &str,
    port: u16,
    client: &Arc<rustls::ClientConfig>,
) -> Duration {
    let started = Instant::now();
    let mut s = TcpStream::connect(proxy).unwrap();
    s.set_nodelay(true).unwrap();
    write!(
        s,
        "CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n"
    )
    .unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        s.read_exact(&mut byte).unwrap();
        head.push(byte[0]);
    }
    assert!(
        head.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&head)
    );
    let name = ServerName::try_from(host.to_string()).unwrap();
    let connection = rustls::ClientConnection::new(client.clone(), name).unwrap();
    let mut tls = rustls::StreamOwned::new(connection, s);
    write!(
        tls,
        "GET /bench HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut response = Vec::new();
    let _ = tls.read_to_end(&mut response);
    assert!(
        response.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&response)
    );
    started.elapsed()
}

fn median_us(mut samples: Vec<Duration>) -> f64 {
    samples.sort();
    samples[samples.len() / 2].as_secs_f64() * 1e6
}

fn main() {
    let iterations: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(500);
    let (upstream_ca, server_config) = upstream_tls();
    let server = https_server(server_config);
    let roots_file =
        std::env::temp_dir().join(format!("airlock-tls-bench-{}.pem", std::process::id()));
    std::fs::write(&roots_file, &upstream_ca).unwrap();
    let run_ca = Arc::new(RunCa::generate().unwrap());

    // The client (the cell) trusts the host's roots' stand-in (the upstream's CA, for the
    // tunnelled host) and the run CA (for the intercepted one), as the cell's bundle does.
    let mut roots = rustls::RootCertStore::empty();
    for pem in [upstream_ca.as_str(), run_ca.certificate_pem().as_str()] {
        roots
            .add(CertificateDer::from_pem_slice(pem.as_bytes()).unwrap())
            .unwrap();
    }
    let client = Arc::new(
        rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth(),
    );

    let resolve = [INTERCEPTED, TUNNELLED].map(|h| (h.to_string(), IpAddr::V4(SERVER_IP)));
    let config = EgressConfig {
        resolve: BTreeMap::from(resolve),
        exempt_cidrs: vec!["127.0.0.2/32".parse().unwrap()],
        max_connections: 64,
        max_bytes: u64::MAX / 2,
        tls_ca_file: Some(roots_file.clone()),
        ..EgressConfig::default()
    };
    let rules = [INTERCEPTED, TUNNELLED]
        .map(|h| DestinationRule {
            host_pattern: h.into(),
            ports: vec![server.port()],
        })
        .to_vec();
    let policy = RunPolicy {
        injections: Vec::new(),
        http_rules: vec![HttpRule {
            host_pattern: INTERCEPTED.into(),
            methods: vec!["GET".into()],
            path_prefixes: vec!["/".into()],
        }],
        tls: Some(run_ca),
    };
    let listeners = ProxyListeners {
        http: TcpListener::bind("127.0.0.1:0").unwrap(),
        socks: None,
        dns: None,
        transparent: Vec::new(),
    };
    let handle = start_proxy_with_policy(config, rules, listeners, policy).unwrap();
    let proxy = handle.http_addr();
    let port = server.port();
    for _ in 0..50 {
        request(proxy, TUNNELLED, port, &client);
        request(proxy, INTERCEPTED, port, &client);
    }
    let (mut tunnelled, mut intercepted) = (Vec::new(), Vec::new());
    for _ in 0..iterations {
        tunnelled.push(request(proxy, TUNNELLED, port, &client));
        intercepted.push(request(proxy, INTERCEPTED, port, &client));
    }
    let (tunnelled, intercepted) = (median_us(tunnelled), median_us(intercepted));
    println!(
        "{{\"iterations\": {iterations}, \"tunnelled_https_median_us\": {tunnelled:.1}, \"intercepted_https_median_us\": {intercepted:.1}, \"added_us\": {:.1}}}",
        intercepted - tunnelled
    );
    let records = handle.shutdown();
    let denied = records
        .iter()
        .filter(|r| r.decision == airlock_egress::Decision::Denied)
        .count();
    assert_eq!(denied, 0, "every bench request was allowed");
    let _ = std::fs::remove_file(&roots_file);
}
