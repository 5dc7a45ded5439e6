//! `serve`'s connections, bounded against idle and slow clients: a deadline for a request's headers
//! and one for its body, a cap on connections, and a smaller one on connections that have not yet
//! made an authenticated request (the oldest of those is closed to admit a new one, so a flood of
//! idle connections cannot keep an authorized client out; authenticated ones are never evicted).
//! The caps follow the process's descriptor limit, whose soft value is raised to its hard one first.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tower::Service;

/// Descriptors kept for everything but connections: runs' pipes and sockets, the store, logs.
const RESERVED_FDS: u64 = 128;

/// How `serve` bounds its connections.
#[derive(Debug, Clone)]
pub struct ConnectionLimits {
    /// Connections at once (further ones wait in the listen backlog; at least 8).
    pub max_connections: usize,
    /// Connections at once that have made no authenticated request yet.
    pub max_unauthenticated: usize,
    /// A request's headers must arrive within this; a connection that has made no authenticated
    /// request within it is closed.
    pub header_timeout: Duration,
    /// A request's body must arrive within this.
    pub body_timeout: Duration,
}

impl ConnectionLimits {
    /// The limits for `wanted` connections, within what the descriptor limit `nofile` leaves.
    pub fn within(
        wanted: usize,
        nofile: u64,
        header_timeout: Duration,
        body_timeout: Duration,
    ) -> Self {
        let room = usize::try_from(nofile.saturating_sub(RESERVED_FDS)).unwrap_or(usize::MAX);
        let max_connections = wanted.min(room).max(8);
        Self {
            max_connections,
            max_unauthenticated: (max_connections / 2).max(4),
            header_timeout,
            body_timeout,
        }
    }
}

/// Raises the soft `RLIMIT_NOFILE` to the hard one; returns the soft limit in force.
pub fn raise_nofile() -> u64 {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok((soft, hard)) => {
            if soft < hard && setrlimit(Resource::RLIMIT_NOFILE, hard, hard).is_ok() {
                hard
            } else {
                soft
            }
        }
        Err(_) => 1024,
    }
}

/// One connection, as the authentication middleware sees it (in the request's extensions).
#[derive(Debug)]
pub(crate) struct Connection {
    id: u64,
    authenticated: AtomicBool,
    registry: Arc<Registry>,
}

impl Connection {
    /// The connection made an authenticated request: it is never evicted from now on.
    pub(crate) fn authenticated(&self) {
        if !self.authenticated.swap(true, Ordering::Relaxed) {
            self.registry.lock().unauthenticated.remove(&self.id);
        }
    }
}

#[derive(Debug, Default)]
struct Registry {
    state: Mutex<RegistryState>,
}

#[derive(Debug, Default)]
struct RegistryState {
    open: usize,
    /// Unauthenticated connections by age (ids grow): how each one is closed.
    unauthenticated: BTreeMap<u64, CancellationToken>,
}

impl Registry {
    fn lock(&self) -> std::sync::MutexGuard<'_, RegistryState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Serves `app` on `listener` until `shutdown` resolves, then lets open connections finish (the
/// caller bounds how long).
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: ConnectionLimits,
    shutdown: impl std::future::Future<Output = ()>,
) {
    let registry = Arc::new(Registry::default());
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let next_id = AtomicU64::new(0);
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout);
    builder.http2().timer(TokioTimer::new());
    let app = app.layer(tower_http::timeout::RequestBodyTimeoutLayer::new(
        limits.body_timeout,
    ));
    tokio::pin!(shutdown);
    loop {
        let (stream, _peer) = tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of descriptors (or another transient failure): the backlog holds the
                    // connection; try again shortly rather than spin.
                    tracing::warn!("accepting a connection failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let id = next_id.fetch_add(1, Ordering::Relaxed);
        let cancel = CancellationToken::new();
        {
            let mut state = registry.lock();
            let full = state.open >= limits.max_connections
                || state.unauthenticated.len() >= limits.max_unauthenticated;
            if full {
                // Close the oldest connection that has not authenticated; with none, refuse this one.
                match state.unauthenticated.pop_first() {
                    Some((_, oldest)) => oldest.cancel(),
                    None => {
                        drop(stream);
                        continue;
                    }
                }
            }
            state.open += 1;
            state.unauthenticated.insert(id, cancel.clone());
        }
        let connection = Arc::new(Connection {
            id,
            authenticated: AtomicBool::new(false),
            registry: Arc::clone(&registry),
        });
        let router = app.clone();
        let service = hyper::service::service_fn(move |mut request: hyper::Request<_>| {
            request.extensions_mut().insert(Arc::clone(&connection));
            let request = request.map(axum::body::Body::new);
            router.clone().call(request)
        });
        let conn = builder
            .serve_connection_with_upgrades(TokioIo::new(stream), service)
            .into_owned();
        let conn = graceful.watch(conn);
        let (registry, header_timeout) = (Arc::clone(&registry), limits.header_timeout);
        tokio::spawn(async move {
            // A connection that has made no authenticated request by the header deadline is closed.
            let unauthenticated_deadline = {
                let (registry, cancel) = (Arc::clone(&registry), cancel.clone());
                async move {
                    tokio::time::sleep(header_timeout).await;
                    let still = registry.lock().unauthenticated.contains_key(&id);
                    if still {
                        cancel.cancel();
                    }
                    std::future::pending::<()>().await;
                }
            };
            tokio::select! {
                _ = conn => {}
                () = cancel.cancelled() => {}
                () = unauthenticated_deadline => {}
            }
            let mut state = registry.lock();
            state.open -= 1;
            state.unauthenticated.remove(&id);
        });
    }
    drop(listener);
    graceful.shutdown().await;
}
