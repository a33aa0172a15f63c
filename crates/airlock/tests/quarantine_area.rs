//! A quarantine area that is not private fails closed: the evidence of a suspected
//! escape could not be kept in it, so every run is refused (`sandbox_unavailable`,
//! recorded, before any cell) until the operator mends it, instead of running without
//! its quarantine (docs/policy.md, "Failure handling").

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

fn run(dir: &Path, state: &Path) -> common::CellRun {
    let state = state.to_str().unwrap();
    common::run_in(dir, None, &["--state-dir", state], &["/bin/true"])
}

#[test]
fn a_quarantine_area_open_to_others_or_not_a_directory_refuses_every_run() {
    require_cells!();
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let area = state.join("quarantine");
    std::fs::create_dir_all(&area).unwrap();

    std::fs::set_permissions(&area, std::fs::Permissions::from_mode(0o755)).unwrap();
    let refused = run(dir.path(), &state);
    assert_eq!(
        refused.status(),
        "sandbox_unavailable",
        "{}",
        refused.describe()
    );
    assert_ne!(refused.code(), 0, "{}", refused.describe());
    assert!(
        refused.stderr().contains("quarantine area") && refused.stderr().contains("755"),
        "{}",
        refused.describe()
    );
    // The refusal is a record like any other.
    let listed = std::process::Command::new(common::airlock_bin())
        .args(["runs", "list", "--json", "--state-dir"])
        .arg(&state)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&listed.stdout);
    assert!(text.contains("sandbox_unavailable"), "{text}");

    // A link to a private directory is no private directory of the state.
    let elsewhere = dir.path().join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    std::fs::set_permissions(&elsewhere, std::fs::Permissions::from_mode(0o700)).unwrap();
    std::fs::remove_dir(&area).unwrap();
    std::os::unix::fs::symlink(&elsewhere, &area).unwrap();
    let refused = run(dir.path(), &state);
    assert_eq!(
        refused.status(),
        "sandbox_unavailable",
        "{}",
        refused.describe()
    );
    assert!(
        refused.stderr().contains("not a directory"),
        "{}",
        refused.describe()
    );

    // Mended, the same run runs.
    std::fs::remove_file(&area).unwrap();
    std::fs::create_dir(&area).unwrap();
    std::fs::set_permissions(&area, std::fs::Permissions::from_mode(0o700)).unwrap();
    let ran = run(dir.path(), &state);
    assert_eq!((ran.status(), ran.code()), ("ok", 0), "{}", ran.describe());
}
