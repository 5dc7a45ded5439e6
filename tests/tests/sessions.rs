//! Sessions: state kept across calls, as isolated as a run, bounded, and durable across hosts.

#![allow(clippy::unwrap_used)] // a test fails loudly where it unwraps

use std::time::Duration;

use runpython_core::{RunPython, SessionConfig, Status};
use serde_json::json;

fn builder() -> runpython_core::RunPythonBuilder {
    RunPython::builder().timeout(Duration::from_secs(30))
}

#[tokio::test(flavor = "multi_thread")]
async fn variables_imports_functions_and_classes_persist_across_cells() {
    let python = builder().build().unwrap();
    let s = python.session();
    let e = s
        .run(
            "import json\nx = 41\ndef f(v):\n    return v + 1\nclass C:\n    k = 'c'\nprint('one')",
        )
        .await
        .unwrap();
    assert_eq!(e.status, Status::Success, "{:?}", e.error);
    assert_eq!((e.stdout.as_str(), e.cell), ("one\n", Some(1)));
    assert_eq!(e.session_id.as_deref(), Some(s.id()));
    let e = s
        .run("print('two')\n[f(x), C.k, json.dumps(1)]")
        .await
        .unwrap();
    assert_eq!(e.return_value, json!([42, "c", "1"]), "{:?}", e.error);
    assert_eq!((e.stdout.as_str(), e.cell), ("two\n", Some(2)));
}

#[tokio::test(flavor = "multi_thread")]
async fn state_survives_an_exception_and_top_level_await_works_across_cells() {
    let python = builder().build().unwrap();
    let s = python.session();
    let e = s
        .run("import asyncio\ndata = [1, 2]\nraise ValueError('boom')")
        .await
        .unwrap();
    assert_eq!(e.error.unwrap().kind, "ValueError");
    let e = s
        .run("async def twice(v):\n    await asyncio.sleep(0)\n    return v * 2\ntask = asyncio.ensure_future(twice(21))\nawait asyncio.sleep(0)\nlen(data)")
        .await
        .unwrap();
    assert_eq!(e.return_value, json!(2), "{:?}", e.error);
    let e = s.run("await task").await.unwrap();
    assert_eq!(e.return_value, json!(42), "{:?}", e.error);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_interrupted_cell_keeps_the_state() {
    // As a host started in the background (`cmd &` in a script) is: SIGINT ignored, which its
    // children inherit across exec.
    // SAFETY: sets one signal's disposition in this test process.
    unsafe {
        nix::sys::signal::signal(
            nix::sys::signal::SIGINT,
            nix::sys::signal::SigHandler::SigIgn,
        )
    }
    .unwrap();
    let python = builder().build().unwrap();
    let s = python.session();
    s.run("x = 'kept'").await.unwrap();
    let e = s
        .run(
            runpython_core::RunRequest::new("import time\ntime.sleep(60)")
                .timeout(Duration::from_secs(1)),
        )
        .await
        .unwrap();
    assert_eq!(e.status, Status::Timeout);
    let message = e.error.unwrap().message;
    assert!(message.contains("keeps its state"), "{message}");
    let e = s.run("x").await.unwrap();
    assert_eq!(e.return_value, json!("kept"), "{:?}", e.error);
    assert!(!e.restored);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_killed_session_reports_the_loss_and_the_next_call_reports_it_again() {
    let python = builder().build().unwrap();
    let s = python.session();
    s.run("x = 1").await.unwrap();
    let code = "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True:\n    pass";
    let e = s
        .run(runpython_core::RunRequest::new(code).timeout(Duration::from_secs(1)))
        .await
        .unwrap();
    assert_eq!(e.status, Status::Timeout);
    let message = e.error.unwrap().message;
    assert!(message.contains("state is lost"), "{message}");
    let e = s.run("x").await.unwrap();
    assert_eq!(e.error.as_ref().unwrap().kind, "SessionLost", "{:?}", e);
    // Reported: the call after starts the session again, empty.
    let e = s.run("'x' in globals()").await.unwrap();
    assert_eq!(e.return_value, json!(false), "{:?}", e.error);
}

#[tokio::test(flavor = "multi_thread")]
async fn two_sessions_never_see_each_other() {
    let python = builder().build().unwrap();
    let (a, b) = (python.session(), python.session());
    a.run("secret = 'a-only'\nopen('mine.txt', 'w').write('a')\nopen('/tmp/mine', 'w').write('a')")
        .await
        .unwrap();
    let e = b
        .run("import os\n['secret' in globals(), os.path.exists('mine.txt'), os.path.exists('/tmp/mine'), os.getpid()]")
        .await
        .unwrap();
    assert_eq!(
        e.return_value.as_array().unwrap()[..3],
        [json!(false), json!(false), json!(false)],
        "{:?}",
        e.error
    );
    let a_pid = a.run("import os\nos.getpid()").await.unwrap().return_value;
    // Each session is PID 1's child in its own PID namespace: neither can signal the other.
    let e = b
        .run(format!("import os\ntry:\n    os.kill({}, 0)\n    'reached'\nexcept OSError as e:\n    type(e).__name__", 100_000 + a_pid.as_u64().unwrap()))
        .await
        .unwrap();
    assert_ne!(e.return_value, json!("reached"));
}

#[tokio::test(flavor = "multi_thread")]
async fn idle_sessions_expire_and_say_so() {
    let python = builder()
        .sessions(SessionConfig {
            idle: Duration::from_millis(500),
            ..SessionConfig::default()
        })
        .build()
        .unwrap();
    let s = python.session();
    s.run("x = 1").await.unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let e = s.run("x").await.unwrap();
    let error = e.error.unwrap();
    assert_eq!(error.kind, "SessionLost");
    assert!(error.message.contains("expired"), "{}", error.message);
}

#[tokio::test(flavor = "multi_thread")]
async fn the_least_recently_used_session_is_evicted_past_the_cap() {
    let python = builder()
        .sessions(SessionConfig {
            max_live: 1,
            ..SessionConfig::default()
        })
        .build()
        .unwrap();
    let (a, b) = (python.session(), python.session());
    a.run("x = 'a'").await.unwrap();
    b.run("x = 'b'").await.unwrap();
    let e = a.run("x").await.unwrap();
    let error = e.error.unwrap();
    assert_eq!(error.kind, "SessionLost");
    assert!(error.message.contains("evicted"), "{}", error.message);
    assert_eq!(b.run("x").await.unwrap().return_value, json!("b"));
}

#[tokio::test(flavor = "multi_thread")]
async fn tool_budgets_count_per_cell() {
    let python = builder()
        .max_tool_calls(3)
        .tool(runpython_core::tool_fn("ping", "Ping.", None, |_| async {
            Ok(json!("pong"))
        }))
        .build()
        .unwrap();
    let s = python.session();
    for _ in 0..3 {
        let e = s.run("[ping() for _ in range(3)]").await.unwrap();
        assert_eq!(e.status, Status::Success, "{:?}", e.error);
    }
    let e = s.run("[ping() for _ in range(4)]").await.unwrap();
    assert_eq!(e.error.unwrap().kind, "ToolCallLimit");
}

/// A tool that counts its calls in a file, so a test sees side effects fire (or not) across engines.
fn counter(path: std::path::PathBuf) -> impl runpython_core::Tool {
    runpython_core::tool_fn(
        "charge",
        "Charge once per call.",
        Some(
            json!({"type": "object", "properties": {"amount": {"type": "integer"}}, "required": ["amount"]}),
        ),
        move |args| {
            let path = path.clone();
            async move {
                let n = std::fs::read_to_string(&path)
                    .ok()
                    .and_then(|s| s.trim().parse::<u64>().ok())
                    .unwrap_or(0)
                    + 1;
                std::fs::write(&path, n.to_string()).unwrap();
                Ok(json!({"charged": args.get("amount").cloned(), "receipt": n}))
            }
        },
    )
}

/// The same session restored on a second engine sharing `url`: same state back, no tool fired twice,
/// and a replay that calls differently reported, never accepted.
async fn restores_on_a_second_engine(url: &str) {
    let dir = tempfile::tempdir().unwrap();
    let calls = dir.path().join("calls");
    // `snapshots`: whether sessions are snapshotted (a restore from a snapshot replays no cell).
    let engine_with = |calls: std::path::PathBuf, snapshots: bool| {
        let b = builder()
            .store(runpython_core::Store::open(url).unwrap())
            .tool(counter(calls));
        let b = if snapshots {
            b
        } else {
            b.session_snapshot_max(0)
        };
        b.build().unwrap()
    };
    let engine = |calls: std::path::PathBuf| engine_with(calls, true);
    let first = engine(calls.clone());
    let s = first.session();
    let id = s.id().to_owned();
    let e = s
        .run("x = 41\nreceipt = charge(amount=5)['receipt']")
        .await
        .unwrap();
    assert_eq!(e.status, Status::Success, "{:?}", e.error);
    // A large once() value (over the journal's inline threshold) is kept beside the record.
    s.run("import random\nfactor = once(lambda: random.randint(2, 10**9))\nblob = once(lambda: str(factor) * 5_000)")
        .await
        .unwrap();
    let factor = s.run("factor").await.unwrap().return_value;
    drop(s);
    drop(first); // the first host is gone: its interpreter with it

    let second = engine(calls.clone());
    let s = second.session_with_id(&id).unwrap();
    let e = s
        .run("[x + 1, receipt, factor, blob == str(factor) * 5_000]")
        .await
        .unwrap();
    assert_eq!(e.status, Status::Success, "{:?}", e.error);
    assert!(e.restored, "the session was not restored");
    assert_eq!(e.return_value, json!([42, 1, factor, true]));
    assert_eq!(
        std::fs::read_to_string(&calls).unwrap(),
        "1",
        "a tool fired twice"
    );
    assert_eq!(e.cell, Some(4));

    // A session whose replay calls differently (the code reads a clock, not once()) is reported
    // (with no snapshot: one would be loaded instead of replaying the cell).
    let second = engine_with(calls.clone(), false);
    let s = second.session();
    let id = s.id().to_owned();
    s.run("import time\nstamp = charge(amount=int(time.time() * 1000000))")
        .await
        .unwrap();
    drop(s);
    let third = engine_with(calls.clone(), false);
    let e = third
        .session_with_id(&id)
        .unwrap()
        .run("stamp")
        .await
        .unwrap();
    assert_eq!(e.status, Status::Error);
    assert_eq!(e.error.unwrap().kind, "ReplayDiverged");
    assert_eq!(std::fs::read_to_string(&calls).unwrap(), "2");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_session_is_restored_on_a_second_engine_sharing_a_file_store() {
    let dir = tempfile::tempdir().unwrap();
    restores_on_a_second_engine(&format!("file://{}", dir.path().display())).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_session_is_restored_on_a_second_engine_sharing_an_s3_store() {
    let moto = match runpython_tests::Moto::start() {
        Ok(Some(m)) => m,
        Ok(None) => return,
        Err(e) => panic!("{e}"),
    };
    moto.create_bucket("runpython-sessions").unwrap();
    restores_on_a_second_engine(&moto.url("runpython-sessions", "s")).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_approval_inside_a_cell_suspends_and_resumes_with_the_state() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("file://{}", dir.path().display());
    let python = builder()
        .store(runpython_core::Store::open(&url).unwrap())
        .approval("ask")
        .build()
        .unwrap();
    let s = python.session();
    s.run("total = 10").await.unwrap();
    let e = s
        .run("ok = ask(amount=total)\ntotal = total * 2 if ok else 0\ntotal")
        .await
        .unwrap();
    assert_eq!(e.status, Status::Suspended, "{:?}", e.error);
    let suspension = e.suspension.clone().unwrap();
    let id = suspension["id"].as_str().unwrap().to_owned();
    let resumed = python
        .resume(
            &e.run_id,
            std::collections::HashMap::from([(id, json!(true))]),
        )
        .await
        .unwrap();
    assert_eq!(resumed.return_value, json!(20), "{:?}", resumed.error);
    assert_eq!(s.run("total + 1").await.unwrap().return_value, json!(21));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_dependency_added_mid_session_is_importable_in_the_live_session() {
    let Ok(tools) = std::env::var("RUNPYTHON_TOOLS_BIN") else {
        eprintln!("skipped: RUNPYTHON_TOOLS_BIN is not set (uv is needed to install)");
        return;
    };
    let uv = std::path::Path::new(&tools).join("uv");
    let envs = tempfile::tempdir().unwrap();
    let python = builder()
        .env_root(envs.path())
        .env_provider(std::sync::Arc::new(runpython_core::UvProvider::new(uv)))
        .build()
        .unwrap();
    let s = python.session();
    s.run("state = 'kept'").await.unwrap();
    let e = s.run("import six\n[six.__name__, state]").await.unwrap();
    assert_eq!(e.return_value, json!(["six", "kept"]), "{:?}", e.error);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_cells_environment_is_its_own_and_its_cut_output_is_kept_whole_and_masked() {
    let dir = tempfile::tempdir().unwrap();
    let store = runpython_core::Store::open(&format!("file://{}", dir.path().display())).unwrap();
    let python = builder()
        .store(store)
        .max_output_chars(100)
        .build()
        .unwrap();
    let s = python.session();
    let code = "import os\nprint('x' * 5000)\nprint('middle', os.environ['DB_SECRET'])";
    let e = s
        .run(runpython_core::RunRequest::new(code).env("DB_SECRET", "hunter2-hunter2"))
        .await
        .unwrap();
    assert_eq!(e.status, Status::Success, "{:?}", e.error);
    assert!(
        e.stdout.ends_with("middle hunter2-hunter2\n"),
        "the caller sees its own value"
    );
    let cut = e.truncated.as_ref().unwrap().stdout.as_ref().unwrap();
    let whole = python
        .get_run_artifact(cut.artifact.as_ref().unwrap())
        .await
        .unwrap();
    let whole = String::from_utf8(whole).unwrap();
    assert!(whole.starts_with(&"x".repeat(5000)), "kept whole");
    assert!(whole.ends_with("middle [REDACTED:DB_SECRET]\n"), "masked");

    // The variable was that cell's only; a value the code kept is masked in later cells' output too.
    let e2 = s
        .run(
            "import os\nsecret = 'hunter2-hunter2'\nprint('x' * 5000)\nprint(os.environ.get('DB_SECRET'), secret)",
        )
        .await
        .unwrap();
    assert_eq!(e2.status, Status::Success, "{:?}", e2.error);
    assert!(
        e2.stdout.ends_with("None hunter2-hunter2\n"),
        "{}",
        e2.stdout
    );
    let cut = e2.truncated.as_ref().unwrap().stdout.as_ref().unwrap();
    let whole = python
        .get_run_artifact(cut.artifact.as_ref().unwrap())
        .await
        .unwrap();
    let whole = String::from_utf8(whole).unwrap();
    assert!(
        whole.ends_with("None [REDACTED:DB_SECRET]\n"),
        "a later cell's kept output is masked: {}",
        &whole[whole.len() - 60..]
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_cell_whose_environment_cannot_be_set_is_refused_and_the_session_keeps_its_state() {
    let python = builder().build().unwrap();
    let s = python.session();
    s.run("x = 'kept'").await.unwrap();
    for (name, value) in [("A=B", "v"), ("", "v"), ("OK", "nul\0inside")] {
        let refused = s
            .run(runpython_core::RunRequest::new("1").env(name, value))
            .await;
        assert!(
            matches!(refused, Err(runpython_core::Error::InvalidInput(_))),
            "{name:?}={value:?}: {refused:?}"
        );
    }
    let e = s.run("x").await.unwrap();
    assert_eq!(e.return_value, json!("kept"), "{:?}", e.error);
    assert_eq!(e.cell, Some(2), "a refused cell is not a cell");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_longest_session_id_allowed_is_kept_and_restored_in_a_file_store() {
    // Ids are hex-encoded into store keys; 128 characters become 256, over a file name's limit.
    let dir = tempfile::tempdir().unwrap();
    let url = format!("file://{}", dir.path().display());
    let engine = || {
        builder()
            .store(runpython_core::Store::open(&url).unwrap())
            .build()
            .unwrap()
    };
    let id = format!("client:{}", "x".repeat(121));
    assert_eq!(id.len(), 128);
    let first = engine();
    let e = first
        .session_with_id(&id)
        .unwrap()
        .run("x = 41")
        .await
        .unwrap();
    assert_eq!(e.status, Status::Success, "{:?}", e.error);
    assert!(e.kept, "the cell was not kept: {:?}", e.store_error);
    drop(first);
    let e = engine()
        .session_with_id(&id)
        .unwrap()
        .run("x + 1")
        .await
        .unwrap();
    assert!(e.restored && e.return_value == json!(42), "{e:?}");
}

/// A session outlives the thread that started it: its interpreter is not tied to a thread of the
/// runtime's blocking pool, which ends idle threads (the pool's keep-alive is made short here, so a
/// session idle past it would have been killed by its parent-death signal).
#[test]
fn a_session_idle_past_the_blocking_pools_keep_alive_is_still_there() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_keep_alive(Duration::from_millis(100))
        .build()
        .unwrap();
    runtime.block_on(async {
        let python = builder().build().unwrap();
        let session = python.session();
        let first = session.run("x = 41").await.unwrap();
        assert_eq!(first.status, Status::Success, "{:?}", first.error);
        // Past the keep-alive, with blocking work meanwhile so the pool's threads come and go.
        for _ in 0..3 {
            tokio::task::spawn_blocking(|| std::thread::sleep(Duration::from_millis(10)))
                .await
                .unwrap();
            tokio::time::sleep(Duration::from_millis(400)).await;
        }
        let second = session.run("x + 1").await.unwrap();
        assert_eq!(second.status, Status::Success, "{:?}", second.error);
        assert_eq!(second.return_value, json!(42));
    });
}
