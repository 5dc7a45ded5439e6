//! runpython-py: the engine as a CPython extension module, `runpython._runpython`, which the
//! `runpython` package (`python/runpython`) re-exports.
//!
//! It wraps runpython-core's public API and nothing else: a `RunPython` built from keyword
//! arguments, sync and asyncio entry points (`run`/`arun`, `start` with a handle that iterates events
//! either way, `resume`, `handle_tool_call`), sessions (`session.rs`: state kept across cells), the
//! envelope as objects with attribute access, and Python callables as bridge tools (`tools::PyTool`). It depends on runpython-core only (like the
//! CLI, it is a thin layer); it never spawns anything itself.
//!
//! Threads and the GIL: one Tokio runtime per process (pyo3-async-runtimes'), on which every run
//! executes. Sync calls release the GIL and wait on a channel, checking for signals every 50 ms (so
//! Ctrl-C stops the run); async calls return asyncio futures completed from the runtime, so no thread
//! is held per waiting run. Plain tool callables run on the runtime's blocking pool with the GIL,
//! `async def` ones on the event loop of the caller (`arun`, `start` inside a loop) or on a private
//! loop thread (sync `run`).
//!
//! ```python
//! from runpython import RunPython
//!
//! def search(query: str, limit: int = 3) -> list[str]:
//!     """Search the catalogue."""
//!     return [f"{query} {i}" for i in range(limit)]
//!
//! rp = RunPython(timeout=10, tools=[search])
//! envelope = rp.run("len(search('cats')) * n", inputs={"n": 2})
//! assert envelope.return_value == 6
//! ```

mod convert;
mod engine;
mod envelope;
mod errors;
mod events;
mod handle;
mod request;
mod runtime;
mod session;
mod settings;
mod tools;
mod values;

use pyo3::prelude::*;

/// The native module. Exceptions, classes and the version; the pure-Python parts (tool
/// introspection, `tool`, `Suspend`) live in `runpython._tools`.
#[pymodule]
fn _runpython(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    errors::register(py, m)?;
    m.add_class::<engine::PyRunPython>()?;
    m.add_class::<envelope::PyEnvelope>()?;
    m.add_class::<envelope::PyErrorInfo>()?;
    m.add_class::<envelope::PyArtifact>()?;
    m.add_class::<handle::PyRunHandle>()?;
    m.add_class::<session::PySession>()?;
    m.add_class::<handle::PyEvent>()?;
    Ok(())
}
