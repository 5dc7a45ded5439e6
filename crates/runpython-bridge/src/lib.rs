//! runpython-bridge: the RPC between the host and the sandboxed child ("code mode").
//!
//! It owns the wire format (u32 big-endian length + JSON frames, a handshake carrying the protocol
//! version and a per-run token, requests with ids so concurrent calls share one connection), the
//! [`Tool`] trait and [`ToolSet`], the Python client module that runs in the child (`client.py`, stdlib
//! only, embedded as [`CLIENT_PY`]), and Python stub generation from JSON Schema for the model to read.
//!
//! It knows nothing of processes or storage, and depends on no other runpython crate. A run has one
//! connection: runpython-core makes a [`socket_pair`], serves the host's end with [`Bridge::new`], and
//! hands the other end to the child as an inherited descriptor named in [`Bridge::client_spec_fd`].
//! What one run can make the host hold is bounded ([`BridgeConfig`]): a frame's size, the calls served
//! at once, and the bytes of the frames of those calls.
//!
//! ```
//! use runpython_bridge::{python_stubs, tool_fn, ToolSet};
//! use serde_json::json;
//!
//! let mut tools = ToolSet::new();
//! tools.insert(tool_fn(
//!     "double",
//!     "Twice x.",
//!     Some(json!({"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]})),
//!     |args| async move { Ok(json!(args.get("x").and_then(|v| v.as_i64()).unwrap_or(0) * 2)) },
//! )).unwrap();
//! assert!(python_stubs(&tools).starts_with("def double(x: int) -> Any:"));
//! ```

mod calls;
mod config;
mod frame;
mod journal;
mod numbers;
mod server;
mod stubs;
mod tool;

use std::path::PathBuf;

pub use calls::{BridgeStats, CallBudget, JournalSink, ReplayPlan, SpillStore, Stop, Suspension};
pub use config::BridgeConfig;
pub use journal::{canonical_json, CallState, Journal, JournalEntry, Journaled, ARGS_KEPT};
pub use numbers::canonical_floats;
pub use server::{socket_pair, Bridge, ClientSpec, HostEnd};
pub use stubs::python_stubs;
pub use tool::{
    is_python_identifier, tool_fn, FnTool, Tool, ToolArgs, ToolClientSpec, ToolError, ToolSet,
};

/// A boxed, sendable future: what [`Tool::call`], [`Tool::resume`] and [`JournalSink::record`] return
/// (as `BoxFuture<'static, _>`). The same type as runpython-deps' `BoxFuture`: futures-util's.
pub use futures_util::future::BoxFuture;

/// Version of the wire protocol, sent in the handshake.
pub const PROTOCOL_VERSION: u32 = 1;

/// The child's side of the bridge (`client.py`), executed by the runner as `runpython_tools`.
pub const CLIENT_PY: &str = include_str!("client.py");

/// What can go wrong on the bridge itself (not in a tool: tool failures are [`ToolError`]s).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The socket could not be created.
    #[error("cannot listen on the bridge socket {path}: {source}")]
    Bind {
        /// Socket path.
        path: PathBuf,
        /// Cause.
        source: std::io::Error,
    },
    /// A frame announced more bytes than the cap.
    #[error("a {len}-byte frame is over the bridge's limit of {max} bytes")]
    FrameTooLarge {
        /// Announced length.
        len: usize,
        /// The cap.
        max: usize,
    },
    /// A frame that is not valid protocol.
    #[error("malformed bridge frame: {0}")]
    Malformed(String),
    /// A tool could not be registered.
    #[error("tool {name:?} cannot be registered: {reason}")]
    InvalidTool {
        /// Tool name.
        name: String,
        /// Why.
        reason: String,
    },
    /// The socket pair could not be made or set up.
    #[error("cannot create the bridge's socket pair: {0}")]
    SocketPair(std::io::Error),
    /// Socket I/O failed.
    #[error("bridge I/O: {0}")]
    Io(std::io::Error),
}
