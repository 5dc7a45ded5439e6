//! runpython-deps: from source code and dependency specs to a ready Python interpreter.
//!
//! Today it owns interpreter discovery: finding a real CPython ≥ 3.10 (resolving shims such as pyenv's to
//! the real executable, a configured path winning) and remembering the answer so later processes skip the
//! probe. Import detection, dependency merging and prepared environments arrive in this crate too. It never
//! runs user code and depends on no other runpython crate.
//!
//! ```no_run
//! let python = runpython_deps::Interpreter::discover(None).unwrap();
//! assert!(python.version >= (3, 10, 0));
//! println!("{}", python.executable.display());
//! ```

mod interpreter;

pub use interpreter::{Interpreter, MIN_VERSION};

/// What can go wrong while finding or preparing an interpreter.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// No suitable interpreter was found.
    #[error("no CPython {min}.{min_minor} or newer found (tried: {tried}); install Python 3 or pass its path (RUNPYTHON_PYTHON or the builder's `python`)", min = MIN_VERSION.0, min_minor = MIN_VERSION.1)]
    NoInterpreter {
        /// What was tried and why each was refused.
        tried: String,
    },
    /// A configured interpreter is unusable.
    #[error("the Python at {path} cannot be used: {reason}")]
    BadInterpreter {
        /// The configured path.
        path: std::path::PathBuf,
        /// Why.
        reason: String,
    },
}
