//! Spawning the child and making sure nothing it started outlives the run.

use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;
use std::process::Stdio;

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;

use crate::error::Error;

/// Where the runner writes its result. The child gets the write end as this descriptor.
pub(crate) const RESULT_FD: i32 = 3;

/// The child's end of the tool bridge (a socket pair: one connection per run, nothing on a path).
pub(crate) const BRIDGE_FD: i32 = 4;

/// Kills the child's whole process group when dropped, so a timeout, a cancellation or a dropped future
/// leaves no survivor behind (children that stay in the group included).
/// Without a PID namespace but with a run uid, every process of that uid is killed too (a `setsid`
/// daemon leaves the group, not the uid).
#[derive(Debug)]
pub(crate) struct GroupGuard {
    pgid: Pid,
    sweep_uid: Option<u32>,
}

impl GroupGuard {
    pub(crate) fn kill(&self) {
        // ESRCH (nobody left in the group) is the normal case after a clean exit.
        let _ = killpg(self.pgid, Signal::SIGKILL);
        if let Some(uid) = self.sweep_uid {
            crate::sandbox::kill_all_of_uid(uid);
        }
    }
}

impl Drop for GroupGuard {
    fn drop(&mut self) {
        self.kill();
        // The run is over: make up for the network namespace it took, off any run's critical path.
        crate::sandbox::refill_netns();
    }
}

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
    pub cgroup: Option<crate::sandbox::RunCgroup>,
    /// With a filesystem view: the host's end of the socket the run's scratch arrives through.
    pub handoff: Option<OwnedFd>,
}

/// The descriptors a child gets besides its pipes: its end of the tool bridge (as fd 4) and, for a
/// session's interpreter or a template, its control socket (as its stdin).
#[derive(Debug)]
pub(crate) struct ChildFds {
    pub bridge: Option<OwnedFd>,
    pub control: Option<OwnedFd>,
}

/// The host's ends of a child's stdin, stdout and stderr.
type Stdio3 = (
    Option<tokio::net::unix::pipe::Sender>,
    Option<tokio::net::unix::pipe::Receiver>,
    Option<tokio::net::unix::pipe::Receiver>,
);

/// The host's ends of a child's stdio, as pipes the runtime drives.
fn stdio_pipes(child: &mut tokio::process::Child) -> Result<Stdio3, Error> {
    let io = |e: std::io::Error| Error::io_pathless("taking the child's pipes", e);
    let stdin = match child.stdin.take() {
        Some(pipe) => Some(
            tokio::net::unix::pipe::Sender::from_owned_fd(pipe.into_owned_fd().map_err(io)?)
                .map_err(io)?,
        ),
        None => None,
    };
    let receiver = |fd: std::io::Result<OwnedFd>| {
        fd.and_then(tokio::net::unix::pipe::Receiver::from_owned_fd)
            .map_err(io)
    };
    let stdout = match child.stdout.take() {
        Some(pipe) => Some(receiver(pipe.into_owned_fd())?),
        None => None,
    };
    let stderr = match child.stderr.take() {
        Some(pipe) => Some(receiver(pipe.into_owned_fd())?),
        None => None,
    };
    Ok((stdin, stdout, stderr))
}

/// Starts `python -I -S -X utf8 -c BOOTSTRAP CODE_DIR` in `cwd`, in a new process group, with a scrubbed
/// environment, piped stdio, the result pipe as descriptor 3, inside the sandbox `plan` describes.
pub(crate) fn spawn_runner(
    python: &Path,
    code_dir: &Path,
    warm_up: &[String],
    cwd: &Path,
    env: &[(String, String)],
    mut plan: crate::sandbox::Plan,
    fds: ChildFds,
) -> Result<Spawned, Error> {
    let ChildFds {
        bridge: bridge_child,
        control: control_child,
    } = fds;
    let sweep_uid = plan.sweep_uid;
    let cgroup = plan.take_cgroup();
    let handoff = if plan.has_view() {
        let (host, child) = crate::sandbox::seqpacket_pair().map_err(|e| {
            Error::io_pathless("creating the socket the run's scratch comes through", e)
        })?;
        plan.set_handoff(child);
        Some(host)
    } else {
        None
    };
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
    plan.exec_with(python, &args, env)?;
    let (result_read, result_write): (OwnedFd, OwnedFd) =
        nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
            .map_err(|e| Error::io_pathless("creating the result pipe", e.into()))?;
    // Above the fixed slots, so that placing one cannot clobber the other.
    let high = |fd: OwnedFd| {
        crate::sandbox::dup_high(fd).map_err(|e| Error::io_pathless("placing the child's pipes", e))
    };
    let result_write = high(result_write)?;
    let bridge_child = bridge_child.map(high).transpose()?;
    let write_fd = result_write.as_raw_fd();
    let bridge_fd = bridge_child.as_ref().map(|fd| fd.as_raw_fd());

    let mut command = tokio::process::Command::new(python);
    command
        .args(&args)
        .env_clear()
        .envs(env.iter().map(|(k, v)| (k, v)))
        .current_dir(cwd)
        .stdin(match control_child {
            // A session's interpreter reads its cells from a socket, not a pipe.
            Some(fd) => Stdio::from(fd),
            None => Stdio::piped(),
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    // SAFETY: the closure runs between fork and exec and only makes async-signal-safe system calls
    // (prctl, dup2, fcntl, and the sandbox's, see `sandbox::enter`) on descriptors open in the child.
    unsafe {
        command.pre_exec(move || {
            // If the host dies, even by SIGKILL, the child dies with it.
            nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)?;
            // dup2 leaves the new descriptors without close-on-exec: the runner inherits them.
            for (from, to) in [(Some(write_fd), RESULT_FD), (bridge_fd, BRIDGE_FD)] {
                if let Some(from) = from {
                    if libc_dup2(from, to) < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
            }
            crate::sandbox::enter(&plan)
        });
    }
    let mut child = command
        .spawn()
        .map_err(|source| spawn_error(python, source))?;
    // The child holds the only write end and the only child end of the bridge now: EOF comes when it
    // exits.
    drop((result_write, bridge_child));
    let pid = child.id().ok_or_else(|| {
        Error::io_pathless(
            "reading the child's pid",
            std::io::Error::other("the child exited before it could be tracked"),
        )
    })?;
    let guard = GroupGuard {
        pgid: Pid::from_raw(pid as i32),
        sweep_uid,
    };
    let result = tokio::net::unix::pipe::Receiver::from_owned_fd(result_read)
        .map_err(|e| Error::io_pathless("reading the result pipe", e))?;
    let (stdin, stdout, stderr) = stdio_pipes(&mut child)?;
    Ok(Spawned {
        process: RunProcess::Child { child, guard },
        stdin,
        stdout,
        stderr,
        result,
        cgroup,
        handoff,
    })
}

/// The child's spawn failed: a sandbox step when the error carries one, else the spawn itself.
fn spawn_error(program: &Path, source: std::io::Error) -> Error {
    match crate::sandbox::StepError::from_io(&source) {
        Some(step) => Error::SandboxSetup {
            step: step.step.describe(),
            source: step.source(),
        },
        None => Error::Spawn {
            program: program.to_owned(),
            source,
        },
    }
}

fn libc_dup2(old: i32, new: i32) -> i32 {
    // SAFETY: dup2 on two plain descriptor numbers; failure is reported through the return value.
    unsafe { libc::dup2(old, new) }
}

/// A long-lived interpreter's process and what goes with it (a session's or a template's): killed and
/// its run directory removed when it is dropped.
#[derive(Debug)]
pub(crate) struct SpawnedParts {
    process: RunProcess,
    cgroup: Option<crate::sandbox::RunCgroup>,
    run_dir: Option<tempfile::TempDir>,
}

impl SpawnedParts {
    pub(crate) fn new(spawned: Spawned, run_dir: Option<tempfile::TempDir>) -> Self {
        Self {
            process: spawned.process,
            cgroup: spawned.cgroup,
            run_dir,
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
