//! Real installs from PyPI with both providers. Needs the network (package registries).
//!
//! uv comes from `$RUNPYTHON_TOOLS_BIN` (set by `cargo xtask ci`) or `PATH`. Without it, uv tests print
//! "skipped: …" and pass, except under `CI`, where they fail.

use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use runpython_deps::{
    detect_imports_async, merge_requirements, BoxFuture, DependencySources, EnvProvider,
    Environments, Error, InstallJob, Interpreter, PipProvider, PreparedEnv, Progress, Requirement,
    UvProvider,
};

fn uv() -> Option<Arc<dyn EnvProvider>> {
    let tools = std::env::var_os("RUNPYTHON_TOOLS_BIN").map(std::path::PathBuf::from);
    let path = std::env::var_os("PATH").unwrap_or_default();
    let found = tools
        .into_iter()
        .chain(std::env::split_paths(&path))
        .map(|dir| dir.join("uv"))
        .find(|candidate| candidate.is_file());
    match found {
        Some(uv) => Some(Arc::new(UvProvider::new(uv))),
        None if std::env::var_os("CI").is_some() => {
            panic!("uv not found in $RUNPYTHON_TOOLS_BIN or on PATH, and CI requires it")
        }
        None => {
            eprintln!("skipped: uv not found in $RUNPYTHON_TOOLS_BIN or on PATH");
            None
        }
    }
}

fn python() -> Interpreter {
    Interpreter::discover(None).expect("this machine has Python 3")
}

/// Merges like the core does: explicit specs, the code's PEP 723 block, its detected imports.
async fn requirements(code: &str, explicit: &[&str], python: &Interpreter) -> Vec<Requirement> {
    let detected = detect_imports_async(code).await.expect("detection works");
    let explicit: Vec<String> = explicit.iter().map(|s| (*s).to_owned()).collect();
    merge_requirements(&DependencySources {
        defaults: &[],
        explicit: &explicit,
        script: Some(code),
        detected: &detected,
        local_modules: &[],
        python_version: python.version,
    })
    .expect("the requirements merge")
}

/// Runs `code` the way the sandbox will: `-I -S`, then `site.addsitedir(site_dir)`.
fn run_in(env: &PreparedEnv, code: &str) -> String {
    let site = env.site_dir.as_deref().unwrap_or(Path::new(""));
    let prologue = format!(
        "import site; site.addsitedir({:?})\n",
        site.display().to_string()
    );
    let out = Command::new(&env.interpreter)
        .args(["-I", "-S", "-c", &format!("{prologue}{code}")])
        .output()
        .expect("the interpreter starts");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// Counts installs, to prove a prepared environment is reused without running an installer.
#[derive(Debug)]
struct Counting {
    inner: Arc<dyn EnvProvider>,
    installs: AtomicUsize,
}

impl EnvProvider for Counting {
    fn kind(&self) -> &str {
        self.inner.kind()
    }

    fn install<'a>(&'a self, job: InstallJob<'a>) -> BoxFuture<'a, Result<(), Error>> {
        self.installs.fetch_add(1, Ordering::SeqCst);
        self.inner.install(job)
    }
}

#[tokio::test]
async fn uv_installs_explicit_detected_and_script_dependencies_and_reuses_the_env() {
    let Some(uv) = uv() else { return };
    let root = tempfile::tempdir().unwrap();
    let counting = Arc::new(Counting {
        inner: uv,
        installs: AtomicUsize::new(0),
    });
    let envs = Environments::new(root.path(), counting.clone());
    let python = python();
    let code = "# /// script\n# dependencies = [\"tabulate==0.9.0\"]\n# ///\nimport yaml\nimport six\nfrom tabulate import tabulate\n";
    let wanted = requirements(code, &["six==1.15.0"], &python).await;
    let specs: Vec<String> = wanted.iter().map(ToString::to_string).collect();
    assert_eq!(specs, ["pyyaml", "six==1.15.0", "tabulate==0.9.0"]);

    let events = Mutex::new(Vec::new());
    let record = |p: Progress| events.lock().unwrap().push(p);
    let env = envs.prepare(&python, &wanted, &record).await.unwrap();
    let versions = run_in(
        &env,
        "import yaml, six, tabulate; print(six.__version__, tabulate.__version__, yaml.__file__)",
    );
    let site = env.site_dir.clone().unwrap();
    assert!(
        versions.starts_with("1.15.0 0.9.0 ") && versions.contains(&*site.to_string_lossy()),
        "{versions}"
    );
    let events = events.into_inner().unwrap();
    assert!(
        matches!(events.first(), Some(Progress::Resolving { .. })),
        "{events:?}"
    );
    assert!(
        matches!(events.last(), Some(Progress::Done { .. })),
        "{events:?}"
    );
    assert!(
        events
            .iter()
            .any(|e| matches!(e, Progress::Installing { .. })),
        "{events:?}"
    );

    // The second time: same key, no installer, answered at once.
    let started = Instant::now();
    let again = envs.prepare(&python, &wanted, &|_| {}).await.unwrap();
    assert_eq!(
        again,
        PreparedEnv {
            installed_now: false,
            ..env
        }
    );
    assert_eq!(counting.installs.load(Ordering::SeqCst), 1);
    assert!(started.elapsed() < Duration::from_secs(1));
}

#[tokio::test]
async fn pip_fallback_installs_into_a_site_dir_and_keeps_nothing_else_on_the_host() {
    let root = tempfile::tempdir().unwrap();
    let envs = Environments::new(root.path(), Arc::new(PipProvider));
    let python = python();
    let env = envs
        .prepare(
            &python,
            &requirements("import tabulate\n", &[], &python).await,
            &|_| {},
        )
        .await
        .unwrap();
    assert_eq!(env.specs, ["tabulate"]);
    assert!(run_in(&env, "import tabulate; print(tabulate.__file__)")
        .contains(&*env.site_dir.clone().unwrap().to_string_lossy()));
    // pip ran inside its sandbox: its cache went with its scratch, and no tools venv was made.
    let mut left: Vec<String> = std::fs::read_dir(root.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    left.sort();
    assert_eq!(left, ["building", "envs", "locks"]);

    let err = envs
        .prepare(
            &python,
            &[Requirement::parse("runpython-no-such-package-xyz").unwrap()],
            &|_| {},
        )
        .await
        .unwrap_err();
    let Error::Install {
        packages,
        program,
        output,
        ..
    } = &err
    else {
        panic!("expected an install error, got {err}");
    };
    assert_eq!(packages, &["runpython-no-such-package-xyz"]);
    assert!(program.contains("python"), "{program}");
    assert!(output.contains("runpython-no-such-package-xyz"), "{output}");
}

#[tokio::test]
async fn a_package_that_does_not_exist_is_an_install_error_with_the_installers_words() {
    let Some(uv) = uv() else { return };
    let root = tempfile::tempdir().unwrap();
    let envs = Environments::new(root.path(), uv);
    let wanted = [Requirement::parse("runpython-no-such-package-xyz").unwrap()];
    let err = envs.prepare(&python(), &wanted, &|_| {}).await.unwrap_err();
    let Error::Install {
        packages,
        program,
        status,
        output,
    } = &err
    else {
        panic!("expected an install error, got {err}");
    };
    assert_eq!(packages, &["runpython-no-such-package-xyz"]);
    assert!(program.ends_with("uv"), "{program}");
    assert!(status.contains("exit status"), "{status}");
    assert!(output.contains("runpython-no-such-package-xyz"), "{output}");
    assert!(output.lines().count() <= 20, "{output}");
    let text = err.to_string();
    eprintln!("{text}");
    assert!(
        text.contains("runpython-no-such-package-xyz") && text.contains("PyPI"),
        "{text}"
    );
    // Nothing half-built is left to be mistaken for an environment.
    assert!(
        !root.path().join("envs").exists()
            || std::fs::read_dir(root.path().join("envs"))
                .unwrap()
                .next()
                .is_none()
    );
}

#[tokio::test]
async fn an_install_past_the_timeout_is_killed_and_reported() {
    let Some(uv) = uv() else { return };
    let root = tempfile::tempdir().unwrap();
    let envs = Environments::new(root.path(), uv).with_timeout(Duration::from_millis(30));
    let wanted = [Requirement::parse("tabulate").unwrap()];
    let started = Instant::now();
    let err = envs.prepare(&python(), &wanted, &|_| {}).await.unwrap_err();
    assert!(matches!(err, Error::InstallTimeout { .. }), "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    assert!(std::fs::read_dir(root.path().join("building"))
        .unwrap()
        .next()
        .is_none());
}
