//! From a run's code and specs to a prepared environment, through runpython-deps.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use runpython_deps::{
    detect_imports_async, merge_requirements, DependencySources, EnvProvider, Environments,
    InstallPolicy, Interpreter, PreparedEnv, Progress, Requirement,
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
    /// The warm environments the operator declared, each a list of specs.
    pub warm: Vec<Vec<String>>,
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
            warm: Vec::new(),
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
        let mut warm = Vec::with_capacity(self.warm.len());
        for specs in self.warm {
            let mut requirements = Vec::with_capacity(specs.len());
            for spec in &specs {
                requirements.push(Requirement::parse(spec).map_err(|e| {
                    Error::Config(format!("the warm environment {}: {e}", specs.join(",")))
                })?);
            }
            if requirements.is_empty() {
                return Err(Error::Config(
                    "a warm environment needs at least one requirement (e.g. numpy,pandas)".into(),
                ));
            }
            warm.push(WarmEnv {
                specs,
                requirements,
                prepared: tokio::sync::OnceCell::new(),
                warmth: std::sync::OnceLock::new(),
            });
        }
        Ok(Deps {
            defaults: self.defaults,
            auto: self.auto,
            envs,
            warm: Arc::new(warm),
        })
    }
}

/// Dependency progress as events on `events` (advisory: a full or closed channel drops a step rather
/// than stall preparation).
fn progress_to(events: Option<&mpsc::Sender<Event>>) -> impl Fn(Progress) + '_ {
    move |step| {
        if let Some(tx) = events {
            let _ = tx.try_send(Event::Dependencies(step));
        }
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
    /// Shared by every engine derived from this one (tenants): prepared once.
    warm: Arc<Vec<WarmEnv>>,
}

/// An environment the operator declared warm: prepared once (at start, or by the first run within
/// it), and the runs within it are forked from a template that imported its modules.
#[derive(Debug)]
pub(crate) struct WarmEnv {
    /// The specs as declared.
    pub specs: Vec<String>,
    requirements: Vec<Requirement>,
    prepared: tokio::sync::OnceCell<PreparedEnv>,
    /// What its template imports and primes, found once it is prepared.
    warmth: std::sync::OnceLock<crate::child::Warmth>,
}

impl WarmEnv {
    /// Whether every one of `requirements` is within this environment: what it holds once prepared,
    /// what it was declared with before.
    fn admits(&self, requirements: &[Requirement]) -> bool {
        match self.prepared.get() {
            Some(env) => requirements.iter().all(|r| env.provides(r)),
            None => requirements.iter().all(|r| {
                self.requirements
                    .iter()
                    .any(|d| d == r || (r.is_bare() && d.name() == r.name()))
            }),
        }
    }

    /// What its template imports (the top-level modules of each declared distribution) and primes
    /// (each of those that has a primer: `runpython_warm.py`).
    pub fn warmth(&self, env: &PreparedEnv) -> &crate::child::Warmth {
        self.warmth.get_or_init(|| {
            let mut imports: Vec<String> = self
                .requirements
                .iter()
                .flat_map(|r| env.top_level_modules(r.name()))
                .collect();
            imports.dedup();
            crate::child::Warmth {
                prime: imports.clone(),
                imports,
            }
        })
    }
}

/// The environment a run is given, and whether it is a declared warm one.
#[derive(Debug)]
pub(crate) struct RunEnv {
    pub env: PreparedEnv,
    /// A declared warm environment's: what its template imports and primes.
    pub warm: Option<crate::child::Warmth>,
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

    /// The environment a one-shot run needs: a declared warm environment when everything it needs
    /// is within one (the first declared that admits it, prepared now if it was not yet), else what
    /// [`Deps::prepare`] gives.
    pub async fn prepare_run(
        &self,
        request: &RunRequest,
        interpreter: &Interpreter,
        events: Option<&mpsc::Sender<Event>>,
    ) -> Result<Option<RunEnv>, runpython_deps::Error> {
        let requirements = self.requirements(request, interpreter).await?;
        if requirements.is_empty() {
            return Ok(None);
        }
        let progress = progress_to(events);
        for warm in self.warm.iter() {
            if warm.admits(&requirements) {
                let env = self.prepare_warm(warm, interpreter, &progress).await?;
                // What it holds may be less than its declared names promised (a name that is an
                // extra's, say): then the run gets an environment of its own.
                if requirements.iter().all(|r| env.provides(r)) {
                    return Ok(Some(RunEnv {
                        env: env.clone(),
                        warm: Some(warm.warmth(env).clone()),
                    }));
                }
            }
        }
        self.envs
            .prepare(interpreter, &requirements, &progress)
            .await
            .map(|env| Some(RunEnv { env, warm: None }))
    }

    /// Prepares every declared warm environment now (`RunPython::warm_up`); each with what its
    /// template imports.
    pub async fn prepare_all_warm(
        &self,
        interpreter: &Interpreter,
        progress: &runpython_deps::ProgressFn<'_>,
    ) -> Result<Vec<(PreparedEnv, crate::child::Warmth)>, runpython_deps::Error> {
        let mut out = Vec::with_capacity(self.warm.len());
        for warm in self.warm.iter() {
            let env = self.prepare_warm(warm, interpreter, progress).await?;
            out.push((env.clone(), warm.warmth(env).clone()));
        }
        Ok(out)
    }

    /// Whether any warm environment is declared.
    pub fn has_warm(&self) -> bool {
        !self.warm.is_empty()
    }

    async fn prepare_warm<'w>(
        &self,
        warm: &'w WarmEnv,
        interpreter: &Interpreter,
        progress: &runpython_deps::ProgressFn<'_>,
    ) -> Result<&'w PreparedEnv, runpython_deps::Error> {
        warm.prepared
            .get_or_try_init(|| async {
                let requirements = merge_requirements(&DependencySources {
                    defaults: &self
                        .defaults
                        .iter()
                        .chain(&warm.specs)
                        .cloned()
                        .collect::<Vec<_>>(),
                    explicit: &[],
                    script: None,
                    detected: &[],
                    local_modules: &[],
                    python_version: interpreter.version,
                })?;
                self.envs
                    .prepare(interpreter, &requirements, progress)
                    .await
            })
            .await
    }

    /// What a run's code and request need: the engine's defaults, its explicit and PEP 723
    /// requirements and (with auto-detection) its imports, merged.
    async fn requirements(
        &self,
        request: &RunRequest,
        interpreter: &Interpreter,
    ) -> Result<Vec<Requirement>, runpython_deps::Error> {
        let detected = if self.auto {
            detect_imports_async(request.code.clone()).await?
        } else {
            Vec::new()
        };
        let local: Vec<String> = OWN_MODULES.iter().map(|m| (*m).to_owned()).collect();
        merge_requirements(&DependencySources {
            defaults: &self.defaults,
            explicit: &request.dependencies,
            script: Some(&request.code),
            detected: &detected,
            local_modules: &local,
            python_version: interpreter.version,
        })
    }

    /// The environment the run needs, prepared (once per content key), or `None` when the code needs
    /// nothing beyond the standard library. `Err` is a `DependencyError` for the envelope.
    pub async fn prepare(
        &self,
        request: &RunRequest,
        interpreter: &Interpreter,
        events: Option<&mpsc::Sender<Event>>,
    ) -> Result<Option<PreparedEnv>, runpython_deps::Error> {
        let requirements = self.requirements(request, interpreter).await?;
        if requirements.is_empty() {
            return Ok(None);
        }
        let progress = progress_to(events);
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
