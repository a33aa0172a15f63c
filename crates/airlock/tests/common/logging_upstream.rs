//! An upstream that logs every request it gets (method, path, headers, body) as JSON
//! lines, for the credential tests: python3 on a loopback address the test's operator
//! config exempts, plain HTTP or (with a certificate and key) HTTPS. `/.../redirect?to=URL`
//! answers 302 to URL; `/.../echo` echoes the `Authorization` it was sent (a careless
//! service); anything else answers `ok`. Killed when dropped.

use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

const SERVER_PY: &str = r#"
import sys, json, ssl, http.server, urllib.parse
address, log = sys.argv[1], sys.argv[2]
logf = open(log, "a", buffering=1)
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def handle_one(self):
        n = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(n).decode("latin-1") if n else ""
        logf.write(json.dumps({"method": self.command, "path": self.path,
            "headers": [[k, v] for k, v in self.headers.items()], "body": body}) + "\n")
        url = urllib.parse.urlparse(self.path)
        query = urllib.parse.parse_qs(url.query)
        if url.path.endswith("/redirect"):
            self.send_response(302)
            self.send_header("Location", query["to"][0])
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        # A careless service that echoes the credential it was sent.
        reply = ("echo " + self.headers.get("Authorization", "")) if url.path.endswith("/echo") else "ok"
        data = (reply + "\n").encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
    do_GET = do_POST = do_PUT = do_DELETE = handle_one
    def log_message(self, *a):
        pass
srv = http.server.ThreadingHTTPServer((address, 0), H)
if len(sys.argv) > 4:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(sys.argv[3], sys.argv[4])
    srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
print(srv.server_address[1], flush=True)
srv.serve_forever()
"#;

/// The address the upstreams listen on (the tests' configs exempt it).
pub const ADDRESS: &str = "127.0.0.2";

pub struct LoggingUpstream {
    child: Child,
    pub port: u16,
    log: PathBuf,
}

impl LoggingUpstream {
    /// Starts upstream `name` (its log is `dir/NAME.jsonl`); with `tls` (certificate,
    /// key files) it speaks HTTPS.
    pub fn start(dir: &Path, name: &str, tls: Option<(&Path, &Path)>) -> LoggingUpstream {
        let script = dir.join("logging_upstream.py");
        std::fs::write(&script, SERVER_PY).unwrap();
        let log = dir.join(format!("{name}.jsonl"));
        let mut cmd = Command::new(super::upstream::python());
        cmd.arg(&script).arg(ADDRESS).arg(&log);
        if let Some((cert, key)) = tls {
            cmd.arg(cert).arg(key);
        }
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start python3 upstream");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let port = line.trim().parse().expect("upstream port");
        LoggingUpstream { child, port, log }
    }

    pub fn raw_log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The requests so far, one JSON object each.
    pub fn requests(&self) -> Vec<Value> {
        self.raw_log()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }
}

/// The values of a logged request's `Authorization` headers.
pub fn authorization(request: &Value) -> Vec<String> {
    request["headers"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|h| h[0].as_str().unwrap().eq_ignore_ascii_case("authorization"))
        .map(|h| h[1].as_str().unwrap().to_string())
        .collect()
}

impl Drop for LoggingUpstream {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
