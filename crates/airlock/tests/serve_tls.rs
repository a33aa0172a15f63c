//! `airlock serve` on a `tls:` listener, through the real binary and real clients: curl
//! and Python's `ssl` reach the API over HTTPS with a key; a client that does not trust
//! the certificate, plain HTTP to the TLS port and a handshake that never comes are
//! served nothing and start nothing; plain TCP off loopback and a certificate whose key
//! does not match stop the service at start.

mod common;

use common::test_ca::TestCa;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const KEY: &str = "alice-tls-key";
/// The service's certificate names this; curl's `--resolve` sends it to loopback.
const NAME: &str = "airlock.test";

/// A test directory with the operator configuration and, for `tls:`, the service's
/// certificate (signed by `ca`) beside it, named relatively as an operator would.
struct Setup {
    dir: tempfile::TempDir,
    ca: TestCa,
    port: u16,
}

impl Setup {
    fn new(listen: &str, extra: &str) -> Setup {
        let dir = tempfile::tempdir().unwrap();
        let ca = TestCa::new("airlock service test CA");
        let (cert, key) = ca.leaf(&[NAME]);
        std::fs::write(dir.path().join("cert.pem"), cert).unwrap();
        std::fs::write(dir.path().join("key.pem"), key).unwrap();
        std::fs::write(dir.path().join("ca.pem"), ca.certificate_pem()).unwrap();
        std::fs::copy(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/contracts/default.yaml"),
            dir.path().join("small.yaml"),
        )
        .unwrap();
        let port = common::free_port();
        let listen = listen.replace("PORT", &port.to_string());
        let config = format!(
            r#"[server]
listen = ["unix:{sock}", "{listen}"]
header_timeout_ms = 1500
{extra}
[server.contracts]
small = "small.yaml"
[server.tenants.alice]
api_key_sha256 = ["{key}"]
"#,
            sock = dir.path().join("airlock.sock").display(),
            key = common::sha256_hex(KEY),
        );
        std::fs::write(dir.path().join("airlock.toml"), config).unwrap();
        Setup { dir, ca, port }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn serve(&self) -> Command {
        let mut serve = Command::new(common::airlock_bin());
        serve
            .arg("serve")
            .arg("--config")
            .arg(self.path("airlock.toml"))
            .arg("--state-dir")
            .arg(self.path("state"));
        serve
    }

    /// `curl` over HTTPS trusting the test CA: (curl's exit code, HTTP status, body).
    fn https(&self, method: &str, path: &str, body: Option<&str>) -> (i32, u16, String) {
        let ca = self.path("ca.pem");
        let mut curl = self.curl(method, path, body);
        curl.arg("--cacert").arg(ca);
        outcome(&curl.output().unwrap())
    }

    fn curl(&self, method: &str, path: &str, body: Option<&str>) -> Command {
        let mut curl = Command::new("curl");
        curl.args([
            "-sS",
            "--max-time",
            "60",
            "-w",
            "\n%{http_code}",
            "-X",
            method,
        ])
        .args(["-H", &format!("Authorization: Bearer {KEY}")])
        .args(["--resolve", &format!("{NAME}:{}:127.0.0.1", self.port)]);
        if let Some(body) = body {
            curl.args([
                "-H",
                "content-type: application/json",
                "--data-binary",
                body,
            ]);
        }
        curl.arg(format!("https://{NAME}:{}{path}", self.port));
        curl
    }

    /// The runs of the store, as the operator sees them over the unix socket.
    fn run_count(&self) -> usize {
        let out = Command::new("curl")
            .args(["-sS", "--max-time", "30", "--unix-socket"])
            .arg(self.path("airlock.sock"))
            .arg("http://airlock/v1/runs")
            .output()
            .unwrap();
        let list: Value = serde_json::from_slice(&out.stdout).unwrap();
        list["runs"].as_array().unwrap().len()
    }
}

fn outcome(output: &Output) -> (i32, u16, String) {
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", &text));
    (
        output.status.code().unwrap_or(-1),
        code.trim().parse().unwrap_or(0),
        body.to_string(),
    )
}

struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn wait_until_ready(setup: &Setup, server: &mut Running) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        if setup.https("GET", "/healthz", None).1 == 200 {
            return;
        }
        if let Ok(Some(status)) = server.0.try_wait() {
            panic!(
                "airlock serve exited ({status}): {}",
                std::fs::read_to_string(setup.path("serve.log")).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("the service did not answer over TLS");
}

/// Python's own TLS client (the `ssl` module, verifying against the test CA) lists the
/// runs with the key; it prints the HTTP status and the count.
const PYTHON_CLIENT: &str = r#"
import http.client, json, ssl, sys
port, ca, key = int(sys.argv[1]), sys.argv[2], sys.argv[3]
context = ssl.create_default_context(cafile=ca)
class Resolved(http.client.HTTPSConnection):
    def connect(self):
        import socket
        sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        self.sock = self._context.wrap_socket(sock, server_hostname="airlock.test")
conn = Resolved("airlock.test", port, context=context)
conn.request("GET", "/v1/runs", headers={"Authorization": "Bearer " + key})
response = conn.getresponse()
body = json.loads(response.read())
print(response.status, len(body["runs"]), conn.sock.version())
"#;

/// How long the service lets a TCP connection that never starts its handshake live:
/// (whether it closed, seconds until then).
fn stalled_handshake(port: u16) -> (bool, f64) {
    let script = r#"
import socket, sys, time
sock = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=30)
start = time.monotonic()
closed = sock.recv(1) == b""
print(closed, time.monotonic() - start)
"#;
    let out = Command::new("python3")
        .args(["-c", script, &port.to_string()])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (closed, seconds) = text.trim().split_once(' ').unwrap_or_else(|| {
        panic!("{text} {}", String::from_utf8_lossy(&out.stderr));
    });
    (closed == "True", seconds.parse().unwrap())
}

#[test]
fn the_api_is_served_over_https_and_nothing_else_on_that_port_reaches_it() {
    require_cells!();
    let setup = Setup::new(
        "tls:127.0.0.1:PORT",
        "tls_cert_file = \"cert.pem\"\ntls_key_file = \"key.pem\"",
    );
    let log = std::fs::File::create(setup.path("serve.log")).unwrap();
    let mut server = Running(
        setup
            .serve()
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap(),
    );
    wait_until_ready(&setup, &mut server);

    // curl over HTTPS with the key: a run, its record.
    let body = serde_json::json!({"contract": "small", "argv": ["echo", "over tls"]});
    let (exit, status, answer) = setup.https("POST", "/v1/runs?wait=true", Some(&body.to_string()));
    assert_eq!((exit, status), (0, 200), "{answer}");
    let record: Value = serde_json::from_str(&answer).unwrap();
    assert_eq!(record["status"], "ok", "{record}");
    assert!(record.to_string().contains("over tls"), "{record}");

    // Python's ssl client, verifying the certificate, sees that run under the key.
    let python = Command::new("python3")
        .arg("-c")
        .arg(PYTHON_CLIENT)
        .arg(setup.port.to_string())
        .arg(setup.path("ca.pem"))
        .arg(KEY)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&python.stdout);
    let words: Vec<&str> = said.split_whitespace().collect();
    assert_eq!(
        words.get(..2),
        Some(&["200", "1"][..]),
        "{said} {}",
        String::from_utf8_lossy(&python.stderr)
    );
    assert!(
        matches!(words.get(2), Some(&"TLSv1.3") | Some(&"TLSv1.2")),
        "{said}"
    );

    // A client that does not trust the service's certificate sends nothing: curl stops
    // at verification (60), before the request.
    let (exit, _, _) = outcome(
        &setup
            .curl("POST", "/v1/runs?wait=true", Some(&body.to_string()))
            .output()
            .unwrap(),
    );
    assert_eq!(exit, 60, "an untrusted certificate must stop curl");
    // A certificate for another name is refused alike (51: name mismatch): the service
    // is only what its certificate names.
    let stranger = TestCa::new("someone else's CA");
    std::fs::write(setup.path("stranger.pem"), stranger.certificate_pem()).unwrap();
    let mut wrong_ca = setup.curl("GET", "/healthz", None);
    wrong_ca.arg("--cacert").arg(setup.path("stranger.pem"));
    assert_eq!(outcome(&wrong_ca.output().unwrap()).0, 60);

    // Plain HTTP to the TLS port: no HTTP answer, no run.
    let plain = Command::new("curl")
        .args([
            "-sS",
            "--max-time",
            "10",
            "-H",
            &format!("Authorization: Bearer {KEY}"),
        ])
        .args([
            "-H",
            "content-type: application/json",
            "--data-binary",
            &body.to_string(),
        ])
        .arg(format!("http://127.0.0.1:{}/v1/runs?wait=true", setup.port))
        .output()
        .unwrap();
    assert!(
        !plain.status.success(),
        "plain HTTP was answered on the TLS port"
    );
    assert!(
        !String::from_utf8_lossy(&plain.stdout).contains("run_id"),
        "{plain:?}"
    );

    // A connection that never starts its handshake is closed at the head timeout
    // (1.5 s here), and the service still answers others.
    let (closed, seconds) = stalled_handshake(setup.port);
    assert!(closed, "a stalled handshake was kept open");
    assert!((1.0..15.0).contains(&seconds), "closed after {seconds} s");
    assert_eq!(setup.https("GET", "/healthz", None).1, 200);

    assert_eq!(setup.run_count(), 1, "only the HTTPS run may exist");
}

/// `airlock serve` with this configuration exits 1 before listening, saying `why`;
/// `airlock config check` refuses the same file when `checked`.
fn refused_at_start(setup: &Setup, why: &str, checked: bool) {
    let out = setup.serve().stdin(Stdio::null()).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains(why), "{stderr}");
    assert!(std::net::TcpStream::connect(("127.0.0.1", setup.port)).is_err());
    if checked {
        let check = Command::new(common::airlock_bin())
            .args(["config", "check"])
            .arg(setup.path("airlock.toml"))
            .output()
            .unwrap();
        let said = String::from_utf8_lossy(&check.stderr);
        assert!(!check.status.success(), "config check passed: {said}");
        assert!(said.contains(why), "{said}");
    }
}

#[test]
fn plain_tcp_off_loopback_and_a_bad_certificate_stop_the_service_at_start() {
    refused_at_start(
        &Setup::new("tcp:0.0.0.0:PORT", ""),
        "would carry API keys in clear",
        true,
    );
    refused_at_start(
        &Setup::new("tls:127.0.0.1:PORT", "tls_cert_file = \"cert.pem\""),
        "a tls: listener needs server.tls_cert_file and server.tls_key_file",
        true,
    );
    // The key of another certificate: the pair is refused, naming both keys.
    let mismatched = Setup::new(
        "tls:127.0.0.1:PORT",
        "tls_cert_file = \"cert.pem\"\ntls_key_file = \"other-key.pem\"",
    );
    let (_, other_key) = mismatched.ca.leaf(&[NAME]);
    std::fs::write(mismatched.path("other-key.pem"), other_key).unwrap();
    refused_at_start(&mismatched, "do not form a usable pair", false);
    let missing = Setup::new(
        "tls:127.0.0.1:PORT",
        "tls_cert_file = \"none.pem\"\ntls_key_file = \"key.pem\"",
    );
    refused_at_start(&missing, "server.tls_cert_file", false);
}
