//! The environments root's layout, and the helpers that name things in it. A leaf: the environments
//! (`env.rs`), the installers (`provider.rs`) and the locks (`lock.rs`) all place their files through it.
//!
//! Under the root (the key's hash input carries the format version, so a new layout never reads an
//! old one):
//!
//! ```text
//! envs/<key>/site/        the installed packages: a relocatable site dir for `site.addsitedir`
//! envs/<key>/env.json     the manifest; its mtime is the last use (for GC)
//! building/<key>.<rand>/  environments being built; stale ones are crash leftovers, GC removes them
//! locks/<key>.lock        one exclusive flock per key
//! ```
//!
//! Nothing else: an installer's cache lives in its sandbox's scratch and goes with it (see
//! `sandboxed.rs`). Roots written before installs were sandboxed may hold `cache/` and `tools/`,
//! which nothing reads any more.

use std::path::{Path, PathBuf};

use crate::Error;

/// Prepared environments, one directory per key.
pub(crate) const ENVS: &str = "envs";
/// An environment's site directory, inside its key's directory.
pub(crate) const SITE: &str = "site";
/// An environment's manifest, inside its key's directory.
pub(crate) const MANIFEST: &str = "env.json";
/// Directories being built, renamed into place when complete.
pub(crate) const BUILDING: &str = "building";
/// Lock files. They are never deleted: removing a lock file that another process has open would let
/// two holders coexist.
pub(crate) const LOCKS: &str = "locks";

/// A 128-bit hex digest of `parts`, each length-prefixed so that no two inputs collide by shifting.
pub(crate) fn short_hash(parts: &[&[u8]]) -> String {
    let mut hasher = blake3::Hasher::new();
    for part in parts {
        hasher.update(&(part.len() as u64).to_le_bytes());
        hasher.update(part);
    }
    hasher.finalize().to_hex()[..32].to_owned()
}

/// A fresh `<root>/building/<name>.<random>` directory.
pub(crate) fn building_dir(root: &Path, name: &str) -> Result<PathBuf, Error> {
    let mut random = [0u8; 8];
    getrandom::fill(&mut random).map_err(|e| {
        Error::io(
            "pick a temporary name",
            root,
            std::io::Error::other(e.to_string()),
        )
    })?;
    let suffix: String = random.iter().map(|b| format!("{b:02x}")).collect();
    let parent = root.join(BUILDING);
    std::fs::create_dir_all(&parent)
        .map_err(|e| Error::io("create the building directory", &parent, e))?;
    let dir = parent.join(format!("{name}.{suffix}"));
    std::fs::create_dir(&dir).map_err(|e| Error::io("create a building directory", &dir, e))?;
    Ok(dir)
}

/// Makes `dir` disappear atomically (renamed into `building/`), then deletes it.
pub(crate) fn discard(root: &Path, dir: &Path) {
    let name = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let aside = root.join(BUILDING).join(format!("{name}.discarded"));
    let _ = std::fs::create_dir_all(root.join(BUILDING));
    let _ = std::fs::remove_dir_all(&aside);
    if std::fs::rename(dir, &aside).is_ok() {
        let _ = std::fs::remove_dir_all(&aside);
    }
}
