//! Per-domain HTTP rules: which methods and path prefixes a plain-HTTP request to an
//! allowed domain may use. A domain without a rule takes any request; one with a rule
//! cannot be checked inside TLS (no interception yet), so a TLS tunnel to it is refused.

use serde::{Deserialize, Serialize};

use crate::reason;
use crate::secrets::{host_matches, path_allowed};

/// The requests one allowed domain accepts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HttpRule {
    /// `name` or `*.name` (an allowlist pattern without its port).
    pub host_pattern: String,
    /// Methods (upper case); empty: any.
    pub methods: Vec<String>,
    /// Path prefixes; empty: any.
    pub path_prefixes: Vec<String>,
}

/// The rule of `host` (canonical), if any. An exact pattern wins over a wildcard.
pub fn rule_for<'a>(rules: &'a [HttpRule], host: &str) -> Option<&'a HttpRule> {
    rules
        .iter()
        .find(|r| r.host_pattern == host)
        .or_else(|| rules.iter().find(|r| host_matches(&r.host_pattern, host)))
}

/// Whether a request to `host` with `method` and `target` (origin-form) passes its rule.
pub fn check(
    rules: &[HttpRule],
    host: &str,
    method: &str,
    target: &str,
) -> Result<(), &'static str> {
    let Some(rule) = rule_for(rules, host) else {
        return Ok(());
    };
    if !rule.methods.is_empty() && !rule.methods.iter().any(|m| m == method) {
        return Err(reason::METHOD_NOT_ALLOWED);
    }
    if !rule.path_prefixes.is_empty() && !path_allowed(&rule.path_prefixes, target) {
        return Err(reason::PATH_NOT_ALLOWED);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules() -> Vec<HttpRule> {
        vec![
            HttpRule {
                host_pattern: "*.pypi.test".into(),
                methods: vec!["GET".into(), "HEAD".into()],
                path_prefixes: vec!["/simple/".into()],
            },
            HttpRule {
                host_pattern: "api.pypi.test".into(),
                methods: vec!["POST".into()],
                path_prefixes: vec![],
            },
        ]
    }

    #[test]
    fn a_domain_without_a_rule_takes_any_request() {
        assert_eq!(check(&rules(), "other.test", "DELETE", "/x"), Ok(()));
    }

    #[test]
    fn methods_and_paths_are_checked_against_the_domains_rule() {
        let r = rules();
        assert_eq!(check(&r, "files.pypi.test", "GET", "/simple/x/?a"), Ok(()));
        assert_eq!(
            check(&r, "files.pypi.test", "POST", "/simple/x/"),
            Err(reason::METHOD_NOT_ALLOWED)
        );
        assert_eq!(
            check(&r, "files.pypi.test", "get", "/simple/x/"),
            Err(reason::METHOD_NOT_ALLOWED)
        );
        assert_eq!(
            check(&r, "files.pypi.test", "GET", "/simple/../admin"),
            Err(reason::PATH_NOT_ALLOWED)
        );
        assert_eq!(
            check(&r, "files.pypi.test", "GET", "/simple%2f../x"),
            Err(reason::PATH_NOT_ALLOWED)
        );
        assert_eq!(check(&r, "api.pypi.test", "POST", "/anything"), Ok(()));
    }
}
