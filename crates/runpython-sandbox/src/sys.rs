//! The system calls the sandbox makes, wrapped once.
//!
//! Everything here may run between fork and exec (in S, G or H): no allocation, no locks, plain system
//! calls on values prepared in the host. A failure carries its [`Step`] and errno as a [`StepError`]
//! (`step.rs`).

use std::ffi::CStr;
use std::io;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};

pub(crate) use crate::step::{errno_of, AtStep};
pub use crate::step::{Step, StepError};

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
pub fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
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
pub fn dup_high(fd: OwnedFd) -> io::Result<OwnedFd> {
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

pub fn set_pdeathsig() -> io::Result<()> {
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

/// Marks every descriptor from `first` up close-on-exec, so the interpreter inherits none of the host's
/// (a launcher's descriptors without the flag included) while the exec-error channels below still work
/// until the exec. Async-signal-safe.
pub(crate) fn cloexec_from(first: u32) -> io::Result<()> {
    // SAFETY: close_range with the CLOEXEC flag marks descriptors; the fallback sets the flag on each.
    unsafe {
        if libc::syscall(
            libc::SYS_close_range,
            first,
            u32::MAX,
            libc::CLOSE_RANGE_CLOEXEC,
        ) == 0
        {
            return Ok(());
        }
        let mut limit: libc::rlimit = std::mem::zeroed();
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit);
        let last = limit.rlim_cur.min(1 << 20) as i32;
        for fd in first as i32..last {
            let flags = libc::fcntl(fd, libc::F_GETFD);
            if flags >= 0 {
                libc::fcntl(fd, libc::F_SETFD, flags | libc::FD_CLOEXEC);
            }
        }
    }
    Ok(())
}

/// Zeroes `[start, end)` of the calling process's memory: the host's argv and environment strings in
/// a fork of it. Async-signal-safe.
pub(crate) fn zero_host_args((start, end): (usize, usize)) {
    if start == 0 || end <= start {
        return;
    }
    // SAFETY: the range is this process's initial stack strings (read from /proc/self/stat by the
    // host, the same addresses in its forks), writable; nothing here reads them afterwards.
    unsafe { std::ptr::write_bytes(start as *mut u8, 0, end - start) }
}

/// Leaves the calling process the way a child with wait `status` left: the same exit code, or killed
/// by the same signal. For a process that stands between the host and what it started, so the host
/// sees the status it would have seen without it. Async-signal-safe.
pub fn exit_like(status: libc::c_int) -> ! {
    // SAFETY: signal, sigprocmask, kill and _exit on this process only.
    unsafe {
        if libc::WIFSIGNALED(status) {
            let sig = libc::WTERMSIG(status);
            libc::signal(sig, libc::SIG_DFL);
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, sig);
            libc::sigprocmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
            libc::kill(libc::getpid(), sig);
            libc::_exit(128 + sig);
        }
        libc::_exit(if libc::WIFEXITED(status) {
            libc::WEXITSTATUS(status)
        } else {
            1
        })
    }
}

/// Closes every descriptor from `first` up. Async-signal-safe.
pub fn close_from(first: u32) {
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
