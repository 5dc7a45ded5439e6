//! What finished runs leave to be removed off their critical path (their cgroups, their run
//! directories), counted while it is pending, so that a process about to exit can wait for it: the
//! removals run on threads of the process, which its exit would end half-way.

use std::sync::{Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// How many removals are pending, and the signal that the count went down.
static PENDING: (Mutex<usize>, Condvar) = (Mutex::new(0), Condvar::new());

fn change(by: fn(usize) -> usize) {
    let (count, changed) = &PENDING;
    let mut n = count.lock().unwrap_or_else(PoisonError::into_inner);
    *n = by(*n);
    changed.notify_all();
}

/// One removal handed off and not done yet: counted from its making until it is dropped, which the
/// removal does when it is over (done, or given up).
#[derive(Debug)]
pub(crate) struct Pending(());

impl Pending {
    pub(crate) fn new() -> Self {
        change(|n| n + 1);
        Pending(())
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        change(|n| n.saturating_sub(1));
    }
}

/// Waits, at most `within`, until every removal handed off so far is over; true when it is. A
/// process calls it before it exits, after dropping what holds its runs.
pub fn settle(within: Duration) -> bool {
    let deadline = Instant::now() + within;
    let (count, changed) = &PENDING;
    let mut left = count.lock().unwrap_or_else(PoisonError::into_inner);
    while *left > 0 {
        let now = Instant::now();
        if now >= deadline {
            return false;
        }
        left = changed
            .wait_timeout(left, deadline - now)
            .unwrap_or_else(PoisonError::into_inner)
            .0;
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settle_waits_for_a_pending_removal_and_no_longer() {
        let pending = Pending::new();
        assert!(!settle(Duration::from_millis(20)), "one is pending");
        let removal = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            drop(pending);
        });
        assert!(settle(Duration::from_secs(10)));
        removal.join().unwrap_or_default();
    }
}
