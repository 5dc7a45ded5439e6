//! Serving calls: what a run's bridge shares among its calls (tools, limits, counters, journal, replay
//! plan), the dispatch of one call, and why a run stops. It knows nothing of sockets or frames: the
//! connection loop in `server.rs` hands it parsed calls and writes back what it answers.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use futures_util::future::BoxFuture;
use futures_util::FutureExt;
use serde_json::{json, Value};
use tokio::sync::mpsc;

use crate::config::BridgeConfig;
use crate::journal::{
    canonical_args, head, CallState, Journal, JournalEntry, Journaled, ARGS_KEPT, ONCE_TOOL,
};
use crate::tool::{ToolArgs, ToolError, ToolSet};
use crate::Error;

/// What every call of one run's bridge reads and updates.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) tools: ToolSet,
    pub(crate) config: BridgeConfig,
    pub(crate) stats: Arc<BridgeStats>,
    pub(crate) journal: Arc<Mutex<Journal>>,
    replay: Option<Mutex<Replay>>,
    pub(crate) sink: Option<Arc<dyn JournalSink>>,
    /// Where results over the spill threshold go (and come back from on replay).
    pub(crate) spill: Option<Arc<dyn SpillStore>>,
    /// The budget of the tree of runs this one belongs to, when it is one of a tree.
    pub(crate) budget: Option<Arc<CallBudget>>,
    /// Prefix of the calls' idempotency keys ([`ToolArgs::call_id`]).
    pub(crate) run_id: Option<String>,
    /// Ordinals follow arrival order: the connection loop takes one per call as it reads the frame.
    next_ordinal: AtomicU32,
    /// A resumed run's calls that the journal does not have are numbered from past its last entry, so
    /// no call takes the ordinal (and the id) of one the journal has.
    next_unjournaled: AtomicU32,
    stop: mpsc::Sender<Stop>,
}

impl Shared {
    /// The state for a fresh run, and the receiver of its stops.
    pub(crate) fn new(tools: ToolSet, config: BridgeConfig) -> (Self, mpsc::Receiver<Stop>) {
        let (stop, stopped) = mpsc::channel(1);
        let shared = Self {
            tools,
            config,
            stats: Arc::default(),
            journal: Arc::default(),
            replay: None,
            sink: None,
            spill: None,
            budget: None,
            run_id: None,
            next_ordinal: AtomicU32::new(0),
            next_unjournaled: AtomicU32::new(0),
            stop,
        };
        (shared, stopped)
    }

    /// Replays `plan` before calling tools for real.
    pub(crate) fn set_replay(&mut self, plan: ReplayPlan) {
        let consumed = vec![false; plan.journal.entries.len()];
        let past_the_journal = u32::try_from(plan.journal.entries.len()).unwrap_or(u32::MAX);
        self.next_unjournaled = AtomicU32::new(past_the_journal);
        self.replay = Some(Mutex::new(Replay { plan, consumed }));
    }

    /// The next call's ordinal, in arrival order.
    pub(crate) fn next_ordinal(&self) -> u32 {
        self.next_ordinal.fetch_add(1, Ordering::Relaxed)
    }

    /// The ordinal a call the journal does not have is journaled under: its arrival ordinal in a fresh
    /// run, the next one past the replayed journal in a resumed run.
    fn unjournaled_ordinal(&self, arrival: u32) -> u32 {
        if self.replay.is_none() {
            return arrival;
        }
        self.next_unjournaled.fetch_add(1, Ordering::Relaxed)
    }
}

/// Tool calls shared by a tree of runs (a run and the runs nested in it): how many the whole tree may
/// make, and how many it may have in flight at once (each holds host resources: a command tool's
/// process, an artifact slice), so that nested runs started side by side never multiply the budget.
#[derive(Debug)]
pub struct CallBudget {
    max: u32,
    used: AtomicU32,
    in_flight: tokio::sync::Semaphore,
}

impl CallBudget {
    /// `max_calls` calls in all, `concurrent` (at least one) in flight at once.
    pub fn new(max_calls: u32, concurrent: usize) -> Arc<Self> {
        Arc::new(Self {
            max: max_calls,
            used: AtomicU32::new(0),
            in_flight: tokio::sync::Semaphore::new(concurrent.max(1)),
        })
    }

    /// Calls the tree made (refused ones over the budget included).
    pub fn used(&self) -> u32 {
        self.used.load(Ordering::Relaxed)
    }

    /// Calls the tree may still make.
    pub fn remaining(&self) -> u32 {
        self.max.saturating_sub(self.used())
    }

    /// Counts one call; false when it is over the budget.
    fn take(&self) -> bool {
        self.used.fetch_add(1, Ordering::Relaxed) < self.max
    }
}

/// What happened on a run's bridge, readable while and after it serves.
#[derive(Debug, Default)]
pub struct BridgeStats {
    calls: AtomicU32,
    impure_calls: AtomicU32,
    limit_exceeded: AtomicBool,
    /// The budget that was exceeded was the tree's (shared with nested runs), not the run's own.
    tree_limit: AtomicU32,
}

impl BridgeStats {
    /// Calls received (including refused ones over the budget).
    pub fn calls(&self) -> u32 {
        self.calls.load(Ordering::Relaxed)
    }
    /// Calls to tools not declared pure (or to no tool at all).
    pub fn impure_calls(&self) -> u32 {
        self.impure_calls.load(Ordering::Relaxed)
    }
    /// True once a call went over the budget.
    pub fn limit_exceeded(&self) -> bool {
        self.limit_exceeded.load(Ordering::Relaxed)
    }
    /// When the budget exceeded was the tree's of nested runs ([`CallBudget`]): its size.
    pub fn tree_limit_exceeded(&self) -> Option<u32> {
        match self.tree_limit.load(Ordering::Relaxed) {
            0 => None,
            n => Some(n),
        }
    }
}

/// Persists the journal as calls start and finish (durable runs), so a host that dies mid-run can be
/// resumed: a call logged `Executing` but never `Applied` is the only one that runs again.
pub trait JournalSink: Send + Sync + std::fmt::Debug {
    /// Appends one entry as it is now (a call started, finished, suspended): the journal at rest is
    /// the entries in the order they were appended, a later one of an ordinal replacing an earlier
    /// one, so each call costs the same to persist however long the run. The bridge waits for it
    /// before calling the tool.
    fn record(&self, entry: JournalEntry) -> BoxFuture<'static, Result<(), String>>;
}

/// Keeps the journal's large values aside by their digest ([`Journaled::Spilled`]): a durable run's
/// checkpoint, a session's record. Without one, a large value is kept by digest only (a run that is
/// never replayed needs no more).
pub trait SpillStore: Send + Sync + std::fmt::Debug {
    /// Keeps `text` under `digest` (blake3 of it, hex).
    fn put(&self, digest: String, text: String) -> BoxFuture<'static, Result<(), String>>;
    /// The text kept under `digest`.
    fn get(&self, digest: String) -> BoxFuture<'static, Result<String, String>>;
}

/// What a resumed run replays: the previous attempt's journal and the decisions for its suspensions.
#[derive(Debug, Clone, Default)]
pub struct ReplayPlan {
    /// The journal of the previous attempt.
    pub journal: Journal,
    /// Decisions by suspension id.
    pub decisions: HashMap<String, Value>,
    /// The journal is a whole attempt's (a session cell that ran to its end): a call it has no entry
    /// for is a divergence, never made live.
    pub complete: bool,
}

#[derive(Debug)]
struct Replay {
    plan: ReplayPlan,
    consumed: Vec<bool>,
}

/// A suspension: the run waits for a decision.
#[derive(Debug, Clone, PartialEq)]
pub struct Suspension {
    /// Unique within the run.
    pub id: String,
    /// The tool that asked.
    pub tool: String,
    /// Its arguments, as JSON.
    pub args: Value,
}

/// Why a run's bridge stopped the run.
#[derive(Debug)]
#[non_exhaustive]
pub enum Stop {
    /// A tool asked for a decision.
    Suspended(Suspension),
    /// A resumed run called something other than what the journal recorded at this step.
    Diverged {
        /// The step (ordinal).
        step: u32,
        /// What the journal has there.
        recorded: String,
        /// What the code called.
        called: String,
    },
    /// The protocol was broken.
    Failed(Error),
}

enum Replayed {
    Result(Result<Journaled, ToolError>),
    /// The suspension's id, the decision (JSON text), and the suspended call's request when the call
    /// has not been resumed yet (a `Decided` entry already holds its result).
    Decision(String, String, Option<String>),
    Suspension(String, String),
    /// Not answered by the journal: call the tool.
    Live,
    Diverged(String),
}

/// Serves one call, the `arrival`-th of its attempt; `None` when the run is stopping and the call gets
/// no answer.
///
/// A call is journaled under its ordinal: the one the replayed journal has for it in a resumed run
/// (however the calls' arrival order changed), else a new one. Its id is `<run id>.<ordinal>`, so a
/// call made again keeps its id and no two calls of a run share one.
pub(crate) async fn dispatch(
    bridge: Arc<Shared>,
    id: u64,
    arrival: u32,
    name: String,
    mut args: ToolArgs,
) -> (u64, Option<Value>) {
    let n = bridge.stats.calls.fetch_add(1, Ordering::Relaxed) + 1;
    let tree_allows = bridge.budget.as_ref().is_none_or(|b| b.take());
    if n > bridge.config.max_calls || !tree_allows {
        bridge.stats.limit_exceeded.store(true, Ordering::Relaxed);
        let message = match (&bridge.budget, tree_allows) {
            (Some(budget), false) => {
                bridge
                    .stats
                    .tree_limit
                    .store(budget.max.max(1), Ordering::Relaxed);
                format!(
                    "this run and the runs nested with it made more than {} tool calls, their \
                     shared budget; batch work into fewer calls",
                    budget.max
                )
            }
            _ => format!(
                "the run made more than {} tool calls, its budget; batch work into fewer calls",
                bridge.config.max_calls
            ),
        };
        let error = ToolError::new("ToolCallLimit", message);
        return (id, Some(error_reply(id, &error)));
    }
    let (args_text, args_hash) = canonical_args(&args);
    let args_text = head(&args_text, ARGS_KEPT);
    let (replayed, journaled) = bridge.replayed(arrival, &name, &args_hash);
    let ordinal = journaled.unwrap_or_else(|| bridge.unjournaled_ordinal(arrival));
    if let Some(run_id) = &bridge.run_id {
        args.call_id = Some(format!("{run_id}.{ordinal}"));
    }
    let entry = |state| JournalEntry {
        ordinal,
        tool: name.clone(),
        args_hash: args_hash.clone(),
        args: args_text.clone(),
        state,
    };
    match replayed {
        Replayed::Result(result) => {
            // Already applied in an earlier attempt: re-recording it cannot lose anything.
            let _ = bridge
                .record(entry(CallState::Applied(result.clone())))
                .await;
            let text = match result {
                Ok(journaled) => match bridge.unspill(journaled).await {
                    Ok(text) => Ok(text),
                    Err(e) => {
                        let _ = bridge.stop.try_send(Stop::Failed(Error::Malformed(format!(
                            "the journal's result of call {ordinal} cannot be read back: {e}"
                        ))));
                        return (id, None);
                    }
                },
                Err(error) => Err(error),
            };
            return (id, Some(reply_of(id, text)));
        }
        Replayed::Decision(suspension_id, decision, request) => {
            // A tool that ran something suspendable continues it with the decision; for the others
            // (approvals) the decision is the result.
            let resumed = request.and_then(|request| {
                let tool = bridge.tools.get(&name)?;
                let request = serde_json::from_str(&request).unwrap_or(Value::Null);
                let decision = serde_json::from_str(&decision).unwrap_or(Value::Null);
                tool.resume(request, decision)
            });
            let result = match resumed {
                None => Ok(decision),
                Some(call) => match call.await {
                    Ok(value) => Ok(value.to_string()),
                    Err(error) if error.is_suspension() => {
                        bridge
                            .suspend(entry(CallState::Executing), suspension_id, error.message)
                            .await;
                        return (id, None);
                    }
                    Err(error) => Err(error),
                },
            };
            let state = match &result {
                Ok(text) => CallState::Decided {
                    id: suspension_id,
                    decision: text.clone(),
                },
                Err(error) => CallState::Applied(Err(error.clone())),
            };
            let _ = bridge.record(entry(state)).await;
            return (id, Some(reply_of(id, result)));
        }
        Replayed::Suspension(suspension_id, request) => {
            bridge
                .suspend(entry(CallState::Executing), suspension_id, request)
                .await;
            return (id, None);
        }
        Replayed::Diverged(recorded) => {
            let _ = bridge.stop.try_send(Stop::Diverged {
                step: arrival,
                recorded,
                called: format!("{name}({args_text})"),
            });
            return (id, None);
        }
        Replayed::Live => {}
    }

    let tool = bridge.tools.get(&name).cloned();
    if !tool.as_ref().is_some_and(|t| t.is_pure()) && name != ONCE_TOOL {
        bridge.stats.impure_calls.fetch_add(1, Ordering::Relaxed);
    }
    if name == ONCE_TOOL {
        // The value the code computed, journaled: a resumed run gets this one back.
        let value = args
            .get("value")
            .cloned()
            .unwrap_or(Value::Null)
            .to_string();
        let journaled = bridge.spilled(&value).await;
        if let Err(e) = bridge
            .record(entry(CallState::Applied(Ok(journaled))))
            .await
        {
            let error = ToolError::new(
                "OSError",
                format!("once(): the value could not be journaled: {e}"),
            );
            return (id, Some(error_reply(id, &error)));
        }
        return (id, Some(reply_of(id, Ok(value))));
    }
    let Some(tool) = tool else {
        let error = ToolError::new("NameError", format!("no tool named {name:?} on the host"));
        return (id, Some(error_reply(id, &error)));
    };
    if let Err(e) = bridge.record(entry(CallState::Executing)).await {
        let error = ToolError::new(
            "OSError",
            format!("the call was not made: its journal entry could not be kept: {e}"),
        );
        return (id, Some(error_reply(id, &error)));
    }
    // A call of a tree of runs holds one of the tree's slots while it runs (not a nested run_python:
    // the runs it starts take slots for their own calls, and holding one here could starve them).
    let _slot = match (&bridge.budget, tool.runs_nested()) {
        (Some(budget), false) => budget.in_flight.acquire().await.ok(),
        _ => None,
    };
    let timeout = bridge.config.call_timeout;
    let call = std::panic::AssertUnwindSafe(tool.call(args)).catch_unwind();
    let outcome = match tokio::time::timeout(timeout, call).await {
        Ok(Ok(Ok(value))) => Ok(value),
        Ok(Ok(Err(error))) => Err(error),
        Ok(Err(panic)) => Err(ToolError::new(
            "ToolError",
            format!("the tool's handler panicked: {}", panic_message(&panic)),
        )),
        Err(_) => Err(ToolError::new(
            "TimeoutError",
            format!("tool {name:?} did not answer within {timeout:?}"),
        )),
    };
    match outcome {
        Err(error) if error.is_suspension() => {
            let previous = bridge.journal.lock().map_or(0, |j| j.suspension_count());
            if previous + 1 > bridge.config.max_suspensions {
                let error = ToolError::new(
                    "RuntimeError",
                    format!(
                        "the run reached its limit of {} suspensions; ask for fewer decisions",
                        bridge.config.max_suspensions
                    ),
                );
                let _ = bridge
                    .record(entry(CallState::Applied(Err(error.clone()))))
                    .await;
                return (id, Some(error_reply(id, &error)));
            }
            // What the tool asked (its suspend payload) is what the person sees and what resume gets.
            bridge
                .suspend(
                    entry(CallState::Executing),
                    format!("s{ordinal}"),
                    error.message,
                )
                .await;
            (id, None)
        }
        outcome => {
            let result = outcome.map(|v| v.to_string());
            let journaled = match &result {
                Ok(text) => Ok(bridge.spilled(text).await),
                Err(error) => Err(error.clone()),
            };
            let _ = bridge.record(entry(CallState::Applied(journaled))).await;
            (id, Some(reply_of(id, result)))
        }
    }
}

impl Shared {
    /// What the previous attempt's journal says about the `ordinal`-th call of this attempt, if this is
    /// a resumed run, and the ordinal of the journal's entry for it when it has one.
    fn replayed(&self, ordinal: u32, tool: &str, hash: &str) -> (Replayed, Option<u32>) {
        let Some(replay) = &self.replay else {
            return (Replayed::Live, None);
        };
        let Ok(mut replay) = replay.lock() else {
            return (Replayed::Live, None);
        };
        let Replay { plan, consumed } = &mut *replay;
        let matches =
            |e: &JournalEntry| e.tool == tool && (tool == ONCE_TOOL || e.args_hash == hash);
        // The entry at this step; else, for calls made concurrently (gather) whose arrival order changed,
        // an unconsumed identical call elsewhere in the journal.
        let at_step = match plan.journal.entries.get(ordinal as usize) {
            Some(e) if e.ordinal == ordinal => Some(ordinal as usize),
            _ => plan
                .journal
                .entries
                .iter()
                .position(|e| e.ordinal == ordinal),
        };
        let index = match at_step {
            Some(i) if !consumed[i] && matches(&plan.journal.entries[i]) => Some(i),
            _ => plan
                .journal
                .entries
                .iter()
                .enumerate()
                .position(|(i, e)| !consumed[i] && matches(e)),
        };
        let Some(index) = index else {
            let replayed = match at_step {
                Some(i) if !consumed[i] => {
                    let e = &plan.journal.entries[i];
                    Replayed::Diverged(format!("{}({})", e.tool, e.args))
                }
                _ if plan.complete => Replayed::Diverged("no further call".into()),
                _ => Replayed::Live,
            };
            return (replayed, None);
        };
        consumed[index] = true;
        let journaled = &plan.journal.entries[index];
        let replayed = match &journaled.state {
            CallState::Applied(result) => Replayed::Result(result.clone()),
            CallState::Decided { id, decision } => {
                Replayed::Decision(id.clone(), decision.clone(), None)
            }
            CallState::Suspended { id, request } => match plan.decisions.get(id) {
                Some(decision) => {
                    Replayed::Decision(id.clone(), decision.to_string(), Some(request.clone()))
                }
                None => Replayed::Suspension(id.clone(), request.clone()),
            },
            // Started but never finished: the host died during it. It is the one call made again.
            CallState::Executing => Replayed::Live,
        };
        (replayed, Some(journaled.ordinal))
    }

    /// Journals the call as suspended with `request` (what the tool asked) and stops the run for it.
    async fn suspend(&self, entry: JournalEntry, id: String, request: String) {
        let suspension = Suspension {
            id: id.clone(),
            tool: entry.tool.clone(),
            args: serde_json::from_str(&request).unwrap_or(Value::Null),
        };
        let state = CallState::Suspended { id, request };
        // The run stops either way; a journal that could not be kept makes the resume re-run the call.
        let _ = self.record(JournalEntry { state, ..entry }).await;
        let _ = self.stop.try_send(Stop::Suspended(suspension));
    }

    /// Adds or updates this call's entry and, for durable runs, appends it to the journal at rest.
    /// Ordinals are dense from 0, so an entry lives at its ordinal's index (concurrent calls may finish
    /// out of order: placeholders keep indexes equal to ordinals): O(1) per call, in memory and at rest.
    async fn record(&self, entry: JournalEntry) -> Result<(), String> {
        let appended = self.sink.as_ref().map(|_| entry.clone());
        {
            let Ok(mut journal) = self.journal.lock() else {
                return Err("the journal lock is poisoned".into());
            };
            journal.apply(entry);
        }
        match (&self.sink, appended) {
            (Some(sink), Some(entry)) => sink.record(entry).await,
            _ => Ok(()),
        }
    }

    /// `text` as the journal keeps it: inline when small, else by digest, the text handed to the spill
    /// store (a value it could not keep is still journaled by digest: a replay then fails clearly
    /// rather than answering with something else).
    async fn spilled(&self, text: &str) -> Journaled {
        let journaled = Journaled::of(text, self.config.spill_threshold);
        if let (Journaled::Spilled { digest, .. }, Some(spill)) = (&journaled, &self.spill) {
            let _ = spill.put(digest.clone(), text.to_owned()).await;
        }
        journaled
    }

    /// The text of a journaled result, read back from the spill store when it was spilled.
    async fn unspill(&self, journaled: Journaled) -> Result<String, String> {
        match journaled {
            Journaled::Inline(text) => Ok(text),
            Journaled::Spilled { digest, .. } => match &self.spill {
                Some(spill) => spill.get(digest).await,
                None => Err(format!(
                    "it was kept by its digest {digest} only, in no store"
                )),
            },
        }
    }
}

fn reply_of(id: u64, result: Result<String, ToolError>) -> Value {
    match result {
        Ok(text) => {
            json!({"type": "result", "id": id, "result": serde_json::from_str::<Value>(&text).unwrap_or(Value::Null)})
        }
        Err(error) => error_reply(id, &error),
    }
}

pub(crate) fn error_reply(id: u64, error: &ToolError) -> Value {
    json!({"type": "result", "id": id, "error": {"type": error.kind, "message": error.message}})
}

fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a non-string panic payload".into())
}
