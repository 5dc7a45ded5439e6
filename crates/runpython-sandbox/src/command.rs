//! [`Command`]: one command under a [`Sandbox`], the way a caller that is not a run wants it (an
//! installer, a build): its own run directory, its scratch handed to the host before it starts, its
//! output, its end.

use std::ffi::{OsStr, OsString};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::time::Duration;

use tokio::io::AsyncReadExt;

use crate::error::Error;
use crate::fd::copy::copy_tree;
use crate::fd::{BeneathDir, CopyReport};
use crate::plan::{prepare, Role, Target};
use crate::report::Isolation;
use crate::run_dir::{create_run_dir, discard_run_dir};
use crate::spawn::{spawn, Child, Spawn, StdinFrom};
use crate::Sandbox;

/// A command to run under a [`Sandbox`]: the program reads the system, its own prefix and what
/// [`Command::read`] names; it writes only its scratch (`work/`, its cwd; `tmp/`; `home/`, its
/// `HOME`), a tmpfs of [`Sandbox::disk_bytes`] that the host reads afterwards through [`Scratch`].
#[derive(Debug, Clone)]
pub struct Command {
    program: PathBuf,
    args: Vec<OsString>,
    env: Vec<(String, String)>,
    reads: Vec<PathBuf>,
    program_prefix: bool,
    timeout: Duration,
}

impl Command {
    /// `program` (an absolute path: nothing searches `PATH`).
    pub fn new(program: impl Into<PathBuf>) -> Self {
        Self {
            program: program.into(),
            args: Vec::new(),
            env: Vec::new(),
            reads: Vec::new(),
            program_prefix: true,
            timeout: Duration::from_secs(600),
        }
    }

    /// One more argument.
    #[must_use]
    pub fn arg(mut self, arg: impl AsRef<OsStr>) -> Self {
        self.args.push(arg.as_ref().to_owned());
        self
    }

    /// More arguments.
    #[must_use]
    pub fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        self.args
            .extend(args.into_iter().map(|a| a.as_ref().to_owned()));
        self
    }

    /// One environment variable; the command gets these only (nothing of the host's), and `HOME`
    /// in its scratch unless set here.
    #[must_use]
    pub fn env(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.push((name.into(), value.into()));
        self
    }

    /// A directory or file the command may read (bound read-only at its own path).
    #[must_use]
    pub fn read(mut self, path: impl Into<PathBuf>) -> Self {
        self.reads.push(path.into());
        self
    }

    /// Another program it runs (an interpreter): read-only with its prefix, the directory above its
    /// `bin/`.
    #[must_use]
    pub fn read_program(mut self, program: impl AsRef<Path>) -> Self {
        self.reads
            .extend(crate::plan::program_dirs(program.as_ref(), true));
        self
    }

    /// Whether the program's prefix (the directory above its `bin/`) is read-only in the view
    /// (default: yes, an interpreter needs its standard library); off, only the program's file is.
    #[must_use]
    pub fn program_prefix(mut self, prefix: bool) -> Self {
        self.program_prefix = prefix;
        self
    }

    /// Its CPU time is limited to this and one second more (default 10 minutes); the wall clock is
    /// the caller's to keep ([`Sandboxed::wait_with_output`] takes one).
    #[must_use]
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Starts it. Needs a Tokio runtime (its pipes are the runtime's).
    pub fn spawn(self, config: &Sandbox) -> Result<Sandboxed, Error> {
        let (run_dir, _work) = create_run_dir()?;
        let reads: Vec<&Path> = self.reads.iter().map(PathBuf::as_path).collect();
        let plan = prepare(
            Role::Run,
            config,
            &Target {
                program: &self.program,
                program_prefix: self.program_prefix,
                reads: &reads,
                run_dir: run_dir.path(),
                timeout: self.timeout,
            },
        )?;
        let isolation = plan.isolation().clone();
        let scratch_path = if plan.has_view() {
            PathBuf::from(crate::view::SCRATCH)
        } else {
            run_dir.path().to_owned()
        };
        let mut env = self.env;
        if !env.iter().any(|(k, _)| k == "HOME") {
            env.push((
                "HOME".into(),
                scratch_path.join("home").display().to_string(),
            ));
        }
        let held = if plan.has_view() {
            None
        } else {
            Some(
                std::fs::File::open(run_dir.path())
                    .map(OwnedFd::from)
                    .map_err(|e| Error::io("opening the run directory", run_dir.path(), e))?,
            )
        };
        let args: Vec<&OsStr> = self.args.iter().map(OsString::as_os_str).collect();
        let mut child = spawn(
            plan,
            Spawn {
                program: &self.program,
                args: &args,
                env: &env,
                stdin: StdinFrom::Null,
                fds: Vec::new(),
            },
        )?;
        let scratch = match (held, child.handoff.take()) {
            (Some(held), _) => held,
            (None, Some(handoff)) => {
                crate::fd::pass::recv_fd(handoff.as_raw_fd()).map_err(|source| Error::Setup {
                    step: "handing the scratch directory to the host",
                    source,
                })?
            }
            (None, None) => return Err(Error::Internal("a view without a handoff socket".into())),
        };
        Ok(Sandboxed {
            child,
            scratch: Scratch(BeneathDir::from_owned(scratch)),
            isolation,
            run_dir: Some(run_dir),
        })
    }
}

/// A started [`Command`]. Dropping it kills everything it started and removes its run directory.
#[derive(Debug)]
pub struct Sandboxed {
    child: Child,
    scratch: Scratch,
    isolation: Isolation,
    run_dir: Option<tempfile::TempDir>,
}

/// What a finished command printed (each stream's first [`Sandboxed::wait_with_output`]'s
/// `max_bytes`), and how it ended.
#[derive(Debug)]
pub struct Output {
    /// How it ended; `None` when it ran past its time and was killed.
    pub status: Option<ExitStatus>,
    /// Its stdout.
    pub stdout: Vec<u8>,
    /// Its stderr.
    pub stderr: Vec<u8>,
}

impl Sandboxed {
    /// The layers in force for it.
    pub fn isolation(&self) -> &Isolation {
        &self.isolation
    }

    /// With [`crate::Network::Mediated`] in force: the host's end of the socket its egress
    /// descriptors arrive through (once), for the caller to serve with its policy; its connects wait
    /// until then.
    pub fn take_egress(&mut self) -> Option<crate::EgressChannel> {
        self.child.egress.take()
    }

    /// Its stdout, to read as it comes (once).
    pub fn take_stdout(&mut self) -> Option<tokio::net::unix::pipe::Receiver> {
        self.child.stdout.take()
    }

    /// Its stderr, to read as it comes (once).
    pub fn take_stderr(&mut self) -> Option<tokio::net::unix::pipe::Receiver> {
        self.child.stderr.take()
    }

    /// Waits for it to end (everything it started ends with it: its PID namespace's init kills the
    /// rest). Cancel-safe.
    pub async fn wait(&mut self) -> Result<ExitStatus, Error> {
        self.child
            .process
            .wait()
            .await
            .map_err(|e| Error::io_pathless("waiting for the sandboxed process", e))
    }

    /// Kills everything it started, now.
    pub fn kill(&self) {
        self.child.guard.kill();
    }

    /// Whether the kernel killed one of its processes for going over the memory limit.
    pub fn oom_killed(&self) -> bool {
        self.child.cgroup.as_ref().is_some_and(|cg| cg.oom_killed())
    }

    /// Waits up to `timeout` (then kills it), keeping the first `max_bytes` of each stream.
    pub async fn wait_with_output(
        &mut self,
        timeout: Duration,
        max_bytes: usize,
    ) -> Result<Output, Error> {
        async fn read(pipe: Option<tokio::net::unix::pipe::Receiver>, max: usize) -> Vec<u8> {
            let mut kept = Vec::new();
            let Some(mut pipe) = pipe else {
                return kept;
            };
            let mut buf = vec![0u8; 16 << 10];
            while let Ok(n) = pipe.read(&mut buf).await {
                if n == 0 {
                    break;
                }
                let room = max.saturating_sub(kept.len());
                kept.extend_from_slice(&buf[..n.min(room)]);
            }
            kept
        }
        let (out, err) = (self.take_stdout(), self.take_stderr());
        let all = async {
            let ended = async {
                let status = self.wait().await;
                // Whatever it left holding its pipes (without a PID namespace) ends with it.
                self.kill();
                status
            };
            tokio::join!(ended, read(out, max_bytes), read(err, max_bytes))
        };
        match tokio::time::timeout(timeout, all).await {
            Ok((status, stdout, stderr)) => Ok(Output {
                status: Some(status?),
                stdout,
                stderr,
            }),
            Err(_) => {
                self.kill();
                Ok(Output {
                    status: None,
                    stdout: Vec::new(),
                    stderr: Vec::new(),
                })
            }
        }
    }

    /// Where it wrote, held since before it started.
    pub fn scratch(&self) -> &Scratch {
        &self.scratch
    }
}

impl Drop for Sandboxed {
    fn drop(&mut self) {
        self.child.guard.kill();
        if let Some(run_dir) = self.run_dir.take() {
            discard_run_dir(run_dir);
        }
    }
}

/// A sandboxed process's scratch, as the host holds it: a descriptor taken before the process
/// started, read beneath only.
#[derive(Debug)]
pub struct Scratch(BeneathDir);

impl Scratch {
    /// Copies the tree `from` (relative: `work/site`) to the new host directory `to`: regular files
    /// and directories only, at most `max_bytes` (blocking; see [`CopyReport`]).
    pub fn copy_out(&self, from: &Path, to: &Path, max_bytes: u64) -> Result<CopyReport, Error> {
        copy_tree(&self.0, from, to, max_bytes)
    }

    /// Whether `rel` is a directory beneath the scratch.
    pub fn has_dir(&self, rel: &Path) -> bool {
        self.0.path(rel).is_ok()
    }

    /// The scratch, read beneath only.
    pub fn dir(&self) -> &BeneathDir {
        &self.0
    }

    /// Another handle on the same scratch (for a blocking task).
    pub fn try_clone(&self) -> Result<Scratch, Error> {
        self.0
            .try_clone()
            .map(Scratch)
            .map_err(|e| Error::io_pathless("duplicating the scratch's descriptor", e))
    }
}
