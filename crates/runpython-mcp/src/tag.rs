//! How logs name what must never be written whole: an MCP session id is a bearer capability (who
//! presents it, with the token that made it, acts in the session), so a log line carries a short
//! digest of it instead, enough to follow one session through a host's log and a proxy's (which
//! shows whole ids): `"s-" + sha256(id).hexdigest()[:12]` in Python.

use sha2::{Digest, Sha256};

/// The log's name for session id `id`: `s-` and twelve hex digits of its SHA-256.
pub(crate) fn session_tag(id: &str) -> String {
    format!("s-{}", short_hex(id.as_bytes()))
}

/// Twelve hex digits of the SHA-256 of `bytes`.
pub(crate) fn short_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .take(6)
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_is_logged_by_a_digest_that_holds_none_of_its_id() {
        let id = "0e4f6d2c-8b7a-4c1e-9f3d-2a6b8c0d1e2f";
        let tag = session_tag(id);
        assert_eq!(tag, session_tag(id));
        assert_ne!(tag, session_tag("0e4f6d2c-8b7a-4c1e-9f3d-2a6b8c0d1e30"));
        assert_eq!(tag.len(), 14);
        // What a log reader computes: "s-" + hashlib.sha256(id).hexdigest()[:12].
        assert_eq!(session_tag("abc"), "s-ba7816bf8f01");
        assert!(!id.contains(&tag[2..8]));
    }
}
