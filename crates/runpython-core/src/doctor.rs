//! What `runpython doctor` reports: what this host's kernel allows, which isolation layers a run of an
//! engine gets (the envelope shows them only when one is missing), where the caches and the store
//! live, and what prepares dependencies. Nothing is run.

use std::path::PathBuf;

use serde::Serialize;

use crate::protocol::envelope::Isolation;
use crate::RunPython;
use runpython_sandbox::KernelReport;

/// A host's readiness for runs of one engine.
#[derive(Debug, Clone, Serialize)]
pub struct Doctor {
    /// What the kernel allows the sandbox.
    pub kernel: KernelReport,
    /// The layers each run of this engine gets; `null` when its sandbox cannot be had (see
    /// `isolation_error`).
    pub isolation: Option<Isolation>,
    /// Why runs cannot get the sandbox this engine requires.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub isolation_error: Option<String>,
    /// The interpreter runs use (`/usr/bin/python3.11 (3.11.7)`), or why none was found.
    pub python: String,
    /// runpython's cache directory (code, bytecode, interpreter discovery, environments).
    pub cache_dir: Option<PathBuf>,
    /// Where dependency environments are prepared.
    pub environments: PathBuf,
    /// The installer that prepares them: `uv`, or `pip` (the fallback).
    pub installer: String,
    /// The `uv` executable found (`$RUNPYTHON_UV`, `$RUNPYTHON_TOOLS_BIN`, `PATH`), if any.
    pub uv: Option<PathBuf>,
    /// The layers an install gets (its installer and every build backend it starts), or why its
    /// sandbox cannot be had.
    pub install_isolation: Result<Isolation, String>,
    /// Whether any package may be built from source (else only the operator's requirements).
    pub source_builds: bool,
    /// The packages the code may install; `null` for any.
    pub allowed_packages: Option<Vec<String>>,
    /// The store runs are kept in, `null` when runs are not kept.
    pub store: Option<String>,
    /// This process's descriptor limit (`RLIMIT_NOFILE`), soft and hard: `runpython serve` raises
    /// the soft one to the hard one and sizes its connection caps by it.
    pub open_files: (u64, u64),
}

/// What this host and this engine's configuration give runs, without running anything.
pub async fn doctor(engine: &RunPython) -> Doctor {
    let (isolation, isolation_error) = match engine.isolation_report() {
        Ok(report) => (Some(report), None),
        Err(e) => (None, Some(e.to_string())),
    };
    let python = match engine.interpreter().await {
        Ok(found) => {
            let (major, minor, patch) = found.version;
            format!("{} ({major}.{minor}.{patch})", found.executable.display())
        }
        Err(e) => format!("not found: {e}"),
    };
    let deps = engine.deps();
    let (installer, environments) = deps.installer();
    let policy = deps.policy();
    Doctor {
        kernel: runpython_sandbox::kernel_report(),
        isolation,
        isolation_error,
        python,
        cache_dir: crate::policy::env_vars::cache_dir(),
        environments,
        installer,
        uv: runpython_deps::UvProvider::find().map(|uv| uv.program().to_path_buf()),
        // With the hosts of the installer's configuration, as an install gets them.
        install_isolation: {
            let network = runpython_deps::install_network(&policy.sandbox.network, &[]);
            runpython_sandbox::report(
                &policy.sandbox.map_network(|_| network.mechanism()),
                deps.timeout(),
                false,
            )
            .map(|mut report| {
                network.describe(&mut report);
                report
            })
            .map_err(|e| e.to_string())
        },
        source_builds: policy.source_builds,
        allowed_packages: policy.allowed_packages.clone(),
        store: engine.store().map(|store| store.url().to_owned()),
        open_files: nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
            .unwrap_or((0, 0)),
    }
}
