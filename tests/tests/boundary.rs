//! The boundary against a hostile model: what the code controls never leads the host (paths it
//! swapped, links it left), nothing of the host shows through (argv, environment, descriptors,
//! sockets), and a run's use of the host is bounded (memory in total, disk, host tool processes). One
//! test per attack that crossed before, named for the behaviour; like `hostile.rs`, CI runs this suite
//! as root and unprivileged (HOME under /tmp), with the pool on and off.

#![allow(clippy::unwrap_used)] // a test fails loudly where it unwraps

use std::process::Command;
use std::time::Duration;

use runpython_core::{RunPython, Sandbox, Status};
use runpython_tests::{survivors_after, unique_marker};
use serde_json::json;

fn builder() -> runpython_core::RunPythonBuilder {
    RunPython::builder().timeout(Duration::from_secs(30))
}

/// True when `layer` (a namespace name, or `view` for the filesystem view) is in force; prints why not.
fn has(layer: &str) -> bool {
    let report = builder().build().unwrap().isolation_report().unwrap();
    let ok = match layer {
        "view" => report.filesystem == "allowlist",
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

/// An engine that keeps runs in a fresh file store (the host then collects the run's files).
fn kept(builder: runpython_core::RunPythonBuilder) -> (RunPython, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("file://{}", dir.path().display());
    let python = builder
        .store(runpython_core::Store::open(&url).unwrap())
        .build()
        .unwrap();
    (python, dir)
}

/// A directory of the host holding a secret file, readable by anyone (so only the host's own care
/// keeps it out of a run's artifacts).
fn host_secret_dir(marker: &str) -> tempfile::TempDir {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::Builder::new()
        .prefix("runpython-host-secret-")
        .tempdir_in("/var/tmp")
        .unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(dir.path().join("secret.txt"), marker).unwrap();
    std::fs::set_permissions(
        dir.path().join("secret.txt"),
        std::fs::Permissions::from_mode(0o644),
    )
    .unwrap();
    dir
}

#[tokio::test(flavor = "multi_thread")]
async fn the_host_never_follows_a_link_the_code_left_in_place_of_its_directory() {
    let marker = unique_marker("follow");
    let secret = host_secret_dir(&marker);
    let (python, _store) = kept(builder());
    let code = format!(
        "import os\ncwd = os.getcwd()\nos.chdir('/')\nos.rename(cwd, cwd + '.moved')\nos.symlink({:?}, cwd)\n'done'",
        secret.path().display().to_string()
    );
    let e = python.run(code).await.unwrap();
    assert_eq!(e.return_value, json!("done"), "{:?}", e.error);
    let manifest = python.store().unwrap().get_run(&e.run_id).await.unwrap();
    for artifact in &manifest.artifacts {
        assert_ne!(
            artifact.name, "secret.txt",
            "the host followed the code's link"
        );
        let bytes = python.get_run_artifact(&artifact.id).await.unwrap();
        assert!(
            !String::from_utf8_lossy(&bytes).contains(&marker),
            "{} holds the host's secret",
            artifact.name
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_working_directory_replaced_by_a_file_fifo_or_socket_still_gives_an_envelope() {
    let (python, _store) = kept(builder());
    for replacement in [
        "open(cwd, 'w').write('x')",
        "os.mkfifo(cwd)",
        "import socket; socket.socket(socket.AF_UNIX).bind(cwd)",
    ] {
        let code = format!(
            "import os\ncwd = os.getcwd()\nos.chdir('/')\nos.rename(cwd, cwd + '.moved')\n{replacement}\n'done'"
        );
        let e = python.run(code).await.unwrap();
        assert_eq!(
            e.return_value,
            json!("done"),
            "{replacement}: {:?}",
            e.error
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn deleting_the_run_directory_follows_no_link() {
    let marker = unique_marker("delete");
    let secret = host_secret_dir(&marker);
    let (python, _store) = kept(builder());
    let code = format!(
        "import os\nos.symlink({:?}, 'link')\nos.symlink({:?}, 'file-link')\n'done'",
        secret.path().display().to_string(),
        secret.path().join("secret.txt").display().to_string()
    );
    let e = python.run(code).await.unwrap();
    assert_eq!(e.return_value, json!("done"), "{:?}", e.error);
    assert_eq!(
        std::fs::read_to_string(secret.path().join("secret.txt")).unwrap(),
        marker,
        "the host deleted through the code's link"
    );
}

#[test]
fn the_code_sees_no_host_argv_environment_or_descriptor() {
    let marker = unique_marker("argv");
    let secret = host_secret_dir(&marker);
    let host_file = secret.path().join("host-written");
    let code = format!(
        r#"import os
found = []
for pid in [p for p in os.listdir('/proc') if p.isdigit()]:
    for what in ('cmdline', 'environ'):
        try:
            data = open('/proc/%s/%s' % (pid, what), 'rb').read()
        except OSError:
            continue
        if b'{marker}' in data:
            found.append('/proc/%s/%s' % (pid, what))
if '{marker}' in repr(dict(os.environ)):
    found.append('environ')
fds = sorted(int(fd) for fd in os.listdir('/proc/self/fd'))
for fd in (7, 8):
    try:
        os.fstat(fd)
        found.append('fd %d' % fd)
    except OSError:
        pass
[found, [fd for fd in fds if fd > 4]]"#
    );
    // The host is started with the marker in its argv and environment, and with two descriptors a
    // launcher left open without close-on-exec: a secret file to read and a host file to write.
    let out = Command::new("sh")
        .arg("-c")
        .arg(r#"exec "$0" "$1" "$2" 7<"$3" 8>>"$4""#)
        .arg(env!("CARGO_BIN_EXE_runpython-run"))
        .arg(&code)
        .arg(format!("--token={marker}"))
        .arg(secret.path().join("secret.txt"))
        .arg(&host_file)
        .env("RUNPYTHON_T_ARGV_SECRET", &marker)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let envelope: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(envelope["status"], "success", "{envelope}");
    let value = &envelope["return_value"];
    assert_eq!(value[0], json!([]), "the host showed through: {value}");
    // The listing's own descriptor is the only one above the bridge.
    assert!(
        value[1].as_array().unwrap().len() <= 1,
        "descriptors: {value}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn host_unix_sockets_and_vsock_are_unreachable_with_the_network_off() {
    use std::os::unix::fs::PermissionsExt;
    let marker = unique_marker("sock");
    let dir = tempfile::Builder::new()
        .prefix("runpython-host-sock-")
        .tempdir_in("/var/tmp")
        .unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let path = dir.path().join(format!("{marker}.sock"));
    let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o777)).unwrap();
    listener.set_nonblocking(true).unwrap();
    let code = format!(
        r#"import socket
out = {{}}
s = socket.socket(socket.AF_UNIX)
try:
    s.connect({:?})
    out['unix'] = 'connected'
except OSError as e:
    out['unix'] = type(e).__name__
try:
    socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM)
    out['vsock'] = 'created'
except OSError as e:
    out['vsock'] = e.errno
out"#,
        path.display().to_string()
    );
    let e = builder().build().unwrap().run(code).await.unwrap();
    assert_ne!(
        e.return_value["unix"],
        json!("connected"),
        "{:?}",
        e.return_value
    );
    assert!(
        listener.accept().is_err(),
        "the code reached the host's socket"
    );
    if has("net") {
        assert_eq!(
            e.return_value["vsock"],
            json!(nix::libc::EPERM),
            "{:?}",
            e.return_value
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_hosts_devices_network_interfaces_and_cgroups_do_not_show_in_sys() {
    if !has("view") {
        return;
    }
    // sysfs shows the host as it was mounted: its network interfaces (names, MAC addresses) whatever
    // the run's network namespace, its hardware, and its cgroup tree with the host's own group names.
    let code = r#"import os
seen = {}
for path in ['/sys/class/net', '/sys/fs/cgroup', '/sys/devices', '/sys/kernel']:
    try:
        seen[path] = sorted(os.listdir(path))[:5]
    except OSError:
        pass
seen"#;
    let e = builder().build().unwrap().run(code).await.unwrap();
    assert_eq!(e.status, Status::Success, "{:?}", e.error);
    assert_eq!(e.return_value, json!({}), "the code read the host's /sys");
    // What libraries read there has a fallback: the CPU count comes from /proc and sysconf.
    let e = builder()
        .build()
        .unwrap()
        .run("import os\nos.cpu_count()")
        .await
        .unwrap();
    assert!(
        e.return_value.as_u64().is_some_and(|n| n >= 1),
        "{:?}",
        e.return_value
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_code_dir_and_environments_are_read_only_to_the_code() {
    let code = r#"import os, sys
out = {}
runner = sys.modules['runpython_runner'].__file__
for name, attempt in [
    ('rewrite runner', lambda: open(runner, 'a').write('\nraise SystemExit(3)\n')),
    ('drop module', lambda: open(os.path.join(os.path.dirname(runner), 'sitecustomize.py'), 'w').write('x')),
]:
    try:
        attempt()
        out[name] = 'written'
    except OSError as e:
        out[name] = type(e).__name__
out"#;
    let python = builder().build().unwrap();
    let e = python.run(code).await.unwrap();
    for (what, outcome) in e.return_value.as_object().unwrap() {
        assert_ne!(
            outcome,
            &json!("written"),
            "{what}: the code changed runpython's code"
        );
    }
    assert_eq!(python.run("1 + 1").await.unwrap().return_value, json!(2));
}

#[tokio::test(flavor = "multi_thread")]
async fn memfd_and_shared_memory_are_counted_in_the_runs_memory_or_refused() {
    let python = builder()
        .sandbox(Sandbox {
            run_memory_bytes: 256 << 20,
            ..Sandbox::default()
        })
        .build()
        .unwrap();
    let code = r#"import os
try:
    fd = os.memfd_create('hold')
except OSError as e:
    fd = None
    outcome = 'refused %d' % e.errno
if fd is not None:
    chunk = b'x' * (1 << 20)
    for _ in range(768):
        os.write(fd, chunk)
    outcome = 'held 768 MiB'
outcome"#;
    let e = python.run(code).await.unwrap();
    let isolation = e.isolation.clone().unwrap();
    assert_ne!(e.return_value, json!("held 768 MiB"), "{:?}", e.error);
    if isolation.memory.enforced_by.starts_with("cgroup") {
        assert_eq!(e.status, Status::Error);
        let error = e.error.unwrap();
        assert!(error.message.contains("memory limit"), "{error:?}");
    } else {
        assert_eq!(
            e.return_value,
            json!(format!("refused {}", nix::libc::EPERM))
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_run_cannot_write_more_than_its_disk_cap() {
    if !has("mount") {
        return;
    }
    let python = builder()
        .sandbox(Sandbox {
            disk_bytes: 32 << 20,
            ..Sandbox::default()
        })
        .build()
        .unwrap();
    let code = r#"import errno
out = []
chunk = b'x' * (1 << 20)
for path in ('big.bin', '/tmp/big.bin', '/dev/shm/big.bin'):
    written = 0
    try:
        with open(path, 'wb') as f:
            for _ in range(24):
                f.write(chunk)
                written += 1
    except OSError as e:
        out.append([path, written, errno.errorcode.get(e.errno)])
        continue
    out.append([path, written, None])
out"#;
    let e = python.run(code).await.unwrap();
    let rows = e.return_value.as_array().unwrap().clone();
    let total: u64 = rows.iter().map(|r| r[1].as_u64().unwrap()).sum();
    assert!(
        total <= 32,
        "the run wrote {total} MiB past its 32 MiB cap: {rows:?}"
    );
    assert!(
        rows.iter().any(|r| r[2] == json!("ENOSPC")),
        "no write was refused: {rows:?}"
    );
    assert_eq!(e.isolation.unwrap().disk.bytes, Some(32 << 20));
}

#[tokio::test(flavor = "multi_thread")]
async fn command_tools_leave_no_process_behind_when_the_run_ends() {
    let marker = unique_marker("tool");
    let python = builder()
        .timeout(Duration::from_secs(3))
        .tool(runpython_core::CommandTool::new(
            "slow",
            format!("python3 -c 'import time; time.sleep(300)' {marker}"),
        ))
        .build()
        .unwrap();
    let code = "import asyncio\nawait asyncio.gather(*[slow() for _ in range(5)])";
    let e = python.run(code).await.unwrap();
    assert_eq!(e.status, Status::Timeout, "{:?}", e.error);
    assert_eq!(survivors_after(&marker, 3.0), Vec::<u32>::new());
}

#[tokio::test(flavor = "multi_thread")]
async fn save_artifact_streams_data_larger_than_a_bridge_frame() {
    let (python, _store) = kept(builder());
    let e = python
        .run("save_artifact('big.bin', b'x' * (40 << 20))")
        .await
        .unwrap();
    assert_eq!(e.status, Status::Success, "{:?}", e.error);
    let id = e.return_value.as_str().unwrap().to_owned();
    assert_eq!(python.get_run_artifact(&id).await.unwrap().len(), 40 << 20);
}
