//! One host identity per live cell. The kernel counts some limits per host user: pipe
//! buffer pages (`fs.pipe-user-pages-soft`/`-hard`), epoll watches and keys per kuid,
//! whatever user namespace the process is in; inotify instances and watches, POSIX
//! message queue bytes, pending signals and locked shared memory per user namespace and, at the
//! host level, per the namespace's owner. Cells that all ran as one host uid, in
//! namespaces all owned by root, shared them (the owner-counted ones with root's own
//! processes too), so one cell could exhaust them for every other. As root, each cell
//! therefore holds a uid and gid of its own from a configured range, for as long as
//! anything of it lives, runs as them and has its user namespace created with them
//! ([`clone_owned_by`]). As any other user the cell maps to the caller's own ids, as
//! before: there is no range to take ids from.
//!
//! A slot is ONE uid and the gid of the same number: a cell maps exactly one uid and one
//! gid (supervisor.rs writes a one-line map), so a wider slot would spend ids that nothing
//! uses. The default range, 65536 ids from 1_000_000_000, is where cells' ids already were
//! (far above the host's users and below 2^31).
//!
//! Cross-process: every supervisor (each `airlock run`, each of an engine's supervisor
//! processes) allocates from the same directory, one file per id, `/run/airlock/ids/<id>`
//! (root's, mode 0700; a directory others can write is refused). A slot is held by an
//! open file description lock (`F_OFD_SETLK`) on its file, taken without waiting. The
//! lock belongs to the description, not to a process: the supervisor opens it before it
//! clones the cell, so the cell's pid 1 holds the same description, and the lock goes
//! only when both have closed it. A supervisor killed with SIGKILL therefore does not
//! free the slot while its cell's pid 1 still runs.
//!
//! "Never reused while anything of the previous holder lives": pid 1 closes its files
//! before the kernel has reaped the rest of its pid namespace, so the lock alone would
//! free the slot a little early. The slot's file says whether its last holder ended
//! cleanly: the holder writes its pid into it when it takes the slot, and empties it only
//! once its cell's cgroup was emptied and removed ([`HostLease::release`]). A new holder
//! that finds the file non-empty (a supervisor that was killed, a cgroup that could not
//! be emptied, an error path) checks `/proc` for any process whose real, effective, saved
//! or filesystem uid or gid is the slot's, and skips the slot if there is one. That scan
//! is sound because the lock is free: pid 1 has exited, so the pid namespace admits no
//! new process, and what is left can only exit. It is slow (8 ms for 113 host processes
//! on this project's loaded 2-CPU VM: reading `status` costs tens of microseconds per
//! process), which is why it runs only after an unclean end; the usual allocation is an
//! open, a lock, an fstat and a write (`an_allocation_takes_microseconds` below).

use crate::error::CellError;
use crate::sys;
use serde::{Deserialize, Serialize};
use std::fs::File;
use std::os::fd::AsFd;
use std::os::unix::fs::{DirBuilderExt, FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// Where the slots' lock files live when airlock runs as root.
pub const LOCK_DIR: &str = "/run/airlock/ids";

/// Concurrent supervisors start their search at `pid % SPREAD`, so that they rarely try
/// the same slot, while the files created stay few (about the peak number of concurrent
/// cells, at least this many): a file is never deleted (deleting a lock file races with
/// whoever is about to lock it).
const SPREAD: u32 = 64;

/// A range of host ids, one uid + gid per live cell. Only valid ranges exist
/// ([`HostIdRange::new`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "RangeWire")]
pub struct HostIdRange {
    base: u32,
    count: u32,
}

/// A range as it travels (to the engine's cell factory): checked again on arrival.
#[derive(Deserialize)]
struct RangeWire {
    base: u32,
    count: u32,
}

impl TryFrom<RangeWire> for HostIdRange {
    type Error = CellError;

    fn try_from(wire: RangeWire) -> Result<HostIdRange, CellError> {
        HostIdRange::new(wire.base, wire.count)
    }
}

impl Default for HostIdRange {
    fn default() -> Self {
        HostIdRange {
            base: Self::DEFAULT_BASE,
            count: Self::DEFAULT_COUNT,
        }
    }
}

impl HostIdRange {
    /// The lowest id a range may start at: uid and gid 0, the host's system and real
    /// users and `nobody` (65534) are all below it.
    pub const MIN_BASE: u32 = 65_536;
    /// The highest id a range may include: tools that keep ids in a signed 32-bit integer
    /// break above it, and 4294967295 is `(uid_t)-1`, "no id".
    pub const MAX_ID: u32 = i32::MAX as u32;
    pub const DEFAULT_BASE: u32 = 1_000_000_000;
    pub const DEFAULT_COUNT: u32 = 65_536;

    /// `count` ids from `base`, one per live cell; refused when they would reach below
    /// [`Self::MIN_BASE`] or above [`Self::MAX_ID`], or are none.
    pub fn new(base: u32, count: u32) -> Result<HostIdRange, CellError> {
        match range_problem(base, count) {
            None => Ok(HostIdRange { base, count }),
            Some(rule) => Err(CellError::InvalidHostIdRange { base, count, rule }),
        }
    }

    pub fn base(&self) -> u32 {
        self.base
    }

    pub fn count(&self) -> u32 {
        self.count
    }

    /// The range's last id.
    pub fn last(&self) -> u32 {
        self.base + (self.count - 1)
    }

    fn contains(&self, id: u32) -> bool {
        (self.base..=self.last()).contains(&id)
    }
}

/// Why `count` ids from `base` are not a valid range, if they are not.
fn range_problem(base: u32, count: u32) -> Option<&'static str> {
    if count == 0 {
        Some("the range holds no id")
    } else if base < HostIdRange::MIN_BASE {
        Some("the range must start at 65536 or above: uid 0 and the host's own users are below")
    } else if u64::from(base) + u64::from(count) - 1 > u64::from(HostIdRange::MAX_ID) {
        Some("the range must end at 2147483647 or below (ids above break signed 32-bit tools)")
    } else {
        None
    }
}

/// The host uid and gid a cell's identity maps to, as the run's record shows them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostIdentity {
    pub uid: u32,
    pub gid: u32,
    pub source: IdentitySource,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IdentitySource {
    /// A slot of the configured range, held for this cell alone.
    Pool,
    /// airlock is not root: the caller's own uid and gid, which its other processes
    /// share (no id map to another user is possible without root).
    Caller,
}

/// A cell's host identity, held until [`HostLease::release`] or drop.
#[derive(Debug)]
pub struct HostLease {
    identity: HostIdentity,
    /// The slot's lock file (see the module docs); `None` for the caller's identity.
    slot: Option<File>,
}

impl HostLease {
    pub fn identity(&self) -> HostIdentity {
        self.identity
    }

    /// The slot's lock file, which the cell's pid 1 keeps open too (see the module docs).
    pub(crate) fn slot_fd(&self) -> Option<std::os::fd::RawFd> {
        use std::os::fd::AsRawFd;
        self.slot.as_ref().map(|slot| slot.as_raw_fd())
    }

    /// Ends the lease. With `cell_gone` (the cell's cgroup was emptied and removed, its
    /// pid 1 reaped) the slot is marked clean and its next holder takes it at once;
    /// otherwise, as when a lease is only dropped, the next holder first checks that no
    /// process runs with its ids.
    pub fn release(self, cell_gone: bool) {
        if let (true, Some(slot)) = (cell_gone, &self.slot) {
            // A failure leaves the slot marked: its next holder looks at /proc first.
            let _ = slot.set_len(0);
        }
    }
}

/// The host identity for a new cell: a slot of `range` when airlock is root, the
/// caller's own ids otherwise. Exhaustion of the range is `sandbox_unavailable`: the
/// control (an identity no other live cell has) cannot be enforced now, and the run is
/// refused rather than sharing one.
pub fn lease_for_cell(range: HostIdRange) -> Result<HostLease, CellError> {
    if sys::geteuid() != 0 {
        return Ok(HostLease {
            identity: HostIdentity {
                uid: sys::geteuid(),
                gid: sys::getegid(),
                source: IdentitySource::Caller,
            },
            slot: None,
        });
    }
    HostIdentityPool::open(range)?.acquire(std::process::id())
}

/// Runs `clone` (which creates the cell's user namespace) with the cell's host uid and
/// gid as this process's effective ids, when they come from the pool: the effective uid
/// of the process that creates a user namespace becomes its owner, and the kernel charges
/// what it counts per user namespace (inotify instances and watches, POSIX message queue
/// bytes, pending signals, locked shared memory) at the host level to the owner. Created by
/// root, every cell's namespace would charge root, and one cell could exhaust them for
/// every other cell and for root's own processes on the host. The parent is root again
/// when this returns; the child keeps the cell's ids (its launcher sets every id inside
/// the namespace once the maps are written). The caller must be single-threaded.
pub(crate) fn clone_owned_by(
    host: HostIdentity,
    clone: impl FnOnce() -> std::io::Result<sys::CloneOutcome>,
) -> Result<std::io::Result<sys::CloneOutcome>, CellError> {
    if host.source != IdentitySource::Pool {
        return Ok(clone());
    }
    // A change of effective ids clears this process's parent-death signal (a supervisor
    // forked by the engine's cell factory dies with it by that signal): it is set again
    // afterwards, and a parent that died in between ends this process's cell too.
    let death_signal = sys::parent_death_signal().unwrap_or(0);
    let parent = sys::getppid();
    sys::set_effective_ids(host.uid, host.gid)
        .map_err(|e| CellError::io("taking the cell's host ids for its user namespace", e))?;
    let cloned = clone();
    if matches!(cloned, Ok(sys::CloneOutcome::Child)) {
        return Ok(cloned);
    }
    let abandon = |cloned: &std::io::Result<sys::CloneOutcome>| {
        if let Ok(sys::CloneOutcome::Parent { pid, pidfd }) = cloned {
            let _ = sys::pidfd_send_signal(pidfd.as_fd(), libc::SIGKILL);
            let _ = sys::wait_child(*pid, false);
        }
    };
    if let Err(e) = sys::restore_root_effective_ids() {
        // This process cannot go on as another user: no cell, and an error.
        abandon(&cloned);
        return Err(CellError::io("taking root's ids back after the clone", e));
    }
    if death_signal != 0 {
        let rearmed = sys::prctl(libc::PR_SET_PDEATHSIG, death_signal as libc::c_ulong);
        if rearmed.is_err() || sys::getppid() != parent {
            abandon(&cloned);
            return Err(CellError::io(
                "the supervisor's parent died while its cell was cloned",
                std::io::Error::from_raw_os_error(libc::ESRCH),
            ));
        }
    }
    Ok(cloned)
}

/// The slots of one range in one lock directory.
pub struct HostIdentityPool {
    dir: File,
    path: PathBuf,
    range: HostIdRange,
}

impl HostIdentityPool {
    /// The pool of `range` in [`LOCK_DIR`].
    pub fn open(range: HostIdRange) -> Result<HostIdentityPool, CellError> {
        Self::open_at(Path::new(LOCK_DIR), range)
    }

    /// The pool of `range` in `dir`, created (mode 0700) if missing. Refused when `dir` or
    /// its parent is not a directory of this user's that nobody else can write: whoever
    /// could write there could hold or free other cells' slots.
    pub fn open_at(dir: &Path, range: HostIdRange) -> Result<HostIdentityPool, CellError> {
        let open = || {
            std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW)
                .open(dir)
        };
        let handle = match open() {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                std::fs::DirBuilder::new()
                    .recursive(true)
                    .mode(0o700)
                    .create(dir)
                    .map_err(|e| CellError::io(format!("creating {}", dir.display()), e))?;
                open()
            }
            other => other,
        }
        .map_err(|e| CellError::io(format!("opening {}", dir.display()), e))?;
        let parent = dir.parent().unwrap_or(Path::new("/"));
        for (path, meta) in [
            (dir, handle.metadata()),
            (parent, std::fs::symlink_metadata(parent)),
        ] {
            let meta = meta.map_err(|e| CellError::io(format!("{}", path.display()), e))?;
            if let Some(problem) = private_dir_problem(meta.is_dir(), meta.uid(), meta.mode()) {
                return Err(CellError::Unavailable {
                    control: "host_identity",
                    reason: format!("{}: {problem}", path.display()),
                });
            }
        }
        Ok(HostIdentityPool {
            dir: handle,
            path: dir.to_path_buf(),
            range,
        })
    }

    /// A free slot, searched from `hint` (the caller's pid spreads concurrent callers).
    pub fn acquire(&self, hint: u32) -> Result<HostLease, CellError> {
        for id in candidates(self.range, hint) {
            if let Some(slot) = self.try_slot(id)? {
                return Ok(HostLease {
                    identity: HostIdentity {
                        uid: id,
                        gid: id,
                        source: IdentitySource::Pool,
                    },
                    slot: Some(slot),
                });
            }
        }
        Err(CellError::Unavailable {
            control: "host_identity",
            reason: format!(
                "all {} host ids {}..={} are held by live cells or by what is left of one \
                 (airlock.toml: host_ids.base, host_ids.count)",
                self.range.count,
                self.range.base,
                self.range.last()
            ),
        })
    }

    /// The slot `id`, locked and marked held by this process, unless another lease holds
    /// it or something of its last holder still runs.
    fn try_slot(&self, id: u32) -> Result<Option<File>, CellError> {
        let name = id.to_string();
        let context = || format!("{}/{name}", self.path.display());
        let slot: File = sys::open_or_create(self.dir.as_fd(), Path::new(&name), 0o600)
            .map_err(|e| CellError::io(context(), e))?
            .into();
        if !sys::ofd_try_lock(slot.as_fd()).map_err(|e| CellError::io(context(), e))? {
            return Ok(None);
        }
        let marked = slot
            .metadata()
            .map_err(|e| CellError::io(context(), e))?
            .len()
            != 0;
        if marked && ids_in_use(id) {
            // Dropping the file frees the lock; the slot stays marked.
            return Ok(None);
        }
        let mark = format!("{}\n", std::process::id());
        // Unmarked, a holder killed later would leave a slot the next holder takes
        // without looking: no mark, no slot.
        if marked {
            slot.set_len(0).map_err(|e| CellError::io(context(), e))?;
        }
        slot.write_all_at(mark.as_bytes(), 0)
            .map_err(|e| CellError::io(context(), e))?;
        Ok(Some(slot))
    }

    /// How many slots of the range are held now (for `airlock doctor`).
    pub fn held(&self) -> Result<u32, CellError> {
        let context = || self.path.display().to_string();
        let mut held = 0;
        for entry in std::fs::read_dir(&self.path).map_err(|e| CellError::io(context(), e))? {
            let entry = entry.map_err(|e| CellError::io(context(), e))?;
            let Some(id) = entry
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<u32>().ok())
            else {
                continue;
            };
            if !self.range.contains(id) {
                continue;
            }
            let slot = sys::open_or_create(self.dir.as_fd(), Path::new(&entry.file_name()), 0o600)
                .map_err(|e| CellError::io(context(), e))?;
            if sys::ofd_lock_held(slot.as_fd()).map_err(|e| CellError::io(context(), e))? {
                held += 1;
            }
        }
        Ok(held)
    }
}

/// Why a lock directory (or its parent) is unsafe, if it is: not a directory, owned by
/// another user than this one, or writable by group or others.
fn private_dir_problem(is_dir: bool, owner: u32, mode: u32) -> Option<String> {
    if !is_dir {
        Some("not a directory".into())
    } else if owner != sys::geteuid() {
        Some(format!(
            "belongs to uid {owner}, not to this user (uid {})",
            sys::geteuid()
        ))
    } else if mode & 0o022 != 0 {
        Some(format!(
            "writable by other users (mode {:o}), who could hold or free cells' host ids",
            mode & 0o7777
        ))
    } else {
        None
    }
}

/// Every id of `range` once, starting at `hint % SPREAD` (see [`SPREAD`]).
fn candidates(range: HostIdRange, hint: u32) -> impl Iterator<Item = u32> {
    let start = hint % range.count.min(SPREAD);
    (0..range.count).map(move |i| range.base + (start + i) % range.count)
}

/// Whether any process on the host runs with `id` as a uid or gid. A process whose
/// status cannot be read counts as using it (fail closed); one that ended while the
/// scan ran does not.
fn ids_in_use(id: u32) -> bool {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return true;
    };
    for entry in entries {
        let Ok(entry) = entry else { return true };
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .filter(|n| n.bytes().all(|b| b.is_ascii_digit()))
        else {
            continue;
        };
        match std::fs::read_to_string(format!("/proc/{pid}/status")) {
            Ok(status) if status_uses_id(&status, id) => return true,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {}
            Err(_) => return true,
        }
    }
    false
}

/// Whether a `/proc/<pid>/status` text has `id` among its real, effective, saved or
/// filesystem uids or gids.
fn status_uses_id(status: &str, id: u32) -> bool {
    status
        .lines()
        .filter_map(|l| l.strip_prefix("Uid:").or_else(|| l.strip_prefix("Gid:")))
        .flat_map(str::split_whitespace)
        .any(|v| v.parse::<u32>() == Ok(id))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::ResultClass;

    #[test]
    fn a_range_must_stay_above_the_hosts_users_and_below_2_pow_31() {
        assert!(HostIdRange::new(65_535, 1).is_err());
        assert!(HostIdRange::new(0, 10).is_err());
        assert!(HostIdRange::new(65_536, 1).is_ok());
        assert!(HostIdRange::new(1_000_000_000, 0).is_err());
        assert!(HostIdRange::new(i32::MAX as u32, 1).is_ok());
        assert!(HostIdRange::new(i32::MAX as u32, 2).is_err());
        assert!(HostIdRange::new(u32::MAX, u32::MAX).is_err());
        let default = HostIdRange::default();
        assert_eq!(
            HostIdRange::new(default.base(), default.count()).unwrap(),
            default
        );
        assert_eq!(default.last(), 1_000_065_535);
    }

    #[test]
    fn candidates_cover_every_id_once_from_a_spread_start() {
        let range = HostIdRange::new(100_000, 200).unwrap();
        let ids: Vec<u32> = candidates(range, 70).collect();
        assert_eq!(ids[0], 100_006, "70 % 64");
        let mut sorted = ids.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (100_000..100_200).collect::<Vec<_>>());
        let small = HostIdRange::new(100_000, 3).unwrap();
        assert_eq!(
            candidates(small, 7).collect::<Vec<_>>(),
            [100_001, 100_002, 100_000]
        );
    }

    #[test]
    fn a_status_uses_an_id_in_any_of_its_uid_or_gid_fields() {
        let status = "Name:\tsleep\nUid:\t7\t1000000005\t7\t7\nGid:\t8\t8\t8\t1000000009\n\
                      Groups:\t1000000011\n";
        assert!(status_uses_id(status, 1_000_000_005));
        assert!(status_uses_id(status, 1_000_000_009));
        assert!(status_uses_id(status, 7));
        assert!(!status_uses_id(status, 1_000_000_011), "Groups is not read");
        assert!(!status_uses_id(status, 1_000_000_006));
    }

    #[test]
    fn a_lock_dir_must_be_private_to_this_user() {
        let me = sys::geteuid();
        assert_eq!(private_dir_problem(true, me, 0o40700), None);
        assert_eq!(private_dir_problem(true, me, 0o40755), None);
        assert!(private_dir_problem(true, me, 0o40775).is_some());
        assert!(private_dir_problem(true, me, 0o41777).is_some());
        assert!(private_dir_problem(false, me, 0o100600).is_some());
        assert!(private_dir_problem(true, me.wrapping_add(1), 0o40700).is_some());
    }

    fn pool(dir: &Path, base: u32, count: u32) -> HostIdentityPool {
        HostIdentityPool::open_at(&dir.join("ids"), HostIdRange::new(base, count).unwrap()).unwrap()
    }

    #[test]
    fn leases_held_at_once_have_different_ids_until_the_range_is_exhausted() {
        let dir = tempfile::tempdir().unwrap();
        let pool = pool(dir.path(), 2_000_000_000, 2);
        let a = pool.acquire(0).unwrap();
        let b = pool.acquire(0).unwrap();
        assert_ne!(a.identity().uid, b.identity().uid);
        assert_eq!(a.identity().uid, a.identity().gid);
        assert_eq!(pool.held().unwrap(), 2);
        let err = pool.acquire(0).unwrap_err();
        assert_eq!(err.class(), ResultClass::SandboxUnavailable);
        assert!(err.to_string().contains("2000000000..=2000000001"), "{err}");
        a.release(true);
        assert_eq!(pool.held().unwrap(), 1);
        let c = pool.acquire(0).unwrap();
        assert_ne!(c.identity().uid, b.identity().uid);
    }

    #[test]
    fn a_slot_left_unclean_is_skipped_while_a_process_runs_with_its_id() {
        if sys::geteuid() != 0 {
            return;
        }
        use std::os::unix::process::CommandExt;
        let dir = tempfile::tempdir().unwrap();
        let pool = pool(dir.path(), 2_000_000_100, 1);
        let id = pool.acquire(0).unwrap();
        let uid = id.identity().uid;
        let mut survivor = std::process::Command::new("/bin/sleep")
            .arg("30")
            .uid(uid)
            .gid(uid)
            .spawn()
            .unwrap();
        // The holder ends without knowing its cell is gone.
        drop(id);
        let err = pool.acquire(0).unwrap_err();
        assert_eq!(err.class(), ResultClass::SandboxUnavailable, "{err}");
        survivor.kill().unwrap();
        survivor.wait().unwrap();
        let again = pool.acquire(0).unwrap();
        assert_eq!(again.identity().uid, uid);
        again.release(true);
        let clean = pool.acquire(0).unwrap();
        assert_eq!(clean.identity().uid, uid);
    }

    #[test]
    fn a_lock_dir_others_can_write_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let ids = dir.path().join("ids");
        std::fs::create_dir(&ids).unwrap();
        std::fs::set_permissions(&ids, std::fs::Permissions::from_mode(0o777)).unwrap();
        let err = HostIdentityPool::open_at(&ids, HostIdRange::default())
            .err()
            .unwrap();
        assert!(err.to_string().contains("writable by other users"), "{err}");
    }

    /// Allocation is on every cell's start path: its budget is 50 µs.
    #[test]
    fn an_allocation_takes_microseconds() {
        let dir = tempfile::tempdir().unwrap();
        let range = HostIdRange::new(2_000_000_200, 64).unwrap();
        HostIdentityPool::open_at(&dir.path().join("ids"), range)
            .unwrap()
            .acquire(0)
            .unwrap()
            .release(true);
        // This thread's time on a CPU, in ns (the first field of its schedstat): on a
        // loaded machine the wall time is mostly waiting for one.
        let on_cpu = || -> u64 {
            let text = std::fs::read_to_string("/proc/thread-self/schedstat").unwrap();
            text.split_whitespace().next().unwrap().parse().unwrap()
        };
        let rounds = 200;
        let (mut opened, mut acquired) = (std::time::Duration::ZERO, std::time::Duration::ZERO);
        let (cpu_before, started) = (on_cpu(), std::time::Instant::now());
        for _ in 0..rounds {
            let t = std::time::Instant::now();
            let pool = HostIdentityPool::open_at(&dir.path().join("ids"), range).unwrap();
            opened += t.elapsed();
            let t = std::time::Instant::now();
            let lease = pool.acquire(0).unwrap();
            acquired += t.elapsed();
            lease.release(true);
        }
        let each = started.elapsed() / rounds;
        let cpu_each = (on_cpu() - cpu_before) / u64::from(rounds);
        eprintln!(
            "per cell: open {:?} + acquire {:?}; with the release {each:?} wall, {cpu_each} ns on a CPU",
            opened / rounds,
            acquired / rounds
        );
        assert!(each < std::time::Duration::from_micros(500), "{each:?}");
    }
}
