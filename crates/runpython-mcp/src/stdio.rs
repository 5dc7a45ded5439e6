//! The MCP server on stdin and stdout (`runpython mcp`): one client, the engine's default tenant (or
//! the one it was scoped to), no run limit, messages framed by [`crate::lines`].

use rmcp::ServiceExt;
use runpython_core::RunPython;
use tokio::io::{AsyncRead, AsyncWrite};

use crate::admission::RunGate;
use crate::lines::{LineTransport, MAX_LINE_BYTES};
use crate::server::Server;
use crate::Error;

/// Serves `engine`'s tools on stdin and stdout until the client closes stdin.
pub async fn serve_stdio(engine: RunPython) -> Result<(), Error> {
    serve_lines(engine, tokio::io::stdin(), tokio::io::stdout()).await
}

/// Serves on a byte stream pair until `read` ends.
async fn serve_lines(
    engine: RunPython,
    read: impl AsyncRead + Send + Unpin + 'static,
    write: impl AsyncWrite + Send + Unpin + 'static,
) -> Result<(), Error> {
    let server = Server::new(engine, RunGate::new(0, 0, std::time::Duration::ZERO), None)?;
    let transport = LineTransport::new(read, write, MAX_LINE_BYTES);
    let running = server.serve(transport).await.map_err(|e| Error::Stdio {
        what: "the MCP handshake on stdio failed",
        source: Box::new(e),
    })?;
    running.waiting().await.map_err(|e| Error::Stdio {
        what: "the MCP server stopped",
        source: Box::new(e),
    })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::{json, Value};
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

    #[tokio::test]
    async fn tools_list_marks_each_session_id_with_its_mcp_header() {
        let engine = RunPython::builder()
            .pool(runpython_core::PoolConfig {
                size: 0,
                ..runpython_core::PoolConfig::default()
            })
            .build()
            .unwrap();
        let (client, server) = tokio::io::duplex(1 << 20);
        let (server_read, server_write) = tokio::io::split(server);
        let serving = tokio::spawn(serve_lines(engine, server_read, server_write));
        let (client_read, mut client_write) = tokio::io::split(client);
        let mut replies = BufReader::new(client_read).lines();
        for message in [
            json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                "protocolVersion": "2025-06-18", "capabilities": {},
                "clientInfo": {"name": "test", "version": "0"}}}),
            json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
            json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}),
        ] {
            let mut line = message.to_string().into_bytes();
            line.push(b'\n');
            client_write.write_all(&line).await.unwrap();
        }
        let mut listed = None;
        while let Some(line) = replies.next_line().await.unwrap() {
            let reply: Value = serde_json::from_str(&line).unwrap();
            if reply["id"] == 2 {
                listed = Some(reply);
                break;
            }
        }
        let tools = listed.unwrap()["result"]["tools"].clone();
        let run_python = &tools[0]["inputSchema"]["properties"];
        assert_eq!(tools[0]["name"], "run_python");
        assert_eq!(run_python["session_id"]["x-mcp-header"], "Session-Id");
        assert!(run_python["code"].get("x-mcp-header").is_none());
        drop((client_write, replies)); // stdin closed: the server stops
        serving.await.unwrap().unwrap();
    }
}
