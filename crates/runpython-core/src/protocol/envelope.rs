//! Envelope v1: what a run returns, and the isolation report it carries. Field names are a public
//! contract; new fields may be added. A leaf: it uses no other module of the crate.

use runpython_store::Artifact;
use serde::{Deserialize, Serialize};
use serde_json::Value;

pub use runpython_sandbox::{BridgeReport, Isolation, LimitReport, RlimitReport};

/// How the run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// The code finished.
    Success,
    /// The code raised, exited, or broke a limit.
    Error,
    /// The code ran past its timeout and was stopped.
    Timeout,
    /// The code waits for a decision (human in the loop).
    Suspended,
}

/// One display image, inline: what an MCP `image` content block carries.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DisplayImage {
    /// Its display's index in [`Envelope::displays`].
    pub display: usize,
    /// `image/png` or `image/jpeg`.
    pub mime: String,
    /// The bytes, base64.
    pub data: String,
}

/// The compact JSON result of one run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Envelope {
    /// How the run ended.
    pub status: Status,
    /// Value of the last expression statement: JSON when representable, else its `repr`; `null` if none.
    pub return_value: Value,
    /// Python type name of that value, `null` when there is none.
    pub return_type: Option<String>,
    /// Captured stdout, head and tail kept within the output limit.
    pub stdout: String,
    /// Captured stderr, likewise.
    pub stderr: String,
    /// `null`, or per truncated stream its total and omitted character counts.
    pub truncated: Option<Truncated>,
    /// `null`, or what went wrong.
    pub error: Option<ErrorInfo>,
    /// Artifacts kept from the run (`{id, name, kind, bytes, preview}`), when runs are kept.
    pub artifacts: Vec<Artifact>,
    /// Identity of the run.
    pub run_id: String,
    /// True when this envelope was served from the memo cache.
    pub cached: bool,
    /// Wall time of the run.
    pub duration_ms: u64,
    /// `null`, or what a suspended run waits for.
    pub suspension: Option<Value>,
    /// `null`, or a bounded structured summary of the return value (shape, columns, first items) when
    /// its JSON is over the inline limit; `return_value` is then `null` and the full value is kept as
    /// the `return_value` artifact.
    #[serde(default)]
    pub return_preview: Option<Value>,
    /// Which isolation layers were in force; `None` when no process was started. Always here in the
    /// library's value and in the run's manifest; in the JSON envelope only when a requested layer is
    /// missing (then whole, `missing` saying why): a model pays for every byte of every envelope, and
    /// the report of a run that got every layer it asked for tells it nothing (`runpython doctor`
    /// shows what runs get).
    #[serde(default, skip_serializing_if = "isolation_is_unremarkable")]
    pub isolation: Option<Isolation>,
    /// The session this cell ran in (absent for a run of its own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    /// The cell's number in its session, from 1 (absent for a run of its own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cell: Option<u64>,
    /// True when the session was rebuilt (its recorded cells replayed from the store) before this cell
    /// ran: its interpreter had died, been evicted, or lived on another host.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub restored: bool,
    /// With `restored`: how the session came back (from a snapshot of its namespace, or by replaying
    /// every cell), what was replayed and why, and what it cost. Absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restore: Option<RestoreReport>,
    /// The value as Python shows it, when the request asked for it (a REPL).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub return_repr: Option<String>,
    /// For a [`crate::RunRequest::typed`] request, the value exactly, as runpython's tagged JSON
    /// ([`crate::VALUES_PY`]), when that differs from `return_value` (a tuple, a set, a datetime,
    /// bytes, a dataclass...); absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub return_typed: Option<Value>,
    /// `false` when the store failed to keep the run after the code ran (its record, checkpoint or
    /// memo entry): the envelope is still the code's outcome, `store_error` says what failed, and
    /// nothing of the run may be in the store. Absent (true) otherwise, runs not kept at all included.
    #[serde(default = "kept_default", skip_serializing_if = "is_kept")]
    pub kept: bool,
    /// The store's error when `kept` is false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store_error: Option<String>,
    /// What the code displayed, in order (`display(obj)`, the last expression's rich forms,
    /// matplotlib's figures); absent when nothing was. Each entry is `{"formats": {MIME: ...}}`: text
    /// forms (`text/plain`, `text/markdown`, `text/html`, `text/latex`, `application/json`) inline
    /// and cut to fit; binary ones (`image/png`, `image/jpeg`, `image/svg+xml`,
    /// `application/pdf`) as `{"file", "bytes", "width", "height", "artifact_id"}`, the file in the
    /// run's working directory and, in a kept run, the artifact holding it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub displays: Vec<Value>,
    /// The display images handed back inline (within [`crate::Limits::max_image_bytes`]), for
    /// clients that show images: never part of the JSON envelope.
    #[serde(skip)]
    pub images: Vec<DisplayImage>,
    /// What the run's environment holds (distributions, versions, who asked for each) when it was
    /// installed for this run, or what was refused; absent otherwise (a run of an environment prepared
    /// before, a run that needs only the standard library).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dependencies: Option<Dependencies>,
    /// With a network policy, when the run used the network: the mode, the connections made, bytes
    /// each way, lookups, and the first few refusals (host, port, reason). The whole log is kept
    /// with the run as the artifact `network-log.jsonl`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<runpython_egress::NetworkReport>,
}

/// The envelope's `restore`: how a session was restored before the cell ran.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RestoreReport {
    /// `"snapshot"`: its namespace was loaded from a snapshot, and the cells recorded after it
    /// replayed; `"replay"`: every recorded cell was replayed.
    pub from: String,
    /// With `"snapshot"`: how many of the recorded cells the snapshot holds the effects of.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot_cells: Option<u64>,
    /// Cells replayed (tool calls answered from their journals).
    pub replayed: u64,
    /// Why cells were replayed: why the session had no snapshot of its latest cells, or why its
    /// snapshot could not be used. Absent when none was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub why: Option<String>,
    /// Milliseconds restoring took (the snapshot found and loaded, the cells replayed), before the
    /// cell ran.
    pub ms: f64,
    /// Of `ms`, loading the snapshot in the new interpreter, by its own clock (not its start).
    pub snapshot_ms: Option<f64>,
}

/// The envelope's `dependencies`: what the run's environment holds, or what an install refused.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Dependencies {
    /// The environment's distributions (at most [`Dependencies::MAX_LISTED`], those a requirement
    /// named first).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub installed: Vec<Dependency>,
    /// Distributions not listed for want of room.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub omitted: u64,
    /// What was refused, and why (nothing was installed then).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub refused: Vec<RefusedDependency>,
}

impl Dependencies {
    /// At most this many distributions are listed.
    pub const MAX_LISTED: usize = 32;
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// One distribution of a run's environment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Dependency {
    /// Its name (`PyYAML`).
    pub name: String,
    /// Its version.
    pub version: String,
    /// Who asked for it: `operator` (the builder's `dependency`, `--dep`), `request` (the run's
    /// `dependencies`), `pep723` (the code's `# /// script` block), `import` (the code imports a
    /// module of that name), `mapping` (the code imports `module` and the mapping table names the
    /// distribution), `dependency` (another distribution needs it).
    pub source: String,
    /// The module the code imports, for `import` and `mapping`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub module: Option<String>,
}

/// A distribution an install refused.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RefusedDependency {
    /// Its name.
    pub name: String,
    /// Who asked for it (as in [`Dependency::source`]).
    pub source: String,
    /// Why: `not allowed` (outside the operator's allowlist) or `source build` (no wheel, and only
    /// the operator may let a package's build scripts run).
    pub reason: String,
}

fn kept_default() -> bool {
    true
}

fn is_kept(kept: &bool) -> bool {
    *kept
}

/// True when there is no report, or every requested layer was in force (nothing to tell a model).
fn isolation_is_unremarkable(isolation: &Option<Isolation>) -> bool {
    isolation.as_ref().is_none_or(|i| i.missing.is_empty())
}

/// Per-stream truncation counts.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Truncated {
    /// Present when stdout was truncated.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub stdout: Option<StreamTruncation>,
    /// Present when stderr was truncated.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub stderr: Option<StreamTruncation>,
    /// Present when the artifact list was cut to fit the envelope's budget.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub artifacts: Option<ListTruncation>,
}

impl Truncated {
    /// True when nothing was truncated.
    pub fn is_empty(&self) -> bool {
        self.stdout.is_none() && self.stderr.is_none() && self.artifacts.is_none()
    }
}

/// How much of a list was left out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListTruncation {
    /// Entries in all.
    pub total: usize,
    /// Entries left out of the envelope.
    pub omitted: usize,
}

/// How much of one stream was dropped, and where the whole of it is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamTruncation {
    /// Characters the code wrote.
    pub total_chars: u64,
    /// Characters left out of the envelope.
    pub omitted_chars: u64,
    /// When runs are kept: the artifact holding the whole stream (redacted), up to its first 64 MiB
    /// (read it with `get_run_artifact` / `runpython artifacts get`).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub artifact: Option<String>,
    /// True when the code wrote more than 64 MiB: the artifact holds the first 64 MiB only.
    #[serde(skip_serializing_if = "std::ops::Not::not", default)]
    pub artifact_truncated: bool,
}

/// A typed error: a Python exception raised by the code, or one of runpython's own kinds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorInfo {
    /// The exception class name (`ZeroDivisionError`, `SystemExit`), or `Timeout`, `CodeTooLarge`,
    /// `ReturnValueTooLarge`, `ProcessExited`, `DependencyError`, `ToolCallLimit`, `ReplayDiverged`,
    /// `SandboxError`.
    #[serde(rename = "type")]
    pub kind: String,
    /// What happened, for a person or a model.
    pub message: String,
    /// The user's frames and line numbers only.
    pub traceback: Option<String>,
    /// For `ProcessExited`: the exit status.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub exit_code: Option<i32>,
    /// For `ProcessExited`: the signal that killed the process.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub signal: Option<i32>,
}

impl ErrorInfo {
    /// An error with no traceback.
    pub fn new(kind: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            kind: kind.into(),
            message: message.into(),
            traceback: None,
            exit_code: None,
            signal: None,
        }
    }
}

impl Envelope {
    /// A successful envelope with nothing in it yet, for `run_id`.
    pub fn empty(run_id: String) -> Self {
        Self {
            status: Status::Success,
            return_value: Value::Null,
            return_type: None,
            stdout: String::new(),
            stderr: String::new(),
            truncated: None,
            error: None,
            artifacts: Vec::new(),
            run_id,
            cached: false,
            duration_ms: 0,
            suspension: None,
            return_preview: None,
            isolation: None,
            session_id: None,
            cell: None,
            restored: false,
            restore: None,
            return_repr: None,
            return_typed: None,
            kept: true,
            store_error: None,
            displays: Vec::new(),
            images: Vec::new(),
            dependencies: None,
            network: None,
        }
    }

    /// An envelope for a run that ended before the code produced anything.
    pub fn failed(status: Status, error: ErrorInfo, run_id: String) -> Self {
        Self {
            status,
            error: Some(error),
            ..Self::empty(run_id)
        }
    }

    /// True when the status is `success`.
    pub fn is_success(&self) -> bool {
        self.status == Status::Success
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn field_names_are_the_v1_contract() {
        let e = Envelope::failed(
            Status::Timeout,
            ErrorInfo::new("Timeout", "slow"),
            "r1".into(),
        );
        let v = serde_json::to_value(&e).unwrap();
        let mut keys: Vec<_> = v.as_object().unwrap().keys().cloned().collect();
        keys.sort();
        assert_eq!(
            keys,
            [
                "artifacts",
                "cached",
                "duration_ms",
                "error",
                "return_preview",
                "return_type",
                "return_value",
                "run_id",
                "status",
                "stderr",
                "stdout",
                "suspension",
                "truncated"
            ]
        );
        assert_eq!(v["status"], "timeout");
        assert_eq!(v["error"]["type"], "Timeout");
    }

    fn isolation(missing: Vec<String>) -> Isolation {
        Isolation {
            namespaces: vec!["user".into(), "pid".into()],
            landlock: "abi-7".into(),
            rlimits: RlimitReport::default(),
            seccomp: "deny-list".into(),
            network: "off".into(),
            network_rules: None,
            uid: 1000,
            kill: "pid-namespace".into(),
            filesystem: "allowlist".into(),
            memory: LimitReport::default(),
            disk: LimitReport::default(),
            cpu: Default::default(),
            bridge: None,
            start: "fresh".into(),
            missing,
        }
    }

    #[test]
    fn isolation_is_in_the_json_envelope_only_when_a_requested_layer_is_missing() {
        let mut e = Envelope::empty("r".into());
        e.isolation = Some(isolation(Vec::new()));
        let v = serde_json::to_value(&e).unwrap();
        assert!(v.get("isolation").is_none(), "{v}");
        assert!(e.isolation.is_some(), "the library's value keeps it");

        e.isolation = Some(isolation(vec![
            "landlock: the kernel has no Landlock".into()
        ]));
        let v = serde_json::to_value(&e).unwrap();
        assert_eq!(
            v["isolation"]["missing"][0],
            "landlock: the kernel has no Landlock"
        );
        assert_eq!(v["isolation"]["landlock"], "abi-7");
        let back: Envelope = serde_json::from_value(v).unwrap();
        assert_eq!(back.isolation, e.isolation);
    }

    #[test]
    fn a_run_the_store_failed_to_keep_says_so_and_reads_back() {
        let mut e = Envelope::empty("r1".into());
        e.kept = false;
        e.store_error = Some("put `v1/runs/r1` failed".into());
        let v = serde_json::to_value(&e).unwrap();
        assert_eq!(v["kept"], false);
        assert_eq!(v["store_error"], "put `v1/runs/r1` failed");
        assert_eq!(serde_json::from_value::<Envelope>(v).unwrap(), e);
        let kept: Envelope =
            serde_json::from_value(serde_json::to_value(Envelope::empty("r2".into())).unwrap())
                .unwrap();
        assert!(kept.kept && kept.store_error.is_none());
    }
}
