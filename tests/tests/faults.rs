//! Faults as an operator meets them (issue 21): a host killed mid-call, a store that never answers or
//! fails after the code ran, identical runs at once, the messages store failures print.

#![allow(clippy::unwrap_used)] // a test fails loudly where it unwraps; helpers outside #[test] too

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use runpython_core::{
    resumable_runs, tool_fn, CommandTool, Event, PoolConfig, ResumableState, RunPython,
    RunPythonBuilder, Status, Store,
};
use runpython_tests::{processes_with_marker, survivors_after, unique_marker, HungServer};
use serde_json::json;

fn builder() -> RunPythonBuilder {
    RunPython::builder()
        .timeout(Duration::from_secs(60))
        .pool(PoolConfig {
            size: 0,
            ..PoolConfig::default()
        })
}

fn file_store(dir: &std::path::Path) -> (String, Store) {
    let url = format!("file://{}", dir.display());
    let store = Store::open(&url).unwrap();
    (url, store)
}

/// The interpreter behind the `python3` on PATH (a pyenv shim is a script that stays in between).
fn real_python() -> String {
    let out = Command::new("python3")
        .args(["-c", "import sys; print(sys.executable)"])
        .output()
        .unwrap();
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

fn wait_until(what: &str, secs: u64, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !done() {
        assert!(
            Instant::now() < deadline,
            "{what} did not happen in {secs} s"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_host_killed_mid_call_leaves_no_tool_process_and_the_resumed_run_charges_once() {
    let dir = tempfile::tempdir().unwrap();
    let (url, store) = file_store(&dir.path().join("store"));
    let ledger = dir.path().join("ledger");
    let marker = unique_marker("charge");
    // A charge that de-duplicates by the call's idempotency key, then acknowledges slowly from a
    // process of its own (a child of the `sh -c`, as any real command's work would be).
    let script = dir.path().join("charge.sh");
    std::fs::write(
        &script,
        format!(
            r#"cat > /dev/null
if [ -n "$RUNPYTHON_CALL_ID" ] && grep -qxF "$RUNPYTHON_CALL_ID" {ledger} 2>/dev/null; then
  echo '"already charged"'; exit 0
fi
echo "$RUNPYTHON_CALL_ID" >> {ledger}
{python} -c 'import time; time.sleep(60)' {marker}
echo '"charged"'
"#,
            ledger = ledger.display(),
            python = real_python(),
        ),
    )
    .unwrap();
    let tool = format!("charge=sh {}", script.display());
    let mut host = Command::new(env!("CARGO_BIN_EXE_runpython-durable-host"))
        .args([&url, &tool, "charge(10)"])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    // The run says its id before the code starts.
    let (tx, rx) = std::sync::mpsc::channel();
    let stdout = host.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let first = rx.recv_timeout(Duration::from_secs(30)).unwrap();
    let announced = first.strip_prefix("run ").unwrap().to_owned();
    wait_until("the charge's acknowledgement", 30, || {
        !processes_with_marker(&marker).is_empty()
    });

    host.kill().unwrap(); // SIGKILL, mid-call
    host.wait().unwrap();
    assert_eq!(
        survivors_after(&marker, 5.0),
        Vec::<u32>::new(),
        "the tool's processes outlived the host"
    );

    // The run is found through the listing, as running (its host stopped during it).
    let listed = resumable_runs(&store).await.unwrap();
    let found: Vec<&str> = listed.items.iter().map(|r| r.run_id.as_str()).collect();
    assert_eq!(found, [announced.as_str()]);
    assert_eq!(listed.items[0].state, ResumableState::Running);

    let python = builder()
        .store(store.clone())
        .durable(true)
        .tool(CommandTool::new(
            "charge",
            tool.strip_prefix("charge=").unwrap(),
        ))
        .build()
        .unwrap();
    let e = python.resume(&announced, HashMap::new()).await.unwrap();
    assert_eq!(e.status, Status::Success, "{:?}", e.error);
    assert_eq!(e.run_id, announced);
    assert_eq!(e.return_value, json!("already charged"));
    assert_eq!(
        std::fs::read_to_string(&ledger).unwrap(),
        format!("{announced}.0\n"),
        "the charge fired once, under the call's key"
    );
    let listed = resumable_runs(&store).await.unwrap();
    assert!(listed.items.is_empty(), "{:?}", listed.items);
}

#[tokio::test(flavor = "multi_thread")]
async fn library_tools_get_the_run_id_and_the_call_ordinal_as_call_id() {
    let python = builder()
        .tool(tool_fn("key", "Its call id.", None, |args| async move {
            Ok(json!(args.call_id))
        }))
        .build()
        .unwrap();
    let e = python.run("[key(), key(), key()]").await.unwrap();
    assert_eq!(e.status, Status::Success, "{:?}", e.error);
    let id = &e.run_id;
    assert_eq!(
        e.return_value,
        json!([format!("{id}.0"), format!("{id}.1"), format!("{id}.2")])
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_durable_run_says_its_id_before_the_code_starts_and_is_listed_until_it_ends() {
    let dir = tempfile::tempdir().unwrap();
    let (_, store) = file_store(dir.path());
    let gate = Arc::new(tokio::sync::Notify::new());
    let opened = Arc::clone(&gate);
    let python = builder()
        .store(store.clone())
        .durable(true)
        .tool(tool_fn("wait", "Waits for the test.", None, move |_| {
            let opened = Arc::clone(&opened);
            async move {
                opened.notified().await;
                Ok(json!("go"))
            }
        }))
        .build()
        .unwrap();
    let mut handle = python.start("print('started', flush=True)\nwait()");
    let first = tokio::time::timeout(Duration::from_secs(30), handle.next_event())
        .await
        .unwrap();
    let Some(Event::Resumable { run_id }) = first else {
        panic!("the first event is not the run's id: {first:?}");
    };
    // While the code waits in its tool call, the run is listed as one that can be resumed.
    loop {
        match handle.next_event().await {
            Some(Event::ToolCall { .. }) | None => break,
            Some(_) => {}
        }
    }
    let listed = python.resumable_runs().await.unwrap();
    assert_eq!(listed.items.len(), 1, "{:?}", listed.items);
    assert_eq!(listed.items[0].run_id, run_id);
    assert_eq!(listed.items[0].state, ResumableState::Running);
    gate.notify_one();
    let e = handle.wait().await.unwrap();
    assert_eq!(
        (e.status, e.run_id.as_str()),
        (Status::Success, run_id.as_str())
    );
    assert!(python.resumable_runs().await.unwrap().items.is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_store_that_never_answers_ends_a_run_within_10_s_with_a_2_s_url_timeout() {
    let hung = HungServer::start().unwrap();
    let store = Store::open(&hung.s3_url("2s")).unwrap();
    let python = builder().store(store).build().unwrap();
    let started = Instant::now();
    let e = python.run("6 * 7").await.unwrap();
    let took = started.elapsed();
    assert!(took < Duration::from_secs(10), "the run took {took:?}");
    assert_eq!(e.return_value, json!(42), "the code's outcome is kept");
    assert!(!e.kept);
    let error = e.store_error.unwrap();
    println!("after {took:?}: {error}");
    assert!(
        error.contains("s3://hung/runs") && error.contains("timed out"),
        "{error}"
    );
    assert!(!error.contains("testing"), "credentials in: {error}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_store_failure_after_the_code_ran_returns_the_envelope_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("store");
    let (_, store) = file_store(&root);
    let python = builder().store(store).build().unwrap();
    // The store breaks under the engine: its directory is now a file.
    std::fs::remove_dir_all(&root).unwrap();
    std::fs::write(&root, b"not a directory").unwrap();
    let e = python.run("print('did it')\n6 * 7").await.unwrap();
    assert_eq!(e.status, Status::Success, "{:?}", e.error);
    assert_eq!((e.return_value, e.stdout.as_str()), (json!(42), "did it\n"));
    assert!(!e.kept);
    let error = e.store_error.unwrap();
    assert!(error.contains(&root.display().to_string()), "{error}");
    let v = serde_json::to_value(
        python
            .run(runpython_core::RunRequest::new("1").no_memo())
            .await
            .unwrap(),
    )
    .unwrap();
    assert_eq!(v["kept"], false, "{v}");
}

#[tokio::test(flavor = "multi_thread")]
async fn identical_concurrent_memoized_runs_in_one_engine_execute_once() {
    let executions = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&executions);
    let python = builder()
        .memoize(Duration::from_secs(600))
        .tool(
            tool_fn("count", "Counts executions.", None, move |_| {
                let counter = Arc::clone(&counter);
                async move { Ok(json!(counter.fetch_add(1, Ordering::SeqCst))) }
            })
            .pure(),
        )
        .build()
        .unwrap();
    let code = "import time\ntime.sleep(0.3)\ncount()";
    let mut runs = tokio::task::JoinSet::new();
    for _ in 0..16 {
        let python = python.clone();
        runs.spawn(async move { python.run(code).await.unwrap() });
    }
    let envelopes = runs.join_all().await;
    assert_eq!(
        executions.load(Ordering::SeqCst),
        1,
        "the code ran more than once"
    );
    let computed = envelopes.iter().filter(|e| !e.cached).count();
    assert_eq!(computed, 1);
    assert!(envelopes.iter().all(|e| e.return_value == json!(0)));
}
