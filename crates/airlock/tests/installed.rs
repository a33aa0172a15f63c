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

/// `packaging/deb/build-deb.sh --binary` with this build's binary: the .deb's path, or
/// `None` when cargo-deb is missing and CI did not ask for every test (`.ci/run`
/// installs it).
fn debian_package(out: &std::path::Path) -> Option<std::path::PathBuf> {
    let has_cargo_deb = Command::new("cargo")
        .args(["deb", "--version"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !has_cargo_deb {
        let why = "cargo-deb is not installed (cargo install cargo-deb --locked)";
        if std::env::var_os(common::REQUIRE_ROOT_VAR).is_some() {
            panic!("{why}, and {} is set", common::REQUIRE_ROOT_VAR);
        }
        eprintln!("SKIPPED: the .deb test: {why}");
        return None;
    }
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../packaging/deb/build-deb.sh");
    let built = Command::new(script)
        .arg("--binary")
        .arg(common::airlock_bin())
        .arg("--out")
        .arg(out)
        // gzip at a low level: what is checked here is the package, not its compression.
        // (Stripping the debug build's binary, ~375 MB, is most of this test's time: one
        // to six minutes here depending on the load.)
        .arg("--fast")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(built.status.success(), "{}", common::output_text(&built));
    let deb = String::from_utf8_lossy(&built.stdout).trim().to_string();
    Some(std::path::PathBuf::from(deb))
}

fn dpkg(tool: &str, args: &[&std::ffi::OsStr]) -> String {
    let out = Command::new(tool)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{tool} {args:?}: {}",
        common::output_text(&out)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `(mode, owner, path)` of each entry of `dpkg-deb --contents`.
fn package_entries(listing: &str) -> Vec<(String, String, String)> {
    listing
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let path = fields.get(5)?.trim_start_matches('.');
            Some((
                fields[0].to_string(),
                fields[1].to_string(),
                path.to_string(),
            ))
        })
        .collect()
}

#[test]
fn the_debian_package_holds_what_it_should_and_installs_into_a_throwaway_root() {
    require_cells!();
    let dir = tempfile::tempdir().unwrap();
    let Some(deb) = debian_package(&dir.path().join("out")) else {
        return;
    };
    let deb_arg = deb.as_os_str();

    let info = dpkg("dpkg-deb", &["--info".as_ref(), deb_arg]);
    for field in [
        "Package: airlock",
        &format!("Version: {}", env!("CARGO_PKG_VERSION")),
        "Architecture: amd64",
        "Section: admin",
    ] {
        assert!(info.contains(field), "{field}\n{info}");
    }
    // A static-pie binary: dpkg-shlibdeps finds no dependency, and no maintainer script
    // runs.
    assert!(
        info.lines()
            .all(|l| !l.trim_start().starts_with("Depends:") || l.trim() == "Depends:"),
        "{info}"
    );
    for script in ["preinst", "postinst", "prerm", "postrm"] {
        assert!(!info.contains(&format!(" {script} ")), "{script}\n{info}");
    }
    let conffiles = dpkg(
        "dpkg-deb",
        &["--info".as_ref(), deb_arg, "conffiles".as_ref()],
    );
    assert_eq!(conffiles.trim(), "/etc/apparmor.d/airlock");

    let entries = package_entries(&dpkg("dpkg-deb", &["--contents".as_ref(), deb_arg]));
    let mode_of = |path: &str| {
        entries
            .iter()
            .find(|(_, _, p)| p == path)
            .map(|(mode, _, _)| mode.as_str())
            .unwrap_or_else(|| panic!("{path} is not in the package: {entries:#?}"))
    };
    assert_eq!(mode_of("/usr/bin/airlock"), "-rwxr-xr-x");
    for file in [
        "/usr/share/man/man1/airlock.1.gz",
        "/usr/share/man/man1/airlock-run.1.gz",
        "/usr/share/man/man1/airlock-doctor.1.gz",
        "/usr/share/bash-completion/completions/airlock",
        "/usr/share/zsh/vendor-completions/_airlock",
        "/usr/share/fish/vendor_completions.d/airlock.fish",
        "/lib/systemd/system/airlock.service",
        "/etc/apparmor.d/airlock",
        "/usr/share/doc/airlock/copyright",
        "/usr/share/doc/airlock/README.md",
        "/usr/share/doc/airlock/threat-model.md",
    ] {
        assert_eq!(mode_of(file), "-rw-r--r--", "{file}");
    }
    for (mode, owner, path) in &entries {
        // dpkg-deb prints owners by id or by name, depending on the archive.
        assert!(owner == "0/0" || owner == "root/root", "{owner} {path}");
        let group_or_other_write = mode.as_bytes()[5] == b'w' || mode.as_bytes()[8] == b'w';
        assert!(!group_or_other_write, "{mode} {path}");
    }

    // Installed with dpkg into an empty root of its own (no maintainer scripts, so
    // nothing runs in it or on this host).
    let root = dir.path().join("root");
    for sub in ["var/lib/dpkg/info", "var/lib/dpkg/updates"] {
        std::fs::create_dir_all(root.join(sub)).unwrap();
    }
    std::fs::write(root.join("var/lib/dpkg/status"), "").unwrap();
    let root_arg = format!("--root={}", root.display());
    dpkg(
        "dpkg",
        &[
            root_arg.as_ref(),
            "--log=/dev/null".as_ref(),
            "-i".as_ref(),
            deb_arg,
        ],
    );
    let status = dpkg(
        "dpkg",
        &[root_arg.as_ref(), "-s".as_ref(), "airlock".as_ref()],
    );
    assert!(status.contains("Status: install ok installed"), "{status}");

    let installed = root.join("usr/bin/airlock");
    let run = |args: &[&str]| {
        Command::new(&installed)
            .args(args)
            .current_dir("/")
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .stdin(Stdio::null())
            .output()
            .unwrap()
    };
    let version = run(&["--version"]);
    assert!(
        String::from_utf8_lossy(&version.stdout)
            .starts_with(&format!("airlock {} (", env!("CARGO_PKG_VERSION"))),
        "{}",
        common::output_text(&version)
    );
    let doctor = run(&["doctor"]);
    let said = common::output_text(&doctor);
    assert!(
        said.contains("ok   cell.end_to_end") && said.contains("ok   landlock"),
        "{said}"
    );
    let state = dir.path().join("state");
    let cell = run(&[
        "run",
        "--state-dir",
        state.to_str().unwrap(),
        "--",
        "/bin/echo",
        "packaged",
    ]);
    assert_eq!(
        (
            cell.status.code(),
            String::from_utf8_lossy(&cell.stdout).as_ref()
        ),
        (Some(0), "packaged\n"),
        "{}",
        common::output_text(&cell)
    );
    let unit = std::fs::read_to_string(root.join("lib/systemd/system/airlock.service")).unwrap();
    assert!(unit.contains("ExecStart=/usr/bin/airlock serve "), "{unit}");
    let completion = Command::new("bash")
        .arg("-c")
        .arg(format!(
            "source {}/usr/share/bash-completion/completions/airlock && complete -p airlock",
            root.display()
        ))
        .output()
        .unwrap();
    assert!(
        completion.status.success(),
        "{}",
        common::output_text(&completion)
    );

    // Purged, nothing of it is left in the root but dpkg's own database.
    dpkg(
        "dpkg",
        &[
            root_arg.as_ref(),
            "--log=/dev/null".as_ref(),
            "-P".as_ref(),
            "airlock".as_ref(),
        ],
    );
    let left: Vec<String> = walk(&root)
        .into_iter()
        .filter(|p| !p.starts_with(root.join("var/lib/dpkg")))
        .filter(|p| !p.is_dir())
        .map(|p| p.display().to_string())
        .collect();
    assert!(left.is_empty(), "left after purge: {left:#?}");
}

/// Every path below `dir`.
fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            found.extend(walk(&path));
        }
        found.push(path);
    }
    found
}
