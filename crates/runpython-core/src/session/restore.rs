//! Restoring a session whose interpreter is gone, from its record: a new interpreter, the latest
//! snapshot of its namespace loaded into it when one fits the record, then the cells recorded after
//! the snapshot replayed (tool calls answered from their journals, outputs discarded), all within the
//! replay budget ([`crate::SessionConfig::replay_budget`]). A restore that cannot be faithful fails
//! with an envelope saying which cell and why, and leaves the record as it was.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use runpython_bridge::{ReplayPlan, Stop};

use crate::error::Error;
use crate::protocol::envelope::{Envelope, ErrorInfo, RestoreReport, Status};
use crate::protocol::outcome::{human_duration, Ending};
use crate::protocol::request::{new_run_id, RunRequest};
use crate::run::execute::{elapsed_ms, Outcome};
use crate::session::snapshot::{self, Snapshots};
use crate::session::{CellRecord, Entry, Live, SessionRecord};
use crate::RunPython;

/// What a restore ends with: the interpreter holding the session again and how it came back, or the
/// envelope saying why it could not (its interpreter gone, the record kept).
pub(crate) type Restored = Result<(Live, RestoreReport), Box<Envelope>>;

/// Restores `e` from the first `upto` cells of `record` (all of them, or all but a suspended last
/// one), giving replayed cells their environment variables from `env` (the call that restores).
pub(crate) async fn restore(
    engine: &RunPython,
    e: &mut Entry,
    record: &SessionRecord,
    upto: usize,
    env: &BTreeMap<String, String>,
    started: Instant,
) -> Result<Restored, Error> {
    let began = Instant::now();
    let budget = engine.inner.sessions.config.replay_budget;
    let deadline = began + budget;
    let cells = &record.cells[..upto];
    let interpreter = engine.interpreter().await?.clone();
    let python = (interpreter.version.0, interpreter.version.1);
    e.cells = 0;
    e.deps.clear();
    let found = match &engine.inner.keep {
        Some(keep) => {
            snapshot::find(&keep.store, &e.id, &record.epoch, upto as u64, python).await?
        }
        None => Err(None),
    };
    let (found, mut why) = match found {
        Ok(found) => (Some(found), None),
        Err(why) => (None, why),
    };
    let mut from = found.as_ref().map_or(0, |f| f.cells as usize);
    if let Err(envelope) = can_replay(engine, e, cells, from, env, started) {
        return Ok(Err(envelope));
    }
    let mut live = Live::start(engine).await?;
    let mut snapshot_ms = None;
    if let Some(found) = found {
        let loaded_at = Instant::now();
        let loaded = match prepare_env(engine, e, &record.dependencies, &interpreter).await {
            Ok(site_dirs) => {
                let site_dirs = site_dirs.iter().map(std::path::PathBuf::as_path).collect();
                let left = deadline.saturating_duration_since(Instant::now());
                snapshot::load(&mut live, found, site_dirs, left).await?
            }
            Err(why) => Err(why),
        };
        match loaded {
            Ok(child_ms) => {
                snapshot_ms =
                    Some(child_ms.unwrap_or_else(|| loaded_at.elapsed().as_secs_f64() * 1e3));
                e.cells = from as u64;
                why = (from < cells.len()).then(|| {
                    record.note.clone().unwrap_or_else(|| {
                        "the cells after its snapshot were cheaper to replay than to snapshot"
                            .into()
                    })
                });
            }
            Err(failed) => {
                // What it loaded may be in the namespace: start again from nothing.
                live.kill();
                e.deps.clear();
                why = Some(failed);
                if let Err(envelope) = can_replay(engine, e, cells, 0, env, started) {
                    return Ok(Err(envelope));
                }
                live = Live::start(engine).await?;
                from = 0;
            }
        }
    } else if !cells.is_empty() {
        why = Some(why.unwrap_or_else(|| {
            record
                .note
                .clone()
                .unwrap_or_else(|| "it has no snapshot".into())
        }));
    }
    let mut replayed_ms = 0u64;
    let id = e.id.clone();
    for (i, cell) in cells.iter().enumerate().skip(from) {
        let left = deadline.saturating_duration_since(Instant::now());
        let over_budget = |done: &str| {
            format!(
                "restoring session {id} ran past its replay budget of {} (--session-replay-budget) \
                 {done} cell {} of the {} to replay{}; its cells took {} when they ran. Its record is \
                 kept: raise the budget to restore it, or reset the session",
                human_duration(budget),
                i + 1 - from,
                cells.len() - from,
                match from {
                    0 => String::new(),
                    n => format!(" after its snapshot of {n} cells"),
                },
                human_duration(Duration::from_millis(cells[from..].iter().map(|c| c.ms).sum()))
            )
        };
        if left.is_zero() {
            live.kill();
            return Ok(Err(lost(e, "SessionLost", over_budget("before"), started)));
        }
        let mut request = cell.request.request(env)?;
        let own = request
            .timeout
            .unwrap_or(engine.inner.limits.timeout)
            .min(engine.inner.limits.timeout);
        request.timeout = Some(own.min(left));
        match replay_cell(engine, e, &mut live, cell, &request, started).await? {
            Ok(()) => {}
            Err(Replay::TimedOut) if left < own => {
                live.kill();
                return Ok(Err(lost(e, "SessionLost", over_budget("during"), started)));
            }
            Err(Replay::TimedOut) => {
                live.kill();
                let why = format!(
                    "it ran past its timeout of {} on replay, but ended within it when it ran",
                    human_duration(own)
                );
                return Ok(Err(failed_at(e, i, "ReplayDiverged", &why, started)));
            }
            Err(Replay::Failed(envelope)) => {
                live.kill();
                return Ok(Err(envelope));
            }
            Err(Replay::Differs(kind, why)) => {
                live.kill();
                return Ok(Err(failed_at(e, i, kind, &why, started)));
            }
        }
        replayed_ms += cell.ms;
        e.cells = i as u64 + 1;
    }
    if let Some(keep) = &engine.inner.keep {
        // The next cell's envelope lists only what it changed.
        let _ = live.changed_files(keep.collect.clone()).await;
    }
    e.snapshots = Snapshots::restored(Duration::from_millis(replayed_ms));
    let report = RestoreReport {
        from: if snapshot_ms.is_some() {
            "snapshot"
        } else {
            "replay"
        }
        .into(),
        snapshot_cells: snapshot_ms.map(|_| from as u64),
        replayed: (cells.len() - from) as u64,
        why,
        ms: round3(began.elapsed().as_secs_f64() * 1e3),
        snapshot_ms: snapshot_ms.map(round3),
    };
    Ok(Ok((live, report)))
}

fn round3(ms: f64) -> f64 {
    (ms * 1e3).round() / 1e3
}

/// Whether the cells from `from` can be replayed here as they ran: their record holds what they
/// needed, the call gives their environment variables, the engine has their secrets.
fn can_replay(
    engine: &RunPython,
    e: &mut Entry,
    cells: &[CellRecord],
    from: usize,
    env: &BTreeMap<String, String>,
    started: Instant,
) -> Result<(), Box<Envelope>> {
    let secrets = crate::durable::at_rest::secret_names(&engine.inner.sandbox);
    for (i, cell) in cells.iter().enumerate().skip(from) {
        let n = i + 1;
        if let Some(lacks) = cell.lacks() {
            let why = format!(
                "session {} cannot be restored: its cell {n} was recorded by an older runpython, and \
                 {lacks}. Its record is kept; reset the session to start over",
                e.id
            );
            return Err(lost(e, "SessionLost", why, started));
        }
        let missing = cell.request.missing_env(env);
        if !missing.is_empty() {
            let why = format!(
                "session {} cannot be restored without the environment variables its cell {n} was \
                 given ({}): their values are never stored. Pass them again with this call (`env`) \
                 to restore it; its record is kept",
                e.id,
                missing.join(", ")
            );
            return Err(lost(e, "SessionLost", why, started));
        }
        let missing = cell.request.missing_secrets(&secrets);
        if !missing.is_empty() {
            let why = format!(
                "session {} cannot be restored on this host: its cell {n} had the secrets {}, which \
                 this engine does not have. Give the engine the same secrets (`--secret NAME:HOSTS`) \
                 to restore it; its record is kept",
                e.id,
                missing.join(", ")
            );
            return Err(lost(e, "SessionLost", why, started));
        }
    }
    Ok(())
}

/// The session's environment (its requirements so far), prepared; its site directories.
async fn prepare_env(
    engine: &RunPython,
    e: &mut Entry,
    dependencies: &[String],
    interpreter: &runpython_deps::Interpreter,
) -> Result<Vec<std::path::PathBuf>, String> {
    let mut request = RunRequest::new("");
    request.dependencies = dependencies.to_vec();
    match engine.inner.deps.prepare(&request, interpreter, None).await {
        Ok(Some(env)) => {
            e.deps = env.specs.clone();
            Ok(env.site_dir.into_iter().collect())
        }
        Ok(None) => Ok(Vec::new()),
        Err(err) => Err(format!(
            "its environment could not be prepared for its snapshot ({err})"
        )),
    }
}

/// Why a replayed cell did not replay as it ran.
enum Replay {
    /// Past its timeout (its own, or what was left of the budget).
    TimedOut,
    /// The envelope saying why (its dependencies, its interpreter lost).
    Failed(Box<Envelope>),
    /// It did something else than when it ran: the error's kind and what differed.
    Differs(&'static str, String),
}

/// Replays one recorded cell in `live`.
async fn replay_cell(
    engine: &RunPython,
    e: &mut Entry,
    live: &mut Live,
    cell: &CellRecord,
    request: &RunRequest,
    started: Instant,
) -> Result<Result<(), Replay>, Error> {
    let recorded = cell.journal()?;
    let plan = ReplayPlan {
        journal: recorded.clone(),
        decisions: HashMap::new(),
        complete: true,
    };
    let raw = match crate::session::cell::run_live_cell(
        engine,
        e,
        live,
        request,
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
            envelope.session_id = Some(e.id.clone());
            envelope.restored = true;
            e.cells = 0;
            return Ok(Err(Replay::Failed(Box::new(envelope))));
        }
    };
    if let Ending::TimedOut = raw.ending {
        return Ok(Err(Replay::TimedOut));
    }
    let diverged = matches!(raw.ending, Ending::Bridge(Stop::Diverged { .. }));
    let journal = raw.journal.clone().unwrap_or_default();
    let envelope = crate::run::execute::envelope_of(
        engine,
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
        engine.inner.limits.timeout,
        started,
    )?;
    let error = envelope.error.as_ref();
    if diverged {
        let why = error.map_or_else(|| "its tool calls differ".into(), |err| err.message.clone());
        return Ok(Err(Replay::Differs("ReplayDiverged", why)));
    }
    if let Some(why) = &raw.lost {
        let why = error.map_or_else(
            || why.clone(),
            |err| format!("{}: {}", err.kind, err.message),
        );
        return Ok(Err(Replay::Differs("SessionLost", why)));
    }
    let ended = error.map(|err| err.kind.clone());
    let shown = || {
        error.map_or(String::new(), |err| {
            format!("{}: {}", err.kind, err.message)
        })
    };
    if cell.legacy {
        if ended.is_some() {
            let why = format!(
                "it was recorded by an older runpython, which kept only its code, inputs, input \
                 artifacts and dependencies (not its files, exact values, environment, allowed hosts \
                 or timeout), and its replay raised {}, so it may have needed one of those. Its \
                 record is kept; reset the session to start over",
                shown()
            );
            return Ok(Err(Replay::Differs("SessionLost", why)));
        }
    } else if ended != cell.failed {
        let why = match (&ended, &cell.failed) {
            (Some(_), None) => format!(
                "its replay raised {}, but it succeeded when it ran",
                shown()
            ),
            (None, Some(then)) => format!("its replay succeeded, but it raised {then} when it ran"),
            (_, then) => format!(
                "its replay raised {}, but it raised {} when it ran",
                shown(),
                then.as_deref().unwrap_or("nothing")
            ),
        };
        return Ok(Err(Replay::Differs("ReplayDiverged", why)));
    }
    let made = journal.entries.len();
    if made < recorded.entries.len() {
        let next = &recorded.entries[made];
        let why = format!(
            "its replay made {made} of the {} tool calls it made when it ran; the first it did not \
             make again is {}({})",
            recorded.entries.len(),
            next.tool,
            next.args
        );
        return Ok(Err(Replay::Differs("ReplayDiverged", why)));
    }
    Ok(Ok(()))
}

/// The envelope of a restore that failed at cell `i` (from 0) for `why`.
fn failed_at(e: &mut Entry, i: usize, kind: &str, why: &str, started: Instant) -> Box<Envelope> {
    let message = format!(
        "restoring session {} failed at its cell {}: {why}",
        e.id,
        i + 1
    );
    lost(e, kind, message, started)
}

/// The envelope of a restore that failed: `kind` and `message`; the session has no interpreter and
/// starts its restore again at the next call (its record is kept).
fn lost(e: &mut Entry, kind: &str, message: String, started: Instant) -> Box<Envelope> {
    e.cells = 0;
    e.lost = None;
    let mut envelope = Envelope::failed(Status::Error, ErrorInfo::new(kind, message), new_run_id());
    envelope.session_id = Some(e.id.clone());
    envelope.restored = true;
    envelope.duration_ms = elapsed_ms(started);
    Box::new(envelope)
}
