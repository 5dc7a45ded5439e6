//! The egress's one error type: configuration that cannot be a policy, and what the host could not
//! read to decide with. What a run's connections meet is never an `Err`: a refusal is an outcome,
//! named in the run's network report.

/// What can go wrong while building a network policy or reading what it decides with.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A host pattern that cannot be parsed, or that allows too much (`*.com`); the message says
    /// what to write instead.
    #[error("invalid input: host pattern {text:?} {why}")]
    InvalidPattern {
        /// The pattern as given.
        text: String,
        /// What is wrong with it, and what to write.
        why: String,
    },
    /// The host's own network addresses cannot be listed (they count as non-public, so without them
    /// no connection is allowed).
    #[error("cannot list this host's network addresses (getifaddrs): {0}")]
    HostAddrs(#[source] std::io::Error),
}
