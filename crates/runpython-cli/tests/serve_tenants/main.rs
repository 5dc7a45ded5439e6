//! `runpython serve` under a hostile tenant, over raw HTTP on loopback with two or more tokens:
//! bodies must arrive whole by the body deadline, one tenant cannot hoard the connection slots, an
//! unauthenticated burst does not reset legitimate connects, MCP sessions stay bound to their token
//! whatever another token does, and a tenant flooding runs leaves another its share of the host.
//! (The quota, JWT claim and error-text findings are driven by the MCP SDK in
//! `tests/mcp_sdk/hostile_tenant.py`.)

#![allow(clippy::unwrap_used)] // a test fails loudly where it unwraps

mod http;

use std::io::Write;
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use http::{closed_within, read_response, Serve};
use serde_json::{json, Value};

/// Writes `piece` to `stream` every `every` until `stop` is set or the server closes it.
fn trickle(mut stream: TcpStream, piece: &'static [u8], every: Duration, stop: Arc<AtomicBool>) {
    std::thread::spawn(move || {
        while !stop.load(Ordering::Relaxed) {
            if stream.write_all(piece).is_err() {
                return;
            }
            std::thread::sleep(every);
        }
    });
}

/// The status of the response to a body sent as `framing` and trickled by `piece`, how long it
/// took to come, and whether the connection was closed after it.
fn trickled(server: &Serve, framing: &str, piece: &'static [u8]) -> (u16, Duration, bool) {
    let mut stream = server.connect();
    let head = format!("{}{framing}\r\n", server.head("POST", Some("alice"), None));
    stream.write_all(head.as_bytes()).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    trickle(
        stream.try_clone().unwrap(),
        piece,
        Duration::from_millis(250),
        Arc::clone(&stop),
    );
    let response = read_response(&mut stream);
    let took = started.elapsed();
    let status = response.map(|r| r.status).unwrap_or(0);
    let closed = closed_within(&mut stream, Duration::from_secs(3));
    stop.store(true, Ordering::Relaxed);
    (status, took, closed)
}

#[test]
fn a_trickled_body_is_cut_at_the_deadline_with_408_and_the_connection_closed() {
    let server = Serve::start(&["alice"], &["--no-store", "--body-timeout", "2"]);
    for (what, framing, piece) in [
        (
            "a chunked body, one chunk at a time",
            "Transfer-Encoding: chunked\r\n",
            &b"1\r\n{\r\n"[..],
        ),
        (
            "a 1 GB Content-Length fed a byte at a time",
            "Content-Length: 1000000000\r\n",
            &b"{"[..],
        ),
    ] {
        let (status, took, closed) = trickled(&server, framing, piece);
        assert_eq!(status, 408, "{what}: answered {status} after {took:?}");
        // The deadline ended it: not sooner, and not the trickle's pace (which never stops).
        assert!(
            took >= Duration::from_millis(1900) && took < Duration::from_secs(8),
            "{what}: answered after {took:?} under a 2 s body deadline"
        );
        assert!(closed, "{what}: the connection stayed open after the 408");
    }
}

/// A hostile tenant's connection: authenticated once, then kept busy (a `GET /healthz` every
/// second, or a body trickled forever), opened again whenever the server closes it. Counts the
/// connections it lost while mid-request.
struct Hoarder {
    stop: Arc<AtomicBool>,
    lost_mid_request: Arc<AtomicUsize>,
}

impl Hoarder {
    fn start(
        server: &Arc<Serve>,
        name: &'static str,
        connections: usize,
        tricklers: usize,
    ) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let lost_mid_request = Arc::new(AtomicUsize::new(0));
        for i in 0..connections {
            let (server, stop, lost) = (
                Arc::clone(server),
                Arc::clone(&stop),
                Arc::clone(&lost_mid_request),
            );
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let mut stream = server.connect();
                    if server.open_session(&mut stream, name).is_err() {
                        std::thread::sleep(Duration::from_millis(50));
                        continue;
                    }
                    if i < tricklers {
                        let head = format!(
                            "{}Content-Length: 1000000\r\n\r\n",
                            server.head("POST", Some(name), None)
                        );
                        let _ = stream.write_all(head.as_bytes());
                        while !stop.load(Ordering::Relaxed) {
                            if stream.write_all(b" ").is_err() {
                                lost.fetch_add(1, Ordering::Relaxed);
                                break;
                            }
                            std::thread::sleep(Duration::from_millis(200));
                        }
                    } else {
                        while !stop.load(Ordering::Relaxed) {
                            std::thread::sleep(Duration::from_millis(1000));
                            let ping = server.send_to(
                                &mut stream,
                                "/healthz",
                                "GET",
                                None,
                                None,
                                &Value::Null,
                            );
                            if ping.is_err() {
                                break;
                            }
                        }
                    }
                }
            });
        }
        Self {
            stop,
            lost_mid_request,
        }
    }
}

impl Drop for Hoarder {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// `n` sessions opened by `name`, each on a fresh connection: how many were served.
fn fresh_sessions(server: &Serve, name: &str, n: usize) -> usize {
    (0..n)
        .filter(|_| {
            let mut stream = server.connect();
            server
                .open_session(&mut stream, name)
                .is_ok_and(|r| r.status == 200)
        })
        .count()
}

#[test]
fn one_tenant_hoarding_connections_leaves_the_other_served() {
    // Its share (a quarter of 16 by default): however many it opens, alice holds four.
    let server = Arc::new(Serve::start(
        &["alice", "bob"],
        &[
            "--no-store",
            "--max-connections",
            "16",
            "--body-timeout",
            "60",
        ],
    ));
    let hoarder = Hoarder::start(&server, "alice", 16, 4);
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(fresh_sessions(&server, "bob", 20), 20, "{}", server.log());
    drop(hoarder);

    // Allowed the whole server, alice fills it: a full server closes her idle connections for
    // bob's, never one in the middle of a request.
    let server = Arc::new(Serve::start(
        &["alice", "bob"],
        &[
            "--no-store",
            "--max-connections",
            "16",
            "--max-connections-per-token",
            "16",
            "--body-timeout",
            "60",
        ],
    ));
    let hoarder = Hoarder::start(&server, "alice", 16, 4);
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(fresh_sessions(&server, "bob", 20), 20, "{}", server.log());
    assert_eq!(
        hoarder.lost_mid_request.load(Ordering::Relaxed),
        0,
        "a connection in the middle of a request was closed"
    );
}

#[test]
fn a_client_whose_request_is_on_its_way_outlives_a_burst_of_silent_connections() {
    let server = Serve::start(&["alice"], &["--no-store", "--max-connections", "8"]);
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "legit", "version": "0"}}})
    .to_string();
    for round in 0..5 {
        // With the server stopped, alice's request and then a burst of silent connections wait in
        // the kernel: once it runs, the burst's connections are accepted right after hers, each
        // closing an unauthenticated one (four may be open).
        server.pause();
        let mut alice = server.connect();
        let request = format!(
            "{}Content-Length: {}\r\n\r\n{init}",
            server.head("POST", Some("alice"), None),
            init.len()
        );
        alice.write_all(request.as_bytes()).unwrap();
        let burst: Vec<TcpStream> = (0..100).map(|_| server.connect()).collect();
        server.resume();
        let answer = read_response(&mut alice);
        assert!(
            answer.as_ref().is_ok_and(|r| r.status == 200),
            "round {round}: alice's request was not answered: {answer:?}"
        );
        // Every connection of the burst accepted (and closed) before the next round.
        std::thread::sleep(Duration::from_millis(300));
        drop(burst);
    }
}

/// How many of `tries` fresh connections of a legitimate client are reset while three threads
/// open silent connections as fast as they can: a measurement, printed, and the bound a server
/// that tells a client whose request is on its way from a silent socket keeps (one closing the
/// oldest unauthenticated connection blindly reset 1.0 to 1.4% of them here; this one 0 to 0.1%).
/// Timing-dependent, so not in the default run: the deterministic check is the test above.
#[test]
#[ignore = "a measurement under load (cargo test --test serve_tenants -- --ignored --nocapture)"]
fn legitimate_connects_are_not_reset_under_an_unauthenticated_burst() {
    let server = Arc::new(Serve::start(
        &["alice"],
        &[
            "--no-store",
            "--max-connections",
            "8",
            "--max-sessions-per-token",
            "0",
        ],
    ));
    let stop = Arc::new(AtomicBool::new(false));
    let bursts: Vec<_> = (0..3)
        .map(|_| {
            let (server, stop) = (Arc::clone(&server), Arc::clone(&stop));
            std::thread::spawn(move || {
                let mut held = std::collections::VecDeque::new();
                while !stop.load(Ordering::Relaxed) {
                    if let Ok(stream) = TcpStream::connect(("127.0.0.1", server.port)) {
                        held.push_back(stream);
                    }
                    if held.len() > 64 {
                        held.pop_front();
                    }
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let tries = 1200;
    let served = fresh_sessions(&server, "alice", tries);
    stop.store(true, Ordering::Relaxed);
    for burst in bursts {
        burst.join().unwrap();
    }
    let reset = tries - served;
    println!(
        "{reset} of {tries} legitimate connects reset under the burst ({:.2}%)",
        100.0 * reset as f64 / tries as f64
    );
    // A client descheduled between its connect and its request is silent too, and can be closed:
    // rare, not never.
    assert!(
        reset <= 2,
        "{reset} of {tries} legitimate connects were reset"
    );
}

/// A run of `code` in `session` as `name` on a connection of its own: the reply message.
fn run(server: &Serve, name: &str, session: &str, code: &str) -> (u16, Value) {
    let mut stream = server.connect();
    let (response, reply) = server
        .rpc(
            &mut stream,
            name,
            session,
            "tools/call",
            json!({"name": "run_python", "arguments": {"code": code}}),
        )
        .unwrap();
    (response.status, reply)
}

fn session_of(server: &Serve, name: &str) -> String {
    let mut stream = server.connect();
    let response = server.open_session(&mut stream, name).unwrap();
    assert_eq!(response.status, 200, "{response:?}");
    response.header("mcp-session-id").unwrap()
}

/// `flooders` tokens each keeping `per_token` runs of half a second going, as fast as they are
/// admitted (a refused one tried again at once).
fn flood(server: &Arc<Serve>, flooders: &[&'static str], per_token: usize) -> Arc<AtomicBool> {
    let stop = Arc::new(AtomicBool::new(false));
    for &name in flooders {
        for _ in 0..per_token {
            let (server, stop) = (Arc::clone(server), Arc::clone(&stop));
            std::thread::spawn(move || {
                let session = session_of(&server, name);
                while !stop.load(Ordering::Relaxed) {
                    run(&server, name, &session, "import time; time.sleep(0.5)");
                }
            });
        }
    }
    stop
}

/// Bob's trivial runs while the flood goes on: each must be admitted (not `over_capacity`).
fn bob_is_admitted(server: &Serve) {
    let session = session_of(server, "bob");
    for _ in 0..5 {
        let started = Instant::now();
        let (status, reply) = run(server, "bob", &session, "1 + 1");
        let took = started.elapsed();
        assert_eq!(status, 200, "{reply}");
        assert_eq!(
            reply["result"]["structuredContent"]["return_value"], 2,
            "{reply}"
        );
        println!("bob's trivial run answered in {took:?} during the flood");
        assert!(took < Duration::from_secs(10), "bob waited {took:?}");
    }
}

#[test]
fn a_tenant_flooding_runs_leaves_another_admitted() {
    // One token allowed the whole host, flooding it.
    let server = Arc::new(Serve::start(
        &["alice", "bob"],
        &[
            "--no-store",
            "--max-runs-in-flight",
            "2",
            "--max-runs-per-token",
            "2",
        ],
    ));
    let stop = flood(&server, &["alice"], 6);
    std::thread::sleep(Duration::from_secs(3));
    bob_is_admitted(&server);
    stop.store(true, Ordering::Relaxed);

    // Two tokens of one attacker, each within its own limit, together filling the host.
    let server = Arc::new(Serve::start(
        &["mallory1", "mallory2", "bob"],
        &[
            "--no-store",
            "--max-runs-in-flight",
            "2",
            "--max-runs-per-token",
            "1",
        ],
    ));
    let stop = flood(&server, &["mallory1", "mallory2"], 3);
    std::thread::sleep(Duration::from_secs(3));
    bob_is_admitted(&server);
    stop.store(true, Ordering::Relaxed);
}

#[test]
fn sessions_stay_bound_to_their_token_whatever_another_token_opens() {
    let server = Arc::new(Serve::start(
        &["alice", "bob"],
        &["--no-store", "--max-sessions-per-token", "20000"],
    ));
    let bobs = session_of(&server, "bob");
    // Alice opens 10,050 sessions (more than any table of bindings the server might cap).
    let opened = Arc::new(AtomicUsize::new(0));
    let threads: Vec<_> = (0..6)
        .map(|t| {
            let (server, opened) = (Arc::clone(&server), Arc::clone(&opened));
            std::thread::spawn(move || {
                let mut stream = server.connect();
                let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                    "protocolVersion": "2025-06-18", "capabilities": {},
                    "clientInfo": {"name": "flood", "version": "0"}}});
                for _ in (t..10_050).step_by(6) {
                    let response = server
                        .send(&mut stream, "POST", Some("alice"), None, &init)
                        .unwrap();
                    assert_eq!(response.status, 200, "{response:?}");
                    opened.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    assert_eq!(opened.load(Ordering::Relaxed), 10_050);

    // Bob's session is still his alone: alice cannot list tools in it, cancel in it, open its
    // stream or delete it; each answer is the one for a session that does not exist.
    let mut stream = server.connect();
    let (listed, _) = server
        .rpc(&mut stream, "alice", &bobs, "tools/list", json!({}))
        .unwrap();
    assert_eq!(listed.status, 404, "{listed:?}");
    let cancel = json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
                        "params": {"requestId": 7, "reason": "hostile"}});
    for (method, body) in [
        ("POST", cancel),
        ("GET", Value::Null),
        ("DELETE", Value::Null),
    ] {
        let response = server
            .send(&mut stream, method, Some("alice"), Some(&bobs), &body)
            .unwrap();
        assert_eq!(response.status, 404, "{method}: {response:?}");
    }
    let (mine, reply) = server
        .rpc(&mut stream, "bob", &bobs, "tools/list", json!({}))
        .unwrap();
    assert_eq!(mine.status, 200, "{mine:?}");
    assert!(reply["result"]["tools"].is_array(), "{reply}");
    // Nor is any session id written whole in the log.
    let log = server.log();
    assert!(
        log.contains("mcp_session="),
        "no call line names its session: {log}"
    );
    assert!(!log.contains(&bobs), "bob's session id is in the log");

    // By default a token has a limit of sessions: past it alice is refused, bob is not.
    let server = Serve::start(&["alice", "bob"], &["--no-store"]);
    let mut stream = server.connect();
    let mut refused = None;
    for _ in 0..2_000 {
        let response = server.open_session(&mut stream, "alice").unwrap();
        if response.status != 200 {
            refused = Some(response);
            break;
        }
    }
    let refused = refused.expect("alice opened 2,000 sessions without meeting a limit");
    assert_eq!(refused.status, 429, "{refused:?}");
    assert!(
        refused.text().contains("--max-sessions-per-token"),
        "{}",
        refused.text()
    );
    session_of(&server, "bob");
}
