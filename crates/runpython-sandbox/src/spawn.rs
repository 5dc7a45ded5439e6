//! Starting a command under a [`Plan`], and making sure nothing it started outlives it.

use std::ffi::OsStr;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::process::Stdio;

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;

use crate::cgroup::RunCgroup;
use crate::egress::EgressChannel;
use crate::error::Error;
use crate::fd::pass::seqpacket_pair;
use crate::plan::Plan;
use crate::sys::{dup_high, StepError};

/// Kills the sandboxed process's whole process group when dropped, so a timeout, a cancellation or a
/// dropped future leaves no survivor behind (children that stay in the group included). Without a
/// PID namespace but with a uid of its own, every process of that uid is killed too (a `setsid`
/// daemon leaves the group, not the uid). With a PID namespace, its init kills the rest.
#[derive(Debug)]
pub struct GroupGuard {
    pgid: Pid,
    sweep_uid: Option<u32>,
}

impl GroupGuard {
    /// Kills the group (and the uid's processes, without a PID namespace), now.
    pub fn kill(&self) {
        // ESRCH (nobody left in the group) is the normal case after a clean exit.
        let _ = killpg(self.pgid, Signal::SIGKILL);
        if let Some(uid) = self.sweep_uid {
            crate::userns::kill_all_of_uid(uid);
        }
    }
}

impl Drop for GroupGuard {
    fn drop(&mut self) {
        self.kill();
        // It is over: make up for the network namespace it took, off anyone's critical path.
        crate::netns::refill();
    }
}

/// Where a sandboxed process's stdin comes from.
#[derive(Debug)]
pub enum StdinFrom {
    /// A pipe the host writes ([`Child::stdin`]).
    Pipe,
    /// `/dev/null`.
    Null,
    /// A descriptor of the host's (a session's control socket, say).
    Fd(OwnedFd),
}

/// A command to start under a [`Plan`]: stdout and stderr are always pipes the host reads.
#[derive(Debug)]
pub struct Spawn<'a> {
    /// The program (an absolute path: there is no `PATH` search).
    pub program: &'a Path,
    /// Its arguments, without the program.
    pub args: &'a [&'a OsStr],
    /// Its whole environment (nothing of the host's is inherited).
    pub env: &'a [(String, String)],
    /// Its stdin.
    pub stdin: StdinFrom,
    /// Descriptors it inherits, each placed at its number (3 and up): a result pipe, a bridge.
    pub fds: Vec<(RawFd, OwnedFd)>,
}

/// A started sandboxed process with the host's ends of its pipes.
#[derive(Debug)]
pub struct Child {
    /// The process the host started (the sandbox's outermost process, S: it exits with the status
    /// of the command).
    pub process: tokio::process::Child,
    /// Kills everything it started.
    pub guard: GroupGuard,
    /// Its stdin, with [`StdinFrom::Pipe`].
    pub stdin: Option<tokio::net::unix::pipe::Sender>,
    /// Its stdout.
    pub stdout: Option<tokio::net::unix::pipe::Receiver>,
    /// Its stderr.
    pub stderr: Option<tokio::net::unix::pipe::Receiver>,
    /// Its cgroup: removed when dropped, after the group is killed.
    pub cgroup: Option<RunCgroup>,
    /// With a filesystem view: the host's end of the socket the scratch's descriptor arrives through
    /// (its first process sends it before the command starts; [`crate::fd::recv_fd`]).
    pub handoff: Option<OwnedFd>,
    /// With [`crate::Network::Mediated`] (when it is in force): the host's end of the socket the
    /// run's egress descriptors arrive through (its first process sends the sockets before the command
    /// starts, the interpreter the notifier's listener; [`EgressChannel::receive`]). The caller serves
    /// them (runpython-egress, with its policy); until it does, the run's connects wait.
    pub egress: Option<EgressChannel>,
}

/// Starts `spawn` under `plan`, in a new process group, with PDEATHSIG (it dies with the host), in
/// the plan's working directory (its scratch's `work/`).
pub fn spawn(mut plan: Plan, spawn: Spawn<'_>) -> Result<Child, Error> {
    let Spawn {
        program,
        args,
        env,
        stdin,
        fds,
    } = spawn;
    let sweep_uid = plan.sweep_uid;
    let cgroup = plan.take_cgroup();
    let handoff = if plan.has_view() {
        let (host, child) = seqpacket_pair().map_err(|e| {
            Error::io_pathless(
                "creating the socket the scratch's descriptor comes through",
                e,
            )
        })?;
        plan.set_handoff(child);
        Some(host)
    } else {
        None
    };
    let egress = if plan.egress {
        let (host, child) = seqpacket_pair().map_err(|e| {
            Error::io_pathless("creating the socket the run's network comes through", e)
        })?;
        plan.set_egress_sock(child);
        Some(EgressChannel(host, plan.egress_guard))
    } else {
        None
    };
    plan.exec_with(program, args, env)?;
    // Above the fixed slots, so that placing one cannot clobber another.
    let mut placed = Vec::with_capacity(fds.len());
    for (to, fd) in fds {
        let fd = dup_high(fd)
            .map_err(|e| Error::io_pathless("placing the sandboxed process's descriptors", e))?;
        placed.push((fd.as_raw_fd(), to, fd));
    }
    let moves: Vec<(RawFd, RawFd)> = placed.iter().map(|(from, to, _)| (*from, *to)).collect();
    let cwd = Path::new(OsStr::from_bytes(plan.work_dir.as_bytes())).to_owned();

    let mut command = tokio::process::Command::new(program);
    command
        .args(args)
        .env_clear()
        .envs(env.iter().map(|(k, v)| (k, v)))
        .current_dir(&cwd)
        .stdin(match stdin {
            StdinFrom::Pipe => Stdio::piped(),
            StdinFrom::Null => Stdio::null(),
            StdinFrom::Fd(fd) => Stdio::from(fd),
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    // SAFETY: the closure runs between fork and exec and only makes async-signal-safe system calls
    // (prctl, dup2, and the sandbox's, see `init::enter`) on descriptors open in the child.
    unsafe {
        command.pre_exec(move || {
            // If the host dies, even by SIGKILL, the child dies with it.
            nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)?;
            // dup2 leaves the new descriptors without close-on-exec: the command inherits them.
            for &(from, to) in &moves {
                if libc::dup2(from, to) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            crate::init::enter(&plan)
        });
    }
    let mut process = command
        .spawn()
        .map_err(|source| spawn_error(program, source))?;
    // The child holds the only copies of what it inherited now: end of file comes when it exits.
    drop(placed);
    let pid = process.id().ok_or_else(|| {
        Error::io_pathless(
            "reading the sandboxed process's pid",
            std::io::Error::other("it exited before it could be tracked"),
        )
    })?;
    let guard = GroupGuard {
        pgid: Pid::from_raw(pid as i32),
        sweep_uid,
    };
    let io = |e: std::io::Error| Error::io_pathless("taking the sandboxed process's pipes", e);
    let stdin = match process.stdin.take() {
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
    let stdout = match process.stdout.take() {
        Some(pipe) => Some(receiver(pipe.into_owned_fd())?),
        None => None,
    };
    let stderr = match process.stderr.take() {
        Some(pipe) => Some(receiver(pipe.into_owned_fd())?),
        None => None,
    };
    Ok(Child {
        process,
        guard,
        stdin,
        stdout,
        stderr,
        cgroup,
        handoff,
        egress,
    })
}

/// The spawn failed: a sandbox step when the error carries one, else the spawn itself.
fn spawn_error(program: &Path, source: std::io::Error) -> Error {
    match StepError::from_io(&source) {
        Some(step) => {
            // The kernel refused a step: the per-boot probe may have said it works (the host's
            // confinement changed in a way its key does not see); the next process probes again.
            crate::per_boot::forget();
            Error::Setup {
                step: step.step.describe(),
                source: step.source(),
            }
        }
        None => Error::Spawn {
            program: program.to_owned(),
            source,
        },
    }
}
