//! `airlock serve` started by a test: its operator configuration in a directory of the
//! test's own (with whatever files it names), its store in `state/` there, its stderr in
//! `serve.log`; curl over its unix socket, or over TCP with a tenant's key. Killed when
//! dropped.

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

pub struct Served {
    child: Option<Child>,
    pub dir: tempfile::TempDir,
    /// The loopback port `PORT` stood for in the configuration.
    pub port: u16,
}

impl Served {
    /// Writes `config` as `airlock.toml` in a fresh directory (`SOCK` and `PORT` in it
    /// stand for the service's unix socket and a free loopback port), lets `prepare`
    /// write the files it names beside it, starts `airlock serve` on it, and returns once
    /// `/healthz` answers on the socket.
    pub fn start(config: &str, prepare: impl FnOnce(&Path)) -> Served {
        let dir = tempfile::tempdir().unwrap();
        let port = super::free_port();
        let config = config
            .replace(
                "SOCK",
                &dir.path().join("airlock.sock").display().to_string(),
            )
            .replace("PORT", &port.to_string());
        std::fs::write(dir.path().join("airlock.toml"), config).unwrap();
        prepare(dir.path());
        let mut served = Served {
            child: None,
            dir,
            port,
        };
        served.spawn();
        served
    }

    fn spawn(&mut self) {
        let log = std::fs::File::create(self.path("serve.log")).unwrap();
        let child = self
            .serve()
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(60);
        while !self
            .curl_unix(&["-f", "http://airlock/healthz"])
            .status
            .success()
        {
            if let Some(Ok(Some(status))) = self.child.as_mut().map(Child::try_wait) {
                panic!("airlock serve exited ({status}): {}", self.log());
            }
            assert!(Instant::now() < deadline, "no answer: {}", self.log());
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// `airlock serve` on this configuration and store, not started.
    pub fn serve(&self) -> Command {
        let mut serve = Command::new(super::airlock_bin());
        serve
            .arg("serve")
            .arg("--config")
            .arg(self.path("airlock.toml"))
            .arg("--state-dir")
            .arg(self.state_dir());
        serve
    }

    /// The service's pid, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Ends the service (SIGKILL), keeping its directory and store.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// kB of a field of the running service's `/proc/<pid>/status` (`VmRSS:`, `VmHWM:`).
    pub fn status_kb(&self, field: &str) -> u64 {
        let pid = self.pid().expect("the service is running");
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        status
            .lines()
            .find_map(|l| {
                l.strip_prefix(field)?
                    .trim()
                    .strip_suffix("kB")?
                    .trim()
                    .parse()
                    .ok()
            })
            .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"))
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    pub fn sock(&self) -> PathBuf {
        self.path("airlock.sock")
    }

    pub fn state_dir(&self) -> PathBuf {
        self.path("state")
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.path("serve.log")).unwrap_or_default()
    }

    /// `curl ARGS` over the unix socket (as this process's uid: root is the operator).
    pub fn curl_unix(&self, args: &[&str]) -> Output {
        Command::new("curl")
            .args(["-sS", "--max-time", "120", "--unix-socket"])
            .arg(self.sock())
            .args(args)
            .output()
            .unwrap()
    }

    /// `curl` over TCP as the tenant of `key`: (HTTP status, body).
    pub fn call_text(
        &self,
        key: &str,
        method: &str,
        path: &str,
        body: Option<&str>,
    ) -> (u16, String) {
        let mut cmd = Command::new("curl");
        cmd.args([
            "-sS",
            "--max-time",
            "120",
            "-w",
            "\n%{http_code}",
            "-X",
            method,
        ])
        .args(["-H", &format!("Authorization: Bearer {key}")]);
        if let Some(body) = body {
            cmd.args([
                "-H",
                "content-type: application/json",
                "--data-binary",
                body,
            ]);
        }
        cmd.arg(format!("http://127.0.0.1:{}{path}", self.port));
        let text = String::from_utf8_lossy(&cmd.output().unwrap().stdout).into_owned();
        let (body, status) = text.rsplit_once('\n').unwrap_or(("", "0"));
        (status.trim().parse().unwrap_or(0), body.to_string())
    }

    /// [`Served::call_text`] with a JSON body, answered as JSON (an NDJSON stream as the
    /// array of its frames; anything else as a string).
    pub fn call(&self, key: &str, method: &str, path: &str, body: Option<&Value>) -> (u16, Value) {
        let body = body.map(Value::to_string);
        let (status, text) = self.call_text(key, method, path, body.as_deref());
        (status, answer(&text))
    }

    /// `airlock ARGS --config .. --state-dir ..` against the service's configuration and
    /// store.
    pub fn cli(&self, args: &[&str]) -> Output {
        Command::new(super::airlock_bin())
            .args(args)
            .arg("--config")
            .arg(self.path("airlock.toml"))
            .arg("--state-dir")
            .arg(self.state_dir())
            .stdin(Stdio::null())
            .output()
            .unwrap()
    }
}

/// A body as JSON, an NDJSON stream as the array of its frames, anything else as a string.
fn answer(body: &str) -> Value {
    serde_json::from_str(body).unwrap_or_else(|_| {
        let frames: Option<Vec<Value>> = body
            .lines()
            .filter(|l| !l.is_empty())
            .map(|l| serde_json::from_str(l).ok())
            .collect();
        frames.map_or_else(|| Value::String(body.to_string()), Value::from)
    })
}

impl Drop for Served {
    fn drop(&mut self) {
        self.kill();
    }
}
