//! runpython-tests: the workspace's end-to-end tests (in `tests/`) and the benchmark harness
//! (`src/bin/runpython-bench.rs`, driven by `cargo xtask bench`). This library holds their shared helpers.

pub mod chart_bench;
pub mod deps_bench;
pub mod display_bench;
pub mod egress_bench;
pub mod mcp_bench;
pub mod py_bench;
pub mod recorder;
pub mod session_bench;
pub mod start_bench;
pub mod stats;
pub mod store_bench;
pub mod template_bench;
pub mod tenant_bench;
pub mod ways;
pub mod world;

use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

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

/// A moto S3 server started on a free loopback port; killed (by pid) and reaped on drop.
#[derive(Debug)]
pub struct Moto {
    /// The server process.
    pub child: Child,
    /// Its loopback port.
    pub port: u16,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Drop for Moto {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            // A frozen process still dies of SIGKILL; CONT only lets it go quietly if it was stopped.
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

impl Moto {
    /// `Ok(None)` when moto is not installed and this is not CI.
    pub fn start() -> Result<Option<Self>, String> {
        let Some(bin) = find_moto() else {
            let reason = "moto_server not found in $RUNPYTHON_TOOLS_BIN or on PATH \
                          (install with: pip install 'moto[server]')";
            if std::env::var_os("CI").is_some() {
                return Err(format!("{reason}; CI must provide it"));
            }
            println!("skipped: {reason}");
            return Ok(None);
        };
        let port = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .and_then(|l| l.local_addr())
            .map_err(|e| format!("no free loopback port: {e}"))?
            .port();
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let log = dir.path().join("moto.log");
        let out = std::fs::File::create(&log).map_err(|e| e.to_string())?;
        let err = out.try_clone().map_err(|e| e.to_string())?;
        let child = Command::new(&bin)
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", bin.display()))?;
        let mut moto = Self {
            child,
            port,
            log,
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok(Some(status)) = moto.child.try_wait() {
                return Err(format!(
                    "moto_server exited with {status}: {}",
                    moto.log_tail()
                ));
            }
            if moto
                .http("GET", "/")
                .is_ok_and(|r| r.starts_with("HTTP/1.1 200") || r.starts_with("HTTP/1.0 200"))
            {
                return Ok(Some(moto));
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "moto_server did not answer within 60 s: {}",
                    moto.log_tail()
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// A bare HTTP/1.1 request (moto accepts unsigned requests); returns the status line and headers.
    pub fn http(&self, method: &str, path: &str) -> std::io::Result<String> {
        let mut s = TcpStream::connect((Ipv4Addr::LOCALHOST, self.port))?;
        s.set_read_timeout(Some(Duration::from_secs(10)))?;
        write!(
            s,
            "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
            self.port
        )?;
        let mut response = String::new();
        s.read_to_string(&mut response)?;
        Ok(response)
    }

    /// Creates a bucket with an unsigned request.
    pub fn create_bucket(&self, bucket: &str) -> Result<(), String> {
        let r = self
            .http("PUT", &format!("/{bucket}"))
            .map_err(|e| format!("PUT /{bucket}: {e}"))?;
        if r.contains(" 200 ") {
            Ok(())
        } else {
            Err(format!(
                "PUT /{bucket} answered: {}",
                r.lines().next().unwrap_or("")
            ))
        }
    }

    /// An `s3://` store URL for `bucket`/`prefix` on this server.
    pub fn url(&self, bucket: &str, prefix: &str) -> String {
        format!(
            "s3://{bucket}/{prefix}?endpoint=http://127.0.0.1:{}&region=us-east-1&allow_http=true\
             &access_key_id=testing&secret_access_key=testing",
            self.port
        )
    }

    /// The server's last log lines.
    pub fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<_> = log.lines().rev().take(20).collect();
        lines.into_iter().rev().collect::<Vec<_>>().join("\n")
    }
}

fn find_moto() -> Option<PathBuf> {
    let from_tools =
        std::env::var_os("RUNPYTHON_TOOLS_BIN").map(|d| PathBuf::from(d).join("moto_server"));
    let on_path = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|d| d.join("moto_server"));
    from_tools.into_iter().chain(on_path).find(|p| p.is_file())
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

/// A TCP server on a loopback port that accepts every connection and never answers: a store endpoint
/// that hangs. Stopped (its thread joined, its connections closed) on drop.
#[derive(Debug)]
pub struct HungServer {
    /// Its loopback port.
    pub port: u16,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl HungServer {
    /// Binds a free loopback port and starts accepting.
    pub fn start() -> std::io::Result<Self> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
        let port = listener.local_addr()?.port();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stopping = std::sync::Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            let mut held = Vec::new();
            for stream in listener.incoming() {
                if stopping.load(std::sync::atomic::Ordering::SeqCst) {
                    break;
                }
                if let Ok(stream) = stream {
                    held.push(stream); // read nothing, answer nothing, close nothing
                }
            }
        });
        Ok(Self {
            port,
            stop,
            thread: Some(thread),
        })
    }

    /// An `s3://` store URL on this server whose requests time out after `timeout` (as written in the
    /// URL, e.g. `2s`).
    pub fn s3_url(&self, timeout: &str) -> String {
        format!(
            "s3://hung/runs?endpoint=http://127.0.0.1:{}&region=us-east-1&allow_http=true\
             &access_key_id=testing&secret_access_key=testing&timeout={timeout}",
            self.port
        )
    }
}

impl Drop for HungServer {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        // Wakes the accept loop so it sees the flag.
        let _ = TcpStream::connect((Ipv4Addr::LOCALHOST, self.port));
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
