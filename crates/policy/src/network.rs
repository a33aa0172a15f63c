//! A change of a live session's destinations, decided like a request's domains: a
//! destination of the class's template is granted, one the class lets a request ask for
//! needs an approval, anything else is `policy.domain_not_in_class`. Removing a
//! destination narrows what the session may reach and is always granted. Pure: the
//! caller holds the session's current list and applies the result.

use crate::class::WorkloadClass;
use crate::evaluate::{domain_within, ApprovalItem};
use crate::reason::{Denial, DenyReason};
use airlock_contract::{DestinationRule, NetworkMode};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// What a caller asks to change (`POST /v1/sessions/{id}/network`).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NetworkChange {
    /// Destinations to allow from now on (`host`, `host:port`, `*.apex[:port]`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub add: Vec<String>,
    /// Destinations to allow no more.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub remove: Vec<String>,
}

/// How a change ends.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "decision", rename_all = "snake_case")]
pub enum NetworkEvaluation {
    /// `domains`: the session's whole list once the change is applied.
    Granted {
        domains: Vec<String>,
    },
    Denied {
        reason: Denial,
    },
    /// `domains`: the list an approval of every item would give.
    NeedsApproval {
        what: Vec<ApprovalItem>,
        domains: Vec<String>,
    },
}

/// Decides `change` of a session of `class` whose destinations are `current`.
pub fn evaluate_network_change(
    class: &WorkloadClass,
    current: &[String],
    change: &NetworkChange,
) -> NetworkEvaluation {
    match decide(class, current, change) {
        Ok((domains, what)) if what.is_empty() => NetworkEvaluation::Granted { domains },
        Ok((domains, what)) => NetworkEvaluation::NeedsApproval { what, domains },
        Err(reason) => NetworkEvaluation::Denied { reason },
    }
}

fn decide(
    class: &WorkloadClass,
    current: &[String],
    change: &NetworkChange,
) -> Result<(Vec<String>, Vec<ApprovalItem>), Denial> {
    let invalid = |detail: String| Denial::new(DenyReason::RequestInvalid, detail);
    if change.add.is_empty() && change.remove.is_empty() {
        return Err(invalid("the change adds and removes nothing".into()));
    }
    for domain in change.add.iter().chain(&change.remove) {
        airlock_contract::parse_destination(domain)
            .map_err(|why| invalid(format!("{domain}: {why}")))?;
    }
    if let Some(both) = change.add.iter().find(|a| contains(&change.remove, a)) {
        return Err(invalid(format!("{both} is both added and removed")));
    }
    let mut what = Vec::new();
    let mut domains: Vec<String> = current
        .iter()
        .filter(|d| !contains(&change.remove, d))
        .cloned()
        .collect();
    for domain in &change.add {
        if contains(&domains, domain) {
            continue;
        }
        if !in_template(class, domain) {
            if !requestable(class, domain) {
                return Err(Denial::new(DenyReason::DomainNotInClass, domain.clone()));
            }
            what.push(ApprovalItem::Domain {
                domain: domain.clone(),
            });
        }
        domains.push(domain.to_ascii_lowercase());
    }
    Ok((domains, what))
}

fn contains(list: &[String], domain: &str) -> bool {
    list.iter().any(|d| d.eq_ignore_ascii_case(domain))
}

fn in_template(class: &WorkloadClass, domain: &str) -> bool {
    let network = &class.template.network;
    network.mode == NetworkMode::Allowlist && contains(&network.allowed_domains, domain)
}

fn requestable(class: &WorkloadClass, domain: &str) -> bool {
    class
        .bounds
        .requestable_domains
        .iter()
        .any(|bound| domain_within(bound, domain))
}

/// The proxy's rules for a session's list (each entry was checked by
/// [`evaluate_network_change`] or the contract's validation).
pub fn destination_rules(domains: &[String]) -> Result<Vec<DestinationRule>, Denial> {
    domains
        .iter()
        .map(|d| {
            airlock_contract::parse_destination(d)
                .map_err(|why| Denial::new(DenyReason::RequestInvalid, format!("{d}: {why}")))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn class() -> WorkloadClass {
        crate::parse_class(
            "net",
            r#"
description = "a session's network"
[template.network]
mode = "allowlist"
allowed_domains = ["api.test:8080"]
[bounds]
requestable_domains = ["*.files.test:8080", "extra.test"]
"#,
        )
        .unwrap()
    }

    fn change(add: &[&str], remove: &[&str]) -> NetworkChange {
        NetworkChange {
            add: add.iter().map(|d| d.to_string()).collect(),
            remove: remove.iter().map(|d| d.to_string()).collect(),
        }
    }

    fn current() -> Vec<String> {
        vec!["api.test:8080".to_string()]
    }

    #[test]
    fn removing_a_destination_is_granted_without_an_approval() {
        let evaluation =
            evaluate_network_change(&class(), &current(), &change(&[], &["API.test:8080"]));
        assert_eq!(evaluation, NetworkEvaluation::Granted { domains: vec![] });
    }

    #[test]
    fn a_template_destination_comes_back_without_an_approval() {
        let evaluation = evaluate_network_change(&class(), &[], &change(&["api.test:8080"], &[]));
        assert_eq!(
            evaluation,
            NetworkEvaluation::Granted { domains: current() }
        );
    }

    #[test]
    fn a_requestable_destination_needs_an_approval() {
        let evaluation =
            evaluate_network_change(&class(), &current(), &change(&["a.files.test:8080"], &[]));
        assert_eq!(
            evaluation,
            NetworkEvaluation::NeedsApproval {
                what: vec![ApprovalItem::Domain {
                    domain: "a.files.test:8080".into()
                }],
                domains: vec!["api.test:8080".into(), "a.files.test:8080".into()],
            }
        );
    }

    #[test]
    fn a_destination_already_allowed_needs_nothing_more() {
        let now = vec!["api.test:8080".to_string(), "extra.test".to_string()];
        let evaluation = evaluate_network_change(&class(), &now, &change(&["EXTRA.test"], &[]));
        assert_eq!(evaluation, NetworkEvaluation::Granted { domains: now });
    }

    #[test]
    fn a_destination_outside_the_class_is_denied_with_its_code() {
        for outside in [
            "evil.test",
            "files.test:8080",
            "a.files.test:443",
            "extra.test:22",
        ] {
            let evaluation =
                evaluate_network_change(&class(), &current(), &change(&[outside], &[]));
            let NetworkEvaluation::Denied { reason } = evaluation else {
                panic!("{outside}: {evaluation:?}");
            };
            assert_eq!(reason.code(), "policy.domain_not_in_class", "{outside}");
        }
    }

    #[test]
    fn an_empty_malformed_or_contradictory_change_is_invalid() {
        for bad in [
            change(&[], &[]),
            change(&["http://api.test/"], &[]),
            change(&["*"], &[]),
            change(&["extra.test"], &["extra.test"]),
        ] {
            let evaluation = evaluate_network_change(&class(), &current(), &bad);
            let NetworkEvaluation::Denied { reason } = evaluation else {
                panic!("{bad:?}: {evaluation:?}");
            };
            assert_eq!(reason.code(), "policy.request_invalid", "{bad:?}");
        }
    }

    #[test]
    fn a_change_is_strict_about_its_fields() {
        assert!(
            serde_json::from_str::<NetworkChange>(r#"{"add":["a.test"],"mode":"open"}"#).is_err()
        );
    }

    #[test]
    fn the_rules_carry_the_ports_of_each_destination() {
        let rules = destination_rules(&["api.test:8080".into(), "extra.test".into()]).unwrap();
        assert_eq!(rules[0].ports, vec![8080]);
        assert_eq!(rules[1].ports, airlock_contract::DEFAULT_PORTS.to_vec());
    }
}
