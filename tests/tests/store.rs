//! Runs kept in a store and memoized, through the public library API.

#![allow(clippy::unwrap_used)] // a test fails loudly where it unwraps; helpers outside #[test] too

use std::time::Duration;

use runpython_core::{tool_fn, ArtifactKind, RunPython, RunRequest, Status, Store, Tier};
use serde_json::json;

fn file_store() -> (tempfile::TempDir, Store) {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&format!("file://{}", dir.path().display())).unwrap();
    (dir, store)
}

/// Code whose value differs on every real execution, so a repeated value proves nothing ran.
const FRESH: &str = "import time\ntime.time_ns()";

#[tokio::test(flavor = "multi_thread")]
async fn a_kept_run_lists_its_script_output_value_and_files() {
    let (_dir, store) = file_store();
    let python = RunPython::builder().store(store.clone()).build().unwrap();
    let e = python
        .run("with open('report.bin', 'wb') as f:\n    f.write(bytes(range(256)) * 4)\nprint('done')\n{'n': 1}")
        .await
        .unwrap();
    assert_eq!(e.status, Status::Success);
    // The envelope lists only what it does not carry itself: the file. The script, the output and
    // the inline value are kept too, and the run's manifest lists them all.
    let listed: Vec<_> = e
        .artifacts
        .iter()
        .map(|a| (a.kind, a.name.as_str()))
        .collect();
    assert_eq!(listed, [(ArtifactKind::File, "report.bin")]);
    let file = &e.artifacts[0];
    let expected: Vec<u8> = (0..4).flat_map(|_| 0u8..=255).collect();
    assert_eq!(
        python.get_run_artifact(&file.id).await.unwrap(),
        expected,
        "byte-identical"
    );
    let manifest = store.get_run(&e.run_id).await.unwrap();
    assert_eq!(
        manifest.run_id, e.run_id,
        "the envelope's run_id names the kept run"
    );
    let kept: Vec<_> = manifest
        .artifacts
        .iter()
        .map(|a| (a.kind, a.name.as_str()))
        .collect();
    assert_eq!(
        kept,
        [
            (ArtifactKind::Script, "script.py"),
            (ArtifactKind::Stdout, "stdout.txt"),
            (ArtifactKind::ReturnValue, "return_value.json"),
            (ArtifactKind::File, "report.bin"),
        ]
    );
    let script = &manifest.artifacts[0];
    assert!(python
        .get_run_artifact(&script.id)
        .await
        .unwrap()
        .starts_with(b"with open('report.bin'"));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_timed_out_run_is_kept_with_its_partial_output() {
    let (_dir, store) = file_store();
    let python = RunPython::builder()
        .store(store.clone())
        .timeout(Duration::from_millis(800))
        .build()
        .unwrap();
    let e = python
        .run("print('partial', flush=True)\nimport time\ntime.sleep(30)")
        .await
        .unwrap();
    assert_eq!(e.status, Status::Timeout);
    let manifest = store.get_run(&e.run_id).await.unwrap();
    let stdout = manifest
        .artifacts
        .iter()
        .find(|a| a.kind == ArtifactKind::Stdout)
        .unwrap();
    assert_eq!(
        store.get_run_artifact(&stdout.id).await.unwrap().as_ref(),
        b"partial\n"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn passed_through_secrets_are_masked_before_anything_is_persisted() {
    // SAFETY of set_var: only this test reads or writes this name.
    std::env::set_var("RUNPYTHON_T_PASSED_TOKEN", "tok-1234567890");
    let (_dir, store) = file_store();
    let python = RunPython::builder()
        .store(store.clone())
        .env_passthrough("RUNPYTHON_T_PASSED_TOKEN")
        .build()
        .unwrap();
    let e = python
        .run("import os\nt = os.environ['RUNPYTHON_T_PASSED_TOKEN']\nprint('token', t)\n{'t': t}")
        .await
        .unwrap();
    assert_eq!(
        e.stdout, "token tok-1234567890\n",
        "the live envelope is the code's own output"
    );
    let manifest = store.get_run(&e.run_id).await.unwrap();
    for kind in [ArtifactKind::Stdout, ArtifactKind::ReturnValue] {
        let a = manifest.artifacts.iter().find(|a| a.kind == kind).unwrap();
        let kept =
            String::from_utf8(store.get_run_artifact(&a.id).await.unwrap().to_vec()).unwrap();
        assert!(
            !kept.contains("tok-1234567890"),
            "{kind:?} kept the secret: {kept}"
        );
        assert!(
            kept.contains("[REDACTED:RUNPYTHON_T_PASSED_TOKEN]"),
            "{kept}"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn memoized_run_is_served_without_running_again() {
    let python = RunPython::builder()
        .memoize(Duration::from_secs(60))
        .build()
        .unwrap();
    let first = python.run(FRESH).await.unwrap();
    let second = python.run(FRESH).await.unwrap();
    assert!(!first.cached && second.cached);
    assert_eq!(
        first.return_value, second.return_value,
        "the code did not run again"
    );
    assert_eq!(
        first.run_id, second.run_id,
        "the hit names the run that computed it"
    );
    let other = python
        .run(RunRequest::new(FRESH).input("x", json!(1)))
        .await
        .unwrap();
    assert!(!other.cached, "different inputs are a different key");
    let bypass = python.run(RunRequest::new(FRESH).no_memo()).await.unwrap();
    assert!(!bypass.cached);
    assert_ne!(bypass.return_value, first.return_value);
}

#[tokio::test(flavor = "multi_thread")]
async fn memo_survives_a_new_engine_on_the_same_store() {
    let (_dir, store) = file_store();
    let make = || {
        RunPython::builder()
            .store(store.clone())
            .memoize(Duration::from_secs(60))
            .build()
            .unwrap()
    };
    let first = make().run(FRESH).await.unwrap();
    let store_reopened = Store::open(store.url()).unwrap();
    let again = RunPython::builder()
        .store(store_reopened)
        .memoize(Duration::from_secs(60))
        .build()
        .unwrap()
        .run(FRESH)
        .await
        .unwrap();
    assert!(again.cached);
    assert_eq!(again.return_value, first.return_value);
}

#[tokio::test(flavor = "multi_thread")]
async fn failures_and_impure_tool_calls_are_not_memoized_but_pure_ones_are() {
    let python = RunPython::builder()
        .memoize(Duration::from_secs(60))
        .tool(tool_fn("side_effect", "", None, |_| async { Ok(json!(1)) }))
        .tool(
            tool_fn("square", "", None, |a| async move {
                let x = a.arg(0, "x").and_then(|v| v.as_i64()).unwrap_or(0);
                Ok(json!(x * x))
            })
            .pure(),
        )
        .build()
        .unwrap();
    let code = "import time\nraise ValueError(time.time_ns())";
    assert!(!python.run(code).await.unwrap().cached);
    assert!(
        !python.run(code).await.unwrap().cached,
        "errors are not memoized"
    );
    let code = "import time\nside_effect()\ntime.time_ns()";
    python.run(code).await.unwrap();
    assert!(
        !python.run(code).await.unwrap().cached,
        "an impure tool was called"
    );
    let code = "import time\n[square(3), time.time_ns()]";
    let first = python.run(code).await.unwrap();
    let second = python.run(code).await.unwrap();
    assert!(second.cached, "only pure tools were called");
    assert_eq!(first.return_value, second.return_value);
}

#[tokio::test(flavor = "multi_thread")]
async fn concurrent_identical_runs_compute_once() {
    let python = RunPython::builder()
        .memoize(Duration::from_secs(60))
        .build()
        .unwrap();
    let runs = (0..4).map(|_| {
        let python = python.clone();
        tokio::spawn(async move { python.run(FRESH).await.unwrap() })
    });
    let mut envelopes = Vec::new();
    for run in runs {
        envelopes.push(run.await.unwrap());
    }
    let computed = envelopes.iter().filter(|e| !e.cached).count();
    assert_eq!(computed, 1, "exactly one run computed");
    assert!(envelopes
        .iter()
        .all(|e| e.return_value == envelopes[0].return_value));
}

#[tokio::test(flavor = "multi_thread")]
async fn persistent_runs_survive_gc_and_expired_ephemeral_ones_do_not() {
    let (_dir, store) = file_store();
    let kept = RunPython::builder()
        .store(store.clone())
        .tier(Tier::Persistent)
        .build()
        .unwrap();
    let brief = RunPython::builder()
        .store(store.clone())
        .tier(Tier::Ephemeral {
            ttl: Duration::from_millis(1),
        })
        .build()
        .unwrap();
    let a = kept.run("1").await.unwrap();
    let b = brief.run("2").await.unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;
    let report = store.gc(std::time::SystemTime::now()).await.unwrap();
    assert_eq!(report.expired_runs, std::slice::from_ref(&b.run_id));
    assert!(store.get_run(&a.run_id).await.is_ok());
    assert!(store.get_run(&b.run_id).await.is_err());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_store_setting_without_a_store_is_a_configuration_error() {
    let err = RunPython::builder()
        .tier(Tier::Persistent)
        .build()
        .unwrap_err();
    assert!(err.to_string().contains("needs a store"), "{err}");
}

#[tokio::test(flavor = "multi_thread")]
async fn unclosed_files_exit_handlers_and_running_threads_finish_before_the_run_is_kept() {
    let (_dir, store) = file_store();
    let python = RunPython::builder().store(store).build().unwrap();
    let code = "f = open('unclosed.txt', 'w')\nf.write('data' * 1000)\n\
                import atexit\natexit.register(lambda: print('bye'))\n\
                import threading, time\n\
                threading.Thread(target=lambda: (time.sleep(0.3), open('late.txt', 'w').write('late'))).start()\n1";
    let e = python.run(code).await.unwrap();
    assert_eq!(
        e.stdout, "bye\n",
        "exit handlers run, and their output is kept"
    );
    let size = |name: &str| e.artifacts.iter().find(|a| a.name == name).map(|a| a.bytes);
    assert_eq!(
        size("unclosed.txt"),
        Some(4000),
        "a file left open is flushed"
    );
    assert_eq!(
        size("late.txt"),
        Some(4),
        "a non-daemon thread finishes first"
    );
}
