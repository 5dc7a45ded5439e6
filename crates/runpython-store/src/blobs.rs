//! Blobs: content-addressed bytes (artifacts), written whole or streamed, read whole, by range or as a
//! stream.

use std::sync::Arc;
use std::time::SystemTime;

use bytes::{Bytes, BytesMut};
use futures_util::stream::{BoxStream, StreamExt, TryStreamExt};
use object_store::ObjectStoreExt;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};

use crate::artifact::{Artifact, ArtifactKind};
use crate::error::{Error, Result};
use crate::preview::preview;
use crate::record::to_ms;
use crate::store::Store;

impl Store {
    /// Stores `bytes` under its blake3 hash and returns the hash (the artifact id).
    ///
    /// Always writes, even when the blob exists: the write refreshes its modification time, which is
    /// what keeps a concurrent [`gc`](Self::gc) from deleting a blob that a new manifest is about to
    /// reference.
    pub async fn put_blob(&self, bytes: impl Into<Bytes>) -> Result<String> {
        let bytes = bytes.into();
        let hash = blake3::hash(&bytes).to_hex().to_string();
        if self.written_lately(&hash) {
            return Ok(hash);
        }
        let reserved = self.reserve(bytes.len() as u64).await?;
        self.write_blob(hash, bytes, reserved).await
    }

    /// [`Store::put_blob`] of bytes reserved already (released when no write is needed).
    pub(crate) async fn put_blob_reserved(
        &self,
        bytes: Bytes,
        reserved: crate::usage::Reservation,
    ) -> Result<String> {
        let hash = blake3::hash(&bytes).to_hex().to_string();
        if self.written_lately(&hash) {
            return Ok(hash);
        }
        self.write_blob(hash, bytes, reserved).await
    }

    /// Whether this store wrote blob `hash` moments ago: young enough for gc's grace, so it need
    /// not be written again.
    fn written_lately(&self, hash: &str) -> bool {
        self.inner.recent_blobs.contains_key(&self.cache_slot(hash))
    }

    async fn write_blob(
        &self,
        hash: String,
        bytes: Bytes,
        reserved: crate::usage::Reservation,
    ) -> Result<String> {
        let key = self.layout().blob(&hash)?;
        self.write_reserved(&key, bytes.into(), reserved).await?;
        self.inner.recent_blobs.insert(self.cache_slot(&hash), ());
        Ok(hash)
    }

    /// Streams `reader` into a blob without holding it in memory; returns the hash and size.
    ///
    /// The bytes go to a staging key (multipart once they exceed
    /// [`StoreOptions::upload_part_bytes`](crate::StoreOptions::upload_part_bytes)) and are renamed to `v1/blobs/<hash>` when complete. If the
    /// reader or the backend fails, the multipart upload is aborted and nothing becomes visible
    /// under `v1/blobs`; a staging object left by a killed host is removed by [`gc`](Self::gc).
    pub async fn put_blob_reader<R>(&self, mut reader: R) -> Result<(String, u64)>
    where
        R: AsyncRead + Unpin + Send,
    {
        self.record_tenant().await?;
        let staging = self.layout().staging(&staging_name());
        let mut writer = object_store::buffered::BufWriter::with_capacity(
            Arc::clone(&self.inner.os),
            staging.clone(),
            self.inner.options.upload_part_bytes,
        );
        let mut hasher = blake3::Hasher::new();
        let (size, reserved) = self
            .stream_into(&mut reader, &mut writer, &staging, |chunk| {
                hasher.update(chunk);
            })
            .await?;
        writer.shutdown().await.map_err(|e| {
            let source = object_store::Error::Generic {
                store: "upload",
                source: Box::new(e),
            };
            self.backend_err("put", &staging, source)
        })?;
        let hash = hasher.finalize().to_hex().to_string();
        let key = self.layout().blob(&hash)?;
        // A rename is atomic locally; on S3 it is a server-side copy (atomic) then a delete.
        self.inner
            .os
            .rename(&staging, &key)
            .await
            .map_err(|e| self.backend_err("rename", &staging, e))?;
        reserved
            .into_iter()
            .for_each(crate::usage::Reservation::commit);
        Ok((hash, size))
    }

    /// Streams a file the run made into a blob, without holding it in memory, and describes it as an
    /// artifact named `name` (its preview from the first 64 KiB). List it in [`RunRecord::stored`](crate::RunRecord::stored).
    pub async fn put_artifact_stream<R>(&self, name: &str, mut reader: R) -> Result<Artifact>
    where
        R: AsyncRead + Unpin + Send,
    {
        const PREVIEW_BYTES: usize = 64 * 1024;
        let mut head = Vec::with_capacity(PREVIEW_BYTES);
        (&mut reader)
            .take(PREVIEW_BYTES as u64)
            .read_to_end(&mut head)
            .await
            .map_err(|source| Error::Source { source })?;
        let preview = preview(name, &head);
        let (id, bytes) = self
            .put_blob_reader(std::io::Cursor::new(head).chain(reader))
            .await?;
        Ok(Artifact {
            id,
            name: name.to_owned(),
            kind: ArtifactKind::File,
            bytes,
            preview,
        })
    }

    /// The bytes of the artifact (blob) `id`.
    pub async fn get_run_artifact(&self, id: &str) -> Result<Bytes> {
        let key = self.layout().blob(id)?;
        self.read(&key)
            .await?
            .ok_or_else(|| self.not_found("artifact", id))
    }

    /// The size of the artifact (blob) `id`, without reading it.
    pub async fn artifact_size(&self, id: &str) -> Result<u64> {
        let key = self.layout().blob(id)?;
        match self.inner.os.head(&key).await {
            Ok(meta) => Ok(meta.size),
            Err(object_store::Error::NotFound { .. }) => Err(self.not_found("artifact", id)),
            Err(e) => Err(self.backend_err("head", &key, e)),
        }
    }

    /// A slice of the artifact (blob) `id`: `length` bytes from `offset` (to its end without one),
    /// clamped to what it holds, and its whole size. Costs the slice, never the whole artifact (a
    /// ranged read on every backend). A slice over `max` bytes is [`Error::TooLarge`].
    pub async fn get_run_artifact_range(
        &self,
        id: &str,
        offset: u64,
        length: Option<u64>,
        max: u64,
    ) -> Result<(Bytes, u64)> {
        let total = self.artifact_size(id).await?;
        let start = offset.min(total);
        let end = length.map_or(total, |n| start.saturating_add(n).min(total));
        if end - start > max {
            return Err(Error::TooLarge {
                what: format!("the slice of artifact {id}"),
                bytes: end - start,
                limit: max,
            });
        }
        if start == end {
            return Ok((Bytes::new(), total));
        }
        let key = self.layout().blob(id)?;
        match self.inner.os.get_range(&key, start..end).await {
            Ok(bytes) => Ok((bytes, total)),
            Err(object_store::Error::NotFound { .. }) => Err(self.not_found("artifact", id)),
            Err(e) => Err(self.backend_err("get", &key, e)),
        }
    }

    /// The bytes of the artifact (blob) `id` as a stream of chunks, for large files.
    pub async fn get_run_artifact_stream(
        &self,
        id: &str,
    ) -> Result<BoxStream<'static, Result<Bytes>>> {
        let key = self.layout().blob(id)?;
        let got = match self.inner.os.get(&key).await {
            Ok(got) => got,
            Err(object_store::Error::NotFound { .. }) => return Err(self.not_found("artifact", id)),
            Err(e) => return Err(self.backend_err("get", &key, e)),
        };
        let store = self.inner.url.clone();
        Ok(got
            .into_stream()
            .map_err(move |source| Error::Backend {
                op: "get",
                key: key.to_string(),
                store: store.clone(),
                source: Box::new(source),
            })
            .boxed())
    }
}

impl Store {
    /// Streams `reader` into `writer` chunk by chunk, each reserved against the tenant's quota before
    /// it is sent and shown to `each`; the bytes and the reservations to commit once the object is
    /// complete. On a failure (the reader's, the quota's, the backend's) the writer is aborted.
    pub(crate) async fn stream_into<R>(
        &self,
        reader: &mut R,
        writer: &mut object_store::buffered::BufWriter,
        key: &object_store::path::Path,
        mut each: impl FnMut(&[u8]),
    ) -> Result<(u64, Vec<crate::usage::Reservation>)>
    where
        R: AsyncRead + Unpin + Send,
    {
        const CHUNK: usize = 256 * 1024;
        let mut size = 0u64;
        let mut reserved = Vec::new();
        loop {
            let mut buf = BytesMut::with_capacity(CHUNK);
            let n = match reader.read_buf(&mut buf).await {
                Ok(n) => n,
                Err(source) => {
                    let _ = writer.abort().await; // best effort: the source error is the news
                    return Err(Error::Source { source });
                }
            };
            if n == 0 {
                return Ok((size, reserved));
            }
            match self.reserve(n as u64).await {
                Ok(reservation) => reserved.push(reservation),
                Err(e) => {
                    let _ = writer.abort().await;
                    return Err(e);
                }
            }
            each(&buf);
            size += n as u64;
            if let Err(e) = writer.put(buf.freeze()).await {
                let _ = writer.abort().await;
                return Err(self.backend_err("put", key, e));
            }
        }
    }
}

/// A unique staging object name: time, pid and randomness, so hosts sharing a bucket never collide.
fn staging_name() -> String {
    let mut random = [0u8; 8];
    // Without randomness time + pid + counter is still unique on this host.
    let _ = getrandom::fill(&mut random);
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!(
        "{}-{}-{n}-{}",
        to_ms(SystemTime::now()),
        std::process::id(),
        u64::from_le_bytes(random)
    )
}
