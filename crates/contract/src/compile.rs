//! Contract -> [`CellPlan`]: a pure function (no file system, no environment, no clock), so
//! the same contract and input always give the same plan, and every decision is unit-testable.

use crate::contract::{Contract, NetworkMode, HOST_IMAGE};
use crate::error::{ContractError, FieldError};
use crate::layout::CellLayout;
use crate::plan::*;
use crate::seccomp;
use crate::validate::{check, CheckedContract};
use sha2::{Digest, Sha256};
use std::borrow::Cow;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// What the caller adds to a contract to make a runnable plan.
#[derive(Debug, Clone, Copy)]
pub struct CompileInput<'a> {
    /// Absolute directory relative host paths of the contract (inputs, seccomp profile) are
    /// resolved against; normally the contract file's directory.
    pub base_dir: &'a Path,
    pub argv: &'a [String],
    /// The text of the contract's custom seccomp profile ([`crate::read_seccomp_profile`]
    /// reads it where the contract is loaded); compile parses and checks it. Required
    /// when the contract names a profile, ignored when it does not.
    pub seccomp_profile: Option<&'a str>,
    /// The contract's OCI image, resolved through the image store by the caller (required
    /// when `image` is not `host`, ignored when it is). With one, `argv` may be empty: the
    /// image's `Entrypoint` + `Cmd` run.
    pub image: Option<&'a ResolvedImage>,
    /// What the runtime was given of a Kubernetes pod (airlock's OCI runtime: the
    /// bundle's namespace paths and CRI's files). Required by `network.mode: pod`,
    /// refused with any other mode: only the contract decides that a cell joins a pod.
    pub pod_network: Option<PodInput<'a>>,
}

/// A pod's namespaces and files, as airlock's OCI runtime checked them in the bundle
/// (crates/oci/src/bundle.rs).
#[derive(Debug, Clone, Copy)]
pub struct PodInput<'a> {
    /// The pod's network namespace (`linux.namespaces[network].path`).
    pub network: &'a Path,
    /// The pod's ipc and uts namespaces (an application container's: CRI names the
    /// sandbox's); `None`: the cell's own.
    pub ipc: Option<&'a Path>,
    pub uts: Option<&'a Path>,
    /// The pod's own `/etc` files (CRI's `hosts`, `hostname`, `resolv.conf`):
    /// `(host source, name under /etc)`. Each replaces the generated file of that name,
    /// read-only like every `/etc` entry.
    pub etc_files: &'a [(PathBuf, String)],
}

impl<'a> PodInput<'a> {
    /// A pod's network namespace alone.
    pub fn network(network: &'a Path) -> PodInput<'a> {
        PodInput {
            network,
            ipc: None,
            uts: None,
            etc_files: &[],
        }
    }
}

impl<'a> CompileInput<'a> {
    /// `argv` against `base_dir` for a contract with neither a custom seccomp profile nor
    /// an OCI image (the fields callers with one set on the result).
    pub fn new(base_dir: &'a Path, argv: &'a [String]) -> CompileInput<'a> {
        CompileInput {
            base_dir,
            argv,
            seccomp_profile: None,
            image: None,
            pod_network: None,
        }
    }
}

const MIB: u64 = 1 << 20;
const ROOTFS_SIZE_BYTES: u64 = MIB;
const BASE_PATH: &str = "/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin";
const NO_PROXY: &str = "localhost,127.0.0.1,::1";
/// `TERM` of a payload with a terminal, unless the contract's `env` sets one.
const DEFAULT_TERM: &str = "xterm-256color";

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
    let image = root_image(contract, input)?;
    let argv = match (input.argv.is_empty(), image) {
        (true, Some(image)) => image.defaults.command.clone(),
        _ => input.argv.to_vec(),
    };
    check_input(input, &argv)?;

    let mut plan = CellPlan {
        contract_sha256: contract_sha256(contract),
        argv,
        identity: identity(contract, image),
        hostname: contract.hostname.clone(),
        workdir: workdir(contract, &checked, image),
        env: environment(contract, &checked, image),
        rootfs: RootfsPlan {
            image: image.map_or(RootImage::Host, |image| RootImage::Oci {
                reference: image.reference.clone(),
                digest: image.digest.clone(),
                layers: image.layers.clone(),
            }),
            readonly: contract.filesystem.readonly_root,
            size_bytes: ROOTFS_SIZE_BYTES,
        },
        mounts: mounts(&checked, input.base_dir, image),
        etc: match image {
            None => {
                crate::etc::etc_plan(&checked.etc_files, |path| host_path(input.base_dir, path))
            }
            Some(image) => crate::etc::image_etc_plan(&checked.etc_files, &image.etc, |path| {
                host_path(input.base_dir, path)
            }),
        }
        .into_iter()
        .chain(pod_etc_files(input))
        .collect(),
        network: network_plan(contract.network.mode, &checked.destinations, input)?,
        limits: limits(contract),
        seccomp: seccomp_plan(&checked, input)?,
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
        credentials_lifted: Vec::new(),
        secrets: contract
            .secrets
            .iter()
            .map(|secret| SecretPlan {
                name: secret.name.clone(),
                env: secret.env.clone(),
                deliver: secret.deliver,
            })
            .collect(),
        http_rules: contract
            .network
            .http_rules
            .iter()
            .map(|rule| HttpRulePlan {
                host: rule.host.to_ascii_lowercase(),
                methods: rule.methods.clone(),
                path_prefixes: rule.path_prefixes.clone(),
            })
            .collect(),
        terminal: contract.terminal,
        broker: (!contract.broker_actions.is_empty()).then(|| BrokerPlan {
            actions: contract.broker_actions.clone(),
            class: None,
        }),
        isolation: contract.isolation,
        layout: CellLayout::default(),
        without_cgroup: None,
    };
    plan.layout = crate::layout::cell_layout(&plan);
    Ok(plan)
}

/// sha256 (hex) of the contract's canonical JSON: field order is the struct's, maps are
/// sorted and defaults are filled in, so equivalent documents in any format hash the same.
pub fn contract_sha256(contract: &Contract) -> String {
    let canonical = serde_json::to_vec(contract).expect("a Contract always serialises to JSON");
    hex::encode(Sha256::digest(canonical))
}

/// The host path of the contract's custom seccomp profile, if it names a valid one.
pub(crate) fn seccomp_profile_path(contract: &Contract, base_dir: &Path) -> Option<PathBuf> {
    let mut ignored = crate::validate::Errors::default();
    crate::validate::check_seccomp_profile(&contract.seccomp_profile, &mut ignored)
        .map(|profile| host_path(base_dir, &profile.host_path()))
}

/// The filter the cell installs. The default program is the one compiled at build time;
/// a custom profile is parsed, hardened and compiled here, so a profile airlock cannot
/// turn into a filter refuses the run before anything is cloned.
fn seccomp_plan(
    checked: &CheckedContract,
    input: &CompileInput,
) -> Result<SeccompPlan, ContractError> {
    let Some(profile) = &checked.seccomp_profile else {
        return Ok(SeccompPlan {
            profile: SeccompProfile::Default,
            filter: FilterIdentity {
                sha256: seccomp::program_sha256(seccomp::DEFAULT_FILTER),
                instructions: seccomp::DEFAULT_FILTER.len(),
                summary: seccomp::default_summary(),
            },
            program: Cow::Borrowed(seccomp::DEFAULT_FILTER),
            custom_policy: None,
        });
    };
    let path = host_path(input.base_dir, &profile.host_path());
    // Unsupported (sandbox_unavailable): the contract asks for a filter this runtime
    // cannot build, and nothing weaker runs in its place.
    let refused = |message: String| ContractError::Unsupported {
        path: "seccomp_profile".to_owned(),
        message: format!("profile {}: {message}", path.display()),
    };
    let text = input.seccomp_profile.ok_or_else(|| {
        refused("its text was not read (CompileInput::seccomp_profile)".to_owned())
    })?;
    let policy = seccomp::policy_from_docker_json(text).map_err(refused)?;
    let program = seccomp::compile(&policy).map_err(refused)?;
    Ok(SeccompPlan {
        filter: FilterIdentity {
            sha256: seccomp::program_sha256(&program),
            instructions: program.len(),
            summary: seccomp::summary(&policy),
        },
        profile: SeccompProfile::DockerJson { path },
        program: Cow::Owned(program),
        custom_policy: Some(policy),
    })
}

/// The pod's own `/etc` files (a pod's `hosts`, `hostname`, `resolv.conf`): read-only
/// entries of the cell's `/etc` that replace the generated ones (layout.rs).
fn pod_etc_files(input: &CompileInput) -> Vec<EtcEntry> {
    let files = input.pod_network.map_or(&[][..], |pod| pod.etc_files);
    files
        .iter()
        .map(|(source, name)| EtcEntry::Pod {
            source: source.clone(),
            target: Path::new("/etc").join(name),
        })
        .collect()
}

/// The cell's network. A pod network is joined only when the contract says so
/// (`network.mode: pod`, the platform's decision) and the runtime names one; any other
/// pairing is refused (policy_denied: a container asks for what its contract does not
/// allow, or a pod contract is run where there is no pod).
fn network_plan(
    mode: NetworkMode,
    destinations: &[DestinationRule],
    input: &CompileInput,
) -> Result<NetworkPlan, ContractError> {
    let refused = |message: String| Err(ContractError::invalid("network.mode", message));
    match (mode, input.pod_network.map(|pod| pod.network)) {
        (NetworkMode::Deny, None) => Ok(NetworkPlan::Deny),
        (NetworkMode::Allowlist, None) => Ok(NetworkPlan::Allowlist {
            destinations: destinations.to_vec(),
        }),
        (NetworkMode::Pod, Some(namespace)) if namespace.is_absolute() => {
            let pod = input.pod_network.as_ref();
            let joined = |path: Option<&Path>| match path {
                Some(path) if !path.is_absolute() => Err(ContractError::invalid(
                    "network.mode",
                    format!(
                        "the pod namespace {} is not an absolute path",
                        path.display()
                    ),
                )),
                path => Ok(path.map(Path::to_path_buf)),
            };
            Ok(NetworkPlan::Pod {
                namespace: namespace.to_path_buf(),
                ipc: joined(pod.and_then(|p| p.ipc))?,
                uts: joined(pod.and_then(|p| p.uts))?,
            })
        }
        (NetworkMode::Pod, Some(namespace)) => refused(format!(
            "the pod network namespace {} is not an absolute path",
            namespace.display()
        )),
        (NetworkMode::Pod, None) => refused(
            "pod joins the network namespace of a Kubernetes pod, and none was given: \
             only airlock's OCI runtime runs such a contract, for a container whose \
             config.json names one (linux.namespaces[network].path)"
                .to_owned(),
        ),
        (mode @ (NetworkMode::Deny | NetworkMode::Allowlist), Some(namespace)) => refused(format!(
            "{} does not allow joining the pod network namespace {}: a cell joins \
                 one only under a contract with network.mode pod (the platform's choice, \
                 not the pod's)",
            mode_name(mode),
            namespace.display()
        )),
    }
}

fn mode_name(mode: NetworkMode) -> &'static str {
    match mode {
        NetworkMode::Deny => "deny",
        NetworkMode::Allowlist => "allowlist",
        NetworkMode::Pod => "pod",
    }
}

/// The contract's image: `None` for `host`, else the one the caller resolved.
fn root_image<'a>(
    contract: &Contract,
    input: &CompileInput<'a>,
) -> Result<Option<&'a ResolvedImage>, ContractError> {
    if contract.image == HOST_IMAGE {
        return Ok(None);
    }
    // sandbox_unavailable like every root this runtime cannot build as asked.
    input
        .image
        .map(Some)
        .ok_or_else(|| ContractError::Unsupported {
            path: "image".to_owned(),
            message: format!(
                "{}: an OCI image must be resolved through the image store before compile \
             (CompileInput::image)",
                contract.image
            ),
        })
}

/// The contract's identity, or the image's `User` when the contract leaves the default
/// and the image names a user other than root: root in the image is never honoured (the
/// cell runs as the contract's unprivileged identity instead).
fn identity(contract: &Contract, image: Option<&ResolvedImage>) -> CellIdentity {
    let own = CellIdentity {
        uid: narrow(contract.identity.uid),
        gid: narrow(contract.identity.gid),
    };
    match image.and_then(|i| i.defaults.user) {
        Some(user)
            if contract.identity == crate::contract::Identity::default()
                && user.uid != 0
                && user.gid != 0 =>
        {
            user
        }
        _ => own,
    }
}

/// The contract's `workdir`, else the image's `WorkingDir`, else the default.
fn workdir(
    contract: &Contract,
    checked: &CheckedContract,
    image: Option<&ResolvedImage>,
) -> PathBuf {
    match (
        &contract.workdir,
        image.and_then(|i| i.defaults.working_dir.as_ref()),
    ) {
        (None, Some(dir)) if dir.is_absolute() => dir.clone(),
        _ => PathBuf::from(&checked.workdir),
    }
}

fn check_input(input: &CompileInput, argv: &[String]) -> Result<(), ContractError> {
    let mut errors = Vec::new();
    if argv.is_empty() || argv[0].is_empty() {
        let why = if input.image.is_some() {
            "must name a command (the image has no Entrypoint or Cmd)"
        } else {
            "must name a command"
        };
        errors.push(FieldError::new("argv", why));
    }
    for (index, argument) in argv.iter().enumerate() {
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

/// The image's top-level entries that make up its system tree: all but the ones the
/// runtime provides (`/etc`, `/proc`, `/dev`, `/sys`) and those a contract mount lies in
/// (its own tmpfs or input replaces the image's directory there).
fn image_system(checked: &CheckedContract, image: &ResolvedImage) -> Vec<MountPlan> {
    let taken: Vec<String> = checked
        .inputs
        .iter()
        .map(|i| i.target.cell_path())
        .chain(checked.writable.iter().map(|w| w.target.cell_path()))
        .filter_map(|path| {
            path.trim_start_matches('/')
                .split('/')
                .next()
                .map(str::to_owned)
        })
        .collect();
    image
        .top_level
        .iter()
        .filter(|(name, _)| !["etc", "proc", "dev", "sys"].contains(&name.as_str()))
        .filter(|(name, _)| !taken.contains(name))
        .map(|(name, link)| MountPlan::ImageSystem {
            path: Path::new("/").join(name),
            link: link.clone(),
        })
        .collect()
}

fn mounts(
    checked: &CheckedContract,
    base_dir: &Path,
    image: Option<&ResolvedImage>,
) -> Vec<MountPlan> {
    let system: Vec<MountPlan> = match image {
        Some(image) => image_system(checked, image),
        None => HOST_SYSTEM_DIRS
            .iter()
            .map(|&(path, optional)| MountPlan::HostSystem {
                path: PathBuf::from(path),
                optional,
            })
            .collect(),
    };
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
            exec: writable.exec,
        });
    system.into_iter().chain(inputs).chain(writable).collect()
}

fn environment(
    contract: &Contract,
    checked: &CheckedContract,
    image: Option<&ResolvedImage>,
) -> Vec<EnvVar> {
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
    if contract.terminal {
        // Without TERM, readline and curses programs fall back to a dumb terminal. A fixed
        // value keeps the plan independent of the caller's environment; the contract's
        // `env` may name another.
        set("TERM", DEFAULT_TERM, false);
    }
    // The image's `Env` under the contract's: the contract wins, and the proxy variables
    // stay airlock's.
    for (name, value) in image.map(|i| i.defaults.env.as_slice()).unwrap_or_default() {
        let reserved = crate::validate::RESERVED_ENV_NAMES
            .iter()
            .any(|r| r.eq_ignore_ascii_case(name));
        if !reserved {
            set(name, value, false);
        }
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
    if !contract.broker_actions.is_empty() {
        // Last: the contract's `env` cannot point the payload at another socket.
        set(crate::plan::BROKER_ENV, crate::plan::BROKER_SOCKET, false);
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
        shm_bytes: widen(resources.shm_mb) * MIB,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{default_contract, parse_contract, ContractFormat};

    fn argv(words: &[&str]) -> Vec<String> {
        words.iter().map(|w| w.to_string()).collect()
    }

    fn compile_yaml(yaml: &str) -> Result<CellPlan, ContractError> {
        let contract = parse_contract(yaml, ContractFormat::Yaml)?;
        compile(
            &contract,
            &CompileInput {
                base_dir: Path::new("/jobs/42"),
                argv: &argv(&["sh", "-c", "true"]),
                seccomp_profile: Some(STRICT_PROFILE),
                image: None,
                pod_network: None,
            },
        )
    }

    const STRICT_PROFILE: &str = r#"{"defaultAction": "SCMP_ACT_ERRNO", "syscalls": [
        {"names": ["read", "write", "exit_group"], "action": "SCMP_ACT_ALLOW"}]}"#;

    fn env_value<'p>(plan: &'p CellPlan, name: &str) -> Option<&'p str> {
        plan.env
            .iter()
            .find(|var| var.name == name)
            .map(|var| var.value.as_str())
    }

    const DOCUMENT_TOOLS: &str = "
image: host
filesystem:
  readonly_inputs:
    - input/report.docx
    - { source: /srv/fonts, target: fonts }
  writable_paths:
    - output/
    - { path: tmp, size_mb: 32 }
  output_allowlist:
    - output/report.pdf
    - output/*.log
resources:
  cpu_millis: 1500
  memory_mb: 768
  process_limit: 64
  wall_time_seconds: 90
  output_bytes: 5242880
";

    #[test]
    fn an_oci_image_the_caller_did_not_resolve_is_refused() {
        let seed = parse_contract(crate::parse::tests::SEED_YAML, ContractFormat::Yaml).unwrap();
        let error = compile(
            &seed,
            &CompileInput::new(Path::new("/jobs"), &argv(&["true"])),
        )
        .unwrap_err();
        assert_eq!(error.class(), "sandbox_unavailable");
        assert!(error.to_string().starts_with("image: "), "{error}");
        assert!(error.to_string().contains("CompileInput::image"), "{error}");
    }

    fn resolved_image() -> ResolvedImage {
        let entry = |name: &str, link: Option<&str>| (name.to_owned(), link.map(PathBuf::from));
        ResolvedImage {
            reference: format!("r/tool@sha256:{}", "a".repeat(64)),
            digest: format!("sha256:{}", "a".repeat(64)),
            layers: vec!["/state/l2".into(), "/state/l1".into()],
            top_level: vec![
                entry("app", None),
                entry("bin", Some("usr/bin")),
                entry("etc", None),
                entry("proc", None),
                entry("tmp", None),
                entry("usr", None),
            ],
            etc: vec![
                entry("passwd", None),
                entry("shadow", None),
                entry("ssl", None),
            ],
            defaults: ImageDefaults {
                user: Some(CellIdentity {
                    uid: 1000,
                    gid: 1000,
                }),
                env: vec![
                    ("PATH".into(), "/opt/bin".into()),
                    ("LANG".into(), "C".into()),
                ],
                working_dir: Some("/app".into()),
                command: argv(&["python3", "/app/tool.py"]),
            },
        }
    }

    #[test]
    fn an_image_gives_the_system_tree_its_etc_and_its_defaults_under_the_contract() {
        let contract = parse_contract(
            "image: r/tool@sha256:aa\nenv: { LANG: C.UTF-8 }\nfilesystem: { writable_paths: [/tmp] }\n",
            ContractFormat::Yaml,
        )
        .unwrap();
        let image = resolved_image();
        let plan = compile(
            &contract,
            &CompileInput {
                base_dir: Path::new("/jobs"),
                argv: &[],
                seccomp_profile: None,
                image: Some(&image),
                pod_network: None,
            },
        )
        .unwrap();
        assert_eq!(plan.argv, argv(&["python3", "/app/tool.py"]));
        assert_eq!(
            plan.identity,
            CellIdentity {
                uid: 1000,
                gid: 1000
            }
        );
        assert_eq!(plan.workdir, Path::new("/app"));
        let env = |name: &str| {
            plan.env
                .iter()
                .find(|e| e.name == name)
                .map(|e| e.value.clone())
        };
        assert_eq!(env("PATH").as_deref(), Some("/opt/bin"));
        assert_eq!(env("LANG").as_deref(), Some("C.UTF-8"));
        let system: Vec<&Path> = plan
            .mounts
            .iter()
            .filter_map(|m| match m {
                MountPlan::ImageSystem { path, .. } => Some(path.as_path()),
                _ => None,
            })
            .collect();
        // /etc and /proc are the runtime's, /tmp the contract's writable path.
        assert_eq!(
            system,
            [Path::new("/app"), Path::new("/bin"), Path::new("/usr")]
        );
        assert!(!plan
            .mounts
            .iter()
            .any(|m| matches!(m, MountPlan::HostSystem { .. })));
        let etc: Vec<&EtcEntry> = plan.etc.iter().collect();
        assert_eq!(
            etc,
            [
                &EtcEntry::Image {
                    path: "/etc/shadow".into(),
                    link: None
                },
                &EtcEntry::Image {
                    path: "/etc/ssl".into(),
                    link: None
                },
            ]
        );
        assert!(matches!(&plan.rootfs.image, RootImage::Oci { layers, .. } if layers.len() == 2));
    }

    #[test]
    fn the_contracts_identity_wins_and_image_root_is_never_honoured() {
        let mut image = resolved_image();
        let compile_with = |yaml: &str, image: &ResolvedImage| {
            let contract = parse_contract(yaml, ContractFormat::Yaml).unwrap();
            compile(
                &contract,
                &CompileInput {
                    base_dir: Path::new("/jobs"),
                    argv: &argv(&["true"]),
                    seccomp_profile: None,
                    image: Some(image),
                    pod_network: None,
                },
            )
            .unwrap()
        };
        let own = compile_with(
            "image: r/x@sha256:aa\nidentity: { uid: 2000, gid: 2000 }\n",
            &image,
        );
        assert_eq!(
            own.identity,
            CellIdentity {
                uid: 2000,
                gid: 2000
            }
        );
        assert_eq!(own.argv, argv(&["true"]));
        image.defaults.user = Some(CellIdentity { uid: 0, gid: 0 });
        let root = compile_with("image: r/x@sha256:aa\n", &image);
        assert_ne!(root.identity.uid, 0);
    }

    #[test]
    fn mounts_are_system_then_inputs_then_writable() {
        let plan = compile_yaml(DOCUMENT_TOOLS).unwrap();
        let expected_system = [
            "/usr", "/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32",
        ];
        for (mount, path) in plan.mounts.iter().zip(expected_system) {
            assert_eq!(
                *mount,
                MountPlan::HostSystem {
                    path: path.into(),
                    optional: path != "/usr"
                }
            );
        }
        assert_eq!(
            plan.mounts[7..],
            [
                MountPlan::ReadonlyInput {
                    source: "/jobs/42/input/report.docx".into(),
                    target: "/input/report.docx".into()
                },
                MountPlan::ReadonlyInput {
                    source: "/srv/fonts".into(),
                    target: "/fonts".into()
                },
                MountPlan::WritableTmpfs {
                    target: "/output".into(),
                    size_bytes: 16 << 20,
                    exec: true
                },
                MountPlan::WritableTmpfs {
                    target: "/tmp".into(),
                    size_bytes: 32 << 20,
                    exec: true
                },
            ]
        );
        assert_eq!(
            plan.rootfs,
            RootfsPlan {
                image: RootImage::Host,
                readonly: true,
                size_bytes: 1 << 20
            }
        );
        assert_eq!(
            plan.output_allowlist,
            ["/output/report.pdf", "/output/*.log"]
        );
    }

    #[test]
    fn writable_paths_are_executable_unless_the_contract_says_exec_false() {
        let plan = compile_yaml(
            "filesystem:\n  writable_paths:\n    - work\n    - { path: data, exec: false }\n    - { path: build, size_mb: 64, exec: true }\n",
        )
        .unwrap();
        let writable: Vec<(&str, bool)> = plan
            .mounts
            .iter()
            .filter_map(|mount| match mount {
                MountPlan::WritableTmpfs { target, exec, .. } => {
                    Some((target.to_str().unwrap(), *exec))
                }
                _ => None,
            })
            .collect();
        assert_eq!(
            writable,
            [("/work", true), ("/data", false), ("/build", true)]
        );
    }

    #[test]
    fn the_exec_choice_is_part_of_the_contract_hash() {
        let with = compile_yaml("filesystem:\n  writable_paths: [{ path: tmp, exec: true }]\n");
        let without = compile_yaml("filesystem:\n  writable_paths: [{ path: tmp, exec: false }]\n");
        assert_ne!(
            with.unwrap().contract_sha256,
            without.unwrap().contract_sha256
        );
    }

    #[test]
    fn limits_are_converted_to_runtime_units() {
        let plan = compile_yaml(DOCUMENT_TOOLS).unwrap();
        assert_eq!(
            plan.limits,
            Limits {
                cpu_millis: 1500,
                memory_bytes: 768 << 20,
                process_limit: 64,
                wall_time_ms: 90_000,
                output_bytes: 5_242_880,
                open_files: 256,
                file_size_bytes: 64 << 20,
                shm_bytes: 64 << 20,
            }
        );
    }

    #[test]
    fn default_contract_gives_a_minimal_deny_all_plan() {
        let plan = compile(
            &default_contract(),
            &CompileInput::new(Path::new("/"), &argv(&["/bin/true"])),
        )
        .unwrap();
        assert_eq!(
            plan.identity,
            CellIdentity {
                uid: 10001,
                gid: 10001
            }
        );
        assert_eq!(plan.hostname, "airlock");
        assert_eq!(plan.workdir, Path::new("/tmp"));
        assert_eq!(plan.network, NetworkPlan::Deny);
        assert_eq!(plan.seccomp.profile, SeccompProfile::Default);
        assert!(plan.credentials.is_empty());
        let names: Vec<&str> = plan.env.iter().map(|v| v.name.as_str()).collect();
        assert_eq!(names, ["HOME", "LANG", "PATH", "TMPDIR"]);
        assert_eq!(env_value(&plan, "HOME"), Some("/tmp"));
        assert_eq!(env_value(&plan, "PATH"), Some(BASE_PATH));
    }

    #[test]
    fn broker_actions_give_the_plan_a_broker_and_the_cell_its_socket_variable() {
        let plain = compile_yaml("{}\n").unwrap();
        assert!(plain.broker.is_none());
        assert!(!plain.env.iter().any(|v| v.name == BROKER_ENV));
        let brokered = compile_yaml(
            "broker_actions: [store_case_document]\nenv: { AIRLOCK_BROKER: /tmp/fake.sock }\n",
        )
        .unwrap();
        let broker = brokered.broker.as_ref().unwrap();
        assert_eq!(broker.actions, ["store_case_document"]);
        assert_eq!(broker.class, None, "only the trusted side sets the class");
        let var = brokered.env.iter().find(|v| v.name == BROKER_ENV).unwrap();
        assert_eq!(var.value, BROKER_SOCKET, "the contract cannot redirect it");
    }

    #[test]
    fn the_isolation_tier_is_native_by_default_carried_into_the_plan_and_out_of_older_hashes() {
        let native = compile_yaml("{}\n").unwrap();
        assert_eq!(native.isolation, crate::Isolation::Native);
        assert_eq!(
            native.contract_sha256,
            compile_yaml("isolation: native\n").unwrap().contract_sha256
        );
        let gvisor = compile_yaml("isolation: gvisor\n").unwrap();
        assert_eq!(gvisor.isolation, crate::Isolation::Gvisor);
        assert_ne!(gvisor.contract_sha256, native.contract_sha256);
    }

    #[test]
    fn what_the_gvisor_tier_cannot_enforce_is_a_field_error_not_a_weaker_run() {
        for (yaml, field) in [
            (
                "terminal: true\nnetwork: { mode: allowlist, allowed_domains: [a.test] }\n",
                "terminal",
            ),
            ("terminal: true\nbroker_actions: [x]\n", "terminal"),
        ] {
            let err = compile_yaml(&format!("isolation: gvisor\n{yaml}")).unwrap_err();
            assert!(
                err.to_string().contains(field) && err.to_string().contains("gvisor"),
                "{yaml}: {err}"
            );
            // The same contract on the native tier is valid.
            compile_yaml(yaml).unwrap();
        }
    }

    #[test]
    fn secrets_and_broker_actions_compile_for_the_gvisor_tier_as_natively() {
        let yaml = "network: { mode: allowlist, allowed_domains: [a.test] }\n\
                    secrets: [{ name: api, env: API_TOKEN }]\n\
                    broker_actions: [x]\n";
        let native = compile_yaml(yaml).unwrap();
        let gvisor = compile_yaml(&format!("isolation: gvisor\n{yaml}")).unwrap();
        assert_eq!(gvisor.isolation, crate::Isolation::Gvisor);
        assert_eq!(gvisor.secrets, native.secrets);
        assert_eq!(gvisor.broker, native.broker);
        assert_eq!(
            gvisor.env, native.env,
            "the same AIRLOCK_BROKER and proxy variables"
        );
    }

    #[test]
    fn an_allowlist_compiles_for_the_gvisor_tier() {
        let plan = compile_yaml(
            "isolation: gvisor\nnetwork: { mode: allowlist, allowed_domains: [a.test] }\n",
        )
        .unwrap();
        assert!(matches!(plan.network, NetworkPlan::Allowlist { .. }));
        assert_eq!(
            env_value(&plan, "HTTP_PROXY"),
            Some("http://127.0.0.1:3128")
        );
    }

    #[test]
    fn a_terminal_is_off_by_default_and_carried_into_the_plan_with_a_term() {
        let plain = compile_yaml("{}\n").unwrap();
        assert!(!plain.terminal);
        assert_eq!(env_value(&plain, "TERM"), None);
        let tty = compile_yaml("terminal: true\n").unwrap();
        assert!(tty.terminal);
        assert_eq!(env_value(&tty, "TERM"), Some(DEFAULT_TERM));
        let own = compile_yaml("terminal: true\nenv: { TERM: vt100 }\n").unwrap();
        assert_eq!(env_value(&own, "TERM"), Some("vt100"));
    }

    #[test]
    fn an_absent_terminal_leaves_the_contract_hash_of_older_contracts_alone() {
        let canonical = serde_json::to_string(&default_contract()).unwrap();
        assert!(!canonical.contains("terminal"), "{canonical}");
        let on = compile_yaml("terminal: true\n").unwrap();
        let off = compile_yaml("terminal: false\n").unwrap();
        assert_ne!(on.contract_sha256, off.contract_sha256);
        assert_eq!(
            off.contract_sha256,
            compile_yaml("{}\n").unwrap().contract_sha256
        );
    }

    #[test]
    fn without_a_writable_tmp_the_workdir_is_root_and_tmpdir_unset() {
        let plan = compile_yaml("filesystem:\n  writable_paths: [output]\n").unwrap();
        assert_eq!(plan.workdir, Path::new("/"));
        assert_eq!(env_value(&plan, "HOME"), Some("/"));
        assert_eq!(env_value(&plan, "TMPDIR"), None);
    }

    #[test]
    fn contract_env_overrides_the_base_and_keeps_secrets_marked() {
        let plan = compile_yaml(
            "workdir: /tmp/work\nenv:\n  LANG: en_US.UTF-8\n  API_TOKEN: { value: s3cret, secret: true }\n",
        )
        .unwrap();
        assert_eq!(env_value(&plan, "LANG"), Some("en_US.UTF-8"));
        assert_eq!(env_value(&plan, "HOME"), Some("/tmp/work"));
        let token = plan.env.iter().find(|v| v.name == "API_TOKEN").unwrap();
        assert!(token.secret);
        assert!(plan.env.windows(2).all(|pair| pair[0].name < pair[1].name));
    }

    #[test]
    fn allowlist_sets_destinations_and_proxy_variables() {
        let plan = compile_yaml(
            "network:\n  mode: allowlist\n  allowed_domains: [API.test, '*.pkg.test:8443']\n",
        )
        .unwrap();
        assert_eq!(
            plan.network,
            NetworkPlan::Allowlist {
                destinations: vec![
                    DestinationRule {
                        host_pattern: "api.test".into(),
                        ports: vec![443, 80]
                    },
                    DestinationRule {
                        host_pattern: "*.pkg.test".into(),
                        ports: vec![8443]
                    },
                ]
            }
        );
        for name in ["HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy"] {
            assert_eq!(
                env_value(&plan, name),
                Some("http://127.0.0.1:3128"),
                "{name}"
            );
        }
        for name in ["ALL_PROXY", "all_proxy"] {
            assert_eq!(env_value(&plan, name), Some("socks5h://127.0.0.1:1080"));
        }
        for name in ["NO_PROXY", "no_proxy"] {
            assert_eq!(env_value(&plan, name), Some("localhost,127.0.0.1,::1"));
        }
    }

    #[test]
    fn deny_mode_sets_no_proxy_variables() {
        let plan = compile_yaml("network: { mode: deny }\n").unwrap();
        assert!(plan
            .env
            .iter()
            .all(|v| !v.name.to_ascii_lowercase().contains("proxy")));
    }

    #[test]
    fn seccomp_profile_and_credentials_are_carried_over() {
        let plan = compile_yaml(
            "seccomp_profile: profiles/strict.json\ncredentials:\n  - { name: store, env: STORE_TOKEN, from_env: AIRLOCK_STORE_TOKEN }\n",
        )
        .unwrap();
        assert_eq!(
            plan.seccomp.profile,
            SeccompProfile::DockerJson {
                path: "/jobs/42/profiles/strict.json".into()
            }
        );
        assert_eq!(
            plan.credentials,
            [CredentialPlan {
                name: "store".into(),
                env: "STORE_TOKEN".into(),
                from_env: "AIRLOCK_STORE_TOKEN".into()
            }]
        );
        assert!(plan.env.iter().all(|v| v.name != "STORE_TOKEN"));
    }

    #[test]
    fn compile_is_deterministic_and_hashes_the_contract_not_the_format() {
        let first = compile_yaml(DOCUMENT_TOOLS).unwrap();
        assert_eq!(compile_yaml(DOCUMENT_TOOLS).unwrap(), first);
        assert_eq!(first.contract_sha256.len(), 64);

        let contract = parse_contract(DOCUMENT_TOOLS, ContractFormat::Yaml).unwrap();
        let as_json = serde_json::to_string_pretty(&contract).unwrap();
        let reparsed = parse_contract(&as_json, ContractFormat::Json).unwrap();
        assert_eq!(contract_sha256(&reparsed), first.contract_sha256);

        let other = compile_yaml(&DOCUMENT_TOOLS.replace("768", "769")).unwrap();
        assert_ne!(other.contract_sha256, first.contract_sha256);
    }

    #[test]
    fn argv_and_base_dir_are_checked() {
        let contract = default_contract();
        let refused = |argv: &[String], base_dir: &str| {
            compile(
                &contract,
                &CompileInput {
                    base_dir: Path::new(base_dir),
                    argv,
                    seccomp_profile: None,
                    image: None,
                    pod_network: None,
                },
            )
            .unwrap_err()
            .to_string()
        };
        assert_eq!(refused(&[], "/"), "argv: must name a command");
        assert_eq!(refused(&argv(&[""]), "/"), "argv: must name a command");
        assert_eq!(
            refused(&argv(&["echo", "a\0b"]), "/"),
            "argv[1]: must not contain NUL"
        );
        assert_eq!(
            refused(&argv(&["true"]), "jobs"),
            "base_dir: must be an absolute path"
        );
    }

    #[test]
    fn an_invalid_contract_built_in_code_is_refused_by_compile() {
        let mut contract = default_contract();
        contract.identity.uid = 0;
        contract.resources.memory_mb = -1;
        let error = compile(
            &contract,
            &CompileInput::new(Path::new("/"), &argv(&["true"])),
        )
        .unwrap_err();
        assert_eq!(error.class(), "policy_denied");
        assert_eq!(
            error.to_string(),
            "identity.uid: must not be 0: the cell identity is never root\n\
             resources.memory_mb: must be at least 4"
        );
    }

    fn compile_with_profile(text: Option<&str>) -> Result<CellPlan, ContractError> {
        let contract = parse_contract("seccomp_profile: p.json\n", ContractFormat::Yaml)?;
        compile(
            &contract,
            &CompileInput {
                base_dir: Path::new("/jobs"),
                argv: &argv(&["true"]),
                seccomp_profile: text,
                image: None,
                pod_network: None,
            },
        )
    }

    #[test]
    fn the_default_filter_is_the_prebuilt_program_with_its_identity() {
        let plan = compile_yaml("{}\n").unwrap();
        let seccomp = &plan.seccomp;
        assert_eq!(seccomp.program, seccomp::DEFAULT_FILTER);
        assert_eq!(
            seccomp.filter.sha256,
            seccomp::program_sha256(&seccomp.program)
        );
        assert_eq!(seccomp.filter.instructions, seccomp.program.len());
        assert_eq!(
            seccomp.filter.summary.default_action,
            seccomp::SeccompAction::Errno(1)
        );
        assert!(seccomp.filter.summary.allowed_syscalls > 250);
        let json = serde_json::to_value(&plan).unwrap();
        assert_eq!(json["seccomp"]["profile"], "default");
        assert_eq!(
            json["seccomp"]["filter"]["sha256"],
            seccomp.filter.sha256.as_str()
        );
        assert_eq!(
            json["seccomp"]["filter"]["killed"][0],
            "foreign_architecture"
        );
        assert!(json["seccomp"].get("program").is_none(), "{json}");
    }

    #[test]
    fn a_custom_profile_is_compiled_into_the_plan() {
        let plan = compile_with_profile(Some(STRICT_PROFILE)).unwrap();
        let seccomp = &plan.seccomp;
        assert_eq!(seccomp.filter.summary.allowed_syscalls, 3);
        assert_eq!(
            seccomp.filter.sha256,
            seccomp::program_sha256(&seccomp.program)
        );
        assert_ne!(seccomp.program, seccomp::DEFAULT_FILTER);
    }

    #[test]
    fn a_bad_profile_is_a_contract_error_naming_the_profile_and_the_entry() {
        let error = compile_with_profile(Some(
            r#"{"defaultAction": "SCMP_ACT_ALLOW", "syscalls": [{"names": ["read"], "action": "SCMP_ACT_PERHAPS"}]}"#,
        ))
        .unwrap_err();
        assert_eq!(error.class(), "sandbox_unavailable");
        assert_eq!(
            error.to_string(),
            "seccomp_profile: profile /jobs/p.json: syscalls[0].action: unknown action \"SCMP_ACT_PERHAPS\""
        );
        let error = compile_with_profile(Some("{ not json")).unwrap_err();
        assert!(
            error.to_string().starts_with(
                "seccomp_profile: profile /jobs/p.json: not valid Docker seccomp JSON"
            ),
            "{error}"
        );
        let error = compile_with_profile(None).unwrap_err();
        assert_eq!(error.class(), "sandbox_unavailable");
    }

    fn compile_pod(yaml: &str, namespace: Option<&str>) -> Result<CellPlan, ContractError> {
        let contract = parse_contract(yaml, ContractFormat::Yaml)?;
        compile(
            &contract,
            &CompileInput {
                pod_network: namespace.map(|n| PodInput::network(Path::new(n))),
                ..CompileInput::new(Path::new("/jobs/42"), &argv(&["true"]))
            },
        )
    }

    #[test]
    fn a_pod_contract_joins_the_pod_network_it_is_given_and_sets_no_proxy() {
        let plan = compile_pod("network: { mode: pod }\n", Some("/var/run/netns/cni-1")).unwrap();
        assert_eq!(
            plan.network,
            NetworkPlan::Pod {
                namespace: PathBuf::from("/var/run/netns/cni-1"),
                ipc: None,
                uts: None,
            }
        );
        assert_eq!(env_value(&plan, "HTTP_PROXY"), None);
        assert!(plan.network.transparent_endpoints().is_empty());
    }

    #[test]
    fn a_pods_ipc_uts_and_files_are_in_the_plan_and_its_files_replace_the_generated_ones() {
        let contract = parse_contract("network: { mode: pod }\n", ContractFormat::Yaml).unwrap();
        let files = [(PathBuf::from("/pods/u/etc-hosts"), "hosts".to_owned())];
        let plan = compile(
            &contract,
            &CompileInput {
                pod_network: Some(PodInput {
                    network: Path::new("/proc/7/ns/net"),
                    ipc: Some(Path::new("/proc/7/ns/ipc")),
                    uts: Some(Path::new("/proc/7/ns/uts")),
                    etc_files: &files,
                }),
                ..CompileInput::new(Path::new("/jobs/42"), &argv(&["true"]))
            },
        )
        .unwrap();
        assert_eq!(
            plan.network,
            NetworkPlan::Pod {
                namespace: "/proc/7/ns/net".into(),
                ipc: Some("/proc/7/ns/ipc".into()),
                uts: Some("/proc/7/ns/uts".into()),
            }
        );
        assert!(plan.etc.contains(&EtcEntry::Pod {
            source: "/pods/u/etc-hosts".into(),
            target: "/etc/hosts".into(),
        }));
        let generated: Vec<&str> = crate::layout::generated_etc_files(&plan)
            .into_iter()
            .map(|(name, _)| name)
            .collect();
        assert!(!generated.contains(&"hosts"), "{generated:?}");
        assert!(generated.contains(&"hostname"), "{generated:?}");
        let record = serde_json::to_value(&plan.network).unwrap();
        assert_eq!(record["ipc"], "/proc/7/ns/ipc");
    }

    #[test]
    fn a_pod_network_is_joined_only_under_a_pod_contract_and_a_pod_contract_needs_one() {
        for yaml in [
            "network: { mode: deny }\n",
            "network: { mode: allowlist, allowed_domains: [a.test] }\n",
        ] {
            let error = compile_pod(yaml, Some("/var/run/netns/cni-1"))
                .unwrap_err()
                .to_string();
            assert!(error.starts_with("network.mode: "), "{error}");
            assert!(
                error.contains(
                    "does not allow joining the pod network namespace /var/run/netns/cni-1"
                ),
                "{error}"
            );
        }
        let error = compile_pod("network: { mode: pod }\n", None)
            .unwrap_err()
            .to_string();
        assert!(error.contains("none was given"), "{error}");
        let error = compile_pod("network: { mode: pod }\n", Some("cni-1"))
            .unwrap_err()
            .to_string();
        assert!(error.contains("not an absolute path"), "{error}");
    }

    #[test]
    fn a_pod_contract_has_no_allowlist_and_no_gvisor() {
        let error = compile_pod(
            "network: { mode: pod, allowed_domains: [a.test] }\n",
            Some("/var/run/netns/cni-1"),
        )
        .unwrap_err()
        .to_string();
        assert!(
            error.contains("must be empty when network.mode is pod"),
            "{error}"
        );
        let error = compile_pod(
            "isolation: gvisor\nnetwork: { mode: pod }\n",
            Some("/var/run/netns/cni-1"),
        )
        .unwrap_err()
        .to_string();
        assert!(
            error.contains("isolation gvisor does not support network.mode pod"),
            "{error}"
        );
    }
}
