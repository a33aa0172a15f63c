//! The test images of scripts/test-images.sh (a distroless static binary, a Python tool
//! image made from the host's python3), imported through the real binary: real trees
//! (symlinked interpreters, shared libraries, a sticky /tmp, a setuid file) unpack into a
//! root that works, with the setuid bit gone and the image's own /etc/shadow.
//! (These check the unpacked trees with chroot; image_root.rs runs them as cell roots.)

mod common;

use common::images::tree_layer;

use airlock_images::layout::{write_layout, NewImage};
use airlock_images::oci::ProcessDefaults;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The trees of scripts/test-images.sh (built once, cached), as OCI layouts written here
/// in-process: the script runs no cargo (this test runs under `cargo test`'s lock).
fn test_images(out: &Path) -> PathBuf {
    let trees = common::test_image_trees();
    let user = Some("1000:1000".to_string());
    let images = [
        ("distroless", vec!["/bin/hello"], None),
        ("python", vec!["python3", "/app/tool.py"], Some("/app")),
    ];
    for (name, entrypoint, workdir) in images {
        let image = NewImage {
            name: Some(format!("airlock.test/{name}:1")),
            layers: vec![tree_layer(&trees.join(name))],
            gzip: false,
            defaults: ProcessDefaults {
                user: user.clone(),
                entrypoint: Some(entrypoint.into_iter().map(String::from).collect()),
                working_dir: workdir.map(String::from),
                ..Default::default()
            },
        };
        write_layout(&out.join(name), &image).unwrap();
    }
    out.to_path_buf()
}

/// Imports the layout and returns the (single) unpacked layer's directory.
fn import(state: &Path, layout: &Path) -> PathBuf {
    let out = Command::new(common::airlock_bin())
        .args(["image", "--state-dir", state.to_str().unwrap(), "import"])
        .arg(layout)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let pinned = String::from_utf8(out.stdout).unwrap().trim().to_string();
    let out = Command::new(common::airlock_bin())
        .args([
            "image",
            "--state-dir",
            state.to_str().unwrap(),
            "inspect",
            &pinned,
        ])
        .output()
        .unwrap();
    let record: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let diff_id = record["layers"][0]["diff_id"].as_str().unwrap();
    state
        .join("images/layers")
        .join(diff_id.strip_prefix("sha256:").unwrap())
}

fn chroot(root: &Path, argv: &[&str], stdin: &str) -> serde_json::Value {
    let mut child = Command::new("/usr/sbin/chroot")
        .arg("--userspec=1000:1000")
        .arg(root)
        .args(argv)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .env_clear()
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn the_python_tool_image_unpacks_into_a_working_root_with_its_own_shadow() {
    require_cells!();
    let (state, layouts) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let images = test_images(layouts.path());
    let root = import(state.path(), &images.join("python"));
    let answer = chroot(&root, &["/usr/bin/python3", "/app/tool.py"], r#"{"n": 1}"#);
    assert_eq!(answer["echo"]["n"], 1);
    assert_eq!(
        (answer["uid"].as_u64(), answer["gid"].as_u64()),
        (Some(1000), Some(1000))
    );
    assert_eq!(answer["shadow"], "root:image-shadow:19000::::::\n");
    use std::os::unix::fs::MetadataExt;
    let tmp = std::fs::metadata(root.join("tmp")).unwrap();
    assert_eq!(tmp.mode() & 0o7777, 0o1777);
}

#[test]
fn the_distroless_image_has_no_shell_and_its_setuid_file_is_not_setuid() {
    require_cells!();
    let (state, layouts) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let images = test_images(layouts.path());
    let root = import(state.path(), &images.join("distroless"));
    assert!(!root.join("bin/sh").exists());
    use std::os::unix::fs::MetadataExt;
    let mode = std::fs::metadata(root.join("bin/hello-setuid"))
        .unwrap()
        .mode();
    assert_eq!(mode & 0o7777, 0o755, "the layer said 04755");
    let answer = chroot(&root, &["/bin/hello-setuid"], "abc");
    assert_eq!(
        (answer["uid"].as_u64(), answer["euid"].as_u64()),
        (Some(1000), Some(1000))
    );
    assert_eq!(answer["stdin_bytes"], 3);
}
