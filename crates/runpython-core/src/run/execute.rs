//! One request end to end: validate → memo → attempt → checkpoint → keep → budget.

use std::sync::Arc;
use std::time::Instant;

use runpython_bridge::ReplayPlan;
use runpython_store::Computed;
use serde_json::Value;
use tokio::sync::{mpsc, oneshot};

use crate::durable::persist::{self, Keeping, MemoParts};
use crate::error::Error;
use crate::protocol::envelope::{Envelope, ErrorInfo, Isolation, Status, Truncated};
use crate::protocol::outcome::{apply_ending, apply_tool_limit};
use crate::protocol::request::{
    check_env, check_files, check_input_names, new_run_id, Event, RunRequest,
};
use crate::run::attempt::{Attempt, OutputUpload, Prepared};
use crate::RunPython;

pub(crate) fn elapsed_ms(started: Instant) -> u64 {
    u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// How one child (a run's, or a session's for one cell) ended, before it becomes an envelope.
pub(crate) struct Outcome<'a> {
    pub ending: crate::protocol::outcome::Ending,
    pub answer: &'a crate::protocol::outcome::Answer,
    pub stdout: &'a crate::child::Captured,
    pub stderr: &'a crate::child::Captured,
    pub isolation: Isolation,
    pub oom_killed: bool,
    pub bridge_stats: Option<&'a runpython_bridge::BridgeStats>,
}

/// The envelope of an outcome: output within its limit, status, value and error, the tool budget
/// and the memory limit applied, the isolation report.
pub(crate) fn envelope_of(
    engine: &RunPython,
    run_id: String,
    outcome: Outcome<'_>,
    timeout: std::time::Duration,
    started: Instant,
) -> Result<Envelope, Error> {
    let limits = &engine.inner.limits;
    let (stdout, stdout_trunc) = outcome.stdout.render(limits.max_output_chars);
    let (stderr, stderr_trunc) = outcome.stderr.render(limits.max_output_chars);
    let truncated = (stdout_trunc.is_some() || stderr_trunc.is_some()).then_some(Truncated {
        stdout: stdout_trunc,
        stderr: stderr_trunc,
        artifacts: None,
    });
    let mut envelope = Envelope {
        stdout,
        stderr,
        truncated,
        isolation: Some(Isolation {
            bridge: Some(engine.bridge_report()),
            ..outcome.isolation
        }),
        ..Envelope::empty(run_id)
    };
    apply_ending(
        &mut envelope,
        outcome.ending,
        outcome.answer,
        limits.max_return_bytes,
        timeout,
    )?;
    if outcome.oom_killed {
        crate::protocol::outcome::apply_memory_limit(
            &mut envelope,
            engine.inner.sandbox.run_memory_bytes,
        );
    }
    if let Some(stats) = outcome.bridge_stats.filter(|s| s.limit_exceeded()) {
        apply_tool_limit(
            &mut envelope,
            engine.inner.bridge.max_calls,
            stats.tree_limit_exceeded(),
        );
    }
    envelope.duration_ms = elapsed_ms(started);
    Ok(envelope)
}

/// A run of its own (not a session's cell) from its request to its envelope: its timeout, the memo,
/// the attempt, keeping it.
pub(crate) async fn execute(
    engine: &RunPython,
    request: RunRequest,
    events: Option<mpsc::Sender<Event>>,
    cancel: Option<oneshot::Receiver<()>>,
) -> Result<Envelope, Error> {
    if let Some(timeout) = request.timeout {
        if timeout.is_zero() {
            return Err(Error::InvalidInput(
                "the run's timeout must be longer than zero".into(),
            ));
        }
        if timeout < engine.inner.limits.timeout {
            // A copy of the engine with the shorter limit, so everything that reads the timeout
            // (the kill, nested runs' budgets, memo keys) sees the same one. Pooled interpreters
            // stay shared: their CPU rlimit is the engine's, longer than this run's.
            let engine = engine.with_timeout(timeout);
            let request = RunRequest {
                timeout: None,
                ..request
            };
            return Box::pin(execute(&engine, request, events, cancel)).await;
        }
    }
    let started = Instant::now();
    let limits = &engine.inner.limits;
    if request.allow_hosts.is_some()
        && matches!(
            engine.inner.sandbox.network,
            runpython_egress::Network::Host
        )
    {
        return Err(Error::InvalidInput(
            "allow_hosts narrows a network policy, and this engine shares the host's network \
             instead: give it a policy (--allow-network, --allow-host) to narrow"
                .into(),
        ));
    }
    check_input_names(&request)?;
    check_env(&request)?;
    check_files(&request, limits.max_upload_bytes)?;
    let code_chars = request.code.chars().count();
    if code_chars > limits.max_code_chars {
        let mut envelope = Envelope::failed(
            Status::Error,
            ErrorInfo::new(
                "CodeTooLarge",
                format!(
                    "the code is {code_chars} characters, over the limit of {}; send less code (move data into inputs or files)",
                    limits.max_code_chars
                ),
            ),
            new_run_id(),
        );
        envelope.duration_ms = elapsed_ms(started);
        return Ok(envelope);
    }
    match &engine.inner.keep {
        Some(keep) if keep.memo_ttl.is_some() && request.use_memo => {
            crate::run::execute::execute_memoized(engine, keep, request, events, cancel, started)
                .await
        }
        _ => Ok(crate::run::execute::execute_attempt(
            engine, &request, events, cancel, started, None,
        )
        .await?
        .0),
    }
}

async fn execute_memoized(
    engine: &RunPython,
    keep: &Keeping,
    request: RunRequest,
    events: Option<mpsc::Sender<Event>>,
    cancel: Option<oneshot::Receiver<()>>,
    started: Instant,
) -> Result<Envelope, Error> {
    let interpreter = engine.interpreter().await?;
    let key = persist::memo_key_of(&MemoParts {
        request: &request,
        deps: engine.inner.deps.memo_part(&request),
        interpreter,
        tools_fingerprint: engine.tools().fingerprint(),
        limits: &engine.inner.limits,
        passthrough: &engine.inner.env_passthrough,
        code_version: crate::child::code_version(),
    });
    let memo = keep
        .store
        .memoized(&key, keep.memo_ttl, || async {
            let (envelope, memoizable) = crate::run::execute::execute_attempt(
                engine, &request, events, cancel, started, None,
            )
            .await?;
            // The memo entry is persisted: it carries no secret the code printed or returned.
            let envelope = persist::redact_envelope(
                envelope,
                &persist::redactor(
                    &engine.inner.env_passthrough,
                    &request.env,
                    &engine.inner.sandbox,
                ),
            );
            let json =
                serde_json::to_string(&envelope).map_err(|e| Error::Internal(e.to_string()))?;
            Ok::<_, Error>(if memoizable {
                Computed::keep(json)
            } else {
                Computed::once(json)
            })
        })
        .await
        // The error of the one computation, shared with every caller that waited for it.
        .map_err(|shared| Arc::try_unwrap(shared).unwrap_or_else(Error::Coalesced))?;
    let mut envelope: Envelope = serde_json::from_str(&memo.json)
        .map_err(|e| Error::Internal(format!("a memo entry is not an envelope: {e}")))?;
    if memo.cached {
        envelope.cached = true;
        envelope.duration_ms = elapsed_ms(started);
    }
    if let Some(error) = memo.not_kept {
        not_kept(&mut envelope, &error);
    }
    Ok(envelope)
}

/// One attempt at a run: a fresh one, or a resumed one replaying its journal under its old id.
/// Also says whether the envelope may be memoized.
pub(crate) async fn execute_attempt(
    engine: &RunPython,
    request: &RunRequest,
    events: Option<mpsc::Sender<Event>>,
    cancel: Option<oneshot::Receiver<()>>,
    started: Instant,
    resume: Option<(String, ReplayPlan)>,
) -> Result<(Envelope, bool), Error> {
    let resumed = resume.is_some();
    let (run_id, replay) = match resume {
        Some((run_id, plan)) => (run_id, Some(plan)),
        None => (new_run_id(), None),
    };
    let limits = &engine.inner.limits;
    let timeout = limits.timeout;
    let interpreter = engine.interpreter().await?.clone();
    // The script is known now: a kept run stores it while the code runs, off the critical path.
    let script_blob = engine.inner.keep.as_ref().map(|keep| {
        let (store, code) = (keep.store.clone(), request.code.clone());
        tokio::spawn(async move { store.put_blob(code.into_bytes()).await })
    });
    let (env, warm) = match engine
        .inner
        .deps
        .prepare_run(request, &interpreter, events.as_ref())
        .await
    {
        Ok(Some(run_env)) => (Some(run_env.env), run_env.warm),
        Ok(None) => (None, None),
        Err(e) => {
            let mut envelope = Envelope::failed(
                Status::Error,
                ErrorInfo::new("DependencyError", e.to_string()),
                run_id,
            );
            envelope.dependencies = crate::run::deps::refused(&e);
            envelope.duration_ms = elapsed_ms(started);
            return Ok((envelope, false));
        }
    };
    let dependencies = env.as_ref().and_then(crate::run::deps::report);
    let prepared = Prepared {
        interpreter,
        env,
        warm,
    };
    let slot = crate::run::attempt::slot_for(engine, &prepared).await?;
    let site_dir = prepared.env.as_ref().and_then(|env| env.site_dir.clone());
    let attempt = crate::run::attempt::drive(
        engine, slot, request, &run_id, replay, site_dir, timeout, events, cancel,
    )
    .await?;
    let Attempt {
        ending,
        answer,
        stdout: stdout_captured,
        stderr: stderr_captured,
        isolation,
        files,
        bridge_stats,
        journal,
        oom_killed,
        uploads,
        network,
    } = attempt;
    let (mut stdout_captured, mut stderr_captured) = (stdout_captured, stderr_captured);
    // A store that failed while taking the output is named in the envelope below, and nothing
    // more is written to it.
    let (streamed, upload_failed) =
        match OutputUpload::finish(uploads, &mut stdout_captured, &mut stderr_captured).await {
            Ok(streamed) => (streamed, None),
            Err(e) => (Vec::new(), Some(e)),
        };
    let files = files.map(|(files, mut stored)| {
        stored.extend(streamed);
        (files, stored)
    });

    let mut envelope = crate::run::execute::envelope_of(
        engine,
        run_id,
        Outcome {
            ending,
            answer: &answer,
            stdout: &stdout_captured,
            stderr: &stderr_captured,
            isolation,
            oom_killed,
            bridge_stats: bridge_stats.as_deref(),
        },
        timeout,
        started,
    )?;
    envelope.dependencies = dependencies;
    let files = match (network, &engine.inner.keep, files) {
        (Some((report, log)), Some(keep), Some((collected, mut stored))) => {
            envelope.network = Some(report);
            // The whole log beside the run's other artifacts (its envelope names a few refusals).
            match keep
                .store
                .put_artifact_stream(NETWORK_LOG, std::io::Cursor::new(log))
                .await
            {
                Ok(artifact) => stored.push(artifact),
                Err(e) => not_kept(&mut envelope, &crate::error_report(&e)),
            }
            Some((collected, stored))
        }
        (network, _, files) => {
            envelope.network = network.map(|(report, _)| report);
            files
        }
    };
    if let Some(keep) = &engine.inner.keep {
        // The code ran: a store that fails from here on is named in the envelope, never an
        // `Err` that would throw away what the code did.
        let kept = match upload_failed {
            Some(e) => Err(e),
            None => {
                crate::run::execute::keep_attempt(
                    engine,
                    keep,
                    request,
                    &mut envelope,
                    journal,
                    resumed,
                    script_blob,
                    files,
                    &prepared,
                )
                .await
            }
        };
        if let Err(e) = kept {
            not_kept(&mut envelope, &crate::error_report(&e));
        }
    }
    let memoizable = envelope.status == Status::Success
        && envelope.kept
        && !resumed
        && bridge_stats.as_ref().is_none_or(|s| s.impure_calls() == 0);
    if envelope.return_preview.is_some() {
        // The full value went to the store (when there is one); the envelope carries the preview.
        envelope.return_value = Value::Null;
        envelope.return_typed = None;
    }
    crate::run::budget::fit(
        &mut envelope,
        limits.envelope_budget,
        &stdout_captured,
        &stderr_captured,
        limits.max_output_chars,
    );
    Ok((envelope, memoizable))
}

/// Keeps what an attempt leaves: its checkpoint (suspended, durable or resumed runs), the script
/// (already on its way) and the run's record. Stops at the first write that fails, without trying
/// it again: against a store that does not answer, each try would cost a request timeout.
#[allow(clippy::too_many_arguments)]
async fn keep_attempt(
    engine: &RunPython,
    keep: &Keeping,
    request: &RunRequest,
    envelope: &mut Envelope,
    journal: Option<runpython_bridge::Journal>,
    resumed: bool,
    script_blob: Option<tokio::task::JoinHandle<Result<String, runpython_store::Error>>>,
    files: Option<(
        runpython_sandbox::fd::CollectedFiles,
        Vec<runpython_store::Artifact>,
    )>,
    prepared: &Prepared,
) -> Result<(), Error> {
    let secrets = crate::durable::at_rest::secret_names(&engine.inner.sandbox);
    crate::durable::resume::after_attempt(
        &keep.store,
        &envelope.run_id.clone(),
        (request, &secrets),
        envelope,
        journal,
        engine.inner.durable || resumed,
    )
    .await?;
    if let Some(blob) = script_blob {
        blob.await
            .map_err(|e| Error::Internal(format!("keeping the script panicked: {e}")))??;
    }
    if let Some(files) = files {
        persist::keep_run(
            keep,
            request,
            envelope,
            files,
            &prepared.interpreter,
            prepared.env.as_ref(),
            (&engine.inner.env_passthrough, &engine.inner.sandbox),
        )
        .await?;
    }
    Ok(())
}

/// The name of the artifact holding a run's whole network log.
pub(crate) const NETWORK_LOG: &str = "network-log.jsonl";

/// Marks `envelope` as not kept, with the store's `error` (its head: the envelope stays small).
pub(crate) fn not_kept(envelope: &mut Envelope, error: &str) {
    const MAX_CHARS: usize = 1000;
    envelope.kept = false;
    envelope.store_error = Some(match error.char_indices().nth(MAX_CHARS) {
        Some((cut, _)) => format!("{}…", &error[..cut]),
        None => error.to_owned(),
    });
}
