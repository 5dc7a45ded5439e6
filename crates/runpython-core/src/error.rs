//! runpython-core's one error type: runpython's own failures. What the user's code does is never an
//! `Error`; it is an [`crate::Envelope`] with a status.

use std::path::{Path, PathBuf};

/// runpython's own failures. What the user's code does is never an `Error`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// No usable interpreter.
    #[error(transparent)]
    Interpreter(#[from] runpython_deps::Error),
    /// The child could not be started.
    #[error("cannot start {program}: {source}")]
    Spawn {
        /// The interpreter.
        program: PathBuf,
        /// Cause.
        source: std::io::Error,
    },
    /// Setting up the sandbox failed at a named step (in the host or in one of the run's processes).
    #[error("the sandbox could not be set up: {step} failed: {source}; turn the layer off or run where the kernel allows it")]
    SandboxSetup {
        /// The step that failed.
        step: &'static str,
        /// The system call's error.
        source: std::io::Error,
    },
    /// A system call on the host failed.
    #[error("{what}{}: {source}", path.as_ref().map(|p| format!(" ({})", p.display())).unwrap_or_default())]
    Io {
        /// What was being done.
        what: &'static str,
        /// The file or directory it was done to, when there is one.
        path: Option<PathBuf>,
        /// Cause.
        source: std::io::Error,
    },
    /// The store failed (opening it, keeping a run, reading an artifact, memo entries).
    #[error(transparent)]
    Store(#[from] runpython_store::Error),
    /// The tool bridge could not be set up.
    #[error(transparent)]
    Bridge(#[from] runpython_bridge::Error),
    /// The builder's settings are inconsistent.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// The request is malformed (for example an input name that is not an identifier).
    #[error("invalid request: {0}")]
    InvalidInput(String),
    /// An MCP server used for tools failed (starting it, the handshake, listing its tools).
    #[error("MCP server `{command}`: {message}")]
    Mcp {
        /// The command that starts the server.
        command: String,
        /// What went wrong.
        message: String,
    },
    /// The run was cancelled through its handle.
    #[error("the run was cancelled")]
    Cancelled,
    /// The tenant is over its stored-bytes quota, and what was asked keeps as it goes (a resume).
    #[error("{0}")]
    QuotaExceeded(String),
    /// The sandbox requires an isolation layer this machine does not provide.
    #[error("isolation required but unavailable: {0}; run where the kernel allows it, or stop requiring it")]
    IsolationUnavailable(String),
    /// The failure of an identical run this one waited for instead of running (concurrent memoized
    /// runs of one key are coalesced): that run's error, shared by every run that waited.
    #[error(transparent)]
    Coalesced(std::sync::Arc<Error>),
    /// Runs were to be forked from a template (`RUNPYTHON_TEMPLATES=require`) and cannot be: the
    /// configuration or the kernel rules templates out, or the template failed.
    #[error(
        "runs cannot be forked from a template: {0}; turn templates off to run them the fresh way"
    )]
    TemplateUnavailable(String),
    /// A run forked from a template failed the host's check of its sandbox from outside: it was
    /// killed before it got code, and its template discarded.
    #[error(
        "a run forked from a template failed the host's check of its sandbox ({0}); the template was \
         discarded: a package in its environment may have changed how runs are forked. Remove the \
         package from the warm environment, or run without templates"
    )]
    ForkUnverified(String),
    /// A bug in runpython.
    #[error("internal error: {0}")]
    Internal(String),
}

impl From<runpython_sandbox::Error> for Error {
    fn from(e: runpython_sandbox::Error) -> Self {
        use runpython_sandbox::Error as S;
        match e {
            S::Setup { step, source } => Self::SandboxSetup { step, source },
            S::Spawn { program, source } => Self::Spawn { program, source },
            S::Io { what, path, source } => Self::Io { what, path, source },
            S::IsolationUnavailable(why) => Self::IsolationUnavailable(why),
            S::TemplateUnavailable(why) => Self::TemplateUnavailable(why),
            S::InvalidInput(why) => Self::InvalidInput(why),
            S::ForkUnverified(why) => Self::ForkUnverified(why),
            other => Self::Internal(other.to_string()),
        }
    }
}

impl Error {
    /// A stable, machine-readable name for the kind of failure, for protocols that carry a code beside
    /// the message: `invalid_input` (the caller can fix the request), `not_found` (no such run or
    /// artifact in the store), `config`, `cancelled`, or one of runpython's own failures
    /// (`interpreter`, `spawn`, `sandbox_setup`, `io`, `store`, `quota_exceeded`, `bridge`, `mcp_server`,
    /// `isolation_unavailable`, `template_unavailable`, `fork_unverified`, `internal`).
    pub fn code(&self) -> &'static str {
        match self {
            Self::Interpreter(_) => "interpreter",
            Self::Spawn { .. } => "spawn",
            Self::SandboxSetup { .. } => "sandbox_setup",
            Self::Io { .. } => "io",
            Self::Store(runpython_store::Error::NotFound { .. }) => "not_found",
            Self::Store(runpython_store::Error::InvalidId { .. }) => "invalid_input",
            Self::Store(runpython_store::Error::QuotaExceeded { .. }) | Self::QuotaExceeded(_) => {
                "quota_exceeded"
            }
            Self::Store(_) => "store",
            Self::Bridge(_) => "bridge",
            Self::Config(_) => "config",
            Self::InvalidInput(_) => "invalid_input",
            Self::Mcp { .. } => "mcp_server",
            Self::Cancelled => "cancelled",
            Self::IsolationUnavailable(_) => "isolation_unavailable",
            Self::Coalesced(shared) => shared.code(),
            Self::TemplateUnavailable(_) => "template_unavailable",
            Self::ForkUnverified(_) => "fork_unverified",
            Self::Internal(_) => "internal",
        }
    }

    /// An I/O failure of `what`, done to `path`.
    pub(crate) fn io(what: &'static str, path: impl AsRef<Path>, source: std::io::Error) -> Self {
        Self::Io {
            what,
            path: Some(path.as_ref().to_owned()),
            source,
        }
    }

    /// An I/O failure of `what` that concerns no particular path.
    pub(crate) fn io_pathless(what: &'static str, source: std::io::Error) -> Self {
        Self::Io {
            what,
            path: None,
            source,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_io_error_names_its_path() {
        let e = Error::io(
            "creating the run directory",
            "/tmp/x",
            std::io::Error::from_raw_os_error(libc::EACCES),
        );
        assert!(
            e.to_string()
                .starts_with("creating the run directory (/tmp/x): "),
            "{e}"
        );
    }
}
