//! Values between Python and JSON, and the checked conversions of keyword arguments.

use std::time::Duration;

use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyString};
use pythonize::{depythonize, pythonize};
use serde_json::Value;

use crate::errors::config;

/// A JSON value as a Python object (dicts keep their order).
pub(crate) fn to_py(py: Python<'_>, value: &Value) -> PyResult<Py<PyAny>> {
    Ok(pythonize(py, value)?.unbind())
}

/// Any serializable value as a Python object.
pub(crate) fn serialize_to_py<T: serde::Serialize>(
    py: Python<'_>,
    value: &T,
) -> PyResult<Py<PyAny>> {
    Ok(pythonize(py, value)?.unbind())
}

/// A Python object as JSON, or why it is not JSON: dicts with string keys, lists and tuples, str,
/// int, float, bool and None.
pub(crate) fn to_json(object: &Bound<'_, PyAny>) -> Result<Value, String> {
    depythonize::<Value>(object).map_err(|e| e.to_string())
}

/// The Python type name of an object, for messages.
pub(crate) fn type_name(object: &Bound<'_, PyAny>) -> String {
    object
        .get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "object".into())
}

/// `repr(object)`, shortened, for messages.
pub(crate) fn short_repr(object: &Bound<'_, PyAny>) -> String {
    let text = object
        .repr()
        .map(|r| r.to_string())
        .unwrap_or_else(|_| "<unprintable>".into());
    if text.chars().count() > 80 {
        format!("{}…", text.chars().take(80).collect::<String>())
    } else {
        text
    }
}

/// A keyword argument that must be a number of seconds (int, float or `datetime.timedelta`), zero or
/// more: zero is passed on so the engine's own check names it.
pub(crate) fn seconds(name: &str, value: &Bound<'_, PyAny>) -> PyResult<Duration> {
    let secs: f64 = if value.is_instance_of::<PyBool>() {
        return Err(not_a(name, "number of seconds", value));
    } else if value.is_instance_of::<PyInt>() || value.is_instance_of::<PyFloat>() {
        value.extract()?
    } else if value.is_instance(&value.py().import("datetime")?.getattr("timedelta")?)? {
        value.call_method0("total_seconds")?.extract()?
    } else {
        return Err(not_a(name, "number of seconds", value));
    };
    Duration::try_from_secs_f64(secs).map_err(|_| {
        config(format!(
            "{name} must be a finite number of seconds, zero or more, got {secs}"
        ))
    })
}

/// A keyword argument that must be a whole number, zero or more.
pub(crate) fn count<T: TryFrom<u64>>(name: &str, value: &Bound<'_, PyAny>) -> PyResult<T> {
    if value.is_instance_of::<PyBool>() || !value.is_instance_of::<PyInt>() {
        return Err(not_a(name, "whole number", value));
    }
    let n: i128 = value.extract()?;
    u64::try_from(n)
        .ok()
        .and_then(|n| T::try_from(n).ok())
        .ok_or_else(|| {
            config(format!(
                "{name} must be a whole number, zero or more, that fits, got {n}"
            ))
        })
}

/// A keyword argument that must be a bool.
pub(crate) fn boolean(name: &str, value: &Bound<'_, PyAny>) -> PyResult<bool> {
    if value.is_instance_of::<PyBool>() {
        value.extract()
    } else {
        Err(not_a(name, "bool (True or False)", value))
    }
}

/// A keyword argument that must be a str.
pub(crate) fn string(name: &str, value: &Bound<'_, PyAny>) -> PyResult<String> {
    if value.is_instance_of::<PyString>() {
        value.extract()
    } else {
        Err(not_a(name, "str", value))
    }
}

/// A keyword argument that must be a path (str or `os.PathLike`).
pub(crate) fn path(name: &str, value: &Bound<'_, PyAny>) -> PyResult<std::path::PathBuf> {
    value
        .extract()
        .map_err(|_| not_a(name, "path (str or os.PathLike)", value))
}

/// A keyword argument that must be a list (or tuple) of str; a lone str is refused (it is iterable,
/// and would become one entry per character).
pub(crate) fn strings(name: &str, value: &Bound<'_, PyAny>) -> PyResult<Vec<String>> {
    if value.is_instance_of::<PyString>() {
        return Err(config(format!(
            "{name} must be a list of str, got the str {}; wrap it in a list",
            short_repr(value)
        )));
    }
    let mut out = Vec::new();
    for item in value
        .try_iter()
        .map_err(|_| not_a(name, "list of str", value))?
    {
        let item = item?;
        out.push(item.extract::<String>().map_err(|_| {
            config(format!(
                "{name} must hold only str, got {}",
                short_repr(&item)
            ))
        })?);
    }
    Ok(out)
}

/// A keyword argument that must be a dict (or another mapping); its items in order.
pub(crate) fn dict<'py>(name: &str, value: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyDict>> {
    mapping(value).ok_or_else(|| not_a(name, "dict", value))
}

/// A dict, or a copy of another mapping as one; `None` for anything else.
pub(crate) fn mapping<'py>(value: &Bound<'py, PyAny>) -> Option<Bound<'py, PyDict>> {
    if let Ok(dict) = value.cast::<PyDict>() {
        return Some(dict.clone());
    }
    let abc = value.py().import("collections.abc").ok()?;
    if !value.is_instance(&abc.getattr("Mapping").ok()?).ok()? {
        return None;
    }
    let dict = PyDict::new(value.py());
    dict.update(value.cast::<pyo3::types::PyMapping>().ok()?)
        .ok()?;
    Some(dict)
}

fn not_a(name: &str, what: &str, value: &Bound<'_, PyAny>) -> PyErr {
    config(format!(
        "{name} must be a {what}, got {} {}",
        type_name(value),
        short_repr(value)
    ))
}

/// A str as Python writes it in a repr.
pub(crate) fn py_repr(text: &str) -> String {
    Python::attach(|py| {
        pyo3::types::PyString::new(py, text)
            .repr()
            .map(|r| r.to_string())
            .unwrap_or_else(|_| format!("{text:?}"))
    })
}
