//! The execution contract as written by the trusted side: typed, strict (`deny_unknown_fields`
//! everywhere, so a misspelt control is an error rather than a silently absent one) and with
//! every optional field defaulting to the restrictive value of [`crate::default_contract`].
//!
//! Numbers are signed on purpose: a negative limit must come back as a field error
//! (`resources.memory_mb: must be at least 4`), not as an opaque type error.

use schemars::JsonSchema;
use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;
use std::marker::PhantomData;

/// Inclusive bounds of a numeric field, shared by validation, the JSON schema and the docs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    pub min: i64,
    pub max: i64,
}

pub const UID_BOUNDS: Bounds = Bounds { min: 1, max: 65534 };
pub const WRITABLE_SIZE_MB_BOUNDS: Bounds = Bounds { min: 1, max: 4096 };
pub const CPU_MILLIS_BOUNDS: Bounds = Bounds {
    min: 10,
    max: 64000,
};
pub const MEMORY_MB_BOUNDS: Bounds = Bounds { min: 4, max: 65536 };
pub const PROCESS_LIMIT_BOUNDS: Bounds = Bounds { min: 1, max: 4096 };
pub const WALL_TIME_SECONDS_BOUNDS: Bounds = Bounds { min: 1, max: 86400 };
pub const OUTPUT_BYTES_BOUNDS: Bounds = Bounds {
    min: 1,
    max: 1 << 30,
};
pub const OPEN_FILES_BOUNDS: Bounds = Bounds {
    min: 16,
    max: 65536,
};
pub const FILE_SIZE_MB_BOUNDS: Bounds = Bounds { min: 1, max: 16384 };
pub const SHM_MB_BOUNDS: Bounds = Bounds { min: 1, max: 65536 };

pub const DEFAULT_UID: i64 = 10001;
pub const DEFAULT_GID: i64 = 10001;
pub const DEFAULT_WRITABLE_SIZE_MB: i64 = 16;
/// Writable paths are executable unless a contract says otherwise (docs/contract.md says
/// why); a path written as a bare string gets this too.
pub const DEFAULT_WRITABLE_EXEC: bool = true;
/// Docker's `--shm-size` default: what software written for containers expects at least.
pub const DEFAULT_SHM_MB: i64 = 64;
pub const DEFAULT_HOSTNAME: &str = "airlock";
pub const HOST_IMAGE: &str = "host";
pub const DEFAULT_SECCOMP_PROFILE: &str = "default";

/// An execution contract: everything one cell may see, reach and consume.
///
/// May be written bare or wrapped in a top-level `execution_contract:` key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Contract {
    /// Root image of the cell: `host` (a read-only view of the host's `/usr`, `/bin`,
    /// `/lib*`, `/sbin`), or an OCI image of the image store pinned by digest
    /// (`registry/name@sha256:...`; a tag only with `[images] allow_tags`), whose layers
    /// become the read-only system tree and whose config's `User`, `Env`, `WorkingDir` and
    /// `Entrypoint`/`Cmd` apply where the contract sets nothing.
    #[serde(default = "default_image")]
    pub image: String,
    #[serde(default)]
    pub identity: Identity,
    #[serde(default)]
    pub filesystem: Filesystem,
    #[serde(default)]
    pub network: Network,
    #[serde(default)]
    pub resources: Resources,
    /// Credentials the supervisor injects into the cell's environment at start.
    #[serde(default)]
    pub credentials: Vec<Credential>,
    /// Operator-defined secrets (`[secrets.NAME]` of the operator's configuration) the run
    /// may use through the egress proxy: the cell gets only a per-run placeholder.
    #[serde(default)]
    pub secrets: Vec<SecretUse>,
    #[serde(default)]
    pub cleanup: Cleanup,
    /// Extra environment of the payload: `NAME: value` or `NAME: { value, secret }`.
    #[serde(default)]
    pub env: BTreeMap<String, EnvValue>,
    /// Working directory inside the cell; `/tmp` when `/tmp` is writable, else `/`.
    #[serde(default)]
    pub workdir: Option<String>,
    /// Host name of the cell's UTS namespace (an RFC 1123 label).
    #[serde(default = "default_hostname")]
    pub hostname: String,
    /// `default`, or the path (relative to the contract's directory) of a seccomp profile in
    /// Docker's JSON format.
    #[serde(default = "default_seccomp_profile")]
    pub seccomp_profile: String,
    /// Give the payload a pseudo-terminal of the cell's own devpts as its stdin, stdout and
    /// controlling terminal; the caller's terminal (or stdin and stdout) is relayed to it.
    /// Off by default: a payload without a terminal cannot drive one.
    #[serde(default, skip_serializing_if = "is_false")]
    pub terminal: bool,
    /// Operator-defined broker actions (`[broker.actions.NAME]` of the operator's
    /// configuration) the payload may ask the trusted side to perform: the cell gets the
    /// broker's socket at `/run/airlock/broker.sock` (docs/credentials.md, "The broker").
    /// Absent or empty: no socket. Not serialised when empty, so older contracts keep
    /// their `contract_sha256`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub broker_actions: Vec<String>,
    /// The isolation tier: `native` (the Linux cell: namespaces, seccomp, Landlock on the
    /// host kernel) or `gvisor` (the payload runs on gVisor's user-space kernel, `runsc`,
    /// under the same limits, records and result classes; docs/threat-model.md, "Tiers").
    /// A host that cannot run the tier refuses the run (`sandbox_unavailable`); it is never
    /// run on a weaker one. Absent `native` is not serialised, so older contracts keep
    /// their `contract_sha256`.
    #[serde(default, skip_serializing_if = "Isolation::is_native")]
    pub isolation: Isolation,
}

/// The isolation tier of a cell (see [`Contract::isolation`]). Ordered weakest first, so
/// a class's required tier is a lower bound a request may raise but not lower.
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    Deserialize,
    JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Isolation {
    /// The Linux cell on the host kernel.
    #[default]
    Native,
    /// gVisor's user-space kernel (`runsc`): the payload's system calls are served by
    /// gVisor's Sentry, not by the host kernel.
    Gvisor,
}

impl Isolation {
    pub fn is_native(&self) -> bool {
        *self == Isolation::Native
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Isolation::Native => "native",
            Isolation::Gvisor => "gvisor",
        }
    }
}

/// Absent `terminal: false` is not serialised, so contracts written before the field
/// existed keep their `contract_sha256`.
fn is_false(value: &bool) -> bool {
    !*value
}

/// The top-level `execution_contract:` wrapper the seed documents use.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WrappedContract {
    pub execution_contract: Contract,
}

/// airlock execution contract
///
/// A contract document: the contract itself, or the contract under a single top-level
/// `execution_contract` key. Reference: docs/contract.md.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(untagged)]
pub enum ContractDocument {
    Wrapped(WrappedContract),
    Bare(Contract),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Identity {
    /// User id of the payload inside the cell. Never 0.
    #[serde(default = "default_uid")]
    #[schemars(range(min = UID_BOUNDS.min, max = UID_BOUNDS.max))]
    pub uid: i64,
    /// Group id of the payload inside the cell. Never 0.
    #[serde(default = "default_gid")]
    #[schemars(range(min = UID_BOUNDS.min, max = UID_BOUNDS.max))]
    pub gid: i64,
}

impl Default for Identity {
    fn default() -> Self {
        Self {
            uid: DEFAULT_UID,
            gid: DEFAULT_GID,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Filesystem {
    /// Make the cell's root read-only once it is set up.
    #[serde(default = "yes")]
    pub readonly_root: bool,
    /// Host files or directories bind-mounted read-only, nosuid and nodev into the cell
    /// (executable: an input may be the script the payload runs).
    #[serde(default)]
    pub readonly_inputs: Vec<ReadonlyInput>,
    /// Size-capped tmpfs mounts, the only places the payload can write; executable unless
    /// an entry says `exec: false`.
    #[serde(default = "default_writable_paths")]
    pub writable_paths: Vec<WritablePath>,
    /// Globs of the files that may leave the cell as artifacts; each inside a writable path.
    /// `*`, `?` and `[...]` match within a segment, a `**` segment any number of segments.
    #[serde(default)]
    pub output_allowlist: Vec<String>,
    /// Extra read-only files under the cell's `/etc`, on top of the vetted host entries
    /// every cell gets. Never a secret, nor a file the runtime generates.
    #[serde(default)]
    pub etc_files: Vec<EtcFile>,
}

impl Default for Filesystem {
    fn default() -> Self {
        Self {
            readonly_root: true,
            readonly_inputs: Vec::new(),
            writable_paths: default_writable_paths(),
            output_allowlist: Vec::new(),
            etc_files: Vec::new(),
        }
    }
}

/// `input/report.docx` (same relative path on the host, under the contract's directory, and
/// in the cell) or `{ source, target }`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(untagged)]
pub enum ReadonlyInput {
    Path(String),
    Mapped(MappedInput),
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MappedInput {
    /// Host path, relative to the contract's directory or absolute.
    pub source: String,
    /// Path inside the cell.
    pub target: String,
}

/// `/etc/pip.conf` (the host's file at the same path) or `{ source, target }` (a host file,
/// relative to the contract's directory or absolute, at `target` under `/etc`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(untagged)]
pub enum EtcFile {
    Path(String),
    Mapped(MappedInput),
}

/// `output/` (a tmpfs of the default size, executable) or `{ path, size_mb, exec }`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(untagged)]
pub enum WritablePath {
    Path(String),
    Detailed(DetailedWritablePath),
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DetailedWritablePath {
    /// Path inside the cell.
    pub path: String,
    /// Size cap of the tmpfs in MiB.
    #[serde(default = "default_writable_size_mb")]
    #[schemars(range(min = WRITABLE_SIZE_MB_BOUNDS.min, max = WRITABLE_SIZE_MB_BOUNDS.max))]
    pub size_mb: i64,
    /// Whether files written here may be executed (and mapped executable). Default `true`:
    /// agents build and run code where they write it, and `noexec` contains nothing that
    /// `memfd_create` + `execve` or an interpreter does not already run (docs/contract.md).
    #[serde(default = "default_writable_exec")]
    pub exec: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema, Default)]
#[serde(deny_unknown_fields)]
pub struct Network {
    #[serde(default)]
    pub mode: NetworkMode,
    /// `host`, `*.domain` or either with `:port`; only with `mode: allowlist`.
    #[serde(default)]
    pub allowed_domains: Vec<String>,
    /// Per allowed domain, the methods and path prefixes plain-HTTP requests may use
    /// (docs/credentials.md); a domain without a rule takes any request.
    #[serde(default)]
    pub http_rules: Vec<HttpRule>,
}

/// The requests one allowed domain accepts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct HttpRule {
    /// An `allowed_domains` host (`name` or `*.name`, without the port).
    pub host: String,
    /// Upper-case methods; empty: any.
    #[serde(default)]
    pub methods: Vec<String>,
    /// Path prefixes (starting with `/`); empty: any.
    #[serde(default)]
    pub path_prefixes: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema, Default)]
#[serde(rename_all = "snake_case")]
pub enum NetworkMode {
    /// Nothing leaves the cell: only `lo`, where the payload reaches its own servers.
    #[default]
    Deny,
    /// Only the listed destinations, through airlock's egress proxies.
    Allowlist,
    /// The network namespace of the Kubernetes pod the container belongs to, which its
    /// runtime names (`linux.namespaces[network].path` of an OCI bundle: airlock's OCI
    /// runtime only; any other run is refused). The pod's CNI plugin and NetworkPolicy
    /// govern its traffic, not airlock's egress proxy; the cell keeps its own user,
    /// mount, pid, ipc, uts and cgroup namespaces (docs/kubernetes.md).
    Pod,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Resources {
    /// CPU quota in thousandths of a core (1000 = one core).
    #[serde(default = "default_cpu_millis")]
    #[schemars(range(min = CPU_MILLIS_BOUNDS.min, max = CPU_MILLIS_BOUNDS.max))]
    pub cpu_millis: i64,
    /// Memory ceiling in MiB (swap is not granted on top).
    #[serde(default = "default_memory_mb")]
    #[schemars(range(min = MEMORY_MB_BOUNDS.min, max = MEMORY_MB_BOUNDS.max))]
    pub memory_mb: i64,
    /// Maximum number of processes and threads in the cell.
    #[serde(default = "default_process_limit")]
    #[schemars(range(min = PROCESS_LIMIT_BOUNDS.min, max = PROCESS_LIMIT_BOUNDS.max))]
    pub process_limit: i64,
    /// Deadline, enforced from outside the cell.
    #[serde(default = "default_wall_time_seconds")]
    #[schemars(range(min = WALL_TIME_SECONDS_BOUNDS.min, max = WALL_TIME_SECONDS_BOUNDS.max))]
    pub wall_time_seconds: i64,
    /// Combined stdout and stderr bytes kept.
    #[serde(default = "default_output_bytes")]
    #[schemars(range(min = OUTPUT_BYTES_BOUNDS.min, max = OUTPUT_BYTES_BOUNDS.max))]
    pub output_bytes: i64,
    /// Open file descriptors per process (RLIMIT_NOFILE).
    #[serde(default = "default_open_files")]
    #[schemars(range(min = OPEN_FILES_BOUNDS.min, max = OPEN_FILES_BOUNDS.max))]
    pub open_files: i64,
    /// Largest file a process may write, in MiB (RLIMIT_FSIZE).
    #[serde(default = "default_file_size_mb")]
    #[schemars(range(min = FILE_SIZE_MB_BOUNDS.min, max = FILE_SIZE_MB_BOUNDS.max))]
    pub file_size_mb: i64,
    /// Size of the cell's `/dev/shm` tmpfs in MiB (POSIX shared memory). Its pages count
    /// against `memory_mb`.
    #[serde(default = "default_shm_mb")]
    #[schemars(range(min = SHM_MB_BOUNDS.min, max = SHM_MB_BOUNDS.max))]
    pub shm_mb: i64,
}

impl Default for Resources {
    fn default() -> Self {
        Self {
            cpu_millis: default_cpu_millis(),
            memory_mb: default_memory_mb(),
            process_limit: default_process_limit(),
            wall_time_seconds: default_wall_time_seconds(),
            output_bytes: default_output_bytes(),
            open_files: default_open_files(),
            file_size_mb: default_file_size_mb(),
            shm_mb: default_shm_mb(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Credential {
    /// Identifier of the credential in audit records.
    pub name: String,
    /// Environment variable set inside the cell.
    pub env: String,
    /// Environment variable of the trusted supervisor holding the value.
    pub from_env: String,
}

/// A secret of the operator's configuration that the run uses; its value never enters the
/// cell (docs/credentials.md).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SecretUse {
    /// The name of the operator's `[secrets.NAME]` table.
    pub name: String,
    /// Environment variable of the cell that holds the run's placeholder.
    pub env: String,
    /// What the cell's variable holds: the placeholder (the default), or, for a
    /// token-provider secret when a client in the cell must hold the token itself, the
    /// token (`env`), redacted from everything airlock stores and revoked at the end.
    #[serde(default, skip_serializing_if = "SecretDelivery::is_placeholder")]
    pub deliver: SecretDelivery,
}

/// How a secret reaches the cell (docs/credentials.md).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum SecretDelivery {
    /// A per-run placeholder the egress proxy swaps for the value.
    #[default]
    Placeholder,
    /// The value itself, in the variable: only a provider's short-lived token.
    Env,
}

impl SecretDelivery {
    pub fn is_placeholder(&self) -> bool {
        *self == SecretDelivery::Placeholder
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Cleanup {
    /// Must be `true`: the cell and its writable paths are always destroyed.
    #[serde(default = "yes")]
    pub destroy_runtime: bool,
    /// Must be `true`: only allowlisted outputs survive the cell.
    #[serde(default = "yes")]
    pub retain_outputs_only: bool,
}

impl Default for Cleanup {
    fn default() -> Self {
        Self {
            destroy_runtime: true,
            retain_outputs_only: true,
        }
    }
}

/// `value` or `{ value, secret }`; secret values are redacted from every record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(untagged)]
pub enum EnvValue {
    Plain(String),
    Detailed(DetailedEnvValue),
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DetailedEnvValue {
    pub value: String,
    #[serde(default)]
    pub secret: bool,
}

impl EnvValue {
    pub fn value(&self) -> &str {
        match self {
            Self::Plain(value) => value,
            Self::Detailed(detailed) => &detailed.value,
        }
    }

    pub fn is_secret(&self) -> bool {
        match self {
            Self::Plain(_) => false,
            Self::Detailed(detailed) => detailed.secret,
        }
    }
}

// `#[serde(untagged)]` would do for these, but its only error is "data did not match any
// variant"; accepting a string or a map explicitly keeps the struct form's precise errors
// (unknown field, missing field) and their paths.
macro_rules! string_or_struct {
    ($type:ident, $string_variant:ident, $struct_variant:ident, $expecting:literal) => {
        impl<'de> Deserialize<'de> for $type {
            fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                deserializer.deserialize_any(StringOrStruct::<$type, _>(
                    $expecting,
                    $type::$string_variant,
                    $type::$struct_variant,
                    PhantomData,
                ))
            }
        }
    };
}

string_or_struct!(
    ReadonlyInput,
    Path,
    Mapped,
    "a path or a map with `source` and `target`"
);
string_or_struct!(
    EtcFile,
    Path,
    Mapped,
    "a host path under /etc or a map with `source` and `target`"
);
string_or_struct!(
    WritablePath,
    Path,
    Detailed,
    "a path or a map with `path`, `size_mb` and `exec`"
);
string_or_struct!(
    EnvValue,
    Plain,
    Detailed,
    "a string or a map with `value` and `secret`"
);

/// Parts of a string-or-struct type: the message, the string constructor and the struct
/// constructor (whose argument type is the struct form, deserialized with its own rules).
struct StringOrStruct<T, S>(&'static str, fn(String) -> T, fn(S) -> T, PhantomData<S>);

impl<'de, T, S: Deserialize<'de>> Visitor<'de> for StringOrStruct<T, S> {
    type Value = T;

    fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
        formatter.write_str(self.0)
    }

    fn visit_str<E: de::Error>(self, text: &str) -> Result<T, E> {
        Ok((self.1)(text.to_owned()))
    }

    fn visit_map<M: MapAccess<'de>>(self, map: M) -> Result<T, M::Error> {
        let inner = S::deserialize(de::value::MapAccessDeserializer::new(map))?;
        Ok((self.2)(inner))
    }
}

fn yes() -> bool {
    true
}
fn default_image() -> String {
    HOST_IMAGE.to_owned()
}
fn default_hostname() -> String {
    DEFAULT_HOSTNAME.to_owned()
}
fn default_seccomp_profile() -> String {
    DEFAULT_SECCOMP_PROFILE.to_owned()
}
fn default_uid() -> i64 {
    DEFAULT_UID
}
fn default_gid() -> i64 {
    DEFAULT_GID
}
fn default_writable_size_mb() -> i64 {
    DEFAULT_WRITABLE_SIZE_MB
}
fn default_writable_exec() -> bool {
    DEFAULT_WRITABLE_EXEC
}
fn default_writable_paths() -> Vec<WritablePath> {
    vec![WritablePath::Path("/tmp".to_owned())]
}
fn default_cpu_millis() -> i64 {
    1000
}
fn default_memory_mb() -> i64 {
    512
}
fn default_process_limit() -> i64 {
    64
}
fn default_wall_time_seconds() -> i64 {
    60
}
fn default_output_bytes() -> i64 {
    1 << 20
}
fn default_open_files() -> i64 {
    256
}
fn default_file_size_mb() -> i64 {
    64
}
fn default_shm_mb() -> i64 {
    DEFAULT_SHM_MB
}

/// The contract a run gets when its caller names none: host image, unprivileged, read-only
/// root, a 16 MiB `/tmp`, no inputs, no network, no credentials, modest limits.
pub fn default_contract() -> Contract {
    Contract {
        image: default_image(),
        identity: Identity::default(),
        filesystem: Filesystem::default(),
        network: Network::default(),
        resources: Resources::default(),
        credentials: Vec::new(),
        secrets: Vec::new(),
        cleanup: Cleanup::default(),
        env: BTreeMap::new(),
        workdir: None,
        hostname: default_hostname(),
        seccomp_profile: default_seccomp_profile(),
        terminal: false,
        broker_actions: Vec::new(),
        isolation: Isolation::Native,
    }
}
