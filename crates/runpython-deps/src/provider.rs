//! Installers behind [`EnvProvider`]: uv when it is found, else a venv with pip.

use std::collections::VecDeque;
use std::ffi::OsString;
use std::fmt;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use futures_util::future::BoxFuture;
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::process::Command;
use tokio::time::Instant;

use crate::layout::{building_dir, short_hash, CACHE, TOOLS};
use crate::lock::KeyLock;
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
    /// The environments' root: providers keep caches and tools under it.
    pub root: &'a Path,
    /// When the whole preparation must be finished.
    pub deadline: Instant,
    /// Where to report progress.
    pub progress: &'a ProgressFn<'a>,
}

impl fmt::Debug for InstallJob<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InstallJob")
            .field("interpreter", &self.interpreter)
            .field("specs", &self.specs)
            .field("target", &self.target)
            .field("root", &self.root)
            .finish_non_exhaustive()
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
            let cache = job.root.join(CACHE).join("uv");
            let mut args: Vec<OsString> = vec![
                "pip".into(),
                "install".into(),
                "--target".into(),
                job.target.into(),
                "--python".into(),
                job.interpreter.executable.clone().into(),
                "--cache-dir".into(),
                cache.into(),
                // The sandbox cannot write `__pycache__` beside the packages; compile now.
                "--compile-bytecode".into(),
                "--no-python-downloads".into(),
                "--".into(),
            ];
            args.extend(job.specs.iter().map(OsString::from));
            run_installer(&self.uv, &args, &job).await
        })
    }
}

/// The fallback when uv is absent: a tools venv (`python -m venv`, which brings pip through ensurepip)
/// kept under the environments' root per interpreter, then `pip install --target`.
#[derive(Debug, Clone, Default)]
pub struct PipProvider;

impl PipProvider {
    /// The tools venv for `interpreter`, created once (under a lock, built beside and renamed).
    async fn tools_python(&self, job: &InstallJob<'_>) -> Result<PathBuf, Error> {
        let id = short_hash(&[
            job.interpreter.executable.as_os_str().as_encoded_bytes(),
            job.interpreter.minor_version().as_bytes(),
        ]);
        let name = format!("pip-venv-{id}");
        let tools = job.root.join(TOOLS);
        let venv = tools.join(&name);
        let python = venv.join("bin").join("python");
        if python.is_file() {
            return Ok(python);
        }
        let _lock = KeyLock::acquire(job.root, &name, job.deadline, &|| {}).await?;
        if python.is_file() {
            return Ok(python);
        }
        let building = building_dir(job.root, &name)?;
        let args: Vec<OsString> = vec![
            "-I".into(),
            "-m".into(),
            "venv".into(),
            building.as_os_str().to_owned(),
        ];
        let created = run_installer(&job.interpreter.executable, &args, job).await;
        let renamed = created.and_then(|()| {
            std::fs::create_dir_all(&tools)
                .and_then(|()| std::fs::rename(&building, &venv))
                .map_err(|e| Error::io("move the new tools venv into place", &venv, e))
        });
        if renamed.is_err() {
            let _ = std::fs::remove_dir_all(&building);
        }
        renamed.map(|()| python)
    }
}

impl EnvProvider for PipProvider {
    fn kind(&self) -> &str {
        "pip"
    }

    fn install<'a>(&'a self, job: InstallJob<'a>) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(async move {
            let python = self.tools_python(&job).await?;
            let cache = job.root.join(CACHE).join("pip");
            let mut args: Vec<OsString> = vec![
                "-I".into(),
                "-m".into(),
                "pip".into(),
                "install".into(),
                "--target".into(),
                job.target.into(),
                "--cache-dir".into(),
                cache.into(),
                "--no-input".into(),
                "--disable-pip-version-check".into(),
                "--no-warn-script-location".into(),
                "--progress-bar".into(),
                "off".into(),
            ];
            args.extend(job.specs.iter().map(OsString::from));
            run_installer(&python, &args, &job).await
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

const TAIL_LINES: usize = 20;
const MAX_LINE_CHARS: usize = 400;

/// Runs one installer command to completion within `job.deadline`, reporting its progress and
/// keeping the tail of its output for the error. On timeout the whole process group is killed.
async fn run_installer(
    program: &Path,
    args: &[OsString],
    job: &InstallJob<'_>,
) -> Result<(), Error> {
    let mut command = Command::new(program);
    command
        .args(args)
        .env_clear()
        .envs(installer_env())
        .current_dir(job.root)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        // Its own process group, so a timeout also kills build backends it started.
        .process_group(0);
    let program_text = program.display().to_string();
    let mut child = command.spawn().map_err(|e| Error::Install {
        packages: job.specs.to_vec(),
        program: program_text.clone(),
        status: format!("could not be started: {e}"),
        output: String::new(),
    })?;
    let mut group = GroupGuard(child.id());
    let (Some(stdout), Some(stderr)) = (child.stdout.take(), child.stderr.take()) else {
        return Err(Error::Install {
            packages: job.specs.to_vec(),
            program: program_text,
            status: "started without its output pipes".into(),
            output: String::new(),
        });
    };
    let mut tail = VecDeque::with_capacity(TAIL_LINES);
    let run = async {
        let (mut out_lines, mut err_lines) = (BufReader::new(stdout), BufReader::new(stderr));
        let (mut out_open, mut err_open) = (true, true);
        while out_open || err_open {
            let line = tokio::select! {
                line = next_line(&mut out_lines), if out_open => line.or_else(|| { out_open = false; None }),
                line = next_line(&mut err_lines), if err_open => line.or_else(|| { err_open = false; None }),
            };
            if let Some(line) = line {
                report(&line, job.progress);
                if tail.len() == TAIL_LINES {
                    tail.pop_front();
                }
                tail.push_back(line);
            }
        }
        child.wait().await
    };
    let finished = tokio::time::timeout_at(job.deadline, run).await;
    let status = match finished {
        Ok(status) => {
            group.0 = None; // Reaped: its id may be reused, never signal it again.
            status
        }
        Err(_) => {
            drop(group);
            let _ = child.kill().await;
            return Err(Error::InstallTimeout {
                packages: job.specs.to_vec(),
                program: program_text,
                output: Vec::from(tail).join("\n"),
            });
        }
    };
    let output = Vec::from(tail).join("\n");
    match status {
        Ok(status) if status.success() => Ok(()),
        Ok(status) => Err(Error::Install {
            packages: job.specs.to_vec(),
            program: program_text,
            status: status.to_string(),
            output,
        }),
        Err(e) => Err(Error::Install {
            packages: job.specs.to_vec(),
            program: program_text,
            status: format!("could not be waited for: {e}"),
            output,
        }),
    }
}

/// Kills the installer's process group when dropped before the installer was reaped: on timeout, and
/// when the preparing future is dropped (`kill_on_drop` alone reaches only the direct child).
struct GroupGuard(Option<u32>);

impl Drop for GroupGuard {
    fn drop(&mut self) {
        let Some(pid) = self.0.and_then(|p| i32::try_from(p).ok()) else {
            return;
        };
        let _ = nix::sys::signal::killpg(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
}

/// The next line, lossily decoded and cut to a sane length; `None` at end of stream or on a read error.
async fn next_line<R: AsyncRead + Unpin>(reader: &mut BufReader<R>) -> Option<String> {
    let mut bytes = Vec::new();
    match reader.read_until(b'\n', &mut bytes).await {
        Ok(0) | Err(_) => None,
        Ok(_) => {
            let text = String::from_utf8_lossy(&bytes);
            let text = text.trim_end();
            Some(match text.char_indices().nth(MAX_LINE_CHARS) {
                Some((cut, _)) => format!("{}…", &text[..cut]),
                None => text.to_owned(),
            })
        }
    }
}

/// Turns an installer's output line into a progress event: uv's and pip's wording.
fn report(line: &str, progress: &ProgressFn<'_>) {
    let trimmed = line.trim();
    if trimmed.starts_with("Downloading") || trimmed.starts_with("Downloaded") {
        progress(Progress::Downloading {
            detail: trimmed.to_owned(),
        });
    } else if trimmed.starts_with("Prepared")
        || trimmed.starts_with("Installing")
        || trimmed.starts_with("Installed")
        || trimmed.starts_with("Successfully installed")
    {
        progress(Progress::Installing {
            detail: trimmed.to_owned(),
        });
    }
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
