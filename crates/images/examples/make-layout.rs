//! Writes an OCI image layout from directory trees, one layer per tree, bottom first:
//!
//! ```text
//! cargo run -p airlock-images --example make-layout -- OUT [--name REF] [--user U]
//!     [--entrypoint ARG]... [--cmd ARG]... [--env K=V]... [--workdir DIR] TREE...
//! ```
//!
//! What scripts/test-images.sh and scripts/bench-images.sh build their images with: there
//! is no public registry, and no docker, on the machines they run on. Symlinks are stored
//! as symlinks; owners, modes (setuid included: the unpacker drops it) and times are kept.

use airlock_images::layout::{write_layout, NewImage};
use airlock_images::oci::ProcessDefaults;
use std::path::PathBuf;

fn layer(tree: &PathBuf) -> std::io::Result<Vec<u8>> {
    let mut builder = tar::Builder::new(Vec::new());
    builder.follow_symlinks(false);
    builder.mode(tar::HeaderMode::Complete);
    builder.append_dir_all(".", tree)?;
    builder.into_inner()
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let out = PathBuf::from(
        args.next()
            .ok_or("usage: make-layout OUT [options] TREE...")?,
    );
    let mut image = NewImage {
        gzip: true,
        ..Default::default()
    };
    let mut defaults = ProcessDefaults::default();
    let mut trees = Vec::new();
    while let Some(arg) = args.next() {
        let mut value = || args.next().ok_or(format!("{arg} needs a value"));
        match arg.as_str() {
            "--name" => image.name = Some(value()?),
            "--user" => defaults.user = Some(value()?),
            "--workdir" => defaults.working_dir = Some(value()?),
            "--entrypoint" => defaults
                .entrypoint
                .get_or_insert_with(Vec::new)
                .push(value()?),
            "--cmd" => defaults.cmd.get_or_insert_with(Vec::new).push(value()?),
            "--env" => defaults.env.get_or_insert_with(Vec::new).push(value()?),
            "--no-gzip" => image.gzip = false,
            tree => trees.push(PathBuf::from(tree)),
        }
    }
    image.defaults = defaults;
    for tree in &trees {
        image.layers.push(layer(tree)?);
    }
    std::fs::create_dir_all(&out)?;
    let written = write_layout(&out, &image)?;
    println!("{}", written.manifest);
    Ok(())
}
