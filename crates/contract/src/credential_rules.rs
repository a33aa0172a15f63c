//! Which credentials a cell may receive: the one decision every door takes (the engine
//! calls it for every run and session, whatever built the plan), so a variable the
//! operator keeps for the host (the model's API key above all) cannot reach a cell by a
//! door that forgot a copy of the rule. Pure: the caller says which variables are
//! forbidden and which the run's workload class may have anyway.

use crate::plan::CredentialPlan;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

/// The reason code of a refused credential (docs/credentials.md).
pub const CREDENTIAL_FORBIDDEN: &str = "policy.credential_forbidden";

/// The well-known model API keys, forbidden as plain credential sources unless the
/// operator lifts them for a class: a cell that must call a model API gets the key as a
/// `[secrets]` placeholder the egress proxy swaps, never as a variable it can print.
pub const MODEL_KEY_VARIABLES: [&str; 2] = ["OPENAI_API_KEY", "ANTHROPIC_API_KEY"];

/// The operator's rule: the supervisor's variables no credential may read, and per
/// workload class the ones it may read anyway.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CredentialRules {
    pub forbidden: BTreeSet<String>,
    pub lifted_for_class: BTreeMap<String, BTreeSet<String>>,
}

/// A forbidden variable a credential of the run reads because its class lifts it; the
/// run's plan (and so its record) carries every one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LiftedCredential {
    pub credential: String,
    pub from_env: String,
    pub workload_class: String,
}

/// A credential reads a variable the operator forbids in cells.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{CREDENTIAL_FORBIDDEN}: credential {credential:?} reads {from_env}, a variable the \
     operator forbids in cells (a model API key or the host's own; a cell calling a model \
     API gets its key as a [secrets] placeholder)"
)]
pub struct CredentialForbidden {
    pub credential: String,
    pub from_env: String,
}

impl CredentialForbidden {
    pub fn reason(&self) -> &'static str {
        CREDENTIAL_FORBIDDEN
    }
}

impl CredentialRules {
    /// The default rule: the well-known model keys and `extra` (the operator's
    /// `forbidden` list, the agent's `api_key_env`) forbidden, nothing lifted.
    pub fn with_model_keys<I, S>(extra: I) -> CredentialRules
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let mut forbidden: BTreeSet<String> =
            MODEL_KEY_VARIABLES.iter().map(|v| v.to_string()).collect();
        forbidden.extend(extra.into_iter().map(Into::into));
        CredentialRules {
            forbidden,
            lifted_for_class: BTreeMap::new(),
        }
    }

    fn lifted(&self, workload_class: &str, from_env: &str) -> bool {
        self.lifted_for_class
            .get(workload_class)
            .is_some_and(|lifted| lifted.contains(from_env))
    }
}

/// Decides the credentials of a run of `workload_class`: the first one reading a
/// forbidden variable its class does not lift refuses the run; otherwise the forbidden
/// variables read under a lift, for the record.
pub fn decide_credentials(
    credentials: &[CredentialPlan],
    rules: &CredentialRules,
    workload_class: &str,
) -> Result<Vec<LiftedCredential>, CredentialForbidden> {
    let mut lifted = Vec::new();
    for credential in credentials {
        if !rules.forbidden.contains(&credential.from_env) {
            continue;
        }
        if !rules.lifted(workload_class, &credential.from_env) {
            return Err(CredentialForbidden {
                credential: credential.name.clone(),
                from_env: credential.from_env.clone(),
            });
        }
        lifted.push(LiftedCredential {
            credential: credential.name.clone(),
            from_env: credential.from_env.clone(),
            workload_class: workload_class.to_string(),
        });
    }
    Ok(lifted)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn credential(name: &str, from_env: &str) -> CredentialPlan {
        CredentialPlan {
            name: name.into(),
            env: "IN_CELL".into(),
            from_env: from_env.into(),
        }
    }

    #[test]
    fn a_model_key_is_refused_by_default_naming_the_variable() {
        let rules = CredentialRules::with_model_keys(["MY_HOST_TOKEN"]);
        for variable in ["OPENAI_API_KEY", "ANTHROPIC_API_KEY", "MY_HOST_TOKEN"] {
            let err = decide_credentials(
                &[credential("ok", "SOME_TOKEN"), credential("s", variable)],
                &rules,
                "default",
            )
            .unwrap_err();
            assert_eq!(err.from_env, variable);
            assert_eq!(err.credential, "s");
            assert_eq!(err.reason(), "policy.credential_forbidden");
            let text = err.to_string();
            assert!(text.starts_with("policy.credential_forbidden: "), "{text}");
            assert!(text.contains(variable), "{text}");
        }
    }

    #[test]
    fn an_ordinary_credential_passes_and_nothing_is_lifted() {
        let rules = CredentialRules::with_model_keys(Vec::<String>::new());
        let lifted =
            decide_credentials(&[credential("t", "SOME_TOKEN")], &rules, "default").unwrap();
        assert!(lifted.is_empty());
    }

    #[test]
    fn a_lift_holds_only_for_its_class_and_is_reported() {
        let mut rules = CredentialRules::with_model_keys(Vec::<String>::new());
        rules
            .lifted_for_class
            .insert("model-caller".into(), ["OPENAI_API_KEY".to_string()].into());
        let asked = [credential("k", "OPENAI_API_KEY")];
        let lifted = decide_credentials(&asked, &rules, "model-caller").unwrap();
        assert_eq!(
            lifted,
            vec![LiftedCredential {
                credential: "k".into(),
                from_env: "OPENAI_API_KEY".into(),
                workload_class: "model-caller".into(),
            }]
        );
        assert!(decide_credentials(&asked, &rules, "other").is_err());
        let anthropic = [credential("a", "ANTHROPIC_API_KEY")];
        assert!(decide_credentials(&anthropic, &rules, "model-caller").is_err());
    }
}
