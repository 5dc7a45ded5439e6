//! What a model is told about runpython: the `run_python`, `get_run_artifact` and `resume` tool
//! definitions in each provider's shape, and the one dispatcher that answers those tools' calls (used by
//! the MCP server and by agent loops alike).

use std::str::FromStr;

use base64::Engine as _;
use serde::Serialize;
use serde_json::{json, Map, Value};

use crate::engine::RunPython;
use crate::error::Error;
use crate::request::{run_python_schema, run_request_from, RunRequest, RUN_PYTHON_TOOL};

/// The name of the tool that reads a kept run's artifact.
pub const GET_RUN_ARTIFACT_TOOL: &str = "get_run_artifact";
/// The name of the tool that resumes a suspended run.
pub const RESUME_TOOL: &str = "resume";
/// The name of the tool that ends a session.
pub const CLOSE_SESSION_TOOL: &str = "close_session";

/// Bytes `get_run_artifact` returns when the call gives no `length`: enough to read, small enough
/// for a context window.
const DEFAULT_ARTIFACT_SLICE: usize = 64 * 1024;
/// The most one `get_run_artifact` call reads (a model asks for slices; the host holds one at a time).
const MAX_ARTIFACT_SLICE: u64 = 8 << 20;

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

const RUN_PYTHON_INTRO: &str = "Run Python 3 code in a fresh sandboxed process and get a JSON envelope back: \
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

impl RunPython {
    /// The tools a model is given to drive this engine: `run_python` (its description lists the Python
    /// functions the code can call), `get_run_artifact` and `resume`.
    pub fn tool_definitions(&self) -> Vec<ToolDefinition> {
        let stubs = runpython_bridge::python_stubs(&self.exposed_tools());
        let mut run_description = RUN_PYTHON_INTRO.to_owned();
        if !stubs.is_empty() {
            run_description.push_str(
                "\n\nThese functions are predefined in the code's globals (they call the host). A call \
                 returns its value; where the same function awaits its result or hands it to asyncio \
                 (`await f()`, `t = f()` then `await asyncio.gather(t, g())`, `create_task`, `wait`, a \
                 list of calls gathered with `*`) it starts at once and returns an awaitable, so those \
                 calls run concurrently:\n\n```python\n",
            );
            run_description.push_str(&stubs);
            run_description.push_str("\n```");
        }
        // Tools or the network let the code reach beyond the sandbox.
        let open_world = !self.tools().is_empty()
            || !matches!(self.sandbox().network, runpython_egress::Network::Off);
        let mut run_schema = run_python_schema();
        run_schema["properties"]["session_id"] = json!({
            "type": "string",
            "pattern": "^[A-Za-z0-9._-]{1,64}$",
            "description": "Keep state across calls: calls with the same id share one live interpreter.",
        });
        run_schema["properties"]["reset"] = json!({
            "type": "boolean",
            "description": "With session_id: start the session over (empty) before running the code.",
        });
        run_schema["properties"]["timeout"] = json!({
            "type": "number",
            "exclusiveMinimum": 0,
            "description": format!(
                "Seconds before the run is stopped (default and maximum {}).",
                self.limits().timeout.as_secs_f64()
            ),
        });
        if let runpython_egress::Network::Policy(policy) = &self.sandbox().network {
            run_schema["properties"]["allow_hosts"] = json!({
                "type": "array",
                "items": {"type": "string"},
                "description": format!(
                    "Only these hosts for this run ([] for no network), within what the server allows ({}): \
                     names, *.name, IPs or CIDRs, each with an optional :port.",
                    match policy.public {
                        true => "the public internet",
                        false => "an allowlist",
                    }
                ),
            });
        }
        let mut definitions = vec![
            ToolDefinition {
                name: RUN_PYTHON_TOOL.into(),
                title: "Run Python".into(),
                description: run_description,
                input_schema: run_schema,
                output_schema: envelope_schema(),
                annotations: json!({
                    "readOnlyHint": false,
                    "destructiveHint": false,
                    "idempotentHint": false,
                    "openWorldHint": open_world,
                }),
            },
            ToolDefinition {
                name: GET_RUN_ARTIFACT_TOOL.into(),
                title: "Read a run's artifact".into(),
                description: format!(
                    "Read an artifact of an earlier run (an `id` from an envelope's `artifacts`). Returns \
                     {{id, offset, length, total_bytes}} with `text` for UTF-8 content or `base64` otherwise. \
                     Without `length` at most {DEFAULT_ARTIFACT_SLICE} bytes are returned; page with `offset`."
                ),
                input_schema: json!({
                    "type": "object",
                    "properties": {
                        "id": {"type": "string", "description": "The artifact id."},
                        "offset": {"type": "integer", "minimum": 0, "description": "First byte to return (default 0)."},
                        "length": {"type": "integer", "minimum": 0, "description": "Bytes to return."},
                    },
                    "required": ["id"],
                    "additionalProperties": false,
                }),
                output_schema: json!({
                    "type": "object",
                    "properties": {
                        "id": {"type": "string"},
                        "offset": {"type": "integer"},
                        "length": {"type": "integer"},
                        "total_bytes": {"type": "integer"},
                        "text": {"type": "string", "description": "The slice, when it is UTF-8."},
                        "base64": {"type": "string", "description": "The slice, base64, when it is not UTF-8."},
                    },
                    "required": ["id", "offset", "length", "total_bytes"],
                }),
                annotations: json!({
                    "readOnlyHint": true,
                    "idempotentHint": true,
                    "openWorldHint": false,
                }),
            },
        ];
        definitions.push(ToolDefinition {
            name: CLOSE_SESSION_TOOL.into(),
            title: "End a session".into(),
            description:
                "End the session `session_id` (of run_python): its interpreter and state are \
                          discarded. Returns {closed: true}."
                    .into(),
            input_schema: json!({
                "type": "object",
                "properties": {
                    "session_id": {"type": "string", "description": "The session to end."},
                },
                "required": ["session_id"],
                "additionalProperties": false,
            }),
            output_schema: json!({
                "type": "object",
                "properties": {"closed": {"type": "boolean"}},
                "required": ["closed"],
            }),
            annotations: json!({
                "readOnlyHint": false,
                "destructiveHint": true,
                "idempotentHint": true,
                "openWorldHint": false,
            }),
        });
        // Only a durable engine (one with an approval tool) keeps the checkpoints resume needs.
        if self.is_durable() && self.store().is_some() {
            definitions.push(ToolDefinition {
                name: RESUME_TOOL.into(),
                title: "Resume a suspended run".into(),
                description: "Resume a run whose envelope has status `suspended`, giving a decision for each \
                              pending request named in its `suspension` (by its `id`, e.g. `s0`). Returns the \
                              resumed run's envelope, which may be suspended again."
                    .into(),
                input_schema: json!({
                    "type": "object",
                    "properties": {
                        "run_id": {"type": "string", "description": "The suspended run's `run_id`."},
                        "decisions": {
                            "type": "object",
                            "description": "Decision per pending suspension id (the envelope's `suspension.id`: `s` and the tool call's ordinal, `s0` for the code's first call), e.g. {\"s0\": true} or {\"s2\": {\"approved\": false, \"reason\": \"too costly\"}}.",
                            "additionalProperties": true,
                        },
                    },
                    "required": ["run_id", "decisions"],
                    "additionalProperties": false,
                }),
                output_schema: envelope_schema(),
                annotations: json!({
                    "readOnlyHint": false,
                    "destructiveHint": false,
                    "idempotentHint": false,
                    "openWorldHint": open_world,
                }),
            });
        }
        definitions
    }

    /// [`RunPython::tool_definitions`] in `format`'s shape, as a JSON array.
    pub fn tool_spec(&self, format: ToolFormat) -> Value {
        Value::Array(
            self.tool_definitions()
                .iter()
                .map(|d| d.to_format(format))
                .collect(),
        )
    }

    /// The [`RunRequest`] a `run_python` call with these arguments asks for, checked as
    /// [`RunPython::handle_tool_call`] checks them: for a server that starts the run itself
    /// ([`RunPython::start`]) to follow its events or cancel it.
    pub fn run_python_request(&self, input: &Value) -> Result<RunRequest, Error> {
        match input {
            Value::Object(map) => run_python_request_from(map),
            Value::Null => run_python_request_from(&Map::new()),
            other => Err(Error::InvalidInput(format!(
                "the arguments of {RUN_PYTHON_TOOL} must be a JSON object, not {other}"
            ))),
        }
    }

    /// [`RunPython::handle_tool_call`] as tool-result content in `format`: the result's JSON as
    /// text, then each display image `run_python` handed back (within
    /// [`crate::Limits::max_image_bytes`]) as that API's image block, so an agent loop shows the
    /// model its charts with no code of its own. Anthropic: `tool_result` content (`text`, `image`
    /// with a base64 `source`); OpenAI: Responses API `function_call_output` output (`input_text`,
    /// `input_image` with a data URL); MCP: `text` and `image` (`data`, `mimeType`).
    pub async fn handle_tool_call_content(
        &self,
        name: &str,
        input: &Value,
        format: ToolFormat,
    ) -> Result<Value, Error> {
        let (value, images) = if name == RUN_PYTHON_TOOL {
            let request = self.run_python_request(input)?;
            let envelope = self.run(request).await?;
            let images = envelope.images.clone();
            let value =
                serde_json::to_value(&envelope).map_err(|e| Error::Internal(e.to_string()))?;
            (value, images)
        } else {
            (self.handle_tool_call(name, input).await?, Vec::new())
        };
        let text = value.to_string();
        let mut content = vec![match format {
            ToolFormat::OpenAi => json!({"type": "input_text", "text": text}),
            _ => json!({"type": "text", "text": text}),
        }];
        for image in images {
            content.push(match format {
                ToolFormat::Anthropic => json!({"type": "image", "source": {
                    "type": "base64", "media_type": image.mime, "data": image.data}}),
                ToolFormat::OpenAi => json!({"type": "input_image",
                    "image_url": format!("data:{};base64,{}", image.mime, image.data)}),
                ToolFormat::Mcp => {
                    json!({"type": "image", "data": image.data, "mimeType": image.mime})
                }
            });
        }
        Ok(Value::Array(content))
    }

    /// Answers a model's call of one of [`RunPython::tool_definitions`]: `run_python` gives the
    /// envelope (whatever its status: that is the outcome), `get_run_artifact` a slice of the artifact.
    /// `resume` continues a suspended run with `decisions` (suspension id → decision). `Err` is for calls
    /// that cannot be served: bad arguments ([`Error::InvalidInput`]) or runpython's own failures.
    pub async fn handle_tool_call(&self, name: &str, input: &Value) -> Result<Value, Error> {
        let empty = Map::new();
        let input = match input {
            Value::Object(map) => map,
            Value::Null => &empty,
            other => {
                return Err(Error::InvalidInput(format!(
                    "the arguments of {name} must be a JSON object, not {other}"
                )))
            }
        };
        match name {
            RUN_PYTHON_TOOL => {
                let request = run_python_request_from(input)?;
                let envelope = self.run(request).await?;
                serde_json::to_value(&envelope).map_err(|e| Error::Internal(e.to_string()))
            }
            GET_RUN_ARTIFACT_TOOL => {
                reject_unknown(name, input, &["id", "offset", "length"])?;
                let id = input.get("id").and_then(Value::as_str).ok_or_else(|| {
                    Error::InvalidInput("get_run_artifact needs `id`, a string".into())
                })?;
                let offset = optional_usize(input, "offset")?.unwrap_or(0);
                let length = optional_usize(input, "length")?.unwrap_or(DEFAULT_ARTIFACT_SLICE);
                let (bytes, total) = self
                    .get_run_artifact_range(id, offset as u64, Some(length as u64), MAX_ARTIFACT_SLICE)
                    .await?;
                Ok(artifact_slice(id, &bytes, offset.min(total as usize), total))
            }
            RESUME_TOOL => {
                reject_unknown(name, input, &["run_id", "decisions"])?;
                let run_id = input.get("run_id").and_then(Value::as_str).ok_or_else(|| {
                    Error::InvalidInput("resume needs `run_id`, a string".into())
                })?;
                let decisions = match input.get("decisions") {
                    None | Some(Value::Null) => std::collections::HashMap::new(),
                    Some(Value::Object(map)) => map.clone().into_iter().collect(),
                    Some(other) => {
                        return Err(Error::InvalidInput(format!(
                            "resume's `decisions` must be an object of suspension id to decision, not {other}"
                        )))
                    }
                };
                let envelope = self.resume(run_id, decisions).await?;
                serde_json::to_value(&envelope).map_err(|e| Error::Internal(e.to_string()))
            }
            CLOSE_SESSION_TOOL => {
                reject_unknown(CLOSE_SESSION_TOOL, input, &["session_id"])?;
                let id = input.get("session_id").and_then(Value::as_str).ok_or_else(|| {
                    Error::InvalidInput("close_session needs `session_id`, a string".into())
                })?;
                self.session_with_id(id)?.close().await?;
                Ok(json!({"closed": true}))
            }
            other => Err(Error::InvalidInput(format!(
                "no tool named {other:?}; the tools are {RUN_PYTHON_TOOL}, {GET_RUN_ARTIFACT_TOOL}, \
                 {CLOSE_SESSION_TOOL} and {RESUME_TOOL}"
            ))),
        }
    }
}

/// A [`RunRequest`] from the top-level `run_python`'s arguments (those of the nested tool plus
/// `timeout`).
fn run_python_request_from(input: &Map<String, Value>) -> Result<RunRequest, Error> {
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
fn envelope_schema() -> Value {
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
        },
        "required": ["status", "return_value", "stdout", "stderr", "error", "artifacts", "run_id"],
    })
}

/// An argument not in `known` is an error naming it and the accepted ones (the schemas say
/// `additionalProperties: false`).
fn reject_unknown(tool: &str, input: &Map<String, Value>, known: &[&str]) -> Result<(), Error> {
    match input.keys().find(|k| !known.contains(&k.as_str())) {
        None => Ok(()),
        Some(unknown) => Err(Error::InvalidInput(format!(
            "{tool} has no argument `{unknown}`; its arguments are {}",
            known.join(", ")
        ))),
    }
}

/// A positive number of seconds under `key`, if given.
fn optional_seconds(
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

fn optional_usize(input: &Map<String, Value>, key: &str) -> Result<Option<usize>, Error> {
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

/// A slice read from `offset` of an artifact of `total` bytes, for the model.
fn artifact_slice(id: &str, slice: &[u8], offset: usize, total: u64) -> Value {
    let mut out = json!({
        "id": id,
        "offset": offset,
        "length": slice.len(),
        "total_bytes": total,
    });
    match std::str::from_utf8(slice) {
        Ok(text) => out["text"] = json!(text),
        Err(_) => out["base64"] = json!(base64::engine::general_purpose::STANDARD.encode(slice)),
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn artifact_slices_say_where_they_are_and_binary_is_base64() {
        let v = artifact_slice("a", b"world", 6, 11);
        assert_eq!(v["text"], "world");
        assert_eq!(v["length"], 5);
        assert_eq!(v["total_bytes"], 11);
        let v = artifact_slice("a", b"", 2, 2);
        assert_eq!(
            (v["offset"].clone(), v["text"].clone()),
            (json!(2), json!(""))
        );
        let v = artifact_slice("a", &[0xff, 0x00], 0, 2);
        assert_eq!(v["base64"], "/wA=");
    }
}
