//! `airlock image`: import, list, inspect, remove and garbage-collect the OCI images of
//! the state directory (crates/images holds the store and the unpacker).

use crate::config::OperatorConfig;
use airlock_images::registry::{Progress, Registry};
use airlock_images::{import::import, Digest, ImageError, ImageRecord, ImageRef, ImageStore};
use anyhow::Context;
use clap::{Args, Subcommand};
use serde::Serialize;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Args)]
pub struct ImageArgs {
    /// State directory (the images live in its `images/`).
    #[arg(long, global = true)]
    state_dir: Option<PathBuf>,
    /// Operator configuration (`[images]`, `[store] state_dir`).
    #[arg(long, global = true)]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: ImageCommand,
}

#[derive(Subcommand)]
enum ImageCommand {
    /// Import an OCI image layout (directory or tar) or a `docker save` archive.
    Import {
        file: PathBuf,
        /// Name (and tag) to record the image under, instead of the one the archive gives:
        /// `registry/name:tag`, or `name:tag` against `images.default_registry`.
        #[arg(long)]
        name: Option<String>,
    },
    /// Pull an image from an OCI registry over HTTPS: `registry/name@sha256:...`, or a tag
    /// when `images.allow_tags` is set.
    Pull { reference: String },
    /// List the images.
    Ls {
        #[arg(long)]
        json: bool,
    },
    /// Print an image's record and configuration as JSON.
    Inspect { reference: String },
    /// Remove an image from the index (refused while a running cell uses it); `gc` then
    /// frees its blobs and layers.
    Rm { reference: String },
    /// Remove every blob and unpacked layer no image references.
    Gc,
}

/// Exit codes: 0 done, 1 refused or failed (the message says which), 2 usage.
pub fn image(args: ImageArgs) -> ExitCode {
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("airlock: {}", crate::user_message(&err));
            ExitCode::from(1)
        }
    }
}

fn run(args: ImageArgs) -> anyhow::Result<()> {
    let config = OperatorConfig::load(args.config.as_deref())?;
    let state_dir = config.state_dir(args.state_dir.as_deref());
    let store = ImageStore::open(&state_dir, config.images.limits())
        .with_context(|| format!("opening the image store in {}", state_dir.display()))?;
    let registry = config.images.default_registry.as_deref();
    match args.command {
        ImageCommand::Import { file, name } => {
            let name = name.map(|n| name_only(&n, registry)).transpose()?;
            let records = import(&store, &file, name.as_ref())
                .with_context(|| format!("importing {}", file.display()))?;
            for record in records {
                println!("{}", record.pinned());
            }
        }
        ImageCommand::Pull { reference } => {
            let reference = ImageRef::parse(&reference, registry)?;
            let mut client = Registry::new(config.images.client_options()?)?;
            let mut progress = Bars::new();
            let record = client
                .pull(&store, &reference, &mut progress)
                .with_context(|| format!("pulling {reference}"))?;
            println!("{}", record.pinned());
        }
        ImageCommand::Ls { json } => {
            let images = store.list()?;
            if json {
                println!("{}", serde_json::to_string_pretty(&images)?);
            } else {
                print_table(&images);
            }
        }
        ImageCommand::Inspect { reference } => {
            let record = store.find(&reference)?;
            let config = store.config(&record)?;
            let out = Inspected {
                record: &record,
                config: &config,
            };
            println!("{}", serde_json::to_string_pretty(&out)?);
        }
        ImageCommand::Rm { reference } => {
            let record = store.remove(&reference).map_err(in_use_hint)?;
            println!("removed {}", record.pinned());
        }
        ImageCommand::Gc => {
            let report = store.gc()?;
            println!(
                "removed {} blobs and {} layers, {} bytes",
                report.blobs, report.layers, report.bytes
            );
        }
    }
    Ok(())
}

/// `--name` takes a name and an optional tag (a digest is the content's, never chosen).
fn name_only(text: &str, registry: Option<&str>) -> anyhow::Result<ImageRef> {
    if text.contains('@') {
        anyhow::bail!("--name {text:?}: a name and tag; the digest comes from the image");
    }
    let with_tag = if has_tag(text) {
        text.to_string()
    } else {
        format!("{text}:latest")
    };
    Ok(ImageRef::parse(&with_tag, registry)?)
}

fn has_tag(text: &str) -> bool {
    let last = text.rsplit('/').next().unwrap_or(text);
    last.contains(':')
}

fn in_use_hint(err: ImageError) -> anyhow::Error {
    match err {
        ImageError::InUse(_) => anyhow::anyhow!("{err}: wait for its runs to end"),
        other => other.into(),
    }
}

#[derive(Serialize)]
struct Inspected<'a> {
    #[serde(flatten)]
    record: &'a ImageRecord,
    #[serde(rename = "image_config")]
    config: &'a airlock_images::oci::ImageConfig,
}

/// A progress bar per layer on a terminal (stderr); nothing otherwise, so scripts and
/// logs see only the result line.
struct Bars {
    bar: Option<indicatif::ProgressBar>,
    terminal: bool,
}

impl Bars {
    fn new() -> Bars {
        Bars {
            bar: None,
            terminal: std::io::stderr().is_terminal(),
        }
    }
}

impl Progress for Bars {
    fn blob_started(&mut self, digest: &Digest, size: u64) {
        if !self.terminal {
            return;
        }
        let bar = indicatif::ProgressBar::new(size);
        let style = indicatif::ProgressStyle::with_template(
            "{prefix} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec}",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar());
        bar.set_style(style.progress_chars("=> "));
        bar.set_prefix(format!("sha256:{}", &digest.hex()[..12]));
        self.bar = Some(bar);
    }
    fn advanced(&mut self, bytes: u64) {
        if let Some(bar) = &self.bar {
            bar.inc(bytes);
        }
    }
    fn blob_done(&mut self) {
        if let Some(bar) = self.bar.take() {
            bar.finish();
        }
    }
}

fn print_table(images: &[ImageRecord]) {
    println!("{:<40} {:<16} {:<19} LAYERS", "NAME", "TAG", "DIGEST");
    for image in images {
        let tags = if image.tags.is_empty() {
            "-".to_string()
        } else {
            image.tags.join(",")
        };
        println!(
            "{:<40} {:<16} {:<19} {}",
            image.name,
            tags,
            format!("sha256:{}", &image.digest.hex()[..12]),
            image.layers.len()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_without_a_tag_is_recorded_as_latest_and_a_digest_is_refused() {
        let r = name_only("tools", Some("reg.test")).unwrap();
        assert_eq!(r.to_string(), "reg.test/tools:latest");
        let r = name_only("127.0.0.1:5000/tools:1", None).unwrap();
        assert_eq!(r.to_string(), "127.0.0.1:5000/tools:1");
        let digest = format!("tools@sha256:{}", "0".repeat(64));
        assert!(name_only(&digest, None).is_err());
    }
}
