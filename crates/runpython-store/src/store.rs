//! The [`Store`]: blobs, run manifests, retention and gc.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use futures_util::stream::{StreamExt, TryStreamExt};
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};

use crate::artifact::{Artifact, ArtifactKind, ListedArtifact, RunFile, SkippedFile};
use crate::backend::{self, StoreOptions};
use crate::error::{Error, Result};
use crate::layout::{self, Layout};
use crate::memo_cache::{self, MemoCache};
use crate::preview::preview;
use crate::record::{
    self, from_ms, to_ms, ManifestRecord, ManifestV1, ManifestV2, SkippedFileV1, TierV1,
};

/// How long a run is kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tier {
    /// Removed by [`Store::gc`] once `ttl` has passed since the run was created, and invisible to
    /// reads from then on.
    Ephemeral {
        /// Lifetime from `created_at`.
        ttl: Duration,
    },
    /// Kept until [`Store::delete_run`].
    Persistent,
}

impl Tier {
    /// The default lifetime of an ephemeral run: 24 hours.
    pub const DEFAULT_TTL: Duration = Duration::from_secs(24 * 60 * 60);

    /// An ephemeral tier with the default lifetime.
    pub const fn ephemeral() -> Self {
        Self::Ephemeral {
            ttl: Self::DEFAULT_TTL,
        }
    }
}

impl Default for Tier {
    fn default() -> Self {
        Self::ephemeral()
    }
}

/// A run's manifest names at most this many of the entries it left and were not kept; the rest are
/// counted by reason.
const MAX_SKIPPED_NAMED: usize = 32;

/// Everything a run keeps, as the core hands it over (already redacted).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunRecord {
    /// Identity: ASCII letters, digits, `-`, `_`, `.`; at most 128 characters.
    pub run_id: String,
    /// When the run started.
    pub created_at: SystemTime,
    /// How long it is kept.
    pub tier: Tier,
    /// The code that ran.
    pub script: String,
    /// Captured stdout.
    pub stdout: String,
    /// Captured stderr.
    pub stderr: String,
    /// The full return value as JSON text (`"null"` when there is none).
    pub return_value_json: String,
    /// The resolved dependency list.
    pub deps: Vec<String>,
    /// Fingerprint of the Python environment the run used.
    pub env_fingerprint: String,
    /// The isolation report, as JSON text.
    pub isolation_json: String,
    /// Files the code created (the sandbox's `collect_files` gathers them).
    pub files: Vec<RunFile>,
    /// Files seen but not kept, and why: the first few (at most `MAX_SKIPPED_NAMED`).
    pub skipped_files: Vec<SkippedFile>,
    /// Every entry seen but not kept, counted by reason.
    pub skipped_counts: std::collections::BTreeMap<String, u64>,
    /// Artifacts already in the store (streamed there while the run ran, see
    /// [`Store::put_artifact_stream`]), listed in the manifest as they are: stdout and stderr after
    /// the script, the rest after the files. Leave `stdout`/`stderr` empty when they are among these.
    pub stored: Vec<Artifact>,
}

/// A stored run: its metadata and the artifacts whose bytes [`Store::get_run_artifact`] returns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunManifest {
    /// Identity.
    pub run_id: String,
    /// When the run started (millisecond precision).
    pub created_at: SystemTime,
    /// How long it is kept.
    pub tier: Tier,
    /// When an ephemeral run expires.
    pub expires_at: Option<SystemTime>,
    /// The resolved dependency list.
    pub deps: Vec<String>,
    /// Fingerprint of the Python environment.
    pub env_fingerprint: String,
    /// The isolation report, as JSON text.
    pub isolation_json: String,
    /// Kept items: script always; stdout and stderr when not empty; the return value when not
    /// `null`; then the files.
    pub artifacts: Vec<Artifact>,
    /// Files seen but not kept, and why: the first few.
    pub skipped_files: Vec<SkippedFile>,
    /// Every entry seen but not kept, counted by reason.
    pub skipped_counts: std::collections::BTreeMap<String, u64>,
}

impl RunManifest {
    /// The first artifact of `kind` (the script, stdout, stderr or return value).
    pub fn artifact(&self, kind: ArtifactKind) -> Option<&Artifact> {
        self.artifacts.iter().find(|a| a.kind == kind)
    }

    pub(crate) fn is_expired(&self, now: SystemTime) -> bool {
        self.expires_at.is_some_and(|t| t <= now)
    }
}

/// What a listing found, and the manifests it skipped because they cannot be read (corrupt, or written
/// by a newer runpython): one bad manifest does not hide every other run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listing<T> {
    /// Oldest run first.
    pub items: Vec<T>,
    /// Keys of the manifests that could not be read, sorted.
    pub unreadable: Vec<String>,
}

/// Where runs, artifacts and memo entries live. Cheap to clone; clones share the backend and cache.
#[derive(Clone)]
pub struct Store {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) os: Arc<dyn ObjectStore>,
    /// The URL without query options, for messages.
    pub(crate) url: String,
    pub(crate) options: StoreOptions,
    pub(crate) memo: MemoCache,
    /// Blobs this store wrote recently, and when: a blob rewritten within a quarter of the gc grace
    /// period is skipped (its age is young enough that gc keeps it until the manifest lands).
    pub(crate) recent_blobs: moka::sync::Cache<String, ()>,
    /// Where this store's keys live: the default tenant's layout, or a named tenant's.
    pub(crate) layout: Layout,
    /// The tenant this store is scoped to (`None`: the default tenant).
    pub(crate) tenant: Option<String>,
    /// The named tenants' stores made from this one (shared by all of them), so each keeps its
    /// caches.
    pub(crate) tenants: Arc<Mutex<HashMap<String, Store>>>,
    /// A named tenant's record (its name, for listings) is written before its first object.
    pub(crate) recorded: std::sync::atomic::AtomicBool,
    /// Bytes stored under this tenant's root, as last counted, being written, and its quota.
    pub(crate) usage: Arc<Mutex<crate::usage::Usage>>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("url", &self.inner.url)
            .finish_non_exhaustive()
    }
}

/// Concurrent requests when writing or reading many objects.
pub(crate) const FAN_OUT: usize = 8;

impl Store {
    /// Opens the store at `url` with default options: `file:///abs/path` (created if missing),
    /// `memory://`, or `s3://bucket/prefix` (feature `s3`; endpoint, region, credentials and
    /// `allow_http` from the standard `AWS_*` variables or the URL's query options, e.g.
    /// `s3://bucket/runs?endpoint=http://127.0.0.1:9000&region=us-east-1&allow_http=true`).
    pub fn open(url: &str) -> Result<Self> {
        Self::open_with(url, StoreOptions::default())
    }

    /// Opens the store at `url` with `options`.
    pub fn open_with(url: &str, options: StoreOptions) -> Result<Self> {
        let (os, url) = backend::open(url, &options)?;
        Ok(Self::with_backend(url, os, options))
    }

    /// A store over a backend the caller built: any [`ObjectStore`] of the re-exported
    /// [`object_store`](crate::object_store) crate (Google Cloud Storage, Azure, an S3 client with
    /// credentials of your own, a [`PrefixStore`](object_store::prefix::PrefixStore) per tenant, a
    /// wrapper that adds metrics). `name` stands for it in messages, so it must hold no secret.
    ///
    /// The backend must keep object_store's contract that a `put` is atomic (readers see the old
    /// object or the new one); [`conformance::run_all`](crate::conformance::run_all) checks a backend
    /// against everything the store relies on.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use runpython_store::object_store::{memory::InMemory, prefix::PrefixStore};
    /// use runpython_store::{Store, StoreOptions};
    ///
    /// let shared = Arc::new(InMemory::new());
    /// let tenant = PrefixStore::new(Arc::clone(&shared), "tenants/a");
    /// let store = Store::with_backend("memory (tenant a)", Arc::new(tenant), StoreOptions::default());
    /// assert_eq!(store.url(), "memory (tenant a)");
    /// ```
    pub fn with_backend(
        name: impl Into<String>,
        backend: Arc<dyn ObjectStore>,
        options: StoreOptions,
    ) -> Self {
        let os = backend;
        let url = name.into();
        let memo = memo_cache::new_cache(options.memo_cache_bytes);
        let recent_blobs = moka::sync::Cache::builder()
            .max_capacity(100_000)
            .time_to_live(options.gc_grace / 4)
            .build();
        Self {
            inner: Arc::new(Inner {
                os,
                url,
                options,
                memo,
                recent_blobs,
                layout: Layout::default_tenant(),
                tenant: None,
                tenants: Arc::default(),
                recorded: true.into(),
                usage: Arc::default(),
            }),
        }
    }

    /// A store over this one's backend with `layout`, sharing its caches (their keys start with the
    /// layout's root, [`Store::cache_slot`]: one bound for every tenant of the process) and its
    /// tenants' map.
    pub(crate) fn sibling(&self, layout: Layout, tenant: Option<String>) -> Store {
        let options = self.inner.options.clone();
        Store {
            inner: Arc::new(Inner {
                os: Arc::clone(&self.inner.os),
                url: self.inner.url.clone(),
                memo: self.inner.memo.clone(),
                recent_blobs: self.inner.recent_blobs.clone(),
                options,
                layout,
                recorded: tenant.is_none().into(),
                tenant,
                tenants: Arc::clone(&self.inner.tenants),
                usage: Arc::default(),
            }),
        }
    }

    pub(crate) fn layout(&self) -> &Layout {
        &self.inner.layout
    }

    /// The key of `key` in the caches tenants share: under this store's root, so no tenant's entry
    /// is another's.
    pub(crate) fn cache_slot(&self, key: &str) -> String {
        format!("{}/{key}", self.inner.layout.root())
    }

    /// The store's URL, without query options (or the name given to [`with_backend`](Self::with_backend)).
    pub fn url(&self) -> &str {
        &self.inner.url
    }

    pub(crate) fn backend_err(
        &self,
        op: &'static str,
        key: &Path,
        source: object_store::Error,
    ) -> Error {
        Error::Backend {
            op,
            key: key.to_string(),
            store: self.inner.url.clone(),
            source: Box::new(source),
        }
    }

    pub(crate) fn not_found(&self, what: &'static str, id: &str) -> Error {
        Error::NotFound {
            what,
            id: id.to_owned(),
            store: self.inner.url.clone(),
        }
    }

    /// Reads a whole object; `Ok(None)` when it does not exist.
    pub(crate) async fn read(&self, key: &Path) -> Result<Option<Bytes>> {
        let got = match self.inner.os.get(key).await {
            Ok(got) => got,
            Err(object_store::Error::NotFound { .. }) => return Ok(None),
            Err(e) => return Err(self.backend_err("get", key, e)),
        };
        match got.bytes().await {
            Ok(b) => Ok(Some(b)),
            // Deleted between the response head and its body.
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(self.backend_err("get", key, e)),
        }
    }

    /// Writes a whole object in one request (atomic on every backend).
    pub(crate) async fn write(&self, key: &Path, bytes: impl Into<PutPayload>) -> Result<()> {
        let payload: PutPayload = bytes.into();
        let reserved = self.reserve(payload.content_length() as u64).await?;
        self.write_reserved(key, payload, reserved).await
    }

    /// Writes a whole object whose bytes are reserved already.
    pub(crate) async fn write_reserved(
        &self,
        key: &Path,
        payload: PutPayload,
        reserved: crate::usage::Reservation,
    ) -> Result<()> {
        self.record_tenant().await?;
        self.inner
            .os
            .put(key, payload)
            .await
            .map(drop)
            .map_err(|e| self.backend_err("put", key, e))?;
        reserved.commit();
        Ok(())
    }

    /// Deletes an object; a missing one is not an error.
    pub(crate) async fn remove(&self, key: &Path) -> Result<()> {
        match self.inner.os.delete(key).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(self.backend_err("delete", key, e)),
        }
    }

    pub(crate) async fn list(&self, dir: &str) -> Result<Vec<object_store::ObjectMeta>> {
        let prefix = layout::prefix(dir);
        self.inner
            .os
            .list(Some(&prefix))
            .try_collect()
            .await
            .map_err(|e| self.backend_err("list", &prefix, e))
    }

    // ---- runs ----

    /// Keeps a run: every item becomes a blob, then the manifest is written (in that order, so a
    /// manifest never references a missing blob). Returns the manifest, whose artifacts go into the
    /// envelope. Writing the same run id again replaces its manifest.
    pub async fn put_run(&self, run: RunRecord) -> Result<RunManifest> {
        let key = self.layout().run(&run.run_id)?;
        let mut items: Vec<(ArtifactKind, String, Bytes)> = vec![(
            ArtifactKind::Script,
            "script.py".into(),
            Bytes::from(run.script),
        )];
        if !run.stdout.is_empty() {
            items.push((ArtifactKind::Stdout, "stdout.txt".into(), run.stdout.into()));
        }
        if !run.stderr.is_empty() {
            items.push((ArtifactKind::Stderr, "stderr.txt".into(), run.stderr.into()));
        }
        let rv = run.return_value_json.trim();
        if !rv.is_empty() && rv != "null" {
            items.push((
                ArtifactKind::ReturnValue,
                "return_value.json".into(),
                run.return_value_json.into(),
            ));
        }
        for f in run.files {
            items.push((ArtifactKind::File, f.name, f.bytes.into()));
        }
        // All of them are reserved at once: a run whose outputs do not fit its tenant's quota
        // writes none of them (rather than the first few, which nothing would list).
        let mut reserved = self
            .reserve(items.iter().map(|(_, _, b)| b.len() as u64).sum())
            .await?;
        let items: Vec<_> = items
            .into_iter()
            .map(|item| {
                let part = reserved.split(item.2.len() as u64);
                (item, part)
            })
            .collect();
        let artifacts: Vec<Artifact> = futures_util::stream::iter(items)
            .map(|((kind, name, bytes), part)| async move {
                let preview = preview(&name, &bytes);
                let len = bytes.len() as u64;
                let id = self.put_blob_reserved(bytes, part).await?;
                Ok::<_, Error>(Artifact {
                    id,
                    name,
                    kind,
                    bytes: len,
                    preview,
                })
            })
            .buffered(FAN_OUT)
            .try_collect()
            .await?;
        let mut artifacts = artifacts;
        // Output streamed whole while the run ran goes where the manifest lists output: after the
        // script.
        let (output, other): (Vec<Artifact>, Vec<Artifact>) = run
            .stored
            .into_iter()
            .partition(|a| matches!(a.kind, ArtifactKind::Stdout | ArtifactKind::Stderr));
        artifacts.splice(1..1, output);
        artifacts.extend(other);
        let created_at_ms = to_ms(run.created_at);
        let tier = match run.tier {
            Tier::Persistent => TierV1::Persistent,
            Tier::Ephemeral { ttl } => TierV1::Ephemeral {
                expires_at_ms: created_at_ms
                    .saturating_add(u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX)),
            },
        };
        let record = ManifestRecord::V2(ManifestV2 {
            v1: ManifestV1 {
                run_id: run.run_id,
                created_at_ms,
                tier,
                deps: run.deps,
                env_fingerprint: run.env_fingerprint,
                isolation_json: run.isolation_json,
                artifacts: artifacts.iter().map(Into::into).collect(),
                skipped_files: run
                    .skipped_files
                    .into_iter()
                    .take(MAX_SKIPPED_NAMED)
                    .map(|s| SkippedFileV1 {
                        name: s.name,
                        reason: s.reason,
                    })
                    .collect(),
            },
            skipped_counts: run.skipped_counts.into_iter().collect(),
        });
        self.write(&key, record::encode(&record)?).await?;
        Ok(manifest_from(record))
    }

    /// The run `run_id`. An ephemeral run past its lifetime is [`Error::NotFound`], even before gc
    /// removes it.
    pub async fn get_run(&self, run_id: &str) -> Result<RunManifest> {
        match self.read_manifest(run_id).await? {
            Some(m) if !m.is_expired(SystemTime::now()) => Ok(m),
            _ => Err(self.not_found("run", run_id)),
        }
    }

    pub(crate) async fn read_manifest(&self, run_id: &str) -> Result<Option<RunManifest>> {
        let key = self.layout().run(run_id)?;
        let Some(bytes) = self.read(&key).await? else {
            return Ok(None);
        };
        let record: ManifestRecord = record::decode(key.as_ref(), &bytes)?;
        Ok(Some(manifest_from(record)))
    }

    /// Every live run, oldest first. A manifest that cannot be decoded is skipped and named in
    /// [`Listing::unreadable`]; a failure to reach the store fails the listing.
    pub async fn list_runs(&self) -> Result<Listing<RunManifest>> {
        let now = SystemTime::now();
        let read: Vec<Result<Option<RunManifest>>> =
            futures_util::stream::iter(self.run_ids().await?)
                .map(|id| async move { self.read_manifest(&id).await })
                .buffer_unordered(FAN_OUT)
                .collect()
                .await;
        let mut runs = Vec::with_capacity(read.len());
        let mut unreadable = Vec::new();
        for manifest in read {
            match manifest {
                Ok(Some(m)) if !m.is_expired(now) => runs.push(m),
                Ok(_) => {}
                Err(Error::CorruptRecord { key, .. } | Error::UnsupportedVersion { key, .. }) => {
                    unreadable.push(key);
                }
                Err(e) => return Err(e),
            }
        }
        runs.sort_by(|a, b| (a.created_at, &a.run_id).cmp(&(b.created_at, &b.run_id)));
        unreadable.sort();
        Ok(Listing {
            items: runs,
            unreadable,
        })
    }

    pub(crate) async fn run_ids(&self) -> Result<Vec<String>> {
        Ok(self
            .list(&self.layout().runs())
            .await?
            .iter()
            .filter_map(|m| layout::file_name(&m.location))
            .filter(|id| layout::check_run_id(id).is_ok())
            .map(str::to_owned)
            .collect())
    }

    /// The artifacts of one run, or of every live run (oldest run first, unreadable manifests skipped
    /// and named as in [`list_runs`](Self::list_runs)).
    pub async fn list_artifacts(&self, run_id: Option<&str>) -> Result<Listing<ListedArtifact>> {
        let runs = match run_id {
            Some(id) => Listing {
                items: vec![self.get_run(id).await?],
                unreadable: Vec::new(),
            },
            None => self.list_runs().await?,
        };
        let items = runs
            .items
            .into_iter()
            .flat_map(|r| {
                let run_id = r.run_id;
                r.artifacts.into_iter().map(move |artifact| ListedArtifact {
                    run_id: run_id.clone(),
                    artifact,
                })
            })
            .collect();
        Ok(Listing {
            items,
            unreadable: runs.unreadable,
        })
    }

    /// Deletes the run's manifest and its checkpoint (a resumable run's state); its blobs go at the
    /// next [`gc`](Self::gc) unless another run shares them. Deleting a missing run is not an error.
    pub async fn delete_run(&self, run_id: &str) -> Result<()> {
        // Its checkpoint goes too: a run that is gone cannot be resumed (and gc must not leave them).
        self.delete_checkpoint(run_id).await?;
        self.remove(&self.layout().run(run_id)?).await
    }
}

fn manifest_from(record: ManifestRecord) -> RunManifest {
    let ManifestV2 {
        v1: m,
        skipped_counts,
    } = record.latest();
    let created_at = from_ms(m.created_at_ms);
    let (tier, expires_at) = match m.tier {
        TierV1::Persistent => (Tier::Persistent, None),
        TierV1::Ephemeral { expires_at_ms } => (
            Tier::Ephemeral {
                ttl: Duration::from_millis(expires_at_ms.saturating_sub(m.created_at_ms)),
            },
            Some(from_ms(expires_at_ms)),
        ),
    };
    RunManifest {
        run_id: m.run_id,
        created_at,
        tier,
        expires_at,
        deps: m.deps,
        env_fingerprint: m.env_fingerprint,
        isolation_json: m.isolation_json,
        artifacts: m.artifacts.into_iter().map(Into::into).collect(),
        skipped_files: m
            .skipped_files
            .into_iter()
            .map(|s| SkippedFile {
                name: s.name,
                reason: s.reason,
            })
            .collect(),
        skipped_counts: skipped_counts.into_iter().collect(),
    }
}
