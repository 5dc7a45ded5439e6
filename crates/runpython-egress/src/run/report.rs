//! What a run did with the network: the envelope's report, the log kept with the run, and where a
//! session cell's share of them starts.

use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::{Egress, MAX_REFUSED_LISTED};

/// What a run did with the network, sized for its envelope.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetworkReport {
    /// The policy's mode: `"allowlist"` or `"public"`.
    pub mode: String,
    /// Connections made through the relay.
    pub connections: u64,
    /// Bytes the code sent, over every connection.
    pub bytes_out: u64,
    /// Bytes the code received, over every connection.
    pub bytes_in: u64,
    /// Names looked up.
    pub lookups: u64,
    /// What was refused (the first few, each once).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub refused: Vec<Refusal>,
    /// Refusals past those listed.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub refused_more: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl NetworkReport {
    /// Whether the run used the network at all (a connection, a lookup or a refusal).
    pub fn used(&self) -> bool {
        self.connections > 0 || self.lookups > 0 || !self.refused.is_empty()
    }
}

/// One refused connection or name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
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
    /// Bytes the code sent on the connection.
    pub bytes_out: u64,
    /// Bytes the code received on it.
    pub bytes_in: u64,
    #[serde(skip)]
    pub(super) counters: Option<Arc<Counters>>,
}

/// A live connection's byte counts, updated as the relay copies.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub out: AtomicU64,
    pub inn: AtomicU64,
}

impl LogEntry {
    fn settled(&self) -> LogEntry {
        let mut entry = self.clone();
        if let Some(c) = &self.counters {
            entry.bytes_out = c.out.load(Ordering::Relaxed);
            entry.bytes_in = c.inn.load(Ordering::Relaxed);
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
}

/// A run's log: its entries, then counts past [`super::MAX_LOG_ENTRIES`].
#[derive(Debug, Default)]
pub(super) struct Log {
    pub entries: Vec<LogEntry>,
    /// Entries past the bound, by kind and decision.
    pub dropped: u64,
    pub dropped_connections: u64,
    pub dropped_lookups: u64,
    pub dropped_refusals: u64,
}

impl Egress {
    /// Where a report starts now.
    pub fn mark(&self) -> Mark {
        let log = self.shared.lock();
        Mark {
            entry: log.entries.len(),
            dropped: log.dropped,
        }
    }

    /// What the run did with the network since `mark` (`Mark::default()`: since it started).
    pub fn report_since(&self, mark: Mark) -> NetworkReport {
        let log = self.shared.lock();
        let mut report = NetworkReport {
            mode: self.shared.policy.mode().to_owned(),
            ..NetworkReport::default()
        };
        for entry in log.entries.iter().skip(mark.entry) {
            let entry = entry.settled();
            match (entry.kind, entry.decision) {
                (_, "refused") => {
                    let refusal = Refusal {
                        host: entry
                            .name
                            .clone()
                            .or_else(|| entry.addr.map(|a| a.to_string()))
                            .unwrap_or_default(),
                        port: entry.port,
                        reason: entry.reason.clone().unwrap_or_default(),
                    };
                    if report.refused.contains(&refusal) {
                        continue;
                    }
                    if report.refused.len() < MAX_REFUSED_LISTED {
                        report.refused.push(refusal);
                    } else {
                        report.refused_more += 1;
                    }
                }
                ("lookup", _) => report.lookups += 1,
                ("connect", "allowed") => {
                    report.connections += 1;
                    report.bytes_out += entry.bytes_out;
                    report.bytes_in += entry.bytes_in;
                }
                _ => {}
            }
        }
        if log.dropped > mark.dropped {
            // Past the log's bound only counts are kept (and the bytes of those connections are lost).
            report.connections += log.dropped_connections;
            report.lookups += log.dropped_lookups;
            report.refused_more += log.dropped_refusals;
        }
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
