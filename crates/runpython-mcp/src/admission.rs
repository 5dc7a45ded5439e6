//! Who is calling and how many runs they may have: the client scope (the process for stdio, the token
//! for HTTP) that is the tenant its runs belong to and that per-client limits live in, and the gate
//! that admits runs (a limit per scope, the host's capacity shared fairly among its tenants,
//! draining on shutdown).
//!
//! The host's share: while it has room, every run is admitted. Once it is full, a tenant holding
//! fewer runs than its fair share (the capacity divided among the tenants with runs in flight or
//! waiting, the caller included, rounded up) waits for the next place that frees, and places are
//! handed to waiting tenants in turn: the one holding the fewest runs first, then the one waiting
//! longest. A tenant holding its share or more is refused at once with an error a client (or a
//! proxy) can retry elsewhere: [`OVER_CAPACITY`] as a JSON-RPC error whose data says
//! `over_capacity` and `retry_after_s` (the HTTP server says the same with a 503 and `Retry-After`
//! before the request reaches the MCP service). So no tenant is refused for capacity while another
//! holds more than its share, and one flooding the host waits behind everyone else's turn.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};
use tokio::sync::{oneshot, Notify};

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

/// Admission of runs: at most `per_scope` at once per client and `per_host` in all (0: no limit),
/// the host's places shared among its tenants (see the module docs), and none once draining.
#[derive(Debug)]
pub struct RunGate {
    per_scope: usize,
    per_host: usize,
    /// How long a call entitled to a place waits for one (the runs ahead of it end by then).
    wait: Duration,
    state: Mutex<GateState>,
    draining: AtomicBool,
    idle: Notify,
}

#[derive(Debug, Default)]
struct GateState {
    in_flight: HashMap<ClientScope, usize>,
    total: usize,
    /// Calls waiting for a place, in the order they came.
    waiting: Vec<Waiter>,
    next_ticket: u64,
}

#[derive(Debug)]
struct Waiter {
    ticket: u64,
    scope: ClientScope,
    /// Told once a place is taken for it.
    admit: oneshot::Sender<()>,
}

impl GateState {
    fn held(&self, scope: &ClientScope) -> usize {
        self.in_flight.get(scope).copied().unwrap_or(0)
    }

    fn take(&mut self, scope: &ClientScope) {
        *self.in_flight.entry(scope.clone()).or_insert(0) += 1;
        self.total += 1;
    }

    fn give_back(&mut self, scope: &ClientScope) {
        if let Some(n) = self.in_flight.get_mut(scope) {
            *n -= 1;
            if *n == 0 {
                self.in_flight.remove(scope);
            }
        }
        self.total -= 1;
    }

    /// `scope`'s fair share of `per_host` places: divided among the tenants with runs in flight or
    /// waiting, and `scope`, rounded up.
    fn share(&self, scope: &ClientScope, per_host: usize) -> usize {
        let mut tenants: Vec<&ClientScope> = self.in_flight.keys().collect();
        tenants.extend(
            self.waiting
                .iter()
                .filter(|w| !w.admit.is_closed())
                .map(|w| &w.scope),
        );
        tenants.push(scope);
        tenants.sort_by_key(|s| s.to_string());
        tenants.dedup();
        per_host.div_ceil(tenants.len())
    }

    /// Hands free places to waiting calls: the one whose tenant holds the fewest runs first, then
    /// the one waiting longest; a call that stopped waiting is passed over.
    fn hand_off(&mut self, per_host: usize) {
        while self.total < per_host {
            self.waiting.retain(|w| !w.admit.is_closed());
            let Some(next) =
                (0..self.waiting.len()).min_by_key(|&i| self.held(&self.waiting[i].scope))
            else {
                return;
            };
            let waiter = self.waiting.remove(next);
            self.take(&waiter.scope);
            if waiter.admit.send(()).is_err() {
                self.give_back(&waiter.scope);
            }
        }
    }
}

/// A call waiting for a place. However its wait ends (a place, the time it may wait, a drain, or
/// the call dropped), it leaves the queue, and a place handed to it is either its or given back.
struct Waiting<'a> {
    gate: &'a Arc<RunGate>,
    ticket: u64,
    scope: &'a ClientScope,
    admitted: Option<oneshot::Receiver<()>>,
}

impl Waiting<'_> {
    async fn outcome(&mut self) -> Result<Admitted, Refusal> {
        let handed = match self.admitted.as_mut() {
            Some(admitted) => matches!(
                tokio::time::timeout(self.gate.wait, admitted).await,
                Ok(Ok(()))
            ),
            None => false,
        };
        // From here on nothing is awaited: the wait is over, and nothing is left for `drop`.
        let admitted = self.admitted.take();
        let mut state = self.gate.lock();
        // Under the lock a place is either handed to this call (and said) or not: no third way.
        if handed || admitted.is_some_and(|mut a| a.try_recv().is_ok()) {
            return Ok(self.gate.admitted(self.scope));
        }
        state.waiting.retain(|w| w.ticket != self.ticket);
        Err(match self.gate.draining.load(Ordering::SeqCst) {
            true => Refusal::ShuttingDown,
            false => Refusal::OverCapacity {
                limit: self.gate.per_host,
            },
        })
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        // Dropped while waiting (the call was cancelled): a place handed to it meanwhile goes on.
        if let Some(mut admitted) = self.admitted.take() {
            let mut state = self.gate.lock();
            state.waiting.retain(|w| w.ticket != self.ticket);
            if admitted.try_recv().is_ok() {
                state.give_back(self.scope);
                state.hand_off(self.gate.per_host);
            }
        }
    }
}

/// A run admitted by [`RunGate::enter`]; leaving it frees the place.
#[derive(Debug)]
pub struct Admitted {
    gate: Arc<RunGate>,
    scope: ClientScope,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        let mut state = self.gate.lock();
        state.give_back(&self.scope);
        if self.gate.per_host > 0 {
            state.hand_off(self.gate.per_host);
        }
        if state.total == 0 {
            self.gate.idle.notify_waiters();
        }
    }
}

impl RunGate {
    /// A gate allowing `per_scope` concurrent runs per client and `per_host` in all (0: unlimited),
    /// a call entitled to a place waiting at most `wait` for one.
    pub fn new(per_scope: usize, per_host: usize, wait: Duration) -> Arc<Self> {
        Arc::new(Self {
            per_scope,
            per_host,
            wait,
            state: Mutex::default(),
            draining: AtomicBool::new(false),
            idle: Notify::new(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, GateState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn admitted(self: &Arc<Self>, scope: &ClientScope) -> Admitted {
        Admitted {
            gate: Arc::clone(self),
            scope: scope.clone(),
        }
    }

    /// Admits one run of `scope` (waiting for a place when it is entitled to one), or says why
    /// not.
    pub async fn enter(self: &Arc<Self>, scope: &ClientScope) -> Result<Admitted, Refusal> {
        let (ticket, admitted) = {
            let mut state = self.lock();
            if self.draining.load(Ordering::SeqCst) {
                return Err(Refusal::ShuttingDown);
            }
            let held = state.held(scope);
            if self.per_scope > 0 && held >= self.per_scope {
                return Err(Refusal::TooManyRuns {
                    scope: scope.to_string(),
                    n: held,
                });
            }
            if self.per_host == 0 || state.total < self.per_host {
                state.take(scope);
                return Ok(self.admitted(scope));
            }
            if held >= state.share(scope, self.per_host) {
                return Err(Refusal::OverCapacity {
                    limit: self.per_host,
                });
            }
            let (admit, admitted) = oneshot::channel();
            let ticket = state.next_ticket;
            state.next_ticket += 1;
            state.waiting.push(Waiter {
                ticket,
                scope: scope.clone(),
                admit,
            });
            (ticket, admitted)
        };
        let mut waiting = Waiting {
            gate: self,
            ticket,
            scope,
            admitted: Some(admitted),
        };
        waiting.outcome().await
    }

    /// The refusal a run of `scope` would get at once for the host's capacity: the host is full
    /// and `scope` holds its share (a call entitled to a place waits for it instead).
    pub fn refuses_at_once(&self, scope: &ClientScope) -> Option<Refusal> {
        if self.per_host == 0 {
            return None;
        }
        let state = self.lock();
        let full = state.total >= self.per_host;
        (full && state.held(scope) >= state.share(scope, self.per_host)).then_some(
            Refusal::OverCapacity {
                limit: self.per_host,
            },
        )
    }

    /// Takes no new runs from now on; calls waiting for a place are refused.
    pub fn start_draining(&self) {
        self.draining.store(true, Ordering::SeqCst);
        self.lock().waiting.clear();
    }

    /// True once [`RunGate::start_draining`] was called.
    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }

    /// Runs in flight.
    pub fn in_flight(&self) -> usize {
        self.lock().total
    }

    /// The host's limit on runs in flight (0: none).
    pub fn capacity(&self) -> usize {
        self.per_host
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
                "this host is at its capacity of {limit} runs in flight (--max-runs-in-flight) and \
                 this client holds its share of them (or waited its turn in vain); retry in \
                 {RETRY_AFTER_S} s, here or on another host"
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

    fn token(name: &str) -> ClientScope {
        ClientScope::Token(name.into())
    }

    const WAIT: Duration = Duration::from_secs(5);

    #[tokio::test]
    async fn the_gate_limits_runs_per_client_and_refuses_all_once_draining() {
        let gate = RunGate::new(1, 0, WAIT);
        let a = token("a");
        let first = gate.enter(&a).await.unwrap();
        assert_eq!(gate.enter(&a).await.unwrap_err().code(), "too_many_runs");
        let other = gate.enter(&token("b")).await.unwrap();
        drop(first);
        let again = gate.enter(&a).await.unwrap();
        assert_eq!(gate.in_flight(), 2);
        gate.start_draining();
        assert_eq!(gate.enter(&a).await.unwrap_err().code(), "shutting_down");
        drop((other, again));
        assert_eq!(gate.in_flight(), 0);
    }

    #[tokio::test]
    async fn a_tenant_at_its_share_of_a_full_host_is_refused_at_once_and_says_when_to_retry() {
        let gate = RunGate::new(0, 2, WAIT);
        let (a, b) = (token("a"), token("b"));
        let _first = gate.enter(&a).await.unwrap();
        let _second = gate.enter(&b).await.unwrap();
        // Full, a and b holding one each: their share of two places.
        let refused = gate.refuses_at_once(&a).unwrap();
        assert_eq!(refused, Refusal::OverCapacity { limit: 2 });
        assert_eq!(refused.data()["retry_after_s"], RETRY_AFTER_S);
        assert!(refused.message().contains("--max-runs-in-flight"));
        assert_eq!(gate.enter(&a).await.unwrap_err(), refused);
    }

    #[tokio::test]
    async fn a_tenant_under_its_share_waits_for_the_next_place_ahead_of_the_one_flooding() {
        let gate = RunGate::new(0, 2, WAIT);
        let (flood, other) = (token("flood"), token("other"));
        let held = [
            gate.enter(&flood).await.unwrap(),
            gate.enter(&flood).await.unwrap(),
        ];
        assert!(gate.refuses_at_once(&flood).is_some());
        assert!(gate.refuses_at_once(&other).is_none());
        let waiting = {
            let (gate, other) = (Arc::clone(&gate), other.clone());
            tokio::spawn(async move { gate.enter(&other).await })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        // The flooder holds more than its share now that another waits: refused at once.
        assert_eq!(
            gate.enter(&flood).await.unwrap_err().code(),
            "over_capacity"
        );
        let [first, _second] = held;
        drop(first);
        let admitted = waiting.await.unwrap().unwrap();
        assert_eq!(gate.in_flight(), 2);
        drop(admitted);
    }

    #[tokio::test]
    async fn places_go_to_waiting_tenants_in_turn_the_one_holding_fewest_first() {
        let gate = RunGate::new(0, 3, WAIT);
        let (a, b, c) = (token("a"), token("b"), token("c"));
        let a1 = gate.enter(&a).await.unwrap();
        let _a2 = gate.enter(&a).await.unwrap();
        let _b1 = gate.enter(&b).await.unwrap();
        let spawn = |scope: ClientScope| {
            let gate = Arc::clone(&gate);
            tokio::spawn(async move { gate.enter(&scope).await.map(|adm| (scope, adm)) })
        };
        // b (holding one) waits first, c (holding none) after: c's turn comes first.
        let b_waits = spawn(b.clone());
        tokio::time::sleep(Duration::from_millis(20)).await;
        let c_waits = spawn(c.clone());
        tokio::time::sleep(Duration::from_millis(20)).await;
        drop(a1);
        let (scope, _c1) = c_waits.await.unwrap().unwrap();
        assert_eq!(scope, c);
        assert!(!b_waits.is_finished());
        b_waits.abort();
    }

    #[tokio::test]
    async fn a_call_that_waits_too_long_or_through_a_drain_is_refused_and_holds_nothing() {
        let gate = RunGate::new(0, 1, Duration::from_millis(50));
        let (a, b) = (token("a"), token("b"));
        let held = gate.enter(&a).await.unwrap();
        assert_eq!(gate.enter(&b).await.unwrap_err().code(), "over_capacity");
        let waiting = {
            let (gate, b) = (Arc::clone(&gate), b.clone());
            tokio::spawn(async move { gate.enter(&b).await })
        };
        tokio::time::sleep(Duration::from_millis(10)).await;
        gate.start_draining();
        assert_eq!(waiting.await.unwrap().unwrap_err().code(), "shutting_down");
        drop(held);
        assert_eq!(gate.in_flight(), 0);
    }
}
