//! Request schemas: the workspace's offline schemas (crates/schema), compiled once when
//! the configuration loads.

pub use airlock_schema::{bounded, Schema};
