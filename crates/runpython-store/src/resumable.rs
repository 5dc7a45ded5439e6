//! What the core keeps of unfinished work, as opaque versioned bytes: the checkpoints of resumable
//! runs (and their listing, how runs whose host died are found) and the records of sessions.

use std::time::SystemTime;

use std::sync::Arc;

use bytes::Bytes;
use futures_util::stream::BoxStream;
use futures_util::{StreamExt as _, TryStreamExt as _};
use object_store::ObjectStoreExt as _;
use tokio::io::AsyncRead;

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
        let key = self.layout().checkpoint(run_id)?;
        self.write(&key, bytes.into()).await
    }

    /// The checkpoint of `run_id`, or `None` when the run has none.
    pub async fn get_checkpoint(&self, run_id: &str) -> Result<Option<Bytes>> {
        let key = self.layout().checkpoint(run_id)?;
        self.read(&key).await
    }

    /// Keeps part `name` of `run_id`'s checkpoint (the caller's bytes: a durable run appends one per
    /// change of a call, and keeps large values beside them), replacing any earlier part `name`.
    /// Deleted with the run.
    pub async fn put_checkpoint_part(
        &self,
        run_id: &str,
        name: &str,
        bytes: impl Into<Bytes>,
    ) -> Result<()> {
        self.write(&self.layout().checkpoint_part(run_id, name)?, bytes.into())
            .await
    }

    /// Part `name` of `run_id`'s checkpoint, or `None`.
    pub async fn get_checkpoint_part(&self, run_id: &str, name: &str) -> Result<Option<Bytes>> {
        self.read(&self.layout().checkpoint_part(run_id, name)?)
            .await
    }

    /// The names of `run_id`'s checkpoint parts that start with `prefix`, sorted.
    pub async fn list_checkpoint_parts(&self, run_id: &str, prefix: &str) -> Result<Vec<String>> {
        let mut names: Vec<String> = self
            .list(&self.layout().checkpoint_parts(run_id)?)
            .await?
            .iter()
            .filter_map(|m| layout::file_name(&m.location))
            .filter(|n| n.starts_with(prefix))
            .map(str::to_owned)
            .collect();
        names.sort();
        Ok(names)
    }

    /// Forgets `run_id`'s checkpoint and its parts (absent is fine).
    pub async fn delete_checkpoint(&self, run_id: &str) -> Result<()> {
        self.remove(&self.layout().checkpoint(run_id)?).await?;
        self.remove_all(&self.layout().checkpoint_parts(run_id)?)
            .await
    }

    /// Keeps a value `name` with session `id`'s record (deleted with it).
    pub async fn put_session_value(
        &self,
        id: &str,
        name: &str,
        bytes: impl Into<Bytes>,
    ) -> Result<()> {
        self.write(&self.layout().session_value(id, name)?, bytes.into())
            .await
    }

    /// The value `name` kept with session `id`'s record, or `None`.
    pub async fn get_session_value(&self, id: &str, name: &str) -> Result<Option<Bytes>> {
        self.read(&self.layout().session_value(id, name)?).await
    }

    /// Removes every object under `dir`.
    async fn remove_all(&self, dir: &str) -> Result<()> {
        let objects = self.list(dir).await?;
        futures_util::stream::iter(objects)
            .map(|meta| async move { self.remove(&meta.location).await })
            .buffer_unordered(FAN_OUT)
            .collect::<Vec<_>>()
            .await
            .into_iter()
            .collect::<Result<()>>()
    }

    // ---- sessions ----

    /// Keeps a session's record (the caller's own versioned bytes), replacing any earlier one atomically.
    pub async fn put_session(&self, id: &str, bytes: impl Into<Bytes>) -> Result<()> {
        let key = self.layout().session(id)?;
        self.write(&key, bytes.into()).await
    }

    /// The record of session `id`, or `None` when it has none.
    pub async fn get_session(&self, id: &str) -> Result<Option<Bytes>> {
        let key = self.layout().session(id)?;
        self.read(&key).await
    }

    /// Keeps part `n` of session `id`'s record (the caller's bytes: the core writes each cell once
    /// as a part, so a long session's record is not rewritten whole on every cell), replacing any
    /// earlier part `n` atomically.
    pub async fn put_session_part(&self, id: &str, n: u64, bytes: impl Into<Bytes>) -> Result<()> {
        let key = self.layout().session_part(id, n)?;
        self.write(&key, bytes.into()).await
    }

    /// Part `n` of session `id`'s record, or `None` when there is none.
    pub async fn get_session_part(&self, id: &str, n: u64) -> Result<Option<Bytes>> {
        let key = self.layout().session_part(id, n)?;
        self.read(&key).await
    }

    /// Keeps `reader`'s bytes as session `id`'s snapshot (the caller's own versioned bytes; one per
    /// session, the latest), replacing the earlier one only once the whole stream is written:
    /// streamed, never all in memory, each chunk reserved against the tenant's quota before it is
    /// sent. A reader that fails, or bytes past the quota, leave the earlier snapshot as it was.
    /// Deleted with the session. Returns the bytes written.
    pub async fn put_session_snapshot<R>(&self, id: &str, mut reader: R) -> Result<u64>
    where
        R: AsyncRead + Unpin + Send,
    {
        let key = self.layout().session_snapshot(id)?;
        self.record_tenant().await?;
        // Small snapshots go in one request; larger ones as a multipart upload that becomes visible
        // whole when it completes (aborted otherwise).
        let mut writer = object_store::buffered::BufWriter::with_capacity(
            Arc::clone(&self.inner.os),
            key.clone(),
            self.inner.options.upload_part_bytes,
        );
        let (size, reserved) = self
            .stream_into(&mut reader, &mut writer, &key, |_| {})
            .await?;
        tokio::io::AsyncWriteExt::shutdown(&mut writer)
            .await
            .map_err(|e| {
                let source = object_store::Error::Generic {
                    store: "upload",
                    source: Box::new(e),
                };
                self.backend_err("put", &key, source)
            })?;
        reserved
            .into_iter()
            .for_each(crate::usage::Reservation::commit);
        Ok(size)
    }

    /// Session `id`'s snapshot as a stream of chunks, or `None` when it has none.
    pub async fn get_session_snapshot(
        &self,
        id: &str,
    ) -> Result<Option<BoxStream<'static, Result<Bytes>>>> {
        let key = self.layout().session_snapshot(id)?;
        let got = match self.inner.os.get(&key).await {
            Ok(got) => got,
            Err(object_store::Error::NotFound { .. }) => return Ok(None),
            Err(e) => return Err(self.backend_err("get", &key, e)),
        };
        let store = self.inner.url.clone();
        Ok(Some(
            got.into_stream()
                .map_err(move |source| crate::error::Error::Backend {
                    op: "get",
                    key: key.to_string(),
                    store: store.clone(),
                    source: Box::new(source),
                })
                .boxed(),
        ))
    }

    /// Forgets session `id`, its record and every part and value of it (absent is fine).
    pub async fn delete_session(&self, id: &str) -> Result<()> {
        self.remove(&self.layout().session(id)?).await?;
        self.remove_all(&self.layout().session_parts(id)?).await
    }

    /// Every checkpoint in the store with when it or a part of it was last written, least recently
    /// written first: how runs that have not finished (suspended, or whose host died) are found
    /// without knowing their ids. A failure to reach the store fails the listing.
    pub async fn list_checkpoints(&self) -> Result<Vec<StoredCheckpoint>> {
        let metas = self.list(&self.layout().checkpoints()).await?;
        // A durable run appends parts and leaves its head alone: its last write is its newest part's.
        let mut newest_part = std::collections::HashMap::<String, SystemTime>::new();
        let parts_root = format!("{}/", self.layout().all_checkpoint_parts());
        for part in self.list(&self.layout().all_checkpoint_parts()).await? {
            let run = part
                .location
                .as_ref()
                .strip_prefix(&parts_root)
                .and_then(|rest| rest.split('/').next())
                .map(str::to_owned);
            if let Some(run) = run {
                let at: SystemTime = part.last_modified.into();
                let newest = newest_part.entry(run).or_insert(at);
                *newest = (*newest).max(at);
            }
        }
        let newest_part = &newest_part;
        let read: Vec<Result<Option<StoredCheckpoint>>> = futures_util::stream::iter(metas)
            .filter_map(|meta| async move {
                let run_id = layout::file_name(&meta.location)?;
                layout::check_run_id(run_id).ok()?;
                Some((run_id.to_owned(), meta))
            })
            .map(|(run_id, meta)| async move {
                Ok(self.read(&meta.location).await?.map(|bytes| {
                    let head: SystemTime = meta.last_modified.into();
                    let updated_at = newest_part.get(&run_id).map_or(head, |p| head.max(*p));
                    StoredCheckpoint {
                        run_id,
                        updated_at,
                        bytes,
                    }
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
