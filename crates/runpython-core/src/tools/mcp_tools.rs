//! Tools backed by another MCP server (`--mcp-server COMMAND`): the server runs as a child process
//! speaking MCP over stdio, its tools are listed once, and each becomes a bridge [`Tool`] whose calls
//! are `tools/call` requests. Like [`crate::CommandTool`], the server runs on the host, outside the
//! sandbox, with the host's environment: it is the host's tool.

use std::fmt;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use rmcp::model::{CallToolRequestParams, CallToolResult, ContentBlock};
use rmcp::service::{RoleClient, RunningService};
use rmcp::transport::TokioChildProcess;
use rmcp::ServiceExt;
use runpython_bridge::{BoxFuture, Tool, ToolArgs, ToolError, ToolSet};
use serde_json::Value;

use crate::error::Error;

/// The `_meta` key of a `tools/call` request that carries the call's idempotency key
/// ([`ToolArgs::call_id`]): the same when a resumed run makes the call again.
pub const CALL_ID_META: &str = "runpython/call_id";

/// How long a server has to start, answer `initialize` and list its tools.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

type Client = RunningService<RoleClient, ()>;

/// A connected MCP server whose tools the code can call.
///
/// ```no_run
/// # async fn demo() -> Result<(), runpython_core::Error> {
/// use runpython_core::{McpServer, RunPython};
///
/// let server = McpServer::connect("npx -y @modelcontextprotocol/server-everything").await?;
/// let python = RunPython::builder().tools(&server.tools()).build()?;
/// # Ok(()) }
/// ```
pub struct McpServer {
    command: String,
    client: Arc<Client>,
    tools: Vec<rmcp::model::Tool>,
}

impl fmt::Debug for McpServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("McpServer")
            .field("command", &self.command)
            .field(
                "tools",
                &self.tools.iter().map(|t| &t.name).collect::<Vec<_>>(),
            )
            .finish_non_exhaustive()
    }
}

impl McpServer {
    /// Starts `sh -c COMMAND`, does the MCP handshake and lists the server's tools. The server's stderr
    /// goes to the host's stderr; it is stopped when the last of its tools is dropped.
    pub async fn connect(command: &str) -> Result<Self, Error> {
        let fail = |message: String| Error::Mcp {
            command: command.to_owned(),
            message,
        };
        let mut cmd = tokio::process::Command::new("sh");
        cmd.arg("-c").arg(command);
        let (transport, _stderr) = TokioChildProcess::builder(cmd)
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| fail(format!("cannot start it: {e}")))?;
        let connect = async {
            let client = ()
                .serve(transport)
                .await
                .map_err(|e| fail(format!("the MCP handshake failed: {e}")))?;
            let tools = client
                .list_all_tools()
                .await
                .map_err(|e| fail(format!("listing its tools failed: {e}")))?;
            Ok::<_, Error>((client, tools))
        };
        let (client, tools) = tokio::time::timeout(CONNECT_TIMEOUT, connect)
            .await
            .map_err(|_| {
                fail(format!(
                    "no answer within {CONNECT_TIMEOUT:?}; is it an MCP server speaking stdio?"
                ))
            })??;
        Ok(Self {
            command: command.to_owned(),
            client: Arc::new(client),
            tools,
        })
    }

    /// The names of the server's tools.
    pub fn tool_names(&self) -> impl Iterator<Item = &str> {
        self.tools.iter().map(|t| t.name.as_ref())
    }

    /// One bridge tool per server tool. A tool whose schema has a property that is not a Python
    /// identifier is offered without a signature (keyword arguments as written).
    pub fn tools(&self) -> ToolSet {
        let mut set = ToolSet::new();
        for tool in &self.tools {
            let mut adapter = McpTool {
                client: Arc::clone(&self.client),
                command: self.command.clone(),
                name: tool.name.to_string(),
                description: tool.description.as_deref().unwrap_or_default().to_owned(),
                schema: Some(Value::Object((*tool.input_schema).clone())),
            };
            if set.insert_arc(Arc::new(adapter.clone())).is_err() {
                adapter.schema = None;
                // Still refused only for an empty name, which no code could call anyway.
                let _ = set.insert_arc(Arc::new(adapter));
            }
        }
        set
    }
}

#[derive(Clone)]
struct McpTool {
    client: Arc<Client>,
    command: String,
    name: String,
    description: String,
    schema: Option<Value>,
}

impl Tool for McpTool {
    fn name(&self) -> &str {
        &self.name
    }
    fn description(&self) -> &str {
        &self.description
    }
    fn input_schema(&self) -> Option<&Value> {
        self.schema.as_ref()
    }
    fn call(&self, args: ToolArgs) -> BoxFuture<'static, Result<Value, ToolError>> {
        let this = self.clone();
        Box::pin(async move {
            if !args.args.is_empty() {
                return Err(ToolError::new(
                    "TypeError",
                    format!(
                        "MCP tool {:?} takes keyword arguments only (its parameters have no order)",
                        this.name
                    ),
                ));
            }
            let mut params = CallToolRequestParams::new(this.name.clone());
            if let Some(call_id) = args.call_id {
                // The idempotency key of the call, for a server with side effects to de-duplicate.
                let mut meta = rmcp::model::RequestMetaObject::new();
                meta.0.insert(CALL_ID_META.into(), Value::String(call_id));
                params.meta = Some(meta);
            }
            let params = params.with_arguments(args.kwargs);
            let result = this.client.call_tool(params).await.map_err(|e| {
                ToolError::new(
                    "ToolError",
                    format!(
                        "MCP server `{}` failed on {:?}: {e}",
                        this.command, this.name
                    ),
                )
            })?;
            result_value(&this.name, result)
        })
    }
}

/// The call's value: structured content when given, else the text content (parsed as JSON when it
/// is JSON); `isError` raises in the code with the text.
fn result_value(name: &str, result: CallToolResult) -> Result<Value, ToolError> {
    let values: Vec<Value> = result.content.iter().map(content_value).collect();
    if result.is_error == Some(true) {
        let message: Vec<String> = values
            .iter()
            .map(|v| match v {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            })
            .collect();
        return Err(ToolError::new(
            "ToolError",
            format!("MCP tool {name:?} failed: {}", message.join("\n")),
        ));
    }
    if let Some(structured) = result.structured_content {
        return Ok(structured);
    }
    Ok(match values.len() {
        0 => Value::Null,
        1 => values.into_iter().next().unwrap_or(Value::Null),
        _ => Value::Array(values),
    })
}

fn content_value(block: &ContentBlock) -> Value {
    match block.as_text() {
        Some(text) => {
            serde_json::from_str(&text.text).unwrap_or_else(|_| Value::String(text.text.clone()))
        }
        None => serde_json::to_value(block).unwrap_or(Value::Null),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn result(v: Value) -> CallToolResult {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn text_content_is_json_when_it_parses() {
        let r = result(json!({"content": [{"type": "text", "text": "{\"a\": 1}"}]}));
        assert_eq!(result_value("t", r).unwrap(), json!({"a": 1}));
        let r = result(json!({"content": [{"type": "text", "text": "plain words"}]}));
        assert_eq!(result_value("t", r).unwrap(), json!("plain words"));
        let r = result(
            json!({"content": [{"type": "text", "text": "1"}, {"type": "text", "text": "x"}]}),
        );
        assert_eq!(result_value("t", r).unwrap(), json!([1, "x"]));
    }

    #[test]
    fn is_error_raises_with_the_text() {
        let r =
            result(json!({"content": [{"type": "text", "text": "no such city"}], "isError": true}));
        let e = result_value("weather", r).unwrap_err();
        assert!(e.message.contains("no such city"), "{e}");
    }
}
