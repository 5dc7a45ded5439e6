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

/// Sends `fd` over the Unix socket `sock` (`SCM_RIGHTS`). Async-signal-safe: the control message is
/// built on the stack.
pub(crate) fn send_fd(sock: RawFd, fd: RawFd) -> io::Result<()> {
    send_with_fds(sock, &[0u8], &[fd])
}

/// Room for one `SCM_RIGHTS` message of up to [`MAX_FDS`] descriptors, aligned for `cmsghdr`.
#[repr(C)]
union Control {
    header: libc::cmsghdr,
    bytes: [u8; 128],
}

/// The most descriptors one message carries.
pub(crate) const MAX_FDS: usize = 16;

/// Sends `data` (small: one `sendmsg`) with `fds` attached (`SCM_RIGHTS`, at most `MAX_FDS`).
/// Async-signal-safe: the control message is built on the stack. A short write is an error.
pub fn send_with_fds(sock: RawFd, data: &[u8], fds: &[RawFd]) -> io::Result<()> {
    let mut iov = libc::iovec {
        iov_base: data.as_ptr().cast_mut().cast(),
        iov_len: data.len(),
    };
    let mut control = Control { bytes: [0; 128] };
    let fds_bytes = std::mem::size_of_val(fds) as u32;
    // SAFETY: msghdr is plain data; the CMSG macros work within `control`, which is large and
    // aligned enough for the descriptors (checked against CMSG_SPACE); sendmsg only reads `data`.
    unsafe {
        let space = libc::CMSG_SPACE(fds_bytes) as usize;
        if fds.is_empty() || fds.len() > MAX_FDS || space > std::mem::size_of::<Control>() {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = std::ptr::addr_of_mut!(control).cast();
        msg.msg_controllen = space as _;
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        (*cmsg).cmsg_level = libc::SOL_SOCKET;
        (*cmsg).cmsg_type = libc::SCM_RIGHTS;
        (*cmsg).cmsg_len = libc::CMSG_LEN(fds_bytes) as _;
        let data_ptr = libc::CMSG_DATA(cmsg).cast::<RawFd>();
        for (i, fd) in fds.iter().enumerate() {
            std::ptr::write_unaligned(data_ptr.add(i), *fd);
        }
        let sent = libc::sendmsg(sock, &msg, libc::MSG_NOSIGNAL);
        if sent < 0 {
            return Err(io::Error::last_os_error());
        }
        if sent as usize != data.len() {
            return Err(io::Error::new(io::ErrorKind::WriteZero, "a short sendmsg"));
        }
    }
    Ok(())
}

/// A connected pair of close-on-exec `SOCK_SEQPACKET` Unix sockets.
pub fn seqpacket_pair() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [-1; 2];
    // SAFETY: socketpair fills the two-element array.
    cvt(unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
            0,
            fds.as_mut_ptr(),
        )
    })?;
    // SAFETY: both descriptors were just created and are owned by nobody else.
    unsafe { Ok((OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1]))) }
}

/// Receives one descriptor sent with `send_fd` on `sock`, without waiting: it must be there already.
pub fn recv_fd(sock: RawFd) -> io::Result<OwnedFd> {
    let mut byte = [0u8; 1];
    let (_, fds) = recv_with_fds(sock, &mut byte)?;
    fds.into_iter()
        .next()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "no descriptor in the message"))
}

/// Receives one message and the descriptors sent with it (`SCM_RIGHTS`), without waiting: a full
/// message, or `WouldBlock`. A message or descriptor list larger than its buffer is an error.
pub fn recv_with_fds(sock: RawFd, buf: &mut [u8]) -> io::Result<(usize, Vec<OwnedFd>)> {
    recv_with_fds_and_sender(sock, buf).map(|(n, fds, _)| (n, fds))
}

/// Like [`recv_with_fds`], and the sender's pid in this process's PID namespace as the kernel
/// attached it (`SCM_CREDENTIALS`: present when the socket has `SO_PASSCRED`, see [`pass_credentials`]).
pub fn recv_with_fds_and_sender(
    sock: RawFd,
    buf: &mut [u8],
) -> io::Result<(usize, Vec<OwnedFd>, Option<libc::pid_t>)> {
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let mut control = Control { bytes: [0; 128] };
    // SAFETY: msghdr is plain data; recvmsg writes within `buf` and `control` (their sizes given);
    // the descriptors the kernel installed are new and owned by us from here on.
    unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = std::ptr::addr_of_mut!(control).cast();
        msg.msg_controllen = std::mem::size_of::<Control>() as _;
        let n = libc::recvmsg(sock, &mut msg, libc::MSG_DONTWAIT | libc::MSG_CMSG_CLOEXEC);
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut fds = Vec::new();
        let mut sender = None;
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(cmsg).cast::<RawFd>();
                let len = (*cmsg).cmsg_len as usize - libc::CMSG_LEN(0) as usize;
                for i in 0..len / std::mem::size_of::<RawFd>() {
                    fds.push(OwnedFd::from_raw_fd(std::ptr::read_unaligned(data.add(i))));
                }
            } else if (*cmsg).cmsg_level == libc::SOL_SOCKET
                && (*cmsg).cmsg_type == libc::SCM_CREDENTIALS
            {
                let creds: libc::ucred =
                    std::ptr::read_unaligned(libc::CMSG_DATA(cmsg).cast::<libc::ucred>());
                // 0: the sender is outside this process's PID namespace.
                sender = (creds.pid > 0).then_some(creds.pid);
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
        if msg.msg_flags & (libc::MSG_TRUNC | libc::MSG_CTRUNC) != 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "a message longer than its buffer (or with too many descriptors)",
            ));
        }
        Ok((n as usize, fds, sender))
    }
}

/// Asks the kernel to attach each sender's credentials to what `sock` receives (`SO_PASSCRED`).
pub fn pass_credentials(sock: RawFd) -> io::Result<()> {
    let on: libc::c_int = 1;
    // SAFETY: setsockopt with a pointer to a live int and its size.
    cvt(unsafe {
        libc::setsockopt(
            sock,
            libc::SOL_SOCKET,
            libc::SO_PASSCRED,
            std::ptr::addr_of!(on).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    })
    .map(drop)
}

/// Sends `signal` to the process behind the pidfd `fd` (`pidfd_send_signal`); a process that is gone
/// already is not an error.
pub fn pidfd_signal(fd: RawFd, signal: libc::c_int) -> io::Result<()> {
    // SAFETY: the system call takes a descriptor, a signal number, no siginfo and no flags.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            fd,
            signal,
            std::ptr::null::<libc::siginfo_t>(),
            0u32,
        )
    };
    match cvt_long(rc) {
        Err(e) if e.raw_os_error() == Some(libc::ESRCH) => Ok(()),
        r => r.map(drop),
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
