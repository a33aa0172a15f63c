//! Test images imported into a test's own image store.

use airlock_images::layout::{write_layout, NewImage};
use airlock_images::oci::ProcessDefaults;
use std::path::Path;
use std::process::Command;

/// A layer (uncompressed tar) of the directory `tree`: symlinks as symlinks, owners,
/// modes and times kept.
pub fn tree_layer(tree: &Path) -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    builder.follow_symlinks(false);
    builder.mode(tar::HeaderMode::Complete);
    builder.append_dir_all(".", tree).unwrap();
    builder.into_inner().unwrap()
}

/// scripts/test-images.sh's Python image (USER 1000:1000, ENTRYPOINT python3
/// /app/tool.py, which echoes its JSON stdin) imported into the store of `state`, its
/// OCI layout written under `layouts`: its pinned reference.
pub fn python_image(state: &Path, layouts: &Path) -> String {
    let image = NewImage {
        name: Some("airlock.test/python:1".into()),
        layers: vec![tree_layer(&super::test_image_trees().join("python"))],
        gzip: false,
        defaults: ProcessDefaults {
            user: Some("1000:1000".into()),
            entrypoint: Some(vec!["python3".into(), "/app/tool.py".into()]),
            working_dir: Some("/app".into()),
            ..Default::default()
        },
    };
    write_layout(&layouts.join("python"), &image).unwrap();
    let out = Command::new(super::airlock_bin())
        .args(["image", "--state-dir"])
        .arg(state)
        .arg("import")
        .arg(layouts.join("python"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", super::output_text(&out));
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}
