//! A small internet in network namespaces, for the suites that attack egress as a hostile model
//! would: the host side (the test's engine, its `HTTPS_PROXY`, services on the host's loopback) in
//! a network namespace the test makes, and "public" addresses on the loopback of a peer namespace
//! behind a veth pair, with servers that record what reached them. Nothing has a route anywhere
//! else, so no packet of these tests can leave the machine, whatever the code under test does.
//!
//! A test using it calls [`World::enter`] first. In the test's own process that makes a world (as
//! root: network, PID and mount namespaces; as another user: a user namespace too, where the
//! kernel lets it make one, with the test then run under the user's own uid again in a nested one,
//! so the sandbox takes its unprivileged path) and runs the same test inside it, twice over: once
//! in the peer namespace, serving, and once in the host namespace, where `enter` returns the world
//! and the test's body runs. The outer call waits for that, fails with its output if it failed,
//! and returns `None`; so does a host that cannot make the namespaces (said on stderr).
//!
//! The peer serves, on every address in [`PEER_V4`] and [`PEER_V6`], a recorder on ports 80 and
//! 8080 ([`crate::recorder::Recorder`], what each got readable with [`World::seen`]), and on
//! [`API`] TLS on 443 with a certificate for `api.test` from the world's CA ([`World::ca`]) and on
//! 8443 with one from a CA nobody trusts.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::recorder::{Recorder, TestCa};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The world's `api.test`: a public address on the peer.
pub const API: Ipv4Addr = Ipv4Addr::new(93, 184, 215, 14);
/// A public address on the peer that an attacker's name points to.
pub const ATTACKER: Ipv4Addr = Ipv4Addr::new(93, 184, 215, 99);
/// A public IPv6 address on the peer.
pub const API6: Ipv6Addr = Ipv6Addr::new(0x2606, 0x2800, 0x220, 1, 0, 0, 0, 0x14);

/// The peer's IPv4 addresses: two public ones, then the clouds' metadata and platform addresses.
pub const PEER_V4: [Ipv4Addr; 8] = [
    API,
    ATTACKER,
    Ipv4Addr::new(169, 254, 169, 254),
    Ipv4Addr::new(169, 254, 170, 2),
    Ipv4Addr::new(168, 63, 129, 16),
    Ipv4Addr::new(100, 100, 100, 200),
    Ipv4Addr::new(192, 0, 0, 192),
    Ipv4Addr::new(161, 26, 0, 7),
];

/// The peer's IPv6 addresses: a public one, then AWS's metadata address.
pub const PEER_V6: [Ipv6Addr; 2] = [API6, Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254)];

/// Where the world's files are, for the processes inside it.
const DIR_VAR: &str = "RUNPYTHON_TEST_WORLD";
/// Set (to the same) for the peer's process.
const PEER_VAR: &str = "RUNPYTHON_TEST_WORLD_PEER";
/// The uid the test ran as outside, which its host side must run as too.
const UID_VAR: &str = "RUNPYTHON_TEST_WORLD_UID";

/// How long a world's test may take.
const DEADLINE: Duration = Duration::from_secs(240);

/// The world a test runs in, seen from its host namespace.
#[derive(Debug)]
pub struct World {
    dir: PathBuf,
}

impl World {
    /// See the module's docs: `Some` inside the world's host namespace, else `None` once the test
    /// `name` (this test's function name) ran inside a world, or could not. `env` is set for the
    /// host side (a `HTTPS_PROXY`, say).
    pub async fn enter(name: &str, env: &[(&str, &str)]) -> Option<World> {
        if let Some(dir) = std::env::var_os(PEER_VAR) {
            serve_peer(Path::new(&dir)).await;
        }
        if let Some(dir) = std::env::var_os(DIR_VAR) {
            let uid = nix::unistd::geteuid().to_string();
            assert_eq!(
                std::env::var(UID_VAR).ok().as_deref(),
                Some(uid.as_str()),
                "the world's host side must run as the user the test ran as"
            );
            return Some(World { dir: dir.into() });
        }
        let (name, env) = (
            name.to_owned(),
            env.iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect::<Vec<_>>(),
        );
        let outcome = tokio::task::spawn_blocking(move || run_world(&name, &env))
            .await
            .unwrap_or_else(|e| Err(format!("the world's task failed: {e}")));
        match outcome {
            Ok(Ran::Passed) => {}
            Ok(Ran::Skipped(why)) => eprintln!("skipped: {why}"),
            Err(why) => panic!("{why}"),
        }
        None
    }

    /// The world's CA, which signed the peer's certificate for `api.test` on [`API`]:443.
    pub fn ca(&self) -> TestCa {
        TestCa::load(&self.dir, "world").unwrap_or_else(|e| panic!("the world's CA: {e}"))
    }

    /// What the peer's recorder on `ip:port` got, each request's head and body.
    pub fn seen(&self, ip: IpAddr, port: u16) -> Vec<String> {
        // A connection the host made is in by the time a run's envelope is back; give a stray
        // one a moment to be written before saying none came.
        std::thread::sleep(Duration::from_millis(100));
        Recorder::kept(&seen_file(&self.dir, SocketAddr::new(ip, port)))
    }

    /// Everything the peer's recorders got, from any address.
    pub fn seen_anywhere(&self) -> Vec<String> {
        std::thread::sleep(Duration::from_millis(100));
        let mut all = Vec::new();
        for entry in std::fs::read_dir(self.dir.join("seen"))
            .into_iter()
            .flatten()
            .flatten()
        {
            all.extend(Recorder::kept(&entry.path()));
        }
        all
    }
}

/// A `CONNECT` proxy on the host's loopback that resolves names as a real one does (here from
/// its own table: the answers a name's owner gives the proxy, whatever it told the run), and logs
/// every request line.
#[derive(Debug)]
pub struct Proxy {
    /// Its address, for `HTTPS_PROXY`.
    pub addr: SocketAddr,
    log: Arc<Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Proxy {
    /// Starts one on `addr`, resolving `names` so (any other name: 502).
    pub async fn start(addr: SocketAddr, names: &[(&str, IpAddr)]) -> Result<Proxy, BoxError> {
        let listener = TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let names: Arc<Vec<(String, IpAddr)>> =
            Arc::new(names.iter().map(|(n, ip)| ((*n).to_owned(), *ip)).collect());
        let log: Arc<Mutex<Vec<String>>> = Arc::default();
        let kept = Arc::clone(&log);
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let (names, log) = (Arc::clone(&names), Arc::clone(&kept));
                tokio::spawn(async move {
                    let _ = tunnel(client, &names, &log).await;
                });
            }
        });
        Ok(Proxy { addr, log, task })
    }

    /// Every request line so far (`CONNECT host:port HTTP/1.1`).
    pub fn requests(&self) -> Vec<String> {
        self.log.lock().map(|l| l.clone()).unwrap_or_default()
    }
}

async fn tunnel(
    mut client: TcpStream,
    names: &[(String, IpAddr)],
    log: &Mutex<Vec<String>>,
) -> std::io::Result<()> {
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") && head.len() < 16 << 10 {
        head.push(client.read_u8().await?);
    }
    let line = String::from_utf8_lossy(&head)
        .lines()
        .next()
        .unwrap_or_default()
        .to_owned();
    if let Ok(mut log) = log.lock() {
        log.push(line.clone());
    }
    let target = line.split(' ').nth(1).unwrap_or_default();
    let (host, port) = target.rsplit_once(':').unwrap_or((target, ""));
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let ip = host
        .parse::<IpAddr>()
        .ok()
        .or_else(|| names.iter().find(|(n, _)| n == host).map(|(_, ip)| *ip));
    let upstream = match (ip, port.parse::<u16>()) {
        (Some(ip), Ok(port)) => TcpStream::connect((ip, port)).await.ok(),
        _ => None,
    };
    let Some(mut upstream) = upstream else {
        return client.write_all(b"HTTP/1.1 502 Bad Gateway\r\n\r\n").await;
    };
    client
        .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
        .await?;
    tokio::io::copy_bidirectional(&mut client, &mut upstream).await?;
    Ok(())
}

/// A recorder on the host's loopback (in the world's host namespace, so its own port is free).
pub async fn host_loopback_recorder(port: u16) -> Result<Recorder, BoxError> {
    Recorder::start_at(SocketAddr::from(([127, 0, 0, 1], port)), None, None).await
}

fn seen_file(dir: &Path, addr: SocketAddr) -> PathBuf {
    let name = format!("{}_{}", addr.ip(), addr.port()).replace(':', "-");
    dir.join("seen").join(name)
}

/// The peer's servers, then nothing until the world ends (its PID namespace going takes this
/// process with it).
async fn serve_peer(dir: &Path) -> ! {
    let started = async {
        std::fs::create_dir_all(dir.join("seen"))?;
        let ca = TestCa::load(dir, "world")?;
        let stranger = TestCa::new(&["api.test"])?;
        let mut recorders = Vec::new();
        let addrs = PEER_V4
            .iter()
            .map(|ip| IpAddr::V4(*ip))
            .chain(PEER_V6.iter().map(|ip| IpAddr::V6(*ip)));
        for ip in addrs {
            for port in [80, 8080] {
                let addr = SocketAddr::new(ip, port);
                let file = seen_file(dir, addr);
                recorders.push(Recorder::start_at(addr, None, Some(file)).await?);
            }
        }
        for (port, ca) in [(443, &ca), (8443, &stranger)] {
            let addr = SocketAddr::new(IpAddr::V4(API), port);
            let file = seen_file(dir, addr);
            recorders.push(Recorder::start_at(addr, Some(ca), Some(file)).await?);
        }
        std::fs::write(dir.join("peer-ready"), "")?;
        Ok::<_, BoxError>(recorders)
    };
    match started.await {
        Ok(recorders) => {
            let _kept = recorders;
            std::future::pending().await
        }
        Err(e) => {
            let _ = std::fs::write(dir.join("peer-failed"), e.to_string());
            std::process::exit(1)
        }
    }
}

/// How a world's test ended.
enum Ran {
    Passed,
    Skipped(String),
}

/// Makes a world and runs test `name` in it (see the module's docs).
fn run_world(name: &str, env: &[(String, String)]) -> Result<Ran, String> {
    let Some(ip) = ["/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"]
        .into_iter()
        .find(|p| Path::new(p).exists())
    else {
        return Ok(Ran::Skipped(
            "no `ip` (iproute2) to build the test's network".into(),
        ));
    };
    let root = nix::unistd::geteuid().is_root();
    let mut namespaces = vec![
        "--net",
        "--pid",
        "--mount",
        "--fork",
        "--kill-child",
        "--mount-proc",
    ];
    if !root {
        namespaces.insert(0, "--map-root-user");
        namespaces.insert(0, "--user");
    }
    let probe = Command::new("unshare")
        .args(&namespaces)
        .arg("true")
        .stderr(Stdio::piped())
        .output();
    match probe {
        Ok(out) if out.status.success() => {}
        Ok(out) => {
            return Ok(Ran::Skipped(format!(
                "this user cannot make the test's namespaces: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            )))
        }
        Err(e) => return Ok(Ran::Skipped(format!("no `unshare` (util-linux): {e}"))),
    }
    let dir = tempfile::tempdir().map_err(|e| format!("a directory for the world: {e}"))?;
    TestCa::new(&["api.test"])
        .and_then(|ca| ca.save(dir.path(), "world").map_err(Into::into))
        .map_err(|e| format!("the world's CA: {e}"))?;
    let exe = std::env::current_exe().map_err(|e| format!("this test's executable: {e}"))?;
    let test = format!(
        "{} --exact {name} --nocapture --test-threads=1",
        shell_quote(&exe.to_string_lossy())
    );
    // Back to the user's own uid for the host side, in a nested user namespace: the sandbox then
    // takes the path it takes for that user.
    let as_user = if root {
        String::new()
    } else {
        let (uid, gid) = (nix::unistd::getuid(), nix::unistd::getgid());
        format!("unshare --user --map-user={uid} --map-group={gid} -- ")
    };
    let script = world_script(ip, &test, &as_user);
    let mut child = Command::new("unshare")
        .args(&namespaces)
        .args(["--", "sh", "-c", &script])
        .env(DIR_VAR, dir.path())
        .env(UID_VAR, nix::unistd::geteuid().to_string())
        .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start unshare: {e}"))?;
    let start = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Some(status),
            Ok(None) if start.elapsed() > DEADLINE => {
                // Its PID namespace's first process dies with it (--kill-child), and with that
                // process every other one of the world.
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(50)),
            Err(e) => return Err(format!("waiting for the world: {e}")),
        }
    };
    let mut out = String::new();
    let mut err = String::new();
    if let Some(mut s) = child.stdout.take() {
        let _ = std::io::Read::read_to_string(&mut s, &mut out);
    }
    if let Some(mut s) = child.stderr.take() {
        let _ = std::io::Read::read_to_string(&mut s, &mut err);
    }
    let peer = std::fs::read_to_string(dir.path().join("peer.out")).unwrap_or_default();
    let shown = format!("--- host side ---\n{out}\n{err}\n--- peer ---\n{peer}");
    match status {
        Some(status) if status.success() && out.contains("1 passed") => {
            println!("{shown}");
            Ok(Ran::Passed)
        }
        Some(status) => Err(format!("{name} failed in its world ({status}):\n{shown}")),
        None => Err(format!(
            "{name} did not finish in its world within {} s:\n{shown}",
            DEADLINE.as_secs()
        )),
    }
}

/// The world's setup (run as root of its namespaces): the peer's namespace, held by a process of
/// its own, joined to the host's by a veth pair; its addresses on its loopback, routes both ways;
/// the peer's servers; then the test on the host side.
fn world_script(ip: &str, test: &str, as_user: &str) -> String {
    let v4: Vec<String> = PEER_V4.iter().map(ToString::to_string).collect();
    let v6: Vec<String> = PEER_V6.iter().map(ToString::to_string).collect();
    let dir = format!("\"${DIR_VAR}\"");
    format!(
        r#"set -e
IP={ip}
$IP link set lo up
unshare --net sleep 100000 &
HOLD=$!
while [ "$(readlink /proc/$HOLD/ns/net)" = "$(readlink /proc/self/ns/net)" ]; do sleep 0.01; done
$IP link add rp-host type veth peer name rp-peer netns $HOLD
$IP addr add 10.77.0.1/30 dev rp-host
$IP -6 addr add fd77::1/64 dev rp-host nodad
$IP link set rp-host up
nsenter -t $HOLD -n sh -c '
  set -e
  $0 link set lo up
  $0 link set rp-peer up
  $0 addr add 10.77.0.2/30 dev rp-peer
  $0 -6 addr add fd77::2/64 dev rp-peer nodad
  for a in {v4}; do $0 addr add $a/32 dev lo; done
  for a in {v6}; do $0 -6 addr add $a/128 dev lo nodad; done
  $0 route add default via 10.77.0.1
  $0 -6 route add default via fd77::1
' $IP
for a in {v4}; do $IP route add $a/32 via 10.77.0.2; done
for a in {v6}; do $IP -6 route add $a/128 via fd77::2; done
{peer_env}={dir} nsenter -t $HOLD -n -- {test} > "${dir_var}/peer.out" 2>&1 &
i=0
while [ ! -e "${dir_var}/peer-ready" ]; do
  if [ -e "${dir_var}/peer-failed" ] || [ $i -gt 1000 ]; then echo "the peer did not start" >&2; exit 3; fi
  i=$((i + 1)); sleep 0.01
done
{as_user}{test}
"#,
        v4 = v4.join(" "),
        v6 = v6.join(" "),
        peer_env = PEER_VAR,
        dir_var = DIR_VAR,
    )
}

/// `text` quoted for `sh`.
fn shell_quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', r"'\''"))
}
