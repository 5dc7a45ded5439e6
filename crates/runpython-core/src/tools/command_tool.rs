//! Tools backed by a host command (`--tool NAME=COMMAND`).

use std::process::Stdio;

use runpython_bridge::{BoxFuture, Tool, ToolArgs, ToolError};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::error::Error;
/// The environment variable that carries a call's idempotency key ([`ToolArgs::call_id`]) to the
/// command.
pub const CALL_ID_ENV: &str = "RUNPYTHON_CALL_ID";

/// Largest JSON result a command may print (the bridge frame must carry it back).
const MAX_STDOUT: u64 = 16 << 20;
/// How much of a failing command's stderr is kept for the error (its tail).
const MAX_STDERR: u64 = 1 << 20;

/// A tool that runs `sh -c COMMAND` on the host for each call: the call's `{"args": [...], "kwargs": {...}}`
/// arrives on its stdin and whatever JSON it prints is the result. A non-zero exit raises in the code
/// with the tail of the command's stderr. The command runs outside the sandbox, with the host's
/// environment: it is the host's tool.
///
/// The model learns what the tool does from [`with_description`](Self::with_description) and, with
/// [`with_input_schema`](Self::with_input_schema), calls it with real named parameters (their values
/// arrive in `kwargs`). The command line itself is never shown to the code or the model (it may hold
/// host paths and tokens), not even in errors.
///
/// Each call runs in a process group of its own under a small supervisor: when the call ends (or is
/// dropped because the run ended), everything the command started is killed, and a host that dies,
/// even by SIGKILL, takes the whole group with it (see `tool_supervisor.rs`). How many run at once
/// for one run is bounded by the bridge's `max_concurrent_calls`.
///
/// The command's environment has [`CALL_ID_ENV`] (`RUNPYTHON_CALL_ID`) set to the call's idempotency
/// key when the run has one: the same when a resumed run makes the call again (its host died during
/// it), so a command with side effects can skip a call it already made.
#[derive(Debug, Clone)]
pub struct CommandTool {
    name: String,
    command: String,
    description: String,
    schema: Option<Value>,
}

impl CommandTool {
    /// A tool `name` that runs `command` with `sh -c`, with no description yet.
    pub fn new(name: impl Into<String>, command: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            command: command.into(),
            description: String::new(),
            schema: None,
        }
    }

    /// What the tool does and returns, for the model (the docstring of its stub).
    pub fn with_description(mut self, description: impl Into<String>) -> Self {
        self.description = description.into();
        self
    }

    /// The JSON Schema of the tool's input, an object schema (`{"type": "object", "properties":
    /// {...}, "required": [...]}`): the code gets a function with those parameters.
    pub fn with_input_schema(mut self, schema: Value) -> Result<Self, Error> {
        let is_object = schema.is_object() && schema.get("type").is_none_or(|t| t == "object");
        if !is_object || !schema.get("properties").is_none_or(Value::is_object) {
            return Err(Error::InvalidInput(format!(
                "the input schema of tool {:?} must be an object schema with `properties`, like \
                 {{\"type\": \"object\", \"properties\": {{\"city\": {{\"type\": \"string\"}}}}}}; got {schema}",
                self.name
            )));
        }
        self.schema = Some(schema);
        Ok(self)
    }
}

/// Kills a command's whole process group when dropped: the call ended, or its run did.
struct KillGroup(i32);

impl Drop for KillGroup {
    fn drop(&mut self) {
        // ESRCH (the group is gone) is the normal case.
        let _ = nix::sys::signal::killpg(
            nix::unistd::Pid::from_raw(self.0),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
}

impl Tool for CommandTool {
    fn name(&self) -> &str {
        &self.name
    }
    fn description(&self) -> &str {
        &self.description
    }
    fn input_schema(&self) -> Option<&Value> {
        self.schema.as_ref()
    }
    fn call(&self, args: ToolArgs) -> BoxFuture<'static, Result<Value, ToolError>> {
        let name = self.name.clone();
        let command = self.command.clone();
        Box::pin(async move {
            let input = serde_json::to_vec(&args)
                .map_err(|e| ToolError::value_error(format!("arguments are not JSON: {e}")))?;
            let mut cmd = tokio::process::Command::new("sh");
            cmd.arg("-c")
                .arg(&command)
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .process_group(0)
                .kill_on_drop(true);
            if let Some(call_id) = &args.call_id {
                cmd.env(CALL_ID_ENV, call_id);
            }
            // A host killed with SIGKILL takes the command and everything it started with it.
            crate::tools::tool_supervisor::supervise(&mut cmd);
            let mut child = cmd.spawn().map_err(|e| {
                ToolError::new(
                    "ToolError",
                    format!("the command of tool {name:?} cannot start: {e}"),
                )
            })?;
            let _group = child.id().map(|pid| KillGroup(pid as i32));
            let stdin = child.stdin.take();
            let write_in = async {
                if let Some(mut stdin) = stdin {
                    // A command that ignores its input closes the pipe early; that is its business.
                    let _ = stdin.write_all(&input).await;
                }
            };
            let (mut out, mut err) = (Vec::new(), Vec::new());
            let stdout = child.stdout.take();
            let stderr = child.stderr.take();
            let read_out = async {
                if let Some(pipe) = stdout {
                    let _ = pipe.take(MAX_STDOUT + 1).read_to_end(&mut out).await;
                }
            };
            let read_err = async {
                if let Some(mut pipe) = stderr {
                    // Keep the tail: read in chunks, dropping the oldest beyond the cap.
                    let mut chunk = vec![0u8; 64 * 1024];
                    while let Ok(n) = pipe.read(&mut chunk).await {
                        if n == 0 {
                            break;
                        }
                        err.extend_from_slice(&chunk[..n]);
                        if err.len() as u64 > MAX_STDERR {
                            let cut = err.len() - MAX_STDERR as usize;
                            err.drain(..cut);
                        }
                    }
                }
            };
            tokio::join!(write_in, read_out, read_err);
            if out.len() as u64 > MAX_STDOUT {
                return Err(ToolError::new(
                    "ToolError",
                    format!(
                        "command for tool {name:?} printed more than {MAX_STDOUT} bytes; print a smaller JSON result"
                    ),
                ));
            }
            let status = child.wait().await.map_err(|e| {
                ToolError::new(
                    "ToolError",
                    format!("waiting for the command of tool {name:?}: {e}"),
                )
            })?;
            if !status.success() {
                let stderr = String::from_utf8_lossy(&err);
                return Err(ToolError::new(
                    "ToolError",
                    format!(
                        "the command of tool {name:?} failed ({status}): {}",
                        tail_chars(stderr.trim(), 2000)
                    ),
                ));
            }
            let stdout = String::from_utf8_lossy(&out);
            let trimmed = stdout.trim();
            if trimmed.is_empty() {
                return Ok(Value::Null);
            }
            serde_json::from_str(trimmed).map_err(|e| {
                ToolError::new(
                    "ToolError",
                    format!(
                        "the command of tool {name:?} printed output that is not JSON ({e}): {}",
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
