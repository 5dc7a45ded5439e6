//! What a model is told about runpython: the `run_python`, `get_run_artifact` and `resume` tool
//! definitions in each provider's shape, and the one dispatcher that answers those tools' calls (used by
//! the MCP server and by agent loops alike).

use std::str::FromStr;

use base64::Engine as _;
use serde::Serialize;
use serde_json::{json, Map, Value};

use crate::engine::RunPython;
use crate::error::Error;
use crate::request::{run_python_schema, run_request_from, RUN_PYTHON_TOOL};

/// The name of the tool that reads a kept run's artifact.
pub const GET_RUN_ARTIFACT_TOOL: &str = "get_run_artifact";
/// The name of the tool that resumes a suspended run.
pub const RESUME_TOOL: &str = "resume";

/// Bytes `get_run_artifact` returns when the call gives no `length`: enough to read, small enough
/// for a context window.
const DEFAULT_ARTIFACT_SLICE: usize = 64 * 1024;

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
    /// What it does and what it returns.
    pub description: String,
    /// JSON Schema of the call's input (an object).
    pub input_schema: Value,
}

impl ToolDefinition {
    /// The definition in `format`'s shape.
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
                "description": self.description,
                "inputSchema": self.input_schema,
            }),
        }
    }
}

const RUN_PYTHON_INTRO: &str = "Run Python 3 code in a fresh sandboxed process and get a JSON envelope back: \
`status` (success, error, timeout, suspended), `return_value` (the value of the last expression, as JSON; \
its repr when not JSON) and `return_type`, `stdout`/`stderr` (truncated head and tail when long), `error` \
({type, message, traceback} with your own line numbers) and `artifacts` (files the code wrote, readable \
with get_run_artifact). Nothing persists between calls: pass data in `inputs` (globals) instead of pasting \
it into the code. Imports are installed automatically; list extra requirement specs in `dependencies`. \
Top-level `await` works.";

impl RunPython {
    /// The tools a model is given to drive this engine: `run_python` (its description lists the Python
    /// functions the code can call), `get_run_artifact` and `resume`.
    pub fn tool_definitions(&self) -> Vec<ToolDefinition> {
        let stubs = runpython_bridge::python_stubs(&self.exposed_tools());
        let mut run_description = RUN_PYTHON_INTRO.to_owned();
        if !stubs.is_empty() {
            run_description.push_str(
                "\n\nThese functions are predefined in the code's globals (they call the host; call them \
                 plainly, or `await` them to run several at once with asyncio.gather):\n\n```python\n",
            );
            run_description.push_str(&stubs);
            run_description.push_str("\n```");
        }
        vec![
            ToolDefinition {
                name: RUN_PYTHON_TOOL.into(),
                description: run_description,
                input_schema: run_python_schema(),
            },
            ToolDefinition {
                name: GET_RUN_ARTIFACT_TOOL.into(),
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
            },
            ToolDefinition {
                name: RESUME_TOOL.into(),
                description: "Resume a run whose envelope has status `suspended`, giving a decision for each \
                              pending request named in its `suspension`. Returns the resumed run's envelope."
                    .into(),
                input_schema: json!({
                    "type": "object",
                    "properties": {
                        "run_id": {"type": "string", "description": "The suspended run's `run_id`."},
                        "decisions": {
                            "type": "object",
                            "description": "Decision per pending request id, e.g. {\"call-1\": {\"approve\": true}}.",
                            "additionalProperties": true,
                        },
                    },
                    "required": ["run_id", "decisions"],
                    "additionalProperties": false,
                }),
            },
        ]
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
                let request = run_request_from(input)?;
                let envelope = self.run(request).await?;
                serde_json::to_value(&envelope).map_err(|e| Error::Internal(e.to_string()))
            }
            GET_RUN_ARTIFACT_TOOL => {
                let id = input.get("id").and_then(Value::as_str).ok_or_else(|| {
                    Error::InvalidInput("get_run_artifact needs `id`, a string".into())
                })?;
                let offset = optional_usize(input, "offset")?.unwrap_or(0);
                let length = optional_usize(input, "length")?;
                let bytes = self.get_run_artifact(id).await?;
                Ok(artifact_slice(id, &bytes, offset, length))
            }
            RESUME_TOOL => {
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
            other => Err(Error::InvalidInput(format!(
                "no tool named {other:?}; the tools are {RUN_PYTHON_TOOL}, {GET_RUN_ARTIFACT_TOOL} and {RESUME_TOOL}"
            ))),
        }
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

fn artifact_slice(id: &str, bytes: &[u8], offset: usize, length: Option<usize>) -> Value {
    let start = offset.min(bytes.len());
    let end = start
        .saturating_add(length.unwrap_or(DEFAULT_ARTIFACT_SLICE))
        .min(bytes.len());
    let slice = &bytes[start..end];
    let mut out = json!({
        "id": id,
        "offset": start,
        "length": slice.len(),
        "total_bytes": bytes.len(),
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
    fn artifact_slices_are_clamped_and_binary_is_base64() {
        let v = artifact_slice("a", b"hello world", 6, Some(100));
        assert_eq!(v["text"], "world");
        assert_eq!(v["length"], 5);
        assert_eq!(v["total_bytes"], 11);
        let v = artifact_slice("a", b"hi", 10, None);
        assert_eq!(
            (v["offset"].clone(), v["text"].clone()),
            (json!(2), json!(""))
        );
        let v = artifact_slice("a", &[0xff, 0x00], 0, None);
        assert_eq!(v["base64"], "/wA=");
    }
}
