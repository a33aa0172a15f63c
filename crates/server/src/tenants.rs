//! Who is asking: an API key (its sha256 is in the configuration) on any listener, or the
//! peer's uid (SO_PEERCRED) on the unix socket, where uid 0 is the operator tenant.

use crate::config::ServerConfig;
use crate::error::ApiError;
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;

/// Who is on the other end of a connection, as the kernel says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Peer {
    Unix { uid: u32, pid: Option<i32> },
    Tcp,
}

/// The tenant of a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tenant {
    pub name: String,
    /// The operator sees and touches every tenant's runs and sessions.
    pub operator: bool,
}

impl Tenant {
    /// Whether this tenant may see something recorded for `owner`.
    pub fn may_see(&self, owner: Option<&str>) -> bool {
        self.operator || owner == Some(self.name.as_str())
    }
}

pub struct Tenants {
    by_key: BTreeMap<String, String>,
    by_uid: BTreeMap<u32, String>,
    operator: String,
}

impl Tenants {
    pub fn of(config: &ServerConfig) -> Tenants {
        let mut by_key = BTreeMap::new();
        let mut by_uid = BTreeMap::new();
        for (name, tenant) in &config.tenants {
            for key in &tenant.api_key_sha256 {
                by_key.insert(key.to_ascii_lowercase(), name.clone());
            }
            for uid in &tenant.uids {
                by_uid.insert(*uid, name.clone());
            }
        }
        Tenants {
            by_key,
            by_uid,
            operator: config.operator_tenant.clone(),
        }
    }

    /// The tenant of a request from `peer` with the `Authorization` header `authorization`.
    /// A key that matches no tenant is refused even on the unix socket: a client that
    /// sent one meant to be that tenant.
    pub fn resolve(&self, peer: Peer, authorization: Option<&str>) -> Result<Tenant, ApiError> {
        if let Some(header) = authorization {
            let key = header.strip_prefix("Bearer ").ok_or_else(|| {
                ApiError::unauthorized("auth.bad_header", "Authorization must be `Bearer KEY`")
            })?;
            let hash = hex::encode(Sha256::digest(key.trim().as_bytes()));
            return match self.by_key.get(&hash) {
                Some(name) => Ok(self.tenant(name)),
                None => Err(ApiError::unauthorized(
                    "auth.bad_key",
                    "the API key is not a tenant's",
                )),
            };
        }
        match peer {
            Peer::Unix { uid: 0, .. } => Ok(Tenant {
                name: self.operator.clone(),
                operator: true,
            }),
            Peer::Unix { uid, .. } => match self.by_uid.get(&uid) {
                Some(name) => Ok(self.tenant(name)),
                None => Err(ApiError::unauthorized(
                    "auth.unknown_peer",
                    "this uid is no tenant's; send an API key",
                )),
            },
            Peer::Tcp => Err(ApiError::unauthorized(
                "auth.missing_key",
                "an API key is required over TCP (Authorization: Bearer KEY)",
            )),
        }
    }

    fn tenant(&self, name: &str) -> Tenant {
        Tenant {
            name: name.to_string(),
            operator: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::TenantConfig;

    fn tenants() -> Tenants {
        let mut config = ServerConfig::default();
        config.tenants.insert(
            "alice".into(),
            TenantConfig {
                api_key_sha256: vec![hex::encode(Sha256::digest(b"alice-key"))],
                uids: vec![1000],
                ..TenantConfig::default()
            },
        );
        Tenants::of(&config)
    }

    #[test]
    fn a_key_names_its_tenant_on_any_listener() {
        let t = tenants();
        let alice = t.resolve(Peer::Tcp, Some("Bearer alice-key")).unwrap();
        assert_eq!(alice.name, "alice");
        assert!(!alice.operator);
        let root = Peer::Unix { uid: 0, pid: None };
        assert_eq!(t.resolve(root, Some("Bearer alice-key")).unwrap(), alice);
    }

    #[test]
    fn a_wrong_key_is_refused_even_from_root() {
        let t = tenants();
        let root = Peer::Unix { uid: 0, pid: None };
        let err = t.resolve(root, Some("Bearer nope")).unwrap_err();
        assert_eq!(err.body.reason, "auth.bad_key");
        assert_eq!(err.status, 401);
        let err = t.resolve(root, Some("Basic x")).unwrap_err();
        assert_eq!(err.body.reason, "auth.bad_header");
    }

    #[test]
    fn on_the_unix_socket_uid_0_is_the_operator_and_known_uids_their_tenant() {
        let t = tenants();
        let op = t.resolve(Peer::Unix { uid: 0, pid: None }, None).unwrap();
        assert!(op.operator);
        let alice = t
            .resolve(
                Peer::Unix {
                    uid: 1000,
                    pid: None,
                },
                None,
            )
            .unwrap();
        assert_eq!(alice.name, "alice");
        let err = t
            .resolve(
                Peer::Unix {
                    uid: 1001,
                    pid: None,
                },
                None,
            )
            .unwrap_err();
        assert_eq!(err.body.reason, "auth.unknown_peer");
    }

    #[test]
    fn tcp_without_a_key_is_refused() {
        let err = tenants().resolve(Peer::Tcp, None).unwrap_err();
        assert_eq!(err.body.reason, "auth.missing_key");
    }

    #[test]
    fn a_tenant_sees_only_its_own_records_and_the_operator_all() {
        let alice = Tenant {
            name: "alice".into(),
            operator: false,
        };
        assert!(alice.may_see(Some("alice")));
        assert!(!alice.may_see(Some("bob")));
        assert!(!alice.may_see(None));
        let op = Tenant {
            name: "operator".into(),
            operator: true,
        };
        assert!(op.may_see(Some("bob")) && op.may_see(None));
    }
}
