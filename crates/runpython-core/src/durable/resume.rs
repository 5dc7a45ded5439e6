//! Human in the loop: approval tools, checkpoints of resumable runs, and resume by deterministic replay.
//!
//! A run that may suspend keeps a checkpoint in the store: what it was asked to run (code, inputs,
//! dependencies, files) and its call journal. A suspension kills the child and leaves the checkpoint
//! `Suspended`; [`crate::RunPython::resume`] re-runs the code from the top under the same run id, and the bridge
//! answers every call the journal has as `Applied` from the journal (side effects do not fire twice),
//! gives the suspended call the person's decision, and runs live from there.

use std::collections::HashMap;
use std::sync::Arc;

use runpython_bridge::{
    BoxFuture, CallState, Journal, JournalEntry, JournalSink, ReplayPlan, SpillStore, Tool,
    ToolArgs, ToolError,
};
use runpython_store::{Listing, Store};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::durable::at_rest::{FileAtRest, RequestAtRest};
use crate::error::Error;
use crate::protocol::envelope::{Envelope, Status};
use crate::protocol::request::RunRequest;

const MAGIC: &[u8; 4] = b"RPCK";
const VERSION_1: u8 = 1;
/// Version 3: the request at rest as session cells keep theirs ([`RequestAtRest`]). Version 2 (still
/// read) appended the journal's entries as parts (`e-…`), its large values beside them
/// (`v-<digest>`), as version 3 does; version 1 held the whole journal in the head, rewritten on
/// every call.
const VERSION_3: u8 = 3;

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

/// What a resumed run needs, at rest: the first record's shape (still read).
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

/// The second record's shape (still read): [`CheckpointV1`] and whether values are exact and the
/// files put in the run, their bytes inline.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct CheckpointV2 {
    code: String,
    inputs: String,
    input_artifacts: Vec<(String, String)>,
    dependencies: Vec<String>,
    journal: Vec<u8>,
    state: RunState,
    typed: bool,
    files: Vec<(String, FileV2)>,
}

/// A file of a [`CheckpointV2`].
#[derive(Debug, Clone, Serialize, Deserialize)]
enum FileV2 {
    Bytes(Vec<u8>),
    Artifact(String),
}

/// What a resumed run needs, at rest (record version 3): its request as session cells keep theirs
/// (everything that changed what the code saw: files by artifact id, exact values, environment and
/// secret names, allowed hosts, timeout), its journal and where it stands.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Checkpoint {
    request: RequestAtRest,
    /// The bridge's own versioned journal record.
    journal: Vec<u8>,
    state: RunState,
}

#[derive(Serialize, Deserialize)]
enum CheckpointRecord {
    V1(CheckpointV1),
    V2(CheckpointV2),
    V3(Checkpoint),
}

impl Checkpoint {
    async fn new(
        store: &Store,
        request: &RunRequest,
        secrets: Vec<String>,
        journal: &Journal,
        state: RunState,
    ) -> Result<Self, Error> {
        Ok(Self {
            request: RequestAtRest::keep(store, request, secrets).await?,
            journal: journal.encode()?,
            state,
        })
    }

    fn encode(&self) -> Result<Vec<u8>, Error> {
        let mut out = MAGIC.to_vec();
        out.push(VERSION_3);
        out.extend(
            postcard::to_allocvec(&CheckpointRecord::V3(self.clone()))
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
        if !(VERSION_1..=VERSION_3).contains(&bytes[4]) {
            return Err(bad(format!(
                "has version {}, newer than this runpython understands; upgrade runpython",
                bytes[4]
            )));
        }
        match postcard::from_bytes(&bytes[5..]) {
            Ok(CheckpointRecord::V3(record)) => Ok(record),
            Ok(CheckpointRecord::V2(v2)) => {
                let mut request = RequestAtRest::of_version_1(
                    v2.code,
                    v2.inputs,
                    v2.input_artifacts,
                    v2.dependencies,
                );
                request.typed = v2.typed;
                request.files = v2
                    .files
                    .into_iter()
                    .map(|(name, file)| {
                        let file = match file {
                            FileV2::Bytes(b) => FileAtRest::Bytes(b),
                            FileV2::Artifact(id) => FileAtRest::Artifact(id),
                        };
                        (name, file)
                    })
                    .collect();
                Ok(Self {
                    request,
                    journal: v2.journal,
                    state: v2.state,
                })
            }
            Ok(CheckpointRecord::V1(v1)) => Ok(Self {
                request: RequestAtRest::of_version_1(
                    v1.code,
                    v1.inputs,
                    v1.input_artifacts,
                    v1.dependencies,
                ),
                journal: v1.journal,
                state: v1.state,
            }),
            Err(e) => Err(bad(format!("is corrupt ({e})"))),
        }
    }

    /// The request to run again: its environment variables unset (values are never at rest; a
    /// resumed run gets the host's passthrough values of its own time, and no per-run ones).
    fn request(&self) -> Result<RunRequest, Error> {
        self.request.request(&std::collections::BTreeMap::new())
    }
}

/// Appends each change of a call to the checkpoint as a part of its own (`e-<attempt>-<n>`), so a
/// call costs the same to journal in a run's thousandth call as in its first.
#[derive(Debug)]
struct CheckpointSink {
    store: Store,
    run_id: String,
    /// When this attempt started (ms), so a resumed run's parts sort after its earlier attempts'.
    attempt: u64,
    appended: std::sync::atomic::AtomicU64,
}

impl JournalSink for CheckpointSink {
    fn record(&self, entry: JournalEntry) -> BoxFuture<'static, Result<(), String>> {
        let store = self.store.clone();
        let run_id = self.run_id.clone();
        let n = self
            .appended
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let name = format!("e-{:013}-{n:010}", self.attempt);
        Box::pin(async move {
            let bytes = entry.encode().map_err(|e| e.to_string())?;
            store
                .put_checkpoint_part(&run_id, &name, bytes)
                .await
                .map_err(|e| e.to_string())
        })
    }
}

/// A run's large journaled values, kept beside its checkpoint (`v-<digest>`).
#[derive(Debug)]
struct CheckpointSpill {
    store: Store,
    run_id: String,
}

impl SpillStore for CheckpointSpill {
    fn put(&self, digest: String, text: String) -> BoxFuture<'static, Result<(), String>> {
        let (store, run_id) = (self.store.clone(), self.run_id.clone());
        Box::pin(async move {
            store
                .put_checkpoint_part(&run_id, &format!("v-{digest}"), text.into_bytes())
                .await
                .map_err(|e| e.to_string())
        })
    }

    fn get(&self, digest: String) -> BoxFuture<'static, Result<String, String>> {
        let (store, run_id) = (self.store.clone(), self.run_id.clone());
        Box::pin(async move {
            let bytes = store
                .get_checkpoint_part(&run_id, &format!("v-{digest}"))
                .await
                .map_err(|e| e.to_string())?
                .ok_or_else(|| {
                    format!("value {digest} is missing from run {run_id}'s checkpoint")
                })?;
            String::from_utf8(bytes.to_vec()).map_err(|e| e.to_string())
        })
    }
}

async fn put_checkpoint(
    store: &Store,
    run_id: &str,
    (request, secrets): (&RunRequest, &[String]),
    journal: &Journal,
    state: RunState,
) -> Result<(), Error> {
    let bytes = Checkpoint::new(store, request, secrets.to_vec(), journal, state)
        .await?
        .encode()?;
    store.put_checkpoint(run_id, bytes).await?;
    Ok(())
}

/// What a durable run journals through: the sink that appends every call, after a first checkpoint
/// of the request (a resumed run keeps the checkpoint it resumes from, its parts sorting after the
/// earlier attempts'), and where its large values go.
pub(crate) async fn durable_sink(
    store: &Store,
    run_id: &str,
    request: (&RunRequest, &[String]),
    resumed: bool,
) -> Result<(Arc<dyn JournalSink>, Arc<dyn SpillStore>), Error> {
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
    let attempt = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    Ok((
        Arc::new(CheckpointSink {
            store: store.clone(),
            run_id: run_id.to_owned(),
            attempt,
            appended: std::sync::atomic::AtomicU64::new(0),
        }),
        spill_for(store, run_id),
    ))
}

/// Where `run_id`'s large journaled values are kept and read back (a resumed run's replay).
pub(crate) fn spill_for(store: &Store, run_id: &str) -> Arc<dyn SpillStore> {
    Arc::new(CheckpointSpill {
        store: store.clone(),
        run_id: run_id.to_owned(),
    })
}

/// After an attempt: a suspended run's checkpoint says what it waits for; a durable or resumed run
/// that ended otherwise is marked finished so it cannot be resumed again. A run that appended its
/// journal (`durable_or_resumed`) writes only its head: the journal is in its parts already.
pub(crate) async fn after_attempt(
    store: &Store,
    run_id: &str,
    request: (&RunRequest, &[String]),
    envelope: &Envelope,
    journal: Option<Journal>,
    durable_or_resumed: bool,
) -> Result<(), Error> {
    let journal = journal.unwrap_or_default();
    let inline = match durable_or_resumed {
        true => Journal::default(),
        false => journal.clone(),
    };
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
            &inline,
            RunState::Suspended(pending),
        )
        .await;
    }
    if durable_or_resumed {
        put_checkpoint(store, run_id, request, &inline, RunState::Finished).await?;
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
        crate::policy::tenancy::audit_miss(store, runpython_store::Held::Run, run_id, "resume");
        Error::InvalidInput(format!(
            "run {run_id} has no checkpoint in {}: it never suspended there (check the run id and --store)",
            store.url()
        ))
    })?;
    let checkpoint = Checkpoint::decode(run_id, &bytes)?;
    let journal = journal_of(store, run_id, &checkpoint).await?;
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
    Ok((
        checkpoint.request()?,
        ReplayPlan {
            journal,
            decisions,
            complete: false,
        },
    ))
}

/// The journal of `run_id`: the head's own entries, then every part appended after them, in order (a
/// later entry of an ordinal replaces an earlier one).
async fn journal_of(
    store: &Store,
    run_id: &str,
    checkpoint: &Checkpoint,
) -> Result<Journal, Error> {
    let mut journal = Journal::decode(&checkpoint.journal)?;
    for name in store.list_checkpoint_parts(run_id, "e-").await? {
        let Some(bytes) = store.get_checkpoint_part(run_id, &name).await? else {
            continue; // deleted meanwhile: the run is gone
        };
        journal.apply(JournalEntry::decode(&bytes)?);
    }
    Ok(journal)
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
        let state = match Checkpoint::decode(&checkpoint.run_id, &checkpoint.bytes) {
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
    match Checkpoint::decode(run_id, &bytes)?.state {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn versioned(version: u8, record: &CheckpointRecord) -> Vec<u8> {
        let mut out = MAGIC.to_vec();
        out.push(version);
        out.extend(postcard::to_allocvec(record).unwrap());
        out
    }

    #[tokio::test]
    async fn a_checkpoint_keeps_files_by_artifact_id_and_older_versions_are_still_read() {
        let store = Store::open("memory://").unwrap();
        let request = RunRequest::new("1")
            .file("a.txt", b"abc".to_vec())
            .env("TOKEN", "value")
            .typed();
        let checkpoint = Checkpoint::new(
            &store,
            &request,
            vec!["KEY".into()],
            &Journal::default(),
            RunState::Running,
        )
        .await
        .unwrap();
        let back = Checkpoint::decode("r", &checkpoint.encode().unwrap()).unwrap();
        let again = back.request().unwrap();
        assert!(again.typed && again.env.is_empty(), "{again:?}");
        let crate::FileSource::Artifact(id) = &again.files[0].1 else {
            panic!("{again:?}")
        };
        assert_eq!(&store.get_run_artifact(id).await.unwrap()[..], b"abc");

        // Version 2, with its bytes inline, and version 1.
        let v2 = CheckpointRecord::V2(CheckpointV2 {
            code: "2".into(),
            inputs: "{}".into(),
            input_artifacts: Vec::new(),
            dependencies: Vec::new(),
            journal: Journal::default().encode().unwrap(),
            state: RunState::Suspended(vec!["s0".into()]),
            typed: true,
            files: vec![("b.txt".into(), FileV2::Bytes(b"xyz".to_vec()))],
        });
        let old = Checkpoint::decode("r", &versioned(2, &v2)).unwrap();
        assert_eq!(old.state, RunState::Suspended(vec!["s0".into()]));
        let old = old.request().unwrap();
        assert!(old.typed);
        assert_eq!(
            old.files,
            vec![("b.txt".into(), crate::FileSource::Bytes(b"xyz".to_vec()))]
        );
        let v1 = CheckpointRecord::V1(CheckpointV1 {
            code: "3".into(),
            inputs: "{\"n\": 1}".into(),
            input_artifacts: Vec::new(),
            dependencies: vec!["six".into()],
            journal: Journal::default().encode().unwrap(),
            state: RunState::Running,
        });
        let old = Checkpoint::decode("r", &versioned(1, &v1))
            .unwrap()
            .request()
            .unwrap();
        assert_eq!(
            (old.code.as_str(), old.inputs["n"].clone()),
            ("3", 1.into())
        );
        assert!(!old.typed && old.files.is_empty());
        let err = Checkpoint::decode("r", &versioned(4, &v1)).unwrap_err();
        assert!(err.to_string().contains("newer"), "{err}");
    }
}
