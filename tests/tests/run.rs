//! A run from code to envelope through the public library API: values, errors, limits, lifecycle.

#![allow(clippy::unwrap_used)] // a test fails loudly where it unwraps; helpers outside #[test] too

use std::time::Duration;

use runpython_core::{Error, Event, RunPython, RunRequest, Status};
use runpython_tests::{survivors_after, unique_marker};
use serde_json::json;

fn python() -> RunPython {
    RunPython::builder()
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap()
}

async fn run(code: &str) -> runpython_core::Envelope {
    python().run(code).await.unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn last_expression_is_the_return_value_with_its_type() {
    let e = run("x = 20\nx + 22").await;
    assert_eq!(e.status, Status::Success);
    assert_eq!(e.return_value, json!(42));
    assert_eq!(e.return_type.as_deref(), Some("int"));
    assert!(e.error.is_none());
    assert!(!e.run_id.is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn values_that_are_not_json_come_back_as_repr() {
    let e = run("{1: 'a'}").await;
    assert_eq!(
        e.return_value,
        json!("{1: 'a'}"),
        "int keys are not JSON as written"
    );
    assert_eq!(e.return_type.as_deref(), Some("dict"));
    let e = run("float('nan')").await;
    assert_eq!(e.return_value, json!("nan"));
    let e = run("class P:\n    def __repr__(self):\n        return 'P()'\nP()").await;
    assert_eq!(e.return_value, json!("P()"));
    assert_eq!(e.return_type.as_deref(), Some("P"));
    let e = run("class B:\n    def __repr__(self):\n        raise RuntimeError\nB()").await;
    assert_eq!(
        e.status,
        Status::Success,
        "a broken __repr__ is not a crash"
    );
    assert_eq!(e.return_value, json!(null), "no string posing as the value");
    let why = &e.return_preview.as_ref().unwrap()["repr_error"];
    assert!(
        why.as_str().unwrap().contains("repr() raised RuntimeError"),
        "{why}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn none_as_last_expression_has_no_value_and_no_type() {
    let e = run("print('x')").await;
    assert_eq!(e.return_value, json!(null));
    assert_eq!(e.return_type, None);
}

#[tokio::test(flavor = "multi_thread")]
async fn traceback_shows_user_frames_and_lines_only() {
    let e = run("def f():\n    raise ValueError('boom')\n\nf()").await;
    assert_eq!(e.status, Status::Error);
    let err = e.error.unwrap();
    assert_eq!(err.kind, "ValueError");
    assert_eq!(err.message, "boom");
    let tb = err.traceback.unwrap();
    assert!(tb.contains("line 4") && tb.contains("line 2"), "{tb}");
    assert!(
        tb.contains("raise ValueError('boom')"),
        "source lines are shown: {tb}"
    );
    assert!(!tb.contains("runpython"), "runner frames leak: {tb}");
}

#[tokio::test(flavor = "multi_thread")]
async fn traceback_inside_awaited_code_hides_asyncio_plumbing() {
    let e =
        run("import asyncio\nasync def f():\n    await asyncio.sleep(0)\n    1/0\nawait f()").await;
    let tb = e.error.unwrap().traceback.unwrap();
    assert!(tb.contains("line 4"), "{tb}");
    assert!(!tb.contains("base_events.py"), "{tb}");
    assert!(!tb.contains("runpython"), "{tb}");
}

#[tokio::test(flavor = "multi_thread")]
async fn syntax_error_is_reported_with_its_line() {
    let e = run("x = 1\ndef f(:\n    pass").await;
    let err = e.error.unwrap();
    assert_eq!(err.kind, "SyntaxError");
    assert!(err.traceback.unwrap().contains("line 2"));
}

#[tokio::test(flavor = "multi_thread")]
async fn base_exceptions_are_reported_and_sys_exit_zero_is_success() {
    let e = run("raise KeyboardInterrupt").await;
    assert_eq!(e.error.unwrap().kind, "KeyboardInterrupt");
    let e = run("import sys\nsys.exit(3)").await;
    let err = e.error.unwrap();
    assert_eq!(
        (err.kind.as_str(), err.message.as_str()),
        ("SystemExit", "3")
    );
    let e = run("import sys\nprint('bye')\nsys.exit(0)").await;
    assert_eq!(e.status, Status::Success);
    assert_eq!(e.stdout, "bye\n");
}

#[tokio::test(flavor = "multi_thread")]
async fn input_raises_eof_error_instead_of_hanging() {
    let e = run("input('name? ')").await;
    assert_eq!(e.error.unwrap().kind, "EOFError");
}

#[tokio::test(flavor = "multi_thread")]
async fn asyncio_is_not_imported_unless_the_code_awaits() {
    let e = run("import sys\n'asyncio' in sys.modules").await;
    assert_eq!(e.return_value, json!(false));
}

#[tokio::test(flavor = "multi_thread")]
async fn async_for_and_async_with_keep_module_scope() {
    let code = "
import asyncio, contextlib
async def gen():
    for i in range(3):
        yield i
@contextlib.asynccontextmanager
async def ctx():
    yield 10
async with ctx() as base:
    pass
total = base
async for i in gen():
    total += i
def read():
    return total
read()";
    assert_eq!(run(code).await.return_value, json!(13));
}

#[tokio::test(flavor = "multi_thread")]
async fn inputs_are_globals() {
    let e = python()
        .run(
            RunRequest::new("f'{name}:{len(xs)}'")
                .input("name", json!("ada"))
                .input("xs", json!([1, 2])),
        )
        .await
        .unwrap();
    assert_eq!(e.return_value, json!("ada:2"));
}

#[tokio::test(flavor = "multi_thread")]
async fn an_input_name_that_is_not_an_identifier_is_refused() {
    let err = python()
        .run(RunRequest::new("1").input("not ok", json!(1)))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::InvalidInput(_)), "{err}");
}

#[tokio::test(flavor = "multi_thread")]
async fn printing_a_fake_result_does_not_forge_the_envelope() {
    let e = run("print('{\"status\": \"success\", \"return_value\": 99}')\nNone").await;
    assert_eq!(e.return_value, json!(null));
}

#[tokio::test(flavor = "multi_thread")]
async fn secrets_are_dropped_and_passthrough_names_kept() {
    // SAFETY of set_var: this test binary sets these two names only here, before any run reads them.
    std::env::set_var("RUNPYTHON_T_SECRET_KEY", "hunter2");
    std::env::set_var("RUNPYTHON_T_PUBLIC", "yes");
    let python = RunPython::builder()
        .env_passthrough("RUNPYTHON_T_PUBLIC")
        .build()
        .unwrap();
    let e = python
        .run("import os\n[os.environ.get('RUNPYTHON_T_SECRET_KEY'), os.environ.get('RUNPYTHON_T_PUBLIC')]")
        .await
        .unwrap();
    assert_eq!(e.return_value, json!([null, "yes"]));
}

#[tokio::test(flavor = "multi_thread")]
async fn cwd_is_a_private_run_directory_removed_afterwards() {
    let e =
        run("import os\n[os.getcwd(), oct(os.stat('..').st_mode & 0o777), os.listdir('.')]").await;
    let cwd = e.return_value[0].as_str().unwrap().to_owned();
    assert_eq!(e.return_value[1], json!("0o700"));
    assert_eq!(
        e.return_value[2],
        json!([]),
        "the working directory starts empty"
    );
    assert!(
        !std::path::Path::new(&cwd).exists(),
        "{cwd} was not removed"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn code_too_large_is_refused_before_anything_is_spawned() {
    let marker = unique_marker("toolarge");
    let python = RunPython::builder().max_code_chars(50).build().unwrap();
    let code = format!(
        "import subprocess\nsubprocess.Popen(['{marker}', '30'], executable='sleep')\n# {}",
        "x".repeat(100)
    );
    let e = python.run(code).await.unwrap();
    let err = e.error.unwrap();
    assert_eq!(err.kind, "CodeTooLarge");
    assert!(
        err.message.contains("over the limit of 50"),
        "{}",
        err.message
    );
    assert!(survivors_after(&marker, 0.2).is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn return_value_over_the_limit_is_an_error() {
    let python = RunPython::builder().max_return_bytes(1000).build().unwrap();
    let e = python.run("'x' * 2000").await.unwrap();
    assert_eq!(e.error.unwrap().kind, "ReturnValueTooLarge");
    let e = python.run("'x' * 500").await.unwrap();
    assert_eq!(e.status, Status::Success);
}

#[tokio::test(flavor = "multi_thread")]
async fn output_is_truncated_head_and_tail_with_counts() {
    let python = RunPython::builder().max_output_chars(100).build().unwrap();
    let e = python
        .run("import sys\nprint('HEAD' + 'x' * 100000)\nsys.stderr.write('e' * 50)\nprint('TAIL')")
        .await
        .unwrap();
    assert!(e.stdout.starts_with("HEAD"));
    assert!(e.stdout.ends_with("TAIL\n"));
    assert!(e.stdout.contains("characters omitted"));
    assert!(e.stdout.chars().count() < 200);
    let t = e.truncated.unwrap();
    let out = t.stdout.unwrap();
    assert_eq!(out.total_chars, 4 + 100000 + 1 + 5);
    assert_eq!(out.omitted_chars, out.total_chars - 100);
    assert!(t.stderr.is_none(), "stderr fit");
    assert_eq!(e.stderr, "e".repeat(50));
}

#[tokio::test(flavor = "multi_thread")]
async fn timeout_keeps_partial_output_and_kills_a_grandchild() {
    let marker = unique_marker("timeout");
    let python = RunPython::builder()
        .timeout(Duration::from_millis(1500))
        .build()
        .unwrap();
    let code = format!(
        "import subprocess, time\nsubprocess.Popen(['{marker}', '300'], executable='sleep')\nprint('started', flush=True)\ntime.sleep(300)"
    );
    let e = python.run(code).await.unwrap();
    assert_eq!(e.status, Status::Timeout);
    assert_eq!(e.error.as_ref().unwrap().kind, "Timeout");
    assert_eq!(
        e.stdout, "started\n",
        "output written before the timeout survives"
    );
    assert!(
        survivors_after(&marker, 2.0).is_empty(),
        "grandchild survived the timeout"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_background_process_left_by_finished_code_is_killed() {
    let marker = unique_marker("leftover");
    let code = format!(
        "import subprocess\nsubprocess.Popen(['{marker}', '300'], executable='sleep')\n'done'"
    );
    let e = run(&code).await;
    assert_eq!(e.return_value, json!("done"));
    assert!(survivors_after(&marker, 2.0).is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn dropping_the_run_future_kills_the_process_group() {
    let marker = unique_marker("dropped");
    let code = format!(
        "import subprocess, time\nsubprocess.Popen(['{marker}', '300'], executable='sleep')\ntime.sleep(300)"
    );
    let python = python();
    let dropped = tokio::time::timeout(Duration::from_millis(1500), python.run(code)).await;
    assert!(
        dropped.is_err(),
        "the run should still be going when dropped"
    );
    assert!(survivors_after(&marker, 2.0).is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn events_stream_output_live_and_cancel_kills_the_run() {
    let marker = unique_marker("cancel");
    let code = format!(
        "import subprocess, time\nsubprocess.Popen(['{marker}', '300'], executable='sleep')\nprint('one', flush=True)\ntime.sleep(300)"
    );
    let mut handle = python().start(code);
    let first = tokio::time::timeout(Duration::from_secs(10), handle.next_event())
        .await
        .expect("an event arrives while the code still runs");
    assert_eq!(first, Some(Event::Stdout("one\n".into())));
    handle.cancel();
    assert!(matches!(handle.wait().await, Err(Error::Cancelled)));
    assert!(survivors_after(&marker, 2.0).is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn dropping_the_handle_kills_the_run() {
    let marker = unique_marker("handle");
    let code = format!("import subprocess, time\nsubprocess.Popen(['{marker}', '300'], executable='sleep')\nprint('up', flush=True)\ntime.sleep(300)");
    let mut handle = python().start(code);
    let _ = handle.next_event().await;
    drop(handle);
    assert!(survivors_after(&marker, 2.0).is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn hard_exit_and_signals_are_process_exited() {
    let e = run("import os\nos._exit(7)").await;
    let err = e.error.unwrap();
    assert_eq!(
        (err.kind.as_str(), err.exit_code),
        ("ProcessExited", Some(7))
    );
    let e = run("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)").await;
    let err = e.error.unwrap();
    assert_eq!((err.kind.as_str(), err.signal), ("ProcessExited", Some(9)));
    assert!(err.message.contains("SIGKILL"), "{}", err.message);
}

#[tokio::test(flavor = "multi_thread")]
async fn zero_timeout_is_a_configuration_error() {
    let err = RunPython::builder()
        .timeout(Duration::ZERO)
        .build()
        .unwrap_err();
    assert!(matches!(err, Error::Config(_)));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_python_that_does_not_exist_is_a_clear_error() {
    let python = RunPython::builder()
        .python("/nonexistent/python3")
        .build()
        .unwrap();
    let err = python.run("1").await.unwrap_err();
    assert!(err.to_string().contains("/nonexistent/python3"), "{err}");
}
