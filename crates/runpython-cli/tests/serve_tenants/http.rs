//! What the hostile-tenant suite drives `runpython serve` with: the server on a loopback port with
//! tokens of its own, and a small HTTP/1.1 client over `TcpStream` (every byte under the test's
//! control: trickled bodies, held connections) that speaks enough MCP to open sessions and call
//! tools.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};

/// A `runpython serve` process on a free loopback port; killed (by its pid) on drop.
pub struct Serve {
    child: Child,
    pub port: u16,
    log: Arc<Mutex<String>>,
    tokens: BTreeMap<String, String>,
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Serve {
    /// `runpython serve ARGS` with one token per name in `names` (each a secret of its own).
    pub fn start(names: &[&str], args: &[&str]) -> Serve {
        let tokens: BTreeMap<String, String> = names
            .iter()
            .map(|n| ((*n).to_owned(), format!("{n}-0123456789abcdef0123456789")))
            .collect();
        let entries: Vec<String> = tokens.iter().map(|(n, t)| format!("{n}:{t}")).collect();
        let mut child = Command::new(env!("CARGO_BIN_EXE_runpython"))
            .args(["-v", "serve", "--bind", "127.0.0.1:0"])
            .args(args)
            .env("RUNPYTHON_TOKENS", entries.join(","))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stderr = BufReader::new(child.stderr.take().unwrap());
        let log = Arc::new(Mutex::new(String::new()));
        let mut line = String::new();
        let port = loop {
            line.clear();
            assert!(
                stderr.read_line(&mut line).unwrap() > 0,
                "serve exited: {}",
                log.lock().unwrap()
            );
            log.lock().unwrap().push_str(&line);
            if let Some(rest) = line
                .trim()
                .strip_prefix("runpython serve: listening on http://")
            {
                break rest.rsplit(':').next().unwrap().parse().unwrap();
            }
        };
        // Keep reading its log so it never blocks on a full pipe, and so tests can look at it.
        let sink = Arc::clone(&log);
        std::thread::spawn(move || {
            let mut line = String::new();
            while stderr.read_line(&mut line).is_ok_and(|n| n > 0) {
                sink.lock().unwrap().push_str(&line);
                line.clear();
            }
        });
        Serve {
            child,
            port,
            log,
            tokens,
        }
    }

    /// Stops the server process (SIGSTOP): what clients send waits in the kernel.
    pub fn pause(&self) {
        self.signal(libc::SIGSTOP);
    }

    /// Lets it run again (SIGCONT).
    pub fn resume(&self) {
        self.signal(libc::SIGCONT);
    }

    fn signal(&self, signal: libc::c_int) {
        let pid = libc::pid_t::try_from(self.child.id()).unwrap();
        // SAFETY: a signal to the server this test started, by its pid.
        assert_eq!(unsafe { libc::kill(pid, signal) }, 0);
    }

    /// The log so far.
    pub fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    /// The bearer secret of token `name`.
    pub fn secret(&self, name: &str) -> &str {
        &self.tokens[name]
    }

    /// A fresh connection to the server.
    pub fn connect(&self) -> TcpStream {
        let stream = TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        stream.set_nodelay(true).unwrap();
        stream
    }

    /// The head of a request to `/mcp` as `name` (`None`: no token), without its end of headers.
    pub fn head(&self, method: &str, name: Option<&str>, session: Option<&str>) -> String {
        self.head_to("/mcp", method, name, session)
    }

    /// The head of a request to `path`, as [`Serve::head`].
    pub fn head_to(
        &self,
        path: &str,
        method: &str,
        name: Option<&str>,
        session: Option<&str>,
    ) -> String {
        let mut head = format!(
            "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nContent-Type: application/json\r\n\
             Accept: application/json, text/event-stream\r\nMcp-Protocol-Version: 2025-06-18\r\n",
            self.port
        );
        if let Some(name) = name {
            head.push_str(&format!("Authorization: Bearer {}\r\n", self.secret(name)));
        }
        if let Some(session) = session {
            head.push_str(&format!("Mcp-Session-Id: {session}\r\n"));
        }
        head
    }

    /// One request on `stream` (kept alive), and its response.
    pub fn send(
        &self,
        stream: &mut TcpStream,
        method: &str,
        name: Option<&str>,
        session: Option<&str>,
        body: &Value,
    ) -> std::io::Result<Response> {
        self.send_to(stream, "/mcp", method, name, session, body)
    }

    /// One request to `path` on `stream` (kept alive), and its response.
    pub fn send_to(
        &self,
        stream: &mut TcpStream,
        path: &str,
        method: &str,
        name: Option<&str>,
        session: Option<&str>,
        body: &Value,
    ) -> std::io::Result<Response> {
        let body = if body.is_null() {
            String::new()
        } else {
            body.to_string()
        };
        let request = format!(
            "{}Content-Length: {}\r\n\r\n{body}",
            self.head_to(path, method, name, session),
            body.len()
        );
        stream.write_all(request.as_bytes())?;
        read_response(stream)
    }

    /// A new MCP session of `name` (initialize, then initialized), on `stream`.
    pub fn open_session(&self, stream: &mut TcpStream, name: &str) -> std::io::Result<Response> {
        let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "hostile-tenant", "version": "0"}}});
        let response = self.send(stream, "POST", Some(name), None, &init)?;
        if let Some(session) = response.header("mcp-session-id") {
            let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
            let done = self.send(stream, "POST", Some(name), Some(&session), &initialized)?;
            assert_eq!(done.status, 202, "{done:?}");
        }
        Ok(response)
    }

    /// A JSON-RPC request in `session` as `name`: the response and the reply message with its id.
    pub fn rpc(
        &self,
        stream: &mut TcpStream,
        name: &str,
        session: &str,
        method: &str,
        params: Value,
    ) -> std::io::Result<(Response, Value)> {
        let request = json!({"jsonrpc": "2.0", "id": 7, "method": method, "params": params});
        let response = self.send(stream, "POST", Some(name), Some(session), &request)?;
        let reply = response.reply(7);
        Ok((response, reply))
    }
}

/// An HTTP response as read.
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl std::fmt::Debug for Response {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let text = self.text();
        let head: String = text.chars().take(600).collect();
        write!(f, "{} {:?} {head}", self.status, self.headers)
    }
}

impl Response {
    /// The first value of header `name` (lower case).
    pub fn header(&self, name: &str) -> Option<String> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The JSON-RPC message with `id` in the body (plain JSON, or an SSE stream's `data:` lines);
    /// `Null` when there is none.
    pub fn reply(&self, id: i64) -> Value {
        let text = self.text();
        if let Ok(value) = serde_json::from_str::<Value>(&text) {
            return value;
        }
        text.lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .filter_map(|d| serde_json::from_str::<Value>(d.trim()).ok())
            .find(|m| m["id"] == id)
            .unwrap_or(Value::Null)
    }
}

/// Reads one response: its status line, headers, and a body by `Content-Length` or chunked.
pub fn read_response(stream: &mut TcpStream) -> std::io::Result<Response> {
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    if reader.read_line(&mut line)? == 0 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            "the server closed the connection without a response",
        ));
    }
    let status = line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let mut headers = Vec::new();
    loop {
        line.clear();
        reader.read_line(&mut line)?;
        let trimmed = line.trim_end();
        if trimmed.is_empty() {
            break;
        }
        if let Some((n, v)) = trimmed.split_once(':') {
            headers.push((n.trim().to_ascii_lowercase(), v.trim().to_owned()));
        }
    }
    let find = |name: &str| headers.iter().find(|(n, _)| n == name).map(|(_, v)| v);
    let mut body = Vec::new();
    if find("transfer-encoding").is_some_and(|v| v.contains("chunked")) {
        loop {
            line.clear();
            reader.read_line(&mut line)?;
            let size = usize::from_str_radix(line.trim(), 16).unwrap_or(0);
            if size == 0 {
                line.clear();
                reader.read_line(&mut line)?;
                break;
            }
            let mut chunk = vec![0; size + 2];
            reader.read_exact(&mut chunk)?;
            body.extend_from_slice(&chunk[..size]);
        }
    } else if let Some(length) = find("content-length").and_then(|v| v.parse::<usize>().ok()) {
        body.resize(length, 0);
        reader.read_exact(&mut body)?;
    }
    // Nothing is read past the response: requests on one connection are sent one at a time.
    debug_assert!(reader.buffer().is_empty());
    Ok(Response {
        status,
        headers,
        body,
    })
}

/// True once the server has closed `stream` (end of file or a reset), false if it is still open
/// after `wait`.
pub fn closed_within(stream: &mut TcpStream, wait: Duration) -> bool {
    stream.set_read_timeout(Some(wait)).unwrap();
    let mut buf = [0u8; 256];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) => {
                return !matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                )
            }
        }
    }
}
