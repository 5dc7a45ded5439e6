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

impl StoreArgs {
    /// The store as a whole (the default tenant's, from which the others are reached).
    pub(crate) fn open_base(&self) -> anyhow::Result<Store> {
        let url = match &self.store {
            Some(url) => url.clone(),
            None => default_local_url()
                .context("cannot find the default store directory; pass --store URL")?,
        };
        Store::open(&url).with_context(|| format!("cannot open the store {url}"))
    }

    /// The store, scoped to `--tenant` when given.
    pub(crate) fn open(&self) -> anyhow::Result<Store> {
        let store = self.open_base()?;
        match &self.tenant {
            Some(name) => store
                .tenant(name)
                .with_context(|| format!("--tenant {name:?}")),
            None => Ok(store),
        }
    }

    /// What an operator command acts on: `--tenant`'s store, else every tenant's.
    pub(crate) async fn stores(&self) -> anyhow::Result<Vec<Store>> {
        let store = self.open()?;
        if self.tenant.is_some() {
            return Ok(vec![store]);
        }
        store
            .every_tenant()
            .await
            .context("cannot list the store's tenants")
    }
}

/// How a tenant is shown: its name, `-` for the default tenant.
pub(crate) fn tenant_label(store: &Store) -> &str {
    store.tenant_name().unwrap_or("-")
}

pub(crate) async fn artifacts(command: ArtifactsCommand) -> anyhow::Result<ExitCode> {
    match command {
        ArtifactsCommand::List {
            run_id,
            json,
            store,
        } => {
            let stores = store.stores().await?;
            let named = stores.iter().any(|s| s.tenant_name().is_some());
            let mut items = Vec::new();
            for store in &stores {
                let listed = store
                    .list_artifacts(run_id.as_deref())
                    .await
                    .context("cannot list artifacts")?;
                for key in &listed.unreadable {
                    say_err!(
                        "warning: skipped the run manifest {key}: it cannot be read (corrupt, or \
                         written by a newer runpython)"
                    );
                }
                items.extend(listed.items.into_iter().map(|item| (store, item)));
            }
            if json {
                let mut listed = Vec::new();
                for (store, item) in &items {
                    let mut value = serde_json::to_value(item)?;
                    value["tenant"] = serde_json::json!(store.tenant_name());
                    listed.push(value);
                }
                say!("{}", serde_json::to_string(&listed)?);
            } else {
                let mut out = std::io::stdout().lock();
                for (store, item) in &items {
                    let a = &item.artifact;
                    let kind = serde_json::to_value(a.kind)?;
                    if named {
                        write!(out, "{}  ", escape_controls(tenant_label(store)))?;
                    }
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
        ArtifactsCommand::Put {
            file,
            name,
            persistent,
            json,
            store,
        } => put(&file, name, persistent, json, &store.open()?).await?,
        ArtifactsCommand::Get { id, store } => {
            let mut found = None;
            let mut last = None;
            for store in store.stores().await? {
                match store.get_run_artifact(&id).await {
                    Ok(bytes) => {
                        found = Some(bytes);
                        break;
                    }
                    Err(e @ runpython_core::StoreError::NotFound { .. }) => last = Some(e),
                    Err(e) => return Err(e).with_context(|| format!("cannot read artifact {id}")),
                }
            }
            let bytes = match (found, last) {
                (Some(bytes), _) => bytes,
                (None, Some(e)) => {
                    return Err(e).with_context(|| format!("cannot read artifact {id}"))
                }
                (None, None) => anyhow::bail!("cannot read artifact {id}: no tenant holds it"),
            };
            let mut out = std::io::stdout().lock();
            out.write_all(&bytes)?;
            out.flush()?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `artifacts put`: the file streamed into the store (never held whole), then a run record that
/// keeps it (a blob no run lists is collected by `gc`).
async fn put(
    file: &std::path::Path,
    name: Option<String>,
    persistent: bool,
    json: bool,
    store: &Store,
) -> anyhow::Result<()> {
    let name = match name {
        Some(name) => name,
        None => file
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .context("the path has no file name; pass --name NAME")?,
    };
    let opened = tokio::fs::File::open(file)
        .await
        .with_context(|| format!("cannot open {}", file.display()))?;
    if !opened.metadata().await?.is_file() {
        anyhow::bail!("{} is not a regular file", file.display());
    }
    let artifact = store
        .put_artifact_stream(&name, opened)
        .await
        .with_context(|| format!("cannot store {}", file.display()))?;
    let run_id = runpython_core::new_put_id();
    let record = runpython_core::StoreRunRecord {
        run_id: run_id.clone(),
        created_at: std::time::SystemTime::now(),
        tier: if persistent {
            runpython_core::Tier::Persistent
        } else {
            runpython_core::Tier::default()
        },
        script: format!("# runpython artifacts put {name}\n"),
        stdout: String::new(),
        stderr: String::new(),
        return_value_json: "null".into(),
        deps: Vec::new(),
        env_fingerprint: String::new(),
        isolation_json: "null".into(),
        files: Vec::new(),
        skipped_files: Vec::new(),
        skipped_counts: Default::default(),
        stored: vec![artifact.clone()],
    };
    store
        .put_run(record)
        .await
        .context("cannot record the stored file")?;
    if json {
        say!(
            "{}",
            serde_json::json!({"id": artifact.id, "name": name, "bytes": artifact.bytes, "run_id": run_id})
        );
    } else {
        say!("{}", artifact.id);
    }
    Ok(())
}

pub(crate) async fn gc(store: StoreArgs) -> anyhow::Result<ExitCode> {
    let stores = store.stores().await?;
    let now = std::time::SystemTime::now();
    for store in &stores {
        let report = store
            .gc(now)
            .await
            .with_context(|| match store.tenant_name() {
                Some(name) => format!("gc of tenant {name} failed"),
                None => "gc failed".to_owned(),
            })?;
        let whose = match store.tenant_name() {
            Some(name) => format!("tenant {}: ", escape_controls(name)),
            None if stores.len() > 1 => "default tenant: ".to_owned(),
            None => String::new(),
        };
        say!(
            "{whose}removed {} expired runs, {} unreferenced blobs ({} bytes), {} staging leftovers, {} expired memo entries",
            report.expired_runs.len(),
            report.deleted_blobs,
            report.freed_bytes,
            report.deleted_staging,
            report.expired_memos
        );
        for key in &report.unreadable {
            say_err!("runpython: gc left an unreadable record in place: {key}");
        }
    }
    Ok(ExitCode::SUCCESS)
}
