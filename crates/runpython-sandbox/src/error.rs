//! The sandbox's one error type: what failed while deciding, building or starting a sandbox.

use std::path::{Path, PathBuf};

/// What can go wrong while deciding, building or starting a sandbox.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Setting up the sandbox failed at a named step (in the host or in one of the sandbox's
    /// processes).
    #[error("the sandbox could not be set up: {step} failed: {source}; turn the layer off or run where the kernel allows it")]
    Setup {
        /// The step that failed.
        step: &'static str,
        /// The system call's error.
        source: std::io::Error,
    },
    /// The command could not be started.
    #[error("cannot start {program}: {source}")]
    Spawn {
        /// The program.
        program: PathBuf,
        /// Cause.
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
    /// The configuration requires a layer this machine does not provide.
    #[error("isolation required but unavailable: {0}; run where the kernel allows it, or stop requiring it")]
    IsolationUnavailable(String),
    /// A process cannot be forked from a template under this configuration on this machine.
    #[error(
        "runs cannot be forked from a template: {0}; turn templates off to run them the fresh way"
    )]
    TemplateUnavailable(String),
    /// A run forked from a template is not as its sandbox says: a layer the host checks from outside
    /// is missing (the template's environment changed how runs are forked). The run was not given
    /// code; its template is discarded.
    #[error(
        "a run forked from a template failed the host's check of its sandbox ({0}); the template was \
         discarded: a package in its environment may have changed how runs are forked. Remove the \
         package from the warm environment, or run without templates"
    )]
    ForkUnverified(String),
    /// A path, argument or variable cannot be passed (a NUL byte in it, say).
    #[error("invalid input: {0}")]
    InvalidInput(String),
    /// A bug in the sandbox.
    #[error("internal error: {0}")]
    Internal(String),
}

impl Error {
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
