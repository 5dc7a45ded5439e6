//! `runpython mcp`: `run_python`, `get_run_artifact` and `resume` served over MCP on stdio.
//!
//! A run's envelope is the tool's result whatever its status (the code raising or timing out is an
//! outcome the model should read), so `isError` is false with the envelope as text content; `isError`
//! is true only when the call could not be served: bad arguments, an unknown or finished run to resume, or
//! runpython's own failures (spawn, store, protocol).

use anyhow::Context;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ErrorData,
    Implementation, ListToolsResult, PaginatedRequestParams, ServerCapabilities, ServerConfig,
    Tool,
};
use rmcp::service::{RequestContext, RoleServer};
use rmcp::{ServerHandler, ServiceExt};
use runpython_core::{RunPython, ToolFormat};
use serde_json::Value;

struct Server {
    python: RunPython,
    tools: Vec<Tool>,
}

impl ServerHandler for Server {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("runpython", env!("CARGO_PKG_VERSION")))
            .with_instructions(
                "Run Python with run_python: each call is a fresh sandboxed process returning a JSON \
                 envelope (status, return_value, stdout, stderr, error, artifacts). A status other than \
                 success is the code's outcome, not a failure of the tool.",
            )
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(self.tools.clone()))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let input = request.arguments.map_or(Value::Null, Value::Object);
        let result = match self.python.handle_tool_call(&request.name, &input).await {
            Ok(value) => CallToolResult::success(vec![ContentBlock::text(value.to_string())]),
            Err(e) => CallToolResult::error(vec![ContentBlock::text(e.to_string())]),
        };
        Ok(result.into())
    }
}

/// Serves until the client closes stdin.
pub async fn serve(python: RunPython) -> anyhow::Result<()> {
    let tools = python
        .tool_spec(ToolFormat::Mcp)
        .as_array()
        .into_iter()
        .flatten()
        .map(|spec| serde_json::from_value::<Tool>(spec.clone()))
        .collect::<Result<Vec<_>, _>>()
        .context("the tool definitions are not MCP tools")?;
    let server = Server { python, tools };
    let running = server
        .serve(rmcp::transport::stdio())
        .await
        .context("the MCP handshake on stdio failed")?;
    running.waiting().await.context("the MCP server stopped")?;
    Ok(())
}
