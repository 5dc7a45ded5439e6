//! Values between Python and JSON, and the checked conversions of keyword arguments.
//!
//! JSON values are converted by hand rather than through serde (pythonize): the workspace builds
//! serde_json with `arbitrary_precision`, under which a number serializes to other formats as a
//! private one-key map, and integers of any size must stay exact both ways (`2 ** 100` is a Python
//! int on either side, never a float or a string).

use std::time::Duration;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyFrozenSet, PyInt, PyList, PySet, PyString, PyTuple};
use serde_json::{Map, Number, Value};

use crate::errors::{config, internal};

/// Containers nested deeper than this are refused (and a container holding itself is caught by it).
const MAX_DEPTH: usize = 512;

/// Past this many digits `int(str)` and `str(int)` hit CPython's digit limit (4300 by default), so
/// longer integers go through `decimal`, which has none.
const INT_TEXT_DIGITS: usize = 4000;

/// A JSON value as a Python object (dicts keep their order; integers of any size are exact).
pub(crate) fn to_py(py: Python<'_>, value: &Value) -> PyResult<Py<PyAny>> {
    Ok(match value {
        Value::Null => py.None(),
        Value::Bool(b) => PyBool::new(py, *b).to_owned().into_any().unbind(),
        Value::Number(n) => number_to_py(py, n)?,
        Value::String(s) => PyString::new(py, s).into_any().unbind(),
        Value::Array(items) => {
            let list = PyList::empty(py);
            for item in items {
                list.append(to_py(py, item)?)?;
            }
            list.into_any().unbind()
        }
        Value::Object(map) => {
            let dict = PyDict::new(py);
            for (key, item) in map {
                dict.set_item(key, to_py(py, item)?)?;
            }
            dict.into_any().unbind()
        }
    })
}

fn number_to_py(py: Python<'_>, n: &Number) -> PyResult<Py<PyAny>> {
    if let Some(i) = n.as_i64() {
        return Ok(i.into_pyobject(py)?.into_any().unbind());
    }
    if let Some(u) = n.as_u64() {
        return Ok(u.into_pyobject(py)?.into_any().unbind());
    }
    let text = n.to_string();
    if text.contains(['.', 'e', 'E']) {
        let f = n
            .as_f64()
            .ok_or_else(|| PyValueError::new_err(format!("the number {text} is not a float")))?;
        return Ok(PyFloat::new(py, f).into_any().unbind());
    }
    let builtins = py.import("builtins")?;
    if text.len() <= INT_TEXT_DIGITS {
        return Ok(builtins.getattr("int")?.call1((text,))?.unbind());
    }
    let decimal = py.import("decimal")?.getattr("Decimal")?.call1((text,))?;
    Ok(builtins.getattr("int")?.call1((decimal,))?.unbind())
}

/// Any serializable value as a Python object, through its JSON value.
pub(crate) fn serialize_to_py<T: serde::Serialize>(
    py: Python<'_>,
    value: &T,
) -> PyResult<Py<PyAny>> {
    let value = serde_json::to_value(value)
        .map_err(|e| internal(format!("a value did not serialize: {e}")))?;
    to_py(py, &value)
}

/// A Python object as JSON, or why it is not JSON: dicts (and other mappings) with str keys, lists,
/// tuples and sets, str, int (any size), finite float, bool and None.
pub(crate) fn to_json(object: &Bound<'_, PyAny>) -> Result<Value, String> {
    json_of(object, 0)
}

fn json_of(object: &Bound<'_, PyAny>, depth: usize) -> Result<Value, String> {
    if depth > MAX_DEPTH {
        return Err(format!(
            "it nests deeper than {MAX_DEPTH} levels (or contains itself)"
        ));
    }
    if object.is_none() {
        return Ok(Value::Null);
    }
    if let Ok(b) = object.cast::<PyBool>() {
        return Ok(Value::Bool(b.is_true()));
    }
    if object.is_instance_of::<PyInt>() {
        return int_json(object);
    }
    if let Ok(f) = object.cast::<PyFloat>() {
        let f = f.value();
        return Number::from_f64(f)
            .map(Value::Number)
            .ok_or_else(|| format!("the float {f} has no JSON form"));
    }
    if let Ok(s) = object.cast::<PyString>() {
        return s
            .to_str()
            .map(|s| Value::String(s.to_owned()))
            .map_err(|e| format!("a str that is not valid Unicode: {e}"));
    }
    let items = |iter: Bound<'_, pyo3::types::PyIterator>| -> Result<Value, String> {
        let mut out = Vec::new();
        for item in iter {
            out.push(json_of(&item.map_err(|e| e.to_string())?, depth + 1)?);
        }
        Ok(Value::Array(out))
    };
    if object.is_instance_of::<PyList>()
        || object.is_instance_of::<PyTuple>()
        || object.is_instance_of::<PySet>()
        || object.is_instance_of::<PyFrozenSet>()
    {
        return items(object.try_iter().map_err(|e| e.to_string())?);
    }
    if let Some(dict) = mapping(object) {
        let mut out = Map::new();
        for (key, item) in dict.iter() {
            let Ok(key) = key.cast::<PyString>().map(|k| k.to_string()) else {
                return Err(format!(
                    "its dict keys must be str, got {} {}",
                    type_name(&key),
                    short_repr(&key)
                ));
            };
            out.insert(key, json_of(&item, depth + 1)?);
        }
        return Ok(Value::Object(out));
    }
    Err(format!("{} is not a JSON type", type_name(object)))
}

/// An int as an exact JSON number, whatever its size.
fn int_json(object: &Bound<'_, PyAny>) -> Result<Value, String> {
    if let Ok(i) = object.extract::<i64>() {
        return Ok(Value::from(i));
    }
    if let Ok(u) = object.extract::<u64>() {
        return Ok(Value::from(u));
    }
    // Big: its decimal text (through `decimal` past the digit limit), read back as a JSON number.
    let text = object
        .str()
        .or_else(|_| {
            let py = object.py();
            py.import("decimal")?
                .getattr("Decimal")?
                .call1((object,))?
                .str()
        })
        .map_err(|e| format!("an int without a decimal form: {e}"))?;
    serde_json::from_str::<Value>(&text.to_string_lossy())
        .map_err(|e| format!("an int that is not a JSON number: {e}"))
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
