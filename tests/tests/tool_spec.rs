//! Tool definitions for models in each provider's shape, and the dispatcher behind them.

#![allow(clippy::unwrap_used)] // a test fails loudly where it unwraps; helpers outside #[test] too

use std::time::Duration;

use runpython_core::{tool_fn, Error, Event, RunPython, RunRequest, Store, ToolFormat};
use serde_json::{json, Value};

fn engine() -> RunPython {
    RunPython::builder()
        .timeout(Duration::from_secs(30))
        .tool(tool_fn(
            "search",
            "Search the catalogue.",
            Some(json!({"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]})),
            |_| async { Ok(json!([])) },
        ))
        .allow_nested(1)
        .store(Store::open("memory://").unwrap())
        .approval("ask_a_person")
        .build()
        .unwrap()
}

fn keys(v: &Value) -> Vec<&str> {
    let mut keys: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
    keys.sort_unstable();
    keys
}

/// The (name, description, schema) of each definition, whatever the shape.
fn check_definitions(defs: &[(&Value, &Value, &Value)]) {
    let names: Vec<&str> = defs.iter().map(|d| d.0.as_str().unwrap()).collect();
    assert_eq!(
        names,
        ["run_python", "get_run_artifact", "close_session", "resume"]
    );
    for (_, description, schema) in defs {
        assert!(!description.as_str().unwrap().is_empty());
        assert_eq!(schema["type"], "object");
    }
    let (_, run_description, run_schema) = defs[0];
    let description = run_description.as_str().unwrap();
    assert!(description.contains("envelope"), "{description}");
    assert!(
        description.contains("def search(query: str) -> Any:"),
        "{description}"
    );
    assert!(
        description.contains(
            "def run_python(code: str, dependencies: list[str] = None, inputs: dict = None, files: list[dict] = None)"
        ),
        "{description}"
    );
    assert_eq!(run_schema["required"], json!(["code"]));
    assert_eq!(
        run_schema["properties"]["dependencies"]["items"]["type"],
        "string"
    );
    assert_eq!(run_schema["properties"]["inputs"]["type"], "object");
    let artifact_schema = defs[1].2;
    assert_eq!(artifact_schema["required"], json!(["id"]));
    assert_eq!(artifact_schema["properties"]["offset"]["type"], "integer");
    assert_eq!(artifact_schema["properties"]["length"]["type"], "integer");
    assert_eq!(defs[2].2["required"], json!(["session_id"]));
    assert_eq!(defs[3].2["required"], json!(["run_id", "decisions"]));
    assert_eq!(defs[3].2["properties"]["decisions"]["type"], "object");
}

#[test]
fn anthropic_definitions_have_name_description_and_input_schema() {
    let spec = engine().tool_spec(ToolFormat::Anthropic);
    let defs: Vec<_> = spec.as_array().unwrap().iter().collect();
    for d in &defs {
        assert_eq!(keys(d), ["description", "input_schema", "name"]);
    }
    check_definitions(
        &defs
            .iter()
            .map(|d| (&d["name"], &d["description"], &d["input_schema"]))
            .collect::<Vec<_>>(),
    );
}

#[test]
fn openai_definitions_are_functions_with_parameters() {
    let spec = engine().tool_spec(ToolFormat::OpenAi);
    let defs: Vec<_> = spec.as_array().unwrap().iter().collect();
    for d in &defs {
        assert_eq!(keys(d), ["function", "type"]);
        assert_eq!(d["type"], "function");
        assert_eq!(keys(&d["function"]), ["description", "name", "parameters"]);
    }
    check_definitions(
        &defs
            .iter()
            .map(|d| {
                let f = &d["function"];
                (&f["name"], &f["description"], &f["parameters"])
            })
            .collect::<Vec<_>>(),
    );
}

#[test]
fn no_shape_carries_a_transport_hint() {
    // Core describes tools; MCP's `x-mcp-header` is the MCP server's to add (runpython-mcp).
    for format in [ToolFormat::Anthropic, ToolFormat::OpenAi, ToolFormat::Mcp] {
        let spec = engine().tool_spec(format).to_string();
        assert!(!spec.contains("x-mcp-header"), "{format:?}: {spec}");
    }
}

#[test]
fn mcp_definitions_have_an_input_schema_in_camel_case() {
    let spec = engine().tool_spec(ToolFormat::Mcp);
    let defs: Vec<_> = spec.as_array().unwrap().iter().collect();
    for d in &defs {
        assert_eq!(
            keys(d),
            [
                "annotations",
                "description",
                "inputSchema",
                "name",
                "outputSchema",
                "title"
            ]
        );
        assert_eq!(d["outputSchema"]["type"], "object");
    }
    assert_eq!(defs[0]["outputSchema"]["required"][0], "status");
    assert_eq!(defs[0]["annotations"]["readOnlyHint"], false);
    assert_eq!(
        defs[0]["annotations"]["openWorldHint"], true,
        "it has tools"
    );
    assert_eq!(defs[1]["annotations"]["readOnlyHint"], true);
    assert_eq!(defs[1]["annotations"]["idempotentHint"], true);
    assert_eq!(
        defs[0]["inputSchema"]["properties"]["timeout"]["type"],
        "number"
    );
    check_definitions(
        &defs
            .iter()
            .map(|d| (&d["name"], &d["description"], &d["inputSchema"]))
            .collect::<Vec<_>>(),
    );
}

#[test]
fn resume_is_offered_only_by_engines_whose_runs_can_suspend() {
    let plain = RunPython::builder()
        .store(Store::open("memory://").unwrap())
        .build()
        .unwrap();
    let names: Vec<String> = plain
        .tool_definitions()
        .into_iter()
        .map(|d| d.name)
        .collect();
    assert_eq!(names, ["run_python", "get_run_artifact", "close_session"]);
    let resume = engine().tool_definitions().pop().unwrap();
    assert_eq!(resume.name, "resume");
    let example = resume.input_schema["properties"]["decisions"]["description"].to_string();
    assert!(example.contains("s0"), "{example}");
}

#[tokio::test(flavor = "multi_thread")]
async fn unknown_arguments_are_refused_and_a_call_timeout_stops_the_run_early() {
    let python = engine();
    for bad in [
        json!({"code": "1", "session": "x"}),
        json!({"code": "1", "timeout": 0}),
        json!({"code": "1", "timeout": "soon"}),
    ] {
        let err = python
            .handle_tool_call("run_python", &bad)
            .await
            .unwrap_err();
        assert_eq!(err.code(), "invalid_input", "{bad}: {err}");
    }
    let err = python
        .handle_tool_call("get_run_artifact", &json!({"id": "x", "page": 2}))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("`page`"), "{err}");

    let started = std::time::Instant::now();
    let envelope = python
        .handle_tool_call(
            "run_python",
            &json!({"code": "import time\ntime.sleep(20)", "timeout": 0.5}),
        )
        .await
        .unwrap();
    assert_eq!(envelope["status"], "timeout", "{envelope}");
    assert!(started.elapsed() < Duration::from_secs(10));
    // The request keeps what was asked; the engine caps it at its own timeout when it runs.
    let request = python
        .run_python_request(&json!({"code": "1", "timeout": 1000}))
        .unwrap();
    assert_eq!(request.timeout, Some(Duration::from_secs(1000)));
}

#[tokio::test(flavor = "multi_thread")]
async fn tool_calls_are_announced_on_the_event_stream() {
    let python = engine();
    let mut handle = python.start(RunRequest::new(
        "search(query='x')\nsearch(query='y')\n'ok'",
    ));
    let mut calls = Vec::new();
    while let Some(event) = handle.next_event().await {
        if let Event::ToolCall { name } = event {
            calls.push(name);
        }
    }
    let envelope = handle.wait().await.unwrap();
    assert_eq!(envelope.return_value, json!("ok"));
    assert_eq!(calls, ["search", "search"]);
}

#[test]
fn formats_parse_by_name() {
    assert_eq!("OpenAI".parse::<ToolFormat>().unwrap(), ToolFormat::OpenAi);
    assert!(matches!(
        "gemini".parse::<ToolFormat>(),
        Err(Error::InvalidInput(_))
    ));
}

#[tokio::test(flavor = "multi_thread")]
async fn tool_calls_run_code_read_artifact_slices_and_refuse_resume() {
    let python = engine();
    let envelope = python
        .handle_tool_call(
            "run_python",
            &json!({"code": "open('note.txt', 'w').write('hello')\nn + 1", "inputs": {"n": 1}}),
        )
        .await
        .unwrap();
    assert_eq!(envelope["return_value"], 2);
    let note = envelope["artifacts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["name"] == "note.txt")
        .unwrap_or_else(|| panic!("no note.txt artifact in {envelope}"));
    let slice = python
        .handle_tool_call(
            "get_run_artifact",
            &json!({"id": note["id"], "offset": 1, "length": 3}),
        )
        .await
        .unwrap();
    assert_eq!(slice["text"], "ell");
    assert_eq!(slice["total_bytes"], 5);

    let failed = python
        .handle_tool_call("run_python", &json!({"code": "1/0"}))
        .await
        .unwrap();
    assert_eq!(failed["status"], "error", "an outcome, not an Err");

    let resume = python
        .handle_tool_call("resume", &json!({"run_id": "x", "decisions": {}}))
        .await;
    let err = resume.unwrap_err().to_string();
    assert!(err.contains("store") || err.contains("checkpoint"), "{err}");
    let bad = python
        .handle_tool_call("run_python", &json!({"code": 3}))
        .await;
    assert!(matches!(bad, Err(Error::InvalidInput(_))), "{bad:?}");
}
