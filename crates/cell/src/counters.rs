//! What a cell's cgroup counted, as plain data: the cgroup module reads it, the report
//! module classifies with it, and neither depends on the other for the type.

/// Counters read after the cell has ended.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct CgroupUsage {
    pub memory_peak_bytes: u64,
    pub oom_kills: u64,
    /// How often a fork/clone was refused because of the pids limit.
    pub pids_limit_hits: u64,
    pub pids_peak: u64,
}
