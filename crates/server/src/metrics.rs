//! The service's figures (`GET /metrics`), labelled by workload class and tenant, in
//! Prometheus text 0.0.4 or OpenMetrics 1.0.0 (by `Accept`).
//!
//! A tenant chooses what it sends, so nothing it sends becomes a label value as it is:
//! a class or tenant the operator's configuration does not name counts under `unknown`,
//! a reason code that is not one counts under `other`, every label value is escaped, and
//! the number of series is capped by `[server] metrics_max_series` (beyond it a new
//! series is dropped and counted in `airlock_metrics_series_dropped_total`).

use airlock_cell::report::{Ceiling, RunReport};
use airlock_engine::Engine;
use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::{Family, MetricConstructor};
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicUsize, Ordering};

/// The label value of a class or tenant the configuration does not name.
pub const UNKNOWN: &str = "unknown";
/// The label value of a reason that is not a reason code.
pub const OTHER_REASON: &str = "other";
/// The longest reason code kept as a label value.
const MAX_REASON_LEN: usize = 64;

/// A label value, escaped as both exposition formats say (`\` `"` and line feed;
/// prometheus-client 0.24 writes label values as they are).
#[derive(Debug, Clone, Hash, PartialEq, Eq)]
struct Value(String);

impl Value {
    fn of(s: &str) -> Value {
        Value(s.to_string())
    }
}

impl EncodeLabelValue for Value {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        encoder.write_str(&escape_label_value(&self.0))
    }
}

/// `\` as `\\`, `"` as `\"`, line feed as `\n`: the label value escapes of the text format
/// 0.0.4 and of OpenMetrics 1.0.0.
pub fn escape_label_value(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RunLabels {
    class: Value,
    tenant: Value,
    result: Value,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ClassTenant {
    class: Value,
    tenant: Value,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    class: Value,
    tenant: Value,
    reason: Value,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CeilingLabels {
    class: Value,
    tenant: Value,
    limit: Value,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PoolLabels {
    pool: Value,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TenantLabels {
    tenant: Value,
}

type Histograms = Family<ClassTenant, Histogram, fn() -> Histogram>;

fn seconds_histogram() -> Histogram {
    // 0.5 ms to ~16 s.
    Histogram::new(exponential_buckets(0.0005, 2.0, 16))
}

/// What label values may be: the operator's names. Anything else is `unknown`.
#[derive(Debug, Clone, Default)]
pub struct Vocabulary {
    /// `[server.contracts]` names and `[policy.classes]` names.
    pub classes: BTreeSet<String>,
    /// `[server.tenants]` names and the operator tenant.
    pub tenants: BTreeSet<String>,
    /// `[server] metrics_max_series`.
    pub max_series: usize,
}

impl Vocabulary {
    /// A class's label value: its name when the configuration defines it, `""` for none
    /// (a refusal before any class, e.g. a quota), `unknown` otherwise.
    pub fn class<'a>(&self, class: &'a str) -> &'a str {
        if class.is_empty() || self.classes.contains(class) {
            class
        } else {
            UNKNOWN
        }
    }

    pub fn tenant<'a>(&self, tenant: &'a str) -> &'a str {
        if self.tenants.contains(tenant) {
            tenant
        } else {
            UNKNOWN
        }
    }
}

/// A reason's label value: a reason code (`quota.cells`, `egress.denied`: lower-case
/// words joined by `.` `_` `-`) as it is, anything else `other`.
pub fn reason_label(reason: &str) -> &str {
    let is_code = !reason.is_empty()
        && reason.len() <= MAX_REASON_LEN
        && reason
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b));
    if is_code {
        reason
    } else {
        OTHER_REASON
    }
}

/// The exposition format a scraper asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Prometheus text 0.0.4, the default.
    Text004,
    /// OpenMetrics text 1.0.0 (`Accept: application/openmetrics-text`).
    OpenMetrics,
}

impl Format {
    /// By `Accept`: OpenMetrics when a scraper prefers it (its highest `q` among the
    /// ranges that name it is above zero and not below text's), text 0.0.4 otherwise.
    pub fn negotiate(accept: Option<&str>) -> Format {
        let Some(accept) = accept else {
            return Format::Text004;
        };
        let (mut openmetrics, mut text) = (0.0f32, 0.0f32);
        for range in accept.split(',') {
            let mut parts = range.split(';').map(str::trim);
            let media = parts.next().unwrap_or("").to_ascii_lowercase();
            let q = parts
                .filter_map(|p| p.strip_prefix("q="))
                .find_map(|q| q.trim().parse::<f32>().ok())
                .unwrap_or(1.0);
            match media.as_str() {
                "application/openmetrics-text" => openmetrics = openmetrics.max(q),
                "text/plain" | "text/*" | "*/*" => text = text.max(q),
                _ => {}
            }
        }
        if openmetrics > 0.0 && openmetrics >= text {
            Format::OpenMetrics
        } else {
            Format::Text004
        }
    }

    pub fn content_type(self) -> &'static str {
        match self {
            Format::Text004 => "text/plain; version=0.0.4; charset=utf-8",
            Format::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
        }
    }

    /// The OpenMetrics exposition (with its `# EOF`) in this format.
    pub fn express(self, openmetrics: &str) -> String {
        match self {
            Format::OpenMetrics => openmetrics.to_string(),
            Format::Text004 => to_text_004(openmetrics),
        }
    }
}

/// OpenMetrics text as Prometheus text 0.0.4: a counter's family is named by its samples
/// (`x_total`, not `x`), no `# UNIT`, no `# EOF`. Sample lines are the same in both (label
/// values escaped, so no line of a value starts with `#`).
fn to_text_004(openmetrics: &str) -> String {
    let mut out = String::with_capacity(openmetrics.len());
    let mut help: Option<&str> = None;
    for line in openmetrics.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            help = Some(rest);
            continue;
        }
        if line.starts_with("# UNIT ") || line == "# EOF" {
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap_or((rest, "untyped"));
            let name = if kind == "counter" && !name.ends_with("_total") {
                format!("{name}_total")
            } else {
                name.to_string()
            };
            if let Some(help) = help.take() {
                let text = help.split_once(' ').map_or("", |(_, t)| t);
                let _ = writeln!(out, "# HELP {name} {text}");
            }
            let _ = writeln!(out, "# TYPE {name} {kind}");
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

/// Every family: its name (after `airlock_`, before a counter's `_total`), its type, its
/// HELP (docs/api.md lists them).
const FAMILIES: [(&str, &str, &str); 13] = [
    (
        "runs",
        "counter",
        "Runs and session commands ended, by result class",
    ),
    (
        "start_latency_seconds",
        "histogram",
        "From request to payload start, seconds",
    ),
    (
        "wall_time_seconds",
        "histogram",
        "Payload wall time, seconds",
    ),
    (
        "denials",
        "counter",
        "Denials by reason code (egress, quotas, refusals)",
    ),
    (
        "deadline_kills",
        "counter",
        "Runs killed at their wall-time deadline",
    ),
    (
        "ceilings_fired",
        "counter",
        "Ceilings that decided a run, by ceiling",
    ),
    (
        "cleanup_failures",
        "counter",
        "Cells whose teardown left something behind",
    ),
    ("pool_size", "gauge", "Warm cells a pool keeps"),
    ("pool_free", "gauge", "Warm cells parked now"),
    ("sessions_active", "gauge", "Open sessions"),
    (
        "cells_alive",
        "gauge",
        "Cells alive: parked, running, in sessions",
    ),
    (
        "metrics_series_dropped",
        "counter",
        "Series not created because [server] metrics_max_series was reached",
    ),
    (
        "store_finishes_lost",
        "counter",
        "Finishes of runs the store could not take and the spool had no room for",
    ),
];

fn help(name: &str) -> &'static str {
    FAMILIES
        .iter()
        .find(|(n, _, _)| *n == name)
        .map_or("", |(_, _, help)| help)
}

pub struct Metrics {
    registry: Registry,
    vocabulary: Vocabulary,
    /// Series created so far by the request-driven families (the gauges are one per pool
    /// and tenant of the configuration).
    series: AtomicUsize,
    series_dropped: Counter,
    /// Mirrors `airlock_store::spool::lost_finishes` (the process's count) at each scrape.
    finishes_lost: Counter,
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
        Metrics::new(Vocabulary {
            max_series: 10_000,
            ..Vocabulary::default()
        })
    }
}

impl Metrics {
    pub fn new(vocabulary: Vocabulary) -> Self {
        let mut m = Metrics {
            registry: Registry::with_prefix("airlock"),
            vocabulary,
            series: AtomicUsize::new(0),
            series_dropped: Counter::default(),
            finishes_lost: Counter::default(),
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
        };
        m.register();
        m.export_zeros();
        m
    }

    fn register(&mut self) {
        let r = &mut self.registry;
        r.register("runs", help("runs"), self.runs.clone());
        let latency = "start_latency_seconds";
        r.register(latency, help(latency), self.start_latency.clone());
        let wall = "wall_time_seconds";
        r.register(wall, help(wall), self.wall_time.clone());
        r.register("denials", help("denials"), self.denials.clone());
        let kills = "deadline_kills";
        r.register(kills, help(kills), self.deadline_kills.clone());
        let ceilings = "ceilings_fired";
        r.register(ceilings, help(ceilings), self.ceilings.clone());
        let cleanup = "cleanup_failures";
        r.register(cleanup, help(cleanup), self.cleanup_failures.clone());
        r.register("pool_size", help("pool_size"), self.pool_size.clone());
        r.register("pool_free", help("pool_free"), self.pool_free.clone());
        let sessions = "sessions_active";
        r.register(sessions, help(sessions), self.sessions_active.clone());
        let cells = "cells_alive";
        r.register(cells, help(cells), self.cells_alive.clone());
        let dropped = "metrics_series_dropped";
        r.register(dropped, help(dropped), self.series_dropped.clone());
        let lost = "store_finishes_lost";
        r.register(lost, help(lost), self.finishes_lost.clone());
    }

    /// The families an alert watches show 0 before anything happened: cleanup failures
    /// and deadline kills per class and tenant of the configuration, open sessions per
    /// tenant (within `metrics_max_series`).
    fn export_zeros(&self) {
        let classes = self.vocabulary.classes.iter().map(String::as_str);
        for class in classes.chain([UNKNOWN]) {
            for tenant in &self.vocabulary.tenants {
                let ct = ClassTenant {
                    class: Value::of(class),
                    tenant: Value::of(tenant),
                };
                self.with_series(&self.cleanup_failures, &ct, |_| {});
                self.with_series(&self.deadline_kills, &ct, |_| {});
            }
        }
        for tenant in &self.vocabulary.tenants {
            self.sessions_active
                .get_or_create(&TenantLabels {
                    tenant: Value::of(tenant),
                })
                .set(0);
        }
    }

    /// Applies `f` to the series of `labels`, creating it if the cap allows; a series the
    /// cap refuses is counted as dropped instead.
    fn with_series<L, M, C>(&self, family: &Family<L, M, C>, labels: &L, f: impl FnOnce(&M))
    where
        L: Clone + std::hash::Hash + Eq,
        C: MetricConstructor<M>,
    {
        if family.get(labels).is_none() && !self.take_series_slot() {
            self.series_dropped.inc();
            return;
        }
        f(&family.get_or_create(labels));
    }

    /// One more series, if `metrics_max_series` allows it. Two threads creating the same
    /// new series may both take a slot: the cap errs on the low side.
    fn take_series_slot(&self) -> bool {
        let max = self.vocabulary.max_series;
        self.series
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                (n < max).then_some(n + 1)
            })
            .is_ok()
    }

    fn class_tenant(&self, class: &str, tenant: &str) -> ClassTenant {
        ClassTenant {
            class: Value::of(self.vocabulary.class(class)),
            tenant: Value::of(self.vocabulary.tenant(tenant)),
        }
    }

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
        let ct = self.class_tenant(class, tenant);
        let run = RunLabels {
            class: ct.class.clone(),
            tenant: ct.tenant.clone(),
            result: Value::of(report.status.as_str()),
        };
        self.with_series(&self.runs, &run, bump);
        if let Some(start) = start {
            self.with_series(&self.start_latency, &ct, |h| h.observe(start));
        }
        if let Some(wall) = wall {
            self.with_series(&self.wall_time, &ct, |h| h.observe(wall));
        }
        if let Some(limit) = report.limit_fired {
            if limit == Ceiling::WallTime {
                self.with_series(&self.deadline_kills, &ct, bump);
            }
            let ceiling = CeilingLabels {
                class: ct.class.clone(),
                tenant: ct.tenant.clone(),
                limit: Value::of(limit.as_str()),
            };
            self.with_series(&self.ceilings, &ceiling, bump);
        }
        if !report.cleanup.ok {
            self.with_series(&self.cleanup_failures, &ct, bump);
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
        let ct = self.class_tenant(class, tenant);
        let labels = ReasonLabels {
            class: ct.class,
            tenant: ct.tenant,
            reason: Value::of(reason_label(reason)),
        };
        self.with_series(&self.denials, &labels, bump);
    }

    /// The OpenMetrics exposition (ending `# EOF`), with the gauges read now; `sessions`
    /// is the count of open sessions by tenant.
    pub fn render(
        &self,
        engine: &Engine,
        pools: &BTreeMap<String, airlock_engine::PlanShape>,
        sessions: &BTreeMap<String, i64>,
    ) -> String {
        let status = engine.pool_status();
        for (name, shape) in pools {
            let pool = status.iter().find(|p| &p.shape == shape);
            let labels = PoolLabels {
                pool: Value::of(name),
            };
            self.pool_size
                .get_or_create(&labels)
                .set(pool.map_or(0, |p| p.size as i64));
            self.pool_free
                .get_or_create(&labels)
                .set(pool.map_or(0, |p| p.parked as i64));
        }
        self.set_sessions_active(sessions);
        self.cells_alive.set(engine.live_cells() as i64);
        self.mirror_lost_finishes(airlock_store::spool::lost_finishes());
        self.encode()
    }

    /// Raises the lost-finishes counter to the store's count (which only grows).
    fn mirror_lost_finishes(&self, lost: u64) {
        let shown = self.finishes_lost.get();
        if lost > shown {
            self.finishes_lost.inc_by(lost - shown);
        }
    }

    /// Every tenant of the configuration, 0 when it has no session open.
    fn set_sessions_active(&self, sessions: &BTreeMap<String, i64>) {
        let mut open: BTreeMap<&str, i64> = self
            .vocabulary
            .tenants
            .iter()
            .map(|t| (t.as_str(), 0))
            .collect();
        for (tenant, n) in sessions {
            *open.entry(self.vocabulary.tenant(tenant)).or_default() += n;
        }
        for (tenant, n) in open {
            self.sessions_active
                .get_or_create(&TenantLabels {
                    tenant: Value::of(tenant),
                })
                .set(n);
        }
    }

    /// The OpenMetrics text; a family with no series yet (prometheus-client leaves it
    /// out) is still described, so every family is there from the start.
    fn encode(&self) -> String {
        let mut text = String::new();
        let _ = prometheus_client::encoding::text::encode(&mut text, &self.registry);
        let mut described = String::new();
        for (name, kind, help) in FAMILIES {
            if !text.contains(&format!("# TYPE airlock_{name} {kind}\n")) {
                let _ = writeln!(
                    described,
                    "# HELP airlock_{name} {help}.\n# TYPE airlock_{name} {kind}"
                );
            }
        }
        let eof = text.rfind("# EOF").unwrap_or(text.len());
        text.insert_str(eof, &described);
        text
    }
}

fn bump(counter: &Counter) {
    counter.inc();
}

#[cfg(test)]
mod tests {
    use super::*;
    use airlock_cell::report::ResultClass;

    fn vocabulary(max_series: usize) -> Vocabulary {
        Vocabulary {
            classes: ["small".to_string()].into(),
            tenants: ["alice".to_string(), "bob".to_string()].into(),
            max_series,
        }
    }

    fn refused() -> RunReport {
        RunReport::refused("r", ResultClass::TaskError, "x".into())
    }

    #[test]
    fn a_run_is_counted_by_class_tenant_result_ceiling_and_cleanup() {
        let metrics = Metrics::new(vocabulary(1000));
        let mut report = refused();
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
            // Before anything happened to them: 0, not absent.
            r#"airlock_cleanup_failures_total{class="small",tenant="bob"} 0"#,
            r#"airlock_cleanup_failures_total{class="unknown",tenant="bob"} 0"#,
            r#"airlock_sessions_active{tenant="bob"} 0"#,
        ] {
            assert!(text.contains(line), "{line} missing from\n{text}");
        }
    }

    #[test]
    fn a_class_or_tenant_the_configuration_does_not_name_is_unknown() {
        let metrics = Metrics::new(vocabulary(1000));
        let forged = "x\",tenant=\"bob\"} 99\nairlock_runs_total{class=\"y";
        metrics.observe(forged, "mallory", &refused(), (None, None));
        metrics.deny(forged, "alice", "a\"reason\n{a=\"b\"}");
        let text = metrics.encode();
        assert!(
            text.contains(
                r#"airlock_runs_total{class="unknown",tenant="unknown",result="task_error"} 1"#
            ),
            "{text}"
        );
        assert!(
            text.contains(
                r#"airlock_denials_total{class="unknown",tenant="alice",reason="other"} 1"#
            ),
            "{text}"
        );
        assert!(!text.contains("99"), "{text}");
    }

    #[test]
    fn label_values_are_escaped_as_the_formats_say() {
        assert_eq!(escape_label_value(r#"a\b"c"#), r#"a\\b\"c"#);
        assert_eq!(escape_label_value("a\nb}"), "a\\nb}");
        // The operator may name a class with any character: it is escaped, not trusted.
        let metrics = Metrics::new(Vocabulary {
            classes: ["we\"ird\n".to_string()].into(),
            tenants: ["alice".to_string()].into(),
            max_series: 100,
        });
        metrics.observe("we\"ird\n", "alice", &refused(), (None, None));
        let text = metrics.encode();
        assert!(
            text.contains(
                r#"airlock_runs_total{class="we\"ird\n",tenant="alice",result="task_error"} 1"#
            ),
            "{text}"
        );
    }

    #[test]
    fn reason_codes_are_kept_and_anything_else_is_other() {
        assert_eq!(
            reason_label("quota.runs_per_minute"),
            "quota.runs_per_minute"
        );
        assert_eq!(reason_label("egress.not-allowed"), "egress.not-allowed");
        assert_eq!(reason_label(""), OTHER_REASON);
        assert_eq!(reason_label("Quota"), OTHER_REASON);
        assert_eq!(reason_label(&"a".repeat(65)), OTHER_REASON);
    }

    #[test]
    fn series_beyond_the_cap_are_dropped_and_counted() {
        // 2 classes (small, unknown) x 2 tenants x 2 families of zeros = 8 series.
        let metrics = Metrics::new(vocabulary(10));
        metrics.observe("small", "alice", &refused(), (None, None));
        metrics.observe("small", "bob", &refused(), (None, None));
        metrics.observe("unknown", "bob", &refused(), (None, None));
        metrics.observe("small", "alice", &refused(), (None, None));
        let text = metrics.encode();
        assert!(text
            .contains(r#"airlock_runs_total{class="small",tenant="alice",result="task_error"} 2"#));
        assert!(text
            .contains(r#"airlock_runs_total{class="small",tenant="bob",result="task_error"} 1"#));
        assert!(
            !text.contains(r#"airlock_runs_total{class="unknown""#),
            "{text}"
        );
        assert!(
            text.contains("airlock_metrics_series_dropped_total 1"),
            "{text}"
        );
    }

    #[test]
    fn accept_chooses_the_format() {
        assert_eq!(Format::negotiate(None), Format::Text004);
        assert_eq!(Format::negotiate(Some("*/*")), Format::Text004);
        assert_eq!(Format::negotiate(Some("text/plain")), Format::Text004);
        assert_eq!(
            Format::negotiate(Some("application/openmetrics-text")),
            Format::OpenMetrics
        );
        // What Prometheus 2.x sends.
        let prometheus = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;\
            version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
        assert_eq!(Format::negotiate(Some(prometheus)), Format::OpenMetrics);
        assert_eq!(
            Format::negotiate(Some("text/plain;q=1, application/openmetrics-text;q=0.5")),
            Format::Text004
        );
        assert_eq!(
            Format::negotiate(Some("application/openmetrics-text;q=0")),
            Format::Text004
        );
    }

    #[test]
    fn lost_finishes_are_shown_as_the_store_counts_them() {
        let metrics = Metrics::new(vocabulary(100));
        let text = metrics.encode();
        assert!(
            text.contains("\nairlock_store_finishes_lost_total 0\n"),
            "{text}"
        );
        metrics.mirror_lost_finishes(3);
        metrics.mirror_lost_finishes(3);
        metrics.mirror_lost_finishes(2);
        let text = metrics.encode();
        assert!(
            text.contains("\nairlock_store_finishes_lost_total 3\n"),
            "{text}"
        );
    }

    #[test]
    fn text_004_names_a_counter_family_by_its_samples_and_has_no_eof() {
        let metrics = Metrics::new(vocabulary(100));
        metrics.observe("small", "alice", &refused(), (Some(0.1), None));
        let text = Format::Text004.express(&metrics.encode());
        assert!(
            text.contains("# HELP airlock_runs_total Runs and"),
            "{text}"
        );
        assert!(
            text.contains("# TYPE airlock_runs_total counter\n"),
            "{text}"
        );
        assert!(text.contains("# TYPE airlock_start_latency_seconds histogram\n"));
        assert!(text.contains("# TYPE airlock_cells_alive gauge\n"));
        assert!(!text.contains("# EOF"));
        assert!(!text.contains("# UNIT"));
        // A family with no series yet is described all the same.
        assert!(text.contains("# HELP airlock_denials_total Denials by reason code"));
        assert!(text.contains("# TYPE airlock_pool_free gauge\n"));
        let om = Format::OpenMetrics.express(&metrics.encode());
        assert!(om.contains("# TYPE airlock_runs counter\n") && om.ends_with("# EOF\n"));
    }
}
