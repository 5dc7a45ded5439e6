//! Sessions through the engine: [`Session`] handles, routing a cell to its session (the cell itself is
//! `cell.rs`), and restoring a session from its record (replaying its cells, tool calls answered from
//! their journals) when its interpreter is gone.

use std::collections::HashMap;
use std::time::Instant;

use runpython_bridge::ReplayPlan;
use serde_json::Value;
use tokio::sync::{mpsc, oneshot};

use crate::error::Error;
use crate::protocol::envelope::{Envelope, ErrorInfo, Status};
use crate::protocol::request::{
    check_env, check_files, check_input_names, new_run_id, Event, RunRequest,
};
use crate::run::execute::elapsed_ms;
use crate::session::{check_session_id, new_session_id, SessionRecord};
use crate::{RunHandle, RunPython};

/// A session: state kept across calls in one long-lived sandboxed interpreter. Cells run in one
/// `__main__` namespace; each returns a normal envelope with `session_id` and its `cell` number. See
/// [`crate::SessionConfig`] for how long sessions live.
///
/// ```no_run
/// # async fn demo() -> Result<(), runpython_core::Error> {
/// let python = runpython_core::RunPython::builder().build()?;
/// let session = python.session();
/// session.run("import json\nrows = [1, 2, 3]").await?;
/// assert_eq!(session.run("sum(rows)").await?.return_value, serde_json::json!(6));
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Session {
    engine: RunPython,
    id: String,
}

impl Session {
    /// The session's id: pass it as [`RunRequest::session`] to route a request here.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Runs a cell to its end.
    pub async fn run(&self, request: impl Into<RunRequest>) -> Result<Envelope, Error> {
        self.engine.run(request.into().session(&self.id)).await
    }

    /// Starts a cell and returns a handle streaming its events.
    pub fn start(&self, request: impl Into<RunRequest>) -> RunHandle {
        self.engine.start(request.into().session(&self.id))
    }

    /// Forgets the session's state: its interpreter is killed and its record removed; the next cell
    /// starts empty.
    pub async fn reset(&self) -> Result<(), Error> {
        crate::session::route::reset_session(&self.engine, &self.id).await
    }

    /// Ends the session: like [`Session::reset`], and the engine forgets the id.
    pub async fn close(self) -> Result<(), Error> {
        crate::session::route::reset_session(&self.engine, &self.id).await?;
        self.engine
            .inner
            .sessions
            .remove(self.engine.inner.tenant.as_deref(), &self.id);
        Ok(())
    }
}

/// A new session (its interpreter starts with its first cell).
pub fn session(engine: &RunPython) -> Session {
    Session {
        engine: engine.clone(),
        id: new_session_id(),
    }
}

/// The session `id` (1-128 letters, digits, `-`, `_`, `.`, `:`): a new one if this engine and its
/// store have never seen it, else the same one (restored from the store when its interpreter is
/// gone).
pub fn session_with_id(engine: &RunPython, id: impl Into<String>) -> Result<Session, Error> {
    let id = id.into();
    check_session_id(&id)?;
    Ok(Session {
        engine: engine.clone(),
        id,
    })
}

/// Kills the session's interpreter and forgets its state, here and in the store.
pub(crate) async fn reset_session(engine: &RunPython, id: &str) -> Result<(), Error> {
    check_session_id(id)?;
    let entry = engine
        .inner
        .sessions
        .entry(engine.inner.tenant.as_deref(), id);
    let mut e = entry.lock().await;
    if let Some(mut live) = e.live.take() {
        live.kill();
    }
    e.lost = None;
    e.cells = 0;
    e.deps.clear();
    e.record = None;
    if let Some(keep) = &engine.inner.keep {
        keep.store.delete_session(id).await?;
    }
    Ok(())
}

async fn session_record(engine: &RunPython, id: &str) -> Result<Option<SessionRecord>, Error> {
    match &engine.inner.keep {
        Some(keep) => SessionRecord::load(&keep.store, id).await,
        None => Ok(None),
    }
}

/// Runs one cell of the session `id` (routed here by `RunRequest::session`).
pub(crate) async fn execute_cell(
    engine: &RunPython,
    id: &str,
    request: RunRequest,
    events: Option<mpsc::Sender<Event>>,
    cancel: Option<oneshot::Receiver<()>>,
) -> Result<Envelope, Error> {
    let started = Instant::now();
    check_session_id(id)?;
    check_input_names(&request)?;
    check_env(&request)?; // before the cell reaches the live interpreter, which it would end
    check_files(&request, engine.inner.limits.max_upload_bytes)?;
    let entry = engine
        .inner
        .sessions
        .entry(engine.inner.tenant.as_deref(), id);
    let mut e = entry.lock().await;
    e.last_used = Instant::now();
    let limits = &engine.inner.limits;
    let code_chars = request.code.chars().count();
    if code_chars > limits.max_code_chars {
        let mut envelope = Envelope::failed(
            Status::Error,
            ErrorInfo::new(
                "CodeTooLarge",
                format!(
                    "the code is {code_chars} characters, over the limit of {}; send less code",
                    limits.max_code_chars
                ),
            ),
            new_run_id(),
        );
        envelope.session_id = Some(id.to_owned());
        envelope.duration_ms = elapsed_ms(started);
        return Ok(envelope);
    }
    let mut restore = None;
    if e.live.is_none() {
        let record = crate::session::route::session_record(engine, id)
            .await?
            .filter(|r| !r.closed && !r.cells.is_empty());
        if let Some(why) = e.lost.take() {
            if record.is_none() {
                // Reported once more, plainly; the next call starts a new, empty session.
                e.cells = 0;
                e.deps.clear();
                return Ok(lost_envelope(id, &why, started));
            }
        }
        let live = match record {
            Some(record) => {
                if let Some(last) = record.cells.last() {
                    if !last.suspended.is_empty() {
                        return Err(Error::InvalidInput(format!(
                            "session {id} waits for a decision on {} (run {}); resume that run",
                            last.suspended.join(", "),
                            last.run_id
                        )));
                    }
                }
                let upto = record.cells.len();
                let (live, report) = match crate::session::restore::restore(
                    engine,
                    &mut e,
                    &record,
                    upto,
                    &request.env,
                    started,
                )
                .await?
                {
                    Ok(restored) => restored,
                    Err(envelope) => return Ok(*envelope),
                };
                e.record = Some(record);
                restore = Some(report);
                live
            }
            None => crate::session::Live::start(engine).await?,
        };
        e.live = Some(live);
        engine
            .inner
            .sessions
            .evict_over_capacity(engine.inner.tenant.as_deref(), id);
    }
    let mut envelope =
        crate::session::cell::cell(engine, &mut e, &request, None, events, cancel, started).await?;
    envelope.restored = restore.is_some();
    envelope.restore = restore;
    Ok(envelope)
}

/// Resumes a session's suspended cell `run_id`: the session is rebuilt from its record (the cells
/// before replayed), the suspended cell replayed with `decisions`, and it goes on live.
pub(crate) async fn resume_cell(
    engine: &RunPython,
    id: &str,
    run_id: &str,
    decisions: HashMap<String, Value>,
) -> Result<Envelope, Error> {
    let started = Instant::now();
    let entry = engine
        .inner
        .sessions
        .entry(engine.inner.tenant.as_deref(), id);
    let mut e = entry.lock().await;
    let record = crate::session::route::session_record(engine, id)
        .await?
        .ok_or_else(|| Error::InvalidInput(format!("session {id} has no record to resume")))?;
    let Some((last, before)) = record.cells.split_last() else {
        return Err(Error::InvalidInput(format!(
            "session {id} has no cell to resume"
        )));
    };
    if last.run_id != run_id || last.suspended.is_empty() {
        return Err(Error::InvalidInput(format!(
            "run {run_id} is not the cell session {id} waits on; nothing to resume"
        )));
    }
    for key in decisions.keys() {
        if !last.suspended.contains(key) {
            return Err(Error::InvalidInput(format!(
                "run {run_id} has no suspension {key:?}; it waits on: {}",
                last.suspended.join(", ")
            )));
        }
    }
    if let Some(mut live) = e.live.take() {
        live.kill();
    }
    // `resume` gives no environment values: cells that had some restore only from a snapshot taken
    // after them, and the suspended cell runs again without its own (as a resumed run does).
    let none = std::collections::BTreeMap::new();
    let (live, report) = match crate::session::restore::restore(
        engine,
        &mut e,
        &record,
        before.len(),
        &none,
        started,
    )
    .await?
    {
        Ok(restored) => restored,
        Err(envelope) => return Ok(*envelope),
    };
    let mut rest = record.clone();
    rest.pop_cell();
    e.record = Some(rest);
    e.live = Some(live);
    let request = last.request.request(&none)?;
    let plan = ReplayPlan {
        journal: last.journal()?,
        decisions,
        complete: false,
    };
    let mut envelope =
        crate::session::cell::cell(engine, &mut e, &request, Some(plan), None, None, started)
            .await?;
    envelope.restored = true;
    envelope.restore = Some(report);
    if let Some(keep) = &engine.inner.keep {
        crate::durable::resume::finish_session_cell(&keep.store, run_id).await?;
    }
    Ok(envelope)
}

fn lost_envelope(id: &str, why: &str, started: Instant) -> Envelope {
    let mut envelope = Envelope::failed(
        Status::Error,
        ErrorInfo::new(
            "SessionLost",
            format!(
                "session {id} lost its state ({why}); this call did not run, and the next one starts \
                 the session again, empty (keep sessions in a store to have them restored instead)"
            ),
        ),
        new_run_id(),
    );
    envelope.session_id = Some(id.to_owned());
    envelope.duration_ms = elapsed_ms(started);
    envelope
}
