//! One attempt's child: from an interpreter slot (pooled or cold) to the raw outcome — how it ended,
//! what the runner answered, its captured output, the files it left and its bridge's journal.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use runpython_bridge::{Bridge, BridgeStats, Journal, ReplayPlan};
use runpython_deps::{Interpreter, PreparedEnv};
use runpython_sandbox::fd::CollectedFiles;
use runpython_store::{Artifact, ArtifactKind, Redactor};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot};

use crate::child::protocol::RunnerRequest;
use crate::child::{
    capture, code_dir, discard_run_dir, take_capture, Captured, Closed, FullStream, HeadTail,
    PoolKey, Slot, BRIDGE_FD,
};
use crate::error::Error;
use crate::protocol::envelope::Isolation;
use crate::protocol::outcome::{Answer, Ending};
use crate::protocol::request::{Event, RunRequest};
use crate::run::tools::RunTools;
use crate::RunPython;

/// How long the host keeps reading a child's pipes after the process group was killed. Only a process
/// that escaped the group (a `setsid` daemon) can hold them open that long.
const DRAIN_GRACE: Duration = Duration::from_secs(2);

/// Slack on top of `max_return_bytes` for the result record's own fields.
const RESULT_OVERHEAD: usize = 64 * 1024;

/// The interpreter and environment a run needs.
pub(crate) struct Prepared {
    pub interpreter: Interpreter,
    pub env: Option<PreparedEnv>,
    /// A declared warm environment's: its runs are forked from its template.
    pub warm: Option<crate::child::Warmth>,
}

impl Prepared {
    fn python(&self) -> PathBuf {
        self.env.as_ref().map_or_else(
            || self.interpreter.executable.clone(),
            |env| env.interpreter.clone(),
        )
    }

    fn site_dir(&self) -> Option<PathBuf> {
        self.env.as_ref().and_then(|env| env.site_dir.clone())
    }
}

/// What one attempt's child did.
pub(crate) struct Attempt {
    pub ending: Ending,
    pub answer: Answer,
    pub stdout: Captured,
    pub stderr: Captured,
    pub isolation: Isolation,
    /// The files the run left and what it saved with `save_artifact` (already in the store), when
    /// runs are kept (and the run got far enough to leave any).
    pub files: Option<(CollectedFiles, Vec<Artifact>)>,
    pub bridge_stats: Option<Arc<BridgeStats>>,
    pub journal: Option<Journal>,
    /// The kernel killed a process of the run for going over the run's memory limit (its cgroup).
    pub oom_killed: bool,
    /// When runs are kept: stdout and stderr whole, on their way to the store.
    pub uploads: Vec<OutputUpload>,
    /// With a network policy, when the run used the network: what it did, and its whole log
    /// (JSON lines).
    pub network: Option<(runpython_egress::NetworkReport, Vec<u8>)>,
}

/// One whole output stream on its way to the store (see [`FullStream`]).
pub(crate) struct OutputUpload {
    pub kind: ArtifactKind,
    pub task: tokio::task::JoinHandle<Result<Artifact, runpython_store::Error>>,
    /// The stream was cut at the cap.
    pub cut: bool,
}

impl OutputUpload {
    /// Waits for the uploads: the artifacts (one per stream), each also named in its capture (so a
    /// truncated stream's entry in the envelope says where the whole text is).
    pub(crate) async fn finish(
        uploads: Vec<Self>,
        stdout: &mut Captured,
        stderr: &mut Captured,
    ) -> Result<Vec<Artifact>, Error> {
        let mut artifacts = Vec::with_capacity(uploads.len());
        for upload in uploads {
            let artifact = upload.task.await.map_err(|e| {
                Error::Internal(format!("storing the run's output panicked: {e}"))
            })??;
            let captured = if upload.kind == ArtifactKind::Stdout {
                &mut *stdout
            } else {
                &mut *stderr
            };
            if artifact.bytes > 0 {
                captured.set_stored(artifact.id.clone(), upload.cut);
                artifacts.push(artifact);
            }
        }
        Ok(artifacts)
    }

    /// Sets the cut flags the captures returned (stdout's, then stderr's).
    pub(crate) fn set_cut(uploads: &mut [Self], cut: [bool; 2]) {
        for (upload, cut) in uploads.iter_mut().zip(cut) {
            upload.cut = cut;
        }
    }

    /// Starts streaming into the store an artifact `name` of `kind`; the capture writes the stream.
    fn start(
        store: &runpython_store::Store,
        kind: ArtifactKind,
        name: &'static str,
        redactor: &Arc<Redactor>,
    ) -> (Self, FullStream) {
        let (writer, reader) = tokio::io::duplex(64 * 1024);
        let store = store.clone();
        let task = tokio::spawn(async move {
            let mut artifact = store.put_artifact_stream(name, reader).await?;
            artifact.kind = kind;
            Ok(artifact)
        });
        let upload = Self {
            kind,
            task,
            cut: false,
        };
        (upload, FullStream::new(writer, Arc::clone(redactor)))
    }
}

/// When runs are kept: stdout and stderr on their way to the store whole (redacted), and the
/// streams the captures write them to.
pub(crate) fn output_uploads(
    engine: &RunPython,
    request: &RunRequest,
) -> (Vec<OutputUpload>, [Option<FullStream>; 2]) {
    let Some(keep) = &engine.inner.keep else {
        return (Vec::new(), [None, None]);
    };
    let redactor = Arc::new(crate::durable::persist::redactor(
        &engine.inner.env_passthrough,
        &request.env,
        &engine.inner.sandbox,
    ));
    let (out, out_stream) =
        OutputUpload::start(&keep.store, ArtifactKind::Stdout, "stdout.txt", &redactor);
    let (err, err_stream) =
        OutputUpload::start(&keep.store, ArtifactKind::Stderr, "stderr.txt", &redactor);
    (vec![out, err], [Some(out_stream), Some(err_stream)])
}

/// An interpreter for the run: forked from this environment's template (with templates on), one
/// started ahead of time for this environment, or a fresh one (the cold path). A pooled or cold
/// start has its replacement started in the background.
pub(crate) async fn slot_for(engine: &RunPython, prepared: &Prepared) -> Result<Slot, Error> {
    let python = prepared.python();
    let site_dir = prepared.site_dir();
    let code_dir = code_dir()?;
    crate::child::bytecode_in_place(&python, prepared.interpreter.version, code_dir).await;
    let key: PoolKey = (python.clone(), site_dir.clone());
    if let Some(templates) = &engine.inner.templates {
        let warm = prepared.warm.as_ref();
        if let Some(slot) = templates
            .fork(&key, warm, engine.inner.limits.timeout)
            .await?
        {
            return Ok(slot);
        }
    }
    let pooled = match &engine.inner.pool {
        Some(pool) => pool.take_or_wait(&key).await,
        None => None,
    };
    let slot = match pooled {
        Some(slot) => slot,
        None => crate::child::SlotSpec {
            sandbox: engine.inner.sandbox.clone(),
            timeout: engine.inner.limits.timeout,
            env_passthrough: engine.inner.env_passthrough.clone(),
        }
        .spawn(
            &python,
            code_dir,
            &site_dir.as_deref().into_iter().collect::<Vec<_>>(),
            &[],
        )?,
    };
    if let Some(pool) = &engine.inner.pool {
        pool.refill(key);
    }
    Ok(slot)
}

/// Serves one child from its slot to its end: the bridge, the request on stdin, output capture,
/// the race of exit / answer / timeout / cancellation / bridge stop, the kill, the files it left.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn drive(
    engine: &RunPython,
    slot: Slot,
    request: &RunRequest,
    run_id: &str,
    replay: Option<ReplayPlan>,
    site_dir: Option<PathBuf>,
    timeout: Duration,
    events: Option<mpsc::Sender<Event>>,
    cancel: Option<oneshot::Receiver<()>>,
) -> Result<Attempt, Error> {
    let limits = &engine.inner.limits;
    let code_dir = code_dir()?;
    let Slot {
        run_dir,
        spawned,
        scratch,
        saved_dir,
        bridge: bridge_end,
        isolation,
        ..
    } = slot;

    let RunTools {
        tools,
        call_budget,
        saved: saved_artifacts,
    } = crate::run::tools::run_tools(engine, Instant::now(), &scratch)?;
    if let Some(egress) = &spawned.egress {
        egress.narrow(request.allow_hosts.clone());
    }
    let tools = match &events {
        Some(events) => crate::run::tools::announced(&tools, events)?,
        None => tools,
    };
    let input_artifacts =
        crate::durable::persist::fetch_input_artifacts(engine.store(), request).await?;
    let files = crate::durable::persist::fetch_files(engine.store(), request).await?;
    // A resumed run journals like the run it continues, so a host that stops during it leaves
    // it resumable again.
    let durable = match &engine.inner.keep {
        Some(keep) if engine.inner.durable || replay.is_some() => {
            let secrets = crate::durable::at_rest::secret_names(&engine.inner.sandbox);
            let sink = crate::durable::resume::durable_sink(
                &keep.store,
                run_id,
                (request, &secrets),
                replay.is_some(),
            )
            .await?;
            if let Some(events) = &events {
                let _ = events.try_send(Event::Resumable {
                    run_id: run_id.to_owned(),
                });
            }
            Some(sink)
        }
        _ => None,
    };
    let (bridge_spec, bridge_future, bridge_stats, journal) = if tools.is_empty() {
        (None, None, None, None)
    } else {
        let mut bridge =
            Bridge::new(bridge_end, tools, engine.inner.bridge.clone())?.with_run_id(run_id);
        if let Some(plan) = replay {
            bridge = bridge.with_replay(plan);
        }
        if let Some((sink, spill)) = durable {
            bridge = bridge.with_sink(sink).with_spill(spill);
        }
        if let Some(budget) = call_budget {
            bridge = bridge.with_budget(budget);
        }
        let stats = bridge.stats();
        let journal = bridge.journal();
        (
            Some(bridge.client_spec_fd(BRIDGE_FD)),
            Some(bridge.serve()),
            Some(stats),
            Some(journal),
        )
    };

    // The secrets' placeholders and the trust bundle naming the run's CA: the runner's only
    // (never in the request, so neither memo keys nor journals hold a placeholder).
    let (runner_env, trust_bundle) =
        runpython_egress::runner_env(&request.env, spawned.egress.as_ref());
    let runner_request = crate::child::protocol::to_line(&RunnerRequest {
        code_dir,
        code: &request.code,
        inputs: &request.inputs,
        typed: request.typed,
        env: runner_env,
        trust_bundle,
        input_artifacts,
        files,
        artifact_helpers: engine.inner.keep.is_some(),
        network_reasons: spawned.egress.is_some(),
        max_return_bytes: limits.max_return_bytes,
        inline_return_bytes: limits.inline_return_bytes,
        image_budget: limits.max_image_bytes,
        site_dirs: site_dir.as_deref().into_iter().collect(),
        saved_dir: &saved_dir,
        repr: request.repr,
        bridge: bridge_spec,
    })?;

    let crate::child::Spawned {
        mut process,
        mut stdin,
        stdout,
        stderr,
        result: mut result_pipe,
        cgroup,
        egress,
        ..
    } = spawned;

    let writer = tokio::spawn(async move {
        if let Some(stdin) = stdin.as_mut() {
            // A child that dies early closes the pipe; its exit is reported, not this write.
            let _ = stdin.write_all(&runner_request).await;
        }
    });
    let stdout_capture = Arc::new(Mutex::new(HeadTail::new(limits.max_output_chars)));
    let stderr_capture = Arc::new(Mutex::new(HeadTail::new(limits.max_output_chars)));
    // The runner closes stdout, stderr and the result pipe once it has answered: when all three
    // are at end of file the envelope is complete, before the interpreter has finished exiting.
    let closed = Arc::new(Closed::default());
    // Kept runs keep each stream whole (up to the cap), streamed to the store as it is read.
    let (mut uploads, [stdout_full, stderr_full]) =
        crate::run::attempt::output_uploads(engine, request);
    let stdout_reader = stdout.map(|pipe| {
        let (sink, events, closed) = (
            Arc::clone(&stdout_capture),
            events.clone(),
            Arc::clone(&closed),
        );
        tokio::spawn(async move {
            let cut = capture(pipe, sink, events, Event::Stdout, stdout_full).await;
            closed.mark();
            cut
        })
    });
    let stderr_reader = stderr.map(|pipe| {
        let (sink, events, closed) = (
            Arc::clone(&stderr_capture),
            events.clone(),
            Arc::clone(&closed),
        );
        tokio::spawn(async move {
            let cut = capture(pipe, sink, events, Event::Stderr, stderr_full).await;
            closed.mark();
            cut
        })
    });
    let result_cap = limits.max_return_bytes + RESULT_OVERHEAD;
    let result_closed = Arc::clone(&closed);
    let result_reader = tokio::spawn(async move {
        let mut answer = Answer::default();
        let mut chunk = vec![0u8; 64 * 1024];
        loop {
            match result_pipe.read(&mut chunk).await {
                Ok(0) | Err(_) => break,
                Ok(n) if answer.bytes.len() + n <= result_cap => {
                    answer.bytes.extend_from_slice(&chunk[..n])
                }
                Ok(_) => answer.overflow = true, // keep draining so the child never blocks on it
            }
        }
        if !answer.bytes.is_empty() {
            result_closed
                .answered
                .store(true, std::sync::atomic::Ordering::SeqCst);
        }
        result_closed.mark();
        answer
    });
    // The runner answers after doing what the interpreter's exit would (threads joined, exit
    // handlers run, the code's globals and open files released), so the run may end as soon as the
    // answer is complete instead of waiting for the interpreter and its namespaces to go away.
    let answered = closed.wait_for(3);

    let cancelled = async {
        if let Some(rx) = cancel {
            if rx.await.is_ok() {
                return;
            }
        }
        std::future::pending::<()>().await
    };
    let bridge_failed = async {
        match bridge_future {
            Some(serve) => serve.await,
            None => std::future::pending().await,
        }
    };
    let ending = tokio::select! {
        status = process.wait() => match status {
            Ok(status) => Ending::Exited(status),
            Err(source) => return Err(Error::io_pathless("waiting for the child", source)),
        },
        _ = tokio::time::sleep(timeout) => Ending::TimedOut,
        _ = cancelled => Ending::Cancelled,
        _ = answered => Ending::Answered,
        e = bridge_failed => Ending::Bridge(e),
    };
    // Whatever happened, nothing the code started may outlive the run.
    process.kill();
    match ending {
        // Killed above; reaped in the background.
        Ending::Exited(_) | Ending::Answered => {}
        _ => {
            let _ = process.wait().await;
        }
    }
    writer.abort();
    for (index, reader) in [stdout_reader, stderr_reader].into_iter().enumerate() {
        let Some(reader) = reader else { continue };
        let abort = reader.abort_handle();
        match tokio::time::timeout(DRAIN_GRACE, reader).await {
            Ok(Ok(cut)) => {
                if let Some(upload) = uploads.get_mut(index) {
                    upload.cut = cut;
                }
            }
            _ => abort.abort(),
        }
    }
    let answer = match tokio::time::timeout(DRAIN_GRACE, result_reader).await {
        Ok(Ok(answer)) => answer,
        _ => Answer::default(),
    };
    let files = match (&engine.inner.keep, &ending) {
        (
            Some(keep),
            Ending::Exited(_) | Ending::Answered | Ending::TimedOut | Ending::Bridge(_),
        ) => {
            let mut files = crate::durable::persist::collect_run_files(
                Arc::clone(&scratch),
                keep.collect.clone(),
            )
            .await?;
            // What the code saved with save_artifact() is kept beside the files it wrote.
            let saved =
                std::mem::take(&mut *saved_artifacts.lock().unwrap_or_else(|p| p.into_inner()));
            files
                .files
                .retain(|f| !saved.iter().any(|s| s.name == f.name));
            Some((files, saved))
        }
        _ => None,
    };
    // The kernel's counts of the connections handed to the run, before they are reported.
    if let Some(egress) = &egress {
        egress.settle().await;
    }
    let network = egress.and_then(|egress| {
        let report = egress.report_since(runpython_egress::Mark::default());
        report
            .used()
            .then(|| (report, egress.log_since(runpython_egress::Mark::default())))
    });
    let oom_killed = cgroup.as_ref().is_some_and(|cg| cg.oom_killed());
    drop(cgroup); // removed once its processes are gone, off this task
    if let Some(run_dir) = run_dir {
        discard_run_dir(run_dir);
    }

    Ok(Attempt {
        ending,
        answer,
        stdout: take_capture(&stdout_capture),
        stderr: take_capture(&stderr_capture),
        isolation,
        files,
        bridge_stats,
        journal: journal.and_then(|j| j.lock().ok().map(|j| j.clone())),
        oom_killed,
        uploads,
        network,
    })
}
