//! Who is calling and how many runs they may have: the client scope (the process for stdio, the token
//! for HTTP) that is the tenant its runs belong to and that per-client limits live in, and the gate
//! that admits runs (a limit per scope, a limit for the host as a whole, draining on shutdown).
//!
//! A host at its capacity refuses at once with an error a client (or a proxy) can retry elsewhere:
//! [`OVER_CAPACITY`] as a JSON-RPC error whose data says `over_capacity` and `retry_after_s`. The HTTP
//! server says the same with a 503 and `Retry-After` before the request reaches the MCP service.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use serde_json::{json, Value};
use tokio::sync::Notify;

/// The JSON-RPC error code of a call refused because the host is at its capacity (in the
/// implementation-defined server-error range, clear of the codes MCP defines).
pub const OVER_CAPACITY: i32 = -32010;

/// What a refused client is told to wait before retrying (here or on another host).
pub const RETRY_AFTER_S: u64 = 1;

/// Who is calling: the tenant its runs belong to, and the scope per-client limits live in.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ClientScope {
    /// The one client of a stdio server: the default tenant (the CLI's local use).
    Stdio,
    /// An HTTP client, by the name of the bearer token it presented (a static token's name, or
    /// `jwt:<claim>` for an access token): a tenant of its own.
    Token(String),
}

impl ClientScope {
    /// The tenant the client's runs belong to; `None` for the default tenant.
    pub fn tenant(&self) -> Option<&str> {
        match self {
            Self::Stdio => None,
            Self::Token(name) => Some(name),
        }
    }
}

impl std::fmt::Display for ClientScope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Stdio => f.write_str("stdio"),
            Self::Token(name) => f.write_str(name),
        }
    }
}

/// Admission of runs: at most `per_scope` at once per client and `per_host` in all (0: no limit), and
/// none once draining.
#[derive(Debug, Default)]
pub struct RunGate {
    per_scope: usize,
    per_host: usize,
    in_flight: Mutex<HashMap<ClientScope, usize>>,
    total: AtomicUsize,
    draining: AtomicBool,
    idle: Notify,
}

/// A run admitted by [`RunGate::enter`]; leaving it frees the place.
#[derive(Debug)]
pub struct Admitted {
    gate: Arc<RunGate>,
    scope: ClientScope,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        let mut map = self
            .gate
            .in_flight
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(n) = map.get_mut(&self.scope) {
            *n -= 1;
            if *n == 0 {
                map.remove(&self.scope);
            }
        }
        if self.gate.total.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.gate.idle.notify_waiters();
        }
    }
}

impl RunGate {
    /// A gate allowing `per_scope` concurrent runs per client and `per_host` in all (0: unlimited).
    pub fn new(per_scope: usize, per_host: usize) -> Arc<Self> {
        Arc::new(Self {
            per_scope,
            per_host,
            ..Self::default()
        })
    }

    /// Admits one run of `scope`, or says why not.
    pub fn enter(self: &Arc<Self>, scope: &ClientScope) -> Result<Admitted, Refusal> {
        if self.draining.load(Ordering::SeqCst) {
            return Err(Refusal::ShuttingDown);
        }
        let mut map = self.in_flight.lock().unwrap_or_else(|p| p.into_inner());
        // Under the lock: two calls racing for the last place cannot both have it.
        let total = self.total.load(Ordering::SeqCst);
        if self.per_host > 0 && total >= self.per_host {
            return Err(Refusal::OverCapacity {
                limit: self.per_host,
            });
        }
        let n = map.entry(scope.clone()).or_insert(0);
        if self.per_scope > 0 && *n >= self.per_scope {
            return Err(Refusal::TooManyRuns {
                scope: scope.to_string(),
                n: *n,
            });
        }
        *n += 1;
        self.total.fetch_add(1, Ordering::SeqCst);
        Ok(Admitted {
            gate: Arc::clone(self),
            scope: scope.clone(),
        })
    }

    /// Takes no new runs from now on.
    pub fn start_draining(&self) {
        self.draining.store(true, Ordering::SeqCst);
    }

    /// True once [`RunGate::start_draining`] was called.
    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }

    /// Runs in flight.
    pub fn in_flight(&self) -> usize {
        self.total.load(Ordering::SeqCst)
    }

    /// The host's limit on runs in flight (0: none).
    pub fn capacity(&self) -> usize {
        self.per_host
    }

    /// True when a run entering now would be refused for the host's capacity.
    pub fn is_full(&self) -> bool {
        self.per_host > 0 && self.in_flight() >= self.per_host
    }

    /// Waits until no run is in flight.
    pub async fn drained(&self) {
        loop {
            let idle = self.idle.notified();
            if self.in_flight() == 0 {
                return;
            }
            idle.await;
        }
    }
}

/// Why [`RunGate::enter`] admitted no run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// The server is draining.
    ShuttingDown,
    /// The client has its limit of runs in flight.
    TooManyRuns {
        /// The client.
        scope: String,
        /// Its runs in flight.
        n: usize,
    },
    /// The host has its limit of runs in flight, whoever they are for.
    OverCapacity {
        /// The limit (`--max-runs-in-flight`).
        limit: usize,
    },
}

impl Refusal {
    /// The machine-readable code.
    pub fn code(&self) -> &'static str {
        match self {
            Self::ShuttingDown => "shutting_down",
            Self::TooManyRuns { .. } => "too_many_runs",
            Self::OverCapacity { .. } => "over_capacity",
        }
    }

    /// What a person reads: what happened and what to do next.
    pub fn message(&self) -> String {
        match self {
            Self::ShuttingDown => {
                "the server is shutting down and takes no new runs; retry on another host or later"
                    .into()
            }
            Self::TooManyRuns { scope, n } => format!(
                "client {scope} already has {n} runs in flight, its limit; wait for one to finish \
                 (the server's --max-runs-per-token)"
            ),
            Self::OverCapacity { limit } => format!(
                "this host is at its capacity of {limit} runs in flight (--max-runs-in-flight); \
                 retry in {RETRY_AFTER_S} s, here or on another host"
            ),
        }
    }

    /// The JSON-RPC error's `data`: the code, and for a retryable refusal how long to wait.
    pub fn data(&self) -> Value {
        match self {
            Self::OverCapacity { limit } => json!({
                "code": self.code(),
                "retryable": true,
                "retry_after_s": RETRY_AFTER_S,
                "max_runs_in_flight": limit,
            }),
            _ => json!({"code": self.code()}),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn the_gate_limits_runs_per_client_and_refuses_all_once_draining() {
        let gate = RunGate::new(1, 0);
        let a = ClientScope::Token("a".into());
        let first = gate.enter(&a).unwrap();
        assert_eq!(gate.enter(&a).unwrap_err().code(), "too_many_runs");
        let other = gate.enter(&ClientScope::Token("b".into())).unwrap();
        drop(first);
        let again = gate.enter(&a).unwrap();
        assert_eq!(gate.in_flight(), 2);
        gate.start_draining();
        assert_eq!(gate.enter(&a).unwrap_err().code(), "shutting_down");
        drop((other, again));
        assert_eq!(gate.in_flight(), 0);
    }

    #[test]
    fn the_host_cap_counts_every_client_and_says_when_to_retry() {
        let gate = RunGate::new(0, 2);
        let (a, b, c) = (
            ClientScope::Token("a".into()),
            ClientScope::Token("b".into()),
            ClientScope::Token("c".into()),
        );
        let first = gate.enter(&a).unwrap();
        let _second = gate.enter(&b).unwrap();
        assert!(gate.is_full());
        let refused = gate.enter(&c).unwrap_err();
        assert_eq!(refused, Refusal::OverCapacity { limit: 2 });
        assert_eq!(refused.data()["retry_after_s"], RETRY_AFTER_S);
        assert!(refused.message().contains("--max-runs-in-flight"));
        drop(first);
        assert!(!gate.is_full());
        let _third = gate.enter(&c).unwrap();
        assert_eq!(gate.in_flight(), 2);
    }
}
