//! Records at rest: postcard behind a magic prefix, a record-type byte and a version byte.
//!
//! postcard does not tolerate added fields, so a record type never changes once released: a new shape
//! is a new version struct and a new enum variant (`ManifestRecord::V2`), and readers convert old
//! versions forward. The version byte is read before postcard sees the payload, so an unknown version
//! is a clear [`Error::UnsupportedVersion`] rather than a garbled decode.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{de::DeserializeOwned, Deserialize, Serialize};

use crate::error::{Error, Result};

/// A time at rest: milliseconds since the Unix epoch (0 for times before it, saturating far after).
pub(crate) fn to_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// The time [`to_ms`] wrote.
pub(crate) fn from_ms(ms: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(ms)
}

/// Every record starts with these bytes, so a stray object is told apart from a damaged record.
const MAGIC: &[u8; 4] = b"RPST";

/// A record type with versions.
pub(crate) trait Versioned: Sized {
    /// Name used in errors.
    const KIND: &'static str;
    /// Distinguishes record types, so a memo entry is never read as a manifest.
    const TAG: u8;
    /// The newest version this build writes and reads.
    const LATEST: u8;
    /// The version of this value and its postcard payload.
    fn to_payload(&self) -> (u8, postcard::Result<Vec<u8>>);
    /// `None` when this build does not know `version`.
    fn from_payload(version: u8, payload: &[u8]) -> Option<postcard::Result<Self>>;
}

pub(crate) fn encode<R: Versioned>(record: &R) -> Result<Vec<u8>> {
    let (version, payload) = record.to_payload();
    let payload = payload.map_err(|e| Error::Encode {
        kind: R::KIND,
        reason: e.to_string(),
    })?;
    let mut out = Vec::with_capacity(MAGIC.len() + 2 + payload.len());
    out.extend_from_slice(MAGIC);
    out.push(R::TAG);
    out.push(version);
    out.extend_from_slice(&payload);
    Ok(out)
}

pub(crate) fn decode<R: Versioned>(key: &str, bytes: &[u8]) -> Result<R> {
    let corrupt = |reason: String| Error::CorruptRecord {
        key: key.to_owned(),
        reason,
    };
    let rest = bytes
        .strip_prefix(MAGIC.as_slice())
        .ok_or_else(|| corrupt("missing the RPST magic prefix".into()))?;
    let [tag, version, payload @ ..] = rest else {
        return Err(corrupt("truncated header".into()));
    };
    if *tag != R::TAG {
        return Err(corrupt(format!(
            "record type tag {tag} where a {} record (tag {}) was expected",
            R::KIND,
            R::TAG
        )));
    }
    match R::from_payload(*version, payload) {
        None => Err(Error::UnsupportedVersion {
            key: key.to_owned(),
            kind: R::KIND,
            version: *version,
            supported: R::LATEST,
        }),
        Some(Err(e)) => Err(corrupt(format!(
            "{} version {version} payload does not decode: {e}",
            R::KIND
        ))),
        Some(Ok(r)) => Ok(r),
    }
}

/// Decodes a whole payload; trailing bytes mean damage.
fn exact<T: DeserializeOwned>(payload: &[u8]) -> postcard::Result<T> {
    let (value, rest) = postcard::take_from_bytes(payload)?;
    if rest.is_empty() {
        Ok(value)
    } else {
        Err(postcard::Error::DeserializeBadEncoding)
    }
}

/// A run manifest at rest. Version 2 counts the skipped files by reason (the list names the first
/// few); version 1 listed every one.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum ManifestRecord {
    V1(ManifestV1),
    V2(ManifestV2),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct ManifestV2 {
    pub v1: ManifestV1,
    /// Every skipped entry, counted by reason.
    pub skipped_counts: Vec<(String, u64)>,
}

impl ManifestRecord {
    /// The newest shape: a version 1 manifest's counts are its list's.
    pub(crate) fn latest(self) -> ManifestV2 {
        match self {
            Self::V2(m) => m,
            Self::V1(v1) => {
                let mut counts = std::collections::BTreeMap::<String, u64>::new();
                for s in &v1.skipped_files {
                    *counts.entry(s.reason.clone()).or_insert(0) += 1;
                }
                ManifestV2 {
                    v1,
                    skipped_counts: counts.into_iter().collect(),
                }
            }
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct ManifestV1 {
    pub run_id: String,
    pub created_at_ms: u64,
    pub tier: TierV1,
    pub deps: Vec<String>,
    pub env_fingerprint: String,
    pub isolation_json: String,
    pub artifacts: Vec<ArtifactV1>,
    pub skipped_files: Vec<SkippedFileV1>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum TierV1 {
    Ephemeral { expires_at_ms: u64 },
    Persistent,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct ArtifactV1 {
    pub id: String,
    pub name: String,
    pub kind: ArtifactKindV1,
    pub bytes: u64,
    pub preview: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum ArtifactKindV1 {
    Script,
    Stdout,
    Stderr,
    ReturnValue,
    File,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct SkippedFileV1 {
    pub name: String,
    pub reason: String,
}

impl Versioned for ManifestRecord {
    const KIND: &'static str = "manifest";
    const TAG: u8 = 1;
    const LATEST: u8 = 2;
    fn to_payload(&self) -> (u8, postcard::Result<Vec<u8>>) {
        match self {
            Self::V1(m) => (1, postcard::to_stdvec(m)),
            Self::V2(m) => (2, postcard::to_stdvec(m)),
        }
    }
    fn from_payload(version: u8, payload: &[u8]) -> Option<postcard::Result<Self>> {
        match version {
            1 => Some(exact(payload).map(Self::V1)),
            2 => Some(exact(payload).map(Self::V2)),
            _ => None,
        }
    }
}

/// A memo entry at rest: the envelope JSON inline (small, and read on every hit).
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum MemoRecord {
    V1(MemoV1),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct MemoV1 {
    pub created_at_ms: u64,
    /// `None`: kept until deleted.
    pub expires_at_ms: Option<u64>,
    pub envelope_json: String,
}

impl Versioned for MemoRecord {
    const KIND: &'static str = "memo";
    const TAG: u8 = 2;
    const LATEST: u8 = 1;
    fn to_payload(&self) -> (u8, postcard::Result<Vec<u8>>) {
        match self {
            Self::V1(m) => (1, postcard::to_stdvec(m)),
        }
    }
    fn from_payload(version: u8, payload: &[u8]) -> Option<postcard::Result<Self>> {
        match version {
            1 => Some(exact(payload).map(Self::V1)),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn memo() -> MemoRecord {
        MemoRecord::V1(MemoV1 {
            created_at_ms: 1,
            expires_at_ms: Some(2),
            envelope_json: "{}".into(),
        })
    }

    #[test]
    fn records_round_trip_behind_magic_tag_and_version() {
        let bytes = encode(&memo()).unwrap();
        assert_eq!(&bytes[..6], b"RPST\x02\x01");
        assert_eq!(decode::<MemoRecord>("k", &bytes).unwrap(), memo());
    }

    #[test]
    fn unknown_version_is_a_clear_unsupported_version_error() {
        let mut bytes = encode(&memo()).unwrap();
        bytes[5] = 9;
        let err = decode::<MemoRecord>("v1/memo/abc", &bytes).unwrap_err();
        assert!(
            matches!(
                err,
                Error::UnsupportedVersion {
                    version: 9,
                    supported: 1,
                    ..
                }
            ),
            "{err}"
        );
        let msg = err.to_string();
        assert!(
            msg.contains("v1/memo/abc") && msg.contains("upgrade"),
            "{msg}"
        );
    }

    #[test]
    fn a_memo_record_is_never_read_as_a_manifest() {
        let bytes = encode(&memo()).unwrap();
        let err = decode::<ManifestRecord>("k", &bytes).unwrap_err();
        assert!(matches!(err, Error::CorruptRecord { .. }), "{err}");
    }

    #[test]
    fn garbage_and_truncation_are_corrupt_record_errors() {
        for bytes in [&b"hello"[..], b"RPST", b"RPST\x02"] {
            let err = decode::<MemoRecord>("k", bytes).unwrap_err();
            assert!(matches!(err, Error::CorruptRecord { .. }), "{err}");
        }
        let mut bytes = encode(&memo()).unwrap();
        bytes.push(0);
        assert!(matches!(
            decode::<MemoRecord>("k", &bytes),
            Err(Error::CorruptRecord { .. })
        ));
        bytes.truncate(8);
        assert!(matches!(
            decode::<MemoRecord>("k", &bytes),
            Err(Error::CorruptRecord { .. })
        ));
    }
}
