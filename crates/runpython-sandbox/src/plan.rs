//! Deciding and preparing: a [`Plan`] is the decision built into what the sandbox's processes need
//! (the uid, the filesystem view, the Landlock ruleset, the rlimits, the cgroup, a ready network
//! namespace), prepared in the host before the fork.

use std::ffi::CString;
use std::os::fd::{OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use crate::cgroup::RunCgroup;
use crate::decide::{self, decide, Decision, Host};
use crate::error::Error;
use crate::layers::{cgroup_for, landlock_for, rlimits_for, InnerRules};
use crate::netns::{self, ReadyNetns};
use crate::probe::{self, KernelReport};
use crate::report::Isolation;
use crate::sys::{dup_high, getegid, geteuid};
use crate::userns::{self, IdMaps};
use crate::view::{self, cstring, View, ViewSpec};
use crate::{seccomp, Network, Sandbox};

/// The most hierarchies a run's cgroup spans (v1: memory, pids, cpu).
const MAX_CGROUPS: usize = 3;

/// Everything the sandboxed process needs, prepared in the host ([`prepare`]); [`crate::spawn`]
/// starts a command under it.
#[derive(Debug)]
pub struct Plan {
    /// The filesystem view is built as root before dropping privileges (root host) instead of after
    /// entering the user namespace.
    pub(crate) view_as_root: bool,
    pub(crate) view: Option<View>,
    pub(crate) drop_to: Option<(u32, u32)>,
    /// A template of a root host: the user namespace it enters (by `setns`, as root of it) instead
    /// of making one ([`userns::template_userns`]).
    pub(crate) join_userns: Option<OwnedFd>,
    pub(crate) unshare: libc::c_int,
    pub(crate) ids: IdMaps,
    /// Forbid user namespaces below the run's.
    pub(crate) forbid_nested_userns: bool,
    /// Installed by H last, just before exec.
    pub(crate) seccomp: Option<&'static seccompiler::BpfProgram>,
    /// H sets `PR_SET_NO_NEW_PRIVS` (not a template, whose exec as root of its namespace keeps its
    /// capabilities, and whose runs each set it).
    pub(crate) no_new_privs: bool,
    pub(crate) nproc: Option<u64>,
    /// Limits set in the interpreter just before exec.
    pub(crate) rlimits: Vec<(libc::__rlimit_resource_t, u64)>,
    pub(crate) landlock: Option<OwnedFd>,
    /// Landlock rules on directories that only exist inside the run (its scratch, its `/proc`).
    pub(crate) landlock_inner: InnerRules,
    /// A fresh, empty network namespace created ahead of time by the host ([`netns::take`]); S joins
    /// it instead of creating one (`CLONE_NEWNET` is then not in `unshare`).
    pub(crate) netns: Option<ReadyNetns>,
    /// The run's cgroup; S writes itself into it first. Taken by the spawner, which keeps it for the
    /// run's life (see [`Plan::take_cgroup`]).
    pub(crate) cgroup: Option<RunCgroup>,
    pub(crate) cgroup_procs: [RawFd; MAX_CGROUPS],
    /// The child's end of the socket the scratch's descriptor is handed to the host through.
    pub(crate) handoff: Option<OwnedFd>,
    /// The host mediates the run's network: its processes make the host's endpoints and install the
    /// connect notifier, and send their descriptors over `egress_sock`.
    pub(crate) egress: bool,
    /// The notifier's program (guarded where the decision has the guard), taken before the fork.
    pub(crate) notifier: &'static [libc::sock_filter],
    /// The guard is in force (the ruleset refuses the run's own TCP bind and connect).
    pub(crate) egress_guard: bool,
    /// The child's end of the socket the run's egress descriptors reach the host through.
    pub(crate) egress_sock: Option<OwnedFd>,
    /// Where the host's argv and environment lie in memory (copied into S by the fork): zeroed before
    /// the run's init, which shares S's memory, can show them in `/proc/1/cmdline`.
    pub(crate) host_args: (usize, usize),
    /// The interpreter's command line, when the caller lets H exec it (see [`Plan::exec_with`]).
    pub(crate) exec: Option<Exec>,
    /// The working directory when there is no view (the host's run directory).
    pub(crate) work_dir: CString,
    /// The uid whose every process is killed at the end when there is no PID namespace.
    pub(crate) sweep_uid: Option<u32>,
    /// What is in force, for the envelope.
    pub(crate) report: Isolation,
}

pub(crate) fn host() -> Host {
    Host {
        euid: geteuid(),
        egid: getegid(),
    }
}

fn canonical(p: &Path) -> PathBuf {
    std::fs::canonicalize(p).unwrap_or_else(|_| p.to_owned())
}

/// What is sandboxed: the program, what it reads, where the host keeps its directory.
#[derive(Debug, Clone, Copy)]
pub struct Target<'a> {
    /// The program, read-only in the view (the file, and the file it resolves to).
    pub program: &'a Path,
    /// Its prefix (the directory above its `bin/`: an interpreter's standard library) is read-only
    /// in the view too.
    pub program_prefix: bool,
    /// More directories or files it reads, read-only, besides the system and
    /// [`Sandbox::read_paths`] (for a run: runpython's code dir and its environment).
    pub reads: &'a [&'a Path],
    /// The host directory made for it by [`crate::create_run_dir`]: the view's root is mounted
    /// beneath it, and without a view the process works in its `work/`.
    pub run_dir: &'a Path,
    /// The wall-clock limit: CPU time is limited to one second more.
    pub timeout: Duration,
}

/// The directories the sandboxed process reads: the program (or its prefix), `reads`, and the
/// configuration's `read_paths`.
pub(crate) fn read_dirs(
    config: &Sandbox,
    program: &Path,
    program_prefix: bool,
    reads: &[&Path],
) -> Vec<PathBuf> {
    let mut dirs = program_dirs(program, program_prefix);
    dirs.extend(reads.iter().map(|p| canonical(p)));
    dirs.extend(config.read_paths.iter().map(|p| canonical(p)));
    dirs
}

/// What a program needs to be read: the file (of the path given, and of the file it resolves to),
/// or with `prefix` the directory above its `bin/` (an interpreter's standard library).
pub(crate) fn program_dirs(program: &Path, prefix: bool) -> Vec<PathBuf> {
    let of = |exe: &Path| match prefix {
        true => exe
            .parent()
            .and_then(Path::parent)
            .map(canonical)
            .unwrap_or_else(|| PathBuf::from("/usr")),
        false => exe.to_owned(),
    };
    let mut dirs = vec![of(program)];
    if let Ok(real) = std::fs::canonicalize(program) {
        let real = of(&real);
        if !dirs.contains(&real) {
            dirs.push(real);
        }
    }
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

/// What a sandboxed process is prepared for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// A process of its own (a run's interpreter, cold or pooled; an install): every layer.
    Run,
    /// A template runs are forked from: the filesystem view, no network (unless runs have it), a
    /// cgroup of its own, and root of its own user namespace (the capabilities to make each run's
    /// namespaces); no Landlock, seccomp or limits, which each run takes for itself.
    /// `Err(TemplateUnavailable)` when runs cannot be forked under the configuration here.
    Template,
}

/// Decides the layers of `target` under `config` and prepares them: the uid, the filesystem view,
/// the Landlock ruleset, the rlimits, the cgroup, a ready network namespace. With
/// [`Sandbox::require`], a missing layer is `Err(IsolationUnavailable)`.
pub fn prepare(role: Role, config: &Sandbox, target: &Target<'_>) -> Result<Plan, Error> {
    let Target {
        program,
        program_prefix,
        reads,
        run_dir,
        timeout,
    } = *target;
    let timeout = if role == Role::Template {
        Duration::ZERO
    } else {
        timeout
    };
    let kernel = probe::kernel();
    let read_dirs = read_dirs(config, program, program_prefix, reads);
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

    // A run whose connections the host decides looks names up through the host's resolver in its
    // namespace; a template needs none (it never runs code, and its runs bring their own).
    let egress = decision.egress && role == Role::Run;
    let resolver = match (&config.network, decision.egress) {
        // A template's view is its runs' view: they look names up through their resolver too.
        (Network::Mediated, true) if decision.view => {
            let path = run_dir.join("resolv.conf");
            std::fs::write(&path, RESOLV_CONF).map_err(|source| {
                Error::io("writing the run's resolver configuration", &path, source)
            })?;
            Some(path)
        }
        _ => None,
    };
    // The run's name and `localhost` are its own loopback's (the host's own file names the host's
    // names, which mean nothing in a namespace of its own); with the host's network, the host's.
    let hosts = match &config.network {
        Network::Host => None,
        _ if decision.view => {
            let path = run_dir.join("hosts");
            std::fs::write(&path, HOSTS)
                .map_err(|source| Error::io("writing the run's hosts file", &path, source))?;
            Some(path)
        }
        _ => None,
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
            host_network: matches!(config.network, Network::Host),
            resolver: resolver.as_deref(),
            hosts: hosts.as_deref(),
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
    let mut cgroup_procs = [-1; MAX_CGROUPS];
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
        egress,
        notifier: crate::egress::filter::program(decision.egress_guard),
        egress_guard: decision.egress_guard,
        egress_sock: None,
        host_args: host_args(),
        exec: None,
        work_dir: cstring(&run_dir.join("work"))?,
        sweep_uid: drop_to.filter(|_| !pid_ns).map(|(uid, _)| uid),
        report,
    })
}

/// The run's resolver configuration: the host's resolver inside the run's network namespace, over
/// TCP when an answer does not fit a datagram.
const RESOLV_CONF: &str = "nameserver 127.0.0.1\noptions edns0 timeout:2 attempts:2\n";

/// The run's `/etc/hosts`: `localhost` and its hostname (`runpython`, set in its UTS namespace) on
/// its own loopback.
const HOSTS: &str =
    "127.0.0.1\tlocalhost runpython\n::1\tlocalhost ip6-localhost ip6-loopback runpython\n";

/// `RLIMIT_CPU` for a run of `timeout`: one second more than its wall-clock limit.
pub(crate) fn cpu_seconds(timeout: Duration) -> u64 {
    timeout.as_secs() + 1
}

/// What this host's kernel allows, probed now (never from the per-boot cache runs use), the answer
/// kept for the processes after this one.
pub fn kernel_report() -> KernelReport {
    probe::kernel_afresh().report()
}

/// What [`prepare`] would decide for `config`, without building anything (for
/// `RunPython::isolation_report`). The uid is the host's, or the first of the run range when runs get a
/// fresh one. With `templates`, runs are said to start from a template where they can.
pub fn report(config: &Sandbox, timeout: Duration, templates: bool) -> Result<Isolation, Error> {
    let read_dirs = read_dirs(config, Path::new("/usr/bin/python3"), true, &[]);
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
pub fn template_eligible(config: &Sandbox) -> Result<(), String> {
    let decision = decide(config, probe::kernel(), host(), || None);
    decision.template_eligible(host())
}

impl Plan {
    /// What is in force, for the isolation report.
    pub fn isolation(&self) -> &Isolation {
        &self.report
    }

    /// The run's cgroup, which must live as long as the run (its drop removes it).
    pub fn take_cgroup(&mut self) -> Option<RunCgroup> {
        self.cgroup.take()
    }

    /// The socket the run's first process hands the scratch's descriptor to the host through (the
    /// child's end; the host keeps the other). Only with a filesystem view.
    pub fn set_handoff(&mut self, child_end: OwnedFd) {
        self.handoff = Some(child_end);
    }

    /// What a root host's template makes only after entering its user namespace (in its init, G):
    /// its network namespace and a second PID namespace, whose PID 1 the template is. It returns to
    /// both after making each run's (a network namespace made ahead of time, the PID namespace its
    /// next child starts), which `setns` allows only into namespaces its user namespace owns.
    pub(crate) fn template_late(&self) -> libc::c_int {
        match &self.join_userns {
            Some(_) => self.unshare & (libc::CLONE_NEWNET | libc::CLONE_NEWPID),
            None => 0,
        }
    }

    /// The socket the run's processes send their egress descriptors through (the child's end; only
    /// when the host mediates the run's network).
    pub(crate) fn set_egress_sock(&mut self, child_end: OwnedFd) {
        self.egress_sock = Some(child_end);
    }

    /// Whether the run has a filesystem view (and so hands its scratch to the host).
    pub fn has_view(&self) -> bool {
        self.view.is_some()
    }

    /// Lets the run's processes G and H share S's memory instead of copying it (`CLONE_VM`): H then
    /// execs `program` with `args` and `env` itself, as std would have.
    pub fn exec_with(
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

/// The interpreter's command line, prepared in the host so that H can exec it itself.
#[derive(Debug)]
pub(crate) struct Exec {
    pub program: std::ffi::CString,
    pub _strings: Vec<std::ffi::CString>,
    pub argv: Vec<*const libc::c_char>,
    pub envp: Vec<*const libc::c_char>,
}

// SAFETY: the pointers point into `program`/`strings`, owned by the same value and never mutated.
unsafe impl Send for Exec {}
// SAFETY: as above; shared access only reads.
unsafe impl Sync for Exec {}
