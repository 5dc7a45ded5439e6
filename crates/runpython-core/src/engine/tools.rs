//! The tool set one run serves: the engine's tools, `run_python` bound to this run when nesting is
//! allowed, and (with a store) the hidden artifact tools behind `read_artifact` and `save_artifact`.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use runpython_bridge::ToolSet;
use runpython_store::{Artifact, BeneathDir};

use super::RunPython;
use crate::artifact_tools::{ReadArtifact, SaveArtifact};
use crate::error::Error;
use crate::nested::RunStats;

/// A run's tools, and where they report back.
pub(super) struct RunTools {
    pub tools: ToolSet,
    /// The outer budget a nested `run_python` reads, set once the bridge is bound.
    pub nested_stats: Option<RunStats>,
    /// What the code kept with `save_artifact`.
    pub saved: Arc<Mutex<Vec<Artifact>>>,
}

impl RunPython {
    /// The tools of one run whose clock started at `started`.
    pub(super) fn run_tools(
        &self,
        started: Instant,
        scratch: &Arc<BeneathDir>,
    ) -> Result<RunTools, Error> {
        let (mut tools, nested_stats) =
            crate::nested::tools_for_run(&self.inner.tools, Arc::new(self.clone()), started)?;
        let saved = Arc::new(Mutex::new(Vec::new()));
        if let Some(keep) = &self.inner.keep {
            tools.insert(ReadArtifact {
                store: keep.store.clone(),
            })?;
            tools.insert(SaveArtifact {
                store: keep.store.clone(),
                scratch: Arc::clone(scratch),
                saved: Arc::clone(&saved),
            })?;
        }
        Ok(RunTools {
            tools,
            nested_stats,
            saved,
        })
    }
}
