//! A tenant's usage as a store counts it (a leaf: [`crate::quota`] holds the count against the quota).

use std::sync::{Arc, Mutex};
use std::time::Instant;

/// What a tenant's store knows of its usage.
#[derive(Debug, Default)]
pub(crate) struct Usage {
    /// The quota, when the tenant has one.
    pub(crate) limit: Option<u64>,
    /// Bytes counted by the last listing and written since, and when it was listed.
    pub(crate) counted: Option<(u64, Instant)>,
    /// Bytes of writes in flight.
    pub(crate) reserved: u64,
    /// Bytes of every write this process made for the tenant, ever: what a listing that was under
    /// way while they were made may not have seen.
    pub(crate) written: u64,
}

/// Bytes reserved for a write in flight; released on drop unless committed (written).
#[derive(Debug)]
pub(crate) struct Reservation {
    pub(crate) usage: Arc<Mutex<Usage>>,
    pub(crate) bytes: u64,
}

impl Reservation {
    /// `bytes` of this reservation (at most what it holds), as a reservation of their own.
    pub(crate) fn split(&mut self, bytes: u64) -> Self {
        let bytes = bytes.min(self.bytes);
        self.bytes -= bytes;
        Reservation {
            usage: Arc::clone(&self.usage),
            bytes,
        }
    }

    /// The reserved bytes were written: they count as stored.
    pub(crate) fn commit(mut self) {
        let mut usage = lock(&self.usage);
        usage.reserved = usage.reserved.saturating_sub(self.bytes);
        usage.written = usage.written.saturating_add(self.bytes);
        if let Some((used, _)) = usage.counted.as_mut() {
            *used = used.saturating_add(self.bytes);
        }
        self.bytes = 0;
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        let mut usage = lock(&self.usage);
        usage.reserved = usage.reserved.saturating_sub(self.bytes);
    }
}

pub(crate) fn lock(usage: &Mutex<Usage>) -> std::sync::MutexGuard<'_, Usage> {
    usage.lock().unwrap_or_else(|p| p.into_inner())
}
