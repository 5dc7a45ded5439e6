//! runpython-core: the engine that runs LLM-authored Python and returns a compact JSON envelope.
//!
//! It composes the leaves — interpreter discovery from `runpython-deps`, the tool bridge from
//! `runpython-bridge` — and owns the rest of a run: the [`RunPython`] builder (limits, environment
//! policy, tools), spawning the child (a fresh private run directory as its cwd, a scrubbed environment,
//! its own process group killed when the run ends however it ends), the runner (`runner.py`, embedded as
//! [`RUNNER_PY`]), bounded output capture, and the [`Envelope`]. It is the only crate that spawns the
//! sandboxed child; it never prints.
//!
//! What the code does — raise, time out, exit, print forever — is an `Ok(Envelope)` with a status;
//! `Err` means runpython's own machinery failed.
//!
//! ```no_run
//! # async fn demo() -> Result<(), runpython_core::Error> {
//! use runpython_core::{RunPython, RunRequest, Status};
//! use serde_json::json;
//!
//! let python = RunPython::builder().timeout(std::time::Duration::from_secs(5)).build()?;
//! let envelope = python.run(RunRequest::new("x * 2").input("x", json!(21))).await?;
//! assert_eq!(envelope.status, Status::Success);
//! assert_eq!(envelope.return_value, json!(42));
//! # Ok(()) }
//! ```

mod artifact_tools;
mod budget;
mod command_tool;
mod deps;
mod envelope;
mod hitl;
mod keep;
#[cfg(feature = "mcp")]
mod mcp_tools;
mod nested;
mod output;
mod pool;
mod process;
mod run;
mod sandbox;
mod tool_spec;

pub use command_tool::CommandTool;
pub use envelope::{Envelope, ErrorInfo, ListTruncation, Status, StreamTruncation, Truncated};
#[cfg(feature = "mcp")]
pub use mcp_tools::McpServer;
pub use output::{Captured, HeadTail};
pub use pool::PoolConfig;
pub use process::ENV_ALLOWLIST;
pub use run::{Event, Limits, RunHandle, RunPython, RunPythonBuilder, RunRequest, RUNNER_PY};
pub use runpython_bridge::{python_stubs, tool_fn, Tool, ToolArgs, ToolError, ToolSet};
pub use runpython_deps::{EnvProvider, PipProvider, Progress as DepsProgress, UvProvider};
pub use runpython_store::{
    default_local_url, object_store, Artifact, ArtifactKind, CollectLimits, Listing, Store,
    StoreOptions, Tier,
};
pub use sandbox::{Isolation, RlimitReport, Sandbox};
pub use tool_spec::{
    ToolDefinition, ToolFormat, GET_RUN_ARTIFACT_TOOL, RESUME_TOOL, RUN_PYTHON_TOOL,
};

/// runpython's own failures. What the user's code does is never an `Error`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// No usable interpreter.
    #[error(transparent)]
    Interpreter(#[from] runpython_deps::Error),
    /// The child could not be started.
    #[error("cannot start {program}: {source}")]
    Spawn {
        /// The interpreter.
        program: std::path::PathBuf,
        /// Cause.
        source: std::io::Error,
    },
    /// A system call on the host failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// Cause.
        source: std::io::Error,
    },
    /// The store failed (opening it, keeping a run, reading an artifact, memo entries).
    #[error(transparent)]
    Store(#[from] runpython_store::Error),
    /// The tool bridge could not be set up.
    #[error(transparent)]
    Bridge(#[from] runpython_bridge::Error),
    /// The builder's settings are inconsistent.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// The request is malformed (for example an input name that is not an identifier).
    #[error("invalid request: {0}")]
    InvalidInput(String),
    /// An MCP server used for tools failed (starting it, the handshake, listing its tools).
    #[error("MCP server `{command}`: {message}")]
    Mcp {
        /// The command that starts the server.
        command: String,
        /// What went wrong.
        message: String,
    },
    /// The run was cancelled through its handle.
    #[error("the run was cancelled")]
    Cancelled,
    /// The sandbox requires an isolation layer this machine does not provide.
    #[error("isolation required but unavailable: {0}; run where the kernel allows it, or stop requiring it")]
    IsolationUnavailable(String),
    /// A bug in runpython.
    #[error("internal error: {0}")]
    Internal(String),
}

impl Error {
    /// A stable, machine-readable name for the kind of failure, for protocols that carry a code beside
    /// the message: `invalid_input` (the caller can fix the request), `not_found` (no such run or
    /// artifact in the store), `config`, `cancelled`, or one of runpython's own failures
    /// (`interpreter`, `spawn`, `io`, `store`, `bridge`, `mcp_server`, `isolation_unavailable`,
    /// `internal`).
    pub fn code(&self) -> &'static str {
        match self {
            Self::Interpreter(_) => "interpreter",
            Self::Spawn { .. } => "spawn",
            Self::Io { .. } => "io",
            Self::Store(runpython_store::Error::NotFound { .. }) => "not_found",
            Self::Store(runpython_store::Error::InvalidId { .. }) => "invalid_input",
            Self::Store(_) => "store",
            Self::Bridge(_) => "bridge",
            Self::Config(_) => "config",
            Self::InvalidInput(_) => "invalid_input",
            Self::Mcp { .. } => "mcp_server",
            Self::Cancelled => "cancelled",
            Self::IsolationUnavailable(_) => "isolation_unavailable",
            Self::Internal(_) => "internal",
        }
    }
}
