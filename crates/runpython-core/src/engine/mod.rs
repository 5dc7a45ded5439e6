//! The engine: [`RunPython`] and its [`RunHandle`]. `execute` runs one request end to end (validate →
//! memo → attempt → checkpoint → keep → budget); `attempt` drives one child from its slot to a raw
//! outcome; `tools` is the tool set one run serves.

mod attempt;
mod builder;
mod cell;
mod execute;
mod session;
pub(crate) mod tool_spec;
mod tools;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use runpython_bridge::{BoxFuture, BridgeConfig, ToolSet};
use runpython_deps::Interpreter;
use runpython_store::Store;
use serde_json::Value;
use tokio::sync::{mpsc, oneshot};

pub use builder::RunPythonBuilder;
pub use session::Session;

use crate::child::{Pool, TemplateStatus, Templates};
use crate::deps::Deps;
use crate::durable::persist::Keeping;
use crate::error::Error;
use crate::request::{Event, Limits, RunRequest};
use crate::result::envelope::{BridgeReport, Envelope, Isolation};
use crate::tools::nested::{NestEngine, Nesting};
use runpython_egress::{Network, Sandbox};

/// Runs LLM-authored Python in an isolated CPython subprocess and returns an [`Envelope`].
///
/// Cheap to clone; clones share the discovered interpreter.
#[derive(Debug, Clone)]
pub struct RunPython {
    inner: Arc<Inner>,
}

#[derive(Debug, Clone)]
struct Inner {
    limits: Limits,
    env_passthrough: Vec<String>,
    python: Option<PathBuf>,
    tools: ToolSet,
    bridge: BridgeConfig,
    keep: Option<Keeping>,
    deps: Deps,
    durable: bool,
    sandbox: Sandbox,
    pool: Option<Arc<Pool>>,
    templates: Option<Arc<Templates>>,
    /// Shared by every engine derived from this one (tenants, quotas): discovered once.
    interpreter: Arc<tokio::sync::OnceCell<Interpreter>>,
    nesting: Option<Nesting>,
    sessions: Arc<crate::session::Registry>,
    /// The tenant this engine's runs belong to (`None`: the default tenant). Its store is the
    /// tenant's, and its sessions are the tenant's.
    tenant: Option<String>,
    /// Bytes the tenant may keep in the store; over them, runs run and are not kept.
    quota: Option<u64>,
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
    pub(crate) fn deps(&self) -> &crate::deps::Deps {
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
            return self.resume_cell(&session, run_id, decisions).await;
        }
        let (request, plan) =
            crate::durable::resume::load_for_resume(&keep.store, run_id, decisions).await?;
        let (envelope, _) = self
            .execute_attempt(
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

    fn artifact_store(&self) -> Result<&Store, Error> {
        self.store().ok_or_else(|| {
            Error::Config(
                "this RunPython keeps no runs: configure a store to read artifacts".into(),
            )
        })
    }
}

impl RunPython {
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
