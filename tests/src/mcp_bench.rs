//! What the bench harness measures of the MCP servers: a trivial `run_python` through `runpython mcp`
//! (raw JSON-RPC lines on its stdio, as any client writes them) against the same run through the
//! library, and calls per second through `runpython serve` from concurrent clients, to one host and
//! through HAProxy to three.

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::stats::p50;
use runpython_core::{PoolConfig, RunPython};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

type Result<T> = std::result::Result<T, Box<dyn std::error::Error + Send + Sync>>;

const PROTOCOL: &str = "2025-11-25";

fn send(message: Value) -> Vec<u8> {
    let mut line = message.to_string().into_bytes();
    line.push(b'\n');
    line
}

fn initialize(id: u64) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "initialize", "params": {
        "protocolVersion": PROTOCOL, "capabilities": {}, "clientInfo": {"name": "bench", "version": "0"}}})
}

fn call(id: u64, code: &str) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
           "params": {"name": "run_python", "arguments": {"code": code}}})
}

/// p50 milliseconds of `1+1` through `runpython mcp --no-store` and through the library with the
/// same pool, interleaved (`rounds` each): `(mcp, library)`.
pub async fn stdio_vs_library(bin: &Path, rounds: usize) -> Result<(f64, f64)> {
    let mut child = tokio::process::Command::new(bin)
        .args(["mcp", "--no-store", "--timeout", "120"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()?;
    let mut stdin = child.stdin.take().ok_or("no stdin")?;
    let mut lines = BufReader::new(child.stdout.take().ok_or("no stdout")?).lines();
    stdin.write_all(&send(initialize(0))).await?;
    lines.next_line().await?.ok_or("no initialize reply")?;
    stdin
        .write_all(&send(
            json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        ))
        .await?;
    let library = RunPython::builder()
        .timeout(Duration::from_secs(120))
        .pool(PoolConfig::default())
        .build()?;
    let (mut mcp, mut lib) = (Vec::new(), Vec::new());
    for id in 1..=(rounds as u64 + 3) {
        // Both sides' pools refill between runs (so each run finds a ready interpreter), and the order
        // alternates so neither side always runs right after the other's refill.
        let mcp_first = id % 2 == 0;
        let mut mcp_ms = 0.0;
        let mut lib_ms = 0.0;
        for side in [mcp_first, !mcp_first] {
            tokio::time::sleep(Duration::from_millis(100)).await;
            let t = Instant::now();
            if side {
                stdin.write_all(&send(call(id, "1+1"))).await?;
                loop {
                    let line = lines.next_line().await?.ok_or("the server closed stdout")?;
                    let reply: Value = serde_json::from_str(&line)?;
                    if reply["id"] == json!(id) {
                        let value = &reply["result"]["structuredContent"]["return_value"];
                        if *value != json!(2) {
                            return Err(format!("unexpected reply {reply}").into());
                        }
                        break;
                    }
                }
                mcp_ms = t.elapsed().as_secs_f64() * 1e3;
            } else {
                let envelope = library.run("1+1").await?;
                lib_ms = t.elapsed().as_secs_f64() * 1e3;
                assert_eq!(envelope.return_value, json!(2));
            }
        }
        if id > 3 {
            mcp.push(mcp_ms);
            lib.push(lib_ms);
        }
    }
    drop(stdin);
    let _ = tokio::time::timeout(Duration::from_secs(10), child.wait()).await;
    Ok((p50(mcp), p50(lib)))
}

/// A `runpython serve --no-store` host on a loopback port (no run limits: the runs are the bound),
/// killed when dropped: the process and its base URL.
async fn serve_host(bin: &Path, token: &str) -> Result<(tokio::process::Child, String)> {
    let args = [
        "--no-store",
        "--max-runs-per-token",
        "0",
        "--max-runs-in-flight",
        "0",
        "--timeout",
        "120",
    ];
    serve_host_with(bin, &[("bench", token)], &args).await
}

/// A `runpython serve ARGS` host on a loopback port with `tokens` (name, secret), killed when
/// dropped: the process and its base URL.
pub(crate) async fn serve_host_with(
    bin: &Path,
    tokens: &[(&str, &str)],
    args: &[&str],
) -> Result<(tokio::process::Child, String)> {
    let tokens: Vec<String> = tokens.iter().map(|(n, t)| format!("{n}:{t}")).collect();
    let mut child = tokio::process::Command::new(bin)
        .args(["serve", "--bind", "127.0.0.1:0"])
        .args(args)
        .env("RUNPYTHON_TOKENS", tokens.join(","))
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    let mut stderr = BufReader::new(child.stderr.take().ok_or("no stderr")?).lines();
    let base = loop {
        let line = stderr
            .next_line()
            .await?
            .ok_or("serve exited before listening")?;
        if let Some(at) = line.find("listening on ") {
            break line[at + "listening on ".len()..].to_owned();
        }
    };
    // Keep reading stderr so the server never blocks on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = stderr.next_line().await {} });
    Ok((child, base))
}

pub(crate) fn bench_token() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("bench-token-{nanos:032x}")
}

/// SIGTERM, then up to 30 s for the process to go (dropping it kills what is left).
pub(crate) async fn stop(mut child: tokio::process::Child) {
    if let Some(pid) = child.id() {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
    }
    let _ = tokio::time::timeout(Duration::from_secs(30), child.wait()).await;
}

/// Calls per second of `1+1` through `runpython serve --no-store` from `clients` concurrent MCP
/// sessions making `calls_each` calls each (after one warm-up call per client).
pub async fn http_calls_per_s(bin: &Path, clients: usize, calls_each: usize) -> Result<f64> {
    let token = bench_token();
    let (child, base) = serve_host(bin, &token).await?;
    let rate = calls_per_s(&format!("{base}/mcp"), &token, clients, calls_each).await;
    stop(child).await;
    rate
}

/// [`http_calls_per_s`] through HAProxy (`haproxy`, with `deploy/haproxy/haproxy.cfg` under `root`
/// as shipped) in front of three such hosts: each session sticks to the host that made it.
pub async fn lb_calls_per_s(
    bin: &Path,
    haproxy: &Path,
    root: &Path,
    clients: usize,
    calls_each: usize,
) -> Result<f64> {
    let token = bench_token();
    let mut hosts = Vec::new();
    for _ in 0..3 {
        hosts.push(serve_host(bin, &token).await?);
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let mut command = tokio::process::Command::new(haproxy);
    command
        .args(["-db", "-f"])
        .arg(root.join("deploy/haproxy/haproxy.cfg"))
        .env("RUNPYTHON_LB_BIND", format!("127.0.0.1:{port}"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true);
    for (i, (_, base)) in hosts.iter().enumerate() {
        command.env(
            format!("RUNPYTHON_HOST_{}", i + 1),
            base.trim_start_matches("http://"),
        );
    }
    let proxy = command.spawn()?;
    let base = format!("http://127.0.0.1:{port}");
    // Until the proxy has seen all three hosts healthy (a host starts down until its checks pass).
    let http = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let up = match http.get(format!("{base}/lb-status;csv")).send().await {
            Ok(reply) => reply.text().await.unwrap_or_default(),
            Err(_) => String::new(),
        }
        .lines()
        .filter(|l| l.starts_with("runpython,host") && l.contains(",UP"))
        .count();
        if up == 3 {
            break;
        }
        if Instant::now() > deadline {
            return Err(format!("HAProxy saw {up} of 3 hosts up after 30 s").into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let rate = calls_per_s(&format!("{base}/mcp"), &token, clients, calls_each).await;
    stop(proxy).await;
    for (child, _) in hosts {
        stop(child).await;
    }
    rate
}

/// Calls per second of `1+1` at `url` from `clients` concurrent MCP sessions making `calls_each`
/// calls each, after one warm-up call per session.
async fn calls_per_s(url: &str, token: &str, clients: usize, calls_each: usize) -> Result<f64> {
    let start = std::sync::Arc::new(tokio::sync::Barrier::new(clients + 1));
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let (url, token, start) = (url.to_owned(), token.to_owned(), start.clone());
        tasks.push(tokio::spawn(async move {
            let client = HttpClient::connect(&url, &token).await?;
            client.call(1, "1+1").await?;
            start.wait().await;
            for id in 2..(2 + calls_each as u64) {
                client.call(id, "1+1").await?;
            }
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
        }));
    }
    start.wait().await;
    let t = Instant::now();
    for task in tasks {
        task.await??;
    }
    Ok((clients * calls_each) as f64 / t.elapsed().as_secs_f64())
}

/// One MCP session over Streamable HTTP (JSON-RPC POSTs, replies read from the SSE body).
pub(crate) struct HttpClient {
    http: reqwest::Client,
    url: String,
    token: String,
    session: String,
}

impl HttpClient {
    pub(crate) async fn connect(url: &str, token: &str) -> Result<Self> {
        let http = reqwest::Client::new();
        let reply = http
            .post(url)
            .bearer_auth(token)
            .header("Accept", "application/json, text/event-stream")
            .json(&initialize(0))
            .send()
            .await?;
        let session = reply
            .headers()
            .get("mcp-session-id")
            .and_then(|v| v.to_str().ok())
            .ok_or("no mcp-session-id")?
            .to_owned();
        reply.bytes().await?;
        let client = Self {
            http,
            url: url.to_owned(),
            token: token.to_owned(),
            session,
        };
        client
            .post(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
            .await?;
        Ok(client)
    }

    async fn post(&self, message: &Value) -> Result<String> {
        let reply = self
            .http
            .post(&self.url)
            .bearer_auth(&self.token)
            .header("Accept", "application/json, text/event-stream")
            .header("mcp-session-id", &self.session)
            .header("mcp-protocol-version", PROTOCOL)
            .json(message)
            .send()
            .await?;
        if !reply.status().is_success() {
            return Err(format!("HTTP {}", reply.status()).into());
        }
        Ok(reply.text().await?)
    }

    /// `run_python` of `code`; an error unless its envelope says success.
    pub(crate) async fn call(&self, id: u64, code: &str) -> Result<()> {
        let body = self.post(&call(id, code)).await?;
        let done = body
            .lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .filter_map(|d| serde_json::from_str::<Value>(d.trim()).ok())
            .any(|m| {
                m["id"] == json!(id) && m["result"]["structuredContent"]["status"] == "success"
            });
        if done {
            Ok(())
        } else {
            Err(format!("call {id} did not succeed: {body}").into())
        }
    }
}
