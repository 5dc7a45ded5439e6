//! The flags of the commands over the store alone: `--store` and `--tenant`, and `artifacts`'
//! subcommands.

use clap::{Args, Subcommand};

#[derive(Debug, Subcommand)]
pub(crate) enum ArtifactsCommand {
    /// List artifacts, of one run or of all kept runs.
    List {
        /// Only this run's artifacts.
        #[arg(long = "run", value_name = "RUN_ID")]
        run_id: Option<String>,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        store: StoreArgs,
    },
    /// Store a host file as an artifact and print its id (for `run --file @ID=NAME`, `--input
    /// NAME=@ID`, MCP's `files`). It is kept as a run of its own: 24 hours, or until deleted with
    /// --persistent.
    Put {
        /// The file.
        file: std::path::PathBuf,
        /// Its name in the store (default: the file's own name).
        #[arg(long, value_name = "NAME")]
        name: Option<String>,
        /// Keep it until deleted instead of 24 hours.
        #[arg(long)]
        persistent: bool,
        /// Print JSON (`{"id", "name", "bytes", "run_id"}`) instead of the id alone.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        store: StoreArgs,
    },
    /// Write an artifact's bytes to stdout.
    Get {
        /// The artifact id (from the envelope or `artifacts list`).
        id: String,
        #[command(flatten)]
        store: StoreArgs,
    },
}

#[derive(Debug, Args)]
pub(crate) struct StoreArgs {
    /// Where runs are kept: file:///DIR, memory://, s3://BUCKET/PREFIX (default: a directory under the
    /// user's data dir).
    #[arg(long, value_name = "URL")]
    pub(crate) store: Option<String>,
    /// The tenant: a `serve` token's name, or `jwt:<claim>` for an access token's. `runs`,
    /// `artifacts` and `gc` act on that tenant's only (without it: on every tenant's); `run`,
    /// `resume`, `repl` and `mcp` run as it (without it: as the default tenant, the local one).
    #[arg(long, value_name = "NAME")]
    pub(crate) tenant: Option<String>,
}
