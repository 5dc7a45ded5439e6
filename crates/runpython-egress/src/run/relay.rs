//! The relay: the host's listeners inside the run's network namespace, each accepted connection
//! joined to the destination the host connected for it (known by the run's end of it), bytes
//! counted as they pass ([`super::pump`]: spliced by the kernel, or read where they must be
//! scanned). A connection the host did not arrange is closed at once.

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::net::{TcpListener, TcpStream};

use super::pump::{self, Way};
use super::secrets::Misuse;
use super::{Counters, Shared};

/// A connection arranged but not accepted within this is forgotten.
const UNCLAIMED: Duration = Duration::from_secs(30);

/// The destination side of an arranged connection.
pub(super) enum Upstreaming {
    /// Connected already (the run's connect was blocking and waited for it).
    Ready(TcpStream),
    /// Connecting (the run's connect was non-blocking and returned at once).
    Later(tokio::task::JoinHandle<io::Result<TcpStream>>),
}

/// An arranged connection, until the relay accepts the run's end of it.
pub(super) struct Pending {
    pub upstream: Upstreaming,
    pub counters: Arc<Counters>,
    pub index: usize,
    /// The destination.
    pub dest: SocketAddr,
    /// The names the run resolved to the destination, when one is a secret's host: a connection
    /// for that name goes through the host's proxy, which puts the secret's value in.
    pub intercept: Option<Vec<String>>,
}

/// Arranged connections by the run's end of them.
#[derive(Default)]
pub(crate) struct Pairing {
    map: Mutex<HashMap<SocketAddr, (Pending, Instant)>>,
    pub(super) v6: AtomicBool,
}

impl Pairing {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<SocketAddr, (Pending, Instant)>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn insert(&self, key: SocketAddr, pending: Pending) {
        let mut map = self.lock();
        map.retain(|_, (_, at)| at.elapsed() < UNCLAIMED);
        map.insert(key, (pending, Instant::now()));
    }

    pub(super) fn remove(&self, key: &SocketAddr) -> Option<Pending> {
        self.lock().remove(key).map(|(p, _)| p)
    }

    /// Whether the relay listens on IPv6 too.
    pub(super) fn has_v6(&self) -> bool {
        self.v6.load(Ordering::Relaxed)
    }
}

/// Accepts on the relay's listeners until dropped.
pub(super) async fn serve(relay4: OwnedFd, relay6: Option<OwnedFd>, shared: Arc<Shared>) {
    let listen = |fd: OwnedFd| -> io::Result<TcpListener> {
        let std = std::net::TcpListener::from(fd);
        std.set_nonblocking(true)?;
        TcpListener::from_std(std)
    };
    let Ok(v4) = listen(relay4) else {
        return std::future::pending().await;
    };
    let v6 = relay6.and_then(|fd| listen(fd).ok());
    let accept6 = async {
        match &v6 {
            Some(l) => accept_loop(l, &shared).await,
            None => std::future::pending().await,
        }
    };
    tokio::join!(accept_loop(&v4, &shared), accept6);
}

async fn accept_loop(listener: &TcpListener, shared: &Arc<Shared>) {
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(_) => {
                // Out of descriptors, most likely: let the runs' connections end first.
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Some(pending) = shared.pairing.remove(&peer) else {
            continue; // not one the host arranged: dropped, so closed
        };
        tokio::spawn(join(stream, pending, Arc::clone(shared)));
    }
}

/// Copies between the run's end and the destination until either closes or the run's egress ends.
async fn join(child: TcpStream, pending: Pending, shared: Arc<Shared>) {
    let Pending {
        upstream,
        counters,
        index,
        dest,
        intercept,
    } = pending;
    let _ = child.set_nodelay(true);
    let upstream = match upstream {
        Upstreaming::Ready(stream) => Ok(stream),
        Upstreaming::Later(connecting) => match connecting.await {
            Ok(result) => result,
            Err(e) => Err(io::Error::other(e.to_string())),
        },
    };
    let upstream = match upstream {
        Ok(stream) => stream,
        Err(e) => {
            // The destination refused or did not answer: the run's connection is reset.
            shared.failed(index, e.to_string());
            let _ = child.set_zero_linger();
            drop(child);
            shared.leave_live();
            return;
        }
    };
    shared.made();
    let mut shutdown = shared.shutdown.subscribe();
    let mut claimed = None;
    if let (Some(names), Some(secrets)) = (intercept, shared.secrets.clone()) {
        let (name, intercepted) = secrets.classify(&child, &names, dest.port()).await;
        claimed = name;
        if let (Some(host), true) = (claimed.clone(), intercepted) {
            let misuse = shared.misuse_reporter(dest.ip());
            tokio::select! {
                _ = secrets.intercept(child, upstream, host, dest.port(), counters, misuse) => {}
                _ = shutdown.wait_for(|stop| *stop) => {}
            }
            shared.leave_live();
            return;
        }
    }
    // Elsewhere a placeholder in what the code sends ends the connection before it passes (TLS
    // hides its inside; plaintext does not): that direction is read by the host. Every other byte
    // moves by splice, never through the host's memory.
    let outgoing = match &shared.secrets {
        Some(secrets) => {
            let shared = Arc::clone(&shared);
            let found =
                move |secret: String| placeholder_found(&shared, dest, claimed.clone(), secret);
            Way::Scanned(secrets.scanner(), Box::new(found))
        }
        None => Way::Splice,
    };
    tokio::select! {
        _ = pump::both(&child, &upstream, outgoing, |n| counters.sent(n), |n| counters.received(n)) => {}
        _ = shutdown.wait_for(|stop| *stop) => {}
    }
    shared.leave_live();
}

/// A placeholder of `secret` in what the code sent on a connection to `dest` that is not
/// intercepted: reported (the connection then closes).
fn placeholder_found(shared: &Shared, dest: SocketAddr, claimed: Option<String>, secret: String) {
    // The name the connection claimed, else one the run resolved to the address.
    let host = claimed.unwrap_or_else(|| {
        shared
            .resolved
            .names_of(dest.ip())
            .into_iter()
            .next()
            .unwrap_or_else(|| dest.ip().to_string())
    });
    let over_http = shared
        .secrets
        .as_ref()
        .is_some_and(|s| s.is_for(&secret, &host, dest.port()));
    let reason = if over_http {
        format!(
            "its placeholder was sent to {host}:{} in plaintext; a secret goes only over TLS \
             whose certificate verifies for its host, unless the operator allows plain HTTP for \
             it (--secret-over-http {secret}); the connection was closed",
            dest.port()
        )
    } else {
        format!(
            "its placeholder was sent to {host}:{}, which it is not for; the connection was \
             closed",
            dest.port()
        )
    };
    shared.misuse(
        dest.ip(),
        Misuse {
            secret,
            reason,
            host,
            port: dest.port(),
        },
    );
}
