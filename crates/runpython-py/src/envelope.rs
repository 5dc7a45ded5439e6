//! The envelope as Python objects: attribute access, `to_dict()`, `to_json()`. Each wraps the core's
//! own value, so the JSON is exactly the envelope v1 contract.

use pyo3::prelude::*;
use runpython_core::{Artifact, Envelope, ErrorInfo};

use crate::convert::{py_repr, serialize_to_py, to_py};

fn json_text<T: serde::Serialize>(value: &T, indent: Option<usize>) -> PyResult<String> {
    let result = match indent {
        None => serde_json::to_string(value),
        Some(n) => {
            let indent = " ".repeat(n);
            let mut out = Vec::new();
            let formatter = serde_json::ser::PrettyFormatter::with_indent(indent.as_bytes());
            let mut serializer = serde_json::Serializer::with_formatter(&mut out, formatter);
            serde::Serialize::serialize(value, &mut serializer)
                .map(|()| String::from_utf8_lossy(&out).into_owned())
        }
    };
    result.map_err(|e| crate::errors::internal(format!("the envelope did not serialize: {e}")))
}

/// What a run returned (envelope v1).
#[pyclass(frozen, module = "runpython", name = "Envelope")]
pub(crate) struct PyEnvelope {
    inner: Envelope,
}

impl From<Envelope> for PyEnvelope {
    fn from(inner: Envelope) -> Self {
        Self { inner }
    }
}

impl PyEnvelope {
    /// The JSON envelope as a model sees it: the exact value rides beside it for Python only.
    fn contract(&self) -> std::borrow::Cow<'_, Envelope> {
        if self.inner.return_typed.is_none() {
            return std::borrow::Cow::Borrowed(&self.inner);
        }
        let mut envelope = self.inner.clone();
        envelope.return_typed = None;
        std::borrow::Cow::Owned(envelope)
    }
}

#[pymethods]
impl PyEnvelope {
    /// `"success"`, `"error"`, `"timeout"` or `"suspended"`.
    #[getter]
    fn status(&self) -> &'static str {
        match self.inner.status {
            runpython_core::Status::Success => "success",
            runpython_core::Status::Error => "error",
            runpython_core::Status::Timeout => "timeout",
            runpython_core::Status::Suspended => "suspended",
        }
    }
    /// True when the status is `"success"`.
    #[getter]
    fn ok(&self) -> bool {
        self.inner.is_success()
    }
    /// The value exactly (a tuple, a set, a datetime with its zone, bytes, a Decimal, a dataclass
    /// when its class is loaded here...), decoded from the tagged form the run sent; the JSON form
    /// when that is all there is (a DataFrame's table, a repr).
    #[getter]
    fn return_value(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        match &self.inner.return_typed {
            // A malformed tagged value could only come from a tampered child: the JSON form stands.
            Some(typed) => {
                crate::values::decode(py, typed).or_else(|_| to_py(py, &self.inner.return_value))
            }
            None => to_py(py, &self.inner.return_value),
        }
    }
    /// The value as the JSON envelope shows it to a model (`return_value` of `to_dict`): dates as
    /// ISO text, bytes as base64, tuples as lists, other values that are not JSON as their repr.
    #[getter]
    fn return_json(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        to_py(py, &self.inner.return_value)
    }
    #[getter]
    fn return_type(&self) -> Option<&str> {
        self.inner.return_type.as_deref()
    }
    #[getter]
    fn return_preview(&self, py: Python<'_>) -> PyResult<Option<Py<PyAny>>> {
        self.inner
            .return_preview
            .as_ref()
            .map(|v| to_py(py, v))
            .transpose()
    }
    #[getter]
    fn stdout(&self) -> &str {
        &self.inner.stdout
    }
    #[getter]
    fn stderr(&self) -> &str {
        &self.inner.stderr
    }
    #[getter]
    fn truncated(&self, py: Python<'_>) -> PyResult<Option<Py<PyAny>>> {
        self.inner
            .truncated
            .as_ref()
            .map(|t| serialize_to_py(py, t))
            .transpose()
    }
    #[getter]
    fn error(&self) -> Option<PyErrorInfo> {
        self.inner.error.clone().map(|inner| PyErrorInfo { inner })
    }
    #[getter]
    fn artifacts(&self) -> Vec<PyArtifact> {
        self.inner
            .artifacts
            .iter()
            .cloned()
            .map(|inner| PyArtifact { inner })
            .collect()
    }
    #[getter]
    fn run_id(&self) -> &str {
        &self.inner.run_id
    }
    #[getter]
    fn cached(&self) -> bool {
        self.inner.cached
    }
    #[getter]
    fn duration_ms(&self) -> u64 {
        self.inner.duration_ms
    }
    #[getter]
    fn suspension(&self, py: Python<'_>) -> PyResult<Option<Py<PyAny>>> {
        self.inner
            .suspension
            .as_ref()
            .map(|v| to_py(py, v))
            .transpose()
    }
    #[getter]
    fn isolation(&self, py: Python<'_>) -> PyResult<Option<Py<PyAny>>> {
        self.inner
            .isolation
            .as_ref()
            .map(|v| serialize_to_py(py, v))
            .transpose()
    }
    /// What the run's environment holds (`installed`: name, version, source) or what an install
    /// refused (`refused`); `None` when the run needed only the standard library.
    #[getter]
    fn dependencies(&self, py: Python<'_>) -> PyResult<Option<Py<PyAny>>> {
        self.inner
            .dependencies
            .as_ref()
            .map(|v| serialize_to_py(py, v))
            .transpose()
    }
    /// With a network policy, when the run used the network: the mode, connections, bytes each way,
    /// lookups and the first refusals (`host`, `port`, `reason`); `None` otherwise.
    #[getter]
    fn network(&self, py: Python<'_>) -> PyResult<Option<Py<PyAny>>> {
        self.inner
            .network
            .as_ref()
            .map(|v| serialize_to_py(py, v))
            .transpose()
    }
    /// What the code displayed (`display(obj)`, rich last values, matplotlib figures), in order:
    /// each `{"formats": {mime: text or {"file", "bytes", "width", "height", "artifact_id"}}}`.
    #[getter]
    fn displays(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        serialize_to_py(py, &self.inner.displays)
    }
    /// The images the code displayed that fit the engine's `max_image_bytes`, inline: each
    /// `{"display": index into displays, "mime": "image/png", "data": base64}`. Never part of
    /// `to_dict`/`to_json` (the JSON envelope links them by artifact id instead).
    #[getter]
    fn images(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        serialize_to_py(py, &self.inner.images)
    }
    /// The session a cell ran in; `None` for a run of its own.
    #[getter]
    fn session_id(&self) -> Option<&str> {
        self.inner.session_id.as_deref()
    }
    /// The cell's number in its session, from 1; `None` for a run of its own.
    #[getter]
    fn cell(&self) -> Option<u64> {
        self.inner.cell
    }
    /// True when the session was rebuilt from the store (its snapshot loaded, cells replayed) before
    /// this cell ran.
    #[getter]
    fn restored(&self) -> bool {
        self.inner.restored
    }
    /// With `restored`: how the session came back, as a dict (`from`: "snapshot" or "replay",
    /// `snapshot_cells`, `replayed`, `why`, `ms`, `snapshot_ms`); `None` otherwise.
    #[getter]
    fn restore(&self, py: Python<'_>) -> PyResult<Option<Py<PyAny>>> {
        self.inner
            .restore
            .as_ref()
            .map(|report| serialize_to_py(py, report))
            .transpose()
    }
    /// The value as a REPL prints it, when the cell asked for it (`repr=True`).
    #[getter]
    fn return_repr(&self) -> Option<&str> {
        self.inner.return_repr.as_deref()
    }
    /// False when the store failed to keep the run after the code ran (`store_error` says how): the
    /// envelope is still what the code did, but the run may be missing from the store.
    #[getter]
    fn kept(&self) -> bool {
        self.inner.kept
    }
    /// The store's error when `kept` is false.
    #[getter]
    fn store_error(&self) -> Option<&str> {
        self.inner.store_error.as_deref()
    }
    /// The envelope as a dict of JSON values (the v1 field names; `session_id`, `cell`, `restored`,
    /// `return_repr`, `kept` and `store_error` only where the contract has them: a session's cell, a
    /// restored session, a value asked for as its repr, a store that failed).
    fn to_dict(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        serialize_to_py(py, &self.contract())
    }
    /// The envelope as JSON text (the v1 contract), indented when `indent` is given.
    #[pyo3(signature = (indent=None))]
    fn to_json(&self, indent: Option<usize>) -> PyResult<String> {
        json_text(&self.contract(), indent)
    }
    fn __eq__(&self, other: &Bound<'_, PyAny>) -> bool {
        other
            .cast::<PyEnvelope>()
            .is_ok_and(|o| o.get().inner == self.inner)
    }
    fn __repr__(&self) -> String {
        let mut text = format!("Envelope(status={}", py_repr(self.status()));
        if let Some(error) = &self.inner.error {
            let error = format!("{}: {}", error.kind, error.message);
            text.push_str(&format!(", error={}", py_repr(&shorten(&error))));
        } else if !self.inner.return_value.is_null() {
            text.push_str(&format!(
                ", return_value={}",
                shorten(&self.inner.return_value.to_string())
            ));
        }
        if let (Some(id), Some(cell)) = (&self.inner.session_id, self.inner.cell) {
            text.push_str(&format!(", session_id={}, cell={cell}", py_repr(id)));
        }
        if !self.inner.kept {
            text.push_str(", kept=False");
        }
        text.push_str(&format!(
            ", run_id={}, duration_ms={})",
            py_repr(&self.inner.run_id),
            self.inner.duration_ms
        ));
        text
    }
}

fn shorten(text: &str) -> String {
    if text.chars().count() > 60 {
        format!("{}…", text.chars().take(60).collect::<String>())
    } else {
        text.to_owned()
    }
}

/// What went wrong in a run: a Python exception the code raised, or one of runpython's kinds
/// (`Timeout`, `ProcessExited`, `DependencyError`, ...).
#[pyclass(frozen, module = "runpython", name = "ErrorInfo")]
pub(crate) struct PyErrorInfo {
    inner: ErrorInfo,
}

#[pymethods]
impl PyErrorInfo {
    /// The exception class name, or runpython's kind.
    #[getter(r#type)]
    fn kind(&self) -> &str {
        &self.inner.kind
    }
    #[getter]
    fn message(&self) -> &str {
        &self.inner.message
    }
    /// The user's frames only, with the user's line numbers.
    #[getter]
    fn traceback(&self) -> Option<&str> {
        self.inner.traceback.as_deref()
    }
    #[getter]
    fn exit_code(&self) -> Option<i32> {
        self.inner.exit_code
    }
    #[getter]
    fn signal(&self) -> Option<i32> {
        self.inner.signal
    }
    fn to_dict(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        serialize_to_py(py, &self.inner)
    }
    fn __eq__(&self, other: &Bound<'_, PyAny>) -> bool {
        other
            .cast::<PyErrorInfo>()
            .is_ok_and(|o| o.get().inner == self.inner)
    }
    fn __str__(&self) -> String {
        format!("{}: {}", self.inner.kind, self.inner.message)
    }
    fn __repr__(&self) -> String {
        format!(
            "ErrorInfo(type={}, message={})",
            py_repr(&self.inner.kind),
            py_repr(&self.inner.message)
        )
    }
}

/// Something a kept run stored: `{id, name, kind, bytes, preview}`. Read it with
/// `RunPython.get_run_artifact(id)`.
#[pyclass(frozen, module = "runpython", name = "Artifact")]
pub(crate) struct PyArtifact {
    inner: Artifact,
}

#[pymethods]
impl PyArtifact {
    #[getter]
    fn id(&self) -> &str {
        &self.inner.id
    }
    #[getter]
    fn name(&self) -> &str {
        &self.inner.name
    }
    /// The artifact's kind as the envelope's JSON writes it (`"script"`, `"file"`, ...).
    #[getter]
    fn kind(&self) -> String {
        serde_json::to_value(self.inner.kind)
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default()
    }
    /// Size in bytes.
    #[getter]
    fn bytes(&self) -> u64 {
        self.inner.bytes
    }
    #[getter]
    fn preview(&self) -> &str {
        &self.inner.preview
    }
    fn to_dict(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        serialize_to_py(py, &self.inner)
    }
    fn __eq__(&self, other: &Bound<'_, PyAny>) -> bool {
        other
            .cast::<PyArtifact>()
            .is_ok_and(|o| o.get().inner == self.inner)
    }
    fn __repr__(&self) -> String {
        format!(
            "Artifact(name={}, kind={}, bytes={}, id={})",
            py_repr(&self.inner.name),
            py_repr(&self.kind()),
            self.inner.bytes,
            py_repr(&self.inner.id)
        )
    }
}
