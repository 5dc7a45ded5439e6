//! A `RunRequest` from the keyword arguments `RunPython.run` and `Session.run` share (and their async
//! and `start` forms): the code, its inputs, dependencies, input artifacts and per-run environment.

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use runpython_core::RunRequest;

use crate::convert::{dict, mapping, short_repr, strings, type_name};
use crate::errors::invalid;

/// The request-shaping keyword arguments, as Python passed them (absent and `None` alike mean "none").
pub(crate) struct RequestArgs<'a, 'py> {
    pub inputs: Option<&'a Bound<'py, PyAny>>,
    pub dependencies: Option<&'a Bound<'py, PyAny>>,
    pub input_artifacts: Option<&'a Bound<'py, PyAny>>,
    pub env: Option<&'a Bound<'py, PyAny>>,
    pub files: Option<&'a Bound<'py, PyAny>>,
}

/// A request from `run`'s arguments. Inputs are exact Python values (JSON's, and what runpython's
/// tagged JSON carries: tuples, sets, bytes, dates, Decimal, dataclasses...); names are checked by
/// the engine. `env` must map str to str: anything else is a `TypeError`
/// naming the key, since an environment holds only text and a silent `str()` would hide the mistake.
pub(crate) fn request(code: &Bound<'_, PyAny>, args: RequestArgs<'_, '_>) -> PyResult<RunRequest> {
    let py = code.py();
    let code: String = code.extract().map_err(|_| {
        invalid(format!(
            "code must be a str of Python source, got {}",
            type_name(code)
        ))
    })?;
    let mut request = RunRequest::new(code);
    if let Some(inputs) = args.inputs.filter(|v| !v.is_none()) {
        let inputs = mapping(inputs).ok_or_else(|| {
            invalid(format!(
                "inputs must be a dict of name to JSON value, got {}",
                type_name(inputs)
            ))
        })?;
        for (name, value) in inputs.iter() {
            let name: String = name.extract().map_err(|_| {
                invalid(format!(
                    "input names must be str, got {}",
                    short_repr(&name)
                ))
            })?;
            let json = crate::values::encode(&value, None).map_err(|e| {
                invalid(format!(
                    "input {name:?} is a {} that cannot cross into the run ({}); pass JSON values, \
                     tuples, sets, bytes, dates and times, Decimal, UUID, paths, dataclasses or \
                     NamedTuples",
                    type_name(&value),
                    e.value(py)
                ))
            })?;
            request = request.input(name, json);
        }
    }
    // Exact values both ways: the inputs above are tagged, and the value comes back tagged too.
    request.typed = true;
    // The argument checks speak of configuration; here the request is at fault.
    let as_invalid = |e: PyErr| invalid(e.value(py).to_string());
    if let Some(deps) = args.dependencies.filter(|v| !v.is_none()) {
        for spec in strings("dependencies", deps).map_err(as_invalid)? {
            request = request.dependency(spec);
        }
    }
    if let Some(artifacts) = args.input_artifacts.filter(|v| !v.is_none()) {
        for (name, id) in dict("input_artifacts", artifacts)
            .map_err(as_invalid)?
            .iter()
        {
            match (name.extract::<String>(), id.extract::<String>()) {
                (Ok(name), Ok(id)) => request = request.input_artifact(name, id),
                _ => {
                    return Err(invalid(format!(
                        "input_artifacts must map str names to str artifact ids, got {}: {}",
                        short_repr(&name),
                        short_repr(&id)
                    )))
                }
            }
        }
    }
    if let Some(env) = args.env.filter(|v| !v.is_none()) {
        let env = mapping(env).ok_or_else(|| {
            PyTypeError::new_err(format!(
                "env must be a dict of str names to str values, got {} {}",
                type_name(env),
                short_repr(env)
            ))
        })?;
        for (name, value) in env.iter() {
            let name: String = name.extract().map_err(|_| {
                PyTypeError::new_err(format!(
                    "env names must be str, got {} {}",
                    type_name(&name),
                    short_repr(&name)
                ))
            })?;
            let value: String = value.extract().map_err(|_| {
                PyTypeError::new_err(format!(
                    "env[{name:?}] must be a str, got {} {}; an environment holds text: convert \
                     it with str()",
                    type_name(&value),
                    short_repr(&value)
                ))
            })?;
            request = request.env(name, value);
        }
    }
    if let Some(files) = args.files.filter(|v| !v.is_none()) {
        request = with_files(request, files)?;
    }
    Ok(request)
}

/// `files={"name": bytes | Path}`: bytes as they are, a path read here (the caller's file, before
/// the run).
fn with_files(mut request: RunRequest, files: &Bound<'_, PyAny>) -> PyResult<RunRequest> {
    let files = mapping(files).ok_or_else(|| {
        PyTypeError::new_err(format!(
            "files must be a dict of str names to bytes or a path, got {}",
            type_name(files)
        ))
    })?;
    for (name, given) in files.iter() {
        let name: String = name.extract().map_err(|_| {
            PyTypeError::new_err(format!("file names must be str, got {}", short_repr(&name)))
        })?;
        let bytes: Vec<u8> = if let Ok(bytes) = given.cast::<pyo3::types::PyBytes>() {
            bytes.as_bytes().to_vec()
        } else if let Ok(path) = given.extract::<std::path::PathBuf>() {
            std::fs::read(&path).map_err(|e| {
                invalid(format!(
                    "files[{name:?}]: cannot read {} ({e})",
                    path.display()
                ))
            })?
        } else {
            return Err(PyTypeError::new_err(format!(
                "files[{name:?}] must be bytes or a path (str or pathlib.Path), got {}",
                type_name(&given)
            )));
        };
        request = request.file(name, bytes);
    }
    Ok(request)
}
