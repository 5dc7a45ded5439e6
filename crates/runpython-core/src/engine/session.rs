//! Sessions through the engine: [`Session`] handles, a cell from request to envelope in a session's live
//! interpreter, and restoring a session from its record (replaying its cells, tool calls answered from
//! their journals) when its interpreter is gone.

use std::collections::HashMap;
use std::time::Instant;

use runpython_bridge::{CallState, ReplayPlan};
use serde_json::Value;
use tokio::sync::{mpsc, oneshot};

use super::attempt::OutputUpload;
use super::execute::{elapsed_ms, Outcome};
use super::tools::RunTools;
use super::{RunHandle, RunPython};
use crate::child::code_dir;
use crate::envelope::{Envelope, ErrorInfo, Status};
use crate::error::Error;
use crate::outcome::Ending;
use crate::request::{check_env, check_input_names, new_run_id, Event, RunRequest};
use crate::session::{
    check_session_id, new_session_id, CellRecord, CellSpec, Entry, Live, SessionRecord,
};

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
        self.engine.reset_session(&self.id).await
    }

    /// Ends the session: like [`Session::reset`], and the engine forgets the id.
    pub async fn close(self) -> Result<(), Error> {
        self.engine.reset_session(&self.id).await?;
        self.engine.inner.sessions.remove(&self.id);
        Ok(())
    }
}

impl RunPython {
    /// A new session (its interpreter starts with its first cell).
    pub fn session(&self) -> Session {
        Session {
            engine: self.clone(),
            id: new_session_id(),
        }
    }

    /// The session `id` (1-128 letters, digits, `-`, `_`, `.`, `:`): a new one if this engine and its
    /// store have never seen it, else the same one (restored from the store when its interpreter is
    /// gone).
    pub fn session_with_id(&self, id: impl Into<String>) -> Result<Session, Error> {
        let id = id.into();
        check_session_id(&id)?;
        Ok(Session {
            engine: self.clone(),
            id,
        })
    }

    /// Kills the session's interpreter and forgets its state, here and in the store.
    pub(crate) async fn reset_session(&self, id: &str) -> Result<(), Error> {
        check_session_id(id)?;
        let entry = self.inner.sessions.entry(id);
        let mut e = entry.lock().await;
        if let Some(mut live) = e.live.take() {
            live.kill();
        }
        e.lost = None;
        e.cells = 0;
        e.deps.clear();
        e.record = None;
        if let Some(keep) = &self.inner.keep {
            keep.store.delete_session(id).await?;
        }
        Ok(())
    }

    async fn session_record(&self, id: &str) -> Result<Option<SessionRecord>, Error> {
        match &self.inner.keep {
            Some(keep) => SessionRecord::load(&keep.store, id).await,
            None => Ok(None),
        }
    }

    /// Starts a session's interpreter: every isolation layer and limit of a run; it reads every
    /// prepared environment (so a cell may add dependencies while the session lives).
    async fn start_live(&self) -> Result<Live, Error> {
        let interpreter = self.interpreter().await?.clone();
        let code_dir = code_dir()?;
        if !crate::child::bytecode_ready(&interpreter.executable) {
            let (python, version) = (interpreter.executable.clone(), interpreter.version);
            let _ = tokio::task::spawn_blocking(move || {
                crate::child::ensure_bytecode(&python, version, code_dir)
            })
            .await;
        }
        let envs = self.inner.deps.root().to_owned();
        let _ = std::fs::create_dir_all(&envs);
        let spec = crate::child::SlotSpec {
            sandbox: self.inner.sandbox.clone(),
            timeout: self.inner.limits.timeout,
            env_passthrough: self.inner.env_passthrough.clone(),
        };
        let python = interpreter.executable.clone();
        let slot = tokio::task::spawn_blocking(move || {
            spec.spawn_session(&python, code_dir, &[envs.as_path()])
        })
        .await
        .map_err(|e| Error::Internal(format!("starting a session panicked: {e}")))??;
        Live::new(slot)
    }

    /// Runs one cell of the session `id` (routed here by `RunRequest::session`).
    pub(super) async fn execute_cell(
        &self,
        id: &str,
        request: RunRequest,
        events: Option<mpsc::Sender<Event>>,
        cancel: Option<oneshot::Receiver<()>>,
    ) -> Result<Envelope, Error> {
        let started = Instant::now();
        check_session_id(id)?;
        check_input_names(&request)?;
        check_env(&request)?; // before the cell reaches the live interpreter, which it would end
        let entry = self.inner.sessions.entry(id);
        let mut e = entry.lock().await;
        e.last_used = Instant::now();
        let limits = &self.inner.limits;
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
        let mut restored = false;
        if e.live.is_none() {
            let record = self
                .session_record(id)
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
            let mut live = self.start_live().await?;
            if let Some(record) = record {
                if let Some(last) = record.cells.last() {
                    if !last.suspended.is_empty() {
                        return Err(Error::InvalidInput(format!(
                            "session {id} waits for a decision on {} (run {}); resume that run",
                            last.suspended.join(", "),
                            last.run_id
                        )));
                    }
                }
                if let Err(envelope) = self
                    .replay(&mut e, &mut live, &record.cells, started)
                    .await?
                {
                    return Ok(*envelope);
                }
                e.record = Some(record);
                restored = true;
            }
            e.live = Some(live);
            self.inner.sessions.evict_over_capacity(id);
        }
        let mut envelope = self
            .cell(&mut e, &request, None, events, cancel, started)
            .await?;
        envelope.restored = restored;
        Ok(envelope)
    }

    /// Replays recorded cells in a new interpreter (output discarded, tool calls answered from their
    /// journals). `Ok(Err(envelope))` when the replay failed: the envelope says why, and the session is
    /// lost.
    async fn replay(
        &self,
        e: &mut Entry,
        live: &mut Live,
        cells: &[CellRecord],
        started: Instant,
    ) -> Result<Result<(), Box<Envelope>>, Error> {
        e.cells = 0;
        e.deps.clear();
        for (i, cell) in cells.iter().enumerate() {
            let request = cell.request()?;
            let plan = ReplayPlan {
                journal: cell.journal()?,
                decisions: HashMap::new(),
            };
            let raw = match self
                .run_live_cell(
                    e,
                    live,
                    &request,
                    &cell.run_id,
                    Some(plan),
                    None,
                    None,
                    true,
                )
                .await?
            {
                Ok((raw, _)) => raw,
                Err(mut envelope) => {
                    // Its dependencies could not be prepared again.
                    live.kill();
                    envelope.session_id = Some(e.id.clone());
                    envelope.restored = true;
                    e.cells = 0;
                    return Ok(Err(Box::new(envelope)));
                }
            };
            let failed = match &raw.ending {
                Ending::Bridge(runpython_bridge::Stop::Diverged { .. }) => true,
                _ => raw.lost.is_some(),
            };
            if failed {
                live.kill();
                let mut envelope = self.envelope_of(
                    new_run_id(),
                    Outcome {
                        ending: raw.ending,
                        answer: &raw.answer,
                        stdout: &raw.stdout,
                        stderr: &raw.stderr,
                        isolation: live.isolation.clone(),
                        oom_killed: raw.oom_killed,
                        bridge_stats: raw.bridge_stats.as_deref(),
                    },
                    self.inner.limits.timeout,
                    started,
                )?;
                envelope.session_id = Some(e.id.clone());
                envelope.restored = true;
                let why = format!(
                    "restoring session {} failed at its cell {}: {}",
                    e.id,
                    i + 1,
                    envelope
                        .error
                        .as_ref()
                        .map_or("the replay stopped".to_owned(), |err| err.message.clone())
                );
                if let Some(err) = &mut envelope.error {
                    err.message = why.clone();
                } else {
                    envelope.status = Status::Error;
                    envelope.error = Some(ErrorInfo::new("SessionLost", why.clone()));
                }
                e.lost = None;
                e.cells = 0;
                return Ok(Err(Box::new(envelope)));
            }
            e.cells = i as u64 + 1;
        }
        if self.inner.keep.is_some() {
            // The next cell's envelope lists only what it changed.
            let _ = live
                .changed_files(
                    self.inner
                        .keep
                        .as_ref()
                        .map(|k| k.collect.clone())
                        .unwrap_or_default(),
                )
                .await;
        }
        Ok(Ok(()))
    }

    /// Runs one cell in `live` (its dependencies prepared and its interpreter told to use them).
    /// `quiet` cells (a replay) get no events. `Ok(Err(envelope))`: the cell could not start (its
    /// dependencies), the envelope says why.
    #[allow(clippy::too_many_arguments)]
    async fn run_live_cell(
        &self,
        e: &mut Entry,
        live: &mut Live,
        request: &RunRequest,
        run_id: &str,
        replay: Option<ReplayPlan>,
        events: Option<mpsc::Sender<Event>>,
        cancel: Option<oneshot::Receiver<()>>,
        quiet: bool,
    ) -> Result<Result<(crate::session::CellRaw, Vec<OutputUpload>), Envelope>, Error> {
        let limits = &self.inner.limits;
        let interpreter = self.interpreter().await?.clone();
        // The session's dependencies so far, and this cell's.
        let mut deps_request = request.clone();
        deps_request.dependencies = e
            .deps
            .iter()
            .chain(&request.dependencies)
            .cloned()
            .collect();
        let site_dirs = match self
            .inner
            .deps
            .prepare(&deps_request, &interpreter, events.as_ref())
            .await
        {
            Ok(Some(env)) => {
                for spec in &env.specs {
                    if !e.deps.contains(spec) {
                        e.deps.push(spec.clone());
                    }
                }
                env.site_dir.into_iter().collect::<Vec<_>>()
            }
            Ok(None) => Vec::new(),
            Err(err) => {
                let envelope = Envelope::failed(
                    Status::Error,
                    ErrorInfo::new(
                        "DependencyError",
                        format!("{err}; the session's state is kept"),
                    ),
                    new_run_id(),
                );
                return Ok(Err(envelope));
            }
        };
        let RunTools {
            tools,
            nested_stats,
            saved: _,
        } = self.run_tools(Instant::now(), &live.scratch)?;
        let tools = match (&events, quiet) {
            (Some(events), false) => super::tools::announced(&tools, events)?,
            _ => tools,
        };
        let input_artifacts = crate::persist::fetch_input_artifacts(self.store(), request).await?;
        let request_json = serde_json::to_vec(&serde_json::json!({
            "type": "cell",
            "code_dir": code_dir()?,
            "code": &request.code,
            "inputs": &request.inputs,
            "env": &request.env,
            "input_artifacts": input_artifacts,
            "artifact_helpers": self.inner.keep.is_some(),
            "max_return_bytes": limits.max_return_bytes,
            "inline_return_bytes": limits.inline_return_bytes,
            "site_dirs": site_dirs,
            "saved_dir": live.saved_dir,
            "repr": request.repr,
            "bridge": Value::Null,
        }))
        .map_err(|e| Error::Internal(e.to_string()))?;
        let (mut uploads, full) = if quiet {
            (Vec::new(), [None, None])
        } else {
            e.secrets
                .extend(request.env.iter().map(|(k, v)| (k.clone(), v.clone())));
            self.output_uploads(&masking(request, e))
        };
        let raw = live
            .run_cell(CellSpec {
                request_json,
                tools,
                bridge: &self.inner.bridge,
                replay,
                sink: None,
                nested_stats,
                max_output_chars: limits.max_output_chars,
                max_return_bytes: limits.max_return_bytes,
                timeout: request
                    .timeout
                    .unwrap_or(limits.timeout)
                    .min(limits.timeout),
                events: if quiet { None } else { events },
                cancel,
                full,
                run_id: run_id.to_owned(),
            })
            .await?;
        OutputUpload::set_cut(&mut uploads, raw.cut);
        Ok(Ok((raw, uploads)))
    }

    /// A live cell from request to envelope: run, recorded (durable sessions), kept, fitted.
    async fn cell(
        &self,
        e: &mut Entry,
        request: &RunRequest,
        replay: Option<ReplayPlan>,
        events: Option<mpsc::Sender<Event>>,
        cancel: Option<oneshot::Receiver<()>>,
        started: Instant,
    ) -> Result<Envelope, Error> {
        let mut live = e
            .live
            .take()
            .ok_or_else(|| Error::Internal("a session cell without an interpreter".into()))?;
        let run_id = new_run_id();
        let ran = self
            .run_live_cell(
                e, &mut live, request, &run_id, replay, events, cancel, false,
            )
            .await;
        let (mut raw, uploads) = match ran {
            Ok(Ok(ran)) => ran,
            Ok(Err(mut envelope)) => {
                e.live = Some(live);
                envelope.session_id = Some(e.id.clone());
                envelope.duration_ms = elapsed_ms(started);
                return Ok(envelope);
            }
            Err(err) => {
                e.live = Some(live);
                return Err(err);
            }
        };
        let (streamed, upload_failed) =
            match OutputUpload::finish(uploads, &mut raw.stdout, &mut raw.stderr).await {
                Ok(streamed) => (streamed, None),
                Err(err) => (Vec::new(), Some(err)),
            };
        let completed = matches!(raw.ending, Ending::Answered) && raw.lost.is_none();
        let suspended: Vec<String> = match (&raw.ending, &raw.journal) {
            (Ending::Bridge(runpython_bridge::Stop::Suspended(_)), Some(journal)) => journal
                .suspensions()
                .filter_map(|entry| match &entry.state {
                    CallState::Suspended { id, .. } => Some(id.clone()),
                    _ => None,
                })
                .collect(),
            _ => Vec::new(),
        };
        let timeout = request
            .timeout
            .unwrap_or(self.inner.limits.timeout)
            .min(self.inner.limits.timeout);
        let mut envelope = self.envelope_of(
            run_id.clone(),
            Outcome {
                ending: raw.ending,
                answer: &raw.answer,
                stdout: &raw.stdout,
                stderr: &raw.stderr,
                isolation: live.isolation.clone(),
                oom_killed: raw.oom_killed,
                bridge_stats: raw.bridge_stats.as_deref(),
            },
            timeout,
            started,
        )?;
        e.cells += 1;
        envelope.session_id = Some(e.id.clone());
        envelope.cell = Some(e.cells);
        if envelope.status == Status::Timeout && raw.lost.is_none() {
            if let Some(err) = &mut envelope.error {
                err.message.push_str(
                    " (the cell was interrupted with KeyboardInterrupt; the session keeps its state)",
                );
            }
        }
        if let Some(why) = &raw.lost {
            if envelope.status != Status::Suspended {
                let note = format!("{why}; the session's state is lost");
                match &mut envelope.error {
                    Some(err) => err.message = format!("{}. {note}", err.message),
                    None => {
                        envelope.status = Status::Error;
                        envelope.error = Some(ErrorInfo::new("SessionLost", note));
                    }
                }
                e.lost = Some(why.clone());
            }
        }
        // The code ran: a store that fails from here on is named in the envelope (`kept: false`),
        // never an `Err` that would throw the cell's outcome and the live session away.
        if let Some(keep) = &self.inner.keep {
            let kept = match upload_failed {
                Some(err) => Err(err),
                None => {
                    let cell = KeptCell {
                        journal: raw.journal.as_ref(),
                        record: completed || !suspended.is_empty(),
                        files: raw.lost.is_none() || !suspended.is_empty(),
                        suspended,
                        streamed,
                    };
                    self.keep_cell(keep, e, &mut live, request, &mut envelope, cell)
                        .await
                }
            };
            if let Err(err) = kept {
                super::execute::not_kept(&mut envelope, &crate::error_report(&err));
            }
        }
        if raw.lost.is_none() {
            e.live = Some(live);
        }
        if envelope.return_preview.is_some() {
            envelope.return_value = Value::Null;
        }
        crate::budget::fit(
            &mut envelope,
            self.inner.limits.envelope_budget,
            &raw.stdout,
            &raw.stderr,
            self.inner.limits.max_output_chars,
        );
        Ok(envelope)
    }

    /// Keeps a cell: its record in the session's (durable sessions: a completed or suspended cell,
    /// with its journal) and the run itself. Stops at the first write that fails. The record in
    /// memory has the cell either way, so the next cell's save writes it.
    async fn keep_cell(
        &self,
        keep: &crate::persist::Keeping,
        e: &mut Entry,
        live: &mut Live,
        request: &RunRequest,
        envelope: &mut Envelope,
        cell: KeptCell<'_>,
    ) -> Result<(), Error> {
        let run_id = envelope.run_id.clone();
        if cell.record {
            let journal = cell.journal.cloned().unwrap_or_default();
            let mut record = e.record.take().unwrap_or_default();
            record.cells.push(CellRecord::new(
                request,
                &journal,
                &run_id,
                cell.suspended.clone(),
            )?);
            record.dependencies = e.deps.clone();
            let saved = record.save(&keep.store, &e.id).await;
            e.record = Some(record);
            saved?;
            if !cell.suspended.is_empty() {
                crate::resume::put_session_cell(&keep.store, &run_id, &e.id).await?;
            }
        }
        if cell.files {
            let files = live.changed_files(keep.collect.clone()).await?;
            let interpreter = self.interpreter().await?.clone();
            crate::persist::keep_run(
                keep,
                &masking(request, e),
                envelope,
                (files, cell.streamed),
                &interpreter,
                None,
                &self.inner.env_passthrough,
            )
            .await?;
        }
        Ok(())
    }

    /// Resumes a session's suspended cell `run_id`: the session is rebuilt from its record (the cells
    /// before replayed), the suspended cell replayed with `decisions`, and it goes on live.
    pub(super) async fn resume_cell(
        &self,
        id: &str,
        run_id: &str,
        decisions: HashMap<String, Value>,
    ) -> Result<Envelope, Error> {
        let started = Instant::now();
        let entry = self.inner.sessions.entry(id);
        let mut e = entry.lock().await;
        let record = self
            .session_record(id)
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
        let mut live = self.start_live().await?;
        if let Err(envelope) = self.replay(&mut e, &mut live, before, started).await? {
            return Ok(*envelope);
        }
        let mut rest = record.clone();
        rest.cells.pop();
        e.record = Some(rest);
        e.live = Some(live);
        let request = last.request()?;
        let plan = ReplayPlan {
            journal: last.journal()?,
            decisions,
        };
        let mut envelope = self
            .cell(&mut e, &request, Some(plan), None, None, started)
            .await?;
        envelope.restored = true;
        if let Some(keep) = &self.inner.keep {
            crate::resume::finish_session_cell(&keep.store, run_id).await?;
        }
        Ok(envelope)
    }
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

/// What of a cell is kept, besides its envelope.
struct KeptCell<'a> {
    journal: Option<&'a runpython_bridge::Journal>,
    /// Record it in the session's record (it completed or suspended).
    record: bool,
    /// Keep it as a run (its files and output).
    files: bool,
    suspended: Vec<String>,
    streamed: Vec<runpython_store::Artifact>,
}

/// `request` with the environment its kept output is masked with: every variable the session's cells
/// were given (the code may have kept a value a cell read).
fn masking(request: &RunRequest, e: &Entry) -> RunRequest {
    let mut masked = request.clone();
    masked
        .env
        .extend(e.secrets.iter().map(|(k, v)| (k.clone(), v.clone())));
    masked
}
