//! Templates: one warm interpreter per (interpreter, environment) of an engine, that one-shot runs are
//! forked from. A run forked from a template pays for a fork and its own sandbox's setup instead of an
//! interpreter's start and its imports, and even those are paid ahead of it.
//!
//! The template (T) is started like any interpreter, in a base sandbox of its own
//! ([`runpython_sandbox::prepare_template`]), with the runner in template mode (`runpython_template.py`):
//! it imports the environment and the warm modules, stops library threads, says it is ready, and waits
//! for commands on a `SOCK_SEQPACKET` control socket (its stdin). For each run the host prepares the
//! run's share of the sandbox ([`runpython_sandbox::prepare_fork`]: cgroup, Landlock ruleset, seccomp
//! program, uid, limits) and sends it with a fork command; T answers with a pidfd of the run's init
//! (the host kills the run through it) and a socket to the run's interpreter, which takes its sandbox,
//! hands the host its scratch (or names the step that failed), and waits. That happens ahead of the
//! run: the host keeps [`PoolConfig::size`](super::PoolConfig::size) forks ready per template (joining
//! a memory cgroup costs an RCU grace period, ~10 ms of waiting). A run takes a ready fork and sends it
//! its five descriptors; the fork serves that run only. The run's init writes the interpreter's wait
//! status to a status pipe when it ends. From there the run is driven like any other ([`Slot`]).
//!
//! A template is replaced when it dies, when its environment changes on disk (the interpreter or the
//! site directory), after a fork fails, and after the pool's idle time without a run; runs forked from
//! it keep it alive until they end. Where templates cannot be used (the configuration or the kernel
//! rules them out, or the template fails to start) runs take the fresh path, and `isolation.start`
//! says which path a run took; with `RUNPYTHON_TEMPLATES=require` a run whose configuration allows a
//! template and that could not be forked from one is an error instead (CI).

mod fork;

use std::collections::HashMap;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use serde_json::{json, Value};
use tokio::io::unix::AsyncFd;

use super::protocol::TemplateCommand;
use super::spawn::{self, RunProcess, Spawned, SpawnedParts};
use super::{code_dir, env, HeadTail, PoolKey, Slot, SlotSpec};
use crate::error::Error;
use fork::ReadyRun;
use runpython_egress::{Network, Sandbox};
use runpython_sandbox as sandbox;

/// How long a template may take to start (its warm imports included).
const START_TIMEOUT: Duration = Duration::from_secs(120);

/// How long the template may take to answer a command (a fork).
const REPLY_TIMEOUT: Duration = Duration::from_secs(10);

/// After a template failed to start, how long runs take the fresh path before it is tried again.
const RETRY_AFTER: Duration = Duration::from_secs(60);

/// Largest message a template sends (its answers are small).
const MAX_REPLY: usize = 64 * 1024;

/// What a template looks like from outside, for [`crate::RunPython::templates`].
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct TemplateStatus {
    /// The interpreter it runs.
    pub python: PathBuf,
    /// The environment it imported from, if any.
    pub site_dir: Option<PathBuf>,
    /// The host process that holds it (its sandbox's outermost process; killing it kills the
    /// template and every run forked from it).
    pub pid: u32,
    /// Its resident memory, which its runs share until they write to it.
    pub memory_bytes: u64,
    /// Runs forked from it so far.
    pub runs: u64,
}

/// What a template imports before it serves: modules, and packages whose first-use work it does
/// (`runpython_warm.py`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Warmth {
    pub imports: Vec<String>,
    pub prime: Vec<String>,
}

/// The templates of one engine, by (interpreter, environment).
#[derive(Debug)]
pub(crate) struct Templates {
    spec: SlotSpec,
    /// What templates of environments the operator did not declare warm import (the pool's warm
    /// imports), when those are forked too.
    warm_imports: Vec<String>,
    /// Whether every environment's runs are forked (`PoolConfig::templates`), or only declared warm
    /// ones'.
    all: bool,
    idle: Duration,
    /// Forks kept ready per template.
    ready: usize,
    require: bool,
    cells: Mutex<HashMap<PoolKey, Arc<Cell>>>,
}

/// One key's template: started once (by the first run that needs it), replaced by a new cell.
#[derive(Debug)]
struct Cell {
    made: Instant,
    template: tokio::sync::OnceCell<Result<Arc<Template>, String>>,
}

impl Cell {
    fn new() -> Arc<Self> {
        Arc::new(Self {
            made: Instant::now(),
            template: tokio::sync::OnceCell::new(),
        })
    }
}

impl Templates {
    pub(crate) fn new(
        spec: SlotSpec,
        warm_imports: Vec<String>,
        all: bool,
        idle: Duration,
        ready: usize,
        require: bool,
    ) -> Self {
        Self {
            spec,
            warm_imports,
            all,
            idle,
            ready: ready.max(1),
            require,
            cells: Mutex::default(),
        }
    }

    /// Whether runs of this engine will be forked from templates (for the isolation report).
    pub(crate) fn eligible(&self) -> bool {
        sandbox::template_eligible(&self.spec.sandbox.map_network(Network::mechanism)).is_ok()
    }

    /// A run forked from the template for `key` (started now if there is none yet), with its
    /// sandbox set up; `Ok(None)` when templates cannot serve it (why is logged) or do not serve
    /// this environment (not a declared warm one, `warm` `None`, when only those are forked): the
    /// run takes the pooled or fresh path.
    pub(crate) async fn fork(
        &self,
        key: &PoolKey,
        warm: Option<&Warmth>,
        timeout: Duration,
    ) -> Result<Option<Slot>, Error> {
        let default = Warmth {
            imports: self.warm_imports.clone(),
            prime: Vec::new(),
        };
        let warmth = match warm {
            Some(warmth) => warmth,
            None if self.all => &default,
            None => return Ok(None),
        };
        if let Err(why) =
            sandbox::template_eligible(&self.spec.sandbox.map_network(Network::mechanism))
        {
            // The configuration rules templates out (no namespaces, say): the fresh path is the
            // one these runs have, even when templates are required.
            tracing::debug!("runs take the fresh path: {why}");
            return Ok(None);
        }
        for _ in 0..2 {
            let cell = self.cell(key);
            let started = cell
                .template
                .get_or_init(|| Template::start(&self.spec, key, warmth, self.ready))
                .await;
            let template = match started {
                Ok(template) => Arc::clone(template),
                Err(why) if cell.made.elapsed() < RETRY_AFTER => {
                    return self.unavailable(why.clone())
                }
                Err(_) => {
                    self.replace(key, &cell);
                    continue;
                }
            };
            if let Some(why) = template.stale(self.idle) {
                tracing::debug!("replacing the template for {}: {why}", key.0.display());
                self.replace(key, &cell);
                continue;
            }
            return match template.run(timeout, self.idle).await {
                Ok(slot) => Ok(Some(slot)),
                // A required layer is missing: the fresh path would refuse the same way.
                Err(e @ Error::IsolationUnavailable(_)) => Err(e),
                // A run that failed the host's check: never silently run another way. The template
                // is replaced, so the next run is forked from one started afresh.
                Err(e @ Error::ForkUnverified(_)) => {
                    template.fork_failed(&e);
                    self.replace(key, &cell);
                    Err(e)
                }
                Err(e) => {
                    template.fork_failed(&e);
                    self.replace(key, &cell);
                    if self.require {
                        return Err(e);
                    }
                    tracing::warn!(
                        "a run could not be forked from its template ({e}); it runs the fresh way"
                    );
                    Ok(None)
                }
            };
        }
        self.unavailable("the template was replaced twice in a row".into())
    }

    /// Starts the template for `key` now, and its ready forks (a declared warm environment when the
    /// engine warms up), rather than at its first run. Where templates cannot be used nothing is
    /// started: runs take the fresh path (an error only when templates are required).
    pub(crate) async fn start_now(
        &self,
        key: &PoolKey,
        warmth: &Warmth,
        timeout: Duration,
    ) -> Result<(), Error> {
        if let Err(why) =
            sandbox::template_eligible(&self.spec.sandbox.map_network(Network::mechanism))
        {
            tracing::debug!("warm environment runs take the fresh path: {why}");
            return Ok(());
        }
        let cell = self.cell(key);
        let started = cell
            .template
            .get_or_init(|| Template::start(&self.spec, key, warmth, self.ready))
            .await;
        match started {
            Ok(template) => {
                template.refill(timeout);
                Ok(())
            }
            Err(why) => self.unavailable(why.clone()).map(drop),
        }
    }

    /// [`Templates::start_now`] for an environment no one declared warm, as its first run would
    /// start it; nothing unless every environment's runs are forked.
    pub(crate) async fn start_base(&self, key: &PoolKey, timeout: Duration) -> Result<(), Error> {
        if !self.all {
            return Ok(());
        }
        let warmth = Warmth {
            imports: self.warm_imports.clone(),
            prime: Vec::new(),
        };
        self.start_now(key, &warmth, timeout).await
    }

    fn unavailable(&self, why: String) -> Result<Option<Slot>, Error> {
        if self.require {
            return Err(Error::TemplateUnavailable(why));
        }
        tracing::debug!("templates unavailable, runs take the fresh path: {why}");
        Ok(None)
    }

    fn cell(&self, key: &PoolKey) -> Arc<Cell> {
        let mut cells = self.cells.lock().unwrap_or_else(|p| p.into_inner());
        Arc::clone(cells.entry(key.clone()).or_insert_with(Cell::new))
    }

    /// Puts a fresh cell in place of `old` (unless another run did already).
    fn replace(&self, key: &PoolKey, old: &Arc<Cell>) {
        let mut cells = self.cells.lock().unwrap_or_else(|p| p.into_inner());
        if cells.get(key).is_some_and(|c| Arc::ptr_eq(c, old)) {
            cells.insert(key.clone(), Cell::new());
        }
    }

    /// The templates that are running, with their memory.
    pub(crate) async fn status(&self) -> Vec<TemplateStatus> {
        let ready: Vec<Arc<Template>> = {
            let cells = self.cells.lock().unwrap_or_else(|p| p.into_inner());
            cells
                .values()
                .filter_map(|c| c.template.get().and_then(|t| t.as_ref().ok()).cloned())
                .collect()
        };
        let mut out = Vec::new();
        for template in ready {
            if let Ok(stat) = template.command(&TemplateCommand::Stat, &[]).await {
                out.push(TemplateStatus {
                    python: template.key.0.clone(),
                    site_dir: template.key.1.clone(),
                    pid: template.pid,
                    memory_bytes: stat.0["rss"].as_u64().unwrap_or(0),
                    runs: template.forks.load(Ordering::Relaxed),
                });
            }
        }
        out
    }
}

/// What a template was started from, as found on disk: a change means its environment changed.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Fingerprint(Vec<Option<(SystemTime, u64)>>);

impl Fingerprint {
    fn of(key: &PoolKey) -> Self {
        let stamp = |p: &Path| {
            std::fs::metadata(p)
                .ok()
                .and_then(|m| Some((m.modified().ok()?, m.len())))
        };
        let mut stamps = vec![stamp(&key.0)];
        if let Some(site) = &key.1 {
            stamps.push(stamp(site));
        }
        Self(stamps)
    }
}

/// A running template.
#[derive(Debug)]
pub(crate) struct Template {
    key: PoolKey,
    /// T's process: killed (its whole sandbox) when the last run forked from it is done with it.
    process: Mutex<SpawnedParts>,
    /// The control socket; one command at a time.
    control: tokio::sync::Mutex<AsyncFd<OwnedFd>>,
    fingerprint: Fingerprint,
    pid: u32,
    last_used: Mutex<Instant>,
    failed: AtomicBool,
    forks: AtomicU64,
    /// T's stderr, head and tail (warm imports that print, a crash's traceback).
    log: Arc<Mutex<HeadTail>>,
    /// Forks ready for a run, oldest first; and how many are being made; and how many it keeps.
    ready: Mutex<std::collections::VecDeque<ReadyRun>>,
    making: AtomicUsize,
    target: usize,
    /// The sandbox its runs get.
    sandbox: Sandbox,
}

impl Template {
    /// Starts the template for `key` and waits until it is ready (or says why it cannot be).
    async fn start(
        spec: &SlotSpec,
        key: &PoolKey,
        warm: &Warmth,
        target: usize,
    ) -> Result<Arc<Template>, String> {
        let started = Instant::now();
        let result = Self::start_inner(spec, key, warm, target).await;
        match &result {
            Ok(_) => tracing::debug!(
                "template for {} ready in {:?}",
                key.0.display(),
                started.elapsed()
            ),
            Err(why) => tracing::warn!("no template for {}: {why}", key.0.display()),
        }
        result
    }

    async fn start_inner(
        spec: &SlotSpec,
        key: &PoolKey,
        warm: &Warmth,
        target: usize,
    ) -> Result<Arc<Template>, String> {
        let code_dir = code_dir().map_err(|e| e.to_string())?;
        let (python, site) = key;
        let mut args: Vec<String> = vec!["--template".into(), "1".into()];
        if let Some(site) = site {
            args.extend(["--site".into(), site.display().to_string()]);
        }
        let mut warm_list = vec!["_ast".to_owned()];
        warm_list.extend(warm.imports.iter().cloned());
        args.extend(["--warm".into(), warm_list.join(",")]);
        if !warm.prime.is_empty() {
            args.extend(["--prime".into(), warm.prime.join(",")]);
        }
        let mut reads: Vec<&Path> = vec![code_dir];
        reads.extend(site.as_deref());
        let (run_dir, _) = sandbox::create_run_dir().map_err(|e| e.to_string())?;
        let plan = sandbox::prepare(
            sandbox::Role::Template,
            &spec.sandbox.map_network(Network::mechanism),
            &sandbox::Target {
                program: python,
                program_prefix: true,
                reads: &reads,
                run_dir: run_dir.path(),
                timeout: Duration::ZERO,
            },
        )
        .map_err(|e| e.to_string())?;
        let env = env::child_env(
            &spec.env_passthrough,
            Path::new(runpython_sandbox::SCRATCH),
            plan.has_view(),
        );
        let (host_ctl, child_ctl) = runpython_sandbox::fd::seqpacket_pair()
            .map_err(|e| format!("creating the template's control socket: {e}"))?;
        let mut spawned: Spawned = spawn::spawn_runner(
            python,
            code_dir,
            &args,
            &env,
            plan,
            spawn::ChildFds {
                bridge: None,
                control: Some(child_ctl),
            },
            // A template serves no network of its own: each run forked from it hands out its own.
            None,
        )
        .map_err(|e| e.to_string())?;
        // Nothing of a template's own scratch is ever read.
        drop(spawned.handoff.take());
        let log = Arc::new(Mutex::new(HeadTail::new(4000)));
        let mut readers = Vec::new();
        for pipe in [spawned.stdout.take(), spawned.stderr.take()]
            .into_iter()
            .flatten()
        {
            let log = Arc::clone(&log);
            readers.push(tokio::spawn(super::capture(
                pipe,
                log,
                None,
                crate::protocol::request::Event::Stderr,
                None,
            )));
        }
        let pid = match &spawned.process {
            RunProcess::Child { child, .. } => child.id().unwrap_or(0),
            RunProcess::Forked(_) => 0,
        };
        let control =
            async_fd(host_ctl).map_err(|e| format!("the template's control socket: {e}"))?;
        let template = Arc::new(Template {
            key: key.clone(),
            process: Mutex::new(SpawnedParts::new(spawned, Some(run_dir))),
            control: tokio::sync::Mutex::new(control),
            fingerprint: Fingerprint::of(key),
            pid,
            last_used: Mutex::new(Instant::now()),
            failed: AtomicBool::new(false),
            forks: AtomicU64::new(0),
            log,
            ready: Mutex::default(),
            making: AtomicUsize::new(0),
            target,
            sandbox: spec.sandbox.clone(),
        });
        let ready = {
            let mut control = template.control.lock().await;
            tokio::time::timeout(START_TIMEOUT, receive(&mut control)).await
        };
        if !matches!(&ready, Ok(Ok((message, _))) if message["ready"] == json!(true)) {
            // What it printed before it failed is the best account of why.
            for reader in readers {
                let _ = tokio::time::timeout(Duration::from_secs(1), reader).await;
            }
        }
        let tail = || {
            let (text, _) = super::take_capture(&template.log).render(4000);
            if text.trim().is_empty() {
                String::new()
            } else {
                format!("; its stderr: {}", text.trim())
            }
        };
        match ready {
            Err(_) => Err(format!(
                "the template did not start within {START_TIMEOUT:?}{}",
                tail()
            )),
            Ok(Err(e)) => Err(format!("the template died while starting ({e}){}", tail())),
            Ok(Ok((message, _))) if message["ready"] == json!(true) => {
                // Runs find forks ready from the second one on (the first makes its own).
                template.refill(spec.timeout);
                Ok(template)
            }
            Ok(Ok((message, _))) => Err(format!(
                "{}{}",
                message["error"]
                    .as_str()
                    .unwrap_or("the template refused to start"),
                tail()
            )),
        }
    }

    /// A fork of this template failed with `e`: the template is not trusted with the next run,
    /// unless `e` is a required layer this host lacks (decided before the template is asked; a
    /// fresh run would be refused the same way).
    fn fork_failed(&self, e: &Error) {
        if !matches!(e, Error::IsolationUnavailable(_)) {
            self.failed.store(true, Ordering::SeqCst);
        }
    }

    /// Why this template must not serve the next run, if it must not.
    fn stale(&self, idle: Duration) -> Option<String> {
        if self.failed.load(Ordering::SeqCst) {
            return Some("a command to it failed".into());
        }
        if !self
            .process
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_alive()
        {
            return Some("it died".into());
        }
        let unused = self
            .last_used
            .lock()
            .map_or(Duration::ZERO, |t| t.elapsed());
        if unused > idle {
            return Some(format!("unused for {unused:?}"));
        }
        if Fingerprint::of(&self.key) != self.fingerprint {
            return Some("its interpreter or environment changed on disk".into());
        }
        None
    }

    /// Sends `command` with `fds` and returns the answer (its JSON and descriptors).
    async fn command(
        &self,
        command: &TemplateCommand<'_>,
        fds: &[RawFd],
    ) -> Result<(Value, Vec<OwnedFd>), Error> {
        let data = serde_json::to_vec(&command).map_err(|e| Error::Internal(e.to_string()))?;
        let mut control = self.control.lock().await;
        let sent = async {
            loop {
                let mut ready = control.writable().await?;
                let sent = ready.try_io(|fd| {
                    if fds.is_empty() {
                        // SAFETY: a send of a live buffer on our socket.
                        let n = unsafe {
                            libc::send(
                                fd.as_raw_fd(),
                                data.as_ptr().cast(),
                                data.len(),
                                libc::MSG_NOSIGNAL,
                            )
                        };
                        if n < 0 {
                            return Err(std::io::Error::last_os_error());
                        }
                        Ok(())
                    } else {
                        runpython_sandbox::fd::send_with_fds(fd.as_raw_fd(), &data, fds)
                    }
                });
                match sent {
                    Ok(result) => return result,
                    Err(_would_block) => continue,
                }
            }
        };
        let io = |e: std::io::Error| {
            self.failed.store(true, Ordering::SeqCst);
            Error::io_pathless("talking to the run's template", e)
        };
        sent.await.map_err(io)?;
        let reply = tokio::time::timeout(REPLY_TIMEOUT, receive(&mut control))
            .await
            .map_err(|_| {
                io(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("no answer within {REPLY_TIMEOUT:?}"),
                ))
            })?;
        reply.map_err(io)
    }
}

/// The next message on a template's socket, parsed.
async fn receive(socket: &mut AsyncFd<OwnedFd>) -> std::io::Result<(Value, Vec<OwnedFd>)> {
    let (data, fds, _) = receive_raw(socket).await?;
    if data.is_empty() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            "the template closed its control socket",
        ));
    }
    let value = serde_json::from_slice(&data)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
    Ok((value, fds))
}

/// The next message on a `SOCK_SEQPACKET` socket with its descriptors (empty at end of file).
async fn receive_raw(
    socket: &mut AsyncFd<OwnedFd>,
) -> std::io::Result<(Vec<u8>, Vec<OwnedFd>, Option<libc::pid_t>)> {
    let mut buf = vec![0u8; MAX_REPLY];
    loop {
        let mut ready = socket.readable().await?;
        match ready
            .try_io(|fd| runpython_sandbox::fd::recv_with_fds_and_sender(fd.as_raw_fd(), &mut buf))
        {
            Ok(Ok((n, fds, sender))) => {
                buf.truncate(n);
                return Ok((buf, fds, sender));
            }
            Ok(Err(e)) => return Err(e),
            Err(_would_block) => continue,
        }
    }
}

/// A socket the runtime drives: non-blocking, registered with the reactor.
fn async_fd(fd: OwnedFd) -> std::io::Result<AsyncFd<OwnedFd>> {
    // SAFETY: fcntl on a descriptor we own, with integer arguments.
    unsafe {
        let flags = libc::fcntl(fd.as_raw_fd(), libc::F_GETFL);
        if flags < 0 || libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, flags | libc::O_NONBLOCK) < 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    // SAFETY: an `OwnedFd` is open and keeps referring to the same file description until the
    // `AsyncFd` that owns it is dropped.
    unsafe { AsyncFd::register(fd) }.map_err(|e| e.into_parts().1)
}
