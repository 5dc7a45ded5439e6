//! Installers behind [`EnvProvider`]: uv when it is found, else a venv with pip.

use std::ffi::OsString;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use futures_util::future::BoxFuture;

use crate::job::{InstallJob, SourceBuilds};
use crate::sandboxed::{CACHE, STAGING};
use crate::{Error, Interpreter};

/// Makes packages available to an interpreter. Contract: [`EnvProvider::install`] fills `job.target`
/// (a plain directory, relocatable: it is renamed after the install) or fails with
/// [`Error::Install`] / [`Error::InstallTimeout`]; it never leaves a process running past
/// `job.deadline`, and its installer sees only the environment variables of the allowlist
/// (see [`installer_env`](crate::installer_env)).
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
