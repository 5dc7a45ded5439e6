//! Who holds `serve`'s connection slots, and which connection gives one up when they are taken.
//!
//! A connection is unauthenticated until it makes an authenticated request, then it is its token's
//! (the token of that first request: behind a proxy that reuses connections across clients, the
//! connection counts for the first). Caps: connections in all, unauthenticated ones (so a flood of
//! idle sockets cannot keep an authorized client out), and each token's share (so one tenant cannot
//! hold every slot). A connection in the middle of a request (its head read, its response not yet
//! sent whole) is never closed to make room. When a cap is reached:
//! - with the unauthenticated ones at their cap, a new connection closes the oldest of them that has
//!   sent nothing (neither read yet nor waiting in the kernel, which is asked: a client whose request
//!   is on its way is not taken for an idle one), else the oldest other idle one; with the server
//!   full, it closes an idle connection of the token holding the most (one with no request waiting
//!   first), else an idle unauthenticated one as above; with none, it is refused;
//! - a token at its share that authenticates one more connection closes its own oldest idle one;
//!   with all of its busy, that request is refused (429).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio_util::sync::CancellationToken;

/// How many connections may hold slots, of which ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotLimits {
    /// Connections at once.
    pub max_connections: usize,
    /// Connections at once that have made no authenticated request yet.
    pub max_unauthenticated: usize,
    /// Connections one token may hold (0: no limit).
    pub max_per_token: usize,
}

/// The slots of one server.
#[derive(Debug)]
pub(crate) struct Slots {
    limits: SlotLimits,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    next_id: u64,
    /// By age (ids grow).
    unauthenticated: BTreeMap<u64, Slot>,
    authenticated: BTreeMap<u64, Slot>,
    /// Each token's connections, by age.
    tokens: HashMap<Arc<str>, BTreeSet<u64>>,
}

#[derive(Debug)]
struct Slot {
    tenant: Option<Arc<str>>,
    busy: Arc<AtomicUsize>,
    /// The client has sent a byte or closed (set by the listener before it reads, so that it is never
    /// unset while the bytes are neither waiting nor noted).
    heard: Arc<AtomicBool>,
    /// The socket, to ask the kernel whether bytes wait on it.
    fd: RawFd,
    close: CancellationToken,
    abort: CancellationToken,
}

impl Slot {
    fn idle(&self) -> bool {
        self.busy.load(Ordering::SeqCst) == 0
    }

    /// No byte of the client's waits unread, and (before its first authenticated request) it has
    /// sent none at all.
    fn silent(&self, pending: &impl Fn(RawFd) -> bool) -> bool {
        (self.tenant.is_some() || !self.heard.load(Ordering::SeqCst)) && !pending(self.fd)
    }
}

/// What a connection holds while it is open: its id, its count of requests in flight, and the
/// tokens that ask it to close: `close` once its requests are answered (an authenticated one),
/// `abort` at once (one that has made no authenticated request: nothing of a client's is lost, and
/// its descriptor is free again without waiting on a client that may be trickling headers).
#[derive(Debug, Clone)]
pub(crate) struct Ticket {
    pub id: u64,
    pub busy: Arc<AtomicUsize>,
    pub heard: Arc<AtomicBool>,
    pub close: CancellationToken,
    pub abort: CancellationToken,
}

/// A token at its share of connections, all of them busy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Crowded {
    /// Its connections.
    pub held: usize,
    /// The share (`--max-connections-per-token`).
    pub limit: usize,
}

/// Whether bytes wait unread on the socket `fd` (a peek that takes nothing). A socket the client
/// has closed, or one that cannot be asked, has none.
fn has_pending_bytes(fd: RawFd) -> bool {
    use nix::sys::socket::{recv, MsgFlags};
    let mut byte = [0u8; 1];
    matches!(
        recv(fd, &mut byte, MsgFlags::MSG_PEEK | MsgFlags::MSG_DONTWAIT),
        Ok(n) if n > 0
    )
}

impl Slots {
    pub(crate) fn new(limits: SlotLimits) -> Self {
        Self {
            limits,
            state: Mutex::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A slot for a new connection on socket `fd`, closing another to make room when the caps are
    /// reached; `None` when none can be closed (the new one is refused).
    pub(crate) fn admit(&self, fd: RawFd) -> Option<Ticket> {
        self.admit_with(fd, has_pending_bytes)
    }

    fn admit_with(&self, fd: RawFd, pending: impl Fn(RawFd) -> bool) -> Option<Ticket> {
        let mut state = self.lock();
        let open = state.unauthenticated.len() + state.authenticated.len();
        let crowded = state.unauthenticated.len() >= self.limits.max_unauthenticated;
        if crowded || open >= self.limits.max_connections {
            let victim = state.victim(crowded, &pending)?;
            state.close(victim);
        }
        let id = state.next_id;
        state.next_id += 1;
        let ticket = Ticket {
            id,
            busy: Arc::default(),
            heard: Arc::default(),
            close: CancellationToken::new(),
            abort: CancellationToken::new(),
        };
        state.unauthenticated.insert(
            id,
            Slot {
                tenant: None,
                busy: Arc::clone(&ticket.busy),
                heard: Arc::clone(&ticket.heard),
                fd,
                close: ticket.close.clone(),
                abort: ticket.abort.clone(),
            },
        );
        Some(ticket)
    }

    /// Connection `id` made a request authenticated as `tenant`: from now on it is the tenant's
    /// (if it was no one's). At the tenant's share, its own oldest idle connection is closed to
    /// make room; with all of them busy, this one stays unauthenticated and the request is refused.
    pub(crate) fn authenticate(&self, id: u64, tenant: &str) -> Result<(), Crowded> {
        self.authenticate_with(id, tenant, has_pending_bytes)
    }

    fn authenticate_with(
        &self,
        id: u64,
        tenant: &str,
        pending: impl Fn(RawFd) -> bool,
    ) -> Result<(), Crowded> {
        let mut state = self.lock();
        let Some(mut slot) = state.unauthenticated.remove(&id) else {
            return Ok(()); // already someone's, or being closed
        };
        let limit = self.limits.max_per_token;
        let held = state.tokens.get(tenant).map_or(0, BTreeSet::len);
        if limit > 0 && held >= limit {
            match state.idle_of(tenant, &pending) {
                Some(victim) => state.close(victim),
                None => {
                    state.unauthenticated.insert(id, slot);
                    return Err(Crowded { held, limit });
                }
            }
        }
        let tenant: Arc<str> = Arc::from(tenant);
        state
            .tokens
            .entry(Arc::clone(&tenant))
            .or_default()
            .insert(id);
        slot.tenant = Some(tenant);
        state.authenticated.insert(id, slot);
        Ok(())
    }

    /// True while connection `id` has made no authenticated request.
    pub(crate) fn is_unauthenticated(&self, id: u64) -> bool {
        self.lock().unauthenticated.contains_key(&id)
    }

    /// Connection `id` has closed: its slot is free.
    pub(crate) fn release(&self, id: u64) {
        self.lock().forget(id);
    }

    /// Connections holding slots: unauthenticated ones, and each token's.
    #[cfg(test)]
    fn counts(&self) -> (usize, Vec<(String, usize)>) {
        let state = self.lock();
        let mut tokens: Vec<(String, usize)> = state
            .tokens
            .iter()
            .map(|(t, ids)| (t.to_string(), ids.len()))
            .collect();
        tokens.sort();
        (state.unauthenticated.len(), tokens)
    }
}

impl State {
    /// The connection to close for a new one: see the module docs for the order.
    fn victim(&self, crowded: bool, pending: &impl Fn(RawFd) -> bool) -> Option<u64> {
        let unauthenticated = || first_idle(self.unauthenticated.iter(), pending);
        if crowded {
            // None when every unauthenticated one is in the middle of a request: refused.
            return unauthenticated();
        }
        // Full, with room for unauthenticated ones: the token holding the most gives one up (a
        // new connection, whose request may be on its way, is not taken for a hoarder's).
        let mut tokens: Vec<(&Arc<str>, usize)> =
            self.tokens.iter().map(|(t, ids)| (t, ids.len())).collect();
        tokens.sort_by_key(|&(_, held)| std::cmp::Reverse(held));
        tokens
            .into_iter()
            .find_map(|(tenant, _)| self.idle_of(tenant, pending))
            .or_else(unauthenticated)
    }

    /// The oldest idle connection of `tenant` (one with no bytes waiting first).
    fn idle_of(&self, tenant: &str, pending: &impl Fn(RawFd) -> bool) -> Option<u64> {
        let ids = self.tokens.get(tenant)?;
        first_idle(
            ids.iter()
                .filter_map(|id| self.authenticated.get(id).map(|slot| (id, slot))),
            pending,
        )
    }

    /// Closes connection `id` (idle: it was chosen so) and frees its slot at once.
    fn close(&mut self, id: u64) {
        if let Some(slot) = self.forget(id) {
            match slot.tenant {
                Some(_) => slot.close.cancel(),
                None => slot.abort.cancel(),
            }
        }
    }

    fn forget(&mut self, id: u64) -> Option<Slot> {
        if let Some(slot) = self.unauthenticated.remove(&id) {
            return Some(slot);
        }
        let slot = self.authenticated.remove(&id)?;
        if let Some(tenant) = &slot.tenant {
            if let Some(ids) = self.tokens.get_mut(tenant) {
                ids.remove(&id);
                if ids.is_empty() {
                    self.tokens.remove(tenant);
                }
            }
        }
        Some(slot)
    }
}

/// Of `slots` (oldest first), the first idle and silent one, else the first idle one.
fn first_idle<'a>(
    slots: impl Iterator<Item = (&'a u64, &'a Slot)> + Clone,
    pending: &impl Fn(RawFd) -> bool,
) -> Option<u64> {
    let mut idle = slots.filter(|(_, slot)| slot.idle());
    idle.clone()
        .find(|(_, slot)| slot.silent(pending))
        .or_else(|| idle.next())
        .map(|(id, _)| *id)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn slots(max_connections: usize, max_unauthenticated: usize, max_per_token: usize) -> Slots {
        Slots::new(SlotLimits {
            max_connections,
            max_unauthenticated,
            max_per_token,
        })
    }

    fn closed(ticket: &Ticket) -> bool {
        ticket.close.is_cancelled() || ticket.abort.is_cancelled()
    }

    /// The fds of connections whose client has sent bytes not read yet.
    fn talking(fds: &'static [RawFd]) -> impl Fn(RawFd) -> bool {
        move |fd| fds.contains(&fd)
    }

    #[test]
    fn an_unauthenticated_flood_closes_the_oldest_silent_one_before_a_client_whose_request_waits() {
        let slots = slots(16, 3, 0);
        let first = slots.admit_with(1, talking(&[])).unwrap();
        let waiting = slots.admit_with(2, talking(&[])).unwrap();
        let third = slots.admit_with(3, talking(&[])).unwrap();
        // Connection 1's request is on its way: connection 2, silent, goes first, then 3.
        slots.admit_with(4, talking(&[1])).unwrap();
        assert!(closed(&waiting) && !closed(&first));
        slots.admit_with(5, talking(&[1])).unwrap();
        assert!(closed(&third) && !closed(&first));
        // One whose bytes were read already (its head not whole yet) has spoken too.
        let fourth_read = slots.admit_with(7, talking(&[1])).unwrap();
        fourth_read.heard.store(true, Ordering::SeqCst);
        // With only talking ones left idle, the oldest of them; closed at once, never drained.
        slots.admit_with(8, talking(&[1, 4, 5])).unwrap();
        assert!(first.abort.is_cancelled() && !first.close.is_cancelled());
        assert!(!closed(&fourth_read));
    }

    #[test]
    fn a_connection_in_the_middle_of_a_request_is_never_closed_for_another() {
        let slots = slots(16, 2, 0);
        let a = slots.admit_with(1, talking(&[])).unwrap();
        let b = slots.admit_with(2, talking(&[])).unwrap();
        a.busy.fetch_add(1, Ordering::SeqCst);
        b.busy.fetch_add(1, Ordering::SeqCst);
        assert!(slots.admit_with(3, talking(&[])).is_none());
        b.busy.fetch_sub(1, Ordering::SeqCst);
        slots.admit_with(3, talking(&[])).unwrap();
        assert!(closed(&b) && !closed(&a));
    }

    #[test]
    fn a_full_server_closes_an_idle_connection_of_the_token_holding_the_most() {
        let slots = slots(4, 4, 0);
        let ticket = |fd| slots.admit_with(fd, talking(&[])).unwrap();
        let (a1, a2, a3, b1) = (ticket(1), ticket(2), ticket(3), ticket(4));
        for (t, who) in [(&a1, "alice"), (&a2, "alice"), (&a3, "alice"), (&b1, "bob")] {
            slots.authenticate_with(t.id, who, talking(&[])).unwrap();
        }
        a1.busy.fetch_add(1, Ordering::SeqCst);
        let carol = slots.admit_with(5, talking(&[])).unwrap();
        // Alice holds the most; her oldest idle one (not the busy a1) makes room, once idle.
        assert!(a2.close.is_cancelled() && !a2.abort.is_cancelled());
        assert!(!closed(&a1) && !closed(&a3) && !closed(&b1));
        // Carol's connection, not yet authenticated, is not taken for the next newcomer's: alice's
        // last idle one is.
        let dave = slots.admit_with(6, talking(&[])).unwrap();
        assert!(closed(&a3) && !closed(&carol));
        slots
            .authenticate_with(carol.id, "carol", talking(&[]))
            .unwrap();
        slots
            .authenticate_with(dave.id, "dave", talking(&[]))
            .unwrap();
        assert_eq!(
            slots.counts(),
            (
                0,
                vec![
                    ("alice".into(), 1),
                    ("bob".into(), 1),
                    ("carol".into(), 1),
                    ("dave".into(), 1)
                ]
            )
        );
    }

    #[test]
    fn a_token_at_its_share_gives_up_its_own_idle_connection_or_is_refused() {
        let slots = slots(16, 16, 2);
        let ticket = |fd| slots.admit_with(fd, talking(&[])).unwrap();
        let (a1, a2, a3) = (ticket(1), ticket(2), ticket(3));
        slots
            .authenticate_with(a1.id, "alice", talking(&[]))
            .unwrap();
        slots
            .authenticate_with(a2.id, "alice", talking(&[]))
            .unwrap();
        slots
            .authenticate_with(a3.id, "alice", talking(&[]))
            .unwrap();
        assert!(closed(&a1) && !closed(&a2));
        a2.busy.fetch_add(1, Ordering::SeqCst);
        a3.busy.fetch_add(1, Ordering::SeqCst);
        let a4 = ticket(4);
        assert_eq!(
            slots.authenticate_with(a4.id, "alice", talking(&[])),
            Err(Crowded { held: 2, limit: 2 })
        );
        // Refused, it is still unauthenticated (and closes after its refusal); bob is not held.
        assert!(slots.is_unauthenticated(a4.id));
        let b1 = ticket(5);
        slots.authenticate_with(b1.id, "bob", talking(&[])).unwrap();
        slots.release(a2.id);
        slots
            .authenticate_with(a4.id, "alice", talking(&[]))
            .unwrap();
        assert_eq!(
            slots.counts(),
            (0, vec![("alice".into(), 2), ("bob".into(), 1)])
        );
    }
}
