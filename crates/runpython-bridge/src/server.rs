//! The host side's connection: one per run, over a socket pair (or, for now, a path socket that
//! accepts one connection), the handshake, and the frame loop with its back-pressure.

use std::collections::HashSet;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use futures_util::stream::{FuturesUnordered, StreamExt};
use interprocess::local_socket::tokio::{prelude::*, Listener, Stream};
use interprocess::local_socket::{GenericFilePath, ListenerOptions};
use interprocess::os::unix::uds_local_socket::tokio::Stream as UdsStream;
use serde::Deserialize;
use serde_json::{Map, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;

use crate::calls::{
    dispatch, error_reply, BridgeStats, CallBudget, JournalSink, ReplayPlan, Shared, SpillStore,
    Stop,
};
use crate::config::BridgeConfig;
use crate::frame::{encode, FrameDecoder};
use crate::journal::Journal;
use crate::tool::{ToolArgs, ToolError, ToolSet};
use crate::{Error, PROTOCOL_VERSION};

/// The largest first frame read as a handshake; the hello is under 100 bytes.
const MAX_HELLO: usize = 1024;
/// Connections to a path socket whose handshake is being read at once; more wait in the kernel's
/// backlog. Each holds at most one read of [`READ_CHUNK`] bytes.
const MAX_PENDING_HANDSHAKES: usize = 4;
/// The most read from the socket at once.
const READ_CHUNK: usize = 64 << 10;
/// A read buffer grown past this by a large frame is given back once it is empty.
const KEPT_BUFFER: usize = 1 << 20;

/// The host's end of a bridge socket pair, for [`Bridge::new`].
#[derive(Debug)]
pub struct HostEnd(std::os::unix::net::UnixStream);

/// What the child's bridge client (`runpython_tools.install`) is given to reach its bridge: sent
/// within the runner's request. The client checks its keys as the runner checks the request's.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ClientSpec {
    /// The socket to connect to (a bridge made by [`Bridge::bind`]); `None` for a socket pair.
    pub path: Option<String>,
    /// The descriptor the child inherited its end of a [`socket_pair`] as; `None` with a path.
    pub fd: Option<i32>,
    /// The handshake's per-run token.
    pub token: String,
    /// The largest frame either side sends.
    pub max_frame: usize,
    /// The tools, one function each.
    pub tools: Vec<crate::tool::ToolClientSpec>,
}

/// A connected `AF_UNIX` stream pair for one run's bridge: the host keeps the [`HostEnd`] and hands the
/// descriptor to the child as an inherited file descriptor. Both ends are close-on-exec, so neither
/// leaks into another process by accident: the code that spawns the child places the descriptor at
/// the number it passes to [`Bridge::client_spec_fd`] (`dup2` clears the flag on the copy).
///
/// Unlike a path socket, nothing else can connect to it: the bridge has exactly one connection.
pub fn socket_pair() -> Result<(HostEnd, OwnedFd), Error> {
    // std creates both ends with SOCK_CLOEXEC.
    let (host, child) = std::os::unix::net::UnixStream::pair().map_err(Error::SocketPair)?;
    Ok((HostEnd(host), OwnedFd::from(child)))
}

/// Where the bridge's one connection comes from.
#[derive(Debug)]
enum Endpoint {
    /// The host's end of a socket pair: already connected (made a Tokio stream when serving starts).
    Pair(std::os::unix::net::UnixStream),
    /// A listener on a path: the first connection that passes the handshake is the one.
    Path { listener: Listener, path: PathBuf },
}

/// One run's bridge: serves a tool set to the run's one connection, once it presents the token.
#[derive(Debug)]
pub struct Bridge {
    endpoint: Endpoint,
    token: String,
    shared: Shared,
    stopped: mpsc::Receiver<Stop>,
}

#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "lowercase")]
enum Incoming {
    Hello {
        version: u32,
        token: String,
    },
    Call {
        id: u64,
        tool: String,
        #[serde(default)]
        args: Vec<Value>,
        #[serde(default)]
        kwargs: Map<String, Value>,
    },
}

impl Bridge {
    /// Serves the one connection of a [`socket_pair`]. The child may send its hello at any time (it
    /// does on its first tool call): only it holds the other end, so no handshake timeout applies.
    pub fn new(host: HostEnd, tools: ToolSet, config: BridgeConfig) -> Result<Self, Error> {
        host.0.set_nonblocking(true).map_err(Error::SocketPair)?;
        Self::with_endpoint(Endpoint::Pair(host.0), tools, config)
    }

    /// Listens on `path` (which must not exist; its directory should be private to the run). The first
    /// connection that presents the handshake is the run's one connection: the listener is then closed
    /// (its path removed), so later connections are refused. Call it within a Tokio runtime.
    pub fn bind(path: &Path, tools: ToolSet, config: BridgeConfig) -> Result<Self, Error> {
        let bind_error = |source| Error::Bind {
            path: path.to_owned(),
            source,
        };
        let name = path.to_fs_name::<GenericFilePath>().map_err(bind_error)?;
        let listener = ListenerOptions::new()
            .name(name)
            .create_tokio()
            .map_err(bind_error)?;
        let endpoint = Endpoint::Path {
            listener,
            path: path.to_owned(),
        };
        Self::with_endpoint(endpoint, tools, config)
    }

    fn with_endpoint(
        endpoint: Endpoint,
        tools: ToolSet,
        config: BridgeConfig,
    ) -> Result<Self, Error> {
        let (shared, stopped) = Shared::new(tools, config);
        Ok(Self {
            endpoint,
            token: new_token()?,
            shared,
            stopped,
        })
    }

    /// Replays `plan` before calling tools for real (a resumed run).
    pub fn with_replay(mut self, plan: ReplayPlan) -> Self {
        self.shared.set_replay(plan);
        self
    }

    /// Names the run this bridge serves: each call's [`ToolArgs::call_id`] is then
    /// `<run_id>.<ordinal>`, the ordinal the journal keeps for it (a call a resumed run makes again
    /// keeps its ordinal, hence its id).
    pub fn with_run_id(mut self, run_id: impl Into<String>) -> Self {
        self.shared.run_id = Some(run_id.into());
        self
    }

    /// Persists the journal through `sink` around every call (durable runs).
    pub fn with_sink(mut self, sink: Arc<dyn JournalSink>) -> Self {
        self.shared.sink = Some(sink);
        self
    }

    /// Counts this run's calls against `budget`, shared with the runs nested in it (or the run it is
    /// nested in): the tree's calls in all and in flight at once.
    pub fn with_budget(mut self, budget: Arc<CallBudget>) -> Self {
        self.shared.budget = Some(budget);
        self
    }

    /// Keeps the journal's large results in `spill` (and reads them back from it on replay).
    pub fn with_spill(mut self, spill: Arc<dyn SpillStore>) -> Self {
        self.shared.spill = Some(spill);
        self
    }

    /// This run's journal, readable while and after it serves.
    pub fn journal(&self) -> Arc<Mutex<Journal>> {
        Arc::clone(&self.shared.journal)
    }

    /// Counters that stay readable after `serve` ends.
    pub fn stats(&self) -> Arc<BridgeStats> {
        Arc::clone(&self.shared.stats)
    }

    /// Everything the child's client ([`crate::CLIENT_PY`], importable as `runpython_tools`) needs to
    /// reach a bridge made by [`Bridge::bind`]: the socket path, the token, the frame cap and the tools.
    /// For a [`socket_pair`] bridge the path is `None`: use [`Bridge::client_spec_fd`].
    pub fn client_spec(&self) -> ClientSpec {
        let path = match &self.endpoint {
            Endpoint::Path { path, .. } => Some(path.to_string_lossy().into_owned()),
            Endpoint::Pair(_) => None,
        };
        self.spec(path, None)
    }

    /// What the child's client needs when it inherits its end of a [`socket_pair`] as file descriptor
    /// `child_fd`: the client wraps that descriptor (on the first call) instead of connecting to a path.
    pub fn client_spec_fd(&self, child_fd: i32) -> ClientSpec {
        self.spec(None, Some(child_fd))
    }

    fn spec(&self, path: Option<String>, fd: Option<i32>) -> ClientSpec {
        ClientSpec {
            path,
            fd,
            token: self.token.clone(),
            max_frame: self.shared.config.max_frame,
            tools: self.shared.tools.client_specs(),
        }
    }

    /// Serves until the run must stop: a suspension, a replay divergence, or a broken protocol. A
    /// connection without the right handshake is dropped and does not stop the run; neither does the
    /// end of the run's connection (the run ends when its child exits). Dropping the future (the run
    /// ended) is the normal end.
    pub async fn serve(self) -> Stop {
        let Bridge {
            endpoint,
            token,
            shared,
            mut stopped,
        } = self;
        let shared = Arc::new(shared);
        let connection = async {
            let accepted = match endpoint {
                Endpoint::Pair(host) => {
                    let stream = UdsStream::try_from(OwnedFd::from(host)).map_err(Error::Io)?;
                    handshake(&shared, &token, stream.into(), None).await
                }
                Endpoint::Path { listener, .. } => accept_one(&shared, &token, listener).await?,
            };
            match accepted {
                Some((stream, buf)) => serve_connection(&shared, stream, buf).await,
                None => Ok(()),
            }
        };
        tokio::select! {
            ended = connection => {
                if let Err(e) = ended {
                    return Stop::Failed(e);
                }
            }
            Some(stop) = stopped.recv() => return stop,
        }
        // The connection is gone; only a stop already on its way can still end the run from here.
        match stopped.recv().await {
            Some(stop) => stop,
            None => std::future::pending().await,
        }
    }
}

/// Accepts connections on `listener` until one presents the handshake; the listener is dropped on
/// return, which removes its path, so no other connection can be made.
async fn accept_one(
    shared: &Shared,
    token: &str,
    listener: Listener,
) -> Result<Option<(Stream, Vec<u8>)>, Error> {
    let mut pending = FuturesUnordered::new();
    loop {
        tokio::select! {
            accepted = listener.accept(), if pending.len() < MAX_PENDING_HANDSHAKES => {
                let stream = accepted.map_err(Error::Io)?;
                pending.push(handshake(shared, token, stream, Some(shared.config.handshake_timeout)));
            }
            Some(done) = pending.next(), if !pending.is_empty() => {
                if done.is_some() {
                    return Ok(done);
                }
            }
        }
    }
}

/// The stream and what was read past the hello, when the first frame is a hello with this run's token
/// and protocol version, within `timeout` if there is one; else `None` (the stream is dropped).
async fn handshake(
    shared: &Shared,
    token: &str,
    stream: Stream,
    timeout: Option<std::time::Duration>,
) -> Option<(Stream, Vec<u8>)> {
    let decoder = FrameDecoder::new(MAX_HELLO.min(shared.config.max_frame));
    let mut buf = Vec::new();
    let read_hello = async {
        loop {
            // A first frame over the hello's cap is not ours.
            if let Some(frame) = decoder.decode(&mut buf).ok()? {
                return Some(frame);
            }
            if read_more(&stream, &mut buf).await.ok()? == 0 {
                return None;
            }
        }
    };
    let frame = match timeout {
        Some(timeout) => tokio::time::timeout(timeout, read_hello).await.ok()??,
        None => read_hello.await?,
    };
    match serde_json::from_slice::<Incoming>(&frame) {
        Ok(Incoming::Hello { version, token: t }) if t == token && version == PROTOCOL_VERSION => {
            Some((stream, buf))
        }
        _ => None,
    }
}

/// Appends one read of the stream to `buf`; the byte count, 0 at the end of the stream.
async fn read_more(stream: &Stream, buf: &mut Vec<u8>) -> Result<usize, Error> {
    buf.reserve(READ_CHUNK);
    let mut limited = stream.take(READ_CHUNK as u64);
    limited.read_buf(buf).await.map_err(Error::Io)
}

/// Serves calls on the run's connection until the child closes it and every call it made is answered.
/// `buf` holds what was read past the hello.
///
/// Back-pressure: a frame is taken off the stream only while fewer than `max_concurrent_calls` calls
/// are being served and its size fits in `max_in_flight_bytes` with theirs (a lone frame always fits).
/// Otherwise nothing more is read until a call finishes: the child's writes block in the kernel.
async fn serve_connection(
    shared: &Arc<Shared>,
    stream: Stream,
    mut buf: Vec<u8>,
) -> Result<(), Error> {
    let config = &shared.config;
    let decoder = FrameDecoder::new(config.max_frame);
    let max_calls = config.max_concurrent_calls.max(1);
    let mut in_flight = FuturesUnordered::new();
    let mut ids_in_flight = HashSet::new();
    let mut bytes_in_flight = 0usize;
    let mut eof = false;
    loop {
        // Take every whole frame already read, while the caps allow.
        let blocked = loop {
            let Some(len) = decoder.announced(&buf)? else {
                break false;
            };
            let full = in_flight.len() >= max_calls
                || bytes_in_flight.saturating_add(len) > config.max_in_flight_bytes;
            if full && !in_flight.is_empty() {
                break true;
            }
            let Some(frame) = decoder.decode(&mut buf)? else {
                break false;
            };
            if buf.is_empty() && buf.capacity() > KEPT_BUFFER {
                buf = Vec::new();
            }
            let Incoming::Call {
                id,
                tool,
                mut args,
                mut kwargs,
            } = serde_json::from_slice(&frame).map_err(|e| {
                Error::Malformed(format!(
                    "frame is not a call ({e}): {}",
                    String::from_utf8_lossy(&frame[..frame.len().min(200)])
                ))
            })?
            else {
                return Err(Error::Malformed(
                    "a second handshake on an open connection".into(),
                ));
            };
            if !ids_in_flight.insert(id) {
                return Err(Error::Malformed(format!(
                    "call id {id} reused while still in flight"
                )));
            }
            args.iter_mut().for_each(crate::canonical_floats);
            kwargs.values_mut().for_each(crate::canonical_floats);
            bytes_in_flight += len;
            let ordinal = shared.next_ordinal();
            let call = dispatch(
                Arc::clone(shared),
                id,
                ordinal,
                tool,
                ToolArgs {
                    args,
                    kwargs,
                    call_id: None,
                },
            );
            in_flight.push(async move {
                let (id, reply) = call.await;
                (id, len, reply)
            });
        };
        if eof && !blocked && !buf.is_empty() {
            return Err(Error::Malformed(format!(
                "connection closed inside a frame ({} bytes pending)",
                buf.len()
            )));
        }
        if eof && in_flight.is_empty() {
            return Ok(());
        }
        tokio::select! {
            read = read_more(&stream, &mut buf), if !eof && !blocked => {
                eof = read? == 0;
            }
            Some((id, len, reply)) = in_flight.next(), if !in_flight.is_empty() => {
                ids_in_flight.remove(&id);
                bytes_in_flight -= len;
                let Some(reply) = reply else { continue }; // the run is stopping: no answer
                let mut writer = &stream;
                if writer.write_all(&reply_frame(id, &reply, config.max_frame)?).await.is_err() {
                    return Ok(()); // the child went away; the run's own end is reported elsewhere
                }
            }
        }
    }
}

/// The frame of `reply`; a result over the frame cap becomes a `ValueError` for the code.
fn reply_frame(id: u64, reply: &Value, max_frame: usize) -> Result<Vec<u8>, Error> {
    let payload = serde_json::to_vec(reply).map_err(|e| Error::Malformed(e.to_string()))?;
    match encode(&payload, max_frame) {
        Err(Error::FrameTooLarge { len, max }) => {
            let message = format!(
                "the tool's result is {len} bytes as JSON, over the bridge's frame limit of {max}"
            );
            let reply = error_reply(id, &ToolError::new("ValueError", message));
            let payload =
                serde_json::to_vec(&reply).map_err(|e| Error::Malformed(e.to_string()))?;
            encode(&payload, max)
        }
        framed => framed,
    }
}

fn new_token() -> Result<String, Error> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).map_err(|e| Error::Io(std::io::Error::other(e.to_string())))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}
