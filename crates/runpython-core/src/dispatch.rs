//! The one dispatcher that answers a model's calls of the tools [`crate::protocol::tool_spec`]
//! describes (the MCP server and agent loops share it): `run_python`, `get_run_artifact`, `resume`
//! and `close_session`, against an engine.

use base64::Engine as _;
use serde_json::{json, Map, Value};

use crate::error::Error;
use crate::protocol::request::RUN_PYTHON_TOOL;
use crate::protocol::tool_spec::*;
use crate::RunPython;

/// Bytes `get_run_artifact` returns when the call gives no `length`: enough to read, small enough
/// for a context window.
const DEFAULT_ARTIFACT_SLICE: usize = 64 * 1024;
/// The most one `get_run_artifact` call reads (a model asks for slices; the host holds one at a time).
const MAX_ARTIFACT_SLICE: u64 = 8 << 20;

/// The tools a model is given to drive this engine: `run_python` (its description lists the Python
/// functions the code can call), `get_run_artifact` and `resume`.
pub fn tool_definitions(engine: &RunPython) -> Vec<ToolDefinition> {
    let stubs = runpython_bridge::python_stubs(&engine.exposed_tools());
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
    let open_world = !engine.tools().is_empty()
        || !matches!(engine.sandbox().network, runpython_egress::Network::Off);
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
            engine.limits().timeout.as_secs_f64()
        ),
    });
    if let runpython_egress::Network::Policy(policy) = &engine.sandbox().network {
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
        description: "End the session `session_id` (of run_python): its interpreter and state are \
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
    if engine.is_durable() && engine.store().is_some() {
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
pub fn tool_spec(engine: &RunPython, format: ToolFormat) -> Value {
    Value::Array(
        engine
            .tool_definitions()
            .iter()
            .map(|d| d.to_format(format))
            .collect(),
    )
}

/// [`RunPython::handle_tool_call`] as tool-result content in `format`: the result's JSON as
/// text, then each display image `run_python` handed back (within
/// [`crate::Limits::max_image_bytes`]) as that API's image block, so an agent loop shows the
/// model its charts with no code of its own. Anthropic: `tool_result` content (`text`, `image`
/// with a base64 `source`); OpenAI: Responses API `function_call_output` output (`input_text`,
/// `input_image` with a data URL); MCP: `text` and `image` (`data`, `mimeType`).
pub async fn handle_tool_call_content(
    engine: &RunPython,
    name: &str,
    input: &Value,
    format: ToolFormat,
) -> Result<Value, Error> {
    let (value, images) = if name == RUN_PYTHON_TOOL {
        let request = engine.run_python_request(input)?;
        let envelope = engine.run(request).await?;
        let images = envelope.images.clone();
        let value = serde_json::to_value(&envelope).map_err(|e| Error::Internal(e.to_string()))?;
        (value, images)
    } else {
        (engine.handle_tool_call(name, input).await?, Vec::new())
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
pub async fn handle_tool_call(
    engine: &RunPython,
    name: &str,
    input: &Value,
) -> Result<Value, Error> {
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
            let envelope = engine.run(request).await?;
            serde_json::to_value(&envelope).map_err(|e| Error::Internal(e.to_string()))
        }
        GET_RUN_ARTIFACT_TOOL => {
            reject_unknown(name, input, &["id", "offset", "length"])?;
            let id = input.get("id").and_then(Value::as_str).ok_or_else(|| {
                Error::InvalidInput("get_run_artifact needs `id`, a string".into())
            })?;
            let offset = optional_usize(input, "offset")?.unwrap_or(0);
            let length = optional_usize(input, "length")?.unwrap_or(DEFAULT_ARTIFACT_SLICE);
            let (bytes, total) = engine
                .get_run_artifact_range(id, offset as u64, Some(length as u64), MAX_ARTIFACT_SLICE)
                .await?;
            Ok(artifact_slice(
                id,
                &bytes,
                offset.min(total as usize),
                total,
            ))
        }
        RESUME_TOOL => {
            reject_unknown(name, input, &["run_id", "decisions"])?;
            let run_id = input
                .get("run_id")
                .and_then(Value::as_str)
                .ok_or_else(|| Error::InvalidInput("resume needs `run_id`, a string".into()))?;
            let decisions = match input.get("decisions") {
                None | Some(Value::Null) => std::collections::HashMap::new(),
                Some(Value::Object(map)) => map.clone().into_iter().collect(),
                Some(other) => {
                    return Err(Error::InvalidInput(format!(
                        "resume's `decisions` must be an object of suspension id to decision, not {other}"
                    )))
                }
            };
            let envelope = engine.resume(run_id, decisions).await?;
            serde_json::to_value(&envelope).map_err(|e| Error::Internal(e.to_string()))
        }
        CLOSE_SESSION_TOOL => {
            reject_unknown(CLOSE_SESSION_TOOL, input, &["session_id"])?;
            let id = input
                .get("session_id")
                .and_then(Value::as_str)
                .ok_or_else(|| {
                    Error::InvalidInput("close_session needs `session_id`, a string".into())
                })?;
            engine.session_with_id(id)?.close().await?;
            Ok(json!({"closed": true}))
        }
        other => Err(Error::InvalidInput(format!(
            "no tool named {other:?}; the tools are {RUN_PYTHON_TOOL}, {GET_RUN_ARTIFACT_TOOL}, \
             {CLOSE_SESSION_TOOL} and {RESUME_TOOL}"
        ))),
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
