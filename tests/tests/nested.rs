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
async fn the_inner_run_shares_the_outer_runs_tool_call_budget() {
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
tick()  # the inner run's calls were the tree's: this is the sixth of five
"#;
    let envelope = python.run(code).await.unwrap();
    assert!(
        envelope.stdout.starts_with(
            "error ToolCallLimit this run and the runs nested with it made more than 5 tool calls"
        ),
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
async fn concurrent_nested_runs_never_make_more_calls_than_the_outer_budget() {
    let ticks = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&ticks);
    let python = RunPython::builder()
        .timeout(Duration::from_secs(60))
        .max_tool_calls(100)
        .allow_nested(1)
        .tool(tool_fn("tick", "Counts.", None, move |_| {
            let counter = Arc::clone(&counter);
            async move { Ok(json!(counter.fetch_add(1, Ordering::SeqCst))) }
        }))
        .build()
        .unwrap();
    // Eight inner runs at once (four live, the rest refused until one ends), each trying 300 calls.
    let code = r#"
import asyncio
inner = "n = 0\ntry:\n    while n < 300:\n        tick(); n += 1\nexcept BaseException:\n    pass\nn"
async def main():
    return await asyncio.gather(*[run_python(inner) for _ in range(8)], return_exceptions=True)
results = asyncio.run(main())
[(r["error"] or {}).get("type", "done") if isinstance(r, dict) else type(r).__name__ for r in results]
"#;
    let envelope = python.run(code).await.unwrap();
    assert_eq!(envelope.status, Status::Success, "{envelope:?}");
    let made = ticks.load(Ordering::SeqCst);
    assert!(
        made <= 100,
        "the tree made {made} calls under a budget of 100"
    );
    // The live ones ran out of the shared budget; the others were refused while four were alive.
    let results = envelope.return_value.as_array().unwrap();
    let refused = results
        .iter()
        .filter(|r| **r == json!("NestingLimit"))
        .count();
    let limited = results
        .iter()
        .filter(|r| **r == json!("ToolCallLimit"))
        .count();
    assert!(refused <= 4 && refused + limited == 8, "{results:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_tree_of_runs_holds_no_more_calls_at_once_than_one_run() {
    let (now, peak) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let (n, p) = (Arc::clone(&now), Arc::clone(&peak));
    let python = RunPython::builder()
        .timeout(Duration::from_secs(60))
        .allow_nested(1)
        .tool(tool_fn("slow", "Holds a slot.", None, move |_| {
            let (now, peak) = (Arc::clone(&n), Arc::clone(&p));
            async move {
                let at = now.fetch_add(1, Ordering::SeqCst) + 1;
                peak.fetch_max(at, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(100)).await;
                now.fetch_sub(1, Ordering::SeqCst);
                Ok(json!(at))
            }
        }))
        .build()
        .unwrap();
    // Four inner runs, each with sixteen calls at once (a run's own cap), and the outer's sixteen.
    let code = r#"
import asyncio
inner = "import asyncio\nasync def main():\n    return await asyncio.gather(*[slow() for _ in range(16)])\nlen(asyncio.run(main()))"
async def main():
    runs = [run_python(inner) for _ in range(4)]
    mine = [slow() for _ in range(16)]
    return await asyncio.gather(*runs, *mine)
results = asyncio.run(main())
[r["return_value"] if isinstance(r, dict) else r for r in results[:4]]
"#;
    let envelope = python.run(code).await.unwrap();
    assert_eq!(envelope.status, Status::Success, "{envelope:?}");
    assert_eq!(envelope.return_value, json!([16, 16, 16, 16]));
    let peak = peak.load(Ordering::SeqCst);
    assert!(
        peak <= 16,
        "{peak} calls were served at once across the tree"
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
