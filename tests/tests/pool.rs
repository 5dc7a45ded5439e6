//! The interpreter pool: runs served by interpreters started ahead of time behave exactly like cold
//! runs (the acceptance cases and the lifecycle attacks), see nothing of earlier runs, survive a dead
//! pooled interpreter, and never get an interpreter prepared for other dependencies.

#![allow(clippy::unwrap_used)] // a test fails loudly where it unwraps; helpers outside #[test] too

use std::time::Duration;

use runpython_core::{CommandTool, PoolConfig, RunPython, RunRequest, Status};
use runpython_tests::{hostile_code, processes_with_marker, survivors_after, unique_marker};
use serde_json::{json, Value};

/// A pool whose interpreters import `json` before their run: a run that finds `json` loaded was
/// served by a pooled interpreter (the runner itself never imports `json`).
fn pooled() -> RunPython {
    RunPython::builder()
        .timeout(Duration::from_secs(30))
        .pool(PoolConfig {
            size: 1,
            idle: Duration::from_secs(60),
            warm_imports: vec!["json".into()],
            prestart: false,
            templates: false,
        })
        .build()
        .unwrap()
}

const WAS_POOLED: &str = "import sys\n'json' in sys.modules";

/// Runs until a pooled interpreter serves (the refill after the first run is asynchronous).
async fn warm(python: &RunPython) {
    for _ in 0..100 {
        if python.run(WAS_POOLED).await.unwrap().return_value == json!(true) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("no run was ever served by a pooled interpreter");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_first_run_is_cold_and_later_ones_are_pooled() {
    let python = pooled();
    assert_eq!(
        python.run(WAS_POOLED).await.unwrap().return_value,
        json!(false)
    );
    warm(&python).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pooled_run_sees_nothing_of_the_previous_run() {
    // Every run through the pool: the one that leaves state and the one that looks for it.
    let python = RunPython::builder()
        .pool(PoolConfig {
            size: 1,
            idle: Duration::from_secs(60),
            warm_imports: vec!["json".into()],
            prestart: true,
            templates: false,
        })
        .build()
        .unwrap();
    warm(&python).await;
    python
        .run("import os\nleft = 1\nopen('left.txt', 'w').write('x')\nos.environ['LEFT'] = '1'\nimport tempfile\nopen('/tmp/left', 'w').write('x')")
        .await
        .unwrap();
    warm(&python).await;
    let e = python
        .run("import os, sys\n['left' in globals(), os.listdir('.'), os.environ.get('LEFT'), os.path.exists('/tmp/left'), 'json' in sys.modules]")
        .await
        .unwrap();
    assert_eq!(
        e.return_value,
        json!([false, [], null, false, true]),
        "{:?}",
        e.error
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_dead_pooled_interpreter_is_replaced() {
    let python = RunPython::builder()
        .pool(PoolConfig {
            size: 1,
            idle: Duration::from_secs(60),
            warm_imports: vec!["json".into(), "dead_pool_marker_".into()],
            prestart: false,
            templates: false,
        })
        .build()
        .unwrap();
    warm(&python).await; // leaves a fresh pooled interpreter behind once refilled
    let mut pids = Vec::new();
    for _ in 0..100 {
        pids = processes_with_marker("json,dead_pool_marker_");
        if !pids.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(!pids.is_empty(), "no pooled interpreter is waiting");
    // Kill every interpreter carrying this engine's marker, twice: the first scan may catch the one
    // that served the last run while it exits, racing its replacement.
    for _ in 0..2 {
        for pid in processes_with_marker("json,dead_pool_marker_") {
            // Only interpreters this test's engine started carry this marker.
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        // The sandbox's supervisor reports an interpreter's death a moment later.
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // The dead one is never handed out: the run succeeds, on a fresh interpreter.
    let e = python
        .run("import sys\n['json' in sys.modules, 1 + 1]")
        .await
        .unwrap();
    assert_eq!(
        e.status,
        Status::Success,
        "the dead one was used: {:?}",
        e.error
    );
    assert_eq!(e.return_value[1], json!(2));
    warm(&python).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pooled_interpreter_is_never_used_for_other_dependencies() {
    let python = pooled();
    warm(&python).await;
    // A run needing `six` gets an interpreter prepared for that environment, not the plain one.
    let e = python
        .run(
            RunRequest::new("import sys, six\n['json' in sys.modules, six.__name__]")
                .dependency("six"),
        )
        .await
        .unwrap();
    assert_eq!(e.status, Status::Success, "{:?}", e.error);
    assert_eq!(
        e.return_value,
        json!([false, "six"]),
        "the first run of a new environment is cold"
    );
    for _ in 0..100 {
        let e = python
            .run(
                RunRequest::new("import sys, six\n['json' in sys.modules, six.__name__]")
                    .dependency("six"),
            )
            .await
            .unwrap();
        if e.return_value == json!([true, "six"]) {
            let plain = python
                .run("import importlib.util\nimportlib.util.find_spec('six') is None")
                .await
                .unwrap();
            assert_eq!(plain.return_value, json!(true), "the plain pool has no six");
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the six environment was never served from the pool");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pooled_run_that_times_out_leaves_no_process_behind() {
    let python = RunPython::builder()
        .timeout(Duration::from_secs(2))
        .pool(PoolConfig {
            size: 1,
            idle: Duration::from_secs(60),
            warm_imports: vec!["json".into()],
            prestart: true, // this run must be served by a pooled interpreter
            templates: false,
        })
        .build()
        .unwrap();
    warm(&python).await;
    let marker = unique_marker("pool-timeout");
    let code = format!(
        "import sys\nassert 'json' in sys.modules, 'not pooled'\n{}",
        hostile_code(&marker)
    );
    let e = python.run(code).await.unwrap();
    assert_eq!(e.status, Status::Timeout, "{:?}", e.error);
    assert!(
        survivors_after(&marker, 3.0).is_empty(),
        "a pooled run left processes behind"
    );
}

/// The shared acceptance cases that need no network, run through the library twice on one engine:
/// the second time each is served by a pooled interpreter, and must pass the same checks.
#[tokio::test(flavor = "multi_thread")]
async fn acceptance_cases_pass_on_pooled_interpreters() {
    let cases = include_str!("../../crates/runpython-cli/tests/acceptance/cases.jsonl");
    let mut failures = Vec::new();
    for line in cases.lines().filter(|l| !l.trim().is_empty()) {
        let case: Value = serde_json::from_str(line).unwrap();
        let x = &case["expect"];
        if x["needs_network"] == json!(true) || x.get("env").is_some() {
            continue; // installs, and cases that change this process's environment, run in the CLI suite
        }
        let mut builder = RunPython::builder().pool(PoolConfig {
            size: 1,
            idle: Duration::from_secs(60),
            warm_imports: vec![],
            prestart: false,
            templates: false,
        });
        let mut request = RunRequest::new(case["code"].as_str().unwrap());
        let args: Vec<&str> = case["args"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap())
            .collect();
        let mut i = 0;
        while i < args.len() {
            match args[i] {
                "--no-auto-deps" => builder = builder.auto_deps(false),
                "--timeout" => {
                    builder = builder.timeout(Duration::from_secs_f64(args[i + 1].parse().unwrap()))
                }
                "--max-output-chars" => {
                    builder = builder.max_output_chars(args[i + 1].parse().unwrap())
                }
                "--input" => {
                    let (name, value) = args[i + 1].split_once('=').unwrap();
                    request = request.input(name, serde_json::from_str(value).unwrap());
                }
                "--tool" => {
                    let (name, command) = args[i + 1].split_once('=').unwrap();
                    builder = builder.tool(CommandTool::new(name, command));
                }
                other => panic!("unhandled acceptance argument {other}"),
            }
            i += if args[i] == "--no-auto-deps" { 1 } else { 2 };
        }
        let python = builder.build().unwrap();
        let _ = python.run(request.clone()).await.unwrap(); // cold; the pool refills behind it
        tokio::time::sleep(Duration::from_millis(300)).await;
        let e = serde_json::to_value(python.run(request).await.unwrap()).unwrap();
        let name = case["name"].as_str().unwrap();
        for field in ["status", "return_value", "return_type", "stdout"] {
            if let Some(expected) = x.get(field) {
                if &e[field] != expected {
                    failures.push(format!("{name}: {field} {} != {expected}", e[field]));
                }
            }
        }
        if let Some(t) = x.get("error_type") {
            if &e["error"]["type"] != t {
                failures.push(format!("{name}: error.type {} != {t}", e["error"]["type"]));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Runs that come faster than one interpreter starts find none ready; the pool then keeps more
/// ready for that environment (up to four), so a steady stream of them is served without waiting.
#[tokio::test(flavor = "multi_thread")]
async fn an_environment_whose_runs_outpace_its_refills_keeps_more_interpreters_ready() {
    let marker = unique_marker("pooldepth");
    let python = RunPython::builder()
        .timeout(Duration::from_secs(30))
        .pool(PoolConfig {
            size: 1,
            idle: Duration::from_secs(60),
            // A warm import that fails (left for the run to see): only to name these interpreters.
            warm_imports: vec![marker.clone()],
            prestart: false,
            templates: false,
        })
        .build()
        .unwrap();
    // Back to back: each run is quicker than the refill its predecessor started.
    for _ in 0..8 {
        let e = python.run("1 + 1").await.unwrap();
        assert_eq!(e.status, Status::Success, "{:?}", e.error);
    }
    // The interpreters that served the runs are gone by then; those left wait for runs.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let ready = processes_with_marker(&marker).len();
    assert!(
        (2..=4).contains(&ready),
        "{ready} interpreters ready after a burst, not between 2 and 4"
    );
}
