//! Python stub text for a model to read: `def search(query: str, limit: int = 10) -> Any: """..."""`.

use serde_json::Value;

use crate::tool::{params_of, ToolSet};

/// Python stubs for every tool in the set, one `def` each, with docstrings from the descriptions.
pub fn python_stubs(tools: &ToolSet) -> String {
    let mut out = String::new();
    for tool in tools.iter().filter(|t| !t.is_hidden()) {
        let signature = match tool.input_schema() {
            None => "*args: Any, **kwargs: Any".to_owned(),
            Some(schema) => {
                let mut params = params_of(schema);
                // Python wants parameters without defaults first; the child orders them the same way.
                params.sort_by_key(|p| !p.required);
                params
                    .iter()
                    .map(|p| {
                        let ty = python_type(&p.schema);
                        if p.required {
                            format!("{}: {ty}", p.name)
                        } else {
                            format!("{}: {ty} = {}", p.name, python_literal(&p.default))
                        }
                    })
                    .collect::<Vec<_>>()
                    .join(", ")
            }
        };
        let name = tool.name();
        let name = if crate::tool::is_python_identifier(name) {
            name.to_owned()
        } else {
            format!("tools[{name:?}]  # not an identifier: call it as tools[{name:?}](...)\ndef _")
        };
        out.push_str(&format!("def {name}({signature}) -> Any:\n"));
        let doc = tool.description().trim().replace("\"\"\"", "\\\"\\\"\\\"");
        if doc.is_empty() {
            out.push_str("    ...\n\n");
        } else {
            out.push_str(&format!("    \"\"\"{doc}\"\"\"\n\n"));
        }
    }
    out.truncate(out.trim_end().len());
    out
}

/// The Python annotation for a JSON Schema.
pub(crate) fn python_type(schema: &Value) -> String {
    if let Some(values) = schema.get("enum").and_then(Value::as_array) {
        let literals: Vec<String> = values.iter().map(python_literal).collect();
        return format!("Literal[{}]", literals.join(", "));
    }
    if let Some(options) = schema
        .get("anyOf")
        .or_else(|| schema.get("oneOf"))
        .and_then(Value::as_array)
    {
        return options
            .iter()
            .map(python_type)
            .collect::<Vec<_>>()
            .join(" | ");
    }
    match schema.get("type") {
        Some(Value::String(t)) => json_type(t, schema),
        Some(Value::Array(types)) => types
            .iter()
            .filter_map(Value::as_str)
            .map(|t| json_type(t, schema))
            .collect::<Vec<_>>()
            .join(" | "),
        _ => "Any".into(),
    }
}

fn json_type(t: &str, schema: &Value) -> String {
    match t {
        "string" => "str".into(),
        "integer" => "int".into(),
        "number" => "float".into(),
        "boolean" => "bool".into(),
        "null" => "None".into(),
        "array" => match schema.get("items") {
            Some(items) => format!("list[{}]", python_type(items)),
            None => "list".into(),
        },
        "object" => "dict".into(),
        _ => "Any".into(),
    }
}

/// A JSON value written as a Python literal.
pub(crate) fn python_literal(value: &Value) -> String {
    match value {
        Value::Null => "None".into(),
        Value::Bool(true) => "True".into(),
        Value::Bool(false) => "False".into(),
        Value::Number(n) => n.to_string(),
        Value::String(s) => format!("{s:?}"),
        Value::Array(items) => format!(
            "[{}]",
            items
                .iter()
                .map(python_literal)
                .collect::<Vec<_>>()
                .join(", ")
        ),
        Value::Object(map) => format!(
            "{{{}}}",
            map.iter()
                .map(|(k, v)| format!("{k:?}: {}", python_literal(v)))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tool::tool_fn;
    use serde_json::json;

    #[test]
    fn stub_shows_types_defaults_and_docstring() {
        let mut set = ToolSet::new();
        set.insert(tool_fn(
            "search",
            "Search the web.",
            Some(json!({"type": "object", "properties": {
                "limit": {"type": "integer", "default": 10},
                "query": {"type": "string"},
                "tags": {"type": "array", "items": {"type": "string"}},
                "mode": {"enum": ["fast", "deep"], "default": "fast"}
            }, "required": ["query"]})),
            |_| async { Ok(Value::Null) },
        ))
        .unwrap();
        assert_eq!(
            python_stubs(&set),
            "def search(query: str, limit: int = 10, tags: list[str] = None, mode: Literal[\"fast\", \"deep\"] = \"fast\") -> Any:\n    \"\"\"Search the web.\"\"\""
        );
    }
}
