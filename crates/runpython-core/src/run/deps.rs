//! From a run's code and specs to a prepared environment, through runpython-deps.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use runpython_deps::{
    detect_imports_async, merge_requirements, DependencySources, EnvProvider, Environments,
    InstallPolicy, Interpreter, PreparedEnv,
};
use tokio::sync::mpsc;

use crate::error::Error;
use crate::protocol::envelope::{Dependencies, Dependency, RefusedDependency};
use crate::protocol::request::{Event, RunRequest};

/// runpython's own modules, importable in the child: never dependencies.
const OWN_MODULES: &[&str] = &["runpython_runner", "runpython_tools", "runpython_display"];

/// The builder's dependency settings.
#[derive(Debug)]
pub(crate) struct DepsConfig {
    pub defaults: Vec<String>,
    pub auto: bool,
    pub root: Option<PathBuf>,
    pub provider: Option<Arc<dyn EnvProvider>>,
    pub timeout: Option<Duration>,
    pub policy: InstallPolicy,
}

impl Default for DepsConfig {
    fn default() -> Self {
        Self {
            defaults: Vec::new(),
            auto: true,
            root: None,
            provider: None,
            timeout: None,
            policy: InstallPolicy::default(),
        }
    }
}

impl DepsConfig {
    pub fn build(self) -> Result<Deps, Error> {
        let root = match self.root {
            Some(root) => root,
            None => default_env_root().ok_or_else(|| {
                Error::Config("no cache directory for environments: set HOME or env_root()".into())
            })?,
        };
        let mut envs = match self.provider {
            Some(provider) => Environments::new(root, provider),
            None => Environments::with_default_provider(root),
        };
        if let Some(timeout) = self.timeout {
            envs = envs.with_timeout(timeout);
        }
        envs = envs.with_policy(self.policy);
        Ok(Deps {
            defaults: self.defaults,
            auto: self.auto,
            envs,
        })
    }
}

fn default_env_root() -> Option<PathBuf> {
    crate::policy::env_vars::cache_dir().map(|dir| dir.join("envs"))
}

/// Dependency policy of a [`crate::RunPython`].
#[derive(Debug, Clone)]
pub(crate) struct Deps {
    defaults: Vec<String>,
    auto: bool,
    envs: Environments,
}

impl Deps {
    /// What installs may do (their sandbox, source builds, the allowlist).
    pub fn policy(&self) -> &InstallPolicy {
        self.envs.policy()
    }

    /// How long preparing an environment may take.
    pub fn timeout(&self) -> Duration {
        self.envs.timeout()
    }

    /// The installer's kind (`uv`, `pip`) and where it prepares environments.
    pub fn installer(&self) -> (String, PathBuf) {
        (
            self.envs.provider().kind().to_owned(),
            self.envs.root().to_path_buf(),
        )
    }

    /// The environment the run needs, prepared (once per content key), or `None` when the code needs
    /// nothing beyond the standard library. `Err` is a `DependencyError` for the envelope.
    pub async fn prepare(
        &self,
        request: &RunRequest,
        interpreter: &Interpreter,
        events: Option<&mpsc::Sender<Event>>,
    ) -> Result<Option<PreparedEnv>, runpython_deps::Error> {
        let detected = if self.auto {
            detect_imports_async(request.code.clone()).await?
        } else {
            Vec::new()
        };
        let local: Vec<String> = OWN_MODULES.iter().map(|m| (*m).to_owned()).collect();
        let requirements = merge_requirements(&DependencySources {
            defaults: &self.defaults,
            explicit: &request.dependencies,
            script: Some(&request.code),
            detected: &detected,
            local_modules: &local,
            python_version: interpreter.version,
        })?;
        if requirements.is_empty() {
            return Ok(None);
        }
        let progress = |step| {
            if let Some(tx) = events {
                // Progress is advisory: a full or closed channel drops it rather than stall preparation.
                let _ = tx.try_send(Event::Dependencies(step));
            }
        };
        self.envs
            .prepare(interpreter, &requirements, &progress)
            .await
            .map(Some)
    }

    /// Where prepared environments live (a session's interpreter reads them all, so a cell may add
    /// dependencies while it lives).
    pub fn root(&self) -> &std::path::Path {
        self.envs.root()
    }

    /// The part of a memo key that decides the dependencies: defaults, explicit specs, auto-detection.
    /// (Detected imports and the PEP 723 block are functions of the code, which the key also holds.)
    pub fn memo_part(&self, request: &RunRequest) -> String {
        let mut specs: Vec<&str> = self
            .defaults
            .iter()
            .chain(&request.dependencies)
            .map(String::as_str)
            .collect();
        specs.sort_unstable();
        format!("auto={}|{}", self.auto, specs.join("\u{0}"))
    }
}

/// The envelope's `dependencies` when `env` was installed for this run: its distributions, those a
/// requirement named first. A run of an environment prepared before says nothing (a model pays for
/// every byte of every envelope; the run that installed it said what it holds).
pub(crate) fn report(env: &PreparedEnv) -> Option<Dependencies> {
    if env.installed.is_empty() || !env.installed_now {
        return None;
    }
    let mut listed: Vec<Dependency> = env
        .installed
        .iter()
        .map(|d| Dependency {
            name: d.name.clone(),
            version: d.version.clone(),
            source: d
                .source
                .as_ref()
                .map_or("dependency", |s| s.kind())
                .to_owned(),
            module: d
                .source
                .as_ref()
                .and_then(|s| s.module())
                .map(str::to_owned),
        })
        .collect();
    listed.sort_by_key(|d| d.source == "dependency");
    let omitted = listed.len().saturating_sub(Dependencies::MAX_LISTED) as u64;
    listed.truncate(Dependencies::MAX_LISTED);
    Some(Dependencies {
        installed: listed,
        omitted,
        refused: Vec::new(),
    })
}

/// The envelope's `dependencies` for an install that refused a package.
pub(crate) fn refused(error: &runpython_deps::Error) -> Option<Dependencies> {
    let (name, source, reason) = match error {
        runpython_deps::Error::NotAllowed { package, asked_by } => {
            (package, asked_by.kind(), "not allowed")
        }
        runpython_deps::Error::SourceBuildRefused { package, asked_by } => (
            package,
            asked_by.as_ref().map_or("dependency", |s| s.kind()),
            "source build",
        ),
        _ => return None,
    };
    Some(Dependencies {
        refused: vec![RefusedDependency {
            name: name.clone(),
            source: source.to_owned(),
            reason: reason.to_owned(),
        }],
        ..Dependencies::default()
    })
}
