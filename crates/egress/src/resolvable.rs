//! Whether the operator's configuration can resolve an allowlist's names at all. A name
//! it cannot resolve would fail every connection inside the cell with
//! `egress.resolve_failed` while the run looked fine, so every front end refuses such a
//! run before its cell (`sandbox_unavailable`).

use crate::EgressConfig;

impl EgressConfig {
    /// The allowlist's host patterns this configuration cannot resolve: not an IP
    /// literal it allows, no entry of `resolve` that the pattern matches, and no upstream
    /// resolver.
    pub fn unresolvable<'a>(
        &self,
        host_patterns: impl IntoIterator<Item = &'a str>,
    ) -> Vec<&'a str> {
        if !self.upstream_resolvers.is_empty() {
            return Vec::new();
        }
        host_patterns
            .into_iter()
            .filter(|pattern| !self.resolvable(pattern))
            .collect()
    }

    fn resolvable(&self, pattern: &str) -> bool {
        if pattern.parse::<std::net::IpAddr>().is_ok() {
            return self.allow_ip_literals;
        }
        match pattern.strip_prefix("*.") {
            Some(apex) => self
                .resolve
                .keys()
                .any(|name| name.ends_with(&format!(".{apex}"))),
            None => self.resolve.contains_key(pattern),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(resolve: &[(&str, &str)]) -> EgressConfig {
        EgressConfig {
            resolve: resolve
                .iter()
                .map(|(name, ip)| (name.to_string(), ip.parse().unwrap()))
                .collect(),
            ..EgressConfig::default()
        }
    }

    fn rules<'a>(patterns: &[&'a str]) -> Vec<&'a str> {
        patterns.to_vec()
    }

    #[test]
    fn a_name_outside_the_host_map_is_unresolvable_without_upstream_resolvers() {
        let c = config(&[("api.test", "127.0.0.2")]);
        let destinations = rules(&["api.test", "other.test", "*.pkg.test"]);
        assert_eq!(c.unresolvable(destinations), ["other.test", "*.pkg.test"]);
    }

    #[test]
    fn a_wildcard_is_resolvable_when_the_map_has_one_of_its_sub_domains() {
        let c = config(&[("a.pkg.test", "127.0.0.2")]);
        assert!(c.unresolvable(rules(&["*.pkg.test"])).is_empty());
        assert_eq!(c.unresolvable(rules(&["*.a.pkg.test"])), ["*.a.pkg.test"]);
    }

    #[test]
    fn upstream_resolvers_resolve_every_name() {
        let c = EgressConfig {
            upstream_resolvers: vec!["127.0.0.53:53".parse().unwrap()],
            ..EgressConfig::default()
        };
        assert!(c.unresolvable(rules(&["x.test", "*.y.test"])).is_empty());
    }

    #[test]
    fn ip_literals_need_allow_ip_literals() {
        let denied = EgressConfig::default();
        assert_eq!(denied.unresolvable(rules(&["127.0.0.2"])), ["127.0.0.2"]);
        let allowed = EgressConfig {
            allow_ip_literals: true,
            ..EgressConfig::default()
        };
        assert!(allowed.unresolvable(rules(&["127.0.0.2"])).is_empty());
    }
}
