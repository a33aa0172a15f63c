//! Where the cell's setup and its payload run (CPU placement).

use crate::sys;

/// The CPUs a payload with a quota of `cpu_millis` may run on: `ceil(cpu_millis / 1000)`
/// of `allowed` (at least one, at most all), starting at index `spread` (the CPU the cell
/// set itself up on, which other_cpu spreads over concurrent cells). A pure decision: the
/// quota (cpu.max) is what limits the CPU time; the mask only tells the payload how many
/// CPUs that time is worth.
pub fn payload_cpu_set(allowed: &[usize], cpu_millis: u32, spread: usize) -> Vec<usize> {
    if allowed.is_empty() {
        return Vec::new();
    }
    let wanted = (cpu_millis as usize).div_ceil(1000).clamp(1, allowed.len());
    let mut chosen: Vec<usize> = (0..wanted)
        .map(|i| allowed[(spread + i) % allowed.len()])
        .collect();
    chosen.sort_unstable();
    chosen
}

/// One of `cpus` other than the one this thread runs on, for work that should not wait
/// for this thread to block: some schedulers (this project's VM packs tasks onto one
/// vCPU) queue a new or woken task behind the task that made it. Used for the cell's setup
/// (both sides pin the cell there right after the clone, whichever runs first; the
/// supervisor gives the cell `cpus` back before it starts the payload) and for the
/// helper that drops the cell's mounts.
pub fn other_cpu(cpus: &sys::CpuSet) -> Option<usize> {
    let here = sys::current_cpu();
    let others: Vec<usize> = cpus
        .cpus()
        .into_iter()
        .filter(|c| Some(*c) != here)
        .collect();
    // Spread concurrent supervisors' cells over the other CPUs.
    (!others.is_empty()).then(|| others[std::process::id() as usize % others.len()])
}

/// Gives the payload CPUs of the caller's back (see [`other_cpu`]): as many as its quota
/// can use, which is what runtimes that size their thread pools from the affinity mask
/// (nproc, Go, the JVM, libuv) then see. They start at a CPU other than this thread's,
/// where the cell did its setup: the supervisor is busy finishing the record while the
/// payload starts.
pub fn place_payload(pid: libc::pid_t, cpus: &sys::CpuSet, cpu_millis: u32) {
    let allowed = cpus.cpus();
    let spread = other_cpu(cpus)
        .and_then(|cpu| allowed.iter().position(|c| *c == cpu))
        .unwrap_or(0);
    let mask = payload_cpu_set(&allowed, cpu_millis, spread);
    let _ = sys::set_affinity(pid, &sys::CpuSet::of(&mask));
}

#[cfg(test)]
mod tests {
    use super::payload_cpu_set;

    #[test]
    fn the_cpu_mask_matches_the_quota() {
        let allowed = [0, 1, 2, 3];
        assert_eq!(payload_cpu_set(&allowed, 1000, 0), [0]);
        assert_eq!(payload_cpu_set(&allowed, 250, 0), [0], "at least one CPU");
        assert_eq!(
            payload_cpu_set(&allowed, 1500, 0),
            [0, 1],
            "a part of a CPU counts"
        );
        assert_eq!(
            payload_cpu_set(&allowed, 64000, 0),
            [0, 1, 2, 3],
            "at most all"
        );
        assert!(payload_cpu_set(&[], 1000, 0).is_empty());
    }

    #[test]
    fn concurrent_cells_are_spread_over_the_allowed_cpus() {
        let allowed = [2, 5, 7];
        assert_eq!(payload_cpu_set(&allowed, 1000, 1), [5]);
        assert_eq!(payload_cpu_set(&allowed, 2000, 2), [2, 7], "wraps around");
    }
}
