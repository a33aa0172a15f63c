//! Request smuggling through the proxy, tried with exact bytes over raw TCP. The upstream
//! on 127.0.0.2 (named `api.test`; `forbidden.test` is a name it would also answer for,
//! like a shared front end) records every byte it receives, so each test can assert what
//! the proxy let through, not only what it answered.

mod common;
use common::{read_to_end, rule, IO_TIMEOUT, UPSTREAM_IP};

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{IpAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use airlock_egress::{reason, start_proxy, ConnectionRecord, Decision, EgressConfig, ProxyHandle};

/// A complete request for another virtual host: 48 bytes, the body length the issue used.
const SMUGGLED: &str = "GET /smuggled HTTP/1.1\r\nHost: forbidden.test\r\n\r\n";

/// An upstream that logs the raw bytes of every connection and answers each request head
/// it sees with a 3-byte `200`, closing after a head that asked for `Connection: close`.
struct RawUpstream {
    port: u16,
    log: Arc<Mutex<Vec<u8>>>,
    accepted: Arc<AtomicUsize>,
    open: Arc<AtomicUsize>,
}

const ANSWER: &str = "HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nok\n";

impl RawUpstream {
    fn start() -> RawUpstream {
        let listener = TcpListener::bind((UPSTREAM_IP, 0)).unwrap();
        let up = RawUpstream {
            port: listener.local_addr().unwrap().port(),
            log: Arc::default(),
            accepted: Arc::default(),
            open: Arc::default(),
        };
        let (log, accepted, open) = (up.log.clone(), up.accepted.clone(), up.open.clone());
        thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                accepted.fetch_add(1, Ordering::SeqCst);
                open.fetch_add(1, Ordering::SeqCst);
                let (log, open) = (log.clone(), open.clone());
                thread::spawn(move || {
                    serve(stream, &log);
                    open.fetch_sub(1, Ordering::SeqCst);
                });
            }
        });
        up
    }

    /// Everything received so far, once every connection has ended (or after a bound).
    fn log(&self) -> String {
        let deadline = Instant::now() + IO_TIMEOUT;
        while self.open.load(Ordering::SeqCst) > 0 && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(10));
        }
        String::from_utf8_lossy(&self.log.lock().unwrap()).into_owned()
    }

    fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }
}

fn serve(mut stream: TcpStream, log: &Mutex<Vec<u8>>) {
    let mut seen = Vec::new();
    let mut answered = 0;
    let mut closing = false;
    let mut chunk = [0u8; 4096];
    loop {
        let n = match stream.read(&mut chunk) {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        log.lock().unwrap().extend_from_slice(&chunk[..n]);
        seen.extend_from_slice(&chunk[..n]);
        let heads = seen.windows(4).filter(|w| *w == b"\r\n\r\n").count();
        while answered < heads && !closing {
            answered += 1;
            let _ = stream.write_all(ANSWER.as_bytes());
            let text = String::from_utf8_lossy(&seen).to_ascii_lowercase();
            let head = text.split("\r\n\r\n").nth(answered - 1).unwrap_or("");
            if head.contains("\r\nconnection: close") {
                // Keep logging whatever else arrives until the proxy closes.
                closing = true;
                let _ = stream.shutdown(std::net::Shutdown::Write);
            }
        }
    }
}

fn config() -> EgressConfig {
    let mut resolve = BTreeMap::new();
    resolve.insert("api.test".to_string(), IpAddr::V4(UPSTREAM_IP));
    EgressConfig {
        resolve,
        exempt_cidrs: vec!["127.0.0.2/32".parse().unwrap()],
        ..EgressConfig::default()
    }
}

fn start(config: EgressConfig, up: &RawUpstream) -> ProxyHandle {
    let http = TcpListener::bind("127.0.0.1:0").unwrap();
    let socks = TcpListener::bind("127.0.0.1:0").unwrap();
    start_proxy(
        config,
        vec![rule("api.test", &[up.port])],
        http,
        Some(socks),
    )
    .unwrap()
}

fn connect(addr: std::net::SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
    s.set_write_timeout(Some(IO_TIMEOUT)).unwrap();
    s
}

/// Read one response head plus its `Content-Length` body.
fn read_response(s: &mut TcpStream) -> String {
    let mut got = Vec::new();
    let mut byte = [0u8; 1];
    while !got.ends_with(b"\r\n\r\n") {
        match s.read(&mut byte) {
            Ok(1) => got.push(byte[0]),
            _ => break,
        }
    }
    let head = String::from_utf8_lossy(&got).into_owned();
    let length = head
        .lines()
        .find_map(|l| l.strip_prefix("Content-Length: "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    let mut body = vec![0u8; length];
    let _ = s.read_exact(&mut body);
    head + &String::from_utf8_lossy(&body)
}

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
        response.ends_with(&format!("\r\n\r\n{code}\n")),
        "{response:?}"
    );
}

fn only_record(records: &[ConnectionRecord]) -> &ConnectionRecord {
    assert_eq!(records.len(), 1, "{records:#?}");
    &records[0]
}

fn assert_denied(records: &[ConnectionRecord], code: &str) {
    let r = only_record(records);
    assert_eq!(r.decision, Decision::Denied, "{r:?}");
    assert_eq!(r.reason, Some(code), "{r:?}");
}

fn assert_nothing_smuggled(log: &str) {
    assert!(!log.contains("/smuggled"), "upstream got: {log:?}");
    assert!(!log.contains("forbidden.test"), "upstream got: {log:?}");
}

/// Open a CONNECT tunnel to api.test on the upstream's port.
fn http_tunnel(proxy: &ProxyHandle, port: u16) -> TcpStream {
    let mut s = connect(proxy.http_addr());
    write!(
        s,
        "CONNECT api.test:{port} HTTP/1.1\r\nHost: api.test:{port}\r\n\r\n"
    )
    .unwrap();
    let head = read_response(&mut s);
    assert!(head.starts_with("HTTP/1.1 200 "), "{head}");
    s
}

/// Open a SOCKS5 tunnel to api.test on the upstream's port.
fn socks_tunnel(proxy: &ProxyHandle, port: u16) -> TcpStream {
    let mut s = connect(proxy.socks_addr().unwrap());
    s.write_all(&[0x05, 0x01, 0x00]).unwrap();
    let mut method = [0u8; 2];
    s.read_exact(&mut method).unwrap();
    let mut req = vec![0x05, 0x01, 0x00, 0x03, 8];
    req.extend_from_slice(b"api.test");
    req.extend_from_slice(&port.to_be_bytes());
    s.write_all(&req).unwrap();
    let mut reply = [0u8; 10];
    s.read_exact(&mut reply).unwrap();
    assert_eq!(reply[1], 0x00, "SOCKS5 connect refused");
    s
}

/// Send `request` (built for the upstream's port) to the forward proxy and expect a 400
/// `code` refusal before any upstream connection, with nothing of it logged upstream.
fn forward_refused_before_upstream(request: impl Fn(u16) -> String, code: &str) {
    let up = RawUpstream::start();
    let proxy = start(config(), &up);
    let mut s = connect(proxy.http_addr());
    s.write_all(request(up.port).as_bytes()).unwrap();
    assert_refused(&read_to_end(&mut s), 400, code);
    let records = proxy.shutdown();
    assert_denied(&records, code);
    assert_eq!(up.accepted(), 0, "upstream got: {:?}", up.log());
}

fn post(port: u16, fields: &str, body: &str) -> String {
    format!("POST http://api.test:{port}/a HTTP/1.1\r\nHost: api.test:{port}\r\n{fields}\r\n{body}")
}

// --- plaintext inside tunnels (item 12) ---

#[test]
fn connect_tunnel_refuses_plain_http_for_another_host() {
    let up = RawUpstream::start();
    let proxy = start(config(), &up);
    let mut s = http_tunnel(&proxy, up.port);
    s.write_all(b"GET /x HTTP/1.1\r\nHost: forbidden.test\r\n\r\n")
        .unwrap();
    assert_refused(&read_to_end(&mut s), 403, reason::HOST_MISMATCH);
    let records = proxy.shutdown();
    assert_denied(&records, reason::HOST_MISMATCH);
    assert_eq!(records[0].protocol, "connect");
    assert_eq!(records[0].bytes_up, 0);
    assert_eq!(up.log(), "");
}

#[test]
fn socks5_tunnel_refuses_plain_http_for_another_host() {
    let up = RawUpstream::start();
    let proxy = start(config(), &up);
    let mut s = socks_tunnel(&proxy, up.port);
    s.write_all(b"GET /x HTTP/1.1\r\nHost: forbidden.test\r\n\r\n")
        .unwrap();
    assert_refused(&read_to_end(&mut s), 403, reason::HOST_MISMATCH);
    let records = proxy.shutdown();
    assert_denied(&records, reason::HOST_MISMATCH);
    assert_eq!(records[0].protocol, "socks5");
    assert_eq!(up.log(), "");
}

#[test]
fn tunnel_refuses_an_absolute_target_naming_another_host() {
    let up = RawUpstream::start();
    let proxy = start(config(), &up);
    let mut s = http_tunnel(&proxy, up.port);
    let port = up.port;
    write!(
        s,
        "GET http://forbidden.test/ HTTP/1.1\r\nHost: api.test:{port}\r\n\r\n"
    )
    .unwrap();
    assert_refused(&read_to_end(&mut s), 403, reason::HOST_MISMATCH);
    assert_denied(&proxy.shutdown(), reason::HOST_MISMATCH);
    assert_eq!(up.log(), "");
}

#[test]
fn tunnel_carries_plain_http_for_its_own_host_with_keep_alive() {
    let up = RawUpstream::start();
    let proxy = start(config(), &up);
    let port = up.port;
    let mut s = socks_tunnel(&proxy, port);
    for path in ["/one", "/two"] {
        write!(s, "GET {path} HTTP/1.1\r\nHost: api.test:{port}\r\n\r\n").unwrap();
        assert_eq!(read_response(&mut s), ANSWER);
    }
    // Pipelined, with a chunked body in between: each forwarded once checked.
    write!(
        s,
        "POST /three HTTP/1.1\r\nHost: api.test:{port}\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\nGET /four HTTP/1.1\r\nHost: api.test:{port}\r\n\r\n"
    )
    .unwrap();
    assert_eq!(read_response(&mut s), ANSWER);
    assert_eq!(read_response(&mut s), ANSWER);
    drop(s);
    let records = proxy.shutdown();
    let r = only_record(&records);
    assert_eq!(r.decision, Decision::Allowed, "{r:?}");
    assert_eq!(r.reason, None);
    // Each request reached the upstream exactly as sent (already canonical), in order.
    let get = |path: &str| format!("GET {path} HTTP/1.1\r\nHost: api.test:{port}\r\n\r\n");
    let expected = format!(
        "{}{}POST /three HTTP/1.1\r\nHost: api.test:{port}\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n{}",
        get("/one"),
        get("/two"),
        get("/four")
    );
    assert_eq!(up.log(), expected);
}

#[test]
fn pipelined_request_for_another_host_in_a_tunnel_never_reaches_upstream() {
    let up = RawUpstream::start();
    let proxy = start(config(), &up);
    let port = up.port;
    let mut s = http_tunnel(&proxy, port);
    write!(
        s,
        "GET /first HTTP/1.1\r\nHost: api.test:{port}\r\n\r\n{SMUGGLED}"
    )
    .unwrap();
    let _ = read_to_end(&mut s);
    let records = proxy.shutdown();
    assert_denied(&records, reason::HOST_MISMATCH);
    assert_nothing_smuggled(&up.log());
}

#[test]
fn second_request_for_another_host_after_a_served_one_ends_the_tunnel() {
    let up = RawUpstream::start();
    let proxy = start(config(), &up);
    let port = up.port;
    let mut s = http_tunnel(&proxy, port);
    write!(s, "GET /first HTTP/1.1\r\nHost: api.test:{port}\r\n\r\n").unwrap();
    assert_eq!(read_response(&mut s), ANSWER);
    s.write_all(SMUGGLED.as_bytes()).unwrap();
    // Already relayed traffic: no in-band answer that could interleave, just the close.
    assert_eq!(read_to_end(&mut s), "");
    let records = proxy.shutdown();
    assert_denied(&records, reason::HOST_MISMATCH);
    let log = up.log();
    assert!(log.starts_with("GET /first HTTP/1.1\r\n"), "{log:?}");
    assert_nothing_smuggled(&log);
}

#[test]
fn tunnel_refuses_smuggling_framing_like_the_forward_proxy() {
    let up = RawUpstream::start();
    let proxy = start(config(), &up);
    let port = up.port;
    let mut s = http_tunnel(&proxy, port);
    write!(
        s,
        "POST /a HTTP/1.1\r\nHost: api.test:{port}\r\nConnection: content-length\r\nContent-Length: 48\r\n\r\n{SMUGGLED}"
    )
    .unwrap();
    assert_refused(&read_to_end(&mut s), 400, reason::AMBIGUOUS_FRAMING);
    assert_denied(&proxy.shutdown(), reason::AMBIGUOUS_FRAMING);
    assert_eq!(up.log(), "");
}

#[test]
fn tunnel_that_is_neither_tls_nor_http_is_refused() {
    let up = RawUpstream::start();
    let proxy = start(config(), &up);
    let mut s = http_tunnel(&proxy, up.port);
    s.write_all(b"SSH-2.0-test\r\n").unwrap();
    assert_eq!(read_to_end(&mut s), "");
    let records = proxy.shutdown();
    assert_denied(&records, reason::PLAINTEXT_TUNNEL);
    assert_eq!(records[0].bytes_up, 0);
    assert_eq!(up.log(), "");
}

#[test]
fn leading_empty_line_does_not_turn_http_into_an_unchecked_stream() {
    let up = RawUpstream::start();
    let proxy = start(config(), &up);
    let mut s = socks_tunnel(&proxy, up.port);
    write!(s, "\r\n{SMUGGLED}").unwrap();
    assert_refused(&read_to_end(&mut s), 400, reason::AMBIGUOUS_FRAMING);
    assert_denied(&proxy.shutdown(), reason::AMBIGUOUS_FRAMING);
    assert_eq!(up.log(), "");
}

#[test]
fn operator_listed_opaque_destination_relays_other_protocols() {
    let up = RawUpstream::start();
    let listed = EgressConfig {
        opaque_tunnels: vec![rule("api.test", &[up.port])],
        ..config()
    };
    let proxy = start(listed, &up);
    let mut s = http_tunnel(&proxy, up.port);
    s.write_all(b"SSH-2.0-test\r\n").unwrap();
    // The half-close travels through the tunnel; the upstream then ends the connection.
    s.shutdown(std::net::Shutdown::Write).unwrap();
    assert_eq!(read_to_end(&mut s), "");
    let records = proxy.shutdown();
    assert_eq!(only_record(&records).decision, Decision::Allowed);
    assert_eq!(up.log(), "SSH-2.0-test\r\n");

    // Listing another port of the same host does not open this one.
    let up = RawUpstream::start();
    let other_port = EgressConfig {
        opaque_tunnels: vec![rule("api.test", &[up.port.wrapping_add(1)])],
        ..config()
    };
    let proxy = start(other_port, &up);
    let mut s = http_tunnel(&proxy, up.port);
    s.write_all(b"SSH-2.0-test\r\n").unwrap();
    let _ = read_to_end(&mut s);
    assert_denied(&proxy.shutdown(), reason::PLAINTEXT_TUNNEL);
    assert_eq!(up.log(), "");
}

// --- framing and hop-by-hop headers in the forward proxy (item 13) ---

#[test]
fn connection_content_length_cannot_strip_the_body_length() {
    forward_refused_before_upstream(
        |port| {
            post(
                port,
                "Connection: content-length\r\nContent-Length: 48\r\n",
                SMUGGLED,
            )
        },
        reason::AMBIGUOUS_FRAMING,
    );
}

#[test]
fn connection_host_cannot_strip_the_host() {
    forward_refused_before_upstream(
        |port| {
            format!(
                "GET http://api.test:{port}/a HTTP/1.1\r\nHost: api.test:{port}\r\nConnection: keep-alive, Host\r\n\r\n"
            )
        },
        reason::AMBIGUOUS_FRAMING,
    );
}

#[test]
fn connection_transfer_encoding_cannot_strip_the_chunking() {
    forward_refused_before_upstream(
        |port| {
            post(
                port,
                "Transfer-Encoding: chunked\r\nConnection: Transfer-Encoding\r\n",
                &format!("30\r\n{SMUGGLED}\r\n0\r\n\r\n"),
            )
        },
        reason::AMBIGUOUS_FRAMING,
    );
}

#[test]
fn cl_te_request_is_refused() {
    forward_refused_before_upstream(
        |port| {
            post(
                port,
                "Content-Length: 53\r\nTransfer-Encoding: chunked\r\n",
                &format!("0\r\n\r\n{SMUGGLED}"),
            )
        },
        reason::AMBIGUOUS_FRAMING,
    );
}

#[test]
fn te_cl_request_is_refused() {
    forward_refused_before_upstream(
        |port| {
            post(
                port,
                "Transfer-Encoding: chunked\r\nContent-Length: 4\r\n",
                &format!("30\r\n{SMUGGLED}\r\n0\r\n\r\n"),
            )
        },
        reason::AMBIGUOUS_FRAMING,
    );
}

#[test]
fn te_te_odd_spellings_are_refused() {
    let spellings = [
        "Transfer-Encoding: xchunked\r\n",
        "Transfer-Encoding: chunked, identity\r\n",
        "Transfer-Encoding:\tchunked\r\n",
        "Transfer-Encoding: chunked\t\r\n",
        "Transfer-Encoding : chunked\r\n",
        "Transfer-Encoding: chunked\r\nTransfer-Encoding: identity\r\n",
        "Transfer-Encoding: chunked\r\nTransfer-encoding: cow\r\n",
        "X-Note: a\r\n Transfer-Encoding: chunked\r\n",
    ];
    for te in spellings {
        forward_refused_before_upstream(
            |port| {
                post(
                    port,
                    &format!("{te}Content-Length: 4\r\n"),
                    &format!("30\r\n{SMUGGLED}\r\n0\r\n\r\n"),
                )
            },
            reason::AMBIGUOUS_FRAMING,
        );
    }
}

#[test]
fn upper_case_chunked_is_accepted_and_forwarded_canonically() {
    let up = RawUpstream::start();
    let proxy = start(config(), &up);
    let mut s = connect(proxy.http_addr());
    // A body, then a pipelined request that must be dropped (one request per connection).
    s.write_all(
        post(
            up.port,
            "Transfer-Encoding: CHUNKED\r\n",
            &format!("5\r\nhello\r\n0\r\n\r\n{SMUGGLED}"),
        )
        .as_bytes(),
    )
    .unwrap();
    assert_eq!(read_to_end(&mut s), ANSWER);
    let records = proxy.shutdown();
    assert_eq!(only_record(&records).decision, Decision::Allowed);
    let log = up.log();
    assert!(
        log.ends_with(
            "\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
        ),
        "{log:?}"
    );
    assert_nothing_smuggled(&log);
}

#[test]
fn duplicate_content_length_is_refused() {
    for fields in [
        "Content-Length: 48\r\nContent-Length: 48\r\n",
        "Content-Length: 0\r\nContent-Length: 48\r\n",
        "Content-Length: 48, 48\r\n",
    ] {
        forward_refused_before_upstream(
            |port| post(port, fields, SMUGGLED),
            reason::AMBIGUOUS_FRAMING,
        );
    }
}

#[test]
fn non_numeric_content_length_is_refused() {
    for length in ["+48", "0x30", "4 8", "-1", "48\t"] {
        forward_refused_before_upstream(
            |port| post(port, &format!("Content-Length: {length}\r\n"), SMUGGLED),
            reason::AMBIGUOUS_FRAMING,
        );
    }
}

#[test]
fn obs_fold_is_refused() {
    forward_refused_before_upstream(
        |port| post(port, "Content-Length: 0\r\nX-Note: a\r\n\tb\r\n", SMUGGLED),
        reason::AMBIGUOUS_FRAMING,
    );
}

#[test]
fn bare_lf_line_endings_are_refused() {
    // A lenient parser splits at the bare LF and sees a length; a strict one does not.
    forward_refused_before_upstream(
        |port| post(port, "X-Note: a\nContent-Length: 48\r\n", SMUGGLED),
        reason::AMBIGUOUS_FRAMING,
    );
    // A head with bare LFs only is refused at once, not waited on until the idle timeout.
    let started = Instant::now();
    forward_refused_before_upstream(
        |port| format!("GET http://api.test:{port}/ HTTP/1.1\nHost: api.test:{port}\n\n"),
        reason::AMBIGUOUS_FRAMING,
    );
    assert!(started.elapsed() < Duration::from_secs(2));
}

#[test]
fn chunked_trailer_with_bare_lf_cannot_end_the_body_early() {
    let up = RawUpstream::start();
    let proxy = start(config(), &up);
    let mut s = connect(proxy.http_addr());
    s.write_all(
        post(
            up.port,
            "Transfer-Encoding: chunked\r\n",
            &format!("0\r\nX-Trailer: a\n\n{SMUGGLED}"),
        )
        .as_bytes(),
    )
    .unwrap();
    let _ = read_to_end(&mut s);
    let records = proxy.shutdown();
    assert_eq!(only_record(&records).reason, Some(reason::BAD_REQUEST));
    assert_nothing_smuggled(&up.log());
}

#[test]
fn pipelined_request_after_a_valid_one_on_a_kept_alive_connection_is_dropped() {
    let up = RawUpstream::start();
    let proxy = start(config(), &up);
    let port = up.port;
    let mut s = connect(proxy.http_addr());
    write!(
        s,
        "GET http://api.test:{port}/a HTTP/1.1\r\nHost: api.test:{port}\r\nConnection: keep-alive\r\n\r\n{SMUGGLED}GET http://forbidden.test:{port}/ HTTP/1.1\r\nHost: forbidden.test:{port}\r\n\r\n"
    )
    .unwrap();
    assert_eq!(read_to_end(&mut s), ANSWER);
    let records = proxy.shutdown();
    assert_eq!(only_record(&records).decision, Decision::Allowed);
    let log = up.log();
    assert!(log.starts_with("GET /a HTTP/1.1\r\n"), "{log:?}");
    assert_nothing_smuggled(&log);
}
