//! The tool side of a run: what the code can call besides its own Python. Commands as tools
//! (`command_tool`) and their supervisor, MCP servers' tools (`mcp_tools`), the host's hidden
//! artifact tools and nested runs (`nested`).

pub(crate) mod artifact_tools;
pub(crate) mod command_tool;
#[cfg(feature = "mcp")]
pub(crate) mod mcp_tools;
pub(crate) mod nested;
pub(crate) mod tool_supervisor;
