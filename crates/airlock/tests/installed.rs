//! airlock installed like a tool (README, "Install"): the binary names its version and
//! commit, carries its man pages and shell completions, and runs a cell when copied
//! anywhere, away from this repository.

mod common;

use std::process::{Command, Stdio};

fn airlock(args: &[&str]) -> std::process::Output {
    Command::new(common::airlock_bin())
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

#[test]
fn version_names_the_package_version_and_the_commit() {
    let out = airlock(&["--version"]);
    let said = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let version = env!("CARGO_PKG_VERSION");
    assert!(said.starts_with(&format!("airlock {version} (")), "{said}");
    let commit = said.trim_end_matches(')').rsplit('(').next().unwrap();
    let head = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    match head {
        Some(head) => assert_eq!(commit, head, "{said}"),
        None => assert!(!commit.is_empty(), "{said}"),
    }
}

#[test]
fn man_pages_and_completions_come_from_the_binary() {
    let dir = tempfile::tempdir().unwrap();
    let out = airlock(&["man", dir.path().to_str().unwrap()]);
    assert!(out.status.success(), "{}", common::output_text(&out));
    for page in ["airlock.1", "airlock-run.1", "airlock-doctor.1"] {
        let text = std::fs::read_to_string(dir.path().join(page)).unwrap();
        assert!(
            text.starts_with(".ie") || text.contains(".TH"),
            "{page}: {text}"
        );
    }
    for shell in ["bash", "zsh", "fish"] {
        let out = airlock(&["completions", shell]);
        let script = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && script.contains("doctor"),
            "{shell}: {script}"
        );
    }
}

#[test]
fn a_copy_of_the_binary_runs_a_cell_from_anywhere() {
    require_cells!();
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("airlock");
    std::fs::copy(common::airlock_bin(), &copy).unwrap();
    let out = Command::new(&copy)
        .args(["run", "--state-dir"])
        .arg(dir.path().join("state"))
        .args(["--", "/bin/echo", "from anywhere"])
        .current_dir("/")
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).as_ref()
        ),
        (Some(0), "from anywhere\n"),
        "{}",
        common::output_text(&out)
    );
}
