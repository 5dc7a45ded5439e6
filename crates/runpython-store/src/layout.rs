//! The versioned key layout. Every key starts with [`LAYOUT_VERSION`]; ids are validated before they
//! become path segments, so no caller-supplied string can escape its prefix.

use object_store::path::Path;

use crate::error::{Error, Result};

/// The first segment of every key this crate writes; bumped when the layout changes.
pub const LAYOUT_VERSION: &str = "v1";

/// Where one tenant's objects live: the layout's root (`v1` for the default tenant, whose layout is
/// the one written before tenants existed; `v1/t/<tenant key>` for a named one), and every key below
/// it. A store scoped to a tenant ([`crate::Store::tenant`]) reads and writes under its root only, so
/// no key of one tenant can be named from another.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Layout {
    root: String,
}

/// Named tenants' roots live under this.
pub(crate) const TENANTS: &str = "v1/t";

impl Layout {
    /// The default tenant's layout (the CLI's local use, a library engine without a tenant).
    pub(crate) fn default_tenant() -> Self {
        Self {
            root: LAYOUT_VERSION.into(),
        }
    }

    /// Tenant `name`'s layout.
    pub(crate) fn tenant(name: &str) -> Result<Self> {
        Ok(Self {
            root: format!("{TENANTS}/{}", tenant_key(name)?),
        })
    }

    /// The root every key of this layout starts with.
    pub(crate) fn root(&self) -> &str {
        &self.root
    }

    pub(crate) fn blobs(&self) -> String {
        format!("{}/blobs", self.root)
    }
    pub(crate) fn runs(&self) -> String {
        format!("{}/runs", self.root)
    }
    pub(crate) fn memos(&self) -> String {
        format!("{}/memo", self.root)
    }
    /// Checkpoints of resumable runs (request, journal, state), opaque to the store.
    pub(crate) fn checkpoints(&self) -> String {
        format!("{}/checkpoints", self.root)
    }
    /// What durable runs append to their checkpoints (a journal entry per change of a call, and the
    /// large values those entries hold by digest), opaque to the store; deleted with the checkpoint.
    pub(crate) fn all_checkpoint_parts(&self) -> String {
        format!("{}/checkpoint-parts", self.root)
    }
    /// Streamed uploads land here before their hash is known; gc removes leftovers past the grace
    /// period.
    pub(crate) fn stagings(&self) -> String {
        format!("{}/staging", self.root)
    }

    pub(crate) fn blob(&self, hash: &str) -> Result<Path> {
        check_hex(hash, "artifact id")?;
        Ok(Path::from(format!("{}/{hash}", self.blobs())))
    }

    pub(crate) fn run(&self, run_id: &str) -> Result<Path> {
        check_run_id(run_id)?;
        Ok(Path::from(format!("{}/{run_id}", self.runs())))
    }

    pub(crate) fn checkpoint(&self, run_id: &str) -> Result<Path> {
        check_run_id(run_id)?;
        Ok(Path::from(format!("{}/{run_id}", self.checkpoints())))
    }

    /// Where the parts of run `run_id`'s checkpoint live.
    pub(crate) fn checkpoint_parts(&self, run_id: &str) -> Result<String> {
        check_run_id(run_id)?;
        Ok(format!("{}/{run_id}", self.all_checkpoint_parts()))
    }

    /// Part `name` of run `run_id`'s checkpoint.
    pub(crate) fn checkpoint_part(&self, run_id: &str, name: &str) -> Result<Path> {
        check_part_name(name)?;
        Ok(Path::from(format!(
            "{}/{name}",
            self.checkpoint_parts(run_id)?
        )))
    }

    /// A session's record. Session ids may hold `:` (a client's scope): they are hex-encoded into
    /// the key (long ones hashed, see `session_hex`) so that no id can be mistaken for another or
    /// escape its prefix.
    pub(crate) fn session(&self, id: &str) -> Result<Path> {
        Ok(Path::from(format!(
            "{}/sessions/{}",
            self.root,
            session_hex(id)?
        )))
    }

    /// Where the parts of session `id`'s record live (under their own prefix: on a local store a
    /// key cannot be both an object and a directory).
    pub(crate) fn session_parts(&self, id: &str) -> Result<String> {
        Ok(format!("{}/session-parts/{}", self.root, session_hex(id)?))
    }

    /// Part `n` of session `id`'s record (zero-padded, so a listing sorts in order).
    pub(crate) fn session_part(&self, id: &str, n: u64) -> Result<Path> {
        Ok(Path::from(format!("{}/{n:020}", self.session_parts(id)?)))
    }

    /// Session `id`'s snapshot (one, the latest; beside its numbered parts, deleted with them).
    pub(crate) fn session_snapshot(&self, id: &str) -> Result<Path> {
        Ok(Path::from(format!("{}/snapshot", self.session_parts(id)?)))
    }

    /// A value `name` kept with session `id`'s record (beside its numbered parts).
    pub(crate) fn session_value(&self, id: &str, name: &str) -> Result<Path> {
        check_part_name(name)?;
        Ok(Path::from(format!("{}/v-{name}", self.session_parts(id)?)))
    }

    pub(crate) fn memo(&self, key: &str) -> Result<Path> {
        check_hex(key, "memo key")?;
        Ok(Path::from(format!("{}/{key}", self.memos())))
    }

    pub(crate) fn staging(&self, name: &str) -> Path {
        Path::from(format!("{}/{name}", self.stagings()))
    }

    /// What this tenant's record (its name, for listings) is kept as.
    pub(crate) fn tenant_record(&self) -> Path {
        Path::from(format!("{}/tenant", self.root))
    }
}

/// A tenant's key segment: its name in hex, or `b3-` and its blake3 past 100 bytes (a file name's
/// limit), so any name is one safe segment and no two names share one.
fn tenant_key(name: &str) -> Result<String> {
    if name.is_empty() || name.len() > 256 {
        return Err(Error::InvalidId {
            what: "tenant",
            value: name.to_owned(),
            reason: "must be 1 to 256 bytes long",
        });
    }
    if name.len() > 100 {
        return Ok(format!("b3-{}", blake3::hash(name.as_bytes()).to_hex()));
    }
    Ok(name.bytes().map(|b| format!("{b:02x}")).collect())
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
            assert!(
                Layout::default_tenant().run(bad).is_err(),
                "{bad:?} accepted"
            );
        }
        let layout = Layout::default_tenant();
        assert_eq!(
            layout.run("run-1_a.b").unwrap().as_ref(),
            "v1/runs/run-1_a.b"
        );
        let alice = Layout::tenant("alice").unwrap();
        assert_eq!(alice.run("r").unwrap().as_ref(), "v1/t/616c696365/runs/r");
        assert!(Layout::tenant("").is_err());
        assert!(Layout::tenant(&"x".repeat(200))
            .unwrap()
            .root()
            .contains("/b3-"));
    }

    #[test]
    fn blob_keys_accept_only_blake3_hex() {
        let h = blake3::hash(b"x").to_hex().to_string();
        let layout = Layout::default_tenant();
        assert_eq!(layout.blob(&h).unwrap().as_ref(), format!("v1/blobs/{h}"));
        assert!(layout.blob("ABC").is_err());
        assert!(layout.blob(&h.to_uppercase()).is_err());
    }
}
