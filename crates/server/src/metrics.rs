//! The service's figures in Prometheus text (`GET /metrics`), labelled by workload class
//! (the contract's name until workload classes exist) and tenant.

use airlock_cell::report::{Ceiling, RunReport};
use airlock_engine::Engine;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use std::collections::BTreeMap;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RunLabels {
    class: String,
    tenant: String,
    result: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ClassTenant {
    class: String,
    tenant: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    class: String,
    tenant: String,
    reason: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CeilingLabels {
    class: String,
    tenant: String,
    limit: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PoolLabels {
    pool: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TenantLabels {
    tenant: String,
}

type Histograms = Family<ClassTenant, Histogram, fn() -> Histogram>;

fn seconds_histogram() -> Histogram {
    // 0.5 ms to ~16 s.
    Histogram::new(exponential_buckets(0.0005, 2.0, 16))
}

pub struct Metrics {
    registry: Registry,
    runs: Family<RunLabels, Counter>,
    start_latency: Histograms,
    wall_time: Histograms,
    denials: Family<ReasonLabels, Counter>,
    deadline_kills: Family<ClassTenant, Counter>,
    ceilings: Family<CeilingLabels, Counter>,
    cleanup_failures: Family<ClassTenant, Counter>,
    pool_size: Family<PoolLabels, Gauge>,
    pool_free: Family<PoolLabels, Gauge>,
    sessions_active: Family<TenantLabels, Gauge>,
    cells_alive: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("airlock");
        let m = Metrics {
            runs: Family::default(),
            start_latency: Family::new_with_constructor(seconds_histogram),
            wall_time: Family::new_with_constructor(seconds_histogram),
            denials: Family::default(),
            deadline_kills: Family::default(),
            ceilings: Family::default(),
            cleanup_failures: Family::default(),
            pool_size: Family::default(),
            pool_free: Family::default(),
            sessions_active: Family::default(),
            cells_alive: Gauge::default(),
            registry: Registry::default(),
        };
        registry.register(
            "runs",
            "Runs and session commands ended, by result class",
            m.runs.clone(),
        );
        registry.register(
            "start_latency_seconds",
            "From request to payload start",
            m.start_latency.clone(),
        );
        registry.register(
            "wall_time_seconds",
            "Payload wall time",
            m.wall_time.clone(),
        );
        registry.register(
            "denials",
            "Denials by reason code (egress, quotas, refusals)",
            m.denials.clone(),
        );
        registry.register(
            "deadline_kills",
            "Runs killed at their wall-time deadline",
            m.deadline_kills.clone(),
        );
        registry.register(
            "ceilings_fired",
            "Ceilings that decided a run, by ceiling",
            m.ceilings.clone(),
        );
        registry.register(
            "cleanup_failures",
            "Cells whose teardown left something behind",
            m.cleanup_failures.clone(),
        );
        registry.register("pool_size", "Warm cells a pool keeps", m.pool_size.clone());
        registry.register("pool_free", "Warm cells parked now", m.pool_free.clone());
        registry.register(
            "sessions_active",
            "Open sessions",
            m.sessions_active.clone(),
        );
        registry.register(
            "cells_alive",
            "Cells alive: parked, running, in sessions",
            m.cells_alive.clone(),
        );
        Metrics { registry, ..m }
    }
}

impl Metrics {
    /// Counts an ended run or command; `start` (request to payload start) and `wall`
    /// (payload start to exit), seconds, when they were measured (the report's own start
    /// timing of a warm cell counts from when it was built, not from the request).
    pub fn observe(
        &self,
        class: &str,
        tenant: &str,
        report: &RunReport,
        (start, wall): (Option<f64>, Option<f64>),
    ) {
        let ct = ClassTenant {
            class: class.to_string(),
            tenant: tenant.to_string(),
        };
        self.runs
            .get_or_create(&RunLabels {
                class: class.to_string(),
                tenant: tenant.to_string(),
                result: report.status.as_str().to_string(),
            })
            .inc();
        if let Some(start) = start {
            self.start_latency.get_or_create(&ct).observe(start);
        }
        if let Some(wall) = wall {
            self.wall_time.get_or_create(&ct).observe(wall);
        }
        if let Some(limit) = report.limit_fired {
            if limit == Ceiling::WallTime {
                self.deadline_kills.get_or_create(&ct).inc();
            }
            self.ceilings
                .get_or_create(&CeilingLabels {
                    class: class.to_string(),
                    tenant: tenant.to_string(),
                    limit: limit.as_str().to_string(),
                })
                .inc();
        }
        if !report.cleanup.ok {
            self.cleanup_failures.get_or_create(&ct).inc();
        }
        for reason in report
            .egress
            .iter()
            .flatten()
            .filter_map(|e| e.reason.as_deref())
        {
            self.deny(class, tenant, reason);
        }
    }

    /// Counts a denial (an egress decision, a quota, a refused request).
    pub fn deny(&self, class: &str, tenant: &str, reason: &str) {
        self.denials
            .get_or_create(&ReasonLabels {
                class: class.to_string(),
                tenant: tenant.to_string(),
                reason: reason.to_string(),
            })
            .inc();
    }

    /// The text exposition, with the gauges read now.
    pub fn render(
        &self,
        engine: &Engine,
        pools: &BTreeMap<String, airlock_engine::PlanShape>,
        sessions: &BTreeMap<String, i64>,
    ) -> String {
        let status = engine.pool_status();
        for (name, shape) in pools {
            let pool = status.iter().find(|p| &p.shape == shape);
            let labels = PoolLabels { pool: name.clone() };
            self.pool_size
                .get_or_create(&labels)
                .set(pool.map_or(0, |p| p.size as i64));
            self.pool_free
                .get_or_create(&labels)
                .set(pool.map_or(0, |p| p.parked as i64));
        }
        self.sessions_active.clear();
        for (tenant, open) in sessions {
            self.sessions_active
                .get_or_create(&TenantLabels {
                    tenant: tenant.clone(),
                })
                .set(*open);
        }
        self.cells_alive.set(engine.live_cells() as i64);
        self.encode()
    }

    fn encode(&self) -> String {
        let mut text = String::new();
        let _ = prometheus_client::encoding::text::encode(&mut text, &self.registry);
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use airlock_cell::report::ResultClass;

    #[test]
    fn a_run_is_counted_by_class_tenant_result_ceiling_and_cleanup() {
        let metrics = Metrics::default();
        let mut report = RunReport::refused("r", ResultClass::TaskError, "x".into());
        report.limit_fired = Some(Ceiling::WallTime);
        report.cleanup.ok = false;
        metrics.observe("small", "alice", &report, (Some(0.002), Some(1.0)));
        let text = metrics.encode();
        for line in [
            r#"airlock_runs_total{class="small",tenant="alice",result="task_error"} 1"#,
            r#"airlock_deadline_kills_total{class="small",tenant="alice"} 1"#,
            r#"airlock_ceilings_fired_total{class="small",tenant="alice",limit="wall_time"} 1"#,
            r#"airlock_cleanup_failures_total{class="small",tenant="alice"} 1"#,
            r#"airlock_start_latency_seconds_count{class="small",tenant="alice"} 1"#,
        ] {
            assert!(text.contains(line), "{line} missing from\n{text}");
        }
    }
}
