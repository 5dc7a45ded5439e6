//! Prepared environments: keyed by content, built once beside their final place, renamed into it.
//! Where each thing lives under the root is [`crate::layout`]'s to say.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use crate::job::{InstallJob, Progress, ProgressFn, SourceBuilds};
use crate::layout::{building_dir, discard, short_hash, ENVS, MANIFEST, SITE};
use crate::lock::KeyLock;
use crate::policy::{install_network, install_reads, InstallPolicy};
use crate::prepared::{Installed, PreparedEnv};
use crate::provider::{EnvProvider, PipProvider, UvProvider};
use crate::requirement::normalize_name;
use crate::{Error, Interpreter, Requirement};

const FORMAT: &str = "runpython-env-v1";

/// Default for [`Environments::with_timeout`].
pub(crate) const DEFAULT_PREPARE_TIMEOUT: Duration = Duration::from_secs(600);

#[derive(Serialize, Deserialize)]
struct Manifest {
    format: String,
    key: String,
    interpreter: PathBuf,
    python_version: (u32, u32, u32),
    provider: String,
    specs: Vec<String>,
    fingerprint: String,
    installed: Vec<String>,
}

/// Environments under one root directory, prepared by one [`EnvProvider`].
#[derive(Debug, Clone)]
pub struct Environments {
    root: PathBuf,
    provider: Arc<dyn EnvProvider>,
    timeout: Duration,
    policy: InstallPolicy,
}

impl Environments {
    /// Environments under `root`, installed by `provider`.
    pub fn new(root: impl Into<PathBuf>, provider: Arc<dyn EnvProvider>) -> Self {
        Self {
            root: root.into(),
            provider,
            timeout: DEFAULT_PREPARE_TIMEOUT,
            policy: InstallPolicy::default(),
        }
    }

    /// Environments under `root` with the preferred provider: uv if [`UvProvider::find`] finds it,
    /// else [`PipProvider`].
    pub fn with_default_provider(root: impl Into<PathBuf>) -> Self {
        let provider: Arc<dyn EnvProvider> = match UvProvider::find() {
            Some(uv) => Arc::new(uv),
            None => Arc::new(PipProvider),
        };
        Self::new(root, provider)
    }

    /// Bounds one preparation (waiting for another preparer included); the installer is killed when it
    /// runs out. Default: 10 minutes, long enough for a cold install of a large wheel set.
    #[must_use]
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// What installs may do ([`InstallPolicy`]; default: sandboxed, wheels only for what the code
    /// asks for, any package allowed).
    #[must_use]
    pub fn with_policy(mut self, policy: InstallPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// How long one preparation may take.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The install policy.
    pub fn policy(&self) -> &InstallPolicy {
        &self.policy
    }

    /// The root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The provider.
    pub fn provider(&self) -> &dyn EnvProvider {
        &*self.provider
    }

    /// The key of the environment for `interpreter` and `requirements`.
    pub fn key(&self, interpreter: &Interpreter, requirements: &[Requirement]) -> String {
        self.key_for(interpreter, &canonical_specs(requirements))
    }

    fn key_for(&self, interpreter: &Interpreter, specs: &[String]) -> String {
        let version = format!("{:?}", interpreter.version);
        let mut parts: Vec<&[u8]> = vec![
            FORMAT.as_bytes(),
            interpreter.executable.as_os_str().as_encoded_bytes(),
            version.as_bytes(),
            self.provider.kind().as_bytes(),
        ];
        parts.extend(specs.iter().map(|s| s.as_bytes()));
        short_hash(&parts)
    }

    /// The prepared environment for `interpreter` and `requirements`, if it exists. Never installs;
    /// a few microseconds of blocking file I/O.
    pub fn lookup(
        &self,
        interpreter: &Interpreter,
        requirements: &[Requirement],
    ) -> Option<PreparedEnv> {
        let specs = canonical_specs(requirements);
        if specs.is_empty() {
            return Some(no_env(interpreter));
        }
        self.policy.check(requirements).ok()?;
        self.cached(&self.key_for(interpreter, &specs))
            .map(|env| with_sources(env, requirements))
    }

    /// Makes `requirements` importable by `interpreter`: returns at once when the environment exists,
    /// else installs it once (concurrent callers for the same key wait for the first), within the
    /// timeout. No requirements: no environment, no I/O.
    pub async fn prepare(
        &self,
        interpreter: &Interpreter,
        requirements: &[Requirement],
        progress: &ProgressFn<'_>,
    ) -> Result<PreparedEnv, Error> {
        let specs = canonical_specs(requirements);
        if specs.is_empty() {
            return Ok(no_env(interpreter));
        }
        self.policy.check(requirements)?;
        let key = self.key_for(interpreter, &specs);
        if let Some(env) = self.cached(&key) {
            progress(Progress::Cached { key });
            return Ok(with_sources(env, requirements));
        }
        let started = Instant::now();
        let deadline = started + self.timeout;
        let on_wait = || progress(Progress::Waiting { key: key.clone() });
        let _lock = KeyLock::acquire(&self.root, &key, deadline, &on_wait).await?;
        if let Some(env) = self.cached(&key) {
            progress(Progress::Cached { key });
            return Ok(with_sources(env, requirements));
        }
        progress(Progress::Resolving {
            specs: specs.clone(),
        });
        let building = BuildingDir(Some(building_dir(&self.root, &key)?));
        let dir = building.path().to_path_buf();
        let site = dir.join(SITE);
        std::fs::create_dir(&site).map_err(|e| Error::io("create the site directory", &site, e))?;
        let operator: Vec<String> = requirements
            .iter()
            .filter(|r| r.source().is_operator())
            .map(|r| r.name().to_owned())
            .collect();
        let reads = install_reads(requirements);
        let sandbox = runpython_egress::Sandbox {
            network: install_network(&self.policy.sandbox.network, requirements),
            ..self.policy.sandbox.clone()
        };
        self.provider
            .install(InstallJob {
                interpreter,
                specs: &specs,
                target: &site,
                root: &self.root,
                deadline,
                progress,
                sandbox: &sandbox,
                reads: &reads,
                source_builds: match self.policy.source_builds {
                    true => SourceBuilds::Any,
                    false => SourceBuilds::Only(&operator),
                },
            })
            .await
            .map_err(|e| match e {
                Error::SourceBuildRefused { package, .. } => Error::SourceBuildRefused {
                    asked_by: requirements
                        .iter()
                        .find(|r| r.name() == package)
                        .map(|r| r.source().clone()),
                    package,
                },
                other => other,
            })?;

        let installed = installed_distributions(&site)?;
        let manifest = Manifest {
            format: FORMAT.into(),
            key: key.clone(),
            interpreter: interpreter.executable.clone(),
            python_version: interpreter.version,
            provider: self.provider.kind().to_owned(),
            fingerprint: fingerprint(interpreter, &installed),
            specs,
            installed,
        };
        write_manifest(&dir.join(MANIFEST), &manifest)?;
        let envs = self.root.join(ENVS);
        std::fs::create_dir_all(&envs)
            .map_err(|e| Error::io("create the environments directory", &envs, e))?;
        let final_dir = envs.join(&key);
        if let Err(e) = std::fs::rename(&dir, &final_dir) {
            // Only a broken leftover can be there (we hold the lock): move it aside and retry once.
            if final_dir.exists() {
                discard(&self.root, &final_dir);
            }
            std::fs::rename(&dir, &final_dir)
                .map_err(|_| Error::io("move the new environment into place", &final_dir, e))?;
        }
        building.commit();
        progress(Progress::Done {
            key: key.clone(),
            elapsed: started.elapsed(),
        });
        self.cached(&key)
            .map(|env| PreparedEnv {
                installed_now: true,
                ..with_sources(env, requirements)
            })
            .ok_or_else(|| {
                Error::io(
                    "read back the new environment",
                    &final_dir,
                    std::io::ErrorKind::NotFound.into(),
                )
            })
    }

    /// The complete environment `key`, marking it used; `None` if absent or unreadable.
    fn cached(&self, key: &str) -> Option<PreparedEnv> {
        let dir = self.root.join(ENVS).join(key);
        let manifest_path = dir.join(MANIFEST);
        let text = std::fs::read(&manifest_path).ok()?;
        let manifest: Manifest = serde_json::from_slice(&text).ok()?;
        let site = dir.join(SITE);
        if manifest.format != FORMAT || manifest.key != key || !site.is_dir() {
            return None;
        }
        // Best effort: the manifest's mtime is the last use GC goes by.
        if let Ok(file) = File::options().append(true).open(&manifest_path) {
            let _ = file.set_modified(SystemTime::now());
        }
        Some(PreparedEnv {
            key: manifest.key,
            interpreter: manifest.interpreter,
            site_dir: Some(site),
            specs: manifest.specs,
            fingerprint: manifest.fingerprint,
            installed: manifest
                .installed
                .iter()
                .filter_map(|d| installed_of(d))
                .collect(),
            installed_now: false,
        })
    }
}

/// `name-version.dist-info` as a distribution.
fn installed_of(dist_info: &str) -> Option<Installed> {
    let stem = dist_info.strip_suffix(".dist-info")?;
    let (name, version) = stem.split_once('-')?;
    Some(Installed {
        name: name.to_owned(),
        version: version.to_owned(),
        source: None,
    })
}

/// Names who asked for each installed distribution, from this call's requirements.
fn with_sources(mut env: PreparedEnv, requirements: &[Requirement]) -> PreparedEnv {
    for installed in &mut env.installed {
        let name = normalize_name(&installed.name);
        installed.source = requirements
            .iter()
            .find(|r| r.name() == name)
            .map(|r| r.source().clone());
    }
    env
}

fn canonical_specs(requirements: &[Requirement]) -> Vec<String> {
    let mut specs: Vec<String> = requirements.iter().map(ToString::to_string).collect();
    specs.sort();
    specs.dedup();
    specs
}

fn no_env(interpreter: &Interpreter) -> PreparedEnv {
    PreparedEnv {
        key: String::new(),
        interpreter: interpreter.executable.clone(),
        site_dir: None,
        specs: Vec::new(),
        fingerprint: fingerprint(interpreter, &[]),
        installed: Vec::new(),
        installed_now: false,
    }
}

fn fingerprint(interpreter: &Interpreter, installed: &[String]) -> String {
    let version = format!("{:?}", interpreter.version);
    let mut parts: Vec<&[u8]> = vec![
        FORMAT.as_bytes(),
        interpreter.executable.as_os_str().as_encoded_bytes(),
        version.as_bytes(),
    ];
    parts.extend(installed.iter().map(|s| s.as_bytes()));
    short_hash(&parts)
}

/// The `name-version.dist-info` directories in `site`, sorted.
fn installed_distributions(site: &Path) -> Result<Vec<String>, Error> {
    let entries =
        std::fs::read_dir(site).map_err(|e| Error::io("list the installed packages", site, e))?;
    let mut names: Vec<String> = entries
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|name| name.ends_with(".dist-info"))
        .collect();
    names.sort();
    Ok(names)
}

fn write_manifest(path: &Path, manifest: &Manifest) -> Result<(), Error> {
    let text = serde_json::to_vec_pretty(manifest).map_err(|e| {
        Error::io(
            "encode the manifest",
            path,
            std::io::Error::new(std::io::ErrorKind::InvalidData, e),
        )
    })?;
    let mut file = File::create(path).map_err(|e| Error::io("write the manifest", path, e))?;
    std::io::Write::write_all(&mut file, &text)
        .and_then(|()| file.sync_all())
        .map_err(|e| Error::io("write the manifest", path, e))
}

/// Removes a half-built environment when preparation fails or its future is dropped.
struct BuildingDir(Option<PathBuf>);

impl BuildingDir {
    fn path(&self) -> &Path {
        self.0.as_deref().unwrap_or(Path::new(""))
    }

    fn commit(mut self) {
        self.0 = None;
    }
}

impl Drop for BuildingDir {
    fn drop(&mut self) {
        if let Some(dir) = self.0.take() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Mutex;

    use super::*;
    use crate::gc::{gc, list_dirs};
    use crate::layout::BUILDING;

    use crate::BoxFuture;

    /// Writes a fake `name-1.0.dist-info` per spec; counts its calls; fails on a spec named `broken`.
    #[derive(Debug, Default)]
    struct FakeProvider {
        calls: AtomicUsize,
        delay: Duration,
    }

    impl EnvProvider for FakeProvider {
        fn kind(&self) -> &str {
            "fake"
        }

        fn install<'a>(&'a self, job: InstallJob<'a>) -> BoxFuture<'a, Result<(), Error>> {
            Box::pin(async move {
                self.calls.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(self.delay).await;
                for spec in job.specs {
                    if spec == "broken" {
                        return Err(Error::Install {
                            packages: job.specs.to_vec(),
                            program: "fake".into(),
                            status: "exit status: 1".into(),
                            output: "no such package".into(),
                        });
                    }
                    std::fs::create_dir(job.target.join(format!("{spec}-1.0.dist-info"))).unwrap();
                }
                Ok(())
            })
        }
    }

    fn python() -> Interpreter {
        Interpreter {
            executable: "/usr/bin/python3".into(),
            version: (3, 11, 7),
        }
    }

    fn reqs(specs: &[&str]) -> Vec<Requirement> {
        specs
            .iter()
            .map(|s| Requirement::parse(s).unwrap())
            .collect()
    }

    #[tokio::test]
    async fn an_environment_is_prepared_once_and_then_served_from_its_key() {
        let root = tempfile::tempdir().unwrap();
        let fake = Arc::new(FakeProvider::default());
        let envs = Environments::new(root.path(), fake.clone());
        let events = Mutex::new(Vec::new());
        let record = |p: Progress| events.lock().unwrap().push(p);

        let first = envs
            .prepare(&python(), &reqs(&["b", "a"]), &record)
            .await
            .unwrap();
        assert_eq!(first.specs, ["a", "b"]);
        let site = first.site_dir.clone().unwrap();
        assert!(site.join("a-1.0.dist-info").is_dir());
        assert!(site.starts_with(root.path().join(ENVS).join(&first.key)));

        // Same requirements in another order and spelling: same key, no install.
        let again = envs
            .prepare(&python(), &reqs(&["A", "b"]), &record)
            .await
            .unwrap();
        assert!(first.installed_now && !again.installed_now);
        assert_eq!(
            again,
            PreparedEnv {
                installed_now: false,
                ..first.clone()
            }
        );
        assert_eq!(fake.calls.load(Ordering::SeqCst), 1);
        assert_eq!(
            envs.lookup(&python(), &reqs(&["a", "b"])),
            Some(PreparedEnv {
                installed_now: false,
                ..first.clone()
            })
        );
        let events = events.into_inner().unwrap();
        assert!(
            matches!(events.first(), Some(Progress::Resolving { .. })),
            "{events:?}"
        );
        assert!(
            events.iter().any(|e| matches!(e, Progress::Done { .. })),
            "{events:?}"
        );
        assert!(
            matches!(events.last(), Some(Progress::Cached { .. })),
            "{events:?}"
        );

        // Another interpreter version, spec or provider is another environment.
        let other = Interpreter {
            version: (3, 12, 1),
            ..python()
        };
        assert_ne!(envs.key(&other, &reqs(&["a", "b"])), first.key);
        assert_ne!(envs.key(&python(), &reqs(&["a", "b==1"])), first.key);
        let pip = Environments::new(root.path(), Arc::new(PipProvider));
        assert_ne!(pip.key(&python(), &reqs(&["a", "b"])), first.key);
    }

    #[tokio::test]
    async fn no_requirements_means_no_environment_and_no_io() {
        let root = tempfile::tempdir().unwrap();
        let envs = Environments::new(
            root.path().join("never-created"),
            Arc::new(FakeProvider::default()),
        );
        let env = envs.prepare(&python(), &[], &|_| {}).await.unwrap();
        assert_eq!(env.site_dir, None);
        assert_eq!(env.interpreter, python().executable);
        assert!(!root.path().join("never-created").exists());
    }

    #[tokio::test]
    async fn concurrent_preparers_of_one_new_environment_install_it_once() {
        let root = tempfile::tempdir().unwrap();
        let fake = Arc::new(FakeProvider {
            delay: Duration::from_millis(300),
            ..FakeProvider::default()
        });
        let envs = Environments::new(root.path(), fake.clone());
        let other = Environments::new(root.path(), fake.clone());
        let wanted = reqs(&["tabulate"]);
        let interpreter = python();
        let (a, b) = tokio::join!(
            envs.prepare(&interpreter, &wanted, &|_| {}),
            other.prepare(&interpreter, &wanted, &|_| {}),
        );
        let (a, b) = (a.unwrap(), b.unwrap());
        assert_eq!(a.key, b.key);
        assert_ne!(
            a.installed_now, b.installed_now,
            "one installed, the other waited"
        );
        assert_eq!(fake.calls.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_failed_install_leaves_nothing_behind_and_is_retried_next_time() {
        let root = tempfile::tempdir().unwrap();
        let fake = Arc::new(FakeProvider::default());
        let envs = Environments::new(root.path(), fake.clone());
        let err = envs
            .prepare(&python(), &reqs(&["broken"]), &|_| {})
            .await
            .unwrap_err();
        assert!(matches!(err, Error::Install { .. }), "{err}");
        assert_eq!(list_dirs(&root.path().join(BUILDING)).unwrap(), []);
        assert_eq!(list_dirs(&root.path().join(ENVS)).unwrap(), []);
        envs.prepare(&python(), &reqs(&["broken"]), &|_| {})
            .await
            .unwrap_err();
        assert_eq!(fake.calls.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn a_half_built_environment_from_a_crash_is_never_used() {
        let root = tempfile::tempdir().unwrap();
        let fake = Arc::new(FakeProvider::default());
        let envs = Environments::new(root.path(), fake.clone());
        let wanted = reqs(&["six"]);
        let key = envs.key(&python(), &wanted);
        // A crash before the rename leaves only a building dir; one during a non-atomic copy
        // could leave an env dir without its manifest.
        let leftover = building_dir(root.path(), &key).unwrap();
        std::fs::create_dir(leftover.join(SITE)).unwrap();
        std::fs::create_dir_all(root.path().join(ENVS).join(&key).join(SITE)).unwrap();
        assert_eq!(envs.lookup(&python(), &wanted), None);
        let env = envs.prepare(&python(), &wanted, &|_| {}).await.unwrap();
        assert!(env.site_dir.unwrap().join("six-1.0.dist-info").is_dir());
        assert_eq!(fake.calls.load(Ordering::SeqCst), 1);
        // GC removes the crash leftover (nobody holds its lock).
        let report = gc(root.path(), Duration::from_secs(3600), u64::MAX).unwrap();
        assert!(!leftover.exists());
        assert_eq!(report.kept, 1);
    }

    #[tokio::test]
    async fn a_timeout_while_another_preparer_holds_the_lock_is_an_error() {
        let root = tempfile::tempdir().unwrap();
        let envs = Environments::new(root.path(), Arc::new(FakeProvider::default()))
            .with_timeout(Duration::from_millis(100));
        let wanted = reqs(&["six"]);
        let _held = KeyLock::try_acquire(root.path(), &envs.key(&python(), &wanted))
            .unwrap()
            .unwrap();
        let waited = AtomicUsize::new(0);
        let on_progress = |p: Progress| {
            if matches!(p, Progress::Waiting { .. }) {
                waited.fetch_add(1, Ordering::SeqCst);
            }
        };
        let err = envs
            .prepare(&python(), &wanted, &on_progress)
            .await
            .unwrap_err();
        assert!(matches!(err, Error::LockTimeout { .. }), "{err}");
        assert_eq!(waited.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn gc_removes_old_environments_then_the_least_recently_used_over_the_size_budget() {
        let root = tempfile::tempdir().unwrap();
        let envs = Environments::new(root.path(), Arc::new(FakeProvider::default()));
        let mut prepared = Vec::new();
        for (name, age_hours) in [
            ("old", 48),
            ("older-lru", 3),
            ("newer-lru", 2),
            ("fresh", 0),
        ] {
            let env = envs
                .prepare(&python(), &reqs(&[name]), &|_| {})
                .await
                .unwrap();
            let site = env.site_dir.clone().unwrap();
            std::fs::write(site.join("payload.bin"), vec![0u8; 1000]).unwrap();
            let manifest = site.parent().unwrap().join(MANIFEST);
            let used = SystemTime::now() - Duration::from_secs(age_hours * 3600);
            File::options()
                .append(true)
                .open(manifest)
                .unwrap()
                .set_modified(used)
                .unwrap();
            prepared.push(env);
        }
        // 24 h max age removes `old`; a 3.5 kB budget keeps the two most recently used (~1.4 kB each).
        let report = gc(root.path(), Duration::from_secs(24 * 3600), 3_500).unwrap();
        let keys = |names: &[usize]| -> Vec<String> {
            let mut keys: Vec<String> = names.iter().map(|i| prepared[*i].key.clone()).collect();
            keys.sort();
            keys
        };
        let mut removed = report.removed.clone();
        removed.sort();
        assert_eq!(removed, keys(&[0, 1]));
        assert_eq!(report.kept, 2);
        assert!(report.freed_bytes >= 2_000, "{report:?}");
        assert!(envs.lookup(&python(), &reqs(&["fresh"])).is_some());
        assert!(envs.lookup(&python(), &reqs(&["old"])).is_none());
    }
}
