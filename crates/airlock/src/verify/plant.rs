//! What `airlock verify` plants on the host for its checks, and removes afterwards (only
//! its own): a directory of its own with marker files of random content, a fake internal
//! endpoint on loopback that counts the connections it accepts, a fake container-runtime
//! socket that does the same, and a marker process.

use anyhow::Context;
use std::io::{Read, Write};
use std::net::TcpListener;
use std::os::unix::net::UnixListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// Random hex from the kernel: marker contents, names, the credential's value.
pub fn random_hex(bytes: usize) -> anyhow::Result<String> {
    let mut buf = vec![0u8; bytes];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut buf))
        .context("reading /dev/urandom")?;
    Ok(hex::encode(buf))
}

/// A listener that counts what it accepts, on a thread of its own until dropped.
struct Counter {
    count: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Counter {
    fn start(mut accept: impl FnMut() -> bool + Send + 'static) -> Counter {
        let count = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (c, s) = (count.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                if accept() {
                    c.fetch_add(1, Ordering::SeqCst);
                } else {
                    std::thread::sleep(Duration::from_millis(5));
                }
            }
        });
        Counter {
            count,
            stop,
            thread: Some(thread),
        }
    }

    /// Connections since the last call.
    fn take(&self) -> usize {
        self.count.swap(0, Ordering::SeqCst)
    }
}

impl Drop for Counter {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Everything planted; dropping it removes it all.
pub struct Plants {
    pub dir: PathBuf,
    /// A file outside every mount, and its random content.
    pub marker: PathBuf,
    pub marker_content: String,
    /// The boundary exercise's own marker, so that weakening one control fails one check.
    pub exercise_marker: PathBuf,
    pub exercise_content: String,
    /// A directory on the host the write check tries to write into.
    pub write_target: PathBuf,
    pub socket: PathBuf,
    pub endpoint_port: u16,
    pub process_marker: String,
    process: Child,
    endpoint: Counter,
    runtime: Counter,
}

impl Plants {
    /// Plants everything under `dir`, which must not exist yet (so that removing it at
    /// the end removes only what this verification made).
    pub fn plant(dir: &Path, endpoint_port: u16) -> anyhow::Result<Plants> {
        std::fs::create_dir(dir)
            .with_context(|| format!("creating the verification directory {}", dir.display()))?;
        let made = |sub: &str| -> anyhow::Result<PathBuf> {
            let path = dir.join(sub);
            std::fs::create_dir(&path)?;
            Ok(path)
        };
        let marker_content = format!("airlock-verify-marker-{}", random_hex(16)?);
        let marker = made("marker")?.join("secret");
        std::fs::write(&marker, &marker_content)?;
        let exercise_content = format!("airlock-verify-marker-{}", random_hex(16)?);
        let exercise_marker = made("exercise")?.join("secret");
        std::fs::write(&exercise_marker, &exercise_content)?;
        let write_target = made("write")?;
        let socket = made("runtime")?.join("docker.sock");
        let runtime = runtime_socket(&socket)?;
        let (endpoint, endpoint_port) = endpoint(endpoint_port)?;
        let process_marker = format!("airlock-verify-process-{}", random_hex(8)?);
        let process = Command::new("sleep")
            .arg0(&process_marker)
            .arg("600")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting the marker process (sleep)")?;
        Ok(Plants {
            dir: dir.to_path_buf(),
            marker,
            marker_content,
            exercise_marker,
            exercise_content,
            write_target,
            socket,
            endpoint_port,
            process_marker,
            process,
            endpoint,
            runtime,
        })
    }

    pub fn describe(&self) -> super::output::Planted {
        super::output::Planted {
            dir: self.dir.display().to_string(),
            endpoint: format!("127.0.0.1:{}", self.endpoint_port),
            runtime_socket: self.socket.display().to_string(),
            marker_process: self.process_marker.clone(),
            marker_pid: self.process.id(),
        }
    }

    pub fn endpoint_connections(&self) -> usize {
        self.endpoint.take()
    }

    pub fn socket_accepts(&self) -> usize {
        self.runtime.take()
    }

    pub fn marker_pid(&self) -> u32 {
        self.process.id()
    }

    /// The marker process has not exited (nothing in a cell signalled it).
    pub fn marker_alive(&mut self) -> bool {
        matches!(self.process.try_wait(), Ok(None))
    }
}

impl Drop for Plants {
    fn drop(&mut self) {
        let _ = self.process.kill();
        let _ = self.process.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// What the fake endpoint says first (verify/probe.py's `BANNER`).
const ENDPOINT_BANNER: &[u8] = b"airlock-verify-endpoint";

/// The fake internal endpoint: a TCP listener on 127.0.0.1 (`port` 0: any free port).
fn endpoint(port: u16) -> anyhow::Result<(Counter, u16)> {
    let listener = TcpListener::bind(("127.0.0.1", port))
        .with_context(|| format!("binding the fake internal endpoint 127.0.0.1:{port}"))?;
    let port = listener.local_addr()?.port();
    listener.set_nonblocking(true)?;
    // Greets every connection, so that a probe can tell the endpoint from a proxy's own
    // listener (which accepts before it decides).
    let greet = move || match listener.accept() {
        Ok((mut stream, _)) => {
            let _ = stream.write_all(ENDPOINT_BANNER);
            true
        }
        Err(_) => false,
    };
    Ok((Counter::start(greet), port))
}

/// The fake container-runtime socket, world-writable like a misconfigured docker.sock.
fn runtime_socket(path: &Path) -> anyhow::Result<Counter> {
    use std::os::unix::fs::PermissionsExt;
    let listener = UnixListener::bind(path)
        .with_context(|| format!("binding the fake runtime socket {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666))?;
    listener.set_nonblocking(true)?;
    Ok(Counter::start(move || listener.accept().is_ok()))
}
