//! Whether the run itself listens on a loopback port: read from the TCP tables of its own network
//! namespace (`/proc/TID/net/tcp` and `tcp6` of the thread that connects).
//!
//! Every run has a loopback of its own, so a connect to `127.0.0.1:PORT` that the policy does not
//! name reaches, at most, the run's own servers. A run that listens there gets its connection (the
//! kernel's own connect); one that listens on nothing there meant the host's loopback, and gets the
//! policy's refusal, named like any other, instead of a bare `ECONNREFUSED`.
//!
//! The kernel lists listening sockets first, so a table is read only as far as its last listener
//! (and at most [`MAX_READ`] bytes of it): the host's work is bounded by what the run listens on,
//! not by how many connections it holds. A table that cannot be read, or is longer, counts as
//! listening: the connect then stays the kernel's, inside the run's namespace, as before.

use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// The most of one table read.
const MAX_READ: u64 = 1 << 20;

/// `st` of a listening socket in `/proc/net/tcp`.
const LISTEN: &str = "0A";

/// Whether thread `tid`'s network namespace has a TCP socket listening on `port` at an address a
/// connect to `dest` (a loopback or unspecified address) would reach.
pub(super) fn listens(tid: libc::pid_t, dest: IpAddr, port: u16) -> bool {
    ["tcp", "tcp6"].iter().any(
        |table| match File::open(format!("/proc/{tid}/net/{table}")) {
            Ok(file) => listed(BufReader::new(file.take(MAX_READ)), dest, port),
            Err(_) => true,
        },
    )
}

/// Whether the table read from `lines` lists a listener on `port` that `dest` reaches (a table cut
/// short among its listeners counts as listing one).
fn listed(lines: impl BufRead, dest: IpAddr, port: u16) -> bool {
    for line in lines.lines().skip(1) {
        let Ok(line) = line else { return true };
        let mut fields = line.split_whitespace();
        let (Some(local), Some(state)) = (fields.nth(1), fields.nth(1)) else {
            return true; // cut short
        };
        if state != LISTEN {
            return false; // the listeners are all listed first
        }
        let Some((addr, bound_port)) = local.split_once(':') else {
            return true;
        };
        if u16::from_str_radix(bound_port, 16).ok() != Some(port) {
            continue;
        }
        match parse_addr(addr) {
            Some(bound) if reaches(dest, bound) => return true,
            Some(_) => {}
            None => return true,
        }
    }
    false
}

/// An address as `/proc/net/tcp` prints it: each 32-bit word of it in the host's byte order.
fn parse_addr(hex: &str) -> Option<IpAddr> {
    let word = |i: usize| {
        let text = hex.get(i * 8..i * 8 + 8)?;
        u32::from_str_radix(text, 16).ok().map(u32::to_ne_bytes)
    };
    match hex.len() {
        8 => Some(IpAddr::V4(Ipv4Addr::from(word(0)?))),
        32 => {
            let mut octets = [0u8; 16];
            for i in 0..4 {
                octets[i * 4..i * 4 + 4].copy_from_slice(&word(i)?);
            }
            Some(IpAddr::V6(Ipv6Addr::from(octets)))
        }
        _ => None,
    }
}

/// Whether a connect to `dest` reaches a socket bound to `bound`: the same address, or the
/// unspecified one (an unspecified `dest` reaches the loopback), across IPv4-mapped spellings.
fn reaches(dest: IpAddr, bound: IpAddr) -> bool {
    let canonical = |ip: IpAddr| match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    };
    let (dest, bound) = (canonical(dest), canonical(bound));
    if bound.is_unspecified() {
        return true;
    }
    match dest {
        IpAddr::V4(v4) if v4.is_unspecified() => bound.is_loopback(),
        IpAddr::V6(v6) if v6.is_unspecified() => bound.is_loopback(),
        _ => dest == bound,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    const TCP: &str = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 1 1 0 100 0 0 10 0
   1: 00000000:0050 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 2 1 0 100 0 0 10 0
   2: 0100007F:A1B2 0100007F:1F90 01 00000000:00000000 00:00000000 00000000  1000        0 3 1 0 20 4 30 10 -1
   3: 0100007F:0016 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 4 1 0 100 0 0 10 0
";

    const TCP6: &str = "  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000000000000000000001000000:1F91 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 5 1 0 100 0 0 10 0
   1: 0000000000000000FFFF00000100007F:1F92 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 6 1 0 100 0 0 10 0
";

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    #[test]
    fn listeners_are_found_by_port_and_the_address_a_connect_reaches() {
        let v4 = |dest: &str, port| listed(TCP.as_bytes(), ip(dest), port);
        assert!(v4("127.0.0.1", 8080));
        assert!(v4("0.0.0.0", 8080));
        assert!(!v4("127.0.0.2", 8080)); // bound to 127.0.0.1 alone
        assert!(v4("127.0.0.2", 80)); // bound to every address
        assert!(v4("::ffff:127.0.0.1", 8080));
        // Port 22's listener comes after an established connection, where listing stops (the
        // kernel never lists them so); nothing listens on 9.
        assert!(!v4("127.0.0.1", 22));
        assert!(!v4("127.0.0.1", 9));
        let v6 = |dest: &str, port| listed(TCP6.as_bytes(), ip(dest), port);
        assert!(v6("::1", 8081));
        assert!(v6("::", 8081));
        assert!(!v6("::1", 8080));
        assert!(v6("127.0.0.1", 8082)); // an IPv4-mapped bind
        assert!(!v6("127.0.0.1", 8081));
    }

    #[test]
    fn a_table_that_does_not_parse_counts_as_listening() {
        assert!(listed("header\n   0: zz\n".as_bytes(), ip("127.0.0.1"), 80));
        assert!(!listed("header only\n".as_bytes(), ip("127.0.0.1"), 80));
    }

    #[test]
    fn this_process_is_seen_listening() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        // SAFETY: gettid has no preconditions.
        let tid = unsafe { libc::gettid() };
        assert!(listens(tid, ip("127.0.0.1"), port));
        drop(listener);
        assert!(!listens(tid, ip("127.0.0.1"), port));
    }
}
