//! The commands over the store alone: `artifacts list|get` and `gc`, and the `--store` flag.

use std::io::Write as _;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Args, Subcommand};
use runpython_core::{default_local_url, Store};

use crate::human::escape_controls;

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
}

impl StoreArgs {
    pub(crate) fn open(&self) -> anyhow::Result<Store> {
        let url = match &self.store {
            Some(url) => url.clone(),
            None => default_local_url()
                .context("cannot find the default store directory; pass --store URL")?,
        };
        Store::open(&url).with_context(|| format!("cannot open the store {url}"))
    }
}

pub(crate) async fn artifacts(command: ArtifactsCommand) -> anyhow::Result<ExitCode> {
    match command {
        ArtifactsCommand::List {
            run_id,
            json,
            store,
        } => {
            let store = store.open()?;
            let listed = store
                .list_artifacts(run_id.as_deref())
                .await
                .context("cannot list artifacts")?;
            for key in &listed.unreadable {
                say_err!(
                    "warning: skipped the run manifest {key}: it cannot be read (corrupt, or written \
                     by a newer runpython)"
                );
            }
            if json {
                say!("{}", serde_json::to_string(&listed.items)?);
            } else {
                let mut out = std::io::stdout().lock();
                for item in &listed.items {
                    let a = &item.artifact;
                    let kind = serde_json::to_value(a.kind)?;
                    writeln!(
                        out,
                        "{}  {}  {:<12} {:>10}  {}",
                        escape_controls(&item.run_id),
                        a.id,
                        kind.as_str().unwrap_or(""),
                        a.bytes,
                        escape_controls(&a.name)
                    )?;
                }
            }
        }
        ArtifactsCommand::Get { id, store } => {
            let store = store.open()?;
            let bytes = store
                .get_run_artifact(&id)
                .await
                .with_context(|| format!("cannot read artifact {id}"))?;
            let mut out = std::io::stdout().lock();
            out.write_all(&bytes)?;
            out.flush()?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

pub(crate) async fn gc(store: StoreArgs) -> anyhow::Result<ExitCode> {
    let store = store.open()?;
    let report = store
        .gc(std::time::SystemTime::now())
        .await
        .context("gc failed")?;
    say!(
        "removed {} expired runs, {} unreferenced blobs ({} bytes), {} staging leftovers, {} expired memo entries",
        report.expired_runs.len(),
        report.deleted_blobs,
        report.freed_bytes,
        report.deleted_staging,
        report.expired_memos
    );
    for key in &report.unreadable {
        say_err!("runpython: gc left an unreadable record in place: {key}");
    }
    Ok(ExitCode::SUCCESS)
}
