//! What a run is asked to do: [`RunRequest`], the [`Limits`] it runs under and the [`Event`]s it
//! reports. A leaf: every other module may use it, it uses none of them.

use std::collections::BTreeMap;
use std::time::Duration;

use runpython_deps::Progress as DepsProgress;
use serde_json::{Map, Value};

use crate::error::Error;

/// The name of the tool that runs code (offered to models, and to the code itself for nested runs).
pub const RUN_PYTHON_TOOL: &str = "run_python";

/// Limits and policy of a [`crate::RunPython`].
#[derive(Debug, Clone)]
pub struct Limits {
    /// Wall-clock limit of one run (default 60 s).
    pub timeout: Duration,
    /// Longest code accepted, in characters, checked before anything is spawned (default 200,000).
    pub max_code_chars: usize,
    /// Largest return value, in bytes of JSON (default 1,000,000).
    pub max_return_bytes: usize,
    /// Characters kept per output stream, head and tail (default 10,000).
    pub max_output_chars: usize,
    /// Largest return value carried inline, in bytes of JSON (default 4 KiB); a larger one is
    /// replaced by a preview and kept whole as an artifact.
    pub inline_return_bytes: usize,
    /// Largest envelope, in bytes of JSON (default 8 KiB), met by shrinking output and previews.
    pub envelope_budget: usize,
    /// Bytes of files a client may upload with one call (MCP's `content_base64`; default 0: none,
    /// files come by artifact id).
    pub max_upload_bytes: usize,
    /// Bytes of display images (PNG, JPEG) one run hands back inline, besides their files, for
    /// clients that show images (MCP's `image` content; default 256 KiB). Past it, images are
    /// linked only.
    pub max_image_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            timeout: Duration::from_secs(60),
            max_code_chars: 200_000,
            max_return_bytes: 1_000_000,
            max_output_chars: 10_000,
            inline_return_bytes: 4096,
            envelope_budget: 8192,
            max_upload_bytes: 0,
            max_image_bytes: 256 << 10,
        }
    }
}

/// Something that happened during a run, delivered as it happens by [`crate::RunHandle::next_event`].
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Event {
    /// A chunk the code wrote to stdout.
    Stdout(String),
    /// A chunk the code wrote to stderr.
    Stderr(String),
    /// A step of preparing the run's dependencies (before the code starts).
    Dependencies(DepsProgress),
    /// The run is durable: its checkpoint is in the store under `run_id`, so if its host stops it can
    /// be found ([`crate::resumable_runs`], `runpython runs`) and resumed. Sent before the code starts.
    Resumable {
        /// The run's id.
        run_id: String,
    },
    /// The code called the host tool `name` (sent as the call starts; calls answered from a resumed
    /// run's journal are not announced).
    ToolCall {
        /// The tool's name.
        name: String,
    },
}

/// One piece of code to run, with the globals it sees.
#[derive(Debug, Clone)]
pub struct RunRequest {
    /// The Python source.
    pub code: String,
    /// JSON values bound as globals before the code runs.
    pub inputs: Map<String, Value>,
    /// Globals bound to stored artifacts, by id: parsed as JSON or CSV where they can be, else bytes.
    pub input_artifacts: Vec<(String, String)>,
    /// Requirement specs for this run (`six==1.15.0`, `pkg[extra]>=2`, `name @ URL`), merged with the
    /// engine's defaults, the code's PEP 723 block and its detected imports.
    pub dependencies: Vec<String>,
    /// Whether a memoizing [`crate::RunPython`] may serve this run from, and record it in, its memo cache.
    pub use_memo: bool,
    /// This run's wall-clock limit, when shorter than the engine's (a longer one is capped to it).
    pub timeout: Option<Duration>,
    /// Run as a cell of this session (state kept across calls; see [`crate::Session`]); `None`: a
    /// run of its own.
    pub session: Option<String>,
    /// With [`RunRequest::session`]: start the session over (empty) before running.
    pub reset_session: bool,
    /// Also return the value as Python shows it (`return_repr`: what a REPL prints).
    pub repr: bool,
    /// Exact values, for programs: [`RunRequest::inputs`] are runpython's tagged JSON
    /// ([`crate::VALUES_PY`]), decoded into the real objects in the run, and the envelope carries
    /// [`crate::Envelope::return_typed`] beside its JSON `return_value`. The Python package sets it.
    pub typed: bool,
    /// Environment variables for this run only, on top of the engine's (e2b's `envs`). Like
    /// passed-through variables, their values are masked wherever the run is kept (stored output,
    /// values, memo entries) and are never written to the store: a resumed run does not get them.
    pub env: BTreeMap<String, String>,
    /// Narrows the engine's network policy for this run: only these of what the engine allows (none:
    /// no network). It never widens it: a connection must pass both. `None`: the engine's policy.
    pub allow_hosts: Option<Vec<runpython_egress::HostPattern>>,
    /// Files put in the run's working directory before the code runs, read-only, by name.
    pub files: Vec<(String, FileSource)>,
}

/// Where a file put in a run comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FileSource {
    /// These bytes (up to [`MAX_INLINE_FILE`]).
    Bytes(Vec<u8>),
    /// A stored artifact of the engine's tenant, by id (any size: a large one is copied in slices).
    Artifact(String),
    /// Bytes a client sent (MCP's `content_base64`), bounded by the engine's
    /// [`Limits::max_upload_bytes`].
    Upload(Vec<u8>),
}

/// The largest file given as bytes ([`RunRequest::file`]); larger files go through the store
/// ([`RunRequest::file_artifact`]).
pub const MAX_INLINE_FILE: usize = 64 << 20;

impl RunRequest {
    /// A request for `code` with no inputs.
    pub fn new(code: impl Into<String>) -> Self {
        Self {
            code: code.into(),
            inputs: Map::new(),
            input_artifacts: Vec::new(),
            dependencies: Vec::new(),
            use_memo: true,
            timeout: None,
            session: None,
            reset_session: false,
            repr: false,
            typed: false,
            env: BTreeMap::new(),
            allow_hosts: None,
            files: Vec::new(),
        }
    }

    /// Puts `bytes` in the run's working directory as the read-only file `name` (a plain file name:
    /// no `/`). Up to [`MAX_INLINE_FILE`]; store larger files and use [`RunRequest::file_artifact`].
    pub fn file(mut self, name: impl Into<String>, bytes: impl Into<Vec<u8>>) -> Self {
        self.files
            .push((name.into(), FileSource::Bytes(bytes.into())));
        self
    }

    /// Puts the stored artifact `id` in the run's working directory as the read-only file `name`.
    /// Needs an engine with a store; another tenant's id reads as a missing one.
    pub fn file_artifact(mut self, name: impl Into<String>, id: impl Into<String>) -> Self {
        self.files
            .push((name.into(), FileSource::Artifact(id.into())));
        self
    }

    /// Narrows the engine's network policy for this run to `patterns` (see
    /// [`RunRequest::allow_hosts`]).
    pub fn allow_hosts(mut self, patterns: Vec<runpython_egress::HostPattern>) -> Self {
        self.allow_hosts = Some(patterns);
        self
    }

    /// Sets the environment variable `name` to `value` for this run only.
    pub fn env(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.insert(name.into(), value.into());
        self
    }

    /// Runs this as a cell of the session `id` (made if new; see [`crate::RunPython::session`]).
    pub fn session(mut self, id: impl Into<String>) -> Self {
        self.session = Some(id.into());
        self
    }

    /// A wall-clock limit for this run only, capped by the engine's [`Limits::timeout`].
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// Binds `name` to the stored artifact `id` (pass by reference: the data never goes through the
    /// model). Needs an engine with a store.
    pub fn input_artifact(mut self, name: impl Into<String>, id: impl Into<String>) -> Self {
        self.input_artifacts.push((name.into(), id.into()));
        self
    }

    /// Adds a requirement spec for this run.
    pub fn dependency(mut self, spec: impl Into<String>) -> Self {
        self.dependencies.push(spec.into());
        self
    }

    /// Neither serve this run from the memo cache nor record it there.
    pub fn no_memo(mut self) -> Self {
        self.use_memo = false;
        self
    }

    /// Binds `name` to `value` as a global.
    pub fn input(mut self, name: impl Into<String>, value: Value) -> Self {
        self.inputs.insert(name.into(), value);
        self
    }

    /// Exact values: inputs are tagged JSON and the envelope carries `return_typed` (see
    /// [`RunRequest::typed`]).
    pub fn typed(mut self) -> Self {
        self.typed = true;
        self
    }
}

impl From<&str> for RunRequest {
    fn from(code: &str) -> Self {
        Self::new(code)
    }
}

impl From<String> for RunRequest {
    fn from(code: String) -> Self {
        Self::new(code)
    }
}

/// Whether the files can be put in the run: plain names, each once, within the sizes.
pub(crate) fn check_files(request: &RunRequest, max_upload_bytes: usize) -> Result<(), Error> {
    let mut seen = std::collections::BTreeSet::new();
    let mut uploaded = 0usize;
    let mut any_upload = false;
    for (name, source) in &request.files {
        let plain = !name.is_empty()
            && name != "."
            && name != ".."
            && !name.contains(['/', '\0'])
            && name.len() <= 255;
        if !plain {
            return Err(Error::InvalidInput(format!(
                "file name {name:?} must be a plain file name (no `/`, not `.` or `..`, at most 255 bytes)"
            )));
        }
        if !seen.insert(name.as_str()) {
            return Err(Error::InvalidInput(format!(
                "file {name} is given twice; give each name once"
            )));
        }
        let mut uploads = false;
        if let FileSource::Bytes(bytes) | FileSource::Upload(bytes) = source {
            if bytes.len() > MAX_INLINE_FILE {
                return Err(Error::InvalidInput(format!(
                    "file {name} is {} bytes, over the {MAX_INLINE_FILE} bytes a request carries; \
                     store it (`runpython artifacts put`) and pass its id",
                    bytes.len()
                )));
            }
        }
        if let FileSource::Upload(bytes) = source {
            uploads = true;
            uploaded += bytes.len();
        }
        any_upload |= uploads;
    }
    if any_upload && uploaded > max_upload_bytes {
        return Err(Error::InvalidInput(if max_upload_bytes == 0 {
            "this server does not accept file uploads (`content_base64`); store the file and pass \
             its `artifact_id`"
                .to_owned()
        } else {
            format!(
                "the uploaded files are {uploaded} bytes, over this server's {max_upload_bytes}; \
                 store larger files and pass their `artifact_id`"
            )
        }));
    }
    Ok(())
}

/// Whether `name` can be a Python global the code refers to.
pub(crate) fn check_input_names(request: &RunRequest) -> Result<(), Error> {
    for name in request
        .inputs
        .keys()
        .chain(request.input_artifacts.iter().map(|(name, _)| name))
    {
        if !runpython_bridge::is_python_identifier(name) {
            return Err(Error::InvalidInput(format!(
                "input name {name:?} is not a Python identifier (letters, digits and _, not a keyword); rename it"
            )));
        }
    }
    Ok(())
}

/// Whether the run's environment variables can be set: a name without `=` or NUL, a value without NUL.
pub(crate) fn check_env(request: &RunRequest) -> Result<(), Error> {
    for (name, value) in &request.env {
        if name.is_empty() || name.contains(['=', '\0']) {
            return Err(Error::InvalidInput(format!(
                "environment variable name {name:?} must be non-empty, without `=` or NUL"
            )));
        }
        if value.contains('\0') {
            return Err(Error::InvalidInput(format!(
                "the value of environment variable {name} contains a NUL character, which an environment cannot hold"
            )));
        }
    }
    Ok(())
}

/// A sortable, unique run id: milliseconds since the epoch, then 64 random bits, in hex.
pub(crate) fn new_run_id() -> String {
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0);
    let mut random = [0u8; 8];
    let _ = getrandom::fill(&mut random);
    format!("{ms:012x}{:016x}", u64::from_be_bytes(random))
}

/// A size as a person writes it: `512M`, `2G`, `1.5G`, `4096` (bytes), `64K`; binary units (`M` is
/// MiB), an optional `iB`/`B`. At least 4 KiB. The error says how to write one.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let text = s.trim();
    let upper = text.to_ascii_uppercase();
    let number = upper
        .trim_end_matches("IB")
        .trim_end_matches('B')
        .trim_end();
    let (digits, shift) = match number.chars().last() {
        Some('K') => (&number[..number.len() - 1], 10),
        Some('M') => (&number[..number.len() - 1], 20),
        Some('G') => (&number[..number.len() - 1], 30),
        Some('T') => (&number[..number.len() - 1], 40),
        _ => (number, 0),
    };
    let value: f64 = digits
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a size; write it as 512M, 2G or a number of bytes"))?;
    let bytes = value * (1u64 << shift) as f64;
    if !bytes.is_finite() || bytes < 4096.0 || bytes > u64::MAX as f64 {
        return Err(format!("{s:?} is out of range: give at least 4K"));
    }
    Ok(bytes as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn input_names_must_be_identifiers_and_not_keywords() {
        for bad in ["1x", "a-b", "class", ""] {
            let request = RunRequest::new("1").input(bad, json!(1));
            assert!(
                matches!(check_input_names(&request), Err(Error::InvalidInput(_))),
                "{bad}"
            );
        }
        assert!(check_input_names(&RunRequest::new("1").input("_ok1", json!(1))).is_ok());
    }

    #[test]
    fn env_names_and_values_are_checked() {
        for (name, value) in [("", "x"), ("A=B", "x"), ("A", "x\0y")] {
            let request = RunRequest::new("1").env(name, value);
            assert!(
                matches!(check_env(&request), Err(Error::InvalidInput(_))),
                "{name:?}"
            );
        }
        assert!(check_env(&RunRequest::new("1").env("API_TOKEN", "s3cret=!")).is_ok());
    }

    #[test]
    fn run_ids_sort_by_time() {
        let a = new_run_id();
        std::thread::sleep(Duration::from_millis(2));
        let b = new_run_id();
        assert!(a < b && a.len() == 28);
    }

    #[test]
    fn sizes_are_read_in_binary_units() {
        assert_eq!(parse_size("512M"), Ok(512 << 20));
        assert_eq!(parse_size("2G"), Ok(2 << 30));
        assert_eq!(parse_size("1.5GiB"), Ok(3 << 29));
        assert_eq!(parse_size("64k"), Ok(64 << 10));
        assert_eq!(parse_size("8192"), Ok(8192));
        assert!(parse_size("lots").unwrap_err().contains("512M"));
        assert!(parse_size("1").unwrap_err().contains("at least"));
        assert!(parse_size("-5G").is_err());
    }
}
