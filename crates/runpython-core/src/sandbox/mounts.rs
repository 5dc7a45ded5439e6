//! The run's view of the filesystem: a mount plan built in the host, executed between fork and exec.

use std::ffi::CString;
use std::io;
use std::os::fd::RawFd;
use std::path::{Path, PathBuf};

use super::sys::{cvt, AtStep, Step, StepError};
use crate::error::Error;

/// One step of building the run's view of the filesystem, in order.
#[derive(Debug)]
pub(crate) enum MountOp {
    /// A fresh tmpfs over `target` (hides what was there).
    Tmpfs { target: CString, data: CString },
    /// A directory inside a tmpfs laid over an ancestor (an existing one is fine).
    Mkdir(CString),
    /// The host directory `sources[source]` (opened before the first tmpfs) bound onto `target`.
    Bind { source: usize, target: CString },
}

/// The mount operations of one run and the directories they bind (opened before anything is hidden).
#[derive(Debug, Default)]
pub(crate) struct MountPlan {
    pub bind_sources: Vec<CString>,
    pub ops: Vec<MountOp>,
}

/// A path as a C string; a NUL byte in it is the caller's error, named.
pub(crate) fn cstring(path: &Path) -> Result<CString, Error> {
    use std::os::unix::ffi::OsStrExt;
    CString::new(path.as_os_str().as_bytes()).map_err(|_| {
        Error::InvalidInput(format!(
            "the path {} contains a NUL byte; pass a path without one",
            path.display()
        ))
    })
}

/// The outermost ancestor of `dir` (or `dir` itself) that others cannot search.
pub(crate) fn first_untraversable(dir: &Path) -> Option<PathBuf> {
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

/// The filesystem view: a private /tmp and /dev/shm of `tmp_bytes` each, and (with a dropped uid) a
/// tmpfs over every directory the uid cannot traverse (`/root`), with the directories the code needs
/// (`read_dirs`, `run_dir`) bound back in place.
pub(crate) fn plan(
    read_dirs: &[PathBuf],
    run_dir: &Path,
    tmp_bytes: u64,
    dropped_uid: bool,
) -> Result<MountPlan, Error> {
    let mut plan = MountPlan::default();
    let mut overlays: Vec<(PathBuf, String)> = Vec::new();
    let tmp_data = format!("mode=1777,size={tmp_bytes}");
    overlays.push(("/tmp".into(), tmp_data.clone()));
    if Path::new("/dev/shm").is_dir() {
        overlays.push(("/dev/shm".into(), tmp_data));
    }
    let mut exposed: Vec<PathBuf> = read_dirs.to_vec();
    exposed.push(run_dir.to_owned());
    if dropped_uid {
        // The run directory is handed to the uid; the others must stay as they are.
        for dir in read_dirs {
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
        plan.ops.push(MountOp::Tmpfs {
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
            plan.ops.push(MountOp::Mkdir(cstring(&path)?));
        }
        plan.ops.push(MountOp::Bind {
            source: plan.bind_sources.len(),
            target: cstring(&dir)?,
        });
        plan.bind_sources.push(cstring(&dir)?);
        bound.push(dir);
    }
    Ok(plan)
}

/// Runs the plan in the calling process's (new) mount namespace. Async-signal-safe.
pub(crate) fn run(plan: &MountPlan) -> Result<(), StepError> {
    const MAX_SOURCES: usize = 16;
    if plan.ops.is_empty() {
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
        ))
        .at(Step::MountPrivate)?;
        let mut fds = [-1; MAX_SOURCES];
        for (i, source) in plan.bind_sources.iter().take(MAX_SOURCES).enumerate() {
            fds[i] = cvt(libc::open(
                source.as_ptr(),
                libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
            ))
            .at(Step::OpenBindSource)?;
        }
        for op in &plan.ops {
            match op {
                MountOp::Tmpfs { target, data } => {
                    cvt(libc::mount(
                        c"tmpfs".as_ptr(),
                        target.as_ptr(),
                        c"tmpfs".as_ptr(),
                        libc::MS_NOSUID | libc::MS_NODEV,
                        data.as_ptr().cast(),
                    ))
                    .at(Step::MountTmpfs)?;
                }
                MountOp::Mkdir(path) => {
                    if libc::mkdir(path.as_ptr(), 0o755) < 0
                        && io::Error::last_os_error().raw_os_error() != Some(libc::EEXIST)
                    {
                        return Err(StepError::last(Step::MakeMountPoint));
                    }
                }
                MountOp::Bind { source, target } => {
                    let fd = *fds
                        .get(*source)
                        .ok_or(StepError::new(Step::OpenBindSource, libc::EINVAL))?;
                    let mut link = [0u8; 32];
                    fd_link(fd, &mut link);
                    cvt(libc::mount(
                        link.as_ptr().cast(),
                        target.as_ptr(),
                        std::ptr::null(),
                        libc::MS_BIND | libc::MS_REC,
                        std::ptr::null(),
                    ))
                    .at(Step::BindMount)?;
                }
            }
        }
        for fd in fds.into_iter().filter(|&fd| fd >= 0) {
            libc::close(fd);
        }
    }
    Ok(())
}

/// Mounts a fresh `/proc` (from PID 1 of a new PID namespace). Async-signal-safe.
pub(crate) fn mount_proc() -> Result<(), StepError> {
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

    #[test]
    fn a_nul_byte_in_a_path_is_the_callers_error() {
        use std::os::unix::ffi::OsStrExt;
        let path = Path::new(std::ffi::OsStr::from_bytes(b"/tmp/a\0b"));
        let e = cstring(path).unwrap_err();
        assert!(matches!(e, Error::InvalidInput(_)), "{e}");
    }

    #[test]
    fn the_run_directory_under_tmp_is_bound_back_into_the_private_tmp() {
        let plan = plan(
            &[PathBuf::from("/usr")],
            Path::new("/tmp/runpython-1-x"),
            1 << 20,
            false,
        )
        .unwrap();
        let tmpfs: Vec<_> = plan
            .ops
            .iter()
            .filter_map(|op| match op {
                MountOp::Tmpfs { target, .. } => Some(target.to_str().unwrap().to_owned()),
                _ => None,
            })
            .collect();
        assert_eq!(tmpfs[0], "/tmp");
        assert_eq!(
            plan.bind_sources,
            vec![CString::new("/tmp/runpython-1-x").unwrap()]
        );
    }
}
