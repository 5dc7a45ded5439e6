//! What a kept item looks like to the model and the CLI: `{id, name, kind, bytes, preview}`.

use serde::{Deserialize, Serialize};

use crate::record::{ArtifactKindV1, ArtifactV1};

/// Longest text preview, in characters.
pub(crate) const PREVIEW_CHARS: usize = 200;

/// What an artifact is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ArtifactKind {
    /// The code that ran.
    Script,
    /// Its standard output (after redaction).
    Stdout,
    /// Its standard error (after redaction).
    Stderr,
    /// The full return value as JSON (after redaction).
    ReturnValue,
    /// A file the code created in its run directory.
    File,
}

/// One kept item of a run, as listed in the envelope.
///
/// `id` is the blake3 hex hash of the content: artifacts are content-addressed, so identical bytes
/// from two runs share one blob and one id, and [`Store::get_run_artifact`](crate::Store::get_run_artifact)
/// fetches it without reading any manifest. The id stays valid while some run still references it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Artifact {
    /// blake3 hex of the bytes.
    pub id: String,
    /// `script.py`, `stdout.txt`, `stderr.txt`, `return_value.json`, or the file's path relative to
    /// the run directory.
    pub name: String,
    /// What it is.
    pub kind: ArtifactKind,
    /// Size in bytes.
    pub bytes: u64,
    /// The first 200 characters of text, or the size and type of binary content.
    pub preview: String,
}

/// An artifact and the run it belongs to, as [`Store::list_artifacts`](crate::Store::list_artifacts)
/// returns it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListedArtifact {
    /// The run that kept it.
    pub run_id: String,
    /// The artifact.
    #[serde(flatten)]
    pub artifact: Artifact,
}

/// A short text head for text, else `"<n> bytes, <type>"`.
pub(crate) fn text_preview(bytes: &[u8]) -> String {
    // Text is valid UTF-8 without NULs; a cut inside a multi-byte character is tolerated at the end.
    let head = &bytes[..bytes.len().min(PREVIEW_CHARS * 4)];
    let text = match std::str::from_utf8(head) {
        Ok(t) => Some(t),
        Err(e) if e.error_len().is_none() => std::str::from_utf8(&head[..e.valid_up_to()]).ok(),
        Err(_) => None,
    };
    match text {
        Some(t) if !t.contains('\0') => {
            let mut chars = t.chars();
            let shown: String = chars.by_ref().take(PREVIEW_CHARS).collect();
            if chars.next().is_some() || head.len() < bytes.len() {
                let mut cut: String = shown.chars().take(PREVIEW_CHARS - 1).collect();
                cut.push('…');
                cut
            } else {
                shown
            }
        }
        _ => format!("{} bytes, {}", bytes.len(), sniff(bytes)),
    }
}

/// A media type from magic bytes, for previews of binary content.
pub(crate) fn sniff(bytes: &[u8]) -> &'static str {
    const MAGIC: &[(&[u8], &str)] = &[
        (b"\x89PNG\r\n\x1a\n", "image/png"),
        (b"\xff\xd8\xff", "image/jpeg"),
        (b"GIF8", "image/gif"),
        (b"%PDF-", "application/pdf"),
        (b"PK\x03\x04", "application/zip"),
        (b"\x1f\x8b", "application/gzip"),
        (b"\x93NUMPY", "application/x-npy"),
        (b"PAR1", "application/x-parquet"),
        (b"SQLite format 3\0", "application/x-sqlite3"),
    ];
    if bytes.len() >= 12 && &bytes[..4] == b"RIFF" && &bytes[8..12] == b"WEBP" {
        return "image/webp";
    }
    MAGIC
        .iter()
        .find(|(magic, _)| bytes.starts_with(magic))
        .map_or("application/octet-stream", |(_, t)| t)
}

impl From<ArtifactKindV1> for ArtifactKind {
    fn from(k: ArtifactKindV1) -> Self {
        match k {
            ArtifactKindV1::Script => Self::Script,
            ArtifactKindV1::Stdout => Self::Stdout,
            ArtifactKindV1::Stderr => Self::Stderr,
            ArtifactKindV1::ReturnValue => Self::ReturnValue,
            ArtifactKindV1::File => Self::File,
        }
    }
}

impl From<ArtifactKind> for ArtifactKindV1 {
    fn from(k: ArtifactKind) -> Self {
        match k {
            ArtifactKind::Script => Self::Script,
            ArtifactKind::Stdout => Self::Stdout,
            ArtifactKind::Stderr => Self::Stderr,
            ArtifactKind::ReturnValue => Self::ReturnValue,
            ArtifactKind::File => Self::File,
        }
    }
}

impl From<ArtifactV1> for Artifact {
    fn from(a: ArtifactV1) -> Self {
        Self {
            id: a.id,
            name: a.name,
            kind: a.kind.into(),
            bytes: a.bytes,
            preview: a.preview,
        }
    }
}

impl From<&Artifact> for ArtifactV1 {
    fn from(a: &Artifact) -> Self {
        Self {
            id: a.id.clone(),
            name: a.name.clone(),
            kind: a.kind.into(),
            bytes: a.bytes,
            preview: a.preview.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listed_artifact_reads_back_from_json_with_its_flattened_size() {
        let listed = ListedArtifact {
            run_id: "r1".into(),
            artifact: Artifact {
                id: "abc".into(),
                name: "out.csv".into(),
                kind: ArtifactKind::File,
                bytes: u64::MAX,
                preview: "a,b".into(),
            },
        };
        let json = serde_json::to_string(&listed).unwrap();
        let back: ListedArtifact = serde_json::from_str(&json).unwrap();
        assert_eq!(back, listed);
    }

    #[test]
    fn short_text_previews_are_the_text_itself() {
        assert_eq!(text_preview(b"hello\n"), "hello\n");
    }

    #[test]
    fn long_text_previews_stop_at_200_characters_with_an_ellipsis() {
        let text = "é".repeat(1000);
        let p = text_preview(text.as_bytes());
        assert_eq!(p.chars().count(), PREVIEW_CHARS);
        assert!(p.ends_with('…'));
    }

    #[test]
    fn binary_previews_give_size_and_type() {
        let png = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR";
        assert_eq!(text_preview(png), "16 bytes, image/png");
        assert_eq!(
            text_preview(&[0xff, 0x00, 0x80]),
            "3 bytes, application/octet-stream"
        );
    }

    #[test]
    fn artifact_json_has_the_envelope_field_names() {
        let a = Artifact {
            id: "h".into(),
            name: "stdout.txt".into(),
            kind: ArtifactKind::ReturnValue,
            bytes: 1,
            preview: "x".into(),
        };
        let v = serde_json::to_value(&a).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"id": "h", "name": "stdout.txt", "kind": "return_value", "bytes": 1, "preview": "x"})
        );
    }
}

/// A file to keep with a run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunFile {
    /// Path relative to the run directory, `/`-separated.
    pub name: String,
    /// Its content.
    pub bytes: Vec<u8>,
}

/// A file that was not kept, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SkippedFile {
    /// Path relative to the run directory.
    pub name: String,
    /// Why it was skipped (`symlink`, `larger than 10485760 bytes`, ...).
    pub reason: String,
}
