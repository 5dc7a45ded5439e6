//! `runpython resume`: a suspended (or interrupted durable) run continued with the decisions given.

use std::process::ExitCode;

use anyhow::{bail, Context};
use serde_json::Value;

use crate::args::ResumeArgs;
use crate::human::{self, finish};
use crate::settings;

pub(crate) async fn resume(args: ResumeArgs) -> anyhow::Result<ExitCode> {
    let python = settings::engine(&args.engine).await?;
    let pending = python.pending_suspensions(&args.run_id).await?;
    let mut decisions = std::collections::HashMap::new();
    for text in &args.decisions {
        // ID=JSON names the suspension; a bare JSON value answers the one the run waits on.
        let (id, json) = match text.split_once('=') {
            Some((id, json))
                if id.starts_with('s') && id[1..].chars().all(|c| c.is_ascii_digit()) =>
            {
                (id.to_owned(), json)
            }
            _ => match pending.as_slice() {
                [only] => (only.clone(), text.as_str()),
                [] => bail!(
                    "run {} waits on no suspension; pass no --decision, or check the run id",
                    args.run_id
                ),
                many => bail!(
                    "run {} waits on several suspensions ({}); pass --decision ID=JSON",
                    args.run_id,
                    many.join(", ")
                ),
            },
        };
        let value: Value = serde_json::from_str(json).with_context(|| {
            format!("the decision {json:?} is not JSON; quote strings, e.g. '\"yes\"'")
        })?;
        decisions.insert(id, value);
    }
    let envelope = python.resume(&args.run_id, decisions).await?;
    if !args.json {
        human::print_streams(&envelope); // a resumed run's output is not streamed: its envelope has it
    }
    finish(&envelope, args.json)
}
