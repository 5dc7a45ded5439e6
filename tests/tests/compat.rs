//! A run's own loopback and terminals (issue 38): what CPython's regression suite needed that a
//! default run lacked. Every run has `lo` up with `127.0.0.1` and `::1`, whatever its network mode,
//! and a devpts instance of its own; neither reaches anything of the host. Each check runs in a run
//! of its own, a session cell and a run forked from a template (where runs can be forked here), as
//! root and, in CI, as an unprivileged user. Every host server here listens on loopback; a refusal is
//! proven by a server that saw nothing.

#![allow(clippy::unwrap_used)] // a test fails loudly where it unwraps

use std::os::unix::fs::MetadataExt;
use std::time::Duration;

use runpython_core::{Envelope, Network, NetworkPolicy, RunPython, Status};
use runpython_tests::ways::{CountingServer, Way};
use serde_json::{json, Value};

fn engine(network: Network, way: Way) -> RunPython {
    way.serve(
        RunPython::builder()
            .timeout(Duration::from_secs(60))
            .network(network),
    )
    .build()
    .unwrap()
}

/// Whether runs can be forked from a template here (prints why not: the forked checks then pass
/// without asserting).
fn forkable() -> bool {
    let report = engine(Network::Off, Way::Forked)
        .isolation_report()
        .unwrap();
    if report.start != "template" {
        eprintln!("note: runs cannot be forked here: {:?}", report.missing);
    }
    report.start == "template"
}

async fn run(engine: &RunPython, way: Way, code: &str) -> Envelope {
    let e = way.run(engine, code).await.unwrap();
    assert_eq!(
        e.status,
        Status::Success,
        "{way:?}: {:?}\n{}",
        e.error,
        e.stderr
    );
    if way == Way::Forked {
        assert_eq!(e.isolation.as_ref().unwrap().start, "template", "{way:?}");
    }
    e
}

/// `code`'s value in every way a run is served (forked only where it can be).
async fn everywhere(network: Network, code: &str) -> Vec<(Way, Value)> {
    let mut seen = Vec::new();
    for way in Way::ALL {
        if way == Way::Forked && !forkable() {
            continue;
        }
        let e = run(&engine(network.clone(), way), way, code).await;
        seen.push((way, e.return_value));
    }
    seen
}

const HTTP_SERVER: &str = r#"import http.server, socket, threading, urllib.request

class Six(http.server.ThreadingHTTPServer):
    address_family = socket.AF_INET6

class Hello(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = ("hello " + self.path).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass

def fetch(server_class, host):
    server = server_class((host, 0), Hello)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    url = "http://%s:%d/x" % ("[%s]" % host if ":" in host else host, port)
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.read().decode()
    finally:
        server.shutdown()
        server.server_close()

[fetch(http.server.ThreadingHTTPServer, "127.0.0.1"), fetch(Six, "::1"), fetch(http.server.ThreadingHTTPServer, "localhost")]"#;

#[tokio::test(flavor = "multi_thread")]
async fn a_threaded_http_server_on_its_own_loopback_serves_the_run_over_ipv4_and_ipv6() {
    for (way, value) in everywhere(Network::Off, HTTP_SERVER).await {
        assert_eq!(
            value,
            json!(["hello /x", "hello /x", "hello /x"]),
            "{way:?}"
        );
    }
}

const ASYNCIO_ECHO: &str = r#"import asyncio

async def main():
    async def echo(reader, writer):
        writer.write((await reader.readline()).upper())
        await writer.drain()
        writer.close()

    answers = []
    for host in ("127.0.0.1", "::1"):
        server = await asyncio.start_server(echo, host, 0)
        port = server.sockets[0].getsockname()[1]
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(b"ping\n")
        await writer.drain()
        answers.append((await reader.readline()).decode())
        writer.close()
        server.close()
        await server.wait_closed()
    return answers

asyncio.run(main())"#;

#[tokio::test(flavor = "multi_thread")]
async fn an_asyncio_server_and_client_talk_over_the_runs_loopback() {
    for (way, value) in everywhere(Network::Off, ASYNCIO_ECHO).await {
        assert_eq!(value, json!(["PING\n", "PING\n"]), "{way:?}");
    }
}

const TERMINAL: &str = r#"import os, pty, sys, termios, tty

master, slave = pty.openpty()
tty.setraw(slave)  # no echo, no line discipline: what goes in comes out
raw = not termios.tcgetattr(slave)[3] & termios.ECHO
os.write(master, b"through the pty\n")
line = os.read(slave, 100)
os.write(slave, b"back\n")
back = os.read(master, 100)
name = os.ttyname(slave)
m2, s2 = os.openpty()
os.close(m2); os.close(s2)
pid, fd = pty.fork()
if pid == 0:
    os.write(1, b"child on its terminal: %d\n" % os.isatty(0))
    os._exit(0)
out = b""
while True:
    try:
        chunk = os.read(fd, 100)
    except OSError:
        break
    if not chunk:
        break
    out += chunk
os.waitpid(pid, 0)
[line.decode(), back.decode().strip(), name.startswith("/dev/pts/"), raw, out.decode().strip()]"#;

#[tokio::test(flavor = "multi_thread")]
async fn pty_openpty_round_trips_bytes_and_a_forked_child_gets_its_own_terminal() {
    for (way, value) in everywhere(Network::Off, TERMINAL).await {
        assert_eq!(
            value,
            json!([
                "through the pty\n",
                "back",
                true,
                true,
                "child on its terminal: 1"
            ]),
            "{way:?}"
        );
    }
}

const NAMES_AND_PATH: &str = r#"import os, socket
[socket.gethostname(), socket.gethostbyname(socket.gethostname()), socket.getaddrinfo("localhost", 80, socket.AF_INET6)[0][4][0], os.environ["PATH"]]"#;

#[tokio::test(flavor = "multi_thread")]
async fn the_runs_name_is_its_own_loopback_and_its_path_is_the_systems() {
    for (way, value) in everywhere(Network::Off, NAMES_AND_PATH).await {
        assert_eq!(
            value,
            json!([
                "runpython",
                "127.0.0.1",
                "::1",
                "/usr/local/bin:/usr/bin:/bin"
            ]),
            "{way:?}"
        );
    }
}

fn reach_host(port: u16) -> String {
    format!(
        r#"import socket
def attempt(host):
    try:
        socket.create_connection((host, {port}), timeout=3).close()
        return "connected"
    except OSError as e:
        return type(e).__name__
own = socket.socket()
own.bind(("127.0.0.1", 0))
own.listen()
mine = socket.create_connection(own.getsockname(), timeout=3)
[attempt("127.0.0.1"), attempt("localhost"), attempt("::1"), mine.getpeername()[0]]"#
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn the_hosts_loopback_is_out_of_reach_from_the_runs_own_whatever_the_network_mode() {
    let host = CountingServer::start(drop).unwrap();
    let port = host.port;
    let public = Network::Policy(NetworkPolicy::public_internet());
    let report = engine(public.clone(), Way::Fresh)
        .isolation_report()
        .unwrap();
    let mut modes = vec![("off", Network::Off)];
    if report.network == "public" {
        modes.push(("public", public));
    } else {
        eprintln!("note: no network policy here: {:?}", report.missing);
    }
    for (mode, network) in modes {
        for (way, value) in everywhere(network, &reach_host(port)).await {
            let [v4, name, v6, own] = value.as_array().unwrap().as_slice() else {
                panic!("{value}");
            };
            // Nothing listens on the port in the run's own namespace; under a policy the host's
            // loopback is refused as a non-public address.
            for (what, got) in [("127.0.0.1", v4), ("localhost", name), ("::1", v6)] {
                assert_ne!(got, "connected", "{mode} {way:?}: {what}");
            }
            assert_eq!(own, "127.0.0.1", "{mode} {way:?}: its own loopback works");
        }
    }
    assert_eq!(host.seen(), 0, "a run reached the host's loopback");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_runs_terminals_are_a_devpts_of_its_own_and_no_terminal_is_typed_into() {
    // A terminal of the host's, open while the runs look for it (opening ptmx makes its pts node).
    let _host_pty = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/ptmx")
        .unwrap();
    let host_name = std::fs::read_dir("/dev/pts")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .find(|n| n.parse::<u32>().is_ok())
        .map(|n| format!("/dev/pts/{n}"))
        .unwrap();
    let host_pts = std::fs::metadata("/dev/pts").unwrap().dev();
    let code = format!(
        r#"import errno, fcntl, os, termios
def tries(f):
    try:
        f()
        return "done"
    except OSError as e:
        return errno.errorcode[e.errno]
listed = sorted(os.listdir("/dev/pts"))
host = tries(lambda: os.open({host:?}, os.O_RDWR | os.O_NOCTTY))
made = tries(lambda: open("/dev/pts/planted", "w"))
master, slave = os.openpty()
# Its own pty as its controlling terminal, in a child of a session of its own: still no TIOCSTI.
pid = os.fork()
if pid == 0:
    os.setsid()
    fcntl.ioctl(slave, termios.TIOCSCTTY, 0)
    os._exit({{"done": 0}}.get(tries(lambda: fcntl.ioctl(slave, termios.TIOCSTI, b"x")), 1))
status = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
# Another line discipline (N_NULL, 27: built in here): refused like TIOCSTI.
discipline = tries(lambda: fcntl.ioctl(slave, termios.TIOCSETD, (27).to_bytes(4, "little")))
# Its devpts holds a bounded number of ptys: the kernel's are shared by every run.
held = []
while len(held) < 1000:
    try:
        held.append(os.openpty())
    except OSError as e:
        full = errno.errorcode[e.errno]
        break
else:
    full = "never"
count = len(held) + 1
[listed, host, made, status, os.stat("/dev/pts").st_dev, os.getsid(0) == os.getpid(), tries(lambda: open("/dev/tty")), discipline, count, full]"#,
        host = host_name
    );
    for (way, value) in everywhere(Network::Off, &code).await {
        let v = value.as_array().unwrap();
        assert_eq!(v[0], json!(["ptmx"]), "{way:?}: only its own devpts' ptmx");
        assert_eq!(
            v[1], "ENOENT",
            "{way:?}: the host's pty is not in the run's devpts"
        );
        assert!(
            v[2] == "EACCES" || v[2] == "EPERM",
            "{way:?}: nothing is made in /dev/pts: {}",
            v[2]
        );
        assert_eq!(
            v[3], 1,
            "{way:?}: TIOCSTI is refused even on its own terminal"
        );
        assert_ne!(
            v[4],
            json!(host_pts),
            "{way:?}: its /dev/pts is not the host's"
        );
        // A run is a session of its own: the host's terminal is never its controlling one.
        assert_eq!(v[5], true, "{way:?}");
        assert!(v[6] != "done", "{way:?}: /dev/tty opened: {}", v[6]);
        assert_eq!(v[7], "EPERM", "{way:?}: TIOCSETD");
        assert_eq!(v[8], 128, "{way:?}: ptys a run may hold ({})", v[9]);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn two_live_runs_have_two_devpts_instances() {
    let engine = engine(Network::Off, Way::Fresh);
    let a = engine.session();
    let b = engine.session();
    let dev = "import os\nos.stat('/dev/pts').st_dev";
    let da = run_cell(&a, dev).await;
    let db = run_cell(&b, dev).await;
    assert_ne!(da, db, "two sessions share a devpts");
    // A pty one session opened is not in the other's devpts.
    let opened = run_cell(
        &a,
        "import os\nkeep = os.openpty()\nsorted(os.listdir('/dev/pts'))",
    )
    .await;
    assert_eq!(opened, json!(["0", "ptmx"]));
    let other = run_cell(&b, "import os\nsorted(os.listdir('/dev/pts'))").await;
    assert_eq!(other, json!(["ptmx"]));
}

async fn run_cell(session: &runpython_core::Session, code: &str) -> Value {
    let e = session.run(code).await.unwrap();
    assert_eq!(e.status, Status::Success, "{:?}", e.error);
    e.return_value
}
