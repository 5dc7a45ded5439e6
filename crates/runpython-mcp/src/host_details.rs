//! What an HTTP tenant reads when something fails, without the host in it: no path of the host's
//! filesystem and not the store's URL (a stdio client is the operator's own and reads everything).
//!
//! - A failure the tenant can act on (a request to fix, an id not found, its quota, a cancel) keeps
//!   its message, with host details replaced; a missing id's message is rebuilt without the store.
//! - A failure of the host (the store, the sandbox, a system call, a bug) says what failed and a
//!   reference; the whole report goes to the server's log under that reference.
//! - In an envelope, `store_error` and the message of runpython's own error types (a failed
//!   install, the sandbox) have host details replaced: the store's URL and local path by
//!   `<store>`, any other absolute path by `<host path>`. What the code printed or raised is left
//!   as it is: the code reads only what its sandbox shows it.

use runpython_core::{Error, RunPython, StoreError};
use serde_json::Value;

/// What stands for the store's URL and local path.
const STORE: &str = "<store>";
/// What stands for any other path of the host.
const HOST_PATH: &str = "<host path>";

/// The host details of one server, to keep out of what its tenants read.
#[derive(Debug, Clone, Default)]
pub(crate) struct HostDetails {
    /// The store's URL and, for a local store, its directory (longest first).
    store: Vec<String>,
}

impl HostDetails {
    /// The details of `engine`'s host: its store's URL and directory.
    pub(crate) fn of(engine: &RunPython) -> Self {
        let mut store = Vec::new();
        if let Some(url) = engine.store().map(|s| s.url().to_owned()) {
            if let Some(path) = url.strip_prefix("file://") {
                if let Ok(real) = std::fs::canonicalize(path) {
                    store.push(real.display().to_string());
                }
                store.push(path.to_owned());
            }
            store.insert(0, url);
        }
        store.retain(|s| s.len() > 1);
        store.sort_by_key(|s| std::cmp::Reverse(s.len()));
        Self { store }
    }

    /// `text` with the store's URL and directory, and every other absolute path, replaced.
    pub(crate) fn scrub(&self, text: &str) -> String {
        let mut out = text.to_owned();
        for detail in &self.store {
            out = out.replace(detail.as_str(), STORE);
        }
        scrub_paths(&out.replace("file://", ""))
    }

    /// What a tenant reads for runpython's own failure `e` (logged whole when it is the host's).
    pub(crate) fn message(&self, e: &Error, tenant: &str) -> String {
        match e {
            Error::Store(StoreError::NotFound { what, id, .. }) => format!(
                "{what} `{id}` not found; it was never stored, was deleted, or expired and was \
                 collected"
            ),
            Error::Coalesced(shared) => self.message(shared, tenant),
            _ if is_the_callers(e) => self.scrub(&runpython_core::error_report(e)),
            _ => {
                let report = runpython_core::error_report(e);
                let reference = reference(&report);
                tracing::warn!(
                    tenant,
                    reference = %reference,
                    code = e.code(),
                    "a call failed on this host: {report}"
                );
                format!(
                    "runpython failed on the server ({}); the operator can find the details in \
                     its log under reference {reference}. Try again; if it keeps failing, tell the \
                     operator",
                    e.code()
                )
            }
        }
    }

    /// An envelope as a tenant reads it: `store_error`, and the message of runpython's own error
    /// types, without host details.
    pub(crate) fn envelope(&self, value: &mut Value) {
        if let Some(store_error) = value.get_mut("store_error") {
            if let Some(text) = store_error.as_str() {
                *store_error = Value::String(self.scrub(text));
            }
        }
        let own = matches!(
            value["error"]["type"].as_str(),
            Some("DependencyError" | "SandboxError")
        );
        if own {
            if let Some(message) = value["error"].get_mut("message") {
                if let Some(text) = message.as_str() {
                    *message = Value::String(self.scrub(text));
                }
            }
        }
    }
}

/// Whether `e` is the caller's to act on (its message kept, scrubbed), not the host's failure.
fn is_the_callers(e: &Error) -> bool {
    matches!(
        e.code(),
        "invalid_input" | "not_found" | "quota_exceeded" | "cancelled" | "config"
    )
}

/// A short reference for a failure, to find it in the log.
fn reference(report: &str) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    crate::tag::short_hex(format!("{now}{report}").as_bytes())
}

/// `text` with each absolute path (a `/` at the start of a word, followed by a name) replaced by
/// [`HOST_PATH`].
fn scrub_paths(text: &str) -> String {
    let starts_word = |c: char| c.is_whitespace() || "\"'`([{=,:;".contains(c);
    let ends_path = |c: char| c.is_whitespace() || "\"'`)]},:;".contains(c);
    let mut out = String::with_capacity(text.len());
    let mut previous: Option<char> = None;
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        let at_path = c == '/'
            && previous.is_none_or(starts_word)
            && chars
                .peek()
                .is_some_and(|n| n.is_alphanumeric() || "._~-".contains(*n));
        if at_path {
            out.push_str(HOST_PATH);
            while chars.next_if(|n| !ends_path(*n)).is_some() {}
            previous = Some('x');
            continue;
        }
        out.push(c);
        previous = Some(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn details(store: &[&str]) -> HostDetails {
        HostDetails {
            store: store.iter().map(|s| (*s).to_owned()).collect(),
        }
    }

    #[test]
    fn the_store_and_every_host_path_are_replaced_and_the_rest_kept() {
        let host = details(&["file:///srv/runpython/store", "/srv/runpython/store"]);
        let text = "put `v1/t/61/blobs/ab` in store `file:///srv/runpython/store` failed: \
                    Unable to open file /srv/runpython/store/v1/t/61/blobs/ab: Not a directory";
        assert_eq!(
            host.scrub(text),
            "put `v1/t/61/blobs/ab` in store `<store>` failed: Unable to open file \
             <store>/v1/t/61/blobs/ab: Not a directory"
        );
        assert_eq!(
            host.scrub("installing x with /root/.pyenv/bin/python3 failed (exit status: 1)\nLooking in links: /opt/wheels"),
            "installing x with <host path> failed (exit status: 1)\nLooking in links: <host path>"
        );
        // Not paths: fractions, alternatives, URLs of other hosts, a lone slash.
        let kept = "1/2 and/or https://pypi.org/simple / done";
        assert_eq!(host.scrub(kept), kept);
    }

    #[test]
    fn a_missing_id_is_said_without_the_store_and_a_host_failure_by_reference() {
        let host = details(&["file:///srv/store"]);
        let missing = Error::Store(StoreError::NotFound {
            what: "artifact",
            id: "ab12".into(),
            store: "file:///srv/store".into(),
        });
        let text = host.message(&missing, "alice");
        assert!(
            text.starts_with("artifact `ab12` not found") && !text.contains("srv"),
            "{text}"
        );
        let io = Error::Io {
            what: "reading the run's files",
            path: Some("/var/lib/runpython/runs/x".into()),
            source: std::io::Error::other("boom"),
        };
        let text = host.message(&io, "alice");
        assert!(
            text.contains("(io)") && text.contains("reference") && !text.contains("/var"),
            "{text}"
        );
        let invalid = Error::InvalidInput(
            "input x: no artifact \"ab\" in the store file:///srv/store".into(),
        );
        assert_eq!(
            host.message(&invalid, "alice"),
            "invalid request: input x: no artifact \"ab\" in the store <store>"
        );
    }

    #[test]
    fn an_envelope_keeps_what_the_code_said() {
        let host = details(&["file:///srv/store"]);
        let mut own = serde_json::json!({
            "stdout": "/etc/passwd", "kept": false,
            "store_error": "put in store `file:///srv/store` failed",
            "error": {"type": "DependencyError", "message": "Looking in links: /opt/wheels"},
        });
        host.envelope(&mut own);
        assert_eq!(own["store_error"], "put in store `<store>` failed");
        assert_eq!(own["error"]["message"], "Looking in links: <host path>");
        assert_eq!(own["stdout"], "/etc/passwd");
        let mut code =
            serde_json::json!({"error": {"type": "FileNotFoundError", "message": "/data/x"}});
        host.envelope(&mut code);
        assert_eq!(code["error"]["message"], "/data/x");
    }
}
