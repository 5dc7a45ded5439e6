//! Tools backed by a host command (`--tool NAME=COMMAND`).

use std::process::Stdio;

use runpython_bridge::{BoxFuture, Tool, ToolArgs, ToolError};
use serde_json::Value;
use tokio::io::AsyncWriteExt;

/// A tool that runs `sh -c COMMAND` on the host for each call: the call's `{"args": [...], "kwargs": {...}}`
/// arrives on its stdin and whatever JSON it prints is the result. A non-zero exit raises in the code
/// with the tail of the command's stderr. The command runs outside the sandbox, with the host's
/// environment: it is the host's tool.
#[derive(Debug, Clone)]
pub struct CommandTool {
    name: String,
    command: String,
    description: String,
}

impl CommandTool {
    /// A tool `name` that runs `command` with `sh -c`.
    pub fn new(name: impl Into<String>, command: impl Into<String>) -> Self {
        let command = command.into();
        Self {
            name: name.into(),
            description: format!("Runs on the host: {command}"),
            command,
        }
    }
}

impl Tool for CommandTool {
    fn name(&self) -> &str {
        &self.name
    }
    fn description(&self) -> &str {
        &self.description
    }
    fn call(&self, args: ToolArgs) -> BoxFuture<'static, Result<Value, ToolError>> {
        let name = self.name.clone();
        let command = self.command.clone();
        Box::pin(async move {
            let input = serde_json::to_vec(&args)
                .map_err(|e| ToolError::value_error(format!("arguments are not JSON: {e}")))?;
            let mut child = tokio::process::Command::new("sh")
                .arg("-c")
                .arg(&command)
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .kill_on_drop(true)
                .spawn()
                .map_err(|e| {
                    ToolError::new("ToolError", format!("cannot start `sh -c {command}`: {e}"))
                })?;
            if let Some(mut stdin) = child.stdin.take() {
                // A command that ignores its input closes the pipe early; that is its business.
                let _ = stdin.write_all(&input).await;
            }
            let out = child.wait_with_output().await.map_err(|e| {
                ToolError::new("ToolError", format!("waiting for `sh -c {command}`: {e}"))
            })?;
            if !out.status.success() {
                let stderr = String::from_utf8_lossy(&out.stderr);
                return Err(ToolError::new(
                    "ToolError",
                    format!(
                        "command `{command}` for tool {name:?} failed ({}): {}",
                        out.status,
                        tail_chars(stderr.trim(), 2000)
                    ),
                ));
            }
            let stdout = String::from_utf8_lossy(&out.stdout);
            let trimmed = stdout.trim();
            if trimmed.is_empty() {
                return Ok(Value::Null);
            }
            serde_json::from_str(trimmed).map_err(|e| {
                ToolError::new(
                    "ToolError",
                    format!(
                        "command `{command}` for tool {name:?} printed output that is not JSON ({e}): {}",
                        head_chars(trimmed, 200)
                    ),
                )
            })
        })
    }
}

fn tail_chars(s: &str, n: usize) -> &str {
    let count = s.chars().count();
    if count <= n {
        return s;
    }
    let skip = s.char_indices().nth(count - n).map_or(0, |(i, _)| i);
    &s[skip..]
}

fn head_chars(s: &str, n: usize) -> &str {
    s.char_indices().nth(n).map_or(s, |(i, _)| &s[..i])
}
