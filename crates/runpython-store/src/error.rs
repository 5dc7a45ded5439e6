//! The crate's one error type.

/// Shorthand for results whose error is [`Error`].
pub(crate) type Result<T, E = Error> = std::result::Result<T, E>;

/// What went wrong in the store. Every message names the key, URL or path involved and what to do.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The store URL could not be understood.
    #[error(
        "unsupported store URL `{url}`: {reason}; use file:///absolute/path, memory:// or s3://bucket/prefix"
    )]
    InvalidUrl {
        /// The URL as given.
        url: String,
        /// Why it was rejected.
        reason: String,
    },
    /// The backend for this URL was compiled out.
    #[error("store URL `{url}` needs the `{feature}` feature of runpython-store; rebuild with it enabled")]
    FeatureDisabled {
        /// The URL as given.
        url: String,
        /// The cargo feature that provides the backend.
        feature: &'static str,
    },
    /// Neither `$XDG_DATA_HOME` nor `$HOME` is set, so there is no default local store.
    #[error("no default store location: neither XDG_DATA_HOME nor HOME is set; pass a store URL explicitly")]
    NoDefaultLocation,
    /// The local store directory could not be created.
    #[error("cannot create store directory `{path}`: {source}; check its permissions or pick another store URL")]
    CreateDir {
        /// The directory.
        path: std::path::PathBuf,
        /// The underlying failure.
        source: std::io::Error,
    },
    /// The backend rejected its configuration (bad option name or value).
    #[error("cannot configure store `{url}`: {}", error_report(.source.as_ref()))]
    Configure {
        /// The URL as given.
        url: String,
        /// What object_store reported (boxed: it is large, and errors are the cold path).
        source: Box<object_store::Error>,
    },
    /// A read, write, list or delete failed in the backend (I/O, network, permissions, timeout).
    #[error("{op} `{key}` in store `{store}` failed: {}; check that the store is reachable and writable", error_report(.source.as_ref()))]
    Backend {
        /// The operation (`put`, `get`, `list`, `delete`, `copy`).
        op: &'static str,
        /// The object key.
        key: String,
        /// The store URL (credentials never appear in it: they come from the environment or options).
        store: String,
        /// What object_store reported (boxed: it is large, and errors are the cold path).
        source: Box<object_store::Error>,
    },
    /// A write would take the tenant past its stored-bytes quota ([`crate::Store::set_quota`]);
    /// nothing of it was written.
    #[error(
        "{tenant} is over its stored-bytes quota: {used} of {quota} bytes are kept or being written and \
         this write needs {wanted} more; delete runs (gc, or artifacts by id) or raise the tenant's quota"
    )]
    QuotaExceeded {
        /// The tenant (`the default tenant` when it has no name).
        tenant: String,
        /// Bytes stored and being written, as this process counts them.
        used: u64,
        /// The quota.
        quota: u64,
        /// The bytes the refused write needed.
        wanted: u64,
    },
    /// The requested object does not exist (never written, deleted, or removed by gc).
    #[error("{what} `{id}` not found in store `{store}`; it was never stored, was deleted, or expired and was collected")]
    NotFound {
        /// What was looked up (`run`, `artifact`, `blob`).
        what: &'static str,
        /// Its id.
        id: String,
        /// The store URL.
        store: String,
    },
    /// An id or key is not safe to use as part of an object path.
    #[error("invalid {what} `{value}`: {reason}")]
    InvalidId {
        /// What kind of id (`run id`, `artifact id`, `memo key`).
        what: &'static str,
        /// The offending value.
        value: String,
        /// Which rule it breaks.
        reason: &'static str,
    },
    /// A record at rest could not be decoded.
    #[error("record `{key}` is corrupt: {reason}; delete it (or the run) and run it again")]
    CorruptRecord {
        /// The object key.
        key: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A record at rest was written by a newer (or unknown) format version.
    #[error(
        "record `{key}` is a {kind} record of version {version}, but this build reads only versions up to {supported}; upgrade runpython to read it"
    )]
    UnsupportedVersion {
        /// The object key.
        key: String,
        /// The record type (`manifest`, `memo`).
        kind: &'static str,
        /// The version tag found.
        version: u8,
        /// The newest version this build understands.
        supported: u8,
    },
    /// A read would hold more than its limit at once.
    #[error("{what} is {bytes} bytes, over the {limit}-byte limit of one read; read it in slices (offset and length)")]
    TooLarge {
        /// What was read.
        what: String,
        /// Its size.
        bytes: u64,
        /// The limit.
        limit: u64,
    },
    /// A streamed upload's source failed; nothing was published.
    #[error("reading the data for blob upload failed: {source}; nothing was stored")]
    Source {
        /// The reader's error.
        source: std::io::Error,
    },
    /// A file or directory of a run could not be read.
    #[error("cannot read `{path}`: {source}")]
    Io {
        /// The path.
        path: std::path::PathBuf,
        /// The underlying failure.
        source: std::io::Error,
    },
    /// A record could not be encoded (should not happen; report it).
    #[error("cannot encode {kind} record: {reason}")]
    Encode {
        /// The record type.
        kind: &'static str,
        /// postcard's message.
        reason: String,
    },
}

/// An error and each of its causes that its text does not already hold, joined by `: `, on one line.
///
/// object_store's errors repeat their causes in their own text (`Generic S3 error: Error performing
/// PUT ... - HTTP error: error sending request`), and printing the chain as well repeats them again;
/// the innermost cause (`operation timed out`) is often the one only the chain has. This keeps each
/// once. The store's own messages are made with it, and so is what the CLI prints.
pub fn error_report(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(e) = cause {
        let said = e.to_string();
        if !said.is_empty() && !text.contains(&said) {
            text.push_str(": ");
            text.push_str(&said);
        }
        cause = e.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("outer: {0}")]
    struct Outer(#[source] Middle);

    #[derive(Debug, thiserror::Error)]
    #[error("middle")]
    struct Middle(#[source] std::io::Error);

    #[test]
    fn a_report_says_each_cause_once() {
        let e = Outer(Middle(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "operation timed out",
        )));
        assert_eq!(error_report(&e), "outer: middle: operation timed out");
    }
}
