//! A cgroup per run: the run's total memory (shared memory, `memfd`, tmpfs pages and every process
//! together, which `RLIMIT_AS` cannot count), its number of processes, and its share of the CPU (a
//! quota of CPUs per period, so a run of a hundred busy processes takes no more than its CPUs from
//! the runs beside it).
//!
//! cgroup v2 where this host may create cgroups with the `memory` controller (a delegated subtree:
//! `Delegate=yes`, or root); else the v1 `memory` (and `pids`) hierarchies where they are mounted and
//! writable (root on hosts that still mount v1). Found once per process. The host makes the run's
//! cgroup before the child starts and opens its `cgroup.procs`; the run's first process writes itself
//! there before anything else, so every process of the run is in it. When the run ends a reaper thread
//! kills what is left in it and removes it; the cgroups of hosts that died are swept once per process.

use std::fs;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use super::sys::{AtStep, Step, StepError};

/// Run cgroups are named `runpython-<host pid>-<random>`.
const PREFIX: &str = "runpython-";

/// How the host can make run cgroups.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Hierarchy {
    /// cgroup v2: run cgroups are made in `parent` (whose `cgroup.subtree_control` enables `memory`
    /// and `pids`, and `cpu` when `cpu` says it is offered).
    V2 { parent: PathBuf, cpu: bool },
    /// cgroup v1: run cgroups in the `memory` hierarchy (and the `pids` and `cpu` ones when writable).
    V1 {
        memory: PathBuf,
        pids: Option<PathBuf>,
        cpu: Option<PathBuf>,
    },
}

impl Hierarchy {
    /// `"cgroup-v2"` or `"cgroup-v1"`, for the isolation report.
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Hierarchy::V2 { .. } => "cgroup-v2",
            Hierarchy::V1 { .. } => "cgroup-v1",
        }
    }

    /// Whether runs get a CPU quota here, or why not.
    pub(crate) fn cpu(&self) -> Result<(), String> {
        match self {
            Hierarchy::V2 { cpu: true, .. } | Hierarchy::V1 { cpu: Some(_), .. } => Ok(()),
            Hierarchy::V2 { parent, .. } => Err(format!(
                "cgroup v2 at {} offers no cpu controller",
                parent.display()
            )),
            Hierarchy::V1 { .. } => Err("no writable cgroup v1 cpu hierarchy".into()),
        }
    }
}

/// The period of a run's CPU quota: its CPUs × this much time per this much time.
const CPU_PERIOD_US: u64 = 100_000;

/// The hierarchy runs get cgroups in, or why there is none. Found once per process.
pub(crate) fn hierarchy() -> &'static Result<Hierarchy, String> {
    static FOUND: OnceLock<Result<Hierarchy, String>> = OnceLock::new();
    FOUND.get_or_init(|| {
        let own = fs::read_to_string("/proc/self/cgroup")
            .map_err(|e| format!("/proc/self/cgroup: {e}"))?;
        let mounts = fs::read_to_string("/proc/self/mountinfo")
            .map_err(|e| format!("/proc/self/mountinfo: {e}"))?;
        let found = find(&own, &mounts);
        if let Ok(h) = &found {
            let parents = match h {
                Hierarchy::V2 { parent, .. } => vec![parent.clone()],
                Hierarchy::V1 { memory, pids, cpu } => std::iter::once(memory.clone())
                    .chain(pids.clone())
                    .chain(cpu.clone())
                    .collect(),
            };
            sweep(&parents);
        }
        found
    })
}

/// The mount point of each cgroup hierarchy in `mountinfo`: (mount point, `None` for v2 or the v1
/// controllers it holds).
fn cgroup_mounts(mountinfo: &str) -> Vec<(PathBuf, Option<Vec<String>>)> {
    mountinfo
        .lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let mount_point = left.split_whitespace().nth(4)?;
            let mut right = right.split_whitespace();
            let fstype = right.next()?;
            let _source = right.next()?;
            let options = right.next().unwrap_or("");
            match fstype {
                "cgroup2" => Some((PathBuf::from(mount_point), None)),
                "cgroup" => Some((
                    PathBuf::from(mount_point),
                    Some(options.split(',').map(str::to_owned).collect()),
                )),
                _ => None,
            }
        })
        .collect()
}

/// This process's cgroup in each hierarchy, from `/proc/self/cgroup`: (controllers, path), with an
/// empty controller list for v2.
fn own_cgroups(text: &str) -> Vec<(Vec<String>, String)> {
    text.lines()
        .filter_map(|line| {
            let mut parts = line.splitn(3, ':');
            let _id = parts.next()?;
            let controllers = parts.next()?;
            let path = parts.next()?;
            let list = if controllers.is_empty() {
                Vec::new()
            } else {
                controllers.split(',').map(str::to_owned).collect()
            };
            Some((list, path.to_owned()))
        })
        .collect()
}

fn writable(dir: &Path) -> bool {
    nix::unistd::access(dir, nix::unistd::AccessFlags::W_OK).is_ok()
}

fn find(own: &str, mountinfo: &str) -> Result<Hierarchy, String> {
    let mounts = cgroup_mounts(mountinfo);
    let own = own_cgroups(own);
    let mut why = Vec::new();
    // v2: our own cgroup, when it offers the memory controller and we may write there.
    if let (Some((mount, _)), Some((_, path))) = (
        mounts.iter().find(|(_, c)| c.is_none()),
        own.iter().find(|(c, _)| c.is_empty()),
    ) {
        let dir = mount.join(path.trim_start_matches('/'));
        let controllers = fs::read_to_string(dir.join("cgroup.controllers")).unwrap_or_default();
        if !controllers.split_whitespace().any(|c| c == "memory") {
            why.push(format!(
                "cgroup v2 at {} offers no memory controller",
                dir.display()
            ));
        } else if !writable(&dir) {
            why.push(format!(
                "cgroup v2 at {} is not delegated to this user",
                dir.display()
            ));
        } else {
            let cpu = controllers.split_whitespace().any(|c| c == "cpu");
            match enable_v2(&dir, cpu) {
                Ok(parent) => return Ok(Hierarchy::V2 { parent, cpu }),
                Err(e) => why.push(format!("cgroup v2 at {}: {e}", dir.display())),
            }
        }
    } else {
        why.push("no cgroup v2 hierarchy".into());
    }
    // v1: the memory hierarchy (and pids), where we may write.
    let v1 = |controller: &str| -> Option<PathBuf> {
        let (mount, _) = mounts.iter().find(|(_, c)| {
            c.as_ref()
                .is_some_and(|c| c.iter().any(|x| x == controller))
        })?;
        let (_, path) = own
            .iter()
            .find(|(c, _)| c.iter().any(|x| x == controller))?;
        Some(mount.join(path.trim_start_matches('/')))
    };
    match v1("memory") {
        Some(memory) if writable(&memory) => Ok(Hierarchy::V1 {
            memory,
            pids: v1("pids").filter(|p| writable(p)),
            cpu: v1("cpu").filter(|p| writable(p)),
        }),
        Some(memory) => {
            why.push(format!(
                "cgroup v1 memory at {} is not writable by this user",
                memory.display()
            ));
            Err(why.join("; "))
        }
        None => {
            why.push("no cgroup v1 memory hierarchy".into());
            Err(why.join("; "))
        }
    }
}

/// Makes `dir` (our own v2 cgroup, delegated to us) able to hold run cgroups with the memory and
/// pids controllers. A cgroup with processes cannot enable controllers for its children, so this
/// process first moves into a leaf of its own (`runpython-host-<pid>`), as systemd's delegation
/// documentation prescribes.
fn enable_v2(dir: &Path, cpu: bool) -> io::Result<PathBuf> {
    let control = dir.join("cgroup.subtree_control");
    let wanted = if cpu {
        "+memory +pids +cpu"
    } else {
        "+memory +pids"
    };
    let enabled = |d: &Path| {
        fs::read_to_string(d.join("cgroup.subtree_control"))
            .map(|s| {
                let on: Vec<&str> = s.split_whitespace().collect();
                on.contains(&"memory") && (!cpu || on.contains(&"cpu"))
            })
            .unwrap_or(false)
    };
    if enabled(dir) {
        return Ok(dir.to_owned());
    }
    match fs::write(&control, wanted) {
        Ok(()) => return Ok(dir.to_owned()),
        Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {}
        Err(e) => return Err(e),
    }
    let leaf = dir.join(format!("{PREFIX}host-{}", std::process::id()));
    match fs::create_dir(&leaf) {
        Err(e) if e.kind() != io::ErrorKind::AlreadyExists => return Err(e),
        _ => {}
    }
    // Every process of our cgroup that is ours moves; a cgroup holding others' processes stays busy
    // and the write below fails, which is then the answer.
    fs::write(leaf.join("cgroup.procs"), std::process::id().to_string())?;
    fs::write(&control, wanted)?;
    Ok(dir.to_owned())
}

/// Removes the run cgroups of hosts that are gone (and empty), once per process.
fn sweep(parents: &[PathBuf]) {
    for parent in parents {
        let Ok(entries) = fs::read_dir(parent) else {
            continue;
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(pid) = name
                .to_str()
                .and_then(|n| n.strip_prefix(PREFIX))
                .and_then(|rest| rest.split('-').next())
                .and_then(|pid| pid.parse::<i32>().ok())
            else {
                continue;
            };
            let gone = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None)
                == Err(nix::errno::Errno::ESRCH);
            if gone {
                let _ = fs::remove_dir(entry.path()); // refused while processes remain in it
            }
        }
    }
}

/// One run's cgroup(s). Dropping it hands them to the reaper, which removes them once empty.
#[derive(Debug)]
pub struct RunCgroup {
    dirs: Vec<PathBuf>,
    /// Each cgroup's `tasks` (v1) or `cgroup.procs` (v2), opened for the run's first process to write
    /// itself into.
    procs: Vec<OwnedFd>,
    /// Where the OOM kills are counted (`memory.events` or `memory.oom_control`).
    oom_file: PathBuf,
}

impl RunCgroup {
    /// Makes a run's cgroup with `memory_bytes` for everything the run holds, at most `processes`,
    /// and `cpu_millis` thousandths of a CPU (none where the hierarchy has no cpu controller).
    pub(crate) fn create(
        h: &Hierarchy,
        memory_bytes: u64,
        processes: u64,
        cpu_millis: u64,
    ) -> io::Result<Self> {
        let mut random = [0u8; 6];
        let _ = getrandom::fill(&mut random);
        let name = format!(
            "{PREFIX}{}-{}",
            std::process::id(),
            random
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect::<String>()
        );
        let mut made = RunCgroup {
            dirs: Vec::new(),
            procs: Vec::new(),
            oom_file: PathBuf::new(),
        };
        // Small slack over the run's own limit for its init and supervisor processes.
        let pids_max = (processes + 8).to_string();
        let quota_us = (cpu_millis.max(1) * CPU_PERIOD_US / 1000).max(1000);
        match h {
            Hierarchy::V2 { parent, cpu } => {
                let dir = parent.join(&name);
                fs::create_dir(&dir)?;
                made.dirs.push(dir.clone());
                fs::write(dir.join("memory.max"), memory_bytes.to_string())?;
                // Swap would let the run hold more than its limit.
                let _ = fs::write(dir.join("memory.swap.max"), "0");
                fs::write(dir.join("pids.max"), &pids_max)?;
                if *cpu {
                    fs::write(dir.join("cpu.max"), format!("{quota_us} {CPU_PERIOD_US}"))?;
                }
                made.oom_file = dir.join("memory.events");
            }
            Hierarchy::V1 { memory, pids, cpu } => {
                let dir = memory.join(&name);
                fs::create_dir(&dir)?;
                made.dirs.push(dir.clone());
                fs::write(dir.join("memory.limit_in_bytes"), memory_bytes.to_string())?;
                let _ = fs::write(
                    dir.join("memory.memsw.limit_in_bytes"),
                    memory_bytes.to_string(),
                );
                made.oom_file = dir.join("memory.oom_control");
                if let Some(pids) = pids {
                    let dir = pids.join(&name);
                    fs::create_dir(&dir)?;
                    made.dirs.push(dir.clone());
                    fs::write(dir.join("pids.max"), &pids_max)?;
                }
                if let Some(cpu) = cpu {
                    let dir = cpu.join(&name);
                    fs::create_dir(&dir)?;
                    made.dirs.push(dir.clone());
                    fs::write(dir.join("cpu.cfs_period_us"), CPU_PERIOD_US.to_string())?;
                    fs::write(dir.join("cpu.cfs_quota_us"), quota_us.to_string())?;
                }
            }
        }
        // v1: the first process joins through `tasks`, which moves only the writing thread (that
        // process is single-threaded: it was just forked). `cgroup.procs` moves a whole thread group
        // under the kernel's global threadgroup lock, whose writer waits for a full RCU grace period
        // whenever no other migration happened lately: ~12 ms of every run started alone, here.
        // v2 has no such file outside threaded cgroups; hosts there can mount with `favordynmods`.
        let join_file = match h {
            Hierarchy::V1 { .. } => "tasks",
            Hierarchy::V2 { .. } => "cgroup.procs",
        };
        for dir in &made.dirs {
            let file = fs::OpenOptions::new()
                .write(true)
                .open(dir.join(join_file))?;
            made.procs.push(super::sys::dup_high(OwnedFd::from(file))?);
        }
        Ok(made)
    }

    /// The run's cgroup directories (one on v2; one per controller on v1).
    pub fn dirs(&self) -> &[PathBuf] {
        &self.dirs
    }

    /// The descriptors the run's first process writes itself into.
    pub fn procs_fds(&self) -> impl Iterator<Item = std::os::fd::RawFd> + '_ {
        self.procs.iter().map(AsRawFd::as_raw_fd)
    }

    /// Whether the kernel killed a process of the run for going over its memory limit.
    pub fn oom_killed(&self) -> bool {
        fs::read_to_string(&self.oom_file)
            .ok()
            .and_then(|text| {
                text.lines().find_map(|l| {
                    l.strip_prefix("oom_kill ")
                        .and_then(|n| n.trim().parse::<u64>().ok())
                })
            })
            .is_some_and(|n| n > 0)
    }
}

impl Drop for RunCgroup {
    fn drop(&mut self) {
        reap(std::mem::take(&mut self.dirs));
    }
}

/// Writes the calling process into the run's cgroup(s). Async-signal-safe.
pub(crate) fn join(fds: &[std::os::fd::RawFd]) -> Result<(), StepError> {
    for &fd in fds {
        // SAFETY: a write of a constant buffer to a descriptor the host opened.
        let n = unsafe { libc::write(fd, b"0".as_ptr().cast(), 1) };
        super::sys::cvt(n as libc::c_int)
            .map(drop)
            .at(Step::JoinCgroup)?;
    }
    Ok(())
}

/// Removes `dirs` on a thread of its own, once their processes are gone (killing stragglers); pending
/// until then ([`crate::cleanup::settle`]).
fn reap(dirs: Vec<PathBuf>) {
    if dirs.is_empty() {
        return;
    }
    type Job = (Vec<PathBuf>, crate::cleanup::Pending);
    static REAPER: OnceLock<Option<std::sync::mpsc::Sender<Job>>> = OnceLock::new();
    let sender = REAPER.get_or_init(|| {
        let (tx, rx) = std::sync::mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("runpython-cgroups".into())
            .spawn(move || {
                while let Ok((dirs, _pending)) = rx.recv() {
                    remove_when_empty(&dirs);
                }
            })
            .ok()
            .map(|_| tx)
    });
    let job = (dirs, crate::cleanup::Pending::new());
    // Without a reaper thread, the dropping thread removes them itself.
    let unsent = match sender {
        Some(tx) => tx.send(job).err().map(|unsent| unsent.0),
        None => Some(job),
    };
    if let Some((dirs, _pending)) = unsent {
        remove_when_empty(&dirs);
    }
}

fn remove_when_empty(dirs: &[PathBuf]) {
    let deadline = Instant::now() + Duration::from_secs(10);
    // The run's last processes are usually gone within a millisecond of its end, and a one-shot
    // process waits for this before it exits: the pause between tries starts short and doubles.
    let mut pause = Duration::from_micros(50);
    for dir in dirs {
        loop {
            if fs::remove_dir(dir).is_ok() || !dir.exists() {
                break;
            }
            // What is left of the run (its init is being torn down) is killed, then tried again.
            let _ = fs::write(dir.join("cgroup.kill"), "1");
            if let Ok(pids) = fs::read_to_string(dir.join("cgroup.procs")) {
                for pid in pids.lines().filter_map(|p| p.trim().parse::<i32>().ok()) {
                    let _ = nix::sys::signal::kill(
                        nix::unistd::Pid::from_raw(pid),
                        nix::sys::signal::Signal::SIGKILL,
                    );
                }
            }
            if Instant::now() > deadline {
                break;
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(5));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTINFO: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";

    #[test]
    fn mounts_and_own_cgroups_are_parsed() {
        let mounts = cgroup_mounts(MOUNTINFO);
        assert_eq!(mounts.len(), 3);
        assert_eq!(mounts[2], (PathBuf::from("/sys/fs/cgroup/unified"), None));
        assert_eq!(
            mounts[0].1.as_deref(),
            Some(&["rw".to_owned(), "memory".to_owned()][..])
        );
        let own = own_cgroups("8:pids:/\n4:memory:/a/b\n0::/\n");
        assert_eq!(own[1], (vec!["memory".to_owned()], "/a/b".to_owned()));
        assert_eq!(own[2], (Vec::new(), "/".to_owned()));
    }

    #[test]
    fn a_v2_hierarchy_without_a_memory_controller_is_explained() {
        let e = find(
            "0::/nowhere-runpython-test\n",
            "41 31 0:38 / /nonexistent/cg rw - cgroup2 cgroup2 rw\n",
        )
        .unwrap_err();
        assert!(e.contains("offers no memory controller"), "{e}");
        assert!(e.contains("no cgroup v1 memory hierarchy"), "{e}");
    }
}
