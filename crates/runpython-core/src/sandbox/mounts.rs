//! The run's view of the filesystem, built from an allowlist (as bubblewrap and nsjail do), never the
//! host's tree with holes punched in it.
//!
//! A fresh tmpfs becomes the run's root. Into it go, read-only, the system directories (`/usr`, `/etc`,
//! `/lib*`, `/bin`, `/sbin`, `/sys`), the interpreter's prefix, runpython's code dir, the run's prepared
//! environment and any `read_paths`; a minimal `/dev` (null, zero, full, random, urandom and the
//! `/proc/self/fd` links); the run's own `/proc` (mounted by its init). Everything the code may write is
//! one more tmpfs of `disk_bytes`, the *scratch*, mounted at [`SCRATCH`]: `work/` (the code's cwd),
//! `tmp/` (bound onto `/tmp`), `shm/` (bound onto `/dev/shm`) and `saved/` (what `save_artifact` hands
//! the host). Nothing else of the host exists in the view: no `/run`, `/var`, `/home`, `/root`, so no
//! host Unix socket can be named. The host keeps a descriptor of the scratch, handed over by the run's
//! first process before any code runs, and reads the run's files beneath it.
//!
//! The plan is built in the host ([`plan`]); [`build`] and [`pivot`] run between fork and exec and make
//! plain system calls on its precomputed C strings.

use std::ffi::CString;
use std::io;
use std::os::fd::RawFd;
use std::path::{Path, PathBuf};

use super::sys::{cvt, cvt_long, AtStep, Step, StepError};
use crate::error::Error;

/// Where the scratch is mounted inside the view.
pub(crate) const SCRATCH: &str = "/runpython";

/// The directories of the scratch, relative to it: the code's cwd, `/tmp`, `/dev/shm`, saved
/// artifacts, and `HOME` (with the caches and configuration libraries write, never collected).
pub(crate) const SCRATCH_DIRS: [(&str, u32); 5] = [
    ("work", 0o700),
    ("tmp", 0o1777),
    ("shm", 0o1777),
    ("saved", 0o700),
    ("home", 0o700),
];

/// System directories bound read-only (or re-created as the same symlink, for a merged `/usr`).
const SYSTEM: [&str; 9] = [
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/sys",
];

/// Device nodes bound into the view's `/dev`.
const DEVICES: [&str; 5] = ["null", "zero", "full", "random", "urandom"];

/// One step of building the view, in order.
#[derive(Debug)]
enum Op {
    /// A fresh tmpfs over `target`.
    Tmpfs { target: CString, data: CString },
    /// A directory (an existing one is fine), then exactly `mode`.
    Mkdir { path: CString, mode: u32 },
    /// Hands `path` to the run's uid (a root host builds the view before dropping to it).
    Chown(CString),
    /// An empty file to bind a file or device onto.
    File(CString),
    /// A symbolic link `path` -> `target`.
    Symlink { target: CString, path: CString },
    /// The host path `sources[source]` (opened before anything is mounted) bound onto `target`.
    Bind {
        source: usize,
        target: CString,
        readonly: bool,
    },
    /// A tmpfs of ours made read-only once everything is mounted in it.
    ReadOnly(CString),
}

/// The run's filesystem view, planned in the host.
#[derive(Debug, Default)]
pub(crate) struct View {
    /// Host paths bound into the view, opened (`O_PATH`) before the first mount.
    sources: Vec<CString>,
    ops: Vec<Op>,
    /// The host directory the new root is mounted on.
    root: CString,
    /// The scratch inside the view (for the descriptor handed to the host) and the cwd.
    scratch: CString,
    work: CString,
    /// The run's uid and gid when the view is built as root before dropping to them.
    owner: Option<(u32, u32)>,
}

/// What the view is built from.
#[derive(Debug)]
pub(crate) struct ViewSpec<'a> {
    /// An empty host directory to mount the new root on.
    pub root: &'a Path,
    /// Directories (or files) the code reads: bound read-only at their own paths.
    pub read_paths: &'a [PathBuf],
    /// Size of the scratch (everything the code may write).
    pub disk_bytes: u64,
    /// The run's uid and gid, when a root host builds the view before dropping to them.
    pub owner: Option<(u32, u32)>,
    /// The run has its own PID namespace (its init mounts a fresh `/proc`); else the host's is bound.
    pub pid_ns: bool,
    /// The host's network is shared: its resolver configuration is bound too.
    pub allow_network: bool,
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

/// Plans the view.
pub(crate) fn plan(spec: &ViewSpec<'_>) -> Result<View, Error> {
    let mut b = Planner {
        root: spec.root.to_owned(),
        view: View {
            root: cstring(spec.root)?,
            scratch: cstring(Path::new(SCRATCH))?,
            work: cstring(&Path::new(SCRATCH).join("work"))?,
            owner: spec.owner,
            ..View::default()
        },
        made: Vec::new(),
        bound: Vec::new(),
    };
    b.tmpfs(Path::new("/"), "mode=0755,size=4m,nr_inodes=4096")?;
    // The scratch: everything writable, one size limit.
    let scratch = Path::new(SCRATCH);
    b.mkdir(scratch, 0o755)?;
    let mut data = format!("mode=0700,size={}", spec.disk_bytes.max(4096));
    if let Some((uid, gid)) = spec.owner {
        data.push_str(&format!(",uid={uid},gid={gid}"));
    }
    b.tmpfs(scratch, &data)?;
    for (dir, mode) in SCRATCH_DIRS {
        b.mkdir(&scratch.join(dir), mode)?;
        b.chown(&scratch.join(dir))?;
    }
    b.mkdir(Path::new("/tmp"), 0o1777)?;
    b.bind_inside(&scratch.join("tmp"), Path::new("/tmp"))?;
    // A minimal /dev.
    let dev = Path::new("/dev");
    b.mkdir(dev, 0o755)?;
    b.tmpfs(dev, "mode=0755,size=64k,nr_inodes=64")?;
    for name in DEVICES {
        let host = Path::new("/dev").join(name);
        if host.exists() {
            b.file(&host)?;
            b.bind(&host, &host, false)?;
        }
    }
    for (link, target) in [
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ] {
        b.symlink(target, &dev.join(link))?;
    }
    b.mkdir(&dev.join("shm"), 0o1777)?;
    b.bind_inside(&scratch.join("shm"), &dev.join("shm"))?;
    b.read_only(dev)?;
    // The system, read-only.
    for dir in SYSTEM {
        let path = Path::new(dir);
        match std::fs::symlink_metadata(path) {
            Ok(meta) if meta.file_type().is_symlink() => {
                if let Ok(target) = std::fs::read_link(path) {
                    b.symlink_path(&target, path)?;
                }
            }
            Ok(meta) if meta.is_dir() => {
                b.mkdir(path, 0o755)?;
                b.bind(path, path, true)?;
            }
            _ => {}
        }
    }
    b.mkdir(Path::new("/proc"), 0o555)?;
    if !spec.pid_ns {
        // No PID namespace, no fresh /proc: the host's (the isolation report says so).
        b.bind(Path::new("/proc"), Path::new("/proc"), false)?;
    }
    // What the code reads: bound read-only at its own path, parents first.
    let mut reads: Vec<PathBuf> = spec.read_paths.to_vec();
    if spec.allow_network {
        if let Ok(target) = std::fs::canonicalize("/etc/resolv.conf") {
            if !target.starts_with("/etc") {
                reads.push(target);
            }
        }
    }
    reads.sort_by_key(|p| p.as_os_str().len());
    reads.dedup();
    for path in reads {
        if !path.is_absolute() || b.covered(&path) || !path.exists() {
            continue;
        }
        b.mkdir_parents(&path)?;
        if path.is_dir() {
            b.mkdir(&path, 0o755)?;
        } else {
            b.file(&path)?;
        }
        b.bind(&path, &path, true)?;
    }
    b.read_only(Path::new("/"))?;
    Ok(b.view)
}

/// Builds a [`View`]'s operations with paths inside the new root.
struct Planner {
    root: PathBuf,
    view: View,
    /// Directories already made in the view.
    made: Vec<PathBuf>,
    /// Paths bound read-only (what lies beneath is covered).
    bound: Vec<PathBuf>,
}

impl Planner {
    /// `inside` (an absolute path in the view) as a host path under the new root.
    fn host(&self, inside: &Path) -> Result<CString, Error> {
        let rel = inside.strip_prefix("/").unwrap_or(inside);
        if rel.as_os_str().is_empty() {
            return cstring(&self.root);
        }
        cstring(&self.root.join(rel))
    }

    fn covered(&self, path: &Path) -> bool {
        self.bound.iter().any(|b| path.starts_with(b))
            || [Path::new("/proc"), Path::new("/dev"), Path::new(SCRATCH)]
                .iter()
                .any(|p| path.starts_with(p))
    }

    fn tmpfs(&mut self, inside: &Path, data: &str) -> Result<(), Error> {
        let op = Op::Tmpfs {
            target: self.host(inside)?,
            data: CString::new(data).map_err(|e| Error::Internal(e.to_string()))?,
        };
        self.view.ops.push(op);
        Ok(())
    }

    fn mkdir(&mut self, inside: &Path, mode: u32) -> Result<(), Error> {
        if self.made.iter().any(|m| m == inside) {
            return Ok(());
        }
        let op = Op::Mkdir {
            path: self.host(inside)?,
            mode,
        };
        self.view.ops.push(op);
        self.made.push(inside.to_owned());
        Ok(())
    }

    fn mkdir_parents(&mut self, inside: &Path) -> Result<(), Error> {
        let parents: Vec<PathBuf> = inside
            .ancestors()
            .skip(1)
            .filter(|a| a.parent().is_some())
            .map(Path::to_owned)
            .collect();
        for parent in parents.into_iter().rev() {
            self.mkdir(&parent, 0o755)?;
        }
        Ok(())
    }

    fn chown(&mut self, inside: &Path) -> Result<(), Error> {
        if self.view.owner.is_some() {
            let op = Op::Chown(self.host(inside)?);
            self.view.ops.push(op);
        }
        Ok(())
    }

    fn file(&mut self, inside: &Path) -> Result<(), Error> {
        let op = Op::File(self.host(inside)?);
        self.view.ops.push(op);
        Ok(())
    }

    fn symlink(&mut self, target: &str, inside: &Path) -> Result<(), Error> {
        self.symlink_path(Path::new(target), inside)
    }

    fn symlink_path(&mut self, target: &Path, inside: &Path) -> Result<(), Error> {
        let op = Op::Symlink {
            target: cstring(target)?,
            path: self.host(inside)?,
        };
        self.view.ops.push(op);
        Ok(())
    }

    /// Binds the host path `source` onto `inside`.
    fn bind(&mut self, source: &Path, inside: &Path, readonly: bool) -> Result<(), Error> {
        let op = Op::Bind {
            source: self.view.sources.len(),
            target: self.host(inside)?,
            readonly,
        };
        self.view.sources.push(cstring(source)?);
        self.view.ops.push(op);
        if readonly {
            self.bound.push(inside.to_owned());
        }
        Ok(())
    }

    /// Binds a path of the view onto another path of the view (scratch subdirectories): its source is
    /// opened when bound, since it exists only once the scratch is mounted.
    fn bind_inside(&mut self, from: &Path, inside: &Path) -> Result<(), Error> {
        let source = self.host(from)?;
        let op = Op::Bind {
            source: self.view.sources.len() + INSIDE_SOURCE,
            target: self.host(inside)?,
            readonly: false,
        };
        self.view.sources.push(source);
        self.view.ops.push(op);
        Ok(())
    }

    fn read_only(&mut self, inside: &Path) -> Result<(), Error> {
        let op = Op::ReadOnly(self.host(inside)?);
        self.view.ops.push(op);
        Ok(())
    }
}

/// Bind sources at or above this index (less it) are paths inside the new root, opened when used
/// (they exist only once the scratch is mounted) rather than before the first mount.
const INSIDE_SOURCE: usize = 1 << 20;

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

/// Builds the view under its new root (not entered yet) and moves into that root: the working
/// directory is what [`pivot`] enters later, possibly from a new mount namespace (unsharing one moves a
/// process's working directory to the copy of its mount) and after dropping to a uid that could not
/// traverse the root's host path. Async-signal-safe.
pub(crate) fn build(view: &View) -> Result<(), StepError> {
    let mut fds = [-1 as RawFd; MAX_SOURCES];
    let result = build_with(view, &mut fds);
    for fd in fds.into_iter().filter(|&fd| fd >= 0) {
        // SAFETY: closing descriptors this function opened.
        unsafe { libc::close(fd) };
    }
    result?;
    // SAFETY: chdir to a NUL-terminated path prepared in the host.
    cvt(unsafe { libc::chdir(view.root.as_ptr()) })
        .map(drop)
        .at(Step::PivotRoot)
}

fn build_with(view: &View, fds: &mut [RawFd; MAX_SOURCES]) -> Result<(), StepError> {
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
            fds[i] = cvt(libc::open(source.as_ptr(), libc::O_PATH | libc::O_CLOEXEC))
                .at(Step::OpenBindSource)?;
        }
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

    fn targets(view: &View) -> Vec<String> {
        view.ops
            .iter()
            .filter_map(|op| match op {
                Op::Bind {
                    target, readonly, ..
                } => Some(format!(
                    "{}{}",
                    target.to_str().unwrap(),
                    if *readonly { " ro" } else { "" }
                )),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn the_view_holds_the_allowlist_and_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        let code = dir.path().join("code");
        std::fs::create_dir(&code).unwrap();
        let root = dir.path().join("root");
        let view = plan(&ViewSpec {
            root: &root,
            read_paths: &[code.clone(), PathBuf::from("/usr/lib")],
            disk_bytes: 1 << 30,
            owner: None,
            pid_ns: true,
            allow_network: false,
        })
        .unwrap();
        let r = root.display().to_string();
        let binds = targets(&view);
        assert!(binds.contains(&format!("{r}/tmp")), "{binds:?}");
        assert!(binds.contains(&format!("{r}/dev/shm")), "{binds:?}");
        assert!(binds.contains(&format!("{r}/dev/null")), "{binds:?}");
        assert!(
            binds.contains(&format!("{r}{} ro", code.display())),
            "{binds:?}"
        );
        // /usr/lib is under /usr, bound already; nothing of /run, /var, /home or /root.
        assert!(!binds.iter().any(|b| b.contains("/usr/lib")), "{binds:?}");
        for absent in ["/run", "/var", "/home", "/root", "/proc"] {
            assert!(
                !binds.iter().any(
                    |b| b == &format!("{r}{absent}") || b.starts_with(&format!("{r}{absent}/"))
                ),
                "{absent} is in the view: {binds:?}"
            );
        }
        // Without a PID namespace the host's /proc is bound instead of a fresh one.
        let view = plan(&ViewSpec {
            root: &root,
            read_paths: &[],
            disk_bytes: 1 << 20,
            owner: Some((5, 5)),
            pid_ns: false,
            allow_network: false,
        })
        .unwrap();
        assert!(targets(&view).contains(&format!("{r}/proc")));
        assert!(view.ops.iter().any(|op| matches!(op, Op::Chown(_))));
    }
}
