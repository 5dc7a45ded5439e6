//! Collecting environments: the unused ones by age, then the least recently used past a size, and
//! the leftovers of crashed builds.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use crate::layout::{discard, BUILDING, ENVS, MANIFEST};
use crate::lock::KeyLock;
use crate::Error;

/// What [`gc`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GcReport {
    /// Keys of the environments removed.
    pub removed: Vec<String>,
    /// Bytes those environments and any crash leftovers took.
    pub freed_bytes: u64,
    /// Environments kept.
    pub kept: usize,
    /// Bytes the kept environments take.
    pub kept_bytes: u64,
}

/// Removes environments under `root` not used for `max_age`, then the least recently used ones until
/// the rest fit in `max_bytes`, and leftovers of crashed builds. Environments being prepared or
/// removed by someone else (their lock is held) are skipped. The installers' caches are not touched.
/// Blocking: run it on a blocking thread.
pub fn gc(root: &Path, max_age: Duration, max_bytes: u64) -> Result<GcReport, Error> {
    let mut report = GcReport::default();
    let now = SystemTime::now();

    // Crash leftovers: a building directory whose key nobody holds.
    for (path, name) in list_dirs(&root.join(BUILDING))? {
        let key = name.split('.').next().unwrap_or_default();
        if KeyLock::try_acquire(root, key)?.is_some() {
            report.freed_bytes += dir_size(&path);
            let _ = std::fs::remove_dir_all(&path);
        }
    }

    let mut envs: Vec<(PathBuf, String, SystemTime, u64)> = list_dirs(&root.join(ENVS))?
        .into_iter()
        .map(|(path, key)| {
            let used = std::fs::metadata(path.join(MANIFEST))
                .and_then(|m| m.modified())
                .unwrap_or(SystemTime::UNIX_EPOCH);
            let size = dir_size(&path);
            (path, key, used, size)
        })
        .collect();
    envs.sort_by_key(|env| std::cmp::Reverse(env.2)); // Most recently used first.
    let mut total = 0u64;
    for (path, key, used, size) in envs {
        let too_old = now.duration_since(used).unwrap_or_default() > max_age;
        if !too_old && total + size <= max_bytes {
            total += size;
            report.kept += 1;
            continue;
        }
        match KeyLock::try_acquire(root, &key)? {
            Some(_lock) => {
                discard(root, &path);
                report.removed.push(key);
                report.freed_bytes += size;
            }
            None => {
                total += size;
                report.kept += 1;
            }
        }
    }
    report.kept_bytes = total;
    Ok(report)
}

pub(crate) fn list_dirs(dir: &Path) -> Result<Vec<(PathBuf, String)>, Error> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(Error::io("list", dir, e)),
    };
    Ok(entries
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter_map(|e| Some((e.path(), e.file_name().into_string().ok()?)))
        .collect())
}

/// Bytes under `dir`, not following symlinks.
fn dir_size(dir: &Path) -> u64 {
    let mut total = 0;
    let mut pending = vec![dir.to_path_buf()];
    while let Some(dir) = pending.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.filter_map(Result::ok) {
            let Ok(meta) = entry.path().symlink_metadata() else {
                continue;
            };
            if meta.is_dir() {
                pending.push(entry.path());
            } else {
                total += meta.len();
            }
        }
    }
    total
}
