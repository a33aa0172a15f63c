//! The gVisor tier through the real binary (`airlock run` with `isolation: gvisor`,
//! crates/cell/src/gvisor/): the payload is on gVisor's kernel, sees nothing of the host it
//! was not given, cannot write outside its writable paths or reach any network, its
//! ceilings fire with the native cell's classes, its artifacts and records are the native
//! cell's, nothing is left on the host, and a host that cannot run the tier refuses the
//! run instead of running it natively. An attack that exits 0 is a breach.
//!
//! Needs Debian's `runsc` (installed by .ci/run) and root. The tests run one at a time: a
//! sandbox costs a few hundred milliseconds of two cores.

mod common;

use common::route_probe::{assert_no_connection_arrived, RouteProbe};
use common::{airlock_bin, host, run_in, state_dir, CellRun};
use std::io::Write;
use std::net::TcpListener;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

const GVISOR: &str = "isolation: gvisor\n";

/// `sh -c script` on the gVisor tier with `contract` (YAML, `isolation` added).
fn gvisor_sh(dir: &Path, contract: &str, script: &str) -> CellRun {
    let yaml = format!("{GVISOR}{contract}");
    let run = run_in(dir, Some(&yaml), &[], &["/bin/sh", "-c", script]);
    assert_nothing_left(&run);
    run
}

fn tempdir() -> tempfile::TempDir {
    tempfile::tempdir().unwrap()
}

/// Nothing of the run's sandbox is left on the host (common/tier.rs says what that is).
fn assert_nothing_left(run: &CellRun) {
    common::tier::assert_sandbox_left_nothing(run);
}

fn host_text(path: &str) -> String {
    std::fs::read_to_string(path).unwrap().trim().to_string()
}

#[test]
fn the_payload_runs_on_gvisors_kernel_and_the_record_names_the_tier() {
    require_cells!();
    let _serial = serial();
    let dir = tempdir();
    let run = gvisor_sh(dir.path(), "", "uname -r; uname -v");
    assert_eq!(run.status(), "ok", "{}", run.describe());
    let kernel = run.stdout();
    let host_release = host_text("/proc/sys/kernel/osrelease");
    assert!(
        !kernel.contains(&host_release),
        "the payload saw the host's kernel {host_release}:\n{}",
        run.describe()
    );
    // The record's plan says which tier ran it.
    let id = run.result["run_id"].as_str().unwrap();
    let shown = Command::new(airlock_bin())
        .args(["runs", "show", id, "--json", "--state-dir"])
        .arg(state_dir())
        .output()
        .unwrap();
    let record: serde_json::Value = serde_json::from_slice(&shown.stdout).unwrap();
    assert_eq!(record["run"]["plan"]["isolation"], "gvisor");
    assert_eq!(record["run"]["status"], "ok");
}

/// `/proc/sys/kernel/random/boot_id` is the host kernel's own value in a native cell (its
/// `/proc` is the host kernel's procfs, and the native filter allows reading it); on
/// gVisor `/proc` is gVisor's, so the host's value cannot be read. The native run is the
/// control: it shows the interface is reachable there, so this test can fail.
#[test]
fn a_host_kernel_interface_the_native_cell_reaches_is_not_the_hosts_on_gvisor() {
    require_cells!();
    let _serial = serial();
    let dir = tempdir();
    let host_boot_id = host_text("/proc/sys/kernel/random/boot_id");
    let script = "cat /proc/sys/kernel/random/boot_id; grep MemTotal /proc/meminfo";
    let native = run_in(dir.path(), None, &[], &["/bin/sh", "-c", script]);
    assert!(
        native.stdout().contains(&host_boot_id),
        "control: the native cell reads the host's boot_id\n{}",
        native.describe()
    );
    let gvisor = gvisor_sh(dir.path(), "resources: { memory_mb: 256 }\n", script);
    assert!(
        !gvisor.stdout().contains(&host_boot_id),
        "the host kernel's boot_id reached the gVisor payload\n{}",
        gvisor.describe()
    );
    // gVisor's /proc/meminfo shows the sandbox's ceiling, not the host's memory.
    assert!(
        gvisor.stdout().contains("MemTotal:         262144 kB"),
        "{}",
        gvisor.describe()
    );
}

#[test]
fn host_files_and_markers_outside_the_plan_are_invisible() {
    require_cells!();
    let _serial = serial();
    let dir = tempdir();
    let marker = dir.path().join("host-marker");
    std::fs::write(&marker, "MARKER-GVISOR-HOST").unwrap();
    // Every line tries one host path; any success prints what it read and exits 0.
    let script = format!(
        "for p in /etc/shadow /root/.bashrc {m} /proc/1/root{m} /run/airlock/ids /var/lib; do \
           if cat \"$p\" 2>/dev/null || test -e \"$p\"; then echo \"READ $p\"; exit 0; fi; \
         done; exit 1",
        m = marker.display()
    );
    let run = gvisor_sh(dir.path(), "", &script);
    assert_eq!(
        run.code(),
        1,
        "a host path was reachable:\n{}",
        run.describe()
    );
    assert!(!run.stdout().contains("MARKER-GVISOR-HOST"));
    // Control: the marker is readable on the host, where the test put it.
    assert!(std::fs::read_to_string(&marker).unwrap().contains("MARKER"));
}

#[test]
fn writes_outside_the_writable_paths_are_refused_and_land_nowhere() {
    require_cells!();
    let _serial = serial();
    let dir = tempdir();
    let name = format!("gvisor-write-{}", std::process::id());
    let script = format!(
        "for p in /usr/{name} /etc/{name} /{name} /usr/lib/{name}; do \
           if echo x > \"$p\" 2>/dev/null; then echo \"WROTE $p\"; exit 0; fi; \
         done; echo ok > /tmp/{name} && cat /tmp/{name} && exit 3"
    );
    let run = gvisor_sh(
        dir.path(),
        "filesystem: { writable_paths: [/tmp] }\n",
        &script,
    );
    assert_eq!(
        run.code(),
        3,
        "a write outside /tmp succeeded:\n{}",
        run.describe()
    );
    assert_eq!(run.stdout().trim(), "ok");
    for host_path in [
        format!("/usr/{name}"),
        format!("/etc/{name}"),
        format!("/{name}"),
    ] {
        assert!(
            !Path::new(&host_path).exists(),
            "{host_path} exists on the host"
        );
    }
}

/// A listener on every host address; the payload tries each, and any connection that
/// arrives (or succeeds) is a breach.
#[test]
fn no_network_under_deny_not_even_the_hosts_loopback() {
    require_cells!();
    let _serial = serial();
    let dir = tempdir();
    let listener = TcpListener::bind("0.0.0.0:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    listener.set_nonblocking(true).unwrap();
    let addresses = common::host::ipv4_addresses();
    let script = format!(
        "import socket, sys\n\
         for a in {addresses:?}:\n\
         \x20   try:\n\
         \x20       socket.create_connection((a, {port}), timeout=2).send(b'breach')\n\
         \x20       print('CONNECTED', a); sys.exit(0)\n\
         \x20   except OSError as e:\n\
         \x20       print('refused', a, e)\n\
         try:\n\
         \x20   socket.getaddrinfo('example.test', 80); print('RESOLVED'); sys.exit(0)\n\
         except OSError as e:\n\
         \x20   print('no dns', e)\n\
         sys.exit(1)\n"
    );
    let yaml = format!("{GVISOR}network: {{ mode: deny }}\n");
    let run = run_in(dir.path(), Some(&yaml), &[], &["python3", "-c", &script]);
    assert_nothing_left(&run);
    assert_eq!(
        run.code(),
        1,
        "the payload reached a network:\n{}",
        run.describe()
    );
    assert_no_connection_arrived(&listener);
}

// The memory ceiling, the deadline (a SIGTERM-ignoring payload and daemon) and the output
// cap on this tier are ceilings.rs's `::gvisor` cases (both_tiers!, common/tier.rs).

/// `process_limit` is RLIMIT_NPROC inside gVisor: a fork past it is refused there (the
/// host's pids cgroup is only a backstop for the sandbox's own host tasks).
#[test]
fn forks_beyond_the_process_limit_are_refused_inside_the_sandbox() {
    require_cells!();
    let _serial = serial();
    let dir = tempdir();
    let run = gvisor_sh(
        dir.path(),
        "resources: { process_limit: 8 }\n",
        "n=0; for i in $(seq 30); do sleep 5 & n=$((n+1)); done; echo started $n",
    );
    assert_ne!(
        run.code(),
        0,
        "30 processes ran under a limit of 8:\n{}",
        run.describe()
    );
    assert!(run.stderr().contains("Cannot fork"), "{}", run.describe());
    // Refused by gVisor's kernel, not by the host's pids backstop (which kills the whole
    // sandbox): airlock sees no counter of it, so the class is the payload's own.
    assert_eq!(
        run.result["usage"]["pids_limit_hits"],
        0,
        "{}",
        run.describe()
    );
    assert_eq!(run.status(), "task_error", "{}", run.describe());
}

#[test]
fn declared_artifacts_leave_the_sandbox_and_nothing_else_does() {
    require_cells!();
    let _serial = serial();
    let dir = tempdir();
    let out = dir.path().join("artifacts");
    let yaml = format!(
        "{GVISOR}filesystem:\n  writable_paths: [/tmp, /out]\n  output_allowlist: [/out/*.txt]\n"
    );
    let script = "echo report > /out/report.txt; echo secret > /out/undeclared.bin; \
                  ln -s /etc/passwd /out/link.txt";
    let run = run_in(
        dir.path(),
        Some(&yaml),
        &["--output-dir", out.to_str().unwrap()],
        &["/bin/sh", "-c", script],
    );
    assert_nothing_left(&run);
    assert_eq!(run.status(), "ok", "{}", run.describe());
    let kept = std::fs::read_to_string(out.join("out/report.txt"))
        .or_else(|_| std::fs::read_to_string(out.join("report.txt")))
        .unwrap_or_else(|e| panic!("report.txt not delivered ({e}):\n{}", run.describe()));
    assert_eq!(kept, "report\n");
    let rejected = run.result["artifacts"]["rejected"].to_string();
    assert!(rejected.contains("artifact.undeclared"), "{rejected}");
    assert!(rejected.contains("artifact.symlink"), "{rejected}");
    assert_eq!(
        run.result["artifacts"]["kept"][0]["sha256"],
        common::sha256_hex("report\n")
    );
}

#[test]
fn a_host_without_a_working_runsc_refuses_the_run_and_never_runs_it_natively() {
    require_cells!();
    let _serial = serial();
    let dir = tempdir();
    let broken = dir.path().join("runsc");
    std::fs::write(&broken, "#!/bin/sh\nexit 1\n").unwrap();
    Command::new("chmod")
        .arg("755")
        .arg(&broken)
        .status()
        .unwrap();
    for runsc in [dir.path().join("absent"), broken] {
        let result = dir.path().join("result.json");
        let contract = dir.path().join("c.yaml");
        std::fs::write(&contract, GVISOR).unwrap();
        let out = Command::new(airlock_bin())
            .arg("run")
            .arg("--state-dir")
            .arg(state_dir())
            .arg("--result")
            .arg(&result)
            .arg("--contract")
            .arg(&contract)
            .args(["--", "/bin/sh", "-c", "echo RAN"])
            .env("AIRLOCK_RUNSC", &runsc)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let run = CellRun::collect(out, &result);
        assert_eq!(run.status(), "sandbox_unavailable", "{}", run.describe());
        assert_eq!(run.code(), 125);
        assert!(run.stderr().contains("gvisor.runsc"), "{}", run.describe());
        assert!(
            !run.stdout().contains("RAN"),
            "it ran anyway:\n{}",
            run.describe()
        );
    }
}

#[test]
fn what_the_tier_does_not_run_yet_is_refused_before_anything_runs() {
    require_cells!();
    let _serial = serial();
    let dir = tempdir();
    // A pod's network namespace is the native cell's only (docs/threat-model.md, "Tiers").
    let yaml = format!("{GVISOR}network: {{ mode: pod }}\n");
    let run = run_in(dir.path(), Some(&yaml), &[], &["/bin/sh", "-c", "echo RAN"]);
    assert_ne!(run.code(), 0, "{}", run.describe());
    assert!(!run.stdout().contains("RAN"));
    assert!(
        run.stderr().contains("isolation gvisor"),
        "{}",
        run.describe()
    );
}

/// An operator config resolving the test's fake names to the loopback upstream (the
/// native egress tests' setup, egress.rs), and the directory with the state and files.
struct EgressEnv {
    dir: tempfile::TempDir,
    config: std::path::PathBuf,
    www: std::path::PathBuf,
}

const UPSTREAM_IP: &str = "127.0.0.2";

impl EgressEnv {
    fn new() -> EgressEnv {
        let dir = tempdir();
        let config = dir.path().join("airlock.toml");
        std::fs::write(
            &config,
            "[egress]\nresolve = { \"api.test\" = \"127.0.0.2\", \"evil.test\" = \"127.0.0.2\" }\n\
             exempt_cidrs = [\"127.0.0.2/32\"]\n",
        )
        .unwrap();
        let www = dir.path().join("www");
        std::fs::create_dir_all(&www).unwrap();
        EgressEnv { dir, config, www }
    }

    fn run(&self, contract: &str, argv: &[&str]) -> CellRun {
        let yaml = format!("{GVISOR}{contract}");
        let run = run_in(
            self.dir.path(),
            Some(&yaml),
            &["--config", self.config.to_str().unwrap()],
            argv,
        );
        assert_nothing_left(&run);
        run
    }
}

// The allowlist's decisions, reason codes and records on this tier (HTTP, CONNECT,
// SOCKS, the resolver and the transparent listeners) are egress.rs's and
// transparent_egress.rs's `::gvisor` cases (both_tiers!); what only this tier's route
// has (its forwarder, which a payload can kill) is here.

/// Nothing but the proxy is reachable from an allowlisted sandbox: not the upstream
/// directly, not the host's addresses, not a DNS server but the resolver's address, not
/// a host unix socket under a bind; and once the payload killed the forwarder, not even
/// the proxy (common/route_probe.rs). The script exits 0 only on a breach.
#[test]
fn nothing_else_is_reachable_and_killing_the_forwarder_opens_no_route() {
    require_cells!();
    let _serial = serial();
    let env = EgressEnv::new();
    let up = common::upstream::Upstream::start(env.dir.path(), &env.www, UPSTREAM_IP, None);
    let port = up.port;
    let probe = RouteProbe::new(UPSTREAM_IP, port);
    let contract = format!(
        "network:\n  mode: allowlist\n  allowed_domains: [\"api.test:{port}\"]\n{}",
        probe.contract_inputs()
    );
    let run = env.run(&contract, &["python3", "-c", &probe.script(true)]);
    assert_eq!(
        run.code(),
        1,
        "a route out of the sandbox:\n{}",
        run.describe()
    );
    assert!(!run.stdout().contains("BREACH"), "{}", run.describe());
    assert!(
        run.stdout().contains("refused proxy after kill"),
        "{}",
        run.describe()
    );
    probe.assert_nothing_arrived();
    assert!(!up.log().contains("GET"), "{}", up.log());
}

#[test]
fn stdin_is_relayed_into_the_sandbox() {
    require_cells!();
    let _serial = serial();
    let dir = tempdir();
    let contract = dir.path().join("c.yaml");
    std::fs::write(&contract, GVISOR).unwrap();
    let result = dir.path().join("r.json");
    let mut child = Command::new(airlock_bin())
        .arg("run")
        .arg("--state-dir")
        .arg(state_dir())
        .arg("--result")
        .arg(&result)
        .arg("--contract")
        .arg(&contract)
        .args(["--", "/bin/sh", "-c", "tr a-z A-Z"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"relayed through gvisor\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "RELAYED THROUGH GVISOR\n"
    );
}

#[test]
fn doctor_reports_runsc_and_runs_the_tier_end_to_end() {
    require_cells!();
    let _serial = serial();
    let out = Command::new(airlock_bin())
        .args(["doctor", "--json"])
        .output()
        .unwrap();
    let checks: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let check = |name: &str| {
        checks
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["control"] == name)
            .unwrap_or_else(|| panic!("no {name} check: {checks}"))
            .clone()
    };
    let runsc = check("gvisor.runsc");
    assert_eq!(runsc["ok"], true, "{runsc}");
    assert!(
        runsc["detail"].as_str().unwrap().contains("runsc version"),
        "{runsc}"
    );
    assert!(
        runsc["detail"]
            .as_str()
            .unwrap()
            .contains("platform ptrace"),
        "{runsc}"
    );
    let e2e = check("gvisor.end_to_end");
    assert_eq!(e2e["ok"], true, "{e2e}");
    assert!(
        e2e["detail"].as_str().unwrap().contains("gVisor's kernel"),
        "{e2e}"
    );
    assert_eq!(check("gvisor.leftovers")["ok"], true);
}

/// A supervisor killed with SIGKILL cannot clean up, and runsc's processes are not tied
/// to it: its sandbox keeps running until `airlock doctor` (or the next gVisor run) reaps
/// it. Afterwards nothing of it is left.
#[test]
fn a_sandbox_dies_with_its_killed_supervisor_and_doctor_reaps_the_rest() {
    require_cells!();
    let _serial = serial();
    let dir = tempdir();
    let contract = dir.path().join("c.yaml");
    std::fs::write(&contract, GVISOR).unwrap();
    let marker = format!("300.{}", std::process::id());
    let mut child = Command::new(airlock_bin())
        .arg("run")
        .arg("--state-dir")
        .arg(state_dir())
        .arg("--contract")
        .arg(&contract)
        .args(["--", "sleep", &marker])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let supervisor = host::Supervisor::of(&child);
    let prefix = format!("{}-{}-", supervisor.pid, supervisor.start_time);
    let cell_dir = || {
        std::fs::read_dir("/run/airlock-gvisor").ok().and_then(|d| {
            d.flatten()
                .map(|e| e.path())
                .find(|p| p.to_string_lossy().contains(&prefix))
        })
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while host::processes_with(&format!("/run/airlock-gvisor/{prefix}")).len() < 2 {
        assert!(Instant::now() < deadline, "the sandbox never started");
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(500));
    child.kill().unwrap();
    child.wait().unwrap();
    let dir_of_cell = cell_dir().expect("the dead supervisor's cell directory");
    // Its sandbox dies with it (`runsc run` has the parent-death signal and starts the
    // sandbox attached); its directory, tmpfs and cgroup are doctor's to reap.
    let gone_by = Instant::now() + Duration::from_secs(5);
    while !host::processes_with(&format!("/run/airlock-gvisor/{prefix}")).is_empty() {
        assert!(
            Instant::now() < gone_by,
            "the sandbox outlived its supervisor: {:?}",
            host::processes_with(&format!("/run/airlock-gvisor/{prefix}"))
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = Command::new(airlock_bin())
        .args(["doctor", "--json"])
        .output()
        .unwrap();
    let checks: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let reaped = checks
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["control"] == "gvisor.leftovers")
        .unwrap()
        .clone();
    assert_eq!(reaped["ok"], true, "{reaped}");
    assert!(
        reaped["detail"].as_str().unwrap().contains("reaped"),
        "{reaped}"
    );
    assert!(!dir_of_cell.exists(), "{} left", dir_of_cell.display());
    let procs = host::processes_with(&format!("/run/airlock-gvisor/{prefix}"));
    assert!(procs.is_empty(), "{procs:?}");
    let cgroups: Vec<_> = host::cell_cgroup_dirs()
        .into_iter()
        .filter(|d| d.to_string_lossy().contains(&prefix))
        .collect();
    assert!(cgroups.is_empty(), "{cgroups:?}");
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!mounts.contains(&format!("/run/airlock-gvisor/{prefix}")));
}

/// A class that requires gVisor runs every request on gVisor, whatever its template says,
/// and a request asking for the native tier is denied before anything runs.
#[test]
fn a_class_requiring_gvisor_runs_on_gvisor_and_a_request_cannot_lower_it() {
    require_cells!();
    let _serial = serial();
    let dir = tempdir();
    let config = dir.path().join("airlock.toml");
    std::fs::write(
        &config,
        "[policy.classes.hostile]\ndescription = \"hostile code\"\n\
         [policy.classes.hostile.bounds]\nisolation = \"gvisor\"\n\
         [policy.classes.hostile.commands]\ndefault = \"forbidden\"\nunmatched = \"allow\"\n",
    )
    .unwrap();
    let state = dir.path().join("state");
    let class_run = |extra: &[&str]| {
        let result = dir.path().join(format!("r{}.json", extra.len()));
        let out = Command::new(airlock_bin())
            .arg("run")
            .arg("--config")
            .arg(&config)
            .arg("--state-dir")
            .arg(&state)
            .arg("--result")
            .arg(&result)
            .args(["--class", "hostile"])
            .args(extra)
            .args(["--", "uname", "-r"])
            .stdin(Stdio::null())
            .output()
            .unwrap();
        CellRun::collect(out, &result)
    };
    let run = class_run(&[]);
    assert_eq!(run.status(), "ok", "{}", run.describe());
    let host_release = host_text("/proc/sys/kernel/osrelease");
    assert!(!run.stdout().contains(&host_release), "{}", run.describe());
    let request = dir.path().join("native.json");
    std::fs::write(&request, r#"{"isolation":"native"}"#).unwrap();
    let lowered = class_run(&["--request", request.to_str().unwrap()]);
    // Refused before any plan: the refusal is recorded, no result file is written.
    assert_eq!(lowered.code(), 125, "{}", lowered.describe());
    assert!(
        lowered.stderr().contains("policy_denied"),
        "{}",
        lowered.describe()
    );
    assert!(
        lowered.stderr().contains("policy.isolation_below_class"),
        "{}",
        lowered.describe()
    );
    assert!(
        lowered.stdout().is_empty(),
        "it ran:\n{}",
        lowered.describe()
    );
}
