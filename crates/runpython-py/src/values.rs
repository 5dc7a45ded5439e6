//! Exact Python values across the boundary: runpython's tagged JSON codec (core's `VALUES_PY`, the
//! same file the child imports) as the module `runpython._values`, and the conversions through it.
//!
//! Every request from Python asks for exact values (`RunRequest::typed`): inputs go in tagged, the
//! envelope's `return_value` is decoded from `return_typed` when the child sent one, and a Python
//! callable tool's arguments and result travel tagged too. So a tuple stays a tuple, a `datetime`
//! keeps its zone, a `Decimal` its digits, and a dataclass comes back as its class when the host has
//! it loaded.

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use serde_json::Value;

use crate::convert::{to_json, to_py};

/// `runpython._values`, compiled from core's source once per process.
fn codec(py: Python<'_>) -> PyResult<&Bound<'_, PyModule>> {
    static MODULE: PyOnceLock<Py<PyModule>> = PyOnceLock::new();
    MODULE
        .get_or_try_init(py, || {
            let code = std::ffi::CString::new(runpython_core::VALUES_PY)
                .map_err(|e| pyo3::exceptions::PyRuntimeError::new_err(e.to_string()))?;
            Ok(
                PyModule::from_code(py, &code, c"runpython/_values.py", c"runpython._values")?
                    .unbind(),
            )
        })
        .map(|m| m.bind(py))
}

/// `value` as tagged JSON; `default` converts what the codec has no form for (a tool result's
/// pydantic model). Errors are the codec's: `TypeError` (no exact form), `ValueError` (too deep).
pub(crate) fn encode(
    value: &Bound<'_, PyAny>,
    default: Option<&Bound<'_, PyAny>>,
) -> PyResult<Value> {
    let py = value.py();
    let encoded = codec(py)?.call_method1("encode", (value, default))?;
    to_json(&encoded.get_item(0)?).map_err(|e| {
        pyo3::exceptions::PyTypeError::new_err(format!("the encoded value is not JSON: {e}"))
    })
}

/// The Python value of tagged JSON (a dataclass or NamedTuple whose class is not loaded here as a
/// dict of its fields with `"__class__"`). Malformed input (which only the child could send) raises
/// `ValueError`.
pub(crate) fn decode(py: Python<'_>, value: &Value) -> PyResult<Py<PyAny>> {
    let plain = to_py(py, value)?;
    Ok(codec(py)?.call_method1("decode", (plain,))?.unbind())
}
