//! The cell's seccomp filter: a policy (which syscall gets which action, with argument
//! conditions) and a compiler from that policy to classic BPF.
//!
//! The default policy is Docker's default allowlist (moby's `profiles/seccomp/default.json`) tightened for
//! agents. A Docker-format JSON profile can replace the allowlist, but the hardening rules
//! ([`apply_hardening`]) are applied on top of any profile: a custom profile can only make
//! the cell stricter than the hardening, never weaker.

use crate::syscalls::X86_64_SYSCALLS;
use serde::Deserialize;
use std::collections::BTreeMap;

/// What the filter does with a system call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SeccompAction {
    Allow,
    Errno(u16),
    /// Kills the whole process with SIGSYS: reserved for calls that only an escape attempt
    /// makes (foreign architectures, the x32 ABI).
    KillProcess,
}

impl SeccompAction {
    fn return_value(self) -> u32 {
        match self {
            SeccompAction::Allow => SECCOMP_RET_ALLOW,
            SeccompAction::Errno(errno) => SECCOMP_RET_ERRNO | u32::from(errno),
            SeccompAction::KillProcess => SECCOMP_RET_KILL_PROCESS,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArgCondition {
    pub index: u8,
    pub op: ArgOp,
    pub value: u64,
    pub width32: bool,
}

/// Conditions that must all hold for `action` to apply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConditionalRule {
    pub conditions: Vec<ArgCondition>,
    pub action: SeccompAction,
}

/// What happens to one syscall: the first matching conditional rule, else `otherwise`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyscallPolicy {
    pub rules: Vec<ConditionalRule>,
    pub otherwise: SeccompAction,
}

/// A whole filter: per-syscall policies by number, plus the action for known syscalls not
/// listed. Numbers the kernel does not know at all get ENOSYS, so feature probes in libc
/// fall back instead of failing hard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeccompPolicy {
    pub syscalls: BTreeMap<u32, SyscallPolicy>,
    pub default_action: SeccompAction,
}

#[derive(Debug, thiserror::Error)]
pub enum SeccompProfileError {
    #[error("seccomp profile is not valid Docker seccomp JSON: {0}")]
    Json(#[from] serde_json::Error),
    #[error("seccomp profile: unknown action {0:?}")]
    UnknownAction(String),
    #[error("seccomp profile: unknown argument operator {0:?}")]
    UnknownOperator(String),
    #[error("seccomp profile: argument index {0} out of range (0..=5)")]
    ArgIndex(u32),
    #[error("seccomp profile: filter too large ({0} instructions, the kernel allows 4096)")]
    TooLarge(usize),
}

const EPERM: u16 = libc::EPERM as u16;
const ENOSYS: u16 = libc::ENOSYS as u16;
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

fn docker_action(action: &str, errno: Option<u16>) -> Result<SeccompAction, SeccompProfileError> {
    Ok(match action {
        "SCMP_ACT_ALLOW" | "SCMP_ACT_LOG" => SeccompAction::Allow,
        "SCMP_ACT_ERRNO" => SeccompAction::Errno(errno.unwrap_or(EPERM)),
        // Tracing needs a tracer the cell does not have; treat it as a plain denial.
        "SCMP_ACT_TRACE" | "SCMP_ACT_TRAP" => SeccompAction::Errno(EPERM),
        "SCMP_ACT_KILL" | "SCMP_ACT_KILL_THREAD" | "SCMP_ACT_KILL_PROCESS" => {
            SeccompAction::KillProcess
        }
        other => return Err(SeccompProfileError::UnknownAction(other.to_string())),
    })
}

/// Parses a Docker-format profile into a policy and then applies [`apply_hardening`].
/// Rules that need a capability are skipped (a cell has none), as are rules restricted to
/// other architectures; names unknown on x86_64 are ignored as Docker does.
pub fn policy_from_docker_json(json: &str) -> Result<SeccompPolicy, SeccompProfileError> {
    let profile: DockerProfile = serde_json::from_str(json)?;
    let default_action = docker_action(&profile.default_action, profile.default_errno_ret)?;
    let mut syscalls: BTreeMap<u32, SyscallPolicy> = BTreeMap::new();
    for rule in &profile.syscalls {
        if !rule.includes.caps.is_empty() {
            continue;
        }
        let arch_ok = |arches: &[String]| arches.iter().any(|a| a == "amd64" || a == "x86_64");
        if !rule.includes.arches.is_empty() && !arch_ok(&rule.includes.arches) {
            continue;
        }
        if arch_ok(&rule.excludes.arches) {
            continue;
        }
        // excludes.caps: the rule applies when the process lacks those caps - always true.
        let action = docker_action(&rule.action, rule.errno_ret)?;
        let mut conditions = Vec::new();
        for arg in &rule.args {
            let index = u8::try_from(arg.index)
                .ok()
                .filter(|i| *i <= 5)
                .ok_or(SeccompProfileError::ArgIndex(arg.index))?;
            let (op, value) = match arg.op.as_str() {
                "SCMP_CMP_EQ" => (ArgOp::Eq, arg.value),
                "SCMP_CMP_NE" => (ArgOp::Ne, arg.value),
                "SCMP_CMP_LT" => (ArgOp::Lt, arg.value),
                "SCMP_CMP_LE" => (ArgOp::Le, arg.value),
                "SCMP_CMP_GT" => (ArgOp::Gt, arg.value),
                "SCMP_CMP_GE" => (ArgOp::Ge, arg.value),
                "SCMP_CMP_MASKED_EQ" => (ArgOp::MaskedEq(arg.value), arg.value_two),
                other => return Err(SeccompProfileError::UnknownOperator(other.to_string())),
            };
            conditions.push(ArgCondition {
                index,
                op,
                value,
                width32: false,
            });
        }
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

// Classic BPF encoding (linux/filter.h, linux/seccomp.h).
const BPF_LD_W_ABS: u16 = 0x20;
const BPF_JMP_JA: u16 = 0x05;
const BPF_JMP_JEQ_K: u16 = 0x15;
const BPF_JMP_JGT_K: u16 = 0x25;
const BPF_JMP_JGE_K: u16 = 0x35;
const BPF_ALU_AND_K: u16 = 0x54;
const BPF_RET_K: u16 = 0x06;
const SECCOMP_RET_KILL_PROCESS: u32 = 0x8000_0000;
const SECCOMP_RET_ERRNO: u32 = 0x0005_0000;
const SECCOMP_RET_ALLOW: u32 = 0x7fff_0000;
const AUDIT_ARCH_X86_64: u32 = 0xc000_003e;
const X32_SYSCALL_BIT: u32 = 0x4000_0000;
const OFFSET_NR: u32 = 0;
const OFFSET_ARCH: u32 = 4;
const fn offset_arg_low(index: u8) -> u32 {
    16 + 8 * index as u32
}
const BPF_MAXINSNS: usize = 4096;

/// An instruction whose jump target may still be symbolic.
#[derive(Clone, Copy)]
enum Insn {
    Stmt {
        code: u16,
        k: u32,
    },
    /// Conditional jump with small relative offsets (always local).
    Jump {
        code: u16,
        k: u32,
        jt: u8,
        jf: u8,
    },
    /// Unconditional jump to a label (32-bit offset, so any distance).
    JumpTo(usize),
    Label(usize),
}

struct Emitter {
    insns: Vec<Insn>,
    next_label: usize,
}

impl Emitter {
    fn label(&mut self) -> usize {
        self.next_label += 1;
        self.next_label
    }
    fn stmt(&mut self, code: u16, k: u32) {
        self.insns.push(Insn::Stmt { code, k });
    }
    fn jump(&mut self, code: u16, k: u32, jt: u8, jf: u8) {
        self.insns.push(Insn::Jump { code, k, jt, jf });
    }
    fn ret(&mut self, action: SeccompAction) {
        self.stmt(BPF_RET_K, action.return_value());
    }
    /// Continues when `A <code> k` holds, else jumps to `fail`.
    fn require(&mut self, code: u16, k: u32, fail: usize) {
        self.jump(code, k, 1, 0);
        self.insns.push(Insn::JumpTo(fail));
    }
    /// Continues when `A <code> k` does NOT hold, else jumps to `target`.
    fn branch_if(&mut self, code: u16, k: u32, target: usize) {
        self.jump(code, k, 0, 1);
        self.insns.push(Insn::JumpTo(target));
    }

    fn finish(self) -> Result<Vec<libc::sock_filter>, SeccompProfileError> {
        let mut positions = BTreeMap::new();
        let mut pc = 0usize;
        for insn in &self.insns {
            match insn {
                Insn::Label(id) => {
                    positions.insert(*id, pc);
                }
                _ => pc += 1,
            }
        }
        if pc > BPF_MAXINSNS {
            return Err(SeccompProfileError::TooLarge(pc));
        }
        let mut out = Vec::with_capacity(pc);
        for insn in &self.insns {
            let filter = match *insn {
                Insn::Label(_) => continue,
                Insn::Stmt { code, k } => libc::sock_filter {
                    code,
                    jt: 0,
                    jf: 0,
                    k,
                },
                Insn::Jump { code, k, jt, jf } => libc::sock_filter { code, jt, jf, k },
                Insn::JumpTo(label) => {
                    let target = positions[&label];
                    let offset = target - (out.len() + 1);
                    libc::sock_filter {
                        code: BPF_JMP_JA,
                        jt: 0,
                        jf: 0,
                        k: offset as u32,
                    }
                }
            };
            out.push(filter);
        }
        Ok(out)
    }
}

/// Emits the check of one argument condition; jumps to `fail` when it does not hold.
/// 64-bit comparisons are done on the high word first, then the low word.
fn emit_condition(e: &mut Emitter, c: &ArgCondition, fail: usize) {
    let low = offset_arg_low(c.index);
    let high = low + 4;
    let (v_hi, v_lo) = ((c.value >> 32) as u32, c.value as u32);
    match c.op {
        ArgOp::Eq | ArgOp::MaskedEq(_) => {
            let mask = if let ArgOp::MaskedEq(m) = c.op {
                m
            } else {
                u64::MAX
            };
            let (m_hi, m_lo) = ((mask >> 32) as u32, mask as u32);
            if !c.width32 {
                e.stmt(BPF_LD_W_ABS, high);
                if m_hi != u32::MAX {
                    e.stmt(BPF_ALU_AND_K, m_hi);
                }
                e.require(BPF_JMP_JEQ_K, v_hi & m_hi, fail);
            }
            e.stmt(BPF_LD_W_ABS, low);
            if m_lo != u32::MAX {
                e.stmt(BPF_ALU_AND_K, m_lo);
            }
            e.require(BPF_JMP_JEQ_K, v_lo & m_lo, fail);
        }
        ArgOp::Ne => {
            // Holds unless both words are equal.
            let holds = e.label();
            if !c.width32 {
                e.stmt(BPF_LD_W_ABS, high);
                // Different high words: the values differ, the condition holds.
                e.jump(BPF_JMP_JEQ_K, v_hi, 1, 0);
                e.insns.push(Insn::JumpTo(holds));
            }
            e.stmt(BPF_LD_W_ABS, low);
            e.branch_if(BPF_JMP_JEQ_K, v_lo, fail);
            e.insns.push(Insn::Label(holds));
        }
        ArgOp::Gt | ArgOp::Ge | ArgOp::Lt | ArgOp::Le => {
            // For Lt/Le the "holds" outcome is the negation of Ge/Gt.
            let (code, negate) = match c.op {
                ArgOp::Gt => (BPF_JMP_JGT_K, false),
                ArgOp::Ge => (BPF_JMP_JGE_K, false),
                ArgOp::Lt => (BPF_JMP_JGE_K, true),
                _ => (BPF_JMP_JGT_K, true),
            };
            let holds = e.label();
            let (yes, no) = if negate { (fail, holds) } else { (holds, fail) };
            if !c.width32 {
                e.stmt(BPF_LD_W_ABS, high);
                // A larger high word decides "greater", a smaller one "not greater".
                e.branch_if(BPF_JMP_JGT_K, v_hi, yes);
                e.jump(BPF_JMP_JEQ_K, v_hi, 1, 0);
                e.insns.push(Insn::JumpTo(no));
            }
            e.stmt(BPF_LD_W_ABS, low);
            e.branch_if(code, v_lo, yes);
            e.insns.push(Insn::JumpTo(no));
            e.insns.push(Insn::Label(holds));
        }
    }
}

fn emit_syscall_policy(e: &mut Emitter, policy: &SyscallPolicy) {
    for rule in &policy.rules {
        let next_rule = e.label();
        for condition in &rule.conditions {
            emit_condition(e, condition, next_rule);
        }
        e.ret(rule.action);
        e.insns.push(Insn::Label(next_rule));
    }
    e.ret(policy.otherwise);
}

/// Where a run of consecutive syscall numbers goes.
#[derive(Clone, Copy, PartialEq)]
enum RangeTarget {
    Return(SeccompAction),
    /// A syscall with argument rules, emitted as its own block.
    Block(usize),
}

/// Binary search over ranges `[start, next start)`; the accumulator holds the number.
/// Consecutive numbers with the same simple action share one range, which keeps the
/// program small (fast to JIT at every cell start, fast to run at every syscall).
fn emit_ranges(e: &mut Emitter, ranges: &[(u32, RangeTarget)]) {
    if let [(_, target)] = ranges {
        match *target {
            RangeTarget::Return(action) => e.ret(action),
            RangeTarget::Block(label) => e.insns.push(Insn::JumpTo(label)),
        }
        return;
    }
    let mid = ranges.len() / 2;
    let upper = e.label();
    e.branch_if(BPF_JMP_JGE_K, ranges[mid].0, upper);
    emit_ranges(e, &ranges[..mid]);
    e.insns.push(Insn::Label(upper));
    emit_ranges(e, &ranges[mid..]);
}

/// The default policy's program, compiled at build time (`default_filter.rs`, checked
/// against [`compile`] by a test): a cell start does not rebuild it.
pub fn default_program() -> Vec<libc::sock_filter> {
    crate::default_filter::DEFAULT_FILTER
        .iter()
        .map(|&(code, jt, jf, k)| libc::sock_filter { code, jt, jf, k })
        .collect()
}

/// Compiles `policy` into a seccomp BPF program for x86_64.
pub fn compile(policy: &SeccompPolicy) -> Result<Vec<libc::sock_filter>, SeccompProfileError> {
    let mut e = Emitter {
        insns: Vec::new(),
        next_label: 0,
    };
    let kill = e.label();
    // Foreign architectures (e.g. int 0x80 i386 calls) and the x32 ABI reuse syscall
    // numbers with other meanings: an allowlist keyed on x86_64 numbers would be bypassed.
    e.stmt(BPF_LD_W_ABS, OFFSET_ARCH);
    e.require(BPF_JMP_JEQ_K, AUDIT_ARCH_X86_64, kill);
    e.stmt(BPF_LD_W_ABS, OFFSET_NR);
    e.branch_if(BPF_JMP_JGE_K, X32_SYSCALL_BIT, kill);

    // Numbers the kernel does not know get ENOSYS (so libc feature probes fall back);
    // known but unlisted ones get the policy's default.
    let unknown = RangeTarget::Return(SeccompAction::Errno(ENOSYS));
    let mut ranges: Vec<(u32, RangeTarget)> = Vec::new();
    let mut blocks = Vec::new();
    let push = |ranges: &mut Vec<(u32, RangeTarget)>, nr: u32, target: RangeTarget| {
        if ranges.last().is_none_or(|(_, t)| *t != target) {
            ranges.push((nr, target));
        }
    };
    let mut expected = 0u32;
    for (_, nr) in X86_64_SYSCALLS {
        if *nr > expected {
            push(&mut ranges, expected, unknown);
        }
        let target = match policy.syscalls.get(nr) {
            None => RangeTarget::Return(policy.default_action),
            Some(p) if p.rules.is_empty() => RangeTarget::Return(p.otherwise),
            Some(p) => {
                let label = e.label();
                blocks.push((label, p));
                RangeTarget::Block(label)
            }
        };
        push(&mut ranges, *nr, target);
        expected = nr + 1;
    }
    push(&mut ranges, expected, unknown);
    emit_ranges(&mut e, &ranges);
    for (label, body) in blocks {
        e.insns.push(Insn::Label(label));
        emit_syscall_policy(&mut e, body);
    }
    e.insns.push(Insn::Label(kill));
    e.ret(SeccompAction::KillProcess);
    e.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A classic BPF interpreter for the instructions the compiler emits, so the tests
    /// check what the kernel would do with the program, not how it is laid out.
    fn run(program: &[libc::sock_filter], arch: u32, nr: u32, args: [u64; 6]) -> u32 {
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

    fn default_program() -> Vec<libc::sock_filter> {
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
    fn bad_profiles_are_rejected() {
        assert!(policy_from_docker_json("{").is_err());
        assert!(policy_from_docker_json(r#"{"defaultAction": "SCMP_ACT_NOPE"}"#).is_err());
        assert!(policy_from_docker_json(r#"{"defaultAction": "SCMP_ACT_ERRNO", "syscalls": [{"names": ["read"], "action": "SCMP_ACT_ALLOW", "args": [{"index": 9, "value": 1, "op": "SCMP_CMP_EQ"}]}]}"#).is_err());
    }

    /// `default_filter.rs` is the compiled default policy. `AIRLOCK_BLESS=1 cargo test -p
    /// airlock-cell default_filter` regenerates it.
    #[test]
    fn default_filter_is_the_compiled_default_policy() {
        let program = compile(&default_policy()).unwrap();
        let mut text = String::from(
            "//! The default seccomp program: `seccomp::compile(&seccomp::default_policy())`,\n\
             //! generated so that a cell start does not rebuild it. A test checks it against\n\
             //! the compiler; regenerate with\n\
             //! `AIRLOCK_BLESS=1 cargo test -p airlock-cell default_filter`.\n\n\
             /// `(code, jt, jf, k)` of each instruction.\n\
             pub const DEFAULT_FILTER: &[(u16, u8, u8, u32)] = &[\n",
        );
        for insn in &program {
            text.push_str(&format!(
                "    ({:#06x}, {}, {}, {:#x}),\n",
                insn.code, insn.jt, insn.jf, insn.k
            ));
        }
        text.push_str("];\n");
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/default_filter.rs");
        if std::env::var_os("AIRLOCK_BLESS").is_some_and(|v| v == "1") {
            std::fs::write(&path, &text).unwrap();
            return;
        }
        let actual = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            actual == text,
            "src/default_filter.rs is out of date; regenerate it with \
             `AIRLOCK_BLESS=1 cargo test -p airlock-cell default_filter`"
        );
    }
}
