//! The system calls the sandbox makes, wrapped once, and the named setup steps that failures report.
//!
//! Everything here may run between fork and exec (in S, G or H): no allocation, no locks, plain system
//! calls on values prepared in the host. A failure carries its [`Step`] and errno as a [`StepError`], a
//! `Copy` value that crosses a pipe as 8 bytes (from G or H) or std's exec-error channel as one `i32`
//! (from S), so the host can say which step failed instead of a bare errno.

use std::ffi::CStr;
use std::fmt;
use std::io;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};

/// A step of the sandbox's setup (or of a probe), named in errors and in `isolation.missing`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u16)]
pub(crate) enum Step {
    Unshare = 1,
    WriteSetgroups,
    WriteUidMap,
    WriteGidMap,
    ForbidNestedUserns,
    DropIds,
    Pdeathsig,
    Dumpable,
    Hostname,
    JoinOwnerUserns,
    JoinNetns,
    MountPrivate,
    OpenBindSource,
    MountTmpfs,
    MakeMountPoint,
    BindMount,
    MountProc,
    Chdir,
    Rlimit,
    NoNewPrivs,
    LandlockRule,
    LandlockRestrict,
    Seccomp,
    SharedPage,
    ReportPipe,
    ChildStacks,
    CloneInit,
    CloneInterpreter,
    Exec,
    Fork,
    InitDied,
    SeccompRefused,
}

impl Step {
    const ALL: [Step; 32] = [
        Step::Unshare,
        Step::WriteSetgroups,
        Step::WriteUidMap,
        Step::WriteGidMap,
        Step::ForbidNestedUserns,
        Step::DropIds,
        Step::Pdeathsig,
        Step::Dumpable,
        Step::Hostname,
        Step::JoinOwnerUserns,
        Step::JoinNetns,
        Step::MountPrivate,
        Step::OpenBindSource,
        Step::MountTmpfs,
        Step::MakeMountPoint,
        Step::BindMount,
        Step::MountProc,
        Step::Chdir,
        Step::Rlimit,
        Step::NoNewPrivs,
        Step::LandlockRule,
        Step::LandlockRestrict,
        Step::Seccomp,
        Step::SharedPage,
        Step::ReportPipe,
        Step::ChildStacks,
        Step::CloneInit,
        Step::CloneInterpreter,
        Step::Exec,
        Step::Fork,
        Step::InitDied,
        Step::SeccompRefused,
    ];

    /// What the step does, for a person.
    pub(crate) fn describe(self) -> &'static str {
        match self {
            Step::Unshare => "creating the run's namespaces (unshare)",
            Step::WriteSetgroups => "writing /proc/self/setgroups",
            Step::WriteUidMap => "writing /proc/self/uid_map",
            Step::WriteGidMap => "writing /proc/self/gid_map",
            Step::ForbidNestedUserns => "forbidding nested user namespaces (max_user_namespaces)",
            Step::DropIds => "dropping to the run's uid and gid",
            Step::Pdeathsig => "setting the parent-death signal",
            Step::Dumpable => "setting the dumpable flag",
            Step::Hostname => "setting the run's host name",
            Step::JoinOwnerUserns => "joining the user namespace that owns the network namespace",
            Step::JoinNetns => "joining the run's network namespace",
            Step::MountPrivate => "making the mount tree private",
            Step::OpenBindSource => "opening a directory to bind into the run",
            Step::MountTmpfs => "mounting a tmpfs",
            Step::MakeMountPoint => "creating a mount point",
            Step::BindMount => "bind-mounting a directory into the run",
            Step::MountProc => "mounting the run's /proc",
            Step::Chdir => "entering the run's working directory",
            Step::Rlimit => "setting a resource limit",
            Step::NoNewPrivs => "setting no_new_privs",
            Step::LandlockRule => "adding a Landlock rule",
            Step::LandlockRestrict => "restricting the interpreter with Landlock",
            Step::Seccomp => "installing the seccomp filter",
            Step::SharedPage => "mapping the status page shared with the run's init",
            Step::ReportPipe => "creating the setup report pipe",
            Step::ChildStacks => "mapping the stacks of the run's init and interpreter",
            Step::CloneInit => "starting the run's init process (PID 1 of its namespace)",
            Step::CloneInterpreter => "starting the interpreter process",
            Step::Exec => "executing the interpreter",
            Step::Fork => "forking a probe",
            Step::InitDied => "waiting for the run's init to finish setting up (it died)",
            Step::SeccompRefused => "checking that the seccomp filter refuses a denied call",
        }
    }

    fn from_code(code: u16) -> Option<Step> {
        Step::ALL.into_iter().find(|s| *s as u16 == code)
    }
}

/// A setup step that failed, with the errno it failed with. `Copy` and allocation-free.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct StepError {
    pub step: Step,
    pub errno: i32,
}

/// Codes at or above this in an `io::Error` from S's pre-exec hook carry a step (see [`StepError::to_io`]).
const STEP_SHIFT: u32 = 16;

impl StepError {
    pub(crate) fn new(step: Step, errno: i32) -> Self {
        Self { step, errno }
    }

    /// `step` failed with the calling thread's errno.
    pub(crate) fn last(step: Step) -> Self {
        Self::new(step, errno_of(&io::Error::last_os_error()))
    }

    pub(crate) fn encode(self) -> [u8; 8] {
        let mut out = [0u8; 8];
        out[..4].copy_from_slice(&u32::from(self.step as u16).to_ne_bytes());
        out[4..].copy_from_slice(&self.errno.to_ne_bytes());
        out
    }

    pub(crate) fn decode(bytes: [u8; 8]) -> Option<Self> {
        let mut code = [0u8; 4];
        code.copy_from_slice(&bytes[..4]);
        let mut errno = [0u8; 4];
        errno.copy_from_slice(&bytes[4..]);
        let step = u16::try_from(u32::from_ne_bytes(code))
            .ok()
            .and_then(Step::from_code)?;
        Some(Self::new(step, i32::from_ne_bytes(errno)))
    }

    /// For std's pre-exec hook, whose error reaches `spawn` as one raw OS error code: the step goes in
    /// the high bits (errno values stay far below 2^16).
    pub(crate) fn to_io(self) -> io::Error {
        let code = (i32::from(self.step as u16) << STEP_SHIFT) | (self.errno & 0xffff);
        io::Error::from_raw_os_error(code)
    }

    /// The inverse of [`StepError::to_io`]; `None` for a plain OS error.
    pub(crate) fn from_io(error: &io::Error) -> Option<Self> {
        let code = error.raw_os_error()?;
        let step = u16::try_from(code >> STEP_SHIFT)
            .ok()
            .and_then(Step::from_code)?;
        Some(Self::new(step, code & 0xffff))
    }

    /// The errno as an `io::Error`.
    pub(crate) fn source(self) -> io::Error {
        io::Error::from_raw_os_error(self.errno)
    }
}

impl fmt::Display for StepError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} failed: {}", self.step.describe(), self.source())
    }
}

/// Attaching a [`Step`] to an `io::Result`.
pub(crate) trait AtStep<T> {
    fn at(self, step: Step) -> Result<T, StepError>;
}

impl<T> AtStep<T> for io::Result<T> {
    fn at(self, step: Step) -> Result<T, StepError> {
        self.map_err(|e| StepError::new(step, errno_of(&e)))
    }
}

pub(crate) fn errno_of(e: &io::Error) -> i32 {
    e.raw_os_error().filter(|&n| n != 0).unwrap_or(libc::EIO)
}

pub(crate) fn cvt(rc: libc::c_int) -> io::Result<libc::c_int> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

pub(crate) fn cvt_long(rc: libc::c_long) -> io::Result<libc::c_long> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

/// The host's effective uid (through nix, as everywhere in the crate).
pub(crate) fn geteuid() -> u32 {
    nix::unistd::geteuid().as_raw()
}

/// The host's effective gid.
pub(crate) fn getegid() -> u32 {
    nix::unistd::getegid().as_raw()
}

/// A close-on-exec pipe: (read end, write end).
pub(crate) fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [-1; 2];
    // SAFETY: pipe2 fills the two-element array.
    cvt(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) })?;
    // SAFETY: both descriptors were just created and are owned by nobody else.
    unsafe { Ok((OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1]))) }
}

/// Opens `path` read-only, as a descriptor above the child's stdio, result and bridge slots.
pub(crate) fn open_high(path: &str) -> io::Result<OwnedFd> {
    let path = std::ffi::CString::new(path).map_err(io::Error::other)?;
    // SAFETY: open/fcntl/close on a NUL-terminated path and the descriptor just opened.
    unsafe {
        let fd = cvt(libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC))?;
        let high = libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 10);
        libc::close(fd);
        Ok(OwnedFd::from_raw_fd(cvt(high)?))
    }
}

/// Moves `fd` above the child's fixed descriptor slots (0..=4), close-on-exec.
pub(crate) fn dup_high(fd: OwnedFd) -> io::Result<OwnedFd> {
    use std::os::fd::AsRawFd;
    // SAFETY: F_DUPFD_CLOEXEC on a live descriptor; the duplicate is a fresh descriptor we own.
    let high = cvt(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 10) })?;
    // SAFETY: `high` was just created and nobody else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(high) })
}

/// Writes `data` to the file at `path`. Async-signal-safe.
pub(crate) fn write_file(path: &CStr, data: &[u8]) -> io::Result<()> {
    // SAFETY: plain open/write/close on a NUL-terminated path and a live buffer.
    unsafe {
        let fd = cvt(libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC))?;
        let n = libc::write(fd, data.as_ptr().cast(), data.len());
        libc::close(fd);
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Writes all of `buf` to `fd`, retrying on EINTR. Async-signal-safe.
pub(crate) fn write_all_fd(fd: RawFd, buf: &[u8]) {
    let mut done = 0;
    while done < buf.len() {
        // SAFETY: a write from a live buffer.
        let n = unsafe { libc::write(fd, buf[done..].as_ptr().cast(), buf.len() - done) };
        if n > 0 {
            done += n as usize;
        } else if n == 0 || io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            return;
        }
    }
}

/// Reads exactly `N` bytes from `fd` unless it reaches end of file first; retries on EINTR.
pub(crate) fn read_exact_fd<const N: usize>(fd: RawFd) -> Option<[u8; N]> {
    let mut buf = [0u8; N];
    let mut got = 0;
    while got < N {
        // SAFETY: a read into a live buffer, within its bounds.
        let n = unsafe { libc::read(fd, buf[got..].as_mut_ptr().cast(), N - got) };
        if n > 0 {
            got += n as usize;
        } else if n == 0 || io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            return None;
        }
    }
    Some(buf)
}

pub(crate) fn set_pdeathsig() -> io::Result<()> {
    // SAFETY: prctl with integer arguments.
    cvt(unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) }).map(drop)
}

pub(crate) fn set_rlimit(
    resource: libc::__rlimit_resource_t,
    soft: u64,
    hard: u64,
) -> io::Result<()> {
    let limit = libc::rlimit {
        rlim_cur: soft,
        rlim_max: hard,
    };
    // SAFETY: setrlimit with a live struct.
    cvt(unsafe { libc::setrlimit(resource, &limit) }).map(drop)
}

/// Waits for the child `pid` and returns its exit code (-1 when it was killed or cannot be waited for).
pub(crate) fn wait_exit_code(pid: libc::pid_t) -> i32 {
    let mut status = 0;
    loop {
        // SAFETY: waits for our own child.
        let r = unsafe { libc::waitpid(pid, &mut status, 0) };
        if r == pid {
            return if libc::WIFEXITED(status) {
                libc::WEXITSTATUS(status)
            } else {
                -1
            };
        }
        if r < 0 && io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            return -1;
        }
    }
}

/// Runs `check` in a forked child and returns what it returned. `check` may only make system calls on
/// values prepared before the fork (no allocation, no locks: the host is threaded). A child that dies
/// without answering is reported as `died`.
pub(crate) fn in_forked_child(
    died: Step,
    check: impl FnOnce() -> Result<(), StepError>,
) -> Result<(), StepError> {
    let (read, write) = pipe().at(Step::ReportPipe)?;
    // SAFETY: the child runs `check` (system calls only, per the contract above) and always _exits.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(StepError::last(Step::Fork));
    }
    if pid == 0 {
        use std::os::fd::AsRawFd;
        if let Err(e) = check() {
            write_all_fd(write.as_raw_fd(), &e.encode());
        }
        // SAFETY: ends the child only.
        unsafe { libc::_exit(0) }
    }
    drop(write);
    use std::os::fd::AsRawFd;
    let answer = read_exact_fd::<8>(read.as_raw_fd());
    let code = wait_exit_code(pid);
    match answer.and_then(StepError::decode) {
        Some(e) => Err(e),
        None if code == 0 => Ok(()),
        None => Err(StepError::new(died, libc::ECHILD)),
    }
}

/// Closes every descriptor from `first` up. Async-signal-safe.
pub(crate) fn close_from(first: u32) {
    // SAFETY: close_range on the rest of the table; the fallback closes one by one.
    unsafe {
        if libc::syscall(libc::SYS_close_range, first, u32::MAX, 0u32) != 0 {
            for fd in first..4096 {
                libc::close(fd as RawFd);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn step_errors_survive_both_channels() {
        for step in Step::ALL {
            let e = StepError::new(step, libc::EPERM);
            assert_eq!(StepError::decode(e.encode()), Some(e));
            assert_eq!(StepError::from_io(&e.to_io()), Some(e));
        }
        assert_eq!(
            StepError::from_io(&io::Error::from_raw_os_error(libc::ENOENT)),
            None
        );
    }

    #[test]
    fn a_step_error_names_the_step_and_the_errno() {
        let text = StepError::new(Step::WriteUidMap, libc::EPERM).to_string();
        assert!(text.contains("/proc/self/uid_map"), "{text}");
        assert!(text.contains("not permitted"), "{text}");
    }

    #[test]
    fn a_forked_check_reports_its_step() {
        assert_eq!(in_forked_child(Step::Fork, || Ok(())), Ok(()));
        assert_eq!(
            in_forked_child(Step::Fork, || Err(StepError::new(
                Step::MountProc,
                libc::EACCES
            ))),
            Err(StepError::new(Step::MountProc, libc::EACCES))
        );
    }
}
