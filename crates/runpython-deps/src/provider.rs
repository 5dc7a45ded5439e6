//! Installers behind [`EnvProvider`]: uv when it is found, else a venv with pip.

use std::ffi::OsString;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use futures_util::future::BoxFuture;
use tokio::time::Instant;

use crate::sandboxed::{self, needs_source_build, Installer, CACHE, STAGING};
use crate::{Error, Interpreter};

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
    pub sandbox: &'a runpython_sandbox::Sandbox,
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

impl InstallJob<'_> {
    /// Runs an installer whose arguments `args` makes (given the packages to build from source, none
    /// at first) in the job's sandbox, and takes what it installed out into `target`. When it fails
    /// for want of a wheel, the package is built from source if the job allows it (the installer runs
    /// again with `args` naming it), else the install fails with [`Error::SourceBuildRefused`]; no
    /// build script ran.
    async fn run_sandboxed(
        &self,
        program: &Path,
        program_prefix: bool,
        args: impl Fn(&[String]) -> Vec<OsString>,
    ) -> Result<(), Error> {
        let mut build: Vec<String> = Vec::new();
        loop {
            let installer = Installer {
                program,
                program_prefix,
                args: args(&build),
            };
            let err = match sandboxed::run(installer, self).await {
                Ok(()) => return Ok(()),
                Err(err) => err,
            };
            let Error::Install { output, .. } = &err else {
                return Err(err);
            };
            let Some(package) = needs_source_build(output) else {
                return Err(err);
            };
            if build.contains(&package) {
                // Allowed to build and still wanting a wheel: the installer's own failure.
                return Err(err);
            }
            if !self.source_builds.allows(&package) {
                return Err(Error::SourceBuildRefused {
                    package,
                    asked_by: None,
                });
            }
            build.push(package);
        }
    }
}

/// Makes packages available to an interpreter. Contract: [`EnvProvider::install`] fills `job.target`
/// (a plain directory, relocatable: it is renamed after the install) or fails with
/// [`Error::Install`] / [`Error::InstallTimeout`]; it never leaves a process running past
/// `job.deadline`, and its installer sees only the environment variables of the allowlist
/// (see [`installer_env`]).
pub trait EnvProvider: Send + Sync + fmt::Debug {
    /// A short stable name that is part of every environment key (`"uv"`, `"pip"`).
    fn kind(&self) -> &str;
    /// Installs `job.specs` into `job.target`.
    fn install<'a>(&'a self, job: InstallJob<'a>) -> BoxFuture<'a, Result<(), Error>>;
}

/// Installs with `uv pip install --target`: fast, cached under the environments' root, never
/// downloading a Python (`UV_PYTHON_DOWNLOADS=never`, the interpreter is passed explicitly).
#[derive(Debug, Clone)]
pub struct UvProvider {
    uv: PathBuf,
}

impl UvProvider {
    /// Uses the `uv` executable at `uv`.
    pub fn new(uv: impl Into<PathBuf>) -> Self {
        Self { uv: uv.into() }
    }

    /// Finds uv: `$RUNPYTHON_UV`, else `uv` in `$RUNPYTHON_TOOLS_BIN` (where `cargo xtask` installs the
    /// test tools), else on `PATH`.
    pub fn find() -> Option<Self> {
        if let Some(path) = std::env::var_os("RUNPYTHON_UV").map(PathBuf::from) {
            return path.is_file().then(|| Self::new(path));
        }
        let tools = std::env::var_os("RUNPYTHON_TOOLS_BIN").map(PathBuf::from);
        let path = std::env::var_os("PATH").unwrap_or_default();
        tools
            .into_iter()
            .chain(std::env::split_paths(&path))
            .map(|dir| dir.join("uv"))
            .find(|candidate| candidate.is_file())
            .map(Self::new)
    }

    /// The uv executable.
    pub fn program(&self) -> &Path {
        &self.uv
    }
}

impl EnvProvider for UvProvider {
    fn kind(&self) -> &str {
        "uv"
    }

    fn install<'a>(&'a self, job: InstallJob<'a>) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(async move {
            let args = |build: &[String]| {
                let mut args: Vec<OsString> = vec![
                    "pip".into(),
                    "install".into(),
                    "--target".into(),
                    STAGING.into(),
                    "--python".into(),
                    job.interpreter.executable.clone().into(),
                    "--cache-dir".into(),
                    CACHE.into(),
                    // The run cannot write `__pycache__` beside the packages; compile now.
                    "--compile-bytecode".into(),
                    "--no-python-downloads".into(),
                ];
                args.extend(binary_only(&job, build));
                args.push("--".into());
                args.extend(job.specs.iter().map(OsString::from));
                args
            };
            job.run_sandboxed(&self.uv, false, args).await
        })
    }
}

/// `--only-binary :all:` (no build script runs) unless every package may be built, with
/// `--no-binary` for each package that must be and may be built.
fn binary_only(job: &InstallJob<'_>, build: &[String]) -> Vec<OsString> {
    let mut args = Vec::new();
    if job.source_builds != SourceBuilds::Any {
        args.extend(["--only-binary".into(), ":all:".into()]);
    }
    for package in build {
        args.extend(["--no-binary".into(), package.into()]);
    }
    args
}

/// The fallback when uv is absent: pip, run by the interpreter itself (`python -I -m pip`) or, where
/// the interpreter has no pip, from the wheel its `ensurepip` bundles, in the same sandbox as uv.
#[derive(Debug, Clone, Default)]
pub struct PipProvider;

/// How `interpreter` runs pip: `-m pip` when it has pip, else the path of ensurepip's bundled wheel
/// (pip runs from its wheel). Asked once per interpreter, on the host: it runs only the interpreter's
/// own standard library and site-packages.
fn pip_entry(interpreter: &Interpreter) -> Result<Vec<OsString>, Error> {
    /// Each interpreter's way of running pip.
    type Entries = std::sync::Mutex<Vec<(PathBuf, Vec<OsString>)>>;
    static FOUND: OnceLock<Entries> = OnceLock::new();
    let found = FOUND.get_or_init(Default::default);
    if let Some((_, entry)) = found.lock().ok().and_then(|f| {
        f.iter()
            .find(|(p, _)| *p == interpreter.executable)
            .cloned()
    }) {
        return Ok(entry);
    }
    const PROBE: &str = r#"
import glob, importlib.util, os
if importlib.util.find_spec("pip"):
    print("-m pip")
else:
    import ensurepip
    wheels = glob.glob(os.path.join(os.path.dirname(ensurepip.__file__), "_bundled", "pip-*.whl"))
    print(sorted(wheels)[-1] if wheels else "")
"#;
    let out = std::process::Command::new(&interpreter.executable)
        .args(["-I", "-c", PROBE])
        .env_clear()
        .output()
        .map_err(|e| Error::BadInterpreter {
            path: interpreter.executable.clone(),
            reason: format!("cannot ask it where pip is: {e}"),
        })?;
    let said = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    let entry: Vec<OsString> = match said.as_str() {
        "-m pip" => vec!["-I".into(), "-m".into(), "pip".into()],
        "" => {
            return Err(Error::BadInterpreter {
                path: interpreter.executable.clone(),
                reason: "it has neither pip nor ensurepip's bundled pip; install uv (preferred) or pip for it".into(),
            })
        }
        wheel => vec!["-I".into(), PathBuf::from(wheel).join("pip").into()],
    };
    if let Ok(mut f) = found.lock() {
        f.push((interpreter.executable.clone(), entry.clone()));
    }
    Ok(entry)
}

impl EnvProvider for PipProvider {
    fn kind(&self) -> &str {
        "pip"
    }

    fn install<'a>(&'a self, job: InstallJob<'a>) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(async move {
            let interpreter = job.interpreter.clone();
            let entry = tokio::task::spawn_blocking(move || pip_entry(&interpreter))
                .await
                .map_err(|e| Error::Detection {
                    reason: format!("finding pip: {e}"),
                })??;
            let args = |build: &[String]| {
                let mut args = entry.clone();
                args.extend(
                    [
                        "install",
                        "--target",
                        STAGING,
                        "--cache-dir",
                        CACHE,
                        "--no-input",
                        "--disable-pip-version-check",
                        "--no-warn-script-location",
                        "--progress-bar",
                        "off",
                    ]
                    .map(OsString::from),
                );
                args.extend(binary_only(&job, build));
                args.extend(job.specs.iter().map(OsString::from));
                args
            };
            job.run_sandboxed(&job.interpreter.executable, true, args)
                .await
        })
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
