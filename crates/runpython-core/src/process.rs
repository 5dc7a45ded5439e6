//! Spawning the child and making sure nothing it started outlives the run.

use std::hash::{Hash, Hasher};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::OnceLock;

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;

use crate::Error;

/// Where the runner writes its result. The child gets the write end as this descriptor.
pub(crate) const RESULT_FD: i32 = 3;

/// Bootstrap passed with `-c`: imports the runner from the code directory (argv[1]), so Python caches its
/// bytecode there instead of compiling it on every run.
const BOOTSTRAP: &str = "import sys;sys.path.insert(0,sys.argv[1]);import runpython_runner";

/// The directory holding runpython's Python modules (`runpython_runner.py`, `runpython_tools.py`), written
/// once per content version under the user's cache directory (or the temp directory), atomically.
pub(crate) fn code_dir() -> Result<&'static Path, Error> {
    static DIR: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    DIR.get_or_init(|| write_code_dir().map_err(|e| e.to_string()))
        .as_deref()
        .map_err(|e| Error::Io {
            what: "writing runpython's Python modules to the cache directory",
            source: std::io::Error::other(e.clone()),
        })
}

/// Compiles the code directory's modules for `python` once (the sandboxed child may not write
/// `__pycache__` there, and compiling the runner on every run would cost ~1 ms). Best effort.
pub(crate) fn ensure_bytecode(python: &Path, version: (u32, u32, u32), dir: &Path) {
    let tag = format!("cpython-{}{}", version.0, version.1);
    let pyc = dir
        .join("__pycache__")
        .join(format!("runpython_runner.{tag}.pyc"));
    if !pyc.is_file() {
        compile_code_dir(python, dir);
    }
    if pyc.is_file() {
        if let Ok(mut ready) = BYTECODE_READY.lock() {
            ready.push(python.to_owned());
        }
    }
}

/// Interpreters whose bytecode this process already found in place: later runs skip the check.
static BYTECODE_READY: std::sync::Mutex<Vec<PathBuf>> = std::sync::Mutex::new(Vec::new());

/// True once [`ensure_bytecode`] found the code directory compiled for `python`.
pub(crate) fn bytecode_ready(python: &Path) -> bool {
    BYTECODE_READY
        .lock()
        .is_ok_and(|ready| ready.iter().any(|p| p == python))
}

fn compile_code_dir(python: &Path, dir: &Path) {
    let _ = std::process::Command::new(python)
        .args([
            "-I",
            "-S",
            "-c",
            "import compileall, sys; compileall.compile_dir(sys.argv[1], quiet=1)",
        ])
        .arg(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

/// A digest of the Python that runs in the child (the runner and the bridge client), computed once:
/// it names the code directory and goes into memo keys.
pub(crate) fn code_version() -> &'static str {
    static VERSION: OnceLock<String> = OnceLock::new();
    VERSION.get_or_init(|| {
        let mut hasher = std::hash::DefaultHasher::new();
        (crate::run::RUNNER_PY, runpython_bridge::CLIENT_PY).hash(&mut hasher);
        format!("{:016x}", hasher.finish())
    })
}

fn write_code_dir() -> std::io::Result<PathBuf> {
    let name = format!("py-{}", code_version());
    let bases = [
        std::env::var_os("XDG_CACHE_HOME").map(PathBuf::from),
        std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")),
        Some(std::env::temp_dir()),
    ];
    let mut last_error = std::io::Error::other("no cache directory");
    for base in bases.into_iter().flatten() {
        let dir = base.join("runpython").join(&name);
        let complete = |d: &Path| {
            d.join("runpython_runner.py").is_file() && d.join("runpython_tools.py").is_file()
        };
        if complete(&dir) {
            return Ok(dir);
        }
        let attempt = (|| {
            std::fs::create_dir_all(base.join("runpython"))?;
            let tmp = tempfile::Builder::new()
                .prefix(".py-tmp-")
                .tempdir_in(base.join("runpython"))?;
            std::fs::write(
                tmp.path().join("runpython_runner.py"),
                crate::run::RUNNER_PY,
            )?;
            std::fs::write(
                tmp.path().join("runpython_tools.py"),
                runpython_bridge::CLIENT_PY,
            )?;
            std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755))?;
            match std::fs::rename(tmp.path(), &dir) {
                Ok(()) => {
                    let _ = tmp.keep();
                    Ok(dir.clone())
                }
                // Another process won the race: its copy is identical.
                Err(_) if complete(&dir) => Ok(dir.clone()),
                Err(e) => Err(e),
            }
        })();
        match attempt {
            Ok(dir) => return Ok(dir),
            Err(e) => last_error = e,
        }
    }
    Err(last_error)
}

/// Environment variables a child keeps by default; everything else (API keys included) is dropped.
pub const ENV_ALLOWLIST: &[&str] = &["PATH", "HOME", "LANG", "TZ", "TERM", "TMPDIR"];

/// The child's environment: the allowlist, every `LC_*`, and the explicit passthrough names.
pub(crate) fn child_env(passthrough: &[String]) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = std::env::vars()
        .filter(|(name, _)| {
            ENV_ALLOWLIST.contains(&name.as_str())
                || name.starts_with("LC_")
                || passthrough.iter().any(|p| p == name)
        })
        .collect();
    // There is no display: matplotlib draws off-screen, and open figures are saved as PNG artifacts.
    if !env.iter().any(|(name, _)| name == "MPLBACKEND") {
        env.push(("MPLBACKEND".into(), "Agg".into()));
    }
    env
}

/// Kills the child's whole process group when dropped, so a timeout, a cancellation or a dropped future
/// leaves no survivor behind (children that stay in the group included).
/// Without a PID namespace but with a run uid, every process of that uid is killed too (a `setsid`
/// daemon leaves the group, not the uid).
#[derive(Debug)]
pub(crate) struct GroupGuard {
    pgid: Pid,
    sweep_uid: Option<u32>,
}

impl GroupGuard {
    pub(crate) fn kill(&self) {
        // ESRCH (nobody left in the group) is the normal case after a clean exit.
        let _ = killpg(self.pgid, Signal::SIGKILL);
        if let Some(uid) = self.sweep_uid {
            crate::sandbox::kill_all_of_uid(uid);
        }
    }
}

impl Drop for GroupGuard {
    fn drop(&mut self) {
        self.kill();
        // The run is over: make up for the network namespace it took, off any run's critical path.
        crate::sandbox::refill_netns();
    }
}

/// A started child with its pipes.
#[derive(Debug)]
pub(crate) struct Spawned {
    pub child: tokio::process::Child,
    pub guard: GroupGuard,
    pub result: tokio::net::unix::pipe::Receiver,
}

/// Starts `python -I -S -X utf8 -c BOOTSTRAP CODE_DIR` in `cwd`, in a new process group, with a scrubbed
/// environment, piped stdio, the result pipe as descriptor 3, inside the sandbox `plan` describes.
pub(crate) fn spawn_runner(
    python: &Path,
    code_dir: &Path,
    warm_up: &[String],
    cwd: &Path,
    env: &[(String, String)],
    mut plan: crate::sandbox::Plan,
) -> Result<Spawned, Error> {
    let sweep_uid = plan.sweep_uid;
    let mut args: Vec<&std::ffi::OsStr> = vec![
        "-I".as_ref(),
        "-S".as_ref(),
        "-X".as_ref(),
        "utf8".as_ref(),
        "-c".as_ref(),
        BOOTSTRAP.as_ref(),
        code_dir.as_os_str(),
    ];
    args.extend(warm_up.iter().map(|a| std::ffi::OsStr::new(a.as_str())));
    plan.exec_with(python, &args, env)?;
    let (result_read, result_write): (OwnedFd, OwnedFd) =
        nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| Error::Io {
            what: "creating the result pipe",
            source: e.into(),
        })?;
    let write_fd = result_write.as_raw_fd();

    let mut command = tokio::process::Command::new(python);
    command
        .args(&args)
        .env_clear()
        .envs(env.iter().map(|(k, v)| (k, v)))
        .current_dir(cwd)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    // SAFETY: the closure runs between fork and exec and only makes async-signal-safe system calls
    // (prctl, dup2, fcntl, and the sandbox's, see `sandbox::enter`) on descriptors open in the child.
    unsafe {
        command.pre_exec(move || {
            // If the host dies, even by SIGKILL, the child dies with it.
            nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)?;
            if write_fd == RESULT_FD {
                nix::fcntl::fcntl(
                    std::os::fd::BorrowedFd::borrow_raw(write_fd),
                    nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::empty()),
                )?;
            } else {
                // dup2 leaves the new descriptor without close-on-exec: the runner inherits it.
                let rc = libc_dup2(write_fd, RESULT_FD);
                if rc < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            crate::sandbox::enter(&plan)
        });
    }
    let child = command.spawn().map_err(|source| Error::Spawn {
        program: python.to_owned(),
        source,
    })?;
    drop(result_write); // the child holds the only write end now: EOF comes when it exits
    let pid = child.id().ok_or_else(|| Error::Io {
        what: "reading the child's pid",
        source: std::io::Error::other("the child exited before it could be tracked"),
    })?;
    let guard = GroupGuard {
        pgid: Pid::from_raw(pid as i32),
        sweep_uid,
    };
    let result =
        tokio::net::unix::pipe::Receiver::from_owned_fd(result_read).map_err(|e| Error::Io {
            what: "reading the result pipe",
            source: e,
        })?;
    Ok(Spawned {
        child,
        guard,
        result,
    })
}

fn libc_dup2(old: i32, new: i32) -> i32 {
    // SAFETY: dup2 on two plain descriptor numbers; failure is reported through the return value.
    unsafe { libc::dup2(old, new) }
}
