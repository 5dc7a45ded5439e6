//! Secrets the code can use but never read.
//!
//! The run's environment holds a random placeholder for each [`Secret`] (`rp_` and 40 letters and
//! digits); the real value stays in the host. Connections to a secret's hosts are intercepted
//! ([`RunSecrets::intercept`]): HTTPS is terminated with a leaf certificate issued by the run's own
//! CA (which the run trusts, and whose key never leaves the host), plaintext HTTP is read as is,
//! and each request is checked and rewritten before the host forwards it to the destination over
//! its own TLS, verified against the host's roots:
//!
//! - the request's host (`Host` / `:authority`, and the TLS SNI) must be the connection's
//!   destination, else 421 (no domain fronting through an intercepted connection);
//! - a placeholder of a secret that is not for this host, anywhere in the target or the headers
//!   (Basic credentials decoded), refuses the request with 403 and is reported as a [`Misuse`];
//! - every header value's current placeholders of the secrets for this host become their values
//!   (inside `Authorization: Basic` too), and so do the query's and the body's where a secret opts in;
//! - responses stream back unchanged, and an HTTP/1.1 upgrade (WebSocket) is joined after its 101.
//!
//! Connections that are not intercepted can be watched with a [`Scanner`], which finds a placeholder
//! sent to a host it is not for, split across reads or not. Values appear in no error, log line or
//! [`Misuse`]: they are only ever written into a request to the secret's own hosts.

mod classify;
mod http;
mod proxy;
mod rewrite;
mod tls;

#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::fmt;
use std::net::IpAddr;
use std::sync::{Arc, RwLock};

use memchr::memmem;
use tokio::net::TcpStream;

use super::Counters;
pub use crate::policy::Secret;

/// What every placeholder starts with.
const PREFIX: &[u8] = b"rp_";

/// Random letters and digits after the prefix (62^40, about 238 bits).
const RANDOM_CHARS: usize = 40;

/// A placeholder's whole length.
const PLACEHOLDER_LEN: usize = PREFIX.len() + RANDOM_CHARS;

/// A placeholder sent where its secret may not go, or a request the proxy refused for a secret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Misuse {
    /// The secret's name.
    pub secret: String,
    /// The host the request was for.
    pub host: String,
    /// The port it was for.
    pub port: u16,
    /// What happened (never contains a value).
    pub reason: String,
}

/// The placeholders of one run: the current one of each secret, and every one it ever had.
#[derive(Debug)]
struct Placeholders {
    /// The current placeholder of each secret, by its index.
    current: Vec<String>,
    /// Every placeholder, current or past, lowercased, to the index of its secret.
    all: HashMap<Vec<u8>, usize>,
}

impl Placeholders {
    /// Fresh placeholders for `count` secrets, remembering the ones in `all` already.
    fn refresh(&mut self, count: usize) -> Result<(), String> {
        let mut current = Vec::with_capacity(count);
        for index in 0..count {
            let placeholder = random_placeholder()?;
            self.all
                .insert(placeholder.to_ascii_lowercase().into_bytes(), index);
            current.push(placeholder);
        }
        self.current = current;
        Ok(())
    }

    /// The secret index of each placeholder (current or past) in `text`, case-insensitively.
    fn found_in<'t>(&'t self, text: &'t [u8]) -> impl Iterator<Item = usize> + 't {
        memchr::memchr_iter(b'_', text).filter_map(move |underscore| {
            let start = underscore.checked_sub(PREFIX.len() - 1)?;
            let candidate = text.get(start..start + PLACEHOLDER_LEN)?;
            if !candidate[..PREFIX.len()].eq_ignore_ascii_case(PREFIX) {
                return None;
            }
            self.all.get(&candidate.to_ascii_lowercase()).copied()
        })
    }
}

/// One run's secrets: a placeholder each, and the run's own CA.
pub(crate) struct RunSecrets {
    /// The secrets, in the order given (their index keys the placeholders).
    secrets: Vec<Secret>,
    /// Current and past placeholders (rotated by a session's cells).
    placeholders: RwLock<Placeholders>,
    /// The run's CA, for the run's side of intercepted TLS.
    ca: tls::RunCa,
    /// The host's TLS to the destinations.
    upstream: tls::UpstreamTls,
}

impl fmt::Debug for RunSecrets {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RunSecrets")
            .field("secrets", &self.secrets)
            .finish_non_exhaustive()
    }
}

impl RunSecrets {
    /// Placeholders for `secrets` and a CA of the run's own; `upstream_cas` are PEM bundles trusted
    /// for the destinations besides the host's roots.
    pub(crate) fn new(secrets: Vec<Secret>, upstream_cas: &[Vec<u8>]) -> Result<Self, String> {
        let mut placeholders = Placeholders {
            current: Vec::new(),
            all: HashMap::new(),
        };
        placeholders.refresh(secrets.len())?;
        Ok(Self {
            placeholders: RwLock::new(placeholders),
            ca: tls::RunCa::new()?,
            upstream: tls::UpstreamTls::new(upstream_cas)?,
            secrets,
        })
    }

    /// `(name, placeholder)` for each secret: what the run's environment holds.
    pub(crate) fn placeholders(&self) -> Vec<(String, String)> {
        let placeholders = self.read();
        self.secrets
            .iter()
            .zip(&placeholders.current)
            .map(|(secret, placeholder)| (secret.name.clone(), placeholder.clone()))
            .collect()
    }

    /// New placeholders for every secret (a new session cell); the old ones are no longer
    /// substituted, but are still recognized as this run's for misuse detection.
    pub(crate) fn rotate(&self) {
        let mut placeholders = self.placeholders.write().unwrap_or_else(|p| p.into_inner());
        // The system's random source failing leaves the current placeholders in place (still
        // random, only no longer fresh); there is nothing better to do mid-session.
        let _ = placeholders.refresh(self.secrets.len());
    }

    /// The run's CA certificate, PEM (the run's trust bundle is the host's roots and this).
    pub(crate) fn ca_pem(&self) -> &str {
        self.ca.pem()
    }

    /// Whether a connection to `ip:port`, reached through `names` (the names the run resolved to
    /// the address; maybe none), is one to intercept: some secret's hosts match a name or the address.
    pub(crate) fn intercepts(&self, names: &[&str], ip: IpAddr, port: u16) -> bool {
        let ip = ip.to_string();
        self.secrets.iter().any(|secret| {
            secret.matches_host(&ip, port) || names.iter().any(|n| secret.matches_host(n, port))
        })
    }

    /// The name of the first secret whose placeholder (current or past) occurs in `text`,
    /// case-insensitively (for DNS names and other plain text).
    pub(crate) fn placeholder_in(&self, text: &[u8]) -> Option<&str> {
        let index = self.read().found_in(text).next()?;
        self.secrets.get(index).map(|s| s.name.as_str())
    }

    /// A streaming scanner for a connection that is not intercepted: finds a placeholder split
    /// across chunks.
    pub(crate) fn scanner(self: &Arc<Self>) -> Scanner {
        Scanner {
            secrets: Arc::clone(self),
            tail: Vec::with_capacity(PLACEHOLDER_LEN),
        }
    }

    /// Serves one intercepted connection until either side closes: TLS (its first byte 0x16) is
    /// terminated with a leaf certificate for the SNI name issued by the run's CA, plaintext HTTP is
    /// read as is; each request is checked, rewritten and forwarded over `upstream` (TLS verified
    /// against the host's roots and the extra CAs when the run's side was TLS). `host` is the
    /// destination's name (or address) and `port` its port. Counts what the code sent into
    /// `counters.out` and what it received into `counters.inn`.
    pub(crate) async fn intercept(
        self: Arc<Self>,
        child: TcpStream,
        upstream: TcpStream,
        host: String,
        port: u16,
        counters: Arc<Counters>,
        misuse: Arc<dyn Fn(Misuse) + Send + Sync>,
    ) {
        proxy::serve(self, child, upstream, host, port, counters, misuse).await;
    }

    /// The placeholders, for reading (a poisoned lock still holds whole placeholders).
    fn read(&self) -> std::sync::RwLockReadGuard<'_, Placeholders> {
        self.placeholders.read().unwrap_or_else(|p| p.into_inner())
    }

    /// The secrets that may go to `host:port`, with the current placeholder of each.
    fn for_host(&self, host: &str, port: u16) -> Vec<(&Secret, String)> {
        let placeholders = self.read();
        self.secrets
            .iter()
            .zip(&placeholders.current)
            .filter(|(secret, _)| secret.matches_host(host, port))
            .map(|(secret, placeholder)| (secret, placeholder.clone()))
            .collect()
    }

    /// The first secret that may go to `host:port` but only over TLS whose placeholder (current or
    /// past) is in `text`.
    fn tls_only_in(&self, text: &[u8], host: &str, port: u16) -> Option<&Secret> {
        let placeholders = self.read();
        let found = placeholders
            .found_in(text)
            .filter_map(|index| self.secrets.get(index))
            .find(|secret| !secret.over_http && secret.matches_host(host, port));
        found
    }

    /// Whether secret `name` is one for `host:port`.
    pub(crate) fn is_for(&self, name: &str, host: &str, port: u16) -> bool {
        self.secrets
            .iter()
            .any(|secret| secret.name == name && secret.matches_host(host, port))
    }

    /// The first secret that may not go to `host:port` whose placeholder (current or past) is in
    /// `text`.
    fn misplaced_in(&self, text: &[u8], host: &str, port: u16) -> Option<&Secret> {
        let placeholders = self.read();
        let found = placeholders
            .found_in(text)
            .filter_map(|index| self.secrets.get(index))
            .find(|secret| !secret.matches_host(host, port));
        found
    }
}

/// Watches the bytes of a connection that is not intercepted for this run's placeholders.
#[derive(Debug)]
pub(crate) struct Scanner {
    /// Whose placeholders to look for (rotations included as they happen).
    secrets: Arc<RunSecrets>,
    /// The last bytes seen, fewer than a placeholder's length: where one split across chunks starts.
    tail: Vec<u8>,
}

impl Scanner {
    /// The next chunk of the connection: the name of a secret whose placeholder it holds (or that
    /// the end of the previous chunk and the start of this one hold together).
    pub(crate) fn feed(&mut self, chunk: &[u8]) -> Option<String> {
        let keep = PLACEHOLDER_LEN - 1;
        let mut seam = std::mem::take(&mut self.tail);
        let seam_len = seam.len();
        seam.extend_from_slice(&chunk[..chunk.len().min(keep)]);
        let found = self
            .secrets
            .placeholder_in(&seam)
            .or_else(|| self.secrets.placeholder_in(chunk))
            .map(str::to_owned);
        // The new tail: the last `keep` bytes of what was seen (the old tail and this chunk).
        if chunk.len() >= keep {
            seam.clear();
            seam.extend_from_slice(&chunk[chunk.len() - keep..]);
        } else {
            let total = seam_len + chunk.len();
            seam.drain(..total.saturating_sub(keep));
        }
        self.tail = seam;
        found
    }
}

/// A fresh placeholder: the prefix and random letters and digits.
fn random_placeholder() -> Result<String, String> {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    let mut out = String::from_utf8_lossy(PREFIX).into_owned();
    let mut pool = [0u8; 64];
    while out.len() < PLACEHOLDER_LEN {
        getrandom::fill(&mut pool)
            .map_err(|e| format!("the system's random source failed ({e})"))?;
        // Bytes past the largest multiple of 62 are dropped, so every character is equally likely.
        for &byte in pool.iter().filter(|&&b| usize::from(b) < 62 * 4) {
            if out.len() == PLACEHOLDER_LEN {
                break;
            }
            out.push(char::from(ALPHABET[usize::from(byte) % 62]));
        }
    }
    Ok(out)
}

/// `haystack` with every `needle` replaced by `with`, or `None` when it holds none.
fn replace_all(haystack: &[u8], needle: &[u8], with: &[u8]) -> Option<Vec<u8>> {
    let mut found = memmem::find_iter(haystack, needle).peekable();
    found.peek()?;
    let mut out = Vec::with_capacity(haystack.len() + with.len());
    let mut last = 0;
    for at in found {
        out.extend_from_slice(&haystack[last..at]);
        out.extend_from_slice(with);
        last = at + needle.len();
    }
    out.extend_from_slice(&haystack[last..]);
    Some(out)
}
