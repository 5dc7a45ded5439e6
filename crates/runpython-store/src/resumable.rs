//! What the core keeps of unfinished work, as opaque versioned bytes: the checkpoints of resumable
//! runs (and their listing, how runs whose host died are found) and the records of sessions.

use std::time::SystemTime;

use bytes::Bytes;
use futures_util::StreamExt as _;

use crate::error::Result;
use crate::layout;
use crate::store::{Store, FAN_OUT};

/// A checkpoint as [`Store::list_checkpoints`] finds it: opaque bytes (the core's versioned record).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredCheckpoint {
    /// The run it belongs to.
    pub run_id: String,
    /// When it was last written (a durable run rewrites it around every tool call).
    pub updated_at: SystemTime,
    /// The record.
    pub bytes: Bytes,
}

impl Store {
    // ---- checkpoints ----

    /// Keeps the checkpoint of a resumable run (the caller's own versioned record), replacing any
    /// earlier one atomically.
    pub async fn put_checkpoint(&self, run_id: &str, bytes: impl Into<Bytes>) -> Result<()> {
        let key = layout::checkpoint(run_id)?;
        self.write(&key, bytes.into()).await
    }

    /// The checkpoint of `run_id`, or `None` when the run has none.
    pub async fn get_checkpoint(&self, run_id: &str) -> Result<Option<Bytes>> {
        let key = layout::checkpoint(run_id)?;
        self.read(&key).await
    }

    // ---- sessions ----

    /// Keeps a session's record (the caller's own versioned bytes), replacing any earlier one atomically.
    pub async fn put_session(&self, id: &str, bytes: impl Into<Bytes>) -> Result<()> {
        let key = layout::session(id)?;
        self.write(&key, bytes.into()).await
    }

    /// The record of session `id`, or `None` when it has none.
    pub async fn get_session(&self, id: &str) -> Result<Option<Bytes>> {
        let key = layout::session(id)?;
        self.read(&key).await
    }

    /// Keeps part `n` of session `id`'s record (the caller's bytes: the core writes each cell once
    /// as a part, so a long session's record is not rewritten whole on every cell), replacing any
    /// earlier part `n` atomically.
    pub async fn put_session_part(&self, id: &str, n: u64, bytes: impl Into<Bytes>) -> Result<()> {
        let key = layout::session_part(id, n)?;
        self.write(&key, bytes.into()).await
    }

    /// Part `n` of session `id`'s record, or `None` when there is none.
    pub async fn get_session_part(&self, id: &str, n: u64) -> Result<Option<Bytes>> {
        let key = layout::session_part(id, n)?;
        self.read(&key).await
    }

    /// Forgets session `id`, its record and every part of it (absent is fine).
    pub async fn delete_session(&self, id: &str) -> Result<()> {
        self.remove(&layout::session(id)?).await?;
        let parts = self.list(&layout::session_parts(id)?).await?;
        futures_util::stream::iter(parts)
            .map(|meta| async move { self.remove(&meta.location).await })
            .buffer_unordered(FAN_OUT)
            .collect::<Vec<_>>()
            .await
            .into_iter()
            .collect::<Result<()>>()
    }

    /// Every checkpoint in the store with when it was last written, least recently written first:
    /// how runs that have not finished (suspended, or whose host died) are found without knowing
    /// their ids. A failure to reach the store fails the listing.
    pub async fn list_checkpoints(&self) -> Result<Vec<StoredCheckpoint>> {
        let metas = self.list(layout::CHECKPOINTS).await?;
        let read: Vec<Result<Option<StoredCheckpoint>>> = futures_util::stream::iter(metas)
            .filter_map(|meta| async move {
                let run_id = layout::file_name(&meta.location)?;
                layout::check_run_id(run_id).ok()?;
                Some((run_id.to_owned(), meta))
            })
            .map(|(run_id, meta)| async move {
                Ok(self
                    .read(&meta.location)
                    .await?
                    .map(|bytes| StoredCheckpoint {
                        run_id,
                        updated_at: meta.last_modified.into(),
                        bytes,
                    }))
            })
            .buffer_unordered(FAN_OUT)
            .collect()
            .await;
        let mut found = Vec::with_capacity(read.len());
        for checkpoint in read {
            // Deleted between the listing and the read: not there any more.
            if let Some(checkpoint) = checkpoint? {
                found.push(checkpoint);
            }
        }
        found.sort_by(|a, b| (a.updated_at, &a.run_id).cmp(&(b.updated_at, &b.run_id)));
        Ok(found)
    }
}
