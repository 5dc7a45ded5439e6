//! runpython's Python modules (the runner and the bridge client) as files in a code directory named by
//! their digest, so Python caches their bytecode, and compiled once per interpreter.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::OnceLock;

use crate::error::Error;

/// The entry point every interpreter of the child imports (`python/runpython_runner.py`): it chooses the
/// mode (one-shot run, session, template).
pub(crate) const RUNNER_PY: &str = include_str!("python/runpython_runner.py");

/// One run's machinery in the child (`python/runpython_run.py`), the library the entry modules share.
const RUN_PY: &str = include_str!("python/runpython_run.py");

/// Packages' first-use work, done once in a warm environment's template (`python/runpython_warm.py`).
const WARM_PY: &str = include_str!("python/runpython_warm.py");

/// The host's messages to the child, checked key by key (`python/runpython_protocol.py`).
const PROTOCOL_PY: &str = include_str!("python/runpython_protocol.py");

/// Values as JSON in the child (`python/runpython_json.py`): the strict codec, JSON forms, previews.
const JSON_PY: &str = include_str!("python/runpython_json.py");

/// The display protocol in the child (`python/runpython_display.py`), charts as data included.
const DISPLAY_PY: &str = include_str!("python/runpython_display.py");

/// A session's interpreter (`python/runpython_session.py`): cells across one namespace.
const SESSION_PY: &str = include_str!("python/runpython_session.py");

/// A session's namespace as a snapshot and back (`python/runpython_snapshot.py`), in its sandbox only.
const SNAPSHOT_PY: &str = include_str!("python/runpython_snapshot.py");

/// runpython's tagged JSON (`python/runpython_values.py`): exact Python values across the boundary,
/// imported by the runner and the bridge client. The Python package builds the same file into itself
/// for the host's side.
pub(crate) const VALUES_PY: &str = include_str!("python/runpython_values.py");

/// Bootstrap passed with `-c`: imports the runner from the code directory (argv[1]), so Python caches its
/// bytecode there instead of compiling it on every run.
pub(crate) const BOOTSTRAP: &str =
    "import sys;sys.path.insert(0,sys.argv[1]);import runpython_runner";

/// The directory holding runpython's Python modules (those of [`MODULES`]), written
/// once per content version under the user's cache directory (or the temp directory), atomically.
pub(crate) fn code_dir() -> Result<&'static Path, Error> {
    static DIR: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    DIR.get_or_init(|| write_code_dir().map_err(|e| e.to_string()))
        .as_deref()
        .map_err(|e| {
            Error::io_pathless(
                "writing runpython's Python modules to the cache directory",
                std::io::Error::other(e.clone()),
            )
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

/// [`ensure_bytecode`] for `python` off the async runtime's threads, unless this process already
/// found it in place: what a run, a session and a template do before they start an interpreter.
pub(crate) async fn bytecode_in_place(python: &Path, version: (u32, u32, u32), dir: &'static Path) {
    if bytecode_ready(python) {
        return;
    }
    let python = python.to_owned();
    let _ = tokio::task::spawn_blocking(move || ensure_bytecode(&python, version, dir)).await;
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

/// A digest of the Python that runs in the child (the runner, the bridge client, the template), computed once:
/// it names the code directory and goes into memo keys.
pub(crate) fn code_version() -> &'static str {
    static VERSION: OnceLock<String> = OnceLock::new();
    VERSION.get_or_init(|| {
        // blake3, not `DefaultHasher`: the value is persisted in memo keys, and std's hasher may change
        // between Rust releases.
        let mut hasher = blake3::Hasher::new();
        for (_, part) in MODULES {
            hasher.update(&(part.len() as u64).to_le_bytes());
            hasher.update(part.as_bytes());
        }
        hasher.finalize().to_hex()[..16].to_owned()
    })
}

/// The modules of the code directory, by file name: each written as it is in `python/` (the bridge
/// client comes from runpython-bridge).
const MODULES: [(&str, &str); 12] = [
    ("runpython_runner.py", RUNNER_PY),
    ("runpython_run.py", RUN_PY),
    ("runpython_protocol.py", PROTOCOL_PY),
    ("runpython_warm.py", WARM_PY),
    ("runpython_json.py", JSON_PY),
    ("runpython_display.py", DISPLAY_PY),
    ("runpython_session.py", SESSION_PY),
    ("runpython_snapshot.py", SNAPSHOT_PY),
    ("runpython_values.py", VALUES_PY),
    ("runpython_tools.py", runpython_bridge::CLIENT_PY),
    runpython_sandbox::TEMPLATE_MODULES[0],
    runpython_sandbox::TEMPLATE_MODULES[1],
];

fn write_code_dir() -> std::io::Result<PathBuf> {
    let name = format!("py-{}", code_version());
    let bases = [
        crate::policy::env_vars::cache_dir(),
        Some(std::env::temp_dir().join("runpython")),
    ];
    let mut last_error = std::io::Error::other("no cache directory");
    for base in bases.into_iter().flatten() {
        let dir = base.join(&name);
        let complete = |d: &Path| MODULES.iter().all(|(name, _)| d.join(name).is_file());
        if complete(&dir) {
            return Ok(dir);
        }
        let attempt = (|| {
            std::fs::create_dir_all(&base)?;
            let tmp = tempfile::Builder::new()
                .prefix(".py-tmp-")
                .tempdir_in(&base)?;
            for (name, text) in MODULES {
                std::fs::write(tmp.path().join(name), text)?;
            }
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
