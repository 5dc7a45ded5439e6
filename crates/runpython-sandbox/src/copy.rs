//! Reading what a sandboxed process left in its scratch without ever leaving it: every open is one
//! name beneath a descriptor the host held before the process started (`openat2` with
//! `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV`, `O_NOFOLLOW`),
//! so a path the process controls (a directory swapped for a symlink, a FIFO, a socket) never leads
//! the host elsewhere. (runpython-store's `BeneathDir` does the same for a run's files; the two crates
//! are leaves and share no code.)

use std::ffi::{CStr, CString, OsString};
use std::fs::File;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, IntoRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Component, Path, PathBuf};

use crate::error::Error;

/// What [`crate::Scratch::copy_out`] copied.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CopyReport {
    /// Regular files copied.
    pub files: u64,
    /// Directories made.
    pub dirs: u64,
    /// Bytes copied.
    pub bytes: u64,
    /// Entries left out (symbolic links, FIFOs, sockets), as paths relative to the copy's root: the
    /// first few.
    pub skipped: Vec<String>,
    /// How many entries were left out in all.
    pub skipped_count: u64,
}

/// At most this many directory levels are copied.
const MAX_DEPTH: usize = 128;
/// At most this many skipped entries are named in the report.
const SKIPPED_NAMED: usize = 16;

/// `openat2(dir, name, flags | O_NOFOLLOW | O_CLOEXEC)` resolving beneath `dir` only; `openat` with
/// `O_NOFOLLOW` where the kernel has no `openat2` (the name is a single component, so it cannot leave
/// `dir` either).
pub(crate) fn open_beneath(
    dir: BorrowedFd<'_>,
    name: &CStr,
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

/// The names in the directory `dir` (open for reading), without `.` and `..`.
fn names(dir: &OwnedFd) -> std::io::Result<Vec<OsString>> {
    // fdopendir takes the descriptor it is given: hand it a duplicate.
    let dup = dir.try_clone()?;
    // SAFETY: fdopendir takes ownership of `dup` (closed by closedir below).
    let stream = unsafe { libc::fdopendir(dup.into_raw_fd()) };
    if stream.is_null() {
        return Err(std::io::Error::last_os_error());
    }
    let mut names = Vec::new();
    loop {
        // SAFETY: readdir on a live DIR*; the entry is copied before the next call.
        let entry = unsafe { libc::readdir64(stream) };
        if entry.is_null() {
            break;
        }
        // SAFETY: d_name is NUL-terminated within the entry.
        let name = unsafe { CStr::from_ptr((*entry).d_name.as_ptr()) };
        let bytes = name.to_bytes();
        if bytes != b"." && bytes != b".." {
            names.push(std::ffi::OsStr::from_bytes(bytes).to_owned());
        }
    }
    // SAFETY: closing the DIR* opened above (and its descriptor).
    unsafe { libc::closedir(stream) };
    names.sort();
    Ok(names)
}

/// Opens the directory `rel` (plain names only: no `..`, no absolute path) beneath `root`.
pub(crate) fn open_dir_beneath(root: BorrowedFd<'_>, rel: &Path) -> Result<OwnedFd, Error> {
    let refused = |why: &str| {
        Error::InvalidInput(format!(
            "{} is not a path beneath the scratch: {why}",
            rel.display()
        ))
    };
    let mut dir = open_beneath(root, c".", libc::O_RDONLY | libc::O_DIRECTORY)
        .map_err(|e| Error::io("opening the scratch", rel, e))?;
    for part in rel.components() {
        let Component::Normal(name) = part else {
            if part == Component::CurDir {
                continue;
            }
            return Err(refused("only plain names may be used"));
        };
        let name = CString::new(name.as_bytes()).map_err(|_| refused("a NUL byte"))?;
        dir = open_beneath(dir.as_fd(), &name, libc::O_RDONLY | libc::O_DIRECTORY)
            .map_err(|e| Error::io("opening a directory of the scratch", rel, e))?;
    }
    Ok(dir)
}

/// Copies the tree `rel` beneath `root` to the new directory `to` (which must not exist): regular
/// files (mode 0644, or 0755 when any execute bit is set, modification time kept: Python's bytecode
/// checks it) and directories (0755), at most `max_bytes` in all. Links and special files are left
/// out and counted. Blocking.
pub(crate) fn copy_tree(
    root: BorrowedFd<'_>,
    rel: &Path,
    to: &Path,
    max_bytes: u64,
) -> Result<CopyReport, Error> {
    let top = open_dir_beneath(root, rel)?;
    let mut report = CopyReport::default();
    make_dir(to)?;
    report.dirs += 1;
    let mut pending: Vec<(OwnedFd, PathBuf, PathBuf, usize)> =
        vec![(top, to.to_owned(), PathBuf::new(), 0)];
    while let Some((dir, dest, shown, depth)) = pending.pop() {
        let entries =
            names(&dir).map_err(|e| Error::io("listing a directory of the scratch", &shown, e))?;
        for name in entries {
            let rel_name = shown.join(&name);
            let skip = |report: &mut CopyReport| {
                report.skipped_count += 1;
                if report.skipped.len() < SKIPPED_NAMED {
                    report.skipped.push(rel_name.display().to_string());
                }
            };
            let Ok(c_name) = CString::new(name.as_bytes()) else {
                skip(&mut report);
                continue;
            };
            let fd = match open_beneath(dir.as_fd(), &c_name, libc::O_RDONLY | libc::O_NONBLOCK) {
                Ok(fd) => fd,
                // A symbolic link (ELOOP), a socket (ENXIO): never followed, never copied.
                Err(e) if matches!(e.raw_os_error(), Some(libc::ELOOP | libc::ENXIO)) => {
                    skip(&mut report);
                    continue;
                }
                Err(e) => return Err(Error::io("opening a file of the scratch", &rel_name, e)),
            };
            let file = File::from(fd);
            let meta = file
                .metadata()
                .map_err(|e| Error::io("reading a file of the scratch", &rel_name, e))?;
            let target = dest.join(&name);
            if meta.is_dir() {
                if depth + 1 >= MAX_DEPTH {
                    return Err(Error::InvalidInput(format!(
                        "{} is nested more than {MAX_DEPTH} directories deep",
                        rel_name.display()
                    )));
                }
                make_dir(&target)?;
                report.dirs += 1;
                pending.push((OwnedFd::from(file), target, rel_name, depth + 1));
            } else if meta.is_file() {
                report.bytes += meta.len();
                if report.bytes > max_bytes {
                    return Err(Error::InvalidInput(format!(
                        "the tree {} holds more than {max_bytes} bytes",
                        rel.display()
                    )));
                }
                copy_file(file, &meta, &target)?;
                report.files += 1;
            } else {
                skip(&mut report);
            }
        }
    }
    Ok(report)
}

fn make_dir(path: &Path) -> Result<(), Error> {
    std::fs::DirBuilder::new()
        .mode(0o755)
        .create(path)
        .map_err(|e| Error::io("creating a directory of the copy", path, e))
}

fn copy_file(mut from: File, meta: &std::fs::Metadata, to: &Path) -> Result<(), Error> {
    use std::os::unix::fs::MetadataExt;
    let mode = if meta.mode() & 0o111 != 0 {
        0o755
    } else {
        0o644
    };
    let mut out = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .custom_flags(libc::O_NOFOLLOW)
        .mode(mode)
        .open(to)
        .map_err(|e| Error::io("creating a file of the copy", to, e))?;
    std::io::copy(&mut from, &mut out).map_err(|e| Error::io("copying a file", to, e))?;
    let modified = meta
        .modified()
        .map_err(|e| Error::io("reading a file's modification time", to, e))?;
    out.set_modified(modified)
        .map_err(|e| Error::io("keeping a file's modification time", to, e))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_copy_keeps_files_and_times_and_never_follows_a_link() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("src");
        std::fs::create_dir_all(src.join("site/pkg")).unwrap();
        std::fs::write(src.join("site/pkg/__init__.py"), b"x = 1\n").unwrap();
        std::fs::write(dir.path().join("secret"), b"host").unwrap();
        std::os::unix::fs::symlink(dir.path().join("secret"), src.join("site/pkg/link")).unwrap();
        std::os::unix::fs::symlink(dir.path(), src.join("site/dirlink")).unwrap();
        let old = std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000);
        File::options()
            .append(true)
            .open(src.join("site/pkg/__init__.py"))
            .unwrap()
            .set_modified(old)
            .unwrap();
        let root = File::open(&src).unwrap();
        let to = dir.path().join("out");
        let report = copy_tree(root.as_fd(), Path::new("site"), &to, 1 << 20).unwrap();
        assert_eq!((report.files, report.dirs, report.skipped_count), (1, 2, 2));
        let copied = to.join("pkg/__init__.py");
        assert_eq!(std::fs::read(&copied).unwrap(), b"x = 1\n");
        assert_eq!(std::fs::metadata(&copied).unwrap().modified().unwrap(), old);
        assert!(!to.join("pkg/link").exists() && !to.join("dirlink").exists());
        // Over the byte budget: refused, and nothing outside `to` is touched.
        let e = copy_tree(root.as_fd(), Path::new("site"), &dir.path().join("o2"), 3).unwrap_err();
        assert!(e.to_string().contains("more than 3 bytes"), "{e}");
        // A path that climbs out is refused before anything is opened.
        let e = copy_tree(root.as_fd(), Path::new("../"), &dir.path().join("o3"), 1).unwrap_err();
        assert!(matches!(e, Error::InvalidInput(_)), "{e}");
    }
}
