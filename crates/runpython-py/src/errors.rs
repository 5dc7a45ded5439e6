//! runpython's own failures as Python exceptions, one class per kind of `runpython_core::Error`.
//! What the code does is never one of these: it is an envelope.

use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use runpython_core::Error;

create_exception!(
    runpython,
    RunPythonError,
    PyException,
    "Base class of runpython's own failures (never raised for what the code does: that is an envelope)."
);
create_exception!(
    runpython,
    ConfigError,
    RunPythonError,
    "The engine's settings are wrong (a keyword argument of RunPython, a store that needs configuring)."
);
create_exception!(
    runpython,
    InvalidInputError,
    RunPythonError,
    "A request is malformed: an input name that is not an identifier, a value that is not JSON, an unknown run."
);
create_exception!(
    runpython,
    SandboxError,
    RunPythonError,
    "The sandboxed child could not be started or supervised, or a required isolation layer is missing."
);
create_exception!(
    runpython,
    StoreError,
    RunPythonError,
    "The store failed: opening it, keeping a run, reading an artifact or a checkpoint."
);
create_exception!(
    runpython,
    InterpreterError,
    RunPythonError,
    "No usable Python interpreter for the sandboxed child (check the `python` argument)."
);
create_exception!(
    runpython,
    CancelledError,
    RunPythonError,
    "The run was cancelled through its handle."
);
create_exception!(
    runpython,
    InternalError,
    RunPythonError,
    "A bug in runpython; please report it with the message."
);

pub(crate) fn register(py: Python<'_>, m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("RunPythonError", py.get_type::<RunPythonError>())?;
    m.add("ConfigError", py.get_type::<ConfigError>())?;
    m.add("InvalidInputError", py.get_type::<InvalidInputError>())?;
    m.add("SandboxError", py.get_type::<SandboxError>())?;
    m.add("StoreError", py.get_type::<StoreError>())?;
    m.add("InterpreterError", py.get_type::<InterpreterError>())?;
    m.add("CancelledError", py.get_type::<CancelledError>())?;
    m.add("InternalError", py.get_type::<InternalError>())?;
    Ok(())
}

/// The exception for a core error, with the core's message.
pub(crate) fn to_py_err(error: &Error) -> PyErr {
    let message = error.to_string();
    match error {
        Error::Config(_) => ConfigError::new_err(message),
        Error::InvalidInput(_) => InvalidInputError::new_err(message),
        Error::Store(_) => StoreError::new_err(message),
        Error::Cancelled => CancelledError::new_err(message),
        Error::Interpreter(_) => InterpreterError::new_err(message),
        Error::Spawn { .. }
        | Error::Io { .. }
        | Error::Bridge(_)
        | Error::IsolationUnavailable(_)
        | Error::TemplateUnavailable(_) => SandboxError::new_err(message),
        Error::Internal(_) => InternalError::new_err(message),
        _ => RunPythonError::new_err(message),
    }
}

/// For `map_err`: a core error by value.
pub(crate) fn py_err(error: Error) -> PyErr {
    to_py_err(&error)
}

/// A `ConfigError` with this message.
pub(crate) fn config(message: impl Into<String>) -> PyErr {
    ConfigError::new_err(message.into())
}

/// An `InvalidInputError` with this message.
pub(crate) fn invalid(message: impl Into<String>) -> PyErr {
    InvalidInputError::new_err(message.into())
}

/// An `InternalError` with this message.
pub(crate) fn internal(message: impl Into<String>) -> PyErr {
    InternalError::new_err(message.into())
}
