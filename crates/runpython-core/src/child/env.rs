//! The child's environment: an allowlist, never the host's secrets.

/// Environment variables a child keeps by default; everything else (API keys included) is dropped.
pub(crate) const ENV_ALLOWLIST: &[&str] = &["PATH", "HOME", "LANG", "TZ", "TERM", "TMPDIR"];

/// The child's environment: the allowlist, every `LC_*`, and the explicit passthrough names.
pub(crate) fn child_env(passthrough: &[String]) -> Vec<(String, String)> {
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
    env
}
