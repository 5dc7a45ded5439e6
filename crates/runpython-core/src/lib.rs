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
//! Why this file is long: it is the façade, `RunPython` with every public method it has (STYLE
//! wants them in one file) and the crate's re-exports; the features it calls live in their modules.
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

mod builder;
mod child;
mod dispatch;
mod doctor;
mod durable;
mod error;
mod policy;
mod protocol;
mod run;
mod session;
mod tools;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use runpython_bridge::BridgeConfig;
use runpython_deps::Interpreter;
use serde_json::Value;
use tokio::sync::{mpsc, oneshot};

use crate::child::{Pool, Templates};
use crate::durable::persist::Keeping;
use crate::run::deps::Deps;
use crate::tools::nested::{NestEngine, Nesting};

// ---- The engine: build one, run code, sessions, what it reports ----
pub use builder::RunPythonBuilder;
pub use doctor::Doctor;
pub use error::Error;
pub use session::route::Session;
pub use session::SessionConfig;

// ---- What goes in and out: requests, limits, events, the envelope ----
pub use protocol::envelope::{
    BridgeReport, Dependencies, Dependency, DisplayImage, Envelope, ErrorInfo, Isolation,
    LimitReport, ListTruncation, RefusedDependency, RestoreReport, RlimitReport, Status,
    StreamTruncation, Truncated,
};
pub use protocol::request::{
    parse_size, Event, FileSource, Limits, RunRequest, MAX_INLINE_FILE, RUN_PYTHON_TOOL,
};

/// runpython's tagged JSON codec (Python source, standard library only): exact Python values
/// (tuples, sets, dates with their zones, bytes, Decimal, dataclasses...) as JSON, both ways. The
/// child uses it for [`RunRequest::typed`] requests; the Python package builds it into itself for the
/// host's side, so both ends share one encoding.
pub const VALUES_PY: &str = child::code_dir::VALUES_PY;

// ---- What a model is told: tool definitions per provider, and their calls ----
pub use protocol::tool_spec::{
    ToolDefinition, ToolFormat, CLOSE_SESSION_TOOL, GET_RUN_ARTIFACT_TOOL, RESUME_TOOL,
};

// ---- Tools the code calls ----
/// What an implementer of a [`Tool`] needs: the trait, its arguments and errors, and closures as tools.
pub use runpython_bridge::{python_stubs, tool_fn, BoxFuture, Tool, ToolArgs, ToolError, ToolSet};
pub use tools::command_tool::{CommandTool, CALL_ID_ENV};
#[cfg(feature = "mcp")]
pub use tools::mcp_tools::{McpServer, CALL_ID_META};

// ---- Interpreters ahead of runs: the pool and templates ----
pub use child::{PoolConfig, TemplateStatus};

// ---- Durable runs ----
pub use durable::resume::{resumable_runs, ResumableRun, ResumableState};

// ---- The sandbox and the network a run gets ----
pub use runpython_egress::Error as EgressError;
pub use runpython_egress::{
    HostPattern, Network, NetworkPolicy, NetworkReport, Refusal, Sandbox, Secret,
};
pub use runpython_sandbox::Error as SandboxError;
pub use runpython_sandbox::{
    code_identity, runtime_dir, settle_cleanup, CollectLimits, KernelReport,
};

// ---- Dependencies ----
/// What an implementer of an [`EnvProvider`] (an installer) needs (its `BoxFuture` is the same type).
pub use runpython_deps::{
    EnvProvider, InstallJob, InstallPolicy, PipProvider, Progress as DepsProgress, ProgressFn,
    SourceBuilds, UvProvider,
};

// ---- The store ----
/// The store's errors, as [`Error::Store`] carries them.
pub use runpython_store::Error as StoreError;
/// The store, its records and its backends (`object_store` re-exported for [`Store::with_backend`]).
pub use runpython_store::{
    default_local_url, error_report, object_store, Artifact, ArtifactKind, Listing,
    RunRecord as StoreRunRecord, Store, StoreOptions, Tier,
};

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

/// A new id for a run record that holds a file put in the store (`runpython artifacts put`): sortable
/// and unique like a run's.
pub fn new_put_id() -> String {
    protocol::request::new_run_id()
}

// ---- The façade: the engine and every public method it has ----

/// Runs LLM-authored Python in an isolated CPython subprocess and returns an [`Envelope`].
///
/// Cheap to clone; clones share the discovered interpreter.
#[derive(Debug, Clone)]
pub struct RunPython {
    pub(crate) inner: Arc<Inner>,
}

#[derive(Debug, Clone)]
pub(crate) struct Inner {
    pub(crate) limits: Limits,
    pub(crate) env_passthrough: Vec<String>,
    pub(crate) python: Option<PathBuf>,
    pub(crate) tools: ToolSet,
    pub(crate) bridge: BridgeConfig,
    pub(crate) keep: Option<Keeping>,
    pub(crate) deps: Deps,
    pub(crate) durable: bool,
    pub(crate) sandbox: Sandbox,
    pub(crate) pool: Option<Arc<Pool>>,
    pub(crate) templates: Option<Arc<Templates>>,
    /// Shared by every engine derived from this one (tenants, quotas): discovered once.
    pub(crate) interpreter: Arc<tokio::sync::OnceCell<Interpreter>>,
    pub(crate) nesting: Option<Nesting>,
    pub(crate) sessions: Arc<crate::session::Registry>,
    /// The tenant this engine's runs belong to (`None`: the default tenant). Its store is the
    /// tenant's, and its sessions are the tenant's.
    pub(crate) tenant: Option<String>,
    /// Bytes the tenant may keep in the store; over them, runs run and are not kept.
    pub(crate) quota: Option<u64>,
}

/// A run in progress: its events as they happen, cancellation, and the envelope at the end.
/// Dropping the handle stops the run and kills its processes.
#[derive(Debug)]
pub struct RunHandle {
    events: mpsc::Receiver<Event>,
    cancel: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<Result<Envelope, Error>>>,
}

impl RunHandle {
    /// The next event, or `None` once the run has ended and every event was delivered.
    pub async fn next_event(&mut self) -> Option<Event> {
        self.events.recv().await
    }

    /// Stops the run: its processes are killed and reaped, and [`RunHandle::wait`] returns
    /// [`Error::Cancelled`].
    pub fn cancel(&mut self) {
        if let Some(cancel) = self.cancel.take() {
            let _ = cancel.send(());
        }
    }

    /// Waits for the envelope. Events not yet read are discarded.
    pub async fn wait(mut self) -> Result<Envelope, Error> {
        self.events.close();
        let Some(task) = self.task.take() else {
            return Err(Error::Cancelled);
        };
        match task.await {
            Ok(result) => result,
            Err(e) if e.is_cancelled() => Err(Error::Cancelled),
            Err(e) => Err(Error::Internal(format!("the run's task failed: {e}"))),
        }
    }
}

impl Drop for RunHandle {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort(); // dropping the run's future kills its process group
        }
    }
}

impl RunPython {
    /// A builder with the default limits.
    pub fn builder() -> RunPythonBuilder {
        RunPythonBuilder::default()
    }

    /// The limits in force.
    pub fn limits(&self) -> &Limits {
        &self.inner.limits
    }

    /// The sandbox configuration.
    pub fn sandbox(&self) -> &Sandbox {
        &self.inner.sandbox
    }

    /// Which isolation layers runs get on this machine (probed once per process), without running
    /// anything. `Err` when the sandbox requires a layer that is missing.
    pub fn isolation_report(&self) -> Result<Isolation, Error> {
        let templates = self.inner.templates.as_ref().is_some_and(|t| t.eligible());
        let sandbox = &self.inner.sandbox;
        let mut report = runpython_sandbox::report(
            &sandbox.map_network(Network::mechanism),
            self.inner.limits.timeout,
            templates,
        )?;
        sandbox.network.describe(&mut report);
        Ok(Isolation {
            bridge: Some(self.bridge_report()),
            ..report
        })
    }

    /// The dependency policy: the installer, where it prepares environments, what installs may do.
    pub(crate) fn deps(&self) -> &crate::run::deps::Deps {
        &self.inner.deps
    }

    /// The bounds of a run's tool bridge, for the isolation report.
    pub(crate) fn bridge_report(&self) -> BridgeReport {
        BridgeReport {
            connections: 1,
            bytes_in_flight: self.inner.bridge.max_in_flight_bytes as u64,
            concurrent_calls: self.inner.bridge.max_concurrent_calls as u64,
        }
    }

    /// The templates this engine forks runs from (see [`crate::PoolConfig::templates`]), each with
    /// the memory it holds; empty when templates are off or none has started yet.
    pub async fn templates(&self) -> Vec<TemplateStatus> {
        match &self.inner.templates {
            Some(templates) => templates.status().await,
            None => Vec::new(),
        }
    }

    /// Prepares every warm environment declared with [`RunPythonBuilder::warm_environment`] now:
    /// installs what it needs (each step through `progress`, as [`Event::Dependencies`] would say it)
    /// and starts its template with its ready forks, so the first run within it is as fast as the
    /// next. Without it, the first run within a warm environment prepares it. `Err` when an install
    /// fails, or when templates are required (`RUNPYTHON_TEMPLATES=require`) and cannot be used; where
    /// the kernel rules templates out, runs within it take the fresh path.
    pub async fn warm_up(
        &self,
        progress: impl Fn(DepsProgress) + Send + Sync,
    ) -> Result<(), Error> {
        if !self.inner.deps.has_warm() {
            return Ok(());
        }
        let interpreter = self.interpreter().await?.clone();
        let envs = self
            .inner
            .deps
            .prepare_all_warm(&interpreter, &progress)
            .await?;
        if let Some(templates) = &self.inner.templates {
            for (env, warmth) in envs {
                let key = (env.interpreter.clone(), env.site_dir.clone());
                templates
                    .start_now(&key, &warmth, self.inner.limits.timeout)
                    .await?;
            }
        }
        Ok(())
    }

    /// Starts the template that runs without dependencies are forked from, with its ready forks,
    /// now rather than at the first such run, so that a server's first run is forked too. Does
    /// nothing where templates are off (or only for declared warm environments) or ruled out.
    pub async fn start_base_template(&self) -> Result<(), Error> {
        let Some(templates) = &self.inner.templates else {
            return Ok(());
        };
        let interpreter = self.interpreter().await?;
        let python = interpreter.executable.clone();
        crate::child::bytecode_in_place(&python, interpreter.version, crate::child::code_dir()?)
            .await;
        templates
            .start_base(&(python, None), self.inner.limits.timeout)
            .await
    }

    /// The tools exposed to the code.
    pub fn tools(&self) -> &ToolSet {
        &self.inner.tools
    }

    /// The tools the code sees, `run_python` included when nesting is allowed (for stubs and specs).
    pub(crate) fn exposed_tools(&self) -> ToolSet {
        crate::tools::nested::exposed_tools(&self.inner.tools, Arc::new(self.clone()))
    }

    /// This engine for tenant `name`: everything its runs keep (runs, artifacts, whole output
    /// streams, checkpoints, sessions and their parts, memo entries) belongs to the tenant, under
    /// its own prefix of the store ([`Store::tenant`]); every read by id (artifacts, `read_artifact`
    /// and `load_artifact` in the code, input artifacts, resume, session restore, memo lookups)
    /// finds only the tenant's own, so another tenant's id reads exactly like a missing one; session
    /// ids are the tenant's (two tenants choosing `"s"` get two sessions). Shares everything else
    /// (the interpreter pool, the templates, the live sessions' registry) with this engine. The
    /// engine without a tenant is the default tenant (the CLI's local use).
    pub fn tenant(&self, name: &str) -> Result<RunPython, Error> {
        if name.is_empty() {
            return Err(Error::InvalidInput(
                "a tenant's name cannot be empty".into(),
            ));
        }
        let mut inner = (*self.inner).clone();
        if let Some(keep) = &mut inner.keep {
            keep.store = keep.store.tenant(name)?;
        }
        inner.tenant = Some(name.to_owned());
        Ok(RunPython {
            inner: Arc::new(inner),
        })
    }

    /// The tenant this engine's runs belong to; `None` for the default tenant.
    pub fn tenant_name(&self) -> Option<&str> {
        self.inner.tenant.as_deref()
    }

    /// This engine with a quota on what its tenant keeps, held at every write of the tenant's store
    /// in this process ([`Store::set_quota`]: runs, resumes, session cells, their files and displays,
    /// checkpoints, memo entries): a write that would pass it is refused before it is made, so runs
    /// running at once cannot together pass it. A run started when the tenant is already over it
    /// still runs and is not kept; one whose outputs do not fit is kept as far as they fit (or not at
    /// all); either way its envelope says `kept: false` with why. Hosts sharing a store see each
    /// other's writes at their next count ([`runpython_store::QUOTA_RECOUNT`]).
    pub fn with_stored_bytes_quota(&self, bytes: u64) -> RunPython {
        let mut inner = (*self.inner).clone();
        inner.quota = Some(bytes);
        if let Some(keep) = &inner.keep {
            keep.store.set_quota(Some(bytes));
        }
        RunPython {
            inner: Arc::new(inner),
        }
    }

    /// When this engine's tenant is over its quota: how far (`tenant alice is over its stored-bytes
    /// quota (… of … bytes kept)`), or why its use cannot be counted.
    pub(crate) async fn over_quota(&self) -> Option<String> {
        let (Some(quota), Some(keep)) = (self.inner.quota, &self.inner.keep) else {
            return None;
        };
        let used = match keep
            .store
            .stored_bytes(runpython_store::QUOTA_RECOUNT)
            .await
        {
            Ok(used) => used,
            Err(e) => return Some(format!("the tenant's stored bytes cannot be counted: {e}")),
        };
        (used >= quota).then(|| {
            format!(
                "{} is over its stored-bytes quota ({used} of {quota} bytes kept)",
                self.inner
                    .tenant
                    .as_deref()
                    .map_or("the default tenant".to_owned(), |t| format!("tenant {t}"))
            )
        })
    }

    /// This engine without its store, for a run that is not to be kept.
    pub(crate) fn unkept(&self) -> RunPython {
        let mut inner = (*self.inner).clone();
        inner.keep = None;
        inner.durable = false;
        RunPython {
            inner: Arc::new(inner),
        }
    }

    /// The store runs are kept in, if any.
    pub fn store(&self) -> Option<&Store> {
        self.inner.keep.as_ref().map(|k| &k.store)
    }

    /// Runs the code to the end. What the code does (raise, time out, exit) is an `Ok` envelope with a
    /// status; `Err` means runpython itself failed. Dropping the future kills the run's processes.
    pub async fn run(&self, request: impl Into<RunRequest>) -> Result<Envelope, Error> {
        self.execute(request.into(), None, None).await
    }

    /// Starts the code and returns a handle streaming its events. Must be called inside a Tokio runtime.
    pub fn start(&self, request: impl Into<RunRequest>) -> RunHandle {
        self.start_in(request, |run| run)
    }

    /// Like [`RunPython::start`], with the run's future passed through `wrap` before it is spawned: to
    /// run it inside a task-local scope, for example, so that the tools it calls see the context of
    /// whoever started it (the Python package binds the caller's asyncio loop this way).
    pub fn start_in<F>(
        &self,
        request: impl Into<RunRequest>,
        wrap: impl FnOnce(BoxFuture<'static, Result<Envelope, Error>>) -> F,
    ) -> RunHandle
    where
        F: std::future::Future<Output = Result<Envelope, Error>> + Send + 'static,
    {
        let (tx, rx) = mpsc::channel(256);
        let (cancel_tx, cancel_rx) = oneshot::channel();
        let this = self.clone();
        let request = request.into();
        let run: BoxFuture<'static, Result<Envelope, Error>> =
            Box::pin(async move { this.execute(request, Some(tx), Some(cancel_rx)).await });
        let task = tokio::spawn(wrap(run));
        RunHandle {
            events: rx,
            cancel: Some(cancel_tx),
            task: Some(task),
        }
    }

    /// The interpreter runs use, discovered once.
    pub async fn interpreter(&self) -> Result<&Interpreter, Error> {
        self.inner
            .interpreter
            .get_or_try_init(|| async {
                let preferred = self.inner.python.clone();
                tokio::task::spawn_blocking(move || Interpreter::discover(preferred.as_deref()))
                    .await
                    .map_err(|e| Error::Internal(format!("interpreter discovery panicked: {e}")))?
                    .map_err(Error::from)
            })
            .await
    }

    /// Continues a suspended run (or one whose host died mid-run): the code runs again from the top
    /// under the same run id; calls the journal has as applied return their recorded results without
    /// running again, each suspended call returns its decision from `decisions` (by suspension id), and
    /// the code goes on live to its end or its next suspension.
    ///
    /// Errors: no store, an unknown run, a finished run, a decision for a suspension the run does not
    /// have, a tenant over its quota.
    pub async fn resume(
        &self,
        run_id: &str,
        decisions: HashMap<String, Value>,
    ) -> Result<Envelope, Error> {
        let started = Instant::now();
        let keep = self.inner.keep.as_ref().ok_or_else(|| {
            Error::Config("resume needs the store the run was kept in: call store()".into())
        })?;
        if let Some(over) = self.over_quota().await {
            // A resumed run journals its calls as it goes: without room it could not keep them.
            return Err(Error::QuotaExceeded(format!(
                "{over}: run {run_id} cannot be resumed until it has room (a resumed run keeps its \
                 journal as it goes); delete runs (`runpython gc`, `runpython artifacts`) or raise \
                 the quota (--max-stored-bytes-per-token)"
            )));
        }
        if let Some(session) = crate::durable::resume::session_of(&keep.store, run_id).await? {
            return crate::session::route::resume_cell(self, &session, run_id, decisions).await;
        }
        let (request, plan) =
            crate::durable::resume::load_for_resume(&keep.store, run_id, decisions).await?;
        let (envelope, _) = crate::run::execute::execute_attempt(
            self,
            &request,
            None,
            None,
            started,
            Some((run_id.to_owned(), plan)),
        )
        .await?;
        Ok(envelope)
    }

    /// The runs in this engine's store that can be resumed: suspended, or interrupted when their host
    /// stopped (see [`crate::resumable_runs`]).
    pub async fn resumable_runs(
        &self,
    ) -> Result<runpython_store::Listing<crate::ResumableRun>, Error> {
        let store = self
            .store()
            .ok_or_else(|| Error::Config("no store configured: runs are not kept".into()))?;
        crate::durable::resume::resumable_runs(store).await
    }

    /// The suspensions `run_id` waits on, from its checkpoint (none for a run whose host died mid-run);
    /// an error for a finished run.
    pub async fn pending_suspensions(&self, run_id: &str) -> Result<Vec<String>, Error> {
        let keep = self
            .inner
            .keep
            .as_ref()
            .ok_or_else(|| Error::Config("no store configured".into()))?;
        crate::durable::resume::pending_suspensions(&keep.store, run_id).await
    }

    /// The artifact `id` of a kept run (its bytes), from this engine's store.
    pub async fn get_run_artifact(&self, id: &str) -> Result<Vec<u8>, Error> {
        let store = self.artifact_store()?;
        match store.get_run_artifact(id).await {
            Ok(bytes) => Ok(bytes.to_vec()),
            Err(e) => Err(audited(store, id, e)),
        }
    }

    /// A slice of the artifact `id`: `length` bytes from `offset` (to its end without one), at most
    /// `max`, and the artifact's whole size. Costs the slice: the store is read by range.
    pub async fn get_run_artifact_range(
        &self,
        id: &str,
        offset: u64,
        length: Option<u64>,
        max: u64,
    ) -> Result<(Vec<u8>, u64), Error> {
        let store = self.artifact_store()?;
        match store.get_run_artifact_range(id, offset, length, max).await {
            Ok((bytes, total)) => Ok((bytes.to_vec(), total)),
            Err(e) => Err(audited(store, id, e)),
        }
    }

    /// A new session (its interpreter starts with its first cell).
    pub fn session(&self) -> Session {
        crate::session::route::session(self)
    }

    /// The session `id` (1-128 letters, digits, `-`, `_`, `.`, `:`): a new one if this engine and its
    /// store have never seen it, else the same one (restored from the store when its interpreter is
    /// gone).
    pub fn session_with_id(&self, id: impl Into<String>) -> Result<Session, Error> {
        crate::session::route::session_with_id(self, id)
    }

    /// The tools a model is given to drive this engine: `run_python` (its description lists the Python
    /// functions the code can call), `get_run_artifact` and `resume`.
    pub fn tool_definitions(&self) -> Vec<ToolDefinition> {
        crate::dispatch::tool_definitions(self)
    }

    /// [`RunPython::tool_definitions`] in `format`'s shape, as a JSON array.
    pub fn tool_spec(&self, format: ToolFormat) -> Value {
        crate::dispatch::tool_spec(self, format)
    }

    /// The [`RunRequest`] a `run_python` call with these arguments asks for, checked as
    /// [`RunPython::handle_tool_call`] checks them: for a server that starts the run itself
    /// ([`RunPython::start`]) to follow its events or cancel it.
    pub fn run_python_request(&self, input: &Value) -> Result<RunRequest, Error> {
        crate::protocol::tool_spec::run_python_request(input)
    }

    /// [`RunPython::handle_tool_call`] as tool-result content in `format`: the result's JSON as
    /// text, then each display image `run_python` handed back (within
    /// [`crate::Limits::max_image_bytes`]) as that API's image block, so an agent loop shows the
    /// model its charts with no code of its own. Anthropic: `tool_result` content (`text`, `image`
    /// with a base64 `source`); OpenAI: Responses API `function_call_output` output (`input_text`,
    /// `input_image` with a data URL); MCP: `text` and `image` (`data`, `mimeType`).
    pub async fn handle_tool_call_content(
        &self,
        name: &str,
        input: &Value,
        format: ToolFormat,
    ) -> Result<Value, Error> {
        crate::dispatch::handle_tool_call_content(self, name, input, format).await
    }

    /// Answers a model's call of one of [`RunPython::tool_definitions`]: `run_python` gives the
    /// envelope (whatever its status: that is the outcome), `get_run_artifact` a slice of the artifact.
    /// `resume` continues a suspended run with `decisions` (suspension id → decision). `Err` is for calls
    /// that cannot be served: bad arguments ([`Error::InvalidInput`]) or runpython's own failures.
    pub async fn handle_tool_call(&self, name: &str, input: &Value) -> Result<Value, Error> {
        crate::dispatch::handle_tool_call(self, name, input).await
    }

    /// What this host and this engine's configuration give runs, without running anything
    /// (`runpython doctor`).
    pub async fn doctor(&self) -> crate::Doctor {
        crate::doctor::doctor(self).await
    }

    fn artifact_store(&self) -> Result<&Store, Error> {
        self.store().ok_or_else(|| {
            Error::Config(
                "this RunPython keeps no runs: configure a store to read artifacts".into(),
            )
        })
    }
}

impl RunPython {
    /// Every request, from the façade: one over its tenant's quota runs unkept; a session's cell goes
    /// to its session, a run of its own to `run::execute`.
    async fn execute(
        &self,
        request: RunRequest,
        events: Option<mpsc::Sender<Event>>,
        cancel: Option<oneshot::Receiver<()>>,
    ) -> Result<Envelope, Error> {
        if let Some(over) = self.over_quota().await {
            // Over its tenant's quota: the run runs, and nothing of it is written.
            let mut envelope = Box::pin(self.unkept().route(request, events, cancel)).await?;
            let why = format!(
                "{over}: the run ran and was not kept; delete runs (`runpython gc`, `runpython \
                 artifacts`) or raise the quota (--max-stored-bytes-per-token)"
            );
            crate::run::execute::not_kept(&mut envelope, &why);
            return Ok(envelope);
        }
        self.route(request, events, cancel).await
    }

    async fn route(
        &self,
        request: RunRequest,
        events: Option<mpsc::Sender<Event>>,
        cancel: Option<oneshot::Receiver<()>>,
    ) -> Result<Envelope, Error> {
        match request.session.clone() {
            Some(id) => {
                if request.reset_session {
                    crate::session::route::reset_session(self, &id).await?;
                }
                crate::session::route::execute_cell(self, &id, request, events, cancel).await
            }
            None => crate::run::execute::execute(self, request, events, cancel).await,
        }
    }

    /// Whether runs journal their tool calls in the store (approval tools make an engine durable).
    pub(crate) fn is_durable(&self) -> bool {
        self.inner.durable
    }

    /// A copy of this engine whose runs stop after `timeout` (shorter than its own).
    pub(crate) fn with_timeout(&self, timeout: Duration) -> RunPython {
        let mut inner = (*self.inner).clone();
        inner.limits.timeout = timeout;
        RunPython {
            inner: Arc::new(inner),
        }
    }
}

impl NestEngine for RunPython {
    fn timeout(&self) -> Duration {
        self.inner.limits.timeout
    }

    fn max_tool_calls(&self) -> u32 {
        self.inner.bridge.max_calls
    }

    fn nesting(&self) -> Option<&Nesting> {
        self.inner.nesting.as_ref()
    }

    fn max_concurrent_calls(&self) -> usize {
        self.inner.bridge.max_concurrent_calls
    }

    fn memory_and_disk(&self) -> (u64, u64) {
        (
            self.inner.sandbox.run_memory_bytes,
            self.inner.sandbox.disk_bytes,
        )
    }

    fn deeper(
        &self,
        timeout: Duration,
        nesting: Nesting,
        memory_bytes: u64,
        disk_bytes: u64,
    ) -> Arc<dyn NestEngine> {
        let mut inner = (*self.inner).clone();
        inner.limits.timeout = timeout;
        inner.nesting = Some(nesting);
        inner.sandbox.run_memory_bytes = memory_bytes;
        // Without a cgroup each process's address space is the bound: the share, but never under
        // 1 GiB (libraries reserve address space they never touch).
        inner.sandbox.memory_bytes = inner.sandbox.memory_bytes.min(memory_bytes.max(1 << 30));
        inner.sandbox.disk_bytes = disk_bytes;
        // Pooled interpreters are prepared for this engine's limits; nested runs start fresh.
        inner.pool = None;
        inner.templates = None;
        Arc::new(RunPython {
            inner: Arc::new(inner),
        })
    }

    fn run(&self, request: RunRequest) -> BoxFuture<'static, Result<Envelope, Error>> {
        let this = self.clone();
        Box::pin(async move { this.execute(request, None, None).await })
    }

    fn resume(
        &self,
        run_id: String,
        decisions: HashMap<String, Value>,
    ) -> BoxFuture<'static, Result<Envelope, Error>> {
        let this = self.clone();
        Box::pin(async move { RunPython::resume(&this, &run_id, decisions).await })
    }
}

/// A failed read of artifact `id`: a miss is audited (another tenant's id?) in the background.
fn audited(store: &Store, id: &str, e: runpython_store::Error) -> Error {
    if matches!(e, runpython_store::Error::NotFound { .. }) {
        crate::policy::tenancy::audit_miss(
            store,
            runpython_store::Held::Artifact,
            id,
            "get_run_artifact",
        );
    }
    Error::Store(e)
}
