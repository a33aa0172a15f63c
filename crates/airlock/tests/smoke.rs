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
