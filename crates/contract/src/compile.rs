//! Contract -> [`CellPlan`]: a pure function (no file system, no environment, no clock), so
//! the same contract and input always give the same plan, and every decision is unit-testable.

use crate::contract::{Contract, NetworkMode, HOST_IMAGE};
use crate::error::{ContractError, FieldError};
use crate::plan::*;
use crate::validate::{check, CheckedContract};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// What the caller adds to a contract to make a runnable plan.
#[derive(Debug, Clone, Copy)]
pub struct CompileInput<'a> {
    /// Absolute directory relative host paths of the contract (inputs, seccomp profile) are
    /// resolved against; normally the contract file's directory.
    pub base_dir: &'a Path,
    pub argv: &'a [String],
}

const MIB: u64 = 1 << 20;
const ROOTFS_SIZE_BYTES: u64 = MIB;
const BASE_PATH: &str = "/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin";
const NO_PROXY: &str = "localhost,127.0.0.1,::1";

/// Host directories that make up the `host` image, with whether they may be absent.
/// `/usr` is the one every distribution has; the rest vary (merged-/usr, multilib).
const HOST_SYSTEM_DIRS: &[(&str, bool)] = &[
    ("/usr", false),
    ("/bin", true),
    ("/sbin", true),
    ("/lib", true),
    ("/lib64", true),
    ("/lib32", true),
    ("/libx32", true),
];

pub fn compile(contract: &Contract, input: &CompileInput) -> Result<CellPlan, ContractError> {
    let checked = check(contract).map_err(ContractError::Invalid)?;
    if contract.image != HOST_IMAGE {
        return Err(ContractError::Unsupported {
            path: "image".to_owned(),
            message: "only `host` (a read-only view of the host's /usr, /bin, /lib*, /sbin) is \
                      supported by this runtime; OCI images are not"
                .to_owned(),
        });
    }
    check_input(input)?;

    Ok(CellPlan {
        contract_sha256: contract_sha256(contract),
        argv: input.argv.to_vec(),
        identity: CellIdentity {
            uid: narrow(contract.identity.uid),
            gid: narrow(contract.identity.gid),
        },
        hostname: contract.hostname.clone(),
        workdir: PathBuf::from(&checked.workdir),
        env: environment(contract, &checked),
        rootfs: RootfsPlan {
            image: RootImage::Host,
            readonly: contract.filesystem.readonly_root,
            size_bytes: ROOTFS_SIZE_BYTES,
        },
        mounts: mounts(&checked, input.base_dir),
        network: match contract.network.mode {
            NetworkMode::Deny => NetworkPlan::Deny,
            NetworkMode::Allowlist => NetworkPlan::Allowlist {
                destinations: checked.destinations.clone(),
            },
        },
        limits: limits(contract),
        seccomp: match &checked.seccomp_profile {
            None => SeccompPlan::Default,
            Some(profile) => SeccompPlan::DockerJson {
                path: host_path(input.base_dir, &profile.host_path()),
            },
        },
        output_allowlist: checked.output_allowlist.clone(),
        credentials: contract
            .credentials
            .iter()
            .map(|credential| CredentialPlan {
                name: credential.name.clone(),
                env: credential.env.clone(),
                from_env: credential.from_env.clone(),
            })
            .collect(),
    })
}

/// sha256 (hex) of the contract's canonical JSON: field order is the struct's, maps are
/// sorted and defaults are filled in, so equivalent documents in any format hash the same.
pub fn contract_sha256(contract: &Contract) -> String {
    let canonical = serde_json::to_vec(contract).expect("a Contract always serialises to JSON");
    hex::encode(Sha256::digest(canonical))
}

fn check_input(input: &CompileInput) -> Result<(), ContractError> {
    let mut errors = Vec::new();
    if input.argv.is_empty() || input.argv[0].is_empty() {
        errors.push(FieldError::new("argv", "must name a command"));
    }
    for (index, argument) in input.argv.iter().enumerate() {
        if argument.contains('\0') {
            errors.push(FieldError::new(
                format!("argv[{index}]"),
                "must not contain NUL",
            ));
        }
    }
    // A relative base would make the plan's host paths depend on the runtime's cwd.
    if !input.base_dir.is_absolute() {
        errors.push(FieldError::new("base_dir", "must be an absolute path"));
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(ContractError::Invalid(errors))
    }
}

fn host_path(base_dir: &Path, path: &str) -> PathBuf {
    if path.starts_with('/') {
        PathBuf::from(path)
    } else {
        base_dir.join(path)
    }
}

fn mounts(checked: &CheckedContract, base_dir: &Path) -> Vec<MountPlan> {
    let system = HOST_SYSTEM_DIRS
        .iter()
        .map(|&(path, optional)| MountPlan::HostSystem {
            path: PathBuf::from(path),
            optional,
        });
    let inputs = checked.inputs.iter().map(|input| MountPlan::ReadonlyInput {
        source: host_path(base_dir, &input.source.host_path()),
        target: PathBuf::from(input.target.cell_path()),
    });
    let writable = checked
        .writable
        .iter()
        .map(|writable| MountPlan::WritableTmpfs {
            target: PathBuf::from(writable.target.cell_path()),
            size_bytes: writable.size_bytes,
        });
    system.chain(inputs).chain(writable).collect()
}

fn environment(contract: &Contract, checked: &CheckedContract) -> Vec<EnvVar> {
    let mut env: BTreeMap<String, (String, bool)> = BTreeMap::new();
    let mut set = |name: &str, value: &str, secret: bool| {
        env.insert(name.to_owned(), (value.to_owned(), secret));
    };
    set("PATH", BASE_PATH, false);
    set("HOME", &checked.workdir, false);
    set("LANG", "C.UTF-8", false);
    if checked.tmp_is_writable() {
        set("TMPDIR", "/tmp", false);
    }
    for (name, value) in &contract.env {
        set(name, value.value(), value.is_secret());
    }
    if contract.network.mode == NetworkMode::Allowlist {
        let http = format!("http://127.0.0.1:{HTTP_PROXY_PORT}");
        let socks = format!("socks5h://127.0.0.1:{SOCKS_PROXY_PORT}");
        // Tools disagree on which case they read (curl ignores upper-case HTTP_PROXY), so
        // both are set.
        for (name, value) in [
            ("HTTP_PROXY", http.as_str()),
            ("HTTPS_PROXY", http.as_str()),
            ("ALL_PROXY", socks.as_str()),
            ("NO_PROXY", NO_PROXY),
        ] {
            set(name, value, false);
            set(&name.to_ascii_lowercase(), value, false);
        }
    }
    env.into_iter()
        .map(|(name, (value, secret))| EnvVar {
            name,
            value,
            secret,
        })
        .collect()
}

fn limits(contract: &Contract) -> Limits {
    let resources = &contract.resources;
    Limits {
        cpu_millis: narrow(resources.cpu_millis),
        memory_bytes: widen(resources.memory_mb) * MIB,
        process_limit: narrow(resources.process_limit),
        wall_time_ms: widen(resources.wall_time_seconds) * 1000,
        output_bytes: widen(resources.output_bytes),
        open_files: widen(resources.open_files),
        file_size_bytes: widen(resources.file_size_mb) * MIB,
    }
}

/// Only called on values validation has bounded to well inside `u32`.
fn narrow(value: i64) -> u32 {
    u32::try_from(value).expect("validated value fits u32")
}

/// Only called on values validation has bounded to be positive.
fn widen(value: i64) -> u64 {
    u64::try_from(value).expect("validated value is positive")
}
