//! The limits of one run's bridge. A leaf: the connection loop and the call dispatcher both read it.

use std::time::Duration;

use crate::frame::DEFAULT_MAX_FRAME;

/// Limits of one run's bridge.
#[derive(Debug, Clone)]
pub struct BridgeConfig {
    /// Largest frame either side may send (default 16 MiB). A bigger one from the child ends the run;
    /// a tool result that would be bigger reaches the code as a `ValueError`.
    pub max_frame: usize,
    /// How long one call may take before the code gets a `TimeoutError` (default 60 s).
    pub call_timeout: Duration,
    /// Calls allowed in one run (default 1,000); the next one ends the run with `ToolCallLimit`.
    pub max_calls: u32,
    /// How long a connection to a path socket ([`crate::Bridge::bind`]) has to present the handshake
    /// (default 10 s). The one connection of a socket pair has no such limit: the child says hello on
    /// its first tool call, whenever that is.
    pub handshake_timeout: Duration,
    /// Suspensions allowed over a run's life (default 10); past it, a suspending tool raises.
    pub max_suspensions: usize,
    /// Calls served at once on the run's connection (default 16; 0 counts as 1). At the cap the host
    /// stops reading the child's frames until a call finishes, so the child's next write blocks: the
    /// calls of an `asyncio.gather` wider than this are served in waves. It is also the bound on how
    /// many host processes one run's command tools (`--tool NAME=COMMAND`) can have running at once,
    /// since each call runs at most one.
    pub max_concurrent_calls: usize,
    /// Bytes in flight on the run's connection (default 64 MiB): the sum of the sizes of the frames of
    /// the calls being served. A frame that would take the sum over the cap is not read (its length
    /// prefix is, its body stays in the socket) until enough calls finish; a single frame, up to
    /// `max_frame`, is always admitted when nothing else is in flight. The host never buffers more
    /// than this plus one 64 KiB read of the child's frames.
    pub max_in_flight_bytes: usize,
    /// A journaled result longer than this (default 16 KiB) is kept by its digest, its text handed to
    /// the run's spill store: what the journal holds in memory is bounded by calls × this, whatever
    /// the values a run passes through its tools.
    pub spill_threshold: usize,
}

impl Default for BridgeConfig {
    fn default() -> Self {
        Self {
            max_frame: DEFAULT_MAX_FRAME,
            call_timeout: Duration::from_secs(60),
            max_calls: 1_000,
            handshake_timeout: Duration::from_secs(10),
            max_suspensions: 10,
            max_concurrent_calls: 16,
            max_in_flight_bytes: 64 << 20,
            spill_threshold: 16 << 10,
        }
    }
}
