//! Python callables as bridge tools. `runpython._tools.describe` reads a callable's name, docstring,
//! signature and hints into a JSON Schema and an invoker that checks arguments against the hints;
//! [`PyTool`] serves the bridge's calls with it, in the host process, outside the sandbox.
//!
//! A plain callable runs on the runtime's blocking pool (it may block; it holds the GIL while it runs
//! Python). An `async def` one is scheduled on the run's event loop ([`RunContext`]) and awaited without
//! a thread; when the run ends first (timeout, cancellation) its task is cancelled. An exception
//! becomes a [`ToolError`] named after its class, which the code sees raised with that name and
//! message; `runpython.Suspend(request)` suspends the run instead.
//!
//! A call's idempotency key (`ToolArgs::call_id`, `<run id>.<ordinal>`) reaches the callable through a
//! context variable, `runpython.current_call_id()`, set in the call's own copy of the caller's context:
//! no signature gains a meaning it did not have (a parameter named `call_id` stays the model's), it
//! is the same for plain and `async def` tools, and helpers the tool calls can read it too.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use runpython_core::{Tool, ToolArgs, ToolError};
use serde_json::{Map, Value};
use tokio::sync::oneshot;

use crate::convert::{to_json, type_name};
use crate::errors::config;
use crate::events::EventData;
use crate::runtime::{private_loop, tools_module, RunContext};

/// What a tool call resolves to (the bridge's own result type).
type CallResult = Result<Value, ToolError>;

/// The future a tool returns, spelled out: the bridge's `BoxFuture<T>` and
/// `futures_util::future::BoxFuture<'static, T>` are both this type, so either alias fits.
type CallFuture = Pin<Box<dyn Future<Output = CallResult> + Send + 'static>>;

/// A Python callable exposed to the code.
pub(crate) struct PyTool {
    name: String,
    description: String,
    schema: Value,
    pure: bool,
    is_async: bool,
    invoker: Arc<Py<PyAny>>,
}

impl std::fmt::Debug for PyTool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PyTool")
            .field("name", &self.name)
            .field("async", &self.is_async)
            .finish_non_exhaustive()
    }
}

impl PyTool {
    /// Describes `object` (a callable, or a `runpython.Tool` wrapping one) through
    /// `runpython._tools.describe`; a callable that cannot be a tool is a `ConfigError` naming it.
    pub fn from_python(object: &Bound<'_, PyAny>) -> PyResult<Self> {
        let py = object.py();
        let described = tools_module(py)?
            .call_method1("describe", (object,))
            .map_err(|e| {
                if e.is_instance_of::<crate::errors::RunPythonError>(py) {
                    e
                } else {
                    config(format!(
                        "{} cannot be a tool: {}",
                        crate::convert::short_repr(object),
                        e.value(py)
                    ))
                }
            })?;
        let schema = to_json(&described.getattr("schema")?)
            .map_err(|e| config(format!("the schema of a tool is not JSON: {e}")))?;
        Ok(Self {
            name: described.getattr("name")?.extract()?,
            description: described.getattr("description")?.extract()?,
            schema,
            pure: described.getattr("pure")?.extract()?,
            is_async: described.getattr("is_async")?.extract()?,
            invoker: Arc::new(described.getattr("invoker")?.unbind()),
        })
    }
}

/// Numbers tool-call events so a result can be matched to its call.
static CALL_IDS: AtomicU64 = AtomicU64::new(1);

impl Tool for PyTool {
    fn name(&self) -> &str {
        &self.name
    }
    fn description(&self) -> &str {
        &self.description
    }
    fn input_schema(&self) -> Option<&Value> {
        Some(&self.schema)
    }
    fn is_pure(&self) -> bool {
        self.pure
    }
    fn typed_values(&self) -> bool {
        true // a Python callable takes and gives Python values: exactly, through the tagged codec
    }
    fn call(&self, args: ToolArgs) -> CallFuture {
        // Read now: `call` runs inside the run's task, where the caller's context is in scope.
        let context = RunContext::current();
        let invoker = Arc::clone(&self.invoker);
        let name = self.name.clone();
        let is_async = self.is_async;
        Box::pin(async move {
            let events = context.as_ref().and_then(|c| c.events.clone());
            let id = CALL_IDS.fetch_add(1, Ordering::Relaxed);
            if let Some(events) = &events {
                let _ = events.send(EventData::ToolCall {
                    id,
                    name: name.clone(),
                    arguments: Value::Object(args.kwargs.clone()),
                });
            }
            let started = Instant::now();
            let result = if is_async {
                call_async(invoker, context, args.kwargs, args.call_id).await
            } else {
                call_sync(invoker, context, args.kwargs, args.call_id).await
            };
            if let Some(events) = &events {
                let _ = events.send(EventData::ToolResult {
                    id,
                    name,
                    result: result.clone(),
                    duration_ms: started.elapsed().as_secs_f64() * 1e3,
                });
            }
            result
        })
    }
}

/// The error a call gets when the host's interpreter is shutting down.
fn shutting_down() -> ToolError {
    ToolError::new(
        "RuntimeError",
        "the host's Python interpreter is shutting down",
    )
}

/// The loop and the context a call runs with: the run's, or the private loop and a fresh context
/// for a call outside any run started here.
fn loop_and_context(
    py: Python<'_>,
    context: Option<&Arc<RunContext>>,
) -> PyResult<(Py<PyAny>, Py<PyAny>)> {
    let (event_loop, base) = match context {
        Some(c) => (c.event_loop.clone_ref(py), c.context.bind(py).clone()),
        None => (
            private_loop(py)?,
            py.import("contextvars")?.call_method0("copy_context")?,
        ),
    };
    // A copy per call: one Context cannot be entered by two threads at once.
    Ok((event_loop, base.call_method0("copy")?.unbind()))
}

async fn call_sync(
    invoker: Arc<Py<PyAny>>,
    context: Option<Arc<RunContext>>,
    kwargs: Map<String, Value>,
    call_id: Option<String>,
) -> CallResult {
    let joined = tokio::task::spawn_blocking(move || {
        Python::try_attach(|py| {
            let run = || -> PyResult<Bound<'_, PyAny>> {
                let (event_loop, ctx) = loop_and_context(py, context.as_ref())?;
                let kwargs = crate::values::decode(py, &Value::Object(kwargs))?;
                invoker
                    .bind(py)
                    .call_method1("call", (kwargs, event_loop, ctx, call_id))
            };
            match run() {
                Ok(value) => result_to_json(invoker.bind(py), &value),
                Err(e) => Err(tool_error(py, &e)),
            }
        })
        .unwrap_or_else(|| Err(shutting_down()))
    })
    .await;
    joined.unwrap_or_else(|e| {
        Err(ToolError::new(
            "RuntimeError",
            format!("the tool's thread failed: {e}"),
        ))
    })
}

async fn call_async(
    invoker: Arc<Py<PyAny>>,
    context: Option<Arc<RunContext>>,
    kwargs: Map<String, Value>,
    call_id: Option<String>,
) -> CallResult {
    let (tx, rx) = oneshot::channel();
    let submitted = tokio::task::spawn_blocking(move || {
        Python::try_attach(|py| {
            let run = || -> PyResult<Py<PyAny>> {
                let (event_loop, ctx) = loop_and_context(py, context.as_ref())?;
                let kwargs = crate::values::decode(py, &Value::Object(kwargs))?;
                let done = Py::new(
                    py,
                    Completer {
                        tx: Mutex::new(Some(tx)),
                        invoker: invoker.clone_ref(py),
                    },
                )?;
                Ok(invoker
                    .bind(py)
                    .call_method1("submit", (kwargs, event_loop, ctx, call_id, done))?
                    .unbind())
            };
            run().map_err(|e| tool_error(py, &e))
        })
        .unwrap_or_else(|| Err(shutting_down()))
    })
    .await;
    let pending = match submitted {
        Ok(Ok(pending)) => pending,
        Ok(Err(e)) => return Err(e),
        Err(e) => {
            return Err(ToolError::new(
                "RuntimeError",
                format!("the tool's thread failed: {e}"),
            ))
        }
    };
    let mut guard = CancelOnDrop(Some(pending));
    let result = rx.await.unwrap_or_else(|_| {
        Err(ToolError::new(
            "RuntimeError",
            "the event loop running this async tool stopped before the call finished",
        ))
    });
    guard.0 = None;
    result
}

/// Cancels the call's asyncio task when the run stops waiting for it (timeout, cancellation).
struct CancelOnDrop(Option<Py<PyAny>>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        let Some(pending) = self.0.take() else {
            return;
        };
        let cancel = move || {
            Python::try_attach(|py| {
                let _ = pending.bind(py).call_method0("cancel");
            });
        };
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => {
                handle.spawn_blocking(cancel);
            }
            Err(_) => cancel(),
        }
    }
}

/// Called on the event loop's thread with the finished task of an async call.
#[pyclass(frozen)]
struct Completer {
    tx: Mutex<Option<oneshot::Sender<CallResult>>>,
    invoker: Py<PyAny>,
}

#[pymethods]
impl Completer {
    fn __call__(&self, task: &Bound<'_, PyAny>) {
        let py = task.py();
        let result = match task.call_method0("result") {
            Ok(value) => result_to_json(self.invoker.bind(py), &value),
            Err(e) => Err(tool_error(py, &e)),
        };
        if let Some(tx) = self.tx.lock().ok().and_then(|mut tx| tx.take()) {
            let _ = tx.send(result);
        }
    }
}

/// The callable's return value as tagged JSON (exact: a tuple stays a tuple, a datetime a datetime),
/// with the invoker's `jsonable` for what the codec has no form for (pydantic models, enums, ...).
fn result_to_json(invoker: &Bound<'_, PyAny>, value: &Bound<'_, PyAny>) -> CallResult {
    let py = value.py();
    let jsonable = invoker
        .getattr("jsonable")
        .map_err(|e| tool_error(py, &e))?;
    crate::values::encode(value, Some(&jsonable)).map_err(|e| {
        let why = e.value(py).to_string();
        ToolError::new(
            "TypeError",
            format!(
                "the tool returned a {} that cannot cross into the run: {why}",
                type_name(value)
            ),
        )
    })
}

/// The `ToolError` for an exception the callable (or the argument check) raised: its class name and
/// message; `runpython.Suspend` becomes a suspension carrying its request.
pub(crate) fn tool_error(py: Python<'_>, error: &PyErr) -> ToolError {
    let value = error.value(py);
    if is_suspend(py, value) {
        let request = value
            .getattr("request")
            .ok()
            .and_then(|r| to_json(&r).ok())
            .unwrap_or(Value::Null);
        return ToolError::suspend(request);
    }
    let kind = error
        .get_type(py)
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "Exception".into());
    let message = value
        .str()
        .map(|s| s.to_string())
        .unwrap_or_else(|_| String::new());
    ToolError::new(kind, message)
}

fn is_suspend(py: Python<'_>, value: &Bound<'_, pyo3::exceptions::PyBaseException>) -> bool {
    static SUSPEND: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    SUSPEND
        .get_or_try_init(py, || {
            Ok::<_, PyErr>(tools_module(py)?.getattr("Suspend")?.unbind())
        })
        .ok()
        .is_some_and(|class| value.is_instance(class.bind(py)).unwrap_or(false))
}
