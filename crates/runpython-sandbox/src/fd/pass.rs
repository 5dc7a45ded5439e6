//! Descriptors between processes: pipes, `SCM_RIGHTS` messages (a descriptor, or several with a
//! small message; the sender's credentials when asked), socket pairs, and signals by pidfd. What is
//! marked async-signal-safe may run between fork and exec.

use std::io;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};

pub use crate::sys::pipe;
use crate::sys::{cvt, cvt_long};

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

/// Like `recv_with_fds`, and the sender's pid in this process's PID namespace as the kernel
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
