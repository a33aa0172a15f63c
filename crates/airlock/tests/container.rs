//! airlock inside a Docker container (docs/containers.md): as an ordinary user of the
//! container, with the container seccomp profile of `packaging/docker/`, Docker's
//! `systempaths=unconfined` and a cgroup subtree delegated to that user, the README's
//! main command runs and the cell's boundaries hold; with Docker's defaults, `doctor` and
//! `run` both refuse, naming what is missing.
//!
//! Needs a running Docker daemon (`.ci/run` starts one) and root (to delegate the
//! cgroup subtree).

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

const IMAGE: &str = "airlock-test-base:1";
/// The user airlock runs as inside the container.
const CONTAINER_UID: u32 = 4242;

fn docker(args: &[&str]) -> Output {
    Command::new("docker")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("docker (see .ci/run, which installs docker.io and starts dockerd)")
}

/// An image with nothing but the root directories: the host's `/usr` and `/etc` are
/// bind-mounted read-only into each container, so no registry is needed.
fn base_image() {
    static BUILT: std::sync::OnceLock<()> = std::sync::OnceLock::new();
    BUILT.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        for d in [
            "tmp", "proc", "sys", "dev", "usr", "etc", "run", "var/tmp", "airlock",
        ] {
            std::fs::create_dir_all(root.join(d)).unwrap();
        }
        for (link, to) in [
            ("bin", "usr/bin"),
            ("lib", "usr/lib"),
            ("lib64", "usr/lib64"),
            ("sbin", "usr/sbin"),
        ] {
            std::os::unix::fs::symlink(to, root.join(link)).unwrap();
        }
        let tar = Command::new("sh")
            .arg("-c")
            .arg(format!(
                "chmod 1777 {0}/tmp && tar -C {0} -cf - . | docker import - {IMAGE}",
                root.display()
            ))
            .output()
            .unwrap();
        assert!(tar.status.success(), "{}", common::output_text(&tar));
    });
}

/// A cgroup v1 subtree per hierarchy for one container, with `airlock/user-<uid>` in it
/// chowned to the container's user: mounted read-write at `/airlock-cgroup/<hierarchy>`
/// and named by `AIRLOCK_CGROUP_ROOT`.
struct ContainerCgroups {
    dirs: Vec<PathBuf>,
}

impl ContainerCgroups {
    fn new(name: &str) -> ContainerCgroups {
        let dirs: Vec<PathBuf> = ["memory", "pids", "cpu", "freezer"]
            .iter()
            .map(|h| {
                PathBuf::from(format!(
                    "/sys/fs/cgroup/{h}/airlock-ctr-{name}-{}",
                    std::process::id()
                ))
            })
            .collect();
        for dir in &dirs {
            let user = dir.join(format!("airlock/user-{CONTAINER_UID}"));
            std::fs::create_dir_all(&user).unwrap();
            for path in [user.clone(), user.join("cgroup.procs")] {
                std::os::unix::fs::chown(&path, Some(CONTAINER_UID), None).unwrap();
            }
        }
        ContainerCgroups { dirs }
    }

    fn volumes(&self) -> Vec<String> {
        self.dirs
            .iter()
            .map(|d| {
                let hierarchy = d.parent().unwrap().file_name().unwrap().to_string_lossy();
                format!("{}:/airlock-cgroup/{hierarchy}:rw", d.display())
            })
            .flat_map(|v| ["-v".to_string(), v])
            .collect()
    }
}

impl Drop for ContainerCgroups {
    fn drop(&mut self) {
        for dir in &self.dirs {
            for sub in [
                format!("airlock/user-{CONTAINER_UID}"),
                "airlock".into(),
                String::new(),
            ] {
                let _ = std::fs::remove_dir(dir.join(sub));
            }
        }
    }
}

/// `sh -c script` in a container of the base image as [`CONTAINER_UID`], with the
/// airlock binary at `/airlock/airlock` and `security` as the added options.
fn in_container(security: &[&str], cgroups: Option<&ContainerCgroups>, script: &str) -> Output {
    base_image();
    let bin_dir = common::airlock_bin().parent().unwrap().to_path_buf();
    let mut args: Vec<String> = ["run", "--rm", "--network", "none", "--user"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    args.push(format!("{CONTAINER_UID}:{CONTAINER_UID}"));
    args.extend(
        [
            "-e",
            "HOME=/tmp",
            "-v",
            "/usr:/usr:ro",
            "-v",
            "/etc:/etc:ro",
        ]
        .map(String::from),
    );
    args.extend(["-v".into(), format!("{}:/airlock:ro", bin_dir.display())]);
    if let Some(cgroups) = cgroups {
        args.extend(cgroups.volumes());
        args.extend(["-e".into(), "AIRLOCK_CGROUP_ROOT=/airlock-cgroup".into()]);
    }
    args.extend(security.iter().map(|s| s.to_string()));
    args.extend([IMAGE.into(), "sh".into(), "-c".into(), script.into()]);
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    docker(&refs)
}

fn seccomp_profile() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../packaging/docker/seccomp-airlock.json")
        .display()
        .to_string()
}

fn least_privilege() -> Vec<String> {
    vec![
        "--security-opt".into(),
        format!("seccomp={}", seccomp_profile()),
        "--security-opt".into(),
        "systempaths=unconfined".into(),
    ]
}

#[test]
fn in_a_container_with_the_shipped_profile_the_main_command_runs_and_boundaries_hold() {
    require_cells!();
    let cgroups = ContainerCgroups::new("ok");
    let security = least_privilege();
    let refs: Vec<&str> = security.iter().map(String::as_str).collect();
    let script = r#"
        /airlock/airlock doctor >/tmp/doctor.txt || { cat /tmp/doctor.txt; exit 90; }
        /airlock/airlock run -- python3 -c 'print("hello from a cell")' || exit 91
        /airlock/airlock run -- sh -c '
            cat /etc/shadow 2>/dev/null && echo BREACH_SHADOW
            touch /usr/bin/airlock-breach 2>/dev/null && echo BREACH_WRITE
            unshare -r /bin/true 2>/dev/null && echo BREACH_UNSHARE
            ls /proc | grep -qx 1 || echo NO_PID1
            echo boundaries-checked' || exit 92
        echo container-ok
    "#;
    let out = in_container(&refs, Some(&cgroups), script);
    let text = common::output_text(&out);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("hello from a cell") && text.contains("container-ok"),
        "{text}"
    );
    assert!(
        text.contains("boundaries-checked") && !text.contains("BREACH"),
        "{text}"
    );
}

#[test]
fn with_dockers_defaults_doctor_and_run_refuse_alike() {
    require_cells!();
    let out = in_container(
        &[],
        None,
        "/airlock/airlock doctor; echo doctor=$?; /airlock/airlock run -- /bin/true; echo run=$?",
    );
    let text = common::output_text(&out);
    assert!(text.contains("doctor=1"), "{text}");
    assert!(text.contains("run=125"), "{text}");
    assert!(text.contains("FAIL cgroups"), "{text}");
    assert!(text.contains("sandbox_unavailable"), "{text}");
}
