//! Connections handed over: under the guard an allowed connection is a socket of the host's
//! namespace, connected by the host to the decided address and put in place of the run's, so the
//! kernel carries its bytes. These tests pin that it really is (the run sees its real peer, its
//! options and blocking mode, its bytes counted) and that such a socket can do nothing but carry that
//! connection, whatever the code tries: reconnecting it, disconnecting it, binding or listening on
//! it, Fast Open, source routing, device binding, upper-layer protocols, io_uring, another
//! architecture's system calls, a race on the address, and reading the host's interfaces through it.
//! Every server listens on loopback; a refusal is proven by a server that saw nothing. Each runs for
//! one-shot runs, session cells and forked runs, as root and, in CI, as an unprivileged user.

#![allow(clippy::unwrap_used)] // a test fails loudly where it unwraps

use std::io::{Read, Write};
use std::time::Duration;

use runpython_core::{Envelope, Network, NetworkPolicy, RunPython, Sandbox, Status};
use runpython_tests::ways::{CountingServer, Way};
use serde_json::json;

/// A loopback server that echoes what each connection sends, counting connections.
fn echo() -> CountingServer {
    CountingServer::start(|mut stream| {
        let _ = stream.set_read_timeout(Some(Duration::from_secs(20)));
        let mut buf = [0u8; 65536];
        while let Ok(n) = stream.read(&mut buf) {
            if n == 0 || stream.write_all(&buf[..n]).is_err() {
                break;
            }
        }
    })
    .unwrap()
}

fn engine(allowed: u16, way: Way) -> RunPython {
    engine_with(allowed, way, Sandbox::default())
}

fn engine_with(allowed: u16, way: Way, sandbox: Sandbox) -> RunPython {
    let network = Network::Policy(NetworkPolicy {
        allow: vec![format!("127.0.0.1:{allowed}").parse().unwrap()],
        ..NetworkPolicy::default()
    });
    way.serve(
        RunPython::builder()
            .timeout(Duration::from_secs(60))
            .sandbox(sandbox)
            .network(network),
    )
    .build()
    .unwrap()
}

async fn run(engine: &RunPython, way: Way, code: &str) -> Envelope {
    let e = way.run(engine, code).await.unwrap();
    assert_eq!(
        e.status,
        Status::Success,
        "{way:?}: {:?} {}",
        e.error,
        e.stderr
    );
    e
}

/// Whether connections are handed over here: a policy is enforced and the guard is in force
/// (Landlock with its network rights, ABI 4+).
fn handed_over_here() -> bool {
    let report = engine(1, Way::Fresh).isolation_report().unwrap();
    let abi: i32 = report
        .landlock
        .strip_prefix("abi-")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    if report.network != "allowlist" || abi < 4 {
        eprintln!("skipped: no guarded network policy here: {report:?}");
        return false;
    }
    true
}

/// The host's own interface names other than the loopback's.
fn host_interfaces() -> Vec<String> {
    std::fs::read_dir("/sys/class/net")
        .map(|dir| {
            dir.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n != "lo")
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread")]
async fn an_allowed_connection_is_the_kernels_own_with_its_peer_options_and_counts() {
    if !handed_over_here() {
        return;
    }
    let echo = echo();
    let code = format!(
        r#"
import asyncio, os, socket
s = socket.socket()
s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
s.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
s.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, 77)
s.set_inheritable(True)
s.connect(("127.0.0.1", {port}))
s.sendall(b"x" * 100000)
got = 0
while got < 100000:
    got += len(s.recv(65536))
seen = dict(
    peer=list(s.getpeername()),
    nodelay=s.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY),
    keepalive=s.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE),
    keepidle=s.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE),
    blocking=s.getblocking(),
    inheritable=s.get_inheritable(),
    fd_kept=s.fileno() > 2,
)
s.close()
# Python's timeouts make a non-blocking socket; asyncio's connect does too.
t = socket.create_connection(("127.0.0.1", {port}), timeout=10)
seen["timeout"] = t.gettimeout()
seen["timeout_inheritable"] = t.get_inheritable()
t.sendall(b"y" * 1000)
assert t.recv(1000)
t.close()
async def main():
    r, w = await asyncio.open_connection("127.0.0.1", {port})
    w.write(b"z" * 500)
    await w.drain()
    data = await r.readexactly(500)
    peer = w.get_extra_info("peername")
    w.close()
    await w.wait_closed()
    return list(peer), len(data)
seen["asyncio"] = asyncio.run(main())
seen
"#,
        port = echo.port
    );
    for way in Way::ALL {
        let e = run(&engine(echo.port, way), way, &code).await;
        let v = &e.return_value;
        assert_eq!(v["peer"], json!(["127.0.0.1", echo.port]), "{way:?}: {v}");
        assert_eq!(
            v["asyncio"],
            json!([["127.0.0.1", echo.port], 500]),
            "{way:?}"
        );
        assert_eq!(v["nodelay"], json!(1), "{way:?}");
        assert_eq!(v["keepalive"], json!(1), "{way:?}");
        assert_eq!(v["keepidle"], json!(77), "{way:?}");
        assert_eq!(v["blocking"], json!(true), "{way:?}");
        assert_eq!(v["inheritable"], json!(true), "{way:?}");
        assert_eq!(v["timeout"], json!(10.0), "{way:?}");
        assert_eq!(v["timeout_inheritable"], json!(false), "{way:?}");
        let network = e.network.as_ref().unwrap();
        assert_eq!(network.connections, 3, "{way:?}: {network:?}");
        // Counted by the kernel: the data each way (and, received, the echo's closing FIN).
        assert_eq!(network.bytes_out, 101_500, "{way:?}: {network:?}");
        assert!(
            (101_500..=101_503).contains(&network.bytes_in),
            "{way:?}: {network:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_handed_socket_carries_its_connection_and_nothing_else() {
    if !handed_over_here() {
        return;
    }
    let (allowed, other) = (echo(), echo());
    let code = format!(
        r#"
import array, ctypes, errno, fcntl, socket, struct
libc = ctypes.CDLL(None, use_errno=True)
def err(f):
    try:
        f()
        return "ok"
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e.errno))
def raw_connect(fd, sa):
    r = libc.connect(fd, ctypes.create_string_buffer(sa), len(sa))
    return "ok" if r == 0 else errno.errorcode[ctypes.get_errno()]
s = socket.create_connection(("127.0.0.1", {allowed}), timeout=10)
out = {{"peer": list(s.getpeername())}}
out["reconnect"] = err(lambda: s.connect(("127.0.0.1", {other})))
out["unspec"] = raw_connect(s.fileno(), struct.pack("H14x", 0))
out["bind"] = err(lambda: s.bind(("0.0.0.0", 0)))
out["listen"] = err(lambda: s.listen())
# Loose source routing through another address, a device, an upper-layer protocol.
out["ip_options"] = err(lambda: s.setsockopt(socket.IPPROTO_IP, socket.IP_OPTIONS, bytes([1, 131, 7, 4, 127, 0, 0, 1])))
out["bindtodevice"] = err(lambda: s.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, b"lo"))
out["ulp"] = err(lambda: s.setsockopt(socket.IPPROTO_TCP, 31, b"tls"))
s6 = socket.socket(socket.AF_INET6)
out["rthdr"] = err(lambda: s6.setsockopt(socket.IPPROTO_IPV6, 57, bytes(8)))
f = socket.socket()
out["fastopen"] = err(lambda: f.sendto(b"x", socket.MSG_FASTOPEN, ("127.0.0.1", {other})))
r = libc.syscall(425, 8, ctypes.create_string_buffer(120))  # io_uring_setup
out["io_uring"] = errno.errorcode.get(ctypes.get_errno()) if r < 0 else "ok"
# The interfaces, asked through the handed socket: the run's own namespace answers.
buf = array.array("B", bytes(4096))
n = struct.unpack("iL", fcntl.ioctl(s.fileno(), 0x8912, struct.pack("iL", 4096, buf.buffer_info()[0])))[0]
out["interfaces"] = [buf[i:i + 16].tobytes().split(b"\0", 1)[0].decode() for i in range(0, n, 40)]
def index(name):
    try:
        return struct.unpack("16si20x", fcntl.ioctl(s.fileno(), 0x8933, struct.pack("16si20x", name.encode(), 0)))[1]
    except OSError as e:
        return errno.errorcode[e.errno]
out["host_interfaces"] = {{name: index(name) for name in {host_interfaces}}}
out["lo"] = index("lo")
out["set_address"] = err(lambda: fcntl.ioctl(s.fileno(), 0x8916, struct.pack("16sHH4s16x", b"lo", 2, 0, bytes([10, 0, 0, 9]))))
s.sendall(b"still here")
out["echo"] = s.recv(100).decode()
s.close()
out
"#,
        allowed = allowed.port,
        other = other.port,
        host_interfaces = serde_json::to_string(&host_interfaces()).unwrap(),
    );
    for way in Way::ALL {
        let e = run(&engine(allowed.port, way), way, &code).await;
        let v = &e.return_value;
        assert_eq!(
            v["peer"],
            json!(["127.0.0.1", allowed.port]),
            "{way:?}: {v}"
        );
        for (what, expected) in [
            ("reconnect", "EISCONN"),
            ("unspec", "ENOTSUP"), // EOPNOTSUPP, as Python names it
            ("bind", "EINVAL"),
            ("listen", "EINVAL"),
            ("ip_options", "EPERM"),
            ("bindtodevice", "EPERM"),
            ("ulp", "EPERM"),
            ("rthdr", "EPERM"),
            ("fastopen", "ENOTSUP"),
            ("io_uring", "EPERM"),
            ("set_address", "EPERM"),
        ] {
            assert_eq!(v[what], json!(expected), "{way:?} {what}: {v}");
        }
        assert_eq!(v["interfaces"], json!(["lo"]), "{way:?}: {v}");
        assert_eq!(v["lo"], json!(1), "{way:?}: {v}");
        for (name, index) in v["host_interfaces"].as_object().unwrap() {
            assert_eq!(
                index,
                &json!("ENODEV"),
                "{way:?}: the host's {name} was seen"
            );
        }
        assert_eq!(v["echo"], json!("still here"), "{way:?}");
    }
    assert_eq!(other.seen(), 0, "a handed socket reached another server");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_address_changed_while_the_host_reads_it_reaches_nothing() {
    if !handed_over_here() {
        return;
    }
    let (allowed, other) = (echo(), echo());
    // Two threads flip one address between a Unix path (the kernel's own connect) and the other
    // server's (or `AF_UNSPEC`), while two more connect with it over and over, on fresh sockets and
    // on a socket the host handed over (swapped into the descriptor meanwhile): whatever the host
    // read, what the kernel reads later must not reach the other server. (A handed socket may end
    // up disconnected by such a race, which harms nothing: it can then reach nothing at all.)
    let code = format!(
        r#"
import ctypes, os, socket, struct, threading, time
libc = ctypes.CDLL(None, use_errno=True)
inet = struct.pack("!HH4s8x", 0, {other}, bytes([127, 0, 0, 1]))
inet = struct.pack("H", socket.AF_INET) + inet[2:]
unix = struct.pack("H", socket.AF_UNIX) + b"/tmp/nothing-here".ljust(108, b"\0")
unspec = struct.pack("H", 0) + bytes(14)
buf = ctypes.create_string_buffer(len(unix))
stop = time.monotonic() + 2
handed = socket.create_connection(("127.0.0.1", {allowed}), timeout=10)
def flip(forms):
    while time.monotonic() < stop:
        for form in forms:
            ctypes.memmove(buf, form, len(form))
def connect(kind):
    n = 0
    while time.monotonic() < stop:
        s = socket.socket(socket.AF_INET, kind)
        os.dup2(handed.fileno(), s.fileno()) if n % 3 == 0 else None
        libc.connect(s.fileno(), buf, 16)
        s.close()
        n += 1
threads = [threading.Thread(target=flip, args=([unix, inet],)),
           threading.Thread(target=flip, args=([unspec, inet, unix],)),
           threading.Thread(target=connect, args=(socket.SOCK_STREAM,)),
           threading.Thread(target=connect, args=(socket.SOCK_DGRAM,))]
for t in threads: t.start()
for t in threads: t.join()
"done"
"#,
        allowed = allowed.port,
        other = other.port,
    );
    for way in Way::ALL {
        let e = run(&engine(allowed.port, way), way, &code).await;
        assert_eq!(e.return_value, json!("done"), "{way:?}: {}", e.stderr);
    }
    assert_eq!(other.seen(), 0, "a raced connect reached another server");
}

#[cfg(target_arch = "x86_64")]
#[tokio::test(flavor = "multi_thread")]
async fn another_architectures_connect_kills_the_process() {
    if !handed_over_here() {
        return;
    }
    let (allowed, other) = (echo(), echo());
    // socketcall(SYS_CONNECT, [fd, addr, len]) through the i386 entry (`int 0x80`), pointers below
    // 4 GiB: the notifier's filter sees another architecture and kills the process.
    let code = format!(
        r#"
import subprocess, sys
child = r'''
import ctypes, mmap, socket, struct
s = socket.socket()
page = mmap.mmap(-1, 4096, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | 0x40,
                 prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
base = ctypes.addressof(ctypes.c_char.from_buffer(page))
addr = struct.pack("H", socket.AF_INET) + struct.pack("!H4s8x", {other}, bytes([127, 0, 0, 1]))
args = struct.pack("III", s.fileno(), base + 256, len(addr))
code = (b"\x53" + b"\xb8\x66\x00\x00\x00" + b"\xbb\x03\x00\x00\x00"
        + b"\xb9" + struct.pack("I", base + 512) + b"\xcd\x80" + b"\x5b\xc3")
page[0:len(code)] = code
page[256:256 + len(addr)] = addr
page[512:512 + len(args)] = args
print(ctypes.CFUNCTYPE(ctypes.c_long)(base)())
'''
done = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True)
[done.returncode, done.stdout]
"#,
        other = other.port,
    );
    for way in Way::ALL {
        let e = run(&engine(allowed.port, way), way, &code).await;
        // Killed before the call returned: SIGSYS (31), or SIGSEGV (11) where the kernel has no i386
        // entry at all.
        assert!(
            [json!([-31, ""]), json!([-11, ""])].contains(&e.return_value),
            "{way:?}: {} {}",
            e.return_value,
            e.stderr
        );
    }
    assert_eq!(other.seen(), 0, "an i386 connect reached another server");
}

#[tokio::test(flavor = "multi_thread")]
async fn closed_handed_connections_free_their_places() {
    if !handed_over_here() {
        return;
    }
    let echo = echo();
    // More than a run may hold at once (256), one after another: each closed one frees its place.
    let code = format!(
        r#"
import socket
for i in range(300):
    s = socket.create_connection(("127.0.0.1", {port}), timeout=10)
    s.sendall(b"abc")
    assert s.recv(3) == b"abc"
    s.close()
"done"
"#,
        port = echo.port
    );
    for way in [Way::Fresh, Way::Cell] {
        let e = run(&engine(echo.port, way), way, &code).await;
        assert_eq!(e.return_value, json!("done"), "{way:?}");
        let network = e.network.as_ref().unwrap();
        assert_eq!(network.connections, 300, "{way:?}: {network:?}");
        assert_eq!(network.bytes_out, 900, "{way:?}: {network:?}");
        assert_eq!(network.refusals, 0, "{way:?}: {network:?}");
    }
}

/// Without the guard (here Landlock turned off; a kernel older than Landlock's network rights is the
/// same) nothing of the host's is handed over: the relay joins an allowed connection, the run's own
/// servers are the kernel's own calls, and what is not allowed is still refused.
#[tokio::test(flavor = "multi_thread")]
async fn without_the_guard_connections_are_relayed_and_reach_only_what_is_allowed() {
    if !handed_over_here() {
        return;
    }
    let (allowed, other) = (echo(), echo());
    let code = format!(
        r#"
import socket, threading
s = socket.create_connection(("127.0.0.1", {allowed}), timeout=10)
s.sendall(b"x" * 5000)
got = 0
while got < 5000:
    got += len(s.recv(65536))
peer = list(s.getpeername())
s.close()
server = socket.socket()
server.bind(("127.0.0.1", 0))
server.listen()
port = server.getsockname()[1]
def serve():
    c, _ = server.accept()
    c.sendall(c.recv(10))
    c.close()
threading.Thread(target=serve).start()
own = socket.create_connection(("127.0.0.1", port), timeout=10)
own.sendall(b"own")
echoed = own.recv(10).decode()
try:
    socket.create_connection(("127.0.0.1", {other}), timeout=10)
    refused = None
except PermissionError as e:
    refused = "refused"
[peer, echoed, refused]
"#,
        allowed = allowed.port,
        other = other.port,
    );
    let unguarded = Sandbox {
        landlock: false,
        ..Sandbox::default()
    };
    for way in Way::ALL {
        let e = run(
            &engine_with(allowed.port, way, unguarded.clone()),
            way,
            &code,
        )
        .await;
        assert_eq!(
            e.return_value,
            json!([["127.0.0.1", 1], "own", "refused"]),
            "{way:?}: {}",
            e.stderr
        );
        let network = e.network.as_ref().unwrap();
        assert_eq!(network.bytes_out, 5000, "{way:?}: {network:?}");
        assert_eq!(network.bytes_in, 5000, "{way:?}: {network:?}");
    }
    assert_eq!(other.seen(), 0, "an unguarded run reached another server");
}
