//! The child: starting a sandboxed interpreter for a run (a private run directory, the sandbox plan, a
//! scrubbed environment, the runner waiting for its request on stdin), capturing its output, and the
//! pool of interpreters started ahead of their runs.

pub(crate) mod code_dir;
mod env;
mod forked;
mod output;
mod pool;
pub(crate) mod protocol;
mod spawn;
mod template;

use std::os::fd::{AsFd, AsRawFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use runpython_bridge::HostEnd;
use runpython_sandbox::BeneathDir;

pub(crate) use code_dir::{bytecode_in_place, code_dir, code_version};
pub(crate) use output::{capture, take_capture, Captured, Closed, FullStream, HeadTail};
pub use pool::PoolConfig;
pub(crate) use pool::{Pool, PoolKey};
pub(crate) use runpython_sandbox::discard_run_dir;
pub(crate) use spawn::{Spawned, SpawnedParts, BRIDGE_FD};
pub use template::TemplateStatus;
pub(crate) use template::{Templates, Warmth};

use crate::error::Error;
use crate::protocol::envelope::Isolation;
use runpython_egress::{Network, Sandbox};

/// An interpreter started for a run (cold, or ahead of time by the pool).
#[derive(Debug)]
pub(crate) struct Slot {
    /// The run's private directory on the host (none for a run forked from a template: everything
    /// of it is inside its view).
    pub run_dir: Option<tempfile::TempDir>,
    pub spawned: Spawned,
    /// Where the run writes (its scratch: `work/`, `saved/`, ...), held since before the code started:
    /// the host reads the run's files beneath it only.
    pub scratch: Arc<BeneathDir>,
    /// Where `save_artifact` writes, as the code sees it.
    pub saved_dir: PathBuf,
    /// The host's end of the run's tool bridge (the child has the other as descriptor 4).
    pub bridge: HostEnd,
    /// A session interpreter's control socket (the host's end; the child's is its stdin).
    pub control: Option<tokio::net::UnixStream>,
    pub isolation: Isolation,
    pub born: Instant,
}

/// The engine's settings an interpreter is started with.
#[derive(Debug, Clone)]
pub(crate) struct SlotSpec {
    pub sandbox: Sandbox,
    /// The engine's run timeout (the CPU limit is one second more).
    pub timeout: Duration,
    pub env_passthrough: Vec<String>,
}

impl SlotSpec {
    /// Starts an interpreter for a run: a private run directory, the sandbox plan, the child waiting
    /// for its request on stdin. `warm_up` are the runner's pre-request arguments (pooled interpreters).
    /// `reads` are the directories the code reads besides the interpreter and runpython's code (its
    /// prepared environment).
    pub(crate) fn spawn(
        &self,
        python: &Path,
        code_dir: &Path,
        reads: &[&Path],
        warm_up: &[String],
    ) -> Result<Slot, Error> {
        self.spawn_as(python, code_dir, reads, warm_up, false)
    }

    /// An interpreter for a session: it serves cells sent over a control socket (its stdin) until the
    /// host closes it.
    pub(crate) fn spawn_session(
        &self,
        python: &Path,
        code_dir: &Path,
        reads: &[&Path],
    ) -> Result<Slot, Error> {
        self.spawn_as(
            python,
            code_dir,
            reads,
            &["--session".into(), "1".into()],
            true,
        )
    }

    fn spawn_as(
        &self,
        python: &Path,
        code_dir: &Path,
        env_reads: &[&Path],
        warm_up: &[String],
        session: bool,
    ) -> Result<Slot, Error> {
        let (run_dir, _) = runpython_sandbox::create_run_dir()?;
        let mut reads = vec![code_dir];
        reads.extend_from_slice(env_reads);
        let plan = runpython_sandbox::prepare(
            runpython_sandbox::Role::Run,
            &self.sandbox.map_network(Network::mechanism),
            &runpython_sandbox::Target {
                program: python,
                program_prefix: true,
                reads: &reads,
                run_dir: run_dir.path(),
                timeout: self.timeout,
            },
        )?;
        let mut isolation = plan.isolation().clone();
        self.sandbox.network.describe(&mut isolation);
        // The scratch as the code sees it: inside the view, or the host's run directory.
        let scratch_path = if plan.has_view() {
            PathBuf::from(runpython_sandbox::SCRATCH)
        } else {
            run_dir.path().to_owned()
        };
        let env = env::child_env(&self.env_passthrough, &scratch_path, plan.has_view());
        let held =
            if plan.has_view() {
                None
            } else {
                Some(BeneathDir::open(run_dir.path()).map_err(|source| {
                    Error::io("opening the run directory", run_dir.path(), source)
                })?)
            };
        let (bridge, bridge_child) = runpython_bridge::socket_pair()?;
        let (control, control_child) = if session {
            let (host, child) = std::os::unix::net::UnixStream::pair()
                .map_err(|e| Error::io_pathless("creating a session's control socket", e))?;
            host.set_nonblocking(true)
                .map_err(|e| Error::io_pathless("creating a session's control socket", e))?;
            let host = tokio::net::UnixStream::from_std(host)
                .map_err(|e| Error::io_pathless("creating a session's control socket", e))?;
            (Some(host), Some(std::os::fd::OwnedFd::from(child)))
        } else {
            (None, None)
        };
        let mut spawned = spawn::spawn_runner(
            python,
            code_dir,
            warm_up,
            &env,
            plan,
            spawn::ChildFds {
                bridge: Some(bridge_child),
                control: control_child,
            },
            self.sandbox.network.policy(),
        )?;
        let scratch = match (held, spawned.handoff.take()) {
            (Some(held), _) => held,
            (None, Some(handoff)) => {
                // The run's first process sent it before the interpreter could start.
                let fd = runpython_sandbox::fd::recv_fd(handoff.as_raw_fd())
                    .and_then(|fd| BeneathDir::from_fd(fd.as_fd()))
                    .map_err(|source| Error::SandboxSetup {
                        step: "handing the run's scratch directory to the host",
                        source,
                    })?;
                fd
            }
            (None, None) => {
                return Err(Error::Internal(
                    "a run with a view has no handoff socket".into(),
                ))
            }
        };
        Ok(Slot {
            run_dir: Some(run_dir),
            spawned,
            scratch: Arc::new(scratch),
            saved_dir: scratch_path.join("saved"),
            bridge,
            control,
            isolation,
            born: Instant::now(),
        })
    }
}
