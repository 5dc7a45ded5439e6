//! The versioned key layout. Every key starts with [`LAYOUT_VERSION`]; ids are validated before they
//! become path segments, so no caller-supplied string can escape its prefix.

use object_store::path::Path;

use crate::error::{Error, Result};

/// The first segment of every key this crate writes; bumped when the layout changes.
pub const LAYOUT_VERSION: &str = "v1";

pub(crate) const BLOBS: &str = "v1/blobs";
pub(crate) const RUNS: &str = "v1/runs";
pub(crate) const MEMO: &str = "v1/memo";
/// Checkpoints of resumable runs (request, journal, state), opaque to the store.
pub(crate) const CHECKPOINTS: &str = "v1/checkpoints";
/// What durable runs append to their checkpoints (a journal entry per change of a call, and the
/// large values those entries hold by digest), opaque to the store; deleted with the checkpoint.
pub(crate) const CHECKPOINT_PARTS: &str = "v1/checkpoint-parts";
/// Session records (every cell with its journal), opaque to the store.
pub(crate) const SESSIONS: &str = "v1/sessions";
/// The parts of session records (one per cell), each written once, opaque to the store.
pub(crate) const SESSION_PARTS: &str = "v1/session-parts";
/// Streamed uploads land here before their hash is known; gc removes leftovers past the grace period.
pub(crate) const STAGING: &str = "v1/staging";

pub(crate) fn blob(hash: &str) -> Result<Path> {
    check_hex(hash, "artifact id")?;
    Ok(Path::from(format!("{BLOBS}/{hash}")))
}

pub(crate) fn run(run_id: &str) -> Result<Path> {
    check_run_id(run_id)?;
    Ok(Path::from(format!("{RUNS}/{run_id}")))
}

pub(crate) fn checkpoint(run_id: &str) -> Result<Path> {
    check_run_id(run_id)?;
    Ok(Path::from(format!("{CHECKPOINTS}/{run_id}")))
}

/// A session's record. Session ids may hold `:` (a client's scope): they are hex-encoded into the key
/// (long ones hashed, see `session_hex`) so that no id can be mistaken for another or escape its
/// prefix.
pub(crate) fn session(id: &str) -> Result<Path> {
    Ok(Path::from(format!("{SESSIONS}/{}", session_hex(id)?)))
}

fn session_hex(id: &str) -> Result<String> {
    if id.is_empty() || id.len() > 128 {
        return Err(Error::InvalidId {
            what: "session id",
            value: id.to_owned(),
            reason: "must be 1 to 128 characters long",
        });
    }
    // Hex keeps every id distinct and inside its prefix. Past 100 bytes its hex would crowd a file
    // name's 255-byte limit on a local store (with the `#n` of a staging file): those ids go by
    // their blake3 instead, behind `b3-`, which no hex string starts with.
    if id.len() > 100 {
        return Ok(format!("b3-{}", blake3::hash(id.as_bytes()).to_hex()));
    }
    Ok(id.bytes().map(|b| format!("{b:02x}")).collect())
}

/// Where the parts of session `id`'s record live (under their own prefix: on a local store a key
/// cannot be both an object and a directory).
pub(crate) fn session_parts(id: &str) -> Result<String> {
    Ok(format!("{SESSION_PARTS}/{}", session_hex(id)?))
}

/// Part `n` of session `id`'s record (zero-padded, so a listing sorts in order).
pub(crate) fn session_part(id: &str, n: u64) -> Result<Path> {
    Ok(Path::from(format!("{}/{n:020}", session_parts(id)?)))
}

/// Where the parts of run `run_id`'s checkpoint live.
pub(crate) fn checkpoint_parts(run_id: &str) -> Result<String> {
    check_run_id(run_id)?;
    Ok(format!("{CHECKPOINT_PARTS}/{run_id}"))
}

/// Part `name` of run `run_id`'s checkpoint.
pub(crate) fn checkpoint_part(run_id: &str, name: &str) -> Result<Path> {
    check_part_name(name)?;
    Ok(Path::from(format!("{}/{name}", checkpoint_parts(run_id)?)))
}

/// A value `name` kept with session `id`'s record (beside its numbered parts).
pub(crate) fn session_value(id: &str, name: &str) -> Result<Path> {
    check_part_name(name)?;
    Ok(Path::from(format!("{}/v-{name}", session_parts(id)?)))
}

/// Part names are the core's: a single segment of ASCII letters, digits and `-`.
fn check_part_name(name: &str) -> Result<()> {
    if !name.is_empty()
        && name.len() <= 128
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
    {
        Ok(())
    } else {
        Err(Error::InvalidId {
            what: "part name",
            value: name.to_owned(),
            reason: "must be 1 to 128 ASCII letters, digits or `-`",
        })
    }
}

pub(crate) fn memo(key: &str) -> Result<Path> {
    check_hex(key, "memo key")?;
    Ok(Path::from(format!("{MEMO}/{key}")))
}

pub(crate) fn staging(name: &str) -> Path {
    Path::from(format!("{STAGING}/{name}"))
}

pub(crate) fn prefix(dir: &str) -> Path {
    Path::from(dir)
}

/// Run ids are chosen by the core; they must be a single safe path segment.
pub(crate) fn check_run_id(run_id: &str) -> Result<()> {
    let bad = |reason| {
        Err(Error::InvalidId {
            what: "run id",
            value: run_id.to_owned(),
            reason,
        })
    };
    if run_id.is_empty() || run_id.len() > 128 {
        return bad("must be 1 to 128 characters long");
    }
    if run_id.starts_with('.') {
        return bad("must not start with `.`");
    }
    if !run_id
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
    {
        return bad("may contain only ASCII letters, digits, `-`, `_` and `.`");
    }
    Ok(())
}

/// Blob hashes and memo keys are lowercase blake3 hex (64 characters).
pub(crate) fn check_hex(value: &str, what: &'static str) -> Result<()> {
    if value.len() == 64
        && value
            .bytes()
            .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    {
        Ok(())
    } else {
        Err(Error::InvalidId {
            what,
            value: value.to_owned(),
            reason: "must be 64 lowercase hex characters (a blake3 hash)",
        })
    }
}

/// The last segment of a listed key.
pub(crate) fn file_name(path: &Path) -> Option<&str> {
    path.filename()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_ids_that_could_escape_their_prefix_are_rejected() {
        for bad in ["", "..", "../x", "a/b", ".hidden", "a b", "é"] {
            assert!(run(bad).is_err(), "{bad:?} accepted");
        }
        assert_eq!(run("run-1_a.b").unwrap().as_ref(), "v1/runs/run-1_a.b");
    }

    #[test]
    fn blob_keys_accept_only_blake3_hex() {
        let h = blake3::hash(b"x").to_hex().to_string();
        assert_eq!(blob(&h).unwrap().as_ref(), format!("v1/blobs/{h}"));
        assert!(blob("ABC").is_err());
        assert!(blob(&h.to_uppercase()).is_err());
    }
}
