//! The moka cache in front of memo entries: bounded by bytes, each entry expiring at its own time, and
//! coalescing concurrent lookups of one key. A leaf: the [`crate::Store`] holds one, `memo.rs` fills it.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

/// One cached memo entry.
#[derive(Clone)]
pub(crate) struct CachedMemo {
    /// The envelope JSON.
    pub(crate) json: Arc<str>,
    /// When the entry stops being served; `None`: never.
    pub(crate) expires_at: Option<SystemTime>,
    /// False for a result handed to the callers waiting on its computation but not memoized.
    pub(crate) keep: bool,
    /// Why a result to memoize was not: the store's error writing it.
    pub(crate) not_kept: Option<Arc<str>>,
}

pub(crate) type MemoCache = moka::future::Cache<String, CachedMemo>;

/// Entries live until their own `expires_at`; an entry not to be kept expires at once (the callers
/// waiting on its computation still receive it).
struct PerEntryExpiry;

impl moka::Expiry<String, CachedMemo> for PerEntryExpiry {
    fn expire_after_create(&self, _: &String, v: &CachedMemo, _: Instant) -> Option<Duration> {
        if !v.keep {
            return Some(Duration::ZERO);
        }
        v.expires_at.map(|t| {
            t.duration_since(SystemTime::now())
                .unwrap_or(Duration::ZERO)
        })
    }

    fn expire_after_update(
        &self,
        k: &String,
        v: &CachedMemo,
        at: Instant,
        _: Option<Duration>,
    ) -> Option<Duration> {
        self.expire_after_create(k, v, at)
    }
}

pub(crate) fn new_cache(max_bytes: u64) -> MemoCache {
    moka::future::Cache::builder()
        .max_capacity(max_bytes)
        .weigher(|k: &String, v: &CachedMemo| {
            u32::try_from(k.len() + v.json.len() + 64).unwrap_or(u32::MAX)
        })
        .expire_after(PerEntryExpiry)
        .build()
}
