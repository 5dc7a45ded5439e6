//! The call being answered (a seccomp user notification): the thread that made it, the descriptor it
//! names, and what the host answers. A leaf: the notifier, the calls the host performs and the
//! handover all speak of it.

use std::os::fd::{OwnedFd, RawFd};

use super::sock::MAX_ADDR;
use super::target;

/// How the host answers one notification.
pub(super) enum Answer {
    /// The kernel's own call.
    Continue,
    /// The call returns this (a value, or an errno as `Err`).
    Return(Result<i64, i32>),
    /// The notification is gone (the thread was killed): nothing to answer.
    Gone,
}

/// The call being answered: the thread that made it, the descriptor it names, and the notification.
pub(super) struct Call {
    pub tid: libc::pid_t,
    pub fd: RawFd,
    pub listener: RawFd,
    pub id: u64,
}

impl Call {
    /// Whether the thread still waits for this answer (its descriptors are still the ones read).
    pub(super) fn alive(&self) -> bool {
        id_valid(self.listener, self.id)
    }

    /// A copy of the descriptor the call names (the same open file).
    pub(super) fn copy(&self) -> Result<OwnedFd, i32> {
        target::copy_fd(self.tid, self.fd).map_err(|e| e.raw_os_error().unwrap_or(libc::EBADF))
    }

    /// The `len` bytes of the address at `addr`: `EINVAL` past a `sockaddr_storage` (as the kernel
    /// answers), `EFAULT` where the memory cannot be read.
    pub(super) fn address(&self, addr: u64, len: u64) -> Result<Vec<u8>, i32> {
        let len = usize::try_from(len).map_err(|_| libc::EINVAL)?;
        if len > MAX_ADDR {
            return Err(libc::EINVAL);
        }
        target::read_exact(self.tid, addr, len)
    }
}

/// Whether notification `id` is still pending on `listener` (`SECCOMP_IOCTL_NOTIF_ID_VALID`).
pub(super) fn id_valid(listener: RawFd, id: u64) -> bool {
    // SAFETY: an ioctl reading a u64.
    unsafe { libc::ioctl(listener, libc::SECCOMP_IOCTL_NOTIF_ID_VALID, &id) == 0 }
}
