//! The cell's seccomp filter as data: a policy (which syscall gets which action, with
//! argument conditions), Docker-format profiles parsed into one, and the compiler from a
//! policy to classic BPF ([`bpf`]). Pure: [`crate::compile`] builds the program into the
//! plan, so a bad custom profile is a contract error before any cell exists, and the
//! runtime only installs what the plan holds.
//!
//! The default policy is Docker's default allowlist (moby's `profiles/seccomp/default.json`) tightened for
//! agents. A Docker-format JSON profile can replace the allowlist, but the hardening rules
//! ([`apply_hardening`]) are applied on top of any profile: a custom profile can only make
//! the cell stricter than the hardening, never weaker.

pub mod bpf;
mod default_filter;
mod syscalls;

pub use bpf::{compile, program_sha256, BpfInsn};
pub use default_filter::{default_summary, DEFAULT_FILTER};
pub use syscalls::X86_64_SYSCALLS;

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// What the filter does with a system call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SeccompAction {
    Allow,
    Errno(u16),
    /// Kills the whole process with SIGSYS: reserved for calls that only an escape attempt
    /// makes (foreign architectures, the x32 ABI).
    KillProcess,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ArgOp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
    /// `(arg & mask) == value`
    MaskedEq(u64),
}

/// One comparison on a syscall argument. `width32` compares only the low 32 bits, which is
/// what the kernel uses for `int`/`unsigned int` arguments: comparing 64 bits there would let
/// a caller dodge the rule by setting high bits (the classic ioctl TIOCSTI bypass).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArgCondition {
    pub index: u8,
    pub op: ArgOp,
    pub value: u64,
    pub width32: bool,
}

/// Conditions that must all hold for `action` to apply.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConditionalRule {
    pub conditions: Vec<ArgCondition>,
    pub action: SeccompAction,
}

/// What happens to one syscall: the first matching conditional rule, else `otherwise`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SyscallPolicy {
    pub rules: Vec<ConditionalRule>,
    pub otherwise: SeccompAction,
}

/// A whole filter: per-syscall policies by number, plus the action for known syscalls not
/// listed. Numbers the kernel does not know at all get ENOSYS, so feature probes in libc
/// fall back instead of failing hard.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SeccompPolicy {
    pub syscalls: BTreeMap<u32, SyscallPolicy>,
    pub default_action: SeccompAction,
}

const EPERM: u16 = libc::EPERM as u16;
pub(crate) const ENOSYS: u16 = libc::ENOSYS as u16;
const EAFNOSUPPORT: u16 = libc::EAFNOSUPPORT as u16;

/// Docker's unconditional allowlist for x86_64 (from `reference/docker-default-seccomp.md`),
/// minus calls the cell never needs. 32-bit-only names are omitted (they do not exist on
/// x86_64 and foreign ABIs are killed anyway).
const DOCKER_ALLOWED: &[&str] = &[
    "accept",
    "accept4",
    "access",
    "adjtimex",
    "alarm",
    "bind",
    "brk",
    "cachestat",
    "capget",
    "capset",
    "chdir",
    "chmod",
    "chown",
    "clock_adjtime",
    "clock_getres",
    "clock_gettime",
    "clock_nanosleep",
    "close",
    "close_range",
    "connect",
    "copy_file_range",
    "creat",
    "dup",
    "dup2",
    "dup3",
    "epoll_create",
    "epoll_create1",
    "epoll_ctl",
    "epoll_ctl_old",
    "epoll_pwait",
    "epoll_pwait2",
    "epoll_wait",
    "epoll_wait_old",
    "eventfd",
    "eventfd2",
    "execve",
    "execveat",
    "exit",
    "exit_group",
    "faccessat",
    "faccessat2",
    "fadvise64",
    "fallocate",
    "fanotify_mark",
    "fchdir",
    "fchmod",
    "fchmodat",
    "fchmodat2",
    "fchown",
    "fchownat",
    "fcntl",
    "fdatasync",
    "fgetxattr",
    "flistxattr",
    "flock",
    "fork",
    "fremovexattr",
    "fsetxattr",
    "fstat",
    "fstatfs",
    "fsync",
    "ftruncate",
    "futex",
    "futex_requeue",
    "futex_wait",
    "futex_waitv",
    "futex_wake",
    "futimesat",
    "getcpu",
    "getcwd",
    "getdents",
    "getdents64",
    "getegid",
    "geteuid",
    "getgid",
    "getgroups",
    "getitimer",
    "getpeername",
    "getpgid",
    "getpgrp",
    "getpid",
    "getppid",
    "getpriority",
    "getrandom",
    "getresgid",
    "getresuid",
    "getrlimit",
    "get_robust_list",
    "getrusage",
    "getsid",
    "getsockname",
    "getsockopt",
    "get_thread_area",
    "gettid",
    "gettimeofday",
    "getuid",
    "getxattr",
    "getxattrat",
    "inotify_add_watch",
    "inotify_init",
    "inotify_init1",
    "inotify_rm_watch",
    "io_cancel",
    "ioctl",
    "io_destroy",
    "io_getevents",
    "io_pgetevents",
    "ioprio_get",
    "ioprio_set",
    "io_setup",
    "io_submit",
    "kill",
    "landlock_add_rule",
    "landlock_create_ruleset",
    "landlock_restrict_self",
    "lchown",
    "lgetxattr",
    "link",
    "linkat",
    "listen",
    "listmount",
    "listxattr",
    "listxattrat",
    "llistxattr",
    "lremovexattr",
    "lseek",
    "lsetxattr",
    "lstat",
    "madvise",
    "map_shadow_stack",
    "membarrier",
    "memfd_create",
    "memfd_secret",
    "mincore",
    "mkdir",
    "mkdirat",
    "mknod",
    "mknodat",
    "mlock",
    "mlock2",
    "mlockall",
    "mmap",
    "mprotect",
    "mq_getsetattr",
    "mq_notify",
    "mq_open",
    "mq_timedreceive",
    "mq_timedsend",
    "mq_unlink",
    "mremap",
    "mseal",
    "msgctl",
    "msgget",
    "msgrcv",
    "msgsnd",
    "msync",
    "munlock",
    "munlockall",
    "munmap",
    "name_to_handle_at",
    "nanosleep",
    "newfstatat",
    "open",
    "openat",
    "openat2",
    "pause",
    "pidfd_open",
    "pidfd_send_signal",
    "pipe",
    "pipe2",
    "pkey_alloc",
    "pkey_free",
    "pkey_mprotect",
    "poll",
    "ppoll",
    "prctl",
    "pread64",
    "preadv",
    "preadv2",
    "prlimit64",
    "process_mrelease",
    "pselect6",
    "pwrite64",
    "pwritev",
    "pwritev2",
    "read",
    "readahead",
    "readlink",
    "readlinkat",
    "readv",
    "recvfrom",
    "recvmmsg",
    "recvmsg",
    "remap_file_pages",
    "removexattr",
    "removexattrat",
    "rename",
    "renameat",
    "renameat2",
    "restart_syscall",
    "rmdir",
    "rseq",
    "rt_sigaction",
    "rt_sigpending",
    "rt_sigprocmask",
    "rt_sigqueueinfo",
    "rt_sigreturn",
    "rt_sigsuspend",
    "rt_sigtimedwait",
    "rt_tgsigqueueinfo",
    "sched_getaffinity",
    "sched_getattr",
    "sched_getparam",
    "sched_get_priority_max",
    "sched_get_priority_min",
    "sched_getscheduler",
    "sched_rr_get_interval",
    "sched_setaffinity",
    "sched_setattr",
    "sched_setparam",
    "sched_setscheduler",
    "sched_yield",
    "seccomp",
    "select",
    "semctl",
    "semget",
    "semop",
    "semtimedop",
    "sendfile",
    "sendmmsg",
    "sendmsg",
    "sendto",
    "setfsgid",
    "setfsuid",
    "setgid",
    "setgroups",
    "setitimer",
    "setpgid",
    "setpriority",
    "setregid",
    "setresgid",
    "setresuid",
    "setreuid",
    "setrlimit",
    "set_robust_list",
    "setsid",
    "setsockopt",
    "set_thread_area",
    "set_tid_address",
    "setuid",
    "setxattr",
    "setxattrat",
    "shmat",
    "shmctl",
    "shmdt",
    "shmget",
    "shutdown",
    "sigaltstack",
    "signalfd",
    "signalfd4",
    "socketpair",
    "splice",
    "stat",
    "statfs",
    "statmount",
    "statx",
    "symlink",
    "symlinkat",
    "sync",
    "sync_file_range",
    "syncfs",
    "sysinfo",
    "tee",
    "tgkill",
    "time",
    "timer_create",
    "timer_delete",
    "timer_getoverrun",
    "timer_gettime",
    "timer_settime",
    "timerfd_create",
    "timerfd_gettime",
    "timerfd_settime",
    "times",
    "tkill",
    "truncate",
    "umask",
    "uname",
    "unlink",
    "unlinkat",
    "uretprobe",
    "utime",
    "utimensat",
    "utimes",
    "vfork",
    "vmsplice",
    "wait4",
    "waitid",
    "write",
    "writev",
    "arch_prctl",
    "modify_ldt",
];

/// Calls no profile may allow: they reach kernel surface an agent never needs and that
/// escapes are built from. Applied on top of every profile, including custom ones.
const ALWAYS_DENIED: &[&str] = &[
    // Namespaces and mounts: a cell must not build a new sandbox-free view of the system.
    "unshare",
    "setns",
    "mount",
    "umount2",
    "pivot_root",
    "chroot",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "move_mount",
    "open_tree",
    "open_tree_attr",
    "mount_setattr",
    // Kernel keyrings are not namespaced per cell.
    "keyctl",
    "add_key",
    "request_key",
    // userfaultfd widens race windows in kernel exploits.
    "userfaultfd",
    // io_uring can open sockets and files without the syscalls this filter inspects.
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    // eBPF and perf are kernel attack surface.
    "bpf",
    "perf_event_open",
    // Debugging other processes, reading their memory or stealing their fds.
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "kcmp",
    "pidfd_getfd",
    "process_madvise",
    // Host administration.
    "kexec_load",
    "kexec_file_load",
    "init_module",
    "finit_module",
    "delete_module",
    "reboot",
    "swapon",
    "swapoff",
    "acct",
    "syslog",
    "quotactl",
    "quotactl_fd",
    "open_by_handle_at",
    "settimeofday",
    "clock_settime",
    "sethostname",
    "setdomainname",
    "iopl",
    "ioperm",
    "lookup_dcookie",
    "fanotify_init",
    "vhangup",
    "uselib",
    "ustat",
    "sysfs",
    "_sysctl",
    "nfsservctl",
    "move_pages",
    "mbind",
    "set_mempolicy",
    "get_mempolicy",
    "set_mempolicy_home_node",
    "lsm_set_self_attr",
    "clone3",
];

const CLONE_NAMESPACE_FLAGS: u64 = (libc::CLONE_NEWNS
    | libc::CLONE_NEWCGROUP
    | libc::CLONE_NEWUTS
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUSER
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWNET) as u64;
const TIOCSTI: u64 = 0x5412;
const TIOCLINUX: u64 = 0x541C;
const AF_UNIX: u64 = libc::AF_UNIX as u64;
const AF_INET: u64 = libc::AF_INET as u64;
const AF_INET6: u64 = libc::AF_INET6 as u64;
const AF_NETLINK: u64 = libc::AF_NETLINK as u64;
const NETLINK_ROUTE: u64 = 0;

pub fn syscall_number(name: &str) -> Option<u32> {
    // Building a policy (at every start of a cell with a custom profile; the default
    // one is compiled at build time) looks up some 350 names; a linear scan of the table
    // for each cost a tenth of a millisecond.
    static BY_NAME: std::sync::OnceLock<Vec<(&str, u32)>> = std::sync::OnceLock::new();
    let by_name = BY_NAME.get_or_init(|| {
        let mut table = X86_64_SYSCALLS.to_vec();
        table.sort_unstable_by_key(|(n, _)| *n);
        table
    });
    by_name
        .binary_search_by_key(&name, |(n, _)| *n)
        .ok()
        .map(|i| by_name[i].1)
}

fn must_number(name: &str) -> u32 {
    syscall_number(name).unwrap_or_else(|| panic!("syscall {name} missing from the x86_64 table"))
}

fn allow() -> SyscallPolicy {
    SyscallPolicy {
        rules: Vec::new(),
        otherwise: SeccompAction::Allow,
    }
}

fn cond32(index: u8, op: ArgOp, value: u64) -> ArgCondition {
    ArgCondition {
        index,
        op,
        value,
        width32: true,
    }
}

/// airlock's built-in policy.
pub fn default_policy() -> SeccompPolicy {
    let mut syscalls = BTreeMap::new();
    for name in DOCKER_ALLOWED {
        syscalls.insert(must_number(name), allow());
    }
    // Docker allows personality only for these execution domains.
    let personality = [0u64, 8, 0x20000, 0x20008, 0xffff_ffff]
        .into_iter()
        .map(|p| ConditionalRule {
            conditions: vec![cond32(0, ArgOp::Eq, p)],
            action: SeccompAction::Allow,
        })
        .collect();
    syscalls.insert(
        must_number("personality"),
        SyscallPolicy {
            rules: personality,
            otherwise: SeccompAction::Errno(EPERM),
        },
    );
    let mut policy = SeccompPolicy {
        syscalls,
        default_action: SeccompAction::Errno(EPERM),
    };
    apply_hardening(&mut policy);
    policy
}

/// Rules every cell gets regardless of the allowlist in use.
pub fn apply_hardening(policy: &mut SeccompPolicy) {
    for name in ALWAYS_DENIED {
        let action = if *name == "clone3" {
            // ENOSYS makes glibc fall back to clone(), whose flags this filter can inspect
            // (clone3 passes them in memory, out of BPF's reach).
            SeccompAction::Errno(ENOSYS)
        } else {
            SeccompAction::Errno(EPERM)
        };
        policy.syscalls.insert(
            must_number(name),
            SyscallPolicy {
                rules: Vec::new(),
                otherwise: action,
            },
        );
    }
    // clone: plain process/thread creation only, never new namespaces.
    policy.syscalls.insert(
        must_number("clone"),
        SyscallPolicy {
            rules: vec![ConditionalRule {
                conditions: vec![ArgCondition {
                    index: 0,
                    op: ArgOp::MaskedEq(CLONE_NAMESPACE_FLAGS),
                    value: 0,
                    width32: false,
                }],
                action: SeccompAction::Allow,
            }],
            otherwise: SeccompAction::Errno(EPERM),
        },
    );
    // ioctl: no terminal input injection (TIOCSTI) or console control (TIOCLINUX). The
    // command is an `unsigned int`, so only its low 32 bits are compared.
    let ioctl_nr = must_number("ioctl");
    let ioctl_otherwise = policy
        .syscalls
        .get(&ioctl_nr)
        .map_or(policy.default_action, |p| p.otherwise);
    let mut ioctl_rules = vec![
        ConditionalRule {
            conditions: vec![cond32(1, ArgOp::Eq, TIOCSTI)],
            action: SeccompAction::Errno(EPERM),
        },
        ConditionalRule {
            conditions: vec![cond32(1, ArgOp::Eq, TIOCLINUX)],
            action: SeccompAction::Errno(EPERM),
        },
    ];
    if let Some(existing) = policy.syscalls.get(&ioctl_nr) {
        ioctl_rules.extend(existing.rules.iter().cloned());
    }
    policy.syscalls.insert(
        ioctl_nr,
        SyscallPolicy {
            rules: ioctl_rules,
            otherwise: ioctl_otherwise,
        },
    );
    // socket: only unix, IPv4, IPv6 and route netlink. This excludes AF_VSOCK (host
    // services), AF_ALG (kernel crypto bugs), AF_PACKET (raw frames) and other netlink
    // families (audit, uevents, ...).
    let family_allowed = |family| ConditionalRule {
        conditions: vec![cond32(0, ArgOp::Eq, family)],
        action: SeccompAction::Allow,
    };
    policy.syscalls.insert(
        must_number("socket"),
        SyscallPolicy {
            rules: vec![
                family_allowed(AF_UNIX),
                family_allowed(AF_INET),
                family_allowed(AF_INET6),
                ConditionalRule {
                    conditions: vec![
                        cond32(0, ArgOp::Eq, AF_NETLINK),
                        cond32(2, ArgOp::Eq, NETLINK_ROUTE),
                    ],
                    action: SeccompAction::Allow,
                },
            ],
            otherwise: SeccompAction::Errno(EAFNOSUPPORT),
        },
    );
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct DockerProfile {
    default_action: String,
    #[serde(default)]
    default_errno_ret: Option<u16>,
    #[serde(default)]
    syscalls: Vec<DockerSyscallRule>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct DockerSyscallRule {
    #[serde(default)]
    names: Vec<String>,
    #[serde(default)]
    name: Option<String>,
    action: String,
    #[serde(default)]
    errno_ret: Option<u16>,
    #[serde(default)]
    args: Vec<DockerArg>,
    #[serde(default)]
    includes: DockerFilter,
    #[serde(default)]
    excludes: DockerFilter,
}

#[derive(Deserialize, Default)]
struct DockerFilter {
    #[serde(default)]
    caps: Vec<String>,
    #[serde(default)]
    arches: Vec<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct DockerArg {
    index: u32,
    value: u64,
    #[serde(default)]
    value_two: u64,
    op: String,
}

/// A Docker action name as a [`SeccompAction`]; `at` names the entry for the error.
fn docker_action(action: &str, errno: Option<u16>, at: &str) -> Result<SeccompAction, String> {
    Ok(match action {
        "SCMP_ACT_ALLOW" | "SCMP_ACT_LOG" => SeccompAction::Allow,
        "SCMP_ACT_ERRNO" => SeccompAction::Errno(errno.unwrap_or(EPERM)),
        // Tracing needs a tracer the cell does not have; treat it as a plain denial.
        "SCMP_ACT_TRACE" | "SCMP_ACT_TRAP" => SeccompAction::Errno(EPERM),
        "SCMP_ACT_KILL" | "SCMP_ACT_KILL_THREAD" | "SCMP_ACT_KILL_PROCESS" => {
            SeccompAction::KillProcess
        }
        other => return Err(format!("{at}: unknown action {other:?}")),
    })
}

/// One Docker argument comparison as an [`ArgCondition`]; `at` names the entry.
fn docker_condition(arg: &DockerArg, at: &str) -> Result<ArgCondition, String> {
    let index = u8::try_from(arg.index)
        .ok()
        .filter(|i| *i <= 5)
        .ok_or_else(|| format!("{at}.index: {} is out of range (0..=5)", arg.index))?;
    let (op, value) = match arg.op.as_str() {
        "SCMP_CMP_EQ" => (ArgOp::Eq, arg.value),
        "SCMP_CMP_NE" => (ArgOp::Ne, arg.value),
        "SCMP_CMP_LT" => (ArgOp::Lt, arg.value),
        "SCMP_CMP_LE" => (ArgOp::Le, arg.value),
        "SCMP_CMP_GT" => (ArgOp::Gt, arg.value),
        "SCMP_CMP_GE" => (ArgOp::Ge, arg.value),
        "SCMP_CMP_MASKED_EQ" => (ArgOp::MaskedEq(arg.value), arg.value_two),
        other => return Err(format!("{at}.op: unknown argument operator {other:?}")),
    };
    Ok(ArgCondition {
        index,
        op,
        value,
        width32: false,
    })
}

/// Whether a Docker rule applies to an x86-64 cell without capabilities. Rules that need
/// a capability are skipped (a cell has none), as are rules restricted to other
/// architectures; `excludes.caps` always holds (the cell lacks every capability).
fn applies_to_cell(rule: &DockerSyscallRule) -> bool {
    let x86_64 = |arches: &[String]| arches.iter().any(|a| a == "amd64" || a == "x86_64");
    rule.includes.caps.is_empty()
        && (rule.includes.arches.is_empty() || x86_64(&rule.includes.arches))
        && !x86_64(&rule.excludes.arches)
}

/// Parses a Docker-format profile into a policy and then applies [`apply_hardening`].
/// Names unknown on x86_64 are ignored as Docker does. The error names the entry
/// (`syscalls[2].args[0].op: ...`), without the profile's path, which the caller adds.
pub fn policy_from_docker_json(json: &str) -> Result<SeccompPolicy, String> {
    let profile: DockerProfile = {
        let mut reader = serde_json::Deserializer::from_str(json);
        serde_path_to_error::deserialize(&mut reader).map_err(|e| {
            let at = e.path().to_string();
            let inner = e.into_inner();
            if matches!(at.as_str(), "." | "?" | "") {
                format!("not valid Docker seccomp JSON: {inner}")
            } else {
                format!("{at}: not valid Docker seccomp JSON: {inner}")
            }
        })?
    };
    let default_action = docker_action(
        &profile.default_action,
        profile.default_errno_ret,
        "defaultAction",
    )?;
    let mut syscalls: BTreeMap<u32, SyscallPolicy> = BTreeMap::new();
    for (index, rule) in profile.syscalls.iter().enumerate() {
        let at = format!("syscalls[{index}]");
        if !applies_to_cell(rule) {
            continue;
        }
        let action = docker_action(&rule.action, rule.errno_ret, &format!("{at}.action"))?;
        let conditions = rule
            .args
            .iter()
            .enumerate()
            .map(|(n, arg)| docker_condition(arg, &format!("{at}.args[{n}]")))
            .collect::<Result<Vec<_>, String>>()?;
        let names = rule.names.iter().chain(rule.name.iter());
        for nr in names.filter_map(|n| syscall_number(n)) {
            let entry = syscalls.entry(nr).or_insert_with(|| SyscallPolicy {
                rules: Vec::new(),
                otherwise: default_action,
            });
            if conditions.is_empty() {
                entry.otherwise = action;
            } else {
                entry.rules.push(ConditionalRule {
                    conditions: conditions.clone(),
                    action,
                });
            }
        }
    }
    let mut policy = SeccompPolicy {
        syscalls,
        default_action,
    };
    apply_hardening(&mut policy);
    Ok(policy)
}

/// What a filter does, in a few numbers: the "plan as enforced" names the filter by its
/// program's sha256 and this summary. Counts are over the x86-64 syscall table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FilterSummary {
    /// What a known syscall the policy does not list gets.
    pub default_action: SeccompAction,
    /// Syscalls allowed whatever their arguments.
    pub allowed_syscalls: u32,
    /// Syscalls whose outcome depends on their arguments (clone flags, ioctl requests,
    /// socket families, ...).
    pub conditional_syscalls: u32,
    /// Syscalls refused with an errno whatever their arguments, the default's included.
    pub denied_syscalls: u32,
    /// What kills the whole cell: the foreign ABIs always, and any syscall the policy
    /// kills.
    pub killed: Vec<String>,
}

/// The classes of call every filter kills before looking at the syscall number.
pub const KILLED_ABIS: [&str; 2] = ["foreign_architecture", "x32_abi"];

/// Summarises `policy` (see [`FilterSummary`]).
pub fn summary(policy: &SeccompPolicy) -> FilterSummary {
    let mut summary = FilterSummary {
        default_action: policy.default_action,
        allowed_syscalls: 0,
        conditional_syscalls: 0,
        denied_syscalls: 0,
        killed: KILLED_ABIS.iter().map(|c| c.to_string()).collect(),
    };
    for (name, nr) in X86_64_SYSCALLS {
        let outcome = match policy.syscalls.get(nr) {
            None => policy.default_action,
            Some(p) if p.rules.is_empty() => p.otherwise,
            Some(_) => {
                summary.conditional_syscalls += 1;
                continue;
            }
        };
        match outcome {
            SeccompAction::Allow => summary.allowed_syscalls += 1,
            SeccompAction::Errno(_) => summary.denied_syscalls += 1,
            SeccompAction::KillProcess => summary.killed.push(name.to_string()),
        }
    }
    summary
}
#[cfg(test)]
mod tests {
    use super::bpf::*;
    use super::*;

    /// A classic BPF interpreter for the instructions the compiler emits, so the tests
    /// check what the kernel would do with the program, not how it is laid out.
    fn run(program: &[BpfInsn], arch: u32, nr: u32, args: [u64; 6]) -> u32 {
        let mut data = Vec::new();
        data.extend_from_slice(&nr.to_le_bytes());
        data.extend_from_slice(&arch.to_le_bytes());
        data.extend_from_slice(&0u64.to_le_bytes());
        for a in args {
            data.extend_from_slice(&a.to_le_bytes());
        }
        let (mut pc, mut acc) = (0usize, 0u32);
        loop {
            let insn = program[pc];
            pc += 1;
            match insn.code {
                BPF_LD_W_ABS => {
                    let k = insn.k as usize;
                    acc = u32::from_le_bytes(data[k..k + 4].try_into().unwrap());
                }
                BPF_ALU_AND_K => acc &= insn.k,
                BPF_RET_K => return insn.k,
                BPF_JMP_JA => pc += insn.k as usize,
                BPF_JMP_JEQ_K | BPF_JMP_JGT_K | BPF_JMP_JGE_K => {
                    let taken = match insn.code {
                        BPF_JMP_JEQ_K => acc == insn.k,
                        BPF_JMP_JGT_K => acc > insn.k,
                        _ => acc >= insn.k,
                    };
                    pc += if taken { insn.jt } else { insn.jf } as usize;
                }
                other => panic!("unexpected opcode {other:#x}"),
            }
        }
    }

    fn nr(name: &str) -> u32 {
        syscall_number(name).unwrap()
    }

    const ALLOW: u32 = SECCOMP_RET_ALLOW;
    const DENY: u32 = SECCOMP_RET_ERRNO | libc::EPERM as u32;
    const NOSYS: u32 = SECCOMP_RET_ERRNO | libc::ENOSYS as u32;
    const KILL: u32 = SECCOMP_RET_KILL_PROCESS;

    fn default_program() -> Vec<BpfInsn> {
        compile(&default_policy()).unwrap()
    }

    fn call(name: &str, args: [u64; 6]) -> u32 {
        run(&default_program(), AUDIT_ARCH_X86_64, nr(name), args)
    }

    #[test]
    fn program_is_small() {
        let len = default_program().len();
        assert!(len < 400, "default filter has {len} instructions");
    }

    #[test]
    fn everyday_calls_are_allowed() {
        for name in [
            "read",
            "write",
            "openat",
            "mmap",
            "execve",
            "exit_group",
            "wait4",
            "fork",
            "landlock_restrict_self",
        ] {
            assert_eq!(call(name, [0; 6]), ALLOW, "{name}");
        }
    }

    #[test]
    fn escape_primitives_are_denied() {
        for name in [
            "unshare",
            "setns",
            "mount",
            "keyctl",
            "bpf",
            "ptrace",
            "io_uring_setup",
            "userfaultfd",
            "perf_event_open",
            "open_by_handle_at",
            "kexec_load",
            "init_module",
        ] {
            assert_eq!(call(name, [0; 6]), DENY, "{name}");
        }
        assert_eq!(call("clone3", [0; 6]), NOSYS);
    }

    #[test]
    fn unknown_numbers_get_enosys_and_foreign_abis_are_killed() {
        let program = default_program();
        assert_eq!(run(&program, AUDIT_ARCH_X86_64, 1000, [0; 6]), NOSYS);
        assert_eq!(
            run(&program, AUDIT_ARCH_X86_64, 400, [0; 6]),
            NOSYS,
            "gap in the table"
        );
        assert_eq!(
            run(
                &program,
                AUDIT_ARCH_X86_64,
                X32_SYSCALL_BIT | nr("read"),
                [0; 6]
            ),
            KILL
        );
        const AUDIT_ARCH_I386: u32 = 0x4000_0003;
        assert_eq!(run(&program, AUDIT_ARCH_I386, 3, [0; 6]), KILL);
    }

    #[test]
    fn clone_with_namespace_flags_is_denied() {
        assert_eq!(call("clone", [libc::SIGCHLD as u64, 0, 0, 0, 0, 0]), ALLOW);
        assert_eq!(
            call("clone", [0x3d0f00, 0, 0, 0, 0, 0]),
            ALLOW,
            "pthread_create flags"
        );
        for flag in [
            libc::CLONE_NEWUSER,
            libc::CLONE_NEWNS,
            libc::CLONE_NEWNET,
            libc::CLONE_NEWPID,
        ] {
            assert_eq!(
                call("clone", [flag as u64 | libc::SIGCHLD as u64, 0, 0, 0, 0, 0]),
                DENY
            );
        }
    }

    #[test]
    fn a_payload_terminal_can_be_taken_sized_and_configured() {
        // A plan with a terminal: the payload's child takes it (TIOCSCTTY) and programs
        // read and set its size and modes; only injection and console control are denied.
        for request in [
            libc::TIOCSCTTY,
            libc::TIOCGWINSZ,
            libc::TIOCSWINSZ,
            libc::TCGETS,
            libc::TCSETS,
            libc::TCSETSW,
            libc::TCSETSF,
            libc::TIOCGPGRP,
            libc::TIOCSPGRP,
            libc::TIOCGPTN,
            libc::TIOCSPTLCK,
        ] {
            assert_eq!(
                call("ioctl", [0, request, 0, 0, 0, 0]),
                ALLOW,
                "{request:#x}"
            );
        }
        assert_eq!(call("setsid", [0; 6]), ALLOW);
    }

    #[test]
    fn tiocsti_is_denied_even_with_high_bits_set() {
        assert_eq!(call("ioctl", [1, TIOCSTI, 0, 0, 0, 0]), DENY);
        assert_eq!(call("ioctl", [1, TIOCSTI | 1 << 32, 0, 0, 0, 0]), DENY);
        assert_eq!(call("ioctl", [1, TIOCLINUX, 0, 0, 0, 0]), DENY);
        assert_eq!(call("ioctl", [1, libc::TCGETS, 0, 0, 0, 0]), ALLOW);
    }

    #[test]
    fn only_unix_inet_and_route_netlink_sockets() {
        let eaf = SECCOMP_RET_ERRNO | libc::EAFNOSUPPORT as u32;
        assert_eq!(call("socket", [AF_INET, 1, 0, 0, 0, 0]), ALLOW);
        assert_eq!(call("socket", [AF_INET6, 2, 0, 0, 0, 0]), ALLOW);
        assert_eq!(call("socket", [AF_UNIX, 1, 0, 0, 0, 0]), ALLOW);
        assert_eq!(call("socket", [AF_NETLINK, 3, 0, 0, 0, 0]), ALLOW);
        assert_eq!(
            call("socket", [AF_NETLINK, 3, 9, 0, 0, 0]),
            eaf,
            "audit netlink"
        );
        for family in [
            libc::AF_VSOCK,
            libc::AF_ALG,
            libc::AF_PACKET,
            libc::AF_BLUETOOTH,
        ] {
            assert_eq!(
                call("socket", [family as u64, 1, 0, 0, 0, 0]),
                eaf,
                "family {family}"
            );
        }
    }

    #[test]
    fn personality_only_known_domains() {
        assert_eq!(call("personality", [0, 0, 0, 0, 0, 0]), ALLOW);
        assert_eq!(call("personality", [0xffff_ffff, 0, 0, 0, 0, 0]), ALLOW);
        assert_eq!(
            call("personality", [0x0040000, 0, 0, 0, 0, 0]),
            DENY,
            "ADDR_NO_RANDOMIZE"
        );
    }

    #[test]
    fn docker_profiles_get_the_hardening_and_64_bit_comparisons() {
        let json = r#"{
            "defaultAction": "SCMP_ACT_ERRNO",
            "syscalls": [
                {"names": ["read", "write", "exit_group", "unshare", "clone", "ptrace"], "action": "SCMP_ACT_ALLOW"},
                {"names": ["lseek"], "action": "SCMP_ACT_ALLOW", "args": [{"index": 2, "value": 4294967296, "op": "SCMP_CMP_GT"}]},
                {"names": ["dup"], "action": "SCMP_ACT_ALLOW", "args": [{"index": 0, "value": 10, "op": "SCMP_CMP_LE"}]},
                {"names": ["close"], "action": "SCMP_ACT_ALLOW", "args": [{"index": 0, "value": 3, "op": "SCMP_CMP_NE"}]},
                {"names": ["mount"], "action": "SCMP_ACT_ALLOW", "includes": {"caps": ["CAP_SYS_ADMIN"]}}
            ]
        }"#;
        let program = compile(&policy_from_docker_json(json).unwrap()).unwrap();
        let x = |name: &str, args: [u64; 6]| run(&program, AUDIT_ARCH_X86_64, nr(name), args);
        assert_eq!(x("read", [0; 6]), ALLOW);
        assert_eq!(x("openat", [0; 6]), DENY, "not in the profile");
        assert_eq!(
            x("unshare", [0; 6]),
            DENY,
            "hardening overrides the profile"
        );
        assert_eq!(x("ptrace", [0; 6]), DENY, "hardening overrides the profile");
        assert_eq!(
            x("clone", [libc::CLONE_NEWUSER as u64, 0, 0, 0, 0, 0]),
            DENY
        );
        assert_eq!(x("mount", [0; 6]), DENY, "cap-gated rule skipped");
        assert_eq!(
            x("lseek", [0, 0, 1 << 32, 0, 0, 0]),
            DENY,
            "equal is not greater"
        );
        assert_eq!(x("lseek", [0, 0, (1 << 32) + 1, 0, 0, 0]), ALLOW);
        assert_eq!(x("lseek", [0, 0, 5, 0, 0, 0]), DENY);
        assert_eq!(x("lseek", [0, 0, 2 << 32, 0, 0, 0]), ALLOW);
        assert_eq!(x("dup", [10, 0, 0, 0, 0, 0]), ALLOW);
        assert_eq!(x("dup", [11, 0, 0, 0, 0, 0]), DENY);
        assert_eq!(
            x("dup", [1 << 32, 0, 0, 0, 0, 0]),
            DENY,
            "high word makes it larger"
        );
        assert_eq!(x("close", [3, 0, 0, 0, 0, 0]), DENY);
        assert_eq!(x("close", [4, 0, 0, 0, 0, 0]), ALLOW);
        assert_eq!(
            x("close", [3 | 1 << 32, 0, 0, 0, 0, 0]),
            ALLOW,
            "differs in the high word"
        );
    }

    #[test]
    fn bad_profiles_are_rejected_naming_the_bad_entry() {
        let error = |json: &str| policy_from_docker_json(json).unwrap_err();
        assert!(
            error("{").starts_with("not valid Docker seccomp JSON: "),
            "{}",
            error("{")
        );
        assert_eq!(
            error(r#"{"defaultAction": "SCMP_ACT_NOPE"}"#),
            "defaultAction: unknown action \"SCMP_ACT_NOPE\""
        );
        assert_eq!(
            error(
                r#"{"defaultAction": "SCMP_ACT_ERRNO", "syscalls": [
                {"names": ["read"], "action": "SCMP_ACT_ALLOW"},
                {"names": ["read"], "action": "SCMP_ACT_ALLOW", "args": [{"index": 9, "value": 1, "op": "SCMP_CMP_EQ"}]}]}"#
            ),
            "syscalls[1].args[0].index: 9 is out of range (0..=5)"
        );
        assert_eq!(
            error(
                r#"{"defaultAction": "SCMP_ACT_ERRNO", "syscalls": [
                {"names": ["read"], "action": "SCMP_ACT_ALLOW", "args": [{"index": 0, "value": 1, "op": "SCMP_CMP_NEAR"}]}]}"#
            ),
            "syscalls[0].args[0].op: unknown argument operator \"SCMP_CMP_NEAR\""
        );
        assert_eq!(
            error(
                r#"{"defaultAction": "SCMP_ACT_ERRNO", "syscalls": [{"names": ["read"], "action": "SCMP_ACT_MAYBE"}]}"#
            ),
            "syscalls[0].action: unknown action \"SCMP_ACT_MAYBE\""
        );
        let wrong_type = error(
            r#"{"defaultAction": "SCMP_ACT_ERRNO", "syscalls": [{"names": "read", "action": "SCMP_ACT_ALLOW"}]}"#,
        );
        assert!(
            wrong_type.starts_with("syscalls[0].names: "),
            "{wrong_type}"
        );
    }

    #[test]
    fn the_summary_counts_what_the_filter_does() {
        let policy = policy_from_docker_json(
            r#"{"defaultAction": "SCMP_ACT_ERRNO", "syscalls": [
                {"names": ["read", "write"], "action": "SCMP_ACT_ALLOW"},
                {"names": ["kexec_file_load", "reboot", "getpid"], "action": "SCMP_ACT_KILL"}
            ]}"#,
        )
        .unwrap();
        let summary = summary(&policy);
        assert_eq!(summary.default_action, SeccompAction::Errno(1));
        assert_eq!(summary.allowed_syscalls, 2);
        // clone, ioctl and socket carry the hardening's argument rules.
        assert_eq!(summary.conditional_syscalls, 3);
        // The hardening's denials override the profile's kills (kexec, reboot).
        assert_eq!(
            summary.killed,
            ["foreign_architecture", "x32_abi", "getpid"]
        );
        assert_eq!(
            summary.allowed_syscalls + summary.conditional_syscalls + summary.denied_syscalls + 1,
            X86_64_SYSCALLS.len() as u32
        );
    }

    #[test]
    fn the_program_hash_is_of_the_kernels_bytes() {
        let program = [BpfInsn::new(0x06, 0, 0, SECCOMP_RET_ALLOW)];
        let bytes = [6, 0, 0, 0, 0, 0, 0xff, 0x7f];
        assert_eq!(program[0].to_bytes(), bytes);
        use sha2::Digest;
        assert_eq!(
            program_sha256(&program),
            hex::encode(sha2::Sha256::digest(bytes))
        );
        assert_ne!(program_sha256(DEFAULT_FILTER), program_sha256(&program));
    }

    /// `(name, libc's number)` for each listed `SYS_*` constant: a name libc lacks fails
    /// to compile.
    macro_rules! libc_numbers {
        ($($name:ident),* $(,)?) => {
            [$((stringify!($name), libc::$name as u32)),*]
        };
    }

    #[test]
    fn every_entry_of_the_syscall_table_is_libcs_number() {
        use super::syscalls::tests::{from_libc, NOT_IN_LIBC};
        let from_libc = from_libc();
        let table: BTreeMap<&str, u32> = X86_64_SYSCALLS.iter().copied().collect();
        assert_eq!(table.len(), X86_64_SYSCALLS.len(), "a name appears twice");
        for (sys_name, number) in &from_libc {
            let name = sys_name.strip_prefix("SYS_").unwrap();
            assert_eq!(table.get(name), Some(number), "{name}");
        }
        for (name, number) in NOT_IN_LIBC {
            assert_eq!(table.get(name), Some(number), "{name}");
        }
        assert_eq!(
            from_libc.len() + NOT_IN_LIBC.len(),
            X86_64_SYSCALLS.len(),
            "the comparison list must name every entry of the table"
        );
        assert!(
            X86_64_SYSCALLS.windows(2).all(|w| w[0].1 < w[1].1),
            "sorted by number"
        );
    }

    pub(super) use libc_numbers;

    /// The generated `default_filter.rs`: the compiled default policy and its summary.
    fn default_filter_source() -> String {
        let policy = default_policy();
        let program = compile(&policy).unwrap();
        let summary = summary(&policy);
        let mut text = String::from(
            "//! The default seccomp program, `seccomp::compile(&seccomp::default_policy())`, and\n\
             //! its summary, generated so that compiling a plan does not rebuild them. A test\n\
             //! checks both against the compiler; regenerate with\n\
             //! `AIRLOCK_BLESS=1 cargo test -p airlock-contract default_filter`.\n\n\
             use super::{BpfInsn, FilterSummary, SeccompAction};\n\n\
             /// The program, one instruction per line.\n\
             pub const DEFAULT_FILTER: &[BpfInsn] = &[\n",
        );
        for insn in &program {
            text.push_str(&format!(
                "    BpfInsn::new({:#06x}, {}, {}, {:#x}),\n",
                insn.code, insn.jt, insn.jf, insn.k
            ));
        }
        let killed: Vec<String> = summary
            .killed
            .iter()
            .map(|k| format!("{k:?}.to_owned()"))
            .collect();
        text.push_str(&format!(
            "];\n\n/// [`super::summary`] of the default policy.\n\
             pub fn default_summary() -> FilterSummary {{\n    FilterSummary {{\n        \
             default_action: SeccompAction::{:?},\n        allowed_syscalls: {},\n        \
             conditional_syscalls: {},\n        denied_syscalls: {},\n        \
             killed: vec![{}],\n    }}\n}}\n",
            summary.default_action,
            summary.allowed_syscalls,
            summary.conditional_syscalls,
            summary.denied_syscalls,
            killed.join(", ")
        ));
        text
    }

    /// `default_filter.rs` is the compiled default policy. `AIRLOCK_BLESS=1 cargo test -p
    /// airlock-contract default_filter` regenerates it.
    #[test]
    fn default_filter_is_the_compiled_default_policy() {
        let text = default_filter_source();
        let path =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/seccomp/default_filter.rs");
        if std::env::var_os("AIRLOCK_BLESS").is_some_and(|v| v == "1") {
            std::fs::write(&path, &text).unwrap();
            return;
        }
        let actual = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            actual == text,
            "src/seccomp/default_filter.rs is out of date; regenerate it with \
             `AIRLOCK_BLESS=1 cargo test -p airlock-contract default_filter`"
        );
        assert_eq!(DEFAULT_FILTER, compile(&default_policy()).unwrap());
        assert_eq!(default_summary(), summary(&default_policy()));
    }
}
