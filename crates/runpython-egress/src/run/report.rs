//! What a run did with the network: the envelope's report, the log kept with the run, and where a
//! session cell's share of them starts.
//!
//! The report's totals (connections, bytes, lookups, refusals) and its list of refusals are counted
//! apart from the log, which is bounded: a run that fills the log hides nothing it does after, and
//! the report says the log was cut (`log_truncated`).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::{Egress, MAX_REFUSED_LISTED};

/// Distinct refusals a run remembers for its report; past them, refusals are counted only.
const MAX_DISTINCT_REFUSALS: usize = 1024;

/// What a run did with the network, sized for its envelope.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetworkReport {
    /// The policy's mode: `"allowlist"` or `"public"`.
    pub mode: String,
    /// Connections made through the relay.
    pub connections: u64,
    /// Bytes the code sent, over every connection.
    pub bytes_out: u64,
    /// Bytes the code received, over every connection. (On a connection the kernel carried, its
    /// count: the destination's closing FIN counts one.)
    pub bytes_in: u64,
    /// Names looked up.
    pub lookups: u64,
    /// Refused connections, lookups and secrets, each one counted.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub refusals: u64,
    /// What was refused (the first few, each once).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub refused: Vec<Refusal>,
    /// Distinct refusals past those listed (and refusals past the run's memory of distinct ones).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub refused_more: u64,
    /// The kept log (`network-log.jsonl`) reached its bound and lists only the first entries; the
    /// counts here still cover everything.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub log_truncated: bool,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl NetworkReport {
    /// Whether the run used the network at all (a connection, a lookup or a refusal).
    pub fn used(&self) -> bool {
        self.connections > 0 || self.lookups > 0 || self.refusals > 0 || !self.refused.is_empty()
    }
}

/// One refused connection or name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Refusal {
    /// The name asked for, or the address when no name led to it.
    pub host: String,
    /// The port (none for a name lookup).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    /// Why, and what would allow it.
    pub reason: String,
}

/// One line of a run's network log (kept with the run as an artifact, as JSON lines).
#[derive(Debug, Clone, Serialize)]
pub struct LogEntry {
    /// Milliseconds since the run's network started.
    pub at_ms: u64,
    /// `"connect"`, `"udp"` or `"lookup"`.
    pub kind: &'static str,
    /// The name looked up, or the name that led to the address.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The address.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub addr: Option<IpAddr>,
    /// The port.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    /// `"allowed"`, `"refused"` or `"failed"` (allowed, but the destination did not answer).
    pub decision: &'static str,
    /// The pattern that allowed it (none: the public internet).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rule: Option<String>,
    /// Why it was refused or failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Addresses a lookup answered.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub answers: Vec<IpAddr>,
    /// How an allowed connection's bytes went: `"kernel"` (a socket of the host's, connected by
    /// the host and handed to the run) or `"relay"` (joined by the host's relay, or its proxy for a
    /// secret's host).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub via: Option<&'static str>,
    /// Bytes the code sent on the connection.
    pub bytes_out: u64,
    /// Bytes the code received on it.
    pub bytes_in: u64,
    #[serde(skip)]
    pub(super) counters: Option<Arc<Counters>>,
}

/// A live connection's byte counts, updated as the relay copies; each byte is counted into the
/// run's totals too.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    out: AtomicU64,
    inn: AtomicU64,
    run: Arc<Totals>,
}

impl Counters {
    /// Counts of a new connection of the run whose totals are `run`.
    pub(crate) fn of(run: &Arc<Totals>) -> Self {
        Self {
            run: Arc::clone(run),
            ..Self::default()
        }
    }

    /// The code sent `n` bytes.
    pub(crate) fn sent(&self, n: u64) {
        self.out.fetch_add(n, Ordering::Relaxed);
        self.run.bytes_out.fetch_add(n, Ordering::Relaxed);
    }

    /// The code received `n` bytes.
    pub(crate) fn received(&self, n: u64) {
        self.inn.fetch_add(n, Ordering::Relaxed);
        self.run.bytes_in.fetch_add(n, Ordering::Relaxed);
    }

    /// Bytes the code sent on this connection so far.
    pub(crate) fn sent_so_far(&self) -> u64 {
        self.out.load(Ordering::Relaxed)
    }

    /// Bytes the code received on this connection so far.
    pub(crate) fn received_so_far(&self) -> u64 {
        self.inn.load(Ordering::Relaxed)
    }
}

/// A run's totals, counted apart from its log.
#[derive(Debug, Default)]
pub(crate) struct Totals {
    pub connections: AtomicU64,
    pub lookups: AtomicU64,
    pub refusals: AtomicU64,
    pub bytes_out: AtomicU64,
    pub bytes_in: AtomicU64,
}

/// The totals at one moment.
#[derive(Debug, Clone, Copy, Default)]
struct Snapshot {
    connections: u64,
    lookups: u64,
    refusals: u64,
    bytes_out: u64,
    bytes_in: u64,
}

impl Totals {
    fn snapshot(&self) -> Snapshot {
        let read = |n: &AtomicU64| n.load(Ordering::Relaxed);
        Snapshot {
            connections: read(&self.connections),
            lookups: read(&self.lookups),
            refusals: read(&self.refusals),
            bytes_out: read(&self.bytes_out),
            bytes_in: read(&self.bytes_in),
        }
    }
}

/// The distinct refusals of a run, for its report: each with the ordinal (among all the run's
/// refusals) of its first and latest time, so a report from a mark lists those seen since.
#[derive(Debug, Default)]
pub(super) struct Refusals {
    distinct: Vec<(Refusal, u64, u64)>,
    index: HashMap<Refusal, usize>,
    /// Refusals not remembered (past [`MAX_DISTINCT_REFUSALS`]), by ordinal of the latest.
    forgotten: u64,
    /// Refusals so far.
    seen: u64,
}

impl Refusals {
    /// Notes one refusal.
    pub(super) fn note(&mut self, refusal: Refusal) {
        self.seen += 1;
        let at = self.seen;
        match self.index.get(&refusal) {
            Some(&i) => self.distinct[i].2 = at,
            None if self.distinct.len() < MAX_DISTINCT_REFUSALS => {
                self.index.insert(refusal.clone(), self.distinct.len());
                self.distinct.push((refusal, at, at));
            }
            None => self.forgotten += 1,
        }
    }
}

impl LogEntry {
    fn settled(&self) -> LogEntry {
        let mut entry = self.clone();
        if let Some(c) = &self.counters {
            entry.bytes_out = c.sent_so_far();
            entry.bytes_in = c.received_so_far();
        }
        entry.counters = None;
        entry
    }
}

/// Where a report starts: taken before a session's cell, its report then covers the cell only.
#[derive(Debug, Clone, Copy, Default)]
pub struct Mark {
    entry: usize,
    dropped: u64,
    totals: Snapshot,
    refusals_seen: u64,
    refusals_forgotten: u64,
}

/// A run's log: its entries, then a count past [`super::MAX_LOG_ENTRIES`].
#[derive(Debug, Default)]
pub(super) struct Log {
    pub entries: Vec<LogEntry>,
    /// Entries past the bound.
    pub dropped: u64,
}

impl Egress {
    /// Where a report starts now.
    pub fn mark(&self) -> Mark {
        let (entry, dropped) = {
            let log = self.shared.lock();
            (log.entries.len(), log.dropped)
        };
        let refusals = self.shared.refusals();
        Mark {
            entry,
            dropped,
            totals: self.shared.totals.snapshot(),
            refusals_seen: refusals.seen,
            refusals_forgotten: refusals.forgotten,
        }
    }

    /// What the run did with the network since `mark` (`Mark::default()`: since it started).
    pub fn report_since(&self, mark: Mark) -> NetworkReport {
        let now = self.shared.totals.snapshot();
        let since = |now: u64, then: u64| now.saturating_sub(then);
        let mut report = NetworkReport {
            mode: self.shared.policy.mode().to_owned(),
            connections: since(now.connections, mark.totals.connections),
            bytes_out: since(now.bytes_out, mark.totals.bytes_out),
            bytes_in: since(now.bytes_in, mark.totals.bytes_in),
            lookups: since(now.lookups, mark.totals.lookups),
            refusals: since(now.refusals, mark.totals.refusals),
            log_truncated: self.shared.lock().dropped > mark.dropped,
            ..NetworkReport::default()
        };
        let refusals = self.shared.refusals();
        let mut recent: Vec<&(Refusal, u64, u64)> = refusals
            .distinct
            .iter()
            .filter(|(_, _, latest)| *latest > mark.refusals_seen)
            .collect();
        recent.sort_by_key(|(_, first, _)| *first);
        let listed = recent.len().min(MAX_REFUSED_LISTED);
        report.refused = recent[..listed].iter().map(|(r, _, _)| r.clone()).collect();
        report.refused_more =
            (recent.len() - listed) as u64 + since(refusals.forgotten, mark.refusals_forgotten);
        report
    }

    /// The log since `mark` as JSON lines (each entry with its bytes so far).
    pub fn log_since(&self, mark: Mark) -> Vec<u8> {
        let log = self.shared.lock();
        let mut out = Vec::new();
        for entry in log.entries.iter().skip(mark.entry) {
            if serde_json::to_writer(&mut out, &entry.settled()).is_ok() {
                out.push(b'\n');
            }
        }
        if log.dropped > mark.dropped {
            let note = serde_json::json!({
                "kind": "truncated",
                "entries_not_listed": log.dropped - mark.dropped,
            });
            if serde_json::to_writer(&mut out, &note).is_ok() {
                out.push(b'\n');
            }
        }
        out
    }
}
