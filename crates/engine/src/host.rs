//! A cell's supervisor process, forked by the factory ([`crate::factory`]): it serves one
//! cell (airlock_cell::serve_cell) for the engine on the other end of its control socket,
//! with the egress proxy of an allowlisted plan running in this process, and exits.

use crate::egress_session::ProxySession;
use airlock_cell::artifacts::ArtifactRequest;
use airlock_cell::{EgressSession, ServeMode, ServeOptions};
use airlock_contract::{NetworkPlan, PlanTransfer};
use serde::{Deserialize, Serialize};
use std::os::fd::OwnedFd;
use std::time::Duration;

/// What a supervisor process serves.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct HostRequest {
    /// The plan with its seccomp program (which a plan's own serialised form leaves out).
    pub plan: PlanTransfer,
    /// `(variable, value)` of every credential of the plan.
    pub credentials: Vec<(String, String)>,
    /// The run's injected secrets, for the proxy of this process (egress_session.rs).
    #[serde(default)]
    pub secrets: Vec<airlock_egress::secrets::Injection>,
    pub artifacts: Option<ArtifactRequest>,
    pub mode: HostMode,
    /// Where the cell's writable paths go if its verdict is a suspected escape.
    #[serde(default)]
    pub on_suspected_escape: Option<airlock_cell::evidence::OnSuspectedEscape>,
}

/// One command (a cold or warm run), or a session of several.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub enum HostMode {
    OneShot,
    Session {
        idle_timeout_ms: u64,
        max_lifetime_ms: u64,
    },
}

/// Answers the engine on `control` that no cell is built, and why (`Failed`).
pub fn refuse(control: OwnedFd, why: &str) {
    let report = airlock_cell::report::RunReport::refused(
        "",
        airlock_cell::report::ResultClass::RuntimeFault,
        why.to_string(),
    );
    airlock_cell::control::SupervisorControl::new(control).send(
        &airlock_cell::control::ToEngine::Failed {
            report: Box::new(report),
        },
    );
}

/// Serves `request` on `control` until the cell is destroyed.
pub fn serve(
    request: HostRequest,
    control: OwnedFd,
    egress: airlock_egress::EgressConfig,
    host_ids: airlock_cell::host_identity::HostIdRange,
) {
    let mut plan = request.plan.into_plan();
    // The run's CA is made here, in the process whose proxy uses it, and dies with it.
    let tls = crate::egress_session::install_run_ca(&mut plan);
    let mut proxy = match &plan.network {
        NetworkPlan::Allowlist { destinations } => Some(
            ProxySession::new(egress, destinations, &plan.http_rules, request.secrets)
                .with_tls(&tls),
        ),
        NetworkPlan::Deny | NetworkPlan::Pod { .. } => None,
    };
    let mode = match request.mode {
        HostMode::OneShot => ServeMode::OneShot,
        HostMode::Session {
            idle_timeout_ms,
            max_lifetime_ms,
        } => ServeMode::Session {
            idle_timeout: Duration::from_millis(idle_timeout_ms),
            max_lifetime: Duration::from_millis(max_lifetime_ms),
        },
    };
    let artifacts = request.artifacts;
    airlock_cell::serve_cell(
        &plan,
        ServeOptions {
            control,
            credentials: &request.credentials,
            egress: proxy.as_mut().map(|p| p as &mut dyn EgressSession),
            artifacts,
            mode,
            host_ids,
            on_suspected_escape: request.on_suspected_escape,
        },
    );
}
