//! The operator's "rlimits only" exception (docs/policy.md, `ceilings_without_cgroup`):
//! where no cgroup is delegated to the caller, a run of a class that allows it gets
//! rlimits in place of its cgroup's ceilings, and its record says what was requested,
//! what enforced it and what was not enforced (docs/threat-model.md). Decided here,
//! without I/O; the cell only applies it.

use crate::{Limits, Rlimit, RlimitResource};
use serde::{Deserialize, Serialize};

/// What stands in for a cell's cgroup (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RlimitsOnly {
    /// The workload class whose operator setting allows it.
    pub class: String,
    /// Each ceiling of the contract that an rlimit stands in for.
    pub enforced: Vec<RlimitCeiling>,
    /// What the cgroup would have enforced that the rlimits do not.
    pub not_enforced: Vec<String>,
}

/// One ceiling and the rlimit that enforces it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RlimitCeiling {
    /// The contract's ceiling, as results name it (`memory`, `pids`, `cpu`, `file_size`).
    pub ceiling: String,
    pub rlimit: Rlimit,
    pub applies_to: RlimitTarget,
    /// What the limit bounds, in words, for the record.
    pub bounds: String,
}

/// Which processes an rlimit is set in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RlimitTarget {
    /// The cell's pid 1, and so everything it starts.
    Cell,
    /// Each payload process, set just before its exec: airlock's own pid 1 is a clone of
    /// the supervisor and keeps its address space and CPU time out of the payload's.
    EachPayloadProcess,
}

impl RlimitsOnly {
    /// The rlimits that stand in for the cgroup of a cell with `limits`, for `class`.
    pub fn for_limits(class: &str, limits: &Limits) -> RlimitsOnly {
        let ceiling = |name: &str, resource, value, applies_to, bounds: &str| RlimitCeiling {
            ceiling: name.into(),
            rlimit: Rlimit { resource, value },
            applies_to,
            bounds: bounds.into(),
        };
        RlimitsOnly {
            class: class.into(),
            enforced: vec![
                ceiling(
                    "memory",
                    RlimitResource::As,
                    limits.memory_bytes,
                    RlimitTarget::EachPayloadProcess,
                    "the address space of each payload process, not their sum",
                ),
                ceiling(
                    "pids",
                    RlimitResource::Nproc,
                    limits.cell_pids_max(),
                    RlimitTarget::Cell,
                    "tasks (processes and threads) of the cell's identity in the cell's own user namespace, airlock's pid 1 included: this cell's alone, however many other processes the caller has",
                ),
                ceiling(
                    "cpu",
                    RlimitResource::Cpu,
                    cpu_seconds(limits),
                    RlimitTarget::EachPayloadProcess,
                    "seconds of CPU time of each payload process: what the CPU quota allows over the whole deadline (SIGXCPU, then SIGKILL a second later)",
                ),
                ceiling(
                    "file_size",
                    RlimitResource::Fsize,
                    limits.file_size_bytes,
                    RlimitTarget::Cell,
                    "the largest file any process of the cell may write, as with a cgroup",
                ),
            ],
            not_enforced: vec![
                "the CPU rate (cpu_millis): without cpu.max the cell may use every CPU the caller may, until its deadline".into(),
                "the memory of the cell as a whole: RLIMIT_AS bounds each process's address space, so N processes may use N times it; tmpfs pages (writable paths, /dev/shm, each still size-capped), pipe buffers and kernel memory are not counted, and swap is not prevented".into(),
                "usage counters: memory peak, pids peak and OOM kills are not measured, so a refused allocation or fork shows only in how the payload ends".into(),
                "the cell's view of its own limits under /sys/fs/cgroup".into(),
            ],
        }
    }

    /// The rlimits of the cell's pid 1: `planned` (the plan's `layout.rlimits`) with
    /// those of [`RlimitTarget::Cell`] in place of the same resource's.
    pub fn cell_rlimits(&self, planned: &[Rlimit]) -> Vec<Rlimit> {
        let own = self.targeted(RlimitTarget::Cell);
        let mut rlimits: Vec<Rlimit> = planned
            .iter()
            .filter(|p| !own.iter().any(|o| o.resource == p.resource))
            .copied()
            .collect();
        rlimits.extend(own);
        rlimits
    }

    /// The rlimits set in each payload process before its exec.
    pub fn payload_rlimits(&self) -> Vec<Rlimit> {
        self.targeted(RlimitTarget::EachPayloadProcess)
    }

    fn targeted(&self, target: RlimitTarget) -> Vec<Rlimit> {
        self.enforced
            .iter()
            .filter(|c| c.applies_to == target)
            .map(|c| c.rlimit)
            .collect()
    }
}

/// RLIMIT_CPU: the CPU time the quota allows over the deadline, rounded up, at least 1 s.
fn cpu_seconds(limits: &Limits) -> u64 {
    (u64::from(limits.cpu_millis) * limits.wall_time_ms)
        .div_ceil(1_000_000)
        .max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> Limits {
        Limits {
            cpu_millis: 500,
            memory_bytes: 64 << 20,
            process_limit: 8,
            wall_time_ms: 30_000,
            output_bytes: 1024,
            open_files: 256,
            file_size_bytes: 1 << 20,
            shm_bytes: 1 << 20,
        }
    }

    fn rlimit(resource: RlimitResource, value: u64) -> Rlimit {
        Rlimit { resource, value }
    }

    #[test]
    fn pid_1_gets_the_exact_process_ceiling_and_the_payload_its_memory_and_cpu() {
        let only = RlimitsOnly::for_limits("laptop", &limits());
        let planned = [
            rlimit(RlimitResource::Core, 0),
            rlimit(RlimitResource::Nofile, 256),
            rlimit(RlimitResource::Fsize, 1 << 20),
            // The cgroup's backstop, one above pids.max.
            rlimit(RlimitResource::Nproc, 10),
        ];
        assert_eq!(
            only.cell_rlimits(&planned),
            [
                rlimit(RlimitResource::Core, 0),
                rlimit(RlimitResource::Nofile, 256),
                // process_limit + airlock's pid 1: the rlimit is the ceiling now.
                rlimit(RlimitResource::Nproc, 9),
                rlimit(RlimitResource::Fsize, 1 << 20),
            ]
        );
        assert_eq!(
            only.payload_rlimits(),
            [
                rlimit(RlimitResource::As, 64 << 20),
                // 0.5 CPU over 30 s.
                rlimit(RlimitResource::Cpu, 15),
            ]
        );
        assert_eq!(only.class, "laptop");
        assert!(only.not_enforced.iter().any(|n| n.contains("cpu_millis")));
    }

    #[test]
    fn the_cpu_time_is_rounded_up_to_a_whole_second() {
        let short = Limits {
            cpu_millis: 100,
            wall_time_ms: 1_500,
            ..limits()
        };
        assert_eq!(cpu_seconds(&short), 1);
        let long = Limits {
            cpu_millis: 2_000,
            wall_time_ms: 600_001,
            ..limits()
        };
        assert_eq!(cpu_seconds(&long), 1_201);
    }
}
