//! `runpython tool-spec`: the tool definitions a model is given, in a provider's shape.

use std::process::ExitCode;

use runpython_core::ToolFormat;

use crate::args::ToolSpecArgs;
use crate::settings;

pub(crate) async fn tool_spec(args: ToolSpecArgs) -> anyhow::Result<ExitCode> {
    let python = settings::engine(&args.engine).await?;
    // MCP's shape as `tools/list` serves it (with MCP's transport hints); the providers' from core.
    let spec = match args.format {
        ToolFormat::Mcp => runpython_mcp::tool_list(&python),
        format => python.tool_spec(format),
    };
    say!("{}", serde_json::to_string_pretty(&spec)?);
    Ok(ExitCode::SUCCESS)
}
