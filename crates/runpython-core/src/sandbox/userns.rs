//! User namespaces and uids: the run's uid (a fresh one per run when the host is root), the id maps
//! written after `unshare(CLONE_NEWUSER)`, and the limit that keeps the code from making namespaces.

use std::ffi::CString;

use super::sys::{cvt, cvt_long, set_pdeathsig, write_file, AtStep, Step, StepError};

/// First uid of the range runs are given when the host is root: above the subordinate ranges that
/// `useradd` hands out (100000 + 65536 per user) so no real user or container owns it.
pub(crate) const RUN_UID_BASE: u32 = 0x4000_0000;

/// How many uids that range holds.
const RUN_UID_COUNT: u32 = 0x0100_0000;

/// Whether `uid` is one of those runs are given when the host is root.
pub(crate) fn is_run_uid(uid: u32) -> bool {
    (RUN_UID_BASE..RUN_UID_BASE + RUN_UID_COUNT).contains(&uid)
}

/// A fresh uid from the run range (random: concurrent runs never share one in practice, and a
/// collision only means two runs share a uid, never that a run gets a real user's).
pub(crate) fn random_run_uid() -> u32 {
    let mut random = [0u8; 4];
    let _ = getrandom::fill(&mut random);
    RUN_UID_BASE + (u32::from_le_bytes(random) % RUN_UID_COUNT)
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
pub(crate) fn kill_all_of_uid(uid: u32) {
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
