//! A directory the host reads without ever leaving it: the one way the host opens, lists and removes
//! what a sandboxed process left behind (a run's scratch, an install's output), one name at a time
//! beneath a descriptor it held before the process started.

use std::ffi::CString;
use std::fs::File;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, IntoRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path};

/// A directory the host reads without ever leaving it: every open is beneath it (`openat2` with
/// `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV`, one name at a
/// time, `O_NOFOLLOW`), so a path the code controls (a directory swapped for a symlink, a FIFO, a
/// socket) can never lead the host elsewhere.
#[derive(Debug)]
pub struct BeneathDir(OwnedFd);

impl BeneathDir {
    /// Opens the directory at `path` (which must not be a symlink itself).
    pub fn open(path: &Path) -> std::io::Result<Self> {
        let c = std::ffi::CString::new(path.as_os_str().as_bytes())
            .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
        // SAFETY: open of a NUL-terminated path; the descriptor is new and owned here.
        let fd = unsafe {
            libc::open(
                c.as_ptr(),
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `fd` was just opened and is owned by nobody else.
        Ok(Self(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// The directory open as `fd` (for reading), taken as it is.
    pub(crate) fn from_owned(fd: OwnedFd) -> Self {
        Self(fd)
    }

    /// The directory behind `fd` (an `O_PATH` descriptor will do), reopened for reading.
    pub fn from_fd(fd: BorrowedFd<'_>) -> std::io::Result<Self> {
        open_beneath(fd, c".", libc::O_RDONLY | libc::O_DIRECTORY).map(Self)
    }

    /// The subdirectory `name` (a single name: no `/`, not `..`).
    pub fn dir(&self, name: &str) -> std::io::Result<Self> {
        open_beneath(
            self.0.as_fd(),
            &single_name(name)?,
            libc::O_RDONLY | libc::O_DIRECTORY,
        )
        .map(Self)
    }

    /// The regular file `name`, open for reading (a FIFO, socket or device is refused, never opened
    /// in a way that blocks).
    pub fn file(&self, name: &str) -> std::io::Result<File> {
        let fd = open_beneath(
            self.0.as_fd(),
            &single_name(name)?,
            libc::O_RDONLY | libc::O_NONBLOCK,
        )?;
        let file = File::from(fd);
        if !file.metadata()?.is_file() {
            return Err(std::io::Error::other("not a regular file"));
        }
        Ok(file)
    }

    /// Removes the file `name` (never following a link: a link is removed, not its target).
    pub fn remove_file(&self, name: &str) -> std::io::Result<()> {
        let name = single_name(name)?;
        // SAFETY: unlinkat relative to our descriptor with a single NUL-terminated name.
        if unsafe { libc::unlinkat(self.0.as_raw_fd(), name.as_ptr(), 0) } < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }

    /// The directory `rel` beneath this one (plain names only: no `..`, no absolute path), one
    /// name at a time.
    pub fn path(&self, rel: &Path) -> std::io::Result<Self> {
        let mut dir = Self::from_fd(self.0.as_fd())?;
        for part in rel.components() {
            match part {
                Component::CurDir => {}
                Component::Normal(name) => {
                    let name = CString::new(name.as_bytes()).map_err(|_| {
                        std::io::Error::new(std::io::ErrorKind::InvalidInput, "a NUL byte")
                    })?;
                    dir = open_beneath(dir.0.as_fd(), &name, libc::O_RDONLY | libc::O_DIRECTORY)
                        .map(Self)?;
                }
                _ => {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::InvalidInput,
                        format!(
                            "{} is not a path beneath: only plain names may be used",
                            rel.display()
                        ),
                    ))
                }
            }
        }
        Ok(dir)
    }

    /// The descriptor.
    pub fn as_fd(&self) -> BorrowedFd<'_> {
        self.0.as_fd()
    }

    /// Another handle on the same directory (for a blocking task).
    pub fn try_clone(&self) -> std::io::Result<Self> {
        self.0.try_clone().map(Self)
    }

    /// The names in the directory, sorted, without `.` and `..`.
    pub fn names(&self) -> std::io::Result<Vec<std::ffi::OsString>> {
        use std::os::unix::ffi::OsStrExt;
        // fdopendir takes the descriptor it is given: hand it a duplicate.
        let dup = self.0.try_clone()?;
        // SAFETY: fdopendir takes ownership of `dup` (closed by closedir below).
        let dir = unsafe { libc::fdopendir(dup.into_raw_fd()) };
        if dir.is_null() {
            return Err(std::io::Error::last_os_error());
        }
        let mut names = Vec::new();
        loop {
            // SAFETY: readdir on a live DIR*; the entry is copied before the next call.
            let entry = unsafe { libc::readdir64(dir) };
            if entry.is_null() {
                break;
            }
            // SAFETY: d_name is NUL-terminated within the entry.
            let name = unsafe { std::ffi::CStr::from_ptr((*entry).d_name.as_ptr()) };
            let bytes = name.to_bytes();
            if bytes != b"." && bytes != b".." {
                names.push(std::ffi::OsStr::from_bytes(bytes).to_owned());
            }
        }
        // SAFETY: closing the DIR* opened above (and its descriptor).
        unsafe { libc::closedir(dir) };
        names.sort();
        Ok(names)
    }
}

fn single_name(name: &str) -> std::io::Result<std::ffi::CString> {
    if name.is_empty() || name == "." || name == ".." || name.contains(['/', '\0']) {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("{name:?} is not a single file name"),
        ));
    }
    std::ffi::CString::new(name).map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))
}

/// `openat2(dir, name, flags | O_NOFOLLOW | O_CLOEXEC)` resolving beneath `dir` only, with no link of
/// any kind and no mount crossing; `openat` with `O_NOFOLLOW` where the kernel has no `openat2` (the
/// name is a single component, so it cannot leave `dir` either).
pub(crate) fn open_beneath(
    dir: BorrowedFd<'_>,
    name: &std::ffi::CStr,
    flags: i32,
) -> std::io::Result<OwnedFd> {
    let flags = flags | libc::O_NOFOLLOW | libc::O_CLOEXEC;
    // `struct open_how` of openat2(2) (libc's is non-exhaustive).
    #[repr(C)]
    struct OpenHow {
        flags: u64,
        mode: u64,
        resolve: u64,
    }
    let how = OpenHow {
        flags: flags as u64,
        mode: 0,
        resolve: libc::RESOLVE_BENEATH
            | libc::RESOLVE_NO_SYMLINKS
            | libc::RESOLVE_NO_MAGICLINKS
            | libc::RESOLVE_NO_XDEV,
    };
    // SAFETY: openat2 with a live open_how and its size; the result is a new descriptor or -1.
    let mut fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            dir.as_raw_fd(),
            name.as_ptr(),
            &how as *const OpenHow,
            std::mem::size_of::<OpenHow>(),
        )
    } as i32;
    if fd < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ENOSYS) {
        // SAFETY: openat of a single NUL-terminated name relative to `dir`.
        fd = unsafe { libc::openat(dir.as_raw_fd(), name.as_ptr(), flags) };
    }
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` was just opened and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}
