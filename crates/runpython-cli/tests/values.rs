//! The CLI side of issue 16: exact integers, code that starts with `-`, per-run environment values,
//! command tools described without their command, `runpython doctor`.

#![allow(clippy::unwrap_used)] // a test fails loudly where it unwraps; helpers outside #[test] too

mod common;

use common::{envelope, runpython};

use serde_json::{json, Value};

#[test]
fn integers_of_any_size_are_exact_in_inputs_and_the_printed_envelope() {
    let out = runpython(&[
        "run",
        "--json",
        "--no-store",
        "--input",
        "x=1267650600228229401496703205376",
        "-c",
        "[x, type(x).__name__, 2**100 + 1]",
    ]);
    let printed = String::from_utf8(out.stdout).unwrap();
    assert!(
        printed.contains(
            r#""return_value":[1267650600228229401496703205376,"int",1267650600228229401496703205377]"#
        ),
        "{printed}"
    );
}

#[test]
fn code_that_starts_with_a_hyphen_is_code() {
    let out = runpython(&["run", "--json", "--no-store", "-c", "-100"]);
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(envelope(&out)["return_value"], -100);
    let out = runpython(&["run", "--json", "--no-store", "-c", "--x"]);
    assert_eq!(
        envelope(&out)["error"]["type"],
        "NameError",
        "`--x` is code too"
    );
}

#[test]
fn env_sets_a_variable_for_the_run_and_its_kept_output_is_masked() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("file://{}", dir.path().display());
    let out = runpython(&[
        "run",
        "--json",
        "--store",
        &store,
        "--env",
        "SERVICE_URL=https://user:pw-123456@example.invalid",
        "-c",
        "import os\nprint(os.environ['SERVICE_URL'])",
    ]);
    let e = envelope(&out);
    assert_eq!(
        e["stdout"], "https://user:pw-123456@example.invalid\n",
        "{e}"
    );
    let run_id = e["run_id"].as_str().unwrap();
    let listed = runpython(&[
        "artifacts",
        "list",
        "--run",
        run_id,
        "--json",
        "--store",
        &store,
    ]);
    let listed: Value = serde_json::from_slice(&listed.stdout).unwrap();
    let stdout = listed
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["kind"] == "stdout")
        .unwrap();
    let kept = runpython(&[
        "artifacts",
        "get",
        stdout["id"].as_str().unwrap(),
        "--store",
        &store,
    ]);
    assert_eq!(
        String::from_utf8_lossy(&kept.stdout),
        "[REDACTED:SERVICE_URL]\n"
    );
    let out = runpython(&["run", "--no-store", "--env", "=x", "-c", "1"]);
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn command_tools_from_flags_or_a_file_show_their_doc_and_schema_not_their_command() {
    let command = "cat >/dev/null; echo '{\"temp\": 21}' # --api-token=abc123";
    let schema =
        r#"{"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}"#;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tools.json");
    std::fs::write(
        &file,
        json!([{"name": "forecast", "command": command, "description": "Tomorrow's weather.",
                "input_schema": serde_json::from_str::<Value>(schema).unwrap()}])
        .to_string(),
    )
    .unwrap();
    let tool = format!("weather={command}");
    let file_arg = file.display().to_string();
    let flags = [
        "--tool",
        tool.as_str(),
        "--tool-doc",
        "weather=Current weather of a city.",
        "--tool-schema",
        &format!("weather={schema}"),
        "--tools-file",
        &file_arg,
    ];
    let mut args = vec!["tool-spec", "--no-store"];
    args.extend(flags);
    let spec = String::from_utf8(runpython(&args).stdout).unwrap();
    assert!(
        spec.contains("def weather(city: str)") && spec.contains("Current weather of a city."),
        "{spec}"
    );
    assert!(
        spec.contains("def forecast(city: str)") && spec.contains("Tomorrow's weather."),
        "{spec}"
    );
    assert!(
        !spec.contains("abc123") && !spec.contains("cat >"),
        "{spec}"
    );
    let mut args = vec!["run", "--json", "--no-store"];
    args.extend(flags);
    args.extend(["-c", "[weather('Paris'), forecast(city='Oslo')]"]);
    assert_eq!(
        envelope(&runpython(&args))["return_value"],
        json!([{"temp": 21}, {"temp": 21}])
    );
    let out = runpython(&["run", "--no-store", "--tool-doc", "nothing=x", "-c", "1"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no --tool nothing=COMMAND"));
}

#[test]
fn doctor_reports_the_kernel_the_layers_a_run_gets_and_where_things_live() {
    let out = runpython(&["doctor", "--json", "--no-store", "--allow-network"]);
    assert_eq!(out.status.code(), Some(0));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(report["kernel"]["namespaces"].is_array(), "{report}");
    assert_eq!(report["isolation"]["network"], "public", "{report}");
    assert_eq!(report["kernel"]["network_policy"], "ok", "{report}");
    // An install reaches its index only: PyPI and its file host unless the environment names others.
    assert_eq!(
        report["install_isolation"]["Ok"]["network"], "allowlist",
        "{report}"
    );
    assert!(
        report["python"].as_str().unwrap().contains("3."),
        "{report}"
    );
    assert!(report["installer"].is_string(), "{report}");
    assert_eq!(report["store"], Value::Null, "--no-store");
    let out = runpython(&["doctor"]);
    let text = String::from_utf8(out.stdout).unwrap();
    for line in ["kernel", "a run gets", "uv ", "store "] {
        assert!(text.contains(line), "{line}: {text}");
    }
}
