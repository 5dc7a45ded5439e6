//! Memoized envelopes: a content key, entries at rest, and a moka cache in front that coalesces
//! concurrent identical lookups.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::error::{Error, Result};
use crate::layout;
use crate::memo_cache::CachedMemo;
use crate::record::{self, from_ms, to_ms, MemoRecord, MemoV1};
use crate::store::Store;

/// The content key of a memoized run: blake3 hex over a length-prefixed list of parts.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MemoKey(String);

impl MemoKey {
    /// The 64-character hex form.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Parses the hex form (as printed by [`MemoKey::as_str`]).
    pub fn parse(hex: &str) -> Result<Self> {
        layout::check_hex(hex, "memo key")?;
        Ok(Self(hex.to_owned()))
    }
}

impl std::fmt::Display for MemoKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// The memo key of `parts`, in order: the core passes the code, the resolved dependencies, the inputs
/// JSON, the interpreter version, the runner/protocol version and the tool-set fingerprint. Each part
/// is prefixed with its length, so no two different lists share a key (`["ab", "c"]` ≠ `["a", "bc"]`).
pub fn memo_key<I, P>(parts: I) -> MemoKey
where
    I: IntoIterator<Item = P>,
    P: AsRef<[u8]>,
{
    let mut h = blake3::Hasher::new();
    h.update(b"runpython memo key v1\0");
    let mut count = 0u64;
    for part in parts {
        let part = part.as_ref();
        h.update(&(part.len() as u64).to_le_bytes());
        h.update(part);
        count += 1;
    }
    h.update(&count.to_le_bytes());
    MemoKey(h.finalize().to_hex().to_string())
}

/// What a computation hands to [`Store::memoized`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Computed {
    /// The envelope JSON.
    pub json: String,
    /// Whether to memoize it (the core's policy: e.g. not a timeout).
    pub keep: bool,
}

impl Computed {
    /// A result to memoize.
    pub fn keep(json: impl Into<String>) -> Self {
        Self {
            json: json.into(),
            keep: true,
        }
    }

    /// A result to return but not memoize.
    pub fn once(json: impl Into<String>) -> Self {
        Self {
            json: json.into(),
            keep: false,
        }
    }
}

/// What [`Store::memoized`] returns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Memoized {
    /// The envelope JSON.
    pub json: Arc<str>,
    /// True when this call did not compute it (memory or store hit, or another caller's computation).
    pub cached: bool,
    /// `Some(the store's error)` when a result to memoize could not be written: it is returned all
    /// the same (whoever computed it must not lose it), and not memoized.
    pub not_kept: Option<Arc<str>>,
}

impl Store {
    /// Stores an envelope under `key`, for `ttl` (or until deleted when `None`), in the store and in
    /// the memory cache.
    pub async fn put_memo(
        &self,
        key: &MemoKey,
        envelope_json: &str,
        ttl: Option<Duration>,
    ) -> Result<()> {
        let entry = self.write_memo(key, envelope_json, ttl).await?;
        self.inner.memo.insert(self.cache_slot(&key.0), entry).await;
        Ok(())
    }

    async fn write_memo(
        &self,
        key: &MemoKey,
        json: &str,
        ttl: Option<Duration>,
    ) -> Result<CachedMemo> {
        let now = SystemTime::now();
        let expires_at = ttl.map(|t| now + t);
        let record = MemoRecord::V1(MemoV1 {
            created_at_ms: to_ms(now),
            expires_at_ms: expires_at.map(to_ms),
            envelope_json: json.to_owned(),
        });
        self.write(&self.layout().memo(&key.0)?, record::encode(&record)?)
            .await?;
        Ok(CachedMemo {
            json: json.into(),
            expires_at,
            keep: true,
            not_kept: None,
        })
    }

    /// The envelope memoized under `key`, from memory or else from the store; `None` when there is
    /// none or it expired.
    pub async fn get_memo(&self, key: &MemoKey) -> Result<Option<Arc<str>>> {
        if let Some(hit) = self.inner.memo.get(&self.cache_slot(&key.0)).await {
            return Ok(Some(hit.json));
        }
        let Some(entry) = self.read_memo(key).await? else {
            return Ok(None);
        };
        let json = Arc::clone(&entry.json);
        self.inner.memo.insert(self.cache_slot(&key.0), entry).await;
        Ok(Some(json))
    }

    async fn read_memo(&self, key: &MemoKey) -> Result<Option<CachedMemo>> {
        let path = self.layout().memo(&key.0)?;
        let Some(bytes) = self.read(&path).await? else {
            return Ok(None);
        };
        let MemoRecord::V1(m) = record::decode(path.as_ref(), &bytes)?;
        let expires_at = m.expires_at_ms.map(from_ms);
        if expires_at.is_some_and(|t| t <= SystemTime::now()) {
            return Ok(None);
        }
        Ok(Some(CachedMemo {
            json: m.envelope_json.into(),
            expires_at,
            keep: true,
            not_kept: None,
        }))
    }

    /// Deletes the memo entry `key` from the store and the memory cache.
    pub async fn delete_memo(&self, key: &MemoKey) -> Result<()> {
        self.inner.memo.invalidate(&self.cache_slot(&key.0)).await;
        self.remove(&self.layout().memo(&key.0)?).await
    }

    /// The envelope memoized under `key`, or the result of `compute`, memoized for `ttl` when it
    /// says [`Computed::keep`].
    ///
    /// Concurrent calls with the same key run `compute` once; the others wait and receive its result
    /// (with `cached: true`). The error is shared the same way, hence the `Arc`. A failure to read the
    /// store first is an error (nothing was computed); a failure to write the memo entry after
    /// `compute` ran is not: the result comes back with [`Memoized::not_kept`] naming it.
    pub async fn memoized<F, Fut, E>(
        &self,
        key: &MemoKey,
        ttl: Option<Duration>,
        compute: F,
    ) -> Result<Memoized, Arc<E>>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<Computed, E>>,
        E: From<Error> + Send + Sync + 'static,
    {
        if let Some(hit) = self.inner.memo.get(&self.cache_slot(&key.0)).await {
            return Ok(Memoized {
                json: hit.json,
                cached: true,
                not_kept: None,
            });
        }
        let computed_here = AtomicBool::new(false);
        let entry = self
            .inner
            .memo
            .try_get_with(self.cache_slot(&key.0), async {
                if let Some(stored) = self.read_memo(key).await? {
                    return Ok(stored);
                }
                computed_here.store(true, Ordering::Relaxed);
                let computed = compute().await?;
                let not_kept = if computed.keep {
                    match self.write_memo(key, &computed.json, ttl).await {
                        Ok(entry) => return Ok(entry),
                        // The computation ran: its result is not lost for want of a memo entry.
                        Err(e) => Some(e.to_string().into()),
                    }
                } else {
                    None
                };
                Ok::<_, E>(CachedMemo {
                    json: computed.json.into(),
                    expires_at: None,
                    keep: false,
                    not_kept,
                })
            })
            .await?;
        if !entry.keep {
            self.inner.memo.invalidate(&self.cache_slot(&key.0)).await;
        }
        Ok(Memoized {
            json: entry.json,
            cached: !computed_here.load(Ordering::Relaxed),
            not_kept: entry.not_kept,
        })
    }

    /// Removes memo entries expired at `now`; returns how many. Unreadable ones are reported, kept.
    pub(crate) async fn gc_memos(
        &self,
        now: SystemTime,
        unreadable: &mut Vec<String>,
    ) -> Result<usize> {
        let mut removed = 0;
        for meta in self.list(&self.layout().memos()).await? {
            let Some(bytes) = self.read(&meta.location).await? else {
                continue;
            };
            match record::decode::<MemoRecord>(meta.location.as_ref(), &bytes) {
                Ok(MemoRecord::V1(m)) => {
                    if m.expires_at_ms.is_some_and(|t| from_ms(t) <= now) {
                        self.remove(&meta.location).await?;
                        if let Some(name) = layout::file_name(&meta.location) {
                            self.inner.memo.invalidate(&self.cache_slot(name)).await;
                        }
                        removed += 1;
                    }
                }
                Err(_) => unreadable.push(meta.location.to_string()),
            }
        }
        Ok(removed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memo_keys_are_length_prefixed_so_boundaries_matter() {
        assert_ne!(memo_key(["ab", "c"]), memo_key(["a", "bc"]));
        assert_ne!(memo_key(["a"]), memo_key(["a", ""]));
        assert_eq!(
            memo_key(["x", "y"]),
            memo_key([b"x".to_vec(), b"y".to_vec()])
        );
        assert_eq!(memo_key(["x"]).as_str().len(), 64);
    }

    #[test]
    fn memo_keys_parse_back_from_their_hex() {
        let k = memo_key(["code"]);
        assert_eq!(MemoKey::parse(k.as_str()).unwrap(), k);
        assert!(MemoKey::parse("../../etc").is_err());
    }
}
