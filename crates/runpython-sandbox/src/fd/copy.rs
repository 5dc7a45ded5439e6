//! Copying a tree out of a directory beneath which it lies (an install's environment out of its
//! scratch): regular files and directories only, links and special files left out.

use std::ffi::CString;
use std::fs::File;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use super::beneath::{open_beneath, BeneathDir};
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

/// Copies the tree `rel` beneath `root` to the new directory `to` (which must not exist): regular
/// files (mode 0644, or 0755 when any execute bit is set, modification time kept: Python's bytecode
/// checks it) and directories (0755), at most `max_bytes` in all. Links and special files are left
/// out and counted. Blocking.
pub(crate) fn copy_tree(
    root: &BeneathDir,
    rel: &Path,
    to: &Path,
    max_bytes: u64,
) -> Result<CopyReport, Error> {
    let top = root.path(rel).map_err(|e| match e.kind() {
        std::io::ErrorKind::InvalidInput => Error::InvalidInput(format!(
            "{} is not a path beneath the scratch: {e}",
            rel.display()
        )),
        _ => Error::io("opening a directory of the scratch", rel, e),
    })?;
    let mut report = CopyReport::default();
    make_dir(to)?;
    report.dirs += 1;
    let mut pending: Vec<(BeneathDir, PathBuf, PathBuf, usize)> =
        vec![(top, to.to_owned(), PathBuf::new(), 0)];
    while let Some((dir, dest, shown, depth)) = pending.pop() {
        let entries = dir
            .names()
            .map_err(|e| Error::io("listing a directory of the scratch", &shown, e))?;
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
                pending.push((
                    BeneathDir::from_owned(OwnedFd::from(file)),
                    target,
                    rel_name,
                    depth + 1,
                ));
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
        let root = BeneathDir::open(&src).unwrap();
        let to = dir.path().join("out");
        let report = copy_tree(&root, Path::new("site"), &to, 1 << 20).unwrap();
        assert_eq!((report.files, report.dirs, report.skipped_count), (1, 2, 2));
        let copied = to.join("pkg/__init__.py");
        assert_eq!(std::fs::read(&copied).unwrap(), b"x = 1\n");
        assert_eq!(std::fs::metadata(&copied).unwrap().modified().unwrap(), old);
        assert!(!to.join("pkg/link").exists() && !to.join("dirlink").exists());
        // Over the byte budget: refused, and nothing outside `to` is touched.
        let e = copy_tree(&root, Path::new("site"), &dir.path().join("o2"), 3).unwrap_err();
        assert!(e.to_string().contains("more than 3 bytes"), "{e}");
        // A path that climbs out is refused before anything is opened.
        let e = copy_tree(&root, Path::new("../"), &dir.path().join("o3"), 1).unwrap_err();
        assert!(matches!(e, Error::InvalidInput(_)), "{e}");
    }
}
