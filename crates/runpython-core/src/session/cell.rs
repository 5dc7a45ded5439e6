//! One session cell in its live interpreter: its dependencies prepared, run, recorded (durable
//! sessions), kept and fitted into an envelope.

use std::path::PathBuf;
use std::time::Instant;

use runpython_bridge::{CallState, ReplayPlan};
use serde_json::Value;
use tokio::sync::{mpsc, oneshot};

use crate::child::code_dir;
use crate::child::protocol::RunnerRequest;
use crate::error::Error;
use crate::protocol::envelope::{Envelope, ErrorInfo, Status};
use crate::protocol::outcome::Ending;
use crate::protocol::request::{new_run_id, Event, RunRequest};
use crate::run::attempt::OutputUpload;
use crate::run::execute::{elapsed_ms, Outcome};
use crate::run::tools::RunTools;
use crate::session::{CellRecord, CellRun, CellSpec, Entry, Live};
use crate::RunPython;

/// Runs one cell in `live` (its dependencies prepared and its interpreter told to use them).
/// `quiet` cells (a replay) get no events. `Ok(Err(envelope))`: the cell could not start (its
/// dependencies), the envelope says why.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn run_live_cell(
    engine: &RunPython,
    e: &mut Entry,
    live: &mut Live,
    request: &RunRequest,
    run_id: &str,
    replay: Option<ReplayPlan>,
    events: Option<mpsc::Sender<Event>>,
    cancel: Option<oneshot::Receiver<()>>,
    quiet: bool,
) -> Result<Result<(crate::session::CellRaw, Vec<OutputUpload>), Envelope>, Error> {
    let limits = &engine.inner.limits;
    let interpreter = engine.interpreter().await?.clone();
    // The session's dependencies so far, and this cell's.
    let mut deps_request = request.clone();
    deps_request.dependencies = e
        .deps
        .iter()
        .chain(&request.dependencies)
        .cloned()
        .collect();
    let site_dirs = match engine
        .inner
        .deps
        .prepare(&deps_request, &interpreter, events.as_ref())
        .await
    {
        Ok(Some(env)) => {
            // A cell that adds requirements says what the session's environment now holds.
            let added = env.specs.iter().any(|spec| !e.deps.contains(spec));
            e.added_deps = added.then(|| crate::run::deps::report(&env)).flatten();
            for spec in &env.specs {
                if !e.deps.contains(spec) {
                    e.deps.push(spec.clone());
                }
            }
            env.site_dir.into_iter().collect::<Vec<_>>()
        }
        Ok(None) => Vec::new(),
        Err(err) => {
            let mut envelope = Envelope::failed(
                Status::Error,
                ErrorInfo::new(
                    "DependencyError",
                    format!("{err}; the session's state is kept"),
                ),
                new_run_id(),
            );
            envelope.dependencies = crate::run::deps::refused(&err);
            return Ok(Err(envelope));
        }
    };
    let RunTools {
        tools,
        call_budget,
        saved: _,
    } = crate::run::tools::run_tools(engine, Instant::now(), &live.scratch)?;
    if let Some(egress) = live.egress() {
        // Each cell its own hosts (or the session's whole policy), and placeholders of its own.
        egress.narrow(request.allow_hosts.clone());
        egress.rotate_secrets();
    }
    let (runner_env, trust_bundle) = runpython_egress::runner_env(&request.env, live.egress());
    let tools = match (&events, quiet) {
        (Some(events), false) => crate::run::tools::announced(&tools, events)?,
        _ => tools,
    };
    let input_artifacts =
        crate::durable::persist::fetch_input_artifacts(engine.store(), request).await?;
    let files = crate::durable::persist::fetch_files(engine.store(), request).await?;
    let saved_dir = live.saved_dir.clone();
    let cell_request = RunnerRequest {
        code_dir: code_dir()?,
        code: &request.code,
        inputs: &request.inputs,
        typed: request.typed,
        env: runner_env,
        trust_bundle,
        input_artifacts,
        files,
        artifact_helpers: engine.inner.keep.is_some(),
        network_reasons: live.egress().is_some(),
        max_return_bytes: limits.max_return_bytes,
        inline_return_bytes: limits.inline_return_bytes,
        image_budget: limits.max_image_bytes,
        site_dirs: site_dirs.iter().map(PathBuf::as_path).collect(),
        saved_dir: &saved_dir,
        repr: request.repr,
        bridge: None,
    };
    let (mut uploads, full) = if quiet {
        (Vec::new(), [None, None])
    } else {
        e.secrets
            .extend(request.env.iter().map(|(k, v)| (k.clone(), v.clone())));
        crate::run::attempt::output_uploads(engine, &masking(request, e))
    };
    let raw = live
        .run_cell(CellSpec {
            request: cell_request,
            tools,
            bridge: &engine.inner.bridge,
            replay,
            spill: engine
                .inner
                .keep
                .as_ref()
                .map(|keep| crate::session::spill_for(&keep.store, &e.id)),
            call_budget,
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
pub(crate) async fn cell(
    engine: &RunPython,
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
    // The kernel's counts of the connections handed to the session so far, before the mark.
    if let Some(egress) = live.egress() {
        egress.settle().await;
    }
    let mark = live.egress().map(runpython_egress::Egress::mark);
    let ran_at = Instant::now();
    let ran = crate::session::cell::run_live_cell(
        engine, e, &mut live, request, &run_id, replay, events, cancel, false,
    )
    .await;
    let ran_for = ran_at.elapsed();
    // What this cell did with the network (the session's interpreter keeps one egress).
    if let Some(egress) = live.egress() {
        egress.settle().await;
    }
    let network = match (live.egress(), mark) {
        (Some(egress), Some(mark)) => {
            let report = egress.report_since(mark);
            report.used().then(|| (report, egress.log_since(mark)))
        }
        _ => None,
    };
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
        .unwrap_or(engine.inner.limits.timeout)
        .min(engine.inner.limits.timeout);
    let mut envelope = crate::run::execute::envelope_of(
        engine,
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
    envelope.dependencies = e.added_deps.take();
    let (network_report, network_log) = match network {
        Some((report, log)) => (Some(report), Some(log)),
        None => (None, None),
    };
    envelope.network = network_report;
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
    if let Some(keep) = &engine.inner.keep {
        let kept = match upload_failed {
            Some(err) => Err(err),
            None => {
                let mut streamed = streamed;
                if let Some(log) = network_log {
                    match keep
                        .store
                        .put_artifact_stream(
                            crate::run::execute::NETWORK_LOG,
                            std::io::Cursor::new(log),
                        )
                        .await
                    {
                        Ok(artifact) => streamed.push(artifact),
                        Err(err) => {
                            crate::run::execute::not_kept(&mut envelope, &crate::error_report(&err))
                        }
                    }
                }
                let cell = KeptCell {
                    journal: raw.journal.as_ref(),
                    record: completed || !suspended.is_empty(),
                    files: raw.lost.is_none() || !suspended.is_empty(),
                    suspended,
                    streamed,
                    ran_for,
                };
                crate::session::cell::keep_cell(
                    engine,
                    keep,
                    e,
                    &mut live,
                    request,
                    &mut envelope,
                    cell,
                )
                .await
            }
        };
        match kept {
            Err(err) => crate::run::execute::not_kept(&mut envelope, &crate::error_report(&err)),
            Ok(()) if completed => {
                if let Some(why) =
                    crate::session::snapshot::after_cell(engine, keep, e, &mut live, ran_for).await
                {
                    raw.lost = Some(why.clone()); // the cell's outcome stands; the session restores
                    e.lost = Some(why);
                }
            }
            Ok(()) => {}
        }
    }
    if raw.lost.is_none() {
        e.live = Some(live);
    }
    if envelope.return_preview.is_some() {
        envelope.return_value = Value::Null;
        envelope.return_typed = None;
    }
    crate::run::budget::fit(
        &mut envelope,
        engine.inner.limits.envelope_budget,
        &raw.stdout,
        &raw.stderr,
        engine.inner.limits.max_output_chars,
    );
    Ok(envelope)
}

/// Keeps a cell: its record in the session's (durable sessions: a completed or suspended cell,
/// with its journal) and the run itself. Stops at the first write that fails. The record in
/// memory has the cell either way, so the next cell's save writes it.
async fn keep_cell(
    engine: &RunPython,
    keep: &crate::durable::persist::Keeping,
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
        let ran = CellRun {
            journal: &journal,
            run_id: &run_id,
            suspended: cell.suspended.clone(),
            failed: envelope.error.as_ref().map(|err| err.kind.clone()),
            ms: u64::try_from(cell.ran_for.as_millis()).unwrap_or(u64::MAX),
        };
        let secrets = crate::durable::at_rest::secret_names(&engine.inner.sandbox);
        let made = CellRecord::new(&keep.store, request, secrets, ran).await;
        let made = match made {
            Ok(made) => made,
            Err(err) => {
                e.record = Some(record);
                return Err(err);
            }
        };
        record.cells.push(made);
        record.dependencies = e.deps.clone();
        let saved = record.save(&keep.store, &e.id).await;
        e.record = Some(record);
        saved?;
        if !cell.suspended.is_empty() {
            crate::durable::resume::put_session_cell(&keep.store, &run_id, &e.id).await?;
        }
    }
    if cell.files {
        let files = live.changed_files(keep.collect.clone()).await?;
        let interpreter = engine.interpreter().await?.clone();
        crate::durable::persist::keep_run(
            keep,
            &masking(request, e),
            envelope,
            (files, cell.streamed),
            &interpreter,
            None,
            (&engine.inner.env_passthrough, &engine.inner.sandbox),
        )
        .await?;
    }
    Ok(())
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
    /// How long it ran.
    ran_for: std::time::Duration,
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
