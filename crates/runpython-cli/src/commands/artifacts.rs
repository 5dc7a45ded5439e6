//! `runpython artifacts list|put|get`: what kept runs produced, and host files put in the store.

use std::io::Write as _;
use std::process::ExitCode;

use anyhow::Context as _;
use runpython_core::Store;

use crate::args::store_flags::ArtifactsCommand;
use crate::human::escape_controls;
use crate::settings;

/// How a tenant is shown: its name, `-` for the default tenant.
fn tenant_label(store: &Store) -> &str {
    store.tenant_name().unwrap_or("-")
}

pub(crate) async fn artifacts(command: ArtifactsCommand) -> anyhow::Result<ExitCode> {
    match command {
        ArtifactsCommand::List {
            run_id,
            json,
            store,
        } => {
            let stores = settings::stores(&store).await?;
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
        } => put(&file, name, persistent, json, &settings::store(&store)?).await?,
        ArtifactsCommand::Get { id, store } => {
            let mut found = None;
            let mut last = None;
            for store in settings::stores(&store).await? {
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
