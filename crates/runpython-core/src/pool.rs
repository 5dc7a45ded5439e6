//! A pool of interpreters started ahead of their run: the start-up (fork, namespaces, Python's own
//! initialisation, the runner's import, declared warm imports) happens off the run's critical path.
//!
//! Each pooled interpreter is exactly what the cold path would start — same sandbox plan, same
//! private run directory, same environment — waiting on its stdin for the request, and it serves exactly
//! one run: nothing a previous run did can be seen by the next one. This is why runpython pre-starts
//! single-use interpreters instead of forking runs from a long-lived zygote: isolation is identical to the
//! cold path by construction, and there is no fork-safety question (threads started by imported
//! libraries) to get wrong. The price is that a burst larger than the pool pays the cold cost.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::process::Spawned;
use crate::sandbox::Isolation;

/// Settings of the interpreter pool.
#[derive(Debug, Clone)]
pub struct PoolConfig {
    /// Interpreters kept ready per environment (0 turns the pool off).
    pub size: usize,
    /// An interpreter unused this long is discarded (and replaced by the next run's refill).
    pub idle: Duration,
    /// Modules imported by pooled interpreters before their run (when the environment has them):
    /// e.g. `["numpy", "pandas"]`, so a run importing them finds them loaded.
    pub warm_imports: Vec<String>,
    /// When the pool is empty, wait (up to 10 s) for a pooled interpreter instead of starting one
    /// cold: every run then goes through the pool (`RUNPYTHON_POOL_PRESTART=1`; CI runs the hostile
    /// suite this way to prove pooled runs are isolated like cold ones).
    pub prestart: bool,
}

impl Default for PoolConfig {
    /// One interpreter per environment, unless `RUNPYTHON_POOL_SIZE` says otherwise (`0` turns the
    /// pool off: CI runs the suites both ways).
    fn default() -> Self {
        let size = std::env::var("RUNPYTHON_POOL_SIZE")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(1);
        Self {
            size,
            idle: Duration::from_secs(120),
            warm_imports: Vec::new(),
            prestart: std::env::var("RUNPYTHON_POOL_PRESTART").is_ok_and(|v| v == "1"),
        }
    }
}

/// An interpreter started for a run that has not come yet.
#[derive(Debug)]
pub(crate) struct Slot {
    pub run_dir: tempfile::TempDir,
    pub work_dir: PathBuf,
    pub spawned: Spawned,
    pub isolation: Isolation,
    pub born: Instant,
}

/// What a pooled interpreter was prepared for: the interpreter and the environment's site directory.
pub(crate) type PoolKey = (PathBuf, Option<PathBuf>);

#[derive(Debug)]
pub(crate) struct Pool {
    pub config: PoolConfig,
    ready: Mutex<HashMap<PoolKey, Vec<Slot>>>,
    /// Refills in flight per key, so a burst does not start more than the pool's size.
    starting: Mutex<HashMap<PoolKey, usize>>,
}

impl Pool {
    pub fn new(config: PoolConfig) -> Self {
        Self {
            config,
            ready: Mutex::default(),
            starting: Mutex::default(),
        }
    }

    /// A live, fresh interpreter for `key`, if one is ready. Dead or stale ones are dropped (which
    /// kills their process group).
    pub fn take(&self, key: &PoolKey) -> Option<Slot> {
        let mut ready = self.ready.lock().ok()?;
        let slots = ready.get_mut(key)?;
        while let Some(mut slot) = slots.pop() {
            let alive = matches!(slot.spawned.child.try_wait(), Ok(None));
            if alive && slot.born.elapsed() < self.config.idle {
                return Some(slot);
            }
        }
        None
    }

    /// How many more interpreters `key` needs, counting those being started; reserves them.
    pub fn reserve(&self, key: &PoolKey) -> usize {
        let ready = self
            .ready
            .lock()
            .map(|r| r.get(key).map_or(0, Vec::len))
            .unwrap_or(usize::MAX);
        let Ok(mut starting) = self.starting.lock() else {
            return 0;
        };
        let pending = starting.entry(key.clone()).or_insert(0);
        let missing = self.config.size.saturating_sub(ready + *pending);
        *pending += missing;
        missing
    }

    /// A started interpreter joins the pool (or is dropped if the pool is full).
    pub fn put(&self, key: PoolKey, slot: Option<Slot>) {
        if let Ok(mut starting) = self.starting.lock() {
            if let Some(pending) = starting.get_mut(&key) {
                *pending = pending.saturating_sub(1);
            }
        }
        let Some(slot) = slot else { return };
        if let Ok(mut ready) = self.ready.lock() {
            let slots = ready.entry(key).or_default();
            if slots.len() < self.config.size {
                slots.push(slot);
            }
        }
    }
}
