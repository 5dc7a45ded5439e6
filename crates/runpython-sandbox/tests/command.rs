//! [`runpython_sandbox::Command`] driven directly, as bubblewrap's tests drive its binary: a command
//! runs and its output, status and files come back, and what the sandbox promises holds for it (no
//! write outside its scratch, no host environment, no network, nothing of it left running, a timeout
//! that kills it, an isolation report that says what is in force). Each claim about a layer is
//! checked where the sandbox reports that layer in force, and skipped with the reason only where the
//! kernel lacks it. Where a check could pass for the wrong reason, a control run without the layer
//! shows it failing. CI runs this suite as root and as an unprivileged user.

#![allow(clippy::unwrap_used)] // a test fails loudly where it unwraps

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use runpython_sandbox::{kernel_report, Command, Isolation, Network, Output, Sandbox, Sandboxed};

/// Long enough for any command here; none should come near it.
const WAIT: Duration = Duration::from_secs(30);
const MAX_OUTPUT: usize = 1 << 16;

/// `/bin/sh -c script`: the system's shell, read from the system directories (it has no prefix of
/// its own to bind).
fn sh(script: &str) -> Command {
    Command::new("/bin/sh")
        .program_prefix(false)
        .args(["-c", script])
}

/// Runs `command` to its end.
async fn run(command: Command, sandbox: &Sandbox) -> (Sandboxed, Output) {
    let mut child = command.spawn(sandbox).unwrap();
    let output = child.wait_with_output(WAIT, MAX_OUTPUT).await.unwrap();
    (child, output)
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A real CPython to run in the sandbox: `RUNPYTHON_PYTHON`, else the first `python3` on `PATH`,
/// asked for its `sys.executable` (a pyenv shim or a wrapper script resolves to the interpreter
/// behind it, whose prefix the sandbox binds).
fn python() -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let candidates = std::env::var_os("RUNPYTHON_PYTHON")
        .map(PathBuf::from)
        .into_iter()
        .chain(std::env::split_paths(&path).map(|dir| dir.join("python3")));
    for candidate in candidates.filter(|c| c.is_file()) {
        let Ok(out) = std::process::Command::new(&candidate)
            .args(["-I", "-S", "-c", "import sys; print(sys.executable)"])
            .output()
        else {
            continue;
        };
        let executable = PathBuf::from(text(&out.stdout).trim());
        if out.status.success() && executable.is_absolute() {
            return executable;
        }
    }
    panic!("no python3 in RUNPYTHON_PYTHON or on PATH ({path:?}): install Python 3 or set RUNPYTHON_PYTHON");
}

/// A directory of the host anyone may write to, so that only the sandbox keeps a run out of it.
fn writable_host_dir() -> tempfile::TempDir {
    let dir = tempfile::Builder::new()
        .prefix("runpython-command-test-")
        .tempdir_in("/var/tmp")
        .unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    dir
}

/// A number of seconds for `sleep` unique to this process and call: its command line is the marker
/// that finds it in `/proc`.
fn unique_seconds() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    10_000_000 + u64::from(std::process::id() % 1000) * 1_000_000 + u64::from(nanos % 1_000_000)
}

/// Host pids of live processes whose command line is `sleep <seconds>` and, with `pid`, whose pid in
/// their own PID namespace (the innermost of `NSpid`) is `pid`.
fn sleepers(seconds: u64, pid: Option<u32>) -> Vec<u32> {
    let wanted = format!("sleep\0{seconds}\0");
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(host_pid) = entry.file_name().to_str().and_then(|s| s.parse().ok()) else {
            continue;
        };
        // A zombie's command line reads empty: only live processes match.
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        if cmdline != wanted.as_bytes() {
            continue;
        }
        let status = std::fs::read_to_string(entry.path().join("status")).unwrap_or_default();
        let innermost = status
            .lines()
            .find_map(|l| l.strip_prefix("NSpid:"))
            .and_then(|ids| ids.split_whitespace().last()?.parse::<u32>().ok());
        if pid.is_none() || innermost == pid {
            found.push(host_pid);
        }
    }
    found
}

/// Waits a little for the processes [`sleepers`] finds to be gone (a killed process takes a moment
/// to leave `/proc`), and returns those left.
fn sleepers_left(seconds: u64, pid: Option<u32>) -> Vec<u32> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let left = sleepers(seconds, pid);
        if left.is_empty() || Instant::now() > deadline {
            return left;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Whether `layer` is in force for the command; says why not when it is not.
fn in_force(isolation: &Isolation, layer: &str, held: bool) -> bool {
    if !held {
        eprintln!(
            "skipped: the {layer} layer is not in force on this host (missing: {:?})",
            isolation.missing
        );
    }
    held
}

#[tokio::test]
async fn a_command_runs_and_its_output_status_and_files_come_back() {
    let (child, output) = run(
        sh("echo to-stdout; echo to-stderr >&2; mkdir made; printf written > made/file.txt; exit 3"),
        &Sandbox::default(),
    )
    .await;
    assert_eq!(output.status.and_then(|s| s.code()), Some(3), "{output:?}");
    assert_eq!(text(&output.stdout), "to-stdout\n");
    assert_eq!(text(&output.stderr), "to-stderr\n");
    let host = tempfile::tempdir().unwrap();
    let to = host.path().join("made");
    let copied = child
        .scratch()
        .copy_out(Path::new("work/made"), &to, 1 << 20)
        .unwrap();
    assert_eq!((copied.files, copied.bytes), (1, 7), "{copied:?}");
    assert_eq!(
        std::fs::read_to_string(to.join("file.txt")).unwrap(),
        "written"
    );
}

#[tokio::test]
async fn it_cannot_write_outside_its_scratch() {
    // One directory it may read (bound read-only at its path), one it is not given at all; both
    // writable by anyone on the host.
    let (readable, hidden) = (writable_host_dir(), writable_host_dir());
    let script = r#"for d in "$@"; do if echo escaped > "$d/escaped.txt" 2>/dev/null; then echo "wrote $d"; fi; done; echo ok > inside.txt && echo "wrote scratch""#;
    let dirs = [readable.path(), hidden.path()];
    let command = || sh(script).arg("sh").args(dirs).read(readable.path());
    let (child, output) = run(command().arg("/etc"), &Sandbox::default()).await;
    let isolation = child.isolation();
    let held = isolation.filesystem == "allowlist" || isolation.landlock.starts_with("abi-");
    if !in_force(isolation, "filesystem view or Landlock", held) {
        return;
    }
    assert_eq!(text(&output.stdout), "wrote scratch\n", "{output:?}");
    for dir in dirs {
        assert!(
            !dir.join("escaped.txt").exists(),
            "{} was written",
            dir.display()
        );
    }
    // The control: without the sandbox's layers the same command writes both directories, so the
    // check above sees an escape when there is one.
    let (_, control) = run(command(), &Sandbox::off()).await;
    assert_eq!(text(&control.stdout).lines().count(), 3, "{control:?}");
    for dir in dirs {
        assert!(
            dir.join("escaped.txt").exists(),
            "{} was not written",
            dir.display()
        );
    }
}

#[tokio::test]
async fn it_sees_no_host_environment_variable_it_was_not_given() {
    assert!(
        std::env::vars_os().any(|(name, _)| name == "PATH" || name == "HOME"),
        "the host has variables that could leak"
    );
    let (_, output) = run(
        Command::new("/usr/bin/env")
            .program_prefix(false)
            .env("RUNPYTHON_COMMAND_TEST", "given"),
        &Sandbox::default(),
    )
    .await;
    assert_eq!(output.status.and_then(|s| s.code()), Some(0), "{output:?}");
    let seen: BTreeMap<String, String> = text(&output.stdout)
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
    let names: Vec<&str> = seen.keys().map(String::as_str).collect();
    // What it was given, and a HOME in its own scratch.
    assert_eq!(names, ["HOME", "RUNPYTHON_COMMAND_TEST"], "{seen:?}");
    assert_eq!(seen["RUNPYTHON_COMMAND_TEST"], "given");
    assert!(seen["HOME"].ends_with("/home"), "{seen:?}");
    assert_ne!(
        Some(std::ffi::OsString::from(&seen["HOME"])),
        std::env::var_os("HOME"),
        "the host's HOME leaked"
    );
}

#[tokio::test]
async fn it_has_no_network_a_loopback_server_on_the_host_is_unreachable() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let code = format!(
        "import socket\ntry:\n    socket.create_connection(('127.0.0.1', {port}), timeout=5).close()\n    \
         print('connected')\nexcept OSError as e:\n    print('refused', type(e).__name__)\n"
    );
    let python = python();
    let connect = || Command::new(&python).args(["-I", "-S", "-c", &code]);
    let (child, output) = run(connect(), &Sandbox::default()).await;
    let isolation = child.isolation();
    let held = isolation.network == "off" && isolation.namespaces.iter().any(|n| n == "net");
    if !in_force(isolation, "network namespace", held) {
        return;
    }
    assert!(text(&output.stdout).starts_with("refused "), "{output:?}");
    assert_eq!(
        listener.accept().map(drop).map_err(|e| e.kind()),
        Err(std::io::ErrorKind::WouldBlock),
        "a connection from the sandbox reached the host's server"
    );
    // The control: with the host's network the same code reaches the same server.
    let shared = Sandbox {
        network: Network::Host,
        ..Sandbox::default()
    };
    let (_, control) = run(connect(), &shared).await;
    assert_eq!(text(&control.stdout), "connected\n", "{control:?}");
    assert!(
        listener.accept().is_ok(),
        "the control's connection did not arrive"
    );
}

#[tokio::test]
async fn its_processes_die_with_it() {
    let seconds = unique_seconds();
    // A background sleep that writes its pid (in the run's PID namespace, where there is one) and
    // outlives the shell that started it, unless the sandbox ends it.
    let script = format!(
        "sh -c 'echo $$ > sleeper.pid; exec sleep {seconds}' & \
         while [ ! -s sleeper.pid ]; do sleep 0.01; done"
    );
    let (child, output) = run(sh(&script), &Sandbox::default()).await;
    assert_eq!(output.status.and_then(|s| s.code()), Some(0), "{output:?}");
    let host = tempfile::tempdir().unwrap();
    child
        .scratch()
        .copy_out(Path::new("work"), &host.path().join("work"), 1 << 20)
        .unwrap();
    let pid: u32 = std::fs::read_to_string(host.path().join("work/sleeper.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert_eq!(
        sleepers_left(seconds, Some(pid)),
        Vec::<u32>::new(),
        "the command's background sleep (pid {pid} in its namespace) outlived it"
    );
    // The control: the same search finds such a sleep while it runs.
    let mut host_sleep = std::process::Command::new("sleep")
        .arg(seconds.to_string())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    let host_pid = Some(host_sleep.id());
    let mut found = sleepers(seconds, host_pid);
    while found.is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
        found = sleepers(seconds, host_pid);
    }
    host_sleep.kill().unwrap();
    host_sleep.wait().unwrap();
    assert_eq!(found, [host_sleep.id()]);
}

#[tokio::test]
async fn a_timeout_kills_it_and_what_it_started() {
    let seconds = unique_seconds();
    let mut child = sh(&format!("sleep {seconds} & sleep {seconds}"))
        .spawn(&Sandbox::default())
        .unwrap();
    let output = child
        .wait_with_output(Duration::from_millis(300), MAX_OUTPUT)
        .await
        .unwrap();
    assert!(output.status.is_none(), "it ended by itself: {output:?}");
    let status = tokio::time::timeout(WAIT, child.wait())
        .await
        .expect("killed, it ends")
        .unwrap();
    assert_eq!(status.signal(), Some(libc::SIGKILL), "{status:?}");
    assert_eq!(sleepers_left(seconds, None), Vec::<u32>::new());
}

#[tokio::test]
async fn the_isolation_report_names_the_layers_in_force() {
    let kernel = kernel_report();
    // Each namespace the command is in differs from the host's; each it is not in is the host's.
    let script = "for n in user pid mnt ipc uts net; do echo \"$n $(readlink /proc/self/ns/$n)\"; \
                  done; grep -E '^(Seccomp|NoNewPrivs):' /proc/self/status";
    let (child, output) = run(sh(script), &Sandbox::default()).await;
    let isolation = child.isolation().clone();
    assert_eq!(output.status.and_then(|s| s.code()), Some(0), "{output:?}");
    let stdout = text(&output.stdout);
    let seen: BTreeMap<&str, &str> = stdout
        .lines()
        .filter_map(|l| l.split_once([' ', ':']))
        .map(|(k, v)| (k, v.trim()))
        .collect();
    for (name, link) in [
        ("user", "user"),
        ("pid", "pid"),
        ("mount", "mnt"),
        ("ipc", "ipc"),
        ("uts", "uts"),
        ("net", "net"),
    ] {
        let host = std::fs::read_link(format!("/proc/self/ns/{link}")).unwrap();
        let theirs = seen.get(link).copied().unwrap_or_default();
        assert!(theirs.starts_with(&format!("{link}:[")), "{link}: {stdout}");
        let reported = isolation.namespaces.iter().any(|n| n == name);
        assert_eq!(
            theirs != host.to_str().unwrap(),
            reported,
            "the report says {name} is{} in force; the command's {link} namespace is {theirs}, \
             the host's {host:?}",
            if reported { "" } else { " not" },
        );
        // The default sandbox asks for every namespace: one the kernel allows and the run lacks is
        // reported missing.
        if kernel.namespaces.iter().any(|n| n == name) && !reported {
            assert!(!isolation.missing.is_empty(), "{isolation:?}");
        }
    }
    assert_eq!(
        isolation.seccomp == "deny-list",
        seen.get("Seccomp") == Some(&"2"),
        "{isolation:?} {stdout}"
    );
    assert_eq!(isolation.seccomp == "deny-list", kernel.seccomp == "ok");
    assert_eq!(seen.get("NoNewPrivs"), Some(&"1"), "{stdout}");
    match kernel.landlock_abi {
        Some(abi) => assert_eq!(isolation.landlock, format!("abi-{abi}")),
        None => assert_eq!(isolation.landlock, "unavailable"),
    }
    assert_eq!(isolation.network, "off");
    let pid_ns = isolation.namespaces.iter().any(|n| n == "pid");
    assert_eq!(isolation.kill == "pid-namespace", pid_ns, "{isolation:?}");
    let mount_ns = isolation.namespaces.iter().any(|n| n == "mount");
    assert_eq!(
        isolation.filesystem == "allowlist",
        mount_ns,
        "{isolation:?}"
    );
    let limits = &isolation.rlimits;
    assert!(
        limits.address_space_bytes.is_some()
            && limits.cpu_seconds.is_some()
            && limits.file_size_bytes.is_some()
            && limits.open_files.is_some(),
        "{limits:?}"
    );
}
