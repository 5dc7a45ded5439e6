//! Under the guard, the calls the host performs for the run on the socket it inspected (a copy of the
//! run's descriptor, the same open file): never by letting the kernel continue the run's call, which
//! would read the descriptor and the address again, after the run could have changed either. Each
//! answers what the run's own call would have: the kernel's result on the same socket, with the
//! checks the host's credentials would skip made first (a port below 1024 needs the run's own
//! capability). A socket the host handed over refuses all of them, as a connected socket does.
//!
//! - `bind(2)` and `connect(2)` of an Internet address on the run's own sockets, and `listen(2)`
//!   on any: the run's own servers and clients on its loopback. (A connect that leaves the run is
//!   the policy's, `notify.rs`.) Other families (Unix sockets) are the kernel's own call: Landlock
//!   refuses the run's own TCP bind and connect, so whatever the run swaps in meanwhile cannot
//!   reach TCP.
//! - The device `ioctl(2)`s (`0x890B..=0x89FF`): answered from the run's own namespace (the socket
//!   itself, or the run's resolver socket for a handed one), never the host's: interface names,
//!   addresses, flags and the ARP table. Setting anything there needs a capability the run lacks
//!   (`EPERM`); the driver-specific ones (ethtool, MII, bridges, bonding) are not offered
//!   (`EOPNOTSUPP`).

use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::time::Duration;

use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

use super::call::{Answer, Call};
use super::sock::{self, Ret};
use super::target;
use super::Shared;

/// `CAP_NET_BIND_SERVICE`.
const CAP_NET_BIND_SERVICE: u32 = 10;

/// Ports below this need `CAP_NET_BIND_SERVICE` (a new network namespace's
/// `ip_unprivileged_port_start`, which a run without capabilities cannot change).
const UNPRIVILEGED_PORT_START: u16 = 1024;

/// Whether `copy` is a socket the host handed to the run (or any other of the host's namespace).
pub(super) fn handed(copy: RawFd, shared: &Shared) -> bool {
    sock::cookie(copy).is_ok_and(|c| shared.handed.holds(c))
        || shared
            .host_netns
            .is_some_and(|host| netns_cookie(copy) == Some(host))
}

/// `SO_NETNS_COOKIE` (Linux 5.14): the cookie of the socket's network namespace.
pub(super) fn netns_cookie(fd: RawFd) -> Option<u64> {
    let bytes = sock::get_bytes(fd, libc::SOL_SOCKET, 71, 8).ok()?;
    Some(u64::from_ne_bytes(bytes.try_into().ok()?))
}

/// A copy of the run's own socket the call names: `Err` with the answer when the call is gone, the
/// descriptor is bad, or it is one the host handed over (`EINVAL`, as for a socket bound and
/// connected already).
fn own_socket(call: &Call, shared: &Shared) -> Result<OwnedFd, Answer> {
    let copy = call.copy().map_err(|errno| Answer::Return(Err(errno)))?;
    if !call.alive() {
        return Err(Answer::Gone);
    }
    if handed(copy.as_raw_fd(), shared) {
        return Err(Answer::Return(Err(libc::EINVAL)));
    }
    Ok(copy)
}

/// `bind(2)` of an Internet address (`AF_UNSPEC` too, which an IPv4 socket reads as `INADDR_ANY`).
pub(super) fn bind(call: &Call, raw: &[u8], shared: &Shared) -> Answer {
    let copy = match own_socket(call, shared) {
        Ok(copy) => copy,
        Err(answer) => return answer,
    };
    let port = raw
        .get(2..4)
        .map_or(0, |p| u16::from_be_bytes([p[0], p[1]]));
    let inet = matches!(sock::family_of(raw), Some(libc::AF_INET | libc::AF_INET6));
    if inet
        && port != 0
        && port < UNPRIVILEGED_PORT_START
        && !target::has_capability(call.tid, CAP_NET_BIND_SERVICE)
    {
        return Answer::Return(Err(libc::EACCES));
    }
    Answer::Return(sock::bind_raw(copy.as_raw_fd(), raw))
}

/// `listen(2)`, on a socket of any family.
pub(super) fn listen(call: &Call, backlog: libc::c_int, shared: &Shared) -> Answer {
    let copy = match own_socket(call, shared) {
        Ok(copy) => copy,
        Err(answer) => return answer,
    };
    Answer::Return(sock::listen(copy.as_raw_fd(), backlog))
}

/// `connect(2)` of the run's own socket to `raw` inside its namespace (its loopback, its resolver,
/// or `AF_UNSPEC`, which dissolves an association). A blocking socket's connect is waited for here
/// (made non-blocking for the call, then as it was), so a server that never accepts holds no thread
/// of the host's.
pub(super) async fn connect_inside(call: &Call, copy: OwnedFd, raw: &[u8]) -> Answer {
    let fd = copy.as_raw_fd();
    let flags = match sock::status_flags(fd) {
        Ok(flags) => flags,
        Err(e) => return Answer::Return(Err(e.raw_os_error().unwrap_or(libc::EBADF))),
    };
    if flags & libc::O_NONBLOCK != 0 || sock::family_of(raw) == Some(libc::AF_UNSPEC) {
        return Answer::Return(sock::connect_raw(fd, raw));
    }
    if sock::set_status_flags(fd, flags | libc::O_NONBLOCK).is_err() {
        return Answer::Return(sock::connect_raw(fd, raw));
    }
    let started = sock::connect_raw(fd, raw);
    let _ = sock::set_status_flags(fd, flags);
    match started {
        Err(libc::EINPROGRESS) => {}
        done => return Answer::Return(done),
    }
    // SAFETY: the `OwnedFd` stays open, the same file description, until the `AsyncFd` owning it
    // is dropped.
    let Ok(watched) = (unsafe { AsyncFd::register_with_interest(copy, Interest::WRITABLE) }) else {
        return Answer::Return(Err(libc::EIO));
    };
    loop {
        match tokio::time::timeout(Duration::from_millis(100), watched.writable()).await {
            Ok(Ok(_)) => break,
            Ok(Err(e)) => return Answer::Return(Err(e.raw_os_error().unwrap_or(libc::EIO))),
            Err(_) if !call.alive() => return Answer::Gone,
            Err(_) => {}
        }
    }
    match sock::take_error(watched.as_raw_fd()) {
        Ok(0) => Answer::Return(Ok(0)),
        Ok(errno) => Answer::Return(Err(errno)),
        Err(e) => Answer::Return(Err(e.raw_os_error().unwrap_or(libc::EIO))),
    }
}

/// `struct ifreq`'s size.
const IFREQ: usize = 40;
/// `struct arpreq`'s size.
const ARPREQ: usize = 68;
/// `struct ifconf`'s size (an int, padding, a pointer).
const IFCONF: usize = 16;
/// The most of an interface list copied for the run.
const MAX_IFCONF: usize = 64 << 10;

/// The device ioctls answered with an `ifreq` read and written back.
const IFREQ_GETS: &[u32] = &[
    0x8910, // SIOCGIFNAME
    0x8913, // SIOCGIFFLAGS
    0x8915, // SIOCGIFADDR
    0x8917, // SIOCGIFDSTADDR
    0x8919, // SIOCGIFBRDADDR
    0x891b, // SIOCGIFNETMASK
    0x891d, // SIOCGIFMETRIC
    0x891f, // SIOCGIFMEM
    0x8921, // SIOCGIFMTU
    0x8925, // SIOCGIFENCAP
    0x8927, // SIOCGIFHWADDR
    0x8929, // SIOCGIFSLAVE
    0x8933, // SIOCGIFINDEX
    0x8935, // SIOCGIFPFLAGS
    0x8938, // SIOCGIFCOUNT
    0x8942, // SIOCGIFTXQLEN
    0x8970, // SIOCGIFMAP
];

/// The ioctls that set, add or delete something of the network namespace: a capability the run
/// never has.
const SETS: &[u32] = &[
    0x890B, 0x890C, 0x890D, // routes
    0x8911, 0x8914, 0x8916, 0x8918, 0x891a, 0x891c, 0x891e, 0x8920, 0x8922, 0x8923, 0x8924, 0x8926,
    0x8930, 0x8931, 0x8932, 0x8934, 0x8936, 0x8937, 0x8941, 0x8943, 0x8949, // devices
    0x894C, // SIOCGSKNS: a descriptor of the namespace
    0x8953, 0x8955, 0x8960, 0x8962, // ARP and RARP entries
    0x8971, 0x8980, 0x8981, 0x8983, // maps, DLCI, VLAN
    0x8990, 0x8991, 0x8992, 0x8995, // bonding
    0x89a0, 0x89a1, 0x89a2, 0x89a3, // bridges
    0x89b0, // SIOCSHWTSTAMP
];

/// `SIOCOUTQNSD`: a TCP socket's unsent bytes, an int.
const SIOCOUTQNSD: u32 = 0x894B;
/// `SIOCGIFCONF`.
const SIOCGIFCONF: u32 = 0x8912;
/// `SIOCGARP` and `SIOCGRARP`.
const ARP_GETS: [u32; 2] = [0x8954, 0x8961];

/// A device `ioctl(2)` with command `cmd` and argument `arg`.
pub(super) fn ioctl(call: &Call, cmd: u32, arg: u64, shared: &Shared) -> Answer {
    let copy = match call.copy() {
        Ok(copy) => copy,
        Err(errno) => return Answer::Return(Err(errno)),
    };
    if !call.alive() {
        return Answer::Gone;
    }
    let is_socket =
        nix::sys::stat::fstat(&copy).is_ok_and(|st| st.st_mode & libc::S_IFMT == libc::S_IFSOCK);
    if !is_socket {
        return Answer::Return(Err(libc::ENOTTY));
    }
    if SETS.contains(&cmd) {
        return Answer::Return(Err(libc::EPERM));
    }
    // A handed socket is the host's namespace's: its questions are answered from the run's.
    let fd = if handed(copy.as_raw_fd(), shared) {
        let family = sock::sockopt(copy.as_raw_fd(), libc::SO_DOMAIN).unwrap_or(libc::AF_INET);
        match shared.inside_socket(family) {
            Some(fd) => fd,
            None => return Answer::Return(Err(libc::EOPNOTSUPP)),
        }
    } else {
        copy.as_raw_fd()
    };
    let result = if cmd == SIOCOUTQNSD {
        let mut n: libc::c_int = 0;
        // SAFETY: the ioctl writes one int; on a handed socket it reads its own queue.
        let rc = unsafe { libc::ioctl(copy.as_raw_fd(), cmd as libc::Ioctl, &mut n) };
        if rc < 0 {
            Err(last_errno())
        } else {
            target::write_memory(call.tid, arg, &n.to_ne_bytes()).map(|()| i64::from(rc))
        }
    } else if IFREQ_GETS.contains(&cmd) {
        in_and_out(call, fd, cmd, arg, IFREQ)
    } else if ARP_GETS.contains(&cmd) {
        in_and_out(call, fd, cmd, arg, ARPREQ)
    } else if cmd == SIOCGIFCONF {
        ifconf(call, fd, arg)
    } else {
        Err(libc::EOPNOTSUPP)
    };
    Answer::Return(result)
}

fn last_errno() -> i32 {
    std::io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}

/// An ioctl whose argument is a struct of `len` bytes the kernel reads and writes.
fn in_and_out(call: &Call, fd: RawFd, cmd: u32, arg: u64, len: usize) -> Ret {
    let mut buf = target::read_exact(call.tid, arg, len)?;
    // SAFETY: the ioctl reads and writes at most `len` bytes of `buf` (the struct of `cmd`).
    let rc = unsafe { libc::ioctl(fd, cmd as libc::Ioctl, buf.as_mut_ptr()) };
    if rc < 0 {
        return Err(last_errno());
    }
    target::write_memory(call.tid, arg, &buf)?;
    Ok(i64::from(rc))
}

/// `SIOCGIFCONF`: the list of interfaces with an IPv4 address, into the run's buffer (or its
/// length, for a null buffer).
fn ifconf(call: &Call, fd: RawFd, arg: u64) -> Ret {
    let head = target::read_exact(call.tid, arg, IFCONF)?;
    let len = i32::from_ne_bytes([head[0], head[1], head[2], head[3]]);
    let ptr = u64::from_ne_bytes(head[8..16].try_into().map_err(|_| libc::EFAULT)?);
    let mut local = vec![0u8; usize::try_from(len).unwrap_or(0).min(MAX_IFCONF)];
    #[repr(C)]
    struct IfConf {
        len: libc::c_int,
        buf: *mut u8,
    }
    let mut conf = IfConf {
        len: local.len() as libc::c_int,
        buf: if ptr == 0 {
            std::ptr::null_mut()
        } else {
            local.as_mut_ptr()
        },
    };
    // SAFETY: the kernel writes at most `conf.len` bytes into `local` and the length into `conf`.
    let rc = unsafe { libc::ioctl(fd, SIOCGIFCONF as libc::Ioctl, &mut conf) };
    if rc < 0 {
        return Err(last_errno());
    }
    let written = usize::try_from(conf.len).unwrap_or(0);
    if ptr != 0 {
        target::write_memory(call.tid, ptr, &local[..written.min(local.len())])?;
    }
    target::write_memory(call.tid, arg, &conf.len.to_ne_bytes())?;
    Ok(i64::from(rc))
}
