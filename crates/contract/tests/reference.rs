//! Checks that keep the checked-in reference material true to the code: the JSON schema,
//! the field reference in docs/contract.md and the example contracts.
//!
//! `AIRLOCK_BLESS=1 cargo test -p airlock-contract` rewrites docs/contract.schema.json.

use airlock_contract::{
    compile, contract_json_schema, default_contract, load_contract_file, CompileInput,
    ContractError,
};
use serde_json::Value;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn rendered_schema() -> String {
    let mut text = serde_json::to_string_pretty(&contract_json_schema()).unwrap();
    text.push('\n');
    text
}

#[test]
fn checked_in_schema_matches_the_types() {
    let path = repo_root().join("docs/contract.schema.json");
    let expected = rendered_schema();
    if std::env::var_os("AIRLOCK_BLESS").is_some_and(|v| v == "1") {
        std::fs::write(&path, &expected).unwrap();
        return;
    }
    let actual = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        actual == expected,
        "docs/contract.schema.json is out of date; regenerate it with \
         `AIRLOCK_BLESS=1 cargo test -p airlock-contract --test reference`"
    );
}

/// Every property name anywhere in the schema (top level, nested, and in `$defs`).
fn property_names(schema: &Value, names: &mut BTreeSet<String>) {
    match schema {
        Value::Object(map) => {
            if let Some(Value::Object(properties)) = map.get("properties") {
                names.extend(properties.keys().cloned());
            }
            map.values().for_each(|value| property_names(value, names));
        }
        Value::Array(items) => items.iter().for_each(|item| property_names(item, names)),
        _ => {}
    }
}

#[test]
fn reference_page_documents_every_field() {
    let doc = std::fs::read_to_string(repo_root().join("docs/contract.md")).unwrap();
    let mut names = BTreeSet::new();
    property_names(&contract_json_schema(), &mut names);
    assert!(
        names.len() > 20,
        "schema walk found too few fields: {names:?}"
    );
    let missing: Vec<&String> = names
        .iter()
        .filter(|name| !doc.contains(&format!("`{name}`")))
        .collect();
    assert!(
        missing.is_empty(),
        "docs/contract.md does not mention {missing:?}"
    );
}

fn example(name: &str) -> PathBuf {
    repo_root().join("examples/contracts").join(name)
}

fn compile_example(name: &str) -> Result<airlock_contract::CellPlan, ContractError> {
    let path = example(name);
    let contract = load_contract_file(&path)?;
    let base_dir = path.parent().unwrap().canonicalize().unwrap();
    compile(
        &contract,
        &CompileInput::new(
            &base_dir,
            &["sh".to_owned(), "/input/convert.sh".to_owned()],
        ),
    )
}

#[test]
fn every_example_contract_parses_and_compiles() {
    let mut seen = 0;
    for entry in std::fs::read_dir(repo_root().join("examples/contracts")).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if path.is_dir() {
            continue;
        }
        seen += 1;
        match compile_example(&name) {
            Ok(_) => assert_ne!(name, "seed-004.yaml"),
            Err(ContractError::Unsupported { path, .. }) if name == "seed-004.yaml" => {
                assert_eq!(path, "image")
            }
            Err(error) => panic!("{name}: {error}"),
        }
    }
    assert!(
        seen >= 4,
        "expected at least four example contracts, found {seen}"
    );
}

#[test]
fn document_tools_example_mounts_its_inputs() {
    let plan = compile_example("document-tools.yaml").unwrap();
    let base = example("").canonicalize().unwrap();
    for file in ["report.docx", "convert.sh"] {
        let mount = airlock_contract::MountPlan::ReadonlyInput {
            source: base.join("input").join(file),
            target: Path::new("/input").join(file),
        };
        assert!(plan.mounts.contains(&mount), "{mount:?} missing");
        assert!(base.join("input").join(file).is_file());
    }
    assert_eq!(plan.output_allowlist, ["/output/report.pdf"]);
}

#[test]
fn default_example_is_the_default_contract() {
    assert_eq!(
        load_contract_file(&example("default.yaml")).unwrap(),
        default_contract()
    );
}

#[test]
fn load_names_an_unknown_extension() {
    let error = load_contract_file(Path::new("contract.ini")).unwrap_err();
    assert!(error.to_string().contains("`ini`"), "{error}");
    let error = load_contract_file(Path::new("/nonexistent/contract.yaml")).unwrap_err();
    assert!(matches!(error, ContractError::Io { .. }), "{error:?}");
    assert_eq!(error.class(), "runtime_fault");
}

#[test]
fn tty_example_asks_for_a_terminal() {
    let plan = compile_example("tty.yaml").unwrap();
    assert!(plan.terminal);
    assert!(plan.env.iter().any(|v| v.name == "TERM"));
}
