//! The kernel's own counts of a TCP connection the host handed to a run (`NETLINK_SOCK_DIAG`, as
//! `ss` reads them): asked for one socket by its addresses and cookie while it lives, and told once
//! more as it is destroyed (the `SKNLGRP_INET*_TCP_DESTROY` groups, which any user may join). The
//! host keeps no descriptor of a handed socket (its close must be the run's), so these are the only
//! way it learns how many bytes moved and when the connection ended.
//!
//! The destroy groups report every TCP socket of the host's network namespace that ends, so the
//! process joins them only while it has a handed connection open ([`Watch`]), on one thread of its
//! own that outlives any async runtime.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::{Arc, Mutex, OnceLock, Weak};

const SOCK_DIAG_BY_FAMILY: u16 = 20;
const INET_DIAG_INFO: u16 = 2;
/// `SKNLGRP_INET_TCP_DESTROY` and `SKNLGRP_INET6_TCP_DESTROY`.
const DESTROY_GROUPS: [u32; 2] = [1, 3];
const SOL_NETLINK: libc::c_int = 270;
const NLMSG_HEADER: usize = 16;
/// `struct inet_diag_msg`.
const DIAG_MSG: usize = 72;
/// `tcp_info`'s fields read: `tcpi_bytes_acked` (RFC 4898: the SYN and a FIN count one each),
/// `tcpi_bytes_received` (the peer's FIN counts one), `tcpi_bytes_sent` and `tcpi_bytes_retrans`
/// (data only, Linux 4.19).
const BYTES_ACKED: usize = 120;
const BYTES_RECEIVED: usize = 128;
const BYTES_SENT: usize = 200;
const BYTES_RETRANS: usize = 208;

/// One connection as the kernel knows it: its family, its two ends and its cookie.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SocketId {
    pub local: SocketAddr,
    pub peer: SocketAddr,
    pub cookie: u64,
}

/// What a connection moved, as the kernel counts it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Counts {
    /// Data bytes sent, each once (retransmissions not counted again).
    pub sent: u64,
    /// Sequence space received: the data, and one for the peer's FIN when it came.
    pub received: u64,
    /// The destination answered (its SYN-ACK acknowledged the SYN).
    pub answered: bool,
}

/// `Counts` from a `tcp_info` as the kernel wrote it (older kernels' shorter one gives what it has).
fn counts(info: &[u8]) -> Counts {
    let at = |offset: usize| {
        info.get(offset..offset + 8)
            .and_then(|b| b.try_into().ok())
            .map(u64::from_ne_bytes)
    };
    let acked = at(BYTES_ACKED).unwrap_or(0);
    let sent = match (at(BYTES_SENT), at(BYTES_RETRANS)) {
        (Some(sent), Some(retrans)) => sent.saturating_sub(retrans),
        // Before 4.19: what was acknowledged, less the SYN.
        _ => acked.saturating_sub(1),
    };
    Counts {
        sent,
        received: at(BYTES_RECEIVED).unwrap_or(0),
        answered: acked >= 1,
    }
}

fn netlink_socket() -> io::Result<OwnedFd> {
    // SAFETY: socket returns a new descriptor or -1.
    let fd = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            libc::NETLINK_SOCK_DIAG,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a new descriptor owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn put_addr(out: &mut [u8], ip: IpAddr) {
    match ip {
        IpAddr::V4(v4) => out[..4].copy_from_slice(&v4.octets()),
        IpAddr::V6(v6) => out[..16].copy_from_slice(&v6.octets()),
    }
}

/// The request for one socket (`inet_diag_req_v2` with its exact id), `TCP_INFO` included.
fn request(id: &SocketId) -> Vec<u8> {
    let mut msg = vec![0u8; NLMSG_HEADER + 56];
    let len = msg.len() as u32;
    msg[0..4].copy_from_slice(&len.to_ne_bytes());
    msg[4..6].copy_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
    msg[6..8].copy_from_slice(&(libc::NLM_F_REQUEST as u16).to_ne_bytes());
    let body = &mut msg[NLMSG_HEADER..];
    body[0] = if id.local.is_ipv4() {
        libc::AF_INET as u8
    } else {
        libc::AF_INET6 as u8
    };
    body[1] = libc::IPPROTO_TCP as u8;
    body[2] = 1 << (INET_DIAG_INFO - 1);
    body[4..8].copy_from_slice(&u32::MAX.to_ne_bytes()); // every state
    let sockid = &mut body[8..];
    sockid[0..2].copy_from_slice(&id.local.port().to_be_bytes());
    sockid[2..4].copy_from_slice(&id.peer.port().to_be_bytes());
    put_addr(&mut sockid[4..20], id.local.ip());
    put_addr(&mut sockid[20..36], id.peer.ip());
    sockid[40..44].copy_from_slice(&(id.cookie as u32).to_ne_bytes());
    sockid[44..48].copy_from_slice(&((id.cookie >> 32) as u32).to_ne_bytes());
    msg
}

/// One `inet_diag_msg`'s cookie and `tcp_info` counts, from a message's payload (after the
/// netlink header); the counts are `None` for what has none (a socket in `TIME_WAIT` is no longer
/// the full socket, which is destroyed and was reported so).
fn parse_diag(payload: &[u8]) -> Option<(u64, Option<Counts>)> {
    if payload.len() < DIAG_MSG {
        return None;
    }
    let word = |o: usize| u32::from_ne_bytes(payload[o..o + 4].try_into().unwrap_or([0; 4]));
    let cookie = u64::from(word(4 + 40)) | (u64::from(word(4 + 44)) << 32);
    let mut at = DIAG_MSG;
    while at + 4 <= payload.len() {
        let len = usize::from(u16::from_ne_bytes([payload[at], payload[at + 1]]));
        let kind = u16::from_ne_bytes([payload[at + 2], payload[at + 3]]);
        if len < 4 || at + len > payload.len() {
            break;
        }
        if kind == INET_DIAG_INFO {
            return Some((cookie, Some(counts(&payload[at + 4..at + len]))));
        }
        at += (len + 3) & !3;
    }
    Some((cookie, None))
}

/// The messages in one datagram: (type, payload).
fn messages(buf: &[u8]) -> Vec<(u16, &[u8])> {
    let mut out = Vec::new();
    let mut at = 0;
    while at + NLMSG_HEADER <= buf.len() {
        let len = u32::from_ne_bytes(buf[at..at + 4].try_into().unwrap_or([0; 4])) as usize;
        let kind = u16::from_ne_bytes([buf[at + 4], buf[at + 5]]);
        if len < NLMSG_HEADER || at + len > buf.len() {
            break;
        }
        out.push((kind, &buf[at + NLMSG_HEADER..at + len]));
        at += (len + 3) & !3;
    }
    out
}

/// The counts of the live connection `id`; `None` when the kernel has no such socket any more.
pub(crate) fn query(id: &SocketId) -> io::Result<Option<Counts>> {
    let sock = netlink_socket()?;
    let req = request(id);
    // SAFETY: send reads the request's bytes.
    if unsafe { libc::send(sock.as_raw_fd(), req.as_ptr().cast(), req.len(), 0) } < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut buf = vec![0u8; 8192];
    // The kernel answers within the send: the reply (or its error) is already queued.
    // SAFETY: recv writes at most `buf.len()` bytes.
    let n = unsafe {
        libc::recv(
            sock.as_raw_fd(),
            buf.as_mut_ptr().cast(),
            buf.len(),
            libc::MSG_DONTWAIT,
        )
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    for (kind, payload) in messages(&buf[..n as usize]) {
        match kind {
            SOCK_DIAG_BY_FAMILY => {
                if let Some((cookie, counts)) = parse_diag(payload) {
                    if cookie == id.cookie {
                        return Ok(counts);
                    }
                }
            }
            // NLMSG_ERROR: ENOENT when the socket is gone.
            2 => {
                let errno = payload
                    .get(..4)
                    .and_then(|b| b.try_into().ok())
                    .map_or(0, i32::from_ne_bytes);
                if errno == -libc::ENOENT || errno == 0 {
                    return Ok(None);
                }
                return Err(io::Error::from_raw_os_error(-errno));
            }
            _ => {}
        }
    }
    Ok(None)
}

/// What the watch tells about a connection once its socket is destroyed.
pub(crate) trait Ended: Send + Sync {
    /// The socket is gone; these are its final counts.
    fn ended(&self, counts: Counts);
}

/// The process's watch on the destruction of the TCP sockets it handed over.
pub(crate) struct Watch {
    sock: OwnedFd,
    state: Mutex<Watched>,
}

/// Connections watched, by cookie, and whether the process is in the destroy groups: it joins them
/// for the first and leaves them once none has been watched for [`LINGER`], so a run making one
/// short connection after another does not join and leave for each.
#[derive(Default)]
struct Watched {
    conns: HashMap<u64, Weak<dyn Ended>>,
    joined: bool,
    empty_since: Option<std::time::Instant>,
}

/// How long the process stays in the destroy groups with nothing to watch.
const LINGER: std::time::Duration = std::time::Duration::from_secs(2);

impl Watch {
    /// The process's watch, its thread started the first time; `Err` where the kernel offers no
    /// socket diagnostics to this process (the host then relays every connection).
    pub(crate) fn get() -> io::Result<&'static Arc<Watch>> {
        static WATCH: OnceLock<Result<Arc<Watch>, i32>> = OnceLock::new();
        let made = WATCH.get_or_init(|| {
            let start = || -> io::Result<Arc<Watch>> {
                let sock = netlink_socket()?;
                // SAFETY: sockaddr_nl is plain data; bind reads it.
                unsafe {
                    let mut addr: libc::sockaddr_nl = std::mem::zeroed();
                    addr.nl_family = libc::AF_NETLINK as libc::sa_family_t;
                    if libc::bind(
                        sock.as_raw_fd(),
                        std::ptr::addr_of!(addr).cast(),
                        std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t,
                    ) < 0
                    {
                        return Err(io::Error::last_os_error());
                    }
                }
                // As much room as the host allows: messages lost to an overflow leave a connection
                // to be asked for by its id, while it lives.
                let _ = super::sock::set_bytes(
                    sock.as_raw_fd(),
                    libc::SOL_SOCKET,
                    libc::SO_RCVBUF,
                    &(4i32 << 20).to_ne_bytes(),
                );
                // The reader wakes at least this often, to leave the groups when nothing is watched.
                let timeout = libc::timeval {
                    tv_sec: 1,
                    tv_usec: 0,
                };
                // SAFETY: a timeval is plain data, read as bytes by setsockopt.
                let bytes = unsafe {
                    std::slice::from_raw_parts(
                        std::ptr::addr_of!(timeout).cast::<u8>(),
                        std::mem::size_of::<libc::timeval>(),
                    )
                };
                super::sock::set_bytes(
                    sock.as_raw_fd(),
                    libc::SOL_SOCKET,
                    libc::SO_RCVTIMEO,
                    bytes,
                )?;
                let watch = Arc::new(Watch {
                    sock,
                    state: Mutex::new(Watched::default()),
                });
                // Whether the kernel lets this process join the groups (and answers the
                // questions), asked once: where it does not, connections keep the relay.
                watch.membership(true)?;
                watch.membership(false)?;
                let reader = Arc::clone(&watch);
                std::thread::Builder::new()
                    .name("runpython-egress-watch".into())
                    .spawn(move || reader.read())?;
                Ok(watch)
            };
            start().map_err(|e| e.raw_os_error().unwrap_or(libc::EIO))
        });
        made.as_ref()
            .map_err(|&errno| io::Error::from_raw_os_error(errno))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Watched> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn membership(&self, join: bool) -> io::Result<()> {
        let option = if join {
            libc::NETLINK_ADD_MEMBERSHIP
        } else {
            libc::NETLINK_DROP_MEMBERSHIP
        };
        for group in DESTROY_GROUPS {
            super::sock::set_bytes(
                self.sock.as_raw_fd(),
                SOL_NETLINK,
                option,
                &group.to_ne_bytes(),
            )?;
        }
        Ok(())
    }

    /// Watches the socket with `cookie` until it is destroyed (joining the groups if out of them).
    pub(crate) fn watch(&self, cookie: u64, conn: Weak<dyn Ended>) -> io::Result<()> {
        let mut state = self.lock();
        if !state.joined {
            self.membership(true)?;
            state.joined = true;
        }
        state.conns.insert(cookie, conn);
        state.empty_since = None;
        Ok(())
    }

    /// Stops watching `cookie`.
    pub(crate) fn forget(&self, cookie: u64) {
        let mut state = self.lock();
        state.conns.remove(&cookie);
        state.conns.retain(|_, c| c.strong_count() > 0);
        if state.conns.is_empty() && state.empty_since.is_none() {
            state.empty_since = Some(std::time::Instant::now());
        }
    }

    /// Leaves the groups when nothing has been watched for [`LINGER`].
    fn leave_when_idle(&self) {
        let mut state = self.lock();
        state.conns.retain(|_, c| c.strong_count() > 0);
        if state.conns.is_empty() {
            let since = *state
                .empty_since
                .get_or_insert_with(std::time::Instant::now);
            if state.joined && since.elapsed() >= LINGER && self.membership(false).is_ok() {
                state.joined = false;
            }
        }
    }

    fn read(&self) {
        let mut buf = vec![0u8; 64 << 10];
        loop {
            // SAFETY: recv writes at most `buf.len()` bytes.
            let n =
                unsafe { libc::recv(self.sock.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
            if n < 0 {
                match io::Error::last_os_error().raw_os_error() {
                    // An overflow lost some: those connections are asked for by id instead.
                    Some(libc::EINTR | libc::ENOBUFS) => continue,
                    Some(libc::EAGAIN) => {
                        self.leave_when_idle();
                        continue;
                    }
                    // Never expected; the watch must not end over it (connections would then only
                    // be settled by their id), so it reads again a moment later.
                    _ => {
                        std::thread::sleep(std::time::Duration::from_millis(50));
                        continue;
                    }
                }
            }
            for (kind, payload) in messages(&buf[..n as usize]) {
                if kind != SOCK_DIAG_BY_FAMILY {
                    continue;
                }
                let Some((cookie, Some(counts))) = parse_diag(payload) else {
                    continue;
                };
                let conn = self.lock().conns.get(&cookie).and_then(Weak::upgrade);
                if let Some(conn) = conn {
                    self.forget(cookie);
                    conn.ended(counts);
                }
            }
            // The other sockets of the host end too, and are told here: leave when idle either way.
            self.leave_when_idle();
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::io::{Read, Write};
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::{Duration, Instant};

    use super::*;

    fn id_of(stream: &std::net::TcpStream) -> SocketId {
        use std::os::fd::AsRawFd;
        SocketId {
            local: stream.local_addr().unwrap(),
            peer: stream.peer_addr().unwrap(),
            cookie: super::super::sock::cookie(stream.as_raw_fd()).unwrap(),
        }
    }

    #[test]
    fn a_live_connection_is_counted_by_the_kernel_and_a_gone_one_is_none() {
        for bind in ["127.0.0.1:0", "[::1]:0"] {
            let Ok(server) = std::net::TcpListener::bind(bind) else {
                continue; // no IPv6 here
            };
            let mut client = std::net::TcpStream::connect(server.local_addr().unwrap()).unwrap();
            let (mut accepted, _) = server.accept().unwrap();
            client.write_all(&[7u8; 1000]).unwrap();
            let mut got = [0u8; 1000];
            accepted.read_exact(&mut got).unwrap();
            accepted.write_all(&[1u8; 300]).unwrap();
            client.read_exact(&mut got[..300]).unwrap();
            let id = id_of(&client);
            let counts = query(&id).unwrap().unwrap();
            assert_eq!(counts.sent, 1000, "{bind}");
            assert_eq!(counts.received, 300, "{bind}");
            assert!(counts.answered);
            // Another cookie on the same addresses is not this socket.
            let other = SocketId {
                cookie: id.cookie + 1_000_000,
                ..id
            };
            assert_eq!(query(&other).unwrap(), None);
            drop(client);
            drop(accepted);
            let started = Instant::now();
            while query(&id).unwrap().is_some() {
                assert!(started.elapsed() < Duration::from_secs(5), "{bind}");
                std::thread::sleep(Duration::from_millis(5));
            }
        }
    }

    struct Seen(AtomicU64);
    impl Ended for Seen {
        fn ended(&self, counts: Counts) {
            self.0.store(counts.sent + 1, Ordering::SeqCst);
        }
    }

    #[test]
    fn a_watched_socket_reports_its_final_counts_as_it_is_destroyed() {
        let watch = Watch::get().unwrap();
        let server = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut client = std::net::TcpStream::connect(server.local_addr().unwrap()).unwrap();
        let (mut accepted, _) = server.accept().unwrap();
        let seen: Arc<Seen> = Arc::new(Seen(AtomicU64::new(0)));
        let as_ended: Arc<dyn Ended> = seen.clone();
        watch
            .watch(id_of(&client).cookie, Arc::downgrade(&as_ended))
            .unwrap();
        client.write_all(&[7u8; 4321]).unwrap();
        let mut got = vec![0u8; 4321];
        accepted.read_exact(&mut got).unwrap();
        drop(accepted);
        drop(client);
        let started = Instant::now();
        while seen.0.load(Ordering::SeqCst) == 0 {
            assert!(started.elapsed() < Duration::from_secs(5));
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(seen.0.load(Ordering::SeqCst), 4322);
        assert!(watch.lock().conns.is_empty());
    }
}
