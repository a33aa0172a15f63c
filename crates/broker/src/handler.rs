//! The handlers the trusted side runs for a granted request, outside any cell: the
//! built-in `store_artifact` and an operator `command`.

use crate::config::{CommandConfig, ContentEncoding, HandlerConfig, StoreArtifactConfig};
use crate::decide::{canonical_json, is_plain_name, sha256_hex, Denial, Reason};
use base64::Engine as _;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// What a handler did, for the record (never its output or its credential).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Outcome {
    /// A command's exit code (`None`: killed, or not a command).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// Bytes written to storage (`store_artifact`) or read from a command's stdout.
    #[serde(default)]
    pub bytes: u64,
    /// Where `store_artifact` stored the file, relative to its directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stored_as: Option<String>,
    /// Why the handler failed after the grant (`broker.exists`, `broker.handler_failed`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// A handler's result: the reply's `result` or its error, and the record's outcome.
pub struct Handled {
    pub result: Result<Value, Denial>,
    pub outcome: Outcome,
}

impl Handled {
    fn failed(denial: Denial, mut outcome: Outcome) -> Handled {
        outcome.error = Some(denial.reason.code().to_string());
        Handled {
            result: Err(denial),
            outcome,
        }
    }
}

/// The checks a handler makes of a granted request before doing anything: `Err` is a
/// refusal like the authorization's (nothing was done).
pub fn prepare(handler: &HandlerConfig, request: &Value) -> Result<Prepared, Denial> {
    match handler {
        HandlerConfig::StoreArtifact(config) => store_target(config, request).map(Prepared::Store),
        HandlerConfig::Command(_) => Ok(Prepared::Command(canonical_json(request))),
    }
}

pub enum Prepared {
    Store(StoreTarget),
    /// The validated request, as the command's stdin.
    Command(String),
}

pub fn execute(handler: &HandlerConfig, prepared: Prepared) -> Handled {
    match (handler, prepared) {
        (HandlerConfig::StoreArtifact(config), Prepared::Store(target)) => {
            store(&config.directory, config.overwrite, &target)
        }
        (HandlerConfig::Command(config), Prepared::Command(stdin)) => run_command(config, &stdin),
        _ => Handled::failed(
            Denial::new(
                Reason::HandlerFailed,
                "the handler changed under the request",
            ),
            Outcome::default(),
        ),
    }
}

/// Where a `store_artifact` request goes and what it writes.
#[derive(Debug, PartialEq, Eq)]
pub struct StoreTarget {
    pub group: Option<String>,
    pub name: String,
    pub content: Vec<u8>,
}

impl StoreTarget {
    /// The path below the storage directory, as recorded.
    pub fn relative(&self) -> String {
        match &self.group {
            Some(group) => format!("{group}/{}", self.name),
            None => self.name.clone(),
        }
    }
}

/// The file a request names and its decoded content: names are plain (see
/// [`is_plain_name`]), content within `max_bytes`.
pub fn store_target(config: &StoreArtifactConfig, request: &Value) -> Result<StoreTarget, Denial> {
    let field = |name: &str| -> Result<&str, Denial> {
        request.get(name).and_then(Value::as_str).ok_or_else(|| {
            Denial::new(
                Reason::SchemaInvalid,
                format!("/{name}: a string is required"),
            )
        })
    };
    let plain = |value: &str, what: &str| -> Result<String, Denial> {
        if is_plain_name(value) {
            Ok(value.to_string())
        } else {
            Err(Denial::new(
                Reason::NameInvalid,
                format!(
                    "the {what} must be 1 to 128 letters, digits, `.`, `_` or `-`, start with a \
                     letter or digit and hold no `..`"
                ),
            ))
        }
    };
    let name = plain(field(&config.name_field)?, "file name")?;
    let group = match &config.group_field {
        Some(group) => Some(plain(field(group)?, "group name")?),
        None => None,
    };
    let text = field(&config.content_field)?;
    let content = match config.encoding {
        ContentEncoding::Text => text.as_bytes().to_vec(),
        ContentEncoding::Base64 => base64::engine::general_purpose::STANDARD
            .decode(text)
            .map_err(|err| {
                Denial::new(
                    Reason::SchemaInvalid,
                    format!("/{}: not base64: {err}", config.content_field),
                )
            })?,
    };
    crate::decide::check_size(config.max_bytes, content.len() as u64)?;
    Ok(StoreTarget {
        group,
        name,
        content,
    })
}

/// Writes `target` below `directory`: into a fresh temporary file of the final
/// directory, then linked (or, with `overwrite`, renamed) to its name, so no reader ever
/// sees a partial file and an existing file is never replaced unless configured.
pub fn store(directory: &Path, overwrite: bool, target: &StoreTarget) -> Handled {
    let stored_as = target.relative();
    let outcome = Outcome {
        stored_as: Some(stored_as.clone()),
        ..Outcome::default()
    };
    let dir = match target_dir(directory, target.group.as_deref()) {
        Ok(dir) => dir,
        Err(err) => return Handled::failed(err, outcome),
    };
    let final_path = dir.join(&target.name);
    let temporary = dir.join(format!(
        ".airlock-broker-{}-{}",
        std::process::id(),
        unique_suffix()
    ));
    let written = write_new(&temporary, &target.content).and_then(|()| {
        let placed = if overwrite {
            std::fs::rename(&temporary, &final_path)
        } else {
            std::fs::hard_link(&temporary, &final_path)
        };
        let _ = std::fs::remove_file(&temporary);
        placed
    });
    match written {
        Ok(()) => Handled {
            result: Ok(json!({
                "stored": stored_as,
                "bytes": target.content.len(),
                "sha256": sha256_hex(&target.content),
            })),
            outcome: Outcome {
                bytes: target.content.len() as u64,
                ..outcome
            },
        },
        Err(err) if err.kind() == std::io::ErrorKind::AlreadyExists => {
            let _ = std::fs::remove_file(&temporary);
            Handled::failed(
                Denial::new(Reason::Exists, format!("{stored_as} exists already")),
                outcome,
            )
        }
        Err(err) => {
            let _ = std::fs::remove_file(&temporary);
            Handled::failed(
                Denial::new(Reason::HandlerFailed, format!("storing {stored_as}: {err}")),
                outcome,
            )
        }
    }
}

/// The directory a file lands in: the storage directory, or its group sub-directory
/// (made when missing; a symlink there is refused).
fn target_dir(directory: &Path, group: Option<&str>) -> Result<PathBuf, Denial> {
    let Some(group) = group else {
        return Ok(directory.to_path_buf());
    };
    let dir = directory.join(group);
    match std::fs::create_dir(&dir) {
        Ok(()) => {}
        Err(err) if err.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(err) => {
            return Err(Denial::new(
                Reason::HandlerFailed,
                format!("creating the group {group}: {err}"),
            ))
        }
    }
    let is_dir = std::fs::symlink_metadata(&dir).is_ok_and(|m| m.file_type().is_dir());
    if is_dir {
        Ok(dir)
    } else {
        Err(Denial::new(
            Reason::HandlerFailed,
            format!("the group {group} is not a directory"),
        ))
    }
}

fn write_new(path: &Path, content: &[u8]) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o640)
        .custom_flags(libc_o_nofollow())
        .open(path)?;
    file.write_all(content)?;
    file.sync_all()
}

/// `O_NOFOLLOW` (Linux's value on every architecture airlock builds for): a temporary
/// name that somehow is a symlink is never followed.
fn libc_o_nofollow() -> i32 {
    0o400000
}

fn unique_suffix() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default()
}

/// The `PATH` of a handler command: the system's directories only.
const HANDLER_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Runs the operator's command with `stdin` (the canonical request) and its own
/// environment, within its deadline; hands back its stdout (capped): as JSON when it is
/// JSON, else as text.
pub fn run_command(config: &CommandConfig, stdin: &str) -> Handled {
    let env = match command_env(config) {
        Ok(env) => env,
        Err(denial) => return Handled::failed(denial, Outcome::default()),
    };
    let spawned = Command::new(&config.argv[0])
        .args(&config.argv[1..])
        .env_clear()
        .envs(env)
        .current_dir("/")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn();
    let mut child = match spawned {
        Ok(child) => child,
        Err(err) => {
            let denial = Denial::new(
                Reason::HandlerFailed,
                format!("the handler command did not start: {err}"),
            );
            return Handled::failed(denial, Outcome::default());
        }
    };
    let writer = feed_stdin(&mut child, stdin.as_bytes().to_vec());
    let reader = read_capped(&mut child, config.max_output_bytes);
    let deadline = Instant::now() + Duration::from_secs(config.timeout_seconds);
    let status = wait_until(&mut child, deadline);
    drop(writer);
    // A process the command left behind may hold its stdout open: the output is taken as
    // far as it came by the deadline, never waited for past it.
    let remaining = deadline.saturating_duration_since(Instant::now());
    let output = reader
        .and_then(|r| {
            r.recv_timeout(remaining.max(Duration::from_millis(100)))
                .ok()
        })
        .unwrap_or_default();
    let outcome = Outcome {
        exit_code: status.and_then(|s| s.code()),
        bytes: output.len() as u64,
        ..Outcome::default()
    };
    match status {
        None => Handled::failed(
            Denial::new(
                Reason::HandlerFailed,
                format!(
                    "the handler command passed its {} s deadline and was killed",
                    config.timeout_seconds
                ),
            ),
            outcome,
        ),
        Some(status) if !status.success() => Handled::failed(
            Denial::new(
                Reason::HandlerFailed,
                format!("the handler command failed ({status})"),
            ),
            outcome,
        ),
        Some(_) => Handled {
            result: Ok(json!({ "exit_code": 0, "output": output_value(&output) })),
            outcome,
        },
    }
}

/// The command's environment: `PATH`, the configured literals, and the `env_from`
/// variables read from airlock's own environment now (an unset one refuses the request).
fn command_env(config: &CommandConfig) -> Result<Vec<(String, String)>, Denial> {
    let mut env = vec![("PATH".to_string(), HANDLER_PATH.to_string())];
    env.extend(config.env.iter().map(|(k, v)| (k.clone(), v.clone())));
    for name in &config.env_from {
        let value = std::env::var(name).map_err(|_| {
            Denial::new(
                Reason::HandlerFailed,
                format!("the handler's variable {name} is not set on the trusted side"),
            )
        })?;
        env.push((name.clone(), value));
    }
    Ok(env)
}

fn feed_stdin(child: &mut Child, bytes: Vec<u8>) -> Option<std::thread::JoinHandle<()>> {
    let mut stdin = child.stdin.take()?;
    Some(std::thread::spawn(move || {
        // A command that exits without reading its stdin makes this fail; its exit says
        // what happened.
        let _ = stdin
            .write_all(&bytes)
            .and_then(|()| stdin.write_all(b"\n"));
    }))
}

/// Reads at most `max` bytes of the command's stdout, then drains (and drops) the rest
/// so the command never blocks on a full pipe.
fn read_capped(child: &mut Child, max: u64) -> Option<std::sync::mpsc::Receiver<Vec<u8>>> {
    let mut stdout = child.stdout.take()?;
    let (sender, receiver) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut kept = Vec::new();
        let _ = (&mut stdout).take(max).read_to_end(&mut kept);
        let _ = sender.send(kept);
        let _ = std::io::copy(&mut stdout, &mut std::io::sink());
    });
    Some(receiver)
}

/// The command's exit status, or `None` when it passed `deadline` (it is killed and
/// reaped then).
fn wait_until(child: &mut Child, deadline: Instant) -> Option<std::process::ExitStatus> {
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Some(status),
            Ok(None) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(10));
            }
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
        }
    }
}

fn output_value(output: &[u8]) -> Value {
    serde_json::from_slice(output)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(output).into_owned()))
}
