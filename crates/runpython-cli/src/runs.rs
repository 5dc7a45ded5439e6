//! `runpython runs`: the runs a store holds that can be resumed (suspended, or durable and interrupted
//! when their host stopped), each with the command that resumes it.

use std::io::Write;
use std::process::ExitCode;

use anyhow::Context;
use runpython_core::{ResumableState, Store};
use serde_json::Value;

/// How to continue `run_id`, as a command line; the tool flags the run had must be given again.
pub(crate) fn resume_command(run_id: &str, store_url: &str, decision: bool) -> String {
    let decision = if decision { " --decision JSON" } else { "" };
    format!("runpython resume {run_id} --store {store_url}{decision}")
}

/// `runpython runs`: every run in `store` that can be resumed, with the command that resumes it.
pub(crate) async fn list(json: bool, store: Store) -> anyhow::Result<ExitCode> {
    let listed = runpython_core::resumable_runs(&store)
        .await
        .context("cannot list the runs that can be resumed")?;
    for id in &listed.unreadable {
        say_err!("warning: skipped the checkpoint of run {id}: it cannot be read (corrupt, or written by a newer runpython)");
    }
    let now = std::time::SystemTime::now();
    if json {
        let items: Vec<Value> = listed
            .items
            .iter()
            .map(|run| {
                let waiting_on = match &run.state {
                    ResumableState::Suspended { waiting_on } => waiting_on.clone(),
                    _ => Vec::new(),
                };
                let updated_ms = run
                    .updated_at
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_millis() as u64);
                serde_json::json!({
                    "run_id": run.run_id,
                    "state": run.state.as_str(),
                    "waiting_on": waiting_on,
                    "updated_at_ms": updated_ms,
                    "resume": resume_command(&run.run_id, store.url(), !waiting_on.is_empty()),
                })
            })
            .collect();
        say!("{}", serde_json::to_string(&items)?);
        return Ok(ExitCode::SUCCESS);
    }
    if !listed.items.is_empty() {
        say_err!(
            "runpython: resume a run with the --tool, --approval and --mcp-server flags it had"
        );
    }
    let mut out = std::io::stdout().lock();
    for run in &listed.items {
        let age = now
            .duration_since(run.updated_at)
            .unwrap_or_default()
            .as_secs();
        let (state, suspended) = match &run.state {
            ResumableState::Suspended { waiting_on } => {
                (format!("suspended on {}", waiting_on.join(",")), true)
            }
            _ => ("running or interrupted".to_owned(), false),
        };
        writeln!(
            out,
            "{}  {state:<24} updated {age}s ago  {}",
            run.run_id,
            resume_command(&run.run_id, store.url(), suspended)
        )?;
    }
    Ok(ExitCode::SUCCESS)
}
