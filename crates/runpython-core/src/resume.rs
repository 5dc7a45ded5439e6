//! Human in the loop: approval tools, checkpoints of resumable runs, and resume by deterministic replay.
//!
//! A run that may suspend keeps a checkpoint in the store: what it was asked to run (code, inputs,
//! dependencies) and its call journal. A suspension kills the child and leaves the checkpoint
//! `Suspended`; [`crate::RunPython::resume`] re-runs the code from the top under the same run id, and the bridge
//! answers every call the journal has as `Applied` from the journal (side effects do not fire twice),
//! gives the suspended call the person's decision, and runs live from there.

use std::collections::HashMap;
use std::sync::Arc;

use runpython_bridge::{
    BoxFuture, CallState, Journal, JournalSink, ReplayPlan, Tool, ToolArgs, ToolError,
};
use runpython_store::{Listing, Store};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::envelope::{Envelope, Status};
use crate::error::Error;
use crate::request::RunRequest;

const MAGIC: &[u8; 4] = b"RPCK";
const VERSION_1: u8 = 1;

/// A tool that asks a person: it suspends the run with its arguments as the request, and the
/// decision given to [`crate::RunPython::resume`] becomes its return value.
#[derive(Debug)]
pub(crate) struct ApprovalTool {
    name: String,
}

impl ApprovalTool {
    pub fn new(name: String) -> Self {
        Self { name }
    }
}

impl Tool for ApprovalTool {
    fn name(&self) -> &str {
        &self.name
    }
    fn description(&self) -> &str {
        "Ask a person to approve or decide something. The run pauses until they answer; their decision is the return value."
    }
    fn call(&self, args: ToolArgs) -> BoxFuture<'static, Result<Value, ToolError>> {
        let request = serde_json::json!({"args": args.args, "kwargs": args.kwargs});
        Box::pin(async move { Err(ToolError::suspend(request)) })
    }
}

/// Where a resumable run stands.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
enum RunState {
    /// Started (or resumed) and not finished: if its host died, it may be resumed.
    Running,
    /// Waiting for decisions on these suspensions.
    Suspended(Vec<String>),
    /// Done: nothing to resume.
    Finished,
}

/// What a resumed run needs, at rest.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct CheckpointV1 {
    code: String,
    /// JSON text of the inputs object (postcard cannot carry `serde_json::Value`).
    inputs: String,
    input_artifacts: Vec<(String, String)>,
    dependencies: Vec<String>,
    /// The bridge's own versioned journal record.
    journal: Vec<u8>,
    state: RunState,
}

#[derive(Serialize, Deserialize)]
enum CheckpointRecord {
    V1(CheckpointV1),
}

impl CheckpointV1 {
    fn new(request: &RunRequest, journal: &Journal, state: RunState) -> Result<Self, Error> {
        Ok(Self {
            code: request.code.clone(),
            inputs: Value::Object(request.inputs.clone()).to_string(),
            input_artifacts: request.input_artifacts.clone(),
            dependencies: request.dependencies.clone(),
            journal: journal.encode()?,
            state,
        })
    }

    fn encode(&self) -> Result<Vec<u8>, Error> {
        let mut out = MAGIC.to_vec();
        out.push(VERSION_1);
        out.extend(
            postcard::to_allocvec(&CheckpointRecord::V1(self.clone()))
                .map_err(|e| Error::Internal(format!("cannot encode a checkpoint: {e}")))?,
        );
        Ok(out)
    }

    fn decode(run_id: &str, bytes: &[u8]) -> Result<Self, Error> {
        let bad =
            |why: String| Error::InvalidInput(format!("the checkpoint of run {run_id} {why}"));
        if bytes.len() < 5 || &bytes[..4] != MAGIC {
            return Err(bad("is not a runpython checkpoint".into()));
        }
        if bytes[4] != VERSION_1 {
            return Err(bad(format!(
                "has version {}, newer than this runpython understands; upgrade runpython",
                bytes[4]
            )));
        }
        match postcard::from_bytes(&bytes[5..]) {
            Ok(CheckpointRecord::V1(record)) => Ok(record),
            Err(e) => Err(bad(format!("is corrupt ({e})"))),
        }
    }

    fn request(&self) -> Result<RunRequest, Error> {
        let inputs: Map<String, Value> = serde_json::from_str(&self.inputs)
            .map_err(|e| Error::Internal(format!("checkpoint inputs are not JSON: {e}")))?;
        let mut request = RunRequest::new(self.code.clone()).no_memo();
        request.inputs = inputs;
        request.input_artifacts = self.input_artifacts.clone();
        request.dependencies = self.dependencies.clone();
        Ok(request)
    }
}

/// Writes the checkpoint (state `Running`) with the journal, before and after every call.
#[derive(Debug)]
struct CheckpointSink {
    store: Store,
    run_id: String,
    request: RunRequest,
}

impl JournalSink for CheckpointSink {
    fn persist(&self, journal: Journal) -> BoxFuture<'static, Result<(), String>> {
        let store = self.store.clone();
        let run_id = self.run_id.clone();
        let request = self.request.clone();
        Box::pin(async move {
            put_checkpoint(&store, &run_id, &request, &journal, RunState::Running)
                .await
                .map_err(|e| e.to_string())
        })
    }
}

async fn put_checkpoint(
    store: &Store,
    run_id: &str,
    request: &RunRequest,
    journal: &Journal,
    state: RunState,
) -> Result<(), Error> {
    let bytes = CheckpointV1::new(request, journal, state)?.encode()?;
    store.put_checkpoint(run_id, bytes).await?;
    Ok(())
}

/// For durable runs: the sink that journals every call, after a first checkpoint of the request
/// (a resumed run keeps the journal it resumes from until its own calls replace it).
pub(crate) async fn durable_sink(
    store: &Store,
    run_id: &str,
    request: &RunRequest,
    resumed: bool,
) -> Result<Arc<dyn JournalSink>, Error> {
    if !resumed {
        put_checkpoint(
            store,
            run_id,
            request,
            &Journal::default(),
            RunState::Running,
        )
        .await?;
    }
    Ok(Arc::new(CheckpointSink {
        store: store.clone(),
        run_id: run_id.to_owned(),
        request: request.clone(),
    }))
}

/// After an attempt: a suspended run's checkpoint says what it waits for; a durable or resumed run
/// that ended otherwise is marked finished so it cannot be resumed again.
pub(crate) async fn after_attempt(
    store: &Store,
    run_id: &str,
    request: &RunRequest,
    envelope: &Envelope,
    journal: Option<Journal>,
    durable_or_resumed: bool,
) -> Result<(), Error> {
    let journal = journal.unwrap_or_default();
    if envelope.status == Status::Suspended {
        let pending: Vec<String> = journal
            .suspensions()
            .filter_map(|e| match &e.state {
                CallState::Suspended { id, .. } => Some(id.clone()),
                _ => None,
            })
            .collect();
        return put_checkpoint(
            store,
            run_id,
            request,
            &journal,
            RunState::Suspended(pending),
        )
        .await;
    }
    if durable_or_resumed {
        put_checkpoint(store, run_id, request, &journal, RunState::Finished).await?;
    }
    Ok(())
}

/// What resuming `run_id` with `decisions` replays: its request and the plan for its bridge.
///
/// Errors: an unknown run, a finished run, a decision for a suspension the run does not have.
pub(crate) async fn load_for_resume(
    store: &Store,
    run_id: &str,
    decisions: HashMap<String, Value>,
) -> Result<(RunRequest, ReplayPlan), Error> {
    let bytes = store.get_checkpoint(run_id).await?.ok_or_else(|| {
        Error::InvalidInput(format!(
            "run {run_id} has no checkpoint in {}: it never suspended there (check the run id and --store)",
            store.url()
        ))
    })?;
    let checkpoint = CheckpointV1::decode(run_id, &bytes)?;
    let journal = Journal::decode(&checkpoint.journal)?;
    // `Running` means its host died mid-run: resuming it is how it finishes.
    if checkpoint.state == RunState::Finished {
        return Err(Error::InvalidInput(format!(
            "run {run_id} already finished; there is nothing to resume"
        )));
    }
    let known: Vec<String> = journal
        .suspensions()
        .filter_map(|e| match &e.state {
            CallState::Suspended { id, .. } => Some(id.clone()),
            _ => None,
        })
        .collect();
    for id in decisions.keys() {
        if !known.contains(id) {
            return Err(Error::InvalidInput(format!(
                "run {run_id} has no suspension {id:?}; it waits on: {}",
                if known.is_empty() {
                    "nothing".into()
                } else {
                    known.join(", ")
                }
            )));
        }
    }
    Ok((checkpoint.request()?, ReplayPlan { journal, decisions }))
}

/// A run that has not finished and can be resumed, as [`resumable_runs`] finds it in a store.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ResumableRun {
    /// The run's id: what [`crate::RunPython::resume`] and `runpython resume` take.
    pub run_id: String,
    /// Where it stands.
    pub state: ResumableState,
    /// When its checkpoint was last written: a durable run writes it around every tool call, so a
    /// `Running` run whose checkpoint is old has most likely lost its host.
    pub updated_at: std::time::SystemTime,
}

/// Where a [`ResumableRun`] stands.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ResumableState {
    /// Waiting for decisions on these suspensions (`s<ordinal>`); resume it with them.
    Suspended {
        /// The suspension ids.
        waiting_on: Vec<String>,
    },
    /// Started and not finished: a host is running it, or its host stopped (killed, crashed) during
    /// the run, which is then *interrupted*. Resuming it replays the calls that finished and makes
    /// again only the one that was in flight. The store cannot tell the two apart: resume it once no
    /// host runs it any more.
    Running,
}

impl ResumableState {
    /// `"suspended"` or `"running"`.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Suspended { .. } => "suspended",
            Self::Running => "running",
        }
    }
}

/// Every run in `store` that can be resumed: suspended ones and those whose host stopped before they
/// finished, least recently updated first. Finished runs are left out; a checkpoint that cannot be
/// read is skipped and named in [`Listing::unreadable`].
pub async fn resumable_runs(store: &Store) -> Result<Listing<ResumableRun>, Error> {
    let mut listing = Listing {
        items: Vec::new(),
        unreadable: Vec::new(),
    };
    for checkpoint in store.list_checkpoints().await? {
        let state = match CheckpointV1::decode(&checkpoint.run_id, &checkpoint.bytes) {
            Ok(record) => record.state,
            Err(_) => {
                listing.unreadable.push(checkpoint.run_id);
                continue;
            }
        };
        let state = match state {
            RunState::Suspended(waiting_on) => ResumableState::Suspended { waiting_on },
            RunState::Running => ResumableState::Running,
            RunState::Finished => continue,
        };
        listing.items.push(ResumableRun {
            run_id: checkpoint.run_id,
            state,
            updated_at: checkpoint.updated_at,
        });
    }
    Ok(listing)
}

/// The suspensions `run_id` waits on, from its checkpoint (none for a run whose host died mid-run);
/// an error for a finished run.
pub(crate) async fn pending_suspensions(store: &Store, run_id: &str) -> Result<Vec<String>, Error> {
    let Some(bytes) = store.get_checkpoint(run_id).await? else {
        return Ok(Vec::new());
    };
    match CheckpointV1::decode(run_id, &bytes)?.state {
        RunState::Suspended(pending) => Ok(pending),
        RunState::Running => Ok(Vec::new()),
        RunState::Finished => Err(Error::InvalidInput(format!(
            "run {run_id} already finished; there is nothing to resume"
        ))),
    }
}

/// A session cell's checkpoint: its run id names the session waiting on it (the cell itself is in the
/// session's record). `RPSC`, a version byte, a state byte (0 waiting, 1 finished), the session id.
const SESSION_CELL_MAGIC: &[u8; 4] = b"RPSC";

/// Marks run `run_id` as the suspended cell of session `session_id` (so `resume(run_id)` finds it).
pub(crate) async fn put_session_cell(
    store: &Store,
    run_id: &str,
    session_id: &str,
) -> Result<(), Error> {
    let mut bytes = SESSION_CELL_MAGIC.to_vec();
    bytes.extend([VERSION_1, 0]);
    bytes.extend(session_id.as_bytes());
    store.put_checkpoint(run_id, bytes).await?;
    Ok(())
}

/// Marks a session cell's checkpoint finished: it cannot be resumed again.
pub(crate) async fn finish_session_cell(store: &Store, run_id: &str) -> Result<(), Error> {
    if let Some(bytes) = store.get_checkpoint(run_id).await? {
        if bytes.len() >= 6 && &bytes[..4] == SESSION_CELL_MAGIC {
            let mut bytes = bytes.to_vec();
            bytes[5] = 1;
            store.put_checkpoint(run_id, bytes).await?;
        }
    }
    Ok(())
}

/// When `run_id` is a session's suspended cell: the session's id. An error when it already finished.
pub(crate) async fn session_of(store: &Store, run_id: &str) -> Result<Option<String>, Error> {
    let Some(bytes) = store.get_checkpoint(run_id).await? else {
        return Ok(None);
    };
    if bytes.len() < 6 || &bytes[..4] != SESSION_CELL_MAGIC {
        return Ok(None);
    }
    if bytes[5] != 0 {
        return Err(Error::InvalidInput(format!(
            "run {run_id} already finished; there is nothing to resume"
        )));
    }
    Ok(Some(String::from_utf8_lossy(&bytes[6..]).into_owned()))
}
