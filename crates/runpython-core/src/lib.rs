//! runpython-core: the engine that runs LLM-authored Python and returns a compact JSON envelope.
//!
//! It composes the leaves — interpreter discovery from `runpython-deps`, the tool bridge from
//! `runpython-bridge`, each run's network from `runpython-egress` (served with the engine's policy
//! from the descriptors `runpython-sandbox` hands out) — and owns the rest of a run: the [`RunPython`] builder (limits, environment
//! policy, tools), spawning the child (a fresh private run directory as its cwd, a scrubbed environment,
//! its own process group killed when the run ends however it ends), the runner (`child/python/runpython_runner.py` and its sibling modules, embedded),
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

mod budget;
mod child;
mod deps;
mod doctor;
mod durable;
mod engine;
mod error;
mod policy;
mod request;
mod result;
mod session;
mod tools;

pub use child::{PoolConfig, TemplateStatus};
pub use doctor::Doctor;
pub use durable::resume::{resumable_runs, ResumableRun, ResumableState};
pub use engine::{RunHandle, RunPython, RunPythonBuilder, Session};
pub use error::Error;
pub use request::{
    parse_size, Event, FileSource, Limits, RunRequest, MAX_INLINE_FILE, RUN_PYTHON_TOOL,
};
pub use result::envelope::{
    BridgeReport, Dependencies, Dependency, DisplayImage, Envelope, ErrorInfo, Isolation,
    LimitReport, ListTruncation, RefusedDependency, RlimitReport, Status, StreamTruncation,
    Truncated,
};
pub use runpython_egress::Error as EgressError;
pub use runpython_egress::{
    HostPattern, Network, NetworkPolicy, NetworkReport, Refusal, Sandbox, Secret,
};
pub use runpython_sandbox::Error as SandboxError;
pub use runpython_sandbox::KernelReport;
pub use session::SessionConfig;
pub use tools::command_tool::{CommandTool, CALL_ID_ENV};
#[cfg(feature = "mcp")]
pub use tools::mcp_tools::{McpServer, CALL_ID_META};

/// The README's Rust examples, compiled as doctests (`cargo xtask docs` runs its other blocks).
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
struct ReadmeExamples;

/// `docs/library.md`'s examples, compiled as doctests.
#[cfg(doctest)]
#[doc = include_str!("../../../docs/library.md")]
struct LibraryDocExamples;

/// `docs/sessions.md`'s examples, compiled as doctests.
#[cfg(doctest)]
#[doc = include_str!("../../../docs/sessions.md")]
struct SessionsDocExamples;

/// runpython's tagged JSON codec (Python source, standard library only): exact Python values
/// (tuples, sets, dates with their zones, bytes, Decimal, dataclasses...) as JSON, both ways. The
/// child uses it for [`RunRequest::typed`] requests; the Python package builds it into itself for the
/// host's side, so both ends share one encoding.
pub const VALUES_PY: &str = child::code_dir::VALUES_PY;
pub use engine::tool_spec::{
    ToolDefinition, ToolFormat, CLOSE_SESSION_TOOL, GET_RUN_ARTIFACT_TOOL, RESUME_TOOL,
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
