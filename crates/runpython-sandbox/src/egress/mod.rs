//! Egress, the sandbox's share: the mechanism, never the policy. With [`crate::Network::Mediated`]
//! the run's network namespace is empty but for its loopback, on which its first process makes the
//! host's endpoints ([`setup`]), and its interpreter runs under a filter that hands every
//! `connect(2)` to the host ([`filter`]; guarded, `bind(2)`, `listen(2)` and the device `ioctl(2)`s
//! too, where Landlock refuses the run's own TCP bind and connect). The sandbox hands their descriptors out ([`EgressChannel`], or the
//! fork's own message for a run forked from a template) and knows nothing of what the host then
//! decides: runpython-egress serves them with the caller's policy.

pub(crate) mod filter;
pub(crate) mod setup;

use std::io::{Error, ErrorKind};
use std::os::fd::{AsRawFd, OwnedFd};

/// The run's endpoints and its connect notifier's listener, as its processes sent them.
#[derive(Debug)]
pub struct EgressFds {
    /// The resolver's UDP socket (`127.0.0.1:53` in the run's namespace).
    pub dns_udp: OwnedFd,
    /// The resolver's TCP listener (`127.0.0.1:53`).
    pub dns_tcp: OwnedFd,
    /// The relay's IPv4 listener (`127.0.0.1:`[`EgressFds::RELAY_PORT`]).
    pub relay4: OwnedFd,
    /// The relay's IPv6 listener (`[::1]:`[`EgressFds::RELAY_PORT`]), when the namespace has IPv6.
    pub relay6: Option<OwnedFd>,
    /// The connect notifier's listener.
    pub listener: OwnedFd,
    /// The guard is in force for the run: Landlock refuses its own TCP `bind(2)` and `connect(2)`, and
    /// its notifier also hands the host `bind(2)`, `listen(2)` and the device `ioctl(2)`s, refusing
    /// what would move a socket's packets elsewhere (`egress/filter.rs`). The host then performs
    /// every such call itself, and may hand the run a TCP socket it connected in its own namespace.
    /// Set by the host from the run's plan, never by the run.
    pub guarded: bool,
}

impl EgressFds {
    /// The port the relay's listeners are bound to in the run's namespace: an allowed connection's
    /// socket is connected there.
    pub const RELAY_PORT: u16 = setup::RELAY_PORT;
}

/// The host's end of the socket a run's processes send their egress descriptors through (the
/// sockets first, then the notifier's listener), as [`crate::Child::egress`] gives it, and whether the
/// run's plan put the guard in force ([`EgressFds::guarded`]).
#[derive(Debug)]
pub struct EgressChannel(pub(crate) OwnedFd, pub(crate) bool);

impl EgressChannel {
    /// Waits for the run's descriptors. `Err` when the run ended (or failed to set up, which its
    /// spawn reports) before it sent them. Must be called within a tokio runtime.
    pub async fn receive(self) -> std::io::Result<EgressFds> {
        let guarded = self.1;
        // SAFETY: the `OwnedFd` stays open, the same file description, until the `AsyncFd` owning it
        // is dropped.
        let channel =
            unsafe { tokio::io::unix::AsyncFd::register(self.0) }.map_err(|e| e.into_parts().1)?;
        let mut sockets: Option<Vec<OwnedFd>> = None;
        loop {
            let mut guard = channel.readable().await?;
            let mut buf = [0u8; 1];
            let got = guard.try_io(|fd| crate::fd::pass::recv_with_fds(fd.as_raw_fd(), &mut buf));
            let (n, fds) = match got {
                Ok(result) => result?,
                Err(_would_block) => continue,
            };
            if n == 0 {
                return Err(Error::new(
                    ErrorKind::UnexpectedEof,
                    "the run ended before it sent its sockets",
                ));
            }
            match buf[0] {
                setup::SOCKETS if fds.len() >= 3 => sockets = Some(fds),
                setup::LISTENER if fds.len() == 1 => {
                    let Some(mut sockets) = sockets.take() else {
                        return Err(Error::new(
                            ErrorKind::InvalidData,
                            "a listener before the sockets",
                        ));
                    };
                    let listener = fds.into_iter().next().ok_or(ErrorKind::InvalidData)?;
                    let relay6 = (sockets.len() > 3).then(|| sockets.remove(3));
                    let relay4 = sockets.remove(2);
                    let dns_tcp = sockets.remove(1);
                    let dns_udp = sockets.remove(0);
                    return Ok(EgressFds {
                        dns_udp,
                        dns_tcp,
                        relay4,
                        relay6,
                        listener,
                        guarded,
                    });
                }
                _ => return Err(Error::new(ErrorKind::InvalidData, "an unexpected message")),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};

    use super::*;
    use crate::fd::pass::{send_with_fds, seqpacket_pair};

    /// A descriptor to send: one end of a pipe, told apart by what its other end reads.
    fn marked() -> (OwnedFd, OwnedFd) {
        crate::fd::pass::pipe().unwrap()
    }

    fn same_file(a: &OwnedFd, b: &OwnedFd) -> bool {
        let stat = |fd: &OwnedFd| nix::sys::stat::fstat(fd.as_fd()).unwrap();
        let (a, b) = (stat(a), stat(b));
        (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)
    }

    #[tokio::test]
    async fn the_channel_gives_the_sockets_then_the_listener_in_their_places() {
        let (host, run) = seqpacket_pair().unwrap();
        let sent: Vec<(OwnedFd, OwnedFd)> = (0..5).map(|_| marked()).collect();
        let raw: Vec<RawFd> = sent.iter().map(|(r, _)| r.as_raw_fd()).collect();
        send_with_fds(run.as_raw_fd(), &[setup::SOCKETS], &raw[..4]).unwrap();
        send_with_fds(run.as_raw_fd(), &[setup::LISTENER], &raw[4..]).unwrap();
        let fds = EgressChannel(host, false).receive().await.unwrap();
        assert!(same_file(&fds.dns_udp, &sent[0].0));
        assert!(same_file(&fds.dns_tcp, &sent[1].0));
        assert!(same_file(&fds.relay4, &sent[2].0));
        assert!(same_file(fds.relay6.as_ref().unwrap(), &sent[3].0));
        assert!(same_file(&fds.listener, &sent[4].0));
    }

    #[tokio::test]
    async fn a_namespace_without_ipv6_sends_one_relay_listener() {
        let (host, run) = seqpacket_pair().unwrap();
        let sent: Vec<(OwnedFd, OwnedFd)> = (0..4).map(|_| marked()).collect();
        let raw: Vec<RawFd> = sent.iter().map(|(r, _)| r.as_raw_fd()).collect();
        send_with_fds(run.as_raw_fd(), &[setup::SOCKETS], &raw[..3]).unwrap();
        send_with_fds(run.as_raw_fd(), &[setup::LISTENER], &raw[3..]).unwrap();
        let fds = EgressChannel(host, false).receive().await.unwrap();
        assert!(fds.relay6.is_none());
        assert!(same_file(&fds.listener, &sent[3].0));
    }

    #[tokio::test]
    async fn a_listener_before_the_sockets_or_a_run_that_ends_gives_nothing() {
        let (host, run) = seqpacket_pair().unwrap();
        let (r, _w) = marked();
        send_with_fds(run.as_raw_fd(), &[setup::LISTENER], &[r.as_raw_fd()]).unwrap();
        let err = EgressChannel(host, false).receive().await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidData, "{err}");

        let (host, run) = seqpacket_pair().unwrap();
        drop(run);
        let err = EgressChannel(host, false).receive().await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::UnexpectedEof, "{err}");
    }
}
