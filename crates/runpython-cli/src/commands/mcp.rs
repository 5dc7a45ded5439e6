//! `runpython mcp`: the MCP server on stdio, as the default tenant or `--tenant`'s.

use std::process::ExitCode;

use crate::args::McpArgs;
use crate::settings;

pub(crate) async fn mcp(args: McpArgs) -> anyhow::Result<ExitCode> {
    let engine = settings::server_engine(&args.engine, 0).await?;
    settings::warm_up(&args.engine, &engine).await?;
    runpython_mcp::serve_stdio(settings::scoped(&args.engine, engine)?).await?;
    Ok(ExitCode::SUCCESS)
}
