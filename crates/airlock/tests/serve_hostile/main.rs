//! `airlock serve` under hostile tenants (issue 33), through the real binary and real
//! clients: one test binary, one module per attack surface.

#[path = "../common/mod.rs"]
mod common;

mod bad_input;
mod fifo;
mod lists;
mod metrics;
mod openapi;
mod store_outage;
