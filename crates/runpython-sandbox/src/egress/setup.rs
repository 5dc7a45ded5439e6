//! The run's side of egress, between fork and exec: async-signal-safe system calls only.
//!
//! The run's first process, still holding the capabilities of the user namespace that owns the
//! run's (empty) network namespace, brings its loopback up and makes the host's endpoints inside it:
//! the resolver's UDP socket and TCP listener on `127.0.0.1:53` and the relay's listeners on
//! `127.0.0.1:`[`RELAY_PORT`] and `[::1]:`[`RELAY_PORT`]. It sends them to the host (message `S`) and
//! closes its copies, so the code never holds them. The interpreter, last before exec, installs the
//! filter that turns every `connect(2)` (with the guard, `bind(2)`, `listen(2)` and the device
//! `ioctl(2)`s too: [`super::filter`]) into a notification for the host and sends the host the
//! listener (message `L`), closing its own copy too: a process that held it could answer its own
//! calls.

use std::os::fd::RawFd;

use crate::fd::pass::send_with_fds;
use crate::sys::{cvt, cvt_long, AtStep, Step, StepError};

/// The relay's port inside the run's network namespace (on `127.0.0.1` and `::1`).
pub(crate) const RELAY_PORT: u16 = 1;

/// The resolver's port inside the run's network namespace (on `127.0.0.1`).
pub(crate) const DNS_PORT: u16 = 53;

/// The first byte of the message carrying the resolver's and relay's sockets.
pub(crate) const SOCKETS: u8 = b'S';

/// The first byte of the message carrying the connect notifier's listener.
pub(crate) const LISTENER: u8 = b'L';

/// Brings the loopback up, makes the host's sockets and sends them over `sock`.
pub(crate) fn make_sockets(sock: RawFd) -> Result<(), StepError> {
    crate::netns::loopback_up()?;
    let mut fds = [-1; 4];
    let made = (|| -> Result<usize, StepError> {
        let v4 = libc::INADDR_LOOPBACK.to_be();
        fds[0] = bound(libc::AF_INET, libc::SOCK_DGRAM, v4, DNS_PORT, 0)?;
        fds[1] = bound(libc::AF_INET, libc::SOCK_STREAM, v4, DNS_PORT, 64)?;
        fds[2] = bound(libc::AF_INET, libc::SOCK_STREAM, v4, RELAY_PORT, 4096)?;
        // IPv6 may be off in the namespace: the relay then serves IPv4 sockets only.
        let mut n = 3;
        if let Ok(fd) = bound6(RELAY_PORT, 4096) {
            fds[3] = fd;
            n = 4;
        }
        Ok(n)
    })();
    let sent =
        made.and_then(|n| send_with_fds(sock, &[SOCKETS], &fds[..n]).at(Step::EgressSockets));
    for fd in fds.into_iter().filter(|&fd| fd >= 0) {
        // SAFETY: closing descriptors this function opened.
        unsafe { libc::close(fd) };
    }
    sent
}

/// A close-on-exec IPv4 socket of `kind` bound to `addr:port` (network byte order address), listening
/// with `backlog` when it is a stream socket.
fn bound(
    family: libc::c_int,
    kind: libc::c_int,
    addr: u32,
    port: u16,
    backlog: libc::c_int,
) -> Result<RawFd, StepError> {
    // SAFETY: socket/bind/listen on a sockaddr_in built on the stack.
    unsafe {
        let fd = cvt(libc::socket(family, kind | libc::SOCK_CLOEXEC, 0)).at(Step::EgressSockets)?;
        let sa = libc::sockaddr_in {
            sin_family: libc::AF_INET as libc::sa_family_t,
            sin_port: port.to_be(),
            sin_addr: libc::in_addr { s_addr: addr },
            sin_zero: [0; 8],
        };
        let result = cvt(libc::bind(
            fd,
            std::ptr::addr_of!(sa).cast(),
            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
        ))
        .and_then(|_| {
            if kind == libc::SOCK_STREAM {
                cvt(libc::listen(fd, backlog))
            } else {
                Ok(0)
            }
        });
        match result {
            Ok(_) => Ok(fd),
            Err(e) => {
                libc::close(fd);
                Err(StepError::new(
                    Step::EgressSockets,
                    crate::sys::errno_of(&e),
                ))
            }
        }
    }
}

/// A close-on-exec IPv6-only stream socket listening on `[::1]:port`.
fn bound6(port: u16, backlog: libc::c_int) -> Result<RawFd, StepError> {
    // SAFETY: socket/setsockopt/bind/listen on a sockaddr_in6 built on the stack.
    unsafe {
        let fd = cvt(libc::socket(
            libc::AF_INET6,
            libc::SOCK_STREAM | libc::SOCK_CLOEXEC,
            0,
        ))
        .at(Step::EgressSockets)?;
        let one: libc::c_int = 1;
        let mut sa: libc::sockaddr_in6 = std::mem::zeroed();
        sa.sin6_family = libc::AF_INET6 as libc::sa_family_t;
        sa.sin6_port = port.to_be();
        sa.sin6_addr.s6_addr[15] = 1;
        let result = cvt(libc::setsockopt(
            fd,
            libc::IPPROTO_IPV6,
            libc::IPV6_V6ONLY,
            std::ptr::addr_of!(one).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        ))
        .and_then(|_| {
            cvt(libc::bind(
                fd,
                std::ptr::addr_of!(sa).cast(),
                std::mem::size_of::<libc::sockaddr_in6>() as libc::socklen_t,
            ))
        })
        .and_then(|_| cvt(libc::listen(fd, backlog)));
        match result {
            Ok(_) => Ok(fd),
            Err(e) => {
                libc::close(fd);
                Err(StepError::new(
                    Step::EgressSockets,
                    crate::sys::errno_of(&e),
                ))
            }
        }
    }
}

/// Installs the connect notifier's program (`no_new_privs` must be set, or the capability to skip it),
/// guarded or not ([`super::filter::program`], taken before the fork), and sends its listener over
/// `sock`. A call waiting on the host can then only be killed, not interrupted, once the host took it
/// (`WAIT_KILLABLE_RECV`): a signal handler cannot make it return half-done.
pub(crate) fn install_notifier(sock: RawFd, filter: &[libc::sock_filter]) -> Result<(), StepError> {
    let prog = libc::sock_fprog {
        len: filter.len() as libc::c_ushort,
        filter: filter.as_ptr().cast_mut(),
    };
    let flags =
        libc::SECCOMP_FILTER_FLAG_NEW_LISTENER | libc::SECCOMP_FILTER_FLAG_WAIT_KILLABLE_RECV;
    // SAFETY: seccomp(2) reads the program, which outlives the call.
    let listener = cvt_long(unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_SET_MODE_FILTER,
            flags,
            std::ptr::addr_of!(prog),
        )
    })
    .at(Step::EgressNotifier)? as RawFd;
    let sent = send_with_fds(sock, &[LISTENER], &[listener]).at(Step::EgressNotifier);
    // SAFETY: closing the listener this process must not keep.
    unsafe { libc::close(listener) };
    sent
}

/// The connect notifier's program as the bytes of its `struct sock_filter` array (native byte order),
/// for a run forked from a template, which installs it itself.
pub(crate) fn program_bytes(guarded: bool) -> Vec<u8> {
    let program = super::filter::program(guarded);
    let mut bytes = Vec::with_capacity(program.len() * 8);
    for insn in program {
        bytes.extend_from_slice(&insn.code.to_ne_bytes());
        bytes.push(insn.jt);
        bytes.push(insn.jf);
        bytes.extend_from_slice(&insn.k.to_ne_bytes());
    }
    bytes
}
