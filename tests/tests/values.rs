//! Exact values and what a run keeps (issue 16): integers of any size, a value that cannot be shown,
//! lone surrogates, exceptions of any size, per-run environment values, output kept whole, the
//! isolation report.

#![allow(clippy::unwrap_used)] // a test fails loudly where it unwraps; helpers outside #[test] too

use std::sync::{Arc, Mutex};
use std::time::Duration;

use runpython_core::{
    tool_fn, ArtifactKind, Envelope, RunPython, RunPythonBuilder, RunRequest, Status, Store,
};
use serde_json::{json, Value};

fn file_store() -> (tempfile::TempDir, Store) {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&format!("file://{}", dir.path().display())).unwrap();
    (dir, store)
}

fn builder() -> RunPythonBuilder {
    RunPython::builder().timeout(Duration::from_secs(60))
}

async fn run(code: &str) -> Envelope {
    builder().build().unwrap().run(code).await.unwrap()
}

async fn kept_bytes(store: &Store, e: &Envelope, kind: ArtifactKind) -> Vec<u8> {
    let manifest = store.get_run(&e.run_id).await.unwrap();
    let artifact = manifest
        .artifact(kind)
        .unwrap_or_else(|| panic!("no {kind:?} in {:?}", manifest.artifacts));
    store.get_run_artifact(&artifact.id).await.unwrap().to_vec()
}

#[tokio::test(flavor = "multi_thread")]
async fn integers_of_any_size_are_exact_in_inputs_values_tool_calls_and_the_store() {
    let (_dir, store) = file_store();
    let seen = Arc::new(Mutex::new(String::new()));
    let seen_by_tool = Arc::clone(&seen);
    let python = builder()
        .store(store.clone())
        .tool(tool_fn(
            "twice_and_back",
            "Returns n and 2**128 + 1.",
            Some(json!({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]})),
            move |a| {
                let seen = Arc::clone(&seen_by_tool);
                async move {
                    let n = a.get("n").cloned().unwrap_or(Value::Null);
                    *seen.lock().unwrap() = n.to_string();
                    let big: Value = serde_json::from_str("340282366920938463463374607431768211457")
                        .map_err(|e| runpython_core::ToolError::value_error(e.to_string()))?;
                    Ok(json!([n, big]))
                }
            },
        ))
        .build()
        .unwrap();
    let x: Value = serde_json::from_str("1267650600228229401496703205376").unwrap();
    let request = RunRequest::new(
        "r = twice_and_back(n=x * 2)\n[x, 2**100, type(x).__name__, r, r[1] == 2**128 + 1]",
    )
    .input("x", x);
    let e = python.run(request).await.unwrap();
    assert_eq!(e.status, Status::Success, "{:?}", e.error);
    let exact = "[1267650600228229401496703205376,1267650600228229401496703205376,\"int\",\
                 [2535301200456458802993406410752,340282366920938463463374607431768211457],true]";
    assert_eq!(e.return_value.to_string(), exact);
    assert_eq!(*seen.lock().unwrap(), "2535301200456458802993406410752");
    let kept = kept_bytes(&store, &e, ArtifactKind::ReturnValue).await;
    assert_eq!(String::from_utf8(kept).unwrap(), exact);
    // The envelope's JSON (what MCP and --json print) carries the digits too.
    assert!(serde_json::to_string(&e).unwrap().contains(exact));
}

#[tokio::test(flavor = "multi_thread")]
async fn an_integer_too_long_to_show_is_previewed_and_kept_whole_never_a_wrong_success() {
    // Over the default 1 MB return limit: an honest error, with the digits' count, head and tail.
    let e = run("2 ** 10_000_000").await;
    assert_eq!(e.status, Status::Error);
    assert_eq!(e.error.as_ref().unwrap().kind, "ReturnValueTooLarge");
    let preview = e.return_preview.as_ref().unwrap();
    assert_eq!(preview["type"], "int");
    assert_eq!(preview["digits"], 3_010_300);
    assert!(preview["head"].as_str().unwrap().starts_with("9049817306"));
    assert!(preview["tail"].as_str().unwrap().ends_with("1387109376"));

    // Under a limit that holds it: success, the preview in the envelope, the whole value kept.
    let (_dir, store) = file_store();
    let python = builder()
        .store(store.clone())
        .max_return_bytes(4_000_000)
        .build()
        .unwrap();
    let e = python.run("2 ** 10_000_000").await.unwrap();
    assert_eq!(e.status, Status::Success, "{:?}", e.error);
    assert_eq!(e.return_value, Value::Null);
    assert_eq!(e.return_preview.as_ref().unwrap()["digits"], 3_010_300);
    let listed = e
        .artifacts
        .iter()
        .find(|a| a.kind == ArtifactKind::ReturnValue)
        .unwrap();
    let digits = python.get_run_artifact(&listed.id).await.unwrap();
    assert_eq!(digits.len(), 3_010_300);
    assert!(digits.starts_with(b"9049817306") && digits.ends_with(b"1387109376"));
}

#[tokio::test(flavor = "multi_thread")]
async fn lone_surrogates_become_replacement_characters_keeping_the_value_and_the_error_type() {
    let e = run("['a' + chr(0xdcff), 'b\\ud800c']").await;
    assert_eq!(e.status, Status::Success, "{:?}", e.error);
    assert_eq!(e.return_value, json!(["a\u{FFFD}", "b\u{FFFD}c"]));

    let e = run("raise ValueError('bad name ' + chr(0xdcff))").await;
    let error = e.error.unwrap();
    assert_eq!(
        (error.kind.as_str(), error.message.as_str()),
        ("ValueError", "bad name \u{FFFD}")
    );

    let python = builder()
        .tool(tool_fn("echo", "Echoes.", None, |a| async move {
            Ok(json!(a.args))
        }))
        .build()
        .unwrap();
    let e = python.run("echo('x' + chr(0xdcff))").await.unwrap();
    assert_eq!(e.status, Status::Success, "{:?}", e.error);
    assert_eq!(e.return_value, json!(["x\u{FFFD}"]));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_megabyte_exception_message_keeps_its_type_within_the_budget() {
    let e = run("raise ValueError('<' + 'm' * 1_000_000 + '>')").await;
    assert_eq!(e.status, Status::Error);
    let error = e.error.as_ref().unwrap();
    assert_eq!(error.kind, "ValueError");
    assert!(
        error.message.starts_with("<mmm") && error.message.ends_with("mm>"),
        "head and tail kept"
    );
    assert!(serde_json::to_vec(&e).unwrap().len() <= 8192);
}

#[tokio::test(flavor = "multi_thread")]
async fn per_run_environment_values_reach_the_code_and_are_masked_where_kept() {
    let (_dir, store) = file_store();
    let python = builder().store(store.clone()).build().unwrap();
    let code = "import os, subprocess\nprint('token is', os.environ['API_TOKEN'])\n\
                [os.environ['API_TOKEN'], subprocess.run(['sh', '-c', 'echo $API_TOKEN'], capture_output=True, text=True).stdout.strip()]";
    let e = python
        .run(RunRequest::new(code).env("API_TOKEN", "tok-1234567890"))
        .await
        .unwrap();
    assert_eq!(e.status, Status::Success, "{:?}", e.error);
    assert_eq!(e.return_value, json!(["tok-1234567890", "tok-1234567890"]));
    for kind in [ArtifactKind::Stdout, ArtifactKind::ReturnValue] {
        let kept = String::from_utf8(kept_bytes(&store, &e, kind).await).unwrap();
        assert!(
            kept.contains("[REDACTED:API_TOKEN]") && !kept.contains("tok-1234567890"),
            "{kind:?}: {kept}"
        );
    }
    // For that run only.
    let e = python
        .run("import os\nos.environ.get('API_TOKEN')")
        .await
        .unwrap();
    assert_eq!(e.return_value, Value::Null);
    // A name an environment cannot hold is refused before anything runs.
    let bad = python.run(RunRequest::new("1").env("A=B", "x")).await;
    assert!(
        matches!(bad, Err(runpython_core::Error::InvalidInput(_))),
        "{bad:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn output_the_envelope_cut_is_kept_whole_and_masked_in_the_store() {
    let (_dir, store) = file_store();
    let python = builder()
        .store(store.clone())
        .max_output_chars(100)
        .build()
        .unwrap();
    let code =
        "import os\nprint('x' * 5000)\nprint('middle', os.environ['DB_SECRET'])\nprint('y' * 5000)";
    let e = python
        .run(RunRequest::new(code).env("DB_SECRET", "hunter2-hunter2"))
        .await
        .unwrap();
    assert_eq!(e.status, Status::Success, "{:?}", e.error);
    let cut = e.truncated.as_ref().unwrap().stdout.as_ref().unwrap();
    assert_eq!(cut.total_chars, 10_025);
    assert!(!cut.artifact_truncated);
    let whole = python
        .get_run_artifact(cut.artifact.as_ref().unwrap())
        .await
        .unwrap();
    let whole = String::from_utf8(whole).unwrap();
    assert!(whole.contains("middle [REDACTED:DB_SECRET]\n"), "masked");
    assert_eq!(
        whole.chars().count(),
        10_025 - 15 + "[REDACTED:DB_SECRET]".len()
    );
    assert!(
        whole.starts_with(&"x".repeat(5000)) && whole.ends_with(&format!("{}\n", "y".repeat(5000)))
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn output_past_64_mib_is_kept_up_to_the_cap_and_says_so() {
    let (_dir, store) = file_store();
    let python = builder().store(store.clone()).build().unwrap();
    let code =
        "import sys\nblock = 'z' * (1 << 20)\nfor _ in range(65):\n    sys.stdout.write(block)";
    let e = python.run(code).await.unwrap();
    assert_eq!(e.status, Status::Success, "{:?}", e.error);
    let cut = e.truncated.as_ref().unwrap().stdout.as_ref().unwrap();
    assert_eq!(cut.total_chars, 65 << 20);
    assert!(cut.artifact_truncated, "{cut:?}");
    let manifest = store.get_run(&e.run_id).await.unwrap();
    let kept = manifest.artifact(ArtifactKind::Stdout).unwrap();
    assert_eq!(Some(&kept.id), cut.artifact.as_ref());
    assert_eq!(kept.bytes, 64 << 20);
}

#[tokio::test(flavor = "multi_thread")]
async fn the_isolation_report_is_kept_whole_but_left_out_of_the_json_envelope_when_complete() {
    let (_dir, store) = file_store();
    let python = builder().store(store.clone()).build().unwrap();
    let e = python.run("1").await.unwrap();
    let isolation = e
        .isolation
        .clone()
        .expect("the library's value has the report");
    let json = serde_json::to_value(&e).unwrap();
    if isolation.missing.is_empty() {
        assert!(json.get("isolation").is_none(), "{json}");
    } else {
        assert_eq!(json["isolation"]["missing"], json!(isolation.missing));
    }
    let manifest = store.get_run(&e.run_id).await.unwrap();
    let kept: Value = serde_json::from_str(&manifest.isolation_json).unwrap();
    assert_eq!(kept, serde_json::to_value(&isolation).unwrap());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_typed_request_gets_the_exact_value_beside_the_json_and_keeps_it_in_the_memo() {
    let (_dir, store) = file_store();
    let python = builder()
        .store(store)
        .memoize(Duration::from_secs(600))
        .build()
        .unwrap();
    let code = "import datetime\n(1, datetime.date(2024, 1, 2), b'x')";
    let typed = python.run(RunRequest::new(code).typed()).await.unwrap();
    assert_eq!(typed.status, Status::Success, "{:?}", typed.error);
    // The JSON envelope keeps its JSON forms (a tuple as a list, ISO dates, base64 bytes); the
    // exact value rides beside it.
    assert_eq!(typed.return_value, json!([1, "2024-01-02", "eA=="]));
    let exact = json!({"$rp": "tuple", "v": [1, {"$rp": "date", "v": "2024-01-02"}, {"$rp": "bytes", "v": "eA=="}]});
    assert_eq!(typed.return_typed, Some(exact.clone()));
    let hit = python.run(RunRequest::new(code).typed()).await.unwrap();
    assert!(hit.cached);
    assert_eq!(hit.return_typed, Some(exact));
    // A plain request of the same code is another memo entry, and has no typed copy.
    let plain = python.run(code).await.unwrap();
    assert!(!plain.cached && plain.return_typed.is_none());
    assert!(!serde_json::to_string(&plain)
        .unwrap()
        .contains("return_typed"));
    // Plain JSON values need no copy even when asked.
    let json_only = python
        .run(RunRequest::new("[1, {'a': 'b'}]").typed())
        .await
        .unwrap();
    assert!(json_only.return_typed.is_none());
}

#[tokio::test(flavor = "multi_thread")]
async fn dates_and_bytes_have_a_json_form() {
    let e = run("import datetime\n[datetime.datetime(2024, 1, 2, 3, 4, 5), datetime.time(6, 7), bytearray(b'ab')]").await;
    assert_eq!(
        e.return_value,
        json!(["2024-01-02T03:04:05", "06:07:00", "YWI="])
    );
    assert_eq!(run("b'\\x00'").await.return_value, json!("AA=="));
}
