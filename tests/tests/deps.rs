//! Dependencies end to end through `RunPython`: detected imports, PEP 723, explicit pins, failures, both
//! installers, and reuse of a prepared environment. Installs real packages from PyPI.

#![allow(clippy::unwrap_used)] // a test fails loudly where it unwraps; helpers outside #[test] too

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use runpython_core::{
    DepsProgress, EnvProvider, Event, PipProvider, RunPython, RunRequest, Status, UvProvider,
};
use runpython_deps::{BoxFuture, InstallJob};
use serde_json::json;

/// Counts installer invocations, delegating to a real provider.
#[derive(Debug)]
struct Counting {
    inner: Arc<dyn EnvProvider>,
    installs: Arc<AtomicUsize>,
}

impl EnvProvider for Counting {
    fn kind(&self) -> &str {
        self.inner.kind()
    }
    fn install<'a>(
        &'a self,
        job: InstallJob<'a>,
    ) -> BoxFuture<'a, Result<(), runpython_deps::Error>> {
        self.installs.fetch_add(1, Ordering::SeqCst);
        self.inner.install(job)
    }
}

fn uv() -> Option<Arc<dyn EnvProvider>> {
    match UvProvider::find() {
        Some(uv) => Some(Arc::new(uv)),
        None if std::env::var_os("CI").is_some() => {
            panic!("uv not found ($RUNPYTHON_TOOLS_BIN or PATH); CI requires it")
        }
        None => {
            println!("skipped: uv not found in $RUNPYTHON_TOOLS_BIN or on PATH");
            None
        }
    }
}

fn engine(provider: Arc<dyn EnvProvider>, root: &std::path::Path) -> (RunPython, Arc<AtomicUsize>) {
    let installs = Arc::new(AtomicUsize::new(0));
    let python = RunPython::builder()
        .env_root(root)
        .env_provider(Arc::new(Counting {
            inner: provider,
            installs: Arc::clone(&installs),
        }))
        .build()
        .unwrap();
    (python, installs)
}

#[tokio::test(flavor = "multi_thread")]
async fn detected_and_mapped_imports_are_installed_once_then_reused() {
    let Some(uv) = uv() else { return };
    let root = tempfile::tempdir().unwrap();
    let (python, installs) = engine(uv, root.path());
    let code = "import tabulate, yaml\n[tabulate.tabulate([[1]]), yaml.safe_load('a: 1')]";
    let first = python.run(code).await.unwrap();
    assert_eq!(first.status, Status::Success, "{:?}", first.error);
    assert_eq!(first.return_value, json!(["-\n1\n-", {"a": 1}]));
    assert_eq!(installs.load(Ordering::SeqCst), 1);
    let second = python.run(code).await.unwrap();
    assert_eq!(second.return_value, first.return_value);
    assert_eq!(
        installs.load(Ordering::SeqCst),
        1,
        "no installer ran the second time"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pinned_spec_is_not_shadowed_by_the_detected_import() {
    let Some(uv) = uv() else { return };
    let root = tempfile::tempdir().unwrap();
    let (python, _) = engine(uv, root.path());
    let e = python
        .run(RunRequest::new("import six\nsix.__version__").dependency("six==1.15.0"))
        .await
        .unwrap();
    assert_eq!(e.return_value, json!("1.15.0"), "{:?}", e.error);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pep_723_block_is_honoured_and_progress_is_reported() {
    let Some(uv) = uv() else { return };
    let root = tempfile::tempdir().unwrap();
    let (python, _) = engine(uv, root.path());
    let code = "# /// script\n# dependencies = [\"tabulate==0.9.0\"]\n# ///\nimport importlib.metadata as m\nm.version('tabulate')";
    let mut handle = python.start(code);
    let mut steps = Vec::new();
    while let Some(event) = handle.next_event().await {
        if let Event::Dependencies(step) = event {
            steps.push(step);
        }
    }
    let e = handle.wait().await.unwrap();
    assert_eq!(e.return_value, json!("0.9.0"), "{:?}", e.error);
    assert!(
        steps
            .iter()
            .any(|s| matches!(s, DepsProgress::Resolving { .. })),
        "{steps:?}"
    );
    assert!(
        steps.iter().any(|s| matches!(s, DepsProgress::Done { .. })),
        "{steps:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_package_that_does_not_exist_is_a_dependency_error_naming_it() {
    let Some(uv) = uv() else { return };
    let root = tempfile::tempdir().unwrap();
    let (python, _) = engine(uv, root.path());
    let e = python
        .run("import runpython_no_such_package_xyz")
        .await
        .unwrap();
    assert_eq!(e.status, Status::Error);
    let err = e.error.unwrap();
    assert_eq!(err.kind, "DependencyError");
    assert!(
        err.message.contains("runpython-no-such-package-xyz"),
        "{}",
        err.message
    );
    assert!(
        err.message.contains("not found") || err.message.contains("No solution"),
        "installer output is included: {}",
        err.message
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_venv_and_pip_fallback_installs_too() {
    let root = tempfile::tempdir().unwrap();
    let (python, installs) = engine(Arc::new(PipProvider), root.path());
    let e = python
        .run(RunRequest::new("import six\nsix.__version__").dependency("six==1.16.0"))
        .await
        .unwrap();
    assert_eq!(e.return_value, json!("1.16.0"), "{:?}", e.error);
    python
        .run(RunRequest::new("import six\nsix.__version__").dependency("six==1.16.0"))
        .await
        .unwrap();
    assert_eq!(installs.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn without_auto_deps_an_import_is_an_ordinary_module_not_found() {
    let root = tempfile::tempdir().unwrap();
    let python = RunPython::builder()
        .env_root(root.path())
        .auto_deps(false)
        .build()
        .unwrap();
    let e = python.run("import tabulate").await.unwrap();
    assert_eq!(e.error.unwrap().kind, "ModuleNotFoundError");
}

#[tokio::test(flavor = "multi_thread")]
async fn conflicting_explicit_specs_are_a_dependency_error_naming_both() {
    let root = tempfile::tempdir().unwrap();
    let python = RunPython::builder()
        .env_root(root.path())
        .dependency("six==1.15.0")
        .build()
        .unwrap();
    let e = python
        .run(RunRequest::new("1").dependency("six==1.16.0"))
        .await
        .unwrap();
    let err = e.error.unwrap();
    assert_eq!(err.kind, "DependencyError");
    assert!(
        err.message.contains("1.15.0") && err.message.contains("1.16.0"),
        "{}",
        err.message
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn stdlib_only_code_prepares_nothing() {
    let root = tempfile::tempdir().unwrap();
    let installs = Arc::new(AtomicUsize::new(0));
    let python = RunPython::builder()
        .env_root(root.path())
        .env_provider(Arc::new(Counting {
            inner: Arc::new(PipProvider),
            installs: Arc::clone(&installs),
        }))
        .build()
        .unwrap();
    let e = python
        .run("import json, os, asyncio, collections.abc\nlen(os.sep)")
        .await
        .unwrap();
    assert_eq!(e.return_value, json!(1));
    assert_eq!(installs.load(Ordering::SeqCst), 0);
}
