//! Who asked for a piece of work, for the front ends that do not own tenants themselves:
//! the service authenticates a request to `/mcp` or `/v1/tools` and hands the agent's
//! routes a [`Caller`]. Every cell the agent then starts for that request takes a slot
//! of the caller's quotas first and is recorded under its tenant, exactly as a
//! `POST /v1/runs` would be.

use airlock_cell::report::ResultClass;
use std::sync::Arc;

/// What a piece of work takes of a tenant's quotas.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Work {
    /// A one-shot run: a cell and a start.
    Run,
    /// A session: a cell and a session slot, held until it closes.
    Session,
    /// A command of an open session: a start only.
    Command,
}

/// A refusal of the service's, with its reason code (`auth.bad_key`, `quota.cells`, ...).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    pub class: ResultClass,
    pub reason: String,
    pub message: String,
}

/// Held while the work lives; its quota slot is given back when dropped.
pub struct Admitted {
    _permit: Box<dyn Send + Sync>,
}

impl Admitted {
    pub fn new(permit: impl Send + Sync + 'static) -> Admitted {
        Admitted {
            _permit: Box::new(permit),
        }
    }
}

/// The quota check a caller's work goes through.
pub type Admit = Arc<dyn Fn(Work) -> Result<Admitted, Refused> + Send + Sync>;

/// An authenticated caller: its tenant and the service's admission of its work.
#[derive(Clone)]
pub struct Caller {
    tenant: String,
    admit: Admit,
}

impl Caller {
    pub fn new(tenant: String, admit: Admit) -> Caller {
        Caller { tenant, admit }
    }

    /// A caller with no quotas (`airlock mcp --listen`: one key, one tenant).
    pub fn unbounded(tenant: String) -> Caller {
        Caller::new(tenant, Arc::new(|_| Ok(Admitted::new(()))))
    }

    pub fn tenant(&self) -> &str {
        &self.tenant
    }

    /// Takes what `work` needs of this caller's quotas, or says which one is exhausted.
    pub fn admit(&self, work: Work) -> Result<Admitted, Refused> {
        (self.admit)(work)
    }
}

impl std::fmt::Debug for Caller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Caller")
            .field("tenant", &self.tenant)
            .finish()
    }
}
