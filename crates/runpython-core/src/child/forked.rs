//! A run forked from a template, as the host holds it once it runs: its init's pidfd (killing the
//! init kills the run's whole PID namespace) and the pipe its init reports the interpreter's wait
//! status on. A leaf: it knows nothing of templates (`template/` makes these).

use std::os::fd::{AsRawFd, OwnedFd};

use tokio::io::AsyncReadExt;

/// The pidfd of a forked run's init: killing the init kills the run's whole PID namespace. Kills it
/// when dropped.
#[derive(Debug)]
pub(crate) struct Init(pub(crate) Option<OwnedFd>);

impl Init {
    /// Whether the init is still there (its pidfd becomes readable when it exits).
    pub(crate) fn alive(&self) -> bool {
        let Some(init) = &self.0 else {
            return false;
        };
        let mut poll = libc::pollfd {
            fd: init.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: poll on one live descriptor, without waiting.
        unsafe { libc::poll(&mut poll, 1, 0) == 0 }
    }

    /// The init's pid in the host's PID namespace (read from its pidfd), while it is there.
    pub(crate) fn pid(&self) -> Option<libc::pid_t> {
        let init = self.0.as_ref()?;
        let info =
            std::fs::read_to_string(format!("/proc/self/fdinfo/{}", init.as_raw_fd())).ok()?;
        info.lines()
            .find_map(|line| line.strip_prefix("Pid:"))
            .and_then(|pid| pid.trim().parse().ok())
            .filter(|pid: &libc::pid_t| *pid > 0)
    }

    pub(crate) fn kill(&self) {
        if let Some(init) = &self.0 {
            let _ = runpython_sandbox::fd::pidfd_signal(init.as_raw_fd(), libc::SIGKILL);
        }
    }
}

impl Drop for Init {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A run forked from a template, running: its init, the status pipe, and what to do when it ends
/// (the template's: keep itself alive meanwhile, then make a replacement fork).
pub(crate) struct ForkedRun {
    init: Init,
    /// It passed the host's check of its sandbox: held while the run lives, so that no later run
    /// is found in one of its namespaces.
    _verified: runpython_sandbox::VerifiedRun,
    status: tokio::net::unix::pipe::Receiver,
    read: [u8; 4],
    got: usize,
    on_end: Option<Box<dyn FnOnce() + Send + Sync>>,
}

impl std::fmt::Debug for ForkedRun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ForkedRun")
            .field("init", &self.init)
            .field("got", &self.got)
            .finish_non_exhaustive()
    }
}

impl ForkedRun {
    pub(crate) fn new(
        init: Init,
        verified: runpython_sandbox::VerifiedRun,
        status: tokio::net::unix::pipe::Receiver,
        on_end: Box<dyn FnOnce() + Send + Sync>,
    ) -> Self {
        Self {
            init,
            _verified: verified,
            status,
            read: [0; 4],
            got: 0,
            on_end: Some(on_end),
        }
    }

    /// The interpreter's wait status, once it has ended; a run whose init was killed first ended by
    /// `SIGKILL`. Cancel-safe: what was read is kept.
    pub(crate) async fn wait(&mut self) -> std::io::Result<std::process::ExitStatus> {
        use std::os::unix::process::ExitStatusExt;
        while self.got < 4 {
            match self.status.read(&mut self.read[self.got..]).await {
                Ok(0) => return Ok(std::process::ExitStatus::from_raw(libc::SIGKILL)),
                Ok(n) => self.got += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(std::process::ExitStatus::from_raw(i32::from_ne_bytes(
            self.read,
        )))
    }

    /// Kills the run (its init, and with it its PID namespace).
    pub(crate) fn kill(&self) {
        self.init.kill();
    }
}

impl Drop for ForkedRun {
    fn drop(&mut self) {
        self.init.kill();
        if let Some(on_end) = self.on_end.take() {
            on_end();
        }
    }
}
