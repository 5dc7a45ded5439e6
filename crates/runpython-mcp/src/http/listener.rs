//! `serve`'s accept loop: each connection served by hyper with a deadline for a request's headers,
//! holding a slot of [`super::slots`] (the caps on connections, unauthenticated ones and each
//! token's share, and which connection gives its slot up), closed once idle when asked to, and
//! drained on shutdown. The caps follow the process's descriptor limit, whose soft value is raised
//! to its hard one first. Each request carries its [`Connection`] (for the authentication
//! middleware) and the instant its head arrived (for the body deadline); a request counts as in
//! flight until its response has been sent whole.

use std::convert::Infallible;
use std::os::fd::AsRawFd;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower::Service;

use super::body::Arrived;
use super::slots::{Crowded, SlotLimits, Slots, Ticket};

/// Descriptors kept for everything but connections: runs' pipes and sockets, the store, logs.
const RESERVED_FDS: u64 = 128;

/// How `serve` bounds its connections.
#[derive(Debug, Clone)]
pub struct ConnectionLimits {
    /// The caps on slots (connections at least 8).
    pub slots: SlotLimits,
    /// A request's headers must arrive within this; a connection that has made no authenticated
    /// request within it is closed.
    pub header_timeout: Duration,
}

impl ConnectionLimits {
    /// The limits for `wanted` connections (each token holding at most `per_token` of them, a
    /// quarter by default, 0 for no limit), within what the descriptor limit `nofile` leaves.
    pub fn within(
        wanted: usize,
        per_token: Option<usize>,
        nofile: u64,
        header_timeout: Duration,
    ) -> Self {
        let room = usize::try_from(nofile.saturating_sub(RESERVED_FDS)).unwrap_or(usize::MAX);
        let max_connections = wanted.min(room).max(8);
        Self {
            slots: SlotLimits {
                max_connections,
                max_unauthenticated: (max_connections / 2).max(4),
                max_per_token: per_token.unwrap_or((max_connections / 4).max(1)),
            },
            header_timeout,
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
    slots: Arc<Slots>,
}

impl Connection {
    /// The connection made a request authenticated as `tenant`: from now on it holds one of the
    /// tenant's slots, or (the tenant holding its share, all busy) the request is refused.
    pub(crate) fn authenticated(&self, tenant: &str) -> Result<(), Crowded> {
        self.slots.authenticate(self.id, tenant)
    }
}

/// Counts a request in flight on its connection until dropped.
struct InFlight(Arc<AtomicUsize>);

impl InFlight {
    fn new(busy: &Arc<AtomicUsize>) -> Self {
        busy.fetch_add(1, Ordering::SeqCst);
        Self(Arc::clone(busy))
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A response body that keeps its request in flight until it has been sent whole (or dropped):
/// an SSE stream is a request in the middle of being answered for as long as it lasts.
struct Tracked {
    body: Body,
    _in_flight: InFlight,
}

impl http_body::Body for Tracked {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

/// A connection's socket, noting that its client has sent a byte (the slots tell a client whose
/// request is being read from one that only holds a socket open).
struct Heard {
    stream: TcpStream,
    heard: Arc<AtomicBool>,
}

impl AsyncRead for Heard {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        // Noted before the read takes the bytes out of the kernel, not after: the slots ask
        // "heard, or bytes waiting?" from the accept loop's thread, and between a read that drained
        // the socket and a note made after it the answer was "neither", so a client whose request
        // was being read could be closed as a silent one (seen under load). Readiness means bytes or
        // the end of the stream wait; either way the client is no longer a socket that said nothing.
        if Pin::new(&mut self.stream).poll_read_ready(cx).is_ready() {
            self.heard.store(true, Ordering::SeqCst);
        }
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Heard {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
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
    let slots = Arc::new(Slots::new(limits.slots));
    let tracker = TaskTracker::new();
    let stopping = CancellationToken::new();
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout);
    builder.http2().timer(TokioTimer::new());
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
        let Some(ticket) = slots.admit(stream.as_raw_fd()) else {
            continue; // every slot is busy mid-request: refused (dropped)
        };
        let connection = Arc::new(Connection {
            id: ticket.id,
            slots: Arc::clone(&slots),
        });
        let (router, busy) = (app.clone(), Arc::clone(&ticket.busy));
        let service = hyper::service::service_fn(move |mut request: hyper::Request<_>| {
            let in_flight = InFlight::new(&busy);
            request.extensions_mut().insert(Arc::clone(&connection));
            request.extensions_mut().insert(Arrived(Instant::now()));
            let call = router.clone().call(request.map(Body::new));
            async move {
                let response = call.await?;
                Ok::<_, Infallible>(response.map(|body| {
                    Body::new(Tracked {
                        body,
                        _in_flight: in_flight,
                    })
                }))
            }
        });
        let conn = builder
            .serve_connection_with_upgrades(
                TokioIo::new(Heard {
                    stream,
                    heard: Arc::clone(&ticket.heard),
                }),
                service,
            )
            .into_owned();
        let (slots, stopping, header_timeout) =
            (Arc::clone(&slots), stopping.clone(), limits.header_timeout);
        tracker.spawn(async move {
            tokio::pin!(conn);
            let drain = tokio::select! {
                _ = conn.as_mut() => false,
                () = ticket.abort.cancelled() => false,
                () = unauthenticated_deadline(&slots, &ticket, header_timeout) => false,
                () = ticket.close.cancelled() => true,
                () = stopping.cancelled() => true,
            };
            if drain {
                // A request in flight is answered first; an idle connection closes at once.
                conn.as_mut().graceful_shutdown();
                let _ = conn.await;
            }
            slots.release(ticket.id);
        });
    }
    drop(listener);
    stopping.cancel();
    tracker.close();
    tracker.wait().await;
}

/// Resolves when connection `ticket` has made no authenticated request by the header deadline
/// (else never).
async fn unauthenticated_deadline(slots: &Slots, ticket: &Ticket, header_timeout: Duration) {
    tokio::time::sleep(header_timeout).await;
    if !slots.is_unauthenticated(ticket.id) {
        std::future::pending::<()>().await;
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use tokio::io::{AsyncWriteExt, ReadBuf};

    /// The slots take a connection for a silent one when it is neither heard nor has bytes waiting;
    /// so the note must be made no later than the read that takes the bytes. A read with no room
    /// takes nothing: the client must already count as heard, its bytes still in the kernel.
    #[tokio::test]
    async fn a_client_is_heard_before_its_bytes_leave_the_kernel() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut client = tokio::net::TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (stream, _) = listener.accept().await.unwrap();
        client.write_all(b"POST /mcp HTTP/1.1\r\n").await.unwrap();
        stream.readable().await.unwrap();
        let heard = Arc::new(AtomicBool::new(false));
        let mut conn = Heard {
            stream,
            heard: Arc::clone(&heard),
        };
        let mut room = [0u8; 0];
        let mut buf = ReadBuf::new(&mut room);
        let waker = futures_util::task::noop_waker();
        let _ = Pin::new(&mut conn).poll_read(&mut Context::from_waker(&waker), &mut buf);
        assert!(
            heard.load(Ordering::SeqCst),
            "bytes wait, yet the client is not heard"
        );
        let mut byte = [0u8; 1];
        assert_eq!(
            conn.stream.peek(&mut byte).await.unwrap(),
            1,
            "the bytes are still there"
        );
    }
}
