//! A run's broker socket: bound by the trusted side outside the cell, mounted into the
//! cell at `/run/airlock/broker.sock` by the plan (the contract crate's `BROKER_SOCKET`),
//! served by one thread of the run's lifecycle and removed when the run ends.
//!
//! The protocol: one request per connection, one JSON line
//! `{"action": "...", "request": {...}}` (at most [`MAX_LINE_BYTES`], within
//! [`READ_DEADLINE`]), answered by one JSON line `{"ok": true, "result": ...}` or
//! `{"ok": false, "error": {"reason": "broker.*", "message": "..."}}`.

use crate::decide::{authorize, identify, Denial, Reason, RunGrant};
use crate::handler::{self, Outcome};
use crate::{Broker, BrokerError};
use serde::{Deserialize, Serialize};
use serde_json::json;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

/// The most bytes of one request line, whatever the action: past it the request is
/// `broker.too_large` without being parsed. An action's own cap is at most this.
pub const MAX_LINE_BYTES: u64 = 64 << 20;
/// How long a connection may take to deliver its request line.
pub const READ_DEADLINE: Duration = Duration::from_secs(10);

/// One brokered request as the run's record keeps it (result, store, export).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ActionRecord {
    /// The action the request named (empty when the line named none).
    pub action: String,
    /// sha256 of the canonical JSON of the request (keys sorted), or of the raw line when
    /// it was not a request.
    pub request_sha256: String,
    pub request_bytes: u64,
    /// `granted` or `denied`.
    pub decision: Decision,
    /// The refusal's reason code (`broker.*`), for a denied request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// What the handler did, for a granted request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<Outcome>,
    pub started_at_unix_ms: u64,
    pub duration_ms: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Decision {
    Granted,
    Denied,
}

/// A run's socket and, once [`BrokerServer::serve`] is called, the thread answering it.
pub struct BrokerServer {
    dir: PathBuf,
    socket: PathBuf,
    listener: Option<UnixListener>,
    broker: Arc<Broker>,
    grant: RunGrant,
    stop: Arc<AtomicBool>,
    records: Arc<Mutex<Vec<ActionRecord>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl BrokerServer {
    /// Binds a fresh socket in a new private directory (mode 0700) under `parent`. The
    /// socket itself is 0666: the cell's identity, whatever host uid it has, reaches it
    /// only through the mount; nobody else can traverse the directory.
    pub fn bind(parent: &Path, broker: Arc<Broker>, grant: RunGrant) -> Result<Self, BrokerError> {
        let io = |what: &str, path: &Path, source| BrokerError::Socket {
            what: what.to_string(),
            path: path.to_path_buf(),
            source,
        };
        std::fs::create_dir_all(parent).map_err(|e| io("creating", parent, e))?;
        let dir = fresh_dir(parent).map_err(|e| io("creating a run directory in", parent, e))?;
        let socket = dir.join("broker.sock");
        let listener = UnixListener::bind(&socket).map_err(|e| io("binding", &socket, e))?;
        std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o666))
            .map_err(|e| io("opening", &socket, e))?;
        Ok(BrokerServer {
            dir,
            socket,
            listener: Some(listener),
            broker,
            grant,
            stop: Arc::new(AtomicBool::new(false)),
            records: Arc::new(Mutex::new(Vec::new())),
            thread: None,
        })
    }

    /// The socket's host path (the plan's mount source).
    pub fn socket_path(&self) -> &Path {
        &self.socket
    }

    /// Starts answering requests, on a thread of this process: call it once the cell is
    /// cloned (a process that clones cells must be single-threaded until then).
    pub fn serve(&mut self) {
        let Some(listener) = self.listener.take() else {
            return;
        };
        let answer = Answer {
            broker: self.broker.clone(),
            grant: self.grant.clone(),
            records: self.records.clone(),
        };
        let stop = self.stop.clone();
        self.thread = Some(std::thread::spawn(move || {
            for stream in listener.incoming() {
                if stop.load(Ordering::SeqCst) {
                    break;
                }
                match stream {
                    Ok(stream) => answer.connection(stream),
                    // Out of descriptors, say: the loop must not spin while it lasts.
                    Err(_) => std::thread::sleep(Duration::from_millis(10)),
                }
            }
        }));
    }

    /// Stops answering and removes the socket: a connection from then on fails. Returns
    /// every request answered, in order.
    pub fn finish(mut self) -> Vec<ActionRecord> {
        self.shut_down();
        std::mem::take(&mut *self.records.lock().unwrap_or_else(|e| e.into_inner()))
    }

    fn shut_down(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        self.listener = None;
        if let Some(thread) = self.thread.take() {
            // Wakes the accept loop, which then sees the stop flag. The cell is gone by
            // now: no other connection races this one.
            let _ = UnixStream::connect(&self.socket);
            let _ = thread.join();
        }
        let _ = std::fs::remove_file(&self.socket);
        let _ = std::fs::remove_dir(&self.dir);
    }
}

impl Drop for BrokerServer {
    fn drop(&mut self) {
        self.shut_down();
    }
}

/// A new directory under `parent`, named for this process and the time.
fn fresh_dir(parent: &Path) -> std::io::Result<PathBuf> {
    use std::os::unix::fs::DirBuilderExt;
    let nanos = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    let dir = parent.join(format!("{}-{nanos}", std::process::id()));
    std::fs::DirBuilder::new().mode(0o700).create(&dir)?;
    Ok(dir)
}

/// What the serving thread needs to answer one connection.
struct Answer {
    broker: Arc<Broker>,
    grant: RunGrant,
    records: Arc<Mutex<Vec<ActionRecord>>>,
}

impl Answer {
    fn connection(&self, mut stream: UnixStream) {
        let started = Instant::now();
        let started_at_unix_ms = unix_ms();
        let _ = stream.set_read_timeout(Some(READ_DEADLINE));
        let _ = stream.set_write_timeout(Some(READ_DEADLINE));
        let (reply, mut record) = match read_line(&stream) {
            Ok(line) => self.decide(&line),
            Err(denial) => {
                let record = unread_record(&denial);
                (Err(denial), record)
            }
        };
        record.started_at_unix_ms = started_at_unix_ms;
        record.duration_ms = started.elapsed().as_millis() as u64;
        let reply = match reply {
            Ok(result) => json!({"ok": true, "result": result}),
            Err(denial) => json!({
                "ok": false,
                "error": {"reason": denial.reason.code(), "message": denial.message},
            }),
        };
        let _ = stream.write_all(format!("{reply}\n").as_bytes());
        self.records
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(record);
    }

    /// The reply and the record of one complete request line.
    fn decide(&self, line: &[u8]) -> (Result<serde_json::Value, Denial>, ActionRecord) {
        let identity = identify(line);
        let mut record = ActionRecord {
            action: identity.action,
            request_sha256: identity.request_sha256,
            request_bytes: line.len() as u64,
            decision: Decision::Denied,
            reason: None,
            outcome: None,
            started_at_unix_ms: 0,
            duration_ms: 0,
        };
        let prepared = authorize(&self.broker, &self.grant, line).and_then(|granted| {
            let handler = &granted.action.config.handler;
            handler::prepare(handler, &granted.request).map(|p| (handler, p))
        });
        match prepared {
            Err(denial) => {
                record.reason = Some(denial.reason.code().to_string());
                (Err(denial), record)
            }
            Ok((handler, prepared)) => {
                let handled = handler::execute(handler, prepared);
                record.decision = Decision::Granted;
                record.outcome = Some(handled.outcome);
                (handled.result, record)
            }
        }
    }
}

/// Reads one line (without its newline; EOF ends it too), refusing more than
/// [`MAX_LINE_BYTES`] and a line not complete by the read deadline.
fn read_line(stream: &UnixStream) -> Result<Vec<u8>, Denial> {
    let mut reader = BufReader::new(stream.take(MAX_LINE_BYTES + 1));
    let mut line = Vec::new();
    match reader.read_until(b'\n', &mut line) {
        Ok(_) => {}
        Err(err)
            if matches!(
                err.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ) =>
        {
            return Err(Denial::new(
                Reason::Timeout,
                format!("the request did not arrive within {READ_DEADLINE:?}"),
            ))
        }
        Err(err) => return Err(Denial::new(Reason::Malformed, format!("reading: {err}"))),
    }
    if line.len() as u64 > MAX_LINE_BYTES {
        return Err(Denial::new(
            Reason::TooLarge,
            format!("a request line is at most {MAX_LINE_BYTES} bytes"),
        ));
    }
    if line.last() == Some(&b'\n') {
        line.pop();
    }
    Ok(line)
}

/// The record of a request refused before its line was read whole.
fn unread_record(denial: &Denial) -> ActionRecord {
    ActionRecord {
        action: String::new(),
        request_sha256: String::new(),
        request_bytes: 0,
        decision: Decision::Denied,
        reason: Some(denial.reason.code().to_string()),
        outcome: None,
        started_at_unix_ms: 0,
        duration_ms: 0,
    }
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or_default()
}
