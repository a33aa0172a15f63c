//! Thin wrappers over the Linux system calls the cell needs. This is the only module of
//! airlock with `unsafe` code; every block states the precondition it relies on.
//!
//! Wrappers return `io::Result` with the raw errno; callers add context.

use std::ffi::{CStr, CString};
use std::io;
use std::mem::{size_of, zeroed};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;

fn cstring(path: &Path) -> io::Result<CString> {
    use std::os::unix::ffi::OsStrExt;
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains NUL"))
}

fn check(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

fn check_long(ret: libc::c_long) -> io::Result<libc::c_long> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// [`clone_cell`], and the child then takes `name` as its `/proc/<pid>/comm` and
/// `/proc/<pid>/cmdline` and blanks its copy of the caller's environment strings
/// (`/proc/<pid>/environ`), `command_line` being the caller's own (see
/// [`process_stat`]). Done right after the clone, where the child is known to run alone:
/// a clone without exec would otherwise show whoever can read its /proc files the
/// caller's command line and, to those allowed, its environment.
///
/// # Safety
/// As [`clone_cell`]: the process must be single-threaded.
pub unsafe fn clone_cell_named(
    namespace_flags: libc::c_ulong,
    command_line: &CommandLineArea,
    name: &CStr,
) -> io::Result<CloneOutcome> {
    // SAFETY: the caller guarantees that the process is single-threaded.
    let outcome = unsafe { clone_cell(namespace_flags) }?;
    if let CloneOutcome::Child = outcome {
        // SAFETY: a fork-like child has exactly one thread, this one, and nothing of
        // airlock keeps a reference into the argument or environment strings.
        unsafe { overwrite_command_line(command_line, name.to_bytes()) };
        // Fails only for a bad pointer (EFAULT); an error here must not be mistaken by
        // the child for a failed clone.
        let _ = set_thread_name(name);
    }
    Ok(outcome)
}

/// Result of [`clone_cell`] as seen by each side.
pub enum CloneOutcome {
    Parent { pid: libc::pid_t, pidfd: OwnedFd },
    Child,
}

/// `clone(2)` with fork semantics (no shared memory, child runs on a copy of our stack)
/// plus `flags` (namespaces) and a pidfd for the parent.
///
/// # Safety
/// The caller must be single-threaded: the child is a copy of this one thread, and any
/// lock held by another thread (malloc, stdio) would stay locked forever in the child.
/// [`SingleThreaded`] is the checked way to say so ([`clone_single_threaded`]).
pub unsafe fn clone_cell(namespace_flags: libc::c_ulong) -> io::Result<CloneOutcome> {
    let mut pidfd: libc::c_int = -1;
    let flags =
        namespace_flags | libc::CLONE_PIDFD as libc::c_ulong | libc::SIGCHLD as libc::c_ulong;
    // SAFETY: raw clone with a null stack pointer duplicates the calling thread like fork();
    // `pidfd` is a valid out-pointer for CLONE_PIDFD (x86_64 argument order: flags, stack,
    // parent_tid, child_tid, tls). The caller guarantees the process is single-threaded
    // (this function's precondition).
    let ret = unsafe {
        libc::syscall(
            libc::SYS_clone,
            flags,
            std::ptr::null_mut::<libc::c_void>(),
            &mut pidfd as *mut libc::c_int,
            std::ptr::null_mut::<libc::c_void>(),
            0usize,
        )
    };
    let pid = check_long(ret)?;
    if pid == 0 {
        Ok(CloneOutcome::Child)
    } else {
        // SAFETY: the kernel stored a fresh pidfd that nothing else owns.
        let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd) };
        Ok(CloneOutcome::Parent {
            pid: pid as libc::pid_t,
            pidfd,
        })
    }
}

/// Starts a child that shares the caller's memory (`CLONE_VM` in `flags`) and runs
/// `child(arg)` on a stack of its own, allocated here and returned: it must outlive the
/// child. The stack is left uninitialised so that only the pages the child touches are
/// faulted in; the children here need a few frames (their function and a system call).
///
/// # Safety
/// `child` may only make raw system calls (the thread-local `errno` is the caller's) and
/// touch `arg`, which must stay valid while the child runs; the caller keeps the returned
/// stack alive until the child has exec'd or exited.
unsafe fn clone_vm(
    child: extern "C" fn(*mut libc::c_void) -> libc::c_int,
    arg: *mut libc::c_void,
    flags: libc::c_int,
    stack_bytes: usize,
) -> io::Result<(libc::pid_t, Vec<u8>)> {
    let mut stack: Vec<u8> = Vec::with_capacity(stack_bytes);
    let top = (stack.as_mut_ptr() as usize + stack.capacity()) & !15;
    // SAFETY: `top` is the 16-byte aligned end of `stack`, which goes back to the caller,
    // who keeps it alive for the child; what the child does is the caller's contract.
    let pid = unsafe { libc::clone(child, top as *mut libc::c_void, flags, arg) };
    Ok((check(pid)?, stack))
}

/// What [`spawn_exec`] started: the child's pid, and why its `execve` failed if it did
/// (the child has then exited with 126, or 127 for ENOENT).
pub struct SpawnedExec {
    pub pid: libc::pid_t,
    pub exec_error: Option<io::Error>,
}

/// Shared between [`spawn_exec`] and its child, which runs in the caller's memory.
struct ExecRequest {
    /// Null: nothing to exec, the child exits with 127 at once.
    path: *const libc::c_char,
    /// A terminal to make the child's stdin, stdout, stderr and controlling terminal
    /// before the exec; -1 for none.
    terminal: RawFd,
    /// Without a terminal: the child's stdin, stdout and stderr, put in place (and made
    /// inheritable) in a process group of its own.
    stdio: [RawFd; 3],
    argv: *const *const libc::c_char,
    env: *const *const libc::c_char,
    /// Set in the child before its exec (the payload's own rlimits), `rlimit_count` of
    /// them.
    rlimits: *const ResourceLimit,
    rlimit_count: usize,
    errno: std::sync::atomic::AtomicI32,
}

extern "C" fn exec_child(request: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `spawn_exec` passes a pointer to an ExecRequest that stays alive while
    // this child runs (the parent is suspended until the child execs or exits).
    let request = unsafe { &*(request as *const ExecRequest) };
    if request.path.is_null() {
        // SAFETY: _exit only ends this child; it runs no handlers in the shared memory.
        unsafe { libc::_exit(127) }
    }
    // SAFETY: `rlimits` points at `rlimit_count` ResourceLimits owned by the suspended
    // parent (an empty slice's dangling pointer with a count of 0 is read as empty).
    let rlimits = unsafe { std::slice::from_raw_parts(request.rlimits, request.rlimit_count) };
    let placed = set_own_rlimits(rlimits).and_then(|()| {
        if request.terminal >= 0 {
            take_terminal(request.terminal)
        } else {
            take_stdio(&request.stdio)
        }
    });
    if let Err(errno) = placed {
        request
            .errno
            .store(errno, std::sync::atomic::Ordering::Relaxed);
        // SAFETY: as above.
        unsafe { libc::_exit(exec_failure_status(errno)) }
    }
    // SAFETY: path, argv and env are NUL-terminated strings and NULL-terminated arrays
    // owned by the suspended parent. The raw system call touches no libc state.
    unsafe { libc::syscall(libc::SYS_execve, request.path, request.argv, request.env) };
    let errno = io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EINVAL);
    request
        .errno
        .store(errno, std::sync::atomic::Ordering::Relaxed);
    // SAFETY: as above.
    unsafe { libc::_exit(exec_failure_status(errno)) }
}

/// In the payload's child, before its exec: its own rlimits. Raw system calls only (the
/// child runs in its suspended parent's memory). Returns the errno of a refused one.
fn set_own_rlimits(rlimits: &[ResourceLimit]) -> Result<(), i32> {
    for limit in rlimits {
        let value = libc::rlimit {
            rlim_cur: limit.soft,
            rlim_max: limit.hard,
        };
        // SAFETY: setrlimit reads the rlimit struct on this child's stack, which lives
        // through the call.
        let ret = unsafe {
            raw_syscall2(
                libc::SYS_setrlimit,
                limit.resource as usize,
                &value as *const libc::rlimit as usize,
            )
        };
        if ret < 0 {
            return Err(-ret as i32);
        }
    }
    Ok(())
}

/// In the payload's child, before its exec: a session of its own with `terminal` as the
/// controlling terminal (pid 1's session has none, and must keep none) and as fds 0-2.
/// Raw system calls only: the child runs in its suspended parent's memory. Returns the
/// errno of the step that failed.
fn take_terminal(terminal: RawFd) -> Result<(), i32> {
    let failed = |ret: libc::c_long| -> Result<(), i32> {
        if ret < 0 {
            Err(-ret as i32)
        } else {
            Ok(())
        }
    };
    // SAFETY: setsid takes no argument.
    failed(unsafe { raw_syscall2(libc::SYS_setsid, 0, 0) })?;
    // SAFETY: TIOCSCTTY takes an integer argument (0: do not steal a terminal that is
    // another session's), no pointer.
    failed(unsafe {
        raw_syscall3(
            libc::SYS_ioctl,
            terminal as usize,
            libc::TIOCSCTTY as usize,
            0,
        )
    })?;
    for target in 0..3 {
        // SAFETY: dup3 of two descriptor numbers, no pointer; `terminal` is above 2.
        failed(unsafe { raw_syscall3(libc::SYS_dup3, terminal as usize, target, 0) })?;
    }
    Ok(())
}

/// In the command's child, before its exec: a process group of its own (a session's
/// commands are killed by group) and `stdio` as fds 0-2, without close-on-exec. Raw
/// system calls only, as in [`take_terminal`].
fn take_stdio(stdio: &[RawFd; 3]) -> Result<(), i32> {
    let failed = |ret: libc::c_long| -> Result<(), i32> {
        if ret < 0 {
            Err(-ret as i32)
        } else {
            Ok(())
        }
    };
    // SAFETY: setpgid(0, 0) takes integers only.
    failed(unsafe { raw_syscall2(libc::SYS_setpgid, 0, 0) })?;
    for (target, fd) in stdio.iter().enumerate() {
        if *fd == target as RawFd {
            // Already in place: only the close-on-exec flag goes.
            // SAFETY: F_SETFD with an integer argument, no pointer.
            failed(unsafe {
                raw_syscall3(libc::SYS_fcntl, *fd as usize, libc::F_SETFD as usize, 0)
            })?;
        } else {
            // SAFETY: dup3 of two descriptor numbers, no pointer; without O_CLOEXEC the
            // copy is inherited by the exec.
            failed(unsafe { raw_syscall3(libc::SYS_dup3, *fd as usize, target, 0) })?;
        }
    }
    Ok(())
}

/// Where a command's stdio comes from, for [`spawn_exec`].
pub enum ExecStdio<'a> {
    /// stdin, stdout, stderr.
    Fds([BorrowedFd<'a>; 3]),
    /// A terminal: stdin, stdout, stderr and the controlling terminal of a new session.
    Terminal(BorrowedFd<'a>),
}

/// The exit status of a failed exec, as shells report it: 127 for a missing file, 126
/// for anything else.
pub fn exec_failure_status(errno: i32) -> i32 {
    if errno == libc::ENOENT {
        127
    } else {
        126
    }
}

/// Starts a child that only execs `path` (or, for `None`, exits with 127), the way
/// posix_spawn does: `CLONE_VM | CLONE_VFORK`, so no copy of the caller's memory is made
/// and the caller resumes once the child has exec'd or exited.
pub fn spawn_exec(
    path: Option<&CStr>,
    argv: &[CString],
    env: &[CString],
    stdio: ExecStdio<'_>,
    rlimits: &[ResourceLimit],
) -> io::Result<SpawnedExec> {
    let mut argv_ptrs: Vec<*const libc::c_char> = argv.iter().map(|a| a.as_ptr()).collect();
    argv_ptrs.push(std::ptr::null());
    let mut env_ptrs: Vec<*const libc::c_char> = env.iter().map(|e| e.as_ptr()).collect();
    env_ptrs.push(std::ptr::null());
    let request = ExecRequest {
        path: path.map_or(std::ptr::null(), |p| p.as_ptr()),
        terminal: match &stdio {
            ExecStdio::Terminal(t) => t.as_raw_fd(),
            ExecStdio::Fds(_) => -1,
        },
        stdio: match &stdio {
            ExecStdio::Fds(fds) => fds.map(|f| f.as_raw_fd()),
            ExecStdio::Terminal(_) => [-1; 3],
        },
        argv: argv_ptrs.as_ptr(),
        env: env_ptrs.as_ptr(),
        rlimits: rlimits.as_ptr(),
        rlimit_count: rlimits.len(),
        errno: std::sync::atomic::AtomicI32::new(0),
    };
    // SAFETY: with CLONE_VFORK this thread is suspended until the child execs or exits,
    // so `request`, the pointer arrays and the stack outlive every use the child makes of
    // them. exec_child makes raw system calls only. No namespace flag: the seccomp filter
    // allows it.
    let (pid, stack) = unsafe {
        clone_vm(
            exec_child,
            &request as *const ExecRequest as *mut libc::c_void,
            libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
            64 * 1024,
        )
    }?;
    drop(stack);
    let errno = request.errno.load(std::sync::atomic::Ordering::Relaxed);
    Ok(SpawnedExec {
        pid,
        exec_error: (errno != 0).then(|| io::Error::from_raw_os_error(errno)),
    })
}

/// A child process detaching, in the background, the mount stacked on the working
/// directory of its creator (the old root after `pivot_root(".", ".")`). Unmounting waits
/// for an RCU grace period (about 0.3 ms on this project's VM, asleep); the cell goes on
/// with its setup meanwhile and [`BackgroundDetach::wait`]s before anything of the
/// payload can run.
pub struct BackgroundDetach {
    /// `None` once reaped.
    pid: Option<libc::pid_t>,
    /// The child's stack, in the caller's memory: it must outlive the child (see Drop).
    _stack: Vec<u8>,
}

/// One raw system call with two arguments: no libc wrapper, so nothing is written to the
/// caller's thread-local `errno` (which [`detach_child`] shares). Returns the result or
/// the negated errno.
///
/// # Safety
/// `number` with `first` and `second` must be a system call that is sound to make here:
/// any pointer among the arguments must be valid for what the call does with it.
unsafe fn raw_syscall2(number: libc::c_long, first: usize, second: usize) -> libc::c_long {
    // SAFETY: the caller's contract; the kernel ignores the unused third register.
    unsafe { raw_syscall3(number, first, second, 0) }
}

/// [`raw_syscall2`] with a third argument.
///
/// # Safety
/// As for [`raw_syscall2`].
unsafe fn raw_syscall3(
    number: libc::c_long,
    first: usize,
    second: usize,
    third: usize,
) -> libc::c_long {
    let ret: libc::c_long;
    // SAFETY: the x86_64 Linux system call convention: number in rax, arguments in rdi,
    // rsi and rdx, result in rax; the kernel clobbers rcx and r11 and nothing else. What
    // the call does with the arguments is the caller's contract.
    unsafe {
        std::arch::asm!(
            "syscall",
            inlateout("rax") number => ret,
            in("rdi") first,
            in("rsi") second,
            in("rdx") third,
            lateout("rcx") _,
            lateout("r11") _,
            options(nostack),
        );
    }
    ret
}

extern "C" fn detach_child(_: *mut libc::c_void) -> libc::c_int {
    // This child runs in its creator's memory while the creator goes on: raw system
    // calls only. Its own copy of the working directory is the creator's at the clone.
    // SAFETY: umount2 reads only the NUL-terminated static string passed.
    let ret = unsafe {
        raw_syscall2(
            libc::SYS_umount2,
            c".".as_ptr() as usize,
            libc::MNT_DETACH as usize,
        )
    };
    // The exit status carries the errno (below 256); glibc's clone stub exits with it
    // through a raw system call.
    if ret < 0 {
        (-ret) as libc::c_int
    } else {
        0
    }
}

impl BackgroundDetach {
    /// Starts the child.
    pub fn start() -> io::Result<BackgroundDetach> {
        // SAFETY: detach_child makes raw system calls only and takes no argument; the
        // returned value keeps the stack alive until `wait` or drop has reaped the child.
        // Without CLONE_FS and CLONE_FILES the child has its own working directory and fd
        // table. No namespace flag: allowed by the kernel inside the cell.
        let (pid, stack) = unsafe {
            clone_vm(
                detach_child,
                std::ptr::null_mut(),
                libc::CLONE_VM | libc::SIGCHLD,
                16 * 1024,
            )
        }?;
        // The cell's setup is held on one CPU (see the supervisor's other_cpu) and keeps
        // it busy; the child may take whichever CPU frees up first. Best effort: the
        // kernel narrows the set to the CPUs the cell's cgroup allows.
        let _ = set_affinity(pid, &CpuSet::every());
        Ok(BackgroundDetach {
            pid: Some(pid),
            _stack: stack,
        })
    }

    /// Waits until the mount is detached; its error, if it failed.
    pub fn wait(mut self) -> io::Result<()> {
        let pid = self.pid.take().expect("reaped only here or in drop");
        let reaped = wait_child(pid, false)?
            .ok_or_else(|| io::Error::other("the detaching child vanished"))?;
        if libc::WIFEXITED(reaped.status) {
            match libc::WEXITSTATUS(reaped.status) {
                0 => Ok(()),
                errno => Err(io::Error::from_raw_os_error(errno)),
            }
        } else {
            Err(io::Error::other(format!(
                "the detaching child ended with status {:#x}",
                reaped.status
            )))
        }
    }
}

impl Drop for BackgroundDetach {
    /// A setup step failed before `wait`: the child must be gone before its stack is
    /// freed. SIGKILL ends it at its return from the kernel, before it runs another
    /// instruction; reaping it makes that certain.
    fn drop(&mut self) {
        if let Some(pid) = self.pid.take() {
            let _ = kill(pid, libc::SIGKILL);
            let _ = wait_child(pid, false);
        }
    }
}

/// The kernel's `struct sigaction` for rt_sigaction on x86_64 (not libc's layout).
#[repr(C)]
struct KernelSigaction {
    handler: usize,
    flags: u64,
    restorer: usize,
    mask: u64,
}

/// Gives every signal its default action and unblocks all of them. Ignored signals and
/// the blocked mask survive execve; the payload must not inherit the Rust runtime's
/// ignored SIGPIPE or whatever the caller of airlock had set. Raw system calls, because
/// libc refuses to touch the two signals it reserves (32 and 33).
pub fn reset_signal_state() -> io::Result<()> {
    let default_action = KernelSigaction {
        handler: libc::SIG_DFL,
        flags: 0,
        restorer: 0,
        mask: 0,
    };
    for signal in 1..=64 {
        if signal == libc::SIGKILL || signal == libc::SIGSTOP {
            continue;
        }
        // SAFETY: `default_action` is a valid kernel sigaction; the old action is not
        // requested; 8 is the size of the kernel's signal set.
        let ret = unsafe {
            libc::syscall(
                libc::SYS_rt_sigaction,
                signal,
                &default_action as *const KernelSigaction,
                std::ptr::null_mut::<KernelSigaction>(),
                8usize,
            )
        };
        check_long(ret)?;
    }
    let empty: u64 = 0;
    // SAFETY: `empty` is a valid 8-byte kernel signal set; the old mask is not requested.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_rt_sigprocmask,
            libc::SIG_SETMASK,
            &empty as *const u64,
            std::ptr::null_mut::<u64>(),
            8usize,
        )
    };
    check_long(ret).map(drop)
}

/// A set of CPUs, as `sched_setaffinity` takes it.
#[derive(Clone, Copy)]
pub struct CpuSet(libc::cpu_set_t);

impl CpuSet {
    /// The CPUs of the set, in ascending order.
    pub fn cpus(&self) -> Vec<usize> {
        (0..libc::CPU_SETSIZE as usize)
            // SAFETY: CPU_ISSET only reads the bit of `cpu`, which is below CPU_SETSIZE.
            .filter(|cpu| unsafe { libc::CPU_ISSET(*cpu, &self.0) })
            .collect()
    }

    /// A set of every CPU the kernel can name.
    pub fn every() -> CpuSet {
        // SAFETY: an all-zero cpu_set_t is the empty set.
        let mut set: libc::cpu_set_t = unsafe { zeroed() };
        for cpu in 0..libc::CPU_SETSIZE as usize {
            // SAFETY: `cpu` is below CPU_SETSIZE, the size of the set.
            unsafe { libc::CPU_SET(cpu, &mut set) };
        }
        CpuSet(set)
    }

    /// A set of the given CPUs; any at or above CPU_SETSIZE is left out.
    pub fn of(cpus: &[usize]) -> CpuSet {
        // SAFETY: an all-zero cpu_set_t is the empty set.
        let mut set: libc::cpu_set_t = unsafe { zeroed() };
        for &cpu in cpus.iter().filter(|c| **c < libc::CPU_SETSIZE as usize) {
            // SAFETY: CPU_SET writes one bit of `set`; `cpu` is below CPU_SETSIZE.
            unsafe { libc::CPU_SET(cpu, &mut set) };
        }
        CpuSet(set)
    }

    /// A set holding only `cpu` (empty if it is at or above CPU_SETSIZE).
    pub fn only(cpu: usize) -> CpuSet {
        CpuSet::of(&[cpu])
    }
}

/// The CPUs this thread may run on.
pub fn allowed_cpus() -> io::Result<CpuSet> {
    // SAFETY: an all-zero cpu_set_t is a valid out-buffer of the size passed.
    let mut set: libc::cpu_set_t = unsafe { zeroed() };
    // SAFETY: `set` is a writable cpu_set_t of the size passed.
    check(unsafe { libc::sched_getaffinity(0, size_of::<libc::cpu_set_t>(), &mut set) })?;
    Ok(CpuSet(set))
}

/// Restricts `pid` (0: the calling thread) to the CPUs of `set`.
pub fn set_affinity(pid: libc::pid_t, set: &CpuSet) -> io::Result<()> {
    // SAFETY: `set.0` is a valid cpu_set_t of the size passed.
    check(unsafe { libc::sched_setaffinity(pid, size_of::<libc::cpu_set_t>(), &set.0) }).map(drop)
}

/// The calling thread's id.
pub fn gettid() -> libc::pid_t {
    // SAFETY: gettid takes no arguments and cannot fail.
    unsafe { libc::gettid() }
}

/// The CPU the calling thread runs on right now.
pub fn current_cpu() -> Option<usize> {
    // SAFETY: sched_getcpu takes no arguments.
    let cpu = unsafe { libc::sched_getcpu() };
    usize::try_from(cpu).ok()
}

pub fn unshare(flags: libc::c_int) -> io::Result<()> {
    // SAFETY: unshare takes only an integer.
    check(unsafe { libc::unshare(flags) }).map(drop)
}

/// Creates the character device `major:minor` at `path` with permission bits `mode`
/// (the umask applies).
pub fn make_char_device(path: &Path, mode: u32, major: u32, minor: u32) -> io::Result<()> {
    let path = cstring(path)?;
    let device = libc::makedev(major, minor);
    // SAFETY: `path` is a NUL-terminated string that outlives the call.
    check(unsafe { libc::mknod(path.as_ptr(), libc::S_IFCHR | mode, device) }).map(drop)
}

pub fn mount(
    source: Option<&Path>,
    target: &Path,
    fstype: Option<&CStr>,
    flags: libc::c_ulong,
    data: Option<&CStr>,
) -> io::Result<()> {
    let source = source.map(cstring).transpose()?;
    let target = cstring(target)?;
    // SAFETY: every pointer is either null or a NUL-terminated string that outlives the call.
    check(unsafe {
        libc::mount(
            source.as_ref().map_or(std::ptr::null(), |s| s.as_ptr()),
            target.as_ptr(),
            fstype.map_or(std::ptr::null(), |s| s.as_ptr()),
            flags,
            data.map_or(std::ptr::null(), |s| s.as_ptr().cast()),
        )
    })
    .map(drop)
}

/// `umount2(target, MNT_DETACH)`: the gVisor tier's host tmpfs of a writable path, once
/// its sandbox is gone.
pub fn umount_detach(target: &Path) -> io::Result<()> {
    let target = cstring(target)?;
    // SAFETY: `target` is a NUL-terminated string that outlives the call.
    check(unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) }).map(drop)
}

pub const OPEN_TREE_CLONE: libc::c_uint = 1;
pub const OPEN_TREE_CLOEXEC: libc::c_uint = libc::O_CLOEXEC as libc::c_uint;
pub const AT_RECURSIVE: libc::c_uint = 0x8000;
const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x4;
pub const MOUNT_ATTR_RDONLY: u64 = 0x1;
pub const MOUNT_ATTR_NOSUID: u64 = 0x2;
pub const MOUNT_ATTR_NODEV: u64 = 0x4;
pub const MOUNT_ATTR_NOEXEC: u64 = 0x8;
const MOUNT_ATTR_IDMAP: u64 = 0x0010_0000;

/// `open_tree(OPEN_TREE_CLONE | AT_RECURSIVE)` of an already opened path: a detached copy
/// of the mount tree at `fd`, which can be restricted and then attached elsewhere.
pub fn clone_mount_tree(fd: BorrowedFd<'_>) -> io::Result<OwnedFd> {
    let empty = c"";
    // SAFETY: `fd` is a live descriptor and `empty` a valid empty C string (AT_EMPTY_PATH).
    let ret = unsafe {
        libc::syscall(
            libc::SYS_open_tree,
            fd.as_raw_fd(),
            empty.as_ptr(),
            OPEN_TREE_CLONE
                | OPEN_TREE_CLOEXEC
                | AT_RECURSIVE
                | libc::AT_EMPTY_PATH as libc::c_uint,
        )
    };
    let fd = check_long(ret)? as RawFd;
    // SAFETY: open_tree returned a new descriptor owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

/// `mount_setattr` on the mount at `fd` (and, with `recursive`, every mount below it):
/// unlike `MS_REMOUNT|MS_BIND` this reaches submounts too.
pub fn set_mount_attributes(fd: BorrowedFd<'_>, attr_set: u64, recursive: bool) -> io::Result<()> {
    let attr = MountAttr {
        attr_set,
        attr_clr: 0,
        propagation: libc::MS_PRIVATE,
        userns_fd: 0,
    };
    let mut flags = libc::AT_EMPTY_PATH as libc::c_uint;
    if recursive {
        flags |= AT_RECURSIVE;
    }
    // SAFETY: `attr` is a properly laid out `struct mount_attr` whose size we pass; `fd` is
    // live and the path is the empty string (AT_EMPTY_PATH).
    let ret = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            fd.as_raw_fd(),
            c"".as_ptr(),
            flags,
            &attr as *const MountAttr,
            size_of::<MountAttr>(),
        )
    };
    check_long(ret).map(drop)
}

/// `mount_setattr(MOUNT_ATTR_IDMAP)` on the detached mount `tree` (and every mount below
/// it): file owners are shown through the id maps of the user namespace `userns` (see
/// [`user_namespace_with_maps`]). EINVAL: the filesystem (or a submount's) has no
/// idmapped mounts, or the mount was attached already.
pub fn set_mount_idmap(tree: BorrowedFd<'_>, userns: BorrowedFd<'_>) -> io::Result<()> {
    let attr = MountAttr {
        attr_set: MOUNT_ATTR_IDMAP,
        attr_clr: 0,
        propagation: 0,
        userns_fd: userns.as_raw_fd() as u64,
    };
    // SAFETY: `attr` is a properly laid out `struct mount_attr` whose size we pass; both
    // descriptors are live and the path is the empty string (AT_EMPTY_PATH).
    let ret = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            tree.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH as libc::c_uint | AT_RECURSIVE,
            &attr as *const MountAttr,
            size_of::<MountAttr>(),
        )
    };
    check_long(ret).map(drop)
}

extern "C" fn park_child(_: *mut libc::c_void) -> libc::c_int {
    // Runs in its creator's memory: raw system calls only. It exists only so that its
    // user namespace can be given maps and opened; its creator kills it.
    loop {
        // SAFETY: pause takes no arguments and touches no memory.
        unsafe { raw_syscall2(libc::SYS_pause, 0, 0) };
    }
}

/// A child parked in a fresh user namespace (see [`user_namespace_with_maps`]); killed
/// and reaped on drop, before its stack is freed.
struct ParkedChild {
    pid: libc::pid_t,
    _stack: Vec<u8>,
}

impl Drop for ParkedChild {
    fn drop(&mut self) {
        let _ = kill(self.pid, libc::SIGKILL);
        let _ = wait_child(self.pid, false);
    }
}

/// A new user namespace with exactly `uid_map` and `gid_map` (the text of
/// `/proc/<pid>/uid_map`), held by the returned descriptor alone: the process created to
/// own it is gone on return. For idmapped mounts, whose owners the kernel shows through
/// these maps. Needs CAP_SETUID and CAP_SETGID over the ids mapped.
pub fn user_namespace_with_maps(uid_map: &str, gid_map: &str) -> io::Result<OwnedFd> {
    // SAFETY: park_child makes raw system calls only and takes no argument; ParkedChild
    // keeps the stack alive until the child is killed and reaped. CLONE_NEWUSER needs
    // neither CLONE_FS nor CLONE_THREAD, which are not passed.
    let (pid, stack) = unsafe {
        clone_vm(
            park_child,
            std::ptr::null_mut(),
            libc::CLONE_VM | libc::CLONE_NEWUSER | libc::SIGCHLD,
            16 * 1024,
        )
    }?;
    let child = ParkedChild { pid, _stack: stack };
    std::fs::write(format!("/proc/{}/uid_map", child.pid), uid_map)?;
    std::fs::write(format!("/proc/{}/gid_map", child.pid), gid_map)?;
    let userns = std::fs::File::open(format!("/proc/{}/ns/user", child.pid))?;
    drop(child);
    Ok(userns.into())
}

/// Attaches the detached mount `tree` on top of `target`.
pub fn attach_mount(tree: BorrowedFd<'_>, target: &Path) -> io::Result<()> {
    let target = cstring(target)?;
    // SAFETY: `tree` is a live mount fd, both strings are valid for the call.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            tree.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_FDCWD,
            target.as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH,
        )
    };
    check_long(ret).map(drop)
}

/// `pivot_root(".", ".")`: the current directory becomes `/` and the old root is stacked
/// on top of it, ready to be detached with `umount2(".", MNT_DETACH)`.
pub fn pivot_root_to_cwd() -> io::Result<()> {
    // SAFETY: both arguments are valid C strings.
    let ret = unsafe { libc::syscall(libc::SYS_pivot_root, c".".as_ptr(), c".".as_ptr()) };
    check_long(ret).map(drop)
}

pub fn sethostname(name: &str) -> io::Result<()> {
    // SAFETY: pointer and length describe `name`'s bytes.
    check(unsafe { libc::sethostname(name.as_ptr().cast(), name.len()) }).map(drop)
}

/// `NS_GET_NSTYPE` (linux/nsfs.h, `_IO(0xb7, 0x3)`): the `CLONE_NEW*` type of the
/// namespace an nsfs descriptor refers to.
const NS_GET_NSTYPE: libc::c_ulong = 0xb703;

/// The `CLONE_NEW*` type of the namespace `fd` refers to; `ENOTTY` (or `EINVAL`) when
/// `fd` is not a namespace of nsfs at all.
pub fn namespace_type(fd: BorrowedFd<'_>) -> io::Result<libc::c_int> {
    // SAFETY: NS_GET_NSTYPE takes no argument and only reads the descriptor's inode.
    check(unsafe { libc::ioctl(fd.as_raw_fd(), NS_GET_NSTYPE) })
}

/// Moves the calling thread into the namespace `fd` refers to, which must be of type
/// `nstype` (the kernel checks it).
pub fn setns(fd: BorrowedFd<'_>, nstype: libc::c_int) -> io::Result<()> {
    // SAFETY: setns takes a descriptor and an integer; a wrong type is refused (EINVAL).
    check(unsafe { libc::setns(fd.as_raw_fd(), nstype) }).map(drop)
}

/// Brings the loopback interface of the current network namespace up.
pub fn loopback_up() -> io::Result<()> {
    // SAFETY: socket() takes integers only.
    let fd =
        check(unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) })?;
    // SAFETY: `fd` was just created and is owned here.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: ifreq is plain old data; all-zero is a valid value.
    let mut req: libc::ifreq = unsafe { zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(b"lo\0") {
        *dst = *src as libc::c_char;
    }
    req.ifr_ifru.ifru_flags = (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
    // SAFETY: SIOCSIFFLAGS reads a `struct ifreq`, which `req` is.
    check(unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &req) }).map(drop)
}

pub fn setsid() -> io::Result<()> {
    // SAFETY: no arguments.
    check(unsafe { libc::setsid() }).map(drop)
}

/// One resource limit, soft and hard.
#[derive(Debug, Clone, Copy)]
pub struct ResourceLimit {
    pub resource: libc::__rlimit_resource_t,
    pub soft: u64,
    pub hard: u64,
}

pub fn set_rlimit(limit: ResourceLimit) -> io::Result<()> {
    let value = libc::rlimit {
        rlim_cur: limit.soft,
        rlim_max: limit.hard,
    };
    // SAFETY: `value` is a valid rlimit struct.
    check(unsafe { libc::setrlimit(limit.resource, &value) }).map(drop)
}

pub fn set_ids(uid: u32, gid: u32) -> io::Result<()> {
    // SAFETY: integer arguments only.
    check(unsafe { libc::setresgid(gid, gid, gid) })?;
    // SAFETY: integer arguments only.
    check(unsafe { libc::setresuid(uid, uid, uid) }).map(drop)
}

/// Drops every supplementary group of the calling process (must happen before the user
/// namespace exists: inside it `setgroups` is denied).
pub fn clear_supplementary_groups() -> io::Result<()> {
    // SAFETY: a zero-length list with a null pointer is the documented way to clear.
    check(unsafe { libc::setgroups(0, std::ptr::null()) }).map(drop)
}

/// Makes the child `command` spawns get SIGKILL when the thread that spawned it dies
/// (`PR_SET_PDEATHSIG`, set in the child before its exec); a child whose spawner is
/// already gone exits at once instead of running unwatched.
pub fn kill_with_spawner(command: &mut std::process::Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: getpid takes no arguments and cannot fail.
    let spawner = unsafe { libc::getpid() };
    let arm = move || {
        // SAFETY: between fork and exec only async-signal-safe calls are made here
        // (prctl, getppid, _exit), nothing is allocated, and PR_SET_PDEATHSIG takes a
        // signal number, no pointer.
        unsafe {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) != 0 {
                return Err(io::Error::last_os_error());
            }
            if libc::getppid() != spawner {
                libc::_exit(1);
            }
        }
        Ok(())
    };
    // SAFETY: `arm` is async-signal-safe, as pre_exec requires (see above).
    unsafe {
        command.pre_exec(arm);
    }
}

pub fn prctl(option: libc::c_int, arg2: libc::c_ulong) -> io::Result<libc::c_int> {
    // SAFETY: the prctl options used by airlock take integer arguments only.
    check(unsafe {
        libc::prctl(
            option,
            arg2,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
        )
    })
}

pub fn prctl3(
    option: libc::c_int,
    arg2: libc::c_ulong,
    arg3: libc::c_ulong,
) -> io::Result<libc::c_int> {
    // SAFETY: integer arguments only (PR_CAP_AMBIENT).
    check(unsafe { libc::prctl(option, arg2, arg3, 0 as libc::c_ulong, 0 as libc::c_ulong) })
}

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}

#[repr(C)]
#[derive(Default, Clone, Copy)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;

/// Empties the effective, permitted and inheritable capability sets.
pub fn clear_capability_sets() -> io::Result<()> {
    let header = CapHeader {
        version: LINUX_CAPABILITY_VERSION_3,
        pid: 0,
    };
    let data = [CapData::default(); 2];
    // SAFETY: version 3 capset reads one header and two data structs, which we pass.
    let ret =
        unsafe { libc::syscall(libc::SYS_capset, &header as *const CapHeader, data.as_ptr()) };
    check_long(ret).map(drop)
}

/// Installs a classic BPF program as a seccomp filter (requires no_new_privs).
pub fn install_seccomp_filter(program: &[libc::sock_filter]) -> io::Result<()> {
    let prog = libc::sock_fprog {
        len: program.len() as libc::c_ushort,
        filter: program.as_ptr() as *mut libc::sock_filter,
    };
    // SAFETY: `prog` points at `program`, which lives for the duration of the call; the
    // kernel copies the filter.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_SET_MODE_FILTER,
            0,
            &prog as *const libc::sock_fprog,
        )
    };
    check_long(ret).map(drop)
}

/// Marks every descriptor from 3 up close-on-exec, so only 0, 1 and 2 reach the payload
/// while the launcher can still report an exec failure.
pub fn cloexec_from_3() -> io::Result<()> {
    // SAFETY: integer arguments only.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_close_range,
            3u32,
            u32::MAX,
            libc::CLOSE_RANGE_CLOEXEC,
        )
    };
    check_long(ret).map(drop)
}

pub fn dup2(from: RawFd, to: RawFd) -> io::Result<()> {
    // SAFETY: dup2 on integers; an invalid `from` only yields EBADF.
    check(unsafe { libc::dup2(from, to) }).map(drop)
}

/// `execve`; only returns on failure.
pub fn exit_now(code: i32) -> ! {
    // SAFETY: _exit never returns and skips atexit handlers, which must not run in a
    // forked copy of the supervisor.
    unsafe { libc::_exit(code) }
}

/// Raw wait status plus resource usage of one reaped child.
pub struct Reaped {
    pub pid: libc::pid_t,
    pub status: libc::c_int,
    pub usage: libc::rusage,
}

/// A `rusage` with every field zero.
pub fn zero_rusage() -> libc::rusage {
    // SAFETY: rusage is plain old data: all zeroes is a valid value of it.
    unsafe { zeroed() }
}

/// `wait4(pid, ..)`, retrying on EINTR. `pid = -1` waits for any child.
pub fn wait_child(pid: libc::pid_t, nohang: bool) -> io::Result<Option<Reaped>> {
    let mut status = 0;
    let mut usage = zero_rusage();
    let options = if nohang { libc::WNOHANG } else { 0 } | libc::__WALL;
    loop {
        // SAFETY: `status` and `usage` are valid out-pointers.
        let ret = unsafe { libc::wait4(pid, &mut status, options, &mut usage) };
        if ret < 0 {
            let err = io::Error::last_os_error();
            if err.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(err);
        }
        if ret == 0 {
            return Ok(None);
        }
        return Ok(Some(Reaped {
            pid: ret,
            status,
            usage,
        }));
    }
}

pub fn kill(pid: libc::pid_t, signal: libc::c_int) -> io::Result<()> {
    // SAFETY: integer arguments only.
    check(unsafe { libc::kill(pid, signal) }).map(drop)
}

/// `pidfd_open(pid, 0)`: a descriptor that polls readable once `pid` exited (the gVisor
/// tier's sandbox process, a child of this process by the subreaper attribute).
pub fn pidfd_open(pid: libc::pid_t) -> io::Result<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned this descriptor; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

pub fn pidfd_send_signal(pidfd: BorrowedFd<'_>, signal: libc::c_int) -> io::Result<()> {
    // SAFETY: `pidfd` is live; null siginfo and zero flags are valid.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            signal,
            std::ptr::null::<u8>(),
            0,
        )
    };
    check_long(ret).map(drop)
}

pub fn pipe_cloexec() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two descriptors.
    check(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) })?;
    // SAFETY: pipe2 returned two fresh descriptors owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Sets O_NONBLOCK on `fd`'s open file description. Only for descriptions airlock created
/// itself (a pipe end): the flag is shared with every holder of the description.
pub fn set_nonblocking(fd: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: F_GETFL/F_SETFL read and write the status flags of a descriptor we borrow;
    // no memory is passed.
    let flags = check(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) })?;
    // SAFETY: as above.
    check(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, flags | libc::O_NONBLOCK) })?;
    Ok(())
}

/// `fchown(2)`: gives the file behind `fd` (here: a pipe airlock created) to `uid:gid`.
pub fn fchown(fd: BorrowedFd<'_>, uid: u32, gid: u32) -> io::Result<()> {
    // SAFETY: integer arguments only; the descriptor is borrowed, so it is open.
    check(unsafe { libc::fchown(fd.as_raw_fd(), uid, gid) })?;
    Ok(())
}

pub fn seqpacket_pair() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two descriptors.
    check(unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
            0,
            fds.as_mut_ptr(),
        )
    })?;
    // SAFETY: socketpair returned two fresh descriptors owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

pub fn read(fd: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: `buf` is valid for `buf.len()` writable bytes.
    let ret = unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret as usize)
    }
}

pub fn write(fd: BorrowedFd<'_>, buf: &[u8]) -> io::Result<usize> {
    // SAFETY: `buf` is valid for `buf.len()` readable bytes.
    let ret = unsafe { libc::write(fd.as_raw_fd(), buf.as_ptr().cast(), buf.len()) };
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret as usize)
    }
}

/// `poll(2)` on `fds`; returns the number of ready entries (0 on timeout). EINTR counts as
/// a timeout so callers re-check their clocks.
pub fn poll(fds: &mut [libc::pollfd], timeout_ms: i32) -> io::Result<usize> {
    // SAFETY: `fds` is a valid array of `fds.len()` pollfd structs.
    let ret = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout_ms) };
    if ret < 0 {
        let err = io::Error::last_os_error();
        if err.kind() == io::ErrorKind::Interrupted {
            return Ok(0);
        }
        return Err(err);
    }
    Ok(ret as usize)
}

/// Sends `data` plus the descriptors `fds` (SCM_RIGHTS) as one message.
pub fn send_with_fds(sock: BorrowedFd<'_>, data: &[u8], fds: &[RawFd]) -> io::Result<()> {
    let mut iov = libc::iovec {
        iov_base: data.as_ptr() as *mut libc::c_void,
        iov_len: data.len(),
    };
    let fd_bytes = std::mem::size_of_val(fds);
    // SAFETY: CMSG_SPACE only computes a size.
    let space = unsafe { libc::CMSG_SPACE(fd_bytes as u32) } as usize;
    let mut control = vec![0u8; space.max(1)];
    // SAFETY: msghdr is plain old data; zero is a valid initial value.
    let mut msg: libc::msghdr = unsafe { zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if !fds.is_empty() {
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = space;
        // SAFETY: msg_control points at `space` bytes, enough for one cmsg header carrying
        // `fds.len()` descriptors, so the first header and its data are in bounds.
        unsafe {
            let cmsg = libc::CMSG_FIRSTHDR(&msg);
            (*cmsg).cmsg_level = libc::SOL_SOCKET;
            (*cmsg).cmsg_type = libc::SCM_RIGHTS;
            (*cmsg).cmsg_len = libc::CMSG_LEN(fd_bytes as u32) as usize;
            std::ptr::copy_nonoverlapping(
                fds.as_ptr().cast::<u8>(),
                libc::CMSG_DATA(cmsg),
                fd_bytes,
            );
        }
    }
    // SAFETY: `msg` references `iov` and `control`, both alive for the call.
    let ret = unsafe { libc::sendmsg(sock.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// The next message of a SOCK_SEQPACKET socket with up to `max_fds` descriptors (marked
/// close-on-exec), in a buffer sized to it: a fixed large buffer would fault in fresh
/// pages at every cell start. Blocks until there is one; `None` when the peer closed its
/// end.
pub fn recv_message(
    sock: BorrowedFd<'_>,
    max_fds: usize,
) -> io::Result<Option<(Vec<u8>, Vec<OwnedFd>)>> {
    loop {
        let length = next_message_len(sock)?;
        if length == 0 {
            return Ok(None);
        }
        let mut message = vec![0u8; length];
        match recv_with_fds(sock, &mut message, max_fds) {
            Ok((0, _)) => return Ok(None),
            Ok((n, fds)) => {
                message.truncate(n);
                return Ok(Some((message, fds)));
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
}

/// Length of the next message on a SOCK_SEQPACKET socket, without consuming it
/// (blocks until there is one; 0 means the peer closed its end).
fn next_message_len(sock: BorrowedFd<'_>) -> io::Result<usize> {
    loop {
        // SAFETY: a zero-length receive into a null buffer; MSG_TRUNC makes the kernel
        // return the full length of the pending message and MSG_PEEK leaves it queued.
        let ret = unsafe {
            libc::recv(
                sock.as_raw_fd(),
                std::ptr::null_mut(),
                0,
                libc::MSG_PEEK | libc::MSG_TRUNC,
            )
        };
        if ret >= 0 {
            return Ok(ret as usize);
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
}

/// Receives one message into `buf` and up to `max_fds` descriptors (marked close-on-exec).
pub fn recv_with_fds(
    sock: BorrowedFd<'_>,
    buf: &mut [u8],
    max_fds: usize,
) -> io::Result<(usize, Vec<OwnedFd>)> {
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let fd_bytes = max_fds * size_of::<RawFd>();
    // SAFETY: CMSG_SPACE only computes a size.
    let space = unsafe { libc::CMSG_SPACE(fd_bytes as u32) } as usize;
    let mut control = vec![0u8; space];
    // SAFETY: msghdr is plain old data; zero is a valid initial value.
    let mut msg: libc::msghdr = unsafe { zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = space;
    // SAFETY: `msg` references `iov` (over `buf`) and `control`, both alive for the call.
    let ret = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut received = Vec::new();
    // SAFETY: walking the control buffer the kernel filled, with the libc CMSG macros,
    // which never step outside `msg_controllen`; each SCM_RIGHTS payload holds whole fds
    // that now belong to this process.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                let data_len = (*cmsg).cmsg_len as usize - libc::CMSG_LEN(0) as usize;
                let count = data_len / size_of::<RawFd>();
                let data = libc::CMSG_DATA(cmsg).cast::<RawFd>();
                for i in 0..count {
                    received.push(OwnedFd::from_raw_fd(data.add(i).read_unaligned()));
                }
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
    }
    Ok((ret as usize, received))
}

/// What the supervisor needs from `/proc/<pid>/stat`.
pub struct ProcessStat {
    pub threads: usize,
    /// Clock ticks since boot: with the pid, it names a process across pid reuse.
    pub start_time: u64,
    /// Where this process's argument and environment strings are; empty for another
    /// process.
    pub command_line: CommandLineArea,
}

/// Addresses of this process's argument and environment strings (fields 48-51 of
/// `/proc/self/stat`): what `/proc/<pid>/cmdline` and `/proc/<pid>/environ` read. Only
/// [`process_stat`] of this very process makes one, so it always describes the memory of
/// the process that holds it (or of its fork-like clones: a copy of the same layout).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CommandLineArea {
    arg_start: usize,
    arg_end: usize,
    env_start: usize,
    env_end: usize,
}

/// Fields 20 (num_threads), 22 (starttime) and 48-51 (arg_start, arg_end, env_start,
/// env_end) of `/proc/<pid>/stat`.
pub fn process_stat(pid: u32) -> io::Result<ProcessStat> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the parenthesised command name are plain; they start at field 3.
    let mut fields = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest)
        .unwrap_or("")
        .split_whitespace();
    let bad = || io::Error::new(io::ErrorKind::InvalidData, format!("/proc/{pid}/stat"));
    let threads = fields
        .nth(17)
        .and_then(|v| v.parse().ok())
        .ok_or_else(bad)?;
    let start_time = fields.nth(1).and_then(|v| v.parse().ok()).ok_or_else(bad)?;
    let mut address = |skip: usize| fields.nth(skip).and_then(|v| v.parse().ok());
    let command_line = if pid == std::process::id() {
        CommandLineArea {
            arg_start: address(25).ok_or_else(bad)?,
            arg_end: address(0).ok_or_else(bad)?,
            env_start: address(0).ok_or_else(bad)?,
            env_end: address(0).ok_or_else(bad)?,
        }
    } else {
        CommandLineArea::default()
    };
    Ok(ProcessStat {
        threads,
        start_time,
        command_line,
    })
}

/// Makes `/proc/<pid>/cmdline` of this process read `name` (and a NUL) and
/// `/proc/<pid>/environ` read only NULs, by overwriting the strings in place: the
/// kernel's own pointers (PR_SET_MM_ARG_START) need CAP_SYS_RESOURCE in the initial user
/// namespace. The last byte of the argument area is left non-NUL, which the kernel takes
/// for setproctitle(3) and then shows the area up to its first NUL only, so that not even
/// the length of the old command line remains.
///
/// # Safety
/// The process must be single-threaded, and nothing may hold a reference into those
/// strings while they change (std's `env::args` and `env::var` copy them on each call;
/// libc's `environ` array keeps pointing at them, now at empty strings).
unsafe fn overwrite_command_line(area: &CommandLineArea, name: &[u8]) {
    if area.arg_end > area.arg_start {
        // SAFETY: a CommandLineArea describes this process's argument strings (see its
        // type), mapped and writable (the top of the initial stack); the caller
        // guarantees that nothing else reads or references them meanwhile.
        let args = unsafe {
            std::slice::from_raw_parts_mut(area.arg_start as *mut u8, area.arg_end - area.arg_start)
        };
        args.fill(0);
        // One byte for the terminating NUL, one for the non-NUL end marker.
        let kept = name.len().min(args.len().saturating_sub(2));
        args[..kept].copy_from_slice(&name[..kept]);
        if args.len() >= 2 {
            args[args.len() - 1] = b' ';
        }
    }
    if area.env_end > area.env_start {
        // SAFETY: as above, for this process's environment strings.
        unsafe {
            std::ptr::write_bytes(area.env_start as *mut u8, 0, area.env_end - area.env_start)
        };
    }
}

/// Sets this thread's name (`/proc/<pid>/comm`; truncated by the kernel to 15 bytes).
pub fn set_thread_name(name: &CStr) -> io::Result<()> {
    // SAFETY: PR_SET_NAME reads a NUL-terminated string of at most 16 bytes from the
    // pointer, which `name` provides for the call.
    check(unsafe { libc::prctl(libc::PR_SET_NAME, name.as_ptr() as libc::c_ulong, 0, 0, 0) })
        .map(drop)
}

pub fn geteuid() -> u32 {
    // SAFETY: no arguments, cannot fail.
    unsafe { libc::geteuid() }
}

pub fn getegid() -> u32 {
    // SAFETY: no arguments, cannot fail.
    unsafe { libc::getegid() }
}

/// Free blocks and inodes of the filesystem at `path`.
pub fn statfs_free(path: &Path) -> io::Result<(u64, u64)> {
    let path = cstring(path)?;
    // SAFETY: statfs is plain old data.
    let mut buf: libc::statfs = unsafe { zeroed() };
    // SAFETY: `path` is a valid C string and `buf` a valid out-pointer.
    check(unsafe { libc::statfs(path.as_ptr(), &mut buf) })?;
    Ok((buf.f_bavail, buf.f_ffree))
}

/// The Landlock ABI version the kernel offers (0 when Landlock is absent or disabled).
pub fn landlock_abi_version() -> i64 {
    const LANDLOCK_CREATE_RULESET_VERSION: libc::c_uint = 1;
    // SAFETY: with a null attribute pointer, size 0 and the VERSION flag the call only
    // returns a number.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<u8>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    ret.max(0)
}

#[repr(C)]
struct OpenHow {
    flags: u64,
    mode: u64,
    resolve: u64,
}

const RESOLVE_NO_XDEV: u64 = 0x01;
const RESOLVE_NO_MAGICLINKS: u64 = 0x02;
const RESOLVE_NO_SYMLINKS: u64 = 0x04;
const RESOLVE_BENEATH: u64 = 0x08;
const RESOLVE_IN_ROOT: u64 = 0x10;

/// Opens `path` relative to `dir` with `openat2`, refusing every symlink and magic link
/// on the way. `in_root` treats `dir` as `/` (absolute paths and `..` cannot leave it);
/// otherwise the path must stay beneath `dir` and on its mount.
pub fn open_no_symlinks(
    dir: BorrowedFd<'_>,
    path: &Path,
    flags: libc::c_int,
    in_root: bool,
) -> io::Result<OwnedFd> {
    let resolve = RESOLVE_NO_SYMLINKS
        | RESOLVE_NO_MAGICLINKS
        | if in_root {
            RESOLVE_IN_ROOT
        } else {
            RESOLVE_BENEATH | RESOLVE_NO_XDEV
        };
    openat2(dir, path, flags, 0, resolve)
}

/// Creates the regular file `name` in `dir` (`O_CREAT | O_EXCL`, so nothing that exists
/// there, not even a dangling symlink, is opened), for writing, with `mode` (less the
/// umask). `name` must stay beneath `dir` without a symlink or a mount crossing.
pub fn create_exclusive(dir: BorrowedFd<'_>, name: &Path, mode: u32) -> io::Result<OwnedFd> {
    openat2(
        dir,
        name,
        libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL,
        mode,
        RESOLVE_BENEATH | RESOLVE_NO_XDEV | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS,
    )
}

fn openat2(
    dir: BorrowedFd<'_>,
    path: &Path,
    flags: libc::c_int,
    mode: u32,
    resolve: u64,
) -> io::Result<OwnedFd> {
    let path = cstring(path)?;
    let how = OpenHow {
        flags: (flags | libc::O_CLOEXEC | libc::O_NOFOLLOW) as u64,
        mode: mode as u64,
        resolve,
    };
    // SAFETY: `how` is a valid `struct open_how` whose size we pass (the kernel accepts a
    // non-zero mode only with O_CREAT or O_TMPFILE, which is the callers' business);
    // `path` is a valid C string and `dir` a live descriptor.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            dir.as_raw_fd(),
            path.as_ptr(),
            &how as *const OpenHow,
            size_of::<OpenHow>(),
        )
    };
    let fd = check_long(ret)? as RawFd;
    // SAFETY: openat2 returned a new descriptor owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `mkdirat(2)`: creates the directory `name` in `dir`. Like mkdir, it never follows a
/// symlink at `name` (it fails with EEXIST).
pub fn mkdirat(dir: BorrowedFd<'_>, name: &Path, mode: u32) -> io::Result<()> {
    let name = cstring(name)?;
    // SAFETY: `name` is a valid C string and `dir` a live descriptor.
    check(unsafe { libc::mkdirat(dir.as_raw_fd(), name.as_ptr(), mode as libc::mode_t) }).map(drop)
}

/// `renameat2(2)` with `RENAME_NOREPLACE`: moves `from` to `to`, both in `dir`, and fails
/// with EEXIST instead of replacing whatever is at `to` (file, symlink, FIFO, directory).
/// EINVAL means the filesystem does not support the flag.
pub fn rename_noreplace(dir: BorrowedFd<'_>, from: &Path, to: &Path) -> io::Result<()> {
    let (from, to) = (cstring(from)?, cstring(to)?);
    // SAFETY: both names are valid C strings and `dir` a live descriptor.
    let ret = unsafe {
        libc::renameat2(
            dir.as_raw_fd(),
            from.as_ptr(),
            dir.as_raw_fd(),
            to.as_ptr(),
            libc::RENAME_NOREPLACE,
        )
    };
    check(ret).map(drop)
}

/// `linkat(2)` within `dir` without following a symlink at `from`; like any link it fails
/// with EEXIST when `to` exists.
pub fn link_within(dir: BorrowedFd<'_>, from: &Path, to: &Path) -> io::Result<()> {
    let (from, to) = (cstring(from)?, cstring(to)?);
    // SAFETY: both names are valid C strings and `dir` a live descriptor; flags 0.
    let ret = unsafe {
        libc::linkat(
            dir.as_raw_fd(),
            from.as_ptr(),
            dir.as_raw_fd(),
            to.as_ptr(),
            0,
        )
    };
    check(ret).map(drop)
}

/// `unlinkat(2)` of the non-directory `name` in `dir` (a symlink is removed, not followed).
pub fn unlinkat(dir: BorrowedFd<'_>, name: &Path) -> io::Result<()> {
    let name = cstring(name)?;
    // SAFETY: `name` is a valid C string and `dir` a live descriptor.
    check(unsafe { libc::unlinkat(dir.as_raw_fd(), name.as_ptr(), 0) }).map(drop)
}

/// A new pseudo-terminal pair of the devpts instance at `/dev/pts` (the caller's mount
/// namespace decides which instance): `(master, slave)`, both close-on-exec and opened
/// without becoming anyone's controlling terminal. The slave is reached through the
/// master (TIOCGPTPEER), never by a path that could name another instance's pty.
pub fn open_pty_pair() -> io::Result<(OwnedFd, OwnedFd)> {
    let flags = libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC;
    // SAFETY: a static NUL-terminated path.
    let fd = check(unsafe { libc::open(c"/dev/pts/ptmx".as_ptr(), flags) })?;
    // SAFETY: open returned a new descriptor owned by nobody else.
    let master = unsafe { OwnedFd::from_raw_fd(fd) };
    let unlock: libc::c_int = 0;
    // SAFETY: TIOCSPTLCK reads one int from the valid pointer.
    check(unsafe { libc::ioctl(master.as_raw_fd(), libc::TIOCSPTLCK, &unlock) })?;
    // SAFETY: TIOCGPTPEER takes open flags as an integer and returns a new descriptor.
    let slave = check(unsafe { libc::ioctl(master.as_raw_fd(), libc::TIOCGPTPEER, flags) })?;
    // SAFETY: the ioctl returned a new descriptor owned by nobody else.
    Ok((master, unsafe { OwnedFd::from_raw_fd(slave) }))
}

/// The number N of a pseudo-terminal master's slave, `/dev/pts/N` in its devpts.
pub fn pty_number(master: BorrowedFd<'_>) -> io::Result<u32> {
    let mut number: libc::c_uint = 0;
    // SAFETY: TIOCGPTN writes one unsigned int through the valid pointer.
    check(unsafe { libc::ioctl(master.as_raw_fd(), libc::TIOCGPTN, &mut number) })?;
    Ok(number)
}

pub fn is_terminal(fd: BorrowedFd<'_>) -> bool {
    // SAFETY: isatty only inspects the descriptor.
    unsafe { libc::isatty(fd.as_raw_fd()) == 1 }
}

pub fn terminal_modes(fd: BorrowedFd<'_>) -> io::Result<libc::termios> {
    // SAFETY: termios is plain old data; zero is a valid initial value.
    let mut modes: libc::termios = unsafe { zeroed() };
    // SAFETY: tcgetattr fills the termios through the valid pointer.
    check(unsafe { libc::tcgetattr(fd.as_raw_fd(), &mut modes) })?;
    Ok(modes)
}

/// Sets the modes once pending output is written (`TCSADRAIN`), so that nothing the
/// payload printed is processed under the wrong modes.
pub fn set_terminal_modes(fd: BorrowedFd<'_>, modes: &libc::termios) -> io::Result<()> {
    // SAFETY: tcsetattr reads the termios through the valid pointer.
    check(unsafe { libc::tcsetattr(fd.as_raw_fd(), libc::TCSADRAIN, modes) }).map(drop)
}

/// `modes` in raw mode (no echo, no line editing, no signals from keys, no output
/// processing), as `cfmakeraw` makes them.
pub fn raw_modes(modes: &libc::termios) -> libc::termios {
    let mut raw = *modes;
    // SAFETY: cfmakeraw only edits the termios it is given.
    unsafe { libc::cfmakeraw(&mut raw) };
    raw
}

pub fn window_size(fd: BorrowedFd<'_>) -> io::Result<libc::winsize> {
    // SAFETY: winsize is plain old data; zero is a valid initial value.
    let mut size: libc::winsize = unsafe { zeroed() };
    // SAFETY: TIOCGWINSZ fills the winsize through the valid pointer.
    check(unsafe { libc::ioctl(fd.as_raw_fd(), libc::TIOCGWINSZ, &mut size) })?;
    Ok(size)
}

pub fn set_window_size(fd: BorrowedFd<'_>, size: &libc::winsize) -> io::Result<()> {
    // SAFETY: TIOCSWINSZ reads a winsize through the valid pointer.
    check(unsafe { libc::ioctl(fd.as_raw_fd(), libc::TIOCSWINSZ, size) }).map(drop)
}

fn signal_set(signals: &[libc::c_int]) -> libc::sigset_t {
    // SAFETY: sigset_t is plain old data; zero is a valid initial value.
    let mut set: libc::sigset_t = unsafe { zeroed() };
    // SAFETY: sigemptyset edits the valid set.
    unsafe { libc::sigemptyset(&mut set) };
    for signal in signals {
        // SAFETY: as above.
        unsafe { libc::sigaddset(&mut set, *signal) };
    }
    set
}

/// Blocks `signals` in the calling thread (threads started later inherit the mask) and
/// returns a non-blocking signalfd that reads them, with the previous mask.
///
/// The caller must be single-threaded, or a thread that leaves them unblocked would take
/// them with their default action (which is what this is meant to replace).
pub fn block_into_signalfd(signals: &[libc::c_int]) -> io::Result<(OwnedFd, libc::sigset_t)> {
    let set = signal_set(signals);
    // SAFETY: sigset_t is plain old data; zero is a valid initial value.
    let mut previous: libc::sigset_t = unsafe { zeroed() };
    // SAFETY: both sets are valid for the call.
    let ret = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut previous) };
    if ret != 0 {
        return Err(io::Error::from_raw_os_error(ret));
    }
    // SAFETY: a new signalfd for the valid set.
    let fd = unsafe { libc::signalfd(-1, &set, libc::SFD_CLOEXEC | libc::SFD_NONBLOCK) };
    match check(fd) {
        // SAFETY: signalfd returned a new descriptor owned by nobody else.
        Ok(fd) => Ok((unsafe { OwnedFd::from_raw_fd(fd) }, previous)),
        Err(err) => {
            restore_signal_mask(&previous);
            Err(err)
        }
    }
}

pub fn restore_signal_mask(mask: &libc::sigset_t) {
    // SAFETY: the set is valid; the old mask is not requested.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, mask, std::ptr::null_mut()) };
}

/// The next signal queued on a signalfd, `None` when there is none.
pub fn read_signal(fd: BorrowedFd<'_>) -> Option<libc::c_int> {
    // SAFETY: signalfd_siginfo is plain old data; zero is a valid initial value.
    let mut info: libc::signalfd_siginfo = unsafe { zeroed() };
    let size = size_of::<libc::signalfd_siginfo>();
    // SAFETY: read fills at most `size` bytes of `info`.
    let ret = unsafe {
        libc::read(
            fd.as_raw_fd(),
            (&mut info as *mut libc::signalfd_siginfo).cast(),
            size,
        )
    };
    (ret == size as isize).then_some(info.ssi_signo as libc::c_int)
}

/// Ends the process as `signal` would have with its default action (for a signal that
/// was taken through a signalfd instead, once the caller has cleaned up).
pub fn die_of(signal: libc::c_int) -> ! {
    // SAFETY: SIG_DFL is a valid disposition; the set is valid; raise only signals.
    unsafe {
        libc::signal(signal, libc::SIG_DFL);
        let set = signal_set(&[signal]);
        libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
        libc::raise(signal);
    }
    // A signal whose default action does not end the process (not one of ours).
    exit_now(128 + signal)
}

// ---- cell runtime: the single-threaded precondition of a clone ----

/// Proof that the process had exactly one thread, this one, when it was made. Only this
/// thread can create another, so the proof holds until it does: it is not `Send`, and
/// [`clone_single_threaded`] consumes it. Use it right away, before starting any thread.
pub struct SingleThreaded {
    _not_send: std::marker::PhantomData<*const ()>,
}

impl SingleThreaded {
    /// The proof, if `stat` (this process's, just read) counts one thread.
    pub fn from_stat(stat: &ProcessStat) -> Option<SingleThreaded> {
        (stat.threads == 1 && stat_is_own(stat)).then_some(SingleThreaded {
            _not_send: std::marker::PhantomData,
        })
    }
}

/// Whether `stat` is this process's (a stat of another process proves nothing here):
/// only this process's own stat has a command line area.
fn stat_is_own(stat: &ProcessStat) -> bool {
    stat.command_line != CommandLineArea::default()
}

/// [`clone_cell_named`] for a process shown to be single-threaded.
pub fn clone_single_threaded(
    proof: SingleThreaded,
    namespace_flags: libc::c_ulong,
    command_line: &CommandLineArea,
    name: &CStr,
) -> io::Result<CloneOutcome> {
    let SingleThreaded { .. } = proof;
    // SAFETY: `proof` showed the process single-threaded, and this thread has not started
    // another since (the proof is consumed here and cannot cross threads).
    unsafe { clone_cell_named(namespace_flags, command_line, name) }
}

/// Closes every descriptor of this process from 3 up except those in `keep`. For the
/// cell right after its clone: it inherits every descriptor of the supervisor's process
/// (the caller's output sinks, an engine's control socket), and a clone never execs, so
/// close-on-exec does not close them.
pub fn close_fds_except(keep: &[RawFd]) -> io::Result<()> {
    let mut keep: Vec<u32> = keep
        .iter()
        .filter(|fd| **fd >= 3)
        .map(|fd| *fd as u32)
        .collect();
    keep.sort_unstable();
    keep.dedup();
    let mut from = 3u32;
    for fd in keep.into_iter().chain([u32::MAX]) {
        if fd > from {
            // SAFETY: integer arguments only; the descriptors closed are this process's
            // and nothing of it uses them any more (see above).
            let ret = unsafe { libc::syscall(libc::SYS_close_range, from, fd - 1, 0u32) };
            check_long(ret)?;
        }
        from = fd.saturating_add(1);
    }
    Ok(())
}

/// Raises the send buffer of `sock` to `bytes` (`SO_SNDBUFFORCE`, which root may set
/// beyond the system's maximum; otherwise `SO_SNDBUF`, capped by it). On a
/// SOCK_SEQPACKET socket the send buffer bounds the size of one message.
pub fn raise_send_buffer(sock: BorrowedFd<'_>, bytes: usize) -> io::Result<()> {
    let value = bytes.min(i32::MAX as usize) as libc::c_int;
    let set = |option: libc::c_int| {
        // SAFETY: `value` is a valid c_int for the duration of the call, and its size is
        // what the kernel reads.
        check(unsafe {
            libc::setsockopt(
                sock.as_raw_fd(),
                libc::SOL_SOCKET,
                option,
                &value as *const libc::c_int as *const libc::c_void,
                size_of::<libc::c_int>() as libc::socklen_t,
            )
        })
    };
    set(libc::SO_SNDBUFFORCE)
        .or_else(|_| set(libc::SO_SNDBUF))
        .map(drop)
}

// ---------------------------------------------------------------------------------
// The engine's cell factory: forking supervisor processes (crates/engine/src/factory.rs).

/// `fork(2)` of a single-threaded process: `Ok(None)` in the child, `Ok(Some(pid))` in
/// the parent. Refused when the process has more than one thread: the child is a copy of
/// this one thread, and a lock another thread held (malloc's, stdio's) would stay locked
/// forever in it.
pub fn fork_single_threaded() -> io::Result<Option<libc::pid_t>> {
    let threads = process_stat(std::process::id())?.threads;
    if threads != 1 {
        return Err(io::Error::other(format!(
            "fork from a process with {threads} threads; only a single-threaded process forks"
        )));
    }
    // SAFETY: the process has one thread, this one (counted just now, and nothing between
    // the count and the fork starts a thread).
    let pid = check(unsafe { libc::fork() })?;
    Ok((pid != 0).then_some(pid))
}

/// Closes `fd` by number, for a forked child that inherited a descriptor an owner of
/// its parent's still holds (the child never runs that owner's drop: it exits).
pub fn close_raw(fd: RawFd) {
    // SAFETY: closing a number only affects this process's table; the caller's contract
    // is that nothing in this process uses `fd` afterwards.
    unsafe { libc::close(fd) };
}

pub fn getppid() -> libc::pid_t {
    // SAFETY: no arguments; always succeeds.
    unsafe { libc::getppid() }
}

/// The parent-death signal of this process (`PR_GET_PDEATHSIG`); 0 for none.
pub fn parent_death_signal() -> io::Result<libc::c_int> {
    let mut signal: libc::c_int = 0;
    // SAFETY: PR_GET_PDEATHSIG stores one int through the pointer, which is valid and
    // writable for the duration of the call.
    check(unsafe {
        libc::prctl(
            libc::PR_GET_PDEATHSIG,
            &mut signal as *mut libc::c_int as libc::c_ulong,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
        )
    })?;
    Ok(signal)
}

// ---- Host identities (crates/cell/src/host_identity.rs): slot files and their locks ----

/// Opens the regular file `name` in `dir` for reading and writing, creating it with `mode`
/// (less the umask) when it does not exist. No symlink is followed, and `name` must stay
/// beneath `dir` on its mount.
pub fn open_or_create(dir: BorrowedFd<'_>, name: &Path, mode: u32) -> io::Result<OwnedFd> {
    openat2(
        dir,
        name,
        libc::O_RDWR | libc::O_CREAT,
        mode,
        RESOLVE_BENEATH | RESOLVE_NO_XDEV | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS,
    )
}

/// A write lock over the whole file, as `struct flock` for the `F_OFD_*` commands.
fn whole_file_write_lock() -> libc::flock {
    // SAFETY: `struct flock` is plain data; all zero is a valid value (l_pid must be 0
    // for open file description locks).
    let mut lock: libc::flock = unsafe { zeroed() };
    lock.l_type = libc::F_WRLCK as libc::c_short;
    lock.l_whence = libc::SEEK_SET as libc::c_short;
    lock
}

/// Takes an open file description lock (`F_OFD_SETLK`, write, whole file) on `fd` without
/// waiting: `Ok(false)` when another open file description holds one. The lock belongs
/// to the description, so it lasts while any process holds a descriptor of it (a
/// forked or cloned child included) and goes with the last one's close.
pub fn ofd_try_lock(fd: BorrowedFd<'_>) -> io::Result<bool> {
    let lock = whole_file_write_lock();
    // SAFETY: `lock` is a valid `struct flock` that outlives the call; `fd` is live.
    let ret = unsafe {
        libc::fcntl(
            fd.as_raw_fd(),
            libc::F_OFD_SETLK,
            &lock as *const libc::flock,
        )
    };
    match check(ret) {
        Ok(_) => Ok(true),
        Err(e) if matches!(e.raw_os_error(), Some(libc::EAGAIN) | Some(libc::EACCES)) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Whether another open file description holds a lock on `fd`'s file (`F_OFD_GETLK`),
/// without taking one.
pub fn ofd_lock_held(fd: BorrowedFd<'_>) -> io::Result<bool> {
    let mut lock = whole_file_write_lock();
    // SAFETY: `lock` is a valid `struct flock` the kernel overwrites with the conflicting
    // lock, if any; `fd` is live.
    let ret = unsafe {
        libc::fcntl(
            fd.as_raw_fd(),
            libc::F_OFD_GETLK,
            &mut lock as *mut libc::flock,
        )
    };
    check(ret)?;
    Ok(lock.l_type != libc::F_UNLCK as libc::c_short)
}

/// Sets this process's effective uid and gid, leaving the real and saved ids as they are
/// (`setresgid` then `setresuid`, with -1 for the others): from root, the effective gid
/// first, while the capability to change it is still there. With the real and saved
/// uid still 0, [`restore_root_effective_ids`] brings root's capabilities back. The
/// process must be single-threaded (glibc would change every thread's ids).
pub fn set_effective_ids(uid: u32, gid: u32) -> io::Result<()> {
    const KEEP: u32 = u32::MAX;
    // SAFETY: setresgid/setresuid take plain integers; -1 keeps an id unchanged.
    check(unsafe { libc::setresgid(KEEP, gid, KEEP) })?;
    // SAFETY: as above.
    if let Err(e) = check(unsafe { libc::setresuid(KEEP, uid, KEEP) }) {
        // SAFETY: as above; the real gid is allowed as the effective gid to anyone.
        let _ = unsafe { libc::setresgid(KEEP, 0, KEEP) };
        return Err(e);
    }
    Ok(())
}

/// Takes the effective uid and gid 0 back after [`set_effective_ids`] (the real and
/// saved uid stayed 0, so any process may): uid first, which restores the capabilities,
/// then the gid.
pub fn restore_root_effective_ids() -> io::Result<()> {
    const KEEP: u32 = u32::MAX;
    // SAFETY: setresuid/setresgid take plain integers; -1 keeps an id unchanged.
    check(unsafe { libc::setresuid(KEEP, 0, KEEP) })?;
    // SAFETY: as above.
    check(unsafe { libc::setresgid(KEEP, 0, KEEP) }).map(drop)
}

// ---- OCI image roots: a read-only overlayfs of an image's layers ----

const FSCONFIG_SET_STRING: libc::c_uint = 1;
const FSCONFIG_CMD_CREATE: libc::c_uint = 6;
const FSOPEN_CLOEXEC: libc::c_uint = 1;
const FSMOUNT_CLOEXEC: libc::c_uint = 1;

/// A detached, read-only overlayfs of `lowerdirs` (top first) with no upper layer:
/// `fsopen("overlay")`, `lowerdir`, create, `fsmount` with `attrs` (`MOUNT_ATTR_*`). The
/// descriptor is the mount's root; nothing is attached anywhere.
pub fn overlay_lower_only(lowerdirs: &[&Path], attrs: u64) -> io::Result<OwnedFd> {
    use std::os::unix::ffi::OsStrExt;
    let fs_name = c"overlay";
    // SAFETY: `fs_name` is a valid C string; the flags are fsopen's.
    let ctx = check(
        unsafe { libc::syscall(libc::SYS_fsopen, fs_name.as_ptr(), FSOPEN_CLOEXEC) } as libc::c_int,
    )?;
    // SAFETY: fsopen returned a new descriptor owned by nobody else.
    let ctx = unsafe { OwnedFd::from_raw_fd(ctx) };
    let joined = lowerdirs
        .iter()
        .map(|dir| dir.as_os_str().as_bytes())
        .collect::<Vec<_>>()
        .join(&b':');
    let value = CString::new(joined).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    let key = c"lowerdir";
    // SAFETY: `ctx` is a live fs context; `key` and `value` are valid C strings that
    // outlive the call.
    check(unsafe {
        libc::syscall(
            libc::SYS_fsconfig,
            ctx.as_raw_fd(),
            FSCONFIG_SET_STRING,
            key.as_ptr(),
            value.as_ptr(),
            0,
        )
    } as libc::c_int)?;
    // SAFETY: `ctx` is a live fs context; CMD_CREATE takes no key or value.
    check(unsafe {
        libc::syscall(
            libc::SYS_fsconfig,
            ctx.as_raw_fd(),
            FSCONFIG_CMD_CREATE,
            std::ptr::null::<libc::c_char>(),
            std::ptr::null::<libc::c_void>(),
            0,
        )
    } as libc::c_int)?;
    // SAFETY: `ctx` is a created fs context; `attrs` are MOUNT_ATTR_* bits.
    let mnt =
        check(
            unsafe { libc::syscall(libc::SYS_fsmount, ctx.as_raw_fd(), FSMOUNT_CLOEXEC, attrs) }
                as libc::c_int,
        )?;
    // SAFETY: fsmount returned a new descriptor owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(mnt) })
}

// ---------------------------------------------------------------------------------------
// Unprivileged operation (crates/cell/src/cgroup/mod.rs: delegated cgroup subtrees)

/// Whether this process may write `path` and search it when it is a directory, judged
/// by the kernel with the effective ids (`faccessat(AT_EACCESS)`), as a later write will.
pub fn writable_by_caller(path: &Path) -> bool {
    let mode = libc::W_OK | if path.is_dir() { libc::X_OK } else { 0 };
    let Ok(path) = cstring(path) else {
        return false;
    };
    // SAFETY: `path` is a valid NUL-terminated string that outlives the call.
    unsafe { libc::faccessat(libc::AT_FDCWD, path.as_ptr(), mode, libc::AT_EACCESS) == 0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn running_as_root() -> bool {
        if geteuid() == 0 {
            return true;
        }
        if std::env::var_os("AIRLOCK_REQUIRE_ROOT_TESTS").is_some() {
            panic!("this test must run as root (AIRLOCK_REQUIRE_ROOT_TESTS is set)");
        }
        eprintln!("SKIPPED: needs root (a private mount namespace); CI runs it as root");
        false
    }

    /// In a forked child with a private mount namespace: a tmpfs mounted on `dir` and
    /// entered, then a BackgroundDetach. Returns 0 when the checks hold.
    fn detach_scenario(dir: &Path, drop_without_wait: bool) -> i32 {
        if unshare(libc::CLONE_NEWNS).is_err()
            || mount(
                None,
                Path::new("/"),
                None,
                libc::MS_REC | libc::MS_PRIVATE,
                None,
            )
            .is_err()
            || mount(
                Some(Path::new("tmpfs")),
                dir,
                Some(c"tmpfs"),
                0,
                Some(c"size=64k"),
            )
            .is_err()
            || std::env::set_current_dir(dir).is_err()
            || std::fs::write("marker", b"on the tmpfs").is_err()
        {
            return 10;
        }
        let Ok(detach) = BackgroundDetach::start() else {
            return 11;
        };
        if drop_without_wait {
            drop(detach);
            // Reaped by the drop: no child is left to wait for.
            let mut status = 0;
            // SAFETY: `status` is a valid out-pointer.
            let left = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
            return if left == -1 { 0 } else { 12 };
        }
        if detach.wait().is_err() {
            return 13;
        }
        // The tmpfs is detached: the directory shows what it covered (no marker).
        if dir.join("marker").exists() {
            14
        } else {
            0
        }
    }

    fn in_child(dir: &Path, drop_without_wait: bool) -> i32 {
        // SAFETY: the child only runs detach_scenario and exits without returning into
        // the test harness; fork from the threaded harness is glibc's, which keeps
        // malloc usable in the child.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork: {}", io::Error::last_os_error());
        if pid == 0 {
            let code = detach_scenario(dir, drop_without_wait);
            // SAFETY: ends the forked child at once, running no harness code.
            unsafe { libc::_exit(code) }
        }
        let reaped = wait_child(pid, false).unwrap().unwrap();
        assert!(
            libc::WIFEXITED(reaped.status),
            "status {:#x}",
            reaped.status
        );
        libc::WEXITSTATUS(reaped.status)
    }

    #[test]
    fn process_stat_locates_only_this_processs_command_line() {
        let own = process_stat(std::process::id()).unwrap().command_line;
        let argv0 = std::env::args_os().next().unwrap();
        // SAFETY: reads this process's own argument strings, which nothing writes.
        let first = unsafe {
            std::slice::from_raw_parts(own.arg_start as *const u8, own.arg_end - own.arg_start)
        };
        assert!(own.env_end > own.env_start, "{own:?}");
        assert!(
            first.starts_with(argv0.as_encoded_bytes()),
            "the area does not start with argv[0] {argv0:?}: {own:?}"
        );
        let parent = std::os::unix::process::parent_id();
        assert_eq!(
            process_stat(parent).unwrap().command_line,
            CommandLineArea::default()
        );
    }

    #[test]
    fn background_detach_removes_the_mount_on_the_working_directory() {
        if !running_as_root() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(in_child(dir.path(), false), 0);
    }

    #[test]
    fn a_background_detach_dropped_unwaited_is_killed_and_reaped() {
        if !running_as_root() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(in_child(dir.path(), true), 0);
    }
}

// ---- Hand-off to a running service (crates/engine/src/handoff.rs): who the peer is,
// ---- descriptors on a stream socket, and file checks made as the peer ----

/// The process on the other end of a unix socket, as the kernel recorded it at
/// `connect` (SO_PEERCRED), with its supplementary groups (SO_PEERGROUPS).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerIdentity {
    pub pid: i32,
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
}

/// Who connected to `sock` (a connected unix socket).
pub fn peer_identity(sock: BorrowedFd<'_>) -> io::Result<PeerIdentity> {
    // SAFETY: ucred is plain old data; zero is a valid initial value.
    let mut cred: libc::ucred = unsafe { zeroed() };
    let mut len = size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: the kernel writes at most `len` bytes into `cred`, which is that large.
    let ret = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(PeerIdentity {
        pid: cred.pid,
        uid: cred.uid,
        gid: cred.gid,
        groups: peer_groups(sock)?,
    })
}

/// Most supplementary groups a peer may have (the kernel's NGROUPS_MAX).
const MAX_PEER_GROUPS: usize = 65536;

fn peer_groups(sock: BorrowedFd<'_>) -> io::Result<Vec<u32>> {
    let mut groups = vec![0u32; 64];
    loop {
        let mut len = std::mem::size_of_val(groups.as_slice()) as libc::socklen_t;
        // SAFETY: the kernel writes at most `len` bytes into `groups`, which is that
        // large, and on ERANGE writes nothing but the length it needs.
        let ret = unsafe {
            libc::getsockopt(
                sock.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_PEERGROUPS,
                groups.as_mut_ptr().cast(),
                &mut len,
            )
        };
        let needed = len as usize / size_of::<u32>();
        if ret == 0 {
            groups.truncate(needed);
            return Ok(groups);
        }
        let err = io::Error::last_os_error();
        if err.raw_os_error() != Some(libc::ERANGE) || needed > MAX_PEER_GROUPS {
            return Err(err);
        }
        groups.resize(needed, 0);
    }
}

/// Receives bytes into `buf` from a stream socket with up to `max_fds` descriptors that
/// travel with them (marked close-on-exec). 0 bytes: the peer closed its end.
pub fn recv_stream_with_fds(
    sock: BorrowedFd<'_>,
    buf: &mut [u8],
    max_fds: usize,
) -> io::Result<(usize, Vec<OwnedFd>)> {
    loop {
        match recv_with_fds(sock, buf, max_fds) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            other => return other,
        }
    }
}

/// Makes the calling thread's file system checks those of `uid`, `gid` and `groups`:
/// its fsuid, fsgid and supplementary groups, per thread (raw system calls: the libc
/// wrappers of setgroups change every thread of the process). Changing the fsuid from 0
/// drops the thread's file capabilities (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH,
/// CAP_FOWNER, ...), so opens and `access_as_thread` answer as the peer would get. Call
/// it only on a thread of its own that ends after the checks: nothing restores it.
pub fn take_fs_identity_for_this_thread(uid: u32, gid: u32, groups: &[u32]) -> io::Result<()> {
    // SAFETY: setgroups reads `groups.len()` gids from the pointer, which points at that
    // many; it changes only the calling thread's credentials (no libc broadcast).
    let ret = unsafe {
        libc::syscall(
            libc::SYS_setgroups,
            groups.len(),
            groups.as_ptr() as *const libc::gid_t,
        )
    };
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: setfsgid and setfsuid take an integer and change only the calling thread;
    // they return the previous value and never fail visibly, so each is checked by
    // asking again with an id that cannot be set (-1 returns the current one).
    unsafe {
        libc::syscall(libc::SYS_setfsgid, gid);
        libc::syscall(libc::SYS_setfsuid, uid);
    }
    // SAFETY: as above; -1 changes nothing and returns the current value.
    let (fsgid, fsuid) = unsafe {
        (
            libc::syscall(libc::SYS_setfsgid, u32::MAX) as u32,
            libc::syscall(libc::SYS_setfsuid, u32::MAX) as u32,
        )
    };
    if fsuid != uid || fsgid != gid {
        return Err(io::Error::from_raw_os_error(libc::EPERM));
    }
    Ok(())
}

/// Whether the calling thread's file system identity (see
/// [`take_fs_identity_for_this_thread`]) may access the file `fd` refers to (an O_PATH
/// descriptor is enough) with `mode` (`R_OK`, `X_OK`): faccessat2 with AT_EACCESS, which
/// checks the current credentials (the fsuid) rather than the real uid.
pub fn access_as_thread(fd: BorrowedFd<'_>, mode: libc::c_int) -> io::Result<()> {
    // SAFETY: the path is a static empty C string; AT_EMPTY_PATH makes the call act on
    // `fd` itself.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_faccessat2,
            fd.as_raw_fd(),
            c"".as_ptr(),
            mode,
            libc::AT_EACCESS | libc::AT_EMPTY_PATH,
        )
    };
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}
