//! Every `RUNPYTHON_*` environment variable the engine reads, in one place, and where its caches live.

use std::path::PathBuf;

/// Interpreters kept ready per environment by the default [`crate::PoolConfig`] (`0` turns the pool
/// off; CI runs the suites both ways).
pub(crate) const POOL_SIZE: &str = "RUNPYTHON_POOL_SIZE";

/// `1`: every run waits for a pooled interpreter instead of starting one cold (CI runs the hostile
/// suite this way to prove pooled runs are isolated like cold ones).
pub(crate) const POOL_PRESTART: &str = "RUNPYTHON_POOL_PRESTART";

/// `1`: one-shot runs are forked from a warm template per environment (the default
/// [`crate::PoolConfig::templates`]); `require`: that, and a run whose configuration allows a
/// template but that cannot be forked from one is an error instead of taking the fresh path (CI runs
/// the hostile suites this way). `0` or unset: off.
pub(crate) const TEMPLATES: &str = "RUNPYTHON_TEMPLATES";

/// What `RUNPYTHON_TEMPLATES` asks for: (templates on, required).
pub(crate) fn templates() -> (bool, bool) {
    match std::env::var(TEMPLATES).as_deref().map(str::trim) {
        Ok("1") | Ok("on") => (true, false),
        Ok("require") => (true, true),
        _ => (false, false),
    }
}

/// The value of `name`, parsed; `None` when unset or unparsable.
pub(crate) fn parsed<T: std::str::FromStr>(name: &str) -> Option<T> {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok())
}

/// runpython's cache directory (`$XDG_CACHE_HOME/runpython` or `$HOME/.cache/runpython`), resolved by
/// runpython-deps, which keeps its interpreter cache there too.
pub(crate) fn cache_dir() -> Option<PathBuf> {
    runpython_deps::cache_dir()
}
