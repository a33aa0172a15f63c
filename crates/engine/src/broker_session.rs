//! Connects a run's lifecycle to its broker (airlock-broker, docs/credentials.md "The
//! broker"): the socket is bound and mounted before the cell exists, served once the cell
//! is cloned, and removed when the run ends; its records join the run's result.

use crate::Engine;
use airlock_broker::{ActionRecord, BrokerServer, Decision, RunGrant};
use airlock_cell::report::{BrokerActionRecord, ResultClass, RunReport};
use airlock_contract::{CellPlan, MountPlan, BROKER_SOCKET};
use std::path::PathBuf;

/// Why a run's broker could not be set up: the run is refused with this class.
pub(crate) struct BrokerRefusal {
    pub status: ResultClass,
    pub error: String,
}

impl Engine {
    /// The broker of a plan that names actions: every action defined by the operator
    /// (else `policy_denied`), its socket bound outside the cell and its mount added to
    /// the plan (as data: the cell mounts what the plan says). `None` for a plan that
    /// names no action: then the cell has no socket at all.
    pub(crate) fn start_broker(
        &self,
        plan: &mut CellPlan,
        tenant: Option<&str>,
    ) -> Result<Option<BrokerServer>, BrokerRefusal> {
        let Some(named) = &plan.broker else {
            return Ok(None);
        };
        let broker = &self.config.broker;
        let undefined = broker.undefined(&named.actions);
        if !undefined.is_empty() {
            return Err(BrokerRefusal {
                status: ResultClass::PolicyDenied,
                error: format!(
                    "broker: the contract names {}, which the operator's [broker.actions] does \
                     not define",
                    undefined.join(", ")
                ),
            });
        }
        let grant = RunGrant {
            actions: named.actions.clone(),
            class: named.class.clone(),
            tenant: tenant.map(str::to_string),
        };
        let parent = self.config.state_dir.join("broker");
        let server =
            BrokerServer::bind(&parent, broker.clone(), grant).map_err(|err| BrokerRefusal {
                status: ResultClass::SandboxUnavailable,
                error: err.to_string(),
            })?;
        plan.mounts.push(MountPlan::BrokerSocket {
            source: server.socket_path().to_path_buf(),
            target: PathBuf::from(BROKER_SOCKET),
        });
        Ok(Some(server))
    }
}

/// Ends a run's broker (its socket is gone: a later connection fails) and adds what it
/// answered to the run's result.
pub(crate) fn finish_broker(server: Option<BrokerServer>, report: &mut RunReport) {
    if let Some(server) = server {
        report.broker = server.finish().iter().map(broker_record).collect();
    }
}

fn broker_record(record: &ActionRecord) -> BrokerActionRecord {
    let outcome = record.outcome.clone().unwrap_or_default();
    BrokerActionRecord {
        action: record.action.clone(),
        request_sha256: record.request_sha256.clone(),
        request_bytes: record.request_bytes,
        decision: match record.decision {
            Decision::Granted => "granted",
            Decision::Denied => "denied",
        }
        .to_string(),
        reason: record.reason.clone(),
        exit_code: outcome.exit_code,
        bytes: outcome.bytes,
        stored_as: outcome.stored_as,
        error: outcome.error,
        duration_ms: record.duration_ms,
        started_at_unix_ms: record.started_at_unix_ms,
    }
}
