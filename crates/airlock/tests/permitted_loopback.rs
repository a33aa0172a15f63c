//! Connections within the cell: each test runs the real `airlock` binary (as root, with its
//! own state directory). A server the payload starts on the cell's loopback must be
//! reachable by the payload in both network modes, while nothing the payload sends reaches
//! the host: not its loopback, not any of its interface addresses, not over UDP, and with
//! an allowlist nothing but the proxies leads out.
mod common;

use common::CellRun;
use std::net::{TcpListener, UdpSocket};
use std::time::{Duration, Instant};

/// An operator config that resolves the allowlisted name (an allowlist the config cannot
/// resolve is refused before the cell starts).
const EGRESS_CONFIG: &str = "[egress]\nresolve = { \"api.test\" = \"127.0.0.1\" }\n";
const ALLOWLIST: &str = "network:\n  mode: allowlist\n  allowed_domains: [api.test]\n";

#[derive(Clone, Copy, Debug)]
enum Mode {
    Deny,
    Allowlist,
}

/// `argv` in a cell of the given network mode, with a state directory of its own.
fn run_in_mode(mode: Mode, argv: &[&str]) -> CellRun {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state").display().to_string();
    match mode {
        Mode::Deny => common::run_in(dir.path(), None, &["--state-dir", &state], argv),
        Mode::Allowlist => {
            let config = dir.path().join("airlock.toml");
            std::fs::write(&config, EGRESS_CONFIG).unwrap();
            let config = config.display().to_string();
            common::run_in(
                dir.path(),
                Some(ALLOWLIST),
                &["--state-dir", &state, "--config", &config],
                argv,
            )
        }
    }
}

/// Lines `name: verdict` printed by the probes.
fn verdict<'r>(stdout: &'r str, name: &str) -> Option<&'r str> {
    stdout
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(": "))
}

// Permitted: the payload's own servers -----------------------------------------------------

/// Starts `python3 -m http.server` on 127.0.0.1 in the background, then fetches a file
/// from it with urllib (which, with an allowlist, sees the proxy variables and must go
/// direct because `NO_PROXY` names 127.0.0.1).
const HTTP_SERVER_AND_CLIENT: &str = r#"set -e
cd /tmp && echo served-from-the-cell > hello.txt
python3 -m http.server 8765 --bind 127.0.0.1 --directory /tmp >/dev/null 2>&1 &
python3 - <<'EOF'
import time, urllib.request
for attempt in range(100):
    try:
        body = urllib.request.urlopen("http://127.0.0.1:8765/hello.txt", timeout=2).read()
        print("fetched:", body.decode().strip())
        break
    except OSError as e:
        last = e
        time.sleep(0.1)
else:
    print("fetched: FAILED", last)
EOF
"#;

fn assert_own_http_server_is_reachable(mode: Mode) {
    let run = run_in_mode(mode, &["/bin/sh", "-c", HTTP_SERVER_AND_CLIENT]);
    let d = run.describe();
    assert_eq!(run.code(), 0, "{mode:?}\n{d}");
    assert_eq!(run.status(), "ok", "{mode:?}\n{d}");
    assert_eq!(
        verdict(&run.stdout(), "fetched"),
        Some("served-from-the-cell"),
        "{mode:?}\n{d}"
    );
}

#[test]
fn a_payloads_http_server_on_loopback_is_reachable_in_deny_mode() {
    require_cells!();
    assert_own_http_server_is_reachable(Mode::Deny);
}

#[test]
fn a_payloads_http_server_on_loopback_is_reachable_in_allowlist_mode() {
    require_cells!();
    assert_own_http_server_is_reachable(Mode::Allowlist);
}

/// A TCP echo over `::1` when the cell's `lo` has it (it does on IPv6 hosts).
const IPV6_ECHO: &str = r#"
import socket
if not any(l.split()[0] == "0" * 31 + "1" for l in open("/proc/net/if_inet6")):
    print("ipv6-lo: absent")
    raise SystemExit(0)
server = socket.socket(socket.AF_INET6); server.bind(("::1", 0)); server.listen(1)
client = socket.create_connection(("::1", server.getsockname()[1]), timeout=2)
peer, _ = server.accept()
client.sendall(b"ping over ::1")
print("ipv6-echo:", peer.recv(100).decode())
"#;

#[test]
fn a_tcp_server_and_client_talk_over_ipv6_loopback_in_both_modes() {
    require_cells!();
    for mode in [Mode::Deny, Mode::Allowlist] {
        let run = run_in_mode(mode, &["/usr/bin/python3", "-c", IPV6_ECHO]);
        let d = run.describe();
        assert_eq!(run.code(), 0, "{mode:?}\n{d}");
        let stdout = run.stdout();
        if verdict(&stdout, "ipv6-lo") == Some("absent") {
            eprintln!("NOTE: the cell's lo has no ::1 on this host; the IPv6 echo was skipped");
            continue;
        }
        assert_eq!(
            verdict(&stdout, "ipv6-echo"),
            Some("ping over ::1"),
            "{mode:?}\n{d}"
        );
    }
}

// Denied paths: the host stays out of reach --------------------------------------------------

/// Every address of the host's interfaces (from `ip -j addr`), loopback included.
fn host_addresses() -> Vec<String> {
    let out = std::process::Command::new("ip")
        .args(["-j", "addr"])
        .output()
        .expect("ip -j addr");
    let links: serde_json::Value = serde_json::from_slice(&out.stdout).expect("ip -j output");
    let mut addresses: Vec<String> = links
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|link| link["addr_info"].as_array().cloned().unwrap_or_default())
        .filter_map(|info| info["local"].as_str().map(str::to_owned))
        .collect();
    for loopback in ["127.0.0.1", "::1"] {
        if !addresses.iter().any(|a| a == loopback) {
            addresses.push(loopback.to_owned());
        }
    }
    addresses
}

/// Host listeners on every address at one port: TCP on `[::]` (and `0.0.0.0` when the
/// host keeps IPv6 sockets v6-only), and UDP likewise.
struct HostListeners {
    port: u16,
    tcp: Vec<TcpListener>,
    udp: Vec<UdpSocket>,
}

impl HostListeners {
    fn bind() -> HostListeners {
        for _ in 0..20 {
            let tcp6 = TcpListener::bind("[::]:0").unwrap();
            let port = tcp6.local_addr().unwrap().port();
            let Ok(udp6) = UdpSocket::bind(("::", port)) else {
                continue;
            };
            let mut tcp = vec![tcp6];
            let mut udp = vec![udp6];
            // On a dual-stack host these fail with EADDRINUSE: `[::]` already covers IPv4.
            tcp.extend(TcpListener::bind(("0.0.0.0", port)).ok());
            udp.extend(UdpSocket::bind(("0.0.0.0", port)).ok());
            for listener in &tcp {
                listener.set_nonblocking(true).unwrap();
            }
            for socket in &udp {
                socket.set_nonblocking(true).unwrap();
            }
            return HostListeners { port, tcp, udp };
        }
        panic!("no free port for both TCP and UDP");
    }

    /// Panics if anything arrived within a short grace period.
    fn assert_nothing_arrived(&self, context: &str) {
        let deadline = Instant::now() + Duration::from_millis(300);
        let mut buffer = [0u8; 512];
        loop {
            for listener in &self.tcp {
                if let Ok((_, peer)) = listener.accept() {
                    panic!("the cell reached the host's TCP listener from {peer}\n{context}");
                }
            }
            for socket in &self.udp {
                if let Ok((_, peer)) = socket.recv_from(&mut buffer) {
                    panic!("a datagram from the cell reached the host from {peer}\n{context}");
                }
            }
            if Instant::now() > deadline {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Tries TCP and UDP to every host address at `port`; in allowlist mode also a direct
/// connect to a public address, CONNECT through the proxy to each host address, and taking
/// the proxy's port.
fn escape_probe(addresses: &[String], port: u16) -> String {
    let list = addresses
        .iter()
        .map(|a| format!("{a:?}"))
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        r#"
import os, socket
def verdict(name, fn):
    try:
        print(f"{{name}}: ALLOWED {{fn()}}")
    except OSError as e:
        print(f"{{name}}: blocked {{type(e).__name__}} errno={{e.errno}} {{e.strerror}}")
def family(address):
    return socket.AF_INET6 if ":" in address else socket.AF_INET
def tcp(address, port):
    s = socket.socket(family(address)); s.settimeout(3)
    s.connect((address, port)); s.sendall(b"from the cell\n")
    return s.getsockname()
def udp(address, port):
    s = socket.socket(family(address), socket.SOCK_DGRAM)
    return s.sendto(b"from the cell\n", (address, port))
def via_proxy(target):
    s = socket.create_connection(("127.0.0.1", 3128), timeout=5)
    s.sendall(f"CONNECT {{target}} HTTP/1.1\r\nHost: {{target}}\r\n\r\n".encode())
    line = s.recv(200).split(b"\r\n")[0].decode()
    if " 200" in line:
        return line
    raise PermissionError(13, line)
def take_port(port):
    s = socket.socket(); s.bind(("127.0.0.1", port)); s.listen(1)
    return s.getsockname()
allowlist = "HTTP_PROXY" in os.environ
for address in [{list}]:
    verdict(f"tcp {{address}}", lambda: tcp(address, {port}))
    # A datagram to the cell's own 127.0.0.1 or ::1 is sent, to the cell's lo; the
    # host side checks that none arrives.
    verdict(f"udp {{address}}", lambda: udp(address, {port}))
    if allowlist:
        target = f"[{{address}}]:{port}" if ":" in address else f"{{address}}:{port}"
        verdict(f"proxy {{address}}", lambda: via_proxy(target))
verdict("tcp public", lambda: tcp("1.1.1.1", 443))
verdict("udp public", lambda: udp("1.1.1.1", 53))
if allowlist:
    verdict("take-http-proxy-port", lambda: take_port(3128))
    verdict("take-socks-proxy-port", lambda: take_port(1080))
print("done: yes")
"#
    )
}

fn assert_no_escape(mode: Mode) {
    let listeners = HostListeners::bind();
    let addresses = host_addresses();
    let probe = escape_probe(&addresses, listeners.port);
    let run = run_in_mode(mode, &["/usr/bin/python3", "-c", &probe]);
    let d = format!("{mode:?}\n{}", run.describe());
    let stdout = run.stdout();
    if std::env::var_os("AIRLOCK_TEST_VERBOSE").is_some() {
        eprintln!("{d}");
    }
    assert_eq!(verdict(&stdout, "done"), Some("yes"), "{d}");
    let mut expected: Vec<String> = Vec::new();
    for address in &addresses {
        expected.push(format!("tcp {address}"));
        let own_loopback = address == "127.0.0.1" || address == "::1";
        if !own_loopback {
            // No route out of the cell: not even sent.
            expected.push(format!("udp {address}"));
        }
        if matches!(mode, Mode::Allowlist) {
            expected.push(format!("proxy {address}"));
        }
    }
    expected.extend(["tcp public".to_owned(), "udp public".to_owned()]);
    if matches!(mode, Mode::Allowlist) {
        expected.extend(["take-http-proxy-port", "take-socks-proxy-port"].map(String::from));
    }
    for name in &expected {
        let v = verdict(&stdout, name).unwrap_or_else(|| panic!("`{name}` printed nothing\n{d}"));
        assert!(
            v.starts_with("blocked"),
            "boundary crossed: `{name}` -> `{v}`\n{d}"
        );
    }
    if matches!(mode, Mode::Allowlist) {
        assert!(
            run.result["egress"]
                .to_string()
                .contains("egress.ip_literal"),
            "the proxy recorded its refusals\n{d}"
        );
        for name in ["take-http-proxy-port", "take-socks-proxy-port"] {
            assert!(
                verdict(&stdout, name).is_some_and(|v| v.contains("errno=98")),
                "the proxy holds its port: EADDRINUSE\n{d}"
            );
        }
    }
    listeners.assert_nothing_arrived(&d);
}

#[test]
fn in_deny_mode_nothing_reaches_a_host_listener_on_any_host_address() {
    require_cells!();
    assert_no_escape(Mode::Deny);
}

#[test]
fn in_allowlist_mode_nothing_but_the_proxy_leads_out_and_it_refuses_the_host() {
    require_cells!();
    assert_no_escape(Mode::Allowlist);
}
