//! Gathering the files a run created, within limits, without following links.

use std::fs::{File, OpenOptions};
use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// Bounds on what [`collect_files`] keeps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CollectLimits {
    /// Files kept at most.
    pub max_files: usize,
    /// A larger file is skipped.
    pub max_file_bytes: u64,
    /// Once this many bytes are kept, further files are skipped.
    pub max_total_bytes: u64,
    /// Directories deeper than this are not entered.
    pub max_depth: usize,
    /// Entries of the run directory itself to ignore silently (the runner, its socket).
    pub ignore: Vec<String>,
}

impl Default for CollectLimits {
    fn default() -> Self {
        Self {
            max_files: 100,
            max_file_bytes: 10 * 1024 * 1024,
            max_total_bytes: 50 * 1024 * 1024,
            max_depth: 16,
            ignore: Vec::new(),
        }
    }
}

/// A file to keep with a run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunFile {
    /// Path relative to the run directory, `/`-separated.
    pub name: String,
    /// Its content.
    pub bytes: Vec<u8>,
}

/// A file that was not kept, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SkippedFile {
    /// Path relative to the run directory.
    pub name: String,
    /// Why it was skipped (`symlink`, `larger than 10485760 bytes`, ...).
    pub reason: String,
}

/// What [`collect_files`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CollectedFiles {
    /// Kept files, sorted by name.
    pub files: Vec<RunFile>,
    /// Everything seen but not kept.
    pub skipped: Vec<SkippedFile>,
}

/// Walks `dir` (blocking: call it from `spawn_blocking`) and reads its regular files within `limits`.
///
/// Symbolic links are reported and never followed, neither to directories nor to files (the file is
/// opened with `O_NOFOLLOW`, so a link swapped in after the check is refused too); FIFOs, sockets and
/// devices are reported and never opened. Names are visited in sorted order, so which files exceed a
/// cap is deterministic.
pub fn collect_files(dir: &Path, limits: &CollectLimits) -> Result<CollectedFiles> {
    let mut out = CollectedFiles::default();
    let mut total = 0u64;
    walk(dir, "", 0, limits, &mut total, &mut out)?;
    Ok(out)
}

fn walk(
    dir: &Path,
    rel: &str,
    depth: usize,
    limits: &CollectLimits,
    total: &mut u64,
    out: &mut CollectedFiles,
) -> Result<()> {
    let io = |path: PathBuf| move |source| Error::Io { path, source };
    let mut entries = std::fs::read_dir(dir)
        .map_err(io(dir.to_owned()))?
        .collect::<std::io::Result<Vec<_>>>()
        .map_err(io(dir.to_owned()))?;
    entries.sort_by_key(|e| e.file_name());
    for entry in entries {
        let file_name = entry.file_name();
        let file_name = file_name.to_string_lossy();
        if depth == 0 && limits.ignore.iter().any(|i| *i == file_name) {
            continue;
        }
        let name = if rel.is_empty() {
            file_name.into_owned()
        } else {
            format!("{rel}/{file_name}")
        };
        let path = entry.path();
        let mut skip = |reason: String| {
            out.skipped.push(SkippedFile {
                name: name.clone(),
                reason,
            })
        };
        // `DirEntry::file_type` does not follow symlinks.
        let kind = entry.file_type().map_err(io(path.clone()))?;
        if kind.is_symlink() {
            skip("symlink (never followed)".into());
        } else if kind.is_dir() {
            if depth + 1 >= limits.max_depth {
                skip(format!("directory deeper than {} levels", limits.max_depth));
            } else {
                walk(&path, &name, depth + 1, limits, total, out)?;
            }
        } else if !kind.is_file() {
            skip("not a regular file (fifo, socket or device)".into());
        } else if out.files.len() >= limits.max_files {
            skip(format!("more than {} files", limits.max_files));
        } else {
            match read_capped(&path, limits.max_file_bytes) {
                Ok(None) => skip(format!("larger than {} bytes", limits.max_file_bytes)),
                Ok(Some(bytes)) if *total + bytes.len() as u64 > limits.max_total_bytes => {
                    skip(format!(
                        "total size of kept files would exceed {} bytes",
                        limits.max_total_bytes
                    ))
                }
                Ok(Some(bytes)) => {
                    *total += bytes.len() as u64;
                    out.files.push(RunFile { name, bytes });
                }
                Err(e) => skip(format!("unreadable: {e}")),
            }
        }
    }
    Ok(())
}

/// The file's bytes, or `None` when it holds more than `cap` bytes (read at most `cap + 1`).
fn read_capped(path: &Path, cap: u64) -> std::io::Result<Option<Vec<u8>>> {
    let file: File = OpenOptions::new()
        .read(true)
        // Refuse a symlink swapped in since the walk looked; never block on a FIFO swapped in.
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)?;
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(std::io::Error::other("no longer a regular file"));
    }
    if meta.len() > cap {
        return Ok(None);
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    file.take(cap + 1).read_to_end(&mut bytes)?;
    Ok((bytes.len() as u64 <= cap).then_some(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(c: &CollectedFiles) -> Vec<&str> {
        c.files.iter().map(|f| f.name.as_str()).collect()
    }

    fn reason<'a>(c: &'a CollectedFiles, name: &str) -> &'a str {
        &c.skipped
            .iter()
            .find(|s| s.name == name)
            .unwrap_or_else(|| panic!("{name} not skipped: {c:?}"))
            .reason
    }

    #[test]
    fn regular_files_in_subdirectories_are_kept_with_relative_names() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir(d.path().join("out")).unwrap();
        std::fs::write(d.path().join("a.txt"), "a").unwrap();
        std::fs::write(d.path().join("out/b.csv"), "b").unwrap();
        let c = collect_files(d.path(), &CollectLimits::default()).unwrap();
        assert_eq!(names(&c), ["a.txt", "out/b.csv"]);
        assert_eq!(c.files[1].bytes, b"b");
        assert!(c.skipped.is_empty());
    }

    #[test]
    fn symlinks_are_reported_and_never_followed() {
        let d = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret"), "s").unwrap();
        std::os::unix::fs::symlink(outside.path().join("secret"), d.path().join("link")).unwrap();
        std::os::unix::fs::symlink(outside.path(), d.path().join("dirlink")).unwrap();
        let c = collect_files(d.path(), &CollectLimits::default()).unwrap();
        assert!(c.files.is_empty(), "{c:?}");
        assert!(reason(&c, "link").contains("symlink"));
        assert!(reason(&c, "dirlink").contains("symlink"));
    }

    #[test]
    fn fifos_are_reported_without_blocking() {
        let d = tempfile::tempdir().unwrap();
        let fifo =
            std::ffi::CString::new(d.path().join("pipe").into_os_string().into_encoded_bytes())
                .unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
        let c = collect_files(d.path(), &CollectLimits::default()).unwrap();
        assert!(reason(&c, "pipe").contains("not a regular file"));
    }

    #[test]
    fn count_per_file_and_total_caps_each_report_what_they_skipped() {
        let d = tempfile::tempdir().unwrap();
        for (name, size) in [("1", 10), ("2", 100), ("3", 10), ("4", 10), ("5", 10)] {
            std::fs::write(d.path().join(name), vec![b'x'; size]).unwrap();
        }
        let limits = CollectLimits {
            max_files: 2,
            max_file_bytes: 50,
            max_total_bytes: 15,
            ..CollectLimits::default()
        };
        let c = collect_files(d.path(), &limits).unwrap();
        assert_eq!(names(&c), ["1"]);
        assert!(reason(&c, "2").contains("larger than 50 bytes"));
        assert!(reason(&c, "3").contains("total size"));
        let limits = CollectLimits {
            max_files: 2,
            ..CollectLimits::default()
        };
        let c = collect_files(d.path(), &limits).unwrap();
        assert_eq!(names(&c), ["1", "2"]);
        assert!(reason(&c, "3").contains("more than 2 files"));
    }

    #[test]
    fn ignored_top_level_names_are_neither_kept_nor_reported() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("runner.py"), "r").unwrap();
        std::fs::write(d.path().join("keep"), "k").unwrap();
        let limits = CollectLimits {
            ignore: vec!["runner.py".into()],
            ..CollectLimits::default()
        };
        let c = collect_files(d.path(), &limits).unwrap();
        assert_eq!(names(&c), ["keep"]);
        assert!(c.skipped.is_empty());
    }
}
