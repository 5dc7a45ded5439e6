//! A pool of interpreters started ahead of their run: the start-up (fork, namespaces, Python's own
//! initialisation, the runner's import, declared warm imports) happens off the run's critical path.
//!
//! Each pooled interpreter is exactly what the cold path would start — same sandbox plan, same
//! private run directory, same environment — waiting on its stdin for the request, and it serves exactly
//! one run: nothing a previous run did can be seen by the next one. Isolation is identical to the cold
//! path by construction, and there is no fork-safety question (threads started by imported libraries)
//! to get wrong. The price is that every run pays an interpreter's start and its warm imports in CPU,
//! and a burst larger than the pool pays them on its critical path. With
//! [`PoolConfig::templates`], runs are forked from a warm template instead (`template/`), which
//! answers the fork-safety question explicitly (the template stops library threads and refuses to
//! serve when some remain) and gives each fork every layer of its own.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;

use super::{Slot, SlotSpec};
use crate::policy::env_vars;

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
    /// Fork one-shot runs from a warm template per environment (an interpreter that imported the
    /// runner, the environment and `warm_imports` once) instead of giving each run an interpreter of
    /// its own: a run then costs a fork and its own sandbox's setup. Each run still gets every layer
    /// for itself (PID, mount, network and user namespaces, scratch, uid, cgroup, limits, Landlock,
    /// seccomp); `isolation.start` says `"template"`. Where the kernel or the configuration rules
    /// templates out, runs take the fresh path. Default off, unless `RUNPYTHON_TEMPLATES=1`.
    pub templates: bool,
}

impl Default for PoolConfig {
    /// One interpreter per environment, unless `RUNPYTHON_POOL_SIZE` says otherwise (`0` turns the
    /// pool off: CI runs the suites both ways).
    fn default() -> Self {
        let size = env_vars::parsed(env_vars::POOL_SIZE).unwrap_or(1);
        Self {
            size,
            idle: Duration::from_secs(120),
            warm_imports: Vec::new(),
            prestart: env_vars::parsed::<u8>(env_vars::POOL_PRESTART) == Some(1),
            templates: env_vars::templates().0,
        }
    }
}

/// What a pooled interpreter was prepared for: the interpreter and the environment's site directory.
pub(crate) type PoolKey = (PathBuf, Option<PathBuf>);

/// The pool of one engine: ready interpreters per key, started with the engine's [`SlotSpec`].
#[derive(Debug)]
pub(crate) struct Pool {
    config: PoolConfig,
    spec: SlotSpec,
    ready: Mutex<HashMap<PoolKey, Vec<Slot>>>,
    /// Refills in flight per key, so a burst does not start more than the pool's size.
    starting: Mutex<HashMap<PoolKey, usize>>,
    /// Woken whenever a refill ends (with an interpreter or without one).
    arrived: Notify,
    /// How many each environment keeps ready now: [`PoolConfig::size`], one more each time a run
    /// found none ready (its runs come faster than an interpreter starts: one importing numpy takes
    /// ~200 ms), up to [`MAX_DEPTH`]; one less each time one expired unused.
    depth: Mutex<HashMap<PoolKey, usize>>,
}

/// Most interpreters one environment keeps ready when its runs come faster than one is started
/// (when [`PoolConfig::size`] is smaller).
const MAX_DEPTH: usize = 4;

/// How long a run waits for a pooled interpreter with `prestart` before starting one cold.
const PRESTART_WAIT: Duration = Duration::from_secs(10);

impl Pool {
    pub fn new(config: PoolConfig, spec: SlotSpec) -> Self {
        Self {
            config,
            spec,
            ready: Mutex::default(),
            starting: Mutex::default(),
            arrived: Notify::new(),
            depth: Mutex::default(),
        }
    }

    fn depth(&self, key: &PoolKey) -> usize {
        self.depth.lock().map_or(self.config.size, |d| {
            d.get(key).copied().unwrap_or(self.config.size)
        })
    }

    /// Keeps one more ready for `key` (a run found none), or one less (a run left some ready).
    fn adjust_depth(&self, key: &PoolKey, starved: bool) {
        let most = self.config.size.max(MAX_DEPTH);
        if let Ok(mut depths) = self.depth.lock() {
            let depth = depths.entry(key.clone()).or_insert(self.config.size);
            *depth = if starved {
                (*depth + 1).min(most)
            } else {
                depth.saturating_sub(1).max(self.config.size)
            };
        }
    }

    /// A pooled interpreter for `key`: one that is ready, or (with `prestart`) one started now and
    /// waited for. `None`: start one cold.
    pub async fn take_or_wait(self: &Arc<Self>, key: &PoolKey) -> Option<Slot> {
        if let Some(slot) = self.take(key) {
            return Some(slot);
        }
        self.adjust_depth(key, true);
        if !self.config.prestart {
            return None;
        }
        self.refill(key.clone());
        let deadline = tokio::time::Instant::now() + PRESTART_WAIT;
        loop {
            let notified = self.arrived.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if let Some(slot) = self.take(key) {
                return Some(slot);
            }
            if self.starting_for(key) == 0 {
                return None; // every refill ended without an interpreter
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return None;
            }
        }
    }

    fn starting_for(&self, key: &PoolKey) -> usize {
        self.starting
            .lock()
            .map_or(0, |s| s.get(key).copied().unwrap_or(0))
    }

    /// Starts replacements for pooled interpreters in the background (off the run's critical path).
    pub fn refill(self: &Arc<Self>, key: PoolKey) {
        for _ in 0..self.reserve(&key) {
            let pool = Arc::clone(self);
            let key = key.clone();
            tokio::spawn(async move {
                let mut warm_up = Vec::new();
                if let Some(site) = &key.1 {
                    warm_up.extend(["--site".to_owned(), site.display().to_string()]);
                }
                // `_ast` is what the runner needs first for any code (~1.4 ms to import); then the
                // modules the pool declares warm.
                let mut warm = vec!["_ast".to_owned()];
                warm.extend(pool.config.warm_imports.iter().cloned());
                warm_up.extend(["--warm".to_owned(), warm.join(",")]);
                let reads: Vec<&std::path::Path> = key.1.as_deref().into_iter().collect();
                let slot = super::code_dir::code_dir()
                    .and_then(|dir| pool.spec.spawn(&key.0, dir, &reads, &warm_up));
                // A pool that cannot start an interpreter just serves runs cold.
                pool.put(key, slot.ok());
            });
        }
    }

    /// A live, fresh interpreter for `key`, if one is ready. Dead or stale ones are dropped (which
    /// kills their process group).
    fn take(&self, key: &PoolKey) -> Option<Slot> {
        let mut ready = self.ready.lock().ok()?;
        let slots = ready.get_mut(key)?;
        let mut expired = false;
        let mut found = None;
        while let Some(mut slot) = slots.pop() {
            let alive = slot.spawned.process.is_alive();
            if alive && slot.born.elapsed() < self.config.idle {
                found = Some(slot);
                break;
            }
            expired |= alive;
        }
        drop(ready);
        if expired {
            // One waited its whole idle time unused: the environment's runs come slower again.
            self.adjust_depth(key, false);
        }
        found
    }

    /// How many more interpreters `key` needs, counting those being started; reserves them.
    fn reserve(&self, key: &PoolKey) -> usize {
        let ready = self
            .ready
            .lock()
            .map(|r| r.get(key).map_or(0, Vec::len))
            .unwrap_or(usize::MAX);
        let Ok(mut starting) = self.starting.lock() else {
            return 0;
        };
        let pending = starting.entry(key.clone()).or_insert(0);
        let missing = self.depth(key).saturating_sub(ready + *pending);
        *pending += missing;
        missing
    }

    /// A started interpreter joins the pool (or is dropped if the pool is full).
    fn put(&self, key: PoolKey, slot: Option<Slot>) {
        let depth = self.depth(&key);
        if let Some(slot) = slot {
            if let Ok(mut ready) = self.ready.lock() {
                let slots = ready.entry(key.clone()).or_default();
                if slots.len() < depth {
                    slots.push(slot);
                }
            }
        }
        // After the slot is in: a waiter that sees no refill left also sees the slot.
        if let Ok(mut starting) = self.starting.lock() {
            if let Some(pending) = starting.get_mut(&key) {
                *pending = pending.saturating_sub(1);
            }
        }
        self.arrived.notify_waiters();
    }
}
