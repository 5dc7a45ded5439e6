//! The benchmark harness's fixed-cost yardsticks (`runpython-bench` prints them with the others): the
//! CLI's whole process against bubblewrap's (`cli_run_vs_bwrap`), and forked runs per second against
//! what the kernel allows for the same namespaces, mounts and cgroup joins without Python
//! (`runs_per_s_vs_ns_ceiling`). `RUNPYTHON_BENCH_SECTIONS=fixed_costs` runs these alone ([`only`]).

use std::ffi::CString;
use std::os::fd::{AsRawFd as _, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use crate::stats::{p50, round3};
use nix::libc;
use serde_json::{json, Map, Value};

type BoxError = Box<dyn std::error::Error>;

/// Runs the ceiling loop makes, 16 at a time.
const CEILING_RUNS: usize = 320;

/// The fixed-cost figures alone, for iterating on them without the whole bench: forked runs per
/// second (`runs_per_s_16_concurrent`, as the full bench measures it), the ceiling, the CLI against
/// bubblewrap.
pub async fn only(
    m: &mut Map<String, Value>,
    python: &Path,
    runpython: &Path,
    rounds: usize,
) -> Result<(), BoxError> {
    let forked = crate::template_bench::trivial_figures(m, python, rounds).await?;
    let per_s = crate::template_bench::runs_per_s_16(&forked, "sum(range(1000))").await?;
    drop(forked);
    m.insert("runs_per_s_16_concurrent".into(), json!(round3(per_s)));
    ceiling_figures(m, per_s, python)?;
    cli_vs_bwrap(m, runpython, python, rounds)
}

/// `ns_ceiling_runs_per_s` and `runs_per_s_vs_ns_ceiling` (`forked_per_s` over it); beside them
/// the same ceiling made by `python` instead (`ns_ceiling_python_runs_per_s`, each child a fork of
/// an interpreter whose heap is frozen as a template's, doing nothing of a run's), what it is of the
/// ceiling (`ns_ceiling_python_vs_ns_ceiling`: the most `runs_per_s_vs_ns_ceiling` can be for runs
/// that are forks of an interpreter) and forked runs against it (`runs_per_s_vs_python_ceiling`:
/// the distance that is a run's own work). The two ceilings are measured one after the other, twice,
/// alternating, and each is the better of its two.
pub fn ceiling_figures(
    m: &mut Map<String, Value>,
    forked_per_s: f64,
    python: &Path,
) -> Result<(), BoxError> {
    let ceiling = Ceiling::new()?;
    ceiling.runs_per_s(32)?; // warms the kernel's caches as the engine's first run does
    let (mut per_s, mut python_per_s, mut python_rss) = (0f64, 0f64, 0f64);
    for _ in 0..2 {
        per_s = per_s.max(ceiling.runs_per_s(CEILING_RUNS)?);
        let (rate, rss) = ceiling.python_runs_per_s(python, CEILING_RUNS)?;
        (python_per_s, python_rss) = (python_per_s.max(rate), rss);
    }
    m.insert("ns_ceiling_runs_per_s".into(), json!(round3(per_s)));
    m.insert("ns_ceiling_setup".into(), json!(ceiling.describe()));
    m.insert(
        "runs_per_s_vs_ns_ceiling".into(),
        json!(round3(forked_per_s / per_s)),
    );
    m.insert(
        "ns_ceiling_python_runs_per_s".into(),
        json!(round3(python_per_s)),
    );
    m.insert(
        "ns_ceiling_python_rss_mib".into(),
        json!(round3(python_rss)),
    );
    m.insert(
        "ns_ceiling_python_vs_ns_ceiling".into(),
        json!(round3(python_per_s / per_s)),
    );
    m.insert(
        "runs_per_s_vs_python_ceiling".into(),
        json!(round3(forked_per_s / python_per_s)),
    );
    Ok(())
}

/// `cli_run_ms` (`runpython run --no-store --no-host --json -c 1+1`, a process of its own),
/// `cli_run_hosted_ms` (the same run handed to a `runpython host --no-store` started for it, which
/// forks it from its template), `bwrap_python_ms` (`bwrap --unshare-all ... python -I -S -c 1+1`,
/// the same interpreter) and their ratios `cli_run_vs_bwrap`, `cli_hosted_run_vs_bwrap`: whole
/// processes, medians of interleaved rounds. Every hosted round is checked to have been served by
/// the host (its log names the run). Skipped (said why) where bubblewrap is missing.
pub fn cli_vs_bwrap(
    m: &mut Map<String, Value>,
    runpython: &Path,
    python: &Path,
    rounds: usize,
) -> Result<(), BoxError> {
    let bwrap = std::env::var_os("RUNPYTHON_BENCH_BWRAP")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/bin/bwrap"));
    if !bwrap.exists() {
        m.insert(
            "cli_run_vs_bwrap".into(),
            json!(format!(
                "skipped: no bubblewrap at {} (apt-get install bubblewrap)",
                bwrap.display()
            )),
        );
        return Ok(());
    }
    let python = std::fs::canonicalize(python)?;
    let mut cli = Command::new(runpython);
    cli.args(["run", "--no-store", "--no-host", "--json", "-c", "1+1"]);
    let mut hosted = Command::new(runpython);
    hosted.args(["run", "--no-store", "--json", "-c", "1+1"]);
    let mut sandboxed = Command::new(&bwrap);
    sandboxed
        .args(["--unshare-all", "--die-with-parent", "--ro-bind", "/", "/"])
        .args(["--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp"])
        .arg(&python)
        .args(["-I", "-S", "-c", "1+1"]);
    let host = CliHost::start(runpython, &["--no-store"])?;
    let (mut cli_ms, mut hosted_ms, mut bwrap_ms) = (Vec::new(), Vec::new(), Vec::new());
    let mut ids = Vec::new();
    for round in 0..rounds + 2 {
        let a = whole_process_ms(&mut cli)?.0;
        let (b, out) = whole_process_ms(&mut hosted)?;
        let c = whole_process_ms(&mut sandboxed)?.0;
        let envelope: Value = serde_json::from_slice(&out.stdout)?;
        ids.push(envelope["run_id"].as_str().unwrap_or_default().to_owned());
        if round >= 2 {
            cli_ms.push(a);
            hosted_ms.push(b);
            bwrap_ms.push(c);
        }
    }
    let log = host.stop()?;
    if let Some(id) = ids.iter().find(|id| !log.contains(&format!("run {id} "))) {
        return Err(format!("the hosted run {id:?} was not served by the host: {log}").into());
    }
    let (cli_ms, hosted_ms, bwrap_ms) = (p50(cli_ms), p50(hosted_ms), p50(bwrap_ms));
    m.insert("cli_run_ms".into(), json!(round3(cli_ms)));
    m.insert("cli_run_hosted_ms".into(), json!(round3(hosted_ms)));
    m.insert("bwrap_python_ms".into(), json!(round3(bwrap_ms)));
    m.insert("cli_run_vs_bwrap".into(), json!(round3(cli_ms / bwrap_ms)));
    m.insert(
        "cli_hosted_run_vs_bwrap".into(),
        json!(round3(hosted_ms / bwrap_ms)),
    );
    Ok(())
}

/// A `runpython host FLAGS` started by the bench in its own directory and environment (so the runs
/// it starts next are this host's), its stderr kept.
#[derive(Debug)]
pub struct CliHost {
    child: std::process::Child,
    log: std::sync::Arc<std::sync::Mutex<String>>,
}

impl CliHost {
    /// Started, and ready (its socket in place) within two minutes, or an error with its log.
    pub fn start(runpython: &Path, flags: &[&str]) -> Result<Self, BoxError> {
        use std::io::BufRead as _;
        let mut child = Command::new(runpython)
            .arg("host")
            .args(flags)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()?;
        let stderr = child.stderr.take().ok_or("the host's stderr")?;
        let log = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let (ready, started) = std::sync::mpsc::channel();
        let sink = std::sync::Arc::clone(&log);
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if let Ok(mut log) = sink.lock() {
                    log.push_str(&line);
                    log.push('\n');
                }
                if line.contains("runpython host: serving") {
                    let _ = ready.send(());
                }
            }
        });
        let host = Self { child, log };
        if started
            .recv_timeout(std::time::Duration::from_secs(120))
            .is_err()
        {
            let log = host.stop()?;
            return Err(format!("runpython host did not start: {log}").into());
        }
        Ok(host)
    }

    /// What it logged so far.
    pub fn log(&self) -> String {
        self.log.lock().map(|l| l.clone()).unwrap_or_default()
    }

    /// Stopped (SIGTERM, by its id) and reaped; what it logged.
    pub fn stop(mut self) -> Result<String, BoxError> {
        self.terminate()?;
        // The reader thread ends with the host's stderr.
        std::thread::sleep(std::time::Duration::from_millis(50));
        Ok(self.log())
    }

    fn terminate(&mut self) -> std::io::Result<()> {
        if self.child.try_wait()?.is_none() {
            let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
            self.child.wait()?;
        }
        Ok(())
    }
}

impl Drop for CliHost {
    /// A bench that failed half-way leaves no host behind.
    fn drop(&mut self) {
        let _ = self.terminate();
    }
}

fn whole_process_ms(command: &mut Command) -> Result<(f64, std::process::Output), BoxError> {
    let t = Instant::now();
    let out = command.output()?;
    let ms = t.elapsed().as_secs_f64() * 1e3;
    if !out.status.success() {
        return Err(format!(
            "{command:?} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )
        .into());
    }
    Ok((ms, out))
}

/// What a forked run's setup costs the kernel, without Python: a cgroup made per run (memory and
/// pids, their limits written) and joined, a child cloned with the run's namespaces (the sandbox's
/// kernel report, less the user namespace on a root host, whose runs share their template's), its
/// mounts made private, a tmpfs scratch with the run's five directories, its `tmp` on `/tmp` and
/// `shm` on `/dev/shm`, a fresh `/proc`; then it exits, is reaped and its cgroups removed.
struct Ceiling {
    flags: libc::c_int,
    /// `(controller, this process's own directory in it)`.
    cgroup_parents: Vec<(&'static str, PathBuf)>,
    /// Where each child mounts its scratch (a directory of its own in the host's namespace).
    scratch: tempfile::TempDir,
}

impl Ceiling {
    fn new() -> Result<Self, BoxError> {
        let report = runpython_sandbox::kernel_report();
        let root = nix::unistd::geteuid().is_root();
        let mut flags = 0;
        for name in &report.namespaces {
            flags |= match name.as_str() {
                "user" if root => 0,
                "user" => libc::CLONE_NEWUSER,
                "pid" => libc::CLONE_NEWPID,
                "mount" => libc::CLONE_NEWNS,
                "net" => libc::CLONE_NEWNET,
                "ipc" => libc::CLONE_NEWIPC,
                "uts" => libc::CLONE_NEWUTS,
                _ => 0,
            };
        }
        if flags & libc::CLONE_NEWNS == 0 || flags & libc::CLONE_NEWPID == 0 {
            return Err(format!(
                "the ceiling needs mount and pid namespaces; this host offers {:?}",
                report.namespaces
            )
            .into());
        }
        Ok(Self {
            flags,
            cgroup_parents: v1_cgroup_parents(),
            scratch: tempfile::tempdir()?,
        })
    }

    fn describe(&self) -> String {
        let names: Vec<&str> = [
            (libc::CLONE_NEWUSER, "user"),
            (libc::CLONE_NEWPID, "pid"),
            (libc::CLONE_NEWNS, "mount"),
            (libc::CLONE_NEWNET, "net"),
            (libc::CLONE_NEWIPC, "ipc"),
            (libc::CLONE_NEWUTS, "uts"),
        ]
        .into_iter()
        .filter(|(f, _)| self.flags & f != 0)
        .map(|(_, n)| n)
        .collect();
        let cgroups = if self.cgroup_parents.is_empty() {
            "no cgroups (none writable)".to_owned()
        } else {
            format!("cgroups under {:?}", self.cgroup_parents)
        };
        format!("namespaces {}; {cgroups}", names.join("+"))
    }

    /// `runs` children, 16 at a time (16 threads, each making its share one after another).
    fn runs_per_s(&self, runs: usize) -> Result<f64, BoxError> {
        let t = Instant::now();
        std::thread::scope(|s| {
            let workers: Vec<_> = (0..16)
                .map(|worker| {
                    s.spawn(move || {
                        for i in 0..runs / 16 {
                            self.one(worker * 100_000 + i)?;
                        }
                        Ok::<_, String>(())
                    })
                })
                .collect();
            workers.into_iter().try_for_each(|w| {
                w.join()
                    .map_err(|_| "a ceiling worker panicked".to_owned())?
            })
        })?;
        Ok((runs / 16 * 16) as f64 / t.elapsed().as_secs_f64())
    }

    /// The same children, 16 at a time, each cloned by `python` running `ceiling_python.py`
    /// (one thread, as a template forks): its runs per second and its resident MiB.
    fn python_runs_per_s(&self, python: &Path, runs: usize) -> Result<(f64, f64), BoxError> {
        let config = json!({
            "flags": self.flags,
            "cgroups": self.cgroup_parents,
            "scratch": self.scratch.path(),
            "runs": runs,
            "uid_map": format!("0 {} 1", nix::unistd::geteuid()),
            "gid_map": format!("0 {} 1", nix::unistd::getegid()),
        });
        let out = Command::new(python)
            .args(["-I", "-c", include_str!("ceiling_python.py")])
            .arg(config.to_string())
            .output()?;
        let figures: Value = serde_json::from_slice(&out.stdout).map_err(|e| {
            format!(
                "the Python ceiling said no figures ({e}): {}",
                String::from_utf8_lossy(&out.stderr)
            )
        })?;
        let at = |k: &str| figures[k].as_f64().ok_or(format!("no {k} in {figures}"));
        Ok((at("runs_per_s")?, at("rss_mib")?))
    }

    fn one(&self, n: usize) -> Result<(), String> {
        let name = format!("runpython-ceiling-{}-{n}", std::process::id());
        let mut dirs = Vec::new();
        let mut joins: Vec<OwnedFd> = Vec::new();
        for (controller, parent) in &self.cgroup_parents {
            let dir = parent.join(&name);
            let made = std::fs::create_dir(&dir).and_then(|()| {
                dirs.push(dir.clone());
                match *controller {
                    "memory" => std::fs::write(dir.join("memory.limit_in_bytes"), "1073741824"),
                    _ => std::fs::write(dir.join("pids.max"), "264"),
                }?;
                let file = std::fs::OpenOptions::new()
                    .write(true)
                    .open(dir.join("tasks"))?;
                joins.push(file.into());
                Ok(())
            });
            if let Err(e) = made {
                remove_cgroups(&dirs);
                return Err(format!("cannot make the cgroup {}: {e}", dir.display()));
            }
        }
        let outcome = self.clone_and_reap(&joins);
        drop(joins);
        remove_cgroups(&dirs);
        outcome
    }

    fn clone_and_reap(&self, joins: &[OwnedFd]) -> Result<(), String> {
        let scratch = self.scratch.path();
        let c =
            |p: &Path| CString::new(p.as_os_str().as_encoded_bytes()).expect("no NUL in a path");
        let root = c(scratch);
        let subdirs: Vec<CString> = ["work", "tmp", "shm", "home", "out"]
            .iter()
            .map(|d| c(&scratch.join(d)))
            .collect();
        let (tmp, shm) = (&subdirs[1], &subdirs[2]);
        let joins: Vec<libc::c_int> = joins.iter().map(|f| f.as_raw_fd()).collect();
        let uid_map = format!("0 {} 1", nix::unistd::geteuid());
        let gid_map = format!("0 {} 1", nix::unistd::getegid());
        let userns = self.flags & libc::CLONE_NEWUSER != 0;
        // SAFETY: a fork-like clone (no shared memory, no new stack) of this multi-threaded process;
        // the child makes system calls only, on buffers prepared above, then `_exit`s.
        let pid = unsafe {
            libc::syscall(
                libc::SYS_clone,
                libc::c_long::from(self.flags | libc::SIGCHLD),
                0usize,
                0usize,
                0usize,
                0usize,
            )
        };
        if pid < 0 {
            return Err(format!(
                "clone with the run's namespaces failed: {}",
                std::io::Error::last_os_error()
            ));
        }
        if pid == 0 {
            // SAFETY: in the child, system calls on the prepared buffers only.
            unsafe {
                libc::_exit(child(
                    &joins, &root, &subdirs, tmp, shm, userns, &uid_map, &gid_map,
                ))
            }
        }
        let mut status = 0;
        // SAFETY: waits for the child cloned above.
        if unsafe { libc::waitpid(pid as libc::pid_t, &mut status, libc::__WALL) } < 0 {
            return Err(format!("waitpid: {}", std::io::Error::last_os_error()));
        }
        match libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status)) {
            Some(0) => Ok(()),
            other => Err(format!(
                "the ceiling's child failed at step {other:?} (status {status}; 1: cgroup join, \
                 2: id maps, 3: private mounts, 4: tmpfs, 5: directories, 6: binds, 7: /proc)"
            )),
        }
    }
}

/// The child's setup; its exit status (0, or the step that failed).
#[allow(clippy::too_many_arguments)]
unsafe fn child(
    joins: &[libc::c_int],
    root: &CString,
    subdirs: &[CString],
    tmp: &CString,
    shm: &CString,
    userns: bool,
    uid_map: &str,
    gid_map: &str,
) -> libc::c_int {
    // SAFETY: system calls on buffers the parent prepared before the clone (the whole body).
    unsafe {
        for fd in joins {
            if libc::write(*fd, c"0".as_ptr().cast(), 1) != 1 {
                return 1;
            }
        }
        if userns {
            for (file, text) in [
                (c"/proc/self/setgroups", "deny"),
                (c"/proc/self/uid_map", uid_map),
                (c"/proc/self/gid_map", gid_map),
            ] {
                let fd = libc::open(file.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                if fd < 0 || libc::write(fd, text.as_ptr().cast(), text.len()) < 0 {
                    return 2;
                }
                libc::close(fd);
            }
        }
        let none = std::ptr::null::<libc::c_char>();
        if libc::mount(
            none,
            c"/".as_ptr(),
            none,
            libc::MS_REC | libc::MS_PRIVATE,
            std::ptr::null(),
        ) != 0
        {
            return 3;
        }
        let data = c"mode=0700,size=67108864";
        if libc::mount(
            c"tmpfs".as_ptr(),
            root.as_ptr(),
            c"tmpfs".as_ptr(),
            libc::MS_NOSUID | libc::MS_NODEV,
            data.as_ptr().cast(),
        ) != 0
        {
            return 4;
        }
        for dir in subdirs {
            if libc::mkdir(dir.as_ptr(), 0o700) != 0 {
                return 5;
            }
        }
        // `/dev/shm` first: the scratch sits under `/tmp`, which the second bind hides.
        for (from, to) in [(shm, c"/dev/shm"), (tmp, c"/tmp")] {
            let flags = libc::MS_BIND | libc::MS_REC;
            if libc::mount(from.as_ptr(), to.as_ptr(), none, flags, std::ptr::null()) != 0 {
                return 6;
            }
        }
        let flags = libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC;
        if libc::mount(
            c"proc".as_ptr(),
            c"/proc".as_ptr(),
            c"proc".as_ptr(),
            flags,
            std::ptr::null(),
        ) != 0
        {
            return 7;
        }
        0
    }
}

/// This process's own cgroup v1 memory and pids directories, where writable (as the sandbox makes
/// its runs' groups on this machine); none elsewhere (the figure then says so).
fn v1_cgroup_parents() -> Vec<(&'static str, PathBuf)> {
    let own = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    ["memory", "pids"]
        .into_iter()
        .filter_map(|controller| {
            let path = own.lines().find_map(|line| {
                let mut parts = line.splitn(3, ':');
                let (_, names, path) = (parts.next()?, parts.next()?, parts.next()?);
                names.split(',').any(|n| n == controller).then_some(path)
            })?;
            let dir = Path::new("/sys/fs/cgroup")
                .join(controller)
                .join(path.trim_start_matches('/'));
            let probe = dir.join(format!("runpython-ceiling-probe-{}", std::process::id()));
            std::fs::create_dir(&probe).ok()?;
            let _ = std::fs::remove_dir(&probe);
            Some((controller, dir))
        })
        .collect()
}

/// Removes the child's cgroups (a moment after it is reaped a v1 group may still be busy).
fn remove_cgroups(dirs: &[PathBuf]) {
    for dir in dirs {
        for _ in 0..100 {
            match std::fs::remove_dir(dir) {
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
                _ => break,
            }
        }
    }
}
