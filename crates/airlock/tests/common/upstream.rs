//! A plain-HTTP or HTTPS file server on the host (python3's http.server), for the tests'
//! upstreams: on a loopback address the test's operator config exempts, on an ephemeral
//! port, logging every request it answers. Killed when dropped.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

pub struct Upstream {
    child: Child,
    pub port: u16,
    log: PathBuf,
}

const SERVER_PY: &str = r#"
import sys, ssl, http.server
address, root, log = sys.argv[1], sys.argv[2], sys.argv[3]
logf = open(log, "a", buffering=1)
class H(http.server.SimpleHTTPRequestHandler):
    def __init__(self, *a, **k):
        super().__init__(*a, directory=root, **k)
    def log_message(self, fmt, *args):
        logf.write("REQ " + (fmt % args) + "\n")
srv = http.server.ThreadingHTTPServer((address, 0), H)
if len(sys.argv) > 5:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(sys.argv[4], sys.argv[5])
    srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
print(srv.server_address[1], flush=True)
srv.serve_forever()
"#;

/// Host-side python3 (the cell uses its own PATH).
pub fn python() -> &'static str {
    if Path::new("/usr/bin/python3").exists() {
        "/usr/bin/python3"
    } else {
        "python3"
    }
}

impl Upstream {
    /// Serves `root` on `address`; `dir` holds the server's script and log. With `tls`
    /// (certificate, key) it speaks HTTPS.
    pub fn start(dir: &Path, root: &Path, address: &str, tls: Option<(&Path, &Path)>) -> Upstream {
        let script = dir.join("upstream_server.py");
        std::fs::write(&script, SERVER_PY).unwrap();
        let log = dir.join(format!("upstream-{address}-{}.log", std::process::id()));
        let mut cmd = Command::new(python());
        cmd.arg(&script).arg(address).arg(root).arg(&log);
        if let Some((cert, key)) = tls {
            cmd.arg(cert).arg(key);
        }
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start python3 upstream server");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let port: u16 = line
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("upstream server did not print its port: {line:?}"));
        Upstream { child, port, log }
    }

    /// Request lines the server has logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
