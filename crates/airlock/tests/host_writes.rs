//! What airlock writes on the host, as root, is written safely: artifacts and the result
//! file never follow a symlink, never write into a FIFO, a hard link or a directory that
//! is already there, never replace a file; names that are not UTF-8 stay distinct and
//! reach no terminal raw; what cannot be delivered makes the run `delivery_failed`
//! (exit 123) in the result and the store; and no secret reaches any file airlock writes.
//!
//! Each attack prepares a victim outside the output directory and asserts it is
//! untouched: exit 0 with a changed victim is a breach.

mod common;

use serde_json::Value;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

const CONTRACT: &str = "\
filesystem:
  writable_paths: [output/, tmp/]
  output_allowlist: [output/report.txt, output/*.bin]
";

/// Every file below `/output` may leave the cell (for names chosen by the payload).
const ANY_NAME: &str = "\
filesystem:
  writable_paths: [output/]
  output_allowlist: [output/*]
";

const PRECIOUS: &str = "precious host data\n";
const DELIVERY_FAILED_EXIT: i32 = 123;

/// One test's directory: a state dir of its own, a victim file and a victim directory
/// outside the output directory `out`.
struct Scene {
    dir: tempfile::TempDir,
}

/// One `airlock` invocation.
struct Run {
    output: Output,
    result: Value,
}

impl Run {
    fn code(&self) -> i32 {
        self.output.status.code().unwrap_or(-1)
    }
    fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.output.stderr).into_owned()
    }
    fn status(&self) -> &str {
        self.result["status"].as_str().unwrap_or("")
    }
    fn describe(&self) -> String {
        format!(
            "exit {}\nstdout: {}\nstderr: {}\nresult: {}",
            self.code(),
            String::from_utf8_lossy(&self.output.stdout),
            self.stderr(),
            serde_json::to_string_pretty(&self.result).unwrap_or_default()
        )
    }
    /// `(path, reason)` of every artifact listed under `artifacts.<list>`.
    fn artifacts(&self, list: &str) -> Vec<(String, String)> {
        self.result["artifacts"][list]
            .as_array()
            .into_iter()
            .flatten()
            .map(|a| {
                let text = |k: &str| a[k].as_str().unwrap_or("").to_string();
                (text("path"), text("reason"))
            })
            .collect()
    }
}

impl Scene {
    fn new() -> Scene {
        let scene = Scene {
            dir: tempfile::tempdir().unwrap(),
        };
        std::fs::write(scene.victim(), PRECIOUS).unwrap();
        std::fs::create_dir(scene.victim_dir()).unwrap();
        scene
    }
    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
    fn out(&self) -> PathBuf {
        self.path("out")
    }
    fn victim(&self) -> PathBuf {
        self.path("victim")
    }
    fn victim_dir(&self) -> PathBuf {
        self.path("victim-dir")
    }
    fn state(&self) -> PathBuf {
        self.path("state")
    }

    /// `airlock <subcommand> --state-dir S <args>` in the scene's directory.
    fn airlock(&self, args: &[&str], envs: &[(&str, &str)]) -> Output {
        let (first, rest) = args.split_first().expect("a subcommand");
        Command::new(common::airlock_bin())
            .current_dir(self.dir.path())
            .arg(first)
            .arg("--state-dir")
            .arg(self.state())
            .args(rest)
            .envs(envs.iter().copied())
            .stdin(Stdio::null())
            .output()
            .expect("spawn airlock")
    }

    /// `airlock run --contract <contract> <extra> -- sh -c script`, reading the result
    /// file back from `result` (when it could be written).
    fn run(&self, contract: &str, extra: &[&str], result: &Path, script: &str) -> Run {
        self.run_with_env(contract, extra, result, script, &[])
    }

    fn run_with_env(
        &self,
        contract: &str,
        extra: &[&str],
        result: &Path,
        script: &str,
        envs: &[(&str, &str)],
    ) -> Run {
        let contract_path = self.path("contract.yaml");
        std::fs::write(&contract_path, contract).unwrap();
        let mut args = vec![
            "run",
            "--contract",
            contract_path.to_str().unwrap(),
            "--result",
            result.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        args.extend_from_slice(&["--", "/bin/sh", "-c", script]);
        let output = self.airlock(&args, envs);
        let result = std::fs::read(result)
            .ok()
            .and_then(|t| serde_json::from_slice(&t).ok())
            .unwrap_or(Value::Null);
        Run { output, result }
    }

    /// A run writing `attacker` to `/output/report.txt` with `--output-dir out`.
    fn run_report(&self) -> Run {
        let out = self.out();
        self.run(
            CONTRACT,
            &["--output-dir", out.to_str().unwrap()],
            &self.path("result.json"),
            "echo attacker > /output/report.txt",
        )
    }

    fn assert_victims_untouched(&self, run: &Run) {
        assert_eq!(
            std::fs::read_to_string(self.victim()).ok().as_deref(),
            Some(PRECIOUS),
            "the victim file outside the output directory changed\n{}",
            run.describe()
        );
        let inside: Vec<_> = std::fs::read_dir(self.victim_dir())
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        assert!(
            inside.is_empty(),
            "files appeared in the victim directory: {inside:?}\n{}",
            run.describe()
        );
    }

    /// The run's record in the store, as `airlock runs show --json` prints it.
    fn stored_run(&self, run: &Run) -> Value {
        let listed = self.airlock(&["runs", "list", "--json"], &[]);
        let runs: Value = serde_json::from_slice(&listed.stdout).unwrap_or(Value::Null);
        let id = runs[0]["run_id"]
            .as_str()
            .unwrap_or_else(|| panic!("no stored run\n{}", run.describe()))
            .to_string();
        let shown = self.airlock(&["runs", "show", &id, "--json"], &[]);
        serde_json::from_slice(&shown.stdout).unwrap()
    }
}

/// Asserts the run lost `/output/report.txt` to the host side with `reason`, and says so:
/// class `delivery_failed`, exit 123, in the result and in the store.
fn assert_undelivered(scene: &Scene, run: &Run, reason: &str) {
    let d = run.describe();
    assert_eq!(run.code(), DELIVERY_FAILED_EXIT, "{d}");
    assert_eq!(run.status(), "delivery_failed", "{d}");
    assert!(
        run.artifacts("undelivered")
            .contains(&("/output/report.txt".to_string(), reason.to_string())),
        "/output/report.txt not listed undelivered with {reason}\n{d}"
    );
    assert!(run.artifacts("kept").is_empty(), "{d}");
    let stored = scene.stored_run(run);
    assert_eq!(stored["run"]["status"], "delivery_failed", "{stored}\n{d}");
    assert!(
        stored.to_string().contains(reason),
        "the store does not name {reason}: {stored}"
    );
}

#[test]
fn a_symlink_at_an_artifact_name_does_not_redirect_the_write() {
    require_cells!();
    let scene = Scene::new();
    std::fs::create_dir_all(scene.out().join("output")).unwrap();
    std::os::unix::fs::symlink(scene.victim(), scene.out().join("output/report.txt")).unwrap();
    let run = scene.run_report();
    scene.assert_victims_untouched(&run);
    assert_undelivered(&scene, &run, "artifact.destination_exists");
    let link = std::fs::symlink_metadata(scene.out().join("output/report.txt")).unwrap();
    assert!(link.file_type().is_symlink(), "the symlink is left alone");
}

#[test]
fn a_symlinked_parent_directory_does_not_redirect_the_write() {
    require_cells!();
    let scene = Scene::new();
    std::fs::create_dir(scene.out()).unwrap();
    std::os::unix::fs::symlink(scene.victim_dir(), scene.out().join("output")).unwrap();
    let run = scene.run_report();
    scene.assert_victims_untouched(&run);
    assert_undelivered(&scene, &run, "artifact.destination_unsafe");
}

#[test]
fn a_symlinked_output_dir_is_refused_not_followed() {
    require_cells!();
    let scene = Scene::new();
    std::os::unix::fs::symlink(scene.victim_dir(), scene.out()).unwrap();
    let run = scene.run_report();
    scene.assert_victims_untouched(&run);
    assert_undelivered(&scene, &run, "artifact.output_dir_unusable");
}

#[test]
fn a_fifo_at_an_artifact_name_is_not_written_into() {
    require_cells!();
    let scene = Scene::new();
    std::fs::create_dir_all(scene.out().join("output")).unwrap();
    let fifo = scene.out().join("output/report.txt");
    assert!(Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success());
    // Held open for reading and writing, so that a writer opening it does not block and
    // whatever it writes stays in the pipe, to be found below.
    use std::os::unix::fs::OpenOptionsExt;
    let mut reader = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(&fifo)
        .unwrap();
    let run = scene.run_report();
    let mut written = Vec::new();
    let _ = std::io::Read::read_to_end(&mut reader, &mut written);
    assert!(
        written.is_empty(),
        "airlock wrote {:?} into the FIFO\n{}",
        String::from_utf8_lossy(&written),
        run.describe()
    );
    scene.assert_victims_untouched(&run);
    assert_undelivered(&scene, &run, "artifact.destination_exists");
}

#[test]
fn a_hard_link_at_an_artifact_name_does_not_write_the_linked_file() {
    require_cells!();
    let scene = Scene::new();
    std::fs::create_dir_all(scene.out().join("output")).unwrap();
    std::fs::hard_link(scene.victim(), scene.out().join("output/report.txt")).unwrap();
    let run = scene.run_report();
    scene.assert_victims_untouched(&run);
    assert_undelivered(&scene, &run, "artifact.destination_exists");
}

#[test]
fn a_directory_where_the_artifact_goes_is_refused() {
    require_cells!();
    let scene = Scene::new();
    std::fs::create_dir_all(scene.out().join("output/report.txt")).unwrap();
    let run = scene.run_report();
    scene.assert_victims_untouched(&run);
    assert_undelivered(&scene, &run, "artifact.destination_exists");
}

#[test]
fn an_artifact_of_an_earlier_run_is_not_overwritten_and_the_message_says_what_to_do() {
    require_cells!();
    let scene = Scene::new();
    let out = scene.out();
    let first = scene.run(
        CONTRACT,
        &["--output-dir", out.to_str().unwrap()],
        &scene.path("first.json"),
        "echo first > /output/report.txt",
    );
    assert_eq!(first.code(), 0, "{}", first.describe());
    let second = scene.run(
        CONTRACT,
        &["--output-dir", out.to_str().unwrap()],
        &scene.path("second.json"),
        "echo second > /output/report.txt",
    );
    assert_eq!(
        std::fs::read_to_string(out.join("output/report.txt")).unwrap(),
        "first\n",
        "{}",
        second.describe()
    );
    assert_undelivered(&scene, &second, "artifact.destination_exists");
    assert!(
        second.stderr().contains("remove it or choose a path"),
        "{}",
        second.describe()
    );
}

#[test]
fn artifacts_whose_names_are_not_utf8_arrive_as_two_files() {
    require_cells!();
    let scene = Scene::new();
    let out = scene.out();
    let run = scene.run(
        ANY_NAME,
        &["--output-dir", out.to_str().unwrap()],
        &scene.path("result.json"),
        r"printf ff > /output/n$(printf '\377'); printf fe > /output/n$(printf '\376')",
    );
    let d = run.describe();
    assert_eq!((run.code(), run.status()), (0, "ok"), "{d}");
    let kept = run.artifacts("kept");
    let paths: Vec<&str> = kept.iter().map(|(p, _)| p.as_str()).collect();
    assert_eq!(paths, [r"/output/n\xFE", r"/output/n\xFF"], "{d}");
    for (byte, content) in [(0xfeu8, "fe"), (0xff, "ff")] {
        let name = [b'n', byte];
        let host = out.join("output").join(OsStr::from_bytes(&name));
        assert_eq!(
            std::fs::read_to_string(&host).ok().as_deref(),
            Some(content),
            "{}\n{d}",
            host.display()
        );
    }
    let on_host = std::fs::read_dir(out.join("output")).unwrap().count();
    assert_eq!(on_host, 2, "two artifacts, two files\n{d}");
}

#[test]
fn an_artifact_name_with_a_newline_and_escape_codes_reaches_no_terminal_raw() {
    require_cells!();
    let scene = Scene::new();
    // The output "directory" is a file: the artifact is lost and stderr names it.
    std::fs::write(scene.out(), "").unwrap();
    let out = scene.out();
    let run = scene.run(
        ANY_NAME,
        &["--output-dir", out.to_str().unwrap()],
        &scene.path("result.json"),
        r"printf x > /output/$(printf 'evil\n\033[2Jname\033]0;title\007')",
    );
    let d = run.describe();
    assert_eq!(run.code(), DELIVERY_FAILED_EXIT, "{d}");
    let escaped = r"/output/evil\x0A\x1B[2Jname\x1B]0;title\x07";
    assert_eq!(
        run.artifacts("undelivered"),
        [(
            escaped.to_string(),
            "artifact.output_dir_unusable".to_string()
        )],
        "{d}"
    );
    let stderr = &run.output.stderr;
    assert!(
        !stderr.iter().any(|b| *b == 0x1b || *b == 0x07),
        "a raw escape code reached the terminal: {stderr:?}"
    );
    assert!(
        run.stderr()
            .lines()
            .any(|l| l.contains(escaped) && l.contains("artifact.output_dir_unusable")),
        "stderr does not name the lost artifact, escaped, on one line\n{d}"
    );
}

#[test]
fn an_output_dir_that_is_a_file_fails_the_run_as_delivery_failed() {
    require_cells!();
    let scene = Scene::new();
    std::fs::write(scene.out(), PRECIOUS).unwrap();
    let run = scene.run_report();
    assert_undelivered(&scene, &run, "artifact.output_dir_unusable");
    assert_eq!(std::fs::read_to_string(scene.out()).unwrap(), PRECIOUS);
    assert!(
        run.stderr().contains("delivery_failed"),
        "{}",
        run.describe()
    );
}

#[test]
fn a_read_only_output_dir_fails_the_run_as_delivery_failed() {
    require_cells!();
    let scene = Scene::new();
    std::fs::create_dir(scene.out()).unwrap();
    let contract = scene.path("contract.yaml");
    std::fs::write(&contract, CONTRACT).unwrap();
    let result = scene.path("result.json");
    // Root ignores mode bits: a read-only mount, in a mount namespace of this run only,
    // makes the directory really unwritable.
    let script = format!(
        "mount -t tmpfs -o ro,size=64k tmpfs '{out}' && exec '{bin}' run --state-dir '{state}' \
         --contract '{contract}' --result '{result}' --output-dir '{out}' \
         -- /bin/sh -c 'echo x > /output/report.txt'",
        out = scene.out().display(),
        bin = common::airlock_bin().display(),
        state = scene.state().display(),
        contract = contract.display(),
        result = result.display(),
    );
    let output = Command::new("unshare")
        .args([
            "--mount",
            "--propagation",
            "private",
            "/bin/sh",
            "-c",
            &script,
        ])
        .current_dir(scene.dir.path())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let result = std::fs::read(&result)
        .ok()
        .and_then(|t| serde_json::from_slice(&t).ok())
        .unwrap_or(Value::Null);
    let run = Run { output, result };
    assert_undelivered(&scene, &run, "artifact.write_failed");
}

#[test]
fn a_result_file_in_a_missing_directory_fails_the_run_and_the_store_says_so() {
    require_cells!();
    let scene = Scene::new();
    let run = scene.run(CONTRACT, &[], &scene.path("nodir/r.json"), "true");
    let d = run.describe();
    assert_eq!(run.code(), DELIVERY_FAILED_EXIT, "{d}");
    assert!(run.stderr().contains("nodir/r.json"), "{d}");
    let stored = scene.stored_run(&run);
    assert_eq!(stored["run"]["status"], "delivery_failed", "{stored}");
    assert!(
        stored.to_string().contains("the result file"),
        "the store does not say the result file was lost: {stored}"
    );
}

#[test]
fn an_existing_result_file_or_symlink_is_not_replaced() {
    require_cells!();
    let scene = Scene::new();
    let existing = scene.path("existing.json");
    std::fs::write(&existing, PRECIOUS).unwrap();
    let link = scene.path("link.json");
    std::os::unix::fs::symlink(scene.victim(), &link).unwrap();
    for result in [&existing, &link] {
        let run = scene.run(CONTRACT, &[], result, "true");
        let d = run.describe();
        assert_eq!(
            run.code(),
            DELIVERY_FAILED_EXIT,
            "{}: {d}",
            result.display()
        );
        assert!(run.stderr().contains("already exists"), "{d}");
        scene.assert_victims_untouched(&run);
    }
    assert_eq!(std::fs::read_to_string(&existing).unwrap(), PRECIOUS);
    assert!(std::fs::symlink_metadata(&link)
        .unwrap()
        .file_type()
        .is_symlink());
}

#[test]
fn an_artifact_rejected_by_policy_is_not_a_delivery_failure() {
    require_cells!();
    let scene = Scene::new();
    let out = scene.out();
    let run = scene.run(
        CONTRACT,
        &["--output-dir", out.to_str().unwrap()],
        &scene.path("result.json"),
        "echo x > /output/undeclared.txt; ln -s /etc/passwd /output/link.bin",
    );
    let d = run.describe();
    assert_eq!((run.code(), run.status()), (0, "ok"), "{d}");
    assert_eq!(run.artifacts("rejected").len(), 2, "{d}");
    assert!(run.artifacts("undelivered").is_empty(), "{d}");
}

/// Every file below `dir`, with its bytes.
fn files_below(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            files.extend(files_below(&path));
        } else if let Ok(bytes) = std::fs::read(&path) {
            files.push((path, bytes));
        }
    }
    files
}

fn contains(haystack: &[u8], needle: &str) -> bool {
    haystack
        .windows(needle.len())
        .any(|w| w == needle.as_bytes())
}

/// Asserts no secret is in any of `outputs` (what, bytes).
fn assert_no_secret(outputs: &[(String, Vec<u8>)], secrets: &[&str]) {
    for (what, bytes) in outputs {
        for secret in secrets {
            assert!(
                !contains(bytes, secret),
                "{what} holds the secret {secret}: {}",
                String::from_utf8_lossy(bytes)
            );
        }
    }
}

/// Everything airlock wrote in `scene` besides the artifacts' content: the result file,
/// every file of the store (database, WAL, shm), `audit export`, `runs list` and `runs
/// show` as printed, and the run's own stdout/stderr when given.
fn everything_written(
    scene: &Scene,
    result: &Path,
    run: Option<&Output>,
) -> Vec<(String, Vec<u8>)> {
    let mut outputs: Vec<(String, Vec<u8>)> = files_below(&scene.state())
        .into_iter()
        .map(|(p, b)| (p.display().to_string(), b))
        .collect();
    assert!(
        outputs.len() >= 2,
        "the store holds too few files: {outputs:?}"
    );
    outputs.push((
        "the result file".into(),
        std::fs::read(result).expect("the result file"),
    ));
    let export = scene.airlock(&["audit", "export", "--format", "jsonl"], &[]);
    assert!(export.status.success() && !export.stdout.is_empty());
    outputs.push(("audit export".into(), export.stdout));
    let listed = scene.airlock(&["runs", "list", "--json"], &[]);
    let runs: Value = serde_json::from_slice(&listed.stdout).unwrap();
    outputs.push(("runs list".into(), listed.stdout));
    for run in runs.as_array().unwrap() {
        let id = run["run_id"].as_str().unwrap();
        for args in [vec!["runs", "show", id], vec!["runs", "show", id, "--json"]] {
            let shown = scene.airlock(&args, &[]);
            outputs.push((args.join(" "), [shown.stdout, shown.stderr].concat()));
        }
    }
    if let Some(run) = run {
        outputs.push(("airlock run's stderr".into(), run.stderr.clone()));
    }
    outputs
}

#[test]
fn no_secret_value_reaches_any_file_or_stream_airlock_writes() {
    require_cells!();
    let scene = Scene::new();
    let (env_secret, credential) = ("envsecret-9f8e7d6c5b", "credsecret-1a2b3c4d5e");
    let contract = format!(
        "env:\n  TOKEN: {{ value: \"{env_secret}\", secret: true }}\n\
         credentials:\n  - {{ name: api, env: API_KEY, from_env: AIRLOCK_TEST_HOSTFS_KEY }}\n\
         filesystem:\n  writable_paths: [output/]\n  output_allowlist: [output/*]\n"
    );
    let out = scene.out();
    let result = scene.path("result.json");
    // The payload prints both values on stdout (the caller's stream: the bounded copy in
    // the records must be redacted) and writes an artifact; it prints nothing on stderr,
    // so airlock's stderr is airlock's own.
    let run = scene.run_with_env(
        &contract,
        &["--output-dir", out.to_str().unwrap()],
        &result,
        "echo \"token=$TOKEN key=$API_KEY\"; echo report > /output/report.txt",
        &[("AIRLOCK_TEST_HOSTFS_KEY", credential)],
    );
    let d = run.describe();
    assert_eq!((run.code(), run.status()), (0, "ok"), "{d}");
    assert!(
        contains(&run.output.stdout, env_secret) && contains(&run.output.stdout, credential),
        "the payload saw its secrets\n{d}"
    );
    let mode = std::fs::metadata(&result).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "the result file's mode");
    assert!(
        run.result["output"]["stdout"]["head"]
            .as_str()
            .unwrap_or("")
            .contains("[REDACTED]"),
        "{d}"
    );
    let mut outputs = everything_written(&scene, &result, Some(&run.output));
    outputs.push((
        "the artifacts' metadata".into(),
        run.result["artifacts"].to_string().into_bytes(),
    ));
    assert_no_secret(&outputs, &[env_secret, credential]);
    assert_eq!(files_below(&out).len(), 1, "{d}");
}

#[test]
fn a_refused_run_writes_no_secret_env_value_to_its_result_or_the_store() {
    require_cells!();
    let scene = Scene::new();
    let env_secret = "refusedsecret-0a9b8c7d";
    // The credential's supervisor variable is unset: the run is refused before a cell.
    let contract = format!(
        "env:\n  TOKEN: {{ value: \"{env_secret}\", secret: true }}\n\
         credentials:\n  - {{ name: api, env: API_KEY, from_env: AIRLOCK_TEST_HOSTFS_UNSET }}\n"
    );
    let result = scene.path("result.json");
    let run = scene.run(&contract, &[], &result, "true");
    let d = run.describe();
    assert_eq!((run.code(), run.status()), (125, "policy_denied"), "{d}");
    let outputs = everything_written(&scene, &result, Some(&run.output));
    assert_no_secret(&outputs, &[env_secret]);
    let mode = std::fs::metadata(&result).unwrap().mode();
    assert_eq!(mode & 0o777, 0o600, "the result file's mode");
}
