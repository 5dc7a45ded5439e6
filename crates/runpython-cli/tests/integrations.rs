//! `runpython tool-spec`, `runpython mcp` driven by a real MCP client, `--mcp-server` and `--allow-nested`.

#![allow(clippy::unwrap_used)] // a test fails loudly where it unwraps; helpers outside #[test] too

use std::process::{Command, Stdio};

use rmcp::model::{CallToolRequestParams, CallToolResult};
use rmcp::service::{RoleClient, RunningService};
use rmcp::transport::TokioChildProcess;
use rmcp::ServiceExt;
use serde_json::{json, Value};

const BIN: &str = env!("CARGO_BIN_EXE_runpython");

fn runpython(args: &[&str]) -> (Option<i32>, Value, String) {
    let out = Command::new(BIN)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("stdout is not JSON ({e}); stderr: {stderr}"));
    (out.status.code(), value, stderr)
}

#[test]
fn tool_spec_prints_each_providers_shape() {
    for (format, keys) in [
        ("anthropic", vec!["description", "input_schema", "name"]),
        ("openai", vec!["function", "type"]),
        (
            "mcp",
            vec![
                "annotations",
                "description",
                "inputSchema",
                "name",
                "outputSchema",
                "title",
            ],
        ),
    ] {
        let (code, spec, stderr) = runpython(&[
            "tool-spec",
            "--format",
            format,
            "--tool",
            "lookup=cat",
            "--allow-nested",
            "--store",
            "memory://",
            "--approval",
            "ask",
        ]);
        assert_eq!(code, Some(0), "{stderr}");
        let defs = spec.as_array().unwrap();
        assert_eq!(defs.len(), 4, "{spec}");
        for d in defs {
            let mut got: Vec<&str> = d.as_object().unwrap().keys().map(String::as_str).collect();
            got.sort_unstable();
            assert_eq!(got, keys, "{format}: {d}");
        }
        let text = spec.to_string();
        assert!(
            text.contains("def lookup(*args: Any, **kwargs: Any)"),
            "{text}"
        );
        assert!(text.contains("def run_python(code: str"), "{text}");
    }
    let out = Command::new(BIN)
        .args(["tool-spec", "--format", "gemini"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
}

async fn mcp_client(args: &[&str]) -> RunningService<RoleClient, ()> {
    let mut command = tokio::process::Command::new(BIN);
    command.arg("mcp").args(args);
    ().serve(TokioChildProcess::new(command).unwrap())
        .await
        .unwrap()
}

async fn call(
    client: &RunningService<RoleClient, ()>,
    tool: &'static str,
    args: Value,
) -> (bool, String) {
    let params =
        CallToolRequestParams::new(tool).with_arguments(args.as_object().cloned().unwrap());
    let result: CallToolResult = client.call_tool(params).await.unwrap();
    let text = result
        .content
        .iter()
        .filter_map(|c| c.as_text().map(|t| t.text.clone()))
        .collect::<String>();
    (result.is_error == Some(true), text)
}

#[tokio::test(flavor = "multi_thread")]
async fn mcp_results_carry_integers_of_any_size() {
    let client = mcp_client(&["--no-store"]).await;
    let arguments: Value = serde_json::from_str(
        r#"{"code": "[x, x * 2, 2**100]", "inputs": {"x": 1267650600228229401496703205376}}"#,
    )
    .unwrap();
    let (is_error, text) = call(&client, "run_python", arguments).await;
    assert!(!is_error, "{text}");
    assert!(
        text.contains(
            "[1267650600228229401496703205376,2535301200456458802993406410752,1267650600228229401496703205376]"
        ),
        "{text}"
    );
    client.cancel().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn mcp_server_answers_a_real_client() {
    let client = mcp_client(&[
        "--store",
        "memory://",
        "--timeout",
        "30",
        "--approval",
        "request_approval",
    ])
    .await;
    let info = client.peer_info().unwrap();
    assert_eq!(info.server_info.as_ref().unwrap().name, "runpython");

    let tools = client.list_all_tools().await.unwrap();
    let names: Vec<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
    assert_eq!(
        names,
        ["run_python", "get_run_artifact", "close_session", "resume"]
    );
    assert_eq!(tools[0].input_schema["required"], json!(["code"]));

    let (is_error, text) = call(
        &client,
        "run_python",
        json!({"code": "print('hi')\nopen('out.txt', 'w').write('hi there')\nn * 7", "inputs": {"n": 6}}),
    )
    .await;
    assert!(!is_error, "{text}");
    let envelope: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(envelope["return_value"], 42);
    assert_eq!(envelope["stdout"], "hi\n");

    // The code failing is an outcome: the envelope, not a tool error.
    let (is_error, text) = call(&client, "run_python", json!({"code": "1/0"})).await;
    assert!(!is_error, "{text}");
    let failed: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(failed["error"]["type"], "ZeroDivisionError");

    let file_id = envelope["artifacts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["name"] == "out.txt")
        .unwrap()["id"]
        .clone();
    let (is_error, text) = call(
        &client,
        "get_run_artifact",
        json!({"id": file_id, "length": 2}),
    )
    .await;
    assert!(!is_error, "{text}");
    assert_eq!(serde_json::from_str::<Value>(&text).unwrap()["text"], "hi");

    let (is_error, text) = call(&client, "resume", json!({"run_id": "r1", "decisions": {}})).await;
    assert!(is_error);
    assert!(text.contains("no checkpoint"), "{text}");

    // A run that asks a person suspends; the model resumes it with the decision.
    let (_, text) = call(
        &client,
        "run_python",
        json!({"code": "ok = request_approval('ship it?')\n'shipped' if ok else 'held'"}),
    )
    .await;
    let suspended: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(suspended["status"], "suspended", "{text}");
    let id = suspended["suspension"]["id"].as_str().unwrap().to_owned();
    let run_id = suspended["run_id"].clone();
    let (is_error, text) = call(
        &client,
        "resume",
        json!({"run_id": run_id, "decisions": {id: true}}),
    )
    .await;
    assert!(!is_error, "{text}");
    assert_eq!(
        serde_json::from_str::<Value>(&text).unwrap()["return_value"],
        "shipped"
    );

    // Arguments outside the declared schema are a JSON-RPC error (-32602), not a result.
    let params = CallToolRequestParams::new("run_python")
        .with_arguments(json!({"source": "1"}).as_object().cloned().unwrap());
    let err = client.call_tool(params).await.unwrap_err().to_string();
    assert!(err.contains("`code` is required"), "{err}");
    client.cancel().await.unwrap();
}

#[test]
fn code_calls_the_tools_of_another_mcp_server() {
    // The second server is runpython's own: the script calls its run_python tool through the bridge.
    let server = format!("'{BIN}' mcp --no-store");
    let code = "r = run_python(code='6 * 7')\n\
                try:\n    get_run_artifact(id='x')\nexcept Exception as e:\n    err = str(e)\n\
                [r['status'], r['return_value'], 'store' in err]";
    let (status, envelope, stderr) = runpython(&[
        "run",
        "--json",
        "--no-store",
        "--mcp-server",
        &server,
        "-c",
        code,
    ]);
    assert_eq!(status, Some(0), "{envelope} {stderr}");
    assert_eq!(envelope["return_value"], json!(["success", 42, true]));
}

#[test]
fn a_command_that_is_not_an_mcp_server_is_an_infrastructure_error() {
    let out = Command::new(BIN)
        .args(["run", "--no-store", "--mcp-server", "exit 3", "-c", "1"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("MCP server `exit 3`"), "{stderr}");
}

#[test]
fn allow_nested_exposes_run_python_to_the_code() {
    let (status, envelope, stderr) = runpython(&[
        "run",
        "--json",
        "--no-store",
        "--allow-nested",
        "-c",
        "run_python('1 + 1', inputs={})['return_value']",
    ]);
    assert_eq!(status, Some(0), "{envelope} {stderr}");
    assert_eq!(envelope["return_value"], 2);
}
