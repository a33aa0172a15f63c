//! The cost of secret injection: plain-HTTP requests forwarded by the proxy, one
//! connection each, with an ordinary `Authorization` header against the same request
//! carrying a placeholder the proxy swaps, interleaved in one run. Prints JSON.
//!
//! `cargo run -p airlock-egress --release --example secrets_bench [-- ITERATIONS]`

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::thread;
use std::time::{Duration, Instant};

use airlock_egress::secrets::{Injection, Placement, MARKER};
use airlock_egress::{start_proxy_with_secrets, DestinationRule, EgressConfig, ProxyListeners};

const SERVER_IP: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 2);

/// Answers every request with a fixed 200 and closes.
fn http_server() -> SocketAddr {
    let l = TcpListener::bind((SERVER_IP, 0)).unwrap();
    let addr = l.local_addr().unwrap();
    thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { continue };
            thread::spawn(move || {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut chunk) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                }
                let _ = s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok");
            });
        }
    });
    addr
}

fn request(proxy: SocketAddr, port: u16, auth: &str) -> Duration {
    let started = Instant::now();
    let mut s = TcpStream::connect(proxy).unwrap();
    s.set_nodelay(true).unwrap();
    let head = format!(
        "POST http://api.test:{port}/v1/chat HTTP/1.1\r\nHost: api.test:{port}\r\nAuthorization: Bearer {auth}\r\nContent-Length: 2\r\n\r\nhi"
    );
    s.write_all(head.as_bytes()).unwrap();
    let mut response = Vec::new();
    s.read_to_end(&mut response).unwrap();
    assert!(response.starts_with(b"HTTP/1.1 200"), "{response:?}");
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
        .unwrap_or(2000);
    let server = http_server();
    let placeholder = format!("{MARKER}{}", "0123456789abcdef".repeat(2));
    let config = EgressConfig {
        resolve: BTreeMap::from([("api.test".to_string(), IpAddr::V4(SERVER_IP))]),
        exempt_cidrs: vec!["127.0.0.2/32".parse().unwrap()],
        max_connections: 64,
        max_bytes: u64::MAX / 2,
        ..EgressConfig::default()
    };
    let rules = vec![DestinationRule {
        host_pattern: "api.test".into(),
        ports: vec![server.port()],
    }];
    let injection = Injection {
        name: "api".into(),
        placeholder: placeholder.clone(),
        value: "sk-bench-value".into(),
        hosts: vec!["api.test".into()],
        placement: Placement::Header {
            name: "Authorization".into(),
            format: "Bearer {}".into(),
        },
        methods: vec!["POST".into()],
        path_prefixes: vec!["/v1/".into()],
        revoke: vec![],
    };
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let listeners = ProxyListeners {
        http: listener,
        socks: None,
        dns: None,
        transparent: Vec::new(),
    };
    let handle = start_proxy_with_secrets(config, rules, listeners, vec![injection]).unwrap();
    let proxy = handle.http_addr();
    for _ in 0..100 {
        request(proxy, server.port(), "warm-up");
        request(proxy, server.port(), &placeholder);
    }
    let (mut plain, mut injected) = (Vec::new(), Vec::new());
    for _ in 0..iterations {
        plain.push(request(proxy, server.port(), "sk-ordinary-value"));
        injected.push(request(proxy, server.port(), &placeholder));
    }
    let (plain, injected) = (median_us(plain), median_us(injected));
    println!(
        "{{\"iterations\": {iterations}, \"plain_request_median_us\": {plain:.1}, \"injected_request_median_us\": {injected:.1}, \"added_us\": {:.1}}}",
        injected - plain
    );
    drop(handle);
}
