//! Evidence of a `suspected_escape` run: the run's records (its row and every audit
//! event, from the store), the copy of the cell's writable paths that the completion
//! sequence made before the cell was destroyed (crates/cell/src/evidence.rs, asked for by
//! the engine's `on_suspected_escape`), and copies of what it delivered are kept in a
//! root-only, size-capped quarantine area of the state directory,
//! `quarantine/<run id>/`, with a manifest; the requester is flagged with a
//! capability-review record. `airlock quarantine list|show` reads it.
//!
//! The run's token-provider credentials were revoked when its cell ended (the engine's
//! `TokenRevoker`, for every run) and its placeholders died with it; the manifest names
//! them. What this does not do yet (docs/policy.md): copy the writable paths of a cell
//! served by the factory (the service's runs), or close a session.

use airlock_cell::report::{ResultClass, RunReport};
use airlock_store::{Store, StoreLocation};
use anyhow::{bail, Context};
use clap::Subcommand;
use serde_json::json;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// The quarantine area, under the state directory.
pub const QUARANTINE_DIR: &str = "quarantine";
/// The most bytes of delivered files one run's evidence keeps; the rest is listed as
/// skipped.
pub const MAX_EVIDENCE_BYTES: u64 = 64 << 20;

/// Who and what the run was, for the manifest and the review record.
pub struct Suspect<'a> {
    pub class: &'a str,
    pub requester: String,
    pub credentials: Vec<String>,
    /// Where the completion sequence copied the cell's writable paths (it exists only
    /// for a suspected escape).
    pub writable_copy: Option<PathBuf>,
}

/// Keeps the evidence of `report`'s run if it is a suspected escape; the directory.
pub fn preserve_if_suspected(
    store: &StoreLocation,
    report: &RunReport,
    suspect: &Suspect<'_>,
) -> Option<PathBuf> {
    if report.status != ResultClass::SuspectedEscape || report.run_id.is_empty() {
        if let Some(copy) = suspect.writable_copy.as_deref().filter(|c| c.exists()) {
            let _ = std::fs::remove_dir_all(copy);
        }
        return None;
    }
    match preserve(store, report, suspect) {
        Ok(dir) => {
            eprintln!(
                "airlock: suspected_escape: evidence quarantined in {}",
                dir.display()
            );
            Some(dir)
        }
        Err(err) => {
            eprintln!(
                "airlock: suspected_escape: quarantining the evidence failed: {}",
                crate::user_message(&err)
            );
            None
        }
    }
}

/// The evidence stays on this node (`<state dir>/quarantine`); the run's record comes from
/// wherever runs are (the fleet's store with `[store] url`).
fn preserve(
    location: &StoreLocation,
    report: &RunReport,
    suspect: &Suspect<'_>,
) -> anyhow::Result<PathBuf> {
    let area = private_dir(&location.state_dir.join(QUARANTINE_DIR), true)?;
    let dir = private_dir(&area.join(&report.run_id), false)?;
    let store = Store::open_at(location)?;
    let record = store.show_run(&report.run_id)?;
    write_new(
        &dir.join("record.json"),
        &serde_json::to_vec_pretty(&record)?,
    )?;
    let (kept, skipped) = copy_delivered(report, &private_dir(&dir.join("artifacts"), false)?)?;
    let writable = adopt_writable_copy(suspect.writable_copy.as_deref(), &dir);
    let manifest = json!({
        "run_id": report.run_id,
        "class": suspect.class,
        "requester": suspect.requester,
        "reason": report.error,
        "quarantined_at_ms": crate::approvals::now_ms(),
        "files": kept,
        "skipped": skipped,
        "max_evidence_bytes": MAX_EVIDENCE_BYTES,
        "credentials_revoked": suspect.credentials,
        "writable_paths_copied": writable.is_some(),
        "writable": writable,
        "tenant_flagged": suspect.requester,
    });
    write_new(
        &dir.join("manifest.json"),
        &serde_json::to_vec_pretty(&manifest)?,
    )?;
    store.record_review(airlock_store::approvals::NewReview {
        run_id: Some(report.run_id.clone()),
        workload_class: suspect.class.to_string(),
        requester: suspect.requester.to_string(),
        argv: Vec::new(),
        asked: json!({}),
        reason_code: "suspected_escape".to_string(),
        detail: report.error.clone().unwrap_or_default(),
    })?;
    Ok(dir)
}

/// Moves the completion sequence's copy of the writable paths to `dir/writable`; its
/// manifest (what was copied, skipped, whether the cap stopped it), if it made one.
fn adopt_writable_copy(copy: Option<&Path>, dir: &Path) -> Option<serde_json::Value> {
    let copy = copy?;
    let meta = std::fs::symlink_metadata(copy).ok()?;
    if !meta.is_dir() {
        return None;
    }
    let target = dir.join("writable");
    if let Err(err) = std::fs::rename(copy, &target) {
        eprintln!("airlock: suspected_escape: keeping the writable paths' copy failed: {err}");
        return None;
    }
    let manifest = target.join(airlock_cell::evidence::MANIFEST);
    Some(read_json(&manifest).unwrap_or_else(|err| json!({"error": err.to_string()})))
}

/// A directory only its owner (root, for cells) can enter: created 0700, or (for the
/// area itself) an existing real directory of this user with no group or other bits.
fn private_dir(path: &Path, may_exist: bool) -> anyhow::Result<PathBuf> {
    match std::fs::DirBuilder::new().mode(0o700).create(path) {
        Ok(()) => return Ok(path.to_path_buf()),
        Err(err) if !(may_exist && err.kind() == std::io::ErrorKind::AlreadyExists) => {
            return Err(err).with_context(|| format!("creating {}", path.display()));
        }
        Err(_) => {}
    }
    let meta = std::fs::symlink_metadata(path)?;
    let me = airlock_store::caller_uid().unwrap_or(u32::MAX);
    if !meta.is_dir() || meta.mode() & 0o077 != 0 || (meta.uid() != me && meta.uid() != 0) {
        bail!(
            "{} is not a private directory of this user (mode 0700)",
            path.display()
        );
    }
    Ok(path.to_path_buf())
}

/// Writes a new file, mode 0600, never through an existing name.
fn write_new(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    use std::io::Write;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .with_context(|| format!("writing {}", path.display()))?;
    file.write_all(bytes)?;
    Ok(())
}

/// Copies the run's delivered artifacts (regular files, not followed through a link) up
/// to the cap, numbered in order; the kept and skipped cell paths.
fn copy_delivered(report: &RunReport, into: &Path) -> anyhow::Result<(Vec<String>, Vec<String>)> {
    let (mut kept, mut skipped, mut total) = (Vec::new(), Vec::new(), 0u64);
    let delivered = report.artifacts.iter().flat_map(|a| &a.kept);
    for (n, artifact) in delivered.enumerate() {
        let source = airlock_cell::host_files::unescaped(&artifact.stored_at).map(|bytes| {
            PathBuf::from(<std::ffi::OsString as std::os::unix::ffi::OsStringExt>::from_vec(bytes))
        });
        let bytes = source.and_then(|p| read_regular(&p));
        match bytes {
            Some(bytes) if total + bytes.len() as u64 <= MAX_EVIDENCE_BYTES => {
                total += bytes.len() as u64;
                write_new(&into.join(n.to_string()), &bytes)?;
                kept.push(artifact.path.clone());
            }
            _ => skipped.push(artifact.path.clone()),
        }
    }
    Ok((kept, skipped))
}

fn read_regular(path: &Path) -> Option<Vec<u8>> {
    use std::io::Read;
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .ok()?;
    if !file.metadata().ok()?.is_file() {
        return None;
    }
    let mut bytes = Vec::new();
    file.by_ref()
        .take(MAX_EVIDENCE_BYTES + 1)
        .read_to_end(&mut bytes)
        .ok()?;
    Some(bytes)
}

#[derive(Subcommand)]
pub enum QuarantineCommand {
    /// The quarantined runs: run id, class, reason.
    List,
    /// One run's manifest and records (JSON).
    Show { run_id: String },
}

pub fn quarantine_command(
    state_dir: &Path,
    command: QuarantineCommand,
) -> anyhow::Result<ExitCode> {
    let area = state_dir.join(QUARANTINE_DIR);
    match command {
        QuarantineCommand::List => {
            let mut entries: Vec<PathBuf> = match std::fs::read_dir(&area) {
                // A name starting with a dot is a cell's copy not yet claimed by its run.
                Ok(dir) => dir
                    .filter_map(|e| e.ok().map(|e| e.path()))
                    .filter(|p| {
                        !p.file_name()
                            .is_some_and(|n| n.as_bytes().starts_with(b"."))
                    })
                    .collect(),
                Err(err) if err.kind() == std::io::ErrorKind::NotFound => Vec::new(),
                Err(err) => return Err(err).context(format!("reading {}", area.display())),
            };
            entries.sort();
            for entry in entries {
                let manifest = read_json(&entry.join("manifest.json")).unwrap_or_default();
                println!(
                    "{}  {:<16} {}",
                    manifest["run_id"].as_str().unwrap_or("?"),
                    manifest["class"].as_str().unwrap_or("?"),
                    manifest["reason"].as_str().unwrap_or("")
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        QuarantineCommand::Show { run_id } => {
            if run_id.contains('/') || run_id.starts_with('.') {
                bail!("{run_id:?} is not a run id");
            }
            let dir = area.join(&run_id);
            let shown = json!({
                "manifest": read_json(&dir.join("manifest.json"))?,
                "record": read_json(&dir.join("record.json"))?,
                "directory": dir,
            });
            println!("{}", serde_json::to_string_pretty(&shown)?);
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn read_json(path: &Path) -> anyhow::Result<serde_json::Value> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    Ok(serde_json::from_str(&text)?)
}
