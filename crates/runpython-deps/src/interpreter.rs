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

/// Answers kept in the cache file, the latest first: enough for the few ways one user starts
/// runpython (a terminal, an editor, an MCP client, CI) without one evicting another's.
const CACHE_ENTRIES: usize = 16;

/// Files the common version managers (pyenv, asdf, mise) read to decide which interpreter a shim
/// starts, looked for in the working directory and each of its parents.
const VERSION_FILES: &[&str] = &[
    ".python-version",
    ".tool-versions",
    ".mise.toml",
    "mise.toml",
    ".mise.local.toml",
];

/// Prefixes of the variables those managers (and a virtual environment's activation) read.
const VERSION_VARS: &[&str] = &["PYENV", "ASDF", "MISE", "RTX_", "VIRTUAL_ENV", "CONDA"];

static FOUND: Mutex<Vec<(String, Interpreter)>> = Mutex::new(Vec::new());

/// One discovery's inputs, read from the process (`current`) or given (tests).
struct Lookup {
    preferred: Option<PathBuf>,
    path: std::ffi::OsString,
    cwd: Option<PathBuf>,
    /// The version managers' variables (`VERSION_VARS`), sorted.
    vars: Vec<(std::ffi::OsString, std::ffi::OsString)>,
    cache: Option<PathBuf>,
    /// Whether this process's earlier answers (`FOUND`) are used.
    memo: bool,
}

impl Lookup {
    fn current(preferred: Option<PathBuf>) -> Self {
        let mut vars: Vec<_> = std::env::vars_os()
            .filter(|(name, _)| {
                let name = name.to_string_lossy();
                VERSION_VARS.iter().any(|p| name.starts_with(p))
            })
            .collect();
        vars.sort();
        Self {
            preferred,
            path: std::env::var_os("PATH").unwrap_or_default(),
            cwd: std::env::current_dir().ok(),
            vars,
            cache: cache_file(),
            memo: true,
        }
    }

    /// What the answer depends on, as a digest: the preferred program or `PATH`, the program that
    /// would be asked (the first candidate on `PATH`) with its size and mtime, so a `python3` put
    /// earlier on `PATH` or replaced is seen; and when that program is a script (a shim), what the
    /// common shims read besides: the version files in the working directory and above it, the
    /// global pyenv version and the managers' variables.
    fn key(&self) -> String {
        let mut h = blake3::Hasher::new();
        let mut field = |bytes: &[u8]| {
            h.update(&(bytes.len() as u64).to_le_bytes());
            h.update(bytes);
        };
        let path = self.path.as_encoded_bytes();
        let program = match &self.preferred {
            Some(p) => {
                field(b"preferred");
                field(p.as_os_str().as_encoded_bytes());
                Some(p.clone())
            }
            None => {
                field(b"path");
                field(path);
                candidates(&self.path).next()
            }
        };
        let stamp_of = |p: &Path| std::fs::metadata(p).map(|m| stamp(&m)).unwrap_or_default();
        match &program {
            Some(p) => {
                field(p.as_os_str().as_encoded_bytes());
                field(stamp_of(p).as_bytes());
            }
            None => field(b"none"),
        }
        if program.as_deref().is_some_and(is_script) {
            field(b"script");
            // Not the directory itself: runs started from a fresh directory each time (an agent's
            // usual way) share one answer unless a version file there says otherwise.
            if let Some(cwd) = &self.cwd {
                for dir in cwd.ancestors() {
                    for name in VERSION_FILES {
                        let file = dir.join(name);
                        if let Ok(meta) = std::fs::symlink_metadata(&file) {
                            field(file.as_os_str().as_encoded_bytes());
                            field(stamp(&meta).as_bytes());
                        }
                    }
                }
            }
            let root = self
                .vars
                .iter()
                .find(|(k, _)| k == "PYENV_ROOT")
                .map(|(_, v)| PathBuf::from(v))
                .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".pyenv")));
            if let Some(root) = root {
                field(stamp_of(&root.join("version")).as_bytes());
            }
            for (name, value) in &self.vars {
                field(name.as_encoded_bytes());
                field(value.as_encoded_bytes());
            }
        }
        h.finalize().to_hex().to_string()
    }

    fn find(&self) -> Result<Interpreter, Error> {
        let key = self.key();
        if let (true, Ok(found)) = (self.memo, FOUND.lock()) {
            if let Some((_, hit)) = found.iter().find(|(k, _)| *k == key) {
                return Ok(hit.clone());
            }
        }
        let interpreter = match self.cache.as_deref().and_then(|c| read_cache(c, &key)) {
            Some(hit) => hit,
            None => {
                let found = match &self.preferred {
                    Some(path) => {
                        Interpreter::probe(path).map_err(|reason| Error::BadInterpreter {
                            path: path.clone(),
                            reason,
                        })?
                    }
                    None => search_path(&self.path)?,
                };
                if let Some(cache) = &self.cache {
                    write_cache(cache, &key, &found);
                }
                found
            }
        };
        if let Ok(mut found) = FOUND.lock() {
            found.push((key, interpreter.clone()));
        }
        Ok(interpreter)
    }
}

impl Interpreter {
    /// Finds an interpreter: `preferred` if given, else `$RUNPYTHON_PYTHON`, else the first CPython ≥ 3.10
    /// among `python3`, `python3.13` … `python3.10`, `python` on `PATH`. The answer is remembered in this
    /// process and in a small cache file of the last few answers, because resolving a shim costs ~100 ms;
    /// an answer is reused only while what it depends on is unchanged (see `Lookup::key`: the program
    /// that would be asked, and for a shim the version managers' files where it runs and their
    /// variables) and its executable's mtime is the one recorded. Blocking: call it off an async
    /// runtime's worker threads.
    pub fn discover(preferred: Option<&Path>) -> Result<Self, Error> {
        let env_choice = std::env::var_os("RUNPYTHON_PYTHON").map(PathBuf::from);
        let preferred = preferred.map(Path::to_path_buf).or(env_choice);
        Lookup::current(preferred).find()
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

/// The candidate files on `path`, in the order `search_path` asks them; the first is the program
/// whose answer a cached one stands for.
fn candidates(path: &std::ffi::OsStr) -> impl Iterator<Item = PathBuf> + '_ {
    std::env::split_paths(path)
        .flat_map(|dir| CANDIDATES.iter().map(move |name| dir.join(name)))
        .filter(|candidate| candidate.is_file())
}

/// What of a file's metadata says it changed: its mtime and size.
fn stamp(meta: &std::fs::Metadata) -> String {
    format!("{:?}|{}", meta.modified().ok(), meta.len())
}

/// Whether `program` is a script (`#!`): a shim, whose answer may depend on more than its path.
/// Only a regular file is read, opened without blocking: a FIFO or a terminal named as the
/// interpreter is not a script (and starting it fails, with the reason), never a wait.
fn is_script(program: &Path) -> bool {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let mut head = [0u8; 2];
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags((nix::fcntl::OFlag::O_NONBLOCK | nix::fcntl::OFlag::O_NOCTTY).bits())
        .open(program)
        .and_then(|mut f| {
            if !f.metadata()?.is_file() {
                return Err(std::io::ErrorKind::InvalidInput.into());
            }
            f.read_exact(&mut head)
        })
        .is_ok_and(|()| &head == b"#!")
}

fn search_path(path: &std::ffi::OsStr) -> Result<Interpreter, Error> {
    let mut tried = Vec::new();
    for candidate in candidates(path) {
        match Interpreter::probe(&candidate) {
            Ok(found) => return Ok(found),
            Err(why) => tried.push(format!("{}: {why}", candidate.display())),
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
    Some(cache_dir()?.join("interpreter-v2.json"))
}

fn mtime(path: &Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

fn read_entries(file: &Path) -> Vec<CacheEntry> {
    std::fs::read(file)
        .ok()
        .and_then(|text| serde_json::from_slice(&text).ok())
        .unwrap_or_default()
}

fn read_cache(file: &Path, key: &str) -> Option<Interpreter> {
    read_entries(file)
        .into_iter()
        .find(|entry| {
            entry.key == key
                && entry.executable_mtime.is_some()
                && entry.executable_mtime == mtime(&entry.interpreter.executable)
        })
        .map(|entry| entry.interpreter)
}

/// Best effort: a cache that cannot be written only costs the next process a probe. The new answer
/// goes first; the oldest beyond `CACHE_ENTRIES` are dropped. Two processes writing at once can lose
/// one's answer (it is asked again next time), never tear the file (written aside, then renamed).
fn write_cache(file: &Path, key: &str, interpreter: &Interpreter) {
    let mut entries = read_entries(file);
    entries.retain(|entry| entry.key != key);
    entries.insert(
        0,
        CacheEntry {
            key: key.to_owned(),
            interpreter: interpreter.clone(),
            executable_mtime: mtime(&interpreter.executable),
        },
    );
    entries.truncate(CACHE_ENTRIES);
    let Ok(text) = serde_json::to_vec(&entries) else {
        return;
    };
    if let Some(dir) = file.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    let tmp = file.with_extension(format!("tmp{}", std::process::id()));
    if std::fs::write(&tmp, text).is_ok() && std::fs::rename(&tmp, file).is_err() {
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

    /// A fake interpreter at `dir/python3`: a script that logs each time it is asked to `dir/asked`
    /// and answers with the executable `answer` (a shell expression) prints.
    fn fake_python(dir: &Path, answer: &str) {
        use std::os::unix::fs::PermissionsExt;
        let script = dir.join("python3");
        std::fs::write(
            &script,
            format!(
                "#!/bin/sh\necho asked >> '{log}'\necho cpython\necho {answer}\necho 3.11.7\n",
                log = dir.join("asked").display()
            ),
        )
        .unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    }

    fn asked(dir: &Path) -> usize {
        std::fs::read_to_string(dir.join("asked"))
            .map(|s| s.lines().count())
            .unwrap_or(0)
    }

    fn lookup(path: &[&Path], cwd: &Path, cache: &Path) -> Lookup {
        Lookup {
            preferred: None,
            path: std::env::join_paths(path).unwrap(),
            cwd: Some(cwd.to_path_buf()),
            vars: Vec::new(),
            cache: Some(cache.to_path_buf()),
            memo: false,
        }
    }

    #[test]
    fn answers_for_two_paths_are_both_kept() {
        let t = tempfile::tempdir().unwrap();
        let (a, b) = (t.path().join("a"), t.path().join("b"));
        for dir in [&a, &b] {
            std::fs::create_dir(dir).unwrap();
            std::fs::write(dir.join("exe"), "").unwrap();
            fake_python(dir, &dir.join("exe").display().to_string());
        }
        let cache = t.path().join("cache.json");
        let first = lookup(&[&a], t.path(), &cache).find().unwrap();
        assert_eq!(first.executable, a.join("exe"));
        let other = lookup(&[&b], t.path(), &cache).find().unwrap();
        assert_eq!(other.executable, b.join("exe"));
        let again = lookup(&[&a], t.path(), &cache).find().unwrap();
        assert_eq!(again, first);
        // One process with the other PATH between did not make the first ask again.
        assert_eq!((asked(&a), asked(&b)), (1, 1));
    }

    #[test]
    fn a_python3_put_earlier_on_path_is_seen() {
        let t = tempfile::tempdir().unwrap();
        let (early, late) = (t.path().join("early"), t.path().join("late"));
        for dir in [&early, &late] {
            std::fs::create_dir(dir).unwrap();
            std::fs::write(dir.join("exe"), "").unwrap();
        }
        fake_python(&late, &late.join("exe").display().to_string());
        let cache = t.path().join("cache.json");
        let found = lookup(&[&early, &late], t.path(), &cache).find().unwrap();
        assert_eq!(found.executable, late.join("exe"));
        // Same PATH, a new interpreter before the one found: it is the one `python3` starts now.
        fake_python(&early, &early.join("exe").display().to_string());
        let found = lookup(&[&early, &late], t.path(), &cache).find().unwrap();
        assert_eq!(found.executable, early.join("exe"));
    }

    #[test]
    fn a_shims_answer_is_asked_again_when_its_version_file_changes() {
        let t = tempfile::tempdir().unwrap();
        let (bin, project) = (t.path().join("bin"), t.path().join("project"));
        std::fs::create_dir(&bin).unwrap();
        std::fs::create_dir(&project).unwrap();
        for version in ["a", "bb"] {
            std::fs::write(bin.join(format!("exe-{version}")), "").unwrap();
        }
        // As pyenv's shim does: the interpreter named by the project's `.python-version`.
        let version_file = project.join(".python-version");
        fake_python(
            &bin,
            &format!("{}/exe-$(cat '{}')", bin.display(), version_file.display()),
        );
        let cache = t.path().join("cache.json");
        std::fs::write(&version_file, "a").unwrap();
        let found = lookup(&[&bin], &project, &cache).find().unwrap();
        assert_eq!(found.executable, bin.join("exe-a"));
        std::fs::write(&version_file, "bb").unwrap();
        let found = lookup(&[&bin], &project, &cache).find().unwrap();
        assert_eq!(found.executable, bin.join("exe-bb"));
        // Unchanged, it is not asked again.
        lookup(&[&bin], &project, &cache).find().unwrap();
        assert_eq!(asked(&bin), 2);
    }

    #[test]
    fn a_fifo_named_as_the_interpreter_is_refused_not_waited_on() {
        let t = tempfile::tempdir().unwrap();
        let fifo = t.path().join("python3");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
        let cache = t.path().join("cache.json");
        let (tx, rx) = std::sync::mpsc::channel();
        let lookup = Lookup {
            preferred: Some(fifo.clone()),
            ..lookup(&[], t.path(), &cache)
        };
        std::thread::spawn(move || {
            let _ = tx.send(lookup.find().map(|_| ()));
        });
        // A hang guard, not a speed target: the answer is immediate.
        let got = rx
            .recv_timeout(std::time::Duration::from_secs(30))
            .expect("discovery waited on a FIFO");
        assert!(
            matches!(got, Err(Error::BadInterpreter { ref path, .. }) if *path == fifo),
            "{got:?}"
        );
    }

    #[test]
    fn only_a_shims_answer_depends_on_the_version_files_where_it_runs() {
        let t = tempfile::tempdir().unwrap();
        let real = Interpreter::discover(None).unwrap().executable;
        fake_python(t.path(), "x");
        let (plain, other, project) = (
            t.path().join("plain"),
            t.path().join("other"),
            t.path().join("project"),
        );
        for dir in [&plain, &other, &project] {
            std::fs::create_dir(dir).unwrap();
        }
        std::fs::write(project.join(".python-version"), "3.12\n").unwrap();
        let key = |program: &Path, cwd: &Path| {
            Lookup {
                preferred: Some(program.to_path_buf()),
                path: Default::default(),
                cwd: Some(cwd.to_path_buf()),
                vars: Vec::new(),
                cache: None,
                memo: false,
            }
            .key()
        };
        assert_eq!(key(&real, &plain), key(&real, &project));
        let shim = t.path().join("python3");
        // Two directories no version file names share the shim's answer; a project's file does not.
        assert_eq!(key(&shim, &plain), key(&shim, &other));
        assert_ne!(key(&shim, &plain), key(&shim, &project));
    }
}
