//! Spawning the child and making sure nothing it started outlives the run.

use std::os::fd::OwnedFd;
use std::path::Path;
use std::sync::Arc;

use runpython_egress::{Egress, NetworkPolicy};
use runpython_sandbox::{GroupGuard, StdinFrom};

use crate::error::Error;

/// Where the runner writes its result. The child gets the write end as this descriptor.
pub(crate) const RESULT_FD: i32 = 3;

/// The child's end of the tool bridge (a socket pair: one connection per run, nothing on a path).
pub(crate) const BRIDGE_FD: i32 = 4;

/// The process a run's code runs in, as the host drives it.
#[derive(Debug)]
pub(crate) enum RunProcess {
    /// An interpreter of its own, started by the host (the sandbox's S, whose process group is killed).
    Child {
        child: tokio::process::Child,
        guard: GroupGuard,
    },
    /// A run forked from a template.
    Forked(super::forked::ForkedRun),
}

impl RunProcess {
    /// Waits for the run's interpreter to end. Cancel-safe.
    pub(crate) async fn wait(&mut self) -> std::io::Result<std::process::ExitStatus> {
        match self {
            RunProcess::Child { child, .. } => child.wait().await,
            RunProcess::Forked(forked) => forked.wait().await,
        }
    }

    /// Kills everything the run started, now.
    pub(crate) fn kill(&self) {
        match self {
            RunProcess::Child { guard, .. } => guard.kill(),
            RunProcess::Forked(forked) => forked.kill(),
        }
    }

    /// Whether the interpreter is still there (a pooled one that died is not served).
    pub(crate) fn is_alive(&mut self) -> bool {
        match self {
            RunProcess::Child { child, .. } => matches!(child.try_wait(), Ok(None)),
            RunProcess::Forked(_) => true,
        }
    }
}

/// A started child with its pipes.
#[derive(Debug)]
pub(crate) struct Spawned {
    pub process: RunProcess,
    /// Where the request goes (`None` for a session, whose stdin is its control socket).
    pub stdin: Option<tokio::net::unix::pipe::Sender>,
    pub stdout: Option<tokio::net::unix::pipe::Receiver>,
    pub stderr: Option<tokio::net::unix::pipe::Receiver>,
    pub result: tokio::net::unix::pipe::Receiver,
    /// The run's cgroup: removed when the run is over (dropped after the group is killed).
    pub cgroup: Option<runpython_sandbox::RunCgroup>,
    /// With a filesystem view: the host's end of the socket the run's scratch arrives through.
    pub handoff: Option<OwnedFd>,
    /// With a network policy: the host's side of the run's network.
    pub egress: Option<Egress>,
}

/// The descriptors a child gets besides its pipes: its end of the tool bridge (as fd 4) and, for a
/// session's interpreter or a template, its control socket (as its stdin).
#[derive(Debug)]
pub(crate) struct ChildFds {
    pub bridge: Option<OwnedFd>,
    pub control: Option<OwnedFd>,
}

/// Starts `python -I -S -X utf8 -c BOOTSTRAP CODE_DIR` in a new process group, with a scrubbed
/// environment, piped stdio, the result pipe as descriptor 3 and the bridge as 4, inside the sandbox
/// `plan` describes.
pub(crate) fn spawn_runner(
    python: &Path,
    code_dir: &Path,
    warm_up: &[String],
    env: &[(String, String)],
    plan: runpython_sandbox::Plan,
    fds: ChildFds,
    policy: Option<&NetworkPolicy>,
) -> Result<Spawned, Error> {
    let ChildFds { bridge, control } = fds;
    let mut args: Vec<&std::ffi::OsStr> = vec![
        "-I".as_ref(),
        "-S".as_ref(),
        "-X".as_ref(),
        "utf8".as_ref(),
        "-c".as_ref(),
        super::code_dir::BOOTSTRAP.as_ref(),
        code_dir.as_os_str(),
    ];
    args.extend(warm_up.iter().map(|a| std::ffi::OsStr::new(a.as_str())));
    let (result_read, result_write): (OwnedFd, OwnedFd) =
        nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
            .map_err(|e| Error::io_pathless("creating the result pipe", e.into()))?;
    let mut placed = vec![(RESULT_FD, result_write)];
    placed.extend(bridge.map(|fd| (BRIDGE_FD, fd)));
    let child = runpython_sandbox::spawn(
        plan,
        runpython_sandbox::Spawn {
            program: python,
            args: &args,
            env,
            // A session's interpreter reads its cells from a socket, not a pipe.
            stdin: match control {
                Some(fd) => StdinFrom::Fd(fd),
                None => StdinFrom::Pipe,
            },
            fds: placed,
        },
    )?;
    let result = tokio::net::unix::pipe::Receiver::from_owned_fd(result_read)
        .map_err(|e| Error::io_pathless("reading the result pipe", e))?;
    let runpython_sandbox::Child {
        process,
        guard,
        stdin,
        stdout,
        stderr,
        cgroup,
        handoff,
        egress,
    } = child;
    // The sandbox hands the run's network out; the host serves it with the engine's policy.
    let egress = match (egress, policy) {
        (None, _) => None,
        (Some(channel), Some(policy)) => Some(Egress::start(channel, Arc::new(policy.clone()))),
        (Some(_), None) => {
            return Err(Error::Internal(
                "the sandbox mediates a run's network, and no policy was given for it".into(),
            ))
        }
    };
    Ok(Spawned {
        process: RunProcess::Child {
            child: process,
            guard,
        },
        stdin,
        stdout,
        stderr,
        result,
        cgroup,
        handoff,
        egress,
    })
}

/// A long-lived interpreter's process and what goes with it (a session's or a template's): killed and
/// its run directory removed when it is dropped.
#[derive(Debug)]
pub(crate) struct SpawnedParts {
    process: RunProcess,
    cgroup: Option<runpython_sandbox::RunCgroup>,
    run_dir: Option<tempfile::TempDir>,
    /// With a network policy: the host's side of the interpreter's network.
    pub egress: Option<Egress>,
}

impl SpawnedParts {
    pub(crate) fn new(spawned: Spawned, run_dir: Option<tempfile::TempDir>) -> Self {
        Self {
            process: spawned.process,
            cgroup: spawned.cgroup,
            run_dir,
            egress: spawned.egress,
        }
    }

    /// Waits for the interpreter to end.
    pub(crate) async fn wait(&mut self) -> Result<std::process::ExitStatus, Error> {
        self.process
            .wait()
            .await
            .map_err(|e| Error::io_pathless("waiting for the session's interpreter", e))
    }

    /// Kills everything the interpreter started, now.
    pub(crate) fn kill(&mut self) {
        self.process.kill();
    }

    /// Whether the interpreter is still there.
    pub(crate) fn is_alive(&mut self) -> bool {
        self.process.is_alive()
    }

    /// Whether the kernel killed a process of it for going over the memory limit.
    pub(crate) fn oom_killed(&self) -> bool {
        self.cgroup.as_ref().is_some_and(|cg| cg.oom_killed())
    }
}

impl Drop for SpawnedParts {
    fn drop(&mut self) {
        self.process.kill();
        if let Some(run_dir) = self.run_dir.take() {
            super::discard_run_dir(run_dir);
        }
    }
}
