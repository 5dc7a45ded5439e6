//! Every `RUNPYTHON_*` environment variable the engine reads, in one place, and where its caches live.

use std::path::PathBuf;

/// Interpreters kept ready per environment by the default [`crate::PoolConfig`] (`0` turns the pool
/// off; CI runs the suites both ways).
pub(crate) const POOL_SIZE: &str = "RUNPYTHON_POOL_SIZE";

/// `1`: every run waits for a pooled interpreter instead of starting one cold (CI runs the hostile
/// suite this way to prove pooled runs are isolated like cold ones).
pub(crate) const POOL_PRESTART: &str = "RUNPYTHON_POOL_PRESTART";

/// The value of `name`, parsed; `None` when unset or unparsable.
pub(crate) fn parsed<T: std::str::FromStr>(name: &str) -> Option<T> {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok())
}

/// runpython's cache directory (`$XDG_CACHE_HOME/runpython` or `$HOME/.cache/runpython`), resolved by
/// runpython-deps, which keeps its interpreter cache there too.
pub(crate) fn cache_dir() -> Option<PathBuf> {
    runpython_deps::cache_dir()
}
