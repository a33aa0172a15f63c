//! airlock-agent: tools an agent can call. The operator's tool registry (`registry`),
//! JSON Schemas that never fetch anything (`schema`), the tool protocol (`protocol`:
//! validated input in, one validated JSON value out, the model's envelope), tool calls
//! run in cells through the engine (`call`, `exec`), generic tools bounded by a contract
//! (`generic`), the MCP server over stdio and streamable HTTP (`mcp`), and an
//! OpenAI-compatible agent loop (`agent`; Chat Completions in `openai`, the Responses API
//! in `responses`).
//!
//! Trust: the registry and its contracts come from the operator; tool input comes from
//! the model and tool output from the cell, both untrusted. What the model receives is
//! built here, never copied from stderr, host paths or secrets (docs/tools.md).

pub mod agent;
pub mod call;
mod error;
pub mod exec;
pub mod generic;
pub mod mcp;
pub mod openai;
pub mod protocol;
pub mod registry;
pub mod responses;
pub mod schema;
pub mod shell;

pub use call::{CallMeta, CallResult, PlannedCell, Planner, ToolBox};
pub use error::AgentError;
pub use protocol::{ErrorInfo, ToolReply};
pub use registry::{Registry, Tool, ToolSpec, ToolsConfig};
