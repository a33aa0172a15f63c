//! The tools' JSON Schemas: the workspace's offline schemas (crates/schema).

pub use airlock_schema::{bounded, first_remote_ref, Schema, Violation};
