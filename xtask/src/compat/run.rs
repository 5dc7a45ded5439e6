//! Running one module in one pass: the plain process (`python driver.py`) or `runpython run` with the
//! driver as the run's code, as root or as the unprivileged user, fresh or forked from a template.

use std::collections::VecDeque;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use super::{work_dir, ModuleRun};

const DRIVER: &str = include_str!("driver.py");
const REGRTEST_JSON: &str = include_str!("regrtest_json.py");

/// Makes the interpreter's prefix reachable by the unprivileged user when one of its ancestors is
/// closed to others (`/root` of `/root/.pyenv`): in a mount namespace of the pass's own, a tmpfs over
/// that ancestor holds only the prefix, bound at its own path (its RUNPATH names it). Run by root;
/// the host's tree is untouched. `sh -ec SCRIPT sh CLOSED PREFIX COMMAND...`.
const REACH_PREFIX: &str = r#"closed=$1; prefix=$2; shift 2
held=$(mktemp -d)
mount --rbind "$prefix" "$held"
mount -t tmpfs -o mode=0711,size=1m tmpfs "$closed"
mkdir -p "$prefix"
mount --move "$held" "$prefix"
rmdir "$held"
exec "$@""#;

/// The base environment of every pass (the runs inherit what the CLI keeps of it).
const PATH: &str = "/usr/local/bin:/usr/bin:/bin";
const LANG: &str = "C.UTF-8";

/// Limits of one module's run: generous, so that a difference is the sandbox's and not a limit's.
const RUN_LIMITS: &[&str] = &[
    "--memory",
    "4G",
    "--disk",
    "2G",
    "--max-processes",
    "1024",
    "--cpus",
    "2",
    "--max-output-chars",
    "2000",
];

/// The `user-policy` pass's network policy: an allowlist naming only a host that cannot exist
/// (`.invalid`), so the run's network is mediated (under the guard, every bind, listen and connect
/// of a socket is the host's to perform) and nothing reaches past the run's own loopback.
pub(crate) const POLICY: &str = "compat.runpython.invalid:1";

/// Where a module runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum Pass {
    /// A plain process of the interpreter (as the unprivileged user).
    Plain,
    RootFresh,
    RootForked,
    UserFresh,
    UserForked,
    /// A fresh run of the unprivileged host under a network policy ([`POLICY`]), for the modules
    /// that use sockets ([`Pass::covers`]).
    UserPolicy,
}

impl Pass {
    pub const ALL: [Pass; 6] = [
        Pass::Plain,
        Pass::RootFresh,
        Pass::RootForked,
        Pass::UserFresh,
        Pass::UserForked,
        Pass::UserPolicy,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Pass::Plain => "plain",
            Pass::RootFresh => "root-fresh",
            Pass::RootForked => "root-forked",
            Pass::UserFresh => "user-fresh",
            Pass::UserForked => "user-forked",
            Pass::UserPolicy => "user-policy",
        }
    }

    /// Whether this pass runs `module`: every pass but `user-policy` runs them all, and it the
    /// modules of [`super::POLICY_MODULES`].
    pub fn covers(self, module: &str) -> bool {
        self != Pass::UserPolicy || super::POLICY_MODULES.contains(&module)
    }

    pub fn parse(name: &str) -> Result<Pass> {
        Pass::ALL
            .into_iter()
            .find(|p| p.name() == name)
            .with_context(|| {
                format!(
                    "unknown pass {name:?}; the passes are {}",
                    Pass::ALL.map(Pass::name).join(", ")
                )
            })
    }

    fn as_user(self) -> bool {
        matches!(
            self,
            Pass::Plain | Pass::UserFresh | Pass::UserForked | Pass::UserPolicy
        )
    }

    fn forked(self) -> bool {
        matches!(self, Pass::RootForked | Pass::UserForked)
    }
}

/// One module in one pass; `matching` narrows it to these tests (a rerun).
#[derive(Debug, Clone)]
pub(crate) struct Job {
    pub pass: Pass,
    pub module: String,
    pub matching: Vec<String>,
}

/// What every job of an invocation shares.
#[derive(Debug)]
pub(crate) struct Setup {
    work: PathBuf,
    runpython: PathBuf,
    /// The interpreter runs use, as the engine finds it (`sys.executable` of a run).
    pub python: PathBuf,
    /// The unprivileged user's uid when this is root; `None`: every pass runs as this user.
    user: Option<u32>,
    /// (closed ancestor, prefix) when the prefix is not reachable by others.
    reach: Option<(PathBuf, PathBuf)>,
}

impl Setup {
    /// The work directory (driver files, homes, results), and the interpreter a run finds.
    pub fn new() -> Result<Self> {
        let work = work_dir();
        let _ = std::fs::remove_dir_all(&work);
        std::fs::create_dir_all(&work)?;
        std::fs::set_permissions(&work, std::fs::Permissions::from_mode(0o755))?;
        for (name, text) in [("driver.py", DRIVER), ("regrtest_json.py", REGRTEST_JSON)] {
            std::fs::write(work.join(name), text)?;
            std::fs::set_permissions(work.join(name), std::fs::Permissions::from_mode(0o644))?;
        }
        let results = work.join("results");
        std::fs::create_dir(&results)?;
        std::fs::set_permissions(&results, std::fs::Permissions::from_mode(0o1777))?;
        let root = crate::is_root()?;
        let user = root.then_some(crate::UNPRIVILEGED_UID);
        for (home, owner) in [("home-root", None), ("home-user", user)] {
            let dir = work.join(home);
            std::fs::create_dir(&dir)?;
            if let Some(uid) = owner {
                std::os::unix::fs::chown(&dir, Some(uid), Some(uid))?;
            }
        }
        let runpython = crate::root().join("target/debug/runpython");
        let mut setup = Self {
            work,
            runpython,
            python: PathBuf::new(),
            user,
            reach: None,
        };
        let (python, prefix) = setup.probe()?;
        setup.python = python;
        if user.is_some() {
            setup.reach = first_closed(&prefix).map(|closed| (closed, prefix));
            for path in [&setup.runpython, &setup.work] {
                if let Some(closed) = first_closed(path) {
                    bail!(
                        "cargo xtask compat: {} is not searchable by other users, so the \
                         unprivileged passes cannot reach {}; clone the repository under a \
                         directory others can enter",
                        closed.display(),
                        path.display()
                    );
                }
            }
        }
        Ok(setup)
    }

    /// The passes this host can run: the root passes only as root.
    pub fn available(&self, asked: &[Pass]) -> Vec<Pass> {
        let root = self.user.is_some();
        let kept: Vec<Pass> = asked
            .iter()
            .copied()
            .filter(|p| root || !matches!(p, Pass::RootFresh | Pass::RootForked))
            .collect();
        if kept.len() < asked.len() {
            eprintln!("==> compat: not root, so the root passes are skipped");
        }
        kept
    }

    /// The interpreter a run uses and its prefix: asked of a run, so it is found as the engine
    /// finds it (`--python`, `RUNPYTHON_PYTHON`, then `PATH`).
    fn probe(&self) -> Result<(PathBuf, PathBuf)> {
        let out = Command::new(&self.runpython)
            .args(["run", "--json", "--no-store", "--no-auto-deps", "-c"])
            .arg("import sys; [sys.executable, sys.prefix]")
            .current_dir(&self.work)
            .output()
            .with_context(|| format!("cannot start {}", self.runpython.display()))?;
        let envelope: serde_json::Value =
            serde_json::from_slice(&out.stdout).with_context(|| {
                format!(
                    "asking a run for its interpreter printed no envelope ({}): {}",
                    out.status,
                    String::from_utf8_lossy(&out.stderr)
                )
            })?;
        match envelope["return_value"].as_array().map(Vec::as_slice) {
            Some([serde_json::Value::String(exe), serde_json::Value::String(prefix)]) => {
                Ok((PathBuf::from(exe), PathBuf::from(prefix)))
            }
            _ => bail!("asking a run for its interpreter failed: {envelope}"),
        }
    }

    /// Every test module of the suite, as regrtest lists them.
    pub fn list_suite(&self) -> Result<Vec<String>> {
        let out = Command::new(&self.python)
            .args(["-m", "test", "--list-tests"])
            .current_dir(&self.work)
            .output()
            .context("cannot list the suite's modules")?;
        if !out.status.success() {
            bail!(
                "{} -m test --list-tests failed ({}): {}",
                self.python.display(),
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::trim)
            .filter(|l| l.starts_with("test"))
            .map(str::to_owned)
            .collect())
    }

    /// Runs `jobs`, `parallel` at a time, in their order.
    pub fn run_all(
        &self,
        jobs: Vec<Job>,
        parallel: usize,
        timeout: u64,
    ) -> Vec<(Job, Result<ModuleRun, String>)> {
        let total = jobs.len();
        let queue = Mutex::new(jobs.into_iter().enumerate().collect::<VecDeque<_>>());
        let done = Mutex::new(Vec::with_capacity(total));
        std::thread::scope(|scope| {
            for _ in 0..parallel {
                scope.spawn(|| loop {
                    let Some((n, job)) = queue.lock().ok().and_then(|mut q| q.pop_front()) else {
                        return;
                    };
                    let result = self.run(n, &job, timeout);
                    let shown = match &result {
                        Ok(run) => format!(
                            "{} passed, {} failed, {} skipped, exit {} in {:.1} s",
                            run.passed.len(),
                            run.failed.len(),
                            run.skipped.len(),
                            run.exit,
                            run.seconds
                        ),
                        Err(e) => format!("ERROR {}", e.lines().next().unwrap_or("")),
                    };
                    if let Ok(mut done) = done.lock() {
                        done.push((job.clone(), result));
                        eprintln!(
                            "    [{}/{total}] {} {}: {shown}",
                            done.len(),
                            job.pass.name(),
                            job.module
                        );
                    }
                });
            }
        });
        done.into_inner().unwrap_or_default()
    }

    /// One job: its command, its results.
    fn run(&self, n: usize, job: &Job, timeout: u64) -> Result<ModuleRun, String> {
        let out_file = self.work.join("results").join(format!("{n}.json"));
        let mut command = self.command(job, timeout, &out_file);
        let output = wait_with_deadline(&mut command, Duration::from_secs(timeout + 180))?;
        let stdout = String::from_utf8_lossy(&output.stdout);
        let stderr = String::from_utf8_lossy(&output.stderr);
        let tail = |s: &str| {
            s.chars()
                .rev()
                .take(2000)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect::<String>()
        };
        let results: serde_json::Value = if job.pass == Pass::Plain {
            serde_json::from_str(stdout.trim()).map_err(|e| {
                format!(
                    "the driver printed no results ({e}, {}): {}",
                    output.status,
                    tail(&stderr)
                )
            })?
        } else {
            let envelope: serde_json::Value = serde_json::from_str(stdout.trim()).map_err(|e| {
                format!(
                    "runpython printed no envelope ({e}, {}): {}",
                    output.status,
                    tail(&stderr)
                )
            })?;
            if envelope["status"] != "success" {
                return Err(format!(
                    "the run ended {}: {} {}",
                    envelope["status"],
                    envelope["error"],
                    tail(envelope["stderr"].as_str().unwrap_or(""))
                ));
            }
            let kept = std::fs::read_to_string(&out_file)
                .map_err(|e| format!("the run handed back no results ({e})"))?;
            let _ = std::fs::remove_file(&out_file);
            let call: serde_json::Value = serde_json::from_str(&kept)
                .map_err(|e| format!("its results are not JSON: {e}"))?;
            call["args"][0].clone()
        };
        let first = results
            .as_array()
            .and_then(|r| r.first())
            .ok_or_else(|| format!("no result for {}: {results}", job.module))?;
        ModuleRun::from_json(first).map_err(|e| e.to_string())
    }

    fn command(&self, job: &Job, timeout: u64, out_file: &Path) -> Command {
        let driver = self.work.join("driver.py");
        let home = self
            .work
            .join(if job.pass.as_user() && self.user.is_some() {
                "home-user"
            } else {
                "home-root"
            });
        let mut program: Vec<String> = Vec::new();
        if job.pass == Pass::Plain {
            program.push(self.python.display().to_string());
            program.push(driver.display().to_string());
            program.push(timeout.to_string());
            program.push(job.module.clone());
            for id in &job.matching {
                program.extend(["--match".into(), id.clone()]);
            }
        } else {
            let input = |v: &serde_json::Value| v.to_string();
            program.push(self.runpython.display().to_string());
            program.extend(
                [
                    "run",
                    "--json",
                    "--no-store",
                    "--no-cache",
                    "--no-auto-deps",
                    "--python",
                ]
                .map(str::to_owned),
            );
            program.push(self.python.display().to_string());
            program.extend(["--timeout".into(), (timeout + 60).to_string()]);
            program.extend(RUN_LIMITS.iter().map(|s| s.to_string()));
            if job.pass == Pass::UserPolicy {
                program.extend(["--allow-host".into(), POLICY.into()]);
            }
            program.push("--file".into());
            program.push(format!(
                "{}=regrtest_json.py",
                self.work.join("regrtest_json.py").display()
            ));
            program.push("--input".into());
            program.push(format!(
                "modules={}",
                input(&serde_json::json!([job.module]))
            ));
            program.push("--input".into());
            program.push(format!("timeout={timeout}"));
            if !job.matching.is_empty() {
                program.push("--input".into());
                program.push(format!("match={}", input(&serde_json::json!(job.matching))));
            }
            program.push("--tool".into());
            program.push(format!(
                "compat_result=cat > '{}' && echo null",
                out_file.display()
            ));
            program.push(driver.display().to_string());
        }
        let mut env = vec![
            ("PATH".to_owned(), PATH.to_owned()),
            ("HOME".to_owned(), home.display().to_string()),
            ("LANG".to_owned(), LANG.to_owned()),
        ];
        if job.pass.forked() {
            // A run that could be forked and was not is an error, not a silent fresh start.
            env.push(("RUNPYTHON_TEMPLATES".into(), "require".into()));
        }
        let mut command = match (self.user, job.pass.as_user()) {
            (Some(uid), true) => {
                let id = uid.to_string();
                let mut dropped = vec![
                    "setpriv".to_owned(),
                    "--reuid".into(),
                    id.clone(),
                    "--regid".into(),
                    id,
                    "--clear-groups".into(),
                    "--inh-caps=-all".into(),
                    "env".into(),
                    "-i".into(),
                ];
                dropped.extend(env.iter().map(|(k, v)| format!("{k}={v}")));
                dropped.extend(program);
                match &self.reach {
                    Some((closed, prefix)) => {
                        let mut c = Command::new("unshare");
                        c.args(["--mount", "--propagation", "private", "--", "sh", "-ec"])
                            .arg(REACH_PREFIX)
                            .arg("sh")
                            .arg(closed)
                            .arg(prefix)
                            .args(dropped);
                        c
                    }
                    None => {
                        let mut c = Command::new(&dropped[0]);
                        c.args(&dropped[1..]);
                        c
                    }
                }
            }
            _ => {
                let mut c = Command::new(&program[0]);
                c.args(&program[1..]).env_clear().envs(env);
                c
            }
        };
        command
            .current_dir(&self.work)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        command
    }
}

impl Drop for Setup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.work);
    }
}

/// The outermost ancestor of `path` (or `path`) others cannot search.
fn first_closed(path: &Path) -> Option<PathBuf> {
    let mut ancestors: Vec<&Path> = path.ancestors().collect();
    ancestors.reverse();
    ancestors
        .into_iter()
        .find(|a| {
            std::fs::metadata(a)
                .map(|m| m.is_dir() && m.permissions().mode() & 0o001 == 0)
                .unwrap_or(false)
        })
        .map(Path::to_owned)
}

/// Runs `command` in a process group of its own, killed with everything in it after `deadline`.
fn wait_with_deadline(
    command: &mut Command,
    deadline: Duration,
) -> Result<std::process::Output, String> {
    use std::io::Read;
    use std::os::unix::process::CommandExt;
    let mut child = command
        .process_group(0)
        .spawn()
        .map_err(|e| format!("cannot start {command:?}: {e}"))?;
    // Both pipes drain on threads of their own, so neither can fill up and stall the child.
    let drain = |pipe: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            if let Some(mut pipe) = pipe {
                let _ = pipe.read_to_end(&mut bytes);
            }
            bytes
        })
    };
    let stdout = drain(
        child
            .stdout
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let stderr = drain(
        child
            .stderr
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let started = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Ok(status),
            Ok(None) if started.elapsed() < deadline => {
                std::thread::sleep(Duration::from_millis(200))
            }
            Ok(None) => {
                kill_group(child.id());
                let _ = child.wait();
                break Err(format!("still running after {deadline:?}: killed"));
            }
            Err(e) => break Err(format!("waiting for it failed: {e}")),
        }
    };
    let output = std::process::Output {
        status: status?,
        stdout: stdout.join().unwrap_or_default(),
        stderr: stderr.join().unwrap_or_default(),
    };
    Ok(output)
}

/// SIGKILL to the process group `pid` leads (one this module started).
fn kill_group(pid: u32) {
    let _ = Command::new("kill")
        .args(["-KILL", "--", &format!("-{pid}")])
        .status();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passes_are_named_and_parsed_back() {
        for pass in Pass::ALL {
            assert_eq!(Pass::parse(pass.name()).unwrap(), pass);
        }
        let e = Pass::parse("forked").unwrap_err().to_string();
        assert!(e.contains("root-forked"), "{e}");
    }

    #[test]
    fn a_closed_ancestor_is_found_outermost_first() {
        let dir = tempfile_dir();
        let closed = dir.join("closed");
        std::fs::create_dir_all(closed.join("inner/deeper")).unwrap();
        std::fs::set_permissions(&closed, std::fs::Permissions::from_mode(0o700)).unwrap();
        std::fs::set_permissions(closed.join("inner"), std::fs::Permissions::from_mode(0o700))
            .unwrap();
        assert_eq!(
            first_closed(&closed.join("inner/deeper")),
            Some(closed.clone())
        );
        assert_eq!(first_closed(&dir), None);
        let _ = std::fs::remove_dir_all(&dir);
    }

    fn tempfile_dir() -> PathBuf {
        let dir = std::env::temp_dir().join(format!("xtask-compat-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        dir
    }
}
