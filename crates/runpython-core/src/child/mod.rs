//! The child: starting a sandboxed interpreter for a run (a private run directory, the sandbox plan, a
//! scrubbed environment, the runner waiting for its request on stdin), capturing its output, and the
//! pool of interpreters started ahead of their runs.

mod code_dir;
mod env;
mod output;
mod pool;
mod run_dir;
mod spawn;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

pub(crate) use code_dir::{bytecode_ready, code_dir, code_version, ensure_bytecode};
pub(crate) use output::{capture, take_capture, Captured, Closed, HeadTail};
pub use pool::PoolConfig;
pub(crate) use pool::{Pool, PoolKey};
pub(crate) use run_dir::discard_run_dir;
pub(crate) use spawn::Spawned;

use crate::envelope::Isolation;
use crate::error::Error;
use crate::sandbox::Sandbox;

/// An interpreter started for a run (cold, or ahead of time by the pool).
#[derive(Debug)]
pub(crate) struct Slot {
    pub run_dir: tempfile::TempDir,
    pub work_dir: PathBuf,
    pub spawned: Spawned,
    pub isolation: Isolation,
    pub born: Instant,
}

/// The engine's settings an interpreter is started with.
#[derive(Debug, Clone)]
pub(crate) struct SlotSpec {
    pub sandbox: Sandbox,
    /// The engine's run timeout (the CPU limit is one second more).
    pub timeout: Duration,
    pub env_passthrough: Vec<String>,
}

impl SlotSpec {
    /// Starts an interpreter for a run: a private run directory, the sandbox plan, the child waiting
    /// for its request on stdin. `warm_up` are the runner's pre-request arguments (pooled interpreters).
    pub(crate) fn spawn(
        &self,
        python: &Path,
        code_dir: &Path,
        site_dir: Option<&Path>,
        warm_up: &[String],
    ) -> Result<Slot, Error> {
        let (run_dir, work_dir) = run_dir::create()?;
        // The prepared environment is read by the code: the sandbox must let it through.
        let env_reads: Vec<&Path> = site_dir.into_iter().collect();
        let plan = crate::sandbox::prepare(
            &self.sandbox,
            python,
            code_dir,
            &env_reads,
            run_dir.path(),
            self.timeout,
        )?;
        let isolation = plan.report.clone();
        let env = env::child_env(&self.env_passthrough);
        let spawned = spawn::spawn_runner(python, code_dir, warm_up, &work_dir, &env, plan)?;
        Ok(Slot {
            run_dir,
            work_dir,
            spawned,
            isolation,
            born: Instant::now(),
        })
    }
}
