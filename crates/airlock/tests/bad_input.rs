//! Malformed and hostile-but-ordinary input, through the real binary: contracts, operator
//! configs, flags, commands, stdin shapes and state locations. For each case: the exact
//! exit code, the result class, that the message names the problem, and that nothing is
//! left behind or lost (no cell cgroup of that run, no record left `running`, and a record
//! for every run that got as far as the store).

mod common;

use common::{airlock_bin, host};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// What the case feeds on stdin.
#[derive(Clone, Copy)]
enum Input {
    Null,
    Bytes(&'static [u8]),
    /// `yes`: an endless stream.
    Endless,
    /// A writer that sends a line, then holds its end open for this long.
    Slow(u64),
    /// fd 0 closed.
    Closed,
    /// A regular file with these bytes.
    File(&'static [u8]),
    /// A directory opened for reading.
    Directory,
}

/// What the case expects of the store afterwards.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Records {
    /// Rejected before the store was opened (usage errors, unusable state dirs).
    None,
    /// Exactly one new record, finished (not `running`).
    One,
}

struct Case {
    name: &'static str,
    /// Files written into the case's directory first: (name, content).
    files: &'static [(&'static str, &'static [u8])],
    /// Arguments after `airlock`; `{dir}` is the case's directory, `{state}` its store.
    args: &'static [&'static str],
    input: Input,
    code: i32,
    /// `status` of the result file (`--result {dir}/r.json`), when one must exist.
    class: Option<&'static str>,
    /// Every one must appear in stderr (or stdout for query commands).
    says: &'static [&'static str],
    records: Records,
}

const fn case(name: &'static str, args: &'static [&'static str], code: i32) -> Case {
    Case {
        name,
        files: &[],
        args,
        input: Input::Null,
        code,
        class: None,
        says: &[],
        records: Records::None,
    }
}

struct Outcome {
    code: i32,
    text: String,
    result: Value,
    records: Vec<Value>,
    elapsed: Duration,
    leftover_cgroups: Vec<PathBuf>,
}

fn expand(arg: &str, dir: &Path) -> String {
    arg.replace("{dir}", &dir.display().to_string())
        .replace("{state}", &dir.join("state").display().to_string())
}

fn stdin_of(input: Input, dir: &Path) -> (Stdio, Option<std::process::Child>) {
    match input {
        Input::Null => (Stdio::null(), None),
        Input::Bytes(_) => (Stdio::piped(), None),
        Input::Endless => {
            let mut yes = Command::new("yes").stdout(Stdio::piped()).spawn().unwrap();
            let out = yes.stdout.take().unwrap();
            (Stdio::from(out), Some(yes))
        }
        Input::Slow(seconds) => {
            let mut writer = Command::new("sh")
                .args(["-c", &format!("echo first; sleep {seconds}")])
                .stdout(Stdio::piped())
                .spawn()
                .unwrap();
            let out = writer.stdout.take().unwrap();
            (Stdio::from(out), Some(writer))
        }
        Input::Closed => (Stdio::null(), None),
        Input::File(bytes) => {
            let path = dir.join("stdin.bin");
            std::fs::write(&path, bytes).unwrap();
            (Stdio::from(std::fs::File::open(path).unwrap()), None)
        }
        Input::Directory => (Stdio::from(std::fs::File::open(dir).unwrap()), None),
    }
}

fn run_case(c: &Case) -> Outcome {
    let dir = tempfile::tempdir().unwrap();
    for (name, content) in c.files {
        let path = dir.path().join(name);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, content).unwrap();
    }
    let args: Vec<String> = c.args.iter().map(|a| expand(a, dir.path())).collect();
    let (stdin, mut writer) = stdin_of(c.input, dir.path());
    // `Stdio` cannot express a closed fd 0: a shell closes it and execs airlock.
    let mut cmd = if matches!(c.input, Input::Closed) {
        let mut shell = Command::new("sh");
        shell
            .args(["-c", "exec 0<&-; exec \"$0\" \"$@\""])
            .arg(airlock_bin());
        shell
    } else {
        Command::new(airlock_bin())
    };
    cmd.args(&args)
        .current_dir(dir.path())
        .stdin(stdin)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .env_remove("AIRLOCK_TEST_UNSET_CREDENTIAL");
    let started = Instant::now();
    let mut child = cmd.spawn().expect("spawn airlock");
    let pid = child.id();
    if let Input::Bytes(bytes) = c.input {
        use std::io::Write;
        let mut pipe = child.stdin.take().unwrap();
        let _ = pipe.write_all(bytes);
    }
    let output = child.wait_with_output().unwrap();
    let elapsed = started.elapsed();
    if let Some(w) = writer.as_mut() {
        let _ = w.kill();
        let _ = w.wait();
    }
    let result = std::fs::read_to_string(dir.path().join("r.json"))
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or(Value::Null);
    Outcome {
        code: output.status.code().unwrap_or(-1),
        text: format!(
            "{}{}",
            String::from_utf8_lossy(&output.stderr),
            String::from_utf8_lossy(&output.stdout)
        ),
        result,
        records: records_in(&dir.path().join("state")),
        elapsed,
        leftover_cgroups: cgroups_of_supervisor(pid),
    }
}

/// Every run in the case's store, whoever started it.
fn records_in(state: &Path) -> Vec<Value> {
    if !state.join("airlock.db").exists() {
        return Vec::new();
    }
    let out = Command::new(airlock_bin())
        .args(["runs", "list", "--json", "--all-users", "--state-dir"])
        .arg(state)
        .output()
        .unwrap();
    serde_json::from_slice(&out.stdout).unwrap_or_default()
}

/// Cell cgroups named for this supervisor (`<pid>-<start time>-<ns>`, see cgroup.rs) that
/// still exist after it exited.
fn cgroups_of_supervisor(pid: u32) -> Vec<PathBuf> {
    let prefix = format!("{pid}-");
    host::cell_cgroup_dirs()
        .into_iter()
        .filter(|d| {
            d.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with(&prefix))
        })
        .collect()
}

/// Runs every case and reports all the ways they failed at once.
fn check_all(cases: &[Case]) {
    if !common::cells_available() {
        return;
    }
    let mut failures = Vec::new();
    for c in cases {
        let out = run_case(c);
        let mut wrong = Vec::new();
        if out.code != c.code {
            wrong.push(format!("exit {} (expected {})", out.code, c.code));
        }
        if let Some(class) = c.class {
            // The result file's class, or the store's when no result file could be written.
            let recorded_class = match (&out.result, out.records.first()) {
                (Value::Null, Some(record)) => record["status"].clone(),
                (result, _) => result["status"].clone(),
            };
            if recorded_class != class {
                wrong.push(format!("class {recorded_class} (expected {class})"));
            }
        }
        for needle in c.says {
            if !out.text.contains(needle) {
                wrong.push(format!("the message does not say {needle:?}"));
            }
        }
        let unfinished = out
            .records
            .iter()
            .filter(|r| r["status"] == "running")
            .count();
        let recorded = match out.records.len() {
            0 => Records::None,
            1 => Records::One,
            n => {
                wrong.push(format!("{n} records for one command"));
                Records::One
            }
        };
        if recorded != c.records {
            wrong.push(format!("records {recorded:?} (expected {:?})", c.records));
        }
        if unfinished > 0 {
            wrong.push(format!("{unfinished} record(s) left running"));
        }
        if !out.leftover_cgroups.is_empty() {
            wrong.push(format!("cgroups left: {:?}", out.leftover_cgroups));
        }
        if out.elapsed > Duration::from_secs(20) {
            wrong.push(format!("took {:?}", out.elapsed));
        }
        if !wrong.is_empty() {
            failures.push(format!(
                "{}: {}\n  output: {}\n  result: {}",
                c.name,
                wrong.join("; "),
                out.text.trim(),
                out.result
            ));
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

/// `run` with a result file and the case's own store.
macro_rules! run_args {
    ($($arg:expr),* $(,)?) => {
        &["run", "--state-dir", "{state}", "--result", "{dir}/r.json", $($arg),*]
    };
}

#[test]
fn flags_and_subcommands() {
    check_all(&[
        Case {
            says: &["unexpected argument '--contrat'", "--contract"],
            ..case(
                "a misspelt option is a usage error, never the command",
                &[
                    "run",
                    "--state-dir",
                    "{state}",
                    "--contrat",
                    "c.yaml",
                    "--",
                    "true",
                ],
                2,
            )
        },
        Case {
            says: &["a command is required", "OCI image"],
            ..case("run without a command", &["run"], 2)
        },
        Case {
            says: &["invalid value 'abc'", "--max-artifact-bytes"],
            ..case(
                "a non-numeric size",
                &["run", "--max-artifact-bytes", "abc", "--", "true"],
                2,
            )
        },
        Case {
            says: &["unrecognized subcommand 'frobnicate'"],
            ..case("an unknown subcommand", &["frobnicate"], 2)
        },
        Case {
            says: &["age \"yesterday\"", "a number followed by s, m, h or d"],
            ..case(
                "an age that is not a duration",
                &[
                    "runs",
                    "list",
                    "--state-dir",
                    "{state}",
                    "--since",
                    "yesterday",
                ],
                1,
            )
        },
        Case {
            says: &["age \"5x\"", "unit must be s, m, h or d"],
            ..case(
                "an age with an unknown unit",
                &[
                    "runs",
                    "prune",
                    "--state-dir",
                    "{state}",
                    "--older-than",
                    "5x",
                ],
                1,
            )
        },
        Case {
            says: &["export format \"csv\" is not supported", "jsonl"],
            ..case(
                "an unsupported export format",
                &[
                    "audit",
                    "export",
                    "--state-dir",
                    "{state}",
                    "--format",
                    "csv",
                ],
                1,
            )
        },
        Case {
            says: &["no run 0000-nope"],
            ..case(
                "showing a run that does not exist",
                &["runs", "show", "--state-dir", "{state}", "0000-nope"],
                1,
            )
        },
    ]);
}

#[test]
fn contracts() {
    check_all(&[
        Case {
            class: Some("runtime_fault"),
            says: &["cannot read contract", "missing.yaml", "No such file"],
            records: Records::One,
            ..case("a contract file that does not exist", run_args!["-c", "missing.yaml", "--", "true"], 125)
        },
        Case {
            files: &[("sub/.keep", b"")],
            class: Some("runtime_fault"),
            says: &["cannot read contract", "is a directory"],
            records: Records::One,
            ..case("a directory as the contract", run_args!["-c", "{dir}", "--", "true"], 125)
        },
        Case {
            files: &[("c.txt", b"hostname: x\n")],
            class: Some("policy_denied"),
            says: &["unknown contract extension `txt`", ".yaml, .yml, .toml or .json"],
            records: Records::One,
            ..case("an unknown extension", run_args!["-c", "c.txt", "--", "true"], 125)
        },
        Case {
            files: &[("c.yaml", b"")],
            class: Some("policy_denied"),
            says: &["the document is empty"],
            records: Records::One,
            ..case("an empty contract", run_args!["-c", "c.yaml", "--", "true"], 125)
        },
        Case {
            files: &[("c.yaml", b"a: [\n")],
            class: Some("policy_denied"),
            says: &["YAML contract does not parse", "line 1"],
            records: Records::One,
            ..case("YAML that does not parse", run_args!["-c", "c.yaml", "--", "true"], 125)
        },
        Case {
            files: &[("c.yaml", b"hostname: a\nhostname: b\n")],
            class: Some("policy_denied"),
            says: &["duplicate mapping key: hostname"],
            records: Records::One,
            ..case("a key given twice", run_args!["-c", "c.yaml", "--", "true"], 125)
        },
        Case {
            files: &[("c.yaml", b"bogus: 1\n")],
            class: Some("policy_denied"),
            says: &["bogus: unknown field", "expected one of"],
            records: Records::One,
            ..case("an unknown field", run_args!["-c", "c.yaml", "--", "true"], 125)
        },
        Case {
            files: &[("c.yaml", b"resources:\n  memory_mb: -5\n")],
            class: Some("policy_denied"),
            says: &["resources.memory_mb: must be at least"],
            records: Records::One,
            ..case("a negative memory ceiling", run_args!["-c", "c.yaml", "--", "true"], 125)
        },
        Case {
            files: &[("c.yaml", b"resources:\n  process_limit: 4097\n")],
            class: Some("policy_denied"),
            says: &["resources.process_limit: must be at most 4096"],
            records: Records::One,
            ..case("a process limit over its bound", run_args!["-c", "c.yaml", "--", "true"], 125)
        },
        Case {
            files: &[("c.yaml", b"resources:\n  process_limit: 1\n")],
            class: Some("ok"),
            records: Records::One,
            ..case(
                "the smallest process limit that validates also runs",
                run_args!["-c", "c.yaml", "--", "true"],
                0,
            )
        },
        Case {
            files: &[("c.json", b"\xef\xbb\xbf{\"resources\": {\"memory_mb\": 64}}")],
            class: Some("ok"),
            records: Records::One,
            ..case("a JSON contract with a byte-order mark", run_args!["-c", "c.json", "--", "true"], 0)
        },
        Case {
            files: &[("c.toml", b"\xef\xbb\xbfhostname = \"bom\"\n")],
            class: Some("ok"),
            records: Records::One,
            ..case("a TOML contract with a byte-order mark", run_args!["-c", "c.toml", "--", "true"], 0)
        },
        Case {
            files: &[("c.yaml", b"filesystem:\n  writable_paths:\n    - /etc\n")],
            class: Some("policy_denied"),
            says: &["filesystem.writable_paths[0]: must not be or lie under /etc"],
            records: Records::One,
            ..case("a writable path over the generated /etc", run_args!["-c", "c.yaml", "--", "true"], 125)
        },
        Case {
            files: &[(
                "c.yaml",
                b"filesystem:\n  readonly_inputs:\n    - source: /nonexistent/airlock-input\n      target: /input\n",
            )],
            class: Some("runtime_fault"),
            says: &["read-only input /nonexistent/airlock-input", "/input", "No such file"],
            records: Records::One,
            ..case("a read-only input that does not exist", run_args!["-c", "c.yaml", "--", "true"], 125)
        },
        Case {
            files: &[("c.yaml", b"image: ubuntu:latest\n")],
            class: Some("policy_denied"),
            says: &["image: ", "a tag without a digest"],
            records: Records::One,
            ..case("an image not pinned by digest", run_args!["-c", "c.yaml", "--", "true"], 125)
        },
        Case {
            files: &[(
                "c.yaml",
                b"image: ubuntu@sha256:0000000000000000000000000000000000000000000000000000000000000000\n",
            )],
            class: Some("sandbox_unavailable"),
            says: &["image ubuntu@sha256:", "airlock image pull"],
            records: Records::One,
            ..case("an image not in the store", run_args!["-c", "c.yaml", "--", "true"], 125)
        },
        Case {
            files: &[("c.yaml", b"cleanup:\n  destroy_runtime: false\n")],
            class: Some("policy_denied"),
            says: &["cleanup.destroy_runtime: must be true"],
            records: Records::One,
            ..case("a contract that asks to keep its cell", run_args!["-c", "c.yaml", "--", "true"], 125)
        },
        Case {
            files: &[(
                "c.yaml",
                b"credentials:\n  - name: tok\n    env: TOKEN\n    from_env: AIRLOCK_TEST_UNSET_CREDENTIAL\n",
            )],
            class: Some("policy_denied"),
            says: &["credential tok", "AIRLOCK_TEST_UNSET_CREDENTIAL is not set"],
            records: Records::One,
            ..case("a credential whose source is not set", run_args!["-c", "c.yaml", "--", "true"], 125)
        },
        Case {
            files: &[("c.yaml", b"network:\n  mode: allowlist\n  allowed_domains: [api.test]\n")],
            class: Some("sandbox_unavailable"),
            says: &["api.test", "no operator configuration (--config)", "[egress] resolve"],
            records: Records::One,
            ..case(
                "an allowlist with no operator configuration to resolve it",
                run_args!["-c", "c.yaml", "--", "true"],
                125,
            )
        },
        Case {
            files: &[
                ("c.yaml", b"network:\n  mode: allowlist\n  allowed_domains: [api.test, other.test]\n"),
                ("airlock.toml", b"[egress]\nresolve = { \"api.test\" = \"127.0.0.2\" }\n"),
            ],
            class: Some("sandbox_unavailable"),
            says: &["other.test", "airlock.toml cannot resolve"],
            records: Records::One,
            ..case(
                "an allowlisted name the operator configuration cannot resolve",
                run_args!["-c", "c.yaml", "--config", "airlock.toml", "--", "true"],
                125,
            )
        },
    ]);
}

#[test]
fn operator_configs() {
    check_all(&[
        Case {
            class: Some("runtime_fault"),
            says: &["reading config", "missing.toml"],
            ..case(
                "a config that does not exist",
                run_args!["--config", "missing.toml", "--", "true"],
                125,
            )
        },
        Case {
            files: &[("a.toml", b"[egress]\nresolv = {}\n")],
            class: Some("runtime_fault"),
            says: &["config a.toml", "unknown field `resolv`"],
            ..case(
                "an unknown config key",
                run_args!["--config", "a.toml", "--", "true"],
                125,
            )
        },
        Case {
            files: &[("a.toml", b"[egress]\nmax_connections = 0\n")],
            class: Some("runtime_fault"),
            says: &["egress.max_connections = 0: must be between 1 and 4096"],
            ..case(
                "a config value out of its bound",
                run_args!["--config", "a.toml", "--", "true"],
                125,
            )
        },
        Case {
            files: &[("a.toml", b"[egress]\nexempt_cidrs = [\"10.0.0.0/99\"]\n")],
            class: Some("runtime_fault"),
            says: &["config a.toml", "exempt_cidrs"],
            ..case(
                "a malformed CIDR",
                run_args!["--config", "a.toml", "--", "true"],
                125,
            )
        },
        Case {
            files: &[("a.toml", b"[store]\nstate_dir = \"relative/dir\"\n")],
            class: Some("runtime_fault"),
            says: &["store.state_dir", "must be an absolute path"],
            ..case(
                "a relative state dir in the config",
                run_args!["--config", "a.toml", "--", "true"],
                125,
            )
        },
        Case {
            files: &[("a.toml", b"\xef\xbb\xbf[egress]\nmax_connections = 4\n")],
            class: Some("ok"),
            records: Records::One,
            ..case(
                "a config with a byte-order mark",
                run_args!["--config", "a.toml", "--", "true"],
                0,
            )
        },
        Case {
            files: &[("a.toml", b"[egress]\nidle_timeout_ms = 0\n")],
            says: &["a.toml", "egress.idle_timeout_ms = 0"],
            ..case(
                "config check names the bad key",
                &["config", "check", "a.toml"],
                1,
            )
        },
        Case {
            files: &[("a.toml", b"[egress]\nmax_connections = 8\n")],
            says: &["a.toml: ok"],
            ..case(
                "config check accepts a good file",
                &["config", "check", "a.toml"],
                0,
            )
        },
    ]);
}

#[test]
fn commands_and_state_locations() {
    check_all(&[
        Case {
            class: Some("task_error"),
            says: &["no-such-command-here: command not found"],
            records: Records::One,
            ..case(
                "a command that does not exist",
                run_args!["--", "no-such-command-here"],
                127,
            )
        },
        Case {
            class: Some("task_error"),
            says: &["/usr: is a directory, not a command"],
            records: Records::One,
            ..case("a directory as the command", run_args!["--", "/usr"], 126)
        },
        Case {
            class: Some("task_error"),
            says: &["/etc/hostname: Permission denied"],
            records: Records::One,
            ..case(
                "a file that is not executable",
                run_args!["--", "/etc/hostname"],
                126,
            )
        },
        Case {
            class: Some("task_error"),
            says: &["--weird: command not found"],
            records: Records::One,
            ..case(
                "a command after -- that looks like an option",
                run_args!["--", "--weird"],
                127,
            )
        },
        Case {
            files: &[("state", b"a file, not a directory")],
            class: Some("runtime_fault"),
            says: &["audit store directory", "is not a directory", "--state-dir"],
            ..case("a state dir that is a file", run_args!["--", "true"], 125)
        },
        Case {
            files: &[("blocker", b"a file")],
            class: Some("runtime_fault"),
            says: &["blocker is not a directory"],
            ..case(
                "a state dir below a file",
                &[
                    "run",
                    "--state-dir",
                    "{dir}/blocker/state",
                    "--result",
                    "{dir}/r.json",
                    "--",
                    "true",
                ],
                125,
            )
        },
        Case {
            says: &["is not a directory"],
            files: &[("state", b"a file")],
            ..case(
                "runs list on a state dir that is a file",
                &["runs", "list", "--state-dir", "{state}"],
                1,
            )
        },
        Case {
            files: &[
                ("c.yaml", b"filesystem:\n  writable_paths: [output/]\n  output_allowlist: [output/*.txt]\n"),
                ("out", b"a file where the output directory goes"),
            ],
            class: Some("delivery_failed"),
            says: &["/output/a.txt not delivered", "artifact.output_dir_unusable", "delivery_failed"],
            records: Records::One,
            ..case(
                "an output dir that is a file loses the artifact: an error, not exit 0",
                run_args!["-c", "c.yaml", "--output-dir", "out", "--", "sh", "-c", "echo hi > /output/a.txt"],
                123,
            )
        },
        Case {
            class: Some("delivery_failed"),
            says: &["nodir/r.json was not written"],
            records: Records::One,
            ..case(
                "a result file in a directory that does not exist",
                &["run", "--state-dir", "{state}", "--result", "{dir}/nodir/r.json", "--", "true"],
                123,
            )
        },
        Case {
            files: &[("r.json", b"an earlier result")],
            class: Some("delivery_failed"),
            says: &["already exists", "never replaces"],
            records: Records::One,
            ..case("a result file that already exists is not replaced", run_args!["--", "true"], 123)
        },
    ]);
}

#[test]
fn stdin_shapes() {
    check_all(&[
        Case {
            input: Input::Endless,
            class: Some("ok"),
            says: &["hi"],
            records: Records::One,
            ..case(
                "an endless stdin the payload never reads",
                run_args!["--", "echo", "hi"],
                0,
            )
        },
        Case {
            input: Input::Endless,
            class: Some("ok"),
            says: &["y\ny\n"],
            records: Records::One,
            ..case(
                "an endless stdin the payload reads part of",
                run_args!["--", "head", "-n", "3"],
                0,
            )
        },
        Case {
            files: &[("c.yaml", b"resources:\n  wall_time_seconds: 2\n")],
            input: Input::Slow(30),
            class: Some("capacity_exceeded"),
            says: &["first", "wall_time"],
            records: Records::One,
            ..case(
                "a writer slower than the deadline",
                run_args!["-c", "c.yaml", "--", "cat"],
                124,
            )
        },
        Case {
            input: Input::Closed,
            class: Some("ok"),
            records: Records::One,
            ..case("no fd 0 at all", run_args!["--", "cat"], 0)
        },
        Case {
            input: Input::Bytes(b"\x00\xff binary \x00"),
            class: Some("ok"),
            says: &["11"],
            records: Records::One,
            ..case("binary stdin", run_args!["--", "wc", "-c"], 0)
        },
        Case {
            input: Input::File(b"from a file\n"),
            class: Some("ok"),
            says: &["from a file"],
            records: Records::One,
            ..case(
                "a regular file on stdin",
                run_args!["--", "cat", "/dev/stdin"],
                0,
            )
        },
        Case {
            input: Input::Directory,
            class: Some("ok"),
            records: Records::One,
            ..case("a directory on stdin", run_args!["--", "true"], 0)
        },
        Case {
            input: Input::Bytes(b"through /dev/stdin\n"),
            class: Some("ok"),
            says: &["through /dev/stdin"],
            records: Records::One,
            ..case(
                "a pipe read through /dev/stdin",
                run_args!["--", "cat", "/dev/stdin"],
                0,
            )
        },
    ]);
}
