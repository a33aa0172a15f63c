//! From a request to a plan: the named contracts of the configuration (loaded once, at
//! start), or an inline contract for a tenant allowed one, compiled with the request's
//! command, environment additions and deadline. A contract's OCI image is resolved
//! through the host's image store ([`ImageResolver`]): a named contract's once at start,
//! its lease held for the service's life; an inline contract's per request, its lease
//! held by the run or session.

use crate::config::ServerConfig;
use crate::error::{ApiError, ServerError};
use airlock_cell::report::ResultClass;
use airlock_contract::{
    check_command, check_exec, compile, load_contract_file, parse_contract, read_seccomp_profile,
    CellPlan, CommandInput, CompileInput, Contract, ContractError, ContractFormat, EnvVar,
    ResolvedImage, HOST_IMAGE,
};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use airlock_engine::handoff::{ImageLease, LeasedImage};

/// The workload class of a run under an inline contract.
pub const INLINE_CLASS: &str = "inline";

/// The host's OCI image store as the service reads it (the binary implements it with
/// its `[images]` configuration, crates/airlock/src/run_image.rs).
pub trait ImageResolver: Send + Sync {
    /// The contract's `image` reference resolved to its layers and process defaults,
    /// and the lease that keeps `airlock image rm` and `gc` from removing it while held;
    /// or why not, with the run's class.
    fn resolve(&self, image: &str) -> Result<LeasedImage, (ResultClass, String)>;
}

struct Named {
    contract: Contract,
    base_dir: PathBuf,
    /// The contract's image, resolved at start; its lease lives as long as the service.
    image: Option<LeasedImage>,
}

/// A request's contract before compiling: its image resolved, the lease of an image
/// resolved for this request alone.
struct Chosen<'a> {
    contract: Contract,
    base_dir: PathBuf,
    class: String,
    image: Option<&'a ResolvedImage>,
    own_lease: Option<LeasedImage>,
}

/// A request's plan, its workload class, and the lease of its inline contract's image
/// (to be held until its cell is gone).
pub struct Planned {
    pub plan: CellPlan,
    pub class: String,
    pub lease: Option<ImageLease>,
}

pub struct Contracts {
    named: BTreeMap<String, Named>,
    images: Option<Arc<dyn ImageResolver>>,
}

/// `image` resolved when it is not the host's view; without an image store the service
/// cannot run it.
fn resolve_image(
    images: Option<&dyn ImageResolver>,
    image: &str,
) -> Result<Option<LeasedImage>, (ResultClass, String)> {
    if image == HOST_IMAGE {
        return Ok(None);
    }
    match images {
        Some(images) => images.resolve(image).map(Some),
        None => Err((
            ResultClass::SandboxUnavailable,
            format!("image {image}: this service has no image store"),
        )),
    }
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
    /// Loads every named contract; `config_dir` anchors relative paths. A contract's
    /// image must be in the store now: the service does not start otherwise.
    pub fn load(
        config: &ServerConfig,
        config_dir: &Path,
        images: Option<Arc<dyn ImageResolver>>,
    ) -> Result<Contracts, ServerError> {
        let mut named = BTreeMap::new();
        for (name, path) in &config.contracts {
            let path = config_dir.join(path);
            let contract = load_contract_file(&path).map_err(|source| ServerError::Contract {
                name: name.clone(),
                path: path.display().to_string(),
                source,
            })?;
            let image = match resolve_image(images.as_deref(), &contract.image) {
                Ok(image) => image,
                Err((_, why)) => {
                    return Err(ServerError::Config(format!(
                        "server.contracts.{name}: {why}"
                    )))
                }
            };
            let base_dir = path.parent().map(Path::to_path_buf).unwrap_or_default();
            named.insert(
                name.clone(),
                Named {
                    contract,
                    base_dir,
                    image,
                },
            );
        }
        Ok(Contracts { named, images })
    }

    pub fn names(&self) -> impl Iterator<Item = &String> {
        self.named.keys()
    }

    /// The plan of a request, its workload class (the contract's name), and the lease of
    /// an inline contract's image.
    pub fn plan(&self, wanted: &Wanted<'_>, inline_allowed: bool) -> Result<Planned, PlanRefusal> {
        let chosen = self.contract_of(wanted, inline_allowed)?;
        let image = chosen
            .image
            .or(chosen.own_lease.as_ref().map(|leased| &leased.image));
        let plan = plan_of(
            &chosen.contract,
            &chosen.base_dir,
            &chosen.class,
            wanted,
            image,
        )?;
        Ok(Planned {
            plan,
            class: chosen.class,
            lease: chosen.own_lease.map(|leased| leased.lease),
        })
    }

    /// A hand-off client's image, when this service's store has it and its policy
    /// admits the reference (otherwise the client runs it in its own process).
    pub fn leased_image(&self, reference: &str) -> Option<LeasedImage> {
        resolve_image(self.images.as_deref(), reference)
            .ok()
            .flatten()
    }

    /// The plan of a contract the policy layer generated for a request (a class's), its
    /// image resolved for this request alone.
    pub fn plan_granted(
        &self,
        contract: &Contract,
        base_dir: &Path,
        class: &str,
        wanted: &Wanted<'_>,
    ) -> Result<Planned, PlanRefusal> {
        let own_lease = resolve_image(self.images.as_deref(), &contract.image)
            .map_err(|(status, why)| image_refusal(status, why, class))?;
        let image = own_lease.as_ref().map(|leased| &leased.image);
        let plan = plan_of(contract, base_dir, class, wanted, image)?;
        Ok(Planned {
            plan,
            class: class.to_string(),
            lease: own_lease.map(|leased| leased.lease),
        })
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
        self.plan(&wanted, false).ok().map(|planned| planned.plan)
    }

    fn contract_of(
        &self,
        wanted: &Wanted<'_>,
        inline_allowed: bool,
    ) -> Result<Chosen<'_>, PlanRefusal> {
        let refusal = |error: ApiError| PlanRefusal {
            error: Box::new(error),
            class: ResultClass::PolicyDenied,
            workload_class: String::new(),
        };
        match (wanted.contract, wanted.inline) {
            (Some(name), None) => match self.named.get(name) {
                Some(named) => Ok(Chosen {
                    contract: named.contract.clone(),
                    base_dir: named.base_dir.clone(),
                    class: name.to_string(),
                    image: named.image.as_ref().map(|leased| &leased.image),
                    own_lease: None,
                }),
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
                let own_lease = resolve_image(self.images.as_deref(), &contract.image)
                    .map_err(|(status, why)| image_refusal(status, why, INLINE_CLASS))?;
                Ok(Chosen {
                    contract,
                    // Relative paths of an inline contract have no directory to be
                    // relative to.
                    base_dir: PathBuf::from("/"),
                    class: INLINE_CLASS.to_string(),
                    image: None,
                    own_lease,
                })
            }
            _ => Err(refusal(ApiError::bad_request(
                "contract.missing",
                "name a contract (`contract`) or, if allowed, send one (`contract_inline`)".into(),
            ))),
        }
    }
}

/// A request's image that cannot be the cell's root: 422 `contract.image` with the class
/// the image store gave (an unpinned reference is the contract's fault, a missing image
/// the host's).
fn image_refusal(status: ResultClass, why: String, workload_class: &str) -> PlanRefusal {
    PlanRefusal {
        error: Box::new(ApiError::new(
            axum::http::StatusCode::UNPROCESSABLE_ENTITY,
            status,
            "contract.image",
            why,
        )),
        class: status,
        workload_class: workload_class.to_string(),
    }
}

/// A request's own command and environment additions as [`check_command`] decides
/// (portable names, none of airlock's reserved ones, no NUL, within what a cell can
/// exec): every door's first step, before admission, policy or contract. Its refusal is
/// answered, not recorded: a malformed command is refused like a malformed body, and
/// recording it as sent would let a tenant write `max_body_bytes` of argv into the
/// store per request.
pub fn check_wanted(argv: &[String], env: &BTreeMap<String, String>) -> Result<(), ApiError> {
    let additions: Vec<(&str, &str)> = env
        .iter()
        .map(|(name, value)| (name.as_str(), value.as_str()))
        .collect();
    check_command(&CommandInput {
        argv,
        env: &additions,
        ..CommandInput::default()
    })
    .map_err(|err| ApiError::command_input(&err))
}

/// The plan of `contract` (from `base_dir`) for a request: its command, environment
/// additions (see [`check_wanted`]; the whole command is checked again once compiled,
/// the plan's own environment counted) and deadline (only shorter).
pub fn plan_of(
    contract: &Contract,
    base_dir: &Path,
    class: &str,
    wanted: &Wanted<'_>,
    image: Option<&ResolvedImage>,
) -> Result<CellPlan, PlanRefusal> {
    let input_refusal = |err: airlock_contract::CommandInputError| PlanRefusal {
        error: Box::new(ApiError::command_input(&err)),
        class: ResultClass::PolicyDenied,
        workload_class: class.to_string(),
    };
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
            image,
            pod_network: None,
        },
    )
    .map_err(refuse)?;
    add_env(&mut plan, wanted.env);
    // What the cell will exec: the plan's argv (an image's entrypoint too) and its
    // whole environment.
    let env = airlock_contract::plan_env(&plan);
    check_exec(&CommandInput {
        argv: &plan.argv,
        base_env: &env,
        ..CommandInput::default()
    })
    .map_err(input_refusal)?;
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
