//! An `update` of a running container's resources (the runtime's `update --resources`:
//! containerd's shim passes the spec's `LinuxResources` as JSON) as new limits of its
//! cell. Pure: the caller reads the request and the cell's plan, this module decides.
//!
//! The plan's limits (the contract as the spec narrowed it at `create`, what the run's
//! begin record holds) are ceilings an update cannot cross: a limit may be lowered, or
//! raised again up to its ceiling, never above it and never to "unlimited". What airlock
//! enforces is memory, pids and the CPU quota, as at `create`; a request for anything
//! else it would have to enforce is refused, naming the field, never silently dropped.
//! Left alone, as at `create`: the device cgroup rules (the cell has only airlock's own
//! `/dev` nodes), CPU shares and weights (a share of contended CPU, not a ceiling) and
//! swap (a cell never swaps: its memory+swap limit is its memory limit).
//!
//! A gVisor cell's `pids.max` counts the sandbox's own host tasks (runsc's threads, a
//! multiple of the payload's: crates/cell/src/gvisor), not the payload's tasks, so its
//! pids limit cannot be changed this way: refused.

use airlock_contract::{Isolation, Limits};
use oci_spec::runtime::LinuxResources;

/// The CFS period the spec's quota is relative to when it names none (runc's default).
const DEFAULT_PERIOD_US: u64 = 100_000;

/// The new limits of an update; `None` leaves one as it is.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct ResourceUpdate {
    pub memory_bytes: Option<u64>,
    /// The payload's tasks (the spec's `pids.limit`, as at `create`).
    pub process_limit: Option<u32>,
    pub cpu_millis: Option<u32>,
}

impl ResourceUpdate {
    pub fn is_empty(&self) -> bool {
        *self == ResourceUpdate::default()
    }
}

/// A part of an update airlock refuses: the field, and the rule it breaks.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("update {field}: {rule}")]
pub struct UpdateRefusal {
    pub field: String,
    pub rule: String,
}

fn refuse<T>(field: &str, rule: impl Into<String>) -> Result<T, UpdateRefusal> {
    Err(UpdateRefusal {
        field: field.into(),
        rule: rule.into(),
    })
}

/// The limits `resources` asks for, each checked against its ceiling in `plan`.
pub fn resource_update(
    resources: &LinuxResources,
    plan: &Limits,
    isolation: Isolation,
) -> Result<ResourceUpdate, UpdateRefusal> {
    refuse_unenforced(resources)?;
    let memory = resources.memory().as_ref().and_then(|m| m.limit());
    let pids = resources.pids().as_ref().map(|p| p.limit());
    let cpu = resources.cpu().as_ref();
    let quota = cpu.and_then(|c| c.quota());
    let period = cpu.and_then(|c| c.period());
    let update = ResourceUpdate {
        memory_bytes: within("memory.limit", memory, plan.memory_bytes, "bytes")?,
        process_limit: within("pids.limit", pids, plan.process_limit.into(), "tasks")?
            .map(|p| p as u32),
        cpu_millis: cpu_millis(quota, period, plan.cpu_millis)?,
    };
    if isolation == Isolation::Gvisor && update.process_limit.is_some() {
        return refuse(
            "pids.limit",
            "a gVisor cell's cgroup counts the sandbox's own tasks, not the payload's: \
             its pids limit is not changed by an update",
        );
    }
    Ok(update)
}

/// A requested limit (0 or absent: unchanged, as runc reads it; negative: unlimited)
/// checked against its ceiling.
fn within(
    field: &str,
    asked: Option<i64>,
    ceiling: u64,
    unit: &str,
) -> Result<Option<u64>, UpdateRefusal> {
    match asked {
        None | Some(0) => Ok(None),
        Some(n) if n < 0 => refuse(
            field,
            format!(
                "unlimited is above the contract's ceiling of {ceiling} {unit} (an update \
                 may lower a limit or raise it up to its ceiling, never above)"
            ),
        ),
        Some(n) if n as u64 > ceiling => refuse(
            field,
            format!(
                "{n} {unit} is above the contract's ceiling of {ceiling} {unit} (an update \
                 may lower a limit or raise it up to its ceiling, never above)"
            ),
        ),
        Some(n) => Ok(Some(n as u64)),
    }
}

/// The CPU quota as thousandths of a CPU, rounded up as at `create` (the ceiling is in
/// the same unit, so a quota at the ceiling stays at it).
fn cpu_millis(
    quota: Option<i64>,
    period: Option<u64>,
    ceiling: u32,
) -> Result<Option<u32>, UpdateRefusal> {
    let millis = match quota {
        None | Some(0) => return Ok(None),
        Some(q) if q < 0 => Some(-1),
        Some(q) => {
            let period = period.filter(|p| *p > 0).unwrap_or(DEFAULT_PERIOD_US);
            Some(i64::try_from((q as u64 * 1000).div_ceil(period)).unwrap_or(i64::MAX))
        }
    };
    Ok(within("cpu.quota", millis, ceiling.into(), "thousandths of a CPU")?.map(|m| m as u32))
}

/// Fields that ask for a control airlock does not apply to a cell.
fn refuse_unenforced(resources: &LinuxResources) -> Result<(), UpdateRefusal> {
    const RULE: &str = "airlock does not apply it to a cell (memory, pids and the CPU \
                        quota are what an update may change)";
    let set = |field: &str, present: bool| match present {
        true => refuse(field, RULE),
        false => Ok(()),
    };
    if let Some(memory) = resources.memory() {
        set("memory.reservation", memory.reservation().is_some())?;
        set("memory.kernel", memory.kernel().is_some())?;
        set("memory.kernelTCP", memory.kernel_tcp().is_some())?;
        set("memory.swappiness", memory.swappiness().is_some())?;
        if memory.disable_oom_killer() == Some(true) {
            return refuse(
                "memory.disableOOMKiller",
                "a cell over its memory ceiling is killed, never left waiting",
            );
        }
    }
    if let Some(cpu) = resources.cpu() {
        let nonempty = |s: &Option<String>| s.as_ref().is_some_and(|s| !s.is_empty());
        set("cpu.cpus", nonempty(cpu.cpus()))?;
        set("cpu.mems", nonempty(cpu.mems()))?;
        set("cpu.realtimeRuntime", cpu.realtime_runtime().is_some())?;
        set("cpu.realtimePeriod", cpu.realtime_period().is_some())?;
        set("cpu.burst", cpu.burst().is_some_and(|b| b > 0))?;
    }
    set("blockIO", resources.block_io().is_some())?;
    let listed = |v: Option<usize>| v.is_some_and(|n| n > 0);
    set(
        "hugepageLimits",
        listed(resources.hugepage_limits().as_ref().map(Vec::len)),
    )?;
    set("network", resources.network().is_some())?;
    set("rdma", listed(resources.rdma().as_ref().map(|r| r.len())))?;
    set(
        "unified",
        listed(resources.unified().as_ref().map(|u| u.len())),
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan() -> Limits {
        Limits {
            cpu_millis: 1000,
            memory_bytes: 256 << 20,
            process_limit: 64,
            wall_time_ms: 1000,
            output_bytes: 1024,
            open_files: 256,
            file_size_bytes: 1 << 20,
            shm_bytes: 1 << 20,
        }
    }

    fn update(json: &str) -> Result<ResourceUpdate, UpdateRefusal> {
        let resources: LinuxResources = serde_json::from_str(json).unwrap();
        resource_update(&resources, &plan(), Isolation::Native)
    }

    #[test]
    fn lowering_or_keeping_every_limit_is_accepted() {
        let lower = update(
            r#"{"memory":{"limit":67108864},"pids":{"limit":8},"cpu":{"quota":50000,"period":100000}}"#,
        )
        .unwrap();
        assert_eq!(
            lower,
            ResourceUpdate {
                memory_bytes: Some(64 << 20),
                process_limit: Some(8),
                cpu_millis: Some(500),
            }
        );
        let keep =
            update(r#"{"memory":{"limit":268435456},"pids":{"limit":64},"cpu":{"quota":100000}}"#)
                .unwrap();
        assert_eq!(keep.memory_bytes, Some(256 << 20));
        assert_eq!(keep.cpu_millis, Some(1000));
    }

    #[test]
    fn raising_above_a_ceiling_is_refused_naming_the_limit_and_the_ceiling() {
        let error = update(r#"{"memory":{"limit":536870912}}"#).unwrap_err();
        assert_eq!(error.field, "memory.limit");
        let text = error.to_string();
        assert!(text.contains("536870912 bytes"), "{text}");
        assert!(text.contains("ceiling of 268435456 bytes"), "{text}");
        let error = update(r#"{"pids":{"limit":65}}"#).unwrap_err();
        assert_eq!(error.field, "pids.limit");
        assert!(error.to_string().contains("ceiling of 64 tasks"), "{error}");
        // Two CPUs' worth against one; a shorter period is a larger share.
        let error = update(r#"{"cpu":{"quota":200000,"period":100000}}"#).unwrap_err();
        assert_eq!(error.field, "cpu.quota");
        let error = update(r#"{"cpu":{"quota":60000,"period":50000}}"#).unwrap_err();
        assert!(error.to_string().contains("1200 thousandths"), "{error}");
    }

    #[test]
    fn unlimited_is_above_every_ceiling() {
        for (json, field) in [
            (r#"{"memory":{"limit":-1}}"#, "memory.limit"),
            (r#"{"pids":{"limit":-1}}"#, "pids.limit"),
            (r#"{"cpu":{"quota":-1}}"#, "cpu.quota"),
        ] {
            let error = update(json).unwrap_err();
            assert_eq!(error.field, field);
            assert!(error.rule.starts_with("unlimited"), "{error}");
        }
    }

    #[test]
    fn what_containerd_sends_besides_the_limits_is_left_as_at_create() {
        // ctr's and the CRI plugin's update: the whole spec's resources.
        let accepted = update(
            r#"{"devices":[{"allow":false,"access":"rwm"}],
                "memory":{"limit":33554432,"swap":33554432},
                "cpu":{"shares":1024,"cpus":"","mems":""},
                "pids":{"limit":0}}"#,
        )
        .unwrap();
        assert_eq!(
            accepted,
            ResourceUpdate {
                memory_bytes: Some(32 << 20),
                ..ResourceUpdate::default()
            }
        );
        assert!(update("{}").unwrap().is_empty());
    }

    #[test]
    fn controls_airlock_does_not_apply_are_refused_by_name() {
        for (json, field) in [
            (r#"{"cpu":{"cpus":"0-1"}}"#, "cpu.cpus"),
            (
                r#"{"memory":{"reservation":1048576}}"#,
                "memory.reservation",
            ),
            (
                r#"{"memory":{"disableOOMKiller":true}}"#,
                "memory.disableOOMKiller",
            ),
            (r#"{"blockIO":{"weight":10}}"#, "blockIO"),
            (r#"{"unified":{"memory.high":"1000000"}}"#, "unified"),
            (
                r#"{"hugepageLimits":[{"pageSize":"2MB","limit":1}]}"#,
                "hugepageLimits",
            ),
        ] {
            assert_eq!(update(json).unwrap_err().field, field, "{json}");
        }
    }

    #[test]
    fn a_gvisor_cells_pids_limit_is_not_changed_but_its_memory_is() {
        let resources = |json: &str| serde_json::from_str::<LinuxResources>(json).unwrap();
        let pids = resources(r#"{"pids":{"limit":8}}"#);
        let error = resource_update(&pids, &plan(), Isolation::Gvisor).unwrap_err();
        assert_eq!(error.field, "pids.limit");
        assert!(error.rule.contains("gVisor"), "{error}");
        let memory = resources(r#"{"memory":{"limit":67108864}}"#);
        let update = resource_update(&memory, &plan(), Isolation::Gvisor).unwrap();
        assert_eq!(update.memory_bytes, Some(64 << 20));
    }
}
