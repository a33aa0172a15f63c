//! The contracts `airlock verify` runs besides the one under test, derived from it by pure
//! functions: the same contract with one ceiling tightened (never loosened) so that the
//! probe can exceed it quickly, or with a credential for the check to inject. A derived
//! contract is written to the verification's own directory, so its relative paths are
//! made absolute against the directory of the contract they came from first.

use airlock_contract::{
    Contract, Credential, DetailedWritablePath, EtcFile, MappedInput, ReadonlyInput, WritablePath,
    DEFAULT_WRITABLE_EXEC, DEFAULT_WRITABLE_SIZE_MB,
};
use std::path::Path;

/// The largest ceiling each ceiling check uses: the probe goes past it, and the whole
/// suite stays within its time budget (docs/verify.md, "Ceilings").
pub const MEMORY_MB: i64 = 128;
pub const PROCESSES: i64 = 32;
pub const DISK_MB: i64 = 4;
pub const OUTPUT_BYTES: i64 = 64 << 10;
pub const WALL_TIME_SECONDS: i64 = 1;

/// The environment variable (of the cell and of the supervisor) of the check's credential.
pub const CREDENTIAL_ENV: &str = "AIRLOCK_VERIFY_CREDENTIAL";

/// `contract` with every host path absolute against `base_dir`, so that it means the same
/// from any directory.
pub fn absolute(contract: &Contract, base_dir: &Path) -> Contract {
    let join = |raw: &str| base_dir.join(raw).to_string_lossy().into_owned();
    let mut out = contract.clone();
    out.filesystem.readonly_inputs = (contract.filesystem.readonly_inputs.iter())
        .map(|input| match input {
            ReadonlyInput::Path(raw) if !raw.starts_with('/') => {
                ReadonlyInput::Mapped(MappedInput {
                    source: join(raw),
                    target: raw.clone(),
                })
            }
            ReadonlyInput::Mapped(m) if !m.source.starts_with('/') => {
                ReadonlyInput::Mapped(MappedInput {
                    source: join(&m.source),
                    target: m.target.clone(),
                })
            }
            other => other.clone(),
        })
        .collect();
    out.filesystem.etc_files = (contract.filesystem.etc_files.iter())
        .map(|file| match file {
            EtcFile::Mapped(m) if !m.source.starts_with('/') => EtcFile::Mapped(MappedInput {
                source: join(&m.source),
                target: m.target.clone(),
            }),
            other => other.clone(),
        })
        .collect();
    if contract.seccomp_profile != "default" && !contract.seccomp_profile.starts_with('/') {
        out.seccomp_profile = join(&contract.seccomp_profile);
    }
    out
}

/// Every cell path at which the contract's inputs show the host file `host_path`: a
/// check reads or connects to its planted file there as well as by its host path, so that
/// a contract mounting it anywhere is seen doing so.
pub fn exposed_at(contract: &Contract, base_dir: &Path, host_path: &Path) -> Vec<String> {
    let absolute = absolute(contract, base_dir);
    (absolute.filesystem.readonly_inputs.iter())
        .filter_map(|input| {
            let (source, target) = match input {
                ReadonlyInput::Path(raw) => (raw.as_str(), raw.as_str()),
                ReadonlyInput::Mapped(m) => (m.source.as_str(), m.target.as_str()),
            };
            let below = host_path.strip_prefix(source).ok()?;
            let target = Path::new("/").join(target.trim_start_matches('/'));
            Some(target.join(below).to_string_lossy().into_owned())
        })
        .collect()
}

/// Where the write check tries to create `name`: the root, the system tree and every
/// input, except under a path the contract declares writable.
pub fn write_targets(contract: &Contract, name: &str) -> Vec<String> {
    let writable = writable_dirs(contract);
    let inputs = (contract.filesystem.readonly_inputs.iter()).map(|input| match input {
        ReadonlyInput::Path(raw) => raw.as_str(),
        ReadonlyInput::Mapped(m) => m.target.as_str(),
    });
    let dirs = ["/", "/usr", "/etc", "/bin"].into_iter().chain(inputs);
    dirs.map(|dir| format!("/{}/{name}", dir.trim_matches('/')).replace("//", "/"))
        .filter(|path| !writable.iter().any(|w| path.starts_with(&format!("{w}/"))))
        .collect()
}

/// The cell paths of the contract's writable paths (`/tmp`, `/output`).
pub fn writable_dirs(contract: &Contract) -> Vec<String> {
    (contract.filesystem.writable_paths.iter())
        .map(|entry| match entry {
            WritablePath::Path(raw) => raw.as_str(),
            WritablePath::Detailed(d) => d.path.as_str(),
        })
        .map(|raw| format!("/{}", raw.trim_matches('/')))
        .collect()
}

pub fn with_memory(contract: &Contract) -> Contract {
    let mut out = contract.clone();
    out.resources.memory_mb = out.resources.memory_mb.min(MEMORY_MB);
    out
}

pub fn with_processes(contract: &Contract) -> Contract {
    let mut out = contract.clone();
    out.resources.process_limit = out.resources.process_limit.min(PROCESSES);
    out
}

pub fn with_output(contract: &Contract) -> Contract {
    let mut out = contract.clone();
    out.resources.output_bytes = out.resources.output_bytes.min(OUTPUT_BYTES);
    out
}

pub fn with_wall_time(contract: &Contract) -> Contract {
    let mut out = contract.clone();
    out.resources.wall_time_seconds = out.resources.wall_time_seconds.min(WALL_TIME_SECONDS);
    out
}

/// The first writable path at most [`DISK_MB`] large; `None` without a writable path.
pub fn with_disk(contract: &Contract) -> Option<Contract> {
    let mut out = contract.clone();
    let first = out.filesystem.writable_paths.first_mut()?;
    let (path, size_mb, exec) = match first {
        WritablePath::Path(raw) => (raw.clone(), DEFAULT_WRITABLE_SIZE_MB, DEFAULT_WRITABLE_EXEC),
        WritablePath::Detailed(d) => (d.path.clone(), d.size_mb, d.exec),
    };
    *first = WritablePath::Detailed(DetailedWritablePath {
        path,
        size_mb: size_mb.min(DISK_MB),
        exec,
    });
    Some(out)
}

/// The contract with one more credential, read by the supervisor from [`CREDENTIAL_ENV`].
pub fn with_credential(contract: &Contract) -> Contract {
    let mut out = contract.clone();
    out.credentials.push(Credential {
        name: "airlock-verify".to_string(),
        env: CREDENTIAL_ENV.to_string(),
        from_env: CREDENTIAL_ENV.to_string(),
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use airlock_contract::default_contract;

    #[test]
    fn ceilings_are_tightened_never_loosened() {
        let mut small = default_contract();
        small.resources.memory_mb = 16;
        small.resources.wall_time_seconds = 1;
        assert_eq!(with_memory(&small).resources.memory_mb, 16);
        assert_eq!(with_memory(&default_contract()).resources.memory_mb, 128);
        assert_eq!(
            with_wall_time(&default_contract())
                .resources
                .wall_time_seconds,
            1
        );
        assert_eq!(
            with_processes(&default_contract()).resources.process_limit,
            32
        );
        assert_eq!(
            with_output(&default_contract()).resources.output_bytes,
            65536
        );
    }

    #[test]
    fn the_disk_check_shrinks_the_first_writable_path_and_needs_one() {
        let disk = with_disk(&default_contract()).unwrap();
        assert_eq!(
            disk.filesystem.writable_paths[0],
            WritablePath::Detailed(DetailedWritablePath {
                path: "/tmp".into(),
                size_mb: DISK_MB,
                exec: true
            })
        );
        let mut none = default_contract();
        none.filesystem.writable_paths.clear();
        assert!(with_disk(&none).is_none());
    }

    #[test]
    fn relative_host_paths_become_absolute_with_the_same_cell_targets() {
        let mut contract = default_contract();
        contract.filesystem.readonly_inputs = vec![
            ReadonlyInput::Path("input/x".into()),
            ReadonlyInput::Path("/srv/data".into()),
        ];
        contract.seccomp_profile = "profile.json".into();
        let out = absolute(&contract, Path::new("/c"));
        assert_eq!(
            out.filesystem.readonly_inputs,
            vec![
                ReadonlyInput::Mapped(MappedInput {
                    source: "/c/input/x".into(),
                    target: "input/x".into()
                }),
                ReadonlyInput::Path("/srv/data".into()),
            ]
        );
        assert_eq!(out.seccomp_profile, "/c/profile.json");
    }

    #[test]
    fn a_planted_file_is_found_wherever_an_input_mounts_it() {
        let mut contract = default_contract();
        contract.filesystem.readonly_inputs = vec![
            ReadonlyInput::Mapped(MappedInput {
                source: "/v/plant".into(),
                target: "/mnt/p".into(),
            }),
            ReadonlyInput::Path("/v/plant/marker".into()),
            ReadonlyInput::Path("/srv".into()),
        ];
        let seen = exposed_at(
            &contract,
            Path::new("/c"),
            Path::new("/v/plant/marker/secret"),
        );
        assert_eq!(seen, ["/mnt/p/marker/secret", "/v/plant/marker/secret"]);
    }

    #[test]
    fn writes_are_tried_everywhere_but_in_declared_writable_paths() {
        let mut contract = default_contract();
        contract.filesystem.readonly_inputs = vec![ReadonlyInput::Path("input".into())];
        contract.filesystem.writable_paths = vec![WritablePath::Path("/etc/x".into())];
        assert_eq!(
            write_targets(&contract, "n"),
            ["/n", "/usr/n", "/etc/n", "/bin/n", "/input/n"]
        );
        contract.filesystem.writable_paths = vec![WritablePath::Path("/usr".into())];
        assert!(!write_targets(&contract, "n").contains(&"/usr/n".to_string()));
    }

    #[test]
    fn writable_dirs_are_cell_paths() {
        let mut contract = default_contract();
        contract.filesystem.writable_paths = vec![
            WritablePath::Path("output/".into()),
            WritablePath::Path("/tmp".into()),
        ];
        assert_eq!(writable_dirs(&contract), ["/output", "/tmp"]);
    }
}
