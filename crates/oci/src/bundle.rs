//! A bundle's `config.json` as terms of a cell (the OCI runtime interface,
//! `airlock oci` / `airlock-runc`): what the spec may ask for and what it may not. Pure:
//! the caller reads the spec and the contract, this module decides.
//!
//! The contract (chosen by the platform's annotations, not by the pod's author) is the
//! floor; the spec can only narrow it. Anything in the spec that would make the cell
//! weaker than its contract, or that airlock cannot enforce, is refused with an error
//! naming the spec's field and the rule; never silently dropped:
//! - the process runs as the spec's user inside the cell's own user namespace; uid 0 is
//!   the contract's identity (root is never honoured, as for an image's `User`), and
//!   `linux.uidMappings`/`gidMappings` onto a host root are refused;
//! - capabilities beyond the container default set are refused (the cell keeps none of
//!   them anyway: the default set is accepted and dropped);
//! - mounts: the kernel file systems every container gets (`/proc`, `/dev`, `/sys`, ...)
//!   are the cell's own; a bind mount becomes a read-only input, refused when it is
//!   writable or its source is a sensitive host path; CRI's standard mounts of a pod's
//!   containers (`/etc/hosts`, `/etc/hostname`, `/etc/resolv.conf` from the pod's own
//!   files, `/dev/shm`, `/dev/termination-log`) are recognised by destination *and*
//!   source ([`cri_mount`]): the three files become read-only `/etc` entries even when
//!   the spec says rw, the other two are the cell's own;
//! - namespaces: the cell always creates its own, except a pod's network, ipc and uts
//!   namespaces (`linux.namespaces[...].path`: CRI gives an application container the
//!   sandbox's), which it joins only when the platform's contract says so
//!   (`network.mode: pod`); a path of any other namespace is refused;
//! - `linux.devices`, `hooks` and `linux.sysctl` are refused;
//! - `process.terminal` is the contract's `terminal` (the runtime needs a console socket);
//! - resources and `RLIMIT_NOFILE` are ceilings: the lower of the spec's and the contract's;
//! - a seccomp profile is the contract's custom profile (airlock's hardening is applied on
//!   top of it); an allow-by-default profile is refused.

use airlock_contract::{Contract, MappedInput, NetworkMode, ReadonlyInput, HOST_IMAGE};
use oci_spec::runtime::{LinuxNamespaceType, Mount, PosixRlimitType, Process, Spec};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Annotation naming the workload class whose contract the container gets.
pub const CLASS_ANNOTATION: &str = "airlock.dev/class";
/// Annotation naming an operator contract (a file of the node's contract directory).
pub const CONTRACT_ANNOTATION: &str = "airlock.dev/contract";
/// The CRI annotations that identify a pod's container.
pub const CRI_NAMESPACE: &str = "io.kubernetes.cri.sandbox-namespace";
pub const CRI_POD: &str = "io.kubernetes.cri.sandbox-name";
pub const CRI_CONTAINER: &str = "io.kubernetes.cri.container-name";
/// The pod sandbox's id, which names the pod's directories of the CRI plugin.
pub const CRI_SANDBOX_ID: &str = "io.kubernetes.cri.sandbox-id";
/// The CRI plugin's directory under containerd's root and under its state directory
/// (`/var/lib/containerd/...`, `/run/containerd/...`): a pod's files are in
/// `sandboxes/<sandbox id>/` of it.
const CRI_PLUGIN_DIR: &str = "io.containerd.grpc.v1.cri";

/// A part of the spec airlock refuses: the field, and the rule it breaks.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("config.json {field}: {rule}")]
pub struct SpecRefusal {
    pub field: String,
    pub rule: String,
}

fn refuse<T>(field: impl Into<String>, rule: impl Into<String>) -> Result<T, SpecRefusal> {
    Err(SpecRefusal {
        field: field.into(),
        rule: rule.into(),
    })
}

/// Who the container is, for its records: the pod's identity from the CRI annotations,
/// or (a container started without Kubernetes, e.g. by `ctr`) the container id alone.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ContainerIdentity {
    pub id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub container: Option<String>,
}

/// How the platform chose the container's contract.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Selection {
    /// `airlock.dev/contract`: an operator contract by name.
    Contract(String),
    /// `airlock.dev/class`: a workload class by name.
    Class(String),
    /// Neither: the operator's default contract for containers.
    Default,
}

/// What the spec asks of the cell, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerTerms {
    pub argv: Vec<String>,
    /// `NAME=value` entries as `(name, value)`.
    pub env: Vec<(String, String)>,
    pub cwd: PathBuf,
    /// `None` for uid 0: the contract's identity applies.
    pub user: Option<(u32, u32)>,
    /// The root file system's directory on the host (absolute).
    pub rootfs: PathBuf,
    pub readonly_root: bool,
    pub hostname: Option<String>,
    /// The network namespace to join (`linux.namespaces[network].path`: a pod's, made by
    /// its CNI plugin); `None`: the cell's own. The contract decides whether it may be
    /// joined ([`apply_terms`]), the cell whether it is a network namespace and not the
    /// host's (crates/cell/src/pod_network.rs).
    pub network_namespace: Option<PathBuf>,
    /// The pod's ipc and uts namespaces to join (CRI gives an application container
    /// `/proc/<sandbox pid>/ns/{ipc,uts}`); allowed as the network's ([`apply_terms`]),
    /// checked by the cell as the network's.
    pub ipc_namespace: Option<PathBuf>,
    pub uts_namespace: Option<PathBuf>,
    /// Host bind mounts accepted as read-only inputs: `(host source, cell target)`.
    pub inputs: Vec<(PathBuf, PathBuf)>,
    /// The pod's own `/etc` files CRI mounts ([`cri_mount`]): `(host source, name under
    /// /etc)`, read-only entries of the cell's `/etc`.
    pub pod_etc_files: Vec<(PathBuf, String)>,
    pub memory_bytes: Option<u64>,
    pub pids: Option<u64>,
    pub cpu_millis: Option<u64>,
    pub open_files: Option<u64>,
    /// The spec's seccomp profile in Docker's JSON form (compile parses and hardens it).
    pub seccomp_profile: Option<String>,
    /// `process.terminal`: the payload's stdio is a pseudo-terminal of the cell's devpts,
    /// whose master goes to the runtime's `--console-socket` (the caller checks that
    /// there is one).
    pub terminal: bool,
    pub selection: Selection,
    pub identity: ContainerIdentity,
    /// `linux.cgroupsPath` as written: the runtime resolves it with its `--systemd-cgroup`
    /// flag ([`crate::cgroups_path::container_cgroup`]).
    pub cgroups_path: Option<String>,
}

/// Capabilities a container gets by default (containerd's and Docker's set): accepted
/// and dropped, since the cell's payload keeps no capability at all.
const DEFAULT_CAPABILITIES: &[&str] = &[
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_FSETID",
    "CAP_FOWNER",
    "CAP_MKNOD",
    "CAP_NET_RAW",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETFCAP",
    "CAP_SETPCAP",
    "CAP_NET_BIND_SERVICE",
    "CAP_SYS_CHROOT",
    "CAP_KILL",
    "CAP_AUDIT_WRITE",
];

/// The kernel file systems a container gets at their usual places; the cell has its own
/// (a fresh `/proc` with masks, its own `/dev`, ...), so the spec's are not mounted.
const CELL_OWN_MOUNTS: &[(&str, &[&str])] = &[
    ("/proc", &["proc"]),
    ("/dev", &["tmpfs"]),
    ("/dev/pts", &["devpts"]),
    ("/dev/shm", &["tmpfs", "shm"]),
    ("/dev/mqueue", &["mqueue"]),
    ("/sys", &["sysfs"]),
    ("/sys/fs/cgroup", &["cgroup", "cgroup2"]),
    ("/run", &["tmpfs"]),
];

/// Host paths no bind mount may come from (or be inside of): the host's kernel
/// interfaces, devices, container runtimes' sockets and state, credentials.
const SENSITIVE_SOURCES: &[&str] = &[
    "/proc",
    "/sys",
    "/dev",
    "/boot",
    "/root",
    "/etc/shadow",
    "/etc/sudoers",
    "/etc/kubernetes",
    "/var/run/docker.sock",
    "/run/docker.sock",
    "/var/run/containerd",
    "/run/containerd",
    "/var/lib/containerd",
    "/var/lib/docker",
    "/var/lib/kubelet/pki",
    "/var/lib/airlock",
    "/run/airlock",
    "/etc/airlock",
];

/// The spec checked against the rules above. `bundle` is the bundle's directory (a
/// relative `root.path` is against it).
pub fn container_terms(
    spec: &Spec,
    id: &str,
    bundle: &Path,
) -> Result<ContainerTerms, SpecRefusal> {
    refuse_host_powers(spec)?;
    let process = match spec.process() {
        Some(process) => process,
        None => return refuse("process", "a container needs a process"),
    };
    check_capabilities(process)?;
    let argv = process.args().clone().unwrap_or_default();
    if argv.is_empty() {
        return refuse("process.args", "a container needs a command");
    }
    let env = process
        .env()
        .iter()
        .flatten()
        .filter_map(|e| e.split_once('='))
        .map(|(n, v)| (n.to_owned(), v.to_owned()))
        .collect();
    let user = process.user();
    let user = (user.uid() != 0).then(|| (user.uid(), user.gid()));
    let root = match spec.root() {
        Some(root) => root,
        None => return refuse("root", "a container needs a root file system"),
    };
    let rootfs = if root.path().is_absolute() {
        root.path().clone()
    } else {
        bundle.join(root.path())
    };
    let (memory_bytes, pids, cpu_millis) = resources(spec)?;
    let annotations: BTreeMap<String, String> = spec
        .annotations()
        .clone()
        .unwrap_or_default()
        .into_iter()
        .collect();
    let pod = CriPod::of(&annotations);
    let mounts = mounts(spec.mounts().as_deref().unwrap_or_default(), &pod)?;
    Ok(ContainerTerms {
        argv,
        env,
        cwd: process.cwd().clone(),
        user,
        rootfs,
        readonly_root: root.readonly().unwrap_or(false),
        hostname: hostname(spec)?,
        network_namespace: namespace_path(spec, LinuxNamespaceType::Network)?,
        ipc_namespace: namespace_path(spec, LinuxNamespaceType::Ipc)?,
        uts_namespace: namespace_path(spec, LinuxNamespaceType::Uts)?,
        inputs: mounts.inputs,
        pod_etc_files: mounts.etc_files,
        memory_bytes,
        pids,
        cpu_millis,
        open_files: open_files(spec),
        terminal: process.terminal().unwrap_or(false),
        seccomp_profile: seccomp_profile(spec)?,
        selection: selection(&annotations)?,
        identity: identity(id, &annotations),
        cgroups_path: spec
            .linux()
            .as_ref()
            .and_then(|l| l.cgroups_path().clone())
            .map(|p| p.to_string_lossy().into_owned()),
    })
}

/// Host root, host namespaces, devices, hooks and sysctls: each would give the container
/// something of the host that the cell does not have.
fn refuse_host_powers(spec: &Spec) -> Result<(), SpecRefusal> {
    if spec.hooks().as_ref().is_some_and(|h| {
        h.prestart().is_some()
            || h.create_runtime().is_some()
            || h.create_container().is_some()
            || h.start_container().is_some()
            || h.poststart().is_some()
            || h.poststop().is_some()
    }) {
        return refuse(
            "hooks",
            "hooks run host commands outside the cell; airlock runs none",
        );
    }
    let Some(linux) = spec.linux() else {
        return Ok(());
    };
    for (field, maps) in [
        ("linux.uidMappings", linux.uid_mappings()),
        ("linux.gidMappings", linux.gid_mappings()),
    ] {
        if maps.iter().flatten().any(|m| m.host_id() == 0) {
            return refuse(
                field,
                "a mapping onto host id 0 would make the container's user host root; \
                 the cell's ids map to its own unprivileged host ids",
            );
        }
    }
    for ns in linux.namespaces().iter().flatten() {
        if let (Some(path), Some(rule)) = (ns.path(), joined_namespace_rule(ns.typ())) {
            return refuse(namespace_field(ns.typ(), path), rule);
        }
    }
    if linux.devices().as_ref().is_some_and(|d| !d.is_empty()) {
        return refuse(
            "linux.devices",
            "host devices are never given to a cell (it has its own /dev: null, zero, \
             full, random, urandom, tty)",
        );
    }
    if linux.sysctl().as_ref().is_some_and(|s| !s.is_empty()) {
        return refuse(
            "linux.sysctl",
            "kernel parameters are not set by airlock's OCI runtime",
        );
    }
    Ok(())
}

/// Why a namespace of `kind` given by path is not joined; `None` for a pod's network,
/// ipc and uts namespaces, which are (under a contract that allows it).
fn joined_namespace_rule(kind: LinuxNamespaceType) -> Option<&'static str> {
    match kind {
        // CRI gives a pod's application containers /proc/<sandbox pid>/ns/{net,ipc,uts}:
        // under airlock that pid is the sandbox's supervisor, which holds its cell's
        // (crates/airlock/src/oci/pod.rs).
        LinuxNamespaceType::Network | LinuxNamespaceType::Ipc | LinuxNamespaceType::Uts => None,
        LinuxNamespaceType::Pid => Some(
            "sharing a pid namespace (shareProcessNamespace, or the host's) would let the \
             container see and signal processes that are not its own; the cell has its \
             own pid namespace",
        ),
        LinuxNamespaceType::User
        | LinuxNamespaceType::Mount
        | LinuxNamespaceType::Cgroup
        | LinuxNamespaceType::Time => Some(
            "joining an existing namespace would share it with the host or another \
             container; the cell always creates its own",
        ),
    }
}

fn namespace_field(kind: LinuxNamespaceType, path: &Path) -> String {
    let kind = format!("{kind:?}").to_lowercase();
    format!("linux.namespaces[{kind}].path ({})", path.display())
}

/// The path of the namespace of `kind` the spec names, an absolute path.
fn namespace_path(spec: &Spec, kind: LinuxNamespaceType) -> Result<Option<PathBuf>, SpecRefusal> {
    let namespaces = spec.linux().as_ref().and_then(|l| l.namespaces().clone());
    let path = namespaces
        .unwrap_or_default()
        .into_iter()
        .filter(|ns| ns.typ() == kind)
        .find_map(|ns| ns.path().clone());
    match path {
        Some(path) if !path.is_absolute() => refuse(
            namespace_field(kind, &path),
            "a namespace path must be absolute",
        ),
        path => Ok(path),
    }
}

/// The spec's host name; none with a joined uts namespace, whose host name is the pod's
/// (as runc, which refuses to set one there).
fn hostname(spec: &Spec) -> Result<Option<String>, SpecRefusal> {
    let hostname = spec.hostname().clone().filter(|h| !h.is_empty());
    match (hostname, namespace_path(spec, LinuxNamespaceType::Uts)?) {
        (Some(_), Some(path)) => refuse(
            "hostname",
            format!(
                "a container joining the uts namespace {} has the pod's host name; it \
                 cannot set its own",
                path.display()
            ),
        ),
        (hostname, _) => Ok(hostname),
    }
}

/// Every capability set may hold only the container default set (a container's process
/// and an `exec`'s alike).
pub fn check_capabilities(process: &Process) -> Result<(), SpecRefusal> {
    let Some(caps) = process.capabilities().clone() else {
        return Ok(());
    };
    let sets = [
        ("bounding", caps.bounding()),
        ("effective", caps.effective()),
        ("inheritable", caps.inheritable()),
        ("permitted", caps.permitted()),
        ("ambient", caps.ambient()),
    ];
    for (set, values) in sets {
        let mut names: Vec<String> = values
            .iter()
            .flatten()
            .map(|c| {
                serde_json::to_value(c)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_owned))
            })
            .map(Option::unwrap_or_default)
            .filter(|name| !DEFAULT_CAPABILITIES.contains(&name.as_str()))
            .collect();
        names.sort();
        if let Some(name) = names.first() {
            return refuse(
                format!("process.capabilities.{set}"),
                format!(
                    "{name} is beyond the container default set (a privileged container); \
                     a cell's payload holds no capability"
                ),
            );
        }
    }
    Ok(())
}

/// Memory, pids and CPU as ceilings.
#[allow(clippy::type_complexity)]
fn resources(spec: &Spec) -> Result<(Option<u64>, Option<u64>, Option<u64>), SpecRefusal> {
    let Some(resources) = spec.linux().as_ref().and_then(|l| l.resources().clone()) else {
        return Ok((None, None, None));
    };
    let memory = resources
        .memory()
        .as_ref()
        .and_then(|m| m.limit())
        .filter(|l| *l > 0)
        .map(|l| l as u64);
    let pids = resources
        .pids()
        .as_ref()
        .map(|p| p.limit())
        .filter(|l| *l > 0)
        .map(|l| l as u64);
    let cpu = resources.cpu().as_ref().and_then(|cpu| {
        let quota = cpu.quota().filter(|q| *q > 0)?;
        let period = cpu.period().filter(|p| *p > 0).unwrap_or(100_000);
        Some((quota as u64 * 1000).div_ceil(period))
    });
    Ok((memory, pids, cpu))
}

fn open_files(spec: &Spec) -> Option<u64> {
    let process = spec.process().as_ref()?;
    process
        .rlimits()
        .iter()
        .flatten()
        .find(|r| r.typ() == PosixRlimitType::RlimitNofile)
        .map(|r| r.hard().min(r.soft()))
}

/// The spec's mounts as the cell takes them.
#[derive(Debug, Default)]
struct SpecMounts {
    inputs: Vec<(PathBuf, PathBuf)>,
    etc_files: Vec<(PathBuf, String)>,
}

/// The pod a CRI container belongs to, from its annotations: what its standard mounts'
/// sources must name. A container without them (started by `ctr`) has none.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CriPod {
    pub sandbox_id: Option<String>,
    pub container: Option<String>,
}

impl CriPod {
    fn of(annotations: &BTreeMap<String, String>) -> CriPod {
        let get = |key: &str| annotations.get(key).filter(|v| !v.is_empty()).cloned();
        CriPod {
            sandbox_id: get(CRI_SANDBOX_ID),
            container: get(CRI_CONTAINER),
        }
    }
}

/// What one of CRI's standard mounts of a pod's container becomes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CriMount {
    /// The pod's own file of this name under `/etc`, read-only (even when the spec says
    /// rw: the container reads its hosts, host name and resolver, it never writes them).
    EtcFile(&'static str),
    /// Not mounted: the cell's own. `/dev/shm` (the sandbox's shm tmpfs under runc: a
    /// cell has its own, counted in its memory) and `/dev/termination-log` (kubelet's
    /// file: the cell's `/dev` has none, so kubelet reads an empty message).
    CellOwn,
}

/// One of CRI's standard mounts, recognised by its destination *and* its source (the
/// CRI plugin's or kubelet's directory of this pod, `..` never): containerd's
/// `<root>/io.containerd.grpc.v1.cri/sandboxes/<sandbox id>/{hosts,hostname,resolv.conf}`
/// and `<state>/io.containerd.grpc.v1.cri/sandboxes/<sandbox id>/shm`
/// (the CRI plugin's `containerMounts` of containerd 1.6, and the sandbox's own spec), kubelet's `<kubelet root>/pods/<pod uid>/etc-hosts` and
/// `<kubelet root>/pods/<pod uid>/containers/<container>/<file>` (its termination log).
/// `None`: not one of them; the general rules apply.
pub fn cri_mount(destination: &Path, source: &Path, pod: &CriPod) -> Option<CriMount> {
    let names: Vec<&str> = source
        .components()
        .map(|c| c.as_os_str().to_str().unwrap_or("\0"))
        .collect();
    if !source.is_absolute() || names.iter().any(|n| *n == ".." || *n == "\0") {
        return None;
    }
    let sandbox = |file: &str| {
        let id = pod.sandbox_id.as_deref()?;
        names
            .ends_with(&[CRI_PLUGIN_DIR, "sandboxes", id, file])
            .then_some(())
    };
    let kubelet_hosts = || {
        let n = names.len();
        (n >= 4 && names[n - 3] == "pods" && names[n - 1] == "etc-hosts").then_some(())
    };
    let termination_log = || {
        let (n, container) = (names.len(), pod.container.as_deref()?);
        (n >= 6 && names[n - 5] == "pods" && names[n - 3] == "containers")
            .then_some(())
            .filter(|()| names[n - 2] == container)
    };
    match destination.to_str()? {
        "/etc/hosts" => sandbox("hosts")
            .or_else(kubelet_hosts)
            .map(|()| CriMount::EtcFile("hosts")),
        "/etc/hostname" => sandbox("hostname").map(|()| CriMount::EtcFile("hostname")),
        "/etc/resolv.conf" => sandbox("resolv.conf").map(|()| CriMount::EtcFile("resolv.conf")),
        "/dev/shm" => sandbox("shm").map(|()| CriMount::CellOwn),
        "/dev/termination-log" => termination_log().map(|()| CriMount::CellOwn),
        _ => None,
    }
}

/// The mounts: the cell's own kernel file systems, CRI's standard mounts, read-only host
/// binds as inputs, anything else refused.
fn mounts(mounts: &[Mount], pod: &CriPod) -> Result<SpecMounts, SpecRefusal> {
    let mut taken = SpecMounts::default();
    for (n, mount) in mounts.iter().enumerate() {
        let destination = mount.destination();
        let typ = mount.typ().clone().unwrap_or_default();
        let options = mount.options().clone().unwrap_or_default();
        let field = format!("mounts[{n}] ({})", destination.display());
        let is_bind = typ == "bind" || options.iter().any(|o| o == "bind" || o == "rbind");
        if !is_bind {
            let own = CELL_OWN_MOUNTS
                .iter()
                .any(|(d, types)| Path::new(d) == destination && types.contains(&typ.as_str()));
            if own {
                continue;
            }
            return refuse(
                field,
                format!(
                    "a {typ:?} mount is not one the cell provides itself; writable places \
                     are the contract's writable_paths"
                ),
            );
        }
        let Some(source) = mount.source() else {
            return refuse(field, "a bind mount needs a source");
        };
        if !source.is_absolute() {
            return refuse(field, "a bind mount's source must be an absolute host path");
        }
        match cri_mount(destination, source, pod) {
            Some(CriMount::EtcFile(name)) => {
                taken.etc_files.push((source.clone(), name.to_owned()));
                continue;
            }
            Some(CriMount::CellOwn) => continue,
            None => {}
        }
        if source
            .components()
            .any(|c| c == std::path::Component::ParentDir)
        {
            return refuse(
                field,
                "a bind mount's source must not contain `..` (it could name any host path)",
            );
        }
        if let Some(sensitive) = sensitive_source(source) {
            return refuse(
                field,
                format!(
                    "the host path {} is under {sensitive}, which is never given to a cell",
                    source.display()
                ),
            );
        }
        if !options.iter().any(|o| o == "ro") {
            return refuse(
                field,
                "a writable host bind mount would let the container change the host; host \
                 paths are read-only inputs (add \"ro\"), writable places the contract's \
                 writable_paths",
            );
        }
        taken.inputs.push((source.clone(), destination.clone()));
    }
    Ok(taken)
}

/// The sensitive path `source` is, or is inside of (`/` itself is the whole host).
fn sensitive_source(source: &Path) -> Option<&'static str> {
    if source == Path::new("/") {
        return Some("/");
    }
    SENSITIVE_SOURCES
        .iter()
        .find(|s| source.starts_with(s))
        .copied()
}

fn seccomp_profile(spec: &Spec) -> Result<Option<String>, SpecRefusal> {
    let Some(seccomp) = spec.linux().as_ref().and_then(|l| l.seccomp().clone()) else {
        return Ok(None);
    };
    let value = serde_json::to_value(&seccomp).map_err(|e| SpecRefusal {
        field: "linux.seccomp".into(),
        rule: format!("cannot be read as a profile: {e}"),
    })?;
    let default = value["defaultAction"].as_str().unwrap_or_default();
    if matches!(default, "SCMP_ACT_ALLOW" | "SCMP_ACT_LOG") {
        return refuse(
            "linux.seccomp.defaultAction",
            format!(
                "{default} allows every system call the profile does not name, which is \
                 weaker than airlock's default (an allowlist)"
            ),
        );
    }
    Ok(Some(value.to_string()))
}

fn selection(annotations: &BTreeMap<String, String>) -> Result<Selection, SpecRefusal> {
    let named = |key: &str| annotations.get(key).filter(|v| !v.is_empty()).cloned();
    match (named(CONTRACT_ANNOTATION), named(CLASS_ANNOTATION)) {
        (Some(_), Some(_)) => refuse(
            format!("annotations[{CONTRACT_ANNOTATION}]"),
            format!("excludes {CLASS_ANNOTATION}: a class makes the contract"),
        ),
        (Some(name), None) => valid_name(CONTRACT_ANNOTATION, name).map(Selection::Contract),
        (None, Some(name)) => valid_name(CLASS_ANNOTATION, name).map(Selection::Class),
        (None, None) => Ok(Selection::Default),
    }
}

/// A contract or class name is a file name of the operator's directory, never a path.
fn valid_name(key: &str, name: String) -> Result<String, SpecRefusal> {
    let ok = name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        && !name.starts_with('.');
    if ok {
        Ok(name)
    } else {
        refuse(
            format!("annotations[{key}]"),
            format!("{name:?} is not a name (letters, digits, '-', '_', '.'; no path)"),
        )
    }
}

fn identity(id: &str, annotations: &BTreeMap<String, String>) -> ContainerIdentity {
    let get = |key: &str| annotations.get(key).cloned();
    ContainerIdentity {
        id: id.to_owned(),
        namespace: get(CRI_NAMESPACE),
        pod: get(CRI_POD),
        container: get(CRI_CONTAINER),
    }
}

/// The contract with the spec's terms applied: inputs added, the root read-only if the
/// spec asks, ceilings lowered, the spec's seccomp profile as the custom profile. The
/// image is the bundle's root (the caller resolves it as `CompileInput::image`).
pub fn apply_terms(
    contract: &mut Contract,
    terms: &ContainerTerms,
    seccomp_path: &str,
) -> Result<(), SpecRefusal> {
    if contract.image != HOST_IMAGE {
        return refuse(
            "root.path",
            format!(
                "the contract names the image {}, but a container's root is its bundle's",
                contract.image
            ),
        );
    }
    check_pod_network(contract.network.mode, terms.network_namespace.as_deref())?;
    check_pod_shares(contract.network.mode, terms)?;
    contract.image = format!("oci-bundle:{}", terms.identity.id);
    contract.filesystem.readonly_root |= terms.readonly_root;
    for (source, target) in &terms.inputs {
        contract
            .filesystem
            .readonly_inputs
            .push(ReadonlyInput::Mapped(MappedInput {
                source: source.display().to_string(),
                target: target.display().to_string(),
            }));
    }
    let lower = |current: &mut i64, spec: Option<u64>| {
        if let Some(spec) = spec {
            *current = (*current).min(i64::try_from(spec).unwrap_or(i64::MAX));
        }
    };
    let r = &mut contract.resources;
    lower(
        &mut r.memory_mb,
        terms.memory_bytes.map(|b| b.div_ceil(1 << 20)),
    );
    lower(&mut r.process_limit, terms.pids);
    lower(&mut r.cpu_millis, terms.cpu_millis);
    lower(&mut r.open_files, terms.open_files);
    if let Some(hostname) = &terms.hostname {
        contract.hostname = hostname.clone();
    }
    contract.terminal |= terms.terminal;
    if terms.seccomp_profile.is_some() {
        if contract.seccomp_profile != "default" {
            return refuse(
                "linux.seccomp",
                format!(
                    "the contract names its own seccomp profile ({}); two custom profiles \
                     are not merged",
                    contract.seccomp_profile
                ),
            );
        }
        contract.seccomp_profile = seccomp_path.to_owned();
    }
    Ok(())
}

/// A pod's ipc and uts namespaces and its `/etc` files are taken only under a contract
/// that joins the pod's network (`network.mode: pod`): the same platform decision, since
/// they are the same pod's. Without it they are refused, naming what was asked.
fn check_pod_shares(mode: NetworkMode, terms: &ContainerTerms) -> Result<(), SpecRefusal> {
    if mode == NetworkMode::Pod {
        return Ok(());
    }
    let rule = "is a pod's, taken only under a contract with network.mode pod, which the \
                platform chooses (docs/kubernetes.md)";
    let namespaces = [
        (LinuxNamespaceType::Ipc, &terms.ipc_namespace),
        (LinuxNamespaceType::Uts, &terms.uts_namespace),
    ];
    for (kind, path) in namespaces {
        if let Some(path) = path {
            return refuse(namespace_field(kind, path), rule);
        }
    }
    match terms.pod_etc_files.first() {
        Some((source, name)) => refuse(
            format!("mounts (/etc/{name} from {})", source.display()),
            rule,
        ),
        None => Ok(()),
    }
}

impl ContainerTerms {
    /// The pod as `CompileInput::pod_network`: `None` without a pod network namespace.
    pub fn pod_input(&self) -> Option<airlock_contract::PodInput<'_>> {
        Some(airlock_contract::PodInput {
            network: self.network_namespace.as_deref()?,
            ipc: self.ipc_namespace.as_deref(),
            uts: self.uts_namespace.as_deref(),
            etc_files: &self.pod_etc_files,
        })
    }
}

/// A pod's network is joined only under a contract that says so (the platform's choice:
/// the pod's author only names a path), and a contract that says so runs only in one.
/// The caller compiles with the path as `CompileInput::pod_network`.
fn check_pod_network(mode: NetworkMode, namespace: Option<&Path>) -> Result<(), SpecRefusal> {
    match (mode, namespace) {
        (NetworkMode::Pod, Some(_)) | (NetworkMode::Deny | NetworkMode::Allowlist, None) => Ok(()),
        (NetworkMode::Pod, None) => refuse(
            "linux.namespaces[network]",
            "the contract's network.mode pod joins the pod's network namespace, and the \
             spec names none (no path)",
        ),
        (mode, Some(path)) => refuse(
            namespace_field(LinuxNamespaceType::Network, path),
            format!(
                "the contract's network.mode {} does not allow joining a pod's network; \
                 that needs a contract with network.mode pod, which the platform chooses \
                 (docs/kubernetes.md)",
                if mode == NetworkMode::Deny {
                    "deny"
                } else {
                    "allowlist"
                }
            ),
        ),
    }
}
