//! `RunPython`: the builder, one run from code to envelope, and the event stream.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::future::BoxFuture;
use runpython_bridge::{Bridge, BridgeConfig, ReplayPlan, Stop, Tool, ToolSet};
use runpython_deps::Interpreter;
use serde_json::{Map, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot};

use crate::artifact_tools::{ReadArtifact, SaveArtifact};
use crate::deps::{Deps, DepsConfig};
use crate::envelope::{Envelope, ErrorInfo, Status, Truncated};
use crate::keep::{collect_run_files, Keeping};
use crate::nested::Nesting;
use crate::output::{Captured, HeadTail};
use crate::pool::{Pool, PoolConfig, PoolKey, Slot};
use crate::process::{child_env, code_dir, spawn_runner};
use crate::sandbox::{Isolation, Sandbox};
use crate::Error;
use runpython_deps::{EnvProvider, Progress as DepsProgress};
use runpython_store::{CollectLimits, Store, Tier};

/// The runner that executes the code in the child (`runner.py`).
pub const RUNNER_PY: &str = include_str!("runner.py");

/// How long the host keeps reading a child's pipes after the process group was killed. Only a process
/// that escaped the group (a `setsid` daemon) can hold them open that long.
const DRAIN_GRACE: Duration = Duration::from_secs(2);

/// Slack on top of `max_return_bytes` for the result record's own fields.
const RESULT_OVERHEAD: usize = 64 * 1024;

/// Limits and policy of a [`RunPython`].
#[derive(Debug, Clone)]
pub struct Limits {
    /// Wall-clock limit of one run (default 60 s).
    pub timeout: Duration,
    /// Longest code accepted, in characters, checked before anything is spawned (default 200,000).
    pub max_code_chars: usize,
    /// Largest return value, in bytes of JSON (default 1,000,000).
    pub max_return_bytes: usize,
    /// Characters kept per output stream, head and tail (default 10,000).
    pub max_output_chars: usize,
    /// Largest return value carried inline, in bytes of JSON (default 4 KiB); a larger one is
    /// replaced by a preview and kept whole as an artifact.
    pub inline_return_bytes: usize,
    /// Largest envelope, in bytes of JSON (default 8 KiB), met by shrinking output and previews.
    pub envelope_budget: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            timeout: Duration::from_secs(60),
            max_code_chars: 200_000,
            max_return_bytes: 1_000_000,
            max_output_chars: 10_000,
            inline_return_bytes: 4096,
            envelope_budget: 8192,
        }
    }
}

/// Something that happened during a run, delivered as it happens by [`RunHandle::next_event`].
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Event {
    /// A chunk the code wrote to stdout.
    Stdout(String),
    /// A chunk the code wrote to stderr.
    Stderr(String),
    /// A step of preparing the run's dependencies (before the code starts).
    Dependencies(DepsProgress),
}

/// One piece of code to run, with the globals it sees.
#[derive(Debug, Clone)]
pub struct RunRequest {
    /// The Python source.
    pub code: String,
    /// JSON values bound as globals before the code runs.
    pub inputs: Map<String, Value>,
    /// Globals bound to stored artifacts, by id: parsed as JSON or CSV where they can be, else bytes.
    pub input_artifacts: Vec<(String, String)>,
    /// Requirement specs for this run (`six==1.15.0`, `pkg[extra]>=2`, `name @ URL`), merged with the
    /// engine's defaults, the code's PEP 723 block and its detected imports.
    pub dependencies: Vec<String>,
    /// Whether a memoizing [`RunPython`] may serve this run from, and record it in, its memo cache.
    pub use_memo: bool,
}

impl RunRequest {
    /// A request for `code` with no inputs.
    pub fn new(code: impl Into<String>) -> Self {
        Self {
            code: code.into(),
            inputs: Map::new(),
            input_artifacts: Vec::new(),
            dependencies: Vec::new(),
            use_memo: true,
        }
    }

    /// Binds `name` to the stored artifact `id` (pass by reference: the data never goes through the
    /// model). Needs an engine with a store.
    pub fn input_artifact(mut self, name: impl Into<String>, id: impl Into<String>) -> Self {
        self.input_artifacts.push((name.into(), id.into()));
        self
    }

    /// Adds a requirement spec for this run.
    pub fn dependency(mut self, spec: impl Into<String>) -> Self {
        self.dependencies.push(spec.into());
        self
    }

    /// Neither serve this run from the memo cache nor record it there.
    pub fn no_memo(mut self) -> Self {
        self.use_memo = false;
        self
    }

    /// Binds `name` to `value` as a global.
    pub fn input(mut self, name: impl Into<String>, value: Value) -> Self {
        self.inputs.insert(name.into(), value);
        self
    }
}

impl From<&str> for RunRequest {
    fn from(code: &str) -> Self {
        Self::new(code)
    }
}

impl From<String> for RunRequest {
    fn from(code: String) -> Self {
        Self::new(code)
    }
}

/// Builds a [`RunPython`].
#[derive(Debug, Default)]
pub struct RunPythonBuilder {
    limits: Limits,
    env_passthrough: Vec<String>,
    python: Option<PathBuf>,
    tools: ToolSet,
    bridge: BridgeConfig,
    keep: Option<Keeping>,
    memo_ttl: Option<Duration>,
    deps: DepsConfig,
    durable: bool,
    sandbox: Sandbox,
    pool: PoolConfig,
    nested: Option<u32>,
    errors: Vec<String>,
}

impl RunPythonBuilder {
    /// Wall-clock limit of one run.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.limits.timeout = timeout;
        self
    }
    /// Longest code accepted, in characters.
    pub fn max_code_chars(mut self, n: usize) -> Self {
        self.limits.max_code_chars = n;
        self
    }
    /// Largest return value, in bytes of JSON.
    pub fn max_return_bytes(mut self, n: usize) -> Self {
        self.limits.max_return_bytes = n;
        self
    }
    /// Characters kept per output stream.
    pub fn max_output_chars(mut self, n: usize) -> Self {
        self.limits.max_output_chars = n;
        self
    }
    /// Largest return value carried inline in the envelope, in bytes of JSON.
    pub fn inline_return_bytes(mut self, n: usize) -> Self {
        self.limits.inline_return_bytes = n;
        self
    }
    /// Largest envelope, in bytes of JSON.
    pub fn envelope_budget(mut self, n: usize) -> Self {
        self.limits.envelope_budget = n;
        self
    }
    /// Lets the host's environment variable `name` through to the code (everything not on the
    /// allowlist is dropped otherwise).
    pub fn env_passthrough(mut self, name: impl Into<String>) -> Self {
        self.env_passthrough.push(name.into());
        self
    }
    /// The Python interpreter to use instead of discovering one.
    pub fn python(mut self, path: impl Into<PathBuf>) -> Self {
        self.python = Some(path.into());
        self
    }
    /// Exposes a tool to the code.
    pub fn tool(mut self, tool: impl Tool + 'static) -> Self {
        if let Err(e) = self.tools.insert(tool) {
            self.errors.push(e.to_string());
        }
        self
    }
    /// Exposes every tool of a set.
    pub fn tools(mut self, tools: &ToolSet) -> Self {
        for tool in tools.iter() {
            if let Err(e) = self.tools.insert_arc(Arc::clone(tool)) {
                self.errors.push(e.to_string());
            }
        }
        self
    }
    /// Tool calls allowed per run (default 1,000).
    pub fn max_tool_calls(mut self, n: u32) -> Self {
        self.bridge.max_calls = n;
        self
    }
    /// How long one tool call may take (default 60 s).
    pub fn tool_call_timeout(mut self, timeout: Duration) -> Self {
        self.bridge.call_timeout = timeout;
        self
    }
    /// Exposes a human-approval tool under `name` (e.g. `request_approval`): calling it suspends the run
    /// until [`RunPython::resume`] supplies the decision, which the call then returns. Needs a store.
    pub fn approval(mut self, name: impl Into<String>) -> Self {
        let name = name.into();
        self.durable = true;
        if let Err(e) = self.tools.insert(crate::hitl::ApprovalTool::new(name)) {
            self.errors.push(e.to_string());
        }
        self
    }
    /// Suspensions allowed over a run's life (default 10).
    pub fn max_suspensions(mut self, n: usize) -> Self {
        self.bridge.max_suspensions = n;
        self
    }
    /// Journals every tool call in the store before and after it runs, so a run whose host died can
    /// be resumed without repeating finished calls (on by default with an approval tool). Needs a store.
    pub fn durable(mut self, on: bool) -> Self {
        self.durable = on;
        self
    }
    /// Largest bridge frame either side may send (default 16 MiB).
    pub fn max_frame_bytes(mut self, n: usize) -> Self {
        self.bridge.max_frame = n;
        self
    }

    /// Keeps every run in `store` (script, output, return value, files the code wrote), in the
    /// ephemeral tier unless [`RunPythonBuilder::tier`] says otherwise. The envelope's `run_id` then
    /// names the kept run and `artifacts` lists what was kept.
    pub fn store(mut self, store: Store) -> Self {
        match &mut self.keep {
            Some(keep) => keep.store = store,
            None => self.keep = Some(Keeping::new(store)),
        }
        self
    }
    /// How long kept runs stay (default: ephemeral, 24 h).
    pub fn tier(mut self, tier: Tier) -> Self {
        if let Some(keep) = &mut self.keep {
            keep.tier = tier;
        } else {
            self.errors
                .push("tier() needs a store: call store() first".into());
        }
        self
    }
    /// Limits on the files kept from a run's directory.
    pub fn collect_limits(mut self, limits: CollectLimits) -> Self {
        if let Some(keep) = &mut self.keep {
            keep.collect = limits;
        } else {
            self.errors
                .push("collect_limits() needs a store: call store() first".into());
        }
        self
    }
    /// Memoizes successful runs that called no tools (or only pure ones) for `ttl`: the same code,
    /// inputs, interpreter, runner, tools and limits return the kept envelope with `cached: true` and
    /// spawn nothing. Without a store, memo entries live in a `memory://` store.
    pub fn memoize(mut self, ttl: Duration) -> Self {
        self.memo_ttl = Some(ttl);
        self
    }

    /// A requirement spec every run gets (merged with each run's own, its PEP 723 block and its imports).
    pub fn dependency(mut self, spec: impl Into<String>) -> Self {
        self.deps.defaults.push(spec.into());
        self
    }
    /// Whether imports detected in the code become dependencies (default: on). Off, only explicit specs
    /// and the PEP 723 block count.
    pub fn auto_deps(mut self, on: bool) -> Self {
        self.deps.auto = on;
        self
    }
    /// Where prepared environments live (default: `runpython/envs` under the user's cache directory).
    pub fn env_root(mut self, root: impl Into<PathBuf>) -> Self {
        self.deps.root = Some(root.into());
        self
    }
    /// The installer (default: uv when found, else venv + pip).
    pub fn env_provider(mut self, provider: Arc<dyn EnvProvider>) -> Self {
        self.deps.provider = Some(provider);
        self
    }
    /// How long preparing an environment may take (default 10 minutes).
    pub fn prepare_timeout(mut self, timeout: Duration) -> Self {
        self.deps.timeout = Some(timeout);
        self
    }
    /// The sandbox's layers and limits (default: every layer the kernel allows, network off).
    pub fn sandbox(mut self, sandbox: Sandbox) -> Self {
        self.sandbox = sandbox;
        self
    }
    /// The pool of interpreters started ahead of their runs (default: one per environment, kept two
    /// minutes; `size: 0` turns it off). See [`PoolConfig`].
    pub fn pool(mut self, pool: PoolConfig) -> Self {
        self.pool = pool;
        self
    }
    /// Shares the host's network with the code (default: an empty network namespace).
    pub fn allow_network(mut self, allow: bool) -> Self {
        self.sandbox.allow_network = allow;
        self
    }

    /// Lets the code call `run_python(code, dependencies=None, inputs=None)`, which runs more code in
    /// its own sandboxed child and returns that run's envelope as a dict, up to `depth` levels down.
    /// The inner run's timeout and tool calls come out of the outer run's remaining budget; a call
    /// from the deepest level raises `NestingLimit` in the code.
    pub fn allow_nested(mut self, depth: u32) -> Self {
        self.nested = Some(depth);
        self
    }

    /// Checks the configuration.
    pub fn build(self) -> Result<RunPython, Error> {
        let mut errors = self.errors;
        if self.limits.timeout.is_zero() {
            errors.push("the timeout must be longer than zero".into());
        }
        if self.limits.max_output_chars < 2 {
            errors.push("max_output_chars must be at least 2 (a head and a tail)".into());
        }
        if self.nested == Some(0) {
            errors.push("allow_nested needs a depth of at least 1".into());
        }
        if self.nested.is_some() && self.tools.get(crate::tool_spec::RUN_PYTHON_TOOL).is_some() {
            errors
                .push("a host tool named run_python clashes with allow_nested's run_python".into());
        }
        let mut keep = self.keep;
        if let Some(ttl) = self.memo_ttl {
            if keep.is_none() {
                keep = Some(Keeping::new(Store::open("memory://")?));
            }
            if let Some(keep) = &mut keep {
                keep.memo_ttl = Some(ttl);
            }
        }
        if self.durable && keep.is_none() {
            errors.push(
                "approval tools and durable runs need a store to keep their journal: call store() first"
                    .into(),
            );
        }
        if !errors.is_empty() {
            return Err(Error::Config(errors.join("; ")));
        }
        Ok(RunPython {
            inner: Arc::new(Inner {
                limits: self.limits,
                env_passthrough: self.env_passthrough,
                python: self.python,
                tools: self.tools,
                bridge: self.bridge,
                keep,
                deps: self.deps.build()?,
                durable: self.durable,
                sandbox: self.sandbox,
                pool: (self.pool.size > 0).then(|| Arc::new(Pool::new(self.pool))),
                interpreter: tokio::sync::OnceCell::new(),
                nesting: self.nested.map(Nesting::top),
            }),
        })
    }
}

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
    interpreter: tokio::sync::OnceCell<Interpreter>,
    nesting: Option<Nesting>,
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

enum Ending {
    Exited(std::process::ExitStatus),
    /// The runner wrote its result and closed its streams; the interpreter is still exiting.
    Answered,
    TimedOut,
    Cancelled,
    Bridge(Stop),
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
        crate::sandbox::report(&self.inner.sandbox, self.inner.limits.timeout)
    }

    /// The tools exposed to the code.
    pub fn tools(&self) -> &ToolSet {
        &self.inner.tools
    }

    /// The store runs are kept in, if any.
    pub fn store(&self) -> Option<&Store> {
        self.inner.keep.as_ref().map(|k| &k.store)
    }

    pub(crate) fn env_passthrough(&self) -> &[String] {
        &self.inner.env_passthrough
    }

    pub(crate) fn deps(&self) -> &Deps {
        &self.inner.deps
    }

    /// Starts an interpreter for a run: a private run directory, the sandbox plan, the child waiting
    /// for its request on stdin. `warm_up` are the runner's pre-request arguments (pooled interpreters).
    fn spawn_slot(
        &self,
        python: &std::path::Path,
        code_dir: &std::path::Path,
        site_dir: Option<&std::path::Path>,
        warm_up: &[String],
    ) -> Result<Slot, Error> {
        sweep_stale_run_dirs();
        let run_dir = tempfile::Builder::new()
            .prefix(&format!("{RUN_DIR_PREFIX}{}-", std::process::id()))
            .permissions(std::os::unix::fs::PermissionsExt::from_mode(0o700))
            .tempdir()
            .map_err(|source| Error::Io {
                what: "creating the run directory",
                source,
            })?;
        let work_dir = run_dir.path().join("work");
        std::fs::create_dir(&work_dir).map_err(|source| Error::Io {
            what: "creating the run's working directory",
            source,
        })?;
        // The prepared environment is read by the code: the sandbox must let it through.
        let env_reads: Vec<&std::path::Path> = site_dir.into_iter().collect();
        let plan = crate::sandbox::prepare(
            &self.inner.sandbox,
            python,
            code_dir,
            &env_reads,
            run_dir.path(),
            self.inner.limits.timeout,
        )?;
        let isolation = plan.report.clone();
        let env = child_env(&self.inner.env_passthrough);
        let spawned = spawn_runner(python, code_dir, warm_up, &work_dir, &env, plan)?;
        Ok(Slot {
            run_dir,
            work_dir,
            spawned,
            isolation,
            born: Instant::now(),
        })
    }

    /// A pooled interpreter for `key`: one that is ready, or (with `prestart`) one started now and
    /// waited for.
    async fn pooled(&self, key: &PoolKey) -> Option<Slot> {
        let pool = self.inner.pool.as_ref()?;
        if let Some(slot) = pool.take(key) {
            return Some(slot);
        }
        if !pool.config.prestart {
            return None;
        }
        self.refill_pool(key.clone());
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
            if let Some(slot) = pool.take(key) {
                return Some(slot);
            }
        }
        None
    }

    /// Starts replacements for pooled interpreters in the background (off the run's critical path).
    fn refill_pool(&self, key: PoolKey) {
        let Some(pool) = self.inner.pool.clone() else {
            return;
        };
        for _ in 0..pool.reserve(&key) {
            let this = self.clone();
            let pool = Arc::clone(&pool);
            let key = key.clone();
            tokio::spawn(async move {
                let mut warm_up = Vec::new();
                if let Some(site) = &key.1 {
                    warm_up.extend(["--site".to_owned(), site.display().to_string()]);
                }
                // `_ast` is what the runner needs first for any code (~1.4 ms to import); then the
                // modules the pool declares warm.
                let mut warm = vec!["_ast".to_owned()];
                warm.extend(pool.config.warm_imports.iter().cloned());
                warm_up.extend(["--warm".to_owned(), warm.join(",")]);
                let slot = code_dir()
                    .and_then(|dir| this.spawn_slot(&key.0, dir, key.1.as_deref(), &warm_up));
                // A pool that cannot start an interpreter just serves runs cold.
                let slot = slot.ok();
                pool.put(key, slot);
            });
        }
    }

    pub(crate) fn is_durable(&self) -> bool {
        self.inner.durable
    }

    pub(crate) fn keeping(&self) -> Option<&Keeping> {
        self.inner.keep.as_ref()
    }

    pub(crate) fn nesting(&self) -> Option<&Nesting> {
        self.inner.nesting.as_ref()
    }

    pub(crate) fn max_tool_calls(&self) -> u32 {
        self.inner.bridge.max_calls
    }

    /// A copy of this engine for a run nested in one of its runs.
    pub(crate) fn nested(&self, timeout: Duration, max_calls: u32, nesting: Nesting) -> RunPython {
        let mut inner = (*self.inner).clone();
        inner.limits.timeout = timeout;
        inner.bridge.max_calls = max_calls;
        inner.nesting = Some(nesting);
        inner.pool = None; // pooled interpreters are prepared for this engine's limits
        RunPython {
            inner: Arc::new(inner),
        }
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
        let run = Box::pin(async move { this.execute(request, Some(tx), Some(cancel_rx)).await });
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

    async fn execute(
        &self,
        request: RunRequest,
        events: Option<mpsc::Sender<Event>>,
        cancel: Option<oneshot::Receiver<()>>,
    ) -> Result<Envelope, Error> {
        let started = Instant::now();
        let limits = &self.inner.limits;
        for name in request
            .inputs
            .keys()
            .chain(request.input_artifacts.iter().map(|(name, _)| name))
        {
            if !is_identifier(name) {
                return Err(Error::InvalidInput(format!(
                    "input name {name:?} is not a Python identifier; use letters, digits and _"
                )));
            }
        }
        let code_chars = request.code.chars().count();
        if code_chars > limits.max_code_chars {
            let mut envelope = Envelope::failed(
                Status::Error,
                ErrorInfo::new(
                    "CodeTooLarge",
                    format!(
                        "the code is {code_chars} characters, over the limit of {}; send less code (move data into inputs or files)",
                        limits.max_code_chars
                    ),
                ),
                new_run_id(),
            );
            envelope.duration_ms = elapsed_ms(started);
            return Ok(envelope);
        }
        match &self.inner.keep {
            Some(keep) if keep.memo_ttl.is_some() && request.use_memo => {
                self.execute_memoized(keep, request, events, cancel, started)
                    .await
            }
            _ => Ok(self
                .execute_fresh(&request, events, cancel, started)
                .await?
                .0),
        }
    }

    /// Runs the code in a fresh child; also says whether the envelope may be memoized.
    pub(crate) async fn execute_fresh(
        &self,
        request: &RunRequest,
        events: Option<mpsc::Sender<Event>>,
        cancel: Option<oneshot::Receiver<()>>,
        started: Instant,
    ) -> Result<(Envelope, bool), Error> {
        self.execute_attempt(request, events, cancel, started, None)
            .await
    }

    /// One attempt at a run: a fresh one, or a resumed one replaying its journal under its old id.
    pub(crate) async fn execute_attempt(
        &self,
        request: &RunRequest,
        events: Option<mpsc::Sender<Event>>,
        cancel: Option<oneshot::Receiver<()>>,
        started: Instant,
        resume: Option<(String, ReplayPlan)>,
    ) -> Result<(Envelope, bool), Error> {
        let resumed = resume.is_some();
        let (run_id, replay) = match resume {
            Some((run_id, plan)) => (run_id, Some(plan)),
            None => (new_run_id(), None),
        };
        let limits = &self.inner.limits;
        let interpreter = self.interpreter().await?.clone();
        // The script is known now: a kept run stores it while the code runs, off the critical path.
        let script_blob = self.inner.keep.as_ref().map(|keep| {
            let (store, code) = (keep.store.clone(), request.code.clone());
            tokio::spawn(async move { store.put_blob(code.into_bytes()).await })
        });
        let prepared = match self
            .inner
            .deps
            .prepare(request, &interpreter, events.as_ref())
            .await
        {
            Ok(prepared) => prepared,
            Err(e) => {
                let mut envelope = Envelope::failed(
                    Status::Error,
                    ErrorInfo::new("DependencyError", e.to_string()),
                    run_id,
                );
                envelope.duration_ms = elapsed_ms(started);
                return Ok((envelope, false));
            }
        };
        let python = prepared.as_ref().map_or_else(
            || interpreter.executable.clone(),
            |env| env.interpreter.clone(),
        );

        // An interpreter started ahead of time for this environment, or a fresh one (the cold path).
        let site_dir = prepared.as_ref().and_then(|env| env.site_dir.clone());
        let code_dir = code_dir()?;
        if !crate::process::bytecode_ready(&python) {
            let (python, version) = (python.clone(), interpreter.version);
            let _ = tokio::task::spawn_blocking(move || {
                crate::process::ensure_bytecode(&python, version, code_dir)
            })
            .await;
        }
        let key: PoolKey = (python.clone(), site_dir.clone());
        let slot = match self.pooled(&key).await {
            Some(slot) => slot,
            None => self.spawn_slot(&python, code_dir, site_dir.as_deref(), &[])?,
        };
        self.refill_pool(key);
        let Slot {
            run_dir,
            work_dir,
            spawned,
            isolation,
            ..
        } = slot;

        let (mut tools, nested_stats) = crate::nested::tools_for_run(self, Instant::now())?;
        // With a store, the code also reaches artifacts by reference (read/load/save_artifact).
        let saved_artifacts = Arc::new(Mutex::new(Vec::new()));
        if let Some(keep) = &self.inner.keep {
            tools.insert(ReadArtifact {
                store: keep.store.clone(),
            })?;
            tools.insert(SaveArtifact {
                store: keep.store.clone(),
                saved: Arc::clone(&saved_artifacts),
            })?;
        }
        let input_artifacts = self.fetch_input_artifacts(request).await?;
        let durable = self.durable_sink(&run_id, request, &replay).await?;
        let (bridge_spec, bridge_future, bridge_stats, journal) = if tools.is_empty() {
            (Value::Null, None, None, None)
        } else {
            let mut bridge = Bridge::bind(
                &run_dir.path().join("bridge.sock"),
                tools,
                self.inner.bridge.clone(),
            )?;
            if let Some(plan) = replay {
                bridge = bridge.with_replay(plan);
            }
            if let Some(sink) = durable {
                bridge = bridge.with_sink(sink);
            }
            // The child runs as the run's uid: the socket must be its to connect to.
            if isolation.uid != nix::unistd::geteuid().as_raw() {
                std::os::unix::fs::lchown(
                    run_dir.path().join("bridge.sock"),
                    Some(isolation.uid),
                    Some(isolation.uid),
                )
                .map_err(|source| Error::Io {
                    what: "handing the bridge socket to the run's uid",
                    source,
                })?;
            }
            let stats = bridge.stats();
            if let Some(cell) = &nested_stats {
                let _ = cell.set(Arc::clone(&stats));
            }
            let journal = bridge.journal();
            (
                bridge.client_spec(),
                Some(bridge.serve()),
                Some(stats),
                Some(journal),
            )
        };

        let runner_request = serde_json::json!({
            "code_dir": code_dir,
            "code": &request.code,
            "inputs": &request.inputs,
            "input_artifacts": input_artifacts,
            "artifact_helpers": self.inner.keep.is_some(),
            "max_return_bytes": limits.max_return_bytes,
            "inline_return_bytes": limits.inline_return_bytes,
            "site_dir": site_dir,
            "bridge": bridge_spec,
        });
        let runner_request =
            serde_json::to_vec(&runner_request).map_err(|e| Error::Internal(e.to_string()))?;

        let mut child = spawned.child;
        let guard = spawned.guard;

        let mut stdin = child.stdin.take();
        let writer = tokio::spawn(async move {
            if let Some(stdin) = stdin.as_mut() {
                // A child that dies early closes the pipe; its exit is reported, not this write.
                let _ = stdin.write_all(&runner_request).await;
            }
        });
        let stdout_capture = Arc::new(Mutex::new(HeadTail::new(limits.max_output_chars)));
        let stderr_capture = Arc::new(Mutex::new(HeadTail::new(limits.max_output_chars)));
        // The runner closes stdout, stderr and the result pipe once it has answered: when all three
        // are at end of file the envelope is complete, before the interpreter has finished exiting.
        let closed = Arc::new(Closed::default());
        let stdout_reader = child.stdout.take().map(|pipe| {
            let (sink, events, closed) = (
                Arc::clone(&stdout_capture),
                events.clone(),
                Arc::clone(&closed),
            );
            tokio::spawn(async move {
                capture(pipe, sink, events, Event::Stdout).await;
                closed.mark();
            })
        });
        let stderr_reader = child.stderr.take().map(|pipe| {
            let (sink, events, closed) = (
                Arc::clone(&stderr_capture),
                events.clone(),
                Arc::clone(&closed),
            );
            tokio::spawn(async move {
                capture(pipe, sink, events, Event::Stderr).await;
                closed.mark();
            })
        });
        let result_cap = limits.max_return_bytes + RESULT_OVERHEAD;
        let mut result_pipe = spawned.result;
        let result_closed = Arc::clone(&closed);
        let result_reader = tokio::spawn(async move {
            let mut data = Vec::new();
            let mut chunk = vec![0u8; 64 * 1024];
            let mut overflow = false;
            loop {
                match result_pipe.read(&mut chunk).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) if data.len() + n <= result_cap => data.extend_from_slice(&chunk[..n]),
                    Ok(_) => overflow = true, // keep draining so the child never blocks on it
                }
            }
            if !data.is_empty() {
                result_closed
                    .answered
                    .store(true, std::sync::atomic::Ordering::SeqCst);
            }
            result_closed.mark();
            (data, overflow)
        });
        // The runner answers after doing what the interpreter's exit would (threads joined, exit
        // handlers run, the code's globals and open files released), so the run may end as soon as the
        // answer is complete instead of waiting for the interpreter and its namespaces to go away.
        let answered = closed.wait_for(3);

        let cancelled = async {
            if let Some(rx) = cancel {
                if rx.await.is_ok() {
                    return;
                }
            }
            std::future::pending::<()>().await
        };
        let bridge_failed = async {
            match bridge_future {
                Some(serve) => serve.await,
                None => std::future::pending().await,
            }
        };
        let ending = tokio::select! {
            status = child.wait() => match status {
                Ok(status) => Ending::Exited(status),
                Err(source) => return Err(Error::Io { what: "waiting for the child", source }),
            },
            _ = tokio::time::sleep(limits.timeout) => Ending::TimedOut,
            _ = cancelled => Ending::Cancelled,
            _ = answered => Ending::Answered,
            e = bridge_failed => Ending::Bridge(e),
        };
        // Whatever happened, nothing the code started may outlive the run.
        guard.kill();
        match ending {
            // Killed above; tokio reaps it in the background.
            Ending::Exited(_) | Ending::Answered => {}
            _ => {
                let _ = child.wait().await;
            }
        }
        writer.abort();
        for reader in [stdout_reader, stderr_reader].into_iter().flatten() {
            let abort = reader.abort_handle();
            if tokio::time::timeout(DRAIN_GRACE, reader).await.is_err() {
                abort.abort();
            }
        }
        let (result_bytes, result_overflow) =
            match tokio::time::timeout(DRAIN_GRACE, result_reader).await {
                Ok(Ok(read)) => read,
                _ => (Vec::new(), false),
            };
        let files = match (&self.inner.keep, &ending) {
            (
                Some(keep),
                Ending::Exited(_) | Ending::Answered | Ending::TimedOut | Ending::Bridge(_),
            ) => {
                let mut files = collect_run_files(work_dir.clone(), keep.collect.clone()).await?;
                // What the code saved with save_artifact() is kept beside the files it wrote.
                let saved =
                    std::mem::take(&mut *saved_artifacts.lock().unwrap_or_else(|p| p.into_inner()));
                files
                    .files
                    .retain(|f| !saved.iter().any(|s| s.name == f.name));
                files.files.extend(saved);
                Some(files)
            }
            _ => None,
        };
        discard_run_dir(run_dir);

        let stdout_captured = take_capture(&stdout_capture);
        let stderr_captured = take_capture(&stderr_capture);
        let (stdout, stdout_trunc) = stdout_captured.render(limits.max_output_chars);
        let (stderr, stderr_trunc) = stderr_captured.render(limits.max_output_chars);
        let truncated = (stdout_trunc.is_some() || stderr_trunc.is_some()).then_some(Truncated {
            stdout: stdout_trunc,
            stderr: stderr_trunc,
            artifacts: None,
        });
        let mut envelope = Envelope {
            stdout,
            stderr,
            truncated,
            isolation: Some(isolation),
            ..Envelope::empty(run_id)
        };
        match ending {
            Ending::Cancelled => return Err(Error::Cancelled),
            Ending::TimedOut => {
                envelope.status = Status::Timeout;
                envelope.error = Some(ErrorInfo::new(
                    "Timeout",
                    format!(
                        "the code ran longer than the {} timeout and was stopped; make it faster or raise the timeout",
                        human_duration(limits.timeout)
                    ),
                ));
            }
            Ending::Bridge(Stop::Suspended(suspension)) => {
                envelope.status = Status::Suspended;
                envelope.suspension = Some(serde_json::json!({
                    "id": suspension.id,
                    "tool": suspension.tool,
                    "args": suspension.args,
                    "run_id": envelope.run_id,
                }));
            }
            Ending::Bridge(Stop::Diverged {
                step,
                recorded,
                called,
            }) => {
                envelope.status = Status::Error;
                envelope.error = Some(ErrorInfo::new(
                    "ReplayDiverged",
                    format!(
                        "at step {step} the resumed code called {called}, but the journal recorded \
                         {recorded}; a resumed script must make the same tool calls in the same order up \
                         to its suspension (wrap values that change between runs in once(...))"
                    ),
                ));
            }
            Ending::Bridge(stop) => {
                let why = match stop {
                    Stop::Failed(e) => e.to_string(),
                    other => format!("{other:?}"),
                };
                envelope.status = Status::Error;
                envelope.error = Some(ErrorInfo::new(
                    "SandboxError",
                    format!(
                        "the code broke the tool bridge's protocol and the run was stopped: {why}"
                    ),
                ));
            }
            Ending::Answered => apply_result(
                &mut envelope,
                std::os::unix::process::ExitStatusExt::from_raw(0),
                &result_bytes,
                result_overflow,
                limits,
            ),
            Ending::Exited(status) => apply_result(
                &mut envelope,
                status,
                &result_bytes,
                result_overflow,
                limits,
            ),
        }
        if bridge_stats.as_ref().is_some_and(|s| s.limit_exceeded()) {
            envelope.status = Status::Error;
            envelope.return_value = Value::Null;
            envelope.return_type = None;
            envelope.error = Some(ErrorInfo::new(
                "ToolCallLimit",
                format!(
                    "the code made more than {} tool calls, the run's budget; batch the work into fewer calls",
                    self.inner.bridge.max_calls
                ),
            ));
        }
        envelope.duration_ms = elapsed_ms(started);
        crate::nested::report_calls(self, bridge_stats.as_deref());
        let memoizable = envelope.status == Status::Success
            && !resumed
            && bridge_stats.as_ref().is_none_or(|s| s.impure_calls() == 0);
        let journal = journal.and_then(|j| j.lock().ok().map(|j| j.clone()));
        self.checkpoint(
            &envelope.run_id.clone(),
            request,
            &envelope,
            journal,
            resumed,
        )
        .await?;
        if let Some(blob) = script_blob {
            // put_run finds it written (or writes it, if this failed).
            let _ = blob.await;
        }
        if let (Some(keep), Some(files)) = (&self.inner.keep, files) {
            self.keep_run(
                keep,
                request,
                &mut envelope,
                files,
                &interpreter,
                prepared.as_ref(),
            )
            .await?;
        }
        if envelope.return_preview.is_some() {
            // The full value went to the store (when there is one); the envelope carries the preview.
            envelope.return_value = Value::Null;
        }
        crate::budget::fit(
            &mut envelope,
            limits.envelope_budget,
            &stdout_captured,
            &stderr_captured,
            limits.max_output_chars,
        );
        Ok((envelope, memoizable))
    }
}

/// Run directories are `<tmp>/runpython-<host pid>-<random>`.
const RUN_DIR_PREFIX: &str = "runpython-";

/// A run directory whose host is gone is removed once it is this old: a host killed with SIGKILL (or
/// one that exits without dropping its pooled interpreters) cannot remove its own.
const STALE_RUN_DIR_AGE: Duration = Duration::from_secs(3600);

/// Once per process, on a thread of its own: removes the run directories of hosts that are gone
/// (their pid no longer exists) and that are older than [`STALE_RUN_DIR_AGE`] (a pid from another
/// PID namespace sharing this `/tmp` looks gone too; the age keeps its live runs safe). Only
/// directories this user made are touched: its own uid's, or as root the uids runs are given.
fn sweep_stale_run_dirs() {
    static SWEPT: std::sync::Once = std::sync::Once::new();
    SWEPT.call_once(|| {
        let _ = std::thread::Builder::new()
            .name("runpython-sweep".into())
            .spawn(|| sweep_run_dirs_in(&std::env::temp_dir(), STALE_RUN_DIR_AGE));
    });
}

/// [`sweep_stale_run_dirs`] in `dir`; returns how many were removed.
fn sweep_run_dirs_in(dir: &std::path::Path, min_age: Duration) -> usize {
    use std::os::unix::fs::MetadataExt;
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    // SAFETY: geteuid cannot fail.
    let euid = unsafe { libc::geteuid() };
    let mut removed = 0;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix(RUN_DIR_PREFIX))
            .and_then(|rest| rest.split_once('-'))
            .and_then(|(pid, _)| pid.parse::<libc::pid_t>().ok())
        else {
            continue;
        };
        // The entry itself, not a symlink's target; a directory; this user's (or, as root, a run uid's).
        let Ok(meta) = entry.path().symlink_metadata() else {
            continue;
        };
        let ours = meta.uid() == euid || (euid == 0 && crate::sandbox::is_run_uid(meta.uid()));
        let old = meta
            .modified()
            .ok()
            .and_then(|m| m.elapsed().ok())
            .is_some_and(|age| age >= min_age);
        // SAFETY: kill with signal 0 only checks that the process exists.
        let gone = pid > 0
            && unsafe { libc::kill(pid, 0) } != 0
            && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH);
        if meta.is_dir() && ours && old && gone && std::fs::remove_dir_all(entry.path()).is_ok() {
            removed += 1;
        }
    }
    removed
}

/// Removes a finished run's directory off the run's critical path: renamed aside at once (its path is
/// gone when the run returns), deleted by a blocking task, which a runtime shutting down still waits
/// for. Where the rename fails, it is deleted in place.
fn discard_run_dir(run_dir: tempfile::TempDir) {
    let path = run_dir.keep();
    let mut trash = path.clone().into_os_string();
    trash.push(".done");
    let trash = std::path::PathBuf::from(trash);
    if std::fs::rename(&path, &trash).is_ok() {
        tokio::task::spawn_blocking(move || {
            let _ = std::fs::remove_dir_all(&trash);
        });
    } else {
        let _ = std::fs::remove_dir_all(&path);
    }
}

/// Counts the child's output channels that reached end of file.
#[derive(Debug, Default)]
struct Closed {
    count: std::sync::atomic::AtomicUsize,
    answered: std::sync::atomic::AtomicBool,
    notify: tokio::sync::Notify,
}

impl Closed {
    fn mark(&self) {
        self.count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.notify.notify_one();
    }

    /// Resolves once `n` channels are closed and the runner wrote a result.
    async fn wait_for(&self, n: usize) {
        use std::sync::atomic::Ordering::SeqCst;
        while self.count.load(SeqCst) < n || !self.answered.load(SeqCst) {
            if self.count.load(SeqCst) >= n {
                return std::future::pending().await; // closed without an answer: wait for the exit
            }
            self.notify.notified().await;
        }
    }
}

async fn capture<R: tokio::io::AsyncRead + Unpin>(
    mut pipe: R,
    sink: Arc<Mutex<HeadTail>>,
    events: Option<mpsc::Sender<Event>>,
    wrap: fn(String) -> Event,
) {
    let mut chunk = vec![0u8; 64 * 1024];
    let mut events = events;
    loop {
        let n = match pipe.read(&mut chunk).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let text = match sink.lock() {
            Ok(mut capture) => capture.push_bytes(&chunk[..n]),
            Err(_) => break,
        };
        if let Some(tx) = &events {
            if tx.send(wrap(text)).await.is_err() {
                events = None; // nobody listens any more; keep capturing
            }
        }
    }
}

fn take_capture(capture: &Arc<Mutex<HeadTail>>) -> Captured {
    let mut guard = match capture.lock() {
        Ok(guard) => guard,
        Err(poisoned) => poisoned.into_inner(),
    };
    std::mem::replace(&mut *guard, HeadTail::new(2)).into_captured()
}

/// Fills the envelope from the runner's result record, or explains why there is none.
fn apply_result(
    envelope: &mut Envelope,
    status: std::process::ExitStatus,
    bytes: &[u8],
    overflow: bool,
    limits: &Limits,
) {
    use std::os::unix::process::ExitStatusExt;
    if overflow {
        envelope.status = Status::Error;
        envelope.error = Some(ErrorInfo::new(
            "ReturnValueTooLarge",
            format!(
                "the result was larger than the limit of {} bytes of JSON; return a smaller value",
                limits.max_return_bytes
            ),
        ));
        return;
    }
    if bytes.is_empty() {
        let mut error = ErrorInfo::new("ProcessExited", String::new());
        error.message = match (status.code(), status.signal()) {
            (Some(code), _) => {
                error.exit_code = Some(code);
                format!("the Python process exited with status {code} before the code finished")
            }
            (None, Some(signal)) => {
                error.signal = Some(signal);
                let name = nix::sys::signal::Signal::try_from(signal)
                    .map(|s| s.as_str())
                    .unwrap_or("unknown signal");
                format!("the Python process was killed by signal {signal} ({name}) before the code finished")
            }
            (None, None) => "the Python process ended without a result".into(),
        };
        envelope.status = Status::Error;
        envelope.error = Some(error);
        return;
    }
    #[derive(serde::Deserialize)]
    struct RunnerResult {
        status: String,
        #[serde(default)]
        return_value: Value,
        #[serde(default)]
        return_type: Option<String>,
        #[serde(default)]
        error: Option<ErrorInfo>,
        #[serde(default)]
        return_preview: Option<Value>,
    }
    match serde_json::from_slice::<RunnerResult>(bytes) {
        Ok(result) if result.status == "success" => {
            envelope.return_value = result.return_value;
            envelope.return_type = result.return_type;
            envelope.return_preview = result.return_preview;
        }
        Ok(result) => {
            envelope.return_preview = result.return_preview;
            envelope.status = Status::Error;
            envelope.error = Some(result.error.unwrap_or_else(|| {
                ErrorInfo::new(
                    "SandboxError",
                    "the runner reported an error without details",
                )
            }));
        }
        Err(e) => {
            envelope.status = Status::Error;
            envelope.error = Some(ErrorInfo::new(
                "SandboxError",
                format!("the runner's result could not be read ({e}); did the code write to file descriptor 3?"),
            ));
        }
    }
}

pub(crate) fn elapsed_ms(started: Instant) -> u64 {
    u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX)
}

fn human_duration(d: Duration) -> String {
    let secs = d.as_secs_f64();
    if secs.fract() == 0.0 {
        format!("{secs:.0} s")
    } else {
        format!("{secs} s")
    }
}

pub(crate) fn is_identifier(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c == '_' || c.is_alphabetic())
        && chars.all(|c| c == '_' || c.is_alphanumeric())
}

/// A sortable, unique run id: milliseconds since the epoch, then 64 random bits, in hex.
fn new_run_id() -> String {
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0);
    let mut random = [0u8; 8];
    let _ = getrandom::fill(&mut random);
    format!("{ms:012x}{:016x}", u64::from_be_bytes(random))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn only_old_run_dirs_of_gone_hosts_are_swept() {
        let tmp = tempfile::tempdir().unwrap();
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead = child.id();
        child.wait().unwrap();
        let alive = std::process::id();
        let two_hours_ago = std::time::SystemTime::now() - Duration::from_secs(7200);
        let make = |name: &str, old: bool| {
            let path = tmp.path().join(name);
            std::fs::create_dir(&path).unwrap();
            std::fs::write(path.join("f"), b"x").unwrap();
            if old {
                std::fs::File::open(&path)
                    .unwrap()
                    .set_modified(two_hours_ago)
                    .unwrap();
            }
            path
        };
        let stale = make(&format!("runpython-{dead}-abc"), true);
        let stale_trash = make(&format!("runpython-{dead}-abc.done"), true);
        let young = make(&format!("runpython-{dead}-young"), false);
        let live_host = make(&format!("runpython-{alive}-live"), true);
        let other_name = make("runpython-legacy", true);
        let not_ours = make(&format!("python-{dead}-abc"), true);
        let file = tmp.path().join(format!("runpython-{dead}-file"));
        std::fs::write(&file, b"x").unwrap();
        let link = tmp.path().join(format!("runpython-{dead}-link"));
        std::os::unix::fs::symlink(&live_host, &link).unwrap();

        assert_eq!(sweep_run_dirs_in(tmp.path(), Duration::from_secs(3600)), 2);
        assert!(!stale.exists() && !stale_trash.exists());
        for kept in [&young, &live_host, &other_name, &not_ours, &file, &link] {
            assert!(kept.exists(), "{} was removed", kept.display());
        }
        assert!(live_host.join("f").exists(), "a symlink was followed");
    }
}
