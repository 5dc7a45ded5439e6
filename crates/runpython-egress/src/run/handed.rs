//! The connections the host handed to a run: each a TCP socket of the host's namespace that the host
//! connected to the decided address and put in place of the run's own ([`super::handover`]). The host
//! keeps no descriptor of one (the run's close must close it), so what it moved is the kernel's count
//! ([`super::diag`]): asked for while the socket lives, when a report is settled, and told once more
//! as it is destroyed. Each counts into the run's report like a relayed connection, and into its live
//! connections until it is destroyed.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use super::diag::{self, Counts, Ended, SocketId, Watch};
use super::{Counters, Shared};

/// How long a settle waits for the kernel's word on a socket that is gone but not yet reported
/// destroyed (the report is queued on a work queue).
const DESTROY_WAIT: Duration = Duration::from_millis(250);

/// One handed connection.
pub(crate) struct Conn {
    id: SocketId,
    counters: Arc<Counters>,
    /// Its entry in the run's log.
    index: usize,
    /// What was counted into the report so far.
    seen: Mutex<Counts>,
    ended: AtomicBool,
    shared: Weak<Shared>,
}

impl Conn {
    /// Counts what `counts` adds to what was seen.
    fn apply(&self, counts: Counts) {
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        self.counters.sent(counts.sent.saturating_sub(seen.sent));
        self.counters
            .received(counts.received.saturating_sub(seen.received));
        if counts.answered && !seen.answered {
            if let Some(shared) = self.shared.upgrade() {
                shared.made();
            }
        }
        seen.sent = seen.sent.max(counts.sent);
        seen.received = seen.received.max(counts.received);
        seen.answered |= counts.answered;
    }

    /// The connection is over: it no longer counts among the run's live ones, and one whose
    /// destination never answered is logged as failed.
    fn end(&self) {
        if self.ended.swap(true, Ordering::SeqCst) {
            return;
        }
        let answered = self.seen.lock().unwrap_or_else(|p| p.into_inner()).answered;
        if let Some(shared) = self.shared.upgrade() {
            if !answered {
                shared.failed(
                    self.index,
                    "the destination did not accept the connection".into(),
                );
            }
            shared.leave_live();
        }
    }
}

impl Ended for Conn {
    fn ended(&self, counts: Counts) {
        self.apply(counts);
        self.end();
    }
}

/// A run's handed connections.
#[derive(Default)]
pub(crate) struct Handed {
    open: Mutex<Vec<Arc<Conn>>>,
    /// The cookie of every socket handed to the run, for as long as the run lasts.
    all: Mutex<std::collections::HashSet<u64>>,
}

impl Handed {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Arc<Conn>>> {
        self.open.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether `cookie` is one of the sockets handed to the run.
    pub(crate) fn holds(&self, cookie: u64) -> bool {
        self.all
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(&cookie)
    }

    /// Starts counting a connection about to be handed over (before the run can close it: the
    /// kernel's word on its end must find it watched). `answered`: the host saw it connect.
    pub(crate) fn add(
        &self,
        shared: &Arc<Shared>,
        id: SocketId,
        counters: Arc<Counters>,
        index: usize,
        answered: bool,
    ) -> std::io::Result<Arc<Conn>> {
        let conn = Arc::new(Conn {
            id,
            counters,
            index,
            seen: Mutex::new(Counts {
                answered,
                ..Counts::default()
            }),
            ended: AtomicBool::new(false),
            shared: Arc::downgrade(shared),
        });
        if answered {
            shared.made();
        }
        let as_ended: Arc<dyn Ended> = conn.clone();
        Watch::get()?.watch(id.cookie, Arc::downgrade(&as_ended))?;
        self.all
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id.cookie);
        self.lock().push(Arc::clone(&conn));
        Ok(conn)
    }

    /// The handover failed after [`Handed::add`]: the connection never reached the run.
    pub(crate) fn abandon(&self, conn: &Arc<Conn>) {
        if let Ok(watch) = Watch::get() {
            watch.forget(conn.id.cookie);
        }
        self.lock().retain(|c| !Arc::ptr_eq(c, conn));
        conn.ended.store(true, Ordering::SeqCst);
    }

    /// Brings every open connection's counts up to what the kernel counted: asked for those alive,
    /// waited for (a little) for those destroyed and not yet reported.
    pub(crate) async fn settle(&self) {
        let open: Vec<Arc<Conn>> = self.lock().clone();
        if open.is_empty() {
            return;
        }
        let mut gone = Vec::new();
        for conn in open {
            if conn.ended.load(Ordering::SeqCst) {
                continue;
            }
            match diag::query(&conn.id) {
                Ok(Some(counts)) => conn.apply(counts),
                Ok(None) => gone.push(conn),
                Err(_) => {} // asked again at the next settle
            }
        }
        let started = Instant::now();
        while gone.iter().any(|c| !c.ended.load(Ordering::SeqCst)) {
            if started.elapsed() > DESTROY_WAIT {
                // Its report was lost (the watch's queue overflowed): what was seen stands.
                for conn in &gone {
                    if let Ok(watch) = Watch::get() {
                        watch.forget(conn.id.cookie);
                    }
                    conn.end();
                }
                break;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        self.lock().retain(|c| !c.ended.load(Ordering::SeqCst));
    }

    /// Stops watching the run's connections (its egress is dropped: their sockets are the run's
    /// and end with it).
    pub(crate) fn forget_all(&self) {
        if let Ok(watch) = Watch::get() {
            for conn in self.lock().drain(..) {
                watch.forget(conn.id.cookie);
            }
        }
    }
}
