//! Keeping runs in the store and the memo: what to keep, how it is redacted, what a memo key holds.
//! Functions over the store and the run's data; the engine decides when to call them.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use runpython_bridge::canonical_json;
use runpython_deps::{Interpreter, PreparedEnv};
use runpython_sandbox::fd::{BeneathDir, CollectLimits, CollectedFiles};
use runpython_store::{memo_key, ArtifactKind, MemoKey, Redactor, RunRecord, Store, Tier};
use serde_json::Value;

use crate::error::Error;
use crate::protocol::envelope::Envelope;
use crate::protocol::request::{Limits, RunRequest};

/// Where and how runs are kept.
#[derive(Debug, Clone)]
pub(crate) struct Keeping {
    pub store: Store,
    pub tier: Tier,
    pub collect: CollectLimits,
    pub memo_ttl: Option<Duration>,
}

impl Keeping {
    pub fn new(store: Store) -> Self {
        Self {
            store,
            tier: Tier::ephemeral(),
            collect: CollectLimits::default(),
            memo_ttl: None,
        }
    }
}

/// Reads the files the run left in its working directory, beneath the scratch the host has held since
/// before the code started, off the async workers. Whatever the code did to the directory (replaced it
/// with a link, a file, a FIFO), the result is a list of kept and skipped files, never an error.
pub(crate) async fn collect_run_files(
    scratch: Arc<BeneathDir>,
    limits: CollectLimits,
) -> Result<CollectedFiles, Error> {
    tokio::task::spawn_blocking(move || match scratch.dir("work") {
        Ok(work) => runpython_sandbox::fd::collect_files_in(&work, &limits),
        Err(e) => {
            let reason = format!("the working directory is no longer a directory ({e})");
            CollectedFiles {
                files: Vec::new(),
                skipped: vec![runpython_sandbox::fd::SkippedEntry {
                    name: "work".into(),
                    reason: reason.clone(),
                }],
                skipped_counts: [(reason, 1)].into(),
            }
        }
    })
    .await
    .map_err(|e| Error::Internal(format!("collecting the run's files panicked: {e}")))
}

/// Masks the host's secret-looking variables, every passed-through variable, every variable set
/// for the run, and the values of the engine's secrets (which the code never holds, but a server
/// that echoes a request could hand back).
pub(crate) fn redactor(
    passthrough: &[String],
    run_env: &BTreeMap<String, String>,
    sandbox: &runpython_egress::Sandbox,
) -> Redactor {
    let mut redactor = Redactor::from_env(std::env::vars());
    if let runpython_egress::Network::Policy(policy) = &sandbox.network {
        for secret in &policy.secrets {
            redactor.add(&secret.name, &secret.value);
        }
    }
    for name in passthrough {
        if let Ok(value) = std::env::var(name) {
            redactor.add(name, value);
        }
    }
    for (name, value) in run_env {
        redactor.add(name, value);
    }
    redactor
}

pub(crate) fn redact_envelope(mut envelope: Envelope, redactor: &Redactor) -> Envelope {
    if redactor.is_empty() {
        return envelope;
    }
    envelope.stdout = redactor.redact(&envelope.stdout).into_owned();
    envelope.stderr = redactor.redact(&envelope.stderr).into_owned();
    envelope.return_value = redactor.redact_json(&envelope.return_value);
    if let Some(typed) = &envelope.return_typed {
        envelope.return_typed = Some(redactor.redact_json(typed));
    }
    if let Some(error) = &mut envelope.error {
        error.message = redactor.redact(&error.message).into_owned();
        if let Some(tb) = &error.traceback {
            error.traceback = Some(redactor.redact(tb).into_owned());
        }
    }
    envelope
}

/// Input artifacts up to this size come with the runner's request; larger ones are read by the code
/// through the bridge in slices, so the host never holds a whole large artifact.
const INLINE_INPUT_ARTIFACT: u64 = 1 << 20;

/// Bytes as the runner's request carries them.
fn base64_value(bytes: &[u8]) -> Value {
    use base64::Engine;
    Value::String(base64::engine::general_purpose::STANDARD.encode(bytes))
}

/// A stored artifact for the runner's request: its bytes as base64 when small, else its id and size
/// (the runner reads it in slices). `what` names it in the error of a missing id (another tenant's
/// included), which is audited as an `access`.
async fn artifact_for_runner(
    store: &Store,
    id: &str,
    what: &str,
    access: &'static str,
) -> Result<Value, Error> {
    let missing = |e| match e {
        runpython_store::Error::NotFound { .. } => {
            crate::policy::tenancy::audit_miss(store, runpython_store::Held::Artifact, id, access);
            Error::InvalidInput(format!(
                "{what}: no artifact {id:?} in the store {}; list them with `runpython artifacts list`",
                store.url()
            ))
        }
        other => Error::Store(other),
    };
    let size = store.artifact_size(id).await.map_err(missing)?;
    if size > INLINE_INPUT_ARTIFACT {
        return Ok(serde_json::json!({"id": id, "bytes": size}));
    }
    let (bytes, _) = store
        .get_run_artifact_range(id, 0, None, INLINE_INPUT_ARTIFACT)
        .await
        .map_err(missing)?;
    Ok(base64_value(&bytes))
}

/// Each input artifact for the runner's request (see [`artifact_for_runner`]).
pub(crate) async fn fetch_input_artifacts(
    store: Option<&Store>,
    request: &RunRequest,
) -> Result<serde_json::Map<String, Value>, Error> {
    let mut out = serde_json::Map::new();
    if request.input_artifacts.is_empty() {
        return Ok(out);
    }
    let store = store.ok_or_else(|| {
        Error::InvalidInput("artifact inputs need an engine with a store (store())".into())
    })?;
    for (name, id) in &request.input_artifacts {
        let value =
            artifact_for_runner(store, id, &format!("input {name}"), "input artifact").await?;
        out.insert(name.clone(), value);
    }
    Ok(out)
}

/// The run's files for the runner's request: bytes as base64, a stored artifact as
/// [`artifact_for_runner`] gives it. Another tenant's id reads as missing.
pub(crate) async fn fetch_files(
    store: Option<&Store>,
    request: &RunRequest,
) -> Result<serde_json::Map<String, Value>, Error> {
    let mut out = serde_json::Map::new();
    for (name, source) in &request.files {
        let value = match source {
            crate::FileSource::Bytes(bytes) | crate::FileSource::Upload(bytes) => {
                base64_value(bytes)
            }
            crate::FileSource::Artifact(id) => {
                let store = store.ok_or_else(|| {
                    Error::InvalidInput(format!(
                        "file {name} is a stored artifact, and this engine has no store (store())"
                    ))
                })?;
                artifact_for_runner(store, id, &format!("file {name}"), "file").await?
            }
        };
        out.insert(name.clone(), value);
    }
    Ok(out)
}

/// What a memo key holds: everything that decides a run's envelope.
pub(crate) struct MemoParts<'a> {
    pub request: &'a RunRequest,
    /// What the dependencies are resolved from (defaults, explicit specs, auto-detection).
    pub deps: String,
    pub interpreter: &'a Interpreter,
    pub tools_fingerprint: String,
    pub limits: &'a Limits,
    pub passthrough: &'a [String],
    /// The digest of runpython's Python (runner and bridge client).
    pub code_version: &'a str,
}

/// The memo key of a run.
pub(crate) fn memo_key_of(parts: &MemoParts<'_>) -> MemoKey {
    let request = parts.request;
    let passthrough: Vec<String> = parts
        .passthrough
        .iter()
        .map(|name| format!("{name}={}", std::env::var(name).unwrap_or_default()))
        .collect();
    let limits = parts.limits;
    memo_key([
        request.code.clone(),
        // What the dependencies are resolved from: a pure function of these and the code.
        parts.deps.clone(),
        canonical_json(&Value::Object(request.inputs.clone())),
        // Tagged inputs, and an envelope with `return_typed` (or `return_repr`): not the same run as a
        // plain one.
        format!("typed={}|repr={}", request.typed, request.repr),
        format!(
            "{}|{:?}",
            parts.interpreter.executable.display(),
            parts.interpreter.version
        ),
        format!("runner-{}", parts.code_version),
        // A run narrowed to some hosts is not the same run as one with the engine's whole network.
        format!("{:?}", request.allow_hosts),
        parts.tools_fingerprint.clone(),
        format!(
            "{:?}|{}|{}|{}",
            request
                .timeout
                .map_or(limits.timeout, |t| t.min(limits.timeout)),
            limits.max_code_chars,
            limits.max_return_bytes,
            limits.max_output_chars
        ),
        passthrough.join("\u{0}"),
        // Per-run variables, like passed-through ones: the key is a hash, the values never stored.
        request
            .env
            .iter()
            .map(|(name, value)| format!("{name}={value}"))
            .collect::<Vec<_>>()
            .join("\u{0}"),
        // Artifacts are content-addressed: their ids stand for their bytes.
        format!("{:?}", request.input_artifacts),
        request
            .files
            .iter()
            .map(|(name, source)| match source {
                crate::FileSource::Artifact(id) => format!("{name}=@{id}"),
                crate::FileSource::Bytes(b) | crate::FileSource::Upload(b) => {
                    format!("{name}={}", blake3::hash(b).to_hex())
                }
            })
            .collect::<Vec<_>>()
            .join("\u{0}"),
    ])
}

/// Each display's files get the id of the artifact that holds them.
fn link_displays(envelope: &mut Envelope) {
    let ids: std::collections::HashMap<&str, &str> = envelope
        .artifacts
        .iter()
        .map(|a| (a.name.as_str(), a.id.as_str()))
        .collect();
    let mut linked = std::mem::take(&mut envelope.displays);
    for display in &mut linked {
        let Some(formats) = display.get_mut("formats").and_then(Value::as_object_mut) else {
            continue;
        };
        for format in formats.values_mut() {
            let Some(file) = format.get("file").and_then(Value::as_str) else {
                continue;
            };
            if let Some(id) = ids.get(file) {
                format["artifact_id"] = Value::String((*id).to_owned());
            }
        }
    }
    envelope.displays = linked;
}

/// Redacts and stores the run; the envelope's `artifacts` then lists what was kept.
pub(crate) async fn keep_run(
    keep: &Keeping,
    request: &RunRequest,
    envelope: &mut Envelope,
    (files, stored): (CollectedFiles, Vec<runpython_store::Artifact>),
    interpreter: &Interpreter,
    env: Option<&PreparedEnv>,
    (passthrough, sandbox): (&[String], &runpython_egress::Sandbox),
) -> Result<(), Error> {
    let redactor = redactor(passthrough, &request.env, sandbox);
    let streamed = |kind| {
        stored
            .iter()
            .any(|a: &runpython_store::Artifact| a.kind == kind)
    };
    let record = RunRecord {
        run_id: envelope.run_id.clone(),
        created_at: std::time::SystemTime::now() - Duration::from_millis(envelope.duration_ms),
        tier: keep.tier,
        script: request.code.clone(),
        // Streamed whole into the store as the run ran (then among `stored`), else the envelope's.
        stdout: match streamed(ArtifactKind::Stdout) {
            true => String::new(),
            false => redactor.redact(&envelope.stdout).into_owned(),
        },
        stderr: match streamed(ArtifactKind::Stderr) {
            true => String::new(),
            false => redactor.redact(&envelope.stderr).into_owned(),
        },
        return_value_json: redactor.redact_json(&envelope.return_value).to_string(),
        deps: env.map(|env| env.specs.clone()).unwrap_or_default(),
        env_fingerprint: match env {
            Some(env) => env.fingerprint.clone(),
            None => format!(
                "cpython-{}.{}.{}:{}",
                interpreter.version.0,
                interpreter.version.1,
                interpreter.version.2,
                interpreter.executable.display()
            ),
        },
        // The whole report (the JSON envelope shows it only when a layer is missing).
        isolation_json: match &envelope.isolation {
            Some(isolation) => {
                serde_json::to_string(isolation).map_err(|e| Error::Internal(e.to_string()))?
            }
            None => "null".into(),
        },
        files: files
            .files
            .into_iter()
            .map(|f| runpython_store::RunFile {
                name: f.name,
                bytes: f.bytes,
            })
            .collect(),
        skipped_files: files
            .skipped
            .into_iter()
            .map(|s| runpython_store::SkippedFile {
                name: s.name,
                reason: s.reason,
            })
            .collect(),
        skipped_counts: files.skipped_counts,
        stored,
    };
    let manifest = keep.store.put_run(record).await?;
    envelope.artifacts = manifest.artifacts;
    link_displays(envelope);
    Ok(())
}
