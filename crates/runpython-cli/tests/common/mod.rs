//! What the CLI test files share: running the binary and reading what it printed.

#![allow(dead_code)] // each test file uses the helpers it needs
#![allow(clippy::unwrap_used)] // a test fails loudly where it unwraps

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Output, Stdio};

use serde_json::Value;

/// `runpython ARGS` with stdin closed, to its end.
pub fn runpython(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_runpython"))
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The JSON the command printed on stdout (its envelope or listing); panics with its stderr if none.
pub fn envelope(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("stdout is not JSON ({e}); stderr: {}", text(&out.stderr)))
}

/// The MCP handshake, then `tools/call run_python` with `arguments` (id 2), written to a server's
/// stdin.
pub fn send_mcp_call(stdin: &mut impl Write, arguments: Value) {
    for m in [
        serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "test", "version": "0"}}}),
        serde_json::json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        serde_json::json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
            "name": "run_python", "arguments": arguments}}),
    ] {
        writeln!(stdin, "{m}").unwrap();
    }
}

/// One `tools/call run_python` with `arguments` over `runpython mcp ARGS`' stdio (with `env` set),
/// after the MCP handshake: the reply, and the line it came on as written.
pub fn mcp_call(args: &[&str], env: &[(&str, &str)], arguments: Value) -> (Value, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_runpython"))
        .arg("mcp")
        .args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    send_mcp_call(&mut stdin, arguments);
    let mut reader = BufReader::new(child.stdout.take().unwrap());
    let mut reply = (Value::Null, String::new());
    for _ in 0..10 {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap() == 0 {
            break;
        }
        let v: Value = serde_json::from_str(&line).unwrap_or(Value::Null);
        if v["id"] == 2 {
            reply = (v, line);
            break;
        }
    }
    drop(stdin);
    let _ = child.kill();
    let _ = child.wait();
    reply
}
