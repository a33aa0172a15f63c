//! airlock-contract: the execution contract (what one cell may see, reach and consume),
//! its parsing from YAML, TOML or JSON, its validation, and its pure compilation into the
//! [`CellPlan`] the runtime applies.

pub mod command_input;
mod compile;
mod contract;
pub mod credential_rules;
mod error;
mod etc;
pub mod layout;
mod parse;
pub mod plan;
mod rlimits_only;
pub mod seccomp;
pub mod transparent;
mod validate;

pub use command_input::{
    check_command, check_env_key, check_exec, plan_env, CommandInput, CommandInputError,
    MAX_ARG_STRLEN, MAX_COMMAND_BYTES,
};
pub use compile::{compile, contract_sha256, CompileInput, PodInput};
pub use contract::*;
pub use credential_rules::{
    decide_credentials, CredentialForbidden, CredentialRules, LiftedCredential,
    CREDENTIAL_FORBIDDEN, MODEL_KEY_VARIABLES,
};
pub use error::{ContractError, ContractFormat, FieldError, FieldErrors};
pub use etc::{ETC_DENIED, ETC_GENERATED, HOST_ETC_ENTRIES, HOST_ETC_EXCLUDED};
pub use layout::*;
pub use plan::*;
pub use rlimits_only::{RlimitCeiling, RlimitTarget, RlimitsOnly};
pub use transparent::{
    transparent_endpoints, TransparentEndpoint, MAX_TRANSPARENT_LISTENERS, TRANSPARENT_DNS,
};
pub use validate::{
    parse_destination, BASE_ENV_NAMES, DEFAULT_PORTS, RESERVED_CELL_DIRS, RESERVED_ENV_NAMES,
};

use std::path::Path;

/// Parses and validates a contract document, bare or wrapped in `execution_contract:`.
/// Every rule violation is reported at once; see [`ContractError::Invalid`].
pub fn parse_contract(text: &str, format: ContractFormat) -> Result<Contract, ContractError> {
    let contract = parse::parse_document(text, format)?;
    validate_contract(&contract)?;
    Ok(contract)
}

/// Checks every rule of a contract built in code (parsed contracts are already checked).
pub fn validate_contract(contract: &Contract) -> Result<(), ContractError> {
    validate::check(contract)
        .map(|_| ())
        .map_err(ContractError::Invalid)
}

/// Reads a contract file, choosing the format by its extension (`.yaml`, `.yml`, `.toml`,
/// `.json`). With [`read_seccomp_profile`], the only I/O of this crate.
pub fn load_contract_file(path: &Path) -> Result<Contract, ContractError> {
    let unreadable = |source| ContractError::Io {
        path: path.to_owned(),
        source,
    };
    // A directory is reported as what it is, not as a name without an extension.
    if path.is_dir() {
        return Err(unreadable(std::io::ErrorKind::IsADirectory.into()));
    }
    let extension = path
        .extension()
        .map(|e| e.to_string_lossy().into_owned())
        .unwrap_or_default();
    let format = ContractFormat::from_extension(&extension).ok_or_else(|| {
        ContractError::invalid(
            "file",
            format!(
                "unknown contract extension `{extension}` of {}: use .yaml, .yml, .toml or .json",
                path.display()
            ),
        )
    })?;
    let text = std::fs::read_to_string(path).map_err(unreadable)?;
    parse_contract(&text, format)
}

/// Reads the custom seccomp profile `contract` names (relative paths against `base_dir`,
/// as compile resolves them): the text for [`CompileInput::seccomp_profile`]. `None` for
/// the default profile. I/O, so it is done where the contract is loaded, not in compile.
pub fn read_seccomp_profile(
    contract: &Contract,
    base_dir: &Path,
) -> Result<Option<String>, ContractError> {
    let Some(path) = compile::seccomp_profile_path(contract, base_dir) else {
        return Ok(None);
    };
    std::fs::read_to_string(&path)
        .map(Some)
        .map_err(|source| ContractError::ProfileIo { path, source })
}

/// JSON Schema of a contract document (bare or wrapped), generated from the types.
pub fn contract_json_schema() -> serde_json::Value {
    serde_json::to_value(schemars::schema_for!(ContractDocument))
        .expect("a generated schema always serialises")
}
