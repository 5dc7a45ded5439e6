//! A tenant's stored-bytes quota, held at every write: each write reserves its bytes before it is
//! made (a stream, chunk by chunk), and a write that would take the tenant past its quota is refused
//! ([`Error::QuotaExceeded`]) before anything is sent. What is reserved and not written is released.
//!
//! The count is the tenant's objects, listed at most every [`RECOUNT`], plus what this process wrote
//! since and what it is writing now. Within one process every handle of a tenant shares the count
//! (a tenant's store is made once, [`Store::tenant`]), so concurrent writers cannot together pass the
//! quota. Processes (hosts) sharing a store do not see each other's writes until their next listing:
//! with `n` hosts a tenant holds at most `n` times its quota, and only until each host has listed
//! again (one [`RECOUNT`]); after that each refuses what the true total does not allow.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::layout;
use crate::store::Store;
use crate::usage::{lock, Reservation};

/// How often a tenant's stored bytes are counted again by listing them (in between, what this
/// process writes is added to the count).
pub const RECOUNT: Duration = Duration::from_secs(60);

impl Store {
    /// Limits what this tenant keeps to `bytes` (`None`: no limit), for every handle of the tenant
    /// in this process: from now on each write reserves its bytes first, and one that would take
    /// the tenant past the quota is [`Error::QuotaExceeded`] (see the module docs for the bound
    /// across hosts).
    pub fn set_quota(&self, bytes: Option<u64>) {
        lock(&self.inner.usage).limit = bytes;
    }

    /// The tenant's quota, when it has one.
    pub fn quota(&self) -> Option<u64> {
        lock(&self.inner.usage).limit
    }

    /// Bytes stored under this tenant's root (its runs, artifacts, checkpoints, sessions and memo
    /// entries), counted by listing them at most every `max_age`; in between, what this process
    /// wrote is added to the count (an object written again is counted twice until the next
    /// listing, one deleted still counts until then).
    pub async fn stored_bytes(&self, max_age: Duration) -> Result<u64> {
        if let Some((bytes, at)) = lock(&self.inner.usage).counted {
            if at.elapsed() < max_age {
                return Ok(bytes);
            }
        }
        let (listed_at, written_before) = (Instant::now(), lock(&self.inner.usage).written);
        let listed: u64 = self
            .list(self.layout().root())
            .await?
            .iter()
            .filter(|m| {
                // A named tenant's root holds only its own; the default tenant's holds the others'.
                self.inner.tenant.is_some() || !m.location.as_ref().starts_with(layout::TENANTS)
            })
            .map(|m| m.size)
            .sum();
        let mut usage = lock(&self.inner.usage);
        // A write finished while the listing was under way may be missing from it: it is added
        // (counted twice when the listing saw it: over, never under).
        let bytes = listed.saturating_add(usage.written - written_before);
        // A listing that started before another finished is not newer than it.
        if usage.counted.is_none_or(|(_, at)| at <= listed_at) {
            usage.counted = Some((bytes, listed_at));
        }
        Ok(usage.counted.map_or(bytes, |(b, _)| b))
    }

    /// Reserves `bytes` for a write against the tenant's quota (none: nothing to hold). Refused when
    /// what is stored, what is being written and `bytes` together pass the quota.
    pub(crate) async fn reserve(&self, bytes: u64) -> Result<Reservation> {
        let usage = &self.inner.usage;
        if lock(usage).limit.is_some() {
            // Counted when the count is missing or old: the listing is outside the lock.
            self.stored_bytes(RECOUNT).await?;
        }
        let mut held = lock(usage);
        if let Some(quota) = held.limit {
            let used = held.counted.map_or(0, |(b, _)| b) + held.reserved;
            if used.saturating_add(bytes) > quota {
                return Err(Error::QuotaExceeded {
                    tenant: self
                        .inner
                        .tenant
                        .clone()
                        .unwrap_or_else(|| "the default tenant".into()),
                    used,
                    quota,
                    wanted: bytes,
                });
            }
        }
        held.reserved += bytes;
        Ok(Reservation {
            usage: Arc::clone(usage),
            bytes,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tenant_with_quota(quota: u64) -> Store {
        let store = Store::open("memory://").unwrap().tenant("t").unwrap();
        store.set_quota(Some(quota));
        store
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn concurrent_writers_of_one_tenant_never_pass_its_quota_together() {
        let store = tenant_with_quota(1 << 20);
        // Sixteen writers of 200 KiB at once, each with a handle of its own: at most five fit.
        let writes = (0..16u8).map(|i| {
            let store = store.tenant("t").unwrap();
            tokio::spawn(async move { store.put_blob(vec![i; 200 << 10]).await })
        });
        let mut kept = 0;
        for write in writes {
            match write.await.unwrap() {
                Ok(_) => kept += 1,
                Err(Error::QuotaExceeded { quota, .. }) => assert_eq!(quota, 1 << 20),
                Err(e) => panic!("{e}"),
            }
        }
        assert_eq!(kept, 5);
        let stored = store.stored_bytes(Duration::ZERO).await.unwrap();
        assert!(stored <= 1 << 20, "{stored} bytes under a quota of 1 MiB");
    }

    #[tokio::test]
    async fn a_write_made_while_the_tenant_is_counted_again_stays_in_the_count() {
        use object_store::memory::InMemory;
        use object_store::throttle::{ThrottleConfig, ThrottledStore};
        // Each listing is taken when asked for and answered 300 ms later.
        let slow = ThrottledStore::new(
            InMemory::new(),
            ThrottleConfig {
                wait_list_per_call: Duration::from_millis(300),
                ..ThrottleConfig::default()
            },
        );
        let base = Store::with_backend("slow", std::sync::Arc::new(slow), Default::default());
        let store = base.tenant("t").unwrap();
        store.set_quota(Some(1 << 20));
        store.put_blob(vec![1u8; 16]).await.unwrap();
        let recount = {
            let store = store.clone();
            tokio::spawn(async move { store.stored_bytes(Duration::ZERO).await })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        // Written while the recount's listing (taken before it) is on its way back.
        store.put_blob(vec![2u8; 600 << 10]).await.unwrap();
        recount.await.unwrap().unwrap();
        let err = store.put_blob(vec![3u8; 600 << 10]).await.unwrap_err();
        assert!(matches!(err, Error::QuotaExceeded { .. }), "{err}");
        let stored = store.stored_bytes(Duration::ZERO).await.unwrap();
        assert!(stored <= 1 << 20, "{stored} bytes under a quota of 1 MiB");
    }

    #[tokio::test]
    async fn a_stream_past_the_quota_is_refused_and_leaves_nothing() {
        let store = tenant_with_quota(1 << 20);
        let big = vec![7u8; 3 << 20];
        let err = store
            .put_artifact_stream("big.bin", std::io::Cursor::new(big))
            .await
            .unwrap_err();
        assert!(matches!(err, Error::QuotaExceeded { .. }), "{err}");
        assert!(
            err.to_string().contains("raise the tenant's quota"),
            "{err}"
        );
        // Nothing of it is stored (the tenant's name record is), and what was reserved for it is
        // free again.
        assert_eq!(store.stored_bytes(Duration::ZERO).await.unwrap(), 1);
        store.put_blob(vec![1u8; 512 << 10]).await.unwrap();
    }

    #[tokio::test]
    async fn a_run_whose_files_do_not_all_fit_writes_none_of_them() {
        let store = tenant_with_quota(1 << 20);
        let mut run = crate::conformance::sample_run("r1");
        run.files = (0..4)
            .map(|i| crate::RunFile {
                name: format!("f{i}.bin"),
                bytes: vec![i; 400 << 10],
            })
            .collect();
        let err = store.put_run(run).await.unwrap_err();
        assert!(matches!(err, Error::QuotaExceeded { .. }), "{err}");
        let stored = store.stored_bytes(Duration::ZERO).await.unwrap();
        assert!(
            stored < 1024,
            "{stored} bytes kept of a run that was refused"
        );
        // Two of them fit.
        let mut run = crate::conformance::sample_run("r2");
        run.files.truncate(0);
        run.files.push(crate::RunFile {
            name: "f.bin".into(),
            bytes: vec![9; 400 << 10],
        });
        store.put_run(run).await.unwrap();
    }

    #[tokio::test]
    async fn a_session_snapshot_counts_in_the_quota_and_one_past_it_keeps_the_earlier() {
        let store = tenant_with_quota(1 << 20);
        store
            .put_session_snapshot("s", &vec![1u8; 600 << 10][..])
            .await
            .unwrap();
        let used = store.stored_bytes(Duration::from_secs(60)).await.unwrap();
        assert!(used >= 600 << 10, "the snapshot is not counted: {used}");
        let err = store
            .put_session_snapshot("s", &vec![2u8; 600 << 10][..])
            .await
            .unwrap_err();
        assert!(matches!(err, Error::QuotaExceeded { .. }), "{err}");
        let kept: Vec<bytes::Bytes> = futures_util::TryStreamExt::try_collect(
            store.get_session_snapshot("s").await.unwrap().unwrap(),
        )
        .await
        .unwrap();
        assert_eq!(kept.concat(), vec![1u8; 600 << 10]);
    }

    #[tokio::test]
    async fn another_tenant_and_a_tenant_without_a_quota_are_not_held() {
        let store = tenant_with_quota(10);
        assert!(store.put_blob(vec![0u8; 11]).await.is_err());
        let other = store.tenant("u").unwrap();
        other.put_blob(vec![0u8; 1 << 16]).await.unwrap();
        store.set_quota(None);
        store.put_blob(vec![0u8; 11]).await.unwrap();
    }
}
