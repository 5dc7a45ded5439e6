//! What a model is told about runpython and how its calls are read: the tools' names, the shapes a
//! provider expects definitions in, the schemas of `run_python`'s arguments and of the envelope, and
//! the arguments of a call turned into a [`RunRequest`]. The dispatcher that answers the calls is the
//! engine's (`engine/dispatch.rs`).

use std::str::FromStr;

use serde::Serialize;
use serde_json::{json, Map, Value};

use crate::error::Error;
use crate::protocol::request::{FileSource, RunRequest, RUN_PYTHON_TOOL};

/// The name of the tool that reads a kept run's artifact.
pub const GET_RUN_ARTIFACT_TOOL: &str = "get_run_artifact";
/// The name of the tool that resumes a suspended run.
pub const RESUME_TOOL: &str = "resume";
/// The name of the tool that ends a session.
pub const CLOSE_SESSION_TOOL: &str = "close_session";

/// The shape a model provider expects tool definitions in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ToolFormat {
    /// Anthropic Messages API: `{name, description, input_schema}`.
    Anthropic,
    /// OpenAI function calling: `{type: "function", function: {name, description, parameters}}`.
    OpenAi,
    /// Model Context Protocol `tools/list`: `{name, description, inputSchema}`.
    Mcp,
}

impl FromStr for ToolFormat {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self, Error> {
        match s.to_ascii_lowercase().as_str() {
            "anthropic" => Ok(Self::Anthropic),
            "openai" => Ok(Self::OpenAi),
            "mcp" => Ok(Self::Mcp),
            _ => Err(Error::InvalidInput(format!(
                "unknown tool format {s:?}; use anthropic, openai or mcp"
            ))),
        }
    }
}

/// One tool as a model sees it, independent of the provider.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ToolDefinition {
    /// The name the model calls it by.
    pub name: String,
    /// A short human-readable name (MCP's `title`).
    pub title: String,
    /// What it does and what it returns.
    pub description: String,
    /// JSON Schema of the call's input (an object).
    pub input_schema: Value,
    /// JSON Schema of the result (an object), for protocols that carry structured results (MCP's
    /// `outputSchema`: the result is then also given as `structuredContent`).
    pub output_schema: Value,
    /// Behaviour hints for clients (MCP's `annotations`: `readOnlyHint`, `destructiveHint`,
    /// `idempotentHint`, `openWorldHint`).
    pub annotations: Value,
}

impl ToolDefinition {
    /// The definition in `format`'s shape. Only MCP carries the title, output schema and annotations;
    /// the model providers' shapes have no place for them.
    pub fn to_format(&self, format: ToolFormat) -> Value {
        match format {
            ToolFormat::Anthropic => json!({
                "name": self.name,
                "description": self.description,
                "input_schema": self.input_schema,
            }),
            ToolFormat::OpenAi => json!({
                "type": "function",
                "function": {
                    "name": self.name,
                    "description": self.description,
                    "parameters": self.input_schema,
                },
            }),
            ToolFormat::Mcp => json!({
                "name": self.name,
                "title": self.title,
                "description": self.description,
                "inputSchema": self.input_schema,
                "outputSchema": self.output_schema,
                "annotations": self.annotations,
            }),
        }
    }
}

pub(crate) const RUN_PYTHON_INTRO: &str = "Run Python 3 code in a fresh sandboxed process and get a JSON envelope back: \
`status` (success, error, timeout, suspended), `return_value` (the value of the last expression, as JSON; \
its repr when not JSON) and `return_type`, `stdout`/`stderr` (head and tail when long; `truncated` names the \
artifact holding all of it), `error` \
({type, message, traceback} with your own line numbers) and `artifacts` (files the code wrote, readable \
with get_run_artifact). Nothing persists between calls: pass data in `inputs` (globals) instead of pasting \
it into the code. Imports are installed automatically; list extra requirement specs in `dependencies`. \
Top-level `await` works.\n\nWorking in steps on the same data? Pass a `session_id` of your choosing: calls \
with the same id run in one live interpreter, so variables, imports, functions and loaded data stay from \
one call to the next (each call's envelope adds `session_id` and its `cell` number). `reset: true` starts \
the session over; close_session ends it. Use a session for multi-step analysis; leave it out for one-off \
code. A session idle for 10 minutes expires; an envelope with error type SessionLost says its state is \
gone (or `restored: true` says it was rebuilt).";

/// The [`RunRequest`] a `run_python` call with these arguments asks for, checked as
/// [`RunPython::handle_tool_call`] checks them: for a server that starts the run itself
/// ([`RunPython::start`]) to follow its events or cancel it.
pub(crate) fn run_python_request(input: &Value) -> Result<RunRequest, Error> {
    match input {
        Value::Object(map) => run_python_request_from(map),
        Value::Null => run_python_request_from(&Map::new()),
        other => Err(Error::InvalidInput(format!(
            "the arguments of {RUN_PYTHON_TOOL} must be a JSON object, not {other}"
        ))),
    }
}

/// A [`RunRequest`] from the top-level `run_python`'s arguments (those of the nested tool plus
/// `timeout`).
pub(crate) fn run_python_request_from(input: &Map<String, Value>) -> Result<RunRequest, Error> {
    reject_unknown(
        RUN_PYTHON_TOOL,
        input,
        &[
            "code",
            "dependencies",
            "inputs",
            "files",
            "timeout",
            "session_id",
            "reset",
            "allow_hosts",
        ],
    )?;
    let mut request = run_request_from(input)?;
    match input.get("allow_hosts") {
        None | Some(Value::Null) => {}
        Some(Value::Array(items)) => {
            let mut patterns = Vec::with_capacity(items.len());
            for item in items {
                let text = item.as_str().ok_or_else(|| {
                    Error::InvalidInput(format!("`allow_hosts` items must be strings, not {item}"))
                })?;
                patterns.push(text.parse().map_err(|e: runpython_egress::Error| {
                    Error::InvalidInput(format!("`allow_hosts`: {e}"))
                })?);
            }
            request.allow_hosts = Some(patterns);
        }
        Some(other) => {
            return Err(Error::InvalidInput(format!(
                "`allow_hosts` must be a list of host patterns, not {other}"
            )))
        }
    }
    if let Some(timeout) = optional_seconds(input, "timeout")? {
        request = request.timeout(timeout);
    }
    match input.get("session_id") {
        None | Some(Value::Null) => {}
        Some(Value::String(id)) => request = request.session(id.clone()),
        Some(other) => {
            return Err(Error::InvalidInput(format!(
                "`session_id` must be a string, not {other}"
            )))
        }
    }
    match input.get("reset") {
        None | Some(Value::Null) | Some(Value::Bool(false)) => {}
        Some(Value::Bool(true)) if request.session.is_some() => request.reset_session = true,
        Some(Value::Bool(true)) => {
            return Err(Error::InvalidInput(
                "`reset` needs a `session_id`: it starts that session over".into(),
            ))
        }
        Some(other) => {
            return Err(Error::InvalidInput(format!(
                "`reset` must be true or false, not {other}"
            )))
        }
    }
    Ok(request)
}

/// The JSON Schema of [`crate::Envelope`] (MCP's `outputSchema` of `run_python` and `resume`).
/// Loose where the envelope is open (values, previews, the isolation report): clients validate
/// `structuredContent` against it.
pub(crate) fn envelope_schema() -> Value {
    let nullable_object = json!({"type": ["object", "null"]});
    json!({
        "type": "object",
        "properties": {
            "status": {"type": "string", "enum": ["success", "error", "timeout", "suspended"]},
            "return_value": {"description": "The last expression's value as JSON (its repr when not JSON), or null."},
            "return_type": {"type": ["string", "null"]},
            "stdout": {"type": "string"},
            "stderr": {"type": "string"},
            "truncated": nullable_object,
            "error": {
                "type": ["object", "null"],
                "properties": {
                    "type": {"type": "string"},
                    "message": {"type": "string"},
                    "traceback": {"type": ["string", "null"]},
                },
            },
            "artifacts": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "id": {"type": "string"},
                        "name": {"type": "string"},
                        "kind": {"type": "string"},
                        "bytes": {"type": "integer"},
                        "preview": {"type": "string"},
                    },
                },
            },
            "run_id": {"type": "string"},
            "cached": {"type": "boolean"},
            "duration_ms": {"type": "integer"},
            "suspension": nullable_object,
            "return_preview": {"description": "A bounded summary of a large return value, or null."},
            "isolation": nullable_object,
            "kept": {"type": "boolean", "description": "false when the store failed to keep the run after the code ran (absent otherwise)."},
            "store_error": {"type": "string", "description": "The store's error when kept is false."},
            "restore": {
                "type": "object",
                "description": "With restored: how the session came back (from a snapshot, or every cell replayed), and why cells were replayed.",
                "properties": {
                    "from": {"type": "string", "enum": ["snapshot", "replay"]},
                    "snapshot_cells": {"type": ["integer", "null"]},
                    "replayed": {"type": "integer"},
                    "why": {"type": ["string", "null"]},
                    "ms": {"type": "number"},
                    "snapshot_ms": {"type": ["number", "null"]},
                },
            },
        },
        "required": ["status", "return_value", "stdout", "stderr", "error", "artifacts", "run_id"],
    })
}

/// An argument not in `known` is an error naming it and the accepted ones (the schemas say
/// `additionalProperties: false`).
pub(crate) fn reject_unknown(
    tool: &str,
    input: &Map<String, Value>,
    known: &[&str],
) -> Result<(), Error> {
    match input.keys().find(|k| !known.contains(&k.as_str())) {
        None => Ok(()),
        Some(unknown) => Err(Error::InvalidInput(format!(
            "{tool} has no argument `{unknown}`; its arguments are {}",
            known.join(", ")
        ))),
    }
}

/// A positive number of seconds under `key`, if given.
pub(crate) fn optional_seconds(
    input: &Map<String, Value>,
    key: &str,
) -> Result<Option<std::time::Duration>, Error> {
    match input.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_f64()
            .filter(|secs| secs.is_finite() && *secs > 0.0)
            .and_then(|secs| std::time::Duration::try_from_secs_f64(secs).ok())
            .map(Some)
            .ok_or_else(|| {
                Error::InvalidInput(format!(
                    "`{key}` must be a positive number of seconds, not {v}"
                ))
            }),
    }
}

pub(crate) fn optional_usize(
    input: &Map<String, Value>,
    key: &str,
) -> Result<Option<usize>, Error> {
    match input.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_u64()
            .and_then(|n| usize::try_from(n).ok())
            .map(Some)
            .ok_or_else(|| {
                Error::InvalidInput(format!("`{key}` must be a non-negative integer, not {v}"))
            }),
    }
}

/// The input schema of `run_python` (shared with the nested `run_python` tool the code can call).
pub(crate) fn run_python_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "code": {"type": "string", "description": "The Python source. The last expression is the return value."},
            "dependencies": {
                "type": "array",
                "items": {"type": "string"},
                "description": "Extra requirement specs (`pandas>=2`, `pkg[extra]`), on top of what the imports need.",
            },
            "inputs": {
                "type": "object",
                "additionalProperties": true,
                "description": "JSON values bound as globals before the code runs, by name.",
            },
            "files": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "name": {"type": "string", "description": "The file's name in the run's working directory."},
                        "artifact_id": {"type": "string", "description": "A stored artifact's id (from an earlier run, or `runpython artifacts put`)."},
                        "content_base64": {"type": "string", "description": "The file's bytes, base64 (only where the server accepts uploads)."},
                    },
                    "required": ["name"],
                    "additionalProperties": false,
                },
                "description": "Files put in the run's working directory, read-only, before the code runs.",
            },
        },
        "required": ["code"],
        "additionalProperties": false,
    })
}

/// A [`RunRequest`] from `run_python`'s arguments.
pub(crate) fn run_request_from(input: &Map<String, Value>) -> Result<RunRequest, Error> {
    let code = input
        .get("code")
        .and_then(Value::as_str)
        .ok_or_else(|| Error::InvalidInput("run_python needs `code`, a string".into()))?;
    let mut request = RunRequest::new(code);
    match input.get("dependencies") {
        None | Some(Value::Null) => {}
        Some(Value::Array(specs)) => {
            for spec in specs {
                let spec = spec.as_str().ok_or_else(|| {
                    Error::InvalidInput(format!(
                        "`dependencies` must be strings (requirement specs), not {spec}"
                    ))
                })?;
                request = request.dependency(spec);
            }
        }
        Some(other) => {
            return Err(Error::InvalidInput(format!(
                "`dependencies` must be an array of requirement specs, not {other}"
            )))
        }
    }
    match input.get("inputs") {
        None | Some(Value::Null) => {}
        Some(Value::Object(inputs)) => {
            for (name, value) in inputs {
                request = request.input(name, value.clone());
            }
        }
        Some(other) => {
            return Err(Error::InvalidInput(format!(
                "`inputs` must be an object of globals by name, not {other}"
            )))
        }
    }
    match input.get("files") {
        None | Some(Value::Null) => {}
        Some(Value::Array(files)) => {
            for file in files {
                request = with_file(request, file)?;
            }
        }
        Some(other) => {
            return Err(Error::InvalidInput(format!(
                "`files` must be an array of {{name, artifact_id}}, not {other}"
            )))
        }
    }
    Ok(request)
}

/// One `{name, artifact_id}` or `{name, content_base64}` of `run_python`'s `files`.
fn with_file(request: RunRequest, file: &Value) -> Result<RunRequest, Error> {
    use base64::Engine;
    let name = file.get("name").and_then(Value::as_str).ok_or_else(|| {
        Error::InvalidInput(format!("each of `files` needs a `name`, a string: {file}"))
    })?;
    match (
        file.get("artifact_id").and_then(Value::as_str),
        file.get("content_base64").and_then(Value::as_str),
    ) {
        (Some(id), None) => Ok(request.file_artifact(name, id)),
        (None, Some(content)) => {
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(content.trim())
                .map_err(|e| {
                    Error::InvalidInput(format!(
                        "file {name}: `content_base64` is not base64 ({e})"
                    ))
                })?;
            let mut request = request;
            request
                .files
                .push((name.to_owned(), FileSource::Upload(bytes)));
            Ok(request)
        }
        _ => Err(Error::InvalidInput(format!(
            "file {name}: give exactly one of `artifact_id` and `content_base64`"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_requests_are_checked() {
        let ok = json!({"code": "x", "dependencies": ["six"], "inputs": {"x": 1}});
        let request = run_request_from(ok.as_object().unwrap()).unwrap();
        assert_eq!(request.dependencies, ["six"]);
        assert_eq!(request.inputs["x"], 1);
        for bad in [
            json!({}),
            json!({"code": 1}),
            json!({"code": "x", "dependencies": "six"}),
            json!({"code": "x", "inputs": [1]}),
        ] {
            assert!(matches!(
                run_request_from(bad.as_object().unwrap()),
                Err(Error::InvalidInput(_))
            ));
        }
    }
}
