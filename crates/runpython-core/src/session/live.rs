//! A live session interpreter and one cell's life in it: fresh stdout, stderr and result pipes and a
//! fresh bridge connection per cell, handed to the interpreter over its control socket; the race of
//! answer / interpreter exit / timeout / cancellation / bridge stop; a timed-out cell interrupted first
//! (`KeyboardInterrupt`), the interpreter killed when it does not stop within the grace.

use std::collections::HashMap;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use runpython_bridge::{
    Bridge, BridgeConfig, BridgeStats, Journal, ReplayPlan, SpillStore, ToolSet,
};
use runpython_sandbox::{fd::CollectedFiles, BeneathDir, CollectLimits};
use tokio::io::AsyncWriteExt;
use tokio::sync::{mpsc, oneshot};

use crate::child::protocol::{ControlMessage, RunnerRequest};
use crate::child::{
    capture, take_capture, Captured, Closed, FullStream, HeadTail, Slot, SpawnedParts,
};
use crate::error::Error;
use crate::protocol::envelope::Isolation;
use crate::protocol::outcome::{Answer, Ending};
use crate::protocol::request::Event;

/// How long an interrupted cell has to stop before the interpreter is killed.
pub(crate) const INTERRUPT_GRACE: Duration = Duration::from_secs(2);

/// How long the host waits for a cell's output streams to end once it answered (a process the code
/// started in the background may hold them; what it writes later belongs to no cell).
const OUTPUT_GRACE: Duration = Duration::from_millis(200);

/// Slack on top of `max_return_bytes` for the result record's own fields.
const RESULT_OVERHEAD: usize = 64 * 1024;

/// The descriptor the interpreter gets a cell's bridge connection as.
const BRIDGE_FD: i32 = 4;

/// A session's interpreter, waiting for cells on its control socket.
#[derive(Debug)]
pub(crate) struct Live {
    parts: SpawnedParts,
    control: tokio::net::UnixStream,
    pub scratch: Arc<BeneathDir>,
    pub saved_dir: PathBuf,
    pub isolation: Isolation,
    /// The working directory's files at the end of the last cell (name -> size, modification time):
    /// a cell's envelope lists only what it changed.
    pub seen: HashMap<String, (u64, SystemTime)>,
}

/// What one cell did, before it becomes an envelope.
#[derive(Debug)]
pub(crate) struct CellRaw {
    pub ending: Ending,
    pub answer: Answer,
    pub stdout: Captured,
    pub stderr: Captured,
    pub bridge_stats: Option<Arc<BridgeStats>>,
    pub journal: Option<Journal>,
    /// The interpreter is gone (killed, evicted, or it exited): the session's state is lost.
    pub lost: Option<String>,
    pub oom_killed: bool,
    /// Whether each whole stream (stdout, stderr) kept in the store was cut at its cap.
    pub cut: [bool; 2],
}

/// What a cell needs besides its request.
pub(crate) struct CellSpec<'a> {
    /// The cell's request; its bridge is filled in here.
    pub request: RunnerRequest<'a>,
    pub tools: ToolSet,
    pub bridge: &'a BridgeConfig,
    pub replay: Option<ReplayPlan>,
    /// Where the cell's large journaled values go (a kept session's record).
    pub spill: Option<Arc<dyn SpillStore>>,
    /// The budget of the cell's tree of runs (its nested runs share its calls).
    pub call_budget: Option<Arc<runpython_bridge::CallBudget>>,
    pub max_output_chars: usize,
    pub max_return_bytes: usize,
    pub timeout: Duration,
    pub events: Option<mpsc::Sender<Event>>,
    pub cancel: Option<oneshot::Receiver<()>>,
    /// Where stdout and stderr go whole, when cells are kept.
    pub full: [Option<FullStream>; 2],
    /// The cell's run id: its tool calls' idempotency keys are `<run id>.<ordinal>`.
    pub run_id: String,
}

impl Live {
    /// Starts a session's interpreter: every isolation layer and limit of a run; it reads every
    /// prepared environment (so a cell may add dependencies while the session lives).
    pub(crate) async fn start(engine: &crate::RunPython) -> Result<Self, Error> {
        let interpreter = engine.interpreter().await?.clone();
        let code_dir = crate::child::code_dir()?;
        crate::child::bytecode_in_place(&interpreter.executable, interpreter.version, code_dir)
            .await;
        let envs = engine.inner.deps.root().to_owned();
        let _ = std::fs::create_dir_all(&envs);
        let spec = crate::child::SlotSpec {
            sandbox: engine.inner.sandbox.clone(),
            timeout: engine.inner.limits.timeout,
            env_passthrough: engine.inner.env_passthrough.clone(),
        };
        // Started from this task's thread, not a blocking-pool thread: the interpreter's parent-death
        // signal follows the thread that forked it, and the blocking pool ends idle threads (a session
        // left idle ten seconds was killed with its thread).
        let slot = spec.spawn_session(&interpreter.executable, code_dir, &[envs.as_path()])?;
        Self::new(slot)
    }

    /// Takes over an interpreter started in session mode.
    pub(crate) fn new(slot: Slot) -> Result<Self, Error> {
        let Slot {
            run_dir,
            spawned,
            scratch,
            saved_dir,
            isolation,
            control,
            ..
        } = slot;
        let control = control.ok_or_else(|| {
            Error::Internal("a session's interpreter was started without its control socket".into())
        })?;
        Ok(Self {
            parts: SpawnedParts::new(spawned, run_dir),
            control,
            scratch,
            saved_dir,
            isolation,
            seen: HashMap::new(),
        })
    }

    /// With a network policy: the host's side of the interpreter's network.
    pub(crate) fn egress(&self) -> Option<&runpython_egress::Egress> {
        self.parts.egress.as_ref()
    }

    /// Kills the interpreter and everything it started.
    pub(crate) fn kill(&mut self) {
        self.parts.kill();
    }

    /// Sends one control message: a length-prefixed JSON payload, with `fds` on its first bytes.
    async fn send(&mut self, payload: &[u8], fds: &[std::os::fd::RawFd]) -> Result<(), Error> {
        let header = u32::try_from(payload.len())
            .map_err(|_| Error::InvalidInput("the cell request is over 4 GiB".into()))?
            .to_be_bytes();
        let io = |e: std::io::Error| Error::io_pathless("writing to the session's interpreter", e);
        if fds.is_empty() {
            self.control.write_all(&header).await.map_err(io)?;
            return self.control.write_all(payload).await.map_err(io);
        }
        loop {
            self.control.writable().await.map_err(io)?;
            match self.control.try_io(tokio::io::Interest::WRITABLE, || {
                runpython_sandbox::fd::send_with_fds(self.control.as_raw_fd(), &header, fds)
            }) {
                Ok(()) => break,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                Err(e) => return Err(io(e)),
            }
        }
        self.control.write_all(payload).await.map_err(io)
    }

    /// Interrupts what the interpreter is doing (a cell, a snapshot): a `KeyboardInterrupt` there.
    pub(crate) async fn interrupt(&mut self) {
        if let Ok(interrupt) = serde_json::to_vec(&ControlMessage::Interrupt) {
            let _ = self.send(&interrupt, &[]).await;
        }
    }

    /// Sends `message` (a snapshot to take or load) with two fresh pipes: the interpreter gets the
    /// data pipe's end `data_write` says (the write end: it writes the snapshot; else the read end)
    /// and the answer pipe's write end. Returns the host's ends: the data pipe's other end and the
    /// answer's read end.
    pub(crate) async fn send_snapshot_message(
        &mut self,
        message: &ControlMessage<'_>,
        data_write: bool,
    ) -> Result<(OwnedFd, tokio::net::unix::pipe::Receiver), Error> {
        let pipe = || {
            nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
                .map_err(|e| Error::io_pathless("creating a snapshot's pipes", e.into()))
        };
        let (data_r, data_w) = pipe()?;
        let (res_r, res_w) = pipe()?;
        let (host, child) = if data_write {
            (data_r, data_w)
        } else {
            (data_w, data_r)
        };
        let payload = serde_json::to_vec(message).map_err(|e| Error::Internal(e.to_string()))?;
        self.send(&payload, &[child.as_raw_fd(), res_w.as_raw_fd()])
            .await?;
        drop((child, res_w));
        let answer = tokio::net::unix::pipe::Receiver::from_owned_fd(res_r)
            .map_err(|e| Error::io_pathless("reading a snapshot's answer", e))?;
        Ok((host, answer))
    }

    /// Runs one cell to its answer (or its end).
    pub(crate) async fn run_cell(&mut self, spec: CellSpec<'_>) -> Result<CellRaw, Error> {
        let pipe = || {
            nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
                .map_err(|e| Error::io_pathless("creating a cell's pipes", e.into()))
        };
        let (out_r, out_w) = pipe()?;
        let (err_r, err_w) = pipe()?;
        let (res_r, res_w) = pipe()?;
        let (bridge, bridge_child) = if spec.tools.is_empty() {
            (None, None)
        } else {
            let (host, child) = runpython_bridge::socket_pair()?;
            let mut bridge = Bridge::new(host, spec.tools, spec.bridge.clone())?
                .with_run_id(spec.run_id.clone());
            if let Some(plan) = spec.replay {
                bridge = bridge.with_replay(plan);
            }
            if let Some(spill) = spec.spill {
                bridge = bridge.with_spill(spill);
            }
            if let Some(budget) = spec.call_budget {
                bridge = bridge.with_budget(budget);
            }
            (Some(bridge), Some(child))
        };
        // The request names the bridge the cell gets (as descriptor 4).
        let mut request = spec.request;
        let (bridge_future, bridge_stats, journal) = match bridge {
            Some(bridge) => {
                request.bridge = Some(bridge.client_spec_fd(BRIDGE_FD));
                let stats = bridge.stats();
                let journal = bridge.journal();
                (Some(bridge.serve()), Some(stats), Some(journal))
            }
            None => (None, None, None),
        };
        let payload = serde_json::to_vec(&ControlMessage::Cell(request))
            .map_err(|e| Error::Internal(e.to_string()))?;
        let mut fds = vec![out_w.as_raw_fd(), err_w.as_raw_fd(), res_w.as_raw_fd()];
        if let Some(child) = &bridge_child {
            fds.push(child.as_raw_fd());
        }
        self.send(&payload, &fds).await?;
        // The interpreter holds the only write ends now: each reaches end of file when it lets go.
        drop((out_w, err_w, res_w, bridge_child));

        let receiver = |fd: OwnedFd| {
            tokio::net::unix::pipe::Receiver::from_owned_fd(fd)
                .map_err(|e| Error::io_pathless("reading a cell's pipes", e))
        };
        let (out_r, err_r, mut res_r) = (receiver(out_r)?, receiver(err_r)?, receiver(res_r)?);
        let [stdout_full, stderr_full] = spec.full;
        let stdout_capture = Arc::new(Mutex::new(HeadTail::new(spec.max_output_chars)));
        let stderr_capture = Arc::new(Mutex::new(HeadTail::new(spec.max_output_chars)));
        let closed = Arc::new(Closed::default());
        let stdout_reader = {
            let (sink, events, closed) = (
                Arc::clone(&stdout_capture),
                spec.events.clone(),
                Arc::clone(&closed),
            );
            tokio::spawn(async move {
                let cut = capture(out_r, sink, events, Event::Stdout, stdout_full).await;
                closed.mark();
                cut
            })
        };
        let stderr_reader = {
            let (sink, events, closed) = (
                Arc::clone(&stderr_capture),
                spec.events.clone(),
                Arc::clone(&closed),
            );
            tokio::spawn(async move {
                let cut = capture(err_r, sink, events, Event::Stderr, stderr_full).await;
                closed.mark();
                cut
            })
        };
        let result_cap = spec.max_return_bytes + RESULT_OVERHEAD;
        let (answer_tx, mut answer_rx) = tokio::sync::watch::channel(false);
        let result_reader = tokio::spawn(async move {
            use tokio::io::AsyncReadExt;
            let mut answer = Answer::default();
            let mut chunk = vec![0u8; 64 * 1024];
            loop {
                match res_r.read(&mut chunk).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) if answer.bytes.len() + n <= result_cap => {
                        answer.bytes.extend_from_slice(&chunk[..n])
                    }
                    Ok(_) => answer.overflow = true,
                }
            }
            let _ = answer_tx.send(true);
            answer
        });
        let cancelled = async {
            if let Some(rx) = spec.cancel {
                if rx.await.is_ok() {
                    return;
                }
            }
            std::future::pending::<()>().await
        };
        let bridge_stopped = async {
            match bridge_future {
                Some(serve) => serve.await,
                None => std::future::pending().await,
            }
        };
        tokio::pin!(bridge_stopped);
        let answered = answer_rx.wait_for(|done| *done);
        let mut lost = None;
        let ending = tokio::select! {
            _ = answered => Ending::Answered,
            status = self.parts.wait() => {
                lost = Some("the session's interpreter exited".to_owned());
                match status {
                    Ok(status) => Ending::Exited(status),
                    Err(e) => return Err(e),
                }
            }
            _ = tokio::time::sleep(spec.timeout) => Ending::TimedOut,
            _ = cancelled => Ending::Cancelled,
            stop = &mut bridge_stopped => Ending::Bridge(stop),
        };
        match &ending {
            Ending::TimedOut => {
                // Interrupt first: the cell gets a KeyboardInterrupt and the session keeps its state.
                self.interrupt().await;
                let mut answer_rx2 = answer_rx.clone();
                let stopped =
                    tokio::time::timeout(INTERRUPT_GRACE, answer_rx2.wait_for(|done| *done)).await;
                if stopped.is_err() {
                    self.kill();
                    lost = Some(format!(
                        "the cell ran past its {} timeout and did not stop within {} of an interrupt, \
                         so the session's interpreter was killed",
                        crate::protocol::outcome::human_duration(spec.timeout),
                        crate::protocol::outcome::human_duration(INTERRUPT_GRACE)
                    ));
                }
            }
            Ending::Answered => {}
            Ending::Exited(_) => {}
            Ending::Cancelled => {
                self.kill();
                lost = Some("the cell was cancelled and the session's interpreter killed".into());
            }
            Ending::Bridge(_) => {
                // A suspension or a broken protocol: the cell cannot go on in this interpreter.
                self.kill();
                lost = Some(
                    "the cell stopped at its tool bridge and the session's interpreter was killed"
                        .into(),
                );
            }
        }
        let grace = if lost.is_some() {
            Duration::from_secs(2)
        } else {
            OUTPUT_GRACE
        };
        let mut cut = [false; 2];
        for (index, reader) in [stdout_reader, stderr_reader].into_iter().enumerate() {
            let abort = reader.abort_handle();
            match tokio::time::timeout(grace, reader).await {
                Ok(Ok(was_cut)) => cut[index] = was_cut,
                _ => abort.abort(),
            }
        }
        let answer = match tokio::time::timeout(grace, result_reader).await {
            Ok(Ok(answer)) => answer,
            _ => Answer::default(),
        };
        let oom_killed = self.parts.oom_killed();
        Ok(CellRaw {
            ending,
            answer,
            stdout: take_capture(&stdout_capture),
            stderr: take_capture(&stderr_capture),
            bridge_stats,
            journal: journal.and_then(|j| j.lock().ok().map(|j| j.clone())),
            lost,
            oom_killed,
            cut,
        })
    }

    /// The files of the working directory that are new or changed since the last cell.
    pub(crate) async fn changed_files(
        &mut self,
        limits: CollectLimits,
    ) -> Result<CollectedFiles, Error> {
        let mut files =
            crate::durable::persist::collect_run_files(Arc::clone(&self.scratch), limits).await?;
        let mut seen = HashMap::new();
        let scratch = Arc::clone(&self.scratch);
        let stamps: Vec<(String, Option<(u64, SystemTime)>)> = tokio::task::spawn_blocking({
            let names: Vec<String> = files.files.iter().map(|f| f.name.clone()).collect();
            move || {
                names
                    .into_iter()
                    .map(|name| {
                        let stamp = stamp_beneath(&scratch, &name);
                        (name, stamp)
                    })
                    .collect()
            }
        })
        .await
        .map_err(|e| Error::Internal(e.to_string()))?;
        for (name, stamp) in stamps {
            if let Some(stamp) = stamp {
                seen.insert(name, stamp);
            }
        }
        // Unchanged since the last cell: listed then, kept then.
        files
            .files
            .retain(|f| self.seen.get(&f.name) != seen.get(&f.name));
        self.seen = seen;
        Ok(files)
    }
}

/// The size and modification time of `work/<name>` beneath the scratch.
fn stamp_beneath(scratch: &BeneathDir, name: &str) -> Option<(u64, SystemTime)> {
    let mut dir = scratch.dir("work").ok()?;
    let mut parts: Vec<&str> = name.split('/').collect();
    let file = parts.pop()?;
    for part in parts {
        dir = dir.dir(part).ok()?;
    }
    let meta = dir.file(file).ok()?.metadata().ok()?;
    Some((meta.len(), meta.modified().ok()?))
}
