//! An OCI image as the cell's root, through the real binary: the images of
//! scripts/test-images.sh imported into a state directory of the test's own, then run
//! by contracts naming them pinned by digest.

mod common;

use common::images::tree_layer;

use airlock_images::layout::{write_layout, NewImage};
use airlock_images::oci::ProcessDefaults;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// The trees of scripts/test-images.sh as OCI layouts under `out` (the same images as
/// images_fixtures.rs; the Python image in two layers, so the overlay path runs).
fn test_images(out: &Path) -> PathBuf {
    let trees = common::test_image_trees();
    let user = Some("1000:1000".to_string());
    let extra = extra_layer();
    let images = [
        ("distroless", vec!["/bin/hello"], None, vec![]),
        (
            "python",
            vec!["python3", "/app/tool.py"],
            Some("/app"),
            vec![extra],
        ),
    ];
    for (name, entrypoint, workdir, more) in images {
        let mut layers = vec![tree_layer(&trees.join(name))];
        layers.extend(more);
        let image = NewImage {
            name: Some(format!("airlock.test/{name}:1")),
            layers,
            gzip: false,
            defaults: ProcessDefaults {
                user: user.clone(),
                entrypoint: Some(entrypoint.into_iter().map(String::from).collect()),
                working_dir: workdir.map(String::from),
                env: Some(vec!["FROM_IMAGE=yes".into(), "LANG=C".into()]),
                ..Default::default()
            },
        };
        write_layout(&out.join(name), &image).unwrap();
    }
    out.to_path_buf()
}

/// A second layer on top: one file of its own.
fn extra_layer() -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("layer2")).unwrap();
    std::fs::write(dir.path().join("layer2/marker"), "top layer\n").unwrap();
    tree_layer(dir.path())
}

/// Imports the layout into `state`; the pinned reference.
fn import(state: &Path, layout: &Path) -> String {
    let out = image_cmd(state, &["import", layout.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

fn image_cmd(state: &Path, args: &[&str]) -> Output {
    Command::new(common::airlock_bin())
        .args(["image", "--state-dir", state.to_str().unwrap()])
        .args(args)
        .output()
        .unwrap()
}

struct Fixture {
    state: tempfile::TempDir,
    _layouts: tempfile::TempDir,
    python: String,
    distroless: String,
}

fn fixture() -> Fixture {
    let (state, layouts) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let images = test_images(layouts.path());
    let python = import(state.path(), &images.join("python"));
    let distroless = import(state.path(), &images.join("distroless"));
    Fixture {
        state,
        _layouts: layouts,
        python,
        distroless,
    }
}

/// `airlock run` of `contract` (YAML) with `argv`, `stdin` on its stdin.
fn run(f: &Fixture, contract: &str, argv: &[&str], stdin: &str) -> Output {
    run_with(f, &[], contract, argv, stdin)
}

fn run_with(f: &Fixture, options: &[&str], contract: &str, argv: &[&str], stdin: &str) -> Output {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.yaml");
    std::fs::write(&path, contract).unwrap();
    let mut child = Command::new(common::airlock_bin())
        .args(["run", "--state-dir", f.state.path().to_str().unwrap()])
        .args(options)
        .arg("-c")
        .arg(&path)
        .args(argv)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

use common::output_text as text;

#[test]
fn the_python_tool_image_runs_its_entrypoint_as_its_user_in_its_workdir() {
    require_cells!();
    let f = fixture();
    assert!(f.python.contains("@sha256:"), "{}", f.python);
    let results = tempfile::tempdir().unwrap();
    let result = results.path().join("result.json");
    let contract = format!("image: {}\n", f.python);
    let options = ["--result", result.to_str().unwrap()];
    let out = run_with(&f, &options, &contract, &[], r#"{"n": 1}"#);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    // The result (like the store's record) carries the pinned reference and digest.
    let record: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&result).unwrap()).unwrap();
    let image = &record["plan"]["rootfs"]["image"]["oci"];
    assert_eq!(image["reference"], f.python.as_str(), "{record}");
    assert!(f.python.ends_with(image["digest"].as_str().unwrap()));
    assert_eq!(
        record["plan"]["argv"],
        serde_json::json!(["python3", "/app/tool.py"])
    );
    let answer: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(answer["echo"]["n"], 1, "{}", text(&out));
    assert_eq!(
        (answer["uid"].as_u64(), answer["gid"].as_u64()),
        (Some(1000), Some(1000))
    );
    assert_eq!(answer["cwd"], "/app");
    assert_eq!(answer["shadow"], "root:image-shadow:19000::::::\n");
}

#[test]
fn the_image_env_is_under_the_contracts_and_both_layers_are_seen() {
    require_cells!();
    let f = fixture();
    let contract = format!("image: {}\nenv:\n  LANG: C.UTF-8\n", f.python);
    let script = "import os; print(os.environ['FROM_IMAGE'], os.environ['LANG'], \
                  open('/layer2/marker').read().strip(), os.path.exists('/app/tool.py'))";
    let out = run(&f, &contract, &["python3", "-c", script], "");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "yes C.UTF-8 top layer True\n"
    );
}

#[test]
fn the_distroless_image_has_no_shell_and_its_setuid_binary_gives_no_privilege() {
    require_cells!();
    let f = fixture();
    let contract = format!("image: {}\n", f.distroless);
    let out = run(&f, &contract, &["/bin/sh", "-c", "true"], "");
    assert_eq!(out.status.code(), Some(127), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("/bin/sh: No such file"),
        "{}",
        text(&out)
    );
    let out = run(&f, &contract, &["/bin/hello-setuid"], "abc");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let answer: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (answer["uid"].as_u64(), answer["euid"].as_u64()),
        (Some(1000), Some(1000))
    );
    // The entrypoint runs when no command is given.
    let out = run(&f, &contract, &[], "xy");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let answer: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(answer["stdin_bytes"], 2);
}

#[test]
fn a_tag_is_refused_unless_tags_are_allowed_and_a_missing_image_names_pull() {
    require_cells!();
    let f = fixture();
    let out = run(&f, "image: airlock.test/python:1\n", &["true"], "");
    assert_eq!(out.status.code(), Some(125), "{}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("policy_denied") && stderr.contains("tag"),
        "{stderr}"
    );
    let missing = format!("airlock.test/none@sha256:{}", "0".repeat(64));
    let out = run(&f, &format!("image: {missing}\n"), &["true"], "");
    assert_eq!(out.status.code(), Some(125), "{}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("sandbox_unavailable") && stderr.contains("airlock image pull"),
        "{stderr}"
    );
}

#[test]
fn a_host_contract_still_requires_a_command() {
    require_cells!();
    let f = fixture();
    let out = run(&f, "image: host\n", &[], "");
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("a command is required"));
}

#[test]
fn an_image_in_use_by_a_live_cell_cannot_be_removed() {
    require_cells!();
    let f = fixture();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.yaml");
    std::fs::write(&path, format!("image: {}\n", f.python)).unwrap();
    let mut cell = Command::new(common::airlock_bin())
        .args(["run", "--state-dir", f.state.path().to_str().unwrap(), "-c"])
        .arg(&path)
        .args([
            "python3",
            "-c",
            "import time; print('up', flush=True); time.sleep(3)",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    use std::io::BufRead;
    std::io::BufReader::new(cell.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line, "up\n");
    let out = image_cmd(f.state.path(), &["rm", &f.python]);
    assert!(!out.status.success(), "removed while in use");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("in use"),
        "{}",
        text(&out)
    );
    assert!(cell.wait().unwrap().success());
    let out = image_cmd(f.state.path(), &["rm", &f.python]);
    assert!(out.status.success(), "{}", text(&out));
}

#[test]
fn no_host_file_is_reachable_and_the_boundary_holds_with_an_image_root() {
    require_cells!();
    let f = fixture();
    let marker = tempfile::Builder::new()
        .prefix("airlock-image-root-marker")
        .tempfile_in("/usr/local")
        .unwrap();
    let script = format!(
        "import os, socket\n\
         print(os.path.exists({marker:?}), os.path.exists('/usr/bin/airlock-none'))\n\
         caps = [l for l in open('/proc/self/status') if l.startswith(('CapEff', 'CapPrm'))]\n\
         print(all(l.split()[1] == '0000000000000000' for l in caps))\n\
         for p in ('/usr/x', '/app/x', '/etc/x'):\n\
         \x20   try:\n\
         \x20       open(p, 'w'); print('wrote', p)\n\
         \x20   except OSError as e: print('refused', p)\n\
         try:\n\
         \x20   socket.create_connection(('1.1.1.1', 80), timeout=2); print('net')\n\
         except OSError: print('no network')\n",
        marker = marker.path().to_str().unwrap()
    );
    let out = run(
        &f,
        &format!("image: {}\n", f.python),
        &["python3", "-c", &script],
        "",
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "False False\nTrue\nrefused /usr/x\nrefused /app/x\nrefused /etc/x\nno network\n"
    );
}
