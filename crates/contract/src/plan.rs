//! `CellPlan`: the fully resolved, validated description of one cell, produced by
//! [`crate::compile`] from a contract. The runtime (`airlock-cell`) only *applies* a plan;
//! every decision about what a cell may do is made here, without I/O.

use crate::layout::CellLayout;
use crate::seccomp::{BpfInsn, FilterSummary};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// Port of the supervisor's HTTP forward/CONNECT proxy on `127.0.0.1` inside the cell.
pub const HTTP_PROXY_PORT: u16 = 3128;
/// Port of the supervisor's SOCKS5 proxy on `127.0.0.1` inside the cell.
pub const SOCKS_PROXY_PORT: u16 = 1080;
/// Where a run's broker socket is mounted in its cell (and the value of
/// [`BROKER_ENV`]), when its contract names broker actions.
pub const BROKER_SOCKET: &str = "/run/airlock/broker.sock";
/// The cell variable naming the broker socket.
pub const BROKER_ENV: &str = "AIRLOCK_BROKER";

/// What the runtime executes. Serialised into the run's result as "the plan as enforced".
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CellPlan {
    /// sha256 (hex) of the canonical JSON form of the contract this plan came from.
    pub contract_sha256: String,
    /// argv of the payload; argv[0] is resolved against `PATH` inside the cell.
    pub argv: Vec<String>,
    /// Identity the payload runs as inside the cell.
    pub identity: CellIdentity,
    pub hostname: String,
    /// Absolute path inside the cell; must be inside one of the mounts.
    pub workdir: PathBuf,
    /// The exact environment of the payload (nothing of the host leaks in).
    pub env: Vec<EnvVar>,
    /// Root filesystem: always a fresh tmpfs; `readonly_root` makes it read-only after setup.
    pub rootfs: RootfsPlan,
    /// Mounts in the order they are applied. Targets are absolute, normalised cell paths.
    pub mounts: Vec<MountPlan>,
    /// What the cell's `/etc` holds besides the files the runtime generates (`passwd`,
    /// `group`, `hosts`, `hostname`, `nsswitch.conf`, `resolv.conf`), in the order placed.
    #[serde(default)]
    pub etc: Vec<EtcEntry>,
    pub network: NetworkPlan,
    pub limits: Limits,
    pub seccomp: SeccompPlan,
    /// Globs (relative to the cell root, `/`-rooted after normalisation) of files allowed
    /// to leave the cell as artifacts.
    pub output_allowlist: Vec<String>,
    /// Credentials the supervisor injects; values never appear in the plan.
    pub credentials: Vec<CredentialPlan>,
    /// Forbidden variables its credentials read under the operator's lift for the run's
    /// class (crate::credential_rules), set by the engine: the record says so.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub credentials_lifted: Vec<crate::credential_rules::LiftedCredential>,
    /// Secrets the egress proxy injects; the cell holds only per-run placeholders in
    /// these variables (docs/credentials.md).
    #[serde(default)]
    pub secrets: Vec<SecretPlan>,
    /// Per allowed domain, the methods and path prefixes its requests may use.
    #[serde(default)]
    pub http_rules: Vec<HttpRulePlan>,
    /// The payload runs on a pseudo-terminal allocated in the cell's devpts (its stdin,
    /// stdout, stderr and controlling terminal); the supervisor relays the master.
    /// Without it the payload has no controlling terminal at all.
    #[serde(default)]
    pub terminal: bool,
    /// The broker actions the run may ask for, and who asks (docs/credentials.md). Its
    /// socket is mounted by a [`MountPlan::BrokerSocket`] the engine adds for the run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub broker: Option<BrokerPlan>,
    /// The isolation tier the plan runs on: the engine picks the backend from it, and the
    /// plan in the run's record says which one ran.
    #[serde(default)]
    pub isolation: crate::Isolation,
    /// How the cell builds its root and confines itself, step by step.
    pub layout: CellLayout,
    /// What stands in for the cell's cgroup where none is delegated to the caller, when
    /// the operator's workload class allows a run without one (docs/policy.md); `None`,
    /// the rule, refuses such a run. Set by the trusted side after compile (`airlock run
    /// --class`): a contract cannot set it, it is not a contract field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub without_cgroup: Option<crate::RlimitsOnly>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct CellIdentity {
    pub uid: u32,
    pub gid: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EnvVar {
    pub name: String,
    pub value: String,
    /// Secret values are redacted from every record, event and export.
    pub secret: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RootfsPlan {
    /// `host`, or an OCI image of the store (its layers as the system tree).
    pub image: RootImage,
    pub readonly: bool,
    /// Size cap of the root tmpfs (holds only the generated skeleton and `/etc`).
    pub size_bytes: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RootImage {
    /// Read-only view of the host's `/usr`, `/bin`, `/lib*`, `/sbin` plus a generated `/etc`.
    Host,
    /// An OCI image: its unpacked layers (top first), stacked read-only (an overlayfs
    /// without an upper layer; a single layer is used as it is) as the system tree.
    Oci {
        /// The reference pinned by digest (`name@sha256:...`), as run and recorded.
        reference: String,
        /// The manifest's digest.
        digest: String,
        /// Unpacked layer directories in the image store, top layer first.
        layers: Vec<PathBuf>,
    },
}

/// An OCI image the caller resolved through the image store, for [`crate::CompileInput`]:
/// compile stays pure, the store is read where the contract is loaded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedImage {
    /// Pinned reference (`name@sha256:...`).
    pub reference: String,
    pub digest: String,
    /// Unpacked layer directories, top first.
    pub layers: Vec<PathBuf>,
    /// The merged view's top-level entries (name, symlink target if a symlink).
    pub top_level: Vec<(String, Option<PathBuf>)>,
    /// The merged view's `/etc` entries (name, symlink target if a symlink).
    pub etc: Vec<(String, Option<PathBuf>)>,
    /// The image config's process defaults, resolved against the image's own files.
    pub defaults: ImageDefaults,
}

/// The image config's `User`, `Env`, `WorkingDir`, `Entrypoint` and `Cmd`; the contract
/// overrides each.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ImageDefaults {
    /// `User` as numeric ids (a name already resolved from the image's `/etc/passwd`).
    pub user: Option<CellIdentity>,
    pub env: Vec<(String, String)>,
    pub working_dir: Option<PathBuf>,
    /// `Entrypoint` followed by `Cmd`: the command when the run names none.
    pub command: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum MountPlan {
    /// A host directory of the `host` image (e.g. `/usr`). Mirrored as a symlink when the
    /// host path is a symlink (merged-/usr), skipped when `optional` and absent.
    HostSystem { path: PathBuf, optional: bool },
    /// A top-level entry of the OCI image (`RootImage::Oci`) at the same path: cloned from
    /// the stacked layers read-only, nosuid, nodev, or mirrored as a symlink (`link`).
    ImageSystem {
        path: PathBuf,
        link: Option<PathBuf>,
    },
    /// A read-only input: host `source` (absolute, as resolved against the contract's
    /// directory) bind-mounted read-only, nosuid, nodev at `target` (executable: an input
    /// may be the script the payload runs).
    ReadonlyInput { source: PathBuf, target: PathBuf },
    /// A writable, size-capped tmpfs (nosuid, nodev) at `target`. With `exec`, files in it
    /// may be executed and mapped executable (no `noexec`, Landlock grants execute there);
    /// without, it is `noexec` and Landlock withholds execute.
    WritableTmpfs {
        target: PathBuf,
        size_bytes: u64,
        exec: bool,
    },
    /// The run's broker socket: host `source` (a unix socket the trusted side bound for
    /// this run, outside the cell) bind-mounted read-only, nosuid, nodev, noexec at
    /// `target` ([`BROKER_SOCKET`]). Connecting needs no write access to the mount.
    BrokerSocket { source: PathBuf, target: PathBuf },
}

/// A run's broker actions.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BrokerPlan {
    /// The operator's `[broker.actions.NAME]` the contract names.
    pub actions: Vec<String>,
    /// The workload class whose grant made the contract, set by the trusted side after
    /// compile (`airlock run --class`); `None` for a contract written by the caller. A
    /// contract cannot set it: it is not a contract field.
    #[serde(default)]
    pub class: Option<String>,
}

/// One entry of the cell's `/etc`, mounted read-only, nosuid, nodev and noexec.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum EtcEntry {
    /// A vetted host entry (see [`crate::HOST_ETC_ENTRIES`]) at the same path: mirrored as a
    /// symlink when the host's is one, skipped when the host has none.
    Host { path: PathBuf },
    /// An entry of the OCI image's own `/etc` (never the host's) that the generated files
    /// and the contract's do not replace: cloned from the stacked layers, or a symlink.
    Image {
        path: PathBuf,
        link: Option<PathBuf>,
    },
    /// A contract's `filesystem.etc_files` entry: host `source` (followed if a symlink)
    /// at `target`; it must exist.
    Contract { source: PathBuf, target: PathBuf },
    /// A Kubernetes pod's own file (its `hosts`, `hostname`, `resolv.conf`: what CRI
    /// mounts; airlock's OCI runtime only) at `target`, replacing the generated one. A
    /// symlink is never followed (as for a read-only input): the pod's files are regular
    /// files of kubelet's and containerd's directories.
    Pod { source: PathBuf, target: PathBuf },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "mode", rename_all = "snake_case")]
pub enum NetworkPlan {
    /// Only `lo` in the cell's network namespace: nothing leaves the cell, while the
    /// payload's own servers on loopback stay reachable to it.
    Deny,
    /// Only `lo`; the supervisor's proxies listen on `127.0.0.1` inside the cell, and its
    /// resolver and transparent listeners on the addresses of
    /// [`NetworkPlan::transparent_endpoints`].
    Allowlist { destinations: Vec<DestinationRule> },
    /// The cell's processes run in an existing network namespace, a Kubernetes pod's
    /// (contract `network.mode: pod`): the supervisor joins `namespace` before it clones
    /// the cell, which then creates no network namespace of its own. The namespace must
    /// be one (nsfs, of type network) and not the host's; the pod's CNI and
    /// NetworkPolicy, not airlock's proxy, govern what it reaches.
    Pod {
        namespace: PathBuf,
        /// The pod's ipc namespace, joined the same way (an application container of a
        /// pod: CRI names the sandbox's); `None`: the cell creates its own.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        ipc: Option<PathBuf>,
        /// The pod's uts namespace (its host name), as `ipc`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        uts: Option<PathBuf>,
    },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DestinationRule {
    /// Lower-case host name; a leading `*.` matches any sub-domain (not the apex).
    pub host_pattern: String,
    /// Allowed ports; `[443, 80]` when the contract names none.
    pub ports: Vec<u16>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limits {
    /// CPU quota in thousandths of one CPU (1000 = one full core).
    pub cpu_millis: u32,
    pub memory_bytes: u64,
    /// Maximum number of the payload's tasks (processes and threads); the cell's
    /// `pids.max` adds one for airlock's own pid 1.
    pub process_limit: u32,
    pub wall_time_ms: u64,
    /// Combined stdout+stderr bytes kept; the rest is counted and dropped.
    pub output_bytes: u64,
    /// RLIMIT_NOFILE of the payload.
    pub open_files: u64,
    /// RLIMIT_FSIZE of the payload.
    pub file_size_bytes: u64,
    /// Size of the cell's `/dev/shm` tmpfs; filling it is the `shm` ceiling.
    #[serde(default)]
    pub shm_bytes: u64,
}

/// The cell's seccomp filter, decided at compile time: where its policy came from, the
/// BPF program the cell installs, and the program's identity for the plan as enforced.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SeccompPlan {
    #[serde(flatten)]
    pub profile: SeccompProfile,
    pub filter: FilterIdentity,
    /// The program, instruction by instruction. Not serialised: the record names it by
    /// [`FilterIdentity::sha256`], and the runtime refuses a program whose hash is not
    /// that one (a plan read back without its program installs nothing).
    #[serde(skip)]
    pub program: std::borrow::Cow<'static, [BpfInsn]>,
    /// A custom profile's policy, hardened, that `program` was compiled from: for a
    /// runtime that takes a policy rather than a program (the gVisor tier's
    /// `linux.seccomp`, crates/oci). `None` for the default profile (its policy is
    /// [`crate::seccomp::default_policy`]) and in a plan read back, which a runtime that
    /// needs it refuses, as it refuses a plan without its program.
    #[serde(skip)]
    pub custom_policy: Option<crate::seccomp::SeccompPolicy>,
}

impl Limits {
    /// `pids.max` of a cell: the contract's `process_limit` counts the payload's processes
    /// and threads; airlock's own pid 1 (the reaper) is added on top, so that a contract
    /// that validates (`process_limit: 1`) can run. While the cell is set up, pid 1 and its
    /// short-lived detach helper are the only tasks (two), and the helper is gone before
    /// the payload starts, so the payload gets exactly `process_limit`.
    pub fn cell_pids_max(&self) -> u64 {
        u64::from(self.process_limit) + 1
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "profile", rename_all = "snake_case")]
pub enum SeccompProfile {
    /// airlock's built-in allowlist (Docker's default profile plus agent hardening).
    Default,
    /// A profile in Docker's seccomp JSON format, read from `path` where the contract was
    /// loaded and checked by compile; the built-in hardening (foreign arches, x32,
    /// namespace flags, TIOCSTI) still applies.
    DockerJson { path: PathBuf },
}

/// Which filter a cell runs: the sha256 of its program's bytes (as handed to
/// `seccomp(2)`) and what it does in a few numbers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FilterIdentity {
    pub sha256: String,
    pub instructions: usize,
    #[serde(flatten)]
    pub summary: FilterSummary,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CredentialPlan {
    pub name: String,
    /// Environment variable set inside the cell.
    pub env: String,
    /// Environment variable of the trusted supervisor the value is read from.
    pub from_env: String,
}

/// A secret the run uses: the operator's definition by name, and the cell's variable
/// for its placeholder.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SecretPlan {
    pub name: String,
    pub env: String,
    #[serde(default, skip_serializing_if = "crate::SecretDelivery::is_placeholder")]
    pub deliver: crate::SecretDelivery,
}

/// The requests an allowed domain (`host`, a normalised allowlist pattern) accepts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HttpRulePlan {
    pub host: String,
    pub methods: Vec<String>,
    pub path_prefixes: Vec<String>,
}

/// A plan as it travels between airlock's own processes (the engine to its cell factory):
/// the plan, its seccomp program and a custom profile's policy, which the plan's
/// serialised form leaves out. The receiving runtime still refuses a program whose hash
/// is not the one the plan names, and a policy that does not compile to that program.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlanTransfer {
    pub plan: CellPlan,
    pub seccomp_program: Vec<crate::seccomp::BpfInsn>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seccomp_policy: Option<crate::seccomp::SeccompPolicy>,
}

impl PlanTransfer {
    pub fn of(plan: &CellPlan) -> PlanTransfer {
        PlanTransfer {
            plan: plan.clone(),
            seccomp_program: plan.seccomp.program.to_vec(),
            seccomp_policy: plan.seccomp.custom_policy.clone(),
        }
    }

    pub fn into_plan(self) -> CellPlan {
        let mut plan = self.plan;
        plan.seccomp.program = self.seccomp_program.into();
        plan.seccomp.custom_policy = self.seccomp_policy;
        plan
    }
}
