//! The tool set one run serves: the engine's tools, `run_python` bound to this run when nesting is
//! allowed, and (with a store) the hidden artifact tools behind `read_artifact` and `save_artifact`.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use runpython_bridge::{BoxFuture, Tool, ToolArgs, ToolError, ToolSet};
use runpython_sandbox::BeneathDir;
use runpython_store::Artifact;
use serde_json::Value;
use tokio::sync::mpsc;

use crate::error::Error;
use crate::protocol::request::Event;
use crate::tools::artifact_tools::{ReadArtifact, SaveArtifact};
use crate::RunPython;

/// A run's tools, and where they report back.
pub(crate) struct RunTools {
    pub tools: ToolSet,
    /// The budget of the run's tree of runs, when it nests: its bridge counts its calls against it.
    pub call_budget: Option<Arc<runpython_bridge::CallBudget>>,
    /// What the code kept with `save_artifact`.
    pub saved: Arc<Mutex<Vec<Artifact>>>,
}

/// The tools of one run whose clock started at `started`.
pub(crate) fn run_tools(
    engine: &RunPython,
    started: Instant,
    scratch: &Arc<BeneathDir>,
) -> Result<RunTools, Error> {
    let (mut tools, call_budget) = crate::tools::nested::tools_for_run(
        &engine.inner.tools,
        Arc::new(engine.clone()),
        started,
    )?;
    let saved = Arc::new(Mutex::new(Vec::new()));
    if let Some(keep) = &engine.inner.keep {
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
        call_budget,
        saved,
    })
}

/// `tools` with each visible tool announcing its calls as [`Event::ToolCall`] (hidden plumbing stays
/// quiet). The announcement never waits: a full event channel drops it rather than slow the call.
pub(crate) fn announced(tools: &ToolSet, events: &mpsc::Sender<Event>) -> Result<ToolSet, Error> {
    let mut out = ToolSet::new();
    for tool in tools.iter() {
        if tool.is_hidden() {
            out.insert_arc(Arc::clone(tool))?;
        } else {
            out.insert(Announced {
                tool: Arc::clone(tool),
                events: events.clone(),
            })?;
        }
    }
    Ok(out)
}

struct Announced {
    tool: Arc<dyn Tool>,
    events: mpsc::Sender<Event>,
}

impl Tool for Announced {
    fn name(&self) -> &str {
        self.tool.name()
    }
    fn description(&self) -> &str {
        self.tool.description()
    }
    fn input_schema(&self) -> Option<&Value> {
        self.tool.input_schema()
    }
    fn is_pure(&self) -> bool {
        self.tool.is_pure()
    }
    fn is_hidden(&self) -> bool {
        self.tool.is_hidden()
    }
    fn typed_values(&self) -> bool {
        self.tool.typed_values()
    }
    fn runs_nested(&self) -> bool {
        self.tool.runs_nested()
    }
    fn call(&self, args: ToolArgs) -> BoxFuture<'static, Result<Value, ToolError>> {
        let _ = self.events.try_send(Event::ToolCall {
            name: self.tool.name().to_owned(),
        });
        self.tool.call(args)
    }
    fn resume(
        &self,
        request: Value,
        decision: Value,
    ) -> Option<BoxFuture<'static, Result<Value, ToolError>>> {
        self.tool.resume(request, decision)
    }
}
