//! runpython-store: where runs and artifacts live.
//!
//! It owns the backends chosen by URL (`file://`, `memory://`, `s3://` behind the default `s3`
//! feature) through `object_store`; the versioned key layout (`v1/blobs/<blake3 hex>`,
//! `v1/runs/<run id>`, `v1/memo/<key>`, `v1/staging/…`); content-addressed blobs; run manifests and
//! memo entries as postcard records behind a magic prefix and version tag; retention tiers and gc;
//! the [`Redactor`] that masks secrets before anything is persisted; and the moka cache in front of
//! memoized envelopes. [`conformance`] is the one suite every backend must pass.
//!
//! It stores opaque bytes and its own record types (the envelope arrives as JSON text) and must never
//! depend on another runpython crate.
//!
//! Writes are atomic on every backend: a reader sees the old object or the new one, never a torn
//! one (the local backend writes a staging file and renames it; S3 PUTs and completed multipart
//! uploads are atomic, and an aborted or abandoned multipart upload never becomes visible).
//!
//! ```
//! # tokio::runtime::Runtime::new().unwrap().block_on(async {
//! use runpython_store::{memo_key, Computed, RunRecord, Store, Tier};
//!
//! let store = Store::open("memory://")?;
//! let manifest = store
//!     .put_run(RunRecord {
//!         run_id: "run-1".into(),
//!         created_at: std::time::SystemTime::now(),
//!         tier: Tier::ephemeral(),
//!         script: "print('hi')".into(),
//!         stdout: "hi\n".into(),
//!         stderr: String::new(),
//!         return_value_json: "null".into(),
//!         deps: vec![],
//!         env_fingerprint: "cpython-3.12".into(),
//!         isolation_json: "{}".into(),
//!         files: vec![],
//!         skipped_files: vec![],
//!         skipped_counts: Default::default(),
//!         stored: vec![],
//!     })
//!     .await?;
//! let stdout = manifest.artifacts.iter().find(|a| a.name == "stdout.txt").unwrap();
//! assert_eq!(&store.get_run_artifact(&stdout.id).await?[..], b"hi\n");
//!
//! let key = memo_key(["print('hi')", "deps", "{}", "3.12", "runner-1", "tools-0"]);
//! let first = store
//!     .memoized(&key, None, || async { Ok::<_, runpython_store::Error>(Computed::keep("{}")) })
//!     .await
//!     .map_err(|e| e.to_string())
//!     .unwrap();
//! assert!(!first.cached);
//! assert_eq!(store.get_memo(&key).await?.as_deref(), Some("{}"));
//! # Ok::<(), runpython_store::Error>(())
//! # }).unwrap();
//! ```

mod artifact;
mod backend;
mod blobs;
pub mod conformance;
mod error;
mod gc;
mod layout;
mod memo;
mod memo_cache;
mod preview;
mod quota;
mod record;
mod redact;
mod resumable;
mod store;
mod tenants;
mod usage;

/// The bytes this crate's reads return (re-exported so callers need not depend on `bytes`).
pub use bytes::Bytes;
/// The `object_store` this crate is built on, for [`Store::with_backend`]: build a backend with the
/// same version of the crate.
pub use object_store;

pub use artifact::{Artifact, ArtifactKind, ListedArtifact, RunFile, SkippedFile};
pub use backend::{default_local_url, StoreOptions};
pub use error::{error_report, Error};
pub use gc::GcReport;
pub use layout::LAYOUT_VERSION;
pub use memo::{memo_key, Computed, MemoKey, Memoized};
pub use quota::RECOUNT as QUOTA_RECOUNT;
pub use redact::{Redactor, MIN_SECRET_LEN};
pub use resumable::StoredCheckpoint;
pub use store::{Listing, RunManifest, RunRecord, Store, Tier};
pub use tenants::Held;
