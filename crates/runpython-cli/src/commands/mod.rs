//! One file per command: each takes its parsed arguments, builds what it needs through
//! `crate::settings`, prints through `crate::human` (or as JSON), and returns its exit status.

mod artifacts;
mod doctor;
mod gc;
mod host;
mod mcp;
mod repl;
mod resume;
mod run;
mod runs;
mod serve;
mod tool_spec;

pub(crate) use artifacts::artifacts;
pub(crate) use doctor::doctor;
pub(crate) use gc::gc;
pub(crate) use host::host;
pub(crate) use mcp::mcp;
pub(crate) use repl::repl;
pub(crate) use resume::resume;
pub(crate) use run::{hosted, run};
pub(crate) use runs::list as runs;
pub(crate) use serve::serve;
pub(crate) use tool_spec::tool_spec;
