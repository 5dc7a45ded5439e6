//! runpython's MCP server: a [`RunPython`](runpython_core::RunPython) engine's tools (`run_python`,
//! `get_run_artifact`, `close_session`, and `resume` on durable engines) and its runs' artifacts as
//! resources, over stdio ([`serve_stdio`], `runpython mcp`) and over Streamable HTTP
//! ([`HttpServer`], `runpython serve`).
//!
//! It owns everything that knows MCP or HTTP: rmcp's server side, the stdio framing, axum and hyper
//! with their connection slots (a share per token) and body deadline, bearer tokens and OAuth access
//! tokens (JWTs against a JWKS), MCP sessions bound to their token for their whole life, the
//! admission of runs (per client, the host shared fairly among tenants, draining on shutdown) and
//! the 503 a full host answers, and what of the host a tenant's answers leave out.
//! Each client's calls go to its own tenant of the engine: stdio's is the engine as given, each HTTP
//! token's is the token's name (or `jwt:<claim>`). Core describes tools without transport hints;
//! MCP's are added here ([`tool_list`]: `session_id` carries `x-mcp-header: Session-Id`).
//!
//! It must never run code itself or decide what a run may do (every run goes through the engine,
//! which owns the sandbox and the policy), print (logs go through `tracing`; the CLI prints), or
//! know the command line: its configuration is [`ServeConfig`], which the CLI fills from its flags.
//! It depends on runpython-core alone of this workspace.
//!
//! ```no_run
//! # async fn serve() -> Result<(), Box<dyn std::error::Error>> {
//! // `runpython mcp` without flags: serve the engine's tools on stdin and stdout until stdin closes.
//! let engine = runpython_core::RunPython::builder().build()?;
//! runpython_mcp::serve_stdio(engine).await?;
//! # Ok(())
//! # }
//! ```

mod admission;
mod content;
mod error;
mod host_details;
mod http;
mod lines;
mod server;
mod stdio;
mod tag;
mod tools;

pub use content::ARTIFACT_URI_PREFIX;
pub use error::Error;
pub use http::{HttpServer, OAuthConfig, ServeConfig, TOKENS_ENV};
pub use lines::MAX_LINE_BYTES;
pub use stdio::serve_stdio;
pub use tools::{tool_list, SESSION_ID_HEADER};
