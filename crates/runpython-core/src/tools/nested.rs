//! Runs nested in runs ("agent in agent"): with [`crate::RunPythonBuilder::allow_nested`], the code can
//! call `run_python(code, dependencies=None, inputs=None)` and gets the inner run's envelope as a dict.
//!
//! The inner run is a run of a copy of the outer engine (same tools, store, dependency policy), one level
//! deeper, in its own sandboxed child. A budget is the whole tree's ([`TreeBudget`]), reserved before an
//! inner run starts and settled when it ends: the inner timeout is what remains of the outer run's time
//! (less a margin so the outer code can still read the inner envelope); every run of the tree counts its
//! tool calls against one counter and holds one of the tree's slots while a call runs (so no number of
//! inner runs side by side makes more calls, or runs more host command processes, than one run may);
//! at most [`MAX_LIVE_NESTED`] inner sandboxes live at once; and the inner runs share one run's memory
//! and disk, each getting a [`MAX_LIVE_NESTED`]th of it.
//! The tool is offered at every level; a call from the deepest level raises `NestingLimit` in the code.
//!
//! An inner run that suspends suspends the outer call ([`ToolError::suspend`] carrying the inner run id
//! and suspension); resuming the outer run resumes the inner one through [`Tool::resume`].
//!
//! The engine is reached through the [`NestEngine`] trait it implements, so this module depends on
//! requests and envelopes only, never on the engine's type.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use runpython_bridge::{BoxFuture, CallBudget, Tool, ToolArgs, ToolError, ToolSet};
use serde_json::Value;

use crate::error::Error;
use crate::protocol::envelope::{Envelope, Status};
use crate::protocol::request::{RunRequest, RUN_PYTHON_TOOL};
use crate::protocol::tool_spec::{run_python_schema, run_request_from};

/// What a nested run needs of the engine: a copy one level deeper, and running or resuming on it.
pub(crate) trait NestEngine: Send + Sync {
    /// This engine's run timeout.
    fn timeout(&self) -> Duration;
    /// Tool calls allowed per run.
    fn max_tool_calls(&self) -> u32;
    /// Where this engine sits in the tree of nested runs.
    fn nesting(&self) -> Option<&Nesting>;
    /// Calls served at once per run.
    fn max_concurrent_calls(&self) -> usize;
    /// A run's memory and disk.
    fn memory_and_disk(&self) -> (u64, u64);
    /// A copy of the engine for a run nested in one of its runs, with the share of the tree's memory
    /// and disk reserved for it.
    fn deeper(
        &self,
        timeout: Duration,
        nesting: Nesting,
        memory_bytes: u64,
        disk_bytes: u64,
    ) -> Arc<dyn NestEngine>;
    /// Runs `request` to its end.
    fn run(&self, request: RunRequest) -> BoxFuture<'static, Result<Envelope, Error>>;
    /// Resumes a suspended run.
    fn resume(
        &self,
        run_id: String,
        decisions: HashMap<String, Value>,
    ) -> BoxFuture<'static, Result<Envelope, Error>>;
}

/// The longest margin kept from the outer run's remaining time when sizing an inner run's timeout.
const MAX_TIME_MARGIN: Duration = Duration::from_secs(2);

/// Inner sandboxes a tree of runs may have alive at once.
pub(crate) const MAX_LIVE_NESTED: usize = 4;

/// The least memory and disk an inner run starts with; with less left in the tree, it is refused.
const MIN_NESTED_MEMORY: u64 = 64 << 20;
const MIN_NESTED_DISK: u64 = 16 << 20;

/// What a tree of runs (an outermost run and every run nested in it) may use, together.
#[derive(Debug)]
pub(crate) struct TreeBudget {
    /// Tool calls, in all and in flight at once.
    pub calls: Arc<CallBudget>,
    /// Inner sandboxes alive at once.
    live: Arc<tokio::sync::Semaphore>,
    /// Memory and disk left for the inner runs (one run's worth to share).
    left: Mutex<(u64, u64)>,
    /// What one inner run gets: a [`MAX_LIVE_NESTED`]th of one run's memory and disk, so that the
    /// inner runs alive at once, at any depth, never hold more than one run's worth.
    share: (u64, u64),
}

impl TreeBudget {
    fn new(max_calls: u32, concurrent: usize, memory: u64, disk: u64) -> Arc<Self> {
        let n = MAX_LIVE_NESTED as u64;
        Arc::new(Self {
            calls: CallBudget::new(max_calls, concurrent),
            live: Arc::new(tokio::sync::Semaphore::new(MAX_LIVE_NESTED)),
            left: Mutex::new((memory, disk)),
            share: (memory / n, disk / n),
        })
    }
}

/// A reservation of one inner run, settled when dropped.
struct Reserved {
    tree: Arc<TreeBudget>,
    memory: u64,
    disk: u64,
    _live: tokio::sync::OwnedSemaphorePermit,
}

impl Drop for Reserved {
    fn drop(&mut self) {
        if let Ok(mut left) = self.tree.left.lock() {
            left.0 += self.memory;
            left.1 += self.disk;
        }
    }
}

impl TreeBudget {
    /// Reserves a live sandbox and its share of memory and disk for one inner run, or says why there
    /// is none to give.
    fn reserve(self: &Arc<Self>) -> Result<Reserved, ToolError> {
        let want = self.share;
        let live = Arc::clone(&self.live).try_acquire_owned().map_err(|_| {
            ToolError::new(
                "NestingLimit",
                format!(
                    "{MAX_LIVE_NESTED} nested runs are running already, the most a run's tree may \
                     have at once; wait for one to finish"
                ),
            )
        })?;
        let mut left = self
            .left
            .lock()
            .map_err(|_| ToolError::new("RuntimeError", "the nested runs' budget is poisoned"))?;
        let memory = want.0.min(left.0);
        let disk = want.1.min(left.1);
        if memory < MIN_NESTED_MEMORY || disk < MIN_NESTED_DISK {
            return Err(ToolError::new(
                "NestingLimit",
                format!(
                    "the nested runs running now hold this run's memory and disk ({} MiB and {} MiB \
                     are left, a nested run needs at least {} and {}); wait for one to finish",
                    left.0 >> 20,
                    left.1 >> 20,
                    MIN_NESTED_MEMORY >> 20,
                    MIN_NESTED_DISK >> 20
                ),
            ));
        }
        left.0 -= memory;
        left.1 -= disk;
        Ok(Reserved {
            tree: Arc::clone(self),
            memory,
            disk,
            _live: live,
        })
    }
}

/// Where an engine sits in a tree of nested runs.
#[derive(Debug, Clone)]
pub(crate) struct Nesting {
    /// The deepest level a run may reach (the outermost run is level 0).
    pub max_depth: u32,
    /// This engine's level.
    pub level: u32,
    /// The budget of the tree an inner engine's run belongs to (the outermost engine makes one per
    /// run).
    pub tree: Option<Arc<TreeBudget>>,
}

impl Nesting {
    pub fn top(max_depth: u32) -> Self {
        Self {
            max_depth,
            level: 0,
            tree: None,
        }
    }
}

/// The `run_python` tool offered inside one run (or, without a run, as a template for stubs).
#[derive(Clone)]
struct NestedRun {
    engine: Arc<dyn NestEngine>,
    run: Option<(Instant, Arc<TreeBudget>)>,
}

const DESCRIPTION: &str = "Run Python code in a fresh sandboxed process (its own dependencies and inputs) \
and return its envelope as a dict: status, return_value, return_type, stdout, stderr, error, artifacts, \
run_id. Its timeout and tool calls come out of this run's budget.";

impl Tool for NestedRun {
    fn name(&self) -> &str {
        RUN_PYTHON_TOOL
    }
    fn description(&self) -> &str {
        DESCRIPTION
    }
    fn input_schema(&self) -> Option<&Value> {
        static SCHEMA: OnceLock<Value> = OnceLock::new();
        Some(SCHEMA.get_or_init(run_python_schema))
    }
    fn runs_nested(&self) -> bool {
        true
    }
    fn call(&self, args: ToolArgs) -> BoxFuture<'static, Result<Value, ToolError>> {
        let this = self.clone();
        Box::pin(async move {
            let request = run_request_from(&args.kwargs).map_err(|e| match e {
                Error::InvalidInput(message) => ToolError::value_error(message),
                other => ToolError::new("RunPythonError", other.to_string()),
            })?;
            this.with_inner(move |inner| inner.run(request)).await
        })
    }

    /// An inner run that suspended suspended this call; the decision resumes the inner run.
    fn resume(
        &self,
        request: Value,
        decision: Value,
    ) -> Option<BoxFuture<'static, Result<Value, ToolError>>> {
        let this = self.clone();
        Some(Box::pin(async move {
            let run_id = request["run_id"].as_str().unwrap_or_default().to_owned();
            let suspension = request["suspension"]["id"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            let decisions = HashMap::from([(suspension, decision)]);
            this.with_inner(move |inner| inner.resume(run_id, decisions))
                .await
        }))
    }
}

/// Aborts a task when dropped.
struct AbortOnDrop(tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl NestedRun {
    /// Runs `work` on a copy of the engine one level deeper, within what remains of this run's time
    /// and tool calls, and turns its envelope into the call's result (a suspended inner run suspends
    /// this call, carrying what the inner run waits for).
    async fn with_inner<F>(&self, work: F) -> Result<Value, ToolError>
    where
        F: FnOnce(Arc<dyn NestEngine>) -> BoxFuture<'static, Result<Envelope, Error>>,
    {
        let engine = Arc::clone(&self.engine);
        let Some((started, tree)) = self.run.clone() else {
            return Err(ToolError::new(
                "RuntimeError",
                "this run_python is a description, not bound to a run",
            ));
        };
        let Some(nesting) = engine.nesting().cloned() else {
            return Err(ToolError::new("RuntimeError", "nesting is not enabled"));
        };
        if nesting.level >= nesting.max_depth {
            return Err(ToolError::new(
                "NestingLimit",
                format!(
                    "run_python cannot nest deeper: this run is {} level(s) down, the limit set with \
                     allow_nested({}); do the work in this run instead",
                    nesting.level, nesting.max_depth
                ),
            ));
        }
        let outer_timeout = engine.timeout();
        let remaining = (started + outer_timeout).saturating_duration_since(Instant::now());
        let margin = (remaining / 4).min(MAX_TIME_MARGIN);
        let timeout = remaining.saturating_sub(margin);
        if timeout < Duration::from_millis(10) {
            return Err(ToolError::new(
                "TimeoutError",
                "the run has no time left for a nested run_python",
            ));
        }
        if tree.calls.remaining() == 0 {
            return Err(ToolError::new(
                "ToolCallLimit",
                "the run's tool calls are spent; a nested run would have none",
            ));
        }
        let reserved = tree.reserve()?;
        let inner = engine.deeper(
            timeout,
            Nesting {
                max_depth: nesting.max_depth,
                level: nesting.level + 1,
                tree: Some(Arc::clone(&tree)),
            },
            reserved.memory,
            reserved.disk,
        );
        // The inner run is polled on a task of its own: nesting it inside this call's future would stack
        // every level's poll frames on one thread. Dropping this call (the outer run ended) aborts it.
        let task = tokio::spawn(work(inner));
        let _abort = AbortOnDrop(task.abort_handle());
        let result = match task.await {
            Ok(result) => result,
            Err(e) => Err(Error::Internal(format!(
                "the nested run's task failed: {e}"
            ))),
        };
        drop(reserved);
        match result {
            Ok(envelope) if envelope.status == Status::Suspended => {
                Err(ToolError::suspend(serde_json::json!({
                    "run_id": envelope.run_id,
                    "suspension": envelope.suspension,
                })))
            }
            Ok(envelope) => serde_json::to_value(&envelope)
                .map_err(|e| ToolError::new("RunPythonError", e.to_string())),
            Err(Error::InvalidInput(message)) => Err(ToolError::value_error(message)),
            Err(e) => Err(ToolError::new("RunPythonError", e.to_string())),
        }
    }
}

/// The tools one run of `engine` exposes: `tools`, plus `run_python` bound to this run when nesting
/// is allowed, and the budget of the run's tree (its bridge counts its calls against it): the tree's
/// own for an inner run, a new one for an outermost run. `started` is when the run's clock starts
/// (just before its child is spawned).
pub(crate) fn tools_for_run(
    tools: &ToolSet,
    engine: Arc<dyn NestEngine>,
    started: Instant,
) -> Result<(ToolSet, Option<Arc<CallBudget>>), Error> {
    let mut tools = tools.clone();
    let Some(nesting) = engine.nesting() else {
        return Ok((tools, None));
    };
    let tree = match &nesting.tree {
        Some(tree) => Arc::clone(tree),
        None => {
            let (memory, disk) = engine.memory_and_disk();
            TreeBudget::new(
                engine.max_tool_calls(),
                engine.max_concurrent_calls(),
                memory,
                disk,
            )
        }
    };
    let calls = Arc::clone(&tree.calls);
    tools
        .insert(NestedRun {
            engine,
            run: Some((started, tree)),
        })
        .map_err(|e| Error::Config(e.to_string()))?;
    Ok((tools, Some(calls)))
}

/// The tools the code sees, for stubs and tool specs (with `run_python` when nesting is allowed).
pub(crate) fn exposed_tools(tools: &ToolSet, engine: Arc<dyn NestEngine>) -> ToolSet {
    let mut tools = tools.clone();
    if engine.nesting().is_some() {
        // A clash with a host tool of the same name is refused by the builder.
        let _ = tools.insert(NestedRun { engine, run: None });
    }
    tools
}
