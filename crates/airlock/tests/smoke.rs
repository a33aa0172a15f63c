mod common;

#[test]
fn default_contract_runs_a_command_and_streams_its_output() {
    require_cells!();
    let run = common::run(None, &["/bin/echo", "hello from a cell"]);
    assert_eq!(run.code(), 0, "{}", run.describe());
    assert_eq!(run.stdout(), "hello from a cell\n");
    assert_eq!(run.status(), "ok", "{}", run.describe());
    assert!(run.result["run_id"]
        .as_str()
        .is_some_and(|id| id.len() == 36));
}

#[test]
fn payload_gets_default_signal_dispositions() {
    require_cells!();
    // Ignored and blocked signals survive execve: the payload must not inherit the Rust
    // runtime's ignored SIGPIPE (`yes | head` would then report EPIPE instead of ending)
    // or whatever the caller of airlock ignored or blocked.
    let run = common::sh("grep -E '^Sig(Ign|Blk):' /proc/self/status; yes | head -n 1");
    assert_eq!(run.code(), 0, "{}", run.describe());
    assert_eq!(
        run.stdout(),
        "SigBlk:\t0000000000000000\nSigIgn:\t0000000000000000\ny\n",
        "{}",
        run.describe()
    );
    assert!(!run.stderr().contains("Broken pipe"), "{}", run.describe());
}

#[test]
fn payload_with_a_quota_of_every_cpu_may_use_every_cpu_of_its_caller() {
    require_cells!();
    // airlock moves the cell's setup to one CPU; a payload whose quota covers all of the
    // caller's CPUs must get the full set back (a smaller quota gets fewer: limits_view.rs).
    let ours = std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find(|l| l.starts_with("Cpus_allowed_list:"))
        .unwrap()
        .to_string();
    let run = common::run(
        Some("resources:\n  cpu_millis: 64000\n"),
        &[
            "/bin/sh",
            "-c",
            "grep '^Cpus_allowed_list:' /proc/self/status",
        ],
    );
    assert_eq!(run.code(), 0, "{}", run.describe());
    assert_eq!(run.stdout().trim_end(), ours, "{}", run.describe());
}
