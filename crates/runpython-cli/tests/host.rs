//! `runpython host`: runs with its flags, from its directory and environment, are served there and
//! print exactly as in their own process; anything else, or a host that is gone, runs in its own
//! process; a client that goes away stops its run.

#![allow(clippy::unwrap_used)] // a test fails loudly where it unwraps; helpers outside #[test] too

mod common;

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::text;

/// A `runpython host` of this test's own: a variable only its test sets makes its socket its own,
/// whatever else runs at the same time. Killed (by its id) and reaped when dropped.
struct Host {
    child: Child,
    log: Arc<Mutex<String>>,
    dir: Arc<tempfile::TempDir>,
    tag: String,
}

impl Host {
    fn start(flags: &[&str]) -> Self {
        let dir = Arc::new(tempfile::tempdir().unwrap());
        let tag = format!("{}-{:?}", std::process::id(), Instant::now());
        Self::start_in(dir, tag, flags)
    }

    /// Another host for the same runs: this one's directory and environment.
    fn again(&self, flags: &[&str]) -> Self {
        Self::start_in(Arc::clone(&self.dir), self.tag.clone(), flags)
    }

    /// `flags` without `--idle` get `--idle 120`: a host a failed test leaves behind stops by itself.
    fn start_in(dir: Arc<tempfile::TempDir>, tag: String, flags: &[&str]) -> Self {
        let idle: &[&str] = match flags.contains(&"--idle") {
            true => &[],
            false => &["--idle", "120"],
        };
        let mut child = Command::new(env!("CARGO_BIN_EXE_runpython"))
            .arg("host")
            .args(idle)
            .args(flags)
            .current_dir(dir.path())
            .env("RUNPYTHON_TEST_HOST", &tag)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let log = Arc::new(Mutex::new(String::new()));
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let stderr = child.stderr.take().unwrap();
        let sink = Arc::clone(&log);
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                let serving = line.contains("runpython host: serving");
                {
                    let mut log = sink.lock().unwrap();
                    log.push_str(&line);
                    log.push('\n');
                }
                if serving {
                    let _ = ready_tx.send(());
                }
            }
        });
        let host = Self {
            child,
            log,
            dir,
            tag,
        };
        if ready_rx.recv_timeout(Duration::from_secs(60)).is_err() {
            panic!("the host did not start: {}", host.log());
        }
        host
    }

    fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    /// `runpython ARGS` as a client of this host would be: its directory and environment.
    fn command(&self, args: &[&str]) -> Command {
        let mut command = Command::new(env!("CARGO_BIN_EXE_runpython"));
        command
            .args(args)
            .current_dir(self.dir.path())
            .env("RUNPYTHON_TEST_HOST", &self.tag)
            .stdin(Stdio::null());
        command
    }

    fn run(&self, args: &[&str]) -> Output {
        self.command(args).output().unwrap()
    }

    /// Whether the host's log names the run this envelope is of.
    fn served(&self, out: &Output) -> bool {
        let envelope: serde_json::Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("not an envelope ({e}): {}", text(&out.stderr)));
        let id = envelope["run_id"].as_str().unwrap().to_owned();
        // The host logs a run after it sent its envelope: give the line a moment.
        wait_for(Duration::from_secs(5), || {
            self.log().contains(&format!("run {id} "))
        })
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Sends the host `signal` (`-TERM`, `-STOP`, ...), by its id.
    fn signal(&self, signal: &str) -> bool {
        let pid = self.child.id().to_string();
        Command::new("kill")
            .args([signal, &pid])
            .status()
            .is_ok_and(|s| s.success())
    }
}

impl Drop for Host {
    /// SIGTERM first, so the host removes its socket; SIGKILL if it has not stopped in 10 s.
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            self.signal("-TERM");
            if !wait_for(Duration::from_secs(10), || {
                matches!(self.child.try_wait(), Ok(Some(_)))
            }) {
                let _ = self.child.kill();
            }
        }
        let _ = self.child.wait();
    }
}

fn wait_for(limit: Duration, mut done: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        if done() {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The host's socket, as its log names it.
fn socket(host: &Host) -> PathBuf {
    let log = host.log();
    let line = log.lines().find(|l| l.contains("serving")).unwrap();
    PathBuf::from(line.rsplit(" at ").next().unwrap())
}

/// What a person sees of a run: exit status, stdout, stderr.
fn seen(out: &Output) -> (Option<i32>, String, String) {
    (out.status.code(), text(&out.stdout), text(&out.stderr))
}

#[test]
fn runs_with_the_hosts_flags_are_served_there_and_print_as_in_their_own_process() {
    let host = Host::start(&["--no-store"]);
    let json = host.run(&[
        "run",
        "--no-store",
        "--json",
        "-c",
        "import os\nos.getpid()",
    ]);
    assert_eq!(json.status.code(), Some(0), "{}", text(&json.stderr));
    assert!(host.served(&json), "not served by the host: {}", host.log());

    std::fs::write(host.path().join("data.csv"), "a,b\n1,2\n").unwrap();
    std::fs::write(host.path().join("job.py"), "print('from a file')\n7").unwrap();
    let cases: [&[&str]; 6] = [
        &["-c", "print('hello')\n6 * 7"],
        &["-c", "import sys\nprint('to stderr', file=sys.stderr)\n1/0"],
        &["-c", "raise SystemExit(3)"],
        &["--input", "n=12345678901234567890123", "-c", "n + 1"],
        &[
            "--env",
            "GREETING=hi",
            "--file",
            "data.csv",
            "-c",
            "import os\nprint(os.environ['GREETING'], open('data.csv').read())",
        ],
        &["job.py"],
    ];
    for case in cases {
        let mut hosted = vec!["run", "--no-store"];
        hosted.extend_from_slice(case);
        let mut local = vec!["run", "--no-store", "--no-host"];
        local.extend_from_slice(case);
        assert_eq!(
            seen(&host.run(&hosted)),
            seen(&host.run(&local)),
            "{case:?}"
        );
    }

    // The code from stdin goes to the host too.
    let mut child = host
        .command(&["run", "--no-store", "--json", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"'from stdin'")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(host.served(&out), "{}", host.log());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["return_value"], "from stdin");

    // Other flags, or the same ones from elsewhere, are not this host's runs.
    let other = host.run(&["run", "--no-store", "--timeout", "20", "--json", "-c", "1"]);
    assert_eq!(other.status.code(), Some(0));
    assert!(
        !host.served(&other),
        "a run with other flags was served by the host"
    );
    let elsewhere = Command::new(env!("CARGO_BIN_EXE_runpython"))
        .args(["run", "--no-store", "--json", "-c", "1"])
        .env("RUNPYTHON_TEST_HOST", &host.tag)
        .current_dir(std::env::temp_dir())
        .output()
        .unwrap();
    assert_eq!(elsewhere.status.code(), Some(0));
    assert!(
        !host.served(&elsewhere),
        "a run from another directory was served"
    );
    let no_host = host.run(&["run", "--no-store", "--no-host", "--json", "-c", "1"]);
    assert!(!host.served(&no_host), "--no-host was served by the host");
}

/// The processes below `root` sleeping in `nanosleep` (the run's `time.sleep`; the template and its
/// ready forks wait in poll and recv).
fn sleeping_below(root: u32) -> usize {
    let mut parents = std::collections::HashMap::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // `pid (comm) state ppid ...`: the comm may hold spaces and parentheses.
        let after = &stat[stat.rfind(')').unwrap() + 2..];
        let ppid: u32 = after.split(' ').nth(1).unwrap().parse().unwrap();
        parents.insert(pid, ppid);
    }
    parents
        .keys()
        .filter(|&&pid| {
            let mut up = pid;
            while let Some(&parent) = parents.get(&up) {
                if parent == root {
                    let wchan = std::fs::read_to_string(format!("/proc/{pid}/wchan"));
                    return wchan.is_ok_and(|w| w.contains("nanosleep"));
                }
                up = parent;
            }
            false
        })
        .count()
}

#[test]
fn a_client_that_goes_away_stops_its_run() {
    if std::fs::read_to_string("/proc/self/wchan").is_err() {
        eprintln!("skipped: /proc/PID/wchan is not readable here");
        return;
    }
    let host = Host::start(&["--no-store"]);
    let mut client = host
        .command(&["run", "--no-store", "-c", "import time\ntime.sleep(60)"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    assert!(
        wait_for(Duration::from_secs(20), || sleeping_below(host.child.id())
            == 1),
        "the run never slept below the host: {}",
        host.log()
    );
    client.kill().unwrap();
    client.wait().unwrap();
    assert!(
        wait_for(Duration::from_secs(10), || sleeping_below(host.child.id())
            == 0),
        "the run outlived its client: {}",
        host.log()
    );
    assert!(host.log().contains("a client went away"), "{}", host.log());
}

#[test]
fn a_host_that_is_gone_or_replaced_leaves_runs_to_their_own_process() {
    let mut first = Host::start(&["--no-store"]);
    let path = socket(&first);
    // Killed outright: its socket stays behind, and nothing listens on it.
    first.child.kill().unwrap();
    first.child.wait().unwrap();
    assert!(path.exists());
    let out = first.run(&["run", "--no-store", "--json", "-c", "6 * 7"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["return_value"], 42);

    // A host started in its place serves; a third takes over from it, and the second stops.
    let mut second = first.again(&["--no-store"]);
    assert_eq!(socket(&second), path);
    assert!(second.served(&second.run(&["run", "--no-store", "--json", "-c", "1"])));
    let mut third = second.again(&["--no-store"]);
    assert!(
        wait_for(Duration::from_secs(10), || second
            .log()
            .contains("another host took its place")),
        "{}",
        second.log()
    );
    assert!(second.child.wait().unwrap().success());
    assert!(third.served(&third.run(&["run", "--no-store", "--json", "-c", "1"])));

    // Stopped by SIGTERM, a host removes its socket: runs go back to their own processes.
    assert!(third.signal("-TERM"));
    assert!(third.child.wait().unwrap().success());
    assert!(!path.exists(), "the stopped host left its socket");
    assert!(third.log().contains("stopped (SIGTERM)"), "{}", third.log());
}

#[test]
fn a_connection_that_sends_nothing_is_closed_and_the_host_still_idles_out() {
    let mut host = Host::start(&["--no-store", "--idle", "1"]);
    let silent = std::os::unix::net::UnixStream::connect(socket(&host)).unwrap();
    let stopped = wait_for(Duration::from_secs(30), || {
        matches!(host.child.try_wait(), Ok(Some(_)))
    });
    assert!(stopped, "a silent connection kept the host: {}", host.log());
    assert!(host.log().contains("sent no run within"), "{}", host.log());
    assert!(host.log().contains("stopped (idle)"), "{}", host.log());
    drop(silent);
}

#[test]
fn doctor_says_whether_a_host_serves_its_flags_from_here() {
    let host = Host::start(&["--no-store"]);
    let doctor = |args: &[&str]| -> serde_json::Value {
        let out = host.run(args);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()["host"].clone()
    };
    let served = doctor(&["doctor", "--json", "--no-store"]);
    assert_eq!(served["serving"], true, "{served}");
    assert_eq!(served["socket"], socket(&host).display().to_string());
    let other = doctor(&["doctor", "--json", "--no-store", "--timeout", "9"]);
    assert_eq!(other["serving"], false, "{other}");
    let text_out = text(&host.run(&["doctor", "--no-store"]).stdout);
    assert!(
        text_out.contains("warm host       serving runs with these flags"),
        "{text_out}"
    );
}

#[test]
fn a_run_already_queued_when_the_host_is_told_to_stop_is_served_not_dropped() {
    let mut host = Host::start(&["--no-store"]);
    let signal = |name: &str| assert!(host.signal(name));
    // Stopped, the host accepts nothing: the client's connection and run wait in its queue.
    signal("-STOP");
    let client = host
        .command(&["run", "--no-store", "--json", "-c", "6 * 7"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    signal("-TERM");
    signal("-CONT");
    let out = client.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["return_value"], 42);
    assert!(host.child.wait().unwrap().success());
    let id = v["run_id"].as_str().unwrap();
    assert!(
        host.log().contains(&format!("run {id} ")),
        "not served: {}",
        host.log()
    );
    assert!(host.log().contains("stopped (SIGTERM)"), "{}", host.log());
}

#[test]
fn a_stopped_host_leaves_the_run_to_its_own_process_and_never_runs_it_too() {
    let host = Host::start(&["--no-store"]);
    let signal = |name: &str| assert!(host.signal(name));
    // Ctrl-Z in the host's terminal: it accepts nothing until continued.
    signal("-STOP");
    let mut client = host
        .command(&["run", "--no-store", "--json", "-c", "6 * 7"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let finished = wait_for(Duration::from_secs(20), || {
        matches!(client.try_wait(), Ok(Some(_)))
    });
    if !finished {
        let _ = client.kill();
    }
    let out = client.wait_with_output().unwrap();
    signal("-CONT");
    assert!(finished, "the client hung on a stopped host");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["return_value"], 42);
    // Continued, the host finds the client gone before it sent anything: nothing runs there.
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        !host.log().contains("runpython host: run "),
        "{}",
        host.log()
    );
    assert!(host.served(&host.run(&["run", "--no-store", "--json", "-c", "1"])));
}
