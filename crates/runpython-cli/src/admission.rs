//! Who is calling and how many runs they may have: the client scope (the process for stdio, the token
//! for HTTP) that is the tenant its runs belong to and that per-client limits live in, and the gate
//! that admits runs (a limit per scope, draining on shutdown).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

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

/// Admission of runs: at most `per_scope` at once per client (0: no limit), and none once draining.
#[derive(Debug, Default)]
pub struct RunGate {
    per_scope: usize,
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
    /// A gate allowing `per_scope` concurrent runs per client (0: unlimited).
    pub fn new(per_scope: usize) -> Arc<Self> {
        Arc::new(Self {
            per_scope,
            ..Self::default()
        })
    }

    /// Admits one run of `scope`, or says why not.
    pub fn enter(
        self: &Arc<Self>,
        scope: &ClientScope,
    ) -> Result<Admitted, (String, &'static str)> {
        if self.draining.load(Ordering::SeqCst) {
            return Err((
                "the server is shutting down and takes no new runs; retry on another host or later"
                    .into(),
                "shutting_down",
            ));
        }
        let mut map = self.in_flight.lock().unwrap_or_else(|p| p.into_inner());
        let n = map.entry(scope.clone()).or_insert(0);
        if self.per_scope > 0 && *n >= self.per_scope {
            return Err((
                format!(
                    "client {scope} already has {n} runs in flight, its limit; wait for one to finish \
                     (the server's --max-runs-per-token)"
                ),
                "too_many_runs",
            ));
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
