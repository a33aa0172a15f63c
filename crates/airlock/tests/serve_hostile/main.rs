//! `airlock serve` under hostile tenants (issue 33), through the real binary and real
//! clients: one test binary, one module per attack surface.

#[path = "../common/mod.rs"]
mod common;

use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

mod bad_input;
mod fifo;
mod lists;
mod metrics;
mod openapi;
mod store_outage;

/// The suites of this binary run in one process, in parallel by default. A test that
/// compares timings or drives a load (a tenant's p99 quiet and under attack, 32 clients
/// through a store outage, 30 maximal lists, schemathesis) holds this exclusively, so no
/// other test's cells are in its figures; every other test holds it shared.
static LOAD: RwLock<()> = RwLock::new(());

/// Held by a test that measures or loads the machine: no other test of this binary runs.
fn exclusive() -> RwLockWriteGuard<'static, ()> {
    LOAD.write().unwrap_or_else(|p| p.into_inner())
}

/// Held by every other test: they run together, never beside an exclusive one.
fn shared() -> RwLockReadGuard<'static, ()> {
    LOAD.read().unwrap_or_else(|p| p.into_inner())
}
