//! `runpython runs`: the runs a store holds that can be resumed (suspended, or durable and interrupted
//! when their host stopped), each with the command that resumes it, and what each tenant keeps.

use std::io::Write;
use std::process::ExitCode;

use anyhow::Context;
use runpython_core::{ResumableState, Store};
use serde_json::{json, Value};

use crate::args::store_flags::StoreArgs;
use crate::human::escape_controls;
use crate::settings;

/// How to continue `run_id`, as a command line; the tool flags the run had must be given again.
pub(crate) fn resume_command(
    run_id: &str,
    store_url: &str,
    tenant: Option<&str>,
    decision: bool,
) -> String {
    let decision = if decision { " --decision JSON" } else { "" };
    let tenant = tenant.map_or(String::new(), |t| format!(" --tenant {}", shell_word(t)));
    format!("runpython resume {run_id} --store {store_url}{tenant}{decision}")
}

/// `text` as one shell word.
fn shell_word(text: &str) -> String {
    if !text.is_empty()
        && text
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.:@/".contains(c))
    {
        text.to_owned()
    } else {
        format!("'{}'", escape_controls(text).replace('\'', r"'\''"))
    }
}

/// `runpython runs`: every run that can be resumed, with the command that resumes it, for
/// `--tenant`'s runs (JSON: `{"tenant", "stored_bytes", "runs"}`) or every tenant's (JSON: the runs,
/// each naming its tenant); the human form starts with each tenant's stored bytes.
pub(crate) async fn list(json: bool, args: StoreArgs) -> anyhow::Result<ExitCode> {
    let stores = settings::stores(&args).await?;
    let mut items: Vec<Value> = Vec::new();
    let mut usage = Vec::new();
    let mut rows = Vec::new();
    let now = std::time::SystemTime::now();
    for store in &stores {
        let (store_items, store_rows, bytes) = runs_of(store, now).await?;
        items.extend(store_items);
        rows.extend(store_rows);
        usage.push((store.tenant_name().map(str::to_owned), bytes));
    }
    if json {
        if let (Some(tenant), Some((_, bytes))) = (&args.tenant, usage.first()) {
            say!(
                "{}",
                serde_json::to_string(
                    &json!({"tenant": tenant, "stored_bytes": bytes, "runs": items})
                )?
            );
        } else {
            say!("{}", serde_json::to_string(&items)?);
        }
        return Ok(ExitCode::SUCCESS);
    }
    let mut out = std::io::stdout().lock();
    for (tenant, bytes) in &usage {
        let name = tenant
            .as_deref()
            .map_or("the default tenant".to_owned(), |t| {
                format!("tenant {}", escape_controls(t))
            });
        writeln!(out, "{name}: {bytes} bytes stored")?;
    }
    if !rows.is_empty() {
        say_err!(
            "runpython: resume a run with the --tool, --approval and --mcp-server flags it had"
        );
    }
    for row in rows {
        writeln!(out, "{row}")?;
    }
    Ok(ExitCode::SUCCESS)
}

/// One tenant's resumable runs, as JSON items and table rows, and the bytes it keeps.
async fn runs_of(
    store: &Store,
    now: std::time::SystemTime,
) -> anyhow::Result<(Vec<Value>, Vec<String>, u64)> {
    let listed = runpython_core::resumable_runs(store)
        .await
        .context("cannot list the runs that can be resumed")?;
    for id in &listed.unreadable {
        say_err!("warning: skipped the checkpoint of run {id}: it cannot be read (corrupt, or written by a newer runpython)");
    }
    let bytes = store
        .stored_bytes(std::time::Duration::ZERO)
        .await
        .context("cannot count the bytes stored")?;
    let tenant = store.tenant_name();
    let mut items = Vec::new();
    let mut rows = Vec::new();
    for run in &listed.items {
        let (waiting_on, suspended) = match &run.state {
            ResumableState::Suspended { waiting_on } => (waiting_on.clone(), true),
            _ => (Vec::new(), false),
        };
        let resume = resume_command(&run.run_id, store.url(), tenant, !waiting_on.is_empty());
        let updated_ms = run
            .updated_at
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let age = now
            .duration_since(run.updated_at)
            .unwrap_or_default()
            .as_secs();
        let state = if suspended {
            format!("suspended on {}", waiting_on.join(","))
        } else {
            "running or interrupted".to_owned()
        };
        rows.push(format!(
            "{}  {state:<24} updated {age}s ago  {resume}",
            run.run_id
        ));
        items.push(json!({
            "run_id": run.run_id,
            "tenant": tenant,
            "state": run.state.as_str(),
            "waiting_on": waiting_on,
            "updated_at_ms": updated_ms,
            "resume": resume,
        }));
    }
    Ok((items, rows, bytes))
}
