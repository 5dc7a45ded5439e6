//! The crate's one error type: why a server could not start, or stopped.

use std::net::SocketAddr;

/// An error under one of ours: what a library reported.
pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Why a server could not start or stopped. Each says what happened, the value that caused it and
/// what to do; [`runpython_core::error_report`] prints it with its causes.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The configuration cannot start a server: a tokens entry, an empty issuer, a JWKS that cannot
    /// be loaded, a quota without a store. The message names the flag, file or entry.
    #[error("{message}")]
    Config {
        /// What is wrong and what to do.
        message: String,
        /// What a library reported, when one did (an I/O error, a URL parser's).
        #[source]
        source: Option<BoxError>,
    },
    /// The HTTP server cannot listen on its address.
    #[error("cannot listen on {addr}")]
    Listen {
        /// The address (`--bind`).
        addr: SocketAddr,
        /// What the system said.
        #[source]
        source: std::io::Error,
    },
    /// The engine's tool definitions are not MCP tools (they are built to be: a bug).
    #[error("the tool definitions are not MCP tools")]
    ToolDefinitions(#[source] serde_json::Error),
    /// The stdio server failed: its handshake, or the server itself.
    #[error("{what}")]
    Stdio {
        /// What failed.
        what: &'static str,
        /// What rmcp reported.
        #[source]
        source: BoxError,
    },
}

impl Error {
    /// A configuration error with no cause under it.
    pub(crate) fn config(message: impl Into<String>) -> Self {
        Self::Config {
            message: message.into(),
            source: None,
        }
    }

    /// A configuration error caused by `source`.
    pub(crate) fn config_because(message: impl Into<String>, source: impl Into<BoxError>) -> Self {
        Self::Config {
            message: message.into(),
            source: Some(source.into()),
        }
    }
}
