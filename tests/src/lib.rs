//! runpython-tests: the workspace's end-to-end tests (in `tests/`) and the benchmark harness
//! (`src/bin/runpython-bench.rs`, driven by `cargo xtask bench`). This library holds their shared helpers.

use std::path::Path;

/// A marker unique to this process and call, to find processes a test started.
pub fn unique_marker(tag: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!("rpmark-{tag}-{}-{nanos}", std::process::id())
}

/// Pids of live processes whose command line contains `marker` (zombies excluded).
pub fn processes_with_marker(marker: &str) -> Vec<u32> {
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return found;
    };
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let dir = entry.path();
        let Ok(cmdline) = std::fs::read(dir.join("cmdline")) else {
            continue;
        };
        if !String::from_utf8_lossy(&cmdline).contains(marker) {
            continue;
        }
        if is_zombie(&dir) {
            continue;
        }
        found.push(pid);
    }
    found
}

fn is_zombie(proc_dir: &Path) -> bool {
    std::fs::read_to_string(proc_dir.join("stat"))
        .ok()
        .and_then(|stat| {
            stat.rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().next().map(|s| s == "Z"))
        })
        .unwrap_or(false)
}

/// Waits up to `secs` for every process carrying `marker` to be gone; returns the survivors.
pub fn survivors_after(marker: &str, secs: f64) -> Vec<u32> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs_f64(secs);
    loop {
        let left = processes_with_marker(marker);
        if left.is_empty() || std::time::Instant::now() > deadline {
            return left;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// Python that leaves three long-lived processes carrying `marker` — one in a new session, one
/// double-forked daemon, one ignoring every catchable signal — then prints `ready` and sleeps.
pub fn hostile_code(marker: &str) -> String {
    format!(
        r#"import os, subprocess, sys, time
subprocess.Popen(['{marker}', '300'], executable='sleep', start_new_session=True)
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execvp('sleep', ['{marker}', '301'])
    os._exit(0)
os.wait()
subprocess.Popen([sys.executable, '-c', 'import signal, time\nfor s in (1, 2, 15): signal.signal(s, signal.SIG_IGN)\ntime.sleep(300)', '{marker}'], start_new_session=True)
print('ready', flush=True)
time.sleep(300)
"#
    )
}
