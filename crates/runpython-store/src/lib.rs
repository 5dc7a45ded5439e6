//! runpython-store: where runs and artifacts live.
//!
//! It will own the backends chosen by URL (`file://`, `memory://`, `s3://`) through `object_store`, a
//! versioned key layout, content-addressed blobs, run manifests, retention tiers, redaction and the memo
//! cache. Today it holds only the versioned key layout's root, so the crate graph is in place; it must
//! never depend on another runpython crate.
//!
//! ```
//! assert_eq!(runpython_store::LAYOUT_VERSION, "v1");
//! ```

/// The first segment of every key this crate writes; bumped when the layout changes.
pub const LAYOUT_VERSION: &str = "v1";
