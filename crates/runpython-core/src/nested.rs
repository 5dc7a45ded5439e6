//! Runs nested in runs ("agent in agent"): with [`crate::RunPythonBuilder::allow_nested`], the code can
//! call `run_python(code, dependencies=None, inputs=None)` and gets the inner run's envelope as a dict.
//!
//! The inner run is a run of a copy of the outer engine (same tools, store, dependency policy), one level
//! deeper, in its own sandboxed child. Budgets are shared downwards: the inner timeout is what remains of
//! the outer run's time (less a margin so the outer code can still read the inner envelope), its tool-call
//! budget is what remains of the outer's, and the calls it makes are charged to the outer run.
//! The tool is offered at every level; a call from the deepest level raises `NestingLimit` in the code.
//!
//! An inner run that suspends suspends the outer call ([`ToolError::suspend`] carrying the inner run id
//! and suspension); resuming the outer run resumes the inner one through [`Tool::resume`].
//!
//! The engine is reached through the [`NestEngine`] trait it implements, so this module depends on
//! requests and envelopes only, never on the engine's type.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use runpython_bridge::{BoxFuture, BridgeStats, Tool, ToolArgs, ToolError, ToolSet};
use serde_json::Value;

use crate::envelope::{Envelope, Status};
use crate::error::Error;
use crate::request::{run_python_schema, run_request_from, RunRequest, RUN_PYTHON_TOOL};

/// What a nested run needs of the engine: a copy one level deeper, and running or resuming on it.
pub(crate) trait NestEngine: Send + Sync {
    /// This engine's run timeout.
    fn timeout(&self) -> Duration;
    /// Tool calls allowed per run.
    fn max_tool_calls(&self) -> u32;
    /// Where this engine sits in the tree of nested runs.
    fn nesting(&self) -> Option<&Nesting>;
    /// A copy of the engine for a run nested in one of its runs.
    fn deeper(&self, timeout: Duration, max_calls: u32, nesting: Nesting) -> Arc<dyn NestEngine>;
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

/// Where an engine sits in a tree of nested runs.
#[derive(Debug, Clone)]
pub(crate) struct Nesting {
    /// The deepest level a run may reach (the outermost run is level 0).
    pub max_depth: u32,
    /// This engine's level.
    pub level: u32,
    /// Where a nested engine reports the tool calls its run made, to charge the outer run.
    pub spent: Option<Arc<AtomicU32>>,
}

impl Nesting {
    pub fn top(max_depth: u32) -> Self {
        Self {
            max_depth,
            level: 0,
            spent: None,
        }
    }
}

/// The outer run's side of the budget: filled in once its bridge is bound.
pub(crate) type RunStats = Arc<OnceLock<Arc<BridgeStats>>>;

/// The `run_python` tool offered inside one run (or, without a run, as a template for stubs).
#[derive(Clone)]
struct NestedRun {
    engine: Arc<dyn NestEngine>,
    run: Option<(Instant, RunStats)>,
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
        let Some((started, stats)) = self.run.clone() else {
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
        let max_calls = engine.max_tool_calls();
        let used = stats.get().map_or(0, |s| s.calls());
        let calls_left = max_calls.saturating_sub(used);
        let spent = Arc::new(AtomicU32::new(0));
        let inner = engine.deeper(
            timeout,
            calls_left,
            Nesting {
                max_depth: nesting.max_depth,
                level: nesting.level + 1,
                spent: Some(Arc::clone(&spent)),
            },
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
        if let Some(stats) = stats.get() {
            stats.charge(spent.load(Ordering::Relaxed).min(calls_left));
        }
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
/// is allowed. `started` is when the run's clock starts (just before its child is spawned); the budget
/// reads the run's bridge stats, set through the returned cell once the bridge is bound.
pub(crate) fn tools_for_run(
    tools: &ToolSet,
    engine: Arc<dyn NestEngine>,
    started: Instant,
) -> Result<(ToolSet, Option<RunStats>), Error> {
    let mut tools = tools.clone();
    if engine.nesting().is_none() {
        return Ok((tools, None));
    }
    let stats = RunStats::default();
    tools
        .insert(NestedRun {
            engine,
            run: Some((started, Arc::clone(&stats))),
        })
        .map_err(|e| Error::Config(e.to_string()))?;
    Ok((tools, Some(stats)))
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

/// After a nested engine's run: reports its tool calls to the outer run's `run_python` call.
pub(crate) fn report_calls(nesting: Option<&Nesting>, stats: Option<&BridgeStats>) {
    if let (
        Some(Nesting {
            spent: Some(spent), ..
        }),
        Some(stats),
    ) = (nesting, stats)
    {
        spent.fetch_add(stats.calls(), Ordering::Relaxed);
    }
}
