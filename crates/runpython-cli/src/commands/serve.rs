//! `runpython serve`: the MCP server over Streamable HTTP, each token a tenant of its own.

use std::process::ExitCode;

use anyhow::bail;

use crate::args::ServeArgs;
use crate::settings;

pub(crate) async fn serve(args: ServeArgs) -> anyhow::Result<ExitCode> {
    if args.engine.store.tenant.is_some() {
        bail!(
            "serve gives each token a tenant of its own (its name, or jwt:<claim>); --tenant is for \
             the local commands"
        );
    }
    let config = settings::serve_config(&args);
    let engine = settings::server_engine(&args.engine, config.max_runs_per_token + 1).await?;
    settings::warm_up(&args.engine, &engine).await?;
    let server = runpython_mcp::HttpServer::bind(engine, config).await?;
    // The one line a supervisor or test waits for, whatever the log level.
    say_err!(
        "runpython serve: listening on http://{}",
        server.local_addr()
    );
    server.run().await?;
    Ok(ExitCode::SUCCESS)
}
