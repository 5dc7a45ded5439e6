//! The thread whose call the host answers: its memory (read and written with `process_vm_*`, never
//! through a path), a copy of one of its descriptors (`pidfd_getfd`), that descriptor's
//! close-on-exec flag, its capabilities, and the descriptor the host puts in its place
//! (`SECCOMP_IOCTL_NOTIF_ADDFD`). Whatever is read here may change under the host's feet: the
//! callers act on the copies they took, never on what the thread holds later.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// `PIDFD_THREAD` (Linux 6.9): a pidfd for a thread, not only a thread group's leader.
const PIDFD_THREAD: libc::c_uint = libc::O_EXCL as libc::c_uint;

/// Reads `len` bytes at `addr` of `tid`'s memory (fewer where its mapping ends).
pub(super) fn read_memory(tid: libc::pid_t, addr: u64, len: usize) -> io::Result<Vec<u8>> {
    let mut buf = vec![0u8; len];
    let local = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: len,
    };
    let remote = libc::iovec {
        iov_base: addr as *mut libc::c_void,
        iov_len: len,
    };
    // SAFETY: process_vm_readv writes at most `len` bytes into `buf`.
    let n = unsafe { libc::process_vm_readv(tid, &local, 1, &remote, 1, 0) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    buf.truncate(n as usize);
    Ok(buf)
}

/// Reads exactly `len` bytes at `addr`, or `EFAULT` (as the kernel answers a bad pointer).
pub(super) fn read_exact(tid: libc::pid_t, addr: u64, len: usize) -> Result<Vec<u8>, i32> {
    match read_memory(tid, addr, len) {
        Ok(bytes) if bytes.len() == len => Ok(bytes),
        _ => Err(libc::EFAULT),
    }
}

/// Writes `bytes` at `addr` of `tid`'s memory, all or `EFAULT`.
pub(super) fn write_memory(tid: libc::pid_t, addr: u64, bytes: &[u8]) -> Result<(), i32> {
    let local = libc::iovec {
        iov_base: bytes.as_ptr().cast_mut().cast(),
        iov_len: bytes.len(),
    };
    let remote = libc::iovec {
        iov_base: addr as *mut libc::c_void,
        iov_len: bytes.len(),
    };
    // SAFETY: process_vm_writev reads `bytes.len()` bytes of `bytes`.
    let n = unsafe { libc::process_vm_writev(tid, &local, 1, &remote, 1, 0) };
    if n < 0 || n as usize != bytes.len() {
        return Err(libc::EFAULT);
    }
    Ok(())
}

/// A pidfd of thread `tid` (`PIDFD_THREAD`), or of its thread group's leader on kernels without it
/// (the descriptor table is the same).
pub(super) fn thread_pidfd(tid: libc::pid_t) -> io::Result<OwnedFd> {
    let open = |pid: libc::pid_t, flags: libc::c_uint| -> io::Result<OwnedFd> {
        // SAFETY: pidfd_open returns a new descriptor or -1.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, flags) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a new descriptor owned by nobody else.
        Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
    };
    match open(tid, PIDFD_THREAD) {
        Ok(fd) => Ok(fd),
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
            let status = std::fs::read_to_string(format!("/proc/{tid}/status"))?;
            let tgid = status
                .lines()
                .find_map(|l| l.strip_prefix("Tgid:"))
                .and_then(|v| v.trim().parse().ok())
                .ok_or_else(|| io::Error::from_raw_os_error(libc::ESRCH))?;
            open(tgid, 0)
        }
        Err(e) => Err(e),
    }
}

/// A copy of `tid`'s descriptor `fd` (the same open file), close-on-exec.
pub(super) fn copy_fd(tid: libc::pid_t, fd: RawFd) -> io::Result<OwnedFd> {
    let pidfd = thread_pidfd(tid)?;
    // SAFETY: pidfd_getfd returns a new descriptor (close-on-exec) or -1.
    let dup = unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), fd, 0) };
    if dup < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a new descriptor owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(dup as RawFd) })
}

/// Whether `tid`'s descriptor `fd` is close-on-exec (`/proc/TID/fdinfo/FD`'s flags, octal).
pub(super) fn cloexec(tid: libc::pid_t, fd: RawFd) -> bool {
    let Ok(info) = std::fs::read_to_string(format!("/proc/{tid}/fdinfo/{fd}")) else {
        return true; // Python's sockets, and most others, are
    };
    info.lines()
        .find_map(|l| l.strip_prefix("flags:"))
        .and_then(|v| i64::from_str_radix(v.trim(), 8).ok())
        .is_none_or(|flags| flags & i64::from(libc::O_CLOEXEC) != 0)
}

/// Whether `tid` holds capability `cap` in its effective set.
pub(super) fn has_capability(tid: libc::pid_t, cap: u32) -> bool {
    let Ok(status) = std::fs::read_to_string(format!("/proc/{tid}/status")) else {
        return false;
    };
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .is_some_and(|caps| caps & (1u64 << cap) != 0)
}

/// Puts `fd` (the host's) at descriptor number `at` of the thread whose notification `id` is,
/// replacing what was there (the kernel's `dup2`), close-on-exec when `cloexec`. `Err(ENOENT)`: the
/// notification is gone.
pub(super) fn install_fd(
    listener: RawFd,
    id: u64,
    fd: RawFd,
    at: RawFd,
    cloexec: bool,
) -> Result<(), i32> {
    let addfd = libc::seccomp_notif_addfd {
        id,
        flags: libc::SECCOMP_ADDFD_FLAG_SETFD as u32,
        srcfd: fd as u32,
        newfd: at as u32,
        newfd_flags: if cloexec { libc::O_CLOEXEC as u32 } else { 0 },
    };
    // SAFETY: an ioctl reading the struct.
    let rc = unsafe { libc::ioctl(listener, libc::SECCOMP_IOCTL_NOTIF_ADDFD, &addfd) };
    if rc < 0 {
        return Err(io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EIO));
    }
    Ok(())
}
