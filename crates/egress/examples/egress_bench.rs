//! Egress proxy benchmark: per-connection overhead and tunnel throughput on loopback,
//! direct vs through the proxy, measured side by side in one run. Prints JSON.
//!
//! `cargo run -p airlock-egress --release --example egress_bench [-- ITERATIONS MIB]`

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::thread;
use std::time::{Duration, Instant};

use airlock_egress::{start_proxy, DestinationRule, EgressConfig};

const SERVER_IP: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 2);
const CONNECT_OK: &[u8] = b"HTTP/1.1 200 Connection established\r\n\r\n";

/// 1-byte echo per connection.
fn echo_server() -> SocketAddr {
    let l = TcpListener::bind((SERVER_IP, 0)).unwrap();
    let addr = l.local_addr().unwrap();
    thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { continue };
            let _ = s.set_nodelay(true);
            thread::spawn(move || {
                let mut buf = [0u8; 4096];
                while let Ok(n) = s.read(&mut buf) {
                    if n == 0 || s.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
            });
        }
    });
    addr
}

/// Reads until EOF, then answers with the byte count (8 bytes, big endian).
fn sink_server() -> SocketAddr {
    let l = TcpListener::bind((SERVER_IP, 0)).unwrap();
    let addr = l.local_addr().unwrap();
    thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { continue };
            thread::spawn(move || {
                let mut buf = vec![0u8; 1 << 20];
                let mut total: u64 = 0;
                while let Ok(n) = s.read(&mut buf) {
                    if n == 0 {
                        break;
                    }
                    total += n as u64;
                }
                let _ = s.write_all(&total.to_be_bytes());
            });
        }
    });
    addr
}

fn open(proxy: Option<SocketAddr>, target: SocketAddr, name: &str) -> TcpStream {
    match proxy {
        None => {
            let s = TcpStream::connect(target).unwrap();
            s.set_nodelay(true).unwrap();
            s
        }
        Some(p) => {
            let mut s = TcpStream::connect(p).unwrap();
            s.set_nodelay(true).unwrap();
            write!(
                s,
                "CONNECT {name}:{} HTTP/1.1\r\nHost: {name}:{}\r\n\r\n",
                target.port(),
                target.port()
            )
            .unwrap();
            let mut head = [0u8; CONNECT_OK.len()];
            s.read_exact(&mut head).unwrap();
            assert_eq!(&head[..], CONNECT_OK, "proxy refused the benchmark tunnel");
            s
        }
    }
}

fn one_connection(proxy: Option<SocketAddr>, target: SocketAddr) -> Duration {
    let start = Instant::now();
    let mut s = open(proxy, target, "bench.test");
    s.write_all(b"x").unwrap();
    let mut b = [0u8; 1];
    s.read_exact(&mut b).unwrap();
    let elapsed = start.elapsed();
    drop(s);
    elapsed
}

fn median_ms(mut samples: Vec<Duration>) -> f64 {
    samples.sort();
    samples[samples.len() / 2].as_secs_f64() * 1000.0
}

fn transfer(proxy: Option<SocketAddr>, target: SocketAddr, bytes: u64) -> f64 {
    let mut s = open(proxy, target, "bench.test");
    let chunk = vec![0x5au8; 1 << 20];
    let start = Instant::now();
    let mut sent = 0u64;
    while sent < bytes {
        let n = chunk.len().min((bytes - sent) as usize);
        s.write_all(&chunk[..n]).unwrap();
        sent += n as u64;
    }
    s.shutdown(std::net::Shutdown::Write).unwrap();
    let mut ack = [0u8; 8];
    s.read_exact(&mut ack).unwrap();
    let secs = start.elapsed().as_secs_f64();
    assert_eq!(
        u64::from_be_bytes(ack),
        bytes,
        "sink saw a different byte count"
    );
    bytes as f64 / secs / (1024.0 * 1024.0)
}

fn main() {
    let mut args = std::env::args().skip(1);
    let iterations: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(1000);
    let mib: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(256);
    let bytes = mib * 1024 * 1024;

    let echo = echo_server();
    let sink = sink_server();
    let mut resolve = BTreeMap::new();
    resolve.insert("bench.test".to_string(), IpAddr::V4(SERVER_IP));
    let rules = vec![DestinationRule {
        host_pattern: "bench.test".into(),
        ports: vec![echo.port(), sink.port()],
    }];
    let config = EgressConfig {
        resolve,
        exempt_cidrs: vec!["127.0.0.2/32".parse().unwrap()],
        max_connections: 64,
        max_bytes: u64::MAX,
        // The benchmark's payload is raw bytes, neither TLS nor HTTP.
        opaque_tunnels: rules.clone(),
        ..EgressConfig::default()
    };
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let handle = start_proxy(config, rules, listener, None).unwrap();
    let proxy = Some(handle.http_addr());

    // Warm up both paths, then alternate blocks so drift affects both equally.
    for _ in 0..50 {
        one_connection(None, echo);
        one_connection(proxy, echo);
    }
    let (mut direct, mut proxied) = (Vec::new(), Vec::new());
    let block = 50;
    for _ in 0..iterations.div_ceil(block) {
        for _ in 0..block {
            direct.push(one_connection(None, echo));
        }
        for _ in 0..block {
            proxied.push(one_connection(proxy, echo));
        }
    }
    let direct_ms = median_ms(direct);
    let proxied_ms = median_ms(proxied);

    let runs = 3;
    let mut direct_tp = Vec::new();
    let mut proxied_tp = Vec::new();
    for _ in 0..runs {
        direct_tp.push(transfer(None, sink, bytes));
        proxied_tp.push(transfer(proxy, sink, bytes));
    }
    let med = |mut v: Vec<f64>| {
        v.sort_by(|a, b| a.partial_cmp(b).unwrap());
        v[v.len() / 2]
    };
    let direct_mibs = med(direct_tp);
    let proxied_mibs = med(proxied_tp);

    let records = handle.shutdown();
    let denied = records
        .iter()
        .filter(|r| r.decision != airlock_egress::Decision::Allowed)
        .count();
    let report = serde_json::json!({
        "connect_echo": {
            "iterations": iterations.div_ceil(block) * block,
            "direct_median_ms": round(direct_ms),
            "proxy_median_ms": round(proxied_ms),
            "added_ms": round(proxied_ms - direct_ms),
            "target_added_ms_below": 1.0,
        },
        "throughput": {
            "bytes": bytes,
            "runs": runs,
            "direct_mib_per_s": round(direct_mibs),
            "proxy_mib_per_s": round(proxied_mibs),
            "ratio": round(proxied_mibs / direct_mibs),
            "target_ratio_at_least": 0.5,
        },
        "proxy_records": records.len(),
        "proxy_denied": denied,
    });
    println!("{}", serde_json::to_string_pretty(&report).unwrap());
}

fn round(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}
