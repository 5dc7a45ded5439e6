//! The sandbox around the child: a PID namespace whose init is the run (nothing the code starts
//! outlives it), user/mount/network/IPC/UTS namespaces, a dropped uid (so `RLIMIT_NPROC` holds even
//! when the host is root), Landlock, seccomp, `PR_SET_NO_NEW_PRIVS` and rlimits.
//!
//! Decide first, then build: [`decide::decide`] turns the configuration, what the kernel allows
//! ([`probe::kernel`], probed once per process) and who the host is into a [`decide::Decision`] (pure
//! data: `RunPython::isolation_report` prints it without building anything); [`prepare`] builds that
//! decision into a [`Plan`] (the uid, the mount plan, the Landlock ruleset, the rlimits, a network
//! namespace made ahead of time); [`init::enter`] runs between fork and exec and makes plain system
//! calls on the plan's precomputed C strings. A failure in any process of the run names its step
//! ([`sys::StepError`]).
//!
//! # How a run is built
//!
//! Processes of one run: S (tokio's child, host PID namespace, own group) → G (PID 1 of the run's PID
//! namespace: mounts a fresh `/proc`, reaps orphans, reports H's wait status through a shared page) → H
//! (Python). S is std's fork of the host; G and H are `CLONE_VM` children on their own stacks (no copy
//! of the host's page tables, no copy-on-write faults), H vfork-style: it execs the command line
//! prepared by [`Plan::exec_with`]. When H ends, G kills the rest of the namespace (`kill(-1)` from PID
//! 1), reports H's status and wakes S (futex on the shared page; `CLONE_CHILD_CLEARTID` wakes it too if
//! G dies first); S leaves at once with the same status (same code, or re-raises the same signal) so
//! `Child::wait` sees the real one, and the teardown of the run's memory and namespaces happens in G
//! after the host was told (S's exit kills G via PDEATHSIG). G is not dumpable: it holds a copy of the
//! host's memory.
//!
//! The filesystem view (`mounts.rs`) is a fresh tmpfs root holding only allowlisted directories
//! (read-only binds), a minimal `/dev`, the run's own `/proc` and its *scratch*, one tmpfs of
//! `disk_bytes` at `/runpython` for everything the code writes; the host's tree is detached by
//! `pivot_root`. The run's first process to enter the view sends the host a descriptor of the scratch
//! over a socket pair, before any code runs: the host reads the run's files beneath it only.
//!
//! A root host (with `drop_privileges`) takes two steps: S, still root, unshares mount and PID (and
//! network) namespaces owned by the host's user namespace and builds the view there (it can bind what
//! the run's uid could not traverse, such as `/root/.pyenv`); G, PID 1 of the new namespace, mounts
//! the run's `/proc` (the kernel allows a new proc only where one is fully visible, so before the
//! pivot), pivots into the view, then drops to a fresh uid in `[2^30, 2^30+2^24)` and unshares the user,
//! IPC and UTS namespaces, mapping inside uid/gid 1000 to that uid. A non-root host enters its user
//! namespace first (joining a network namespace made ahead of time through the user namespace that
//! owns it, see [`netns`]), maps inside 1000 to its own uid, builds the view inside, and G mounts
//! `/proc` and pivots. Either way the code is not uid 0 inside, so H's exec leaves it no capability in
//! its user namespace, and the namespace's own `max_user_namespaces` is 0 (a per-namespace limit; the
//! host's is untouched), so the code cannot make a namespace of its own to regain them, which keeps
//! netfilter and the other namespace-gated kernel surface out of reach. `RLIMIT_NPROC` is set after
//! entering the user namespace, so it counts the run's own processes. S writes itself into the run's
//! cgroup first of all. G zeroes its copy of the host's argv and environment before anything of the
//! run can read `/proc/1/cmdline`. H sets `PR_SET_NO_NEW_PRIVS`, the rlimits (AS, CPU = timeout+1 s,
//! FSIZE, NOFILE), restricts itself with Landlock (reads: the allowlist; writes: the scratch and a few
//! devices; signals and abstract sockets scoped to the run at ABI ≥ 6), installs the seccomp deny-list
//! ([`seccomp`]) and marks every descriptor above the bridge's close-on-exec.
//!
//! # Runs forked from a template
//!
//! A template ([`prepare_template`]) is built as above with its own role: root of its user namespace
//! (0 mapped to the host's uid, or for a root host the templates' namespace of the run uid range,
//! entered by G after the pivot, G then a copy of S since `setns` refuses a process sharing its
//! memory), a network namespace and (root host) a second PID namespace made inside it, and no
//! Landlock, seccomp, `no_new_privs` or limits. Each run forked from it takes every layer itself in
//! `runpython_template.py`, from what [`prepare_fork`] prepared in the host for it: the same
//! [`decide::Decision`] as a fresh run's, its cgroup, its Landlock ruleset, its seccomp program, its
//! uid. ARCHITECTURE.md ("Runs forked from a template") has the whole sequence and what a fork shares.
//!
//! # Invariants
//!
//! - Nothing a run starts outlives it: with a PID namespace G SIGKILLs every other process of the run
//!   before the host is told the run ended, and the kernel kills any left when G dies (G dies with S via
//!   PDEATHSIG, S with the host or the group kill); without one, the group is killed and, with a run
//!   uid, every process of that uid is swept ([`kill_all_of_uid`]).
//! - PDEATHSIG is set again after every fork and credential change (both clear it).
//! - S and G close every descriptor, so pipes reach end of file when H's last holder exits; H keeps
//!   only stdin, stdout, stderr, the result pipe (3) and the bridge (4).
//! - The host never follows a path the code controls (it holds the scratch's descriptor); the code
//!   sees an allowlisted view, runpython's code and environments read-only in it.
//! - The code never runs as host root when `drop_privileges` is on (root is exempt from `RLIMIT_NPROC`).
//! - Every layer that is off or refused is reported in `isolation`; nothing degrades silently.

mod cgroup;
mod clone_vm;
mod decide;
mod init;
mod landlock;
mod layers;
mod mounts;
mod netns;
mod probe;
mod seccomp;
mod sys;
mod template;
mod userns;
mod view;

use std::ffi::CString;
use std::os::fd::{OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

pub(crate) use cgroup::RunCgroup;
pub(crate) use init::enter;
pub(crate) use netns::refill as refill_netns;
pub use probe::KernelReport;
pub(crate) use sys::{
    close_from, dup_high, exit_like, pidfd_signal, pipe as pipe_pair, recv_fd, recv_with_fds,
    send_with_fds, seqpacket_pair, set_pdeathsig, Step, StepError,
};
pub(crate) use template::prepare_fork;
pub(crate) use userns::{is_run_uid, kill_all_of_uid};
pub(crate) use view::{SCRATCH, SCRATCH_DIRS};

use crate::envelope::Isolation;
use crate::error::Error;
use decide::{decide, Decision, Host};
use init::Exec;
use layers::{cgroup_for, landlock_for, rlimits_for, InnerRules};
use netns::ReadyNetns;
use sys::{getegid, geteuid};
use userns::IdMaps;
use view::{cstring, View, ViewSpec};

/// The sandbox layers a [`crate::RunPython`] asks for, and the limits it sets. Every layer can be
/// turned off (to measure it, or where a host provides its own); [`Sandbox::require`] refuses to run
/// when a requested layer is unavailable instead of degrading.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sandbox {
    /// User, PID, mount, IPC, UTS (and network, unless allowed) namespaces (default on).
    pub namespaces: bool,
    /// Share the host's network instead of an empty network namespace (default off).
    pub allow_network: bool,
    /// Landlock: writes only in the run directory and the private tmp, reads of the system, the
    /// interpreter and runpython's code only (default on).
    pub landlock: bool,
    /// Resource limits (default on).
    pub rlimits: bool,
    /// Seccomp: system calls the code never needs and whose kernel code has a long record of
    /// privilege escalations (io_uring, bpf, userfaultfd, perf events, keyrings, ...) fail with
    /// `EPERM` (default on).
    pub seccomp: bool,
    /// When the host is root: run the code as a fresh unprivileged uid per run (default on). Without it
    /// `RLIMIT_NPROC` is not enforced and a fork bomb is only stopped by the timeout.
    pub drop_privileges: bool,
    /// Refuse to run (an `Err`) when a requested layer is unavailable (default off: degrade and report).
    pub require: bool,
    /// `RLIMIT_AS` of each of the run's processes (default 4 GiB).
    pub memory_bytes: u64,
    /// The run's total memory: every process, shared memory, `memfd`s and the scratch's pages
    /// together (default 4 GiB). Enforced by a cgroup per run where the host offers one (see
    /// [`Sandbox::cgroups`]); elsewhere `memfd_create` and SysV shared memory are refused instead and
    /// `isolation.missing` says so.
    pub run_memory_bytes: u64,
    /// Everything the run may write in total, its working directory, `/tmp` and `/dev/shm` together
    /// (default 1 GiB): one tmpfs of this size (needs a mount namespace).
    pub disk_bytes: u64,
    /// A cgroup per run for its total memory and processes (default on): cgroup v2 where this host may
    /// create cgroups with the memory controller (a delegated subtree), else the v1 `memory` and
    /// `pids` hierarchies where they are writable.
    pub cgroups: bool,
    /// `RLIMIT_FSIZE`: the largest file the code may write (default 1 GiB).
    pub file_size_bytes: u64,
    /// `RLIMIT_NOFILE` (default 1024).
    pub open_files: u64,
    /// `RLIMIT_NPROC`: processes and threads inside the run (default 256; its cgroup, when there is
    /// one, allows a few more for the run's own init).
    pub processes: u64,
    /// More directories the code may read (a prepared environment, data).
    pub read_paths: Vec<PathBuf>,
}

impl Default for Sandbox {
    fn default() -> Self {
        Self {
            namespaces: true,
            allow_network: false,
            landlock: true,
            rlimits: true,
            seccomp: true,
            drop_privileges: true,
            require: false,
            memory_bytes: 4 << 30,
            run_memory_bytes: 4 << 30,
            disk_bytes: 1 << 30,
            cgroups: true,
            file_size_bytes: 1 << 30,
            open_files: 1024,
            processes: 256,
            read_paths: Vec::new(),
        }
    }
}

impl Sandbox {
    /// Every layer off: the child only gets its process group, PDEATHSIG and a scrubbed environment.
    pub fn off() -> Self {
        Self {
            namespaces: false,
            landlock: false,
            rlimits: false,
            seccomp: false,
            drop_privileges: false,
            cgroups: false,
            ..Self::default()
        }
    }
}

/// Everything the child needs, prepared in the host. Used between fork and exec by [`enter`].
#[derive(Debug)]
pub(crate) struct Plan {
    /// The filesystem view is built as root before dropping privileges (root host) instead of after
    /// entering the user namespace.
    view_as_root: bool,
    view: Option<View>,
    drop_to: Option<(u32, u32)>,
    /// A template of a root host: the user namespace it enters (by `setns`, as root of it) instead
    /// of making one ([`userns::template_userns`]).
    join_userns: Option<OwnedFd>,
    unshare: libc::c_int,
    ids: IdMaps,
    /// Forbid user namespaces below the run's.
    forbid_nested_userns: bool,
    /// Installed by H last, just before exec.
    seccomp: Option<&'static seccompiler::BpfProgram>,
    /// H sets `PR_SET_NO_NEW_PRIVS` (not a template, whose exec as root of its namespace keeps its
    /// capabilities, and whose runs each set it).
    no_new_privs: bool,
    nproc: Option<u64>,
    /// Limits set in the interpreter just before exec.
    rlimits: Vec<(libc::__rlimit_resource_t, u64)>,
    landlock: Option<OwnedFd>,
    /// Landlock rules on directories that only exist inside the run (its scratch, its `/proc`).
    landlock_inner: InnerRules,
    /// A fresh, empty network namespace created ahead of time by the host ([`netns::take`]); S joins
    /// it instead of creating one (`CLONE_NEWNET` is then not in `unshare`).
    netns: Option<ReadyNetns>,
    /// The run's cgroup; S writes itself into it first. Taken by the spawner, which keeps it for the
    /// run's life (see [`Plan::take_cgroup`]).
    cgroup: Option<RunCgroup>,
    cgroup_procs: [RawFd; 2],
    /// The child's end of the socket the scratch's descriptor is handed to the host through.
    handoff: Option<OwnedFd>,
    /// Where the host's argv and environment lie in memory (copied into S by the fork): zeroed before
    /// the run's init, which shares S's memory, can show them in `/proc/1/cmdline`.
    host_args: (usize, usize),
    /// The interpreter's command line, when the caller lets H exec it (see [`Plan::exec_with`]).
    exec: Option<Exec>,
    /// The working directory when there is no view (the host's run directory).
    work_dir: CString,
    /// The uid whose every process is killed at the end when there is no PID namespace.
    pub(crate) sweep_uid: Option<u32>,
    /// What is in force, for the envelope.
    pub(crate) report: Isolation,
}

fn host() -> Host {
    Host {
        euid: geteuid(),
        egid: getegid(),
    }
}

fn canonical(p: &Path) -> PathBuf {
    std::fs::canonicalize(p).unwrap_or_else(|_| p.to_owned())
}

/// The directories the code reads: the interpreter's prefix (of the path given, and of the binary it
/// resolves to), runpython's code dir, `read_paths`, and `extra_reads` (the run's environment).
fn read_dirs(
    config: &Sandbox,
    python: &Path,
    code_dir: &Path,
    extra_reads: &[&Path],
) -> Vec<PathBuf> {
    let prefix = |exe: &Path| {
        exe.parent()
            .and_then(Path::parent)
            .map(canonical)
            .unwrap_or_else(|| PathBuf::from("/usr"))
    };
    let mut dirs = vec![prefix(python)];
    if let Ok(real) = std::fs::canonicalize(python) {
        let real_prefix = prefix(&real);
        if !dirs.contains(&real_prefix) {
            dirs.push(real_prefix);
        }
    }
    dirs.push(canonical(code_dir));
    dirs.extend(config.read_paths.iter().map(|p| canonical(p)));
    dirs.extend(extra_reads.iter().map(|p| canonical(p)));
    dirs
}

/// Where this process's argv and environment strings lie (fields 48–51 of `/proc/self/stat`), read
/// once: the same addresses in every fork of it.
fn host_args() -> (usize, usize) {
    static ARGS: OnceLock<(usize, usize)> = OnceLock::new();
    *ARGS.get_or_init(|| {
        let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
        // The command name (field 2) may hold spaces: count fields after its closing parenthesis.
        let fields: Vec<usize> = stat
            .rsplit_once(')')
            .map(|(_, rest)| {
                rest.split_whitespace()
                    .map(|f| f.parse().unwrap_or(0))
                    .collect()
            })
            .unwrap_or_default();
        // After ')' the fields start at 3: arg_start is field 48, env_end field 51.
        match (fields.get(45), fields.get(48)) {
            (Some(&start), Some(&end)) if start < end && end - start < (64 << 20) => (start, end),
            _ => (0, 0),
        }
    })
}

/// What an interpreter is prepared for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    /// A run's own interpreter (cold or pooled): every layer, the code runs in it.
    Run,
    /// A template runs are forked from: the filesystem view, no network (unless runs have it), a
    /// cgroup of its own, and root of its own user namespace (the capabilities to make each run's
    /// namespaces); no Landlock, seccomp or limits, which each run takes for itself.
    Template,
}

/// Decides the run's layers and prepares them: the uid, the filesystem view, the Landlock ruleset,
/// the rlimits, the cgroup, a ready network namespace.
pub(crate) fn prepare(
    config: &Sandbox,
    python: &Path,
    code_dir: &Path,
    extra_reads: &[&Path],
    run_dir: &Path,
    timeout: Duration,
) -> Result<Plan, Error> {
    prepare_as(
        Role::Run,
        config,
        python,
        code_dir,
        extra_reads,
        run_dir,
        timeout,
    )
}

/// Prepares a template's interpreter ([`Role::Template`]); `Err(TemplateUnavailable)` when runs
/// cannot be forked under this configuration on this machine.
pub(crate) fn prepare_template(
    config: &Sandbox,
    python: &Path,
    code_dir: &Path,
    extra_reads: &[&Path],
    run_dir: &Path,
) -> Result<Plan, Error> {
    prepare_as(
        Role::Template,
        config,
        python,
        code_dir,
        extra_reads,
        run_dir,
        Duration::ZERO,
    )
}

fn prepare_as(
    role: Role,
    config: &Sandbox,
    python: &Path,
    code_dir: &Path,
    extra_reads: &[&Path],
    run_dir: &Path,
    timeout: Duration,
) -> Result<Plan, Error> {
    let kernel = probe::kernel();
    let read_dirs = read_dirs(config, python, code_dir, extra_reads);
    let mut decision = decide(config, kernel, host(), || {
        read_dirs.iter().find_map(|d| view::first_untraversable(d))
    });
    let template = role == Role::Template;
    let root_host = geteuid() == 0;
    let join_userns = if template {
        decision
            .template_eligible(host())
            .map_err(Error::TemplateUnavailable)?;
        match root_host {
            true => Some(
                userns::template_userns()
                    .and_then(|fd| fd.try_clone().and_then(dup_high).map_err(|e| e.to_string()))
                    .map_err(Error::TemplateUnavailable)?,
            ),
            false => None,
        }
    } else {
        None
    };
    let run_dir = canonical(run_dir);
    let drop_to = (decision.drop_privileges && !template).then(|| {
        let uid = userns::random_run_uid();
        (uid, uid)
    });
    let (uid, gid) = drop_to.unwrap_or_else(|| (geteuid(), getegid()));
    // A root host's template is root of the templates' user namespace, whose 0 is the first uid of
    // the run range: its scratch is that uid's.
    let view_owner = match (template, root_host) {
        (true, true) => Some((userns::RUN_UID_BASE, userns::RUN_UID_BASE)),
        _ => drop_to,
    };

    let view = if decision.view {
        let root = run_dir.join("root");
        std::fs::create_dir(&root)
            .map_err(|source| Error::io("creating the run's root mount point", &root, source))?;
        Some(view::plan(&ViewSpec {
            root: &root,
            read_paths: &read_dirs,
            disk_bytes: config.disk_bytes,
            owner: view_owner,
            pid_ns: decision.pid_ns,
            allow_network: config.allow_network,
        })?)
    } else {
        None
    };

    let (landlock, landlock_inner) = match role {
        Role::Run => landlock_for(&mut decision, &read_dirs, Some(&run_dir), view.is_some())?,
        Role::Template => (None, Vec::new()),
    };
    let cgroup = cgroup_for(&mut decision, config);

    if config.require && !template && !decision.missing.is_empty() {
        return Err(Error::IsolationUnavailable(decision.missing.join("; ")));
    }

    let cpu = cpu_seconds(timeout);
    let rlimits = if decision.rlimits && !template {
        rlimits_for(config, cpu)
    } else {
        Vec::new()
    };

    if let (Some((uid, gid)), None) = (drop_to, &view) {
        // Without a view the code works in the host's run directory: it must be the run uid's.
        for path in [
            run_dir.clone(),
            run_dir.join("work"),
            run_dir.join("saved"),
            run_dir.join("home"),
        ] {
            match std::os::unix::fs::lchown(&path, Some(uid), Some(gid)) {
                Err(e) if e.kind() == std::io::ErrorKind::NotFound && path != run_dir => {}
                r => r.map_err(|source| {
                    Error::io("handing the run directory to the run's uid", &path, source)
                })?,
            }
        }
    }

    let report = decision.report(config, uid, cpu);
    let Decision {
        mut unshare,
        pid_ns,
        forbid_nested_userns,
        seccomp,
        seccomp_extra,
        nproc,
        ..
    } = decision;
    // A network namespace made ahead of time saves the run the kernel's ~1 ms to create one. A root
    // host's S joins it before dropping privileges (joining needs CAP_SYS_ADMIN over the namespace's
    // owner, the host's user namespace); a non-root host's S first joins the user namespace made
    // with it, and the run's own user namespace is made inside that one (ids mapped from its 0).
    // Not for a template: it makes its runs' network namespaces from its own user namespace and
    // returns to its own network namespace after each, which it may only when that one is owned by
    // its user namespace too (made by its own unshare).
    let netns =
        if unshare & libc::CLONE_NEWNET != 0 && (root_host || kernel.owned_netns) && !template {
            netns::take()
        } else {
            None
        };
    if netns.is_some() {
        unshare &= !libc::CLONE_NEWNET;
    }
    let (outer_uid, outer_gid) = match netns.as_ref().and_then(|n| n.owner.as_ref()) {
        Some(_) => (0, 0),
        None => (uid, gid),
    };
    // The code is never root inside its namespace; a template is (it keeps its capabilities).
    let inside = if template { 0 } else { userns::INSIDE_ID };
    let ids = IdMaps::mapping(inside, outer_uid, outer_gid);
    let mut cgroup_procs = [-1; 2];
    if let Some(cg) = &cgroup {
        for (slot, fd) in cgroup_procs.iter_mut().zip(cg.procs_fds()) {
            *slot = fd;
        }
    }
    Ok(Plan {
        // A root host builds the view as root (it binds what a run's uid, or the templates', could
        // not traverse); its template then enters the templates' user namespace in its init.
        view_as_root: drop_to.is_some() || (template && root_host),
        view,
        drop_to,
        join_userns,
        unshare,
        ids,
        forbid_nested_userns: forbid_nested_userns && !template,
        seccomp: if seccomp && !template {
            seccomp::filter(seccomp_extra)
        } else {
            None
        },
        no_new_privs: !template,
        nproc: nproc.filter(|_| !template),
        rlimits,
        landlock,
        landlock_inner,
        netns,
        cgroup,
        cgroup_procs,
        handoff: None,
        host_args: host_args(),
        exec: None,
        work_dir: cstring(&run_dir.join("work"))?,
        sweep_uid: drop_to.filter(|_| !pid_ns).map(|(uid, _)| uid),
        report,
    })
}

/// `RLIMIT_CPU` for a run of `timeout`: one second more than its wall-clock limit.
fn cpu_seconds(timeout: Duration) -> u64 {
    timeout.as_secs() + 1
}

/// What this host's kernel allows (probed once per process).
pub(crate) fn kernel_report() -> KernelReport {
    probe::kernel().report()
}

/// What [`prepare`] would decide for `config`, without building anything (for
/// `RunPython::isolation_report`). The uid is the host's, or the first of the run range when runs get a
/// fresh one. With `templates`, runs are said to start from a template where they can.
pub(crate) fn report(
    config: &Sandbox,
    timeout: Duration,
    templates: bool,
) -> Result<Isolation, Error> {
    let read_dirs = read_dirs(
        config,
        Path::new("/usr/bin/python3"),
        Path::new("/usr"),
        &[],
    );
    let decision = decide(config, probe::kernel(), host(), || {
        read_dirs.iter().find_map(|d| view::first_untraversable(d))
    });
    if config.require && !decision.missing.is_empty() {
        return Err(Error::IsolationUnavailable(decision.missing.join("; ")));
    }
    let uid = if decision.drop_privileges {
        userns::RUN_UID_BASE
    } else {
        geteuid()
    };
    let mut report = decision.report(config, uid, cpu_seconds(timeout));
    if templates && decision.template_eligible(host()).is_ok() {
        report.start = decide::START_TEMPLATE.into();
    }
    Ok(report)
}

/// Whether runs under `config` can be forked from a template on this machine, or why not.
pub(crate) fn template_eligible(config: &Sandbox) -> Result<(), String> {
    let decision = decide(config, probe::kernel(), host(), || None);
    decision.template_eligible(host())
}

impl Plan {
    /// The run's cgroup, which must live as long as the run (its drop removes it).
    pub(crate) fn take_cgroup(&mut self) -> Option<RunCgroup> {
        self.cgroup.take()
    }

    /// The socket the run's first process hands the scratch's descriptor to the host through (the
    /// child's end; the host keeps the other). Only with a filesystem view.
    pub(crate) fn set_handoff(&mut self, child_end: OwnedFd) {
        self.handoff = Some(child_end);
    }

    /// What a root host's template makes only after entering its user namespace (in its init, G):
    /// its network namespace and a second PID namespace, whose PID 1 the template is. It returns to
    /// both after making each run's (a network namespace made ahead of time, the PID namespace its
    /// next child starts), which `setns` allows only into namespaces its user namespace owns.
    fn template_late(&self) -> libc::c_int {
        match &self.join_userns {
            Some(_) => self.unshare & (libc::CLONE_NEWNET | libc::CLONE_NEWPID),
            None => 0,
        }
    }

    /// Whether the run has a filesystem view (and so hands its scratch to the host).
    pub(crate) fn has_view(&self) -> bool {
        self.view.is_some()
    }

    /// Lets the run's processes G and H share S's memory instead of copying it (`CLONE_VM`): H then
    /// execs `program` with `args` and `env` itself, as std would have.
    pub(crate) fn exec_with(
        &mut self,
        program: &Path,
        args: &[&std::ffi::OsStr],
        env: &[(String, String)],
    ) -> Result<(), Error> {
        let nul = |what: &str| {
            Error::InvalidInput(format!("{what} contains a NUL byte; pass one without"))
        };
        let program = cstring(program)?;
        let mut strings = vec![program.clone()];
        for arg in args {
            strings.push(CString::new(arg.as_bytes()).map_err(|_| nul("an argument"))?);
        }
        let argc = strings.len();
        for (k, v) in env {
            strings.push(
                CString::new(format!("{k}={v}"))
                    .map_err(|_| nul(&format!("the environment variable {k}")))?,
            );
        }
        let mut argv: Vec<_> = strings[..argc].iter().map(|s| s.as_ptr()).collect();
        argv.push(std::ptr::null());
        let mut envp: Vec<_> = strings[argc..].iter().map(|s| s.as_ptr()).collect();
        envp.push(std::ptr::null());
        self.exec = Some(Exec {
            program,
            _strings: strings,
            argv,
            envp,
        });
        Ok(())
    }
}
