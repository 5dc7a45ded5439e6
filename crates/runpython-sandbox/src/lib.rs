//! runpython-sandbox: runs a command under every isolation layer the host allows, and reports what
//! held. Roughly bubblewrap as a library: namespaces (user, PID, mount, network, IPC, UTS), a
//! filesystem view built from an allowlist with one size-capped writable scratch, a fresh uid per
//! process on a root host, Landlock, a seccomp deny-list, `no_new_privs`, rlimits and a cgroup per
//! process tree, and nothing left running when it ends. It depends on no other runpython crate;
//! runpython-core runs its interpreters (runs, sessions, templates) under it and runpython-deps its
//! installers.
//!
//! Its network is mechanism, not policy: off, the host's, or [`Network::Mediated`], where the run's
//! first process makes the host's endpoints in the run's empty namespace and the interpreter installs
//! a filter handing every `connect(2)` to the host (guarded: `bind(2)`, `listen(2)` and the device
//! `ioctl(2)`s too), and the sandbox hands their descriptors out
//! ([`Child::egress`], [`EgressFds`]). What may be reached is decided and served by runpython-egress,
//! which depends on this crate; nothing here parses a host name or speaks DNS, HTTP or TLS.
//!
//! ```no_run
//! # async fn demo() -> Result<(), runpython_sandbox::Error> {
//! use runpython_sandbox::{Command, Sandbox};
//!
//! let mut child = Command::new("/usr/bin/python3")
//!     .args(["-c", "open('out.txt', 'w').write('hi')"])
//!     .spawn(&Sandbox::default())?;
//! let output = child.wait_with_output(std::time::Duration::from_secs(10), 1 << 16).await?;
//! assert!(output.status.is_some_and(|s| s.success()));
//! // What it wrote lies in its scratch, read beneath a descriptor the host held before it ran.
//! let copied = child.scratch().copy_out("work/out.txt".as_ref(), "/tmp/out.txt".as_ref(), 1 << 20)?;
//! println!("{copied:?}, isolation: {:?}", child.isolation());
//! # Ok(()) }
//! ```
//!
//! Every network namespace the sandbox makes has its loopback up (`127.0.0.1`, `::1`), brought up
//! by the process that made it (`netns.rs`): a run's servers and clients talk over it, and nothing
//! else is in the namespace.
//!
//! Decide first, then build: `decide::decide` turns the configuration, what the kernel allows
//! (`probe::kernel`, probed once per process) and who the host is into a `decide::Decision` (pure
//! data: `RunPython::isolation_report` prints it without building anything); [`prepare`] builds that
//! decision into a [`Plan`] (the uid, the mount plan, the Landlock ruleset, the rlimits, a network
//! namespace made ahead of time); `init::enter` runs between fork and exec and makes plain system
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
//! (read-only binds), a minimal `/dev` (with terminals of the run's own: a new devpts instance), its
//! own `/etc/hosts`, the run's own `/proc` and its *scratch*, one tmpfs of
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
//! owns it, see `netns`), maps inside 1000 to its own uid, builds the view inside, and G mounts
//! `/proc` and pivots. Either way the code is not uid 0 inside, so H's exec leaves it no capability in
//! its user namespace, and the namespace's own `max_user_namespaces` is 0 (a per-namespace limit; the
//! host's is untouched), so the code cannot make a namespace of its own to regain them, which keeps
//! netfilter and the other namespace-gated kernel surface out of reach. `RLIMIT_NPROC` is set after
//! entering the user namespace, so it counts the run's own processes. S writes itself into the run's
//! cgroup first of all. G zeroes its copy of the host's argv and environment before anything of the
//! run can read `/proc/1/cmdline`. H sets `PR_SET_NO_NEW_PRIVS`, the rlimits (AS, CPU = timeout+1 s,
//! FSIZE, NOFILE), restricts itself with Landlock (reads: the allowlist; writes: the scratch and a few
//! devices; signals and abstract sockets scoped to the run at ABI ≥ 6), installs the seccomp deny-list
//! (`seccomp`) and marks every descriptor above the bridge's close-on-exec.
//!
//! # Runs forked from a template
//!
//! A template ([`prepare`] with [`Role::Template`]) is built as above with its own role: root of its user namespace
//! (0 mapped to the host's uid, or for a root host the templates' namespace of the run uid range,
//! entered by G after the pivot, G then a copy of S since `setns` refuses a process sharing its
//! memory), a network namespace and (root host) a second PID namespace made inside it, and no
//! Landlock, seccomp, `no_new_privs` or limits. Each run forked from it takes every layer itself in
//! `runpython_template.py`, from what [`prepare_fork`] prepared in the host for it: the same
//! `decide::Decision` as a fresh run's, its cgroup, its Landlock ruleset, its seccomp program, its
//! uid. ARCHITECTURE.md ("Runs forked from a template") has the whole sequence and what a fork shares.
//!
//! # Invariants
//!
//! - Nothing a run starts outlives it: with a PID namespace G SIGKILLs every other process of the run
//!   before the host is told the run ended, and the kernel kills any left when G dies (G dies with S via
//!   PDEATHSIG, S with the host or the group kill); without one, the group is killed and, with a run
//!   uid, every process of that uid is swept (`userns::kill_all_of_uid`).
//! - PDEATHSIG is set again after every fork and credential change (both clear it).
//! - S and G close every descriptor, so pipes reach end of file when H's last holder exits; H keeps
//!   only stdin, stdout, stderr, the result pipe (3) and the bridge (4).
//! - The host never follows a path the code controls (it holds the scratch's descriptor); the code
//!   sees an allowlisted view, runpython's code and environments read-only in it.
//! - The code never runs as host root when `drop_privileges` is on (root is exempt from `RLIMIT_NPROC`).
//! - Every layer that is off or refused is reported in `isolation`; nothing degrades silently.
//! - With a mediated network the code holds no socket of the host's namespace but what the host hands
//!   it under the guard ([`EgressFds::guarded`]: Landlock refuses the run's own TCP bind and connect,
//!   and its notifier hands the host every bind, connect and listen), nor the descriptors of the
//!   host's endpoints or of the connect notifier's listener (the processes that make them send them to
//!   the host and close their own copies).

mod cgroup;
mod cleanup;
mod clone_vm;
mod command;
mod decide;
mod egress;
mod error;
pub mod fd;
mod fork_check;
mod init;
mod landlock;
mod layers;
mod mounts;
mod netns;
mod per_boot;
mod plan;
mod probe;
mod report;
mod run_dir;
mod seccomp;
mod spawn;
mod step;
mod sys;
mod template;
mod userns;
mod view;

use std::path::PathBuf;

pub use cgroup::RunCgroup;
pub use cleanup::settle as settle_cleanup;
pub use command::{Command, Output, Sandboxed, Scratch};
pub use egress::{EgressChannel, EgressFds};
pub use error::Error;
pub use fd::{BeneathDir, CollectLimits, CopyReport};
pub use fork_check::{ForkCheck, VerifiedRun};
pub use per_boot::{code_identity, runtime_dir};
pub use plan::{kernel_report, prepare, report, template_eligible, Plan, Role, Target};
pub use probe::KernelReport;
pub use report::{BridgeReport, CpuReport, Isolation, LimitReport, RlimitReport};
pub use run_dir::{create_run_dir, discard_run_dir};
pub use spawn::{spawn, Child, GroupGuard, Spawn, StdinFrom};
pub use sys::{close_from, exit_like, set_pdeathsig, Step, StepError};
pub use template::{prepare_fork, ForkCommand, ForkPlan, TEMPLATE_MODULES};
pub use view::SCRATCH;

/// How a sandboxed process reaches the network: the mechanism only. What a mediated run may reach is
/// its caller's policy (runpython-egress), served from the descriptors the run hands out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Network {
    /// No network: the run's namespace has loopback only.
    #[default]
    Off,
    /// The run's namespace is empty but for its loopback, where it makes the host's endpoints (a
    /// resolver, a relay); every `connect(2)` of its interpreter is handed to the host, which decides.
    /// The host's end of it is [`Child::egress`] ([`EgressFds`] for a run forked from a template).
    Mediated,
    /// The host's network namespace, unfiltered.
    Host,
}

/// The sandbox layers asked for, and the limits it sets. Every layer can be
/// turned off (to measure it, or where a host provides its own); [`Sandbox::require`] refuses to run
/// when a requested layer is unavailable instead of degrading.
///
/// The sandbox takes `Sandbox<Network>`. A caller that holds more than the mechanism for the network
/// (runpython-egress's `Network`, a policy in it) keeps its own `N` and gives the sandbox its share
/// with [`Sandbox::map_network`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sandbox<N = Network> {
    /// User, PID, mount, IPC, UTS (and network, unless allowed) namespaces (default on).
    pub namespaces: bool,
    /// What the code may reach (default off: an empty network namespace).
    pub network: N,
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
    /// The run's share of the CPU, in thousandths of a CPU (default 1000: one CPU): its cgroup's quota
    /// per period, so a run of many busy processes takes no more than this from the runs beside it.
    pub cpu_millis: u64,
    /// More directories the code may read (a prepared environment, data).
    pub read_paths: Vec<PathBuf>,
}

impl<N: Default> Default for Sandbox<N> {
    fn default() -> Self {
        Self {
            namespaces: true,
            network: N::default(),
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
            cpu_millis: 1000,
            read_paths: Vec::new(),
        }
    }
}

impl<N: Default> Sandbox<N> {
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

impl<N> Sandbox<N> {
    /// The same layers and limits with the network `network` makes of this one's (the sandbox's share
    /// of a caller's network configuration).
    pub fn map_network<M>(&self, network: impl FnOnce(&N) -> M) -> Sandbox<M> {
        Sandbox {
            namespaces: self.namespaces,
            network: network(&self.network),
            landlock: self.landlock,
            rlimits: self.rlimits,
            seccomp: self.seccomp,
            drop_privileges: self.drop_privileges,
            require: self.require,
            memory_bytes: self.memory_bytes,
            run_memory_bytes: self.run_memory_bytes,
            disk_bytes: self.disk_bytes,
            cgroups: self.cgroups,
            file_size_bytes: self.file_size_bytes,
            open_files: self.open_files,
            processes: self.processes,
            cpu_millis: self.cpu_millis,
            read_paths: self.read_paths.clone(),
        }
    }
}
