//! How logs name what must never be written whole: an MCP session id is a bearer capability (who
//! presents it, with the token that made it, acts in the session), so a log line carries a short
//! digest of it instead, enough to follow one session through a host's log and a proxy's.

/// The log's name for session id `id`: `s-` and twelve hex digits of its blake3 digest.
pub(crate) fn session_tag(id: &str) -> String {
    let digest = blake3::hash(id.as_bytes()).to_hex();
    format!("s-{}", &digest[..12])
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
        assert!(!id.contains(&tag[2..8]));
    }
}
