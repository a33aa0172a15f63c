//! Names the commit the binary was built from, for `airlock --version`: `git` when the
//! source is a checkout, else `AIRLOCK_COMMIT` from the environment (a source package),
//! else `unknown`.

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
        .filter(|s| !s.is_empty())
}

fn main() {
    let commit = git(&["rev-parse", "--short=12", "HEAD"])
        .or_else(|| std::env::var("AIRLOCK_COMMIT").ok())
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=AIRLOCK_COMMIT={commit}");
    println!("cargo:rerun-if-env-changed=AIRLOCK_COMMIT");
    // A new commit moves HEAD or the branch it names.
    for path in ["HEAD", "refs/heads"] {
        if let Some(file) = git(&["rev-parse", "--git-path", path]) {
            println!("cargo:rerun-if-changed={file}");
        }
    }
}
