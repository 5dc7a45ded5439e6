//! The host's answer to each `connect(2)` of the run (seccomp user notifications).
//!
//! For each notification: read the address the code passed (`process_vm_readv`), check the
//! notification is still alive (`ID_VALID`, after every read of the target, so a recycled pid or a
//! reused descriptor number is never acted on), take a copy of the socket (`pidfd_getfd`), decide,
//! and answer. Anything the relay does not handle (Unix sockets, a server on the run's own loopback,
//! `AF_UNSPEC`) is the kernel's own connect (`CONTINUE`): every socket the run holds lives in its empty network
//! namespace, so whatever the kernel then does, even to an address the code changed after the host
//! read it, stays inside that namespace.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::Arc;

use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

use runpython_sandbox::EgressFds;

use super::relay::{Pending, Upstreaming};
use super::Shared;
use crate::policy::{effective_ip, Verdict};

/// The relay's port in the run's namespace.
const RELAY_PORT: u16 = EgressFds::RELAY_PORT;

/// `PIDFD_THREAD` (Linux 6.9): a pidfd for a thread, not only a thread group's leader.
const PIDFD_THREAD: libc::c_uint = libc::O_EXCL as libc::c_uint;

/// The longest socket address read from the run.
const MAX_ADDR: usize = std::mem::size_of::<libc::sockaddr_storage>();

/// How the host answers one notification.
enum Answer {
    /// The kernel's own connect.
    Continue,
    /// The call returns this (0, or a negative errno as `Err`).
    Return(Result<i64, i32>),
    /// The notification is gone (the thread was killed): nothing to answer.
    Gone,
}

/// Answers the run's connects until no process of the run is left.
pub(super) async fn serve(listener: OwnedFd, shared: Arc<Shared>) {
    // SAFETY: the `OwnedFd` stays open, the same file description, until the `AsyncFd` owning it
    // is dropped.
    let Ok(listener) = (unsafe { AsyncFd::register_with_interest(listener, Interest::READABLE) })
    else {
        return;
    };
    let listener = Arc::new(listener);
    loop {
        let Ok(mut guard) = listener.readable().await else {
            return;
        };
        // The receive blocks when nothing is pending, so each one is preceded by a poll of its own;
        // readiness is cleared only once nothing is left (tokio keeps it if a new event came since).
        loop {
            match waiting(listener.as_raw_fd()) {
                Waiting::Notification => {}
                Waiting::Nothing => break,
                Waiting::Closed => return,
            }
            match recv(listener.as_raw_fd()) {
                Ok(notif) => {
                    let (listener, shared) = (Arc::clone(&listener), Arc::clone(&shared));
                    tokio::spawn(async move {
                        let answer = answer(&notif, &shared, listener.as_raw_fd()).await;
                        respond(listener.as_raw_fd(), notif.id, answer);
                    });
                }
                // The thread was interrupted or killed before the host took its notification.
                Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT | libc::EINTR)) => {}
                Err(_) => return,
            }
        }
        guard.clear_ready();
    }
}

enum Waiting {
    Notification,
    Nothing,
    Closed,
}

/// Whether a notification is waiting, without waiting for one.
fn waiting(fd: RawFd) -> Waiting {
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: poll on one live pollfd, no wait.
    let n = unsafe { libc::poll(&mut pfd, 1, 0) };
    if n <= 0 {
        return Waiting::Nothing;
    }
    if pfd.revents & libc::POLLIN != 0 {
        Waiting::Notification
    } else if pfd.revents & (libc::POLLHUP | libc::POLLERR | libc::POLLNVAL) != 0 {
        Waiting::Closed
    } else {
        Waiting::Nothing
    }
}

fn recv(fd: RawFd) -> io::Result<libc::seccomp_notif> {
    // SAFETY: the kernel requires a zeroed struct and fills it.
    unsafe {
        let mut notif: libc::seccomp_notif = std::mem::zeroed();
        if libc::ioctl(fd, libc::SECCOMP_IOCTL_NOTIF_RECV, &mut notif) < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(notif)
    }
}

fn id_valid(fd: RawFd, id: u64) -> bool {
    // SAFETY: an ioctl reading a u64.
    unsafe { libc::ioctl(fd, libc::SECCOMP_IOCTL_NOTIF_ID_VALID, &id) == 0 }
}

fn respond(fd: RawFd, id: u64, answer: Answer) {
    let mut resp = libc::seccomp_notif_resp {
        id,
        val: 0,
        error: 0,
        flags: 0,
    };
    match answer {
        Answer::Gone => return,
        Answer::Continue => resp.flags = libc::SECCOMP_USER_NOTIF_FLAG_CONTINUE as u32,
        Answer::Return(Ok(val)) => resp.val = val,
        Answer::Return(Err(errno)) => resp.error = -errno,
    }
    // SAFETY: an ioctl reading the response. ENOENT: the thread is gone, nothing to do.
    unsafe { libc::ioctl(fd, libc::SECCOMP_IOCTL_NOTIF_SEND, &mut resp) };
}

/// The host's decision on one notification.
async fn answer(notif: &libc::seccomp_notif, shared: &Arc<Shared>, listener: RawFd) -> Answer {
    if i64::from(notif.data.nr) != libc::SYS_connect {
        return Answer::Return(Err(libc::ENOSYS));
    }
    let tid = notif.pid as libc::pid_t;
    let fd = notif.data.args[0] as RawFd;
    let len = (notif.data.args[2] as usize).min(MAX_ADDR);
    let Ok(raw) = read_memory(tid, notif.data.args[1], len) else {
        return Answer::Continue; // the kernel reports the bad address itself
    };
    if !id_valid(listener, notif.id) {
        return Answer::Gone;
    }
    let Some(dest) = parse_sockaddr(&raw) else {
        return Answer::Continue; // not an Internet address: Unix, AF_UNSPEC, netlink, or malformed
    };
    let socket = match thread_pidfd(tid).and_then(|pidfd| getfd(pidfd.as_raw_fd(), fd)) {
        Ok(socket) => socket,
        Err(e) => return Answer::Return(Err(e.raw_os_error().unwrap_or(libc::EBADF))),
    };
    if !id_valid(listener, notif.id) {
        return Answer::Gone;
    }
    // What the address really reaches (an IPv4-mapped spelling of 10.0.0.1 is 10.0.0.1); the run's
    // own loopback is only ever a loopback it named itself.
    let ip = effective_ip(dest.ip());
    let port = dest.port();
    let own_loopback = ip.is_loopback() || ip.is_unspecified();
    match sockopt(socket.as_raw_fd(), libc::SO_TYPE) {
        Ok(libc::SOCK_STREAM) => {}
        Ok(kind) => {
            if own_loopback {
                return Answer::Continue; // the run's resolver, or its own servers
            }
            let reason = if kind == libc::SOCK_DGRAM {
                format!(
                    "{} is UDP, which runs may use only for name lookups through their resolver \
                     (QUIC and other UDP protocols fall back to TCP)",
                    SocketAddr::new(ip, port)
                )
            } else {
                format!(
                    "{}: only TCP connections leave a run",
                    SocketAddr::new(ip, port)
                )
            };
            shared.refused("udp", None, ip, port, reason);
            return Answer::Return(Err(libc::EACCES));
        }
        Err(e) => return Answer::Return(Err(e.raw_os_error().unwrap_or(libc::ENOTSOCK))),
    }
    let names = shared.resolved.names_of(ip);
    let name_refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let verdict = shared.decide(ip, port, &name_refs);
    let rule = match verdict {
        Verdict::Allow { rule } => rule,
        // A loopback address the code named itself is its own namespace's: where the run itself
        // listens, the kernel's own connect reaches its server; where it listens on nothing, the
        // code meant the host's loopback, refused like any other address. (One a lookup led to is
        // the host's, refused like any other.)
        Verdict::Refuse { .. }
            if own_loopback && names.is_empty() && super::listening::listens(tid, ip, port) =>
        {
            return Answer::Continue
        }
        Verdict::Refuse { reason } => {
            shared.refused("connect", names.into_iter().next(), ip, port, reason);
            return Answer::Return(Err(libc::EACCES));
        }
    };
    if own_loopback && rule.is_none() && names.is_empty() {
        return Answer::Continue;
    }
    relay(
        socket,
        SocketAddr::new(ip, port),
        names.into_iter().next(),
        rule,
        shared,
        listener,
        notif.id,
    )
    .await
}

/// An allowed connection: the destination through the host, the run's socket to the relay.
async fn relay(
    socket: OwnedFd,
    dest: SocketAddr,
    name: Option<String>,
    rule: Option<String>,
    shared: &Arc<Shared>,
    listener: RawFd,
    id: u64,
) -> Answer {
    let fd = socket.as_raw_fd();
    let v6 = matches!(sockopt(fd, libc::SO_DOMAIN), Ok(libc::AF_INET6));
    let relay_addr = if v6 {
        SocketAddr::new(IpAddr::V6(Ipv6Addr::LOCALHOST), RELAY_PORT)
    } else {
        SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), RELAY_PORT)
    };
    if v6 && !shared.pairing.has_v6() {
        return Answer::Return(Err(libc::ENETUNREACH));
    }
    if !shared.enter_live() {
        shared.refused(
            "connect",
            name,
            dest.ip(),
            dest.port(),
            format!(
                "the run already holds {} connections, its limit; close some first",
                super::MAX_LIVE_CONNECTIONS
            ),
        );
        return Answer::Return(Err(libc::EAGAIN));
    }
    // The relay knows the connection by the run's end of it: bind an unbound socket first.
    let key = match source_of(fd, v6) {
        Ok(key) => key,
        Err(e) => {
            shared.leave_live();
            return Answer::Return(Err(e.raw_os_error().unwrap_or(libc::EINVAL)));
        }
    };
    // SAFETY: F_GETFL on a descriptor we own.
    let nonblocking = unsafe { libc::fcntl(fd, libc::F_GETFL) } & libc::O_NONBLOCK != 0;
    // A connection to a secret's host is served by the host's HTTP proxy, which puts the value in.
    // (Which name it is for is read from its first bytes: many names share an address.)
    let intercept = shared.secrets.as_ref().and_then(|secrets| {
        let names = shared.resolved.names_of(dest.ip());
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        secrets
            .intercepts(&refs, dest.ip(), dest.port())
            .then_some(names)
    });
    let (counters, index) = shared.connected(name.clone(), dest, rule);
    let upstream = if nonblocking {
        let shared = Arc::clone(shared);
        Upstreaming::Later(tokio::spawn(async move {
            shared.upstream.connect(dest, name.as_deref()).await
        }))
    } else {
        match shared.upstream.connect(dest, name.as_deref()).await {
            Ok(stream) => Upstreaming::Ready(stream),
            Err(e) => {
                shared.failed(index, e.to_string());
                shared.leave_live();
                return Answer::Return(Err(e.raw_os_error().unwrap_or(libc::ECONNREFUSED)));
            }
        }
    };
    if !id_valid(listener, id) {
        shared.leave_live();
        return Answer::Gone;
    }
    shared.pairing.insert(
        key,
        Pending {
            upstream,
            counters,
            index,
            dest,
            intercept,
        },
    );
    match connect(fd, relay_addr) {
        Ok(()) => Answer::Return(Ok(0)),
        Err(e) => {
            let errno = e.raw_os_error().unwrap_or(libc::ECONNREFUSED);
            if errno != libc::EINPROGRESS {
                shared.pairing.remove(&key);
                shared.leave_live();
            }
            Answer::Return(Err(errno))
        }
    }
}

/// The run's end of the connection to be: its bound address (binding an unbound socket to the
/// loopback), with an unspecified address read as the loopback it will come from.
fn source_of(fd: RawFd, v6: bool) -> io::Result<SocketAddr> {
    let mut local = local_addr(fd)?;
    if local.port() == 0 {
        let any = if v6 {
            SocketAddr::new(IpAddr::V6(Ipv6Addr::LOCALHOST), 0)
        } else {
            SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0)
        };
        bind(fd, any)?;
        local = local_addr(fd)?;
    }
    if local.ip().is_unspecified() {
        let loopback = if v6 {
            IpAddr::V6(Ipv6Addr::LOCALHOST)
        } else {
            IpAddr::V4(Ipv4Addr::LOCALHOST)
        };
        local.set_ip(loopback);
    }
    Ok(local)
}

fn read_memory(pid: libc::pid_t, addr: u64, len: usize) -> io::Result<Vec<u8>> {
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
    let n = unsafe { libc::process_vm_readv(pid, &local, 1, &remote, 1, 0) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    buf.truncate(n as usize);
    Ok(buf)
}

/// A pidfd of thread `tid` (`PIDFD_THREAD`), or of its thread group's leader on kernels without it
/// (the descriptor table is the same).
fn thread_pidfd(tid: libc::pid_t) -> io::Result<OwnedFd> {
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

fn getfd(pidfd: RawFd, fd: RawFd) -> io::Result<OwnedFd> {
    // SAFETY: pidfd_getfd returns a new descriptor (close-on-exec) or -1.
    let dup = unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd, fd, 0) };
    if dup < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a new descriptor owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(dup as RawFd) })
}

fn sockopt(fd: RawFd, name: libc::c_int) -> io::Result<libc::c_int> {
    let mut value: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: getsockopt writes one int.
    let rc = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            name,
            std::ptr::addr_of_mut!(value).cast(),
            &mut len,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(value)
}

/// An Internet socket address from the bytes the code passed; `None` for any other family.
fn parse_sockaddr(raw: &[u8]) -> Option<SocketAddr> {
    let family = u16::from_ne_bytes([*raw.first()?, *raw.get(1)?]);
    match libc::c_int::from(family) {
        libc::AF_INET if raw.len() >= std::mem::size_of::<libc::sockaddr_in>() => {
            let port = u16::from_be_bytes([raw[2], raw[3]]);
            let ip = Ipv4Addr::new(raw[4], raw[5], raw[6], raw[7]);
            Some(SocketAddr::V4(SocketAddrV4::new(ip, port)))
        }
        // The kernel accepts the 24-byte RFC 2133 form, without the scope id.
        libc::AF_INET6 if raw.len() >= 24 => {
            let port = u16::from_be_bytes([raw[2], raw[3]]);
            let flow = u32::from_be_bytes([raw[4], raw[5], raw[6], raw[7]]);
            let mut octets = [0u8; 16];
            octets.copy_from_slice(&raw[8..24]);
            let scope = raw
                .get(24..28)
                .map_or(0, |b| u32::from_ne_bytes([b[0], b[1], b[2], b[3]]));
            Some(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(octets),
                port,
                flow,
                scope,
            )))
        }
        _ => None,
    }
}

fn to_raw(addr: SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: sockaddr_storage is plain data large enough for either form.
    let mut storage: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let len = match addr {
        SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from(*a.ip()).to_be(),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: writing a sockaddr_in at the start of the storage.
            unsafe { std::ptr::write(std::ptr::addr_of_mut!(storage).cast(), sin) };
            std::mem::size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: 0,
                sin6_addr: libc::in6_addr {
                    s6_addr: a.ip().octets(),
                },
                sin6_scope_id: 0,
            };
            // SAFETY: writing a sockaddr_in6 at the start of the storage.
            unsafe { std::ptr::write(std::ptr::addr_of_mut!(storage).cast(), sin6) };
            std::mem::size_of::<libc::sockaddr_in6>()
        }
    };
    (storage, len as libc::socklen_t)
}

fn bind(fd: RawFd, addr: SocketAddr) -> io::Result<()> {
    let (storage, len) = to_raw(addr);
    // SAFETY: bind reads `len` bytes of the storage.
    if unsafe { libc::bind(fd, std::ptr::addr_of!(storage).cast(), len) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn connect(fd: RawFd, addr: SocketAddr) -> io::Result<()> {
    let (storage, len) = to_raw(addr);
    loop {
        // SAFETY: connect reads `len` bytes of the storage.
        if unsafe { libc::connect(fd, std::ptr::addr_of!(storage).cast(), len) } == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINTR) {
            return Err(e);
        }
    }
}

fn local_addr(fd: RawFd) -> io::Result<SocketAddr> {
    // SAFETY: getsockname writes at most `len` bytes into the storage.
    let mut storage: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    // SAFETY: as above.
    if unsafe { libc::getsockname(fd, std::ptr::addr_of_mut!(storage).cast(), &mut len) } < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the storage holds `len` initialized bytes.
    let bytes = unsafe {
        std::slice::from_raw_parts(std::ptr::addr_of!(storage).cast::<u8>(), len as usize)
    };
    parse_sockaddr(bytes).ok_or_else(|| io::Error::from_raw_os_error(libc::EAFNOSUPPORT))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn socket_addresses_round_trip_through_their_raw_form() {
        for addr in ["127.0.0.1:8080", "[::1]:443", "[::ffff:10.0.0.1]:22"] {
            let addr: SocketAddr = addr.parse().unwrap();
            let (storage, len) = to_raw(addr);
            // SAFETY: the storage holds `len` initialized bytes.
            let bytes = unsafe {
                std::slice::from_raw_parts(std::ptr::addr_of!(storage).cast::<u8>(), len as usize)
            };
            assert_eq!(parse_sockaddr(bytes), Some(addr));
        }
        assert_eq!(parse_sockaddr(&[1, 0, 0, 0]), None); // AF_UNIX
        assert_eq!(parse_sockaddr(&(libc::AF_INET as u16).to_ne_bytes()), None);
        // too short
    }
}
