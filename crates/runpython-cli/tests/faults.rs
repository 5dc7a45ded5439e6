//! Faults through the CLI (issue 21): finding durable runs, a store that never answers, the messages
//! store failures print, the call id an MCP tool receives.

#![allow(clippy::unwrap_used)] // a test fails loudly where it unwraps; helpers outside #[test] too

mod common;

use std::time::{Duration, Instant};

use common::{envelope, runpython, text};
use runpython_tests::HungServer;
use serde_json::json;

#[test]
fn a_durable_run_says_its_id_on_stderr_and_runpython_runs_lists_it_with_its_resume_command() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("file://{}", dir.path().display());
    let out = runpython(&[
        "run",
        "--store",
        &store,
        "--approval",
        "ask",
        "-c",
        "ask('ship it?')",
    ]);
    assert_eq!(out.status.code(), Some(1), "suspended is not success");
    let stderr = text(&out.stderr);
    let run_id = stderr
        .split_once("durable run ")
        .and_then(|(_, rest)| rest.split(';').next())
        .unwrap_or_else(|| panic!("no run id on stderr: {stderr}"))
        .to_owned();

    let listed = runpython(&["runs", "--json", "--store", &store]);
    assert_eq!(listed.status.code(), Some(0), "{}", text(&listed.stderr));
    let listed = envelope(&listed);
    assert_eq!(listed.as_array().unwrap().len(), 1, "{listed}");
    let run = &listed[0];
    assert_eq!(run["run_id"], json!(run_id));
    assert_eq!(run["state"], "suspended");
    assert_eq!(run["waiting_on"], json!(["s0"]));
    let resume = run["resume"].as_str().unwrap();
    assert!(
        resume.starts_with(&format!("runpython resume {run_id} --store {store}")),
        "{resume}"
    );
    let table = text(&runpython(&["runs", "--store", &store]).stdout);
    assert!(
        table.contains(&run_id) && table.contains("suspended on s0"),
        "{table}"
    );

    let out = runpython(&[
        "resume",
        &run_id,
        "--decision",
        "\"yes\"",
        "--json",
        "--store",
        &store,
        "--approval",
        "ask",
    ]);
    assert_eq!(envelope(&out)["return_value"], "yes");
    let listed = envelope(&runpython(&["runs", "--json", "--store", &store]));
    assert_eq!(listed, json!([]), "a finished run is not listed");

    // --durable alone makes a run durable: it says its id before the code's output.
    let out = runpython(&["run", "--durable", "--store", &store, "-c", "1"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("durable run "),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn a_run_whose_store_never_answers_exits_with_the_codes_status_and_names_the_store_error() {
    let hung = HungServer::start().unwrap();
    let url = hung.s3_url("2s");
    let started = Instant::now();
    let out = runpython(&[
        "run",
        "--json",
        "--store",
        &url,
        "-c",
        "print('ran')\n6 * 7",
    ]);
    let took = started.elapsed();
    assert!(took < Duration::from_secs(10), "took {took:?}");
    assert_eq!(
        out.status.code(),
        Some(0),
        "the code ran and succeeded: {}",
        text(&out.stderr)
    );
    let e = envelope(&out);
    assert_eq!(
        (&e["return_value"], &e["stdout"]),
        (&json!(42), &json!("ran\n"))
    );
    assert_eq!(e["kept"], false);
    assert!(
        e["store_error"].as_str().unwrap().contains("timed out"),
        "{e}"
    );

    let out = runpython(&["run", "--store", &url, "-c", "6 * 7"]);
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(text(&out.stdout), "42\n");
    assert!(
        text(&out.stderr).contains("the code ran, but the run was not kept"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn a_memo_run_on_a_store_that_never_answers_is_one_clean_store_error() {
    let hung = HungServer::start().unwrap();
    let url = hung.s3_url("2s");
    let started = Instant::now();
    let out = runpython(&["run", "--memo", "--store", &url, "-c", "1"]);
    assert!(started.elapsed() < Duration::from_secs(10));
    assert_eq!(out.status.code(), Some(2), "nothing ran");
    let stderr = text(&out.stderr);
    println!("{stderr}");
    assert!(!stderr.contains("internal error"), "{stderr}");
    assert!(stderr.contains("s3://hung/runs"), "{stderr}");
    for cause in ["error sending request", "timed out", "Error performing GET"] {
        assert_eq!(
            stderr.matches(cause).count(),
            1,
            "{cause:?} repeated: {stderr}"
        );
    }
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
}

/// An MCP server (stdio, line-delimited JSON-RPC) whose one tool, `charge`, answers the `_meta` key
/// runpython puts the call id in.
const META_ECHO_SERVER: &str = r#"
import json, sys
for line in sys.stdin:
    msg = json.loads(line)
    if "id" not in msg:
        continue
    method = msg.get("method")
    if method == "initialize":
        result = {"protocolVersion": msg["params"]["protocolVersion"], "capabilities": {"tools": {}},
                  "serverInfo": {"name": "meta-echo", "version": "1"}}
    elif method == "tools/list":
        result = {"tools": [{"name": "charge", "inputSchema": {"type": "object",
                  "properties": {"amount": {"type": "integer"}}}}]}
    elif method == "tools/call":
        meta = msg["params"].get("_meta") or {}
        result = {"content": [{"type": "text", "text": json.dumps(meta.get("runpython/call_id"))}]}
    else:
        print(json.dumps({"jsonrpc": "2.0", "id": msg["id"],
                          "error": {"code": -32601, "message": "unknown method"}}), flush=True)
        continue
    print(json.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": result}), flush=True)
"#;

#[test]
fn mcp_tools_get_the_call_id_in_meta() {
    let dir = tempfile::tempdir().unwrap();
    let server = dir.path().join("meta_echo.py");
    std::fs::write(&server, META_ECHO_SERVER).unwrap();
    let command = format!("python3 {}", server.display());
    let out = runpython(&[
        "run",
        "--json",
        "--no-store",
        "--mcp-server",
        &command,
        "-c",
        "[charge(amount=1), charge(amount=2)]",
    ]);
    let e = envelope(&out);
    let id = e["run_id"].as_str().unwrap();
    assert_eq!(
        e["return_value"],
        json!([format!("{id}.0"), format!("{id}.1")]),
        "{e}"
    );
}
