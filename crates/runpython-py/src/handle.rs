//! A run in progress (`RunPython.start`): its events, iterated with `for` or `async for`, cancellation,
//! and the envelope (`wait()` or `await handle`).
//!
//! Events merge the core's stream (stdout, stderr, dependency progress, a durable run's id, calls of
//! tools that are not Python callables) with the calls of Python tools, which the tools report
//! through the run's context with their arguments and results. Dropping the handle stops the run.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use pyo3::exceptions::PyStopAsyncIteration;
use pyo3::prelude::*;
use runpython_core::{DepsProgress, Envelope, Error, Event, RunHandle};
use serde_json::{json, Value};
use tokio::sync::mpsc::UnboundedReceiver;
use tokio::sync::{Mutex, Notify};

use crate::convert::{py_repr, to_py};
use crate::envelope::PyEnvelope;
use crate::errors::to_py_err;
use crate::events::{result_json, EventData};
use crate::runtime::block_on;

/// One event of a run: `kind` is `"stdout"` or `"stderr"` (with `text`), `"dependencies"` (with
/// `data["step"]`: `cached`, `waiting`, `resolving`, `downloading`, `installing`, `done`),
/// `"resumable"` (a durable run's `data["run_id"]`, before the code starts: `resume` it if this host
/// stops), `"tool_call"` (`data`: `id`, `name`, `arguments`; only `name` for tools that are not
/// Python callables, such as approvals and nested `run_python`) or `"tool_result"` (`data`: `id`,
/// `name`, `ok`, `result` or `error`, `duration_ms`; Python callables only). `"other"` is an event
/// of a newer core this package does not know yet (its debug form in `text`).
#[pyclass(frozen, module = "runpython", name = "Event")]
pub(crate) struct PyEvent {
    kind: &'static str,
    text: Option<String>,
    data: Option<Value>,
}

impl From<EventData> for PyEvent {
    fn from(event: EventData) -> Self {
        match event {
            EventData::Core(Event::Stdout(text)) => Self {
                kind: "stdout",
                text: Some(text),
                data: None,
            },
            EventData::Core(Event::Stderr(text)) => Self {
                kind: "stderr",
                text: Some(text),
                data: None,
            },
            EventData::Core(Event::Dependencies(step)) => {
                let data = progress_json(&step);
                Self {
                    kind: "dependencies",
                    text: Some(progress_text(&data)),
                    data: Some(data),
                }
            }
            EventData::Core(Event::Resumable { run_id }) => Self {
                kind: "resumable",
                text: Some(format!("durable run {run_id}")),
                data: Some(json!({"run_id": run_id})),
            },
            EventData::Core(Event::ToolCall { name }) => Self {
                kind: "tool_call",
                text: None,
                data: Some(json!({"name": name})),
            },
            EventData::Core(other) => Self {
                kind: "other",
                text: Some(format!("{other:?}")),
                data: None,
            },
            EventData::ToolCall {
                id,
                name,
                arguments,
            } => Self {
                kind: "tool_call",
                text: None,
                data: Some(json!({"id": id, "name": name, "arguments": arguments})),
            },
            EventData::ToolResult {
                id,
                name,
                result,
                duration_ms,
            } => {
                let mut data = result_json(&result);
                if let Some(map) = data.as_object_mut() {
                    map.insert("id".into(), json!(id));
                    map.insert("name".into(), json!(name));
                    map.insert(
                        "duration_ms".into(),
                        json!((duration_ms * 1000.0).round() / 1000.0),
                    );
                }
                Self {
                    kind: "tool_result",
                    text: None,
                    data: Some(data),
                }
            }
        }
    }
}

fn progress_json(step: &DepsProgress) -> Value {
    match step {
        DepsProgress::Cached { key } => json!({"step": "cached", "key": key}),
        DepsProgress::Waiting { key } => json!({"step": "waiting", "key": key}),
        DepsProgress::Resolving { specs } => json!({"step": "resolving", "specs": specs}),
        DepsProgress::Downloading { detail } => json!({"step": "downloading", "detail": detail}),
        DepsProgress::Installing { detail } => json!({"step": "installing", "detail": detail}),
        DepsProgress::Done { key, elapsed } => {
            json!({"step": "done", "key": key, "elapsed_ms": elapsed.as_millis() as u64})
        }
        other => json!({"step": "other", "detail": format!("{other:?}")}),
    }
}

fn progress_text(data: &Value) -> String {
    let step = data["step"].as_str().unwrap_or("other");
    match step {
        "resolving" => format!(
            "resolving {}",
            data["specs"]
                .as_array()
                .map(|s| s
                    .iter()
                    .filter_map(Value::as_str)
                    .collect::<Vec<_>>()
                    .join(", "))
                .unwrap_or_default()
        ),
        "downloading" | "installing" | "other" => {
            format!("{step} {}", data["detail"].as_str().unwrap_or_default())
        }
        "done" => format!("environment ready in {} ms", data["elapsed_ms"]),
        _ => format!("environment {step}"),
    }
}

#[pymethods]
impl PyEvent {
    #[getter]
    fn kind(&self) -> &'static str {
        self.kind
    }
    /// The text of an output event; a one-line summary of a dependency step.
    #[getter]
    fn text(&self) -> Option<&str> {
        self.text.as_deref()
    }
    /// The structured part of a dependency or tool event, as a dict.
    #[getter]
    fn data(&self, py: Python<'_>) -> PyResult<Option<Py<PyAny>>> {
        self.data.as_ref().map(|d| to_py(py, d)).transpose()
    }
    fn __repr__(&self) -> String {
        match (&self.text, &self.data) {
            (Some(text), _) => {
                format!("Event(kind={}, text={})", py_repr(self.kind), py_repr(text))
            }
            (None, Some(data)) => format!("Event(kind={}, data={data})", py_repr(self.kind)),
            (None, None) => format!("Event(kind={})", py_repr(self.kind)),
        }
    }
}

struct State {
    core: Option<RunHandle>,
    /// Python tools: the core's bare announcement of their calls is dropped (they report their own).
    python_tools: Arc<[String]>,
    tool_events: UnboundedReceiver<EventData>,
    core_done: bool,
    tools_done: bool,
    outcome: Option<Result<Envelope, Arc<Error>>>,
}

pub(crate) struct Shared {
    state: Mutex<State>,
    cancel_requested: AtomicBool,
    cancel_notify: Notify,
}

impl Shared {
    pub fn new(
        core: RunHandle,
        tool_events: UnboundedReceiver<EventData>,
        python_tools: Arc<[String]>,
    ) -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::new(State {
                core: Some(core),
                python_tools,
                tool_events,
                core_done: false,
                tools_done: false,
                outcome: None,
            }),
            cancel_requested: AtomicBool::new(false),
            cancel_notify: Notify::new(),
        })
    }

    /// The next event, or `None` once the run has ended and every event was delivered.
    async fn next(&self) -> Option<EventData> {
        let mut guard = self.state.lock().await;
        let state = &mut *guard;
        loop {
            let Some(core) = state.core.as_mut() else {
                return None; // waited for: its events were consumed
            };
            if self.cancel_requested.load(Ordering::SeqCst) {
                core.cancel();
            }
            if state.core_done {
                // Tool events still queued; one sent after the run ended is dropped.
                return state.tool_events.try_recv().ok();
            }
            let tools_done = state.tools_done;
            tokio::select! {
                biased;
                () = self.cancel_notify.notified() => {}
                event = core.next_event() => match event {
                    Some(Event::ToolCall { name }) if state.python_tools.contains(&name) => {}
                    Some(event) => return Some(EventData::Core(event)),
                    None => state.core_done = true,
                },
                event = state.tool_events.recv(), if !tools_done => match event {
                    Some(event) => return Some(event),
                    None => state.tools_done = true,
                },
            }
        }
    }

    /// The envelope: the remaining events are discarded (while honouring a cancellation), then the
    /// run's result, kept for later calls.
    async fn wait(&self) -> Result<Envelope, Arc<Error>> {
        while self.next().await.is_some() {}
        let mut state = self.state.lock().await;
        if let Some(outcome) = &state.outcome {
            return outcome.clone();
        }
        let outcome = match state.core.take() {
            Some(core) => core.wait().await.map_err(Arc::new),
            None => Err(Arc::new(Error::Cancelled)),
        };
        state.outcome = Some(outcome.clone());
        outcome
    }

    fn cancel(&self) {
        self.cancel_requested.store(true, Ordering::SeqCst);
        self.cancel_notify.notify_one(); // wakes a waiting `next` (or leaves it a permit)
        if let Ok(mut state) = self.state.try_lock() {
            if let Some(core) = state.core.as_mut() {
                core.cancel();
            }
        }
    }
}

/// A run in progress. Iterate it (`for ev in handle` or `async for ev in handle`) for its events;
/// `wait()` or `await handle` for the envelope; `cancel()` to stop it (then waiting raises
/// `runpython.CancelledError`). Dropping the handle stops the run and kills its processes.
#[pyclass(frozen, module = "runpython", name = "RunHandle")]
pub(crate) struct PyRunHandle {
    shared: Arc<Shared>,
}

impl PyRunHandle {
    pub fn new(shared: Arc<Shared>) -> Self {
        Self { shared }
    }
}

fn envelope_or_err(outcome: Result<Envelope, Arc<Error>>) -> PyResult<PyEnvelope> {
    outcome.map(PyEnvelope::from).map_err(|e| to_py_err(&e))
}

#[pymethods]
impl PyRunHandle {
    fn __iter__(slf: Py<Self>) -> Py<Self> {
        slf
    }
    fn __next__(&self, py: Python<'_>) -> PyResult<Option<PyEvent>> {
        let shared = Arc::clone(&self.shared);
        Ok(block_on(py, async move { shared.next().await })?.map(PyEvent::from))
    }
    fn __aiter__(slf: Py<Self>) -> Py<Self> {
        slf
    }
    fn __anext__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let shared = Arc::clone(&self.shared);
        pyo3_async_runtimes::tokio::future_into_py(py, async move {
            match shared.next().await {
                Some(event) => Ok(PyEvent::from(event)),
                None => Err(PyStopAsyncIteration::new_err(())),
            }
        })
    }
    /// Stops the run: its processes are killed, and waiting raises `runpython.CancelledError`.
    fn cancel(&self) {
        self.shared.cancel();
    }
    /// Waits for the envelope (events not yet read are discarded), with the GIL released.
    fn wait(&self, py: Python<'_>) -> PyResult<PyEnvelope> {
        let shared = Arc::clone(&self.shared);
        envelope_or_err(block_on(py, async move { shared.wait().await })?)
    }
    fn __await__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let shared = Arc::clone(&self.shared);
        pyo3_async_runtimes::tokio::future_into_py(py, async move {
            envelope_or_err(shared.wait().await)
        })?
        .call_method0("__await__")
    }
    fn __repr__(&self) -> &'static str {
        "<runpython.RunHandle>"
    }
}
