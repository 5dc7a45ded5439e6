//! The host side of `read_artifact`, `load_artifact` and `save_artifact` in the code: hidden tools that
//! reach the run's store through the bridge, so data moves by reference instead of through the envelope.

use std::sync::{Arc, Mutex};

use base64::Engine;
use runpython_bridge::{BoxFuture, Tool, ToolArgs, ToolError};
use runpython_sandbox::BeneathDir;
use runpython_store::{Artifact, Store};
use serde_json::{json, Value};

/// Name of the hidden tool behind `read_artifact(id, offset=0, length=None)`.
pub(crate) const READ: &str = "runpython_read_artifact";
/// Name of the hidden tool behind `save_artifact(name, data)`.
pub(crate) const SAVE: &str = "runpython_save_artifact";

/// Largest slice one `read_artifact` call returns (the bridge frame must hold it as base64).
const MAX_READ: u64 = 8 << 20;

fn arg<'a>(args: &'a ToolArgs, name: &str) -> Option<&'a Value> {
    args.get(name).filter(|v| !v.is_null())
}

#[derive(Debug)]
pub(crate) struct ReadArtifact {
    pub store: Store,
}

impl Tool for ReadArtifact {
    fn name(&self) -> &str {
        READ
    }
    fn is_hidden(&self) -> bool {
        true
    }
    fn is_pure(&self) -> bool {
        true // artifacts are content-addressed: an id always names the same bytes
    }
    fn call(&self, args: ToolArgs) -> BoxFuture<'static, Result<Value, ToolError>> {
        let store = self.store.clone();
        Box::pin(async move {
            let id = arg(&args, "id")
                .and_then(Value::as_str)
                .ok_or_else(|| {
                    ToolError::new("TypeError", "read_artifact needs an artifact id (a string)")
                })?
                .to_owned();
            let offset = arg(&args, "offset").and_then(Value::as_u64).unwrap_or(0);
            let length = arg(&args, "length").and_then(Value::as_u64);
            // A ranged read: the host holds the slice, never the whole artifact.
            let (slice, _total) = store
                .get_run_artifact_range(&id, offset, length, MAX_READ)
                .await
                .map_err(|e| match e {
                    runpython_store::Error::NotFound { .. } => {
                        crate::policy::tenancy::audit_miss(
                            &store,
                            runpython_store::Held::Artifact,
                            &id,
                            "read_artifact",
                        );
                        ToolError::new("KeyError", format!("no artifact {id:?} in the store"))
                    }
                    runpython_store::Error::TooLarge { bytes, .. } => ToolError::value_error(format!(
                        "artifact {id} slice is {bytes} bytes, over the {MAX_READ}-byte limit of one read; pass offset and length"
                    )),
                    other => ToolError::new("OSError", other.to_string()),
                })?;
            Ok(json!(
                base64::engine::general_purpose::STANDARD.encode(&slice)
            ))
        })
    }
}

/// `save_artifact(name, data)`: the runner writes the data into the run's `saved/` directory and calls
/// this with the name; the host streams the file from beneath the scratch it holds into the store (never
/// holding it in memory, never following a link the code put there), removes it, and returns its id.
#[derive(Debug)]
pub(crate) struct SaveArtifact {
    pub store: Store,
    /// The run's scratch, held since before the code started.
    pub scratch: Arc<BeneathDir>,
    /// What this run saved, to list with its other artifacts.
    pub saved: Arc<Mutex<Vec<Artifact>>>,
}

impl Tool for SaveArtifact {
    fn name(&self) -> &str {
        SAVE
    }
    fn is_hidden(&self) -> bool {
        true
    }
    fn call(&self, args: ToolArgs) -> BoxFuture<'static, Result<Value, ToolError>> {
        let store = self.store.clone();
        let scratch = Arc::clone(&self.scratch);
        let saved = Arc::clone(&self.saved);
        Box::pin(async move {
            let name = arg(&args, "name")
                .and_then(Value::as_str)
                .ok_or_else(|| {
                    ToolError::new("TypeError", "save_artifact needs a name (a string)")
                })?
                .to_owned();
            if name.is_empty()
                || name.len() > 200
                || name.contains(['/', '\\', '\0'])
                || name == "."
                || name == ".."
            {
                return Err(ToolError::value_error(format!(
                    "artifact name {name:?} must be 1-200 characters without slashes"
                )));
            }
            let opened = {
                let (scratch, name) = (Arc::clone(&scratch), name.clone());
                tokio::task::spawn_blocking(move || scratch.dir("saved")?.file(&name))
                    .await
                    .map_err(|e| ToolError::new("OSError", e.to_string()))?
            };
            let file = opened.map_err(|e| {
                ToolError::new(
                    "OSError",
                    format!("save_artifact: the data written for {name:?} cannot be read: {e}"),
                )
            })?;
            let artifact = store
                .put_artifact_stream(&name, tokio::fs::File::from_std(file))
                .await
                .map_err(|e| ToolError::new("OSError", e.to_string()))?;
            // Its space in the scratch is the run's again.
            let _ = tokio::task::spawn_blocking({
                let name = name.clone();
                move || scratch.dir("saved").and_then(|d| d.remove_file(&name))
            })
            .await;
            let id = artifact.id.clone();
            if let Ok(mut saved) = saved.lock() {
                saved.retain(|a| a.name != name);
                saved.push(artifact);
            }
            Ok(json!(id))
        })
    }
}
