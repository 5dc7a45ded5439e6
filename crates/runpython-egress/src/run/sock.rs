//! The socket calls the notifier makes on a run's socket (a copy of its descriptor) or on one of the
//! host's: addresses as the kernel reads them, options, and the calls themselves, each retried on
//! `EINTR` and answered as the errno the run's call would have returned.

use std::io;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::{FromRawFd, OwnedFd, RawFd};

/// The longest socket address read from the run.
pub(super) const MAX_ADDR: usize = std::mem::size_of::<libc::sockaddr_storage>();

/// `SO_COOKIE` (Linux 4.10): a socket's number, never reused while the system runs.
const SO_COOKIE: libc::c_int = 57;

/// A call's result as the run's call returns it: a value, or an errno.
pub(super) type Ret = Result<i64, i32>;

fn last_errno() -> i32 {
    io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}

/// `rc` (a system call's return) as a [`Ret`], reading errno when it failed.
fn ret(rc: libc::c_int) -> Ret {
    if rc < 0 {
        Err(last_errno())
    } else {
        Ok(i64::from(rc))
    }
}

/// Retries `call` while it fails with `EINTR`.
fn restart(mut call: impl FnMut() -> libc::c_int) -> Ret {
    loop {
        match ret(call()) {
            Err(libc::EINTR) => {}
            done => return done,
        }
    }
}

/// An integer option.
pub(super) fn get_int(fd: RawFd, level: libc::c_int, name: libc::c_int) -> io::Result<libc::c_int> {
    let mut value: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most one int.
    let rc = unsafe {
        libc::getsockopt(
            fd,
            level,
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

/// A `SOL_SOCKET` integer option.
pub(super) fn sockopt(fd: RawFd, name: libc::c_int) -> io::Result<libc::c_int> {
    get_int(fd, libc::SOL_SOCKET, name)
}

/// An option's raw bytes (at most `max`).
pub(super) fn get_bytes(
    fd: RawFd,
    level: libc::c_int,
    name: libc::c_int,
    max: usize,
) -> io::Result<Vec<u8>> {
    let mut buf = vec![0u8; max];
    let mut len = max as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `buf`.
    let rc = unsafe { libc::getsockopt(fd, level, name, buf.as_mut_ptr().cast(), &mut len) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    buf.truncate(len as usize);
    Ok(buf)
}

/// Sets an option to `value`'s bytes.
pub(super) fn set_bytes(
    fd: RawFd,
    level: libc::c_int,
    name: libc::c_int,
    value: &[u8],
) -> io::Result<()> {
    // SAFETY: setsockopt reads `value.len()` bytes.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            value.as_ptr().cast(),
            value.len() as libc::socklen_t,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The socket's cookie.
pub(super) fn cookie(fd: RawFd) -> io::Result<u64> {
    let bytes = get_bytes(fd, libc::SOL_SOCKET, SO_COOKIE, 8)?;
    let bytes: [u8; 8] = bytes
        .try_into()
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    Ok(u64::from_ne_bytes(bytes))
}

/// A TCP socket's state (`TCP_ESTABLISHED`, ..., `TCP_CLOSE` 7, `TCP_LISTEN` 10, `TCP_SYN_SENT` 2),
/// the first byte of its `TCP_INFO`.
pub(super) fn tcp_state(fd: RawFd) -> io::Result<u8> {
    let info = get_bytes(fd, libc::IPPROTO_TCP, libc::TCP_INFO, 8)?;
    info.first()
        .copied()
        .ok_or_else(|| io::Error::from_raw_os_error(libc::EINVAL))
}

/// `TCP_SYN_SENT`.
pub(super) const TCP_SYN_SENT: u8 = 2;

/// The file's status flags (`O_NONBLOCK` among them).
pub(super) fn status_flags(fd: RawFd) -> io::Result<libc::c_int> {
    // SAFETY: F_GETFL reads the flags of a descriptor we hold.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(flags)
}

/// Sets the file's status flags.
pub(super) fn set_status_flags(fd: RawFd, flags: libc::c_int) -> io::Result<()> {
    // SAFETY: F_SETFL on a descriptor we hold.
    if unsafe { libc::fcntl(fd, libc::F_SETFL, flags) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// A new socket of the host's network namespace, non-blocking and close-on-exec.
pub(super) fn socket(
    family: libc::c_int,
    kind: libc::c_int,
    protocol: libc::c_int,
) -> io::Result<OwnedFd> {
    // SAFETY: socket returns a new descriptor or -1.
    let fd = unsafe {
        libc::socket(
            family,
            kind | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            protocol,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a new descriptor owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `connect(2)` with the address's raw bytes, as the run passed them.
pub(super) fn connect_raw(fd: RawFd, raw: &[u8]) -> Ret {
    // SAFETY: connect reads `raw.len()` bytes of `raw`.
    restart(|| unsafe { libc::connect(fd, raw.as_ptr().cast(), raw.len() as libc::socklen_t) })
}

/// `bind(2)` with the address's raw bytes, as the run passed them.
pub(super) fn bind_raw(fd: RawFd, raw: &[u8]) -> Ret {
    // SAFETY: bind reads `raw.len()` bytes of `raw`.
    ret(unsafe { libc::bind(fd, raw.as_ptr().cast(), raw.len() as libc::socklen_t) })
}

/// `listen(2)`.
pub(super) fn listen(fd: RawFd, backlog: libc::c_int) -> Ret {
    // SAFETY: listen takes two integers.
    ret(unsafe { libc::listen(fd, backlog) })
}

/// The pending error of a socket whose connect finished (`SO_ERROR`, which reading clears).
pub(super) fn take_error(fd: RawFd) -> io::Result<libc::c_int> {
    sockopt(fd, libc::SO_ERROR)
}

/// An Internet socket address from the bytes the code passed; `None` for any other family.
pub(super) fn parse_sockaddr(raw: &[u8]) -> Option<SocketAddr> {
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

/// The address family the raw bytes name (`None` when fewer than two).
pub(super) fn family_of(raw: &[u8]) -> Option<libc::c_int> {
    Some(libc::c_int::from(u16::from_ne_bytes([
        *raw.first()?,
        *raw.get(1)?,
    ])))
}

/// `addr` as the kernel reads it (no flow label, no scope).
pub(super) fn to_raw(addr: SocketAddr) -> Vec<u8> {
    match addr {
        SocketAddr::V4(a) => {
            let mut raw = vec![0u8; std::mem::size_of::<libc::sockaddr_in>()];
            raw[..2].copy_from_slice(&(libc::AF_INET as u16).to_ne_bytes());
            raw[2..4].copy_from_slice(&a.port().to_be_bytes());
            raw[4..8].copy_from_slice(&a.ip().octets());
            raw
        }
        SocketAddr::V6(a) => {
            let mut raw = vec![0u8; std::mem::size_of::<libc::sockaddr_in6>()];
            raw[..2].copy_from_slice(&(libc::AF_INET6 as u16).to_ne_bytes());
            raw[2..4].copy_from_slice(&a.port().to_be_bytes());
            raw[8..24].copy_from_slice(&a.ip().octets());
            raw
        }
    }
}

pub(super) fn bind(fd: RawFd, addr: SocketAddr) -> io::Result<()> {
    bind_raw(fd, &to_raw(addr)).map_err(io::Error::from_raw_os_error)?;
    Ok(())
}

pub(super) fn connect(fd: RawFd, addr: SocketAddr) -> io::Result<()> {
    connect_raw(fd, &to_raw(addr)).map_err(io::Error::from_raw_os_error)?;
    Ok(())
}

pub(super) fn local_addr(fd: RawFd) -> io::Result<SocketAddr> {
    // SAFETY: sockaddr_storage is plain data.
    let mut storage: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    // SAFETY: the call writes at most `len` bytes into the storage.
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
            assert_eq!(parse_sockaddr(&to_raw(addr)), Some(addr));
        }
        assert_eq!(parse_sockaddr(&[1, 0, 0, 0]), None); // AF_UNIX
        assert_eq!(parse_sockaddr(&(libc::AF_INET as u16).to_ne_bytes()), None); // too short
        assert_eq!(family_of(&[1, 0]), Some(libc::AF_UNIX));
        assert_eq!(family_of(&[1]), None);
    }

    #[test]
    fn a_cookie_names_one_socket_and_a_state_says_where_it_is() {
        use std::os::fd::AsRawFd;
        let a = socket(libc::AF_INET, libc::SOCK_STREAM, 0).unwrap();
        let b = socket(libc::AF_INET, libc::SOCK_STREAM, 0).unwrap();
        let (ca, cb) = (
            cookie(a.as_raw_fd()).unwrap(),
            cookie(b.as_raw_fd()).unwrap(),
        );
        assert_ne!(ca, cb);
        assert_eq!(cookie(a.as_raw_fd()).unwrap(), ca);
        assert_eq!(tcp_state(a.as_raw_fd()).unwrap(), 7); // TCP_CLOSE
        assert_eq!(
            status_flags(a.as_raw_fd()).unwrap() & libc::O_NONBLOCK,
            libc::O_NONBLOCK
        );
    }
}
