//! An allowed connection handed to the run: the host makes a TCP socket in its own namespace, with the
//! options the run had set on its own, connects it to the decided address, and puts it in place of the
//! run's socket (`SECCOMP_IOCTL_NOTIF_ADDFD`, at the same descriptor number, with the same
//! close-on-exec flag and blocking mode). From then on the kernel carries every byte, as for a process
//! outside any sandbox: no relay, no second connection, and the run's socket has the real peer.
//!
//! Only under the guard (`EgressFds::guarded`), where such a socket can do nothing but carry this
//! connection: the run's own TCP bind and connect are refused by Landlock, and every bind, connect and
//! listen it asks for is the host's to perform ([`super::perform`]), which refuses them on a handed
//! socket; its notifier refuses TCP Fast Open, source routing, device binding, upper-layer protocols
//! and io_uring. Not for a run with secrets (the host must see what leaves), a destination reached
//! through the host's proxy, or another protocol than plain TCP (MPTCP opens subflows of its own):
//! those keep the relay.

use std::net::SocketAddr;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

use super::call::{Answer, Call};
use super::diag::SocketId;
use super::sock;
use super::Shared;

/// How long a blocking connect waits for the destination (as the relay's upstream does).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

/// Integer options copied from the run's socket to the host's where they differ from a fresh
/// socket's: what a client sets before it connects (Nagle, keepalive, timeouts, the traffic class).
const INT_OPTIONS: &[(libc::c_int, libc::c_int)] = &[
    (libc::SOL_SOCKET, libc::SO_KEEPALIVE),
    (libc::SOL_SOCKET, libc::SO_OOBINLINE),
    (libc::SOL_SOCKET, libc::SO_PRIORITY),
    (libc::SOL_SOCKET, libc::SO_RCVLOWAT),
    (libc::SOL_SOCKET, libc::SO_REUSEADDR),
    (libc::SOL_SOCKET, 60), // SO_ZEROCOPY
    (libc::IPPROTO_TCP, libc::TCP_NODELAY),
    (libc::IPPROTO_TCP, libc::TCP_MAXSEG),
    (libc::IPPROTO_TCP, libc::TCP_CORK),
    (libc::IPPROTO_TCP, libc::TCP_KEEPIDLE),
    (libc::IPPROTO_TCP, libc::TCP_KEEPINTVL),
    (libc::IPPROTO_TCP, libc::TCP_KEEPCNT),
    (libc::IPPROTO_TCP, libc::TCP_SYNCNT),
    (libc::IPPROTO_TCP, libc::TCP_LINGER2),
    (libc::IPPROTO_TCP, libc::TCP_WINDOW_CLAMP),
    (libc::IPPROTO_TCP, libc::TCP_USER_TIMEOUT),
    (libc::IPPROTO_TCP, libc::TCP_NOTSENT_LOWAT),
];

/// The same for IPv4 sockets.
const INT_OPTIONS_V4: &[(libc::c_int, libc::c_int)] = &[
    (libc::IPPROTO_IP, libc::IP_TOS),
    (libc::IPPROTO_IP, libc::IP_TTL),
    (libc::IPPROTO_IP, libc::IP_MTU_DISCOVER),
    (libc::IPPROTO_IP, libc::IP_RECVERR),
];

/// The same for IPv6 sockets.
const INT_OPTIONS_V6: &[(libc::c_int, libc::c_int)] = &[
    (libc::IPPROTO_IPV6, libc::IPV6_V6ONLY),
    (libc::IPPROTO_IPV6, libc::IPV6_TCLASS),
    (libc::IPPROTO_IPV6, libc::IPV6_UNICAST_HOPS),
    (libc::IPPROTO_IPV6, libc::IPV6_MTU_DISCOVER),
    (libc::IPPROTO_IPV6, libc::IPV6_RECVERR),
];

/// Options copied as bytes: the linger, the timeouts of blocking calls, the congestion control.
const BYTE_OPTIONS: &[(libc::c_int, libc::c_int, usize)] = &[
    (libc::SOL_SOCKET, libc::SO_LINGER, 8),
    (libc::SOL_SOCKET, libc::SO_RCVTIMEO, 16),
    (libc::SOL_SOCKET, libc::SO_SNDTIMEO, 16),
    (libc::IPPROTO_TCP, libc::TCP_CONGESTION, 16),
];

/// A fresh TCP socket's buffer sizes in the run's namespace (its relay listener's, which nothing
/// changed): the run's socket set its own where they differ. (Setting one turns the kernel's
/// autotuning off, so a size nobody chose is never copied.)
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct RunDefaults {
    pub rcvbuf: libc::c_int,
    pub sndbuf: libc::c_int,
}

impl RunDefaults {
    pub(crate) fn of(fresh: RawFd) -> RunDefaults {
        RunDefaults {
            rcvbuf: sock::sockopt(fresh, libc::SO_RCVBUF).unwrap_or(0),
            sndbuf: sock::sockopt(fresh, libc::SO_SNDBUF).unwrap_or(0),
        }
    }
}

/// A fresh TCP socket's options in the host's namespace, per family (`[v4, v6]`), read once per
/// process: what the run's socket is compared with.
struct Fresh {
    ints: Vec<Option<libc::c_int>>,
    bytes: Vec<Option<Vec<u8>>>,
}

fn fresh(v6: bool) -> Option<&'static Fresh> {
    static FRESH: [std::sync::OnceLock<Option<Fresh>>; 2] =
        [std::sync::OnceLock::new(), std::sync::OnceLock::new()];
    FRESH[usize::from(v6)]
        .get_or_init(|| {
            let family = if v6 { libc::AF_INET6 } else { libc::AF_INET };
            let s = sock::socket(family, libc::SOCK_STREAM, libc::IPPROTO_TCP).ok()?;
            let fd = s.as_raw_fd();
            Some(Fresh {
                ints: int_options(v6)
                    .map(|(level, name)| sock::get_int(fd, level, name).ok())
                    .collect(),
                bytes: BYTE_OPTIONS
                    .iter()
                    .map(|&(level, name, len)| sock::get_bytes(fd, level, name, len).ok())
                    .collect(),
            })
        })
        .as_ref()
}

fn int_options(v6: bool) -> impl Iterator<Item = (libc::c_int, libc::c_int)> {
    let family = if v6 { INT_OPTIONS_V6 } else { INT_OPTIONS_V4 };
    INT_OPTIONS.iter().chain(family).copied()
}

/// Sets on `to` what the run set on `from`.
fn copy_options(from: RawFd, to: RawFd, v6: bool, defaults: RunDefaults) {
    let Some(fresh) = fresh(v6) else {
        return;
    };
    for ((level, name), fresh) in int_options(v6).zip(&fresh.ints) {
        if let (Ok(theirs), Some(fresh)) = (sock::get_int(from, level, name), fresh) {
            if theirs != *fresh {
                let _ = sock::set_bytes(to, level, name, &theirs.to_ne_bytes());
            }
        }
    }
    for (&(level, name, len), fresh) in BYTE_OPTIONS.iter().zip(&fresh.bytes) {
        if let (Ok(theirs), Some(fresh)) = (sock::get_bytes(from, level, name, len), fresh) {
            if theirs != *fresh {
                let value = if name == libc::TCP_CONGESTION {
                    // The name, without the padding the kernel returns.
                    let end = theirs.iter().position(|&b| b == 0).unwrap_or(theirs.len());
                    theirs[..end].to_vec()
                } else {
                    theirs
                };
                let _ = sock::set_bytes(to, level, name, &value);
            }
        }
    }
    // The kernel reports twice what was asked for.
    for (name, default) in [
        (libc::SO_RCVBUF, defaults.rcvbuf),
        (libc::SO_SNDBUF, defaults.sndbuf),
    ] {
        if let Ok(theirs) = sock::sockopt(from, name) {
            if theirs != default && default != 0 {
                let _ = sock::set_bytes(to, libc::SOL_SOCKET, name, &(theirs / 2).to_ne_bytes());
            }
        }
    }
}

/// Whether this connection can be handed over (else the relay carries it): plain TCP, where the
/// kernel tells this process what a handed connection moved.
pub(super) fn eligible(copy: RawFd) -> bool {
    matches!(
        sock::sockopt(copy, libc::SO_PROTOCOL),
        Ok(libc::IPPROTO_TCP)
    ) && super::diag::Watch::get().is_ok()
}

/// Connects a socket of the host's, of the run's socket's family, to `asked` (the address as the
/// run named it, its scope and flow label dropped; `decided` is what it reaches, for the log) and
/// hands it to the run in place of `copy`'s descriptor: logged and counted among the run's live
/// connections like a relayed one.
pub(super) async fn hand_over(
    call: &Call,
    copy: OwnedFd,
    asked: SocketAddr,
    decided: SocketAddr,
    name: Option<String>,
    rule: Option<String>,
    shared: &Arc<Shared>,
) -> Answer {
    let fd = copy.as_raw_fd();
    let v6 = match sock::sockopt(fd, libc::SO_DOMAIN) {
        Ok(libc::AF_INET6) => true,
        // An IPv4 socket cannot reach an IPv6 address (an IPv6 one reaches IPv4 as mapped).
        Ok(_) if asked.is_ipv6() => return Answer::Return(Err(libc::EAFNOSUPPORT)),
        Ok(_) => false,
        Err(e) => return Answer::Return(Err(e.raw_os_error().unwrap_or(libc::EBADF))),
    };
    let dest = match asked {
        SocketAddr::V4(v4) if v6 => {
            SocketAddr::new(std::net::IpAddr::V6(v4.ip().to_ipv6_mapped()), v4.port())
        }
        other => SocketAddr::new(other.ip(), other.port()),
    };
    if !shared.enter_live_or_refuse(name.clone(), decided) {
        return Answer::Return(Err(libc::EAGAIN));
    }
    let (counters, index) = shared.connected(name, decided, rule, "kernel");
    let failed = |errno: i32, why: String| {
        shared.failed(index, why);
        shared.leave_live();
        Answer::Return(Err(errno))
    };
    let flags = match sock::status_flags(fd) {
        Ok(flags) => flags,
        Err(e) => return failed(e.raw_os_error().unwrap_or(libc::EBADF), e.to_string()),
    };
    let blocking = flags & libc::O_NONBLOCK == 0;
    let cloexec = super::target::cloexec(call.tid, call.fd);
    let family = if v6 { libc::AF_INET6 } else { libc::AF_INET };
    let ours = match sock::socket(family, libc::SOCK_STREAM, libc::IPPROTO_TCP) {
        Ok(s) => s,
        Err(e) => return failed(e.raw_os_error().unwrap_or(libc::ENOBUFS), e.to_string()),
    };
    copy_options(fd, ours.as_raw_fd(), v6, shared.run_defaults());
    drop(copy);
    let mut answered = match sock::connect(ours.as_raw_fd(), dest) {
        Ok(()) => true,
        Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => false,
        Err(e) => {
            return failed(
                e.raw_os_error().unwrap_or(libc::ECONNREFUSED),
                e.to_string(),
            )
        }
    };
    let ours = if blocking && !answered {
        match connected(ours, call).await {
            Connected::Yes(ours) => {
                answered = true;
                ours
            }
            Connected::No(errno, why) => return failed(errno, why),
            Connected::Gone => {
                shared.leave_live();
                return Answer::Gone;
            }
        }
    } else {
        ours
    };
    // The run's blocking mode, on the socket it gets.
    if blocking {
        if let Err(e) = sock::set_status_flags(ours.as_raw_fd(), flags & !libc::O_NONBLOCK) {
            return failed(e.raw_os_error().unwrap_or(libc::EINVAL), e.to_string());
        }
    }
    let id = match (
        sock::local_addr(ours.as_raw_fd()),
        sock::cookie(ours.as_raw_fd()),
    ) {
        (Ok(local), Ok(cookie)) => SocketId {
            local,
            peer: dest,
            cookie,
        },
        (Err(e), _) | (_, Err(e)) => {
            return failed(e.raw_os_error().unwrap_or(libc::EINVAL), e.to_string())
        }
    };
    let conn = match shared.handed.add(shared, id, counters, index, answered) {
        Ok(conn) => conn,
        Err(e) => return failed(e.raw_os_error().unwrap_or(libc::ENOBUFS), e.to_string()),
    };
    match super::target::install_fd(call.listener, call.id, ours.as_raw_fd(), call.fd, cloexec) {
        Ok(()) => {
            // The run holds the only descriptor from here.
            drop(ours);
            Answer::Return(if answered {
                Ok(0)
            } else {
                Err(libc::EINPROGRESS)
            })
        }
        Err(errno) => {
            shared.handed.abandon(&conn);
            shared.leave_live();
            if errno == libc::ENOENT {
                Answer::Gone
            } else {
                Answer::Return(Err(errno))
            }
        }
    }
}

enum Connected {
    Yes(OwnedFd),
    No(i32, String),
    Gone,
}

/// Waits for a non-blocking connect of `ours` to finish, as long as the run's thread waits for it
/// (and at most [`CONNECT_TIMEOUT`]).
async fn connected(ours: OwnedFd, call: &Call) -> Connected {
    // SAFETY: the `OwnedFd` stays open, the same file description, until the `AsyncFd` owning it
    // is dropped or gives it back.
    let watched = match unsafe { AsyncFd::register_with_interest(ours, Interest::WRITABLE) } {
        Ok(fd) => fd,
        Err(e) => {
            let e = e.into_parts().1;
            return Connected::No(e.raw_os_error().unwrap_or(libc::EIO), e.to_string());
        }
    };
    let started = tokio::time::Instant::now();
    loop {
        match tokio::time::timeout(Duration::from_millis(100), watched.writable()).await {
            Ok(Ok(_)) => break,
            Ok(Err(e)) => {
                return Connected::No(e.raw_os_error().unwrap_or(libc::EIO), e.to_string())
            }
            Err(_) => {
                if !call.alive() {
                    return Connected::Gone;
                }
                if started.elapsed() > CONNECT_TIMEOUT {
                    return Connected::No(
                        libc::ETIMEDOUT,
                        "the destination did not answer within 30 s".into(),
                    );
                }
            }
        }
    }
    let ours = watched.into_inner();
    match sock::take_error(ours.as_raw_fd()) {
        Ok(0) => Connected::Yes(ours),
        Ok(errno) => Connected::No(errno, std::io::Error::from_raw_os_error(errno).to_string()),
        Err(e) => Connected::No(e.raw_os_error().unwrap_or(libc::EIO), e.to_string()),
    }
}
