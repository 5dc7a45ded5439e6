//! `Session` (`RunPython.session()`): cells run in one long-lived sandboxed interpreter, sync and async,
//! as a context manager (`with` and `async with`) that closes the session on exit.
//!
//! It wraps `runpython_core::Session`; a cell is a run routed to the session, so its tools get the
//! same `RunContext` as `RunPython.run`'s, and `start` uses the engine's `start_in` (what the core
//! `Session::start` does, inside that context).

use std::sync::Arc;

use pyo3::prelude::*;
use pyo3_async_runtimes::tokio::future_into_py;
use runpython_core::{RunPython, RunRequest, Session};

use crate::convert::py_repr;
use crate::envelope::PyEnvelope;
use crate::errors::py_err;
use crate::handle::{PyRunHandle, Shared};
use crate::request::{request, RequestArgs};
use crate::runtime::{block_on, deferred, runtime, tools_module, InRuntime, RunContext};

/// A session: state kept across cells in one long-lived sandboxed interpreter.
#[pyclass(frozen, module = "runpython", name = "Session")]
pub(crate) struct PySession {
    engine: InRuntime<RunPython>,
    inner: InRuntime<Session>,
    tool_names: Arc<[String]>,
}

impl PySession {
    pub fn new(engine: RunPython, inner: Session, tool_names: Arc<[String]>) -> Self {
        Self {
            engine: InRuntime::new(engine),
            inner: InRuntime::new(inner),
            tool_names,
        }
    }

    /// A cell's request from `run`'s arguments, routed to this session.
    fn cell(
        &self,
        code: &Bound<'_, PyAny>,
        args: RequestArgs<'_, '_>,
        repr: bool,
    ) -> PyResult<RunRequest> {
        let mut request = request(code, args)?.session(self.inner.id());
        request.repr = repr;
        Ok(request)
    }
}

#[pymethods]
impl PySession {
    /// The session's id: `RunPython.session(id)` on an engine sharing the store finds it again.
    #[getter]
    fn id(&self) -> &str {
        self.inner.id()
    }

    /// Runs a cell to its end and returns its envelope (`session_id`, `cell`, `restored` set). State
    /// (variables, imports, functions) carries over from the cells before. `repr=True` also returns
    /// the value as a REPL prints it (`return_repr`).
    #[pyo3(signature = (
        code, *, inputs = None, dependencies = None, input_artifacts = None, env = None, repr = false,
        files = None
    ))]
    #[allow(clippy::too_many_arguments)] // one parameter per Python keyword argument
    fn run(
        &self,
        py: Python<'_>,
        code: &Bound<'_, PyAny>,
        inputs: Option<&Bound<'_, PyAny>>,
        dependencies: Option<&Bound<'_, PyAny>>,
        input_artifacts: Option<&Bound<'_, PyAny>>,
        env: Option<&Bound<'_, PyAny>>,
        repr: bool,
        files: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyEnvelope> {
        let args = RequestArgs {
            inputs,
            dependencies,
            input_artifacts,
            env,
            files,
        };
        let request = self.cell(code, args, repr)?;
        let context = RunContext::private(py)?;
        let session = Session::clone(&self.inner);
        block_on(py, context.scope(async move { session.run(request).await }))?
            .map(PyEnvelope::from)
            .map_err(py_err)
    }

    /// `run` for asyncio: `async def` tools run on the caller's event loop; cancelling the awaiting
    /// task stops the cell.
    #[pyo3(signature = (
        code, *, inputs = None, dependencies = None, input_artifacts = None, env = None, repr = false,
        files = None
    ))]
    #[allow(clippy::too_many_arguments)] // one parameter per Python keyword argument
    fn arun<'py>(
        &self,
        py: Python<'py>,
        code: &Bound<'py, PyAny>,
        inputs: Option<&Bound<'py, PyAny>>,
        dependencies: Option<&Bound<'py, PyAny>>,
        input_artifacts: Option<&Bound<'py, PyAny>>,
        env: Option<&Bound<'py, PyAny>>,
        repr: bool,
        files: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let args = RequestArgs {
            inputs,
            dependencies,
            input_artifacts,
            env,
            files,
        };
        let request = self.cell(code, args, repr)?;
        let session = Session::clone(&self.inner);
        deferred(py, move |py| {
            let context = RunContext::here(py, None)?;
            future_into_py(py, async move {
                context
                    .scope(session.run(request))
                    .await
                    .map(PyEnvelope::from)
                    .map_err(py_err)
            })
        })
    }

    /// Starts a cell and returns its handle (events, `wait()` / `await`, `cancel()`).
    #[pyo3(signature = (
        code, *, inputs = None, dependencies = None, input_artifacts = None, env = None, repr = false,
        files = None
    ))]
    #[allow(clippy::too_many_arguments)] // one parameter per Python keyword argument
    fn start(
        &self,
        py: Python<'_>,
        code: &Bound<'_, PyAny>,
        inputs: Option<&Bound<'_, PyAny>>,
        dependencies: Option<&Bound<'_, PyAny>>,
        input_artifacts: Option<&Bound<'_, PyAny>>,
        env: Option<&Bound<'_, PyAny>>,
        repr: bool,
        files: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyRunHandle> {
        let args = RequestArgs {
            inputs,
            dependencies,
            input_artifacts,
            env,
            files,
        };
        let request = self.cell(code, args, repr)?;
        let (events, tool_events) = tokio::sync::mpsc::unbounded_channel();
        let context = RunContext::here(py, Some(events))?;
        let _entered = runtime().enter();
        let core = self.engine.start_in(request, move |run| context.scope(run));
        Ok(PyRunHandle::new(Shared::new(
            core,
            tool_events,
            Arc::clone(&self.tool_names),
        )))
    }

    /// Forgets the session's state: its interpreter is killed and its record removed from the store;
    /// the next cell starts empty (cell 1).
    fn reset(&self, py: Python<'_>) -> PyResult<()> {
        let session = Session::clone(&self.inner);
        block_on(py, async move { session.reset().await })?.map_err(py_err)
    }

    /// `reset` for asyncio.
    fn areset<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let session = Session::clone(&self.inner);
        deferred(py, move |py| {
            future_into_py(py, async move { session.reset().await.map_err(py_err) })
        })
    }

    /// Ends the session: like `reset`, and the engine forgets the id. A cell run after it starts a
    /// new, empty session under the same id.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        let session = Session::clone(&self.inner);
        block_on(py, async move { session.close().await })?.map_err(py_err)
    }

    /// `close` for asyncio.
    fn aclose<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let session = Session::clone(&self.inner);
        deferred(py, move |py| {
            future_into_py(py, async move { session.close().await.map_err(py_err) })
        })
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    /// Closes the session; an exception from the block propagates. (The parameters are named as the
    /// stubs name them: stubtest compares the names.)
    fn __exit__(
        &self,
        py: Python<'_>,
        exc_type: &Bound<'_, PyAny>,
        exc: &Bound<'_, PyAny>,
        traceback: &Bound<'_, PyAny>,
    ) -> PyResult<bool> {
        let _ = (exc_type, exc, traceback);
        self.close(py)?;
        Ok(false)
    }

    fn __aenter__<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        tools_module(slf.py())?.call_method1("ready", (slf,))
    }

    fn __aexit__<'py>(
        &self,
        py: Python<'py>,
        exc_type: &Bound<'py, PyAny>,
        exc: &Bound<'py, PyAny>,
        traceback: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let _ = (exc_type, exc, traceback);
        let session = Session::clone(&self.inner);
        deferred(py, move |py| {
            future_into_py(py, async move {
                session.close().await.map_err(py_err)?;
                Ok(false)
            })
        })
    }

    fn __repr__(&self) -> String {
        format!("Session(id={})", py_repr(self.inner.id()))
    }
}
