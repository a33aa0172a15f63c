//! End-to-end tests over real loopback sockets. Upstream test servers listen on 127.0.0.2,
//! which the tests exempt from the private-address rule and name `api.test` via `resolve`.

mod common;
use common::{read_to_end, rule, IO_TIMEOUT, UPSTREAM_IP};

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::Duration;

use airlock_egress::{
    reason, sni, start_proxy, ConnectionRecord, Decision, DestinationRule, EgressConfig,
    ProxyHandle,
};

fn base_config() -> EgressConfig {
    let mut resolve = BTreeMap::new();
    resolve.insert("api.test".to_string(), IpAddr::V4(UPSTREAM_IP));
    resolve.insert("loop.test".to_string(), "127.0.0.1".parse().unwrap());
    resolve.insert("ten.test".to_string(), "10.0.0.1".parse().unwrap());
    resolve.insert("meta.test".to_string(), "169.254.169.254".parse().unwrap());
    EgressConfig {
        resolve,
        exempt_cidrs: vec!["127.0.0.2/32".parse().unwrap()],
        ..EgressConfig::default()
    }
}

/// `config` with every rule's destination also listed in `opaque_tunnels`: for tests
/// that relay bytes which are neither TLS nor HTTP (echo payloads, a server-first line
/// protocol), which the operator must allow per destination.
fn opaque(config: EgressConfig, rules: &[DestinationRule]) -> EgressConfig {
    EgressConfig {
        opaque_tunnels: rules.to_vec(),
        ..config
    }
}

fn start(config: EgressConfig, rules: Vec<DestinationRule>) -> ProxyHandle {
    let http = TcpListener::bind("127.0.0.1:0").unwrap();
    let socks = TcpListener::bind("127.0.0.1:0").unwrap();
    start_proxy(config, rules, http, Some(socks)).unwrap()
}

/// Echo server on 127.0.0.2; counts accepted connections.
fn echo_server() -> (u16, Arc<AtomicUsize>) {
    echo_server_on(UPSTREAM_IP, b"")
}

fn echo_server_on(ip: Ipv4Addr, tag: &'static [u8]) -> (u16, Arc<AtomicUsize>) {
    let listener = TcpListener::bind((ip, 0)).unwrap();
    let port = listener.local_addr().unwrap().port();
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = accepted.clone();
    thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            count.fetch_add(1, Ordering::SeqCst);
            thread::spawn(move || {
                let mut buf = vec![0u8; 64 * 1024];
                let mut first = true;
                loop {
                    match stream.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => {
                            if first && !tag.is_empty() {
                                let _ = stream.write_all(tag);
                            }
                            first = false;
                            if stream.write_all(&buf[..n]).is_err() {
                                break;
                            }
                        }
                    }
                }
            });
        }
    });
    (port, accepted)
}

/// One-shot HTTP origin on 127.0.0.2 that reports the request head it received.
fn http_origin() -> (u16, mpsc::Receiver<String>) {
    let listener = TcpListener::bind((UPSTREAM_IP, 0)).unwrap();
    let port = listener.local_addr().unwrap().port();
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let tx = tx.clone();
            thread::spawn(move || {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut chunk) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                }
                let head = String::from_utf8_lossy(&buf).into_owned();
                let body = "hello from origin\n";
                let _ = write!(
                    stream,
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nContent-Type: text/plain\r\n\r\n{body}",
                    body.len()
                );
                let _ = tx.send(head);
            });
        }
    });
    (port, rx)
}

fn connect(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
    s.set_write_timeout(Some(IO_TIMEOUT)).unwrap();
    s
}

/// Read an HTTP response head (up to the blank line) without consuming tunnel bytes.
fn read_head(s: &mut TcpStream) -> String {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match s.read(&mut byte) {
            Ok(1) => head.push(byte[0]),
            _ => break,
        }
    }
    String::from_utf8_lossy(&head).into_owned()
}

fn http_connect(proxy: &ProxyHandle, target: &str) -> (TcpStream, String) {
    let mut s = connect(proxy.http_addr());
    write!(s, "CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n").unwrap();
    let head = read_head(&mut s);
    (s, head)
}

/// Assert a complete refusal response carries `code` in header and body.
fn assert_refused(response: &str, status: u16, code: &str) {
    assert!(
        response.starts_with(&format!("HTTP/1.1 {status} ")),
        "expected {status}: {response:?}"
    );
    assert!(
        response.contains(&format!("\r\nX-Airlock-Reason: {code}\r\n")),
        "{response:?}"
    );
    assert!(
        response.contains("\r\nContent-Type: text/plain\r\n"),
        "{response:?}"
    );
    assert!(
        response.ends_with(&format!("\r\n\r\n{code}\n")),
        "{response:?}"
    );
}

fn connect_refused(proxy: &ProxyHandle, target: &str, code: &str) {
    let (mut s, head) = http_connect(proxy, target);
    let rest = read_to_end(&mut s);
    let status = if code == reason::UPSTREAM_FAILED || code == reason::RESOLVE_FAILED {
        502
    } else {
        403
    };
    assert_refused(&format!("{head}{rest}"), status, code);
}

fn only_record<'a>(records: &'a [ConnectionRecord], host: &str) -> &'a ConnectionRecord {
    let matching: Vec<&ConnectionRecord> = records.iter().filter(|r| r.host == host).collect();
    assert_eq!(matching.len(), 1, "records for {host}: {records:#?}");
    matching[0]
}

fn assert_denied(record: &ConnectionRecord, code: &str) {
    assert_eq!(record.decision, Decision::Denied, "{record:?}");
    assert_eq!(record.reason, Some(code), "{record:?}");
}

fn socks_connect_domain(proxy: &ProxyHandle, host: &str, port: u16) -> (TcpStream, u8) {
    let mut s = connect(proxy.socks_addr().unwrap());
    s.write_all(&[0x05, 0x01, 0x00]).unwrap();
    let mut method = [0u8; 2];
    s.read_exact(&mut method).unwrap();
    assert_eq!(method, [0x05, 0x00]);
    let mut req = vec![0x05, 0x01, 0x00, 0x03, host.len() as u8];
    req.extend_from_slice(host.as_bytes());
    req.extend_from_slice(&port.to_be_bytes());
    s.write_all(&req).unwrap();
    let mut reply = [0u8; 10];
    s.read_exact(&mut reply).unwrap();
    assert_eq!(reply[0], 0x05);
    (s, reply[1])
}

#[test]
fn http_get_is_forwarded_in_origin_form_without_proxy_headers() {
    let (port, heads) = http_origin();
    let proxy = start(base_config(), vec![rule("api.test", &[port])]);
    let mut s = connect(proxy.http_addr());
    write!(
        s,
        "GET http://api.test:{port}/path?q=1 HTTP/1.1\r\nHost: api.test:{port}\r\nProxy-Authorization: Basic eDp5\r\nProxy-Connection: keep-alive\r\nAccept: */*\r\n\r\n"
    )
    .unwrap();
    let response = read_to_end(&mut s);
    assert!(response.starts_with("HTTP/1.1 200 OK"), "{response}");
    assert!(response.ends_with("hello from origin\n"), "{response}");
    let head = heads.recv_timeout(IO_TIMEOUT).unwrap();
    assert!(head.starts_with("GET /path?q=1 HTTP/1.1\r\n"), "{head}");
    assert!(!head.to_ascii_lowercase().contains("proxy-"), "{head}");
    assert!(head.contains("\r\nConnection: close\r\n"), "{head}");
    assert!(
        head.contains(&format!("\r\nHost: api.test:{port}\r\n")),
        "{head}"
    );

    let records = proxy.shutdown();
    let r = only_record(&records, "api.test");
    assert_eq!(r.protocol, "http");
    assert_eq!(r.decision, Decision::Allowed);
    assert_eq!(r.reason, None);
    assert_eq!(r.port, port);
    assert_eq!(r.address, Some(SocketAddr::from((UPSTREAM_IP, port))));
    assert!(r.bytes_up > 0 && r.bytes_down > 0, "{r:?}");
}

#[test]
fn http_post_with_chunked_body_is_forwarded() {
    let (port, heads) = http_origin();
    let proxy = start(base_config(), vec![rule("api.test", &[port])]);
    let mut s = connect(proxy.http_addr());
    write!(
        s,
        "POST http://api.test:{port}/up HTTP/1.1\r\nHost: api.test:{port}\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
    )
    .unwrap();
    let response = read_to_end(&mut s);
    assert!(response.starts_with("HTTP/1.1 200 OK"), "{response}");
    let head = heads.recv_timeout(IO_TIMEOUT).unwrap();
    assert!(head.starts_with("POST /up HTTP/1.1\r\n"), "{head}");
    let records = proxy.shutdown();
    assert_eq!(
        only_record(&records, "api.test").decision,
        Decision::Allowed
    );
}

#[test]
fn connect_tunnel_echoes_bytes_and_accepts_matching_sni() {
    let (port, _) = echo_server();
    let rules = vec![rule("api.test", &[port])];
    let proxy = start(opaque(base_config(), &rules), rules);

    let (mut s, head) = http_connect(&proxy, &format!("api.test:{port}"));
    assert!(head.starts_with("HTTP/1.1 200 "), "{head}");
    s.write_all(b"ping").unwrap();
    let mut buf = [0u8; 4];
    s.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"ping");
    drop(s);

    // A ClientHello naming the CONNECT host (any case), split over two writes.
    let (mut s, head) = http_connect(&proxy, &format!("API.test:{port}"));
    assert!(head.starts_with("HTTP/1.1 200 "), "{head}");
    let hello = sni::build_client_hello(Some("Api.Test"));
    s.write_all(&hello[..20]).unwrap();
    thread::sleep(Duration::from_millis(30));
    s.write_all(&hello[20..]).unwrap();
    let mut echoed = vec![0u8; hello.len()];
    s.read_exact(&mut echoed).unwrap();
    assert_eq!(echoed, hello);
    drop(s);

    let records = proxy.shutdown();
    assert_eq!(records.len(), 2, "{records:#?}");
    for r in &records {
        assert_eq!(r.protocol, "connect");
        assert_eq!(r.host, "api.test");
        assert_eq!(r.decision, Decision::Allowed, "{r:?}");
        assert_eq!(r.reason, None);
        assert_eq!(r.address, Some(SocketAddr::from((UPSTREAM_IP, port))));
        assert_eq!(r.bytes_up, r.bytes_down);
        assert!(r.bytes_up >= 4);
    }
}

#[test]
fn connect_with_other_sni_is_cut() {
    let (port, _) = echo_server();
    let proxy = start(base_config(), vec![rule("api.test", &[port])]);
    let (mut s, head) = http_connect(&proxy, &format!("api.test:{port}"));
    assert!(head.starts_with("HTTP/1.1 200 "), "{head}");
    s.write_all(&sni::build_client_hello(Some("evil.test")))
        .unwrap();
    // Nothing may come back: the hello never reached the upstream.
    let rest = read_to_end(&mut s);
    assert_eq!(rest, "");
    let records = proxy.shutdown();
    let r = only_record(&records, "api.test");
    assert_denied(r, reason::SNI_MISMATCH);
    assert_eq!(r.bytes_up, 0);
}

#[test]
fn socks5_domain_connect_is_allowed() {
    let (port, _) = echo_server();
    let rules = vec![rule("api.test", &[port])];
    let proxy = start(opaque(base_config(), &rules), rules);
    let (mut s, code) = socks_connect_domain(&proxy, "api.test", port);
    assert_eq!(code, 0x00);
    s.write_all(b"over socks").unwrap();
    let mut buf = [0u8; 10];
    s.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"over socks");
    drop(s);
    let records = proxy.shutdown();
    let r = only_record(&records, "api.test");
    assert_eq!(r.protocol, "socks5");
    assert_eq!(r.decision, Decision::Allowed);
    assert_eq!(r.address, Some(SocketAddr::from((UPSTREAM_IP, port))));
}

#[test]
fn socks5_denials_use_ruleset_reply() {
    let (port, accepted) = echo_server();
    let proxy = start(
        base_config(),
        vec![rule("api.test", &[port]), rule("loop.test", &[port])],
    );
    let (_, code) = socks_connect_domain(&proxy, "other.test", port);
    assert_eq!(code, 0x02);
    let (_, code) = socks_connect_domain(&proxy, "loop.test", port);
    assert_eq!(code, 0x02);

    // IPv4 address type: an IP literal.
    let mut s = connect(proxy.socks_addr().unwrap());
    s.write_all(&[0x05, 0x01, 0x00]).unwrap();
    let mut m = [0u8; 2];
    s.read_exact(&mut m).unwrap();
    let mut req = vec![0x05, 0x01, 0x00, 0x01, 127, 0, 0, 2];
    req.extend_from_slice(&port.to_be_bytes());
    s.write_all(&req).unwrap();
    let mut reply = [0u8; 10];
    s.read_exact(&mut reply).unwrap();
    assert_eq!(reply[1], 0x02);

    // BIND is not supported.
    let mut s = connect(proxy.socks_addr().unwrap());
    s.write_all(&[0x05, 0x01, 0x00]).unwrap();
    s.read_exact(&mut m).unwrap();
    let mut req = vec![0x05, 0x02, 0x00, 0x03, 8];
    req.extend_from_slice(b"api.test");
    req.extend_from_slice(&port.to_be_bytes());
    s.write_all(&req).unwrap();
    s.read_exact(&mut reply).unwrap();
    assert_eq!(reply[1], 0x07);

    // Username/password only: no acceptable method.
    let mut s = connect(proxy.socks_addr().unwrap());
    s.write_all(&[0x05, 0x01, 0x02]).unwrap();
    s.read_exact(&mut m).unwrap();
    assert_eq!(m, [0x05, 0xff]);
    drop(s);

    thread::sleep(Duration::from_millis(100));
    let records = proxy.shutdown();
    assert_denied(only_record(&records, "other.test"), reason::NOT_ALLOWLISTED);
    assert_denied(only_record(&records, "loop.test"), reason::PRIVATE_ADDRESS);
    assert_denied(only_record(&records, "127.0.0.2"), reason::IP_LITERAL);
    assert_denied(only_record(&records, "api.test"), reason::BAD_REQUEST);
    assert_denied(only_record(&records, ""), reason::BAD_REQUEST);
    assert_eq!(records.len(), 5, "{records:#?}");
    assert_eq!(accepted.load(Ordering::SeqCst), 0);
}

#[test]
fn policy_denials_carry_reason_in_response_and_record() {
    let (port, accepted) = echo_server();
    let rules = vec![
        rule("api.test", &[port]),
        rule("loop.test", &[port]),
        rule("ten.test", &[port]),
        rule("meta.test", &[80]),
        rule("nowhere.test", &[port]),
        rule("127.0.0.2", &[port]),
    ];
    let proxy = start(base_config(), rules);

    connect_refused(
        &proxy,
        &format!("other.test:{port}"),
        reason::NOT_ALLOWLISTED,
    );
    connect_refused(
        &proxy,
        &format!("api.test:{}", port.wrapping_add(1)),
        reason::NOT_ALLOWLISTED,
    );
    connect_refused(
        &proxy,
        &format!("sub.api.test:{port}"),
        reason::NOT_ALLOWLISTED,
    );
    connect_refused(&proxy, &format!("127.0.0.2:{port}"), reason::IP_LITERAL);
    connect_refused(
        &proxy,
        &format!("[::ffff:127.0.0.1]:{port}"),
        reason::IP_LITERAL,
    );
    connect_refused(&proxy, &format!("2130706433:{port}"), reason::IP_LITERAL);
    connect_refused(
        &proxy,
        &format!("loop.test:{port}"),
        reason::PRIVATE_ADDRESS,
    );
    connect_refused(&proxy, &format!("ten.test:{port}"), reason::PRIVATE_ADDRESS);
    connect_refused(&proxy, "meta.test:80", reason::PRIVATE_ADDRESS);
    connect_refused(
        &proxy,
        &format!("nowhere.test:{port}"),
        reason::RESOLVE_FAILED,
    );

    // Plain HTTP: not allowlisted and IP literal too.
    let mut s = connect(proxy.http_addr());
    write!(
        s,
        "GET http://other.test/ HTTP/1.1\r\nHost: other.test\r\n\r\n"
    )
    .unwrap();
    assert_refused(&read_to_end(&mut s), 403, reason::NOT_ALLOWLISTED);
    let mut s = connect(proxy.http_addr());
    write!(
        s,
        "GET http://169.254.169.254/latest/meta-data/ HTTP/1.1\r\nHost: 169.254.169.254\r\n\r\n"
    )
    .unwrap();
    assert_refused(&read_to_end(&mut s), 403, reason::IP_LITERAL);

    thread::sleep(Duration::from_millis(50));
    let records = proxy.shutdown();
    assert_eq!(
        accepted.load(Ordering::SeqCst),
        0,
        "no denied attempt may connect"
    );
    let by = |host: &str, port_: u16| -> Vec<&ConnectionRecord> {
        records
            .iter()
            .filter(|r| r.host == host && r.port == port_)
            .collect()
    };
    assert_denied(by("other.test", port)[0], reason::NOT_ALLOWLISTED);
    assert_denied(
        by("api.test", port.wrapping_add(1))[0],
        reason::NOT_ALLOWLISTED,
    );
    assert_denied(by("sub.api.test", port)[0], reason::NOT_ALLOWLISTED);
    assert_denied(by("127.0.0.2", port)[0], reason::IP_LITERAL);
    assert_denied(by("::ffff:127.0.0.1", port)[0], reason::IP_LITERAL);
    assert_denied(by("127.0.0.1", port)[0], reason::IP_LITERAL);
    let r = by("loop.test", port)[0];
    assert_denied(r, reason::PRIVATE_ADDRESS);
    assert_eq!(r.address, Some(SocketAddr::from(([127, 0, 0, 1], port))));
    let r = by("ten.test", port)[0];
    assert_denied(r, reason::PRIVATE_ADDRESS);
    assert_eq!(r.address, Some(SocketAddr::from(([10, 0, 0, 1], port))));
    let r = by("meta.test", 80)[0];
    assert_denied(r, reason::PRIVATE_ADDRESS);
    assert_eq!(
        r.address,
        Some(SocketAddr::from(([169, 254, 169, 254], 80)))
    );
    assert_denied(by("nowhere.test", port)[0], reason::RESOLVE_FAILED);
    assert_denied(by("other.test", 80)[0], reason::NOT_ALLOWLISTED);
    assert_denied(by("169.254.169.254", 80)[0], reason::IP_LITERAL);
    assert_eq!(records.len(), 12, "{records:#?}");
    assert!(records
        .iter()
        .all(|r| r.protocol == "connect" || r.protocol == "http"));
}

#[test]
fn allowed_ip_literals_still_face_the_address_rule() {
    let (port, accepted) = echo_server();
    let config = EgressConfig {
        allow_ip_literals: true,
        ..base_config()
    };
    let rules = vec![
        rule("127.0.0.2", &[port]),
        rule("::ffff:127.0.0.1", &[port]),
        rule("127.0.0.1", &[port]),
    ];
    let proxy = start(opaque(config, &rules), rules);
    connect_refused(
        &proxy,
        &format!("[::ffff:127.0.0.1]:{port}"),
        reason::PRIVATE_ADDRESS,
    );
    connect_refused(&proxy, &format!("127.1:{port}"), reason::PRIVATE_ADDRESS);
    let (mut s, head) = http_connect(&proxy, &format!("127.0.0.2:{port}"));
    assert!(head.starts_with("HTTP/1.1 200 "), "{head}");
    s.write_all(b"x").unwrap();
    let mut b = [0u8; 1];
    s.read_exact(&mut b).unwrap();
    drop(s);
    let records = proxy.shutdown();
    assert_denied(
        only_record(&records, "::ffff:127.0.0.1"),
        reason::PRIVATE_ADDRESS,
    );
    assert_denied(only_record(&records, "127.0.0.1"), reason::PRIVATE_ADDRESS);
    assert_eq!(
        only_record(&records, "127.0.0.2").decision,
        Decision::Allowed
    );
    assert_eq!(accepted.load(Ordering::SeqCst), 1);
}

#[test]
fn host_header_must_match_target() {
    let (port, heads) = http_origin();
    let proxy = start(base_config(), vec![rule("api.test", &[port])]);
    let mut s = connect(proxy.http_addr());
    write!(
        s,
        "GET http://api.test:{port}/ HTTP/1.1\r\nHost: other.test\r\n\r\n"
    )
    .unwrap();
    assert_refused(&read_to_end(&mut s), 403, reason::HOST_MISMATCH);
    assert!(heads.recv_timeout(Duration::from_millis(200)).is_err());
    let records = proxy.shutdown();
    assert_denied(only_record(&records, "api.test"), reason::HOST_MISMATCH);
}

#[test]
fn upstream_failure_is_502_without_detail() {
    // A port on 127.0.0.2 with nothing listening.
    let port = {
        let l = TcpListener::bind((UPSTREAM_IP, 0)).unwrap();
        l.local_addr().unwrap().port()
    };
    let proxy = start(base_config(), vec![rule("api.test", &[port])]);
    connect_refused(&proxy, &format!("api.test:{port}"), reason::UPSTREAM_FAILED);
    let records = proxy.shutdown();
    let r = only_record(&records, "api.test");
    assert_denied(r, reason::UPSTREAM_FAILED);
    assert_eq!(r.address, Some(SocketAddr::from((UPSTREAM_IP, port))));
}

#[test]
fn connection_limit() {
    let (port, _) = echo_server();
    let config = EgressConfig {
        max_connections: 2,
        ..base_config()
    };
    let proxy = start(config, vec![rule("api.test", &[port])]);
    let target = format!("api.test:{port}");
    let (a, head_a) = http_connect(&proxy, &target);
    let (b, head_b) = http_connect(&proxy, &target);
    assert!(head_a.starts_with("HTTP/1.1 200 ") && head_b.starts_with("HTTP/1.1 200 "));
    connect_refused(&proxy, &target, reason::LIMIT);
    // SOCKS shares the same per-cell budget.
    let (_, code) = socks_connect_domain(&proxy, "api.test", port);
    assert_eq!(code, 0x02);
    drop((a, b));
    thread::sleep(Duration::from_millis(100));
    // Slots are released when tunnels end.
    let (_c, head_c) = http_connect(&proxy, &target);
    assert!(head_c.starts_with("HTTP/1.1 200 "), "{head_c}");
    let records = proxy.shutdown();
    let limited: Vec<_> = records
        .iter()
        .filter(|r| r.reason == Some(reason::LIMIT))
        .collect();
    assert_eq!(limited.len(), 2, "{records:#?}");
    assert!(limited
        .iter()
        .all(|r| r.decision == Decision::Denied && r.host == "api.test"));
    assert_eq!(records.len(), 5);
}

#[test]
fn byte_limit_cuts_open_tunnel_and_refuses_new_ones() {
    let (port, _) = echo_server();
    let config = EgressConfig {
        max_bytes: 10_000,
        ..base_config()
    };
    let rules = vec![rule("api.test", &[port])];
    let proxy = start(opaque(config, &rules), rules);
    let target = format!("api.test:{port}");
    let (mut s, head) = http_connect(&proxy, &target);
    assert!(head.starts_with("HTTP/1.1 200 "));
    let chunk = [7u8; 1000];
    let mut echoed = 0usize;
    let mut buf = [0u8; 4096];
    for _ in 0..20 {
        if s.write_all(&chunk).is_err() {
            break;
        }
        let mut got = 0;
        while got < chunk.len() {
            match s.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => got += n,
            }
        }
        echoed += got;
        if got < chunk.len() {
            break;
        }
    }
    assert!(echoed < 10_000, "echoed {echoed}");
    connect_refused(&proxy, &target, reason::LIMIT);
    let records = proxy.shutdown();
    assert_eq!(records.len(), 2, "{records:#?}");
    assert!(
        records.iter().all(|r| r.reason == Some(reason::LIMIT)),
        "{records:#?}"
    );
    let total: u64 = records.iter().map(|r| r.bytes_up + r.bytes_down).sum();
    assert!(total <= 10_000, "{total}");
}

#[test]
fn idle_tunnel_is_closed() {
    let (port, _) = echo_server();
    let config = EgressConfig {
        idle_timeout_ms: 200,
        ..base_config()
    };
    let proxy = start(config, vec![rule("api.test", &[port])]);
    let (mut s, head) = http_connect(&proxy, &format!("api.test:{port}"));
    assert!(head.starts_with("HTTP/1.1 200 "));
    let started = std::time::Instant::now();
    assert_eq!(read_to_end(&mut s), "");
    assert!(started.elapsed() < Duration::from_secs(3));
    let records = proxy.shutdown();
    let r = only_record(&records, "api.test");
    assert_eq!(r.reason, Some(reason::LIMIT));
}

#[test]
fn shutdown_closes_open_tunnels_and_returns_records() {
    let (port, _) = echo_server();
    let proxy = start(base_config(), vec![rule("api.test", &[port])]);
    let (mut s, head) = http_connect(&proxy, &format!("api.test:{port}"));
    assert!(head.starts_with("HTTP/1.1 200 "));
    // Also an idle client that never sends a request.
    let _idle = connect(proxy.http_addr());
    thread::sleep(Duration::from_millis(50));
    assert!(proxy.records_so_far().is_empty());
    let started = std::time::Instant::now();
    let records = proxy.shutdown();
    assert!(started.elapsed() < Duration::from_secs(2));
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].decision, Decision::Allowed);
    assert_eq!(read_to_end(&mut s), "");
}

/// Minimal DNS responder: answers A queries for `rebind.test` with 127.0.0.2 the first
/// time and 127.0.0.1 afterwards (TTL 0), AAAA with no answers.
fn rebinding_dns() -> (SocketAddr, Arc<AtomicUsize>) {
    let sock = UdpSocket::bind("127.0.0.3:0").unwrap();
    let addr = sock.local_addr().unwrap();
    let a_queries = Arc::new(AtomicUsize::new(0));
    let count = a_queries.clone();
    thread::spawn(move || {
        let mut buf = [0u8; 1500];
        loop {
            let Ok((n, peer)) = sock.recv_from(&mut buf) else {
                return;
            };
            let q = &buf[..n];
            if n < 12 {
                continue;
            }
            // Question: walk the name.
            let mut i = 12;
            while i < n && q[i] != 0 {
                i += 1 + q[i] as usize;
            }
            let qend = i + 5;
            if qend > n {
                continue;
            }
            let qtype = u16::from_be_bytes([q[i + 1], q[i + 2]]);
            let mut resp = Vec::new();
            resp.extend_from_slice(&q[0..2]);
            resp.extend_from_slice(&[0x81, 0x80]); // response, RD, RA, NOERROR
            resp.extend_from_slice(&[0, 1]); // QDCOUNT
            let answers: u16 = if qtype == 1 { 1 } else { 0 };
            resp.extend_from_slice(&answers.to_be_bytes());
            resp.extend_from_slice(&[0, 0, 0, 0]);
            resp.extend_from_slice(&q[12..qend]);
            if qtype == 1 {
                let nth = count.fetch_add(1, Ordering::SeqCst);
                let ip = if nth == 0 {
                    [127, 0, 0, 2]
                } else {
                    [127, 0, 0, 1]
                };
                resp.extend_from_slice(&[0xc0, 0x0c, 0, 1, 0, 1, 0, 0, 0, 0, 0, 4]);
                resp.extend_from_slice(&ip);
            }
            let _ = sock.send_to(&resp, peer);
        }
    });
    (addr, a_queries)
}

#[test]
fn connect_goes_to_the_checked_address_despite_rebinding() {
    // The same port on 127.0.0.2 (checked, exempt) and 127.0.0.1 (what the name rebinds
    // to). Only the first may ever see a connection.
    let (port, good) = echo_server_on(UPSTREAM_IP, b"two:");
    let bad_listener = TcpListener::bind((Ipv4Addr::LOCALHOST, port));
    let bad_hits = Arc::new(AtomicUsize::new(0));
    if let Ok(l) = bad_listener {
        let hits = bad_hits.clone();
        thread::spawn(move || {
            for s in l.incoming() {
                if s.is_ok() {
                    hits.fetch_add(1, Ordering::SeqCst);
                }
            }
        });
    }
    let (dns, a_queries) = rebinding_dns();
    let config = EgressConfig {
        upstream_resolvers: vec![dns],
        ..base_config()
    };
    let rules = vec![rule("rebind.test", &[port])];
    let proxy = start(opaque(config, &rules), rules);

    let (mut s, head) = http_connect(&proxy, &format!("rebind.test:{port}"));
    assert!(head.starts_with("HTTP/1.1 200 "), "{head}");
    s.write_all(b"hi").unwrap();
    let mut buf = [0u8; 6];
    s.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"two:hi");
    drop(s);
    assert_eq!(a_queries.load(Ordering::SeqCst), 1, "resolved exactly once");

    // The next lookup rebinds to loopback and is refused before any connect.
    connect_refused(
        &proxy,
        &format!("rebind.test:{port}"),
        reason::PRIVATE_ADDRESS,
    );
    let records = proxy.shutdown();
    assert_eq!(good.load(Ordering::SeqCst), 1);
    assert_eq!(bad_hits.load(Ordering::SeqCst), 0);
    let allowed: Vec<_> = records
        .iter()
        .filter(|r| r.decision == Decision::Allowed)
        .collect();
    assert_eq!(allowed.len(), 1);
    assert_eq!(
        allowed[0].address,
        Some(SocketAddr::from((UPSTREAM_IP, port)))
    );
    let denied: Vec<_> = records
        .iter()
        .filter(|r| r.decision == Decision::Denied)
        .collect();
    assert_eq!(denied.len(), 1);
    assert_eq!(denied[0].reason, Some(reason::PRIVATE_ADDRESS));
    assert_eq!(
        denied[0].address,
        Some(SocketAddr::from(([127, 0, 0, 1], port)))
    );
}

#[test]
fn chained_through_upstream_proxy() {
    let (echo_port, _) = echo_server();
    // A fake corporate proxy on 127.0.0.2: accepts one CONNECT, reports the target line,
    // and tunnels to the echo server.
    let upstream = TcpListener::bind((UPSTREAM_IP, 0)).unwrap();
    let upstream_addr = upstream.local_addr().unwrap();
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let (mut c, _) = upstream.accept().unwrap();
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            c.read_exact(&mut byte).unwrap();
            head.push(byte[0]);
        }
        tx.send(String::from_utf8(head).unwrap()).unwrap();
        let mut up = TcpStream::connect((UPSTREAM_IP, echo_port)).unwrap();
        c.write_all(b"HTTP/1.1 200 OK\r\n\r\n").unwrap();
        let mut c2 = c.try_clone().unwrap();
        let mut up2 = up.try_clone().unwrap();
        thread::spawn(move || std::io::copy(&mut c2, &mut up2));
        let _ = std::io::copy(&mut up, &mut c);
    });
    let mut config = base_config();
    config.resolve.clear();
    config.upstream_proxy = Some(format!("http://{upstream_addr}"));
    let rules = vec![rule("far.test", &[443])];
    let proxy = start(opaque(config, &rules), rules);
    let (mut s, head) = http_connect(&proxy, "far.test:443");
    assert!(head.starts_with("HTTP/1.1 200 "), "{head}");
    let line = rx.recv_timeout(IO_TIMEOUT).unwrap();
    assert!(
        line.starts_with("CONNECT far.test:443 HTTP/1.1\r\n"),
        "{line}"
    );
    s.write_all(b"abc").unwrap();
    let mut buf = [0u8; 3];
    s.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"abc");
    drop(s);
    let records = proxy.shutdown();
    let r = only_record(&records, "far.test");
    assert_eq!(r.decision, Decision::Allowed);
    assert_eq!(r.address, None);
}

#[test]
fn config_parses_from_toml_with_defaults() {
    let config: EgressConfig = toml::from_str(
        r#"
        resolve = { "api.test" = "127.0.0.2" }
        exempt_cidrs = ["127.0.0.2/32"]
        "#,
    )
    .unwrap();
    assert_eq!(config.max_connections, 32);
    assert_eq!(config.max_bytes, 256 * 1024 * 1024);
    assert_eq!(config.idle_timeout_ms, 30_000);
    assert_eq!(config.connect_timeout_ms, 10_000);
    assert!(!config.allow_ip_literals);
    assert!(toml::from_str::<EgressConfig>("bogus = 1").is_err());
}

#[test]
fn records_serialize_with_stable_field_names() {
    let proxy = start(base_config(), vec![]);
    connect_refused(&proxy, "x.test:443", reason::NOT_ALLOWLISTED);
    let records = proxy.shutdown();
    let json = serde_json::to_value(&records[0]).unwrap();
    assert_eq!(json["decision"], "denied");
    assert_eq!(json["reason"], "egress.not_allowlisted");
    assert_eq!(json["protocol"], "connect");
    assert_eq!(json["host"], "x.test");
    assert_eq!(json["port"], 443);
}

#[test]
fn server_first_protocols_work_through_tunnels() {
    // The upstream greets first (SMTP/SSH style); the client says nothing until it has
    // read the banner, so the SNI wait must not block the downstream direction.
    let listener = TcpListener::bind((UPSTREAM_IP, 0)).unwrap();
    let port = listener.local_addr().unwrap().port();
    thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        s.write_all(b"220 ready\r\n").unwrap();
        let mut buf = [0u8; 6];
        s.read_exact(&mut buf).unwrap();
        s.write_all(b"221 bye\r\n").unwrap();
    });
    let rules = vec![rule("api.test", &[port])];
    let proxy = start(opaque(base_config(), &rules), rules);
    let (mut s, code) = socks_connect_domain(&proxy, "api.test", port);
    assert_eq!(code, 0);
    let mut banner = [0u8; 11];
    s.read_exact(&mut banner).unwrap();
    assert_eq!(&banner, b"220 ready\r\n");
    s.write_all(b"QUIT\r\n").unwrap();
    assert_eq!(read_to_end(&mut s), "221 bye\r\n");
    let records = proxy.shutdown();
    let r = only_record(&records, "api.test");
    assert_eq!(r.decision, Decision::Allowed);
    assert_eq!((r.bytes_up, r.bytes_down), (6, 20));
}

#[test]
fn replaced_destinations_decide_new_connections_and_leave_open_ones_alone() {
    let (port, accepted) = echo_server();
    let rules = vec![rule("api.test", &[port])];
    let proxy = start(opaque(base_config(), &rules), rules.clone());
    let target = format!("api.test:{port}");

    let (mut open, head) = http_connect(&proxy, &target);
    assert!(head.starts_with("HTTP/1.1 200 "), "{head}");
    // Removed: the next connection is refused, the open tunnel still relays.
    proxy.replace_destinations(&[rule("other.test", &[port])]);
    connect_refused(&proxy, &target, reason::NOT_ALLOWLISTED);
    open.write_all(b"ping").unwrap();
    let mut buf = [0u8; 4];
    open.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"ping");
    drop(open);
    // Added back: the next connection goes through.
    proxy.replace_destinations(&rules);
    let (again, head) = http_connect(&proxy, &target);
    assert!(head.starts_with("HTTP/1.1 200 "), "{head}");
    drop(again);

    let records = proxy.shutdown();
    let allowed = records.iter().filter(|r| r.decision == Decision::Allowed);
    assert_eq!(allowed.count(), 2, "{records:#?}");
    let denied: Vec<_> = records
        .iter()
        .filter(|r| r.decision == Decision::Denied)
        .collect();
    assert_eq!(denied.len(), 1, "{records:#?}");
    assert_denied(denied[0], reason::NOT_ALLOWLISTED);
    assert_eq!(accepted.load(Ordering::SeqCst), 2);
}
