//! Nested runs ("agent in agent"): `run_python` called from the code, its depth limit and shared budgets.

#![allow(clippy::unwrap_used)] // a test fails loudly where it unwraps; helpers outside #[test] too

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use runpython_core::{tool_fn, RunPython, Status};
use serde_json::json;

fn nested(depth: u32) -> RunPython {
    RunPython::builder()
        .timeout(Duration::from_secs(30))
        .allow_nested(depth)
        .build()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn nested_run_returns_the_inner_envelope() {
    let envelope = nested(2)
        .run(concat!(
            "r = run_python(\"print('inner')\\nx * 2\", inputs={'x': 21})\n",
            "e = run_python('1/0')\n",
            "[r['status'], r['return_value'], r['stdout'], e['status'], e['error']['type']]",
        ))
        .await
        .unwrap();
    assert_eq!(envelope.status, Status::Success, "{envelope:?}");
    assert_eq!(
        envelope.return_value,
        json!(["success", 42, "inner\n", "error", "ZeroDivisionError"])
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn two_levels_nest_within_depth_two() {
    let envelope = nested(2)
        .run("run_python(\"run_python('7 * 6')['return_value']\")['return_value']")
        .await
        .unwrap();
    assert_eq!(envelope.return_value, json!(42), "{envelope:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_call_past_the_depth_limit_raises_nesting_limit_in_the_code() {
    let inner_code = "try:\n    run_python('1')\nexcept Exception as e:\n    result = [type(e).__name__, str(e)]\nresult";
    let envelope = nested(1)
        .run(format!("run_python({inner_code:?})['return_value']"))
        .await
        .unwrap();
    assert_eq!(envelope.status, Status::Success, "{envelope:?}");
    assert_eq!(envelope.return_value[0], "NestingLimit", "{envelope:?}");
    let message = envelope.return_value[1].as_str().unwrap();
    assert!(message.contains("allow_nested(1)"), "{message}");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_inner_run_gets_what_remains_of_the_tool_call_budget_and_is_charged_for_it() {
    let ticks = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&ticks);
    let python = RunPython::builder()
        .timeout(Duration::from_secs(30))
        .max_tool_calls(5)
        .allow_nested(1)
        .tool(tool_fn("tick", "Counts.", None, move |_| {
            let counter = Arc::clone(&counter);
            async move { Ok(json!(counter.fetch_add(1, Ordering::SeqCst))) }
        }))
        .build()
        .unwrap();
    // Three calls (tick, tick, run_python) leave two for the inner run, which tries ten.
    let code = r#"
tick(); tick()
inner = run_python("for _ in range(10):\n    tick()")
print(inner["status"], inner["error"]["type"], inner["error"]["message"])
tick()  # the inner run's two calls were charged: this is the sixth of five
"#;
    let envelope = python.run(code).await.unwrap();
    assert!(
        envelope
            .stdout
            .starts_with("error ToolCallLimit the code made more than 2 tool calls"),
        "{envelope:?}"
    );
    assert_eq!(envelope.status, Status::Error);
    assert_eq!(envelope.error.as_ref().unwrap().kind, "ToolCallLimit");
    assert_eq!(
        ticks.load(Ordering::SeqCst),
        4,
        "2 outer + 2 inner calls reach the tool"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_inner_timeout_is_bounded_by_the_outer_runs_remaining_time() {
    let python = RunPython::builder()
        .timeout(Duration::from_secs(8))
        .allow_nested(1)
        .build()
        .unwrap();
    let envelope = python
        .run("r = run_python('import time\\ntime.sleep(60)')\n[r['status'], r['duration_ms']]")
        .await
        .unwrap();
    assert_eq!(envelope.status, Status::Success, "{envelope:?}");
    assert_eq!(envelope.return_value[0], "timeout");
    assert!(
        envelope.return_value[1].as_u64().unwrap() < 8000,
        "{envelope:?}"
    );
}

#[test]
fn depth_zero_and_a_clashing_host_tool_are_refused() {
    assert!(RunPython::builder().allow_nested(0).build().is_err());
    let clash = RunPython::builder()
        .allow_nested(1)
        .tool(tool_fn("run_python", "", None, |_| async { Ok(json!(1)) }))
        .build();
    assert!(clash.is_err());
}
