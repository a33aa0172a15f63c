//! Entry points for the coverage-guided fuzz targets under `fuzz/` (and the property
//! tests): each feeds attacker-controlled bytes to one parser the proxy runs on the
//! trusted side, exactly as the proxy calls it, and checks the invariants that must hold
//! for any input. Not part of the crate's API.

use crate::secrets::{self, Injection, Placement};
use crate::tunnel::BodyFraming;
use crate::{l7, request};

/// A fixed live secret, so inputs can exercise the swap.
fn injection() -> Injection {
    Injection {
        name: "fuzz".into(),
        placeholder: format!("{}{}", secrets::MARKER, "0123456789abcdef".repeat(2)),
        value: "the-real-value".into(),
        hosts: vec!["api.test".into(), "*.api.test".into()],
        placement: Placement::Header {
            name: "Authorization".into(),
            format: "Bearer {}".into(),
        },
        methods: vec!["POST".into()],
        path_prefixes: vec!["/v1/".into()],
        revoke: Vec::new(),
    }
}

fn rules() -> Vec<l7::HttpRule> {
    vec![l7::HttpRule {
        host_pattern: "pypi.test".into(),
        methods: vec!["GET".into()],
        path_prefixes: vec!["/simple/".into()],
    }]
}

/// One request head as a forward proxy or a plaintext tunnel reads it: the strict
/// parser, the framing and `Connection` rules, the tunnel rewrite with a secret and a
/// rule, and the body framing over what follows. Invariant: a head the proxy forwards
/// never holds the marker, and never the value unless the placeholder was in place.
pub fn http_request(bytes: &[u8]) {
    let _ = request::classify_plaintext(bytes);
    let Some(end) = request::find_head_end(bytes) else {
        return;
    };
    let Ok(head) = request::parse(&bytes[..end]) else {
        return;
    };
    let injections = [injection()];
    let rules = rules();
    for (host, port) in [("api.test", 80), ("pypi.test", 8080), ("evil.test", 80)] {
        if let Ok(forward) = request::tunnel_request(&head, host, port, (&injections, &rules)) {
            assert!(
                !secrets::contains_marker(&forward.head),
                "a forwarded head holds the marker"
            );
            let mut framing = forward.framing.clone();
            let _ = feed_body(&mut framing, &bytes[end..]);
        }
    }
}

fn feed_body(framing: &mut BodyFraming, body: &[u8]) -> Result<usize, ()> {
    let taken = framing.feed_for_fuzzing(body)?;
    assert!(taken <= body.len());
    Ok(taken)
}

/// The secret rules alone on any header set: a swapped header holds the value only in the
/// configured header, and nothing holds the marker.
pub fn secret_headers(bytes: &[u8]) {
    let text = String::from_utf8_lossy(bytes);
    let mut lines = text.split('\n');
    let target = lines.next().unwrap_or("/");
    let pairs: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.to_string(), v.trim().to_string()))
        .collect();
    let headers: Vec<httparse::Header<'_>> = pairs
        .iter()
        .map(|(n, v)| httparse::Header {
            name: n,
            value: v.as_bytes(),
        })
        .collect();
    let inj = injection();
    let head = secrets::Head {
        method: "POST",
        target,
        headers: &headers,
        host: "api.test",
    };
    if let Ok(swapped) = secrets::apply(std::slice::from_ref(&inj), &head) {
        for (index, value) in &swapped.headers {
            assert!(!secrets::contains_marker(value));
            assert!(headers[*index].name.eq_ignore_ascii_case("authorization"));
        }
        if let Some(t) = &swapped.target {
            assert!(!secrets::contains_marker(t.as_bytes()));
        }
    }
    assert!(!secrets::contains_marker(secrets::mask(&text).as_bytes()));
    let mut scanner = secrets::StreamScanner::default();
    // Stops at the first chunk that completes the marker: the answer is known then.
    let found = bytes.chunks(7).any(|chunk| scanner.feed(chunk));
    assert_eq!(found, secrets::contains_marker(bytes));
}

/// The TLS ClientHello reader on any prefix.
pub fn sni(bytes: &[u8]) {
    let _ = crate::sni::inspect(bytes);
    for cut in [1, bytes.len() / 2] {
        if cut < bytes.len() {
            let _ = crate::sni::inspect(&bytes[..cut]);
        }
    }
}

/// SOCKS5 negotiation on any client bytes (the replies go nowhere).
pub fn socks5(bytes: &[u8]) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a current-thread runtime");
    runtime.block_on(async {
        let mut stream = tokio::io::join(bytes, tokio::io::sink());
        let _ = crate::socks::negotiate(&mut stream).await;
    });
}

/// The cell resolver on any datagram.
pub fn dns(bytes: &[u8]) {
    let outcome = crate::dns::respond(bytes, |name| {
        (name == "api.test").then_some(std::net::Ipv4Addr::new(127, 0, 0, 2))
    });
    if let Some(reply) = outcome.reply {
        // A reply always answers the query's id.
        assert_eq!(reply.get(..2), bytes.get(..2));
    }
}

/// A cell's first TLS flight into an intercepted tunnel, as the proxy meets it: the SNI
/// reader's verdict, then the run's TLS server configuration (crate::tls) processing the
/// same bytes. Invariant: when both the SNI reader and rustls read a server name, they
/// read the same one (the tunnel's SNI check and the terminated TLS agree).
pub fn intercepted_hello(bytes: &[u8]) {
    use std::sync::OnceLock;
    static CONFIG: OnceLock<std::sync::Arc<rustls::ServerConfig>> = OnceLock::new();
    let config = CONFIG.get_or_init(|| {
        let ca = std::sync::Arc::new(crate::tls::RunCa::generate().expect("a run CA"));
        let roots =
            std::env::temp_dir().join(format!("airlock-fuzz-ca-{}.pem", std::process::id()));
        std::fs::write(&roots, ca.certificate_pem()).expect("write the fuzz roots");
        let interceptor = crate::tls::Interceptor::new(ca, &roots).expect("an interceptor");
        let _ = std::fs::remove_file(&roots);
        interceptor.server_config("api.test").expect("a leaf")
    });
    let ours = match crate::sni::inspect(bytes) {
        crate::sni::Inspection::ClientHello { server_name } => server_name,
        _ => None,
    };
    let Ok(mut connection) = rustls::ServerConnection::new(config.clone()) else {
        return;
    };
    let mut input = bytes;
    while !input.is_empty() {
        match connection.read_tls(&mut input) {
            Ok(0) | Err(_) => break,
            Ok(_) => {
                if connection.process_new_packets().is_err() {
                    break;
                }
            }
        }
    }
    if let (Some(ours), Some(theirs)) = (ours, connection.server_name()) {
        assert!(
            crate::destination::same_host(&ours, theirs),
            "SNI reader {ours:?} vs rustls {theirs:?}"
        );
    }
}
