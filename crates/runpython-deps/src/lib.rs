//! runpython-deps: from Python source code and dependency specs to a ready environment.
//!
//! It owns every step before a run starts:
//!
//! - **interpreter discovery** ([`Interpreter::discover`]): a real CPython ≥ 3.10, shims resolved;
//! - **import detection** with Ruff's error-recovering parser ([`detect_imports`], behind the
//!   [`ImportDetector`] trait), **standard-library filtering** for the target's minor version
//!   and **import → distribution mapping** (both applied by [`merge_requirements`]);
//! - **requirements**: PEP 508 specs parsed enough to dedupe by PEP 503 name ([`Requirement`]), PEP 723
//!   `# /// script` blocks read and written, and the merge of all sources ([`merge_requirements`]), in
//!   which a pinned, URL or extras spec is never shadowed by a bare detected name;
//! - **environments** ([`Environments`]): installed by an [`EnvProvider`] (uv preferred, venv + pip as
//!   the fallback) into a relocatable site directory, keyed by content, prepared once (file lock,
//!   build beside, atomic rename), bounded in time, and garbage-collected ([`gc`]).
//!
//! It never runs user code, and runs every installer, with the build backends it starts, inside
//! runpython-sandbox: the installer sees the system, the interpreter, itself and the operator's local
//! indexes read-only, writes only a size-capped scratch of its own (the install and its cache), and
//! the host copies the installed tree out beneath a descriptor it held. What the code asked for
//! installs wheels only; the operator's own requirements may be built from source ([`Source`],
//! [`InstallPolicy`]). Its network is the installer's own configuration's hosts, a policy whose
//! connections runpython-egress serves from the descriptors the sandbox hands out. It depends on no
//! runpython crate but runpython-sandbox and runpython-egress. The caller (runpython-core) starts the interpreter with `-I -S` and calls
//! `site.addsitedir(site_dir)` before the user's code.
//!
//! ```no_run
//! # async fn example() -> Result<(), runpython_deps::Error> {
//! use runpython_deps::{
//!     detect_imports_async, merge_requirements, DependencySources, Environments, Interpreter,
//! };
//!
//! let code = "import yaml\nprint(yaml.safe_dump({'a': 1}))\n";
//! let python = Interpreter::discover(None)?;
//! let detected = detect_imports_async(code).await?;
//! let requirements = merge_requirements(&DependencySources {
//!     defaults: &[],
//!     explicit: &["tabulate>=0.9".to_owned()],
//!     script: Some(code),
//!     detected: &detected,
//!     local_modules: &[],
//!     python_version: python.version,
//! })?;
//! let envs = Environments::with_default_provider("/var/cache/runpython/envs");
//! let env = envs.prepare(&python, &requirements, &|event| eprintln!("{event:?}")).await?;
//! assert_eq!(env.specs, ["pyyaml", "tabulate>=0.9"]);
//! println!("run {} with site dir {:?}", env.interpreter.display(), env.site_dir);
//! # Ok(())
//! # }
//! ```

mod detect;
mod env;
mod gc;
mod interpreter;
mod job;
mod layout;
mod lock;
mod mapping;
mod merge;
mod policy;
mod prepared;
mod provider;
mod requirement;
mod sandboxed;
mod script;
mod stdlib;

use std::path::{Path, PathBuf};

use interpreter::MIN_VERSION;

pub use detect::{detect_imports, detect_imports_async, ImportDetector, RuffImportDetector};
pub use env::Environments;
pub use gc::{gc, GcReport};
pub use interpreter::{cache_dir, Interpreter};
pub use job::{installer_env, InstallJob, Progress, ProgressFn, SourceBuilds};
pub use merge::{merge_requirements, DependencySources};
pub use policy::{install_network, InstallPolicy};
pub use prepared::{Installed, PreparedEnv};
pub use provider::{EnvProvider, PipProvider, UvProvider};

/// A boxed, sendable future, so that [`EnvProvider`] stays object safe: what
/// [`EnvProvider::install`] returns. The same type as runpython-bridge's `BoxFuture`: futures-util's.
pub use futures_util::future::BoxFuture;
pub use requirement::{Requirement, Source};
pub use script::{read_script_metadata, write_script_dependencies, ScriptMetadata};

/// What can go wrong while finding an interpreter or preparing dependencies.
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
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// The source is too large to scan for imports.
    #[error("the code is {bytes} bytes, over the {limit}-byte limit for import detection; pass smaller code, or turn auto-detection off and list the dependencies explicitly")]
    SourceTooLarge {
        /// Its size.
        bytes: usize,
        /// The limit (2 MiB).
        limit: usize,
    },
    /// Import detection itself failed (a parser bug, not a syntax error in the code).
    #[error("import detection failed: {reason}; turn auto-detection off and list the dependencies explicitly")]
    Detection {
        /// What happened.
        reason: String,
    },
    /// A requirement spec is malformed.
    #[error("invalid requirement {spec:?}: {reason}; write it as `name`, `name==1.2`, `name[extra]>=2` or `name @ URL`")]
    InvalidRequirement {
        /// The spec as given.
        spec: String,
        /// What is wrong with it.
        reason: String,
    },
    /// Two explicit specs ask for different things under one name.
    #[error(
        "conflicting requirements: {first} and {second} name the same package; keep one of them"
    )]
    ConflictingRequirements {
        /// The first spec and where it came from.
        first: String,
        /// The second spec and where it came from.
        second: String,
    },
    /// The PEP 723 `# /// script` block cannot be read.
    #[error("inline script metadata: {reason}; see PEP 723 for the `# /// script` format")]
    ScriptMetadata {
        /// What is wrong.
        reason: String,
    },
    /// The installer failed: a package that does not exist, has no build for this Python, or fails
    /// to build.
    #[error("installing {} with {program} failed ({status}); check the names and versions on PyPI or pin a version that supports this Python. Last lines of its output:\n{output}", packages.join(" "))]
    Install {
        /// The requirements being installed.
        packages: Vec<String>,
        /// The installer program.
        program: String,
        /// Its exit status, or why it could not run.
        status: String,
        /// The last lines of its output (stdout and stderr interleaved).
        output: String,
    },
    /// A package has no wheel for this interpreter, and building it from source (running its build
    /// scripts) is the operator's choice: nothing was built.
    #[error("{package} has no wheel for this Python, and building it from source would run its build scripts, which only the operator may allow; no build was run. Allow it by naming it as an operator dependency (`--dep {package}`, the builder's `dependency`, the Python package's `dependencies=`), or allow every source build with `--allow-source-builds` (builds run sandboxed)")]
    SourceBuildRefused {
        /// The package (normalized).
        package: String,
        /// Who asked for it; `None` when another package needs it.
        asked_by: Option<Source>,
    },
    /// The code asked for a package outside the operator's allowlist.
    #[error("{package} (asked for by {asked_by}) is not in the allowed packages, so it was not installed; an operator allows it with `--allow-package {package}` (a line in `--packages-file`, the builder's `allow_package`, the Python package's `allowed_packages=`)")]
    NotAllowed {
        /// The package (normalized).
        package: String,
        /// Who asked for it.
        asked_by: Source,
    },
    /// The installer did not finish within the preparation timeout and was killed.
    #[error("installing {} with {program} did not finish within the preparation timeout and was killed; raise the timeout or install fewer packages. Last lines of its output:\n{output}", packages.join(" "))]
    InstallTimeout {
        /// The requirements being installed.
        packages: Vec<String>,
        /// The installer program.
        program: String,
        /// The last lines of its output.
        output: String,
    },
    /// Another preparer held the environment's lock until the timeout.
    #[error("waited for another process preparing the same environment (lock {path}) until the preparation timeout; retry, or remove a stuck process holding it")]
    LockTimeout {
        /// The lock file.
        path: PathBuf,
    },
    /// A file-system operation on the environments' root failed.
    #[error("cannot {action} {path}: {source}; check that the environments directory is writable and has space")]
    Io {
        /// What was being done.
        action: &'static str,
        /// Where.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
}

impl Error {
    pub(crate) fn io(action: &'static str, path: &Path, source: std::io::Error) -> Self {
        Self::Io {
            action,
            path: path.to_path_buf(),
            source,
        }
    }
}
