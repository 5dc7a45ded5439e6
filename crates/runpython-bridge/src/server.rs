//! The host side: a listener on a path socket, the handshake, and concurrent dispatch of calls.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures_util::stream::{FuturesUnordered, StreamExt};
use futures_util::FutureExt;
use interprocess::local_socket::tokio::{prelude::*, Stream};
use interprocess::local_socket::{GenericFilePath, ListenerOptions};
use serde::Deserialize;
use serde_json::{json, Map, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::frame::{encode, FrameDecoder, DEFAULT_MAX_FRAME};
use crate::tool::{ToolArgs, ToolError, ToolSet};
use crate::{Error, PROTOCOL_VERSION};

/// Limits of one run's bridge.
#[derive(Debug, Clone)]
pub struct BridgeConfig {
    /// Largest frame either side may send (default 16 MiB).
    pub max_frame: usize,
    /// How long one call may take before the code gets a `TimeoutError` (default 60 s).
    pub call_timeout: Duration,
    /// Calls allowed in one run (default 1,000); the next one ends the run with `ToolCallLimit`.
    pub max_calls: u32,
    /// How long a new connection has to present the handshake.
    pub handshake_timeout: Duration,
}

impl Default for BridgeConfig {
    fn default() -> Self {
        Self {
            max_frame: DEFAULT_MAX_FRAME,
            call_timeout: Duration::from_secs(60),
            max_calls: 1_000,
            handshake_timeout: Duration::from_secs(10),
        }
    }
}

/// What happened on a run's bridge, readable while and after it serves.
#[derive(Debug, Default)]
pub struct BridgeStats {
    calls: AtomicU32,
    impure_calls: AtomicU32,
    limit_exceeded: AtomicBool,
}

impl BridgeStats {
    /// Calls received (including refused ones over the budget).
    pub fn calls(&self) -> u32 {
        self.calls.load(Ordering::Relaxed)
    }
    /// Calls to tools not declared pure (or to no tool at all).
    pub fn impure_calls(&self) -> u32 {
        self.impure_calls.load(Ordering::Relaxed)
    }
    /// True once a call went over the budget.
    pub fn limit_exceeded(&self) -> bool {
        self.limit_exceeded.load(Ordering::Relaxed)
    }
    /// Counts `n` calls made elsewhere on this run's behalf (by a run nested in it), so they come out
    /// of its budget: later calls over the budget are refused as if the run had made them itself.
    pub fn charge(&self, n: u32) {
        self.calls.fetch_add(n, Ordering::Relaxed);
    }
}

/// One run's bridge: bound to a path, serving a tool set to connections that know the token.
#[derive(Debug)]
pub struct Bridge {
    listener: interprocess::local_socket::tokio::Listener,
    path: PathBuf,
    token: String,
    tools: ToolSet,
    config: BridgeConfig,
    stats: Arc<BridgeStats>,
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
    /// Listens on `path` (which must not exist; its directory should be private to the run).
    pub fn bind(path: &Path, tools: ToolSet, config: BridgeConfig) -> Result<Self, Error> {
        let name = path
            .to_fs_name::<GenericFilePath>()
            .map_err(|source| Error::Bind {
                path: path.to_owned(),
                source,
            })?;
        let listener = ListenerOptions::new()
            .name(name)
            .create_tokio()
            .map_err(|source| Error::Bind {
                path: path.to_owned(),
                source,
            })?;
        Ok(Self {
            listener,
            path: path.to_owned(),
            token: new_token()?,
            tools,
            config,
            stats: Arc::default(),
        })
    }

    /// The per-run secret the child must present.
    pub fn token(&self) -> &str {
        &self.token
    }

    /// Counters that stay readable after `serve` ends.
    pub fn stats(&self) -> Arc<BridgeStats> {
        Arc::clone(&self.stats)
    }

    /// Everything the child's client ([`crate::CLIENT_PY`], importable as `runpython_tools`) needs: the
    /// socket path, the token, the frame cap and the tools.
    pub fn client_spec(&self) -> Value {
        json!({
            "path": self.path,
            "token": self.token,
            "max_frame": self.config.max_frame,
            "tools": self.tools.client_specs(),
        })
    }

    /// Serves until a connection breaks the protocol (`Err`: the run must end) or the future is dropped
    /// (the run ended). Connections without the right handshake are dropped and do not end the run.
    pub async fn serve(self) -> Result<(), Error> {
        let shared = Arc::new(self);
        let mut connections = FuturesUnordered::new();
        loop {
            tokio::select! {
                accepted = shared.listener.accept() => {
                    let stream = accepted.map_err(Error::Io)?;
                    connections.push(serve_connection(Arc::clone(&shared), stream));
                }
                Some(done) = connections.next(), if !connections.is_empty() => done?,
            }
        }
    }
}

async fn serve_connection(bridge: Arc<Bridge>, stream: Stream) -> Result<(), Error> {
    let decoder = FrameDecoder::new(bridge.config.max_frame);
    let mut buf = Vec::with_capacity(8192);
    let mut reader = &stream;
    let mut writer = &stream;

    // Handshake: the first frame must be a hello with this run's token, in time.
    let hello = tokio::time::timeout(
        bridge.config.handshake_timeout,
        read_frame(&mut reader, &mut buf, &decoder),
    )
    .await;
    match hello {
        Ok(Ok(Some(frame))) => match serde_json::from_slice::<Incoming>(&frame) {
            Ok(Incoming::Hello { version, token })
                if token == bridge.token && version == PROTOCOL_VERSION => {}
            _ => return Ok(()), // not ours: drop the connection, keep the run
        },
        _ => return Ok(()),
    }

    let mut in_flight = FuturesUnordered::new();
    let mut ids_in_flight = std::collections::HashSet::new();
    let mut eof = false;
    loop {
        tokio::select! {
            frame = read_frame(&mut reader, &mut buf, &decoder), if !eof => {
                let Some(frame) = frame? else { eof = true; if in_flight.is_empty() { return Ok(()) } continue };
                let call: Incoming = serde_json::from_slice(&frame).map_err(|e| Error::Malformed(format!(
                    "frame is not a call ({e}): {}", String::from_utf8_lossy(&frame[..frame.len().min(200)]))))?;
                let Incoming::Call { id, tool, args, kwargs } = call else {
                    return Err(Error::Malformed("a second handshake on an open connection".into()));
                };
                if !ids_in_flight.insert(id) {
                    return Err(Error::Malformed(format!("call id {id} reused while still in flight")));
                }
                in_flight.push(dispatch(Arc::clone(&bridge), id, tool, ToolArgs { args, kwargs }));
            }
            Some((id, reply)) = in_flight.next(), if !in_flight.is_empty() => {
                ids_in_flight.remove(&id);
                let payload = serde_json::to_vec(&reply).map_err(|e| Error::Malformed(e.to_string()))?;
                let frame = match encode(&payload, bridge.config.max_frame) {
                    Ok(frame) => frame,
                    Err(Error::FrameTooLarge { len, max }) => {
                        let reply = error_reply(id, &ToolError::new("ValueError", format!(
                            "the tool's result is {len} bytes as JSON, over the bridge's frame limit of {max}")));
                        encode(&serde_json::to_vec(&reply).map_err(|e| Error::Malformed(e.to_string()))?, max)?
                    }
                    Err(e) => return Err(e),
                };
                if writer.write_all(&frame).await.is_err() {
                    return Ok(()); // the child went away; the run's own end is reported elsewhere
                }
                if eof && in_flight.is_empty() { return Ok(()) }
            }
        }
    }
}

/// Reads until one whole frame is buffered; `Ok(None)` at a clean end of stream.
async fn read_frame(
    reader: &mut &Stream,
    buf: &mut Vec<u8>,
    decoder: &FrameDecoder,
) -> Result<Option<Vec<u8>>, Error> {
    loop {
        if let Some(frame) = decoder.decode(buf)? {
            return Ok(Some(frame));
        }
        let mut chunk = [0u8; 65536];
        let n = reader.read(&mut chunk).await.map_err(Error::Io)?;
        if n == 0 {
            if buf.is_empty() {
                return Ok(None);
            }
            return Err(Error::Malformed(format!(
                "connection closed inside a frame ({} bytes pending)",
                buf.len()
            )));
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

async fn dispatch(bridge: Arc<Bridge>, id: u64, name: String, args: ToolArgs) -> (u64, Value) {
    let n = bridge.stats.calls.fetch_add(1, Ordering::Relaxed) + 1;
    if n > bridge.config.max_calls {
        bridge.stats.limit_exceeded.store(true, Ordering::Relaxed);
        let error = ToolError::new(
            "ToolCallLimit",
            format!(
                "the run made more than {} tool calls, its budget; batch work into fewer calls",
                bridge.config.max_calls
            ),
        );
        return (id, error_reply(id, &error));
    }
    let tool = bridge.tools.get(&name).cloned();
    if !tool.as_ref().is_some_and(|t| t.is_pure()) {
        bridge.stats.impure_calls.fetch_add(1, Ordering::Relaxed);
    }
    let Some(tool) = tool else {
        let error = ToolError::new("NameError", format!("no tool named {name:?} on the host"));
        return (id, error_reply(id, &error));
    };
    let timeout = bridge.config.call_timeout;
    let call = std::panic::AssertUnwindSafe(tool.call(args)).catch_unwind();
    let outcome = match tokio::time::timeout(timeout, call).await {
        Ok(Ok(Ok(value))) => Ok(value),
        Ok(Ok(Err(error))) => Err(error),
        Ok(Err(panic)) => Err(ToolError::new(
            "ToolError",
            format!("the tool's handler panicked: {}", panic_message(&panic)),
        )),
        Err(_) => Err(ToolError::new(
            "TimeoutError",
            format!("tool {name:?} did not answer within {timeout:?}"),
        )),
    };
    let reply = match outcome {
        Ok(value) => json!({"type": "result", "id": id, "result": value}),
        Err(error) => error_reply(id, &error),
    };
    (id, reply)
}

fn error_reply(id: u64, error: &ToolError) -> Value {
    json!({"type": "result", "id": id, "error": {"type": error.kind, "message": error.message}})
}

fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a non-string panic payload".into())
}

fn new_token() -> Result<String, Error> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).map_err(|e| Error::Io(std::io::Error::other(e.to_string())))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}
