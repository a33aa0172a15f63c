//! `airlock image` through the real binary: import (layout directory, tar, tampered),
//! ls, inspect, rm (refused while a live cell's lease is held), gc.

mod common;

use airlock_images::layout::{write_layout, NewImage};
use airlock_images::oci::ProcessDefaults;
use airlock_images::{ImageStore, Limits};
use std::path::Path;
use std::process::{Command, Output};

fn airlock(state: &Path, args: &[&str]) -> Output {
    Command::new(common::airlock_bin())
        .arg("image")
        .args(["--state-dir", state.to_str().unwrap()])
        .args(args)
        .output()
        .unwrap()
}

use common::output_text as text;

fn layer(files: &[(&str, &str)]) -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    for (path, content) in files {
        let mut header = tar::Header::new_ustar();
        header.set_size(content.len() as u64);
        header.set_mode(0o644);
        builder
            .append_data(&mut header, path, content.as_bytes())
            .unwrap();
    }
    builder.into_inner().unwrap()
}

fn tool_image(dir: &Path, name: &str) -> airlock_images::layout::Written {
    let image = NewImage {
        name: Some(name.to_string()),
        layers: vec![
            layer(&[("etc/os-release", "ID=test\n")]),
            layer(&[("app/tool.py", "print(1)\n")]),
        ],
        gzip: true,
        defaults: ProcessDefaults {
            user: Some("1000:1000".into()),
            entrypoint: Some(vec!["python3".into(), "/app/tool.py".into()]),
            ..Default::default()
        },
    };
    write_layout(dir, &image).unwrap()
}

#[test]
fn an_imported_image_is_listed_inspected_removed_and_collected() {
    require_cells!();
    let (state, src) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let written = tool_image(src.path(), "reg.test/tools:1");
    let out = airlock(state.path(), &["import", src.path().to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out));
    let pinned = format!("reg.test/tools@{}", written.manifest);
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), pinned);

    let out = airlock(state.path(), &["ls"]);
    assert!(out.status.success(), "{}", text(&out));
    let listing = String::from_utf8_lossy(&out.stdout);
    assert!(
        listing.contains("reg.test/tools") && listing.contains(&written.manifest.hex()[..12]),
        "{listing}"
    );

    let out = airlock(state.path(), &["inspect", "reg.test/tools:1"]);
    assert!(out.status.success(), "{}", text(&out));
    let inspected: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(inspected["digest"], written.manifest.to_string());
    assert_eq!(inspected["image_config"]["config"]["User"], "1000:1000");
    assert_eq!(inspected["layers"].as_array().unwrap().len(), 2);

    let out = airlock(state.path(), &["rm", &pinned]);
    assert!(out.status.success(), "{}", text(&out));
    let out = airlock(state.path(), &["gc"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).starts_with("removed 4 blobs and 2 layers"),
        "{}",
        text(&out)
    );
    let layers = std::fs::read_dir(state.path().join("images/layers"))
        .unwrap()
        .count();
    assert_eq!(layers, 0);
}

#[test]
fn rm_of_an_image_a_live_cell_holds_is_refused() {
    require_cells!();
    let (state, src) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    tool_image(src.path(), "reg.test/tools:1");
    let out = airlock(state.path(), &["import", src.path().to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out));
    // What a running cell holds: the store's lease on its image.
    let store = ImageStore::open(state.path(), Limits::default()).unwrap();
    let lease = store
        .lease(&store.find("reg.test/tools:1").unwrap())
        .unwrap();
    let out = airlock(state.path(), &["rm", "reg.test/tools:1"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("in use by a running cell"),
        "{}",
        text(&out)
    );
    let out = airlock(state.path(), &["gc"]);
    assert!(
        String::from_utf8_lossy(&out.stdout).starts_with("removed 0 blobs and 0 layers"),
        "{}",
        text(&out)
    );
    drop(lease);
    let out = airlock(state.path(), &["rm", "reg.test/tools:1"]);
    assert!(out.status.success(), "{}", text(&out));
}

#[test]
fn a_tampered_layer_blob_is_refused_on_import() {
    require_cells!();
    let (state, src) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let written = tool_image(src.path(), "reg.test/tools:1");
    let blob = src
        .path()
        .join("blobs/sha256")
        .join(written.layer_blobs[1].hex());
    let mut bytes = std::fs::read(&blob).unwrap();
    let at = bytes.len() / 2;
    bytes[at] ^= 1;
    std::fs::write(&blob, bytes).unwrap();
    let out = airlock(state.path(), &["import", src.path().to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!("blob {}", written.layer_blobs[1])) && stderr.contains("refused"),
        "{stderr}"
    );
    let out = airlock(state.path(), &["ls", "--json"]);
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "[]");
}

#[test]
fn an_archive_without_a_name_needs_one_and_a_bad_limit_is_refused() {
    require_cells!();
    let (state, src) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let layout = src.path().join("layout");
    let image = NewImage {
        name: None,
        layers: vec![layer(&[("a", "b")])],
        gzip: false,
        defaults: Default::default(),
    };
    let written = write_layout(&layout, &image).unwrap();
    let out = airlock(state.path(), &["import", layout.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--name"),
        "{}",
        text(&out)
    );
    let config = src.path().join("airlock.toml");
    std::fs::write(&config, "[images]\ndefault_registry = \"reg.test:5000\"\n").unwrap();
    let args = [
        "--config",
        config.to_str().unwrap(),
        "import",
        "--name",
        "local/tool",
        layout.to_str().unwrap(),
    ];
    let out = airlock(state.path(), &args);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("reg.test:5000/local/tool@{}", written.manifest)
    );
    std::fs::write(&config, "[images]\nmax_entries = 0\n").unwrap();
    let out = airlock(state.path(), &["--config", config.to_str().unwrap(), "ls"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("images.max_entries = 0"),
        "{}",
        text(&out)
    );
}
