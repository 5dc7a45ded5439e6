//! The DNS stub a run's lookups go to: it answers inside the run's network namespace, asks the
//! host's resolver only about names the policy lets the run resolve, and keeps only the addresses
//! the policy could let it connect to.
//!
//! What it answers (see [`serve`]):
//!
//! * A and AAAA for a name [`NetworkPolicy::judge_lookup`] allows: the pinned addresses, else
//!   the resolver's, of the question's family, less those [`NetworkPolicy::judge_answer`]
//!   refuses; TTL [`ANSWER_TTL`]. The kept addresses are recorded in [`Resolved`], which the
//!   connect decision reads.
//! * A name the policy refuses: NXDOMAIN. A failed lookup: SERVFAIL, or NXDOMAIN when the
//!   resolver says there is no such name. Every address refused: NOERROR with no answers.
//! * Any other type for an allowed name (MX, TXT, HTTPS, ...): NOERROR with no answers. PTR:
//!   NXDOMAIN. More than one question: FORMERR. Another opcode: NOTIMP. Another class: REFUSED.
//! * A packet that does not parse, or is not a query: dropped (UDP), connection closed (TCP).
//! * TXT in `why.runpython.invalid`: why the run's connect was refused ([`super::why`]), from
//!   [`Hooks::explain`]; not a lookup, so not reported.
//!
//! Host cost is bounded: at most [`MAX_QUERIES_PER_STUB`] queries in flight per stub, at most
//! [`MAX_HOST_LOOKUPS`] getaddrinfo calls in the whole process ([`HostResolver`]), each lookup
//! given up after [`LOOKUP_TIMEOUT`], at most [`MAX_TCP_CONNECTIONS`] TCP connections per stub,
//! each closed after [`TCP_IDLE`] without a query.
//!
//! Why this file is long: it is one job, the run's resolver, and half of it is its tests (each
//! answer, refusal and framing, over UDP and TCP).

use std::collections::VecDeque;
use std::future::Future;
use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use hickory_proto::op::{Edns, Message, MessageType, Metadata, OpCode, Query, ResponseCode};
use hickory_proto::rr::rdata::{A, AAAA, TXT};
use hickory_proto::rr::{DNSClass, RData, Record, RecordType};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio::time::timeout;

use crate::policy::{effective_ip, HostAddrs, NetworkPolicy, Verdict};

/// The TTL of every answer, in seconds: short, so a program that caches answers asks again soon.
pub const ANSWER_TTL: u32 = 30;
/// Queries one stub handles at once; more wait (TCP) or queue in the socket (UDP).
pub const MAX_QUERIES_PER_STUB: usize = 8;
/// getaddrinfo calls [`HostResolver`] makes at once, across every stub in the process.
pub const MAX_HOST_LOOKUPS: usize = 64;
/// How long a lookup may take before the query is answered SERVFAIL.
pub const LOOKUP_TIMEOUT: Duration = Duration::from_secs(5);
/// TCP connections one stub serves at once; more are closed as they arrive.
pub const MAX_TCP_CONNECTIONS: usize = 4;
/// How long a TCP connection may sit without sending a whole query (or reading the answer).
pub const TCP_IDLE: Duration = Duration::from_secs(10);
/// Names [`Resolved`] keeps, the oldest dropped first.
pub const RESOLVED_CAPACITY: usize = 4096;
/// How long [`Resolved`] keeps a name after its last lookup.
pub const RESOLVED_TTL: Duration = Duration::from_secs(5 * 60);

/// The largest UDP answer to a query without EDNS (RFC 1035).
const UDP_PLAIN_MAX: u16 = 512;
/// The largest UDP answer to a query with EDNS (the DNS flag day 2020 size).
const UDP_EDNS_MAX: u16 = 1232;

/// getaddrinfo calls in flight, process-wide.
static HOST_LOOKUPS: Semaphore = Semaphore::const_new(MAX_HOST_LOOKUPS);

/// What the stub asks to resolve a name (the host's resolver, or a test's).
///
/// `name` is lowercase, without a trailing dot, and already allowed by the policy. The result is
/// every address found, of both families; an error of kind [`io::ErrorKind::NotFound`] means the
/// name does not exist (the stub answers NXDOMAIN), any other error that it could not be
/// resolved (SERVFAIL).
pub trait Resolve: Send + Sync + 'static {
    /// The addresses of `name`.
    fn lookup(&self, name: String)
        -> Pin<Box<dyn Future<Output = io::Result<Vec<IpAddr>>> + Send>>;
}

/// The host's resolver (getaddrinfo, so /etc/hosts, nsswitch and the host's DNS servers), on
/// tokio's blocking pool, at most [`MAX_HOST_LOOKUPS`] at once in the process. The name is looked
/// up as absolute (`name.`), so the host's search domains are not tried.
#[derive(Debug, Clone, Copy, Default)]
pub struct HostResolver;

impl Resolve for HostResolver {
    fn lookup(
        &self,
        name: String,
    ) -> Pin<Box<dyn Future<Output = io::Result<Vec<IpAddr>>> + Send>> {
        Box::pin(async move {
            let permit = HOST_LOOKUPS
                .acquire()
                .await
                .map_err(|_| io::Error::other("the host's lookups were shut down"))?;
            // The permit moves into the blocking call, so a lookup that outlives its timeout
            // still counts against the cap until getaddrinfo returns.
            tokio::task::spawn_blocking(move || {
                let _permit = permit;
                let found = dns_lookup::lookup_host(&format!("{name}.")).map_err(|e| {
                    let kind = e.kind();
                    let error = io::Error::from(e);
                    match kind {
                        dns_lookup::LookupErrorKind::NoName
                        | dns_lookup::LookupErrorKind::NoData => {
                            io::Error::new(io::ErrorKind::NotFound, error)
                        }
                        _ => error,
                    }
                })?;
                let mut ips = Vec::new();
                for ip in found {
                    if !ips.contains(&ip) {
                        ips.push(ip);
                    }
                }
                Ok(ips)
            })
            .await
            .map_err(|e| io::Error::other(format!("the host's lookup task failed: {e}")))?
        })
    }
}

/// The names this run resolved, by address, for the connect decision: at most
/// [`RESOLVED_CAPACITY`] (address, name) pairs, the oldest dropped first, each kept
/// [`RESOLVED_TTL`] after its last lookup. Addresses are kept as [`effective_ip`] gives them, so
/// every spelling of one finds the same names.
#[derive(Debug)]
pub struct Resolved {
    /// Oldest first.
    entries: Mutex<VecDeque<Entry>>,
    capacity: usize,
    ttl: Duration,
}

#[derive(Debug)]
struct Entry {
    at: Instant,
    ip: IpAddr,
    name: String,
}

impl Default for Resolved {
    fn default() -> Self {
        Self::new()
    }
}

impl Resolved {
    /// An empty map with the default limits.
    pub fn new() -> Self {
        Self::with_limits(RESOLVED_CAPACITY, RESOLVED_TTL)
    }

    /// An empty map keeping at most `capacity` pairs, each for `ttl`.
    pub fn with_limits(capacity: usize, ttl: Duration) -> Self {
        Self {
            entries: Mutex::new(VecDeque::new()),
            capacity,
            ttl,
        }
    }

    /// The names (lowercase, no trailing dot) this run resolved to `ip`, oldest first.
    pub fn names_of(&self, ip: IpAddr) -> Vec<String> {
        let ip = effective_ip(ip);
        self.fresh()
            .iter()
            .filter(|entry| entry.ip == ip)
            .map(|entry| entry.name.clone())
            .collect()
    }

    /// Notes that `name` resolved to `ips`.
    fn record(&self, name: &str, ips: &[IpAddr]) {
        let name = name.to_ascii_lowercase();
        let mut entries = self.fresh();
        for ip in ips.iter().map(|ip| effective_ip(*ip)) {
            entries.retain(|entry| entry.ip != ip || entry.name != name);
            entries.push_back(Entry {
                at: Instant::now(),
                ip,
                name: name.clone(),
            });
        }
        let excess = entries.len().saturating_sub(self.capacity);
        entries.drain(..excess);
    }

    /// The entries, less those that expired.
    fn fresh(&self) -> MutexGuard<'_, VecDeque<Entry>> {
        // The deque is consistent after any panic in these short sections.
        let mut entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        while entries
            .front()
            .is_some_and(|entry| entry.at.elapsed() >= self.ttl)
        {
            entries.pop_front();
        }
        entries
    }
}

/// One lookup as the log sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lookup {
    /// The name asked about, lowercase and without a trailing dot.
    pub name: String,
    /// The question's type ("A", "AAAA", "HTTPS", ...).
    pub qtype: String,
    /// The addresses answered.
    pub answered: Vec<IpAddr>,
    /// Why the name, or some of its addresses, were not answered; `None` when nothing was
    /// withheld.
    pub refused: Option<String>,
}

/// Serves DNS on `udp` and `tcp` (both already bound, normally to 127.0.0.1:53 inside the run's
/// network namespace) until the future is dropped or its task aborted, which also ends every
/// query and connection in flight. Every question is reported to `on_lookup`.
pub async fn serve(
    udp: UdpSocket,
    tcp: TcpListener,
    policy: Arc<NetworkPolicy>,
    host: Arc<HostAddrs>,
    resolver: Arc<dyn Resolve>,
    resolved: Arc<Resolved>,
    hooks: Hooks,
) {
    let Hooks {
        on_lookup,
        screen,
        explain,
    } = hooks;
    let stub = Arc::new(Stub {
        explain,
        policy,
        host,
        resolver,
        resolved,
        on_lookup,
        screen,
        queries: Arc::new(Semaphore::new(MAX_QUERIES_PER_STUB)),
    });
    tokio::join!(serve_udp(udp, Arc::clone(&stub)), serve_tcp(tcp, stub));
}

/// What the stub tells about each lookup, and asks before it.
pub struct Hooks {
    /// Every question, as the log sees it.
    pub on_lookup: Arc<dyn Fn(Lookup) + Send + Sync>,
    /// Why a name may not be looked up at all (see [`Screen`]).
    pub screen: Arc<Screen>,
    /// Why the run's latest connect to a host and port was refused (see [`super::why`]).
    pub explain: Arc<Explain>,
}

/// Why the run's latest connect to a host (an address or a name) and port was refused.
pub type Explain = dyn Fn(&str, u16) -> Option<String> + Send + Sync;

/// Why a name may not be looked up at all, whatever the policy (it carries a secret's
/// placeholder: a lookup is a message to whoever serves the name).
pub type Screen = dyn Fn(&str) -> Option<String> + Send + Sync;

/// What one stub answers with.
struct Stub {
    screen: Arc<Screen>,
    explain: Arc<Explain>,
    policy: Arc<NetworkPolicy>,
    host: Arc<HostAddrs>,
    resolver: Arc<dyn Resolve>,
    resolved: Arc<Resolved>,
    on_lookup: Arc<dyn Fn(Lookup) + Send + Sync>,
    /// Queries in flight.
    queries: Arc<Semaphore>,
}

async fn serve_udp(socket: UdpSocket, stub: Arc<Stub>) {
    let socket = Arc::new(socket);
    let mut tasks = JoinSet::new();
    let mut buffer = vec![0; usize::from(u16::MAX)];
    loop {
        while tasks.try_join_next().is_some() {}
        let Ok(permit) = Arc::clone(&stub.queries).acquire_owned().await else {
            return;
        };
        let (len, peer) = match socket.recv_from(&mut buffer).await {
            Ok(received) => received,
            Err(_) => {
                // Nothing to answer; do not spin if the error repeats.
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let query = buffer[..len].to_vec();
        let (stub, socket) = (Arc::clone(&stub), Arc::clone(&socket));
        tasks.spawn(async move {
            let _permit = permit;
            if let Some(response) = stub.respond(&query, Transport::Udp).await {
                // A lost UDP answer is retried by the client.
                let _ = socket.send_to(&response, peer).await;
            }
        });
    }
}

async fn serve_tcp(listener: TcpListener, stub: Arc<Stub>) {
    let connections = Arc::new(Semaphore::new(MAX_TCP_CONNECTIONS));
    let mut tasks = JoinSet::new();
    loop {
        while tasks.try_join_next().is_some() {}
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(_) => {
                // Out of descriptors, say: wait rather than spin.
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        // Over the limit, the connection is closed at once (dropped).
        let Ok(permit) = Arc::clone(&connections).try_acquire_owned() else {
            continue;
        };
        let stub = Arc::clone(&stub);
        tasks.spawn(async move {
            stub.serve_connection(stream).await;
            drop(permit);
        });
    }
}

/// How a query came, which bounds its answer's size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Transport {
    Udp,
    Tcp,
}

impl Stub {
    /// Queries on one TCP connection, each a 2-byte length and a message, until the client
    /// closes, idles, or sends something that is not a query.
    async fn serve_connection(&self, mut stream: TcpStream) {
        loop {
            let Ok(Ok(len)) = timeout(TCP_IDLE, stream.read_u16()).await else {
                return;
            };
            let mut query = vec![0; usize::from(len)];
            let Ok(Ok(_)) = timeout(TCP_IDLE, stream.read_exact(&mut query)).await else {
                return;
            };
            let Ok(permit) = self.queries.acquire().await else {
                return;
            };
            let Some(response) = self.respond(&query, Transport::Tcp).await else {
                return;
            };
            drop(permit);
            let Ok(len) = u16::try_from(response.len()) else {
                return;
            };
            let mut frame = Vec::with_capacity(2 + response.len());
            frame.extend_from_slice(&len.to_be_bytes());
            frame.extend_from_slice(&response);
            let Ok(Ok(())) = timeout(TCP_IDLE, stream.write_all(&frame)).await else {
                return;
            };
        }
    }

    /// The encoded answer to one message, or `None` for a message to drop.
    async fn respond(&self, query: &[u8], transport: Transport) -> Option<Vec<u8>> {
        let request = Message::from_vec(query).ok()?;
        if request.message_type != MessageType::Query {
            return None;
        }
        let mut response = Message::response(request.id, request.op_code);
        response.metadata = Metadata::response_from_request(&request.metadata);
        response.metadata.recursion_available = true;
        // A query with EDNS gets EDNS back (RFC 6891), announcing what this stub accepts.
        if request.edns.is_some() {
            let mut edns = Edns::new();
            edns.set_max_payload(UDP_EDNS_MAX);
            response.set_edns(edns);
        }
        response.metadata.response_code = match (request.op_code, request.queries.as_slice()) {
            (OpCode::Query, [question]) => {
                response.add_query(question.clone());
                let (code, answers) = self.answer(question).await;
                response.add_answers(answers);
                code
            }
            (OpCode::Query, _) => ResponseCode::FormErr,
            _ => ResponseCode::NotImp,
        };
        let max = match transport {
            Transport::Tcp => usize::from(u16::MAX),
            Transport::Udp if request.edns.is_some() => {
                usize::from(request.max_payload().min(UDP_EDNS_MAX))
            }
            Transport::Udp => usize::from(UDP_PLAIN_MAX),
        };
        let encoded = response.to_vec().ok()?;
        if encoded.len() <= max {
            return Some(encoded);
        }
        // Too big: the question alone with TC set, so the client asks again over TCP.
        response.truncate().to_vec().ok()
    }

    /// The response code and answers for one question, reported to the log.
    async fn answer(&self, question: &Query) -> (ResponseCode, Vec<Record>) {
        let qname = question.name();
        let qtype = question.query_type();
        let ascii = qname.to_ascii();
        let name = ascii
            .strip_suffix('.')
            .unwrap_or(&ascii)
            .to_ascii_lowercase();
        if let Some((host, port)) = super::why::question(&name) {
            return self.why(question, &host, port);
        }
        let mut lookup = Lookup {
            name: name.clone(),
            qtype: qtype.to_string(),
            answered: Vec::new(),
            refused: None,
        };
        let (code, answers) = self.resolve(question, &name, &mut lookup).await;
        (self.on_lookup)(lookup);
        (code, answers)
    }

    /// The answer to a question in [`super::why::ZONE`]: the reason as TXT, or NXDOMAIN.
    fn why(&self, question: &Query, host: &str, port: u16) -> (ResponseCode, Vec<Record>) {
        if question.query_type() != RecordType::TXT || question.query_class() != DNSClass::IN {
            return (ResponseCode::NoError, Vec::new());
        }
        match (self.explain)(host, port) {
            Some(reason) => {
                let rdata = RData::TXT(TXT::new(super::why::txt(&reason)));
                let record = Record::from_rdata(question.name().clone(), 0, rdata);
                (ResponseCode::NoError, vec![record])
            }
            None => (ResponseCode::NXDomain, Vec::new()),
        }
    }

    async fn resolve(
        &self,
        question: &Query,
        name: &str,
        lookup: &mut Lookup,
    ) -> (ResponseCode, Vec<Record>) {
        let qtype = question.query_type();
        if question.query_class() != DNSClass::IN {
            lookup.refused = Some(format!("class {} is not served", question.query_class()));
            return (ResponseCode::Refused, Vec::new());
        }
        if qtype == RecordType::PTR {
            lookup.refused = Some("reverse (PTR) lookups are not served".into());
            return (ResponseCode::NXDomain, Vec::new());
        }
        if let Some(reason) = (self.screen)(name) {
            lookup.refused = Some(reason);
            return (ResponseCode::NXDomain, Vec::new());
        }
        if let Verdict::Refuse { reason } = self.policy.judge_lookup(name) {
            lookup.refused = Some(reason);
            return (ResponseCode::NXDomain, Vec::new());
        }
        let wants_v4 = match qtype {
            RecordType::A => true,
            RecordType::AAAA => false,
            // An allowed name has no other records here.
            _ => return (ResponseCode::NoError, Vec::new()),
        };
        let found = match self.policy.pinned(name) {
            Some(pinned) => pinned,
            None => match timeout(LOOKUP_TIMEOUT, self.resolver.lookup(name.to_owned())).await {
                Ok(Ok(found)) => found,
                Ok(Err(e)) if e.kind() == io::ErrorKind::NotFound => {
                    lookup.refused = Some(format!("the host's resolver found no such name: {e}"));
                    return (ResponseCode::NXDomain, Vec::new());
                }
                Ok(Err(e)) => {
                    lookup.refused = Some(format!("the host's resolver failed: {e}"));
                    return (ResponseCode::ServFail, Vec::new());
                }
                Err(_) => {
                    lookup.refused = Some(format!(
                        "the host's resolver did not answer within {} s",
                        LOOKUP_TIMEOUT.as_secs()
                    ));
                    return (ResponseCode::ServFail, Vec::new());
                }
            },
        };
        let mut withheld = Vec::new();
        for ip in found.into_iter().filter(|ip| ip.is_ipv4() == wants_v4) {
            match self.policy.judge_answer(name, ip, &self.host) {
                Verdict::Allow { .. } => lookup.answered.push(ip),
                Verdict::Refuse { reason } => withheld.push(reason),
            }
        }
        if !withheld.is_empty() {
            lookup.refused = Some(withheld.join("; "));
        }
        self.resolved.record(name, &lookup.answered);
        let answers = lookup
            .answered
            .iter()
            .map(|ip| {
                let rdata = match ip {
                    IpAddr::V4(v4) => RData::A(A(*v4)),
                    IpAddr::V6(v6) => RData::AAAA(AAAA(*v6)),
                };
                Record::from_rdata(question.name().clone(), ANSWER_TTL, rdata)
            })
            .collect();
        (ResponseCode::NoError, answers)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::collections::HashMap;
    use std::net::SocketAddr;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use hickory_proto::rr::Name;

    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    /// A resolver with fixed answers; unknown names do not exist, `fail.test` fails, `slow.test`
    /// takes a while. It counts calls and the most in flight at once.
    #[derive(Default)]
    struct Fake {
        names: HashMap<String, Vec<IpAddr>>,
        calls: AtomicUsize,
        in_flight: AtomicUsize,
        most_in_flight: AtomicUsize,
    }

    impl Resolve for Arc<Fake> {
        fn lookup(
            &self,
            name: String,
        ) -> Pin<Box<dyn Future<Output = io::Result<Vec<IpAddr>>> + Send>> {
            let fake = Arc::clone(self);
            Box::pin(async move {
                fake.calls.fetch_add(1, Ordering::SeqCst);
                let now = fake.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                fake.most_in_flight.fetch_max(now, Ordering::SeqCst);
                if name.starts_with("slow") {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                fake.in_flight.fetch_sub(1, Ordering::SeqCst);
                match (name.as_str(), fake.names.get(&name)) {
                    ("fail.test", _) => Err(io::Error::other("the DNS server is down")),
                    (_, Some(ips)) => Ok(ips.clone()),
                    (_, None) if name.starts_with("slow") => Ok(vec![ip("93.184.215.14")]),
                    (_, None) => Err(io::Error::new(io::ErrorKind::NotFound, "no such name")),
                }
            })
        }
    }

    struct Running {
        udp: SocketAddr,
        tcp: SocketAddr,
        fake: Arc<Fake>,
        resolved: Arc<Resolved>,
        lookups: Arc<Mutex<Vec<Lookup>>>,
        task: tokio::task::JoinHandle<()>,
    }

    impl Drop for Running {
        fn drop(&mut self) {
            self.task.abort();
        }
    }

    impl Running {
        fn lookups(&self) -> Vec<Lookup> {
            self.lookups.lock().unwrap().clone()
        }
    }

    async fn start(policy: NetworkPolicy, names: &[(&str, &[&str])]) -> Running {
        let fake = Arc::new(Fake {
            names: names
                .iter()
                .map(|(name, ips)| (name.to_string(), ips.iter().map(|i| ip(i)).collect()))
                .collect(),
            ..Fake::default()
        });
        // Loopback only: nothing here leaves the machine.
        let udp = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let tcp = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let (udp_addr, tcp_addr) = (udp.local_addr().unwrap(), tcp.local_addr().unwrap());
        let resolved = Arc::new(Resolved::new());
        let lookups = Arc::new(Mutex::new(Vec::new()));
        let log = Arc::clone(&lookups);
        let task = tokio::spawn(serve(
            udp,
            tcp,
            Arc::new(policy),
            Arc::new(HostAddrs::from_list(vec![ip("203.0.114.7")])),
            Arc::new(Arc::clone(&fake)),
            Arc::clone(&resolved),
            Hooks {
                on_lookup: Arc::new(move |lookup| log.lock().unwrap().push(lookup)),
                screen: Arc::new(|name: &str| {
                    name.contains("rp_screened").then(|| "screened".to_owned())
                }),
                explain: Arc::new(|host: &str, port| {
                    (host == "10.0.0.1" && port == 80).then(|| "because".to_owned())
                }),
            },
        ));
        Running {
            udp: udp_addr,
            tcp: tcp_addr,
            fake,
            resolved,
            lookups,
            task,
        }
    }

    fn query(id: u16, name: &str, qtype: RecordType) -> Message {
        let mut message = Message::new(id, MessageType::Query, OpCode::Query);
        message.metadata.recursion_desired = true;
        message.add_query(Query::query(Name::from_ascii(name).unwrap(), qtype));
        message
    }

    async fn send_udp(to: SocketAddr, bytes: &[u8]) -> Option<Message> {
        let socket = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        socket.send_to(bytes, to).await.unwrap();
        let mut buffer = vec![0; 65535];
        let (len, _) = timeout(Duration::from_millis(500), socket.recv_from(&mut buffer))
            .await
            .ok()?
            .unwrap();
        assert!(len <= 1232, "a UDP answer of {len} bytes");
        Some(Message::from_vec(&buffer[..len]).unwrap())
    }

    async fn ask(to: SocketAddr, message: &Message) -> Message {
        send_udp(to, &message.to_vec().unwrap())
            .await
            .expect("an answer")
    }

    fn addresses(message: &Message) -> Vec<IpAddr> {
        message
            .answers
            .iter()
            .map(|record| match record.data {
                RData::A(a) => IpAddr::V4(a.0),
                RData::AAAA(aaaa) => IpAddr::V6(aaaa.0),
                ref other => panic!("unexpected record {other:?}"),
            })
            .collect()
    }

    #[tokio::test]
    async fn allowed_names_are_answered_in_the_standard_format() {
        let stub = start(
            NetworkPolicy::allowing(["api.example.com"]).unwrap(),
            &[(
                "api.example.com",
                &["93.184.215.14", "2606:2800:21f:cb07:6820:80da:af6b:8b2c"],
            )],
        )
        .await;
        for (qtype, want) in [
            (RecordType::A, "93.184.215.14"),
            (RecordType::AAAA, "2606:2800:21f:cb07:6820:80da:af6b:8b2c"),
        ] {
            let request = query(0x1234, "Api.Example.com.", qtype);
            let response = ask(stub.udp, &request).await;
            assert_eq!(response.id, 0x1234);
            assert_eq!(response.message_type, MessageType::Response);
            assert_eq!(response.op_code, OpCode::Query);
            assert!(response.recursion_desired, "RD copied");
            assert!(response.recursion_available, "RA set");
            assert!(!response.truncation && !response.authoritative);
            assert_eq!(response.response_code, ResponseCode::NoError);
            assert_eq!(
                response.queries, request.queries,
                "question echoed as asked"
            );
            assert_eq!(addresses(&response), vec![ip(want)]);
            let record = &response.answers[0];
            assert_eq!(record.ttl, ANSWER_TTL);
            assert_eq!(record.name, Name::from_ascii("Api.Example.com.").unwrap());
            assert!(response.edns.is_none(), "no EDNS without EDNS in the query");
        }
        let lookups = stub.lookups();
        assert_eq!(lookups.len(), 2);
        assert_eq!(lookups[0].name, "api.example.com");
        assert_eq!(lookups[0].qtype, "A");
        assert_eq!(lookups[1].qtype, "AAAA");
        assert_eq!(lookups[0].refused, None);
        assert_eq!(
            stub.resolved.names_of(ip("93.184.215.14")),
            vec!["api.example.com"]
        );
        assert_eq!(
            stub.resolved
                .names_of(ip("2606:2800:21f:cb07:6820:80da:af6b:8b2c")),
            vec!["api.example.com"]
        );
        assert!(stub.resolved.names_of(ip("1.1.1.1")).is_empty());
    }

    #[tokio::test]
    async fn a_name_carrying_a_secrets_placeholder_is_never_asked_about() {
        let stub = start(
            NetworkPolicy::public_internet(),
            &[("rp_screened.example.com", &["93.184.215.14"])],
        )
        .await;
        let response = ask(
            stub.udp,
            &query(9, "rp_screened.example.com.", RecordType::A),
        )
        .await;
        assert_eq!(response.response_code, ResponseCode::NXDomain);
        assert_eq!(
            stub.fake.calls.load(Ordering::SeqCst),
            0,
            "the host was not asked"
        );
        assert_eq!(stub.lookups()[0].refused.as_deref(), Some("screened"));
    }

    #[tokio::test]
    async fn refused_names_do_not_exist() {
        let stub = start(
            NetworkPolicy::allowing(["api.example.com"]).unwrap(),
            &[("evil.test", &["93.184.215.14"])],
        )
        .await;
        let response = ask(stub.udp, &query(7, "evil.test.", RecordType::A)).await;
        assert_eq!(response.response_code, ResponseCode::NXDomain);
        assert!(response.answers.is_empty());
        assert_eq!(
            stub.fake.calls.load(Ordering::SeqCst),
            0,
            "the host was not asked"
        );
        let lookup = &stub.lookups()[0];
        assert!(
            lookup
                .refused
                .as_deref()
                .unwrap()
                .contains("--allow-host evil.test"),
            "{lookup:?}"
        );
        assert!(stub.resolved.names_of(ip("93.184.215.14")).is_empty());
    }

    #[tokio::test]
    async fn why_a_connect_was_refused_is_answered_in_its_zone_and_not_logged() {
        let stub = start(NetworkPolicy::public_internet(), &[]).await;
        let hex: String = "10.0.0.1".bytes().map(|b| format!("{b:02x}")).collect();
        let asked = format!("80.{hex}.{}.", super::super::why::ZONE);
        let response = ask(stub.udp, &query(3, &asked, RecordType::TXT)).await;
        assert_eq!(response.response_code, ResponseCode::NoError);
        let said: Vec<String> = response
            .answers
            .iter()
            .filter_map(|r| match &r.data {
                RData::TXT(txt) => Some(txt.to_string()),
                _ => None,
            })
            .collect();
        assert_eq!(said, ["because"]);
        let unknown = format!("81.{hex}.{}.", super::super::why::ZONE);
        let response = ask(stub.udp, &query(4, &unknown, RecordType::TXT)).await;
        assert_eq!(response.response_code, ResponseCode::NXDomain);
        assert!(stub.lookups().is_empty(), "{:?}", stub.lookups());
        assert_eq!(
            stub.fake.calls.load(Ordering::SeqCst),
            0,
            "the host was not asked"
        );
    }

    #[tokio::test]
    async fn pinned_names_are_answered_without_the_resolver() {
        let mut policy = NetworkPolicy::allowing(["db.internal"]).unwrap();
        policy.resolve = vec![
            ("db.internal".into(), ip("10.0.0.5")),
            ("db.internal".into(), ip("fd00::5")),
        ];
        let stub = start(policy, &[("db.internal", &["93.184.215.14"])]).await;
        let a = ask(stub.udp, &query(1, "db.internal.", RecordType::A)).await;
        assert_eq!(addresses(&a), vec![ip("10.0.0.5")]);
        let aaaa = ask(stub.udp, &query(2, "DB.internal.", RecordType::AAAA)).await;
        assert_eq!(addresses(&aaaa), vec![ip("fd00::5")]);
        assert_eq!(stub.fake.calls.load(Ordering::SeqCst), 0);
        assert_eq!(
            stub.resolved.names_of(ip("::ffff:10.0.0.5")),
            vec!["db.internal"]
        );
    }

    #[tokio::test]
    async fn private_answers_are_kept_for_exact_names_only() {
        let stub = start(
            NetworkPolicy::allowing(["*.example.com", "db.example.com"]).unwrap(),
            &[
                (
                    "www.example.com",
                    &["10.0.0.1", "93.184.215.14", "127.0.0.1", "203.0.114.7"],
                ),
                ("db.example.com", &["10.0.0.2"]),
                ("inside.example.com", &["169.254.169.254"]),
            ],
        )
        .await;
        let www = ask(stub.udp, &query(1, "www.example.com.", RecordType::A)).await;
        assert_eq!(addresses(&www), vec![ip("93.184.215.14")]);
        let why = stub.lookups()[0].refused.clone().unwrap();
        assert!(
            why.contains("10.0.0.1 (www.example.com) is a private address"),
            "{why}"
        );
        assert!(why.contains("one of this host's own addresses"), "{why}");
        assert!(stub.resolved.names_of(ip("10.0.0.1")).is_empty());

        let db = ask(stub.udp, &query(2, "db.example.com.", RecordType::A)).await;
        assert_eq!(addresses(&db), vec![ip("10.0.0.2")]);

        let inside = ask(stub.udp, &query(3, "inside.example.com.", RecordType::A)).await;
        assert_eq!(inside.response_code, ResponseCode::NoError);
        assert!(inside.answers.is_empty());
        assert!(stub.lookups()[2]
            .refused
            .as_deref()
            .unwrap()
            .contains("cloud metadata"));
    }

    #[tokio::test]
    async fn tcp_serves_several_framed_queries_per_connection() {
        let stub = start(
            NetworkPolicy::public_internet(),
            &[
                ("a.test", &["93.184.215.14"]),
                ("b.test", &["2606:4700::1111"]),
            ],
        )
        .await;
        let mut stream = TcpStream::connect(stub.tcp).await.unwrap();
        for (id, name, qtype, want) in [
            (1, "a.test.", RecordType::A, ip("93.184.215.14")),
            (2, "b.test.", RecordType::AAAA, ip("2606:4700::1111")),
            (3, "a.test.", RecordType::A, ip("93.184.215.14")),
        ] {
            let bytes = query(id, name, qtype).to_vec().unwrap();
            stream.write_u16(bytes.len() as u16).await.unwrap();
            stream.write_all(&bytes).await.unwrap();
            let len = stream.read_u16().await.unwrap();
            let mut body = vec![0; usize::from(len)];
            stream.read_exact(&mut body).await.unwrap();
            let response = Message::from_vec(&body).unwrap();
            assert_eq!(response.id, id);
            assert_eq!(addresses(&response), vec![want]);
        }
        // Garbage closes the connection.
        stream.write_all(&[0, 3, 1, 2, 3]).await.unwrap();
        let mut rest = Vec::new();
        let read = timeout(Duration::from_secs(2), stream.read_to_end(&mut rest))
            .await
            .unwrap();
        assert_eq!(read.unwrap(), 0);
    }

    #[tokio::test]
    async fn malformed_udp_is_ignored_and_serving_goes_on() {
        let stub = start(
            NetworkPolicy::public_internet(),
            &[("a.test", &["93.184.215.14"])],
        )
        .await;
        assert!(send_udp(stub.udp, b"").await.is_none());
        assert!(send_udp(stub.udp, &[0xde, 0xad, 0xbe, 0xef])
            .await
            .is_none());
        let mut response = query(5, "a.test.", RecordType::A);
        response.metadata.message_type = MessageType::Response;
        assert!(
            send_udp(stub.udp, &response.to_vec().unwrap())
                .await
                .is_none(),
            "responses are dropped"
        );
        let good = ask(stub.udp, &query(6, "a.test.", RecordType::A)).await;
        assert_eq!(addresses(&good), vec![ip("93.184.215.14")]);
        assert_eq!(stub.lookups().len(), 1, "only the real lookup is logged");
    }

    #[tokio::test]
    async fn other_types_ptr_and_odd_messages() {
        let stub = start(
            NetworkPolicy::allowing(["a.test"]).unwrap(),
            &[("a.test", &["93.184.215.14"])],
        )
        .await;
        for qtype in [
            RecordType::MX,
            RecordType::TXT,
            RecordType::HTTPS,
            RecordType::SVCB,
            RecordType::CNAME,
        ] {
            let response = ask(stub.udp, &query(1, "a.test.", qtype)).await;
            assert_eq!(response.response_code, ResponseCode::NoError, "{qtype}");
            assert!(response.answers.is_empty());
        }
        assert_eq!(stub.fake.calls.load(Ordering::SeqCst), 0);
        let https = ask(stub.udp, &query(1, "b.test.", RecordType::HTTPS)).await;
        assert_eq!(
            https.response_code,
            ResponseCode::NXDomain,
            "refused names stay refused"
        );
        let ptr = ask(
            stub.udp,
            &query(2, "14.215.184.93.in-addr.arpa.", RecordType::PTR),
        )
        .await;
        assert_eq!(ptr.response_code, ResponseCode::NXDomain);

        let mut two = query(3, "a.test.", RecordType::A);
        two.add_query(Query::query(
            Name::from_ascii("a.test.").unwrap(),
            RecordType::AAAA,
        ));
        assert_eq!(
            ask(stub.udp, &two).await.response_code,
            ResponseCode::FormErr
        );
        let mut none = query(4, "a.test.", RecordType::A);
        none.queries.clear();
        assert_eq!(
            ask(stub.udp, &none).await.response_code,
            ResponseCode::FormErr
        );
        let mut status = query(5, "a.test.", RecordType::A);
        status.metadata.op_code = OpCode::Status;
        assert_eq!(
            ask(stub.udp, &status).await.response_code,
            ResponseCode::NotImp
        );
        let mut chaos = query(6, "version.bind.", RecordType::TXT);
        chaos.queries[0].set_query_class(DNSClass::CH);
        assert_eq!(
            ask(stub.udp, &chaos).await.response_code,
            ResponseCode::Refused
        );
    }

    #[tokio::test]
    async fn resolver_failures_are_servfail_or_nxdomain() {
        let stub = start(NetworkPolicy::public_internet(), &[]).await;
        let fail = ask(stub.udp, &query(1, "fail.test.", RecordType::A)).await;
        assert_eq!(fail.response_code, ResponseCode::ServFail);
        assert!(stub.lookups()[0]
            .refused
            .as_deref()
            .unwrap()
            .contains("the DNS server is down"));
        let missing = ask(stub.udp, &query(2, "missing.test.", RecordType::A)).await;
        assert_eq!(missing.response_code, ResponseCode::NXDomain);
    }

    #[tokio::test]
    async fn big_udp_answers_are_truncated_unless_edns_allows_them() {
        let many: Vec<String> = (1..=30).map(|i| format!("2606:4700::{i:x}")).collect();
        let many: Vec<&str> = many.iter().map(String::as_str).collect();
        let stub = start(NetworkPolicy::public_internet(), &[("many.test", &many)]).await;

        let plain = ask(stub.udp, &query(1, "many.test.", RecordType::AAAA)).await;
        assert!(plain.truncation, "30 AAAA records do not fit in 512 bytes");
        assert!(plain.answers.is_empty());
        assert_eq!(plain.id, 1);
        assert_eq!(plain.queries.len(), 1);

        let mut with_edns = query(2, "many.test.", RecordType::AAAA);
        let mut edns = Edns::new();
        edns.set_max_payload(4096);
        with_edns.set_edns(edns);
        let big = ask(stub.udp, &with_edns).await;
        assert!(!big.truncation);
        assert_eq!(big.answers.len(), 30);
        assert_eq!(big.edns.as_ref().map(Edns::max_payload), Some(UDP_EDNS_MAX));

        let mut stream = TcpStream::connect(stub.tcp).await.unwrap();
        let bytes = query(3, "many.test.", RecordType::AAAA).to_vec().unwrap();
        stream.write_u16(bytes.len() as u16).await.unwrap();
        stream.write_all(&bytes).await.unwrap();
        let len = stream.read_u16().await.unwrap();
        let mut body = vec![0; usize::from(len)];
        stream.read_exact(&mut body).await.unwrap();
        let full = Message::from_vec(&body).unwrap();
        assert!(!full.truncation);
        assert_eq!(full.answers.len(), 30);
    }

    #[tokio::test]
    async fn lookups_in_flight_are_capped_per_stub() {
        let stub = start(NetworkPolicy::public_internet(), &[]).await;
        let mut clients = JoinSet::new();
        for i in 0..24u16 {
            let to = stub.udp;
            clients.spawn(async move {
                let message = query(i, &format!("slow{i}.test."), RecordType::A);
                ask(to, &message).await
            });
        }
        while let Some(answer) = clients.join_next().await {
            assert_eq!(answer.unwrap().response_code, ResponseCode::NoError);
        }
        assert_eq!(stub.fake.calls.load(Ordering::SeqCst), 24);
        let most = stub.fake.most_in_flight.load(Ordering::SeqCst);
        assert!(
            (1..=MAX_QUERIES_PER_STUB).contains(&most),
            "{most} lookups at once"
        );
    }

    #[tokio::test]
    async fn tcp_connections_are_capped() {
        let stub = start(
            NetworkPolicy::public_internet(),
            &[("a.test", &["93.184.215.14"])],
        )
        .await;
        let mut open = Vec::new();
        for _ in 0..MAX_TCP_CONNECTIONS {
            open.push(TcpStream::connect(stub.tcp).await.unwrap());
        }
        let mut extra = TcpStream::connect(stub.tcp).await.unwrap();
        let mut byte = [0; 1];
        let closed = timeout(Duration::from_secs(2), extra.read(&mut byte))
            .await
            .unwrap();
        assert!(
            matches!(closed, Ok(0) | Err(_)),
            "the connection over the cap is closed"
        );
        // Closing one frees its place.
        drop(open.pop());
        tokio::time::sleep(Duration::from_millis(100)).await;
        let mut stream = TcpStream::connect(stub.tcp).await.unwrap();
        let bytes = query(9, "a.test.", RecordType::A).to_vec().unwrap();
        stream.write_u16(bytes.len() as u16).await.unwrap();
        stream.write_all(&bytes).await.unwrap();
        let len = timeout(Duration::from_secs(2), stream.read_u16())
            .await
            .unwrap()
            .unwrap();
        assert!(len > 12);
    }

    #[test]
    fn resolved_is_bounded_case_insensitive_and_expires() {
        let resolved = Resolved::with_limits(3, Duration::from_secs(60));
        resolved.record("A.test", &[ip("1.1.1.1"), ip("1.1.1.2")]);
        resolved.record("b.test", &[ip("1.1.1.1")]);
        assert_eq!(
            resolved.names_of(ip("::ffff:1.1.1.1")),
            vec!["a.test", "b.test"]
        );
        resolved.record("a.test", &[ip("1.1.1.1")]);
        assert_eq!(
            resolved.names_of(ip("1.1.1.1")),
            vec!["b.test", "a.test"],
            "refreshed, not doubled"
        );
        resolved.record("c.test", &[ip("1.1.1.3")]);
        assert_eq!(
            resolved.names_of(ip("1.1.1.2")),
            Vec::<String>::new(),
            "the oldest was dropped"
        );
        assert_eq!(resolved.names_of(ip("1.1.1.3")), vec!["c.test"]);

        let expiring = Resolved::with_limits(10, Duration::ZERO);
        expiring.record("a.test", &[ip("1.1.1.1")]);
        assert!(expiring.names_of(ip("1.1.1.1")).is_empty());
    }
}
