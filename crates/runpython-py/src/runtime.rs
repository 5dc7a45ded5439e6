//! The Tokio runtime runs execute on, how sync calls wait for them, and the per-run context tool calls
//! read (which event loop runs `async def` tools, where tool events go).

use std::future::Future;
use std::mem::ManuallyDrop;
use std::ops::Deref;
use std::sync::mpsc::{sync_channel, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use tokio::sync::mpsc::UnboundedSender;

use crate::errors::internal;
use crate::events::EventData;

/// How often a sync wait looks for signals (Ctrl-C) while the GIL is released.
const SIGNAL_POLL: Duration = Duration::from_millis(50);

/// The process's runtime (pyo3-async-runtimes': multi-threaded, built on first use).
pub(crate) fn runtime() -> &'static tokio::runtime::Runtime {
    pyo3_async_runtimes::tokio::get_runtime()
}

/// A value of the core's dropped with the runtime entered. Python frees objects on whatever thread
/// drops the last reference, usually one that never entered the runtime, and the core's cleanup on
/// drop may spawn blocking tasks (a session's or a pooled interpreter's run directory is removed off
/// the critical path), which needs a runtime.
pub(crate) struct InRuntime<T>(ManuallyDrop<T>);

impl<T> InRuntime<T> {
    pub fn new(value: T) -> Self {
        Self(ManuallyDrop::new(value))
    }
}

impl<T> Deref for InRuntime<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

impl<T> Drop for InRuntime<T> {
    fn drop(&mut self) {
        let _entered = runtime().enter();
        // SAFETY: dropped exactly once, here, and never used again: `self` is being dropped.
        unsafe { ManuallyDrop::drop(&mut self.0) }
    }
}

/// Aborts the task when dropped: a sync caller interrupted by a signal drops the run, which kills it.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Runs `future` on the runtime and waits for it with the GIL released. A signal handler that raises
/// (Ctrl-C's `KeyboardInterrupt`) stops the wait and drops the future. Works from any thread,
/// including the runtime's own (a sync tool that starts a run).
pub(crate) fn block_on<T, F>(py: Python<'_>, future: F) -> PyResult<T>
where
    T: Send + 'static,
    F: Future<Output = T> + Send + 'static,
{
    let (tx, rx) = sync_channel(1);
    let _task = AbortOnDrop(runtime().spawn(async move {
        let _ = tx.send(future.await);
    }));
    let mut rx = rx;
    loop {
        // The receiver goes into the detached closure and back: it is Send, not Sync.
        let (received, back) = py.detach(move || (rx.recv_timeout(SIGNAL_POLL), rx));
        rx = back;
        match received {
            Ok(value) => return Ok(value),
            Err(RecvTimeoutError::Timeout) => py.check_signals()?,
            Err(RecvTimeoutError::Disconnected) => {
                return Err(internal(
                    "the run's task ended without a result (it panicked); please report this",
                ))
            }
        }
    }
}

/// What the tools of one run need from whoever started it.
pub(crate) struct RunContext {
    /// The asyncio loop `async def` tools run on.
    pub event_loop: Py<PyAny>,
    /// The caller's `contextvars.Context` (a copy), entered by each tool call (copied again per call).
    pub context: Py<PyAny>,
    /// Where tool-call events go, for a run started with `start`.
    pub events: Option<UnboundedSender<EventData>>,
}

tokio::task_local! {
    static RUN_CONTEXT: Arc<RunContext>;
}

impl RunContext {
    /// For a call made from Python: the running asyncio loop of this thread if there is one (an
    /// `arun`, or a `start` inside a coroutine), else the private loop; the caller's context either way.
    pub fn here(py: Python<'_>, events: Option<UnboundedSender<EventData>>) -> PyResult<Arc<Self>> {
        let asyncio = py.import("asyncio")?;
        let running = asyncio.call_method0("_get_running_loop")?;
        let event_loop = if running.is_none() {
            private_loop(py)?
        } else {
            running.unbind()
        };
        Self::with_loop(py, event_loop, events)
    }

    /// For a sync call: the private loop, even when this thread runs an asyncio loop (that loop is
    /// blocked by the sync call, and a tool scheduled on it would never run).
    pub fn private(py: Python<'_>) -> PyResult<Arc<Self>> {
        Self::with_loop(py, private_loop(py)?, None)
    }

    fn with_loop(
        py: Python<'_>,
        event_loop: Py<PyAny>,
        events: Option<UnboundedSender<EventData>>,
    ) -> PyResult<Arc<Self>> {
        let context = py
            .import("contextvars")?
            .call_method0("copy_context")?
            .unbind();
        Ok(Arc::new(Self {
            event_loop,
            context,
            events,
        }))
    }

    /// The context of the run whose tool is being called, if it was started through this module.
    pub fn current() -> Option<Arc<Self>> {
        RUN_CONTEXT.try_with(Arc::clone).ok()
    }

    /// `future` with this context visible to the tools it calls.
    pub fn scope<F: Future>(self: Arc<Self>, future: F) -> impl Future<Output = F::Output> {
        RUN_CONTEXT.scope(self, future)
    }
}

/// The loop that runs `async def` tools for sync calls: one per process, on a daemon thread started on
/// first use (`runpython._tools.private_loop`).
pub(crate) fn private_loop(py: Python<'_>) -> PyResult<Py<PyAny>> {
    Ok(tools_module(py)?.call_method0("private_loop")?.unbind())
}

/// A coroutine that calls `start` when it is first awaited, and awaits the asyncio future `start`
/// returns. Starting late matters: `asyncio.run(rp.arun(...))` calls `arun` before the loop runs, and
/// the run needs the running loop (its tools use it; the future is completed on it). Cancelling the
/// coroutine's task cancels the future, and so the run.
pub(crate) fn deferred<'py, S>(py: Python<'py>, start: S) -> PyResult<Bound<'py, PyAny>>
where
    S: for<'a> FnOnce(Python<'a>) -> PyResult<Bound<'a, PyAny>> + Send + 'static,
{
    let start = Start(Mutex::new(Some(Box::new(start))));
    tools_module(py)?.call_method1("deferred", (start,))
}

type StartFn = Box<dyn for<'a> FnOnce(Python<'a>) -> PyResult<Bound<'a, PyAny>> + Send>;

/// The start of a deferred async call; callable once.
#[pyclass(frozen)]
struct Start(Mutex<Option<StartFn>>);

#[pymethods]
impl Start {
    fn __call__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let start = self.0.lock().ok().and_then(|mut s| s.take());
        match start {
            Some(start) => start(py),
            None => Err(pyo3::exceptions::PyRuntimeError::new_err(
                "cannot reuse an already awaited coroutine",
            )),
        }
    }
}

/// `runpython._tools`, imported once.
pub(crate) fn tools_module(py: Python<'_>) -> PyResult<&Bound<'_, PyModule>> {
    static MODULE: PyOnceLock<Py<PyModule>> = PyOnceLock::new();
    MODULE
        .get_or_try_init(py, || Ok(py.import("runpython._tools")?.unbind()))
        .map(|m| m.bind(py))
}
