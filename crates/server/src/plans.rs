//! From a request to a plan: the named contracts of the configuration (loaded once, at
//! start), or an inline contract for a tenant allowed one, compiled with the request's
//! command, environment additions and deadline.

use crate::config::ServerConfig;
use crate::error::{ApiError, ServerError};
use airlock_cell::report::ResultClass;
use airlock_contract::{
    compile, load_contract_file, parse_contract, read_seccomp_profile, CellPlan, CompileInput,
    Contract, ContractError, ContractFormat, EnvVar, HOST_IMAGE,
};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The workload class of a run under an inline contract.
pub const INLINE_CLASS: &str = "inline";

struct Named {
    contract: Contract,
    base_dir: PathBuf,
}

pub struct Contracts {
    named: BTreeMap<String, Named>,
}

/// What a request asks to run.
pub struct Wanted<'a> {
    pub contract: Option<&'a str>,
    pub inline: Option<&'a serde_json::Value>,
    pub argv: &'a [String],
    pub env: &'a BTreeMap<String, String>,
    pub deadline_ms: Option<u64>,
}

/// Why no plan: an answer, and whether the refusal is worth a record (a contract that
/// did not compile is; a request naming nothing is not).
pub struct PlanRefusal {
    pub error: Box<ApiError>,
    pub class: ResultClass,
    pub workload_class: String,
}

impl Contracts {
    /// Loads every named contract; `config_dir` anchors relative paths.
    pub fn load(config: &ServerConfig, config_dir: &Path) -> Result<Contracts, ServerError> {
        let mut named = BTreeMap::new();
        for (name, path) in &config.contracts {
            let path = config_dir.join(path);
            let contract = load_contract_file(&path).map_err(|source| ServerError::Contract {
                name: name.clone(),
                path: path.display().to_string(),
                source,
            })?;
            if contract.image != HOST_IMAGE {
                return Err(ServerError::Config(format!(
                    "server.contracts.{name}: the service runs contracts on the host image \
                     only (an OCI image needs a lease per run, not built yet)"
                )));
            }
            let base_dir = path.parent().map(Path::to_path_buf).unwrap_or_default();
            named.insert(name.clone(), Named { contract, base_dir });
        }
        Ok(Contracts { named })
    }

    pub fn names(&self) -> impl Iterator<Item = &String> {
        self.named.keys()
    }

    /// The plan of a request, and its workload class (the contract's name).
    pub fn plan(
        &self,
        wanted: &Wanted<'_>,
        inline_allowed: bool,
    ) -> Result<(CellPlan, String), PlanRefusal> {
        let (contract, base_dir, class) = self.contract_of(wanted, inline_allowed)?;
        let plan = plan_of(&contract, &base_dir, &class, wanted)?;
        Ok((plan, class))
    }

    /// The plan of a named contract for a warm pool's template (a pool's shape leaves the
    /// command out; compiling needs one).
    pub fn template(&self, name: &str) -> Option<CellPlan> {
        let wanted = Wanted {
            contract: Some(name),
            inline: None,
            argv: &["/bin/true".to_string()],
            env: &BTreeMap::new(),
            deadline_ms: None,
        };
        self.plan(&wanted, false).ok().map(|(plan, _)| plan)
    }

    fn contract_of(
        &self,
        wanted: &Wanted<'_>,
        inline_allowed: bool,
    ) -> Result<(Contract, PathBuf, String), PlanRefusal> {
        let refusal = |error: ApiError| PlanRefusal {
            error: Box::new(error),
            class: ResultClass::PolicyDenied,
            workload_class: String::new(),
        };
        match (wanted.contract, wanted.inline) {
            (Some(name), None) => match self.named.get(name) {
                Some(named) => Ok((
                    named.contract.clone(),
                    named.base_dir.clone(),
                    name.to_string(),
                )),
                None => Err(refusal(ApiError::bad_request(
                    "contract.unknown",
                    format!("no contract named {name:?} in the service's configuration"),
                ))),
            },
            (None, Some(_)) if !inline_allowed => Err(refusal(ApiError::forbidden(
                "contract.inline_not_allowed",
                "this tenant may only name a configured contract".into(),
            ))),
            (None, Some(inline)) => {
                let text = inline.to_string();
                let contract = parse_contract(&text, ContractFormat::Json).map_err(|err| {
                    refusal(ApiError::new(
                        axum::http::StatusCode::UNPROCESSABLE_ENTITY,
                        ResultClass::PolicyDenied,
                        "contract.invalid",
                        format!("contract: {err}"),
                    ))
                })?;
                if contract.image != HOST_IMAGE {
                    return Err(refusal(ApiError::bad_request(
                        "contract.image_unsupported",
                        "the service runs contracts on the host image only".into(),
                    )));
                }
                // Relative paths of an inline contract have no directory to be relative to.
                Ok((contract, PathBuf::from("/"), INLINE_CLASS.to_string()))
            }
            _ => Err(refusal(ApiError::bad_request(
                "contract.missing",
                "name a contract (`contract`) or, if allowed, send one (`contract_inline`)".into(),
            ))),
        }
    }
}

/// The plan of `contract` (from `base_dir`) for a request: its command, environment
/// additions (none of airlock's reserved names) and deadline (only shorter).
pub fn plan_of(
    contract: &Contract,
    base_dir: &Path,
    class: &str,
    wanted: &Wanted<'_>,
) -> Result<CellPlan, PlanRefusal> {
    if let Some(name) = wanted
        .env
        .keys()
        .find(|n| airlock_contract::RESERVED_ENV_NAMES.contains(&n.as_str()))
    {
        return Err(PlanRefusal {
            error: Box::new(ApiError::bad_request(
                "env.reserved",
                format!("{name} is set by airlock, not by a request"),
            )),
            class: ResultClass::PolicyDenied,
            workload_class: class.to_string(),
        });
    }
    let refuse = |err: ContractError| {
        let status = ResultClass::from_name(err.class()).unwrap_or(ResultClass::PolicyDenied);
        PlanRefusal {
            error: Box::new(ApiError::new(
                axum::http::StatusCode::UNPROCESSABLE_ENTITY,
                status,
                "contract.invalid",
                format!("contract: {err}"),
            )),
            class: status,
            workload_class: class.to_string(),
        }
    };
    let profile = read_seccomp_profile(contract, base_dir).map_err(refuse)?;
    let mut plan = compile(
        contract,
        &CompileInput {
            base_dir,
            argv: wanted.argv,
            seccomp_profile: profile.as_deref(),
            image: None,
        },
    )
    .map_err(refuse)?;
    add_env(&mut plan, wanted.env);
    if let Some(deadline) = wanted.deadline_ms {
        // A request may shorten its contract's deadline, never lengthen it.
        plan.limits.wall_time_ms = plan.limits.wall_time_ms.min(deadline.max(1));
    }
    Ok(plan)
}

/// The request's environment additions, replacing the plan's variables of the same name.
fn add_env(plan: &mut CellPlan, env: &BTreeMap<String, String>) {
    for (name, value) in env {
        plan.env.retain(|v| &v.name != name);
        plan.env.push(EnvVar {
            name: name.clone(),
            value: value.clone(),
            secret: false,
        });
    }
}
