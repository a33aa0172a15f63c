//! The evaluator as a pure function: every bound, every decision.

use super::*;

const CLASS: &str = r#"
description = "repository tests"

[template.resources]
memory_mb = 512
wall_time_seconds = 60

[template.network]
mode = "allowlist"
allowed_domains = ["pypi.test:443"]

[execution]
code = true

[bounds]
max_memory_mb = 2048
max_cpu_millis = 2000
max_process_limit = 256
max_wall_time_seconds = 600
max_output_bytes = 4194304
requestable_domains = ["files.test:443", "*.mirror.test"]
requestable_credentials = [{ name = "TOKEN", env = "TOKEN", from_env = "AIRLOCK_TEST_TOKEN" }]
input_roots = [{ host = "/srv/repos", mount_under = "/repo" }]
session = { allowed = true, max_lifetime_seconds = 3600 }
tty = false

[commands]
default = "forbidden"
unmatched = "allow"

[[commands.rules]]
pattern = ["rm", ["-rf", "-fr"]]
decision = "forbidden"
justification = "no recursive deletes"
match = ["rm -rf /", "rm -fr x"]
not_match = ["rm x"]

[[commands.rules]]
pattern = ["git", "push"]
decision = "prompt"
match = ["git push origin"]
not_match = ["git status"]
"#;

fn class() -> WorkloadClass {
    parse_class("repo-tests", CLASS).unwrap()
}

fn argv(text: &str) -> Vec<String> {
    text.split_whitespace().map(String::from).collect()
}

fn asked(json: &str) -> Asked {
    Asked::from_json(json).unwrap()
}

fn code(evaluation: &Evaluation) -> Option<&'static str> {
    evaluation.denial().map(Denial::code)
}

fn granted(evaluation: Evaluation) -> (Contract, Granted) {
    match evaluation {
        Evaluation::Granted {
            contract, granted, ..
        } => (*contract, granted),
        other => panic!("not granted: {other:?}"),
    }
}

use airlock_contract::Contract;

#[test]
fn a_request_for_nothing_gets_the_template() {
    let (contract, granted) = granted(evaluate(&class(), &argv("make test"), &Asked::default()));
    assert_eq!(contract, class().template);
    assert_eq!(granted.memory_mb, 512);
}

#[test]
fn each_figure_is_granted_up_to_its_bound_and_denied_above_it() {
    let cases = [
        ("memory_mb", 2048, "policy.memory_above_class"),
        ("cpu_millis", 2000, "policy.cpu_above_class"),
        ("process_limit", 256, "policy.processes_above_class"),
        ("wall_time_seconds", 600, "policy.wall_time_above_class"),
        ("output_bytes", 4194304, "policy.output_above_class"),
    ];
    for (field, bound, reason) in cases {
        let at = asked(&format!("{{\"{field}\": {bound}}}"));
        let (contract, _) = granted(evaluate(&class(), &argv("make"), &at));
        let value = serde_json::to_value(contract.resources).unwrap()[field].as_i64();
        assert_eq!(value, Some(bound), "{field}");
        let above = asked(&format!("{{\"{field}\": {}}}", bound + 1));
        assert_eq!(
            code(&evaluate(&class(), &argv("make"), &above)),
            Some(reason),
            "{field}"
        );
    }
}

#[test]
fn a_figure_without_a_bound_may_not_exceed_the_template() {
    let mut c = class();
    c.bounds.max_memory_mb = None;
    let more = asked(r#"{"memory_mb": 513}"#);
    assert_eq!(
        code(&evaluate(&c, &argv("make"), &more)),
        Some("policy.memory_above_class")
    );
    let less = asked(r#"{"memory_mb": 256}"#);
    assert_eq!(granted(evaluate(&c, &argv("make"), &less)).1.memory_mb, 256);
}

#[test]
fn a_domain_outside_the_class_is_denied_one_inside_needs_approval() {
    let outside = asked(r#"{"domains": ["evil.test:443"]}"#);
    assert_eq!(
        code(&evaluate(&class(), &argv("make"), &outside)),
        Some("policy.domain_not_in_class")
    );
    let inside = asked(r#"{"domains": ["files.test:443", "a.mirror.test"]}"#);
    match evaluate(&class(), &argv("make"), &inside) {
        Evaluation::NeedsApproval { what, contract, .. } => {
            let keys: Vec<_> = what.iter().map(ApprovalItem::key).collect();
            assert_eq!(keys, ["domain:a.mirror.test", "domain:files.test:443"]);
            assert!(contract
                .network
                .allowed_domains
                .contains(&"files.test:443".to_string()));
        }
        other => panic!("{other:?}"),
    }
    let template = asked(r#"{"domains": ["pypi.test:443"]}"#);
    granted(evaluate(&class(), &argv("make"), &template));
}

#[test]
fn wildcard_domain_bounds_cover_sub_domains_with_the_same_port_only() {
    assert!(domain_within("*.mirror.test", "a.mirror.test"));
    assert!(domain_within("*.mirror.test:443", "a.b.mirror.test:443"));
    assert!(!domain_within("*.mirror.test", "mirror.test"));
    assert!(!domain_within("*.mirror.test", "a.mirror.test:8080"));
    assert!(!domain_within("*.mirror.test", "amirror.test"));
    assert!(!domain_within("*.mirror.test", "*.x.mirror.test"));
}

#[test]
fn a_credential_must_be_offered_by_the_class_and_needs_approval() {
    let not_offered = asked(r#"{"credentials": ["AWS"]}"#);
    assert_eq!(
        code(&evaluate(&class(), &argv("make"), &not_offered)),
        Some("policy.credential_not_in_class")
    );
    match evaluate(
        &class(),
        &argv("make"),
        &asked(r#"{"credentials": ["TOKEN"]}"#),
    ) {
        Evaluation::NeedsApproval { what, contract, .. } => {
            assert_eq!(
                what,
                [ApprovalItem::Credential {
                    name: "TOKEN".into()
                }]
            );
            assert_eq!(contract.credentials[0].from_env, "AIRLOCK_TEST_TOKEN");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn inputs_mount_only_from_their_roots_and_under_their_targets() {
    let ok = asked(r#"{"inputs": [{"source": "/srv/repos/app/", "target": "/repo/app"}]}"#);
    let (contract, _) = granted(evaluate(&class(), &argv("make"), &ok));
    assert_eq!(
        contract.filesystem.readonly_inputs,
        [airlock_contract::ReadonlyInput::Mapped(
            airlock_contract::MappedInput {
                source: "/srv/repos/app".into(),
                target: "/repo/app".into(),
            }
        )]
    );
    for (source, target, reason) in [
        ("/etc", "/repo/etc", "policy.input_not_in_class"),
        (
            "/srv/repos/../../etc",
            "/repo/x",
            "policy.input_not_in_class",
        ),
        ("/srv/reposx", "/repo/x", "policy.input_not_in_class"),
        ("srv/repos/app", "/repo/x", "policy.input_not_in_class"),
        (
            "/srv/repos/app",
            "/usr/bin",
            "policy.input_target_not_allowed",
        ),
        (
            "/srv/repos/app",
            "/repo/../usr",
            "policy.input_target_not_allowed",
        ),
    ] {
        let request = asked(&format!(
            r#"{{"inputs": [{{"source": "{source}", "target": "{target}"}}]}}"#
        ));
        assert_eq!(
            code(&evaluate(&class(), &argv("make"), &request)),
            Some(reason),
            "{source} {target}"
        );
    }
}

#[test]
fn tty_exec_and_sessions_follow_the_class() {
    let tty = asked(r#"{"tty": true}"#);
    assert_eq!(
        code(&evaluate(&class(), &argv("make"), &tty)),
        Some("policy.tty_not_allowed")
    );
    let mut c = class();
    c.bounds.tty = true;
    assert!(granted(evaluate(&c, &argv("make"), &tty)).0.terminal);

    let mut no_exec = class();
    no_exec.bounds.exec_in_writable_paths = false;
    let exec = asked(r#"{"exec_in_writable_paths": true}"#);
    assert_eq!(
        code(&evaluate(&no_exec, &argv("make"), &exec)),
        Some("policy.exec_in_writable_not_allowed")
    );
    let (contract, granted_caps) = granted(evaluate(&no_exec, &argv("make"), &Asked::default()));
    assert!(!granted_caps.exec_in_writable_paths);
    assert!(contract.filesystem.writable_paths.iter().all(|p| matches!(
        p,
        airlock_contract::WritablePath::Detailed(d) if !d.exec
    )));

    let long = asked(r#"{"session": {"lifetime_seconds": 3601}}"#);
    assert_eq!(
        code(&evaluate(&class(), &argv("make"), &long)),
        Some("policy.session_lifetime_above_class")
    );
    let ok = asked(r#"{"session": {"lifetime_seconds": 3600}}"#);
    assert_eq!(
        granted(evaluate(&class(), &argv("make"), &ok))
            .1
            .session_lifetime_seconds,
        Some(3600)
    );
    let mut no_session = class();
    no_session.bounds.session.allowed = false;
    assert_eq!(
        code(&evaluate(&no_session, &argv("make"), &ok)),
        Some("policy.session_not_allowed")
    );
}

#[test]
fn a_class_without_code_execution_runs_only_its_tools() {
    let mut c = class();
    c.execution = Execution {
        code: false,
        tools: vec!["/input/convert.sh".into()],
    };
    granted(evaluate(
        &c,
        &argv("/input/convert.sh in.docx"),
        &Asked::default(),
    ));
    for command in ["bash -c /input/convert.sh", "python3 -c 1", "convert.sh"] {
        assert_eq!(
            code(&evaluate(&c, &argv(command), &Asked::default())),
            Some("policy.code_execution_not_allowed"),
            "{command}"
        );
    }
    assert_eq!(
        code(&evaluate(&c, &[], &Asked::default())),
        Some("policy.command_missing")
    );
}

#[test]
fn the_command_policy_comes_before_the_bounds() {
    // Both a forbidden command and a figure above the class: the command is the reason.
    let above = asked(r#"{"memory_mb": 999999}"#);
    assert_eq!(
        code(&evaluate(&class(), &argv("rm -rf /"), &above)),
        Some("policy.command_forbidden")
    );
    let script = [
        "bash".to_string(),
        "-lc".into(),
        "make && rm -rf /tmp".into(),
    ];
    assert_eq!(
        code(&evaluate(&class(), &script, &Asked::default())),
        Some("policy.command_forbidden")
    );
}

#[test]
fn a_prompt_command_needs_approval_and_an_unparseable_script_gets_the_default() {
    match evaluate(&class(), &argv("git push origin"), &Asked::default()) {
        Evaluation::NeedsApproval { what, .. } => {
            assert_eq!(what[0].key(), "command:git push origin")
        }
        other => panic!("{other:?}"),
    }
    let broken = ["sh".to_string(), "-c".into(), "echo 'oops".into()];
    // This class's default is `forbidden`.
    assert_eq!(
        code(&evaluate(&class(), &broken, &Asked::default())),
        Some("policy.command_forbidden")
    );
}

#[test]
fn a_request_cannot_name_a_field_that_is_not_a_capability() {
    for json in [
        r#"{"cleanup": {"destroy_runtime": false}}"#,
        r#"{"contract": {}}"#,
        r#"{"seccomp_profile": "none.json"}"#,
        r#"{"readonly_inputs": ["/"]}"#,
    ] {
        assert!(Asked::from_json(json).is_err(), "{json}");
    }
}

#[test]
fn a_grant_that_breaks_a_contract_rule_is_denied() {
    let mut c = class();
    c.bounds.requestable_domains.push("bad domain".into());
    let request = asked(r#"{"domains": ["bad domain"]}"#);
    assert_eq!(
        code(&evaluate(&c, &argv("make"), &request)),
        Some("policy.request_invalid")
    );
}

#[test]
fn a_class_whose_rule_examples_fail_is_refused_at_load() {
    let broken = CLASS.replace("not_match = [\"rm x\"]", "not_match = [\"rm -rf x\"]");
    let err = parse_class("repo-tests", &broken).unwrap_err().to_string();
    assert!(
        err.contains("rules[0]: example `rm -rf x` must not match but does"),
        "{err}"
    );
    assert!(parse_class("Bad Name", CLASS).is_err());
    let unknown = format!("{CLASS}\n[extra]\nx = 1\n");
    assert!(parse_class("repo-tests", &unknown).is_err());
}

#[test]
fn approvers_must_be_identities() {
    let config = PolicyConfig {
        approvers: vec!["alice".into()],
        ..Default::default()
    };
    assert!(config.check().is_err());
}

/// `AIRLOCK_BLESS=1 cargo test -p airlock-policy` rewrites docs/class.schema.json and
/// docs/request.schema.json.
#[test]
fn checked_in_schemas_match_the_types() {
    let docs = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs");
    for (name, schema) in [
        ("class.schema.json", class_json_schema()),
        ("request.schema.json", request_json_schema()),
    ] {
        let path = docs.join(name);
        let expected = serde_json::to_string_pretty(&schema).unwrap() + "\n";
        if std::env::var_os("AIRLOCK_BLESS").is_some_and(|v| v == "1") {
            std::fs::write(&path, &expected).unwrap();
            continue;
        }
        let actual = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            actual == expected,
            "docs/{name} is out of date: AIRLOCK_BLESS=1 cargo test -p airlock-policy"
        );
    }
}

#[test]
fn a_session_is_opened_within_the_bounds_with_no_command_yet() {
    let evaluation = evaluate_session(&class(), &asked(r#"{"memory_mb": 1024}"#));
    let (contract, granted) = granted(evaluation);
    assert_eq!(contract.resources.memory_mb, 1024);
    // No lifetime asked: the class's most.
    assert_eq!(granted.session_lifetime_seconds, Some(3600));
    let above = evaluate_session(
        &class(),
        &asked(r#"{"session": {"lifetime_seconds": 3601}}"#),
    );
    assert_eq!(code(&above), Some("policy.session_lifetime_above_class"));
    let above = evaluate_session(&class(), &asked(r#"{"memory_mb": 4096}"#));
    assert_eq!(code(&above), Some("policy.memory_above_class"));
    let mut one_shot = class();
    one_shot.bounds.session.allowed = false;
    let refused = evaluate_session(&one_shot, &Asked::default());
    assert_eq!(code(&refused), Some("policy.session_not_allowed"));
}

#[test]
fn a_session_command_is_refused_when_forbidden_or_when_it_would_need_an_approver() {
    let class = class();
    assert!(check_session_command(&class, &argv("make test")).is_ok());
    let forbidden = check_session_command(&class, &argv("rm -rf /")).unwrap_err();
    assert_eq!(forbidden.code(), "policy.command_forbidden");
    let prompt = check_session_command(&class, &argv("git push origin")).unwrap_err();
    assert_eq!(prompt.code(), "policy.command_needs_approval");
    let script = ["sh", "-c", "true && rm -rf /tmp"].map(String::from);
    let hidden = check_session_command(&class, &script).unwrap_err();
    assert_eq!(hidden.code(), "policy.command_forbidden");
    assert_eq!(
        check_session_command(&class, &[]).unwrap_err().code(),
        "policy.command_missing"
    );
}

#[test]
fn a_class_that_requires_gvisor_makes_every_run_gvisor_and_denies_asking_for_native() {
    use airlock_contract::Isolation;
    let strict = deny_network_class().replace("tty = false", "tty = false\nisolation = \"gvisor\"");
    let class = parse_class("hostile", &strict).unwrap();
    // The template says nothing about the tier: the class's requirement applies.
    assert_eq!(class.template.isolation, Isolation::Native);
    let (contract, _) = granted(evaluate(&class, &argv("make test"), &Asked::default()));
    assert_eq!(contract.isolation, Isolation::Gvisor);
    let lowered = evaluate(
        &class,
        &argv("make test"),
        &asked(r#"{"isolation":"native"}"#),
    );
    assert_eq!(code(&lowered), Some("policy.isolation_below_class"));
    let same = evaluate(
        &class,
        &argv("make test"),
        &asked(r#"{"isolation":"gvisor"}"#),
    );
    assert_eq!(granted(same).0.isolation, Isolation::Gvisor);
}

#[test]
fn a_request_may_raise_the_tier_of_a_class_that_requires_none() {
    use airlock_contract::Isolation;
    let class = parse_class("tests", &deny_network_class()).unwrap();
    let (contract, _) = granted(evaluate(
        &class,
        &argv("make test"),
        &asked(r#"{"isolation":"gvisor"}"#),
    ));
    assert_eq!(contract.isolation, Isolation::Gvisor);
    let (plain, _) = granted(evaluate(&class, &argv("make test"), &Asked::default()));
    assert_eq!(plain.isolation, Isolation::Native);
}

/// [`CLASS`] without its allowlist (these tests are about the tier, not the network).
fn deny_network_class() -> String {
    CLASS.replace(
        "mode = \"allowlist\"\nallowed_domains = [\"pypi.test:443\"]",
        "mode = \"deny\"",
    )
}
