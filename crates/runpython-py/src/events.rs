//! What happens during a run before it is handed to Python: the core's events and the Python tools'
//! calls and results. A leaf: the handle that iterates events, the runtime that carries their sender
//! in a run's context and the tools that report their calls all name these, and nothing here names
//! them back.

use serde_json::{json, Value};

use runpython_core::{Event, ToolError};

/// Something that happened during a run, before it is handed to Python.
#[derive(Debug)]
pub(crate) enum EventData {
    /// From the core: output and dependency progress.
    Core(Event),
    /// A Python tool was called.
    ToolCall {
        id: u64,
        name: String,
        arguments: Value,
    },
    /// A Python tool's call finished.
    ToolResult {
        id: u64,
        name: String,
        result: Result<Value, ToolError>,
        duration_ms: f64,
    },
}

/// A tool result as the event's JSON: `{ok, result}` or `{ok, error: {type, message}}`.
pub(crate) fn result_json(result: &Result<Value, ToolError>) -> Value {
    match result {
        Ok(value) => json!({"ok": true, "result": value}),
        Err(e) => json!({"ok": false, "error": {"type": e.kind, "message": e.message}}),
    }
}
