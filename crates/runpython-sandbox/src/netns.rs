//! Fresh, empty network namespaces made ahead of time, one per run (never shared).
//!
//! Creating a network namespace costs the kernel ~0.5–1 ms, which a host thread takes off the run's
//! critical path: it keeps [`READY`] namespaces made and refills when a run ends (idle time). A
//! namespace is owned by a user namespace the code is not in, so the code cannot configure it: the
//! host's own for a root host; for a non-root host, a user namespace made with it by a helper born
//! with `clone(CLONE_VM | CLONE_NEWUSER | CLONE_NEWNET)` (a threaded process cannot make a user
//! namespace itself). S joins that owner, then the namespace, then makes the run's own user namespace
//! inside it.
//!
//! Every network namespace the sandbox makes, here or in a run's own setup, has its loopback up
//! ([`loopback_up`], by the process that made it, as bubblewrap does): `127.0.0.1` and `::1` are the
//! run's own, for the servers and clients its code starts. Nothing else is in the namespace, so
//! nothing of the host is reachable through them.
//!
//! The thread shuts down by itself when no run has taken a namespace for [`IDLE`], closing the ones it
//! holds (each pins kernel memory); the next run starts it again.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::{Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

use super::fd::pass::pipe;
use super::sys::{cvt, getegid, geteuid, in_forked_child, open_high, wait_exit_code};
use super::sys::{AtStep, Step, StepError};
use super::userns::IdMaps;

/// How many empty network namespaces are kept ready (more concurrent starts create their own).
const READY: usize = 4;

/// With no namespace taken for this long, the pool's thread closes its namespaces and exits.
const IDLE: Duration = Duration::from_secs(300);

/// A network namespace made ahead of time for one run.
#[derive(Debug)]
pub(crate) struct ReadyNetns {
    pub net: OwnedFd,
    /// For a non-root host, the user namespace that owns `net` (it maps the host's uid and gid to
    /// 0). The host's uid owns it in turn, so S may join it and, holding every capability there,
    /// join `net`; the run's own user namespace is then made inside it. A root host needs neither.
    pub owner: Option<OwnedFd>,
}

#[derive(Default)]
struct State {
    ready: Vec<ReadyNetns>,
    /// A thread is filling the pool.
    running: bool,
    /// The kernel refused a namespace: stop trying (runs make their own).
    refused: bool,
    last_taken: Option<Instant>,
    /// Namespaces asked for so far: the pool starts filling at the second, so a process that runs
    /// once (`runpython run`) makes none it will not use.
    asked: usize,
}

struct Pool {
    state: Mutex<State>,
    wanted: Condvar,
}

fn pool() -> &'static Pool {
    static POOL: OnceLock<Pool> = OnceLock::new();
    POOL.get_or_init(|| Pool {
        state: Mutex::new(State::default()),
        wanted: Condvar::new(),
    })
}

fn lock(pool: &Pool) -> std::sync::MutexGuard<'_, State> {
    pool.state.lock().unwrap_or_else(|p| p.into_inner())
}

/// Starts the filling thread unless it runs (or the kernel refused).
fn ensure_thread(pool: &'static Pool, state: &mut State) {
    if state.running || state.refused {
        return;
    }
    state.running = std::thread::Builder::new()
        .name("runpython-netns".into())
        .spawn(move || fill(pool))
        .is_ok();
}

/// The thread: keeps [`READY`] namespaces made; exits after [`IDLE`] without a taker.
fn fill(pool: &'static Pool) {
    // Normal priority on purpose: making a namespace takes kernel locks (rtnl) that a run falling back
    // to its own namespace, or any other host process, may wait for; a low-priority holder would make
    // them wait behind every other task.
    loop {
        {
            let mut state = lock(pool);
            while state.ready.len() >= READY {
                let idle_for = state.last_taken.map_or(Duration::ZERO, |t| t.elapsed());
                if idle_for >= IDLE {
                    state.ready.clear(); // closes them
                    state.running = false;
                    return;
                }
                state = pool
                    .wanted
                    .wait_timeout(state, IDLE - idle_for)
                    .map(|(s, _)| s)
                    .unwrap_or_else(|p| p.into_inner().0);
            }
        }
        // Each unshare moves this thread into a new namespace; the descriptor keeps it alive.
        let made = if geteuid() == 0 {
            new_netns().map(|net| ReadyNetns { net, owner: None })
        } else {
            new_owned_netns()
        };
        let mut state = lock(pool);
        match made {
            Ok(ready) => state.ready.push(ready),
            Err(_) => {
                state.refused = true;
                state.running = false;
                return;
            }
        }
    }
}

/// A ready network namespace for one run, or `None` when the pool is empty (the run then creates its
/// own). The pool is refilled by [`refill`] when a run ends. A process's first run makes its own: only
/// from its second does the pool fill (a one-shot process would make namespaces for nothing, each
/// ~1 ms of the kernel's time and more to tear down, beside its one run on the CPU).
pub(crate) fn take() -> Option<ReadyNetns> {
    let pool = pool();
    let mut state = lock(pool);
    state.last_taken = Some(Instant::now());
    state.asked += 1;
    if state.asked < 2 {
        return None;
    }
    ensure_thread(pool, &mut state);
    let ready = state.ready.pop();
    if ready.is_none() {
        pool.wanted.notify_one();
    }
    ready
}

/// Asks the pool to make up for the namespaces taken: called when a run ends, so that making a
/// namespace competes with no run's setup or interpreter start for the CPU.
pub fn refill() {
    let pool = pool();
    let state = lock(pool);
    if state.running {
        pool.wanted.notify_one();
    }
}

/// Moves the calling thread into a new network namespace and returns a descriptor of it, above the
/// child's fixed descriptor slots.
fn new_netns() -> io::Result<OwnedFd> {
    // SAFETY: unshare of the calling thread's network namespace.
    cvt(unsafe { libc::unshare(libc::CLONE_NEWNET) })?;
    loopback_up().map_err(|e| e.source())?;
    open_high("/proc/thread-self/ns/net")
}

/// Brings `lo` of the calling thread's network namespace up (`SIOCSIFFLAGS` on a throwaway socket),
/// with `CAP_NET_ADMIN` over it: the kernel gives it `127.0.0.1/8` and, with IPv6 on, `::1`.
/// Idempotent. Async-signal-safe.
pub(crate) fn loopback_up() -> Result<(), StepError> {
    // SAFETY: a socket, two ioctls on a zeroed ifreq naming "lo", and a close.
    unsafe {
        let fd = cvt(libc::socket(
            libc::AF_INET,
            libc::SOCK_DGRAM | libc::SOCK_CLOEXEC,
            0,
        ))
        .at(Step::LoopbackUp)?;
        let mut req: libc::ifreq = std::mem::zeroed();
        for (i, b) in b"lo\0".iter().enumerate() {
            req.ifr_name[i] = *b as libc::c_char;
        }
        let result = (|| {
            cvt(libc::ioctl(fd, libc::SIOCGIFFLAGS, &mut req))?;
            req.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
            cvt(libc::ioctl(fd, libc::SIOCSIFFLAGS, &req))
        })();
        libc::close(fd);
        result.map(drop).at(Step::LoopbackUp)
    }
}

/// What the helper of [`new_owned_netns`] works with.
struct Helper {
    ids: *const IdMaps,
    /// Its copies of the host's ends of the pipes: open, its wait would never end.
    close: [RawFd; 2],
    ready: RawFd,
    release: RawFd,
}

/// For a non-root host: a new user namespace (the host's uid and gid mapped to 0) owning a new network
/// namespace, both made by a helper (a threaded process cannot make a user namespace) and kept by
/// descriptors once the helper is gone.
pub(crate) fn new_owned_netns() -> io::Result<ReadyNetns> {
    let ids = IdMaps::mapping(0, geteuid(), getegid());
    let (ready_r, ready_w) = pipe()?;
    let (release_r, release_w) = pipe()?;
    let mut args = Helper {
        ids: &ids,
        close: [ready_r.as_raw_fd(), release_w.as_raw_fd()],
        ready: ready_w.as_raw_fd(),
        release: release_r.as_raw_fd(),
    };
    // SAFETY: `helper_main` makes system calls only; `args` (and the `ids` it points at) live until
    // the helper is waited for below.
    let (pid, stack) = unsafe {
        super::clone_vm::clone_vm_helper(
            helper_main,
            libc::CLONE_NEWUSER | libc::CLONE_NEWNET,
            std::ptr::addr_of_mut!(args).cast(),
        )?
    };
    drop((ready_w, release_r));
    let made = match super::sys::read_exact_fd::<1>(ready_r.as_raw_fd()) {
        Some([1]) => {
            let open = |kind: &str| open_high(&format!("/proc/{pid}/ns/{kind}"));
            open("user").and_then(|owner| {
                Ok(ReadyNetns {
                    net: open("net")?,
                    owner: Some(owner),
                })
            })
        }
        _ => Err(io::Error::other(
            "cannot map the host's ids in a new user namespace owning a network namespace, or bring \
             its loopback up",
        )),
    };
    drop(release_w); // the helper exits; the descriptors keep its namespaces
    wait_exit_code(pid);
    drop(stack);
    made
}

/// The helper, born in a new user and network namespace: maps the host's ids to 0, brings the
/// loopback up, says whether both worked, and waits until the host has opened its namespaces.
extern "C" fn helper_main(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` points at the host's `Helper`, alive until this helper has exited; only system
    // calls follow.
    unsafe {
        let args = &*arg.cast::<Helper>();
        for fd in args.close {
            libc::close(fd);
        }
        let byte = [u8::from(
            (*args.ids).write().is_ok() && loopback_up().is_ok(),
        )];
        libc::write(args.ready, byte.as_ptr().cast(), 1);
        let mut wait = [0u8; 1];
        libc::read(args.release, wait.as_mut_ptr().cast(), 1);
        libc::_exit(0)
    }
}

/// Whether a run can start in `ready` as S will: join its owner, join it, then make the run's user,
/// PID and mount namespaces inside and map them. Tried once in a forked child.
pub(crate) fn probe_owned(ready: &ReadyNetns) -> Result<(), StepError> {
    let Some(owner) = &ready.owner else {
        return Err(StepError::new(Step::JoinOwnerUserns, libc::EINVAL));
    };
    let ids = IdMaps::new(0, 0);
    in_forked_child(Step::Fork, || {
        // SAFETY: setns/unshare with descriptors and flags prepared before the fork.
        unsafe {
            cvt(libc::setns(owner.as_raw_fd(), libc::CLONE_NEWUSER)).at(Step::JoinOwnerUserns)?;
            cvt(libc::setns(ready.net.as_raw_fd(), libc::CLONE_NEWNET)).at(Step::JoinNetns)?;
            cvt(libc::unshare(
                libc::CLONE_NEWUSER | libc::CLONE_NEWPID | libc::CLONE_NEWNS,
            ))
            .at(Step::Unshare)?;
        }
        ids.write()
    })
}
