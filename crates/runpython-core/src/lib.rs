//! runpython-core: the engine that runs LLM-authored Python and returns a compact JSON envelope.
//!
//! It composes the leaves — interpreter discovery from `runpython-deps`, the tool bridge from
//! `runpython-bridge` — and owns the rest of a run: the [`RunPython`] builder (limits, environment
//! policy, tools), spawning the child (a fresh private run directory as its cwd, a scrubbed environment,
//! its own process group killed when the run ends however it ends), the runner (`runner.py`, embedded),
//! bounded output capture, and the [`Envelope`]. It is the only crate that spawns the
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
mod child;
mod command_tool;
mod deps;
mod doctor;
mod engine;
mod env_vars;
mod envelope;
mod error;
#[cfg(feature = "mcp")]
mod mcp_tools;
mod nested;
mod network_tool;
mod outcome;
mod persist;
mod request;
mod resume;
mod secrets;
mod session;
mod tenancy;
mod tool_spec;
mod tool_supervisor;

pub use child::{PoolConfig, TemplateStatus};
pub use command_tool::{CommandTool, CALL_ID_ENV};
pub use doctor::Doctor;
pub use engine::{RunHandle, RunPython, RunPythonBuilder, Session};
pub use envelope::{
    BridgeReport, Dependencies, Dependency, DisplayImage, Envelope, ErrorInfo, Isolation,
    LimitReport, ListTruncation, RefusedDependency, RlimitReport, Status, StreamTruncation,
    Truncated,
};
pub use error::Error;
#[cfg(feature = "mcp")]
pub use mcp_tools::{McpServer, CALL_ID_META};
pub use request::{
    parse_size, Event, FileSource, Limits, RunRequest, MAX_INLINE_FILE, RUN_PYTHON_TOOL,
};
pub use resume::{resumable_runs, ResumableRun, ResumableState};
pub use runpython_sandbox::Error as SandboxError;
pub use runpython_sandbox::{
    HostPattern, KernelReport, Network, NetworkPolicy, NetworkReport, Refusal, Sandbox, Secret,
};
pub use session::SessionConfig;
pub use tool_spec::{
    ToolDefinition, ToolFormat, CLOSE_SESSION_TOOL, GET_RUN_ARTIFACT_TOOL, RESUME_TOOL,
    SESSION_ID_HEADER,
};

/// What an implementer of a [`Tool`] needs: the trait, its arguments and errors, and closures as tools.
pub use runpython_bridge::{python_stubs, tool_fn, BoxFuture, Tool, ToolArgs, ToolError, ToolSet};
/// What an implementer of an [`EnvProvider`] (an installer) needs (its `BoxFuture` is the same type).
pub use runpython_deps::{
    EnvProvider, InstallJob, InstallPolicy, PipProvider, Progress as DepsProgress, ProgressFn,
    SourceBuilds, UvProvider,
};
/// The store's errors, as [`Error::Store`] carries them.
pub use runpython_store::Error as StoreError;
/// The store, its records and its backends (`object_store` re-exported for [`Store::with_backend`]).
pub use runpython_store::{
    default_local_url, error_report, object_store, Artifact, ArtifactKind, CollectLimits, Listing,
    RunRecord as StoreRunRecord, Store, StoreOptions, Tier,
};

/// A new id for a run record that holds a file put in the store (`runpython artifacts put`): sortable
/// and unique like a run's.
pub fn new_put_id() -> String {
    request::new_run_id()
}
