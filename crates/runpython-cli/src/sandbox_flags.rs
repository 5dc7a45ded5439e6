//! The flags that set the sandbox's limits and what installs may do, shared by every command that
//! makes runs (`run`, `resume`, `mcp`, `serve`, `repl`, `doctor`, `tool-spec`).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use runpython_core::{parse_size, InstallPolicy, RunPythonBuilder};

/// A run's limits.
#[derive(Debug, Args)]
pub(crate) struct SandboxArgs {
    /// The run's memory in all (every process, shared memory and its files' pages), as 512M, 2G
    /// (default 4G); without a cgroup, each process's address space instead.
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    memory: Option<u64>,
    /// Everything the run may write in total (its working directory, /tmp, /dev/shm), as 512M, 2G
    /// (default 1G).
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    disk: Option<u64>,
    /// Processes and threads the run may have at once (default 256).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    max_processes: Option<u64>,
    /// CPUs the run may use at once (default 1; 0.5 and 2.5 are fine).
    #[arg(long, value_name = "N", value_parser = parse_cpus)]
    cpus: Option<f64>,
    /// Refuse runs where a sandbox layer is missing (`doctor` says which) instead of running them
    /// with fewer layers and reporting them in `isolation.missing`.
    #[arg(long)]
    require_isolation: bool,
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
    allow_source_builds: bool,
    /// A distribution the code may install (repeatable). With any of these (or --packages-file), an
    /// import of anything else is a DependencyError; --dep specs are always allowed.
    #[arg(long = "allow-package", value_name = "NAME")]
    allow_packages: Vec<String>,
    /// Distributions the code may install, one per line (`#` comments allowed), as with --allow-package.
    #[arg(long, value_name = "FILE")]
    packages_file: Option<PathBuf>,
    /// How long preparing an environment may take (default 600).
    #[arg(long, value_name = "SECONDS", value_parser = crate::parse_timeout)]
    install_timeout: Option<Duration>,
    /// An install's memory in all, its scratch's pages included (default 4G).
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    install_memory: Option<u64>,
    /// Everything an install may write: the packages and the installer's cache (default 2G).
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    install_disk: Option<u64>,
    /// A host installs may reach besides their index (repeatable, --allow-host's patterns): a
    /// private index's separate file host, say. The indexes themselves (UV_DEFAULT_INDEX,
    /// UV_INDEX_URL, UV_INDEX, PIP_INDEX_URL, the extra indexes and find-links; PyPI and
    /// files.pythonhosted.org by default) need no flag.
    #[arg(long = "install-allow-host", value_name = "PATTERN",
          value_parser = |s: &str| s.parse::<runpython_core::HostPattern>().map_err(|e| e.to_string()))]
    install_allow_hosts: Vec<runpython_core::HostPattern>,
    /// Installs share the host's network instead of reaching only their index.
    #[arg(long, conflicts_with = "install_allow_hosts")]
    install_host_network: bool,
}

impl SandboxArgs {
    pub(crate) fn apply(&self, mut builder: RunPythonBuilder) -> RunPythonBuilder {
        if let Some(bytes) = self.memory {
            builder = builder.memory_limit(bytes).address_space_limit(bytes);
        }
        if let Some(bytes) = self.disk {
            builder = builder.disk_limit(bytes);
        }
        if let Some(n) = self.max_processes {
            builder = builder.max_processes(n);
        }
        if let Some(cpus) = self.cpus {
            builder = builder.cpus(cpus);
        }
        if self.require_isolation {
            builder = builder.require_isolation(true);
        }
        builder
    }
}

impl InstallArgs {
    pub(crate) fn apply(&self, mut builder: RunPythonBuilder) -> anyhow::Result<RunPythonBuilder> {
        if self.allow_source_builds {
            builder = builder.allow_source_builds(true);
        }
        for name in &self.allow_packages {
            builder = builder.allow_package(name);
        }
        if let Some(path) = &self.packages_file {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("cannot read the packages file {}", path.display()))?;
            for line in text.lines() {
                let name = line.split('#').next().unwrap_or_default().trim();
                if !name.is_empty() {
                    builder = builder.allow_package(name);
                }
            }
        }
        if let Some(timeout) = self.install_timeout {
            builder = builder.prepare_timeout(timeout);
        }
        if self.install_memory.is_some()
            || self.install_disk.is_some()
            || !self.install_allow_hosts.is_empty()
            || self.install_host_network
        {
            let mut sandbox = InstallPolicy::default_sandbox();
            if let Some(bytes) = self.install_memory {
                sandbox.run_memory_bytes = bytes;
            }
            if let Some(bytes) = self.install_disk {
                sandbox.disk_bytes = bytes;
            }
            if let runpython_core::Network::Policy(policy) = &mut sandbox.network {
                policy
                    .allow
                    .extend(self.install_allow_hosts.iter().cloned());
            }
            if self.install_host_network {
                sandbox.network = runpython_core::Network::Host;
            }
            builder = builder.install_sandbox(sandbox);
        }
        Ok(builder)
    }
}
