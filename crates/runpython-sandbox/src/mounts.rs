//! Building and entering the run's filesystem view ([`super::view`]) between fork and exec: plain
//! system calls on the plan's precomputed C strings, each failure named by its step.

use std::ffi::CString;
use std::io;
use std::os::fd::RawFd;

use super::sys::{cvt, cvt_long, AtStep, Step, StepError};
use super::view::{Op, View, INSIDE_SOURCE};

/// Most host paths a view binds (each opened before the first mount).
const MAX_SOURCES: usize = 64;

#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

const MOUNT_ATTR_RDONLY: u64 = 0x1;
const AT_RECURSIVE: libc::c_uint = 0x8000;

/// Makes the mount at `target` and everything below it read-only.
fn make_read_only(target: &CString, fd_of_target: RawFd) -> Result<(), StepError> {
    let attr = MountAttr {
        attr_set: MOUNT_ATTR_RDONLY,
        attr_clr: 0,
        propagation: 0,
        userns_fd: 0,
    };
    // SAFETY: mount_setattr with a live attribute struct and its size.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            libc::AT_FDCWD,
            target.as_ptr(),
            AT_RECURSIVE,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    if rc == 0 {
        return Ok(());
    }
    // Before Linux 5.12: a remount of the top mount, keeping the flags the kernel locked on it.
    let mut st: libc::statvfs = zeroed_statvfs();
    // SAFETY: fstatvfs into a live struct (glibc takes the flags from the kernel's statfs).
    cvt(unsafe { libc::fstatvfs(fd_of_target, &mut st) }).at(Step::ReadOnlyBind)?;
    let keep = (st.f_flag as libc::c_ulong)
        & (libc::MS_NOSUID
            | libc::MS_NODEV
            | libc::MS_NOEXEC
            | libc::MS_NOATIME
            | libc::MS_NODIRATIME
            | libc::MS_RELATIME);
    // SAFETY: a remount with a NUL-terminated target.
    cvt(unsafe {
        libc::mount(
            std::ptr::null(),
            target.as_ptr(),
            std::ptr::null(),
            libc::MS_REMOUNT | libc::MS_BIND | libc::MS_RDONLY | keep,
            std::ptr::null(),
        )
    })
    .map(drop)
    .at(Step::ReadOnlyBind)
}

fn zeroed_statvfs() -> libc::statvfs {
    // SAFETY: statvfs is plain data; all-zero is a valid value.
    unsafe { std::mem::zeroed() }
}

/// The host paths a view binds, opened (`O_PATH`) before anything is mounted: a root host's template
/// opens them as root, before it enters its own user namespace, where it could not traverse to some
/// of them (`/root/.pyenv`). Closed when dropped. Async-signal-safe.
pub(crate) struct Sources([RawFd; MAX_SOURCES]);

impl Drop for Sources {
    fn drop(&mut self) {
        for fd in self.0.into_iter().filter(|&fd| fd >= 0) {
            // SAFETY: closing descriptors `open_sources` opened.
            unsafe { libc::close(fd) };
        }
    }
}

/// Opens the view's host sources (see [`Sources`]). Async-signal-safe.
pub(crate) fn open_sources(view: &View) -> Result<Sources, StepError> {
    let mut sources = Sources([-1; MAX_SOURCES]);
    for (i, source) in view.sources.iter().enumerate() {
        if i >= MAX_SOURCES {
            return Err(StepError::new(Step::OpenBindSource, libc::E2BIG));
        }
        if view
            .ops
            .iter()
            .any(|op| matches!(op, Op::Bind { source, .. } if *source == i + INSIDE_SOURCE))
        {
            continue; // inside the new root: named by its path when bound
        }
        // SAFETY: open of a NUL-terminated path prepared in the host.
        sources.0[i] = cvt(unsafe { libc::open(source.as_ptr(), libc::O_PATH | libc::O_CLOEXEC) })
            .at(Step::OpenBindSource)?;
    }
    Ok(sources)
}

/// Builds the view under its new root (not entered yet) from its opened `sources` and moves into that
/// root: the working directory is what [`pivot`] enters later, possibly from a new mount namespace
/// (unsharing one moves a process's working directory to the copy of its mount) and after dropping to
/// a uid that could not traverse the root's host path. Async-signal-safe.
pub(crate) fn build(view: &View, sources: &Sources) -> Result<(), StepError> {
    build_with(view, &sources.0)?;
    // SAFETY: chdir to a NUL-terminated path prepared in the host.
    cvt(unsafe { libc::chdir(view.root.as_ptr()) })
        .map(drop)
        .at(Step::PivotRoot)
}

fn build_with(view: &View, fds: &[RawFd; MAX_SOURCES]) -> Result<(), StepError> {
    // SAFETY: every call below is a plain system call on NUL-terminated paths prepared in the host.
    unsafe {
        // Nothing done here may propagate back to the host.
        cvt(libc::mount(
            std::ptr::null(),
            c"/".as_ptr(),
            std::ptr::null(),
            libc::MS_REC | libc::MS_PRIVATE,
            std::ptr::null(),
        ))
        .at(Step::MountPrivate)?;
        for op in &view.ops {
            match op {
                Op::Tmpfs { target, data } => {
                    cvt(libc::mount(
                        c"tmpfs".as_ptr(),
                        target.as_ptr(),
                        c"tmpfs".as_ptr(),
                        libc::MS_NOSUID | libc::MS_NODEV,
                        data.as_ptr().cast(),
                    ))
                    .at(Step::MountTmpfs)?;
                }
                Op::Devpts { target, data } => {
                    cvt(libc::mount(
                        c"devpts".as_ptr(),
                        target.as_ptr(),
                        c"devpts".as_ptr(),
                        libc::MS_NOSUID | libc::MS_NOEXEC,
                        data.as_ptr().cast(),
                    ))
                    .at(Step::MountDevpts)?;
                }
                Op::Mkdir { path, mode } => {
                    if libc::mkdir(path.as_ptr(), 0o700) < 0 {
                        if io::Error::last_os_error().raw_os_error() != Some(libc::EEXIST) {
                            return Err(StepError::last(Step::MakeMountPoint));
                        }
                    } else {
                        cvt(libc::chmod(path.as_ptr(), *mode)).at(Step::MakeMountPoint)?;
                    }
                }
                Op::Chown(path) => {
                    if let Some((uid, gid)) = view.owner {
                        cvt(libc::chown(path.as_ptr(), uid, gid)).at(Step::MakeMountPoint)?;
                    }
                }
                Op::File(path) => {
                    let fd = libc::open(
                        path.as_ptr(),
                        libc::O_CREAT | libc::O_WRONLY | libc::O_CLOEXEC | libc::O_NOFOLLOW,
                        0o644,
                    );
                    if fd < 0 {
                        return Err(StepError::last(Step::MakeMountPoint));
                    }
                    libc::close(fd);
                }
                Op::Symlink { target, path } => {
                    if libc::symlink(target.as_ptr(), path.as_ptr()) < 0
                        && io::Error::last_os_error().raw_os_error() != Some(libc::EEXIST)
                    {
                        return Err(StepError::last(Step::MakeMountPoint));
                    }
                }
                Op::Bind {
                    source,
                    target,
                    readonly,
                } => {
                    let (from, inside) = if *source >= INSIDE_SOURCE {
                        (source - INSIDE_SOURCE, true)
                    } else {
                        (*source, false)
                    };
                    let mut link = [0u8; 32];
                    let source_ptr = if inside {
                        view.sources
                            .get(from)
                            .ok_or(StepError::new(Step::OpenBindSource, libc::EINVAL))?
                            .as_ptr()
                    } else {
                        let fd = *fds
                            .get(from)
                            .ok_or(StepError::new(Step::OpenBindSource, libc::EINVAL))?;
                        fd_link(fd, &mut link);
                        link.as_ptr().cast()
                    };
                    cvt(libc::mount(
                        source_ptr,
                        target.as_ptr(),
                        std::ptr::null(),
                        libc::MS_BIND | libc::MS_REC,
                        std::ptr::null(),
                    ))
                    .at(Step::BindMount)?;
                    if *readonly {
                        let fd = cvt(libc::open(target.as_ptr(), libc::O_PATH | libc::O_CLOEXEC))
                            .at(Step::ReadOnlyBind)?;
                        let made = make_read_only(target, fd);
                        libc::close(fd);
                        made?;
                    }
                }
                Op::ReadOnly(target) => {
                    cvt(libc::mount(
                        std::ptr::null(),
                        target.as_ptr(),
                        std::ptr::null(),
                        libc::MS_REMOUNT
                            | libc::MS_BIND
                            | libc::MS_RDONLY
                            | libc::MS_NOSUID
                            | libc::MS_NODEV,
                        std::ptr::null(),
                    ))
                    .at(Step::ReadOnlyBind)?;
                }
            }
        }
    }
    Ok(())
}

/// Enters the view from its root (the working directory): the new root becomes `/`, the host's tree is
/// detached, the cwd is the scratch's `work/`. Returns a descriptor of the scratch (for the host).
/// Async-signal-safe.
pub(crate) fn pivot(view: &View) -> Result<RawFd, StepError> {
    // SAFETY: pivot_root/umount2/chdir/open with NUL-terminated constants and prepared paths; the
    // working directory is the new root (see [`build`]).
    unsafe {
        cvt_long(libc::syscall(
            libc::SYS_pivot_root,
            c".".as_ptr(),
            c".".as_ptr(),
        ))
        .at(Step::PivotRoot)?;
        // The old root now sits on top of the new one, at "/": detach it.
        cvt(libc::umount2(c".".as_ptr(), libc::MNT_DETACH)).at(Step::PivotRoot)?;
        cvt(libc::chdir(c"/".as_ptr())).at(Step::PivotRoot)?;
        cvt(libc::chdir(view.work.as_ptr())).at(Step::Chdir)?;
        cvt(libc::open(
            view.scratch.as_ptr(),
            libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
        ))
        .at(Step::HandOverScratch)
    }
}

/// Mounts a fresh proc at `target` (from PID 1 of a new PID namespace). Async-signal-safe.
pub(crate) fn mount_proc(target: &std::ffi::CStr) -> Result<(), StepError> {
    // SAFETY: mount with NUL-terminated strings.
    cvt(unsafe {
        libc::mount(
            c"proc".as_ptr(),
            target.as_ptr(),
            c"proc".as_ptr(),
            libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
            std::ptr::null(),
        )
    })
    .map(drop)
    .at(Step::MountProc)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fd_link_is_a_nul_terminated_proc_path() {
        let mut buf = [0u8; 32];
        fd_link(1234, &mut buf);
        assert_eq!(&buf[..19], b"/proc/self/fd/1234\0");
    }
}
