//! Code mode: scripts calling host tools through the bridge (ports of peers' external-function cases).

#![allow(clippy::unwrap_used)] // a test fails loudly where it unwraps; helpers outside #[test] too

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use runpython_core::{tool_fn, CommandTool, RunPython, Status, ToolError, ToolFormat};
use serde_json::{json, Value};

fn schema(props: Value, required: &[&str]) -> Option<Value> {
    Some(json!({"type": "object", "properties": props, "required": required}))
}

fn with_tools() -> RunPython {
    RunPython::builder()
        .timeout(Duration::from_secs(30))
        .tool(tool_fn(
            "now",
            "A constant clock.",
            schema(json!({}), &[]),
            |_| async { Ok(json!("2026-01-01")) },
        ))
        .tool(tool_fn(
            "double",
            "Twice x.",
            schema(json!({"x": {"type": "integer"}}), &["x"]),
            |a| async move { Ok(json!(a.get("x").and_then(Value::as_i64).unwrap_or(0) * 2)) },
        ))
        .tool(tool_fn(
            "search",
            "Search.",
            schema(
                json!({"query": {"type": "string"}, "limit": {"type": "integer", "default": 10}}),
                &["query"],
            ),
            |a| async move { Ok(json!({"query": a.get("query"), "limit": a.get("limit")})) },
        ))
        .tool(tool_fn(
            "echo",
            "Echoes its arguments.",
            None,
            |a| async move { Ok(json!({"args": a.args, "kwargs": a.kwargs})) },
        ))
        .tool(tool_fn(
            "fail",
            "Always fails.",
            schema(json!({"kind": {"type": "string"}}), &["kind"]),
            |a| async move {
                let kind = a
                    .get("kind")
                    .and_then(Value::as_str)
                    .unwrap_or("ValueError")
                    .to_owned();
                Err(ToolError::new(kind, "it went wrong"))
            },
        ))
        .tool(tool_fn("explode", "Panics.", None, |_| async {
            panic!("handler bug")
        }))
        .tool(tool_fn("odd-name", "Has a dash.", None, |_| async {
            Ok(json!("odd"))
        }))
        .build()
        .unwrap()
}

async fn run(code: &str) -> runpython_core::Envelope {
    with_tools().run(code).await.unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn no_args_positional_keyword_and_defaults() {
    assert_eq!(run("now()").await.return_value, json!("2026-01-01"));
    assert_eq!(run("double(21)").await.return_value, json!(42));
    assert_eq!(run("double(x=4)").await.return_value, json!(8));
    assert_eq!(
        run("search('cats')").await.return_value,
        json!({"query": "cats", "limit": 10})
    );
    assert_eq!(
        run("search('cats', limit=3)").await.return_value,
        json!({"query": "cats", "limit": 3})
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn signatures_are_real_python_signatures() {
    let e = run("import inspect\n[str(inspect.signature(search)), search.__doc__]").await;
    assert_eq!(e.return_value, json!(["(query, limit=10)", "Search."]));
    let e = run("double()").await;
    assert_eq!(
        e.error.unwrap().kind,
        "TypeError",
        "a missing argument fails like any Python call"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn schemaless_tools_get_args_and_kwargs_as_written() {
    let e = run("echo(1, [2, {'a': None}], flag=True, nested={'k': [1.5, 'x']})").await;
    assert_eq!(
        e.return_value,
        json!({"args": [1, [2, {"a": null}]], "kwargs": {"flag": true, "nested": {"k": [1.5, "x"]}}})
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn tool_errors_raise_builtin_types_or_tool_error_subclasses() {
    let e = run("try:\n    fail('ValueError')\nexcept ValueError as e:\n    r = str(e)\nr").await;
    assert_eq!(e.return_value, json!("it went wrong"));
    let e = run("fail('KeyError')").await;
    assert_eq!(e.error.unwrap().kind, "KeyError");
    let e = run("import runpython_tools\ntry:\n    fail('HttpError')\nexcept runpython_tools.ToolError as e:\n    r = [type(e).__name__, str(e)]\nr").await;
    assert_eq!(
        e.return_value,
        json!(["HttpError", "tool 'fail' failed: HttpError: it went wrong"])
    );
    let e = run("fail('HttpError')").await;
    assert_eq!(e.error.unwrap().kind, "HttpError");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_panicking_handler_is_contained_and_raised_in_the_code() {
    let e = run("try:\n    explode()\nexcept Exception as e:\n    r = str(e)\nr").await;
    assert!(
        e.return_value.as_str().unwrap().contains("handler bug"),
        "{:?}",
        e.return_value
    );
    // The host is fine: the same engine runs again.
    assert_eq!(run("double(1)").await.return_value, json!(2));
}

#[tokio::test(flavor = "multi_thread")]
async fn undefined_tool_is_an_ordinary_name_error() {
    let e = run("nothing_here(1)").await;
    assert_eq!(e.error.unwrap().kind, "NameError");
}

#[tokio::test(flavor = "multi_thread")]
async fn tools_namespace_reaches_names_that_are_not_identifiers() {
    assert_eq!(run("tools['odd-name']()").await.return_value, json!("odd"));
    assert_eq!(run("tools.double(5)").await.return_value, json!(10));
}

#[tokio::test(flavor = "multi_thread")]
async fn many_calls_in_a_loop() {
    let e = run("sum(double(i) for i in range(300))").await;
    assert_eq!(e.return_value, json!(2 * (0..300).sum::<i64>()));
}

#[tokio::test(flavor = "multi_thread")]
async fn await_works_at_top_level_and_inside_async_def() {
    assert_eq!(run("await double(21)").await.return_value, json!(42));
    let e = run("async def f(n):\n    return await double(n) + 1\nawait f(4)").await;
    assert_eq!(e.return_value, json!(9));
    let e = run("import asyncio\nasync def f(n):\n    return double(n)\nasyncio.run(f(3))").await;
    assert_eq!(
        e.return_value,
        json!(6),
        "a plain call inside a coroutine blocks and returns the value"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn gather_of_100_calls_is_served_concurrently_up_to_the_cap() {
    let in_flight = Arc::new(AtomicUsize::new(0));
    let peak = Arc::new(AtomicUsize::new(0));
    let (f, p) = (Arc::clone(&in_flight), Arc::clone(&peak));
    let python = RunPython::builder()
        .tool(tool_fn(
            "slow",
            "Sleeps then echoes.",
            schema(json!({"i": {"type": "integer"}}), &["i"]),
            move |a| {
                let (f, p) = (Arc::clone(&f), Arc::clone(&p));
                async move {
                    let now = f.fetch_add(1, Ordering::SeqCst) + 1;
                    p.fetch_max(now, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    f.fetch_sub(1, Ordering::SeqCst);
                    Ok(a.get("i").cloned().unwrap_or(Value::Null))
                }
            },
        ))
        .build()
        .unwrap();
    let e = python
        .run("import asyncio\nr = await asyncio.gather(*[slow(i) for i in range(100)])\nsum(r)")
        .await
        .unwrap();
    assert_eq!(
        e.return_value,
        json!((0..100).sum::<i64>()),
        "{:?}",
        e.error
    );
    // Served concurrently, never more at once than the bridge's cap (`max_concurrent_calls`, 16).
    let peak = peak.load(Ordering::SeqCst);
    assert!(peak <= 16, "{peak} calls were served at once, over the cap");
    assert!(peak > 8, "calls did not overlap: peak {peak}");
}

#[tokio::test(flavor = "multi_thread")]
async fn call_budget_ends_the_run_with_tool_call_limit() {
    let python = RunPython::builder()
        .max_tool_calls(5)
        .tool(tool_fn("t", "", None, |_| async { Ok(json!(1)) }))
        .build()
        .unwrap();
    // Even code that swallows every Exception cannot hide the limit.
    let e = python
        .run("n = 0\nfor i in range(10):\n    try:\n        n += t()\n    except Exception:\n        pass\nn")
        .await
        .unwrap();
    assert_eq!(e.status, Status::Error);
    assert_eq!(e.error.unwrap().kind, "ToolCallLimit");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_slow_tool_raises_timeout_error_in_the_code() {
    let python = RunPython::builder()
        .tool_call_timeout(Duration::from_millis(200))
        .tool(tool_fn("hang", "", None, |_| async {
            tokio::time::sleep(Duration::from_secs(30)).await;
            Ok(json!(null))
        }))
        .build()
        .unwrap();
    let e = python.run("hang()").await.unwrap();
    assert_eq!(e.error.unwrap().kind, "TimeoutError");
}

#[tokio::test(flavor = "multi_thread")]
async fn malformed_frame_on_the_raw_socket_ends_the_run_not_the_host() {
    let code = "
import os, runpython_tools, json
b = runpython_tools._bridge
hello = json.dumps({'type': 'hello', 'version': 1, 'token': b.token}).encode()
os.write(4, len(hello).to_bytes(4, 'big') + hello)
os.write(4, (5).to_bytes(4, 'big') + b'{oops')
import time
time.sleep(30)
";
    let e = run(code).await;
    assert_eq!(e.status, Status::Error);
    let err = e.error.unwrap();
    assert_eq!(err.kind, "SandboxError");
    assert!(err.message.contains("malformed"), "{}", err.message);
    assert_eq!(run("double(2)").await.return_value, json!(4));
}

#[tokio::test(flavor = "multi_thread")]
async fn oversized_frame_ends_the_run() {
    let code = "
import os, runpython_tools, json
b = runpython_tools._bridge
hello = json.dumps({'type': 'hello', 'version': 1, 'token': b.token}).encode()
os.write(4, len(hello).to_bytes(4, 'big') + hello + (0xFFFFFFFF).to_bytes(4, 'big'))
import time
time.sleep(30)
";
    let err = run(code).await.error.unwrap();
    assert_eq!(err.kind, "SandboxError");
    assert!(
        err.message.contains("over the bridge's limit"),
        "{}",
        err.message
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_hello_without_the_token_closes_the_bridge_and_the_run_goes_on() {
    // The bridge is one connection, inherited as a descriptor: there is no path to connect to, so a
    // wrong hello on it ends the bridge (calls then fail) without ending the run or the host.
    let code = "
import os, socket, runpython_tools, json
b = runpython_tools._bridge
bad = json.dumps({'type': 'hello', 'version': 1, 'token': 'guess'}).encode()
os.write(4, len(bad).to_bytes(4, 'big') + bad)
try:
    double(5)
    outcome = 'served'
except runpython_tools.BridgeError:
    outcome = 'closed'
[b.path, outcome]
";
    let e = run(code).await;
    assert_eq!(e.return_value, json!([null, "closed"]), "{:?}", e.error);
    assert_eq!(run("double(2)").await.return_value, json!(4));
}

#[tokio::test(flavor = "multi_thread")]
async fn command_tools_get_json_on_stdin_and_their_failures_raise() {
    let python = RunPython::builder()
        .tool(CommandTool::new(
            "add",
            "python3 -c \"import json,sys; a=json.load(sys.stdin); print(sum(a['args']))\"",
        ))
        .tool(CommandTool::new("broken", "echo 'no luck' >&2; exit 3"))
        .tool(CommandTool::new("chatty", "echo not json"))
        .build()
        .unwrap();
    assert_eq!(
        python.run("add(1, 2, 3)").await.unwrap().return_value,
        json!(6)
    );
    let err = python.run("broken()").await.unwrap().error.unwrap();
    assert_eq!(err.kind, "ToolError");
    assert!(err.message.contains("no luck"), "{}", err.message);
    let err = python.run("chatty()").await.unwrap().error.unwrap();
    assert!(err.message.contains("not JSON"), "{}", err.message);
}

#[tokio::test(flavor = "multi_thread")]
async fn arguments_that_are_not_json_raise_type_error() {
    let e = run("double({1, 2})").await;
    assert_eq!(e.error.unwrap().kind, "TypeError");
}

tokio::task_local! {
    static CALLER: &'static str;
}

#[tokio::test(flavor = "multi_thread")]
async fn start_in_runs_tools_inside_the_callers_scope() {
    let python = RunPython::builder()
        .timeout(Duration::from_secs(30))
        .tool(tool_fn(
            "caller",
            "Who started the run.",
            schema(json!({}), &[]),
            // Read when the call is made, as a tool binding the caller's event loop does.
            |_| {
                let who = CALLER.try_with(|c| *c).unwrap_or("nobody");
                async move { Ok(json!(who)) }
            },
        ))
        .build()
        .unwrap();
    let handle = python.start_in("caller()", |run| CALLER.scope("the test", run));
    assert_eq!(handle.wait().await.unwrap().return_value, json!("the test"));
    let handle = python.start("caller()");
    assert_eq!(handle.wait().await.unwrap().return_value, json!("nobody"));
}

/// An engine whose `meet(x)` answers `x * 2` only once `n` calls are in flight on the host together
/// (a barrier): code whose calls do not overlap gets a `TimeoutError` instead of its values.
fn meeting(n: usize) -> RunPython {
    let barrier = Arc::new(tokio::sync::Barrier::new(n));
    RunPython::builder()
        .timeout(Duration::from_secs(30))
        .tool(tool_fn(
            "meet",
            "Twice x, once n calls are in flight together.",
            schema(json!({"x": {"type": "integer"}}), &["x"]),
            move |a| {
                let barrier = Arc::clone(&barrier);
                async move {
                    tokio::time::timeout(Duration::from_secs(10), barrier.wait())
                        .await
                        .map_err(|_| {
                            ToolError::new("TimeoutError", "the calls were not in flight together")
                        })?;
                    Ok(json!(a.get("x").and_then(Value::as_i64).unwrap_or(0) * 2))
                }
            },
        ))
        .build()
        .unwrap()
}

async fn concurrently(n: usize, code: &str) -> Value {
    let e = meeting(n).run(code).await.unwrap();
    assert_eq!(e.status, Status::Success, "{code}\n{:?}", e.error);
    e.return_value
}

#[tokio::test(flavor = "multi_thread")]
async fn calls_stored_in_names_then_gathered_run_together() {
    let code = "import asyncio\nt = meet(x=1)\nd = meet(x=2)\nawait asyncio.gather(t, d)";
    assert_eq!(concurrently(2, code).await, json!([2, 4]));
}

#[tokio::test(flavor = "multi_thread")]
async fn calls_made_then_awaited_one_by_one_were_already_in_flight() {
    let code = "a = meet(x=1)\nb = meet(x=2)\n[await a, await b]";
    assert_eq!(concurrently(2, code).await, json!([2, 4]));
}

#[tokio::test(flavor = "multi_thread")]
async fn create_task_of_a_tool_call() {
    let code = "import asyncio\na = asyncio.create_task(meet(x=1))\nb = asyncio.create_task(meet(x=2))\n[await a, await b]";
    assert_eq!(concurrently(2, code).await, json!([2, 4]));
}

#[tokio::test(flavor = "multi_thread")]
async fn gather_of_a_starred_comprehension() {
    let code = "import asyncio\nawait asyncio.gather(*[meet(x=i) for i in range(3)])";
    assert_eq!(concurrently(3, code).await, json!([0, 2, 4]));
}

#[tokio::test(flavor = "multi_thread")]
async fn asyncio_wait_of_tool_calls() {
    let code = "import asyncio\ndone, pending = await asyncio.wait([meet(x=1), meet(x=2)])\nsorted(t.result() for t in done)";
    assert_eq!(concurrently(2, code).await, json!([2, 4]));
}

#[tokio::test(flavor = "multi_thread")]
async fn task_group_create_task() {
    let code = "import asyncio\nasync with asyncio.TaskGroup() as tg:\n    a = tg.create_task(meet(x=1))\n    b = tg.create_task(meet(x=2))\n[a.result(), b.result()]";
    assert_eq!(concurrently(2, code).await, json!([2, 4]));
}

#[tokio::test(flavor = "multi_thread")]
async fn calls_inside_coroutines_that_are_gathered() {
    let code = "import asyncio\nasync def report(c):\n    t = meet(x=c)\n    return {'city': c, 'temp': await t}\nawait asyncio.gather(report(1), report(2))";
    assert_eq!(
        concurrently(2, code).await,
        json!([{"city": 1, "temp": 2}, {"city": 2, "temp": 4}])
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_list_built_in_a_loop_then_gathered() {
    let code = "import asyncio\ntasks = []\nfor i in range(3):\n    task = meet(x=i)\n    tasks.append(task)\nawait asyncio.gather(*tasks)";
    assert_eq!(concurrently(3, code).await, json!([0, 2, 4]));
}

#[tokio::test(flavor = "multi_thread")]
async fn asyncio_run_of_a_main_that_gathers() {
    let code = "import asyncio\nasync def main():\n    t = meet(x=1)\n    d = meet(x=2)\n    return await asyncio.gather(t, d)\nasyncio.run(main())";
    assert_eq!(concurrently(2, code).await, json!([2, 4]));
}

/// pydantic-monty's `async__ext_call.py` case, with a host tool in place of its external function.
#[tokio::test(flavor = "multi_thread")]
async fn pydantic_montys_async_external_call_cases_pass() {
    let python = RunPython::builder()
        .timeout(Duration::from_secs(30))
        .tool(tool_fn(
            "async_call",
            "Returns its argument.",
            None,
            |a| async move { Ok(a.args.first().cloned().unwrap_or(Value::Null)) },
        ))
        .build()
        .unwrap();
    let code = r#"
result = await async_call(42)
assert result == 42, 'async_call should return awaited value'
s = await async_call('hello')
assert s == 'hello'
lst = await async_call([1, 2, 3])
assert lst == [1, 2, 3]
a = await async_call(10)
b = await async_call(20)
assert a + b == 30
import asyncio
results = await asyncio.gather(async_call(1), async_call(2), async_call(3))
assert results == [1, 2, 3], 'gather should collect external async results in order'
results = await asyncio.gather(async_call('a'), async_call('b'))
assert results == ['a', 'b']
async def add(a, b):
    return a + b
async def multiply(a, b):
    return a * b
results = await asyncio.gather(add(1, 2), async_call(10))
assert results == [3, 10]
results = await asyncio.gather(async_call(20), multiply(3, 4))
assert results == [20, 12]
results = await asyncio.gather(add(5, 5), async_call('x'), multiply(2, 3), async_call('y'))
assert results == [10, 'x', 6, 'y']
async def double_external(x):
    val = await async_call(x)
    return val * 2
results = await asyncio.gather(double_external(5), async_call(100))
assert results == [10, 100]
async def triple_add(a, b, c):
    x = await async_call(a)
    y = await async_call(b)
    return x + y + c
results = await asyncio.gather(triple_add(1, 2, 3), async_call(50))
assert results == [6, 50]
pending = async_call(7)
assert await pending == 7, 'a call kept in a name, then awaited'
plain = async_call(8)
assert plain == 8, 'a call used as a value is a plain call'
'ok'
"#;
    let e = python.run(code).await.unwrap();
    assert_eq!(e.return_value, json!("ok"), "{:?}", e.error);
}

#[tokio::test(flavor = "multi_thread")]
async fn command_tools_show_their_description_and_parameters_never_their_command() {
    let command = "python3 -c \"import json,sys; a=json.load(sys.stdin); print(json.dumps(a['kwargs']))\" --secret-token=abc123";
    let python = RunPython::builder()
        .tool(
            CommandTool::new("weather", command)
                .with_description("Current weather of a city.")
                .with_input_schema(json!({
                    "type": "object",
                    "properties": {"city": {"type": "string"}, "units": {"type": "string", "default": "C"}},
                    "required": ["city"],
                }))
                .unwrap(),
        )
        .tool(CommandTool::new("undocumented", "echo 1 # /host/path/secret"))
        .build()
        .unwrap();
    let spec = python.tool_spec(ToolFormat::Anthropic);
    let described = spec[0]["description"].as_str().unwrap();
    assert!(
        described.contains("def weather(city: str, units: str = \"C\") -> Any:\n    \"\"\"Current weather of a city.\"\"\""),
        "{described}"
    );
    let spec = spec.to_string();
    for leak in ["secret-token", "abc123", "/host/path", "python3 -c"] {
        assert!(!spec.contains(leak), "{leak} in {spec}");
    }
    let e = python.run("weather('Paris')").await.unwrap();
    assert_eq!(
        e.return_value,
        json!({"city": "Paris", "units": "C"}),
        "{:?}",
        e.error
    );
    let e = python
        .run("import inspect\ninspect.getdoc(undocumented) or ''")
        .await
        .unwrap();
    assert_eq!(
        e.return_value,
        json!(""),
        "no command line in the stub's docstring"
    );
    assert!(
        CommandTool::new("t", "c")
            .with_input_schema(json!({"type": "array"}))
            .is_err(),
        "a schema that is not an object schema is refused"
    );
}
