//! Command tools from the command line: `--tool NAME=COMMAND` with `--tool-doc NAME=TEXT` and
//! `--tool-schema NAME=JSON`, or `--tools-file FILE`. The model reads each tool's description and
//! parameters; the command line stays on the host.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{bail, Context};
use runpython_core::CommandTool;
use serde_json::Value;

/// One entry of a `--tools-file`: a JSON array of these.
const TOOLS_FILE_SHAPE: &str = r#"[{"name": "get_weather", "command": "./weather.sh", "description": "Current weather of a city.", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]"#;

/// `NAME=VALUE` split at the first `=`, both parts non-empty.
pub(crate) fn name_and_value(s: &str, shape: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((name, value)) if !name.is_empty() && !value.trim().is_empty() => {
            Ok((name.to_owned(), value.to_owned()))
        }
        _ => Err(format!("{s:?} is not {shape}")),
    }
}

/// `--tool NAME=COMMAND`.
pub(crate) fn parse_tool(s: &str) -> Result<(String, String), String> {
    name_and_value(s, "NAME=COMMAND")
}

/// The command tools these flags describe, in the order given (the file's first).
pub(crate) fn command_tools(
    tools: &[(String, String)],
    docs: &[(String, String)],
    schemas: &[(String, String)],
    tools_file: Option<&Path>,
) -> anyhow::Result<Vec<CommandTool>> {
    let mut out = match tools_file {
        Some(path) => read_tools_file(path)?,
        None => Vec::new(),
    };
    let mut docs: BTreeMap<&str, &str> =
        docs.iter().map(|(n, t)| (n.as_str(), t.as_str())).collect();
    let mut schemas: BTreeMap<&str, &str> = schemas
        .iter()
        .map(|(n, t)| (n.as_str(), t.as_str()))
        .collect();
    for (name, command) in tools {
        let mut tool = CommandTool::new(name, command);
        if let Some(doc) = docs.remove(name.as_str()) {
            tool = tool.with_description(doc);
        }
        if let Some(json) = schemas.remove(name.as_str()) {
            let schema: Value = serde_json::from_str(json).with_context(|| {
                format!("--tool-schema {name}=...: the schema is not JSON; give an object schema like {{\"type\": \"object\", \"properties\": {{...}}}}")
            })?;
            tool = tool.with_input_schema(schema)?;
        }
        out.push(tool);
    }
    if let Some(name) = docs.keys().chain(schemas.keys()).next() {
        bail!("--tool-doc or --tool-schema names {name:?}, but no --tool {name}=COMMAND is given");
    }
    Ok(out)
}

fn read_tools_file(path: &Path) -> anyhow::Result<Vec<CommandTool>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read the tools file {}", path.display()))?;
    let entries: Vec<Value> = serde_json::from_str(&text).with_context(|| {
        format!(
            "the tools file {} is not a JSON array of tools like {TOOLS_FILE_SHAPE}",
            path.display()
        )
    })?;
    let mut tools = Vec::with_capacity(entries.len());
    for (index, entry) in entries.into_iter().enumerate() {
        let text_field = |field: &str| entry.get(field).and_then(Value::as_str);
        let (Some(name), Some(command)) = (text_field("name"), text_field("command")) else {
            bail!(
                "tool {index} of {} needs a string `name` and `command`, like {TOOLS_FILE_SHAPE}",
                path.display()
            );
        };
        let mut tool = CommandTool::new(name, command);
        match entry.get("description") {
            None | Some(Value::Null) => {}
            Some(Value::String(doc)) => tool = tool.with_description(doc),
            Some(other) => bail!("the description of tool {name:?} must be a string, not {other}"),
        }
        if let Some(schema) = entry.get("input_schema").filter(|s| !s.is_null()) {
            tool = tool.with_input_schema(schema.clone())?;
        }
        tools.push(tool);
    }
    Ok(tools)
}

#[cfg(test)]
mod tests {
    use super::*;
    use runpython_core::Tool;

    fn pair(name: &str, value: &str) -> (String, String) {
        (name.into(), value.into())
    }

    #[test]
    fn docs_and_schemas_attach_to_their_tool_and_strays_are_refused() {
        let tools = command_tools(
            &[pair("weather", "./w.sh --token=abc")],
            &[pair("weather", "Current weather.")],
            &[pair(
                "weather",
                r#"{"type": "object", "properties": {"city": {"type": "string"}}}"#,
            )],
            None,
        )
        .unwrap();
        assert_eq!(tools[0].description(), "Current weather.");
        assert!(tools[0].input_schema().is_some());
        let stray = command_tools(&[], &[pair("nope", "x")], &[], None).unwrap_err();
        assert!(
            stray.to_string().contains("no --tool nope=COMMAND"),
            "{stray}"
        );
        let bad = command_tools(&[pair("t", "c")], &[], &[pair("t", "[1]")], None).unwrap_err();
        assert!(format!("{bad:#}").contains("object schema"), "{bad:#}");
    }

    #[test]
    fn a_tools_file_gives_names_commands_descriptions_and_schemas() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tools.json");
        std::fs::write(&path, TOOLS_FILE_SHAPE).unwrap();
        let tools = command_tools(&[], &[], &[], Some(&path)).unwrap();
        assert_eq!(tools[0].name(), "get_weather");
        assert_eq!(tools[0].description(), "Current weather of a city.");
        std::fs::write(&path, r#"[{"name": "x"}]"#).unwrap();
        let e = command_tools(&[], &[], &[], Some(&path)).unwrap_err();
        assert!(e.to_string().contains("`command`"), "{e}");
    }
}
