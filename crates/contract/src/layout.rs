//! How a cell builds its root and confines itself, every decision as data: the steps of
//! its root filesystem (mounts with their flags, `/dev`, the generated `/etc`, the `/proc`
//! masks) in the order the runtime applies them, its rlimits, securebits and Landlock
//! rules. [`crate::compile`] fills these in; the runtime walks them.

use crate::plan::{CellPlan, EtcEntry, Limits, MountPlan, NetworkPlan};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// One step of building the cell's root, in order. Until [`RootStep::PivotRoot`] the
/// targets are paths of the new root being staged; after it, of the cell.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "step", rename_all = "snake_case")]
pub enum RootStep {
    Mount(MountSpec),
    /// The staged tmpfs becomes the root; the host's root is detached in the background.
    PivotRoot,
    Symlink {
        link: PathBuf,
        target: PathBuf,
    },
    /// The host device nodes the supervisor cloned ([`CellLayout::dev_nodes`]).
    DeviceNodes,
    /// A file the runtime generates (the `/etc` entries of [`crate::ETC_GENERATED`]).
    WriteFile {
        path: PathBuf,
        text: String,
    },
    /// Hides a `/proc` path; skipped when this kernel has no such path. `flags` are
    /// those of an [`ProcMask::EmptyDir`] tmpfs (a bind of `/dev/null` keeps its own).
    MaskProc {
        path: PathBuf,
        with: ProcMask,
        flags: MountFlags,
    },
    /// Re-binds a `/proc` path with `flags` (with its submounts); skipped when absent.
    ReadonlyProc {
        path: PathBuf,
        flags: MountFlags,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProcMask {
    /// An empty read-only tmpfs over a directory.
    EmptyDir,
    /// `/dev/null` bound over a file.
    DevNull,
}

/// A mount the cell makes itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MountSpec {
    pub target: PathBuf,
    #[serde(flatten)]
    pub kind: MountKind,
    pub flags: MountFlags,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum MountKind {
    Tmpfs {
        size_bytes: u64,
        mode: u32,
    },
    Proc,
    /// A new devpts instance of the cell's own (`newinstance`).
    Devpts {
        ptmx_mode: u32,
        mode: u32,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct MountFlags {
    pub readonly: bool,
    pub nosuid: bool,
    pub nodev: bool,
    pub noexec: bool,
}

impl MountFlags {
    const NOSUID_NODEV: MountFlags = MountFlags {
        readonly: false,
        nosuid: true,
        nodev: true,
        noexec: false,
    };
    const NOSUID_NOEXEC: MountFlags = MountFlags {
        readonly: false,
        nosuid: true,
        nodev: false,
        noexec: true,
    };
    const HIDDEN: MountFlags = MountFlags {
        readonly: false,
        nosuid: true,
        nodev: true,
        noexec: true,
    };
    const READONLY: MountFlags = MountFlags {
        readonly: true,
        ..MountFlags::NOSUID_NODEV
    };
    const READONLY_NOEXEC: MountFlags = MountFlags {
        readonly: true,
        ..MountFlags::HIDDEN
    };
}

/// The restrictions of the mount trees the supervisor clones for the cell, set on each
/// whole tree (submounts included), and of the root once it is built.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct TreeFlags {
    /// The host image's directories.
    pub system: MountFlags,
    /// Read-only inputs: executable, since an input may be the script the payload runs.
    pub inputs: MountFlags,
    /// `/etc` entries: configuration, never code.
    pub etc: MountFlags,
    /// The cell's own cgroup under `/sys/fs/cgroup`.
    pub cgroup_view: MountFlags,
    /// Device nodes must not be nodev, and read-only would not stop writes to them
    /// anyway: nosuid and noexec are what apply.
    pub dev_nodes: MountFlags,
    /// The root after setup, when the plan's root is read-only (the root mount alone).
    pub root: MountFlags,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RlimitResource {
    Core,
    Nofile,
    Fsize,
    Nproc,
    /// Only in [`crate::RlimitsOnly`]: the address space of each payload process.
    As,
    /// Only in [`crate::RlimitsOnly`]: seconds of CPU time of each payload process. The
    /// soft limit is `value` (SIGXCPU, which ends a process that does not handle it), the
    /// hard one a second later (SIGKILL).
    Cpu,
}

impl RlimitResource {
    /// As the kernel's headers name it (`RLIMIT_AS`).
    pub fn kernel_name(self) -> &'static str {
        match self {
            RlimitResource::Core => "RLIMIT_CORE",
            RlimitResource::Nofile => "RLIMIT_NOFILE",
            RlimitResource::Fsize => "RLIMIT_FSIZE",
            RlimitResource::Nproc => "RLIMIT_NPROC",
            RlimitResource::As => "RLIMIT_AS",
            RlimitResource::Cpu => "RLIMIT_CPU",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rlimit {
    pub resource: RlimitResource,
    /// Soft and hard limit alike.
    pub value: u64,
}

/// The securebits the cell locks (`prctl(PR_SET_SECUREBITS)`), by their kernel names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Securebit {
    Noroot,
    NorootLocked,
    NoSetuidFixup,
    NoSetuidFixupLocked,
    KeepCapsLocked,
    NoCapAmbientRaise,
    NoCapAmbientRaiseLocked,
}

impl Securebit {
    /// The bit's value (linux/securebits.h).
    pub fn bit(self) -> u64 {
        1 << match self {
            Securebit::Noroot => 0,
            Securebit::NorootLocked => 1,
            Securebit::NoSetuidFixup => 2,
            Securebit::NoSetuidFixupLocked => 3,
            Securebit::KeepCapsLocked => 5,
            Securebit::NoCapAmbientRaise => 6,
            Securebit::NoCapAmbientRaiseLocked => 7,
        }
    }
}

/// A Landlock filesystem right (the `LANDLOCK_ACCESS_FS_*` of ABI 6).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FsAccess {
    Execute,
    WriteFile,
    ReadFile,
    ReadDir,
    RemoveDir,
    RemoveFile,
    MakeChar,
    MakeDir,
    MakeReg,
    MakeSock,
    MakeFifo,
    MakeBlock,
    MakeSym,
    Refer,
    Truncate,
    IoctlDev,
}

impl FsAccess {
    /// Every right of the ABI, in bit order.
    pub const ALL: [FsAccess; 16] = [
        FsAccess::Execute,
        FsAccess::WriteFile,
        FsAccess::ReadFile,
        FsAccess::ReadDir,
        FsAccess::RemoveDir,
        FsAccess::RemoveFile,
        FsAccess::MakeChar,
        FsAccess::MakeDir,
        FsAccess::MakeReg,
        FsAccess::MakeSock,
        FsAccess::MakeFifo,
        FsAccess::MakeBlock,
        FsAccess::MakeSym,
        FsAccess::Refer,
        FsAccess::Truncate,
        FsAccess::IoctlDev,
    ];

    /// The rights that apply to a file (not a directory) beneath a rule.
    pub fn on_file(self) -> bool {
        matches!(
            self,
            FsAccess::Execute
                | FsAccess::WriteFile
                | FsAccess::ReadFile
                | FsAccess::Truncate
                | FsAccess::IoctlDev
        )
    }

    /// The right's bit (linux/landlock.h).
    pub fn bit(self) -> u64 {
        1 << (self as u32)
    }
}

/// One Landlock rule: `access` beneath `path`. A path the cell lacks gets no rule, and no
/// rule means no access.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LandlockRule {
    pub path: PathBuf,
    pub access: Vec<FsAccess>,
}

/// The cell's Landlock ruleset: every right of [`FsAccess::ALL`] is handled (denied
/// unless a rule grants it), and signals and abstract unix sockets are scoped to the cell.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct LandlockPlan {
    pub rules: Vec<LandlockRule>,
    pub scope_signals: bool,
    pub scope_abstract_unix_sockets: bool,
}

/// How the cell builds its root and confines itself (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct CellLayout {
    pub root_steps: Vec<RootStep>,
    /// Host device nodes cloned into `/dev` (nosuid, noexec: they must not be nodev).
    pub dev_nodes: Vec<PathBuf>,
    pub trees: TreeFlags,
    pub rlimits: Vec<Rlimit>,
    pub securebits: Vec<Securebit>,
    pub landlock: LandlockPlan,
}

/// The device nodes of every cell.
pub const DEVICE_NODES: &[&str] = &["null", "zero", "full", "random", "urandom", "tty"];
/// Where POSIX shared memory lives (`shm_open`, Python's `SharedMemory`).
pub const SHM: &str = "/dev/shm";
const DEV_SIZE_BYTES: u64 = 64 * 1024;
/// Docker's masked `/proc` paths: directories get an empty read-only tmpfs, files
/// `/dev/null`. Paths this kernel lacks are skipped.
const PROC_MASKED_DIRS: &[&str] = &["acpi", "asound", "scsi"];
const PROC_MASKED_FILES: &[&str] = &[
    "interrupts",
    "kcore",
    "keys",
    "latency_stats",
    "sched_debug",
    "timer_list",
    "timer_stats",
];
const PROC_READONLY: &[&str] = &["bus", "fs", "irq", "sys", "sysrq-trigger"];

/// The layout of `plan` (everything but this field already decided).
pub(crate) fn cell_layout(plan: &CellPlan) -> CellLayout {
    CellLayout {
        root_steps: root_steps(plan),
        dev_nodes: DEVICE_NODES
            .iter()
            .map(|n| Path::new("/dev").join(n))
            .collect(),
        trees: TreeFlags {
            system: MountFlags::READONLY,
            inputs: MountFlags::READONLY,
            etc: MountFlags::READONLY_NOEXEC,
            cgroup_view: MountFlags::READONLY_NOEXEC,
            dev_nodes: MountFlags::NOSUID_NOEXEC,
            root: MountFlags::READONLY,
        },
        rlimits: rlimits(&plan.limits),
        securebits: vec![
            Securebit::Noroot,
            Securebit::NorootLocked,
            Securebit::NoSetuidFixup,
            Securebit::NoSetuidFixupLocked,
            Securebit::KeepCapsLocked,
            Securebit::NoCapAmbientRaise,
            Securebit::NoCapAmbientRaiseLocked,
        ],
        landlock: LandlockPlan {
            rules: landlock_rules(plan),
            scope_signals: true,
            scope_abstract_unix_sockets: true,
        },
    }
}

fn tmpfs(target: &str, size_bytes: u64, mode: u32, flags: MountFlags) -> RootStep {
    RootStep::Mount(MountSpec {
        target: target.into(),
        kind: MountKind::Tmpfs { size_bytes, mode },
        flags,
    })
}

fn root_steps(plan: &CellPlan) -> Vec<RootStep> {
    let mut steps = vec![
        tmpfs("/", plan.rootfs.size_bytes, 0o755, MountFlags::NOSUID_NODEV),
        // A new proc is only allowed while a fully visible one exists in the namespace:
        // the host's, until the old root is detached.
        RootStep::Mount(MountSpec {
            target: "/proc".into(),
            kind: MountKind::Proc,
            flags: MountFlags::HIDDEN,
        }),
        RootStep::PivotRoot,
        tmpfs("/dev", DEV_SIZE_BYTES, 0o755, MountFlags::NOSUID_NOEXEC),
    ];
    for (name, target) in [
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
        ("ptmx", "pts/ptmx"),
    ] {
        steps.push(RootStep::Symlink {
            link: Path::new("/dev").join(name),
            target: target.into(),
        });
    }
    steps.push(RootStep::Mount(MountSpec {
        target: "/dev/pts".into(),
        kind: MountKind::Devpts {
            ptmx_mode: 0o666,
            mode: 0o620,
        },
        flags: MountFlags::NOSUID_NOEXEC,
    }));
    // Its pages are memory of the cell's cgroup; filling it is the `shm` ceiling.
    steps.push(tmpfs(
        SHM,
        plan.limits.shm_bytes,
        0o1777,
        MountFlags::HIDDEN,
    ));
    steps.push(RootStep::DeviceNodes);
    steps.extend(generated_etc(plan));
    // The masks need /dev/null in place.
    steps.extend(proc_masks());
    for mount in &plan.mounts {
        if let MountPlan::WritableTmpfs {
            target,
            size_bytes,
            exec,
        } = mount
        {
            steps.push(RootStep::Mount(MountSpec {
                target: target.clone(),
                kind: MountKind::Tmpfs {
                    size_bytes: *size_bytes,
                    mode: 0o755,
                },
                flags: writable_flags(*exec),
            }));
        }
    }
    steps
}

/// Flags of a writable tmpfs. nosuid and nodev always: they are what stops a file the
/// payload writes from carrying privilege. `noexec` only when the plan withholds exec: it
/// is no boundary (an interpreter or `memfd_create` + `execve` runs the same code), so it
/// is a choice the contract makes, not a control.
fn writable_flags(exec: bool) -> MountFlags {
    MountFlags {
        noexec: !exec,
        ..MountFlags::NOSUID_NODEV
    }
}

fn proc_masks() -> Vec<RootStep> {
    let proc_path = |name: &str| Path::new("/proc").join(name);
    let dirs = PROC_MASKED_DIRS.iter().map(|name| RootStep::MaskProc {
        path: proc_path(name),
        with: ProcMask::EmptyDir,
        flags: MountFlags::READONLY_NOEXEC,
    });
    let files = PROC_MASKED_FILES.iter().map(|name| RootStep::MaskProc {
        path: proc_path(name),
        with: ProcMask::DevNull,
        flags: MountFlags::default(),
    });
    let readonly = PROC_READONLY.iter().map(|name| RootStep::ReadonlyProc {
        path: proc_path(name),
        flags: MountFlags::READONLY_NOEXEC,
    });
    dirs.chain(files).chain(readonly).collect()
}

/// The generated `/etc`: just enough for name lookups of the cell user and `localhost`.
fn generated_etc(plan: &CellPlan) -> Vec<RootStep> {
    generated_etc_files(plan)
        .into_iter()
        .map(|(name, text)| RootStep::WriteFile {
            path: Path::new("/etc").join(name),
            text,
        })
        .collect()
}

/// The files of the generated `/etc` (name under `/etc`, content), for every tier: the
/// native cell writes them on its root, the gVisor bundle (crates/oci) into its `/etc`.
pub fn generated_etc_files(plan: &CellPlan) -> Vec<(&'static str, String)> {
    let (uid, gid) = (plan.identity.uid, plan.identity.gid);
    let home = plan.workdir.display();
    let hostname = &plan.hostname;
    // A deny cell has no resolver (no resolv.conf, hosts from files only); an
    // allowlisted one asks the in-cell resolver of the transparent egress path.
    // A pod cell asks the pod's resolver (the resolv.conf its runtime gives it).
    let hosts = match plan.network {
        NetworkPlan::Deny => "files",
        NetworkPlan::Allowlist { .. } | NetworkPlan::Pod { .. } => "files dns",
    };
    let mut files = vec![
        ("passwd", format!("cell:x:{uid}:{gid}:airlock cell:{home}:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n")),
        ("group", format!("cell:x:{gid}:\nnogroup:x:65534:\n")),
        ("hosts", format!("127.0.0.1\tlocalhost\n::1\tlocalhost\n127.0.1.1\t{hostname}\n")),
        ("hostname", format!("{hostname}\n")),
        ("nsswitch.conf", format!("passwd: files\ngroup: files\nshadow: files\nhosts: {hosts}\n")),
    ];
    if matches!(plan.network, NetworkPlan::Allowlist { .. }) {
        // The in-cell resolver answers at once (it never asks anyone): one short attempt.
        files.push((
            "resolv.conf",
            format!(
                "# airlock: answers only the allowlisted names, never forwards a query\n\
                 nameserver {}\noptions timeout:2 attempts:1\n",
                crate::TRANSPARENT_DNS.ip()
            ),
        ));
    }
    // A pod's own files (its hosts, hostname and resolv.conf, which airlock's OCI runtime
    // takes from CRI) replace the generated ones: `EtcEntry::Pod` entries (compile.rs).
    files.retain(|(name, _)| !replaced_by_entry(plan, name));
    files
}

fn replaced_by_entry(plan: &CellPlan, name: &str) -> bool {
    let path = Path::new("/etc").join(name);
    plan.etc
        .iter()
        .any(|entry| matches!(entry, EtcEntry::Pod { target, .. } if *target == path))
}

fn rlimits(limits: &Limits) -> Vec<Rlimit> {
    let rlimit = |resource, value| Rlimit { resource, value };
    vec![
        rlimit(RlimitResource::Core, 0),
        rlimit(RlimitResource::Nofile, limits.open_files),
        rlimit(RlimitResource::Fsize, limits.file_size_bytes),
        // Backstop for the pids cgroup; counted per user namespace, so per cell. One above
        // `pids.max`: the kernel checks the rlimit first, and the ceiling that fires must
        // be the cgroup's, which is counted and reported as `pids`.
        rlimit(RlimitResource::Nproc, limits.cell_pids_max() + 1),
    ]
}

/// Every right except execute.
fn all_but_execute() -> Vec<FsAccess> {
    FsAccess::ALL
        .into_iter()
        .filter(|a| *a != FsAccess::Execute)
        .collect()
}

/// The path rules, in order: the payload can read and execute the system tree and
/// inputs, write only its writable paths and device nodes, and execute in a writable path
/// only where the plan allows it. `/dev/shm` is airlock's, not the contract's, and never
/// executable.
fn landlock_rules(plan: &CellPlan) -> Vec<LandlockRule> {
    use FsAccess::*;
    let rule = |path: &Path, access: Vec<FsAccess>| LandlockRule {
        path: path.to_path_buf(),
        access,
    };
    let read = vec![ReadFile, ReadDir];
    let device = vec![ReadFile, WriteFile, IoctlDev];
    let mut rules = vec![
        rule(Path::new("/"), vec![ReadDir]),
        rule(Path::new("/etc"), read.clone()),
        rule(Path::new("/proc"), read.clone()),
        // The cell's own cgroup, read-only (the supervisor's cgroup view).
        rule(Path::new("/sys/fs/cgroup"), read),
        rule(Path::new("/dev"), vec![ReadDir]),
        rule(
            Path::new("/dev/pts"),
            vec![ReadFile, WriteFile, IoctlDev, ReadDir],
        ),
        rule(Path::new(SHM), all_but_execute()),
    ];
    for node in DEVICE_NODES {
        rules.push(rule(&Path::new("/dev").join(node), device.clone()));
    }
    for mount in &plan.mounts {
        let (path, access) = match mount {
            MountPlan::HostSystem { path, .. } | MountPlan::ImageSystem { path, .. } => {
                (path, vec![ReadFile, ReadDir, Execute])
            }
            MountPlan::ReadonlyInput { target, .. } => (target, vec![ReadFile, ReadDir, Execute]),
            MountPlan::WritableTmpfs { target, exec, .. } if *exec => {
                (target, FsAccess::ALL.to_vec())
            }
            MountPlan::WritableTmpfs { target, .. } => (target, all_but_execute()),
            // Connecting to a unix socket is no file access Landlock handles here: the
            // socket needs no rule, and gets none (nothing to read, write or execute).
            MountPlan::BrokerSocket { .. } => continue,
        };
        rules.push(rule(path, access));
    }
    rules
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{compile, parse_contract, CompileInput, ContractFormat};

    fn plan(yaml: &str) -> CellPlan {
        let contract = parse_contract(yaml, ContractFormat::Yaml).unwrap();
        compile(
            &contract,
            &CompileInput::new(Path::new("/jobs"), &["true".to_owned()]),
        )
        .unwrap()
    }

    fn access_of(plan: &CellPlan, path: &str) -> Vec<FsAccess> {
        plan.layout
            .landlock
            .rules
            .iter()
            .find(|r| r.path == Path::new(path))
            .map(|r| r.access.clone())
            .unwrap_or_else(|| panic!("no rule for {path}"))
    }

    #[test]
    fn execute_is_granted_only_on_the_writable_paths_that_allow_it() {
        let plan = plan("filesystem:\n  writable_paths: [work, { path: data, exec: false }]\n");
        assert!(access_of(&plan, "/work").contains(&FsAccess::Execute));
        assert!(!access_of(&plan, "/data").contains(&FsAccess::Execute));
        assert!(access_of(&plan, "/data").contains(&FsAccess::WriteFile));
        assert!(!access_of(&plan, SHM).contains(&FsAccess::Execute));
    }

    #[test]
    fn nothing_outside_the_writable_paths_and_devices_is_writable() {
        let plan = plan("filesystem:\n  writable_paths: [work]\n");
        for rule in &plan.layout.landlock.rules {
            let writable = rule.access.iter().any(|a| {
                matches!(
                    a,
                    FsAccess::WriteFile | FsAccess::MakeReg | FsAccess::RemoveFile
                )
            });
            let path = rule.path.to_str().unwrap();
            let expected = path == "/work" || path.starts_with("/dev/");
            assert_eq!(writable, expected, "{path}: {:?}", rule.access);
        }
    }

    #[test]
    fn writable_paths_are_always_nosuid_and_nodev_and_noexec_only_when_asked() {
        for exec in [true, false] {
            let flags = writable_flags(exec);
            assert!(
                flags.nosuid && flags.nodev && !flags.readonly,
                "exec={exec}"
            );
            assert_eq!(flags.noexec, !exec, "exec={exec}");
        }
    }

    #[test]
    fn the_root_is_staged_pivoted_then_given_dev_etc_proc_masks_and_writable_paths() {
        let plan = plan("filesystem:\n  writable_paths: [tmp, out]\n");
        let kinds: Vec<String> = plan
            .layout
            .root_steps
            .iter()
            .map(|step| match step {
                RootStep::Mount(spec) => format!("mount {}", spec.target.display()),
                RootStep::PivotRoot => "pivot".into(),
                RootStep::Symlink { link, .. } => format!("link {}", link.display()),
                RootStep::DeviceNodes => "devices".into(),
                RootStep::WriteFile { path, .. } => format!("write {}", path.display()),
                RootStep::MaskProc { path, .. } => format!("mask {}", path.display()),
                RootStep::ReadonlyProc { path, .. } => format!("readonly {}", path.display()),
            })
            .collect();
        assert_eq!(
            kinds[..4],
            ["mount /", "mount /proc", "pivot", "mount /dev"]
        );
        assert_eq!(
            kinds[9..13],
            [
                "mount /dev/pts",
                "mount /dev/shm",
                "devices",
                "write /etc/passwd"
            ]
        );
        assert_eq!(kinds[kinds.len() - 2..], ["mount /tmp", "mount /out"]);
        let first_mask = kinds.iter().position(|k| k.starts_with("mask")).unwrap();
        assert!(kinds[..first_mask]
            .iter()
            .all(|k| !k.starts_with("readonly")));
    }

    #[test]
    fn rlimits_and_securebits_are_planned() {
        let plan = plan("resources: { open_files: 100, file_size_mb: 2, process_limit: 10 }\n");
        assert_eq!(
            plan.layout.rlimits,
            [
                Rlimit {
                    resource: RlimitResource::Core,
                    value: 0
                },
                Rlimit {
                    resource: RlimitResource::Nofile,
                    value: 100
                },
                Rlimit {
                    resource: RlimitResource::Fsize,
                    value: 2 << 20
                },
                Rlimit {
                    resource: RlimitResource::Nproc,
                    value: 12
                },
            ]
        );
        let bits = plan
            .layout
            .securebits
            .iter()
            .fold(0, |all, b| all | b.bit());
        // Every securebit but KEEP_CAPS itself (bit 4), each one locked.
        assert_eq!(bits, 0b1110_1111);
    }
}
