//! Garbage collection: expired runs, unreferenced blobs, staging leftovers and expired memo entries.

use std::collections::HashSet;
use std::time::SystemTime;

use object_store::ObjectStoreExt;

use crate::error::{Error, Result};
use crate::layout;
use crate::store::Store;

/// What [`Store::gc`] removed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GcReport {
    /// Ephemeral runs past their lifetime whose manifests were deleted.
    pub expired_runs: Vec<String>,
    /// Blobs no manifest references, older than the grace period.
    pub deleted_blobs: usize,
    /// Their total size.
    pub freed_bytes: u64,
    /// Leftovers of interrupted streamed uploads.
    pub deleted_staging: usize,
    /// Memo entries past their lifetime.
    pub expired_memos: usize,
    /// Records gc could not read (corrupt, or written by a newer version), left in place. When a
    /// manifest is among them no blob is deleted, since its references are unknown.
    pub unreadable: Vec<String>,
}

impl Store {
    /// Removes ephemeral runs expired at `now`, then blobs that no remaining manifest references,
    /// staging leftovers and expired memo entries. `now` is normally `SystemTime::now()`.
    ///
    /// Safe while other hosts write: a blob or staging object modified within
    /// [`StoreOptions::gc_grace`](crate::StoreOptions::gc_grace) of `now` is never deleted (writers
    /// put blobs before their manifest, and re-put existing blobs, refreshing their age), and each
    /// blob's age is checked again just before it is deleted. The remaining window is that one
    /// check-to-delete round trip. If any manifest cannot be read, no blob is deleted.
    pub async fn gc(&self, now: SystemTime) -> Result<GcReport> {
        let mut report = GcReport::default();
        let grace = self.inner.options.gc_grace;
        let old_enough = |t: SystemTime| t + grace <= now;

        let mut referenced = HashSet::new();
        let mut manifests_complete = true;
        for id in self.run_ids().await? {
            match self.read_manifest(&id).await {
                Ok(None) => {}
                Ok(Some(m)) if m.is_expired(now) => {
                    self.delete_run(&id).await?;
                    report.expired_runs.push(id);
                }
                Ok(Some(m)) => referenced.extend(m.artifacts.into_iter().map(|a| a.id)),
                Err(Error::CorruptRecord { key, .. } | Error::UnsupportedVersion { key, .. }) => {
                    manifests_complete = false;
                    report.unreadable.push(key);
                }
                Err(e) => return Err(e),
            }
        }

        if manifests_complete {
            for meta in self.list(&self.layout().blobs()).await? {
                let Some(hash) = layout::file_name(&meta.location) else {
                    continue;
                };
                if referenced.contains(hash) || !old_enough(meta.last_modified.into()) {
                    continue;
                }
                // Re-check: a writer may have re-put this blob since the listing.
                let fresh = match self.inner.os.head(&meta.location).await {
                    Ok(m) => m,
                    Err(object_store::Error::NotFound { .. }) => continue,
                    Err(e) => return Err(self.backend_err("head", &meta.location, e)),
                };
                if old_enough(fresh.last_modified.into()) {
                    self.remove(&meta.location).await?;
                    self.inner.recent_blobs.invalidate(&self.cache_slot(hash));
                    report.deleted_blobs += 1;
                    report.freed_bytes += fresh.size;
                }
            }
        }

        for meta in self.list(&self.layout().stagings()).await? {
            if old_enough(meta.last_modified.into()) {
                self.remove(&meta.location).await?;
                report.deleted_staging += 1;
            }
        }

        report.expired_memos = self.gc_memos(now, &mut report.unreadable).await?;
        report.expired_runs.sort();
        Ok(report)
    }
}
