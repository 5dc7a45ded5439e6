//! What the intercepting proxy (`proxy.rs`) and the rewrite of each request (`rewrite.rs`) share:
//! the body type both ways, and the connection a request arrived on. A leaf, so the two import it
//! and only the proxy imports the rewrite.

use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;

use super::RunSecrets;

/// Bodies both ways: streamed from the other side, or made here.
pub(super) type Body = BoxBody<Bytes, hyper::Error>;

/// A body made here.
pub(super) fn full(bytes: Bytes) -> Body {
    Full::new(bytes).map_err(|never| match never {}).boxed()
}

/// The intercepted connection a request arrived on: its run's secrets and its destination.
pub(super) struct Dest<'a> {
    /// The run's secrets.
    pub secrets: &'a RunSecrets,
    /// The destination's name or address, normalized (lowercase, no trailing dot, no brackets).
    pub host: &'a str,
    /// The destination's port.
    pub port: u16,
    /// Whether the run's side is TLS (and so the destination's, verified for `host`).
    pub tls: bool,
}
