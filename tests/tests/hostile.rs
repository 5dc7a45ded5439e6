//! Hostile code against the sandbox: one test per attack, each named for the behaviour it pins. A test
//! that needs a kernel feature the machine lacks prints why and passes without asserting.

#![allow(clippy::unwrap_used)] // a test fails loudly where it unwraps

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use runpython_core::{Isolation, RunPython, Sandbox, Status};
use runpython_tests::{hostile_code, processes_with_marker, survivors_after, unique_marker};
use serde_json::json;

fn builder() -> runpython_core::RunPythonBuilder {
    RunPython::builder().timeout(Duration::from_secs(30))
}

/// Whether the seccomp deny-list is in force here; prints why not.
fn seccomp_in_force() -> bool {
    let report = isolation();
    if report.seccomp != "deny-list" {
        eprintln!(
            "skipped: seccomp is not in force here: {:?}",
            report.missing
        );
        return false;
    }
    true
}

fn isolation() -> Isolation {
    builder().build().unwrap().isolation_report().unwrap()
}

/// True when `layer` (a namespace name, `landlock`, or `processes`) is in force; prints why not.
fn has(layer: &str) -> bool {
    let report = isolation();
    let ok = match layer {
        "landlock" => report.landlock.starts_with("abi-"),
        "processes" => report.rlimits.processes.is_some(),
        ns => report.namespaces.iter().any(|n| n == ns),
    };
    if !ok {
        eprintln!(
            "skipped: the {layer} layer is not available here: {:?}",
            report.missing
        );
    }
    ok
}

fn wait_for_markers(marker: &str, count: usize) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while processes_with_marker(marker).len() < count {
        assert!(
            std::time::Instant::now() < deadline,
            "the hostile processes never started"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn timeout_kills_setsid_double_forked_and_signal_ignoring_processes() {
    let marker = unique_marker("hostile-timeout");
    let python = builder().timeout(Duration::from_secs(3)).build().unwrap();
    let e = python.run(hostile_code(&marker)).await.unwrap();
    assert_eq!(e.status, Status::Timeout);
    assert_eq!(e.stdout, "ready\n");
    assert_eq!(survivors_after(&marker, 3.0), Vec::<u32>::new());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_finished_run_leaves_no_double_forked_daemon() {
    if !has("pid") {
        return;
    }
    let marker = unique_marker("hostile-daemon");
    let code = format!(
        "import os\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n        os.execvp('sleep', ['{marker}', '300'])\n    os._exit(0)\nos.wait()\n'done'"
    );
    let e = builder().build().unwrap().run(code).await.unwrap();
    assert_eq!(e.return_value, json!("done"));
    assert_eq!(survivors_after(&marker, 3.0), Vec::<u32>::new());
}

fn host_killed_by(signal: i32, tag: &str) {
    let marker = unique_marker(tag);
    let mut host = Command::new(env!("CARGO_BIN_EXE_runpython-host"))
        .arg(&marker)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(host.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line, "ready\n");
    wait_for_markers(&marker, 3);
    // SAFETY: kill on the pid of the host this test started.
    assert_eq!(unsafe { libc_kill(host.id() as i32, signal) }, 0);
    let _ = host.wait();
    assert_eq!(survivors_after(&marker, 5.0), Vec::<u32>::new());
}

unsafe fn libc_kill(pid: i32, signal: i32) -> i32 {
    extern "C" {
        fn kill(pid: i32, sig: i32) -> i32;
    }
    // SAFETY: the caller passes a pid it owns.
    unsafe { kill(pid, signal) }
}

#[test]
fn host_killed_with_sigint_leaves_no_survivor() {
    host_killed_by(2, "host-int");
}

#[test]
fn host_killed_with_sigterm_leaves_no_survivor() {
    host_killed_by(15, "host-term");
}

#[test]
fn host_killed_with_sigkill_leaves_no_survivor() {
    host_killed_by(9, "host-kill");
}

#[tokio::test(flavor = "multi_thread")]
async fn memory_bomb_is_a_memory_error() {
    let python = builder()
        .sandbox(Sandbox {
            memory_bytes: 1 << 30,
            ..Sandbox::default()
        })
        .build()
        .unwrap();
    let e = python
        .run("chunks = []\nwhile True:\n    chunks.append(bytearray(64 << 20))")
        .await
        .unwrap();
    assert_eq!(e.error.unwrap().kind, "MemoryError");
    let e = python.run("bytearray(8 << 30)").await.unwrap();
    assert_eq!(e.error.unwrap().kind, "MemoryError");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_file_over_the_size_limit_cannot_be_written() {
    let python = builder()
        .sandbox(Sandbox {
            file_size_bytes: 1 << 20,
            ..Sandbox::default()
        })
        .build()
        .unwrap();
    let e = python
        .run("with open('big', 'wb') as f:\n    f.write(b'x' * (2 << 20))")
        .await
        .unwrap();
    let err = e.error.unwrap();
    assert_eq!(err.kind, "OSError", "{}", err.message);
    assert!(err.message.contains("File too large"), "{}", err.message);
    let e = python
        .run("with open('/tmp/big', 'wb') as f:\n    f.write(b'x' * (512 << 10))\n'ok'")
        .await
        .unwrap();
    assert_eq!(e.return_value, json!("ok"), "{:?}", e.error);
}

#[tokio::test(flavor = "multi_thread")]
async fn the_host_environment_cannot_be_read_through_proc() {
    // SAFETY of set_var: only this test reads or writes this name.
    std::env::set_var("RUNPYTHON_T_HOSTILE_SECRET", "s3cr3t-value");
    let code = "import os\nfound = []\nfor pid in os.listdir('/proc'):\n    try:\n        if b's3cr3t-value' in open(f'/proc/{pid}/environ', 'rb').read():\n            found.append(pid)\n    except OSError:\n        pass\nfound";
    let e = builder().build().unwrap().run(code).await.unwrap();
    assert_eq!(e.return_value, json!([]), "{:?}", e.error);
    if has("pid") {
        let host_pid = std::process::id().to_string();
        let e = builder()
            .build()
            .unwrap()
            .run(format!(
                "import os\nos.path.exists('/proc/{host_pid}/environ')"
            ))
            .await
            .unwrap();
        assert_eq!(e.return_value, json!(false), "the host's pid is visible");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn writes_outside_the_run_directory_do_not_reach_the_host() {
    let marker = unique_marker("write");
    let home = std::env::var("HOME").unwrap();
    let host_tmp = std::path::Path::new("/tmp").join(&marker);
    let host_home = std::path::Path::new(&home).join(&marker);
    let code = format!(
        "import os\nresult = {{}}\nfor p in ['/tmp/{marker}', '{home}/{marker}', '/var/tmp/{marker}']:\n    try:\n        open(p, 'w').write('x')\n        result[p] = 'written'\n    except OSError as e:\n        result[p] = type(e).__name__\nresult"
    );
    let e = builder().build().unwrap().run(code).await.unwrap();
    assert!(!host_tmp.exists(), "the code wrote to the host's /tmp");
    assert!(!host_home.exists(), "the code wrote to $HOME");
    // A $HOME under /tmp is inside the run's private /tmp: writing there is allowed and stays there.
    // Elsewhere the write fails: outside the view (no such directory), read-only in it, or refused by
    // Landlock.
    if has("landlock") && !home.starts_with("/tmp") {
        for path in [format!("{home}/{marker}"), format!("/var/tmp/{marker}")] {
            let outcome = e.return_value[&path]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            assert!(
                ["PermissionError", "FileNotFoundError", "OSError"].contains(&outcome.as_str()),
                "{path}: {outcome}"
            );
        }
    }
    let _ = std::fs::remove_file(&host_tmp);
    let _ = std::fs::remove_file(&host_home);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_file_in_home_cannot_be_read() {
    if !has("landlock") && !has("mount") {
        return;
    }
    let home = std::path::PathBuf::from(std::env::var("HOME").unwrap());
    let secret = home.join(format!(".runpython-t-secret-{}", std::process::id()));
    std::fs::write(&secret, "top secret").unwrap();
    let code = format!(
        "def attempt():\n    try:\n        return open({:?}).read()\n    except OSError as e:\n        return type(e).__name__\nattempt()",
        secret.display().to_string()
    );
    let e = builder().build().unwrap().run(code).await.unwrap();
    std::fs::remove_file(&secret).unwrap();
    assert!(
        matches!(
            e.return_value.as_str(),
            Some("PermissionError" | "FileNotFoundError")
        ),
        "{:?} {:?}",
        e.return_value,
        e.error
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_hosts_loopback_is_reachable_only_with_the_hosts_network() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let code = format!(
        "import socket\ndef attempt():\n    try:\n        socket.create_connection(('127.0.0.1', {port}), timeout=2).close()\n        return 'connected'\n    except OSError as e:\n        return type(e).__name__\nattempt()"
    );
    let shared = builder()
        .network(runpython_core::Network::Host)
        .build()
        .unwrap();
    let e = shared.run(code.as_str()).await.unwrap();
    assert_eq!(e.return_value, json!("connected"), "{:?}", e.error);
    assert_eq!(e.isolation.unwrap().network, "host");
    assert!(listener.accept().is_ok(), "the server saw no connection");
    if !has("net") {
        return;
    }
    // The public internet (--allow-network: the run's own loopback, where the run listens on
    // nothing, so the code meant the host's: refused with the rule) and no network at all (the run's
    // own loopback, up, where nothing listens).
    for (engine, mode, outcome) in [
        (
            builder().allow_network(true).build().unwrap(),
            "public",
            "PermissionError",
        ),
        (builder().build().unwrap(), "off", "ConnectionRefusedError"),
    ] {
        let e = engine.run(code.as_str()).await.unwrap();
        assert_eq!(e.return_value, json!(outcome), "{mode}: {:?}", e);
        assert_eq!(e.isolation.unwrap().network, mode);
        assert!(
            listener.accept().is_err(),
            "{mode}: the server saw a connection"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn sixteen_concurrent_runs_all_succeed() {
    let python = builder().build().unwrap();
    let runs = (0..16).map(|i| {
        let python = python.clone();
        tokio::spawn(async move { python.run(format!("import os\n({i}, os.getpid())")).await })
    });
    for (i, run) in runs.enumerate() {
        let e = run.await.unwrap().unwrap();
        assert_eq!(e.return_value[0], json!(i), "{:?}", e.error);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_envelope_reports_the_layers_in_force() {
    let e = builder().build().unwrap().run("1").await.unwrap();
    let isolation = e.isolation.unwrap();
    assert_eq!(isolation, isolation_with_uid(isolation.uid));
    let off = builder().sandbox(Sandbox::off()).build().unwrap();
    let e = off.run("1").await.unwrap();
    let isolation = e.isolation.unwrap();
    assert!(isolation.namespaces.is_empty());
    assert_eq!(isolation.landlock, "off");
    assert_eq!(isolation.kill, "process-group");
    assert_eq!(isolation.rlimits.processes, None);
}

fn isolation_with_uid(uid: u32) -> Isolation {
    Isolation { uid, ..isolation() }
}

#[tokio::test(flavor = "multi_thread")]
async fn requiring_isolation_refuses_to_run_without_it_or_runs_with_it() {
    // Fresh engines, several times: with templates, a fork made ahead of the first run races that
    // run, and a missing layer must be the run's error whichever comes first (not the template's).
    for _ in 0..6 {
        let python = builder()
            .sandbox(Sandbox {
                require: true,
                ..Sandbox::default()
            })
            .build()
            .unwrap();
        match python.run("1").await {
            Ok(e) => assert!(e.isolation.unwrap().missing.is_empty()),
            Err(err) => assert!(
                matches!(err, runpython_core::Error::IsolationUnavailable(_)),
                "{err:?}"
            ),
        }
    }
}

/// A fork bomb must end in an error for the code, never a stalled machine: the run's processes are
/// capped by `RLIMIT_NPROC` in its own user namespace (as root, under its own uid).
#[tokio::test(flavor = "multi_thread")]
async fn fork_bomb_ends_in_an_error_not_a_stalled_machine() {
    if !has("processes") {
        return;
    }
    let marker = unique_marker("forkbomb");
    let python = builder()
        .timeout(Duration::from_secs(15))
        .sandbox(Sandbox {
            processes: 64,
            ..Sandbox::default()
        })
        .build()
        .unwrap();
    let code = format!("import os\n# {marker}\nwhile True:\n    os.fork()");
    let started = std::time::Instant::now();
    let e = python.run(code).await.unwrap();
    assert_eq!(e.status, Status::Error, "{:?}", e.error);
    assert_eq!(e.error.unwrap().kind, "BlockingIOError");
    assert!(started.elapsed() < Duration::from_secs(15));
    assert_eq!(survivors_after(&marker, 3.0), Vec::<u32>::new());
}

/// Each run gets its own empty network namespace, even though they are made ahead of time: two
/// concurrent runs see different namespaces (neither the host's), and cannot reach each other
/// through it — not even over `NETLINK_USERSOCK`, which needs no privilege inside a shared one.
#[tokio::test(flavor = "multi_thread")]
async fn concurrent_runs_do_not_share_a_network_namespace() {
    if !has("net") {
        return;
    }
    let listen = "import os, socket, time\nns = os.readlink('/proc/self/ns/net')\ns = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 2)\ns.bind((4242, 0))\ns.settimeout(3)\ntry:\n    got = s.recv(100).hex()\nexcept OSError as e:\n    got = type(e).__name__\n[ns, got]";
    let send = "import os, socket, time\nns = os.readlink('/proc/self/ns/net')\ns = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 2)\nsent = 0\nfor _ in range(20):\n    try:\n        s.sendto((20).to_bytes(4, 'little') + bytes(12) + b'hiya', (4242, 0))\n        sent += 1\n    except OSError:\n        pass\n    time.sleep(0.1)\n[ns, sent]";
    let python = builder().build().unwrap();
    let (a, b) = tokio::join!(python.run(listen), python.run(send));
    let (a, b) = (a.unwrap(), b.unwrap());
    assert!(
        a.is_success() && b.is_success(),
        "{:?} {:?}",
        a.error,
        b.error
    );
    let host = std::fs::read_link("/proc/self/ns/net").unwrap();
    let (ns_a, ns_b) = (&a.return_value[0], &b.return_value[0]);
    assert_ne!(ns_a, ns_b, "two concurrent runs share a network namespace");
    assert_ne!(ns_a, &json!(host.to_string_lossy()));
    assert_eq!(
        a.return_value[1],
        json!("TimeoutError"),
        "a message crossed runs"
    );
}

/// The run's PID 1 holds a copy of the host's memory until the end: even without Landlock, the code
/// can read neither its memory nor its environment (it is not dumpable).
#[tokio::test(flavor = "multi_thread")]
async fn the_run_init_cannot_be_read_even_without_landlock() {
    if !has("pid") {
        return;
    }
    let python = builder()
        .sandbox(Sandbox {
            landlock: false,
            ..Sandbox::default()
        })
        .build()
        .unwrap();
    let code = "def attempt(path):\n    try:\n        with open(path, 'rb') as f:\n            f.read(16)\n        return 'read'\n    except OSError as e:\n        return type(e).__name__\n[attempt('/proc/1/environ'), attempt('/proc/1/mem'), attempt('/proc/1/maps')]";
    let e = python.run(code).await.unwrap();
    assert!(e.is_success(), "{:?}", e.error);
    for (i, v) in e.return_value.as_array().unwrap().iter().enumerate() {
        assert_ne!(v, &json!("read"), "/proc/1 file {i} was readable");
    }
}

/// The code holds no capability, not even in its own user namespace, and cannot get one by making
/// namespaces of its own: the kernel surface that namespace capabilities open (netfilter, mounts, ...)
/// stays out of its reach. Checked without Landlock too, which also refuses mounts.
#[tokio::test(flavor = "multi_thread")]
async fn the_code_holds_no_capability_and_cannot_make_namespaces() {
    if !has("user") {
        return;
    }
    let code = "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\ndef unshare(flag):\n    if libc.unshare(flag) == 0:\n        return 'made'\n    return os.strerror(ctypes.get_errno())\ncaps = [l.split()[1] for l in open('/proc/self/status') if l.startswith(('CapPrm', 'CapEff'))]\n[os.getuid(), caps, unshare(0x10000000), unshare(0x10000000 | 0x40000000), unshare(0x40000000), unshare(0x00020000)]";
    for landlock in [true, false] {
        let python = builder()
            .sandbox(Sandbox {
                landlock,
                ..Sandbox::default()
            })
            .build()
            .unwrap();
        let e = python.run(code).await.unwrap();
        assert!(e.is_success(), "{:?}", e.error);
        let got = e.return_value.as_array().unwrap();
        assert_ne!(got[0], json!(0), "the code is root in its namespace");
        assert_eq!(got[1], json!(["0000000000000000", "0000000000000000"]));
        for (i, what) in [
            "a user namespace",
            "user+net",
            "a network namespace",
            "a mount namespace",
        ]
        .iter()
        .enumerate()
        {
            assert_ne!(
                got[2 + i],
                json!("made"),
                "the code made {what} (landlock {landlock})"
            );
        }
    }
}

/// System calls with a record of kernel exploits and no use in the code's work fail with EPERM;
/// ordinary work is untouched (every other test in this file runs under the same filter).
#[tokio::test(flavor = "multi_thread")]
async fn kernel_attack_surface_syscalls_fail_with_eperm() {
    if !seccomp_in_force() {
        return;
    }
    // x86-64 numbers; on other architectures the names are looked up the same way.
    let code = "import ctypes, os, platform\nlibc = ctypes.CDLL(None, use_errno=True)\nnr = {'x86_64': {'io_uring_setup': 425, 'bpf': 321, 'userfaultfd': 323, 'keyctl': 250, 'perf_event_open': 298}, 'aarch64': {'io_uring_setup': 425, 'bpf': 280, 'userfaultfd': 282, 'keyctl': 219, 'perf_event_open': 241}}[platform.machine()]\nparams = (ctypes.c_char * 256)()\ndef call(name):\n    ctypes.set_errno(0)\n    rc = libc.syscall(nr[name], 8, ctypes.byref(params), 0, 0, 0)\n    return 'ok' if rc >= 0 else os.strerror(ctypes.get_errno())\nr = {name: call(name) for name in nr}\nr['getpid'] = 'ok' if libc.syscall(39 if platform.machine() == 'x86_64' else 172) > 0 else 'failed'\nr";
    let e = builder().build().unwrap().run(code).await.unwrap();
    assert!(e.is_success(), "{:?}", e.error);
    let got = e.return_value.as_object().unwrap();
    for name in [
        "io_uring_setup",
        "bpf",
        "userfaultfd",
        "keyctl",
        "perf_event_open",
    ] {
        assert_eq!(
            got[name],
            json!("Operation not permitted"),
            "{name}: {got:?}"
        );
    }
    assert_eq!(
        got["getpid"],
        json!("ok"),
        "the filter blocks too much: {got:?}"
    );
    // Without the layer the same calls reach the kernel (and fail, if at all, for other reasons).
    let e = builder()
        .sandbox(Sandbox {
            seccomp: false,
            ..Sandbox::default()
        })
        .build()
        .unwrap()
        .run(code)
        .await
        .unwrap();
    let got = e.return_value.as_object().unwrap();
    assert_ne!(
        got["io_uring_setup"],
        json!("Operation not permitted"),
        "{got:?}"
    );
}

/// The code gets no handle on the host process. Its bridge is a socket pair the host made, so the
/// kernel names the host as the bridge's peer: `SO_PEERPIDFD` would hand the code a pidfd of the
/// host, and `pidfd_getfd` on it, where nothing else stops it (an unprivileged host, whose runs share
/// its uid, without Landlock), the host's descriptors. Both are refused; `SO_PEERCRED`, which names no
/// process the code can reach (its pid reads 0 in the run's namespace), still answers.
#[tokio::test(flavor = "multi_thread")]
async fn the_code_gets_no_pidfd_of_the_host_and_takes_no_descriptor_of_another_process() {
    if !seccomp_in_force() {
        return;
    }
    let code = r#"
import ctypes, errno, os, socket, struct
libc = ctypes.CDLL(None, use_errno=True)
bridge = socket.socket(fileno=os.dup(4))
out = {"peercred_pid": struct.unpack("3i", bridge.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[0]}
try:
    bridge.getsockopt(socket.SOL_SOCKET, 77)  # SO_PEERPIDFD
    out["peerpidfd"] = "a pidfd of the host"
except OSError as e:
    out["peerpidfd"] = errno.errorcode[e.errno]
pid = os.fork()
if pid == 0:
    os.pause()
    os._exit(0)
pidfd = os.pidfd_open(pid)
got = libc.syscall(438, pidfd, 1, 0)  # pidfd_getfd of its own child
out["pidfd_getfd"] = "took one" if got >= 0 else errno.errorcode[ctypes.get_errno()]
os.kill(pid, 9)
os.waitpid(pid, 0)
out
"#;
    let e = builder().build().unwrap().run(code).await.unwrap();
    assert!(e.is_success(), "{:?}", e.error);
    assert_eq!(
        e.return_value,
        json!({"peercred_pid": 0, "peerpidfd": "EPERM", "pidfd_getfd": "EPERM"}),
        "{}",
        e.stderr
    );
}
