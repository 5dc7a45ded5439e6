//! The tools this server serves, as `tools/list` lists them: the engine's definitions in MCP's shape
//! with MCP's transport hints added (core describes tools without them), and the check of a call's
//! arguments against the schemas listed.

use runpython_core::{RunPython, ToolFormat};
use serde_json::{json, Map, Value};

/// The `x-mcp-header` name of a call's `session_id` (SEP-2243): stateless-protocol clients send it as
/// `Mcp-Param-Session-Id`, which a load balancer can hash on.
pub const SESSION_ID_HEADER: &str = "Session-Id";

/// The argument of `run_python` and `close_session` that names a session.
const SESSION_ID: &str = "session_id";

/// `engine`'s tools as `tools/list` serves them, a JSON array: [`RunPython::tool_spec`] in MCP's
/// shape, with each `session_id` property annotated `x-mcp-header: Session-Id`.
pub fn tool_list(engine: &RunPython) -> Value {
    let mut spec = engine.tool_spec(ToolFormat::Mcp);
    for tool in spec.as_array_mut().into_iter().flatten() {
        let session_id = tool
            .get_mut("inputSchema")
            .and_then(|schema| schema.get_mut("properties"))
            .and_then(|properties| properties.get_mut(SESSION_ID))
            .and_then(Value::as_object_mut);
        if let Some(property) = session_id {
            // SEP-2243: clients of the stateless 2026-07-28 protocol mirror it into an
            // `Mcp-Param-Session-Id` header, so a proxy can route a session's cells by hash without
            // reading bodies (its state is in the store either way; this only keeps it warm).
            property.insert("x-mcp-header".into(), json!(SESSION_ID_HEADER));
        }
    }
    spec
}

/// Checks call arguments against a tool's declared input schema (the flat object schemas of
/// `runpython_core::ToolDefinition`): required properties, `additionalProperties: false`, each
/// property's `type`, `items.type` of arrays, `minimum`/`exclusiveMinimum`.
pub(crate) fn check_arguments(schema: &Value, args: &Map<String, Value>) -> Result<(), String> {
    let properties = schema["properties"].as_object();
    for required in schema["required"].as_array().into_iter().flatten() {
        if let Some(key) = required.as_str() {
            if !args.contains_key(key) {
                return Err(format!("`{key}` is required"));
            }
        }
    }
    for (key, value) in args {
        let Some(property) = properties.and_then(|p| p.get(key)) else {
            if schema["additionalProperties"] == json!(false) {
                let known: Vec<&str> = properties
                    .map(|p| p.keys().map(String::as_str).collect())
                    .unwrap_or_default();
                return Err(format!(
                    "unknown argument `{key}`; the arguments are {}",
                    known.join(", ")
                ));
            }
            continue;
        };
        if value.is_null()
            && !schema["required"]
                .as_array()
                .is_some_and(|r| r.contains(&json!(key)))
        {
            continue; // an optional argument given as null is the same as absent
        }
        if !has_type(value, &property["type"]) {
            return Err(format!("`{key}` must be {}, not {value}", property["type"]));
        }
        if let Some(item_type) = property["items"].get("type") {
            for item in value.as_array().into_iter().flatten() {
                if !has_type(item, item_type) {
                    return Err(format!("`{key}` items must be {item_type}, not {item}"));
                }
            }
        }
        if let (Some(n), Some(min)) = (value.as_f64(), property["minimum"].as_f64()) {
            if n < min {
                return Err(format!("`{key}` must be at least {min}, not {value}"));
            }
        }
        if let (Some(n), Some(min)) = (value.as_f64(), property["exclusiveMinimum"].as_f64()) {
            if n <= min {
                return Err(format!("`{key}` must be more than {min}, not {value}"));
            }
        }
    }
    Ok(())
}

fn has_type(value: &Value, expected: &Value) -> bool {
    match expected {
        Value::String(t) => match t.as_str() {
            "string" => value.is_string(),
            "integer" => value.is_i64() || value.is_u64(),
            "number" => value.is_number(),
            "boolean" => value.is_boolean(),
            "object" => value.is_object(),
            "array" => value.is_array(),
            "null" => value.is_null(),
            _ => true,
        },
        Value::Array(types) => types.iter().any(|t| has_type(value, t)),
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn schema() -> Value {
        json!({
            "type": "object",
            "properties": {
                "code": {"type": "string"},
                "dependencies": {"type": "array", "items": {"type": "string"}},
                "timeout": {"type": "number", "exclusiveMinimum": 0},
                "offset": {"type": "integer", "minimum": 0},
            },
            "required": ["code"],
            "additionalProperties": false,
        })
    }

    fn check(args: Value) -> Result<(), String> {
        check_arguments(&schema(), args.as_object().unwrap())
    }

    #[test]
    fn arguments_outside_the_declared_schema_are_refused() {
        assert!(check(json!({"code": "1", "timeout": 2.5, "dependencies": ["six"]})).is_ok());
        assert!(check(json!({"code": "1", "timeout": null})).is_ok());
        let unknown = check(json!({"code": "1", "source": "x"})).unwrap_err();
        assert!(unknown.contains("unknown argument `source`"), "{unknown}");
        assert!(check(json!({"timeout": 1}))
            .unwrap_err()
            .contains("`code` is required"));
        assert!(check(json!({"code": 1})).is_err());
        assert!(check(json!({"code": "1", "dependencies": [1]})).is_err());
        assert!(check(json!({"code": "1", "timeout": 0})).is_err());
        assert!(check(json!({"code": "1", "offset": -1})).is_err());
        assert!(check(json!({"code": "1", "offset": 1.5})).is_err());
    }

    #[test]
    fn only_session_ids_carry_the_mcp_header_hint() {
        let engine = RunPython::builder()
            .pool(runpython_core::PoolConfig {
                size: 0,
                ..runpython_core::PoolConfig::default()
            })
            .store(runpython_core::Store::open("memory://").unwrap())
            .approval("ask_a_person")
            .build()
            .unwrap();
        let listed = tool_list(&engine);
        let mut annotated = Vec::new();
        for tool in listed.as_array().unwrap() {
            for (name, property) in tool["inputSchema"]["properties"].as_object().unwrap() {
                if let Some(header) = property.get("x-mcp-header") {
                    assert_eq!(header, SESSION_ID_HEADER);
                    annotated.push(format!("{}.{name}", tool["name"].as_str().unwrap()));
                }
            }
        }
        assert_eq!(
            annotated,
            ["run_python.session_id", "close_session.session_id"]
        );
        // The rest of each definition is the engine's own.
        let spec = engine.tool_spec(ToolFormat::Mcp);
        assert_eq!(
            listed.as_array().unwrap().len(),
            spec.as_array().unwrap().len()
        );
        assert_eq!(listed[1], spec[1]);
    }
}
