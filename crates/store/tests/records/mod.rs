//! The run records the store's test binaries write (tests/store.rs, tests/backends.rs).

use airlock_store::{RunEnd, RunStart};
use serde_json::json;

pub fn start(class: &str) -> RunStart {
    RunStart {
        argv: vec!["/bin/echo".into(), "hi".into()],
        input_sha256: "a".repeat(64),
        contract_sha256: "b".repeat(64),
        workload_class: class.into(),
        plan_json: json!({"net": "none"}),
        session_id: None,
        tenant: None,
    }
}

pub fn end(status: &str) -> RunEnd {
    RunEnd {
        status: status.into(),
        exit_code: Some(0),
        usage: json!({"cpu_usec": 1200, "memory_peak_bytes": 4096, "pids_peak": 1}),
        startup_ms: 2.5,
        wall_ms: 4.0,
        stdout_head: "hi\n".into(),
        cleanup_ok: true,
        cleanup_leftovers: json!([]),
        result_json: json!({"artifacts": []}),
        ..Default::default()
    }
}
