//! Egress: what a run may reach is decided on the host, for every connection and every lookup.
//! Every server here listens on loopback and counts what reaches it; no test sends a packet anywhere
//! else. A refusal is proven by a server that saw nothing. Each check runs for one-shot runs,
//! session cells and runs forked from a template (where they can be forked), as root and, in CI, as
//! an unprivileged user.

#![allow(clippy::unwrap_used)] // a test fails loudly where it unwraps

use std::io::{Read, Write};
use std::time::Duration;

use runpython_core::{Envelope, Network, NetworkPolicy, RunPython, Status, Store};
use runpython_tests::ways::{CountingServer, Way};
use serde_json::{json, Value};

/// A loopback server that answers every connection with a small HTTP response, counting them.
fn server() -> CountingServer {
    CountingServer::start(|mut stream| {
        let mut buf = [0u8; 4096];
        let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
        let n = stream.read(&mut buf).unwrap_or(0);
        let body = format!("seen {n} bytes");
        let _ = write!(
            stream,
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
    })
    .unwrap()
}

fn policy(public: bool, allow: &[String], resolve: &[(&str, &str)]) -> Network {
    Network::Policy(NetworkPolicy {
        public,
        allow: allow.iter().map(|p| p.parse().unwrap()).collect(),
        resolve: resolve
            .iter()
            .map(|(n, ip)| ((*n).to_owned(), ip.parse().unwrap()))
            .collect(),
        ..NetworkPolicy::default()
    })
}

fn engine(network: Network, way: Way, store: Option<Store>) -> RunPython {
    let mut builder = way.serve(
        RunPython::builder()
            .timeout(Duration::from_secs(30))
            .network(network),
    );
    if let Some(store) = store {
        builder = builder.store(store);
    }
    builder.build().unwrap()
}

async fn run(engine: &RunPython, way: Way, code: &str) -> Envelope {
    let e = way.run(engine, code).await.unwrap();
    assert_eq!(e.status, Status::Success, "{way:?}: {:?}", e.error);
    if let Way::Forked = way {
        let start = &e.isolation.as_ref().unwrap().start;
        if start != "template" {
            eprintln!("note: {way:?} ran fresh here: {:?}", e.isolation);
        }
    }
    e
}

/// Whether this host can enforce a network policy (user and network namespaces, notifications).
fn enforced() -> bool {
    let report = engine(policy(true, &[], &[]), Way::Fresh, None)
        .isolation_report()
        .unwrap();
    if report.network != "public" {
        eprintln!("skipped: no network policy here: {:?}", report.missing);
        return false;
    }
    true
}

/// What `code` (which defines `attempt(host, port)` returning "connected" or the exception's type and
/// message) answers for each target.
fn attempts(targets: &[(&str, u16)]) -> String {
    let list: Vec<String> = targets
        .iter()
        .map(|(h, p)| format!("({h:?}, {p})"))
        .collect();
    format!(
        "import socket, time\n\
         def attempt(host, port):\n\
         \x20   start = time.monotonic()\n\
         \x20   try:\n\
         \x20       s = socket.create_connection((host, port), timeout=20)\n\
         \x20       s.sendall(b'GET / HTTP/1.0\\r\\n\\r\\n')\n\
         \x20       data = s.recv(100)\n\
         \x20       s.close()\n\
         \x20       return ['connected', data.decode(errors='replace'), time.monotonic() - start]\n\
         \x20   except OSError as e:\n\
         \x20       return [type(e).__name__, str(e), time.monotonic() - start]\n\
         [attempt(h, p) for h, p in [{}]]",
        list.join(", ")
    )
}

fn outcomes(e: &Envelope) -> Vec<(String, String, f64)> {
    e.return_value
        .as_array()
        .unwrap()
        .iter()
        .map(|v| {
            (
                v[0].as_str().unwrap().to_owned(),
                v[1].as_str().unwrap().to_owned(),
                v[2].as_f64().unwrap(),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn allowed_names_and_ports_are_reached_and_nothing_else_is() {
    if !enforced() {
        return;
    }
    for way in Way::ALL {
        let (allowed, other) = (server(), server());
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&format!("file://{}", dir.path().display())).unwrap();
        let engine = engine(
            policy(
                false,
                &[format!("api.test:{}", allowed.port)],
                &[("api.test", "127.0.0.1"), ("other.test", "127.0.0.1")],
            ),
            way,
            Some(store.clone()),
        );
        let e = run(
            &engine,
            way,
            &attempts(&[
                ("api.test", allowed.port),
                ("api.test", other.port),
                ("other.test", other.port),
            ]),
        )
        .await;
        let got = outcomes(&e);
        assert_eq!(got[0].0, "connected", "{way:?}: {got:?}");
        assert!(got[0].1.starts_with("HTTP/1.1 200"), "{way:?}: {got:?}");
        // A name whose port is not allowed: refused at once, naming why and what would allow it.
        assert_eq!(got[1].0, "PermissionError", "{way:?}: {got:?}");
        assert!(
            got[1].1.contains("network policy refused") && got[1].1.contains("--allow-host"),
            "{way:?}: {got:?}"
        );
        // A name the policy does not name: it does not resolve.
        assert_eq!(got[2].0, "gaierror", "{way:?}: {got:?}");
        for (kind, _, secs) in &got[1..] {
            assert!(*secs < 5.0, "{way:?}: a refusal ({kind}) took {secs:.1} s");
        }
        assert_eq!(allowed.seen(), 1, "{way:?}");
        assert_eq!(
            other.seen(),
            0,
            "{way:?}: the refused server saw a connection"
        );

        // The envelope says what the servers saw, and the kept log agrees.
        let network = e.network.as_ref().unwrap();
        assert_eq!(
            (network.mode.as_str(), network.connections),
            ("allowlist", 1),
            "{way:?}: {network:?}"
        );
        assert_eq!(network.bytes_out, 18, "{way:?}: {network:?}"); // GET / HTTP/1.0\r\n\r\n
        assert!(network.bytes_in > 0, "{way:?}: {network:?}");
        let refused: Vec<(String, Option<u16>)> = network
            .refused
            .iter()
            .map(|r| (r.host.clone(), r.port))
            .collect();
        assert!(
            refused.contains(&("api.test".into(), Some(other.port)))
                && refused.contains(&("other.test".into(), None)),
            "{way:?}: {refused:?}"
        );
        let log = e
            .artifacts
            .iter()
            .find(|a| a.name == "network-log.jsonl")
            .unwrap_or_else(|| panic!("{way:?}: no network log in {:?}", e.artifacts));
        let text = store.get_run_artifact(&log.id).await.unwrap();
        let lines: Vec<Value> = String::from_utf8(text.to_vec())
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let connects: Vec<&Value> = lines.iter().filter(|l| l["kind"] == "connect").collect();
        let allowed_line = connects
            .iter()
            .find(|l| l["decision"] == "allowed")
            .unwrap();
        assert_eq!(
            (
                allowed_line["name"].clone(),
                allowed_line["port"].clone(),
                allowed_line["rule"].clone()
            ),
            (
                json!("api.test"),
                json!(allowed.port),
                json!(format!("api.test:{}", allowed.port))
            ),
            "{way:?}: {lines:?}"
        );
        assert_eq!(allowed_line["bytes_out"], json!(18), "{way:?}");
        assert!(
            connects
                .iter()
                .any(|l| l["decision"] == "refused" && l["port"] == json!(other.port)),
            "{way:?}: {lines:?}"
        );
        assert!(
            lines.iter().any(|l| l["kind"] == "lookup"
                && l["name"] == "other.test"
                && l["decision"] == "refused"),
            "{way:?}: {lines:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_public_internet_never_reaches_a_loopback_server_under_any_spelling() {
    if !enforced() {
        return;
    }
    let server = server();
    let port = server.port;
    for way in Way::ALL {
        // A name pinned to loopback is no way in either: its answer is withheld.
        let engine = engine(
            policy(true, &[], &[("sneaky.test", "127.0.0.1")]),
            way,
            None,
        );
        let e = run(
            &engine,
            way,
            &attempts(&[
                ("127.0.0.1", port),
                ("127.1", port),
                ("2130706433", port),
                ("0.0.0.0", port),
                ("localhost", port),
                ("::1", port),
                ("::ffff:127.0.0.1", port),
                ("::", port),
                ("sneaky.test", port),
            ]),
        )
        .await;
        for (i, (kind, message, secs)) in outcomes(&e).iter().enumerate() {
            assert_ne!(kind, "connected", "{way:?} #{i}: {message}");
            assert!(*secs < 5.0, "{way:?} #{i}: {kind} took {secs:.1} s");
        }
        assert_eq!(server.seen(), 0, "{way:?}: the host's loopback was reached");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn naming_one_loopback_port_opens_that_port_alone() {
    if !enforced() {
        return;
    }
    for way in Way::ALL {
        let (named, beside) = (server(), server());
        let engine = engine(
            policy(false, &[format!("127.0.0.1:{}", named.port)], &[]),
            way,
            None,
        );
        let e = run(
            &engine,
            way,
            &attempts(&[("127.0.0.1", named.port), ("127.0.0.1", beside.port)]),
        )
        .await;
        let got = outcomes(&e);
        assert_eq!(got[0].0, "connected", "{way:?}: {got:?}");
        assert_ne!(got[1].0, "connected", "{way:?}: {got:?}");
        assert_eq!((named.seen(), beside.seen()), (1, 0), "{way:?}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn udp_leaves_a_run_only_as_its_name_lookups() {
    if !enforced() {
        return;
    }
    let udp = std::net::UdpSocket::bind((std::net::Ipv4Addr::LOCALHOST, 0)).unwrap();
    udp.set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    let port = udp.local_addr().unwrap().port();
    let engine = engine(
        policy(
            false,
            &[format!("quic.test:{port}")],
            &[("quic.test", "127.0.0.1")],
        ),
        Way::Fresh,
        None,
    );
    let code = format!(
        "import socket\n\
         s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n\
         out = []\n\
         for target in [('quic.test', {port}), ('127.0.0.1', {port})]:\n\
         \x20   try:\n\
         \x20       s.sendto(b'hello', target)\n\
         \x20       out.append('sent')\n\
         \x20   except OSError as e:\n\
         \x20       out.append(type(e).__name__)\n\
         out"
    );
    let e = run(&engine, Way::Fresh, &code).await;
    assert!(e.return_value.is_array(), "{:?}", e.return_value);
    let mut buf = [0u8; 16];
    assert!(
        udp.recv_from(&mut buf).is_err(),
        "a datagram left the run: {:?}",
        e.return_value
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_call_can_narrow_the_engines_network_and_never_widen_it() {
    if !enforced() {
        return;
    }
    let (one, two) = (server(), server());
    let engine = engine(
        policy(
            false,
            &[
                format!("one.test:{}", one.port),
                format!("two.test:{}", two.port),
            ],
            &[("one.test", "127.0.0.1"), ("two.test", "127.0.0.1")],
        ),
        Way::Fresh,
        None,
    );
    let code = attempts(&[("one.test", one.port), ("two.test", two.port)]);
    let narrowed = engine
        .run(
            runpython_core::RunRequest::new(code.as_str()).allow_hosts(vec![format!(
                "one.test:{}",
                one.port
            )
            .parse()
            .unwrap()]),
        )
        .await
        .unwrap();
    let got = outcomes(&narrowed);
    assert_eq!(got[0].0, "connected", "{got:?}");
    assert_eq!(got[1].0, "PermissionError", "{got:?}");
    assert!(got[1].1.contains("allow_hosts"), "{got:?}");
    assert_eq!((one.seen(), two.seen()), (1, 0));
    // Asking for more than the engine allows gets nothing more.
    let third = server();
    let wider = engine
        .run(
            runpython_core::RunRequest::new(attempts(&[("127.0.0.1", third.port)]))
                .allow_hosts(vec![format!("127.0.0.1:{}", third.port).parse().unwrap()]),
        )
        .await
        .unwrap();
    assert_ne!(outcomes(&wider)[0].0, "connected");
    assert_eq!(third.seen(), 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn isolation_reports_the_mode_and_its_rules() {
    if !enforced() {
        return;
    }
    let engine = engine(
        policy(
            false,
            &["api.test:443".into()],
            &[("api.test", "127.0.0.1")],
        ),
        Way::Fresh,
        None,
    );
    let isolation = engine.isolation_report().unwrap();
    assert_eq!(
        (isolation.network.as_str(), isolation.network_rules),
        ("allowlist", Some(2))
    );
    // A run that used no network says nothing of it.
    let e = engine.run("1 + 1").await.unwrap();
    assert!(e.network.is_none(), "{:?}", e.network);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_run_reaches_its_own_loopback_servers_and_is_refused_where_it_listens_on_nothing() {
    if !enforced() {
        return;
    }
    // A port of the host's loopback, on which the run itself listens on nothing.
    let host = server();
    let code = format!(
        r#"
import socket, threading
def serve(family, address):
    listener = socket.socket(family)
    listener.bind((address, 0))
    listener.listen()
    def answer():
        while True:
            conn, _ = listener.accept()
            conn.sendall(b"own")
            conn.close()
    threading.Thread(target=answer, daemon=True).start()
    return listener, listener.getsockname()[1]
(l4, p4), (l6, p6) = serve(socket.AF_INET, "127.0.0.1"), serve(socket.AF_INET6, "::1")
own = [socket.create_connection(a, timeout=5).recv(3).decode() for a in (("127.0.0.1", p4), ("::1", p6))]
refused = []
for address in ["127.0.0.1", "127.1", "2130706433", "0.0.0.0", "::1", "::ffff:127.0.0.1", "::"]:
    try:
        socket.create_connection((address, {port}), timeout=5).close()
        refused.append("connected")
    except OSError as e:
        refused.append(type(e).__name__ + ": " + str(e))
[own, refused]
"#,
        port = host.port
    );
    for way in Way::ALL {
        for public in [false, true] {
            let network = policy(public, &["api.test:443".into()], &[]);
            let e = run(&engine(network, way, None), way, &code).await;
            let v = &e.return_value;
            assert_eq!(
                v[0],
                json!(["own", "own"]),
                "{way:?}: the run's own servers: {v}"
            );
            for outcome in v[1].as_array().unwrap() {
                let outcome = outcome.as_str().unwrap();
                assert!(
                    outcome.starts_with("PermissionError")
                        && outcome.contains("network policy refused")
                        && outcome.contains("--allow-host"),
                    "{way:?}, public {public}: {outcome}"
                );
            }
            let refused: Vec<(String, Option<u16>)> = e
                .network
                .as_ref()
                .unwrap()
                .refused
                .iter()
                .map(|r| (r.host.clone(), r.port))
                .collect();
            for address in ["127.0.0.1", "0.0.0.0", "::1", "::"] {
                assert!(
                    refused.contains(&(address.to_owned(), Some(host.port))),
                    "{way:?}: {address} not reported in {refused:?}"
                );
            }
        }
    }
    assert_eq!(host.seen(), 0, "the host's loopback was reached");
}
