//! airlock run by an ordinary user (docs/threat-model.md, "Unprivileged operation"):
//! with a cgroup v1 subtree delegated to the user, the same contract gets the same cell,
//! ceilings and boundaries; without one, a run is refused with `sandbox_unavailable`
//! naming the command that delegates one, and `airlock doctor` says the same first.
//!
//! The tests need root to create their users and delegate the subtrees; the runs
//! themselves are made as those users (`setpriv`), each test with a user of its own.

mod common;

use std::net::TcpListener;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// A system user made for one test (kept between runs: creating it is idempotent).
struct TestUser {
    uid: u32,
    gid: u32,
}

fn test_user(name: &str) -> TestUser {
    let id = |flag: &str| {
        Command::new("id")
            .args([flag, name])
            .output()
            .ok()
            .filter(|o| o.status.success())
            .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
    };
    if id("-u").is_none() {
        let made = Command::new("useradd")
            .args(["--system", "--no-create-home", "--user-group"])
            .args(["--shell", "/usr/sbin/nologin", name])
            .status()
            .expect("useradd");
        // A test running at the same time may have made it first.
        assert!(
            made.success() || id("-u").is_some(),
            "useradd {name} failed"
        );
    }
    TestUser {
        uid: id("-u").expect("uid"),
        gid: id("-g").expect("gid"),
    }
}

/// The v1 hierarchies a cell needs, as this host mounts them.
const HIERARCHIES: [&str; 4] = ["memory", "pids", "cpu", "freezer"];

/// A cgroup of its own in every hierarchy, chowned to the user as an operator delegates
/// one, that the user's `airlock` starts in (see [`airlock_as`]): airlock finds it as
/// the process's own delegated cgroup. (The operator's `airlock/user-<uid>` is found
/// first when it exists; the unit tests of crates/cell/src/cgroup/mod.rs cover the
/// order.) Removed again when dropped, once no cell cgroup is left inside.
struct Delegation {
    dirs: Vec<PathBuf>,
}

impl Delegation {
    fn to(user: &TestUser) -> Delegation {
        let dirs: Vec<PathBuf> = HIERARCHIES
            .iter()
            .map(|h| {
                PathBuf::from(format!(
                    "/sys/fs/cgroup/{h}/airlock-tests/user-{}-{}",
                    user.uid,
                    std::process::id()
                ))
            })
            .collect();
        for dir in &dirs {
            std::fs::create_dir_all(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
            for path in [dir.clone(), dir.join("cgroup.procs")] {
                std::os::unix::fs::chown(&path, Some(user.uid), None).unwrap();
            }
        }
        Delegation { dirs }
    }

    /// Cell cgroups still inside the delegated subtree.
    fn cells_left(&self) -> Vec<PathBuf> {
        self.dirs
            .iter()
            .flat_map(|d| std::fs::read_dir(d).into_iter().flatten().flatten())
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .map(|e| e.path())
            .collect()
    }
}

impl Drop for Delegation {
    fn drop(&mut self) {
        for dir in &self.dirs {
            let _ = std::fs::remove_dir(dir);
            let _ = std::fs::remove_dir(dir.parent().unwrap());
        }
    }
}

/// A working directory the user owns, with its own state dir.
fn user_dir(user: &TestUser) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    std::os::unix::fs::chown(dir.path(), Some(user.uid), Some(user.gid)).unwrap();
    dir
}

/// `airlock args...` as `user`, in `dir`, with no supplementary groups and a plain
/// environment, started in `delegation`'s cgroups when there is one.
fn airlock_as(
    user: &TestUser,
    delegation: Option<&Delegation>,
    dir: &Path,
    args: &[&str],
) -> Output {
    let join: String = delegation
        .map(|d| {
            d.dirs
                .iter()
                .map(|dir| format!("echo $$ > {}/cgroup.procs && ", dir.display()))
                .collect()
        })
        .unwrap_or_default();
    Command::new("/bin/sh")
        .arg("-c")
        .arg(format!("{join}exec \"$@\""))
        .arg("sh")
        .arg("setpriv")
        .arg(format!("--reuid={}", user.uid))
        .arg(format!("--regid={}", user.gid))
        .args(["--clear-groups", "--"])
        .arg(common::airlock_bin())
        .args(args)
        .current_dir(dir)
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin")
        .env("HOME", dir)
        .stdin(Stdio::null())
        .output()
        .expect("setpriv")
}

/// `airlock run` as `user` with the contract `yaml` (if any); the result record read back.
fn run_as(
    user: &TestUser,
    delegation: Option<&Delegation>,
    dir: &Path,
    yaml: Option<&str>,
    argv: &[&str],
) -> common::CellRun {
    let result = dir.join(format!("result-{}.json", unique()));
    let state = dir.join("state");
    let mut args: Vec<String> = vec![
        "run".into(),
        "--state-dir".into(),
        state.display().to_string(),
        "--result".into(),
        result.display().to_string(),
    ];
    if let Some(yaml) = yaml {
        let contract = dir.join(format!("contract-{}.yaml", unique()));
        std::fs::write(&contract, yaml).unwrap();
        std::os::unix::fs::chown(&contract, Some(user.uid), Some(user.gid)).unwrap();
        args.extend(["--contract".into(), contract.display().to_string()]);
    }
    args.push("--".into());
    args.extend(argv.iter().map(|a| a.to_string()));
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    common::CellRun::collect(airlock_as(user, delegation, dir, &refs), &result)
}

fn unique() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

fn text(out: &Output) -> String {
    common::output_text(out)
}

#[test]
fn without_a_delegated_subtree_a_run_is_refused_naming_the_fix_and_doctor_agrees() {
    require_cells!();
    let user = test_user("airlock-t-plain");
    let dir = user_dir(&user);
    let doctor = airlock_as(&user, None, dir.path(), &["doctor"]);
    let said = text(&doctor);
    assert_eq!(doctor.status.code(), Some(1), "{said}");
    let fix = "do mkdir -p $d && chown";
    assert!(
        said.contains("FAIL cgroups") && said.contains("cgroups.delegation") && said.contains(fix),
        "{said}"
    );
    let run = run_as(&user, None, dir.path(), None, &["/bin/true"]);
    assert_eq!(run.code(), 125, "{}", run.describe());
    assert_eq!(run.status(), "sandbox_unavailable", "{}", run.describe());
    assert!(
        run.stderr().contains("cgroups.delegation") && run.stderr().contains(fix),
        "{}",
        run.describe()
    );
    assert!(
        run.stderr().contains(&format!("user-{}", user.uid)),
        "{}",
        run.describe()
    );
}

#[test]
fn with_a_delegated_subtree_the_ceilings_hold_and_nothing_is_left() {
    require_cells!();
    let user = test_user("airlock-t-ceil");
    let delegation = Delegation::to(&user);
    let dir = user_dir(&user);
    let doctor = airlock_as(&user, Some(&delegation), dir.path(), &["doctor"]);
    assert_eq!(doctor.status.code(), Some(0), "{}", text(&doctor));

    let ok = run_as(
        &user,
        Some(&delegation),
        dir.path(),
        None,
        &["/bin/echo", "hi"],
    );
    assert_eq!(
        (ok.code(), ok.stdout().as_str()),
        (0, "hi\n"),
        "{}",
        ok.describe()
    );
    assert_eq!(ok.result["cgroup_version"], "v1", "{}", ok.describe());

    let memory = run_as(
        &user,
        Some(&delegation),
        dir.path(),
        Some("resources:\n  memory_mb: 64\n"),
        &[
            "python3",
            "-c",
            "b = bytearray(300 * 2**20)\nfor i in range(0, len(b), 4096): b[i] = 1\nprint('allocated')",
        ],
    );
    assert_eq!(
        memory.limit_fired(),
        Some("memory"),
        "{}",
        memory.describe()
    );
    assert_eq!(memory.code(), 137, "{}", memory.describe());
    assert!(
        !memory.stdout().contains("allocated"),
        "{}",
        memory.describe()
    );

    let pids = run_as(
        &user,
        Some(&delegation),
        dir.path(),
        Some("resources:\n  process_limit: 8\n"),
        &[
            "/bin/sh",
            "-c",
            "for i in $(seq 30); do sleep 5 & done; wait",
        ],
    );
    assert!(
        pids.result["limits_hit"]
            .as_array()
            .is_some_and(|hits| hits.contains(&"pids".into())),
        "{}",
        pids.describe()
    );
    assert!(
        pids.result["usage"]["pids_peak"].as_f64().unwrap_or(99.0) <= 9.0,
        "{}",
        pids.describe()
    );

    let wall = run_as(
        &user,
        Some(&delegation),
        dir.path(),
        Some("resources:\n  wall_time_seconds: 1\n"),
        &["/bin/sleep", "30"],
    );
    assert_eq!(wall.limit_fired(), Some("wall_time"), "{}", wall.describe());

    // The CPU ceiling is the contract's quota in the cell's own cgroup.
    let cpu = run_as(
        &user,
        Some(&delegation),
        dir.path(),
        Some("resources:\n  cpu_millis: 500\n"),
        &["/bin/cat", "/sys/fs/cgroup/cpu/cpu.cfs_quota_us"],
    );
    assert_eq!(cpu.stdout().trim(), "50000", "{}", cpu.describe());

    assert_eq!(delegation.cells_left(), Vec::<PathBuf>::new());
}

#[test]
fn as_an_ordinary_user_the_cell_boundaries_hold() {
    require_cells!();
    let user = test_user("airlock-t-bound");
    let delegation = Delegation::to(&user);
    let dir = user_dir(&user);
    // A file of the user's own, outside every mount of the contract.
    let marker = dir.path().join("marker-outside.txt");
    std::fs::write(&marker, "outside").unwrap();
    std::os::unix::fs::chown(&marker, Some(user.uid), Some(user.gid)).unwrap();
    // A host process of the user's, and a loopback listener of the host's.
    let mut host_process = Command::new("setpriv")
        .arg(format!("--reuid={}", user.uid))
        .arg(format!("--regid={}", user.gid))
        .args(["--clear-groups", "/bin/sleep", "300"])
        .spawn()
        .unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let script = format!(
        "cat {marker} && echo READ_MARKER; \
         ls /proc | grep -qx {pid} && echo SAW_HOST_PROCESS; \
         touch /usr/bin/airlock-breach 2>/dev/null && echo WROTE_USR; \
         touch /etc/airlock-breach 2>/dev/null && echo WROTE_ETC; \
         unshare -r /bin/true 2>/dev/null && echo UNSHARED; \
         python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", {port}), timeout=2)' 2>/dev/null && echo CONNECTED; \
         id -u; echo done",
        marker = marker.display(),
        pid = host_process.id(),
    );
    let run = run_as(
        &user,
        Some(&delegation),
        dir.path(),
        None,
        &["/bin/sh", "-c", &script],
    );
    let _ = host_process.kill();
    let _ = host_process.wait();
    assert_eq!(run.code(), 0, "{}", run.describe());
    let out = run.stdout();
    for breach in [
        "READ_MARKER",
        "SAW_HOST_PROCESS",
        "WROTE_USR",
        "WROTE_ETC",
        "UNSHARED",
        "CONNECTED",
    ] {
        assert!(!out.contains(breach), "{breach}\n{}", run.describe());
    }
    assert!(out.contains("done"), "{}", run.describe());
    // The payload is not the user's host uid 0 either: the cell identity.
    assert_ne!(out.lines().rev().nth(1), Some("0"), "{}", run.describe());
    assert!(
        listener.accept().is_err(),
        "the host's loopback listener saw a connection"
    );
}

/// An operator configuration in `dir` with two classes that differ only in what they
/// allow without a delegated cgroup: `strict` (the rule: refuse) and `laptop`
/// (`ceilings_without_cgroup = "rlimits"`), both with `resources` as their template's.
fn classes_config(user: &TestUser, dir: &Path, resources: &str) -> PathBuf {
    let mut text = String::new();
    for (name, without) in [("strict", "refuse"), ("laptop", "rlimits")] {
        text.push_str(&format!(
            "[policy.classes.{name}]\ndescription = \"{name}\"\nceilings_without_cgroup = \"{without}\"\n\
             [policy.classes.{name}.template.resources]\n{resources}\n\
             [policy.classes.{name}.commands]\ndefault = \"prompt\"\nunmatched = \"allow\"\n"
        ));
    }
    let path = dir.join(format!("airlock-{}.toml", unique()));
    std::fs::write(&path, text).unwrap();
    std::os::unix::fs::chown(&path, Some(user.uid), Some(user.gid)).unwrap();
    path
}

/// `airlock run --class CLASS` as `user` (no delegated subtree), the result read back.
fn run_class_as(
    user: &TestUser,
    dir: &Path,
    config: &Path,
    class: &str,
    argv: &[&str],
) -> common::CellRun {
    let result = dir.join(format!("result-{}.json", unique()));
    let (state, config, result_arg) = (
        dir.join("state").display().to_string(),
        config.display().to_string(),
        result.display().to_string(),
    );
    let mut args = vec![
        "run",
        "--state-dir",
        &state,
        "--config",
        &config,
        "--class",
        class,
        "--result",
        &result_arg,
        "--",
    ];
    args.extend_from_slice(argv);
    common::CellRun::collect(airlock_as(user, None, dir, &args), &result)
}

#[test]
fn without_a_delegated_subtree_only_a_class_allowing_rlimits_runs_and_its_record_says_so() {
    require_cells!();
    let user = test_user("airlock-t-rlim");
    let dir = user_dir(&user);
    let config = classes_config(&user, dir.path(), "memory_mb = 64\nprocess_limit = 8");

    let doctor = airlock_as(
        &user,
        None,
        dir.path(),
        &["doctor", "--config", &config.display().to_string()],
    );
    let said = text(&doctor);
    assert_eq!(doctor.status.code(), Some(1), "{said}");
    assert!(said.contains("FAIL cgroups "), "{said}");
    let rlimits_line = said
        .lines()
        .find(|l| l.starts_with("ok   cgroups.rlimits_only"))
        .unwrap_or_else(|| panic!("doctor does not report the exception:\n{said}"));
    assert!(
        rlimits_line.contains("laptop") && !rlimits_line.contains("strict"),
        "{rlimits_line}"
    );

    let strict = run_class_as(&user, dir.path(), &config, "strict", &["/bin/true"]);
    assert_eq!(strict.code(), 125, "{}", strict.describe());
    assert_eq!(
        strict.status(),
        "sandbox_unavailable",
        "{}",
        strict.describe()
    );
    assert!(
        strict.stderr().contains("cgroups.delegation"),
        "{}",
        strict.describe()
    );

    let laptop = run_class_as(&user, dir.path(), &config, "laptop", &["/bin/echo", "hi"]);
    assert_eq!(
        (laptop.code(), laptop.stdout().as_str()),
        (0, "hi\n"),
        "{}",
        laptop.describe()
    );
    let record = &laptop.result["rlimits_only"];
    assert_eq!(record["class"], "laptop", "{}", laptop.describe());
    assert!(
        laptop.result["cgroup_version"].is_null(),
        "{}",
        laptop.describe()
    );
    assert!(
        record["why"]
            .as_str()
            .is_some_and(|w| w.starts_with("cgroups.delegation")),
        "{}",
        laptop.describe()
    );
    assert_eq!(record["requested"]["memory_bytes"], 64 << 20);
    assert_eq!(record["requested"]["process_limit"], 8);
    let enforced: Vec<(String, String, u64)> = record["enforced"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["ceiling"].as_str().unwrap().to_owned(),
                c["rlimit"]["resource"].as_str().unwrap().to_owned(),
                c["rlimit"]["value"].as_u64().unwrap(),
            )
        })
        .collect();
    assert!(
        enforced.contains(&("memory".into(), "as".into(), 64 << 20))
            && enforced.contains(&("pids".into(), "nproc".into(), 9)),
        "{enforced:?}"
    );
    assert!(
        record["not_enforced"]
            .as_array()
            .is_some_and(|n| n.iter().any(|t| t.as_str().unwrap().contains("cpu_millis"))),
        "{}",
        laptop.describe()
    );
    assert!(
        laptop
            .stderr()
            .contains("no cgroup: class laptop allows rlimits only"),
        "{}",
        laptop.describe()
    );
}

#[test]
fn with_rlimits_only_the_process_memory_cpu_and_wall_time_ceilings_hold() {
    require_cells!();
    let user = test_user("airlock-t-rlhold");
    let dir = user_dir(&user);
    let config = classes_config(
        &user,
        dir.path(),
        "memory_mb = 64\nprocess_limit = 8\ncpu_millis = 100\nwall_time_seconds = 10",
    );
    // Twenty host processes of the same user: RLIMIT_NPROC is counted in the cell's own
    // user namespace, so they take nothing from the cell's eight.
    let mut others: Vec<std::process::Child> = (0..20)
        .map(|_| {
            Command::new("setpriv")
                .arg(format!("--reuid={}", user.uid))
                .arg(format!("--regid={}", user.gid))
                .args(["--clear-groups", "/bin/sleep", "120"])
                .spawn()
                .unwrap()
        })
        .collect();
    let bomb = run_class_as(
        &user,
        dir.path(),
        &config,
        "laptop",
        &[
            "python3",
            "-c",
            "import os, time\nn = 0\ntry:\n    while n < 1000:\n        if os.fork() == 0:\n            time.sleep(30)\n            os._exit(0)\n        n += 1\nexcept OSError as e:\n    print('forks', n, e.errno)",
        ],
    );
    for other in &mut others {
        let _ = other.kill();
        let _ = other.wait();
    }
    // python3 and 7 children: process_limit 8.
    assert_eq!(bomb.stdout().trim(), "forks 7 11", "{}", bomb.describe());
    assert_eq!(bomb.code(), 0, "{}", bomb.describe());
    // The sleeping children died with the cell, at once.
    assert!(bomb.result["cleanup"]["ok"] == true, "{}", bomb.describe());
    assert!(
        bomb.result["timings"]["wall_ms"].as_f64().unwrap() < 10_000.0,
        "{}",
        bomb.describe()
    );

    let memory = run_class_as(
        &user,
        dir.path(),
        &config,
        "laptop",
        &[
            "python3",
            "-c",
            "try:\n    b = bytearray(300 * 2**20)\n    print('allocated')\nexcept MemoryError:\n    print('refused')",
        ],
    );
    assert_eq!(memory.stdout().trim(), "refused", "{}", memory.describe());

    // 0.1 CPU over a 10 s deadline: one second of CPU time, then SIGXCPU.
    let cpu = run_class_as(
        &user,
        dir.path(),
        &config,
        "laptop",
        &["python3", "-c", "while True: pass"],
    );
    assert_eq!(cpu.limit_fired(), Some("cpu"), "{}", cpu.describe());
    assert_eq!(cpu.status(), "capacity_exceeded", "{}", cpu.describe());
    assert_eq!(cpu.code(), 128 + libc::SIGXCPU, "{}", cpu.describe());

    // A process that sleeps (no CPU time) meets the deadline, and its daemon goes too.
    let wall = run_class_as(
        &user,
        dir.path(),
        &config,
        "laptop",
        &["/bin/sh", "-c", "(sleep 300 &) ; sleep 300"],
    );
    assert_eq!(wall.limit_fired(), Some("wall_time"), "{}", wall.describe());
    assert_eq!(wall.code(), 124, "{}", wall.describe());
    assert!(wall.result["cleanup"]["ok"] == true, "{}", wall.describe());
    let survivors = Command::new("pgrep")
        .args(["-u", &user.uid.to_string(), "sleep"])
        .output()
        .unwrap();
    assert!(
        survivors.stdout.is_empty(),
        "processes of the cell outlived it: {}",
        text(&survivors)
    );
}
