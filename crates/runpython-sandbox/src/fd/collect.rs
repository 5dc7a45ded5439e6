//! Gathering the files a sandboxed process left, within limits, beneath a directory the host holds,
//! without following links: what a run keeps.

use std::fs::File;
use std::io::Read;
use std::path::Path;

use super::beneath::BeneathDir;

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
pub struct CollectedFile {
    /// Path relative to the run directory, `/`-separated.
    pub name: String,
    /// Its content.
    pub bytes: Vec<u8>,
}

/// A file that was not kept, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkippedEntry {
    /// Path relative to the run directory.
    pub name: String,
    /// Why it was skipped (`symlink`, `larger than 10485760 bytes`, ...).
    pub reason: String,
}

/// What [`collect_files`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CollectedFiles {
    /// Kept files, sorted by name.
    pub files: Vec<CollectedFile>,
    /// The first [`MAX_SKIPPED_NAMED`] entries seen but not kept, with why.
    pub skipped: Vec<SkippedEntry>,
    /// Every entry seen but not kept, counted by reason: what a run leaves costs the manifest the
    /// same whether it left a hundred files past the cap or a million.
    pub skipped_counts: std::collections::BTreeMap<String, u64>,
}

/// At most this many skipped entries are named; the rest are counted by reason.
pub const MAX_SKIPPED_NAMED: usize = 32;

/// At most this many entries are looked at in all; the walk stops there (and says so).
const MAX_ENTRIES: u64 = 100_000;

impl CollectedFiles {
    fn skip(&mut self, name: String, reason: String) {
        skip_into(&mut self.skipped, &mut self.skipped_counts, name, reason);
    }
}

/// Counts a skipped entry, naming it while there is room.
fn skip_into(
    named: &mut Vec<SkippedEntry>,
    counts: &mut std::collections::BTreeMap<String, u64>,
    name: String,
    reason: String,
) {
    *counts.entry(reason.clone()).or_insert(0) += 1;
    if named.len() < MAX_SKIPPED_NAMED {
        named.push(SkippedEntry { name, reason });
    }
}

/// Walks `dir` (blocking: call it from `spawn_blocking`) and reads its regular files within `limits`.
///
/// Symbolic links are reported and never followed, neither to directories nor to files; FIFOs,
/// sockets and devices are reported and never opened in a way that blocks. Names are visited in sorted
/// order, so which files exceed a cap is deterministic. See [`collect_files_in`] for a directory the
/// caller already holds.
pub fn collect_files(dir: &Path, limits: &CollectLimits) -> std::io::Result<CollectedFiles> {
    let held = BeneathDir::open(dir)?;
    Ok(collect_files_in(&held, limits))
}

/// [`collect_files`] beneath a directory the caller holds: nothing outside it is ever opened, whatever
/// was done to the paths inside. Everything unreadable is reported in `skipped`, never an error.
pub fn collect_files_in(dir: &BeneathDir, limits: &CollectLimits) -> CollectedFiles {
    let mut out = CollectedFiles::default();
    let mut walked = Walked::default();
    walk(dir, "", 0, limits, &mut walked, &mut out);
    out
}

/// What the walk has taken so far.
#[derive(Default)]
struct Walked {
    /// Bytes of the files kept.
    bytes: u64,
    /// Entries looked at.
    entries: u64,
}

fn walk(
    dir: &BeneathDir,
    rel: &str,
    depth: usize,
    limits: &CollectLimits,
    walked: &mut Walked,
    out: &mut CollectedFiles,
) {
    let shown = || {
        if rel.is_empty() {
            ".".to_owned()
        } else {
            rel.to_owned()
        }
    };
    let names = match dir.names() {
        Ok(names) => names,
        Err(e) => {
            out.skip(shown(), format!("unreadable directory: {e}"));
            return;
        }
    };
    for file_name in names {
        walked.entries += 1;
        if walked.entries > MAX_ENTRIES {
            out.skip(
                shown(),
                format!("not looked at: more than {MAX_ENTRIES} entries in all"),
            );
            return;
        }
        let file_name = file_name.to_string_lossy().into_owned();
        if depth == 0 && limits.ignore.contains(&file_name) {
            continue;
        }
        let name = if rel.is_empty() {
            file_name.clone()
        } else {
            format!("{rel}/{file_name}")
        };
        let mut skip = |reason: String| {
            skip_into(
                &mut out.skipped,
                &mut out.skipped_counts,
                name.clone(),
                reason,
            )
        };
        match dir.dir(&file_name) {
            Ok(sub) => {
                if depth + 1 >= limits.max_depth {
                    skip(format!("directory deeper than {} levels", limits.max_depth));
                } else {
                    walk(&sub, &name, depth + 1, limits, walked, out);
                }
                continue;
            }
            Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
                skip("symlink (never followed)".into());
                continue;
            }
            Err(e) if e.raw_os_error() == Some(libc::EXDEV) => {
                skip("a mount point (never crossed)".into());
                continue;
            }
            Err(_) => {} // not a directory: a file, or something else
        }
        if out.files.len() >= limits.max_files {
            skip(format!("more than {} files", limits.max_files));
            continue;
        }
        let file = match dir.file(&file_name) {
            Ok(file) => file,
            Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
                skip("symlink (never followed)".into());
                continue;
            }
            Err(e)
                if e.raw_os_error() == Some(libc::ENXIO)
                    || e.to_string() == "not a regular file" =>
            {
                skip("not a regular file (fifo, socket or device)".into());
                continue;
            }
            Err(e) => {
                skip(format!("unreadable: {e}"));
                continue;
            }
        };
        match read_capped(file, limits.max_file_bytes) {
            Ok(None) => skip(format!("larger than {} bytes", limits.max_file_bytes)),
            Ok(Some(bytes)) if walked.bytes + bytes.len() as u64 > limits.max_total_bytes => {
                skip(format!(
                    "total size of kept files would exceed {} bytes",
                    limits.max_total_bytes
                ))
            }
            Ok(Some(bytes)) => {
                walked.bytes += bytes.len() as u64;
                out.files.push(CollectedFile { name, bytes });
            }
            Err(e) => skip(format!("unreadable: {e}")),
        }
    }
}

/// The file's bytes, or `None` when it holds more than `cap` bytes (read at most `cap + 1`).
fn read_capped(file: File, cap: u64) -> std::io::Result<Option<Vec<u8>>> {
    let meta = file.metadata()?;
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
    fn a_directory_swapped_for_a_symlink_is_never_entered() {
        let d = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret"), "s").unwrap();
        std::fs::create_dir(d.path().join("work")).unwrap();
        let held = BeneathDir::open(d.path()).unwrap();
        let work = held.dir("work").unwrap();
        // The code renames its directory and leaves a link to the host's files in its place.
        std::fs::rename(d.path().join("work"), d.path().join("moved")).unwrap();
        std::os::unix::fs::symlink(outside.path(), d.path().join("work")).unwrap();
        assert!(held.dir("work").is_err());
        assert_eq!(
            held.file("work").unwrap_err().raw_os_error(),
            Some(libc::ELOOP)
        );
        assert!(collect_files_in(&work, &CollectLimits::default())
            .files
            .is_empty());
        let c = collect_files_in(&held, &CollectLimits::default());
        assert!(c.files.is_empty(), "{c:?}");
        assert!(reason(&c, "work").contains("symlink"));
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
    fn thousands_of_files_past_the_cap_are_counted_not_listed() {
        let d = tempfile::tempdir().unwrap();
        for i in 0..2_000 {
            std::fs::write(d.path().join(format!("f{i:05}")), "").unwrap();
        }
        let limits = CollectLimits {
            max_files: 10,
            ..CollectLimits::default()
        };
        let c = collect_files(d.path(), &limits).unwrap();
        assert_eq!(c.files.len(), 10);
        assert_eq!(c.skipped.len(), MAX_SKIPPED_NAMED);
        assert_eq!(c.skipped_counts.get("more than 10 files"), Some(&1_990));
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
