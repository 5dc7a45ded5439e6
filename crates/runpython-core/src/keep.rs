//! Keeping runs in the store and serving memoized envelopes: what to keep, when to reuse.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use runpython_bridge::canonical_json;
use runpython_deps::{Interpreter, PreparedEnv};
use runpython_store::{
    memo_key, CollectLimits, CollectedFiles, Computed, Redactor, RunRecord, Store, Tier,
};
use serde_json::Value;
use tokio::sync::{mpsc, oneshot};

use crate::envelope::Envelope;
use crate::run::{elapsed_ms, Event, RunPython, RunRequest};
use crate::Error;

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

/// Walks the run's working directory off the async workers.
pub(crate) async fn collect_run_files(
    dir: PathBuf,
    limits: CollectLimits,
) -> Result<CollectedFiles, Error> {
    tokio::task::spawn_blocking(move || runpython_store::collect_files(&dir, &limits))
        .await
        .map_err(|e| Error::Internal(format!("collecting the run's files panicked: {e}")))?
        .map_err(Error::from)
}

/// Masks the host's secret-looking variables and every passed-through variable.
fn redactor(passthrough: &[String]) -> Redactor {
    let mut redactor = Redactor::from_env(std::env::vars());
    for name in passthrough {
        if let Ok(value) = std::env::var(name) {
            redactor.add(name, value);
        }
    }
    redactor
}

fn redact_envelope(mut envelope: Envelope, redactor: &Redactor) -> Envelope {
    if redactor.is_empty() {
        return envelope;
    }
    envelope.stdout = redactor.redact(&envelope.stdout).into_owned();
    envelope.stderr = redactor.redact(&envelope.stderr).into_owned();
    envelope.return_value = redactor.redact_json(&envelope.return_value);
    if let Some(error) = &mut envelope.error {
        error.message = redactor.redact(&error.message).into_owned();
        if let Some(tb) = &error.traceback {
            error.traceback = Some(redactor.redact(tb).into_owned());
        }
    }
    envelope
}

impl RunPython {
    /// The bytes of each input artifact, base64 for the runner's request.
    pub(crate) async fn fetch_input_artifacts(
        &self,
        request: &RunRequest,
    ) -> Result<serde_json::Map<String, Value>, Error> {
        use base64::Engine;
        let mut out = serde_json::Map::new();
        if request.input_artifacts.is_empty() {
            return Ok(out);
        }
        let store = self.store().ok_or_else(|| {
            Error::InvalidInput("artifact inputs need an engine with a store (store())".into())
        })?;
        for (name, id) in &request.input_artifacts {
            let bytes = store.get_run_artifact(id).await.map_err(|e| match e {
                runpython_store::Error::NotFound { .. } => Error::InvalidInput(format!(
                    "input {name}: no artifact {id:?} in the store {}; list them with `runpython artifacts list`",
                    store.url()
                )),
                other => Error::Store(other),
            })?;
            out.insert(
                name.clone(),
                Value::String(base64::engine::general_purpose::STANDARD.encode(&bytes)),
            );
        }
        Ok(out)
    }

    /// The artifact `id` of a kept run (its bytes), from this engine's store.
    pub async fn get_run_artifact(&self, id: &str) -> Result<Vec<u8>, Error> {
        let store = self.store().ok_or_else(|| {
            Error::Config(
                "this RunPython keeps no runs: configure a store to read artifacts".into(),
            )
        })?;
        Ok(store.get_run_artifact(id).await?.to_vec())
    }

    pub(crate) async fn execute_memoized(
        &self,
        keep: &Keeping,
        request: RunRequest,
        events: Option<mpsc::Sender<Event>>,
        cancel: Option<oneshot::Receiver<()>>,
        started: Instant,
    ) -> Result<Envelope, Error> {
        let interpreter = self.interpreter().await?;
        let limits = self.limits();
        let passthrough: Vec<String> = self
            .env_passthrough()
            .iter()
            .map(|name| format!("{name}={}", std::env::var(name).unwrap_or_default()))
            .collect();
        let key = memo_key([
            request.code.clone(),
            // What the dependencies are resolved from: a pure function of these and the code.
            self.deps().memo_part(&request),
            canonical_json(&Value::Object(request.inputs.clone())),
            format!(
                "{}|{:?}",
                interpreter.executable.display(),
                interpreter.version
            ),
            format!("runner-{}", crate::process::code_version()),
            self.tools().fingerprint(),
            format!(
                "{:?}|{}|{}|{}",
                limits.timeout,
                limits.max_code_chars,
                limits.max_return_bytes,
                limits.max_output_chars
            ),
            passthrough.join("\u{0}"),
            // Artifacts are content-addressed: their ids stand for their bytes.
            format!("{:?}", request.input_artifacts),
        ]);
        let memo = keep
            .store
            .memoized(&key, keep.memo_ttl, || async {
                let (envelope, memoizable) = self
                    .execute_fresh(&request, events, cancel, started)
                    .await?;
                // The memo entry is persisted: it carries no secret the code printed or returned.
                let envelope = redact_envelope(envelope, &redactor(self.env_passthrough()));
                let json =
                    serde_json::to_string(&envelope).map_err(|e| Error::Internal(e.to_string()))?;
                Ok::<_, Error>(if memoizable {
                    Computed::keep(json)
                } else {
                    Computed::once(json)
                })
            })
            .await
            .map_err(|shared| {
                Arc::try_unwrap(shared).unwrap_or_else(|e| Error::Internal(e.to_string()))
            })?;
        let mut envelope: Envelope = serde_json::from_str(&memo.json)
            .map_err(|e| Error::Internal(format!("a memo entry is not an envelope: {e}")))?;
        if memo.cached {
            envelope.cached = true;
            envelope.duration_ms = elapsed_ms(started);
        }
        Ok(envelope)
    }

    /// Redacts and stores the run; the envelope's `artifacts` then lists what was kept.
    pub(crate) async fn keep_run(
        &self,
        keep: &Keeping,
        request: &RunRequest,
        envelope: &mut Envelope,
        files: CollectedFiles,
        interpreter: &Interpreter,
        env: Option<&PreparedEnv>,
    ) -> Result<(), Error> {
        let redactor = redactor(self.env_passthrough());
        let record = RunRecord {
            run_id: envelope.run_id.clone(),
            created_at: std::time::SystemTime::now() - Duration::from_millis(envelope.duration_ms),
            tier: keep.tier,
            script: request.code.clone(),
            stdout: redactor.redact(&envelope.stdout).into_owned(),
            stderr: redactor.redact(&envelope.stderr).into_owned(),
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
            isolation_json: "{}".into(),
            files: files.files,
            skipped_files: files.skipped,
        };
        let manifest = keep.store.put_run(record).await?;
        envelope.artifacts = manifest.artifacts;
        Ok(())
    }
}
