//! One intercepted connection: the run's side served as HTTP/1.1 or HTTP/2 (over the run CA's TLS
//! or plaintext), each request checked and rewritten ([`super::rewrite`]), then forwarded over the
//! one connection the host made to the destination, whose protocol is chosen on its own.

use std::convert::Infallible;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use http_body_util::BodyExt;
use hyper::body::{Bytes, Incoming};
use hyper::client::conn::{http1 as client1, http2 as client2};
use hyper::header::{self, HeaderMap, HeaderValue};
use hyper::http::uri::{Authority, PathAndQuery, Scheme};
use hyper::server::conn::{http1 as server1, http2 as server2};
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode, Uri, Version};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio_rustls::rustls::pki_types::ServerName;
use tokio_rustls::rustls::server::Acceptor;
use tokio_rustls::{LazyConfigAcceptor, TlsConnector};

use super::http::{full, Body, Dest};
use super::rewrite::{self, Refused};
use super::tls::H2;
use super::{Misuse, RunSecrets};
use crate::run::Counters;

/// The host's connection to the destination.
enum Upstream {
    /// Connected (TCP, or through the host's proxy), no request sent yet.
    Unopened(TcpStream),
    /// Speaking HTTP/1.1.
    H1(client1::SendRequest<Body>),
    /// Speaking HTTP/2.
    H2(client2::SendRequest<Body>),
    /// Closed, or failed to open (why, without any value).
    Gone(String),
}

/// Tasks of one connection, aborted when it is dropped (the relay stopping the run).
#[derive(Default)]
struct Tasks(Mutex<Vec<JoinHandle<()>>>);

impl Tasks {
    /// Runs `task`, kept to be awaited or aborted.
    fn spawn(&self, task: impl std::future::Future<Output = ()> + Send + 'static) {
        let mut tasks = self.0.lock().unwrap_or_else(|p| p.into_inner());
        tasks.retain(|t| !t.is_finished());
        tasks.push(tokio::spawn(task));
    }

    /// The tasks so far, no longer aborted with these.
    fn take(&self) -> Vec<JoinHandle<()>> {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

impl Drop for Tasks {
    fn drop(&mut self) {
        for task in self.take() {
            task.abort();
        }
    }
}

/// What one intercepted connection shares between its requests.
struct Conn {
    /// The run's secrets.
    secrets: Arc<RunSecrets>,
    /// The destination's name or address, normalized (lowercase, no trailing dot, no brackets).
    host: String,
    /// The destination's port.
    port: u16,
    /// Whether the run's side is TLS (and so the destination's).
    tls: bool,
    /// Whether the run's side speaks HTTP/2.
    h2: bool,
    /// Where misuses are reported.
    misuse: Arc<dyn Fn(Misuse) + Send + Sync>,
    /// The destination's connection, opened by the first request.
    upstream: tokio::sync::Mutex<Upstream>,
    /// Signalled when the destination closes its end (but not when it was upgraded).
    upstream_gone: Arc<Notify>,
    /// Set while an upgrade is under way, so its end of HTTP is not taken for a close.
    upgrading: Arc<AtomicBool>,
    /// Upgraded connections being joined (awaited before the connection ends).
    upgrades: Tasks,
    /// The destination connection's driver (aborted when the connection ends).
    drivers: Tasks,
}

/// See [`super::RunSecrets::intercept`].
pub(super) async fn serve(
    secrets: Arc<RunSecrets>,
    child: TcpStream,
    upstream: TcpStream,
    host: String,
    port: u16,
    counters: Arc<Counters>,
    misuse: Arc<dyn Fn(Misuse) + Send + Sync>,
) {
    let _ = child.set_nodelay(true);
    let _ = upstream.set_nodelay(true);
    let mut first = [0u8; 1];
    match child.peek(&mut first).await {
        Ok(1) => {}
        _ => return,
    }
    let host = rewrite::normalize_host(&host);
    let child = Counted {
        inner: child,
        counters,
    };
    let conn = |tls: bool, h2: bool| {
        Arc::new(Conn {
            secrets: Arc::clone(&secrets),
            host: host.clone(),
            port,
            tls,
            h2,
            misuse: Arc::clone(&misuse),
            upstream: tokio::sync::Mutex::new(Upstream::Unopened(upstream)),
            upstream_gone: Arc::new(Notify::new()),
            upgrading: Arc::new(AtomicBool::new(false)),
            upgrades: Tasks::default(),
            drivers: Tasks::default(),
        })
    };
    // 0x16: a TLS handshake record.
    if first[0] != 0x16 {
        return serve_http(child, conn(false, false)).await;
    }
    let Ok(start) = LazyConfigAcceptor::new(Acceptor::default(), child).await else {
        return;
    };
    let sni = start
        .client_hello()
        .server_name()
        .map(rewrite::normalize_host);
    if sni.as_ref().is_some_and(|sni| *sni != host) {
        return; // a name other than the destination's: closed, nothing forwarded
    }
    let Ok(config) = secrets.ca.server_config(sni.as_deref().unwrap_or(&host)) else {
        return;
    };
    let Ok(tls) = start.into_stream(config).await else {
        return;
    };
    let h2 = tls.get_ref().1.alpn_protocol() == Some(H2);
    serve_http(tls, conn(true, h2)).await;
}

/// Serves HTTP on the run's side until it closes, or (gracefully) until the destination did.
async fn serve_http<IO>(io: IO, conn: Arc<Conn>)
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let io = TokioIo::new(io);
    let gone = Arc::clone(&conn.upstream_gone);
    let service = {
        let conn = Arc::clone(&conn);
        service_fn(move |req| {
            let conn = Arc::clone(&conn);
            async move { Ok::<_, Infallible>(conn.handle(req).await) }
        })
    };
    if conn.h2 {
        let serving = server2::Builder::new(TokioExecutor::new()).serve_connection(io, service);
        tokio::pin!(serving);
        tokio::select! {
            _ = serving.as_mut() => {}
            _ = gone.notified() => {
                serving.as_mut().graceful_shutdown();
                let _ = serving.await;
            }
        }
    } else {
        let serving = server1::Builder::new()
            .timer(TokioTimer::new())
            .serve_connection(io, service)
            .with_upgrades();
        tokio::pin!(serving);
        tokio::select! {
            _ = serving.as_mut() => {}
            _ = gone.notified() => {
                serving.as_mut().graceful_shutdown();
                let _ = serving.await;
            }
        }
    }
    // Upgraded connections outlive HTTP: the connection ends when they do.
    for joined in conn.upgrades.take() {
        let _ = joined.await;
    }
}

impl Conn {
    /// What each request on this connection is checked against.
    fn dest(&self) -> Dest<'_> {
        Dest {
            secrets: &self.secrets,
            host: &self.host,
            port: self.port,
            tls: self.tls,
        }
    }

    /// Answers one request of the run's: refused here, or forwarded.
    async fn handle(self: Arc<Self>, req: Request<Incoming>) -> Response<Body> {
        match self.forward(req).await {
            Ok(response) => response,
            Err(refused) => {
                if let Some(misuse) = refused.misuse {
                    (self.misuse)(misuse);
                }
                text(refused.status, &refused.body, !self.h2)
            }
        }
    }

    /// Checks, rewrites and forwards one request, joining an upgrade after its 101.
    async fn forward(&self, mut req: Request<Incoming>) -> Result<Response<Body>, Refused> {
        if req.method() == Method::CONNECT {
            return Err(Refused::plain(
                StatusCode::METHOD_NOT_ALLOWED,
                "runpython: CONNECT is not forwarded on a connection whose secrets the host fills in",
            ));
        }
        let upgrade = !self.h2 && rewrite::is_upgrade(req.headers());
        let run_upgrade = upgrade.then(|| hyper::upgrade::on(&mut req));
        let (mut parts, body) = req.into_parts();
        let rewritten = rewrite::request(&self.dest(), &mut parts, body).await?;
        if upgrade {
            self.upgrading.store(true, Ordering::SeqCst);
        }
        let sent = self
            .send(Request::from_parts(parts, rewritten.body), upgrade)
            .await;
        let mut response = match sent {
            Ok(response) => response,
            Err(why) => {
                self.upgrading.store(false, Ordering::SeqCst);
                self.unsent(&rewritten.filled, &why).await;
                return Err(Refused::plain(
                    StatusCode::BAD_GATEWAY,
                    &format!("runpython: {}:{}: {why}", self.host, self.port),
                ));
            }
        };
        match run_upgrade {
            Some(run_upgrade) if response.status() == StatusCode::SWITCHING_PROTOCOLS => {
                let dest_upgrade = hyper::upgrade::on(&mut response);
                self.upgrades.spawn(async move {
                    if let (Ok(run), Ok(dest)) = tokio::join!(run_upgrade, dest_upgrade) {
                        let (mut run, mut dest) = (TokioIo::new(run), TokioIo::new(dest));
                        let _ = tokio::io::copy_bidirectional(&mut run, &mut dest).await;
                    }
                });
            }
            _ => self.upgrading.store(false, Ordering::SeqCst),
        }
        let crossed = (response.version() == Version::HTTP_2) != self.h2;
        if crossed {
            rewrite::strip_hop_by_hop(response.headers_mut());
        }
        *response.version_mut() = if self.h2 {
            Version::HTTP_2
        } else {
            Version::HTTP_11
        };
        Ok(response.map(BodyExt::boxed))
    }

    /// Reports the secrets filled into a request that never left, because the connection to the
    /// destination could not be opened (its certificate did not verify for the host, say).
    async fn unsent(&self, filled: &[String], why: &str) {
        if filled.is_empty() {
            return;
        }
        let never_opened =
            matches!(&*self.upstream.lock().await, Upstream::Gone(w) if !w.is_empty());
        if !never_opened {
            return;
        }
        for secret in filled {
            (self.misuse)(Misuse {
                secret: secret.clone(),
                host: self.host.clone(),
                port: self.port,
                reason: format!(
                    "its value was not sent to {}:{}: {why}",
                    self.host, self.port
                ),
            });
        }
    }

    /// Sends `req` to the destination, opening the connection for the first request.
    async fn send(&self, req: Request<Body>, upgrade: bool) -> Result<Response<Incoming>, String> {
        let mut state = self.upstream.lock().await;
        if let Upstream::Unopened(_) = &*state {
            let unopened = std::mem::replace(&mut *state, Upstream::Gone(String::new()));
            if let Upstream::Unopened(tcp) = unopened {
                *state = match self.open(tcp, upgrade).await {
                    Ok(open) => open,
                    Err(why) => Upstream::Gone(why),
                };
            }
        }
        match &mut *state {
            Upstream::H1(send) => {
                send.ready()
                    .await
                    .map_err(|e| format!("the destination closed the connection ({e})"))?;
                let sending = send.send_request(self.for_http1(req));
                drop(state);
                sending
                    .await
                    .map_err(|e| format!("the request failed: {e}"))
            }
            Upstream::H2(send) if !upgrade => {
                let mut send = send.clone();
                drop(state);
                send.ready()
                    .await
                    .map_err(|e| format!("the destination closed the connection ({e})"))?;
                let req = self.for_http2(req)?;
                send.send_request(req)
                    .await
                    .map_err(|e| format!("the request failed: {e}"))
            }
            Upstream::H2(_) => Err(
                "the destination speaks HTTP/2 on this connection, which has \
                                    no upgrade; open a new connection for it"
                    .into(),
            ),
            Upstream::Gone(why) if why.is_empty() => {
                Err("the destination closed the connection".into())
            }
            Upstream::Gone(why) => Err(why.clone()),
            Upstream::Unopened(_) => Err("the connection to the destination was not opened".into()),
        }
    }

    /// Opens HTTP on `tcp`: TLS (ALPN h2 or HTTP/1.1; HTTP/1.1 only for an upgrade) when the run's
    /// side was TLS.
    async fn open(&self, tcp: TcpStream, upgrade: bool) -> Result<Upstream, String> {
        if !self.tls {
            return self.handshake(tcp, false).await;
        }
        let config = if upgrade {
            &self.secrets.upstream.http1
        } else {
            &self.secrets.upstream.any
        };
        let name = ServerName::try_from(self.host.clone())
            .map_err(|e| format!("{} is not a name TLS can verify ({e})", self.host))?;
        let tls = TlsConnector::from(Arc::clone(config))
            .connect(name, tcp)
            .await
            .map_err(|e| format!("TLS with the destination failed: {e}"))?;
        let h2 = tls.get_ref().1.alpn_protocol() == Some(H2);
        self.handshake(tls, h2).await
    }

    /// HTTP/1.1 or HTTP/2 over `io`, its driver spawned (a close signalled unless upgrading).
    async fn handshake<IO>(&self, io: IO, h2: bool) -> Result<Upstream, String>
    where
        IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let io = TokioIo::new(io);
        let fail = |e: hyper::Error| format!("HTTP with the destination failed: {e}");
        let gone = Arc::clone(&self.upstream_gone);
        let upgrading = Arc::clone(&self.upgrading);
        let closed = move || {
            if !upgrading.load(Ordering::SeqCst) {
                gone.notify_one();
            }
        };
        if h2 {
            let (send, connection) = client2::handshake(TokioExecutor::new(), io)
                .await
                .map_err(fail)?;
            self.drivers.spawn(async move {
                let _ = connection.await;
                closed();
            });
            Ok(Upstream::H2(send))
        } else {
            let (send, connection) = client1::handshake(io).await.map_err(fail)?;
            self.drivers.spawn(async move {
                let _ = connection.with_upgrades().await;
                closed();
            });
            Ok(Upstream::H1(send))
        }
    }

    /// The request as HTTP/1.1 sends it: an origin-form target and a `Host` header.
    fn for_http1(&self, mut req: Request<Body>) -> Request<Body> {
        if self.h2 {
            rewrite::strip_hop_by_hop(req.headers_mut());
            *req.version_mut() = Version::HTTP_11;
        }
        if !req.headers().contains_key(header::HOST) {
            let authority = req
                .uri()
                .authority()
                .map_or_else(|| self.authority(), ToString::to_string);
            if let Ok(value) = HeaderValue::from_str(&authority) {
                req.headers_mut().insert(header::HOST, value);
            }
        }
        if req.uri().authority().is_some() {
            let target = req
                .uri()
                .path_and_query()
                .cloned()
                .unwrap_or_else(|| PathAndQuery::from_static("/"));
            *req.uri_mut() = Uri::from(target);
        }
        req
    }

    /// The request as HTTP/2 sends it: scheme and authority in the target, no connection headers.
    fn for_http2(&self, mut req: Request<Body>) -> Result<Request<Body>, String> {
        let host = req.headers_mut().remove(header::HOST);
        if !self.h2 {
            rewrite::strip_hop_by_hop(req.headers_mut());
        }
        let authority = match (req.uri().authority(), host) {
            (Some(authority), _) => authority.clone(),
            (None, Some(host)) => Authority::try_from(host.as_bytes())
                .map_err(|_| "the request's Host is not a host".to_string())?,
            (None, None) => Authority::try_from(self.authority())
                .map_err(|_| "the destination's name is not a host".to_string())?,
        };
        let mut uri = std::mem::take(req.uri_mut()).into_parts();
        uri.scheme = Some(if self.tls {
            Scheme::HTTPS
        } else {
            Scheme::HTTP
        });
        uri.authority = Some(authority);
        if uri.path_and_query.is_none() {
            uri.path_and_query = Some(PathAndQuery::from_static("/"));
        }
        *req.uri_mut() =
            Uri::from_parts(uri).map_err(|e| format!("the request's target is invalid: {e}"))?;
        *req.version_mut() = Version::HTTP_2;
        Ok(req)
    }

    /// `host[:port]` for a `Host` header, the port left out when it is the scheme's.
    fn authority(&self) -> String {
        let host = if self.host.contains(':') {
            format!("[{}]", self.host)
        } else {
            self.host.clone()
        };
        match (self.tls, self.port) {
            (true, 443) | (false, 80) => host,
            (_, port) => format!("{host}:{port}"),
        }
    }
}

/// A short plain-text answer of the proxy's own (`close`: end an HTTP/1.1 connection after it).
pub(super) fn text(status: StatusCode, body: &str, close: bool) -> Response<Body> {
    let mut response = Response::new(full(Bytes::from(format!("{body}\n"))));
    *response.status_mut() = status;
    let headers: &mut HeaderMap = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    if close {
        headers.insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    response
}

/// The run's end of the connection, counting what the code sent (read from it) and received
/// (written to it).
struct Counted {
    /// The run's end.
    inner: TcpStream,
    /// The connection's counts (the relay's log entry).
    counters: Arc<Counters>,
}

impl AsyncRead for Counted {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        let n = (buf.filled().len() - before) as u64;
        self.counters.sent(n);
        polled
    }
}

impl AsyncWrite for Counted {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = polled {
            self.counters.received(n as u64);
        }
        polled
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if let Poll::Ready(Ok(n)) = polled {
            self.counters.received(n as u64);
        }
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
