//! Interpreter discovery: a real CPython executable and its version.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::SystemTime;

use serde::{Deserialize, Serialize};

use crate::Error;

/// Oldest CPython supported (top-level await in `compile`, `sys.stdlib_module_names`).
pub(crate) const MIN_VERSION: (u32, u32, u32) = (3, 10, 0);

const PROBE: &str = "import sys; print(sys.implementation.name); print(sys.executable); print('%d.%d.%d' % sys.version_info[:3])";
const CANDIDATES: &[&str] = &[
    "python3",
    "python3.13",
    "python3.12",
    "python3.11",
    "python3.10",
    "python",
];

/// A CPython interpreter, resolved to its real executable.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Interpreter {
    /// The real executable (`sys.executable`), never a shim script.
    pub executable: PathBuf,
    /// `sys.version_info[:3]`.
    pub version: (u32, u32, u32),
}

#[derive(Serialize, Deserialize)]
struct CacheEntry {
    key: String,
    interpreter: Interpreter,
    executable_mtime: Option<SystemTime>,
}

static FOUND: Mutex<Vec<(String, Interpreter)>> = Mutex::new(Vec::new());

impl Interpreter {
    /// Finds an interpreter: `preferred` if given, else `$RUNPYTHON_PYTHON`, else the first CPython ≥ 3.10
    /// among `python3`, `python3.13` … `python3.10`, `python` on `PATH`. The answer is remembered in this
    /// process and in a small cache file (checked against the executable's mtime), because resolving a
    /// shim costs ~100 ms. Blocking: call it off an async runtime's worker threads.
    pub fn discover(preferred: Option<&Path>) -> Result<Self, Error> {
        let env_choice = std::env::var_os("RUNPYTHON_PYTHON").map(PathBuf::from);
        let preferred = preferred.map(Path::to_path_buf).or(env_choice);
        let key = format!(
            "{:?}|{:?}",
            preferred,
            std::env::var_os("PATH").unwrap_or_default()
        );
        if let Ok(found) = FOUND.lock() {
            if let Some((_, hit)) = found.iter().find(|(k, _)| *k == key) {
                return Ok(hit.clone());
            }
        }
        let interpreter = match read_cache(&key) {
            Some(hit) => hit,
            None => {
                let found = match &preferred {
                    Some(path) => Self::probe(path).map_err(|reason| Error::BadInterpreter {
                        path: path.clone(),
                        reason,
                    })?,
                    None => search_path()?,
                };
                write_cache(&key, &found);
                found
            }
        };
        if let Ok(mut found) = FOUND.lock() {
            found.push((key, interpreter.clone()));
        }
        Ok(interpreter)
    }

    /// Asks `program` what it is. `Err` says why it is not a usable CPython ≥ 3.10.
    pub fn probe(program: &Path) -> Result<Self, String> {
        let out = Command::new(program)
            .args(["-I", "-S", "-c", PROBE])
            .stdin(Stdio::null())
            .stderr(Stdio::piped())
            .output()
            .map_err(|e| format!("cannot start it: {e}"))?;
        if !out.status.success() {
            let stderr = String::from_utf8_lossy(&out.stderr);
            return Err(format!(
                "it exited with {}: {}",
                out.status,
                tail(&stderr, 300)
            ));
        }
        let text = String::from_utf8_lossy(&out.stdout);
        let mut lines = text.lines();
        let (Some(implementation), Some(executable), Some(version)) =
            (lines.next(), lines.next(), lines.next())
        else {
            return Err(format!("unexpected answer to the version probe: {text:?}"));
        };
        if implementation != "cpython" {
            return Err(format!("it is {implementation}, not CPython"));
        }
        let mut parts = version.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
        let version = (
            parts.next().unwrap_or(0),
            parts.next().unwrap_or(0),
            parts.next().unwrap_or(0),
        );
        if version < MIN_VERSION {
            return Err(format!(
                "it is Python {}.{}.{}, older than 3.10",
                version.0, version.1, version.2
            ));
        }
        if executable.is_empty() {
            return Err("it does not know its own executable (sys.executable is empty)".into());
        }
        Ok(Self {
            executable: PathBuf::from(executable),
            version,
        })
    }

    /// `"3.11"`.
    pub fn minor_version(&self) -> String {
        format!("{}.{}", self.version.0, self.version.1)
    }
}

fn search_path() -> Result<Interpreter, Error> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let mut tried = Vec::new();
    for dir in std::env::split_paths(&path) {
        for name in CANDIDATES {
            let candidate = dir.join(name);
            if !candidate.is_file() {
                continue;
            }
            match Interpreter::probe(&candidate) {
                Ok(found) => return Ok(found),
                Err(why) => tried.push(format!("{}: {why}", candidate.display())),
            }
        }
    }
    if tried.is_empty() {
        tried.push("no python3 on PATH".into());
    }
    Err(Error::NoInterpreter {
        tried: tried.join("; "),
    })
}

/// runpython's cache directory: `$XDG_CACHE_HOME/runpython`, else `$HOME/.cache/runpython`; `None` when
/// neither variable is set. The one place it is resolved (the engine's code directory and prepared
/// environments live under it too).
pub fn cache_dir() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("runpython"))
}

fn cache_file() -> Option<PathBuf> {
    Some(cache_dir()?.join("interpreter-v1.json"))
}

fn mtime(path: &Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

fn read_cache(key: &str) -> Option<Interpreter> {
    let text = std::fs::read(cache_file()?).ok()?;
    let entry: CacheEntry = serde_json::from_slice(&text).ok()?;
    (entry.key == key
        && entry.executable_mtime.is_some()
        && entry.executable_mtime == mtime(&entry.interpreter.executable))
    .then_some(entry.interpreter)
}

/// Best effort: a cache that cannot be written only costs the next process a probe.
fn write_cache(key: &str, interpreter: &Interpreter) {
    let Some(file) = cache_file() else { return };
    let entry = CacheEntry {
        key: key.to_owned(),
        interpreter: interpreter.clone(),
        executable_mtime: mtime(&interpreter.executable),
    };
    let Ok(text) = serde_json::to_vec(&entry) else {
        return;
    };
    if let Some(dir) = file.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    let tmp = file.with_extension(format!("tmp{}", std::process::id()));
    if std::fs::write(&tmp, text).is_ok() && std::fs::rename(&tmp, &file).is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
}

fn tail(text: &str, max: usize) -> &str {
    let start = text.len().saturating_sub(max);
    let start = (start..=text.len())
        .find(|i| text.is_char_boundary(*i))
        .unwrap_or(text.len());
    text[start..].trim()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn discovery_resolves_to_a_real_cpython_executable() {
        let found = Interpreter::discover(None).expect("this machine has Python 3");
        assert!(found.version >= MIN_VERSION);
        // A shim (pyenv's is a bash script) is resolved to the binary behind it.
        let head = std::fs::read(&found.executable).unwrap();
        assert_eq!(
            &head[..4],
            b"\x7fELF",
            "{} is not a binary",
            found.executable.display()
        );
    }

    #[test]
    fn a_program_that_is_not_python_is_refused_with_the_reason() {
        let err = Interpreter::probe(Path::new("/bin/false")).unwrap_err();
        assert!(err.contains("exited"), "{err}");
        let err = Interpreter::probe(Path::new("/nonexistent/python3")).unwrap_err();
        assert!(err.contains("cannot start"), "{err}");
    }
}
