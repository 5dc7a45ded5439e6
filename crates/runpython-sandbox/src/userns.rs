//! User namespaces and uids: the run's uid (a fresh one per run when the host is root), the id maps
//! written after `unshare(CLONE_NEWUSER)`, and the limit that keeps the code from making namespaces.

use std::ffi::CString;

use super::sys::{cvt, cvt_long, set_pdeathsig, write_file, AtStep, Step, StepError};

/// First uid of the range runs are given when the host is root: above the subordinate ranges that
/// `useradd` hands out (100000 + 65536 per user) so no real user or container owns it.
pub(crate) const RUN_UID_BASE: u32 = 0x4000_0000;

/// How many uids that range holds.
pub(crate) const RUN_UID_COUNT: u32 = 0x0100_0000;

/// Whether `uid` is one of those runs are given when the host is root.
pub fn is_run_uid(uid: u32) -> bool {
    (RUN_UID_BASE..RUN_UID_BASE + RUN_UID_COUNT).contains(&uid)
}

/// A fresh uid from the run range (random: concurrent runs never share one in practice, and a
/// collision only means two runs share a uid, never that a run gets a real user's). Never the range's
/// first, which is the templates' own ([`template_userns`]).
pub(crate) fn random_run_uid() -> u32 {
    let mut random = [0u8; 4];
    let _ = getrandom::fill(&mut random);
    RUN_UID_BASE + 1 + (u32::from_le_bytes(random) % (RUN_UID_COUNT - 1))
}

/// For a root host: the user namespace its templates live in, made once per process. Inside, ids
/// `0..RUN_UID_COUNT` map to the run range (`0` is [`RUN_UID_BASE`], the templates' own uid; `k` is
/// `RUN_UID_BASE + k`), so a template, root inside, can give each run it forks a uid of its own. A
/// map of more than one id must be written from outside with `CAP_SETUID` over the parent namespace:
/// the host writes it for a helper born in the new namespace, and keeps a descriptor of it.
pub(crate) fn template_userns() -> Result<&'static std::os::fd::OwnedFd, String> {
    static USERNS: std::sync::OnceLock<Result<std::os::fd::OwnedFd, String>> =
        std::sync::OnceLock::new();
    USERNS
        .get_or_init(|| {
            make_template_userns()
                .map_err(|e| format!("{}: {e}", super::sys::Step::TemplateUserns.describe()))
        })
        .as_ref()
        .map_err(Clone::clone)
}

fn make_template_userns() -> std::io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::AsRawFd;
    let (ready_r, ready_w) = super::fd::pass::pipe()?;
    let (release_r, release_w) = super::fd::pass::pipe()?;
    let mut args = Helper {
        close: [ready_r.as_raw_fd(), release_w.as_raw_fd()],
        ready: ready_w.as_raw_fd(),
        release: release_r.as_raw_fd(),
    };
    // SAFETY: `helper_main` makes system calls only; `args` lives until the helper is waited for
    // below.
    let (pid, stack) = unsafe {
        super::clone_vm::clone_vm_helper(
            helper_main,
            libc::CLONE_NEWUSER,
            std::ptr::addr_of_mut!(args).cast(),
        )?
    };
    drop((ready_w, release_r));
    let made = match super::sys::read_exact_fd::<1>(ready_r.as_raw_fd()) {
        Some([1]) => (|| {
            let map = format!("0 {RUN_UID_BASE} {RUN_UID_COUNT}");
            std::fs::write(format!("/proc/{pid}/uid_map"), &map)?;
            std::fs::write(format!("/proc/{pid}/gid_map"), &map)?;
            super::sys::open_high(&format!("/proc/{pid}/ns/user"))
        })(),
        _ => Err(std::io::Error::other("the helper died")),
    };
    drop(release_w); // the helper exits; the descriptor keeps its namespace
    super::sys::wait_exit_code(pid);
    drop(stack);
    made
}

/// What the helper of [`make_template_userns`] works with.
struct Helper {
    /// Its copies of the host's ends of the pipes: open, its wait would never end.
    close: [libc::c_int; 2],
    ready: libc::c_int,
    release: libc::c_int,
}

/// The helper, born in the new user namespace: says so and waits until the host has mapped it and
/// opened it.
extern "C" fn helper_main(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` points at the host's `Helper`, alive until this helper has exited; only system
    // calls follow.
    unsafe {
        let args = &*arg.cast::<Helper>();
        for fd in args.close {
            libc::close(fd);
        }
        libc::write(args.ready, [1u8].as_ptr().cast(), 1);
        let mut wait = [0u8; 1];
        libc::read(args.release, wait.as_mut_ptr().cast(), 1);
        libc::_exit(0)
    }
}

/// The uid and gid the code has inside its user namespace. Not 0: the process that creates the
/// namespace holds every capability in it, and an exec as a non-zero id leaves the interpreter none
/// (an exec as 0 would give them all back).
pub(crate) const INSIDE_ID: u32 = 1000;

/// The `uid_map`/`gid_map` lines: one inside id mapped to one outside id.
#[derive(Debug)]
pub(crate) struct IdMaps {
    uid_map: CString,
    gid_map: CString,
}

impl IdMaps {
    /// [`INSIDE_ID`] mapped to `uid` and `gid` of the parent namespace.
    pub(crate) fn new(uid: u32, gid: u32) -> Self {
        Self::mapping(INSIDE_ID, uid, gid)
    }

    /// `inside` mapped to `uid` and `gid` of the parent namespace.
    pub(crate) fn mapping(inside: u32, uid: u32, gid: u32) -> Self {
        let line = |id: u32| CString::new(format!("{inside} {id} 1")).unwrap_or_default();
        Self {
            uid_map: line(uid),
            gid_map: line(gid),
        }
    }

    /// Writes the maps of the calling process (after `unshare(CLONE_NEWUSER)`). Async-signal-safe.
    pub(crate) fn write(&self) -> Result<(), StepError> {
        write_file(c"/proc/self/setgroups", b"deny").at(Step::WriteSetgroups)?;
        write_file(c"/proc/self/uid_map", self.uid_map.as_bytes()).at(Step::WriteUidMap)?;
        write_file(c"/proc/self/gid_map", self.gid_map.as_bytes()).at(Step::WriteGidMap)
    }
}

/// Forbids user namespaces below the calling process's own (it must hold `CAP_SYS_RESOURCE` in it).
/// Without a capability the code cannot create any other namespace either, so the kernel surface that
/// namespace capabilities open (netfilter, mounts, ...) stays closed. The limit is per user namespace:
/// the host's is untouched. Async-signal-safe.
pub(crate) fn forbid_nested_user_namespaces() -> Result<(), StepError> {
    write_file(c"/proc/sys/user/max_user_namespaces", b"0").at(Step::ForbidNestedUserns)
}

/// Drops every privilege of the calling thread to `uid`/`gid` with raw system calls (only this thread
/// exists after fork; glibc's setxid broadcast is not wanted there).
pub(crate) fn drop_ids(uid: u32, gid: u32) -> Result<(), StepError> {
    // SAFETY: raw credential system calls with plain integer arguments.
    unsafe {
        cvt_long(libc::syscall(
            libc::SYS_setgroups,
            0usize,
            std::ptr::null::<libc::gid_t>(),
        ))
        .at(Step::DropIds)?;
        cvt_long(libc::syscall(libc::SYS_setresgid, gid, gid, gid)).at(Step::DropIds)?;
        cvt_long(libc::syscall(libc::SYS_setresuid, uid, uid, uid)).at(Step::DropIds)?;
        // A credential change makes the process undumpable, which would make /proc/self/uid_map
        // root's; and it clears the parent-death signal.
        cvt(libc::prctl(libc::PR_SET_DUMPABLE, 1, 0, 0, 0)).at(Step::Dumpable)?;
    }
    set_pdeathsig().at(Step::Pdeathsig)
}

/// Kills every process of `uid` (the fallback sweep when there is no PID namespace): a forked helper
/// takes the uid and sends SIGKILL to everything it may signal.
pub fn kill_all_of_uid(uid: u32) {
    let _ = super::sys::in_forked_child(Step::Fork, || {
        // SAFETY: raw system calls with integer arguments in the forked helper.
        unsafe {
            if libc::syscall(libc::SYS_setresuid, uid, uid, uid) == 0 {
                libc::kill(-1, libc::SIGKILL);
            }
        }
        Ok(())
    });
}
