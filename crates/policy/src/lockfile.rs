//! The lockfile an `npm ci` of the package-install class must come with, checked on the
//! host before any cell exists: npm's `package-lock.json` (lockfile version 2 or 3),
//! every package in it pinned to a `resolved` URL with an `integrity` hash, so that the
//! install inside the cell can fetch nothing the lockfile does not name and npm refuses
//! a tarball whose hash differs. Pure: the caller reads the file.

use crate::CommandVerdict;

/// Whether a checked command is `npm ci` (also inside a parsed shell script).
pub fn runs_npm_ci(verdict: &CommandVerdict) -> bool {
    verdict.commands.iter().any(|c| {
        c.words.first().is_some_and(|w| w == "npm") && c.words.get(1).is_some_and(|w| w == "ci")
    })
}

/// The most bytes of a lockfile read.
pub const MAX_LOCKFILE_BYTES: u64 = 16 << 20;

/// The packages of a `package-lock.json`, or why it does not pin them all with hashes.
pub fn check_npm_lockfile(text: &str) -> Result<usize, String> {
    let lock: serde_json::Value =
        serde_json::from_str(text).map_err(|e| format!("package-lock.json is not JSON: {e}"))?;
    let version = lock["lockfileVersion"].as_u64().unwrap_or(0);
    if version < 2 {
        return Err(format!(
            "package-lock.json lockfileVersion {version}: 2 or 3 is needed (its `packages` carry the hashes)"
        ));
    }
    let Some(packages) = lock["packages"].as_object() else {
        return Err("package-lock.json has no `packages`".to_string());
    };
    let mut pinned = 0;
    for (path, entry) in packages {
        // The root project, and links to directories of the project itself, fetch nothing.
        if path.is_empty() || entry["link"].as_bool() == Some(true) {
            continue;
        }
        let integrity = entry["integrity"].as_str().unwrap_or("");
        if !integrity.starts_with("sha512-") && !integrity.starts_with("sha384-") {
            return Err(format!("{path}: no sha512/sha384 `integrity` hash"));
        }
        if entry["resolved"].as_str().is_none_or(str::is_empty) {
            return Err(format!("{path}: no `resolved` URL"));
        }
        pinned += 1;
    }
    Ok(pinned)
}

#[cfg(test)]
mod tests {
    use super::*;

    const PINNED: &str = r#"{"lockfileVersion": 3, "packages": {
        "": {"name": "app", "dependencies": {"a": "1.0.0"}},
        "node_modules/a": {"version": "1.0.0", "resolved": "http://npm.mirror.test/a.tgz",
                           "integrity": "sha512-AAAA"},
        "node_modules/b": {"link": true, "resolved": "../b"}}}"#;

    #[test]
    fn a_lockfile_pinning_every_package_with_a_hash_passes() {
        assert_eq!(check_npm_lockfile(PINNED), Ok(1));
    }

    #[test]
    fn a_package_without_integrity_or_resolved_fails() {
        let no_hash = PINNED.replace(r#""integrity": "sha512-AAAA""#, r#""integrity": "sha1-x""#);
        assert!(check_npm_lockfile(&no_hash)
            .unwrap_err()
            .contains("node_modules/a"));
        let no_url = PINNED.replace(r#""resolved": "http://npm.mirror.test/a.tgz","#, "");
        assert!(check_npm_lockfile(&no_url)
            .unwrap_err()
            .contains("resolved"));
    }

    #[test]
    fn an_old_or_malformed_lockfile_fails() {
        assert!(check_npm_lockfile(r#"{"lockfileVersion": 1, "dependencies": {}}"#).is_err());
        assert!(check_npm_lockfile("not json").is_err());
        assert!(check_npm_lockfile(r#"{"lockfileVersion": 3}"#).is_err());
    }

    #[test]
    fn npm_ci_is_found_in_a_script_but_not_in_other_commands() {
        let class = crate::parse_class(
            "t",
            "description = \"t\"\n[commands]\nunmatched = \"allow\"\n",
        )
        .unwrap();
        let verdict = |argv: &[&str]| {
            let argv: Vec<String> = argv.iter().map(|s| s.to_string()).collect();
            class.commands.evaluate(&argv)
        };
        assert!(runs_npm_ci(&verdict(&["npm", "ci"])));
        assert!(runs_npm_ci(&verdict(&[
            "sh",
            "-c",
            "cp a b && npm ci --prefix /out/env"
        ])));
        assert!(!runs_npm_ci(&verdict(&["npm", "install"])));
        assert!(!runs_npm_ci(&verdict(&["echo", "npm", "ci"])));
    }
}
