//! House rules that are cheap to check mechanically: all `unsafe` code lives in
//! `crates/cell/src/sys.rs`, and crates depend on each other only in the documented
//! direction (contract <- oci <- cell; contract <- egress; cell, egress, store <- engine
//! <- agent <- airlock; store and images stand alone).

use std::path::{Path, PathBuf};

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            if path.file_name().is_some_and(|n| n != "target") {
                rust_files(&path, out);
            }
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn unsafe_code_lives_only_in_the_sys_module() {
    let root = workspace_root();
    let allowed = root.join("crates/cell/src/sys.rs");
    // This file names the keywords it looks for.
    let this_file = root.join("crates/airlock/tests/layout.rs");
    let mut files = Vec::new();
    rust_files(&root.join("crates"), &mut files);
    let mut offenders = Vec::new();
    for file in files.iter().filter(|f| **f != allowed && **f != this_file) {
        let text = std::fs::read_to_string(file).unwrap();
        for (n, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            if ["unsafe {", "unsafe fn", "unsafe impl", "unsafe extern"]
                .iter()
                .any(|k| code.contains(k))
            {
                offenders.push(format!("{}:{}: {}", file.display(), n + 1, line.trim()));
            }
        }
    }
    assert!(
        offenders.is_empty(),
        "unsafe outside crates/cell/src/sys.rs:\n{}",
        offenders.join("\n")
    );
    assert!(
        files.len() > 20,
        "the scan found too few files to be meaningful"
    );
}

#[test]
fn every_unsafe_block_in_sys_has_a_safety_comment() {
    let text = std::fs::read_to_string(workspace_root().join("crates/cell/src/sys.rs")).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    for (n, line) in lines.iter().enumerate() {
        if line.split("//").next().unwrap_or("").contains("unsafe {") {
            let preceding = lines[..n]
                .iter()
                .rev()
                .take(8)
                .any(|l| l.trim_start().starts_with("// SAFETY:"));
            assert!(
                preceding,
                "sys.rs:{}: unsafe block without a `// SAFETY:` comment above it",
                n + 1
            );
        }
    }
}

fn airlock_dependencies(krate: &str) -> Vec<String> {
    let manifest = std::fs::read_to_string(
        workspace_root()
            .join("crates")
            .join(krate)
            .join("Cargo.toml"),
    )
    .unwrap();
    let table: toml::Table = toml::from_str(&manifest).unwrap();
    table
        .get("dependencies")
        .and_then(|d| d.as_table())
        .map(|d| {
            d.keys()
                .filter(|k| k.starts_with("airlock-"))
                .cloned()
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn crates_depend_in_the_documented_direction() {
    assert_eq!(
        airlock_dependencies("contract"),
        Vec::<String>::new(),
        "contract depends on nothing of ours"
    );
    assert_eq!(
        airlock_dependencies("store"),
        Vec::<String>::new(),
        "store depends on nothing of ours"
    );
    assert_eq!(
        airlock_dependencies("schema"),
        Vec::<String>::new(),
        "the offline JSON Schemas depend on nothing of ours"
    );
    assert_eq!(
        airlock_dependencies("broker"),
        vec!["airlock-schema".to_string()],
        "the broker depends only on the offline schemas: the engine turns its records into \
         the result's"
    );
    let mut cell = airlock_dependencies("cell");
    cell.sort();
    assert_eq!(
        cell,
        ["airlock-contract", "airlock-oci"],
        "the cell runtime applies plans; the gVisor tier's bundle comes from crates/oci"
    );
    assert_eq!(
        airlock_dependencies("oci"),
        vec!["airlock-contract".to_string()],
        "oci is pure: plan -> runtime spec"
    );
    assert_eq!(
        airlock_dependencies("images"),
        Vec::<String>::new(),
        "images depends on nothing of ours (its file operations are rustix's safe calls)"
    );
    for dep in airlock_dependencies("egress") {
        assert_eq!(
            dep, "airlock-contract",
            "egress may only depend on the contract"
        );
    }
    assert_eq!(
        airlock_dependencies("policy"),
        vec!["airlock-contract".to_string()],
        "policy is pure: it decides on contracts and knows nothing below them"
    );
    let mut engine = airlock_dependencies("engine");
    engine.sort();
    assert_eq!(
        engine,
        [
            "airlock-broker",
            "airlock-cell",
            "airlock-contract",
            "airlock-egress",
            "airlock-store"
        ],
        "the engine sits on the cell, the egress proxy, the broker and the store; nothing \
         below it knows of it"
    );
    let mut agent = airlock_dependencies("agent");
    agent.sort();
    assert_eq!(
        agent,
        [
            "airlock-cell",
            "airlock-contract",
            "airlock-engine",
            "airlock-schema",
            "airlock-store"
        ],
        "the agent crate (tools, MCP, the agent loop) sits on the engine; only the CLI \
         knows of it"
    );
    for below in [
        "contract", "oci", "cell", "egress", "store", "engine", "images", "broker", "schema",
    ] {
        assert!(
            !airlock_dependencies(below).contains(&"airlock-agent".to_string()),
            "{below} must not depend on the agent crate"
        );
    }
    let mut server = airlock_dependencies("server");
    server.sort();
    assert_eq!(
        server,
        [
            "airlock-cell",
            "airlock-contract",
            "airlock-engine",
            "airlock-policy",
            "airlock-store"
        ],
        "the service sits on the engine (and the types of the crates below it, and the \
         policy's request and identity types)"
    );
}

/// The contract crate decides (compile is a pure function); only `lib.rs` loads files.
/// It may name libc's constants (syscall numbers, errnos, flags) but cannot call libc:
/// every libc function is `unsafe`, which lives only in `crates/cell/src/sys.rs`.
#[test]
fn the_contract_crate_does_no_io_outside_its_loaders() {
    let root = workspace_root().join("crates/contract/src");
    let mut files = Vec::new();
    rust_files(&root, &mut files);
    let mut offenders = Vec::new();
    for file in files.iter().filter(|f| !f.ends_with("lib.rs")) {
        let text = std::fs::read_to_string(file).unwrap();
        // Tests may write fixtures (the generated default filter is blessed from one).
        let code = text.split("#[cfg(test)]").next().unwrap_or("");
        for (n, line) in code.lines().enumerate() {
            let line = line.split("//").next().unwrap_or("");
            let io = [
                "std::fs",
                "std::env",
                "std::process",
                "std::io::std",
                "TcpStream",
                "UdpSocket",
                "TcpListener",
                " fs::",
                "(fs::",
            ];
            if io.iter().any(|k| line.contains(k)) {
                offenders.push(format!("{}:{}: {}", file.display(), n + 1, line.trim()));
            }
        }
    }
    assert!(
        offenders.is_empty(),
        "I/O in the contract crate outside lib.rs:\n{}",
        offenders.join("\n")
    );
    assert!(files.len() > 10, "the scan found too few files");
}
