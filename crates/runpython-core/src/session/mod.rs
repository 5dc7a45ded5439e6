//! Sessions: state kept across calls. A session is one long-lived sandboxed interpreter (every layer and
//! limit of a run, its own scratch for its whole life) that executes cells in one `__main__` namespace;
//! each cell gets fresh output pipes and a fresh bridge connection, so its envelope holds its own output
//! and its tool budget is its own.
//!
//! The registry keeps at most [`SessionConfig::max_live`] interpreters alive (the least recently used
//! idle one is evicted past that) and expires those idle for [`SessionConfig::idle`]. A session whose
//! interpreter is gone (killed after a timeout, evicted, expired, or its host died) is reported as lost in
//! the next call, never silently empty; with a store it is restored instead ([`restore`]): the latest
//! snapshot of its namespace ([`snapshot`]) loaded in a new interpreter, then the cells recorded
//! after it ([`record`]) replayed, tool calls answered from their journals.

pub(crate) mod cell;
mod live;
mod record;
mod restore;
pub(crate) mod route;
mod snapshot;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

pub(crate) use live::{CellRaw, CellSpec, Live};
pub(crate) use record::{spill_for, CellRecord, CellRun, SessionRecord};

/// Limits of an engine's sessions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionConfig {
    /// Live session interpreters kept per engine (default 16); past it the least recently used idle one
    /// is evicted.
    pub max_live: usize,
    /// A session unused this long is expired: its interpreter is killed (default 10 minutes).
    pub idle: Duration,
    /// With a store: the largest snapshot of a session's namespace kept, in bytes (default 64 MiB);
    /// a namespace that pickles to more is restored by replay. 0 takes no snapshots.
    pub snapshot_max_bytes: u64,
    /// With a store: the time a restore may spend loading a snapshot and replaying cells (default 60
    /// s); past it the restore fails, naming the session and why, and its record is kept.
    pub replay_budget: Duration,
}

impl Default for SessionConfig {
    fn default() -> Self {
        Self {
            max_live: 16,
            idle: Duration::from_secs(600),
            snapshot_max_bytes: 64 << 20,
            replay_budget: Duration::from_secs(60),
        }
    }
}

/// One session's state in this engine.
#[derive(Debug)]
pub(crate) struct Entry {
    pub id: String,
    /// The tenant it belongs to (`None`: the default tenant).
    pub tenant: Option<String>,
    /// Its interpreter, while it lives.
    pub live: Option<Live>,
    /// Cells run so far (the next cell's number is this plus one).
    pub cells: u64,
    /// Why the interpreter is gone, until a call has reported it.
    pub lost: Option<String>,
    pub last_used: Instant,
    /// Requirement specs the session gathered.
    pub deps: Vec<String>,
    /// The environment the running cell added requirements to, for its envelope's `dependencies`.
    pub added_deps: Option<crate::protocol::envelope::Dependencies>,
    /// The record kept in the store (durable sessions), as last written.
    pub record: Option<SessionRecord>,
    /// Every per-cell environment variable given so far: a later cell's kept output is masked with
    /// them too (the code may have kept a value it read). In memory only, never stored.
    pub secrets: std::collections::BTreeMap<String, String>,
    /// When the live interpreter's next snapshot is due.
    pub snapshots: snapshot::Snapshots,
}

/// The sessions of one engine (shared by its clones).
#[derive(Debug)]
pub(crate) struct Registry {
    pub config: SessionConfig,
    /// By tenant and id: two tenants' sessions of one id are two sessions.
    entries: Mutex<HashMap<SessionKey, Arc<tokio::sync::Mutex<Entry>>>>,
    reaper: std::sync::OnceLock<()>,
}

/// A session's key in the registry: its tenant and its id.
type SessionKey = (Option<String>, String);

fn key_of(tenant: Option<&str>, id: &str) -> SessionKey {
    (tenant.map(str::to_owned), id.to_owned())
}

/// Entries kept for sessions without an interpreter (so their loss can be reported), at most.
const MAX_ENTRIES: usize = 10_000;

impl Registry {
    pub(crate) fn new(config: SessionConfig) -> Arc<Self> {
        Arc::new(Self {
            config,
            entries: Mutex::default(),
            reaper: std::sync::OnceLock::new(),
        })
    }

    fn lock(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<SessionKey, Arc<tokio::sync::Mutex<Entry>>>> {
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The session `id` of `tenant`, made if it is new. Starts the idle reaper on first use.
    pub(crate) fn entry(
        self: &Arc<Self>,
        tenant: Option<&str>,
        id: &str,
    ) -> Arc<tokio::sync::Mutex<Entry>> {
        self.start_reaper();
        let key = key_of(tenant, id);
        let mut entries = self.lock();
        if entries.len() >= MAX_ENTRIES && !entries.contains_key(&key) {
            // Forget sessions that have nothing left to report (no interpreter, no loss pending).
            entries.retain(|_, e| {
                e.try_lock()
                    .map_or(true, |e| e.live.is_some() || e.lost.is_some())
            });
        }
        Arc::clone(entries.entry(key).or_insert_with(|| {
            Arc::new(tokio::sync::Mutex::new(Entry {
                id: id.to_owned(),
                tenant: tenant.map(str::to_owned),
                live: None,
                cells: 0,
                lost: None,
                last_used: Instant::now(),
                deps: Vec::new(),
                added_deps: None,
                record: None,
                secrets: std::collections::BTreeMap::new(),
                snapshots: snapshot::Snapshots::default(),
            }))
        }))
    }

    /// Forgets `tenant`'s `id` (its interpreter, if any, is killed when the entry drops).
    pub(crate) fn remove(&self, tenant: Option<&str>, id: &str) {
        self.lock().remove(&key_of(tenant, id));
    }

    /// After `keep` got an interpreter: evicts the least recently used idle ones past the cap.
    pub(crate) fn evict_over_capacity(&self, tenant: Option<&str>, keep: &str) {
        let entries: Vec<Arc<tokio::sync::Mutex<Entry>>> = self.lock().values().cloned().collect();
        let mut live = 0usize;
        let mut idle: Vec<(Instant, Arc<tokio::sync::Mutex<Entry>>)> = Vec::new();
        for entry in entries {
            match entry.try_lock() {
                // Busy: it is in use, and it has (or is getting) an interpreter.
                Err(_) => live += 1,
                Ok(e) if e.live.is_some() => {
                    live += 1;
                    if e.id != keep || e.tenant.as_deref() != tenant {
                        idle.push((e.last_used, Arc::clone(&entry)));
                    }
                }
                Ok(_) => {}
            }
        }
        idle.sort_by_key(|(used, _)| *used);
        for (_, entry) in idle {
            if live <= self.config.max_live {
                break;
            }
            if let Ok(mut e) = entry.try_lock() {
                if let Some(mut interpreter) = e.live.take() {
                    interpreter.kill();
                    e.lost = Some(format!(
                        "the session was evicted: the engine keeps at most {} live sessions and this one \
                         was the least recently used",
                        self.config.max_live
                    ));
                    live -= 1;
                }
            }
        }
    }

    /// Kills the interpreters of sessions idle for longer than the configured time.
    fn reap_idle(&self) {
        let entries: Vec<Arc<tokio::sync::Mutex<Entry>>> = self.lock().values().cloned().collect();
        for entry in entries {
            if let Ok(mut e) = entry.try_lock() {
                if e.live.is_some() && e.last_used.elapsed() >= self.config.idle {
                    if let Some(mut interpreter) = e.live.take() {
                        interpreter.kill();
                    }
                    e.lost = Some(format!(
                        "the session expired after {} idle",
                        crate::protocol::outcome::human_duration(self.config.idle)
                    ));
                }
            }
        }
    }

    fn start_reaper(self: &Arc<Self>) {
        self.reaper.get_or_init(|| {
            let weak: Weak<Self> = Arc::downgrade(self);
            let every =
                (self.config.idle / 10).clamp(Duration::from_millis(50), Duration::from_secs(30));
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                runtime.spawn(async move {
                    loop {
                        tokio::time::sleep(every).await;
                        let Some(registry) = weak.upgrade() else {
                            return;
                        };
                        registry.reap_idle();
                    }
                });
            }
        });
    }
}

/// A fresh session id: 16 random bytes, hex.
pub(crate) fn new_session_id() -> String {
    let mut random = [0u8; 16];
    let _ = getrandom::fill(&mut random);
    random.iter().map(|b| format!("{b:02x}")).collect()
}

/// Whether `id` can name a session (it names its record in the store too).
pub(crate) fn check_session_id(id: &str) -> Result<(), crate::error::Error> {
    let ok = !id.is_empty()
        && id.len() <= 128
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':'));
    if ok {
        Ok(())
    } else {
        Err(crate::error::Error::InvalidInput(format!(
            "session id {id:?} must be 1-128 characters of letters, digits, '-', '_', '.' or ':'"
        )))
    }
}
