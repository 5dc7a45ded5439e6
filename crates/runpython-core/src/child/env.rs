//! The child's environment: an allowlist, never the host's secrets.

use std::path::Path;

/// Environment variables a child keeps by default; everything else (API keys included) is dropped.
pub(crate) const ENV_ALLOWLIST: &[&str] = &["HOME", "LANG", "TZ", "TERM", "TMPDIR"];

/// A run's `PATH` unless the operator lets the host's through (`--env-passthrough PATH`): the
/// system's directories, never the host's own (`~/.cargo/bin`, pyenv's shims name the host's
/// layout). The runner puts the run's environment's `bin` in front when it has one.
pub(crate) const DEFAULT_PATH: &str = "/usr/local/bin:/usr/bin:/bin";

/// The child's environment: the allowlist, every `LC_*`, and the explicit passthrough names; `PATH`
/// [`DEFAULT_PATH`] (unless passed through); `HOME`,
/// the caches and configuration libraries write (matplotlib's, fontconfig's) in the run's own scratch
/// (`scratch/home`, never collected), and with a filesystem view `TMPDIR=/tmp` (the host's does not
/// exist there).
pub(crate) fn child_env(
    passthrough: &[String],
    scratch: &Path,
    view: bool,
) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = std::env::vars()
        .filter(|(name, _)| {
            ENV_ALLOWLIST.contains(&name.as_str())
                || name.starts_with("LC_")
                || passthrough.iter().any(|p| p == name)
        })
        .collect();
    // There is no display: matplotlib draws off-screen, and open figures are saved as PNG artifacts.
    if !env.iter().any(|(name, _)| name == "MPLBACKEND") {
        env.push(("MPLBACKEND".into(), "Agg".into()));
    }
    let home = scratch.join("home");
    let mut set = |name: &str, value: String| {
        if !passthrough.iter().any(|p| p == name) {
            env.retain(|(n, _)| n != name);
            env.push((name.into(), value));
        }
    };
    set("PATH", DEFAULT_PATH.into());
    set("HOME", home.display().to_string());
    set("XDG_CACHE_HOME", home.join(".cache").display().to_string());
    set(
        "XDG_CONFIG_HOME",
        home.join(".config").display().to_string(),
    );
    set(
        "MPLCONFIGDIR",
        home.join(".config/matplotlib").display().to_string(),
    );
    if view {
        set("TMPDIR", "/tmp".into());
    }
    env
}

#[cfg(test)]
mod tests {
    use super::*;

    fn path_of(env: &[(String, String)]) -> Option<&str> {
        env.iter()
            .find(|(name, _)| name == "PATH")
            .map(|(_, value)| value.as_str())
    }

    #[test]
    fn a_runs_path_is_the_systems_unless_the_hosts_is_passed_through() {
        let scratch = Path::new("/runpython");
        assert_eq!(path_of(&child_env(&[], scratch, true)), Some(DEFAULT_PATH));
        let host = std::env::var("PATH").ok();
        assert_eq!(
            path_of(&child_env(&["PATH".into()], scratch, true)),
            host.as_deref()
        );
    }
}
