//! `runpython serve` against idle and slow clients: a flood of idle unauthenticated connections does
//! not keep an authorized client out, even with the server held to few descriptors, and a connection
//! that sends nothing is closed at the header deadline.

#![allow(clippy::unwrap_used)] // a test fails loudly where it unwraps

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const TOKEN: &str = "alice:0123456789abcdef0123456789abcdef";

struct Serve {
    child: Child,
    port: u16,
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `runpython serve` on a loopback port, held to `nofile` descriptors.
fn serve(nofile: u64, extra: &[&str]) -> Serve {
    let mut command = Command::new(env!("CARGO_BIN_EXE_runpython"));
    command
        .args(["serve", "--bind", "127.0.0.1:0", "--no-store"])
        .args(extra)
        .env("RUNPYTHON_TOKENS", TOKEN)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    // SAFETY: setrlimit between fork and exec, on the child's own limits.
    unsafe {
        command.pre_exec(move || {
            let limit = libc::rlimit {
                rlim_cur: nofile,
                rlim_max: nofile,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = command.spawn().unwrap();
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    let port = loop {
        line.clear();
        assert!(stderr.read_line(&mut line).unwrap() > 0, "serve exited");
        if let Some(rest) = line
            .trim()
            .strip_prefix("runpython serve: listening on http://")
        {
            break rest.rsplit(':').next().unwrap().parse().unwrap();
        }
    };
    // Keep draining its log so it never blocks on a full pipe.
    std::thread::spawn(move || {
        let mut sink = Vec::new();
        let _ = stderr.read_to_end(&mut sink);
    });
    Serve { child, port }
}

/// The status of an authorized `initialize` over a fresh connection.
fn initialize(port: u16) -> u16 {
    let body = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"flood-test","version":"1"}}}"#;
    let secret = TOKEN.split_once(':').unwrap().1;
    let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    write!(
        stream,
        "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer {secret}\r\n\
         Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut status = String::new();
    BufReader::new(stream).read_line(&mut status).unwrap();
    status
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

#[test]
fn an_authorized_client_is_served_while_idle_connections_flood_the_port() {
    let server = serve(256, &["--header-timeout", "30"]);
    assert_eq!(initialize(server.port), 200);
    let idle: Vec<TcpStream> = (0..400)
        .map(|_| TcpStream::connect(("127.0.0.1", server.port)).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let started = Instant::now();
    assert_eq!(initialize(server.port), 200);
    let took = started.elapsed();
    assert!(took < Duration::from_secs(10), "initialize took {took:?}");
    drop(idle);
}

#[test]
fn a_connection_that_sends_nothing_is_closed_at_the_header_deadline() {
    let server = serve(1024, &["--header-timeout", "1"]);
    let mut idle = TcpStream::connect(("127.0.0.1", server.port)).unwrap();
    idle.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let started = Instant::now();
    let mut buf = [0u8; 64];
    // The server closes it: end of file (or a reset), not a read timeout.
    let closed = match idle.read(&mut buf) {
        Ok(_) => true,
        Err(e) => {
            e.kind() != std::io::ErrorKind::WouldBlock && e.kind() != std::io::ErrorKind::TimedOut
        }
    };
    assert!(closed, "the idle connection was not closed");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(initialize(server.port), 200);
}
