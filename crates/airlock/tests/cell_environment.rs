//! What ordinary software needs from a cell that is not a boundary: the `/etc` files
//! programs read (and none of the host's secrets), read-only inputs that appear owned by
//! the cell identity (and stay read-only and nosuid), usable `/dev/stdout` and
//! `/dev/stderr`, and a `/dev/shm` sized by the contract whose exhaustion is reported as
//! the `shm` ceiling. Every test runs the real binary with its own `--state-dir`.
mod common;

use airlock_contract::{ETC_DENIED, HOST_ETC_ENTRIES, HOST_ETC_EXCLUDED};
use common::CellRun;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

/// `airlock run --state-dir <dir>/state [--contract <yaml>] -- argv` in `dir`.
fn run_with(dir: &Path, contract: Option<&str>, argv: &[&str]) -> CellRun {
    let state = dir.join("state");
    let state = state.to_str().unwrap();
    common::run_in(dir, contract, &["--state-dir", state], argv)
}

fn sh_with(dir: &Path, contract: Option<&str>, script: &str) -> CellRun {
    run_with(dir, contract, &["/bin/sh", "-c", script])
}

fn assert_ok(run: &CellRun) {
    assert_eq!((run.code(), run.status()), (0, "ok"), "{}", run.describe());
}

/// Enough memory and `/tmp` for a JVM and a git clone.
const ROOMY: &str = "resources: { memory_mb: 1024 }\n\
                     filesystem:\n  writable_paths: [{ path: /tmp, size_mb: 64 }]\n";

// ---- /etc ---------------------------------------------------------------------------

#[test]
fn javac_compiles_and_java_runs_a_hello_world() {
    require_cells!();
    let dir = tempfile::tempdir().unwrap();
    let run = sh_with(
        dir.path(),
        Some(ROOMY),
        "cd /tmp && printf 'class Hello { public static void main(String[] a) { \
         System.out.println(\"hello from java\"); } }' > Hello.java && javac Hello.java && java -cp /tmp Hello",
    );
    assert_ok(&run);
    assert!(
        run.stdout().contains("hello from java"),
        "{}",
        run.describe()
    );
}

#[test]
fn tls_locale_network_databases_and_os_identification_work() {
    require_cells!();
    let dir = tempfile::tempdir().unwrap();
    let run = sh_with(
        dir.path(),
        None,
        "set -e\n\
         python3 -c 'import ssl, locale; ssl.create_default_context(); print(\"py\", locale.getpreferredencoding())'\n\
         openssl version -d\n\
         test -r \"$(openssl version -d | sed 's/.*\"\\(.*\\)\"/\\1/')/openssl.cnf\"\n\
         getent services http\n\
         grep -q '^tcp' /etc/protocols\n\
         grep '^ID=' /etc/os-release\n\
         test -r /usr/share/locale/locale.alias\n\
         for f in /usr/lib/python3*/sitecustomize.py; do test ! -L \"$f\" || test -r \"$f\"; done\n",
    );
    assert_ok(&run);
    let out = run.stdout();
    for expected in ["py UTF-8", "OPENSSLDIR", "80/tcp", "ID="] {
        assert!(out.contains(expected), "{expected}: {}", run.describe());
    }
}

/// `path` (absolute) made lexical: `.` and `..` resolved without following symlinks.
fn lexical(path: &Path) -> PathBuf {
    let mut out = PathBuf::from("/");
    for component in path.components() {
        match component {
            Component::ParentDir => {
                out.pop();
            }
            Component::Normal(part) => out.push(part),
            _ => {}
        }
    }
    out
}

/// Every symlink below the host's `dir` (not crossing into other filesystems' special
/// trees) whose target lies in `/etc`: (link, target).
fn symlinks_into_etc(dir: &Path, found: &mut Vec<(PathBuf, PathBuf)>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let Ok(kind) = entry.file_type() else {
            continue;
        };
        if kind.is_dir() {
            symlinks_into_etc(&path, found);
        } else if kind.is_symlink() {
            let Ok(link) = std::fs::read_link(&path) else {
                continue;
            };
            let target = lexical(&dir.join(link));
            if target.starts_with("/etc") {
                found.push((path, target));
            }
        }
    }
}

/// Whether `target` (under `/etc`) is one of `names` (relative to `/etc`) or inside one.
fn under_any(target: &Path, names: &[&str]) -> bool {
    names
        .iter()
        .any(|name| target.starts_with(Path::new("/etc").join(name)))
}

/// Provided, excluded with a reason, denied (a secret), or a directory whose every host entry is one of the
/// two (`/usr/share/maven/conf -> /etc/maven`).
fn accounted_for(target: &Path, excluded: &[&str]) -> bool {
    if under_any(target, HOST_ETC_ENTRIES)
        || under_any(target, excluded)
        || under_any(target, ETC_DENIED)
    {
        return true;
    }
    match std::fs::read_dir(target) {
        Ok(entries) if target != Path::new("/etc") => entries
            .flatten()
            .all(|e| accounted_for(&e.path(), excluded)),
        _ => false,
    }
}

fn host_symlinks_into_etc() -> Vec<(PathBuf, PathBuf)> {
    let mut found = Vec::new();
    for dir in ["/usr", "/opt"] {
        symlinks_into_etc(Path::new(dir), &mut found);
    }
    found
}

#[test]
fn every_host_symlink_into_etc_is_provided_or_excluded_with_a_reason() {
    // No cell: this checks the vetted list against this host.
    let excluded: Vec<&str> = HOST_ETC_EXCLUDED.iter().map(|(name, _)| *name).collect();
    assert!(HOST_ETC_EXCLUDED.iter().all(|(_, why)| !why.is_empty()));
    let links = host_symlinks_into_etc();
    let unaccounted: Vec<String> = links
        .iter()
        .filter(|(_, target)| !accounted_for(target, &excluded))
        .map(|(link, target)| format!("{} -> {}", link.display(), target.display()))
        .collect();
    assert!(
        unaccounted.is_empty(),
        "host symlinks into /etc that airlock_contract::HOST_ETC_ENTRIES neither provides \
         nor HOST_ETC_EXCLUDED excludes with a reason:\n{}",
        unaccounted.join("\n")
    );
}

#[test]
fn provided_host_symlinks_into_etc_resolve_in_the_cell() {
    require_cells!();
    // The links whose target the host has and the cell is meant to get.
    let mut links: Vec<String> = host_symlinks_into_etc()
        .into_iter()
        .filter(|(link, target)| {
            under_any(target, HOST_ETC_ENTRIES) && std::fs::metadata(link).is_ok()
        })
        .map(|(link, _)| link.display().to_string())
        .collect();
    links.sort();
    links.dedup();
    assert!(!links.is_empty(), "the host has no /usr symlink into /etc?");
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("links"), links.join("\n") + "\n").unwrap();
    let contract = format!(
        "filesystem:\n  readonly_inputs: [{{ source: {}/links, target: /links }}]\n",
        dir.path().display()
    );
    let run = sh_with(
        dir.path(),
        Some(&contract),
        "while read -r l; do test -e \"$l\" || echo \"dangling $l\"; done < /links",
    );
    assert_ok(&run);
    assert_eq!(run.stdout(), "", "{}", run.describe());
}

#[test]
fn secrets_and_the_hosts_identity_are_absent_from_etc() {
    require_cells!();
    let dir = tempfile::tempdir().unwrap();
    // Exit 0 of this probe would be a breach: it fails on anything it finds.
    let run = sh_with(
        dir.path(),
        None,
        "found=0\n\
         for p in shadow shadow- gshadow gshadow- sudoers sudoers.d ssh ssl/private machine-id \
                  security pam.d subuid subgid gitconfig pip.conf npmrc environment; do\n\
           if [ -e /etc/$p ] || [ -L /etc/$p ]; then echo \"present /etc/$p\"; found=1; fi\n\
         done\n\
         exit $found",
    );
    assert_ok(&run);
    assert!(
        std::path::Path::new("/etc/shadow").exists(),
        "the host has one"
    );
}

#[test]
fn a_contract_added_etc_file_is_visible_and_read_only() {
    require_cells!();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("app.conf"), "setting = 42\n").unwrap();
    let contract =
        "filesystem:\n  etc_files:\n    - { source: app.conf, target: /etc/app/app.conf }\n";
    let run = sh_with(
        dir.path(),
        Some(contract),
        "cat /etc/app/app.conf\n\
         if echo tampered >> /etc/app/app.conf; then echo WROTE; exit 1; fi\n\
         grep -q ' /etc/app/app.conf ro,nosuid,nodev,noexec' /proc/self/mountinfo && echo read-only",
    );
    assert_ok(&run);
    assert!(run.stdout().contains("setting = 42"), "{}", run.describe());
    assert!(run.stdout().contains("read-only"), "{}", run.describe());
    assert_eq!(
        std::fs::read_to_string(dir.path().join("app.conf")).unwrap(),
        "setting = 42\n"
    );
}

#[test]
fn a_contract_cannot_add_a_secret_a_path_outside_etc_or_a_generated_file() {
    require_cells!();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("x"), "x\n").unwrap();
    let contract = "filesystem:\n  etc_files:\n    - /etc/shadow\n    - { source: x, target: /opt/x }\n    \
                    - { source: x, target: /etc/passwd }\n    - { source: /etc/gshadow, target: /etc/g }\n";
    let run = run_with(dir.path(), Some(contract), &["/bin/echo", "PAYLOAD-RAN"]);
    assert_eq!(run.code(), 125, "{}", run.describe());
    assert!(!run.stdout().contains("PAYLOAD-RAN"), "{}", run.describe());
    for expected in [
        "filesystem.etc_files[0]: /etc/shadow is a secret or the host's identity: never given to a cell",
        "filesystem.etc_files[1].target: must lie under /etc",
        "filesystem.etc_files[2].target: /etc/passwd is generated by the runtime and cannot be replaced",
        "filesystem.etc_files[3].source: /etc/gshadow is a secret or the host's identity",
    ] {
        assert!(run.stderr().contains(expected), "{expected}\n{}", run.describe());
    }
}

// ---- ownership of read-only inputs --------------------------------------------------

/// A git repository created by the host (as root) with one commit, and a 0600 file.
fn host_repo(dir: &Path) -> PathBuf {
    let repo = dir.join("repo");
    std::fs::create_dir(&repo).unwrap();
    let git = |args: &[&str]| {
        let status = std::process::Command::new("git")
            .arg("-C")
            .arg(&repo)
            .args(["-c", "user.name=host", "-c", "user.email=host@example.test"])
            .args(args)
            .stdout(std::process::Stdio::null())
            .status()
            .unwrap();
        assert!(status.success(), "git {args:?}");
    };
    git(&["init", "-q"]);
    std::fs::write(repo.join("README"), "from the host\n").unwrap();
    git(&["add", "README"]);
    git(&["commit", "-q", "-m", "host commit"]);
    repo
}

fn input_contract(source: &Path) -> String {
    format!(
        "{ROOMY}  readonly_inputs: [{{ source: {}, target: /input }}]\n",
        source.display()
    )
}

#[test]
fn git_works_on_a_read_only_input_the_host_owns() {
    require_cells!();
    let dir = tempfile::tempdir().unwrap();
    let repo = host_repo(dir.path());
    let host_owner = std::fs::metadata(&repo).unwrap().uid();
    let run = sh_with(
        dir.path(),
        Some(&input_contract(&repo)),
        "set -e\n\
         git -C /input log --format=%s\n\
         git clone -q /input /tmp/clone && cat /tmp/clone/README\n\
         stat -c 'owner %u:%g' /input /input/README /input/.git/HEAD\n\
         if touch /input/new 2>/dev/null; then echo WROTE; exit 1; fi\n\
         if echo x >> /input/README; then echo WROTE; exit 1; fi\n\
         echo still-read-only",
    );
    assert_ok(&run);
    let out = run.stdout();
    assert!(out.contains("host commit"), "{}", run.describe());
    assert!(out.contains("from the host"), "{}", run.describe());
    assert!(
        !run.stderr().contains("dubious ownership"),
        "{}",
        run.describe()
    );
    assert_eq!(
        out.matches("owner 10001:10001").count(),
        3,
        "{}",
        run.describe()
    );
    assert!(out.contains("still-read-only"), "{}", run.describe());
    // The view changed nothing on the host.
    for path in [repo.clone(), repo.join("README"), repo.join(".git/HEAD")] {
        assert_eq!(std::fs::metadata(&path).unwrap().uid(), host_owner);
    }
    assert_eq!(
        std::fs::read_to_string(repo.join("README")).unwrap(),
        "from the host\n"
    );
}

#[test]
fn a_setuid_file_in_an_idmapped_input_does_not_elevate() {
    require_cells!();
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("input");
    std::fs::create_dir(&input).unwrap();
    let suid = input.join("suid-id");
    std::fs::copy("/usr/bin/id", &suid).unwrap();
    std::fs::set_permissions(&suid, std::fs::Permissions::from_mode(0o4755)).unwrap();
    // Probe: exit 0 only when the setuid bit gave nothing and the mount is nosuid.
    let run = sh_with(
        dir.path(),
        Some(&input_contract(&input)),
        "test -u /input/suid-id || exit 3\n\
         test \"$(/input/suid-id -u)\" = \"$(id -ru)\" || { echo ELEVATED; exit 1; }\n\
         grep ' /input ' /proc/self/mountinfo | grep -q 'ro,nosuid,nodev' || exit 4\n\
         grep ' /input ' /proc/self/mountinfo | grep -q idmapped && echo idmapped",
    );
    assert_ok(&run);
    assert!(run.stdout().contains("idmapped"), "{}", run.describe());
    let meta = std::fs::metadata(&suid).unwrap();
    assert_eq!((meta.uid(), meta.mode() & 0o7777), (0, 0o4755));
}

#[test]
fn an_input_on_a_filesystem_without_idmapped_mounts_keeps_host_owners_and_says_so() {
    require_cells!();
    let dir = tempfile::tempdir().unwrap();
    // sysfs has no idmapped mounts.
    let contract = "filesystem:\n  readonly_inputs: [{ source: /sys/kernel/mm, target: /mm }]\n";
    let run = sh_with(dir.path(), Some(contract), "stat -c 'owner %u' /mm");
    assert_ok(&run);
    assert!(run.stdout().contains("owner 65534"), "{}", run.describe());
    let notes = run.result["notes"].to_string();
    assert!(
        notes.contains("readonly input /mm: its files keep their host owners"),
        "{}",
        run.describe()
    );
    assert!(run.stderr().contains("airlock: note: readonly input /mm"));
}

// ---- /dev/stdout, /dev/stderr -------------------------------------------------------

#[test]
fn dev_stdout_and_dev_stderr_can_be_opened_by_path() {
    require_cells!();
    let dir = tempfile::tempdir().unwrap();
    let run = sh_with(
        dir.path(),
        None,
        "echo to-stdout > /dev/stdout && echo to-stderr > /dev/stderr && \
         printf 'via-tee\\n' | tee /dev/stderr > /dev/null",
    );
    assert_ok(&run);
    assert!(run.stdout().contains("to-stdout"), "{}", run.describe());
    assert!(run.stderr().contains("to-stderr"), "{}", run.describe());
    assert!(run.stderr().contains("via-tee"), "{}", run.describe());
}

// ---- /dev/shm -----------------------------------------------------------------------

/// Creates two POSIX shared memory segments of 40 MiB each and touches every page: 80
/// MiB, more than the default 64 MiB `/dev/shm`, with each segment below the default
/// `file_size_mb` (64), which `ftruncate` of a larger one would hit first.
const FILL_SHARED_MEMORY: &str = "from multiprocessing import shared_memory\n\
     n = 40 << 20\n\
     segments = [shared_memory.SharedMemory(create=True, size=n) for _ in range(2)]\n\
     for shm in segments:\n    for i in range(0, n, 4096):\n        shm.buf[i] = 1\n\
     print('filled', 2 * n)\n\
     for shm in segments:\n    shm.close()\n    shm.unlink()\n";

#[test]
fn filling_dev_shm_is_the_shm_ceiling_not_a_task_error() {
    require_cells!();
    let dir = tempfile::tempdir().unwrap();
    let run = run_with(dir.path(), None, &["python3", "-c", FILL_SHARED_MEMORY]);
    assert_eq!(run.status(), "capacity_exceeded", "{}", run.describe());
    assert_eq!(run.limit_fired(), Some("shm"), "{}", run.describe());
    assert_eq!(
        run.result["exit"]["signal"],
        libc::SIGBUS,
        "{}",
        run.describe()
    );
    assert_eq!(run.code(), 128 + libc::SIGBUS, "{}", run.describe());
    assert!(
        run.stderr().contains("the shm ceiling fired"),
        "{}",
        run.describe()
    );
}

#[test]
fn a_larger_shm_mb_fits_the_same_segment() {
    require_cells!();
    let dir = tempfile::tempdir().unwrap();
    let contract = "resources: { shm_mb: 128 }\n";
    let run = run_with(
        dir.path(),
        Some(contract),
        &["python3", "-c", FILL_SHARED_MEMORY],
    );
    assert_ok(&run);
    assert!(
        run.stdout().contains("filled 83886080"),
        "{}",
        run.describe()
    );
    let df = sh_with(dir.path(), Some(contract), "df -m /dev/shm | tail -1");
    assert!(df.stdout().contains(" 128 "), "{}", df.describe());
}
