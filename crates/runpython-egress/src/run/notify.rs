//! The host's answer to each call the run's notifier hands it (seccomp user notifications):
//! `connect(2)`, and under the guard `bind(2)`, `listen(2)` and the device `ioctl(2)`s.
//!
//! For each notification: read the address the code passed (`process_vm_readv`), check the
//! notification is still alive (`ID_VALID`, after every read of the target, so a recycled pid or a
//! reused descriptor number is never acted on), take a copy of the socket (`pidfd_getfd`), decide,
//! and answer.
//!
//! Without the guard, anything the relay does not handle (Unix sockets, a server on the run's own
//! loopback, `AF_UNSPEC`) is the kernel's own connect (`CONTINUE`): every socket the run holds lives
//! in its empty network namespace, so whatever the kernel then does, even to an address the code
//! changed after the host read it, stays inside that namespace. With the guard the run may hold
//! sockets of the host's namespace (those handed over), so the host performs every call on an
//! Internet socket itself, on the copy it inspected ([`super::perform`]); only a call on another
//! family (a Unix socket) is the kernel's own, and Landlock refuses the run's own TCP bind and
//! connect whatever it swapped in meanwhile.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::Arc;

use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

use runpython_sandbox::EgressFds;

use super::call::{Answer, Call};
use super::relay::{Pending, Upstreaming};
use super::sock;
use super::{perform, Shared};
use crate::policy::{effective_ip, Verdict};

/// The relay's port in the run's namespace.
const RELAY_PORT: u16 = EgressFds::RELAY_PORT;

/// Answers the run's notified calls until no process of the run is left.
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

fn recv(fd: RawFd) -> std::io::Result<libc::seccomp_notif> {
    // SAFETY: the kernel requires a zeroed struct and fills it.
    unsafe {
        let mut notif: libc::seccomp_notif = std::mem::zeroed();
        if libc::ioctl(fd, libc::SECCOMP_IOCTL_NOTIF_RECV, &mut notif) < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(notif)
    }
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

/// The host's answer to one notification.
async fn answer(notif: &libc::seccomp_notif, shared: &Arc<Shared>, listener: RawFd) -> Answer {
    let call = Call {
        tid: notif.pid as libc::pid_t,
        fd: notif.data.args[0] as RawFd,
        listener,
        id: notif.id,
    };
    let args = notif.data.args;
    let nr = i64::from(notif.data.nr);
    if nr == libc::SYS_connect {
        return connect(&call, args[1], args[2], shared).await;
    }
    if !shared.guarded() {
        return Answer::Return(Err(libc::ENOSYS));
    }
    match nr {
        libc::SYS_bind => {
            let raw = match call.address(args[1], args[2]) {
                Ok(raw) => raw,
                Err(errno) => return Answer::Return(Err(errno)),
            };
            if !call.alive() {
                return Answer::Gone;
            }
            match sock::family_of(&raw) {
                Some(libc::AF_INET | libc::AF_INET6 | libc::AF_UNSPEC) => {
                    perform::bind(&call, &raw, shared)
                }
                // A Unix socket's path is the run's to resolve: the kernel's own bind.
                Some(_) => Answer::Continue,
                None => Answer::Return(Err(libc::EINVAL)),
            }
        }
        libc::SYS_listen => perform::listen(&call, args[1] as libc::c_int, shared),
        libc::SYS_ioctl => perform::ioctl(&call, args[1] as u32, args[2], shared),
        _ => Answer::Return(Err(libc::ENOSYS)),
    }
}

/// A `connect(2)` of the run.
async fn connect(call: &Call, addr: u64, len: u64, shared: &Arc<Shared>) -> Answer {
    let guarded = shared.guarded();
    let raw = match call.address(addr, len) {
        Ok(raw) => raw,
        // The kernel reports the bad address itself, on a socket of the run's namespace.
        Err(_) if !guarded => return Answer::Continue,
        Err(errno) => return Answer::Return(Err(errno)),
    };
    if !call.alive() {
        return Answer::Gone;
    }
    let dest = match (sock::family_of(&raw), sock::parse_sockaddr(&raw)) {
        (_, Some(dest)) => dest,
        // Under the guard a socket of the host's dissolves no association: it stays the
        // connection the host made. The run's own do, as the kernel would.
        (Some(libc::AF_UNSPEC), _) if guarded => {
            let copy = match call.copy() {
                Ok(copy) => copy,
                Err(errno) => return Answer::Return(Err(errno)),
            };
            if !call.alive() {
                return Answer::Gone;
            }
            if perform::handed(copy.as_raw_fd(), shared) {
                return Answer::Return(Err(libc::EOPNOTSUPP));
            }
            return Answer::Return(sock::connect_raw(copy.as_raw_fd(), &raw));
        }
        (Some(libc::AF_INET | libc::AF_INET6), None) | (None, _) if guarded => {
            return Answer::Return(Err(libc::EINVAL)); // too short
        }
        // Unix, netlink, or (unguarded) anything the kernel will refuse itself.
        _ => return Answer::Continue,
    };
    let socket = match call.copy() {
        Ok(socket) => socket,
        Err(errno) => return Answer::Return(Err(errno)),
    };
    if !call.alive() {
        return Answer::Gone;
    }
    if guarded && perform::handed(socket.as_raw_fd(), shared) {
        // Connected (or connecting) already, as the kernel would say of any such socket.
        return Answer::Return(Err(
            if sock::tcp_state(socket.as_raw_fd()).ok() == Some(sock::TCP_SYN_SENT) {
                libc::EALREADY
            } else {
                libc::EISCONN
            },
        ));
    }
    // The run's own namespace: the kernel's connect there, or under the guard the host's.
    let inside = |socket: OwnedFd| async move {
        if guarded {
            perform::connect_inside(call, socket, &raw).await
        } else {
            Answer::Continue
        }
    };
    // What the address really reaches (an IPv4-mapped spelling of 10.0.0.1 is 10.0.0.1); the run's
    // own loopback is only ever a loopback it named itself.
    let ip = effective_ip(dest.ip());
    let port = dest.port();
    let own_loopback = ip.is_loopback() || ip.is_unspecified();
    match sock::sockopt(socket.as_raw_fd(), libc::SO_TYPE) {
        Ok(libc::SOCK_STREAM) => {}
        Ok(kind) => {
            if own_loopback {
                return inside(socket).await; // the run's resolver, or its own servers
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
        // listens, its connect reaches its server; where it listens on nothing, the code meant the
        // host's loopback, refused like any other address. (One a lookup led to is the host's,
        // refused like any other.)
        Verdict::Refuse { .. }
            if own_loopback
                && names.is_empty()
                && super::listening::listens(call.tid, ip, port) =>
        {
            return inside(socket).await
        }
        Verdict::Refuse { reason } => {
            shared.refused("connect", names.into_iter().next(), ip, port, reason);
            return Answer::Return(Err(libc::EACCES));
        }
    };
    if own_loopback && rule.is_none() && names.is_empty() {
        return inside(socket).await;
    }
    let name = names.into_iter().next();
    let decided = SocketAddr::new(ip, port);
    // Handed over where the host need not see the bytes and nothing but the kernel joins them.
    if guarded
        && shared.secrets.is_none()
        && !shared.upstream.proxies(decided, name.as_deref())
        && super::handover::eligible(socket.as_raw_fd())
    {
        return super::handover::hand_over(call, socket, dest, decided, name, rule, shared).await;
    }
    relay(socket, decided, name, rule, shared, call).await
}

/// An allowed connection: the destination through the host, the run's socket to the relay.
async fn relay(
    socket: OwnedFd,
    dest: SocketAddr,
    name: Option<String>,
    rule: Option<String>,
    shared: &Arc<Shared>,
    call: &Call,
) -> Answer {
    let fd = socket.as_raw_fd();
    let v6 = matches!(sock::sockopt(fd, libc::SO_DOMAIN), Ok(libc::AF_INET6));
    let relay_addr = if v6 {
        SocketAddr::new(IpAddr::V6(Ipv6Addr::LOCALHOST), RELAY_PORT)
    } else {
        SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), RELAY_PORT)
    };
    if v6 && !shared.pairing.has_v6() {
        return Answer::Return(Err(libc::ENETUNREACH));
    }
    if !shared.enter_live_or_refuse(name.clone(), dest) {
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
    let nonblocking = sock::status_flags(fd).is_ok_and(|f| f & libc::O_NONBLOCK != 0);
    // A connection to a secret's host is served by the host's HTTP proxy, which puts the value in.
    // (Which name it is for is read from its first bytes: many names share an address.)
    let intercept = shared.secrets.as_ref().and_then(|secrets| {
        let names = shared.resolved.names_of(dest.ip());
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        secrets
            .intercepts(&refs, dest.ip(), dest.port())
            .then_some(names)
    });
    let (counters, index) = shared.connected(name.clone(), dest, rule, "relay");
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
    if !call.alive() {
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
    match sock::connect(fd, relay_addr) {
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
fn source_of(fd: RawFd, v6: bool) -> std::io::Result<SocketAddr> {
    let mut local = sock::local_addr(fd)?;
    if local.port() == 0 {
        let any = if v6 {
            SocketAddr::new(IpAddr::V6(Ipv6Addr::LOCALHOST), 0)
        } else {
            SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0)
        };
        sock::bind(fd, any)?;
        local = sock::local_addr(fd)?;
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
