//! The sandbox around the child: a PID namespace whose init is the run (nothing the code starts
//! outlives it), user/mount/network/IPC/UTS namespaces, a dropped uid (so `RLIMIT_NPROC` holds even
//! when the host is root), Landlock, `PR_SET_NO_NEW_PRIVS` and rlimits.
//!
//! Everything that allocates or can fail slowly is prepared in the host ([`prepare`] → [`Plan`]); the
//! code that runs between fork and exec ([`enter`]) makes plain system calls on precomputed C strings.
//!
//! The processes of one run, with namespaces:
//!
//! ```text
//! host ── S (tokio's child: host PID ns, own process group; waits, replicates the status)
//!          └─ G (PID 1 of the run's PID ns: mounts /proc, reaps orphans, reports H's status)
//!               └─ H (the Python interpreter)
//! ```
//!
//! S is std's fork of the host; G and H share S's memory (`CLONE_VM`, H vfork-style until it execs),
//! so the host's page tables are copied once per run, not three times.
//!
//! S dies with the host (`PR_SET_PDEATHSIG`) or the run's group kill; G dies with S (PDEATHSIG set
//! again after every fork and credential change); when H ends, G SIGKILLs the rest of the namespace,
//! reports, and S leaves at once (the teardown then happens in G); when G dies the kernel kills the
//! whole namespace, `setsid` daemons and double forks included.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::Error;

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
    /// `RLIMIT_AS` of the interpreter (default 4 GiB).
    pub memory_bytes: u64,
    /// `RLIMIT_FSIZE`: the largest file the code may write (default 1 GiB).
    pub file_size_bytes: u64,
    /// `RLIMIT_NOFILE` (default 1024).
    pub open_files: u64,
    /// `RLIMIT_NPROC`: processes and threads inside the run (default 256).
    pub processes: u64,
    /// Size of the private `/tmp` and `/dev/shm` (default 256 MiB each).
    pub tmp_bytes: u64,
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
            file_size_bytes: 1 << 30,
            open_files: 1024,
            processes: 256,
            tmp_bytes: 256 << 20,
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
            ..Self::default()
        }
    }
}

/// Which isolation layers were in force for a run (the envelope's `isolation`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Isolation {
    /// Namespaces the code runs in: any of `user`, `pid`, `mount`, `ipc`, `uts`, `net`.
    pub namespaces: Vec<String>,
    /// `"abi-N"` when Landlock restricts the code, `"off"` when not asked for, `"unavailable"`.
    pub landlock: String,
    /// Limits set on the interpreter; `null` fields are not enforced.
    pub rlimits: RlimitReport,
    /// `"deny-list"` when the seccomp filter is installed, `"off"` when not asked for, `"unavailable"`.
    #[serde(default)]
    pub seccomp: String,
    /// `"off"` (an empty network namespace) or `"host"`.
    pub network: String,
    /// The host uid the code runs as.
    pub uid: u32,
    /// How the run's processes are ended: `"pid-namespace"` or `"process-group"`.
    pub kill: String,
    /// Requested layers that were not available, each with the reason.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub missing: Vec<String>,
}

/// The rlimits in force; `null` when not enforced.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RlimitReport {
    /// `RLIMIT_AS`.
    pub address_space_bytes: Option<u64>,
    /// `RLIMIT_CPU` (soft limit; the code gets SIGXCPU there, SIGKILL a second later).
    pub cpu_seconds: Option<u64>,
    /// `RLIMIT_FSIZE`.
    pub file_size_bytes: Option<u64>,
    /// `RLIMIT_NOFILE`.
    pub open_files: Option<u64>,
    /// `RLIMIT_NPROC` (counted inside the run's user namespace, or for its own uid).
    pub processes: Option<u64>,
}

/// What the kernel allows, probed once per process.
#[derive(Debug)]
struct Probe {
    /// Namespace flags that work (including `CLONE_NEWUSER`), 0 when user namespaces do not.
    ns_flags: libc::c_int,
    /// A fresh `/proc` can be mounted in a new PID + mount namespace.
    proc_mount: bool,
    /// A new user namespace can forbid user namespaces below it.
    userns_limit: bool,
    /// A non-root host can hand runs network namespaces made ahead of time (see [`ReadyNetns`]).
    owned_netns: bool,
    /// The seccomp filter, when this architecture has one and the kernel installs it.
    seccomp: Option<&'static seccompiler::BpfProgram>,
    /// Landlock ABI version, 0 when unavailable.
    landlock_abi: i32,
}

const ALL_NS: libc::c_int = libc::CLONE_NEWUSER
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWNS
    | libc::CLONE_NEWNET
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUTS;

/// First uid of the range runs are given when the host is root: above the subordinate ranges that
/// `useradd` hands out (100000 + 65536 per user) so no real user or container owns it.
const RUN_UID_BASE: u32 = 0x4000_0000;

/// Whether `uid` is one of those runs are given when the host is root.
pub(crate) fn is_run_uid(uid: u32) -> bool {
    (RUN_UID_BASE..RUN_UID_BASE + 0x0100_0000).contains(&uid)
}

fn probe() -> &'static Probe {
    static PROBE: OnceLock<Probe> = OnceLock::new();
    PROBE.get_or_init(|| {
        let probe_uid = (geteuid() == 0).then_some(RUN_UID_BASE - 1);
        let try_flags = |flags| probe_namespaces(flags, probe_uid, false, false);
        let ns_flags = if probe_namespaces(ALL_NS, probe_uid, true, false) {
            ALL_NS
        } else if !try_flags(libc::CLONE_NEWUSER) {
            0
        } else {
            [
                libc::CLONE_NEWPID | libc::CLONE_NEWNS,
                libc::CLONE_NEWNS,
                libc::CLONE_NEWNET,
                libc::CLONE_NEWIPC,
                libc::CLONE_NEWUTS,
            ]
            .into_iter()
            .filter(|&f| try_flags(libc::CLONE_NEWUSER | f))
            .fold(libc::CLONE_NEWUSER, |acc, f| acc | f)
        };
        let proc_mount = ns_flags == ALL_NS
            || (ns_flags & (libc::CLONE_NEWPID | libc::CLONE_NEWNS)
                == (libc::CLONE_NEWPID | libc::CLONE_NEWNS)
                && probe_namespaces(
                    libc::CLONE_NEWUSER | libc::CLONE_NEWPID | libc::CLONE_NEWNS,
                    probe_uid,
                    true,
                    false,
                ));
        let userns_limit =
            ns_flags != 0 && probe_namespaces(libc::CLONE_NEWUSER, probe_uid, false, true);
        Probe {
            ns_flags,
            proc_mount,
            userns_limit,
            owned_netns: ns_flags == ALL_NS
                && geteuid() != 0
                && new_owned_netns().is_ok_and(|ready| probe_owned_netns(&ready)),
            seccomp: seccomp_filter().filter(|f| probe_seccomp(f)),
            landlock_abi: landlock_abi(),
        }
    })
}

fn landlock_abi() -> i32 {
    const LANDLOCK_CREATE_RULESET_VERSION: libc::c_uint = 1;
    // SAFETY: the version query takes no attribute pointer and returns a number or -1.
    let v = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    i32::try_from(v).unwrap_or(0).max(0)
}

fn geteuid() -> u32 {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() }
}

fn getegid() -> u32 {
    // SAFETY: getegid cannot fail.
    unsafe { libc::getegid() }
}

/// How many empty network namespaces are kept ready (more concurrent starts create their own).
const NETNS_READY: usize = 4;

/// Fresh, empty network namespaces made ahead of time by a host thread, one per run (never shared):
/// creating one costs the kernel ~0.5–1 ms, which this takes off the run's critical path. A
/// namespace is owned by a user namespace the code is not in (its loopback stays down and cannot be
/// brought up): the host's own for a root host, a user namespace made with it otherwise.
struct NetnsPool {
    ready: std::sync::Mutex<Vec<ReadyNetns>>,
    wanted: std::sync::Condvar,
}

/// A network namespace made ahead of time for one run.
#[derive(Debug)]
pub(crate) struct ReadyNetns {
    net: OwnedFd,
    /// For a non-root host, the user namespace that owns `net` (it maps the host's uid and gid to
    /// 0). The host's uid owns it in turn, so S may join it and, holding every capability there,
    /// join `net`; the run's own user namespace is then made inside it. A root host needs neither.
    owner: Option<OwnedFd>,
}

/// The pool, started on first use; `None` when its thread cannot be started.
fn netns_pool() -> Option<&'static NetnsPool> {
    static POOL: OnceLock<Option<&'static NetnsPool>> = OnceLock::new();
    *POOL.get_or_init(|| {
        let pool: &'static NetnsPool = Box::leak(Box::new(NetnsPool {
            ready: std::sync::Mutex::new(Vec::new()),
            wanted: std::sync::Condvar::new(),
        }));
        std::thread::Builder::new()
            .name("runpython-netns".into())
            .spawn(move || {
                // Normal priority on purpose: making a namespace takes kernel locks (rtnl) that a
                // run falling back to its own namespace, or any other host process, may wait for; a
                // low-priority holder would make them wait behind every other task.
                loop {
                    {
                        let mut ready = pool.ready.lock().unwrap_or_else(|p| p.into_inner());
                        while ready.len() >= NETNS_READY {
                            ready = pool.wanted.wait(ready).unwrap_or_else(|p| p.into_inner());
                        }
                    }
                    // Each unshare moves this thread into a new namespace; the descriptor keeps it
                    // alive. A refusal stops the pool: runs then create their own.
                    let made = if geteuid() == 0 {
                        new_netns().map(|net| ReadyNetns { net, owner: None })
                    } else {
                        new_owned_netns()
                    };
                    let Ok(ready) = made else { return };
                    pool.ready
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push(ready);
                }
            })
            .ok()
            .map(|_| pool)
    })
}

/// A ready network namespace for one run, or `None` when the pool is empty (the run then creates
/// its own). The pool is refilled by [`refill_netns`] when a run ends.
fn take_netns() -> Option<ReadyNetns> {
    let pool = netns_pool()?;
    let fd = pool.ready.lock().unwrap_or_else(|p| p.into_inner()).pop();
    if fd.is_none() {
        pool.wanted.notify_one();
    }
    fd
}

/// Asks the pool to make up for the namespaces taken: called when a run ends, so that making a
/// namespace competes with no run's setup or interpreter start for the CPU.
pub(crate) fn refill_netns() {
    if let Some(pool) = POOL_STARTED.get().and_then(|_| netns_pool()) {
        pool.wanted.notify_one();
    }
}

/// Set when a run took from the pool (a host that never did has no pool to refill).
static POOL_STARTED: OnceLock<()> = OnceLock::new();

/// For a non-root host: a new user namespace (the host's uid and gid mapped to 0) owning a new network
/// namespace, both made by a forked child (a threaded process cannot make a user namespace) and kept
/// by descriptors once the child is gone.
fn new_owned_netns() -> io::Result<ReadyNetns> {
    let ids = IdMaps::mapping(0, geteuid(), getegid());
    let (ready_r, ready_w) = pipe()?;
    let (release_r, release_w) = pipe()?;
    let mut args = NetnsHelper {
        ids: &ids,
        close: [ready_r.as_raw_fd(), release_w.as_raw_fd()],
        ready: ready_w.as_raw_fd(),
        release: release_r.as_raw_fd(),
    };
    // The helper shares the host's memory (`CLONE_VM`): no copy of the host's page tables and no
    // copy-on-write faults in the host afterwards, which a fork after every run would cost.
    let mut stack = vec![0u8; NETNS_HELPER_STACK];
    // SAFETY: the helper runs `netns_helper_main` on `stack` (its top, 16-byte aligned) with `args`,
    // both alive until it has exited (waited for below); it makes system calls only.
    let pid = unsafe {
        let top = stack.as_mut_ptr().add(NETNS_HELPER_STACK) as usize & !15;
        libc::clone(
            netns_helper_main,
            top as *mut libc::c_void,
            libc::CLONE_VM | libc::CLONE_NEWUSER | libc::CLONE_NEWNET | libc::SIGCHLD,
            std::ptr::addr_of_mut!(args).cast(),
        )
    };
    if pid < 0 {
        return Err(io::Error::last_os_error());
    }
    drop((ready_w, release_r));
    let mut byte = [0u8; 1];
    // SAFETY: a read into a live one-byte buffer.
    let n = unsafe { libc::read(ready_r.as_raw_fd(), byte.as_mut_ptr().cast(), 1) };
    let made = if n == 1 && byte[0] == 1 {
        let open = |kind: &str| open_high(&format!("/proc/{pid}/ns/{kind}"));
        open("user").and_then(|owner| {
            Ok(ReadyNetns {
                net: open("net")?,
                owner: Some(owner),
            })
        })
    } else {
        Err(io::Error::other("cannot make a user and network namespace"))
    };
    drop(release_w); // the helper exits; the descriptors keep its namespaces
    wait_exit_code(pid);
    drop(stack);
    made
}

const NETNS_HELPER_STACK: usize = 64 * 1024;

/// What the helper of [`new_owned_netns`] works with.
struct NetnsHelper {
    ids: *const IdMaps,
    /// Its copies of the host's ends of the pipes: open, its wait would never end.
    close: [RawFd; 2],
    ready: RawFd,
    release: RawFd,
}

/// The helper, born in a new user and network namespace: maps the host's ids to 0, says whether
/// that worked, and waits until the host has opened its namespaces.
extern "C" fn netns_helper_main(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` points at the host's `NetnsHelper`, alive until this helper has exited; only
    // system calls follow.
    unsafe {
        let args = &*arg.cast::<NetnsHelper>();
        for fd in args.close {
            libc::close(fd);
        }
        let byte = [u8::from((*args.ids).write().is_ok())];
        libc::write(args.ready, byte.as_ptr().cast(), 1);
        let mut wait = [0u8; 1];
        libc::read(args.release, wait.as_mut_ptr().cast(), 1);
        libc::_exit(0)
    }
}

fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [-1; 2];
    // SAFETY: pipe2 fills the two-element array.
    cvt(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) })?;
    // SAFETY: both descriptors were just created and are owned by nobody else.
    unsafe {
        Ok((
            <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fds[0]),
            <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fds[1]),
        ))
    }
}

/// Opens `path` read-only, as a descriptor above the child's stdio and result slots.
fn open_high(path: &str) -> io::Result<OwnedFd> {
    let path = CString::new(path).map_err(io::Error::other)?;
    // SAFETY: open/fcntl/close on a NUL-terminated path and the descriptor just opened.
    unsafe {
        let fd = cvt(libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC))?;
        let high = libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 10);
        libc::close(fd);
        Ok(<OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(cvt(high)?))
    }
}

/// Whether a run can start in `ready` as S will: join its owner, join it, then make the run's user,
/// PID and mount namespaces inside and map them. Tried once in a forked child.
fn probe_owned_netns(ready: &ReadyNetns) -> bool {
    let Some(owner) = &ready.owner else {
        return false;
    };
    let ids = IdMaps::new(0, 0);
    in_forked_child(|| {
        // SAFETY: setns/unshare with descriptors and flags prepared before the fork.
        let joined = unsafe {
            libc::setns(owner.as_raw_fd(), libc::CLONE_NEWUSER) == 0
                && libc::setns(ready.net.as_raw_fd(), libc::CLONE_NEWNET) == 0
                && libc::unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWPID | libc::CLONE_NEWNS) == 0
        };
        joined && ids.write().is_ok()
    })
}

/// Runs `check` in a forked child and tells whether it returned true. `check` may only make system
/// calls on values prepared before the fork (no allocation, no locks: the host is threaded).
fn in_forked_child(check: impl FnOnce() -> bool) -> bool {
    // SAFETY: the child runs `check` (system calls only, per the contract above) and always _exits.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return false;
    }
    if pid == 0 {
        let ok = check();
        // SAFETY: ends the child only.
        unsafe { libc::_exit(if ok { 0 } else { 1 }) }
    }
    wait_exit_code(pid) == 0
}

/// Moves the calling thread into a new network namespace and returns a descriptor of it, above the
/// child's stdio and result slots.
fn new_netns() -> io::Result<OwnedFd> {
    // SAFETY: unshare of the calling thread's network namespace.
    cvt(unsafe { libc::unshare(libc::CLONE_NEWNET) })?;
    open_high("/proc/thread-self/ns/net")
}

/// Forks, and in the child tries what a run does: drop to `uid` (when root), unshare `flags`, write
/// the id maps, with `limit` forbid nested user namespaces, and with `proc` mount a fresh `/proc`
/// from PID 1 of the new namespace.
fn probe_namespaces(flags: libc::c_int, uid: Option<u32>, proc: bool, limit: bool) -> bool {
    let ids = IdMaps::new(uid.unwrap_or_else(geteuid), uid.unwrap_or_else(getegid));
    in_forked_child(|| {
        let entered = (|| -> io::Result<()> {
            if let Some(uid) = uid {
                drop_ids(uid, uid)?;
            }
            // SAFETY: unshare with the flags being probed.
            cvt(unsafe { libc::unshare(flags) })?;
            ids.write()?;
            if limit {
                forbid_nested_user_namespaces()?;
            }
            Ok(())
        })()
        .is_ok();
        // The first child of the new PID namespace is its PID 1, which may mount its `/proc`.
        entered && (!proc || in_forked_child(|| mount_proc().is_ok()))
    })
}

fn wait_exit_code(pid: libc::pid_t) -> i32 {
    let mut status = 0;
    loop {
        // SAFETY: waits for our own child.
        let r = unsafe { libc::waitpid(pid, &mut status, 0) };
        if r == pid {
            return if libc::WIFEXITED(status) {
                libc::WEXITSTATUS(status)
            } else {
                -1
            };
        }
        if r < 0 && io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            return -1;
        }
    }
}

/// The uid and gid the code has inside its user namespace. Not 0: the process that creates the
/// namespace holds every capability in it, and an exec as a non-zero id leaves the interpreter none
/// (an exec as 0 would give them all back).
const INSIDE_ID: u32 = 1000;

/// The `uid_map`/`gid_map` lines: [`INSIDE_ID`] is the (possibly dropped) outside id.
#[derive(Debug)]
struct IdMaps {
    uid_map: CString,
    gid_map: CString,
}

impl IdMaps {
    fn new(uid: u32, gid: u32) -> Self {
        Self::mapping(INSIDE_ID, uid, gid)
    }

    /// `inside` mapped to `uid` and `gid` of the parent namespace.
    fn mapping(inside: u32, uid: u32, gid: u32) -> Self {
        let line = |id: u32| CString::new(format!("{inside} {id} 1")).unwrap_or_default();
        Self {
            uid_map: line(uid),
            gid_map: line(gid),
        }
    }

    /// Writes the maps of the calling process (after `unshare(CLONE_NEWUSER)`). Async-signal-safe.
    fn write(&self) -> io::Result<()> {
        write_file(c"/proc/self/setgroups", b"deny")?;
        write_file(c"/proc/self/uid_map", self.uid_map.as_bytes())?;
        write_file(c"/proc/self/gid_map", self.gid_map.as_bytes())
    }
}

/// Forbids user namespaces below the calling process's own (it must hold `CAP_SYS_RESOURCE` in it).
/// Without a capability the code cannot create any other namespace either, so the kernel surface that
/// namespace capabilities open (netfilter, mounts, ...) stays closed. The limit is per user namespace:
/// the host's is untouched. Async-signal-safe.
fn forbid_nested_user_namespaces() -> io::Result<()> {
    write_file(c"/proc/sys/user/max_user_namespaces", b"0")
}

fn write_file(path: &std::ffi::CStr, data: &[u8]) -> io::Result<()> {
    // SAFETY: plain open/write/close on a NUL-terminated path and a live buffer.
    unsafe {
        let fd = cvt(libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC))?;
        let n = libc::write(fd, data.as_ptr().cast(), data.len());
        libc::close(fd);
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Drops every privilege of the calling thread to `uid`/`gid` with raw system calls (only this thread
/// exists after fork; glibc's setxid broadcast is not wanted there).
fn drop_ids(uid: u32, gid: u32) -> io::Result<()> {
    // SAFETY: raw credential system calls with plain integer arguments.
    unsafe {
        cvt_long(libc::syscall(
            libc::SYS_setgroups,
            0usize,
            std::ptr::null::<libc::gid_t>(),
        ))?;
        cvt_long(libc::syscall(libc::SYS_setresgid, gid, gid, gid))?;
        cvt_long(libc::syscall(libc::SYS_setresuid, uid, uid, uid))?;
        // A credential change makes the process undumpable, which would make /proc/self/uid_map
        // root's; and it clears the parent-death signal.
        cvt(libc::prctl(libc::PR_SET_DUMPABLE, 1, 0, 0, 0))?;
    }
    set_pdeathsig()
}

fn set_pdeathsig() -> io::Result<()> {
    // SAFETY: prctl with integer arguments.
    cvt(unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) }).map(drop)
}

fn cvt(rc: libc::c_int) -> io::Result<libc::c_int> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

fn cvt_long(rc: libc::c_long) -> io::Result<libc::c_long> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

/// One step of building the run's view of the filesystem, in order.
#[derive(Debug)]
enum MountOp {
    /// A fresh tmpfs over `target` (hides what was there).
    Tmpfs { target: CString, data: CString },
    /// A directory inside a tmpfs laid over an ancestor (an existing one is fine).
    Mkdir(CString),
    /// The host directory `sources[source]` (opened before the first tmpfs) bound onto `target`.
    Bind { source: usize, target: CString },
}

/// Everything the child needs, prepared in the host. Used between fork and exec by [`enter`].
#[derive(Debug)]
pub(crate) struct Plan {
    /// Mount operations run as root before dropping privileges (root host) instead of after entering
    /// the user namespace.
    mounts_as_root: bool,
    bind_sources: Vec<CString>,
    mount_ops: Vec<MountOp>,
    drop_to: Option<(u32, u32)>,
    unshare: libc::c_int,
    ids: IdMaps,
    /// Forbid user namespaces below the run's (see [`forbid_nested_user_namespaces`]).
    forbid_nested_userns: bool,
    /// Installed by H last, just before exec.
    seccomp: Option<&'static seccompiler::BpfProgram>,
    nproc: Option<u64>,
    /// Limits set in the interpreter just before exec.
    rlimits: Vec<(libc::__rlimit_resource_t, u64)>,
    landlock: Option<OwnedFd>,
    /// Landlock rules on directories that only exist inside the run (its tmpfs, its `/proc`).
    landlock_inner: Vec<(CString, u64)>,
    /// A fresh, empty network namespace created ahead of time by the host (see [`take_netns`]); S
    /// joins it instead of creating one (`CLONE_NEWNET` is then not in `unshare`).
    netns: Option<ReadyNetns>,
    /// The interpreter's command line, when the caller lets H exec it (see [`Plan::exec_with`]).
    exec: Option<Exec>,
    work_dir: CString,
    /// The uid whose every process is killed at the end when there is no PID namespace.
    pub(crate) sweep_uid: Option<u32>,
    /// What is in force, for the envelope.
    pub(crate) report: Isolation,
}

#[repr(C, packed)]
struct PathBeneathAttr {
    allowed_access: u64,
    parent_fd: RawFd,
}

/// Decides the run's layers from the configuration and what the kernel allows, and prepares them:
/// the uid, the mount plan, the Landlock ruleset, the rlimits; hands the run directory to the uid.
pub(crate) fn prepare(
    config: &Sandbox,
    python: &Path,
    code_dir: &Path,
    extra_reads: &[&Path],
    run_dir: &Path,
    timeout: Duration,
) -> Result<Plan, Error> {
    let probe = probe();
    let mut missing = Vec::new();
    let root = geteuid() == 0;

    let mut drop_to = (root && config.drop_privileges).then(|| {
        let mut random = [0u8; 4];
        let _ = getrandom::fill(&mut random);
        let uid = RUN_UID_BASE + (u32::from_le_bytes(random) & 0x00ff_ffff);
        (uid, uid)
    });

    let mut unshare = 0;
    if config.namespaces {
        if probe.ns_flags == 0 {
            missing.push("namespaces: user namespaces are not available to this user".into());
        } else {
            unshare = probe.ns_flags;
            if config.allow_network {
                unshare &= !libc::CLONE_NEWNET;
            }
            for (flag, name) in NS_NAMES {
                if probe.ns_flags & flag == 0
                    && (flag != libc::CLONE_NEWNET || !config.allow_network)
                {
                    missing.push(format!("{name} namespace: refused by the kernel"));
                }
            }
        }
    }
    let pid_ns =
        unshare & libc::CLONE_NEWPID != 0 && unshare & libc::CLONE_NEWNS != 0 && probe.proc_mount;
    if unshare & libc::CLONE_NEWPID != 0 && !pid_ns {
        missing.push("pid namespace: a fresh /proc cannot be mounted".into());
        unshare &= !libc::CLONE_NEWPID;
    }
    let forbid_nested_userns = unshare & libc::CLONE_NEWUSER != 0 && probe.userns_limit;
    if unshare & libc::CLONE_NEWUSER != 0 && !forbid_nested_userns {
        missing.push(
            "user namespace: nested user namespaces cannot be forbidden (no per-namespace \
             max_user_namespaces), so the code can gain capabilities in namespaces of its own"
                .into(),
        );
    }

    let canonical = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_owned());
    let prefix = python
        .parent()
        .and_then(Path::parent)
        .map(canonical)
        .unwrap_or_else(|| PathBuf::from("/usr"));
    let run_dir = canonical(run_dir);
    let mut read_dirs: Vec<PathBuf> = vec![prefix, canonical(code_dir)];
    read_dirs.extend(config.read_paths.iter().map(|p| canonical(p)));
    read_dirs.extend(extra_reads.iter().map(|p| canonical(p)));

    // Without a mount namespace a dropped uid can only use what others may traverse.
    if drop_to.is_some() && unshare & libc::CLONE_NEWNS == 0 {
        if let Some(closed) = read_dirs.iter().find_map(|d| first_untraversable(d)) {
            missing.push(format!(
                "dropped uid: {} is closed to other users and there is no mount namespace to bind it",
                closed.display()
            ));
            drop_to = None;
        }
    }
    let (uid, gid) = drop_to.unwrap_or_else(|| (geteuid(), getegid()));

    // The filesystem view: a private /tmp and /dev/shm, and (root host) a tmpfs over every directory the
    // dropped uid cannot traverse (/root) with the directories the code needs bound back in place.
    let mut mount_ops = Vec::new();
    let mut bind_sources = Vec::new();
    if unshare & libc::CLONE_NEWNS != 0 {
        let mut overlays: Vec<(PathBuf, String)> = Vec::new();
        let tmp_data = format!("mode=1777,size={}", config.tmp_bytes);
        overlays.push(("/tmp".into(), tmp_data.clone()));
        if Path::new("/dev/shm").is_dir() {
            overlays.push(("/dev/shm".into(), tmp_data));
        }
        let mut exposed: Vec<PathBuf> = read_dirs.clone();
        exposed.push(run_dir.clone());
        if drop_to.is_some() {
            // The run directory is handed to the uid; the others must stay as they are.
            for dir in &read_dirs {
                if let Some(hidden) = first_untraversable(dir) {
                    if !overlays.iter().any(|(o, _)| hidden.starts_with(o)) {
                        overlays.push((hidden, "mode=0755,size=1m".into()));
                    }
                }
            }
        }
        overlays.sort_by_key(|(p, _)| p.as_os_str().len());
        overlays.dedup_by(|a, b| a.0 == b.0);
        for (target, data) in &overlays {
            mount_ops.push(MountOp::Tmpfs {
                target: cstring(target)?,
                data: CString::new(data.as_str()).map_err(|e| Error::Internal(e.to_string()))?,
            });
        }
        exposed.sort_by_key(|p| p.as_os_str().len());
        let mut bound: Vec<PathBuf> = Vec::new();
        for dir in exposed {
            if bound.iter().any(|b| dir.starts_with(b)) {
                continue;
            }
            let Some((overlay, _)) = overlays
                .iter()
                .filter(|(o, _)| dir.starts_with(o) && dir != *o)
                .max_by_key(|(o, _)| o.as_os_str().len())
            else {
                continue;
            };
            let mut path = overlay.clone();
            for part in dir.strip_prefix(overlay).unwrap_or(&dir).components() {
                path.push(part);
                mount_ops.push(MountOp::Mkdir(cstring(&path)?));
            }
            mount_ops.push(MountOp::Bind {
                source: bind_sources.len(),
                target: cstring(&dir)?,
            });
            bind_sources.push(cstring(&dir)?);
            bound.push(dir);
        }
    }

    // Landlock.
    let mut landlock_inner = Vec::new();
    let landlock = if !config.landlock {
        None
    } else if probe.landlock_abi == 0 {
        missing.push("landlock: not supported or not enabled by the kernel".into());
        None
    } else {
        match landlock_ruleset(probe.landlock_abi, &read_dirs, &run_dir) {
            Ok(fd) => {
                let abi = landlock::ABI::from(probe.landlock_abi);
                use landlock::Access;
                let all = landlock::AccessFs::from_all(abi).bits();
                let read =
                    (landlock::AccessFs::from_read(abi) | landlock::AccessFs::Execute).bits();
                if unshare & libc::CLONE_NEWNS != 0 {
                    landlock_inner.push((c"/tmp".to_owned(), all));
                    if Path::new("/dev/shm").is_dir() {
                        landlock_inner.push((c"/dev/shm".to_owned(), all));
                    }
                }
                if pid_ns {
                    landlock_inner.push((c"/proc".to_owned(), read));
                }
                Some(fd)
            }
            Err(e) => {
                missing.push(format!("landlock: {e}"));
                None
            }
        }
    };

    let cpu = timeout.as_secs() + 1;
    let mut rlimits = Vec::new();
    let mut report_limits = RlimitReport::default();
    let mut nproc = None;
    if config.rlimits {
        rlimits = vec![
            (libc::RLIMIT_AS, config.memory_bytes),
            (libc::RLIMIT_CPU, cpu),
            (libc::RLIMIT_FSIZE, config.file_size_bytes),
            (libc::RLIMIT_NOFILE, config.open_files),
        ];
        report_limits = RlimitReport {
            address_space_bytes: Some(config.memory_bytes),
            cpu_seconds: Some(cpu),
            file_size_bytes: Some(config.file_size_bytes),
            open_files: Some(config.open_files),
            processes: None,
        };
        // The count is per user namespace (or per uid): enforceable for a run's own user namespace or
        // its own uid, never for root (exempt) nor for a shared uid without a namespace.
        if uid != 0 && (unshare & libc::CLONE_NEWUSER != 0 || drop_to.is_some()) {
            nproc = Some(config.processes);
            report_limits.processes = nproc;
        } else {
            missing.push(if uid == 0 {
                "processes limit: not enforced for root (enable drop_privileges)".into()
            } else {
                "processes limit: needs a user namespace or a dropped uid".into()
            });
        }
    }

    if config.require && !missing.is_empty() {
        return Err(Error::IsolationUnavailable(missing.join("; ")));
    }

    if let Some((uid, gid)) = drop_to {
        let work = run_dir.join("work");
        for path in [
            run_dir.as_path(),
            work.as_path(),
            &run_dir.join("bridge.sock"),
        ] {
            match std::os::unix::fs::lchown(path, Some(uid), Some(gid)) {
                Err(e) if e.kind() == io::ErrorKind::NotFound && path != run_dir => {}
                r => r.map_err(|source| Error::Io {
                    what: "handing the run directory to the run's uid",
                    source,
                })?,
            }
        }
    }

    let namespaces = NS_NAMES
        .iter()
        .filter(|(flag, _)| unshare & flag != 0)
        .map(|(_, name)| (*name).to_owned())
        .collect();
    let seccomp = if !config.seccomp {
        None
    } else if probe.seccomp.is_none() {
        missing.push("seccomp: no filter for this architecture, or the kernel refused it".into());
        None
    } else {
        probe.seccomp
    };
    let report = Isolation {
        namespaces,
        landlock: match (&landlock, config.landlock) {
            (Some(_), _) => format!("abi-{}", probe.landlock_abi),
            (None, false) => "off".into(),
            (None, true) => "unavailable".into(),
        },
        rlimits: report_limits,
        seccomp: match (seccomp, config.seccomp) {
            (Some(_), _) => "deny-list".into(),
            (None, false) => "off".into(),
            (None, true) => "unavailable".into(),
        },
        network: if unshare & libc::CLONE_NEWNET != 0 {
            "off".into()
        } else {
            "host".into()
        },
        uid,
        kill: if pid_ns {
            "pid-namespace"
        } else {
            "process-group"
        }
        .into(),
        missing,
    };
    // A network namespace made ahead of time saves the run the kernel's ~1 ms to create one. A root
    // host's S joins it before dropping privileges (joining needs CAP_SYS_ADMIN over the namespace's
    // owner, the host's user namespace); a non-root host's S first joins the user namespace made
    // with it, and the run's own user namespace is made inside that one (ids mapped from its 0).
    let netns = if unshare & libc::CLONE_NEWNET != 0 && (geteuid() == 0 || probe.owned_netns) {
        let _ = POOL_STARTED.set(());
        take_netns()
    } else {
        None
    };
    if netns.is_some() {
        unshare &= !libc::CLONE_NEWNET;
    }
    let ids = match netns.as_ref().and_then(|n| n.owner.as_ref()) {
        Some(_) => IdMaps::new(0, 0),
        None => IdMaps::new(uid, gid),
    };
    Ok(Plan {
        mounts_as_root: drop_to.is_some(),
        bind_sources,
        mount_ops,
        drop_to,
        unshare,
        ids,
        forbid_nested_userns,
        seccomp,
        nproc,
        rlimits,
        landlock,
        landlock_inner,
        netns,
        exec: None,
        work_dir: cstring(&run_dir.join("work"))?,
        sweep_uid: drop_to.filter(|_| !pid_ns).map(|(uid, _)| uid),
        report,
    })
}

const NS_NAMES: [(libc::c_int, &str); 6] = [
    (libc::CLONE_NEWUSER, "user"),
    (libc::CLONE_NEWPID, "pid"),
    (libc::CLONE_NEWNS, "mount"),
    (libc::CLONE_NEWNET, "net"),
    (libc::CLONE_NEWIPC, "ipc"),
    (libc::CLONE_NEWUTS, "uts"),
];

/// What [`prepare`] would decide for `config`, without a run (for `RunPython::isolation_report`).
pub(crate) fn report(config: &Sandbox, timeout: Duration) -> Result<Isolation, Error> {
    let dir = tempfile::Builder::new()
        .prefix("runpython-probe-")
        .tempdir()
        .map_err(|source| Error::Io {
            what: "creating a directory to probe the sandbox",
            source,
        })?;
    let _ = std::fs::create_dir(dir.path().join("work"));
    let plan = prepare(
        config,
        Path::new("/usr/bin/python3"),
        dir.path(),
        &[],
        dir.path(),
        timeout,
    )?;
    Ok(plan.report)
}

fn cstring(path: &Path) -> Result<CString, Error> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| Error::Internal(format!("{} contains a NUL byte", path.display())))
}

/// The outermost ancestor of `dir` (or `dir` itself) that others cannot search.
fn first_untraversable(dir: &Path) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    dir.ancestors()
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .find(|a| {
            std::fs::metadata(a)
                .map(|m| m.permissions().mode() & 0o001 == 0)
                .unwrap_or(false)
        })
        .map(Path::to_owned)
}

/// The host-side rules: system directories, the interpreter, runpython's code and `read_dirs` readable
/// and executable; the run directory fully usable; a few devices writable. Signals and abstract Unix
/// sockets are scoped to the run (ABI 6+).
fn landlock_ruleset(abi: i32, read_dirs: &[PathBuf], run_dir: &Path) -> Result<OwnedFd, String> {
    use std::os::fd::AsFd;
    use std::os::unix::fs::OpenOptionsExt;

    use landlock::{
        Access, AccessFs, CompatLevel, Compatible, PathBeneath, PathFd, Ruleset, RulesetAttr,
        RulesetCreatedAttr, Scope, ABI,
    };
    let abi = ABI::from(abi);
    let read = AccessFs::from_read(abi) | AccessFs::Execute;
    let system = [
        "/usr", "/lib", "/lib32", "/lib64", "/libx32", "/bin", "/sbin", "/etc", "/dev", "/sys",
        "/proc",
    ];
    let devices = [
        "/dev/null",
        "/dev/zero",
        "/dev/full",
        "/dev/urandom",
        "/dev/random",
    ];
    let rule = |path: &Path, access| {
        PathFd::new(path)
            .ok()
            .map(|fd| PathBeneath::new(fd, access))
    };
    // The system directories and devices are opened once per process (they do not move).
    static FIXED: OnceLock<Vec<(OwnedFd, bool)>> = OnceLock::new();
    let fixed = FIXED.get_or_init(|| {
        let open = |path: &str| {
            std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_PATH | libc::O_CLOEXEC)
                .open(path)
                .ok()
                .map(OwnedFd::from)
        };
        let system = system.iter().filter_map(|p| Some((open(p)?, false)));
        let devices = devices.iter().filter_map(|p| Some((open(p)?, true)));
        system.chain(devices).collect()
    });
    let mut ruleset = Ruleset::default()
        .set_compatibility(CompatLevel::BestEffort)
        .handle_access(AccessFs::from_all(abi))
        .map_err(|e| e.to_string())?
        .scope(Scope::from_all(abi))
        .map_err(|e| e.to_string())?
        .create()
        .map_err(|e| e.to_string())?;
    for (fd, device) in fixed {
        let access = if *device {
            AccessFs::from_file(abi)
        } else {
            read
        };
        ruleset = ruleset
            .add_rule(PathBeneath::new(fd.as_fd(), access))
            .map_err(|e| e.to_string())?;
    }
    for dir in read_dirs {
        if let Some(r) = rule(dir, read) {
            ruleset = ruleset.add_rule(r).map_err(|e| e.to_string())?;
        }
    }
    let r = rule(run_dir, AccessFs::from_all(abi)).ok_or("the run directory cannot be opened")?;
    ruleset = ruleset.add_rule(r).map_err(|e| e.to_string())?;
    let fd: Option<OwnedFd> = ruleset.into();
    let fd = fd.ok_or("the kernel refused the ruleset")?;
    // The child dup2s its pipes onto 0..=3: keep the ruleset out of their way.
    // SAFETY: F_DUPFD_CLOEXEC on a live descriptor; the duplicate is owned by the returned OwnedFd.
    let high = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 10) };
    if high < 0 {
        return Err(io::Error::last_os_error().to_string());
    }
    // SAFETY: `high` is a fresh descriptor nobody else owns.
    Ok(unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(high) })
}

// ---------------------------------------------------------------------------------------------------
// Between fork and exec: plain system calls only.

/// Runs in tokio's forked child (S) before exec. Returns `Ok` only in the process that must exec the
/// interpreter; S and G (with a PID namespace) wait there and `_exit` with the interpreter's status.
pub(crate) fn enter(plan: &Plan) -> io::Result<()> {
    set_rlimit(libc::RLIMIT_CORE, 0)?; // replicating a crash signal must not write a core file
    if plan.mounts_as_root {
        // SAFETY: unshare with a constant flag.
        cvt(unsafe { libc::unshare(libc::CLONE_NEWNS) })?;
        run_mount_ops(plan)?;
    }
    if let Some(netns) = &plan.netns {
        if let Some(owner) = &netns.owner {
            // SAFETY: setns into a user namespace the host's uid owns; S is single-threaded.
            cvt(unsafe { libc::setns(owner.as_raw_fd(), libc::CLONE_NEWUSER) })?;
        }
        // SAFETY: setns on a namespace descriptor the host prepared; root, or its owner's root.
        cvt(unsafe { libc::setns(netns.net.as_raw_fd(), libc::CLONE_NEWNET) })?;
    }
    if let Some((uid, gid)) = plan.drop_to {
        drop_ids(uid, gid)?;
    }
    if plan.unshare != 0 {
        // SAFETY: unshare with flags the probe found to work.
        cvt(unsafe { libc::unshare(plan.unshare) })?;
        if plan.unshare & libc::CLONE_NEWUSER != 0 {
            plan.ids.write()?;
            if plan.forbid_nested_userns {
                forbid_nested_user_namespaces()?;
            }
            set_pdeathsig()?; // entering a user namespace changed the credentials
        }
        if plan.unshare & libc::CLONE_NEWUTS != 0 {
            let name = b"runpython";
            // SAFETY: a live buffer and its length.
            cvt(unsafe { libc::sethostname(name.as_ptr().cast(), name.len()) })?;
        }
        if !plan.mounts_as_root {
            run_mount_ops(plan)?;
        }
    }
    if let Some(n) = plan.nproc {
        // Set after entering the user namespace: the limit then counts the run's own processes.
        set_rlimit(libc::RLIMIT_NPROC, n)?;
    }
    if plan.unshare & libc::CLONE_NEWPID != 0 {
        let exec = plan.exec.as_ref().ok_or(io::ErrorKind::InvalidInput)?;
        return start_init(plan, exec);
    }
    inner_setup(plan)?;
    // H: the interpreter.
    restrict_interpreter(plan)
}

/// H's last steps before exec: parent-death signal, rlimits, no new privileges, Landlock.
fn restrict_interpreter(plan: &Plan) -> io::Result<()> {
    set_pdeathsig()?;
    for &(resource, value) in &plan.rlimits {
        let hard = if resource == libc::RLIMIT_CPU {
            value + 1 // SIGXCPU at the soft limit, SIGKILL a second later
        } else {
            value
        };
        set_rlimit2(resource, value, hard)?;
    }
    // SAFETY: prctl with integer arguments.
    cvt(unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) })?;
    if let Some(ruleset) = &plan.landlock {
        // SAFETY: restrict_self on our ruleset descriptor; flags 0.
        cvt_long(unsafe {
            libc::syscall(libc::SYS_landlock_restrict_self, ruleset.as_raw_fd(), 0u32)
        })?;
    }
    if let Some(filter) = plan.seccomp {
        install_seccomp(filter)?;
    }
    Ok(())
}

/// System calls that fail with `EPERM` for the code. Python and its libraries do not need them, and
/// their kernel code is where unprivileged exploits keep being found; the other layers (no
/// capability, no new namespace, Landlock) already refuse mounts, module loading and the like.
const DENIED_SYSCALLS: &[libc::c_long] = &[
    libc::SYS_io_uring_setup,
    libc::SYS_io_uring_enter,
    libc::SYS_io_uring_register,
    libc::SYS_bpf,
    libc::SYS_userfaultfd,
    libc::SYS_perf_event_open,
    libc::SYS_keyctl,
    libc::SYS_add_key,
    libc::SYS_request_key,
    libc::SYS_kexec_load,
    libc::SYS_init_module,
    libc::SYS_finit_module,
    libc::SYS_delete_module,
    libc::SYS_acct,
    libc::SYS_swapon,
    libc::SYS_swapoff,
];

/// The deny-list compiled to BPF for this architecture, once per process; `None` where seccompiler
/// has no backend.
fn seccomp_filter() -> Option<&'static seccompiler::BpfProgram> {
    static FILTER: OnceLock<Option<seccompiler::BpfProgram>> = OnceLock::new();
    FILTER
        .get_or_init(|| {
            use seccompiler::{SeccompAction, SeccompFilter, TargetArch};
            let arch = TargetArch::try_from(std::env::consts::ARCH).ok()?;
            // x86-64's x32 ABI reaches the same calls with bit 30 set in the number.
            let x32 = if arch == TargetArch::x86_64 {
                0x4000_0000
            } else {
                0
            };
            let rules = DENIED_SYSCALLS
                .iter()
                .flat_map(|&nr| [nr, nr | x32])
                .map(|nr| (nr, Vec::new()))
                .collect();
            let errno = u32::try_from(libc::EPERM).ok()?;
            let filter = SeccompFilter::new(
                rules,
                SeccompAction::Allow,
                SeccompAction::Errno(errno),
                arch,
            )
            .ok()?;
            filter.try_into().ok()
        })
        .as_ref()
}

/// Installs `filter` on the calling thread (`PR_SET_NO_NEW_PRIVS` is already set). Async-signal-safe.
fn install_seccomp(filter: &seccompiler::BpfProgram) -> io::Result<()> {
    seccompiler::apply_filter(filter).map_err(|_| io::Error::last_os_error())
}

/// Whether the kernel installs `filter`: tried once in a forked child.
fn probe_seccomp(filter: &seccompiler::BpfProgram) -> bool {
    in_forked_child(|| {
        // SAFETY: prctl and a keyctl with integer arguments.
        let refused = unsafe {
            libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0
                && install_seccomp(filter).is_ok()
                && libc::syscall(libc::SYS_keyctl, 0, 0, 0, 0, 0) < 0
        };
        refused && io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
    })
}

fn mount_proc() -> io::Result<()> {
    // SAFETY: mount with constant strings.
    cvt(unsafe {
        libc::mount(
            c"proc".as_ptr(),
            c"/proc".as_ptr(),
            c"proc".as_ptr(),
            libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
            std::ptr::null(),
        )
    })
    .map(drop)
}

/// The interpreter's command line, prepared in the host so that H can exec it itself.
#[derive(Debug)]
pub(crate) struct Exec {
    program: CString,
    _strings: Vec<CString>,
    argv: Vec<*const libc::c_char>,
    envp: Vec<*const libc::c_char>,
}

// SAFETY: the pointers point into `program`/`_strings`, owned by the same value and never mutated.
unsafe impl Send for Exec {}
// SAFETY: as above; shared access only reads.
unsafe impl Sync for Exec {}

impl Plan {
    /// Lets the run's processes G and H share S's memory instead of copying it (`CLONE_VM`): H then
    /// execs `program` with `args` and `env` itself, as std would have.
    pub(crate) fn exec_with(
        &mut self,
        program: &Path,
        args: &[&std::ffi::OsStr],
        env: &[(String, String)],
    ) -> Result<(), Error> {
        let nul = |e: std::ffi::NulError| Error::Internal(e.to_string());
        let program = cstring(program)?;
        let mut strings = vec![program.clone()];
        for arg in args {
            strings.push(CString::new(arg.as_bytes()).map_err(nul)?);
        }
        let argc = strings.len();
        for (k, v) in env {
            strings.push(CString::new(format!("{k}={v}")).map_err(nul)?);
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

/// Stack of G and of H (each), which run on their own stacks in S's memory.
const CHILD_STACK: usize = 256 << 10;

/// What G and H read when they start (copied: S's stack may change once S moves on).
#[derive(Clone, Copy)]
struct InitArgs {
    plan: *const Plan,
    exec: *const Exec,
    /// The shared status page (never unmapped).
    page: *mut libc::c_int,
    /// Write end of the pipe through which G and H report a setup failure (an errno) or success (0).
    report: RawFd,
    h_stack_top: *mut libc::c_void,
}

/// S with a PID namespace and a prepared exec: starts G (and G starts H) sharing S's memory, so
/// neither copies the host's page tables nor takes copy-on-write faults, and H execs directly. S
/// returns only on a setup failure (the error reaches the host's `spawn` as before); otherwise it
/// supervises G.
fn start_init(plan: &Plan, exec: &Exec) -> io::Result<()> {
    let page = SharedStatus::new()?;
    let mut fds = [-1; 2];
    // SAFETY: pipe2 into a live array; mmap of anonymous private memory.
    let stacks = unsafe {
        cvt(libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC))?;
        let stacks = libc::mmap(
            std::ptr::null_mut(),
            2 * CHILD_STACK,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK,
            -1,
            0,
        );
        if stacks == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        stacks.cast::<u8>()
    };
    let [read_end, write_end] = fds;
    let args = InitArgs {
        plan,
        exec,
        page: page.0,
        report: write_end,
        // SAFETY: both offsets stay within (or one past) the mapping.
        h_stack_top: unsafe { stacks.add(2 * CHILD_STACK) }.cast(),
    };
    page.arm();
    // SAFETY: G runs `init_main` on its own stack in our memory and only makes system calls; `args`
    // outlives its first reads (S blocks on the pipe until G and H are done with setup). The kernel
    // clears and wakes the page's `alive` word when G exits (CLONE_CHILD_CLEARTID).
    let init = unsafe {
        libc::clone(
            init_main,
            stacks.add(CHILD_STACK).cast(),
            libc::CLONE_VM | libc::CLONE_CHILD_CLEARTID | libc::SIGCHLD,
            std::ptr::addr_of!(args).cast_mut().cast(),
            std::ptr::null_mut::<libc::pid_t>(),
            std::ptr::null_mut::<libc::c_void>(),
            page.alive(),
        )
    };
    // SAFETY: closing our copy of the write end; reading four bytes into a live buffer.
    let reported = unsafe {
        libc::close(write_end);
        let mut buf = [0u8; 4];
        let mut got = 0;
        while got < 4 {
            let n = libc::read(read_end, buf.as_mut_ptr().add(got).cast(), 4 - got);
            if n > 0 {
                got += n as usize;
            } else if n == 0 || io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
                break;
            }
        }
        libc::close(read_end);
        (got == 4).then(|| i32::from_ne_bytes(buf))
    };
    cvt(init)?;
    match reported {
        Some(0) => supervise(init, &page),
        Some(errno) => Err(io::Error::from_raw_os_error(errno)),
        None => Err(io::Error::other("the run's init process died during setup")),
    }
}

fn report_errno(fd: RawFd, errno: i32) {
    let buf = errno.to_ne_bytes();
    // SAFETY: a write of a live 4-byte buffer (atomic on a pipe).
    unsafe { libc::write(fd, buf.as_ptr().cast(), buf.len()) };
}

fn errno_of(e: &io::Error) -> i32 {
    e.raw_os_error().filter(|&n| n != 0).unwrap_or(libc::EIO)
}

/// G: PID 1 of the run. Mounts `/proc`, starts H (suspended until H has exec'd), reports success,
/// then reaps.
extern "C" fn init_main(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` points at S's `InitArgs`, live until G reports; the plan and page outlive G.
    let args = unsafe { *arg.cast::<InitArgs>() };
    let plan = unsafe { &*args.plan };
    let setup = || -> io::Result<libc::pid_t> {
        set_pdeathsig()?;
        // G holds a copy of the host's memory: nothing in the run may read it through /proc/1.
        // SAFETY: prctl with integer arguments (the flag belongs to the memory S and G share).
        cvt(unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) })?;
        mount_proc()?;
        inner_setup(plan)?;
        let mut h_args = args;
        // SAFETY: H runs `interpreter_main` on its own stack; we are suspended until it execs or
        // exits (CLONE_VFORK), so `h_args` outlives its use.
        cvt(unsafe {
            libc::clone(
                interpreter_main,
                args.h_stack_top,
                libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
                std::ptr::addr_of_mut!(h_args).cast(),
            )
        })
    };
    match setup() {
        Ok(python) => {
            report_errno(args.report, 0); // after a failed exec, H's errno is already in the pipe
            reap(python, &SharedStatus(args.page))
        }
        Err(e) => {
            report_errno(args.report, errno_of(&e));
            // SAFETY: _exit ends G only.
            unsafe { libc::_exit(125) }
        }
    }
}

/// H: the interpreter. Restricts itself and execs; on failure reports the errno and exits.
extern "C" fn interpreter_main(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` points at G's copy of the arguments; G is suspended until we exec or exit.
    let args = unsafe { *arg.cast::<InitArgs>() };
    let (plan, exec) = unsafe { (&*args.plan, &*args.exec) };
    let error = match restrict_interpreter(plan) {
        // SAFETY: execve with NUL-terminated strings and NULL-terminated arrays prepared in the host.
        Ok(()) => unsafe {
            libc::execve(
                exec.program.as_ptr(),
                exec.argv.as_ptr(),
                exec.envp.as_ptr(),
            );
            io::Error::last_os_error()
        },
        Err(e) => e,
    };
    report_errno(args.report, errno_of(&error));
    // SAFETY: _exit ends H only.
    unsafe { libc::_exit(127) }
}

/// In the innermost namespace, after `/proc` is mounted: Landlock rules on the run's own tmpfs and
/// `/proc`, and the working directory again (the /tmp it was in is now the private one).
fn inner_setup(plan: &Plan) -> io::Result<()> {
    if let Some(ruleset) = &plan.landlock {
        for (path, access) in &plan.landlock_inner {
            // SAFETY: open/close and the landlock_add_rule system call on a packed attribute.
            unsafe {
                let fd = libc::open(path.as_ptr(), libc::O_PATH | libc::O_CLOEXEC);
                if fd < 0 {
                    continue;
                }
                let attr = PathBeneathAttr {
                    allowed_access: *access,
                    parent_fd: fd,
                };
                let rc = libc::syscall(
                    libc::SYS_landlock_add_rule,
                    ruleset.as_raw_fd(),
                    1u32, // LANDLOCK_RULE_PATH_BENEATH
                    &attr as *const PathBeneathAttr,
                    0u32,
                );
                libc::close(fd);
                cvt_long(rc)?;
            }
        }
    }
    if !plan.mount_ops.is_empty() {
        // SAFETY: chdir to a NUL-terminated path.
        cvt(unsafe { libc::chdir(plan.work_dir.as_ptr()) })?;
    }
    Ok(())
}

fn run_mount_ops(plan: &Plan) -> io::Result<()> {
    const MAX_SOURCES: usize = 16;
    if plan.mount_ops.is_empty() {
        return Ok(());
    }
    // SAFETY: mount/open/mkdir/close with NUL-terminated paths prepared in the host.
    unsafe {
        // Nothing done here may propagate back to the host.
        cvt(libc::mount(
            std::ptr::null(),
            c"/".as_ptr(),
            std::ptr::null(),
            libc::MS_REC | libc::MS_PRIVATE,
            std::ptr::null(),
        ))?;
        let mut fds = [-1; MAX_SOURCES];
        for (i, source) in plan.bind_sources.iter().take(MAX_SOURCES).enumerate() {
            fds[i] = cvt(libc::open(
                source.as_ptr(),
                libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
            ))?;
        }
        for op in &plan.mount_ops {
            match op {
                MountOp::Tmpfs { target, data } => {
                    cvt(libc::mount(
                        c"tmpfs".as_ptr(),
                        target.as_ptr(),
                        c"tmpfs".as_ptr(),
                        libc::MS_NOSUID | libc::MS_NODEV,
                        data.as_ptr().cast(),
                    ))?;
                }
                MountOp::Mkdir(path) => {
                    if libc::mkdir(path.as_ptr(), 0o755) < 0
                        && io::Error::last_os_error().raw_os_error() != Some(libc::EEXIST)
                    {
                        return Err(io::Error::last_os_error());
                    }
                }
                MountOp::Bind { source, target } => {
                    let fd = *fds.get(*source).ok_or(io::ErrorKind::InvalidInput)?;
                    let mut link = [0u8; 32];
                    fd_link(fd, &mut link);
                    cvt(libc::mount(
                        link.as_ptr().cast(),
                        target.as_ptr(),
                        std::ptr::null(),
                        libc::MS_BIND | libc::MS_REC,
                        std::ptr::null(),
                    ))?;
                }
            }
        }
        for fd in fds.into_iter().filter(|&fd| fd >= 0) {
            libc::close(fd);
        }
    }
    Ok(())
}

/// Writes `/proc/self/fd/<fd>\0` into `buf` without allocating.
fn fd_link(fd: RawFd, buf: &mut [u8; 32]) {
    let prefix = b"/proc/self/fd/";
    buf[..prefix.len()].copy_from_slice(prefix);
    let mut digits = [0u8; 10];
    let mut n = fd.unsigned_abs();
    let mut len = 0;
    loop {
        digits[len] = b'0' + (n % 10) as u8;
        len += 1;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    for i in 0..len {
        buf[prefix.len() + i] = digits[len - 1 - i];
    }
    buf[prefix.len() + len] = 0;
}

fn set_rlimit(resource: libc::__rlimit_resource_t, value: u64) -> io::Result<()> {
    set_rlimit2(resource, value, value)
}

fn set_rlimit2(resource: libc::__rlimit_resource_t, soft: u64, hard: u64) -> io::Result<()> {
    let limit = libc::rlimit {
        rlim_cur: soft,
        rlim_max: hard,
    };
    // SAFETY: setrlimit with a live struct.
    cvt(unsafe { libc::setrlimit(resource, &limit) }).map(drop)
}

/// A page shared between S and G through which G reports the interpreter's wait status: word 0 is
/// set once word 1 holds the status; word 2 (`alive`) is cleared, with a futex wake, when G has
/// reported or has exited.
struct SharedStatus(*mut libc::c_int);

impl SharedStatus {
    fn new() -> io::Result<Self> {
        // SAFETY: an anonymous shared mapping; never unmapped (the processes _exit).
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                4096,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Self(ptr.cast()))
    }

    fn set(&self, status: libc::c_int) {
        // SAFETY: the mapping is live and holds three ints.
        unsafe {
            self.0.add(1).write_volatile(status);
            self.0.write_volatile(1);
        }
    }

    fn alive(&self) -> *mut libc::c_int {
        // SAFETY: within the page.
        unsafe { self.0.add(2) }
    }

    fn arm(&self) {
        // SAFETY: as above.
        unsafe { self.alive().write_volatile(1) }
    }

    /// G: the status is set; wake S.
    fn release(&self) {
        // SAFETY: as above; a (process-shared) futex wake on the page.
        unsafe {
            self.alive().write_volatile(0);
            libc::syscall(libc::SYS_futex, self.alive(), libc::FUTEX_WAKE, 1);
        }
    }

    /// S: sleeps until G has reported or exited.
    fn wait_released(&self) {
        // SAFETY: as above; a futex wait that returns at once when the word is already 0.
        unsafe {
            while self.alive().read_volatile() != 0 {
                libc::syscall(
                    libc::SYS_futex,
                    self.alive(),
                    libc::FUTEX_WAIT,
                    1,
                    std::ptr::null::<libc::timespec>(),
                );
            }
        }
    }

    fn get(&self) -> Option<libc::c_int> {
        // SAFETY: as above.
        unsafe { (self.0.read_volatile() == 1).then(|| self.0.add(1).read_volatile()) }
    }
}

/// Closes every descriptor: S and G must hold none of the run's pipes (nor std's exec-error pipe).
fn close_all() {
    // SAFETY: close_range on the whole table; the fallback closes one by one.
    unsafe {
        if libc::syscall(libc::SYS_close_range, 0u32, u32::MAX, 0u32) != 0 {
            for fd in 0..4096 {
                libc::close(fd);
            }
        }
    }
}

/// S: waits for G's report and leaves with the interpreter's status (same exit code, or the same
/// signal) at once. G, which shares S's memory and namespaces, is still alive then, so S's exit is
/// cheap and the host hears of the end before the run's memory and namespaces are torn down; that
/// teardown happens in G, which S's exit kills (PDEATHSIG).
fn supervise(init: libc::pid_t, page: &SharedStatus) -> ! {
    close_all();
    page.wait_released();
    let mut status = 0;
    // SAFETY: waitpid/kill/signal/_exit on our own processes.
    unsafe {
        let status = match page.get() {
            Some(status) => status,
            None => {
                // G ended without a report (killed): leave with its status.
                while libc::waitpid(init, &mut status, 0) < 0
                    && io::Error::last_os_error().raw_os_error() == Some(libc::EINTR)
                {
                }
                status
            }
        };
        if libc::WIFSIGNALED(status) {
            let sig = libc::WTERMSIG(status);
            libc::signal(sig, libc::SIG_DFL);
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, sig);
            libc::sigprocmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
            libc::kill(libc::getpid(), sig);
            libc::_exit(128 + sig);
        }
        libc::_exit(if libc::WIFEXITED(status) {
            libc::WEXITSTATUS(status)
        } else {
            1
        })
    }
}

/// G: reaps every process of the run (orphans are re-parented to it) until the interpreter ends, then
/// kills whatever is left in the namespace, reports the interpreter's status and waits for S's exit
/// to kill it (the kernel then tears the run's namespaces down).
fn reap(python: libc::pid_t, page: &SharedStatus) -> ! {
    close_all();
    let mut status = 0;
    // SAFETY: waitpid, kill, nanosleep and _exit.
    unsafe {
        loop {
            let r = libc::waitpid(-1, &mut status, 0);
            if r == python {
                break;
            }
            if r < 0 && io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
                libc::_exit(1); // no report: S leaves with this status
            }
        }
        // From PID 1, -1 is every other process of this PID namespace and nothing outside it.
        libc::kill(-1, libc::SIGKILL);
        page.set(status);
        page.release();
        // S's exit kills G (PDEATHSIG); should that never come, G leaves by itself.
        let second = libc::timespec {
            tv_sec: 1,
            tv_nsec: 0,
        };
        libc::nanosleep(&second, std::ptr::null_mut());
        libc::_exit(0)
    }
}

/// Kills every process of `uid` (the fallback sweep when there is no PID namespace): a forked helper
/// takes the uid and sends SIGKILL to everything it may signal.
pub(crate) fn kill_all_of_uid(uid: u32) {
    // SAFETY: the child makes raw system calls only and _exits.
    unsafe {
        let pid = libc::fork();
        if pid == 0 {
            let ok = libc::syscall(libc::SYS_setresuid, uid, uid, uid) == 0;
            if ok {
                libc::kill(-1, libc::SIGKILL);
            }
            libc::_exit(0);
        }
        if pid > 0 {
            wait_exit_code(pid);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fd_link_is_a_nul_terminated_proc_path() {
        let mut buf = [0u8; 32];
        fd_link(1234, &mut buf);
        assert_eq!(&buf[..19], b"/proc/self/fd/1234\0");
    }

    #[test]
    fn first_untraversable_finds_the_outermost_closed_directory() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let closed = dir.path().join("closed");
        std::fs::create_dir_all(closed.join("inner")).unwrap();
        std::fs::set_permissions(&closed, std::fs::Permissions::from_mode(0o700)).unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(first_untraversable(&closed.join("inner")), Some(closed));
    }
}
