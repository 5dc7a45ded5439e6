//! The flags that set the sandbox's limits and what installs may do, shared by every command that
//! makes runs (`run`, `resume`, `mcp`, `serve`, `repl`, `doctor`, `tool-spec`).

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use runpython_core::parse_size;

/// A run's limits.
#[derive(Debug, Args)]
pub(crate) struct SandboxArgs {
    /// The run's memory in all (every process, shared memory and its files' pages), as 512M, 2G
    /// (default 4G); without a cgroup, each process's address space instead.
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub(crate) memory: Option<u64>,
    /// Everything the run may write in total (its working directory, /tmp, /dev/shm), as 512M, 2G
    /// (default 1G).
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub(crate) disk: Option<u64>,
    /// Processes and threads the run may have at once (default 256).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) max_processes: Option<u64>,
    /// CPUs the run may use at once (default 1; 0.5 and 2.5 are fine).
    #[arg(long, value_name = "N", value_parser = parse_cpus)]
    pub(crate) cpus: Option<f64>,
    /// Refuse runs where a sandbox layer is missing (`doctor` says which) instead of running them
    /// with fewer layers and reporting them in `isolation.missing`.
    #[arg(long)]
    pub(crate) require_isolation: bool,
}

fn parse_cpus(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(n) if n.is_finite() && n >= 0.01 => Ok(n),
        _ => Err(format!(
            "{s:?} is not a number of CPUs (at least 0.01, e.g. 1 or 0.5)"
        )),
    }
}

/// What installs may do.
#[derive(Debug, Args)]
pub(crate) struct InstallArgs {
    /// Let any package be built from source (its build scripts run inside the install sandbox). By
    /// default only --dep specs may be; what the code imports installs wheels.
    #[arg(long)]
    pub(crate) allow_source_builds: bool,
    /// A distribution the code may install (repeatable). With any of these (or --packages-file), an
    /// import of anything else is a DependencyError; --dep specs are always allowed.
    #[arg(long = "allow-package", value_name = "NAME")]
    pub(crate) allow_packages: Vec<String>,
    /// Distributions the code may install, one per line (`#` comments allowed), as with --allow-package.
    #[arg(long, value_name = "FILE")]
    pub(crate) packages_file: Option<PathBuf>,
    /// How long preparing an environment may take (default 600).
    #[arg(long, value_name = "SECONDS", value_parser = super::parse_timeout)]
    pub(crate) install_timeout: Option<Duration>,
    /// An install's memory in all, its scratch's pages included (default 4G).
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub(crate) install_memory: Option<u64>,
    /// Everything an install may write: the packages and the installer's cache (default 2G).
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub(crate) install_disk: Option<u64>,
    /// A host installs may reach besides their index (repeatable, --allow-host's patterns): a
    /// private index's separate file host, say. The indexes themselves (UV_DEFAULT_INDEX,
    /// UV_INDEX_URL, UV_INDEX, PIP_INDEX_URL, the extra indexes and find-links; PyPI and
    /// files.pythonhosted.org by default) need no flag.
    #[arg(long = "install-allow-host", value_name = "PATTERN",
          value_parser = |s: &str| s.parse::<runpython_core::HostPattern>().map_err(|e| e.to_string()))]
    pub(crate) install_allow_hosts: Vec<runpython_core::HostPattern>,
    /// Installs share the host's network instead of reaching only their index.
    #[arg(long, conflicts_with = "install_allow_hosts")]
    pub(crate) install_host_network: bool,
}
