//! One install as the providers and the sandboxed runner see it: the job, its progress, what may be
//! built from source, and the environment its installer gets.

use std::ffi::OsString;
use std::fmt;
use std::path::{Path, PathBuf};

use tokio::time::Instant;

use crate::Interpreter;

/// Where preparation reports what it is doing. Pass `&|_| {}` to ignore; to feed a channel:
/// `&move |event| { let _ = sender.send(event); }`.
pub type ProgressFn<'a> = dyn Fn(Progress) + Send + Sync + 'a;

/// A preparation step, reported through [`ProgressFn`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Progress {
    /// The environment is already prepared: nothing to resolve or install.
    Cached {
        /// The environment's key.
        key: String,
    },
    /// Another process or task is preparing the same environment; waiting for it.
    Waiting {
        /// The environment's key.
        key: String,
    },
    /// The installer started resolving these specs.
    Resolving {
        /// The requirements being resolved.
        specs: Vec<String>,
    },
    /// The installer is downloading (its own words: a file, a package, a count).
    Downloading {
        /// What the installer said.
        detail: String,
    },
    /// The installer is installing.
    Installing {
        /// What the installer said.
        detail: String,
    },
    /// The environment is ready.
    Done {
        /// The environment's key.
        key: String,
        /// Time spent preparing it.
        elapsed: std::time::Duration,
    },
}

impl Progress {
    /// The step as a person reads it on a status line or in a progress notification; `None` for
    /// [`Progress::Cached`], which nobody needs to see.
    pub fn message(&self) -> Option<String> {
        Some(match self {
            Self::Resolving { specs } => format!("resolving {}", specs.join(" ")),
            Self::Downloading { detail } => format!("downloading {detail}"),
            Self::Installing { detail } => format!("installing {detail}"),
            Self::Waiting { .. } => "waiting for another run preparing the same environment".into(),
            Self::Done { elapsed, .. } => format!("dependencies ready in {elapsed:.1?}"),
            Self::Cached { .. } => return None,
        })
    }
}

/// Which packages an install may build from source (running their build scripts, sandboxed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SourceBuilds<'a> {
    /// Any (`--allow-source-builds`).
    Any,
    /// Only these (normalized names: the operator's); wheels for everything else.
    Only(&'a [String]),
}

impl SourceBuilds<'_> {
    /// Whether `name` (normalized) may be built.
    pub fn allows(&self, name: &str) -> bool {
        match self {
            Self::Any => true,
            Self::Only(names) => names.iter().any(|n| n == name),
        }
    }
}

/// One installation: put `specs` into the empty directory `target`, usable by `interpreter` when the
/// directory is added to `sys.path` with `site.addsitedir`.
#[derive(Clone, Copy)]
pub struct InstallJob<'a> {
    /// The interpreter the packages are for.
    pub interpreter: &'a Interpreter,
    /// Canonical requirement specs (already validated: none starts with `-`).
    pub specs: &'a [String],
    /// An empty directory to install into.
    pub target: &'a Path,
    /// The environments' root.
    pub root: &'a Path,
    /// When the whole preparation must be finished.
    pub deadline: Instant,
    /// Where to report progress.
    pub progress: &'a ProgressFn<'a>,
    /// The sandbox the installer runs in (see the crate's docs: its scratch holds the install and the
    /// installer's cache; its limits are the install's).
    pub sandbox: &'a runpython_egress::Sandbox,
    /// What the installer may read besides the system, the interpreter and itself: the operator's
    /// local indexes, find-links directories and wheel files.
    pub reads: &'a [PathBuf],
    /// What it may build from source.
    pub source_builds: SourceBuilds<'a>,
}

impl fmt::Debug for InstallJob<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InstallJob")
            .field("interpreter", &self.interpreter)
            .field("specs", &self.specs)
            .field("target", &self.target)
            .field("root", &self.root)
            .field("reads", &self.reads)
            .field("source_builds", &self.source_builds)
            .finish_non_exhaustive()
    }
}

/// The environment an installer runs with, built from nothing: `PATH`, `HOME`, `LANG`, proxies
/// (`*_proxy`, `*_PROXY`), TLS roots (`SSL_CERT_FILE`, `SSL_CERT_DIR`, `REQUESTS_CA_BUNDLE`) and the
/// installers' own settings (`PIP_*`, `UV_*`: indexes, credentials, timeouts). Nothing else, so a
/// secret in the host's environment never reaches a build script. `UV_PYTHON_DOWNLOADS=never` is
/// always set.
pub fn installer_env() -> Vec<(OsString, OsString)> {
    allowed_env(std::env::vars_os())
}

fn allowed_env(vars: impl Iterator<Item = (OsString, OsString)>) -> Vec<(OsString, OsString)> {
    const EXACT: &[&str] = &[
        "PATH",
        "HOME",
        "LANG",
        "SSL_CERT_FILE",
        "SSL_CERT_DIR",
        "REQUESTS_CA_BUNDLE",
    ];
    let mut env: Vec<(OsString, OsString)> = vars
        .filter(|(name, _)| {
            let Some(name) = name.to_str() else {
                return false;
            };
            EXACT.contains(&name)
                || name.ends_with("_proxy")
                || name.ends_with("_PROXY")
                || name.starts_with("PIP_")
                || name.starts_with("UV_")
        })
        .filter(|(name, _)| name != "UV_PYTHON_DOWNLOADS")
        .collect();
    env.push(("UV_PYTHON_DOWNLOADS".into(), "never".into()));
    env
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_step_a_person_sees_reads_as_one_line_and_a_cached_one_is_silent() {
        let done = Progress::Done {
            key: "k".into(),
            elapsed: std::time::Duration::from_millis(1500),
        };
        assert_eq!(
            done.message().as_deref(),
            Some("dependencies ready in 1.5s")
        );
        let resolving = Progress::Resolving {
            specs: vec!["numpy".into(), "pandas>=2".into()],
        };
        assert_eq!(
            resolving.message().as_deref(),
            Some("resolving numpy pandas>=2")
        );
        assert_eq!(Progress::Cached { key: "k".into() }.message(), None);
    }

    #[test]
    fn installers_see_only_the_allowlisted_environment() {
        let host = [
            ("PATH", "/bin"),
            ("HOME", "/root"),
            ("LANG", "C.UTF-8"),
            ("https_proxy", "http://proxy:3128"),
            ("NO_PROXY", "localhost"),
            ("SSL_CERT_FILE", "/etc/ca.pem"),
            ("PIP_INDEX_URL", "https://mirror/simple"),
            ("UV_INDEX_URL", "https://mirror/simple"),
            ("UV_PYTHON_DOWNLOADS", "automatic"),
            ("AWS_SECRET_ACCESS_KEY", "secret"),
            ("OPENAI_API_KEY", "secret"),
            ("PYTHONPATH", "/evil"),
            ("LD_PRELOAD", "/evil.so"),
        ]
        .map(|(k, v)| (OsString::from(k), OsString::from(v)));
        let env = allowed_env(host.into_iter());
        let names: Vec<&str> = env.iter().map(|(k, _)| k.to_str().unwrap()).collect();
        assert_eq!(
            names,
            [
                "PATH",
                "HOME",
                "LANG",
                "https_proxy",
                "NO_PROXY",
                "SSL_CERT_FILE",
                "PIP_INDEX_URL",
                "UV_INDEX_URL",
                "UV_PYTHON_DOWNLOADS",
            ]
        );
        assert_eq!(env.last().unwrap().1, "never");
    }
}
