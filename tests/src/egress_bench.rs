//! What the egress path costs: the same sandboxed client against the same loopback HTTP server,
//! through the policy (every connection decided on the host and joined by the relay) and direct
//! (the host's network shared), in one run. Each side is a session, so a round is a cell; the
//! rounds alternate (ABBA), and each figure is the median over the rounds of the pair measured
//! side by side, so a noisy machine moves both sides of a ratio alike. Timed inside the run, so a
//! run's start is not counted.

use std::time::Duration;

use runpython_core::{Network, NetworkPolicy, RunPython};
use serde_json::{json, Map, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::stats::{p50, round3};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Bytes of the download.
const DOWNLOAD: u64 = 256 << 20;

/// Rounds of each side.
const ROUNDS: usize = 8;

/// A keep-alive HTTP/1.1 server on loopback: `GET /small` answers 64 bytes, `GET /big` 256 MiB.
async fn serve() -> Result<u16, BoxError> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let port = listener.local_addr()?.port();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let _ = stream.set_nodelay(true);
            tokio::spawn(async move {
                let chunk = vec![b'x'; 1 << 20];
                let mut buf = vec![0u8; 4096];
                let mut have = Vec::new();
                loop {
                    let n = match stream.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => n,
                    };
                    have.extend_from_slice(&buf[..n]);
                    while let Some(end) = have.windows(4).position(|w| w == b"\r\n\r\n") {
                        let head = String::from_utf8_lossy(&have[..end]).into_owned();
                        have.drain(..end + 4);
                        let big = head.starts_with("GET /big");
                        let len = if big { DOWNLOAD } else { 64 };
                        let header = format!("HTTP/1.1 200 OK\r\nContent-Length: {len}\r\n\r\n");
                        if stream.write_all(header.as_bytes()).await.is_err() {
                            return;
                        }
                        if big {
                            for _ in 0..(DOWNLOAD >> 20) {
                                if stream.write_all(&chunk).await.is_err() {
                                    return;
                                }
                            }
                        } else if stream.write_all(&chunk[..64]).await.is_err() {
                            return;
                        }
                    }
                }
            });
        }
    });
    Ok(port)
}

/// The least a relay costs on this machine: a listener on loopback whose every connection is joined
/// to the server by two threads, each moving one direction with blocking `splice(2)` through a pipe
/// of 1 MiB (the pump's size), no sandbox, no policy, no async runtime. The client, with the host's
/// network, reaches the server through it; what it measures is the second TCP connection's own cost.
/// Returns the relay's port; it serves until the process ends.
fn relay_floor(server: u16) -> Result<u16, BoxError> {
    use std::os::fd::AsRawFd as _;
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    let port = listener.local_addr()?.port();
    std::thread::spawn(move || {
        for child in listener.incoming().flatten() {
            let Ok(upstream) = std::net::TcpStream::connect(("127.0.0.1", server)) else {
                continue;
            };
            let _ = (child.set_nodelay(true), upstream.set_nodelay(true));
            let (Ok(c2), Ok(u2)) = (child.try_clone(), upstream.try_clone()) else {
                continue;
            };
            for (from, to) in [(child, upstream), (u2, c2)] {
                std::thread::spawn(move || {
                    let mut fds = [0 as nix::libc::c_int; 2];
                    // SAFETY: pipe2 writes two new descriptors, closed at the end of this thread.
                    if unsafe { nix::libc::pipe2(fds.as_mut_ptr(), nix::libc::O_CLOEXEC) } != 0 {
                        return;
                    }
                    // SAFETY: fcntl and splice on descriptors this thread holds.
                    unsafe {
                        nix::libc::fcntl(fds[1], nix::libc::F_SETPIPE_SZ, 1 << 20);
                        let (f, t) = (from.as_raw_fd(), to.as_raw_fd());
                        let null = std::ptr::null_mut();
                        'moving: loop {
                            let n = nix::libc::splice(f, null, fds[1], null, 1 << 20, 1);
                            if n <= 0 {
                                break;
                            }
                            let mut held = n as usize;
                            while held > 0 {
                                let m = nix::libc::splice(fds[0], null, t, null, held, 1);
                                if m <= 0 {
                                    break 'moving;
                                }
                                held -= m as usize;
                            }
                        }
                        nix::libc::shutdown(to.as_raw_fd(), nix::libc::SHUT_WR);
                        nix::libc::close(fds[0]);
                        nix::libc::close(fds[1]);
                    }
                });
            }
        }
    });
    Ok(port)
}

/// One round of the client: p50 of a small request on one kept-alive connection, p50 of a small
/// request on a new connection each, and the download's MB/s.
fn client(port: u16) -> String {
    format!(
        r#"
import http.client, socket, time
def p50(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2]
c = http.client.HTTPConnection("127.0.0.1", {port}, timeout=30)
for _ in range(20):
    c.request("GET", "/small"); c.getresponse().read()
kept = []
for _ in range(300):
    t = time.perf_counter(); c.request("GET", "/small"); c.getresponse().read(); kept.append(time.perf_counter() - t)
c.close()
fresh = []
for _ in range(150):
    t = time.perf_counter()
    c = http.client.HTTPConnection("127.0.0.1", {port}, timeout=30)
    c.request("GET", "/small"); c.getresponse().read(); c.close()
    fresh.append(time.perf_counter() - t)
s = socket.create_connection(("127.0.0.1", {port}), timeout=60)
s.sendall(b"GET /big HTTP/1.1\r\nHost: x\r\n\r\n")
want = {download} + len(b"HTTP/1.1 200 OK\r\nContent-Length: {download}\r\n\r\n")
buf = bytearray(1 << 20); view = memoryview(buf); got = 0; t = time.perf_counter()
while got < want:
    n = s.recv_into(view)
    if not n: break
    got += n
secs = time.perf_counter() - t
s.close()
[p50(kept) * 1e6, p50(fresh) * 1e6, (got / secs) / 1e6]
"#,
        download = DOWNLOAD
    )
}

/// One round's figures: kept-alive µs, new-connection µs, MB/s.
type Round = (f64, f64, f64);

/// One figure of a round.
type Figure = fn(&Round) -> f64;

async fn measure(
    run: impl std::future::Future<Output = Result<runpython_core::Envelope, runpython_core::Error>>,
) -> Result<Round, BoxError> {
    let e = run.await?;
    let v = e
        .return_value
        .as_array()
        .cloned()
        .ok_or_else(|| format!("the egress client failed: {:?} {:?}", e.error, e.stderr))?;
    let at = |i: usize| v.get(i).and_then(Value::as_f64).unwrap_or(f64::NAN);
    Ok((at(0), at(1), at(2)))
}

/// Adds `egress_rtt_vs_direct` (p50 of a small request on a kept-alive connection, through the
/// policy over direct), `egress_connect_rtt_vs_direct` (the same with a new connection per
/// request), `egress_throughput_vs_direct` (a 256 MiB download's rate, through over direct) and the
/// absolute figures behind them; each the median over `ROUNDS` (8) interleaved rounds. Beside them
/// the same client through `relay_floor` (`egress_relay_floor_rtt_vs_direct`,
/// `egress_relay_floor_throughput_vs_direct`): what any relay costs here, the bound of a design in
/// which the run never holds a socket of the host's. Skipped (with why) where no policy can be
/// enforced.
pub async fn egress_figures(m: &mut Map<String, Value>) -> Result<(), BoxError> {
    let port = serve().await?;
    let floor_port = relay_floor(port)?;
    let engine = |network: Network| {
        RunPython::builder()
            .timeout(Duration::from_secs(300))
            .network(network)
            .build()
    };
    let policy = engine(Network::Policy(NetworkPolicy {
        allow: vec![format!("127.0.0.1:{port}").parse()?],
        ..NetworkPolicy::default()
    }))?;
    if policy.isolation_report()?.network != "allowlist" {
        m.insert(
            "egress".into(),
            json!("skipped: no network policy can be enforced on this host"),
        );
        return Ok(());
    }
    let direct = engine(Network::Host)?;
    let (through, direct) = (policy.session(), direct.session());
    let (code, floor_code) = (client(port), client(floor_port));
    // The three sides: through the policy, direct, direct through the floor relay.
    let side = |i: usize| match i {
        0 => through.run(code.as_str()),
        1 => direct.run(code.as_str()),
        _ => direct.run(floor_code.as_str()),
    };
    // A first round each, not counted: the sessions' interpreters and the server warm up.
    for i in 0..3 {
        measure(side(i)).await?;
    }
    let mut rounds: [Vec<Round>; 3] = Default::default();
    for round in 0..ROUNDS {
        // Each side goes first, second and last in turn.
        let mut order = [0, 1, 2];
        order.rotate_left(round % 3);
        if round % 2 == 1 {
            order.reverse();
        }
        for i in order {
            rounds[i].push(measure(side(i)).await?);
        }
    }
    let [ours, theirs, floor] = &rounds;
    let median = |rounds: &[Round], f: Figure| p50(rounds.iter().map(f).collect());
    let ratio = |side: &[Round], f: Figure| {
        p50(side.iter().zip(theirs).map(|(a, b)| f(a) / f(b)).collect())
    };
    let (kept, fresh, rate): (Figure, Figure, Figure) = (|r| r.0, |r| r.1, |r| r.2);
    let mut put = |k: &str, v: f64| {
        m.insert(k.into(), json!(v));
    };
    put("egress_request_us", round3(median(ours, kept)));
    put("egress_request_us_direct", round3(median(theirs, kept)));
    put("egress_rtt_vs_direct", round3(ratio(ours, kept)));
    put("egress_connect_request_us", round3(median(ours, fresh)));
    put(
        "egress_connect_request_us_direct",
        round3(median(theirs, fresh)),
    );
    put("egress_connect_rtt_vs_direct", round3(ratio(ours, fresh)));
    put("egress_download_mb_s", median(ours, rate).round());
    put("egress_download_mb_s_direct", median(theirs, rate).round());
    put("egress_throughput_vs_direct", round3(ratio(ours, rate)));
    put("egress_relay_floor_request_us", round3(median(floor, kept)));
    put(
        "egress_relay_floor_rtt_vs_direct",
        round3(ratio(floor, kept)),
    );
    put(
        "egress_relay_floor_download_mb_s",
        median(floor, rate).round(),
    );
    put(
        "egress_relay_floor_throughput_vs_direct",
        round3(ratio(floor, rate)),
    );
    Ok(())
}

/// The client for the secrets figures: p50 of an HTTPS request on a new connection each, and on one
/// kept-alive connection, to `api.test`; `ca` is the roots to trust (`None`: the run's default,
/// which with a secret is its bundle).
fn secret_client(port: u16, ca: Option<&str>) -> String {
    let context = match ca {
        Some(ca) => format!(
            "ssl.create_default_context(cadata={})",
            serde_json::to_string(ca).unwrap_or_default()
        ),
        None => "ssl.create_default_context()".to_owned(),
    };
    format!(
        r#"
import http.client, os, ssl, time
ctx = {context}
key = os.environ.get("API_KEY", "none")
def p50(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2]
def once(c):
    c.request("GET", "/", headers={{"Authorization": "Bearer " + key}}); c.getresponse().read()
fresh = []
for i in range(60):
    t = time.perf_counter()
    c = http.client.HTTPSConnection("api.test", {port}, context=ctx, timeout=30)
    once(c); c.close()
    if i >= 10: fresh.append(time.perf_counter() - t)
c = http.client.HTTPSConnection("api.test", {port}, context=ctx, timeout=30)
for _ in range(20): once(c)
kept = []
for _ in range(200):
    t = time.perf_counter(); once(c); kept.append(time.perf_counter() - t)
c.close()
[p50(fresh) * 1e3, p50(kept) * 1e3]
"#
    )
}

/// Adds `secret_request_overhead_ms` (p50 of an HTTPS request on a new connection with the value
/// put in by the host's proxy, minus the same request allowed without a secret, its TLS passing
/// through untouched), `secret_kept_request_overhead_ms` (the same on a kept-alive connection) and
/// the figures behind them. Skipped (with why) where no policy can be enforced.
pub async fn secret_figures(m: &mut Map<String, Value>) -> Result<(), BoxError> {
    let ca = crate::recorder::TestCa::new(&["api.test"])?;
    let server = crate::recorder::Recorder::start(Some(&ca)).await?;
    let port = server.port;
    let policy = || NetworkPolicy {
        allow: vec![format!("api.test:{port}").parse().ok()]
            .into_iter()
            .flatten()
            .collect(),
        resolve: vec![("api.test".into(), std::net::Ipv4Addr::LOCALHOST.into())],
        ..NetworkPolicy::default()
    };
    let engine = |secret: bool| {
        let mut builder = RunPython::builder()
            .timeout(Duration::from_secs(300))
            .network(Network::Policy(policy()));
        if secret {
            builder = builder
                .secret(runpython_core::Secret::new(
                    "API_KEY",
                    "sk-bench-0123456789abcdef0123456789abcdef",
                    vec!["api.test".parse().map_err(|e| format!("{e}"))?],
                ))
                .upstream_ca(ca.ca_pem.clone().into_bytes());
        }
        builder.build().map_err(|e| e.to_string())
    };
    let with = engine(true)?;
    if with.isolation_report()?.network != "allowlist" {
        m.insert(
            "secrets".into(),
            json!("skipped: no network policy can be enforced on this host"),
        );
        return Ok(());
    }
    let without = engine(false)?;
    let (code_with, code_without) = (
        secret_client(port, None),
        secret_client(port, Some(&ca.ca_pem)),
    );
    let (mut fresh, mut kept, mut fresh_o, mut kept_o) = (vec![], vec![], vec![], vec![]);
    for _ in 0..3 {
        let (f, k, _) = measure(with.run(code_with.as_str())).await?;
        fresh.push(f);
        kept.push(k);
        let (f, k, _) = measure(without.run(code_without.as_str())).await?;
        fresh_o.push(f);
        kept_o.push(k);
    }
    let (fresh, kept, fresh_o, kept_o) = (p50(fresh), p50(kept), p50(fresh_o), p50(kept_o));
    m.insert("secret_request_ms".into(), json!(round3(fresh)));
    m.insert("secret_request_ms_opaque".into(), json!(round3(fresh_o)));
    m.insert(
        "secret_request_overhead_ms".into(),
        json!(round3(fresh - fresh_o)),
    );
    m.insert("secret_kept_request_ms".into(), json!(round3(kept)));
    m.insert(
        "secret_kept_request_ms_opaque".into(),
        json!(round3(kept_o)),
    );
    m.insert(
        "secret_kept_request_overhead_ms".into(),
        json!(round3(kept - kept_o)),
    );
    Ok(())
}
