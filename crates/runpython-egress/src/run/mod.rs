//! One run's egress: the network it needs, decided on the host for every connection and every
//! lookup.
//!
//! A run whose network the sandbox mediates has a network namespace of its own, empty but for its
//! loopback, on which the host holds three endpoints the run's first process made for it (the
//! sandbox's `egress/setup.rs`, handed out as [`EgressFds`]): a resolver on `127.0.0.1:53` (UDP and
//! TCP), and a relay on `127.0.0.1:1` and `[::1]:1`. The interpreter runs under a seccomp filter
//! that hands every `connect(2)` to the host (a user notification):
//!
//! - TCP: the host decides with the [`NetworkPolicy`], on the address and on the names this run
//!   resolved to it ([`crate::policy`]). Refused: the connect fails at once with `EACCES` (the runner
//!   asks its resolver why, [`why`], and names the rule in the exception). A loopback address the
//!   code named itself and the policy does not allow is the run's own: where the run listens there
//!   ([`listening`]) the connect reaches its server, elsewhere it is refused like any other address.
//!   Allowed, where the sandbox's guard is in force ([`handover`]): the host makes a TCP socket of its
//!   own, connects it to the decided address and puts it in place of the run's, so the kernel carries
//!   the bytes and counts them ([`handed`], [`diag`]). Otherwise (a run with secrets, a destination
//!   behind the host's proxy, a kernel without the guard): the host connects to the destination
//!   itself (through `HTTPS_PROXY` when the host has one, by the decided address), then connects the
//!   run's own socket (a copy of its descriptor, `pidfd_getfd`) to the relay inside the run's
//!   namespace, and the relay joins the two ([`pump`]: spliced by the kernel), counting bytes. Either
//!   way a blocking connect returns once the destination answered, with its real error if it did not;
//!   a non-blocking one (Python's sockets with a timeout, asyncio) returns `EINPROGRESS` at once.
//! - Under the guard, the run's binds, listens and connects inside its own namespace and its device
//!   ioctls are performed by the host on the socket it inspected ([`perform`]).
//! - UDP: to the run's resolver or its own loopback only; anything else is refused (QUIC falls back
//!   to TCP). Unix sockets: the kernel's own connect, which cannot leave the run's namespace.
//! - Names: the resolver answers what the policy lets resolve, from the host's resolver (or a pin),
//!   keeping only addresses the policy could allow; a refused name does not resolve.
//!
//! Why this way and not a TUN device with a user-space TCP/IP stack (smoltcp), or proxy variables:
//! proxy variables leave every client that ignores them (a raw socket, a database driver) to fail or
//! to need special handling, and a TUN device needs `/dev/net/tun`, which an unprivileged host often
//! cannot open, and a second TCP stack per connection. Here the code keeps the kernel's sockets with
//! their real semantics, and the host decides every connection before a packet leaves. A socket of the
//! host's namespace is in the run's hands only under the guard, where nothing it does to it
//! (reconnecting it, TCP Fast Open, another architecture's system calls, a race on the address it
//! passed, source routing, device ioctls) reaches anything but the connection the host made
//! (ARCHITECTURE.md, "Handed over, not relayed"). It works the same for a root and an unprivileged
//! host.

mod call;
pub(crate) mod credentials;
mod diag;
mod dns;
mod handed;
mod handover;
mod listening;
mod notify;
mod perform;
mod pump;
mod relay;
mod report;
pub(crate) mod secrets;
mod sock;
mod target;
mod upstream;
mod why;

use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use runpython_sandbox::{EgressChannel, EgressFds};

use crate::policy::{HostAddrs, HostPattern, NetworkPolicy, Verdict};

pub(crate) use report::Counters;
use report::{Log, Refusals, Totals};
pub use report::{LogEntry, Mark, NetworkReport, Refusal};

/// Log entries a run keeps; past them, the log says how many it left out (the report's counts
/// cover everything).
const MAX_LOG_ENTRIES: usize = 10_000;

/// Refusals the envelope names; past them, they are counted.
const MAX_REFUSED_LISTED: usize = 16;

/// Connections one run may hold at once, relayed or handed over (a handed one counts until the
/// kernel destroys its socket).
pub(crate) const MAX_LIVE_CONNECTIONS: usize = 256;

/// What the notification handler, the relay and the resolver share for one run.
pub(crate) struct Shared {
    pub policy: Arc<NetworkPolicy>,
    pub host: Arc<HostAddrs>,
    /// Why the host's addresses are unknown, when they are: every connection is refused.
    pub host_unknown: Option<String>,
    pub resolved: Arc<dns::Resolved>,
    pub upstream: upstream::Upstream,
    pub pairing: relay::Pairing,
    started: Instant,
    log: Mutex<Log>,
    /// The report's totals, counted apart from the bounded log.
    totals: Arc<Totals>,
    /// The report's refusals, remembered apart from the log.
    refusals: Mutex<Refusals>,
    /// The latest refusals, for the runner's exception message.
    reasons: Mutex<std::collections::VecDeque<why::Remembered>>,
    live: AtomicU64,
    /// Set when the run's egress is dropped: every relayed connection closes.
    pub shutdown: tokio::sync::watch::Sender<bool>,
    /// A run's narrowing of the policy (its request's hosts): a connection must pass both.
    narrow: Mutex<Option<Arc<NetworkPolicy>>>,
    /// The run's secrets (placeholders, its CA), when the policy has any.
    pub secrets: Option<Arc<secrets::RunSecrets>>,
    /// The connections handed to the run, counted by the kernel.
    pub handed: handed::Handed,
    /// What the host learns of the run's namespace once its descriptors arrive.
    inside: OnceLock<Inside>,
    /// The cookie of the host's network namespace (`SO_NETNS_COOKIE`), where the kernel has it: a
    /// socket of that namespace in the run's hands is one the host handed over.
    pub host_netns: Option<u64>,
}

/// What the host holds of the run's namespace: whether the guard is in force, a fresh socket's
/// buffer sizes there, and sockets of each family there to answer the device ioctls of a handed
/// socket with.
struct Inside {
    guarded: bool,
    defaults: handover::RunDefaults,
    v4: Option<OwnedFd>,
    v6: Option<OwnedFd>,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, Log> {
        self.log.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn refusals(&self) -> std::sync::MutexGuard<'_, Refusals> {
        self.refusals.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Counts a refusal into the report (the log has its own entry, while it has room).
    fn note_refusal(&self, host: String, port: Option<u16>, reason: String) {
        self.totals.refusals.fetch_add(1, Ordering::Relaxed);
        self.refusals().note(Refusal { host, port, reason });
    }

    fn elapsed_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// Logs a lookup.
    pub(crate) fn lookup(&self, lookup: dns::Lookup) {
        self.totals.lookups.fetch_add(1, Ordering::Relaxed);
        if let Some(reason) = &lookup.refused {
            self.note_refusal(lookup.name.clone(), None, reason.clone());
        }
        let entry = LogEntry {
            at_ms: self.elapsed_ms(),
            kind: "lookup",
            name: Some(lookup.name),
            addr: None,
            port: None,
            decision: if lookup.refused.is_some() {
                "refused"
            } else {
                "allowed"
            },
            rule: None,
            reason: lookup.refused,
            answers: lookup.answered,
            via: None,
            bytes_out: 0,
            bytes_in: 0,
            counters: None,
        };
        self.push(entry);
    }

    /// Logs a refused connect and remembers why, for the runner.
    pub(crate) fn refused(
        &self,
        kind: &'static str,
        name: Option<String>,
        addr: IpAddr,
        port: u16,
        reason: String,
    ) {
        {
            let mut reasons = self.reasons.lock().unwrap_or_else(|p| p.into_inner());
            if reasons.len() >= why::REMEMBERED {
                reasons.pop_front();
            }
            reasons.push_back(why::Remembered {
                addr: addr.to_string(),
                name: name.clone(),
                port,
                reason: reason.clone(),
            });
        }
        self.note_refusal(
            name.clone().unwrap_or_else(|| addr.to_string()),
            Some(port),
            reason.clone(),
        );
        self.push(LogEntry {
            at_ms: self.elapsed_ms(),
            kind,
            name,
            addr: Some(addr),
            port: Some(port),
            decision: "refused",
            rule: None,
            reason: Some(reason),
            answers: Vec::new(),
            via: None,
            bytes_out: 0,
            bytes_in: 0,
            counters: None,
        });
    }

    /// Logs an allowed connection carried `via` the kernel or the relay; its bytes are counted into
    /// what this returns.
    pub(crate) fn connected(
        &self,
        name: Option<String>,
        dest: SocketAddr,
        rule: Option<String>,
        via: &'static str,
    ) -> (Arc<Counters>, usize) {
        let counters = Arc::new(Counters::of(&self.totals));
        let index = self.push(LogEntry {
            at_ms: self.elapsed_ms(),
            kind: "connect",
            name,
            addr: Some(dest.ip()),
            port: Some(dest.port()),
            decision: "allowed",
            rule,
            reason: None,
            answers: Vec::new(),
            via: Some(via),
            bytes_out: 0,
            bytes_in: 0,
            counters: Some(Arc::clone(&counters)),
        });
        (counters, index)
    }

    /// An allowed connection whose destination answered: it counts as made.
    pub(crate) fn made(&self) {
        self.totals.connections.fetch_add(1, Ordering::Relaxed);
    }

    /// An allowed connection whose destination did not answer: its entry says so.
    pub(crate) fn failed(&self, index: usize, why: String) {
        let mut log = self.lock();
        if let Some(entry) = log.entries.get_mut(index) {
            entry.decision = "failed";
            entry.reason = Some(why);
        }
    }

    fn push(&self, entry: LogEntry) -> usize {
        let mut log = self.lock();
        if log.entries.len() >= MAX_LOG_ENTRIES {
            log.dropped += 1;
            return usize::MAX;
        }
        log.entries.push(entry);
        log.entries.len() - 1
    }

    /// The decision on a TCP connect to `ip:port`, reached through `names`: the policy's, and the
    /// run's narrowing of it.
    pub(crate) fn decide(&self, ip: IpAddr, port: u16, names: &[&str]) -> Verdict {
        if let Some(why) = &self.host_unknown {
            return Verdict::Refuse {
                reason: why.clone(),
            };
        }
        let verdict = self.policy.decide(ip, port, names, &self.host);
        let narrow = self
            .narrow
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        match (verdict, narrow) {
            (Verdict::Allow { rule }, Some(narrow)) => {
                match narrow.decide(ip, port, names, &self.host) {
                    Verdict::Allow { .. } => Verdict::Allow { rule },
                    Verdict::Refuse { .. } => Verdict::Refuse {
                        reason: format!(
                            "{} is not among the hosts this run was given (its allow_hosts)",
                            match names.first() {
                                Some(name) =>
                                    format!("{}:{port} ({name})", SocketAddr::new(ip, port)),
                                None => SocketAddr::new(ip, port).to_string(),
                            }
                        ),
                    },
                }
            }
            (verdict, _) => verdict,
        }
    }

    /// A connection starts (false: the run is at its limit, and the refusal is logged).
    pub(crate) fn enter_live_or_refuse(&self, name: Option<String>, dest: SocketAddr) -> bool {
        if self.live.fetch_add(1, Ordering::SeqCst) >= MAX_LIVE_CONNECTIONS as u64 {
            self.live.fetch_sub(1, Ordering::SeqCst);
            self.refused(
                "connect",
                name,
                dest.ip(),
                dest.port(),
                format!(
                    "the run already holds {MAX_LIVE_CONNECTIONS} connections, its limit; close \
                     some first"
                ),
            );
            return false;
        }
        true
    }

    /// Whether the guard is in force for the run (known once its descriptors arrived).
    pub(crate) fn guarded(&self) -> bool {
        self.inside.get().is_some_and(|i| i.guarded)
    }

    /// A fresh socket's buffer sizes in the run's namespace.
    pub(crate) fn run_defaults(&self) -> handover::RunDefaults {
        self.inside.get().map(|i| i.defaults).unwrap_or_default()
    }

    /// A socket of the run's namespace of `family`, for a device ioctl asked on a handed socket.
    pub(crate) fn inside_socket(&self, family: libc::c_int) -> Option<RawFd> {
        let inside = self.inside.get()?;
        match family {
            libc::AF_INET6 => inside.v6.as_ref(),
            _ => inside.v4.as_ref(),
        }
        .map(AsRawFd::as_raw_fd)
    }

    /// A connection ended.
    pub(crate) fn leave_live(&self) {
        self.live.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A run's egress: the host's side of its network, running until dropped.
pub struct Egress {
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for Egress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Egress")
            .field("mode", &self.shared.policy.mode())
            .finish_non_exhaustive()
    }
}

impl Drop for Egress {
    fn drop(&mut self) {
        self.task.abort();
        // The relay's connections end with it; handed ones are the run's, and end with it.
        let _ = self.shared.shutdown.send(true);
        self.shared.handed.forget_all();
    }
}

impl Egress {
    /// Starts the host's side for a run whose processes send their descriptors over `channel` (a
    /// spawned sandbox's `Child::egress`): the sockets first, then the notifier's listener. Must be
    /// called within a tokio runtime.
    pub fn start(channel: EgressChannel, policy: Arc<NetworkPolicy>) -> Egress {
        let shared = Shared::new(policy);
        let task = {
            let shared = Arc::clone(&shared);
            tokio::spawn(async move {
                // No descriptors: the run failed to set up, which its spawn reports.
                if let Ok(fds) = channel.receive().await {
                    serve(fds, shared).await;
                }
            })
        };
        Egress { shared, task }
    }

    /// Starts the host's side for descriptors already received (a run forked from a template sends
    /// them with its other descriptors). Must be called within a tokio runtime.
    pub fn start_with(fds: EgressFds, policy: Arc<NetworkPolicy>) -> Egress {
        let shared = Shared::new(policy);
        let task = tokio::spawn(serve(fds, Arc::clone(&shared)));
        Egress { shared, task }
    }

    /// Brings the report up to date with what the kernel counted on the connections handed to the
    /// run (each asked for while it lives, or its final count once it ended); call before a
    /// [`Egress::mark`] or a [`Egress::report_since`].
    pub async fn settle(&self) {
        self.shared.handed.settle().await;
    }

    /// Narrows the policy for what runs next (a run's or a cell's own hosts; `None`: the whole
    /// policy). It can only narrow: a connection must pass the policy too.
    pub fn narrow(&self, patterns: Option<Vec<HostPattern>>) {
        let narrowed = patterns.map(|allow| {
            Arc::new(NetworkPolicy {
                public: false,
                allow,
                resolve: self.shared.policy.resolve.clone(),
                ..NetworkPolicy::default()
            })
        });
        *self.shared.narrow.lock().unwrap_or_else(|p| p.into_inner()) = narrowed;
    }
}

impl Shared {
    fn new(policy: Arc<NetworkPolicy>) -> Arc<Shared> {
        // Without the host's own addresses no address can be told apart from them: every
        // connection is then refused, with why, rather than one of them let through.
        let host = HostAddrs::current();
        let mut host_unknown = host.as_ref().err().map(|e| {
            format!("the host's own addresses cannot be read ({e}), so no connection is allowed")
        });
        let secrets = if policy.secrets.is_empty() {
            None
        } else {
            match secrets::RunSecrets::new(policy.secrets.clone(), &policy.upstream_cas) {
                Ok(secrets) => Some(Arc::new(secrets)),
                Err(e) => {
                    host_unknown.get_or_insert(format!(
                        "the run's secrets could not be prepared ({e}), so no connection is allowed"
                    ));
                    None
                }
            }
        };
        Arc::new(Shared {
            host: Arc::new(host.unwrap_or_else(|_| HostAddrs::from_list(Vec::new()))),
            host_unknown,
            resolved: Arc::new(dns::Resolved::new()),
            upstream: upstream::Upstream::from_env(),
            pairing: relay::Pairing::default(),
            started: Instant::now(),
            log: Mutex::new(Log::default()),
            totals: Arc::default(),
            refusals: Mutex::new(Refusals::default()),
            reasons: Mutex::new(std::collections::VecDeque::new()),
            live: AtomicU64::new(0),
            shutdown: tokio::sync::watch::channel(false).0,
            narrow: Mutex::new(None),
            secrets,
            policy,
            handed: handed::Handed::default(),
            inside: OnceLock::new(),
            host_netns: host_netns(),
        })
    }
}

/// The cookie of the host's network namespace, read once per process.
fn host_netns() -> Option<u64> {
    static COOKIE: OnceLock<Option<u64>> = OnceLock::new();
    *COOKIE.get_or_init(|| {
        let probe = sock::socket(libc::AF_INET, libc::SOCK_DGRAM, 0).ok()?;
        perform::netns_cookie(probe.as_raw_fd())
    })
}

/// The run's resolver on its two sockets, each lookup logged.
async fn serve_dns(udp: OwnedFd, tcp: OwnedFd, shared: Arc<Shared>) {
    let sockets = (|| -> std::io::Result<_> {
        let udp = std::net::UdpSocket::from(udp);
        udp.set_nonblocking(true)?;
        let tcp = std::net::TcpListener::from(tcp);
        tcp.set_nonblocking(true)?;
        Ok((
            tokio::net::UdpSocket::from_std(udp)?,
            tokio::net::TcpListener::from_std(tcp)?,
        ))
    })();
    let Ok((udp, tcp)) = sockets else {
        return std::future::pending().await;
    };
    let log = Arc::clone(&shared);
    let secrets = shared.secrets.clone();
    dns::serve(
        udp,
        tcp,
        Arc::clone(&shared.policy),
        Arc::clone(&shared.host),
        Arc::new(dns::HostResolver),
        Arc::clone(&shared.resolved),
        dns::Hooks {
            on_lookup: Arc::new(move |lookup| log.lookup(lookup)),
            explain: {
                let shared = Arc::clone(&shared);
                Arc::new(move |host: &str, port| {
                    let reasons = shared.reasons.lock().unwrap_or_else(|p| p.into_inner());
                    why::find(&reasons, host, port)
                })
            },
            screen: Arc::new(move |name: &str| {
                let secret = secrets.as_ref()?.placeholder_in(name.as_bytes())?;
                Some(format!(
                    "secret {secret}: its placeholder is in the name looked up; a lookup reaches \
                 whoever serves the name, so it was not sent"
                ))
            }),
        },
    )
    .await;
}

/// Serves the run's network until its processes are gone (or the handle is dropped).
async fn serve(fds: EgressFds, shared: Arc<Shared>) {
    let EgressFds {
        dns_udp,
        dns_tcp,
        relay4,
        relay6,
        listener,
        guarded,
    } = fds;
    let _ = shared.inside.set(Inside {
        guarded,
        defaults: handover::RunDefaults::of(relay4.as_raw_fd()),
        v4: dns_udp.try_clone().ok(),
        v6: relay6.as_ref().and_then(|fd| fd.try_clone().ok()),
    });
    shared
        .pairing
        .v6
        .store(relay6.is_some(), std::sync::atomic::Ordering::Relaxed);
    let resolver = serve_dns(dns_udp, dns_tcp, Arc::clone(&shared));
    let relay = relay::serve(relay4, relay6, Arc::clone(&shared));
    let notify = notify::serve(listener, Arc::clone(&shared));
    // The notifier ends when no process of the run is left to notify; the others serve until then.
    tokio::select! {
        () = notify => {}
        () = resolver => {}
        () = relay => {}
    }
}
